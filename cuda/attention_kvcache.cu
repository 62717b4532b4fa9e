/*
 * Attention over a KV cache (token generation, chunked prefill), on the tensor cores of sm_80
 * and newer. The conventions are tk_attention_fwd's (include/tkern.h), per sequence b with
 * shift = seqlen_k(b) - seqlen_q(b):
 *     s_ij = scale q_i . k_j (softcap, ALiBi as in the forward), -inf where j is not visible
 *            (the window and the chunk: attention_softmax.cuh's attn_row_keys)
 *     o_i  = sum_j exp(s_ij) v_j / (exp(sink_h) + sum_j exp(s_ij)),   lse_i = log(denominator)
 * (sink_h = -inf without sinks) with the online softmax of cuda/attention.cuh, exponentials in
 * base 2 (log2 e folded into the scale). Split-KV: split s of a row's keys gives (o_s, lse_s)
 * normalised over its own keys, without the sink;
 *     lse = log(exp(sink_h) + sum_s exp(lse_s)),   o = sum_s exp(lse_s - lse) o_s
 * is exact, and a split without visible keys (lse_s = -inf) weighs 0. The sink joins once: in
 * the decode kernel's epilogue for a row whose sequence runs in one part, else in the merge.
 *
 * Launch shape. Decoding reads every cached key and value once and does 4 flops per query head
 * per byte of K/V: bandwidth is the whole game. A CTA owns one (sequence, key/value head, key
 * range) and 16 query rows, row r = (position, head) = (r / group, r % group) of the GQA group
 * (16 rows: the m16 of mma.sync; a decode step of a group of 4 uses 4 of them, the tensor cores
 * have the time to spare), so each K/V row is read once for every query head that uses it.
 * Sequences with more than 16 / group queries take more CTAs, each re-reading the keys its
 * rows see. The CTA's key range is cut into 16-key tiles dealt round-robin to its warps; each
 * warp streams its tiles through its own STAGES-deep cp.async ring (no barrier between warps
 * until the end) and keeps its own running max, sum and O; the warps' states are merged in
 * shared memory at the end, as the splits are merged by the second kernel.
 *
 *   head dim  warps  stages  shared memory (Q + warps x stages x 16 keys x (K + V))
 *   64        4      4       2 KB + 4 x 4 x 4 KB  = 66 KB   (3 CTAs per H200 SM)
 *   128       4      2       4 KB + 4 x 2 x 8 KB  = 68 KB   (3 CTAs per SM)
 *   256       2      2       8 KB + 2 x 2 x 16 KB = 72 KB   (3 CTAs per SM)
 * Every shape fits the 99 KB of sm_86 / sm_89. In flight per H200 SM: 3 CTAs x 4 warps x 8 KB =
 * 96 KB at head dim 128, above the ~70 KB that 4.8 TB/s x ~2 us of loaded latency / 132 SMs
 * needs. K and V tiles are swizzled (16-byte chunk c of row r at c ^ (r & 7)): the ldmatrix
 * phases (8 rows, one chunk) and the cp.async quarter-warps hit 8 bank groups.
 *
 * Pages. Lane l < 16 of a warp looks up key l of the warp's next tile but one (block table
 * entry and offset in the page) one iteration before the tile is issued, so the table's latency
 * hides behind a tile's compute; the lanes copying a row take its page from that lane by
 * shuffle. Any page size works; keys outside the CTA's visible range, past the sequence, or on a
 * page outside [0, num_pages) are zero-filled, not read.
 *
 * Appending (k_new, v_new) is a small kernel before the attention, one 16-byte chunk per thread,
 * on the same stream: the attention's loads see the new rows, and the attention kernel itself
 * only adds the appended count to each sequence's length. RoPE (rotary_dim > 0) rotates each
 * new key in the append and each CTA's staged Q rows in shared memory, angles from the host's
 * per-pair inverse frequencies (f64) through cuda/rope_angle.cuh.
 *
 * Splits. Only the device sees the lengths, so when the caller leaves the split count to the
 * library every CTA makes the same plan from seqlens_k (kvc_plan_chunk): the sequences' tiles
 * laid end to end, one wave of CTAs each taking an equal run of them, a sequence cut wherever
 * a run ends. The host bounds the plan (parts per sequence, hence the workspace) from the
 * capacity alone. The merge reads each row's own count.
 */
#include "attention_kvcache.h"

#include "attention.cuh"
#include "rope_angle.cuh"

