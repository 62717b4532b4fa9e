/* RMSNorm and LayerNorm: bad input on the host (runs everywhere), then forward and backward
 * against the fp64 reference on the GPU over shapes x dtypes x variants, determinism of the
 * dw / db reduction, the automatic variant choice and large tensors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/norm_ref.h"

/* Each direction's variants (the same names both ways). */
static const char *const FWD_VARIANTS[] = {"vec16", "cluster_vec16", "wide_vec16", "scalar", "wide_scalar"};
static const char *const BWD_VARIANTS[] = {"vec16", "cluster_vec16", "wide_vec16", "scalar", "wide_scalar"};
#define FWD_VARIANT_COUNT (sizeof FWD_VARIANTS / sizeof FWD_VARIANTS[0])
#define BWD_VARIANT_COUNT (sizeof BWD_VARIANTS / sizeof BWD_VARIANTS[0])
static const struct { tk_dtype dtype, weight_dtype; } DTYPES[] = {
    {TK_F32, TK_F32}, {TK_F16, TK_F16}, {TK_F16, TK_F32}, {TK_BF16, TK_BF16}, {TK_BF16, TK_F32},
};

static tk_norm_params norm_params(tk_dtype dtype, tk_dtype weight_dtype, int64_t rows, int64_t cols) {
    tk_norm_params p = TK_NORM_PARAMS_INIT;
    p.dtype = dtype;
    p.weight_dtype = weight_dtype;
    p.rows = rows;
    p.cols = cols;
    p.eps = 1e-5f;
    return p;
}

/* ------------------------------------------------------------------ bad input (host) ---- */

/* Fake "device" buffers: host memory with a sentinel; validation must reject before any use. */
static unsigned char in_buf[8192] __attribute__((aligned(16)));
static unsigned char out_buf[8192] __attribute__((aligned(16)));

static void reset_buffers(void) {
    tk_fill_sentinel(in_buf, sizeof in_buf);
    tk_fill_sentinel(out_buf, sizeof out_buf);
}

#define EXPECT_REJECTED(call, status, needle)                                                 \
    do {                                                                                      \
        reset_buffers();                                                                      \
        TK_EXPECT_STATUS(call, status, needle);                                               \
        cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s wrote its output", #call);    \
        cr_assert(tk_is_sentinel(in_buf, sizeof in_buf), "%s wrote its input", #call);       \
    } while (0)

/* 4 rows of 16 bf16: x at in_buf, weight / bias at in_buf + 1024 / 2048, residual in out_buf +
 * 2048, y at out_buf, stats at out_buf + 4096 / 4608, backward extras further on. */
#define BUF_X in_buf
#define BUF_W (in_buf + 1024)
#define BUF_B (in_buf + 2048)
#define BUF_DY (in_buf + 3072)
#define BUF_Y out_buf
#define BUF_RES (out_buf + 2048)
#define BUF_MEAN ((float *)(out_buf + 4096))
#define BUF_RSTD ((float *)(out_buf + 4608))
#define BUF_DW (out_buf + 5120)
#define BUF_DB (out_buf + 5632)
#define BUF_WS (out_buf + 6144)

Test(norm_args, rejects_bad_forward_arguments) {
    const tk_norm_params ok = norm_params(TK_BF16, TK_BF16, 4, 16);
    tk_norm_params p;
    EXPECT_REJECTED(tk_rmsnorm_fwd(NULL, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_NULL_POINTER, "'p'");
    p = ok; p.size = 8;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->size");
    EXPECT_REJECTED(tk_rmsnorm_fwd(&ok, NULL, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_NULL_POINTER, "'x'");
    EXPECT_REJECTED(tk_layernorm_fwd(&ok, BUF_X, NULL, BUF_W, BUF_B, NULL, BUF_MEAN, BUF_RSTD, NULL), TK_ERROR_NULL_POINTER, "'y'");
    p = ok; p.eps = 0.0f;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->eps");
    p = ok; p.eps = -1e-5f;
    EXPECT_REJECTED(tk_layernorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_B, BUF_Y, BUF_MEAN, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->eps");
    p = ok; p.eps = NAN;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->eps");
    p = ok; p.eps = INFINITY;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->eps");
    p = ok; p.cols = 0;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->cols");
    p = ok; p.cols = -16;
    EXPECT_REJECTED(tk_layernorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_B, BUF_Y, BUF_MEAN, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->cols");
    p = ok; p.cols = 262145;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->cols");
    p = ok; p.rows = -1;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->rows");
    p = ok; p.x_row_stride = 15;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->x_row_stride");
    p = ok; p.residual_row_stride = -3;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, BUF_RES, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->residual_row_stride");
    p = ok; p.y_row_stride = 8;
    EXPECT_REJECTED(tk_layernorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_B, BUF_Y, BUF_MEAN, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->y_row_stride");
    p = ok; p.rows = INT64_MAX / 4; p.x_row_stride = 1 << 20;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "overflows");
    p = ok; p.gemma = 2;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->gemma");
    p = ok; p.dtype = (tk_dtype)9;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->dtype");
    p = ok; p.weight_dtype = (tk_dtype)-2;
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_INVALID_VALUE, "p->weight_dtype");
    p = ok; p.weight_dtype = TK_F16; /* bf16 rows with f16 weights */
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_NOT_SUPPORTED, "p->weight_dtype");
    p = norm_params(TK_F32, TK_BF16, 4, 16); /* f32 rows with 16-bit weights */
    EXPECT_REJECTED(tk_layernorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_B, BUF_Y, BUF_MEAN, BUF_RSTD, NULL), TK_ERROR_NOT_SUPPORTED, "p->weight_dtype");
    /* Misaligned pointers (an odd byte address for 2-byte elements, 2 bytes for f32 stats). */
    EXPECT_REJECTED(tk_rmsnorm_fwd(&ok, BUF_X + 1, NULL, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_MISALIGNED, "'x'");
    EXPECT_REJECTED(tk_layernorm_fwd(&ok, BUF_X, NULL, BUF_W, BUF_B + 1, BUF_Y, BUF_MEAN, BUF_RSTD, NULL), TK_ERROR_MISALIGNED, "'bias'");
    EXPECT_REJECTED(tk_rmsnorm_fwd(&ok, BUF_X, NULL, BUF_W, BUF_Y, (float *)(out_buf + 4610), NULL), TK_ERROR_MISALIGNED, "'rstd'");
    /* Overlaps: y partially over x; y over residual, weight, stats; residual over x; stats over
     * each other. */
    EXPECT_REJECTED(tk_rmsnorm_fwd(&ok, BUF_X, NULL, BUF_W, BUF_X + 2, BUF_RSTD, NULL), TK_ERROR_OVERLAP, "'y' overlaps 'x'");
    p = ok; p.y_row_stride = 32; /* same pointer as x but another stride: not an exact alias */
    EXPECT_REJECTED(tk_rmsnorm_fwd(&p, BUF_X, NULL, BUF_W, BUF_X, BUF_RSTD, NULL), TK_ERROR_OVERLAP, "'y' overlaps 'x'");
    EXPECT_REJECTED(tk_rmsnorm_fwd(&ok, BUF_X, BUF_Y, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_OVERLAP, "'residual'");
    EXPECT_REJECTED(tk_rmsnorm_fwd(&ok, BUF_X, BUF_X, BUF_W, BUF_Y, BUF_RSTD, NULL), TK_ERROR_OVERLAP, "'residual' overlaps 'x'");
    EXPECT_REJECTED(tk_rmsnorm_fwd(&ok, BUF_X, NULL, BUF_Y + 64, BUF_Y, BUF_RSTD, NULL), TK_ERROR_OVERLAP, "'weight'");
    EXPECT_REJECTED(tk_layernorm_fwd(&ok, BUF_X, NULL, BUF_W, BUF_B, BUF_Y, BUF_MEAN, BUF_MEAN + 2, NULL), TK_ERROR_OVERLAP, "'mean'");
    EXPECT_REJECTED(tk_rmsnorm_fwd(&ok, BUF_X, NULL, BUF_W, BUF_Y, (float *)(BUF_Y + 16), NULL), TK_ERROR_OVERLAP, "'rstd'");
}

Test(norm_args, rejects_bad_backward_arguments) {
    const tk_norm_params ok = norm_params(TK_BF16, TK_BF16, 4, 16);
    tk_norm_params p = ok;
    size_t ws = 0;
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&ok, TK_NORM_LAYER, &ws), TK_SUCCESS, "");
    cr_assert(ws > 0 && ws <= 1024, "workspace %zu bytes for 4 x 16", ws);
    const float *mean = (const float *)(in_buf + 4096), *rstd = (const float *)(in_buf + 4608);
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, NULL, BUF_X, BUF_W, rstd, BUF_Y, BUF_DW, BUF_WS, ws, NULL), TK_ERROR_NULL_POINTER, "'dy'");
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, NULL, BUF_W, rstd, BUF_Y, BUF_DW, BUF_WS, ws, NULL), TK_ERROR_NULL_POINTER, "'x'");
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, NULL, BUF_Y, BUF_DW, BUF_WS, ws, NULL), TK_ERROR_NULL_POINTER, "'rstd'");
    EXPECT_REJECTED(tk_layernorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, NULL, rstd, BUF_Y, BUF_DW, BUF_DB, BUF_WS, ws, NULL), TK_ERROR_NULL_POINTER, "'mean'");
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, rstd, NULL, BUF_DW, BUF_WS, ws, NULL), TK_ERROR_NULL_POINTER, "'dx'");
    EXPECT_REJECTED(tk_layernorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, mean, rstd, BUF_Y, NULL, BUF_DB, NULL, ws, NULL), TK_ERROR_NULL_POINTER, "'workspace'");
    EXPECT_REJECTED(tk_layernorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, mean, rstd, BUF_Y, BUF_DW, BUF_DB, BUF_WS, ws - 4, NULL), TK_ERROR_INVALID_VALUE, "'workspace_bytes'");
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, rstd, BUF_Y, BUF_DW, BUF_WS + 4, ws, NULL), TK_ERROR_MISALIGNED, "'workspace'");
    p.eps = NAN;
    EXPECT_REJECTED(tk_rmsnorm_bwd(&p, BUF_DY, BUF_X, BUF_W, rstd, BUF_Y, BUF_DW, BUF_WS, ws, NULL), TK_ERROR_INVALID_VALUE, "p->eps");
    p = ok; p.cols = 0;
    EXPECT_REJECTED(tk_layernorm_bwd(&p, BUF_DY, BUF_X, BUF_W, mean, rstd, BUF_Y, BUF_DW, BUF_DB, BUF_WS, ws, NULL), TK_ERROR_INVALID_VALUE, "p->cols");
    p = ok; p.x_row_stride = 3;
    EXPECT_REJECTED(tk_rmsnorm_bwd(&p, BUF_DY, BUF_X, BUF_W, rstd, BUF_Y, BUF_DW, BUF_WS, ws, NULL), TK_ERROR_INVALID_VALUE, "p->x_row_stride");
    p = ok; p.weight_dtype = TK_F16;
    EXPECT_REJECTED(tk_rmsnorm_bwd(&p, BUF_DY, BUF_X, BUF_W, rstd, BUF_Y, BUF_DW, BUF_WS, ws, NULL), TK_ERROR_NOT_SUPPORTED, "p->weight_dtype");
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, rstd, BUF_Y, BUF_DW + 1, BUF_WS, ws, NULL), TK_ERROR_MISALIGNED, "'dw'");
    /* dx partially over dy; dw over dx; db over dw; workspace over dx and over x. */
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, rstd, BUF_DY + 32, BUF_DW, BUF_WS, ws, NULL), TK_ERROR_OVERLAP, "'dx' overlaps 'dy'");
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, rstd, BUF_Y, BUF_Y + 32, BUF_WS, ws, NULL), TK_ERROR_OVERLAP, "'dx'");
    EXPECT_REJECTED(tk_layernorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, mean, rstd, BUF_Y, BUF_DW, BUF_DW + 16, BUF_WS, ws, NULL), TK_ERROR_OVERLAP, "'dw' overlaps 'db'");
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, rstd, BUF_Y, BUF_DW, BUF_Y + 64, ws, NULL), TK_ERROR_OVERLAP, "'dx' overlaps 'workspace'");
    EXPECT_REJECTED(tk_rmsnorm_bwd(&ok, BUF_DY, BUF_X, BUF_W, rstd, BUF_Y, BUF_DW, BUF_X, ws, NULL), TK_ERROR_OVERLAP, "'workspace' overlaps 'x'");
    /* The workspace query checks its arguments too, and leaves *bytes alone when it fails. */
    reset_buffers();
    tk_fill_sentinel(&ws, sizeof ws);
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&ok, (tk_norm_kind)5, &ws), TK_ERROR_INVALID_VALUE, "'kind'");
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&ok, TK_NORM_RMS, NULL), TK_ERROR_NULL_POINTER, "'bytes'");
    p = ok; p.cols = -1;
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&p, TK_NORM_RMS, &ws), TK_ERROR_INVALID_VALUE, "p->cols");
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(NULL, TK_NORM_RMS, &ws), TK_ERROR_NULL_POINTER, "'p'");
    cr_assert(tk_is_sentinel(&ws, sizeof ws), "tk_norm_bwd_workspace_size wrote *bytes on failure");
}

