/* Attention forward: the "mma_sm80" variant's launcher picks the instantiation for the call's
 * head dim (cuda/attention_d64.cu, _d128.cu, _d256.cu; the kernel is in attention.cuh). */
#include "attention.h"

extern "C" cudaError_t tk_attention_launch_mma(const void *call, const tk_device *dev,
                                               cudaStream_t stream) {
    const tk_attention_call *c = static_cast<const tk_attention_call *>(call);
    switch (c->head_dim) {
    case 64: return tk_attention_launch_mma_d64(c, dev, stream);
    case 128: return tk_attention_launch_mma_d128(c, dev, stream);
    case 256: return tk_attention_launch_mma_d256(c, dev, stream);
    }
    return cudaErrorInvalidValue; /* src/attention.c admits only the head dims above */
}
