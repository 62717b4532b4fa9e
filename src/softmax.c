/*
 * Softmax and log-softmax over rows: argument checks and dispatch. The kernels are in
 * cuda/softmax.cu; the math is documented in include/tkern.h and docs/kernels/softmax.md.
 *
 * Variants of op "softmax", best first: "vec16_pipelined" (cc >= 9.0, rows of 64 to 512 KB: the
 * two passes of the stream interleaved, a row split over a thread-block cluster), "vec16_regs"
 * (row in registers, 16-byte packs), "vec16_stream" (any width, two passes), "scalar_regs",
 * "scalar_stream" (one element per access, any alignment). Op "softmax_bwd" has the same variants
 * with the backward's register limits for the "_regs" ones; "vec16_pipelined" takes the
 * forward's widths (its pass 1 sums dy y, or dy alone for the log-softmax, and a softmax
 * backward row is split over twice the blocks, as y and dy are both re-read from L2). The
 * launchers read the direction. Forcing "vec16_stream" on op "softmax_bwd" runs the previous
 * long-row backward, for an A/B against "vec16_pipelined".
 */
#include <math.h>
#include <stdint.h>

#include "runtime.h"
#include "../cuda/softmax.h"

/* Every row start 16-byte aligned (the stride only matters with more than one row). */
static bool rows_aligned16(const void *p, int64_t rows, int64_t stride, size_t elem) {
    return tk_aligned16(p) && (rows == 1 || tk_stride_keeps_alignment(stride, elem));
}

static bool vec16_fits(const tk_softmax_call *a) {
    const size_t es = tk_dtype_size((tk_dtype)a->dtype);
    return rows_aligned16(a->in, a->rows, a->in_stride, es) && rows_aligned16(a->dy, a->rows, a->in_stride, es) &&
           rows_aligned16(a->out, a->rows, a->out_stride, es);
}

/* The row fits the "_regs" kernels' registers in this direction. */
static bool regs_fit(const tk_softmax_call *a, bool wide, bool backward) {
    return a->cols <= tk_softmax_regs_max_cols((int)tk_dtype_size((tk_dtype)a->dtype), wide, backward);
}

static bool vec16_pipelined_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    const tk_softmax_call *a = call;
    return vec16_fits(a) && tk_softmax_pipelined_fits((int)tk_dtype_size((tk_dtype)a->dtype), a->cols);
}
static bool vec16_stream_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    return vec16_fits(call);
}
static bool vec16_regs_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    return vec16_fits(call) && regs_fit(call, true, false);
}
static bool scalar_regs_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    return regs_fit(call, false, false);
}
static bool vec16_regs_bwd_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    return vec16_fits(call) && regs_fit(call, true, true);
}
static bool scalar_regs_bwd_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    return regs_fit(call, false, true);
}

static const tk_variant softmax_variants[] = {
    {"vec16_pipelined", TK_CC_HOPPER, false, vec16_pipelined_supports, tk_launch_softmax_vec16_pipelined, NULL},
    {"vec16_regs", TK_CC_AMPERE, false, vec16_regs_supports, tk_launch_softmax_vec16_regs, NULL},
    {"vec16_stream", TK_CC_AMPERE, false, vec16_stream_supports, tk_launch_softmax_vec16_stream, NULL},
    {"scalar_regs", TK_CC_AMPERE, false, scalar_regs_supports, tk_launch_softmax_scalar_regs, NULL},
    {"scalar_stream", TK_CC_AMPERE, false, NULL, tk_launch_softmax_scalar_stream, NULL},
};
const tk_op tk_op_softmax = {"softmax", softmax_variants, TK_VARIANT_COUNT(softmax_variants)};

static const tk_variant softmax_bwd_variants[] = {
    {"vec16_pipelined", TK_CC_HOPPER, false, vec16_pipelined_supports, tk_launch_softmax_vec16_pipelined, NULL},
    {"vec16_regs", TK_CC_AMPERE, false, vec16_regs_bwd_supports, tk_launch_softmax_vec16_regs, NULL},
    {"vec16_stream", TK_CC_AMPERE, false, vec16_stream_supports, tk_launch_softmax_vec16_stream, NULL},
    {"scalar_regs", TK_CC_AMPERE, false, scalar_regs_bwd_supports, tk_launch_softmax_scalar_regs, NULL},
    {"scalar_stream", TK_CC_AMPERE, false, NULL, tk_launch_softmax_scalar_stream, NULL},
};
const tk_op tk_op_softmax_bwd = {"softmax_bwd", softmax_bwd_variants, TK_VARIANT_COUNT(softmax_bwd_variants)};

/* `out` may replace `in` exactly (same pointer, same stride); any other shared byte is an error. */
static tk_status check_overlap(const char *fn, const char *out_name, const void *out, int64_t out_stride,
                               size_t out_bytes, const char *in_name, const void *in, int64_t in_stride,
                               size_t in_bytes) {
    return tk_check_overlap(fn, out_name, out, out_bytes, in_name, in, in_bytes, out_stride == in_stride);
}

static tk_status bool_flag(const char *fn, const char *name, int value) {
    if (value == 0 || value == 1)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn, "%s = %d must be 0 or 1", name, value);
}