Test(norm_args, empty_is_a_noop_and_workspace_sizes) {
    tk_norm_params p = norm_params(TK_BF16, TK_F32, 0, 4096);
    TK_EXPECT_STATUS(tk_rmsnorm_fwd(&p, NULL, NULL, NULL, NULL, NULL, NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_layernorm_bwd(&p, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL), TK_SUCCESS, "");
    cr_assert_str_empty(tk_last_error());
    size_t bytes = 1;
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&p, TK_NORM_RMS, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, 0);
    /* Device-independent sizes: 2^22 floats per reduced tensor for many rows, rows x cols for few. */
    p.rows = 16384;
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&p, TK_NORM_RMS, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, (size_t)1024 * 4096 * 4);
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&p, TK_NORM_LAYER, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, (size_t)2 * 1024 * 4096 * 4);
    p.rows = 3;
    p.cols = 262144;
    TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&p, TK_NORM_RMS, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, (size_t)3 * 262144 * 4);
}

Test(norm_args, force_variant_names) {
    for (size_t v = 0; v < FWD_VARIANT_COUNT; v++)
        TK_EXPECT_STATUS(tk_experimental_force_variant("norm", FWD_VARIANTS[v]), TK_SUCCESS, "");
    for (size_t v = 0; v < BWD_VARIANT_COUNT; v++)
        TK_EXPECT_STATUS(tk_experimental_force_variant("norm_bwd", BWD_VARIANTS[v]), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("norm", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("norm_bwd", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("norm", "fast"), TK_ERROR_INVALID_VALUE, "\"wide_scalar\"");
    TK_EXPECT_STATUS(tk_experimental_force_variant("norm_bwd", "fast"), TK_ERROR_INVALID_VALUE,
                     "\"fast\" is not a variant of \"norm_bwd\"");
}

Test(norm_args, no_device_is_reported) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; this test covers machines without one");
    tk_norm_params p = norm_params(TK_F32, TK_F32, 2, 8);
    reset_buffers();
    TK_EXPECT_STATUS(tk_rmsnorm_fwd(&p, in_buf, NULL, NULL, out_buf, NULL, NULL), TK_ERROR_NO_DEVICE,
                     "no usable CUDA device");
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
}

#undef BUF_X
#undef BUF_W
#undef BUF_B
#undef BUF_DY
#undef BUF_Y
#undef BUF_RES
#undef BUF_MEAN
#undef BUF_RSTD
#undef BUF_DW
#undef BUF_DB
#undef BUF_WS

/* ------------------------------------------------------------------------ GPU checks ---- */

/* One case. Row tensors are laid out with strides cols + pad and start `offset` elements into
 * their allocation (misalignment); padding and the offset prefix must stay untouched. */
typedef struct norm_case {
    bool layernorm, backward;
    tk_dtype dtype, weight_dtype;
    int64_t rows, cols, x_pad, r_pad, y_pad;
    int offset;
    bool residual, weight, bias, gemma, stats, in_place; /* backward: bias = db, stats = dw */
    const char *variant; /* forced, or NULL for the automatic choice */
    const char *expect;  /* with variant NULL: the variant that must run */
} norm_case;

/* "cluster_vec16" needs a cc >= 9.0 device and code of the build that runs on it (the runtime's
 * rule: min_cc 900, not arch-specific). */
static bool clusters_run_here(void) {
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    return tk_build_runs_variant(900, info.compute_capability);
}

/* Whether this device holds the backward ring kernel's block for a 16-bit row of `cols` (a
 * multiple of 8) columns: up to 8192, 2 packs of 16 bytes per thread and tensor, 128 bytes of
 * ring per thread (at most 64 KB: every device); past it 4 packs and 384 bytes per thread (the
 * ring and w' as f32) on ceil(cols / 32) threads rounded up to a warp, plus 256 bytes of static
 * shared memory: a 16384-wide row takes 192 KB (H100 / H200: yes; A100: up to 13312 columns;
 * sm_86 / sm_89: no). */
static bool bwd_ring_fits(int64_t cols) {
    if (cols <= 8192)
        return true;
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    const int64_t threads = ((cols / 8 + 3) / 4 + 31) / 32 * 32;
    return threads * 384 + 256 <= info.max_smem_per_block;
}

/* Whether this device holds the backward cluster kernel's block for a row of `cols` elements of
 * `es` bytes (past the ring / rows kernels' reach, within 8 slices of 2048 16-byte packs): the
 * slices as even as whole packs allow, a thread per 4 packs rounded up to a warp, 384 bytes a
 * thread for 16-bit rows and 320 for f32 (the 2-stage ring of x and dy, and w' as f32), plus 2304
 * bytes of static shared memory: a 32 KB slice takes 192 / 160 KB (H100 / H200: every such row). */
static bool bwd_cluster_fits(int64_t cols, int64_t es) {
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    const int64_t packs = cols * es / 16, blocks = (packs + 2047) / 2048, slice = (packs + blocks - 1) / blocks;
    const int64_t threads = ((slice + 3) / 4 + 31) / 32 * 32;
    return threads * (256 + 4 * (16 / es) * 4) + 2304 <= info.max_smem_per_block;
}

/* Whether `variant` claims the case (the documented rule; cross-checked against the library). */
static bool variant_claims(const norm_case *c, const char *variant) {
    const int64_t es = (int64_t)tk_test_dtype_size(c->dtype);
    const bool aligned = c->offset == 0 && (c->cols * es) % 16 == 0 && ((c->cols + c->x_pad) * es) % 16 == 0 &&
                         ((c->cols + c->r_pad) * es) % 16 == 0 && ((c->cols + c->y_pad) * es) % 16 == 0;
    /* 16-bit rows of up to 16384 elements (forward on one block, 32 KB; backward on the ring
     * kernel where the device's shared memory holds it); the rest 8192 forward and backward;
     * scalars 4096 both ways. A cluster: 8 blocks (the portable size), backward where the
     * device's shared memory holds the block; the device is taken to hold at least one such
     * cluster (every whole H100 / H200 does; a small MIG slice may not, and there the library
     * declines the variant while these expectations do not). */
    const int64_t vec_limit = es == 2 ? 16384 : 8192, scalar_limit = 4096;
    const int64_t cluster_limit = 8 * vec_limit;
    if (!strcmp(variant, "vec16"))
        return aligned && c->cols <= vec_limit && (!c->backward || es != 2 || bwd_ring_fits(c->cols));
    if (!strcmp(variant, "cluster_vec16"))
        return aligned && c->cols > vec_limit && c->cols <= cluster_limit && clusters_run_here() &&
               (!c->backward || bwd_cluster_fits(c->cols, es));
    if (!strcmp(variant, "wide_vec16"))
        return aligned;
    if (!strcmp(variant, "scalar"))
        return c->cols <= scalar_limit;
    return true;
}

typedef struct host_tensor {
    unsigned char *host;
    void *dev;
    size_t bytes;
} host_tensor;

static host_tensor tensor_new(tk_dtype dtype, int64_t elems) {
    host_tensor t = {NULL, NULL, (size_t)elems * tk_test_dtype_size(dtype)};
    t.host = malloc(t.bytes);
    cr_assert(t.host != NULL);
    t.dev = tk_dev_alloc(t.bytes);
    return t;
}

static void tensor_free(host_tensor *t) {
    free(t->host);
    tk_dev_free(t->dev);
}

/* Dense doubles of a strided [rows, cols] tensor starting `offset` elements in. */
static double *gather(tk_dtype dtype, const void *base, int offset, int64_t rows, int64_t cols, int64_t stride) {
    double *d = malloc((size_t)(rows * cols) * sizeof(double));
    cr_assert(d != NULL);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            d[r * cols + c] = tk_test_load(dtype, base, offset + r * stride + c);
    return d;
}

/* Compares a strided output with a dense reference, and checks that the positions outside the
 * tensor (padding, offset prefix) are still NaN. */
static void check_rows(const char *what, const char *name, tk_dtype dtype, const void *got, int offset,
                       int64_t rows, int64_t cols, int64_t stride, int64_t alloc, const double *ref,
                       bool outside_poisoned) {
    char label[400];
    snprintf(label, sizeof label, "%s: %s", what, name);
    const double rtol = tk_default_rtol(dtype);
    int64_t next = 0; /* first element not yet checked for being untouched */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t start = offset + r * stride;
        for (int64_t i = next; outside_poisoned && i < start; i++)
            cr_assert(isnan(tk_test_load(dtype, got, i)), "%s: wrote position %lld outside the tensor", label, (long long)i);
        for (int64_t c = 0; c < cols; c++) {
            const double g = tk_test_load(dtype, got, start + c), e = ref[r * cols + c];
            cr_assert(isfinite(g) && fabs(g - e) <= rtol * (1.0 + fabs(e)),
                      "%s: row %lld col %lld got %.9g, reference %.9g", label, (long long)r, (long long)c, g, e);
        }
        next = start + cols;
    }
    for (int64_t i = next; outside_poisoned && i < alloc; i++)
        cr_assert(isnan(tk_test_load(dtype, got, i)), "%s: wrote position %lld outside the tensor", label, (long long)i);
}

