/* Randomized sweeps on the GPU: per family, a few hundred random valid calls (sizes including 1
 * and odd widths, padded row strides, pointers off 16-byte alignment, every dtype and option),
 * each against the fp64 reference with the tolerance of the family's own test, outputs poisoned
 * before the call and positions outside them checked untouched. Each case forces one variant in
 * turn (or none: the automatic choice); where the forced variant declines the case it runs with
 * the automatic choice instead, and every variant must have run some cases.
 * TKERN_TEST_SEED=<n> sets the base seed (failure messages print it with the case number, so a
 * failure replays); TKERN_TEST_UNDER_SANITIZER=1 runs about a tenth of the cases. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/activation_ref.h"
#include "ref/attention_bwd_ref.h"
#include "ref/attention_ref.h"
#include "ref/gemm_ref.h"
#include "ref/norm_ref.h"
#include "ref/rope_ref.h"
#include "ref/softmax_ref.h"

#define DEFAULT_SEED 20261204u
#define MAX_VARIANTS 8

static const tk_dtype DTYPES[] = {TK_F32, TK_F16, TK_BF16};

/* ------------------------------------------------------------------------ sweep state ---- */

typedef struct sweep {
    const char *op;                 /* tk_experimental_force_variant's op */
    const char *const *variants;
    int variant_count;
    uint64_t seed;                  /* base seed, TKERN_TEST_SEED or DEFAULT_SEED */
    int index;                      /* the current case */
    int ran[MAX_VARIANTS];          /* cases each variant ran forced */
    char what[640];                 /* the current case: seed, number, parameters */
} sweep;

typedef void (*case_fn)(sweep *s, tk_rng *rng, bool backward);

static uint64_t base_seed(void) {
    const char *env = getenv("TKERN_TEST_SEED");
    return env && *env ? strtoull(env, NULL, 0) : DEFAULT_SEED;
}

static int case_count(int full) {
    const char *env = getenv("TKERN_TEST_UNDER_SANITIZER");
    return env && strcmp(env, "1") == 0 ? (full + 9) / 10 : full;
}

static void describe(sweep *s, const char *fmt, ...) {
    int n = snprintf(s->what, sizeof s->what, "TKERN_TEST_SEED=%llu case %d: ",
                     (unsigned long long)s->seed, s->index);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->what + n, sizeof s->what - (size_t)n, fmt, ap);
    va_end(ap);
}

/* The variant case i forces: each in turn, then none. */
static const char *case_variant(const sweep *s) {
    const int v = s->index % (s->variant_count + 1);
    return v < s->variant_count ? s->variants[v] : NULL;
}

static bool is_variant(const char *variant, const char *name) {
    return variant != NULL && strcmp(variant, name) == 0;
}

/* Records that `variant` (NULL: the automatic choice) ran the current case. */
static void count_run(sweep *s, const char *variant) {
    cr_assert(variant == NULL || strcmp(tk_last_variant(), variant) == 0, "%s: ran %s, forced %s",
              s->what, tk_last_variant(), variant);
    for (int v = 0; v < s->variant_count && variant; v++)
        if (strcmp(variant, s->variants[v]) == 0)
            s->ran[v]++;
}

/* Runs `call` with `variant` forced; where that variant declines (TK_ERROR_NOT_SUPPORTED, or
 * TK_ERROR_ARCH_NOT_SUPPORTED where the build has no code for it on this device), sets variant
 * to NULL and runs the call with the automatic choice. A declined call writes nothing, so the
 * outputs are still poisoned for the second try. */
#define SWEEP_CALL(s, variant, call)                                                             \
    do {                                                                                         \
        cr_assert_eq(tk_experimental_force_variant((s)->op, (variant)), TK_SUCCESS);             \
        tk_status st_ = (call);                                                                  \
        if (TK_STATUS_GROUP(st_) == 2 && (variant) != NULL) {                                    \
            (variant) = NULL;                                                                    \
            cr_assert_eq(tk_experimental_force_variant((s)->op, NULL), TK_SUCCESS);              \
            st_ = (call);                                                                        \
        }                                                                                        \
        cr_assert_eq(st_, TK_SUCCESS, "%s: %s", (s)->what, tk_last_error());                    \
        count_run((s), (variant));                                                               \
        cr_assert_eq(tk_experimental_force_variant((s)->op, NULL), TK_SUCCESS);                  \
    } while (0)

/* Runs `full` cases (a tenth under the sanitizer), each from its own generator, then requires
 * every variant outside `optional` (a bit per variant) to have run at least one case. */
static void run_sweep(const char *op, const char *const *variants, int variant_count, uint64_t salt,
                      int full, case_fn fn, bool backward, unsigned optional) {
    sweep s = {op, variants, variant_count, base_seed(), 0, {0}, ""};
    const int cases = case_count(full);
    for (s.index = 0; s.index < cases; s.index++) {
        tk_rng rng = tk_rng_seeded(s.seed + (salt << 40) + (uint64_t)s.index);
        fn(&s, &rng, backward);
    }
    for (int v = 0; v < variant_count; v++)
        cr_assert((optional >> v & 1u) || s.ran[v] > 0,
                  "%s: variant %s ran none of %d cases (TKERN_TEST_SEED=%llu)", op, variants[v],
                  cases, (unsigned long long)s.seed);
}

#define COUNT(array) ((int)(sizeof(array) / sizeof((array)[0])))
#define SWEEP_CASES 300

/* The forward and backward sweeps of a family (seeds salt and salt + 1), forcing the variants
 * of op and of op "_bwd", with the variants (bit masks) that need not run in each. */
#define SWEEP_TESTS(name, op, variants, bwd_variants, salt, fn, optional_fwd, optional_bwd)      \
    Test(sweep_gpu, name##_fwd, .timeout = 300) {                                                \
        TK_REQUIRE_GPU();                                                                        \
        run_sweep(op, variants, COUNT(variants), salt, SWEEP_CASES, fn, false, optional_fwd);    \
    }                                                                                            \
    Test(sweep_gpu, name##_bwd, .timeout = 300) {                                                \
        TK_REQUIRE_GPU();                                                                        \
        run_sweep(op "_bwd", bwd_variants, COUNT(bwd_variants), (salt) + 1, SWEEP_CASES, fn, true, \
                  optional_bwd);                                                                 \
    }

/* ------------------------------------------------------------------- random choices ---- */

static int64_t irand(tk_rng *r, int64_t lo, int64_t hi) {
    const int64_t v = lo + (int64_t)floor(tk_rng_uniform(r, 0.0, (double)(hi - lo + 1)));
    return v > hi ? hi : v;
}

static bool chance(tk_rng *r, double p) { return tk_rng_uniform(r, 0.0, 1.0) < p; }

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* A width in 1..max: tiny, a multiple of 8 (whole 16-byte packs), or anything (odd). */
static int64_t width(tk_rng *r, int64_t max) {
    const double u = tk_rng_uniform(r, 0.0, 1.0);
    if (u < 0.15)
        return irand(r, 1, max < 8 ? max : 8);
    if (u < 0.5 && max >= 8)
        return 8 * irand(r, 1, max / 8);
    return irand(r, 1, max);
}

/* Extra elements at the end of a row: none, whole 16-byte packs, or an odd number. */
static int64_t row_pad(tk_rng *r) {
    const double u = tk_rng_uniform(r, 0.0, 1.0);
    return u < 0.5 ? 0 : u < 0.75 ? 8 * irand(r, 1, 3) : irand(r, 1, 9);
}

/* Elements by which a tensor starts into its allocation: 0, or 1..7 (off 16-byte alignment;
 * 2 bytes for a 16-bit dtype at 1). */
static int64_t misalign(tk_rng *r) { return chance(r, 0.3) ? irand(r, 1, 7) : 0; }

static tk_dtype any_dtype(tk_rng *r) { return DTYPES[irand(r, 0, 2)]; }

/* ------------------------------------------------------------ buffers and comparison ---- */

/* A tensor's allocation on the host (the inputs, or the original contents) and the device,
 * and a host copy of what the device holds after the call. Every allocation has 8 elements
 * past the end so that a write past the tensor shows. */
typedef struct buf {
    tk_dtype dtype;
    int64_t n;
    size_t bytes;
    unsigned char *host, *got, *dev;
} buf;

static buf buf_new(tk_dtype dtype, int64_t n) {
    buf b = {dtype, n + 8, 0, NULL, NULL, NULL};
    b.bytes = (size_t)b.n * tk_test_dtype_size(dtype);
    b.host = malloc(b.bytes);
    b.got = malloc(b.bytes);
    cr_assert(b.host && b.got);
    memset(b.host, 0xff, b.bytes);
    b.dev = tk_dev_alloc(b.bytes);
    return b;
}

/* Random inputs in [lo, hi), copied to the device. */
static void buf_input(buf *b, tk_rng *r, double lo, double hi) {
    tk_fill_uniform(r, b->dtype, b->host, b->n, lo, hi);
    tk_to_dev(b->dev, b->host, b->bytes);
}

/* An output: poisoned on the device (the host copy stays 0xff, the same NaN bytes). */
static void buf_output(buf *b) { tk_dev_poison(b->dev, b->bytes); }

static void buf_fetch(buf *b) { tk_to_host(b->got, b->dev, b->bytes); }

static void *buf_at(const buf *b, int64_t i) { return b->dev + (size_t)i * tk_test_dtype_size(b->dtype); }

static double buf_val(const buf *b, int64_t i) { return tk_test_load(b->dtype, b->host, i); }

static void *dev_copy(const void *host, size_t bytes) {
    void *d = tk_dev_alloc(bytes);
    tk_to_dev(d, host, bytes);
    return d;
}

static void buf_free(buf *b) {
    free(b->host);
    free(b->got);
    tk_dev_free(b->dev);
}

/* A reference for every element of b: NaN marks a position outside the output, which must
 * keep b's original bytes (poison, or an in-place input). */
static double *expect_new(const buf *b) {
    double *e = malloc((size_t)b->n * sizeof(double));
    cr_assert(e != NULL);
    for (int64_t i = 0; i < b->n; i++)
        e[i] = NAN;
    return e;
}

/* Checks b->got (fetched) against `expect`: outside positions bit-equal to b->host, infinities
 * exactly, the rest within rtol * (atol + |reference|) plus the dtype's subnormal rounding. */
static void check_buf(const sweep *s, const char *name, const buf *b, const double *expect, double rtol,
                      double atol) {
    const size_t es = tk_test_dtype_size(b->dtype);
    for (int64_t i = 0; i < b->n; i++) {
        const double e = expect[i], g = tk_test_load(b->dtype, b->got, i);
        if (isnan(e))
            cr_assert(memcmp(b->got + (size_t)i * es, b->host + (size_t)i * es, es) == 0,
                      "%s: %s: wrote position %lld outside the output (now %g)", s->what, name, (long long)i, g);
        else if (isinf(e))
            cr_assert(g == e, "%s: %s: position %lld got %.9g, expected %g", s->what, name, (long long)i, g, e);
        else
            cr_assert(fabs(g - e) <= rtol * (atol + fabs(e)) + tk_subnormal_half_step(b->dtype),
                      "%s: %s: position %lld got %.9g, reference %.9g", s->what, name, (long long)i, g, e);
    }
}

/* Dense doubles of a strided [rows, cols] tensor of b starting at element `start`. */
static double *gather(const buf *b, int64_t start, int64_t rows, int64_t cols, int64_t stride) {
    double *d = malloc((size_t)(rows * cols) * sizeof(double) + 1);
    cr_assert(d != NULL);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            d[r * cols + c] = buf_val(b, start + r * stride + c);
    return d;
}

/* Writes a dense [rows, cols] result into expect at its strided positions. */
static void scatter(double *expect, const double *dense, int64_t start, int64_t rows, int64_t cols,
                    int64_t stride) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            expect[start + r * stride + c] = dense[r * cols + c];
}

/* ------------------------------------------------------------------------ activation ---- */

