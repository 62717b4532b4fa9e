/*
 * tk_gemm and tk_gemm_supported: argument checks (no CUDA call), then dispatch over the "gemm"
 * variants (cuda/gemm.h). The kernels are described in cuda/gemm.cu and docs/kernels/gemm.md.
 */
#include <math.h>

#include "runtime.h"
#include "../cuda/gemm.h"

/* Best first. wgmma_128x256 is arch-specific: only cc 9.0 devices with an sm_90a binary. */
static const tk_variant gemm_variants[] = {
    {"wgmma_128x256", TK_CC_HOPPER, true, tk_gemm_supports_wgmma_128x256, tk_launch_gemm_wgmma_128x256, NULL},
    {"mma_128x256", TK_CC_AMPERE, false, tk_gemm_supports_mma_128x256, tk_launch_gemm_mma_128x256, NULL},
    {"mma_128x128", TK_CC_AMPERE, false, tk_gemm_supports_mma_128x128, tk_launch_gemm_mma_128x128, NULL},
    {"mma_unaligned", TK_CC_AMPERE, false, tk_gemm_supports_mma_unaligned, tk_launch_gemm_mma_unaligned, NULL},
};
const tk_op tk_op_gemm = {"gemm", gemm_variants, TK_VARIANT_COUNT(gemm_variants)};

/* A row-major matrix operand as the overlap check sees it. */
typedef struct matrix_span {
    const char *name;
    const void *p;
    size_t bytes; /* from the first element to one past the last: ((rows - 1) * ld + cols) */
} matrix_span;

static tk_status check_size(const char *fn, const char *name, int64_t v) {
    if (v >= 1)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn, "argument '%s' = %lld; accepted: >= 1", name,
                   (long long)v);
}

static tk_status check_ld(const char *fn, const char *name, int64_t ld, const char *row_name,
                          int64_t row) {
    if (ld >= row)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                   "argument '%s' = %lld is smaller than its row length %s = %lld; accepted: "
                   ">= %lld",
                   name, (long long)ld, row_name, (long long)row, (long long)row);
}

static tk_status check_finite(const char *fn, const char *name, float v) {
    if (isfinite(v))
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn, "argument '%s' = %g; accepted: a finite value",
                   name, (double)v);
}

/* The span of a rows x cols matrix with leading dimension ld (ld >= cols, all >= 1). */
static tk_status span_of(const char *fn, const char *name, const void *p, int64_t rows,
                         int64_t cols, int64_t ld, size_t elem, matrix_span *out) {
    const tk_layout l = tk_rows_layout(rows, cols, ld);
    *out = (matrix_span){name, p, 0};
    return tk_layout_bytes(fn, name, &l, elem, &out->bytes);
}

