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

/* The elements of Out that one access moves when a run of N moves whole: all N, up to 16 bytes
 * (the widest global access). */
template <typename Out, int N> __host__ __device__ constexpr int access_elems() {
    return N * sizeof(Out) > 16 ? 16 / (int)sizeof(Out) : N;
}

/* Whether a run of N elements of Out at p can move in whole accesses (p is aligned to one).
 * Integer arithmetic on the address: p may be a null bias or C plus an offset. */
template <typename Out, int N> __device__ __forceinline__ bool run_aligned(uintptr_t p) {
    return (p & (access_elems<Out, N>() * sizeof(Out) - 1)) == 0;
}

/* N consecutive elements of a row, of which the first `count` (1..N) exist: whole accesses when
 * `whole` (count == N and the address is aligned: the caller knows it once for many runs), else
 * element by element. */
template <typename Out, int N>
__device__ __forceinline__ void load_run(const Out *src, bool whole, int count, float (&v)[N]) {
    if (whole) {
        constexpr int A = access_elems<Out, N>();
#pragma unroll
        for (int a = 0; a < N; a += A) {
            const tk_pack<Out, A> w = tk_load_pack<Out, A>(src + a);
#pragma unroll
            for (int e = 0; e < A; e++)
                v[a + e] = tk_to_float(w.v[e]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; e++)
            v[e] = e < count ? tk_to_float(src[e]) : 0.0f;
    }
}

template <typename Out, int N>
__device__ __forceinline__ void store_run(Out *dst, bool whole, int count, const tk_pack<Out, N> &v) {
    if (whole) {
        constexpr int A = access_elems<Out, N>();
#pragma unroll
        for (int a = 0; a < N; a += A) {
            tk_pack<Out, A> w;
#pragma unroll
            for (int e = 0; e < A; e++)
                w.v[e] = v.v[a + e];
            tk_store_pack<Out, A>(dst + a, w);
        }
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

/* The epilogue of one run of N accumulators: act(alpha acc + beta C + bias), rounded once, to
 * be stored at r.d; bias_v holds the run's bias (0 without one). Reads C (with_c) but writes
 * nothing, so that a caller can finish several runs before it stores any (store_tile). */
template <typename Out, int Act, int N>
__device__ __forceinline__ tk_pack<Out, N> run_values(const tk_gemm_call &p, const float (&acc)[N],
                                                      const float (&bias_v)[N], const epilogue_run<Out> &r) {
    float x[N];
#pragma unroll
    for (int e = 0; e < N; e++)
        x[e] = fmaf(p.alpha, acc[e], bias_v[e]);
    if (r.with_c) {
        float cv[N];
        load_run<Out, N>(r.c, r.c_whole, r.count, cv);
#pragma unroll
        for (int e = 0; e < N; e++)
            x[e] = fmaf(p.beta, cv[e], x[e]);
    }
    /* One element in 4 of a run takes its sigmoid's reciprocal on the FMA pipe. The mma.sync
     * epilogue runs while the tensor cores idle, 2 warps per scheduler, and with a sigmoid-based
     * activation it is bound both by the special-function unit (2 MUFU per element; a warp's MUFU
     * instruction takes 8 of its cycles) and by issue (~13 instructions per element, one per
     * cycle): tk_rcp_fma trades one MUFU for 8 issued instructions, and one element in 4 is
     * about where the two balance (SASS counts in docs/kernels/gemm.md). */
    float y[N];
#pragma unroll
    for (int e = 0; e < N; e++)
        y[e] = e % 4 == 3 ? tk_act_apply<Act, sizeof(Out) == 2, true>(x[e])
                          : tk_act_apply<Act, sizeof(Out) == 2, false>(x[e]);
    return tk_pack_of<Out, N>(y);
}

/* run_values, stored. */
template <typename Out, int Act, int N>
__device__ __forceinline__ void finish_run(const tk_gemm_call &p, const float (&acc)[N], const float (&bias_v)[N],
                                           const epilogue_run<Out> &r) {
    store_run<Out, N>(r.d, r.d_whole, r.count, run_values<Out, Act, N>(p, acc, bias_v, r));
}

/* Rows that one lane of store_tile finishes before it stores any of them. A load that follows a
 * store to D has to wait for it (D might alias the staging buffer or C, as far as the compiler
 * knows), so a lane that stored each row before reading the next ran one row's chain of
 * dependent latencies at a time (shared load, exponential, reciprocal, store: hundreds of
 * cycles for 4 elements, with 2 warps per scheduler). Reading 4 rows first gives the
 * schedulers 16 independent elements per lane. */
constexpr int EPI_BATCH = 4;
static_assert(WARP_TILE % (2 * EPI_BATCH) == 0, "a lane's rows of the warp tile split into whole batches");

/* store_tile's rows, from row0 + lane / 16 in steps of 2, at columns col .. col + cols - 1; WithC
 * when beta != 0, a compile-time choice so that the rows of a batch are one basic block that
 * the compiler can interleave (a test per row would split it). */
template <typename Out, int Act, bool WithC>
__device__ __forceinline__ void finish_rows(const tk_gemm_call &p, const float *staged, int64_t row0, int64_t col,
                                            int cols, const float (&bias_v)[4], int lane) {
    for (int r0 = lane / 16; r0 < WARP_TILE; r0 += 2 * EPI_BATCH) {
        if (row0 + r0 >= p.m)
            break;
        epilogue_run<Out> run[EPI_BATCH];
        tk_pack<Out, 4> out[EPI_BATCH];
#pragma unroll
        for (int b = 0; b < EPI_BATCH; b++) {
            const int r = r0 + 2 * b;
            const int64_t row = row0 + r;
            const float4 staged_acc = *reinterpret_cast<const float4 *>(staged + r * EPI_STRIDE + (lane % 16) * 4);
            const float acc[4] = {staged_acc.x, staged_acc.y, staged_acc.z, staged_acc.w};
            const Out *c = WithC ? static_cast<const Out *>(p.c) + row * p.ldc + col : nullptr;
            Out *d = static_cast<Out *>(p.d) + row * p.ldd + col;
            /* rows past M are computed from the staged tile (which has them) but neither read
             * from C nor stored */
            run[b] = {c, d, WithC && row < p.m, cols == 4 && run_aligned<Out, 4>(reinterpret_cast<uintptr_t>(c)),
                      cols == 4 && run_aligned<Out, 4>(reinterpret_cast<uintptr_t>(d)), cols};
            out[b] = run_values<Out, Act, 4>(p, acc, bias_v, run[b]);
        }
#pragma unroll
        for (int b = 0; b < EPI_BATCH; b++)
            if (row0 + r0 + 2 * b < p.m)
                store_run<Out, 4>(run[b].d, run[b].d_whole, run[b].count, out[b]);
    }
}

/* Writes the warp's 64 x 64 tile of D, rows from row0 and columns from col0, out of its staged
 * accumulators: lane L handles columns col0 + 4 (L % 16) .. + 3 of every other row, so 16 lanes
 * cover one row. Not inlined: one copy per output dtype and activation serves every kernel, and
 * nothing of the caller is live across the call. */
template <typename Out, int Act>
__device__ __noinline__ void store_tile(const tk_gemm_call &call, const float *staged, int64_t row0,
                                        int64_t col0, int lane) {
    /* A local copy of the call: through the reference (a generic pointer into the kernel's
     * parameters) every field would be reloaded after each store to D, which might alias it, and
     * each row would wait for those loads. The copy's fields load once, into registers. */
    const tk_gemm_call p = call;
    const int64_t col = col0 + (lane % 16) * 4;
    if (col >= p.n)
        return;
    const int cols = p.n - col < 4 ? (int)(p.n - col) : 4;
    float bias_v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (p.bias) {
        const Out *bias = static_cast<const Out *>(p.bias) + col;
        load_run<Out, 4>(bias, cols == 4 && run_aligned<Out, 4>(reinterpret_cast<uintptr_t>(bias)), cols, bias_v);
    }
    if (p.beta != 0.0f)
        finish_rows<Out, Act, true>(p, staged, row0, col, cols, bias_v, lane);
    else
        finish_rows<Out, Act, false>(p, staged, row0, col, cols, bias_v, lane);
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

/* The fragment epilogue: D straight from accumulators in the mma / wgmma fragment layout, no
 * staging. For n8 slice j, thread q of a quad of lanes (q = lane % 4) holds f[4j], f[4j+1] at its
 * row, columns 8j + 2q and 8j + 2q + 1 of the strip, and f[4j+2], f[4j+3] at row + 8, same
 * columns. As they are, a warp's store of one slice covers 8 rows x 16 bytes (16-bit D): half
 * sectors, 64 store instructions per thread for a 256-column strip. The quad can first regroup
 * them (__shfl_xor_sync) into runs of Run consecutive columns of one row, so that each store
 * moves Run elements:
 *   Run 2: the layout as it is: slice j, row half h is one run;
 *   Run 4: over slices 2i and 2i + 1 the lanes of a pair (q, q ^ 1) swap a slice's 2 columns,
 *          so the even lane holds columns 16i + 4 (q / 2) .. + 3 (slice 2i) and the odd one the
 *          same 4 columns of slice 2i + 1, for both row halves (a warp's store: 8 rows x 32
 *          bytes, whole sectors; half the stores of Run 2);
 *   Run 8: then lanes q and q ^ 2 swap a row half's 4 columns: q < 2 holds 8 columns of the
 *          row, q >= 2 the same 8 of row + 8 (a store: 16 rows x 32 bytes; a quarter).
 * fragment_runs<Run> says where a thread's runs lie and gathers one column step of them. */
template <int Run> struct fragment_runs {
    static_assert(Run == 2 || Run == 4 || Run == 8, "runs of 2, 4 or 8 columns");
    static constexpr int ROWS = Run == 8 ? 1 : 2;  /* row halves per thread: row, row + 8 */
    static constexpr int STEP = Run == 2 ? 8 : 16; /* columns from one of a thread's runs to the next */

    /* The first column (from the strip's) and row (from the fragment row) of thread q's runs. */
    static __device__ __forceinline__ int column(int q) {
        return Run == 2 ? 2 * q : Run == 4 ? 8 * (q & 1) + 4 * (q >> 1) : 8 * (q & 1);
    }
    static __device__ __forceinline__ int row(int q) { return Run == 8 ? 8 * (q >> 1) : 0; }

    /* The runs of column step s into v (row half h: v[h]). Every lane of the warp takes part.
     * The accumulators are only read: they stay where the next tile's wgmma reads them (writing
     * them would serialise the wgmma), and the exchange of one step at a time needs a few
     * registers, not a second copy. Selects, not branches, pick what a lane sends. */
    template <int Slices>
    static __device__ __forceinline__ void gather(const float (&f)[4 * Slices], int s, int q, float (&v)[ROWS][Run]) {
        if constexpr (Run == 2) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                v[h][0] = f[4 * s + 2 * h];
                v[h][1] = f[4 * s + 2 * h + 1];
            }
        } else {
            /* slices 2s and 2s + 1: f[8s + 2h + e] and f[8s + 4 + 2h + e] (row half h, e = 0, 1) */
            const bool odd = q & 1;
            float run4[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float lo = f[8 * s + 2 * h + e], hi = f[8 * s + 4 + 2 * h + e];
                    const float got = __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 1);
                    run4[h][e] = odd ? got : lo;
                    run4[h][2 + e] = odd ? hi : got;
                }
            if constexpr (Run == 4) {
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        v[h][e] = run4[h][e];
            } else {
                const bool upper = q & 2;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float got = __shfl_xor_sync(0xffffffffu, upper ? run4[0][e] : run4[1][e], 2);
                    v[0][e] = upper ? got : run4[0][e];
                    v[0][4 + e] = upper ? run4[1][e] : got;
                }
            }
        }
    }
};

