/* Rotary position embedding: bad input on the host (runs everywhere), then styles x dtypes x
 * layouts x position sources x angle sources x directions x variants against the fp64 reference
 * on the GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"
#include "ref/rope_ref.h"

static const tk_dtype DTYPES[] = {TK_F32, TK_F16, TK_BF16};
static const char *const VARIANTS[] = {"vec16", "scalar"};

/* ------------------------------------------------------------------ bad input (host) ---- */

static unsigned char q_buf[4096] __attribute__((aligned(16)));
static unsigned char k_buf[4096] __attribute__((aligned(16)));
static unsigned char qo_buf[4096] __attribute__((aligned(16)));
static unsigned char ko_buf[4096] __attribute__((aligned(16)));

static void reset_buffers(void) {
    tk_fill_sentinel(q_buf, sizeof q_buf);
    tk_fill_sentinel(k_buf, sizeof k_buf);
    tk_fill_sentinel(qo_buf, sizeof qo_buf);
    tk_fill_sentinel(ko_buf, sizeof ko_buf);
}

#define EXPECT_REJECTED(call, status, needle)                                                       \
    do {                                                                                            \
        reset_buffers();                                                                            \
        TK_EXPECT_STATUS(call, status, needle);                                                     \
        cr_assert(tk_is_sentinel(q_buf, sizeof q_buf) && tk_is_sentinel(k_buf, sizeof k_buf) &&    \
                      tk_is_sentinel(qo_buf, sizeof qo_buf) && tk_is_sentinel(ko_buf, sizeof ko_buf), \
                  "%s wrote a buffer", #call);                                                      \
    } while (0)

/* 4 tokens, 2 Q heads, 1 K head, head_dim 16 (bf16): 256 bytes of q, 128 of k. */
static tk_rope_params small_params(void) {
    tk_rope_params p = TK_ROPE_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.tokens = 4;
    p.heads_q = 2;
    p.heads_k = 1;
    p.head_dim = 16;
    return p;
}

Test(rope_args, rejects_bad_arguments) {
    const tk_rope_params ok = small_params();
    tk_rope_params p;
    static float cache[64];
    static int32_t pos32[4];
    static int64_t pos64[4];
    EXPECT_REJECTED(tk_rope_fwd(NULL, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_NULL_POINTER, "'p'");
    p = ok; p.size = 16;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->size");
    p = ok; p.dtype = (tk_dtype)9;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->dtype");
    p = ok; p.style = (tk_rope_style)2;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->style");
    p = ok; p.tokens = -1;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->tokens");
    p = ok; p.heads_q = -2;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->heads_q");
    p = ok; p.heads_k = -1;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->heads_k");
    p = ok; p.head_dim = 1;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->head_dim");
    p = ok; p.rotary_dim = 7;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->rotary_dim");
    p = ok; p.rotary_dim = 18;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->rotary_dim");
    p = ok; p.rotary_dim = -2;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->rotary_dim");
    p = ok; p.q_strides[0] = 32; p.q_strides[1] = 8; /* heads 8 apart, 16 wide: overlap */
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->q_strides");
    p = ok; p.k_strides[0] = 8; p.k_strides[1] = 16;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->k_strides");
    p = ok; p.q_out_strides[0] = -32; p.q_out_strides[1] = 16;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->q_out_strides");
    p = ok; p.q_strides[0] = 16; p.q_strides[1] = 16; /* tokens and heads on the same rows */
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->q_strides");
    p = ok; p.k_out_strides[0] = 0; p.k_out_strides[1] = 16; /* every token's row written at once */
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->k_out_strides");
    p = ok; p.positions32 = pos32; p.positions64 = pos64;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "positions");
    p = ok; p.theta = 0.0f;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->theta");
    p = ok; p.theta = NAN;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->theta");
    p = ok; p.theta = INFINITY;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->theta");
    p = ok; p.cos_cache = cache;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_NULL_POINTER, "p->sin_cache");
    p = ok; p.sin_cache = cache;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_NULL_POINTER, "p->cos_cache");
    p = ok; p.cos_cache = cache; p.sin_cache = cache + 8; p.max_position = 0;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->max_position");
    p = ok; p.cos_cache = cache; p.sin_cache = cache + 8; p.max_position = 4; p.cache_row_stride = 4;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "p->cache_row_stride");
    p = ok; p.tokens = INT64_MAX / 4;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_INVALID_VALUE, "overflow");
    EXPECT_REJECTED(tk_rope_fwd(&ok, NULL, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_NULL_POINTER, "'q'");
    EXPECT_REJECTED(tk_rope_fwd(&ok, q_buf, NULL, qo_buf, ko_buf, NULL), TK_ERROR_NULL_POINTER, "'k'");
    EXPECT_REJECTED(tk_rope_fwd(&ok, q_buf, k_buf, NULL, ko_buf, NULL), TK_ERROR_NULL_POINTER, "'q_out'");
    EXPECT_REJECTED(tk_rope_fwd(&ok, q_buf, k_buf, qo_buf, NULL, NULL), TK_ERROR_NULL_POINTER, "'k_out'");
    EXPECT_REJECTED(tk_rope_bwd(&ok, NULL, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_NULL_POINTER, "'dq'");
    EXPECT_REJECTED(tk_rope_bwd(&ok, q_buf, k_buf, qo_buf, NULL, NULL), TK_ERROR_NULL_POINTER, "'dk_out'");
    EXPECT_REJECTED(tk_rope_fwd(&ok, q_buf + 1, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_MISALIGNED, "'q'");
    p = ok; p.positions64 = (const int64_t *)(q_buf + 4 * 256); /* a host stand-in, misaligned by 4 */
    p.positions64 = (const int64_t *)((const char *)p.positions64 + 4);
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_MISALIGNED, "p->positions64");
    /* Outputs over inputs: q_out one element into q; in place with other strides; q_out over k;
     * k_out over q_out; an output over the positions. */
    EXPECT_REJECTED(tk_rope_fwd(&ok, q_buf, k_buf, q_buf + 2, ko_buf, NULL), TK_ERROR_OVERLAP, "'q_out' overlaps 'q'");
    p = ok; p.q_out_strides[0] = 64; p.q_out_strides[1] = 16;
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, q_buf, ko_buf, NULL), TK_ERROR_OVERLAP, "'q_out' overlaps 'q'");
    EXPECT_REJECTED(tk_rope_fwd(&ok, q_buf, k_buf, qo_buf, q_buf, NULL), TK_ERROR_OVERLAP, "'k_out'");
    EXPECT_REJECTED(tk_rope_fwd(&ok, q_buf, k_buf, qo_buf, qo_buf + 64, NULL), TK_ERROR_OVERLAP, "'q_out' shares elements with 'k_out'");
    p = ok; p.positions32 = (const int32_t *)(qo_buf + 8);
    EXPECT_REJECTED(tk_rope_fwd(&p, q_buf, k_buf, qo_buf, ko_buf, NULL), TK_ERROR_OVERLAP, "p->positions32");
    /* In place, q and k sharing elements of one buffer. */
    EXPECT_REJECTED(tk_rope_fwd(&ok, q_buf, q_buf + 32, q_buf, q_buf + 32, NULL), TK_ERROR_OVERLAP, "shares elements");
}

