/*
 * Rotary position embedding: argument checks and dispatch. The kernel is in cuda/rope.cu; the
 * conventions are documented in include/tkern.h and docs/kernels/rope.md.
 *
 * Variants, best first: "vec16" (16-byte packs) and "scalar" (one element per access). The
 * backward is the forward rotated by -angle, the same kernels: ops "rope" and "rope_bwd" share
 * the table; the launchers read the direction.
 */
#include <math.h>
#include <stdint.h>

#include "runtime.h"
#include "../cuda/rope.h"

/* A tensor's pointer and strides keep every 16-byte pack of a head 16-byte aligned. */
static bool tensor_vec16(const void *p, const int64_t strides[2], size_t elem) {
    return tk_aligned16(p) && tk_stride_keeps_alignment(strides[0], elem) &&
           tk_stride_keeps_alignment(strides[1], elem);
}

static bool vec16_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    const tk_rope_call *a = call;
    const size_t es = tk_dtype_size((tk_dtype)a->dtype);
    const bool dims_ok = tk_stride_keeps_alignment(a->rotary_dim / 2, es) &&
                         tk_stride_keeps_alignment(a->head_dim - a->rotary_dim, es);
    const bool q_ok = a->heads_q == 0 || (tensor_vec16(a->q, a->q_strides, es) && tensor_vec16(a->q_out, a->q_out_strides, es));
    const bool k_ok = a->heads_k == 0 || (tensor_vec16(a->k, a->k_strides, es) && tensor_vec16(a->k_out, a->k_out_strides, es));
    return dims_ok && q_ok && k_ok;
}

static const tk_variant rope_variants[] = {
    {"vec16", TK_CC_AMPERE, false, vec16_supports, tk_launch_rope_vec16, NULL},
    {"scalar", TK_CC_AMPERE, false, NULL, tk_launch_rope_scalar, NULL},
};
const tk_op tk_op_rope = {"rope", rope_variants, TK_VARIANT_COUNT(rope_variants)};
const tk_op tk_op_rope_bwd = {"rope_bwd", rope_variants, TK_VARIANT_COUNT(rope_variants)};

/* One tensor as the checks see it. */
typedef struct rope_tensor {
    const char *name;         /* "q", "k_out", ... */
    const char *strides_name; /* "p->q_strides", ... */
    const void *ptr;
    int64_t heads;
    int64_t strides[2];       /* resolved */
    size_t bytes;             /* span from ptr to the end of its last row */
} rope_tensor;

/* Resolves and checks one tensor's strides: no negative stride, no two (token, head) rows that
 * share an element, a span that fits int64 bytes. */
static tk_status resolve_tensor(const char *fn, rope_tensor *t, const int64_t given[2], const int64_t fallback[2],
                                int64_t tokens, int64_t head_dim, size_t es) {
    if (given[0] < 0 || given[1] < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "%s = {%lld, %lld} has a negative stride", t->strides_name,
                       (long long)given[0], (long long)given[1]);
    const bool dflt = given[0] == 0 && given[1] == 0;
    t->strides[0] = dflt ? fallback[0] : given[0];
    t->strides[1] = dflt ? fallback[1] : given[1];
    const tk_layout l = {2, {tokens, t->heads, 0}, {t->strides[0], t->strides[1], 0}, head_dim};
    TK_TRY(tk_layout_bytes(fn, t->strides_name, &l, es, &t->bytes));
    return tk_check_disjoint(fn, t->name, t->strides_name, &l);
}

/* Whether two tensors share no element: disjoint spans, or interleaved rows of the same token
 * stride (packed QKV) whose per-token extents do not meet. */
static bool tensors_disjoint(const rope_tensor *a, const rope_tensor *b, int64_t tokens, int64_t head_dim,
                             size_t es) {
    if (!tk_ranges_overlap(a->ptr, a->bytes, b->ptr, b->bytes))
        return true;
    const int64_t period = a->strides[0];
    if (tokens < 2 || b->strides[0] != period || period == 0)
        return false;
    const int64_t ea = (a->heads - 1) * a->strides[1] + head_dim, eb = (b->heads - 1) * b->strides[1] + head_dim;
    const intptr_t diff = (intptr_t)((const char *)b->ptr - (const char *)a->ptr);
    if (ea > period || eb > period || diff % (intptr_t)es != 0)
        return false;
    int64_t r = (int64_t)(diff / (intptr_t)es) % period;
    if (r < 0)
        r += period;
    return r >= ea && r + eb <= period;
}

static tk_status check_output(const char *fn, const rope_tensor *out, const rope_tensor *own_in,
                              const rope_tensor *other_in, const rope_tensor *other_out, int64_t tokens,
                              int64_t head_dim, size_t es) {
    if (out->heads == 0)
        return TK_SUCCESS;
    const bool same_strides = out->strides[0] == own_in->strides[0] && out->strides[1] == own_in->strides[1];
    TK_TRY(tk_check_overlap(fn, out->name, out->ptr, out->bytes, own_in->name, own_in->ptr, own_in->bytes,
                            same_strides));
    if (other_in->heads > 0 && !tensors_disjoint(out, other_in, tokens, head_dim, es))
        return tk_fail(TK_ERROR_OVERLAP, fn, "argument '%s' shares elements with '%s'", out->name, other_in->name);
    if (other_out->heads > 0 && !tensors_disjoint(out, other_out, tokens, head_dim, es))
        return tk_fail(TK_ERROR_OVERLAP, fn, "argument '%s' shares elements with '%s'", out->name, other_out->name);
    return TK_SUCCESS;
}

