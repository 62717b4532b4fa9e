/*
 * Activations and gated linear units: argument checks and dispatch. The kernels are in
 * cuda/activation.cu and cuda/glu.cu; the math is documented in docs/kernels/activation.md.
 *
 * Variants, best first: "vec16" (16-byte packs; every row start of every tensor 16-byte aligned)
 * and "scalar" (any element-aligned pointer). Each direction's kernel is an instantiation of the
 * same template, so the forward ops ("activation", "glu") and the backward ones
 * ("activation_bwd", "glu_bwd") share their family's table; the launchers read the direction.
 */
#include <math.h>
#include <stdint.h>

#include "runtime.h"
#include "../cuda/activation.h"

/* ------------------------------------------------------------------------ activations ---- */

static bool activation_vec16_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    const tk_activation_call *a = call;
    const tk_dtype dtype = (tk_dtype)a->dtype;
    /* One-row calls handle a partial last pack in the kernel; longer calls need aligned rows. */
    bool rows_ok = a->rows == 1 || tk_stride_keeps_alignment(a->cols, tk_dtype_size(dtype));
    return rows_ok && tk_aligned16(a->x) && tk_aligned16(a->out) && tk_aligned16(a->dy) &&
           tk_aligned16(a->bias);
}

static const tk_variant activation_variants[] = {
    {"vec16", TK_CC_AMPERE, false, activation_vec16_supports, tk_launch_activation_vec16, NULL},
    {"scalar", TK_CC_AMPERE, false, NULL, tk_launch_activation_scalar, NULL},
};
const tk_op tk_op_activation = {"activation", activation_variants, TK_VARIANT_COUNT(activation_variants)};
const tk_op tk_op_activation_bwd = {"activation_bwd", activation_variants,
                                    TK_VARIANT_COUNT(activation_variants)};

static bool activation_kind_valid(tk_activation kind) {
    return kind >= TK_ACT_NONE && kind <= TK_ACT_RELU_SQUARED;
}

static tk_status activation_run(const char *fn, tk_activation kind, tk_dtype dtype,
                                const void *dy, const void *x, const void *bias, void *out,
                                int64_t rows, int64_t cols, bool backward, tk_stream_t stream) {
    const char *out_name = backward ? "dx" : "y";
    if (!activation_kind_valid(kind))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "argument 'kind' = %d is not a tk_activation (accepted: 0..%d)", (int)kind,
                       (int)TK_ACT_RELU_SQUARED);
    TK_TRY(tk_check_dtype(fn, "dtype", dtype));
    if (rows < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "argument 'rows' = %lld is negative",
                       (long long)rows);
    if (cols < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "argument 'cols' = %lld is negative",
                       (long long)cols);
    int64_t n;
    TK_TRY(tk_mul_checked(fn, "rows * cols", rows, cols, &n));
    int64_t bytes;
    TK_TRY(tk_mul_checked(fn, "rows * cols * element size", n, (int64_t)tk_dtype_size(dtype), &bytes));
    if (n == 0)
        return TK_SUCCESS;
    if (backward)
        TK_TRY(tk_check_not_null(fn, "dy", dy));
    TK_TRY(tk_check_not_null(fn, "x", x));
    TK_TRY(tk_check_not_null(fn, out_name, out));
    const size_t es = tk_dtype_size(dtype);
    TK_TRY(tk_check_aligned(fn, "dy", dy, es));
    TK_TRY(tk_check_aligned(fn, "x", x, es));
    TK_TRY(tk_check_aligned(fn, "bias", bias, es));
    TK_TRY(tk_check_aligned(fn, out_name, out, es));
    /* Dense outputs: no two elements share memory. Each element of the output depends on the
     * same element of x and dy only, so in place is safe. */
    const size_t bias_bytes = (size_t)cols * es;
    TK_TRY(tk_check_overlap(fn, out_name, out, (size_t)bytes, "x", x, (size_t)bytes, true));
    TK_TRY(tk_check_overlap(fn, out_name, out, (size_t)bytes, "dy", dy, (size_t)bytes, true));
    TK_TRY(tk_check_overlap(fn, out_name, out, (size_t)bytes, "bias", bias, bias_bytes, false));

    tk_activation_call call = {kind, dtype, backward, x, dy, bias, out, rows, cols};
    if (bias == NULL) { /* no column structure: one long row, vectorised end to end */
        call.rows = 1;
        call.cols = n;
    }
    const tk_device *dev;
    TK_TRY(tk_current_device(fn, &dev));
    const tk_variant *v;
    TK_TRY(tk_select_variant(fn, backward ? &tk_op_activation_bwd : &tk_op_activation, dev, &call, &v));
    return tk_launched(fn, v, v->launch(&call, dev, stream));
}

