/*
 * GEMM with a fused epilogue on the tensor cores (mma.sync), sm_80 and newer:
 *
 *     D[i, j] = act(alpha * sum_k A[i, k] B(k, j) + beta * C[i, j] + bias[j])
 *
 * A is row-major [M, K]; B is row-major [K, N] ("KN") or [N, K] ("NK", D = A B^T). Inputs are
 * f16 or bf16, products are summed in f32 by mma.sync.m16n8k16, the epilogue runs in f32 and D
 * (f16, bf16 or f32) is rounded once.
 *
 * Tiling hierarchy (docs/kernels/gemm.md has the numbers):
 * - Block tile BM x BN, marching over K in steps of BK through a STAGES-deep ring of shared-memory
 *   stages filled by cp.async (16-byte copies that bypass L1; partial copies zero-fill, so every
 *   edge of M, N and K is handled by the copy itself: bytes past a matrix edge arrive as 0 and
 *   add nothing). One __syncthreads per K step; once every warp has passed it, the stage of
 *   step kt - 1 is free and is refilled with K step kt + STAGES - 1 while step kt computes.
 * - The aligned kernels' interior K steps (a block tile inside M and N, copies inside A and B:
 *   all but the last STAGES - 1 K steps) copy without byte counts, from source pointers moved
 *   on by a constant per K step: a byte count costs ~6 integer instructions per chunk (ptxas
 *   folds it into each copy's address). Edge tiles and the last K steps keep the general copies.
 * - Warp tile 64 x 64: 4 x 8 mma tiles of 16 x 8, i.e. 128 f32 accumulators per thread (the
 *   largest that fits: 128 + 48 fragment registers + addresses reach the 255 cap). Per k16 slice
 *   a warp loads 4 A fragments and 8 B fragments with 8 ldmatrix.x4 (.trans for KN, whose tile
 *   is N-contiguous) and issues 32 mma: 4 mma per ldmatrix.
 * - The aligned kernels keep the tensor cores fed across slice and K-step boundaries: slice
 *   ks + 1's fragments load while slice ks's mma run (B double-buffered, each A tile reloaded
 *   right after its last mma), the barrier sits before a K step's last slice (whose fragments are
 *   already loaded, so its mma cover the wait), and a K step's 12 copies per thread are spread
 *   over its first slices instead of delaying one slice's fragment loads (copies and ldmatrix
 *   are volatile asm touching shared memory: they keep their source order). This schedule
 *   replaced per-slice fragment loads with all copies at the top of the K step
 *   (docs/kernels/gemm.md has the measurements).
 * - Shared tiles are rows of 16-byte chunks with the chunk index XOR-swizzled by the row
 *   (tk_swizzle of core/sm80.cuh: chunk ^ (row & 7), or chunk ^ ((row >> 1) & 3) for 64-byte
 *   rows), so the 8 row addresses of every ldmatrix phase and the 8 chunks of every cp.async
 *   phase fall in 8 distinct 16-byte bank groups: no bank conflicts, no padding.
 * - Epilogue: each warp stages its 64 x 64 accumulators as f32 in shared memory (row stride
 *   72 floats, so the float2 writes of a half-warp cover all 32 banks; 18 KiB per warp, reusing
 *   the pipeline's memory once every cp.async has drained), then each lane reads 4 consecutive
 *   columns and applies alpha, beta * C, bias and act in registers; 16 lanes cover a 64-column
 *   row, so C loads and D stores are contiguous 128-byte (f16/bf16) or 256-byte (f32) row
 *   segments. Edges and unaligned C / D fall back to element accesses. The epilogue is one
 *   non-inlined function per output dtype x activation (21 small functions shared by every
 *   kernel), picked by a switch once per warp tile: no per-element branch on the activation.
 *   act is tk_act_apply of activation_math.cuh with the same `Fast` choice as
 *   tk_activation_fwd (16-bit outputs), so fused and separate activations compute the same
 *   function; in one column of 4 a sigmoid's reciprocal comes from Newton steps on the FMA
 *   pipe instead of MUFU.RCP (both within 1 ulp of 1 / y), which balances the epilogue's two
 *   bounds, MUFU time and instruction issue.
 *
 * Configurations (a handful of instantiations: config x input dtype x B layout; registers as
 * reported by ptxas for sm_90a and sm_80, 234-255, no spills):
 * - 128x256x64, 8 warps (2 x 4), 3 stages, copies over the first 3 of 4 slices: 3 * (128 +
 *   256) * 64 * 2 B = 144 KiB of shared memory (1 block of 256 threads per SM;
 *   __launch_bounds__(256, 1) caps registers at 255). Per K step a block moves 48 KiB and
 *   does 2 * 128 * 256 * 64 flops: 85 flops per byte of L2 traffic. Chosen when the call has
 *   at least one full wave of tiles (tiles >= SMs).
 * - 128x128x32, 4 warps (2 x 2), 4 stages, copies in the first of 2 slices: 64 KiB of
 *   pipeline, 72 KiB with the epilogue's staging, 2 blocks per SM (registers: 2 x 128 x 255
 *   fit), so one block's epilogue and barriers overlap the other's math; for smaller problems,
 *   where twice the tiles fill the SMs better, and for devices without 144 KiB per block.
 * - The same 128x128 kernel with element-by-element loads (2-byte loads into registers, then a
 *   16-byte shared store) for A / B pointers or leading dimensions that rule out 16-byte copies:
 *   correct for any alignment, slower (the loads no longer overlap the math); it keeps the
 *   single-buffered fragment schedule, as its register-staged loads leave no room for more.
 * Blocks are numbered in groups of 16 tile rows (column-major within a group) so that a wave
 * of concurrently running blocks reads a compact patch of A and B and L2 serves the reuse.
 * Offsets into A, B, C and D are 64-bit.
 */
