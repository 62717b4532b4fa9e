/* Attention backward: bad input and the fp64 reference against finite differences on the host
 * (run everywhere), then dq, dk, dv against the fp64 gradients of the forward on the GPU, over
 * masks, lengths, GQA, softcap, ALiBi, dtypes, head dims and a strided layout.
 *
 * Accuracy follows FlashAttention-2's backward tests: for each gradient, the largest error
 * against the fp64 reference must be at most twice that of a naive backward in the same
 * precision (ref_attention_bwd with naive = true: a framework's unfused autograd, which rounds
 * P, dP, D and dS to the dtype as the kernel rounds P and dS before its products) plus twice the
 * representation error of the gradient near 0.3. The bound is the forward's rule applied per
 * gradient; it already scales with the extra rounding a backward does (the naive error grows with
 * it), so it is not loosened for the gradients. Rows that see no key must get dq exactly 0 and
 * keys no row sees dk = dv exactly 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/attention_bwd_ref.h"
#include "ref/attention_ref.h"

/* The variants in selection order; each GPU case runs every one that claims it. */
static const char *const VARIANTS[] = {"wgmma_sm90", "mma_sm80_bn128", "mma_sm80_d256", "mma_sm80"};
enum { SM90, BN128, D256, MMA, VARIANT_COUNT };

/* "wgmma_sm90" claims head dim 128, and 64 without softcap, on a machine where the Hopper
 * variants run. */
static bool sm90_claims(int64_t head_dim, float softcap) {
    return (head_dim == 128 || (head_dim == 64 && !(softcap > 0.0f))) && tk_sm90_runs_here();
}

/* ------------------------------------------------------------------ bad input (host) ---- */

/* Fake "device" buffers: host memory with a sentinel; validation must reject before any use.
 * A valid call: q, o, dout [1, 16, 2, 64] and k, v [1, 16, 1, 64] in in_buf, lse [1, 2, 16]
 * and the alibi slopes after them; dq, dk, dv and the workspace in out_buf (bf16, dense). */
static unsigned char in_buf[32768] __attribute__((aligned(16)));
static unsigned char out_buf[32768] __attribute__((aligned(16)));

static void reset_buffers(void) {
    tk_fill_sentinel(in_buf, sizeof in_buf);
    tk_fill_sentinel(out_buf, sizeof out_buf);
}

static tk_attention_bwd_params host_params(void) {
    tk_attention_bwd_params p = TK_ATTENTION_BWD_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.batch = 1;
    p.seqlen_q = 16;
    p.seqlen_k = 16;
    p.heads_q = 2;
    p.heads_kv = 1;
    p.head_dim = 64;
    p.q = in_buf;
    p.k = in_buf + 4096;
    p.v = in_buf + 6144;
    p.o = in_buf + 8192;
    p.dout = in_buf + 12288;
    p.lse = (const float *)(in_buf + 16384);
    p.alibi_slopes = (const float *)(in_buf + 16512);
    p.dq = out_buf;
    p.dk = out_buf + 4096;
    p.dv = out_buf + 6144;
    p.workspace = out_buf + 8192;
    p.workspace_bytes = 16384;
    return p;
}

static void expect_rejected(const tk_attention_bwd_params *p, tk_status status, const char *needle) {
    reset_buffers();
    TK_EXPECT_STATUS(tk_attention_bwd(p, NULL), status, needle);
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s: an output was written", needle);
    cr_assert(tk_is_sentinel(in_buf, sizeof in_buf), "%s: an input was written", needle);
}

#define REJECT(field_assignment, status, needle)     \
    do {                                             \
        tk_attention_bwd_params p_ = ok;             \
        p_.field_assignment;                         \
        expect_rejected(&p_, status, needle);        \
    } while (0)

Test(attention_bwd_args, rejects_bad_arguments) {
    const tk_attention_bwd_params ok = host_params();
    expect_rejected(NULL, TK_ERROR_NULL_POINTER, "'p'");
    REJECT(size = 8, TK_ERROR_INVALID_VALUE, "p->size");
    REJECT(dtype = TK_F32, TK_ERROR_NOT_SUPPORTED, "p->dtype");
    REJECT(batch = -1, TK_ERROR_INVALID_VALUE, "p->batch");
    REJECT(batch = INT64_C(1) << 31, TK_ERROR_NOT_SUPPORTED,
           "p->batch = 2147483648, p->heads_q = 2: more than 2^31 - 1 is not supported");
    REJECT(seqlen_q = 0, TK_ERROR_INVALID_VALUE, "p->seqlen_q");
    REJECT(heads_kv = 3, TK_ERROR_INVALID_VALUE, "p->heads_q = 2 is not a multiple of p->heads_kv");
    REJECT(head_dim = 72, TK_ERROR_NOT_SUPPORTED, "p->head_dim = 72 is not supported");
    REJECT(head_dim = 48, TK_ERROR_NOT_SUPPORTED, "accepted: 64, 80, 96, 128, 256");
    REJECT(softmax_scale = NAN, TK_ERROR_INVALID_VALUE, "p->softmax_scale");
    REJECT(causal = 2, TK_ERROR_INVALID_VALUE, "p->causal");
    REJECT(window_left = -2, TK_ERROR_INVALID_VALUE, "p->window_left");
    REJECT(softcap = -1.0f, TK_ERROR_INVALID_VALUE, "p->softcap");
    REJECT(q = NULL, TK_ERROR_NULL_POINTER, "'p->q'");
    REJECT(o = NULL, TK_ERROR_NULL_POINTER, "'p->o'");
    REJECT(lse = NULL, TK_ERROR_NULL_POINTER, "p->lse is NULL");
    REJECT(dout = NULL, TK_ERROR_NULL_POINTER, "'p->dout'");
    REJECT(dq = NULL, TK_ERROR_NULL_POINTER, "'p->dq'");
    REJECT(dk = NULL, TK_ERROR_NULL_POINTER, "'p->dk'");
    REJECT(dv = NULL, TK_ERROR_NULL_POINTER, "'p->dv'");
    REJECT(workspace = NULL, TK_ERROR_NULL_POINTER, "'p->workspace'");
    REJECT(workspace = out_buf + 8200, TK_ERROR_MISALIGNED, "'p->workspace'");
    REJECT(workspace_bytes = 100, TK_ERROR_INVALID_VALUE, "p->workspace_bytes = 100");
    REJECT(deterministic = 2, TK_ERROR_INVALID_VALUE, "p->deterministic = 2; accepted: 0 or 1");
    REJECT(deterministic = -1, TK_ERROR_INVALID_VALUE, "p->deterministic = -1");
    {
        tk_attention_bwd_params p = ok; /* the atomic path's workspace: no room for the order */
        p.deterministic = 1, p.workspace_bytes = (32 + 32 * 64) * 4 + 112;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->workspace_bytes = 8432 is smaller than the 8464");
    }
    REJECT(dout_strides[3] = 2, TK_ERROR_NOT_SUPPORTED, "p->dout_strides[3]");
    REJECT(dq = out_buf + 2, TK_ERROR_MISALIGNED, "'p->dq'");
    {
        tk_attention_bwd_params p = ok; /* rows of 68 elements: not whole 16-byte chunks */
        p.dk_strides[0] = 2048, p.dk_strides[1] = 68, p.dk_strides[2] = 64, p.dk_strides[3] = 1;
        expect_rejected(&p, TK_ERROR_MISALIGNED, "p->dk_strides[1]");
    }
    {
        tk_attention_bwd_params p = ok; /* every row of dv at one address: written many times */
        p.dv_strides[0] = 0, p.dv_strides[1] = 0, p.dv_strides[2] = 0, p.dv_strides[3] = 1;
        expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->dv_strides");
    }
    REJECT(dq = in_buf + 4096, TK_ERROR_OVERLAP, "'p->dq' overlaps 'p->k'");
    REJECT(dv = out_buf + 4096 + 1024, TK_ERROR_OVERLAP, "'p->dk' overlaps 'p->dv'");
    REJECT(workspace = in_buf + 8192, TK_ERROR_OVERLAP, "'p->workspace' overlaps 'p->o'");
    REJECT(dk = (void *)(in_buf + 16384), TK_ERROR_OVERLAP, "'p->dk' overlaps 'p->lse'");
}

