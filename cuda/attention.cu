/* Attention forward: the launchers of the "mma_sm80" and "mma_sm80_packed" variants pick the
 * instantiation for the call's head dim (cuda/attention_d64.cu, _d80.cu, _d96.cu, _d128.cu,
 * _d256.cu; the kernel is in attention.cuh) and the number of query heads per CTA. */
#include "attention.h"

namespace {

cudaError_t launch_head_dim(const tk_attention_call *c, int heads_per_tile, const tk_device *dev,
                            cudaStream_t stream) {
    switch (c->head_dim) {
    case 64: return tk_attention_launch_mma_d64(c, heads_per_tile, dev, stream);
    case 80: return tk_attention_launch_mma_d80(c, heads_per_tile, dev, stream);
    case 96: return tk_attention_launch_mma_d96(c, heads_per_tile, dev, stream);
    case 128: return tk_attention_launch_mma_d128(c, heads_per_tile, dev, stream);
    case 256: return tk_attention_launch_mma_d256(c, heads_per_tile, dev, stream);
    }
    return cudaErrorInvalidValue; /* src/attention.c admits only the head dims above */
}

} // namespace

extern "C" cudaError_t tk_attention_launch_mma(const void *call, const tk_device *dev,
                                               cudaStream_t stream) {
    return launch_head_dim(static_cast<const tk_attention_call *>(call), 1, dev, stream);
}

extern "C" bool tk_attention_supports_packed(const void *call, const tk_device *) {
    const tk_attention_call *c = static_cast<const tk_attention_call *>(call);
    return (c->heads_q / c->heads_kv) % 2 == 0 && c->window_left >= 0 && c->window_right >= 0;
}

/* With a window of W keys a CTA of P positions visits about (W + P) / BN key tiles, of which
 * those meeting the window's two edges are partly masked: 4 heads of 32 positions (2 of 64
 * when the group is not a multiple of 4) instead of one head of 128 cut that waste. */
extern "C" cudaError_t tk_attention_launch_mma_packed(const void *call, const tk_device *dev,
                                                      cudaStream_t stream) {
    const tk_attention_call *c = static_cast<const tk_attention_call *>(call);
    const int group = c->heads_q / c->heads_kv;
    return launch_head_dim(c, group % 4 == 0 ? 4 : 2, dev, stream);
}
