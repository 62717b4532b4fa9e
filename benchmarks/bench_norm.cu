/*
 * RMSNorm / LayerNorm benchmarks: achieved bandwidth against a device copy of the same bytes.
 * Bytes that must move: each row tensor read or written once (x, y; residual read and written
 * for add+RMSNorm; dy, x, dx backward) plus the weight / bias vectors and, backward, the stats.
 * The dw / db partial sums stay in L2 and are not counted. Rows: bf16 16384 x 4096
 * shapes, then f16 / f32 rows and wide rows (16384 columns: one 512-thread block for 16-bit
 * rows, an sm_90 cluster for f32; 65536: a cluster; wide_vec16 elsewhere; the cluster rows with
 * each op: the residual and LayerNorm's second reduction take their own paths), the backward at
 * 16384 x 4096 and at 4096 x 16384 (16-bit rows of 16384: the ring kernel at 4 packs per thread
 * where the device's shared memory holds it) and 1024 x 65536 (sm_90: the backward cluster
 * kernel, 4 slices of 32 KB; wide_vec16 elsewhere; RMSNorm and LayerNorm with f32 w), then
 * decode-sized calls (1 and 64 rows), timed against the launch floor instead
 * (bench_memory_baseline).
 */
#include <stdio.h>

#include "bench.h"

namespace {

struct norm_arg {
    bool layernorm, backward;
    tk_norm_params p;
    const void *x, *weight, *bias, *dy;
    void *residual, *y, *dw, *db, *workspace;
    float *mean, *rstd;
    size_t workspace_bytes;
};

void run_norm(void *arg, cudaStream_t stream) {
    norm_arg *a = static_cast<norm_arg *>(arg);
    tk_status s;
    if (a->backward)
        s = a->layernorm ? tk_layernorm_bwd(&a->p, a->dy, a->x, a->weight, a->mean, a->rstd, a->y, a->dw, a->db,
                                            a->workspace, a->workspace_bytes, stream)
                         : tk_rmsnorm_bwd(&a->p, a->dy, a->x, a->weight, a->rstd, a->y, a->dw, a->workspace,
                                          a->workspace_bytes, stream);
    else
        s = a->layernorm ? tk_layernorm_fwd(&a->p, a->x, a->residual, a->weight, a->bias, a->y, NULL, NULL, stream)
                         : tk_rmsnorm_fwd(&a->p, a->x, a->residual, a->weight, a->y, NULL, stream);
    bench_check(s, a->layernorm ? "tk_layernorm" : "tk_rmsnorm");
}

void bench_one(bench_ctx *ctx, const char *op, bool layernorm, bool residual, bool backward, tk_dtype dtype,
               tk_dtype weight_dtype, int64_t rows, int64_t cols) {
    const size_t es = dtype == TK_F32 ? 4 : 2, ws = weight_dtype == TK_F32 ? 4 : 2;
    const int64_t n = rows * cols;
    norm_arg a = {};
    a.layernorm = layernorm;
    a.backward = backward;
    a.p = tk_norm_params TK_NORM_PARAMS_INIT;
    a.p.dtype = dtype;
    a.p.weight_dtype = weight_dtype;
    a.p.rows = rows;
    a.p.cols = cols;
    a.p.eps = 1e-5f;
    a.x = bench_random(ctx, dtype, n, -2, 2);
    a.weight = bench_random(ctx, weight_dtype, cols, 0.5f, 1.5f);
    a.bias = layernorm ? bench_random(ctx, weight_dtype, cols, -1, 1) : NULL;
    a.residual = residual ? bench_random(ctx, dtype, n, -1, 1) : NULL;
    a.y = bench_alloc(ctx, (size_t)n * es);
    double bytes = (double)n * es * (residual ? 4 : 2) + (double)cols * ws * (layernorm ? 2 : 1);
    if (backward) {
        a.dy = bench_random(ctx, dtype, n, -1, 1);
        /* Stats of a normalised input: mean ~ 0, rstd ~ 1 (the values only set the arithmetic). */
        a.mean = static_cast<float *>(bench_random(ctx, TK_F32, rows, -0.1f, 0.1f));
        a.rstd = static_cast<float *>(bench_random(ctx, TK_F32, rows, 0.5f, 1.5f));
        a.dw = bench_alloc(ctx, (size_t)cols * ws);
        a.db = layernorm ? bench_alloc(ctx, (size_t)cols * ws) : NULL;
        bench_check(tk_norm_bwd_workspace_size(&a.p, layernorm ? TK_NORM_LAYER : TK_NORM_RMS, &a.workspace_bytes),
                    "tk_norm_bwd_workspace_size");
        a.workspace = bench_alloc(ctx, a.workspace_bytes);
        bytes = (double)n * es * 3 + (double)cols * ws * (layernorm ? 3 : 2) + (double)rows * 4 * (layernorm ? 2 : 1);
    }
    const double ms = bench_time_ms(ctx, run_norm, &a);
    char shape[48];
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
    char dtypes[32];
    snprintf(dtypes, sizeof dtypes, "%s%s", op, weight_dtype != dtype ? " (f32 w)" : "");
    double base_ms;
    const char *base = bench_memory_baseline(ctx, rows, bytes, &base_ms);
    bench_row row = {dtypes, shape, dtype, tk_last_variant(), ms, bytes, 0, base, base_ms};
    bench_report(ctx, &row);
    bench_free_all(ctx);
}

} // namespace

