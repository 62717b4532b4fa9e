/*
 * RMSNorm and LayerNorm forward, with the optional fused residual add:
 *
 *     h = x (+ residual, rounded to the dtype and written back to residual)
 *     RMSNorm    rstd = 1 / sqrt(mean(h^2) + eps)               y = h rstd w'
 *     LayerNorm  mu = mean(h), rstd = 1 / sqrt(mean((h - mu)^2) + eps)
 *                                                               y = (h - mu) rstd w' + b
 *
 * w' = w, 1 + w (gemma) or 1; f32 arithmetic; rstd and mu optionally stored per row (f32).
 *
 * Why it is fast: ~10 flops per element against 4 (plain) or 8 (residual) bytes of bf16
 * traffic: memory-bound, so one pass over memory is the goal.
 * - "rows" kernels (vec16 / scalar) hold the whole row in registers (norm.cuh has the thread
 *   mapping): 4 packs of 16 bytes per thread (32 bf16 / f16 or 16 f32 elements) or 8 scalars,
 *   in one block of up to 512 threads (32 KB of a row), so rows up to 16384 16-bit or 8192 f32
 *   elements (4096 scalar); 16-bit rows of up to 8192 take at most 256 threads. Each
 *   thread issues all its loads (x and residual) before the first use, so the row is read once
 *   and written once; the packs stay raw in registers (keep_packed) and are converted where
 *   used. The reductions are warp shuffles plus, for groups wider than a warp, one
 *   shared-memory step behind a single barrier. LayerNorm's variance is a second pass over the
 *   registers (exact two-pass, no cancellation). LayerNorm and the residual add are template
 *   parameters, so each kernel holds only its own state: 56-80 registers for 16-bit packs of
 *   <= 256 threads, 48-64 for 512 threads (ptxas -v, sm_90a). A bf16 4096 row is one block of
 *   128 threads x 4 packs, a 16384 row one of 512 threads.
 *   These kernels are close to the SM's instruction-issue limit, not only to the memory's
 *   (docs/kernels/norm.md has the profile), hence the per-element work is kept minimal: bf16
 *   pairs unpack per 32-bit word (tk_unpack), shifts instead of divisions, the weight kind
 *   (w, 1 + w, none) and the bias lifted out of the output loop, and rows of exactly 4 packs
 *   per thread of one block run without bounds checks (Whole, below).
 * - "cluster" kernel (sm_90; rows wider than one block holds, up to 8 blocks' worth: 131072
 *   16-bit or 65536 f32 elements): a row split into slices of at most 32 KB over the 2 to 8
 *   blocks of a thread-block cluster (a 65536-wide bf16 row is 4 blocks), so the row is still
 *   read once. Each slice is staged in shared memory by one bulk copy (TMA, cp.async.bulk) per
 *   tensor, not held in registers: the bytes in flight per SM are then bounded by shared memory
 *   (6 blocks of 32 KB, 192 KB; 3 with the residual) rather than by the registers a slice and
 *   its addressing would take (2 blocks of 512 threads, 64 KB, if it were held in registers).
 *   A row has fixed costs that a block of the cluster cannot overlap with its own loads (the
 *   blocks' start, one or two exchanges, the weight's L2 round trips); other rows' blocks on the
 *   same SM keep their loads in flight meanwhile. 128 threads a block, 16 packs each per pass
 *   over shared memory (passes re-read the slice from shared memory: RMSNorm 2, LayerNorm 3).
 *   A reduction sends every warp's sum to every block of the cluster with st.async (distributed
 *   shared memory), counted on the receiver's mbarrier, and each block adds them in the same
 *   order, so all blocks get the same bits. No cluster barrier per reduction: its release (a
 *   GPU-scope memory barrier in the SASS) would wait for the thread's outstanding stores, and
 *   all threads of every block would meet in it; a send waits for nothing and only the
 *   receiver waits.
 * - "wide" kernels (any width, up to 262144): a 512-thread block per row, two passes over the
 *   row: pass 1 reads it (adding and storing the residual) and accumulates per-thread shifted
 *   sums, combined across the block with Chan's formula in a fixed order; pass 2 reads it back
 *   (from L2 when it is still there) and writes y. Only for rows the registers cannot hold,
 *   or when forced.
 * Grids: "rows" kernels one block per row group (no persistent grid: blocks in their load,
 * reduce and store phases share each SM); "wide" kernels one wave of the occupancy limit, so
 * that the rows in flight stay in L2 for pass 2.
 */
#include "core/sm90.cuh"
#include "norm.cuh"

