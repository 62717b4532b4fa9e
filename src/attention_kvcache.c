/*
 * Attention over a KV cache: argument checks, the split count and dispatch. The kernels are in
 * cuda/attention_kvcache.cu and cuda/attention_kvcache_prefill.cu; the conventions are in
 * include/tkern.h and the design in docs/kernels/attention_kvcache.md.
 *
 * Variants, in selection order: "prefill_sm80" (the FlashAttention-2 forward over the cache, for
 * calls with at least half its query tile of queries per sequence and one split; sm_80 and newer)
 * and "decode_sm80" (mma.sync, cp.async, sm_80 and newer; every call). The host sees the
 * sizes of every tensor but not the device-side lengths, query offsets or page numbers; those the
 * kernels clamp (tkern.h says how).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime.h"
#include "../cuda/attention_kvcache.h"

/* Chunks of many queries per sequence, without splits: the prefill kernel's query tiles are at
 * least half used (cuda/attention_kvcache_prefill.cu says why). RoPE is applied by the decode
 * kernel only, as it stages its query rows. */
static bool prefill_supports(tk_call_args call, const tk_device *dev) {
    (void)dev;
    const tk_attention_kvcache_call *c = call;
    return c->num_splits == 1 && c->rotary_dim == 0 &&
           c->seqlen_q >= tk_attention_kvcache_prefill_min_queries(c->head_dim);
}

/* Whether the library's own choice (num_splits = 0) runs c unsplit on the prefill kernel: a
 * chunk long enough for it whose query tiles alone give every SM a CTA; splits then only add
 * a merge. Shorter or fewer chunks keep the decode kernel's split plan. */
static bool prefill_by_choice(const tk_attention_kvcache_call *c, const tk_device *dev) {
    const int64_t min_queries = tk_attention_kvcache_prefill_min_queries((int)c->head_dim);
    const int64_t tile_rows = 2 * min_queries; /* min_queries is half a query tile */
    const double ctas = ceil((double)c->seqlen_q / (double)tile_rows) * (double)c->heads_q * (double)c->batch;
    return c->num_splits == 0 && c->rotary_dim == 0 && c->seqlen_q >= min_queries && ctas >= dev->sm_count;
}

static const tk_variant kvcache_variants[] = {
    {"prefill_sm80", TK_CC_AMPERE, false, prefill_supports, tk_attention_kvcache_launch_prefill, NULL},
    {"decode_sm80", TK_CC_AMPERE, false, NULL, tk_attention_kvcache_launch_decode, NULL},
};
const tk_op tk_op_attention_kvcache = {"attention_kvcache", kvcache_variants,
                                       TK_VARIANT_COUNT(kvcache_variants)};

/* The size of tk_attention_kvcache_params in its first released layout (see runtime.h). */
#define KVCACHE_PARAMS_SIZE_0_1 448
_Static_assert(sizeof(tk_attention_kvcache_params) >= KVCACHE_PARAMS_SIZE_0_1,
               "tk_attention_kvcache_params only grows");

/* Kernel limits: positions, keys and rows of a GQA group stay in int32 with room for sums. */
#define MAX_SEQLEN (INT64_C(1) << 30)
#define MAX_SPLITS 1024
#define QUERY_ROWS_PER_CTA 16
#define APPEND_THREADS 256

/* One [dim0, dim1, heads, head_dim] tensor as the checks see it. */
typedef struct tensor {
    const char *name;
    const char *strides_name;
    const void *ptr;
    int64_t dims[4];
    int64_t strides[4];
    size_t bytes;
} tensor;

/* Resolves given strides (all 0 = dense) into t->strides, checks them and t's byte span; an
 * output must also not write an element twice. */
static tk_status resolve_tensor(const char *fn, tensor *t, const int64_t given[4], size_t elem,
                                bool output) {
    if (given[0] == 0 && given[1] == 0 && given[2] == 0 && given[3] == 0) {
        t->strides[3] = 1;
        t->strides[2] = t->dims[3];
        TK_TRY(tk_mul_checked(fn, "heads * head_dim", t->dims[2], t->dims[3], &t->strides[1]));
        TK_TRY(tk_mul_checked(fn, "positions * heads * head_dim", t->dims[1], t->strides[1],
                              &t->strides[0]));
    } else {
        for (int d = 0; d < 4; d++) {
            if (given[d] < 0)
                return tk_fail(TK_ERROR_INVALID_VALUE, fn, "%s[%d] = %lld is negative",
                               t->strides_name, d, (long long)given[d]);
            t->strides[d] = given[d];
        }
        if (given[3] != 1)
            return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                           "%s[3] (head_dim stride) = %lld; head_dim must be contiguous (stride "
                           "1), or all four strides 0 for a dense tensor",
                           t->strides_name, (long long)given[3]);
    }
    const tk_layout l = {3, {t->dims[0], t->dims[1], t->dims[2]},
                         {t->strides[0], t->strides[1], t->strides[2]}, t->dims[3]};
    TK_TRY(tk_layout_bytes(fn, t->name, &l, elem, &t->bytes));
    return output ? tk_check_disjoint(fn, t->name, t->strides_name, &l) : TK_SUCCESS;
}

