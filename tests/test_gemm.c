/* GEMM: bad input on the host (runs everywhere), then every variant x dtype x B layout x
 * epilogue against the fp64 reference on the GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/gemm_ref.h"

#define VARIANT_COUNT 4
static const char *const VARIANTS[VARIANT_COUNT] = {"wgmma_128x256", "mma_128x256", "mma_128x128",
                                                    "mma_unaligned"};
enum { WGMMA_128x256, MMA_128x256, MMA_128x128, MMA_UNALIGNED };

/* Shared memory of "wgmma_128x256": 5 stages of (64 + 256) x 64 x 2 B, barriers, alignment. */
#define WGMMA_SMEM (5 * (64 + 256) * 64 * 2 + 80 + 1024)

/* Tile shape and shared memory of "mma_128x256" (cuda/gemm.cu), which claims only calls with at
 * least one wave of its tiles on devices with this much shared memory per block. */
#define BIG_TILE_M 128
#define BIG_TILE_N 256
#define BIG_TILE_SMEM (3 * (128 + 256) * 64 * 2)

/* ------------------------------------------------------------------ bad input (host) ---- */

/* Fake "device" buffers: host memory with a sentinel; validation must reject before any use. */
static unsigned char in_buf[4096] __attribute__((aligned(16)));
static unsigned char out_buf[4096] __attribute__((aligned(16)));

static void reset_buffers(void) {
    tk_fill_sentinel(in_buf, sizeof in_buf);
    tk_fill_sentinel(out_buf, sizeof out_buf);
}