namespace {

constexpr int WIDE_THREADS = 512;
constexpr int WIDE_UNROLL = 2;
/* A decode step's rows (a token per row, up to a batch of 64): the calls that prefetch w' and b. */
constexpr int64_t NORM_DECODE_ROWS = 64;

/* Packs per thread: 4 of 16 bytes (16 f32 or 32 f16 / bf16 elements), or 8 scalars. */
template <int VEC> constexpr int fwd_packs() { return VEC > 1 ? TK_NORM_FWD_PACKS : TK_NORM_FWD_ELEMS_SCALAR; }

/* Threads of the rows kernels: 16-bit rows of up to 8192 elements take at most 256 threads (the
 * kernel tuned for them), wider ones and the f32 and scalar rows up to 512 (Threads below). */
template <typename T, int VEC> constexpr int rows_small_threads() {
    return VEC > 1 && sizeof(T) == 2 ? TK_NORM_ROWS_MAX_THREADS / 2 : TK_NORM_ROWS_MAX_THREADS;
}

/* Launch bounds: 16-bit rows of <= 256 threads are capped at 80 registers (3 blocks of 256 per
 * SM), the best cap measured for LayerNorm (docs/kernels/norm.md); 512-thread rows at 64 (2
 * blocks per SM), scalars at 128. */
template <typename T, int VEC, int Threads> constexpr int rows_min_blocks() {
    return VEC == 1 ? 1 : (Threads < TK_NORM_ROWS_MAX_THREADS ? 3 : 2);
}

/* Sum over the threads of one row's group, with one barrier for groups wider than a warp (one
 * row per block; OneRow: known to be so at compile time): partial sums alternate between two
 * scratch buffers by `parity`, so a reduction never overwrites partials that a slower thread of
 * the previous one still reads.
 * Fixed order: the same inputs give the same bits. */
template <bool OneRow>
__device__ __forceinline__ float group_sum(float v, int group, float (*scratch)[32], int &parity) {
    if (!OneRow && group <= 32)
        return norm_group_sum(v, group, nullptr);
    v = tk_warp_sum(v);
    float *buf = scratch[parity];
    parity ^= 1;
    if ((threadIdx.x & 31) == 0)
        buf[threadIdx.x >> 5] = v;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    return tk_warp_sum(lane < (int)(blockDim.x >> 5) ? buf[lane] : 0.0f);
}

/* The cluster kernel (norm_fwd_cluster) runs only on sm_90 and later ("cluster_vec16" needs cc
 * 9.0): compiled for an older target, its body is a trap. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define NORM_NO_CLUSTERS
#endif

/* Cluster kernel shape. A block takes a slice of at most CLUSTER_SLICE_PACKS 16-byte packs
 * (32 KB, the slices tk_norm_cluster_fit counts: 8 of them at most) with CLUSTER_THREADS
 * threads, CLUSTER_SLICE_PACKS / CLUSTER_THREADS = 16 packs per thread and pass.
 * Occupancy (H100 / H200, 228 KB of shared memory per SM, 1 KB of it reserved per block): a
 * 32 KB slice and ~0.3 KB of statics take 6 blocks per SM (3 with the residual's 64 KB), so
 * the registers are capped for 6: 65536 / (6 x 128) -> 80 a thread. */
constexpr int CLUSTER_THREADS = 128;
constexpr int CLUSTER_SLICE_PACKS = TK_NORM_CLUSTER_SLICE_PACKS;
constexpr int CLUSTER_MIN_BLOCKS = 6;
static_assert(CLUSTER_SLICE_PACKS % CLUSTER_THREADS == 0, "whole packs per thread");
static_assert(TK_NORM_CLUSTER_MAX_BLOCKS * CLUSTER_THREADS / 32 <= 32, "a lane per exchanged slot");

#ifndef NORM_NO_CLUSTERS
/* The partial sums that the cluster's blocks send each other (cluster_sum), one buffer per
 * reduction of the row (a block takes one row: at most two reductions, LayerNorm's), the
 * barriers on which they land, and the barrier of the slice's bulk copies. */
struct cluster_shared_state {
    tk_pack<float, 1> sums[2][TK_NORM_CLUSTER_MAX_BLOCKS * CLUSTER_THREADS / 32];
    uint64_t landed[2]; /* landed[k] completes its phase 0 when all of sums[k] has arrived */
    uint64_t loaded;    /* completes its phase 0 when the slice (and the residual's) is in */
};

__device__ __forceinline__ cluster_shared_state &cluster_shared() {
    __shared__ cluster_shared_state state;
    return state;
}

/* Sum over the blocks of the cluster that holds the row, returned to all of them; reduction k
 * (0, or 1 for LayerNorm's second) of the block's row, through buffer and barrier k, each used
 * once (norm_cluster_sum, norm.cuh). No cluster barrier at the end: a block's last wait returns
 * only once everything sent to it has landed, and nothing is sent after it. */
__device__ __forceinline__ float cluster_sum(float v, int k) {
    cluster_shared_state &st = cluster_shared();
    float sums[1] = {v};
    norm_cluster_sum<1, TK_NORM_CLUSTER_MAX_BLOCKS * CLUSTER_THREADS / 32>(sums, st.sums[k],
                                                                         tk_smem_address(&st.landed[k]), 0,
                                                                         CLUSTER_THREADS / 32);
    return sums[0];
}
#endif

/* The effective scale w' of the forward kernels: the weight, 1 + weight (gemma), or 1 (none). */
enum { SCALE_WEIGHT, SCALE_GEMMA, SCALE_NONE };

/* y = (h - mu) rstd w' + b, of one pack of VEC elements; w_raw() and b_raw() give w and b as
 * stored (packs of VEC), called where the math needs them: the caller decides whether they are
 * loaded there (the rows kernel) or were loaded earlier (the cluster kernel). Few instructions per element here: at the
 * copy bandwidth a bf16 row has ~30 per element of issue budget and the loads, sums and
 * conversions take ~15 of them. Hence the kind of w' (w, 1 + w or 1) and whether there is a
 * bias (only LayerNorm has one) are compile-time: with_scale_kind gives each combination its
 * own copy of the caller's loop, with no per-element select or add and no per-pack test.
 * (h - mu) rstd stays a subtraction first (h rstd - mu rstd would cancel for rows far from
 * zero). */
template <int Kind, bool Bias, typename T, int VEC, typename WRaw, typename BRaw>
__device__ __forceinline__ tk_pack<T, VEC> normalise_pack(const tk_pack<T, VEC> &h, float mean, float rstd, WRaw &&w_raw,
                                                          BRaw &&b_raw) {
    float f[VEC], scale[VEC], shift[VEC];
    tk_unpack(h, f);
    if constexpr (Kind == SCALE_NONE) {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            scale[e] = 1.0f;
    } else {
        tk_unpack(w_raw(), scale);
        /* Braced: CUDA 13.0's front end silently dropped the #pragma unroll loop that followed a
         * discarded, unbraced if constexpr over a loop (it did so in the attention backward). */
        if constexpr (Kind == SCALE_GEMMA) {
#pragma unroll
            for (int e = 0; e < VEC; e++)
                scale[e] += 1.0f;
        }
    }
    tk_pack<T, VEC> out;
    if constexpr (Bias) {
        tk_unpack(b_raw(), shift);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            out.v[e] = tk_from_float<T>(fmaf((f[e] - mean) * rstd, scale[e], shift[e]));
    } else {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            out.v[e] = tk_from_float<T>((f[e] - mean) * rstd * scale[e]);
    }
    return out;
}

/* VEC parameters at element c as stored, or nothing where the kind does not read them. */
template <bool Load, int VEC, typename W> __device__ __forceinline__ tk_pack<W, VEC> param_raw(const W *p, int c) {
    if constexpr (Load)
        return norm_load_raw<W, VEC>(p, c);
    else
        return tk_pack<W, VEC>{};
}

/* Calls body(kind, bias) with the call's kind of w' and whether it adds a bias (LayerNorm's),
 * as compile-time constants (std::integral_constant, std::bool_constant). */
template <bool LayerNorm, typename Body> __device__ __forceinline__ void with_scale_kind(const tk_norm_call &a, Body &&body) {
    auto with_bias = [&](auto kind) {
        if (LayerNorm && a.bias)
            body(kind, std::bool_constant<LayerNorm>{});
        else
            body(kind, std::false_type{});
    };
    if (!a.weight)
        with_bias(std::integral_constant<int, SCALE_NONE>{});
    else if (a.gemma)
        with_bias(std::integral_constant<int, SCALE_GEMMA>{});
    else
        with_bias(std::integral_constant<int, SCALE_WEIGHT>{});
}

/* LayerNorm and Residual are template parameters: each of the four kernels carries only its own
 * registers and work (a runtime-general kernel was slower: docs/kernels/norm.md).
 * Whole: the launcher found the row (or the block's slice of it) to be exactly PACKS packs per
 * thread of one block, so every pack of every thread is inside the row and every block's row
 * inside the tensor. The per-pack bounds checks, their branches and the per-pack address
 * arithmetic they kept from being hoisted then disappear (docs/kernels/norm.md counts the
 * instructions saved).
 * Threads: the most threads a block has (the launch bounds). */
template <typename T, typename W, int VEC, int Threads, bool LayerNorm, bool Residual, bool Whole>
__global__ void __launch_bounds__(Threads, (rows_min_blocks<T, VEC, Threads>()))
    norm_fwd_rows(tk_norm_call a, int group, float inv_n) {
    constexpr int PACKS = fwd_packs<VEC>();
    __shared__ float scratch[2][32];
    int parity = 0; /* group_sum's buffer */
    const W *w = static_cast<const W *>(a.weight);
    const W *b = static_cast<const W *>(a.bias);
    const int packs_row = (int)(a.cols / VEC);
    /* A group is a power of two <= 32 or the whole block (norm.cuh): shifts, not divisions. */
    const bool one_row = Whole || group == (int)blockDim.x;
    const int group_shift = __ffs(group) - 1;
    const int groups_per_block = one_row ? 1 : (int)blockDim.x >> group_shift;
    const int local = one_row ? 0 : (int)threadIdx.x >> group_shift;
    const int lane = one_row ? (int)threadIdx.x : (int)threadIdx.x & (group - 1);
    const int64_t first_base = (int64_t)blockIdx.x * groups_per_block;
    const int64_t base_step = (int64_t)gridDim.x * groups_per_block;
    auto row_sum = [&](float v) { return group_sum<Whole>(v, group, scratch, parity); };
    /* A decode-sized call (NORM_DECODE_ROWS rows or fewer, the whole kernel's time counts) reads
     * w' and b only after the row's reductions, a second DRAM round trip after x's; prefetched
     * beside x's loads, the two overlap. Only there: prefetched at every block's start, they cost
     * the 16384 x 4096 16-bit rows a third of their speed on the H200 (the card's Tried table),
     * and larger calls find them in L2 anyway. */
    if (a.rows <= NORM_DECODE_ROWS && local == 0) { /* one row's group per block suffices */
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int j = lane + p * group;
            if (Whole || j < packs_row) {
                if (w)
                    tk_prefetch_l1(w + j * VEC);
                if (LayerNorm && b)
                    tk_prefetch_l1(b + j * VEC);
            }
        }
    }

