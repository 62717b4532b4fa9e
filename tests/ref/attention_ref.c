/* fp64 attention reference; see attention_ref.h. */
#include "attention_ref.h"

#include <math.h>
#include <stdlib.h>

#include <criterion/criterion.h>

#include "support/tk_test.h"

/* floor(x / c) for any sign of x. */
static int64_t floor_div(int64_t x, int64_t c) { return x >= 0 ? x / c : -((c - 1 - x) / c); }

bool ref_attention_visible(const tk_attention_params *p, int64_t b, int64_t i, int64_t j) {
    const int64_t shift = p->seqlen_k - p->seqlen_q, pos = i + shift;
    const int64_t right = p->causal ? 0 : p->window_right;
    if (j < 0 || j >= p->seqlen_k)
        return false;
    if (p->prefix_len > 0 && pos < p->prefix_len && j < p->prefix_len)
        return true; /* the bidirectional prefix (prefix-LM allows no window_left) */
    if (p->window_left >= 0 && j < pos - p->window_left)
        return false;
    if (right >= 0 && j > pos + right)
        return false;
    if (p->chunk_size > 0 && floor_div(pos, p->chunk_size) != floor_div(j, p->chunk_size))
        return false;
    const int32_t *ids = p->document_ids ? p->document_ids + b * p->seqlen_k : NULL;
    if (ids && (pos < 0 || ids[j] != ids[pos]))
        return false;
    return true;
}

int64_t ref_attention_visible_pairs(const tk_attention_params *p) {
    int64_t pairs = 0;
    for (int64_t i = 0; i < p->seqlen_q; i++)
        for (int64_t j = 0; j < p->seqlen_k; j++)
            pairs += ref_attention_visible(p, 0, i, j);
    return pairs;
}

void ref_attention_row(const tk_attention_params *p, const double *q, const double *k,
                       const double *v, const float *alibi_slopes, int64_t b, int64_t h,
                       int64_t i, bool naive, double *o, double *lse) {
    const tk_dtype dt = p->dtype;
    const int64_t d = p->head_dim, hk = h / (p->heads_q / p->heads_kv);
    const double scale = p->softmax_scale > 0.0f ? (double)p->softmax_scale : 1.0 / sqrt((double)d);
    const int64_t q_row = b * p->q_strides[0] + i * p->q_strides[1] + h * p->q_strides[2];
    double *s = malloc((size_t)p->seqlen_k * sizeof(double));
    cr_assert(s != NULL);
#define ROUND(x) (naive ? tk_test_round(dt, (x)) : (x))
    double max = -INFINITY;
    for (int64_t j = 0; j < p->seqlen_k; j++) {
        s[j] = -INFINITY;
        if (!ref_attention_visible(p, b, i, j))
            continue;
        const int64_t k_row = b * p->k_strides[0] + j * p->k_strides[1] + hk * p->k_strides[2];
        double dot = 0.0;
        for (int64_t e = 0; e < d; e++)
            dot += q[q_row + e] * k[k_row + e];
        double x = ROUND(dot * scale);
        if (p->softcap > 0.0f)
            x = ROUND(p->softcap * tanh(x / p->softcap));
        if (alibi_slopes)
            x = ROUND(x - (double)alibi_slopes[h] * fabs((double)(i + p->seqlen_k - p->seqlen_q - j)));
        s[j] = x;
        max = x > max ? x : max;
    }
    /* The sink joins the denominator (and the max, for range) without a value. */
    const double sink = p->sinks ? (double)p->sinks[h] : -INFINITY;
    const bool seen = max > -INFINITY;
    max = sink > max ? sink : max;
    double sum = p->sinks ? exp(sink - max) : 0.0;
    for (int64_t j = 0; j < p->seqlen_k; j++)
        sum += s[j] == -INFINITY ? 0.0 : exp(s[j] - max);
    for (int64_t e = 0; e < d; e++)
        o[e] = 0.0;
    for (int64_t j = 0; j < p->seqlen_k && seen; j++) {
        if (s[j] == -INFINITY)
            continue;
        const double prob = ROUND(exp(s[j] - max) / sum);
        const int64_t v_row = b * p->v_strides[0] + j * p->v_strides[1] + hk * p->v_strides[2];
        for (int64_t e = 0; e < d; e++)
            o[e] += prob * v[v_row + e];
    }
    for (int64_t e = 0; e < d; e++)
        o[e] = ROUND(o[e]);
#undef ROUND
    *lse = sum > 0.0 ? max + log(sum) : -INFINITY; /* a row with only the sink: the sink */
    free(s);
}

int64_t ref_attention_layout(bool bhsd, int64_t batch, int64_t seq, int64_t heads,
                             int64_t head_dim, int64_t st[4]) {
    st[3] = 1;
    if (bhsd) {
        st[1] = head_dim + 8;
        st[2] = seq * st[1];
        st[0] = heads * st[2] + 64;
    } else {
        st[2] = head_dim;
        st[1] = heads * head_dim;
        st[0] = seq * heads * head_dim;
    }
    return batch * st[0];
}

double ref_attention_representation_term(tk_dtype dtype, double exact) {
    const double r = tk_test_round(dtype, exact);
    return 2.0 * fabs(tk_test_round(dtype, tk_test_round(dtype, r + 0.3) - 0.3) - r);
}

double *ref_to_double(tk_dtype dtype, const void *host, int64_t n) {
    double *r = malloc((size_t)n * sizeof(double));
    cr_assert(r != NULL);
    for (int64_t i = 0; i < n; i++)
        r[i] = tk_test_load(dtype, host, i);
    return r;
}

int32_t *ref_attention_doc_ids(int64_t batch, int64_t seqlen_k, int64_t doc_len) {
    int32_t *ids = malloc((size_t)(batch * seqlen_k) * sizeof(int32_t));
    cr_assert(ids != NULL);
    for (int64_t b = 0; b < batch; b++) {
        int32_t id = 0;
        for (int64_t j = 0; j < seqlen_k; j++) {
            const int64_t x = j + 7 * b, r = x % doc_len;
            id += j > 0 && (r == 0 || (r == doc_len / 3 && x / doc_len % 2 == 1));
            ids[b * seqlen_k + j] = id;
        }
    }
    return ids;
}