/* The specialised masks by the forward's rules and messages; dsinks required with sinks,
 * aligned, and clear of every other buffer. */
Test(attention_bwd_args, rejects_bad_masks_and_dsinks) {
    tk_attention_bwd_params ok = host_params();
    ok.sinks = (const float *)(in_buf + 16640);
    ok.document_ids = (const int32_t *)(in_buf + 16768);
    ok.dsinks = (float *)(out_buf + 28672);
    REJECT(chunk_size = -1, TK_ERROR_INVALID_VALUE, "p->chunk_size = -1");
    REJECT(prefix_len = 3, TK_ERROR_INVALID_VALUE, "p->prefix_len = 3 needs p->causal = 1");
    REJECT(dsinks = NULL, TK_ERROR_NULL_POINTER, "'p->dsinks'");
    REJECT(dsinks = (float *)(out_buf + 28672 + 2), TK_ERROR_MISALIGNED, "'p->dsinks'");
    REJECT(dsinks = (float *)(in_buf + 16640), TK_ERROR_OVERLAP, "'p->dsinks' overlaps 'p->sinks'");
    REJECT(dsinks = (float *)out_buf, TK_ERROR_OVERLAP, "'p->dsinks' overlaps 'p->dq'");
    REJECT(sinks = (const float *)(in_buf + 16640 + 1), TK_ERROR_MISALIGNED, "'p->sinks'");
    REJECT(dq = (void *)(in_buf + 16768), TK_ERROR_OVERLAP, "overlaps 'p->document_ids'");
    tk_attention_bwd_params p = ok;
    p.sinks = NULL, p.dsinks = NULL; /* dsinks is not read without sinks */
    p.seqlen_q = 17;
    expect_rejected(&p, TK_ERROR_INVALID_VALUE, "p->document_ids needs p->seqlen_q <= p->seqlen_k");
}

/* tk_attention_bwd_workspace_size(p) fails with status, naming needle, and leaves *bytes alone. */
static void expect_size_rejected(const tk_attention_bwd_params *p, tk_status status, const char *needle) {
    size_t bytes;
    tk_fill_sentinel(&bytes, sizeof bytes);
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(p, &bytes), status, needle);
    cr_assert(tk_is_sentinel(&bytes, sizeof bytes), "%s: the workspace size was written on failure", needle);
}

Test(attention_bwd_args, workspace_size) {
    tk_attention_bwd_params p = host_params();
    p.q = p.k = p.v = p.o = p.dout = NULL; /* only the sizes are read */
    size_t bytes = 1;
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(&p, &bytes), TK_SUCCESS, "");
    /* D rows (32 floats), the dq accumulator (32 x 64 floats) and the 112 bytes that let it start
     * on a 128-byte boundary after a 16-byte aligned D. */
    cr_assert_eq(bytes, (size_t)(32 + 32 * 64) * 4 + 112, "workspace %zu bytes", bytes);
    p.seqlen_q = 15; /* 30 rows: D rounded up to 32 floats, each head's accumulator to 16 rows */
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(&p, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, (size_t)(32 + 2 * 16 * 64) * 4 + 112, "workspace %zu bytes", bytes);
    /* deterministic: the ticket counter and one semaphore per 32 rows of each head, in words
     * rounded up to 4: 4 + 2 x 1 -> 8 words; 4 + 2 x 4 = 12 words for 100 rows (112 in the
     * accumulator). */
    p.deterministic = 1;
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(&p, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, (size_t)(32 + 2 * 16 * 64 + 8) * 4 + 112, "workspace %zu bytes", bytes);
    p.seqlen_q = 100;
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(&p, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, (size_t)(200 + 2 * 112 * 64 + 12) * 4 + 112, "workspace %zu bytes", bytes);
    p.deterministic = 2;
    expect_size_rejected(&p, TK_ERROR_INVALID_VALUE, "p->deterministic");
    p.deterministic = 0, p.seqlen_q = 15;
    p.batch = 0;
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(&p, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, 0);
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(&p, NULL), TK_ERROR_NULL_POINTER, "'bytes'");
    expect_size_rejected(NULL, TK_ERROR_NULL_POINTER, "'p'");
    p.batch = -2;
    expect_size_rejected(&p, TK_ERROR_INVALID_VALUE, "p->batch");
    /* The limits that involve batch, as tk_attention_bwd has them: the batch itself, the
     * forward's grid and the backward's row kernels' grid. */
    p.batch = INT64_C(1) << 31;
    expect_size_rejected(&p, TK_ERROR_NOT_SUPPORTED,
                         "p->batch = 2147483648, p->heads_q = 2: more than 2^31 - 1 is not supported");
    p.batch = INT32_MAX;
    expect_size_rejected(&p, TK_ERROR_NOT_SUPPORTED, "batch * heads_q * ceil(seqlen_q / 64)");
    p.batch = INT64_C(1) << 24, p.seqlen_q = 1024;
    expect_size_rejected(&p, TK_ERROR_NOT_SUPPORTED, "exceeds the row kernels' grid limit");
    p.seqlen_q = 15;
    p.batch = 1, p.head_dim = 256; /* the accumulator grows with the head dim, the rest does not */
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(&p, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, (size_t)(32 + 2 * 16 * 256) * 4 + 112, "workspace %zu bytes", bytes);
    p.head_dim = 80;
    TK_EXPECT_STATUS(tk_attention_bwd_workspace_size(&p, &bytes), TK_SUCCESS, "");
    cr_assert_eq(bytes, (size_t)(32 + 2 * 16 * 80) * 4 + 112, "workspace %zu bytes", bytes);
    p.head_dim = 72;
    expect_size_rejected(&p, TK_ERROR_NOT_SUPPORTED, "p->head_dim");
}

Test(attention_bwd_args, empty_batch_is_a_noop) {
    tk_attention_bwd_params p = TK_ATTENTION_BWD_PARAMS_INIT;
    p.batch = 0, p.seqlen_q = 8, p.seqlen_k = 8, p.heads_q = 1, p.heads_kv = 1, p.head_dim = 64;
    TK_EXPECT_STATUS(tk_attention_bwd(&p, NULL), TK_SUCCESS, "");
}

Test(attention_bwd_args, force_variant_names) {
    for (int v = 0; v < VARIANT_COUNT; v++)
        TK_EXPECT_STATUS(tk_experimental_force_variant("attention_bwd", VARIANTS[v]), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_bwd", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("attention_bwd", "mma_sm80_packed"),
                     TK_ERROR_INVALID_VALUE,
                     "\"wgmma_sm90\", \"mma_sm80_bn128\", \"mma_sm80_d256\", \"mma_sm80\"");
}

/* ------------------------------------------------- the reference (host, finite differences) ---- */

/* ref_attention_bwd (exact) against central finite differences of the fp64 forward
 * (ref_attention_row), on a tiny dense shape with GQA (two query heads per key head, so dk and dv
 * are sums over the group): every other test trusts this reference. */
enum { FD_SK = 5, FD_SQ_MAX = FD_SK + 2, FD_HQ = 2, FD_HKV = 1, FD_D = 4 };
enum { FD_NQ = FD_SQ_MAX * FD_HQ * FD_D, FD_NK = FD_SK * FD_HKV * FD_D };

static tk_attention_params fd_params(int64_t seqlen_q) {
    tk_attention_params p = TK_ATTENTION_PARAMS_INIT;
    p.batch = 1;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = FD_SK;
    p.heads_q = FD_HQ;
    p.heads_kv = FD_HKV;
    p.head_dim = FD_D;
    ref_attention_layout(false, 1, seqlen_q, FD_HQ, FD_D, p.q_strides);
    ref_attention_layout(false, 1, seqlen_q, FD_HQ, FD_D, p.o_strides);
    ref_attention_layout(false, 1, FD_SK, FD_HKV, FD_D, p.k_strides);
    ref_attention_layout(false, 1, FD_SK, FD_HKV, FD_D, p.v_strides);
    p.softmax_scale = 0.7f;
    return p;
}

