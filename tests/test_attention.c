/* Attention forward: bad input on the host (runs everywhere), then lengths, masks, head dims,
 * layouts, GQA / MQA, softcap, ALiBi and LSE against the fp64 reference on the GPU, every
 * variant forced. Accuracy follows FlashAttention's tests: the largest error of o must be at
 * most twice that of a naive implementation in the same precision (ref_attention_row with
 * naive = true) plus twice the representation error of o near 0.3; lse is f32 and held to the
 * f32 tolerance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/attention_ref.h"

#define VARIANT_COUNT 5
static const char *const VARIANTS[VARIANT_COUNT] = {"wgmma_sm90", "wgmma_sm90_persistent", "wgmma_sm90_wide",
                                                    "mma_sm80_packed", "mma_sm80"};
/* The variants from PORTABLE on give the same bits for the same call (their key tiles differ
 * only by tiles that leave a row's state unchanged); "wgmma_sm90" and "wgmma_sm90_wide" sum other
 * key tiles and are held to the reference, and "wgmma_sm90_persistent" (the same work tiles,
 * each computed as "wgmma_sm90" computes it) to the bits of "wgmma_sm90". */
#define PERSISTENT 1
#define PORTABLE 3

/* ------------------------------------------------------------------ bad input (host) ---- */

/* Fake "device" buffers: host memory with a sentinel; validation must reject before any use.
 * A valid call: q [1, 16, 2, 64] at in_buf, k and v [1, 16, 1, 64] after it, alibi slopes at
 * the end; o [1, 16, 2, 64] at out_buf, lse [1, 2, 16] after it (bf16, dense layouts). */
static unsigned char in_buf[16384] __attribute__((aligned(16)));
static unsigned char out_buf[8192] __attribute__((aligned(16)));

static void reset_buffers(void) {
    tk_fill_sentinel(in_buf, sizeof in_buf);
    tk_fill_sentinel(out_buf, sizeof out_buf);
}

static tk_attention_params host_params(void) {
    tk_attention_params p = TK_ATTENTION_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.batch = 1;
    p.seqlen_q = 16;
    p.seqlen_k = 16;
    p.heads_q = 2;
    p.heads_kv = 1;
    p.head_dim = 64;
    p.q = in_buf;
    p.k = in_buf + 4096;
    p.v = in_buf + 8192;
    p.alibi_slopes = (const float *)(in_buf + 12288);
    p.o = out_buf;
    p.return_lse = 1;
    p.lse = (float *)(out_buf + 4096);
    return p;
}

/* Rejected by tk_attention_fwd, tk_attention_sliding_fwd (when the failure is not in the mask
 * fields the sliding entry point overrides) and tk_attention_supported alike; nothing written. */
static void expect_rejected(const tk_attention_params *p, tk_status status, const char *needle,
                            bool sliding_too) {
    reset_buffers();
    TK_EXPECT_STATUS(tk_attention_fwd(p, NULL), status, needle);
    if (sliding_too)
        TK_EXPECT_STATUS(tk_attention_sliding_fwd(p, 4, NULL), status, needle);
    const char *name = "untouched";
    TK_EXPECT_STATUS(tk_attention_supported(p, &name), status, needle);
    cr_assert_null(name, "%s: tk_attention_supported named a variant on failure", needle);
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s: an output was written", needle);
    cr_assert(tk_is_sentinel(in_buf, sizeof in_buf), "%s: an input was written", needle);
}

#define REJECT(field_assignment, status, needle)     \
    do {                                             \
        tk_attention_params p_ = ok;                 \
        p_.field_assignment;                         \
        expect_rejected(&p_, status, needle, true);  \
    } while (0)

Test(attention_args, rejects_bad_arguments) {
    const tk_attention_params ok = host_params();
    expect_rejected(NULL, TK_ERROR_NULL_POINTER, "'p'", true);
    REJECT(size = 8, TK_ERROR_INVALID_VALUE, "p->size");
    REJECT(dtype = TK_F32, TK_ERROR_NOT_SUPPORTED, "p->dtype");
    REJECT(dtype = (tk_dtype)9, TK_ERROR_INVALID_VALUE, "p->dtype");
    REJECT(batch = -1, TK_ERROR_INVALID_VALUE, "p->batch");
    REJECT(seqlen_q = 0, TK_ERROR_INVALID_VALUE, "p->seqlen_q");
    REJECT(seqlen_k = -3, TK_ERROR_INVALID_VALUE, "p->seqlen_k");
    REJECT(heads_q = 0, TK_ERROR_INVALID_VALUE, "p->heads_q");
    REJECT(heads_kv = 0, TK_ERROR_INVALID_VALUE, "p->heads_kv");
    REJECT(heads_kv = 3, TK_ERROR_INVALID_VALUE, "p->heads_q = 2 is not a multiple of p->heads_kv");
    REJECT(head_dim = 72, TK_ERROR_NOT_SUPPORTED, "p->head_dim = 72 is not supported");
    REJECT(head_dim = 32, TK_ERROR_NOT_SUPPORTED, "accepted: 64, 80, 96, 128, 256");
    REJECT(head_dim = 0, TK_ERROR_INVALID_VALUE, "p->head_dim");
    REJECT(q = NULL, TK_ERROR_NULL_POINTER, "'p->q'");
    REJECT(k = NULL, TK_ERROR_NULL_POINTER, "'p->k'");
    REJECT(v = NULL, TK_ERROR_NULL_POINTER, "'p->v'");
    REJECT(o = NULL, TK_ERROR_NULL_POINTER, "'p->o'");
    REJECT(lse = NULL, TK_ERROR_NULL_POINTER, "p->lse is NULL but p->return_lse = 1");
    REJECT(return_lse = 2, TK_ERROR_INVALID_VALUE, "p->return_lse");
    REJECT(softmax_scale = -1.0f, TK_ERROR_INVALID_VALUE, "p->softmax_scale");
    REJECT(softmax_scale = NAN, TK_ERROR_INVALID_VALUE, "p->softmax_scale");
    REJECT(softcap = -2.0f, TK_ERROR_INVALID_VALUE, "p->softcap");
    REJECT(softcap = INFINITY, TK_ERROR_INVALID_VALUE, "p->softcap");
    REJECT(q_strides[3] = 2, TK_ERROR_NOT_SUPPORTED, "p->q_strides[3]");
    REJECT(v_strides[1] = -128, TK_ERROR_INVALID_VALUE, "p->v_strides[1]");
    {
        tk_attention_params p = ok; /* a batch stride whose extent overflows */
        p.k_strides[0] = INT64_MAX / 2, p.k_strides[1] = 64, p.k_strides[2] = 64, p.k_strides[3] = 1;
        p.batch = 3;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "overflows", true);
    }
    REJECT(seqlen_q = (INT64_C(1) << 30) + 1, TK_ERROR_NOT_SUPPORTED, "2^30");
    /* Vector path alignment: 16-byte pointers, strides in whole 16-byte chunks. */
    REJECT(q = in_buf + 2, TK_ERROR_MISALIGNED, "'p->q'");
    REJECT(v = in_buf + 8192 + 8, TK_ERROR_MISALIGNED, "'p->v'");
    REJECT(o = out_buf + 2, TK_ERROR_MISALIGNED, "'p->o'");
    REJECT(lse = (float *)(out_buf + 4096 + 2), TK_ERROR_MISALIGNED, "'p->lse'");
    REJECT(alibi_slopes = (const float *)(in_buf + 12288 + 1), TK_ERROR_MISALIGNED,
           "'p->alibi_slopes'");
    {
        tk_attention_params p = ok; /* [B, S, H, D] strides with a row of 68 elements */
        p.q_strides[0] = 16 * 136, p.q_strides[1] = 136, p.q_strides[2] = 68, p.q_strides[3] = 1;
        expect_rejected(&p, TK_ERROR_MISALIGNED, "p->q_strides[2]", true);
    }
    {
        tk_attention_params p = ok; /* every row of o at the same address: written many times */
        p.o_strides[0] = 0, p.o_strides[1] = 0, p.o_strides[2] = 0, p.o_strides[3] = 1;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->o_strides", true);
        p.o_strides[0] = 4096, p.o_strides[1] = 64, p.o_strides[2] = 64; /* heads over positions */
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->o_strides", true);
    }
    /* Overlaps: o over q, lse inside o. */
    REJECT(o = in_buf + 2048, TK_ERROR_OVERLAP, "'p->o' overlaps 'p->q'");
    REJECT(lse = (float *)(out_buf + 1024), TK_ERROR_OVERLAP, "'p->o' overlaps 'p->lse'");
    {
        tk_attention_params p = ok; /* grid of 2^20 * 2^10 * 2^14 CTAs */
        p.batch = INT64_C(1) << 20, p.heads_q = 1024, p.heads_kv = 1024, p.seqlen_q = INT64_C(1) << 20;
        expect_rejected(&p, TK_ERROR_NOT_SUPPORTED, "grid limit", true);
    }
    /* Mask fields: tk_attention_sliding_fwd overrides them, so only tk_attention_fwd rejects. */
    tk_attention_params p = ok;
    p.window_left = -2;
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->window_left", false);
    p = ok;
    p.window_right = -7;
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->window_right", false);
    p = ok;
    p.causal = 1, p.window_right = 3;
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->window_right = 3 contradicts p->causal", false);
    p = ok;
    p.causal = 2;
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->causal", false);
    reset_buffers();
    TK_EXPECT_STATUS(tk_attention_sliding_fwd(&ok, -1, NULL), TK_ERROR_INVALID_VALUE,
                     "'window_left'");
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
}

