/* Softmax and log-softmax: bad input on the host (runs everywhere), then every variant x dtype x
 * shape x mask x direction against the fp64 reference on the GPU. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/softmax_ref.h"

static const tk_dtype DTYPES[] = {TK_F32, TK_F16, TK_BF16};
static const char *const VARIANTS[] = {"vec16_pipelined", "vec16_regs", "vec16_stream", "scalar_regs",
                                       "scalar_stream"};
#define VARIANT_COUNT (sizeof VARIANTS / sizeof VARIANTS[0])

/* ------------------------------------------------------------------ bad input (host) ---- */

static unsigned char in_buf[4096] __attribute__((aligned(16)));
static unsigned char in2_buf[4096] __attribute__((aligned(16)));
static unsigned char out_buf[4096] __attribute__((aligned(16)));

static void reset_buffers(void) {
    tk_fill_sentinel(in_buf, sizeof in_buf);
    tk_fill_sentinel(in2_buf, sizeof in2_buf);
    tk_fill_sentinel(out_buf, sizeof out_buf);
}

#define EXPECT_REJECTED(call, status, needle)                                                   \
    do {                                                                                        \
        reset_buffers();                                                                        \
        TK_EXPECT_STATUS(call, status, needle);                                                 \
        cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s wrote its output", #call);       \
        cr_assert(tk_is_sentinel(in_buf, sizeof in_buf), "%s wrote its input", #call);          \
        cr_assert(tk_is_sentinel(in2_buf, sizeof in2_buf), "%s wrote its input", #call);        \
    } while (0)

static tk_softmax_params params(tk_dtype dtype, int64_t rows, int64_t cols) {
    tk_softmax_params p = TK_SOFTMAX_PARAMS_INIT;
    p.dtype = dtype;
    p.rows = rows;
    p.cols = cols;
    return p;
}

Test(softmax_args, rejects_bad_arguments) {
    const tk_softmax_params ok = params(TK_BF16, 4, 16);
    tk_softmax_params p;
    EXPECT_REJECTED(tk_softmax_fwd(NULL, in_buf, out_buf, NULL), TK_ERROR_NULL_POINTER, "'p'");
    p = ok; p.size = 8;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->size");
    p = ok; p.dtype = (tk_dtype)5;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->dtype");
    p = ok; p.rows = -1;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->rows");
    p = ok; p.cols = 0;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->cols");
    p = ok; p.cols = -4;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->cols");
    p = ok; p.cols = (INT64_C(1) << 30) + 1;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_NOT_SUPPORTED, "p->cols");
    p = ok; p.x_row_stride = 15;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->x_row_stride");
    p = ok; p.y_row_stride = 3;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->y_row_stride");
    p = ok; p.scale = NAN;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->scale");
    p = ok; p.scale = INFINITY;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->scale");
    p = ok; p.log = 2;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->log");
    p = ok; p.causal = -1;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->causal");
    p = ok; p.causal = 1; p.causal_period = -2;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->causal_period");
    p = ok; p.rows = INT64_MAX / 8;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "overflow");
    EXPECT_REJECTED(tk_softmax_fwd(&ok, NULL, out_buf, NULL), TK_ERROR_NULL_POINTER, "'x'");
    EXPECT_REJECTED(tk_softmax_fwd(&ok, in_buf, NULL, NULL), TK_ERROR_NULL_POINTER, "'y'");
    EXPECT_REJECTED(tk_softmax_bwd(&ok, NULL, in2_buf, out_buf, NULL), TK_ERROR_NULL_POINTER, "'y'");
    EXPECT_REJECTED(tk_softmax_bwd(&ok, in_buf, NULL, out_buf, NULL), TK_ERROR_NULL_POINTER, "'dy'");
    EXPECT_REJECTED(tk_softmax_bwd(&ok, in_buf, in2_buf, NULL, NULL), TK_ERROR_NULL_POINTER, "'dx'");
    p = params(TK_F32, 4, 16);
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf + 2, out_buf, NULL), TK_ERROR_MISALIGNED, "'x'");
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, out_buf + 1, NULL), TK_ERROR_MISALIGNED, "'y'");
    EXPECT_REJECTED(tk_softmax_bwd(&p, in_buf, in2_buf + 2, out_buf, NULL), TK_ERROR_MISALIGNED, "'dy'");
    /* y partly over x; in place with a different row stride; dx partly over dy or y. */
    EXPECT_REJECTED(tk_softmax_fwd(&ok, in_buf, in_buf + 2, NULL), TK_ERROR_OVERLAP, "'y' overlaps 'x'");
    p = ok; p.y_row_stride = 32;
    EXPECT_REJECTED(tk_softmax_fwd(&p, in_buf, in_buf, NULL), TK_ERROR_OVERLAP, "'y' overlaps 'x'");
    EXPECT_REJECTED(tk_softmax_bwd(&ok, in_buf, in2_buf, in2_buf + 4, NULL), TK_ERROR_OVERLAP, "'dx' overlaps 'dy'");
    EXPECT_REJECTED(tk_softmax_bwd(&ok, in_buf, in2_buf, in_buf + 4, NULL), TK_ERROR_OVERLAP, "'dx' overlaps 'y'");
}

Test(softmax_args, empty_is_a_noop) {
    tk_softmax_params p = params(TK_F16, 0, 100);
    TK_EXPECT_STATUS(tk_softmax_fwd(&p, NULL, NULL, NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_softmax_bwd(&p, NULL, NULL, NULL, NULL), TK_SUCCESS, "");
    cr_assert_str_empty(tk_last_error());
}

Test(softmax_args, force_variant_names) {
    for (size_t v = 0; v < VARIANT_COUNT; v++)
        TK_EXPECT_STATUS(tk_experimental_force_variant("softmax", VARIANTS[v]), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax", "vec16"), TK_ERROR_INVALID_VALUE, "\"vec16_regs\"");
    for (size_t v = 0; v < VARIANT_COUNT; v++)
        TK_EXPECT_STATUS(tk_experimental_force_variant("softmax_bwd", VARIANTS[v]), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax_bwd", NULL), TK_SUCCESS, "");
}

/* Forcing op `op` to a variant `name` it lacks fails, naming both, and lists `accepted`. */
static void expect_unknown_variant(const char *op, const char *name, const char *accepted) {
    char needle[96];
    snprintf(needle, sizeof needle, "\"%s\" is not a variant of \"%s\"", name, op);
    TK_EXPECT_STATUS(tk_experimental_force_variant(op, name), TK_ERROR_INVALID_VALUE, needle);
    cr_assert(strstr(tk_last_error(), accepted) != NULL, "%s", tk_last_error());
}

/* Both ops have the same variants, and a name an op lacks is answered with them all. */
Test(softmax_args, ops_list_their_variants) {
    static const char accepted[] =
        "accepted: \"vec16_pipelined\", \"vec16_regs\", \"vec16_stream\", \"scalar_regs\", \"scalar_stream\"";
    expect_unknown_variant("softmax", "vec16_pipeline", accepted);
    expect_unknown_variant("softmax_bwd", "vec16_pipeline", accepted);
}

/* The directions are forced separately: a forward variant does not leak into the backward op. */
Test(softmax_args, directions_force_separately) {
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax", "vec16_pipelined"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax_bwd", "nope"), TK_ERROR_INVALID_VALUE,
                     "not a variant of \"softmax_bwd\"");
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax_bwd", "scalar_stream"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax_bwd", NULL), TK_SUCCESS, "");
}