/* 16-byte aligned base, strides in whole 16-byte chunks where a dimension has > 1 element. */
static tk_status check_vector_alignment(const char *fn, const tensor *t, size_t elem) {
    TK_TRY(tk_check_aligned(fn, t->name, t->ptr, 16));
    for (int d = 0; d < 3; d++)
        if (t->dims[d] > 1 && !tk_stride_keeps_alignment(t->strides[d], elem))
            return tk_fail(TK_ERROR_MISALIGNED, fn,
                           "%s[%d] = %lld is not a multiple of 8 elements (16 bytes); the "
                           "kernels move rows in 16-byte chunks",
                           t->strides_name, d, (long long)t->strides[d]);
    return TK_SUCCESS;
}

static tk_status check_at_least(const char *fn, const char *name, int64_t value, int64_t least) {
    if (value >= least)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->%s = %lld must be at least %lld", name,
                   (long long)value, (long long)least);
}

static tk_status check_flag(const char *fn, const char *name, int value) {
    if (value == 0 || value == 1)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->%s = %d; accepted: 0 or 1", name, value);
}

static tk_status check_limit(const char *fn, const char *what, int64_t value, int64_t limit) {
    if (value <= limit)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_NOT_SUPPORTED, fn, "%s = %lld exceeds the kernel's limit %lld", what,
                   (long long)value, (long long)limit);
}

/* The values of `rows` rows of `width` int32 or f32, `stride` apart (the block table, the RoPE
 * cache): those strides have no upper bound, so the span (`what` names its product) and its
 * bytes must fit int64. */
static tk_status check_rows_span(const char *fn, const char *what, int64_t rows, int64_t stride,
                                 int64_t width) {
    int64_t span;
    TK_TRY(tk_mul_checked(fn, what, rows - 1, stride, &span));
    if (span > INT64_MAX / 4 - width)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "%s = %lld: the array's byte size overflows int64",
                       what, (long long)span);
    return TK_SUCCESS;
}

static bool finite_at_least(float x, float least) {
    return isfinite(x) && x >= least;
}

/* The RoPE fields (rotary_dim 0: none, the others not read). A cache is told by its pointers
 * (not read here). */