static void check_vector(const char *what, const char *name, tk_dtype dtype, const void *got, const double *ref,
                         int64_t n, double rtol, double atol_scale) {
    char label[400];
    snprintf(label, sizeof label, "%s: %s", what, name);
    TK_ASSERT_CLOSE(dtype, got, ref, n, rtol, atol_scale, label);
}

static void describe(const norm_case *c, const char *variant, char *out, size_t size) {
    snprintf(out, size,
             "%s %s %s/%s %lldx%lld pads %lld/%lld/%lld offset %d res %d w %d b %d gemma %d stats %d in_place %d variant %s",
             c->layernorm ? "layernorm" : "rmsnorm", c->backward ? "bwd" : "fwd", tk_test_dtype_name(c->dtype),
             tk_test_dtype_name(c->weight_dtype), (long long)c->rows, (long long)c->cols, (long long)c->x_pad,
             (long long)c->r_pad, (long long)c->y_pad, c->offset, c->residual, c->weight, c->bias, c->gemma, c->stats,
             c->in_place, variant ? variant : "auto");
}

/* Runs the call with the case's variant; returns false when a forced variant declined it. */
static bool start(const norm_case *c, const char *what, tk_status s) {
    if (c->variant && !variant_claims(c, c->variant)) {
        cr_assert_eq(s, TK_ERROR_NOT_SUPPORTED, "%s: expected the forced variant to decline, got %s", what,
                     tk_status_string(s));
        return false;
    }
    cr_assert_eq(s, TK_SUCCESS, "%s: %s", what, tk_last_error());
    cr_assert_str_eq(tk_last_variant(), c->variant ? c->variant : c->expect, "%s ran %s", what, tk_last_variant());
    return true;
}