/* The variants of activation, glu and rope. */
static const char *const VEC16_SCALAR[] = {"vec16", "scalar"};

static void activation_case(sweep *s, tk_rng *r, bool backward) {
    const char *variant = case_variant(s);
    const tk_dtype dtype = any_dtype(r);
    const bool gelu_api = chance(r, 0.15); /* tk_gelu_fwd / tk_gelu_bwd */
    const tk_activation kind = gelu_api ? (chance(r, 0.5) ? TK_ACT_GELU_ERF : TK_ACT_GELU_TANH)
                                        : (tk_activation)irand(r, TK_ACT_NONE, TK_ACT_RELU_SQUARED);
    const int64_t rows = gelu_api || chance(r, 0.3) ? 1 : irand(r, 1, 64);
    int64_t cols = width(r, 3000), off = misalign(r);
    const bool bias = !gelu_api && chance(r, 0.5);
    /* forward: y over x; backward: 1 = dx over dy, 2 = dx over x */
    const int in_place = chance(r, 0.25) ? (backward ? (int)irand(r, 1, 2) : 1) : 0;
    if (is_variant(variant, "vec16")) { /* aligned, and whole packs of bias */
        off = 0;
        cols = round_up(cols, 8);
    }
    describe(s, "activation %s%s kind %d %s %lldx%lld bias %d in_place %d offset %lld forced %s",
             gelu_api ? "gelu api " : "", backward ? "bwd" : "fwd", (int)kind, tk_test_dtype_name(dtype),
             (long long)rows, (long long)cols, bias, in_place, (long long)off, variant ? variant : "none");
    const int64_t n = rows * cols;
    buf x = buf_new(dtype, off + n), dy = buf_new(dtype, off + n), b = buf_new(dtype, off + cols);
    buf y = buf_new(dtype, off + n);
    buf_input(&x, r, -5.0, 5.0);
    buf_input(&dy, r, -2.0, 2.0);
    buf_input(&b, r, -1.0, 1.0);
    buf_output(&y);
    buf *out = in_place == 0 ? &y : (backward && in_place == 1) ? &dy : &x;
    double *expect = expect_new(out);
    for (int64_t i = 0; i < n; i++) {
        const double v = buf_val(&x, off + i) + (bias ? buf_val(&b, off + i % cols) : 0.0);
        expect[off + i] = backward ? buf_val(&dy, off + i) * ref_activation_grad(kind, v) : ref_activation(kind, v);
    }
    void *xp = buf_at(&x, off), *dyp = buf_at(&dy, off), *bp = bias ? buf_at(&b, off) : NULL, *op = buf_at(out, off);
    const tk_gelu_approximation approx = kind == TK_ACT_GELU_ERF ? TK_GELU_EXACT : TK_GELU_TANH;
    SWEEP_CALL(s, variant,
               backward ? (gelu_api ? tk_gelu_bwd(approx, dtype, dyp, xp, op, cols, NULL)
                                    : tk_activation_bwd(kind, dtype, dyp, xp, bp, op, rows, cols, NULL))
                        : (gelu_api ? tk_gelu_fwd(approx, dtype, xp, op, cols, NULL)
                                    : tk_activation_fwd(kind, dtype, xp, bp, op, rows, cols, NULL)));
    tk_dev_sync();
    buf_fetch(out);
    check_buf(s, backward ? "dx" : "y", out, expect, tk_default_rtol(dtype), 1.0);
    free(expect);
    buf_free(&x); buf_free(&dy); buf_free(&b); buf_free(&y);
}

SWEEP_TESTS(activation, "activation", VEC16_SCALAR, VEC16_SCALAR, 1, activation_case, 0u, 0u)

/* ------------------------------------------------------------------------------- GLU ---- */

static void glu_case(sweep *s, tk_rng *r, bool backward) {
    const char *variant = case_variant(s);
    tk_glu_params p = TK_GLU_PARAMS_INIT;
    p.kind = (tk_glu)irand(r, TK_GLU_SWIGLU, TK_GLU_SWIGLU_CLAMPED);
    p.dtype = any_dtype(r);
    p.layout = (tk_glu_layout)irand(r, TK_GLU_GATE_FIRST, TK_GLU_INTERLEAVED);
    p.rows = chance(r, 0.3) ? 1 : irand(r, 1, 48);
    p.d = width(r, 1500);
    int64_t x_pad = row_pad(r), y_pad = row_pad(r), off = misalign(r);
    if (is_variant(variant, "vec16")) {
        p.d = round_up(p.d, 8);
        x_pad = round_up(x_pad, 8);
        y_pad = round_up(y_pad, 8);
        off = 0;
    }
    /* In place: forward y over x with the gate first (each thread overwrites only the gate
     * values it has read); backward dx over x, any layout. */
    const bool in_place = chance(r, 0.2) && (backward || p.layout == TK_GLU_GATE_FIRST);
    const int64_t xs = 2 * p.d + x_pad, ys = in_place && !backward ? xs : p.d + y_pad;
    p.x_row_stride = x_pad == 0 && !in_place && chance(r, 0.5) ? 0 : xs; /* 0: dense */
    p.y_row_stride = y_pad == 0 && !in_place && chance(r, 0.5) ? 0 : ys;
    describe(s, "glu %s kind %d %s layout %d rows %lld d %lld strides %lld/%lld in_place %d offset %lld forced %s",
             backward ? "bwd" : "fwd", (int)p.kind, tk_test_dtype_name(p.dtype), (int)p.layout, (long long)p.rows,
             (long long)p.d, (long long)p.x_row_stride, (long long)p.y_row_stride, in_place, (long long)off,
             variant ? variant : "none");
    buf x = buf_new(p.dtype, off + p.rows * xs), dy = buf_new(p.dtype, off + p.rows * ys);
    buf out_buf = buf_new(p.dtype, off + p.rows * (backward ? xs : ys));
    buf_input(&x, r, -9.0, 9.0); /* past the clamp limit of 7 */
    buf_input(&dy, r, -2.0, 2.0);
    buf_output(&out_buf);
    buf *out = in_place ? &x : &out_buf;
    double *expect = expect_new(out);
    for (int64_t row = 0; row < p.rows; row++)
        for (int64_t j = 0; j < p.d; j++) {
            const int64_t gi = p.layout == TK_GLU_INTERLEAVED ? 2 * j : p.layout == TK_GLU_GATE_FIRST ? j : p.d + j;
            const int64_t ui = p.layout == TK_GLU_INTERLEAVED ? 2 * j + 1 : p.layout == TK_GLU_GATE_FIRST ? p.d + j : j;
            const int64_t xrow = off + row * xs;
            const double g = buf_val(&x, xrow + gi), u = buf_val(&x, xrow + ui);
            if (backward) {
                double dg, du;
                ref_glu_grad(&p, g, u, buf_val(&dy, off + row * ys + j), &dg, &du);
                expect[xrow + gi] = dg;
                expect[xrow + ui] = du;
            } else {
                expect[off + row * ys + j] = ref_glu(&p, g, u);
            }
        }
    SWEEP_CALL(s, variant, backward ? tk_glu_bwd(&p, buf_at(&dy, off), buf_at(&x, off), buf_at(out, off), NULL)
                                    : tk_glu_fwd(&p, buf_at(&x, off), buf_at(out, off), NULL));
    tk_dev_sync();
    buf_fetch(out);
    check_buf(s, backward ? "dx" : "y", out, expect, tk_default_rtol(p.dtype), 1.0);
    free(expect);
    buf_free(&x); buf_free(&dy); buf_free(&out_buf);
}

SWEEP_TESTS(glu, "glu", VEC16_SCALAR, VEC16_SCALAR, 3, glu_case, 0u, 0u)

/* ------------------------------------------------------------------------------ norm ---- */

static const char *const NORM_VARIANTS[] = {"vec16", "wide_vec16", "scalar", "wide_scalar"};
static const struct { tk_dtype dtype, weight_dtype; } NORM_DTYPES[] = {
    {TK_F32, TK_F32}, {TK_F16, TK_F16}, {TK_F16, TK_F32}, {TK_BF16, TK_BF16}, {TK_BF16, TK_F32},
};

/* Shape, strides and misalignment of a norm case, steered towards what the forced variant
 * claims (tkern.h): vec16 16-byte rows up to 8192, wide_vec16 16-byte rows, scalar up to 4096. */
typedef struct norm_shape {
    tk_norm_params p;
    int64_t xs, rs, ys, off;
} norm_shape;

static norm_shape norm_random_shape(tk_rng *r, const char *variant, int in_place) {
    norm_shape n = {TK_NORM_PARAMS_INIT, 0, 0, 0, 0};
    const size_t d = (size_t)irand(r, 0, 4);
    n.p.dtype = NORM_DTYPES[d].dtype;
    n.p.weight_dtype = NORM_DTYPES[d].weight_dtype;
    n.p.rows = chance(r, 0.2) ? 1 : irand(r, 1, 40);
    n.p.cols = chance(r, 0.1) ? irand(r, 4097, 12000) : width(r, 4096);
    n.p.eps = chance(r, 0.5) ? 1e-5f : 1e-3f;
    n.p.gemma = chance(r, 0.25);
    int64_t x_pad = row_pad(r), r_pad = row_pad(r), y_pad = row_pad(r);
    n.off = misalign(r);
    if (is_variant(variant, "vec16") || is_variant(variant, "wide_vec16")) {
        n.p.cols = round_up(n.p.cols, 8);
        x_pad = round_up(x_pad, 8);
        r_pad = round_up(r_pad, 8);
        y_pad = round_up(y_pad, 8);
        n.off = 0;
    }
    if (is_variant(variant, "vec16") && n.p.cols > 8192)
        n.p.cols = 8192;
    if (is_variant(variant, "scalar") && n.p.cols > 4096)
        n.p.cols = width(r, 4096);
    n.xs = n.p.cols + x_pad;
    n.rs = n.p.cols + r_pad;
    n.ys = in_place == 1 ? n.xs : n.p.cols + y_pad; /* y over x, or dx over dy: equal strides */
    n.p.x_row_stride = n.xs;
    n.p.residual_row_stride = n.rs;
    n.p.y_row_stride = n.ys;
    return n;
}