#include "gemm.h"

#include <type_traits>

#include "common.cuh"
#include "core/sm80.cuh"
#include "gemm_epilogue.cuh"

namespace {

/* PREFETCH_FRAGMENTS: the main loop of the aligned kernels (see the kernel): fragments
 * double-buffered across k16 slices, the K step's copies spread over its first COPY_SLICES
 * slices. Without it (the unaligned kernel, whose register-staged loads leave no room for a
 * second set of fragments: ptxas spills), the stage's copies are issued at once after the
 * first slice's fragment loads and each slice loads its fragments just before its mma. */
template <int BM_, int BN_, int BK_, int STAGES_, int MIN_BLOCKS_, bool PREFETCH_FRAGMENTS_,
          int COPY_SLICES_ = 1>
struct tile_config {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_, MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr bool PREFETCH_FRAGMENTS = PREFETCH_FRAGMENTS_;
    static constexpr int COPY_SLICES = COPY_SLICES_;
    static constexpr int WARPS_M = BM / WARP_TILE, WARPS_N = BN / WARP_TILE;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int A_STAGE_BYTES = BM * BK * 2, B_STAGE_BYTES = BN * BK * 2;
    static constexpr int PIPE_BYTES = STAGES * (A_STAGE_BYTES + B_STAGE_BYTES);
    static constexpr int EPI_BYTES = WARPS_M * WARPS_N * WARP_TILE * EPI_STRIDE * 4;
    static constexpr int SMEM_BYTES = PIPE_BYTES > EPI_BYTES ? PIPE_BYTES : EPI_BYTES;
    static_assert(BM % WARP_TILE == 0 && BN % WARP_TILE == 0 && BK % 16 == 0, "tile shape");
    /* An even slice count keeps the fragment buffers' parity across K steps; the copies are
     * committed before the barrier in the last slice. */
    static_assert(BK / 16 % 2 == 0 && COPY_SLICES >= 1 && COPY_SLICES < BK / 16, "copy schedule");
};
using config_128x256 = tile_config<128, 256, 64, 3, 1, true, 3>;
using config_128x128 = tile_config<128, 128, 32, 4, 2, true, 1>;
using config_unaligned = tile_config<128, 128, 32, 4, 2, false>;

/* ---- shared-memory tiles ---- */

/* Copies a Rows x (Cpr * 8) tile of a row-major 16-bit matrix, whose element (0, 0) is at g,
 * into the swizzled shared tile at smem_tile. Elements at row >= rows_valid or column >=
 * cols_valid are not read and arrive as 0. Aligned: g and ld allow 16-byte cp.async; otherwise
 * 2-byte loads through registers. Each thread copies its chunks j_begin .. j_end - 1 of
 * Rows * Cpr / Threads, so that a K step's copies can be spread over several k16 slices. */
template <int Rows, int Cpr, int Threads, bool Aligned>
__device__ __forceinline__ void load_tile(uint32_t smem_tile, const uint16_t *g, int64_t ld,
                                          int64_t rows_valid, int64_t cols_valid, int j_begin = 0,
                                          int j_end = Rows * Cpr / Threads) {
    constexpr int CHUNKS_PER_THREAD = Rows * Cpr / Threads;
    constexpr int ROW_STEP = Threads / Cpr;  /* rows between one thread's chunks */
    static_assert(Rows * Cpr % Threads == 0 && Threads % Cpr == 0 && ROW_STEP % 8 == 0,
                  "each thread copies whole chunks at a fixed swizzle");
    const int row0 = threadIdx.x / Cpr, chunk = threadIdx.x % Cpr;
    const uint32_t dst0 = smem_tile + row0 * Cpr * 16 + ((chunk ^ tk_swizzle<Cpr>(row0)) << 4);
    const int64_t cols_left = cols_valid - chunk * 8;
    if constexpr (Aligned) {
        /* What does not depend on the chunk, once: the byte count of an inside row (all of a
         * thread's chunks lie in one column), the rows inside as a 32-bit count and the first
         * chunk's address; chunk j is j row steps further. An outside chunk reads 0 bytes at
         * the tile origin g, which lies inside the matrix. Fewer instructions per K step than
         * forming each chunk's address and byte count from scratch, and faster
         * (docs/kernels/gemm.md). */
        const int bytes = cols_left >= 8 ? 16 : cols_left > 0 ? (int)cols_left * 2 : 0;
        const int rows_inside = rows_valid < Rows ? (int)(rows_valid > 0 ? rows_valid : 0) : Rows;
        const uint16_t *src0 = g + row0 * ld + chunk * 8;
#pragma unroll
        for (int j = 0; j < CHUNKS_PER_THREAD; j++) {
            if (j < j_begin || j >= j_end)
                continue;
            const bool inside = row0 + j * ROW_STEP < rows_inside && bytes > 0;
            tk_cp_async_16_zfill(dst0 + j * ROW_STEP * Cpr * 16,
                                 inside ? src0 + j * ROW_STEP * ld : g, inside ? bytes : 0);
        }
    } else {
#pragma unroll
        for (int j = 0; j < CHUNKS_PER_THREAD; j++) {
            if (j < j_begin || j >= j_end)
                continue;
            const int row = row0 + j * ROW_STEP;
            const bool inside = row < rows_valid && cols_left > 0;
            const uint16_t *src = inside ? g + row * ld + chunk * 8 : g;
            uint32_t w[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t lo = inside && 2 * e < cols_left ? src[2 * e] : 0u;
                const uint32_t hi = inside && 2 * e + 1 < cols_left ? src[2 * e + 1] : 0u;
                w[e] = lo | (hi << 16);
            }
            tk_st_shared_16(dst0 + j * ROW_STEP * Cpr * 16, w);
        }
    }
}

/* One thread's copies of a Rows x (Cpr * 8) tile that lies wholly inside its row-major 16-bit
 * matrix, for the interior K steps of a block tile: every chunk is 16 full bytes, so no byte
 * counts and no clamping. The thread's chunks lie in one 16-byte column, ROW_STEP rows apart:
 * chunk j's source is j * row_step_bytes past the first chunk's (one 32-bit multiply-add onto
 * a 64-bit pointer), its destination a compile-time offset past the first chunk's; the caller
 * moves src on by one K step's bytes per K step. Same chunk-to-thread map as load_tile. */
template <int Rows, int Cpr, int Threads> struct interior_copies {
    static constexpr int CPR = Cpr, CHUNKS = Rows * Cpr / Threads, ROW_STEP = Threads / Cpr;
    const char *src;         /* the first chunk of the next K step to copy */
    uint32_t dst;            /* the first chunk, relative to the tile in a stage */
    uint32_t row_step_bytes; /* ROW_STEP rows of the matrix */
};

/* g: element (0, 0) of the tile of K step 0. Callers check that (CHUNKS - 1) * ROW_STEP * ld * 2
 * fits in 32 bits. */
template <class Copies>
__device__ __forceinline__ Copies interior_copies_at(const uint16_t *g, int64_t ld) {
    constexpr int Cpr = Copies::CPR;
    const int row0 = threadIdx.x / Cpr, chunk = threadIdx.x % Cpr;
    Copies c;
    c.src = reinterpret_cast<const char *>(g + row0 * ld + chunk * 8);
    c.dst = row0 * Cpr * 16 + ((chunk ^ tk_swizzle<Cpr>(row0)) << 4);
    c.row_step_bytes = static_cast<uint32_t>(Copies::ROW_STEP * ld * 2);
    return c;
}

/* The thread's chunks j_begin .. j_end - 1 of the K step at c.src into the tile at smem_tile. */
template <int Rows, int Cpr, int Threads>
__device__ __forceinline__ void copy_interior(const interior_copies<Rows, Cpr, Threads> &c,
                                              uint32_t smem_tile, int j_begin, int j_end) {
    using ic = interior_copies<Rows, Cpr, Threads>;
#pragma unroll
    for (int j = 0; j < ic::CHUNKS; j++) {
        if (j < j_begin || j >= j_end)
            continue;
        tk_cp_async_16(smem_tile + c.dst + j * ic::ROW_STEP * Cpr * 16,
                       c.src + static_cast<uint64_t>(c.row_step_bytes) * static_cast<uint32_t>(j));
    }
}

/* ---- the kernel ---- */

template <class Cfg, typename In, bool BKn, bool Aligned>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS) gemm_kernel(const __grid_constant__ tk_gemm_call p) {
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
    constexpr int MT = WARP_TILE / 16, NT = WARP_TILE / 8; /* mma tiles per warp tile */
    constexpr int K_CPR = BK / 8;                          /* chunks per row of K-contiguous tiles */
    constexpr int N_CPR = BN / 8;                          /* chunks per row of the KN B tile */
    constexpr int KS = BK / 16;                            /* k16 slices per K step */
    extern __shared__ __align__(128) unsigned char smem[];

    int64_t m0, n0;
    tile_origin(p, BM, BN, blockIdx.x, &m0, &n0);

    const uint16_t *a = static_cast<const uint16_t *>(p.a);
    const uint16_t *b = static_cast<const uint16_t *>(p.b);
    const uint32_t smem_a = tk_smem_address(smem);
    const uint32_t smem_b = smem_a + STAGES * Cfg::A_STAGE_BYTES;
    const int64_t k_tiles = (p.k + BK - 1) / BK;

    /* The copies that fill `stage` with K step kt, or with parts > 1 the share `part` of them
     * (a contiguous range of the thread's A chunks, then B chunks); with valid == false the
     * stage is filled with zeros instead (K step kt may then lie past the matrix: nothing is
     * read). */
    constexpr int A_CHUNKS = BM * K_CPR / Cfg::THREADS;  /* per thread and stage */
    constexpr int B_CHUNKS = BN * BK / 8 / Cfg::THREADS;
    auto load_stage = [&](int stage, int64_t kt, bool valid, int part = 0, int parts = 1) {
        const int64_t k0 = (valid ? kt : 0) * BK;
        const int begin = part * (A_CHUNKS + B_CHUNKS) / parts;
        const int end = (part + 1) * (A_CHUNKS + B_CHUNKS) / parts;
        if (begin < A_CHUNKS)
            load_tile<BM, K_CPR, Cfg::THREADS, Aligned>(smem_a + stage * Cfg::A_STAGE_BYTES,
                                                        a + m0 * p.lda + k0, p.lda,
                                                        valid ? p.m - m0 : 0, p.k - k0, begin, end);
        if (end <= A_CHUNKS)
            return;
        if constexpr (BKn)
            load_tile<BK, N_CPR, Cfg::THREADS, Aligned>(smem_b + stage * Cfg::B_STAGE_BYTES,
                                                        b + k0 * p.ldb + n0, p.ldb,
                                                        valid ? p.k - k0 : 0, p.n - n0,
                                                        begin - A_CHUNKS, end - A_CHUNKS);
        else
            load_tile<BN, K_CPR, Cfg::THREADS, Aligned>(smem_b + stage * Cfg::B_STAGE_BYTES,
                                                        b + n0 * p.ldb + k0, p.ldb,
                                                        valid ? p.n - n0 : 0, p.k - k0,
                                                        begin - A_CHUNKS, end - A_CHUNKS);
    };

    /* The interior K steps: those whose copies (of K step kt + STAGES - 1) lie wholly inside A
     * and B, in a block tile inside M and N; they take copy_interior (no byte counts, source
     * pointers advanced by a constant per K step). The last STAGES - 1 K steps, a partial last K
     * step and every K step of an edge tile take load_stage. */
    using a_interior = interior_copies<BM, K_CPR, Cfg::THREADS>;
    using b_interior = interior_copies<BKn ? BK : BN, BKn ? N_CPR : K_CPR, Cfg::THREADS>;
    const bool block_inside =
        Aligned && m0 + BM <= p.m && n0 + BN <= p.n &&
        (a_interior::CHUNKS - 1) * a_interior::ROW_STEP * 2 * p.lda <= UINT32_MAX &&
        (b_interior::CHUNKS - 1) * b_interior::ROW_STEP * 2 * p.ldb <= UINT32_MAX;
    const int64_t interior_k_steps =
        block_inside && p.k / BK > STAGES - 1 ? p.k / BK - (STAGES - 1) : 0;
    a_interior a_copies = interior_copies_at<a_interior>(a + m0 * p.lda + (STAGES - 1) * BK, p.lda);
    b_interior b_copies = interior_copies_at<b_interior>(
        b + (BKn ? (STAGES - 1) * BK * p.ldb + n0 : n0 * p.ldb + (STAGES - 1) * BK), p.ldb);
    const int64_t b_k_step_bytes = (BKn ? BK * p.ldb : BK) * 2;
    auto copy_stage_interior = [&](int stage, int part, int parts) {
        const int begin = part * (A_CHUNKS + B_CHUNKS) / parts;
        const int end = (part + 1) * (A_CHUNKS + B_CHUNKS) / parts;
        if (begin < A_CHUNKS)
            copy_interior(a_copies, smem_a + stage * Cfg::A_STAGE_BYTES, begin, end);
        if (end > A_CHUNKS)
            copy_interior(b_copies, smem_b + stage * Cfg::B_STAGE_BYTES, begin - A_CHUNKS,
                          end - A_CHUNKS);
    };

    /* Per-lane ldmatrix addresses, relative to a stage. A (and NK B): lanes 0-15 give rows 0-15
     * of a 16-row slab at the low 8 k, lanes 16-31 the same rows at the high 8 k. KN B (.trans):
     * lanes give k rows 0-15 (low 8 / high 8 by lane bit 3) of two 8-column chunks (lane bit 4). */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warp_m = warp % Cfg::WARPS_M, warp_n = warp / Cfg::WARPS_M;
    const int a_row = warp_m * WARP_TILE + lane % 16;
    const uint32_t a_lane = a_row * BK * 2;
    const int a_chunk_hi = lane / 16, a_swz = tk_swizzle<K_CPR>(a_row);
    int b_row, b_chunk_hi, b_swz;
    if constexpr (BKn) {
        b_row = lane % 8 + ((lane / 8) % 2) * 8;                  /* k within the k16 slice */
        b_chunk_hi = lane / 16;
        b_swz = tk_swizzle<N_CPR>(b_row);
    } else {
        b_row = warp_n * WARP_TILE + lane % 8 + (lane / 16) * 8;  /* n within the block tile */
        b_chunk_hi = (lane / 8) % 2;
        b_swz = tk_swizzle<K_CPR>(b_row);
    }

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.0f;

    /* The fragments of k16 slice ks of a stage: 4 A tiles of 16x16, 8 B tiles of 16x8. */
    auto load_a_fragment = [&](uint32_t(&af)[4], uint32_t a_stage, int ks, int i) {
        tk_ldmatrix_x4<false>(af,
                              a_stage + i * 16 * BK * 2 + (((2 * ks + a_chunk_hi) ^ a_swz) << 4));
    };
    auto load_a_fragments = [&](uint32_t(&af)[MT][4], uint32_t a_stage, int ks) {
#pragma unroll
        for (int i = 0; i < MT; i++)
            load_a_fragment(af[i], a_stage, ks, i);
    };
    auto load_b_fragments = [&](uint32_t(&bf)[NT / 2][4], uint32_t b_stage, int ks) {
#pragma unroll
        for (int q = 0; q < NT / 2; q++) {
            if constexpr (BKn)
                tk_ldmatrix_x4<true>(
                    bf[q], b_stage + (ks * 16 + b_row) * BN * 2 +
                               (((warp_n * (WARP_TILE / 8) + 2 * q + b_chunk_hi) ^ b_swz) << 4));
            else
                tk_ldmatrix_x4<false>(bf[q], b_stage + (b_row + q * 16) * BK * 2 +
                                                 (((2 * ks + b_chunk_hi) ^ b_swz) << 4));
        }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        load_stage(s, s, s < k_tiles);
        tk_cp_async_commit();
    }

    /* Both schedules issue every copy without a branch: past the last K step the copies only
     * zero-fill a stage nobody reads, so copies, fragment loads and mma form one basic block
     * that ptxas interleaves. The order of the copies and the ldmatrix in the source is kept
     * (both touch shared memory), so where the copies sit decides what they delay. */
    int read_stage = 0, write_stage = STAGES - 1;
    if constexpr (Cfg::PREFETCH_FRAGMENTS) {
        /* The fragments of slice ks + 1 load while the mma of slice ks run: B's 8 tiles into
         * the other half of a double buffer before the slice's mma, each A tile in place right
         * after the mma row that last reads it. The one barrier per K step sits before the last
         * slice, whose fragments are already in registers, so its 32 mma cover the loads of
         * slice 0 from the next stage. Step kt's copies (K step kt + STAGES - 1, into the stage
         * of step kt - 1, which every warp finished reading before the previous barrier) are
         * spread over the first COPY_SLICES slices, between that slice's B loads and its mma,
         * and committed before the barrier: the wait there leaves STAGES - 2 groups in flight. */
        tk_cp_async_wait<STAGES - 2>();
        __syncthreads();
        uint32_t a_stage = smem_a + a_lane, b_stage = smem_b;
        uint32_t af[MT][4], bf[2][NT / 2][4];
        load_a_fragments(af, a_stage, 0);
        load_b_fragments(bf[0], b_stage, 0);
        auto k_step = [&](int64_t kt, auto interior) {
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                if (ks == KS - 1) {
                    tk_cp_async_wait<STAGES - 2>();
                    __syncthreads();
                    read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
                    a_stage = smem_a + read_stage * Cfg::A_STAGE_BYTES + a_lane;
                    b_stage = smem_b + read_stage * Cfg::B_STAGE_BYTES;
                }
                load_b_fragments(bf[(ks + 1) % 2], b_stage, (ks + 1) % KS);
                if (ks < Cfg::COPY_SLICES) {
                    if constexpr (decltype(interior)::value)
                        copy_stage_interior(write_stage, ks, Cfg::COPY_SLICES);
                    else
                        load_stage(write_stage, kt + STAGES - 1, kt + STAGES - 1 < k_tiles, ks,
                                   Cfg::COPY_SLICES);
                    if (ks == Cfg::COPY_SLICES - 1)
                        tk_cp_async_commit();
                }
#pragma unroll
                for (int i = 0; i < MT; i++) {
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        tk_mma_16816<In>(acc[i][j], af[i], bf[ks % 2][j / 2][(j % 2) * 2],
                                         bf[ks % 2][j / 2][(j % 2) * 2 + 1]);
                    load_a_fragment(af[i], a_stage, (ks + 1) % KS, i);
                }
            }
            write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
        };
        int64_t kt = 0;
        for (; kt < interior_k_steps; kt++) {
            k_step(kt, std::true_type());
            a_copies.src += BK * 2;
            b_copies.src += b_k_step_bytes;
        }
        for (; kt < k_tiles; kt++)
            k_step(kt, std::false_type());
    } else {
        /* Per K step: wait for its stage; load the first slice's fragments, then issue the
         * copies of K step kt + STAGES - 1 into the stage that step kt - 1 used (every warp is
         * past it: the barrier), without a branch: past the last K step they only zero-fill a
         * stage nobody reads; then per k16 slice load the fragments and run 32 mma. */
        for (int64_t kt = 0; kt < k_tiles; kt++) {
            tk_cp_async_wait<STAGES - 2>();
            __syncthreads();
            const uint32_t a_stage = smem_a + read_stage * Cfg::A_STAGE_BYTES + a_lane;
            const uint32_t b_stage = smem_b + read_stage * Cfg::B_STAGE_BYTES;
            uint32_t af[MT][4], bf[NT / 2][4];
            load_a_fragments(af, a_stage, 0);
            load_b_fragments(bf, b_stage, 0);
            load_stage(write_stage, kt + STAGES - 1, kt + STAGES - 1 < k_tiles);
            tk_cp_async_commit();
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                if (ks > 0) {
                    load_a_fragments(af, a_stage, ks);
                    load_b_fragments(bf, b_stage, ks);
                }
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        tk_mma_16816<In>(acc[i][j], af[i], bf[j / 2][(j % 2) * 2],
                                         bf[j / 2][(j % 2) * 2 + 1]);
            }
            read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
            write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
        }
    }
    tk_cp_async_wait<0>();
    __syncthreads();

    /* Epilogue: accumulator (g = lane / 4, t = lane % 4) of mma tile (i, j) holds rows g and
     * g + 8, columns 2t and 2t + 1 of that tile. */
    float *staged = reinterpret_cast<float *>(smem) + warp * WARP_TILE * EPI_STRIDE;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) {
            float *s = staged + (i * 16 + g) * EPI_STRIDE + j * 8 + 2 * t;
            *reinterpret_cast<float2 *>(s) = make_float2(acc[i][j][0], acc[i][j][1]);
            *reinterpret_cast<float2 *>(s + 8 * EPI_STRIDE) = make_float2(acc[i][j][2], acc[i][j][3]);
        }
    __syncwarp();
    store_warp_tile(p, staged, m0 + warp_m * WARP_TILE, n0 + warp_n * WARP_TILE, lane);
}

