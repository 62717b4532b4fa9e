/*
 * libtkern: hand-tuned CUDA transformer primitives behind a stable C ABI.
 *
 * This header is the whole public interface. It is C99 and C++ clean and includes no CUDA
 * header: a stream is passed as tk_stream_t, which is the same type as cudaStream_t.
 *
 * Conventions shared by every entry point
 * - Every function returns tk_status; TK_SUCCESS (0) means the work was enqueued on the stream.
 *   Kernels run asynchronously: errors that happen inside a running kernel surface at a later
 *   synchronisation, as with any CUDA library.
 * - On failure, tk_last_error() returns a sentence that names the function, the argument and
 *   what is accepted. No output is written when an argument is rejected.
 * - Pointers are device pointers unless said otherwise. Inputs come before outputs and the
 *   stream is the last argument (NULL = the legacy default stream).
 * - Sizes, strides and element counts are int64_t; strides are in elements, not bytes.
 * - A size of zero where the documentation allows it is a no-op that succeeds.
 * - Floating-point arithmetic is carried out in f32 whatever the storage dtype.
 * - The library never allocates device memory and never prints or exits.
 * - All functions are thread-safe. The current CUDA device of the calling thread is used.
 * - Params structs (tk_*_params, tk_device_info) start with `size`, set by their *_INIT macro,
 *   and only ever grow at the end. A call accepts any size from the struct's size in 0.1 upward:
 *   fields past the caller's size read as zero (an older caller), and bytes past this library's
 *   struct must be zero (a newer caller may leave fields it does not know unset). A smaller size,
 *   a non-zero unknown byte, or a size above 4096 fail with TK_ERROR_INVALID_VALUE naming `size`.
 * - No output may have two elements at the same address (strides that make rows overlap fail).
 */
#ifndef TKERN_H
#define TKERN_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */
#define TK_VERSION_MAJOR 0
#define TK_VERSION_MINOR 1
#define TK_VERSION_PATCH 0
/* One number that orders versions: 10000 * major + 100 * minor + patch. */
#define TK_VERSION_NUMBER (TK_VERSION_MAJOR * 10000 + TK_VERSION_MINOR * 100 + TK_VERSION_PATCH)

#if defined(TK_BUILDING_LIBRARY) && defined(__GNUC__)
#define TK_API __attribute__((visibility("default")))
#else
#define TK_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the library that is loaded at run time, as TK_VERSION_NUMBER. Compare it with the
 * macro to detect a header / library mismatch. */