namespace {

constexpr int KVC_ROWS = 16;  /* query rows per CTA: the m16 of mma.sync */
constexpr int KVC_KEYS = 16;  /* keys per warp tile: one k16 step of P V */
constexpr int KVC_MAX_SPLITS = 1024;
constexpr int KVC_MIN_SPLIT_TILES = 16; /* 256 keys: a split reads at least 128 KB at D = 128 */
/* The automatic plan's fixed cost of a piece of work (its Q rows, the ring's first tiles, the
 * warps' merge and the write), in tiles, and the least work it gives a CTA. 64 spread lengths
 * (the bench's) ran at 0.89x / 0.92x / 0.90x copy with 4 / 8 / 24, back to back. */
constexpr int KVC_PIECE_TILES = 8;
constexpr int KVC_MIN_PIECE = KVC_MIN_SPLIT_TILES + KVC_PIECE_TILES;
/* Sequences of equal query counts for this many waves of CTAs leave no room for a split. */
constexpr int KVC_UNSPLIT_WAVES = 8;
/* One sequence's splits take at most this many CTAs per SM. At 2 (64 KB of loads in flight per
 * H200 SM at head dim 128, still enough for the bandwidth) B1 x K131072 ran 0.4-1.7 us faster
 * per call than at 3, the occupancy limit, on two H200s, back to back: 33 splits a row to merge
 * instead of 49, and SMs with registers for the merge's CTAs before the decode's leave. */
constexpr int KVC_ONE_SEQUENCE_CTAS_PER_SM = 2;
/* The merge's CTA, one per row (token, query head). Nsight Compute, merge of B1 x K131072 (32
 * rows, 49 splits) / of 64 spread lengths (2048 rows, mostly unsplit): 256 threads 7.7 / 9.4
 * us, 128 threads 8.3 / 8.4 us, 64 threads 11.1 / 10.4 us. */
constexpr int KVC_COMBINE_THREADS = 128;
constexpr int KVC_APPEND_THREADS = 256;

template <int D> struct kvc_config;
template <> struct kvc_config<64> { static constexpr int WARPS = 4, STAGES = 4; };
template <> struct kvc_config<128> { static constexpr int WARPS = 4, STAGES = 2; };
template <> struct kvc_config<256> { static constexpr int WARPS = 2, STAGES = 2; };

template <int D> struct kvc_shape {
    static constexpr int WARPS = kvc_config<D>::WARPS, STAGES = kvc_config<D>::STAGES;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int CHUNKS = D / 8;
    static constexpr int ROW_BYTES = 2 * D;
    static constexpr int Q_BYTES = KVC_ROWS * ROW_BYTES;
    static constexpr int TILE_BYTES = KVC_KEYS * ROW_BYTES;     /* one K or V tile */
    static constexpr int WARP_BYTES = STAGES * 2 * TILE_BYTES;  /* a warp's ring */
    static constexpr int SMEM_BYTES = Q_BYTES + WARPS * WARP_BYTES;
    /* The warps' final states (f32 O, max, sum) reuse the ring. An O row takes D + 8 floats: at
     * D every row starts on bank 0, so a warp's 64-bit stores (8 rows, 8 floats each) hit the
     * same 8 banks 8 times; at D + 8 four rows fill the 32 banks, 2 passes, the least for 256 B. */
    static constexpr int O_STRIDE = D + 8;
    static_assert(WARPS * KVC_ROWS * (O_STRIDE + 2) * 4 <= WARPS * WARP_BYTES, "merge fits the rings");
};

struct kvc_params {
    const void *q;
    void *k, *v;
    void *o;
    const void *k_new, *v_new; /* NULL: nothing appended */
    float *lse;
    const float *alibi_slopes;
    const int32_t *cu_seqlens_q, *seqlens_k, *block_table;
    float *part_o;   /* [max_splits, tokens, heads_q, D] */
    float *part_lse; /* [max_splits, tokens, heads_q] */
    int *part_count; /* [tokens, heads_q]: the row's splits; NULL when nothing is merged */
    int64_t bt_stride;
    int64_t q_sb, q_ss, q_sh, o_sb, o_ss, o_sh;
    int64_t k_sp, k_ss, k_sh, v_sp, v_ss, v_sh;
    int64_t kn_sb, kn_ss, kn_sh, vn_sb, vn_ss, vn_sh;
    int batch, seqlen_q, total_q, tokens, heads_q, heads_kv, group;
    int page_size, num_pages, capacity;
    tk_divider page_div; /* by page_size */
    int row_chunks;
    int splits;      /* every sequence's, or 0: the automatic plan (kvc_plan_chunk) */
    int max_splits;  /* the most a sequence gets */
    int items;       /* CTAs per (row chunk, key/value head): one per item with fixed splits */
    int window_left, window_right;
    int chunk;           /* chunked local attention, 0 = off */
    const float *sinks;  /* [heads_q] sink logits, or nullptr */
    int transform;
    float scale, softcap, softcap_in, exp_scale;
    /* RoPE (rotary_dim 0: none), as tk_attention_kvcache_call has it */
    int rotary_dim, rope_style;
    const float *rope_cos, *rope_sin;
    int64_t rope_cache_row_stride, rope_max_position;
    float rope_attention_factor;
    double rope_inv_freq[TK_KVCACHE_MAX_ROPE_PAIRS];
};

/* cos and sin of pair i at position pos (times YaRN's attention factor): from the cache (NaN
 * for a position outside it, as tk_rope_fwd), else from the host's inverse frequencies. */
__device__ __forceinline__ void kvc_rope_cos_sin(const kvc_params &p, int64_t pos, int i, float *c, float *s) {
    if (p.rope_cos) {
        const bool in = pos >= 0 && pos < p.rope_max_position;
        *c = in ? p.rope_cos[pos * p.rope_cache_row_stride + i] : __int_as_float(0x7fffffff);
        *s = in ? p.rope_sin[pos * p.rope_cache_row_stride + i] : __int_as_float(0x7fffffff);
        return;
    }
    tk_rope_sincos<true>((double)pos * p.rope_inv_freq[i], s, c);
    *c *= p.rope_attention_factor;
    *s *= p.rope_attention_factor;
}

/* Elements (e1, e2) of pair i: NeoX pairs the halves of rotary_dim, GPT-J adjacent elements. */
__device__ __forceinline__ int2 kvc_rope_pair(const kvc_params &p, int i) {
    return p.rope_style == TK_ROPE_GPTJ ? make_int2(2 * i, 2 * i + 1) : make_int2(i, i + p.rotary_dim / 2);
}

/* Sequence b's query count and first token, clamped to what the host sized. */
__device__ __forceinline__ void kvc_queries(const kvc_params &p, int b, int *count, int *first) {
    if (p.cu_seqlens_q) {
        const int begin = p.cu_seqlens_q[b], end = p.cu_seqlens_q[b + 1];
        *first = begin;
        *count = max(0, min(end - begin, p.seqlen_q));
    } else {
        *first = b * p.seqlen_q;
        *count = p.seqlen_q;
    }
}

/* Sequence b's keys: seqlens_k[b] clamped to the capacity, plus the appended queries' keys. */
__device__ __forceinline__ int kvc_seqlen_k(const kvc_params &p, int b, int seqlen_q) {
    const int cached = min(max(p.seqlens_k[b], 0), p.capacity);
    return p.k_new ? min(cached + seqlen_q, p.capacity) : cached;
}

/* Where key j (visible to the CTA, in [lo, hi]) lives: page and row in it; page -1 = not read. */
__device__ __forceinline__ int2 kvc_lookup(const kvc_params &p, int b, int j, int lo, int hi) {
    if (j < lo || j > hi)
        return make_int2(-1, 0);
    const int slot = tk_div(j, p.page_div);
    const int page = p.block_table ? p.block_table[b * p.bt_stride + slot] : b;
    return make_int2(page, j - slot * p.page_size);
}

/* Issues one 16-key K and V tile into a warp's ring stage; `where` is this lane's lookup of
 * key (lane & 15), taken from the lanes that made it by shuffle. */
template <typename T, int D>
__device__ __forceinline__ void kvc_issue_tile(const kvc_params &p, uint32_t s_k, uint32_t s_v,
                                               const T *k, const T *v, int2 where, int lane) {
    using shape = kvc_shape<D>;
    constexpr int PER_LANE = KVC_KEYS * shape::CHUNKS / 32;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        const int idx = lane + 32 * i;
        const int row = idx / shape::CHUNKS, chunk = idx % shape::CHUNKS;
        int page = __shfl_sync(0xffffffffu, where.x, row);
        const int in_page = __shfl_sync(0xffffffffu, where.y, row);
        const bool ok = page >= 0 && page < p.num_pages;
        page = ok ? page : 0;
        const uint32_t dst = tk_swizzled_offset<shape::CHUNKS>(row, chunk);
        tk_cp_async_16_zfill(s_k + dst, k + page * p.k_sp + in_page * p.k_ss + chunk * 8, ok ? 16 : 0);
        tk_cp_async_16_zfill(s_v + dst, v + page * p.v_sp + in_page * p.v_ss + chunk * 8, ok ? 16 : 0);
    }
}

/* Row chunk rc of sequence b: its queries, keys and the 16-key tiles its rows see. */
struct kvc_chunk {
    int seqlen_q, token0, rows, row0, seqlen_k, shift, key_lo, key_hi, tile_begin, tile_end;
};

/* The mask of a sequence with seqlen_k keys, shift = seqlen_k - seqlen_q (attention_softmax.cuh's:
 * the window and the chunk; the other masks are tk_attention_fwd's alone). */
__device__ __forceinline__ attn_mask kvc_mask(const kvc_params &p, int seqlen_q, int seqlen_k) {
    return {seqlen_k - seqlen_q, seqlen_q, seqlen_k, p.window_left, p.window_right, p.chunk, 0, nullptr};
}