/* Packed QKV in place (q and k interleave by token) is accepted up to the device step. */
Test(rope_args, packed_qkv_in_place_passes_validation) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; the GPU tests cover this");
    tk_rope_params p = small_params();
    const int64_t token_stride = (2 + 2 * 1) * 16;
    p.q_strides[0] = p.k_strides[0] = token_stride;
    p.q_strides[1] = p.k_strides[1] = 16;
    reset_buffers();
    unsigned char *k = q_buf + 2 * 16 * 2;
    TK_EXPECT_STATUS(tk_rope_fwd(&p, q_buf, k, q_buf, k, NULL), TK_ERROR_NO_DEVICE, "no usable CUDA device");
    cr_assert(tk_is_sentinel(q_buf, sizeof q_buf));
}

Test(rope_args, empty_is_a_noop) {
    tk_rope_params p = small_params();
    p.tokens = 0;
    TK_EXPECT_STATUS(tk_rope_fwd(&p, NULL, NULL, NULL, NULL, NULL), TK_SUCCESS, "");
    p = small_params();
    p.heads_q = p.heads_k = 0;
    TK_EXPECT_STATUS(tk_rope_bwd(&p, NULL, NULL, NULL, NULL, NULL), TK_SUCCESS, "");
    cr_assert_str_empty(tk_last_error());
}

