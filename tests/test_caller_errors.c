/* A caller's own earlier CUDA error is the caller's: each family's entry point, called with valid
 * arguments right after a failed cudaMalloc of the caller's (not sticky: it stays the thread's
 * last error until read), must succeed, write its output, and leave that error in place. One
 * test per family, every launcher of the family that the device runs (forced variants), small
 * shapes checked against the fp64 references. GPU only; each test skips without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "support/tk_test.h"
#include "ref/activation_ref.h"
#include "ref/attention_ref.h"
#include "ref/gemm_ref.h"
#include "ref/norm_ref.h"
#include "ref/rope_ref.h"
#include "ref/softmax_ref.h"

/* ------------------------------------------------------------------ the caller's error ---- */

/* More bytes than any device holds: cudaMalloc fails with cudaErrorMemoryAllocation and records
 * it as the thread's last error. */
static void provoke_caller_error(void) {
    TK_SKIP_UNDER_SANITIZER("provokes a failing cudaMalloc on purpose");
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, (size_t)1 << 62);
    cr_assert_eq(e, cudaErrorMemoryAllocation, "cudaMalloc(2^62) returned %s", cudaGetErrorName(e));
}

/* `status` is that of a call made after provoke_caller_error(): it must have succeeded, and the
 * caller's error must still be the last one (read, and so cleared, here). */
static void expect_caller_error_kept(tk_status status, const char *what) {
    const cudaError_t last = cudaGetLastError();
    cr_assert_eq(status, TK_SUCCESS, "%s after the caller's failed cudaMalloc returned %s: %s", what,
                 tk_status_string(status), tk_last_error());
    cr_assert_eq(last, cudaErrorMemoryAllocation, "%s: the caller's last error became %s", what,
                 cudaGetErrorName(last));
    const cudaError_t after = cudaGetLastError();
    cr_assert_eq(after, cudaSuccess, "%s: a second error %s is pending", what, cudaGetErrorName(after));
}

/* Forces `variant` of `op` (NULL: the automatic choice), asserting success. */
static void force(const char *op, const char *variant) {
    cr_assert_eq(tk_experimental_force_variant(op, variant), TK_SUCCESS, "forcing %s %s: %s", op,
                 variant ? variant : "(none)", tk_last_error());
}

/* Whether the device runs variants of minimum compute capability min_cc in this build. */
static bool device_runs(int min_cc) {
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS);
    return tk_build_runs_variant(min_cc, info.compute_capability);
}

/* ------------------------------------------------------------------------- tensors ---- */

/* A tensor's host copy (the input, or the output once read back) and its device copy. */
typedef struct tensor {
    tk_dtype dtype;
    int64_t n;
    unsigned char *host;
    void *dev;
} tensor;

static size_t bytes_of(const tensor *t) { return (size_t)t->n * tk_test_dtype_size(t->dtype); }

static tensor new_tensor(tk_dtype dtype, int64_t n) {
    tensor t = {dtype, n, NULL, NULL};
    t.host = malloc(bytes_of(&t));
    cr_assert(t.host != NULL);
    t.dev = tk_dev_alloc(bytes_of(&t));
    return t;
}

/* Uniform in [lo, hi), rounded to dtype, on the host and the device. */
static tensor random_tensor(tk_rng *rng, tk_dtype dtype, int64_t n, double lo, double hi) {
    tensor t = new_tensor(dtype, n);
    tk_fill_uniform(rng, dtype, t.host, n, lo, hi);
    tk_to_dev(t.dev, t.host, bytes_of(&t));
    return t;
}

/* An output: NaN everywhere on the device until the call writes it. */
static tensor output_tensor(tk_dtype dtype, int64_t n) {
    tensor t = new_tensor(dtype, n);
    tk_dev_poison(t.dev, bytes_of(&t));
    return t;
}

static void poison(tensor *t) { tk_dev_poison(t->dev, bytes_of(t)); }

static double at(const tensor *t, int64_t i) { return tk_test_load(t->dtype, t->host, i); }

static double *doubles(int64_t n) {
    double *d = malloc((size_t)n * sizeof(double));
    cr_assert(d != NULL);
    return d;
}

/* The host copy's values as doubles. */
static double *values(const tensor *t) {
    double *d = doubles(t->n);
    for (int64_t i = 0; i < t->n; i++)
        d[i] = at(t, i);
    return d;
}

