/*
 * Row softmax and log-softmax, forward and backward, with a scale and an optional causal mask
 * (conventions and formulas in include/tkern.h, tk_softmax_params). Per row of visible length
 * len (masked columns are written but not read, except for the rest of the 16-byte pack that
 * holds column len), in base 2 so that each exponential is one FFMA + MUFU.EX2:
 *
 *     t_c = x_c * scale * log2(e),  m = max_c t_c,  s = sum_c 2^(t_c - m),  lse = m + log2 s
 *     softmax y_c = 2^(t_c - lse)                   log-softmax y_c = (t_c - lse) * ln 2
 *     backward: softmax dx_c = scale y_c (dy_c - sum dy y),  log dx_c = scale (dy_c - e^y_c sum dy)
 *
 * The op is memory-bound, but only just for 16-bit data: 4 bytes per element moved against two
 * exponentials and ~10 other instructions, and the row kernels' time follows their instruction
 * count per element (docs/kernels/softmax.md). So the per-element work is cut to the minimum:
 * the max is taken on the raw packs, two bf16 / f16 at a time and before any conversion (max
 * and min of x, times the scale once); the sum is FFMA + EX2 + FADD; the output folds the
 * division by the sum into the exponent (2^(t - lse)) and converts two elements per
 * instruction. Four row mappings:
 *
 * "regs" (rows that fit on chip): the row is loaded once into registers, as raw 16-byte packs
 * (ROWS_PACKS = 4 per thread forward, 32 bf16 elements = 16 registers; 2 of y and 2 of dy
 * backward), then reduced and written from the registers: exactly one read and one write per
 * element. keep_packed() stops the compiler from keeping f32 copies of the row alive across
 * the reductions. Threads per row tpr = packs / PACKS rounded up: up to 32 it is a power of two
 * (at least one lane per element of a partial last pack) and a 128-thread block holds
 * 128 / tpr rows, reduced with shuffles only; past 32 one block holds one row (64..1024
 * threads), and each reduction (max, then sum; the dot backward) costs ONE barrier: every warp
 * writes its partial to double-buffered shared memory and reads all of them. Forward rows reach
 * 1024 x 4 x 8 = 32768 bf16 / f16 (16384 f32), backward half that. Every thread issues all its
 * loads before the first use. Grid: one block per row group (see launch_rows); blocks stride
 * only past the grid limit. The 16384 x 4096 bf16 benchmark is one block of 128 threads x
 * 4 packs per row, 56 registers: 9 blocks per SM.
 *
 * "stream" (any width, e.g. 131072-wide vocabulary rows): one block of 512 threads per row.
 * Pass 1 reads the row in chunks of 512 x UNROLL packs (4 forward, 2 per tensor backward:
 * 32 KB in flight per block) and keeps a running (max, sum) per thread with the online
 * rescaling s = s 2^(m_old - m_new) + ..., combined across the block at the end; backward just
 * sums (dy alone for the log-softmax, which does not read y in pass 1). Pass 2 re-reads the row
 * with last-use loads (ld.global.cs) and writes the output with streaming stores. The grid is
 * limited to max(SM count, L2 bytes / 2 / re-read row bytes) blocks so that the rows being
 * worked on (132 x 256 KB = 33 MB for 131072 bf16 columns) stay in the H200's 60 MB L2 and
 * pass 2 hits L2. One block per SM alternates between a load-only and a store-only phase,
 * which is what the pipelined kernel removes.
 *
 * "pipelined" (sm_90, both directions; the library sends it rows of 64 to 512 KB): the stream's
 * two passes interleaved. A block writes row r (pass 2: re-read from L2, outputs) and reads row
 * r + 1 of its sequence (pass 1: (max, sum) forward, the dot backward) in the same loop, chunk by
 * chunk, so that DRAM sees reads and writes all along; the loads of the next chunk (at the end
 * of a row, the next row's first one) are issued before the current chunk is used, so nothing
 * drains at row ends. A block has two slices in L2 (the one it re-reads, the one it reads), so a
 * row is split into slices that keep at most 128 KB in L2 each, one 512-thread block per SM:
 * 132 x 2 x 128 KB = 33 MB in flight on an H200 (60 MB of L2). The softmax backward re-reads
 * y and dy, so its slices are 64 KB of each, twice the blocks of the forward; the log-softmax
 * backward's pass 1 reads dy alone, and its pass 2 reads y once, from DRAM. A chunk holds 4
 * packs per thread forward and 2 of each tensor backward: the same bytes in flight and about
 * the same registers. A row of more than one slice runs on a thread-block cluster whose blocks
 * send each other their parts of the row's statistic with st.async into shared memory, counted
 * on the receiver's mbarrier, which does not wait for the sender's global stores as the release
 * of barrier.cluster does; a row of one slice runs on one block without a cluster. Where a
 * slice is a single chunk (few rows widened over up to 16 blocks, e.g. one 131072-word decode
 * row: 16-32 KB a block), pass 1's chunk is still in registers when the row's statistic
 * arrives, so pass 2 computes from it and does not read the slice again: the re-read cost L2
 * traffic, load instructions and a second chunk of registers for words already held. It is a
 * template parameter because it changes the register plan; larger slices do not fit a thread's
 * registers and are re-read. The cluster's blocks meet once, at the start, in a relaxed barrier
 * that the first chunk's loads overlap (tk_cluster_start), and not at the exit: each block has
 * waited on its own mbarrier for every part sent to it. A chunk is held as raw 32-bit words, not
 * as packs of 16-bit elements (pack_words). Measurements and what was tried:
 * docs/kernels/softmax.md.
 *
 * The "scalar" variants are the same kernels with packs of one element: any element-aligned
 * pointer and stride (e.g. a tensor offset by 2 bytes), correct and slower. The cols % Vec
 * last elements of a vec16 row are loaded and stored one by one (row_tail).
 */
#include <type_traits>

#include "tkern.h"

#include "common.cuh"
#include "core/math.cuh"
#include "core/sm90.cuh"
#include "softmax.h"

