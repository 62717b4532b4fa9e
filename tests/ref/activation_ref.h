/* fp64 references for the activation and GLU families. */
#ifndef TK_ACTIVATION_REF_H
#define TK_ACTIVATION_REF_H

#include "tkern.h"

double ref_activation(tk_activation kind, double x);
/* d/dx of ref_activation; ReLU's derivative at 0 is 0. */
double ref_activation_grad(tk_activation kind, double x);

double ref_glu(const tk_glu_params *p, double gate, double up);
void ref_glu_grad(const tk_glu_params *p, double gate, double up, double dy, double *dgate,
                  double *dup);

#endif
