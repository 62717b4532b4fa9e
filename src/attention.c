/*
 * Attention forward and backward: argument checks and dispatch. The kernels are in cuda/attention*.cu (the
 * kernel itself in cuda/attention.cuh); the conventions are in include/tkern.h and the design in
 * docs/kernels/attention.md.
 *
 * Variants, best first: "wgmma_sm90_wide" (the Hopper kernel with 192 query rows on three
 * consumer warpgroups; head dim 64), "wgmma_sm90_persistent" (the next one's kernel, one CTA per
 * SM looping over the work tiles; head dims 64 and 128; chosen automatically only for short key
 * bands: persistent_prefers), "wgmma_sm90" (FlashAttention-3 style: TMA, warp specialisation,
 * wgmma; arch-specific, only cc 9.0 devices with an sm_90a binary; head dims 64, 128 and 256),
 * "mma_sm80_packed" (calls with a window bounded on both sides and an even GQA group: 2 or 4
 * query heads of one group share a CTA), then "mma_sm80" (FlashAttention-2 style, ldmatrix +
 * mma.sync, sm_80 and newer; every call). Backward (docs/kernels/attention_bwd.md):
 * "wgmma_sm90" (FlashAttention-3 style on Hopper: TMA, warp specialisation, wgmma, dQ added by
 * bulk reductions from shared memory; arch-specific; head dims 64 and 128, softcap at 128 only),
 * "mma_sm80_bn128" (8 warps per 128 keys; devices whose shared memory per block holds its
 * tiles: at head dims 80 and 128 not sm_86 / sm_89), "mma_sm80_d256" (head dim 256: 8 warps
 * per 64 keys, two per key splitting dK and dV by columns; sm_80 and sm_90, whose shared
 * memory per block holds its 143 KB), then "mma_sm80" (4 warps per 64 keys; every call at
 * head dims 64, 80, 96 and 128).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime.h"
#include "../cuda/attention.h"
#include "../cuda/attention_bwd.h"

/* The longest key band (window_left + window_right) on which the automatic choice takes the
 * persistent Hopper kernel. */
#define PERSISTENT_MAX_WINDOW 2048

/* Whether the automatic choice takes "wgmma_sm90_persistent" for a call it supports (head dims
 * 64 and 128; at 64 "wgmma_sm90_wide", above it, takes every call it supports): calls whose
 * query tiles each meet a short key band, where the per-tile costs it overlaps (the start:
 * table, Q and first K/V loads; the end: the last P V and the O store) weigh most. That is a
 * window bounded on both sides (causal is window_right 0) of at most PERSISTENT_MAX_WINDOW keys,
 * or a document mask; another mask on top (chunk, a window beside documents) only shortens the
 * band. Long bands tie or lose on it, so they stay on "wgmma_sm90"; the bound lies between a
 * measured gain (1024 keys) and a tie (4096): docs/kernels/attention.md, "Which Hopper variant
 * runs". The device does not enter: the variant runs only on cc 9.0. Document masks are taken
 * whatever their lengths (the ids are on the device), so one long document runs here at
 * causal's speed on this kernel, slightly below "wgmma_sm90"'s. */
static bool persistent_prefers(tk_call_args args, const tk_device *dev) {
    (void)dev;
    const tk_attention_call *c = args;
    const bool short_window = c->window_left >= 0 && c->window_right >= 0 &&
                              (int64_t)c->window_left + c->window_right <= PERSISTENT_MAX_WINDOW;
    return short_window || c->doc_ids != NULL;
}

static const tk_variant attention_variants[] = {
    {"wgmma_sm90_wide", TK_CC_HOPPER, true, tk_attention_supports_sm90_wide, tk_attention_launch_sm90_wide, NULL},
    {"wgmma_sm90_persistent", TK_CC_HOPPER, true, tk_attention_supports_sm90_persistent, tk_attention_launch_sm90_persistent,
     persistent_prefers},
    {"wgmma_sm90", TK_CC_HOPPER, true, tk_attention_supports_sm90, tk_attention_launch_sm90, NULL},
    {"mma_sm80_packed", TK_CC_AMPERE, false, tk_attention_supports_packed, tk_attention_launch_mma_packed, NULL},
    {"mma_sm80", TK_CC_AMPERE, false, NULL, tk_attention_launch_mma, NULL},
};
const tk_op tk_op_attention = {"attention", attention_variants, TK_VARIANT_COUNT(attention_variants)};