static void run_fwd_case(const norm_case *c, tk_rng *rng) {
    char what[400];
    describe(c, c->variant, what, sizeof what);
    tk_norm_params p = norm_params(c->dtype, c->weight_dtype, c->rows, c->cols);
    p.gemma = c->gemma;
    p.x_row_stride = c->cols + c->x_pad;
    p.residual_row_stride = c->cols + c->r_pad;
    p.y_row_stride = c->in_place ? p.x_row_stride : c->cols + c->y_pad;
    const int64_t xn = c->offset + c->rows * p.x_row_stride, rn = c->offset + c->rows * p.residual_row_stride;
    const int64_t yn = c->offset + c->rows * p.y_row_stride;
    host_tensor x = tensor_new(c->dtype, xn), res = tensor_new(c->dtype, rn), y = tensor_new(c->dtype, yn);
    host_tensor w = tensor_new(c->weight_dtype, c->cols + c->offset), b = tensor_new(c->weight_dtype, c->cols + c->offset);
    host_tensor mean = tensor_new(TK_F32, c->rows), rstd = tensor_new(TK_F32, c->rows);
    tk_fill_uniform(rng, c->dtype, x.host, xn, c->layernorm ? -1.0 : -2.0, c->layernorm ? 3.0 : 2.0);
    tk_fill_uniform(rng, c->dtype, res.host, rn, -1.0, 1.0);
    tk_fill_uniform(rng, c->weight_dtype, w.host, c->cols + c->offset, c->gemma ? -0.5 : 0.5, c->gemma ? 0.5 : 1.5);
    tk_fill_uniform(rng, c->weight_dtype, b.host, c->cols + c->offset, -1.0, 1.0);
    tk_to_dev(x.dev, x.host, x.bytes);
    tk_to_dev(res.dev, res.host, res.bytes);
    tk_to_dev(w.dev, w.host, w.bytes);
    tk_to_dev(b.dev, b.host, b.bytes);
    if (!c->in_place)
        tk_dev_poison(y.dev, y.bytes);
    tk_dev_poison(mean.dev, mean.bytes);
    tk_dev_poison(rstd.dev, rstd.bytes);

    double *X = gather(c->dtype, x.host, c->offset, c->rows, c->cols, p.x_row_stride);
    double *R = gather(c->dtype, res.host, c->offset, c->rows, c->cols, p.residual_row_stride);
    double *Wd = gather(c->weight_dtype, w.host, c->offset, 1, c->cols, c->cols);
    double *Bd = gather(c->weight_dtype, b.host, c->offset, 1, c->cols, c->cols);
    double *H = malloc((size_t)(c->rows * c->cols) * sizeof(double)), *Y = malloc((size_t)(c->rows * c->cols) * sizeof(double));
    double *M = malloc((size_t)c->rows * sizeof(double)), *S = malloc((size_t)c->rows * sizeof(double));
    cr_assert(H && Y && M && S);
    const bool bias = c->layernorm && c->bias;
    ref_norm_fwd(c->layernorm, c->dtype, c->rows, c->cols, X, c->residual ? R : NULL, c->weight ? Wd : NULL,
                 bias ? Bd : NULL, c->gemma, p.eps, H, Y, M, S);

    const size_t es = tk_test_dtype_size(c->dtype), ws = tk_test_dtype_size(c->weight_dtype);
    unsigned char *xp = (unsigned char *)x.dev + c->offset * es;
    unsigned char *rp = (unsigned char *)res.dev + c->offset * es;
    unsigned char *yp = c->in_place ? xp : (unsigned char *)y.dev + c->offset * es;
    const void *wp = c->weight ? (unsigned char *)w.dev + c->offset * ws : NULL;
    const void *bp = bias ? (unsigned char *)b.dev + c->offset * ws : NULL;
    float *mp = c->stats && c->layernorm ? mean.dev : NULL, *sp = c->stats ? rstd.dev : NULL;
    cr_assert_eq(tk_experimental_force_variant("norm", c->variant), TK_SUCCESS);
    const tk_status s = c->layernorm
        ? tk_layernorm_fwd(&p, xp, c->residual ? rp : NULL, wp, bp, yp, mp, sp, NULL)
        : tk_rmsnorm_fwd(&p, xp, c->residual ? rp : NULL, wp, yp, sp, NULL);
    if (start(c, what, s)) {
        tk_dev_sync();
        host_tensor *out = c->in_place ? &x : &y;
        tk_to_host(out->host, out->dev, out->bytes);
        check_rows(what, "y", c->dtype, out->host, c->offset, c->rows, c->cols, p.y_row_stride,
                   c->in_place ? xn : yn, Y, !c->in_place);
        if (c->residual) {
            tk_to_host(res.host, res.dev, res.bytes);
            check_rows(what, "residual (h)", c->dtype, res.host, c->offset, c->rows, c->cols,
                       p.residual_row_stride, rn, H, false);
        }
        tk_to_host(rstd.host, rstd.dev, rstd.bytes);
        tk_to_host(mean.host, mean.dev, mean.bytes);
        if (c->stats) {
            check_vector(what, "rstd", TK_F32, rstd.host, S, c->rows, 1e-5, 0.0);
            if (c->layernorm)
                check_vector(what, "mean", TK_F32, mean.host, M, c->rows, 1e-5, 1.0);
        } else {
            cr_assert(isnan(((float *)rstd.host)[0]), "%s: wrote rstd without a pointer", what);
        }
        if (!c->layernorm || !c->stats)
            cr_assert(isnan(((float *)mean.host)[0]), "%s: wrote a mean it was not given", what);
    }
    cr_assert_eq(tk_experimental_force_variant("norm", NULL), TK_SUCCESS);
    tensor_free(&x); tensor_free(&res); tensor_free(&y); tensor_free(&w); tensor_free(&b);
    tensor_free(&mean); tensor_free(&rstd);
    free(X); free(R); free(Wd); free(Bd); free(H); free(Y); free(M); free(S);
}

/* Backward: x, dy, w random; the stats are the reference's, rounded to f32, given to both.
 * Runs twice (workspace and outputs re-poisoned) and requires the same bits. */
