/*
 * RMSNorm and LayerNorm: argument checks and dispatch. The kernels are in cuda/norm_fwd.cu and
 * cuda/norm_bwd.cu; the math is documented in docs/kernels/norm.md.
 *
 * Variants of op "norm" (forward) and of op "norm_bwd" (backward), best first: "vec16" (16-byte
 * packs, row in registers; the backward's 16-bit rows of a whole block staged in shared memory),
 * "cluster_vec16" (sm_90: wider rows in the shared memory of a thread-block cluster),
 * "wide_vec16" (16-byte packs, any width), "scalar" (any element alignment, row in registers),
 * "wide_scalar" (anything). The "rows" kernels hold rows up to tk_norm_rows_fit's limit
 * (cuda/norm.h), which differs by direction.
 */
#include <math.h>
#include <stdint.h>

#include "runtime.h"
#include "../cuda/norm.h"

#define NORM_MAX_COLS 262144

static int pack_elems(int dtype) { return 16 / (int)tk_dtype_size((tk_dtype)dtype); }

/* Every row start of every row tensor, and the parameter vectors, on 16-byte boundaries. */
static bool norm_aligned16(const tk_norm_call *a) {
    const size_t es = tk_dtype_size((tk_dtype)a->dtype);
    const int64_t strides[] = {a->cols, a->x_stride, a->residual_stride, a->y_stride};
    for (size_t i = 0; i < sizeof strides / sizeof strides[0]; i++)
        if (!tk_stride_keeps_alignment(strides[i], es))
            return false;
    const void *ptrs[] = {a->x, a->residual, a->weight, a->bias, a->y, a->dy, a->dx};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (!tk_aligned16(ptrs[i]))
            return false;
    return true;
}

/* The "rows" variants: the row fits the registers of the direction's kernel. */
static bool rows_vec16_fit(const tk_norm_call *a, bool backward) {
    return norm_aligned16(a) && tk_norm_rows_fit(a->cols, pack_elems(a->dtype), backward);
}

static bool norm_vec16_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    return rows_vec16_fit(call, false);
}

/* 16-bit rows past 8192 columns run the ring kernel at 4 packs per thread, whose shared memory
 * (up to 192 KB) not every device holds. */
static bool norm_bwd_vec16_supports(tk_call_args call, const tk_device *dev) {
    const tk_norm_call *a = call;
    return rows_vec16_fit(a, true) && (a->cols <= TK_NORM_ROWS_MAX_THREADS * TK_NORM_BWD_ELEMS_VEC ||
                                       tk_norm_bwd_ring_fit(a->cols, dev->max_smem_optin));
}

/* Rows the forward rows kernel cannot hold on one block but a cluster can; one cluster per row,
 * so rows x blocks must fit the grid (2^31 - 1 blocks: far past any tensor of such rows); and
 * the device holds such a cluster (a MIG slice may not: the wide kernel takes the call). */
static bool norm_cluster_vec16_supports(tk_call_args call, const tk_device *dev) {
    const tk_norm_call *a = call;
    return norm_aligned16(a) && !tk_norm_rows_fit(a->cols, pack_elems(a->dtype), false) &&
           tk_norm_cluster_fit(a->cols, pack_elems(a->dtype)) &&
           a->rows <= INT32_MAX / TK_NORM_CLUSTER_MAX_BLOCKS && tk_norm_fwd_cluster_resident(a, dev);
}

/* Backward rows past the ring / rows kernels' reach, up to 8 slices, whose block's shared memory
 * the device holds (tk_norm_bwd_cluster_fit) and of whose clusters it holds at least one (the
 * occupancy query: a device's partition may hold none). The grid is persistent (one cluster per
 * resident cluster, at most one per row), so any row count fits it. */
static bool norm_bwd_cluster_vec16_supports(tk_call_args call, const tk_device *dev) {
    const tk_norm_call *a = call;
    return norm_aligned16(a) && tk_norm_bwd_cluster_fit(a->cols, pack_elems(a->dtype), dev->max_smem_optin) &&
           tk_norm_bwd_cluster_resident(a, dev);
}

