/*
 * RoPE benchmarks: achieved bandwidth against a device copy of the same bytes. Bytes that must
 * move: every Q and K element read once and written once (in place: the same address), plus
 * the positions. The angles are computed in the kernel (theta) or read from a cos / sin cache
 * (L2-resident across heads; counted once per token). Shape: 16384 tokens x
 * (32 Q + 8 K heads) x 128, bf16, NeoX and GPT-J, in place (the engines' case) and out of
 * place, plus a packed QKV buffer and decode-sized calls (1 and 64 tokens), which are timed against
 * the launch floor instead (bench_memory_baseline).
 */
#include <stdio.h>

#include "bench.h"

namespace {

struct rope_arg {
    tk_rope_params p;
    const void *q, *k;
    void *q_out, *k_out;
};

void run_rope(void *arg, cudaStream_t stream) {
    rope_arg *a = static_cast<rope_arg *>(arg);
    bench_check(tk_rope_fwd(&a->p, a->q, a->k, a->q_out, a->k_out, stream), "tk_rope_fwd");
}

void bench_one(bench_ctx *ctx, const char *op, tk_rope_style style, int64_t tokens, int64_t heads_q, int64_t heads_k,
               int64_t head_dim, bool in_place, bool packed, bool cache) {
    const tk_dtype dtype = TK_BF16;
    const size_t es = 2;
    const int64_t nq = tokens * heads_q * head_dim, nk = tokens * heads_k * head_dim;
    rope_arg a = {};
    a.p = tk_rope_params TK_ROPE_PARAMS_INIT;
    a.p.dtype = dtype;
    a.p.style = style;
    a.p.tokens = tokens;
    a.p.heads_q = heads_q;
    a.p.heads_k = heads_k;
    a.p.head_dim = head_dim;
    a.p.theta = 500000.0f;
    const int64_t max_position = 131072;
    int64_t *positions = static_cast<int64_t *>(bench_alloc(ctx, (size_t)tokens * 8));
    {
        /* positions 0 .. tokens-1 scattered over the cache: random int64 in [0, max_position) */
        float *f = static_cast<float *>(bench_random(ctx, TK_F32, tokens, 0.0f, (float)(max_position - 1)));
        int64_t *host = new int64_t[tokens];
        float *fh = new float[tokens];
        bench_check_cuda(cudaMemcpy(fh, f, (size_t)tokens * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
        for (int64_t t = 0; t < tokens; t++)
            host[t] = (int64_t)fh[t];
        bench_check_cuda(cudaMemcpy(positions, host, (size_t)tokens * 8, cudaMemcpyHostToDevice), "cudaMemcpy");
        delete[] host;
        delete[] fh;
    }
    a.p.positions64 = positions;
    if (cache) {
        a.p.cos_cache = static_cast<const float *>(bench_random(ctx, TK_F32, max_position * head_dim / 2, -1, 1));
        a.p.sin_cache = static_cast<const float *>(bench_random(ctx, TK_F32, max_position * head_dim / 2, -1, 1));
        a.p.max_position = max_position;
    }
    if (packed) { /* [tokens, heads_q + 2 heads_k, head_dim], rotated in place */
        unsigned char *qkv = static_cast<unsigned char *>(
            bench_random(ctx, dtype, tokens * (heads_q + 2 * heads_k) * head_dim, -2, 2));
        a.p.q_strides[0] = a.p.k_strides[0] = (heads_q + 2 * heads_k) * head_dim;
        a.p.q_strides[1] = a.p.k_strides[1] = head_dim;
        a.q = a.q_out = qkv;
        a.k = a.k_out = qkv + (size_t)(heads_q * head_dim) * es;
    } else {
        a.q = bench_random(ctx, dtype, nq, -2, 2);
        a.k = bench_random(ctx, dtype, nk, -2, 2);
        a.q_out = in_place ? const_cast<void *>(a.q) : bench_alloc(ctx, (size_t)nq * es);
        a.k_out = in_place ? const_cast<void *>(a.k) : bench_alloc(ctx, (size_t)nk * es);
    }
    const double bytes = (double)(nq + nk) * es * 2 + (double)tokens * 8 +
                         (cache ? (double)tokens * head_dim * 4 : 0.0);
    const double ms = bench_time_ms(ctx, run_rope, &a);
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx(%lld+%lld)x%lld", (long long)tokens, (long long)heads_q, (long long)heads_k,
             (long long)head_dim);
    double base_ms;
    const char *base = bench_memory_baseline(ctx, tokens, bytes, &base_ms);
    bench_row row = {op, shape, dtype, tk_last_variant(), ms, bytes, 0.0, base, base_ms};
    bench_report(ctx, &row);
    bench_free_all(ctx);
}

} // namespace

extern "C" void bench_rope(bench_ctx *ctx) {
    bench_one(ctx, "rope neox in place", TK_ROPE_NEOX, 16384, 32, 8, 128, true, false, false);
    bench_one(ctx, "rope neox", TK_ROPE_NEOX, 16384, 32, 8, 128, false, false, false);
    bench_one(ctx, "rope gptj in place", TK_ROPE_GPTJ, 16384, 32, 8, 128, true, false, false);
    bench_one(ctx, "rope neox cache", TK_ROPE_NEOX, 16384, 32, 8, 128, true, false, true);
    bench_one(ctx, "rope neox packed qkv", TK_ROPE_NEOX, 16384, 32, 8, 128, true, true, false);
    bench_one(ctx, "rope neox decode", TK_ROPE_NEOX, 1, 32, 8, 128, true, false, false);
    bench_one(ctx, "rope neox decode", TK_ROPE_NEOX, 64, 32, 8, 128, true, false, false);
}