    for (int64_t base = first_base; base < a.rows; base += base_step) {
        const int64_t row = base + local;
        const bool active = Whole || row < a.rows;
        auto in_row = [&](int j) { return Whole || (active && j < packs_row); };
        /* In-row offsets are 32-bit (cols <= 262144); only the row bases are 64-bit. */
        const T *__restrict__ x_row = static_cast<const T *>(a.x) + row * a.x_stride;
        T *__restrict__ res_row = Residual ? static_cast<T *>(a.residual) + row * a.residual_stride : nullptr;
        T *y_row = static_cast<T *>(a.y) + row * a.y_stride;
        tk_pack<T, VEC> h[PACKS], r[PACKS];
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int j = lane + p * group;
            if (in_row(j)) {
                h[p] = tk_load_pack<T, VEC>(x_row + j * VEC);
                if constexpr (Residual)
                    r[p] = tk_load_pack<T, VEC>(res_row + j * VEC);
            }
        }
        if constexpr (Residual)
            keep_packed(r); /* convert pack by pack in the add below, not all at once */
        float sum = 0.0f;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int j = lane + p * group;
            if (in_row(j)) {
                float f[VEC];
                if constexpr (Residual) {
                    float g[VEC];
                    tk_unpack(h[p], f);
                    tk_unpack(r[p], g);
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        h[p].v[e] = tk_from_float<T>(f[e] + g[e]);
                    tk_store_pack<T, VEC>(res_row + j * VEC, h[p]);
                }
                tk_unpack(h[p], f); /* the rounded h that was stored */
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    sum += f[e];
            }
        }
        keep_packed(h); /* reconvert below rather than hold VEC x PACKS floats */
        float mean = 0.0f;
        if constexpr (LayerNorm)
            mean = row_sum(sum) * inv_n;
        float squares = 0.0f;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int j = lane + p * group;
            if (in_row(j)) {
                float f[VEC];
                tk_unpack(h[p], f);
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    squares += (f[e] - mean) * (f[e] - mean);
            }
        }
        keep_packed(h);
        const float rstd = rsqrtf(row_sum(squares) * inv_n + a.eps);
        if (active && lane == 0) {
            if (a.rstd_out)
                a.rstd_out[row] = rstd;
            if (a.mean_out)
                a.mean_out[row] = mean;
        }
        /* y = (h - mu) rstd w' + b: with_scale_kind's copy of the loop for this call's kind. */
        with_scale_kind<LayerNorm>(a, [&](auto scale_kind, auto with_bias) {
            constexpr int kind = decltype(scale_kind)::value;
            constexpr bool bias = decltype(with_bias)::value;
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const int j = lane + p * group;
                if (in_row(j))
                    tk_store_pack<T, VEC>(y_row + j * VEC, normalise_pack<kind, bias>(
                                                               h[p], mean, rstd, [&] { return norm_load_raw<W, VEC>(w, j * VEC); },
                                                               [&] { return norm_load_raw<W, VEC>(b, j * VEC); }));
            }
        });
    }
}