TK_API tk_status tk_activation_fwd(tk_activation kind, tk_dtype dtype, const void *x,
                                   const void *bias, void *y, int64_t rows, int64_t cols,
                                   tk_stream_t stream) {
    tk_begin_call();
    return activation_run("tk_activation_fwd", kind, dtype, NULL, x, bias, y, rows, cols, false,
                          stream);
}

TK_API tk_status tk_activation_bwd(tk_activation kind, tk_dtype dtype, const void *dy,
                                   const void *x, const void *bias, void *dx, int64_t rows,
                                   int64_t cols, tk_stream_t stream) {
    tk_begin_call();
    return activation_run("tk_activation_bwd", kind, dtype, dy, x, bias, dx, rows, cols, true,
                          stream);
}

static tk_status gelu_kind(const char *fn, tk_gelu_approximation approximate, tk_activation *kind) {
    if (approximate == TK_GELU_EXACT || approximate == TK_GELU_TANH) {
        *kind = approximate == TK_GELU_EXACT ? TK_ACT_GELU_ERF : TK_ACT_GELU_TANH;
        return TK_SUCCESS;
    }
    return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                   "argument 'approximate' = %d is not TK_GELU_EXACT (0) or TK_GELU_TANH (1)",
                   (int)approximate);
}

TK_API tk_status tk_gelu_fwd(tk_gelu_approximation approximate, tk_dtype dtype, const void *x,
                             void *y, int64_t n, tk_stream_t stream) {
    static const char fn[] = "tk_gelu_fwd";
    tk_begin_call();
    tk_activation kind = TK_ACT_GELU_ERF;
    TK_TRY(gelu_kind(fn, approximate, &kind));
    if (n < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "argument 'n' = %lld is negative", (long long)n);
    return activation_run(fn, kind, dtype, NULL, x, NULL, y, 1, n, false, stream);
}

TK_API tk_status tk_gelu_bwd(tk_gelu_approximation approximate, tk_dtype dtype, const void *dy,
                             const void *x, void *dx, int64_t n, tk_stream_t stream) {
    static const char fn[] = "tk_gelu_bwd";
    tk_begin_call();
    tk_activation kind = TK_ACT_GELU_ERF;
    TK_TRY(gelu_kind(fn, approximate, &kind));
    if (n < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "argument 'n' = %lld is negative", (long long)n);
    return activation_run(fn, kind, dtype, dy, x, NULL, dx, 1, n, true, stream);
}

/* -------------------------------------------------------------------------------- GLU ---- */

static bool glu_vec16_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    const tk_glu_call *a = call;
    const size_t es = tk_dtype_size((tk_dtype)a->dtype);
    /* Gate and up packs start every 16 bytes: d must keep the second half aligned too. */
    const bool halves_ok = a->layout == TK_GLU_INTERLEAVED || tk_stride_keeps_alignment(a->d, es);
    return halves_ok && tk_stride_keeps_alignment(a->x_row_stride, es) &&
           tk_stride_keeps_alignment(a->y_row_stride, es) && tk_aligned16(a->x) &&
           tk_aligned16(a->out) && tk_aligned16(a->dy);
}

static const tk_variant glu_variants[] = {
    {"vec16", TK_CC_AMPERE, false, glu_vec16_supports, tk_launch_glu_vec16, NULL},
    {"scalar", TK_CC_AMPERE, false, NULL, tk_launch_glu_scalar, NULL},
};
const tk_op tk_op_glu = {"glu", glu_variants, TK_VARIANT_COUNT(glu_variants)};
const tk_op tk_op_glu_bwd = {"glu_bwd", glu_variants, TK_VARIANT_COUNT(glu_variants)};

