/*
 * Gated linear units, forward and backward. An input row holds 2 * d values: d gates g and d
 * "up" values u, either as two halves ([g | u] or [u | g]) or interleaved (g0 u0 g1 u1 ...,
 * GPT-OSS). The output row holds d values:
 *
 *     SwiGLU   y = silu(g) u          dg = dy u silu'(g)      du = dy silu(g)
 *     GeGLU    y = gelu(g) u          (erf or tanh GELU; derivatives as in activation_math.cuh)
 *     ReGLU    y = relu(g) u
 *     clamped  gc = min(g, L), uc = clamp(u, -L, L), s = sigmoid(a gc)
 *              y  = gc s (uc + 1)
 *              dg = dy (uc + 1) (s + a gc s (1 - s)) [g <= L]      du = dy gc s [-L <= u <= L]
 *
 * (the clamp passes gradient where it is inactive, boundaries included, like torch.clamp).
 *
 * Why it is fast: forward moves 3 values per output (2 in, 1 out), backward 5 (x and dy in, dx
 * out), with ~20 flops per output: memory-bound. The mapping is the activation kernel's
 * (activation.cu): 16-byte packs, 16 outputs per thread loaded before use, rows split into
 * chunks by tk_row_chunk_shape, one block per chunk. A pack of gates and its
 * pack of ups come from the two halves of the row; interleaved rows load two consecutive packs
 * and split them in registers, so every access stays 16 bytes wide. Row strides let the kernel
 * read the gate/up projection output of a fused GEMM in place.
 */
#include "activation.h"
#include "activation_math.cuh"
#include "common.cuh"

