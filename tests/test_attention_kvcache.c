/* Attention over a KV cache: bad input on the host (runs everywhere), then contiguous and paged
 * caches (every page size, pages shuffled), sequence lengths 0, 1 and page boundaries +-1,
 * variable-length queries with empty sequences, windows shorter and longer than the cache,
 * every split count (more splits than pages included), GQA groups 1 to 8, head dims 64, 128,
 * 256, softcap, ALiBi and lse against the fp64 reference on the GPU. Accuracy follows
 * FlashAttention's rule, as tests/test_attention.c: the largest error of o at most twice that
 * of a naive same-precision implementation plus twice the representation error near 0.3; lse
 * is f32 and held to the f32 tolerance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/attention_kvcache_ref.h"

/* ------------------------------------------------------------------ bad input (host) ---- */

/* Fake "device" buffers: host memory with a sentinel; validation must reject before any use.
 * A valid call: q [2, 1, 4, 64] at in_buf, a paged cache of 4 pages of 16 keys, 2 heads, for k
 * and v, block table [2, 2], seqlens_k [2], cu_seqlens_q [3], alibi [4] after them; o [2, 1, 4,
 * 64] at out_buf, lse [2, 4, 1] after it. */
static unsigned char in_buf[65536] __attribute__((aligned(16)));
static unsigned char out_buf[8192] __attribute__((aligned(16)));
enum { Q_AT = 0, K_AT = 1024, V_AT = 17408, TABLE_AT = 33792, SEQLENS_AT = 33824,
       CU_AT = 33840, ALIBI_AT = 33856, SINKS_AT = 33920, KNEW_AT = 34816, VNEW_AT = 35840,
       ROPE_AT = 36864, LSE_AT = 1024 };

static void reset_buffers(void) {
    tk_fill_sentinel(in_buf, sizeof in_buf);
    tk_fill_sentinel(out_buf, sizeof out_buf);
}

static tk_attention_kvcache_params host_params(void) {
    tk_attention_kvcache_params p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.batch = 2;
    p.seqlen_q = 1;
    p.heads_q = 4;
    p.heads_kv = 2;
    p.head_dim = 64;
    p.q = in_buf + Q_AT;
    p.k_cache = in_buf + K_AT;
    p.v_cache = in_buf + V_AT;
    p.block_table = (const int32_t *)(in_buf + TABLE_AT);
    p.num_pages = 4;
    p.page_size = 16;
    p.max_pages_per_seq = 2;
    p.seqlens_k = (const int32_t *)(in_buf + SEQLENS_AT);
    p.alibi_slopes = (const float *)(in_buf + ALIBI_AT);
    p.o = out_buf;
    p.return_lse = 1;
    p.lse = (float *)(out_buf + LSE_AT);
    p.num_splits = 1;
    return p;
}

/* Rejected by tk_attention_kvcache_fwd and tk_attention_kvcache_supported alike (and by
 * tk_attention_kvcache_workspace_size when the fault is in a size); nothing written. */
static void expect_rejected(const tk_attention_kvcache_params *p, tk_status status,
                            const char *needle, bool sizes) {
    reset_buffers();
    TK_EXPECT_STATUS(tk_attention_kvcache_fwd(p, NULL), status, needle);
    const char *name = "untouched";
    TK_EXPECT_STATUS(tk_attention_kvcache_supported(p, &name), status, needle);
    cr_assert_null(name, "%s: tk_attention_kvcache_supported named a variant on failure", needle);
    if (sizes) {
        size_t bytes;
        tk_fill_sentinel(&bytes, sizeof bytes);
        TK_EXPECT_STATUS(tk_attention_kvcache_workspace_size(p, &bytes), status, needle);
        cr_assert(tk_is_sentinel(&bytes, sizeof bytes), "%s: the workspace size was written on failure",
                  needle);
    }
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s: an output was written", needle);
    cr_assert(tk_is_sentinel(in_buf, sizeof in_buf), "%s: an input was written", needle);
}

#define REJECT(field_assignment, status, needle, sizes) \
    do {                                                \
        tk_attention_kvcache_params p_ = ok;            \
        p_.field_assignment;                            \
        expect_rejected(&p_, status, needle, sizes);    \
    } while (0)

Test(attention_kvcache_args, rejects_bad_arguments) {
    const tk_attention_kvcache_params ok = host_params();
    expect_rejected(NULL, TK_ERROR_NULL_POINTER, "'p'", true);
    REJECT(size = 8, TK_ERROR_INVALID_VALUE, "p->size", true);
    REJECT(dtype = TK_F32, TK_ERROR_NOT_SUPPORTED, "p->dtype", true);
    REJECT(dtype = (tk_dtype)9, TK_ERROR_INVALID_VALUE, "p->dtype", true);
    REJECT(batch = -1, TK_ERROR_INVALID_VALUE, "p->batch", true);
    REJECT(seqlen_q = 0, TK_ERROR_INVALID_VALUE, "p->seqlen_q", true);
    REJECT(heads_q = 0, TK_ERROR_INVALID_VALUE, "p->heads_q", true);
    REJECT(heads_kv = 3, TK_ERROR_INVALID_VALUE, "p->heads_q = 4 is not a multiple of p->heads_kv", true);
    REJECT(head_dim = 80, TK_ERROR_NOT_SUPPORTED, "accepted: 64, 128, 256", true);
    REJECT(head_dim = 0, TK_ERROR_INVALID_VALUE, "p->head_dim", true);
    REJECT(num_pages = 0, TK_ERROR_INVALID_VALUE, "p->num_pages", true);
    REJECT(page_size = 0, TK_ERROR_INVALID_VALUE, "p->page_size", true);
    REJECT(max_pages_per_seq = 0, TK_ERROR_INVALID_VALUE, "p->max_pages_per_seq", true);
    REJECT(block_table_stride = 1, TK_ERROR_INVALID_VALUE, "p->block_table_stride", true);
    /* A table whose last row lies past int64 in bytes, then in elements. */
    REJECT(block_table_stride = INT64_MAX / 4, TK_ERROR_INVALID_VALUE,
           "(p->batch - 1) * p->block_table_stride = 2305843009213693951: the array's byte size overflows", true);
    {
        tk_attention_kvcache_params p = ok;
        p.batch = 4, p.block_table_stride = INT64_MAX / 2;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE,
                        "(p->batch - 1) * p->block_table_stride = 3 * 4611686018427387903 overflows int64", true);
    }
    REJECT(page_size = INT64_C(1) << 31, TK_ERROR_NOT_SUPPORTED, "p->page_size", true);
    REJECT(max_pages_per_seq = INT64_C(1) << 27, TK_ERROR_NOT_SUPPORTED, "cache capacity", true);
    REJECT(seqlen_q = (INT64_C(1) << 30) + 1, TK_ERROR_NOT_SUPPORTED, "p->seqlen_q", true);
    REJECT(num_splits = -1, TK_ERROR_INVALID_VALUE, "p->num_splits", true);
    REJECT(num_splits = 1025, TK_ERROR_INVALID_VALUE, "p->num_splits", true);
    REJECT(softmax_scale = NAN, TK_ERROR_INVALID_VALUE, "p->softmax_scale", true);
    REJECT(softcap = -1.0f, TK_ERROR_INVALID_VALUE, "p->softcap", true);
    REJECT(causal = 2, TK_ERROR_INVALID_VALUE, "p->causal", true);
    REJECT(window_left = -2, TK_ERROR_INVALID_VALUE, "p->window_left", true);
    REJECT(window_right = -3, TK_ERROR_INVALID_VALUE, "p->window_right", true);
    REJECT(return_lse = 3, TK_ERROR_INVALID_VALUE, "p->return_lse", true);
    REJECT(chunk_size = -1, TK_ERROR_INVALID_VALUE, "p->chunk_size", true);
    REJECT(chunk_size = (INT64_C(1) << 30) + 1, TK_ERROR_NOT_SUPPORTED, "p->chunk_size", true);
    REJECT(sinks = (const float *)(in_buf + SINKS_AT + 2), TK_ERROR_MISALIGNED, "'p->sinks'", false);
    {
        tk_attention_kvcache_params p = ok; /* lse written over the sinks it reads */
        p.sinks = (const float *)(in_buf + SINKS_AT);
        p.lse = (float *)(in_buf + SINKS_AT);
        expect_rejected(&p, TK_ERROR_OVERLAP, "'p->lse' overlaps 'p->sinks'", false);
    }
    {
        tk_attention_kvcache_params p = ok;
        p.causal = 1, p.window_right = 2;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "contradicts p->causal", true);
        p = ok; /* a contiguous cache needs its capacity */
        p.block_table = NULL;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->max_seqlen_k", true);
        p = ok; /* varlen queries need their token count */
        p.cu_seqlens_q = (const int32_t *)(in_buf + CU_AT), p.total_q = -1;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->total_q", true);
    }
    REJECT(q = NULL, TK_ERROR_NULL_POINTER, "'p->q'", false);
    REJECT(k_cache = NULL, TK_ERROR_NULL_POINTER, "'p->k_cache'", false);
    REJECT(v_cache = NULL, TK_ERROR_NULL_POINTER, "'p->v_cache'", false);
    REJECT(o = NULL, TK_ERROR_NULL_POINTER, "'p->o'", false);
    REJECT(seqlens_k = NULL, TK_ERROR_NULL_POINTER, "'p->seqlens_k'", false);
    REJECT(lse = NULL, TK_ERROR_NULL_POINTER, "p->lse is NULL but p->return_lse = 1", false);
    REJECT(q_strides[3] = 2, TK_ERROR_NOT_SUPPORTED, "p->q_strides[3]", false);
    REJECT(k_strides[1] = -64, TK_ERROR_INVALID_VALUE, "p->k_strides[1]", false);
    REJECT(q = in_buf + 2, TK_ERROR_MISALIGNED, "'p->q'", false);
    REJECT(v_cache = in_buf + V_AT + 8, TK_ERROR_MISALIGNED, "'p->v_cache'", false);
    REJECT(o = out_buf + 4, TK_ERROR_MISALIGNED, "'p->o'", false);
    REJECT(block_table = (const int32_t *)(in_buf + TABLE_AT + 2), TK_ERROR_MISALIGNED,
           "'p->block_table'", false);
    REJECT(seqlens_k = (const int32_t *)(in_buf + SEQLENS_AT + 1), TK_ERROR_MISALIGNED,
           "'p->seqlens_k'", false);
    REJECT(lse = (float *)(out_buf + LSE_AT + 2), TK_ERROR_MISALIGNED, "'p->lse'", false);
    {
        tk_attention_kvcache_params p = ok; /* a page stride of 68 elements */
        p.k_strides[0] = 16 * 136, p.k_strides[1] = 136, p.k_strides[2] = 68, p.k_strides[3] = 1;
        expect_rejected(&p, TK_ERROR_MISALIGNED, "p->k_strides[2]", false);
        p = ok; /* every row of o at one address */
        p.o_strides[0] = 0, p.o_strides[1] = 0, p.o_strides[2] = 0, p.o_strides[3] = 1;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->o_strides", false);
        p = ok; /* a page stride whose extent overflows */
        p.k_strides[0] = INT64_MAX / 2, p.k_strides[1] = 128, p.k_strides[2] = 64, p.k_strides[3] = 1;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "overflows", false);
    }
    REJECT(o = in_buf + K_AT, TK_ERROR_OVERLAP, "'p->o' overlaps 'p->k_cache'", false);
    REJECT(lse = (float *)(in_buf + TABLE_AT), TK_ERROR_OVERLAP, "'p->lse' overlaps 'p->block_table'", false);
    REJECT(lse = (float *)(in_buf + SEQLENS_AT), TK_ERROR_OVERLAP, "'p->lse' overlaps 'p->seqlens_k'", false);
    REJECT(lse = (float *)(out_buf + 256), TK_ERROR_OVERLAP, "'p->o' overlaps 'p->lse'", false);
    /* Appending: both arrays, aligned, and the caches (now written) apart from everything. */
    tk_attention_kvcache_params app = ok;
    app.k_new = in_buf + KNEW_AT, app.v_new = in_buf + VNEW_AT;
    {
        tk_attention_kvcache_params p = app;
        p.v_new = NULL;
        expect_rejected(&p, TK_ERROR_NULL_POINTER, "p->v_new is NULL but p->k_new is set", false);
        p = app;
        p.k_new = NULL;
        expect_rejected(&p, TK_ERROR_NULL_POINTER, "p->k_new is NULL but p->v_new is set", false);
        p = app;
        p.k_new = in_buf + KNEW_AT + 4;
        expect_rejected(&p, TK_ERROR_MISALIGNED, "'p->k_new'", false);
        p = app;
        p.v_new_strides[3] = 2;
        expect_rejected(&p, TK_ERROR_NOT_SUPPORTED, "p->v_new_strides[3]", false);
        p = app;
        p.k_new = in_buf + K_AT + 512;
        expect_rejected(&p, TK_ERROR_OVERLAP, "'p->k_cache' overlaps 'p->k_new'", false);
        p = app;
        p.v_cache = p.k_cache;
        expect_rejected(&p, TK_ERROR_OVERLAP, "'p->k_cache' overlaps 'p->v_cache'", false);
        p = app; /* a cache written twice through its own strides */
        p.k_strides[0] = 0, p.k_strides[1] = 128, p.k_strides[2] = 64, p.k_strides[3] = 1;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->k_strides", false);
    }
}

