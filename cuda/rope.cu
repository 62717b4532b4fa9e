/*
 * Rotary position embedding on Q and K in one launch (conventions in include/tkern.h,
 * tk_rope_params). For token t at position p and pair i < rotary_dim / 2 of every head:
 *
 *     a = p * inv_freq_i  (inv_freq_i = theta^(-2i / rotary_dim), or cos / sin from the cache)
 *     out1 = x1 cos a - x2 sin a,   out2 = x2 cos a + x1 sin a      (backward: a -> -a)
 *
 * NeoX pairs are (x[i], x[i + rotary_dim / 2]); GPT-J pairs are (x[2i], x[2i + 1]).
 *
 * Mapping. A work item is (token, unit, head slice): a unit is Vec consecutive pairs (Vec = 8
 * bf16 / f16, 4 f32, 1 for "scalar"), read as two packs (NeoX: one from each half; GPT-J: two
 * adjacent packs de-interleaved in registers), or, out of place with rotary_dim < head_dim, one
 * pack of the unrotated rest to copy. The item's angles depend on (token, unit) only, so they
 * are computed once and reused for every head of its slice: Q heads then K heads, HEADS = 4 at a
 * time with all 8 pack loads issued before the first store (128 bytes in flight per thread).
 * Consecutive threads take consecutive units of a token: for head_dim 128 bf16 a warp reads
 * 4 tokens x 2 x 128 contiguous bytes of one head per instruction. Head slices (items per
 * token x heads / slice) only split the heads when tokens x units alone cannot fill one wave
 * (decode-sized calls); the 16384-token benchmark has 131072 items of 40 heads each. Grid:
 * min(items / 256, one wave at the occupancy limit), grid-stride.
 *
 * Angle precision: inv_freq and p * inv_freq are computed in f64, the angle is reduced to
 * [-pi, pi] in f64 (two-part 2 pi), then sincosf (full range reduction never needed, error
 * ~1 ulp): the angle is exact to ~2e-7 rad for |p| < 2^30. Per item that is Vec f64 exp2 and
 * a few f64 ops, amortised over its heads (negligible on the H200's full-rate f64; on sm_86 /
 * sm_89 at 1/64 rate about 20 us for the benchmark shape). __sincosf on the unreduced f32
 * product would be off by radians at large positions.
 *
 * Memory: each element is read once and written once (in place: the same address), the cache
 * or position array is read once per item (L2 hits across heads and slices).
 */
#include <math.h>

#include "tkern.h"

#include "common.cuh"
#include "rope.h"