static void run_bwd_case(const norm_case *c, tk_rng *rng) {
    char what[400];
    describe(c, c->variant, what, sizeof what);
    tk_norm_params p = norm_params(c->dtype, c->weight_dtype, c->rows, c->cols);
    p.gemma = c->gemma;
    p.x_row_stride = c->cols + c->x_pad;
    p.y_row_stride = c->cols + c->y_pad;
    if (c->in_place)
        p.y_row_stride = p.x_row_stride; /* dx written over dy */
    const int64_t xn = c->offset + c->rows * p.x_row_stride, yn = c->offset + c->rows * p.y_row_stride;
    host_tensor x = tensor_new(c->dtype, xn), dy = tensor_new(c->dtype, yn), dx = tensor_new(c->dtype, xn);
    host_tensor w = tensor_new(c->weight_dtype, c->cols + c->offset);
    host_tensor dw = tensor_new(c->weight_dtype, c->cols), db = tensor_new(c->weight_dtype, c->cols);
    host_tensor mean = tensor_new(TK_F32, c->rows), rstd = tensor_new(TK_F32, c->rows);
    size_t ws_bytes = 0;
    cr_assert_eq(tk_norm_bwd_workspace_size(&p, c->layernorm ? TK_NORM_LAYER : TK_NORM_RMS, &ws_bytes), TK_SUCCESS);
    void *ws = tk_dev_alloc(ws_bytes);
    tk_fill_uniform(rng, c->dtype, x.host, xn, c->layernorm ? -1.0 : -2.0, c->layernorm ? 3.0 : 2.0);
    tk_fill_uniform(rng, c->dtype, dy.host, yn, -1.0, 1.0);
    tk_fill_uniform(rng, c->weight_dtype, w.host, c->cols + c->offset, c->gemma ? -0.5 : 0.5, c->gemma ? 0.5 : 1.5);

    double *X = gather(c->dtype, x.host, c->offset, c->rows, c->cols, p.x_row_stride);
    double *DY = gather(c->dtype, dy.host, c->offset, c->rows, c->cols, p.y_row_stride);
    double *Wd = gather(c->weight_dtype, w.host, c->offset, 1, c->cols, c->cols);
    double *H = malloc((size_t)(c->rows * c->cols) * sizeof(double)), *Y = malloc((size_t)(c->rows * c->cols) * sizeof(double));
    double *M = malloc((size_t)c->rows * sizeof(double)), *S = malloc((size_t)c->rows * sizeof(double));
    double *DX = malloc((size_t)(c->rows * c->cols) * sizeof(double));
    double *DW = malloc((size_t)c->cols * sizeof(double)), *DB = malloc((size_t)c->cols * sizeof(double));
    cr_assert(H && Y && M && S && DX && DW && DB);
    ref_norm_fwd(c->layernorm, c->dtype, c->rows, c->cols, X, NULL, NULL, NULL, false, p.eps, H, Y, M, S);
    for (int64_t r = 0; r < c->rows; r++) {
        ((float *)mean.host)[r] = (float)M[r];
        ((float *)rstd.host)[r] = (float)S[r];
        M[r] = ((float *)mean.host)[r];
        S[r] = ((float *)rstd.host)[r];
    }
    ref_norm_bwd(c->layernorm, c->rows, c->cols, DY, X, c->weight ? Wd : NULL, c->gemma, M, S, DX, DW, DB);
    tk_to_dev(x.dev, x.host, x.bytes);
    tk_to_dev(w.dev, w.host, w.bytes);
    tk_to_dev(mean.dev, mean.host, mean.bytes);
    tk_to_dev(rstd.dev, rstd.host, rstd.bytes);

    const size_t es = tk_test_dtype_size(c->dtype), wsz = tk_test_dtype_size(c->weight_dtype);
    const unsigned char *xp = (unsigned char *)x.dev + c->offset * es;
    unsigned char *dyp = (unsigned char *)dy.dev + c->offset * es;
    unsigned char *dxp = c->in_place ? dyp : (unsigned char *)dx.dev + c->offset * es;
    const void *wp = c->weight ? (unsigned char *)w.dev + c->offset * wsz : NULL;
    void *dwp = c->stats ? dw.dev : NULL, *dbp = c->layernorm && c->bias ? db.dev : NULL;
    unsigned char *first_dw = malloc(dw.bytes), *first_db = malloc(db.bytes), *first_dx = malloc(dx.bytes);
    cr_assert(first_dw && first_db && first_dx);
    host_tensor *out = c->in_place ? &dy : &dx;
    cr_assert_eq(tk_experimental_force_variant("norm_bwd", c->variant), TK_SUCCESS);
    for (int run = 0; run < 2; run++) {
        tk_to_dev(dy.dev, dy.host, dy.bytes);
        if (!c->in_place)
            tk_dev_poison(dx.dev, dx.bytes);
        tk_dev_poison(dw.dev, dw.bytes);
        tk_dev_poison(db.dev, db.bytes);
        tk_dev_poison(ws, ws_bytes);
        const tk_status s = c->layernorm
            ? tk_layernorm_bwd(&p, dyp, xp, wp, mean.dev, rstd.dev, dxp, dwp, dbp, ws, ws_bytes, NULL)
            : tk_rmsnorm_bwd(&p, dyp, xp, wp, rstd.dev, dxp, dwp, ws, ws_bytes, NULL);
        if (!start(c, what, s))
            break;
        tk_dev_sync();
        unsigned char *got_dx = run == 0 ? first_dx : malloc(out->bytes);
        unsigned char *got_dw = run == 0 ? first_dw : malloc(dw.bytes), *got_db = run == 0 ? first_db : malloc(db.bytes);
        cr_assert(got_dx && got_dw && got_db);
        tk_to_host(got_dx, out->dev, out->bytes);
        tk_to_host(got_dw, dw.dev, dw.bytes);
        tk_to_host(got_db, db.dev, db.bytes);
        if (run == 0) {
            check_rows(what, "dx", c->dtype, got_dx, c->offset, c->rows, c->cols, p.x_row_stride, xn, DX, !c->in_place);
            const double scale = sqrt((double)c->rows) + 1.0;
            if (dwp)
                check_vector(what, "dw", c->weight_dtype, got_dw, DW, c->cols, tk_default_rtol(c->weight_dtype), scale);
            else
                cr_assert(isnan(tk_test_load(c->weight_dtype, got_dw, 0)), "%s: wrote dw without a pointer", what);
            if (dbp)
                check_vector(what, "db", c->weight_dtype, got_db, DB, c->cols, tk_default_rtol(c->weight_dtype), scale);
            else
                cr_assert(isnan(tk_test_load(c->weight_dtype, got_db, 0)), "%s: wrote db without a pointer", what);
        } else {
            cr_assert(memcmp(got_dx, first_dx, out->bytes) == 0, "%s: dx differs between two runs", what);
            cr_assert(memcmp(got_dw, first_dw, dw.bytes) == 0, "%s: dw differs between two runs", what);
            cr_assert(memcmp(got_db, first_db, db.bytes) == 0, "%s: db differs between two runs", what);
            free(got_dx); free(got_dw); free(got_db);
        }
    }
    cr_assert_eq(tk_experimental_force_variant("norm_bwd", NULL), TK_SUCCESS);
    free(first_dx); free(first_dw); free(first_db);
    tensor_free(&x); tensor_free(&dy); tensor_free(&dx); tensor_free(&w); tensor_free(&dw); tensor_free(&db);
    tensor_free(&mean); tensor_free(&rstd);
    tk_dev_free(ws);
    free(X); free(DY); free(Wd); free(H); free(Y); free(M); free(S); free(DX); free(DW); free(DB);
}

/* rows, cols, pads (x, residual, y), offset, then the options residual, weight, bias, gemma,
 * stats, in_place (backward: bias = db, stats = dw, in_place = dx over dy). */
static const struct {
    int64_t rows, cols, x_pad, r_pad, y_pad;
    int offset;
    bool residual, weight, bias, gemma, stats, in_place;
} SHAPES[] = {
    {1, 1, 0, 0, 0, 0, false, true, true, false, true, false},
    {3, 7, 0, 0, 0, 0, true, true, true, false, true, false},
    {37, 64, 8, 16, 24, 0, true, true, true, true, true, false},
    {9, 3584, 0, 0, 0, 0, true, true, false, false, true, false},
    {5, 4097, 3, 1, 2, 0, true, true, true, false, true, false},
    {4, 5120, 0, 0, 0, 0, false, true, true, true, true, true},
    /* Rows of exactly 4 packs per thread of one block (the forward's "whole" kernels): the
     * narrowest, with strides and the residual, and the widest; then one pack short of it. */
    {5, 2048, 0, 0, 0, 0, false, true, false, true, true, false},
    {7, 4096, 8, 16, 24, 0, true, true, true, false, true, false},
    {3, 8192, 0, 0, 0, 0, false, false, true, false, false, false},
    {4, 4088, 0, 0, 0, 0, true, true, true, false, true, false},
    /* More rows than one wave of 8192-wide groups (one block per SM): the backward's groups
     * take several rows each (the next row's loads overlap the current one's reduction). */
    {400, 8192, 0, 0, 0, 0, false, true, true, false, true, false},
    /* The backward's ring kernel (16-bit rows of 513 to 8192 columns, the row's x and dy staged
     * a row ahead in shared memory): more rows than a wave of blocks, so both stages of the
     * ring are refilled (4096: 256 threads; 1096: 96 threads, whose last 55 threads have their
     * second pack past the row; with gemma and neither dw nor db, dx over dy); its narrowest
     * row (520: 65 packs on 64 threads; gemma without a weight) beside the widest row of the
     * rows kernel's narrow groups (512). */
    {1000, 4096, 0, 0, 0, 0, false, true, true, false, true, false},
    {2000, 1096, 8, 0, 8, 0, false, true, false, true, false, true},
    {50, 520, 0, 0, 0, 0, false, false, false, true, true, false},
    {50, 512, 0, 0, 0, 0, false, true, true, false, true, false},
    {6, 1000, 0, 0, 0, 1, true, true, true, false, true, false},
    /* Many narrow rows: thousands of backward groups, so thousands of dw / db slots, which stage
     * 2 reads in several rounds of loads per lane (16-byte loads for 64 columns, 4-byte ones for
     * 6); gemma without a weight (w' = 1). */
    {3000, 64, 0, 0, 0, 0, false, true, true, true, true, false},
    {2000, 6, 0, 0, 0, 0, true, false, true, true, true, false},
    {3, 12288, 0, 0, 0, 0, true, true, true, false, true, false},
    {300, 256, 0, 0, 0, 0, false, false, false, false, false, false},
    {2, 262144, 0, 0, 0, 0, true, true, true, true, true, false},
    /* Forward rows wider than 8192: 16-bit ones on one 512-thread block up to 16384 (whole, and
     * 8200 one pack past 256 threads), then on clusters of 32 KB slices: 65536 is 4 whole
     * slices (f32: 8), 131072 8 (16-bit, the most), 40000 3 uneven ones (f32: 5), 16384 and
     * 8200 2 f32 ones, 98304 6 whole 16-bit ones, 114680 7 16-bit ones (the last one pack
     * short), 65544 5 uneven 16-bit ones (the last two packs short; f32: past the cluster, so
     * wide); 400 rows of 16392 (2 uneven 16-bit slices, 3 f32) are several waves of clusters
     * (cluster_blocks_agree covers f32 on 2 to 8 blocks as well; large_tensors the benchmark's
     * wide rows). */
    {5, 16384, 0, 0, 0, 0, true, true, true, false, true, false},
    {3, 65536, 8, 16, 24, 0, true, true, true, true, true, false},
    {4, 40000, 0, 0, 0, 0, false, true, true, false, true, true},
    {3, 8200, 0, 0, 0, 0, true, false, false, false, true, false},
    {2, 131072, 0, 0, 0, 0, true, true, true, false, true, false},
    {2, 98304, 0, 0, 0, 0, true, true, false, true, true, false},
    {3, 114680, 8, 0, 16, 0, true, true, true, false, true, false},
    {400, 16392, 8, 16, 24, 0, true, true, true, false, true, false},
    {3, 65544, 8, 0, 8, 0, true, true, true, true, true, false},
    /* A wide row one element off 16-byte alignment: the forced cluster_vec16 (both directions)
     * must decline it (as must vec16, wide_vec16 and, at 40000 > 4096, scalar): wide_scalar
     * takes it. */
    {2, 40000, 0, 0, 0, 1, false, true, true, false, true, false},
    /* The backward's ring kernel at 4 packs per thread (16-bit rows of 8193 to 16384), w' in
     * shared memory, with more rows than a wave of blocks (on an H100 / H200) and a row count
     * that the grid does not divide, so that some blocks take one row fewer than others (both
     * stages refilled): its narrowest row (8200: 1025 packs on 288 threads, 1152 slots, so the
     * fourth slots of the last 127 threads lie past the row and stay zero), 12288 (384 threads,
     * every pack inside) with strided rows, the widest (16384, 512 threads) with dw and db, 16376
     * (the last thread's fourth pack past the row) with gemma, and 10240 with gemma, neither dw
     * nor db, dx over dy. */
    {401, 8200, 0, 0, 0, 0, false, true, true, false, true, false},
    {333, 12288, 8, 16, 24, 0, false, true, true, false, true, false},
    {263, 16384, 0, 0, 0, 0, false, true, true, false, true, false},
    {135, 16376, 0, 0, 0, 0, false, true, true, true, true, false},
    {139, 10240, 8, 0, 8, 0, false, true, false, true, false, true},
};

