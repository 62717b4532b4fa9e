/* Activations and GLUs: bad input on the host (runs everywhere), then every kind x dtype x
 * variant against the fp64 reference on the GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/activation_ref.h"

static const tk_dtype DTYPES[] = {TK_F32, TK_F16, TK_BF16};
static const char *const VARIANTS[] = {"vec16", "scalar"};

/* The op that forces a direction's variants: the *_bwd calls have their own. */
static const char *act_op(bool backward) { return backward ? "activation_bwd" : "activation"; }
static const char *glu_op(bool backward) { return backward ? "glu_bwd" : "glu"; }

/* ------------------------------------------------------------------ bad input (host) ---- */

/* Fake "device" buffers: host memory with a sentinel; validation must reject before any use. */
static unsigned char in_buf[4096] __attribute__((aligned(16)));
static unsigned char out_buf[4096] __attribute__((aligned(16)));

static void reset_buffers(void) {
    tk_fill_sentinel(in_buf, sizeof in_buf);
    tk_fill_sentinel(out_buf, sizeof out_buf);
}

#define EXPECT_REJECTED(call, status, needle)                                 \
    do {                                                                      \
        reset_buffers();                                                      \
        TK_EXPECT_STATUS(call, status, needle);                               \
        cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s wrote its output", #call); \
        cr_assert(tk_is_sentinel(in_buf, sizeof in_buf), "%s wrote its input", #call);   \
    } while (0)

Test(activation_args, rejects_bad_arguments) {
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_BF16, NULL, NULL, out_buf, 4, 8, NULL),
                    TK_ERROR_NULL_POINTER, "'x'");
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_BF16, in_buf, NULL, NULL, 4, 8, NULL),
                    TK_ERROR_NULL_POINTER, "'y'");
    EXPECT_REJECTED(tk_activation_bwd(TK_ACT_SILU, TK_BF16, NULL, in_buf, NULL, out_buf, 4, 8, NULL),
                    TK_ERROR_NULL_POINTER, "'dy'");
    EXPECT_REJECTED(tk_activation_bwd(TK_ACT_SILU, TK_BF16, in_buf, in_buf, NULL, NULL, 4, 8, NULL),
                    TK_ERROR_NULL_POINTER, "'dx'");
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_BF16, in_buf, NULL, out_buf, -1, 8, NULL),
                    TK_ERROR_INVALID_VALUE, "'rows'");
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_BF16, in_buf, NULL, out_buf, 4, -8, NULL),
                    TK_ERROR_INVALID_VALUE, "'cols'");
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_BF16, in_buf, NULL, out_buf, INT64_MAX / 2, 4, NULL),
                    TK_ERROR_INVALID_VALUE, "overflows");
    EXPECT_REJECTED(tk_activation_fwd((tk_activation)42, TK_BF16, in_buf, NULL, out_buf, 4, 8, NULL),
                    TK_ERROR_INVALID_VALUE, "'kind'");
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, (tk_dtype)7, in_buf, NULL, out_buf, 4, 8, NULL),
                    TK_ERROR_INVALID_VALUE, "'dtype'");
    /* y starts one element into x: a partial overlap. */
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_BF16, in_buf, NULL, in_buf + 2, 4, 8, NULL),
                    TK_ERROR_OVERLAP, "'y' overlaps 'x'");
    /* dx starts one element into dy: a partial overlap (only an exact alias is in place). */
    EXPECT_REJECTED(tk_activation_bwd(TK_ACT_SILU, TK_BF16, in_buf, in_buf + 1024, NULL, in_buf + 2, 4, 8, NULL),
                    TK_ERROR_OVERLAP, "'dx' overlaps 'dy'");
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_BF16, in_buf, out_buf + 4, out_buf, 4, 8, NULL),
                    TK_ERROR_OVERLAP, "'bias'");
    EXPECT_REJECTED(tk_activation_fwd(TK_ACT_SILU, TK_F32, in_buf + 2, NULL, out_buf, 4, 8, NULL),
                    TK_ERROR_MISALIGNED, "'x'");
    EXPECT_REJECTED(tk_gelu_fwd((tk_gelu_approximation)3, TK_F32, in_buf, out_buf, 8, NULL),
                    TK_ERROR_INVALID_VALUE, "'approximate'");
    EXPECT_REJECTED(tk_gelu_fwd(TK_GELU_TANH, TK_F32, in_buf, out_buf, -5, NULL),
                    TK_ERROR_INVALID_VALUE, "'n'");
    EXPECT_REJECTED(tk_gelu_bwd(TK_GELU_EXACT, TK_F32, NULL, in_buf, out_buf, 5, NULL),
                    TK_ERROR_NULL_POINTER, "'dy'");
}