static tk_status check_not_written(const char *fn, const rope_tensor *out, const char *name, const void *p,
                                   size_t bytes) {
    if (out->heads == 0)
        return TK_SUCCESS;
    return tk_check_overlap(fn, out->name, out->ptr, out->bytes, name, p, bytes, false);
}

static tk_status rope_run(const char *fn, const tk_rope_params *given, const void *q, const void *k, void *q_out,
                          void *k_out, bool backward, tk_stream_t stream) {
    const char *q_name = backward ? "dq" : "q", *k_name = backward ? "dk" : "k";
    const char *q_out_name = backward ? "dq_out" : "q_out", *k_out_name = backward ? "dk_out" : "k_out";
    tk_rope_params params;
    TK_TRY(TK_READ_PARAMS(fn, "p", given, &params, tk_rope_params, TK_ROPE_PARAMS_INIT,
                          TK_ROPE_PARAMS_SIZE_0_1));
    const tk_rope_params *p = &params;
    TK_TRY(tk_check_dtype(fn, "p->dtype", p->dtype));
    if (p->style != TK_ROPE_NEOX && p->style != TK_ROPE_GPTJ)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->style = %d is not TK_ROPE_NEOX (0) or TK_ROPE_GPTJ (1)", (int)p->style);
    if (p->tokens < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->tokens = %lld is negative", (long long)p->tokens);
    if (p->heads_q < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->heads_q = %lld is negative", (long long)p->heads_q);
    if (p->heads_k < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->heads_k = %lld is negative", (long long)p->heads_k);
    if (p->head_dim < 2)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->head_dim = %lld must be at least 2", (long long)p->head_dim);
    const int64_t rotary_dim = p->rotary_dim ? p->rotary_dim : p->head_dim;
    if (rotary_dim < 0 || rotary_dim > p->head_dim || rotary_dim % 2 != 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->rotary_dim = %lld must be even and in [2, head_dim = %lld] (0 = head_dim)",
                       (long long)p->rotary_dim, (long long)p->head_dim);
    if (p->heads_q > INT64_MAX / 2 || p->heads_k > INT64_MAX / 2)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->heads_q + p->heads_k overflows int64");
    if (p->positions32 && p->positions64)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->positions32 and p->positions64 are both set; pass at most one");
    const bool cached = p->cos_cache != NULL || p->sin_cache != NULL;
    if (cached) {
        TK_TRY(tk_check_not_null(fn, "p->cos_cache", p->cos_cache));
        TK_TRY(tk_check_not_null(fn, "p->sin_cache", p->sin_cache));
        if (p->max_position < 1)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->max_position = %lld must be at least 1 with a cache",
                           (long long)p->max_position);
        if (p->cache_row_stride != 0 && p->cache_row_stride < rotary_dim / 2)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "p->cache_row_stride = %lld is smaller than rotary_dim / 2 = %lld (0 = rotary_dim / 2)",
                           (long long)p->cache_row_stride, (long long)(rotary_dim / 2));
    } else if (!(p->theta > 0.0f) || !isfinite(p->theta)) {
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->theta = %g must be a positive finite number (e.g. 10000)",
                       (double)p->theta);
    }
    const size_t es = tk_dtype_size(p->dtype);
    const int64_t hd = p->head_dim;
    rope_tensor tq = {q_name, "p->q_strides", q, p->heads_q, {0, 0}, 0};
    rope_tensor kin = {k_name, "p->k_strides", k, p->heads_k, {0, 0}, 0};
    rope_tensor tqo = {q_out_name, "p->q_out_strides", q_out, p->heads_q, {0, 0}, 0};
    rope_tensor tko = {k_out_name, "p->k_out_strides", k_out, p->heads_k, {0, 0}, 0};
    int64_t q_dense_token, k_dense_token;
    TK_TRY(tk_mul_checked(fn, "p->heads_q * p->head_dim", p->heads_q, hd, &q_dense_token));
    TK_TRY(tk_mul_checked(fn, "p->heads_k * p->head_dim", p->heads_k, hd, &k_dense_token));
    const int64_t q_dense[2] = {q_dense_token, hd}, k_dense[2] = {k_dense_token, hd};
    TK_TRY(resolve_tensor(fn, &tq, p->q_strides, q_dense, p->tokens, hd, es));
    TK_TRY(resolve_tensor(fn, &kin, p->k_strides, k_dense, p->tokens, hd, es));
    TK_TRY(resolve_tensor(fn, &tqo, p->q_out_strides, tq.strides, p->tokens, hd, es));
    TK_TRY(resolve_tensor(fn, &tko, p->k_out_strides, kin.strides, p->tokens, hd, es));
    if (p->tokens == 0 || p->heads_q + p->heads_k == 0)
        return TK_SUCCESS;

    if (p->heads_q > 0) {
        TK_TRY(tk_check_not_null(fn, q_name, q));
        TK_TRY(tk_check_not_null(fn, q_out_name, q_out));
    }
    if (p->heads_k > 0) {
        TK_TRY(tk_check_not_null(fn, k_name, k));
        TK_TRY(tk_check_not_null(fn, k_out_name, k_out));
    }
    TK_TRY(tk_check_aligned(fn, q_name, p->heads_q ? q : NULL, es));
    TK_TRY(tk_check_aligned(fn, q_out_name, p->heads_q ? q_out : NULL, es));
    TK_TRY(tk_check_aligned(fn, k_name, p->heads_k ? k : NULL, es));
    TK_TRY(tk_check_aligned(fn, k_out_name, p->heads_k ? k_out : NULL, es));
    TK_TRY(tk_check_aligned(fn, "p->positions32", p->positions32, 4));
    TK_TRY(tk_check_aligned(fn, "p->positions64", p->positions64, 8));
    TK_TRY(tk_check_aligned(fn, "p->cos_cache", p->cos_cache, 4));
    TK_TRY(tk_check_aligned(fn, "p->sin_cache", p->sin_cache, 4));

    const int64_t cache_stride = p->cache_row_stride ? p->cache_row_stride : rotary_dim / 2;
    size_t cache_bytes = 0;
    if (cached) {
        int64_t rows_span;
        TK_TRY(tk_mul_checked(fn, "p->max_position * p->cache_row_stride", p->max_position - 1, cache_stride,
                              &rows_span));
        if (rows_span > INT64_MAX / 8)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn, "the cache's byte size overflows int64");
        cache_bytes = (size_t)(rows_span + rotary_dim / 2) * sizeof(float);
    }
    const size_t pos_bytes = (size_t)p->tokens * (p->positions32 ? 4 : 8);
    TK_TRY(check_output(fn, &tqo, &tq, &kin, &tko, p->tokens, hd, es));
    TK_TRY(check_output(fn, &tko, &kin, &tq, &tqo, p->tokens, hd, es));
    const rope_tensor *outs[2] = {&tqo, &tko};
    for (int i = 0; i < 2; i++) {
        TK_TRY(check_not_written(fn, outs[i], "p->positions32", p->positions32, pos_bytes));
        TK_TRY(check_not_written(fn, outs[i], "p->positions64", p->positions64, pos_bytes));
        TK_TRY(check_not_written(fn, outs[i], "p->cos_cache", p->cos_cache, cache_bytes));
        TK_TRY(check_not_written(fn, outs[i], "p->sin_cache", p->sin_cache, cache_bytes));
    }

    tk_rope_call call = {0};
    call.dtype = p->dtype;
    call.style = p->style;
    call.backward = backward;
    call.copy_rest = rotary_dim < hd && !(q_out == q && k_out == k);
    call.q = p->heads_q ? q : NULL;
    call.k = p->heads_k ? k : NULL;
    call.q_out = p->heads_q ? q_out : NULL;
    call.k_out = p->heads_k ? k_out : NULL;
    call.tokens = p->tokens;
    call.heads_q = p->heads_q;
    call.heads_k = p->heads_k;
    call.head_dim = hd;
    call.rotary_dim = rotary_dim;
    for (int i = 0; i < 2; i++) {
        call.q_strides[i] = tq.strides[i];
        call.k_strides[i] = kin.strides[i];
        call.q_out_strides[i] = tqo.strides[i];
        call.k_out_strides[i] = tko.strides[i];
    }
    call.positions32 = p->positions32;
    call.positions64 = p->positions64;
    call.position_start = p->position_start;
    call.log2_inv_freq_step = cached ? 0.0 : -2.0 * log2((double)p->theta) / (double)rotary_dim;
    call.cos_cache = cached ? p->cos_cache : NULL;
    call.sin_cache = cached ? p->sin_cache : NULL;
    call.cache_row_stride = cache_stride;
    call.max_position = p->max_position;

    const tk_device *dev;
    TK_TRY(tk_current_device(fn, &dev));
    const tk_variant *v;
    TK_TRY(tk_select_variant(fn, backward ? &tk_op_rope_bwd : &tk_op_rope, dev, &call, &v));
    return tk_launched(fn, v, v->launch(&call, dev, stream));
}

TK_API tk_status tk_rope_fwd(const tk_rope_params *p, const void *q, const void *k, void *q_out, void *k_out,
                             tk_stream_t stream) {
    tk_begin_call();
    return rope_run("tk_rope_fwd", p, q, k, q_out, k_out, false, stream);
}

TK_API tk_status tk_rope_bwd(const tk_rope_params *p, const void *dq, const void *dk, void *dq_out, void *dk_out,
                             tk_stream_t stream) {
    tk_begin_call();
    return rope_run("tk_rope_bwd", p, dq, dk, dq_out, dk_out, true, stream);
}