/* The cluster kernel: one row per cluster, block `rank` taking packs [rank * slice_packs,
 * + slice_packs) of it (the last block fewer, never none: the launcher splits evenly). The slice
 * (and the residual's) lands in shared memory by bulk copies; the passes then read it there:
 * the sum (LayerNorm) or the sum of squares (RMSNorm), with the residual computing h = x + r,
 * storing it and writing it over x's copy so that the later passes read h; LayerNorm's sum of
 * (h - mu)^2 (exact two-pass variance); y. A thread reads in each pass the packs j = thread +
 * k * CLUSTER_THREADS (16-byte accesses, consecutive across the warp: no bank conflicts), and
 * only the packs it wrote, so no block barrier is needed between the passes. */
template <typename T, typename W, bool LayerNorm, bool Residual>
__global__ void __launch_bounds__(CLUSTER_THREADS, CLUSTER_MIN_BLOCKS)
    norm_fwd_cluster(tk_norm_call a, float inv_n, int slice_packs) {
#ifdef NORM_NO_CLUSTERS
    __trap();
#else
    constexpr int VEC = 16 / (int)sizeof(T);
    using pack = tk_pack<T, VEC>;
    extern __shared__ __align__(16) unsigned char staged[];
    pack *hs = reinterpret_cast<pack *>(staged); /* x's slice, then h */
    const pack *rs = hs + slice_packs;           /* the residual's */
    cluster_shared_state &st = cluster_shared();
    const int col0 = (int)__clusterRelativeBlockRank() * slice_packs * VEC;
    const int packs = min(slice_packs, (int)(a.cols - col0) / VEC);
    const int64_t row = blockIdx.x / __clusterSizeInBlocks();
    const T *x_row = static_cast<const T *>(a.x) + row * a.x_stride + col0;
    T *res_row = Residual ? static_cast<T *>(a.residual) + row * a.residual_stride + col0 : nullptr;
    T *y_row = static_cast<T *>(a.y) + row * a.y_stride + col0;
    const uint32_t loaded = tk_smem_address(&st.loaded);
    /* Thread 0 initialises the barriers and starts the copies at once (the proxy fence makes the
     * initialisation visible to the copies' complete_tx). */
    if (threadIdx.x == 0) {
        tk_mbarrier_init(loaded, 1);
        tk_mbarrier_init(tk_smem_address(&st.landed[0]), 1);
        tk_mbarrier_init(tk_smem_address(&st.landed[1]), 1);
        tk_fence_mbarrier_init();
        tk_fence_proxy_async_shared();
        const uint32_t bytes = (uint32_t)packs * (uint32_t)sizeof(pack);
        tk_mbarrier_arrive_expect_tx(loaded, Residual ? 2 * bytes : bytes);
        tk_bulk_load(tk_smem_address(hs), x_row, bytes, loaded);
        if constexpr (Residual)
            tk_bulk_load(tk_smem_address(rs), res_row, bytes, loaded);
    }
    tk_cluster_start(); /* with the copies in flight; publishes `loaded`'s initialisation too */
    tk_mbarrier_wait(loaded, 0);

    float first = 0.0f; /* LayerNorm: sum of h; RMSNorm: sum of h^2 */
#pragma unroll 4
    for (int j = threadIdx.x; j < packs; j += CLUSTER_THREADS) {
        pack h = hs[j];
        float f[VEC];
        if constexpr (Residual) {
            float g[VEC];
            tk_unpack(h, f);
            tk_unpack(rs[j], g);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                h.v[e] = tk_from_float<T>(f[e] + g[e]);
            tk_store_pack<T, VEC>(res_row + j * VEC, h);
            hs[j] = h;
        }
        tk_unpack(h, f); /* the rounded h that was stored */
#pragma unroll
        for (int e = 0; e < VEC; e++)
            first += LayerNorm ? f[e] : f[e] * f[e];
    }
    float mean = 0.0f, squares = first;
    if constexpr (LayerNorm) {
        mean = cluster_sum(first, 0) * inv_n;
        squares = 0.0f;
#pragma unroll 4
        for (int j = threadIdx.x; j < packs; j += CLUSTER_THREADS) {
            float f[VEC];
            tk_unpack(hs[j], f);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                squares += (f[e] - mean) * (f[e] - mean);
        }
    }
    const float rstd = rsqrtf(cluster_sum(squares, LayerNorm ? 1 : 0) * inv_n + a.eps);
    if (threadIdx.x == 0 && col0 == 0) { /* the cluster's first block */
        if (a.rstd_out)
            a.rstd_out[row] = rstd;
        if (a.mean_out)
            a.mean_out[row] = mean;
    }
    /* y, CHUNK packs at a time: their w' and b loads (L2 hits mostly: every row reads them) are
     * issued together, so that their round trips overlap, then the packs are normalised and
     * stored. 32 bytes of parameters a pack at most (f32 ones of a 16-bit row): 4 packs of 16
     * bytes or 2 of 32, up to 32 registers for w' and b together. */
    const W *w = static_cast<const W *>(a.weight);
    const W *b = static_cast<const W *>(a.bias);
    with_scale_kind<LayerNorm>(a, [&](auto scale_kind, auto with_bias) {
        constexpr int kind = decltype(scale_kind)::value;
        constexpr bool bias = decltype(with_bias)::value;
        constexpr int CHUNK = 64 / (int)sizeof(tk_pack<W, VEC>);
        for (int j0 = threadIdx.x; j0 < packs; j0 += CHUNK * CLUSTER_THREADS) {
            tk_pack<W, VEC> w_raw[CHUNK], b_raw[CHUNK];
#pragma unroll
            for (int u = 0; u < CHUNK; u++) {
                const int j = j0 + u * CLUSTER_THREADS;
                if (j < packs) {
                    w_raw[u] = param_raw<kind != SCALE_NONE, VEC>(w, col0 + j * VEC);
                    b_raw[u] = param_raw<bias, VEC>(b, col0 + j * VEC);
                }
            }
#pragma unroll
            for (int u = 0; u < CHUNK; u++) {
                const int j = j0 + u * CLUSTER_THREADS;
                if (j < packs)
                    tk_store_pack<T, VEC>(y_row + j * VEC, normalise_pack<kind, bias>(
                                                               hs[j], mean, rstd, [&] { return w_raw[u]; }, [&] { return b_raw[u]; }));
            }
        }
    });
#endif
}

