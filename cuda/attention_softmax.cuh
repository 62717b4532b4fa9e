/*
 * The score transform, mask and online softmax of the attention forward, on the scores of one
 * m16 slab of a warp in the tensor cores' accumulator layout: s[nt][e] is row g + 8 (e >> 1)
 * of the slab (g = lane / 4), key column col0 + 8 nt + (e & 1) (col0 = the tile's first key +
 * 2 (lane % 4)). That layout is the one of mma.sync m16n8 (attention.cuh) and of each warp's
 * 16 rows of wgmma m64nN (attention_sm90.cu), so both kernels share these steps; the math and
 * the mask convention are those of attention.cuh's header (tkern.h has the contract).
 */
#ifndef TK_ATTENTION_SOFTMAX_CUH
#define TK_ATTENTION_SOFTMAX_CUH

#include "core/math.cuh"

namespace {

/* Scores to natural-log units where a transform is on: softcap * tanh(s * softcap_in), else
 * s * scale; then minus slope * |i + shift - j| with ALiBi. row0: the slab's row g position. */
template <int NT>
__device__ __forceinline__ void attn_transform_scores(float (&s)[NT][4], float softcap, float softcap_in,
                                                      float scale, bool alibi, float slope, int row0,
                                                      int col0, int shift) {
    if (softcap > 0.0f) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[nt][e] = softcap * tanhf(s[nt][e] * softcap_in);
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[nt][e] *= scale;
    }
    if (alibi) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = row0 + 8 * (e >> 1);
                const int j = col0 + 8 * nt + (e & 1);
                s[nt][e] -= slope * (float)abs(i + shift - j);
            }
    }
}

/* -inf where key j is not visible from row i: j < i + shift - window_left, j > i + shift +
 * window_right (a window of -1 is unbounded) or j >= seqlen_k. */
template <int NT>
__device__ __forceinline__ void attn_mask_scores(float (&s)[NT][4], int row0, int col0, int shift,
                                                 int window_left, int window_right, int seqlen_k) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = row0 + 8 * h;
        const int lo = window_left >= 0 ? i + shift - window_left : 0;
        const int hi = window_right >= 0 ? min(seqlen_k - 1, i + shift + window_right) : seqlen_k - 1;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int j = col0 + 8 * nt + e;
                if (j < lo || j > hi)
                    s[nt][2 * h + e] = -INFINITY;
            }
    }
}

/* One key tile of the online softmax for the slab's two rows (the 4 threads of a quad share a
 * row): the running max and this thread's partial sum move on, s becomes p = exp2(s exp_scale
 * - m exp_scale), and alpha[h] is the factor the row's output accumulators must be scaled by. */
template <int NT>
__device__ __forceinline__ void attn_online_softmax(float (&s)[NT][4], float (&row_max)[2], float (&row_sum)[2],
                                                    float exp_scale, float (&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = row_max[h];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        /* A row that has seen only masked keys keeps max -inf; exponentiate against 0 so that
         * its p are exp2(-inf) = 0 rather than NaN. */
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        alpha[h] = tk_exp2_approx((row_max[h] - m_use) * exp_scale);
        const float base = m_use * exp_scale;
        row_max[h] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float pe = tk_exp2_approx(fmaf(s[nt][2 * h + e], exp_scale, -base));
                s[nt][2 * h + e] = pe;
                sum += pe;
            }
        row_sum[h] = row_sum[h] * alpha[h] + sum;
    }
}

} // namespace

#endif