__device__ __forceinline__ kvc_chunk kvc_chunk_of(const kvc_params &p, int b, int rc) {
    kvc_chunk c;
    kvc_queries(p, b, &c.seqlen_q, &c.token0);
    c.rows = c.seqlen_q * p.group;
    c.row0 = rc * KVC_ROWS;
    c.seqlen_k = kvc_seqlen_k(p, b, c.seqlen_q);
    c.shift = c.seqlen_k - c.seqlen_q;
    /* The rows' ranges grow with the position: the first row's start to the last row's end. */
    const attn_mask mask = kvc_mask(p, c.seqlen_q, c.seqlen_k);
    const int pos_last = min(c.row0 + KVC_ROWS, c.rows) - 1;
    c.key_lo = attn_row_keys(mask, attn_docs{}, c.row0 / p.group + c.shift).x;
    c.key_hi = attn_row_keys(mask, attn_docs{}, pos_last / p.group + c.shift).y;
    c.tile_begin = c.key_lo / KVC_KEYS;
    c.tile_end = c.key_hi >= c.key_lo && c.row0 < c.rows ? c.key_hi / KVC_KEYS + 1 : c.tile_begin;
    return c;
}

/* One sequence's plan (batch 1, num_splits 0), closed-form: row chunk rc's tiles cut into
 * splits of at least KVC_MIN_SPLIT_TILES tiles, as many as the CTAs allow (p.max_splits). */
__device__ __forceinline__ int kvc_one_sequence_splits(const kvc_params &p, int rc) {
    const kvc_chunk c = kvc_chunk_of(p, 0, rc);
    const int tiles = c.tile_end - c.tile_begin;
    return min(p.max_splits, max(1, (tiles + KVC_MIN_SPLIT_TILES - 1) / KVC_MIN_SPLIT_TILES));
}

/* A CTA's work item: tiles [lo, hi) (from the chunk's first visible tile) of sequence b (-1:
 * none), part `part` of the `parts` the sequence's keys are cut into. A caller's split count
 * cuts every sequence into equal shares: hi < 0 then, the share computed from part and parts. */
struct kvc_item {
    int b, part, parts, lo, hi;
};

/* A chunk's work in the automatic plan: its tiles and a fixed cost for the piece that starts it
 * (Q rows, the ring's first tiles, the warps' merge and the write); none without rows. */
__device__ __forceinline__ int64_t kvc_work(const kvc_chunk &c) {
    return c.row0 < c.rows ? KVC_PIECE_TILES + (c.tile_end - c.tile_begin) : 0;
}

/* The automatic plan of row chunk rc for CTA g, as lane l of warp 0 holds it. The chunks of all
 * sequences, in order, are laid end to end in work units (kvc_work: the fixed cost first, then
 * the tiles), `total` in all; CTA g of `ctas` takes the units [g total / ctas, (g + 1) total /
 * ctas), cutting a sequence wherever a boundary falls among its tiles. Every CTA gets the same
 * work to within a unit however the lengths spread, and a sequence is cut into as many parts
 * as boundaries fall in it, plus one. Sequences [first, last) are this lane's, `base` the work
 * before them; `before` and `mine` count the CTA's pieces in earlier lanes and in this one. */
struct kvc_planner {
    int first, last, ctas, before, mine;
    int64_t base, total, w0, w1;
};

/* How many of the boundaries k total / ctas, k = 1 .. ctas - 1, are at or before unit y. */
__device__ __forceinline__ int kvc_cuts_through(const kvc_planner &pl, int64_t y) {
    return y < 0 ? 0 : (int)min((int64_t)pl.ctas - 1, ((y + 1) * pl.ctas - 1) / pl.total);
}

/* Sequence b's piece in the CTA's units [w0, w1), its chunk c starting at unit `base`: false if
 * there is none. A chunk without keys (o = 0, lse = -inf to write) belongs to the CTA holding
 * its first unit. */
__device__ __forceinline__ bool kvc_piece(const kvc_planner &pl, const kvc_chunk &c, int b, int64_t base,
                                          kvc_item *item) {
    if (c.row0 >= c.rows)
        return false;
    const int tiles = c.tile_end - c.tile_begin;
    const int64_t first = base + KVC_PIECE_TILES; /* the unit of its first tile */
    if (tiles == 0) {
        *item = kvc_item{b, 0, 1, 0, 0};
        return pl.w0 <= base && base < pl.w1;
    }
    const int lo = (int)min(max(pl.w0 - first, (int64_t)0), (int64_t)tiles);
    const int hi = (int)min(max(pl.w1 - first, (int64_t)0), (int64_t)tiles);
    const int cuts_before = kvc_cuts_through(pl, first);
    *item = kvc_item{b, kvc_cuts_through(pl, first + lo) - cuts_before,
                     1 + kvc_cuts_through(pl, first + tiles - 1) - cuts_before, lo, hi};
    return lo < hi;
}

/* Made by warp 0 of every CTA from the device-side lengths the host cannot see (one warp:
 * shuffles, no barrier, while the CTA has nothing else to do). */
__device__ kvc_planner kvc_plan_chunk(const kvc_params &p, int rc, int g) {
    const int lane = threadIdx.x & 31;
    kvc_planner pl;
    const int per = (p.batch + 31) / 32;
    pl.first = min(p.batch, lane * per);
    pl.last = min(p.batch, pl.first + per);
    int64_t work = 0;
    for (int b = pl.first; b < pl.last; b++)
        work += kvc_work(kvc_chunk_of(p, b, rc));
    int64_t x = work;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t xo = __shfl_up_sync(0xffffffffu, x, o);
        x += lane >= o ? xo : 0;
    }
    pl.base = x - work;
    pl.total = __shfl_sync(0xffffffffu, x, 31);
    /* Each CTA at least KVC_MIN_PIECE units: the workspace bound of kvc_plan_of. */
    pl.ctas = (int)min((int64_t)p.items, max((int64_t)1, pl.total / KVC_MIN_PIECE));
    pl.w0 = g < pl.ctas ? g * pl.total / pl.ctas : pl.total;
    pl.w1 = g < pl.ctas ? (g + 1) * pl.total / pl.ctas : pl.total;
    pl.mine = 0;
    if (pl.base < pl.w1 && pl.base + work > pl.w0) {
        int64_t base = pl.base;
        for (int b = pl.first; b < pl.last; b++) {
            const kvc_chunk c = kvc_chunk_of(p, b, rc);
            kvc_item item;
            pl.mine += kvc_piece(pl, c, b, base, &item);
            base += kvc_work(c);
        }
    }
    int y = pl.mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int yo = __shfl_up_sync(0xffffffffu, y, o);
        y += lane >= o ? yo : 0;
    }
    pl.before = y - pl.mine;
    return pl;
}

/* The CTA's piece f into *out (b = -1 past its last), by warp 0: the lane whose sequences hold
 * it walks them. */
__device__ void kvc_locate(const kvc_params &p, const kvc_planner &pl, int rc, int f, kvc_item *out) {
    if ((threadIdx.x & 31) == 0)
        out->b = -1;
    __syncwarp();
    if (f < pl.before || f >= pl.before + pl.mine)
        return;
    int count = pl.before;
    int64_t base = pl.base;
    for (int b = pl.first; b < pl.last; b++) {
        const kvc_chunk c = kvc_chunk_of(p, b, rc);
        kvc_item item;
        if (kvc_piece(pl, c, b, base, &item) && count++ == f) {
            *out = item;
            return;
        }
        base += kvc_work(c);
    }
}

/* RoPE of the CTA's staged Q rows in shared memory (swizzled as kvc_decode_item stages them):
 * row r of the chunk is position shift + (row0 + r) / group; rows past the sequence stay zero.
 * The rotated values are rounded to T, as tk_rope_fwd's output would be. */