static tk_status softmax_run(const char *fn, const tk_softmax_params *given, const void *y, const void *dy,
                             const void *x, void *out, bool backward, tk_stream_t stream) {
    tk_softmax_params params;
    TK_TRY(TK_READ_PARAMS(fn, "p", given, &params, tk_softmax_params, TK_SOFTMAX_PARAMS_INIT,
                          TK_SOFTMAX_PARAMS_SIZE_0_1));
    const tk_softmax_params *p = &params;
    TK_TRY(tk_check_dtype(fn, "p->dtype", p->dtype));
    if (p->rows < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->rows = %lld is negative", (long long)p->rows);
    if (p->cols < 1)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->cols = %lld must be at least 1", (long long)p->cols);
    if (p->cols > (INT64_C(1) << 30))
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn, "p->cols = %lld is past the kernels' limit of 2^30 per row",
                       (long long)p->cols);
    const int64_t x_stride = p->x_row_stride ? p->x_row_stride : p->cols;
    const int64_t y_stride = p->y_row_stride ? p->y_row_stride : p->cols;
    if (x_stride < p->cols)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->x_row_stride = %lld is smaller than a row (cols = %lld); use 0 for dense rows",
                       (long long)p->x_row_stride, (long long)p->cols);
    if (y_stride < p->cols)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->y_row_stride = %lld is smaller than a row (cols = %lld); use 0 for dense rows",
                       (long long)p->y_row_stride, (long long)p->cols);
    if (!isfinite(p->scale))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->scale = %g must be a finite number", (double)p->scale);
    TK_TRY(bool_flag(fn, "p->log", p->log));
    TK_TRY(bool_flag(fn, "p->causal", p->causal));
    if (p->causal && p->causal_period < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->causal_period = %lld is negative (0 means rows)",
                       (long long)p->causal_period);
    const tk_dtype dtype = p->dtype;
    const size_t es = tk_dtype_size(dtype);
    const tk_layout x_layout = tk_rows_layout(p->rows, p->cols, x_stride);
    const tk_layout y_layout = tk_rows_layout(p->rows, p->cols, y_stride);
    size_t x_bytes, y_bytes;
    TK_TRY(tk_layout_bytes(fn, "x", &x_layout, es, &x_bytes));
    TK_TRY(tk_layout_bytes(fn, "y", &y_layout, es, &y_bytes));
    TK_TRY(tk_check_disjoint(fn, backward ? "dx" : "y", backward ? "p->x_row_stride" : "p->y_row_stride",
                             backward ? &x_layout : &y_layout));
    if (p->rows == 0)
        return TK_SUCCESS;

    const char *out_name = backward ? "dx" : "y";
    if (backward) {
        TK_TRY(tk_check_not_null(fn, "y", y));
        TK_TRY(tk_check_not_null(fn, "dy", dy));
    } else {
        TK_TRY(tk_check_not_null(fn, "x", x));
    }
    TK_TRY(tk_check_not_null(fn, out_name, out));
    TK_TRY(tk_check_aligned(fn, "y", y, es));
    TK_TRY(tk_check_aligned(fn, "dy", dy, es));
    TK_TRY(tk_check_aligned(fn, "x", x, es));
    TK_TRY(tk_check_aligned(fn, out_name, out, es));
    if (backward) {
        TK_TRY(check_overlap(fn, "dx", out, x_stride, x_bytes, "y", y, y_stride, y_bytes));
        TK_TRY(check_overlap(fn, "dx", out, x_stride, x_bytes, "dy", dy, y_stride, y_bytes));
    } else {
        TK_TRY(check_overlap(fn, "y", out, y_stride, y_bytes, "x", x, x_stride, x_bytes));
    }

    tk_softmax_call call;
    call.dtype = dtype;
    call.backward = backward;
    call.log = p->log != 0;
    call.causal = p->causal != 0;
    call.in = backward ? y : x;
    call.dy = backward ? dy : NULL;
    call.out = out;
    call.rows = p->rows;
    call.cols = p->cols;
    call.in_stride = backward ? y_stride : x_stride;
    call.out_stride = backward ? x_stride : y_stride;
    call.scale = p->scale;
    call.causal_period = p->causal_period ? p->causal_period : p->rows;
    /* Offsets past either end change nothing: clamp them so that q + offset + 1 cannot overflow. */
    call.causal_offset = p->causal_offset < -call.causal_period ? -call.causal_period
                         : p->causal_offset > p->cols          ? p->cols
                                                               : p->causal_offset;
    if (!call.causal) {
        call.causal_period = 1;
        call.causal_offset = 0;
    }
    const tk_device *dev;
    TK_TRY(tk_current_device(fn, &dev));
    const tk_variant *v;
    TK_TRY(tk_select_variant(fn, backward ? &tk_op_softmax_bwd : &tk_op_softmax, dev, &call, &v));
    return tk_launched(fn, v, v->launch(&call, dev, stream));
}

TK_API tk_status tk_softmax_fwd(const tk_softmax_params *p, const void *x, void *y, tk_stream_t stream) {
    tk_begin_call();
    return softmax_run("tk_softmax_fwd", p, NULL, NULL, x, y, false, stream);
}

TK_API tk_status tk_softmax_bwd(const tk_softmax_params *p, const void *y, const void *dy, void *dx,
                                tk_stream_t stream) {
    tk_begin_call();
    return softmax_run("tk_softmax_bwd", p, y, dy, NULL, dx, true, stream);
}