/* ---- host side ---- */

template <class Cfg> int64_t tile_count(const tk_gemm_call *c) {
    const int64_t tiles_m = (c->m + Cfg::BM - 1) / Cfg::BM, tiles_n = (c->n + Cfg::BN - 1) / Cfg::BN;
    return tiles_m > INT32_MAX / tiles_n ? INT64_MAX : tiles_m * tiles_n;
}

/* Whether Cfg can run the call on dev: shared memory, and a grid of at most 2^31 - 1. */
template <class Cfg> bool config_fits(const tk_gemm_call *c, const tk_device *dev) {
    return Cfg::SMEM_BYTES <= dev->max_smem_optin && tile_count<Cfg>(c) <= INT32_MAX;
}

/* A and B allow 16-byte cp.async for every chunk: aligned bases, rows a multiple of 8 apart. */
bool fast_loads(const tk_gemm_call *c) {
    return tk_aligned16(c->a) && tk_aligned16(c->b) && c->lda % 8 == 0 && c->ldb % 8 == 0;
}

template <class Cfg, typename In, bool BKn, bool Aligned>
cudaError_t launch_kernel(const tk_gemm_call *c, const tk_device *dev, cudaStream_t stream) {
    constexpr auto kernel = gemm_kernel<Cfg, In, BKn, Aligned>;
    const cudaError_t err = tk_opt_in_smem<kernel>(dev, Cfg::SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    return tk_launch(kernel, (unsigned)tile_count<Cfg>(c), Cfg::THREADS, Cfg::SMEM_BYTES, stream, *c);
}

template <class Cfg, bool Aligned>
cudaError_t launch_variant(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_gemm_call *c = static_cast<const tk_gemm_call *>(call);
    return tk_dispatch_dtype16(c->input_dtype, [&](auto type) {
        using In = typename decltype(type)::type;
        return c->b_layout == TK_GEMM_B_KN ? launch_kernel<Cfg, In, true, Aligned>(c, dev, stream)
                                           : launch_kernel<Cfg, In, false, Aligned>(c, dev, stream);
    });
}

} // namespace

