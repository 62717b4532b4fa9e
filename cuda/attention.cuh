/*
 * Attention forward on the tensor cores of sm_80 and newer (FlashAttention-2 style). Included by
 * cuda/attention_d64.cu, _d80.cu, _d96.cu, _d128.cu and _d256.cu, one head dim each, so they
 * compile in parallel.
 *
 * Math, for one (batch, query head) and query rows i, keys j (shift = seqlen_k - seqlen_q):
 *     s_ij = scale * q_i . k_j, or softcap * tanh(scale * q_i . k_j / softcap); minus
 *            slope * |i + shift - j| with ALiBi; -inf where j is not visible (tkern.h)
 *     o_i  = sum_j exp(s_ij - m_i) v_j / sum_j exp(s_ij - m_i),   m_i = max_j s_ij
 * computed one tile of BN keys at a time with the online softmax recurrence: per row a running
 * max m and sum l; for a new tile with row max m' = max(m, max_j s_ij):
 *     alpha = exp(m - m'),  l = alpha l + sum_j exp(s_ij - m'),  o = alpha o + exp(s - m') V
 * and o / l, lse = m + log l at the end. Exponentials are exp2 with log2(e) folded into the
 * score scale, so each p costs one FFMA and one MUFU.EX2. Accumulation is f32; P is rounded
 * to the input dtype for the P.V product.
 *
 * Launch shape. One CTA of 4 warps owns BM = 64 * MT query rows of one batch: BM consecutive
 * positions of one head, or (heads_per_tile = 2 or 4, variant "mma_sm80_packed") BM / 2 or
 * BM / 4 positions of as many query heads of one GQA group, which share every K/V tile. Each
 * warp owns 16 * MT consecutive rows (MT m16 tiles) of one head. The Q tile sits in shared
 * memory; K and V tiles of BN keys stream through a two-stage cp.async ring (tile t + 1 is in
 * flight while tile t is computed; one __syncthreads per tile). Per tile and warp:
 *     S (16MT x BN) = Q K^T : D/16 k-steps, A fragments (Q) and B fragments (K) by ldmatrix.x4
 *     online softmax in registers; P repacked from the S accumulators into A fragments (the
 *     C layout of m16n8 equals the A layout of m16n8k16 two n-tiles at a time: tk_mma_a_from_acc
 *     of core/sm80.cuh, which has the fragment layouts)
 *     O (16MT x D) += P V   : BN/16 k-steps, B fragments (V) by ldmatrix.x4.trans
 * Q and K rows are 2D bytes (256 at head dims 80 and 96, whose 10 or 12 chunks the swizzle
 * spreads over 16) with 16-byte chunk c of row r stored at chunk c ^ (r & 7); V rows are
 * padded to 2D + 16 bytes. Either way the 8 rows an ldmatrix phase reads (and the 8 chunks
 * a cp.async quarter-warp writes) hit 8 different 16-byte bank groups: no conflicts. The swizzle
 * costs one XOR per k-step of Q K^T (shared by the Q and K addresses); V's padding makes its
 * d-steps immediate offsets, which keeps those address registers out of the P V loop.
 *
 *   head dim  MT  BM   BN   accumulators/thread (O + S)   shared memory (Q + 2 x (K + V))
 *   64        2   128  64   64 + 64                       16 KB + 2 x (8 + 9) KB = 50 KB
 *   80        2   128  64   80 + 64                       32 KB + 2 x (16 + 11) KB = 86 KB
 *   96        2   128  32   96 + 32                       32 KB + 2 x (8 + 6.5) KB = 61 KB
 *   128       2   128  32   128 + 32                      32 KB + 2 x (8 + 8.5) KB = 65 KB
 *   256       1   64   32   128 + 16                      32 KB + 2 x (16 + 16.5) KB = 97 KB
 * 32 rows per warp (MT = 2) halves the shared-memory traffic per MMA against 16 rows: each K/V
 * fragment feeds two MMAs, which keeps ldmatrix under the 128 B/clk shared-memory bandwidth at
 * the tensor-core rate. The O and S accumulators take most of the 255 registers a thread may
 * have (2 CTAs x 128 threads per SM; ptxas reports 238 to 254, no spills): that is why head dim
 * 128 takes BN = 32 (BN = 64 spills; so does 96 with BN = 64) and head dim 256 keeps 16 rows
 * per warp. Every shape fits the 99 KB per block of sm_86 / sm_89, so one table serves every
 * sm_80+ device. The Q tile is
 * re-read from shared memory for every key tile rather than held in registers (that would add
 * 16 * MT * D / 64 registers per thread). Tile loads walk their rows through a pointer the
 * compiler cannot re-associate (attn_opaque): otherwise it precomputes every row's offset once
 * and keeps them in registers for the whole key loop, which spills.
 *
 * Work skipping. Each of a CTA's positions [m0, m0 + tile_rows) sees one range of keys
 * (attention_softmax.cuh's mask: window, chunk, prefix, document), kept in a shared-memory
 * table; only key tiles meeting [lo(first), hi(last)] are visited, so causal attention does
 * about half the tiles and a sliding window (window + tile_rows) / BN tiles per CTA. Per tile,
 * a uniform test decides whether any (row, key) pair in it can be masked (a range edge or the
 * end of the keys); only those tiles run the per-element mask. Under a window
 * of W keys the tiles meeting the band's two edges are partly wasted, tile_rows / (W +
 * tile_rows) of the work: 11 % at W = 1024 with 128 positions, 3 % with 32, hence the packed
 * heads. A key tile that no row of a warp sees leaves its state bit for bit unchanged (p = 0,
 * alpha = exp2(0) = 1), so both variants give the same bits. The grid runs query tiles last to
 * first as its slowest index, every head and batch of a tile before the next: under a causal
 * mask the longest CTAs start first over the whole grid, not just within each head.
 *
 * 64-bit element offsets throughout; rows past seqlen_q and keys past seqlen_k are zero-filled
 * by cp.async (src-size 0) and never stored.
 */