static void norm_fwd_case(sweep *s, tk_rng *r, const char *variant, bool layernorm, bool weight, int in_place,
                          norm_shape n) {
    const bool residual = chance(r, 0.5), bias = layernorm && chance(r, 0.5), stats = chance(r, 0.6);
    const tk_norm_params p = n.p;
    const int64_t rows = p.rows, cols = p.cols, off = n.off;
    describe(s, "%s fwd %s/%s %lldx%lld strides %lld/%lld/%lld offset %lld res %d w %d b %d gemma %d stats %d "
             "in_place %d eps %g forced %s",
             layernorm ? "layernorm" : "rmsnorm", tk_test_dtype_name(p.dtype), tk_test_dtype_name(p.weight_dtype),
             (long long)rows, (long long)cols, (long long)n.xs, (long long)n.rs, (long long)n.ys, (long long)off,
             residual, weight, bias, p.gemma, stats, in_place, (double)p.eps, variant ? variant : "none");
    buf x = buf_new(p.dtype, off + rows * n.xs), res = buf_new(p.dtype, off + rows * n.rs);
    buf y = buf_new(p.dtype, off + rows * n.ys);
    buf w = buf_new(p.weight_dtype, off + cols), b = buf_new(p.weight_dtype, off + cols);
    buf mean = buf_new(TK_F32, rows), rstd = buf_new(TK_F32, rows);
    buf_input(&x, r, layernorm ? -1.0 : -2.0, layernorm ? 3.0 : 2.0);
    buf_input(&res, r, -1.0, 1.0);
    buf_input(&w, r, p.gemma ? -0.5 : 0.5, p.gemma ? 0.5 : 1.5);
    buf_input(&b, r, -1.0, 1.0);
    buf_output(&y);
    buf_output(&mean);
    buf_output(&rstd);
    double *X = gather(&x, off, rows, cols, n.xs), *R = gather(&res, off, rows, cols, n.rs);
    double *W = gather(&w, off, 1, cols, cols), *B = gather(&b, off, 1, cols, cols);
    double *H = malloc((size_t)(rows * cols) * sizeof(double)), *Y = malloc((size_t)(rows * cols) * sizeof(double));
    double *M = malloc((size_t)rows * sizeof(double)), *S = malloc((size_t)rows * sizeof(double));
    cr_assert(H && Y && M && S);
    ref_norm_fwd(layernorm, p.dtype, rows, cols, X, residual ? R : NULL, weight ? W : NULL, bias ? B : NULL,
                 p.gemma, p.eps, H, Y, M, S);
    buf *out = in_place ? &x : &y;
    double *expect_y = expect_new(out), *expect_res = expect_new(&res);
    scatter(expect_y, Y, off, rows, cols, n.ys);
    scatter(expect_res, H, off, rows, cols, n.rs);
    double *expect_mean = expect_new(&mean), *expect_rstd = expect_new(&rstd);
    for (int64_t i = 0; i < rows && stats; i++) {
        expect_rstd[i] = S[i];
        if (layernorm)
            expect_mean[i] = M[i];
    }
    void *xp = buf_at(&x, off), *rp = residual ? buf_at(&res, off) : NULL, *yp = buf_at(out, off);
    const void *wp = weight ? buf_at(&w, off) : NULL, *bp = bias ? buf_at(&b, off) : NULL;
    float *mp = stats && layernorm ? (float *)mean.dev : NULL, *sp = stats ? (float *)rstd.dev : NULL;
    SWEEP_CALL(s, variant, layernorm ? tk_layernorm_fwd(&p, xp, rp, wp, bp, yp, mp, sp, NULL)
                                     : tk_rmsnorm_fwd(&p, xp, rp, wp, yp, sp, NULL));
    tk_dev_sync();
    buf_fetch(out);
    buf_fetch(&mean);
    buf_fetch(&rstd);
    check_buf(s, "y", out, expect_y, tk_default_rtol(p.dtype), 1.0);
    if (residual) {
        buf_fetch(&res);
        check_buf(s, "residual (h)", &res, expect_res, tk_default_rtol(p.dtype), 1.0);
    }
    check_buf(s, "rstd", &rstd, expect_rstd, 1e-5, 0.0);
    check_buf(s, "mean", &mean, expect_mean, 1e-5, 1.0);
    free(expect_y); free(expect_res); free(expect_mean); free(expect_rstd);
    free(X); free(R); free(W); free(B); free(H); free(Y); free(M); free(S);
    buf_free(&x); buf_free(&res); buf_free(&y); buf_free(&w); buf_free(&b); buf_free(&mean); buf_free(&rstd);
}

static void norm_bwd_case(sweep *s, tk_rng *r, const char *variant, bool layernorm, bool weight, int in_place,
                          norm_shape n) {
    const bool want_dw = chance(r, 0.6), want_db = layernorm && chance(r, 0.6);
    const tk_norm_params p = n.p;
    const int64_t rows = p.rows, cols = p.cols, off = n.off;
    describe(s, "%s bwd %s/%s %lldx%lld strides %lld/%lld offset %lld w %d dw %d db %d gemma %d in_place %d "
             "eps %g forced %s",
             layernorm ? "layernorm" : "rmsnorm", tk_test_dtype_name(p.dtype), tk_test_dtype_name(p.weight_dtype),
             (long long)rows, (long long)cols, (long long)n.xs, (long long)n.ys, (long long)off, weight, want_dw,
             want_db, p.gemma, in_place, (double)p.eps, variant ? variant : "none");
    buf x = buf_new(p.dtype, off + rows * n.xs), dy = buf_new(p.dtype, off + rows * n.ys);
    buf dx = buf_new(p.dtype, off + rows * n.xs), w = buf_new(p.weight_dtype, off + cols);
    buf dw = buf_new(p.weight_dtype, cols), db = buf_new(p.weight_dtype, cols);
    buf mean = buf_new(TK_F32, rows), rstd = buf_new(TK_F32, rows);
    buf_input(&x, r, layernorm ? -1.0 : -2.0, layernorm ? 3.0 : 2.0);
    buf_input(&dy, r, -1.0, 1.0);
    buf_input(&w, r, p.gemma ? -0.5 : 0.5, p.gemma ? 0.5 : 1.5);
    buf_output(&dx);
    buf_output(&dw);
    buf_output(&db);
    double *X = gather(&x, off, rows, cols, n.xs), *DY = gather(&dy, off, rows, cols, n.ys);
    double *W = gather(&w, off, 1, cols, cols);
    double *H = malloc((size_t)(rows * cols) * sizeof(double)), *Y = malloc((size_t)(rows * cols) * sizeof(double));
    double *DX = malloc((size_t)(rows * cols) * sizeof(double));
    double *M = malloc((size_t)rows * sizeof(double)), *S = malloc((size_t)rows * sizeof(double));
    double *DW = malloc((size_t)cols * sizeof(double)), *DB = malloc((size_t)cols * sizeof(double));
    cr_assert(H && Y && DX && M && S && DW && DB);
    /* The stats the forward would give, rounded to f32 and given to both. */
    ref_norm_fwd(layernorm, p.dtype, rows, cols, X, NULL, NULL, NULL, false, p.eps, H, Y, M, S);
    for (int64_t i = 0; i < rows; i++) {
        tk_test_store(TK_F32, mean.host, i, M[i]);
        tk_test_store(TK_F32, rstd.host, i, S[i]);
        M[i] = buf_val(&mean, i);
        S[i] = buf_val(&rstd, i);
    }
    tk_to_dev(mean.dev, mean.host, mean.bytes);
    tk_to_dev(rstd.dev, rstd.host, rstd.bytes);
    ref_norm_bwd(layernorm, rows, cols, DY, X, weight ? W : NULL, p.gemma, M, S, DX, DW, DB);
    size_t ws_bytes = 0;
    cr_assert_eq(tk_norm_bwd_workspace_size(&p, layernorm ? TK_NORM_LAYER : TK_NORM_RMS, &ws_bytes), TK_SUCCESS,
                 "%s: %s", s->what, tk_last_error());
    void *ws = tk_dev_alloc(ws_bytes);
    tk_dev_poison(ws, ws_bytes ? ws_bytes : 1);
    buf *out = in_place == 0 ? &dx : in_place == 1 ? &dy : &x;
    double *expect_dx = expect_new(out), *expect_dw = expect_new(&dw), *expect_db = expect_new(&db);
    scatter(expect_dx, DX, off, rows, cols, n.xs);
    for (int64_t c = 0; c < cols; c++) {
        expect_dw[c] = want_dw ? DW[c] : NAN;
        expect_db[c] = want_db ? DB[c] : NAN;
    }
    const void *xp = buf_at(&x, off), *wp = weight ? buf_at(&w, off) : NULL;
    const void *dyp = buf_at(&dy, off);
    void *dxp = buf_at(out, off), *dwp = want_dw ? dw.dev : NULL, *dbp = want_db ? db.dev : NULL;
    const float *mp = (const float *)mean.dev, *sp = (const float *)rstd.dev;
    SWEEP_CALL(s, variant, layernorm ? tk_layernorm_bwd(&p, dyp, xp, wp, mp, sp, dxp, dwp, dbp, ws, ws_bytes, NULL)
                                     : tk_rmsnorm_bwd(&p, dyp, xp, wp, sp, dxp, dwp, ws, ws_bytes, NULL));
    tk_dev_sync();
    buf_fetch(out);
    buf_fetch(&dw);
    buf_fetch(&db);
    const double reduce_scale = sqrt((double)rows) + 1.0;
    check_buf(s, "dx", out, expect_dx, tk_default_rtol(p.dtype), 1.0);
    check_buf(s, "dw", &dw, expect_dw, tk_default_rtol(p.weight_dtype), reduce_scale);
    check_buf(s, "db", &db, expect_db, tk_default_rtol(p.weight_dtype), reduce_scale);
    tk_dev_free(ws);
    free(expect_dx); free(expect_dw); free(expect_db);
    free(X); free(DY); free(W); free(H); free(Y); free(DX); free(M); free(S); free(DW); free(DB);
    buf_free(&x); buf_free(&dy); buf_free(&dx); buf_free(&w); buf_free(&dw); buf_free(&db);
    buf_free(&mean); buf_free(&rstd);
}

static void norm_case(sweep *s, tk_rng *r, bool backward) {
    const char *variant = case_variant(s);
    const bool layernorm = chance(r, 0.5), weight = chance(r, 0.7);
    /* in place: forward y over x; backward 1 = dx over dy, 2 = dx over x */
    const int in_place = chance(r, 0.2) ? (backward ? (int)irand(r, 1, 2) : 1) : 0;
    const norm_shape n = norm_random_shape(r, variant, in_place);
    if (backward)
        norm_bwd_case(s, r, variant, layernorm, weight, in_place, n);
    else
        norm_fwd_case(s, r, variant, layernorm, weight, in_place, n);
}

SWEEP_TESTS(norm, "norm", NORM_VARIANTS, NORM_VARIANTS, 5, norm_case, 0u, 0u)

/* --------------------------------------------------------------------------- softmax ---- */

/* The variants of "softmax" and "softmax_bwd". */
static const char *const SOFTMAX_VARIANTS[] = {"vec16_pipelined", "vec16_regs", "vec16_stream", "scalar_regs",
                                               "scalar_stream"};

/* "vec16_pipelined" needs a cc >= 9.0 device and code of the build that runs on it. */
static bool pipelined_runs_here(void) {
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    return tk_build_runs_variant(900, info.compute_capability);
}

