/*
 * Rotary position embedding on Q and K in one launch (conventions in include/tkern.h,
 * tk_rope_params). For token t at position p and pair i < rotary_dim / 2 of every head:
 *
 *     a = p * inv_freq_i  (inv_freq_i = theta^(-2i / rotary_dim), or cos / sin from the cache)
 *     out1 = x1 cos a - x2 sin a,   out2 = x2 cos a + x1 sin a      (backward: a -> -a)
 *
 * NeoX pairs are (x[i], x[i + rotary_dim / 2]); GPT-J pairs are (x[2i], x[2i + 1]).
 *
 * Work list. A unit is Vec consecutive pairs of one head row (Vec = 8 bf16 / f16, 4 f32, 1 for
 * "scalar"), read as two packs (NeoX: one from each half; GPT-J: two adjacent packs
 * de-interleaved in registers), or, out of place with rotary_dim < head_dim, one pack of the
 * unrotated rest to copy. Units are numbered token-major, then head (Q heads, then K heads), then
 * unit within the row, and consecutive threads take consecutive units: on a dense tensor each
 * warp instruction touches contiguous bytes and a block a contiguous span, as a copy does.
 *
 * Why it is fast: the op is memory-bound (a few flops per element), so the aim is the copy
 * bandwidth, which needs many bytes in flight per SM and few registers per thread.
 * - One block per chunk of THREADS x PER_THREAD units (no persistent grid): a chunk is T whole
 *   tokens (T = chunk / units per token), or a part of one token when a token has more units
 *   than a chunk. Finished blocks are replaced by fresh ones, so SMs never idle on a tail of
 *   long-running threads.
 * - Each thread first issues the loads of all its units (PER_THREAD x 32 bytes for 16-bit
 *   types), then, while they are in flight, helps fill the block's angle table in shared memory:
 *   cos and sin of every (token, pair) of its T tokens, each computed once and used by every
 *   head. After one barrier each unit reads its Vec cos / sin from the table, rotates and is
 *   stored with 16-byte st.global.v4 (tk_store_pack).
 * - With a cache, a table entry is two dependent loads: the token's position, then the cache
 *   row at it. Issued after the data loads, both round trips would follow the data, and a block
 *   would wait for them with its data already in registers. So a thread first loads its first
 *   entry's position, waits for it, issues that entry's cos / sin loads and only then its data
 *   loads: the cache row and the data are in flight together (the orders tried are in
 *   docs/kernels/rope.md). With theta only the position goes first (computing the angles before
 *   the data loads would delay them).
 * - Registers (80 at most, 3 blocks of 256 per SM): between the loads and the rotation only the
 *   raw packs (keep_packed) and one cursor are alive; step 3 walks the work list again instead
 *   of keeping each unit's addresses (forget), and rotates 4 pairs at a time. Angles are not
 *   held across heads and no per-head loop is unrolled.
 * - Benchmark shape (40 heads x 8 units of bf16 = 320 units per token): a chunk of 256 x 5 units
 *   is 4 tokens, whose table is 256 (token, pair) entries: one sincos per thread.
 * The former mapping (a thread per (token, unit) walking all 40 heads with its angles in
 * registers, a one-wave persistent grid) used 102-116 registers and was slower
 * (docs/kernels/rope.md).
 * rotary_dim / 2 > TABLE_PAIRS (no table fits; a cold path) computes each unit's angles where it
 * is rotated, one unit per thread.
 *
 * Angle precision: inv_freq = 2^(i step) (step = -2 log2(theta) / rotary_dim, from the host) and
 * p * inv_freq are computed in f64, the angle is reduced to
 * [-pi, pi] in f64 (two-part 2 pi), then sincosf (full range reduction never needed, error
 * ~1 ulp): the angle is exact to ~2e-7 rad for |p| < 2^30. With the table that is one f64 exp2
 * and a few f64 ops per (token, pair) of the call. __sincosf on the unreduced f32 product would
 * be off by radians at large positions.
 *
 * Memory: each element is read once and written once (in place: the same address), the cache
 * or position array once per (token, pair) (per block of a token split over blocks).
 */
#include <math.h>

#include "tkern.h"

#include "common.cuh"
#include "rope.h"
#include "rope_angle.cuh"