extern "C" void bench_norm(bench_ctx *ctx) {
    bench_one(ctx, "rmsnorm fwd", false, false, false, TK_BF16, TK_BF16, 16384, 4096);
    bench_one(ctx, "add+rmsnorm fwd", false, true, false, TK_BF16, TK_BF16, 16384, 4096);
    bench_one(ctx, "layernorm fwd", true, false, false, TK_BF16, TK_BF16, 16384, 4096);
    bench_one(ctx, "rmsnorm fwd", false, false, false, TK_BF16, TK_F32, 16384, 4096);
    bench_one(ctx, "layernorm fwd", true, false, false, TK_BF16, TK_F32, 16384, 3072);
    bench_one(ctx, "rmsnorm fwd", false, false, false, TK_F16, TK_F16, 16384, 4096);
    bench_one(ctx, "rmsnorm fwd", false, false, false, TK_F32, TK_F32, 16384, 4096);
    bench_one(ctx, "add+rmsnorm fwd", false, true, false, TK_BF16, TK_BF16, 16384, 3584);
    bench_one(ctx, "rmsnorm fwd", false, false, false, TK_BF16, TK_BF16, 4096, 16384);
    bench_one(ctx, "add+rmsnorm fwd", false, true, false, TK_BF16, TK_BF16, 4096, 16384);
    bench_one(ctx, "layernorm fwd", true, false, false, TK_BF16, TK_BF16, 4096, 16384);
    bench_one(ctx, "rmsnorm fwd", false, false, false, TK_F32, TK_F32, 4096, 16384);
    bench_one(ctx, "layernorm fwd", true, false, false, TK_F32, TK_F32, 4096, 16384);
    bench_one(ctx, "rmsnorm fwd", false, false, false, TK_BF16, TK_BF16, 1024, 65536);
    bench_one(ctx, "add+rmsnorm fwd", false, true, false, TK_BF16, TK_BF16, 1024, 65536);
    bench_one(ctx, "layernorm fwd", true, false, false, TK_BF16, TK_BF16, 1024, 65536);
    bench_one(ctx, "rmsnorm bwd", false, false, true, TK_BF16, TK_BF16, 16384, 4096);
    bench_one(ctx, "layernorm bwd", true, false, true, TK_BF16, TK_F32, 16384, 4096);
    bench_one(ctx, "rmsnorm bwd", false, false, true, TK_BF16, TK_BF16, 4096, 16384);
    bench_one(ctx, "layernorm bwd", true, false, true, TK_BF16, TK_F32, 4096, 16384);
    bench_one(ctx, "rmsnorm bwd", false, false, true, TK_BF16, TK_BF16, 1024, 65536);
    bench_one(ctx, "layernorm bwd", true, false, true, TK_BF16, TK_F32, 1024, 65536);
    /* Decode-sized: one token and a batch of 64, against the launch floor. */
    bench_one(ctx, "rmsnorm fwd", false, false, false, TK_BF16, TK_BF16, 1, 4096);
    bench_one(ctx, "add+rmsnorm fwd", false, true, false, TK_BF16, TK_BF16, 64, 4096);
    bench_one(ctx, "layernorm fwd", true, false, false, TK_BF16, TK_BF16, 64, 4096);
}