/* Writes the strip of D whose fragment row is `row` and first column col0 (thread q of its quad)
 * from accumulators in the fragment layout, in runs of Run columns (fragment_runs). Same
 * arithmetic as store_tile (finish_run). Inlined: the caller's accumulators stay in registers (a
 * call would have to save them). */
template <typename Out, int Act, int Slices, int Run>
__device__ __forceinline__ void store_fragments(const tk_gemm_call &p, const float (&f)[4 * Slices], int64_t row,
                                                int64_t col0, int q) {
    using runs = fragment_runs<Run>;
    constexpr int STEPS = 4 * Slices / (Run * runs::ROWS);
    row += runs::row(q);
    const int64_t col = col0 + runs::column(q);
    const Out *bias = static_cast<const Out *>(p.bias);
    const bool bias_whole = run_aligned<Out, Run>(reinterpret_cast<uintptr_t>(bias) + col * sizeof(Out));
    const bool has_c = p.beta != 0.0f;
    /* columns of D from col on, capped at the strip's width: 32-bit compares per run */
    const int cols = p.n - col < STEPS * runs::STEP ? (int)(p.n - col) : STEPS * runs::STEP;
    /* the rows' C and D; a step of runs::STEP elements keeps a run's alignment. C's addresses
     * as integers: p.c may be null (beta = 0), and it is then never read. */
    uintptr_t c_addr[runs::ROWS];
    Out *d_row[runs::ROWS];
    bool row_in[runs::ROWS], c_whole[runs::ROWS], d_whole[runs::ROWS];
#pragma unroll
    for (int h = 0; h < runs::ROWS; h++) {
        row_in[h] = row + 8 * h < p.m;
        c_addr[h] = reinterpret_cast<uintptr_t>(p.c) + ((row + 8 * h) * p.ldc + col) * sizeof(Out);
        d_row[h] = static_cast<Out *>(p.d) + (row + 8 * h) * p.ldd + col;
        c_whole[h] = run_aligned<Out, Run>(c_addr[h]);
        d_whole[h] = run_aligned<Out, Run>(reinterpret_cast<uintptr_t>(d_row[h]));
    }
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        float v[runs::ROWS][Run];
        runs::template gather<Slices>(f, s, q, v); /* the whole warp, before the edge test */
        const int first = s * runs::STEP;
        if (first >= cols)
            continue;
        const int count = cols - first < Run ? cols - first : Run;
        float bias_v[Run] = {};
        if (bias)
            load_run<Out, Run>(bias + col + first, count == Run && bias_whole, count, bias_v);
#pragma unroll
        for (int h = 0; h < runs::ROWS; h++) {
            if (!row_in[h])
                continue;
            const epilogue_run<Out> run = {reinterpret_cast<const Out *>(c_addr[h] + first * sizeof(Out)),
                                           d_row[h] + first, has_c, count == Run && c_whole[h],
                                           count == Run && d_whole[h], count};
            finish_run<Out, Act, Run>(p, v[h], bias_v, run);
        }
    }
}