/* The specialised masks: ranges, alignment, overlaps and the combinations without a meaning,
 * each named; sinks, chunks and documents with every other option pass validation (where no
 * device runs, up to the device check). */
Test(attention_args, rejects_bad_mask_combinations) {
    tk_attention_params ok = host_params(); /* sinks and document ids after the slopes */
    ok.sinks = (const float *)(in_buf + 12416);
    ok.document_ids = (const int32_t *)(in_buf + 12544);
    REJECT(chunk_size = -1, TK_ERROR_INVALID_VALUE, "p->chunk_size = -1");
    REJECT(prefix_len = -5, TK_ERROR_INVALID_VALUE, "p->prefix_len = -5");
    REJECT(chunk_size = (INT64_C(1) << 30) + 1, TK_ERROR_NOT_SUPPORTED, "2^30");
    REJECT(sinks = (const float *)(in_buf + 12416 + 2), TK_ERROR_MISALIGNED, "'p->sinks'");
    REJECT(document_ids = (const int32_t *)(in_buf + 12544 + 1), TK_ERROR_MISALIGNED,
           "'p->document_ids'");
    REJECT(sinks = (const float *)out_buf, TK_ERROR_OVERLAP, "'p->o' overlaps 'p->sinks'");
    REJECT(document_ids = (const int32_t *)(out_buf + 4096), TK_ERROR_OVERLAP,
           "overlaps 'p->document_ids'");
    tk_attention_params p = ok;
    p.seqlen_q = 17; /* o [1, 17, 2, 64] ends at 4352: lse moved past it */
    p.lse = (float *)(out_buf + 4608);
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->document_ids needs p->seqlen_q <= p->seqlen_k", true);
    p = ok;
    p.prefix_len = 4; /* not causal */
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->prefix_len = 4 needs p->causal = 1", false);
    p.causal = 1, p.window_left = 3;
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->prefix_len = 4 needs p->causal = 1", false);
    p.window_left = -1, p.chunk_size = 8;
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->prefix_len = 4 cannot be combined", false);
    p.chunk_size = 0; /* with document_ids */
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->prefix_len = 4 cannot be combined", false);
    if (tk_test_have_device())
        return;
    /* Every supported combination reaches the device check. */
    tk_attention_params all = ok;
    all.causal = 1, all.window_left = 5, all.chunk_size = 8, all.softcap = 30.0f;
    reset_buffers();
    TK_EXPECT_STATUS(tk_attention_fwd(&all, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    all.document_ids = NULL, all.window_left = -1, all.chunk_size = 0, all.prefix_len = 6;
    TK_EXPECT_STATUS(tk_attention_fwd(&all, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
}

Test(attention_args, empty_batch_is_a_noop) {
    tk_attention_params p = TK_ATTENTION_PARAMS_INIT;
    p.seqlen_q = p.seqlen_k = 5;
    p.heads_q = p.heads_kv = 1;
    p.head_dim = 128;
    TK_EXPECT_STATUS(tk_attention_fwd(&p, NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_attention_sliding_fwd(&p, 3, NULL), TK_SUCCESS, "");
    const char *name = NULL;
    TK_EXPECT_STATUS(tk_attention_supported(&p, &name), TK_SUCCESS, "");
    cr_assert_str_eq(name, "");
    cr_assert_str_empty(tk_last_error());
}

Test(attention_args, no_device_is_reported) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; this test covers machines without one");
    const tk_attention_params ok = host_params();
    reset_buffers();
    TK_EXPECT_STATUS(tk_attention_fwd(&ok, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    const char *name = "untouched";
    TK_EXPECT_STATUS(tk_attention_supported(&ok, &name), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    cr_assert_null(name);
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
}

/* Inputs may repeat rows (a key broadcast over positions); only outputs must not. */
Test(attention_args, repeated_input_rows_pass_validation) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; this test covers machines without one");
    tk_attention_params p = host_params();
    p.k_strides[0] = 0, p.k_strides[1] = 0, p.k_strides[2] = 0, p.k_strides[3] = 1;
    reset_buffers();
    TK_EXPECT_STATUS(tk_attention_fwd(&p, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf));
}

Test(attention_args, force_variant_names) {
    for (int v = 0; v < VARIANT_COUNT; v++)
        TK_EXPECT_STATUS(tk_experimental_force_variant("attention", VARIANTS[v]), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention", "flash3"), TK_ERROR_INVALID_VALUE,
                     "\"mma_sm80\"");
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention", "flash3"), TK_ERROR_INVALID_VALUE,
                     "\"mma_sm80_packed\"");
}

/* ------------------------------------------------------------------------ GPU checks ---- */

typedef struct attn_case {
    tk_dtype dtype;
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    bool bhsd;          /* [B, H, S, D] buffers with padded rows, through strides; else dense
                           [B, S, H, D] with all strides 0 */
    int causal;
    int64_t window_left, window_right;
    bool sliding;       /* through tk_attention_sliding_fwd(window_left) */
    float softcap;
    bool alibi, lse;
    double qk_range;    /* q and k uniform in [-qk_range, qk_range); v in [-1, 1) */
    bool sinks;         /* sink logits uniform in [-2, 4) */
    int64_t chunk, prefix;
    int64_t doc_len;    /* > 0: document ids (ref_attention_doc_ids) */
} attn_case;

static void case_name(const attn_case *c, const char *variant, char *out, size_t size) {
    snprintf(out, size,
             "%s B%lld Sq%lld Sk%lld H%lld/%lld D%lld %s causal %d window (%lld, %lld)%s "
             "softcap %g%s%s%s chunk %lld prefix %lld docs %lld variant %s",
             tk_test_dtype_name(c->dtype), (long long)c->batch, (long long)c->seqlen_q,
             (long long)c->seqlen_k, (long long)c->heads_q, (long long)c->heads_kv,
             (long long)c->head_dim, c->bhsd ? "BHSD" : "BSHD", c->causal,
             (long long)c->window_left, (long long)c->window_right, c->sliding ? " sliding" : "",
             (double)c->softcap, c->alibi ? " alibi" : "", c->lse ? " lse" : "",
             c->sinks ? " sinks" : "", (long long)c->chunk, (long long)c->prefix,
             (long long)c->doc_len, variant ? variant : "(auto)");
}

/* Strides of a [batch, seq, heads, head_dim] tensor in the case's layout, and its element
 * count (ref_attention_layout). */
static int64_t layout_strides(const attn_case *c, int64_t seq, int64_t heads, int64_t st[4]) {
    return ref_attention_layout(c->bhsd, c->batch, seq, heads, c->head_dim, st);
}

/* Whether "mma_sm80_packed" claims the case: an even GQA group and a window bounded on both
 * sides once the library has resolved it (causal and the sliding entry point mean
 * window_right = 0; a window covering every key is unbounded). "mma_sm80" claims every case,
 * and the automatic choice is the packed variant wherever it claims the case. */
static bool packed_claims(const attn_case *c) {
    const int64_t right = c->sliding || c->causal ? 0 : c->window_right;
    const bool left_bounded = c->window_left >= 0 && c->window_left < c->seqlen_k - 1;
    const bool right_bounded = right >= 0 && right < c->seqlen_q - 1;
    return (c->heads_q / c->heads_kv) % 2 == 0 && left_bounded && right_bounded;
}

/* Whether "wgmma_sm90" claims the case: head dim 64, 128 or 256 on a machine where it runs;
 * "wgmma_sm90_persistent": 64 or 128 there. */
static bool sm90_claims(const attn_case *c) {
    return (c->head_dim == 64 || c->head_dim == 128 || c->head_dim == 256) && tk_sm90_runs_here();
}

static bool sm90_persistent_claims(const attn_case *c) {
    return (c->head_dim == 64 || c->head_dim == 128) && tk_sm90_runs_here();
}

/* "wgmma_sm90_wide": head dim 64 under any mask (192 query rows); the automatic choice wherever
 * it claims the case. */
static bool sm90_wide_claims(const attn_case *c) {
    return c->head_dim == 64 && tk_sm90_runs_here();
}

/* Whether the automatic choice is "wgmma_sm90_persistent" where it claims the case (and the wide
 * one does not): a key band of at most 2048 keys per query, from a window bounded on both sides
 * once resolved (as packed_claims), or documents (src/attention.c, persistent_prefers). */
static bool sm90_persistent_preferred(const attn_case *c) {
    const int64_t right = c->sliding || c->causal ? 0 : c->window_right;
    const bool left_bounded = c->window_left >= 0 && c->window_left < c->seqlen_k - 1;
    const bool right_bounded = right >= 0 && right < c->seqlen_q - 1;
    return (left_bounded && right_bounded && c->window_left + right <= 2048) || c->doc_len > 0;
}

/* The fp64 reference (exact and naive rows, exact lse) of the last case run_case checked: every
 * variant of a case runs the same inputs (drawn from the same seed), so it is computed once per
 * case, not once per variant. */
static struct {
    attn_case c;
    uint64_t seed;
    double *exact, *naive, *lse; /* [batch, heads_q, seqlen_q, (head_dim)] */
} ref_memo;

static void ref_memo_fill(const attn_case *c, uint64_t seed, const tk_attention_params *ref, const double *q64,
                          const double *k64, const double *v64, const float *slopes) {
    if (ref_memo.exact && ref_memo.seed == seed && memcmp(&ref_memo.c, c, sizeof *c) == 0)
        return;
    free(ref_memo.exact); free(ref_memo.naive); free(ref_memo.lse);
    const int64_t rows = c->batch * c->heads_q * c->seqlen_q;
    ref_memo.exact = malloc((size_t)(rows * c->head_dim) * sizeof(double));
    ref_memo.naive = malloc((size_t)(rows * c->head_dim) * sizeof(double));
    ref_memo.lse = malloc((size_t)rows * sizeof(double));
    cr_assert(ref_memo.exact && ref_memo.naive && ref_memo.lse);
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->heads_q; h++)
            for (int64_t i = 0; i < c->seqlen_q; i++) {
                const int64_t r = (b * c->heads_q + h) * c->seqlen_q + i;
                double lse_naive;
                ref_attention_row(ref, q64, k64, v64, slopes, b, h, i, false, ref_memo.exact + r * c->head_dim,
                                  ref_memo.lse + r);
                ref_attention_row(ref, q64, k64, v64, slopes, b, h, i, true, ref_memo.naive + r * c->head_dim,
                                  &lse_naive);
            }
    memcpy(&ref_memo.c, c, sizeof *c);
    ref_memo.seed = seed;
}

/* Runs one case with inputs drawn from `seed`, checks o and lse, returns the host copy of o
 * (caller frees) so that cases can be compared bit for bit. A forced variant that does not
 * claim the case must say so through tk_attention_supported (NULL is returned). */
static uint16_t *run_case(const attn_case *c, const char *variant, uint64_t seed) {
    char what[400];
    case_name(c, variant, what, sizeof what);
    tk_rng rng = tk_rng_seeded(seed);
    tk_attention_params p = TK_ATTENTION_PARAMS_INIT;
    p.dtype = c->dtype;
    p.batch = c->batch;
    p.seqlen_q = c->seqlen_q;
    p.seqlen_k = c->seqlen_k;
    p.heads_q = c->heads_q;
    p.heads_kv = c->heads_kv;
    p.head_dim = c->head_dim;
    p.causal = c->causal;
    p.window_left = c->window_left;
    p.window_right = c->window_right;
    p.softcap = c->softcap;
    p.return_lse = c->lse;
    p.chunk_size = c->chunk;
    p.prefix_len = c->prefix;

    tk_attention_params ref = p; /* explicit strides, and the mask the call means */
    const int64_t nq = layout_strides(c, c->seqlen_q, c->heads_q, ref.q_strides);
    const int64_t nk = layout_strides(c, c->seqlen_k, c->heads_kv, ref.k_strides);
    layout_strides(c, c->seqlen_k, c->heads_kv, ref.v_strides);
    layout_strides(c, c->seqlen_q, c->heads_q, ref.o_strides);
    if (c->bhsd) {
        memcpy(p.q_strides, ref.q_strides, sizeof p.q_strides);
        memcpy(p.k_strides, ref.k_strides, sizeof p.k_strides);
        memcpy(p.v_strides, ref.v_strides, sizeof p.v_strides);
        memcpy(p.o_strides, ref.o_strides, sizeof p.o_strides);
    }
    if (c->sliding) {
        ref.causal = 1;
        ref.window_right = 0;
    }

    const size_t es = tk_test_dtype_size(c->dtype);
    const int64_t n_lse = c->batch * c->heads_q * c->seqlen_q;
    void *hq = malloc((size_t)nq * es), *hk = malloc((size_t)nk * es), *hv = malloc((size_t)nk * es);
    uint16_t *ho = malloc((size_t)nq * es);
    float *hlse = malloc((size_t)n_lse * sizeof(float));
    float *hslopes = malloc((size_t)c->heads_q * sizeof(float));
    cr_assert(hq && hk && hv && ho && hlse && hslopes);
    tk_fill_uniform(&rng, c->dtype, hq, nq, -c->qk_range, c->qk_range);
    tk_fill_uniform(&rng, c->dtype, hk, nk, -c->qk_range, c->qk_range);
    tk_fill_uniform(&rng, c->dtype, hv, nk, -1.0, 1.0);
    for (int64_t h = 0; h < c->heads_q; h++) /* the ALiBi paper's geometric slopes */
        hslopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)c->heads_q);
    float *hsinks = malloc((size_t)c->heads_q * sizeof(float));
    cr_assert(hsinks);
    for (int64_t h = 0; h < c->heads_q; h++)
        hsinks[h] = (float)tk_rng_uniform(&rng, -2.0, 4.0);
    int32_t *hids = c->doc_len > 0 ? ref_attention_doc_ids(c->batch, c->seqlen_k, c->doc_len) : NULL;
    const size_t ids_bytes = (size_t)(c->batch * c->seqlen_k) * sizeof(int32_t);
    void *dsinks = tk_dev_alloc((size_t)c->heads_q * sizeof(float));
    void *dids = tk_dev_alloc(ids_bytes);
    tk_to_dev(dsinks, hsinks, (size_t)c->heads_q * sizeof(float));
    if (hids)
        tk_to_dev(dids, hids, ids_bytes);
    p.sinks = c->sinks ? dsinks : NULL;
    p.document_ids = hids ? dids : NULL;
    ref.sinks = c->sinks ? hsinks : NULL;
    ref.document_ids = hids;

    void *dq = tk_dev_alloc((size_t)nq * es), *dk = tk_dev_alloc((size_t)nk * es);
    void *dv = tk_dev_alloc((size_t)nk * es), *do_ = tk_dev_alloc((size_t)nq * es);
    void *dlse = tk_dev_alloc((size_t)n_lse * sizeof(float));
    void *dslopes = tk_dev_alloc((size_t)c->heads_q * sizeof(float));
    tk_to_dev(dq, hq, (size_t)nq * es);
    tk_to_dev(dk, hk, (size_t)nk * es);
    tk_to_dev(dv, hv, (size_t)nk * es);
    tk_to_dev(dslopes, hslopes, (size_t)c->heads_q * sizeof(float));
    tk_dev_poison(do_, (size_t)nq * es);
    tk_dev_poison(dlse, (size_t)n_lse * sizeof(float));
    p.q = dq;
    p.k = dk;
    p.v = dv;
    p.o = do_;
    p.lse = dlse;
    p.alibi_slopes = c->alibi ? dslopes : NULL;

    const bool persistent = sm90_persistent_claims(c) && sm90_persistent_preferred(c);
    if (variant == NULL && persistent && !sm90_wide_claims(c) && tk_test_under_racecheck())
        variant = "wgmma_sm90"; /* the automatic choice there is the persistent one (tk_test.h) */
    cr_assert_eq(tk_experimental_force_variant("attention", variant), TK_SUCCESS);
    const bool packed = packed_claims(c), sm90 = sm90_claims(c);
    const bool claimed = variant == NULL || strcmp(variant, "mma_sm80") == 0 ||
                         (strcmp(variant, "mma_sm80_packed") == 0 && packed) ||
                         (strcmp(variant, "wgmma_sm90") == 0 && sm90) ||
                         (strcmp(variant, "wgmma_sm90_persistent") == 0 && sm90_persistent_claims(c)) ||
                         (strcmp(variant, "wgmma_sm90_wide") == 0 && sm90_wide_claims(c));
    tk_attention_params query = p; /* the mask the sliding entry point runs */
    if (c->sliding)
        query.causal = 1, query.window_right = 0;
    const char *named = NULL;
    TK_EXPECT_STATUS(tk_attention_supported(&query, &named),
                     claimed ? TK_SUCCESS : TK_ERROR_NOT_SUPPORTED, "forced variant");
    if (!claimed) {
        cr_assert_null(named, "%s: tk_attention_supported named a variant", what);
        cr_assert_eq(tk_experimental_force_variant("attention", NULL), TK_SUCCESS);
        free(hq); free(hk); free(hv); free(ho); free(hlse); free(hslopes); free(hsinks); free(hids);
        tk_dev_free(dq); tk_dev_free(dk); tk_dev_free(dv); tk_dev_free(do_); tk_dev_free(dlse);
        tk_dev_free(dslopes); tk_dev_free(dsinks); tk_dev_free(dids);
        return NULL;
    }
    const char *expected = variant                 ? variant
                           : sm90_wide_claims(c) ? "wgmma_sm90_wide"
                           : persistent          ? "wgmma_sm90_persistent"
                           : sm90                ? "wgmma_sm90"
                           : packed              ? "mma_sm80_packed"
                                                 : "mma_sm80";
    cr_assert_str_eq(named, expected, "%s: tk_attention_supported named %s", what, named);
    const tk_status s = c->sliding ? tk_attention_sliding_fwd(&p, c->window_left, NULL)
                                   : tk_attention_fwd(&p, NULL);
    cr_assert_eq(s, TK_SUCCESS, "%s: %s", what, tk_last_error());
    cr_assert_str_eq(tk_last_variant(), expected, "%s ran variant %s", what, tk_last_variant());
    cr_assert_eq(tk_experimental_force_variant("attention", NULL), TK_SUCCESS);
    tk_dev_sync();
    tk_to_host(ho, do_, (size_t)nq * es);
    tk_to_host(hlse, dlse, (size_t)n_lse * sizeof(float));

    double *q64 = ref_to_double(c->dtype, hq, nq), *k64 = ref_to_double(c->dtype, hk, nk);
    double *v64 = ref_to_double(c->dtype, hv, nk);
    ref_memo_fill(c, seed, &ref, q64, k64, v64, c->alibi ? hslopes : NULL);
    unsigned char *written = calloc((size_t)nq, 1);
    cr_assert(written);
    double err = 0.0, err_naive = 0.0, atol = 0.0;
    int64_t bad = 0, first_bad = -1, worst = -1, lse_bad = 0;
    double lse_err = 0.0;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->heads_q; h++)
            for (int64_t i = 0; i < c->seqlen_q; i++) {
                const int64_t r = (b * c->heads_q + h) * c->seqlen_q + i;
                const double *exact = ref_memo.exact + r * c->head_dim, *naive = ref_memo.naive + r * c->head_dim;
                const double lse_exact = ref_memo.lse[r];
                const int64_t row = b * ref.o_strides[0] + i * ref.o_strides[1] + h * ref.o_strides[2];
                for (int64_t e = 0; e < c->head_dim; e++) {
                    written[row + e] = 1;
                    const double g = tk_test_load(c->dtype, ho, row + e);
                    if (!isfinite(g)) {
                        if (bad++ == 0)
                            first_bad = row + e;
                        continue;
                    }
                    if (fabs(g - exact[e]) > err) {
                        err = fabs(g - exact[e]);
                        worst = row + e;
                    }
                    err_naive = fmax(err_naive, fabs(naive[e] - exact[e]));
                    atol = fmax(atol, ref_attention_representation_term(c->dtype, exact[e]));
                }
                const float got = hlse[(b * c->heads_q + h) * c->seqlen_q + i];
                if (!c->lse)
                    lse_bad += !isnan(got); /* not requested: must stay poisoned */
                else if (isinf(lse_exact))
                    lse_bad += !(isinf(got) && got < 0);
                else if (!isfinite(got) || fabs(got - lse_exact) > tk_default_rtol(TK_F32) * (1.0 + fabs(lse_exact)))
                    lse_bad++;
                else
                    lse_err = fmax(lse_err, fabs(got - lse_exact));
            }
    cr_assert(bad == 0, "%s: %lld non-finite outputs (first at element %lld)", what,
              (long long)bad, (long long)first_bad);
    cr_assert(err <= 2.0 * err_naive + atol,
              "%s: max |o - ref| = %.3g at element %lld > 2 x naive %s error %.3g + %.3g", what,
              err, (long long)worst, tk_test_dtype_name(c->dtype), err_naive, atol);
    cr_assert(lse_bad == 0, "%s: %lld lse values wrong (max error of the good ones %.3g)", what,
              (long long)lse_bad, lse_err);
    for (int64_t x = 0; x < nq; x++)
        cr_assert(written[x] || ho[x] == 0xffff, "%s: wrote element %lld outside o", what,
                  (long long)x);

    free(q64); free(k64); free(v64); free(written);
    free(hq); free(hk); free(hv); free(hlse); free(hslopes); free(hsinks); free(hids);
    tk_dev_free(dq); tk_dev_free(dk); tk_dev_free(dv); tk_dev_free(do_); tk_dev_free(dlse);
    tk_dev_free(dslopes); tk_dev_free(dsinks); tk_dev_free(dids);
    return ho;
}

/* Every variant forced (the automatic choice runs in the tests that pass variant NULL). Where
 * both portable variants run, their o must agree bit for bit: a warp's rows are the same consecutive positions of
 * one head whether its CTA holds one head or several, and the key tiles only the wider one-head
 * CTA visits hold none of those rows' visible keys, which leaves their state unchanged. */
static void run_case_all_variants(const attn_case *c, uint64_t seed) {
    uint16_t *o[VARIANT_COUNT];
    /* The persistent one is left out under racecheck until a racecheck run of it is clean (each
     * consumer warpgroup's own mask-table rows, behind a 128-thread named barrier). */
    for (int v = 0; v < VARIANT_COUNT; v++)
        o[v] = v == PERSISTENT && tk_test_under_racecheck() ? NULL : run_case(c, VARIANTS[v], seed);
    int64_t st[4];
    const size_t bytes = (size_t)layout_strides(c, c->seqlen_q, c->heads_q, st) *
                         tk_test_dtype_size(c->dtype);
    char what[400];
    case_name(c, NULL, what, sizeof what);
    for (int v = PORTABLE + 1; v < VARIANT_COUNT; v++)
        if (o[PORTABLE] && o[v])
            cr_assert(memcmp(o[PORTABLE], o[v], bytes) == 0, "%s: variants %s and %s differ", what,
                      VARIANTS[PORTABLE], VARIANTS[v]);
    if (o[0] && o[PERSISTENT])
        cr_assert(memcmp(o[0], o[PERSISTENT], bytes) == 0, "%s: variants %s and %s differ", what, VARIANTS[0],
                  VARIANTS[PERSISTENT]);
    for (int v = 0; v < VARIANT_COUNT; v++)
        free(o[v]);
}

static const tk_dtype DTYPES[2] = {TK_BF16, TK_F16};

Test(attention_gpu, lengths_and_masks, .timeout = 600) {
    TK_REQUIRE_GPU();
    /* {seqlen_q, seqlen_k, causal, window_left, window_right, sliding} at head dim 128 */
    const struct { int64_t sq, sk; int causal; int64_t wl, wr; bool sliding; } masks[] = {
        {1, 1, 0, -1, -1, false},       {17, 17, 1, -1, -1, false},
        {1000, 1000, 0, -1, -1, false}, {1000, 1000, 1, -1, -1, false},
        {17, 1000, 1, -1, -1, false},   {1000, 17, 1, -1, -1, false}, /* rows that see nothing */
        {1, 1000, 1, -1, -1, false},    {1, 1000, 0, -1, -1, false},
        {1000, 1, 0, -1, -1, false},    {333, 333, 0, 0, -1, true},  /* diagonal only */
        {300, 300, 1, 37, -1, false},   {300, 333, 0, 37, 5, false},
        {333, 300, 0, 64, 100, false},  {250, 250, 0, -1, 10, false},
        {200, 260, 0, 50, 7, true},     {260, 200, 0, 100, -1, true},
        {129, 129, 0, 0, 0, false},     {100, 100, 0, 0, -1, false},
    };
    uint64_t seed = 100;
    for (size_t d = 0; d < 2; d++)
        for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
            const int64_t batch = masks[m].sq * masks[m].sk > 100000 ? 1 : 2;
            attn_case c = {DTYPES[d], batch, masks[m].sq, masks[m].sk, 2, 1, 128, false,
                           masks[m].causal, masks[m].wl, masks[m].wr, masks[m].sliding, 0.0f,
                           false, true, 2.0, false, 0, 0, 0};
            run_case_all_variants(&c, seed++);
        }
}

