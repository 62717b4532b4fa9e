/*
 * GEMM benchmarks (bf16 in, bf16 out, f32 accumulation), same buffers and same run for every
 * row of a shape:
 *   gemm                 tk_gemm                          vs cublasGemmEx
 *   gemm+bias            tk_gemm with bias                vs cublasLtMatmul, EPILOGUE_BIAS
 *   gemm+bias+gelu       tk_gemm, bias, GELU (tanh form)  vs cublasLtMatmul, EPILOGUE_GELU_BIAS
 *                                                            (cuBLASLt's GELU is the tanh form)
 *   gemm+bias+gelu       the same fused call              vs tk_gemm then tk_activation_fwd
 *   gemm+bias+gelu       the same fused call              vs tk_gemm without epilogue (what
 *                                                            the fused epilogue costs)
 *   gemm (mma_128x256)   the portable kernel, forced      vs cublasGemmEx (where the library
 *                                                            picks another kernel, e.g. wgmma)
 *   gemm+bias+gelu (mma_128x256)  forced, fused           vs the forced plain GEMM (what the
 *                                                            portable kernel's epilogue costs)
 * B is [N, K] (a Linear weight, D = A B^T) unless the row says B KN. Shapes: 4096^3, 8192^3 and
 * the Llama / Mistral layer shapes, written M x N x K.
 *
 * Every repetition of every timing (ours, cuBLAS, cuBLASLt, the unfused pair) starts from an
 * idle GPU (bench_time_idle_ms, IDLE_MS). These GEMMs hold the H200 at its 700 W power limit: a
 * timing right after another one measured up to 18% fewer TFLOP/s than after 100 ms of idle.
 * With one pause per timing instead of per repetition, the rows of the longest shapes still
 * moved between runs (the fused/plain time ratio of the same kernel at 16384 x 14336 x 4096:
 * 0.98 in one run, 1.13 in another; docs/performance.md): 25 ms of warm-up and 30 launches of
 * 3-4 ms back to back are long enough for the clocks to come down during the timing, more for
 * a longer kernel. An idle pause before every launch times each kernel from the same state,
 * ours and the baselines alike; it favours none. It adds ~2 min to the run (48 timings x 30
 * repetitions x 100 ms).
 */
#include <cublasLt.h>
#include <cublas_v2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

namespace {

/* The sm_80+ kernel for calls of at least one wave of tiles: a "gemm" row of its own at every
 * shape, so that the portable path's ratio to cuBLAS is visible on Hopper too. */
const char *const PORTABLE_VARIANT = "mma_128x256";

void check_cublas(cublasStatus_t s, const char *what) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_gemm: %s failed: cuBLAS status %d\n", what, (int)s);
        exit(1);
    }
}

struct gemm_problem {
    int64_t m, n, k;
    bool b_kn;
    const void *a, *b, *bias;
    void *d;
    tk_gemm_params plain, with_bias, with_gelu;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t lt_desc[2]; /* BIAS, GELU_BIAS */
    cublasLtMatrixLayout_t lt_a, lt_b, lt_d;
    cublasLtMatmulHeuristicResult_t lt_algo[2];
    void *workspace;
    size_t workspace_bytes;
};

void run_tk(const tk_gemm_params *p, cudaStream_t stream) { bench_check(tk_gemm(p, stream), "tk_gemm"); }
void run_tk_plain(void *arg, cudaStream_t stream) { run_tk(&static_cast<gemm_problem *>(arg)->plain, stream); }
void run_tk_bias(void *arg, cudaStream_t stream) { run_tk(&static_cast<gemm_problem *>(arg)->with_bias, stream); }
void run_tk_gelu(void *arg, cudaStream_t stream) { run_tk(&static_cast<gemm_problem *>(arg)->with_gelu, stream); }

void run_tk_unfused(void *arg, cudaStream_t stream) {
    gemm_problem *g = static_cast<gemm_problem *>(arg);
    run_tk(&g->plain, stream);
    bench_check(tk_activation_fwd(TK_ACT_GELU_TANH, TK_BF16, g->d, g->bias, g->d, g->m, g->n, stream),
                "tk_activation_fwd");
}

/* Row-major D[M, N] = A[M, K] op(B) is column-major D^T[N, M] = op(B)^T A^T: cuBLAS sees B as
 * its first operand (transposed for the [N, K] layout) and A as its second. */