static tk_status check_rope(const char *fn, const tk_attention_kvcache_params *p) {
    if (p->rotary_dim == 0)
        return TK_SUCCESS;
    if (p->rotary_dim < 0 || p->rotary_dim > p->head_dim)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->rotary_dim = %lld; accepted: 0 (no RoPE) or 1 .. head_dim = %lld",
                       (long long)p->rotary_dim, (long long)p->head_dim);
    if (p->rotary_dim % 16 != 0)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->rotary_dim = %lld is not a multiple of 16 (the kernels rotate 16-byte "
                       "chunks whose NeoX partners are whole chunks)",
                       (long long)p->rotary_dim);
    if (p->rope_style != TK_ROPE_NEOX && p->rope_style != TK_ROPE_GPTJ)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->rope_style = %d; accepted: TK_ROPE_NEOX, TK_ROPE_GPTJ", (int)p->rope_style);
    if (p->rope_scaling != TK_ROPE_SCALING_NONE && p->rope_scaling != TK_ROPE_SCALING_LLAMA3 &&
        p->rope_scaling != TK_ROPE_SCALING_YARN)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->rope_scaling = %d; accepted: TK_ROPE_SCALING_NONE, _LLAMA3, _YARN",
                       (int)p->rope_scaling);
    if (p->rope_cos || p->rope_sin) {
        if (p->rope_scaling != TK_ROPE_SCALING_NONE)
            return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                           "p->rope_scaling = %d with a cos/sin cache; a cache holds its angles "
                           "already scaled: pass TK_ROPE_SCALING_NONE",
                           (int)p->rope_scaling);
        TK_TRY(check_at_least(fn, "rope_max_position", p->rope_max_position, 1));
        if (p->rope_cache_row_stride != 0 && p->rope_cache_row_stride < p->rotary_dim / 2)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "p->rope_cache_row_stride = %lld is smaller than rotary_dim / 2 = %lld "
                           "(0 means rotary_dim / 2)",
                           (long long)p->rope_cache_row_stride, (long long)(p->rotary_dim / 2));
        return check_rows_span(fn, "(p->rope_max_position - 1) * p->rope_cache_row_stride",
                               p->rope_max_position,
                               p->rope_cache_row_stride ? p->rope_cache_row_stride : p->rotary_dim / 2,
                               p->rotary_dim / 2);
    }
    if (!finite_at_least(p->rope_theta, 0.0f) || p->rope_theta == 0.0f)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->rope_theta = %g; accepted: finite and > 0",
                       (double)p->rope_theta);
    if (p->rope_scaling == TK_ROPE_SCALING_NONE)
        return TK_SUCCESS;
    if (!finite_at_least(p->rope_factor, 1.0f))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "p->rope_factor = %g; accepted: finite and >= 1",
                       (double)p->rope_factor);
    TK_TRY(check_at_least(fn, "rope_original_max_position", p->rope_original_max_position, 1));
    if (p->rope_scaling == TK_ROPE_SCALING_LLAMA3) {
        if (!finite_at_least(p->rope_low_freq_factor, 0.0f) || p->rope_low_freq_factor == 0.0f ||
            !finite_at_least(p->rope_high_freq_factor, p->rope_low_freq_factor) ||
            p->rope_high_freq_factor == p->rope_low_freq_factor)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "p->rope_low_freq_factor = %g, p->rope_high_freq_factor = %g; accepted: "
                           "finite, 0 < low < high",
                           (double)p->rope_low_freq_factor, (double)p->rope_high_freq_factor);
        return TK_SUCCESS;
    }
    if (!finite_at_least(p->rope_beta_slow, 0.0f) || p->rope_beta_slow == 0.0f ||
        !finite_at_least(p->rope_beta_fast, p->rope_beta_slow) || p->rope_beta_fast == p->rope_beta_slow)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->rope_beta_fast = %g, p->rope_beta_slow = %g; accepted: finite, 0 < slow "
                       "< fast",
                       (double)p->rope_beta_fast, (double)p->rope_beta_slow);
    if (!finite_at_least(p->rope_attention_factor, 0.0f))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->rope_attention_factor = %g; accepted: finite and > 0, or 0 for 0.1 "
                       "ln(rope_factor) + 1",
                       (double)p->rope_attention_factor);
    return TK_SUCCESS;
}

/* RoPE's inverse frequencies of the rotary_dim / 2 pairs into inv_freq: theta^(-2i / rotary_dim)
 * with p's scaling (the formulas of include/tkern.h, as Hugging Face's rope_type "llama3" and
 * "yarn" compute them), in f64: the kernels form p * inv_freq in f64 as tk_rope_fwd does. What
 * the scalings derive from p alone (YaRN's ramp bounds) is computed once, not per pair. */
static void rope_inv_freqs(const tk_attention_kvcache_params *p, double *inv_freqs) {
    const double two_pi = 6.283185307179586, d = (double)p->rotary_dim;
    const double factor = p->rope_factor, context = (double)p->rope_original_max_position;
    double lo = 0.0, hi = 0.0; /* YaRN: dimensions below lo keep their frequency, above hi are
                                * interpolated by the factor */
    if (p->rope_scaling == TK_ROPE_SCALING_YARN) {
        const double per_rotation = d / (2.0 * log((double)p->rope_theta));
        lo = fmax(0.0, floor(per_rotation * log(context / ((double)p->rope_beta_fast * two_pi))));
        hi = fmin(d - 1.0, ceil(per_rotation * log(context / ((double)p->rope_beta_slow * two_pi))));
        if (hi == lo)
            hi += 0.001;
    }
    for (int64_t i = 0; i < p->rotary_dim / 2; i++) {
        const double inv_freq = pow((double)p->rope_theta, -2.0 * (double)i / d);
        double scaled = inv_freq;
        if (p->rope_scaling == TK_ROPE_SCALING_LLAMA3) {
            const double low = p->rope_low_freq_factor, high = p->rope_high_freq_factor;
            const double wavelen = two_pi / inv_freq;
            if (wavelen > context / low) {
                scaled = inv_freq / factor;
            } else if (wavelen >= context / high) {
                const double t = (context / wavelen - low) / (high - low);
                scaled = (1.0 - t) * inv_freq / factor + t * inv_freq;
            }
        } else if (p->rope_scaling == TK_ROPE_SCALING_YARN) {
            const double ramp = fmin(1.0, fmax(0.0, ((double)i - lo) / (hi - lo)));
            scaled = inv_freq * (1.0 - ramp) + inv_freq / factor * ramp;
        }
        inv_freqs[i] = scaled;
    }
}