/* Rejected by tk_gemm and by tk_gemm_supported alike, nothing written anywhere. */
#define EXPECT_REJECTED(params, status, needle)                                                 \
    do {                                                                                        \
        const tk_gemm_params *rp_ = (params);                                                   \
        reset_buffers();                                                                        \
        TK_EXPECT_STATUS(tk_gemm(rp_, NULL), status, needle);                                   \
        const char *name_ = "untouched";                                                        \
        TK_EXPECT_STATUS(tk_gemm_supported(rp_, &name_), status, needle);                       \
        cr_assert_null(name_, "tk_gemm_supported left variant_name set on failure");            \
        cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s: tk_gemm wrote its output", needle); \
        cr_assert(tk_is_sentinel(in_buf, sizeof in_buf), "%s: tk_gemm wrote an input", needle);    \
    } while (0)

/* A valid call on the fake buffers: A [4, 16] and B [8, 16] (NK) in in_buf, D [4, 8] in out_buf. */
static tk_gemm_params host_params(void) {
    tk_gemm_params p = TK_GEMM_PARAMS_INIT;
    p.m = 4;
    p.n = 8;
    p.k = 16;
    p.a = in_buf;
    p.lda = 16;
    p.b = in_buf + 1024;
    p.ldb = 16;
    p.d = out_buf;
    p.ldd = 8;
    return p;
}

Test(gemm_args, rejects_bad_arguments) {
    const tk_gemm_params ok = host_params();
    tk_gemm_params p;
    EXPECT_REJECTED(NULL, TK_ERROR_NULL_POINTER, "'p'");
    p = ok; p.size = 8;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->size'");
    p = ok; p.m = 0;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->m'");
    p = ok; p.n = -3;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->n'");
    p = ok; p.k = 0;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->k'");
    p = ok; p.a = NULL;
    EXPECT_REJECTED(&p, TK_ERROR_NULL_POINTER, "'p->a'");
    p = ok; p.b = NULL;
    EXPECT_REJECTED(&p, TK_ERROR_NULL_POINTER, "'p->b'");
    p = ok; p.d = NULL;
    EXPECT_REJECTED(&p, TK_ERROR_NULL_POINTER, "'p->d'");
    p = ok; p.beta = 1.0f; p.ldc = 8;
    EXPECT_REJECTED(&p, TK_ERROR_NULL_POINTER, "'p->c'");
    p = ok; p.lda = 15;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->lda'");
    p = ok; p.ldb = 15;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->ldb'");
    p = ok; p.b_layout = TK_GEMM_B_KN; p.ldb = 7; /* [k, n] rows hold n = 8 */
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->ldb'");
    p = ok; p.ldd = 7;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->ldd'");
    p = ok; p.beta = 0.5f; p.c = in_buf + 2048; p.ldc = 4;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->ldc'");
    p = ok; p.input_dtype = TK_F32;
    EXPECT_REJECTED(&p, TK_ERROR_NOT_SUPPORTED, "'p->input_dtype'");
    p = ok; p.input_dtype = (tk_dtype)7;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->input_dtype'");
    p = ok; p.output_dtype = (tk_dtype)-1;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->output_dtype'");
    p = ok; p.b_layout = (tk_gemm_b_layout)2;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->b_layout'");
    p = ok; p.activation = (tk_activation)42;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->activation'");
    p = ok; p.alpha = NAN;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->alpha'");
    p = ok; p.alpha = INFINITY;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->alpha'");
    p = ok; p.beta = NAN; p.c = in_buf + 2048; p.ldc = 8;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "'p->beta'");
    p = ok; p.a = in_buf + 1;
    EXPECT_REJECTED(&p, TK_ERROR_MISALIGNED, "'p->a'");
    p = ok; p.output_dtype = TK_F32; p.d = out_buf + 2;
    EXPECT_REJECTED(&p, TK_ERROR_MISALIGNED, "'p->d'");
    p = ok; p.bias = in_buf + 2049;
    EXPECT_REJECTED(&p, TK_ERROR_MISALIGNED, "'p->bias'");
    /* D over the last row of A, over B, over the bias. */
    p = ok; p.d = in_buf + 64;
    EXPECT_REJECTED(&p, TK_ERROR_OVERLAP, "'p->a'");
    p = ok; p.d = in_buf + 1024 + 100;
    EXPECT_REJECTED(&p, TK_ERROR_OVERLAP, "'p->b'");
    p = ok; p.bias = out_buf + 16;
    EXPECT_REJECTED(&p, TK_ERROR_OVERLAP, "'p->bias'");
    /* C shifted by one element from D, and C at D's address with another leading dimension. */
    p = ok; p.beta = 1.0f; p.c = out_buf + 2; p.ldc = 8;
    EXPECT_REJECTED(&p, TK_ERROR_OVERLAP, "'p->c'");
    p = ok; p.beta = 1.0f; p.c = out_buf; p.ldc = 16;
    EXPECT_REJECTED(&p, TK_ERROR_OVERLAP, "'p->c'");
    /* Extents past int64. */
    p = ok; p.m = INT64_MAX / 4; p.ldd = 64;
    EXPECT_REJECTED(&p, TK_ERROR_INVALID_VALUE, "overflows");
}

