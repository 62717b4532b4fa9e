/* Launchers of the RMSNorm / LayerNorm kernels (cuda/norm_fwd.cu, cuda/norm_bwd.cu), called by
 * src/norm.c after validation. Internal. */
#ifndef TK_CUDA_NORM_H
#define TK_CUDA_NORM_H

#include <stdbool.h>
#include <stdint.h>

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One forward or backward call; strides are resolved (never 0). */
typedef struct tk_norm_call {
    int layernorm;          /* 0 RMSNorm, 1 LayerNorm */
    int dtype;              /* tk_dtype of x, residual, y, dy, dx */
    int weight_dtype;       /* tk_dtype of weight, bias, dw, db: dtype or TK_F32 */
    bool backward;          /* which op built the call: "norm" or "norm_bwd" */
    bool gemma;             /* scale by 1 + weight */
    int64_t rows, cols;
    int64_t x_stride;       /* x, dx */
    int64_t residual_stride;
    int64_t y_stride;       /* y, dy */
    float eps;
    const void *x;
    void *residual;         /* forward: NULL or updated in place with x + residual */
    const void *weight;     /* NULL: 1 */
    const void *bias;       /* NULL: 0 */
    void *y;
    float *mean_out, *rstd_out;             /* forward stats, each optional */
    const void *dy;
    const float *mean_in, *rstd_in;         /* backward stats (mean_in: LayerNorm only) */
    void *dx;
    void *dw, *db;                          /* optional */
    float *workspace;       /* with dw or db: workspace_slots * cols floats per reduced tensor */
    int64_t workspace_slots;
} tk_norm_call;

/* Row widths the "rows" kernels hold in registers: up to TK_NORM_ROWS_MAX_THREADS threads of
 * TK_NORM_FWD_PACKS 16-byte packs forward (a block holds 32 KB of a row: 16384 16-bit or 8192
 * f32 elements) or TK_NORM_FWD_ELEMS_SCALAR scalars (4096), TK_NORM_BWD_ELEMS_* elements
 * backward (8192 / 4096). Backward 16-bit rows in packs whose group is a whole block take the
 * ring kernel instead, which stages x and dy in shared memory: TK_NORM_BWD_ELEMS_VEC / 8 packs
 * per thread up to 8192 columns, TK_NORM_BWD_RING_MAX_PACKS past them (up to 16384). */
#define TK_NORM_FWD_PACKS 4
#define TK_NORM_FWD_ELEMS_SCALAR 8
#define TK_NORM_BWD_ELEMS_VEC 16
#define TK_NORM_BWD_ELEMS_SCALAR 8
#define TK_NORM_BWD_RING_MAX_PACKS 4
#define TK_NORM_ROWS_MAX_THREADS 512

/* The widest row the "rows" kernels (backward: and the ring kernel) hold on one block, accessed
 * in packs of `vec` elements (8: 16-bit packs). */
static inline int64_t tk_norm_rows_max_cols(int vec, bool backward) {
    if (backward)
        return TK_NORM_ROWS_MAX_THREADS * (vec == 8   ? TK_NORM_BWD_RING_MAX_PACKS * vec
                                           : vec > 1 ? TK_NORM_BWD_ELEMS_VEC
                                                     : TK_NORM_BWD_ELEMS_SCALAR);
    return TK_NORM_ROWS_MAX_THREADS * (vec > 1 ? TK_NORM_FWD_PACKS * vec : TK_NORM_FWD_ELEMS_SCALAR);
}

/* Whether a row of `cols` elements, accessed in packs of `vec` elements, fits the registers of
 * the "rows" kernels (the "vec16" and "scalar" variants); wider rows take the "cluster" or the
 * "wide" ones. Backward 16-bit rows past 8192 also need the ring's shared memory
 * (tk_norm_bwd_ring_fit). */
static inline bool tk_norm_rows_fit(int64_t cols, int vec, bool backward) {
    return cols <= tk_norm_rows_max_cols(vec, backward);
}