/* Scalars, sizes and flags: everything tk_attention_kvcache_workspace_size needs too. */
static tk_status check_sizes(const char *fn, const tk_attention_kvcache_params *p) {
    TK_TRY(tk_check_dtype(fn, "p->dtype", p->dtype));
    if (p->dtype != TK_F16 && p->dtype != TK_BF16)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->dtype = %s is not supported; accepted: TK_F16, TK_BF16",
                       tk_dtype_name(p->dtype));
    TK_TRY(check_at_least(fn, "batch", p->batch, 0));
    TK_TRY(check_at_least(fn, "seqlen_q", p->seqlen_q, 1));
    TK_TRY(check_at_least(fn, "heads_q", p->heads_q, 1));
    TK_TRY(check_at_least(fn, "heads_kv", p->heads_kv, 1));
    if (p->heads_q % p->heads_kv != 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->heads_q = %lld is not a multiple of p->heads_kv = %lld (each key/value "
                       "head serves heads_q / heads_kv query heads)",
                       (long long)p->heads_q, (long long)p->heads_kv);
    TK_TRY(check_at_least(fn, "head_dim", p->head_dim, 1));
    if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "p->head_dim = %lld is not supported; accepted: 64, 128, 256",
                       (long long)p->head_dim);
    if (p->cu_seqlens_q)
        TK_TRY(check_at_least(fn, "total_q", p->total_q, 0));
    if (p->block_table) {
        TK_TRY(check_at_least(fn, "num_pages", p->num_pages, 1));
        TK_TRY(check_at_least(fn, "page_size", p->page_size, 1));
        TK_TRY(check_at_least(fn, "max_pages_per_seq", p->max_pages_per_seq, 1));
        if (p->block_table_stride != 0 && p->block_table_stride < p->max_pages_per_seq)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "p->block_table_stride = %lld is smaller than p->max_pages_per_seq = "
                           "%lld (0 means max_pages_per_seq)",
                           (long long)p->block_table_stride, (long long)p->max_pages_per_seq);
    } else {
        TK_TRY(check_at_least(fn, "max_seqlen_k", p->max_seqlen_k, 1));
    }
    if (!(p->softmax_scale >= 0.0f) || isinf(p->softmax_scale))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->softmax_scale = %g; accepted: a finite value > 0, or 0 for "
                       "1 / sqrt(head_dim)",
                       (double)p->softmax_scale);
    TK_TRY(check_flag(fn, "causal", p->causal));
    TK_TRY(check_at_least(fn, "window_left", p->window_left, -1));
    TK_TRY(check_at_least(fn, "window_right", p->window_right, -1));
    if (p->causal && p->window_right > 0)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->window_right = %lld contradicts p->causal = 1 (causal means "
                       "window_right = 0)",
                       (long long)p->window_right);
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->softcap = %g; accepted: 0 (off) or a finite value > 0",
                       (double)p->softcap);
    TK_TRY(check_flag(fn, "return_lse", p->return_lse));
    if (p->num_splits < 0 || p->num_splits > MAX_SPLITS)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->num_splits = %lld; accepted: 0 (the library chooses) or 1 .. %d",
                       (long long)p->num_splits, MAX_SPLITS);
    TK_TRY(check_rope(fn, p));
    /* Limits that keep the kernels' indices in int32. */
    const int64_t group = p->heads_q / p->heads_kv;
    TK_TRY(check_limit(fn, "p->seqlen_q", p->seqlen_q, MAX_SEQLEN));
    TK_TRY(check_limit(fn, "p->seqlen_q * heads_q / heads_kv (query rows of a GQA group)",
                       p->seqlen_q * (group < MAX_SEQLEN ? group : MAX_SEQLEN), MAX_SEQLEN));
    TK_TRY(check_limit(fn, "p->batch", p->batch, INT32_MAX - 1));
    TK_TRY(check_at_least(fn, "chunk_size", p->chunk_size, 0));
    TK_TRY(check_limit(fn, "p->chunk_size", p->chunk_size, MAX_SEQLEN));
    TK_TRY(check_limit(fn, "p->heads_q", p->heads_q, INT32_MAX));
    TK_TRY(check_limit(fn, "p->total_q", p->total_q, INT32_MAX));
    TK_TRY(check_limit(fn, "tokens (p->batch * p->seqlen_q)",
                       p->cu_seqlens_q ? 0 : p->batch * p->seqlen_q, INT32_MAX));
    if (p->block_table) {
        TK_TRY(check_limit(fn, "p->num_pages", p->num_pages, INT32_MAX));
        TK_TRY(check_limit(fn, "p->page_size", p->page_size, MAX_SEQLEN));
        TK_TRY(check_limit(fn, "p->max_pages_per_seq", p->max_pages_per_seq, MAX_SEQLEN));
        TK_TRY(check_limit(fn, "cache capacity (p->max_pages_per_seq * p->page_size)",
                           p->max_pages_per_seq * p->page_size, MAX_SEQLEN));
        if (p->batch > 0)
            TK_TRY(check_rows_span(fn, "(p->batch - 1) * p->block_table_stride", p->batch,
                                   p->block_table_stride ? p->block_table_stride : p->max_pages_per_seq,
                                   p->max_pages_per_seq));
    } else {
        TK_TRY(check_limit(fn, "p->max_seqlen_k", p->max_seqlen_k, MAX_SEQLEN));
    }
    return TK_SUCCESS;
}