/* TKERN_FORCE_VARIANT is read once per process, at the first library call; Criterion runs each
 * test in a process of its own, so each of these sets it before its first call. A bad value
 * fails every call that reaches the device, whatever its op, naming the variable and the name. */
static void expect_env_rejected(const char *value, const char *bad_name) {
    cr_assert_eq(setenv("TKERN_FORCE_VARIANT", value, 1), 0);
    const tk_softmax_params ok = params(TK_BF16, 4, 64);
    EXPECT_REJECTED(tk_softmax_fwd(&ok, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "TKERN_FORCE_VARIANT");
    cr_assert(strstr(tk_last_error(), bad_name) != NULL, "\"%s\" does not name %s", tk_last_error(), bad_name);
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_BF16, in_buf, NULL, out_buf, 4, 64, NULL), TK_ERROR_INVALID_VALUE,
                    bad_name);
    tk_device_info info = TK_DEVICE_INFO_INIT;
    TK_EXPECT_STATUS(tk_device_query(&info), TK_ERROR_INVALID_VALUE, "TKERN_FORCE_VARIANT");
}

Test(force_variant_env, unknown_variant_fails_loudly) { expect_env_rejected("softmax=vec16_regz", "\"vec16_regz\""); }

Test(force_variant_env, unknown_backward_variant_fails_loudly) {
    expect_env_rejected("norm=vec16,norm_bwd=vec16_regz", "\"vec16_regz\" of \"norm_bwd\"");
}

Test(force_variant_env, forward_only_variant_of_a_backward_op_fails_loudly) {
    expect_env_rejected("attention=mma_sm80_packed,attention_bwd=mma_sm80_packed",
                        "\"mma_sm80_packed\" of \"attention_bwd\"");
}

Test(force_variant_env, unknown_op_fails_loudly) {
    expect_env_rejected("glu=scalar,sofmax=vec16_regs", "\"sofmax\"");
}

/* The message lists every op, the backward ones too, untruncated. */
Test(force_variant_env, unknown_op_lists_every_op) {
    expect_env_rejected("norm_bwd=vec16,nope_bwd=x",
                        "accepted: \"activation\", \"activation_bwd\", \"glu\", \"glu_bwd\", \"norm\", \"norm_bwd\", "
                        "\"softmax\", \"softmax_bwd\", \"rope\", \"rope_bwd\", \"attention\", \"attention_bwd\", "
                        "\"attention_kvcache\", \"gemm\"");
}

Test(force_variant_env, item_without_a_variant_fails_loudly) {
    expect_env_rejected("softmax=scalar_regs,activation", "\"activation\"");
}

Test(force_variant_env, known_names_pass) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; force_variant_env/null_undoes_the_variable covers it");
    cr_assert_eq(setenv("TKERN_FORCE_VARIANT", "softmax=scalar_stream,,glu=scalar,norm_bwd=wide_scalar,rope_bwd=vec16", 1), 0);
    const tk_softmax_params ok = params(TK_BF16, 4, 64);
    EXPECT_REJECTED(tk_softmax_fwd(&ok, in_buf, out_buf, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
}

/* tk_experimental_force_variant(op, NULL) returns the thread to automatic selection, whatever the
 * variable forces. */
Test(force_variant_env, null_undoes_the_variable) {
    cr_assert_eq(setenv("TKERN_FORCE_VARIANT", "softmax=vec16_regs", 1), 0);
    TK_REQUIRE_GPU();
    const tk_softmax_params p = params(TK_BF16, 4, 4096);
    const size_t bytes = (size_t)(4 * 4096 + 8) * 2;
    unsigned char *buf = tk_dev_alloc(bytes);
    tk_dev_poison(buf, bytes);
    void *x = buf + 2; /* 2-byte aligned rows: not for vec16_regs */
    TK_EXPECT_STATUS(tk_softmax_fwd(&p, x, x, NULL), TK_ERROR_NOT_SUPPORTED, "forced variant \"vec16_regs\"");
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_softmax_fwd(&p, x, x, NULL), TK_SUCCESS, "");
    cr_assert_str_eq(tk_last_variant(), "scalar_regs");
    tk_dev_sync();
    tk_dev_free(buf);
}

/* ------------------------------------------------------------------------ GPU checks ---- */

typedef struct sm_case {
    tk_dtype dtype;
    int64_t rows, cols, x_pad, y_pad;
    float scale;
    int log, causal;
    int64_t offset, period;
    bool backward, in_place;
    int misalign;           /* elements every pointer is shifted by */
    const char *variant;
} sm_case;

/* "vec16_pipelined" needs a cc >= 9.0 device and code of the build that runs on it (the
 * runtime's rule: min_cc 900, not arch-specific). */
static bool pipelined_runs_here(void) {
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    return tk_build_runs_variant(900, info.compute_capability);
}

static bool variant_claims(const sm_case *c, const char *variant) {
    const size_t es = tk_test_dtype_size(c->dtype);
    const int64_t pack = 16 / (int64_t)es;
    const bool regs = strstr(variant, "_regs") != NULL, vec = strncmp(variant, "vec16", 5) == 0;
    const int64_t regs_max = 1024 * (c->backward ? 2 : 4) * (vec ? pack : 1);
    if (regs && c->cols > regs_max)
        return false;
    /* pipelined: rows whose whole 16-byte packs hold 64 to 512 KB, either direction */
    const int64_t whole_bytes = c->cols / pack * 16;
    if (strcmp(variant, "vec16_pipelined") == 0 &&
        (whole_bytes < 65536 || whole_bytes > 524288 || !pipelined_runs_here()))
        return false;
    if (!vec)
        return true;
    const int64_t xs = c->cols + c->x_pad, ys = c->in_place ? xs : c->cols + c->y_pad;
    return c->misalign == 0 && (c->rows == 1 || (xs % pack == 0 && ys % pack == 0));
}