#ifndef TK_ATTENTION_CUH
#define TK_ATTENTION_CUH

#include <type_traits>

#include "attention.h"
#include "attention_softmax.cuh"
#include "common.cuh"
#include "core/math.cuh"
#include "core/sm80.cuh"
#include "tkern.h"

namespace {

constexpr int ATTN_WARPS = 4;
constexpr int ATTN_THREADS = 32 * ATTN_WARPS;

/* Per head dim: MT m16 tiles per warp, BN keys per tile, CTAs per SM asked of the compiler. */
template <int D> struct attn_tile;
template <> struct attn_tile<64> { static constexpr int MT = 2, BN = 64, MIN_CTAS = 2; };
template <> struct attn_tile<80> { static constexpr int MT = 2, BN = 64, MIN_CTAS = 2; };
template <> struct attn_tile<96> { static constexpr int MT = 2, BN = 32, MIN_CTAS = 2; };
template <> struct attn_tile<128> { static constexpr int MT = 2, BN = 32, MIN_CTAS = 2; };
template <> struct attn_tile<256> { static constexpr int MT = 1, BN = 32, MIN_CTAS = 2; };

template <int D> struct attn_shape {
    static constexpr int MT = attn_tile<D>::MT;
    static constexpr int BN = attn_tile<D>::BN;
    static constexpr int BM = 16 * MT * ATTN_WARPS;
    /* Q and K rows in shared memory: 2 D bytes, or 256 at head dims 80 and 96, whose 10 and 12
     * chunks the swizzle scatters over 16 (the XOR reaches chunk 15); V rows: 2 D + 16 bytes. */
    static constexpr int ROW_BYTES = D % 64 == 0 ? 2 * D : 256;
    static constexpr int Q_BYTES = BM * ROW_BYTES;
    static constexpr int V_ROW_BYTES = 2 * D + 16;
    static constexpr int K_BYTES = BN * ROW_BYTES;
    static constexpr int V_BYTES = BN * V_ROW_BYTES;
    static constexpr int TABLE_OFFSET = Q_BYTES + 2 * (K_BYTES + V_BYTES);
    static constexpr int SMEM_BYTES = TABLE_OFFSET + BM * 8; /* + each row's keys (int2) */
};

/* What the kernel reads, resolved on the host from tk_attention_call. */
struct attn_params {
    const void *q, *k, *v;
    void *o;
    float *lse;
    const float *alibi_slopes;
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
    int seqlen_q, seqlen_k, heads_q, group;
    int m_blocks;       /* query tiles per head: ceil(seqlen_q / tile_rows) */
    int window_left, window_right;
    int transform;    /* softcap or ALiBi: scores are rewritten in natural-log units */
    float scale;      /* softmax scale, applied to raw scores when transform is set */
    float softcap;    /* 0 = off */
    float softcap_in; /* scale / softcap */
    float exp_scale;  /* log2(e) times whatever scale is still to apply to the scores */
    const float *sinks; /* [heads_q] or nullptr */
    int chunk, prefix;  /* 0 = off */
    const int *doc_ids; /* [batch, seqlen_k] or nullptr */
    int heads_per_tile; /* query heads of one GQA group sharing a CTA: 1, 2 or 4 */
    int tile_rows;      /* query positions per CTA: BM / heads_per_tile */
    int head_tiles;     /* heads_q / heads_per_tile */
    int batch;          /* the grid runs head tiles, then batches, then query tiles */
};

/* Byte offset of 16-byte chunk `chunk` of row `row` in a tile of rows ROW_BYTES apart:
 * XOR-swizzled (Q, K, O staging) or plain in rows padded by 16 bytes (V). */
template <int ROW_BYTES, bool SWIZZLED>
__device__ __forceinline__ uint32_t attn_chunk_offset(int row, int chunk) {
    if constexpr (SWIZZLED)
        return tk_swizzled_offset<ROW_BYTES / 16>(row, chunk);
    else
        return (uint32_t)(row * ROW_BYTES + (chunk << 4));
}

/* p, hidden from the compiler's reassociation and loop-invariant code motion: without it the
 * compiler precomputes every row offset of a tile load once and holds them in registers for the
 * whole key loop (two per row), which the accumulators cannot spare. */
template <typename T> __device__ __forceinline__ const T *attn_opaque(const T *p) {
    asm volatile("" : "+l"(p));
    return p;
}

/* ROWS rows of D elements, `row_stride` apart from g, into a shared tile of rows ROW_BYTES
 * apart; rows at or past valid_rows are zero-filled. A row is taken as SLOTS 16-byte chunks, the
 * power of two at or above its D / 8 (16 at head dims 80 and 96, whose threads for chunks 10 to
 * 15 or 12 to 15 stay idle), so each thread copies the same chunk of every (THREADS / SLOTS)-th
 * row and walks its rows by a constant step. THREADS: the CTA's threads, tid below it (the
 * backward's CTAs are not the forward's size). */
template <typename T, int D, int ROWS, int ROW_BYTES, bool SWIZZLED, int THREADS = ATTN_THREADS>
__device__ __forceinline__ void attn_load_tile(uint32_t s_tile, const T *g, int64_t row_stride,
                                               int valid_rows, int tid) {
    constexpr int CHUNKS = D / 8;
    constexpr int SLOTS = CHUNKS <= 8 ? 8 : CHUNKS <= 16 ? 16 : 32;
    constexpr int ROWS_PER_PASS = THREADS / SLOTS;
    static_assert(CHUNKS <= SLOTS && ROWS % ROWS_PER_PASS == 0, "tile rows in whole passes");
    const int chunk = tid % SLOTS;
    if (chunk >= CHUNKS)
        return;
    int row = tid / SLOTS;
    const T *src = g + row * row_stride + chunk * 8;
#pragma unroll
    for (int i = 0; i < ROWS / ROWS_PER_PASS; i++) {
        tk_cp_async_16_zfill(s_tile + attn_chunk_offset<ROW_BYTES, SWIZZLED>(row, chunk), src,
                             row < valid_rows ? 16 : 0);
        row += ROWS_PER_PASS;
        src = attn_opaque(src + ROWS_PER_PASS * row_stride);
    }
}

/* The BM-row Q tile, swizzled rows ROW_BYTES apart: heads_per_tile blocks of tile_rows rows,
 * block b from query head (first head) + b, rows of one block `row_stride` apart, rows at or
 * past valid_rows of their block zero-filled. Thread t copies chunks t, t + THREADS, ... of
 * the tile; once per CTA, so the divisions do not matter. */
template <typename T, int D, int BM, int ROW_BYTES>
__device__ __forceinline__ void attn_load_q(uint32_t s_tile, const T *g, int64_t row_stride,
                                            int64_t head_stride, int tile_rows, int valid_rows,
                                            int tid) {
    constexpr int CHUNKS = D / 8;
    static_assert(BM * CHUNKS % ATTN_THREADS == 0, "every thread copies as many chunks");
#pragma unroll
    for (int i = 0; i < BM * CHUNKS / ATTN_THREADS; i++) {
        const int idx = tid + i * ATTN_THREADS;
        const int row = idx / CHUNKS, chunk = idx % CHUNKS;
        const int block = row / tile_rows, pos = row - block * tile_rows;
        const T *src = g + block * head_stride + pos * row_stride + chunk * 8;
        tk_cp_async_16_zfill(s_tile + attn_chunk_offset<ROW_BYTES, true>(row, chunk), src,
                             pos < valid_rows ? 16 : 0);
    }
}

/* The K/V tiles of one sequence stored as rows: key n at k + n k_ss and v + n v_ss; keys at or
 * past seqlen_k zero-filled. The kernel calls, with every thread, lookup(n0, tid) for its first
 * tile, then load(s_k, s_v, n0, tid) to issue the cp.async of keys n0 .. n0 + BN - 1 into a K
 * and a V stage, and after each load lookup_next(tid) for the tile after it: a loader that must
 * find its rows, as a KV cache's pages, reads its table there, and the read is in flight over a
 * whole tile's MMAs before the load that needs it (cuda/attention_kvcache_prefill.cu). Rows need
 * no lookup. The fields are references so that the kernel reads its params where it always
 * did. */
template <typename T, int D> struct attn_rows_kv {
    const T *k, *v;
    const int64_t &k_ss, &v_ss;
    const int &seqlen_k;

    __device__ __forceinline__ void lookup(int, int) {}
    __device__ __forceinline__ void lookup_next(int) {}
    __device__ __forceinline__ void load(uint32_t s_k, uint32_t s_v, int n0, int tid) const {
        using shape = attn_shape<D>;
        attn_load_tile<T, D, shape::BN, shape::ROW_BYTES, true>(s_k, k + n0 * k_ss, k_ss, seqlen_k - n0, tid);
        attn_load_tile<T, D, shape::BN, shape::V_ROW_BYTES, false>(s_v, v + n0 * v_ss, v_ss, seqlen_k - n0,
                                                                   tid);
    }
};

/* One batch entry of tk_attention_fwd for attention_fwd_kernel: every entry has the call's
 * lengths, rows at batch times the batch strides. */
struct attn_batch {
    using params = attn_params;
    static constexpr bool DOCUMENTS = true; /* p.doc_ids may be set */
    const attn_params &p;
    const int64_t batch;
    const int &seqlen_q, &seqlen_k;