/* Windows bounded on both sides with an even GQA group: the packed variant's ground (2 heads
 * per CTA for groups of 2 and 6, 4 for 4 and 8), at every head dim, with query tiles that end
 * mid-sequence, seqlen_q != seqlen_k both ways, both layouts, softcap and ALiBi. A group of 1
 * or 3 checks that the packed variant declines and the automatic choice falls back. */
Test(attention_gpu, narrow_windows_packed_heads, .timeout = 600) {
    TK_REQUIRE_GPU();
    static const int64_t head_dims[] = {64, 80, 96, 128, 256};
    static const int64_t heads[][2] = {{8, 2}, {6, 3}, {16, 2}, {6, 1}, {3, 3}};
    /* {seqlen_q, seqlen_k, causal, window_left, window_right, sliding} */
    const struct { int64_t sq, sk; int causal; int64_t wl, wr; bool sliding; } masks[] = {
        {300, 300, 0, 0, -1, true},   {300, 300, 0, 37, -1, true}, {290, 290, 1, 100, -1, false},
        {250, 250, 0, 20, 9, false},  {77, 400, 0, 64, -1, true},  {400, 130, 1, 45, -1, false},
        {333, 333, 0, 5, 70, false},
    };
    uint64_t seed = 500;
    for (size_t hd = 0; hd < sizeof head_dims / sizeof head_dims[0]; hd++)
        for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
            const size_t g = (m + hd) % (sizeof heads / sizeof heads[0]);
            const bool extras = (m + hd) % 3 == 0; /* softcap and ALiBi on every third */
            attn_case c = {DTYPES[(m + hd) % 2], 1 + (int64_t)(m % 2), masks[m].sq, masks[m].sk,
                           heads[g][0], heads[g][1], head_dims[hd], (m + hd) % 2 == 1,
                           masks[m].causal, masks[m].wl, masks[m].wr, masks[m].sliding,
                           extras ? 20.0f : 0.0f, extras, true, extras ? 4.0 : 2.0, false, 0, 0, 0};
            cr_assert_eq(packed_claims(&c), (heads[g][0] / heads[g][1]) % 2 == 0);
            run_case_all_variants(&c, seed);
            if (m % 2 == 0)
                free(run_case(&c, NULL, seed));
            seed++;
        }
}