/* The call's sizes, as the launchers take them (pointers and strides filled by prepare). */
static void fill_sizes(const tk_attention_kvcache_params *p, tk_attention_kvcache_call *call) {
    memset(call, 0, sizeof *call);
    call->dtype = (int)p->dtype;
    call->head_dim = (int)p->head_dim;
    call->batch = (int)p->batch;
    call->seqlen_q = (int)p->seqlen_q;
    call->total_q = p->cu_seqlens_q ? (int)p->total_q : 0;
    call->cu_seqlens_q = p->cu_seqlens_q;
    call->heads_q = (int)p->heads_q;
    call->heads_kv = (int)p->heads_kv;
    call->block_table = p->block_table;
    call->page_size = (int)(p->block_table ? p->page_size : p->max_seqlen_k);
    call->pages_per_seq = p->block_table ? (int)p->max_pages_per_seq : 1;
    call->num_pages = p->block_table ? (int)p->num_pages : (int)p->batch;
    call->num_splits = (int)p->num_splits;
    call->rotary_dim = (int)p->rotary_dim; /* the split plan depends on it (prefill_by_choice) */
}

/* Whether the call has work: sequences, and tokens to write. */
static bool has_work(const tk_attention_kvcache_params *p) {
    return p->batch > 0 && (!p->cu_seqlens_q || p->total_q > 0);
}

static tk_status check_no_overlap(const char *fn, const tensor *out, const tensor *in) {
    return tk_check_overlap(fn, out->name, out->ptr, out->bytes, in->name, in->ptr, in->bytes,
                            false);
}

/* A dense array of `count` int32 or f32 values as a tensor (for the overlap checks). */
static tensor flat(const char *name, const void *ptr, int64_t count) {
    tensor t = {name, name, ptr, {1, 1, 1, count}, {0, 0, 0, 1}, (size_t)count * 4};
    return t;
}

/* Validates *p (no CUDA call; the workspace but for its size, which depends on the device) and
 * resolves it into *call; *work = false for a no-op. */