/* The ring kernel's plan for a 16-bit row of `packs_row` 16-byte packs (more than 32 threads'
 * worth; the launcher takes the rows kernel below that): packs per thread and tensor (2 while a
 * block of TK_NORM_ROWS_MAX_THREADS threads holds the row at 2, else 4), threads (a multiple of
 * 32), and the dynamic shared memory of a thread: a 2-stage ring of x and dy (16 bytes a pack of
 * each), then, where the thread's registers do not hold it (at 4 packs, and on LayerNorm's narrow
 * plan at 2), w' as f32 (4 bytes an element); the block's static shared memory (the row sums) is at
 * most TK_NORM_BWD_RING_STATIC_SMEM bytes. */
#define TK_NORM_BWD_RING_STATIC_SMEM 256

static inline int tk_norm_bwd_ring_packs(int64_t packs_row) {
    const int packs = TK_NORM_BWD_ELEMS_VEC / 8;
    return packs_row <= (int64_t)TK_NORM_ROWS_MAX_THREADS * packs ? packs : TK_NORM_BWD_RING_MAX_PACKS;
}

static inline int tk_norm_bwd_ring_threads(int64_t packs_row) {
    const int packs = tk_norm_bwd_ring_packs(packs_row);
    return (int)((packs_row + packs - 1) / packs + 31) / 32 * 32;
}

static inline int tk_norm_bwd_ring_bytes_per_thread(int packs, int vec, bool w_shared) {
    return 2 * 2 * packs * 16 + (w_shared ? packs * vec * 4 : 0);
}

/* Whether a device whose blocks may opt in to `max_smem_optin` bytes of shared memory holds the
 * ring kernel's block for a backward 16-bit row of `cols` columns (a multiple of 8). At 2 packs
 * (<= 8192 columns: <= 64 KB) every sm_80+ device does; at 4 (384 bytes a thread) a 16384-wide
 * row takes 192 KB: an H100 / H200 holds it, an A100 rows of up to 13312 columns (416 threads),
 * sm_86 / sm_89 (~99 KB) none. */
static inline bool tk_norm_bwd_ring_fit(int64_t cols, int max_smem_optin) {
    const int64_t packs_row = cols / 8;
    return (int64_t)tk_norm_bwd_ring_threads(packs_row) *
                   tk_norm_bwd_ring_bytes_per_thread(tk_norm_bwd_ring_packs(packs_row), 8,
                                                     tk_norm_bwd_ring_packs(packs_row) > 2) +
               TK_NORM_BWD_RING_STATIC_SMEM <=
           max_smem_optin;
}

/* Forward rows wider than one block holds, up to this many blocks' worth, run split over the
 * blocks of a thread-block cluster (sm_90, the "cluster_vec16" variant): each block stages its
 * slice of the row (at most one rows block's worth, 32 KB) in shared memory, and the blocks add
 * their partial sums through distributed shared memory. 8 blocks is the portable cluster size:
 * rows of up to 131072 16-bit or 65536 f32 elements. */
#define TK_NORM_CLUSTER_MAX_BLOCKS 8

static inline bool tk_norm_cluster_fit(int64_t cols, int vec) {
    return cols <= TK_NORM_CLUSTER_MAX_BLOCKS * tk_norm_rows_max_cols(vec, false);
}

/* Backward rows wider than the ring and rows kernels hold (16-bit past 16384 columns, f32 past
 * 8192), up to the same TK_NORM_CLUSTER_MAX_BLOCKS slices of at most TK_NORM_CLUSTER_SLICE_PACKS
 * 16-byte packs (32 KB) as the forward's, run on the backward cluster kernel (sm_90,
 * "cluster_vec16"): the slices are as even as whole packs allow, and a block takes its slice on
 * the ring kernel's 4-pack plan (TK_NORM_BWD_RING_MAX_PACKS packs per thread and tensor, a warp
 * multiple of threads, at most 512), with tk_norm_bwd_ring_bytes_per_thread of dynamic shared
 * memory a thread (a 2-stage ring of x and dy, and w' as f32: a 32 KB bf16 slice takes 192 KB,
 * an f32 one 160 KB) and at most TK_NORM_BWD_CLUSTER_STATIC_SMEM bytes of static shared memory
 * (the row sums the cluster's blocks exchange, and the barriers). */
