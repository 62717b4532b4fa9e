/*
 * Device helpers shared by the norm kernels (norm_fwd.cu, norm_bwd.cu): parameter loads, the
 * per-row group reduction and the row-to-thread mapping of the "rows" kernels.
 *
 * Row mapping of the "rows" kernels: a row of P packs (a pack is 16 bytes, or one element for
 * the scalar variants) is held by a group of `group` threads, PACKS packs per thread, pack
 * j = lane + p * group (consecutive lanes read consecutive packs: coalesced). The group is
 *  - a power of two <= 32 (narrow rows): several groups share a 128-thread block and reduce
 *    with warp shuffles limited to their lanes;
 *  - a multiple of 32 equal to the block (wider rows): one row per block, block reduction.
 * Blocks stride over the rows; the loop bound is the block's first row, so every thread of a
 * warp runs the same iterations (full-mask shuffles and __syncthreads stay legal) and threads
 * past the last row only contribute zeros.
 */
#ifndef TK_NORM_CUH
#define TK_NORM_CUH

#include "common.cuh"
#include "norm.h"
#include "tkern.h"

#define TK_NORM_NARROW_THREADS 128

/* VEC consecutive parameters (weight or bias) starting at element c, as stored: 16-byte loads
 * (two for f32 parameters of 16-bit rows), or one element when VEC == 1. */
template <typename W, int VEC> __device__ __forceinline__ tk_pack<W, VEC> norm_load_raw(const W *p, int64_t c) {
    if constexpr (VEC == 1) {
        return tk_pack<W, 1>{{p[c]}};
    } else {
        constexpr int per = 16 / (int)sizeof(W);
        static_assert(VEC % per == 0, "a pack of parameters is whole 16-byte chunks");
        tk_pack<W, VEC> r;
#pragma unroll
        for (int k = 0; k < VEC / per; k++)
            reinterpret_cast<tk_pack<W, per> *>(r.v)[k] = tk_load_pack<W, per>(p + c + k * per);
        return r;
    }
}

/* The same parameters as f32. */
template <typename W, int VEC>
__device__ __forceinline__ void norm_load_params(const W *p, int64_t c, float *out) {
    float f[VEC];
    tk_unpack(norm_load_raw<W, VEC>(p, c), f);
#pragma unroll
    for (int e = 0; e < VEC; e++)
        out[e] = f[e];
}

/* The effective scale w' of VEC columns: w, 1 + w (gemma) or 1 without a weight. */
template <typename W, int VEC>
__device__ __forceinline__ void norm_load_scale(const W *w, bool gemma, int64_t c, float *out) {
    if (w) {
        norm_load_params<W, VEC>(w, c, out);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            out[e] += gemma ? 1.0f : 0.0f;
    } else {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            out[e] = 1.0f;
    }
}

/* Sum over the threads of one row's group (see the mapping above), returned to all of them.
 * Fixed order: the same inputs give the same bits. */
__device__ __forceinline__ float norm_group_sum(float v, int group, float *scratch) {
    if (group <= 32) {
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1)
            if (offset < group)
                v += __shfl_xor_sync(0xffffffffu, v, offset);
        return v;
    }
    return tk_block_sum(v, scratch);
}

/* Threads per row group and per block for a row that needs `need` threads (see the mapping). */
struct norm_rows_shape {
    int group, threads;
};

static inline norm_rows_shape norm_shape_for(int64_t need) {
    if (need <= 32) {
        int group = 1;
        while (group < need)
            group <<= 1;
        return {group, TK_NORM_NARROW_THREADS};
    }
    const int threads = (int)((need + 31) / 32 * 32);
    return {threads, threads};
}

#endif
