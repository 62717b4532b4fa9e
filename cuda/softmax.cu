/*
 * Row softmax and log-softmax, forward and backward, with a scale and an optional causal mask
 * (conventions and formulas in include/tkern.h, tk_softmax_params). Per row of visible length
 * len (masked columns are written but not read, except for the rest of the 16-byte pack that
 * holds column len), in base 2 so that each exponential is one
 * FFMA + MUFU.EX2:
 *
 *     t_c = x_c * scale * log2(e),  m = max_c t_c,  s = sum_c 2^(t_c - m)
 *     softmax y_c = 2^(t_c - m) / s                 log-softmax y_c = (t_c - m - log2 s) * ln 2
 *     backward: softmax dx_c = scale y_c (dy_c - sum dy y),  log dx_c = scale (dy_c - e^y_c sum dy)
 *
 * The op is memory-bound (a few flops per element), so the aim is to move each byte once at
 * the copy bandwidth. Two row mappings:
 *
 * "regs" (rows that fit on chip): the row is loaded once into registers, as raw 16-byte packs
 * (PACKS = 4 per thread forward, 32 bf16 elements = 16 registers; 2 per tensor backward, which
 * holds y and dy), then reduced and written from the registers: exactly one read and one write
 * per element. keep_packed() stops the compiler from keeping f32 copies of the row alive across
 * the reductions (which spilled at 8 packs). Threads per row tpr = packs / PACKS rounded up: up
 * to 32 it is a power of two (at least one lane per element of a partial last pack) and a
 * 128-thread block holds 128 / tpr rows, reduced with shuffles only (no barrier); past 32 one
 * block holds one row (64..1024 threads, reductions through 32 floats of shared memory), so
 * forward rows reach 1024 x 4 x 8 = 32768 bf16 / f16 (16384 f32), backward half that. Every
 * thread issues all its loads before the first use (64 bytes in flight per thread, 64 KB per SM
 * at 1024 resident threads). Grid: one block per row group (see launch_regs for why not a
 * persistent grid); blocks stride only past the grid limit. The 16384 x 4096 bf16 benchmark
 * is 512 packs per row: one block of 128 threads x 4 packs per row, up to 16 blocks per SM
 * (56 registers).
 *
 * "stream" (any width, e.g. 131072-wide vocabulary rows): one block of 512 threads per row.
 * Pass 1 reads the row in chunks of 512 x UNROLL packs (4 forward, 2 per tensor backward:
 * 32 KB in flight per block) and keeps a running (max, sum) per thread with the online
 * rescaling s = s 2^(m_old - m_new) + ..., combined across the block at the end; backward just
 * sums. Pass 2 re-reads the row with last-use loads (ld.global.cs) and writes the output with
 * streaming stores. DRAM traffic is one read and one write when pass 2 hits L2: the grid is
 * limited to max(SM count, L2 bytes / 2 / row bytes) blocks, so that the rows being worked on
 * (132 x 256 KB = 33 MB for 131072 bf16 columns on an H200) fit in its 50 MB L2 next to the
 * streaming stores; a miss costs a second DRAM read (at worst 3 instead of 2 row transfers).
 * Not measured yet; the alternative, a row split over a thread-block cluster's shared memory
 * (one DRAM read guaranteed), is not implemented.
 *
 * The "scalar" variants are the same kernels with packs of one element: any element-aligned
 * pointer and stride (e.g. a tensor offset by 2 bytes), correct and slower. The cols % Vec
 * last elements of a vec16 row are loaded and stored one by one (row_tail).
 */
#include "tkern.h"

#include "common.cuh"
#include "softmax.h"