/* RoPE's fields: each out-of-range value named, a scaling refused with a cache, a cache's
 * pointers, alignment and overlaps (a cos/sin table of 4 positions x 32 floats at ROPE_AT). */
Test(attention_kvcache_args, rejects_bad_rope_arguments) {
    tk_attention_kvcache_params ok = host_params();
    ok.rotary_dim = 64;
    REJECT(rotary_dim = -16, TK_ERROR_INVALID_VALUE, "p->rotary_dim", true);
    REJECT(rotary_dim = 80, TK_ERROR_INVALID_VALUE, "p->rotary_dim", true);
    REJECT(rotary_dim = 24, TK_ERROR_NOT_SUPPORTED, "p->rotary_dim = 24 is not a multiple of 16", true);
    REJECT(rope_style = (tk_rope_style)2, TK_ERROR_INVALID_VALUE, "p->rope_style", true);
    REJECT(rope_theta = 0.0f, TK_ERROR_INVALID_VALUE, "p->rope_theta", true);
    REJECT(rope_theta = INFINITY, TK_ERROR_INVALID_VALUE, "p->rope_theta", true);
    REJECT(rope_scaling = (tk_rope_scaling)3, TK_ERROR_INVALID_VALUE, "p->rope_scaling", true);
    tk_attention_kvcache_params llama = ok;
    llama.rope_scaling = TK_ROPE_SCALING_LLAMA3, llama.rope_factor = 8.0f;
    tk_attention_kvcache_params cached = ok;
    cached.rope_cos = (const float *)(in_buf + ROPE_AT);
    cached.rope_sin = (const float *)(in_buf + ROPE_AT + 512);
    cached.rope_max_position = 4;
    {
        const tk_attention_kvcache_params ok = llama; /* REJECT's base */
        REJECT(rope_factor = 0.5f, TK_ERROR_INVALID_VALUE, "p->rope_factor", true);
        REJECT(rope_original_max_position = 0, TK_ERROR_INVALID_VALUE, "p->rope_original_max_position", true);
        REJECT(rope_low_freq_factor = 0.0f, TK_ERROR_INVALID_VALUE, "p->rope_low_freq_factor", true);
        REJECT(rope_high_freq_factor = 1.0f, TK_ERROR_INVALID_VALUE, "p->rope_high_freq_factor", true);
    }
    llama.rope_scaling = TK_ROPE_SCALING_YARN;
    {
        const tk_attention_kvcache_params ok = llama;
        REJECT(rope_beta_fast = 0.5f, TK_ERROR_INVALID_VALUE, "p->rope_beta_fast", true);
        REJECT(rope_attention_factor = -1.0f, TK_ERROR_INVALID_VALUE, "p->rope_attention_factor", true);
    }
    {
        const tk_attention_kvcache_params ok = cached;
        REJECT(rope_sin = NULL, TK_ERROR_NULL_POINTER, "p->rope_sin is NULL but p->rope_cos is set", false);
        REJECT(rope_scaling = TK_ROPE_SCALING_YARN, TK_ERROR_NOT_SUPPORTED,
               "p->rope_scaling = 2 with a cos/sin cache", true);
        REJECT(rope_max_position = 0, TK_ERROR_INVALID_VALUE, "p->rope_max_position", true);
        REJECT(rope_cache_row_stride = 31, TK_ERROR_INVALID_VALUE, "p->rope_cache_row_stride", true);
        /* A cache whose last row lies past int64 in elements, then in bytes. */
        REJECT(rope_cache_row_stride = INT64_MAX / 2, TK_ERROR_INVALID_VALUE,
               "(p->rope_max_position - 1) * p->rope_cache_row_stride = 3 * 4611686018427387903 overflows", true);
        REJECT(rope_max_position = INT64_C(1) << 58, TK_ERROR_INVALID_VALUE,
               "(p->rope_max_position - 1) * p->rope_cache_row_stride = 9223372036854775776: the array's "
               "byte size overflows", true);
        REJECT(rope_cos = (const float *)(in_buf + ROPE_AT + 2), TK_ERROR_MISALIGNED, "'p->rope_cos'", false);
        REJECT(o = (void *)(in_buf + ROPE_AT + 512), TK_ERROR_OVERLAP, "'p->o' overlaps 'p->rope_sin'", false);
    }
}

/* The workspace, checked before the device is looked up (only its size needs the device), whether
 * or not the call needs one: 16-byte aligned, within the address space, and its workspace_bytes
 * apart from every buffer the call reads or writes (a call here with every one of them). */
Test(attention_kvcache_args, rejects_bad_workspace) {
    tk_attention_kvcache_params ok = host_params();
    ok.cu_seqlens_q = (const int32_t *)(in_buf + CU_AT), ok.total_q = 2;
    ok.sinks = (const float *)(in_buf + SINKS_AT);
    ok.k_new = in_buf + KNEW_AT, ok.v_new = in_buf + VNEW_AT;
    ok.rotary_dim = 64;
    ok.rope_cos = (const float *)(in_buf + ROPE_AT);
    ok.rope_sin = (const float *)(in_buf + ROPE_AT + 512);
    ok.rope_max_position = 4;
    ok.workspace = out_buf + 4096, ok.workspace_bytes = 4096;
    if (!tk_test_have_device()) { /* the valid call gets as far as the device */
        reset_buffers();
        TK_EXPECT_STATUS(tk_attention_kvcache_fwd(&ok, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    }
    REJECT(workspace = out_buf + 4096 + 8, TK_ERROR_MISALIGNED, "'p->workspace'", false);
    REJECT(workspace_bytes = SIZE_MAX, TK_ERROR_INVALID_VALUE,
           "p->workspace_bytes = 18446744073709551615 runs past the end of the address space", false);
    const struct {
        const void *at;
        const char *name;
    } buffers[] = {
        {in_buf + Q_AT, "p->q"}, {in_buf + K_AT, "p->k_cache"}, {in_buf + V_AT, "p->v_cache"},
        {out_buf, "p->o"}, {out_buf + LSE_AT, "p->lse"}, {in_buf + ALIBI_AT, "p->alibi_slopes"},
        {in_buf + SINKS_AT, "p->sinks"}, {in_buf + SEQLENS_AT, "p->seqlens_k"},
        {in_buf + CU_AT, "p->cu_seqlens_q"}, {in_buf + TABLE_AT, "p->block_table"},
        {in_buf + KNEW_AT, "p->k_new"}, {in_buf + VNEW_AT, "p->v_new"},
        {in_buf + ROPE_AT, "p->rope_cos"}, {in_buf + ROPE_AT + 512, "p->rope_sin"},
    };
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) {
        tk_attention_kvcache_params p = ok;
        p.workspace = (void *)(uintptr_t)buffers[i].at, p.workspace_bytes = 16;
        char needle[64];
        snprintf(needle, sizeof needle, "'p->workspace' overlaps '%s'", buffers[i].name);
        expect_rejected(&p, TK_ERROR_OVERLAP, needle, false);
    }
    /* Its workspace_bytes, not the bytes the call needs (none here), carry it into k_new. */
    tk_attention_kvcache_params p = ok;
    p.workspace = in_buf + KNEW_AT - 512, p.workspace_bytes = 1024;
    expect_rejected(&p, TK_ERROR_OVERLAP, "'p->workspace' overlaps 'p->k_new'", false);
}

/* The params size rule (tk_read_params): older sizes than the first layout and unknown non-zero
 * tails are rejected naming the size; a longer struct with a zero tail is accepted. */
Test(attention_kvcache_args, params_size_rule) {
    static unsigned char params_buf[sizeof(tk_attention_kvcache_params) + 64] __attribute__((aligned(16)));
    const tk_attention_kvcache_params ok = host_params();
    const size_t n = sizeof ok;
    const size_t first_layout = 448; /* before the RoPE fields (src/attention_kvcache.c) */
    const struct { size_t size; int tail_at; } rejected[] = {{0, -1}, {first_layout - 1, -1}, {n + 1, 0}, {n + 64, 63}};
    for (size_t i = 0; i < sizeof rejected / sizeof rejected[0]; i++) {
        memset(params_buf, 0, sizeof params_buf);
        memcpy(params_buf, &ok, n);
        memcpy(params_buf, &rejected[i].size, sizeof(size_t));
        if (rejected[i].tail_at >= 0)
            params_buf[n + (size_t)rejected[i].tail_at] = 0x7f;
        expect_rejected((const tk_attention_kvcache_params *)params_buf, TK_ERROR_INVALID_VALUE,
                        "p->size", true);
    }
    if (tk_test_have_device())
        return; /* host buffers cannot stand in for a valid call on a GPU machine */
    /* A longer struct with a zero tail, and the first layout (a caller built before RoPE, whose
     * missing fields read as zero: no RoPE), get as far as the device. */
    const size_t accepted[] = {n + 64, first_layout};
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        memset(params_buf, 0, sizeof params_buf);
        memcpy(params_buf, &ok, accepted[i] < n ? accepted[i] : n);
        memcpy(params_buf, &accepted[i], sizeof accepted[i]);
        reset_buffers();
        TK_EXPECT_STATUS(tk_attention_kvcache_fwd((const tk_attention_kvcache_params *)params_buf, NULL),
                         TK_ERROR_NO_DEVICE, "no usable CUDA device");
        cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
    }
}

