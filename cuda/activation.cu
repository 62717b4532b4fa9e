/*
 * Elementwise activations, forward and backward, with an optional per-column bias:
 *
 *     forward   out[r, c] = f(x[r, c] + bias[c])
 *     backward  out[r, c] = dy[r, c] * f'(x[r, c] + bias[c])
 *
 * f and f' are in activation_math.cuh (shared with the GEMM epilogue); arithmetic is f32.
 *
 * Why it is fast: the op does ~10-30 flops per element and moves 2 (forward) or 3 (backward)
 * elements through memory, so it is memory-bound and the aim is the copy bandwidth.
 * - Every access is a 16-byte pack (8 bf16 / 8 f16 / 4 f32), consecutive lanes touch
 *   consecutive packs: each warp instruction moves 512 contiguous bytes.
 * - Each thread loads 16 elements per input before their first use: 4 packs of f32 or 2 packs
 *   of f16 / bf16 (unroll_for<T>). Little's law at ~4 TB/s and ~1 us of latency asks for ~32 KB
 *   in flight per SM; 16 elements per thread keep the 2-byte kernels near 60 registers, so 4
 *   blocks of 256 threads are resident: 32-64 KB in flight. Holding 32 bf16 elements per thread
 *   instead (4 packs) took ~115 registers, 2 blocks per SM, and measured 0.62-0.74 of the copy
 *   bandwidth for the transcendental kinds on an H200: the erf / exp work of one thread then
 *   runs with too few other warps to hide the next loads.
 * - Rows are split into chunks of threads x UNROLL packs (tk_row_chunk_shape in common.cuh):
 *   no division per element, the bias pack of a column is read once per pack of x.
 * - Calls without a bias arrive as one long row, so odd sizes only leave a short scalar tail.
 * The "scalar" variant is the same kernel with packs of one element: for pointers that are not
 * 16-byte aligned (e.g. a tensor offset by 2 bytes), correct and slower.
 */
#include "activation.h"
#include "activation_math.cuh"
#include "common.cuh"