namespace {

constexpr int THREADS = 256;
constexpr int HEADS = 4;

/* 2 pi as a sum of two doubles (hi has 53 bits, lo the next 53). */
constexpr double TWO_PI_HI = 6.283185307179586232;
constexpr double TWO_PI_LO = 2.4492935982947063e-16;
constexpr double INV_TWO_PI = 0.15915494309189533577;

__device__ __forceinline__ int64_t token_position(const tk_rope_call &a, int64_t t) {
    if (a.positions32)
        return a.positions32[t];
    if (a.positions64)
        return a.positions64[t];
    return a.position_start + t;
}

/* cos and sin of pair i's angle at position pos (sin negated for the backward pass). */
__device__ __forceinline__ void pair_cos_sin(const tk_rope_call &a, int64_t pos, int64_t i, float *c, float *s) {
    if (a.cos_cache) {
        if (pos < 0 || pos >= a.max_position) {
            *c = *s = __int_as_float(0x7fffffff); /* NaN: the documented out-of-range result */
            return;
        }
        *c = a.cos_cache[pos * a.cache_row_stride + i];
        *s = a.sin_cache[pos * a.cache_row_stride + i];
    } else {
        const double inv_freq = exp2(-(double)(2 * i) / (double)a.rotary_dim * a.log2_theta);
        const double angle = (double)pos * inv_freq;
        const double k = rint(angle * INV_TWO_PI);
        const double reduced = fma(-k, TWO_PI_LO, fma(-k, TWO_PI_HI, angle));
        sincosf((float)reduced, s, c);
    }
    if (a.backward)
        *s = -*s;
}

/* Where one head's rows live. */
struct head_ref {
    const void *in;
    void *out;
    int64_t in_offset, out_offset; /* elements */
};

__device__ __forceinline__ head_ref locate(const tk_rope_call &a, int64_t t, int64_t h) {
    head_ref r;
    if (h < a.heads_q) {
        r.in = a.q;
        r.out = a.q_out;
        r.in_offset = t * a.q_strides[0] + h * a.q_strides[1];
        r.out_offset = t * a.q_out_strides[0] + h * a.q_out_strides[1];
    } else {
        h -= a.heads_q;
        r.in = a.k;
        r.out = a.k_out;
        r.in_offset = t * a.k_strides[0] + h * a.k_strides[1];
        r.out_offset = t * a.k_out_strides[0] + h * a.k_out_strides[1];
    }
    return r;
}

/* Element offsets, within a head, of the two packs of a unit starting at pair j0. */
template <int Vec, bool NeoX> __device__ __forceinline__ int64_t first_pack(int64_t j0) { return NeoX ? j0 : 2 * j0; }
template <int Vec, bool NeoX> __device__ __forceinline__ int64_t second_pack(int64_t j0, int64_t half) {
    return NeoX ? j0 + half : 2 * j0 + Vec;
}

/* Rotates the Vec pairs held in packs (lo, hi): NeoX pairs are (lo[e], hi[e]); GPT-J pairs are
 * elements (2e, 2e + 1) of the 2 Vec elements lo then hi. */
template <typename T, int Vec, bool NeoX>
__device__ __forceinline__ void rotate(tk_pack<T, Vec> &lo, tk_pack<T, Vec> &hi, const float (&c)[Vec],
                                       const float (&s)[Vec]) {
    float x1[Vec], x2[Vec];
#pragma unroll
    for (int e = 0; e < Vec; e++) {
        if constexpr (NeoX) {
            x1[e] = tk_to_float(lo.v[e]);
            x2[e] = tk_to_float(hi.v[e]);
        } else {
            const int k1 = 2 * e, k2 = 2 * e + 1;
            x1[e] = tk_to_float(k1 < Vec ? lo.v[k1 % Vec] : hi.v[k1 % Vec]);
            x2[e] = tk_to_float(k2 < Vec ? lo.v[k2 % Vec] : hi.v[k2 % Vec]);
        }
    }
#pragma unroll
    for (int e = 0; e < Vec; e++) {
        const T o1 = tk_from_float<T>(x1[e] * c[e] - x2[e] * s[e]);
        const T o2 = tk_from_float<T>(x2[e] * c[e] + x1[e] * s[e]);
        if constexpr (NeoX) {
            lo.v[e] = o1;
            hi.v[e] = o2;
        } else {
            const int k1 = 2 * e, k2 = 2 * e + 1;
            (k1 < Vec ? lo.v[k1 % Vec] : hi.v[k1 % Vec]) = o1;
            (k2 < Vec ? lo.v[k2 % Vec] : hi.v[k2 % Vec]) = o2;
        }
    }
}

template <typename T, int Vec, bool NeoX>
__global__ void __launch_bounds__(THREADS) rope_kernel(tk_rope_call a, int64_t units, int64_t rot_units,
                                                       int64_t slices, int64_t items) {
    const int64_t heads = a.heads_q + a.heads_k;
    const int64_t half = a.rotary_dim / 2;
    for (int64_t item = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; item < items;
         item += (int64_t)gridDim.x * blockDim.x) {
        const int64_t unit = item % units;
        const int64_t rest = item / units;
        const int64_t slice = rest % slices;
        const int64_t t = rest / slices;

        if (unit < rot_units) {
            const int64_t j0 = unit * Vec;
            const int64_t pos = token_position(a, t);
            float c[Vec], s[Vec];
#pragma unroll
            for (int e = 0; e < Vec; e++)
                pair_cos_sin(a, pos, j0 + e, &c[e], &s[e]);
            const int64_t off1 = first_pack<Vec, NeoX>(j0), off2 = second_pack<Vec, NeoX>(j0, half);
            for (int64_t h0 = slice; h0 < heads; h0 += HEADS * slices) {
                tk_pack<T, Vec> lo[HEADS], hi[HEADS];
#pragma unroll
                for (int u = 0; u < HEADS; u++) {
                    const int64_t h = h0 + u * slices;
                    if (h < heads) {
                        const head_ref r = locate(a, t, h);
                        const T *in = static_cast<const T *>(r.in) + r.in_offset;
                        lo[u] = tk_load_pack<T, Vec>(in + off1);
                        hi[u] = tk_load_pack<T, Vec>(in + off2);
                    }
                }
#pragma unroll
                for (int u = 0; u < HEADS; u++) {
                    const int64_t h = h0 + u * slices;
                    if (h < heads) {
                        rotate<T, Vec, NeoX>(lo[u], hi[u], c, s);
                        const head_ref r = locate(a, t, h);
                        T *out = static_cast<T *>(r.out) + r.out_offset;
                        tk_store_pack<T, Vec>(out + off1, lo[u]);
                        tk_store_pack<T, Vec>(out + off2, hi[u]);
                    }
                }
            }
        } else { /* copy one pack of the unrotated rest (out of place only) */
            const int64_t col = a.rotary_dim + (unit - rot_units) * Vec;
            for (int64_t h0 = slice; h0 < heads; h0 += HEADS * slices) {
                tk_pack<T, Vec> v[HEADS];
#pragma unroll
                for (int u = 0; u < HEADS; u++) {
                    const int64_t h = h0 + u * slices;
                    if (h < heads) {
                        const head_ref r = locate(a, t, h);
                        v[u] = tk_load_pack<T, Vec>(static_cast<const T *>(r.in) + r.in_offset + col);
                    }
                }
#pragma unroll
                for (int u = 0; u < HEADS; u++) {
                    const int64_t h = h0 + u * slices;
                    if (h < heads) {
                        const head_ref r = locate(a, t, h);
                        tk_store_pack<T, Vec>(static_cast<T *>(r.out) + r.out_offset + col, v[u]);
                    }
                }
            }
        }
    }
}

template <typename T, int Vec, bool NeoX>
cudaError_t launch(const tk_rope_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr auto kernel = rope_kernel<T, Vec, NeoX>;
    const int64_t heads = a->heads_q + a->heads_k;
    const int64_t rot_units = a->rotary_dim / 2 / Vec;
    const int64_t units = rot_units + (a->copy_rest ? (a->head_dim - a->rotary_dim) / Vec : 0);
    const int64_t wave = tk_wave_blocks<kernel>(dev, THREADS, 0);
    /* Split the heads only as far as needed to give one wave of threads some work. */
    const int64_t per_slice = a->tokens * units;
    int64_t slices = (wave * THREADS + per_slice - 1) / per_slice;
    if (slices > heads)
        slices = heads;
    if (slices < 1)
        slices = 1;
    const int64_t items = per_slice * slices;
    int64_t blocks = (items + THREADS - 1) / THREADS;
    if (blocks > wave)
        blocks = wave;
    kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(*a, units, rot_units, slices, items);
    return cudaGetLastError();
}

template <typename T, int Vec>
cudaError_t launch_style(const tk_rope_call *a, const tk_device *dev, cudaStream_t stream) {
    return a->style == TK_ROPE_NEOX ? launch<T, Vec, true>(a, dev, stream) : launch<T, Vec, false>(a, dev, stream);
}

template <bool Wide>
cudaError_t launch_dtype(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_rope_call *a = static_cast<const tk_rope_call *>(call);
    switch (a->dtype) {
    case TK_F32: return launch_style<float, Wide ? 4 : 1>(a, dev, stream);
    case TK_F16: return launch_style<__half, Wide ? 8 : 1>(a, dev, stream);
    case TK_BF16: return launch_style<__nv_bfloat16, Wide ? 8 : 1>(a, dev, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace

extern "C" cudaError_t tk_launch_rope_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<true>(call, dev, stream);
}

extern "C" cudaError_t tk_launch_rope_scalar(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<false>(call, dev, stream);
}