Test(attention_kvcache_args, empty_calls_are_noops) {
    tk_attention_kvcache_params p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    p.seqlen_q = 1;
    p.heads_q = p.heads_kv = 1;
    p.head_dim = 128;
    p.max_seqlen_k = 16;
    TK_EXPECT_STATUS(tk_attention_kvcache_fwd(&p, NULL), TK_SUCCESS, "");
    const char *name = NULL;
    TK_EXPECT_STATUS(tk_attention_kvcache_supported(&p, &name), TK_SUCCESS, "");
    cr_assert_str_eq(name, "");
    size_t bytes = 7;
    TK_EXPECT_STATUS(tk_attention_kvcache_workspace_size(&p, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, 0);
    /* Sequences, but no query token. */
    p.batch = 3;
    p.cu_seqlens_q = (const int32_t *)(in_buf + CU_AT);
    p.total_q = 0;
    TK_EXPECT_STATUS(tk_attention_kvcache_fwd(&p, NULL), TK_SUCCESS, "");
    cr_assert_str_empty(tk_last_error());
}

Test(attention_kvcache_args, no_device_is_reported) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; this test covers machines without one");
    const tk_attention_kvcache_params ok = host_params();
    reset_buffers();
    TK_EXPECT_STATUS(tk_attention_kvcache_fwd(&ok, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    size_t bytes = 7;
    TK_EXPECT_STATUS(tk_attention_kvcache_workspace_size(&ok, &bytes), TK_ERROR_NO_DEVICE,
                     "no usable CUDA device");
    cr_assert_eq(bytes, 7, "the workspace size was written on failure");
    TK_EXPECT_STATUS(tk_attention_kvcache_workspace_size(&ok, NULL), TK_ERROR_NULL_POINTER, "'bytes'");
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
}

Test(attention_kvcache_args, force_variant_names) {
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_kvcache", "decode_sm80"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_kvcache", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_kvcache", "flash3"),
                     TK_ERROR_INVALID_VALUE, "\"decode_sm80\"");
}

/* ------------------------------------------------------------------------ GPU checks ---- */

#define MAX_BATCH 150

typedef struct kv_case {
    tk_dtype dtype;
    int64_t batch, heads_q, heads_kv, head_dim;
    int64_t seqlen_q;          /* every sequence's queries (varlen = false) */
    bool varlen;
    int32_t q_lens[MAX_BATCH]; /* varlen: queries of each sequence (0 allowed) */
    int32_t k_lens[MAX_BATCH]; /* keys of each sequence's cache */
    int64_t capacity;          /* keys per sequence the cache can hold */
    int64_t page_size;         /* 0: contiguous cache */
    bool padded;               /* cache as [page, head, slot, D] with rows padded by 8 */
    int causal;
    int64_t window_left, window_right;
    float softcap;
    bool alibi, lse;
    int64_t num_splits;
    bool append;               /* k_new / v_new: one new key per query, appended first */
    int64_t rotary_dim;        /* RoPE of q and k_new: 0 = none */
    tk_rope_style rope_style;
    tk_rope_scaling rope_scaling;
    bool rope_cache;           /* angles from a cos/sin table (padded rows) instead of theta */
    bool sinks;                /* per-head sink logits from -1 to 3 */
    int64_t chunk_size;        /* chunked local attention: 0 = off */
} kv_case;

static void kv_case_name(const kv_case *c, char *out, size_t size) {
    char lens[160] = "";
    for (int64_t b = 0, n = 0; b < c->batch && n < (int64_t)sizeof lens - 24; b++)
        n += snprintf(lens + n, sizeof lens - (size_t)n, "%s%d/%d", b ? "," : "",
                      c->varlen ? c->q_lens[b] : (int)c->seqlen_q, c->k_lens[b]);
    snprintf(out, size,
             "%s B%lld H%lld/%lld D%lld q/k [%s] cap %lld page %lld%s causal %d window (%lld, "
             "%lld) softcap %g%s%s splits %lld%s rope %lld/%d/%d%s chunk %lld%s",
             tk_test_dtype_name(c->dtype), (long long)c->batch, (long long)c->heads_q,
             (long long)c->heads_kv, (long long)c->head_dim, lens, (long long)c->capacity,
             (long long)c->page_size, c->padded ? " padded" : "", c->causal,
             (long long)c->window_left, (long long)c->window_right, (double)c->softcap,
             c->alibi ? " alibi" : "", c->lse ? " lse" : "", (long long)c->num_splits,
             c->append ? " append" : "", (long long)c->rotary_dim, (int)c->rope_style,
             (int)c->rope_scaling, c->rope_cache ? " cache" : "", (long long)c->chunk_size,
             c->sinks ? " sinks" : "");
}

/* FlashAttention's representation term (tests/test_attention.c). */
static double representation_term(tk_dtype dtype, double exact) {
    const double r = tk_test_round(dtype, exact);
    return 2.0 * fabs(tk_test_round(dtype, tk_test_round(dtype, r + 0.3) - 0.3) - r);
}

static double *to_double(tk_dtype dtype, const void *host, int64_t n) {
    double *r = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    cr_assert(r != NULL);
    for (int64_t i = 0; i < n; i++)
        r[i] = tk_test_load(dtype, host, i);
    return r;
}

/* The variant run_kv_case expects the call to choose (or to be forced to). */
static const char *kv_expected = "decode_sm80";

/* Runs one case on inputs drawn from `seed` and checks o and lse against the reference. */
static void run_kv_case(const kv_case *c, uint64_t seed) {
    char what[512];
    kv_case_name(c, what, sizeof what);
    tk_rng rng = tk_rng_seeded(seed);
    const int64_t d = c->head_dim, hq = c->heads_q, hkv = c->heads_kv;
    const size_t es = tk_test_dtype_size(c->dtype);

    tk_attention_kvcache_params p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    p.dtype = c->dtype;
    p.batch = c->batch;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    p.causal = c->causal;
    p.window_left = c->window_left;
    p.window_right = c->window_right;
    p.softcap = c->softcap;
    p.return_lse = c->lse;
    p.num_splits = c->num_splits;
    p.chunk_size = c->chunk_size;
    p.rotary_dim = c->rotary_dim;
    p.rope_style = c->rope_style;
    p.rope_scaling = c->rope_scaling;
    if (c->rope_scaling == TK_ROPE_SCALING_LLAMA3) /* Llama 3.1's values */
        p.rope_theta = 500000.0f, p.rope_factor = 8.0f, p.rope_low_freq_factor = 1.0f,
        p.rope_high_freq_factor = 4.0f, p.rope_original_max_position = 8192;
    if (c->rope_scaling == TK_ROPE_SCALING_YARN) /* a ramp inside the pairs at these sizes */
        p.rope_theta = 10000.0f, p.rope_factor = 4.0f, p.rope_original_max_position = 4096;

    /* Queries: cu_seqlens from the lengths, or seqlen_q each. */
    int32_t cu[MAX_BATCH + 1] = {0};
    int64_t max_q = 1;
    for (int64_t b = 0; b < c->batch; b++) {
        const int32_t n = c->varlen ? c->q_lens[b] : (int32_t)c->seqlen_q;
        cu[b + 1] = cu[b] + n;
        max_q = n > max_q ? n : max_q;
    }
    const int64_t tokens = cu[c->batch];
    p.seqlen_q = c->varlen ? max_q : c->seqlen_q;
    /* The cache: pages (or sequences) of `rows` slots; paged caches get spare pages and a
     * shuffled table whose entries past each sequence's keys are -1 (never read). */
    const bool paged = c->page_size > 0;
    const int64_t rows = paged ? c->page_size : c->capacity;
    const int64_t pages_per_seq = paged ? (c->capacity + c->page_size - 1) / c->page_size : 1;
    /* What a sequence can hold is its whole pages' worth: appends fill the last page. */
    const int64_t held = paged ? pages_per_seq * c->page_size : c->capacity;
    /* Keys each sequence attends to: the cache, plus its queries' keys when appending (up to
     * what the sequence holds). */
    /* A RoPE cache covering every position of the call, rows padded by 4 floats. */
    float *rope_table = NULL;
    void *drope = NULL;
    if (c->rope_cache) {
        const int64_t half = c->rotary_dim / 2, stride = half + 4, positions = held + 8;
        rope_table = malloc((size_t)(2 * positions * stride) * sizeof(float));
        cr_assert(rope_table != NULL);
        for (int64_t pos = 0; pos < positions; pos++)
            for (int64_t i = 0; i < stride; i++) {
                const double angle = (double)pos * pow(10000.0, -2.0 * (double)i / (double)c->rotary_dim);
                rope_table[pos * stride + i] = (float)cos(angle);
                rope_table[(positions + pos) * stride + i] = (float)sin(angle);
            }
        drope = tk_dev_alloc((size_t)(2 * positions * stride) * sizeof(float));
        tk_to_dev(drope, rope_table, (size_t)(2 * positions * stride) * sizeof(float));
        p.rope_cos = (const float *)drope;
        p.rope_sin = (const float *)drope + positions * stride;
        p.rope_cache_row_stride = stride;
        p.rope_max_position = positions;
    }
    const float *ref_cos = rope_table, *ref_sin = rope_table ? rope_table + (held + 8) * (c->rotary_dim / 2 + 4) : NULL;
    int32_t k_after[MAX_BATCH] = {0};
    for (int64_t b = 0; b < c->batch; b++) {
        const int64_t n = c->k_lens[b] + (c->append ? cu[b + 1] - cu[b] : 0);
        k_after[b] = (int32_t)(n < held ? n : held);
    }
    p.total_q = c->varlen ? tokens : 0;
    const int64_t nq = tokens * hq * d;

    const int64_t num_pages = paged ? c->batch * pages_per_seq + 3 : c->batch;
    int64_t st[4];
    st[3] = 1;
    if (c->padded) {
        st[1] = d + 8, st[2] = rows * st[1], st[0] = hkv * st[2] + 64;
    } else {
        st[2] = d, st[1] = hkv * d, st[0] = rows * hkv * d;
    }
    const int64_t nk = num_pages * st[0];
    int32_t *table = NULL;
    if (paged) {
        int32_t *perm = malloc((size_t)num_pages * sizeof(int32_t));
        table = malloc((size_t)(c->batch * pages_per_seq) * sizeof(int32_t));
        cr_assert(perm && table);
        for (int64_t i = 0; i < num_pages; i++)
            perm[i] = (int32_t)i;
        for (int64_t i = num_pages - 1; i > 0; i--) {
            const int64_t j = (int64_t)tk_rng_uniform(&rng, 0.0, (double)(i + 1)) % (i + 1);
            const int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int64_t b = 0; b < c->batch; b++)
            for (int64_t i = 0; i < pages_per_seq; i++)
                table[b * pages_per_seq + i] =
                    i * c->page_size < k_after[b] ? perm[b * pages_per_seq + i] : -1;
        free(perm);
        p.block_table = NULL; /* set to the device copy below */
        p.num_pages = num_pages;
        p.page_size = c->page_size;
        p.max_pages_per_seq = pages_per_seq;
    } else {
        p.max_seqlen_k = c->capacity;
    }
    if (c->padded) {
        memcpy(p.k_strides, st, sizeof st);
        memcpy(p.v_strides, st, sizeof st);
    }

    void *hqb = malloc((size_t)(nq > 0 ? nq : 1) * es), *hk = malloc((size_t)nk * es);
    void *hv = malloc((size_t)nk * es);
    uint16_t *ho = malloc((size_t)(nq > 0 ? nq : 1) * es);
    const int64_t n_lse = tokens * hq;
    float *hlse = malloc((size_t)(n_lse > 0 ? n_lse : 1) * sizeof(float));
    float *hslopes = malloc((size_t)hq * sizeof(float)), *hsinks = malloc((size_t)hq * sizeof(float));
    cr_assert(hqb && hk && hv && ho && hlse && hslopes && hsinks);
    tk_fill_uniform(&rng, c->dtype, hqb, nq, -1.0, 1.0);
    tk_fill_uniform(&rng, c->dtype, hk, nk, -1.0, 1.0);
    tk_fill_uniform(&rng, c->dtype, hv, nk, -1.0, 1.0);
    const int64_t n_new = c->append ? tokens * hkv * d : 0; /* dense [tokens, heads_kv, D] */
    void *hkn = malloc((size_t)(n_new > 0 ? n_new : 1) * es), *hvn = malloc((size_t)(n_new > 0 ? n_new : 1) * es);
    cr_assert(hkn && hvn);
    tk_fill_uniform(&rng, c->dtype, hkn, n_new, -1.0, 1.0);
    tk_fill_uniform(&rng, c->dtype, hvn, n_new, -1.0, 1.0);
    for (int64_t h = 0; h < hq; h++) {
        hslopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)hq);
        hsinks[h] = (float)(-1.0 + 4.0 * (double)h / (double)hq);
    }

    void *dq = tk_dev_alloc((size_t)(nq > 0 ? nq : 1) * es), *dk = tk_dev_alloc((size_t)nk * es);
    void *dv = tk_dev_alloc((size_t)nk * es), *dout = tk_dev_alloc((size_t)(nq > 0 ? nq : 1) * es);
    void *dlse = tk_dev_alloc((size_t)(n_lse > 0 ? n_lse : 1) * sizeof(float));
    void *dslopes = tk_dev_alloc((size_t)hq * sizeof(float)), *dsinks = tk_dev_alloc((size_t)hq * sizeof(float));
    void *dlens = tk_dev_alloc(MAX_BATCH * sizeof(int32_t)), *dcu = tk_dev_alloc(sizeof cu);
    void *dtable = paged ? tk_dev_alloc((size_t)(c->batch * pages_per_seq) * sizeof(int32_t)) : NULL;
    tk_to_dev(dq, hqb, (size_t)nq * es);
    tk_to_dev(dk, hk, (size_t)nk * es);
    tk_to_dev(dv, hv, (size_t)nk * es);
    tk_to_dev(dslopes, hslopes, (size_t)hq * sizeof(float));
    tk_to_dev(dsinks, hsinks, (size_t)hq * sizeof(float));
    tk_to_dev(dlens, c->k_lens, MAX_BATCH * sizeof(int32_t));
    tk_to_dev(dcu, cu, sizeof cu);
    if (paged)
        tk_to_dev(dtable, table, (size_t)(c->batch * pages_per_seq) * sizeof(int32_t));
    tk_dev_poison(dout, (size_t)(nq > 0 ? nq : 1) * es);
    tk_dev_poison(dlse, (size_t)(n_lse > 0 ? n_lse : 1) * sizeof(float));
    p.q = dq;
    p.k_cache = dk;
    p.v_cache = dv;
    p.o = dout;
    p.lse = dlse;
    p.alibi_slopes = c->alibi ? dslopes : NULL;
    p.sinks = c->sinks ? dsinks : NULL;
    p.seqlens_k = dlens;
    p.cu_seqlens_q = c->varlen ? dcu : NULL;
    p.block_table = dtable;
    void *dkn = NULL, *dvn = NULL;
    if (c->append) {
        dkn = tk_dev_alloc((size_t)(n_new > 0 ? n_new : 1) * es);
        dvn = tk_dev_alloc((size_t)(n_new > 0 ? n_new : 1) * es);
        tk_to_dev(dkn, hkn, (size_t)n_new * es);
        tk_to_dev(dvn, hvn, (size_t)n_new * es);
        p.k_new = dkn;
        p.v_new = dvn;
    }

    size_t ws_bytes = 0;
    cr_assert_eq(tk_attention_kvcache_workspace_size(&p, &ws_bytes), TK_SUCCESS, "%s: %s", what,
                 tk_last_error());
    void *dws = ws_bytes ? tk_dev_alloc(ws_bytes) : NULL;
    if (dws)
        tk_dev_poison(dws, ws_bytes);
    p.workspace = dws;
    p.workspace_bytes = ws_bytes;
    const char *named = NULL;
    TK_EXPECT_STATUS(tk_attention_kvcache_supported(&p, &named), TK_SUCCESS, "");
    cr_assert_str_eq(named, tokens > 0 ? kv_expected : "");
    const tk_status s = tk_attention_kvcache_fwd(&p, NULL);
    cr_assert_eq(s, TK_SUCCESS, "%s: %s", what, tk_last_error());
    tk_dev_sync();
    tk_to_host(ho, dout, (size_t)nq * es);
    tk_to_host(hlse, dlse, (size_t)n_lse * sizeof(float));

    /* The reference reads the caches through the call's strides. */
    tk_attention_kvcache_params ref = p;
    memcpy(ref.k_strides, st, sizeof st);
    memcpy(ref.v_strides, st, sizeof st);
    const ref_kvcache_inputs keys = {&ref, NULL, NULL, NULL, k_after, c->varlen ? cu : NULL, table, NULL, NULL};
    if (c->append) { /* the appended rows, on the host; then the caches must match bit for bit */
        for (int64_t b = 0; b < c->batch; b++)
            for (int64_t t = cu[b]; t < cu[b + 1]; t++) {
                const int64_t j = c->k_lens[b] + t - cu[b];
                if (j >= held)
                    continue;
                for (int64_t h = 0; h < hkv; h++) {
                    const int64_t kat = ref_kvcache_key_offset(&keys, b, j, h, false);
                    const int64_t vat = ref_kvcache_key_offset(&keys, b, j, h, true);
                    double row[256];
                    for (int64_t e = 0; e < d; e++)
                        row[e] = tk_test_load(c->dtype, hkn, (t * hkv + h) * d + e);
                    if (c->rotary_dim > 0) /* the new key at its position j */
                        ref_kvcache_rope(&ref, ref_cos, ref_sin, j, row);
                    for (int64_t e = 0; e < d; e++)
                        tk_test_store(c->dtype, hk, kat + e, row[e]);
                    memcpy((char *)hv + vat * (int64_t)es, (char *)hvn + (t * hkv + h) * d * (int64_t)es, (size_t)d * es);
                }
            }
        tk_assert_dev_bytes_equal(dv, hv, (size_t)nk * es, "v_cache after the append");
        if (c->rotary_dim == 0) {
            tk_assert_dev_bytes_equal(dk, hk, (size_t)nk * es, "k_cache after the append");
        } else { /* rotated in f32 on the device: within one unit of the last place */
            void *got = malloc((size_t)nk * es);
            cr_assert(got != NULL);
            tk_to_host(got, dk, (size_t)nk * es);
            const double ulp = c->dtype == TK_BF16 ? 0x1p-7 : 0x1p-10;
            for (int64_t e = 0; e < nk; e++) {
                const double want = tk_test_load(c->dtype, hk, e), have = tk_test_load(c->dtype, got, e);
                cr_assert(fabs(have - want) <= ulp * fabs(want) + 1e-5, "%s: k_cache[%lld] = %g after the append, want %g",
                          what, (long long)e, have, want);
            }
            free(got);
        }
    }
    ref.q_strides[0] = c->seqlen_q * hq * d, ref.q_strides[1] = hq * d, ref.q_strides[2] = d,
    ref.q_strides[3] = 1;
    double *q64 = to_double(c->dtype, hqb, nq), *k64 = to_double(c->dtype, hk, nk);
    /* Query i of sequence b at position seqlen_k(b) - seqlen_q(b) + i, rotated and then rounded
     * to the dtype, as the kernel stages its rotated query rows. */
    if (c->rotary_dim > 0)
        for (int64_t b = 0; b < c->batch; b++)
            for (int64_t t = cu[b]; t < cu[b + 1]; t++)
                for (int64_t h = 0; h < hq; h++) {
                    double *qr = q64 + (t * hq + h) * d;
                    ref_kvcache_rope(&ref, ref_cos, ref_sin, k_after[b] - (cu[b + 1] - cu[b]) + t - cu[b], qr);
                    for (int64_t e = 0; e < d; e++)
                        qr[e] = tk_test_round(c->dtype, qr[e]);
                }
    double *v64 = to_double(c->dtype, hv, nk);
    const ref_kvcache_inputs in = {&ref, q64, k64, v64, k_after, c->varlen ? cu : NULL, table,
                                   c->alibi ? hslopes : NULL, c->sinks ? hsinks : NULL};
    double *exact = malloc((size_t)d * sizeof(double)), *naive = malloc((size_t)d * sizeof(double));
    cr_assert(exact && naive);
    double err = 0.0, err_naive = 0.0, atol = 0.0, lse_err = 0.0;
    /* lse is f32 arithmetic on the call's inputs. With RoPE those inputs include the rotated q,
     * rotated in f32 on the device and in f64 here before both round it to the dtype: an element
     * whose two rotations straddle a rounding boundary differs by one unit in the last place
     * (rare: the rotations differ by ~1e-6), which moves its scores, and lse, by up to
     * scale |k| 2^-8 |q| ~ 1e-4. lse is held to 1e-3 then, ten times that; o keeps FlashAttention's
     * rule either way. */
    const double lse_rtol = c->rotary_dim > 0 ? 1e-3 : tk_default_rtol(TK_F32);
    int64_t bad = 0, first_bad = -1, worst = -1, lse_bad = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        int64_t first;
        const int64_t sq = ref_kvcache_seqlen_q(&in, b, &first);
        for (int64_t i = 0; i < sq; i++)
            for (int64_t h = 0; h < hq; h++) {
                double lse_exact, lse_naive;
                ref_kvcache_row(&in, b, i, h, false, exact, &lse_exact);
                ref_kvcache_row(&in, b, i, h, true, naive, &lse_naive);
                const int64_t row = ((first + i) * hq + h) * d;
                for (int64_t e = 0; e < d; e++) {
                    const double g = tk_test_load(c->dtype, ho, row + e);
                    if (!isfinite(g)) {
                        if (bad++ == 0)
                            first_bad = row + e;
                        continue;
                    }
                    if (fabs(g - exact[e]) > err)
                        err = fabs(g - exact[e]), worst = row + e;
                    err_naive = fmax(err_naive, fabs(naive[e] - exact[e]));
                    atol = fmax(atol, representation_term(c->dtype, exact[e]));
                }
                const float got = hlse[c->varlen ? h * tokens + first + i : (b * hq + h) * c->seqlen_q + i];
                if (!c->lse)
                    lse_bad += !isnan(got);
                else if (isinf(lse_exact))
                    lse_bad += !(isinf(got) && got < 0);
                else if (!isfinite(got) || fabs(got - lse_exact) > lse_rtol * (1.0 + fabs(lse_exact)))
                    lse_bad++;
                else
                    lse_err = fmax(lse_err, fabs(got - lse_exact));
            }
    }
    cr_assert(bad == 0, "%s: %lld non-finite outputs (first at element %lld)", what,
              (long long)bad, (long long)first_bad);
    cr_assert(err <= 2.0 * err_naive + atol,
              "%s: max |o - ref| = %.3g at element %lld > 2 x naive %s error %.3g + %.3g", what,
              err, (long long)worst, tk_test_dtype_name(c->dtype), err_naive, atol);
    cr_assert(lse_bad == 0, "%s: %lld lse values wrong (max error of the good ones %.3g)", what,
              (long long)lse_bad, lse_err);

    free(q64); free(k64); free(v64); free(exact); free(naive); free(table); free(rope_table);
    if (drope)
        tk_dev_free(drope);
    free(hqb); free(hk); free(hv); free(ho); free(hlse); free(hslopes); free(hsinks); free(hkn); free(hvn);
    if (dkn)
        tk_dev_free(dkn), tk_dev_free(dvn);
    tk_dev_free(dq); tk_dev_free(dk); tk_dev_free(dv); tk_dev_free(dout); tk_dev_free(dlse);
    tk_dev_free(dslopes); tk_dev_free(dsinks); tk_dev_free(dlens); tk_dev_free(dcu);
    if (dtable)
        tk_dev_free(dtable);
    if (dws)
        tk_dev_free(dws);
}

