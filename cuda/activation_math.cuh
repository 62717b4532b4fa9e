/*
 * The activation functions and their derivatives as scalar f32 device functions, shared by the
 * activation kernels and the GEMM epilogue so that both compute exactly the same function.
 * `Kind` is a tk_activation value; each function folds to straight-line code at compile time.
 *
 *   GELU (erf)   f  = x Phi(x),                  Phi(x) = (1 + erf(x / sqrt 2)) / 2
 *                f' = Phi(x) + x phi(x),         phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 *   GELU (tanh)  f  = x (1 + tanh u) / 2,        u = sqrt(2/pi) (x + 0.044715 x^3)
 *                f' = (1 + t) / 2 + x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2) / 2, t = tanh u
 *   QuickGELU    f  = x s,  s = sigmoid(1.702 x);  f' = s + 1.702 x s (1 - s)
 *   SiLU         f  = x s,  s = sigmoid(x);        f' = s (1 + x (1 - s))
 *   ReLU         f  = max(x, 0);                   f' = [x > 0]
 *   ReLU^2       f  = max(x, 0)^2;                 f' = 2 max(x, 0)
 *
 * NaN propagates through every function (as in PyTorch): comparisons are written so that a NaN
 * input takes the branch that returns x.
 *
 * Two evaluations that matter for speed (a bf16 activation has ~30 instructions of issue budget
 * per element at the copy bandwidth of an H200, and one that uses most of it stops hiding its
 * memory latency):
 * - (1 + tanh u) / 2 is computed as sigmoid(2u) = 1 / (1 + e^-2u): one exponential and one
 *   reciprocal, no branches, and accurate in the negative tail where 1 + tanh u cancels.
 * - Phi(x) for outputs rounded to 16 bits (`Fast`): Abramowitz & Stegun 7.1.26 on |x| / sqrt 2,
 *   erfc(z) ~= t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^-z^2 with t = 1 / (1 + p z), absolute
 *   error < 1.5e-7, formed as the tail itself for x < 0 so that small results keep their
 *   relative accuracy. The f32 path (`Fast` = false) uses erff.
 */
#ifndef TK_ACTIVATION_MATH_CUH
#define TK_ACTIVATION_MATH_CUH

#include "tkern.h"
#include "core/math.cuh"

/* 1 / (1 + 2^t), the form every sigmoid here takes: relative error ~1e-7, far below f32 test
 * bounds; 0 for t -> +inf. RcpOnFma: the reciprocal by tk_rcp_fma, which needs a finite 1 + 2^t:
 * t is clamped at 127, where the result is 0 either way (a NaN t clamps there too; the callers'
 * x * sigmoid(...) stays NaN through x, and -inf * 0 is NaN as with the MUFU form). Checked on the
 * CPU (exact 2^t standing in for ex2.approx): GELU (tanh) with this reciprocal is within 1.1e-5 of
 * fp64 at every 3rd float in [-20, 20], as with an exact reciprocal, and gives the MUFU form's
 * values at +-inf, NaN, -1e30, -200 and -30. */
template <bool RcpOnFma = false> __device__ __forceinline__ float tk_inv_1p_exp2(float t) {
    if constexpr (RcpOnFma)
        return tk_rcp_fma(1.0f + tk_exp2_approx(fminf(t, 127.0f)));
    else
        return tk_rcp_approx(1.0f + tk_exp2_approx(t));
}

/* 1 / (1 + e^-x) */
template <bool RcpOnFma = false> __device__ __forceinline__ float tk_sigmoid(float x) {
    return tk_inv_1p_exp2<RcpOnFma>(-1.4426950408889634f * x);
}

__device__ __forceinline__ float tk_relu(float x) { return x < 0.0f ? 0.0f : x; }

/* e^(-x^2 / 2): the Gaussian factor of both phi(x) and the A&S tail of Phi(x). */
__device__ __forceinline__ float tk_gauss(float x) { return tk_exp2_approx(-0.5f * 1.4426950408889634f * x * x); }

/* Phi(x), the standard normal CDF; `Fast` for results that are rounded to 16 bits, given
 * gauss = tk_gauss(x) (which the GELU derivative shares with phi(x)). */