/* Runs one case; the output buffer is poisoned (NaN) and positions outside the rows must stay
 * NaN. Backward inputs are y = the rounded fp64 forward output of random x, dy random. */
static void run_case(const sm_case *c, tk_rng *rng) {
    const size_t es = tk_test_dtype_size(c->dtype);
    tk_softmax_params p = params(c->dtype, c->rows, c->cols);
    p.x_row_stride = c->cols + c->x_pad;
    p.y_row_stride = c->in_place ? p.x_row_stride : c->cols + c->y_pad;
    p.scale = c->scale;
    p.log = c->log;
    p.causal = c->causal;
    p.causal_offset = c->offset;
    p.causal_period = c->period;
    /* Forward: in = x (x stride), out = y (y stride). Backward: in = y, dy (y stride), out = dx. */
    const int64_t in_stride = c->backward ? p.y_row_stride : p.x_row_stride;
    const int64_t out_stride = c->backward ? p.x_row_stride : p.y_row_stride;
    const int64_t in_n = c->rows * in_stride + c->misalign, out_n = c->rows * out_stride + c->misalign;
    unsigned char *h_in = malloc((size_t)in_n * es), *h_dy = malloc((size_t)in_n * es);
    unsigned char *h_out = malloc((size_t)out_n * es);
    double *row_x = malloc((size_t)c->cols * sizeof(double)), *row_y = malloc((size_t)c->cols * sizeof(double));
    double *row_dy = malloc((size_t)c->cols * sizeof(double)), *ref = malloc((size_t)out_n * sizeof(double));
    cr_assert(h_in && h_dy && h_out && row_x && row_y && row_dy && ref);
    tk_fill_uniform(rng, c->dtype, h_in, in_n, -5.0, 5.0);
    tk_fill_uniform(rng, c->dtype, h_dy, in_n, -1.0, 1.0);
    for (int64_t i = 0; i < out_n; i++)
        ref[i] = NAN; /* not to be written (padding, misalignment) */
    double max_abs = 0.0;
    for (int64_t r = 0; r < c->rows; r++) {
        const int64_t len = ref_softmax_visible(&p, r), in_base = c->misalign + r * in_stride;
        for (int64_t j = 0; j < c->cols; j++)
            row_x[j] = tk_test_load(c->dtype, h_in, in_base + j);
        if (c->backward) { /* y: a real (log-)softmax output, rounded to dtype, then written as input */
            ref_softmax_row(row_x, c->cols, len, c->scale, c->log, row_y);
            for (int64_t j = 0; j < c->cols; j++) {
                tk_test_store(c->dtype, h_in, in_base + j, row_y[j]);
                row_y[j] = tk_test_load(c->dtype, h_in, in_base + j);
                row_dy[j] = tk_test_load(c->dtype, h_dy, in_base + j);
            }
            ref_softmax_bwd_row(row_y, row_dy, c->cols, len, c->scale, c->log, ref + c->misalign + r * out_stride);
        } else {
            ref_softmax_row(row_x, c->cols, len, c->scale, c->log, ref + c->misalign + r * out_stride);
        }
        for (int64_t j = 0; j < c->cols; j++) {
            const double v = ref[c->misalign + r * out_stride + j];
            if (isfinite(v) && fabs(v) > max_abs)
                max_abs = fabs(v);
        }
    }
    unsigned char *d_in = tk_dev_alloc((size_t)in_n * es), *d_dy = tk_dev_alloc((size_t)in_n * es);
    unsigned char *d_out = c->in_place ? (c->backward ? d_dy : d_in) : tk_dev_alloc((size_t)out_n * es);
    tk_to_dev(d_in, h_in, (size_t)in_n * es);
    tk_to_dev(d_dy, h_dy, (size_t)in_n * es);
    if (!c->in_place)
        tk_dev_poison(d_out, (size_t)out_n * es);
    const size_t off = (size_t)c->misalign * es;
    const char *op = c->backward ? "softmax_bwd" : "softmax";
    cr_assert_eq(tk_experimental_force_variant(op, c->variant), TK_SUCCESS);
    const tk_status s = c->backward ? tk_softmax_bwd(&p, d_in + off, d_dy + off, d_out + off, NULL)
                                    : tk_softmax_fwd(&p, d_in + off, d_out + off, NULL);
    char what[320];
    snprintf(what, sizeof what,
             "softmax %s %s %lldx%lld pads %lld/%lld scale %g log %d causal %d offset %lld period %lld "
             "in_place %d misalign %d variant %s",
             c->backward ? "bwd" : "fwd", tk_test_dtype_name(c->dtype), (long long)c->rows, (long long)c->cols,
             (long long)c->x_pad, (long long)c->y_pad, (double)c->scale, c->log, c->causal, (long long)c->offset,
             (long long)c->period, c->in_place, c->misalign, c->variant);
    cr_assert_eq(s, TK_SUCCESS, "%s: %s", what, tk_last_error());
    cr_assert_str_eq(tk_last_variant(), c->variant, "%s ran %s", what, tk_last_variant());
    tk_dev_sync();
    tk_to_host(h_out, d_out, (size_t)out_n * es);
    cr_assert_eq(tk_experimental_force_variant(op, NULL), TK_SUCCESS);

    /* Scale of the absolute tolerance: probabilities are checked relative to themselves down to
     * f16's subnormal range, log-probabilities relative to 1 + |ref|, gradients relative to
     * their largest size (they come from a difference, dy - sum). */
    const double atol = c->backward ? max_abs : c->log ? 1.0 : (c->dtype == TK_F16 ? 1e-4 : 1e-6);
    const double rtol = tk_default_rtol(c->dtype), floor = tk_subnormal_half_step(c->dtype);
    for (int64_t i = 0; i < out_n; i++) {
        const double g = tk_test_load(c->dtype, h_out, i);
        if (isnan(ref[i])) {
            if (!c->in_place)
                cr_assert(isnan(g), "%s: wrote position %lld outside the output", what, (long long)i);
            continue;
        }
        if (isinf(ref[i])) {
            cr_assert(g == ref[i], "%s: position %lld got %.9g, expected %g", what, (long long)i, g, ref[i]);
            continue;
        }
        cr_assert(fabs(g - ref[i]) <= rtol * (atol + fabs(ref[i])) + floor,
                  "%s: position %lld (row %lld) got %.9g, reference %.9g", what, (long long)i,
                  (long long)((i - c->misalign) / out_stride), g, ref[i]);
    }
    tk_dev_free(d_in);
    tk_dev_free(d_dy);
    if (!c->in_place)
        tk_dev_free(d_out);
    free(h_in); free(h_dy); free(h_out); free(row_x); free(row_y); free(row_dy); free(ref);
}

