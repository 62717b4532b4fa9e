/* Launchers of the rotary-embedding kernels (cuda/rope.cu), called by src/rope.c after
 * validation. Internal. */
#ifndef TK_CUDA_ROPE_H
#define TK_CUDA_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One call: Q then K heads, strides resolved (never both 0), rotary_dim resolved (never 0). */
typedef struct tk_rope_call {
    int dtype;                    /* tk_dtype */
    int style;                    /* tk_rope_style */
    bool backward;                /* rotate by -angle */
    bool copy_rest;               /* out of place with rotary_dim < head_dim: copy the rest */
    const void *q, *k;
    void *q_out, *k_out;
    int64_t tokens, heads_q, heads_k, head_dim, rotary_dim;
    int64_t q_strides[2], k_strides[2], q_out_strides[2], k_out_strides[2]; /* {token, head} */
    const int32_t *positions32;
    const int64_t *positions64;
    int64_t position_start;
    double log2_inv_freq_step;    /* angles from theta (cos_cache == NULL): inv_freq_i = 2^(i step),
                                     step = -2 log2(theta) / rotary_dim */
    const float *cos_cache, *sin_cache;
    int64_t cache_row_stride, max_position;
} tk_rope_call;

/* "vec16": 16-byte packs; needs 16-byte aligned tensors, strides, rotary_dim / 2 and
 * head_dim - rotary_dim in whole packs. "scalar": any element alignment. */
cudaError_t tk_launch_rope_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_rope_scalar(const void *call, const tk_device *dev, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