/* A decode case: one query per sequence, GQA 32/8, no mask options. */
static kv_case decode_case(tk_dtype dtype, int64_t head_dim, int64_t batch, const int32_t *k_lens,
                           int64_t capacity, int64_t page_size) {
    kv_case c = {0};
    c.dtype = dtype;
    c.batch = batch;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.head_dim = head_dim;
    c.seqlen_q = 1;
    for (int64_t b = 0; b < batch; b++)
        c.k_lens[b] = k_lens[b];
    c.capacity = capacity;
    c.page_size = page_size;
    c.window_left = c.window_right = -1;
    c.lse = true;
    return c;
}

/* Lengths 0, 1, a page boundary -1, +0, +1 (for page size 16 and 64 alike) and a long one. */
static const int32_t EDGE_LENS[6] = {0, 1, 63, 64, 65, 300};

Test(attention_kvcache_gpu, contiguous_every_head_dim_and_dtype) {
    TK_REQUIRE_GPU();
    const int64_t dims[3] = {64, 128, 256};
    const tk_dtype dtypes[2] = {TK_BF16, TK_F16};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 3; i++) {
            kv_case c = decode_case(dtypes[t], dims[i], 6, EDGE_LENS, 320, 0);
            run_kv_case(&c, 100 + (uint64_t)(t * 3 + i));
        }
}