static tk_status prepare(const char *fn, const tk_attention_kvcache_params *p,
                         tk_attention_kvcache_call *call, bool *work) {
    TK_TRY(check_sizes(fn, p));
    const size_t elem = tk_dtype_size(p->dtype);
    const bool varlen = p->cu_seqlens_q != NULL, paged = p->block_table != NULL;
    const int64_t d = p->head_dim;
    tensor q = {"p->q", "p->q_strides", p->q, {p->batch, p->seqlen_q, p->heads_q, d}, {0}, 0};
    tensor o = {"p->o", "p->o_strides", p->o, {p->batch, p->seqlen_q, p->heads_q, d}, {0}, 0};
    if (varlen) { /* [total_q, heads_q, head_dim]: the batch stride is not used */
        q.dims[0] = o.dims[0] = 1;
        q.dims[1] = o.dims[1] = p->total_q;
    }
    tensor k = {"p->k_cache", "p->k_strides", p->k_cache, {p->batch, p->max_seqlen_k, p->heads_kv, d}, {0}, 0};
    if (paged)
        k.dims[0] = p->num_pages, k.dims[1] = p->page_size;
    tensor v = k;
    v.name = "p->v_cache", v.strides_name = "p->v_strides", v.ptr = p->v_cache;
    const bool append = p->k_new != NULL || p->v_new != NULL;
    /* k_new and v_new: q's token layout with heads_kv (NULL pointers when not appending). */
    tensor kn = q;
    kn.name = "p->k_new", kn.strides_name = "p->k_new_strides", kn.ptr = p->k_new;
    kn.dims[2] = p->heads_kv;
    tensor vn = kn;
    vn.name = "p->v_new", vn.strides_name = "p->v_new_strides", vn.ptr = p->v_new;
    TK_TRY(resolve_tensor(fn, &q, p->q_strides, elem, false));
    TK_TRY(resolve_tensor(fn, &k, p->k_strides, elem, append));
    TK_TRY(resolve_tensor(fn, &v, p->v_strides, elem, append));
    TK_TRY(resolve_tensor(fn, &o, p->o_strides, elem, true));
    if (append) {
        TK_TRY(resolve_tensor(fn, &kn, p->k_new_strides, elem, false));
        TK_TRY(resolve_tensor(fn, &vn, p->v_new_strides, elem, false));
    }
    *work = has_work(p);
    if (!*work)
        return TK_SUCCESS;

    TK_TRY(tk_check_not_null(fn, "p->q", p->q));
    TK_TRY(tk_check_not_null(fn, "p->k_cache", p->k_cache));
    TK_TRY(tk_check_not_null(fn, "p->v_cache", p->v_cache));
    TK_TRY(tk_check_not_null(fn, "p->o", p->o));
    TK_TRY(tk_check_not_null(fn, "p->seqlens_k", p->seqlens_k));
    if (p->return_lse && p->lse == NULL)
        return tk_fail(TK_ERROR_NULL_POINTER, fn,
                       "p->lse is NULL but p->return_lse = 1; pass a device buffer of heads_q * "
                       "tokens floats");
    if (p->rotary_dim > 0 && (p->rope_cos == NULL) != (p->rope_sin == NULL))
        return tk_fail(TK_ERROR_NULL_POINTER, fn,
                       "%s is NULL but %s is set; a RoPE cache takes both (or neither)",
                       p->rope_cos ? "p->rope_sin" : "p->rope_cos", p->rope_cos ? "p->rope_cos" : "p->rope_sin");
    if (append && (p->k_new == NULL || p->v_new == NULL))
        return tk_fail(TK_ERROR_NULL_POINTER, fn,
                       "%s is NULL but %s is set; appending takes both (or neither)",
                       p->k_new ? "p->v_new" : "p->k_new", p->k_new ? "p->k_new" : "p->v_new");
    TK_TRY(check_vector_alignment(fn, &q, elem));
    TK_TRY(check_vector_alignment(fn, &k, elem));
    TK_TRY(check_vector_alignment(fn, &v, elem));
    TK_TRY(check_vector_alignment(fn, &o, elem));
    if (append) {
        TK_TRY(check_vector_alignment(fn, &kn, elem));
        TK_TRY(check_vector_alignment(fn, &vn, elem));
    }
    const int64_t tokens = varlen ? p->total_q : p->batch * p->seqlen_q;
    const int64_t bt_stride = p->block_table_stride ? p->block_table_stride : p->max_pages_per_seq;
    const tensor lse = flat("p->lse", p->return_lse ? p->lse : NULL, tokens * p->heads_q);
    const tensor alibi = flat("p->alibi_slopes", p->alibi_slopes, p->heads_q);
    const tensor sinks = flat("p->sinks", p->sinks, p->heads_q);
    const tensor seqlens = flat("p->seqlens_k", p->seqlens_k, p->batch);
    const tensor cu = flat("p->cu_seqlens_q", p->cu_seqlens_q, p->batch + 1);
    /* The block table's and the RoPE cache's spans fit int64 (check_sizes). */
    const tensor table = flat("p->block_table", p->block_table,
                              paged ? (p->batch - 1) * bt_stride + p->max_pages_per_seq : 0);
    const bool rope_cache = p->rotary_dim > 0 && p->rope_cos != NULL;
    const int64_t rope_stride = p->rope_cache_row_stride ? p->rope_cache_row_stride : p->rotary_dim / 2;
    const int64_t rope_floats = rope_cache ? (p->rope_max_position - 1) * rope_stride + p->rotary_dim / 2 : 0;
    const tensor rope_cos = flat("p->rope_cos", rope_cache ? p->rope_cos : NULL, rope_floats);
    const tensor rope_sin = flat("p->rope_sin", rope_cache ? p->rope_sin : NULL, rope_floats);
    const tensor *small[] = {&lse, &alibi, &sinks, &seqlens, &cu, &table, &rope_cos, &rope_sin};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        TK_TRY(tk_check_aligned(fn, small[i]->name, small[i]->ptr, 4));
    const tensor *inputs[] = {&q, &k, &v, &alibi, &sinks, &seqlens, &cu, &table, &kn, &vn, &rope_cos, &rope_sin};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        TK_TRY(check_no_overlap(fn, &o, inputs[i]));
        if (lse.ptr)
            TK_TRY(check_no_overlap(fn, &lse, inputs[i]));
    }
    TK_TRY(check_no_overlap(fn, &o, &lse));
    if (append) { /* the caches are written: they meet nothing else, not even each other */
        const tensor *others[] = {&q, &alibi, &sinks, &seqlens, &cu, &table, &kn, &vn, &o, &lse, &rope_cos, &rope_sin};
        for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
            TK_TRY(check_no_overlap(fn, &k, others[i]));
            TK_TRY(check_no_overlap(fn, &v, others[i]));
        }
        TK_TRY(check_no_overlap(fn, &k, &v));
    }
    /* A given workspace is checked whole, workspace_bytes from its start: the bytes the call
     * needs depend on the device (checked against workspace_bytes once it is known) and lie
     * within these. */
    if (p->workspace) {
        TK_TRY(tk_check_aligned(fn, "p->workspace", p->workspace, 16));
        if (p->workspace_bytes > UINTPTR_MAX - (uintptr_t)p->workspace)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "p->workspace_bytes = %zu runs past the end of the address space",
                           p->workspace_bytes);
        const tensor ws = {"p->workspace", "p->workspace", p->workspace, {0}, {0}, p->workspace_bytes};
        const tensor *all[] = {&q, &k, &v, &o, &lse, &alibi, &sinks, &seqlens, &cu, &table, &kn, &vn,
                               &rope_cos, &rope_sin};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            TK_TRY(check_no_overlap(fn, &ws, all[i]));
    }

    fill_sizes(p, call);
    call->q = p->q;
    call->k = p->k_cache;
    call->v = p->v_cache;
    call->o = p->o;
    call->k_new = append ? p->k_new : NULL;
    call->v_new = append ? p->v_new : NULL;
    call->lse = lse.ptr ? p->lse : NULL;
    call->alibi_slopes = p->alibi_slopes;
    call->sinks = p->sinks;
    call->chunk = (int)p->chunk_size;
    call->seqlens_k = p->seqlens_k;
    call->block_table_stride = bt_stride;
    for (int i = 0; i < 3; i++) {
        call->q_stride[i] = q.strides[i];
        call->k_stride[i] = k.strides[i];
        call->v_stride[i] = v.strides[i];
        call->o_stride[i] = o.strides[i];
        call->k_new_stride[i] = kn.strides[i];
        call->v_new_stride[i] = vn.strides[i];
    }
    call->window_left = p->window_left >= MAX_SEQLEN ? -1 : (int)p->window_left;
    const int64_t right = p->causal ? 0 : p->window_right;
    call->window_right = right >= MAX_SEQLEN ? -1 : (int)right;
    call->scale = p->softmax_scale > 0.0f ? p->softmax_scale : 1.0f / sqrtf((float)p->head_dim);
    call->softcap = p->softcap;
    call->workspace = p->workspace;
    call->rope_style = (int)p->rope_style;
    call->rope_cos = rope_cache ? p->rope_cos : NULL;
    call->rope_sin = rope_cache ? p->rope_sin : NULL;
    call->rope_cache_row_stride = rope_stride;
    call->rope_max_position = p->rope_max_position;
    const bool yarn = !rope_cache && p->rope_scaling == TK_ROPE_SCALING_YARN;
    call->rope_attention_factor = !yarn                             ? 1.0f
                                  : p->rope_attention_factor > 0.0f ? p->rope_attention_factor
                                  : p->rope_factor > 1.0f           ? 0.1f * logf(p->rope_factor) + 1.0f
                                                                    : 1.0f;
    if (p->rotary_dim > 0 && !rope_cache)
        rope_inv_freqs(p, call->rope_inv_freq);
    return TK_SUCCESS;
}

