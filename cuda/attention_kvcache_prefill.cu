/*
 * Chunked prefill over a KV cache ("prefill_sm80"): the math and conventions of
 * cuda/attention_kvcache.cu (tk_attention_fwd's, per sequence b, shift = seqlen_k(b) -
 * seqlen_q(b)), computed by the FlashAttention-2 kernel of cuda/attention.cuh, whose mainloop,
 * mask and online softmax serve both: this file gives it a KV cache's sequences (kvp_sequence)
 * and, for a paged cache, a K/V tile loader that reads through the block table (kvp_pages).
 *
 * Launch shape. The decode kernel's CTA holds 16 query rows of a GQA group and reads every key
 * its rows see; a chunk of thousands of queries makes it read the cache once per 16 / group
 * positions, and its m16 tiles do twice the shared-memory traffic per MMA of the prefill's 32
 * rows per warp. Here a CTA owns BM = 128 positions (64 at head dim 256) of one query head and
 * reads each visible K/V tile once, as tk_attention_fwd does; the grid is (query tile, sequence,
 * query head), query tiles last to first, sized by the longest sequence's queries; a CTA whose
 * tile starts past its sequence's queries (read from cu_seqlens_q on the device) exits at once.
 * Tile shapes, registers and shared memory are those of attention.cuh's table (2 CTAs per SM).
 *
 * When. A CTA does the MMA work of BM rows whatever its sequence has, so the variant is chosen
 * when seqlen_q (the longest sequence's queries) is at least BM / 2: from there a tile is at
 * least half used, while the decode kernel would read the cache BM / 2 / (16 / group) >= 4
 * times per query head as often. Splits are the decode kernel's: a call that runs with more than
 * one split (few CTAs, long cache) stays there.
 *
 * Pages. Key n of sequence b is row n % page_size of page block_table[b * stride + n /
 * page_size]; a tile of BN keys may span pages. Per tile, each thread reads the table entry of
 * the rows it copies (the four threads of a row read one entry, every head of the sequence the
 * same ones, from cache) a tile ahead, so its latency hides behind the previous tile's MMAs;
 * then it computes each row's address once and copies its share of the row's chunks
 * (kvp_pages). Keys past the sequence and pages outside [0, num_pages) are
 * zero-filled, not read. A contiguous cache keeps the row loader of attention.cuh (the sequence
 * is page b).
 *
 * Appends (k_new, v_new) are the decode path's append kernel, launched first on the same stream.
 */
#include "attention_kvcache.h"

#include "attention.cuh"

