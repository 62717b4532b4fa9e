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
 *   fragment layout's 2-column stores write half sectors. Measured on the H200
 *   (experiments/gemm_wgmma_epilogue.cu), the plain GEMM takes 7-16% less time and no longer
 *   more than with a bias (7-14% more before); runs of 8 (16-byte stores, twice the exchanges)
 *   measured the same.
 *
 * Measured on an H200 (docs/kernels/gemm.md), against the previous layout (both warpgroups on
 * one 128 x 256 tile, one tile per block, epilogue staged over the pipeline memory): the fused
 * bias + GELU costs 0-3% over the plain GEMM on four of the five benchmark shapes (2.6-4.4% on
 * 16384 x 14336 x 4096) instead of 2-7%, the plain GEMM is 4-13% faster on the four large shapes
 * and 10-12% slower at 4096^3. Tried and not better: the same with clusters of 2 blocks sharing
 * the B box by TMA multicast; cooperative persistent kernels, with a register or a staged
 * epilogue (the tensor cores idle during their epilogues).
 *
 * Accumulator layout of wgmma m64nNk16 (f32): thread t of the warpgroup (warp w = t / 32,
 * g = (t % 32) / 4, q = t % 4) holds, for each n8 slice j, d[4j], d[4j+1] at row 16w + g,
 * columns 8j + 2q, 8j + 2q + 1, and d[4j+2], d[4j+3] at row 16w + g + 8.
 *
 * Only the sm_90a pass compiles the kernel body (wgmma, setmaxnreg and the TMA tensor copies need
 * the arch-specific target); src/gemm.c marks the variant arch-specific, so it is chosen only on
 * cc 9.0 devices with an sm_90a binary. The tensor maps are built on the host with
 * cuTensorMapEncodeTiled, reached through cudaGetDriverEntryPointByVersion so the library does
 * not link libcuda.
 */
#include "gemm.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <type_traits>

#include "common.cuh"
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

/* ---- PTX wrappers ---- */

/* TMA: the box of `map` at (inner coordinate c0, outer c1) into shared memory at dst. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                            uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* A K-major operand tile in the 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes
 * apart (stride byte offset); the leading byte offset is unused by this layout. */
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int Pending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

/* Keeps the compiler from moving accumulator accesses across a wgmma wait. */
__device__ __forceinline__ void pin_accumulators(float (&d)[128]) {
#pragma unroll
    for (int i = 0; i < 128; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

/* The instruction with its 128 accumulator operands (REGS / OPS, defined where it is used). */
#define TK_WGMMA_64x256(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {" REGS        \
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"                                          \
                 : OPS                                                                         \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate))

/* d (+)= A B^T for a 64 x 16 A tile and a 256 x 16 B tile, both K-major in shared memory;
 * accumulate == 0 overwrites d. */
template <typename In>
__device__ __forceinline__ void wgmma_64x256(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                             int accumulate) {
#define REGS \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define OPS \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
    "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
    "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), \
    "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
    "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
    "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
    "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
    "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), \
    "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), \
    "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
    "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
    "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), \
    "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), \
    "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), \
    "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), \
    "+f"(d[126]), "+f"(d[127])
    if constexpr (std::is_same_v<In, __half>)
        TK_WGMMA_64x256("f16");
    else
        TK_WGMMA_64x256("bf16");
#undef REGS
#undef OPS
}
#undef TK_WGMMA_64x256

#endif

/* ---- the kernel ---- */

__host__ __device__ __forceinline__ int64_t tile_count(int64_t m, int64_t n) {
    const int64_t tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
    return tiles_m > INT32_MAX / tiles_n ? INT64_MAX : tiles_m * tiles_n;
}