namespace {

constexpr int MAX_THREADS = 256;

/* Packs per thread per input: 16 elements. */
template <typename T, int Vec> __host__ __device__ constexpr int unroll_for() { return Vec == 1 ? 4 : 16 / Vec; }

template <int Kind, bool Backward>
__device__ __forceinline__ float activation_element(float x, float dy) {
    if constexpr (Backward)
        return dy * tk_act_derivative<Kind>(x);
    else
        return tk_act_apply<Kind>(x);
}

template <typename T, int Kind, int Vec, bool Backward>
__global__ void __launch_bounds__(MAX_THREADS) activation_kernel(tk_activation_call a) {
    const T *x = static_cast<const T *>(a.x);
    const T *dy = static_cast<const T *>(a.dy);
    const T *bias = static_cast<const T *>(a.bias);
    T *out = static_cast<T *>(a.out);
    constexpr int UNROLL = unroll_for<T, Vec>();
    const int64_t packs_per_row = a.cols / Vec;
    const int64_t first_pack = (int64_t)blockIdx.x * blockDim.x * UNROLL + threadIdx.x;

    for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
        const int64_t row_base = row * a.cols;
        tk_pack<T, Vec> xs[UNROLL], dys[UNROLL], bs[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t j = first_pack + (int64_t)u * blockDim.x;
            if (j < packs_per_row) {
                xs[u] = tk_load_pack<T, Vec>(x + row_base + j * Vec);
                if constexpr (Backward)
                    dys[u] = tk_load_pack<T, Vec>(dy + row_base + j * Vec);
                if (bias)
                    bs[u] = tk_load_pack<T, Vec>(bias + j * Vec);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t j = first_pack + (int64_t)u * blockDim.x;
            if (j < packs_per_row) {
                tk_pack<T, Vec> r;
#pragma unroll
                for (int e = 0; e < Vec; e++) {
                    const float v = tk_to_float(xs[u].v[e]) + (bias ? tk_to_float(bs[u].v[e]) : 0.0f);
                    const float g = Backward ? tk_to_float(dys[u].v[e]) : 0.0f;
                    r.v[e] = tk_from_float<T>(activation_element<Kind, Backward>(v, g));
                }
                tk_store_pack<T, Vec>(out + row_base + j * Vec, r);
            }
        }
        /* Elements past the last whole pack of the row (only a one-row call can have them:
         * multi-row calls with a partial last pack run the scalar variant). */
        if (blockIdx.x == 0) {
            for (int64_t c = packs_per_row * Vec + threadIdx.x; c < a.cols; c += blockDim.x) {
                const float v = tk_to_float(x[row_base + c]) + (bias ? tk_to_float(bias[c]) : 0.0f);
                const float g = Backward ? tk_to_float(dy[row_base + c]) : 0.0f;
                out[row_base + c] = tk_from_float<T>(activation_element<Kind, Backward>(v, g));
            }
        }
    }
}

template <typename T, int Kind, int Vec, bool Backward>
cudaError_t launch(const tk_activation_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr auto kernel = activation_kernel<T, Kind, Vec, Backward>;
    const tk_row_chunks shape =
        tk_row_chunk_shape<kernel>(dev, a->rows, a->cols / Vec, unroll_for<T, Vec>(), MAX_THREADS);
    kernel<<<shape.grid, shape.threads, 0, stream>>>(*a);
    return cudaGetLastError();
}

template <typename T, int Vec, bool Backward>
cudaError_t launch_kind(const tk_activation_call *a, const tk_device *dev, cudaStream_t stream) {
    switch (a->kind) {
    case TK_ACT_NONE: return launch<T, TK_ACT_NONE, Vec, Backward>(a, dev, stream);
    case TK_ACT_GELU_ERF: return launch<T, TK_ACT_GELU_ERF, Vec, Backward>(a, dev, stream);
    case TK_ACT_GELU_TANH: return launch<T, TK_ACT_GELU_TANH, Vec, Backward>(a, dev, stream);
    case TK_ACT_QUICK_GELU: return launch<T, TK_ACT_QUICK_GELU, Vec, Backward>(a, dev, stream);
    case TK_ACT_SILU: return launch<T, TK_ACT_SILU, Vec, Backward>(a, dev, stream);
    case TK_ACT_RELU: return launch<T, TK_ACT_RELU, Vec, Backward>(a, dev, stream);
    case TK_ACT_RELU_SQUARED: return launch<T, TK_ACT_RELU_SQUARED, Vec, Backward>(a, dev, stream);
    }
    return cudaErrorInvalidValue;
}

/* Packs of 16 bytes (Wide) or single elements. */
template <bool Wide>
cudaError_t launch_dtype(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_activation_call *a = static_cast<const tk_activation_call *>(call);
    switch (a->dtype) {
    case TK_F32:
        return a->backward ? launch_kind<float, Wide ? 4 : 1, true>(a, dev, stream)
                           : launch_kind<float, Wide ? 4 : 1, false>(a, dev, stream);
    case TK_F16:
        return a->backward ? launch_kind<__half, Wide ? 8 : 1, true>(a, dev, stream)
                           : launch_kind<__half, Wide ? 8 : 1, false>(a, dev, stream);
    case TK_BF16:
        return a->backward ? launch_kind<__nv_bfloat16, Wide ? 8 : 1, true>(a, dev, stream)
                           : launch_kind<__nv_bfloat16, Wide ? 8 : 1, false>(a, dev, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace

extern "C" cudaError_t tk_launch_activation_vec16(const void *call, const tk_device *dev,
                                                  cudaStream_t stream) {
    return launch_dtype<true>(call, dev, stream);
}

extern "C" cudaError_t tk_launch_activation_scalar(const void *call, const tk_device *dev,
                                                   cudaStream_t stream) {
    return launch_dtype<false>(call, dev, stream);
}