template <typename T, int D>
__device__ __forceinline__ void kvc_rotate_q(const kvc_params &p, unsigned char *smem, int row0, int rows, int shift) {
    constexpr int CHUNKS = D / 8;
    const int pairs = p.rotary_dim / 2;
    const auto at = [&](int r, int e) {
        return reinterpret_cast<T *>(smem + tk_swizzled_offset<CHUNKS>(r, e / 8) + (e % 8) * 2);
    };
    for (int idx = threadIdx.x; idx < KVC_ROWS * pairs; idx += blockDim.x) {
        const int r = idx / pairs, i = idx % pairs;
        if (row0 + r >= rows)
            continue;
        float c, s;
        kvc_rope_cos_sin(p, shift + (row0 + r) / p.group, i, &c, &s);
        const int2 e = kvc_rope_pair(p, i);
        T *x1 = at(r, e.x), *x2 = at(r, e.y);
        const float a = tk_to_float(*x1), b = tk_to_float(*x2);
        *x1 = tk_from_float<T>(a * c - b * s);
        *x2 = tk_from_float<T>(b * c + a * s);
    }
}

/* One work item: tiles of row chunk rc of sequence item.b (kvc_item), key/value head head_kv.
 * Ends with the CTA's shared memory free for the next item. */
template <typename T, int D>
__device__ __forceinline__ void kvc_decode_item(const kvc_params &p, const kvc_item item, int rc, int head_kv,
                                                unsigned char *smem) {
    using shape = kvc_shape<D>;
    constexpr int WARPS = shape::WARPS, STAGES = shape::STAGES, CHUNKS = shape::CHUNKS;
    constexpr int KSTEPS = D / 16, DT = D / 8;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int b = item.b;
    const kvc_chunk ck = kvc_chunk_of(p, b, rc);
    const int rows = ck.rows, row0 = ck.row0, seqlen_k = ck.seqlen_k, shift = ck.shift, token0 = ck.token0;
    if (row0 >= rows)
        return;
    const int key_lo = ck.key_lo, key_hi = ck.key_hi;

    /* This item's share of the chunk's tiles: its own, or the part-th of equal shares. */
    int tile_begin = ck.tile_begin + item.lo, tile_end = ck.tile_begin + item.hi;
    if (item.hi < 0) {
        const int per_part = (ck.tile_end - ck.tile_begin + item.parts - 1) / item.parts;
        tile_begin = min(ck.tile_end, ck.tile_begin + item.part * per_part);
        tile_end = min(ck.tile_end, tile_begin + per_part);
    }
    /* This warp's tiles: tile_begin + warp, + WARPS, ... */
    const int my_tiles = max(0, (tile_end - tile_begin - warp + WARPS - 1) / WARPS);

    const T *k = static_cast<const T *>(p.k) + head_kv * p.k_sh;
    const T *v = static_cast<const T *>(p.v) + head_kv * p.v_sh;
    const uint32_t s_q = tk_smem_address(smem);
    const uint32_t s_ring = s_q + shape::Q_BYTES + warp * shape::WARP_BYTES;

    /* Q rows: (position, head) of the group; rows past the sequence zero-filled. */
    const T *q = static_cast<const T *>(p.q);
    for (int idx = tid; idx < KVC_ROWS * CHUNKS; idx += shape::THREADS) {
        const int r = idx / CHUNKS, c = idx % CHUNKS;
        const int gr = min(row0 + r, rows - 1);
        const int pos = gr / p.group, head = head_kv * p.group + gr % p.group;
        const bool ok = row0 + r < rows && token0 + pos >= 0 && token0 + pos < p.tokens;
        const int64_t at = !ok ? 0
                           : p.cu_seqlens_q ? (int64_t)(token0 + pos) * p.q_ss
                                            : b * p.q_sb + pos * p.q_ss;
        tk_cp_async_16_zfill(s_q + tk_swizzled_offset<CHUNKS>(r, c), q + at + head * p.q_sh + c * 8,
                             ok ? 16 : 0);
    }
    tk_cp_async_commit();

    /* The ring: this warp's i-th tile in stage i % STAGES; `ahead` is the lookup of the next
     * tile to issue, made one iteration early. */
    const auto tile_key0 = [&](int i) { return (tile_begin + warp + i * WARPS) * KVC_KEYS; };
    int2 ahead = make_int2(-1, 0);
    if (0 < my_tiles)
        ahead = kvc_lookup(p, b, tile_key0(0) + (lane & 15), key_lo, key_hi);
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {
        if (i < my_tiles) {
            const uint32_t s_k = s_ring + i * 2 * shape::TILE_BYTES;
            kvc_issue_tile<T, D>(p, s_k, s_k + shape::TILE_BYTES, k, v, ahead, lane);
            if (i + 1 < my_tiles)
                ahead = kvc_lookup(p, b, tile_key0(i + 1) + (lane & 15), key_lo, key_hi);
        }
        tk_cp_async_commit();
    }
    tk_cp_async_wait<STAGES - 2>();
    __syncthreads(); /* every thread's Q chunks have landed */
    if (p.rotary_dim > 0) {
        kvc_rotate_q<T, D>(p, smem, row0, rows, shift);
        __syncthreads();
    }

    /* Rows of this thread's accumulators: g and g + 8 of the chunk (fragment layout of
     * core/sm80.cuh); their visible keys [lo, hi] (empty for rows past the sequence). */
    const int g = lane >> 2, tq = lane & 3;
    const attn_mask mask = kvc_mask(p, ck.seqlen_q, seqlen_k);
    int lo[2], hi[2], qpos[2];
    float slope[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int gr = row0 + g + 8 * h;
        const int pos = gr / p.group;
        qpos[h] = pos;
        slope[h] = p.alibi_slopes && gr < rows ? p.alibi_slopes[head_kv * p.group + gr % p.group] : 0.0f;
        const int2 keys = attn_row_keys(mask, attn_docs{}, pos + shift);
        lo[h] = gr < rows ? keys.x : 0;
        hi[h] = gr < rows ? keys.y : -1;
    }

    const int lrow = lane & 7, lmat = lane >> 3;
    const int frag_row = (lmat & 1) * 8 + lrow, frag_chunk = lmat >> 1;
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[dt][e] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    for (int i = 0; i < my_tiles; i++) {
        tk_cp_async_wait<STAGES - 2>();
        __syncwarp(); /* tile i has landed for every lane; tile i - 1's stage is free */
        const int next = i + STAGES - 1;
        if (next < my_tiles) {
            const uint32_t s_k = s_ring + (next % STAGES) * 2 * shape::TILE_BYTES;
            kvc_issue_tile<T, D>(p, s_k, s_k + shape::TILE_BYTES, k, v, ahead, lane);
            if (next + 1 < my_tiles)
                ahead = kvc_lookup(p, b, tile_key0(next + 1) + (lane & 15), key_lo, key_hi);
        }
        tk_cp_async_commit();
        const uint32_t s_kt = s_ring + (i % STAGES) * 2 * shape::TILE_BYTES;
        const uint32_t s_vt = s_kt + shape::TILE_BYTES;

        /* S (16 rows x 16 keys) = Q K^T */
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            const uint32_t off = tk_swizzled_offset<CHUNKS>(frag_row, 2 * ks + frag_chunk);
            uint32_t a[4], bk[4];
            tk_ldmatrix_x4<false>(a, s_q + off);
            tk_ldmatrix_x4<false>(bk, s_kt + off);
            tk_mma_16816<T>(s[0], a, bk[0], bk[2]);
            tk_mma_16816<T>(s[1], a, bk[1], bk[3]);
        }

        const int col_base = tile_key0(i) + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e >> 1, j = col_base + 8 * nt + (e & 1);
                float x = s[nt][e];
                if (p.transform) { /* natural-log units: softcap, then ALiBi */
                    x = p.softcap > 0.0f ? p.softcap * tanhf(x * p.softcap_in) : x * p.scale;
                    x -= slope[h] * (float)abs(qpos[h] + shift - j);
                }
                s[nt][e] = j < lo[h] || j > hi[h] ? -INFINITY : x;
            }

        /* Online softmax; the 4 threads of a quad share a row. */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = fmaxf(row_max[h], fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]),
                                               fmaxf(s[1][2 * h], s[1][2 * h + 1])));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_use = mx == -INFINITY ? 0.0f : mx;
            const float alpha = tk_exp2_approx((row_max[h] - m_use) * p.exp_scale);
            const float base = m_use * p.exp_scale;
            row_max[h] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float pe = tk_exp2_approx(fmaf(s[nt][2 * h + e], p.exp_scale, -base));
                    s[nt][2 * h + e] = pe;
                    sum += pe;
                }
            row_sum[h] = row_sum[h] * alpha + sum;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                o[dt][2 * h] *= alpha;
                o[dt][2 * h + 1] *= alpha;
            }
        }

        /* O += P V */
        uint32_t a[4];
        tk_mma_a_from_acc<T>(a, s[0], s[1]);