static bool norm_wide_vec16_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    return norm_aligned16(call);
}

static bool norm_scalar_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    const tk_norm_call *a = call;
    return tk_norm_rows_fit(a->cols, 1, false);
}

static bool norm_bwd_scalar_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    const tk_norm_call *a = call;
    return tk_norm_rows_fit(a->cols, 1, true);
}

static const tk_variant norm_variants[] = {
    {"vec16", TK_CC_AMPERE, false, norm_vec16_supports, tk_launch_norm_fwd_vec16, NULL},
    {"cluster_vec16", TK_CC_HOPPER, false, norm_cluster_vec16_supports, tk_launch_norm_fwd_cluster_vec16, NULL},
    {"wide_vec16", TK_CC_AMPERE, false, norm_wide_vec16_supports, tk_launch_norm_fwd_wide_vec16, NULL},
    {"scalar", TK_CC_AMPERE, false, norm_scalar_supports, tk_launch_norm_fwd_scalar, NULL},
    {"wide_scalar", TK_CC_AMPERE, false, NULL, tk_launch_norm_fwd_wide_scalar, NULL},
};
const tk_op tk_op_norm = {"norm", norm_variants, TK_VARIANT_COUNT(norm_variants)};

static const tk_variant norm_bwd_variants[] = {
    {"vec16", TK_CC_AMPERE, false, norm_bwd_vec16_supports, tk_launch_norm_bwd_vec16, NULL},
    {"cluster_vec16", TK_CC_HOPPER, false, norm_bwd_cluster_vec16_supports, tk_launch_norm_bwd_cluster_vec16, NULL},
    {"wide_vec16", TK_CC_AMPERE, false, norm_wide_vec16_supports, tk_launch_norm_bwd_wide_vec16, NULL},
    {"scalar", TK_CC_AMPERE, false, norm_bwd_scalar_supports, tk_launch_norm_bwd_scalar, NULL},
    {"wide_scalar", TK_CC_AMPERE, false, NULL, tk_launch_norm_bwd_wide_scalar, NULL},
};
const tk_op tk_op_norm_bwd = {"norm_bwd", norm_bwd_variants, TK_VARIANT_COUNT(norm_bwd_variants)};

/* ------------------------------------------------------------------------- checks ---- */

/* The shape fields of *p, checked, with strides resolved. */
typedef struct norm_shape {
    int64_t x_stride, residual_stride, y_stride;
    size_t x_bytes, residual_bytes, y_bytes, param_bytes, stat_bytes;
} norm_shape;

static tk_status check_stride(const char *fn, const char *name, int64_t given, int64_t cols,
                              int64_t *resolved) {
    *resolved = given == 0 ? cols : given;
    if (*resolved < cols)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->%s = %lld is smaller than a row (cols = %lld); use 0 for dense rows",
                       name, (long long)given, (long long)cols);
    return TK_SUCCESS;
}

/* Bytes spanned by rows of `cols` elements `stride` apart; outputs' rows must not overlap. */
static tk_status span(const char *fn, const char *name, const char *stride_name, bool output,
                      int64_t rows, int64_t cols, int64_t stride, size_t elem, size_t *bytes) {
    const tk_layout l = tk_rows_layout(rows, cols, stride);
    TK_TRY(tk_layout_bytes(fn, name, &l, elem, bytes));
    return output ? tk_check_disjoint(fn, name, stride_name, &l) : TK_SUCCESS;
}