static const tk_variant attention_bwd_variants[] = {
    {"wgmma_sm90", TK_CC_HOPPER, true, tk_attention_bwd_supports_sm90, tk_attention_bwd_launch_sm90, NULL},
    {"mma_sm80_bn128", TK_CC_AMPERE, false, tk_attention_bwd_supports_bn128, tk_attention_bwd_launch_mma_bn128, NULL},
    {"mma_sm80_d256", TK_CC_AMPERE, false, tk_attention_bwd_supports_d256, tk_attention_bwd_launch_mma_d256, NULL},
    {"mma_sm80", TK_CC_AMPERE, false, tk_attention_bwd_supports_mma, tk_attention_bwd_launch_mma, NULL},
};
const tk_op tk_op_attention_bwd = {"attention_bwd", attention_bwd_variants,
                                   TK_VARIANT_COUNT(attention_bwd_variants)};

/* Kernel limits: row and key indices, windows and their sums stay in int32. */
#define MAX_SEQLEN (INT64_C(1) << 30)
/* Smallest query tile of any head dim (the grid is one CTA per tile, head and batch; a packed
 * CTA holds BM / n positions of n heads, which never makes more CTAs than that). */
#define MIN_QUERY_TILE 64

static const char *const dim_names[4] = {"batch", "sequence", "head", "head_dim"};

/* One tensor as the checks see it: its name, dims, strides (resolved) and element size. */
typedef struct tensor {
    const char *name;
    const void *ptr;
    int64_t dims[4];
    int64_t strides[4];
    size_t elem;
    size_t bytes; /* span from ptr to one past the last element */
} tensor;

/* Resolves x_strides (all 0 = dense [B, S, H, D]) and checks them. */
static tk_status resolve_strides(const char *fn, tensor *t, const int64_t given[4]) {
    if (given[0] == 0 && given[1] == 0 && given[2] == 0 && given[3] == 0) {
        t->strides[3] = 1;
        t->strides[2] = t->dims[3];
        TK_TRY(tk_mul_checked(fn, "heads * head_dim", t->dims[2], t->dims[3], &t->strides[1]));
        return tk_mul_checked(fn, "seqlen * heads * head_dim", t->dims[1], t->strides[1],
                              &t->strides[0]);
    }
    for (int d = 0; d < 4; d++) {
        if (given[d] < 0)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "%s_strides[%d] (%s stride) = %lld is negative", t->name, d,
                           dim_names[d], (long long)given[d]);
        t->strides[d] = given[d];
    }
    if (given[3] != 1)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "%s_strides[3] (head_dim stride) = %lld; the head_dim dimension must "
                       "be contiguous (stride 1), or all four strides 0 for a dense [B, S, H, D] "
                       "tensor",
                       t->name, (long long)given[3]);
    return TK_SUCCESS;
}

/* The tensor's layout: three strided dimensions over a contiguous head vector. */
static tk_layout layout_of(const tensor *t) {
    return (tk_layout){3, {t->dims[0], t->dims[1], t->dims[2]},
                       {t->strides[0], t->strides[1], t->strides[2]}, t->dims[3]};
}

/* The tensor's byte span, TK_ERROR_INVALID_VALUE when it overflows; for an output also that no
 * two of its elements share memory (a row written twice, by two blocks, races). */
static tk_status tensor_span(const char *fn, tensor *t, const char *strides_name, bool output) {
    const tk_layout l = layout_of(t);
    TK_TRY(tk_layout_bytes(fn, t->name, &l, t->elem, &t->bytes));
    return output ? tk_check_disjoint(fn, t->name, strides_name, &l) : TK_SUCCESS;
}

/* 16-byte aligned base; batch, sequence and head strides multiples of 8 elements wherever the
 * dimension has more than one element (the kernels move 16-byte chunks of rows). */
static tk_status check_vector_alignment(const char *fn, const tensor *t) {
    TK_TRY(tk_check_aligned(fn, t->name, t->ptr, 16));
    for (int d = 0; d < 3; d++)
        if (t->dims[d] > 1 && !tk_stride_keeps_alignment(t->strides[d], t->elem))
            return tk_fail(TK_ERROR_MISALIGNED, fn,
                           "%s_strides[%d] (%s stride) = %lld is not a multiple of 8 elements "
                           "(16 bytes); the kernels read and write rows in 16-byte chunks",
                           t->name, d, dim_names[d], (long long)t->strides[d]);
    return TK_SUCCESS;
}