/* Every shape and variant of one direction, one norm (RMSNorm or LayerNorm) and one side of the
 * dtypes (f32, or the 16-bit dtypes with either weight dtype). The four slices of each direction
 * are separate tests so that each of tests/sanitize.sh's jobs (one test under one tool) stays
 * within a few minutes (the whole backward takes more than 400 s under racecheck on an H100). */
static void run_all(bool backward, bool layernorm, bool f32) {
    tk_rng rng = tk_rng_seeded((backward ? 32 : 31) + 2 * layernorm + 4 * f32);
    const char *const *variants = backward ? BWD_VARIANTS : FWD_VARIANTS;
    const size_t variant_count = backward ? BWD_VARIANT_COUNT : FWD_VARIANT_COUNT;
    for (size_t d = 0; d < sizeof DTYPES / sizeof DTYPES[0]; d++) {
        if ((DTYPES[d].dtype == TK_F32) != f32)
            continue;
        for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++)
            for (size_t v = 0; v < variant_count; v++) {
                norm_case c = {layernorm, backward, DTYPES[d].dtype, DTYPES[d].weight_dtype, SHAPES[s].rows,
                               SHAPES[s].cols, SHAPES[s].x_pad, SHAPES[s].r_pad, SHAPES[s].y_pad,
                               SHAPES[s].offset, SHAPES[s].residual, SHAPES[s].weight, SHAPES[s].bias,
                               SHAPES[s].gemma, SHAPES[s].stats, SHAPES[s].in_place, variants[v], NULL};
                if (backward)
                    run_bwd_case(&c, &rng);
                else
                    run_fwd_case(&c, &rng);
            }
    }
}

/* One test per slice; the backward cases also check that a second call gives the same bits
 * (run_bwd_case). */
#define NORM_ALL_SHAPES_TEST(name, backward, layernorm, f32) \
    Test(norm_gpu, name, .timeout = 600) {                     \
        TK_REQUIRE_GPU();                                      \
        run_all(backward, layernorm, f32);                     \
    }
NORM_ALL_SHAPES_TEST(forward_rmsnorm_f32, false, false, true)
NORM_ALL_SHAPES_TEST(forward_rmsnorm_16bit, false, false, false)
NORM_ALL_SHAPES_TEST(forward_layernorm_f32, false, true, true)
NORM_ALL_SHAPES_TEST(forward_layernorm_16bit, false, true, false)
NORM_ALL_SHAPES_TEST(backward_rmsnorm_f32_deterministic, true, false, true)
NORM_ALL_SHAPES_TEST(backward_rmsnorm_16bit_deterministic, true, false, false)
NORM_ALL_SHAPES_TEST(backward_layernorm_f32_deterministic, true, true, true)
NORM_ALL_SHAPES_TEST(backward_layernorm_16bit_deterministic, true, true, false)

/* The blocks of a cluster hold the same statistics bit for bit, and the call is deterministic.
 * f32 rows on 2 to 8 blocks, one pack short of 8192 columns a block (so 8192-column slices, the
 * last one uneven), whose first 64 columns of every slice hold the same values: without a weight
 * those columns of y are then equal bit for bit in every slice only if every block computed the
 * same mean and rstd (a one-ulp difference in rstd changes most f32 products). A second call
 * must give the same bits for y and the stats. */
Test(norm_gpu, cluster_blocks_agree, .timeout = 300) {
    TK_REQUIRE_GPU();
    if (!clusters_run_here())
        cr_skip_test("cluster_vec16 does not run on this device or build");
    tk_rng rng = tk_rng_seeded(35);
    enum { rows = 3 };
    const int64_t slice = 8192, same = 64;
    for (int layernorm = 0; layernorm < 2; layernorm++)
        for (int64_t blocks = 2; blocks <= 8; blocks++) {
            tk_norm_params p = norm_params(TK_F32, TK_F32, rows, blocks * slice - 4);
            const int64_t n = rows * p.cols;
            const size_t bytes = (size_t)n * sizeof(float), stat_bytes = (size_t)rows * sizeof(float);
            float *x = malloc(bytes), *y[2] = {malloc(bytes), malloc(bytes)};
            float stats[2][2][rows]; /* call, mean / rstd, row */
            cr_assert(x && y[0] && y[1]);
            tk_fill_uniform(&rng, TK_F32, x, n, -1.0, 3.0);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t b = 1; b < blocks; b++)
                    memcpy(x + r * p.cols + b * slice, x + r * p.cols, (size_t)same * sizeof(float));
            void *x_dev = tk_dev_alloc(bytes), *y_dev = tk_dev_alloc(bytes);
            float *mean = tk_dev_alloc(stat_bytes), *rstd = tk_dev_alloc(stat_bytes);
            tk_to_dev(x_dev, x, bytes);
            cr_assert_eq(tk_experimental_force_variant("norm", "cluster_vec16"), TK_SUCCESS);
            for (int call = 0; call < 2; call++) {
                tk_dev_poison(y_dev, bytes);
                const tk_status s = layernorm ? tk_layernorm_fwd(&p, x_dev, NULL, NULL, NULL, y_dev, mean, rstd, NULL)
                                              : tk_rmsnorm_fwd(&p, x_dev, NULL, NULL, y_dev, rstd, NULL);
                cr_assert_eq(s, TK_SUCCESS, "%s", tk_last_error());
                cr_assert_str_eq(tk_last_variant(), "cluster_vec16");
                tk_dev_sync();
                tk_to_host(y[call], y_dev, bytes);
                if (layernorm) /* the RMSNorm writes no mean */
                    tk_to_host(stats[call][0], mean, stat_bytes);
                tk_to_host(stats[call][1], rstd, stat_bytes);
            }
            cr_assert_eq(tk_experimental_force_variant("norm", NULL), TK_SUCCESS);
            const char *op = layernorm ? "layernorm" : "rmsnorm";
            for (int64_t r = 0; r < rows; r++)
                for (int64_t b = 1; b < blocks; b++)
                    cr_assert(!memcmp(y[0] + r * p.cols + b * slice, y[0] + r * p.cols, (size_t)same * sizeof(float)),
                              "%s on %lld blocks, row %lld: block %lld's statistics differ from block 0's", op,
                              (long long)blocks, (long long)r, (long long)b);
            cr_assert(!memcmp(y[0], y[1], bytes), "%s on %lld blocks: y differs between two calls", op, (long long)blocks);
            cr_assert(!memcmp(stats[0][1], stats[1][1], stat_bytes) &&
                          (!layernorm || !memcmp(stats[0][0], stats[1][0], stat_bytes)),
                      "%s on %lld blocks: the stats differ between two calls", op, (long long)blocks);
            tk_dev_free(x_dev);
            tk_dev_free(y_dev);
            tk_dev_free(mean);
            tk_dev_free(rstd);
            free(x);
            free(y[0]);
            free(y[1]);
        }
}