/* Mean and sum of squared deviations of `count` values (Chan, Golub, LeVeque). */
struct moments {
    float count, mean, m2;
};

__device__ __forceinline__ moments combine(moments a, moments b) {
    if (b.count == 0.0f)
        return a;
    if (a.count == 0.0f)
        return b;
    const float count = a.count + b.count, delta = b.mean - a.mean, fb = b.count / count;
    return {count, a.mean + delta * fb, a.m2 + b.m2 + delta * delta * a.count * fb};
}

__device__ __forceinline__ moments shfl_down(moments m, int offset) {
    return {__shfl_down_sync(0xffffffffu, m.count, offset), __shfl_down_sync(0xffffffffu, m.mean, offset),
            __shfl_down_sync(0xffffffffu, m.m2, offset)};
}

/* Block-wide combination in a fixed tree order; every thread gets the result. */
__device__ __forceinline__ moments block_moments(moments m, moments *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        m = combine(m, shfl_down(m, offset));
    __syncthreads(); /* scratch may still be read by the previous row */
    if (lane == 0)
        scratch[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < warps ? scratch[lane] : moments{0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1)
            m = combine(m, shfl_down(m, offset));
        if (lane == 0)
            scratch[32] = m;
    }
    __syncthreads();
    return scratch[32];
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(WIDE_THREADS) norm_fwd_wide(tk_norm_call a) {
    __shared__ moments scratch[33];
    const T *__restrict__ x = static_cast<const T *>(a.x);
    T *__restrict__ res = static_cast<T *>(a.residual);
    const W *w = static_cast<const W *>(a.weight);
    const W *b = static_cast<const W *>(a.bias);
    T *y = static_cast<T *>(a.y);
    const int64_t packs_row = a.cols / VEC;
    const int64_t step = (int64_t)blockDim.x * WIDE_UNROLL;

    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const T *x_row = x + row * a.x_stride;
        T *res_row = res ? res + row * a.residual_stride : nullptr;
        /* Pass 1: per-thread sums of (h - shift) and its square, shift = the thread's first
         * value (LayerNorm; 0 for RMSNorm), which keeps the f32 sums free of cancellation. */
        float count = 0.0f, shift = 0.0f, s1 = 0.0f, s2 = 0.0f;
        for (int64_t j0 = threadIdx.x; j0 < packs_row; j0 += step) {
            tk_pack<T, VEC> h[WIDE_UNROLL], r[WIDE_UNROLL];
#pragma unroll
            for (int u = 0; u < WIDE_UNROLL; u++) {
                const int64_t j = j0 + (int64_t)u * blockDim.x;
                if (j < packs_row) {
                    h[u] = tk_load_pack<T, VEC>(x_row + j * VEC);
                    if (res)
                        r[u] = tk_load_pack<T, VEC>(res_row + j * VEC);
                }
            }
#pragma unroll
            for (int u = 0; u < WIDE_UNROLL; u++) {
                const int64_t j = j0 + (int64_t)u * blockDim.x;
                if (j < packs_row) {
                    if (res) {
#pragma unroll
                        for (int e = 0; e < VEC; e++)
                            h[u].v[e] = tk_from_float<T>(tk_to_float(h[u].v[e]) + tk_to_float(r[u].v[e]));
                        tk_store_pack<T, VEC>(res_row + j * VEC, h[u]);
                    }
                    if (a.layernorm && count == 0.0f)
                        shift = tk_to_float(h[u].v[0]);
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const float d = tk_to_float(h[u].v[e]) - shift;
                        s1 += d;
                        s2 += d * d;
                    }
                    count += (float)VEC;
                }
            }
        }
        float mean = 0.0f, squares;
        if (a.layernorm) {
            const float m = count > 0.0f ? s1 / count : 0.0f;
            moments mine = {count, shift + m, count > 0.0f ? fmaxf(s2 - s1 * m, 0.0f) : 0.0f};
            const moments all = block_moments(mine, scratch);
            mean = all.mean;
            squares = all.m2;
        } else {
            squares = tk_block_sum(s2, reinterpret_cast<float *>(scratch));
        }
        const float rstd = rsqrtf(squares / (float)a.cols + a.eps);
        if (threadIdx.x == 0) {
            if (a.rstd_out)
                a.rstd_out[row] = rstd;
            if (a.mean_out)
                a.mean_out[row] = mean;
        }
        /* Pass 2: the thread reads back the packs it read (or wrote, as residual) in pass 1. */
        const T *h_row = res ? res_row : x_row;
        T *y_row = y + row * a.y_stride;
        for (int64_t j0 = threadIdx.x; j0 < packs_row; j0 += step) {
            tk_pack<T, VEC> h[WIDE_UNROLL];
#pragma unroll
            for (int u = 0; u < WIDE_UNROLL; u++) {
                const int64_t j = j0 + (int64_t)u * blockDim.x;
                if (j < packs_row)
                    h[u] = tk_load_pack<T, VEC>(h_row + j * VEC);
            }
#pragma unroll
            for (int u = 0; u < WIDE_UNROLL; u++) {
                const int64_t j = j0 + (int64_t)u * blockDim.x;
                if (j < packs_row) {
                    float scale[VEC], bias[VEC];
                    norm_load_scale<W, VEC>(w, a.gemma, j * VEC, scale);
                    if (b)
                        norm_load_params<W, VEC>(b, j * VEC, bias);
                    tk_pack<T, VEC> out;
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const float v = (tk_to_float(h[u].v[e]) - mean) * rstd * scale[e];
                        out.v[e] = tk_from_float<T>(b ? v + bias[e] : v);
                    }
                    tk_store_pack<T, VEC>(y_row + j * VEC, out);
                }
            }
        }
    }
}