static tk_status check_no_overlap(const char *fn, const tensor *out, const tensor *in) {
    return tk_check_overlap(fn, out->name, out->ptr, out->bytes, in->name, in->ptr, in->bytes, false);
}

static tk_status check_positive(const char *fn, const char *name, int64_t value) {
    if (value >= 1)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->%s = %lld must be at least 1", name,
                   (long long)value);
}

static tk_status check_window(const char *fn, const char *name, int64_t value) {
    if (value >= -1)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                   "p->%s = %lld; accepted: -1 (unbounded) or a window >= 0", name,
                   (long long)value);
}

/* The specialised masks (tkern.h): ranges, and the combinations that have no meaning. */
static tk_status check_masks(const char *fn, const tk_attention_params *p) {
    if (p->chunk_size < 0 || p->prefix_len < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->chunk_size = %lld, p->prefix_len = %lld; accepted: 0 (off) or a "
                       "length >= 1",
                       (long long)p->chunk_size, (long long)p->prefix_len);
    if (p->chunk_size > MAX_SEQLEN || p->prefix_len > MAX_SEQLEN)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->chunk_size = %lld, p->prefix_len = %lld: lengths past 2^30 are not "
                       "supported",
                       (long long)p->chunk_size, (long long)p->prefix_len);
    if (p->prefix_len > 0 && (p->causal != 1 || p->window_left >= 0))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->prefix_len = %lld needs p->causal = 1 and p->window_left = -1 (the "
                       "prefix is bidirectional, the rest causal); got causal = %d, window_left "
                       "= %lld",
                       (long long)p->prefix_len, p->causal, (long long)p->window_left);
    if (p->prefix_len > 0 && (p->chunk_size > 0 || p->document_ids))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->prefix_len = %lld cannot be combined with p->chunk_size or "
                       "p->document_ids",
                       (long long)p->prefix_len);
    if (p->document_ids && p->seqlen_q > p->seqlen_k)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->document_ids needs p->seqlen_q <= p->seqlen_k (query i is key position "
                       "i + seqlen_k - seqlen_q); got seqlen_q = %lld, seqlen_k = %lld",
                       (long long)p->seqlen_q, (long long)p->seqlen_k);
    return TK_SUCCESS;
}

/* A grid of batch x heads x tiles blocks (`what` names the product) within 2^31 - 1; heads and
 * tiles are bounded by the caller's checks, so their product does not overflow. */
static tk_status check_grid(const char *fn, const char *what, int64_t batch, int64_t heads, int64_t tiles) {
    if (batch > 0 && tiles * heads > INT32_MAX / batch)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn, "%s = %lld * %lld * %lld exceeds the grid limit 2^31 - 1",
                       what, (long long)batch, (long long)heads, (long long)tiles);
    return TK_SUCCESS;
}

/* The kernels' limits on batch and heads_q, for sequences within 2^30 (checked before); apart
 * from prepare, as tk_attention_bwd_workspace_size checks them at its batch too. */
static tk_status check_batch_limits(const char *fn, const tk_attention_params *p) {
    if (p->heads_q > INT32_MAX || p->batch > INT32_MAX)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->batch = %lld, p->heads_q = %lld: more than 2^31 - 1 is not supported",
                       (long long)p->batch, (long long)p->heads_q);
    return check_grid(fn, "batch * heads_q * ceil(seqlen_q / 64)", p->batch, p->heads_q,
                      (p->seqlen_q + MIN_QUERY_TILE - 1) / MIN_QUERY_TILE);
}

