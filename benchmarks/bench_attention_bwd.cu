/* Attention backward: bf16 training shapes (Llama-style GQA, D 128; Gemma-style D 256; D 64, 80
 * and 96). TFLOP/s count the backward as 2.5 x the forward's FLOPs of the visible (query, key)
 * pairs, 2.5 x 4 x batch x
 * heads_q x head_dim x pairs (five products of the forward's size instead of two), the
 * convention of FlashAttention's benchmarks. The forward runs once first for o and lse. No
 * baseline for the default (atomic dQ) rows in this binary: the Python bench compares with
 * FlashAttention and cuDNN. Each shape's deterministic row (deterministic = 1) has the atomic
 * row as its baseline, so its ratio column is deterministic TFLOP/s / atomic TFLOP/s; both
 * timings start from an idle GPU (bench_settle, the forward family's pause), so that neither
 * is timed while the clocks recover from the other. */
#include <stdio.h>

#include "bench.h"

extern "C" void bench_attention_bwd(bench_ctx *ctx);

namespace {

/* Idle time before each timing (bench_settle), as the forward family's. */
const int SETTLE_MS = 300;

struct bwd_shape {
    const char *op, *deterministic_op, *shape;
    int64_t batch, seqlen, heads_q, heads_kv, head_dim;
    int causal;
};

void run_bwd(void *arg, cudaStream_t stream) {
    bench_check(tk_attention_bwd(static_cast<const tk_attention_bwd_params *>(arg), stream),
                "attention_bwd");
}

/* One call of p: false (after a "skipped" line naming the reason) when no variant takes it, as
 * at head dim 256 on a device with too little shared memory per block (sm_86, sm_89: 143 KB are
 * needed), or when a forced variant (TKERN_FORCE_VARIANT) declines the row's shape. */
bool bench_runs(const tk_attention_bwd_params &p, const char *op, const char *shape) {
    const tk_status first = tk_attention_bwd(&p, NULL);
    if (first == TK_ERROR_NOT_SUPPORTED) {
        printf("%-28s %-22s skipped: %s\n", op, shape, tk_last_error());
        return false;
    }
    bench_check(first, op);
    return true;
}

void bench_shape(bench_ctx *ctx, const bwd_shape &s) {
    const int64_t b = s.batch, sq = s.seqlen, hq = s.heads_q, hkv = s.heads_kv, d = s.head_dim;
    const int64_t nq = b * sq * hq * d, nk = b * sq * hkv * d;
    tk_attention_params f = TK_ATTENTION_PARAMS_INIT;
    f.dtype = TK_BF16;
    f.q = bench_random(ctx, TK_BF16, nq, -2.0f, 2.0f);
    f.k = bench_random(ctx, TK_BF16, nk, -2.0f, 2.0f);
    f.v = bench_random(ctx, TK_BF16, nk, -1.0f, 1.0f);
    f.o = bench_alloc(ctx, (size_t)nq * 2);
    f.lse = static_cast<float *>(bench_alloc(ctx, (size_t)(b * hq * sq) * 4));
    f.return_lse = 1;
    f.batch = b, f.seqlen_q = sq, f.seqlen_k = sq, f.heads_q = hq, f.heads_kv = hkv, f.head_dim = d;
    f.causal = s.causal;
    bench_check(tk_attention_fwd(&f, NULL), "attention forward");

    tk_attention_bwd_params p = TK_ATTENTION_BWD_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.q = f.q, p.k = f.k, p.v = f.v, p.o = f.o, p.lse = f.lse;
    p.dout = bench_random(ctx, TK_BF16, nq, -1.0f, 1.0f);
    p.dq = bench_alloc(ctx, (size_t)nq * 2);
    p.dk = bench_alloc(ctx, (size_t)nk * 2);
    p.dv = bench_alloc(ctx, (size_t)nk * 2);
    p.batch = b, p.seqlen_q = sq, p.seqlen_k = sq, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
    p.causal = s.causal;
    p.deterministic = 1; /* its workspace also serves the atomic calls */
    bench_check(tk_attention_bwd_workspace_size(&p, &p.workspace_bytes), "workspace size");
    p.workspace = bench_alloc(ctx, p.workspace_bytes);
    p.deterministic = 0;
    if (!bench_runs(p, s.op, s.shape)) {
        bench_free_all(ctx);
        return;
    }

    const double pairs = s.causal ? (double)sq * (double)(sq + 1) / 2.0 : (double)sq * (double)sq;
    const double flops = 2.5 * 4.0 * (double)(b * hq * d) * pairs;
    bench_settle(SETTLE_MS);
    const double atomic_ms = bench_time_ms(ctx, run_bwd, &p);
    bench_row row = {s.op, s.shape, TK_BF16, tk_last_variant(), atomic_ms, 0.0, flops, "", 0.0};
    bench_report(ctx, &row);
    p.deterministic = 1;
    if (bench_runs(p, s.deterministic_op, s.shape)) {
        bench_settle(SETTLE_MS);
        const double ms = bench_time_ms(ctx, run_bwd, &p);
        bench_row det = {s.deterministic_op, s.shape, TK_BF16, tk_last_variant(), ms, 0.0, flops,
                         "atomic dQ", atomic_ms};
        bench_report(ctx, &det);
    }
    bench_free_all(ctx);
}

} // namespace

extern "C" void bench_attention_bwd(bench_ctx *ctx) {
    static const bwd_shape shapes[] = {
        {"attention bwd dense", "attention bwd dense deterministic", "B4 H32/8 S4096 D128", 4, 4096,
         32, 8, 128, 0},
        {"attention bwd causal", "attention bwd causal deterministic", "B4 H32/8 S4096 D128", 4,
         4096, 32, 8, 128, 1},
        {"attention bwd dense", "attention bwd dense deterministic", "B4 H16/8 S4096 D256", 4, 4096,
         16, 8, 256, 0},
        {"attention bwd causal", "attention bwd causal deterministic", "B4 H16/8 S4096 D256", 4,
         4096, 16, 8, 256, 1},
        /* The forward's head-dim-64 shape, and Phi-style head dims 96 and 80 (causal) */
        {"attention bwd dense", "attention bwd dense deterministic", "B8 H16 S2048 D64", 8, 2048, 16,
         16, 64, 0},
        {"attention bwd causal", "attention bwd causal deterministic", "B8 H16 S2048 D64", 8, 2048,
         16, 16, 64, 1},
        {"attention bwd causal", "attention bwd causal deterministic", "B4 H32 S4096 D96", 4, 4096,
         32, 32, 96, 1},
        {"attention bwd causal", "attention bwd causal deterministic", "B4 H32/8 S4096 D80", 4, 4096,
         32, 8, 80, 1},
    };
    for (const bwd_shape &s : shapes)
        if (bench_shape_selected(ctx, s.shape))
            bench_shape(ctx, s);
}