void run_cublas(void *arg, cudaStream_t stream) {
    gemm_problem *g = static_cast<gemm_problem *>(arg);
    const float alpha = 1.0f, beta = 0.0f;
    check_cublas(cublasSetStream(g->blas, stream), "cublasSetStream");
    check_cublas(cublasGemmEx(g->blas, g->b_kn ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, (int)g->n,
                              (int)g->m, (int)g->k, &alpha, g->b, CUDA_R_16BF,
                              (int)(g->b_kn ? g->n : g->k), g->a, CUDA_R_16BF, (int)g->k, &beta, g->d,
                              CUDA_R_16BF, (int)g->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
}

void run_lt(gemm_problem *g, int which, cudaStream_t stream) {
    const float alpha = 1.0f, beta = 0.0f;
    check_cublas(cublasLtMatmul(g->lt, g->lt_desc[which], &alpha, g->b, g->lt_a, g->a, g->lt_b, &beta,
                                g->d, g->lt_d, g->d, g->lt_d, &g->lt_algo[which].algo, g->workspace,
                                g->workspace_bytes, stream),
                 "cublasLtMatmul");
}
void run_lt_bias(void *arg, cudaStream_t stream) { run_lt(static_cast<gemm_problem *>(arg), 0, stream); }
void run_lt_gelu(void *arg, cudaStream_t stream) { run_lt(static_cast<gemm_problem *>(arg), 1, stream); }

void setup_lt(gemm_problem *g) {
    const cublasOperation_t trans_a = g->b_kn ? CUBLAS_OP_N : CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogues[2] = {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_BIAS};
    const cudaDataType_t bias_type = CUDA_R_16BF;
    check_cublas(cublasLtMatrixLayoutCreate(&g->lt_a, CUDA_R_16BF, g->b_kn ? g->n : g->k,
                                            g->b_kn ? g->k : g->n, g->b_kn ? g->n : g->k),
                 "cublasLtMatrixLayoutCreate");
    check_cublas(cublasLtMatrixLayoutCreate(&g->lt_b, CUDA_R_16BF, g->k, g->m, g->k), "cublasLtMatrixLayoutCreate");
    check_cublas(cublasLtMatrixLayoutCreate(&g->lt_d, CUDA_R_16BF, g->n, g->m, g->n), "cublasLtMatrixLayoutCreate");
    cublasLtMatmulPreference_t pref;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &g->workspace_bytes, sizeof g->workspace_bytes),
                 "cublasLtMatmulPreferenceSetAttribute");
    for (int i = 0; i < 2; i++) {
        check_cublas(cublasLtMatmulDescCreate(&g->lt_desc[i], CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
        cublasLtMatmulDesc_t desc = g->lt_desc[i];
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a), "TRANSA");
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b), "TRANSB");
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogues[i], sizeof epilogues[i]), "EPILOGUE");
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias), "BIAS_POINTER");
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type), "BIAS_DATA_TYPE");
        int found = 0;
        check_cublas(cublasLtMatmulAlgoGetHeuristic(g->lt, desc, g->lt_a, g->lt_b, g->lt_d, g->lt_d, pref, 1,
                                                    &g->lt_algo[i], &found),
                     "cublasLtMatmulAlgoGetHeuristic");
        if (found < 1) {
            fprintf(stderr, "bench_gemm: cuBLASLt has no algorithm for epilogue %d\n", (int)epilogues[i]);
            exit(1);
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
}

void teardown_lt(gemm_problem *g) {
    for (int i = 0; i < 2; i++)
        cublasLtMatmulDescDestroy(g->lt_desc[i]);
    cublasLtMatrixLayoutDestroy(g->lt_a);
    cublasLtMatrixLayoutDestroy(g->lt_b);
    cublasLtMatrixLayoutDestroy(g->lt_d);
}

void report(bench_ctx *ctx, const char *op, const char *shape, const char *variant, double ms,
            double flops, const char *baseline, double baseline_ms) {
    bench_row row = {op, shape, TK_BF16, variant, ms, 0.0, flops, baseline, baseline_ms};
    bench_report(ctx, &row);
}

/* Idle time before each repetition. Measured on the H200 (the settle test of
 * experiments/gemm_mma_schedules.cu, removed in 104058d: ~100 ms of cuBLAS, a pause, then a timing of the portable kernel at
 * 16384 x 4096 x 4096): 390-397 TFLOP/s after no pause, 425 after 30 ms, 474-478 after 100 ms,
 * 476-478 after 300 ms, 479 after 1 s. */
const int IDLE_MS = 100;

/* Median time with every repetition from an idle GPU (see the header). */
double settled_ms(bench_ctx *ctx, bench_fn fn, void *arg) { return bench_time_idle_ms(ctx, fn, arg, IDLE_MS); }

/* The tk_gemm variant that a call runs (the name is static). */
const char *variant_of(const tk_gemm_params *p) {
    const char *name = "";
    bench_check(tk_gemm_supported(p, &name), "tk_gemm_supported");
    return name;
}