static void softmax_case(sweep *s, tk_rng *r, bool backward) {
    const char *variant = case_variant(s);
    tk_softmax_params p = TK_SOFTMAX_PARAMS_INIT;
    p.dtype = any_dtype(r);
    p.rows = chance(r, 0.2) ? 1 : irand(r, 1, 40);
    p.cols = chance(r, 0.1) ? irand(r, 4001, 40000) : width(r, 4000);
    int64_t x_pad = row_pad(r), y_pad = row_pad(r), off = misalign(r);
    p.scale = chance(r, 0.5) ? 1.0f : (float)(tk_rng_uniform(r, 0.25, 2.0) * (chance(r, 0.5) ? 1.0 : -1.0));
    p.log = chance(r, 0.5);
    p.causal = chance(r, 0.3);
    if (p.causal) {
        p.causal_offset = irand(r, -p.cols / 2 - 1, p.cols + 2);
        p.causal_period = chance(r, 0.5) ? 0 : irand(r, 1, p.rows);
    }
    const bool in_place = chance(r, 0.2);
    if (variant && strstr(variant, "_regs"))
        p.cols = width(r, 2000);
    if (is_variant(variant, "vec16_pipelined")) { /* rows of 160 to 512 KB */
        p.rows = irand(r, 1, 3);
        p.cols = p.dtype == TK_F32 ? irand(r, 40000, 131072) : irand(r, 80000, 262144);
        if (p.causal)
            p.causal_offset = irand(r, -p.cols / 2 - 1, p.cols + 2);
    }
    if (variant && strncmp(variant, "vec16", 5) == 0) { /* rows in whole 16-byte packs */
        x_pad = round_up(p.cols + x_pad, 8) - p.cols;
        y_pad = round_up(p.cols + y_pad, 8) - p.cols;
        off = 0;
    }
    const int64_t xs = p.cols + x_pad, ys = in_place ? xs : p.cols + y_pad;
    p.x_row_stride = xs;
    p.y_row_stride = ys;
    describe(s, "softmax %s %s %lldx%lld strides %lld/%lld scale %g log %d causal %d offset %lld period %lld "
             "in_place %d misalign %lld forced %s",
             backward ? "bwd" : "fwd", tk_test_dtype_name(p.dtype), (long long)p.rows, (long long)p.cols,
             (long long)xs, (long long)ys, (double)p.scale, p.log, p.causal, (long long)p.causal_offset,
             (long long)p.causal_period, in_place, (long long)off, variant ? variant : "none");
    /* Forward: in = x (x stride), out = y (y stride). Backward: in = y, dy (y stride), out = dx. */
    const int64_t in_stride = backward ? ys : xs, out_stride = backward ? xs : ys;
    buf in = buf_new(p.dtype, off + p.rows * in_stride), dy = buf_new(p.dtype, off + p.rows * in_stride);
    buf out_buf = buf_new(p.dtype, off + p.rows * out_stride);
    tk_fill_uniform(r, p.dtype, in.host, in.n, -5.0, 5.0);
    buf_input(&dy, r, -1.0, 1.0);
    buf_output(&out_buf);
    buf *out = !in_place ? &out_buf : backward ? &dy : &in;
    double *expect = expect_new(out);
    double *row_x = malloc((size_t)p.cols * sizeof(double)), *row_y = malloc((size_t)p.cols * sizeof(double));
    double *row_dy = malloc((size_t)p.cols * sizeof(double)), *row_out = malloc((size_t)p.cols * sizeof(double));
    cr_assert(row_x && row_y && row_dy && row_out);
    double max_abs = 0.0;
    for (int64_t row = 0; row < p.rows; row++) {
        const int64_t len = ref_softmax_visible(&p, row), in_base = off + row * in_stride;
        for (int64_t j = 0; j < p.cols; j++)
            row_x[j] = buf_val(&in, in_base + j);
        if (backward) { /* y: a real (log-)softmax output, rounded to dtype */
            ref_softmax_row(row_x, p.cols, len, p.scale, p.log, row_y);
            for (int64_t j = 0; j < p.cols; j++) {
                tk_test_store(p.dtype, in.host, in_base + j, row_y[j]);
                row_y[j] = buf_val(&in, in_base + j);
                row_dy[j] = buf_val(&dy, in_base + j);
            }
            ref_softmax_bwd_row(row_y, row_dy, p.cols, len, p.scale, p.log, row_out);
        } else {
            ref_softmax_row(row_x, p.cols, len, p.scale, p.log, row_out);
        }
        for (int64_t j = 0; j < p.cols; j++) {
            expect[off + row * out_stride + j] = row_out[j];
            if (isfinite(row_out[j]) && fabs(row_out[j]) > max_abs)
                max_abs = fabs(row_out[j]);
        }
    }
    tk_to_dev(in.dev, in.host, in.bytes);
    SWEEP_CALL(s, variant, backward ? tk_softmax_bwd(&p, buf_at(&in, off), buf_at(&dy, off), buf_at(out, off), NULL)
                                    : tk_softmax_fwd(&p, buf_at(&in, off), buf_at(out, off), NULL));
    tk_dev_sync();
    buf_fetch(out);
    /* The family test's scale: probabilities relative to themselves down to f16's subnormals,
     * log-probabilities to 1 + |ref|, gradients to their largest size. */
    const double atol = backward ? max_abs : p.log ? 1.0 : (p.dtype == TK_F16 ? 1e-4 : 1e-6);
    check_buf(s, backward ? "dx" : "y", out, expect, tk_default_rtol(p.dtype), atol);
    free(expect); free(row_x); free(row_y); free(row_dy); free(row_out);
    buf_free(&in); buf_free(&dy); buf_free(&out_buf);
}

/* "vec16_pipelined" (the first) runs on devices where pipelined_runs_here(). */
SWEEP_TESTS(softmax, "softmax", SOFTMAX_VARIANTS, SOFTMAX_VARIANTS, 7, softmax_case, pipelined_runs_here() ? 0u : 1u,
            pipelined_runs_here() ? 0u : 1u)

/* ------------------------------------------------------------------------------ rope ---- */

typedef enum { ROPE_DENSE, ROPE_PADDED, ROPE_PACKED_QKV, ROPE_HEAD_MAJOR } rope_layout;

/* First element and {token, head} strides of Q (is_k false) or K in the layout; *total is the
 * elements of its buffer (Q and K of a packed buffer share one: K starts after the Q heads). */
static int64_t rope_layout_of(rope_layout layout, int64_t tokens, int64_t hq, int64_t hk, int64_t hd, bool is_k,
                              int64_t st[2], int64_t *total) {
    const int64_t heads = is_k ? hk : hq;
    switch (layout) {
    case ROPE_PADDED:
        st[1] = hd + 8;
        st[0] = heads * (hd + 8) + 24;
        *total = tokens * st[0];
        return 0;
    case ROPE_PACKED_QKV:
        st[1] = hd;
        st[0] = (hq + 2 * hk) * hd;
        *total = tokens * st[0];
        return is_k ? hq * hd : 0;
    case ROPE_HEAD_MAJOR:
        st[0] = hd;
        st[1] = tokens * hd;
        *total = tokens * heads * hd;
        return 0;
    case ROPE_DENSE:
        break;
    }
    st[1] = hd;
    st[0] = heads * hd;
    *total = tokens * heads * hd;
    return 0;
}

static const int64_t ATTN_HEAD_DIMS[] = {64, 80, 96, 128, 256};

static void rope_case(sweep *s, tk_rng *r, bool backward) {
    const char *variant = case_variant(s);
    tk_rope_params p = TK_ROPE_PARAMS_INIT;
    p.dtype = any_dtype(r);
    p.style = chance(r, 0.5) ? TK_ROPE_NEOX : TK_ROPE_GPTJ;
    p.tokens = chance(r, 0.2) ? 1 : irand(r, 1, 40);
    p.heads_q = irand(r, 0, 8);
    p.heads_k = irand(r, 0, 4);
    if (p.heads_q + p.heads_k == 0)
        p.heads_q = 1;
    p.head_dim = chance(r, 0.5) ? ATTN_HEAD_DIMS[irand(r, 0, 4)] : 2 * irand(r, 1, 80);
    p.rotary_dim = chance(r, 0.5) ? 0 : 2 * irand(r, 1, p.head_dim / 2);
    int64_t off = misalign(r);
    if (is_variant(variant, "vec16")) { /* 16-byte halves, pass-through part and rows */
        off = 0;
        p.head_dim = 16 * irand(r, 1, 16);
        p.rotary_dim = chance(r, 0.5) ? 0 : 16 * irand(r, 1, p.head_dim / 16);
    }
    const rope_layout layout = (rope_layout)irand(r, ROPE_DENSE, ROPE_HEAD_MAJOR);
    const bool in_place = chance(r, 0.3), cache = chance(r, 0.25);
    const int pos_kind = (int)irand(r, 0, 2); /* 0: position_start, 1: int32 array, 2: int64 array */
    p.theta = chance(r, 0.5) ? 10000.0f : 500000.0f;
    const int64_t hd = p.head_dim, rd = p.rotary_dim ? p.rotary_dim : hd, half = rd / 2;
    const bool packed = layout == ROPE_PACKED_QKV;

    /* Positions; with a cache, max_position = one past the largest, so every one is inside. */
    const int64_t pos_range = cache ? 3000 : pos_kind == 2 ? (INT64_C(1) << 29) : (1 << 20);
    p.position_start = cache ? irand(r, 0, 2000) : irand(r, 0, 1000000);
    int64_t *pos = malloc((size_t)p.tokens * sizeof(int64_t));
    int32_t *pos32 = malloc((size_t)p.tokens * sizeof(int32_t));
    cr_assert(pos && pos32);
    for (int64_t t = 0; t < p.tokens; t++) {
        pos[t] = pos_kind == 0 ? p.position_start + t : irand(r, 0, pos_range - 1);
        pos32[t] = (int32_t)pos[t];
    }
    const int64_t max_position = pos_kind == 0 ? p.position_start + p.tokens : pos_range;
    /* A cache: one table in vLLM's layout (a row holds the cosines, then the sines), with the
     * angles halved, as a caller's scaled table would be. */
    const int64_t cache_stride = rd + irand(r, 0, 3);
    float *table = NULL;
    if (cache) {
        table = malloc((size_t)(max_position * cache_stride) * sizeof(float));
        cr_assert(table != NULL);
        for (int64_t q = 0; q < max_position; q++)
            for (int64_t i = 0; i < half; i++) {
                const double a = 0.5 * (double)q * ref_rope_inv_freq(p.theta, i, rd);
                table[q * cache_stride + i] = (float)cos(a);
                table[q * cache_stride + half + i] = (float)sin(a);
            }
    }
    int64_t nq, nk;
    const int64_t qbase = off + rope_layout_of(layout, p.tokens, p.heads_q, p.heads_k, hd, false, p.q_strides, &nq);
    const int64_t kbase = off + rope_layout_of(layout, p.tokens, p.heads_q, p.heads_k, hd, true, p.k_strides, &nk);
    describe(s, "rope %s %s %s tokens %lld heads %lld+%lld dim %lld rotary %lld layout %d in_place %d cache %d "
             "positions %d start %lld theta %g misalign %lld forced %s",
             backward ? "bwd" : "fwd", tk_test_dtype_name(p.dtype), p.style == TK_ROPE_NEOX ? "neox" : "gptj",
             (long long)p.tokens, (long long)p.heads_q, (long long)p.heads_k, (long long)hd, (long long)p.rotary_dim,
             (int)layout, in_place, cache, pos_kind, (long long)p.position_start, (double)p.theta, (long long)off,
             variant ? variant : "none");
    buf q = buf_new(p.dtype, off + nq), k = buf_new(p.dtype, off + nk);
    buf qo = buf_new(p.dtype, off + nq), ko = buf_new(p.dtype, off + nk);
    buf_input(&q, r, -2.0, 2.0);
    buf_input(&k, r, -2.0, 2.0);
    buf_output(&qo);
    buf_output(&ko);
    buf *kin = packed ? &q : &k; /* K's input buffer */
    buf *qout = in_place ? &q : &qo, *kout = in_place ? kin : packed ? &qo : &ko;
    double *eq = expect_new(qout), *ek = packed ? eq : expect_new(kout);
    double *in = malloc((size_t)hd * sizeof(double)), *res = malloc((size_t)hd * sizeof(double));
    double *ca = malloc((size_t)half * sizeof(double)), *sa = malloc((size_t)half * sizeof(double));
    cr_assert(in && res && ca && sa);
    for (int64_t t = 0; t < p.tokens; t++) {
        for (int64_t i = 0; i < half; i++) {
            const double a = (double)pos[t] * ref_rope_inv_freq(p.theta, i, rd);
            ca[i] = cache ? table[pos[t] * cache_stride + i] : cos(a);
            sa[i] = cache ? table[pos[t] * cache_stride + half + i] : sin(a);
        }
        for (int which = 0; which < 2; which++) {
            const int64_t heads = which ? p.heads_k : p.heads_q, base = which ? kbase : qbase;
            const int64_t *st = which ? p.k_strides : p.q_strides;
            const buf *src = which ? kin : &q;
            double *e = which ? ek : eq;
            for (int64_t h = 0; h < heads; h++) {
                const int64_t row = base + t * st[0] + h * st[1];
                for (int64_t j = 0; j < hd; j++)
                    in[j] = buf_val(src, row + j);
                ref_rope_head(p.style, hd, rd, in, ca, sa, backward, res);
                for (int64_t j = 0; j < hd; j++)
                    e[row + j] = res[j];
            }
        }
    }
    void *d_pos = NULL;
    float *d_table = NULL;
    if (pos_kind == 1)
        p.positions32 = d_pos = dev_copy(pos32, (size_t)p.tokens * sizeof(int32_t));
    if (pos_kind == 2)
        p.positions64 = d_pos = dev_copy(pos, (size_t)p.tokens * sizeof(int64_t));
    if (cache) {
        const size_t bytes = (size_t)(max_position * cache_stride) * sizeof(float);
        p.cos_cache = d_table = dev_copy(table, bytes);
        p.sin_cache = d_table + half;
        p.cache_row_stride = cache_stride;
        p.max_position = max_position;
    }
    void *qp = p.heads_q ? buf_at(&q, qbase) : NULL, *kp = p.heads_k ? buf_at(kin, kbase) : NULL;
    void *qop = p.heads_q ? buf_at(qout, qbase) : NULL, *kop = p.heads_k ? buf_at(kout, kbase) : NULL;
    SWEEP_CALL(s, variant, backward ? tk_rope_bwd(&p, qp, kp, qop, kop, NULL) : tk_rope_fwd(&p, qp, kp, qop, kop, NULL));
    tk_dev_sync();
    buf_fetch(qout);
    const double rtol = tk_default_rtol(p.dtype);
    check_buf(s, "q", qout, eq, rtol, 1.0);
    if (!packed) {
        buf_fetch(kout);
        check_buf(s, "k", kout, ek, rtol, 1.0);
    }
    tk_dev_free(d_pos);
    tk_dev_free(d_table);
    free(eq);
    if (!packed)
        free(ek);
    free(pos); free(pos32); free(table); free(in); free(res); free(ca); free(sa);
    buf_free(&q); buf_free(&k); buf_free(&qo); buf_free(&ko);
}