    __device__ __forceinline__ attn_batch(const attn_params &p, int64_t batch)
        : p(p), batch(batch), seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k) {}
    /* Whether query tile m0 lies past this entry's queries (never: the grid is sized for it). */
    __device__ __forceinline__ bool past(int) const { return false; }
    __device__ __forceinline__ int64_t q_at() const { return batch * p.q_sb; }
    __device__ __forceinline__ int64_t k_at() const { return batch * p.k_sb; }
    __device__ __forceinline__ int64_t v_at() const { return batch * p.v_sb; }
    __device__ __forceinline__ int64_t o_at() const { return batch * p.o_sb; }
    /* lse [batch, heads_q, seqlen_q]: the index of (head, position m). */
    __device__ __forceinline__ int64_t lse_at(int head, int m) const {
        return ((int64_t)batch * p.heads_q + head) * p.seqlen_q + m;
    }
    template <typename T, int D>
    __device__ __forceinline__ attn_rows_kv<T, D> kv_tiles(const T *k, const T *v) const {
        return {k, v, p.k_ss, p.v_ss, p.seqlen_k};
    }
};

/* PACKED: heads_per_tile comes from p (2 or 4); otherwise it is 1 at compile time, so the
 * one-head kernel keeps the plain tile load and index arithmetic. SEQ: how a batch entry's
 * lengths, rows and K/V tiles are found (attn_batch: tk_attention_fwd's dense batches;
 * cuda/attention_kvcache_prefill.cu has a KV cache's sequences), with its params type. */