/* Chunked local, prefix-LM, documents and sinks against the reference, alone and with windows,
 * GQA (packed heads where the window is bounded on both sides), softcap and ALiBi, at lengths
 * that cut tiles, chunks and documents anywhere, seqlen_q != seqlen_k both ways, every variant
 * forced. */
Test(attention_gpu, specialised_masks, .timeout = 900) {
    TK_REQUIRE_GPU();
    /* {sq, sk, causal, wl, wr, chunk, prefix, doc_len, sinks, hq, hkv, softcap, alibi} */
    const struct {
        int64_t sq, sk; int causal; int64_t wl, wr, chunk, prefix, docs; bool sinks;
        int64_t hq, hkv; float softcap; bool alibi;
    } masks[] = {
        {300, 300, 1, -1, -1, 64, 0, 0, false, 2, 1, 0.0f, false},   /* chunked causal */
        {300, 300, 0, -1, -1, 100, 0, 0, false, 4, 2, 0.0f, false},  /* bidirectional chunks */
        {200, 333, 1, -1, -1, 37, 0, 0, false, 2, 2, 0.0f, true},    /* shifted */
        {333, 200, 1, -1, -1, 128, 0, 0, false, 2, 1, 0.0f, false},  /* positions < 0 */
        {300, 300, 1, 20, -1, 50, 0, 0, false, 8, 2, 0.0f, false},   /* chunk in a window: packed */
        {1000, 1000, 1, -1, -1, 256, 0, 0, true, 2, 1, 20.0f, false},
        {300, 300, 1, -1, -1, 0, 50, 0, false, 2, 1, 0.0f, false},   /* prefix-LM */
        {200, 200, 1, -1, -1, 0, 500, 0, false, 4, 2, 0.0f, true},   /* prefix past the keys */
        {150, 260, 1, -1, -1, 0, 170, 0, true, 2, 2, 0.0f, false},
        {300, 300, 1, -1, -1, 0, 0, 40, false, 2, 1, 0.0f, false},   /* documents, causal */
        {257, 257, 0, -1, -1, 0, 0, 64, false, 4, 2, 0.0f, false},   /* bidirectional */
        {300, 300, 1, -1, -1, 50, 0, 64, false, 2, 1, 0.0f, false},  /* with chunks */
        {250, 250, 0, 20, 9, 0, 0, 30, true, 8, 2, 5.0f, true},      /* window, packed */
        {100, 300, 1, -1, -1, 0, 0, 90, false, 2, 1, 0.0f, false},   /* shifted */
        {1000, 1000, 1, -1, -1, 0, 0, 333, true, 2, 2, 0.0f, false},
        {300, 300, 1, -1, -1, 0, 0, 0, true, 2, 1, 0.0f, false},     /* sinks */
        {1000, 17, 0, -1, -1, 0, 0, 0, true, 2, 1, 0.0f, false},
        {333, 200, 1, -1, -1, 0, 0, 0, true, 4, 2, 0.0f, false},     /* rows see only the sink */
        {300, 300, 1, 37, -1, 0, 0, 0, true, 8, 2, 30.0f, true},     /* GPT-OSS's window layers */
        {160, 160, 0, -1, -1, 0, 0, 1, false, 2, 1, 0.0f, false},    /* a document per position */
        {200, 200, 1, -1, -1, 0, 0, 1, false, 2, 1, 0.0f, false},    /* the same, head dims 64, 128 */
        {1000, 1000, 1, -1, -1, 0, 0, 31, false, 2, 1, 0.0f, false}, /* starts at every bit of a word */
        {600, 600, 0, -1, -1, 0, 0, 32, false, 4, 2, 0.0f, false},   /* starts at bit 0 of words */
        {300, 300, 1, -1, -1, 0, 0, 2000, false, 2, 1, 0.0f, false}, /* one document past the keys */
        {250, 250, 0, 20, 9, 0, 0, 30, false, 8, 2, 0.0f, false},    /* packed, 16-row tiles at 256 */
    };
    static const int64_t head_dims[] = {64, 128, 80, 256};
    uint64_t seed = 700;
    for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++)
        for (size_t hd = 0; hd < 2; hd++) {
            const int64_t d = head_dims[(m + hd) % 2 + (m % 5 == 4 ? 2 : 0)];
            attn_case c = {DTYPES[(m + hd) % 2], masks[m].sq * masks[m].sk > 200000 ? 1 : 2,
                           masks[m].sq, masks[m].sk, masks[m].hq, masks[m].hkv, d, (m + hd) % 3 == 1,
                           masks[m].causal, masks[m].wl, masks[m].wr, false, masks[m].softcap,
                           masks[m].alibi, true, masks[m].softcap > 0.0f ? 4.0 : 2.0,
                           masks[m].sinks, masks[m].chunk, masks[m].prefix, masks[m].docs};
            run_case_all_variants(&c, seed++);
        }
}