/* StoreRun: the epilogue stores runs of this many columns (store_fragments; the experiment
 * experiments/gemm_wgmma_epilogue.cu compares 2, 4 and 8). */
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
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    /* The ring: K step i of the block (counted over all its tiles) uses stage i % STAGES, whose
     * barriers are then in phase i / STAGES; (s, phase) track that position. */
    if (warpgroup == CONSUMERS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (threadIdx.x == CONSUMERS * 128) {
            uint32_t s = 0, phase = 0;
            for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                int64_t m0, n0;
                tile_origin(p, BM, BN, tile, &m0, &n0);
                for (int kt = 0; kt < k_tiles; kt++) {
                    /* The first round finds every stage free (a fresh barrier reports the phase
                     * before its first as complete: parity 1). */
                    tk_mbarrier_wait(empty_bar + 8 * s, phase ^ 1);
                    tk_mbarrier_arrive_expect_tx(full_bar + 8 * s, STAGE_BYTES);
                    const uint32_t a_dst = pipe + s * STAGE_BYTES;
                    tma_load_2d(a_dst, &map_a, kt * BK, (int)m0, full_bar + 8 * s);
                    tma_load_2d(a_dst + A_STAGE_BYTES, &map_b, kt * BK, (int)n0, full_bar + 8 * s);
                    if (++s == STAGES) {
                        s = 0;
                        phase ^= 1;
                    }
                }
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    float acc[128];
    /* Warpgroup c runs the block's tiles c, c + 2, ... (its ring position starts after c tiles
     * of K steps and skips the other's tile after each of its own). The main loops alternate:
     * a warpgroup starts one when the other has issued all of its own (named barrier 1 + c:
     * 128 threads wait, the other 128 arrive), so one warpgroup's epilogue runs while the other
     * keeps the tensor cores busy. The order also keeps the parity waits exact: a warpgroup
     * waits on a stage only after every earlier round of it has been consumed. */
    uint32_t s = (uint32_t)(warpgroup * k_tiles % STAGES);
    uint32_t phase = (uint32_t)(warpgroup * k_tiles / STAGES % 2);
    const uint32_t skip_s = (uint32_t)(k_tiles % STAGES), skip_phase = (uint32_t)(k_tiles / STAGES % 2);
    for (int64_t tile = blockIdx.x + warpgroup * gridDim.x; tile < tiles; tile += 2 * gridDim.x) {
        int64_t m0, n0;
        tile_origin(p, BM, BN, tile, &m0, &n0);
        if (tile >= gridDim.x) /* not the block's first tile: wait for this warpgroup's turn */
            asm volatile("bar.sync %0, 256;\n" ::"r"(1 + warpgroup) : "memory");
        int accumulate = 0;
        uint32_t prev_s = 0;
        for (int kt = 0; kt < k_tiles; kt++) {
            tk_mbarrier_wait(full_bar + 8 * s, phase);
            const uint32_t a_tile = pipe + s * STAGE_BYTES;
            const uint32_t b_tile = pipe + s * STAGE_BYTES + A_STAGE_BYTES;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BK / 16; ks++) {
                wgmma_64x256<In>(acc, smem_descriptor(a_tile + ks * 32),
                                 smem_descriptor(b_tile + ks * 32), accumulate);
                accumulate = 1;
            }
            wgmma_commit();
            /* The previous step's group has finished reading its stage: hand it back. */
            wgmma_wait<1>();
            pin_accumulators(acc);
            if (kt > 0 && lane == 0)
                tk_mbarrier_arrive(empty_bar + 8 * prev_s);
            prev_s = s;
            if (++s == STAGES) {
                s = 0;
                phase ^= 1;
            }
        }
        /* All of this tile's MMAs are issued: the other warpgroup's turn, if it has a tile. */
        if (tile + gridDim.x < tiles)
            asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - warpgroup) : "memory");
        wgmma_wait<0>();
        pin_accumulators(acc);
        if (lane == 0)
            tk_mbarrier_arrive(empty_bar + 8 * prev_s);
        store_fragment_strip<BN / 8, StoreRun>(p, acc, m0 + warp * 16 + lane / 4, n0, lane % 4);
        /* Skip the other warpgroup's tile in the ring. */
        s += skip_s;
        phase ^= skip_phase;
        if (s >= STAGES) {
            s -= STAGES;
            phase ^= 1;
        }
    }
#endif
}

/* ---- host side ---- */

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
        return nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

/* The tensor map of a row-major rows x cols (K-contiguous) operand, read in boxes of
 * box_rows x BK elements with the 128-byte swizzle. Out-of-bounds elements read as zero. */
bool encode_operand(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap *map, int input_dtype,
                    const void *base, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {BK, (cuuint32_t)box_rows};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUtensorMapDataType type =
        input_dtype == TK_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return encode(map, type, 2, const_cast<void *>(base), dims, strides, box, element_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* One call of wgmma_kernel<In, StoreRun>: the tensor maps of A and B, then the launch. */
template <typename In, int StoreRun = STORE_RUN>
cudaError_t launch_kernel(const tk_gemm_call *c, const tk_device *dev, cudaStream_t stream) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode)
        return cudaErrorNotSupported;
    CUtensorMap map_a, map_b;
    if (!encode_operand(encode, &map_a, c->input_dtype, c->a, c->m, c->k, c->lda, BM) ||
        !encode_operand(encode, &map_b, c->input_dtype, c->b, c->n, c->k, c->ldb, BN))
        return cudaErrorInvalidValue;
    constexpr auto kernel = wgmma_kernel<In, StoreRun>;
    const cudaError_t err = tk_opt_in_smem<kernel>(dev, SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    /* Persistent: the shared memory allows one block of 384 threads per SM, so one block per SM
     * (or per tile, if there are fewer) walks every gridDim.x-th tile. */
    const int64_t tiles = tile_count(c->m, c->n);
    const unsigned blocks = (unsigned)(tiles < c->sm_count ? tiles : c->sm_count);
    return tk_launch(kernel, blocks, THREADS, SMEM_BYTES, stream, *c, map_a, map_b);
}

} // namespace

extern "C" bool tk_gemm_supports_wgmma_128x256(const void *call) {
    const tk_gemm_call *c = static_cast<const tk_gemm_call *>(call);
    /* TMA: 16-byte aligned bases, row strides multiples of 16 bytes below 2^40, int32 box
     * coordinates (K steps up to k + BK). */
    const int64_t max_ld = (int64_t)1 << 39;
    return c->b_layout == TK_GEMM_B_NK && tk_aligned16(c->a) && tk_aligned16(c->b) &&
           c->lda % 8 == 0 && c->ldb % 8 == 0 && c->lda < max_ld && c->ldb < max_ld &&
           c->m <= INT32_MAX && c->n <= INT32_MAX &&
           c->k <= INT32_MAX - BK && SMEM_BYTES <= c->max_smem_optin && tile_count(c->m, c->n) <= INT32_MAX;
}

extern "C" cudaError_t tk_launch_gemm_wgmma_128x256(const void *call, const tk_device *dev,
                                                    cudaStream_t stream) {
    const tk_gemm_call *c = static_cast<const tk_gemm_call *>(call);
    return tk_dispatch_dtype16(c->input_dtype, [&](auto type) {
        return launch_kernel<typename decltype(type)::type>(c, dev, stream);
    });
}
