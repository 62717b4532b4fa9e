/* fp64 references for softmax and log-softmax (forward and backward), one row at a time. */
#ifndef TK_SOFTMAX_REF_H
#define TK_SOFTMAX_REF_H

#include <stdint.h>

#include "tkern.h"

/* Visible columns of `row` under p's causal mask (cols without one). */
int64_t ref_softmax_visible(const tk_softmax_params *p, int64_t row);

/* y[0..cols) from x[0..cols) with the first len columns visible: softmax(scale x) or its log;
 * masked columns 0 (softmax) or -inf (log-softmax). */
void ref_softmax_row(const double *x, int64_t cols, int64_t len, double scale, int log, double *y);

/* dx from y and dy (see tk_softmax_bwd); masked columns 0. */
void ref_softmax_bwd_row(const double *y, const double *dy, int64_t cols, int64_t len, double scale, int log,
                         double *dx);

#endif