template <bool Fast> __device__ __forceinline__ float tk_normal_cdf(float x, float gauss) {
    if constexpr (!Fast) {
        (void)gauss;
        return 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    } else {
        /* z = |x| / sqrt 2 and the 1/2 of erfc / 2 are folded into the constants (p / sqrt 2,
         * a_i / 2): two multiplies fewer per element. e^(-z^2) = e^(-x^2 / 2) = gauss. */
        const float t = tk_rcp_approx(1.0f + (0.3275911f * 0.70710678118654752f) * fabsf(x));
        const float half_poly = t * (0.5f * 0.254829592f +
                                     t * (0.5f * -0.284496736f +
                                          t * (0.5f * 1.421413741f + t * (0.5f * -1.453152027f + t * (0.5f * 1.061405429f)))));
        const float half_erfc = half_poly * gauss;
        return x < 0.0f ? half_erfc : 1.0f - half_erfc;
    }
}

/* sigmoid(2 u) with u = sqrt(2/pi) (x + 0.044715 x^3): the (1 + tanh u) / 2 of tanh-GELU. */
template <bool RcpOnFma = false> __device__ __forceinline__ float tk_gelu_tanh_gate(float x) {
    /* -2u log2(e) = x (c1 + c2 x^2) with the constants folded: 3 instructions where the compiler,
     * which may not reassociate, emits 6 for the product of the written factors. */
    constexpr float c1 = -2.0f * 0.79788456080286536f * 1.4426950408889634f;
    constexpr float c2 = c1 * 0.044715f;
    return tk_inv_1p_exp2<RcpOnFma>(x * fmaf(c2, x * x, c1));
}

/* f(x) for activation `Kind` (a tk_activation); `Fast` when the result is rounded to 16 bits;
 * RcpOnFma: a sigmoid's reciprocal on the FMA pipe (tk_rcp_fma; GELU tanh, QuickGELU, SiLU). */
template <int Kind, bool Fast = false, bool RcpOnFma = false> __device__ __forceinline__ float tk_act_apply(float x) {
    if constexpr (Kind == TK_ACT_NONE) {
        return x;
    } else if constexpr (Kind == TK_ACT_GELU_ERF) {
        return x * tk_normal_cdf<Fast>(x, Fast ? tk_gauss(x) : 0.0f);
    } else if constexpr (Kind == TK_ACT_GELU_TANH) {
        return x * tk_gelu_tanh_gate<RcpOnFma>(x);
    } else if constexpr (Kind == TK_ACT_QUICK_GELU) {
        return x * tk_sigmoid<RcpOnFma>(1.702f * x);
    } else if constexpr (Kind == TK_ACT_SILU) {
        return x * tk_sigmoid<RcpOnFma>(x);
    } else if constexpr (Kind == TK_ACT_RELU) {
        return tk_relu(x);
    } else {
        static_assert(Kind == TK_ACT_RELU_SQUARED, "unknown tk_activation");
        const float r = tk_relu(x);
        return r * r;
    }
}

/* f'(x) for activation `Kind`; `Fast` as for tk_act_apply. */
template <int Kind, bool Fast = false> __device__ __forceinline__ float tk_act_derivative(float x) {
    if constexpr (Kind == TK_ACT_NONE) {
        return 1.0f;
    } else if constexpr (Kind == TK_ACT_GELU_ERF) {
        const float gauss = tk_gauss(x);
        return tk_normal_cdf<Fast>(x, gauss) + x * (0.39894228040143268f * gauss);
    } else if constexpr (Kind == TK_ACT_GELU_TANH) {
        /* with s = sigmoid(2u): (1 + t) / 2 = s and (1 - t^2) / 2 = 2 s (1 - s) */
        const float s = tk_gelu_tanh_gate(x);
        return s + 2.0f * x * s * (1.0f - s) * 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);
    } else if constexpr (Kind == TK_ACT_QUICK_GELU) {
        const float s = tk_sigmoid(1.702f * x);
        return s + 1.702f * x * s * (1.0f - s);
    } else if constexpr (Kind == TK_ACT_SILU) {
        const float s = tk_sigmoid(x);
        return s * (1.0f + x * (1.0f - s));
    } else if constexpr (Kind == TK_ACT_RELU) {
        return x > 0.0f ? 1.0f : (x <= 0.0f ? 0.0f : x);
    } else {
        static_assert(Kind == TK_ACT_RELU_SQUARED, "unknown tk_activation");
        return 2.0f * tk_relu(x);
    }
}

#endif