/* Scores spread far apart (q and k in [-6, 6): a score's standard deviation is ~17 in exp2 units
 * at every head dim), so that a row's max often passes its running max by more than
 * the online softmax's slack (ATTN_MAX_SLACK, 8) on a later tile, and often by less: both the
 * rows that keep their max, with p up to 2^8, and those that move it and rescale O, on every
 * variant and head dim, over 1000 keys (8 or more key tiles per row). */
Test(attention_gpu, running_max_slack, .timeout = 600) {
    TK_REQUIRE_GPU();
    static const int64_t head_dims[] = {64, 80, 96, 128, 256};
    uint64_t seed = 1900;
    for (size_t hd = 0; hd < sizeof head_dims / sizeof head_dims[0]; hd++)
        for (int causal = 0; causal < 2; causal++) {
            attn_case c = {DTYPES[(hd + (size_t)causal) % 2], 1, 1000, 1000, 4, 2, head_dims[hd], false, causal,
                           -1, -1, false, 0.0f, false, true, 6.0, false, 0, 0, 0};
            run_case_all_variants(&c, seed++);
        }
}

/* A chunk that holds every key is no chunk: same code, same bits as plain causal. */
Test(attention_gpu, one_chunk_is_causal, .timeout = 300) {
    TK_REQUIRE_GPU();
    attn_case causal = {TK_BF16, 2, 300, 300, 4, 2, 128, false, 1, -1, -1, false, 0.0f,
                        false, true, 2.0, false, 0, 0, 0};
    attn_case chunked = causal;
    chunked.chunk = 300;
    uint16_t *a = run_case(&causal, NULL, 9), *b = run_case(&chunked, NULL, 9);
    cr_assert(memcmp(a, b, (size_t)(2 * 300 * 4 * 128) * 2) == 0, "chunk 300 differs from causal");
    free(a); free(b);
}