/* The automatic choice: registers when the row fits and is aligned, else the next variant. */
Test(norm_gpu, automatic_choice) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(33);
    const char *wide_fwd = clusters_run_here() ? "cluster_vec16" : "wide_vec16";
    const char *ring_8200 = bwd_ring_fits(8200) ? "vec16" : "wide_vec16";
    const char *ring_16384 = bwd_ring_fits(16384) ? "vec16" : "wide_vec16";
    const bool bwd_clusters = clusters_run_here() && bwd_cluster_fits(65536, 2) && bwd_cluster_fits(16392, 2);
    const char *wide_bwd = bwd_clusters ? "cluster_vec16" : "wide_vec16";
    const struct { int64_t rows, cols; int offset; bool backward; const char *expect; } cases[] = {
        {64, 4096, 0, false, "vec16"},       {64, 4096, 0, true, "vec16"},
        {4, 16384, 0, false, "vec16"},       {4, 16384, 0, true, ring_16384},
        {4, 8192, 0, true, "vec16"},         {4, 8200, 0, true, ring_8200},
        {4, 16392, 0, true, wide_bwd},       {2, 65536, 0, true, wide_bwd},
        {2, 131080, 0, true, "wide_vec16"},
        {4, 16392, 0, false, wide_fwd},      {2, 131080, 0, false, "wide_vec16"},
        {8, 4000, 1, false, "scalar"},       {8, 4000, 1, true, "scalar"},
        {3, 4097, 0, false, "wide_scalar"},  {3, 4097, 0, true, "wide_scalar"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        norm_case c = {true, cases[i].backward, TK_BF16, TK_F32, cases[i].rows, cases[i].cols, 0, 0, 0,
                       cases[i].offset, true, true, true, false, true, false, NULL, cases[i].expect};
        if (c.backward)
            run_bwd_case(&c, &rng);
        else
            run_fwd_case(&c, &rng);
    }
}

/* The backward cluster kernel, forced, on rows in several waves of clusters (a cluster takes
 * rows c, c + clusters, ..., so both stages of its ring are refilled and both exchange buffers
 * reused, and the row count is not a multiple of the clusters: some take a row fewer), with each
 * cluster's dw / db partials kept across its rows: 16-bit rows on 2 uneven slices (16392), 3
 * (40000, strided, gemma, f16 with f32 w), 4 (65536, the benchmark's width) and 8 (131072,
 * gemma without dw, dx over dy); f32 rows on 2 (8200: 1025 packs a slice on 288 threads, so the
 * last threads' fourth slots lie past the slice and stay zero), 5 (40000) and 8 (65536).
 * RMSNorm and LayerNorm each; run_bwd_case checks against the fp64 reference and runs twice for
 * the same bits. */
Test(norm_gpu, backward_cluster_rows_in_waves, .timeout = 600) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(36);
    const struct {
        tk_dtype dtype, weight_dtype;
        int64_t rows, cols, pad;
        bool weight, db, gemma, dw, in_place;
    } cases[] = {
        {TK_BF16, TK_BF16, 301, 16392, 0, true, true, false, true, false},
        {TK_F16, TK_F32, 203, 40000, 8, true, true, true, true, false},
        {TK_BF16, TK_F32, 151, 65536, 0, true, true, false, true, false},
        {TK_BF16, TK_BF16, 67, 131072, 0, true, false, true, false, true},
        {TK_F32, TK_F32, 205, 8200, 4, true, true, false, true, false},
        {TK_F32, TK_F32, 101, 40000, 0, false, true, true, true, false},
        {TK_F32, TK_F32, 37, 65536, 0, true, true, false, true, false},
    };
    for (int layernorm = 0; layernorm < 2; layernorm++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            norm_case c = {layernorm, true, cases[i].dtype, cases[i].weight_dtype, cases[i].rows, cases[i].cols,
                           cases[i].pad, 0, cases[i].pad, 0, false, cases[i].weight, cases[i].db, cases[i].gemma,
                           cases[i].dw, cases[i].in_place, "cluster_vec16", NULL};
            run_bwd_case(&c, &rng);
        }
}

/* A few hundred MB through the fully checked path: the benchmark shapes. */
Test(norm_gpu, large_tensors, .timeout = 600) {
    TK_REQUIRE_GPU();
    TK_SKIP_UNDER_SANITIZER("hundreds of MB of buffers; the other tests run the same kernels");
    tk_rng rng = tk_rng_seeded(34);
    norm_case add_rms = {false, false, TK_BF16, TK_BF16, 16384, 4096, 0, 0, 0, 0,
                         true, true, false, false, true, false, NULL, "vec16"};
    run_fwd_case(&add_rms, &rng);
    norm_case ln = {true, false, TK_BF16, TK_BF16, 16384, 4096, 0, 0, 0, 0,
                    false, true, true, false, true, false, NULL, "vec16"};
    run_fwd_case(&ln, &rng);
    norm_case ln_bwd = {true, true, TK_BF16, TK_F32, 16384, 4096, 0, 0, 0, 0,
                        false, true, true, false, true, false, NULL, "vec16"};
    run_bwd_case(&ln_bwd, &rng);
    /* The benchmark's wide backward rows: 4096 x 16384 bf16 (the ring kernel at 4 packs where
     * the device holds it), RMSNorm with dw and LayerNorm (f32 w) with dw and db. */
    const char *ring = bwd_ring_fits(16384) ? "vec16" : "wide_vec16";
    const norm_case wide_bwd[] = {
        {false, true, TK_BF16, TK_BF16, 4096, 16384, 0, 0, 0, 0, false, true, false, false, true, false, NULL, ring},
        {true, true, TK_BF16, TK_F32, 4096, 16384, 0, 0, 0, 0, false, true, true, false, true, false, NULL, ring},
    };
    for (size_t i = 0; i < sizeof wide_bwd / sizeof wide_bwd[0]; i++)
        run_bwd_case(&wide_bwd[i], &rng);
    /* The benchmark's widest backward rows, automatic choice: 1024 x 65536 bf16 on the backward
     * cluster kernel where it runs (sm_90: 4 slices of 32 KB), RMSNorm with dw and LayerNorm (f32
     * w) with dw and db. */
    const char *cluster_bwd = clusters_run_here() && bwd_cluster_fits(65536, 2) ? "cluster_vec16" : "wide_vec16";
    const norm_case widest_bwd[] = {
        {false, true, TK_BF16, TK_BF16, 1024, 65536, 0, 0, 0, 0, false, true, false, false, true, false, NULL,
         cluster_bwd},
        {true, true, TK_BF16, TK_F32, 1024, 65536, 0, 0, 0, 0, false, true, true, false, true, false, NULL,
         cluster_bwd},
    };
    for (size_t i = 0; i < sizeof widest_bwd / sizeof widest_bwd[0]; i++)
        run_bwd_case(&widest_bwd[i], &rng);
    /* The benchmark's wide rows (one cluster per row, many waves of clusters), automatic choice:
     * RMSNorm, add+RMSNorm and LayerNorm bf16 1024 x 65536, both ops f32 4096 x 16384, and the
     * widest 16-bit rows (8 slices) with f16 and f32 weights, the residual, gemma, 64 rows. */
    const char *wide = clusters_run_here() ? "cluster_vec16" : "wide_vec16";
    const norm_case wide_rows[] = {
        {false, false, TK_BF16, TK_BF16, 1024, 65536, 0, 0, 0, 0, false, true, false, false, true, false, NULL, wide},
        {false, false, TK_BF16, TK_BF16, 1024, 65536, 0, 0, 0, 0, true, true, false, false, true, false, NULL, wide},
        {true, false, TK_BF16, TK_BF16, 1024, 65536, 0, 0, 0, 0, false, true, true, false, true, false, NULL, wide},
        {false, false, TK_F32, TK_F32, 4096, 16384, 0, 0, 0, 0, false, true, false, false, true, false, NULL, wide},
        {true, false, TK_F32, TK_F32, 4096, 16384, 0, 0, 0, 0, false, true, true, false, true, false, NULL, wide},
        {true, false, TK_F16, TK_F32, 64, 131072, 0, 0, 0, 0, true, true, true, false, true, false, NULL, wide},
        {false, false, TK_BF16, TK_BF16, 64, 131072, 0, 0, 0, 0, true, true, false, true, true, false, NULL, wide},
    };
    for (size_t i = 0; i < sizeof wide_rows / sizeof wide_rows[0]; i++)
        run_fwd_case(&wide_rows[i], &rng);
}