SWEEP_TESTS(rope, "rope", VEC16_SCALAR, VEC16_SCALAR, 9, rope_case, 0u, 0u)

/* ------------------------------------------------------------------------- attention ---- */

static const char *const ATTN_VARIANTS[] = {"wgmma_sm90", "wgmma_sm90_persistent", "wgmma_sm90_wide", "mma_sm80_packed",
                                            "mma_sm80"};

/* Strides of a [batch, seq, heads, head_dim] tensor: layout 0 dense (strides all 0 in the call),
 * 1 [B, S, H, D] and 2 [B, H, S, D], with rows and batches padded by whole 16-byte packs.
 * Returns the elements of its buffer. */
static int64_t attn_strides(int layout, int64_t batch, int64_t seq, int64_t heads, int64_t d, int64_t row_pad,
                            int64_t batch_pad, int64_t st[4]) {
    st[3] = 1;
    if (layout == 2) {
        st[1] = d + row_pad;
        st[2] = seq * st[1];
        st[0] = heads * st[2] + batch_pad;
    } else {
        const int64_t rp = layout == 0 ? 0 : row_pad, bp = layout == 0 ? 0 : batch_pad;
        st[2] = d + rp;
        st[1] = heads * st[2];
        st[0] = seq * st[1] + bp;
    }
    return batch * st[0];
}

/* The strides of q, k, v and o for a layout (attn_strides) into ref, and into the call's params
 * unless the layout is dense (strides all 0 there); *nq and *nk the elements of the buffers of q
 * (and o) and of k (and v). */
static void attn_layout(int layout, int64_t rpad, int64_t bpad, tk_attention_params *ref, tk_attention_params *call,
                        int64_t *nq, int64_t *nk) {
    const tk_attention_params *c = call;
    *nq = attn_strides(layout, c->batch, c->seqlen_q, c->heads_q, c->head_dim, rpad, bpad, ref->q_strides);
    *nk = attn_strides(layout, c->batch, c->seqlen_k, c->heads_kv, c->head_dim, rpad, bpad, ref->k_strides);
    attn_strides(layout, c->batch, c->seqlen_k, c->heads_kv, c->head_dim, rpad, bpad, ref->v_strides);
    attn_strides(layout, c->batch, c->seqlen_q, c->heads_q, c->head_dim, rpad, bpad, ref->o_strides);
    if (layout != 0) {
        memcpy(call->q_strides, ref->q_strides, sizeof call->q_strides);
        memcpy(call->k_strides, ref->k_strides, sizeof call->k_strides);
        memcpy(call->v_strides, ref->v_strides, sizeof call->v_strides);
        memcpy(call->o_strides, ref->o_strides, sizeof call->o_strides);
    }
}

/* The ALiBi paper's geometric slopes, one per query head (the buffer's n), on the device. */
static void alibi_slopes(buf *slopes) {
    for (int64_t h = 0; h < slopes->n; h++)
        tk_test_store(TK_F32, slopes->host, h, pow(2.0, -8.0 * (double)(h + 1) / (double)slopes->n));
    tk_to_dev(slopes->dev, slopes->host, slopes->bytes);
}

/* FlashAttention's representation term: twice the change that adding and removing 0.3 in the
 * output dtype makes to a reference value. */
static double representation_term(tk_dtype dtype, double exact) {
    const double rounded = tk_test_round(dtype, exact);
    return 2.0 * fabs(tk_test_round(dtype, tk_test_round(dtype, rounded + 0.3) - 0.3) - rounded);
}

static void attention_case(sweep *s, tk_rng *r, bool backward) {
    (void)backward;
    const char *variant = case_variant(s);
    if (is_variant(variant, "wgmma_sm90_persistent") && tk_test_under_racecheck())
        variant = "wgmma_sm90"; /* its mask table's hand-off: tk_test_under_racecheck */
    const bool steer_packed = is_variant(variant, "mma_sm80_packed");
    /* "wgmma_sm90": a head dim it takes (64, 128 or 256; the persistent one 64 or 128, the wide
     * one 64), and (with few queries, so that the reference budget below keeps them) keys over
     * several of its key tiles (128 keys, 80 at head dim 256), so that its pipeline runs past the
     * first tiles */
    static const int64_t SM90_HEAD_DIMS[] = {64, 128, 256};
    const bool steer_persistent = is_variant(variant, "wgmma_sm90_persistent");
    const bool steer_wide = is_variant(variant, "wgmma_sm90_wide");
    const bool steer_sm90 = is_variant(variant, "wgmma_sm90") || steer_persistent || steer_wide;
    tk_attention_params p = TK_ATTENTION_PARAMS_INIT;
    p.dtype = chance(r, 0.5) ? TK_BF16 : TK_F16;
    p.head_dim = steer_sm90 ? SM90_HEAD_DIMS[irand(r, 0, steer_wide ? 0 : steer_persistent ? 1 : 2)]
                            : ATTN_HEAD_DIMS[irand(r, 0, 4)];
    p.heads_kv = irand(r, 1, 3);
    const int64_t group = steer_packed ? 2 * irand(r, 1, 2) : irand(r, 1, 4);
    p.heads_q = p.heads_kv * group;
    p.batch = irand(r, 1, 2);
    /* (the wide variant's 192-row tile at head dim 64: up to 400 queries, a second tile) */
    const int64_t max_q = steer_wide ? 400 : steer_sm90 && chance(r, 0.5) ? 40 : 128, max_k = steer_sm90 ? 600 : 160;
    p.seqlen_q = steer_packed ? irand(r, 8, 128) : chance(r, 0.2) ? 1 : irand(r, 1, max_q);
    p.seqlen_k = steer_packed ? irand(r, 8, 160) : chance(r, 0.2) ? 1 : irand(r, 1, max_k);
    /* keep the fp64 reference quick: at most ~4M products */
    while (p.batch * p.heads_q * p.seqlen_q * p.seqlen_k * p.head_dim > 4000000) {
        if (p.seqlen_q > p.seqlen_k)
            p.seqlen_q = (p.seqlen_q + 1) / 2;
        else
            p.seqlen_k = (p.seqlen_k + 1) / 2;
    }
    const int layout = (int)irand(r, 0, 2);
    const int64_t rpad = 8 * irand(r, 0, 2), bpad = chance(r, 0.5) ? 64 : 0;
    /* mask: 0 none or windows, 1 causal, 2 the sliding entry point (the wide variant at head dim
     * 128 takes only calls that mask nothing: mask 0 and no window) */
    const bool wide_open = steer_wide && p.head_dim == 128;
    const int mask = steer_packed ? (int)irand(r, 1, 2) : wide_open ? 0 : (int)irand(r, 0, 2);
    int64_t sliding_left = -1;
    p.causal = mask == 1;
    p.window_left = steer_packed ? irand(r, 0, p.seqlen_k - 2) : chance(r, 0.5) ? irand(r, 0, p.seqlen_k + 2) : -1;
    p.window_right = mask == 1 ? (chance(r, 0.3) ? 0 : -1) : chance(r, 0.5) ? irand(r, 0, p.seqlen_q + 2) : -1;
    if (wide_open)
        p.window_left = p.window_right = -1;
    if (mask == 2)
        sliding_left = p.window_left < 0 ? irand(r, 0, p.seqlen_k + 2) : p.window_left;
    p.softcap = chance(r, 0.25) ? (float)tk_rng_uniform(r, 2.0, 50.0) : 0.0f;
    p.softmax_scale = chance(r, 0.2) ? (float)tk_rng_uniform(r, 0.05, 0.3) : 0.0f;
    const bool alibi = chance(r, 0.25);
    p.return_lse = chance(r, 0.6);
    const double qk_range = p.softcap > 0.0f ? 4.0 : 2.0;
    describe(s, "attention %s B%lld Sq%lld Sk%lld H%lld/%lld D%lld layout %d pads %lld/%lld causal %d window (%lld, "
             "%lld) sliding %lld softcap %g scale %g alibi %d lse %d forced %s",
             tk_test_dtype_name(p.dtype), (long long)p.batch, (long long)p.seqlen_q, (long long)p.seqlen_k,
             (long long)p.heads_q, (long long)p.heads_kv, (long long)p.head_dim, layout, (long long)rpad,
             (long long)bpad, p.causal, (long long)p.window_left, (long long)p.window_right, (long long)sliding_left,
             (double)p.softcap, (double)p.softmax_scale, alibi, p.return_lse, variant ? variant : "none");

    tk_attention_params ref = p; /* explicit strides, and the mask the call means */
    int64_t nq, nk;
    attn_layout(layout, rpad, bpad, &ref, &p, &nq, &nk);
    if (mask == 2) {
        ref.causal = 1;
        ref.window_right = 0;
        ref.window_left = sliding_left;
    }
    const int64_t n_lse = p.batch * p.heads_q * p.seqlen_q;
    buf q = buf_new(p.dtype, nq), k = buf_new(p.dtype, nk), v = buf_new(p.dtype, nk), o = buf_new(p.dtype, nq);
    buf lse = buf_new(TK_F32, n_lse), slopes = buf_new(TK_F32, p.heads_q);
    buf_input(&q, r, -qk_range, qk_range);
    buf_input(&k, r, -qk_range, qk_range);
    buf_input(&v, r, -1.0, 1.0);
    alibi_slopes(&slopes);
    buf_output(&o);
    buf_output(&lse);
    p.q = q.dev;
    p.k = k.dev;
    p.v = v.dev;
    p.o = o.dev;
    p.lse = (float *)lse.dev;
    p.alibi_slopes = alibi ? (const float *)slopes.dev : NULL;

    /* tk_attention_supported must name the variant that the call then runs. */
    tk_attention_params query = p;
    if (mask == 2)
        query.causal = 1, query.window_right = 0, query.window_left = sliding_left;
    cr_assert_eq(tk_experimental_force_variant("attention", variant), TK_SUCCESS);
    const char *named = NULL;
    tk_status st = tk_attention_supported(&query, &named);
    if (TK_STATUS_GROUP(st) == 2 && variant) {
        variant = NULL;
        cr_assert_eq(tk_experimental_force_variant("attention", NULL), TK_SUCCESS);
        st = tk_attention_supported(&query, &named);
    }
    if (st == TK_SUCCESS && tk_test_under_racecheck() && strcmp(named, "wgmma_sm90_persistent") == 0) {
        variant = "wgmma_sm90"; /* the automatic choice of a short band: tk_test_under_racecheck */
        cr_assert_eq(tk_experimental_force_variant("attention", variant), TK_SUCCESS);
        st = tk_attention_supported(&query, &named);
    }
    cr_assert_eq(st, TK_SUCCESS, "%s: tk_attention_supported: %s", s->what, tk_last_error());
    st = mask == 2 ? tk_attention_sliding_fwd(&p, sliding_left, NULL) : tk_attention_fwd(&p, NULL);
    cr_assert_eq(st, TK_SUCCESS, "%s: %s", s->what, tk_last_error());
    cr_assert_str_eq(tk_last_variant(), named, "%s: ran %s, tk_attention_supported named %s", s->what,
                     tk_last_variant(), named);
    count_run(s, variant);
    cr_assert_eq(tk_experimental_force_variant("attention", NULL), TK_SUCCESS);
    tk_dev_sync();
    buf_fetch(&o);
    buf_fetch(&lse);

    double *q64 = gather(&q, 0, 1, q.n, 0), *k64 = gather(&k, 0, 1, k.n, 0), *v64 = gather(&v, 0, 1, v.n, 0);
    double *exact = malloc((size_t)p.head_dim * sizeof(double)), *naive = malloc((size_t)p.head_dim * sizeof(double));
    double *expect_lse = expect_new(&lse);
    unsigned char *written = calloc((size_t)o.n, 1);
    cr_assert(exact && naive && written);
    double err = 0.0, err_naive = 0.0, atol = 0.0;
    int64_t worst = -1;
    for (int64_t b = 0; b < p.batch; b++)
        for (int64_t h = 0; h < p.heads_q; h++)
            for (int64_t i = 0; i < p.seqlen_q; i++) {
                double lse_exact, lse_naive;
                const float *sl = alibi ? (const float *)slopes.host : NULL;
                ref_attention_row(&ref, q64, k64, v64, sl, b, h, i, false, exact, &lse_exact);
                ref_attention_row(&ref, q64, k64, v64, sl, b, h, i, true, naive, &lse_naive);
                const int64_t row = b * ref.o_strides[0] + i * ref.o_strides[1] + h * ref.o_strides[2];
                for (int64_t e = 0; e < p.head_dim; e++) {
                    const double g = tk_test_load(p.dtype, o.got, row + e);
                    written[row + e] = 1;
                    cr_assert(isfinite(g), "%s: o element %lld is %g", s->what, (long long)(row + e), g);
                    if (fabs(g - exact[e]) > err) {
                        err = fabs(g - exact[e]);
                        worst = row + e;
                    }
                    err_naive = fmax(err_naive, fabs(naive[e] - exact[e]));
                    atol = fmax(atol, representation_term(p.dtype, exact[e]));
                }
                if (p.return_lse)
                    expect_lse[(b * p.heads_q + h) * p.seqlen_q + i] = lse_exact;
            }
    cr_assert(err <= 2.0 * err_naive + atol, "%s: max |o - ref| = %.3g at element %lld > 2 x naive error %.3g + %.3g",
              s->what, err, (long long)worst, err_naive, atol);
    for (int64_t x = 0; x < o.n; x++)
        cr_assert(written[x] || memcmp(o.got + 2 * x, o.host + 2 * x, 2) == 0, "%s: wrote element %lld outside o",
                  s->what, (long long)x);
    check_buf(s, "lse", &lse, expect_lse, tk_default_rtol(TK_F32), 1.0);
    free(q64); free(k64); free(v64); free(exact); free(naive); free(expect_lse); free(written);
    buf_free(&q); buf_free(&k); buf_free(&v); buf_free(&o); buf_free(&lse); buf_free(&slopes);
}

