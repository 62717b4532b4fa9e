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
 *   of f16 / bf16 (unroll_for), so several 16-byte loads per thread are in flight at once.
 * - One block per chunk of 256 threads x 16 elements of a row (tk_row_chunk_shape), not a
 *   persistent grid: with ~30-50 registers per thread up to 8 blocks share an SM, and while some
 *   compute, others load and others store, so the memory system never idles (a persistent,
 *   software-pipelined grid was slower: docs/kernels/activation.md).
 * - Calls without a bias arrive as one long row; with a bias, the chunk of a row gives each
 *   pack's bias column directly, with no division. Odd sizes leave a short scalar tail.
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

/* Blocks per SM promised to ptxas, which caps the registers at 65536 / (256 x blocks): 16-bit
 * forward kernels fit 40 (6 blocks, 1536 threads per SM), f32 forward 48 (5), backward ones,
 * with dy's packs too, 64 (4); tighter caps spill. Without a promise ptxas picked caps of its
 * own that spilled a few bytes in some kernels. */
template <typename T, bool Backward> constexpr int min_blocks() {
    return Backward ? 4 : (sizeof(T) == 2 ? 6 : 5);
}

/* Block (blockIdx.x, blockIdx.y) handles chunk blockIdx.x of rows blockIdx.y, blockIdx.y +
 * gridDim.y, ...: UNROLL packs per thread, blockDim.x packs apart, all loaded before the first
 * is used. */
template <typename T, int Kind, int Vec, bool Backward, bool HasBias>
__global__ void __launch_bounds__(MAX_THREADS, (min_blocks<T, Backward>())) activation_kernel(tk_activation_call a) {
    constexpr int UNROLL = unroll_for(Vec);
    const T *x = static_cast<const T *>(a.x), *dy = static_cast<const T *>(a.dy);
    const T *bias = static_cast<const T *>(a.bias);
    T *out = static_cast<T *>(a.out);
    const int64_t packs_per_row = a.cols / Vec;
    const int64_t first_pack = (int64_t)blockIdx.x * blockDim.x * UNROLL + threadIdx.x;
    /* This thread's packs are first_pack + u * blockDim.x for u * blockDim.x < packs_left: the
     * row pointers advance once per row, the per-pack offsets stay 32-bit. */
    const int64_t packs_left = packs_per_row - first_pack;
    const T *bias_p = HasBias ? bias + first_pack * Vec : nullptr;

    for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
        const int64_t row_start = row * a.cols;
        const int64_t offset = row_start + first_pack * Vec;
        tk_pack<T, Vec> xs[UNROLL], dys[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int k = u * (int)blockDim.x;
            if (k < packs_left) {
                xs[u] = tk_load_pack<T, Vec>(x + offset + k * Vec);
                if constexpr (Backward)
                    dys[u] = tk_load_pack<T, Vec>(dy + offset + k * Vec);
            }
        }
        /* Convert each pack where it is used, not all at once (32 live f32 values for bf16). */
        keep_packed(xs);
        if constexpr (Backward)
            keep_packed(dys);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int k = u * (int)blockDim.x;
            if (k < packs_left) {
                /* The bias row is small and stays in L1 / L2: it is loaded at its use. */
                float v[Vec], b[Vec], g[Vec];
                tk_unpack(xs[u], v);
                if constexpr (HasBias)
                    tk_unpack(tk_load_pack<T, Vec>(bias_p + k * Vec), b);
                if constexpr (Backward)
                    tk_unpack(dys[u], g);
                tk_pack<T, Vec> r;
#pragma unroll
                for (int e = 0; e < Vec; e++)
                    r.v[e] = tk_from_float<T>(activation_element<Kind, Backward, sizeof(T) == 2>(
                        HasBias ? v[e] + b[e] : v[e], Backward ? g[e] : 0.0f));
                tk_store_pack<T, Vec>(out + offset + k * Vec, r);
            }
        }
        /* Columns past the last whole pack: only one-row calls have them (multi-row calls with
         * a partial last pack take the scalar variant). */
        if (blockIdx.x == 0) {
            for (int64_t j = packs_per_row * Vec + threadIdx.x; j < a.cols; j += blockDim.x) {
                const float v = tk_to_float(x[row_start + j]) + (HasBias ? tk_to_float(bias[j]) : 0.0f);
                const float g = Backward ? tk_to_float(dy[row_start + j]) : 0.0f;
                out[row_start + j] = tk_from_float<T>(activation_element<Kind, Backward, sizeof(T) == 2>(v, g));
            }
        }
    }
}

/* The bias is a template parameter: the no-bias kernels then carry no bias registers or adds
 * (4 of the ~20 instructions per element of a bf16 GELU). */
template <typename T, int Kind, int Vec, bool Backward>
cudaError_t launch(const tk_activation_call *a, const tk_device *dev, cudaStream_t stream) {
    (void)dev;
    const tk_row_chunks shape = tk_row_chunk_shape(a->rows, a->cols / Vec, unroll_for(Vec), MAX_THREADS);
    return tk_launch(a->bias ? activation_kernel<T, Kind, Vec, Backward, true>
                             : activation_kernel<T, Kind, Vec, Backward, false>,
                     shape.grid, shape.threads, 0, stream, *a);
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
    return tk_dispatch_dtype(a->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        constexpr int Vec = tk_pack_width<T>(Wide);
        return a->backward ? launch_kind<T, Vec, true>(a, dev, stream) : launch_kind<T, Vec, false>(a, dev, stream);
    });
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
