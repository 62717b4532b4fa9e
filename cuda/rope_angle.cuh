/*
 * The RoPE angle, shared by the rotary kernels (cuda/rope.cu) and the KV-cache attention's
 * fused rotation (cuda/attention_kvcache.cu): cos and sin of an f64 angle p * inv_freq,
 * reduced to [-pi, pi] in f64 with a two-part 2 pi, then sincosf. The angle is exact to ~2e-7
 * rad for |p| < 2^30 (f32 sincos of the reduced value is ~1 ulp; __sincosf of the unreduced f32
 * product would be off by radians at large positions).
 */
#ifndef TK_CUDA_ROPE_ANGLE_CUH
#define TK_CUDA_ROPE_ANGLE_CUH

#include <math.h>

/* 2 pi as a sum of two doubles (hi has 53 bits, lo the next 53). */
constexpr double TK_ROPE_TWO_PI_HI = 6.283185307179586232;
constexpr double TK_ROPE_TWO_PI_LO = 2.4492935982947063e-16;
constexpr double TK_ROPE_INV_TWO_PI = 0.15915494309189533577;

/* FAST: __sincosf of the reduced angle (absolute error below 1e-6 on [-pi, pi]), for 16-bit
 * results: sincosf keeps a slow path for large arguments, never taken here, whose local memory
 * and call spill registers in small kernels. */
template <bool FAST = false> __device__ __forceinline__ void tk_rope_sincos(double angle, float *s, float *c) {
    const double k = rint(angle * TK_ROPE_INV_TWO_PI);
    const double reduced = fma(-k, TK_ROPE_TWO_PI_LO, fma(-k, TK_ROPE_TWO_PI_HI, angle));
    if constexpr (FAST)
        __sincosf((float)reduced, s, c);
    else
        sincosf((float)reduced, s, c);
}

#endif