#define TK_NORM_CLUSTER_SLICE_PACKS (TK_NORM_ROWS_MAX_THREADS * TK_NORM_FWD_PACKS)
#define TK_NORM_BWD_CLUSTER_STATIC_SMEM 2304

static inline int tk_norm_cluster_blocks(int64_t packs_row) {
    return (int)((packs_row + TK_NORM_CLUSTER_SLICE_PACKS - 1) / TK_NORM_CLUSTER_SLICE_PACKS);
}

static inline int tk_norm_cluster_slice_packs(int64_t packs_row) {
    const int blocks = tk_norm_cluster_blocks(packs_row);
    return (int)((packs_row + blocks - 1) / blocks);
}

static inline int tk_norm_bwd_cluster_threads(int64_t packs_row) {
    const int per_thread = TK_NORM_BWD_RING_MAX_PACKS;
    return ((tk_norm_cluster_slice_packs(packs_row) + per_thread - 1) / per_thread + 31) / 32 * 32;
}

/* Whether the backward cluster kernel takes a row of `cols` elements in packs of `vec` (16-byte
 * packs: 8 or 4) on a device whose blocks may opt in to `max_smem_optin` bytes: rows past the
 * ring / rows kernels' reach, within 8 slices, whose block's shared memory the device holds
 * (H100 / H200: all of them). */
static inline bool tk_norm_bwd_cluster_fit(int64_t cols, int vec, int max_smem_optin) {
    const int64_t packs_row = cols / vec;
    return vec > 1 && !tk_norm_rows_fit(cols, vec, true) && tk_norm_cluster_fit(cols, vec) &&
           (int64_t)tk_norm_bwd_cluster_threads(packs_row) *
                   tk_norm_bwd_ring_bytes_per_thread(TK_NORM_BWD_RING_MAX_PACKS, vec, true) +
               TK_NORM_BWD_CLUSTER_STATIC_SMEM <=
           max_smem_optin;
}

/* Partial-sum slots of the backward dw / db reduction for a shape: a function of the shape
 * only, so that the workspace size does not depend on the device. The launchers use at most
 * this many (fewer on a smaller GPU). About 2^22 floats (16 MiB) per reduced tensor: >= 2048
 * slots for rows of up to 2048 elements, 16 for the widest rows (262144). */
static inline int64_t tk_norm_workspace_slots(int64_t rows, int64_t cols) {
    int64_t cap = ((int64_t)1 << 22) / cols;
    if (cap < 1)
        cap = 1;
    return rows < cap ? rows : cap;
}

/* Each direction's launchers, in cuda/norm_fwd.cu and cuda/norm_bwd.cu (ops "norm" and
 * "norm_bwd"). "vec16": 16-byte packs, row in registers (the backward's 16-bit rows of a
 * whole block: staged in shared memory, the ring kernel). "cluster_vec16" (sm_90): a row split
 * over a cluster, staged in shared memory. "scalar": one element per access. "wide_vec16" /
 * "wide_scalar": a block per row, any width, the row read twice. */
cudaError_t tk_launch_norm_fwd_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_fwd_cluster_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_fwd_scalar(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_fwd_wide_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_fwd_wide_scalar(const void *call, const tk_device *dev, cudaStream_t stream);
/* Whether the device holds at least one cluster of the forward cluster kernel for this call (the
 * occupancy query at the largest slices, cached per device and cluster size); the call passed
 * tk_norm_cluster_fit. */
bool tk_norm_fwd_cluster_resident(const void *call, const tk_device *dev);
cudaError_t tk_launch_norm_bwd_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_bwd_cluster_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
/* Whether the device holds at least one cluster of the backward cluster kernel for this call
 * (the occupancy query, cached per device and block shape); the call passed
 * tk_norm_bwd_cluster_fit. */
bool tk_norm_bwd_cluster_resident(const void *call, const tk_device *dev);
cudaError_t tk_launch_norm_bwd_scalar(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_bwd_wide_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_bwd_wide_scalar(const void *call, const tk_device *dev, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
