/*
 * Fast scalar math on the special-function unit (MUFU) and the FMA pipe, shared by every kernel:
 * the one home of the ex2.approx / rcp.approx inline PTX; and division by a divisor fixed for a
 * launch (tk_divider: made on the host, applied on the device). Header-only.
 */
#ifndef TK_CORE_MATH_CUH
#define TK_CORE_MATH_CUH

/* 2^x and 1 / x on the special-function unit, flushing subnormals: one MUFU instruction each.
 * exp2f / __expf / __fdividef add 3-4 instructions per call that rescale subnormal operands, and
 * a bf16 activation has ~30 instructions of budget per element at the copy bandwidth. Flushing only
 * changes results below 2^-126 in magnitude, far under every test bound. */
__device__ __forceinline__ float tk_exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float tk_rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* 1 / y for finite y >= 1 on the FMA pipe instead of the special-function unit, for code bound
 * by the latter (the GEMM epilogue runs while the tensor cores idle, 2 MUFU operations per
 * element for a sigmoid): a seed from the bit pattern (0x7EF311C3 - bits(y): relative error
 * <= 0.101), then three Newton steps r += r (1 - y r), each 2 FMA. Measured on the CPU with the
 * same operations over every 7th float in [1, 2^126]: <= 1 ulp from the correctly rounded 1 / y,
 * as rcp.approx. Above ~1.9 * 2^126 the seed saturates at 0 and so does the result (rcp.approx.ftz
 * flushes those results to 0 too). 8 instructions instead of one MUFU.RCP, on a pipe with 8x its
 * throughput. */
__device__ __forceinline__ float tk_rcp_fma(float y) {
    float r = __int_as_float(max(0x7EF311C3 - __float_as_int(y), 0));
#pragma unroll
    for (int step = 0; step < 3; step++)
        r = fmaf(r, fmaf(-y, r, 1.0f), r);
    return r;
}

/* n / d for 0 <= n < 2^31 and 1 <= d < 2^31 by a multiply-high, an add and a shift instead of the
 * ~20-instruction integer division (Granlund and Montgomery, "Division by invariant integers using
 * multiplication", 1994): with s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, both
 * made once on the host, n / d = (umulhi(n, m) + n) >> s; the sum stays below 2^32 because
 * umulhi(n, m) <= n < 2^31. Kernels that find a key's page (n / page_size) per tile use it. */
struct tk_divider {
    unsigned d, mul, shift;
};

__host__ __device__ inline tk_divider tk_divider_of(unsigned d) {
    unsigned shift = 0;
    while ((1ull << shift) < d)
        shift++;
    const unsigned long long mul = (((1ull << shift) - d) << 32) / d + 1;
    return tk_divider{d, (unsigned)mul, shift};
}

__device__ __forceinline__ int tk_div(int n, const tk_divider &v) {
    return (int)((__umulhi((unsigned)n, v.mul) + (unsigned)n) >> v.shift);
}

#endif
