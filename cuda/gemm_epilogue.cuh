/*
 * What the GEMM kernels share (cuda/gemm.cu: mma.sync, sm_80+; cuda/gemm_wgmma.cu: wgmma,
 * sm_90a): the order in which blocks walk the output tiles, and the epilogue
 *
 *     D[i, j] = act(alpha * acc[i, j] + beta * C[i, j] + bias[j])
 *
 * applied either to a 64 x 64 warp tile of f32 accumulators that the kernel has staged in shared
 * memory (row stride EPI_STRIDE floats; the mma.sync kernels) or straight to accumulators in the
 * fragment layout (the wgmma kernel). Both compute the same epilogue, rounding D once.
 */
#ifndef TK_GEMM_EPILOGUE_CUH
#define TK_GEMM_EPILOGUE_CUH

#include "activation_math.cuh"
#include "common.cuh"
#include "gemm.h"

namespace {

constexpr int WARP_TILE = 64;    /* both dimensions of a staged warp tile */
/* Floats per staged row: the float2 writes of a half-warp cover all 32 banks. */
constexpr int EPI_STRIDE = 72;
constexpr int64_t TILE_GROUP = 16;

/* The first row and column of the output tile of block `block`: blocks walk the tiles in groups
 * of TILE_GROUP tile rows, tile rows fastest within a group, so that the blocks running at one
 * time read a compact patch of A and B and L2 serves the reuse. */
__device__ __forceinline__ void tile_origin(const tk_gemm_call &p, int bm, int bn, int64_t block,
                                            int64_t *m0, int64_t *n0) {
    const int64_t tiles_m = (p.m + bm - 1) / bm, tiles_n = (p.n + bn - 1) / bn;
    const int64_t per_group = TILE_GROUP * tiles_n;
    const int64_t group = block / per_group, in_group = block % per_group;
    const int64_t first_tile_m = group * TILE_GROUP;
    const int64_t group_rows =
        tiles_m - first_tile_m < TILE_GROUP ? tiles_m - first_tile_m : TILE_GROUP;
    *m0 = (first_tile_m + in_group % group_rows) * bm;
    *n0 = (in_group / group_rows) * bn;
}

/* Writes the warp's 64 x 64 tile of D, rows from row0 and columns from col0, out of its staged
 * accumulators: lane L handles columns col0 + 4 (L % 16) .. + 3 of every other row, so 16 lanes
 * cover one row. Not inlined: one copy per output dtype and activation serves every kernel, and
 * nothing of the caller is live across the call. */
template <typename Out, int Act>
__device__ __noinline__ void store_tile(const tk_gemm_call &p, const float *staged, int64_t row0,
                                        int64_t col0, int lane) {
    const int64_t col = col0 + (lane % 16) * 4;
    if (col >= p.n)
        return;
    const int cols = p.n - col < 4 ? (int)(p.n - col) : 4;
    const Out *c = static_cast<const Out *>(p.c);
    const Out *bias = static_cast<const Out *>(p.bias);
    Out *d = static_cast<Out *>(p.d);
    float bias_v[4];
#pragma unroll
    for (int e = 0; e < 4; e++)
        bias_v[e] = bias && e < cols ? tk_to_float(bias[col + e]) : 0.0f;
    constexpr uintptr_t pack_misalign = 4 * sizeof(Out) - 1;
#pragma unroll 2
    for (int r = lane / 16; r < WARP_TILE; r += 2) {
        const int64_t row = row0 + r;
        if (row >= p.m)
            break;
        const float4 acc = *reinterpret_cast<const float4 *>(staged + r * EPI_STRIDE + (lane % 16) * 4);
        float x[4] = {p.alpha * acc.x, p.alpha * acc.y, p.alpha * acc.z, p.alpha * acc.w};
        if (p.beta != 0.0f) {
            const Out *c_row = c + row * p.ldc + col;
            if (cols == 4 && (reinterpret_cast<uintptr_t>(c_row) & pack_misalign) == 0) {
                const tk_pack<Out, 4> v = tk_load_pack<Out, 4>(c_row);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    x[e] += p.beta * tk_to_float(v.v[e]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (e < cols)
                        x[e] += p.beta * tk_to_float(c_row[e]);
            }
        }
        tk_pack<Out, 4> out;
#pragma unroll
        for (int e = 0; e < 4; e++)
            out.v[e] = tk_from_float<Out>(tk_act_apply<Act, sizeof(Out) == 2>(x[e] + bias_v[e]));
        Out *d_row = d + row * p.ldd + col;
        if (cols == 4 && (reinterpret_cast<uintptr_t>(d_row) & pack_misalign) == 0) {
            tk_store_pack<Out, 4>(d_row, out);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (e < cols)
                    d_row[e] = out.v[e];
        }
    }
}

template <typename Out>
__device__ __forceinline__ void store_tile_act(const tk_gemm_call &p, const float *staged,
                                               int64_t row0, int64_t col0, int lane) {
    switch (p.activation) {
    case TK_ACT_GELU_ERF: return store_tile<Out, TK_ACT_GELU_ERF>(p, staged, row0, col0, lane);
    case TK_ACT_GELU_TANH: return store_tile<Out, TK_ACT_GELU_TANH>(p, staged, row0, col0, lane);
    case TK_ACT_QUICK_GELU: return store_tile<Out, TK_ACT_QUICK_GELU>(p, staged, row0, col0, lane);
    case TK_ACT_SILU: return store_tile<Out, TK_ACT_SILU>(p, staged, row0, col0, lane);
    case TK_ACT_RELU: return store_tile<Out, TK_ACT_RELU>(p, staged, row0, col0, lane);
    case TK_ACT_RELU_SQUARED: return store_tile<Out, TK_ACT_RELU_SQUARED>(p, staged, row0, col0, lane);
    default: return store_tile<Out, TK_ACT_NONE>(p, staged, row0, col0, lane);
    }
}

/* Writes D straight from accumulators in the mma / wgmma fragment layout, no staging: for n8
 * slice j the thread holds f[4j], f[4j+1] at row `row`, columns col + 8j and col + 8j + 1, and
 * f[4j+2], f[4j+3] at row + 8, same columns (col = the strip's first column + 2 (lane % 4)).
 * Same arithmetic as store_tile. A warp's store covers 8 rows x 16 bytes per slice (16-bit D):
 * the 4 slices of a 32-byte sector come from consecutive instructions and merge in L2, and the
 * output is a small fraction of the bytes a tile loads. Inlined: the caller's accumulators stay
 * in registers (a call would have to save them). */
template <typename Out, int Act, int Slices>
__device__ __forceinline__ void store_fragments(const tk_gemm_call &p, const float (&f)[4 * Slices],
                                                int64_t row, int64_t col) {
    const Out *bias = static_cast<const Out *>(p.bias);
    constexpr uintptr_t pair_misalign = 2 * sizeof(Out) - 1;
    /* Addresses as integers: bias and C may be null, and null + offset is undefined in C++. */
    const bool bias_pairs = ((reinterpret_cast<uintptr_t>(bias) + col * sizeof(Out)) & pair_misalign) == 0;
    const bool has_c = p.beta != 0.0f;
    /* columns of D from col on, capped at the strip's width: 32-bit compares per slice */
    const int cols = p.n - col < 8 * Slices ? (int)(p.n - col) : 8 * Slices;
    const Out *c_row[2];
    Out *d_row[2];
    bool row_in[2], d_pairs[2], c_pairs[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        row_in[h] = row + 8 * h < p.m;
        c_row[h] = has_c ? static_cast<const Out *>(p.c) + (row + 8 * h) * p.ldc + col : nullptr;
        d_row[h] = static_cast<Out *>(p.d) + (row + 8 * h) * p.ldd + col;
        c_pairs[h] = (reinterpret_cast<uintptr_t>(c_row[h]) & pair_misalign) == 0;
        d_pairs[h] = (reinterpret_cast<uintptr_t>(d_row[h]) & pair_misalign) == 0;
    }
#pragma unroll
    for (int j = 0; j < Slices; j++) {
        if (8 * j >= cols)
            break;
        const bool pair = 8 * j + 1 < cols;
        float bias_v[2] = {0.0f, 0.0f};
        if (bias) {
            if (pair && bias_pairs) {
                const tk_pack<Out, 2> b = tk_load_pack<Out, 2>(bias + col + 8 * j);
                bias_v[0] = tk_to_float(b.v[0]);
                bias_v[1] = tk_to_float(b.v[1]);
            } else {
                bias_v[0] = tk_to_float(bias[col + 8 * j]);
                if (pair)
                    bias_v[1] = tk_to_float(bias[col + 8 * j + 1]);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (!row_in[h])
                continue;
            float x[2] = {p.alpha * f[4 * j + 2 * h], p.alpha * f[4 * j + 2 * h + 1]};
            if (has_c) {
                const Out *c_at = c_row[h] + 8 * j;
                if (pair && c_pairs[h]) {
                    const tk_pack<Out, 2> v = tk_load_pack<Out, 2>(c_at);
                    x[0] += p.beta * tk_to_float(v.v[0]);
                    x[1] += p.beta * tk_to_float(v.v[1]);
                } else {
                    x[0] += p.beta * tk_to_float(c_at[0]);
                    if (pair)
                        x[1] += p.beta * tk_to_float(c_at[1]);
                }
            }
            tk_pack<Out, 2> out;
            out.v[0] = tk_from_float<Out>(tk_act_apply<Act, sizeof(Out) == 2>(x[0] + bias_v[0]));
            out.v[1] = tk_from_float<Out>(tk_act_apply<Act, sizeof(Out) == 2>(x[1] + bias_v[1]));
            Out *d_at = d_row[h] + 8 * j;
            if (pair && d_pairs[h]) {
                tk_store_pack<Out, 2>(d_at, out);
            } else {
                d_at[0] = out.v[0];
                if (pair)
                    d_at[1] = out.v[1];
            }
        }
    }
}

template <typename Out, int Slices>
__device__ __forceinline__ void store_fragments_act(const tk_gemm_call &p, const float (&f)[4 * Slices],
                                                    int64_t row, int64_t col) {
    switch (p.activation) {
    case TK_ACT_GELU_ERF: return store_fragments<Out, TK_ACT_GELU_ERF, Slices>(p, f, row, col);
    case TK_ACT_GELU_TANH: return store_fragments<Out, TK_ACT_GELU_TANH, Slices>(p, f, row, col);
    case TK_ACT_QUICK_GELU: return store_fragments<Out, TK_ACT_QUICK_GELU, Slices>(p, f, row, col);
    case TK_ACT_SILU: return store_fragments<Out, TK_ACT_SILU, Slices>(p, f, row, col);
    case TK_ACT_RELU: return store_fragments<Out, TK_ACT_RELU, Slices>(p, f, row, col);
    case TK_ACT_RELU_SQUARED: return store_fragments<Out, TK_ACT_RELU_SQUARED, Slices>(p, f, row, col);
    default: return store_fragments<Out, TK_ACT_NONE, Slices>(p, f, row, col);
    }
}

/* The epilogue of a fragment strip, dispatched on the output dtype and activation. */
template <int Slices>
__device__ __forceinline__ void store_fragment_strip(const tk_gemm_call &p, const float (&f)[4 * Slices],
                                                     int64_t row, int64_t col) {
    if (p.output_dtype == TK_F32)
        store_fragments_act<float, Slices>(p, f, row, col);
    else if (p.output_dtype == TK_F16)
        store_fragments_act<__half, Slices>(p, f, row, col);
    else
        store_fragments_act<__nv_bfloat16, Slices>(p, f, row, col);
}

/* The epilogue of one staged warp tile, dispatched on the output dtype (once per warp tile). */
__device__ __forceinline__ void store_warp_tile(const tk_gemm_call &p, const float *staged,
                                                int64_t row0, int64_t col0, int lane) {
    if (p.output_dtype == TK_F32)
        store_tile_act<float>(p, staged, row0, col0, lane);
    else if (p.output_dtype == TK_F16)
        store_tile_act<__half>(p, staged, row0, col0, lane);
    else
        store_tile_act<__nv_bfloat16>(p, staged, row0, col0, lane);
}

} // namespace

#endif