namespace {

constexpr int MAX_THREADS = 256;

/* Packs per thread per input half: 16 outputs per thread (4 f32 packs, 2 f16 / bf16 packs); 8
 * outputs, with fewer bytes in flight per thread, were slower (docs/kernels/activation.md). */
__host__ __device__ constexpr int unroll_for(int vec) { return vec == 1 ? 4 : 16 / vec; }

/* The activation applied to the gate for each GLU kind (the clamped form is written out). */
template <int Kind> __host__ __device__ constexpr int gate_activation() {
    return Kind == TK_GLU_SWIGLU      ? TK_ACT_SILU
           : Kind == TK_GLU_GEGLU_ERF ? TK_ACT_GELU_ERF
           : Kind == TK_GLU_GEGLU_TANH ? TK_ACT_GELU_TANH
                                       : TK_ACT_RELU;
}

struct glu_scalars {
    float alpha, limit;
};

template <int Kind, bool Fast> __device__ __forceinline__ float glu_forward(float g, float u, glu_scalars s) {
    if constexpr (Kind == TK_GLU_SWIGLU_CLAMPED) {
        const float gc = g > s.limit ? s.limit : g;
        const float uc = u > s.limit ? s.limit : (u < -s.limit ? -s.limit : u);
        return gc * tk_sigmoid(s.alpha * gc) * (uc + 1.0f);
    } else {
        return tk_act_apply<gate_activation<Kind>(), Fast>(g) * u;
    }
}

template <int Kind, bool Fast>
__device__ __forceinline__ void glu_backward(float g, float u, float dy, glu_scalars s, float *dg,
                                             float *du) {
    if constexpr (Kind == TK_GLU_SWIGLU_CLAMPED) {
        const float gc = g > s.limit ? s.limit : g;
        const float uc = u > s.limit ? s.limit : (u < -s.limit ? -s.limit : u);
        const float sg = tk_sigmoid(s.alpha * gc);
        *dg = g > s.limit ? 0.0f : dy * (uc + 1.0f) * (sg + s.alpha * gc * sg * (1.0f - sg));
        *du = (u > s.limit || u < -s.limit) ? 0.0f : dy * gc * sg;
    } else {
        constexpr int act = gate_activation<Kind>();
        *dg = dy * u * tk_act_derivative<act, Fast>(g);
        *du = dy * tk_act_apply<act, Fast>(g);
    }
}

/* Where the gate and up values of output column j live within an input row. */
struct glu_row_layout {
    int64_t gate_offset, up_offset; /* split layouts: first element of each half */
};

template <typename T, int Vec, bool Interleaved>
__device__ __forceinline__ void load_gate_up(const T *row, glu_row_layout L, int64_t j,
                                             tk_pack<T, Vec> *g, tk_pack<T, Vec> *u) {
    if constexpr (Interleaved && Vec == 1) {
        g->v[0] = row[2 * j];
        u->v[0] = row[2 * j + 1];
    } else if constexpr (Interleaved) {
        /* Two packs hold Vec (gate, up) pairs: lo the first Vec / 2, hi the rest. */
        const tk_pack<T, Vec> lo = tk_load_pack<T, Vec>(row + 2 * j);
        const tk_pack<T, Vec> hi = tk_load_pack<T, Vec>(row + 2 * j + Vec);
#pragma unroll
        for (int e = 0; e < Vec / 2; e++) {
            g->v[e] = lo.v[2 * e];
            u->v[e] = lo.v[2 * e + 1];
            g->v[e + Vec / 2] = hi.v[2 * e];
            u->v[e + Vec / 2] = hi.v[2 * e + 1];
        }
    } else {
        *g = tk_load_pack<T, Vec>(row + L.gate_offset + j);
        *u = tk_load_pack<T, Vec>(row + L.up_offset + j);
    }
}

template <typename T, int Vec, bool Interleaved>
__device__ __forceinline__ void store_gate_up(T *row, glu_row_layout L, int64_t j,
                                              const tk_pack<T, Vec> &g, const tk_pack<T, Vec> &u) {
    if constexpr (Interleaved && Vec == 1) {
        row[2 * j] = g.v[0];
        row[2 * j + 1] = u.v[0];
    } else if constexpr (Interleaved) {
        tk_pack<T, Vec> lo, hi;
#pragma unroll
        for (int e = 0; e < Vec / 2; e++) {
            lo.v[2 * e] = g.v[e];
            lo.v[2 * e + 1] = u.v[e];
            hi.v[2 * e] = g.v[e + Vec / 2];
            hi.v[2 * e + 1] = u.v[e + Vec / 2];
        }
        tk_store_pack<T, Vec>(row + 2 * j, lo);
        tk_store_pack<T, Vec>(row + 2 * j + Vec, hi);
    } else {
        tk_store_pack<T, Vec>(row + L.gate_offset + j, g);
        tk_store_pack<T, Vec>(row + L.up_offset + j, u);
    }
}

/* Output columns [j, j + Vec) of one row: forward writes y, backward writes dx. */
template <typename T, int Kind, int Vec, bool Interleaved, bool Backward>
__device__ __forceinline__ void glu_pack(const tk_pack<T, Vec> &g, const tk_pack<T, Vec> &u,
                                         const tk_pack<T, Vec> &dy, glu_scalars s, T *out_row,
                                         glu_row_layout L, int64_t j) {
    if constexpr (Backward) {
        tk_pack<T, Vec> dg, du;
#pragma unroll
        for (int e = 0; e < Vec; e++) {
            float dgf, duf;
            glu_backward<Kind, sizeof(T) == 2>(tk_to_float(g.v[e]), tk_to_float(u.v[e]), tk_to_float(dy.v[e]), s,
                               &dgf, &duf);
            dg.v[e] = tk_from_float<T>(dgf);
            du.v[e] = tk_from_float<T>(duf);
        }
        store_gate_up<T, Vec, Interleaved>(out_row, L, j, dg, du);
    } else {
        tk_pack<T, Vec> y;
#pragma unroll
        for (int e = 0; e < Vec; e++)
            y.v[e] = tk_from_float<T>(glu_forward<Kind, sizeof(T) == 2>(tk_to_float(g.v[e]), tk_to_float(u.v[e]), s));
        tk_store_pack<T, Vec>(out_row + j, y);
    }
}

/* Blocks per SM promised to ptxas: 4 forward (at most 64 registers, 1024 threads per SM), 2
 * backward (its x, dy and two outputs per pack need 80-107 registers). The promise also lifts
 * the lower register caps ptxas otherwise guesses, under which two kernels spilled 8 bytes. */
template <typename T, int Kind, int Vec, bool Interleaved, bool Backward>
__global__ void __launch_bounds__(MAX_THREADS, Backward ? 2 : 4) glu_kernel(tk_glu_call a) {
    const T *x = static_cast<const T *>(a.x);
    const T *dy = static_cast<const T *>(a.dy);
    T *out = static_cast<T *>(a.out);
    const glu_scalars s = {a.alpha, a.limit};
    const glu_row_layout L = {a.layout == TK_GLU_UP_FIRST ? a.d : 0,
                              a.layout == TK_GLU_UP_FIRST ? 0 : a.d};
    /* Forward writes y rows, backward writes dx rows (laid out like x). */
    const int64_t out_stride = Backward ? a.x_row_stride : a.y_row_stride;
    constexpr int UNROLL = unroll_for(Vec);
    const int64_t packs_per_row = a.d / Vec;
    const int64_t first_pack = (int64_t)blockIdx.x * blockDim.x * UNROLL + threadIdx.x;

    for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
        const T *x_row = x + row * a.x_row_stride;
        T *out_row = out + row * out_stride;
        tk_pack<T, Vec> gs[UNROLL], us[UNROLL], dys[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t j = (first_pack + (int64_t)u * blockDim.x) * Vec;
            if (j < packs_per_row * Vec) {
                load_gate_up<T, Vec, Interleaved>(x_row, L, j, &gs[u], &us[u]);
                if constexpr (Backward)
                    dys[u] = tk_load_pack<T, Vec>(dy + row * a.y_row_stride + j);
            }
        }
        /* Convert each pack where it is used: converted all at once, bf16 rows held 32 f32
         * values (62 registers against 45 for f16, whose conversion is one instruction per
         * pair), and fewer blocks fit an SM. */
        keep_packed(gs);
        keep_packed(us);
        if constexpr (Backward)
            keep_packed(dys);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t j = (first_pack + (int64_t)u * blockDim.x) * Vec;
            if (j < packs_per_row * Vec)
                glu_pack<T, Kind, Vec, Interleaved, Backward>(gs[u], us[u], dys[u], s, out_row, L, j);
        }
        /* Columns past the last whole pack (d not a multiple of the pack): one element each. */
        if (blockIdx.x == 0) {
            for (int64_t j = packs_per_row * Vec + threadIdx.x; j < a.d; j += blockDim.x) {
                tk_pack<T, 1> g, u, d1;
                load_gate_up<T, 1, Interleaved>(x_row, L, j, &g, &u);
                if constexpr (Backward)
                    d1.v[0] = dy[row * a.y_row_stride + j];
                glu_pack<T, Kind, 1, Interleaved, Backward>(g, u, d1, s, out_row, L, j);
            }
        }
    }
}