namespace {

constexpr int ROWS_PACKS = 4;     /* packs of x a thread holds, forward */
constexpr int ROWS_PACKS_BWD = 2; /* softmax backward: of y and of dy */
constexpr int ROWS_MAX_THREADS = 1024;
constexpr int REGS_GROUP_BLOCK = 128; /* block size when several rows share a block */
constexpr int STREAM_THREADS = 512;
constexpr int STREAM_UNROLL_FWD = 4;
constexpr int STREAM_UNROLL_BWD = 2;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.69314718055994531f;

/* row % period (row >= 0, period > 0): a 32-bit remainder when both fit (tensors of fewer
 * than 2^32 rows), else shift-and-subtract. Not the 64-bit `%`: that calls a routine, and the
 * registers saved around the call made the rows kernels spill. */
__device__ __forceinline__ int64_t row_in_period(int64_t row, int64_t period) {
    if (((row | period) >> 32) == 0)
        return (int64_t)((uint32_t)row % (uint32_t)period);
    uint64_t r = 0;
    for (int bit = 63; bit >= 0; bit--) {
        r = r << 1 | ((uint64_t)row >> bit & 1); /* r < period <= 2^63: no overflow */
        if (r >= (uint64_t)period)
            r -= (uint64_t)period;
    }
    return (int64_t)r;
}

/* Columns of `row` that are visible (host clamped causal_offset to [-period, cols]; cols < 2^31). */
__device__ __forceinline__ int visible_len(const tk_softmax_call &a, int64_t row) {
    if (!a.causal)
        return (int)a.cols;
    const int64_t len = row_in_period(row, a.causal_period) + a.causal_offset + 1;
    return (int)(len < 0 ? 0 : (len > a.cols ? a.cols : len));
}

/* Last-use load of a whole pack (evict-first in L1 and L2). */
template <typename T, int Vec> __device__ __forceinline__ tk_pack<T, Vec> load_last_use(const T *p) {
    tk_pack<T, Vec> r;
    if constexpr (sizeof(T) * Vec == 16) {
        *reinterpret_cast<uint4 *>(&r) = __ldcs(reinterpret_cast<const uint4 *>(p));
    } else {
        static_assert(Vec == 1, "packs are 16 bytes or one element");
        r.v[0] = __ldcs(p);
    }
    return r;
}

template <typename T, int Vec> __device__ __forceinline__ void store_streaming(T *p, const tk_pack<T, Vec> &v) {
    if constexpr (sizeof(T) * Vec == 16) {
        __stcs(reinterpret_cast<uint4 *>(p), *reinterpret_cast<const uint4 *>(&v));
    } else {
        static_assert(Vec == 1, "packs are 16 bytes or one element");
        __stcs(p, v.v[0]);
    }
}

template <typename T, int Vec, bool LastUse> __device__ __forceinline__ tk_pack<T, Vec> load(const T *p) {
    if constexpr (LastUse)
        return load_last_use<T, Vec>(p);
    else
        return tk_load_pack<T, Vec>(p);
}

/* What a kernel computes, as a template parameter where it changes the register plan: the
 * forward reads x; the softmax backward y and dy (for sum dy y); the log-softmax backward's
 * sum dy needs dy alone, so the pipelined kernel's pass 1 does not hold y. */
enum softmax_mode { FORWARD, BACKWARD, BACKWARD_LOG };

/* What a row's outputs are computed from (stream and pipelined kernels). Forward:
 * lse = m + log2 s (base 2); backward: sum dy y (softmax) or sum dy (log-softmax). */
struct row_stats {
    float lse, dot;
};

/* Accumulates one visible element into the pass-1 statistics: the sum of 2^(t - m) forward,
 * the dot backward. */
template <bool Backward>
__device__ __forceinline__ void accumulate(const tk_softmax_call &a, float x_or_y, float dy, float c2, float m,
                                           float *acc) {
    if constexpr (Backward)
        *acc += a.log ? dy : dy * x_or_y;
    else
        *acc += tk_exp2_approx(x_or_y * c2 - m);
}

/* Accumulates the visible elements of a pack starting at column c0. */
template <typename T, int Vec, bool Backward>
__device__ __forceinline__ void accumulate_pack(const tk_softmax_call &a, const tk_pack<T, Vec> &xs,
                                                const tk_pack<T, Vec> &gs, int c0, int len, float c2, float m,
                                                float *acc) {
    if (c0 + Vec <= len) {
        float x[Vec], g[Vec];
        tk_unpack(xs, x);
        tk_unpack(gs, g);
#pragma unroll
        for (int e = 0; e < Vec; e++)
            accumulate<Backward>(a, x[e], Backward ? g[e] : 0.0f, c2, m, acc);
    } else if (c0 < len) {
#pragma unroll
        for (int e = 0; e < Vec; e++)
            if (c0 + e < len)
                accumulate<Backward>(a, tk_to_float(xs.v[e]), Backward ? tk_to_float(gs.v[e]) : 0.0f, c2, m, acc);
    }
}

/* One output element at column c: from x (forward) or y and dy (backward) when visible, else 0
 * (-inf for the log-softmax forward). */
template <bool Backward>
__device__ __forceinline__ float output_value(const tk_softmax_call &a, const row_stats &st, float x_or_y, float dy,
                                              float c2, bool visible) {
    if (!visible)
        return (!Backward && a.log) ? -INFINITY : 0.0f;
    if constexpr (Backward) {
        return a.log ? a.scale * (dy - tk_exp2_approx(x_or_y * LOG2E) * st.dot) : a.scale * x_or_y * (dy - st.dot);
    } else {
        const float t = x_or_y * c2;
        return a.log ? (t - st.lse) * LN2 : tk_exp2_approx(t - st.lse); /* 2^(t - m) / s */
    }
}

template <typename T, int Vec, bool Backward>
__device__ __forceinline__ tk_pack<T, Vec> output_pack(const tk_softmax_call &a, const row_stats &st,
                                                       const tk_pack<T, Vec> &xs, const tk_pack<T, Vec> &gs, int c0,
                                                       int len, float c2) {
    float x[Vec], g[Vec], r[Vec];
    tk_unpack(xs, x);
    tk_unpack(gs, g);
    if (c0 + Vec <= len) { /* a whole visible pack: no test per element */
#pragma unroll
        for (int e = 0; e < Vec; e++)
            r[e] = output_value<Backward>(a, st, x[e], Backward ? g[e] : 0.0f, c2, true);
    } else {
#pragma unroll
        for (int e = 0; e < Vec; e++)
            r[e] = output_value<Backward>(a, st, x[e], Backward ? g[e] : 0.0f, c2, c0 + e < len);
    }
    return tk_pack_of<T, Vec>(r);
}

/* The last cols % Vec elements of a row (vec16 rows whose width is not a whole number of
 * packs, e.g. cols = 13 with a row stride of 16): one element for each of the first lanes of
 * the row's threads, kept beside the packs. */
template <typename T, int Vec> struct row_tail {
    int col; /* >= cols: this thread holds none */
    T x, g;
};

template <typename T, int Vec, bool Backward>
__device__ __forceinline__ row_tail<T, Vec> load_tail(const T *in_row, const T *dy_row, int cols, int len, int lane) {
    row_tail<T, Vec> t;
    t.col = cols / Vec * Vec + lane;
    if (lane >= Vec || t.col >= cols)
        t.col = cols;
    if (t.col < len) {
        t.x = in_row[t.col];
        if constexpr (Backward)
            t.g = dy_row[t.col];
    }
    return t;
}

/* ------------------------------------------------------------------------------- rows ---- */

/* Packs a thread holds per tensor: x forward, y and dy backward. */
template <int Mode> __host__ __device__ constexpr int rows_packs() {
    return Mode == FORWARD ? ROWS_PACKS : ROWS_PACKS_BWD;
}

/* The two reductions of a row: the forward max, and sums. */
struct op_max {
    static constexpr float identity = -INFINITY;
    static __device__ __forceinline__ float apply(float a, float b) { return fmaxf(a, b); }
};

struct op_sum {
    static constexpr float identity = 0.0f;
    static __device__ __forceinline__ float apply(float a, float b) { return a + b; }
};

/* Reduces v over the threads_per_row threads of a row, result in every one of them: within
 * aligned groups of lanes (threads_per_row <= 32), or over the block with ONE barrier: each warp
 * writes its partial, every warp reads all of them. The partials alternate between two buffers:
 * a buffer is written again two reductions later, after a barrier that every reader of its
 * previous contents has passed. Every thread combines the same partials in the same order (xor
 * shuffles are symmetric), so all get the same bits. */
template <typename Op>
__device__ __forceinline__ float row_reduce(float v, int threads_per_row, float (&scratch)[2][32], int &parity) {
    const int width = threads_per_row < 32 ? threads_per_row : 32;
    for (int offset = width >> 1; offset > 0; offset >>= 1)
        v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (threads_per_row <= 32)
        return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float *buf = scratch[parity];
    parity ^= 1;
    if (lane == 0)
        buf[warp] = v;
    __syncthreads();
    float r = lane < warps ? buf[lane] : Op::identity;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        r = Op::apply(r, __shfl_xor_sync(0xffffffffu, r, offset));
    return r;
}

/* Running max and min of a row's elements. Whole packs of 16-bit types are folded two elements
 * at a time into packed accumulators (HMNMX2 on the raw pack, no conversion); other elements
 * one at a time in f32. Like fmaxf, NaN elements are skipped (they make the sum NaN). */
template <typename T> struct pair_of {
    using type = float; /* no pairs */
};
template <> struct pair_of<__nv_bfloat16> {
    using type = __nv_bfloat162;
};
template <> struct pair_of<__half> {
    using type = __half2;
};

template <typename T, int Vec> struct row_extremes {
    static constexpr bool PAIRS = Vec % 2 == 0 && !std::is_same_v<typename pair_of<T>::type, float>;
    using T2 = typename pair_of<T>::type;
    float mx = -INFINITY, mn = INFINITY;
    T2 pmx, pmn;

    __device__ __forceinline__ row_extremes() {
        if constexpr (std::is_same_v<T2, __nv_bfloat162>) {
            pmx = __float2bfloat162_rn(-INFINITY);
            pmn = __float2bfloat162_rn(INFINITY);
        } else if constexpr (std::is_same_v<T2, __half2>) {
            pmx = __float2half2_rn(-INFINITY);
            pmn = __float2half2_rn(INFINITY);
        }
    }
    __device__ __forceinline__ void add(float x) {
        mx = fmaxf(mx, x);
        mn = fminf(mn, x);
    }
    __device__ __forceinline__ void add_pack(const tk_pack<T, Vec> &p) {
        if constexpr (PAIRS) {
#pragma unroll
            for (int i = 0; i < Vec / 2; i++) {
                const T2 w = reinterpret_cast<const T2 *>(p.v)[i];
                pmx = __hmax2(pmx, w);
                pmn = __hmin2(pmn, w);
            }
        } else {
#pragma unroll
            for (int e = 0; e < Vec; e++)
                add(tk_to_float(p.v[e]));
        }
    }
    /* The visible elements of the pack at column c0 (columns < pack_len). */
    __device__ __forceinline__ void add_visible(const tk_pack<T, Vec> &p, int c0, int pack_len) {
        if (c0 + Vec <= pack_len) {
            add_pack(p);
        } else if (c0 < pack_len) {
#pragma unroll
            for (int e = 0; e < Vec; e++)
                if (c0 + e < pack_len)
                    add(tk_to_float(p.v[e]));
        }
    }
    /* max of t = x * c2 over what was added (-inf if nothing was): one product, as t is monotonic
     * in x, and rounding it keeps it equal to the largest rounded t. */
    __device__ __forceinline__ float max_times(float c2) const {
        float hi = mx, lo = mn;
        if constexpr (PAIRS) {
            hi = fmaxf(hi, fmaxf(__low2float(pmx), __high2float(pmx)));
            lo = fminf(lo, fminf(__low2float(pmn), __high2float(pmn)));
        }
        if (!(hi >= lo))
            return -INFINITY;
        return (c2 >= 0.0f ? hi : lo) * c2;
    }
};

/* Calls f(e) for the visible elements e of the pack at column c0 (columns < pack_len): all of
 * them without a test for whole packs, each one tested only in the pack that holds column len. */
template <int Vec, typename F> __device__ __forceinline__ void for_visible(int c0, int pack_len, F f) {
    if (c0 + Vec <= pack_len) {
#pragma unroll
        for (int e = 0; e < Vec; e++)
            f(e);
    } else if (c0 < pack_len) {
#pragma unroll
        for (int e = 0; e < Vec; e++)
            if (c0 + e < pack_len)
                f(e);
    }
}

template <typename T, int Vec, int Mode>
__global__ void __launch_bounds__(ROWS_MAX_THREADS) softmax_rows_kernel(tk_softmax_call a, int threads_per_row) {
    constexpr int PACKS = rows_packs<Mode>();
    constexpr bool Backward = Mode != FORWARD;
    __shared__ float scratch[2][32];
    int parity = 0;
    const T *in = static_cast<const T *>(a.in);
    const T *dy = static_cast<const T *>(a.dy);
    T *out = static_cast<T *>(a.out);
    const int cols = (int)a.cols;
    const int whole = cols / Vec * Vec; /* columns covered by whole packs */
    const int rows_per_block = (int)blockDim.x / threads_per_row;
    const int group = (int)threadIdx.x / threads_per_row, lane = (int)threadIdx.x % threads_per_row;
    const float c2 = a.scale * LOG2E;

    /* Every thread of a block runs the same iterations (the reductions need all of them);
     * threads whose row is past the end take part with nothing visible and store nothing. */
    for (int64_t first = (int64_t)blockIdx.x * rows_per_block; first < a.rows;
         first += (int64_t)gridDim.x * rows_per_block) {
        const int64_t row = first + group;
        const bool active = row < a.rows;
        const int len = active ? visible_len(a, row) : 0;
        const int pack_len = len < whole ? len : whole;
        const T *in_row = in + row * a.in_stride;
        const T *dy_row = dy + row * a.in_stride;
        T *out_row = out + row * a.out_stride;
        /* Whole packs that start before len are loaded (a pack may straddle len). */
        tk_pack<T, Vec> xs[PACKS], gs[Backward ? PACKS : 1];
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int c0 = (p * threads_per_row + lane) * Vec;
            if (c0 < pack_len) {
                xs[p] = tk_load_pack<T, Vec>(in_row + c0);
                if constexpr (Backward)
                    gs[p] = tk_load_pack<T, Vec>(dy_row + c0);
            }
        }
        const row_tail<T, Vec> tail = load_tail<T, Vec, Backward>(in_row, dy_row, cols, len, lane);

        if constexpr (!Backward) {
            row_extremes<T, Vec> ext;
#pragma unroll
            for (int p = 0; p < PACKS; p++)
                ext.add_visible(xs[p], (p * threads_per_row + lane) * Vec, pack_len);
            if (tail.col < len)
                ext.add(tk_to_float(tail.x));
            keep_packed(xs);
            const float m = row_reduce<op_max>(ext.max_times(c2), threads_per_row, scratch, parity);
            const float shift = m == -INFINITY ? 0.0f : m; /* nothing visible, or only -inf */
            float s = 0.0f;
#pragma unroll
            for (int p = 0; p < PACKS; p++)
                for_visible<Vec>((p * threads_per_row + lane) * Vec, pack_len,
                                 [&](int e) { s += tk_exp2_approx(tk_to_float(xs[p].v[e]) * c2 - shift); });
            if (tail.col < len)
                s += tk_exp2_approx(tk_to_float(tail.x) * c2 - shift);
            keep_packed(xs);
            s = row_reduce<op_sum>(s, threads_per_row, scratch, parity);
            /* y = 2^(t - lse): the division by the sum folded into the exponent. lse = -inf
             * when nothing is visible (no visible output then). */
            const float lse = shift + log2f(s);
            if (active) {
#pragma unroll
                for (int p = 0; p < PACKS; p++) {
                    const int c0 = (p * threads_per_row + lane) * Vec;
                    float y[Vec];
                    if (a.log) {
#pragma unroll
                        for (int e = 0; e < Vec; e++)
                            y[e] = -INFINITY;
                        for_visible<Vec>(c0, pack_len,
                                         [&](int e) { y[e] = (tk_to_float(xs[p].v[e]) * c2 - lse) * LN2; });
                    } else {
#pragma unroll
                        for (int e = 0; e < Vec; e++)
                            y[e] = 0.0f;
                        for_visible<Vec>(c0, pack_len,
                                         [&](int e) { y[e] = tk_exp2_approx(tk_to_float(xs[p].v[e]) * c2 - lse); });
                    }
                    if (c0 < whole)
                        tk_store_pack<T, Vec>(out_row + c0, tk_pack_of<T, Vec>(y));
                }
                if (tail.col < cols) {
                    const float t = tk_to_float(tail.x) * c2;
                    out_row[tail.col] = tk_from_float<T>(tail.col >= len ? (a.log ? -INFINITY : 0.0f)
                                                         : a.log       ? (t - lse) * LN2
                                                                       : tk_exp2_approx(t - lse));
                }
            }
        } else {
            constexpr bool Log = Mode == BACKWARD_LOG;
            float dot = 0.0f; /* sum dy y (softmax) or sum dy (log-softmax) */
#pragma unroll
            for (int p = 0; p < PACKS; p++)
                for_visible<Vec>((p * threads_per_row + lane) * Vec, pack_len, [&](int e) {
                    dot += Log ? tk_to_float(gs[p].v[e]) : tk_to_float(xs[p].v[e]) * tk_to_float(gs[p].v[e]);
                });
            if (tail.col < len)
                dot += Log ? tk_to_float(tail.g) : tk_to_float(tail.x) * tk_to_float(tail.g);
            keep_packed(xs);
            keep_packed(gs);
            dot = row_reduce<op_sum>(dot, threads_per_row, scratch, parity);
            if (active) {
#pragma unroll
                for (int p = 0; p < PACKS; p++) {
                    const int c0 = (p * threads_per_row + lane) * Vec;
                    float dx[Vec];
#pragma unroll
                    for (int e = 0; e < Vec; e++)
                        dx[e] = 0.0f;
                    for_visible<Vec>(c0, pack_len, [&](int e) {
                        const float y = tk_to_float(xs[p].v[e]), g = tk_to_float(gs[p].v[e]);
                        dx[e] = Log ? a.scale * (g - tk_exp2_approx(y * LOG2E) * dot) : a.scale * y * (g - dot);
                    });
                    if (c0 < whole)
                        tk_store_pack<T, Vec>(out_row + c0, tk_pack_of<T, Vec>(dx));
                }
                if (tail.col < cols) {
                    const float y = tk_to_float(tail.x), g = tk_to_float(tail.g);
                    out_row[tail.col] = tk_from_float<T>(tail.col >= len ? 0.0f
                                                         : Log ? a.scale * (g - tk_exp2_approx(y * LOG2E) * dot)
                                                               : a.scale * y * (g - dot));
                }
            }
        }
    }
}

