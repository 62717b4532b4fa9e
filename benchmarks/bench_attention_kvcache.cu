/* Attention over a KV cache. Decode: one query per sequence against a long cache, Llama 3 8B's
 * heads (32 query, 8 key/value, head dim 128), bf16, contiguous and paged (page sizes 16 and 64,
 * pages shuffled), and a batch whose lengths spread over 1 .. 32768. Decoding is memory-bound:
 * GB/s count the K and V bytes the call must read (every visible key once), and the baseline
 * is a device copy moving as many bytes (half read, half written) in the same run: ratio 1 is a
 * kernel reading its K/V as fast as the copy moves data. The split count is the library's.
 * Chunked prefill (prefill_row): TFLOP/s of the same heads, and the paged rows as a ratio to the
 * contiguous cache's TFLOP/s in the same run. */
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "bench.h"

extern "C" void bench_attention_kvcache(bench_ctx *ctx);

namespace {

const int HEADS_Q = 32, HEADS_KV = 8, HEAD_DIM = 128;

struct kv_arg {
    tk_attention_kvcache_params p;
};

void run_kvcache(void *arg, cudaStream_t stream) {
    bench_check(tk_attention_kvcache_fwd(&static_cast<kv_arg *>(arg)->p, stream), "tk_attention_kvcache_fwd");
}

/* The cache of p: `lens` keys per sequence (seqlens_k on the device), random K and V, contiguous
 * (page_size 0) or paged with each sequence's pages shuffled over the pool. Sets p's batch. */
void set_cache(bench_ctx *ctx, tk_attention_kvcache_params &p, const std::vector<int32_t> &lens, int page_size) {
    const int64_t batch = (int64_t)lens.size();
    const int64_t capacity = *std::max_element(lens.begin(), lens.end());
    const int64_t row_elems = (int64_t)HEADS_KV * HEAD_DIM;
    p.batch = batch;
    int64_t slots = 0;
    if (page_size > 0) { /* each sequence's pages, shuffled over the pool */
        const int64_t per_seq = (capacity + page_size - 1) / page_size;
        int64_t pages = 0;
        for (int32_t l : lens)
            pages += (l + page_size - 1) / page_size;
        std::vector<int32_t> perm(pages), table(batch * per_seq, 0);
        for (int64_t i = 0; i < pages; i++)
            perm[i] = (int32_t)i;
        srand(7);
        for (int64_t i = pages - 1; i > 0; i--)
            std::swap(perm[i], perm[rand() % (i + 1)]);
        int64_t next = 0;
        for (int64_t b = 0; b < batch; b++)
            for (int64_t i = 0; i * page_size < lens[b]; i++)
                table[b * per_seq + i] = perm[next++];
        int32_t *d_table = static_cast<int32_t *>(bench_alloc(ctx, table.size() * sizeof(int32_t)));
        bench_check_cuda(cudaMemcpy(d_table, table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                         "cudaMemcpy block table");
        p.block_table = d_table;
        p.num_pages = pages;
        p.page_size = page_size;
        p.max_pages_per_seq = per_seq;
        slots = pages * page_size;
    } else {
        p.max_seqlen_k = capacity;
        slots = batch * capacity;
    }
    p.k_cache = bench_random(ctx, TK_BF16, slots * row_elems, -1.0f, 1.0f);
    p.v_cache = bench_random(ctx, TK_BF16, slots * row_elems, -1.0f, 1.0f);
    int32_t *d_lens = static_cast<int32_t *>(bench_alloc(ctx, lens.size() * sizeof(int32_t)));
    bench_check_cuda(cudaMemcpy(d_lens, lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                     "cudaMemcpy seqlens_k");
    p.seqlens_k = d_lens;
}

/* Times p with the workspace it asks for. */
double time_kvcache(bench_ctx *ctx, kv_arg &a) {
    size_t ws = 0;
    bench_check(tk_attention_kvcache_workspace_size(&a.p, &ws), "tk_attention_kvcache_workspace_size");
    a.p.workspace = ws ? bench_alloc(ctx, ws) : NULL;
    a.p.workspace_bytes = ws;
    return bench_time_ms(ctx, run_kvcache, &a);
}

const char *layout_name(int page_size) {
    return page_size ? (page_size == 16 ? "page16" : "page64") : "contig";
}

/* One row: `lens` keys per sequence; page_size 0 = contiguous cache. */
void decode_row(bench_ctx *ctx, const char *shape, const std::vector<int32_t> &lens, int page_size) {
    const int64_t row_elems = (int64_t)HEADS_KV * HEAD_DIM;
    kv_arg a;
    a.p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    tk_attention_kvcache_params &p = a.p;
    p.dtype = TK_BF16;
    p.seqlen_q = 1;
    p.heads_q = HEADS_Q;
    p.heads_kv = HEADS_KV;
    p.head_dim = HEAD_DIM;
    set_cache(ctx, p, lens, page_size);
    int64_t keys = 0;
    for (int32_t l : lens)
        keys += l;
    const int64_t batch = p.batch;
    p.q = bench_random(ctx, TK_BF16, batch * HEADS_Q * HEAD_DIM, -1.0f, 1.0f);
    p.o = bench_alloc(ctx, (size_t)batch * HEADS_Q * HEAD_DIM * 2);
    const double ms = time_kvcache(ctx, a);
    const double bytes = (double)keys * row_elems * 2 /* bytes */ * 2 /* K and V */;
    char full_shape[64];
    snprintf(full_shape, sizeof full_shape, "%s %s", layout_name(page_size), shape);
    bench_row row = {"attention_kvcache decode", full_shape, TK_BF16, tk_last_variant(), ms, bytes, 0.0, "copy",
                     bench_copy_ms(ctx, (size_t)bytes)};
    bench_report(ctx, &row);
    bench_free_all(ctx);
}

/* Chunked prefill: `chunk` new queries per sequence (causal, bottom-right: the last chunk
 * positions) against caches of `keys` keys already holding the chunk's own, as an engine calls
 * after appending. TFLOP/s count the visible (query, key) pairs: 4 heads_q head_dim per pair.
 * The ratio column is this layout's TFLOP/s over the contiguous cache's (contig_ms; 0 for the
 * contiguous row itself, which then reports 1). Returns the time. */
double prefill_row(bench_ctx *ctx, int64_t batch, int32_t chunk, int32_t keys, int page_size, double contig_ms) {
    kv_arg a;
    a.p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    tk_attention_kvcache_params &p = a.p;
    p.dtype = TK_BF16;
    p.seqlen_q = chunk;
    p.heads_q = HEADS_Q;
    p.heads_kv = HEADS_KV;
    p.head_dim = HEAD_DIM;
    p.causal = 1;
    set_cache(ctx, p, std::vector<int32_t>((size_t)batch, keys), page_size);
    const int64_t q_elems = batch * chunk * HEADS_Q * HEAD_DIM;
    p.q = bench_random(ctx, TK_BF16, q_elems, -1.0f, 1.0f);
    p.o = bench_alloc(ctx, (size_t)q_elems * 2);
    const double ms = time_kvcache(ctx, a);
    const double pairs = (double)chunk * (keys - chunk) + (double)chunk * (chunk + 1) / 2.0;
    const double flops = 4.0 * HEADS_Q * HEAD_DIM * pairs * (double)batch;
    char shape[64];
    snprintf(shape, sizeof shape, "%s B%lld Q%d K%d", layout_name(page_size), (long long)batch, chunk, keys);
    bench_row row = {"attention_kvcache prefill", shape, TK_BF16, tk_last_variant(), ms, 0.0, flops,
                     "of contig's TFLOP/s", contig_ms > 0.0 ? contig_ms : ms};
    bench_report(ctx, &row);
    bench_free_all(ctx);
    return ms;
}

} // namespace

extern "C" void bench_attention_kvcache(bench_ctx *ctx) {
    const int pages[3] = {0, 16, 64};
    for (int pg : pages) {
        decode_row(ctx, "B64 K8192", std::vector<int32_t>(64, 8192), pg);
        decode_row(ctx, "B8 K32768", std::vector<int32_t>(8, 32768), pg);
        decode_row(ctx, "B1 K131072", std::vector<int32_t>(1, 131072), pg);
    }
    /* Lengths spread 1 .. 32768 (log-uniform, seeded). */
    std::vector<int32_t> spread(64);
    srand(11);
    for (size_t b = 0; b < spread.size(); b++)
        spread[b] = std::max(1, (int)(32768.0 * pow(2.0, -15.0 * rand() / RAND_MAX)));
    decode_row(ctx, "B64 K1..32768", spread, 16);
    /* Chunked prefill, 2048 queries against 16384 keys: contiguous, then pages of 16 and 64. */
    const int64_t prefill_batches[2] = {1, 4};
    for (int64_t b : prefill_batches) {
        const double contig_ms = prefill_row(ctx, b, 2048, 16384, 0, 0.0);
        prefill_row(ctx, b, 2048, 16384, 16, contig_ms);
        prefill_row(ctx, b, 2048, 16384, 64, contig_ms);
    }
}