/* A test shape: everything of an sm_case but the dtype, direction and variant. */
typedef struct {
    int64_t rows, cols, x_pad, y_pad;
    float scale;
    int log, causal;
    int64_t offset, period;
    bool in_place;
    int misalign;
} sm_shape;

static sm_case shape_case(const sm_shape *s, tk_dtype dtype, bool backward, const char *variant) {
    return (sm_case){dtype, s->rows, s->cols, s->x_pad, s->y_pad, s->scale, s->log, s->causal,
                     s->offset, s->period, backward, s->in_place, s->misalign, variant};
}

static void run_all(bool backward) {
    tk_rng rng = tk_rng_seeded(backward ? 32 : 31);
    const sm_shape shapes[] = {
        {1, 1, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},
        {5, 7, 0, 0, 0.5f, 0, 0, 0, 0, false, 0},
        {1, 7, 0, 0, -1.5f, 1, 0, 0, 0, false, 0},
        {3, 4097, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},
        {1, 4097, 0, 0, 0.125f, 1, 0, 0, 0, false, 0},
        {9, 3584, 8, 16, 2.0f, 0, 0, 0, 0, false, 0},
        {6, 1000, 24, 24, 1.0f, 1, 0, 0, 0, true, 0},
        {40, 64, 0, 0, 1.0f, 0, 0, 0, 0, true, 0},
        {5, 13, 3, 3, 1.0f, 0, 0, 0, 0, false, 0},     /* padded rows: a partial last pack */
        {4, 1001, 7, 7, 1.0f, 1, 1, 995, 0, false, 0},
        {12, 96, 0, 0, 0.7f, 0, 1, 2, 6, false, 0},      /* two 6-row matrices, bottom-right-ish */
        {12, 96, 0, 8, 0.7f, 1, 1, -3, 6, false, 0},     /* rows 0..2 of each matrix see nothing */
        {8, 300, 0, 0, 1.0f, 0, 1, 290, 0, false, 0},   /* the mask ends inside the last packs */
        {4, 20000, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},
        {3, 131072, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},
        {2, 131072, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},
        {2, 140001, 3, 0, 1.0f, 0, 1, 100000, 0, false, 0},
        {3, 777, 1, 5, 1.0f, 0, 0, 0, 0, false, 1},     /* every pointer 2 bytes off */
        {2, 33000, 0, 0, 1.0f, 1, 1, 20000, 0, false, 1},
        /* rows of just over 512 threads (bf16 forward), a partial last pack with padded strides,
         * causal rows of several matrices, in-place log-softmax with rows that see nothing */
        {3, 16392, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},
        {3, 16389, 3, 11, 0.5f, 1, 0, 0, 0, false, 0},
        {6, 50000, 0, 0, 1.0f, 0, 1, 20000, 3, false, 0},
        {4, 65536, 0, 0, 1.0f, 1, 1, -2, 2, true, 0},
        /* more rows than the stream kernel has blocks (a block streams several rows): rows that
         * see nothing or little, nearly whole rows */
        {300, 2003, 5, 5, 1.0f, 0, 1, -100, 150, false, 0},
        {300, 2003, 0, 0, 0.7f, 1, 1, 1850, 300, false, 0},
    };
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t v = 0; v < VARIANT_COUNT; v++) {
                if (shapes[s].misalign && DTYPES[d] == TK_F32)
                    continue; /* f32 needs 4-byte alignment; a 2-byte shift is rejected */
                sm_case c = shape_case(&shapes[s], DTYPES[d], backward, VARIANTS[v]);
                if (!variant_claims(&c, VARIANTS[v]))
                    continue;
                run_case(&c, &rng);
            }
}

Test(softmax_gpu, forward_all_variants_dtypes_shapes, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_all(false);
}

Test(softmax_gpu, backward_all_variants_dtypes_shapes, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_all(true);
}

/* vec16_pipelined's slices as the L2 budget sets them (rows of 64 to 512 KB on one block, or a
 * cluster of 2 or 4 blocks, 128 KB or less each): 64 KB and the widest one-block row, just past
 * 128 and 256 KB, a partial last slice with a cols % Vec tail, causal masks that end on either
 * side of a slice boundary or leave rows with nothing visible, in place, more rows than clusters
 * fit on the device (rows follow one another in a cluster). At least 81 rows, so that twice the
 * blocks would not fit beside each other on a device of fewer than 162 SMs and the launcher
 * keeps the budget's; fewer rows spread over more blocks (pipelined_few_rows below). */
static void run_shapes(const char *variant, tk_dtype dtype, bool backward, const sm_shape *shapes, size_t count,
                       uint64_t seed) {
    tk_rng rng = tk_rng_seeded(seed);
    for (size_t s = 0; s < count; s++) {
        sm_case c = shape_case(&shapes[s], dtype, backward, variant);
        cr_assert(variant_claims(&c, c.variant), "shape %zu is not a %s shape", s, variant);
        run_case(&c, &rng);
    }
}

/* A test of an sm_90 variant: its shapes where it runs, on a cc >= 9.0 device. */
#define RUN_SM90(variant, dtype, backward, shapes, seed)                                                               \
    do {                                                                                                               \
        TK_REQUIRE_GPU();                                                                                              \
        if (pipelined_runs_here())                                                                                     \
            run_shapes(variant, dtype, backward, shapes, sizeof shapes / sizeof shapes[0], seed);                      \
    } while (0)
#define RUN_PIPELINED(dtype, backward, shapes, seed) RUN_SM90("vec16_pipelined", dtype, backward, shapes, seed)