/* ----------------------------------------------------------------------------- stream ---- */

template <typename T, int Vec, bool Backward>
__global__ void __launch_bounds__(STREAM_THREADS, 1) softmax_stream_kernel(tk_softmax_call a) {
    constexpr int UNROLL = Backward ? STREAM_UNROLL_BWD : STREAM_UNROLL_FWD;
    __shared__ float scratch[32];
    const T *in = static_cast<const T *>(a.in);
    const T *dy = static_cast<const T *>(a.dy);
    T *out = static_cast<T *>(a.out);
    const int cols = (int)a.cols;
    const int whole = cols / Vec * Vec; /* columns covered by whole packs */
    const int chunk = (int)blockDim.x * UNROLL * Vec;
    const float c2 = a.scale * LOG2E;

    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const int len = visible_len(a, row);
        const int pack_len = len < whole ? len : whole;
        const T *in_row = in + row * a.in_stride;
        const T *dy_row = dy + row * a.in_stride;
        T *out_row = out + row * a.out_stride;
        const row_tail<T, Vec> tail = load_tail<T, Vec, Backward>(in_row, dy_row, cols, len, threadIdx.x);

        /* Pass 1: statistics. Plain loads: the row stays in L2 for pass 2. */
        float m = -INFINITY, acc = 0.0f; /* forward: running max and sum; backward: the dot */
#pragma unroll 1
        for (int base = 0; base < pack_len; base += chunk) {
            tk_pack<T, Vec> xs[UNROLL], gs[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int c0 = base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec;
                if (c0 < pack_len) {
                    if (!(Backward && a.log)) /* the log-softmax backward sums dy alone */
                        xs[u] = load<T, Vec, false>(in_row + c0);
                    if constexpr (Backward)
                        gs[u] = load<T, Vec, false>(dy_row + c0);
                }
            }
            if constexpr (Backward) {
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
                    accumulate_pack<T, Vec, true>(a, xs[u], gs[u], base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec,
                                                  pack_len, c2, 0.0f, &acc);
            } else {
                row_extremes<T, Vec> ext;
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
                    ext.add_visible(xs[u], base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec, pack_len);
                keep_packed(xs);
                const float chunk_max = ext.max_times(c2);
                if (chunk_max > m) { /* rescale the sum to the new maximum (0 * 0 when m = -inf) */
                    acc *= tk_exp2_approx(m - chunk_max);
                    m = chunk_max;
                }
                if (m != -INFINITY) { /* all -inf so far: nothing to add */
#pragma unroll
                    for (int u = 0; u < UNROLL; u++)
                        accumulate_pack<T, Vec, false>(a, xs[u], gs[u],
                                                       base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec,
                                                       pack_len, c2, m, &acc);
                }
            }
        }
        row_stats st;
        if constexpr (Backward) {
            if (tail.col < len)
                accumulate<true>(a, tk_to_float(tail.x), tk_to_float(tail.g), c2, 0.0f, &acc);
            st.dot = tk_block_sum(acc, scratch);
        } else {
            if (tail.col < len) {
                const float t = tk_to_float(tail.x) * c2;
                if (t > m) {
                    acc *= tk_exp2_approx(m - t);
                    m = t;
                }
                if (m != -INFINITY)
                    acc += tk_exp2_approx(t - m);
            }
            const float row_m = tk_block_max(m, scratch);
            const float scaled = m == -INFINITY ? 0.0f : acc * tk_exp2_approx(m - row_m);
            st.lse = row_m + log2f(tk_block_sum(scaled, scratch)); /* -inf: nothing visible */
        }

        /* Pass 2: re-read (last use) and write every whole pack, masked columns included. */
#pragma unroll 1
        for (int base = 0; base < whole; base += chunk) {
            tk_pack<T, Vec> xs[UNROLL], gs[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int c0 = base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec;
                if (c0 < pack_len) {
                    xs[u] = load<T, Vec, true>(in_row + c0);
                    if constexpr (Backward)
                        gs[u] = load<T, Vec, true>(dy_row + c0);
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int c0 = base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec;
                if (c0 < whole)
                    store_streaming<T, Vec>(out_row + c0, output_pack<T, Vec, Backward>(a, st, xs[u], gs[u], c0, len, c2));
            }
        }
        if (tail.col < cols)
            out_row[tail.col] = tk_from_float<T>(output_value<Backward>(
                a, st, tk_to_float(tail.x), Backward ? tk_to_float(tail.g) : 0.0f, c2, tail.col < len));
    }
}

