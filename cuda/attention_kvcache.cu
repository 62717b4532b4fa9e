/*
 * Attention over a KV cache (token generation, chunked prefill), on the tensor cores of sm_80
 * and newer. The conventions are tk_attention_fwd's (include/tkern.h), per sequence b with
 * shift = seqlen_k(b) - seqlen_q(b):
 *     s_ij = scale q_i . k_j (softcap, ALiBi as in the forward), -inf where j is not visible
 *     o_i  = sum_j exp(s_ij - m_i) v_j / sum_j exp(s_ij - m_i),   lse_i = m_i + log sum_j ...
 * with the online softmax of cuda/attention.cuh, exponentials in base 2 (log2 e folded into the
 * scale). Split-KV: split s of a row's keys gives (o_s, lse_s) normalised over its own keys;
 *     lse = log sum_s exp(lse_s),   o = sum_s exp(lse_s - lse) o_s
 * is exact, and a split without visible keys (lse_s = -inf) weighs 0.
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
 * only adds the appended count to each sequence's length.
 *
 * The number of splits (when the caller leaves it to the library) fills the device's resident
 * CTAs: FlashAttention's heuristic, the smallest count within 85 % of the best wave efficiency.
 */
#include "attention_kvcache.h"

#include "attention.cuh"

namespace {

constexpr int KVC_ROWS = 16;  /* query rows per CTA: the m16 of mma.sync */
constexpr int KVC_KEYS = 16;  /* keys per warp tile: one k16 step of P V */
constexpr int KVC_MAX_SPLITS = 1024;
constexpr int KVC_MIN_SPLIT_KEYS = 256;
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
    /* The warps' final states (f32 O, max, sum) reuse the ring. */
    static_assert(WARPS * KVC_ROWS * (D + 2) * 4 <= WARPS * WARP_BYTES, "merge fits the rings");
};

struct kvc_params {
    const void *q;
    void *k, *v;
    void *o;
    const void *k_new, *v_new; /* NULL: nothing appended */
    float *lse;
    const float *alibi_slopes;
    const int32_t *cu_seqlens_q, *seqlens_k, *block_table;
    float *part_o;   /* [splits, tokens, heads_q, D] */
    float *part_lse; /* [splits, tokens, heads_q] */
    int64_t bt_stride;
    int64_t q_sb, q_ss, q_sh, o_sb, o_ss, o_sh;
    int64_t k_sp, k_ss, k_sh, v_sp, v_ss, v_sh;
    int64_t kn_sb, kn_ss, kn_sh, vn_sb, vn_ss, vn_sh;
    int batch, seqlen_q, total_q, tokens, heads_q, heads_kv, group;
    int page_size, num_pages, capacity;
    int row_chunks, splits;
    int window_left, window_right;
    int transform;
    float scale, softcap, softcap_in, exp_scale;
};

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
    const int slot = j / p.page_size;
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

template <typename T, int D>
__global__ void __launch_bounds__(kvc_shape<D>::THREADS) kvcache_decode_kernel(const kvc_params p) {
    using shape = kvc_shape<D>;
    constexpr int WARPS = shape::WARPS, STAGES = shape::STAGES, CHUNKS = shape::CHUNKS;
    constexpr int KSTEPS = D / 16, DT = D / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    /* Block -> (split, key/value head, sequence, row chunk), split fastest. */
    unsigned block = blockIdx.x;
    const int split = (int)(block % (unsigned)p.splits);
    block /= (unsigned)p.splits;
    const int head_kv = (int)(block % (unsigned)p.heads_kv);
    block /= (unsigned)p.heads_kv;
    const int b = (int)(block % (unsigned)p.batch);
    const int chunk = (int)(block / (unsigned)p.batch);

    int seqlen_q, token0;
    kvc_queries(p, b, &seqlen_q, &token0);
    const int rows = seqlen_q * p.group;
    const int row0 = chunk * KVC_ROWS;
    if (row0 >= rows)
        return;
    const int seqlen_k = kvc_seqlen_k(p, b, seqlen_q);
    const int shift = seqlen_k - seqlen_q;

    /* Keys any row of the chunk sees, its 16-key tiles, and this split's share of them. */
    const int pos_first = row0 / p.group, pos_last = min(row0 + KVC_ROWS, rows) - 1;
    int key_lo, key_hi;
    attn_visible_keys(pos_first, pos_last / p.group, shift, seqlen_k, p.window_left, p.window_right, key_lo, key_hi);
    int tile_begin = key_lo / KVC_KEYS, tile_end = key_hi >= key_lo ? key_hi / KVC_KEYS + 1 : tile_begin;
    const int per_split = (tile_end - tile_begin + p.splits - 1) / p.splits;
    tile_begin = min(tile_end, tile_begin + split * per_split);
    tile_end = min(tile_end, tile_begin + per_split);
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

    /* Rows of this thread's accumulators: g and g + 8 of the chunk (fragment layout of
     * core/sm80.cuh); their visible keys [lo, hi] (empty for rows past the sequence). */
    const int g = lane >> 2, tq = lane & 3;
    int lo[2], hi[2], qpos[2];
    float slope[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int gr = row0 + g + 8 * h;
        const int pos = gr / p.group;
        qpos[h] = pos;
        slope[h] = p.alibi_slopes && gr < rows ? p.alibi_slopes[head_kv * p.group + gr % p.group] : 0.0f;
        lo[h] = p.window_left >= 0 ? pos + shift - p.window_left : 0;
        hi[h] = p.window_right >= 0 ? min(seqlen_k - 1, pos + shift + p.window_right) : seqlen_k - 1;
        if (gr >= rows)
            lo[h] = 0, hi[h] = -1;
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
    float *w_o = reinterpret_cast<float *>(smem + shape::Q_BYTES);       /* [WARPS][16][D] */
    float *w_max = w_o + WARPS * KVC_ROWS * D;                            /* [WARPS][16] */
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
            *reinterpret_cast<float2 *>(w_o + (warp * KVC_ROWS + r) * D + dt * 8 + 2 * tq) =
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
                const float4 x = *reinterpret_cast<const float4 *>(w_o + (w * KVC_ROWS + r) * D + d);
                acc[0] += scale * x.x, acc[1] += scale * x.y, acc[2] += scale * x.z, acc[3] += scale * x.w;
            }
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const float lse = l > 0.0f ? (m + __log2f(l)) * ATTN_LN2 : -INFINITY;
        const int64_t row_index = (int64_t)token * p.heads_q + head;
        if (p.splits > 1) {
            *reinterpret_cast<float4 *>(p.part_o + ((int64_t)split * p.tokens * p.heads_q + row_index) * D + d) =
                make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
            if (d == 0)
                p.part_lse[(int64_t)split * p.tokens * p.heads_q + row_index] = lse;
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
    T *k = static_cast<T *>(p.k) + page * p.k_sp + in_page * p.k_ss + head * p.k_sh + chunk * 8;
    T *v = static_cast<T *>(p.v) + page * p.v_sp + in_page * p.v_ss + head * p.v_sh + chunk * 8;
    *reinterpret_cast<uint4 *>(k) = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.k_new) + kn + chunk * 8);
    *reinterpret_cast<uint4 *>(v) = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.v_new) + vn + chunk * 8);
}