/* L = sum over every row of dout . o, o the exact fp64 forward: dL/dx is the backward of dout. */
static double fd_loss(const tk_attention_params *p, const double *q, const double *k,
                      const double *v, const double *dout, const float *slopes) {
    double o[FD_D], lse, total = 0.0;
    for (int64_t h = 0; h < FD_HQ; h++)
        for (int64_t i = 0; i < p->seqlen_q; i++) {
            ref_attention_row(p, q, k, v, slopes, 0, h, i, false, o, &lse);
            for (int64_t e = 0; e < FD_D; e++)
                total += dout[(i * FD_HQ + h) * FD_D + e] * o[e];
        }
    return total;
}

/* The inputs of a finite-difference check: q, dout, k, v uniform in [-1, 1). */
static void fd_inputs(uint64_t seed, double *q, double *dout, double *k, double *v) {
    tk_rng rng = tk_rng_seeded(seed);
    for (int n = 0; n < FD_NQ; n++) {
        q[n] = tk_rng_uniform(&rng, -1.0, 1.0);
        dout[n] = tk_rng_uniform(&rng, -1.0, 1.0);
    }
    for (int n = 0; n < FD_NK; n++) {
        k[n] = tk_rng_uniform(&rng, -1.0, 1.0);
        v[n] = tk_rng_uniform(&rng, -1.0, 1.0);
    }
}

/* Every input element's gradient against (L(x + eps) - L(x - eps)) / 2 eps; rows that see no key
 * must get dq exactly 0. */
static void check_against_finite_differences(const tk_attention_params *p, const float *slopes) {
    const int nq = (int)(p->seqlen_q * FD_HQ * FD_D);
    double q[FD_NQ], dout[FD_NQ], k[FD_NK], v[FD_NK], dq[FD_NQ], dk[FD_NK], dv[FD_NK];
    fd_inputs(12345, q, dout, k, v);
    ref_attention_bwd(p, q, k, v, dout, slopes, false, dq, dk, dv);
    const struct { double *x, *grad; int n; const char *name; } inputs[3] = {
        {q, dq, nq, "dq"}, {k, dk, FD_NK, "dk"}, {v, dv, FD_NK, "dv"}};
    const double eps = 1e-5;
    for (int t = 0; t < 3; t++)
        for (int n = 0; n < inputs[t].n; n++) {
            const double x = inputs[t].x[n];
            inputs[t].x[n] = x + eps;
            const double up = fd_loss(p, q, k, v, dout, slopes);
            inputs[t].x[n] = x - eps;
            const double down = fd_loss(p, q, k, v, dout, slopes);
            inputs[t].x[n] = x;
            const double fd = (up - down) / (2.0 * eps);
            /* Central differences err by O(eps^2) ~ 1e-10 here, plus the loss's rounding over
             * 2 eps (~1e-11): 1e-7 is far above both and far below any wrong term. */
            cr_assert(fabs(fd - inputs[t].grad[n]) <= 1e-7 + 1e-6 * fabs(fd),
                      "%s[%d]: reference %.12g, finite difference %.12g (causal %d, window "
                      "(%lld, %lld), softcap %g, alibi %d)", inputs[t].name, n, inputs[t].grad[n],
                      fd, p->causal, (long long)p->window_left, (long long)p->window_right,
                      (double)p->softcap, slopes != NULL);
        }
    for (int64_t i = 0; i < p->seqlen_q; i++) {
        bool seen = false;
        for (int64_t j = 0; j < FD_SK; j++)
            seen = seen || ref_attention_visible(p, 0, i, j);
        for (int n = 0; n < FD_HQ * FD_D && !seen; n++)
            cr_assert(dq[i * FD_HQ * FD_D + n] == 0.0, "row %lld sees no key: dq = %g",
                      (long long)i, dq[i * FD_HQ * FD_D + n]);
    }
}

Test(attention_bwd_ref, window_softcap_alibi_match_finite_differences) {
    tk_attention_params p = fd_params(3); /* seqlen_q < seqlen_k: the mask shifts by 2 */
    p.window_left = 2;
    p.window_right = 1;
    const float slopes[FD_HQ] = {0.25f, 0.0625f};
    check_against_finite_differences(&p, NULL);
    check_against_finite_differences(&p, slopes);
    p.softcap = 1.5f;
    check_against_finite_differences(&p, NULL);
    check_against_finite_differences(&p, slopes);
}

/* Chunks, a prefix and documents (host ids over the 5 keys) in the reference's gradients, and
 * the sinks' gradient -sum_i exp(sink - lse_i) (dout_i . o_i) against finite differences of
 * the loss in each sink logit. */
Test(attention_bwd_ref, chunk_prefix_documents_sinks_match_finite_differences) {
    tk_attention_params p = fd_params(4);
    p.causal = 1;
    p.chunk_size = 2;
    check_against_finite_differences(&p, NULL);
    p.causal = 0, p.window_right = 1; /* bidirectional chunks with a window */
    check_against_finite_differences(&p, NULL);
    p = fd_params(5);
    p.causal = 1, p.prefix_len = 3;
    check_against_finite_differences(&p, NULL);
    const int32_t ids[FD_SK] = {0, 0, 1, 1, 1};
    p = fd_params(4);
    p.document_ids = ids;
    check_against_finite_differences(&p, NULL);
    p.causal = 1;
    check_against_finite_differences(&p, NULL);

    float sinks[FD_HQ] = {0.5f, -1.0f};
    p = fd_params(FD_SQ_MAX); /* causal: the first two rows see only the sink */
    p.causal = 1;
    p.sinks = sinks;
    check_against_finite_differences(&p, NULL);
    double q[FD_NQ], dout[FD_NQ], k[FD_NK], v[FD_NK], dsinks[FD_HQ];
    fd_inputs(777, q, dout, k, v);
    ref_attention_dsinks(&p, q, k, v, dout, NULL, dsinks);
    const float eps = 1.0f / 1024.0f; /* exact in f32 around these sinks */
    for (int h = 0; h < FD_HQ; h++) {
        const float x = sinks[h];
        sinks[h] = x + eps;
        const double up = fd_loss(&p, q, k, v, dout, NULL);
        sinks[h] = x - eps;
        const double down = fd_loss(&p, q, k, v, dout, NULL);
        sinks[h] = x;
        const double fd = (up - down) / (2.0 * (double)eps);
        /* The O(eps^2) error of central differences is ~1e-7 here. */
        cr_assert(fabs(fd - dsinks[h]) <= 1e-5 + 1e-4 * fabs(fd), "dsinks[%d]: reference %.12g, finite difference %.12g",
                  h, dsinks[h], fd);
    }
}

Test(attention_bwd_ref, causal_bottom_right_matches_finite_differences) {
    tk_attention_params p = fd_params(3);
    p.causal = 1;
    check_against_finite_differences(&p, NULL);
    p.window_left = 1; /* a causal sliding window */
    check_against_finite_differences(&p, NULL);
}

/* seqlen_q > seqlen_k under bottom-right causal masking: the first two rows see no key, so their
 * dq is 0 and they add nothing to dk, dv (the finite differences of those are checked too). */
Test(attention_bwd_ref, rows_that_see_no_key_match_finite_differences) {
    tk_attention_params p = fd_params(FD_SQ_MAX);
    p.causal = 1;
    cr_assert(!ref_attention_visible(&p, 0, 1, 0) && ref_attention_visible(&p, 0, 2, 0));
    check_against_finite_differences(&p, NULL);
    p.softcap = 1.5f;
    const float slopes[FD_HQ] = {0.25f, 0.0625f};
    check_against_finite_differences(&p, slopes);
}

/* ------------------------------------------------------------------------ GPU checks ---- */

typedef struct bwd_case {
    tk_dtype dtype;
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    bool bhsd; /* [B, H, S, D] buffers with padded rows through strides; else dense */
    int causal;
    int64_t window_left, window_right;
    float softcap;
    bool alibi;
    bool sinks; /* sink logits uniform in [-2, 4): dsinks checked too */
    int64_t chunk, prefix;
    int64_t doc_len; /* > 0: document ids (ref_attention_doc_ids) */
} bwd_case;