/* Reads the caller's *given into *p (see tk_read_params) and checks it. */
static tk_status check_params(const char *fn, const tk_norm_params *given, tk_norm_params *p,
                              norm_shape *s) {
    TK_TRY(TK_READ_PARAMS(fn, "p", given, p, tk_norm_params, TK_NORM_PARAMS_INIT,
                          TK_NORM_PARAMS_SIZE_0_1));
    TK_TRY(tk_check_dtype(fn, "p->dtype", p->dtype));
    TK_TRY(tk_check_dtype(fn, "p->weight_dtype", p->weight_dtype));
    if (p->weight_dtype != p->dtype && p->weight_dtype != TK_F32)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->weight_dtype = %s with p->dtype = %s is not supported; the weight dtype "
                       "must be the same as p->dtype or TK_F32",
                       tk_dtype_name(p->weight_dtype), tk_dtype_name(p->dtype));
    if (p->rows < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->rows = %lld is negative", (long long)p->rows);
    if (p->cols < 1 || p->cols > NORM_MAX_COLS)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->cols = %lld is outside 1..%d",
                       (long long)p->cols, NORM_MAX_COLS);
    TK_TRY(check_stride(fn, "x_row_stride", p->x_row_stride, p->cols, &s->x_stride));
    TK_TRY(check_stride(fn, "residual_row_stride", p->residual_row_stride, p->cols, &s->residual_stride));
    TK_TRY(check_stride(fn, "y_row_stride", p->y_row_stride, p->cols, &s->y_stride));
    if (!(p->eps > 0.0f) || isinf(p->eps))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->eps = %g must be a positive finite number (e.g. 1e-5 or 1e-6)",
                       (double)p->eps);
    if (p->gemma != 0 && p->gemma != 1)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->gemma = %d is not 0 or 1", p->gemma);
    const size_t es = tk_dtype_size(p->dtype);
    /* x's layout is also dx's, y's also dy's: both are outputs of one direction. */
    TK_TRY(span(fn, "x", "p->x_row_stride", true, p->rows, p->cols, s->x_stride, es, &s->x_bytes));
    TK_TRY(span(fn, "residual", "p->residual_row_stride", true, p->rows, p->cols,
                s->residual_stride, es, &s->residual_bytes));
    TK_TRY(span(fn, "y", "p->y_row_stride", true, p->rows, p->cols, s->y_stride, es, &s->y_bytes));
    s->param_bytes = (size_t)p->cols * tk_dtype_size(p->weight_dtype);
    s->stat_bytes = (size_t)p->rows * sizeof(float);
    return TK_SUCCESS;
}

static size_t workspace_bytes_for(const tk_norm_params *p, bool layernorm) {
    return (size_t)tk_norm_workspace_slots(p->rows, p->cols) * (size_t)p->cols * sizeof(float) *
           (layernorm ? 2u : 1u);
}

/* A tensor of the call, for the alignment and overlap checks. */
typedef struct norm_tensor {
    const char *name;
    const void *ptr;   /* NULL: absent */
    size_t bytes;
    size_t alignment;  /* element size */
    bool output;
    unsigned alias_ok; /* bit i: may be exactly tensor i (same pointer, same span) */
} norm_tensor;

static tk_status check_tensors(const char *fn, const norm_tensor *t, int count) {
    for (int i = 0; i < count; i++)
        TK_TRY(tk_check_aligned(fn, t[i].name, t[i].ptr, t[i].alignment));
    for (int i = 0; i < count; i++) {
        if (!t[i].output || t[i].ptr == NULL)
            continue;
        for (int k = 0; k < count; k++)
            if (k != i)
                TK_TRY(tk_check_overlap(fn, t[i].name, t[i].ptr, t[i].bytes, t[k].name, t[k].ptr,
                                        t[k].bytes, t[i].alias_ok >> k & 1u));
    }
    return TK_SUCCESS;
}

static tk_status launch_norm(const char *fn, const tk_norm_call *call, tk_stream_t stream) {
    const tk_device *dev;
    TK_TRY(tk_current_device(fn, &dev));
    const tk_variant *v;
    TK_TRY(tk_select_variant(fn, call->backward ? &tk_op_norm_bwd : &tk_op_norm, dev, call, &v));
    return tk_launched(fn, v, v->launch(call, dev, stream));
}