/* The rows kernel of one layout. */
template <typename T, typename W, int VEC, int Threads, bool Whole>
cudaError_t launch_rows(const tk_norm_call *a, dim3 grid, norm_rows_shape s, float inv_n, cudaStream_t stream) {
    const auto kernel = a->layernorm ? (a->residual ? norm_fwd_rows<T, W, VEC, Threads, true, true, Whole>
                                                    : norm_fwd_rows<T, W, VEC, Threads, true, false, Whole>)
                                     : (a->residual ? norm_fwd_rows<T, W, VEC, Threads, false, true, Whole>
                                                    : norm_fwd_rows<T, W, VEC, Threads, false, false, Whole>);
    return tk_launch(kernel, grid, s.threads, 0, stream, *a, s.group, inv_n);
}

/* The same, whole rows or not. */
template <typename T, typename W, int VEC, int Threads>
cudaError_t launch_whole_or_not(const tk_norm_call *a, bool whole, dim3 grid, norm_rows_shape s, float inv_n,
                                cudaStream_t stream) {
    return whole ? launch_rows<T, W, VEC, Threads, true>(a, grid, s, inv_n, stream)
                 : launch_rows<T, W, VEC, Threads, false>(a, grid, s, inv_n, stream);
}

/* The cluster kernel of one op: a grid of one cluster per row (the host checked that rows x
 * blocks fits the grid), each block with its slice (and the residual's) as dynamic shared
 * memory, opted in once for the largest (2 x 32 KB).
 * With `resident`, nothing is launched: *resident is how many clusters of this shape the device
 * holds at once with the largest slices (tk_clusters_resident), which the variant's supports
 * asks, since a part with few SMs per GPC (a MIG slice) may hold none, where the launch would
 * fail; any smaller slice fits where the largest does. */