static const sm_shape pipelined_shapes_f32[] = {
    {81, 16384, 0, 0, 1.0f, 0, 0, 0, 0, false, 0}, /* 64 KB: one block, two chunks */
    {81, 20001, 3, 3, 1.0f, 1, 1, 5000, 0, false, 0}, /* one block, tail of 1, causal */
    {81, 32771, 1, 1, 1.0f, 0, 0, 0, 0, false, 0}, /* 128 KB + tail of 3: the widest one-block row */
    {81, 32772, 0, 0, 1.0f, 1, 0, 0, 0, false, 0}, /* just past 128 KB: 2 blocks */
    {81, 65540, 0, 0, 1.0f, 0, 0, 0, 0, false, 0}, /* just past 256 KB: 4097 packs a block */
    {81, 100003, 1, 1, 0.5f, 1, 0, 0, 0, false, 0}, /* slices of 25000 + tail of 3 */
    {81, 131072, 0, 0, 1.0f, 0, 1, 32760, 8, false, 0}, /* lens 32761..32768: rank 1 sees none */
    {81, 131072, 0, 0, 1.0f, 1, 1, 65530, 8, false, 0}, /* lens 65531..65538 around rank 2 */
    {81, 131072, 0, 0, 1.0f, 1, 1, -3, 6, true, 0}, /* rows r % 6 < 3 see nothing, in place */
    {81, 120004, 0, 4, -0.7f, 0, 0, 0, 0, false, 0}, /* partial last slice, padded y */
    {300, 131072, 0, 0, 1.0f, 1, 1, -100, 150, false, 0}, /* rows > clusters, empty rows */
};

Test(softmax_gpu, pipelined_slices_f32, .timeout = 600) { RUN_PIPELINED(TK_F32, false, pipelined_shapes_f32, 33); }

/* The same for bf16 and f16 (8 elements a pack). */
static const sm_shape pipelined_shapes_16[] = {
    {81, 32768, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},       /* 64 KB: one block, two chunks */
    {81, 40003, 5, 5, 0.5f, 1, 1, 9000, 0, false, 0},    /* one block, tail of 3, causal */
    {81, 65543, 1, 1, 1.0f, 0, 0, 0, 0, false, 0},       /* 128 KB + tail of 7: the widest one-block row */
    {81, 65544, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},       /* just past 128 KB: 2 blocks */
    {81, 131072, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},      /* 256 KB: 2 slices of 8192 packs */
    {81, 131080, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},      /* just past 256 KB: 4 blocks */
    {81, 200003, 5, 5, 0.5f, 1, 0, 0, 0, false, 0},      /* 4 slices of 6250 packs + tail of 3 */
    {81, 131072, 0, 0, 1.0f, 0, 1, 65528, 8, false, 0},  /* lens 65529..65536: rank 1 sees none */
    {81, 262144, 0, 0, 1.0f, 1, 1, 131066, 8, false, 0}, /* lens 131067..131074 around rank 2 */
    {81, 131072, 0, 0, 1.0f, 1, 1, -3, 6, true, 0},      /* rows r % 6 < 3 see nothing, in place */
    {81, 240008, 0, 8, -0.7f, 0, 0, 0, 0, false, 0},     /* partial last slice, padded y */
    {300, 131072, 0, 0, 1.0f, 1, 1, -100, 150, false, 0}, /* rows > clusters, empty rows */
};

Test(softmax_gpu, pipelined_slices_bf16, .timeout = 600) { RUN_PIPELINED(TK_BF16, false, pipelined_shapes_16, 34); }

Test(softmax_gpu, pipelined_slices_f16, .timeout = 600) { RUN_PIPELINED(TK_F16, false, pipelined_shapes_16, 35); }

/* The backward's slices. The log-softmax backward splits a row as the forward does (it keeps dy
 * alone in L2); the softmax backward keeps y and dy, so it splits a row over twice the blocks,
 * up to clusters of 8. B: blocks per row, P softmax, L log-softmax. f32 (4 elements a pack;
 * slices of 64 KB of each tensor for P, 128 KB for L): */
static const sm_shape pipelined_bwd_shapes_f32[] = {
    {81, 16384, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},          /* P B1: 64 KB, the widest one-block row */
    {81, 20001, 3, 3, 1.0f, 1, 1, 5000, 0, false, 0},       /* L B1, tail of 1, causal */
    {81, 20001, 3, 3, 1.0f, 0, 1, 5000, 0, false, 0},       /* P B2, tail of 1: rank 1 sees none */
    {81, 32771, 1, 1, 1.0f, 1, 0, 0, 0, false, 0},          /* L B1: 128 KB + tail of 3 */
    {81, 32772, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},          /* P B4: just past 128 KB */
    {81, 65540, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},          /* L B4: just past 256 KB */
    {81, 65540, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},          /* P B8 */
    {81, 100003, 1, 1, 0.5f, 0, 0, 0, 0, false, 0},         /* P B8, slices of 3125 packs + tail of 3 */
    {81, 131072, 0, 0, 1.0f, 0, 1, 65530, 8, false, 0},     /* P B8: lens 65531..65538 around rank 4 */
    {81, 131072, 0, 0, 1.0f, 1, 1, 32760, 8, false, 0},     /* L B4: lens 32761..32768, rank 1 sees none */
    {81, 131072, 0, 0, 1.0f, 1, 1, -3, 6, true, 0},         /* L B4: rows r % 6 < 3 see nothing, dx = dy */
    {81, 131072, 0, 0, 2.0f, 0, 1, -2, 5, true, 0},         /* P B8: rows r % 5 < 2 see nothing, dx = dy */
    {81, 120004, 0, 4, -0.7f, 0, 0, 0, 0, false, 0},        /* P B8: partial last slice, padded y */
    {301, 131072, 0, 0, 1.0f, 0, 1, -100, 150, false, 0},  /* P B8: rows > clusters, empty rows */
    {299, 131072, 0, 0, 0.7f, 1, 1, 65530, 150, false, 0}, /* L B4: rows > clusters */
};

/* bf16 and f16 (8 elements a pack). */
static const sm_shape pipelined_bwd_shapes_16[] = {
    {81, 32768, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},           /* P B1: 64 KB, 4 chunks */
    {81, 32768, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},           /* L B1 */
    {81, 40003, 5, 5, 0.5f, 0, 1, 9000, 0, false, 0},        /* P B2, tail of 3: rank 1 sees none */
    {81, 65543, 1, 1, 1.0f, 1, 0, 0, 0, false, 0},           /* L B1: 128 KB + tail of 7 */
    {81, 65543, 1, 1, 1.0f, 0, 0, 0, 0, false, 0},           /* P B2 */
    {81, 65544, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},           /* L B2: just past 128 KB */
    {81, 131072, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},          /* P B4: 4 slices of 4096 packs */
    {81, 131080, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},          /* P B8: just past 256 KB */
    {81, 200003, 5, 5, 0.5f, 1, 0, 0, 0, false, 0},          /* L B4 + tail of 3 */
    {81, 200003, 5, 5, 0.5f, 0, 0, 0, 0, false, 0},          /* P B8 + tail of 3 */
    {81, 262144, 0, 0, 1.0f, 0, 1, 131066, 8, false, 0},     /* P B8: lens 131067..131074 around rank 4 */
    {81, 262144, 0, 0, 1.0f, 1, 1, 131066, 8, false, 0},     /* L B4: the same around rank 2 */
    {81, 131072, 0, 0, 1.0f, 1, 1, -3, 6, true, 0},          /* L B2: rows r % 6 < 3 see nothing, dx = dy */
    {81, 131072, 0, 0, 2.0f, 0, 1, -2, 5, true, 0},          /* P B4: rows r % 5 < 2 see nothing, dx = dy */
    {81, 240008, 0, 8, -0.7f, 0, 0, 0, 0, false, 0},         /* P B8: partial last slice, padded y */
    {301, 131072, 0, 0, 1.0f, 1, 1, -100, 150, false, 0},   /* L B2: rows > clusters, empty rows */
    {299, 131072, 0, 0, 0.7f, 0, 1, 65530, 150, false, 0},  /* P B4: rows > clusters */
};

