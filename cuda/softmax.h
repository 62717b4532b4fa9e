/* Launchers of the softmax kernels (cuda/softmax.cu), called by src/softmax.c after validation.
 * Internal. */
#ifndef TK_CUDA_SOFTMAX_H
#define TK_CUDA_SOFTMAX_H

#include <stdbool.h>
#include <stdint.h>

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward: in = x (in_stride), out = y (out_stride). Backward: in = y and dy (both in_stride),
 * out = dx (out_stride). Strides are resolved (never 0). causal_period is resolved (> 0). */
typedef struct tk_softmax_call {
    int dtype;            /* tk_dtype */
    bool backward;
    bool log;
    bool causal;
    const void *in;
    const void *dy;       /* backward only */
    void *out;
    int64_t rows, cols, in_stride, out_stride;
    int64_t causal_offset, causal_period;
    float scale;
} tk_softmax_call;

/* Widest row (elements) that the "_regs" launchers hold in registers, for this dtype (element
 * size in bytes) and direction; src/softmax.c uses it in the variants' supports(). */
int64_t tk_softmax_regs_max_cols(int elem_bytes, bool wide, bool backward);

/* Whether "vec16_pipelined" takes a row of `cols` elements of elem_bytes each (rows whose whole
 * 16-byte packs hold 64 to 512 KB, where the forward measured faster than "vec16_regs" and
 * "vec16_stream"), in either direction. */
bool tk_softmax_pipelined_fits(int elem_bytes, int64_t cols);

/* "vec16_pipelined" (forward and backward, cc >= 9.0): long rows streamed with the two passes
 * interleaved, a row split over a thread-block cluster in slices that keep at most 128 KB in L2
 * for the second pass. */
cudaError_t tk_launch_softmax_vec16_pipelined(const void *call, const tk_device *dev, cudaStream_t stream);
/* "vec16_regs" / "scalar_regs": a row in registers (cols <= tk_softmax_regs_max_cols). */
cudaError_t tk_launch_softmax_vec16_regs(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_softmax_scalar_regs(const void *call, const tk_device *dev, cudaStream_t stream);
/* "vec16_stream" / "scalar_stream": any width, two passes over the row. */
cudaError_t tk_launch_softmax_vec16_stream(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_softmax_scalar_stream(const void *call, const tk_device *dev, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