/* Reads the output back and compares it with `ref` (no NaN left: every element written). */
static void expect_output(tensor *got, const double *ref, double rtol, double atol_scale, const char *what) {
    tk_dev_sync();
    tk_to_host(got->host, got->dev, bytes_of(got));
    TK_ASSERT_CLOSE(got->dtype, got->host, ref, got->n, rtol, atol_scale, what);
}

static void release(tensor *t) {
    tk_dev_free(t->dev);
    free(t->host);
}

/* -------------------------------------------------------------------------- families ---- */

Test(caller_errors_gpu, activation) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(1);
    const int64_t rows = 4, cols = 1000;
    tensor x = random_tensor(&rng, TK_BF16, rows * cols, -4.0, 4.0);
    tensor bias = random_tensor(&rng, TK_BF16, cols, -1.0, 1.0);
    tensor y = output_tensor(TK_BF16, rows * cols);
    double *ref = doubles(y.n);
    for (int64_t i = 0; i < y.n; i++)
        ref[i] = ref_activation(TK_ACT_GELU_TANH, at(&x, i) + at(&bias, i % cols));
    provoke_caller_error();
    expect_caller_error_kept(tk_activation_fwd(TK_ACT_GELU_TANH, TK_BF16, x.dev, bias.dev, y.dev, rows, cols, NULL),
                             "tk_activation_fwd");
    expect_output(&y, ref, tk_default_rtol(TK_BF16), 1.0, "tk_activation_fwd");
    free(ref);
    release(&x), release(&bias), release(&y);
}

Test(caller_errors_gpu, glu) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(2);
    tk_glu_params p = TK_GLU_PARAMS_INIT;
    p.kind = TK_GLU_SWIGLU;
    p.dtype = TK_BF16;
    p.rows = 4;
    p.d = 512;
    tensor x = random_tensor(&rng, TK_BF16, p.rows * 2 * p.d, -4.0, 4.0);
    tensor y = output_tensor(TK_BF16, p.rows * p.d);
    double *ref = doubles(y.n);
    for (int64_t r = 0; r < p.rows; r++)
        for (int64_t j = 0; j < p.d; j++)
            ref[r * p.d + j] = ref_glu(&p, at(&x, r * 2 * p.d + j), at(&x, r * 2 * p.d + p.d + j));
    provoke_caller_error();
    expect_caller_error_kept(tk_glu_fwd(&p, x.dev, y.dev, NULL), "tk_glu_fwd");
    expect_output(&y, ref, tk_default_rtol(TK_BF16), 1.0, "tk_glu_fwd");
    free(ref);
    release(&x), release(&y);
}

/* RMSNorm of rows x cols bf16 with a bf16 weight, for the forward and backward tests. */
enum { NORM_ROWS = 4, NORM_COLS = 1024 };
static const char *const NORM_VARIANTS[] = {"vec16", "wide_vec16"};

static tk_norm_params norm_params(void) {
    tk_norm_params p = TK_NORM_PARAMS_INIT;
    p.rows = NORM_ROWS;
    p.cols = NORM_COLS;
    return p;
}

Test(caller_errors_gpu, norm_forward) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(3);
    const tk_norm_params p = norm_params();
    tensor x = random_tensor(&rng, TK_BF16, NORM_ROWS * NORM_COLS, -2.0, 2.0);
    tensor w = random_tensor(&rng, TK_BF16, NORM_COLS, 0.5, 1.5);
    tensor y = output_tensor(TK_BF16, NORM_ROWS * NORM_COLS), rstd = output_tensor(TK_F32, NORM_ROWS);
    double *X = values(&x), *W = values(&w), *H = doubles(x.n), *Y = doubles(y.n);
    double M[NORM_ROWS], S[NORM_ROWS];
    ref_norm_fwd(false, TK_BF16, NORM_ROWS, NORM_COLS, X, NULL, W, NULL, false, p.eps, H, Y, M, S);
    for (size_t v = 0; v < sizeof NORM_VARIANTS / sizeof NORM_VARIANTS[0]; v++) {
        char what[64];
        snprintf(what, sizeof what, "tk_rmsnorm_fwd, variant %s", NORM_VARIANTS[v]);
        force("norm", NORM_VARIANTS[v]);
        poison(&y), poison(&rstd);
        provoke_caller_error();
        expect_caller_error_kept(tk_rmsnorm_fwd(&p, x.dev, NULL, w.dev, y.dev, rstd.dev, NULL), what);
        expect_output(&y, Y, tk_default_rtol(TK_BF16), 1.0, what);
        expect_output(&rstd, S, 1e-4, 0.0, what);
    }
    force("norm", NULL);
    free(X), free(W), free(H), free(Y);
    release(&x), release(&w), release(&y), release(&rstd);
}

