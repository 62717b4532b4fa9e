/* Attention over a KV cache, decode: one query per sequence against a long cache, Llama 3 8B's
 * heads (32 query, 8 key/value, head dim 128), bf16, contiguous and paged (page sizes 16 and 64,
 * pages shuffled), and a batch whose lengths spread over 1 .. 32768. Decoding is memory-bound:
 * GB/s count the K and V bytes the call must read (every visible key once), and the baseline
 * is a device copy moving as many bytes (half read, half written) in the same run: ratio 1 is a
 * kernel reading its K/V as fast as the copy moves data. The split count is the library's. */
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

/* One row: `lens` keys per sequence; page_size 0 = contiguous cache. */
void decode_row(bench_ctx *ctx, const char *shape, const std::vector<int32_t> &lens, int page_size) {
    const int64_t batch = (int64_t)lens.size();
    const int64_t capacity = *std::max_element(lens.begin(), lens.end());
    const int64_t row_elems = (int64_t)HEADS_KV * HEAD_DIM;
    kv_arg a;
    a.p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    tk_attention_kvcache_params &p = a.p;
    p.dtype = TK_BF16;
    p.batch = batch;
    p.seqlen_q = 1;
    p.heads_q = HEADS_Q;
    p.heads_kv = HEADS_KV;
    p.head_dim = HEAD_DIM;
    int64_t slots = 0, keys = 0;
    for (int32_t l : lens)
        keys += l;
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
    p.q = bench_random(ctx, TK_BF16, batch * HEADS_Q * HEAD_DIM, -1.0f, 1.0f);
    p.o = bench_alloc(ctx, (size_t)batch * HEADS_Q * HEAD_DIM * 2);
    int32_t *d_lens = static_cast<int32_t *>(bench_alloc(ctx, lens.size() * sizeof(int32_t)));
    bench_check_cuda(cudaMemcpy(d_lens, lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                     "cudaMemcpy seqlens_k");
    p.seqlens_k = d_lens;
    size_t ws = 0;
    bench_check(tk_attention_kvcache_workspace_size(&p, &ws), "tk_attention_kvcache_workspace_size");
    p.workspace = ws ? bench_alloc(ctx, ws) : NULL;
    p.workspace_bytes = ws;
    const double ms = bench_time_ms(ctx, run_kvcache, &a);
    const double bytes = (double)keys * row_elems * 2 /* bytes */ * 2 /* K and V */;
    char full_shape[64];
    snprintf(full_shape, sizeof full_shape, "%s %s", page_size ? (page_size == 16 ? "page16" : "page64") : "contig",
             shape);
    bench_row row = {"attention_kvcache decode", full_shape, TK_BF16, tk_last_variant(), ms, bytes, 0.0, "copy",
                     bench_copy_ms(ctx, (size_t)bytes)};
    bench_report(ctx, &row);
    bench_free_all(ctx);
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
}