static tk_status glu_run(const char *fn, const tk_glu_params *given, const void *dy,
                         const void *x, void *out, bool backward, tk_stream_t stream) {
    const char *out_name = backward ? "dx" : "y";
    tk_glu_params params;
    TK_TRY(TK_READ_PARAMS(fn, "p", given, &params, tk_glu_params, TK_GLU_PARAMS_INIT,
                          TK_GLU_PARAMS_SIZE_0_1));
    const tk_glu_params *p = &params;
    if (!(p->kind >= TK_GLU_SWIGLU && p->kind <= TK_GLU_SWIGLU_CLAMPED))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->kind = %d is not a tk_glu (accepted: 0..%d)",
                       (int)p->kind, (int)TK_GLU_SWIGLU_CLAMPED);
    TK_TRY(tk_check_dtype(fn, "p->dtype", p->dtype));
    if (!(p->layout >= TK_GLU_GATE_FIRST && p->layout <= TK_GLU_INTERLEAVED))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->layout = %d is not a tk_glu_layout (accepted: 0..%d)", (int)p->layout,
                       (int)TK_GLU_INTERLEAVED);
    if (p->rows < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->rows = %lld is negative", (long long)p->rows);
    if (p->d <= 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->d = %lld must be positive", (long long)p->d);
    if (p->d > INT64_MAX / 2)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->d = %lld: 2 * d overflows int64",
                       (long long)p->d);
    const int64_t x_stride = p->x_row_stride ? p->x_row_stride : 2 * p->d;
    const int64_t y_stride = p->y_row_stride ? p->y_row_stride : p->d;
    if (x_stride < 2 * p->d)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->x_row_stride = %lld is smaller than an input row (2 * d = %lld); "
                       "use 0 for dense rows",
                       (long long)p->x_row_stride, (long long)(2 * p->d));
    if (y_stride < p->d)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->y_row_stride = %lld is smaller than an output row (d = %lld); "
                       "use 0 for dense rows",
                       (long long)p->y_row_stride, (long long)p->d);
    const size_t es = tk_dtype_size(p->dtype);
    const tk_layout x_layout = tk_rows_layout(p->rows, 2 * p->d, x_stride);
    const tk_layout y_layout = tk_rows_layout(p->rows, p->d, y_stride);
    size_t x_bytes, y_bytes;
    TK_TRY(tk_layout_bytes(fn, "x", &x_layout, es, &x_bytes));
    TK_TRY(tk_layout_bytes(fn, "y", &y_layout, es, &y_bytes));
    TK_TRY(tk_check_disjoint(fn, out_name, backward ? "p->x_row_stride" : "p->y_row_stride",
                             backward ? &x_layout : &y_layout));
    if (p->kind == TK_GLU_SWIGLU_CLAMPED) {
        if (isnan(p->alpha))
            return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->alpha is NaN");
        if (!(p->limit > 0.0f))
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "p->limit = %g must be a positive number (GPT-OSS uses 7.0)",
                           (double)p->limit);
    }
    if (p->rows == 0)
        return TK_SUCCESS;
    if (backward)
        TK_TRY(tk_check_not_null(fn, "dy", dy));
    TK_TRY(tk_check_not_null(fn, "x", x));
    TK_TRY(tk_check_not_null(fn, out_name, out));
    TK_TRY(tk_check_aligned(fn, "dy", dy, es));
    TK_TRY(tk_check_aligned(fn, "x", x, es));
    TK_TRY(tk_check_aligned(fn, out_name, out, es));

    if (backward) {
        /* dx has x's layout, and each thread writes dx exactly where it read its gate and up
         * values: it may replace x; it must not touch dy. */
        TK_TRY(tk_check_overlap(fn, "dx", out, x_bytes, "x", x, x_bytes, true));
        TK_TRY(tk_check_overlap(fn, "dx", out, x_bytes, "dy", dy, y_bytes, false));
    } else if (tk_ranges_overlap(out, y_bytes, x, x_bytes)) {
        /* Writing y over x is safe only when each output element replaces an input its own
         * thread has already read: same base, same row stride, and the gates (read with their
         * outputs) at the front. Interleaved, y[j] lands on the pair of output j / 2, which
         * another thread may not have read yet. */
        const bool exact = out == x && y_stride == x_stride && p->layout == TK_GLU_GATE_FIRST;
        if (!exact)
            return tk_fail(TK_ERROR_OVERLAP, fn,
                           "argument 'y' overlaps 'x'; in place is allowed only with y == x, "
                           "y_row_stride == x_row_stride and the gate-first layout");
    }

    const tk_glu_call call = {p->kind, p->dtype, p->layout, backward, x, dy, out,
                              p->rows, p->d, x_stride, y_stride, p->alpha, p->limit};
    const tk_device *dev;
    TK_TRY(tk_current_device(fn, &dev));
    const tk_variant *v;
    TK_TRY(tk_select_variant(fn, backward ? &tk_op_glu_bwd : &tk_op_glu, dev, &call, &v));
    return tk_launched(fn, v, v->launch(&call, dev, stream));
}

TK_API tk_status tk_glu_fwd(const tk_glu_params *p, const void *x, void *y, tk_stream_t stream) {
    tk_begin_call();
    return glu_run("tk_glu_fwd", p, NULL, x, y, false, stream);
}

TK_API tk_status tk_glu_bwd(const tk_glu_params *p, const void *dy, const void *x, void *dx,
                            tk_stream_t stream) {
    tk_begin_call();
    return glu_run("tk_glu_bwd", p, dy, x, dx, true, stream);
}
