/* fp64 reference for rotary position embedding. */
#ifndef TK_ROPE_REF_H
#define TK_ROPE_REF_H

#include <stdint.h>

#include "tkern.h"

/* theta^(-2i / rotary_dim), in fp64. */
double ref_rope_inv_freq(double theta, int64_t i, int64_t rotary_dim);

/* Rotates one head: out[0..head_dim) from in[0..head_dim), pair i by the angle whose cosine and
 * sine are cos_a[i], sin_a[i] (negated for backward). Elements from rotary_dim on are copied. */
void ref_rope_head(tk_rope_style style, int64_t head_dim, int64_t rotary_dim, const double *in,
                   const double *cos_a, const double *sin_a, int backward, double *out);

#endif