/* The split merge: one warp per (token, query head). */
template <typename T, int D>
__global__ void __launch_bounds__(KVC_COMBINE_THREADS) kvcache_combine_kernel(const kvc_params p) {
    const int64_t row = (int64_t)blockIdx.x * (KVC_COMBINE_THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const int64_t rows = (int64_t)p.tokens * p.heads_q;
    if (row >= rows)
        return;
    float m = -INFINITY;
    for (int s = lane; s < p.splits; s += 32)
        m = fmaxf(m, p.part_lse[s * rows + row]);
    m = tk_warp_max(m);
    float l = 0.0f;
    if (m != -INFINITY)
        for (int s = lane; s < p.splits; s += 32)
            l += __expf(p.part_lse[s * rows + row] - m);
    l = tk_warp_sum(l);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int token = (int)(row / p.heads_q), head = (int)(row % p.heads_q);
    int b = 0, pos = token;
    if (!p.cu_seqlens_q)
        b = token / p.seqlen_q, pos = token % p.seqlen_q;
    T *out = static_cast<T *>(p.o) +
             (p.cu_seqlens_q ? (int64_t)token * p.o_ss : b * p.o_sb + pos * p.o_ss) + head * p.o_sh;
    for (int d = lane * 4; d < D; d += 128) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (m != -INFINITY)
            for (int s = 0; s < p.splits; s++) {
                const float ls = p.part_lse[s * rows + row];
                if (ls == -INFINITY)
                    continue;
                const float w = __expf(ls - m) * inv;
                const float4 x = *reinterpret_cast<const float4 *>(p.part_o + (s * rows + row) * D + d);
                acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
            }
        uint2 packed;
        packed.x = tk_pack2<T>(acc[0], acc[1]);
        packed.y = tk_pack2<T>(acc[2], acc[3]);
        *reinterpret_cast<uint2 *>(out + d) = packed;
    }
    if (p.lse && lane == 0)
        p.lse[p.cu_seqlens_q ? (int64_t)head * p.total_q + token
                             : ((int64_t)b * p.heads_q + head) * p.seqlen_q + pos] =
            l > 0.0f ? m + logf(l) : -INFINITY;
}

int kvc_row_chunks(const tk_attention_kvcache_call *c) {
    const int64_t rows = (int64_t)c->seqlen_q * (c->heads_q / c->heads_kv);
    return (int)((rows + KVC_ROWS - 1) / KVC_ROWS);
}

int64_t kvc_tokens(const tk_attention_kvcache_call *c) {
    return c->cu_seqlens_q ? c->total_q : (int64_t)c->batch * c->seqlen_q;
}