Test(softmax_gpu, pipelined_bwd_slices_f32, .timeout = 600) {
    RUN_PIPELINED(TK_F32, true, pipelined_bwd_shapes_f32, 36);
}

Test(softmax_gpu, pipelined_bwd_slices_bf16, .timeout = 600) {
    RUN_PIPELINED(TK_BF16, true, pipelined_bwd_shapes_16, 37);
}

Test(softmax_gpu, pipelined_bwd_slices_f16, .timeout = 600) {
    RUN_PIPELINED(TK_F16, true, pipelined_bwd_shapes_16, 38);
}

/* Few rows: while twice the blocks per row fit the SMs and the device holds every row's cluster
 * of them at once, a row takes twice the blocks, down to slices of 16 KB, up to the largest
 * cluster the device schedules. The blocks noted are an H200's (132 SMs, clusters of up to 16
 * with the non-portable opt-in; 8 rows take 16 blocks where 8 such clusters are resident, else 8):
 * one 16-block row, a row widened from one block to a cluster, 16 rows that stop at 8 blocks,
 * 40 that stop at 2, causal rows whose lengths end around a slice boundary or in the first
 * slice (the other ranks see none) or see nothing at all, a partial last slice with a cols % Vec
 * tail, in place; slices of one chunk (a widened row's slice of at most 32 KB forward, 16 KB a
 * tensor backward, whose pass 2 computes from pass 1's registers) with a tail and causal lengths
 * that end in it or just before it. Softmax forward, f32 (4 elements a pack): */
static const sm_shape few_rows_f32[] = {
    {1, 131072, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},         /* B16: slices of 2048 packs */
    {1, 131072, 0, 0, 1.0f, 1, 1, 8190, 1, false, 0},      /* B16, len 8191: ranks 1..15 see none */
    {1, 131072, 0, 0, 1.0f, 0, 1, -1, 1, false, 0},        /* B16, len 0: no rank sees anything */
    {1, 16384, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},          /* 64 KB: B4 (one block by the budget) */
    {4, 65540, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},          /* B16: 1025 packs a block, the last 1010 */
    {8, 131072, 0, 0, 1.0f, 0, 1, 32764, 8, false, 0},     /* B16: lens 32765..32772 around rank 4 (B8: 2) */
    {3, 100003, 1, 1, 0.5f, 1, 0, 0, 0, true, 0},          /* B16: 1563 packs a block + tail of 3, in place */
    {2, 120004, 0, 4, -0.7f, 0, 0, 0, 0, false, 0},        /* B16: partial last slice, padded y */
    {16, 131072, 0, 0, 1.0f, 1, 1, -3, 16, false, 0},      /* B8: rows 0..2 see nothing */
    {40, 16384, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},         /* B2 */
    {2, 131075, 1, 1, 1.0f, 0, 1, 131072, 2, false, 0},    /* B16, one chunk + tail of 3: lens 131073..131074 */
};

/* bf16 and f16 (8 elements a pack). */
static const sm_shape few_rows_16[] = {
    {1, 131072, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},         /* B16: slices of 1024 packs */
    {1, 32768, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},          /* 64 KB: B4 */
    {1, 262144, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},         /* 512 KB: B16, slices of 2048 packs */
    {3, 131080, 0, 0, 1.0f, 0, 1, 8198, 3, false, 0},      /* B16, 1025 packs: lens 8199..8201 around rank 1 */
    {8, 131072, 0, 0, 1.0f, 1, 1, 16380, 8, false, 0},     /* B16: lens 16381..16388 around rank 2 (B8: 1) */
    {2, 240008, 0, 8, -0.7f, 0, 0, 0, 0, false, 0},        /* B16: partial last slice, padded y */
    {16, 131072, 0, 0, 1.0f, 0, 1, -3, 16, true, 0},       /* B8: rows 0..2 see nothing, in place */
    {40, 32768, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},         /* B2 */
    {2, 131077, 3, 3, 1.0f, 1, 1, 131072, 2, false, 0},    /* B16, one chunk + tail of 5: lens 131073..131074 */
};

/* Backward (P softmax, L log-softmax; the softmax backward's budget is twice the blocks), f32: */
static const sm_shape few_rows_bwd_f32[] = {
    {1, 131072, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},         /* P B16 */
    {1, 131072, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},         /* L B16 */
    {1, 16384, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},          /* P B4 (one block by the budget) */
    {4, 20001, 3, 3, 1.0f, 1, 1, 5000, 4, false, 0},       /* L B4, tail of 1: lens 5001..5004, rank 1 */
    {8, 131072, 0, 0, 1.0f, 0, 1, 65530, 8, false, 0},     /* P B16: lens 65531..65538 around rank 8 (B8: 4) */
    {8, 131072, 0, 0, 1.0f, 1, 1, -2, 8, true, 0},         /* L B16: rows 0..1 see nothing, dx = dy */
    {2, 120004, 0, 4, -0.7f, 0, 0, 0, 0, false, 0},        /* P B16: partial last slice, padded y */
    {40, 16384, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},         /* L B2 */
    {2, 65539, 1, 1, 1.0f, 1, 1, 65536, 2, false, 0},      /* L B16, one chunk + tail of 3: lens 65537..65538 */
    {3, 65539, 1, 1, 0.5f, 0, 1, 65530, 3, false, 0},      /* P B16, one chunk: lens 65531..65533, tail masked */
};

