/* Launchers of the attention backward kernels (cuda/attention_bwd*.cu), called by src/attention.c
 * after validation. Internal. */
#ifndef TK_CUDA_ATTENTION_BWD_H
#define TK_CUDA_ATTENTION_BWD_H

#include <stddef.h>
#include <stdint.h>

#include "attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One backward call, resolved: the forward's call (q, k, v, o, masks, scale; its lse is the
 * forward's output read here) plus the gradient tensors and the workspace. */
typedef struct tk_attention_bwd_call {
    tk_attention_call fwd;
    const void *dout;
    void *dq, *dk, *dv;
    int64_t do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3]; /* batch, sequence, head */
    float *workspace; /* tk_attention_bwd_workspace_bytes(fwd) bytes, 16-byte aligned */
    float *dsinks;    /* [heads_q], written when fwd.sinks is set */
    int deterministic; /* 1: dQ's atomic adds in a fixed order */
} tk_attention_bwd_call;

/* Workspace of a call: D = rowsum(dO o O), [batch, heads_q, seqlen_q] f32, then at the next
 * 128-byte boundary (the size reserves the gap) the f32 dQ accumulator, [batch, heads_q,
 * seqlen_q rounded up to 16, head_dim] in the mma fragments' order (attention_bwd.cu), and when
 * deterministic the order of the dQ adds (a ticket counter and one semaphore per 32 query rows
 * of each batch and query head), each starting 16-byte aligned. */
size_t tk_attention_bwd_workspace_bytes(const tk_attention_call *c, int deterministic);

/* "wgmma_sm90": FlashAttention-3's backward on Hopper (cuda/attention_bwd_sm90.cu): TMA, a
 * producer warpgroup and two consumer warpgroups of 64 keys each, wgmma for the five products,
 * dQ handed by each consumer warpgroup to a writer warp through shared memory, which adds it into
 * the accumulator by bulk reductions (with deterministic, in key-tile order per query tile); head
 * dims 64 and 128 (softcap at 128 only), cc 9.0 devices with an sm_90a build. */
bool tk_attention_bwd_supports_sm90(const void *call, const tk_device *dev);
cudaError_t tk_attention_bwd_launch_sm90(const void *call, const tk_device *dev, cudaStream_t stream);

/* "mma_sm80_bn128": FlashAttention-2 backward, ldmatrix + mma.sync m16n8k16, one CTA of 8 warps
 * per 128 keys, dQ by f32 atomics (with deterministic, in key-tile order per query tile); runs
 * where the device's shared memory per block holds its tiles (not D 80 or 128 on sm_86 / sm_89). */
bool tk_attention_bwd_supports_bn128(const void *call, const tk_device *dev);
cudaError_t tk_attention_bwd_launch_mma_bn128(const void *call, const tk_device *dev, cudaStream_t stream);

/* "mma_sm80_d256": the same kernel at head dim 256, one CTA of 8 warps per 64 keys, two warps per
 * 16 keys, each owning half of their dK and dV columns; runs where the device's shared memory per
 * block holds its 143 KB (sm_80, sm_90; not sm_86 / sm_89). */
bool tk_attention_bwd_supports_d256(const void *call, const tk_device *dev);
cudaError_t tk_attention_bwd_launch_mma_d256(const void *call, const tk_device *dev, cudaStream_t stream);

/* "mma_sm80": the same kernel with 4 warps per 64 keys; every call at head dims 64, 80, 96 and
 * 128. */
bool tk_attention_bwd_supports_mma(const void *call, const tk_device *dev);
cudaError_t tk_attention_bwd_launch_mma(const void *call, const tk_device *dev, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
