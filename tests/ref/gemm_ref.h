/* fp64 reference for tk_gemm, on host copies of the matrices. */
#ifndef TK_GEMM_REF_H
#define TK_GEMM_REF_H

#include <stdint.h>

#include "tkern.h"

/* product[i * n + j] = sum_k A[i, k] B(k, j) in fp64, A and B of dtype `in`, B read in
 * `layout` (see tk_gemm_b_layout). */
void ref_gemm_product(tk_dtype in, tk_gemm_b_layout layout, const void *a, int64_t lda,
                      const void *b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                      double *product);

/* d[i * n + j] = act(alpha * product[i * n + j] + beta * C[i, j] + bias[j]) with the shape,
 * dtypes, ldc, activation, alpha and beta of *p; c and bias are host copies (output dtype) that
 * stand for p->c and p->bias (c is read only when beta != 0, bias may be NULL). */
void ref_gemm_epilogue(const tk_gemm_params *p, const double *product, const void *c,
                       const void *bias, double *d);

#endif
