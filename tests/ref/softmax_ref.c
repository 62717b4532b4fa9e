/* fp64 softmax references, written from the definitions (natural exp / log, max subtracted for
 * range only), not from the kernels' base-2 formulas. */
#include "softmax_ref.h"

#include <math.h>

int64_t ref_softmax_visible(const tk_softmax_params *p, int64_t row) {
    if (!p->causal)
        return p->cols;
    const int64_t period = p->causal_period ? p->causal_period : p->rows;
    const int64_t last = row % period + p->causal_offset; /* last visible column */
    if (last < 0)
        return 0;
    return last + 1 < p->cols ? last + 1 : p->cols;
}

void ref_softmax_row(const double *x, int64_t cols, int64_t len, double scale, int log_softmax, double *y) {
    double m = -INFINITY, s = 0.0;
    for (int64_t c = 0; c < len; c++)
        m = fmax(m, scale * x[c]);
    for (int64_t c = 0; c < len; c++)
        s += exp(scale * x[c] - m);
    for (int64_t c = 0; c < cols; c++) {
        if (c >= len)
            y[c] = log_softmax ? -INFINITY : 0.0;
        else
            y[c] = log_softmax ? scale * x[c] - m - log(s) : exp(scale * x[c] - m) / s;
    }
}

void ref_softmax_bwd_row(const double *y, const double *dy, int64_t cols, int64_t len, double scale,
                         int log_softmax, double *dx) {
    double dot = 0.0;
    for (int64_t c = 0; c < len; c++)
        dot += log_softmax ? dy[c] : dy[c] * y[c];
    for (int64_t c = 0; c < cols; c++) {
        if (c >= len)
            dx[c] = 0.0;
        else
            dx[c] = log_softmax ? scale * (dy[c] - exp(y[c]) * dot) : scale * y[c] * (dy[c] - dot);
    }
}
