/* fp64 reference for the attention backward: the gradients of attention_ref.h's forward, and
 * the naive same-precision backward that the accuracy rule compares against. */
#ifndef TK_ATTENTION_BWD_REF_H
#define TK_ATTENTION_BWD_REF_H

#include <stdbool.h>

#include "tkern.h"

/* dq, dk, dv of the forward p describes (p->x_strides explicit, not all 0; dout laid out with
 * p->o_strides) for the stored inputs q, k, v, dout converted to double and host alibi slopes
 * (or NULL). Outputs are dense [batch, seq, heads, head_dim] arrays of double, overwritten.
 * exact: everything in fp64. naive: a framework's unfused autograd in p->dtype, rounding where it
 * stores a tensor: the scores (as ref_attention_row does), the probabilities, dP, the row sums
 * D, dS before and after softcap's derivative, and the gradients. */
void ref_attention_bwd(const tk_attention_params *p, const double *q, const double *k,
                       const double *v, const double *dout, const float *alibi_slopes, bool naive,
                       double *dq, double *dk, double *dv);

/* The gradient of each sink logit, dsinks[h] = -sum over b, i of exp(sink_h - lse_bhi)
 * (dout_bhi . o_bhi), in fp64 from the exact forward (p->sinks a host array, as in
 * ref_attention_row; dout laid out with p->o_strides). */
void ref_attention_dsinks(const tk_attention_params *p, const double *q, const double *k,
                          const double *v, const double *dout, const float *alibi_slopes,
                          double *dsinks);

#endif