/* Validates *p (no CUDA call) and resolves it into *call; *work = false for a no-op. */
static tk_status prepare(const char *fn, const tk_attention_params *p, tk_attention_call *call,
                         bool *work) {
    TK_TRY(tk_check_dtype(fn, "p->dtype", p->dtype));
    if (p->dtype != TK_F16 && p->dtype != TK_BF16)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->dtype = %s is not supported; accepted: TK_F16, TK_BF16",
                       tk_dtype_name(p->dtype));
    if (p->batch < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->batch = %lld is negative",
                       (long long)p->batch);
    TK_TRY(check_positive(fn, "seqlen_q", p->seqlen_q));
    TK_TRY(check_positive(fn, "seqlen_k", p->seqlen_k));
    TK_TRY(check_positive(fn, "heads_q", p->heads_q));
    TK_TRY(check_positive(fn, "heads_kv", p->heads_kv));
    if (p->heads_q % p->heads_kv != 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->heads_q = %lld is not a multiple of p->heads_kv = %lld (each key/value "
                       "head serves heads_q / heads_kv query heads)",
                       (long long)p->heads_q, (long long)p->heads_kv);
    TK_TRY(check_positive(fn, "head_dim", p->head_dim));
    if (p->head_dim != 64 && p->head_dim != 80 && p->head_dim != 96 && p->head_dim != 128 &&
        p->head_dim != 256)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->head_dim = %lld is not supported; accepted: 64, 80, 96, 128, 256",
                       (long long)p->head_dim);
    if (!(p->softmax_scale >= 0.0f) || isinf(p->softmax_scale))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->softmax_scale = %g; accepted: a finite value > 0, or 0 for "
                       "1 / sqrt(head_dim)",
                       (double)p->softmax_scale);
    if (p->causal != 0 && p->causal != 1)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->causal = %d; accepted: 0 or 1", p->causal);
    TK_TRY(check_window(fn, "window_left", p->window_left));
    TK_TRY(check_window(fn, "window_right", p->window_right));
    if (p->causal && p->window_right > 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->window_right = %lld contradicts p->causal = 1 (causal means "
                       "window_right = 0); for a window reaching into the future set causal = 0",
                       (long long)p->window_right);
    TK_TRY(check_masks(fn, p));
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->softcap = %g; accepted: 0 (off) or a finite value > 0",
                       (double)p->softcap);
    if (p->return_lse != 0 && p->return_lse != 1)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->return_lse = %d; accepted: 0 or 1",
                       p->return_lse);
    /* Sizes bounded here keep every product below in int64. */
    if (p->seqlen_q > MAX_SEQLEN || p->seqlen_k > MAX_SEQLEN)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->seqlen_q = %lld, p->seqlen_k = %lld: sequences longer than 2^30 are "
                       "not supported",
                       (long long)p->seqlen_q, (long long)p->seqlen_k);
    TK_TRY(check_batch_limits(fn, p));

    const size_t elem = tk_dtype_size(p->dtype);
    tensor q = {"p->q", p->q, {p->batch, p->seqlen_q, p->heads_q, p->head_dim}, {0}, elem, 0};
    tensor k = {"p->k", p->k, {p->batch, p->seqlen_k, p->heads_kv, p->head_dim}, {0}, elem, 0};
    tensor v = {"p->v", p->v, {p->batch, p->seqlen_k, p->heads_kv, p->head_dim}, {0}, elem, 0};
    tensor o = {"p->o", p->o, {p->batch, p->seqlen_q, p->heads_q, p->head_dim}, {0}, elem, 0};
    TK_TRY(resolve_strides(fn, &q, p->q_strides));
    TK_TRY(resolve_strides(fn, &k, p->k_strides));
    TK_TRY(resolve_strides(fn, &v, p->v_strides));
    TK_TRY(resolve_strides(fn, &o, p->o_strides));
    *work = p->batch > 0;
    if (!*work)
        return TK_SUCCESS;
    TK_TRY(tensor_span(fn, &q, "p->q_strides", false));
    TK_TRY(tensor_span(fn, &k, "p->k_strides", false));
    TK_TRY(tensor_span(fn, &v, "p->v_strides", false));
    TK_TRY(tensor_span(fn, &o, "p->o_strides", true));

    TK_TRY(tk_check_not_null(fn, "p->q", p->q));
    TK_TRY(tk_check_not_null(fn, "p->k", p->k));
    TK_TRY(tk_check_not_null(fn, "p->v", p->v));
    TK_TRY(tk_check_not_null(fn, "p->o", p->o));
    if (p->return_lse && p->lse == NULL)
        return tk_fail(TK_ERROR_NULL_POINTER, fn,
                       "p->lse is NULL but p->return_lse = 1; pass a device buffer of "
                       "batch * heads_q * seqlen_q floats");
    TK_TRY(check_vector_alignment(fn, &q));
    TK_TRY(check_vector_alignment(fn, &k));
    TK_TRY(check_vector_alignment(fn, &v));
    TK_TRY(check_vector_alignment(fn, &o));
    /* lse and alibi_slopes as dense f32 tensors (the dims give their element counts). */
    tensor lse = {"p->lse", p->return_lse ? p->lse : NULL, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    lse.bytes = (size_t)(p->batch * p->heads_q * p->seqlen_q) * 4;
    tensor alibi = {"p->alibi_slopes", p->alibi_slopes, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    alibi.bytes = (size_t)p->heads_q * 4;
    tensor sinks = {"p->sinks", p->sinks, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    sinks.bytes = (size_t)p->heads_q * 4;
    tensor docs = {"p->document_ids", p->document_ids, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    docs.bytes = (size_t)(p->batch * p->seqlen_k) * 4;
    TK_TRY(tk_check_aligned(fn, "p->lse", lse.ptr, 4));
    TK_TRY(tk_check_aligned(fn, "p->alibi_slopes", alibi.ptr, 4));
    TK_TRY(tk_check_aligned(fn, "p->sinks", sinks.ptr, 4));
    TK_TRY(tk_check_aligned(fn, "p->document_ids", docs.ptr, 4));
    const tensor *inputs[6] = {&q, &k, &v, &alibi, &sinks, &docs};
    for (int a = 0; a < 6; a++) {
        TK_TRY(check_no_overlap(fn, &o, inputs[a]));
        if (lse.ptr)
            TK_TRY(check_no_overlap(fn, &lse, inputs[a]));
    }
    if (lse.ptr)
        TK_TRY(check_no_overlap(fn, &o, &lse));

    memset(call, 0, sizeof *call);
    call->dtype = (int)p->dtype;
    call->head_dim = (int)p->head_dim;
    call->q = p->q;
    call->k = p->k;
    call->v = p->v;
    call->o = p->o;
    call->lse = lse.ptr ? p->lse : NULL;
    call->alibi_slopes = p->alibi_slopes;
    call->batch = (int)p->batch;
    call->seqlen_q = (int)p->seqlen_q;
    call->seqlen_k = (int)p->seqlen_k;
    call->heads_q = (int)p->heads_q;
    call->heads_kv = (int)p->heads_kv;
    for (int d = 0; d < 3; d++) {
        call->q_stride[d] = q.strides[d];
        call->k_stride[d] = k.strides[d];
        call->v_stride[d] = v.strides[d];
        call->o_stride[d] = o.strides[d];
    }
    /* Windows that cover every key become unbounded, so that equivalent masks run the same
     * code: window_left >= seqlen_k - 1 reaches key 0 from the last row, window_right >=
     * seqlen_q - 1 reaches the last key from row 0. */
    const int64_t right = p->causal ? 0 : p->window_right;
    call->window_left = p->window_left >= p->seqlen_k - 1 ? -1 : (int)p->window_left;
    call->window_right = right >= p->seqlen_q - 1 ? -1 : (int)right;
    call->scale = p->softmax_scale > 0.0f ? p->softmax_scale : 1.0f / sqrtf((float)p->head_dim);
    call->softcap = p->softcap;
    call->sinks = p->sinks;
    /* One chunk over every key position (none before the first key) is no chunk. */
    const bool one_chunk = p->seqlen_k <= p->chunk_size && p->seqlen_q <= p->seqlen_k;
    call->chunk = one_chunk ? 0 : (int)p->chunk_size;
    call->prefix = (int)p->prefix_len;
    call->doc_ids = p->document_ids;
    return TK_SUCCESS;
}

static tk_status attention_run(const char *fn, const tk_attention_params *p, tk_stream_t stream) {
    tk_attention_call call;
    bool work = false;
    TK_TRY(prepare(fn, p, &call, &work));
    if (!work)
        return TK_SUCCESS;
    const tk_device *dev;
    TK_TRY(tk_current_device(fn, &dev));
    const tk_variant *v;
    TK_TRY(tk_select_variant(fn, &tk_op_attention, dev, &call, &v));
    return tk_launched(fn, v, v->launch(&call, dev, stream));
}

/* The caller's *given into *local by the params rule (tk_read_params). */
static tk_status read_params(const char *fn, const tk_attention_params *given,
                             tk_attention_params *local) {
    return TK_READ_PARAMS(fn, "p", given, local, tk_attention_params, TK_ATTENTION_PARAMS_INIT,
                          TK_ATTENTION_PARAMS_SIZE_0_1);
}

TK_API tk_status tk_attention_fwd(const tk_attention_params *given, tk_stream_t stream) {
    static const char fn[] = "tk_attention_fwd";
    tk_begin_call();
    tk_attention_params p;
    TK_TRY(read_params(fn, given, &p));
    return attention_run(fn, &p, stream);
}

TK_API tk_status tk_attention_sliding_fwd(const tk_attention_params *p, int64_t window_left,
                                          tk_stream_t stream) {
    static const char fn[] = "tk_attention_sliding_fwd";
    tk_begin_call();
    tk_attention_params local;
    TK_TRY(read_params(fn, p, &local));
    if (window_left < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "argument 'window_left' = %lld; accepted: >= 0 (the keys before the "
                       "diagonal that each query sees; Mistral's sliding_window N is N - 1)",
                       (long long)window_left);
    local.causal = 1;
    local.window_left = window_left;
    local.window_right = 0;
    return attention_run(fn, &local, stream);
}

TK_API tk_status tk_attention_supported(const tk_attention_params *given, const char **variant_name) {
    static const char fn[] = "tk_attention_supported";
    tk_begin_call();
    if (variant_name)
        *variant_name = NULL;
    tk_attention_params p;
    TK_TRY(read_params(fn, given, &p));
    tk_attention_call call;
    bool work = false;
    TK_TRY(prepare(fn, &p, &call, &work));
    if (!work) {
        if (variant_name)
            *variant_name = "";
        return TK_SUCCESS;
    }
    const tk_device *dev;
    TK_TRY(tk_current_device(fn, &dev));
    const tk_variant *v;
    TK_TRY(tk_select_variant(fn, &tk_op_attention, dev, &call, &v));
    if (variant_name)
        *variant_name = v->name;
    return TK_SUCCESS;
}

/* ---- backward ---- */

/* The backward's sizes past the forward's limits: the main kernel's grid is one CTA per 64
 * keys, batch and key/value head; the row kernels' one per 4 query rows of every head. */
#define BWD_KEY_TILE 64
#define BWD_ROWS_PER_BLOCK 4

/* The forward's parameters of a backward call: validating them validates the shared fields by
 * the forward's rules and messages (o and lse are read here, never written, which the forward's
 * stricter output rules still fit). */
static tk_attention_params forward_params(const tk_attention_bwd_params *p) {
    tk_attention_params f = TK_ATTENTION_PARAMS_INIT;
    f.dtype = p->dtype;
    f.q = p->q;
    f.k = p->k;
    f.v = p->v;
    f.o = (void *)(uintptr_t)p->o;
    f.batch = p->batch;
    f.seqlen_q = p->seqlen_q;
    f.seqlen_k = p->seqlen_k;
    f.heads_q = p->heads_q;
    f.heads_kv = p->heads_kv;
    f.head_dim = p->head_dim;
    memcpy(f.q_strides, p->q_strides, sizeof f.q_strides);
    memcpy(f.k_strides, p->k_strides, sizeof f.k_strides);
    memcpy(f.v_strides, p->v_strides, sizeof f.v_strides);
    memcpy(f.o_strides, p->o_strides, sizeof f.o_strides);
    f.softmax_scale = p->softmax_scale;
    f.causal = p->causal;
    f.window_left = p->window_left;
    f.window_right = p->window_right;
    f.softcap = p->softcap;
    f.alibi_slopes = p->alibi_slopes;
    f.return_lse = 1;
    f.lse = (float *)(uintptr_t)p->lse;
    f.sinks = p->sinks;
    f.chunk_size = p->chunk_size;
    f.prefix_len = p->prefix_len;
    f.document_ids = p->document_ids;
    return f;
}

/* The backward's own grid limits, on sizes the forward's checks have bounded. */
static tk_status check_bwd_grids(const char *fn, const tk_attention_bwd_params *p) {
    TK_TRY(check_grid(fn, "batch * heads_kv * ceil(seqlen_k / 64)", p->batch, p->heads_kv,
                      (p->seqlen_k + BWD_KEY_TILE - 1) / BWD_KEY_TILE));
    if (p->batch > 0 &&
        p->seqlen_q * p->heads_q > (int64_t)INT32_MAX * BWD_ROWS_PER_BLOCK / p->batch)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "batch * heads_q * seqlen_q = %lld * %lld * %lld exceeds the row kernels' "
                       "grid limit (2^31 - 1) * 4",
                       (long long)p->batch, (long long)p->heads_q, (long long)p->seqlen_q);
    return TK_SUCCESS;
}

/* Validates the sizes, the forward's fields and deterministic of *p and resolves them into
 * call->fwd and call->deterministic; *work = false for a no-op. */
static tk_status prepare_bwd_shape(const char *fn, const tk_attention_bwd_params *p,
                                   tk_attention_bwd_call *call, bool *work) {
    const tk_attention_params f = forward_params(p);
    memset(call, 0, sizeof *call);
    TK_TRY(prepare(fn, &f, &call->fwd, work));
    if (p->deterministic != 0 && p->deterministic != 1)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->deterministic = %d; accepted: 0 or 1",
                       p->deterministic);
    call->deterministic = p->deterministic;
    return check_bwd_grids(fn, p);
}

/* A gradient or dout tensor shaped like `like`, laid out by `given` strides. */
static tk_status bwd_tensor(const char *fn, tensor *t, const char *name, const void *ptr,
                            const tensor *like, const int64_t given[4], const char *strides_name,
                            bool output) {
    *t = (tensor){name, ptr, {0}, {0}, like->elem, 0};
    memcpy(t->dims, like->dims, sizeof t->dims);
    TK_TRY(resolve_strides(fn, t, given));
    TK_TRY(tensor_span(fn, t, strides_name, output));
    TK_TRY(tk_check_not_null(fn, name, ptr));
    return check_vector_alignment(fn, t);
}

/* Validates *p (no CUDA call) and resolves it into *call. */
static tk_status prepare_bwd(const char *fn, const tk_attention_bwd_params *p,
                             tk_attention_bwd_call *call, bool *work) {
    TK_TRY(prepare_bwd_shape(fn, p, call, work));
    if (!*work)
        return TK_SUCCESS;
    const size_t elem = tk_dtype_size(p->dtype);
    const tk_attention_call *c = &call->fwd;
    tensor q = {"p->q", p->q, {p->batch, p->seqlen_q, p->heads_q, p->head_dim}, {0}, elem, 0};
    tensor k = {"p->k", p->k, {p->batch, p->seqlen_k, p->heads_kv, p->head_dim}, {0}, elem, 0};
    tensor v = k, o = q;
    v.name = "p->v", v.ptr = p->v, o.name = "p->o", o.ptr = p->o;
    TK_TRY(resolve_strides(fn, &q, p->q_strides));
    TK_TRY(resolve_strides(fn, &k, p->k_strides));
    TK_TRY(resolve_strides(fn, &v, p->v_strides));
    TK_TRY(resolve_strides(fn, &o, p->o_strides));
    TK_TRY(tensor_span(fn, &q, "p->q_strides", false));
    TK_TRY(tensor_span(fn, &k, "p->k_strides", false));
    TK_TRY(tensor_span(fn, &v, "p->v_strides", false));
    TK_TRY(tensor_span(fn, &o, "p->o_strides", false));
    tensor dout, dq, dk, dv;
    TK_TRY(bwd_tensor(fn, &dout, "p->dout", p->dout, &o, p->dout_strides, "p->dout_strides", false));
    TK_TRY(bwd_tensor(fn, &dq, "p->dq", p->dq, &q, p->dq_strides, "p->dq_strides", true));
    TK_TRY(bwd_tensor(fn, &dk, "p->dk", p->dk, &k, p->dk_strides, "p->dk_strides", true));
    TK_TRY(bwd_tensor(fn, &dv, "p->dv", p->dv, &v, p->dv_strides, "p->dv_strides", true));
    const size_t needed = tk_attention_bwd_workspace_bytes(c, call->deterministic);
    TK_TRY(tk_check_not_null(fn, "p->workspace", p->workspace));
    TK_TRY(tk_check_aligned(fn, "p->workspace", p->workspace, 16));
    if (p->workspace_bytes < needed)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->workspace_bytes = %zu is smaller than the %zu bytes this shape needs "
                       "(tk_attention_bwd_workspace_size)",
                       p->workspace_bytes, needed);
    tensor lse = {"p->lse", p->lse, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    lse.bytes = (size_t)(p->batch * p->heads_q * p->seqlen_q) * 4;
    tensor alibi = {"p->alibi_slopes", p->alibi_slopes, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    alibi.bytes = (size_t)p->heads_q * 4;
    tensor ws = {"p->workspace", p->workspace, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, needed};
    tensor sinks = {"p->sinks", p->sinks, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    sinks.bytes = (size_t)p->heads_q * 4;
    tensor docs = {"p->document_ids", p->document_ids, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    docs.bytes = (size_t)(p->batch * p->seqlen_k) * 4;
    tensor dsinks = {"p->dsinks", p->sinks ? p->dsinks : NULL, {1, 1, 1, 1}, {0, 0, 0, 1}, 4, 0};
    dsinks.bytes = sinks.bytes;
    if (p->sinks)
        TK_TRY(tk_check_not_null(fn, "p->dsinks", p->dsinks));
    TK_TRY(tk_check_aligned(fn, "p->dsinks", dsinks.ptr, 4));
    /* Every written buffer against every other buffer. */
    const tensor *written[5] = {&dq, &dk, &dv, &ws, &dsinks};
    const tensor *all[13] = {&q, &k, &v, &o, &lse, &dout, &alibi, &sinks, &docs, &dq, &dk, &dv, &ws};
    for (int w = 0; w < 5; w++)
        for (int a = 0; a < 13; a++)
            if (written[w] != all[a] && written[w]->ptr)
                TK_TRY(check_no_overlap(fn, written[w], all[a]));
    call->dout = p->dout;
    call->dq = p->dq;
    call->dk = p->dk;
    call->dv = p->dv;
    for (int d = 0; d < 3; d++) {
        call->do_stride[d] = dout.strides[d];
        call->dq_stride[d] = dq.strides[d];
        call->dk_stride[d] = dk.strides[d];
        call->dv_stride[d] = dv.strides[d];
    }
    call->workspace = p->workspace;
    call->dsinks = dsinks.ptr ? p->dsinks : NULL;
    return TK_SUCCESS;
}

static tk_status read_bwd_params(const char *fn, const tk_attention_bwd_params *given,
                                 tk_attention_bwd_params *local) {
    return TK_READ_PARAMS(fn, "p", given, local, tk_attention_bwd_params,
                          TK_ATTENTION_BWD_PARAMS_INIT, TK_ATTENTION_BWD_PARAMS_SIZE_0_1);
}

TK_API tk_status tk_attention_bwd_workspace_size(const tk_attention_bwd_params *given,
                                                 size_t *bytes) {
    static const char fn[] = "tk_attention_bwd_workspace_size";
    tk_begin_call();
    TK_TRY(tk_check_not_null(fn, "bytes", bytes));
    tk_attention_bwd_params p;
    TK_TRY(read_bwd_params(fn, given, &p));
    /* Only the sizes matter here: the pointers are those of a call not made yet. */
    if (p.batch < 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->batch = %lld is negative", (long long)p.batch);
    tk_attention_bwd_call call;
    bool work = false;
    tk_attention_bwd_params sizes = p;
    sizes.batch = 0;
    TK_TRY(prepare_bwd_shape(fn, &sizes, &call, &work));
    /* The limits that involve batch, which batch 0 above passed: the sizes below stay in int and
     * size_t, and the call is one tk_attention_bwd accepts. */
    const tk_attention_params f = forward_params(&p);
    TK_TRY(check_batch_limits(fn, &f));
    TK_TRY(check_bwd_grids(fn, &p));
    call.fwd.batch = (int)p.batch;
    call.fwd.heads_q = (int)p.heads_q;
    call.fwd.seqlen_q = (int)p.seqlen_q;
    call.fwd.head_dim = (int)p.head_dim;
    *bytes = p.batch > 0 ? tk_attention_bwd_workspace_bytes(&call.fwd, call.deterministic) : 0;
    return TK_SUCCESS; /* *bytes is written only here: a failure leaves it as it was */
}

TK_API tk_status tk_attention_bwd(const tk_attention_bwd_params *given, tk_stream_t stream) {
    static const char fn[] = "tk_attention_bwd";
    tk_begin_call();
    tk_attention_bwd_params p;
    TK_TRY(read_bwd_params(fn, given, &p));
    tk_attention_bwd_call call;
    bool work = false;
    TK_TRY(prepare_bwd(fn, &p, &call, &work));
    if (!work)
        return TK_SUCCESS;
    const tk_device *dev;
    TK_TRY(tk_current_device(fn, &dev));
    const tk_variant *v;
    TK_TRY(tk_select_variant(fn, &tk_op_attention_bwd, dev, &call, &v));
    return tk_launched(fn, v, v->launch(&call, dev, stream));
}