template <typename T, int D, bool PACKED, typename SEQ = attn_batch>
__global__ void __launch_bounds__(ATTN_THREADS, attn_tile<D>::MIN_CTAS)
    attention_fwd_kernel(const typename SEQ::params p) {
    using shape = attn_shape<D>;
    constexpr int MT = shape::MT, BN = shape::BN, BM = shape::BM, ROW_BYTES = shape::ROW_BYTES;
    constexpr int V_ROW_BYTES = shape::V_ROW_BYTES;
    constexpr int WARP_ROWS = 16 * MT;
    constexpr int CHUNKS = D / 8;  /* 16-byte chunks per row */
    constexpr int NT = BN / 8;     /* n8 tiles of S */
    constexpr int KSTEPS = D / 16; /* k16 steps of Q K^T */
    constexpr int DT = D / 8;      /* n8 tiles of O */
    constexpr int PSTEPS = BN / 16; /* k16 steps of P V */
    extern __shared__ __align__(128) unsigned char smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    /* Block -> (query tile, batch, heads_per_tile query heads of one GQA group), heads
     * fastest and query tiles last to first slowest: no CTA starts before every CTA of a later
     * query tile, which under a causal mask is every longer one (longest first over the whole
     * grid, so the grid ends on short CTAs), and the CTAs running at one time are every head of
     * a few neighbouring query tiles, whose K/V rows are neighbours in memory. The CTA's BM
     * rows are the positions [m0, m0 + tile_rows) of heads head0, head0 + 1, ...; warp w's rows
     * belong to one head, warp_head, at positions from warp_m0 on. */
    const int heads_per_tile = PACKED ? p.heads_per_tile : 1;
    const int tile_rows = PACKED ? p.tile_rows : BM;
    const int head_tiles = PACKED ? p.head_tiles : p.heads_q;
    unsigned block = blockIdx.x;
    const int head0 = (int)(block % (unsigned)head_tiles) * heads_per_tile;
    block /= (unsigned)head_tiles;
    const int64_t batch = block % (unsigned)p.batch;
    const int m_block = p.m_blocks - 1 - (int)(block / (unsigned)p.batch);
    const int head_kv = head0 / p.group;
    const int m0 = m_block * tile_rows;
    const SEQ seq(p, batch);
    if (seq.past(m0))
        return;
    const int q_rows = min(tile_rows, seq.seqlen_q - m0);
    const int shift = seq.seqlen_k - seq.seqlen_q;
    const int warp_row = warp * WARP_ROWS; /* in the CTA's tile */
    const int warp_head = PACKED ? head0 + warp_row / tile_rows : head0;
    const int warp_m0 = m0 + (PACKED ? warp_row % tile_rows : warp_row);

    /* Each position's keys (attn_fill_table; published by the barrier below), and from the
     * first and last the keys any row of this tile can see, the key tiles that hold them and the
     * keys every row sees. */
    int2 *const table = reinterpret_cast<int2 *>(smem + shape::TABLE_OFFSET);
    const attn_mask mask = {shift, seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right, p.chunk, p.prefix,
                            SEQ::DOCUMENTS && p.doc_ids ? p.doc_ids + batch * seq.seqlen_k : nullptr};
    attn_fill_table(mask, table, m0, m0 + q_rows - 1, tile_rows, false, tid, ATTN_THREADS);

    const T *q = static_cast<const T *>(p.q) + seq.q_at() + head0 * p.q_sh + m0 * p.q_ss;
    const T *k = static_cast<const T *>(p.k) + seq.k_at() + head_kv * p.k_sh;
    const T *v = static_cast<const T *>(p.v) + seq.v_at() + head_kv * p.v_sh;

    const uint32_t s_q = tk_smem_address(smem);
    const uint32_t s_k = s_q + shape::Q_BYTES;     /* two stages */
    const uint32_t s_v = s_k + 2 * shape::K_BYTES; /* two stages */

    if constexpr (PACKED)
        attn_load_q<T, D, BM, ROW_BYTES>(s_q, q, p.q_ss, p.q_sh, tile_rows, q_rows, tid);
    else
        attn_load_tile<T, D, BM, ROW_BYTES, true>(s_q, q, p.q_ss, q_rows, tid);
    __syncthreads(); /* the table */
    const int2 front = table[0], back = table[q_rows - 1];
    const int tile_begin = front.x / BN;
    const int tile_end = back.y >= front.x ? back.y / BN + 1 : tile_begin;
    auto kv = seq.template kv_tiles<T, D>(k, v);
    if (tile_begin < tile_end) {
        kv.lookup(tile_begin * BN, tid);
        kv.load(s_k, s_v, tile_begin * BN, tid);
        kv.lookup_next(tid); /* the second tile's rows, in flight until its load */
    }
    tk_cp_async_commit();

    /* ldmatrix.x4: lane l gives the address of row (l & 7) of matrix (l >> 3). Q and V use
     * matrices (rows 0-7, cols 0-7) (rows 8-15, cols 0-7) (rows 0-7, cols 8-15) (rows 8-15,
     * cols 8-15) of a 16 x 16 block, so lane l reads row (l & 7) + 8 (l >> 3 & 1), 16-byte
     * chunk (l >> 4) of it; K takes them as (rows 0-7, cols 0-7) (rows 0-7, cols 8-15) (rows
     * 8-15, cols 0-7) (rows 8-15, cols 8-15), row (l & 7) + 8 (l >> 4), chunk (l >> 3 & 1):
     *   Q (A of Q K^T): rows = query rows, cols = k; registers a0 a1 a2 a3
     *   K (B of Q K^T): rows = keys, cols = k; registers b0, b1 of keys 0-7, b0, b1 of keys 8-15
     *   V (B of P V, .trans): rows = keys, cols = d; b0 of d 0-7, b1 of d 0-7, b0, b1 of d 8-15
     * so that each n8 tile's b0, b1 come out in adjacent registers, the pair an HMMA reads (in
     * Q's order K's were b[0], b[2] and b[1], b[3], and ptxas moved every pair into place).
     * Q and K are swizzled (tk_swizzle of core/sm80.cuh): every row offset added later is a
     * multiple of 8, so the row's XOR is lane & 7 (written as lrow: taking it from the full row
     * costs setup instructions) and logical chunk c of the block sits at byte
     * (row * ROW_BYTES + ((c ^ (l & 7)) << 4)) ^ (step << 5), where the XOR stays below the
     * row's bits. V rows are padded instead, so its d-steps are plain immediate offsets. */
    static_assert(ROW_BYTES >= (KSTEPS << 5), "swizzle bits");
    const int lrow = lane & 7, lmat = lane >> 3;
    const uint32_t q_lane =
        (uint32_t)(((lmat & 1) * 8 + lrow) * ROW_BYTES + (((lmat >> 1) ^ lrow) << 4));
    const uint32_t k_lane =
        (uint32_t)(((lmat >> 1) * 8 + lrow) * ROW_BYTES + (((lmat & 1) ^ lrow) << 4));
    const uint32_t s_qw = s_q + warp * WARP_ROWS * ROW_BYTES; /* this warp's Q rows */
    const uint32_t v_lane =
        (uint32_t)(((lmat & 1) * 8 + lrow) * V_ROW_BYTES + ((lmat >> 1) << 4));

    /* Accumulator fragment (m16n8, f32; core/sm80.cuh): c[0], c[1] at row g, columns 2t, 2t + 1;
     * c[2], c[3] at row g + 8. This thread's rows: positions warp_m0 + 16 mt + g + 8 half of
     * warp_head. */
    const int g = lane >> 2, tq = lane & 3;
    const int row_base = warp_m0 + g;
    const float slope = p.alibi_slopes ? p.alibi_slopes[warp_head] : 0.0f;

    float o[MT][DT][4];
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mt][dt][e] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            row_max[mt][h] = -INFINITY;
            row_sum[mt][h] = 0.0f;
        }
    }

    for (int t = tile_begin; t < tile_end; t++) {
        const int stage = (t - tile_begin) & 1;
        tk_cp_async_wait<0>();
        __syncthreads(); /* tile t has landed; every warp is done with tile t - 1 */
        if (t + 1 < tile_end) {
            const int n1 = (t + 1) * BN;
            kv.load(s_k + (stage ^ 1) * shape::K_BYTES, s_v + (stage ^ 1) * shape::V_BYTES, n1, tid);
            kv.lookup_next(tid); /* tile t + 2's rows, in flight over tile t's MMAs */
        }
        tk_cp_async_commit();
        const uint32_t s_kt = s_k + stage * shape::K_BYTES;
        const uint32_t s_vt = s_v + stage * shape::V_BYTES;

        /* S = Q K^T */
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                tk_ldmatrix_x4<false>(a[mt], s_qw + mt * 16 * ROW_BYTES + (q_lane ^ (ks << 5)));
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                tk_ldmatrix_x4<false>(b, s_kt + np * 16 * ROW_BYTES + (k_lane ^ (ks << 5)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    tk_mma_16816<T>(s[mt][2 * np], a[mt], b[0], b[1]);
                    tk_mma_16816<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
            }
        }

        const int n0 = t * BN;
        const int col_base = n0 + 2 * tq;
        if (p.transform) /* scores to natural-log units: softcap, then ALiBi */
            attn_transform_scores(s, p.softcap, p.softcap_in, p.scale, p.alibi_slopes != nullptr, slope,
                                  row_base, col_base, shift);
        /* Uniform: can any pair of this tile be invisible? */
        if (attn_tile_partial(n0, BN, front, back))
            attn_mask_scores(s, row_base, col_base, table, m0);

        attn_online_softmax(s, row_max, row_sum, p.exp_scale, o);

        /* O += P V */
#pragma unroll
        for (int ps = 0; ps < PSTEPS; ps++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                tk_mma_a_from_acc<T>(a[mt], s[mt][2 * ps], s[mt][2 * ps + 1]);
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t b[4];
                tk_ldmatrix_x4<true>(b, s_vt + v_lane + ps * 16 * V_ROW_BYTES + dp * 32);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    tk_mma_16816<T>(o[mt][2 * dp], a[mt], b[0], b[1]);
                    tk_mma_16816<T>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
    }

    /* Epilogue: normalise, stage O through this warp's rows of the Q tile (16-byte global
     * stores), write lse. Q may still be in flight when no key tile was visited. */
    tk_cp_async_wait<0>();
    __syncthreads();
    /* Output rows: tile row out_r0 + i is position out_m0 + i of head out_head, for i below
     * out_rows; this warp's own head block when packed, the whole tile otherwise. */
    const int out_head = PACKED ? warp_head : head0;
    const int out_m0 = PACKED ? warp_m0 : m0;
    const int out_r0 = PACKED ? warp_row : 0;
    const int out_rows = PACKED ? min(WARP_ROWS, seq.seqlen_q - warp_m0) : q_rows;
    const int64_t lse_row0 = seq.lse_at(out_head, out_m0);
    const float sink2 = p.sinks ? p.sinks[warp_head] * ATTN_LOG2E : -INFINITY;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = row_sum[mt][h];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            float inv, lse;
            attn_finish_row(sum, row_max[mt][h] * p.exp_scale, sink2, inv, lse);
            const int r = warp_row + 16 * mt + 8 * h + g; /* row in the tile */
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                const uint32_t val =
                    tk_pack2<T>(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
                *reinterpret_cast<uint32_t *>(smem + attn_chunk_offset<ROW_BYTES, true>(r, dt) +
                                              4 * tq) = val;
            }
            if (p.lse && tq == 0 && r - out_r0 < out_rows)
                p.lse[lse_row0 + r - out_r0] = lse;
        }
    __syncwarp();
    T *out = static_cast<T *>(p.o) + seq.o_at() + out_head * p.o_sh + out_m0 * p.o_ss;