/* Stage 1 (dx and partial dw) and stage 2 (dw) are two launches. */
Test(caller_errors_gpu, norm_backward) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(4);
    const tk_norm_params p = norm_params();
    tensor x = random_tensor(&rng, TK_BF16, NORM_ROWS * NORM_COLS, -2.0, 2.0);
    tensor dy = random_tensor(&rng, TK_BF16, NORM_ROWS * NORM_COLS, -1.0, 1.0);
    tensor w = random_tensor(&rng, TK_BF16, NORM_COLS, 0.5, 1.5);
    tensor rstd = new_tensor(TK_F32, NORM_ROWS);
    tensor dx = output_tensor(TK_BF16, NORM_ROWS * NORM_COLS), dw = output_tensor(TK_BF16, NORM_COLS);
    double *X = values(&x), *DY = values(&dy), *W = values(&w), *H = doubles(x.n), *Y = doubles(x.n);
    double *DX = doubles(dx.n), *DW = doubles(dw.n), *DB = doubles(dw.n);
    double M[NORM_ROWS], S[NORM_ROWS];
    ref_norm_fwd(false, TK_BF16, NORM_ROWS, NORM_COLS, X, NULL, W, NULL, false, p.eps, H, Y, M, S);
    for (int64_t r = 0; r < NORM_ROWS; r++) { /* the stats as the forward stores them, in f32 */
        tk_test_store(TK_F32, rstd.host, r, S[r]);
        S[r] = at(&rstd, r);
    }
    tk_to_dev(rstd.dev, rstd.host, bytes_of(&rstd));
    ref_norm_bwd(false, NORM_ROWS, NORM_COLS, DY, X, W, false, NULL, S, DX, DW, DB);
    size_t ws_bytes = 0;
    cr_assert_eq(tk_norm_bwd_workspace_size(&p, TK_NORM_RMS, &ws_bytes), TK_SUCCESS, "%s", tk_last_error());
    void *ws = tk_dev_alloc(ws_bytes);
    for (size_t v = 0; v < sizeof NORM_VARIANTS / sizeof NORM_VARIANTS[0]; v++) {
        char what[64];
        snprintf(what, sizeof what, "tk_rmsnorm_bwd, variant %s", NORM_VARIANTS[v]);
        force("norm_bwd", NORM_VARIANTS[v]);
        poison(&dx), poison(&dw);
        provoke_caller_error();
        expect_caller_error_kept(
            tk_rmsnorm_bwd(&p, dy.dev, x.dev, w.dev, rstd.dev, dx.dev, dw.dev, ws, ws_bytes, NULL), what);
        expect_output(&dx, DX, tk_default_rtol(TK_BF16), 1.0, what);
        expect_output(&dw, DW, tk_default_rtol(TK_BF16), sqrt((double)NORM_ROWS) + 1.0, what);
    }
    force("norm_bwd", NULL);
    tk_dev_free(ws);
    free(X), free(DY), free(W), free(H), free(Y), free(DX), free(DW), free(DB);
    release(&x), release(&dy), release(&w), release(&rstd), release(&dx), release(&dw);
}