Test(attention_kvcache_gpu, paged_every_page_size_shuffled) {
    TK_REQUIRE_GPU();
    const int64_t sizes[8] = {1, 3, 8, 16, 17, 32, 64, 256};
    for (int i = 0; i < 8; i++) {
        const int64_t ps = sizes[i];
        const int32_t lens[6] = {0, 1, (int32_t)ps - 1 > 0 ? (int32_t)ps - 1 : 2, (int32_t)ps,
                                 (int32_t)ps + 1, (int32_t)(3 * ps + 1)};
        kv_case c = decode_case(TK_BF16, 128, 6, lens, 3 * ps + 2, ps);
        run_kv_case(&c, 200 + (uint64_t)i);
        c.padded = true;
        c.head_dim = 64;
        run_kv_case(&c, 220 + (uint64_t)i);
    }
}

Test(attention_kvcache_gpu, gqa_groups_1_to_8) {
    TK_REQUIRE_GPU();
    for (int64_t g = 1; g <= 8; g++) {
        kv_case c = decode_case(TK_BF16, 128, 6, EDGE_LENS, 300, 16);
        c.heads_kv = 2;
        c.heads_q = 2 * g;
        c.seqlen_q = g == 3 ? 7 : 2; /* 21 rows of a group of 3: two row chunks */
        c.causal = 1;
        run_kv_case(&c, 300 + (uint64_t)g);
    }
}

Test(attention_kvcache_gpu, every_split_count) {
    TK_REQUIRE_GPU();
    const int64_t splits[9] = {0, 1, 2, 3, 5, 8, 19, 40, 1024}; /* 40 and 1024: more than pages */
    for (int i = 0; i < 9; i++) {
        kv_case c = decode_case(TK_BF16, 128, 6, EDGE_LENS, 320, 16);
        c.num_splits = splits[i];
        c.lse = i % 2 == 0;
        run_kv_case(&c, 400 + (uint64_t)i);
        c.page_size = 0;
        c.alibi = true;
        run_kv_case(&c, 420 + (uint64_t)i);
    }
}

Test(attention_kvcache_gpu, windows_shorter_and_longer_than_the_cache) {
    TK_REQUIRE_GPU();
    const int64_t lefts[5] = {0, 5, 40, 299, 5000};
    for (int i = 0; i < 5; i++) {
        kv_case c = decode_case(TK_BF16, 128, 6, EDGE_LENS, 300, 16);
        c.seqlen_q = 3;
        c.causal = 1;
        c.window_left = lefts[i];
        c.num_splits = i % 2 ? 3 : 0;
        run_kv_case(&c, 500 + (uint64_t)i);
        c.causal = 0; /* a two-sided window that reaches past the last key */
        c.window_right = lefts[i] / 2;
        run_kv_case(&c, 510 + (uint64_t)i);
    }
}