/* ------------------------------------------------------------- in place (GPU) ---- */

/* Device copies of one case's random tensors: x, residual, dy ([rows, cols]), weight, bias. */
typedef struct norm_inputs {
    unsigned char *host[5], *dev[5];
    size_t bytes[5];
} norm_inputs;
enum { IN_X, IN_RESIDUAL, IN_DY, IN_WEIGHT, IN_BIAS, IN_COUNT };

static norm_inputs norm_inputs_random(tk_rng *rng, const tk_norm_params *p) {
    norm_inputs in;
    const int64_t n = p->rows * p->cols;
    for (int i = 0; i < IN_COUNT; i++) {
        const bool param = i >= IN_WEIGHT;
        const tk_dtype dtype = param ? p->weight_dtype : p->dtype;
        in.bytes[i] = (size_t)(param ? p->cols : n) * tk_test_dtype_size(dtype);
        in.host[i] = malloc(in.bytes[i]);
        cr_assert(in.host[i] != NULL);
        tk_fill_uniform(rng, dtype, in.host[i], param ? p->cols : n, -2.0, 2.0);
        in.dev[i] = tk_dev_alloc(in.bytes[i]);
    }
    return in;
}

/* Uploads every input again: an in-place call overwrote one. */
static void norm_inputs_upload(const norm_inputs *in) {
    for (int i = 0; i < IN_COUNT; i++)
        tk_to_dev(in->dev[i], in->host[i], in->bytes[i]);
}

static void norm_inputs_free(norm_inputs *in) {
    for (int i = 0; i < IN_COUNT; i++) {
        tk_dev_free(in->dev[i]);
        free(in->host[i]);
    }
}

/* Every in-place mode the header allows, bit for bit against the same call out of place, every
 * variant that takes the shape: forward y = x (with the residual, itself updated in place, and
 * without), backward dx = dy and dx = x (dx, dw and db compared). The backward modes run the
 * backward variants only (their forward runs the same variant, for the stats). */
Test(norm_gpu, in_place_matches_out_of_place, .timeout = 600) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(34);
    const int64_t shapes[][2] = {{16, 4096}, {3, 40000}};
    for (size_t s = 0; s < 2; s++)
        for (size_t d = 0; d < sizeof DTYPES / sizeof DTYPES[0]; d++)
            for (size_t v = 0; v < FWD_VARIANT_COUNT; v++)
                for (int layernorm = 0; layernorm < 2; layernorm++)
                    for (int mode = 0; mode < 4; mode++) { /* y = x; y = x with residual; dx = dy; dx = x */
                        const char *variant = FWD_VARIANTS[v];
                        const bool backward = mode >= 2;
                        tk_norm_params p = norm_params(DTYPES[d].dtype, DTYPES[d].weight_dtype, shapes[s][0], shapes[s][1]);
                        norm_inputs in = norm_inputs_random(&rng, &p);
                        const size_t bytes = in.bytes[IN_X], pbytes = in.bytes[IN_WEIGHT], stat_bytes = (size_t)p.rows * 4;
                        size_t ws_bytes = 0;
                        TK_EXPECT_STATUS(tk_norm_bwd_workspace_size(&p, layernorm ? TK_NORM_LAYER : TK_NORM_RMS, &ws_bytes), TK_SUCCESS, "");
                        unsigned char *out = tk_dev_alloc(bytes), *dw = tk_dev_alloc(pbytes), *db = tk_dev_alloc(pbytes);
                        float *mean = tk_dev_alloc(stat_bytes), *rstd = tk_dev_alloc(stat_bytes);
                        void *ws = tk_dev_alloc(ws_bytes + 16);
                        unsigned char *want = malloc(bytes), *want_res = malloc(bytes), *want_dw = malloc(pbytes), *want_db = malloc(pbytes);
                        cr_assert(want && want_res && want_dw && want_db);
                        char what[160];
                        snprintf(what, sizeof what, "%s %lldx%lld dtypes %d/%d variant %s mode %d", layernorm ? "layernorm" : "rmsnorm",
                                 (long long)p.rows, (long long)p.cols, (int)p.dtype, (int)p.weight_dtype, variant, mode);
                        /* both directions: the backward modes run the forward for their stats */
                        cr_assert_eq(tk_experimental_force_variant("norm", variant), TK_SUCCESS);
                        cr_assert_eq(tk_experimental_force_variant("norm_bwd", backward ? variant : NULL), TK_SUCCESS);
                        unsigned char *res = mode == 1 ? in.dev[IN_RESIDUAL] : NULL;
                        norm_inputs_upload(&in);
                        tk_dev_poison(out, bytes);
                        /* The forward writes mean / rstd; the backward reads them. */
                        tk_status st = layernorm ? tk_layernorm_fwd(&p, in.dev[IN_X], backward ? NULL : res, in.dev[IN_WEIGHT], in.dev[IN_BIAS], out, mean, rstd, NULL)
                                                 : tk_rmsnorm_fwd(&p, in.dev[IN_X], backward ? NULL : res, in.dev[IN_WEIGHT], out, rstd, NULL);
                        if (st == TK_SUCCESS && backward) {
                            tk_dev_poison(out, bytes);
                            st = layernorm ? tk_layernorm_bwd(&p, in.dev[IN_DY], in.dev[IN_X], in.dev[IN_WEIGHT], mean, rstd, out, dw, db, ws, ws_bytes, NULL)
                                           : tk_rmsnorm_bwd(&p, in.dev[IN_DY], in.dev[IN_X], in.dev[IN_WEIGHT], rstd, out, dw, ws, ws_bytes, NULL);
                        }
                        if (st != TK_ERROR_NOT_SUPPORTED) { /* variants that do not take the shape are skipped */
                            cr_assert_eq(st, TK_SUCCESS, "%s: %s", what, tk_last_error());
                            tk_dev_sync();
                            tk_to_host(want, out, bytes);
                            tk_to_host(want_res, in.dev[IN_RESIDUAL], bytes);
                            if (backward) /* only the backward writes dw, and only layernorm db */
                                tk_to_host(want_dw, dw, pbytes);
                            if (backward && layernorm)
                                tk_to_host(want_db, db, pbytes);
                            norm_inputs_upload(&in);
                            unsigned char *target = mode == 2 ? in.dev[IN_DY] : in.dev[IN_X];
                            st = !backward ? (layernorm ? tk_layernorm_fwd(&p, in.dev[IN_X], res, in.dev[IN_WEIGHT], in.dev[IN_BIAS], target, mean, rstd, NULL)
                                                        : tk_rmsnorm_fwd(&p, in.dev[IN_X], res, in.dev[IN_WEIGHT], target, rstd, NULL))
                                 : layernorm ? tk_layernorm_bwd(&p, in.dev[IN_DY], in.dev[IN_X], in.dev[IN_WEIGHT], mean, rstd, target, dw, db, ws, ws_bytes, NULL)
                                             : tk_rmsnorm_bwd(&p, in.dev[IN_DY], in.dev[IN_X], in.dev[IN_WEIGHT], rstd, target, dw, ws, ws_bytes, NULL);
                            cr_assert_eq(st, TK_SUCCESS, "%s: %s", what, tk_last_error());
                            cr_assert_str_eq(tk_last_variant(), variant, "%s ran %s", what, tk_last_variant());
                            tk_dev_sync();
                            tk_assert_dev_bytes_equal(target, want, bytes, what);
                            if (mode == 1)
                                tk_assert_dev_bytes_equal(in.dev[IN_RESIDUAL], want_res, bytes, what);
                            if (backward) {
                                tk_assert_dev_bytes_equal(dw, want_dw, pbytes, what);
                                if (layernorm)
                                    tk_assert_dev_bytes_equal(db, want_db, pbytes, what);
                            }
                        }
                        cr_assert_eq(tk_experimental_force_variant("norm", NULL), TK_SUCCESS);
                        cr_assert_eq(tk_experimental_force_variant("norm_bwd", NULL), TK_SUCCESS);
                        tk_dev_free(out); tk_dev_free(dw); tk_dev_free(db); tk_dev_free(mean); tk_dev_free(rstd); tk_dev_free(ws);
                        free(want); free(want_res); free(want_dw); free(want_db);
                        norm_inputs_free(&in);
                    }
}
