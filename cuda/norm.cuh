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
#include "core/sm90.cuh"
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

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/* N row sums over the blocks of the thread-block cluster that holds the row (the cluster
 * kernels, both directions), returned to every thread of every block. Each warp adds its lanes,
 * then sends its N sums with st.async into slot rank * warps + warp of `slots` in every block of
 * the cluster, where they complete on that block's mbarrier `landed` (armed by the block's thread
 * 0 with the bytes of all blocks x warps slots; a slot may land before the arming: the count of
 * bytes still to land goes negative for a while); each warp waits for the phase of `landed` of
 * the given parity and adds all the slots in one fixed order, so every block gets the same bits.
 * Unlike the release of a cluster barrier, a send does not wait for the thread's earlier global
 * stores, and only the receiver waits, for one one-way trip. MaxSlots bounds blocks x warps: up
 * to 32, a lane takes one slot. The caller owns the buffer's reuse: `slots` and `landed` may be
 * used again only once every block of the cluster has passed this wait (the forward uses each
 * once; the backward alternates two by row, see norm_bwd.cu). Clusters of two blocks or more
 * (st.async). */
template <int N, int MaxSlots>
__device__ __forceinline__ void norm_cluster_sum(float (&v)[N], tk_pack<float, N> *slots, uint32_t landed,
                                                 uint32_t parity, int warps) {
    static_assert(N == 1 || N == 2, "one st.async of 4 or 8 bytes per slot");
    const int lane = threadIdx.x & 31, blocks = tk_cluster_blocks();
    tk_pack<float, N> mine;
#pragma unroll
    for (int n = 0; n < N; n++)
        mine.v[n] = tk_warp_sum(v[n]);
    if (threadIdx.x == 0)
        tk_mbarrier_arrive_expect_tx(landed, (uint32_t)(blocks * warps * sizeof(mine)));
    if (lane < blocks) {
        const uint32_t slot = tk_smem_address(&slots[tk_cluster_rank() * warps + (int)(threadIdx.x >> 5)]);
        if constexpr (N == 1)
            tk_cluster_send_f32(slot, landed, lane, mine.v[0]);
        else
            tk_cluster_send_f32x2(slot, landed, lane, mine.v[0], mine.v[1]);
    }
    tk_mbarrier_wait(landed, parity);
    const int used = blocks * warps;
    tk_pack<float, N> total;
    if constexpr (MaxSlots <= 32) {
        total = lane < used ? slots[lane] : tk_pack<float, N>{};
    } else {
        total = tk_pack<float, N>{};
        for (int i = lane; i < used; i += 32) {
            const tk_pack<float, N> s = slots[i];
#pragma unroll
            for (int n = 0; n < N; n++)
                total.v[n] += s.v[n];
        }
    }
#pragma unroll
    for (int n = 0; n < N; n++)
        v[n] = tk_warp_sum(total.v[n]);
}
#endif

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