Test(attention_kvcache_gpu, varlen_queries_with_empty_sequences) {
    TK_REQUIRE_GPU();
    kv_case c = decode_case(TK_BF16, 128, 6, EDGE_LENS, 320, 16);
    c.varlen = true;
    const int32_t q_lens[6] = {0, 1, 40, 3, 0, 37};
    const int32_t k_lens[6] = {5, 1, 64, 0, 10, 300};
    memcpy(c.q_lens, q_lens, sizeof q_lens);
    memcpy(c.k_lens, k_lens, sizeof k_lens);
    c.causal = 1; /* rows of query 40 against 1 .. 64 keys: some rows see nothing */
    for (int64_t splits = 0; splits <= 4; splits += 2) {
        c.num_splits = splits;
        run_kv_case(&c, 600 + (uint64_t)splits);
    }
    c.page_size = 0;
    c.causal = 0;
    c.window_left = 20, c.window_right = 3;
    run_kv_case(&c, 610);
}

Test(attention_kvcache_gpu, softcap_alibi_scale) {
    TK_REQUIRE_GPU();
    kv_case c = decode_case(TK_F16, 256, 6, EDGE_LENS, 300, 64);
    c.softcap = 1.5f;
    c.alibi = true;
    run_kv_case(&c, 700);
    c.head_dim = 64;
    c.num_splits = 4;
    c.seqlen_q = 5;
    c.causal = 1;
    run_kv_case(&c, 701);
}

/* Sinks and chunked local attention (GPT-OSS, Llama 4) on the decode kernel: chunks smaller
 * than a page, across pages and longer than the cache, causal alone and with a window; rows
 * that see no key (o = 0, lse = the sink); every kind of split (the sink joins an unsplit row
 * in the decode kernel, a split one at the merge); paged and contiguous; varlen queries. */
Test(attention_kvcache_gpu, sinks_and_chunked_local) {
    TK_REQUIRE_GPU();
    const int64_t chunks[4] = {0, 16, 50, 1000};
    const int64_t splits[4] = {0, 1, 3, 1024};
    for (int i = 0; i < 4; i++) {
        kv_case c = decode_case(TK_BF16, 128, 6, EDGE_LENS, 320, i % 2 ? 16 : 0);
        c.sinks = true;
        c.chunk_size = chunks[i];
        c.causal = 1;
        c.seqlen_q = 3;
        c.num_splits = splits[i];
        run_kv_case(&c, 1100 + (uint64_t)i);
        c.sinks = i % 2 == 0; /* the chunk alone on odd i */
        c.window_left = 20;
        c.heads_q = 16; /* a group of 8 */
        c.head_dim = 64;
        c.chunk_size = chunks[(i + 1) % 4];
        run_kv_case(&c, 1110 + (uint64_t)i);
    }
    /* A long cache split automatically: its rows meet the sink at the merge. */
    const int32_t lens[3] = {20000, 5, 0};
    kv_case c = decode_case(TK_F16, 128, 3, lens, 20000, 64);
    c.sinks = true;
    run_kv_case(&c, 1120);
    c.chunk_size = 4096; /* the last query sees the last chunk's 3616 keys */
    c.causal = 1;
    run_kv_case(&c, 1121);
    c = decode_case(TK_BF16, 128, 6, EDGE_LENS, 320, 16);
    c.varlen = true;
    const int32_t q_lens[6] = {0, 1, 40, 3, 0, 37};
    const int32_t k_lens[6] = {5, 1, 64, 0, 10, 300};
    memcpy(c.q_lens, q_lens, sizeof q_lens);
    memcpy(c.k_lens, k_lens, sizeof k_lens);
    c.causal = 1;
    c.sinks = true;
    c.chunk_size = 32;
    run_kv_case(&c, 1122);
}

Test(attention_kvcache_gpu, chunked_prefill_on_a_paged_cache) {
    TK_REQUIRE_GPU();
    const int32_t lens[2] = {300, 177};
    kv_case c = decode_case(TK_BF16, 128, 2, lens, 320, 16);
    c.seqlen_q = 100;
    c.heads_q = 4, c.heads_kv = 2;
    c.causal = 1;
    run_kv_case(&c, 800);
}

/* Causal varlen appends into caches of k_lens (6 sequences, page 16), two sequences without
 * queries. */
static kv_case varlen_append_case(tk_dtype dtype, int64_t head_dim, const int32_t *k_lens) {
    kv_case c = decode_case(dtype, head_dim, 6, k_lens, 300, 16);
    c.append = true;
    c.varlen = true;
    const int32_t q_lens[6] = {2, 0, 3, 1, 0, 4};
    memcpy(c.q_lens, q_lens, sizeof q_lens);
    c.causal = 1;
    return c;
}

/* Appends of 1 and 3 keys that cross a page (lengths page - 1 and page - 2 +3), into empty
 * caches, past the capacity (dropped), varlen with empty sequences; then attention over the
 * new lengths. */
Test(attention_kvcache_gpu, appends_crossing_pages) {
    TK_REQUIRE_GPU();
    const int32_t lens[6] = {0, 15, 14, 63, 64, 298};
    const int64_t pages[3] = {16, 0, 5};
    for (int i = 0; i < 3; i++) {
        kv_case c = decode_case(TK_BF16, 128, 6, lens, 300, pages[i]);
        c.append = true;
        c.seqlen_q = i == 0 ? 1 : 3;
        c.causal = 1;
        c.num_splits = i == 2 ? 3 : 0;
        run_kv_case(&c, 1000 + (uint64_t)i);
    }
    kv_case c = varlen_append_case(TK_F16, 64, lens);
    c.window_left = 7;
    run_kv_case(&c, 1010);
}

Test(attention_kvcache_gpu, long_cache_splits_automatically) {
    TK_REQUIRE_GPU();
    const int32_t lens[1] = {20000};
    kv_case c = decode_case(TK_BF16, 128, 1, lens, 20000, 64);
    run_kv_case(&c, 900);
}

/* One sequence under the automatic split gets its splits in closed form (no device-side plan):
 * an empty cache, one key, a split's minimum (256 keys) -1 / +1, and a long cache; one query,
 * and 5 queries of a group of 8 (three 16-row chunks, each cut on its own) causal with a window,
 * also as a varlen batch of one; paged and contiguous. */
Test(attention_kvcache_gpu, one_sequence_under_the_automatic_split) {
    TK_REQUIRE_GPU();
    const int32_t lens[5] = {0, 1, 255, 257, 20000};
    for (int i = 0; i < 5; i++)
        for (int paged = 0; paged < 2; paged++) {
            kv_case c = decode_case(TK_BF16, 128, 1, &lens[i], 20000, paged ? 16 : 0);
            run_kv_case(&c, 950 + (uint64_t)(2 * i + paged));
            c.heads_q = 16, c.heads_kv = 2;
            c.seqlen_q = 5;
            c.causal = 1;
            c.window_left = 700;
            run_kv_case(&c, 970 + (uint64_t)(2 * i + paged));
            c.varlen = true;
            c.q_lens[0] = 5;
            run_kv_case(&c, 990 + (uint64_t)(2 * i + paged));
        }
}

/* The automatic split count follows the capacity, so lengths spread from empty to full leave
 * most splits of the short sequences without keys (and splits shorter than a page). */
Test(attention_kvcache_gpu, automatic_splits_with_lengths_spread_widely) {
    TK_REQUIRE_GPU();
    const int32_t lens[8] = {0, 1, 8191, 17, 0, 300, 4096, 2};
    for (int i = 0; i < 2; i++) {
        kv_case c = decode_case(TK_BF16, 128, 8, lens, 8192, i == 0 ? 16 : 0);
        run_kv_case(&c, 1100 + (uint64_t)i);
    }
}

/* The automatic plan, made on the device from the lengths: more sequences than a CTA has
 * threads (each thread plans several), a few near-full caches among many short and empty ones
 * (splits in proportion to length, up to the capacity's bound), head dim 256 (64-thread CTAs),
 * and varlen queries of a group of 8 that span up to three 16-row chunks, each chunk planned
 * on its own. */
Test(attention_kvcache_gpu, automatic_plan_over_many_sequences) {
    TK_REQUIRE_GPU();
    for (int i = 0; i < 2; i++) {
        const int32_t capacity = i == 0 ? 2048 : 1024;
        int32_t lens[MAX_BATCH];
        for (int b = 0; b < MAX_BATCH; b++)
            lens[b] = b % 37 == 5 ? capacity - b : b % 3 == 0 ? 0 : (b * 131) % 300;
        kv_case c = decode_case(TK_BF16, i == 0 ? 128 : 256, MAX_BATCH, lens, capacity, i == 0 ? 16 : 0);
        c.heads_q = 4, c.heads_kv = 1;
        run_kv_case(&c, 1200 + (uint64_t)i);
        if (i == 1)
            continue;
        c.head_dim = 64;
        c.varlen = true;
        c.heads_q = 8;
        for (int b = 0; b < MAX_BATCH; b++)
            c.q_lens[b] = b % 7 == 3 ? 0 : b % 6;
        c.causal = 1;
        run_kv_case(&c, 1210);
        c.window_left = 100; /* chunks that see a window's keys only */
        run_kv_case(&c, 1211);
    }
}

/* RoPE of q and of the appended keys in the same call, against tk_rope_fwd's math in fp64: NeoX
 * and GPT-J, angles from theta (also with Llama 3.1's and YaRN's scalings) or from a cos/sin
 * table with padded rows, all of head_dim or a part of it; appends that cross pages, varlen
 * with empty sequences, and a call without an append (q alone rotated). */