/* The append (when k_new is set), then, unless append_only, the decode kernel and the merge. */
template <typename T, int D>
cudaError_t kvc_launch(const tk_attention_kvcache_call *c, int splits, const tk_device *dev,
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
    p.tokens = (int)kvc_tokens(c);
    p.heads_q = c->heads_q;
    p.heads_kv = c->heads_kv;
    p.group = c->heads_q / c->heads_kv;
    p.page_size = c->page_size;
    p.num_pages = c->num_pages;
    p.capacity = c->pages_per_seq * c->page_size;
    p.row_chunks = kvc_row_chunks(c);
    p.splits = splits;
    p.window_left = c->window_left;
    p.window_right = c->window_right;
    attn_set_score(p, c->scale, c->softcap, c->alibi_slopes != NULL);
    const int64_t part_rows = (int64_t)splits * p.tokens * p.heads_q;
    p.part_o = static_cast<float *>(c->workspace);
    p.part_lse = splits > 1 ? p.part_o + part_rows * D : NULL;
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
    const unsigned blocks = (unsigned)((int64_t)p.row_chunks * c->batch * c->heads_kv * splits);
    err = tk_launch(kernel, blocks, shape::THREADS, shape::SMEM_BYTES, stream, p);
    if (err != cudaSuccess || splits == 1)
        return err;
    const int64_t rows = (int64_t)p.tokens * p.heads_q;
    const int per_block = KVC_COMBINE_THREADS / 32;
    return tk_launch(kvcache_combine_kernel<T, D>, (unsigned)((rows + per_block - 1) / per_block),
                     KVC_COMBINE_THREADS, 0, stream, p);
}

template <int D>
cudaError_t kvc_launch_head_dim(const tk_attention_kvcache_call *c, int splits,
                                const tk_device *dev, cudaStream_t stream, bool append_only) {
    return tk_dispatch_dtype16(c->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return kvc_launch<T, D>(c, splits, dev, stream, append_only);
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

/* Busy fraction of the slots over the waves n CTAs take. */
double kvc_wave_fill(int64_t n, int64_t slots) {
    const double waves = (double)n / (double)slots;
    return waves / ceil(waves);
}

int kvc_resident_slots(const tk_attention_kvcache_call *c, const tk_device *dev) {
    const int per_sm = c->head_dim == 64    ? kvc_blocks_per_sm<64>(c, dev)
                       : c->head_dim == 128 ? kvc_blocks_per_sm<128>(c, dev)
                                            : kvc_blocks_per_sm<256>(c, dev);
    return per_sm * dev->sm_count;
}

} // namespace

extern "C" int tk_attention_kvcache_splits(const tk_attention_kvcache_call *c, const tk_device *dev) {
    if (c->num_splits > 0)
        return c->num_splits;
    const int64_t ctas = (int64_t)c->batch * c->heads_kv * kvc_row_chunks(c);
    const int64_t slots = kvc_resident_slots(c, dev);
    const int64_t capacity = (int64_t)c->pages_per_seq * c->page_size;
    const int64_t max_splits = min((int64_t)KVC_MAX_SPLITS, max((int64_t)1, capacity / KVC_MIN_SPLIT_KEYS));
    /* A launch of n CTAs on `slots` resident slots runs ceil(n / slots) waves; the last one's
     * idle slots are lost bandwidth. Take the fewest splits whose wave fill is within 5 % of the
     * best any split count up to eight waves reaches: more splits only add partials to merge. */
    const int limit = (int)min(max_splits, max((int64_t)1, 8 * slots / max(ctas, (int64_t)1)));
    double best = 0.0;
    for (int s = 1; s <= limit; s++)
        best = fmax(best, kvc_wave_fill(ctas * s, slots));
    for (int s = 1; s < limit; s++)
        if (kvc_wave_fill(ctas * s, slots) >= 0.95 * best)
            return s;
    return limit;
}

extern "C" size_t tk_attention_kvcache_workspace_bytes(const tk_attention_kvcache_call *c, int splits) {
    if (splits <= 1)
        return 0;
    return (size_t)splits * (size_t)kvc_tokens(c) * (size_t)c->heads_q * ((size_t)c->head_dim + 1) * 4;
}

extern "C" cudaError_t tk_attention_kvcache_launch_decode(const void *call, const tk_device *dev,
                                                          cudaStream_t stream) {
    const tk_attention_kvcache_call *c = static_cast<const tk_attention_kvcache_call *>(call);
    const int splits = tk_attention_kvcache_splits(c, dev);
    switch (c->head_dim) {
    case 64: return kvc_launch_head_dim<64>(c, splits, dev, stream, false);
    case 128: return kvc_launch_head_dim<128>(c, splits, dev, stream, false);
    case 256: return kvc_launch_head_dim<256>(c, splits, dev, stream, false);
    }
    return cudaErrorInvalidValue; /* src/attention_kvcache.c admits only the head dims above */
}

extern "C" cudaError_t tk_attention_kvcache_append(const tk_attention_kvcache_call *c, const tk_device *dev,
                                                   cudaStream_t stream) {
    switch (c->head_dim) {
    case 64: return kvc_launch_head_dim<64>(c, 1, dev, stream, true);
    case 128: return kvc_launch_head_dim<128>(c, 1, dev, stream, true);
    case 256: return kvc_launch_head_dim<256>(c, 1, dev, stream, true);
    }
    return cudaErrorInvalidValue;
}
