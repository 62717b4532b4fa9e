/*
 * The score transform, mask and online softmax of the attention forward, on a warp's MT m16
 * slabs of scores in the tensor cores' accumulator layout: s[mt][nt][e] is row row0 + 16 mt +
 * 8 (e >> 1) (row0 = the warp's first row + lane / 4), key column col0 + 8 nt + (e & 1) (col0 =
 * the tile's first key + 2 (lane % 4)); o[mt][dt][e] the same rows. That layout is the one of mma.sync m16n8 (attention.cuh) and of each warp's
 * 16 rows of wgmma m64nN (attention_sm90.cu), so both kernels share these steps; the math and
 * the mask convention are those of attention.cuh's header (tkern.h has the contract).
 */
#ifndef TK_ATTENTION_SOFTMAX_CUH
#define TK_ATTENTION_SOFTMAX_CUH

#include "core/math.cuh"

namespace {

constexpr float ATTN_LOG2E = 1.4426950408889634f;

/* The score transform's constants in a kernel's params P (its fields transform, scale, softcap,
 * softcap_in and exp_scale), set on the host from the call. Exponentials are exp2, so log2(e) is
 * folded into exp_scale, and with no transform (no softcap, no ALiBi) the softmax scale too. */
template <typename P> inline void attn_set_score(P &p, float scale, float softcap, bool alibi) {
    p.transform = softcap > 0.0f || alibi;
    p.scale = scale;
    p.softcap = softcap;
    p.softcap_in = softcap > 0.0f ? scale / softcap : 0.0f;
    p.exp_scale = p.transform ? ATTN_LOG2E : scale * ATTN_LOG2E;
}

/* Scores to natural-log units where a transform is on: softcap * tanh(s * softcap_in), else
 * s * scale; then minus slope * |i + shift - j| with ALiBi. s[mt] is the slab of rows
 * row0 + 16 mt (+ 8). */
template <int MT, int NT>
__device__ __forceinline__ void attn_transform_scores(float (&s)[MT][NT][4], float softcap, float softcap_in,
                                                      float scale, bool alibi, float slope, int row0,
                                                      int col0, int shift) {
    if (softcap > 0.0f) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nt][e] = softcap * tanhf(s[mt][nt][e] * softcap_in);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nt][e] *= scale;
    }
    if (alibi) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = row0 + 16 * mt + 8 * (e >> 1);
                    const int j = col0 + 8 * nt + (e & 1);
                    s[mt][nt][e] -= slope * (float)abs(i + shift - j);
                }
    }
}

/* The keys that query positions first..last see together: lo..hi, empty when hi < lo (the
 * visibility rule of attn_mask_scores, applied to a band of rows). */
__device__ __forceinline__ void attn_visible_keys(int first, int last, int shift, int seqlen_k, int window_left,
                                                  int window_right, int &lo, int &hi) {
    lo = window_left >= 0 ? max(0, first + shift - window_left) : 0;
    hi = window_right >= 0 ? min(seqlen_k - 1, last + shift + window_right) : seqlen_k - 1;
}

/* Whether keys n0 .. n0 + cols - 1 hold a pair invisible to some query position of first..last
 * (a window edge crosses them, or they pass the last key): only such tiles need
 * attn_mask_scores. */
__device__ __forceinline__ bool attn_tile_partial(int n0, int cols, int first, int last, int shift, int seqlen_k,
                                                  int window_left, int window_right) {
    return n0 + cols > seqlen_k || (window_left >= 0 && n0 < last + shift - window_left) ||
           (window_right >= 0 && n0 + cols - 1 > first + shift + window_right);
}

/* -inf where key j is not visible from row i: j < i + shift - window_left, j > i + shift +
 * window_right (a window of -1 is unbounded) or j >= seqlen_k. */
template <int MT, int NT>
__device__ __forceinline__ void attn_mask_scores(float (&s)[MT][NT][4], int row0, int col0, int shift,
                                                 int window_left, int window_right, int seqlen_k) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = row0 + 16 * mt + 8 * h;
            const int lo = window_left >= 0 ? i + shift - window_left : 0;
            const int hi = window_right >= 0 ? min(seqlen_k - 1, i + shift + window_right) : seqlen_k - 1;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = col0 + 8 * nt + e;
                    if (j < lo || j > hi)
                        s[mt][nt][2 * h + e] = -INFINITY;
                }
        }
}

/* One key tile of the online softmax on the scores alone (the 4 threads of a quad share a
 * row): per row the running max and this thread's partial sum move on, s becomes p =
 * exp2(s exp_scale - m exp_scale), and alpha gets the factor by which the row's output
 * accumulators must shrink (attn_rescale_o), so that a kernel whose O is still being written
 * by the tensor cores can apply it later. */
template <int MT, int NT>
__device__ __forceinline__ void attn_softmax_scores(float (&s)[MT][NT][4], float (&row_max)[MT][2],
                                                    float (&row_sum)[MT][2], float exp_scale,
                                                    float (&alpha)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = row_max[mt][h];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* A row that has seen only masked keys keeps max -inf; exponentiate against 0
             * so that its p are exp2(-inf) = 0 rather than NaN. */
            const float m_use = mx == -INFINITY ? 0.0f : mx;
            alpha[mt][h] = tk_exp2_approx((row_max[mt][h] - m_use) * exp_scale);
            const float base = m_use * exp_scale;
            row_max[mt][h] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float pe = tk_exp2_approx(fmaf(s[mt][nt][2 * h + e], exp_scale, -base));
                    s[mt][nt][2 * h + e] = pe;
                    sum += pe;
                }
            row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
        }
}

/* The output accumulators o (DT n8 slices) of each row scaled by its alpha. */
template <int MT, int DT>
__device__ __forceinline__ void attn_rescale_o(float (&o)[MT][DT][4], const float (&alpha)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mt][dt][e] *= alpha[mt][e >> 1];
}

/* One key tile of the online softmax with the output accumulators rescaled in the same step. */
template <int MT, int NT, int DT>
__device__ __forceinline__ void attn_online_softmax(float (&s)[MT][NT][4], float (&row_max)[MT][2],
                                                    float (&row_sum)[MT][2], float exp_scale,
                                                    float (&o)[MT][DT][4]) {
    float alpha[MT][2];
    attn_softmax_scores(s, row_max, row_sum, exp_scale, alpha);
    attn_rescale_o(o, alpha);
}

} // namespace

#endif