Test(activation_args, empty_is_a_noop) {
    reset_buffers();
    TK_EXPECT_STATUS(tk_activation_fwd(TK_ACT_RELU, TK_F16, NULL, NULL, NULL, 0, 8, NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_activation_bwd(TK_ACT_RELU, TK_F16, NULL, NULL, NULL, NULL, 5, 0, NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_gelu_fwd(TK_GELU_EXACT, TK_F16, NULL, NULL, 0, NULL), TK_SUCCESS, "");
    cr_assert_str_empty(tk_last_error());
}

static tk_glu_params glu_params(tk_glu kind, tk_dtype dtype, tk_glu_layout layout, int64_t rows, int64_t d) {
    tk_glu_params p = TK_GLU_PARAMS_INIT;
    p.kind = kind;
    p.dtype = dtype;
    p.layout = layout;
    p.rows = rows;
    p.d = d;
    return p;
}

Test(glu_args, rejects_bad_arguments) {
    tk_glu_params ok = glu_params(TK_GLU_SWIGLU, TK_BF16, TK_GLU_GATE_FIRST, 4, 16);
    tk_glu_params p;
    EXPECT_REJECTED(tk_glu_fwd(NULL, in_buf, out_buf, NULL), TK_ERROR_NULL_POINTER, "'p'");
    p = ok; p.size = 8;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->size");
    EXPECT_REJECTED(tk_glu_fwd(&ok, NULL, out_buf, NULL), TK_ERROR_NULL_POINTER, "'x'");
    EXPECT_REJECTED(tk_glu_fwd(&ok, in_buf, NULL, NULL), TK_ERROR_NULL_POINTER, "'y'");
    EXPECT_REJECTED(tk_glu_bwd(&ok, NULL, in_buf, out_buf, NULL), TK_ERROR_NULL_POINTER, "'dy'");
    EXPECT_REJECTED(tk_glu_bwd(&ok, in_buf, in_buf + 256, NULL, NULL), TK_ERROR_NULL_POINTER, "'dx'");
    p = ok; p.rows = -1;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->rows");
    p = ok; p.d = 0;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->d");
    p = ok; p.d = -3;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->d");
    p = ok; p.kind = (tk_glu)9;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->kind");
    p = ok; p.dtype = (tk_dtype)-1;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->dtype");
    p = ok; p.layout = (tk_glu_layout)3;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->layout");
    p = ok; p.x_row_stride = 31;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->x_row_stride");
    p = ok; p.y_row_stride = 15;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->y_row_stride");
    p = ok; p.kind = TK_GLU_SWIGLU_CLAMPED; p.alpha = NAN;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->alpha");
    p = ok; p.kind = TK_GLU_SWIGLU_CLAMPED; p.limit = NAN;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->limit");
    p = ok; p.kind = TK_GLU_SWIGLU_CLAMPED; p.limit = -1.0f;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, out_buf, NULL), TK_ERROR_INVALID_VALUE, "p->limit");
    /* y overlapping x at an offset, and in place with the up half first: both unsafe. */
    EXPECT_REJECTED(tk_glu_fwd(&ok, in_buf, in_buf + 64, NULL), TK_ERROR_OVERLAP, "'y' overlaps 'x'");
    p = ok; p.layout = TK_GLU_UP_FIRST; p.y_row_stride = 32;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, in_buf, NULL), TK_ERROR_OVERLAP, "'y' overlaps 'x'");
    /* dx overlapping dy. */
    EXPECT_REJECTED(tk_glu_bwd(&ok, in_buf, in_buf + 512, in_buf + 64, NULL), TK_ERROR_OVERLAP, "'dy'");
}

/* Forward in place with interleaved rows would write y[j] over the (gate, up) pair of output
 * j / 2, which another thread may not have read yet. */
Test(glu_args, interleaved_in_place_is_rejected) {
    tk_glu_params p = glu_params(TK_GLU_SWIGLU, TK_BF16, TK_GLU_INTERLEAVED, 4, 16);
    p.y_row_stride = p.x_row_stride = 32;
    EXPECT_REJECTED(tk_glu_fwd(&p, in_buf, in_buf, NULL), TK_ERROR_OVERLAP, "'y' overlaps 'x'");
}