static void case_name(const bwd_case *c, char *out, size_t size) {
    snprintf(out, size, "%s B%lld Sq%lld Sk%lld H%lld/%lld D%lld %s causal %d window (%lld, %lld) softcap %g%s%s "
             "chunk %lld prefix %lld docs %lld",
             tk_test_dtype_name(c->dtype), (long long)c->batch, (long long)c->seqlen_q,
             (long long)c->seqlen_k, (long long)c->heads_q, (long long)c->heads_kv,
             (long long)c->head_dim, c->bhsd ? "BHSD" : "BSHD", c->causal,
             (long long)c->window_left, (long long)c->window_right, (double)c->softcap,
             c->alibi ? " alibi" : "", c->sinks ? " sinks" : "", (long long)c->chunk,
             (long long)c->prefix, (long long)c->doc_len);
}

/* Strides of a [batch, seq, heads, head_dim] tensor in the case's layout, and its element
 * count (ref_attention_layout). */
static int64_t layout_strides(const bwd_case *c, int64_t seq, int64_t heads, int64_t st[4]) {
    return ref_attention_layout(c->bhsd, c->batch, seq, heads, c->head_dim, st);
}

/* One gradient: got (the layout's strides st) against exact and naive (dense). seen(s, h) says
 * whether the row (query or key) s of head h has any visible partner; unseen rows must be 0.
 * A failure is appended to fails (size bytes) rather than asserted, so that the caller reports
 * dq, dk and dv together: which of them are wrong tells a dQ reduction bug (dq only) from a
 * wrong P or dS (all three; mma_sm80_d256 once lost its dS^T / P^T stores, and dq, checked
 * first, hid that dk and dv were wrong too). */
static void check_gradient(const bwd_case *c, const tk_attention_params *ref, const char *name,
                           const void *got, const int64_t st[4], const double *exact, const double *naive,
                           int64_t seq, int64_t heads, bool keys, char *fails, size_t size) {
    const int64_t d = c->head_dim;
    double err = 0.0, err_naive = 0.0, atol = 0.0;
    int64_t bad = 0, nonzero = 0;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t s = 0; s < seq; s++) {
            bool seen = false;
            for (int64_t x = 0; x < (keys ? c->seqlen_q : c->seqlen_k) && !seen; x++)
                seen = keys ? ref_attention_visible(ref, b, x, s) : ref_attention_visible(ref, b, s, x);
            for (int64_t h = 0; h < heads; h++)
                for (int64_t e = 0; e < d; e++) {
                    const double g = tk_test_load(c->dtype, got, b * st[0] + s * st[1] + h * st[2] + e);
                    const int64_t i = ((b * seq + s) * heads + h) * d + e;
                    if (!isfinite(g)) {
                        bad++;
                        continue;
                    }
                    if (!seen)
                        nonzero += g != 0.0;
                    err = fmax(err, fabs(g - exact[i]));
                    err_naive = fmax(err_naive, fabs(naive[i] - exact[i]));
                    atol = fmax(atol, ref_attention_representation_term(c->dtype, exact[i]));
                }
        }
    const size_t used = strlen(fails);
    if (bad != 0)
        snprintf(fails + used, size - used, "; %lld non-finite %s values", (long long)bad, name);
    else if (nonzero != 0)
        snprintf(fails + used, size - used, "; %lld %s values of unseen rows are not 0", (long long)nonzero, name);
    else if (!(err <= 2.0 * err_naive + atol))
        snprintf(fails + used, size - used, "; max |%s - ref| = %.3g > 2 x naive error %.3g + %.3g", name, err,
                 err_naive, atol);
}

/* dsinks: the kernel sums -exp(sink - lse_i) D_i over the forward's stored o and lse in f32, so
 * it is held to that sum recomputed in fp64 from the same stored values (within the f32
 * rounding of a sum of that many terms), and that sum to the fp64 reference's dsinks within
 * the forward's error on o (the accuracy rule's bound, 2 x the representation term per
 * element, weighted by |dout|), plus 0.1 % of the terms' magnitude. */
static void check_dsinks(const bwd_case *c, const char *what, const tk_attention_params *ref, const double *q,
                         const double *k, const double *v, const double *dout, const float *slopes,
                         const void *o_dev, const void *lse_dev, const void *dsinks_dev) {
    const int64_t hq = c->heads_q, d = c->head_dim, rows = c->batch * hq * c->seqlen_q;
    const size_t es = tk_test_dtype_size(c->dtype);
    int64_t st[4];
    const int64_t n = layout_strides(c, c->seqlen_q, hq, st);
    void *o = malloc((size_t)n * es);
    float *lse = malloc((size_t)rows * sizeof(float)), got[64];
    double exact[64];
    cr_assert(o && lse && hq <= 64);
    tk_to_host(o, o_dev, (size_t)n * es);
    tk_to_host(lse, lse_dev, (size_t)rows * sizeof(float));
    tk_to_host(got, dsinks_dev, (size_t)hq * sizeof(float));
    ref_attention_dsinks(ref, q, k, v, dout, slopes, exact);
    for (int64_t h = 0; h < hq; h++) {
        double stored = 0.0, magnitude = 0.0, rounding = 0.0;
        for (int64_t b = 0; b < c->batch; b++)
            for (int64_t i = 0; i < c->seqlen_q; i++) {
                const int64_t row = b * st[0] + i * st[1] + h * st[2];
                const double ps = exp((double)ref->sinks[h] - lse[(b * hq + h) * c->seqlen_q + i]);
                double dsum = 0.0, dmag = 0.0;
                for (int64_t e = 0; e < d; e++) {
                    const double oe = tk_test_load(c->dtype, o, row + e);
                    const double g = dout[row + e];
                    dsum += g * oe;
                    dmag += fabs(g) * 2.0 * ref_attention_representation_term(c->dtype, oe);
                }
                stored -= ps * dsum;
                magnitude += ps * fabs(dsum);
                rounding += ps * dmag;
            }
        cr_assert(isfinite(got[h]) && fabs(got[h] - stored) <= 1e-5 * (magnitude + 1.0),
                  "%s: dsinks[%lld] = %.8g, the stored o and lse give %.8g", what, (long long)h,
                  (double)got[h], stored);
        cr_assert(fabs(stored - exact[h]) <= rounding + 1e-3 * (magnitude + 1.0),
                  "%s: dsinks[%lld] of the stored o %.8g, fp64 reference %.8g (bound %.3g)", what,
                  (long long)h, stored, exact[h], rounding);
    }
    free(o);
    free(lse);
}

/* The forward, then with every variant forced the backward `runs` times (deterministic as
 * given, the workspace ws_offset bytes into its allocation), each run on poisoned gradients and
 * workspace, each later run bit-identical to the first, whose gradients are checked against the
 * fp64 reference (computed once). */