/* The most splits a sequence gets on this device, the workspace they need and the grid bound
 * they make. */
static tk_status plan_splits(const char *fn, tk_attention_kvcache_call *call, const tk_device *dev,
                             size_t *workspace_bytes) {
    if (prefill_by_choice(call, dev))
        call->num_splits = 1;
    const int splits = tk_attention_kvcache_splits(call, dev);
    /* Grid sizes in double: their int64 products could overflow for absurd (valid) sizes. The
     * grid holds at most `splits` items per sequence. */
    const double group = (double)(call->heads_q / call->heads_kv);
    const double chunks = ceil((double)call->seqlen_q * group / QUERY_ROWS_PER_CTA);
    const double blocks = chunks * call->batch * call->heads_kv * splits;
    if (blocks > INT32_MAX)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "batch * heads_kv * ceil(seqlen_q * heads_q / heads_kv / 16) * splits = "
                       "%.0f exceeds the grid limit 2^31 - 1",
                       blocks);
    const double append_blocks =
        (double)call->batch * call->seqlen_q * call->heads_kv * (call->head_dim / 8) / APPEND_THREADS;
    if (call->k_new && append_blocks > INT32_MAX)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "batch * seqlen_q * heads_kv * head_dim / 8 = %.0f chunks to append exceed "
                       "the grid limit",
                       append_blocks * APPEND_THREADS);
    const double merged_rows = (double)tk_attention_kvcache_tokens(call) * call->heads_q;
    if (splits > 1 && merged_rows > INT32_MAX)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "tokens * heads_q = %.0f rows to merge across splits exceed the grid limit "
                       "2^31 - 1; pass num_splits = 1",
                       merged_rows);
    *workspace_bytes = tk_attention_kvcache_workspace_bytes(call, splits);
    return TK_SUCCESS;
}