/* A window that covers every key is the plain causal mask: same code, same bits. */
Test(attention_gpu, window_past_the_sequence_is_causal, .timeout = 300) {
    TK_REQUIRE_GPU();
    for (size_t d = 0; d < 2; d++) {
        attn_case causal = {DTYPES[d], 2, 300, 300, 4, 2, 64, false, 1, -1, -1, false, 0.0f,
                            false, true, 2.0, false, 0, 0, 0};
        attn_case wide = causal;
        wide.window_left = 5000;
        attn_case wide_sliding = wide;
        wide_sliding.sliding = true;
        wide_sliding.causal = 0;
        uint16_t *a = run_case(&causal, NULL, 7), *b = run_case(&wide, NULL, 7);
        uint16_t *s = run_case(&wide_sliding, NULL, 7);
        const size_t bytes = (size_t)(2 * 300 * 4 * 64) * 2;
        cr_assert(memcmp(a, b, bytes) == 0, "%s: window_left 5000 differs from causal",
                  tk_test_dtype_name(DTYPES[d]));
        cr_assert(memcmp(a, s, bytes) == 0, "%s: sliding window 5000 differs from causal",
                  tk_test_dtype_name(DTYPES[d]));
        free(a); free(b); free(s);
    }
}

Test(attention_gpu, head_dims_layouts_gqa, .timeout = 600) {
    TK_REQUIRE_GPU();
    static const int64_t head_dims[] = {64, 80, 96, 128, 256};
    /* GQA ratios 1, 4 and 8, and MQA. */
    static const int64_t heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {6, 1}};
    uint64_t seed = 200;
    for (size_t hd = 0; hd < sizeof head_dims / sizeof head_dims[0]; hd++)
        for (size_t d = 0; d < 2; d++)
            for (int bhsd = 0; bhsd < 2; bhsd++)
                for (size_t g = 0; g < 4; g++) {
                    attn_case c = {DTYPES[d], 2, 77, 130, heads[g][0], heads[g][1],
                                   head_dims[hd], bhsd, (int)(g % 2), -1, -1, false, 0.0f,
                                   false, g != 2, 2.0, false, 0, 0, 0};
                    run_case_all_variants(&c, seed++);
                }
}

/* "wgmma_sm90_persistent" with more work tiles (query tiles x heads x batch) than an H100 or H200
 * has SMs (132), so that its CTAs take two to six tiles each, one after the other through the
 * same rings and its two Q buffers (tile k in buffer k % 2; from five tiles on a buffer's
 * barriers come back to a phase parity they had), the last wave partial: causal GQA, documents
 * (causal and bidirectional), windows (one with seqlen_q < seqlen_k), dense, one query per
 * sequence, and rows that see no key (seqlen_q > seqlen_k: tiles that load Q and no key tile,
 * after tiles that do, since the longest come first). Every variant runs each case; the
 * persistent one must match "wgmma_sm90" bit for bit. */
Test(attention_gpu, persistent_many_tiles_per_cta, .timeout = 600) {
    TK_REQUIRE_GPU();
    const attn_case cases[] = {
        {TK_BF16, 1, 200, 200, 80, 8, 64, false, 1, -1, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 0},
        {TK_BF16, 1, 300, 300, 96, 8, 64, false, 1, -1, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 0},
        {TK_F16, 2, 260, 260, 24, 4, 64, false, 1, -1, -1, false, 0.0f, false, true, 2.0, true, 0, 0, 70},
        {TK_BF16, 1, 150, 400, 96, 8, 128, true, 1, 64, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 0},
        {TK_BF16, 4, 1, 500, 64, 8, 128, false, 0, -1, -1, false, 20.0f, true, true, 4.0, false, 0, 0, 0},
        {TK_F16, 1, 400, 100, 64, 64, 64, false, 1, -1, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 0},
        /* 768 tiles: 5 or 6 per CTA */
        {TK_BF16, 2, 700, 700, 64, 8, 128, false, 1, 100, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 0},
        /* 480 tiles: 3 or 4 per CTA */
        {TK_F16, 2, 640, 640, 48, 8, 64, true, 0, -1, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 100},
        /* 384 tiles, dense: 2 or 3 per CTA */
        {TK_BF16, 1, 400, 400, 96, 8, 128, false, 0, -1, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 0},
        /* head dim 128 (2 stages): 256 tiles, rows that see no key after rows that do */
        {TK_F16, 1, 400, 100, 64, 64, 128, false, 1, -1, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 0},
        /* head dim 128, causal documents: 480 tiles, 3 or 4 per CTA */
        {TK_BF16, 2, 640, 640, 48, 8, 128, false, 1, -1, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 100},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case_all_variants(&cases[i], 900 + i);
}

/* Query lengths around the wide variant's 192-row tile at head dim 64: its third consumer
 * warpgroup's rows partly or wholly past seqlen_q, a second tile of one row, several tiles;
 * dense, causal and a window, each with the automatic choice (wide at head dim 64) and every
 * variant forced; head dim 128 (which the wide variant declines) beside it. */
Test(attention_gpu, wide_tile_edges, .timeout = 600) {
    TK_REQUIRE_GPU();
    static const int64_t lengths[][2] = {{191, 191}, {192, 192}, {193, 193}, {385, 300}, {130, 353}};
    uint64_t seed = 950;
    for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++)
        for (int64_t d = 64; d <= 128; d += 64)
            for (int causal = 0; causal < 2; causal++) {
                attn_case c = {DTYPES[l % 2], 1, lengths[l][0], lengths[l][1], 4, 2, d, false, causal,
                               causal && l == 3 ? 100 : -1, -1, false, 0.0f, false, true, 2.0, false, 0, 0, 0};
                free(run_case(&c, NULL, seed)); /* the automatic choice */
                run_case_all_variants(&c, seed++);
            }
}