#pragma unroll
    for (int idx = lane; idx < WARP_ROWS * CHUNKS; idx += 32) {
        const int r = warp_row + idx / CHUNKS, c = idx % CHUNKS;
        if (r - out_r0 < out_rows)
            *reinterpret_cast<uint4 *>(out + (r - out_r0) * p.o_ss + c * 8) =
                *reinterpret_cast<const uint4 *>(smem + attn_chunk_offset<ROW_BYTES, true>(r, c));
    }
}

/* The pointers and strides of attn_params P from a resolved call C (tk_attention_call, or a KV
 * cache's call: the same field names, the cache's page strides as the batch strides). */
template <typename P, typename C> inline void attn_set_tensors(P &p, const C *c) {
    p.q = c->q;
    p.k = c->k;
    p.v = c->v;
    p.o = c->o;
    p.lse = c->lse;
    p.alibi_slopes = c->alibi_slopes;
    p.q_sb = c->q_stride[0], p.q_ss = c->q_stride[1], p.q_sh = c->q_stride[2];
    p.k_sb = c->k_stride[0], p.k_ss = c->k_stride[1], p.k_sh = c->k_stride[2];
    p.v_sb = c->v_stride[0], p.v_ss = c->v_stride[1], p.v_sh = c->v_stride[2];
    p.o_sb = c->o_stride[0], p.o_ss = c->o_stride[1], p.o_sh = c->o_stride[2];
}

