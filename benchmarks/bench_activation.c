/* Activation and GLU benchmarks: achieved bandwidth against a device copy of the same bytes
 * (decode-sized calls: time against the launch floor). */
#include <stdio.h>

#include "bench.h"

typedef struct act_arg {
    tk_activation kind;
    tk_dtype dtype;
    bool backward;
    const void *x, *dy;
    void *out;
    int64_t rows, cols;
} act_arg;

static void run_act(void *p, cudaStream_t stream) {
    act_arg *a = p;
    tk_status s = a->backward
                      ? tk_activation_bwd(a->kind, a->dtype, a->dy, a->x, NULL, a->out, a->rows, a->cols, stream)
                      : tk_activation_fwd(a->kind, a->dtype, a->x, NULL, a->out, a->rows, a->cols, stream);
    bench_check(s, "tk_activation");
}

typedef struct glu_arg {
    tk_glu_params p;
    bool backward;
    const void *x, *dy;
    void *out;
} glu_arg;

static void run_glu(void *p, cudaStream_t stream) {
    glu_arg *a = p;
    bench_check(a->backward ? tk_glu_bwd(&a->p, a->dy, a->x, a->out, stream) : tk_glu_fwd(&a->p, a->x, a->out, stream),
                "tk_glu");
}

static const char *const ACT_NAMES[] = {"identity", "gelu_erf", "gelu_tanh", "quick_gelu", "silu", "relu", "relu2"};

static void bench_one_act(bench_ctx *ctx, tk_activation kind, tk_dtype dtype, bool backward, int64_t rows, int64_t cols) {
    const size_t es = dtype == TK_F32 ? 4 : 2;
    act_arg a = {kind, dtype, backward, bench_random(ctx, dtype, rows * cols, -4, 4),
                 backward ? bench_random(ctx, dtype, rows * cols, -1, 1) : NULL,
                 bench_alloc(ctx, (size_t)(rows * cols) * es), rows, cols};
    const double bytes = (double)(rows * cols) * es * (backward ? 3 : 2);
    const double ms = bench_time_ms(ctx, run_act, &a);
    char op[64], shape[48];
    snprintf(op, sizeof op, "%s %s", ACT_NAMES[kind], backward ? "bwd" : "fwd");
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
    double base_ms;
    const char *base = bench_memory_baseline(ctx, rows, bytes, &base_ms);
    bench_row row = {op, shape, dtype, tk_last_variant(), ms, bytes, 0, base, base_ms};
    bench_report(ctx, &row);
    bench_free_all(ctx);
}

static void bench_one_glu(bench_ctx *ctx, tk_glu kind, const char *name, tk_dtype dtype, bool backward, int64_t rows, int64_t d) {
    const size_t es = dtype == TK_F32 ? 4 : 2;
    glu_arg a = {TK_GLU_PARAMS_INIT, backward, bench_random(ctx, dtype, rows * 2 * d, -4, 4),
                 backward ? bench_random(ctx, dtype, rows * d, -1, 1) : NULL,
                 bench_alloc(ctx, (size_t)(rows * d * (backward ? 2 : 1)) * es)};
    a.p.kind = kind;
    a.p.dtype = dtype;
    a.p.rows = rows;
    a.p.d = d;
    const double bytes = (double)(rows * d) * es * (backward ? 5 : 3);
    const double ms = bench_time_ms(ctx, run_glu, &a);
    char op[64], shape[48];
    snprintf(op, sizeof op, "%s %s", name, backward ? "bwd" : "fwd");
    snprintf(shape, sizeof shape, "%lldx(2x%lld)", (long long)rows, (long long)d);
    double base_ms;
    const char *base = bench_memory_baseline(ctx, rows, bytes, &base_ms);
    bench_row row = {op, shape, dtype, tk_last_variant(), ms, bytes, 0, base, base_ms};
    bench_report(ctx, &row);
    bench_free_all(ctx);
}

void bench_activation(bench_ctx *ctx) {
    for (int kind = TK_ACT_GELU_ERF; kind <= TK_ACT_RELU_SQUARED; kind++)
        bench_one_act(ctx, (tk_activation)kind, TK_BF16, false, 16384, 4096);
    bench_one_act(ctx, TK_ACT_GELU_ERF, TK_BF16, true, 16384, 4096);
    bench_one_act(ctx, TK_ACT_SILU, TK_BF16, true, 16384, 4096);
    bench_one_act(ctx, TK_ACT_GELU_ERF, TK_F16, false, 16384, 4096);
    bench_one_act(ctx, TK_ACT_GELU_ERF, TK_F32, false, 16384, 4096);
    bench_one_act(ctx, TK_ACT_SILU, TK_F32, false, 16384, 4096);
    bench_one_glu(ctx, TK_GLU_SWIGLU, "swiglu", TK_BF16, false, 16384, 14336);
    bench_one_glu(ctx, TK_GLU_GEGLU_TANH, "geglu_tanh", TK_BF16, false, 16384, 14336);
    bench_one_glu(ctx, TK_GLU_GEGLU_ERF, "geglu_erf", TK_BF16, false, 16384, 14336);
    bench_one_glu(ctx, TK_GLU_SWIGLU_CLAMPED, "swiglu_clamped", TK_BF16, false, 16384, 14336);
    bench_one_glu(ctx, TK_GLU_SWIGLU, "swiglu", TK_BF16, true, 16384, 14336);
    bench_one_glu(ctx, TK_GLU_SWIGLU, "swiglu", TK_F16, false, 16384, 14336);
    bench_one_glu(ctx, TK_GLU_SWIGLU, "swiglu", TK_F32, false, 16384, 14336);
    /* Decode-sized: a batch of 64 tokens through a Llama-3-8B MLP, against the launch floor. */
    bench_one_glu(ctx, TK_GLU_SWIGLU, "swiglu", TK_BF16, false, 64, 14336);
}