/* The three "wgmma_sm90" variants run only on a cc 9.0 device with a build for sm_90a (the rule
 * of test_attention.c); elsewhere every case they are forced on falls back to the automatic
 * choice. */
Test(sweep_gpu, attention_fwd, .timeout = 300) {
    TK_REQUIRE_GPU();
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    const bool sm90 = info.compute_capability == 900 && tk_build_runs_variant(900, info.compute_capability);
    /* Off sm90 the three wgmma variants (bits 0-2) need not run; under racecheck the persistent
     * one (bit 1) is never forced (attention_case), so it runs no case of its own there. */
    const unsigned optional = !sm90 ? 7u : tk_test_under_racecheck() ? 2u : 0u;
    run_sweep("attention", ATTN_VARIANTS, COUNT(ATTN_VARIANTS), 11, 200, attention_case, false, optional);
}

/* ---------------------------------------------------------------- attention backward ---- */

static const char *const ATTN_BWD_VARIANTS[] = {"wgmma_sm90", "mma_sm80_bn128", "mma_sm80_d256", "mma_sm80"};

/* Whether `variant` (NULL: the automatic choice, i.e. any variant) takes a call of this head dim
 * (with softcap or not) on this device, by test_attention_bwd.c's claims: every variant takes
 * every mask, layout and the deterministic flag, and every option but softcap at head dim 64 on
 * Hopper, so only the head dim, softcap and the device decide. "wgmma_sm90": 128, and 64 without
 * softcap, where the Hopper variant runs; "mma_sm80_bn128": 64 to 128 where its tiles fit;
 * "mma_sm80_d256": 256 where its tiles fit; "mma_sm80": 64 to 128. */
static bool bwd_claims(const char *variant, int64_t head_dim, bool softcap) {
    static int smem = -1;
    if (smem < 0) {
        tk_device_info info = TK_DEVICE_INFO_INIT;
        cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
        smem = info.max_smem_per_block;
    }
    const bool d256 = head_dim == 256;
    if (variant == NULL)
        return !d256 || tk_attention_bwd_d256_smem() <= smem;
    if (is_variant(variant, "wgmma_sm90"))
        return (head_dim == 128 || (head_dim == 64 && !softcap)) && tk_sm90_runs_here();
    if (is_variant(variant, "mma_sm80_bn128"))
        return !d256 && tk_attention_bwd_bn128_smem(head_dim) <= smem;
    if (is_variant(variant, "mma_sm80_d256"))
        return d256 && tk_attention_bwd_d256_smem() <= smem;
    return !d256; /* "mma_sm80" */
}

/* The variant the automatic choice runs: the first of the table (selection order) that claims
 * the call. */
static const char *bwd_auto_variant(int64_t head_dim, bool softcap) {
    for (int v = 0; v < COUNT(ATTN_BWD_VARIANTS); v++)
        if (bwd_claims(ATTN_BWD_VARIANTS[v], head_dim, softcap))
            return ATTN_BWD_VARIANTS[v];
    return "";
}

/* One gradient (g, strides st, [batch, seq, heads, head_dim]) against the fp64 reference by
 * test_attention_bwd.c's rule: every element finite, exactly 0 in the rows that see no partner
 * (queries that see no key for dq, keys no query sees for dk and dv), and the largest error at
 * most twice the naive backward's plus the representation term; every position of the buffer
 * outside the tensor keeps its poison. A failure is appended to fails rather than asserted, so
 * that dq, dk and dv are reported together: which of them are wrong tells a dQ reduction bug
 * (dq only) from a wrong P or dS (all three). */
static void check_attn_grad(const tk_attention_params *ref, const char *name, const buf *g, const int64_t st[4],
                            int64_t seq, int64_t heads, bool keys, const double *exact, const double *naive,
                            char *fails, size_t size) {
    const int64_t d = ref->head_dim, partners = keys ? ref->seqlen_q : ref->seqlen_k;
    const size_t es = tk_test_dtype_size(g->dtype);
    unsigned char *inside = calloc((size_t)g->n, 1);
    cr_assert(inside != NULL);
    double err = 0.0, err_naive = 0.0, atol = 0.0;
    int64_t bad = 0, nonzero = 0, worst = -1, outside = -1;
    for (int64_t b = 0; b < ref->batch; b++)
        for (int64_t s = 0; s < seq; s++) {
            bool seen = false;
            for (int64_t x = 0; x < partners && !seen; x++)
                seen = keys ? ref_attention_visible(ref, b, x, s) : ref_attention_visible(ref, b, s, x);
            for (int64_t h = 0; h < heads; h++)
                for (int64_t e = 0; e < d; e++) {
                    const int64_t at = b * st[0] + s * st[1] + h * st[2] + e, i = ((b * seq + s) * heads + h) * d + e;
                    const double v = tk_test_load(g->dtype, g->got, at);
                    inside[at] = 1;
                    if (!isfinite(v)) {
                        bad++;
                        continue;
                    }
                    if (!seen)
                        nonzero += v != 0.0;
                    if (fabs(v - exact[i]) > err) {
                        err = fabs(v - exact[i]);
                        worst = at;
                    }
                    err_naive = fmax(err_naive, fabs(naive[i] - exact[i]));
                    atol = fmax(atol, ref_attention_representation_term(g->dtype, exact[i]));
                }
        }
    for (int64_t x = 0; x < g->n && outside < 0; x++)
        if (!inside[x] && memcmp(g->got + (size_t)x * es, g->host + (size_t)x * es, es) != 0)
            outside = x;
    free(inside);
    const size_t used = strlen(fails);
    if (outside >= 0)
        snprintf(fails + used, size - used, "; wrote %s's buffer at element %lld, outside the tensor", name,
                 (long long)outside);
    else if (bad != 0)
        snprintf(fails + used, size - used, "; %lld non-finite %s values", (long long)bad, name);
    else if (nonzero != 0)
        snprintf(fails + used, size - used, "; %lld %s values of unseen rows are not 0", (long long)nonzero, name);
    else if (!(err <= 2.0 * err_naive + atol))
        snprintf(fails + used, size - used, "; max |%s - ref| = %.3g at element %lld > 2 x naive error %.3g + %.3g",
                 name, err, (long long)worst, err_naive, atol);
}

/* dsinks by test_attention_bwd.c's rule: the kernel sums -exp(sink - lse_i) D_i over the
 * forward's stored o and lse in f32, so it is held to that sum recomputed in fp64 from the same
 * stored values (within the f32 rounding of that many terms), and that sum to the fp64
 * reference's dsinks within the forward's error on o (2 x the representation term per element,
 * weighted by |dout|), plus 0.1 % of the terms' magnitude. The 8 floats past dsinks keep their
 * poison. */
static void check_attn_dsinks(const sweep *s, const tk_attention_params *ref, const buf *o, const buf *lse,
                              const buf *dsinks, const double *q, const double *k, const double *v,
                              const double *dout, const float *slopes) {
    const int64_t hq = ref->heads_q, d = ref->head_dim;
    double *exact = malloc((size_t)hq * sizeof(double));
    cr_assert(exact != NULL);
    ref_attention_dsinks(ref, q, k, v, dout, slopes, exact);
    for (int64_t h = 0; h < hq; h++) {
        double stored = 0.0, magnitude = 0.0, rounding = 0.0;
        for (int64_t b = 0; b < ref->batch; b++)
            for (int64_t i = 0; i < ref->seqlen_q; i++) {
                const int64_t row = b * ref->o_strides[0] + i * ref->o_strides[1] + h * ref->o_strides[2];
                const double l = tk_test_load(TK_F32, lse->got, (b * hq + h) * ref->seqlen_q + i);
                const double ps = exp((double)ref->sinks[h] - l);
                double dsum = 0.0, dmag = 0.0;
                for (int64_t e = 0; e < d; e++) {
                    const double oe = tk_test_load(ref->dtype, o->got, row + e), g = dout[row + e];
                    dsum += g * oe;
                    dmag += fabs(g) * 2.0 * ref_attention_representation_term(ref->dtype, oe);
                }
                stored -= ps * dsum;
                magnitude += ps * fabs(dsum);
                rounding += ps * dmag;
            }
        const double got = tk_test_load(TK_F32, dsinks->got, h);
        cr_assert(isfinite(got) && fabs(got - stored) <= 1e-5 * (magnitude + 1.0),
                  "%s: dsinks[%lld] = %.8g, the stored o and lse give %.8g", s->what, (long long)h, got, stored);
        cr_assert(fabs(stored - exact[h]) <= rounding + 1e-3 * (magnitude + 1.0),
                  "%s: dsinks[%lld] of the stored o %.8g, fp64 reference %.8g (bound %.3g)", s->what, (long long)h,
                  stored, exact[h], rounding);
    }
    cr_assert(memcmp(dsinks->got + (size_t)hq * 4, dsinks->host + (size_t)hq * 4, (size_t)(dsinks->n - hq) * 4) == 0,
              "%s: wrote past dsinks", s->what);
    free(exact);
}