static tk_norm_call base_call(const tk_norm_params *p, const norm_shape *s, bool layernorm,
                              bool backward) {
    tk_norm_call c = {0};
    c.layernorm = layernorm;
    c.dtype = p->dtype;
    c.weight_dtype = p->weight_dtype;
    c.backward = backward;
    c.gemma = p->gemma != 0;
    c.rows = p->rows;
    c.cols = p->cols;
    c.x_stride = s->x_stride;
    c.residual_stride = s->residual_stride;
    c.y_stride = s->y_stride;
    c.eps = p->eps;
    return c;
}

/* ------------------------------------------------------------------------ forward ---- */

static tk_status norm_fwd(const char *fn, bool layernorm, const tk_norm_params *given,
                          const void *x, void *residual, const void *weight, const void *bias,
                          void *y, float *mean, float *rstd, tk_stream_t stream) {
    tk_norm_params params;
    const tk_norm_params *p = &params;
    norm_shape s;
    TK_TRY(check_params(fn, given, &params, &s));
    if (p->rows == 0)
        return TK_SUCCESS;
    TK_TRY(tk_check_not_null(fn, "x", x));
    TK_TRY(tk_check_not_null(fn, "y", y));
    const size_t es = tk_dtype_size(p->dtype), ws = tk_dtype_size(p->weight_dtype);
    enum { X, RESIDUAL, WEIGHT, BIAS, Y, MEAN, RSTD, COUNT };
    const norm_tensor t[COUNT] = {
        [X] = {"x", x, s.x_bytes, es, false, 0},
        [RESIDUAL] = {"residual", residual, s.residual_bytes, es, true, 0},
        [WEIGHT] = {"weight", weight, s.param_bytes, ws, false, 0},
        [BIAS] = {"bias", bias, s.param_bytes, ws, false, 0},
        [Y] = {"y", y, s.y_bytes, es, true, 1u << X},
        [MEAN] = {"mean", mean, s.stat_bytes, sizeof(float), true, 0},
        [RSTD] = {"rstd", rstd, s.stat_bytes, sizeof(float), true, 0},
    };
    TK_TRY(check_tensors(fn, t, COUNT));

    tk_norm_call call = base_call(p, &s, layernorm, false);
    call.x = x;
    call.residual = residual;
    call.weight = weight;
    call.bias = bias;
    call.y = y;
    call.mean_out = mean;
    call.rstd_out = rstd;
    return launch_norm(fn, &call, stream);
}

TK_API tk_status tk_rmsnorm_fwd(const tk_norm_params *p, const void *x, void *residual,
                                const void *weight, void *y, float *rstd, tk_stream_t stream) {
    tk_begin_call();
    return norm_fwd("tk_rmsnorm_fwd", false, p, x, residual, weight, NULL, y, NULL, rstd, stream);
}

TK_API tk_status tk_layernorm_fwd(const tk_norm_params *p, const void *x, void *residual,
                                  const void *weight, const void *bias, void *y, float *mean,
                                  float *rstd, tk_stream_t stream) {
    tk_begin_call();
    return norm_fwd("tk_layernorm_fwd", true, p, x, residual, weight, bias, y, mean, rstd, stream);
}

/* ----------------------------------------------------------------------- backward ---- */

TK_API tk_status tk_norm_bwd_workspace_size(const tk_norm_params *given, tk_norm_kind kind,
                                            size_t *bytes) {
    static const char fn[] = "tk_norm_bwd_workspace_size";
    tk_begin_call();
    tk_norm_params params;
    const tk_norm_params *p = &params;
    norm_shape s;
    TK_TRY(check_params(fn, given, &params, &s));
    if (kind != TK_NORM_RMS && kind != TK_NORM_LAYER)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "argument 'kind' = %d is not TK_NORM_RMS (0) or TK_NORM_LAYER (1)", (int)kind);
    TK_TRY(tk_check_not_null(fn, "bytes", bytes));
    *bytes = workspace_bytes_for(p, kind == TK_NORM_LAYER);
    return TK_SUCCESS;
}