Test(rope_args, force_variant_names) {
    TK_EXPECT_STATUS(tk_experimental_force_variant("rope", "vec16"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("rope", "scalar"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("rope", NULL), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("rope", "fast"), TK_ERROR_INVALID_VALUE, "\"vec16\", \"scalar\"");
    TK_EXPECT_STATUS(tk_experimental_force_variant("rope_bwd", "vec16"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("rope_bwd", "scalar"), TK_SUCCESS, "");
    TK_EXPECT_STATUS(tk_experimental_force_variant("rope_bwd", NULL), TK_SUCCESS, "");
}

/* ------------------------------------------------------------------------ GPU checks ---- */

typedef enum { LAYOUT_DENSE, LAYOUT_PADDED, LAYOUT_PACKED_QKV, LAYOUT_HEAD_MAJOR } rope_layout;
typedef enum { POS_START, POS_I32, POS_I64 } rope_pos;

typedef struct rope_case {
    tk_dtype dtype;
    tk_rope_style style;
    int64_t tokens, heads_q, heads_k, head_dim, rotary_dim;
    rope_layout layout;
    bool in_place, backward, cache;
    rope_pos pos;
    int64_t position_start;
    int misalign;
    const char *variant;
} rope_case;

/* Element offset of (token, head) and strides for one tensor in the case's layout, inside a
 * buffer of `total` elements. Q and K of a packed buffer share it (k starts after the Q heads). */
typedef struct tensor_layout {
    int64_t base, strides[2];
} tensor_layout;

static void make_layout(const rope_case *c, bool is_k, tensor_layout *t, int64_t *total) {
    const int64_t heads = is_k ? c->heads_k : c->heads_q, hd = c->head_dim;
    switch (c->layout) {
    case LAYOUT_DENSE:
        t->base = 0; t->strides[0] = heads * hd; t->strides[1] = hd;
        *total = c->tokens * heads * hd;
        break;
    case LAYOUT_PADDED: /* gaps between heads and between tokens */
        t->base = 0; t->strides[1] = hd + 8; t->strides[0] = heads * (hd + 8) + 24;
        *total = c->tokens * t->strides[0];
        break;
    case LAYOUT_PACKED_QKV: { /* [tokens, heads_q + 2 heads_k, hd], V never touched */
        const int64_t row = (c->heads_q + 2 * c->heads_k) * hd;
        t->base = is_k ? c->heads_q * hd : 0; t->strides[0] = row; t->strides[1] = hd;
        *total = c->tokens * row;
        break;
    }
    case LAYOUT_HEAD_MAJOR: /* [heads, tokens, hd] (one batch of [B, H, S, D]) */
        t->base = 0; t->strides[0] = hd; t->strides[1] = c->tokens * hd;
        *total = c->tokens * heads * hd;
        break;
    }
}

static int64_t position_of(const rope_case *c, const int64_t *pos, int64_t t) {
    return c->pos == POS_START ? c->position_start + t : pos[t];
}

static void run_case(const rope_case *c, tk_rng *rng) {
    const size_t es = tk_test_dtype_size(c->dtype);
    const int64_t hd = c->head_dim, rd = c->rotary_dim ? c->rotary_dim : hd, half = rd / 2;
    const bool packed = c->layout == LAYOUT_PACKED_QKV;
    tensor_layout lq, lk;
    int64_t nq, nk;
    make_layout(c, false, &lq, &nq);
    make_layout(c, true, &lk, &nk);
    if (packed)
        nk = nq; /* one buffer */
    nq += c->misalign;
    nk += c->misalign + (c->heads_k == 0 ? 8 : 0); /* a Q-only call still gets a (unused) k buffer */

    /* Positions and the cache (max_position = the largest position + 1; with a position array,
     * the last token is one past the end and, from 3 tokens on, the middle one is -1: the
     * out-of-range rule). */
    int64_t *pos = malloc((size_t)(c->tokens > 0 ? c->tokens : 1) * sizeof(int64_t));
    int32_t *pos32 = malloc((size_t)(c->tokens > 0 ? c->tokens : 1) * sizeof(int32_t));
    cr_assert(pos && pos32);
    const int64_t pos_range = c->cache ? 3000 : (c->pos == POS_I64 ? (INT64_C(1) << 29) : (1 << 20));
    for (int64_t t = 0; t < c->tokens; t++) {
        pos[t] = (int64_t)tk_rng_uniform(rng, 0.0, (double)pos_range);
        pos32[t] = (int32_t)pos[t];
    }
    const bool out_of_range_token = c->cache && c->pos != POS_START && c->tokens > 1;
    const int64_t max_position = c->cache ? (c->pos == POS_START ? c->position_start + c->tokens : pos_range) : 0;
    if (out_of_range_token) {
        pos[c->tokens - 1] = max_position; /* not read: that token's rotated part becomes NaN */
        pos32[c->tokens - 1] = (int32_t)max_position;
        if (c->tokens > 2)
            pos[c->tokens / 2] = pos32[c->tokens / 2] = -1;
    }
    const int64_t cache_stride = half + 3;
    float *h_cos = NULL, *h_sin = NULL;
    if (c->cache) {
        h_cos = malloc((size_t)(max_position * cache_stride) * sizeof(float));
        h_sin = malloc((size_t)(max_position * cache_stride) * sizeof(float));
        cr_assert(h_cos && h_sin);
        for (int64_t p = 0; p < max_position; p++)
            for (int64_t i = 0; i < half; i++) { /* a scaled table, as a caller would build one */
                const double a = (double)p * ref_rope_inv_freq(500000.0, i, rd) * 0.25;
                h_cos[p * cache_stride + i] = (float)cos(a);
                h_sin[p * cache_stride + i] = (float)sin(a);
            }
    }

    unsigned char *hq = malloc((size_t)nq * es), *hk = packed ? hq : malloc((size_t)nk * es);
    unsigned char *hqo = malloc((size_t)nq * es), *hko = packed ? hqo : malloc((size_t)nk * es);
    double *eq = malloc((size_t)nq * sizeof(double)), *ek = packed ? eq : malloc((size_t)nk * sizeof(double));
    cr_assert(hq && hk && hqo && hko && eq && ek);
    tk_fill_uniform(rng, c->dtype, hq, nq, -2.0, 2.0);
    if (!packed)
        tk_fill_uniform(rng, c->dtype, hk, nk, -2.0, 2.0);
    /* Expected buffers: in place, the input with the rows replaced; out of place, NaN (poison)
     * except the rows. */
    for (int64_t i = 0; i < nq; i++)
        eq[i] = c->in_place ? tk_test_load(c->dtype, hq, i) : NAN;
    if (!packed)
        for (int64_t i = 0; i < nk; i++)
            ek[i] = c->in_place ? tk_test_load(c->dtype, hk, i) : NAN;
    double *in = malloc((size_t)hd * sizeof(double)), *out = malloc((size_t)hd * sizeof(double));
    double *ca = malloc((size_t)half * sizeof(double)), *sa = malloc((size_t)half * sizeof(double));
    cr_assert(in && out && ca && sa);
    for (int64_t t = 0; t < c->tokens; t++) {
        const int64_t p = position_of(c, pos, t);
        const bool nan_angles = c->cache && (p < 0 || p >= max_position);
        for (int64_t i = 0; i < half; i++) {
            if (nan_angles) {
                ca[i] = sa[i] = NAN;
            } else if (c->cache) {
                ca[i] = h_cos[p * cache_stride + i];
                sa[i] = h_sin[p * cache_stride + i];
            } else {
                const double a = (double)p * ref_rope_inv_freq(10000.0, i, rd);
                ca[i] = cos(a);
                sa[i] = sin(a);
            }
        }
        for (int which = 0; which < 2; which++) {
            const tensor_layout *l = which ? &lk : &lq;
            const int64_t heads = which ? c->heads_k : c->heads_q;
            const unsigned char *h = which ? hk : hq;
            double *e = which ? ek : eq;
            for (int64_t head = 0; head < heads; head++) {
                const int64_t row = c->misalign + l->base + t * l->strides[0] + head * l->strides[1];
                for (int64_t j = 0; j < hd; j++)
                    in[j] = tk_test_load(c->dtype, h, row + j);
                ref_rope_head(c->style, hd, rd, in, ca, sa, c->backward, out);
                for (int64_t j = 0; j < hd; j++)
                    e[row + j] = out[j];
                if (nan_angles) /* rotated part NaN; mark with +inf to check "is NaN" below */
                    for (int64_t j = 0; j < rd; j++)
                        e[row + j] = INFINITY;
            }
        }
    }

    unsigned char *dq = tk_dev_alloc((size_t)nq * es), *dk = packed ? dq : tk_dev_alloc((size_t)nk * es);
    tk_to_dev(dq, hq, (size_t)nq * es);
    if (!packed)
        tk_to_dev(dk, hk, (size_t)nk * es);
    unsigned char *dqo = dq, *dko = dk;
    if (!c->in_place) {
        dqo = tk_dev_alloc((size_t)nq * es);
        dko = packed ? dqo : tk_dev_alloc((size_t)nk * es);
        tk_dev_poison(dqo, (size_t)nq * es);
        if (!packed)
            tk_dev_poison(dko, (size_t)nk * es);
    }
    int64_t *d_pos64 = NULL;
    int32_t *d_pos32 = NULL;
    float *d_cos = NULL, *d_sin = NULL;
    tk_rope_params p = TK_ROPE_PARAMS_INIT;
    p.dtype = c->dtype;
    p.style = c->style;
    p.tokens = c->tokens;
    p.heads_q = c->heads_q;
    p.heads_k = c->heads_k;
    p.head_dim = hd;
    p.rotary_dim = c->rotary_dim;
    p.q_strides[0] = lq.strides[0]; p.q_strides[1] = lq.strides[1];
    p.k_strides[0] = lk.strides[0]; p.k_strides[1] = lk.strides[1];
    p.position_start = c->position_start;
    if (c->pos == POS_I64) {
        d_pos64 = tk_dev_alloc((size_t)c->tokens * 8);
        tk_to_dev(d_pos64, pos, (size_t)c->tokens * 8);
        p.positions64 = d_pos64;
    } else if (c->pos == POS_I32) {
        d_pos32 = tk_dev_alloc((size_t)c->tokens * 4);
        tk_to_dev(d_pos32, pos32, (size_t)c->tokens * 4);
        p.positions32 = d_pos32;
    }
    if (c->cache) {
        const size_t cb = (size_t)(max_position * cache_stride) * sizeof(float);
        d_cos = tk_dev_alloc(cb);
        d_sin = tk_dev_alloc(cb);
        tk_to_dev(d_cos, h_cos, cb);
        tk_to_dev(d_sin, h_sin, cb);
        p.cos_cache = d_cos;
        p.sin_cache = d_sin;
        p.cache_row_stride = cache_stride;
        p.max_position = max_position;
    }
    const size_t off = (size_t)c->misalign * es;
    const size_t qoff = off + (size_t)lq.base * es, koff = off + (size_t)lk.base * es;
    cr_assert_eq(tk_experimental_force_variant(c->backward ? "rope_bwd" : "rope", c->variant), TK_SUCCESS);
    const tk_status s = c->backward
        ? tk_rope_bwd(&p, dq + qoff, dk + koff, dqo + qoff, dko + koff, NULL)
        : tk_rope_fwd(&p, dq + qoff, dk + koff, dqo + qoff, dko + koff, NULL);
    char what[320];
    snprintf(what, sizeof what,
             "rope %s %s %s tokens %lld heads %lld+%lld dim %lld rotary %lld layout %d in_place %d cache %d "
             "pos %d start %lld misalign %d variant %s",
             c->backward ? "bwd" : "fwd", tk_test_dtype_name(c->dtype), c->style == TK_ROPE_NEOX ? "neox" : "gptj",
             (long long)c->tokens, (long long)c->heads_q, (long long)c->heads_k, (long long)hd, (long long)rd,
             (int)c->layout, c->in_place, c->cache, (int)c->pos, (long long)c->position_start, c->misalign,
             c->variant);
    cr_assert_eq(s, TK_SUCCESS, "%s: %s", what, tk_last_error());
    cr_assert_str_eq(tk_last_variant(), c->variant, "%s ran %s", what, tk_last_variant());
    tk_dev_sync();
    tk_to_host(hqo, dqo, (size_t)nq * es);
    if (!packed)
        tk_to_host(hko, dko, (size_t)nk * es);
    cr_assert_eq(tk_experimental_force_variant(c->backward ? "rope_bwd" : "rope", NULL), TK_SUCCESS);
    const double rtol = tk_default_rtol(c->dtype);
    for (int which = 0; which < (packed ? 1 : 2); which++) {
        const unsigned char *got = which ? hko : hqo;
        const double *e = which ? ek : eq;
        const int64_t n = which ? nk : nq;
        for (int64_t i = 0; i < n; i++) {
            const double g = tk_test_load(c->dtype, got, i);
            if (isnan(e[i]) || isinf(e[i])) {
                cr_assert(isnan(g), "%s: %s position %lld: got %g, expected NaN (%s)", what, which ? "k" : "q",
                          (long long)i, g, isnan(e[i]) ? "never written" : "cache position out of range");
                continue;
            }
            cr_assert(fabs(g - e[i]) <= rtol * (1.0 + fabs(e[i])), "%s: %s position %lld got %.9g, reference %.9g",
                      what, which ? "k" : "q", (long long)i, g, e[i]);
        }
    }
    tk_dev_free(dq);
    if (!packed)
        tk_dev_free(dk);
    if (!c->in_place) {
        tk_dev_free(dqo);
        if (!packed)
            tk_dev_free(dko);
    }
    tk_dev_free(d_pos64); tk_dev_free(d_pos32); tk_dev_free(d_cos); tk_dev_free(d_sin);
    free(pos); free(pos32); free(h_cos); free(h_sin); free(in); free(out); free(ca); free(sa);
    free(hq); free(hqo); free(eq);
    if (!packed) {
        free(hk); free(hko); free(ek);
    }
}

static bool vec16_claims(const rope_case *c) {
    const int64_t pack = 16 / (int64_t)tk_test_dtype_size(c->dtype);
    const int64_t rd = c->rotary_dim ? c->rotary_dim : c->head_dim;
    /* Every layout above keeps strides in whole packs when head_dim is a multiple of the pack. */
    return c->misalign == 0 && (rd / 2) % pack == 0 && (c->head_dim - rd) % pack == 0 && c->head_dim % pack == 0;
}

static void run_all(bool backward) {
    tk_rng rng = tk_rng_seeded(backward ? 42 : 41);
    const struct {
        int64_t tokens, hq, hk, hd, rd;
        rope_layout layout;
        bool in_place, cache;
        rope_pos pos;
        int64_t start;
        int misalign;
    } shapes[] = {
        {1, 1, 1, 2, 0, LAYOUT_DENSE, false, false, POS_START, 0, 0},
        {7, 4, 2, 64, 0, LAYOUT_DENSE, false, false, POS_START, 5, 0},
        {33, 8, 2, 128, 0, LAYOUT_DENSE, true, false, POS_I32, 0, 0},            /* GQA, in place */
        {17, 4, 1, 128, 64, LAYOUT_DENSE, false, false, POS_I64, 0, 0},          /* partial, copy */
        {17, 4, 1, 128, 32, LAYOUT_DENSE, true, false, POS_START, 1000000, 0},   /* partial, in place, far */
        {9, 6, 2, 128, 0, LAYOUT_PACKED_QKV, true, false, POS_I32, 0, 0},        /* packed QKV, in place */
        {9, 6, 2, 96, 0, LAYOUT_PACKED_QKV, false, false, POS_START, 3, 0},      /* packed QKV out */
        {5, 3, 3, 80, 48, LAYOUT_PADDED, false, true, POS_I64, 0, 0},            /* cache, out of range */
        {6, 2, 1, 64, 0, LAYOUT_HEAD_MAJOR, false, true, POS_START, 100, 0},     /* [H, S, D], cache */
        {300, 32, 8, 128, 0, LAYOUT_DENSE, false, false, POS_I64, 0, 0},         /* benchmark-like */
        {3, 5, 0, 128, 0, LAYOUT_DENSE, false, false, POS_START, 0, 0},          /* Q only */
        {11, 3, 2, 40, 20, LAYOUT_PADDED, false, false, POS_I32, 0, 1},          /* misaligned */
        {4, 2, 2, 64, 0, LAYOUT_DENSE, true, true, POS_I32, 0, 1},               /* misaligned, in place */
        {3, 2, 1, 4112, 0, LAYOUT_DENSE, false, false, POS_I64, 0, 0},           /* no angle table fits */
        {2, 1, 1, 4224, 4112, LAYOUT_DENSE, false, true, POS_START, 7, 0},       /* no table, cache, copy */
    };
    for (size_t d = 0; d < 3; d++)
        for (int style = TK_ROPE_NEOX; style <= TK_ROPE_GPTJ; style++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (size_t v = 0; v < 2; v++) {
                    if (shapes[s].misalign && DTYPES[d] == TK_F32)
                        continue; /* f32 needs 4-byte alignment; a 2-byte shift is rejected */
                    rope_case c = {DTYPES[d], (tk_rope_style)style, shapes[s].tokens, shapes[s].hq, shapes[s].hk,
                                   shapes[s].hd, shapes[s].rd, shapes[s].layout, shapes[s].in_place, backward,
                                   shapes[s].cache, shapes[s].pos, shapes[s].start, shapes[s].misalign,
                                   VARIANTS[v]};
                    if (v == 0 && !vec16_claims(&c))
                        continue;
                    run_case(&c, &rng);
                }
}

Test(rope_gpu, forward_all_styles_layouts_dtypes_variants, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_all(false);
}

Test(rope_gpu, backward_all_styles_layouts_dtypes_variants, .timeout = 600) {
    TK_REQUIRE_GPU();
    run_all(true);
}

/* A call big enough for several units per thread, with one head of 512: a block's tokens are
 * then capped by the angle table's size (on a GPU of 132 SMs: 16 tokens' worth of units, 8 tokens
 * of table). */
Test(rope_gpu, many_tokens_one_wide_head) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(44);
    for (int style = TK_ROPE_NEOX; style <= TK_ROPE_GPTJ; style++) {
        const rope_case c = {TK_BF16, (tk_rope_style)style, 17000, 1, 0, 512, 0, LAYOUT_DENSE, false, false,
                             false, POS_I64, 0, 0, "vec16"};
        run_case(&c, &rng);
    }
}

/* The benchmark's cache case (heads, in place, int64 positions) over several waves of blocks:
 * vec16 has 4 tokens a block, every thread's first table entry loaded before the data;
 * scalar splits a token over 2 blocks. Out-of-range positions (-1 and max_position) among them. */
Test(rope_gpu, many_tokens_cache) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(45);
    for (size_t v = 0; v < 2; v++) {
        const rope_case c = {TK_BF16, TK_ROPE_NEOX, 5000, 32, 8, 128, 0, LAYOUT_DENSE, true, false,
                             true, POS_I64, 0, 0, VARIANTS[v]};
        run_case(&c, &rng);
    }
}

/* Forward then backward gives the input back (the rotation is orthogonal), at a large position
 * where an f32 angle product would already be off by radians. */
Test(rope_gpu, backward_inverts_forward_and_automatic_choice) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(43);
    const int64_t tokens = 64, heads = 4, hd = 128, n = tokens * heads * hd;
    float *h = malloc((size_t)n * 4), *back = malloc((size_t)n * 4);
    cr_assert(h && back);
    tk_fill_uniform(&rng, TK_F32, h, n, -1.0, 1.0);
    float *d = tk_dev_alloc((size_t)n * 4);
    tk_to_dev(d, h, (size_t)n * 4);
    tk_rope_params p = TK_ROPE_PARAMS_INIT;
    p.dtype = TK_F32;
    p.tokens = tokens;
    p.heads_q = heads;
    p.head_dim = hd;
    p.position_start = INT64_C(900000000);
    TK_EXPECT_STATUS(tk_rope_fwd(&p, d, NULL, d, NULL, NULL), TK_SUCCESS, "");
    cr_assert_str_eq(tk_last_variant(), "vec16");
    TK_EXPECT_STATUS(tk_rope_bwd(&p, d, NULL, d, NULL, NULL), TK_SUCCESS, "");
    tk_dev_sync();
    tk_to_host(back, d, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs((double)back[i] - h[i]) <= 1e-5, "element %lld: %g after fwd + bwd, was %g", (long long)i,
                  (double)back[i], (double)h[i]);
    p.tokens = tokens - 1; /* shifted by one element: stay inside the buffer */
    TK_EXPECT_STATUS(tk_rope_fwd(&p, (char *)d + 4, NULL, (char *)d + 4, NULL, NULL), TK_SUCCESS, "");
    cr_assert_str_eq(tk_last_variant(), "scalar");
    tk_dev_sync();
    tk_dev_free(d);
    free(h);
    free(back);
}

/* ------------------------------------------------------------- in place (GPU) ---- */

/* The in-place modes the header allows (q_out = q and k_out = k, with equal strides), bit for bit
 * against the same call out of place, forward and backward, every variant: q and k dense in one
 * buffer, or interleaved by token as in a packed QKV buffer; rotating all of each head or half.
 * The out-of-place output buffer starts as a copy of the input, so that the elements neither
 * call writes (v, and the rest past rotary_dim in place) compare equal too. */
Test(rope_gpu, in_place_matches_out_of_place, .timeout = 300) {
    TK_REQUIRE_GPU();
    tk_rng rng = tk_rng_seeded(35);
    const int64_t tokens = 37, hq = 8, hk = 2, hv = 2, hd = 128;
    const tk_dtype dtypes[] = {TK_F32, TK_F16, TK_BF16};
    for (size_t d = 0; d < 3; d++)
        for (size_t v = 0; v < 2; v++)
            for (int packed = 0; packed < 2; packed++)
                for (int style = TK_ROPE_NEOX; style <= TK_ROPE_GPTJ; style++)
                    for (int backward = 0; backward < 2; backward++) {
                        const tk_dtype dtype = dtypes[d];
                        const size_t es = tk_test_dtype_size(dtype);
                        const int64_t n = tokens * (hq + hk + hv) * hd;
                        const size_t bytes = (size_t)n * es;
                        tk_rope_params p = TK_ROPE_PARAMS_INIT;
                        p.dtype = dtype;
                        p.style = (tk_rope_style)style;
                        p.tokens = tokens;
                        p.heads_q = hq;
                        p.heads_k = hk;
                        p.head_dim = hd;
                        p.rotary_dim = (style == TK_ROPE_NEOX) == (packed == 0) ? 0 : hd / 2;
                        p.position_start = 3;
                        int64_t k_offset = tokens * hq * hd;
                        if (packed) {
                            p.q_strides[0] = p.k_strides[0] = (hq + hk + hv) * hd;
                            p.q_strides[1] = p.k_strides[1] = hd;
                            k_offset = hq * hd;
                        }
                        unsigned char *host = malloc(bytes), *want = malloc(bytes);
                        cr_assert(host && want);
                        tk_fill_uniform(&rng, dtype, host, n, -3.0, 3.0);
                        unsigned char *in = tk_dev_alloc(bytes), *out = tk_dev_alloc(bytes);
                        tk_to_dev(in, host, bytes);
                        tk_to_dev(out, host, bytes);
                        char what[160];
                        snprintf(what, sizeof what, "%s %s variant %s packed %d style %d rotary %lld", backward ? "bwd" : "fwd",
                                 tk_test_dtype_name(dtype), VARIANTS[v], packed, style, (long long)p.rotary_dim);
                        const size_t ko = (size_t)k_offset * es;
                        cr_assert_eq(tk_experimental_force_variant(backward ? "rope_bwd" : "rope", VARIANTS[v]), TK_SUCCESS);
                        tk_status st = backward ? tk_rope_bwd(&p, in, in + ko, out, out + ko, NULL)
                                                : tk_rope_fwd(&p, in, in + ko, out, out + ko, NULL);
                        cr_assert_eq(st, TK_SUCCESS, "%s: %s", what, tk_last_error());
                        tk_dev_sync();
                        tk_to_host(want, out, bytes);
                        st = backward ? tk_rope_bwd(&p, in, in + ko, in, in + ko, NULL) : tk_rope_fwd(&p, in, in + ko, in, in + ko, NULL);
                        cr_assert_eq(st, TK_SUCCESS, "%s: %s", what, tk_last_error());
                        cr_assert_str_eq(tk_last_variant(), VARIANTS[v], "%s ran %s", what, tk_last_variant());
                        tk_dev_sync();
                        tk_assert_dev_bytes_equal(in, want, bytes, what);
                        cr_assert_eq(tk_experimental_force_variant(backward ? "rope_bwd" : "rope", NULL), TK_SUCCESS);
                        tk_dev_free(in); tk_dev_free(out);
                        free(host); free(want);
                    }
}
