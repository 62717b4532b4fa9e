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
 */
#ifndef TK_ACTIVATION_MATH_CUH
#define TK_ACTIVATION_MATH_CUH

#include "tkern.h"

/* 1 / (1 + e^-x) with the fast exponential: relative error ~1e-7, far below f32 test bounds. */
__device__ __forceinline__ float tk_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

__device__ __forceinline__ float tk_relu(float x) { return x < 0.0f ? 0.0f : x; }

template <int Kind> __device__ __forceinline__ float tk_act_apply(float x) {
    if constexpr (Kind == TK_ACT_NONE) {
        return x;
    } else if constexpr (Kind == TK_ACT_GELU_ERF) {
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    } else if constexpr (Kind == TK_ACT_GELU_TANH) {
        const float u = 0.79788456080286536f * x * (1.0f + 0.044715f * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    } else if constexpr (Kind == TK_ACT_QUICK_GELU) {
        return x * tk_sigmoid(1.702f * x);
    } else if constexpr (Kind == TK_ACT_SILU) {
        return x * tk_sigmoid(x);
    } else if constexpr (Kind == TK_ACT_RELU) {
        return tk_relu(x);
    } else {
        static_assert(Kind == TK_ACT_RELU_SQUARED, "unknown tk_activation");
        const float r = tk_relu(x);
        return r * r;
    }
}

template <int Kind> __device__ __forceinline__ float tk_act_derivative(float x) {
    if constexpr (Kind == TK_ACT_NONE) {
        return 1.0f;
    } else if constexpr (Kind == TK_ACT_GELU_ERF) {
        const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
        const float pdf = 0.39894228040143268f * __expf(-0.5f * x * x);
        return cdf + x * pdf;
    } else if constexpr (Kind == TK_ACT_GELU_TANH) {
        const float k = 0.79788456080286536f;
        const float t = tanhf(k * x * (1.0f + 0.044715f * x * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
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