/* Launches attention_fwd_kernel<T, D, PACKED> for one call, heads_per_tile query heads per CTA
 * (1 unless PACKED; else 2 or 4, dividing heads_q / heads_kv). */
template <typename T, int D, bool PACKED>
cudaError_t attn_launch(const tk_attention_call *c, int heads_per_tile, const tk_device *dev,
                        cudaStream_t stream) {
    using shape = attn_shape<D>;
    constexpr auto kernel = attention_fwd_kernel<T, D, PACKED>;
    const cudaError_t err = tk_opt_in_smem<kernel>(dev, shape::SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    attn_params p;
    attn_set_tensors(p, c);
    p.seqlen_q = c->seqlen_q;
    p.seqlen_k = c->seqlen_k;
    p.heads_q = c->heads_q;
    p.group = c->heads_q / c->heads_kv;
    p.heads_per_tile = heads_per_tile;
    p.tile_rows = shape::BM / heads_per_tile;
    p.head_tiles = c->heads_q / heads_per_tile;
    p.m_blocks = (c->seqlen_q + p.tile_rows - 1) / p.tile_rows;
    p.batch = c->batch;
    attn_set_mask(p, c);
    attn_set_score(p, c->scale, c->softcap, c->alibi_slopes != NULL);
    const unsigned blocks = (unsigned)((int64_t)p.m_blocks * p.head_tiles * c->batch);
    return tk_launch(kernel, blocks, ATTN_THREADS, shape::SMEM_BYTES, stream, p);
}

} // namespace

/* One head dim's four kernels: dtype x packed or not. */
template <int D>
cudaError_t attn_launch_head_dim(const tk_attention_call *c, int heads_per_tile,
                                 const tk_device *dev, cudaStream_t stream) {
    return tk_dispatch_dtype16(c->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return heads_per_tile > 1 ? attn_launch<T, D, true>(c, heads_per_tile, dev, stream)
                                  : attn_launch<T, D, false>(c, 1, dev, stream);
    });
}

/* The launcher of one head dim. */
#define TK_ATTENTION_DEFINE_LAUNCHER(D)                                                           \
    extern "C" cudaError_t tk_attention_launch_mma_d##D(const tk_attention_call *c,              \
                                                        int heads_per_tile, const tk_device *dev, \
                                                        cudaStream_t stream) {                   \
        return attn_launch_head_dim<D>(c, heads_per_tile, dev, stream);                          \
    }

#endif