#pragma unroll
        for (int dp = 0; dp < DT / 2; dp++) {
            uint32_t bv[4];
            tk_ldmatrix_x4<true>(bv, s_vt + tk_swizzled_offset<CHUNKS>(frag_row, 2 * dp + frag_chunk));
            tk_mma_16816<T>(o[2 * dp], a, bv[0], bv[1]);
            tk_mma_16816<T>(o[2 * dp + 1], a, bv[2], bv[3]);
        }
    }

    /* Merge the warps: each writes its O (unnormalised), max (log2 units) and sum to the ring. */
    tk_cp_async_wait<0>();
    __syncthreads();
    constexpr int O_STRIDE = shape::O_STRIDE;
    float *w_o = reinterpret_cast<float *>(smem + shape::Q_BYTES);       /* [WARPS][16][O_STRIDE] */
    float *w_max = w_o + WARPS * KVC_ROWS * O_STRIDE;                     /* [WARPS][16] */
    float *w_sum = w_max + WARPS * KVC_ROWS;                              /* [WARPS][16] */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        float sum = row_sum[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (tq == 0) {
            w_max[warp * KVC_ROWS + r] = row_max[h] == -INFINITY ? -INFINITY : row_max[h] * p.exp_scale;
            w_sum[warp * KVC_ROWS + r] = sum;
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            *reinterpret_cast<float2 *>(w_o + (warp * KVC_ROWS + r) * O_STRIDE + dt * 8 + 2 * tq) =
                make_float2(o[dt][2 * h], o[dt][2 * h + 1]);
    }
    __syncthreads();

    /* Each thread: 4 consecutive d of one row at a time. */
    T *out = static_cast<T *>(p.o);
    for (int idx = tid; idx < KVC_ROWS * D / 4; idx += shape::THREADS) {
        const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
        const int gr = row0 + r;
        if (gr >= rows)
            continue;
        const int pos = gr / p.group, head = head_kv * p.group + gr % p.group;
        const int token = token0 + pos;
        if (token < 0 || token >= p.tokens)
            continue;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            m = fmaxf(m, w_max[w * KVC_ROWS + r]);
        float l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (m != -INFINITY) {
#pragma unroll
            for (int w = 0; w < WARPS; w++) {
                const float wm = w_max[w * KVC_ROWS + r];
                const float scale = wm == -INFINITY ? 0.0f : tk_exp2_approx(wm - m);
                l += scale * w_sum[w * KVC_ROWS + r];
                const float4 x = *reinterpret_cast<const float4 *>(w_o + (w * KVC_ROWS + r) * O_STRIDE + d);
                acc[0] += scale * x.x, acc[1] += scale * x.y, acc[2] += scale * x.z, acc[3] += scale * x.w;
            }
        }
        /* The sink joins the row once: here when this item is the row's only part, else at
         * the merge. */
        const float sink2 = p.sinks && item.parts == 1 ? p.sinks[head] * ATTN_LOG2E : -INFINITY;
        float inv, lse;
        attn_finish_row(l, m, sink2, inv, lse);
        const int64_t row_index = (int64_t)token * p.heads_q + head;
        if (p.part_count && item.part == 0 && d == 0)
            p.part_count[row_index] = item.parts;
        if (item.parts > 1) {
            *reinterpret_cast<float4 *>(p.part_o + ((int64_t)item.part * p.tokens * p.heads_q + row_index) * D + d) =
                make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
            if (d == 0)
                p.part_lse[(int64_t)item.part * p.tokens * p.heads_q + row_index] = lse;
            continue;
        }
        const int64_t at = (p.cu_seqlens_q ? (int64_t)token * p.o_ss : b * p.o_sb + pos * p.o_ss) + head * p.o_sh + d;
        uint2 packed;
        packed.x = tk_pack2<T>(acc[0] * inv, acc[1] * inv);
        packed.y = tk_pack2<T>(acc[2] * inv, acc[3] * inv);
        *reinterpret_cast<uint2 *>(out + at) = packed;
        if (p.lse && d == 0)
            p.lse[p.cu_seqlens_q ? (int64_t)head * p.total_q + token
                                 : ((int64_t)b * p.heads_q + head) * p.seqlen_q + pos] = lse;
    }
}

/* Block -> (row chunk, CTA g, key/value head), the head fastest: the CTAs running together
 * read whole cache rows (every head of a key). A fixed split count gives each CTA its item g;
 * the automatic plan launches one wave of CTAs (p.items per row chunk and head), CTA g taking
 * its equal share of the work (kvc_plan_chunk) as pieces of one or more sequences. A grid sized
 * for the most items a plan could make queued thousands of CTAs without an item behind the
 * working ones, and they ran in the slots the working ones freed (B1 x K131072 at 0.63x copy). */
/* Left to itself, ptxas holds the head-dim-64 kernel to 128 registers on sm_86 and sm_89 and
 * spills 12 bytes there; telling it one CTA per SM is enough (all their 100 KB of shared memory
 * holds anyway) lifts that. sm_90 keeps the bound it was measured with. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define KVC_DECODE_BOUNDS(threads) __launch_bounds__(threads, 1)
#else
#define KVC_DECODE_BOUNDS(threads) __launch_bounds__(threads)
#endif
template <typename T, int D>
__global__ void KVC_DECODE_BOUNDS(kvc_shape<D>::THREADS) kvcache_decode_kernel(const kvc_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
#if __CUDA_ARCH__ >= 900
    /* The merge may be scheduled once every CTA here has started: it waits for this grid's end
     * (cudaGridDependencySynchronize) with its launch already done. */
    cudaTriggerProgrammaticLaunchCompletion();