template <typename T, int Kind, int Vec, bool Interleaved, bool Backward>
cudaError_t launch(const tk_glu_call *a, const tk_device *dev, cudaStream_t stream) {
    const tk_row_chunks shape = tk_row_chunk_shape(a->rows, a->d / Vec, unroll_for(Vec), MAX_THREADS);
    (void)dev;
    return tk_launch(glu_kernel<T, Kind, Vec, Interleaved, Backward>, shape.grid, shape.threads, 0, stream, *a);
}

template <typename T, int Vec, bool Interleaved, bool Backward>
cudaError_t launch_kind(const tk_glu_call *a, const tk_device *dev, cudaStream_t stream) {
    switch (a->kind) {
    case TK_GLU_SWIGLU: return launch<T, TK_GLU_SWIGLU, Vec, Interleaved, Backward>(a, dev, stream);
    case TK_GLU_GEGLU_ERF: return launch<T, TK_GLU_GEGLU_ERF, Vec, Interleaved, Backward>(a, dev, stream);
    case TK_GLU_GEGLU_TANH: return launch<T, TK_GLU_GEGLU_TANH, Vec, Interleaved, Backward>(a, dev, stream);
    case TK_GLU_REGLU: return launch<T, TK_GLU_REGLU, Vec, Interleaved, Backward>(a, dev, stream);
    case TK_GLU_SWIGLU_CLAMPED:
        return launch<T, TK_GLU_SWIGLU_CLAMPED, Vec, Interleaved, Backward>(a, dev, stream);
    }
    return cudaErrorInvalidValue;
}

template <typename T, int Vec>
cudaError_t launch_layout(const tk_glu_call *a, const tk_device *dev, cudaStream_t stream) {
    const bool interleaved = a->layout == TK_GLU_INTERLEAVED;
    if (a->backward)
        return interleaved ? launch_kind<T, Vec, true, true>(a, dev, stream)
                           : launch_kind<T, Vec, false, true>(a, dev, stream);
    return interleaved ? launch_kind<T, Vec, true, false>(a, dev, stream)
                       : launch_kind<T, Vec, false, false>(a, dev, stream);
}

template <bool Wide>
cudaError_t launch_dtype(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_glu_call *a = static_cast<const tk_glu_call *>(call);
    return tk_dispatch_dtype(a->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return launch_layout<T, tk_pack_width<T>(Wide)>(a, dev, stream);
    });
}

} // namespace

extern "C" cudaError_t tk_launch_glu_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<true>(call, dev, stream);
}

extern "C" cudaError_t tk_launch_glu_scalar(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<false>(call, dev, stream);
}
