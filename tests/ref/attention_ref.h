/* fp64 reference for attention forward, and the naive same-precision implementation that
 * FlashAttention's accuracy rule compares against. */
#ifndef TK_ATTENTION_REF_H
#define TK_ATTENTION_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "tkern.h"

/* Whether query row i of batch b sees key j under p's mask (tkern.h's convention). Here
 * p->document_ids and p->sinks, when set, are HOST arrays (the tests' reference copy of the
 * params). */
bool ref_attention_visible(const tk_attention_params *p, int64_t b, int64_t i, int64_t j);

/* Number of visible (query, key) pairs of one head of batch 0: the work attention must do. */
int64_t ref_attention_visible_pairs(const tk_attention_params *p);

/* One output row o[b, i, h, :] (head_dim values) and its lse, from the stored inputs q, k, v
 * converted to double, laid out with p's strides (p->x_strides explicit, not all 0), and host
 * alibi slopes (or NULL).
 * exact: everything in fp64 from the stored inputs. naive: the same-precision implementation,
 * rounding to p->dtype where a framework's unfused attention stores a tensor: the scores after
 * the scale, after the softcap and after ALiBi, the probabilities, and the output.
 * With p->sinks (host) the sink joins the denominator and lse. A row that sees no key gets
 * o = 0 and lse = -inf, or the sink. */
void ref_attention_row(const tk_attention_params *p, const double *q, const double *k,
                       const double *v, const float *alibi_slopes, int64_t b, int64_t h,
                       int64_t i, bool naive, double *o, double *lse);

/* Strides of a [batch, seq, heads, head_dim] tensor as the attention tests lay it out, and its
 * element count: dense [B, S, H, D], or (bhsd) [B, H, S, D] with rows padded by 8 elements and
 * batches by 64, so that a write outside the tensor lands in poisoned padding. */
int64_t ref_attention_layout(bool bhsd, int64_t batch, int64_t seq, int64_t heads,
                             int64_t head_dim, int64_t st[4]);

/* FlashAttention's representation term: twice the largest change that adding and removing 0.3
 * in dtype makes to a reference value. */
double ref_attention_representation_term(tk_dtype dtype, double exact);

/* Document ids [batch, seqlen_k] of packed documents of about doc_len keys (caller frees): a
 * new document every doc_len keys and a third of the way into every other one, the pattern
 * moved by 7 keys per batch, so that lengths vary and runs cut tiles anywhere. */
int32_t *ref_attention_doc_ids(int64_t batch, int64_t seqlen_k, int64_t doc_len);

/* n elements of a host array of dtype as doubles (caller frees). */
double *ref_to_double(tk_dtype dtype, const void *host, int64_t n);

#endif