#endif
    const int head_kv = (int)(blockIdx.x % (unsigned)p.heads_kv);
    const int rest = (int)(blockIdx.x / (unsigned)p.heads_kv);
    const int rc = rest / p.items, g = rest % p.items;
    /* With a fixed split count (the caller's, or one sequence's below) the CTA's one item is
     * split g % splits of sequence g / splits; with the automatic plan warp 0 finds its pieces
     * one by one. The planner's per-lane state waits in shared memory, so the item loop below,
     * the one copy of the decode for every kind of plan, keeps no register for it. */
    __shared__ kvc_item next;
    __shared__ kvc_planner plans[32];
    const bool planner = threadIdx.x < 32;
    int splits = p.splits;
    if (p.splits == 0 && p.batch == 1) {
        /* One sequence: nothing to balance between sequences, so the plan is closed-form, splits
         * of at least KVC_MIN_SPLIT_TILES tiles filling the CTAs, CTA g taking split g. Every
         * CTA waits on its plan before its first load: the equal-run plan comes to about the
         * same cut and took 0.3-2.5 us longer at B1 x K131072, back to back. */
        splits = kvc_one_sequence_splits(p, rc);
        if (g >= splits)
            return;
    } else if (planner && p.splits == 0) {
        plans[threadIdx.x] = kvc_plan_chunk(p, rc, g);
    }
    for (int f = 0;; f++) {
        if (planner) {
            if (splits > 0) {
                if (threadIdx.x == 0)
                    next = f == 0 ? kvc_item{g / splits, g % splits, splits, 0, -1} : kvc_item{-1, 0, 0, 0, 0};
            } else {
                kvc_locate(p, plans[threadIdx.x], rc, f, &next);
            }
        }
        __syncthreads(); /* `next` is set; the previous item's shared memory is free */
        const kvc_item item = next;
        __syncthreads(); /* every thread has read `next` */
        if (item.b < 0)
            return;
        kvc_decode_item<T, D>(p, item, rc, head_kv, smem);
    }
}

/* The append: thread = one 16-byte chunk of one new key and value row, (sequence, position,
 * head, chunk) from the slowest index to the fastest; rows past the capacity, on a page
 * outside the pool or for a token outside [0, tokens) are dropped. */
template <typename T, int D>
__global__ void __launch_bounds__(KVC_APPEND_THREADS) kvcache_append_kernel(const kvc_params p) {
    constexpr int CHUNKS = D / 8;
    const int64_t idx = (int64_t)blockIdx.x * KVC_APPEND_THREADS + threadIdx.x;
    const int chunk = (int)(idx % CHUNKS);
    int64_t rest = idx / CHUNKS;
    const int head = (int)(rest % p.heads_kv);
    rest /= p.heads_kv;
    const int pos = (int)(rest % p.seqlen_q);
    const int b = (int)(rest / p.seqlen_q);
    if (b >= p.batch)
        return;
    int seqlen_q, token0;
    kvc_queries(p, b, &seqlen_q, &token0);
    const int token = token0 + pos;
    const int j = min(max(p.seqlens_k[b], 0), p.capacity) + pos;
    if (pos >= seqlen_q || token < 0 || token >= p.tokens || j >= p.capacity)
        return;
    const int slot = j / p.page_size;
    const int page = p.block_table ? p.block_table[b * p.bt_stride + slot] : b;
    if (page < 0 || page >= p.num_pages)
        return;
    const int in_page = j - slot * p.page_size;
    const int64_t kn = (p.cu_seqlens_q ? (int64_t)token * p.kn_ss : b * p.kn_sb + pos * p.kn_ss) + head * p.kn_sh;
    const int64_t vn = (p.cu_seqlens_q ? (int64_t)token * p.vn_ss : b * p.vn_sb + pos * p.vn_ss) + head * p.vn_sh;
    T *k = static_cast<T *>(p.k) + page * p.k_sp + in_page * p.k_ss + head * p.k_sh;
    T *v = static_cast<T *>(p.v) + page * p.v_sp + in_page * p.v_ss + head * p.v_sh + chunk * 8;
    const T *k_new = static_cast<const T *>(p.k_new) + kn;
    *reinterpret_cast<uint4 *>(v) = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.v_new) + vn + chunk * 8);
    if (chunk * 8 >= p.rotary_dim) {
        *reinterpret_cast<uint4 *>(k + chunk * 8) = *reinterpret_cast<const uint4 *>(k_new + chunk * 8);
        return;
    }
    /* RoPE at the key's position j. NeoX: the thread of chunk c < rotary_dim / 16 rotates it
     * with its partner c + rotary_dim / 16 (whose own thread has nothing to do); GPT-J: the
     * chunk's 4 adjacent pairs. */
    const int half = p.rotary_dim / 16;
    if (p.rope_style != TK_ROPE_GPTJ && chunk >= half)
        return;
    const int c2 = p.rope_style == TK_ROPE_GPTJ ? chunk : chunk + half;
    tk_pack<T, 8> x = tk_load_pack<T, 8>(k_new + chunk * 8), y = tk_load_pack<T, 8>(k_new + c2 * 8);
    if (p.rope_style == TK_ROPE_GPTJ) {
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
            const int i = (chunk * 8 + e) / 2;
            float c, s;
            kvc_rope_cos_sin(p, j, i, &c, &s);
            const float a = tk_to_float(x.v[e]), b = tk_to_float(x.v[e + 1]);
            x.v[e] = tk_from_float<T>(a * c - b * s);
            x.v[e + 1] = tk_from_float<T>(b * c + a * s);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int i = chunk * 8 + e;
            float c, s;
            kvc_rope_cos_sin(p, j, i, &c, &s);
            const float a = tk_to_float(x.v[e]), b = tk_to_float(y.v[e]);
            x.v[e] = tk_from_float<T>(a * c - b * s);
            y.v[e] = tk_from_float<T>(b * c + a * s);
        }
        tk_store_pack<T, 8>(k + c2 * 8, y);
    }
    tk_store_pack<T, 8>(k + chunk * 8, x);
}

/* The split merge: one CTA per (token, query head), over the splits its sequence had (1: that
 * CTA wrote o itself). Each group of threads that spans a row of D floats takes every
 * GROUPS-th split. Its time is a chain of dependent loads after the decode's last CTA, so the
 * chain is short: once the count is known, the first BATCH splits' partials of each group are
 * loaded into registers, and the weights exp(lse_s - M) are computed while they are in flight.
 * A loop that waited on each split's load took longer than the decode's tail. The groups' sums
 * meet in shared memory. */
