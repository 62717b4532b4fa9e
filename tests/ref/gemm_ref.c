/* fp64 reference for tk_gemm; see gemm_ref.h. */
#include "gemm_ref.h"

#include <stdlib.h>

#include "activation_ref.h"
#include "support/tk_test.h"

void ref_gemm_product(tk_dtype in, tk_gemm_b_layout layout, const void *a, int64_t lda,
                      const void *b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                      double *product) {
    /* B as a dense [k, n] fp64 array and one row of A at a time, so that the inner loop runs
     * over contiguous memory (i-k-j order). */
    double *dense_b = malloc((size_t)(k * n) * sizeof(double));
    double *a_row = malloc((size_t)k * sizeof(double));
    cr_assert(dense_b && a_row, "ref_gemm_product: out of host memory");
    for (int64_t kk = 0; kk < k; kk++)
        for (int64_t j = 0; j < n; j++)
            dense_b[kk * n + j] = tk_test_load(in, b, layout == TK_GEMM_B_KN ? kk * ldb + j : j * ldb + kk);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t kk = 0; kk < k; kk++)
            a_row[kk] = tk_test_load(in, a, i * lda + kk);
        double *row = product + i * n;
        for (int64_t j = 0; j < n; j++)
            row[j] = 0.0;
        for (int64_t kk = 0; kk < k; kk++) {
            const double av = a_row[kk];
            const double *b_row = dense_b + kk * n;
            for (int64_t j = 0; j < n; j++)
                row[j] += av * b_row[j];
        }
    }
    free(dense_b);
    free(a_row);
}

void ref_gemm_epilogue(const tk_gemm_params *p, const double *product, const void *c,
                       const void *bias, double *d) {
    for (int64_t i = 0; i < p->m; i++)
        for (int64_t j = 0; j < p->n; j++) {
            double v = (double)p->alpha * product[i * p->n + j];
            if (p->beta != 0.0f)
                v += (double)p->beta * tk_test_load(p->output_dtype, c, i * p->ldc + j);
            if (bias)
                v += tk_test_load(p->output_dtype, bias, j);
            d[i * p->n + j] = ref_activation(p->activation, v);
        }
}
