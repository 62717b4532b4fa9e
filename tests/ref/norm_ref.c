/* fp64 references for RMSNorm and LayerNorm, written from the definitions (PyTorch's
 * nn.RMSNorm / nn.LayerNorm: biased variance, eps inside the square root) and the gradients
 * derived by hand, not from the kernels' formulas. */
#include "norm_ref.h"

#include <math.h>

#include "support/tk_test.h"

static double scale_of(const double *weight, bool gemma, int64_t c) {
    if (weight == NULL)
        return 1.0;
    return gemma ? 1.0 + weight[c] : weight[c];
}

void ref_norm_fwd(bool layernorm, tk_dtype dtype, int64_t rows, int64_t cols, const double *x,
                  const double *residual, const double *weight, const double *bias, bool gemma,
                  double eps, double *h_out, double *y, double *mean_out, double *rstd_out) {
    for (int64_t r = 0; r < rows; r++) {
        double *h = h_out + r * cols;
        for (int64_t c = 0; c < cols; c++)
            h[c] = residual ? tk_test_round(dtype, x[r * cols + c] + residual[r * cols + c]) : x[r * cols + c];
        double mean = 0.0;
        if (layernorm) {
            for (int64_t c = 0; c < cols; c++)
                mean += h[c];
            mean /= (double)cols;
        }
        double var = 0.0;
        for (int64_t c = 0; c < cols; c++)
            var += (h[c] - mean) * (h[c] - mean);
        var /= (double)cols;
        const double rstd = 1.0 / sqrt(var + eps);
        for (int64_t c = 0; c < cols; c++)
            y[r * cols + c] = (h[c] - mean) * rstd * scale_of(weight, gemma, c) + (bias ? bias[c] : 0.0);
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

void ref_norm_bwd(bool layernorm, int64_t rows, int64_t cols, const double *dy, const double *x,
                  const double *weight, bool gemma, const double *mean, const double *rstd,
                  double *dx, double *dw, double *db) {
    for (int64_t c = 0; c < cols; c++)
        dw[c] = db[c] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double mu = layernorm ? mean[r] : 0.0, s = rstd[r];
        double sum_g = 0.0, sum_gx = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            const double xhat = (x[r * cols + c] - mu) * s;
            const double g = dy[r * cols + c] * scale_of(weight, gemma, c);
            sum_g += g;
            sum_gx += g * xhat;
            dw[c] += dy[r * cols + c] * xhat;
            db[c] += dy[r * cols + c];
        }
        for (int64_t c = 0; c < cols; c++) {
            const double xhat = (x[r * cols + c] - mu) * s;
            const double g = dy[r * cols + c] * scale_of(weight, gemma, c);
            dx[r * cols + c] = s * (g - (layernorm ? sum_g / (double)cols : 0.0) - xhat * sum_gx / (double)cols);
        }
    }
}