Test(attention_gpu, softcap_alibi_lse, .timeout = 600) {
    TK_REQUIRE_GPU();
    static const int64_t head_dims[] = {64, 80, 96, 128, 256};
    uint64_t seed = 300;
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof head_dims / sizeof head_dims[0]; i++) {
            const int64_t hd = head_dims[i];
            /* Gemma 2's cap of 50 on large logits, causal */
            attn_case softcap = {DTYPES[d], 2, 150, 150, 4, 2, hd, false, 1, -1, -1, false, 50.0f,
                                 false, true, 6.0, false, 0, 0, 0};
            run_case_all_variants(&softcap, seed++);
            /* a small cap that bends every logit, non-causal, BHSD */
            attn_case small_cap = {DTYPES[d], 1, 90, 200, 2, 2, hd, true, 0, -1, -1, false, 3.0f,
                                   false, true, 3.0, false, 0, 0, 0};
            run_case_all_variants(&small_cap, seed++);
            /* ALiBi, dense and with a window, with and without softcap */
            attn_case alibi = {DTYPES[d], 2, 200, 230, 8, 2, hd, false, 0, -1, -1, false, 0.0f,
                               true, true, 2.0, false, 0, 0, 0};
            run_case_all_variants(&alibi, seed++);
            attn_case alibi_window = {DTYPES[d], 1, 300, 300, 8, 8, hd, true, 1, 40, -1, false,
                                      30.0f, true, true, 4.0, false, 0, 0, 0};
            run_case_all_variants(&alibi_window, seed++);
        }
}

/* q and o of 2^31 + 12800 elements (4 GB each in bf16): 64-bit offsets. Only the last rows of
 * q hold data (the rest is NaN, which stays in its own rows); those rows are checked. */
Test(attention_gpu, past_2_pow_31_elements, .timeout = 300) {
    TK_REQUIRE_GPU();
    TK_SKIP_UNDER_SANITIZER("8 GB of buffers");
    const int64_t d = 128, sq = (INT64_C(1) << 24) + 100, sk = 64, rows = 300;
    const int64_t nq = sq * d, nk = sk * d;
    tk_rng rng = tk_rng_seeded(400);
    uint16_t *hq = malloc((size_t)(rows * d) * 2), *hk = malloc((size_t)nk * 2);
    uint16_t *hv = malloc((size_t)nk * 2), *ho = malloc((size_t)(rows * d) * 2);
    cr_assert(hq && hk && hv && ho);
    tk_fill_uniform(&rng, TK_BF16, hq, rows * d, -2.0, 2.0);
    tk_fill_uniform(&rng, TK_BF16, hk, nk, -2.0, 2.0);
    tk_fill_uniform(&rng, TK_BF16, hv, nk, -1.0, 1.0);
    unsigned char *dq = tk_dev_alloc((size_t)nq * 2), *do_ = tk_dev_alloc((size_t)nq * 2);
    void *dk = tk_dev_alloc((size_t)nk * 2), *dv = tk_dev_alloc((size_t)nk * 2);
    tk_dev_poison(dq, (size_t)nq * 2);
    tk_dev_poison(do_, (size_t)nq * 2);
    tk_to_dev(dq + (size_t)((sq - rows) * d) * 2, hq, (size_t)(rows * d) * 2);
    tk_to_dev(dk, hk, (size_t)nk * 2);
    tk_to_dev(dv, hv, (size_t)nk * 2);
    tk_attention_params p = TK_ATTENTION_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.batch = 1;
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.heads_q = p.heads_kv = 1;
    p.head_dim = d;
    p.q = dq;
    p.k = dk;
    p.v = dv;
    p.o = do_;
    TK_EXPECT_STATUS(tk_attention_fwd(&p, NULL), TK_SUCCESS, "");
    tk_dev_sync();
    tk_to_host(ho, do_ + (size_t)((sq - rows) * d) * 2, (size_t)(rows * d) * 2);

    /* The reference sees the checked rows as a [1, rows, 1, d] problem with the same keys. */
    tk_attention_params ref = p;
    ref.seqlen_q = rows;
    ref.q_strides[0] = rows * d, ref.q_strides[1] = d, ref.q_strides[2] = d, ref.q_strides[3] = 1;
    ref.k_strides[0] = nk, ref.k_strides[1] = d, ref.k_strides[2] = d, ref.k_strides[3] = 1;
    memcpy(ref.v_strides, ref.k_strides, sizeof ref.v_strides);
    double *q64 = ref_to_double(TK_BF16, hq, rows * d), *k64 = ref_to_double(TK_BF16, hk, nk);
    double *v64 = ref_to_double(TK_BF16, hv, nk);
    double exact[128], naive[128], lse;
    double err = 0.0, err_naive = 0.0, atol = 0.0;
    for (int64_t i = 0; i < rows; i++) {
        ref_attention_row(&ref, q64, k64, v64, NULL, 0, 0, i, false, exact, &lse);
        ref_attention_row(&ref, q64, k64, v64, NULL, 0, 0, i, true, naive, &lse);
        for (int64_t e = 0; e < d; e++) {
            const double g = tk_test_load(TK_BF16, ho, i * d + e);
            cr_assert(isfinite(g), "row %lld of the last %lld: non-finite output", (long long)i,
                      (long long)rows);
            err = fmax(err, fabs(g - exact[e]));
            err_naive = fmax(err_naive, fabs(naive[e] - exact[e]));
            atol = fmax(atol, ref_attention_representation_term(TK_BF16, exact[e]));
        }
    }
    cr_assert(err <= 2.0 * err_naive + atol, "max error %.3g > 2 x naive %.3g + %.3g", err,
              err_naive, atol);
    free(q64); free(k64); free(v64);
    free(hq); free(hk); free(hv); free(ho);
    tk_dev_free(dq); tk_dev_free(do_); tk_dev_free(dk); tk_dev_free(dv);
}