/* -------------------------------------------------------------------------- pipelined ---- */

constexpr int PIPE_THREADS = 512;
/* Blocks per cluster: the L2 budget below needs at most the portable 8, which every sm_90 device
 * schedules; a row gets up to 16 (non-portable: where the device allows it) only when rows are
 * too few to fill the SMs (launch_pipelined). */
constexpr int PIPE_PORTABLE_BLOCKS = 8, PIPE_MAX_BLOCKS = 16;
/* Most of a row that one block keeps in L2 between its passes, over the tensors pass 2 re-reads
 * (x; y and dy for the softmax backward, so 64 KB of each; dy for the log-softmax backward). */
constexpr int64_t PIPE_SLICE_BYTES = 131072;
/* The least of a row's tensor that a block streams when few rows spread over more blocks: half a
 * chunk (PIPE_THREADS x 2 packs), so that the exchange of the row's statistic, whose cost does not
 * shrink with the slice, stays small beside it. */
constexpr int64_t PIPE_MIN_SLICE_BYTES = 16384;
/* The rows the library sends to this kernel (any dtype, both directions): whole packs of 64 to
 * 512 KB, on 1 to 4 blocks (to 8 for the softmax backward; to 16 for few rows); from 64 KB the
 * forward is faster than the regs kernel, up to 512 KB than the stream (docs/kernels/softmax.md). */
