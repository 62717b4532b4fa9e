/* fp64 attention backward reference; see attention_bwd_ref.h. */
#include "attention_bwd_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "attention_ref.h"
#include "support/tk_test.h"

void ref_attention_bwd(const tk_attention_params *p, const double *q, const double *k,
                       const double *v, const double *dout, const float *alibi_slopes, bool naive,
                       double *dq, double *dk, double *dv) {
    const tk_dtype dt = p->dtype;
    const int64_t d = p->head_dim, sk = p->seqlen_k, group = p->heads_q / p->heads_kv;
    const double scale = p->softmax_scale > 0.0f ? (double)p->softmax_scale : 1.0 / sqrt((double)d);
    const size_t nq = (size_t)(p->batch * p->seqlen_q * p->heads_q * d);
    const size_t nk = (size_t)(p->batch * sk * p->heads_kv * d);
    memset(dq, 0, nq * sizeof *dq);
    memset(dk, 0, nk * sizeof *dk);
    memset(dv, 0, nk * sizeof *dv);
    double *prob = malloc((size_t)sk * sizeof(double)), *dp = malloc((size_t)sk * sizeof(double));
    double *deriv = malloc((size_t)sk * sizeof(double)), *o = malloc((size_t)d * sizeof(double));
    cr_assert(prob && dp && deriv && o);
#define ROUND(x) (naive ? tk_test_round(dt, (x)) : (x))
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->seqlen_q; i++) {
                double lse;
                ref_attention_row(p, q, k, v, alibi_slopes, b, h, i, naive, o, &lse);
                if (isinf(lse))
                    continue; /* sees no key: no gradient flows */
                const int64_t hk = h / group;
                const int64_t q_row = b * p->q_strides[0] + i * p->q_strides[1] + h * p->q_strides[2];
                const int64_t o_row = b * p->o_strides[0] + i * p->o_strides[1] + h * p->o_strides[2];
                double rowsum = 0.0;
                for (int64_t j = 0; j < sk; j++) {
                    prob[j] = dp[j] = 0.0;
                    if (!ref_attention_visible(p, b, i, j))
                        continue;
                    const int64_t k_row = b * p->k_strides[0] + j * p->k_strides[1] + hk * p->k_strides[2];
                    const int64_t v_row = b * p->v_strides[0] + j * p->v_strides[1] + hk * p->v_strides[2];
                    double dot = 0.0, g = 0.0;
                    for (int64_t e = 0; e < d; e++) {
                        dot += q[q_row + e] * k[k_row + e];
                        g += dout[o_row + e] * v[v_row + e];
                    }
                    double x = ROUND(dot * scale);
                    deriv[j] = 1.0;
                    if (p->softcap > 0.0f) {
                        const double t = tanh(x / p->softcap);
                        deriv[j] = 1.0 - t * t;
                        x = ROUND(p->softcap * t);
                    }
                    if (alibi_slopes)
                        x = ROUND(x - (double)alibi_slopes[h] * fabs((double)(i + sk - p->seqlen_q - j)));
                    prob[j] = ROUND(exp(x - lse));
                    dp[j] = ROUND(g);
                    rowsum += prob[j] * dp[j];
                }
                rowsum = ROUND(rowsum);
                const int64_t dq_row = ((b * p->seqlen_q + i) * p->heads_q + h) * d;
                for (int64_t j = 0; j < sk; j++) {
                    if (prob[j] == 0.0)
                        continue;
                    const double ds = ROUND(ROUND(prob[j] * (dp[j] - rowsum)) * deriv[j]);
                    const int64_t k_row = b * p->k_strides[0] + j * p->k_strides[1] + hk * p->k_strides[2];
                    const int64_t dk_row = ((b * sk + j) * p->heads_kv + hk) * d;
                    for (int64_t e = 0; e < d; e++) {
                        dq[dq_row + e] += ds * scale * k[k_row + e];
                        dk[dk_row + e] += ds * scale * q[q_row + e];
                        dv[dk_row + e] += prob[j] * dout[o_row + e];
                    }
                }
            }
    if (naive) {
        for (size_t x = 0; x < nq; x++)
            dq[x] = ROUND(dq[x]);
        for (size_t x = 0; x < nk; x++) {
            dk[x] = ROUND(dk[x]);
            dv[x] = ROUND(dv[x]);
        }
    }
#undef ROUND
    free(prob);
    free(dp);
    free(deriv);
    free(o);
}

void ref_attention_dsinks(const tk_attention_params *p, const double *q, const double *k,
                          const double *v, const double *dout, const float *alibi_slopes,
                          double *dsinks) {
    double *o = malloc((size_t)p->head_dim * sizeof(double));
    cr_assert(o != NULL);
    for (int64_t h = 0; h < p->heads_q; h++) {
        dsinks[h] = 0.0;
        for (int64_t b = 0; b < p->batch; b++)
            for (int64_t i = 0; i < p->seqlen_q; i++) {
                double lse, d = 0.0;
                ref_attention_row(p, q, k, v, alibi_slopes, b, h, i, false, o, &lse);
                const int64_t row = b * p->o_strides[0] + i * p->o_strides[1] + h * p->o_strides[2];
                for (int64_t e = 0; e < p->head_dim; e++)
                    d += dout[row + e] * o[e];
                dsinks[h] -= exp((double)p->sinks[h] - lse) * d;
            }
    }
    free(o);
}