static void run_case_runs(const bwd_case *c, uint64_t seed, int deterministic, int runs,
                          size_t ws_offset) {
    char what[320];
    case_name(c, what, sizeof what);
    tk_rng rng = tk_rng_seeded(seed);
    tk_attention_params f = TK_ATTENTION_PARAMS_INIT;
    f.dtype = c->dtype;
    f.batch = c->batch;
    f.seqlen_q = c->seqlen_q;
    f.seqlen_k = c->seqlen_k;
    f.heads_q = c->heads_q;
    f.heads_kv = c->heads_kv;
    f.head_dim = c->head_dim;
    f.causal = c->causal;
    f.window_left = c->window_left;
    f.window_right = c->window_right;
    f.softcap = c->softcap;
    f.return_lse = 1;
    f.chunk_size = c->chunk;
    f.prefix_len = c->prefix;
    tk_attention_params ref = f;
    const int64_t nq = layout_strides(c, c->seqlen_q, c->heads_q, ref.q_strides);
    const int64_t nk = layout_strides(c, c->seqlen_k, c->heads_kv, ref.k_strides);
    layout_strides(c, c->seqlen_k, c->heads_kv, ref.v_strides);
    layout_strides(c, c->seqlen_q, c->heads_q, ref.o_strides);
    if (c->bhsd) {
        memcpy(f.q_strides, ref.q_strides, sizeof f.q_strides);
        memcpy(f.k_strides, ref.k_strides, sizeof f.k_strides);
        memcpy(f.v_strides, ref.v_strides, sizeof f.v_strides);
        memcpy(f.o_strides, ref.o_strides, sizeof f.o_strides);
    }
    const size_t es = tk_test_dtype_size(c->dtype);
    const int64_t n_lse = c->batch * c->heads_q * c->seqlen_q;
    void *hq = malloc((size_t)nq * es), *hk = malloc((size_t)nk * es), *hv = malloc((size_t)nk * es);
    void *hdo = malloc((size_t)nq * es), *hdq = malloc((size_t)nq * es);
    void *hdk = malloc((size_t)nk * es), *hdv = malloc((size_t)nk * es);
    float *hslopes = malloc((size_t)c->heads_q * sizeof(float));
    cr_assert(hq && hk && hv && hdo && hdq && hdk && hdv && hslopes);
    tk_fill_uniform(&rng, c->dtype, hq, nq, -1.0, 1.0);
    tk_fill_uniform(&rng, c->dtype, hk, nk, -1.0, 1.0);
    tk_fill_uniform(&rng, c->dtype, hv, nk, -1.0, 1.0);
    tk_fill_uniform(&rng, c->dtype, hdo, nq, -1.0, 1.0);
    for (int64_t h = 0; h < c->heads_q; h++)
        hslopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)c->heads_q);
    float *hsinks = malloc((size_t)c->heads_q * sizeof(float));
    float *hdsinks = malloc((size_t)c->heads_q * sizeof(float));
    cr_assert(hsinks && hdsinks);
    for (int64_t h = 0; h < c->heads_q; h++)
        hsinks[h] = (float)tk_rng_uniform(&rng, -2.0, 4.0);
    int32_t *hids = c->doc_len > 0 ? ref_attention_doc_ids(c->batch, c->seqlen_k, c->doc_len) : NULL;
    const size_t ids_bytes = (size_t)(c->batch * c->seqlen_k) * sizeof(int32_t);
    void *sinks = tk_dev_alloc((size_t)c->heads_q * sizeof(float));
    void *dsinks = tk_dev_alloc((size_t)c->heads_q * sizeof(float));
    void *ids = tk_dev_alloc(ids_bytes);
    tk_to_dev(sinks, hsinks, (size_t)c->heads_q * sizeof(float));
    if (hids)
        tk_to_dev(ids, hids, ids_bytes);
    f.sinks = c->sinks ? sinks : NULL;
    f.document_ids = hids ? ids : NULL;
    ref.sinks = c->sinks ? hsinks : NULL;
    ref.document_ids = hids;

    void *dq = tk_dev_alloc((size_t)nq * es), *dk = tk_dev_alloc((size_t)nk * es);
    void *dv = tk_dev_alloc((size_t)nk * es), *dout = tk_dev_alloc((size_t)nq * es);
    void *o = tk_dev_alloc((size_t)nq * es), *lse = tk_dev_alloc((size_t)n_lse * sizeof(float));
    void *gq = tk_dev_alloc((size_t)nq * es), *gk = tk_dev_alloc((size_t)nk * es);
    void *gv = tk_dev_alloc((size_t)nk * es);
    void *slopes = tk_dev_alloc((size_t)c->heads_q * sizeof(float));
    tk_to_dev(dq, hq, (size_t)nq * es);
    tk_to_dev(dk, hk, (size_t)nk * es);
    tk_to_dev(dv, hv, (size_t)nk * es);
    tk_to_dev(dout, hdo, (size_t)nq * es);
    tk_to_dev(slopes, hslopes, (size_t)c->heads_q * sizeof(float));
    tk_dev_poison(o, (size_t)nq * es);
    tk_dev_poison(gq, (size_t)nq * es);
    tk_dev_poison(gk, (size_t)nk * es);
    tk_dev_poison(gv, (size_t)nk * es);
    f.q = dq, f.k = dk, f.v = dv, f.o = o, f.lse = lse;
    f.alibi_slopes = c->alibi ? slopes : NULL;
    cr_assert_eq(tk_test_attention_fwd(&f, -1, NULL), TK_SUCCESS, "%s: forward: %s", what, tk_last_error());

    tk_attention_bwd_params p = TK_ATTENTION_BWD_PARAMS_INIT;
    p.dtype = c->dtype;
    p.q = dq, p.k = dk, p.v = dv, p.o = o, p.lse = lse, p.dout = dout;
    p.dq = gq, p.dk = gk, p.dv = gv;
    p.batch = c->batch, p.seqlen_q = c->seqlen_q, p.seqlen_k = c->seqlen_k;
    p.heads_q = c->heads_q, p.heads_kv = c->heads_kv, p.head_dim = c->head_dim;
    memcpy(p.q_strides, f.q_strides, sizeof p.q_strides);
    memcpy(p.k_strides, f.k_strides, sizeof p.k_strides);
    memcpy(p.v_strides, f.v_strides, sizeof p.v_strides);
    memcpy(p.o_strides, f.o_strides, sizeof p.o_strides);
    memcpy(p.dout_strides, f.o_strides, sizeof p.dout_strides);
    memcpy(p.dq_strides, f.q_strides, sizeof p.dq_strides);
    memcpy(p.dk_strides, f.k_strides, sizeof p.dk_strides);
    memcpy(p.dv_strides, f.v_strides, sizeof p.dv_strides);
    p.causal = c->causal, p.window_left = c->window_left, p.window_right = c->window_right;
    p.softcap = c->softcap;
    p.alibi_slopes = f.alibi_slopes;
    p.sinks = f.sinks, p.dsinks = dsinks;
    p.chunk_size = c->chunk, p.prefix_len = c->prefix, p.document_ids = f.document_ids;
    p.deterministic = deterministic;
    size_t ws_bytes = 0;
    cr_assert_eq(tk_attention_bwd_workspace_size(&p, &ws_bytes), TK_SUCCESS, "%s", tk_last_error());
    void *ws_alloc = tk_dev_alloc(ws_bytes + ws_offset);
    void *ws = (unsigned char *)ws_alloc + ws_offset;
    p.workspace = ws, p.workspace_bytes = ws_bytes;

    double *q64 = ref_to_double(c->dtype, hq, nq), *k64 = ref_to_double(c->dtype, hk, nk);
    double *v64 = ref_to_double(c->dtype, hv, nk), *do64 = ref_to_double(c->dtype, hdo, nq);
    const size_t dense_q = (size_t)(c->batch * c->seqlen_q * c->heads_q * c->head_dim);
    const size_t dense_k = (size_t)(c->batch * c->seqlen_k * c->heads_kv * c->head_dim);
    double *eq = malloc(dense_q * sizeof(double)), *nq64 = malloc(dense_q * sizeof(double));
    double *ek = malloc(dense_k * sizeof(double)), *nk64 = malloc(dense_k * sizeof(double));
    double *ev = malloc(dense_k * sizeof(double)), *nv64 = malloc(dense_k * sizeof(double));
    cr_assert(eq && nq64 && ek && nk64 && ev && nv64);
    const float *host_slopes = c->alibi ? hslopes : NULL;
    ref_attention_bwd(&ref, q64, k64, v64, do64, host_slopes, false, eq, ek, ev);
    ref_attention_bwd(&ref, q64, k64, v64, do64, host_slopes, true, nq64, nk64, nv64);

    /* Each variant forced: those that claim the call run it `runs` times on poisoned gradients,
     * workspace and dsinks, every run bit-identical to the first, whose gradients are checked;
     * the others must refuse it, and the call with none forced too if none claims it. */
    tk_device_info info = TK_DEVICE_INFO_INIT;
    cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
    const bool d256 = c->head_dim == 256;
    const bool claims[VARIANT_COUNT] = {
        [SM90] = sm90_claims(c->head_dim, c->softcap),
        [BN128] = !d256 && tk_attention_bwd_bn128_smem(c->head_dim) <= info.max_smem_per_block,
        [D256] = d256 && tk_attention_bwd_d256_smem() <= info.max_smem_per_block, [MMA] = !d256};
    if (!claims[SM90] && !claims[BN128] && !claims[D256] && !claims[MMA]) {
        cr_assert_eq(tk_experimental_force_variant("attention_bwd", NULL), TK_SUCCESS);
        TK_EXPECT_STATUS(tk_attention_bwd(&p, NULL), TK_ERROR_NOT_SUPPORTED, "no variant");
    }
    void *rdq = malloc((size_t)nq * es), *rdk = malloc((size_t)nk * es), *rdv = malloc((size_t)nk * es);
    cr_assert(rdq && rdk && rdv);
    for (int v = 0; v < VARIANT_COUNT; v++) {
        char run_what[400];
        snprintf(run_what, sizeof run_what, "%s deterministic %d workspace +%zu %s", what, deterministic,
                 ws_offset, VARIANTS[v]);
        cr_assert_eq(tk_experimental_force_variant("attention_bwd", VARIANTS[v]), TK_SUCCESS);
        if (!claims[v]) {
            TK_EXPECT_STATUS(tk_attention_bwd(&p, NULL), TK_ERROR_NOT_SUPPORTED, VARIANTS[v]);
            continue;
        }
        for (int r = 0; r < runs; r++) {
            tk_dev_poison(gq, (size_t)nq * es);
            tk_dev_poison(gk, (size_t)nk * es);
            tk_dev_poison(gv, (size_t)nk * es);
            tk_dev_poison(ws, ws_bytes);
            tk_dev_poison(dsinks, (size_t)c->heads_q * sizeof(float));
            cr_assert_eq(tk_attention_bwd(&p, NULL), TK_SUCCESS, "%s: run %d: %s", run_what, r, tk_last_error());
            cr_assert_str_eq(tk_last_variant(), VARIANTS[v], "%s ran %s", run_what, tk_last_variant());
            tk_dev_sync();
            tk_to_host(r == 0 ? hdq : rdq, gq, (size_t)nq * es);
            tk_to_host(r == 0 ? hdk : rdk, gk, (size_t)nk * es);
            tk_to_host(r == 0 ? hdv : rdv, gv, (size_t)nk * es);
            if (r == 0)
                continue;
            const bool same_q = memcmp(rdq, hdq, (size_t)nq * es) == 0;
            const bool same_k = memcmp(rdk, hdk, (size_t)nk * es) == 0;
            const bool same_v = memcmp(rdv, hdv, (size_t)nk * es) == 0;
            cr_assert(same_q && same_k && same_v, "%s: run %d's%s%s%s differ from run 0's", run_what, r,
                      same_q ? "" : " dq", same_k ? "" : " dk", same_v ? "" : " dv");
        }
        int64_t st[4];
        layout_strides(c, c->seqlen_q, c->heads_q, st);
        char fails[512] = "";
        check_gradient(c, &ref, "dq", hdq, st, eq, nq64, c->seqlen_q, c->heads_q, false, fails, sizeof fails);
        layout_strides(c, c->seqlen_k, c->heads_kv, st);
        check_gradient(c, &ref, "dk", hdk, st, ek, nk64, c->seqlen_k, c->heads_kv, true, fails, sizeof fails);
        check_gradient(c, &ref, "dv", hdv, st, ev, nv64, c->seqlen_k, c->heads_kv, true, fails, sizeof fails);
        cr_assert(fails[0] == '\0', "%s%s", run_what, fails);
        if (c->sinks)
            check_dsinks(c, run_what, &ref, q64, k64, v64, do64, host_slopes, o, lse, dsinks);
    }
    /* Unforced, the first variant of the table (VARIANTS' order) that claims the call runs it. */
    cr_assert_eq(tk_experimental_force_variant("attention_bwd", NULL), TK_SUCCESS);
    for (int v = 0; v < VARIANT_COUNT; v++)
        if (claims[v]) {
            cr_assert_eq(tk_attention_bwd(&p, NULL), TK_SUCCESS, "%s: %s", what, tk_last_error());
            cr_assert_str_eq(tk_last_variant(), VARIANTS[v], "%s: the automatic choice ran %s", what,
                             tk_last_variant());
            break;
        }
    free(rdq); free(rdk); free(rdv);

    free(q64); free(k64); free(v64); free(do64);
    free(eq); free(nq64); free(ek); free(nk64); free(ev); free(nv64);
    free(hq); free(hk); free(hv); free(hdo); free(hdq); free(hdk); free(hdv); free(hslopes);
    free(hsinks); free(hdsinks); free(hids);
    tk_dev_free(dq); tk_dev_free(dk); tk_dev_free(dv); tk_dev_free(dout); tk_dev_free(o);
    tk_dev_free(lse); tk_dev_free(gq); tk_dev_free(gk); tk_dev_free(gv); tk_dev_free(slopes);
    tk_dev_free(ws_alloc); tk_dev_free(sinks); tk_dev_free(dsinks); tk_dev_free(ids);
}