constexpr int64_t PIPE_MIN_BYTES = 65536, PIPE_MAX_BYTES = 4 * PIPE_SLICE_BYTES;
static_assert(2 * PIPE_MAX_BYTES <= PIPE_PORTABLE_BLOCKS * PIPE_SLICE_BYTES,
              "a softmax backward row (y and dy re-read) fits the slices of one portable cluster");

/* A part of a row's pass-1 statistic. Forward, a partial softmax denominator: s = sum 2^(t - m)
 * over some elements, m their max (-inf and s = 0 for none); two parts combine like the online
 * rescaling of the stream. Backward: s a part of sum dy y (of sum dy for the log-softmax), m = 0
 * and unused, so that both directions exchange the same 8 bytes. */
struct max_sum {
    float m, s;
};

/* Packs per thread, row and tensor in one chunk: 4 of x forward, 2 of y and 2 of dy backward:
 * the same 32 KB of a row in flight per block, within the same 128 registers a thread. */
constexpr int PIPE_UNROLL = 4, PIPE_UNROLL_BWD = 2;
template <int Mode> constexpr int pipe_unroll() { return Mode == FORWARD ? PIPE_UNROLL : PIPE_UNROLL_BWD; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

template <bool Backward> __device__ __forceinline__ max_sum combine(max_sum a, max_sum b) {
    if constexpr (Backward) {
        return {a.m, a.s + b.s};
    } else {
        const float m = fmaxf(a.m, b.m);
        if (m == -INFINITY)
            return {m, 0.0f};
        return {m, a.s * tk_exp2_approx(a.m - m) + b.s * tk_exp2_approx(b.m - m)}; /* commutative, bit for bit */
    }
}

template <bool Backward> __device__ __forceinline__ max_sum warp_combine(max_sum v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = combine<Backward>(v,
                              {__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)});
    return v;
}

#endif

/* A 16-byte pack as four 32-bit words, as the pipelined kernel holds its chunks. Held as
 * packs of bf16 (tk_pack), a pack loaded under a condition was kept as 16-bit values, and the
 * SASS merged each loaded register into them with PRMTs placed right after the load: the
 * thread waited there for the data, so the next chunk's loads were not in flight while the
 * current chunk was used. Words are merged by the load itself (a predicated LDG.128 into the
 * live registers, as for f32), and split into elements only where they are used. */
struct pack_words {
    uint32_t w[4];
};

template <bool LastUse> __device__ __forceinline__ pack_words load_words(const void *p) {
    const uint4 v = LastUse ? __ldcs(static_cast<const uint4 *>(p)) : *static_cast<const uint4 *>(p);
    return {{v.x, v.y, v.z, v.w}};
}

template <typename T, int Vec> __device__ __forceinline__ tk_pack<T, Vec> as_pack(const pack_words &words) {
    static_assert(sizeof(T) * Vec == 16, "16-byte packs");
    tk_pack<T, Vec> p;
    memcpy(&p, &words, 16);
    return p;
}

/* A row as the pipelined kernel sees it: row < 0 for none. */
struct pipe_row {
    int64_t row;
    int len;      /* visible columns */
    int load_end; /* column past this block's visible whole packs */
};

/* A cluster of tk_cluster_blocks() blocks (one per SM) streams rows first_row, first_row +
 * clusters, ...; block `rank` owns packs [rank * slice_packs, +slice_packs) of each (the last
 * block fewer, and the cols % Vec last elements). Iteration k writes row k - 1 (pass 2: re-read
 * with last-use loads, outputs) and reads row k (pass 1: statistics) in the same chunks, so that
 * DRAM sees reads and writes all along; the loads of the chunk after the current one, including
 * the first chunk of the next iteration, are issued before the current one is used, so they are
 * in flight during the exchange of row k's statistic.
 * Mode (softmax_mode): forward, pass 1 reads x for (max, sum) and pass 2 re-reads x from L2 and
 * writes y. Backward, pass 1 reads y and dy for sum dy y and pass 2 re-reads both from L2 and
 * writes dx; the log-softmax backward's pass 1 reads dy alone for sum dy, so its pass 2 reads y
 * from DRAM for the first time (and dy from L2), which keeps reads and writes mixed all the same.
 * Cluster: launched as clusters of 2 to PIPE_MAX_BLOCKS blocks, which exchange their parts with
 * st.async. Otherwise one block per row, launched without clusters (st.async is undefined in a
 * cluster of one block): its warps combine their parts in its own shared memory behind one
 * barrier. OneChunk (clusters whose slices are at most one chunk, slice_packs <= Threads x
 * Unroll): pass 2 takes the words of row nxt that pass 1 loaded into the chunk (the log-softmax
 * backward's y, which pass 1 does not read, is still loaded for pass 2). Threads per block and
 * Unroll packs per thread, row and tensor in a chunk: the library's are PIPE_THREADS and
 * pipe_unroll<Mode>(); experiments/softmax_long_rows.cu (commit 93c5117) timed other forward
 * shapes. */
