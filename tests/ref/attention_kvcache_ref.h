/* fp64 reference for attention over a KV cache (tk_attention_kvcache_fwd), and the naive
 * same-precision implementation of FlashAttention's accuracy rule. */
#ifndef TK_ATTENTION_KVCACHE_REF_H
#define TK_ATTENTION_KVCACHE_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "tkern.h"

/* Host copies of a call's inputs: q and the caches converted to double in the call's layout
 * (p's strides explicit, not all 0), and the device-side arrays as the host wrote them. */
typedef struct ref_kvcache_inputs {
    const tk_attention_kvcache_params *p;
    const double *q, *k, *v;
    const int32_t *seqlens_k;     /* [batch] */
    const int32_t *cu_seqlens_q;  /* [batch + 1], or NULL when p has none */
    const int32_t *block_table;   /* as p->block_table, or NULL */
    const float *alibi_slopes;    /* [heads_q], or NULL */
    const float *sinks;           /* [heads_q] sink logits, or NULL */
} ref_kvcache_inputs;

/* Queries of sequence b and the token of its first one. */
int64_t ref_kvcache_seqlen_q(const ref_kvcache_inputs *in, int64_t b, int64_t *first_token);

/* Whether query i of sequence b sees key j (tkern.h's convention, per sequence: the window and
 * chunk_size). */
bool ref_kvcache_visible(const ref_kvcache_inputs *in, int64_t b, int64_t i, int64_t j);

/* Element offset of key j of sequence b, key/value head hk, in the k cache (v: is_v). */
int64_t ref_kvcache_key_offset(const ref_kvcache_inputs *in, int64_t b, int64_t j, int64_t hk,
                               bool is_v);

/* Output row of query i of sequence b, query head h (head_dim values) and its lse. exact:
 * everything in fp64. naive: rounded to p->dtype where an unfused implementation stores a
 * tensor (scores after the scale, softcap and ALiBi; probabilities; the output). A sink joins
 * the denominator. A query that sees no key gets o = 0 and lse = the sink (-inf without one). */
void ref_kvcache_row(const ref_kvcache_inputs *in, int64_t b, int64_t i, int64_t h, bool naive,
                     double *o, double *lse);

/* RoPE in fp64 of one head's row x (head_dim values, in place) at position pos, as p describes
 * it (rope_style, rotary_dim, angles from rope_theta with p's scaling, or from the host copies
 * cos_cache / sin_cache of p's cache), each rotated value rounded to p->dtype. The frequencies
 * follow Hugging Face's rope_init functions "default", "llama3" and "yarn", in fp64. */
void ref_kvcache_rope(const tk_attention_kvcache_params *p, const float *cos_cache,
                      const float *sin_cache, int64_t pos, double *x);

#endif