Test(attention_gpu, supported_names_the_variant) {
    TK_REQUIRE_GPU();
    const tk_attention_params ok = host_params(); /* never launched: host pointers are fine */
    const char *name = NULL;
    /* Head dim 64, nothing masked: the wide Hopper variant first where it runs. */
    TK_EXPECT_STATUS(tk_attention_supported(&ok, &name), TK_SUCCESS, "");
    cr_assert_str_eq(name, tk_sm90_runs_here() ? "wgmma_sm90_wide" : "mma_sm80");
    TK_EXPECT_STATUS(tk_attention_supported(&ok, NULL), TK_SUCCESS, "");
    tk_attention_params window = ok; /* a sliding window over a GQA group of 2 (the wide variant's
                                        * three warpgroups take every mask at head dim 64) */
    window.causal = 1, window.window_left = 4;
    TK_EXPECT_STATUS(tk_attention_supported(&window, &name), TK_SUCCESS, "");
    cr_assert_str_eq(name, tk_sm90_runs_here() ? "wgmma_sm90_wide" : "mma_sm80_packed");
    for (int v = PORTABLE; v < VARIANT_COUNT; v++) {
        cr_assert_eq(tk_experimental_force_variant("attention", VARIANTS[v]), TK_SUCCESS);
        TK_EXPECT_STATUS(tk_attention_supported(&window, &name), TK_SUCCESS, "");
        cr_assert_str_eq(name, VARIANTS[v]);
    }
    cr_assert_eq(tk_experimental_force_variant("attention", "mma_sm80_packed"), TK_SUCCESS);
    TK_EXPECT_STATUS(tk_attention_supported(&ok, &name), TK_ERROR_NOT_SUPPORTED,
                     "forced variant \"mma_sm80_packed\"");
    /* The Hopper variant takes head dims 64, 128 and 256, not 80 or 96. */
    tk_attention_params d80 = window; /* 8 positions: o [1, 8, 2, 80] stays clear of lse */
    d80.head_dim = 80;
    d80.seqlen_q = d80.seqlen_k = 8;
    cr_assert_eq(tk_experimental_force_variant("attention", "wgmma_sm90"), TK_SUCCESS);
    TK_EXPECT_STATUS(tk_attention_supported(&d80, &name), TK_ERROR_NOT_SUPPORTED,
                     "forced variant \"wgmma_sm90\"");
    tk_experimental_force_variant("attention", NULL);
    tk_attention_params d128 = window; /* 8 positions: o [1, 8, 2, 128] stays clear of lse */
    d128.head_dim = 128;
    d128.seqlen_q = d128.seqlen_k = 8;
    TK_EXPECT_STATUS(tk_attention_supported(&d128, &name), TK_SUCCESS, ""); /* a short window */
    cr_assert_str_eq(name, tk_sm90_runs_here() ? "wgmma_sm90_persistent" : "mma_sm80_packed");
    tk_attention_params d256 = d128; /* 4 positions: o [1, 4, 2, 256] ends where lse starts */
    d256.head_dim = 256;
    d256.seqlen_q = d256.seqlen_k = 4;
    TK_EXPECT_STATUS(tk_attention_supported(&d256, &name), TK_SUCCESS, "");
    if (tk_sm90_runs_here())
        cr_assert_str_eq(name, "wgmma_sm90");
    /* The persistent variant, forced: head dims 64 and 128, where wgmma_sm90 runs. */
    cr_assert_eq(tk_experimental_force_variant("attention", "wgmma_sm90_persistent"), TK_SUCCESS);
    TK_EXPECT_STATUS(tk_attention_supported(&d128, &name), tk_sm90_runs_here() ? TK_SUCCESS : TK_ERROR_NOT_SUPPORTED,
                     tk_sm90_runs_here() ? "" : "forced variant \"wgmma_sm90_persistent\"");
    TK_EXPECT_STATUS(tk_attention_supported(&d256, &name), TK_ERROR_NOT_SUPPORTED,
                     "forced variant \"wgmma_sm90_persistent\"");
    tk_experimental_force_variant("attention", NULL);
    /* The wide variant: head dim 64 under any mask, no other head dim (d128_open, with nothing
     * masked, runs wgmma_sm90). */
    tk_attention_params d128_open = d128;
    d128_open.causal = 0, d128_open.window_left = -1;
    TK_EXPECT_STATUS(tk_attention_supported(&d128_open, &name), TK_SUCCESS, "");
    cr_assert_str_eq(name, tk_sm90_runs_here() ? "wgmma_sm90" : "mma_sm80");
    cr_assert_eq(tk_experimental_force_variant("attention", "wgmma_sm90_wide"), TK_SUCCESS);
    TK_EXPECT_STATUS(tk_attention_supported(&ok, &name), tk_sm90_runs_here() ? TK_SUCCESS : TK_ERROR_NOT_SUPPORTED,
                     tk_sm90_runs_here() ? "" : "forced variant \"wgmma_sm90_wide\"");
    TK_EXPECT_STATUS(tk_attention_supported(&window, &name), tk_sm90_runs_here() ? TK_SUCCESS : TK_ERROR_NOT_SUPPORTED,
                     tk_sm90_runs_here() ? "" : "forced variant \"wgmma_sm90_wide\"");
    TK_EXPECT_STATUS(tk_attention_supported(&d128_open, &name), TK_ERROR_NOT_SUPPORTED,
                     "forced variant \"wgmma_sm90_wide\"");
    TK_EXPECT_STATUS(tk_attention_supported(&d128, &name), TK_ERROR_NOT_SUPPORTED,
                     "forced variant \"wgmma_sm90_wide\""); /* a causal sliding window */
    TK_EXPECT_STATUS(tk_attention_supported(&d256, &name), TK_ERROR_NOT_SUPPORTED,
                     "forced variant \"wgmma_sm90_wide\"");
    tk_experimental_force_variant("attention", NULL);
}

/* The automatic choice names `sm90_name` where the Hopper variants run, else "mma_sm80" (a GQA
 * group of 1 leaves the packed variant out). */
static void expect_choice(const tk_attention_params *p, const char *sm90_name, const char *what) {
    const char *name = NULL;
    TK_EXPECT_STATUS(tk_attention_supported(p, &name), TK_SUCCESS, "");
    const char *expected = tk_sm90_runs_here() ? sm90_name : "mma_sm80";
    cr_assert_str_eq(name, expected, "%s: the automatic choice is %s, expected %s", what, name, expected);
}

/* Which Hopper variant the automatic choice takes at head dim 128 (src/attention.c,
 * persistent_prefers): "wgmma_sm90_persistent" where each query tile meets a short key band (a
 * window bounded on both sides of at most 2048 keys, or documents), "wgmma_sm90" on long bands
 * (dense, causal, one-sided or wider windows, chunks, prefix-LM) and at head dim 256, which the
 * persistent one does not take; "wgmma_sm90_wide" at head dim 64. Forcing either head dim 128
 * variant still runs every call. Never launched: host buffers (S4096, one head, head dim up to
 * 256), so that a window of 1024 or more is bounded. */
Test(attention_gpu, automatic_persistent_for_short_bands) {
    TK_REQUIRE_GPU();
    const int64_t seqlen = 4096;
    const size_t bytes = (size_t)(seqlen * 256) * 2;
    void *q = malloc(bytes), *k = malloc(bytes), *v = malloc(bytes), *o = malloc(bytes);
    int32_t *ids = malloc((size_t)seqlen * sizeof(int32_t));
    cr_assert(q && k && v && o && ids);
    tk_attention_params dense = TK_ATTENTION_PARAMS_INIT;
    dense.dtype = TK_BF16;
    dense.batch = 1;
    dense.seqlen_q = dense.seqlen_k = seqlen;
    dense.heads_q = dense.heads_kv = 1;
    dense.head_dim = 128;
    dense.q = q, dense.k = k, dense.v = v, dense.o = o;
    tk_attention_params causal = dense;
    causal.causal = 1;

    /* short bands: sliding 1024, 1024 on each side, causal and bidirectional documents, sliding
     * 1024 within chunks of 2048 */
    tk_attention_params calls[12];
    const int short_count = 5, call_count = 12;
    calls[0] = causal, calls[0].window_left = 1024;
    calls[1] = dense, calls[1].window_left = 1024, calls[1].window_right = 1024;
    calls[2] = causal, calls[2].document_ids = ids;
    calls[3] = dense, calls[3].document_ids = ids;
    calls[4] = causal, calls[4].window_left = 1024, calls[4].chunk_size = 2048;
    /* long bands: dense, causal, sliding 3000, 2048 + 1, a window on the left only, chunks of
     * 1024 alone, prefix-LM */
    calls[5] = dense;
    calls[6] = causal;
    calls[7] = causal, calls[7].window_left = 3000;
    calls[8] = dense, calls[8].window_left = 2048, calls[8].window_right = 1;
    calls[9] = dense, calls[9].window_left = 1024;
    calls[10] = causal, calls[10].chunk_size = 1024;
    calls[11] = causal, calls[11].prefix_len = 1024;
    for (int i = 0; i < call_count; i++) {
        char what[64];
        snprintf(what, sizeof what, "call %d (a %s band)", i, i < short_count ? "short" : "long");
        expect_choice(&calls[i], i < short_count ? "wgmma_sm90_persistent" : "wgmma_sm90", what);
    }
    tk_attention_params d256 = calls[0], d64 = calls[0];
    d256.head_dim = 256;
    d64.head_dim = 64;
    expect_choice(&d256, "wgmma_sm90", "head dim 256, sliding 1024");
    expect_choice(&d64, "wgmma_sm90_wide", "head dim 64, sliding 1024");

    static const char *const forced[2] = {"wgmma_sm90", "wgmma_sm90_persistent"};
    for (int f = 0; f < 2; f++) {
        cr_assert_eq(tk_experimental_force_variant("attention", forced[f]), TK_SUCCESS);
        for (int i = 0; i < call_count; i++) {
            const char *name = NULL;
            TK_EXPECT_STATUS(tk_attention_supported(&calls[i], &name),
                             tk_sm90_runs_here() ? TK_SUCCESS : TK_ERROR_NOT_SUPPORTED, "forced variant");
            if (tk_sm90_runs_here())
                cr_assert_str_eq(name, forced[f], "call %d forced to %s named %s", i, forced[f], name);
        }
    }
    cr_assert_eq(tk_experimental_force_variant("attention", NULL), TK_SUCCESS);
    free(q); free(k); free(v); free(o); free(ids);
}