template <typename T, int Vec, int Mode, int Threads, int Unroll, bool Cluster, bool OneChunk>
__global__ void __launch_bounds__(Threads, Threads >= 512 ? 1 : 512 / Threads)
    softmax_pipelined_kernel(tk_softmax_call a, int slice_packs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr bool Backward = Mode != FORWARD;
    if constexpr (Backward)
        a.log = Mode == BACKWARD_LOG; /* as the launcher chose: a constant in the per-element math */
    using pack = tk_pack<T, Vec>;
    constexpr int WARPS = Threads / 32;
    constexpr int STEP = Threads * Unroll; /* packs per chunk */
    /* By iteration parity; 8-byte aligned for st.async's pair. */
    __shared__ __align__(8) max_sum partials[2][(Cluster ? PIPE_MAX_BLOCKS : 1) * WARPS];
    __shared__ uint64_t partials_in[2]; /* completes when all of partials[parity] has landed */
    const T *in = static_cast<const T *>(a.in);
    const T *dy = static_cast<const T *>(a.dy);
    T *out = static_cast<T *>(a.out);
    const int cols = (int)a.cols;
    const int whole = cols / Vec * Vec;
    const int rank = Cluster ? tk_cluster_rank() : 0, blocks = Cluster ? tk_cluster_blocks() : 1;
    const int first_pack = rank * slice_packs;
    const int slice_end = min(whole, (first_pack + slice_packs) * Vec); /* column past the slice */
    const int own_packs = max(0, slice_end / Vec - first_pack);
    const int64_t clusters = gridDim.x / blocks;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int tail_lane = rank == blocks - 1 ? (int)threadIdx.x : Vec; /* Vec: no tail element */
    const float c2 = a.scale * LOG2E;
    const max_sum no_part = {Backward ? 0.0f : -INFINITY, 0.0f};

    auto row_at = [&](int64_t row) {
        pipe_row r = {-1, 0, 0};
        if (row >= 0 && row < a.rows) {
            r.row = row;
            r.len = visible_len(a, row);
            r.load_end = min(min(r.len, whole), slice_end);
        }
        return r;
    };
    /* Raw words, not packs of 16-bit elements: see pack_words. in: x forward, y backward; dy:
     * backward only. */
    struct row_chunk {
        pack_words in[Unroll], dy[Unroll];
    };
    struct chunk {
        row_chunk cur, nxt;
    };
    /* The packs at slice positions base + u * Threads + threadIdx.x of both rows: what pass 2
     * reads of row cur (last use), what pass 1 reads of row nxt. Without `reread` (a constant),
     * of row cur only what its pass 1 did not read (y of the log-softmax backward). */
    auto load_chunk = [&](const pipe_row &cur, const pipe_row &nxt, int base, bool reread) {
        chunk c;
#pragma unroll
        for (int u = 0; u < Unroll; u++) {
            const int c0 = (first_pack + base + u * Threads + (int)threadIdx.x) * Vec;
            if (c0 < cur.load_end) {
                if (reread || Mode == BACKWARD_LOG)
                    c.cur.in[u] = load_words<true>(in + cur.row * a.in_stride + c0);
                if (Backward && reread)
                    c.cur.dy[u] = load_words<true>(dy + cur.row * a.in_stride + c0);
            }
            if (c0 < nxt.load_end) {
                if constexpr (Mode != BACKWARD_LOG)
                    c.nxt.in[u] = load_words<false>(in + nxt.row * a.in_stride + c0);
                if constexpr (Backward)
                    c.nxt.dy[u] = load_words<false>(dy + nxt.row * a.in_stride + c0);
            }
        }
        return c;
    };
    auto tail_of = [&](const pipe_row &r) {
        return load_tail<T, Vec, Backward>(in + r.row * a.in_stride, Backward ? dy + r.row * a.in_stride : nullptr,
                                           cols, r.len, tail_lane);
    };

    pipe_row cur = row_at(-1), nxt = row_at(blockIdx.x / blocks);
    row_tail<T, Vec> cur_tail, nxt_tail = tail_of(nxt);
    row_stats st = {0.0f, 0.0f};
    chunk c = load_chunk(cur, nxt, 0, true);
    if constexpr (Cluster) {
        if (threadIdx.x == 0) {
            tk_mbarrier_init(tk_smem_address(&partials_in[0]), 1);
            tk_mbarrier_init(tk_smem_address(&partials_in[1]), 1);
            tk_fence_mbarrier_init();
        }
        tk_cluster_start(); /* with the first chunk's loads in flight */
    }
    for (int iteration = 0;; iteration++) {
        const pipe_row after = row_at(nxt.row < 0 ? a.rows : nxt.row + clusters);
        max_sum part = no_part; /* this thread's, of row nxt */
#pragma unroll 1
        for (int base = 0; base < own_packs; base += STEP) {
            chunk following = !OneChunk && base + STEP < own_packs ? load_chunk(cur, nxt, base + STEP, true)
                                                                   : load_chunk(nxt, after, 0, !OneChunk);
            if constexpr (OneChunk) { /* the slice's only chunk: row nxt's pass 2 takes pass 1's words */
                /* Pack by pack, not memcpy: CUDA 13.0 copies a single pack where both pointers
                 * are packs past the start of their chunk, so memcpy(following.cur.dy, c.nxt.dy,
                 * sizeof c.nxt.dy) dropped dy[1], and pass 2 of the backward computed u = 1 from
                 * the first chunk's dy[1], never loaded (row -1): wrong outputs. */
#pragma unroll
                for (int u = 0; u < Unroll; u++) {
                    if constexpr (Mode != BACKWARD_LOG)
                        following.cur.in[u] = c.nxt.in[u];
                    if constexpr (Backward)
                        following.cur.dy[u] = c.nxt.dy[u];
                }
            }
            if (cur.row >= 0) {
#pragma unroll
                for (int u = 0; u < Unroll; u++) {
                    const int c0 = (first_pack + base + u * Threads + (int)threadIdx.x) * Vec;
                    const pack xs = as_pack<T, Vec>(c.cur.in[u]);
                    const pack gs = Backward ? as_pack<T, Vec>(c.cur.dy[u]) : xs;
                    if (c0 < slice_end) /* masked packs too */
                        store_streaming<T, Vec>(out + cur.row * a.out_stride + c0,
                                                output_pack<T, Vec, Backward>(a, st, xs, gs, c0, cur.len, c2));
                }
            }
            if (nxt.row >= 0) {
                if constexpr (Backward) {
#pragma unroll
                    for (int u = 0; u < Unroll; u++)
                        accumulate_pack<T, Vec, true>(a, as_pack<T, Vec>(c.nxt.in[u]), as_pack<T, Vec>(c.nxt.dy[u]),
                                                      (first_pack + base + u * Threads + (int)threadIdx.x) * Vec,
                                                      nxt.load_end, c2, 0.0f, &part.s);
                } else {
                    row_extremes<T, Vec> ext;
#pragma unroll
                    for (int u = 0; u < Unroll; u++) {
                        const int c0 = (first_pack + base + u * Threads + (int)threadIdx.x) * Vec;
                        if (c0 < nxt.load_end)
                            ext.add_visible(as_pack<T, Vec>(c.nxt.in[u]), c0, nxt.load_end);
                    }
                    const float chunk_max = ext.max_times(c2);
                    if (chunk_max > part.m) {
                        part.s *= tk_exp2_approx(part.m - chunk_max);
                        part.m = chunk_max;
                    }
                    if (part.m != -INFINITY) {
#pragma unroll
                        for (int u = 0; u < Unroll; u++) {
                            const pack xs = as_pack<T, Vec>(c.nxt.in[u]);
                            accumulate_pack<T, Vec, false>(a, xs, xs,
                                                           (first_pack + base + u * Threads + (int)threadIdx.x) * Vec,
                                                           nxt.load_end, c2, part.m, &part.s);
                        }
                    }
                }
            }
            c = following;
        }
        if (cur.row >= 0 && cur_tail.col < cols)
            out[cur.row * a.out_stride + cur_tail.col] = tk_from_float<T>(
                output_value<Backward>(a, st, tk_to_float(cur_tail.x), Backward ? tk_to_float(cur_tail.g) : 0.0f, c2,
                                       cur_tail.col < cur.len));
        if (nxt.row < 0)
            break;
        if (nxt_tail.col < nxt.len) {
            if constexpr (Backward)
                accumulate<true>(a, tk_to_float(nxt_tail.x), tk_to_float(nxt_tail.g), c2, 0.0f, &part.s);
            else
                part = combine<false>(part, {tk_to_float(nxt_tail.x) * c2, 1.0f});
        }

        /* Row nxt's statistic: every warp's part to every block of the cluster, by asynchronous
         * stores counted on the receiver's barrier of this iteration's parity. A buffer is
         * written again two iterations later, by blocks that have received this block's parts
         * of the next iteration, which each warp sends after reading this one's (one block:
         * after the next iteration's barrier, which every reader of this one has passed). */
        part = warp_combine<Backward>(part);
        const int parity = iteration & 1;
        if constexpr (Cluster) {
            const uint32_t arrived = tk_smem_address(&partials_in[parity]);
            if (threadIdx.x == 0)
                tk_mbarrier_arrive_expect_tx(arrived, blocks * WARPS * sizeof(max_sum));
            if (lane < blocks)
                tk_cluster_send_f32x2(tk_smem_address(&partials[parity][rank * WARPS + warp]), arrived, lane, part.m,
                                      part.s);
            tk_mbarrier_wait(arrived, (uint32_t)(iteration >> 1) & 1);
        } else {
            if (lane == 0)
                partials[parity][warp] = part;
            __syncthreads();
        }
        max_sum total = no_part;
        for (int i = lane; i < blocks * WARPS; i += 32)
            total = combine<Backward>(total, partials[parity][i]);
        total = warp_combine<Backward>(total);
        if constexpr (Backward)
            st.dot = total.s;
        else
            st.lse = total.m + log2f(total.s); /* -inf: nothing visible */

        cur = nxt;
        cur_tail = nxt_tail;
        nxt = after;
        if (nxt.row >= 0)
            nxt_tail = tail_of(nxt);
    }
#endif
}