/* Checks every argument (never dereferencing a matrix pointer) and packs the call. */
static tk_status validate(const char *fn, const tk_gemm_params *given, tk_gemm_call *call) {
    tk_gemm_params params;
    TK_TRY(TK_READ_PARAMS(fn, "p", given, &params, tk_gemm_params, TK_GEMM_PARAMS_INIT,
                          TK_GEMM_PARAMS_SIZE_0_1));
    const tk_gemm_params *p = &params;
    TK_TRY(check_size(fn, "p->m", p->m));
    TK_TRY(check_size(fn, "p->n", p->n));
    TK_TRY(check_size(fn, "p->k", p->k));

    TK_TRY(tk_check_dtype(fn, "p->input_dtype", p->input_dtype));
    if (p->input_dtype == TK_F32)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "argument 'p->input_dtype' = TK_F32 has no GEMM kernel; accepted: TK_F16, "
                       "TK_BF16");
    TK_TRY(tk_check_dtype(fn, "p->output_dtype", p->output_dtype));
    if (p->b_layout != TK_GEMM_B_KN && p->b_layout != TK_GEMM_B_NK)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "argument 'p->b_layout' = %d is not a layout; accepted: TK_GEMM_B_KN, "
                       "TK_GEMM_B_NK",
                       (int)p->b_layout);
    if ((int)p->activation < (int)TK_ACT_NONE || (int)p->activation > (int)TK_ACT_RELU_SQUARED)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "argument 'p->activation' = %d is not a tk_activation; accepted: "
                       "TK_ACT_NONE .. TK_ACT_RELU_SQUARED (0 .. 6)",
                       (int)p->activation);
    TK_TRY(check_finite(fn, "p->alpha", p->alpha));
    TK_TRY(check_finite(fn, "p->beta", p->beta));

    const bool reads_c = p->beta != 0.0f;
    TK_TRY(tk_check_not_null(fn, "p->a", p->a));
    TK_TRY(tk_check_not_null(fn, "p->b", p->b));
    if (reads_c && p->c == NULL)
        return tk_fail(TK_ERROR_NULL_POINTER, fn,
                       "argument 'p->c' is NULL but p->beta = %g != 0; a device pointer is "
                       "required (or beta = 0)",
                       (double)p->beta);
    TK_TRY(tk_check_not_null(fn, "p->d", p->d));

    const bool b_kn = p->b_layout == TK_GEMM_B_KN;
    TK_TRY(check_ld(fn, "p->lda", p->lda, "k", p->k));
    TK_TRY(check_ld(fn, "p->ldb", p->ldb, b_kn ? "n (b_layout TK_GEMM_B_KN)" : "k (b_layout TK_GEMM_B_NK)",
                    b_kn ? p->n : p->k));
    if (reads_c)
        TK_TRY(check_ld(fn, "p->ldc", p->ldc, "n", p->n));
    TK_TRY(check_ld(fn, "p->ldd", p->ldd, "n", p->n));

    const size_t in_size = tk_dtype_size(p->input_dtype), out_size = tk_dtype_size(p->output_dtype);
    TK_TRY(tk_check_aligned(fn, "p->a", p->a, in_size));
    TK_TRY(tk_check_aligned(fn, "p->b", p->b, in_size));
    if (reads_c)
        TK_TRY(tk_check_aligned(fn, "p->c", p->c, out_size));
    TK_TRY(tk_check_aligned(fn, "p->bias", p->bias, out_size));
    TK_TRY(tk_check_aligned(fn, "p->d", p->d, out_size));

    matrix_span d, inputs[4];
    int input_count = 0;
    const tk_layout d_layout = tk_rows_layout(p->m, p->n, p->ldd);
    d = (matrix_span){"p->d", p->d, 0};
    TK_TRY(tk_layout_bytes(fn, "p->d", &d_layout, out_size, &d.bytes));
    TK_TRY(tk_check_disjoint(fn, "p->d", "p->ldd", &d_layout));
    TK_TRY(span_of(fn, "p->a", p->a, p->m, p->k, p->lda, in_size, &inputs[input_count++]));
    TK_TRY(span_of(fn, "p->b", p->b, b_kn ? p->k : p->n, b_kn ? p->n : p->k, p->ldb, in_size,
                   &inputs[input_count++]));
    if (p->bias)
        TK_TRY(span_of(fn, "p->bias", p->bias, 1, p->n, p->n, out_size, &inputs[input_count++]));
    if (reads_c && !(p->c == p->d && p->ldc == p->ldd))
        TK_TRY(span_of(fn, "p->c", p->c, p->m, p->n, p->ldc, out_size, &inputs[input_count++]));
    /* p->c exactly in place was left out above: each element of C is read before the same
     * element of D is written. */
    for (int i = 0; i < input_count; i++)
        TK_TRY(tk_check_overlap(fn, "p->d", d.p, d.bytes, inputs[i].name, inputs[i].p,
                                inputs[i].bytes, false));

    *call = (tk_gemm_call){
        .m = p->m,
        .n = p->n,
        .k = p->k,
        .input_dtype = p->input_dtype,
        .output_dtype = p->output_dtype,
        .b_layout = p->b_layout,
        .activation = p->activation,
        .a = p->a,
        .b = p->b,
        .c = reads_c ? p->c : NULL,
        .bias = p->bias,
        .d = p->d,
        .lda = p->lda,
        .ldb = p->ldb,
        .ldc = reads_c ? p->ldc : 0,
        .ldd = p->ldd,
        .alpha = p->alpha,
        .beta = p->beta,
    };
    return TK_SUCCESS;
}

/* Validation, the device, and the variant that would run. */
static tk_status prepare(const char *fn, const tk_gemm_params *p, tk_gemm_call *call,
                         const tk_device **dev, const tk_variant **v) {
    TK_TRY(validate(fn, p, call));
    TK_TRY(tk_current_device(fn, dev));
    return tk_select_variant(fn, &tk_op_gemm, *dev, call, v);
}

TK_API tk_status tk_gemm(const tk_gemm_params *p, tk_stream_t stream) {
    static const char fn[] = "tk_gemm";
    tk_begin_call();
    tk_gemm_call call;
    const tk_device *dev;
    const tk_variant *v;
    TK_TRY(prepare(fn, p, &call, &dev, &v));
    return tk_launched(fn, v, v->launch(&call, dev, stream));
}

TK_API tk_status tk_gemm_supported(const tk_gemm_params *p, const char **variant_name) {
    static const char fn[] = "tk_gemm_supported";
    tk_begin_call();
    if (variant_name)
        *variant_name = NULL;
    tk_gemm_call call;
    const tk_device *dev;
    const tk_variant *v;
    TK_TRY(prepare(fn, p, &call, &dev, &v));
    if (variant_name)
        *variant_name = v->name;
    return TK_SUCCESS;
}