/* One backward call (the forward run first for its o and lse), steered towards what the forced
 * variant claims: a head dim it takes on this device (the variants differ in nothing else).
 * Random: dtype, batch, GQA, lengths (1, ragged, over several key and query tiles), head dim,
 * causal and windows, softcap, scale, ALiBi, chunks, a prefix, documents, sinks (dsinks checked
 * too), deterministic (then run twice: bit-identical), and separate strided layouts for the
 * inputs (q, k, v, o, dout) and the gradients. */
static void attention_bwd_case(sweep *s, tk_rng *r, bool backward) {
    (void)backward;
    const char *variant = case_variant(s);
    int64_t dims[COUNT(ATTN_HEAD_DIMS)];
    int n_dims = 0;
    for (int i = 0; i < COUNT(ATTN_HEAD_DIMS); i++)
        if (bwd_claims(variant, ATTN_HEAD_DIMS[i], false))
            dims[n_dims++] = ATTN_HEAD_DIMS[i];
    /* a variant that claims nothing here (the Hopper ones elsewhere): head dim 128, which the
     * automatic choice takes everywhere and the variant then declines */
    if (n_dims == 0)
        dims[n_dims++] = 128;
    tk_attention_params f = TK_ATTENTION_PARAMS_INIT; /* the forward whose gradients these are */
    f.dtype = chance(r, 0.5) ? TK_BF16 : TK_F16;
    f.head_dim = dims[irand(r, 0, n_dims - 1)];
    /* few heads: the reference budget below then keeps the lengths over several tiles */
    const bool few_heads = chance(r, 0.5);
    f.heads_kv = few_heads ? 1 : irand(r, 1, 3);
    f.heads_q = f.heads_kv * (few_heads ? irand(r, 1, 2) : irand(r, 1, 4));
    f.batch = few_heads ? 1 : irand(r, 1, 2);
    const int64_t max_q = chance(r, 0.3) ? 40 : few_heads ? 300 : 160, max_k = few_heads ? 400 : 200;
    f.seqlen_q = chance(r, 0.15) ? 1 : irand(r, 1, max_q);
    f.seqlen_k = chance(r, 0.15) ? 1 : irand(r, 1, max_k);
    /* keep the fp64 reference quick: at most ~4M products */
    while (f.batch * f.heads_q * f.seqlen_q * f.seqlen_k * f.head_dim > 4000000) {
        if (f.seqlen_q > f.seqlen_k)
            f.seqlen_q = (f.seqlen_q + 1) / 2;
        else
            f.seqlen_k = (f.seqlen_k + 1) / 2;
    }
    const int layout = (int)irand(r, 0, 2), grad_layout = (int)irand(r, 0, 2);
    const int64_t rpad = 8 * irand(r, 0, 2), bpad = chance(r, 0.5) ? 64 : 0;
    const int64_t grad_rpad = 8 * irand(r, 0, 2), grad_bpad = chance(r, 0.5) ? 64 : 0;
    f.causal = chance(r, 0.5);
    f.window_left = chance(r, 0.4) ? irand(r, 0, f.seqlen_k + 2) : -1;
    f.window_right = f.causal ? (chance(r, 0.3) ? 0 : -1) : chance(r, 0.4) ? irand(r, 0, f.seqlen_q + 2) : -1;
    /* the specialised masks, where tkern.h allows them together: a prefix only causal, without a
     * left window, chunks or documents; documents only with seqlen_q <= seqlen_k */
    if (f.causal && chance(r, 0.15)) {
        f.prefix_len = irand(r, 1, f.seqlen_k + 2);
        f.window_left = -1;
    } else {
        f.chunk_size = chance(r, 0.2) ? irand(r, 1, f.seqlen_k + 2) : 0;
    }
    const int64_t doc_len = f.prefix_len == 0 && f.seqlen_q <= f.seqlen_k && chance(r, 0.25)
                                ? irand(r, 1, f.seqlen_k) : 0;
    const bool sinks = chance(r, 0.2), alibi = chance(r, 0.25);
    f.softcap = chance(r, 0.25) ? (float)tk_rng_uniform(r, 2.0, 50.0) : 0.0f;
    f.softmax_scale = chance(r, 0.2) ? (float)tk_rng_uniform(r, 0.05, 0.3) : 0.0f;
    const int deterministic = chance(r, 0.5);
    describe(s, "attention_bwd %s B%lld Sq%lld Sk%lld H%lld/%lld D%lld layout %d pads %lld/%lld grads %d pads "
             "%lld/%lld causal %d window (%lld, %lld) softcap %g scale %g alibi %d chunk %lld prefix %lld docs %lld "
             "sinks %d deterministic %d forced %s",
             tk_test_dtype_name(f.dtype), (long long)f.batch, (long long)f.seqlen_q, (long long)f.seqlen_k,
             (long long)f.heads_q, (long long)f.heads_kv, (long long)f.head_dim, layout, (long long)rpad,
             (long long)bpad, grad_layout, (long long)grad_rpad, (long long)grad_bpad, f.causal,
             (long long)f.window_left, (long long)f.window_right, (double)f.softcap, (double)f.softmax_scale, alibi,
             (long long)f.chunk_size, (long long)f.prefix_len, (long long)doc_len, sinks, deterministic,
             variant ? variant : "none");

    tk_attention_params ref = f; /* explicit strides and host arrays */
    int64_t nq, nk;
    attn_layout(layout, rpad, bpad, &ref, &f, &nq, &nk);
    int64_t dq_st[4], dk_st[4];
    const int64_t ndq =
        attn_strides(grad_layout, f.batch, f.seqlen_q, f.heads_q, f.head_dim, grad_rpad, grad_bpad, dq_st);
    const int64_t ndk =
        attn_strides(grad_layout, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, grad_rpad, grad_bpad, dk_st);
    const int64_t n_lse = f.batch * f.heads_q * f.seqlen_q;
    buf q = buf_new(f.dtype, nq), k = buf_new(f.dtype, nk), v = buf_new(f.dtype, nk), o = buf_new(f.dtype, nq);
    buf dout = buf_new(f.dtype, nq), lse = buf_new(TK_F32, n_lse), slopes = buf_new(TK_F32, f.heads_q);
    buf sink = buf_new(TK_F32, f.heads_q), dsinks = buf_new(TK_F32, f.heads_q);
    buf dq = buf_new(f.dtype, ndq), dk = buf_new(f.dtype, ndk), dv = buf_new(f.dtype, ndk);
    buf_input(&q, r, -1.0, 1.0); /* test_attention_bwd.c's ranges, for which its rule is set */
    buf_input(&k, r, -1.0, 1.0);
    buf_input(&v, r, -1.0, 1.0);
    buf_input(&dout, r, -1.0, 1.0);
    buf_input(&sink, r, -2.0, 4.0);
    alibi_slopes(&slopes);
    int32_t *ids = doc_len > 0 ? ref_attention_doc_ids(f.batch, f.seqlen_k, doc_len) : NULL;
    void *d_ids = ids ? dev_copy(ids, (size_t)(f.batch * f.seqlen_k) * sizeof(int32_t)) : NULL;
    buf_output(&o);
    buf_output(&lse);
    f.q = q.dev;
    f.k = k.dev;
    f.v = v.dev;
    f.o = o.dev;
    f.return_lse = 1;
    f.lse = (float *)lse.dev;
    f.alibi_slopes = alibi ? (const float *)slopes.dev : NULL;
    f.sinks = sinks ? (const float *)sink.dev : NULL;
    f.document_ids = d_ids;
    ref.sinks = sinks ? (const float *)sink.host : NULL;
    ref.document_ids = ids;
    cr_assert_eq(tk_test_attention_fwd(&f, -1, NULL), TK_SUCCESS, "%s: forward: %s", s->what, tk_last_error());

    tk_attention_bwd_params p = TK_ATTENTION_BWD_PARAMS_INIT;
    p.dtype = f.dtype;
    p.q = q.dev, p.k = k.dev, p.v = v.dev, p.o = o.dev, p.lse = (const float *)lse.dev, p.dout = dout.dev;
    p.dq = dq.dev, p.dk = dk.dev, p.dv = dv.dev;
    p.batch = f.batch, p.seqlen_q = f.seqlen_q, p.seqlen_k = f.seqlen_k;
    p.heads_q = f.heads_q, p.heads_kv = f.heads_kv, p.head_dim = f.head_dim;
    memcpy(p.q_strides, f.q_strides, sizeof p.q_strides);
    memcpy(p.k_strides, f.k_strides, sizeof p.k_strides);
    memcpy(p.v_strides, f.v_strides, sizeof p.v_strides);
    memcpy(p.o_strides, f.o_strides, sizeof p.o_strides);
    memcpy(p.dout_strides, f.o_strides, sizeof p.dout_strides); /* dout laid out like o (the reference's) */
    if (grad_layout != 0) {
        memcpy(p.dq_strides, dq_st, sizeof p.dq_strides);
        memcpy(p.dk_strides, dk_st, sizeof p.dk_strides);
        memcpy(p.dv_strides, dk_st, sizeof p.dv_strides);
    }
    p.softmax_scale = f.softmax_scale;
    p.causal = f.causal, p.window_left = f.window_left, p.window_right = f.window_right;
    p.softcap = f.softcap;
    p.alibi_slopes = f.alibi_slopes;
    p.sinks = f.sinks;
    p.dsinks = (float *)dsinks.dev; /* without sinks unused: checked untouched */
    p.chunk_size = f.chunk_size, p.prefix_len = f.prefix_len, p.document_ids = f.document_ids;
    p.deterministic = deterministic;
    size_t ws_bytes = 0;
    cr_assert_eq(tk_attention_bwd_workspace_size(&p, &ws_bytes), TK_SUCCESS, "%s: %s", s->what, tk_last_error());
    void *ws = tk_dev_alloc(ws_bytes);
    p.workspace = ws, p.workspace_bytes = ws_bytes;

    /* With the variant forced: it must run the call where it claims it and decline it (which
     * writes nothing) where not; then the automatic choice runs it, which must be the first
     * variant that claims it. Deterministic calls run a second time on fresh poison, and must
     * give the same bits. */
    const bool claimed = variant == NULL || bwd_claims(variant, f.head_dim, f.softcap > 0.0f);
    const char *ran = NULL;
    for (int run = 0; run < 1 + deterministic; run++) {
        buf_output(&dq);
        buf_output(&dk);
        buf_output(&dv);
        buf_output(&dsinks);
        tk_dev_poison(ws, ws_bytes);
        cr_assert_eq(tk_experimental_force_variant("attention_bwd", variant), TK_SUCCESS);
        tk_status st = tk_attention_bwd(&p, NULL);
        if (TK_STATUS_GROUP(st) == 2 && variant != NULL) {
            cr_assert(!claimed, "%s: %s declined a call it claims on this device: %s", s->what, variant,
                      tk_last_error());
            variant = NULL;
            cr_assert_eq(tk_experimental_force_variant("attention_bwd", NULL), TK_SUCCESS);
            st = tk_attention_bwd(&p, NULL);
        }
        cr_assert_eq(st, TK_SUCCESS, "%s: %s", s->what, tk_last_error());
        cr_assert(variant == NULL || claimed, "%s: %s ran a call it does not claim on this device", s->what,
                  variant);
        const char *expected = variant ? variant : bwd_auto_variant(f.head_dim, f.softcap > 0.0f);
        cr_assert_str_eq(tk_last_variant(), expected, "%s: ran %s, expected %s", s->what, tk_last_variant(),
                         expected);
        if (run == 0)
            count_run(s, variant);
        cr_assert_eq(tk_experimental_force_variant("attention_bwd", NULL), TK_SUCCESS);
        if (run == 0) {
            ran = expected;
            tk_dev_sync();
            buf_fetch(&dq);
            buf_fetch(&dk);
            buf_fetch(&dv);
            buf_fetch(&dsinks);
            continue;
        }
        tk_dev_sync();
        const buf *outs[4] = {&dq, &dk, &dv, &dsinks};
        static const char *const names[4] = {"dq", "dk", "dv", "dsinks"};
        for (int t = 0; t < 4; t++) {
            unsigned char *again = malloc(outs[t]->bytes);
            cr_assert(again != NULL);
            tk_to_host(again, outs[t]->dev, outs[t]->bytes);
            cr_assert(memcmp(again, outs[t]->got, outs[t]->bytes) == 0,
                      "%s: deterministic: %s's second run (%s) differs from its first", s->what, names[t], ran);
            free(again);
        }
    }
    buf_fetch(&o);
    buf_fetch(&lse);

    double *q64 = gather(&q, 0, 1, q.n, 0), *k64 = gather(&k, 0, 1, k.n, 0), *v64 = gather(&v, 0, 1, v.n, 0);
    double *do64 = gather(&dout, 0, 1, dout.n, 0);
    const size_t dense_q = (size_t)(f.batch * f.seqlen_q * f.heads_q * f.head_dim);
    const size_t dense_k = (size_t)(f.batch * f.seqlen_k * f.heads_kv * f.head_dim);
    double *eq = malloc(dense_q * sizeof(double)), *nq64 = malloc(dense_q * sizeof(double));
    double *ek = malloc(dense_k * sizeof(double)), *nk64 = malloc(dense_k * sizeof(double));
    double *ev = malloc(dense_k * sizeof(double)), *nv64 = malloc(dense_k * sizeof(double));
    cr_assert(eq && nq64 && ek && nk64 && ev && nv64);
    const float *host_slopes = alibi ? (const float *)slopes.host : NULL;
    ref_attention_bwd(&ref, q64, k64, v64, do64, host_slopes, false, eq, ek, ev);
    ref_attention_bwd(&ref, q64, k64, v64, do64, host_slopes, true, nq64, nk64, nv64);
    char fails[512] = "";
    check_attn_grad(&ref, "dq", &dq, dq_st, f.seqlen_q, f.heads_q, false, eq, nq64, fails, sizeof fails);
    check_attn_grad(&ref, "dk", &dk, dk_st, f.seqlen_k, f.heads_kv, true, ek, nk64, fails, sizeof fails);
    check_attn_grad(&ref, "dv", &dv, dk_st, f.seqlen_k, f.heads_kv, true, ev, nv64, fails, sizeof fails);
    cr_assert(fails[0] == '\0', "%s: ran %s%s", s->what, ran, fails);
    if (sinks)
        check_attn_dsinks(s, &ref, &o, &lse, &dsinks, q64, k64, v64, do64, host_slopes);
    else
        cr_assert(memcmp(dsinks.got, dsinks.host, dsinks.bytes) == 0, "%s: wrote dsinks without sinks", s->what);
    free(q64); free(k64); free(v64); free(do64);
    free(eq); free(nq64); free(ek); free(nk64); free(ev); free(nv64);
    free(ids);
    tk_dev_free(d_ids);
    tk_dev_free(ws);
    buf_free(&q); buf_free(&k); buf_free(&v); buf_free(&o); buf_free(&dout); buf_free(&lse); buf_free(&slopes);
    buf_free(&sink); buf_free(&dsinks); buf_free(&dq); buf_free(&dk); buf_free(&dv);
}