/* Softmax over rows x cols of `dtype` with each given variant, forward or backward. */
static void run_softmax(tk_dtype dtype, int64_t rows, int64_t cols, bool backward,
                        const char *const *variants, size_t variant_count, uint64_t seed) {
    tk_rng rng = tk_rng_seeded(seed);
    tk_softmax_params p = TK_SOFTMAX_PARAMS_INIT;
    p.dtype = dtype;
    p.rows = rows;
    p.cols = cols;
    tensor x = random_tensor(&rng, dtype, rows * cols, -4.0, 4.0);
    tensor dy = random_tensor(&rng, dtype, rows * cols, -1.0, 1.0);
    tensor out = output_tensor(dtype, rows * cols);
    double *X = values(&x), *DY = values(&dy), *Y = doubles(out.n), *ref = doubles(out.n);
    for (int64_t r = 0; r < rows; r++)
        ref_softmax_row(X + r * cols, cols, cols, 1.0, 0, Y + r * cols);
    /* Backward: y is the forward's output as stored, x stands in as its device copy. */
    double atol = dtype == TK_F32 ? 1e-6 : 1e-4; /* forward: probabilities relative to themselves */
    if (backward) {
        for (int64_t i = 0; i < x.n; i++) {
            tk_test_store(dtype, x.host, i, Y[i]);
            Y[i] = at(&x, i);
        }
        tk_to_dev(x.dev, x.host, bytes_of(&x));
        atol = 0.0; /* gradients relative to their largest size (a difference, dy - sum) */
        for (int64_t r = 0; r < rows; r++)
            ref_softmax_bwd_row(Y + r * cols, DY + r * cols, cols, cols, 1.0, 0, ref + r * cols);
        for (int64_t i = 0; i < out.n; i++)
            atol = fmax(atol, fabs(ref[i]));
    } else {
        memcpy(ref, Y, (size_t)out.n * sizeof(double));
    }
    for (size_t v = 0; v < variant_count; v++) {
        char what[96];
        snprintf(what, sizeof what, "tk_softmax_%s %s, variant %s", backward ? "bwd" : "fwd",
                 tk_test_dtype_name(dtype), variants[v]);
        force(backward ? "softmax_bwd" : "softmax", variants[v]);
        poison(&out);
        provoke_caller_error();
        expect_caller_error_kept(backward ? tk_softmax_bwd(&p, x.dev, dy.dev, out.dev, NULL)
                                          : tk_softmax_fwd(&p, x.dev, out.dev, NULL),
                                 what);
        expect_output(&out, ref, tk_default_rtol(dtype), atol, what);
    }
    force(backward ? "softmax_bwd" : "softmax", NULL);
    free(X), free(DY), free(Y), free(ref);
    release(&x), release(&dy), release(&out);
}

static const char *const SOFTMAX_VARIANTS[] = {"vec16_regs", "vec16_stream"};
static const char *const SOFTMAX_PIPELINED[] = {"vec16_pipelined"};

Test(caller_errors_gpu, softmax_forward) {
    TK_REQUIRE_GPU();
    run_softmax(TK_BF16, 4, 1000, false, SOFTMAX_VARIANTS, 2, 5);
    /* The cluster launch of the pipelined variant (f32 rows of 400 KB: 4 blocks). */
    if (device_runs(900))
        run_softmax(TK_F32, 2, 100000, false, SOFTMAX_PIPELINED, 1, 6);
}

Test(caller_errors_gpu, softmax_backward) {
    TK_REQUIRE_GPU();
    run_softmax(TK_BF16, 4, 1000, true, SOFTMAX_VARIANTS, 2, 7);
    /* The backward's cluster launch (the same rows, y and dy re-read: 8 blocks). */
    if (device_runs(900))
        run_softmax(TK_F32, 2, 100000, true, SOFTMAX_PIPELINED, 1, 11);
}

Test(caller_errors_gpu, rope) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(8);
    tk_rope_params p = TK_ROPE_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.style = TK_ROPE_NEOX;
    p.tokens = 8;
    p.heads_q = 4;
    p.heads_k = 2;
    p.head_dim = 128;
    p.position_start = 3;
    const int64_t d = p.head_dim;
    tensor q = random_tensor(&rng, TK_BF16, p.tokens * p.heads_q * d, -2.0, 2.0);
    tensor k = random_tensor(&rng, TK_BF16, p.tokens * p.heads_k * d, -2.0, 2.0);
    tensor q_out = output_tensor(TK_BF16, q.n), k_out = output_tensor(TK_BF16, k.n);
    double *Q = values(&q), *K = values(&k), *Q_ref = doubles(q.n), *K_ref = doubles(k.n);
    double cos_a[64], sin_a[64];
    for (int64_t t = 0; t < p.tokens; t++) {
        for (int64_t i = 0; i < d / 2; i++) {
            const double a = (double)(p.position_start + t) * ref_rope_inv_freq(p.theta, i, d);
            cos_a[i] = cos(a);
            sin_a[i] = sin(a);
        }
        for (int64_t h = 0; h < p.heads_q; h++)
            ref_rope_head(p.style, d, d, Q + (t * p.heads_q + h) * d, cos_a, sin_a, 0, Q_ref + (t * p.heads_q + h) * d);
        for (int64_t h = 0; h < p.heads_k; h++)
            ref_rope_head(p.style, d, d, K + (t * p.heads_k + h) * d, cos_a, sin_a, 0, K_ref + (t * p.heads_k + h) * d);
    }
    provoke_caller_error();
    expect_caller_error_kept(tk_rope_fwd(&p, q.dev, k.dev, q_out.dev, k_out.dev, NULL), "tk_rope_fwd");
    expect_output(&q_out, Q_ref, tk_default_rtol(TK_BF16), 1.0, "tk_rope_fwd q");
    expect_output(&k_out, K_ref, tk_default_rtol(TK_BF16), 1.0, "tk_rope_fwd k");
    free(Q), free(K), free(Q_ref), free(K_ref);
    release(&q), release(&k), release(&q_out), release(&k_out);
}

