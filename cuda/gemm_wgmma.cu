/*
 * GEMM with a fused epilogue on Hopper's warpgroup tensor-core instruction (wgmma), sm_90a only:
 *
 *     D[i, j] = act(alpha * sum_k A[i, k] B[j, k] + beta * C[i, j] + bias[j])
 *
 * for B stored [N, K] (a Linear weight; both operands K-major). Inputs f16 or bf16, products
 * summed in f32, epilogue and rounding of D shared with the mma.sync kernels (gemm_epilogue.cuh).
 *
 * Why it is faster than cuda/gemm.cu: mma.sync on an H100 / H200 is fed from registers, and the
 * ldmatrix traffic that fills them saturates shared-memory bandwidth near 450 TFLOP/s.
 * wgmma.m64n256k16 reads both operands straight from shared memory through matrix descriptors
 * (no ldmatrix, no fragment registers) and runs asynchronously, so one warpgroup keeps 64 x 256
 * accumulators (128 f32 per thread) in flight while the tensor core streams the tiles.
 *
 * Block: three warpgroups (384 threads, 1 block per SM), persistent (one block per SM walks
 * tiles blockIdx.x, + gridDim.x, ... in the shared tile order of gemm_epilogue.cuh), 64 x 256
 * output tiles, K step 64, "ping-pong" consumers:
 * - Producer (warpgroup 2, one thread): per K step, waits until the stage is free (its "empty"
 *   mbarrier), then issues two TMA copies (cp.async.bulk.tensor.2d) of the A [64 x 64] and
 *   B [256 x 64] boxes into it; the copies complete the stage's "full" mbarrier with their byte
 *   count. TMA writes the 128-byte swizzle (16-byte chunk c of row r lands at chunk c ^ (r % 8))
 *   that the wgmma descriptors read, so no thread touches the data, and it zero-fills the parts
 *   of a box past the matrix edges: M, N and K edges cost nothing (zeros add nothing). It runs
 *   through the block's tiles without pause, so the next tile's stages are loaded while a
 *   consumer finishes the current one.
 * - Consumers (warpgroups 0 and 1) take the block's tiles in turn (0 the even ones, 1 the odd
 *   ones), each with its own 64 x 256 accumulators. Per K step: wait for "full", issue 4 wgmma
 *   (k16 slices: the descriptors' start address advances 32 bytes inside the swizzled 128-byte
 *   rows), commit, wait for the previous step's group and release its stage ("empty", one
 *   arrival per warp of the warpgroup). The two main loops alternate (named barriers): when one
 *   warpgroup has issued its tile's last MMAs, the other starts its tile while the first runs
 *   the epilogue. The epilogue (bias, GELU: the special-function unit, not the tensor cores)
 *   thus overlaps MMAs instead of idling them, which is what makes the fused epilogues cheap.
 * - 5 stages of 40 KiB = 200 KiB of the 227 KiB of shared memory; setmaxnreg moves registers
 *   from the producer (40) to the consumers (232): 2 x 128 x 232 + 128 x 40 <= 64 Ki.
 * - Epilogue straight from the accumulator registers (store_fragment_strip: alpha, beta C, bias,
 *   activation, dtype, edges; the arithmetic of the staged epilogue of the mma.sync kernels):
 *   no shared memory, which the other warpgroup's loads keep using. Each quad of lanes first
 *   swaps accumulators (__shfl_xor_sync) so that a thread holds runs of 4 consecutive columns:
 *   a warp's 16-bit store then writes whole 32-byte sectors (8 rows x 32 bytes) where the
 *   fragment layout's 2-column stores write half sectors (runs of 8 gain nothing more).
 *
 * This layout replaced one 128 x 256 tile per block on both warpgroups with a staged epilogue:
 * the fused epilogues now cost little over the plain GEMM. Its numbers, and what was tried and
 * not kept (TMA multicast over clusters of 2, cooperative persistent kernels): docs/kernels/gemm.md.
 *
 * Accumulator layout of wgmma m64nNk16 (f32): thread t of the warpgroup (warp w = t / 32,
 * g = (t % 32) / 4, q = t % 4) holds, for each n8 slice j, d[4j], d[4j+1] at row 16w + g,
 * columns 8j + 2q, 8j + 2q + 1, and d[4j+2], d[4j+3] at row 16w + g + 8.
 *
 * Only the sm_90a pass compiles the kernel body (wgmma, setmaxnreg and the TMA tensor copies need
 * the arch-specific target); src/gemm.c marks the variant arch-specific, so it is chosen only on
 * cc 9.0 devices with an sm_90a binary. The TMA, mbarrier, wgmma, setmaxnreg and named-barrier
 * wrappers, and the host-side tensor-map encoding, are those of cuda/core/sm90.cuh.
 */
#include "gemm.h"

#include "common.cuh"
#include "core/sm90.cuh"
#include "gemm_epilogue.cuh"