/* bf16 and f16. */
static const sm_shape few_rows_bwd_16[] = {
    {1, 131072, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},         /* P B16: slices of 1024 packs */
    {1, 262144, 0, 0, 1.0f, 1, 0, 0, 0, false, 0},         /* L B16 */
    {8, 262144, 0, 0, 1.0f, 0, 1, 16380, 8, false, 0},     /* P B16: lens 16381..16388 around rank 1 */
    {2, 240008, 0, 8, -0.7f, 0, 0, 0, 0, false, 0},        /* P B16: partial last slice, padded y */
    {5, 40003, 5, 5, 0.5f, 0, 1, 9000, 0, false, 0},       /* P B4, tail of 3: ranks 1..3 see none */
    {40, 32768, 0, 0, 1.0f, 0, 0, 0, 0, false, 0},         /* P B2 (one block by the budget) */
    {2, 131077, 3, 3, 1.0f, 1, 1, 131072, 2, false, 0},    /* L B16, one chunk + tail of 5: lens 131073..131074 */
    {3, 131077, 3, 3, 0.7f, 0, 1, 131068, 3, false, 0},    /* P B16, one chunk: lens 131069..131071, tail masked */
};

Test(softmax_gpu, pipelined_few_rows_f32, .timeout = 600) { RUN_PIPELINED(TK_F32, false, few_rows_f32, 39); }
Test(softmax_gpu, pipelined_few_rows_bf16, .timeout = 600) { RUN_PIPELINED(TK_BF16, false, few_rows_16, 40); }
Test(softmax_gpu, pipelined_few_rows_f16, .timeout = 600) { RUN_PIPELINED(TK_F16, false, few_rows_16, 41); }
Test(softmax_gpu, pipelined_few_rows_bwd_f32, .timeout = 600) { RUN_PIPELINED(TK_F32, true, few_rows_bwd_f32, 42); }
Test(softmax_gpu, pipelined_few_rows_bwd_bf16, .timeout = 600) { RUN_PIPELINED(TK_BF16, true, few_rows_bwd_16, 43); }
Test(softmax_gpu, pipelined_few_rows_bwd_f16, .timeout = 600) { RUN_PIPELINED(TK_F16, true, few_rows_bwd_16, 44); }

/* tk_softmax_fwd in place over rows x cols of dtype, `misalign` elements into a fresh poisoned
 * allocation; its status, with the call's variant and error left to read. */
static tk_status fwd_in_place(tk_dtype dtype, int64_t rows, int64_t cols, int misalign) {
    const size_t es = tk_test_dtype_size(dtype);
    const size_t bytes = (size_t)(rows * cols + 8) * es;
    unsigned char *buf = tk_dev_alloc(bytes);
    tk_dev_poison(buf, bytes);
    const tk_softmax_params p = params(dtype, rows, cols);
    void *x = buf + (size_t)misalign * es;
    const tk_status status = tk_softmax_fwd(&p, x, x, NULL);
    tk_dev_sync();
    tk_dev_free(buf);
    return status;
}

/* The automatic choice, and a forced variant that cannot run the call. vec16_pipelined takes the
 * rows of 64 to 512 KB of whole packs however many blocks they run on (one to 16: few rows are
 * widened, and 17 rows of 256 KB are too many to widen on a device of fewer than 272 SMs). */