Test(activation_args, no_device_is_reported) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; this test covers machines without one");
    reset_buffers();
    TK_EXPECT_STATUS(tk_activation_fwd(TK_ACT_SILU, TK_F32, in_buf, NULL, out_buf, 2, 8, NULL),
                     TK_ERROR_NO_DEVICE, "no usable CUDA device");
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
    tk_device_info info = TK_DEVICE_INFO_INIT;
    TK_EXPECT_STATUS(tk_device_query(&info), TK_ERROR_NO_DEVICE, "tk_device_query");
}

Test(activation_args, force_variant_names) {
    TK_EXPECT_STATUS(tk_experimental_force_variant("activation", "vec16"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("activation", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("activation", "fast"), TK_ERROR_INVALID_VALUE, "\"vec16\", \"scalar\"");
    for (int backward = 0; backward < 2; backward++)
        for (size_t v = 0; v < sizeof VARIANTS / sizeof VARIANTS[0]; v++) {
            TK_EXPECT_STATUS(tk_experimental_force_variant(act_op(backward), VARIANTS[v]), TK_SUCCESS, "");
            TK_EXPECT_STATUS(tk_experimental_force_variant(glu_op(backward), VARIANTS[v]), TK_SUCCESS, "");
        }
    TK_EXPECT_STATUS(tk_experimental_force_variant("glu_bwd", "fast"), TK_ERROR_INVALID_VALUE, "of \"glu_bwd\"");
    TK_EXPECT_STATUS(tk_experimental_force_variant("nope", "vec16"), TK_ERROR_INVALID_VALUE, "'op'");
    TK_EXPECT_STATUS(tk_experimental_force_variant(NULL, "vec16"), TK_ERROR_NULL_POINTER, "'op'");
}

/* ------------------------------------------------------------------------ GPU checks ---- */

/* One elementwise case: x (and dy) random, optional bias, output poisoned, compared with the
 * fp64 reference computed from the rounded inputs. `offset` shifts every pointer by that many
 * elements (misalignment); in_place writes the output over x. */
typedef struct act_case {
    tk_activation kind;
    tk_dtype dtype;
    int64_t rows, cols;
    bool bias, backward, in_place;
    int offset;
    const char *variant; /* forced variant, or NULL for the automatic choice */
    const char *expect;  /* the variant that must run when variant is NULL */
} act_case;

static void run_act_case(const act_case *c, tk_rng *rng) {
    const size_t es = tk_test_dtype_size(c->dtype);
    const int64_t n = c->rows * c->cols;
    const size_t bytes = (size_t)(n + c->offset) * es;
    unsigned char *hx = malloc(bytes), *hdy = malloc(bytes), *hb = malloc((size_t)(c->cols + c->offset) * es);
    unsigned char *hout = malloc(bytes);
    double *ref = malloc((size_t)n * sizeof(double));
    cr_assert(hx && hdy && hb && hout && ref);
    tk_fill_uniform(rng, c->dtype, hx, n + c->offset, -5.0, 5.0);
    tk_fill_uniform(rng, c->dtype, hdy, n + c->offset, -2.0, 2.0);
    tk_fill_uniform(rng, c->dtype, hb, c->cols + c->offset, -1.0, 1.0);
    unsigned char *dx = tk_dev_alloc(bytes), *ddy = tk_dev_alloc(bytes), *db = tk_dev_alloc((size_t)(c->cols + c->offset) * es);
    unsigned char *dout = c->in_place ? dx : tk_dev_alloc(bytes);
    tk_to_dev(dx, hx, bytes);
    tk_to_dev(ddy, hdy, bytes);
    tk_to_dev(db, hb, (size_t)(c->cols + c->offset) * es);
    if (!c->in_place)
        tk_dev_poison(dout, bytes);
    const size_t off = (size_t)c->offset * es;
    for (int64_t i = 0; i < n; i++) {
        double v = tk_test_load(c->dtype, hx + off, i) + (c->bias ? tk_test_load(c->dtype, hb + off, i % c->cols) : 0.0);
        ref[i] = c->backward ? tk_test_load(c->dtype, hdy + off, i) * ref_activation_grad(c->kind, v)
                             : ref_activation(c->kind, v);
    }
    const char *expected = c->variant ? c->variant : c->expect;
    cr_assert_eq(tk_experimental_force_variant(act_op(c->backward), c->variant), TK_SUCCESS);
    tk_status s = c->backward
        ? tk_activation_bwd(c->kind, c->dtype, ddy + off, dx + off, c->bias ? db + off : NULL, dout + off, c->rows, c->cols, NULL)
        : tk_activation_fwd(c->kind, c->dtype, dx + off, c->bias ? db + off : NULL, dout + off, c->rows, c->cols, NULL);
    char what[256];
    snprintf(what, sizeof what, "%s kind %d %s %lldx%lld bias %d offset %d in_place %d variant %s",
             c->backward ? "bwd" : "fwd", (int)c->kind, tk_test_dtype_name(c->dtype), (long long)c->rows,
             (long long)c->cols, c->bias, c->offset, c->in_place, expected);
    cr_assert_eq(s, TK_SUCCESS, "%s: %s", what, tk_last_error());
    cr_assert_str_eq(tk_last_variant(), expected, "%s ran variant %s", what, tk_last_variant());
    tk_dev_sync();
    tk_to_host(hout, dout, bytes);
    TK_ASSERT_CLOSE(c->dtype, hout + off, ref, n, tk_default_rtol(c->dtype), 1.0, what);
    /* Elements before the offset (outside the tensor) stay untouched. */
    if (!c->in_place && c->offset)
        cr_assert(isnan(tk_test_load(c->dtype, hout, 0)), "%s wrote before its output", what);
    cr_assert_eq(tk_experimental_force_variant(act_op(c->backward), NULL), TK_SUCCESS);
    tk_dev_free(dx); tk_dev_free(ddy); tk_dev_free(db);
    if (!c->in_place)
        tk_dev_free(dout);
    free(hx); free(hdy); free(hb); free(hout); free(ref);
}

static void run_all_kinds(bool backward) {
    tk_rng rng = tk_rng_seeded(backward ? 2 : 1);
    const struct { int64_t rows, cols; bool bias; int offset; bool in_place; } shapes[] = {
        {1, 1, false, 0, false},  {1, 7, false, 0, false}, {1, 4097, false, 0, false},
        {3, 7, true, 0, false},   {33, 3584, true, 0, false}, {5, 4096, true, 0, true},
        {1, 4097, false, 1, false}, {17, 96, true, 1, false},
    };
    for (int k = TK_ACT_NONE; k <= TK_ACT_RELU_SQUARED; k++)
        for (size_t d = 0; d < 3; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (size_t v = 0; v < 2; v++) {
                    bool misaligned = shapes[s].offset != 0 || (shapes[s].bias && shapes[s].cols % (16 / tk_test_dtype_size(DTYPES[d]))) ;
                    if (misaligned && v == 0)
                        continue; /* vec16 does not claim these; checked separately below */
                    if (shapes[s].offset && DTYPES[d] == TK_F32)
                        continue; /* f32 needs 4-byte alignment; a 2-byte offset is rejected */
                    act_case c = {(tk_activation)k, DTYPES[d], shapes[s].rows, shapes[s].cols, shapes[s].bias,
                                  backward, shapes[s].in_place, shapes[s].offset, VARIANTS[v], NULL};
                    run_act_case(&c, &rng);
                }
}

Test(activation_gpu, forward_all_kinds_dtypes_variants, .timeout = 300) {
    TK_REQUIRE_GPU();
    run_all_kinds(false);
}

Test(activation_gpu, backward_all_kinds_dtypes_variants, .timeout = 300) {
    TK_REQUIRE_GPU();
    run_all_kinds(true);
}

Test(activation_gpu, automatic_choice_falls_back_for_misaligned) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(3);
    act_case misaligned = {TK_ACT_GELU_TANH, TK_BF16, 1, 4097, false, false, false, 1, NULL, "scalar"};
    run_act_case(&misaligned, &rng);
    act_case aligned = {TK_ACT_GELU_TANH, TK_BF16, 64, 4096, true, false, false, 0, NULL, "vec16"};
    run_act_case(&aligned, &rng);
    TK_EXPECT_STATUS(tk_experimental_force_variant("activation", "vec16"), TK_SUCCESS, "");
    void *buf = tk_dev_alloc(64);
    TK_EXPECT_STATUS(tk_activation_fwd(TK_ACT_SILU, TK_BF16, (char *)buf + 2, NULL, (char *)buf + 2, 1, 8, NULL),
                     TK_ERROR_NOT_SUPPORTED, "forced variant \"vec16\"");
    tk_experimental_force_variant("activation", NULL);
    tk_dev_free(buf);
}

/* A few hundred MB through the fully checked path. */
Test(activation_gpu, large_tensor, .timeout = 300) {
    TK_REQUIRE_GPU();
    TK_SKIP_UNDER_SANITIZER("256 MB of buffers; the other tests run the same kernels");
    tk_rng rng = tk_rng_seeded(4);
    act_case c = {TK_ACT_GELU_ERF, TK_F16, 8192, 8192, true, false, false, 0, NULL, "vec16"};
    run_act_case(&c, &rng);
}

/* More than 2^31 elements (4 GB of bf16 each way): 64-bit indexing. Inputs are one random tile
 * repeated; the output is checked on a sample spread over the whole range and at the end. */
Test(activation_gpu, past_2_pow_31_elements, .timeout = 300) {
    TK_REQUIRE_GPU();
    TK_SKIP_UNDER_SANITIZER("8 GB of buffers");
    const int64_t n = (INT64_C(1) << 31) + 4099, tile = INT64_C(1) << 20;
    const size_t bytes = (size_t)n * 2;
    uint16_t *host_tile = malloc((size_t)tile * 2);
    tk_rng rng = tk_rng_seeded(5);
    tk_fill_uniform(&rng, TK_BF16, host_tile, tile, -4.0, 4.0);
    unsigned char *dx = tk_dev_alloc(bytes), *dy = tk_dev_alloc(bytes);
    for (int64_t i = 0; i < n; i += tile)
        tk_to_dev(dx + i * 2, host_tile, (size_t)((n - i < tile ? n - i : tile) * 2));
    tk_dev_poison(dy, bytes);
    TK_EXPECT_STATUS(tk_activation_fwd(TK_ACT_SILU, TK_BF16, dx, NULL, dy, 1, n, NULL), TK_SUCCESS, "");
    tk_dev_sync();
    uint16_t *out = malloc(bytes);
    cr_assert(out != NULL);
    tk_to_host(out, dy, bytes);
    int64_t checked = 0;
    for (int64_t i = 0; i < n; i += (i < n - 100000 ? 97 : 1), checked++) {
        double ref = ref_activation(TK_ACT_SILU, tk_test_load(TK_BF16, host_tile, i % tile));
        double g = tk_test_load(TK_BF16, out, i);
        cr_assert(fabs(g - ref) <= tk_default_rtol(TK_BF16) * (1.0 + fabs(ref)),
                  "element %lld: got %g, reference %g", (long long)i, g, ref);
    }
    free(out);
    cr_assert(checked > 1000);
    tk_dev_free(dx); tk_dev_free(dy);
    free(host_tile);
}

/* One GLU case, forward or backward, against the fp64 reference. Rows are laid out with the
 * given strides (padding between rows stays poisoned / untouched). */
typedef struct glu_case {
    tk_glu kind;
    tk_dtype dtype;
    tk_glu_layout layout;
    int64_t rows, d, x_pad, y_pad;
    bool backward, in_place;
    int offset;
    const char *variant;
} glu_case;

static void run_glu_case(const glu_case *c, tk_rng *rng) {
    tk_glu_params p = glu_params(c->kind, c->dtype, c->layout, c->rows, c->d);
    p.x_row_stride = 2 * c->d + c->x_pad;
    p.y_row_stride = c->in_place ? p.x_row_stride : c->d + c->y_pad;
    const size_t es = tk_test_dtype_size(c->dtype), off = (size_t)c->offset * es;
    const int64_t xn = c->rows * p.x_row_stride + c->offset, yn = c->rows * p.y_row_stride + c->offset;
    unsigned char *hx = malloc((size_t)xn * es), *hdy = malloc((size_t)yn * es);
    unsigned char *hout = malloc((size_t)(c->backward ? xn : yn) * es);
    const int64_t out_n = c->backward ? xn : yn;
    double *ref = malloc((size_t)out_n * sizeof(double));
    cr_assert(hx && hdy && hout && ref);
    tk_fill_uniform(rng, c->dtype, hx, xn, -9.0, 9.0); /* past the clamp limit of 7 */
    tk_fill_uniform(rng, c->dtype, hdy, yn, -2.0, 2.0);
    for (int64_t i = 0; i < out_n; i++)
        ref[i] = NAN; /* positions the call must not write */
    for (int64_t r = 0; r < c->rows; r++)
        for (int64_t j = 0; j < c->d; j++) {
            int64_t gi, ui;
            if (c->layout == TK_GLU_INTERLEAVED) { gi = 2 * j; ui = 2 * j + 1; }
            else if (c->layout == TK_GLU_GATE_FIRST) { gi = j; ui = c->d + j; }
            else { gi = c->d + j; ui = j; }
            const int64_t xrow = r * p.x_row_stride;
            double g = tk_test_load(c->dtype, hx + off, xrow + gi), u = tk_test_load(c->dtype, hx + off, xrow + ui);
            if (c->backward) {
                double dg, du;
                ref_glu_grad(&p, g, u, tk_test_load(c->dtype, hdy + off, r * p.y_row_stride + j), &dg, &du);
                ref[c->offset + xrow + gi] = dg;
                ref[c->offset + xrow + ui] = du;
            } else {
                ref[c->offset + r * p.y_row_stride + j] = ref_glu(&p, g, u);
            }
        }
    unsigned char *dx = tk_dev_alloc((size_t)xn * es), *ddy = tk_dev_alloc((size_t)yn * es);
    unsigned char *dout = c->in_place ? dx : tk_dev_alloc((size_t)out_n * es);
    tk_to_dev(dx, hx, (size_t)xn * es);
    tk_to_dev(ddy, hdy, (size_t)yn * es);
    if (!c->in_place)
        tk_dev_poison(dout, (size_t)out_n * es);
    cr_assert_eq(tk_experimental_force_variant(glu_op(c->backward), c->variant), TK_SUCCESS);
    tk_status s = c->backward ? tk_glu_bwd(&p, ddy + off, dx + off, dout + off, NULL)
                              : tk_glu_fwd(&p, dx + off, dout + off, NULL);
    char what[256];
    snprintf(what, sizeof what, "glu %s kind %d %s layout %d %lldx%lld pads %lld/%lld in_place %d offset %d variant %s",
             c->backward ? "bwd" : "fwd", (int)c->kind, tk_test_dtype_name(c->dtype), (int)c->layout,
             (long long)c->rows, (long long)c->d, (long long)c->x_pad, (long long)c->y_pad, c->in_place,
             c->offset, c->variant);
    cr_assert_eq(s, TK_SUCCESS, "%s: %s", what, tk_last_error());
    cr_assert_str_eq(tk_last_variant(), c->variant, "%s ran %s", what, tk_last_variant());
    tk_dev_sync();
    tk_to_host(hout, dout, (size_t)out_n * es);
    for (int64_t i = 0; i < out_n; i++) {
        double g = tk_test_load(c->dtype, hout, i);
        if (isnan(ref[i])) {
            if (!c->in_place)
                cr_assert(isnan(g), "%s: wrote position %lld outside the output", what, (long long)i);
            continue;
        }
        cr_assert(fabs(g - ref[i]) <= tk_default_rtol(c->dtype) * (1.0 + fabs(ref[i])),
                  "%s: position %lld got %.8g, reference %.8g", what, (long long)i, g, ref[i]);
    }
    cr_assert_eq(tk_experimental_force_variant(glu_op(c->backward), NULL), TK_SUCCESS);
    tk_dev_free(dx); tk_dev_free(ddy);
    if (!c->in_place)
        tk_dev_free(dout);
    free(hx); free(hdy); free(hout); free(ref);
}

static void run_all_glu(bool backward) {
    tk_rng rng = tk_rng_seeded(backward ? 12 : 11);
    const struct { int64_t rows, d, x_pad, y_pad; bool in_place; int offset; } shapes[] = {
        {1, 1, 0, 0, false, 0}, {3, 7, 0, 0, false, 0}, {9, 3584, 0, 0, false, 0},
        {5, 64, 16, 8, false, 0}, {4, 256, 0, 0, true, 0}, {6, 40, 3, 5, false, 1},
    };
    for (int k = TK_GLU_SWIGLU; k <= TK_GLU_SWIGLU_CLAMPED; k++)
        for (size_t dt = 0; dt < 3; dt++)
            for (int layout = TK_GLU_GATE_FIRST; layout <= TK_GLU_INTERLEAVED; layout++)
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                    for (size_t v = 0; v < 2; v++) {
                        const int pack = (int)(16 / tk_test_dtype_size(DTYPES[dt]));
                        const bool vec_ok = shapes[s].offset == 0 && (2 * shapes[s].d + shapes[s].x_pad) % pack == 0 &&
                                            (shapes[s].d + shapes[s].y_pad) % pack == 0 &&
                                            (layout == TK_GLU_INTERLEAVED || shapes[s].d % pack == 0);
                        if (v == 0 && !vec_ok)
                            continue;
                        if (shapes[s].offset && DTYPES[dt] == TK_F32)
                            continue;
                        if (shapes[s].in_place && (backward || layout != TK_GLU_GATE_FIRST))
                            continue; /* forward in place needs the gate first; see tk_glu_fwd */
                        glu_case c = {(tk_glu)k, DTYPES[dt], (tk_glu_layout)layout, shapes[s].rows, shapes[s].d,
                                      shapes[s].x_pad, shapes[s].y_pad, backward, shapes[s].in_place,
                                      shapes[s].offset, VARIANTS[v]};
                        run_glu_case(&c, &rng);
                    }
}

Test(glu_gpu, forward_all_kinds_layouts_dtypes_variants, .timeout = 300) {
    TK_REQUIRE_GPU();
    run_all_glu(false);
}

Test(glu_gpu, backward_all_kinds_layouts_dtypes_variants, .timeout = 300) {
    TK_REQUIRE_GPU();
    run_all_glu(true);
}

/* ------------------------------------------------------------- in place (GPU) ---- */

static tk_status act_call(bool backward, tk_activation kind, tk_dtype dtype, const void *dy, const void *x,
                          const void *bias, void *out, int64_t rows, int64_t cols) {
    return backward ? tk_activation_bwd(kind, dtype, dy, x, bias, out, rows, cols, NULL)
                    : tk_activation_fwd(kind, dtype, x, bias, out, rows, cols, NULL);
}

/* Every in-place mode the header allows (y = x; dx = dy; dx = x), bit for bit against the same
 * call out of place, every kind, dtype and variant, on fresh random inputs. */
Test(activation_gpu, in_place_matches_out_of_place, .timeout = 300) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(31);
    const int64_t rows = 33, cols = 3584, n = rows * cols;
    for (int k = TK_ACT_NONE; k <= TK_ACT_RELU_SQUARED; k++)
        for (size_t d = 0; d < 3; d++)
            for (size_t v = 0; v < 2; v++)
                for (int mode = 0; mode < 3; mode++) {
                    const tk_dtype dtype = DTYPES[d];
                    const bool backward = mode > 0;
                    const size_t es = tk_test_dtype_size(dtype), bytes = (size_t)n * es, bias_bytes = (size_t)cols * es;
                    unsigned char *hx = malloc(bytes), *hdy = malloc(bytes), *hb = malloc(bias_bytes), *want = malloc(bytes);
                    cr_assert(hx && hdy && hb && want);
                    tk_fill_uniform(&rng, dtype, hx, n, -5.0, 5.0);
                    tk_fill_uniform(&rng, dtype, hdy, n, -2.0, 2.0);
                    tk_fill_uniform(&rng, dtype, hb, cols, -1.0, 1.0);
                    unsigned char *dx = tk_dev_alloc(bytes), *ddy = tk_dev_alloc(bytes), *db = tk_dev_alloc(bias_bytes);
                    unsigned char *dout = tk_dev_alloc(bytes);
                    tk_to_dev(dx, hx, bytes);
                    tk_to_dev(ddy, hdy, bytes);
                    tk_to_dev(db, hb, bias_bytes);
                    tk_dev_poison(dout, bytes);
                    char what[128];
                    snprintf(what, sizeof what, "kind %d %s variant %s mode %s", k, tk_test_dtype_name(dtype), VARIANTS[v],
                             mode == 0 ? "y = x" : mode == 1 ? "dx = dy" : "dx = x");
                    cr_assert_eq(tk_experimental_force_variant(act_op(backward), VARIANTS[v]), TK_SUCCESS);
                    TK_EXPECT_STATUS(act_call(backward, (tk_activation)k, dtype, ddy, dx, db, dout, rows, cols), TK_SUCCESS, "");
                    tk_dev_sync();
                    tk_to_host(want, dout, bytes);
                    unsigned char *target = mode == 1 ? ddy : dx;
                    TK_EXPECT_STATUS(act_call(backward, (tk_activation)k, dtype, ddy, dx, db, target, rows, cols), TK_SUCCESS, "");
                    cr_assert_str_eq(tk_last_variant(), VARIANTS[v], "%s ran %s", what, tk_last_variant());
                    tk_dev_sync();
                    tk_assert_dev_bytes_equal(target, want, bytes, what);
                    cr_assert_eq(tk_experimental_force_variant(act_op(backward), NULL), TK_SUCCESS);
                    tk_dev_free(dx); tk_dev_free(ddy); tk_dev_free(db); tk_dev_free(dout);
                    free(hx); free(hdy); free(hb); free(want);
                }
}

/* The GLU in-place modes the header allows: forward y = x with the gate-first layout, backward
 * dx = x in every layout; bit for bit against the same call out of place (output rows laid out
 * like the in-place ones, compared row by row: the padding differs). Forward in place with the
 * other layouts is rejected on device pointers too. */
Test(glu_gpu, in_place_matches_out_of_place, .timeout = 300) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(32);
    const int64_t rows = 9, d = 3584, stride = 2 * d + 16;
    for (int k = TK_GLU_SWIGLU; k <= TK_GLU_SWIGLU_CLAMPED; k++)
        for (size_t dt = 0; dt < 3; dt++)
            for (int layout = TK_GLU_GATE_FIRST; layout <= TK_GLU_INTERLEAVED; layout++)
                for (size_t v = 0; v < 2; v++)
                    for (int backward = 0; backward < 2; backward++) {
                        const tk_dtype dtype = DTYPES[dt];
                        const size_t es = tk_test_dtype_size(dtype);
                        const size_t x_bytes = (size_t)(rows * stride) * es, dy_bytes = (size_t)(rows * d) * es;
                        tk_glu_params p = glu_params((tk_glu)k, dtype, (tk_glu_layout)layout, rows, d);
                        p.x_row_stride = stride;
                        p.y_row_stride = backward ? d : stride; /* forward: y laid out like x */
                        unsigned char *hx = malloc(x_bytes), *hdy = malloc(dy_bytes), *want = malloc(x_bytes);
                        cr_assert(hx && hdy && want);
                        tk_fill_uniform(&rng, dtype, hx, rows * stride, -9.0, 9.0);
                        tk_fill_uniform(&rng, dtype, hdy, rows * d, -2.0, 2.0);
                        unsigned char *dx = tk_dev_alloc(x_bytes), *ddy = tk_dev_alloc(dy_bytes), *dout = tk_dev_alloc(x_bytes);
                        tk_to_dev(dx, hx, x_bytes);
                        tk_to_dev(ddy, hdy, dy_bytes);
                        tk_dev_poison(dout, x_bytes);
                        char what[160];
                        snprintf(what, sizeof what, "glu %s kind %d %s layout %d variant %s", backward ? "bwd dx = x" : "fwd y = x",
                                 k, tk_test_dtype_name(dtype), layout, VARIANTS[v]);
                        if (!backward && layout != TK_GLU_GATE_FIRST) {
                            TK_EXPECT_STATUS(tk_glu_fwd(&p, dx, dx, NULL), TK_ERROR_OVERLAP, "'y' overlaps 'x'");
                        } else {
                            cr_assert_eq(tk_experimental_force_variant(glu_op(backward), VARIANTS[v]), TK_SUCCESS);
                            TK_EXPECT_STATUS(backward ? tk_glu_bwd(&p, ddy, dx, dout, NULL) : tk_glu_fwd(&p, dx, dout, NULL),
                                             TK_SUCCESS, "");
                            tk_dev_sync();
                            tk_to_host(want, dout, x_bytes);
                            TK_EXPECT_STATUS(backward ? tk_glu_bwd(&p, ddy, dx, dx, NULL) : tk_glu_fwd(&p, dx, dx, NULL),
                                             TK_SUCCESS, "");
                            cr_assert_str_eq(tk_last_variant(), VARIANTS[v], "%s ran %s", what, tk_last_variant());
                            tk_dev_sync();
                            const size_t row_bytes = (size_t)(backward ? 2 * d : d) * es;
                            for (int64_t r = 0; r < rows; r++)
                                tk_assert_dev_bytes_equal(dx + (size_t)(r * stride) * es, want + (size_t)(r * stride) * es,
                                                          row_bytes, what);
                            cr_assert_eq(tk_experimental_force_variant(glu_op(backward), NULL), TK_SUCCESS);
                        }
                        tk_dev_free(dx); tk_dev_free(ddy); tk_dev_free(dout);
                        free(hx); free(hdy); free(want);
                    }
}
