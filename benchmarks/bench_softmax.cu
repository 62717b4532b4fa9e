/*
 * Softmax benchmarks: achieved bandwidth against a device copy of the same bytes. Bytes that
 * must move: forward x read once and y written once; backward y and dy read once, dx written
 * once. The stream variant's second read of a row (from L2 when it hits) is not counted: the
 * ratio shows what that second read costs. Rows: bf16 16384 x 4096 and 4096 x 131072
 * (a vocabulary), 32768 x 32768 and 16384 x 32768 (64 KB rows, as Quack benchmarks its softmax;
 * 4.3 and 2.1 GB moved: about 1 and 0.5 ms a repetition at an H200's copy rate), log-softmax, f32
 * vocabulary rows (f32 logits), a causal attention-score matrix, backward (vocabulary rows for
 * both gradients: the log-softmax's first pass reads dy alone, the softmax's y and dy), f32;
 * then a decode-sized sampling row (one f32 vocabulary row), timed against the launch floor
 * instead (bench_memory_baseline).
 */
#include <stdio.h>

#include "bench.h"

namespace {

struct softmax_arg {
    tk_softmax_params p;
    bool backward;
    const void *x, *dy;
    void *y;
};

void run_softmax(void *arg, cudaStream_t stream) {
    softmax_arg *a = static_cast<softmax_arg *>(arg);
    bench_check(a->backward ? tk_softmax_bwd(&a->p, a->x, a->dy, a->y, stream) : tk_softmax_fwd(&a->p, a->x, a->y, stream),
                a->backward ? "tk_softmax_bwd" : "tk_softmax_fwd");
}

void bench_one(bench_ctx *ctx, const char *op, tk_dtype dtype, int64_t rows, int64_t cols, int log, int causal,
               bool backward) {
    const size_t es = dtype == TK_F32 ? 4 : 2;
    const int64_t n = rows * cols;
    softmax_arg a = {};
    a.p = tk_softmax_params TK_SOFTMAX_PARAMS_INIT;
    a.p.dtype = dtype;
    a.p.rows = rows;
    a.p.cols = cols;
    a.p.log = log;
    a.p.causal = causal;
    a.p.scale = causal ? 0.088388f : 1.0f; /* 1 / sqrt(128) for attention scores */
    a.backward = backward;
    /* Backward inputs: y values in (0, 1 / cols]-ish (log: negative), dy random. */
    a.x = backward ? bench_random(ctx, dtype, n, log ? -12.0f : 0.0f, log ? -8.0f : 2.0f / (float)cols)
                   : bench_random(ctx, dtype, n, -8.0f, 8.0f);
    a.dy = backward ? bench_random(ctx, dtype, n, -1.0f, 1.0f) : NULL;
    a.y = bench_alloc(ctx, (size_t)n * es);
    char shape[48];
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
    /* A variant forced with TKERN_FORCE_VARIANT (e.g. softmax=vec16_regs, for an A/B on the
     * rows it takes) may decline a row: the row says so instead of ending the run. */
    const tk_status first =
        backward ? tk_softmax_bwd(&a.p, a.x, a.dy, a.y, NULL) : tk_softmax_fwd(&a.p, a.x, a.y, NULL);
    if (first == TK_ERROR_NOT_SUPPORTED) {
        printf("%-28s %-22s skipped: %s\n", op, shape, tk_last_error());
        bench_free_all(ctx);
        return;
    }
    bench_check(first, op);
    const double bytes = (double)n * es * (backward ? 3 : 2);
    const double ms = bench_time_ms(ctx, run_softmax, &a);
    double base_ms;
    const char *base = bench_memory_baseline(ctx, rows, bytes, &base_ms);
    bench_row row = {op, shape, dtype, tk_last_variant(), ms, bytes, 0.0, base, base_ms};
    bench_report(ctx, &row);
    bench_free_all(ctx);
}

} // namespace

extern "C" void bench_softmax(bench_ctx *ctx) {
    bench_one(ctx, "softmax fwd", TK_BF16, 16384, 4096, 0, 0, false);
    bench_one(ctx, "softmax fwd", TK_BF16, 4096, 131072, 0, 0, false);
    bench_one(ctx, "softmax fwd", TK_BF16, 32768, 32768, 0, 0, false);
    bench_one(ctx, "softmax fwd", TK_BF16, 16384, 32768, 0, 0, false);
    bench_one(ctx, "log_softmax fwd", TK_BF16, 4096, 131072, 1, 0, false);
    bench_one(ctx, "softmax fwd", TK_F32, 2048, 131072, 0, 0, false); /* f32 logits, vocabulary rows */
    bench_one(ctx, "softmax causal fwd", TK_BF16, 16384, 4096, 0, 1, false);
    bench_one(ctx, "softmax fwd", TK_F32, 16384, 4096, 0, 0, false);
    bench_one(ctx, "softmax fwd", TK_BF16, 65536, 1024, 0, 0, false);
    bench_one(ctx, "softmax bwd", TK_BF16, 16384, 4096, 0, 0, true);
    bench_one(ctx, "log_softmax bwd", TK_BF16, 4096, 131072, 1, 0, true);
    bench_one(ctx, "softmax bwd", TK_BF16, 4096, 131072, 0, 0, true);
    /* Decode-sized: one token's sampling distribution over a vocabulary (f32 logits, and bf16
     * as a model writes them), against the launch floor (64 such rows move 67 MB: a bandwidth
     * row, not a launch one). */
    bench_one(ctx, "softmax fwd", TK_F32, 1, 131072, 0, 0, false);
    bench_one(ctx, "softmax fwd", TK_BF16, 1, 131072, 0, 0, false);
}