namespace {

constexpr int THREADS = 256;
/* Units a thread loads before it rotates any: 5 x 32 bytes in flight for 16-bit types. */
constexpr int PER_THREAD = 5;
/* Blocks per SM promised to ptxas: 3 caps the registers at 80 (bf16 / f16 vec16 use all 80, no
 * spill on sm_80 - sm_90a), 768 threads and ~120 KB of loads in flight per SM. 4 blocks of 4
 * units (64 registers) spilled a few bytes on sm_80. */
constexpr int MIN_BLOCKS = 3;
/* (token, pair) angles a block's table holds at most: 16 KB of cos and sin. */
constexpr int64_t TABLE_PAIRS = 2048;

__device__ __forceinline__ int64_t token_position(const tk_rope_call &a, int64_t t) {
    if (a.positions32)
        return a.positions32[t];
    if (a.positions64)
        return a.positions64[t];
    return a.position_start + t;
}

/* The cache's cos and sin of pair i at position pos, as they are stored (forward). */
__device__ __forceinline__ void cached_cos_sin(const tk_rope_call &a, int64_t pos, int64_t i, float *c, float *s) {
    if (pos < 0 || pos >= a.max_position) {
        *c = *s = __int_as_float(0x7fffffff); /* NaN: the documented out-of-range result */
        return;
    }
    *c = a.cos_cache[pos * a.cache_row_stride + i];
    *s = a.sin_cache[pos * a.cache_row_stride + i];
}

/* cos and sin of pair i's angle at position pos (sin negated for the backward pass). */
__device__ __forceinline__ void pair_cos_sin(const tk_rope_call &a, int64_t pos, int64_t i, float *c, float *s) {
    if (a.cos_cache) {
        cached_cos_sin(a, pos, i, c, s);
    } else {
        const double inv_freq = exp2((double)i * a.log2_inv_freq_step);
        tk_rope_sincos((double)pos * inv_freq, s, c);
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

/* Pairs rotated at a time: one 16-byte read of cosines and one of sines from the table. */
template <int Vec> __host__ __device__ constexpr int pairs_per_step() { return Vec < 4 ? Vec : 4; }

/* Rotates pairs [e0, e0 + pairs_per_step) of the Vec pairs held in packs (lo, hi) by angles with
 * cosines c and sines s. NeoX pairs are (lo[e], hi[e]); GPT-J pairs are elements (2e, 2e + 1) of
 * the 2 Vec elements lo then hi. */
template <typename T, int Vec, bool NeoX>
__device__ __forceinline__ void rotate_step(tk_pack<T, Vec> &lo, tk_pack<T, Vec> &hi, int e0,
                                            const tk_pack<float, pairs_per_step<Vec>()> &c,
                                            const tk_pack<float, pairs_per_step<Vec>()> &s) {
#pragma unroll
    for (int j = 0; j < pairs_per_step<Vec>(); j++) {
        const int e = e0 + j;
        T &e1 = NeoX ? lo.v[e] : (2 * e < Vec ? lo.v[2 * e % Vec] : hi.v[2 * e % Vec]);
        T &e2 = NeoX ? hi.v[e] : (2 * e + 1 < Vec ? lo.v[(2 * e + 1) % Vec] : hi.v[(2 * e + 1) % Vec]);
        const float x1 = tk_to_float(e1), x2 = tk_to_float(e2);
        e1 = tk_from_float<T>(x1 * c.v[j] - x2 * s.v[j]);
        e2 = tk_from_float<T>(x2 * c.v[j] + x1 * s.v[j]);
    }
}

/* The launch shape (host-computed). Blocks come in groups of blocks_per_group that share one group
 * of tokens_per_block tokens; block b of a group takes units [b, b + 1) x block_units of the
 * group's list. */
struct rope_shape {
    int64_t units;            /* per head row: rot_units rotated, then the rest to copy */
    int64_t rot_units;
    int64_t tokens_per_block;
    int64_t blocks_per_group; /* > 1 only for one token per group */
    int64_t block_units;      /* THREADS x units per thread (the last round may be partial) */
    /* THREADS units further on in the list: this many units, heads and tokens (carries aside) */
    int64_t step_unit, step_head;
    int step_token;
};

/* A thread's place in its block's part of the work list: the unit's index from the start of the
 * block's part (index < block_units), its token within the group, its head and unit. */
struct cursor {
    int index, token;
    int64_t head, unit;
};

__device__ __forceinline__ cursor cursor_at(int64_t first_unit, int index, int64_t units, int64_t heads) {
    cursor c;
    c.index = index;
    const int64_t row = (first_unit + index) / units;
    c.unit = first_unit + index - row * units;
    c.token = (int)(row / heads);
    c.head = row - c.token * heads;
    return c;
}

/* THREADS units on, with carries instead of divisions (step_head < heads, so one carry each). */
__device__ __forceinline__ void advance(cursor &c, const rope_shape &g, int64_t heads) {
    c.index += THREADS;
    c.unit += g.step_unit;
    c.head += g.step_head;
    c.token += g.step_token;
    if (c.unit >= g.units) {
        c.unit -= g.units;
        c.head++;
    }
    if (c.head >= heads) {
        c.head -= heads;
        c.token++;
    }
}

/* Makes the compiler forget what the cursor holds (emits nothing): step 3 walks the list again
 * from the start instead of keeping every unit's address alive from step 1. */
__device__ __forceinline__ void forget(cursor &c) {
    asm("" : "+r"(c.index), "+r"(c.token), "+l"(c.head), "+l"(c.unit));
}

/* Table: angles from the block's shared-memory table; else each unit computes its own (one token
 * per block). */
template <typename T, int Vec, bool NeoX, bool Table, int PerThread>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS) rope_kernel(tk_rope_call a, rope_shape g) {
    extern __shared__ float4 table_storage[]; /* cos [tokens_per_block][half], then sin */
    float *const cos_table = reinterpret_cast<float *>(table_storage);
    float *const sin_table = cos_table + g.tokens_per_block * (a.rotary_dim / 2);
    const int64_t heads = a.heads_q + a.heads_k, half = a.rotary_dim / 2;
    const int64_t group = blockIdx.x / g.blocks_per_group, part = blockIdx.x - group * g.blocks_per_group;
    const int64_t first_token = group * g.tokens_per_block;
    const int64_t group_tokens = min(g.tokens_per_block, a.tokens - first_token);
    const int64_t first_unit = part * g.block_units; /* in the group's list */
    const int end = (int)min(g.block_units, group_tokens * heads * g.units - first_unit);
    const cursor start = cursor_at(first_unit, threadIdx.x, g.units, heads);

    /* 0. The thread's first table entry, before the data (header comment): with a cache the
     * thread waits for the position and issues the cache loads, so that the cache row and the
     * data loads of step 1 are in flight together; with theta only the position is loaded. */
    const int entries = Table ? (int)(group_tokens * half) : 0;
    int64_t first_position = 0;
    float first_cos = 0.0f, first_sin = 0.0f;
    if (Table && (int)threadIdx.x < entries) {
        first_position = token_position(a, first_token + threadIdx.x / half);
        if (a.cos_cache)
            cached_cos_sin(a, first_position, threadIdx.x % half, &first_cos, &first_sin);
    }

    /* 1. Every load of the thread's units, before any is used. */
    tk_pack<T, Vec> first[PerThread], second[PerThread];
    cursor c = start;
#pragma unroll
    for (int k = 0; k < PerThread; k++) {
        if (c.index < end) {
            const head_ref r = locate(a, first_token + c.token, c.head);
            const T *in = static_cast<const T *>(r.in) + r.in_offset;
            if (c.unit < g.rot_units) {
                const int64_t j0 = c.unit * Vec;
                first[k] = tk_load_pack<T, Vec>(in + (NeoX ? j0 : 2 * j0));
                second[k] = tk_load_pack<T, Vec>(in + (NeoX ? j0 + half : 2 * j0 + Vec));
            } else {
                first[k] = tk_load_pack<T, Vec>(in + a.rotary_dim + (c.unit - g.rot_units) * Vec);
            }
        }
        advance(c, g, heads);
    }

    /* 2. While they are in flight: the angles of the group's tokens, once per (token, pair). */
    if constexpr (Table) {
        for (int e = threadIdx.x; e < entries; e += THREADS) {
            const int token = e / (int)half;
            if (e == (int)threadIdx.x && a.cos_cache) { /* loaded in step 0 */
                cos_table[e] = first_cos;
                sin_table[e] = a.backward ? -first_sin : first_sin;
                continue;
            }
            const int64_t pos = e == (int)threadIdx.x ? first_position : token_position(a, first_token + token);
            pair_cos_sin(a, pos, e - token * (int)half, &cos_table[e], &sin_table[e]);
        }
        __syncthreads();
    }

    /* 3. Rotate and store. The packs stay raw 32-bit words until their step converts them. */
    keep_packed(first);
    keep_packed(second);
    c = start;
    forget(c);
#pragma unroll
    for (int k = 0; k < PerThread; k++) {
        if (c.index < end) {
            const head_ref r = locate(a, first_token + c.token, c.head);
            T *out = static_cast<T *>(r.out) + r.out_offset;
            if (c.unit < g.rot_units) {
                const int64_t j0 = c.unit * Vec;
                /* A few pairs at a time; keep_packed makes each step finish before the next
                 * unpacks, so that only a few f32 values are alive at once. */
                constexpr int STEP = pairs_per_step<Vec>();
#pragma unroll
                for (int e0 = 0; e0 < Vec; e0 += STEP) {
                    tk_pack<float, STEP> cs, sn;
                    if constexpr (Table) { /* whole packs: half and j0 are multiples of Vec */
                        cs = *reinterpret_cast<const tk_pack<float, STEP> *>(cos_table + c.token * half + j0 + e0);
                        sn = *reinterpret_cast<const tk_pack<float, STEP> *>(sin_table + c.token * half + j0 + e0);
                    } else {
                        const int64_t pos = token_position(a, first_token);
#pragma unroll
                        for (int j = 0; j < STEP; j++)
                            pair_cos_sin(a, pos, j0 + e0 + j, &cs.v[j], &sn.v[j]);
                    }
                    rotate_step<T, Vec, NeoX>(first[k], second[k], e0, cs, sn);
                    keep_packed(first[k]);
                    keep_packed(second[k]);
                }
                tk_store_pack<T, Vec>(out + (NeoX ? j0 : 2 * j0), first[k]);
                tk_store_pack<T, Vec>(out + (NeoX ? j0 + half : 2 * j0 + Vec), second[k]);
            } else {
                tk_store_pack<T, Vec>(out + a.rotary_dim + (c.unit - g.rot_units) * Vec, first[k]);
            }
        }
        advance(c, g, heads);
    }
}

template <typename T, int Vec, bool NeoX>
cudaError_t launch(const tk_rope_call *a, const tk_device *dev, cudaStream_t stream) {
    const int64_t heads = a->heads_q + a->heads_k, half = a->rotary_dim / 2;
    rope_shape g;
    g.rot_units = half / Vec;
    g.units = g.rot_units + (a->copy_rest ? (a->head_dim - a->rotary_dim) / Vec : 0);
    const int64_t token_units = heads * g.units;
    /* Without a table (rotary_dim / 2 > TABLE_PAIRS, a cold path) each unit computes Vec angles
     * where it is rotated: one unit per thread keeps that within the registers. */
    const bool table = half <= TABLE_PAIRS;
    const int64_t most_per_thread = table ? PER_THREAD : 1;
    /* Fewer units per thread when that is what it takes to give each SM several blocks (decode). */
    int64_t per_thread = a->tokens * token_units / ((int64_t)THREADS * dev->sm_count * 8);
    per_thread = per_thread < 1 ? 1 : per_thread > most_per_thread ? most_per_thread : per_thread;
    g.block_units = THREADS * per_thread;
    if (token_units <= g.block_units) {
        g.tokens_per_block = g.block_units / token_units;
        g.blocks_per_group = 1;
    } else {
        g.tokens_per_block = 1;
        g.blocks_per_group = (token_units + g.block_units - 1) / g.block_units;
    }
    if (g.tokens_per_block > a->tokens)
        g.tokens_per_block = a->tokens;
    if (!table)
        g.tokens_per_block = 1;
    else if (g.tokens_per_block * half > TABLE_PAIRS)
        g.tokens_per_block = TABLE_PAIRS / half;
    const int64_t rows = THREADS / g.units;
    g.step_unit = THREADS % g.units;
    g.step_head = rows % heads;
    g.step_token = (int)(rows / heads);
    const int64_t blocks = (a->tokens + g.tokens_per_block - 1) / g.tokens_per_block * g.blocks_per_group;
    if (blocks > INT32_MAX) /* 2^31 blocks of >= 256 units: more bytes than a device holds */
        return cudaErrorInvalidConfiguration;
    if (table)
        return tk_launch(rope_kernel<T, Vec, NeoX, true, PER_THREAD>, (unsigned)blocks, THREADS,
                         (size_t)(g.tokens_per_block * half) * 2 * sizeof(float), stream, *a, g);
    return tk_launch(rope_kernel<T, Vec, NeoX, false, 1>, (unsigned)blocks, THREADS, 0, stream, *a, g);
}

template <typename T, int Vec>
cudaError_t launch_style(const tk_rope_call *a, const tk_device *dev, cudaStream_t stream) {
    return a->style == TK_ROPE_NEOX ? launch<T, Vec, true>(a, dev, stream) : launch<T, Vec, false>(a, dev, stream);
}

template <bool Wide>
cudaError_t launch_dtype(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_rope_call *a = static_cast<const tk_rope_call *>(call);
    return tk_dispatch_dtype(a->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return launch_style<T, tk_pack_width<T>(Wide)>(a, dev, stream);
    });
}

} // namespace

extern "C" cudaError_t tk_launch_rope_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<true>(call, dev, stream);
}

extern "C" cudaError_t tk_launch_rope_scalar(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_dtype<false>(call, dev, stream);
}