void bench_shape(bench_ctx *ctx, cublasHandle_t blas, cublasLtHandle_t lt, int64_t m, int64_t n,
                 int64_t k, bool b_kn, bool with_epilogues) {
    gemm_problem g = {};
    g.m = m; g.n = n; g.k = k; g.b_kn = b_kn;
    g.blas = blas; g.lt = lt;
    g.a = bench_random(ctx, TK_BF16, m * k, -1.0f, 1.0f);
    g.b = bench_random(ctx, TK_BF16, k * n, -1.0f, 1.0f);
    g.bias = bench_random(ctx, TK_BF16, n, -1.0f, 1.0f);
    g.d = bench_alloc(ctx, (size_t)(m * n) * 2);
    g.workspace_bytes = (size_t)64 << 20;
    g.workspace = bench_alloc(ctx, g.workspace_bytes);

    tk_gemm_params p = TK_GEMM_PARAMS_INIT;
    p.m = m; p.n = n; p.k = k;
    p.input_dtype = TK_BF16; p.output_dtype = TK_BF16;
    p.b_layout = b_kn ? TK_GEMM_B_KN : TK_GEMM_B_NK;
    p.a = g.a; p.lda = k;
    p.b = g.b; p.ldb = b_kn ? n : k;
    p.d = g.d; p.ldd = n;
    g.plain = p;
    p.bias = g.bias;
    g.with_bias = p;
    p.activation = TK_ACT_GELU_TANH;
    g.with_gelu = p;

    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld%s", (long long)m, (long long)n, (long long)k,
             b_kn ? " B KN" : "");
    const double flops = 2.0 * (double)m * (double)n * (double)k;

    const double cublas_ms = settled_ms(ctx, run_cublas, &g);
    const double plain_ms = settled_ms(ctx, run_tk_plain, &g);
    const char *automatic = variant_of(&g.plain);
    report(ctx, "gemm", shape, automatic, plain_ms, flops, "cuBLAS", cublas_ms);
    /* The portable mma.sync kernel at the same shape, where the library picks another one
     * (wgmma on an H100 / H200) and this device can run it. */
    if (strcmp(automatic, PORTABLE_VARIANT) != 0) {
        bench_check(tk_experimental_force_variant("gemm", PORTABLE_VARIANT), "tk_experimental_force_variant");
        const char *forced = NULL;
        if (tk_gemm_supported(&g.plain, &forced) == TK_SUCCESS) {
            const double portable_ms = settled_ms(ctx, run_tk_plain, &g);
            report(ctx, "gemm", shape, forced, portable_ms, flops, "cuBLAS", cublas_ms);
            if (with_epilogues) {
                const double portable_gelu_ms = settled_ms(ctx, run_tk_gelu, &g);
                report(ctx, "gemm+bias+gelu", shape, forced, portable_gelu_ms, flops, "tk gemm (plain)",
                       portable_ms);
            }
        }
        bench_check(tk_experimental_force_variant("gemm", NULL), "tk_experimental_force_variant");
    }
    if (!with_epilogues)
        return;
    setup_lt(&g);
    const double lt_bias_ms = settled_ms(ctx, run_lt_bias, &g);
    const double bias_ms = settled_ms(ctx, run_tk_bias, &g);
    report(ctx, "gemm+bias", shape, variant_of(&g.with_bias), bias_ms, flops, "cuBLASLt bias", lt_bias_ms);
    const double lt_gelu_ms = settled_ms(ctx, run_lt_gelu, &g);
    const double gelu_ms = settled_ms(ctx, run_tk_gelu, &g);
    report(ctx, "gemm+bias+gelu", shape, variant_of(&g.with_gelu), gelu_ms, flops, "cuBLASLt bias+gelu",
           lt_gelu_ms);
    const double unfused_ms = settled_ms(ctx, run_tk_unfused, &g);
    report(ctx, "gemm+bias+gelu", shape, variant_of(&g.with_gelu), gelu_ms, flops,
           "tk gemm, tk_activation", unfused_ms);
    report(ctx, "gemm+bias+gelu", shape, variant_of(&g.with_gelu), gelu_ms, flops, "tk gemm (plain)", plain_ms);
    teardown_lt(&g);
}

} // namespace

extern "C" void bench_gemm(bench_ctx *ctx) {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    check_cublas(cublasCreate(&blas), "cublasCreate");
    check_cublas(cublasLtCreate(&lt), "cublasLtCreate");
    const int64_t shapes[][3] = {
        {4096, 4096, 4096}, {8192, 8192, 8192}, {16384, 4096, 4096}, {16384, 14336, 4096}, {16384, 4096, 14336},
    };
    for (const auto &s : shapes) {
        bench_shape(ctx, blas, lt, s[0], s[1], s[2], false, true);
        bench_free_all(ctx);
    }
    bench_shape(ctx, blas, lt, 8192, 8192, 8192, true, false);
    bench_free_all(ctx);
    cublasLtDestroy(lt);
    cublasDestroy(blas);
}
