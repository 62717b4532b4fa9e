/* Launcher of the attention forward kernels (cuda/attention*.cu), called by src/attention.c
 * after validation. Internal. */
#ifndef TK_CUDA_ATTENTION_H
#define TK_CUDA_ATTENTION_H

#include <stdint.h>

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One attention call, resolved: strides are explicit, the scale is set, causal is folded into
 * window_right = 0 and windows that cover everything are -1. Every index fits in int32 except
 * the element offsets, which kernels compute in int64. */
typedef struct tk_attention_call {
    int dtype;                    /* tk_dtype: TK_F16 or TK_BF16 */
    int head_dim;                 /* 64, 80, 96, 128 or 256 */
    const void *q, *k, *v;
    void *o;
    float *lse;                   /* NULL: not written */
    const float *alibi_slopes;    /* NULL: no ALiBi */
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3]; /* batch, sequence, head */
    int window_left, window_right; /* -1 = unbounded */
    float scale;                  /* softmax scale, > 0 */
    float softcap;                /* 0 = off */
    const float *sinks;           /* NULL: no sinks */
    int chunk;                    /* chunk_size, 0 = off (also when one chunk holds every key) */
    int prefix;                   /* prefix_len, 0 = off */
    const int *doc_ids;           /* document_ids [batch, seqlen_k], NULL = off */
} tk_attention_call;

/* "wgmma_sm90": FlashAttention-3 style on sm_90a (TMA, mbarrier ring, a producer warp and two
 * consumer warpgroups, wgmma with P from registers): head dim 128, every mask and option;
 * cuda/attention_sm90.cu. */
bool tk_attention_supports_sm90(const void *call, const tk_device *dev);
cudaError_t tk_attention_launch_sm90(const void *call, const tk_device *dev, cudaStream_t stream);
/* "wgmma_sm90_persistent": the same kernel with one CTA per SM striding over the work tiles, the
 * next tile's Q and K/V loading while the current one finishes. */
bool tk_attention_supports_sm90_persistent(const void *call, const tk_device *dev);
cudaError_t tk_attention_launch_sm90_persistent(const void *call, const tk_device *dev, cudaStream_t stream);
/* "wgmma_sm90_wide": the same kernel with 192 query rows on three consumer warpgroups; head dim
 * 64, every mask. */
bool tk_attention_supports_sm90_wide(const void *call, const tk_device *dev);
cudaError_t tk_attention_launch_sm90_wide(const void *call, const tk_device *dev, cudaStream_t stream);

/* "mma_sm80": FlashAttention-2 style, ldmatrix + mma.sync m16n8k16, cp.async double buffer.
 * Any sm_80+ device; one query head per CTA. */
cudaError_t tk_attention_launch_mma(const void *call, const tk_device *dev, cudaStream_t stream);

/* "mma_sm80_packed": the same kernel with the CTA's rows split over 2 or 4 query heads of one
 * GQA group (fewer positions per CTA, the same K/V tiles), for calls bounded on both sides by
 * a window, where the CTA's key band is short and its edges cost: heads_q / heads_kv even and
 * window_left, window_right >= 0. */
bool tk_attention_supports_packed(const void *call, const tk_device *dev);
cudaError_t tk_attention_launch_mma_packed(const void *call, const tk_device *dev,
                                           cudaStream_t stream);

/* The kernel of one head dim (cuda/attention_d<N>.cu, compiled in parallel), heads_per_tile
 * query heads per CTA (1, 2 or 4, dividing heads_q / heads_kv). */
cudaError_t tk_attention_launch_mma_d64(const tk_attention_call *c, int heads_per_tile,
                                        const tk_device *dev, cudaStream_t stream);
cudaError_t tk_attention_launch_mma_d80(const tk_attention_call *c, int heads_per_tile,
                                        const tk_device *dev, cudaStream_t stream);
cudaError_t tk_attention_launch_mma_d96(const tk_attention_call *c, int heads_per_tile,
                                        const tk_device *dev, cudaStream_t stream);
cudaError_t tk_attention_launch_mma_d128(const tk_attention_call *c, int heads_per_tile,
                                         const tk_device *dev, cudaStream_t stream);
cudaError_t tk_attention_launch_mma_d256(const tk_attention_call *c, int heads_per_tile,
                                         const tk_device *dev, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