namespace {

constexpr int BM = 64, BN = 256, BK = 64, STAGES = 5; /* BM x BN: one consumer's tile */
constexpr int CONSUMERS = 2;                       /* warpgroups of BM x BN accumulators */
constexpr int STORE_RUN = 4;                       /* columns per store of the epilogue */
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int A_STAGE_BYTES = BM * BK * 2, B_STAGE_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
constexpr int BARRIER_BYTES = 2 * STAGES * 8;
/* + 1024: the dynamic shared memory is aligned up to the 1024 bytes of a swizzle pattern. */
constexpr int SMEM_BYTES = PIPE_BYTES + BARRIER_BYTES + 1024;
static_assert(A_STAGE_BYTES % 1024 == 0 && B_STAGE_BYTES % 1024 == 0, "swizzle-aligned stages");
static_assert(BK * 2 == 128, "one K step is one 128-byte swizzled row");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* setmaxnreg targets (multiples of 8): 2 x 128 x 232 + 128 x 40 = 64512 <= 65536. */
constexpr int CONSUMER_REGS = 232, PRODUCER_REGS = 40;

#endif

/* ---- the kernel ---- */

__host__ __device__ __forceinline__ int64_t tile_count(int64_t m, int64_t n) {
    const int64_t tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
    return tiles_m > INT32_MAX / tiles_n ? INT64_MAX : tiles_m * tiles_n;
}

/* StoreRun: the epilogue stores runs of this many columns (store_fragments; 2, 4 or 8, the
 * library's is STORE_RUN). */
template <typename In, int StoreRun = STORE_RUN>
__global__ void __launch_bounds__(THREADS, 1)
    wgmma_kernel(const __grid_constant__ tk_gemm_call p, const __grid_constant__ CUtensorMap map_a,
                 const __grid_constant__ CUtensorMap map_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    const uint32_t pipe = (tk_smem_address(smem_raw) + 1023) & ~1023u;
    const uint32_t full_bar = pipe + PIPE_BYTES, empty_bar = full_bar + STAGES * 8;

    const int64_t tiles = tile_count(p.m, p.n);
    const int k_tiles = (int)((p.k + BK - 1) / BK);
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            tk_mbarrier_init(full_bar + 8 * s, 1);  /* the producer's expect_tx */
            tk_mbarrier_init(empty_bar + 8 * s, 4); /* one arrival per consuming warp */
        }
        tk_fence_mbarrier_init();
    }
    __syncthreads();

    /* The ring: K step i of the block, counted over all its tiles, is position i of the ring. */
    if (warpgroup == CONSUMERS) {
        tk_setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == CONSUMERS * 128) {
            tk_stage_ring<STAGES> ring = {0, 0};
            for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                int64_t m0, n0;
                tile_origin(p, BM, BN, tile, &m0, &n0);
                for (int kt = 0; kt < k_tiles; kt++) {
                    /* The first round finds every stage free (parity phase ^ 1). */
                    tk_mbarrier_wait(ring.barrier(empty_bar), ring.phase ^ 1);
                    tk_mbarrier_arrive_expect_tx(ring.barrier(full_bar), STAGE_BYTES);
                    const uint32_t a_dst = pipe + ring.stage * STAGE_BYTES;
                    tk_tma_load_2d(a_dst, &map_a, kt * BK, (int)m0, ring.barrier(full_bar));
                    tk_tma_load_2d(a_dst + A_STAGE_BYTES, &map_b, kt * BK, (int)n0, ring.barrier(full_bar));
                    ring.next();
                }
            }
        }
        return;
    }

    tk_setmaxnreg_inc<CONSUMER_REGS>();
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    float acc[128];
    /* Warpgroup c runs the block's tiles c, c + 2, ... (its ring position starts after c tiles
     * of K steps and skips the other's tile after each of its own). The main loops alternate:
     * a warpgroup starts one when the other has issued all of its own (named barrier 1 + c:
     * 128 threads wait, the other 128 arrive), so one warpgroup's epilogue runs while the other
     * keeps the tensor cores busy. The order also keeps the parity waits exact: a warpgroup
     * waits on a stage only after every earlier round of it has been consumed. */
    tk_stage_ring<STAGES> ring = tk_stage_ring<STAGES>::at(warpgroup * k_tiles);
    const tk_stage_ring<STAGES> other_tile = tk_stage_ring<STAGES>::at(k_tiles);
    for (int64_t tile = blockIdx.x + warpgroup * gridDim.x; tile < tiles; tile += 2 * gridDim.x) {
        int64_t m0, n0;
        tile_origin(p, BM, BN, tile, &m0, &n0);
        if (tile >= gridDim.x) /* not the block's first tile: wait for this warpgroup's turn */
            tk_named_barrier_sync<256>(1 + warpgroup);
        int accumulate = 0;
        uint32_t prev_s = 0;
        for (int kt = 0; kt < k_tiles; kt++) {
            tk_mbarrier_wait(ring.barrier(full_bar), ring.phase);
            const uint32_t a_tile = pipe + ring.stage * STAGE_BYTES;
            const uint32_t b_tile = pipe + ring.stage * STAGE_BYTES + A_STAGE_BYTES;
            tk_wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BK / 16; ks++) {
                tk_wgmma_64x256<In>(acc, tk_wgmma_desc_sw128(a_tile + ks * 32),
                                    tk_wgmma_desc_sw128(b_tile + ks * 32), accumulate);
                accumulate = 1;
            }
            tk_wgmma_commit();
            /* The previous step's group has finished reading its stage: hand it back. */
            tk_wgmma_wait<1>();
            tk_wgmma_pin(acc);
            if (kt > 0 && lane == 0)
                tk_mbarrier_arrive(empty_bar + 8 * prev_s);
            prev_s = ring.stage;
            ring.next();
        }
        /* All of this tile's MMAs are issued: the other warpgroup's turn, if it has a tile. */
        if (tile + gridDim.x < tiles)
            tk_named_barrier_arrive<256>(2 - warpgroup);
        tk_wgmma_wait<0>();
        tk_wgmma_pin(acc);
        if (lane == 0)
            tk_mbarrier_arrive(empty_bar + 8 * prev_s);
        store_fragment_strip<BN / 8, StoreRun>(p, acc, m0 + warp * 16 + lane / 4, n0, lane % 4);
        /* Skip the other warpgroup's tile in the ring. */
        ring.skip(other_tile);
    }
