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
 * backward (8192 / 4096). */
#define TK_NORM_FWD_PACKS 4
#define TK_NORM_FWD_ELEMS_SCALAR 8
#define TK_NORM_BWD_ELEMS_VEC 16
#define TK_NORM_BWD_ELEMS_SCALAR 8
#define TK_NORM_ROWS_MAX_THREADS 512

/* The widest row the "rows" kernels hold on one block, accessed in packs of `vec` elements. */
static inline int64_t tk_norm_rows_max_cols(int vec, bool backward) {
    if (backward)
        return TK_NORM_ROWS_MAX_THREADS * (vec > 1 ? TK_NORM_BWD_ELEMS_VEC : TK_NORM_BWD_ELEMS_SCALAR);
    return TK_NORM_ROWS_MAX_THREADS * (vec > 1 ? TK_NORM_FWD_PACKS * vec : TK_NORM_FWD_ELEMS_SCALAR);
}

/* Whether a row of `cols` elements, accessed in packs of `vec` elements, fits the registers of
 * the "rows" kernels (the "vec16" and "scalar" variants); wider rows take the "cluster" or the
 * "wide" ones. */
static inline bool tk_norm_rows_fit(int64_t cols, int vec, bool backward) {
    return cols <= tk_norm_rows_max_cols(vec, backward);
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
 * "norm_bwd"). "vec16": 16-byte packs, row in registers. "cluster_vec16" (forward only): a row
 * split over a cluster, staged in shared memory. "scalar": one element per access. "wide_vec16" /
 * "wide_scalar": a block per row, any width, the row read twice. */
cudaError_t tk_launch_norm_fwd_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_fwd_cluster_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_fwd_scalar(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_fwd_wide_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_fwd_wide_scalar(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_bwd_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_bwd_scalar(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_bwd_wide_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_norm_bwd_wide_scalar(const void *call, const tk_device *dev, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
