/* fp64 references for RMSNorm and LayerNorm, forward and backward. Inputs are doubles already
 * rounded to their storage dtype; rows are dense here (the tests gather strided rows). */
#ifndef TK_NORM_REF_H
#define TK_NORM_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "tkern.h"

/* Forward over rows x cols: h = x (+ residual, rounded to `dtype` as the library stores it),
 * written to h_out; y = norm(h). weight / bias may be NULL (1 / 0). mean_out is 0 for RMSNorm. */
void ref_norm_fwd(bool layernorm, tk_dtype dtype, int64_t rows, int64_t cols, const double *x,
                  const double *residual, const double *weight, const double *bias, bool gemma,
                  double eps, double *h_out, double *y, double *mean_out, double *rstd_out);

/* Backward from the given per-row stats (mean ignored for RMSNorm): dx (rows x cols), and the
 * column sums dw = sum dy xhat, db = sum dy (cols each). */
void ref_norm_bwd(bool layernorm, int64_t rows, int64_t cols, const double *dy, const double *x,
                  const double *weight, bool gemma, const double *mean, const double *rstd,
                  double *dx, double *dw, double *db);

#endif