#endif
}

/* ---- host side ---- */

/* The tensor map of a row-major rows x cols (K-contiguous) operand, read in boxes of
 * box_rows x BK elements with the 128-byte swizzle that the wgmma descriptors read. */
cudaError_t encode_operand(CUtensorMap *map, int input_dtype, const void *base, int64_t rows, int64_t cols,
                           int64_t ld, int box_rows) {
    const CUtensorMapDataType type =
        input_dtype == TK_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return tk_tensor_map_2d(map, type, base, rows, cols, ld * 2, (uint32_t)box_rows, BK, CU_TENSOR_MAP_SWIZZLE_128B);
}

/* One call of wgmma_kernel<In, StoreRun>: the tensor maps of A and B, then the launch. */
template <typename In, int StoreRun = STORE_RUN>
cudaError_t launch_kernel(const tk_gemm_call *c, const tk_device *dev, cudaStream_t stream) {
    CUtensorMap map_a, map_b;
    cudaError_t map_err = encode_operand(&map_a, c->input_dtype, c->a, c->m, c->k, c->lda, BM);
    if (map_err == cudaSuccess)
        map_err = encode_operand(&map_b, c->input_dtype, c->b, c->n, c->k, c->ldb, BN);
    if (map_err != cudaSuccess)
        return map_err;
    constexpr auto kernel = wgmma_kernel<In, StoreRun>;
    const cudaError_t err = tk_opt_in_smem<kernel>(dev, SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    /* Persistent: the shared memory allows one block of 384 threads per SM, so one block per SM
     * (or per tile, if there are fewer) walks every gridDim.x-th tile. */
    const int64_t tiles = tile_count(c->m, c->n);
    const unsigned blocks = (unsigned)(tiles < dev->sm_count ? tiles : dev->sm_count);
    return tk_launch(kernel, blocks, THREADS, SMEM_BYTES, stream, *c, map_a, map_b);
}

} // namespace

extern "C" bool tk_gemm_supports_wgmma_128x256(const void *call, const tk_device *dev) {
    const tk_gemm_call *c = static_cast<const tk_gemm_call *>(call);
    /* TMA: 16-byte aligned bases, row strides multiples of 16 bytes below 2^40, int32 box
     * coordinates (K steps up to k + BK). */
    const int64_t max_ld = (int64_t)1 << 39;
    return c->b_layout == TK_GEMM_B_NK && tk_aligned16(c->a) && tk_aligned16(c->b) &&
           c->lda % 8 == 0 && c->ldb % 8 == 0 && c->lda < max_ld && c->ldb < max_ld &&
           c->m <= INT32_MAX && c->n <= INT32_MAX &&
           c->k <= INT32_MAX - BK && SMEM_BYTES <= dev->max_smem_optin && tile_count(c->m, c->n) <= INT32_MAX;
}

extern "C" cudaError_t tk_launch_gemm_wgmma_128x256(const void *call, const tk_device *dev,
                                                    cudaStream_t stream) {
    const tk_gemm_call *c = static_cast<const tk_gemm_call *>(call);
    return tk_dispatch_dtype16(c->input_dtype, [&](auto type) {
        return launch_kernel<typename decltype(type)::type>(c, dev, stream);
    });
}