TK_API int tk_version(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes. Grouped by hundreds; numbers are never reused or renumbered.
 * ------------------------------------------------------------------------------------------- */
typedef enum tk_status {
    TK_SUCCESS = 0,

    /* 1xx: a bad argument. The call did nothing. */
    TK_ERROR_NULL_POINTER = 100,   /* a required pointer is NULL */
    TK_ERROR_INVALID_VALUE = 101,  /* a size, stride, enum or scalar is out of range (or NaN) */
    TK_ERROR_OVERLAP = 102,        /* an output partially overlaps an input */
    TK_ERROR_MISALIGNED = 103,     /* a pointer or stride does not meet a documented alignment */

    /* 2xx: valid, but this build or device cannot do it. */
    TK_ERROR_NOT_SUPPORTED = 200,      /* e.g. a head dim or dtype combination with no kernel */
    TK_ERROR_ARCH_NOT_SUPPORTED = 201, /* the device is older than sm_80, or no code for it */

    /* 3xx: CUDA. tk_last_error() carries CUDA's own error text. */
    TK_ERROR_NO_DEVICE = 300,     /* no CUDA device or driver */
    TK_ERROR_CUDA = 301,          /* a CUDA runtime call or a kernel launch failed */

    /* 4xx: a bug in libtkern. Please report it. */
    TK_ERROR_INTERNAL = 400
} tk_status;

/* The group of a status: 0 success, 1 bad argument, 2 not supported, 3 CUDA, 4 internal. */
#define TK_STATUS_GROUP(status) ((int)(status) / 100)

/* A static, never-NULL name for a status, such as "TK_ERROR_NULL_POINTER". */
TK_API const char *tk_status_string(tk_status status);

/* A description of the most recent failure of a tk_* call on the calling thread, e.g.
 * "tk_activation_fwd: argument 'x' is NULL but rows * cols = 4096 > 0". Empty after a call
 * that succeeded. The pointer stays valid until the next tk_* call on the same thread. */
TK_API const char *tk_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------- */
typedef enum tk_dtype {
    TK_F32 = 0,  /* IEEE binary32 */
    TK_F16 = 1,  /* IEEE binary16 */
    TK_BF16 = 2  /* bfloat16 */
} tk_dtype;

/* Same type as cudaStream_t / CUstream; NULL is the legacy default stream. */
typedef struct CUstream_st *tk_stream_t;

/* ---------------------------------------------------------------------------------------------
 * Devices and kernel variants
 * ------------------------------------------------------------------------------------------- */

/* What libtkern knows about a device. Fill `size` with TK_DEVICE_INFO_INIT before the call;
 * fields may be appended in later versions, never reordered. */
typedef struct tk_device_info {
    size_t size;              /* sizeof(tk_device_info), set by TK_DEVICE_INFO_INIT */
    int device;               /* CUDA device ordinal */
    int compute_capability;   /* 100 * major + 10 * minor, e.g. 900 for the H100 / H200 */
    int sm_count;             /* streaming multiprocessors */
    int max_smem_per_block;   /* bytes of shared memory a block may opt in to */
    int l2_bytes;             /* L2 cache size in bytes */
    int supported;            /* 1 when libtkern has code for this device, else 0 */
} tk_device_info;
#define TK_DEVICE_INFO_INIT {sizeof(tk_device_info), 0, 0, 0, 0, 0, 0}

/* Describes the calling thread's current CUDA device. Fails with TK_ERROR_NO_DEVICE when there
 * is no usable device. A device older than sm_80 is described with supported = 0. */
TK_API tk_status tk_device_query(tk_device_info *info);

/* The name of the kernel variant that the calling thread's most recent successful launching
 * call used, e.g. "vec16" or "scalar"; "" before the first. Static storage. */
TK_API const char *tk_last_variant(void);

/* Experimental, for tests and benchmarks: make the calling thread's calls to operation `op`
 * use the variant called `variant`, or go back to automatic selection when `variant` is NULL.
 * The ops are "activation", "glu", "norm", "softmax" and "rope" (the forward calls of those
 * families), "activation_bwd", "glu_bwd", "norm_bwd", "softmax_bwd" and "rope_bwd" (their *_bwd
 * calls), "attention", "attention_bwd", "attention_kvcache" and "gemm". Forward and backward are
 * forced separately: forcing "norm" leaves tk_rmsnorm_bwd's choice alone, and a forward-only
 * variant ("mma_sm80_packed") is not a variant of "attention_bwd". A forced variant that cannot run a call makes that call fail with
 * TK_ERROR_NOT_SUPPORTED instead of falling back. The environment variable
 * TKERN_FORCE_VARIANT="op=variant[,op=variant...]", read once at first use, does the same for
 * every thread; `variant` NULL also undoes it for the calling thread. An unknown op or variant
 * name there makes every call that reaches the device fail with TK_ERROR_INVALID_VALUE, naming
 * the variable and the name. Fails with TK_ERROR_INVALID_VALUE for an unknown op or variant
 * name. */
TK_API tk_status tk_experimental_force_variant(const char *op, const char *variant);

/* ---------------------------------------------------------------------------------------------
 * Activations (docs/kernels/activation.md)
 * ------------------------------------------------------------------------------------------- */
typedef enum tk_activation {
    TK_ACT_NONE = 0,          /* identity: f(x) = x (with a bias: a bias add) */
    TK_ACT_GELU_ERF = 1,      /* x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
    TK_ACT_GELU_TANH = 2,     /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    TK_ACT_QUICK_GELU = 3,    /* x * sigmoid(1.702 x) */
    TK_ACT_SILU = 4,          /* x * sigmoid(x) */
    TK_ACT_RELU = 5,          /* max(x, 0) */
    TK_ACT_RELU_SQUARED = 6   /* max(x, 0)^2 */
} tk_activation;

/* y[r, c] = f(x[r, c] + bias[c]) for a dense row-major [rows, cols] tensor; with bias == NULL
 * the bias term is absent, and a 1-D tensor of n elements is rows = 1, cols = n.
 * x, bias and y have dtype `dtype`. y == x (in place) is allowed; any other overlap of y with
 * x or bias is rejected. rows or cols == 0 is a no-op. Misaligned pointers are handled
 * (slower). Errors: NULL x / y with work to do, negative sizes, unknown kind or dtype, overlap. */
TK_API tk_status tk_activation_fwd(tk_activation kind, tk_dtype dtype, const void *x,
                                   const void *bias, void *y, int64_t rows, int64_t cols,
                                   tk_stream_t stream);

/* dx[r, c] = dy[r, c] * f'(x[r, c] + bias[c]): the gradient of tk_activation_fwd with respect
 * to its input (and, summed over rows, to its bias). ReLU's derivative at 0 is taken as 0.
 * dx may alias dy or x exactly. Same shapes, dtypes and errors as tk_activation_fwd. */
TK_API tk_status tk_activation_bwd(tk_activation kind, tk_dtype dtype, const void *dy,
                                   const void *x, const void *bias, void *dx, int64_t rows,
                                   int64_t cols, tk_stream_t stream);

typedef enum tk_gelu_approximation {
    TK_GELU_EXACT = 0,  /* erf form, PyTorch approximate="none" */
    TK_GELU_TANH = 1    /* tanh form, PyTorch approximate="tanh" */
} tk_gelu_approximation;

/* GELU over n contiguous elements: tk_activation_fwd with rows = 1, cols = n, no bias. */
TK_API tk_status tk_gelu_fwd(tk_gelu_approximation approximate, tk_dtype dtype, const void *x,
                             void *y, int64_t n, tk_stream_t stream);

/* Gradient of tk_gelu_fwd: dx = dy * gelu'(x) over n contiguous elements. */
TK_API tk_status tk_gelu_bwd(tk_gelu_approximation approximate, tk_dtype dtype, const void *dy,
                             const void *x, void *dx, int64_t n, tk_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Gated linear units (GLU family; docs/kernels/activation.md)
 * ------------------------------------------------------------------------------------------- */
typedef enum tk_glu {
    TK_GLU_SWIGLU = 0,         /* silu(gate) * up */
    TK_GLU_GEGLU_ERF = 1,      /* gelu_erf(gate) * up */
    TK_GLU_GEGLU_TANH = 2,     /* gelu_tanh(gate) * up */
    TK_GLU_REGLU = 3,          /* relu(gate) * up */
    TK_GLU_SWIGLU_CLAMPED = 4  /* GPT-OSS: g = min(gate, limit), u = clamp(up, -limit, limit),
                                  g * sigmoid(alpha * g) * (u + 1) */
} tk_glu;

/* Where the gate and up values sit in an input row of 2 * d elements. */
typedef enum tk_glu_layout {
    TK_GLU_GATE_FIRST = 0,  /* [gate(d) | up(d)] */
    TK_GLU_UP_FIRST = 1,    /* [up(d) | gate(d)] */
    TK_GLU_INTERLEAVED = 2  /* gate at even, up at odd positions (GPT-OSS) */
} tk_glu_layout;

/* Shape and options of a GLU call. Initialise with TK_GLU_PARAMS_INIT; fields are only ever
 * appended. */
typedef struct tk_glu_params {
    size_t size;              /* sizeof(tk_glu_params) */
    tk_glu kind;
    tk_dtype dtype;           /* of x, y, dy and dx */
    tk_glu_layout layout;
    int64_t rows;             /* >= 0 */
    int64_t d;                /* output width, > 0; input rows hold 2 * d elements */
    int64_t x_row_stride;     /* elements between input rows (also for dx); 0 = 2 * d */
    int64_t y_row_stride;     /* elements between output rows (also for dy); 0 = d */
    float alpha;              /* TK_GLU_SWIGLU_CLAMPED only: sigmoid slope, GPT-OSS 1.702 */
    float limit;              /* TK_GLU_SWIGLU_CLAMPED only: clamp bound > 0, GPT-OSS 7.0 */
} tk_glu_params;
#define TK_GLU_PARAMS_INIT \
    {sizeof(tk_glu_params), TK_GLU_SWIGLU, TK_BF16, TK_GLU_GATE_FIRST, 0, 0, 0, 0, 1.702f, 7.0f}

/* y[r, j] = act(gate[r, j]) * up[r, j] for r < rows, j < d, with gate and up read from the
 * input row as p->layout says. y may alias x exactly (same pointer, y_row_stride ==
 * x_row_stride, gate-first layout); other overlaps, in place with the up-first or interleaved
 * layout included, are rejected (TK_ERROR_OVERLAP naming 'y').
 * Errors: NULL pointers with rows > 0, rows < 0, d <= 0, strides smaller than the row, unknown
 * kind / dtype / layout, NaN or non-positive limit, NaN alpha, overlap. */
TK_API tk_status tk_glu_fwd(const tk_glu_params *p, const void *x, void *y, tk_stream_t stream);

/* Gradient of tk_glu_fwd: dx (laid out like x) from dy (laid out like y) and x. The clamps of
 * TK_GLU_SWIGLU_CLAMPED pass no gradient where they are active. dx may alias x exactly. */
TK_API tk_status tk_glu_bwd(const tk_glu_params *p, const void *dy, const void *x, void *dx,
                            tk_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * RMSNorm and LayerNorm, forward and backward (docs/kernels/norm.md)
 *
 * Over each row r of a [rows, cols] tensor, with n = cols and h the row being normalised:
 *   RMSNorm    rstd = 1 / sqrt(sum_c h_c^2 / n + eps)            y_c = h_c rstd w'_c
 *   LayerNorm  mean = sum_c h_c / n
 *              rstd = 1 / sqrt(sum_c (h_c - mean)^2 / n + eps)   y_c = (h_c - mean) rstd w'_c + b_c
 * where w'_c = w_c, or 1 + w_c with gemma = 1 (Gemma's RMSNorm; also accepted for LayerNorm),
 * and w'_c = 1 when weight is NULL, b_c = 0 when bias is NULL. The variance is the biased one
 * (divided by n), as in PyTorch.
 * Fused residual add (residual != NULL): h = x + residual, rounded to dtype, is written back to
 * residual (in place) and normalised; without it h = x. rstd (and mean) are f32 per row.
 *
 * Tensors: x, residual, y, dy, dx have dtype p->dtype (f32, f16, bf16); weight, bias, dw, db have
 * p->weight_dtype (p->dtype or TK_F32); rstd and mean are dense f32 [rows]. Rows are
 * p->x_row_stride (x, dx), p->residual_row_stride (residual), p->y_row_stride (y, dy) elements
 * apart; 0 means dense (= cols). Elements within a row are contiguous.
 * Variants (tk_last_variant; tk_experimental_force_variant op "norm" for the forward calls,
 * "norm_bwd" for the backward ones, each direction with all four), in selection order:
 * "vec16" (16-byte accesses, row held in registers: needs every row start 16-byte aligned, i.e.
 * 16-byte aligned pointers and cols and strides that are multiples of 16 bytes, and cols <= 8192,
 * or <= 16384 for f16 / bf16 rows; backward 16-bit rows of 8193 to 16384 only where the device's
 * shared memory per block holds the block: all of them on an H100 / H200, up to 13312 columns on
 * an A100, none on compute capability 8.6 / 8.9),
 * "wide_vec16" (the same alignment, any width: a block per row that reads the row twice),
 * "scalar" (any element alignment, cols <= 4096), "wide_scalar" (anything).
 * ------------------------------------------------------------------------------------------- */

/* Shape and options of a norm call. Initialise with TK_NORM_PARAMS_INIT; fields are only ever
 * appended. */
typedef struct tk_norm_params {
    size_t size;                  /* sizeof(tk_norm_params), set by TK_NORM_PARAMS_INIT */
    tk_dtype dtype;               /* of x, residual, y, dy, dx */
    tk_dtype weight_dtype;        /* of weight, bias, dw, db: dtype or TK_F32 */
    int64_t rows;                 /* >= 0; 0 is a no-op */
    int64_t cols;                 /* the normalised width, 1 .. 262144 */
    int64_t x_row_stride;         /* elements between rows of x (and dx); 0 = cols, else >= cols */
    int64_t residual_row_stride;  /* of residual; 0 = cols, else >= cols */
    int64_t y_row_stride;         /* of y (and dy); 0 = cols, else >= cols */
    float eps;                    /* > 0, finite */
    int gemma;                    /* 0 or 1: scale by (1 + weight) */
} tk_norm_params;
#define TK_NORM_PARAMS_INIT {sizeof(tk_norm_params), TK_BF16, TK_BF16, 0, 0, 0, 0, 0, 1e-6f, 0}

/* Which normalisation a workspace is sized for. */
typedef enum tk_norm_kind {
    TK_NORM_RMS = 0,
    TK_NORM_LAYER = 1
} tk_norm_kind;

/* RMSNorm forward as above. residual (fused add, updated in place), weight and rstd may be NULL.
 * y may alias x exactly (same pointer, y_row_stride == x_row_stride); any other overlap between
 * y, residual, rstd and the inputs is rejected.
 * Errors (nothing is written): p NULL, x or y NULL with rows > 0 (TK_ERROR_NULL_POINTER);
 * p->size too small, rows < 0, cols outside 1..262144, a stride smaller than cols, eps <= 0, NaN
 * or infinite, gemma not 0 / 1, unknown dtype (TK_ERROR_INVALID_VALUE); weight_dtype neither
 * dtype nor TK_F32 (TK_ERROR_NOT_SUPPORTED); a pointer not aligned to its element size
 * (TK_ERROR_MISALIGNED); overlap (TK_ERROR_OVERLAP). */
TK_API tk_status tk_rmsnorm_fwd(const tk_norm_params *p, const void *x, void *residual,
                                const void *weight, void *y, float *rstd, tk_stream_t stream);

/* LayerNorm forward as above; weight, bias, residual, mean and rstd may each be NULL. Same rules
 * and errors as tk_rmsnorm_fwd. */
TK_API tk_status tk_layernorm_fwd(const tk_norm_params *p, const void *x, void *residual,
                                  const void *weight, const void *bias, void *y, float *mean,
                                  float *rstd, tk_stream_t stream);

/* Bytes of workspace that tk_rmsnorm_bwd (kind TK_NORM_RMS) or tk_layernorm_bwd (TK_NORM_LAYER)
 * needs for p's shape when it computes dw or db: min(rows, max(1, 2^22 / cols)) * cols * 4
 * bytes per reduced tensor (dw; LayerNorm also db), i.e. at most ~16 MiB each. It depends on
 * p's rows and cols only, never on the device. Errors: as tk_rmsnorm_fwd for p, unknown kind
 * (TK_ERROR_INVALID_VALUE), bytes NULL (TK_ERROR_NULL_POINTER). */
TK_API tk_status tk_norm_bwd_workspace_size(const tk_norm_params *p, tk_norm_kind kind,
                                            size_t *bytes);

/* RMSNorm backward, from dy, the forward's normalised input x (for a fused residual add: the
 * updated residual, h) and its rstd (from the forward, f32 [rows]). With w' as above,
 * xhat = x rstd, g = dy w':
 *     dx_c = rstd (g_c - xhat_c sum_k(g_k xhat_k) / n)
 *     dw_c = sum over rows of dy_c xhat_c          (written when dw != NULL)
 * dw is reduced across rows in a fixed order: the same inputs give the same bits on every run
 * on the same device. Computing dw needs `workspace` (16-byte aligned, workspace_bytes >=
 * tk_norm_bwd_workspace_size(p, TK_NORM_RMS)); it is overwritten. dx may alias dy or x exactly
 * (same pointer and stride); dw and workspace must not overlap anything.
 * Errors as tk_rmsnorm_fwd, plus: dy, x, rstd, dx NULL, workspace NULL with dw (NULL pointer);
 * workspace_bytes too small (TK_ERROR_INVALID_VALUE); workspace not 16-byte aligned
 * (TK_ERROR_MISALIGNED). */
TK_API tk_status tk_rmsnorm_bwd(const tk_norm_params *p, const void *dy, const void *x,
                                const void *weight, const float *rstd, void *dx, void *dw,
                                void *workspace, size_t workspace_bytes, tk_stream_t stream);

/* LayerNorm backward: xhat = (x - mean) rstd, g = dy w',
 *     dx_c = rstd (g_c - sum_k(g_k) / n - xhat_c sum_k(g_k xhat_k) / n)
 *     dw_c = sum over rows of dy_c xhat_c,   db_c = sum over rows of dy_c
 * dw and db (each optional) are deterministic as in tk_rmsnorm_bwd; the workspace is
 * tk_norm_bwd_workspace_size(p, TK_NORM_LAYER) bytes. mean and rstd are the forward's. */
TK_API tk_status tk_layernorm_bwd(const tk_norm_params *p, const void *dy, const void *x,
                                  const void *weight, const float *mean, const float *rstd,
                                  void *dx, void *dw, void *db, void *workspace,
                                  size_t workspace_bytes, tk_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Softmax and log-softmax over rows (docs/kernels/softmax.md)
 *
 * For a [rows, cols] tensor, row r, visible columns c < len(r):
 *
 *     softmax      y[r, c] = exp(scale x[r, c] - m) / sum_{c' < len} exp(scale x[r, c'] - m)
 *     log-softmax  y[r, c] = scale x[r, c] - m - log(sum_{c' < len} exp(scale x[r, c'] - m))
 *
 * with m the row's maximum of scale * x (numerically stable at any magnitude). Columns
 * c >= len(r) are masked: softmax writes 0 there, log-softmax -inf, and their x is not read
 * (beyond the 16-byte pack that holds column len(r)). Exponentials use the hardware's ex2:
 * results below 2^-126 (about 1e-38) are 0.
 *
 * Causal mask (causal = 1), one convention: row r sees column c  <=>  c <= q(r) + causal_offset,
 * where q(r) = r % causal_period is the query index of the row within its attention matrix
 * (causal_period = 0 means rows: one matrix). So len(r) = clamp(q(r) + causal_offset + 1, 0,
 * cols). For attention scores [batch, heads, seqlen_q, seqlen_k] flattened to rows =
 * batch * heads * seqlen_q, cols = seqlen_k: causal_period = seqlen_q and causal_offset =
 * seqlen_k - seqlen_q aligns the mask bottom-right (as tk_attention_fwd and FlashAttention 2.1+);
 * causal_offset = 0 aligns it top-left (PyTorch's is_causal). A row that sees no column
 * (q(r) + causal_offset < 0) is all 0 (softmax) or all -inf (log-softmax). Without a mask,
 * len(r) = cols.
 *
 * Backward, with y the forward output and dy the gradient of y (sums over visible columns):
 *     softmax      dx[r, c] = scale * y[r, c] * (dy[r, c] - sum_c' dy[r, c'] y[r, c'])
 *     log-softmax  dx[r, c] = scale * (dy[r, c] - exp(y[r, c]) * sum_c' dy[r, c'])
 * and dx = 0 at masked columns (y and dy are not read there).
 *
 * Inputs may hold -inf (an additive mask); a row whose visible inputs are all -inf gives NaN, as
 * in PyTorch. Rows of any width >= 1 (vocabulary rows of 131072 and more); arithmetic in f32.
 * Initialise with TK_SOFTMAX_PARAMS_INIT; fields are only ever appended.
 * ------------------------------------------------------------------------------------------- */
typedef struct tk_softmax_params {
    size_t size;              /* sizeof(tk_softmax_params), set by TK_SOFTMAX_PARAMS_INIT */
    tk_dtype dtype;           /* of x, y, dy and dx: TK_F32, TK_F16 or TK_BF16 */
    int64_t rows;             /* >= 0; 0 is a no-op */
    int64_t cols;             /* 1 .. 2^30 */
    int64_t x_row_stride;     /* elements between rows of x (and of dx); 0 = cols */
    int64_t y_row_stride;     /* elements between rows of y (and of dy); 0 = cols */
    float scale;              /* finite; multiplies x before the softmax (1 = plain softmax) */
    int log;                  /* 0: softmax, 1: log-softmax */
    int causal;               /* 0 or 1 */
    int64_t causal_offset;    /* causal = 1: row r sees columns c <= r % causal_period + offset */
    int64_t causal_period;    /* causal = 1: rows per attention matrix, >= 0; 0 = rows */
} tk_softmax_params;
#define TK_SOFTMAX_PARAMS_INIT {sizeof(tk_softmax_params), TK_BF16, 0, 0, 0, 0, 1.0f, 0, 0, 0, 0}

/* y = softmax (or log-softmax) of x as described above. y may alias x exactly (same pointer and
 * y_row_stride == x_row_stride: in place); any other overlap is rejected. Pointers must be
 * aligned to the element size; any other alignment is accepted (16-byte aligned rows are faster).
 * Variants (tk_last_variant, force with op "softmax"), in selection order, each for 16-byte
 * aligned rows unless said otherwise: "vec16_pipelined" (compute capability 9.0 and newer, rows
 * whose whole 16-byte packs hold 64 to 512 KB: 32768 to 262151 f16 / bf16 or 16384 to 131075
 * f32 elements), "vec16_regs" (forward rows up to 32768 f16 / bf16 or 16384 f32
 * elements, backward rows up to half that), "vec16_stream" (any width; reads each row twice),
 * "scalar_regs" (any element alignment, forward rows up to 4096 elements, backward 2048) and
 * "scalar_stream" (anything).
 * Errors: p NULL, x / y NULL with rows > 0 (TK_ERROR_NULL_POINTER); p->size too small, unknown
 * dtype, rows < 0, cols < 1, a row stride smaller than cols, scale NaN or infinite, log or
 * causal not 0 / 1, causal_period < 0, sizes whose byte counts overflow
 * (TK_ERROR_INVALID_VALUE); cols > 2^30 (TK_ERROR_NOT_SUPPORTED); a pointer not aligned to its element size (TK_ERROR_MISALIGNED);
 * overlap (TK_ERROR_OVERLAP). */
TK_API tk_status tk_softmax_fwd(const tk_softmax_params *p, const void *x, void *y,
                                tk_stream_t stream);

/* dx from the forward output y and its gradient dy (formulas above; p as in the forward call:
 * y and dy use y_row_stride, dx uses x_row_stride). dx may alias dy or y exactly (same pointer
 * and equal strides); other overlaps are rejected. Same errors as tk_softmax_fwd (NULL y, dy or
 * dx) and the same variants, forced with op "softmax_bwd". */
TK_API tk_status tk_softmax_bwd(const tk_softmax_params *p, const void *y, const void *dy,
                                void *dx, tk_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Rotary position embedding, RoPE (docs/kernels/rope.md)
 *
 * Q [tokens, heads_q, head_dim] and K [tokens, heads_k, head_dim] (GQA: heads_k may differ from
 * heads_q) are rotated in one launch. Token t has position p(t) = positions[t] (an int32 or
 * int64 array) or, without an array, position_start + t. The first rotary_dim elements of each
 * head form rotary_dim / 2 pairs (x1, x2), pair i turned by the angle a = p(t) * inv_freq_i:
 *
 *     out1 = x1 cos a - x2 sin a        out2 = x2 cos a + x1 sin a
 *
 *   TK_ROPE_NEOX  (GPT-NeoX, Llama in Hugging Face, "rotate half"): x1 = x[i], x2 = x[i + rotary_dim/2]
 *   TK_ROPE_GPTJ  (GPT-J, Llama's original code, "interleaved"):    x1 = x[2i], x2 = x[2i + 1]
 *
 * Elements rotary_dim .. head_dim - 1 are copied to the output (out of place) or left alone (in
 * place). The backward pass (tk_rope_bwd) rotates by -a, which is the exact gradient.
 *
 * Angles: from a caller's cache, cos_cache[p * cache_row_stride + i] and sin_cache[p *
 * cache_row_stride + i] (f32, 0 <= p < max_position; vLLM's cos_sin_cache [max_position,
 * rotary_dim] is cos_cache = cache, sin_cache = cache + rotary_dim / 2, cache_row_stride =
 * rotary_dim), or computed in the kernel from theta: inv_freq_i = theta^(-2i / rotary_dim).
 * Computed angles are exact to f32 rounding of the angle reduced to [-pi, pi] (error about
 * 2e-7 rad) for |position| < 2^30: the angle is formed and reduced in f64 (beyond 2^30 its
 * error grows as |p * inv_freq| * 2^-53 rad). Tables built in f32 (p * inv_freq rounded to
 * f32, as PyTorch code does) err by up to |p * inv_freq| * 2^-24 rad, e.g. 0.06 rad at position
 * 10^6; pass such a table as the cache to reproduce it. Scaled variants (YaRN, Llama 3.1,
 * NTK) are a cache built by the caller.
 *
 * Strides are in elements, {token, head}; the last dimension is contiguous. All zero means dense
 * ([tokens, heads, head_dim]), so [batch, seq, heads, dim] is tokens = batch * seq, and Q and K
 * of a packed QKV buffer [tokens, heads_q + 2 heads_k, head_dim] are q = qkv, k = qkv +
 * heads_q * head_dim, with token stride (heads_q + 2 heads_k) * head_dim for both. The outputs'
 * strides all zero mean "same as the input's". Each tensor's (token, head) rows must not overlap
 * one another. Initialise with TK_ROPE_PARAMS_INIT; fields are only ever appended.
 * ------------------------------------------------------------------------------------------- */
typedef enum tk_rope_style {
    TK_ROPE_NEOX = 0,  /* rotate halves */
    TK_ROPE_GPTJ = 1   /* rotate interleaved pairs */
} tk_rope_style;

typedef struct tk_rope_params {
    size_t size;                 /* sizeof(tk_rope_params), set by TK_ROPE_PARAMS_INIT */
    tk_dtype dtype;              /* of q, k and the outputs: TK_F32, TK_F16 or TK_BF16 */
    tk_rope_style style;
    int64_t tokens;              /* >= 0; 0 is a no-op */
    int64_t heads_q;             /* >= 0 (0: no Q; q and q_out may be NULL) */
    int64_t heads_k;             /* >= 0 (0: no K; k and k_out may be NULL) */
    int64_t head_dim;            /* >= 2 */
    int64_t rotary_dim;          /* even, 2 <= rotary_dim <= head_dim; 0 = head_dim */
    int64_t q_strides[2];        /* {token, head} of q; {0, 0} = dense */
    int64_t k_strides[2];        /* {token, head} of k; {0, 0} = dense */
    int64_t q_out_strides[2];    /* {token, head} of q_out; {0, 0} = q_strides */
    int64_t k_out_strides[2];    /* {token, head} of k_out; {0, 0} = k_strides */
    const int32_t *positions32;  /* [tokens] positions, or NULL */
    const int64_t *positions64;  /* [tokens] positions, or NULL (at most one of the two) */
    int64_t position_start;      /* without an array: p(t) = position_start + t */
    float theta;                 /* > 0 and finite, e.g. 10000 (Llama 2) or 500000 (Llama 3) */
    const float *cos_cache;      /* NULL: angles from theta; else with sin_cache, as above */
    const float *sin_cache;
    int64_t cache_row_stride;    /* floats between cache rows, >= rotary_dim / 2; 0 = rotary_dim / 2 */
    int64_t max_position;        /* rows of the cache, >= 1 (with a cache only) */
} tk_rope_params;
#define TK_ROPE_PARAMS_INIT                                                                      \
    {sizeof(tk_rope_params), TK_BF16, TK_ROPE_NEOX, 0, 0, 0, 0, 0, {0, 0}, {0, 0}, {0, 0},      \
     {0, 0}, NULL, NULL, 0, 10000.0f, NULL, NULL, 0, 0}

/* Rotates q into q_out and k into k_out (described above). In place: q_out == q with equal
 * strides (likewise k); otherwise an output must not overlap any input. In place, q and k (and
 * out of place, q_out and k_out) may interleave, as in a packed QKV buffer, but not share an
 * element. A cache position outside [0, max_position) is not read: that token's rotated
 * elements become NaN. Pointers must be aligned to their element size; 16-byte aligned tensors
 * with strides, rotary_dim / 2 and head_dim - rotary_dim multiples of 16 bytes run faster.
 * Variants (tk_last_variant, force with op "rope" for tk_rope_fwd, "rope_bwd" for tk_rope_bwd):
 * "vec16" (16-byte accesses) then "scalar".
 * Errors: p NULL, q / q_out NULL with heads_q > 0, k / k_out NULL with heads_k > 0, sin_cache
 * NULL with cos_cache set or the reverse (TK_ERROR_NULL_POINTER); p->size too small, unknown
 * dtype or style, tokens or heads < 0, head_dim < 2, rotary_dim odd, < 0 or > head_dim, a stride
 * < 0 or one that makes rows overlap, both position arrays set, theta <= 0, NaN or infinite
 * (without a cache), max_position < 1 or cache_row_stride < rotary_dim / 2 (with a cache),
 * sizes that overflow (TK_ERROR_INVALID_VALUE); misaligned pointers (TK_ERROR_MISALIGNED);
 * overlaps (TK_ERROR_OVERLAP). */
TK_API tk_status tk_rope_fwd(const tk_rope_params *p, const void *q, const void *k, void *q_out,
                             void *k_out, tk_stream_t stream);

/* Gradient of tk_rope_fwd: dq_out = R(-a) dq and dk_out = R(-a) dk, same parameters, in-place
 * and overlap rules. */
TK_API tk_status tk_rope_bwd(const tk_rope_params *p, const void *dq, const void *dk,
                             void *dq_out, void *dk_out, tk_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Attention forward (docs/kernels/attention.md)
 *
 * For batch b, query head h (its key/value head is h / (heads_q / heads_kv): GQA, MQA when
 * heads_kv = 1), query row i and key row j, with shift = seqlen_k - seqlen_q:
 *
 *     s_ij = softmax_scale * (q_i . k_j)
 *     s_ij = softcap * tanh(s_ij / softcap)                      when softcap > 0 (Gemma 2)
 *     s_ij = s_ij - alibi_slopes[h] * |i + shift - j|             when alibi_slopes != NULL
 *     o_i  = sum over visible j of exp(s_ij - lse_i) * v_j
 *     lse_i = log(sum over visible j of exp(s_ij))               (natural log)
 *
 * Visibility (one convention for every mask; windows are inclusive, -1 = unbounded):
 *     query i sees key j  <=>  0 <= j < seqlen_k
 *                              and (window_left  < 0 or j >= i + shift - window_left)
 *                              and (window_right < 0 or j <= i + shift + window_right)
 * Masks are aligned bottom-right as in FlashAttention 2.1+: the last query row faces the last
 * key. causal = 1 means window_right = 0 (query i sees keys up to j = i + shift). So causal with
 * window_left = W sees W + 1 keys, itself included: j in [i + shift - W, i + shift].
 * - Mistral's and Hugging Face's `sliding_window` = N (a key is visible when
 *   q_idx - N < kv_idx <= q_idx) is causal with window_left = N - 1.
 * - FlashInfer's window_left and FlashAttention's window_size = (left, right) are the same
 *   numbers as window_left and window_right here.
 * - window_left >= seqlen_k - 1 (or window_right >= seqlen_q - 1) is the same as unbounded.
 * A query row that sees no key (e.g. causal with seqlen_q > seqlen_k: rows i < -shift) gets
 * o_i = 0 and lse_i = -inf.
 *
 * Specialised masks (appended fields, each off at its zero default). Each narrows or widens the
 * keys a query position p = i + shift sees to one contiguous range (docs/kernels/attention.md
 * has a picture of each):
 * - chunk_size = C > 0, chunked local attention (Llama 4's iRoPE layers, FlashAttention-3's
 *   attention_chunk): query i also needs floor(j / C) = floor((i + shift) / C), key positions
 *   counted from 0; with causal = 1 that is causal inside each chunk. Any window, softcap, ALiBi.
 * - prefix_len = P > 0, prefix-LM (PaliGemma): query positions p < P also see every key j < P
 *   (the prefix is bidirectional, the rest causal). Needs causal = 1 and window_left = -1; not
 *   with chunk_size or document_ids.
 * - document_ids: int32 [batch, seqlen_k], dense, one id per key position, NON-DECREASING along
 *   each batch row (packed documents, as FlexAttention's document mask_mod is built); query i
 *   sees key j only when document_ids[b, j] = document_ids[b, i + shift] (a query row is the key
 *   position it faces, bottom-right aligned). Needs seqlen_q <= seqlen_k. Any window (causal
 *   inside each document), chunk_size, softcap, ALiBi. Ids that decrease give an unspecified
 *   (but memory-safe) mask.
 * - sinks: f32 [heads_q], learnable per-head logits that join each row's softmax without a
 *   value (GPT-OSS; FlashAttention's learnable_sink): with sink_h in the units of s_ij,
 *       o_i = sum_j exp(s_ij) v_j / (exp(sink_h) + sum_j exp(s_ij)),
 *       lse_i = log(exp(sink_h) + sum over visible j of exp(s_ij)),
 *   so P_ij = exp(s_ij - lse_i) still holds for the backward. A row that sees no key gets
 *   o_i = 0 and lse_i = sink_h. Any mask and option.
 *
 * Tensors (element strides; the last dimension, head_dim, must be contiguous):
 *   q    [batch, seqlen_q, heads_q,  head_dim]   dtype
 *   k, v [batch, seqlen_k, heads_kv, head_dim]   dtype
 *   o    [batch, seqlen_q, heads_q,  head_dim]   dtype, written
 *   lse  [batch, heads_q, seqlen_q]              f32, dense, written when return_lse = 1
 *   alibi_slopes [heads_q]                       f32, optional
 * Each x_strides[4] gives the strides of x's dimensions in the order above: {batch, sequence,
 * head, head_dim}, whatever the memory layout, so [B, S, H, D] and [B, H, S, D] buffers (and
 * packed QKV) all work; all four 0 means dense [B, S, H, D]. Otherwise strides[3] must be 1.
 * Pointers must be 16-byte aligned and the batch, sequence and head strides multiples of 8
 * elements (16 bytes) wherever that dimension has more than one element; lse and alibi_slopes
 * 4-byte aligned. o must not overlap q, k, v, lse or alibi_slopes, nor lse any of them, and
 * no two elements of o may share an address (q, k and v may repeat rows, e.g. stride 0).
 *
 * dtype: TK_F16 or TK_BF16 for q, k, v and o; arithmetic is f32 (P is rounded to the dtype
 * before the P.V product, as in FlashAttention). head_dim: 64, 80, 96, 128 or 256.
 * Initialise with TK_ATTENTION_PARAMS_INIT; fields are only ever appended.
 * ------------------------------------------------------------------------------------------- */
typedef struct tk_attention_params {
    size_t size;              /* sizeof(tk_attention_params), set by TK_ATTENTION_PARAMS_INIT */
    tk_dtype dtype;           /* TK_F16 or TK_BF16 */
    const void *q;
    const void *k;
    const void *v;
    void *o;
    int64_t batch;            /* >= 0; 0 is a no-op (pointers not checked) */
    int64_t seqlen_q;         /* >= 1 */
    int64_t seqlen_k;         /* >= 1 */
    int64_t heads_q;          /* >= 1, a multiple of heads_kv */
    int64_t heads_kv;         /* >= 1 */
    int64_t head_dim;         /* 64, 80, 96, 128 or 256 */
    int64_t q_strides[4];     /* {batch, seq, head, dim}; all 0 = dense [B, S, H, D] */
    int64_t k_strides[4];
    int64_t v_strides[4];
    int64_t o_strides[4];
    float softmax_scale;      /* > 0; 0 = 1 / sqrt(head_dim) */
    int causal;               /* 0 or 1; 1 is window_right = 0 */
    int64_t window_left;      /* >= -1; -1 = unbounded */
    int64_t window_right;     /* >= -1; -1 = unbounded; with causal = 1 only -1 or 0 */
    float softcap;            /* >= 0; 0 = off */
    const float *alibi_slopes;/* NULL = no ALiBi */
    int return_lse;           /* 0 or 1: write lse */
    float *lse;               /* required when return_lse = 1 */
    const float *sinks;       /* f32 [heads_q] sink logits, 4-byte aligned; NULL = none */
    int64_t chunk_size;       /* >= 0; 0 = off; C: chunked local attention */
    int64_t prefix_len;       /* >= 0; 0 = off; P: prefix-LM, with causal = 1 */
    const int32_t *document_ids; /* int32 [batch, seqlen_k], non-decreasing per row; NULL = none */
} tk_attention_params;
#define TK_ATTENTION_PARAMS_INIT                                                                  \
    {sizeof(tk_attention_params), TK_BF16, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0,            \
     {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, 0.0f, 0, -1, -1, 0.0f, NULL, 0, NULL, \
     NULL, 0, 0, NULL}

/* Attention forward as described above: writes o (and lse when p->return_lse = 1). Work is
 * proportional to the visible (i, j) pairs: blocks of keys that no query of a tile can see are
 * neither loaded nor computed, so a sliding window costs seqlen_q x window, not seqlen^2.
 * Errors (nothing is written): p NULL; q, k, v, o NULL (batch > 0); lse NULL with return_lse =
 * 1 (TK_ERROR_NULL_POINTER); p->size wrong, batch < 0, seqlen or heads < 1, heads_q %
 * heads_kv != 0, a stride < 0, o strides that make rows overlap, window < -1, causal with
 * window_right > 0, a scale,
 * softcap or flag out of range, chunk_size or prefix_len < 0, prefix_len without causal = 1 or
 * with window_left, chunk_size or document_ids, document_ids with seqlen_q > seqlen_k
 * (TK_ERROR_INVALID_VALUE); head_dim other than 64, 80, 96, 128, 256,
 * dtype TK_F32, strides[3] != 1, or sizes past the kernel's limits (seqlen, chunk_size or
 * prefix_len > 2^30) (TK_ERROR_NOT_SUPPORTED); unaligned pointers or strides
 * (TK_ERROR_MISALIGNED); overlapping outputs (TK_ERROR_OVERLAP). */
TK_API tk_status tk_attention_fwd(const tk_attention_params *p, tk_stream_t stream);

/* Sliding-window (local) causal attention: tk_attention_fwd on a copy of *p with causal = 1,
 * window_right = 0 and this window_left (>= 0): query i sees keys
 * i + shift - window_left ... i + shift. p's own causal and window fields are ignored.
 * Mistral / Hugging Face sliding_window = N is window_left = N - 1. */
TK_API tk_status tk_attention_sliding_fwd(const tk_attention_params *p, int64_t window_left,
                                          tk_stream_t stream);

/* Whether tk_attention_fwd(p) would run on the calling thread's current device, without
 * launching anything: returns the status that call would return (with the reason in
 * tk_last_error()) and, when variant_name is not NULL, sets *variant_name to the name of the
 * kernel variant it would use ("" for a call with nothing to do, NULL on failure).
 * Variants (tk_last_variant, tk_experimental_force_variant op "attention"), in selection order:
 * "wgmma_sm90_wide" (192 query rows per block on three consumer warpgroups: head_dim 64, every
 * mask, on compute capability 9.0 with the library's sm_90a code), "wgmma_sm90_persistent" (the
 * next one's kernel with one CTA per SM looping over the work tiles, head_dim 64 or 128; the
 * same bits as "wgmma_sm90"; chosen automatically only at head_dim 128 for a short key band:
 * a window bounded on both sides, causal counting as window_right = 0, with window_left +
 * window_right <= 2048 (a side that reaches every key counts as unbounded), or document_ids;
 * forced, it runs every call it supports), "wgmma_sm90" (head_dim 64, 128 or 256 there; every mask and option; the
 * same results as the wide one to rounding),
 * "mma_sm80_packed" (a window bounded on both sides: window_left >= 0, and window_right >= 0 or
 * causal, where a side that reaches every key counts as unbounded; and heads_q / heads_kv even)
 * and "mma_sm80" (every supported call); the last
 * two run on compute capability 8.0 and newer and give the same bits for the same call
 * ("wgmma_sm90" sums in another order: the same results to rounding). */
TK_API tk_status tk_attention_supported(const tk_attention_params *p, const char **variant_name);

/* ---------------------------------------------------------------------------------------------
 * Attention over a KV cache, for serving (docs/kernels/attention_kvcache.md)
 *
 * Token generation and chunked prefill: each sequence b of a batch has seqlen_q(b) new queries
 * and a cache of seqlen_k(b) = seqlens_k[b] keys and values (read on the device). The math, the
 * mask conventions (bottom-right per sequence: shift = seqlen_k(b) - seqlen_q(b)), windows,
 * softcap, ALiBi, GQA / MQA and lse are exactly those of tk_attention_fwd above, per sequence.
 *
 * Queries and outputs (x_strides[4] as in tk_attention_params: {batch, sequence, head,
 * head_dim}, all 0 = dense, strides[3] = 1):
 *   cu_seqlens_q == NULL:  q, o [batch, seqlen_q, heads_q, head_dim]; every sequence has seqlen_q
 *                          queries; lse [batch, heads_q, seqlen_q]
 *   cu_seqlens_q != NULL:  q, o [total_q, heads_q, head_dim] (the sequence stride, strides[1],
 *                          steps tokens; strides[0] is ignored); sequence b's queries are tokens
 *                          cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (int32 [batch + 1] on the
 *                          device, non-decreasing, cu_seqlens_q[0] = 0, cu_seqlens_q[batch] =
 *                          total_q); seqlen_q is then the largest seqlen_q(b) (it sizes the
 *                          grid); lse [heads_q, total_q]
 * The cache (k_cache and v_cache, each with its own strides, dims in this order):
 *   block_table == NULL:   contiguous [batch, max_seqlen_k, heads_kv, head_dim]: key j of
 *                          sequence b at k_cache[b, j]
 *   block_table != NULL:   paged [num_pages, page_size, heads_kv, head_dim]: key j of sequence b
 *                          at k_cache[block_table[b * block_table_stride + j / page_size],
 *                          j % page_size]; block_table int32 [batch, max_pages_per_seq] on the
 *                          device; pages in any order, shared by sequences (a prefix) but
 *                          not where an append below writes
 *   seqlens_k int32 [batch] on the device, 0 <= seqlens_k[b] <= the capacity (max_seqlen_k, or
 *   max_pages_per_seq * page_size); a sequence with no keys gets o = 0, lse = -inf.
 * Appending (k_new and v_new set): one new key and value per query token, [batch, seqlen_q,
 * heads_kv, head_dim] or [total_q, heads_kv, head_dim] as q, are first written to the cache at
 * positions seqlens_k[b] .. seqlens_k[b] + seqlen_q(b) - 1 (crossing pages as the table says),
 * then attended with seqlen_k(b) = seqlens_k[b] + seqlen_q(b) (the mask uses the new length).
 * seqlens_k itself is not updated: the caller adds seqlen_q(b) for the next step. Rows that
 * would pass the capacity are not written. k_new / v_new must not overlap the caches, and the
 * caches, written then, must not overlap each other or any other tensor of the call.
 * RoPE (rotary_dim > 0): q and k_new are rotated as tk_rope_fwd would (style, rotary_dim, theta
 * or a cos/sin cache: see the RoPE section) in the same launch, query i of sequence b and its
 * new key at position seqlen_k(b) - seqlen_q(b) + i (= seqlens_k[b] + i when appending); the
 * rotated keys are what the cache keeps, and q itself is not written. Angles from theta may be
 * scaled: TK_ROPE_SCALING_LLAMA3 (Llama 3.1's rope_type "llama3": with wavelength w_i = 2 pi /
 * inv_freq_i and L = rope_original_max_position, inv_freq_i / rope_factor where w_i > L /
 * rope_low_freq_factor, unchanged where w_i < L / rope_high_freq_factor, between them (1 - t)
 * inv_freq_i / rope_factor + t inv_freq_i with t = (L / w_i - low) / (high - low)) or
 * TK_ROPE_SCALING_YARN (YaRN as Hugging Face's rope_type "yarn": with d = rotary_dim, ramp
 * bounds lo = max(0, floor(c(rope_beta_fast))), hi = min(d - 1, ceil(c(rope_beta_slow))), c(r) =
 * d ln(L / (2 pi r)) / (2 ln theta), ramp_i = clamp((i - lo) / (hi - lo), 0, 1) (hi - lo at
 * least 0.001), inv_freq_i (1 - ramp_i) + inv_freq_i / rope_factor ramp_i, and cos, sin times
 * rope_attention_factor, 0 meaning 0.1 ln(rope_factor) + 1). The new fields' zero values (INIT)
 * mean no RoPE.
 *
 * Sinks and chunked local attention (appended fields, off at their zero defaults): sinks (f32
 * [heads_q], 4-byte aligned) and chunk_size = C > 0 mean what they mean for tk_attention_fwd,
 * per sequence with key positions counted from the cache's start: query i of sequence b (key
 * position p = i + shift) sees key j only when floor(j / C) = floor(p / C), and sink_h joins
 * every row's denominator (a row that sees no key gets o = 0, lse = sink_h). Both combine with
 * every other option; with splits the sink joins at the merge, once per row.
 *
 * Split-KV: each (sequence, key/value head) is cut into num_splits ranges of keys, computed in
 * parallel into f32 partial outputs with their lse, then merged by a second kernel (o = sum_s
 * exp(lse_s - lse) o_s, lse = log sum_s exp(lse_s)). num_splits = 0 lets the library choose, per
 * sequence and on the device from seqlens_k (a longer sequence gets more splits), within a bound
 * the host derives from the capacity, heads and the device. The partials live in a caller's
 * workspace of tk_attention_kvcache_workspace_size bytes (0 when the call needs no split).
 *
 * What the host cannot check, since it lives on the device: seqlens_k, cu_seqlens_q and the
 * block table's entries. The kernels clamp them so that no access leaves the tensors described
 * by the host-side sizes (a length past the capacity counts as the capacity, a page outside
 * [0, num_pages) reads as zeros, a token outside [0, total_q) is not written) but the results of
 * such a call are undefined.
 *
 * dtype TK_F16 or TK_BF16; head_dim 64, 128 or 256; pointers 16-byte aligned and strides
 * multiples of 8 elements as in tk_attention_fwd; lse, alibi_slopes, the int32 arrays 4-byte
 * aligned; the workspace 16-byte aligned. A workspace, when given (even to a call that needs
 * none), is workspace_bytes from its start, which must not overlap any other buffer of the
 * call. Initialise with TK_ATTENTION_KVCACHE_PARAMS_INIT; fields are only ever appended.
 * ------------------------------------------------------------------------------------------- */
/* How RoPE angles from theta are scaled for a context longer than the model was trained on. */
typedef enum tk_rope_scaling {
    TK_ROPE_SCALING_NONE = 0,
    TK_ROPE_SCALING_LLAMA3 = 1, /* Llama 3.1 */
    TK_ROPE_SCALING_YARN = 2    /* YaRN */
} tk_rope_scaling;

typedef struct tk_attention_kvcache_params {
    size_t size;               /* sizeof(tk_attention_kvcache_params), set by the INIT macro */
    tk_dtype dtype;            /* TK_F16 or TK_BF16 */
    const void *q;
    void *k_cache;             /* written only where k_new is appended */
    void *v_cache;             /* written only where v_new is appended */
    void *o;
    int64_t batch;             /* >= 0; 0 is a no-op (pointers not checked) */
    int64_t seqlen_q;          /* >= 1: queries per sequence, or the longest with cu_seqlens_q */
    const int32_t *cu_seqlens_q; /* NULL, or [batch + 1] on the device (varlen queries) */
    int64_t total_q;           /* with cu_seqlens_q: tokens of q and o, >= 0 */
    const int32_t *seqlens_k;  /* [batch] on the device: keys in each sequence's cache */
    int64_t heads_q;           /* >= 1, a multiple of heads_kv */
    int64_t heads_kv;          /* >= 1 */
    int64_t head_dim;          /* 64, 128 or 256 */
    int64_t max_seqlen_k;      /* contiguous cache: positions per sequence, >= 1 */
    const int32_t *block_table;/* NULL = contiguous cache; else [batch, max_pages_per_seq] */
    int64_t block_table_stride;/* int32 elements between sequences' rows; 0 = max_pages_per_seq */
    int64_t num_pages;         /* paged: pages in k_cache and v_cache, >= 1 */
    int64_t page_size;         /* paged: keys per page, >= 1 */
    int64_t max_pages_per_seq; /* paged: >= 1 */
    int64_t q_strides[4];      /* {batch, seq, head, dim}; all 0 = dense */
    int64_t k_strides[4];      /* {batch or page, position in it, head, dim}; all 0 = dense */
    int64_t v_strides[4];
    int64_t o_strides[4];
    float softmax_scale;       /* > 0; 0 = 1 / sqrt(head_dim) */
    int causal;                /* 0 or 1; 1 is window_right = 0 */
    int64_t window_left;       /* >= -1; -1 = unbounded */
    int64_t window_right;      /* >= -1; -1 = unbounded; with causal = 1 only -1 or 0 */
    float softcap;             /* >= 0; 0 = off */
    const float *alibi_slopes; /* NULL = no ALiBi; else [heads_q] */
    int return_lse;            /* 0 or 1: write lse */
    float *lse;                /* required when return_lse = 1 */
    int64_t num_splits;        /* 0 = library's choice; else 1 .. 1024 */
    void *workspace;           /* tk_attention_kvcache_workspace_size bytes, or NULL when 0 */
    size_t workspace_bytes;    /* the workspace's size */
    const void *k_new;         /* NULL, or keys to append, in q's token layout with heads_kv */
    const void *v_new;         /* with k_new: the values to append */
    int64_t k_new_strides[4];  /* as q_strides; all 0 = dense */
    int64_t v_new_strides[4];
    int64_t rotary_dim;        /* 0 = no RoPE; else a multiple of 16, <= head_dim */
    tk_rope_style rope_style;  /* TK_ROPE_NEOX or TK_ROPE_GPTJ */
    float rope_theta;          /* without a cache: > 0 and finite */
    const float *rope_cos;     /* NULL: angles from rope_theta; else with rope_sin, as tk_rope's */
    const float *rope_sin;     /*   cos_cache / sin_cache: [rope_max_position, row stride] f32 */
    int64_t rope_cache_row_stride; /* >= rotary_dim / 2; 0 = rotary_dim / 2 */
    int64_t rope_max_position; /* rows of the cache, >= 1 (with a cache only) */
    tk_rope_scaling rope_scaling; /* of angles from theta (not with a cache) */
    float rope_factor;         /* LLAMA3, YARN: >= 1 */
    float rope_low_freq_factor;  /* LLAMA3: > 0 */
    float rope_high_freq_factor; /* LLAMA3: > rope_low_freq_factor */
    int64_t rope_original_max_position; /* LLAMA3, YARN: >= 1, the pre-scaling context */
    float rope_beta_fast;      /* YARN: > rope_beta_slow > 0 (32 and 1 in Hugging Face) */
    float rope_beta_slow;
    float rope_attention_factor; /* YARN: > 0, or 0 = 0.1 ln(rope_factor) + 1 */
    const float *sinks;        /* NULL, or f32 [heads_q] sink logits (see above) */
    int64_t chunk_size;        /* >= 0; 0 = off; C: chunked local attention (see above) */
} tk_attention_kvcache_params;
#define TK_ATTENTION_KVCACHE_PARAMS_INIT                                                         \
    {sizeof(tk_attention_kvcache_params), TK_BF16, NULL, NULL, NULL, NULL, 0, 0, NULL, 0, NULL,  \
     0, 0, 0, 0, NULL, 0, 0, 0, 0, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0},      \
     0.0f, 0, -1, -1, 0.0f, NULL, 0, NULL, 0, NULL, 0, NULL, NULL, {0, 0, 0, 0}, {0, 0, 0, 0},  \
     0, TK_ROPE_NEOX, 10000.0f, NULL, NULL, 0, 0, TK_ROPE_SCALING_NONE, 1.0f, 1.0f, 4.0f, 8192,    \
     32.0f, 1.0f, 0.0f, NULL, 0}

/* Attention of the new queries over the cache, as described above: writes o (and lse). Work and
 * traffic are proportional to the visible keys: pages outside a window are not read.
 * Errors (nothing is written): p NULL; q, k_cache, v_cache, o, seqlens_k NULL (batch > 0); lse
 * NULL with return_lse = 1; workspace NULL when one is needed; one of k_new / v_new without the
 * other (TK_ERROR_NULL_POINTER); p->size
 * wrong, batch < 0, seqlen_q, heads, max_seqlen_k, num_pages, page_size or max_pages_per_seq <
 * 1 where used, total_q < 0, heads_q % heads_kv != 0, a stride < 0, a block_table_stride
 * smaller than max_pages_per_seq, o strides that make rows overlap, a window, scale, softcap,
 * flag, num_splits or chunk_size (< 0) out of range, a workspace smaller than needed or whose
 * workspace_bytes run past the end of the address space, a RoPE field out of range (rotary_dim <
 * 0 or > head_dim, unknown style or scaling, theta, factors or positions as documented above), a
 * block table or RoPE cache whose extent (rows - 1) x row stride overflows int64
 * (TK_ERROR_INVALID_VALUE); rope_cos without rope_sin or the reverse (TK_ERROR_NULL_POINTER);
 * head_dim other than 64, 128, 256, dtype TK_F32, strides[3] != 1, sizes past the kernel's
 * limits (2^30 keys, queries or chunk_size), rotary_dim not a multiple of 16, a scaling with a
 * cos/sin cache (TK_ERROR_NOT_SUPPORTED); unaligned pointers or strides (TK_ERROR_MISALIGNED);
 * overlapping outputs, a workspace overlapping any other buffer (TK_ERROR_OVERLAP). */
TK_API tk_status tk_attention_kvcache_fwd(const tk_attention_kvcache_params *p,
                                          tk_stream_t stream);

/* *bytes = the workspace tk_attention_kvcache_fwd(p) needs on the calling thread's current
 * device (0 when it runs without splits); p's pointers are not read. Errors as
 * tk_attention_kvcache_fwd's for p's sizes and flags; on failure *bytes is left as it was. */
TK_API tk_status tk_attention_kvcache_workspace_size(const tk_attention_kvcache_params *p,
                                                     size_t *bytes);

/* Whether tk_attention_kvcache_fwd(p) would run on the calling thread's current device, as
 * tk_attention_supported: the status that call would return and the variant's name ("" for a
 * call with nothing to do, NULL on failure). Variants (tk_last_variant,
 * tk_experimental_force_variant op "attention_kvcache"), in selection order: "prefill_sm80"
 * (chunked prefill on the attention forward's kernel: seqlen_q at least 64, or 32 at head_dim 256,
 * no RoPE, and num_splits = 1, or 0 when the chunk's query tiles, ceil(seqlen_q / 128) (64 at
 * head_dim 256) x heads_q x batch, are at least the SM count; it then needs no workspace) and
 * "decode_sm80" (every supported call); both on compute capability 8.0 and newer. */
TK_API tk_status tk_attention_kvcache_supported(const tk_attention_kvcache_params *p,
                                                const char **variant_name);

/* ---------------------------------------------------------------------------------------------
 * Attention backward (docs/kernels/attention_bwd.md)
 *
 * Gradients of tk_attention_fwd for the same call: with P_ij = exp(s_ij - lse_i) (the forward's
 * probabilities, recomputed from its natural-log lse), dO the gradient of o and
 * D_i = sum_d dO_id O_id:
 *     dV_j = sum_i P_ij dO_i
 *     dS_ij = P_ij (dO_i . v_j - D_i) * ds_ij/dx_ij     (x_ij = q_i . k_j; ds/dx = scale, or
 *                                                        scale * (1 - tanh^2) with softcap)
 *     dQ_i = sum_j dS_ij k_j,   dK_j = sum_i dS_ij q_i
 * summed over the heads_q / heads_kv query heads of each key/value head (GQA, MQA) for dK, dV.
 * Rows that see no key get dQ = 0; keys that no row sees get dK = dV = 0. With sinks (whose lse
 * includes the sink term) also dsinks_h = -sum over b, i of exp(sink_h - lse_bhi) D_bhi, the
 * gradient of each sink logit, summed in a fixed order (deterministic).
 *
 * Determinism: dK, dV and dsinks are summed in a fixed order. dQ sums one f32 product per
 * 64-key tile with atomic adds: in whatever order they land by default, so its last bits may
 * differ between runs; in key-tile order with deterministic = 1, so that it is bit-identical
 * from run to run (a little slower, and a little more workspace).
 *
 * Fields mean what they mean in tk_attention_params (same mask, scale, softcap, ALiBi, stride
 * and alignment rules, same errors); o and lse are the forward's outputs for q, k, v (lse as
 * written with return_lse = 1), dout is dO, laid out like o. dq is laid out like q, dk and dv
 * like k and v; each is written whole, must not overlap any input, the workspace or another
 * gradient, and no two of its elements may share an address. workspace: device memory of
 * workspace_bytes >= tk_attention_bwd_workspace_size(p), 16-byte aligned, overwritten.
 * head_dim: 64, 80, 96, 128 or 256; 256 runs on compute capability 8.0 and 9.x (and others
 * whose shared memory per block holds 143 KB), not on 8.6 / 8.9, where the call fails with
 * TK_ERROR_NOT_SUPPORTED.
 * Initialise with TK_ATTENTION_BWD_PARAMS_INIT; fields are only ever appended.
 * ------------------------------------------------------------------------------------------- */
typedef struct tk_attention_bwd_params {
    size_t size;              /* sizeof(tk_attention_bwd_params), set by the INIT macro */
    tk_dtype dtype;           /* TK_F16 or TK_BF16 */
    const void *q;
    const void *k;
    const void *v;
    const void *o;            /* the forward's output */
    const float *lse;         /* the forward's lse [batch, heads_q, seqlen_q], f32, dense */
    const void *dout;         /* dO, [batch, seqlen_q, heads_q, head_dim] */
    void *dq;                 /* written: [batch, seqlen_q, heads_q, head_dim] */
    void *dk;                 /* written: [batch, seqlen_k, heads_kv, head_dim] */
    void *dv;                 /* written: [batch, seqlen_k, heads_kv, head_dim] */
    int64_t batch;            /* >= 0; 0 is a no-op (pointers not checked) */
    int64_t seqlen_q;
    int64_t seqlen_k;
    int64_t heads_q;
    int64_t heads_kv;
    int64_t head_dim;         /* 64, 80, 96, 128 or 256 */
    int64_t q_strides[4];     /* {batch, seq, head, dim}; all 0 = dense [B, S, H, D] */
    int64_t k_strides[4];
    int64_t v_strides[4];
    int64_t o_strides[4];
    int64_t dout_strides[4];
    int64_t dq_strides[4];
    int64_t dk_strides[4];
    int64_t dv_strides[4];
    float softmax_scale;      /* > 0; 0 = 1 / sqrt(head_dim) */
    int causal;               /* 0 or 1 */
    int64_t window_left;      /* >= -1 */
    int64_t window_right;     /* >= -1 */
    float softcap;            /* >= 0; 0 = off */
    const float *alibi_slopes;/* NULL = no ALiBi */
    void *workspace;          /* tk_attention_bwd_workspace_size bytes, 16-byte aligned */
    size_t workspace_bytes;
    const float *sinks;       /* the forward's sinks [heads_q], or NULL */
    int64_t chunk_size;       /* the forward's chunk_size */
    int64_t prefix_len;       /* the forward's prefix_len */
    const int32_t *document_ids; /* the forward's document_ids [batch, seqlen_k], or NULL */
    float *dsinks;            /* written with sinks: f32 [heads_q], 4-byte aligned; else unused */
    int deterministic;        /* 0 or 1: dq bit-identical from run to run (see above) */
} tk_attention_bwd_params;
#define TK_ATTENTION_BWD_PARAMS_INIT                                                              \
    {sizeof(tk_attention_bwd_params), TK_BF16, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,   \
     NULL, 0, 0, 0, 0, 0, 0, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0},              \
     {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, 0.0f, 0, -1, -1, 0.0f, NULL, NULL, 0, \
     NULL, 0, 0, NULL, NULL, 0}

/* Bytes of workspace tk_attention_bwd needs for *p (only the sizes and deterministic are read; 0
 * for batch 0): the row sums D, 4 * batch * heads_q * seqlen_q rounded up to 16 bytes; 112 bytes
 * that put the f32 dQ accumulator on a 128-byte boundary; the accumulator, 4 * batch * heads_q *
 * (seqlen_q rounded up to 16) * head_dim; with deterministic = 1 another 4 * (4 + batch * heads_q
 * * ceil(seqlen_q / 32)) rounded up to 16 bytes, the order of the dQ adds. Errors: p or bytes NULL
 * (TK_ERROR_NULL_POINTER); p->size, the sizes (their limits included) or deterministic invalid
 * as in tk_attention_bwd; on failure *bytes is left as it was. */
TK_API tk_status tk_attention_bwd_workspace_size(const tk_attention_bwd_params *p, size_t *bytes);

/* Attention backward as described above: writes dq, dk, dv. Work is proportional to the
 * visible (i, j) pairs, as in the forward. dq is accumulated with f32 atomics, so its last bits
 * may differ from run to run unless deterministic = 1; dk and dv are deterministic.
 * Errors (nothing is written): those of tk_attention_fwd for the shared fields; o, lse, dout,
 * dq, dk, dv or workspace NULL, dsinks NULL with sinks (TK_ERROR_NULL_POINTER); workspace_bytes too small,
 * deterministic other than 0 or 1, or a gradient whose strides make elements overlap
 * (TK_ERROR_INVALID_VALUE); head_dim other than 64, 80, 96, 128
 * or 256, or 256 on a device without the shared memory for it (TK_ERROR_NOT_SUPPORTED); unaligned pointers or strides (TK_ERROR_MISALIGNED); a
 * gradient overlapping an input, the workspace or another gradient (TK_ERROR_OVERLAP).
 * Variants (tk_last_variant, tk_experimental_force_variant op "attention_bwd"), in selection
 * order: "wgmma_sm90" (FlashAttention-3 style: TMA, a producer and two consumer warpgroups,
 * wgmma, dq added from shared memory by bulk reductions; compute capability 9.0 with a build
 * that has sm_90a code; head dims 64 and 128; every mask and option, softcap at head dim 128
 * only),
 * "mma_sm80_bn128" (128 keys per CTA; compute capability 8.0 and newer where the shared
 * memory per block allows it: at head dims 80 and 128 not on 8.6 / 8.9; head dims 64, 80, 96 and
 * 128), "mma_sm80_d256" (head dim 256, 64 keys per CTA; where the shared memory per block allows
 * it: 8.0, 9.x), then "mma_sm80" (64 keys per CTA; compute capability 8.0 and newer; head dims
 * 64, 80, 96 and 128). dq's bits under deterministic = 1 are fixed for one variant; the variants sum in
 * different orders. */
TK_API tk_status tk_attention_bwd(const tk_attention_bwd_params *p, tk_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * GEMM with a fused epilogue (docs/kernels/gemm.md)
 * ------------------------------------------------------------------------------------------- */

/* How B is stored. Both layouts are row-major; the names give the dimension order. */
typedef enum tk_gemm_b_layout {
    TK_GEMM_B_KN = 0,  /* B[k, n] at b[k * ldb + n], ldb >= n: D = A B */
    TK_GEMM_B_NK = 1   /* B[n, k] at b[n * ldb + k], ldb >= k: D = A B^T, the layout of a
                          PyTorch Linear weight [out_features, in_features] */
} tk_gemm_b_layout;

/* A GEMM call. Initialise with TK_GEMM_PARAMS_INIT, then set the fields; fields are only ever
 * appended. Matrices are row-major with leading dimensions (elements between rows) given.
 *
 *   D[i, j] = act(alpha * sum_k A[i, k] B(k, j) + beta * C[i, j] + bias[j])
 *
 * for 0 <= i < m, 0 <= j < n, where B(k, j) reads B in p->b_layout. The products are summed in
 * f32 (tensor cores); the epilogue is f32 and D is rounded once to its dtype. The order is that
 * of cuBLASLt's CUBLASLT_EPILOGUE_BIAS / _GELU_BIAS: the residual beta * C enters before the
 * activation. A residual added after an activation takes a second call (act, then beta = 1 with
 * act = TK_ACT_NONE). act is computed by the same device functions as tk_activation_fwd for an
 * output of the same dtype, so a fused call and GEMM-then-activation agree. */
typedef struct tk_gemm_params {
    size_t size;                 /* sizeof(tk_gemm_params), set by TK_GEMM_PARAMS_INIT */
    int64_t m, n, k;             /* each >= 1 */
    tk_dtype input_dtype;        /* of A and B: TK_F16 or TK_BF16 */
    tk_dtype output_dtype;       /* of C, D and bias: TK_F16, TK_BF16 or TK_F32 */
    tk_gemm_b_layout b_layout;
    const void *a;               /* [m, k], lda >= k */
    int64_t lda;
    const void *b;               /* [k, n] (ldb >= n) or [n, k] (ldb >= k), see b_layout */
    int64_t ldb;
    const void *c;               /* [m, n], ldc >= n; read only when beta != 0, else may be NULL */
    int64_t ldc;
    const void *bias;            /* n elements of output_dtype, or NULL for no bias */
    void *d;                     /* [m, n], ldd >= n: the output */
    int64_t ldd;
    tk_activation activation;    /* TK_ACT_NONE for a plain GEMM */
    float alpha;                 /* finite */
    float beta;                  /* finite; 0 means C is not read (a NaN in C does not leak) */
} tk_gemm_params;
#define TK_GEMM_PARAMS_INIT                                                                     \
    {sizeof(tk_gemm_params), 0, 0, 0, TK_BF16, TK_BF16, TK_GEMM_B_NK, NULL, 0, NULL, 0, NULL, 0, \
     NULL, NULL, 0, TK_ACT_NONE, 1.0f, 0.0f}

/* Runs the GEMM that *p describes (p itself is read during the call only).
 * - Any m, n, k >= 1. Every pointer must be aligned to its element size. The fast kernels need
 *   a and b 16-byte aligned with lda and ldb multiples of 8; other calls run a slower kernel
 *   with the same results. c, d and bias may have any (element) alignment.
 * - In place: c may alias d exactly (c == d and ldc == ldd); every element of C is read before
 *   the same element of D is written. Any other overlap of D's memory span
 *   [d, d + ((m - 1) * ldd + n) elements) with the spans of A, B, C or bias is rejected.
 * - Variants (tk_last_variant, tk_experimental_force_variant op "gemm"), in selection order:
 *   "wgmma_128x256": the Hopper kernel (warpgroup MMA, TMA loads), only on compute capability
 *   9.0 with a library built for sm_90a (ARCHS 90a), B as TK_GEMM_B_NK and the 16-byte rule
 *   above; m, n <= 2^31 - 1;
 *   "mma_128x256": 128x256 tiles, for calls that fill at least one wave of them (tiles >= SM
 *   count) on devices with 144 KiB of shared memory per block (A100, H100, H200);
 *   "mma_128x128": 128x128 tiles, any size; "mma_unaligned": 128x128 tiles loaded element by
 *   element, for any alignment of a and b. All but the last need the 16-byte rule above.
 * Errors: NULL p / a / b / d, or c with beta != 0 (TK_ERROR_NULL_POINTER); p->size too small,
 * m, n or k < 1, a leading dimension smaller than its row, unknown dtype / layout / activation,
 * NaN or infinite alpha / beta, a matrix extent past int64 (TK_ERROR_INVALID_VALUE); input
 * dtype TK_F32 (TK_ERROR_NOT_SUPPORTED); a pointer not aligned to its element size
 * (TK_ERROR_MISALIGNED); overlap as above (TK_ERROR_OVERLAP). */
TK_API tk_status tk_gemm(const tk_gemm_params *p, tk_stream_t stream);

/* The status tk_gemm(p, stream) would return on the calling thread's current device, with the
 * same message in tk_last_error() (under this function's name), without launching anything or
 * reading the matrices. On TK_SUCCESS, *variant_name (when variant_name is not NULL) receives
 * the static name of the variant that tk_gemm would run, and NULL on failure (as with
 * tk_attention_supported). */
TK_API tk_status tk_gemm_supported(const tk_gemm_params *p, const char **variant_name);

#ifdef __cplusplus
}
#endif

#endif /* TKERN_H */
