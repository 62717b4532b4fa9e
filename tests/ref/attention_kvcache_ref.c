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
    if (p->chunk_size > 0) { /* floor division: positions before the cache's start are negative */
        const int64_t pos = i + shift, c = p->chunk_size;
        const int64_t chunk_of_pos = pos >= 0 ? pos / c : -((c - 1 - pos) / c);
        if (j / c != chunk_of_pos)
            return false;
    }
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
    const double sink = in->sinks ? (double)in->sinks[h] : -INFINITY;
    max = sink > max ? sink : max; /* the sink joins the denominator, without a value */
    double sum = sink == -INFINITY ? 0.0 : exp(sink - max);
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
    *lse = sum > 0.0 ? max + log(sum) : -INFINITY; /* the sink alone: lse = sink */
    free(s);
}

#define REF_PI 3.14159265358979323846

/* Hugging Face's inverse frequency of pair i (rope_init_fn of "default", "llama3", "yarn"). */
static double rope_inv_freq(const tk_attention_kvcache_params *p, int64_t i) {
    const double dim = (double)p->rotary_dim, base = p->rope_theta, factor = p->rope_factor;
    const double old_len = (double)p->rope_original_max_position;
    const double freq = 1.0 / pow(base, (double)(2 * i) / dim);
    switch (p->rope_scaling) {
    case TK_ROPE_SCALING_LLAMA3: {
        const double low_wavelen = old_len / p->rope_low_freq_factor;
        const double high_wavelen = old_len / p->rope_high_freq_factor;
        const double wavelen = 2.0 * REF_PI / freq;
        const double llama = wavelen > low_wavelen ? freq / factor : freq;
        const double smooth = (old_len / wavelen - p->rope_low_freq_factor) /
                              (p->rope_high_freq_factor - p->rope_low_freq_factor);
        const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        return medium ? (1.0 - smooth) * llama / factor + smooth * llama : llama;
    }
    case TK_ROPE_SCALING_YARN: {
        /* find_correction_range(beta_fast, beta_slow, dim, base, old_len, truncate = True) */
        const double low = fmax(floor(dim * log(old_len / (p->rope_beta_fast * 2.0 * REF_PI)) / (2.0 * log(base))), 0.0);
        double high = fmin(ceil(dim * log(old_len / (p->rope_beta_slow * 2.0 * REF_PI)) / (2.0 * log(base))), dim - 1.0);
        if (low == high)
            high += 0.001;
        const double ramp = fmin(fmax(((double)i - low) / (high - low), 0.0), 1.0);
        const double extrapolation_factor = 1.0 - ramp;
        return freq / factor * (1.0 - extrapolation_factor) + freq * extrapolation_factor;
    }
    default:
        return freq;
    }
}

void ref_kvcache_rope(const tk_attention_kvcache_params *p, const float *cos_cache,
                      const float *sin_cache, int64_t pos, double *x) {
    const int64_t half = p->rotary_dim / 2;
    const int64_t stride = p->rope_cache_row_stride ? p->rope_cache_row_stride : half;
    double mscale = 1.0;
    if (!cos_cache && p->rope_scaling == TK_ROPE_SCALING_YARN)
        mscale = p->rope_attention_factor > 0.0f ? (double)p->rope_attention_factor
                 : p->rope_factor > 1.0f         ? 0.1 * log((double)p->rope_factor) + 1.0
                                                 : 1.0;
    for (int64_t i = 0; i < half; i++) {
        double c, s;
        if (cos_cache) {
            c = cos_cache[pos * stride + i];
            s = sin_cache[pos * stride + i];
        } else {
            const double angle = (double)pos * rope_inv_freq(p, i);
            c = cos(angle) * mscale;
            s = sin(angle) * mscale;
        }
        const int64_t e1 = p->rope_style == TK_ROPE_GPTJ ? 2 * i : i;
        const int64_t e2 = p->rope_style == TK_ROPE_GPTJ ? 2 * i + 1 : i + half;
        const double a = x[e1], b = x[e2];
        x[e1] = tk_test_round(p->dtype, a * c - b * s);
        x[e2] = tk_test_round(p->dtype, b * c + a * s);
    }
}