static tk_status norm_bwd(const char *fn, bool layernorm, const tk_norm_params *given,
                          const void *dy, const void *x, const void *weight, const float *mean,
                          const float *rstd, void *dx, void *dw, void *db, void *workspace,
                          size_t workspace_bytes, tk_stream_t stream) {
    tk_norm_params params;
    const tk_norm_params *p = &params;
    norm_shape s;
    TK_TRY(check_params(fn, given, &params, &s));
    if (p->rows == 0)
        return TK_SUCCESS;
    TK_TRY(tk_check_not_null(fn, "dy", dy));
    TK_TRY(tk_check_not_null(fn, "x", x));
    if (layernorm)
        TK_TRY(tk_check_not_null(fn, "mean", mean));
    TK_TRY(tk_check_not_null(fn, "rstd", rstd));
    TK_TRY(tk_check_not_null(fn, "dx", dx));
    const bool reduce = dw != NULL || db != NULL;
    const size_t needed = reduce ? workspace_bytes_for(p, layernorm) : 0;
    if (reduce) {
        TK_TRY(tk_check_not_null(fn, "workspace", workspace));
        TK_TRY(tk_check_aligned(fn, "workspace", workspace, 16));
        if (workspace_bytes < needed)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "argument 'workspace_bytes' = %zu is smaller than the %zu bytes this shape "
                           "needs (see tk_norm_bwd_workspace_size)",
                           workspace_bytes, needed);
    }
    const size_t es = tk_dtype_size(p->dtype), ws = tk_dtype_size(p->weight_dtype);
    enum { DY, X, WEIGHT, MEAN, RSTD, DX, DW, DB, WORKSPACE, COUNT };
    const norm_tensor t[COUNT] = {
        [DY] = {"dy", dy, s.y_bytes, es, false, 0},
        [X] = {"x", x, s.x_bytes, es, false, 0},
        [WEIGHT] = {"weight", weight, s.param_bytes, ws, false, 0},
        [MEAN] = {"mean", mean, s.stat_bytes, sizeof(float), false, 0},
        [RSTD] = {"rstd", rstd, s.stat_bytes, sizeof(float), false, 0},
        [DX] = {"dx", dx, s.x_bytes, es, true, (1u << DY) | (1u << X)},
        [DW] = {"dw", dw, s.param_bytes, ws, true, 0},
        [DB] = {"db", db, s.param_bytes, ws, true, 0},
        [WORKSPACE] = {"workspace", reduce ? workspace : NULL, needed, 16, true, 0},
    };
    TK_TRY(check_tensors(fn, t, COUNT));

    tk_norm_call call = base_call(p, &s, layernorm, true);
    call.x = x;
    call.dy = dy;
    call.weight = weight;
    call.mean_in = layernorm ? mean : NULL;
    call.rstd_in = rstd;
    call.dx = dx;
    call.dw = dw;
    call.db = db;
    call.workspace = reduce ? workspace : NULL;
    call.workspace_slots = tk_norm_workspace_slots(p->rows, p->cols);
    return launch_norm(fn, &call, stream);
}

TK_API tk_status tk_rmsnorm_bwd(const tk_norm_params *p, const void *dy, const void *x,
                                const void *weight, const float *rstd, void *dx, void *dw,
                                void *workspace, size_t workspace_bytes, tk_stream_t stream) {
    tk_begin_call();
    return norm_bwd("tk_rmsnorm_bwd", false, p, dy, x, weight, NULL, rstd, dx, dw, NULL, workspace,
                    workspace_bytes, stream);
}

TK_API tk_status tk_layernorm_bwd(const tk_norm_params *p, const void *dy, const void *x,
                                  const void *weight, const float *mean, const float *rstd,
                                  void *dx, void *dw, void *db, void *workspace,
                                  size_t workspace_bytes, tk_stream_t stream) {
    tk_begin_call();
    return norm_bwd("tk_layernorm_bwd", true, p, dy, x, weight, mean, rstd, dx, dw, db, workspace,
                    workspace_bytes, stream);
}