Test(softmax_gpu, automatic_choice) {
    TK_REQUIRE_GPU();
    const char *long_rows = pipelined_runs_here() ? "vec16_pipelined" : "vec16_stream";
    /* 64 KB rows: 32768 16-bit or 16384 f32 columns */
    const char *rows_64k = pipelined_runs_here() ? "vec16_pipelined" : "vec16_regs";
    const struct { tk_dtype dtype; int64_t rows, cols; int misalign; const char *expect; } cases[] = {
        {TK_BF16, 64, 4096, 0, "vec16_regs"}, {TK_BF16, 4, 32760, 0, "vec16_regs"},
        {TK_BF16, 4, 32768, 0, rows_64k}, {TK_BF16, 2, 131072, 0, long_rows},
        {TK_F32, 4, 8192, 0, "vec16_regs"}, {TK_F32, 4, 32768, 0, long_rows},
        {TK_F32, 2, 131072, 0, long_rows}, {TK_F32, 1, 140000, 0, "vec16_stream"},
        {TK_BF16, 1, 262160, 0, "vec16_stream"},
        /* both ends of the one-block pipelined rows (64 to 128 KB) */
        {TK_F32, 4, 16384, 0, rows_64k}, {TK_F32, 1, 32771, 0, long_rows},
        {TK_F16, 4, 32768, 0, rows_64k}, {TK_F16, 1, 65543, 0, long_rows},
        {TK_BF16, 4, 4096, 1, "scalar_regs"}, {TK_F16, 2, 70000, 1, "scalar_stream"},
        /* 512 KB rows (16 blocks), one with a tail of 7, 480 KB and one pack, a decode row of 256
         * KB widened from 8 blocks to 16 */
        {TK_BF16, 3, 262144, 0, long_rows}, {TK_F16, 1, 262151, 0, long_rows},
        {TK_F32, 2, 122884, 0, long_rows}, {TK_BF16, 1, 131072, 0, long_rows},
        {TK_F16, 1, 131072, 0, long_rows},
        /* 256 KB rows too many to widen (B8), 480 KB (B15),
         * 384 KB (B12: 24 would pass 16), 256 KB less one pack (B8: 16 would leave slices under
         * 16 KB), 64 KB (B2 for 67 rows, widened to 4 for one) */
        {TK_BF16, 17, 131072, 0, long_rows}, {TK_F32, 17, 65536, 0, long_rows},
        {TK_BF16, 1, 245760, 0, long_rows}, {TK_F32, 2, 98304, 0, long_rows},
        {TK_BF16, 1, 131064, 0, long_rows}, {TK_BF16, 67, 32768, 0, rows_64k},
        {TK_F32, 1, 16384, 0, rows_64k},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TK_EXPECT_STATUS(fwd_in_place(cases[i].dtype, cases[i].rows, cases[i].cols, cases[i].misalign), TK_SUCCESS,
                         "");
        cr_assert_str_eq(tk_last_variant(), cases[i].expect, "case %zu ran %s", i, tk_last_variant());
    }
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax", "vec16_regs"), TK_SUCCESS, "");
    void *buf = tk_dev_alloc(1 << 20);
    tk_dev_poison(buf, 1 << 20);
    tk_softmax_params p = params(TK_BF16, 1, 100000);
    TK_EXPECT_STATUS(tk_softmax_fwd(&p, buf, buf, NULL), TK_ERROR_NOT_SUPPORTED, "forced variant \"vec16_regs\"");
    /* Forcing the forward op leaves the backward's automatic choice (the pipelined kernel for
     * these 256 KB rows, as forward); forcing "softmax_bwd" a variant that cannot run the call
     * fails. */
    p = params(TK_F32, 1, 65540);
    unsigned char *dy = (unsigned char *)buf + 262160, *dx = (unsigned char *)buf + 524320;
    TK_EXPECT_STATUS(tk_softmax_bwd(&p, buf, dy, dx, NULL), TK_SUCCESS, "");
    cr_assert_str_eq(tk_last_variant(), long_rows);
    TK_EXPECT_STATUS(tk_experimental_force_variant("softmax_bwd", "vec16_regs"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_softmax_bwd(&p, buf, dy, dx, NULL), TK_ERROR_NOT_SUPPORTED,
                     "forced variant \"vec16_regs\" of \"softmax_bwd\"");
    tk_experimental_force_variant("softmax", NULL);
    tk_experimental_force_variant("softmax_bwd", NULL);
    tk_dev_sync();
    tk_dev_free(buf);
}

/* The backward's automatic choice: the pipelined kernel takes the forward's widths (64 to
 * 512 KB of whole packs), the registers kernel rows of up to half the forward's, the stream
 * the rest. */
Test(softmax_gpu, automatic_choice_backward) {
    TK_REQUIRE_GPU();
    const char *long_rows = pipelined_runs_here() ? "vec16_pipelined" : "vec16_stream";
    const struct { tk_dtype dtype; int64_t rows, cols; int log; const char *expect; } cases[] = {
        {TK_BF16, 64, 4096, 0, "vec16_regs"},   {TK_BF16, 4, 16384, 1, "vec16_regs"},
        {TK_BF16, 4, 16392, 0, "vec16_stream"}, {TK_BF16, 4, 32768, 0, long_rows},
        {TK_BF16, 2, 131072, 1, long_rows},     {TK_BF16, 1, 262144, 0, long_rows},
        {TK_BF16, 1, 262160, 1, "vec16_stream"}, {TK_F16, 1, 65543, 0, long_rows},
        {TK_F32, 4, 16384, 1, long_rows},        {TK_F32, 1, 131075, 0, long_rows},
        {TK_F32, 1, 131076, 0, "vec16_stream"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const size_t es = tk_test_dtype_size(cases[i].dtype);
        const size_t bytes = (size_t)(cases[i].rows * cases[i].cols) * es;
        unsigned char *y = tk_dev_alloc(bytes), *dy = tk_dev_alloc(bytes);
        tk_dev_poison(y, bytes);
        tk_dev_poison(dy, bytes);
        tk_softmax_params p = params(cases[i].dtype, cases[i].rows, cases[i].cols);
        p.log = cases[i].log;
        TK_EXPECT_STATUS(tk_softmax_bwd(&p, y, dy, dy, NULL), TK_SUCCESS, "");
        cr_assert_str_eq(tk_last_variant(), cases[i].expect, "case %zu ran %s", i, tk_last_variant());
        tk_dev_sync();
        tk_dev_free(y);
        tk_dev_free(dy);
    }
}

/* Every in-place mode the header allows (forward y = x, backward dx = y and dx = dy), bit for
 * bit against the same call out of place, for every variant that takes the shape. */
Test(softmax_gpu, in_place_matches_out_of_place, .timeout = 300) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(33);
    const struct { int64_t rows, cols; } shapes[] = {{8, 1000}, {3, 20000}, {2, 70000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t d = 0; d < 3; d++)
            for (size_t v = 0; v < VARIANT_COUNT; v++)
                for (int mode = 0; mode < 6; mode++) {
                    const tk_dtype dtype = DTYPES[d];
                    const bool backward = mode % 3 > 0;
                    tk_softmax_params p = params(dtype, shapes[s].rows, shapes[s].cols);
                    p.log = mode / 3; /* each mode with the softmax and the log-softmax */
                    const int64_t n = p.rows * p.cols;
                    const size_t bytes = (size_t)n * tk_test_dtype_size(dtype);
                    unsigned char *hin = malloc(bytes), *hdy = malloc(bytes), *want = malloc(bytes);
                    cr_assert(hin && hdy && want);
                    tk_fill_uniform(&rng, dtype, hin, n, backward ? 0.0 : -4.0, backward ? 0.01 : 4.0);
                    tk_fill_uniform(&rng, dtype, hdy, n, -2.0, 2.0);
                    unsigned char *din = tk_dev_alloc(bytes), *ddy = tk_dev_alloc(bytes), *dout = tk_dev_alloc(bytes);
                    tk_to_dev(din, hin, bytes);
                    tk_to_dev(ddy, hdy, bytes);
                    tk_dev_poison(dout, bytes);
                    char what[160];
                    snprintf(what, sizeof what, "%lldx%lld %s variant %s log %d mode %s", (long long)p.rows,
                             (long long)p.cols, tk_test_dtype_name(dtype), VARIANTS[v], p.log,
                             mode % 3 == 0 ? "y = x" : mode % 3 == 1 ? "dx = y" : "dx = dy");
                    const char *op = backward ? "softmax_bwd" : "softmax";
                    cr_assert_eq(tk_experimental_force_variant(op, VARIANTS[v]), TK_SUCCESS);
                    tk_status st =
                        backward ? tk_softmax_bwd(&p, din, ddy, dout, NULL) : tk_softmax_fwd(&p, din, dout, NULL);
                    if (st != TK_ERROR_NOT_SUPPORTED) { /* variants that do not take the shape are skipped */
                        cr_assert_eq(st, TK_SUCCESS, "%s: %s", what, tk_last_error());
                        tk_dev_sync();
                        tk_to_host(want, dout, bytes);
                        unsigned char *target = mode % 3 == 2 ? ddy : din;
                        st = backward ? tk_softmax_bwd(&p, din, ddy, target, NULL) : tk_softmax_fwd(&p, din, target, NULL);
                        cr_assert_eq(st, TK_SUCCESS, "%s: %s", what, tk_last_error());
                        cr_assert_str_eq(tk_last_variant(), VARIANTS[v], "%s ran %s", what, tk_last_variant());
                        tk_dev_sync();
                        tk_assert_dev_bytes_equal(target, want, bytes, what);
                    }
                    cr_assert_eq(tk_experimental_force_variant(op, NULL), TK_SUCCESS);
                    tk_dev_free(din); tk_dev_free(ddy); tk_dev_free(dout);
                    free(hin); free(hdy); free(want);
                }
}
