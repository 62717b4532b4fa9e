/* Launchers of the GEMM kernels (cuda/gemm.cu, cuda/gemm_wgmma.cu), called by src/gemm.c after
 * validation, and the checks that say which variant can run a call. Internal. */
#ifndef TK_CUDA_GEMM_H
#define TK_CUDA_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A validated tk_gemm_params. */
typedef struct tk_gemm_call {
    int64_t m, n, k;
    int input_dtype;     /* tk_dtype: TK_F16 or TK_BF16 */
    int output_dtype;    /* tk_dtype of C, D and bias */
    int b_layout;        /* tk_gemm_b_layout */
    int activation;      /* tk_activation */
    const void *a;
    const void *b;
    const void *c;       /* NULL when beta == 0 */
    const void *bias;    /* NULL: no bias */
    void *d;
    int64_t lda, ldb, ldc, ldd;
    float alpha, beta;
} tk_gemm_call;

/* "wgmma_128x256" (cuda/gemm_wgmma.cu, sm_90a only): wgmma with TMA loads, persistent blocks of
 * two consumer warpgroups that take 64x256 output tiles in turn (the variant's name, which is
 * observable, predates that layout); B as [N, K], A and B 16-byte aligned with leading
 * dimensions multiples of 8. */
bool tk_gemm_supports_wgmma_128x256(const void *call, const tk_device *dev);
cudaError_t tk_launch_gemm_wgmma_128x256(const void *call, const tk_device *dev, cudaStream_t stream);
/* "mma_128x256": 16-byte cp.async loads of A and B, 128x256 tiles; only for calls with at least
 * one full wave of tiles on a device with enough shared memory. */
bool tk_gemm_supports_mma_128x256(const void *call, const tk_device *dev);
cudaError_t tk_launch_gemm_mma_128x256(const void *call, const tk_device *dev, cudaStream_t stream);
/* "mma_128x128": 16-byte cp.async loads, 128x128 tiles; any size. */
bool tk_gemm_supports_mma_128x128(const void *call, const tk_device *dev);
cudaError_t tk_launch_gemm_mma_128x128(const void *call, const tk_device *dev, cudaStream_t stream);
/* "mma_unaligned": 128x128 tiles loaded element by element: any alignment of A and B. */
bool tk_gemm_supports_mma_unaligned(const void *call, const tk_device *dev);
cudaError_t tk_launch_gemm_mma_unaligned(const void *call, const tk_device *dev,
                                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