/* The variants that claim no head dim on this device need not run (each forced case falls back
 * to the automatic choice): "wgmma_sm90" off a cc 9.0 device with a build for
 * sm_90a, "mma_sm80_d256" (and head dim 256 altogether) where its 143 KB do not fit. */
Test(sweep_gpu, attention_bwd, .timeout = 300) {
    TK_REQUIRE_GPU();
    unsigned optional = 0u;
    for (int v = 0; v < COUNT(ATTN_BWD_VARIANTS); v++) {
        bool any = false;
        for (int i = 0; i < COUNT(ATTN_HEAD_DIMS); i++)
            any = any || bwd_claims(ATTN_BWD_VARIANTS[v], ATTN_HEAD_DIMS[i], false);
        optional |= any ? 0u : 1u << v;
    }
    run_sweep("attention_bwd", ATTN_BWD_VARIANTS, COUNT(ATTN_BWD_VARIANTS), 13, 120, attention_bwd_case, true,
              optional);
}

/* ------------------------------------------------------------------------------ gemm ---- */

static const char *const GEMM_VARIANTS[] = {"wgmma_128x256", "mma_128x256", "mma_128x128", "mma_unaligned"};

/* "mma_128x256" claims only calls with a wave of 128x256 tiles (a few MB of D): the first cases
 * that force it get such a shape, the rest stay small. */
#define GEMM_BIG_CASES 2

static int gemm_sm_count(void) {
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    return info.sm_count;
}

static void gemm_case(sweep *s, tk_rng *r, bool backward) {
    (void)backward;
    const char *variant = case_variant(s);
    tk_gemm_params p = TK_GEMM_PARAMS_INIT;
    p.input_dtype = chance(r, 0.5) ? TK_BF16 : TK_F16;
    const int out_kind = (int)irand(r, 0, 2);
    const tk_dtype other16 = p.input_dtype == TK_F16 ? TK_BF16 : TK_F16;
    p.output_dtype = out_kind == 0 ? p.input_dtype : out_kind == 1 ? TK_F32 : other16;
    p.b_layout = chance(r, 0.5) ? TK_GEMM_B_NK : TK_GEMM_B_KN;
    p.m = chance(r, 0.15) ? 1 : irand(r, 1, 300);
    p.n = chance(r, 0.15) ? 1 : irand(r, 1, 300);
    p.k = chance(r, 0.15) ? 1 : irand(r, 1, 300);
    if (chance(r, 0.1))
        p.m = irand(r, 300, 1000);
    int64_t pad_a = row_pad(r), pad_b = row_pad(r), off_a = misalign(r), off_b = misalign(r);
    const int64_t pad_c = row_pad(r), pad_d = row_pad(r), off_cd = misalign(r);
    p.activation = (tk_activation)irand(r, TK_ACT_NONE, TK_ACT_RELU_SQUARED);
    p.alpha = chance(r, 0.5) ? 1.0f : (float)tk_rng_uniform(r, -2.0, 2.0);
    p.beta = chance(r, 0.5) ? 0.0f : (float)tk_rng_uniform(r, -2.0, 2.0);
    const bool bias = chance(r, 0.5), alias = p.beta != 0.0f && chance(r, 0.3);
    if (is_variant(variant, "wgmma_128x256"))
        p.b_layout = TK_GEMM_B_NK;
    if (is_variant(variant, "mma_128x256") && s->index < GEMM_BIG_CASES * 5) {
        p.m = 1024; /* 8 rows of tiles by enough columns for a wave */
        p.n = 256 * ((gemm_sm_count() + 7) / 8) + irand(r, 0, 1);
        p.k = irand(r, 16, 48);
    }
    const bool kn = p.b_layout == TK_GEMM_B_KN;
    const int64_t b_cols = kn ? p.n : p.k;
    if (variant && strcmp(variant, "mma_unaligned") != 0) { /* the 16-byte rule */
        off_a = off_b = 0;
        pad_a = round_up(p.k + pad_a, 8) - p.k;
        pad_b = round_up(b_cols + pad_b, 8) - b_cols;
    }
    p.lda = p.k + pad_a;
    p.ldb = b_cols + pad_b;
    p.ldd = p.n + pad_d;
    p.ldc = alias ? p.ldd : p.n + pad_c;
    describe(s, "gemm m %lld n %lld k %lld in %s out %s %s lda %lld ldb %lld ldc %lld ldd %lld offsets %lld/%lld/%lld "
             "act %d alpha %g beta %g bias %d alias %d forced %s",
             (long long)p.m, (long long)p.n, (long long)p.k, tk_test_dtype_name(p.input_dtype),
             tk_test_dtype_name(p.output_dtype), kn ? "KN" : "NK", (long long)p.lda, (long long)p.ldb, (long long)p.ldc,
             (long long)p.ldd, (long long)off_a, (long long)off_b, (long long)off_cd, (int)p.activation,
             (double)p.alpha, (double)p.beta, bias, alias, variant ? variant : "none");
    const int64_t b_rows = kn ? p.k : p.n;
    buf a = buf_new(p.input_dtype, off_a + p.m * p.lda), b = buf_new(p.input_dtype, off_b + b_rows * p.ldb);
    buf d = buf_new(p.output_dtype, off_cd + p.m * p.ldd), c = buf_new(p.output_dtype, off_cd + p.m * p.ldc);
    buf bv = buf_new(p.output_dtype, off_cd + p.n);
    buf_input(&a, r, -1.0, 1.0);
    buf_input(&b, r, -1.0, 1.0);
    buf_input(&bv, r, -1.0, 1.0);
    if (alias) /* C lives in D */
        buf_input(&d, r, -1.0, 1.0);
    else {
        buf_input(&c, r, -1.0, 1.0);
        buf_output(&d);
    }
    const buf *cbuf = alias ? &d : &c;
    p.a = buf_at(&a, off_a);
    p.b = buf_at(&b, off_b);
    p.c = p.beta != 0.0f ? buf_at(cbuf, off_cd) : NULL;
    p.bias = bias ? buf_at(&bv, off_cd) : NULL;
    p.d = buf_at(&d, off_cd);
    const size_t in_es = tk_test_dtype_size(p.input_dtype), out_es = tk_test_dtype_size(p.output_dtype);
    double *product = malloc((size_t)(p.m * p.n) * sizeof(double));
    double *dense = malloc((size_t)(p.m * p.n) * sizeof(double));
    cr_assert(product && dense);
    ref_gemm_product(p.input_dtype, p.b_layout, a.host + off_a * in_es, p.lda, b.host + off_b * in_es, p.ldb, p.m,
                     p.n, p.k, product);
    ref_gemm_epilogue(&p, product, cbuf->host + off_cd * out_es, bias ? bv.host + off_cd * out_es : NULL, dense);
    double *expect = expect_new(&d);
    scatter(expect, dense, off_cd, p.m, p.n, p.ldd);
    SWEEP_CALL(s, variant, tk_gemm(&p, NULL));
    tk_dev_sync();
    buf_fetch(&d);
    /* The family test's scale: f32 sums of k terms grow like sqrt(k); D rounded once. */
    const double scale = fabs(p.alpha) * sqrt((double)p.k) + fabs(p.beta) + 1.0;
    check_buf(s, "d", &d, expect, tk_default_rtol(p.output_dtype), scale);
    free(product); free(dense); free(expect);
    buf_free(&a); buf_free(&b); buf_free(&c); buf_free(&d); buf_free(&bv);
}

/* Shared memory of "wgmma_128x256" and "mma_128x256" (as in test_gemm.c): the first runs only
 * on a cc 9.0 device with a build for sm_90a, the second needs a device that has this much. */
#define WGMMA_SMEM (5 * (64 + 256) * 64 * 2 + 80 + 1024)
#define BIG_TILE_SMEM (3 * (128 + 256) * 64 * 2)

Test(sweep_gpu, gemm, .timeout = 300) {
    TK_REQUIRE_GPU();
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    const bool wgmma = info.compute_capability == 900 && tk_build_has_arch("90a") &&
                       info.max_smem_per_block >= WGMMA_SMEM;
    const bool big = info.max_smem_per_block >= BIG_TILE_SMEM;
    const unsigned optional = (wgmma ? 0u : 1u) | (big ? 0u : 2u);
    run_sweep("gemm", GEMM_VARIANTS, COUNT(GEMM_VARIANTS), 12, 250, gemm_case, false, optional);
}