/* ---------------------------------------------------------------------------- launchers ---- */

int64_t grid_limit(int64_t blocks) { return blocks > 0x7fffffff ? 0x7fffffff : (blocks < 1 ? 1 : blocks); }

/* Tensors whose rows pass 2 of the stream and pipelined kernels re-read, to be found in L2: x,
 * or y and dy (dy alone for the log-softmax backward, whose pass 1 does not read y). */
int reread_tensors(const tk_softmax_call *a) { return a->backward && !a->log ? 2 : 1; }

template <typename T, int Vec, int Mode>
cudaError_t launch_rows(const tk_softmax_call *a, cudaStream_t stream) {
    constexpr int PACKS = rows_packs<Mode>();
    constexpr auto kernel = softmax_rows_kernel<T, Vec, Mode>;
    const int64_t packs = (a->cols + Vec - 1) / Vec;
    const int64_t needed = (packs + PACKS - 1) / PACKS;
    int threads, threads_per_row;
    if (needed <= 32) { /* several rows per block, each on a power-of-two group of lanes */
        threads_per_row = Vec; /* at least one lane per element of a partial last pack */
        while (threads_per_row < needed)
            threads_per_row *= 2;
        threads = REGS_GROUP_BLOCK;
    } else {
        threads = threads_per_row = (int)((needed + 31) / 32 * 32);
    }
    const int64_t rows_per_block = threads / threads_per_row;
    /* One block per row group, not a one-wave persistent grid (slower, docs/kernels/softmax.md):
     * while some blocks reduce, others of the same SM load. */
    const int64_t blocks = (a->rows + rows_per_block - 1) / rows_per_block;
    return tk_launch(kernel, (unsigned)grid_limit(blocks), threads, 0, stream, *a, threads_per_row);
}

template <typename T, int Vec, bool Backward>
cudaError_t launch_stream(const tk_softmax_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr auto kernel = softmax_stream_kernel<T, Vec, Backward>;
    /* Rows in flight: at least one per SM, more only while what pass 2 re-reads of them fits in
     * half of L2. */
    const int64_t row_bytes = a->cols * (int64_t)sizeof(T) * reread_tensors(a);
    int64_t blocks = (int64_t)dev->l2_bytes / 2 / row_bytes;
    if (blocks < dev->sm_count)
        blocks = dev->sm_count;
    int64_t wave;
    const cudaError_t err = tk_wave_blocks<kernel>(dev, STREAM_THREADS, 0, &wave);
    if (err != cudaSuccess)
        return err;
    if (blocks > wave)
        blocks = wave;
    if (blocks > a->rows)
        blocks = a->rows;
    return tk_launch(kernel, (unsigned)grid_limit(blocks), STREAM_THREADS, 0, stream, *a);
}

/* Blocks per cluster for a row's L2 budget: the fewest (a power of two) whose slices keep at
 * most PIPE_SLICE_BYTES each in L2 for pass 2, over the tensors it re-reads (the host checked the
 * width, and a static_assert above that PIPE_PORTABLE_BLOCKS then do): the softmax backward,
 * which re-reads y and dy, takes twice the blocks of the forward on the same row. */
int pipelined_blocks(const tk_softmax_call *a, int elem_bytes) {
    const int64_t kept_bytes = a->cols / (16 / elem_bytes) * 16 * reread_tensors(a);
    int blocks = 1;
    while (blocks < PIPE_PORTABLE_BLOCKS && kept_bytes > blocks * PIPE_SLICE_BYTES)
        blocks *= 2;
    return blocks;
}

/* Clusters of `blocks` (2 to 16) resident on the device at once, 0 for none
 * (tk_clusters_resident), cached per instantiation, device and cluster size. */
template <auto Kernel>
cudaError_t clusters_that_fit(const tk_device *dev, const cudaLaunchConfig_t &cfg, int blocks, int *clusters) {
    static tk_device_cache<PIPE_MAX_BLOCKS - 1> cache; /* slot blocks - 2 */
    return tk_clusters_resident<Kernel>(dev, cache, blocks - 2, cfg, blocks, clusters);
}

/* Few rows (a decode step's sampling distribution over a vocabulary) on the L2 budget's blocks
 * would leave most SMs idle, and one block streams its slice no faster than the 32 KB of loads
 * it keeps in flight allow per round trip to DRAM: a 512 KB f32 row on 4 blocks took 4 times
 * the launch floor. So while twice the blocks per row still fit the SMs (2 B rows <= SMs) and
 * the device holds every row's cluster of them at once (a cluster lives in one GPC: an H200
 * holds 7 or 8 clusters of 16, not 132 / 16), each row takes twice the blocks (half the slices,
 * down to PIPE_MIN_SLICE_BYTES), up to the largest cluster the device schedules for this kernel
 * (16 on an H100/H200). Many rows keep the L2 budget's blocks: their clusters already fill the
 * device. */