template <typename T, typename W, bool LayerNorm, bool Residual>
cudaError_t launch_cluster_op(const tk_norm_call *a, const tk_device *dev, int blocks_per_row, int slice_packs,
                              cudaStream_t stream, int *resident) {
    constexpr auto kernel = norm_fwd_cluster<T, W, LayerNorm, Residual>;
    constexpr int tensors = Residual ? 2 : 1;
    constexpr size_t largest_smem = (size_t)tensors * CLUSTER_SLICE_PACKS * 16;
    cudaError_t err = tk_opt_in_smem<kernel>(dev, (int)largest_smem);
    if (err != cudaSuccess)
        return err;
    if (resident) {
        static tk_device_cache<TK_NORM_CLUSTER_MAX_BLOCKS - 1> cache; /* slot blocks_per_row - 2 */
        return tk_clusters_resident<kernel>(dev, cache, blocks_per_row - 2,
                                            tk_launch_config(dim3(), CLUSTER_THREADS, largest_smem, nullptr),
                                            blocks_per_row, resident);
    }
    cudaLaunchAttribute cluster = tk_cluster_attribute(blocks_per_row);
    const cudaLaunchConfig_t cfg = tk_launch_config(dim3((unsigned)(a->rows * blocks_per_row)), CLUSTER_THREADS,
                                                    (size_t)tensors * slice_packs * 16, stream, &cluster, 1);
    return tk_launch(cfg, kernel, *a, 1.0f / (float)a->cols, slice_packs);
}

/* Cluster rows: the fewest 32 KB slices that hold the row (at most TK_NORM_CLUSTER_MAX_BLOCKS, as
 * the host checked), as even as whole packs allow: a 65536-wide bf16 row is 4 slices of 2048
 * packs, 40000 f32 5 of 2000, 65544 bf16 (8193 packs) 5 of 1639, the last 1637. */