Test(attention_kvcache_gpu, rope_on_q_and_the_appended_keys) {
    TK_REQUIRE_GPU();
    const int32_t lens[6] = {0, 15, 14, 63, 64, 298};
    const struct {
        tk_rope_style style;
        tk_rope_scaling scaling;
        bool cache;
        int64_t head_dim, rotary_dim, page_size;
    } cases[] = {
        {TK_ROPE_NEOX, TK_ROPE_SCALING_NONE, false, 128, 128, 16},
        {TK_ROPE_GPTJ, TK_ROPE_SCALING_NONE, false, 128, 64, 0},
        {TK_ROPE_NEOX, TK_ROPE_SCALING_NONE, true, 64, 32, 16},
        {TK_ROPE_GPTJ, TK_ROPE_SCALING_NONE, true, 128, 128, 5},
        {TK_ROPE_NEOX, TK_ROPE_SCALING_LLAMA3, false, 128, 128, 16},
        {TK_ROPE_GPTJ, TK_ROPE_SCALING_LLAMA3, false, 256, 256, 0},
        {TK_ROPE_NEOX, TK_ROPE_SCALING_YARN, false, 128, 128, 16},
        {TK_ROPE_GPTJ, TK_ROPE_SCALING_YARN, false, 64, 64, 16},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        kv_case c = decode_case(i % 2 ? TK_F16 : TK_BF16, cases[i].head_dim, 6, lens, 300, cases[i].page_size);
        c.append = true;
        c.seqlen_q = 3;
        c.causal = 1;
        c.num_splits = i % 3 == 0 ? 2 : 0;
        c.rotary_dim = cases[i].rotary_dim;
        c.rope_style = cases[i].style;
        c.rope_scaling = cases[i].scaling;
        c.rope_cache = cases[i].cache;
        run_kv_case(&c, 1300 + (uint64_t)i);
    }
    kv_case c = varlen_append_case(TK_BF16, 128, lens);
    c.rotary_dim = 128;
    c.rope_scaling = TK_ROPE_SCALING_YARN;
    run_kv_case(&c, 1320);
    c.append = false; /* q alone, at the positions the cache's last keys have */
    c.rope_style = TK_ROPE_GPTJ;
    run_kv_case(&c, 1321);
}

/* Device-side lengths and pages the host cannot check: out-of-range values must not fault. */
Test(attention_kvcache_gpu, bad_device_side_values_do_not_fault) {
    TK_REQUIRE_GPU();
    tk_attention_kvcache_params p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    p.batch = 2, p.seqlen_q = 1, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 64;
    p.num_pages = 2, p.page_size = 16, p.max_pages_per_seq = 2;
    const size_t cache = 2 * 16 * 2 * 64 * 2, q_bytes = 2 * 4 * 64 * 2;
    const int32_t table[4] = {-5, 1, 7, 0}, lens[2] = {1000, -3};
    void *dk = tk_dev_alloc(cache), *dq = tk_dev_alloc(q_bytes), *dout = tk_dev_alloc(q_bytes);
    void *dtable = tk_dev_alloc(sizeof table), *dlens = tk_dev_alloc(sizeof lens);
    void *zeros = calloc(cache, 1);
    cr_assert(zeros != NULL);
    tk_to_dev(dk, zeros, cache);
    tk_to_dev(dq, zeros, q_bytes);
    free(zeros);
    tk_to_dev(dtable, table, sizeof table);
    tk_to_dev(dlens, lens, sizeof lens);
    p.q = dq, p.k_cache = dk, p.v_cache = dk, p.o = dout;
    p.block_table = dtable, p.seqlens_k = dlens;
    for (int64_t splits = 1; splits <= 3; splits += 2) {
        p.num_splits = splits;
        size_t bytes = 0;
        cr_assert_eq(tk_attention_kvcache_workspace_size(&p, &bytes), TK_SUCCESS);
        void *ws = bytes ? tk_dev_alloc(bytes) : NULL;
        p.workspace = ws, p.workspace_bytes = bytes;
        cr_assert_eq(tk_attention_kvcache_fwd(&p, NULL), TK_SUCCESS, "%s", tk_last_error());
        tk_dev_sync();
        if (ws)
            tk_dev_free(ws);
    }
    /* A workspace missing or too small is refused. */
    p.num_splits = 3;
    p.workspace = NULL;
    TK_EXPECT_STATUS(tk_attention_kvcache_fwd(&p, NULL), TK_ERROR_NULL_POINTER, "p->workspace");
    void *small = tk_dev_alloc(16);
    p.workspace = small, p.workspace_bytes = 4;
    TK_EXPECT_STATUS(tk_attention_kvcache_fwd(&p, NULL), TK_ERROR_INVALID_VALUE, "p->workspace_bytes");
    tk_dev_free(small);
    tk_dev_free(dk); tk_dev_free(dq); tk_dev_free(dout); tk_dev_free(dtable); tk_dev_free(dlens);
}

/* The same under the automatic plan, which every CTA makes from those values: lengths past the
 * capacity and negative, cu_seqlens_q out of order and past total_q, pages out of range; with
 * and without an append (which writes the caches through the same values). */
Test(attention_kvcache_gpu, bad_device_side_values_under_the_automatic_plan) {
    TK_REQUIRE_GPU();
    enum { BATCH = 3, PAGES = 2, PER_SEQ = 64, TOTAL_Q = 4 };
    tk_attention_kvcache_params p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    p.batch = BATCH, p.seqlen_q = 4, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 64;
    p.num_pages = PAGES, p.page_size = 16, p.max_pages_per_seq = PER_SEQ; /* capacity 1024 */
    p.total_q = TOTAL_Q;
    const size_t cache = PAGES * 16 * 2 * 64 * 2, q_bytes = TOTAL_Q * 4 * 64 * 2, kn_bytes = TOTAL_Q * 2 * 64 * 2;
    int32_t table[BATCH * PER_SEQ];
    for (int i = 0; i < BATCH * PER_SEQ; i++)
        table[i] = i % 5 == 0 ? -1 : i % 5 == 1 ? 1 << 30 : i % 2;
    const int32_t lens[BATCH] = {5000, -7, 700}, cu[BATCH + 1] = {0, 3, 1, 9};
    void *dk = tk_dev_alloc(cache), *dv = tk_dev_alloc(cache), *dq = tk_dev_alloc(q_bytes);
    void *dout = tk_dev_alloc(q_bytes), *dkn = tk_dev_alloc(kn_bytes), *dvn = tk_dev_alloc(kn_bytes);
    void *dtable = tk_dev_alloc(sizeof table), *dlens = tk_dev_alloc(sizeof lens), *dcu = tk_dev_alloc(sizeof cu);
    void *zeros = calloc(cache, 1);
    cr_assert(zeros != NULL);
    tk_to_dev(dk, zeros, cache);
    tk_to_dev(dv, zeros, cache);
    tk_to_dev(dq, zeros, q_bytes);
    tk_to_dev(dkn, zeros, kn_bytes);
    tk_to_dev(dvn, zeros, kn_bytes);
    free(zeros);
    tk_to_dev(dtable, table, sizeof table);
    tk_to_dev(dlens, lens, sizeof lens);
    tk_to_dev(dcu, cu, sizeof cu);
    p.q = dq, p.k_cache = dk, p.v_cache = dv, p.o = dout;
    p.block_table = dtable, p.seqlens_k = dlens, p.cu_seqlens_q = dcu;
    for (int append = 0; append < 2; append++) {
        p.k_new = append ? dkn : NULL;
        p.v_new = append ? dvn : NULL;
        size_t bytes = 0;
        cr_assert_eq(tk_attention_kvcache_workspace_size(&p, &bytes), TK_SUCCESS, "%s", tk_last_error());
        cr_assert_gt(bytes, 0, "a capacity of 1024 keys allows splits");
        void *ws = tk_dev_alloc(bytes);
        p.workspace = ws, p.workspace_bytes = bytes;
        cr_assert_eq(tk_attention_kvcache_fwd(&p, NULL), TK_SUCCESS, "%s", tk_last_error());
        tk_dev_sync();
        tk_dev_free(ws);
    }
    tk_dev_free(dk); tk_dev_free(dv); tk_dev_free(dq); tk_dev_free(dout); tk_dev_free(dkn);
    tk_dev_free(dvn); tk_dev_free(dtable); tk_dev_free(dlens); tk_dev_free(dcu);
}

/* ------------------------------------------------------- chunked prefill, prefill_sm80 ---- */

/* A chunk of seqlen_q queries per sequence, causal, GQA 8/2, one split (the prefill kernel's). */
static kv_case prefill_case(tk_dtype dtype, int64_t head_dim, int64_t batch, const int32_t *k_lens,
                            int64_t capacity, int64_t page_size, int64_t seqlen_q) {
    kv_case c = decode_case(dtype, head_dim, batch, k_lens, capacity, page_size);
    c.seqlen_q = seqlen_q;
    c.causal = 1;
    c.num_splits = 1;
    return c;
}

/* Runs c with "prefill_sm80" forced. */
static void run_prefill(const kv_case *c, uint64_t seed) {
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_kvcache", "prefill_sm80"), TK_SUCCESS, "");
    kv_expected = "prefill_sm80";
    run_kv_case(c, seed);
    kv_expected = "decode_sm80";
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_kvcache", NULL), TK_SUCCESS, "");
}

/* Lengths 0 (no keys: o = 0, lse = -inf), shorter than the chunk (the first rows see nothing
 * under the bottom-right causal mask), a page boundary + 1 and a long one. */
static const int32_t PREFILL_LENS[4] = {0, 100, 257, 700};

Test(attention_kvcache_gpu, prefill_contiguous_and_paged_every_head_dim) {
    TK_REQUIRE_GPU();
    const int64_t dims[3] = {64, 128, 256};
    const int64_t pages[4] = {0, 16, 64, 256};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            kv_case c = prefill_case((i + j) % 2 ? TK_F16 : TK_BF16, dims[i], 4, PREFILL_LENS, 768, pages[j], 129);
            c.padded = j == 2; /* [page, head, slot, D] with padded rows */
            run_prefill(&c, 2000 + (uint64_t)(4 * i + j));
        }
}

/* One query past a tile boundary (129: BM = 128 at head dims 64 and 128), the smallest chunk
 * the variant takes (64), a tile exactly (128, 256), one short of two and 600. */
Test(attention_kvcache_gpu, prefill_seqlen_q_past_tile_boundaries) {
    TK_REQUIRE_GPU();
    const int64_t lens_q[7] = {64, 127, 128, 129, 255, 257, 600};
    const int32_t lens_k[2] = {40, 700};
    for (int i = 0; i < 7; i++) {
        kv_case c = prefill_case(TK_BF16, 128, 2, lens_k, 704, i % 2 ? 16 : 64, lens_q[i]);
        c.lse = i % 3 != 1;
        run_prefill(&c, 2100 + (uint64_t)i);
    }
    /* Head dim 256: BM = 64, so 33 queries are a call the variant takes, 65 one past a tile. */
    const int64_t lens_q256[2] = {33, 65};
    for (int i = 0; i < 2; i++) {
        kv_case c = prefill_case(TK_F16, 256, 2, lens_k, 704, 16, lens_q256[i]);
        run_prefill(&c, 2110 + (uint64_t)i);
    }
}