template <typename T, int D>
__global__ void __launch_bounds__(KVC_COMBINE_THREADS) kvcache_combine_kernel(const kvc_params p) {
    constexpr int COLS = D / 4;                             /* float4 columns of a row */
    constexpr int LANES = COLS < 32 ? COLS : 32;            /* threads per split */
    constexpr int GROUPS = KVC_COMBINE_THREADS / LANES;     /* splits in flight per step */
    constexpr int PER_LANE = COLS / LANES;
    /* A group's splits per pass, 4 float4 a thread: at 16, fewer merge CTAs fit an SM, and 64
     * spread lengths' 2048 rows took 5 us longer (B1 x K131072: 1 us shorter); 8: 2.5 us. */
    constexpr int BATCH = 4 / PER_LANE;
    __shared__ float weight[KVC_MAX_SPLITS];
    __shared__ float scratch[32];
    __shared__ float4 sums[GROUPS][COLS];
    const int64_t row = blockIdx.x;
    const int tid = threadIdx.x, col = tid % LANES, group = tid / LANES;
    const int64_t rows = (int64_t)p.tokens * p.heads_q;
    const int token = (int)(row / p.heads_q), head = (int)(row % p.heads_q);
    /* The row's split count. A caller's count and one sequence's closed-form plan follow from
     * the lengths, which the decode kernel does not write, so they are known before its end,
     * one dependent load fewer after it; the general plan's count is the one its split 0 left. */
    int n = p.splits;
    if (p.splits == 0 && p.batch == 1) {
        int seqlen_q, token0;
        kvc_queries(p, 0, &seqlen_q, &token0);
        n = kvc_one_sequence_splits(p, ((token - token0) * p.group + head % p.group) / KVC_ROWS);
    }
#if __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize(); /* launched early (programmatic dependent launch) */
#endif
    if (n == 0)
        n = min(max(p.part_count[row], 0), p.max_splits);
    if (n <= 1)
        return;
    float m = -INFINITY, l = 0.0f;
    float4 acc[PER_LANE];
#pragma unroll
    for (int c = 0; c < PER_LANE; c++)
        acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < n; s0 += GROUPS * BATCH) {
        float4 x[BATCH][PER_LANE];
#pragma unroll
        for (int i = 0; i < BATCH; i++) {
            const int s = s0 + group + GROUPS * i;
            const float4 *part = reinterpret_cast<const float4 *>(p.part_o + (s * rows + row) * D);
#pragma unroll
            for (int c = 0; c < PER_LANE; c++) {
                x[i][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (s < n)
                    x[i][c] = part[col + c * LANES];
            }
        }
        if (s0 == 0) { /* the weights, while the first pass's loads are in flight */
            const float *lse_s = p.part_lse + row;
            for (int s = tid; s < n; s += KVC_COMBINE_THREADS)
                m = fmaxf(m, weight[s] = lse_s[s * rows]);
            m = tk_block_max(m, scratch);
            for (int s = tid; s < n; s += KVC_COMBINE_THREADS) {
                const float w = m == -INFINITY || weight[s] == -INFINITY ? 0.0f : __expf(weight[s] - m);
                weight[s] = w;
                l += w;
            }
            l = tk_block_sum(l, scratch); /* its barriers also publish weight[] */
        }
#pragma unroll
        for (int i = 0; i < BATCH; i++) {
            const int s = s0 + group + GROUPS * i;
            const float w = s < n ? weight[s] : 0.0f;
            if (w == 0.0f) /* an empty split (or none): its o is 0 */
                continue;
#pragma unroll
            for (int c = 0; c < PER_LANE; c++)
                acc[c].x += w * x[i][c].x, acc[c].y += w * x[i][c].y, acc[c].z += w * x[i][c].z,
                    acc[c].w += w * x[i][c].w;
        }
    }
    /* l = sum_s exp(lse_s - m) is a row sum against max exp2(m log2 e): the sink joins it once,
     * as a part without a value, through the decode epilogue's own finish. */
    float inv, lse;
    attn_finish_row(l, m * ATTN_LOG2E, p.sinks ? p.sinks[head] * ATTN_LOG2E : -INFINITY, inv, lse);
#pragma unroll
    for (int c = 0; c < PER_LANE; c++)
        sums[group][col + c * LANES] = acc[c];
    __syncthreads();
    int b = 0, pos = token;
    if (!p.cu_seqlens_q)
        b = token / p.seqlen_q, pos = token % p.seqlen_q;
    T *out = static_cast<T *>(p.o) +
             (p.cu_seqlens_q ? (int64_t)token * p.o_ss : b * p.o_sb + pos * p.o_ss) + head * p.o_sh;
    for (int c = tid; c < COLS; c += KVC_COMBINE_THREADS) {
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int g = 0; g < GROUPS; g++)
            x.x += sums[g][c].x, x.y += sums[g][c].y, x.z += sums[g][c].z, x.w += sums[g][c].w;
        uint2 packed;
        packed.x = tk_pack2<T>(x.x * inv, x.y * inv);
        packed.y = tk_pack2<T>(x.z * inv, x.w * inv);
        *reinterpret_cast<uint2 *>(out + c * 4) = packed;
    }
    if (p.lse && tid == 0)
        p.lse[p.cu_seqlens_q ? (int64_t)head * p.total_q + token
                             : ((int64_t)b * p.heads_q + head) * p.seqlen_q + pos] = lse;
}

/* How a call is cut into work items (the fields of kvc_params of the same names). */
struct kvc_plan {
    int splits, max_splits, items;
};

int kvc_row_chunks(const tk_attention_kvcache_call *c) {
    const int64_t rows = (int64_t)c->seqlen_q * (c->heads_q / c->heads_kv);
    return (int)((rows + KVC_ROWS - 1) / KVC_ROWS);
}

/* The append (when k_new is set), then, unless append_only, the decode kernel and the merge. */
template <typename T, int D>
cudaError_t kvc_launch(const tk_attention_kvcache_call *c, const kvc_plan &plan, const tk_device *dev,
                       cudaStream_t stream, bool append_only) {
    using shape = kvc_shape<D>;
    constexpr auto kernel = kvcache_decode_kernel<T, D>;
    cudaError_t err = tk_opt_in_smem<kernel>(dev, shape::SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    kvc_params p;
    p.q = c->q, p.k = c->k, p.v = c->v, p.o = c->o;
    p.k_new = c->k_new, p.v_new = c->v_new;
    p.kn_sb = c->k_new_stride[0], p.kn_ss = c->k_new_stride[1], p.kn_sh = c->k_new_stride[2];
    p.vn_sb = c->v_new_stride[0], p.vn_ss = c->v_new_stride[1], p.vn_sh = c->v_new_stride[2];
    p.lse = c->lse;
    p.alibi_slopes = c->alibi_slopes;
    p.cu_seqlens_q = c->cu_seqlens_q;
    p.seqlens_k = c->seqlens_k;
    p.block_table = c->block_table;
    p.bt_stride = c->block_table_stride;
    p.q_sb = c->q_stride[0], p.q_ss = c->q_stride[1], p.q_sh = c->q_stride[2];
    p.o_sb = c->o_stride[0], p.o_ss = c->o_stride[1], p.o_sh = c->o_stride[2];
    p.k_sp = c->k_stride[0], p.k_ss = c->k_stride[1], p.k_sh = c->k_stride[2];
    p.v_sp = c->v_stride[0], p.v_ss = c->v_stride[1], p.v_sh = c->v_stride[2];
    p.batch = c->batch;
    p.seqlen_q = c->seqlen_q;
    p.total_q = c->total_q;
    p.tokens = (int)tk_attention_kvcache_tokens(c);
    p.heads_q = c->heads_q;
    p.heads_kv = c->heads_kv;
    p.group = c->heads_q / c->heads_kv;
    p.page_size = c->page_size;
    p.page_div = tk_divider_of((unsigned)c->page_size);
    p.num_pages = c->num_pages;
    p.capacity = c->pages_per_seq * c->page_size;
    p.row_chunks = kvc_row_chunks(c);
    p.splits = plan.splits;
    p.max_splits = plan.max_splits;
    p.items = plan.items;
    attn_set_cache_mask(p, c);
    attn_set_score(p, c->scale, c->softcap, c->alibi_slopes != NULL);
    p.rotary_dim = c->rotary_dim;
    p.rope_style = c->rope_style;
    p.rope_cos = c->rope_cos;
    p.rope_sin = c->rope_sin;
    p.rope_cache_row_stride = c->rope_cache_row_stride;
    p.rope_max_position = c->rope_max_position;
    p.rope_attention_factor = c->rope_attention_factor;
    memcpy(p.rope_inv_freq, c->rope_inv_freq, sizeof p.rope_inv_freq);
    const bool merge = plan.max_splits > 1;
    const int64_t part_rows = (int64_t)plan.max_splits * p.tokens * p.heads_q;
    p.part_o = merge ? static_cast<float *>(c->workspace) : NULL;
    p.part_lse = merge ? p.part_o + part_rows * D : NULL;
    p.part_count = merge ? reinterpret_cast<int *>(p.part_lse + part_rows) : NULL;
    if (c->k_new) {
        const int64_t chunks = (int64_t)c->batch * c->seqlen_q * c->heads_kv * (D / 8);
        err = tk_launch(kvcache_append_kernel<T, D>,
                        (unsigned)((chunks + KVC_APPEND_THREADS - 1) / KVC_APPEND_THREADS),
                        KVC_APPEND_THREADS, 0, stream, p);
        if (err != cudaSuccess)
            return err;
    }
    if (append_only)
        return cudaSuccess;
    const unsigned blocks = (unsigned)((int64_t)p.row_chunks * plan.items * c->heads_kv);
    err = tk_launch(kernel, blocks, shape::THREADS, shape::SMEM_BYTES, stream, p);
    if (err != cudaSuccess || !merge)
        return err;
    const int64_t rows = (int64_t)p.tokens * p.heads_q;
    /* On sm_90 the merge's launch overlaps the decode kernel's last CTAs (tk_early_launch: where
     * the merge's code waits for it). */
    constexpr auto combine = kvcache_combine_kernel<T, D>;
    cudaLaunchAttribute early;
    unsigned early_count;
    err = tk_early_launch<combine>(dev, &early, &early_count);
    if (err != cudaSuccess)
        return err;
    return tk_launch(tk_launch_config((unsigned)rows, KVC_COMBINE_THREADS, 0, stream, &early, early_count), combine, p);
}

template <int D>
cudaError_t kvc_launch_head_dim(const tk_attention_kvcache_call *c, const kvc_plan &plan,
                                const tk_device *dev, cudaStream_t stream, bool append_only) {
    return tk_dispatch_dtype16(c->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return kvc_launch<T, D>(c, plan, dev, stream, append_only);
    });
}