namespace {

/* attention.cuh's params plus a KV cache's: k_sb / v_sb are the page strides. */
struct kvp_params : attn_params {
    const int32_t *cu_seqlens_q, *seqlens_k, *block_table;
    int64_t bt_stride;
    int total_q, tokens, capacity, page_size, num_pages;
    tk_divider page_div; /* by page_size */
    int appended; /* k_new was appended first: the sequence's keys include its queries' */
};

/* Keys n0 .. n0 + BN - 1 of one sequence of a paged cache (k, v: key/value head head_kv's rows in
 * page 0; table: the sequence's block table row). lookup(n0) reads the table entries of a tile,
 * lookup_next() those of the tile after the last one looked up, load() issues the copies of the
 * tile looked up last. The kernel looks a tile up right after the previous tile's load, so the
 * read is in flight over a whole tile's MMAs: looked up just before the wait that precedes the
 * load, its latency stalled the address arithmetic (Nsight Compute's samples).
 *
 * Thread mapping: ROW_THREADS threads share a row and each copies D / 8 / ROW_THREADS of its
 * 16-byte chunks (chunks part, part + ROW_THREADS, ...), so a thread finds one row per
 * ROWS_PER_PASS keys of the tile and computes that row's address once for all its chunks of K
 * and V. The contiguous loader's mapping (a chunk of every 8th row) costs a page lookup and a
 * 64-bit address per chunk; in this compute-bound kernel those integer instructions compete
 * with the MMAs for issue slots. A warp instruction still reads whole 64-byte runs of 8 rows. */
template <typename T, int D> struct kvp_pages {
    static constexpr int BN = attn_shape<D>::BN;
    static constexpr int ROW_THREADS = 4;
    static constexpr int ROWS_PER_PASS = ATTN_THREADS / ROW_THREADS;
    static constexpr int PASSES = BN / ROWS_PER_PASS;
    static constexpr int CHUNKS_PER_THREAD = D / 8 / ROW_THREADS;
    static_assert(BN % ROWS_PER_PASS == 0 && D / 8 % ROW_THREADS == 0, "rows and chunks in whole passes");
    const T *k, *v;
    const int32_t *table;
    const kvp_params &p;
    int seqlen_k;
    int next_n0;             /* the tile lookup_next() reads */
    int page[PASSES];        /* of key n0 + row(e): -1 = past the sequence or the pool */
    int slot_row[PASSES];    /* its row in the page */

    static __device__ __forceinline__ int row(int e, int tid) { return tid / ROW_THREADS + e * ROWS_PER_PASS; }

    __device__ __forceinline__ void lookup(int n0, int tid) {
#pragma unroll
        for (int e = 0; e < PASSES; e++) {
            const int n = n0 + row(e, tid);
            page[e] = -1, slot_row[e] = 0;
            if (n < seqlen_k) {
                const int slot = tk_div(n, p.page_div);
                const int entry = __ldg(table + slot);
                page[e] = entry >= 0 && entry < p.num_pages ? entry : -1;
                slot_row[e] = n - slot * p.page_size;
            }
        }
        next_n0 = n0 + BN;
    }
    __device__ __forceinline__ void lookup_next(int tid) { lookup(next_n0, tid); }

    /* The thread copies chunks part + 4 j of its rows. Every address below is a base plus a
     * constant per j, which the copies take as immediates instead of computing an address per
     * chunk. In global memory that is the row's first chunk. In the swizzled K tile chunk c of
     * row r sits at c ^ (r & 7) (core/sm80.cuh); for c = part + 4 j that is (part ^ (r & 3)) +
     * 4 (j ^ f), f = bit 2 of r: even j at one base + 64 j bytes, odd j at another. */
    __device__ __forceinline__ void load(uint32_t s_k, uint32_t s_v, int, int tid) const {
        using shape = attn_shape<D>;
        static_assert(ROW_THREADS == 4 && shape::ROW_BYTES == 2 * D && D % 64 == 0, "the swizzle below");
        const int part = tid % ROW_THREADS;
#pragma unroll
        for (int e = 0; e < PASSES; e++) {
            const int r = row(e, tid);
            const bool ok = page[e] >= 0;
            const T *k_src = k + (ok ? page[e] * p.k_sb + slot_row[e] * p.k_ss : 0) + part * 8;
            const T *v_src = v + (ok ? page[e] * p.v_sb + slot_row[e] * p.v_ss : 0) + part * 8;
            const int swz = tk_swizzle<shape::ROW_BYTES / 16>(r);
            const uint32_t k_row = s_k + r * shape::ROW_BYTES + ((part ^ (swz & 3)) << 4);
            const uint32_t flip = (uint32_t)(swz & 4) << 4; /* 64 bytes when bit 2 is set */
            const uint32_t k_even = k_row + flip, k_odd = k_row - flip;
            const uint32_t v_row = s_v + attn_chunk_offset<shape::V_ROW_BYTES, false>(r, part);
#pragma unroll
            for (int j = 0; j < CHUNKS_PER_THREAD; j++) {
                tk_cp_async_16_zfill((j & 1 ? k_odd : k_even) + 64 * j, k_src + j * ROW_THREADS * 8, ok ? 16 : 0);
                tk_cp_async_16_zfill(v_row + 64 * j, v_src + j * ROW_THREADS * 8, ok ? 16 : 0);
            }
        }
    }
};

/* Sequence b of a KV-cache call for attention_fwd_kernel: its queries (cu_seqlens_q or seqlen_q
 * each, clamped to the tokens the host sized) and keys (seqlens_k[b] clamped to the capacity,
 * plus the appended queries), read from the device once per CTA. */
template <bool PAGED> struct kvp_sequence {
    using params = kvp_params;
    static constexpr bool DOCUMENTS = false; /* a KV-cache call has no document ids: no code for them */
    const kvp_params &p;
    const int64_t b;
    int seqlen_q, seqlen_k, token0;

    __device__ __forceinline__ kvp_sequence(const kvp_params &p, int64_t b) : p(p), b(b) {
        int count = p.seqlen_q;
        token0 = (int)b * p.seqlen_q;
        if (p.cu_seqlens_q) {
            token0 = p.cu_seqlens_q[b];
            count = max(0, min(p.cu_seqlens_q[b + 1] - token0, p.seqlen_q));
        }
        const int cached = min(max(p.seqlens_k[b], 0), p.capacity);
        seqlen_k = p.appended ? min(cached + count, p.capacity) : cached;
        seqlen_q = token0 >= 0 ? max(0, min(count, p.tokens - token0)) : 0;
    }
    __device__ __forceinline__ bool past(int m0) const { return m0 >= seqlen_q; }
    __device__ __forceinline__ int64_t q_at() const { return p.cu_seqlens_q ? token0 * p.q_ss : b * p.q_sb; }
    __device__ __forceinline__ int64_t k_at() const { return PAGED ? 0 : b * p.k_sb; }
    __device__ __forceinline__ int64_t v_at() const { return PAGED ? 0 : b * p.v_sb; }
    __device__ __forceinline__ int64_t o_at() const { return p.cu_seqlens_q ? token0 * p.o_ss : b * p.o_sb; }
    /* lse [heads_q, total_q] for varlen queries, else [batch, heads_q, seqlen_q]. */
    __device__ __forceinline__ int64_t lse_at(int head, int m) const {
        return p.cu_seqlens_q ? (int64_t)head * p.total_q + token0 + m
                              : ((int64_t)b * p.heads_q + head) * p.seqlen_q + m;
    }
    template <typename T, int D> __device__ __forceinline__ auto kv_tiles(const T *k, const T *v) const {
        if constexpr (PAGED)
            return kvp_pages<T, D>{k, v, p.block_table + b * p.bt_stride, p, seqlen_k, 0, {}, {}};
        else
            return attn_rows_kv<T, D>{k, v, p.k_ss, p.v_ss, seqlen_k};
    }
};

template <typename T, int D, bool PAGED>
cudaError_t kvp_launch(const tk_attention_kvcache_call *c, const tk_device *dev, cudaStream_t stream) {
    using shape = attn_shape<D>;
    constexpr auto kernel = attention_fwd_kernel<T, D, false, kvp_sequence<PAGED>>;
    cudaError_t err = tk_opt_in_smem<kernel>(dev, shape::SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    kvp_params p = {};
    attn_set_tensors(p, c);
    p.seqlen_q = c->seqlen_q;
    p.seqlen_k = 0; /* per sequence: kvp_sequence */
    p.heads_q = c->heads_q;
    p.group = c->heads_q / c->heads_kv;
    p.heads_per_tile = 1;
    p.tile_rows = shape::BM;
    p.head_tiles = c->heads_q;
    p.m_blocks = (c->seqlen_q + shape::BM - 1) / shape::BM;
    p.batch = c->batch;
    attn_set_cache_mask(p, c);
    attn_set_score(p, c->scale, c->softcap, c->alibi_slopes != NULL);
    p.cu_seqlens_q = c->cu_seqlens_q;
    p.seqlens_k = c->seqlens_k;
    p.block_table = c->block_table;
    p.bt_stride = c->block_table_stride;
    p.total_q = c->total_q;
    p.tokens = (int)tk_attention_kvcache_tokens(c);
    p.capacity = c->pages_per_seq * c->page_size;
    p.page_size = c->page_size;
    p.page_div = tk_divider_of((unsigned)c->page_size);
    p.num_pages = c->num_pages;
    p.appended = c->k_new != NULL;
    if (c->k_new) {
        err = tk_attention_kvcache_append(c, dev, stream);
        if (err != cudaSuccess)
            return err;
    }
    const unsigned blocks = (unsigned)((int64_t)p.m_blocks * p.head_tiles * c->batch);
    return tk_launch(kernel, blocks, ATTN_THREADS, shape::SMEM_BYTES, stream, p);
}

template <int D>
cudaError_t kvp_launch_head_dim(const tk_attention_kvcache_call *c, const tk_device *dev, cudaStream_t stream) {
    return tk_dispatch_dtype16(c->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return c->block_table ? kvp_launch<T, D, true>(c, dev, stream) : kvp_launch<T, D, false>(c, dev, stream);
    });
}

} // namespace

extern "C" int tk_attention_kvcache_prefill_min_queries(int head_dim) {
    return (head_dim == 256 ? attn_shape<256>::BM : attn_shape<128>::BM) / 2;
}

extern "C" cudaError_t tk_attention_kvcache_launch_prefill(const void *call, const tk_device *dev,
                                                           cudaStream_t stream) {
    const tk_attention_kvcache_call *c = static_cast<const tk_attention_kvcache_call *>(call);
    switch (c->head_dim) {
    case 64: return kvp_launch_head_dim<64>(c, dev, stream);
    case 128: return kvp_launch_head_dim<128>(c, dev, stream);
    case 256: return kvp_launch_head_dim<256>(c, dev, stream);
    }
    return cudaErrorInvalidValue; /* src/attention_kvcache.c admits only the head dims above */
}
