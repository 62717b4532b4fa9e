/* Launchers of the activation and GLU kernels (cuda/activation.cu), called by src/activation.c
 * after validation. Internal. */
#ifndef TK_CUDA_ACTIVATION_H
#define TK_CUDA_ACTIVATION_H

#include <stdbool.h>
#include <stdint.h>

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[r, c] = f(x[r, c] + bias[c])  or, backward, dy[r, c] * f'(x[r, c] + bias[c]).
 * Rows are dense (row stride = cols); calls without a bias arrive flattened to one row. */
typedef struct tk_activation_call {
    int kind;          /* tk_activation */
    int dtype;         /* tk_dtype */
    bool backward;
    const void *x;
    const void *dy;    /* backward only */
    const void *bias;  /* NULL: no bias */
    void *out;
    int64_t rows, cols;
} tk_activation_call;

/* Gated units over rows of [gate | up] (or interleaved) pairs; see tk_glu_params. Strides are
 * resolved (never 0). Backward reads dy (y layout) and x, writes dx (x layout) into out. */
typedef struct tk_glu_call {
    int kind;          /* tk_glu */
    int dtype;         /* tk_dtype */
    int layout;        /* tk_glu_layout */
    bool backward;
    const void *x;
    const void *dy;
    void *out;
    int64_t rows, d, x_row_stride, y_row_stride;
    float alpha, limit;
} tk_glu_call;

/* "vec16": 16-byte accesses; needs every row start of every tensor 16-byte aligned. */
cudaError_t tk_launch_activation_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
/* "scalar": one element per access; any alignment. */
cudaError_t tk_launch_activation_scalar(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_glu_vec16(const void *call, const tk_device *dev, cudaStream_t stream);
cudaError_t tk_launch_glu_scalar(const void *call, const tk_device *dev, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