template <typename Out, int Slices, int Run>
__device__ __forceinline__ void store_fragments_act(const tk_gemm_call &p, const float (&f)[4 * Slices], int64_t row,
                                                    int64_t col0, int q) {
    switch (p.activation) {
    case TK_ACT_GELU_ERF: return store_fragments<Out, TK_ACT_GELU_ERF, Slices, Run>(p, f, row, col0, q);
    case TK_ACT_GELU_TANH: return store_fragments<Out, TK_ACT_GELU_TANH, Slices, Run>(p, f, row, col0, q);
    case TK_ACT_QUICK_GELU: return store_fragments<Out, TK_ACT_QUICK_GELU, Slices, Run>(p, f, row, col0, q);
    case TK_ACT_SILU: return store_fragments<Out, TK_ACT_SILU, Slices, Run>(p, f, row, col0, q);
    case TK_ACT_RELU: return store_fragments<Out, TK_ACT_RELU, Slices, Run>(p, f, row, col0, q);
    case TK_ACT_RELU_SQUARED: return store_fragments<Out, TK_ACT_RELU_SQUARED, Slices, Run>(p, f, row, col0, q);
    default: return store_fragments<Out, TK_ACT_NONE, Slices, Run>(p, f, row, col0, q);
    }
}

/* The epilogue of a fragment strip, dispatched on the output dtype and activation. */
template <int Slices, int Run>
__device__ __forceinline__ void store_fragment_strip(const tk_gemm_call &p, const float (&f)[4 * Slices], int64_t row,
                                                     int64_t col0, int q) {
    if (p.output_dtype == TK_F32)
        store_fragments_act<float, Slices, Run>(p, f, row, col0, q);
    else if (p.output_dtype == TK_F16)
        store_fragments_act<__half, Slices, Run>(p, f, row, col0, q);
    else
        store_fragments_act<__nv_bfloat16, Slices, Run>(p, f, row, col0, q);
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