template <typename T, typename W>
cudaError_t launch_cluster(const tk_norm_call *a, const tk_device *dev, cudaStream_t stream, int *resident) {
    const int64_t packs_row = a->cols / (16 / (int64_t)sizeof(T));
    const int blocks_per_row = (int)((packs_row + CLUSTER_SLICE_PACKS - 1) / CLUSTER_SLICE_PACKS);
    const int slice_packs = (int)((packs_row + blocks_per_row - 1) / blocks_per_row);
    const int b = blocks_per_row, s = slice_packs;
    if (a->layernorm)
        return a->residual ? launch_cluster_op<T, W, true, true>(a, dev, b, s, stream, resident)
                           : launch_cluster_op<T, W, true, false>(a, dev, b, s, stream, resident);
    return a->residual ? launch_cluster_op<T, W, false, true>(a, dev, b, s, stream, resident)
                       : launch_cluster_op<T, W, false, false>(a, dev, b, s, stream, resident);
}

enum fwd_kernel { ROWS, CLUSTER, WIDE };

template <typename T, typename W, int VEC>
cudaError_t launch(const tk_norm_call *a, fwd_kernel which, const tk_device *dev, cudaStream_t stream,
                   int *resident) {
    if (which == WIDE) {
        constexpr auto kernel = norm_fwd_wide<T, W, VEC>;
        int64_t wave;
        const cudaError_t err = tk_wave_blocks<kernel>(dev, WIDE_THREADS, 0, &wave);
        if (err != cudaSuccess)
            return err;
        return tk_launch(kernel, (unsigned)(a->rows < wave ? a->rows : wave), WIDE_THREADS, 0, stream, *a);
    }
    if constexpr (VEC > 1) {
        if (which == CLUSTER)
            return launch_cluster<T, W>(a, dev, stream, resident);
    }
    constexpr int packs = fwd_packs<VEC>(), small = rows_small_threads<T, VEC>(), big = TK_NORM_ROWS_MAX_THREADS;
    const int64_t packs_row = a->cols / VEC;
    const norm_rows_shape s = norm_shape_for((packs_row + packs - 1) / packs);
    const int groups_per_block = s.threads / s.group;
    /* One block per row group, not a persistent grid: blocks in different phases (loading,
     * reducing, storing) then share each SM. The kernel strides only past the grid limit. */
    int64_t groups = (a->rows + groups_per_block - 1) / groups_per_block;
    if (groups > 0x7fffffff)
        groups = 0x7fffffff;
    const dim3 grid((unsigned)(groups < 1 ? 1 : groups));
    const float inv_n = 1.0f / (float)a->cols; /* here, not a division per thread */
    /* Whole rows only for 16-byte packs: e.g. 2048..16384 in steps of 1024 for 16-bit rows. */
    if constexpr (VEC > 1) {
        const bool whole = s.group == s.threads && packs_row == (int64_t)packs * s.threads;
        if (s.threads > small)
            return launch_whole_or_not<T, W, VEC, big>(a, whole, grid, s, inv_n, stream);
        return launch_whole_or_not<T, W, VEC, small>(a, whole, grid, s, inv_n, stream);
    }
    return launch_rows<T, W, VEC, small, false>(a, grid, s, inv_n, stream);
}

template <typename T, int VEC>
cudaError_t launch_weight(const tk_norm_call *a, fwd_kernel which, const tk_device *dev, cudaStream_t stream,
                          int *resident) {
    if (a->weight_dtype == TK_F32)
        return launch<T, float, VEC>(a, which, dev, stream, resident);
    return launch<T, T, VEC>(a, which, dev, stream, resident);
}

/* 16-byte packs (vec) or elements; the rows kernel (on one block or a cluster) or the wide one.
 * With `resident` (the cluster kernel only), the residency query of launch_cluster_op. */
cudaError_t launch_variant(const void *call, bool vec, fwd_kernel which, const tk_device *dev, cudaStream_t stream,
                           int *resident = nullptr) {
    const tk_norm_call *a = static_cast<const tk_norm_call *>(call);
    return tk_dispatch_dtype(a->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return vec ? launch_weight<T, tk_pack_width<T>(true)>(a, which, dev, stream, resident)
                   : launch_weight<T, 1>(a, which, dev, stream, resident);
    });
}

} // namespace

extern "C" cudaError_t tk_launch_norm_fwd_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, true, ROWS, dev, stream);
}

extern "C" cudaError_t tk_launch_norm_fwd_cluster_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, true, CLUSTER, dev, stream);
}

extern "C" bool tk_norm_fwd_cluster_resident(const void *call, const tk_device *dev) {
    int resident = 0;
    return launch_variant(call, true, CLUSTER, dev, nullptr, &resident) == cudaSuccess && resident > 0;
}

extern "C" cudaError_t tk_launch_norm_fwd_scalar(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, false, ROWS, dev, stream);
}

extern "C" cudaError_t tk_launch_norm_fwd_wide_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, true, WIDE, dev, stream);
}

extern "C" cudaError_t tk_launch_norm_fwd_wide_scalar(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, false, WIDE, dev, stream);
}