/* Causal GQA attention, 2 query heads on 1 key/value head, dense [B, S, H, D]. */
Test(caller_errors_gpu, attention) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(9);
    enum { S = 100, HQ = 2, D = 64 };
    tensor q = random_tensor(&rng, TK_BF16, S * HQ * D, -1.0, 1.0);
    tensor k = random_tensor(&rng, TK_BF16, S * D, -1.0, 1.0);
    tensor v = random_tensor(&rng, TK_BF16, S * D, -1.0, 1.0);
    tensor o = output_tensor(TK_BF16, S * HQ * D);
    tk_attention_params p = TK_ATTENTION_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.q = q.dev, p.k = k.dev, p.v = v.dev, p.o = o.dev;
    p.batch = 1, p.seqlen_q = S, p.seqlen_k = S, p.heads_q = HQ, p.heads_kv = 1, p.head_dim = D;
    p.causal = 1;
    p.softmax_scale = 0.125f;
    const int64_t q_strides[4] = {S * HQ * D, HQ * D, D, 1}, kv_strides[4] = {S * D, D, D, 1};
    memcpy(p.q_strides, q_strides, sizeof q_strides);
    memcpy(p.o_strides, q_strides, sizeof q_strides);
    memcpy(p.k_strides, kv_strides, sizeof kv_strides);
    memcpy(p.v_strides, kv_strides, sizeof kv_strides);
    double *Q = values(&q), *K = values(&k), *V = values(&v), *O = doubles(o.n);
    for (int64_t i = 0; i < S; i++)
        for (int64_t h = 0; h < HQ; h++) {
            double lse;
            ref_attention_row(&p, Q, K, V, NULL, 0, h, i, false, O + (i * HQ + h) * D, &lse);
        }
    provoke_caller_error();
    expect_caller_error_kept(tk_attention_fwd(&p, NULL), "tk_attention_fwd");
    /* Loose: P is rounded to bf16 before P.V, as in FlashAttention (test_attention checks the
     * accuracy; here a missing or wrong output is what fails). */
    expect_output(&o, O, 2e-2, 1.0, "tk_attention_fwd");
    free(Q), free(K), free(V), free(O);
    release(&q), release(&k), release(&v), release(&o);
}

/* Both GEMM files: the automatic choice (wgmma on Hopper builds with sm_90a) and mma_128x128. */
Test(caller_errors_gpu, gemm) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(10);
    const int64_t m = 96, n = 80, k = 64;
    tensor a = random_tensor(&rng, TK_BF16, m * k, -1.0, 1.0);
    tensor b = random_tensor(&rng, TK_BF16, n * k, -1.0, 1.0);
    tensor d = output_tensor(TK_BF16, m * n);
    tk_gemm_params p = TK_GEMM_PARAMS_INIT;
    p.m = m, p.n = n, p.k = k;
    p.a = a.dev, p.lda = k;
    p.b = b.dev, p.ldb = k;
    p.d = d.dev, p.ldd = n;
    double *product = doubles(m * n), *ref = doubles(m * n);
    ref_gemm_product(TK_BF16, TK_GEMM_B_NK, a.host, k, b.host, k, m, n, k, product);
    ref_gemm_epilogue(&p, product, NULL, NULL, ref);
    static const char *const variants[] = {NULL, "mma_128x128"};
    for (size_t v = 0; v < 2; v++) {
        char what[64];
        snprintf(what, sizeof what, "tk_gemm, variant %s", variants[v] ? variants[v] : "(automatic)");
        force("gemm", variants[v]);
        poison(&d);
        provoke_caller_error();
        expect_caller_error_kept(tk_gemm(&p, NULL), what);
        expect_output(&d, ref, tk_default_rtol(TK_BF16), sqrt((double)k) + 1.0, what);
    }
    force("gemm", NULL);
    free(product), free(ref);
    release(&a), release(&b), release(&d);
}
