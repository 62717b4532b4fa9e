/* What the experiment drivers share: CHECK(call) stops the program with the file, line, call and
 * CUDA error when a runtime call fails (an experiment has nothing to recover), the timing loop
 * and the bf16 error check of the GEMM drivers. */
#ifndef TK_EXPERIMENT_H
#define TK_EXPERIMENT_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <vector>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* Median time of f over `reps` calls, after `warmups` untimed ones; `flush` (at least the L2's
 * size) is overwritten before every call, so that each one starts with a cold L2, as in tkbench. */
static inline float experiment_time_ms(const std::function<cudaError_t()> &f, int warmups, int reps, void *flush,
                                       size_t flush_bytes) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < warmups + reps; r++) {
        CHECK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
        CHECK(cudaEventRecord(e0));
        CHECK(f());
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= warmups)
            t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return t[t.size() / 2];
}

/* err[0] = max |d - ref|, err[1] = max |ref| over n bf16 values (err zeroed by the caller;
 * non-negative floats compare as integers). */
static __global__ void experiment_max_error_bf16(const __nv_bfloat16 *d, const __nv_bfloat16 *ref, size_t n,
                                                 unsigned *err) {
    float diff = 0.0f, mag = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float r = __bfloat162float(ref[i]);
        diff = fmaxf(diff, fabsf(__bfloat162float(d[i]) - r));
        mag = fmaxf(mag, fabsf(r));
    }
    atomicMax(&err[0], __float_as_uint(diff));
    atomicMax(&err[1], __float_as_uint(mag));
}

#endif
