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

/* Whether N elements of Out at p can move as one access (p is N-element aligned). Integer
 * arithmetic on the address: p may be a null bias or C plus an offset. */
template <typename Out, int N> __device__ __forceinline__ bool run_aligned(uintptr_t p) {
    return (p & (N * sizeof(Out) - 1)) == 0;
}

/* N consecutive elements of a row, of which the first `count` (1..N) exist: one N-wide access when
 * `whole` (count == N and the address is aligned: the caller knows it once for many runs), else
 * element by element. */
template <typename Out, int N>
__device__ __forceinline__ void load_run(const Out *src, bool whole, int count, float (&v)[N]) {
    if (whole) {
        const tk_pack<Out, N> w = tk_load_pack<Out, N>(src);
#pragma unroll
        for (int e = 0; e < N; e++)
            v[e] = tk_to_float(w.v[e]);
    } else {
#pragma unroll
        for (int e = 0; e < N; e++)
            v[e] = e < count ? tk_to_float(src[e]) : 0.0f;
    }
}

template <typename Out, int N>
__device__ __forceinline__ void store_run(Out *dst, bool whole, int count, const tk_pack<Out, N> &v) {
    if (whole) {
        tk_store_pack<Out, N>(dst, v);
    } else {
#pragma unroll
        for (int e = 0; e < N; e++)
            if (e < count)
                dst[e] = v.v[e];
    }
}

/* Where one run of the epilogue reads C (only with_c, i.e. beta != 0) and writes D. */
template <typename Out> struct epilogue_run {
    const Out *c;
    Out *d;
    bool with_c;
    bool c_whole, d_whole; /* load_run / store_run's `whole` */
    int count;
};

/* The epilogue of one run of N accumulators: D = act(alpha acc + beta C + bias), rounded once;
 * bias_v holds the run's bias (0 without one). */
template <typename Out, int Act, int N>
__device__ __forceinline__ void finish_run(const tk_gemm_call &p, const float (&acc)[N], const float (&bias_v)[N],
                                           const epilogue_run<Out> &r) {
    float x[N];
#pragma unroll
    for (int e = 0; e < N; e++)
        x[e] = p.alpha * acc[e];
    if (r.with_c) {
        float cv[N];
        load_run<Out, N>(r.c, r.c_whole, r.count, cv);
#pragma unroll
        for (int e = 0; e < N; e++)
            x[e] += p.beta * cv[e];
    }
    tk_pack<Out, N> out;
#pragma unroll
    for (int e = 0; e < N; e++)
        out.v[e] = tk_from_float<Out>(tk_act_apply<Act, sizeof(Out) == 2>(x[e] + bias_v[e]));
    store_run<Out, N>(r.d, r.d_whole, r.count, out);
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
    float bias_v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (p.bias) {
        const Out *bias = static_cast<const Out *>(p.bias) + col;
        load_run<Out, 4>(bias, cols == 4 && run_aligned<Out, 4>(reinterpret_cast<uintptr_t>(bias)), cols, bias_v);
    }
    const bool has_c = p.beta != 0.0f;
#pragma unroll 2
    for (int r = lane / 16; r < WARP_TILE; r += 2) {
        const int64_t row = row0 + r;
        if (row >= p.m)
            break;
        const float4 staged_acc = *reinterpret_cast<const float4 *>(staged + r * EPI_STRIDE + (lane % 16) * 4);
        const float acc[4] = {staged_acc.x, staged_acc.y, staged_acc.z, staged_acc.w};
        const Out *c = has_c ? static_cast<const Out *>(p.c) + row * p.ldc + col : nullptr;
        Out *d = static_cast<Out *>(p.d) + row * p.ldd + col;
        const epilogue_run<Out> run = {c, d, has_c, cols == 4 && run_aligned<Out, 4>(reinterpret_cast<uintptr_t>(c)),
                                       cols == 4 && run_aligned<Out, 4>(reinterpret_cast<uintptr_t>(d)), cols};
        finish_run<Out, Act, 4>(p, acc, bias_v, run);
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
 * Same arithmetic as store_tile (finish_run), in runs of 2. A warp's store covers 8 rows x 16
 * bytes per slice (16-bit D): the 4 slices of a 32-byte sector come from consecutive
 * instructions and merge in L2, and the output is a small fraction of the bytes a tile loads.
 * Inlined: the caller's accumulators stay in registers (a call would have to save them). */
template <typename Out, int Act, int Slices>
__device__ __forceinline__ void store_fragments(const tk_gemm_call &p, const float (&f)[4 * Slices],
                                                int64_t row, int64_t col) {
    const Out *bias = static_cast<const Out *>(p.bias);
    const bool bias_pairs = run_aligned<Out, 2>(reinterpret_cast<uintptr_t>(bias) + col * sizeof(Out));
    const bool has_c = p.beta != 0.0f;
    /* columns of D from col on, capped at the strip's width: 32-bit compares per slice */
    const int cols = p.n - col < 8 * Slices ? (int)(p.n - col) : 8 * Slices;
    /* rows row and row + 8; slice j is 8 j elements further, which keeps the pair alignment.
     * C's addresses as integers: p.c may be null (beta = 0), and it is then never read. */
    uintptr_t c_addr[2];
    Out *d_row[2];
    bool row_in[2], c_pairs[2], d_pairs[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        row_in[h] = row + 8 * h < p.m;
        c_addr[h] = reinterpret_cast<uintptr_t>(p.c) + ((row + 8 * h) * p.ldc + col) * sizeof(Out);
        d_row[h] = static_cast<Out *>(p.d) + (row + 8 * h) * p.ldd + col;
        c_pairs[h] = run_aligned<Out, 2>(c_addr[h]);
        d_pairs[h] = run_aligned<Out, 2>(reinterpret_cast<uintptr_t>(d_row[h]));
    }
#pragma unroll
    for (int j = 0; j < Slices; j++) {
        if (8 * j >= cols)
            break;
        const int count = 8 * j + 1 < cols ? 2 : 1;
        float bias_v[2] = {0.0f, 0.0f};
        if (bias)
            load_run<Out, 2>(bias + col + 8 * j, count == 2 && bias_pairs, count, bias_v);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (!row_in[h])
                continue;
            const float acc[2] = {f[4 * j + 2 * h], f[4 * j + 2 * h + 1]};
            const epilogue_run<Out> run = {reinterpret_cast<const Out *>(c_addr[h] + 8 * j * sizeof(Out)),
                                           d_row[h] + 8 * j, has_c, count == 2 && c_pairs[h],
                                           count == 2 && d_pairs[h], count};
            finish_run<Out, Act, 2>(p, acc, bias_v, run);
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