/* The workspace against the bytes the call needs on the device (prepare checked the rest). */
static tk_status check_workspace_size(const char *fn, const tk_attention_kvcache_params *p,
                                      size_t needed) {
    if (needed == 0)
        return TK_SUCCESS;
    if (p->workspace == NULL)
        return tk_fail(TK_ERROR_NULL_POINTER, fn,
                       "p->workspace is NULL but the call runs with splits and needs %zu bytes "
                       "(tk_attention_kvcache_workspace_size)",
                       needed);
    if (p->workspace_bytes < needed)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "p->workspace_bytes = %zu is smaller than the %zu bytes the call needs "
                       "(tk_attention_kvcache_workspace_size)",
                       p->workspace_bytes, needed);
    return TK_SUCCESS;
}

/* The caller's *given into *local by the params rule (tk_read_params). */
static tk_status read_params(const char *fn, const tk_attention_kvcache_params *given,
                             tk_attention_kvcache_params *local) {
    return TK_READ_PARAMS(fn, "p", given, local, tk_attention_kvcache_params,
                          TK_ATTENTION_KVCACHE_PARAMS_INIT, KVCACHE_PARAMS_SIZE_0_1);
}

/* Everything but the launch: the caller's params read and validated, the device, the splits,
 * the workspace and the variant. */
static tk_status plan(const char *fn, const tk_attention_kvcache_params *given,
                      tk_attention_kvcache_call *call, const tk_device **dev,
                      const tk_variant **v, bool *work) {
    tk_attention_kvcache_params p;
    TK_TRY(read_params(fn, given, &p));
    TK_TRY(prepare(fn, &p, call, work));
    if (!*work)
        return TK_SUCCESS;
    TK_TRY(tk_current_device(fn, dev));
    size_t needed = 0;
    TK_TRY(plan_splits(fn, call, *dev, &needed));
    TK_TRY(check_workspace_size(fn, &p, needed));
    return tk_select_variant(fn, &tk_op_attention_kvcache, *dev, call, v);
}

TK_API tk_status tk_attention_kvcache_fwd(const tk_attention_kvcache_params *given,
                                          tk_stream_t stream) {
    static const char fn[] = "tk_attention_kvcache_fwd";
    tk_begin_call();
    tk_attention_kvcache_call call;
    const tk_device *dev = NULL;
    const tk_variant *v = NULL;
    bool work = false;
    TK_TRY(plan(fn, given, &call, &dev, &v, &work));
    if (!work)
        return TK_SUCCESS;
    return tk_launched(fn, v, v->launch(&call, dev, stream));
}

TK_API tk_status tk_attention_kvcache_workspace_size(const tk_attention_kvcache_params *given,
                                                     size_t *bytes) {
    static const char fn[] = "tk_attention_kvcache_workspace_size";
    tk_begin_call();
    TK_TRY(tk_check_not_null(fn, "bytes", bytes));
    tk_attention_kvcache_params p;
    TK_TRY(read_params(fn, given, &p));
    TK_TRY(check_sizes(fn, &p));
    size_t needed = 0;
    if (has_work(&p)) {
        tk_attention_kvcache_call call;
        fill_sizes(&p, &call);
        const tk_device *dev;
        TK_TRY(tk_current_device(fn, &dev));
        TK_TRY(plan_splits(fn, &call, dev, &needed));
    }
    *bytes = needed; /* only on success: a failure leaves *bytes as it was */
    return TK_SUCCESS;
}

TK_API tk_status tk_attention_kvcache_supported(const tk_attention_kvcache_params *given,
                                                const char **variant_name) {
    static const char fn[] = "tk_attention_kvcache_supported";
    tk_begin_call();
    if (variant_name)
        *variant_name = NULL;
    tk_attention_kvcache_call call;
    const tk_device *dev = NULL;
    const tk_variant *v = NULL;
    bool work = false;
    TK_TRY(plan(fn, given, &call, &dev, &v, &work));
    if (variant_name)
        *variant_name = work ? v->name : "";
    return TK_SUCCESS;
}
