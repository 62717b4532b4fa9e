/* fp64 reference for attention over a KV cache; see attention_kvcache_ref.h. */
#include "attention_kvcache_ref.h"

#include <math.h>
#include <stdlib.h>

#include <criterion/criterion.h>

#include "support/tk_test.h"

int64_t ref_kvcache_seqlen_q(const ref_kvcache_inputs *in, int64_t b, int64_t *first_token) {
    if (in->cu_seqlens_q) {
        *first_token = in->cu_seqlens_q[b];
        return in->cu_seqlens_q[b + 1] - in->cu_seqlens_q[b];
    }
    *first_token = b * in->p->seqlen_q;
    return in->p->seqlen_q;
}

bool ref_kvcache_visible(const ref_kvcache_inputs *in, int64_t b, int64_t i, int64_t j) {
    const tk_attention_kvcache_params *p = in->p;
    int64_t first;
    const int64_t seqlen_k = in->seqlens_k[b];
    const int64_t shift = seqlen_k - ref_kvcache_seqlen_q(in, b, &first);
    const int64_t right = p->causal ? 0 : p->window_right;
    if (j < 0 || j >= seqlen_k)
        return false;
    if (p->window_left >= 0 && j < i + shift - p->window_left)
        return false;
    return right < 0 || j <= i + shift + right;
}

int64_t ref_kvcache_key_offset(const ref_kvcache_inputs *in, int64_t b, int64_t j, int64_t hk,
                               bool is_v) {
    const tk_attention_kvcache_params *p = in->p;
    const int64_t *st = is_v ? p->v_strides : p->k_strides;
    if (!in->block_table)
        return b * st[0] + j * st[1] + hk * st[2];
    const int64_t stride = p->block_table_stride ? p->block_table_stride : p->max_pages_per_seq;
    const int64_t page = in->block_table[b * stride + j / p->page_size];
    return page * st[0] + (j % p->page_size) * st[1] + hk * st[2];
}

void ref_kvcache_row(const ref_kvcache_inputs *in, int64_t b, int64_t i, int64_t h, bool naive,
                     double *o, double *lse) {
    const tk_attention_kvcache_params *p = in->p;
    const tk_dtype dt = p->dtype;
    const int64_t d = p->head_dim, hk = h / (p->heads_q / p->heads_kv);
    const double scale = p->softmax_scale > 0.0f ? (double)p->softmax_scale : 1.0 / sqrt((double)d);
    int64_t first;
    const int64_t seqlen_q = ref_kvcache_seqlen_q(in, b, &first);
    const int64_t seqlen_k = in->seqlens_k[b];
    const int64_t q_row = in->cu_seqlens_q ? (first + i) * p->q_strides[1] + h * p->q_strides[2]
                                           : b * p->q_strides[0] + i * p->q_strides[1] + h * p->q_strides[2];
    double *s = malloc((size_t)(seqlen_k > 0 ? seqlen_k : 1) * sizeof(double));
    cr_assert(s != NULL);
#define ROUND(x) (naive ? tk_test_round(dt, (x)) : (x))
    double max = -INFINITY;
    for (int64_t j = 0; j < seqlen_k; j++) {
        s[j] = -INFINITY;
        if (!ref_kvcache_visible(in, b, i, j))
            continue;
        const int64_t k_row = ref_kvcache_key_offset(in, b, j, hk, false);
        double dot = 0.0;
        for (int64_t e = 0; e < d; e++)
            dot += in->q[q_row + e] * in->k[k_row + e];
        double x = ROUND(dot * scale);
        if (p->softcap > 0.0f)
            x = ROUND(p->softcap * tanh(x / p->softcap));
        if (in->alibi_slopes)
            x = ROUND(x - (double)in->alibi_slopes[h] * fabs((double)(i + seqlen_k - seqlen_q - j)));
        s[j] = x;
        max = x > max ? x : max;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < seqlen_k; j++)
        sum += s[j] == -INFINITY ? 0.0 : exp(s[j] - max);
    for (int64_t e = 0; e < d; e++)
        o[e] = 0.0;
    for (int64_t j = 0; j < seqlen_k && sum > 0.0; j++) {
        if (s[j] == -INFINITY)
            continue;
        const double prob = ROUND(exp(s[j] - max) / sum);
        const int64_t v_row = ref_kvcache_key_offset(in, b, j, hk, true);
        for (int64_t e = 0; e < d; e++)
            o[e] += prob * in->v[v_row + e];
    }
    for (int64_t e = 0; e < d; e++)
        o[e] = ROUND(o[e]);
#undef ROUND
    *lse = sum > 0.0 ? max + log(sum) : -INFINITY;
    free(s);
}
