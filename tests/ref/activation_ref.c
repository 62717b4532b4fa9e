/* fp64 references for activations and GLUs, written from the definitions (erf, tanh, exp), not
 * from the kernels' formulas. */
#include "activation_ref.h"

#include <math.h>

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static const double SQRT_2_OVER_PI = 0.79788456080286535588;

double ref_activation(tk_activation kind, double x) {
    switch (kind) {
    case TK_ACT_NONE: return x;
    case TK_ACT_GELU_ERF: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case TK_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)));
    case TK_ACT_QUICK_GELU: return x * sigmoid(1.702 * x);
    case TK_ACT_SILU: return x * sigmoid(x);
    case TK_ACT_RELU: return x > 0 ? x : 0.0;
    case TK_ACT_RELU_SQUARED: return x > 0 ? x * x : 0.0;
    }
    return NAN;
}

double ref_activation_grad(tk_activation kind, double x) {
    switch (kind) {
    case TK_ACT_NONE: return 1.0;
    case TK_ACT_GELU_ERF:
        return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) * 0.39894228040143267794 /* 1 / sqrt(2 pi) */;
    case TK_ACT_GELU_TANH: {
        double u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
        double du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
        double t = tanh(u);
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
    }
    case TK_ACT_QUICK_GELU: {
        double s = sigmoid(1.702 * x);
        return s + x * 1.702 * s * (1.0 - s);
    }
    case TK_ACT_SILU: {
        double s = sigmoid(x);
        return s + x * s * (1.0 - s);
    }
    case TK_ACT_RELU: return x > 0 ? 1.0 : 0.0;
    case TK_ACT_RELU_SQUARED: return x > 0 ? 2.0 * x : 0.0;
    }
    return NAN;
}

static tk_activation gate_kind(tk_glu kind) {
    switch (kind) {
    case TK_GLU_SWIGLU: return TK_ACT_SILU;
    case TK_GLU_GEGLU_ERF: return TK_ACT_GELU_ERF;
    case TK_GLU_GEGLU_TANH: return TK_ACT_GELU_TANH;
    case TK_GLU_REGLU: return TK_ACT_RELU;
    case TK_GLU_SWIGLU_CLAMPED: break;
    }
    return TK_ACT_NONE;
}

double ref_glu(const tk_glu_params *p, double g, double u) {
    if (p->kind == TK_GLU_SWIGLU_CLAMPED) {
        double L = p->limit, a = p->alpha;
        double gc = fmin(g, L), uc = fmax(fmin(u, L), -L);
        return gc * sigmoid(a * gc) * (uc + 1.0);
    }
    return ref_activation(gate_kind(p->kind), g) * u;
}

void ref_glu_grad(const tk_glu_params *p, double g, double u, double dy, double *dg, double *du) {
    if (p->kind == TK_GLU_SWIGLU_CLAMPED) {
        double L = p->limit, a = p->alpha;
        double gc = fmin(g, L), uc = fmax(fmin(u, L), -L);
        double s = sigmoid(a * gc);
        *dg = g <= L ? dy * (uc + 1.0) * (s + a * gc * s * (1.0 - s)) : 0.0;
        *du = (u >= -L && u <= L) ? dy * gc * s : 0.0;
        return;
    }
    tk_activation k = gate_kind(p->kind);
    *dg = dy * u * ref_activation_grad(k, g);
    *du = dy * ref_activation(k, g);
}
