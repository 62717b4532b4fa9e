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
 *   of f16 / bf16 (unroll_for). Little's law at ~4 TB/s and ~1 us of latency asks for ~32 KB
 *   in flight per SM; 16 elements per thread keep the 2-byte kernels near 60 registers, so 4
 *   blocks of 256 threads are resident: 32-64 KB in flight. Holding 32 bf16 elements per thread
 *   instead (4 packs) took ~115 registers, 2 blocks per SM, and measured 0.62-0.74 of the copy
 *   bandwidth for the transcendental kinds on an H200: the erf / exp work of one thread then
 *   runs with too few other warps to hide the next loads.
 * - A persistent grid (one wave at the occupancy limit) walks the flattened tensor; each thread
 *   loads its next step's packs before computing the current step (software pipelining), so
 *   memory and math overlap within every warp. Without this, measured on an H200, the
 *   exp/erf kinds in bf16 reached only 0.57-0.77 of the copy bandwidth: their math takes
 *   about as long as a load, and warps that all load, then all compute, leave the memory
 *   system idle half the time.
 * - The bias column of each pack is tracked incrementally (the grid step modulo the row length),
 *   no division per element. Calls without a bias arrive as one long row, so odd sizes only
 *   leave a short scalar tail.
 * The "scalar" variant is the same kernel with packs of one element: for pointers that are not
 * 16-byte aligned (e.g. a tensor offset by 2 bytes), correct and slower.
 */
#include "activation.h"
#include "activation_math.cuh"
#include "common.cuh"

namespace {

constexpr int MAX_THREADS = 256;

/* Packs per thread per input: 16 elements. */
__host__ __device__ constexpr int unroll_for(int vec) { return vec == 1 ? 4 : 16 / vec; }

/* Fast: the result is rounded to a 16-bit type (see activation_math.cuh). */
template <int Kind, bool Backward, bool Fast>
__device__ __forceinline__ float activation_element(float x, float dy) {
    if constexpr (Backward)
        return dy * tk_act_derivative<Kind, Fast>(x);
    else
        return tk_act_apply<Kind, Fast>(x);
}

/* The packs one thread works on in one step: UNROLL packs, blockDim.x packs apart. */
template <typename T, int Vec, int UNROLL> struct activation_step {
    tk_pack<T, Vec> x[UNROLL], dy[UNROLL], bias[UNROLL];
    int64_t col[UNROLL]; /* pack index within the row, for the bias */
};

template <typename T, int Vec, int UNROLL, bool Backward>
__device__ __forceinline__ void load_step(const tk_activation_call &a, int64_t first, int64_t packs,
                                          activation_step<T, Vec, UNROLL> &s) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int64_t p = first + (int64_t)u * blockDim.x;
        if (p < packs) {
            s.x[u] = tk_load_pack<T, Vec>(static_cast<const T *>(a.x) + p * Vec);
            if constexpr (Backward)
                s.dy[u] = tk_load_pack<T, Vec>(static_cast<const T *>(a.dy) + p * Vec);
            if (a.bias)
                s.bias[u] = tk_load_pack<T, Vec>(static_cast<const T *>(a.bias) + s.col[u] * Vec);
        }
    }
}

/* Minimum resident blocks per SM promised to ptxas: 0 (no promise) except for GELU-erf on 16-bit
 * types, which with no promise ptxas squeezed to 48 registers and spilled 8 bytes on sm_80 and
 * sm_90a. Promising 1 for every kind instead cost 0.1 of the copy bandwidth on the H200 (the
 * cheap kinds then take more registers and fewer blocks fit). */
template <typename T, int Kind> constexpr int min_blocks_hint() {
    return (Kind == TK_ACT_GELU_ERF && sizeof(T) == 2) ? 1 : 0;
}

template <typename T, int Kind, int Vec, bool Backward>
__global__ void __launch_bounds__(MAX_THREADS, (min_blocks_hint<T, Kind>())) activation_kernel(tk_activation_call a) {
    constexpr int UNROLL = unroll_for(Vec);
    T *out = static_cast<T *>(a.out);
    /* Whole packs of the flattened tensor (multi-row calls of this kernel have cols % Vec == 0,
     * so packs never straddle rows). */
    const int64_t n = a.rows * a.cols, packs = n / Vec, packs_per_row = a.cols / Vec;
    const int64_t grid_step = (int64_t)gridDim.x * blockDim.x * UNROLL;
    const int64_t col_step = grid_step % packs_per_row;
    int64_t first = (int64_t)blockIdx.x * blockDim.x * UNROLL + threadIdx.x;

    activation_step<T, Vec, UNROLL> cur, next;
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
        cur.col[u] = (first + (int64_t)u * blockDim.x) % packs_per_row;
    load_step<T, Vec, UNROLL, Backward>(a, first, packs, cur);
    for (; first < packs; first += grid_step) {
        /* Issue the next step's loads before this step's math: the loads are then in flight
         * while the exponentials run, instead of every warp of an SM alternating between a
         * load phase and a math phase. */
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            next.col[u] = cur.col[u] + col_step;
            if (next.col[u] >= packs_per_row)
                next.col[u] -= packs_per_row;
        }
        load_step<T, Vec, UNROLL, Backward>(a, first + grid_step, packs, next);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t p = first + (int64_t)u * blockDim.x;
            if (p < packs) {
                tk_pack<T, Vec> r;
#pragma unroll
                for (int e = 0; e < Vec; e++) {
                    const float v = tk_to_float(cur.x[u].v[e]) + (a.bias ? tk_to_float(cur.bias[u].v[e]) : 0.0f);
                    const float g = Backward ? tk_to_float(cur.dy[u].v[e]) : 0.0f;
                    r.v[e] = tk_from_float<T>(activation_element<Kind, Backward, sizeof(T) == 2>(v, g));
                }
                tk_store_pack<T, Vec>(out + p * Vec, r);
            }
        }
        cur = next;
    }
    /* Elements past the last whole pack: only one-row calls have them, so the column is the
     * element index. */
    if (blockIdx.x == 0) {
        const T *x = static_cast<const T *>(a.x), *dy = static_cast<const T *>(a.dy);
        const T *bias = static_cast<const T *>(a.bias);
        for (int64_t i = packs * Vec + threadIdx.x; i < n; i += blockDim.x) {
            const float v = tk_to_float(x[i]) + (bias ? tk_to_float(bias[i]) : 0.0f);
            const float g = Backward ? tk_to_float(dy[i]) : 0.0f;
            out[i] = tk_from_float<T>(activation_element<Kind, Backward, sizeof(T) == 2>(v, g));
        }
    }
}

/* A persistent grid: one wave at the occupancy limit (or fewer blocks for small tensors), each
 * block striding over the tensor, so every thread runs the software pipeline above many times. */
template <typename T, int Kind, int Vec, bool Backward>
cudaError_t launch(const tk_activation_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr auto kernel = activation_kernel<T, Kind, Vec, Backward>;
    const int64_t packs_per_block = (int64_t)MAX_THREADS * unroll_for(Vec);
    const int64_t blocks_needed = (a->rows * a->cols / Vec + packs_per_block - 1) / packs_per_block;
    const int64_t wave = tk_wave_blocks<kernel>(dev, MAX_THREADS, 0);
    const int64_t blocks = blocks_needed < 1 ? 1 : (blocks_needed < wave ? blocks_needed : wave);
    kernel<<<(unsigned)blocks, MAX_THREADS, 0, stream>>>(*a);
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