namespace {

constexpr int REGS_PACKS_FWD = 4;
constexpr int REGS_PACKS_BWD = 2;
constexpr int REGS_MAX_THREADS = 1024;
constexpr int REGS_GROUP_BLOCK = 128; /* block size when several rows share a block */
constexpr int STREAM_THREADS = 512;
constexpr int STREAM_UNROLL_FWD = 4;
constexpr int STREAM_UNROLL_BWD = 2;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.69314718055994531f;

template <bool Backward> constexpr int regs_packs() { return Backward ? REGS_PACKS_BWD : REGS_PACKS_FWD; }

/* 2^x with MUFU.EX2 alone (ex2.approx.ftz: relative error <= 2^-22, results below 2^-126
 * flush to 0, as every probability that small is 0 at the output's f32 spacing near 1). The
 * library's exp2f adds a denormal-range fix-up around each MUFU.EX2, which costs registers
 * here, where 64 exponentials of a thread are scheduled together. */
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Columns of `row` that are visible (host clamped causal_offset to [-period, cols]; cols < 2^31). */
__device__ __forceinline__ int visible_len(const tk_softmax_call &a, int64_t row) {
    if (!a.causal)
        return (int)a.cols;
    const int64_t len = row % a.causal_period + a.causal_offset + 1;
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

/* Reductions over the threads of one row: the whole block, or aligned groups of `width`
 * (a power of two <= 32) lanes within a warp. */
__device__ __forceinline__ float row_max(float v, int width, bool whole_block, float *scratch) {
    if (whole_block)
        return tk_block_max(v, scratch);
    for (int offset = width >> 1; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ __forceinline__ float row_sum(float v, int width, bool whole_block, float *scratch) {
    if (whole_block)
        return tk_block_sum(v, scratch);
    for (int offset = width >> 1; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* What a row's outputs are computed from. Forward: max m and sum s (base 2); backward: sum dy y
 * (softmax) or sum dy (log-softmax). */
struct row_stats {
    float m, inv_s, lse; /* forward: m, 1 / s, m + log2 s */
    float dot;           /* backward */
};

__device__ __forceinline__ row_stats forward_stats(float m, float s) {
    row_stats st;
    st.m = m;
    st.inv_s = 1.0f / s;
    st.lse = m + log2f(s);
    st.dot = 0.0f;
    return st;
}

/* Accumulates one visible element into the pass-1 statistics: the max (Phase 0), the sum of
 * 2^(t - m) (Phase 1) or, backward, the dot (Phase 0). */
template <bool Backward, int Phase>
__device__ __forceinline__ void accumulate(const tk_softmax_call &a, float x_or_y, float dy, float c2, float m,
                                           float *acc) {
    if constexpr (Backward)
        *acc += a.log ? dy : dy * x_or_y;
    else if constexpr (Phase == 0)
        *acc = fmaxf(*acc, x_or_y * c2);
    else
        *acc += fast_exp2(x_or_y * c2 - m);
}

/* Accumulates the visible elements of a pack starting at column c0. */
template <typename T, int Vec, bool Backward, int Phase>
__device__ __forceinline__ void accumulate_pack(const tk_softmax_call &a, const tk_pack<T, Vec> &xs,
                                                const tk_pack<T, Vec> &gs, int c0, int len, float c2, float m,
                                                float *acc) {
    if (c0 + Vec <= len) {
#pragma unroll
        for (int e = 0; e < Vec; e++)
            accumulate<Backward, Phase>(a, tk_to_float(xs.v[e]), Backward ? tk_to_float(gs.v[e]) : 0.0f, c2, m, acc);
    } else if (c0 < len) {
#pragma unroll
        for (int e = 0; e < Vec; e++)
            if (c0 + e < len)
                accumulate<Backward, Phase>(a, tk_to_float(xs.v[e]), Backward ? tk_to_float(gs.v[e]) : 0.0f, c2, m, acc);
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
        return a.log ? a.scale * (dy - fast_exp2(x_or_y * LOG2E) * st.dot) : a.scale * x_or_y * (dy - st.dot);
    } else {
        const float t = x_or_y * c2;
        return a.log ? (t - st.lse) * LN2 : fast_exp2(t - st.m) * st.inv_s;
    }
}

template <typename T, int Vec, bool Backward>
__device__ __forceinline__ tk_pack<T, Vec> output_pack(const tk_softmax_call &a, const row_stats &st,
                                                       const tk_pack<T, Vec> &xs, const tk_pack<T, Vec> &gs, int c0,
                                                       int len, float c2) {
    tk_pack<T, Vec> r;
#pragma unroll
    for (int e = 0; e < Vec; e++)
        r.v[e] = tk_from_float<T>(output_value<Backward>(a, st, tk_to_float(xs.v[e]),
                                                         Backward ? tk_to_float(gs.v[e]) : 0.0f, c2, c0 + e < len));
    return r;
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

/* ------------------------------------------------------------------------------- regs ---- */

template <typename T, int Vec, bool Backward>
__global__ void __launch_bounds__(REGS_MAX_THREADS) softmax_regs_kernel(tk_softmax_call a, int threads_per_row) {
    constexpr int PACKS = regs_packs<Backward>();
    __shared__ float scratch[32];
    const T *in = static_cast<const T *>(a.in);
    const T *dy = static_cast<const T *>(a.dy);
    T *out = static_cast<T *>(a.out);
    const int cols = (int)a.cols;
    const int rows_per_block = blockDim.x / threads_per_row;
    const bool whole_block = rows_per_block == 1;
    const int group = threadIdx.x / threads_per_row, lane = threadIdx.x % threads_per_row;
    const float c2 = a.scale * LOG2E;

    /* Every thread of a block runs the same iterations (the reductions need all of them);
     * threads whose row is past the end take part with nothing visible and store nothing. */
    for (int64_t first = (int64_t)blockIdx.x * rows_per_block; first < a.rows;
         first += (int64_t)gridDim.x * rows_per_block) {
        const int64_t row = first + group;
        const bool active = row < a.rows;
        const int len = active ? visible_len(a, row) : 0;
        const T *in_row = in + row * a.in_stride;
        const T *dy_row = dy + row * a.in_stride;
        /* Whole packs: those that start before len are loaded (a pack may straddle len). */
        tk_pack<T, Vec> xs[PACKS], gs[PACKS];
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int c0 = (p * threads_per_row + lane) * Vec;
            if (c0 < len && c0 + Vec <= cols) {
                xs[p] = load<T, Vec, true>(in_row + c0);
                if constexpr (Backward)
                    gs[p] = load<T, Vec, true>(dy_row + c0);
            }
        }
        const row_tail<T, Vec> tail = load_tail<T, Vec, Backward>(in_row, dy_row, cols, len, lane);
        const int whole = cols / Vec * Vec; /* columns covered by whole packs */
        const int pack_len = len < whole ? len : whole;

        row_stats st;
        if constexpr (Backward) {
            float dot = 0.0f;
#pragma unroll
            for (int p = 0; p < PACKS; p++)
                accumulate_pack<T, Vec, true, 0>(a, xs[p], gs[p], (p * threads_per_row + lane) * Vec, pack_len, c2,
                                                 0.0f, &dot);
            if (tail.col < len)
                accumulate<true, 0>(a, tk_to_float(tail.x), tk_to_float(tail.g), c2, 0.0f, &dot);
            st.dot = row_sum(dot, threads_per_row, whole_block, scratch);
            keep_packed(xs);
            keep_packed(gs);
        } else {
            float m = -INFINITY;
#pragma unroll
            for (int p = 0; p < PACKS; p++)
                accumulate_pack<T, Vec, false, 0>(a, xs[p], gs[p], (p * threads_per_row + lane) * Vec, pack_len, c2,
                                                  0.0f, &m);
            if (tail.col < len)
                accumulate<false, 0>(a, tk_to_float(tail.x), 0.0f, c2, 0.0f, &m);
            m = row_max(m, threads_per_row, whole_block, scratch);
            keep_packed(xs);
            float s = 0.0f;
#pragma unroll
            for (int p = 0; p < PACKS; p++)
                accumulate_pack<T, Vec, false, 1>(a, xs[p], gs[p], (p * threads_per_row + lane) * Vec, pack_len, c2,
                                                  m, &s);
            if (tail.col < len)
                accumulate<false, 1>(a, tk_to_float(tail.x), 0.0f, c2, m, &s);
            st = forward_stats(m, row_sum(s, threads_per_row, whole_block, scratch));
            keep_packed(xs);
        }
        if (active) {
            T *out_row = out + row * a.out_stride;
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const int c0 = (p * threads_per_row + lane) * Vec;
                if (c0 + Vec <= cols)
                    store_streaming<T, Vec>(out_row + c0, output_pack<T, Vec, Backward>(a, st, xs[p], gs[p], c0, len, c2));
            }
            if (tail.col < cols)
                out_row[tail.col] = tk_from_float<T>(output_value<Backward>(
                    a, st, tk_to_float(tail.x), Backward ? tk_to_float(tail.g) : 0.0f, c2, tail.col < len));
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
                    xs[u] = load<T, Vec, false>(in_row + c0);
                    if constexpr (Backward)
                        gs[u] = load<T, Vec, false>(dy_row + c0);
                }
            }
            if constexpr (Backward) {
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
                    accumulate_pack<T, Vec, true, 0>(a, xs[u], gs[u], base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec,
                                                     pack_len, c2, 0.0f, &acc);
            } else {
                float chunk_max = -INFINITY;
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
                    accumulate_pack<T, Vec, false, 0>(a, xs[u], gs[u], base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec,
                                                      pack_len, c2, 0.0f, &chunk_max);
                keep_packed(xs);
                if (chunk_max > m) { /* rescale the sum to the new maximum (0 * 0 when m = -inf) */
                    acc *= fast_exp2(m - chunk_max);
                    m = chunk_max;
                }
                if (m != -INFINITY) { /* all -inf so far: nothing to add */
#pragma unroll
                    for (int u = 0; u < UNROLL; u++)
                        accumulate_pack<T, Vec, false, 1>(a, xs[u], gs[u],
                                                          base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec,
                                                          pack_len, c2, m, &acc);
                }
            }
        }
        row_stats st;
        if constexpr (Backward) {
            if (tail.col < len)
                accumulate<true, 0>(a, tk_to_float(tail.x), tk_to_float(tail.g), c2, 0.0f, &acc);
            st.dot = tk_block_sum(acc, scratch);
        } else {
            if (tail.col < len) {
                const float t = tk_to_float(tail.x) * c2;
                if (t > m) {
                    acc *= fast_exp2(m - t);
                    m = t;
                }
                if (m != -INFINITY)
                    acc += fast_exp2(t - m);
            }
            const float row_m = tk_block_max(m, scratch);
            const float scaled = m == -INFINITY ? 0.0f : acc * fast_exp2(m - row_m);
            st = forward_stats(row_m, tk_block_sum(scaled, scratch));
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

/* ---------------------------------------------------------------------------- launchers ---- */

int64_t grid_limit(int64_t blocks) { return blocks > 0x7fffffff ? 0x7fffffff : (blocks < 1 ? 1 : blocks); }

template <typename T, int Vec, bool Backward>
cudaError_t launch_regs(const tk_softmax_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr int PACKS = regs_packs<Backward>();
    constexpr auto kernel = softmax_regs_kernel<T, Vec, Backward>;
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
    /* One block per row group, not a one-wave persistent grid: on an H200 this measured
     * 0.85-0.92 of the copy bandwidth where the persistent grid measured 0.78-0.84 (bf16 and f32
     * 16384x4096, 65536x1024, backward): while some blocks reduce, others of the same SM load. */
    (void)dev;
    const int64_t blocks = (a->rows + rows_per_block - 1) / rows_per_block;
    kernel<<<(unsigned)grid_limit(blocks), threads, 0, stream>>>(*a, threads_per_row);
    return cudaGetLastError();
}

template <typename T, int Vec, bool Backward>
cudaError_t launch_stream(const tk_softmax_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr auto kernel = softmax_stream_kernel<T, Vec, Backward>;
    /* Rows in flight: at least one per SM, more only while they fit in half of L2. */
    const int64_t row_bytes = a->cols * (int64_t)sizeof(T) * (Backward ? 2 : 1);
    int64_t blocks = (int64_t)dev->l2_bytes / 2 / row_bytes;
    if (blocks < dev->sm_count)
        blocks = dev->sm_count;
    const int64_t wave = tk_wave_blocks<kernel>(dev, STREAM_THREADS, 0);
    if (blocks > wave)
        blocks = wave;
    if (blocks > a->rows)
        blocks = a->rows;
    kernel<<<(unsigned)grid_limit(blocks), STREAM_THREADS, 0, stream>>>(*a);
    return cudaGetLastError();
}

template <bool Wide, bool Stream, typename T>
cudaError_t launch_direction(const tk_softmax_call *a, const tk_device *dev, cudaStream_t stream) {
    constexpr int Vec = Wide ? (int)(16 / sizeof(T)) : 1;
    if constexpr (Stream)
        return a->backward ? launch_stream<T, Vec, true>(a, dev, stream) : launch_stream<T, Vec, false>(a, dev, stream);
    else
        return a->backward ? launch_regs<T, Vec, true>(a, dev, stream) : launch_regs<T, Vec, false>(a, dev, stream);
}

template <bool Wide, bool Stream>
cudaError_t launch_dtype(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_softmax_call *a = static_cast<const tk_softmax_call *>(call);
    switch (a->dtype) {
    case TK_F32: return launch_direction<Wide, Stream, float>(a, dev, stream);
    case TK_F16: return launch_direction<Wide, Stream, __half>(a, dev, stream);
    case TK_BF16: return launch_direction<Wide, Stream, __nv_bfloat16>(a, dev, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace

extern "C" int64_t tk_softmax_regs_max_cols(int elem_bytes, bool wide, bool backward) {
    const int64_t vec = wide ? 16 / elem_bytes : 1;
    return (int64_t)REGS_MAX_THREADS * (backward ? REGS_PACKS_BWD : REGS_PACKS_FWD) * vec;
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
