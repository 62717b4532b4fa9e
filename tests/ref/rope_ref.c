/* fp64 RoPE reference, from the definitions in include/tkern.h. */
#include "rope_ref.h"

#include <math.h>

double ref_rope_inv_freq(double theta, int64_t i, int64_t rotary_dim) {
    return pow(theta, -2.0 * (double)i / (double)rotary_dim);
}

void ref_rope_head(tk_rope_style style, int64_t head_dim, int64_t rotary_dim, const double *in,
                   const double *cos_a, const double *sin_a, int backward, double *out) {
    const int64_t half = rotary_dim / 2;
    for (int64_t c = rotary_dim; c < head_dim; c++)
        out[c] = in[c];
    for (int64_t i = 0; i < half; i++) {
        const int64_t i1 = style == TK_ROPE_NEOX ? i : 2 * i;
        const int64_t i2 = style == TK_ROPE_NEOX ? i + half : 2 * i + 1;
        const double c = cos_a[i], s = backward ? -sin_a[i] : sin_a[i];
        out[i1] = in[i1] * c - in[i2] * s;
        out[i2] = in[i2] * c + in[i1] * s;
    }
}