Test(attention_kvcache_gpu, prefill_varlen_with_empty_sequences) {
    TK_REQUIRE_GPU();
    const int32_t q_lens[6] = {0, 1, 200, 0, 64, 129};
    const int32_t k_lens[6] = {5, 0, 300, 10, 64, 17};
    const int64_t pages[3] = {64, 16, 0};
    for (int i = 0; i < 3; i++) {
        kv_case c = prefill_case(TK_BF16, 128, 6, k_lens, 320, pages[i], 1);
        c.varlen = true;
        memcpy(c.q_lens, q_lens, sizeof q_lens);
        c.lse = i != 1;
        if (i == 2) { /* a two-sided window instead of causal */
            c.causal = 0;
            c.window_left = 20, c.window_right = 3;
        }
        run_prefill(&c, 2200 + (uint64_t)i);
    }
}

/* Appends of a whole chunk that cross pages (from lengths 0, page - 1, a page boundary and
 * past the capacity: rows dropped), then attention over the new lengths; varlen too. */
Test(attention_kvcache_gpu, prefill_appends_crossing_pages) {
    TK_REQUIRE_GPU();
    const int32_t lens[4] = {0, 15, 64, 300};
    const int64_t pages[3] = {16, 0, 5};
    for (int i = 0; i < 3; i++) {
        kv_case c = prefill_case(TK_BF16, 128, 4, lens, 400, pages[i], 130);
        c.append = true;
        run_prefill(&c, 2300 + (uint64_t)i);
    }
    kv_case c = prefill_case(TK_F16, 64, 4, lens, 400, 16, 1);
    c.append = true;
    c.varlen = true;
    const int32_t q_lens[4] = {70, 0, 3, 150};
    memcpy(c.q_lens, q_lens, sizeof q_lens);
    c.window_left = 50;
    run_prefill(&c, 2310);
}

/* Windows shorter and longer than the cache, a two-sided window, no mask, softcap, ALiBi. */
Test(attention_kvcache_gpu, prefill_windows_softcap_alibi) {
    TK_REQUIRE_GPU();
    const int64_t lefts[4] = {0, 37, 300, 5000};
    for (int i = 0; i < 4; i++) {
        kv_case c = prefill_case(TK_BF16, 128, 4, PREFILL_LENS, 768, 16, 150);
        c.window_left = lefts[i];
        run_prefill(&c, 2400 + (uint64_t)i);
    }
    kv_case c = prefill_case(TK_BF16, 64, 4, PREFILL_LENS, 768, 64, 150);
    c.causal = 0;
    c.window_left = 60, c.window_right = 20;
    run_prefill(&c, 2410);
    c.window_left = c.window_right = -1; /* every key of the sequence */
    c.softcap = 1.5f;
    c.alibi = true;
    run_prefill(&c, 2411);
    c = prefill_case(TK_F16, 128, 4, PREFILL_LENS, 768, 0, 150);
    c.softcap = 2.0f;
    c.alibi = true;
    run_prefill(&c, 2412);
}

/* Sinks and chunked local attention on the prefill kernel: chunks of half a query tile, one
 * not a multiple of the key tile, longer than the cache; contiguous and paged; with a window. */
Test(attention_kvcache_gpu, prefill_sinks_and_chunked_local) {
    TK_REQUIRE_GPU();
    const int64_t chunks[3] = {64, 100, 1000};
    for (int i = 0; i < 3; i++) {
        kv_case c = prefill_case(i % 2 ? TK_F16 : TK_BF16, 128, 4, PREFILL_LENS, 768, i == 1 ? 0 : 16, 150);
        c.sinks = true;
        c.chunk_size = chunks[i];
        run_prefill(&c, 2600 + (uint64_t)i);
    }
    kv_case c = prefill_case(TK_BF16, 64, 4, PREFILL_LENS, 768, 64, 150);
    c.sinks = true;
    c.window_left = 40;
    run_prefill(&c, 2610);
    c.sinks = false;
    c.chunk_size = 48;
    run_prefill(&c, 2611);
}

Test(attention_kvcache_gpu, prefill_gqa_groups) {
    TK_REQUIRE_GPU();
    const int64_t groups[5] = {1, 2, 3, 4, 8};
    for (int i = 0; i < 5; i++) {
        kv_case c = prefill_case(TK_BF16, 128, 4, PREFILL_LENS, 768, 16, 100);
        c.heads_kv = 2;
        c.heads_q = 2 * groups[i];
        run_prefill(&c, 2500 + (uint64_t)i);
    }
}

/* The automatic choice (no forcing): prefill_sm80 for a long chunk running without splits,
 * decode_sm80 for decode, for chunks below half a query tile and for calls with splits; a forced
 * prefill_sm80 refuses a decode call, and a rejected call names no variant either way. */
Test(attention_kvcache_gpu, automatic_choice_prefill_for_chunks_decode_for_decode) {
    TK_REQUIRE_GPU();
    /* Buffers large enough for every case's spans (head dim up to 256). */
    const int64_t batch = 2, hq = 32, hkv = 8, d = 128, sq = 1024, page = 16, pages_per_seq = 256;
    const size_t q_bytes = (size_t)(batch * sq * hq * 256 * 2);
    const size_t cache_bytes = (size_t)(batch * pages_per_seq * page * hkv * 256 * 2);
    void *dq = tk_dev_alloc(q_bytes), *dout = tk_dev_alloc(q_bytes);
    void *dk = tk_dev_alloc(cache_bytes), *dv = tk_dev_alloc(cache_bytes);
    void *dtable = tk_dev_alloc((size_t)(batch * pages_per_seq) * 4), *dlens = tk_dev_alloc((size_t)batch * 4);
    tk_attention_kvcache_params p = TK_ATTENTION_KVCACHE_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.batch = batch, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
    p.q = dq, p.o = dout, p.k_cache = dk, p.v_cache = dv;
    p.block_table = dtable, p.seqlens_k = dlens;
    p.num_pages = batch * pages_per_seq, p.page_size = page, p.max_pages_per_seq = pages_per_seq;
    p.causal = 1;
    p.num_splits = 1;
    const struct { int64_t seqlen_q, splits, head_dim; const char *variant; } cases[] = {
        {sq, 1, 128, "prefill_sm80"}, {64, 1, 128, "prefill_sm80"},  {63, 1, 128, "decode_sm80"},
        {1, 1, 128, "decode_sm80"},   {sq, 2, 128, "decode_sm80"},   {sq, 1, 64, "prefill_sm80"},
        {32, 1, 256, "prefill_sm80"}, {31, 1, 256, "decode_sm80"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tk_attention_kvcache_params c = p;
        c.seqlen_q = cases[i].seqlen_q, c.num_splits = cases[i].splits, c.head_dim = cases[i].head_dim;
        size_t ws = 0;
        cr_assert_eq(tk_attention_kvcache_workspace_size(&c, &ws), TK_SUCCESS, "%s", tk_last_error());
        void *dws = ws ? tk_dev_alloc(ws) : NULL;
        c.workspace = dws, c.workspace_bytes = ws;
        const char *named = NULL;
        TK_EXPECT_STATUS(tk_attention_kvcache_supported(&c, &named), TK_SUCCESS, "");
        cr_assert_str_eq(named, cases[i].variant, "seqlen_q %lld splits %lld head_dim %lld: %s",
                         (long long)cases[i].seqlen_q, (long long)cases[i].splits,
                         (long long)cases[i].head_dim, named);
        if (dws)
            tk_dev_free(dws);
    }
    /* The library's choice (num_splits = 0): a long chunk whose query tiles give every SM a CTA
     * (8 tiles x 32 heads x 2 sequences) runs unsplit on the prefill kernel, without a
     * workspace; with RoPE, which only the decode kernel applies, it keeps the decode plan. */
    tk_attention_kvcache_params c = p;
    c.seqlen_q = sq, c.num_splits = 0;
    size_t ws = 7;
    cr_assert_eq(tk_attention_kvcache_workspace_size(&c, &ws), TK_SUCCESS, "%s", tk_last_error());
    cr_assert_eq(ws, 0, "an unsplit call needs no workspace, got %zu bytes", ws);
    const char *named = NULL;
    TK_EXPECT_STATUS(tk_attention_kvcache_supported(&c, &named), TK_SUCCESS, "");
    cr_assert_str_eq(named, "prefill_sm80");
    tk_attention_kvcache_params rope = c;
    rope.rotary_dim = 64;
    rope.rope_theta = 10000.0f;
    cr_assert_eq(tk_attention_kvcache_workspace_size(&rope, &ws), TK_SUCCESS, "%s", tk_last_error());
    void *rope_ws = ws ? tk_dev_alloc(ws) : NULL;
    rope.workspace = rope_ws, rope.workspace_bytes = ws;
    TK_EXPECT_STATUS(tk_attention_kvcache_supported(&rope, &named), TK_SUCCESS, "");
    cr_assert_str_eq(named, "decode_sm80");
    if (rope_ws)
        tk_dev_free(rope_ws);
    /* Forced onto a call it does not take: refused, nothing named. */
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_kvcache", "prefill_sm80"), TK_SUCCESS, "");
    c.seqlen_q = 1, c.num_splits = 1;
    named = "untouched";
    TK_EXPECT_STATUS(tk_attention_kvcache_supported(&c, &named), TK_ERROR_NOT_SUPPORTED, "prefill_sm80");
    cr_assert_null(named);
    TK_EXPECT_STATUS(tk_attention_kvcache_fwd(&c, NULL), TK_ERROR_NOT_SUPPORTED, "prefill_sm80");
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_kvcache", NULL), TK_SUCCESS, "");
    /* Rejected inputs stay rejected with the prefill variant in the table. */
    c.seqlen_q = sq;
    c.head_dim = 80;
    TK_EXPECT_STATUS(tk_attention_kvcache_supported(&c, &named), TK_ERROR_NOT_SUPPORTED, "accepted: 64, 128, 256");
    c.head_dim = 128;
    c.q = (const char *)dq + 2;
    TK_EXPECT_STATUS(tk_attention_kvcache_fwd(&c, NULL), TK_ERROR_MISALIGNED, "'p->q'");
    tk_dev_free(dq); tk_dev_free(dout); tk_dev_free(dk); tk_dev_free(dv); tk_dev_free(dtable);
    tk_dev_free(dlens);
}