Test(gemm_args, no_device_is_reported) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; this test covers machines without one");
    tk_gemm_params p = host_params();
    p.beta = 1.0f; /* C aliasing D exactly is valid */
    p.c = out_buf;
    p.ldc = 8;
    reset_buffers();
    TK_EXPECT_STATUS(tk_gemm(&p, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    TK_EXPECT_STATUS(tk_gemm_supported(&p, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
}

Test(gemm_args, force_variant_names) {
    for (int v = 0; v < VARIANT_COUNT; v++)
        TK_EXPECT_STATUS(tk_experimental_force_variant("gemm", VARIANTS[v]), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("gemm", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("gemm", "cublas"), TK_ERROR_INVALID_VALUE,
                     "\"wgmma_128x256\", \"mma_128x256\", \"mma_128x128\", \"mma_unaligned\"");
}

/* ------------------------------------------------------------------------ GPU checks ---- */

/* One epilogue configuration, applied to every shape. Together they cover every activation,
 * every output dtype, alpha != 1, beta of both signs, bias, and C aliasing D. */
typedef struct epilogue {
    tk_activation act;
    int out;        /* 0: the input dtype, 1: TK_F32, 2: the other 16-bit dtype */
    float alpha, beta;
    bool bias;
    bool alias;     /* C is D (same pointer and leading dimension) */
} epilogue;

static const epilogue EPILOGUES[] = {
    {TK_ACT_NONE, 0, 1.0f, 0.0f, false, false},
    {TK_ACT_GELU_ERF, 1, 0.5f, 0.0f, true, false},
    {TK_ACT_GELU_ERF, 2, 1.0f, 0.0f, true, false}, /* 16-bit output: the fast Phi */
    {TK_ACT_GELU_TANH, 0, 1.0f, 1.0f, true, false},
    {TK_ACT_QUICK_GELU, 2, -1.25f, 0.5f, false, true},
    {TK_ACT_SILU, 1, 0.75f, -2.0f, true, true},
    {TK_ACT_RELU, 0, 2.0f, 0.0f, true, false},
    {TK_ACT_RELU_SQUARED, 2, 0.25f, 1.0f, false, false},
};

typedef struct gemm_shape {
    int64_t m, n, k;
    int64_t pad;  /* extra elements at the end of every row of A, B, C and D */
    int offset;   /* elements by which every pointer is shifted (1: not 16-byte aligned) */
    bool all_combos; /* every input dtype x B layout; else bf16 NK and f16 KN only */
} gemm_shape;

typedef struct device_facts {
    int sm_count;
    bool big_smem;
    bool wgmma; /* a cc 9.0 device and a build with sm_90a code (TK_COMPILED_ARCHS has "90a") */
} device_facts;

static device_facts device_facts_now(void) {
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    return (device_facts){info.sm_count, info.max_smem_per_block >= BIG_TILE_SMEM,
                          info.compute_capability == 900 && tk_build_has_arch("90a") &&
                              info.max_smem_per_block >= WGMMA_SMEM};
}

/* What each variant claims (tk_gemm's documentation), so that a wrong claim fails too. */
static bool variant_claims(int v, const tk_gemm_params *p, const device_facts *dev) {
    const bool fast = ((uintptr_t)p->a % 16 == 0) && ((uintptr_t)p->b % 16 == 0) &&
                      p->lda % 8 == 0 && p->ldb % 8 == 0;
    const int64_t big_tiles = ((p->m + BIG_TILE_M - 1) / BIG_TILE_M) * ((p->n + BIG_TILE_N - 1) / BIG_TILE_N);
    if (v == WGMMA_128x256)
        return fast && dev->wgmma && p->b_layout == TK_GEMM_B_NK;
    if (v == MMA_128x256)
        return fast && dev->big_smem && big_tiles >= dev->sm_count;
    if (v == MMA_128x128)
        return fast;
    return true;
}

typedef struct run_counts {
    int runs[VARIANT_COUNT];
} run_counts;

/* One shape, input dtype and B layout: random A and B, the fp64 product once, then every
 * epilogue through every variant that claims the call (and a check that the others refuse it). */
static void run_gemm_case(const gemm_shape *s, tk_dtype in, tk_gemm_b_layout layout, tk_rng *rng,
                          const device_facts *dev, run_counts *counts) {
    const int64_t m = s->m, n = s->n, k = s->k, off = s->offset;
    const bool kn = layout == TK_GEMM_B_KN;
    const int64_t lda = k + s->pad, ldb = (kn ? n : k) + s->pad, b_rows = kn ? k : n;
    const int64_t ldd = n + s->pad;
    const size_t in_es = tk_test_dtype_size(in);
    const size_t a_bytes = (size_t)(m * lda + off) * in_es, b_bytes = (size_t)(b_rows * ldb + off) * in_es;

    unsigned char *ha = malloc(a_bytes), *hb = malloc(b_bytes);
    double *product = malloc((size_t)(m * n) * sizeof(double));
    double *ref = malloc((size_t)(m * n) * sizeof(double));
    cr_assert(ha && hb && product && ref);
    tk_fill_uniform(rng, in, ha, m * lda + off, -1.0, 1.0);
    tk_fill_uniform(rng, in, hb, b_rows * ldb + off, -1.0, 1.0);
    ref_gemm_product(in, layout, ha + off * in_es, lda, hb + off * in_es, ldb, m, n, k, product);
    unsigned char *da = tk_dev_alloc(a_bytes), *db = tk_dev_alloc(b_bytes);
    tk_to_dev(da, ha, a_bytes);
    tk_to_dev(db, hb, b_bytes);

    for (size_t e = 0; e < sizeof EPILOGUES / sizeof EPILOGUES[0]; e++) {
        const epilogue *ep = &EPILOGUES[e];
        const tk_dtype out = ep->out == 0 ? in : ep->out == 1 ? TK_F32 : (in == TK_F16 ? TK_BF16 : TK_F16);
        const size_t es = tk_test_dtype_size(out);
        const int64_t ldc = ep->alias ? ldd : ldd + 8;
        const int64_t d_elems = m * ldd + off, c_elems = m * ldc + off;
        unsigned char *hc = malloc((size_t)c_elems * es), *hbias = malloc((size_t)(n + off) * es);
        unsigned char *hd = malloc((size_t)d_elems * es), *dense = malloc((size_t)(m * n) * es);
        cr_assert(hc && hbias && hd && dense);
        tk_fill_uniform(rng, out, hc, c_elems, -1.0, 1.0);
        tk_fill_uniform(rng, out, hbias, n + off, -1.0, 1.0);
        unsigned char *dd = tk_dev_alloc((size_t)d_elems * es);
        unsigned char *dc = ep->alias ? dd : tk_dev_alloc((size_t)c_elems * es);
        unsigned char *dbias = tk_dev_alloc((size_t)(n + off) * es);
        if (!ep->alias)
            tk_to_dev(dc, hc, (size_t)c_elems * es);
        tk_to_dev(dbias, hbias, (size_t)(n + off) * es);

        tk_gemm_params p = TK_GEMM_PARAMS_INIT;
        p.m = m; p.n = n; p.k = k;
        p.input_dtype = in; p.output_dtype = out; p.b_layout = layout;
        p.a = da + off * in_es; p.lda = lda;
        p.b = db + off * in_es; p.ldb = ldb;
        p.c = ep->beta != 0.0f ? dc + off * es : NULL; p.ldc = ldc;
        p.bias = ep->bias ? dbias + off * es : NULL;
        p.d = dd + off * es; p.ldd = ldd;
        p.activation = ep->act; p.alpha = ep->alpha; p.beta = ep->beta;
        ref_gemm_epilogue(&p, product, hc + off * es, ep->bias ? hbias + off * es : NULL, ref);
        /* Errors: f32 accumulation over k terms of size ~1/3 grows like sqrt(k), and D is
         * rounded once; judged against the scale of the output, |alpha| sqrt(k) + |beta| + 1. */
        const double scale = fabs(ep->alpha) * sqrt((double)k) + fabs(ep->beta) + 1.0;

        char what[320];
        const char *expected_auto = NULL;
        for (int v = 0; v < VARIANT_COUNT && !expected_auto; v++)
            if (variant_claims(v, &p, dev))
                expected_auto = VARIANTS[v];
        const char *auto_name = NULL;
        cr_assert_eq(tk_experimental_force_variant("gemm", NULL), TK_SUCCESS);
        cr_assert_eq(tk_gemm_supported(&p, &auto_name), TK_SUCCESS, "%s", tk_last_error());
        cr_assert_str_eq(auto_name, expected_auto, "%lldx%lldx%lld: automatic choice %s, expected %s",
                         (long long)m, (long long)n, (long long)k, auto_name, expected_auto);

        for (int v = 0; v < VARIANT_COUNT; v++) {
            snprintf(what, sizeof what,
                     "m %lld n %lld k %lld pad %lld offset %d in %s %s out %s act %d alpha %g beta %g "
                     "bias %d alias %d variant %s",
                     (long long)m, (long long)n, (long long)k, (long long)s->pad, s->offset,
                     tk_test_dtype_name(in), kn ? "KN" : "NK", tk_test_dtype_name(out), (int)ep->act,
                     (double)ep->alpha, (double)ep->beta, ep->bias, ep->alias, VARIANTS[v]);
            cr_assert_eq(tk_experimental_force_variant("gemm", VARIANTS[v]), TK_SUCCESS);
            const char *name = NULL;
            const tk_status claim = tk_gemm_supported(&p, &name);
            if (!variant_claims(v, &p, dev)) {
                cr_assert_eq(claim, TK_ERROR_NOT_SUPPORTED, "%s: claimed a call it should refuse", what);
                cr_assert_eq(tk_gemm(&p, NULL), TK_ERROR_NOT_SUPPORTED, "%s: ran a call it should refuse", what);
                continue;
            }
            cr_assert_eq(claim, TK_SUCCESS, "%s: %s", what, tk_last_error());
            cr_assert_str_eq(name, VARIANTS[v], "%s: tk_gemm_supported named %s", what, name);

            if (ep->alias)
                tk_to_dev(dd, hc, (size_t)d_elems * es); /* C lives in D: ldc == ldd */
            else
                tk_dev_poison(dd, (size_t)d_elems * es);
            cr_assert_eq(tk_gemm(&p, NULL), TK_SUCCESS, "%s: %s", what, tk_last_error());
            cr_assert_str_eq(tk_last_variant(), VARIANTS[v], "%s ran %s", what, tk_last_variant());
            tk_dev_sync();
            tk_to_host(hd, dd, (size_t)d_elems * es);
            for (int64_t i = 0; i < m; i++)
                memcpy(dense + (size_t)(i * n) * es, hd + (size_t)(off + i * ldd) * es, (size_t)n * es);
            TK_ASSERT_CLOSE(out, dense, ref, m * n, tk_default_rtol(out), scale, what);
            /* Nothing written outside D: the row padding and the elements before the offset keep
             * their poison (or, aliased, the values of C). */
            for (int64_t x = 0; x < d_elems; x++) {
                const int64_t col = (x - off) % ldd;
                if (x >= off && col < n)
                    continue;
                const double got = tk_test_load(out, hd, x);
                if (ep->alias)
                    cr_assert(got == tk_test_load(out, hc, x), "%s: wrote element %lld outside D", what, (long long)x);
                else
                    cr_assert(isnan(got), "%s: wrote element %lld outside D", what, (long long)x);
            }
            counts->runs[v]++;
        }
        cr_assert_eq(tk_experimental_force_variant("gemm", NULL), TK_SUCCESS);
        tk_dev_free(dd);
        if (!ep->alias)
            tk_dev_free(dc);
        tk_dev_free(dbias);
        free(hc); free(hbias); free(hd); free(dense);
    }
    tk_dev_free(da);
    tk_dev_free(db);
    free(ha); free(hb); free(product); free(ref);
}

static void run_shapes(const gemm_shape *shapes, size_t count, uint64_t seed, run_counts *counts) {
    const device_facts dev = device_facts_now();
    tk_rng rng = tk_rng_seeded(seed);
    for (size_t s = 0; s < count; s++) {
        run_gemm_case(&shapes[s], TK_BF16, TK_GEMM_B_NK, &rng, &dev, counts);
        run_gemm_case(&shapes[s], TK_F16, TK_GEMM_B_KN, &rng, &dev, counts);
        if (shapes[s].all_combos) {
            run_gemm_case(&shapes[s], TK_BF16, TK_GEMM_B_KN, &rng, &dev, counts);
            run_gemm_case(&shapes[s], TK_F16, TK_GEMM_B_NK, &rng, &dev, counts);
        }
    }
}

/* The sizes of the issue (1, 17, 64, 129, 1000 in every position), odd and padded leading
 * dimensions, and pointers one element off 16-byte alignment. */
Test(gemm_gpu, small_and_odd_shapes_every_variant, .timeout = 600) {
    TK_REQUIRE_GPU();
    static const gemm_shape shapes[] = {
        {1, 1, 1, 0, 0, true},        {17, 17, 17, 0, 0, true},    {17, 17, 17, 7, 0, true},
        {64, 64, 64, 0, 0, true},     {129, 129, 129, 7, 0, true}, {129, 64, 1000, 0, 1, true},
        {1000, 129, 17, 7, 0, true},  {64, 1000, 129, 7, 0, true}, {1, 1000, 64, 0, 0, true},
        {1000, 1, 1000, 0, 0, true},  {17, 129, 64, 8, 1, true},   {129, 17, 1, 0, 0, true},
    };
    run_counts counts = {{0}};
    run_shapes(shapes, sizeof shapes / sizeof shapes[0], 21, &counts);
    cr_assert(counts.runs[MMA_128x128] > 0 && counts.runs[MMA_UNALIGNED] > 0,
              "mma_128x128 ran %d cases, mma_unaligned %d", counts.runs[MMA_128x128],
              counts.runs[MMA_UNALIGNED]);
    if (device_facts_now().wgmma)
        cr_assert(counts.runs[WGMMA_128x256] > 0, "wgmma_128x256 never ran");
}

/* 1000^3, and a shape wide enough that "mma_128x256" claims it on this device (at least one
 * wave of 128x256 tiles), with edges in M, N (one column past a tile: element stores) and K.
 * The third gives each block of the persistent "wgmma_128x256" several tiles per consumer
 * warpgroup with 6 K steps over 5 stages, so a warpgroup's ring position wraps in the middle of
 * a tile and its skip over the other warpgroup's tile flips the stage phase. The last two give
 * "mma_128x256" (3 stages, 2 K steps copied ahead) exactly as many K steps as it copies ahead,
 * and fewer (one, partial): its prologue then zero-fills stages that no K step reads. */
Test(gemm_gpu, large_shapes_every_variant, .timeout = 600) {
    TK_REQUIRE_GPU();
    const device_facts dev = device_facts_now();
    const int64_t wide_n = BIG_TILE_N * ((dev.sm_count + 7) / 8) + 1; /* 8 tile rows of M = 1000 */
    const gemm_shape shapes[] = {
        {1000, 1000, 1000, 0, 0, false},
        {1000, wide_n, 129, 7, 0, false},
        {2048, wide_n, 321, 0, 0, false},
        {1000, wide_n, 128, 0, 0, false},
        {1000, wide_n, 40, 0, 0, false},
    };
    run_counts counts = {{0}};
    run_shapes(shapes, sizeof shapes / sizeof shapes[0], 22, &counts);
    if (dev.big_smem)
        cr_assert(counts.runs[MMA_128x256] > 0, "mma_128x256 never ran");
    if (dev.wgmma)
        cr_assert(counts.runs[WGMMA_128x256] > 0, "wgmma_128x256 never ran");
    cr_assert(counts.runs[MMA_128x128] > 0 && counts.runs[MMA_UNALIGNED] > 0);
}

/* ------------------------------------------------------------- in place (GPU) ---- */

/* The in-place mode the header allows (c == d, ldc == ldd), bit for bit against the same call
 * with C and D apart, every variant that takes the call (mma_128x256 needs a wave of tiles). */
Test(gemm_gpu, in_place_matches_out_of_place, .timeout = 300) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(36);
    const tk_dtype out_dtypes[] = {TK_BF16, TK_F32};
    const int64_t shapes[][3] = {{300, 520, 128}, {2048, 4096, 64}};
    for (size_t s = 0; s < 2; s++)
        for (size_t o = 0; o < 2; o++)
            for (int v = 0; v < VARIANT_COUNT; v++) {
                const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                const size_t es = tk_test_dtype_size(out_dtypes[o]);
                const size_t a_bytes = (size_t)(m * k) * 2, b_bytes = (size_t)(n * k) * 2, d_bytes = (size_t)(m * n) * es;
                unsigned char *ha = malloc(a_bytes), *hb = malloc(b_bytes), *hc = malloc(d_bytes), *hbias = malloc((size_t)n * es);
                unsigned char *want = malloc(d_bytes);
                cr_assert(ha && hb && hc && hbias && want);
                tk_fill_uniform(&rng, TK_BF16, ha, m * k, -1.0, 1.0);
                tk_fill_uniform(&rng, TK_BF16, hb, n * k, -1.0, 1.0);
                tk_fill_uniform(&rng, out_dtypes[o], hc, m * n, -2.0, 2.0);
                tk_fill_uniform(&rng, out_dtypes[o], hbias, n, -1.0, 1.0);
                unsigned char *da = tk_dev_alloc(a_bytes), *db = tk_dev_alloc(b_bytes), *dc = tk_dev_alloc(d_bytes);
                unsigned char *dd = tk_dev_alloc(d_bytes), *dbias = tk_dev_alloc((size_t)n * es);
                tk_to_dev(da, ha, a_bytes);
                tk_to_dev(db, hb, b_bytes);
                tk_to_dev(dc, hc, d_bytes);
                tk_to_dev(dbias, hbias, (size_t)n * es);
                tk_dev_poison(dd, d_bytes);
                tk_gemm_params p = TK_GEMM_PARAMS_INIT;
                p.m = m, p.n = n, p.k = k;
                p.input_dtype = TK_BF16, p.output_dtype = out_dtypes[o], p.b_layout = TK_GEMM_B_NK;
                p.a = da, p.lda = k, p.b = db, p.ldb = k, p.c = dc, p.ldc = n, p.bias = dbias, p.d = dd, p.ldd = n;
                p.activation = TK_ACT_GELU_TANH, p.alpha = 0.75f, p.beta = 0.5f;
                char what[128];
                snprintf(what, sizeof what, "%lldx%lldx%lld out %s variant %s", (long long)m, (long long)n, (long long)k,
                         tk_test_dtype_name(out_dtypes[o]), VARIANTS[v]);
                cr_assert_eq(tk_experimental_force_variant("gemm", VARIANTS[v]), TK_SUCCESS);
                tk_status st = tk_gemm(&p, NULL);
                if (st != TK_ERROR_NOT_SUPPORTED) { /* variants that do not take the call are skipped */
                    cr_assert_eq(st, TK_SUCCESS, "%s: %s", what, tk_last_error());
                    tk_dev_sync();
                    tk_to_host(want, dd, d_bytes);
                    p.d = dc; /* D over C */
                    cr_assert_eq(tk_gemm(&p, NULL), TK_SUCCESS, "%s: %s", what, tk_last_error());
                    cr_assert_str_eq(tk_last_variant(), VARIANTS[v], "%s ran %s", what, tk_last_variant());
                    tk_dev_sync();
                    tk_assert_dev_bytes_equal(dc, want, d_bytes, what);
                }
                cr_assert_eq(tk_experimental_force_variant("gemm", NULL), TK_SUCCESS);
                tk_dev_free(da); tk_dev_free(db); tk_dev_free(dc); tk_dev_free(dd); tk_dev_free(dbias);
                free(ha); free(hb); free(hc); free(hbias); free(want);
            }
}