extern "C" bool tk_gemm_supports_mma_128x256(const void *call, const tk_device *dev) {
    const tk_gemm_call *c = static_cast<const tk_gemm_call *>(call);
    return fast_loads(c) && config_fits<config_128x256>(c, dev) &&
           tile_count<config_128x256>(c) >= dev->sm_count;
}

extern "C" cudaError_t tk_launch_gemm_mma_128x256(const void *call, const tk_device *dev,
                                                  cudaStream_t stream) {
    return launch_variant<config_128x256, true>(call, dev, stream);
}

extern "C" bool tk_gemm_supports_mma_128x128(const void *call, const tk_device *dev) {
    const tk_gemm_call *c = static_cast<const tk_gemm_call *>(call);
    return fast_loads(c) && config_fits<config_128x128>(c, dev);
}

extern "C" cudaError_t tk_launch_gemm_mma_128x128(const void *call, const tk_device *dev,
                                                  cudaStream_t stream) {
    return launch_variant<config_128x128, true>(call, dev, stream);
}

extern "C" bool tk_gemm_supports_mma_unaligned(const void *call, const tk_device *dev) {
    return config_fits<config_unaligned>(static_cast<const tk_gemm_call *>(call), dev);
}

extern "C" cudaError_t tk_launch_gemm_mma_unaligned(const void *call, const tk_device *dev,
                                                    cudaStream_t stream) {
    return launch_variant<config_unaligned, false>(call, dev, stream);
}