template <auto Kernel>
cudaError_t widen_for_few_rows(const tk_softmax_call *a, const tk_device *dev, const cudaLaunchConfig_t &cfg,
                               int elem_bytes, int *blocks) {
    auto spare = [&](int b) {
        return 2 * b * a->rows <= dev->sm_count && a->cols / (16 / elem_bytes) * 16 / (2 * b) >= PIPE_MIN_SLICE_BYTES;
    };
    if (!spare(*blocks))
        return cudaSuccess;
    int most;
    cudaError_t err = tk_max_cluster_blocks<Kernel>(dev, cfg, &most);
    if (most > PIPE_MAX_BLOCKS)
        most = PIPE_MAX_BLOCKS;
    while (err == cudaSuccess && 2 * *blocks <= most && spare(*blocks)) {
        int fit;
        err = clusters_that_fit<Kernel>(dev, cfg, 2 * *blocks, &fit);
        if (fit < a->rows)
            break;
        *blocks *= 2;
    }
    return err;
}

/* Clusters of `blocks` (2 to 16) blocks of Kernel, as many as are resident at once, at most one
 * per row. Past the portable 8 blocks a cluster needs the kernel's non-portable opt-in, which
 * tk_max_cluster_blocks sets (widen_for_few_rows chose `blocks` on the multi-chunk instantiation;
 * the one-chunk one has the same block size and shared memory). */
template <auto Kernel>
cudaError_t launch_clusters(const tk_softmax_call *a, const tk_device *dev, cudaLaunchConfig_t cfg, int blocks,
                            int slice_packs) {
    int most, fit;
    cudaError_t err = blocks > PIPE_PORTABLE_BLOCKS ? tk_max_cluster_blocks<Kernel>(dev, cfg, &most) : cudaSuccess;
    if (err == cudaSuccess)
        err = clusters_that_fit<Kernel>(dev, cfg, blocks, &fit);
    if (err != cudaSuccess)
        return err;
    if (fit < 1)
        fit = 1; /* none resident: the launch fails, with that error */
    cudaLaunchAttribute cluster = tk_cluster_attribute(blocks);
    cfg.attrs = &cluster, cfg.numAttrs = 1;
    cfg.gridDim = dim3((unsigned)((fit < a->rows ? fit : a->rows) * blocks));
    return tk_launch(cfg, Kernel, *a, slice_packs);
}

/* One block of PIPE_THREADS per SM, `blocks` per row (a power of two <= PIPE_MAX_BLOCKS: the L2
 * budget's, widened for few rows), as many clusters as fit at once (a cluster's rows follow one
 * another); one block per row is launched without clusters, as many blocks as fit at once. Each
 * block has at most two slices of PIPE_SLICE_BYTES in L2 (the one it re-reads, the one it
 * reads): 132 x 256 KB = 33 MB on an H200 (60 MB of L2), so that pass 2 hits. The backward's
 * chunks (2 packs of each of two tensors instead of 4 of one) fit the same 128 registers, so it
 * has the forward's launch shape. */
template <typename T, int Vec, int Mode, int Threads = PIPE_THREADS, int Unroll = pipe_unroll<Mode>()>
cudaError_t launch_pipelined(const tk_softmax_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr auto kernel = softmax_pipelined_kernel<T, Vec, Mode, Threads, Unroll, true, false>;
    constexpr auto one_chunk_kernel = softmax_pipelined_kernel<T, Vec, Mode, Threads, Unroll, true, true>;
    constexpr auto one_block_kernel = softmax_pipelined_kernel<T, Vec, Mode, Threads, Unroll, false, false>;
    const cudaLaunchConfig_t plain = tk_launch_config(dim3(), Threads, 0, stream);
    int blocks = pipelined_blocks(a, (int)sizeof(T));
    cudaError_t err = widen_for_few_rows<kernel>(a, dev, plain, (int)sizeof(T), &blocks);
    if (err != cudaSuccess)
        return err;
    const int64_t whole_packs = a->cols / Vec;
    const int slice_packs = (int)((whole_packs + blocks - 1) / blocks);
    /* Slices of one chunk (few rows widened over many blocks) keep it in registers for pass 2;
     * st.async is undefined in a cluster of one block: one block a row runs without. */
    if (blocks > 1)
        return slice_packs <= Threads * Unroll ? launch_clusters<one_chunk_kernel>(a, dev, plain, blocks, slice_packs)
                                               : launch_clusters<kernel>(a, dev, plain, blocks, slice_packs);
    int64_t fit;
    if ((err = tk_wave_blocks<one_block_kernel>(dev, Threads, 0, &fit)) != cudaSuccess)
        return err;
    cudaLaunchConfig_t cfg = plain;
    cfg.gridDim = dim3((unsigned)(fit < a->rows ? fit : a->rows));
    return tk_launch(cfg, one_block_kernel, *a, slice_packs);
}

template <bool Wide, bool Stream, typename T>
cudaError_t launch_direction(const tk_softmax_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr int Vec = tk_pack_width<T>(Wide);
    if constexpr (Stream)
        return a->backward ? launch_stream<T, Vec, true>(a, dev, stream) : launch_stream<T, Vec, false>(a, dev, stream);
    if (!a->backward)
        return launch_rows<T, Vec, FORWARD>(a, stream);
    return a->log ? launch_rows<T, Vec, BACKWARD_LOG>(a, stream) : launch_rows<T, Vec, BACKWARD>(a, stream);
}

template <bool Wide, bool Stream>
cudaError_t launch_dtype(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_softmax_call *a = static_cast<const tk_softmax_call *>(call);
    return tk_dispatch_dtype(a->dtype, [&](auto type) {
        return launch_direction<Wide, Stream, typename decltype(type)::type>(a, dev, stream);
    });
}

} // namespace

extern "C" int64_t tk_softmax_regs_max_cols(int elem_bytes, bool wide, bool backward) {
    const int64_t vec = wide ? 16 / elem_bytes : 1;
    return (int64_t)ROWS_MAX_THREADS * (backward ? ROWS_PACKS_BWD : ROWS_PACKS) * vec;
}

extern "C" bool tk_softmax_pipelined_fits(int elem_bytes, int64_t cols) {
    const int64_t whole_bytes = cols / (16 / elem_bytes) * 16;
    return whole_bytes >= PIPE_MIN_BYTES && whole_bytes <= PIPE_MAX_BYTES;
}

extern "C" cudaError_t tk_launch_softmax_vec16_pipelined(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_softmax_call *a = static_cast<const tk_softmax_call *>(call);
    return tk_dispatch_dtype(a->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        constexpr int Vec = tk_pack_width<T>(true);
        if (!a->backward)
            return launch_pipelined<T, Vec, FORWARD>(a, dev, stream);
        return a->log ? launch_pipelined<T, Vec, BACKWARD_LOG>(a, dev, stream)
                      : launch_pipelined<T, Vec, BACKWARD>(a, dev, stream);
    });
}

extern "C" cudaError_t tk_launch_softmax_vec16_regs(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<true, false>(call, dev, stream);
}

extern "C" cudaError_t tk_launch_softmax_scalar_regs(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<false, false>(call, dev, stream);
}

extern "C" cudaError_t tk_launch_softmax_vec16_stream(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<true, true>(call, dev, stream);
}

extern "C" cudaError_t tk_launch_softmax_scalar_stream(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<false, true>(call, dev, stream);
}
