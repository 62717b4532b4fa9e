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
 * (e.g. "activation", "glu", "attention", "gemm") use the variant called `variant`, or go back
 * to automatic selection when `variant` is NULL. A forced variant that cannot run a call makes
 * that call fail with TK_ERROR_NOT_SUPPORTED instead of falling back. The environment variable
 * TKERN_FORCE_VARIANT="op=variant[,op=variant...]", read once at first use, does the same for
 * every thread. Fails with TK_ERROR_INVALID_VALUE for an unknown op or variant name. */
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
 * x_row_stride, gate-first or interleaved layout); other overlaps are rejected.
 * Errors: NULL pointers with rows > 0, rows < 0, d <= 0, strides smaller than the row, unknown
 * kind / dtype / layout, NaN or non-positive limit, NaN alpha, overlap. */
TK_API tk_status tk_glu_fwd(const tk_glu_params *p, const void *x, void *y, tk_stream_t stream);

/* Gradient of tk_glu_fwd: dx (laid out like x) from dy (laid out like y) and x. The clamps of
 * TK_GLU_SWIGLU_CLAMPED pass no gradient where they are active. dx may alias x exactly. */
TK_API tk_status tk_glu_bwd(const tk_glu_params *p, const void *dy, const void *x, void *dx,
                            tk_stream_t stream);

/* @@ NORM SECTION (issue 3) @@ */

/* @@ SOFTMAX SECTION (issue 3) @@ */

/* @@ ROPE SECTION (issue 3) @@ */

/* @@ ATTENTION SECTION (issue 4) @@ */

/* @@ GEMM SECTION (issue 5) @@ */

#ifdef __cplusplus
}
#endif

#endif /* TKERN_H */