static void run_case(const bwd_case *c, uint64_t seed) {
    run_case_runs(c, seed, 0, 1, 0);
}

/* run_case over a table of cases, case i with seed seed0 + i. */
#define RUN_CASES(cases, seed0)                                                                    \
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases)[0]; i++)                                  \
        run_case(&(cases)[i], (seed0) + i)

static const bwd_case MASK_CASES[] = {
    /* dense, both lengths ragged against the 64- and 128-key and the query tiles */
    {TK_BF16, 2, 130, 130, 4, 4, 64, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    /* causal, seqlen_q < seqlen_k */
    {TK_BF16, 1, 100, 150, 2, 2, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    /* causal, seqlen_q > seqlen_k: the first 60 rows see no key */
    {TK_F16, 1, 150, 90, 2, 1, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    /* a window on both sides */
    {TK_BF16, 1, 200, 200, 2, 2, 64, false, 0, 32, 16, 0.0f, false, false, 0, 0, 0},
    /* causal sliding window, seqlen_q < seqlen_k: keys before 150 - 10 are never seen */
    {TK_BF16, 1, 40, 200, 2, 2, 128, false, 1, 10, -1, 0.0f, false, false, 0, 0, 0},
    /* fewer keys than one warp's 16 (the other warps' keys all past the end), one key, and
     * one key in a second 128-key tile */
    {TK_BF16, 1, 300, 13, 4, 2, 64, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 70, 1, 2, 1, 128, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 129, 129, 2, 1, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    /* seqlen_k below 64, causal with seqlen_q > seqlen_k, GQA group 3 */
    {TK_F16, 2, 45, 40, 6, 2, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    /* lengths at whole 128-key and query tiles, causal, GQA group 4 */
    {TK_BF16, 1, 256, 256, 4, 1, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
};

Test(attention_bwd_gpu, masks_and_lengths, .timeout = 600) {
    TK_REQUIRE_GPU();
    RUN_CASES(MASK_CASES, 100);
}

static const bwd_case GQA_CASES[] = {
    /* GQA, group 4: dk, dv summed over 4 query heads */
    {TK_BF16, 1, 96, 96, 8, 2, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    /* MQA */
    {TK_F16, 2, 70, 70, 3, 1, 64, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    /* softcap */
    {TK_F16, 1, 80, 80, 2, 2, 128, false, 0, -1, -1, 30.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 80, 120, 2, 1, 64, false, 1, -1, -1, 5.0f, false, false, 0, 0, 0},
    /* ALiBi */
    {TK_BF16, 1, 120, 120, 4, 2, 64, false, 1, -1, -1, 0.0f, true, false, 0, 0, 0},
    /* head dim 128 (two warps per 32 keys, P^T and dS^T traded between them): softcap and ALiBi,
     * fewer rows than half a 64-row query tile (one warp of each pair sees none) and keys that
     * end inside a warp's second 16 */
    {TK_F16, 1, 20, 27, 4, 2, 128, false, 1, -1, -1, 7.0f, true, false, 0, 0, 0},
    {TK_BF16, 2, 50, 90, 2, 1, 128, false, 0, -1, -1, 12.0f, false, false, 0, 0, 0},
    /* [B, H, S, D] strided, f16 and bf16 */
    {TK_BF16, 2, 70, 130, 2, 2, 128, true, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 65, 65, 2, 1, 128, true, 1, 20, -1, 0.0f, true, false, 0, 0, 0},
};

Test(attention_bwd_gpu, gqa_softcap_alibi_layouts, .timeout = 600) {
    TK_REQUIRE_GPU();
    RUN_CASES(GQA_CASES, 200);
}

/* Chunked local, prefix-LM, documents and sinks (with dsinks), with windows, GQA, softcap and
 * ALiBi, lengths that cut the key (64, 128) and query tiles, chunks and documents anywhere. */
static const bwd_case SPECIALISED_CASES[] = {
    {TK_BF16, 1, 200, 200, 4, 2, 128, false, 1, -1, -1, 0.0f, false, false, 48, 0, 0},
    {TK_F16, 2, 130, 190, 2, 2, 64, true, 0, -1, -1, 0.0f, true, false, 70, 0, 0},
    {TK_BF16, 1, 150, 100, 2, 1, 64, false, 1, 20, -1, 0.0f, false, false, 32, 0, 0},
    {TK_BF16, 2, 160, 160, 2, 2, 64, false, 1, -1, -1, 0.0f, false, false, 0, 90, 0},
    {TK_F16, 1, 120, 200, 4, 2, 128, false, 1, -1, -1, 10.0f, false, false, 0, 150, 0},
    {TK_BF16, 2, 200, 200, 2, 1, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 45},
    {TK_BF16, 1, 150, 230, 4, 2, 128, false, 0, 30, 10, 0.0f, true, false, 40, 0, 60},
    {TK_BF16, 2, 180, 180, 4, 2, 64, false, 1, -1, -1, 0.0f, false, true, 0, 0, 0},
    {TK_F16, 1, 150, 90, 2, 1, 128, false, 1, -1, -1, 0.0f, false, true, 0, 0, 0},
    {TK_BF16, 1, 200, 200, 8, 2, 64, false, 1, 37, -1, 20.0f, true, true, 0, 0, 0},
    {TK_BF16, 2, 170, 170, 2, 2, 128, false, 1, -1, -1, 0.0f, false, true, 0, 0, 50},
    {TK_BF16, 1, 160, 160, 2, 1, 128, false, 0, -1, -1, 0.0f, false, false, 0, 0, 1}, /* a document per key */
    {TK_BF16, 1, 130, 130, 2, 1, 256, false, 1, -1, -1, 0.0f, false, false, 0, 0, 1},
    {TK_BF16, 1, 300, 300, 4, 2, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 250}, /* across key tiles */
    {TK_F16, 1, 257, 257, 2, 1, 64, false, 0, -1, -1, 0.0f, false, false, 0, 0, 40}, /* a 1-key band */
};

Test(attention_bwd_gpu, specialised_masks, .timeout = 600) {
    TK_REQUIRE_GPU();
    RUN_CASES(SPECIALISED_CASES, 300);
}

/* Head dim 64 on Hopper ("wgmma_sm90": 128 keys per CTA, 128 query rows per step, each consumer
 * warpgroup's dQ block 64 of those rows): lengths that cut the 128-row query tiles inside either
 * warpgroup's half (rows 64 .. 127 past seqlen_q: that warpgroup adds nothing), fewer than 64
 * rows, several query and key tiles, dense and causal either way round, GQA and MQA, windows,
 * ALiBi, a strided layout, the specialised masks, and softcap (which the Hopper plan at 64 leaves
 * to the portable kernel: declined there when forced). Off Hopper, the portable kernels run them. */
static const bwd_case D64_CASES[] = {
    {TK_BF16, 1, 200, 300, 4, 2, 64, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 2, 45, 64, 2, 1, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 129, 129, 2, 2, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 330, 250, 8, 2, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 256, 384, 3, 1, 64, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 300, 260, 2, 2, 64, false, 0, 40, 24, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 200, 400, 2, 1, 64, false, 1, 70, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 2, 190, 190, 4, 2, 64, true, 1, -1, -1, 0.0f, true, false, 0, 0, 0},
    {TK_BF16, 1, 260, 260, 4, 2, 64, false, 1, -1, -1, 0.0f, false, true, 48, 0, 0},
    {TK_BF16, 1, 230, 230, 2, 1, 64, false, 1, -1, -1, 0.0f, true, false, 0, 100, 0},
    {TK_F16, 1, 270, 270, 2, 2, 64, false, 1, 50, -1, 0.0f, false, false, 0, 0, 90},
    {TK_BF16, 1, 150, 150, 2, 1, 64, false, 1, -1, -1, 15.0f, false, false, 0, 0, 0},
};

Test(attention_bwd_gpu, head_dim_64, .timeout = 600) {
    TK_REQUIRE_GPU();
    RUN_CASES(D64_CASES, 800);
}

/* Head dim 256 ("mma_sm80_d256": two warps per key, 64 keys per CTA): dense and causal with
 * lengths that cut the 64-key and 32-row tiles, seqlen_q above and below seqlen_k, fewer keys
 * than one key group's 16, GQA and MQA, windows, softcap, ALiBi, a strided layout, and the
 * specialised masks with sinks. */
static const bwd_case D256_CASES[] = {
    {TK_BF16, 2, 130, 130, 4, 4, 256, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 100, 150, 2, 2, 256, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 150, 90, 2, 1, 256, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 96, 96, 8, 2, 256, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 200, 200, 2, 2, 256, false, 0, 32, 16, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 70, 13, 3, 1, 256, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 65, 65, 2, 1, 256, true, 1, 20, -1, 30.0f, true, false, 0, 0, 0},
    {TK_BF16, 1, 150, 230, 4, 2, 256, false, 0, 30, 10, 0.0f, true, false, 40, 0, 60},
    {TK_F16, 1, 120, 200, 4, 2, 256, false, 1, -1, -1, 10.0f, false, false, 0, 150, 0},
    {TK_BF16, 2, 100, 100, 4, 2, 256, false, 1, -1, -1, 0.0f, false, true, 0, 0, 0},
};

Test(attention_bwd_gpu, head_dim_256, .timeout = 600) {
    TK_REQUIRE_GPU();
    RUN_CASES(D256_CASES, 500);
}

/* Head dims 80 and 96 (rows of 11 and 13 16-byte chunks; dQ blocks of 40 and 24 columns, an odd
 * number of n8 tiles): the 64- and 128-key tiles and the 32- and 64-row query tiles cut, seqlen_q
 * above and below seqlen_k, fewer keys than 16, GQA and MQA, windows, softcap, ALiBi, strided
 * layouts, and the specialised masks with sinks. */
static const bwd_case D80_96_CASES[] = {
    {TK_BF16, 2, 130, 130, 4, 4, 80, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 100, 150, 2, 2, 96, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 150, 90, 2, 1, 80, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 96, 96, 8, 2, 96, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 200, 200, 2, 2, 80, false, 0, 32, 16, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 70, 13, 3, 1, 96, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 65, 65, 2, 1, 80, true, 1, 20, -1, 30.0f, true, false, 0, 0, 0},
    {TK_BF16, 2, 70, 130, 2, 2, 96, true, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 150, 230, 4, 2, 96, false, 0, 30, 10, 0.0f, true, false, 40, 0, 60},
    {TK_F16, 1, 120, 200, 4, 2, 80, false, 1, -1, -1, 10.0f, false, false, 0, 150, 0},
    {TK_BF16, 2, 100, 100, 4, 2, 96, false, 1, -1, -1, 0.0f, false, true, 0, 0, 0},
    {TK_BF16, 1, 129, 129, 2, 1, 80, false, 1, -1, -1, 0.0f, false, true, 0, 0, 50},
};

Test(attention_bwd_gpu, head_dims_80_96, .timeout = 600) {
    TK_REQUIRE_GPU();
    RUN_CASES(D80_96_CASES, 600);
}

/* deterministic = 1 on every shape above, by the same accuracy rule, each run twice. */
Test(attention_bwd_gpu, deterministic_against_reference, .timeout = 600) {
    TK_REQUIRE_GPU();
    const struct { const bwd_case *cases; size_t count; uint64_t seed; } lists[6] = {
        {MASK_CASES, sizeof MASK_CASES / sizeof MASK_CASES[0], 100},
        {GQA_CASES, sizeof GQA_CASES / sizeof GQA_CASES[0], 200},
        {SPECIALISED_CASES, sizeof SPECIALISED_CASES / sizeof SPECIALISED_CASES[0], 300},
        {D256_CASES, sizeof D256_CASES / sizeof D256_CASES[0], 500},
        {D80_96_CASES, sizeof D80_96_CASES / sizeof D80_96_CASES[0], 600},
        {D64_CASES, sizeof D64_CASES / sizeof D64_CASES[0], 800},
    };
    for (int l = 0; l < 6; l++)
        for (size_t i = 0; i < lists[l].count; i++)
            run_case_runs(&lists[l].cases[i], lists[l].seed + i, 1, 2, 0);
}

/* deterministic = 1: dq, dk, dv bit-identical over 3 runs where many key tiles add to each query
 * tile (causal GQA, 8 key tiles of 128 or 16 of 64; at head dim 256 10 of 64), and under masks
 * that keep key tiles from some query tiles (windows on both sides with seqlen_q < seqlen_k; a
 * causal window over documents), so that the chains of adds start and end at different key
 * tiles; and grids of more CTAs than an H200 holds at once (192 or 384 at head dim 64, 160 at
 * 256, and 256 at head dims 128 and 64 for the Hopper variant, whose semaphores the dQ writer
 * waits on, against 132 SMs of one CTA each for the 8-warp tiles and the Hopper kernel), so that
 * CTAs wait on the semaphores of CTAs that are not resident yet. At head dim 64 the Hopper
 * kernel's chains run over 128-row query tiles: the causal GQA case has 16 key tiles adding to
 * the last query tile of each head. */
static const bwd_case BIT_IDENTICAL_CASES[] = {
    {TK_BF16, 1, 1024, 1024, 8, 2, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 2, 600, 700, 4, 2, 64, false, 0, 100, 40, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 640, 640, 4, 1, 128, false, 1, 150, -1, 0.0f, false, false, 0, 0, 200},
    {TK_BF16, 1, 640, 640, 4, 2, 256, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 500, 600, 2, 1, 256, false, 0, 90, 30, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 384, 384, 64, 64, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 320, 320, 32, 32, 256, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 1024, 1024, 32, 32, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 2048, 2048, 8, 2, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 1024, 1024, 32, 32, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 1, 700, 900, 4, 2, 64, false, 0, 150, 60, 0.0f, false, false, 0, 0, 0},
};

/* One head dim's cases of a list (each with its seed from its place in the list): a test per
 * head dim, so that tests/sanitize.sh's one-test jobs stay within a few minutes. */
static void run_head_dim(const bwd_case *cases, size_t count, int64_t head_dim, uint64_t seed0, int deterministic,
                         int runs) {
    for (size_t i = 0; i < count; i++)
        if (cases[i].head_dim == head_dim)
            run_case_runs(&cases[i], seed0 + i, deterministic, runs, 0);
}

Test(attention_bwd_gpu, deterministic_bit_identical_d64, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_head_dim(BIT_IDENTICAL_CASES, sizeof BIT_IDENTICAL_CASES / sizeof BIT_IDENTICAL_CASES[0], 64, 400, 1, 3);
}

Test(attention_bwd_gpu, deterministic_bit_identical_d128, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_head_dim(BIT_IDENTICAL_CASES, sizeof BIT_IDENTICAL_CASES / sizeof BIT_IDENTICAL_CASES[0], 128, 400, 1, 3);
}

Test(attention_bwd_gpu, deterministic_bit_identical_d256, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_head_dim(BIT_IDENTICAL_CASES, sizeof BIT_IDENTICAL_CASES / sizeof BIT_IDENTICAL_CASES[0], 256, 400, 1, 3);
}

/* The grid order under a mask, in L2-sized sections of (batch, key/value head) pairs, which
 * every main kernel takes (docs/kernels/attention_bwd.md, "Grid order"): shapes whose pairs take
 * several sections, the last one short, so that the sections' boundaries (inside a batch) and the
 * short last section's decode run, atomic and deterministic (whose tickets follow the same
 * order).
 * With 128-key tiles, 512 keys make 4 key tiles, so a section holds at least ceil(SMs / 4)
 * pairs (33 on 132 SMs), and at most as many as half the L2 holds of a pair's Q, dO and dQ
 * accumulator (8 group 512 D bytes). On an H100 (50 MiB of L2, 132 SMs): causal 131 heads at
 * head dim 64 in sections of 66 (66 + 65), a window over 5 x 23 GQA pairs in sections of 39
 * (39 + 39 + 37), causal 67 heads at head dim 128 in sections of 34 (34 + 33); with 60 MiB of
 * L2 the window's sections are 58 (58 + 57) and the others the same. The 4-warp portable
 * kernel's 64-key tiles (8 a pair) lower the least to ceil(SMs / 8) and take the same sizes.
 * Without a mask the deterministic kernels take them (131 heads at head dim 64: the causal
 * case's 66 + 65); the atomic ones run it in their dense orders. Causal 134 query heads over 67
 * at head dim 128 (1 MiB a pair) do not fit a wave's 33 pairs in half of either L2: the portable
 * kernels run one section of the 67, the Hopper kernels sections of one to two waves (34 + 33).
 * The deterministic kernels take such sections of waves without a mask too, through the same
 * decode as the dense case's L2-sized sections (a dense case of that size would double this
 * test's CPU reference time). */
static const bwd_case L2_SECTION_CASES[] = {
    {TK_BF16, 1, 512, 512, 131, 131, 64, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 512, 512, 131, 131, 64, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_F16, 5, 512, 512, 46, 23, 64, false, 0, 100, 30, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 512, 512, 67, 67, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
    {TK_BF16, 1, 512, 512, 134, 67, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
};

/* Each case atomic once, then deterministic twice (bit-identical). */
static void run_l2_sections(int64_t head_dim) {
    const size_t count = sizeof L2_SECTION_CASES / sizeof L2_SECTION_CASES[0];
    run_head_dim(L2_SECTION_CASES, count, head_dim, 1000, 0, 1);
    run_head_dim(L2_SECTION_CASES, count, head_dim, 1000, 1, 2);
}

Test(attention_bwd_gpu, l2_sections_d64, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_l2_sections(64);
}

Test(attention_bwd_gpu, l2_sections_d128, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_l2_sections(128);
}

/* The workspace 16, 48 and 112 bytes past the allocation's start (which is 256-byte aligned):
 * the dQ accumulator then starts on the next 128-byte boundary after D, inside the 112 bytes
 * that the workspace size reserves for that, at a different distance each time. Lengths that
 * leave pad rows in the accumulator's last 16-row slab of every head and D lengths that are not
 * a multiple of 32 floats; atomic and deterministic, at every variant. */
Test(attention_bwd_gpu, workspace_offsets, .timeout = 600) {
    TK_REQUIRE_GPU();
    const bwd_case cases[] = {
        {TK_BF16, 1, 130, 130, 4, 2, 128, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
        {TK_F16, 2, 45, 40, 6, 2, 80, false, 1, -1, -1, 0.0f, false, false, 0, 0, 0},
        {TK_BF16, 1, 70, 90, 3, 1, 256, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
        {TK_F16, 1, 33, 33, 2, 2, 64, false, 0, -1, -1, 0.0f, false, false, 0, 0, 0},
    };
    const size_t offsets[] = {16, 48, 112};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++) {
            run_case_runs(&cases[i], 700 + i, 0, 1, offsets[o]);
            run_case_runs(&cases[i], 700 + i, 1, 2, offsets[o]);
        }
}