/* Resident CTAs per SM of the decode kernel as the driver reports it for this device (shared
 * memory opted in first, so the query sees the size the launch uses); cached per device. */
template <int D> int kvc_blocks_per_sm(const tk_attention_kvcache_call *c, const tk_device *dev) {
    static tk_device_cache<1> cache;
    int blocks = 1;
    const cudaError_t err = cache.get(dev, 0, &blocks, [c, dev](int *v) {
        return tk_dispatch_dtype16(c->dtype, [&](auto type) {
            using T = typename decltype(type)::type;
            using shape = kvc_shape<D>;
            constexpr auto kernel = kvcache_decode_kernel<T, D>;
            const cudaError_t e = tk_opt_in_smem<kernel>(dev, shape::SMEM_BYTES);
            if (e != cudaSuccess)
                return e;
            const cudaError_t q =
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(v, kernel, shape::THREADS, shape::SMEM_BYTES);
            *v = max(1, *v);
            return q;
        });
    });
    return err == cudaSuccess ? blocks : 1;
}

int kvc_resident_slots(const tk_attention_kvcache_call *c, const tk_device *dev) {
    const int per_sm = c->head_dim == 64    ? kvc_blocks_per_sm<64>(c, dev)
                       : c->head_dim == 128 ? kvc_blocks_per_sm<128>(c, dev)
                                            : kvc_blocks_per_sm<256>(c, dev);
    return per_sm * dev->sm_count;
}

/* The split plan the host can make: a caller's count as it is (a CTA per item); else the
 * frame of the automatic plan that every CTA makes from the lengths (kvc_plan_chunk): `items`
 * = the CTA slots of one wave per (row chunk, key/value head), as many CTAs. A sequence's parts
 * are at most the CTAs, and, each CTA taking at least KVC_MIN_PIECE units, at most one more
 * than ceil(capacity tiles / KVC_MIN_PIECE): that bounds the workspace. A capacity of one
 * split's worth of keys runs unsplit. */
kvc_plan kvc_plan_of(const tk_attention_kvcache_call *c, const tk_device *dev) {
    if (c->num_splits > 0)
        return kvc_plan{c->num_splits, c->num_splits, c->batch * c->num_splits};
    const int64_t per_item = (int64_t)c->heads_kv * kvc_row_chunks(c);
    int64_t slots = kvc_resident_slots(c, dev);
    if (c->batch == 1)
        slots = min(slots, (int64_t)KVC_ONE_SEQUENCE_CTAS_PER_SM * dev->sm_count);
    const int64_t budget = max((int64_t)1, slots / per_item);
    const int64_t items = min(budget, (int64_t)KVC_MAX_SPLITS);
    const int64_t capacity = (int64_t)c->pages_per_seq * c->page_size;
    const int64_t cap_tiles = (capacity + KVC_KEYS - 1) / KVC_KEYS;
    const int64_t most = min(items, 1 + (cap_tiles + KVC_MIN_PIECE - 1) / KVC_MIN_PIECE);
    const bool unsplit = !c->cu_seqlens_q && c->batch >= KVC_UNSPLIT_WAVES * budget;
    if (cap_tiles <= KVC_MIN_SPLIT_TILES || most <= 1 || unsplit)
        return kvc_plan{1, 1, c->batch};
    return kvc_plan{0, (int)most, (int)items};
}

} // namespace

extern "C" int tk_attention_kvcache_splits(const tk_attention_kvcache_call *c, const tk_device *dev) {
    return kvc_plan_of(c, dev).max_splits;
}
extern "C" size_t tk_attention_kvcache_workspace_bytes(const tk_attention_kvcache_call *c, int splits) {
    if (splits <= 1)
        return 0;
    const size_t rows = (size_t)tk_attention_kvcache_tokens(c) * (size_t)c->heads_q;
    return ((size_t)splits * rows * ((size_t)c->head_dim + 1) + rows) * 4;
}

extern "C" cudaError_t tk_attention_kvcache_launch_decode(const void *call, const tk_device *dev,
                                                          cudaStream_t stream) {
    const tk_attention_kvcache_call *c = static_cast<const tk_attention_kvcache_call *>(call);
    const kvc_plan plan = kvc_plan_of(c, dev);
    switch (c->head_dim) {
    case 64: return kvc_launch_head_dim<64>(c, plan, dev, stream, false);
    case 128: return kvc_launch_head_dim<128>(c, plan, dev, stream, false);
    case 256: return kvc_launch_head_dim<256>(c, plan, dev, stream, false);
    }
    return cudaErrorInvalidValue; /* src/attention_kvcache.c admits only the head dims above */
}

extern "C" cudaError_t tk_attention_kvcache_append(const tk_attention_kvcache_call *c, const tk_device *dev,
                                                   cudaStream_t stream) {
    const kvc_plan unsplit = {1, 1, c->batch}; /* the append reads no plan */
    switch (c->head_dim) {
    case 64: return kvc_launch_head_dim<64>(c, unsplit, dev, stream, true);
    case 128: return kvc_launch_head_dim<128>(c, unsplit, dev, stream, true);
    case 256: return kvc_launch_head_dim<256>(c, unsplit, dev, stream, true);
    }
    return cudaErrorInvalidValue;
}
