/*
 * The Hopper device layer: the one home of the sm_90 / sm_90a inline PTX that a warp-specialised
 * kernel is built from, in the order such a kernel uses it:
 *
 *   host     tk_tensor_map_2d          describe a global matrix to the TMA unit
 *   TMA      tk_tma_load_2d / _4d      copy a box of it into shared memory, counted on an mbarrier
 *            (tk_bulk_load: contiguous bytes, no tensor map)
 *            (tk_tma_prefetch_map: fetch its descriptor ahead of the first copy)
 *   mbarrier tk_mbarrier_*             init, arrive, arrive + expect bytes, wait for a phase
 *   ring     tk_stage_ring             which stage and phase parity a pipeline step uses
 *   smem     tk_stmatrix_x4_trans, tk_fence_proxy_async_shared   a tile written by threads, for wgmma
 *   bulk     tk_bulk_reduce_add_f32, tk_bulk_commit / _wait*  add a shared tile into global memory
 *            (tk_l2_evict_last_policy: its L2 cache policy)
 *   wgmma    tk_wgmma_*                descriptors, fence, commit, wait, m64n256k16, m64nNk16
 *                                      (N = 64, 80, 128), m64nNk16 with A from registers
 *                                      (N = 64, 128)
 *   warps    tk_setmaxnreg_* (tk_named_barrier_*: sm80.cuh)   producer / consumer warpgroups
 *   clusters tk_cluster_*              rank, size, barrier, stores into another block's shared memory
 *
 * Shared-memory operands are 32-bit shared-state-space addresses (tk_smem_address of
 * common.cuh); an mbarrier is 8 bytes of shared memory, 8-byte aligned. Availability: TMA,
 * mbarrier transaction counts and clusters need sm_90 and compile for __CUDA_ARCH__ >= 900;
 * wgmma and setmaxnreg need the arch-specific sm_90a target (__CUDA_ARCH_FEAT_SM90_ALL), so a
 * kernel using them compiles its body only there and its variant is marked arch-specific. Both
 * are declared in the host pass as well, so that a kernel's guarded body is the only #if.
 */
#ifndef TK_CORE_SM90_CUH
#define TK_CORE_SM90_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "launch.cuh"
#include "sm80.cuh"

/* ---- host: tensor maps ---- */

/* The tensor map of a row-major rows x cols matrix of `type` at `base` (16-byte aligned; rows
 * row_bytes apart, a multiple of 16 below 2^40), read in boxes of box_rows x box_cols elements
 * that TMA writes to shared memory in the given swizzle (box_cols elements span at most the
 * swizzle's bytes). Elements of a box outside the matrix read as zero, so a tile at an edge
 * needs no special case. L2 promotion of 256 bytes: whole sectors of the rows a box touches.
 * cudaErrorNotSupported without an encoder, cudaErrorInvalidValue when the driver rejects the
 * map. The map is passed to the kernel as a __grid_constant__ parameter. */
inline cudaError_t tk_tensor_map_2d(CUtensorMap *map, CUtensorMapDataType type, const void *base, int64_t rows,
                                    int64_t cols, int64_t row_bytes, uint32_t box_rows, uint32_t box_cols,
                                    CUtensorMapSwizzle swizzle) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode =
        tk_driver_function<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
    if (!encode)
        return cudaErrorNotSupported;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
    const cuuint32_t box[2] = {box_cols, box_rows};
    const cuuint32_t element_strides[2] = {1, 1};
    return encode(map, type, 2, const_cast<void *>(base), dims, strides, box, element_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? cudaSuccess
               : cudaErrorInvalidValue;
}

/* ---- the ring of pipeline stages ---- */

/* Where a pipeline step is in a ring of Stages stages, each guarded by its mbarriers (a "full"
 * one the consumers wait on, an "empty" one the producer waits on). Step i (counted from 0 over
 * the whole kernel) uses stage i % Stages in round i / Stages; a stage's barrier completes one
 * phase per round, so step i waits on phase parity (i / Stages) % 2. A fresh mbarrier reports
 * the phase before its first as complete: a producer that waits on parity `phase ^ 1` for a
 * stage to be free passes in round 0 without a consumer having released anything. Positions
 * add: skip(at(n)) moves n steps on, e.g. past the steps another consumer takes. */
template <int Stages> struct tk_stage_ring {
    uint32_t stage, phase;

    static __host__ __device__ __forceinline__ tk_stage_ring at(int step) {
        return {(uint32_t)(step % Stages), (uint32_t)(step / Stages % 2)};
    }
    __host__ __device__ __forceinline__ void next() {
        if (++stage == Stages) {
            stage = 0;
            phase ^= 1;
        }
    }
    __host__ __device__ __forceinline__ void skip(tk_stage_ring steps) {
        stage += steps.stage;
        phase ^= steps.phase;
        if (stage >= Stages) {
            stage -= Stages;
            phase ^= 1;
        }
    }
    /* This stage's barrier in an array of one 8-byte mbarrier per stage at `bars`. */
    __host__ __device__ __forceinline__ uint32_t barrier(uint32_t bars) const { return bars + 8 * stage; }
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

/* ---- mbarrier (sm_90: with transaction counts) ---- */

/* A phase of an mbarrier completes when `count` arrivals have come AND every byte announced
 * with expect_tx in that phase has landed (TMA copies and st.async count their bytes on it
 * with complete_tx). Then the next phase starts with the same count. */

/* mbarrier.init: one thread, before any use. Follow it with tk_fence_mbarrier_init and a
 * barrier (__syncthreads, or tk_cluster_start when other blocks use it). */
__device__ __forceinline__ void tk_mbarrier_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* fence.mbarrier_init.release.cluster: makes this thread's mbarrier.init visible to the async
 * proxy (TMA, st.async from other blocks) and to the cluster; the generic barrier that follows
 * it makes it visible to the other threads. */
__device__ __forceinline__ void tk_fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* mbarrier.arrive.expect_tx: one arrival, and `bytes` more to land before the phase completes.
 * Issue it before (or together with) the copies it counts, in the same phase. Release: the
 * thread's earlier writes are visible to whoever waits on the phase. */
__device__ __forceinline__ void tk_mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

/* mbarrier.arrive: one arrival, with release semantics (e.g. a consumer's "I have finished
 * reading this stage": its reads are ordered before the producer's next writes to it). */
__device__ __forceinline__ void tk_mbarrier_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/* Returns once the phase of `bar` with the given parity has completed (mbarrier.try_wait.parity
 * in a loop; try_wait suspends the thread for a while in hardware rather than spinning).
 * Acquire: the bytes counted on the phase and the writes released by its arrivals are visible
 * after it. Waiting on the parity of the phase before the current one returns at once. */
__device__ __forceinline__ void tk_mbarrier_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* ---- TMA ---- */

/* cp.async.bulk (1-D, no tensor map): `bytes` contiguous bytes (a multiple of 16; both addresses
 * 16-byte aligned) from global memory at src into this block's shared memory at dst, counted on
 * the mbarrier `bar` (complete_tx), whose phase must expect them (tk_mbarrier_arrive_expect_tx).
 * One thread issues it; the TMA unit moves the bytes, so no thread holds registers for them
 * while they are in flight. */
__device__ __forceinline__ void tk_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* prefetch.tensormap: bring the descriptor `map` (a __grid_constant__ kernel parameter) into the
 * TMA unit's cache, so that the first copy through it does not wait for that fetch. Issued at
 * kernel entry, it overlaps the block's set-up (barrier initialisation, a mask table's fill). */
__device__ __forceinline__ void tk_tma_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

/* cp.async.bulk.tensor.2d: the box of `map` at (inner coordinate c0, outer c1), in elements,
 * into shared memory at dst (aligned to the map's swizzle span: 1024 bytes for 128B), laid out
 * in the map's swizzle; its byte count completes on the mbarrier `bar`, which this phase must
 * expect (tk_mbarrier_arrive_expect_tx). One thread issues it; nothing orders it with the
 * thread's other accesses: readers wait on `bar`, and the writer of dst's previous contents
 * must have been waited for (the stage's "empty" barrier). `map` is a __grid_constant__ kernel
 * parameter (its generic address is what the instruction reads). */
__device__ __forceinline__ void tk_tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* cp.async.bulk.tensor.4d: tk_tma_load_2d for a map of four dimensions, the box at (c0, c1, c2,
 * c3) (innermost first). */
__device__ __forceinline__ void tk_tma_load_4d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                               uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}

/* cp.async.bulk.tensor.4d, shared to global: the box of `map` at (c0, c1, c2, c3) (innermost
 * first) from shared memory at src, laid out in the map's swizzle and aligned to its span, by
 * the async proxy; elements outside the tensor are not written. The threads that wrote src fence
 * (tk_fence_proxy_async_shared) and sync before one thread issues it. The copies issued since the
 * last commit form a bulk group (tk_bulk_commit): src may be written again, and the block may
 * exit, once tk_bulk_wait_read says the group has read it. */
__device__ __forceinline__ void tk_tma_store_4d(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

/* ---- shared memory written for the async proxy ---- */

/* stmatrix.m8n8.x4.trans: four 8 x 8 matrices of 16-bit elements stored transposed. Register
 * r[m] holds this thread's pair of matrix m in the mma.sync fragment layout (lane 4 g + t: row g,
 * columns 2t, 2t + 1), e.g. an A fragment packed from accumulators (tk_mma_a_from_acc); lane l
 * gives the shared address of stored row l % 8 of matrix l / 8, which receives column l % 8 of
 * the fragment's matrix (16 contiguous bytes). A warp transposes a 16 x 16 tile in one
 * instruction: the attention backward stores dS^T as dS this way. */
__device__ __forceinline__ void tk_stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

/* fence.proxy.async.shared::cta: this thread's earlier writes to shared memory (st.shared,
 * stmatrix: the generic proxy) become visible to the async proxy, which wgmma's descriptor
 * operands and TMA stores read through. The writers fence, then a barrier hands the tile to the
 * warpgroups that issue the wgmma. */
__device__ __forceinline__ void tk_fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* fence.proxy.async.global: orders this thread's global-memory accesses through the async proxy
 * (bulk copies and reductions) with its generic ones, e.g. sums a bulk group finished (tk_bulk_wait)
 * before a release store that publishes them, or an acquire load before the bulk adds it allows. */
__device__ __forceinline__ void tk_fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

/* An L2 cache policy that keeps the lines it is given to (createpolicy evict_last, for all of
 * them): for data that other CTAs read or add into again soon, such as the backward's f32 dQ
 * accumulator. */
__device__ __forceinline__ uint64_t tk_l2_evict_last_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

/* cp.reduce.async.bulk .add.f32: adds `bytes` of f32 from shared memory (`src`) into global
 * memory (`dst`) element by element, in L2, by the async proxy, under the L2 cache policy
 * `policy` (e.g. tk_l2_evict_last_policy): one instruction for what would be bytes / 16
 * red.global.add.v4.f32. Both addresses 16-byte aligned, bytes a multiple of 16; the shared
 * source written by threads needs tk_fence_proxy_async_shared and a barrier first. The copies
 * issued since the last commit form a bulk group (tk_bulk_commit); the source may be written
 * again once tk_bulk_wait_read says the group has read it, and the global sums are done after
 * tk_bulk_wait (a CTA waits for that before it exits). */
__device__ __forceinline__ void tk_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes, uint64_t policy) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], %2, %3;" ::"l"(
                     dst),
                 "r"(src), "r"(bytes), "l"(policy)
                 : "memory");
}
__device__ __forceinline__ void tk_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* Until at most Pending of this thread's bulk groups are still reading their shared source. */
template <int Pending> __device__ __forceinline__ void tk_bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory");
}
/* Until at most Pending of this thread's bulk groups are incomplete (their global writes done). */
template <int Pending> __device__ __forceinline__ void tk_bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(Pending) : "memory");
}

/* ---- clusters (distributed shared memory) ---- */

/* %cluster_ctarank: this block's rank in its cluster, 0 .. tk_cluster_blocks() - 1. */
__device__ __forceinline__ int tk_cluster_rank() {
    int r;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

/* %cluster_nctarank: blocks in this block's cluster (1 for a launch without clusters). */
__device__ __forceinline__ int tk_cluster_blocks() {
    int r;
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

/* The start of a kernel whose blocks write into each other's shared memory: a block may send
 * into another only once that block runs and has initialised its barriers. Every thread arrives
 * relaxed (tk_fence_mbarrier_init already published the initialisation to the cluster) and waits
 * for all the others; the wait also publishes the initialisation to this block's own threads.
 * Relaxed, not release: a release arrive waits for this thread's outstanding memory operations
 * (MEMBAR.ALL.CTA and MEMBAR.ALL.GPU in the SASS), so loads issued before the barrier would have
 * to land first instead of overlapping its round trip. No barrier is needed at the exit of a kernel whose blocks each
 * wait, on their own mbarriers, for everything sent to them. */
__device__ __forceinline__ void tk_cluster_start() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

/* mapa: the shared-state-space address, in the cluster's block `rank`, of the variable at the
 * local address `local` (every block has the same shared-memory layout). */
__device__ __forceinline__ uint32_t tk_cluster_map(uint32_t local, int rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    return remote;
}

/* st.async: (x, y) into block `rank`'s shared memory at `slot`, its 8 bytes completing on that
 * block's mbarrier `bar` (both given as local addresses and mapped), which the receiver arms
 * with expect_tx and waits on. Asynchronous: unlike a release (barrier.cluster.arrive,
 * st.release) it does not wait for this thread's global stores to complete. Only in a cluster
 * of two blocks or more: the PTX ISA leaves st.async undefined when %cluster_nctarank is 1,
 * even into the block's own shared memory (compute-sanitizer reports it); a kernel that may
 * run as one block combines in plain shared memory instead. */
__device__ __forceinline__ void tk_cluster_send_f32x2(uint32_t slot, uint32_t bar, int rank, float x, float y) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
                     tk_cluster_map(slot, rank)),
                 "f"(x), "f"(y), "r"(tk_cluster_map(bar, rank))
                 : "memory");
}

/* st.async of one f32, as tk_cluster_send_f32x2: for a partial that is a single value (a row
 * sum), 4 bytes counted on the receiver's mbarrier. The same rules: asynchronous, clusters of
 * two blocks or more. */
__device__ __forceinline__ void tk_cluster_send_f32(uint32_t slot, uint32_t bar, int rank, float x) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(
                     tk_cluster_map(slot, rank)),
                 "f"(x), "r"(tk_cluster_map(bar, rank))
                 : "memory");
}

#endif

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* ---- register reallocation (sm_90a); named barriers are in sm80.cuh ---- */

/* setmaxnreg: every warp of the warpgroup sets its register budget to Regs per thread (a
 * multiple of 8, 24..256): the producer warpgroup releases registers (dec) that the consumer
 * warpgroups take (inc, which waits until the pool has them). The kernel's __launch_bounds__
 * budget is the starting point; the sum over warpgroups must fit the register file. */
template <int Regs> __device__ __forceinline__ void tk_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

template <int Regs> __device__ __forceinline__ void tk_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

/* ---- wgmma (sm_90a) ---- */

/* The wgmma shared-memory matrix descriptor of a K-major operand tile in the 128-byte swizzle
 * (as TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes (64 16-bit elements of
 * K), 8-row groups 1024 bytes apart (stride byte offset); the leading byte offset is unused by
 * this layout. The tile starts 1024-byte aligned; a k16 slice inside it starts 32 bytes further
 * per slice (the hardware applies the swizzle to the address it forms). */
__device__ __forceinline__ uint64_t tk_wgmma_desc_sw128(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* The descriptor of an N-major B operand (e.g. attention's V: keys x head dim, head dim
 * contiguous) in the 128-byte swizzle: swizzle atoms of 64 columns (128-byte rows, one TMA box
 * each) along N, atom_bytes apart, and along K 8-row groups 1024 bytes apart. For MN-major
 * swizzled layouts the PTX ISA's leading byte offset is the distance between those atoms along N
 * ("from the first (swizzle-byte-size / 16) rows to the next", in 16-byte units: 8 x 16 bytes =
 * 64 columns) and the stride byte offset that between 8-row groups along K ("the first 8 columns
 * to the next 8"), as CUTLASS's make_gmma_desc fills them for Major::MN. N = 64 reads one atom,
 * and the leading offset not at all (atom_bytes may be left at 1024). */
__device__ __forceinline__ uint64_t tk_wgmma_desc_n_major_sw128(uint32_t addr, uint32_t atom_bytes = 1024) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((atom_bytes & 0x3FFFF) >> 4) << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* A descriptor moved `bytes` (a multiple of 16) further along its tile: only the start address
 * field (bits 0-13, the address / 16) changes, and it cannot carry out of them (shared memory
 * ends below 256 KiB), so one 32-bit add on the low word, the high word (the stride byte offset,
 * the swizzle) as it was. A loop then builds a tile's descriptor once and steps it per k slice,
 * as CUTLASS's descriptor iterators do, instead of rebuilding each from its address (a mask, a
 * shift and two ors per operand and instruction). */
__device__ __forceinline__ uint64_t tk_wgmma_desc_add(uint64_t desc, uint32_t bytes) {
    return (desc & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)desc + (bytes >> 4));
}

/* wgmma.fence: orders the warpgroup's earlier accesses to the accumulator registers before the
 * wgmma that follow. Required before the first wgmma of a batch whose accumulators were written
 * or read by other instructions since the last wait (e.g. the previous tile's epilogue). */
__device__ __forceinline__ void tk_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

/* wgmma.commit_group: closes the wgmma issued since the last commit into one group, which
 * tk_wgmma_wait counts. */
__device__ __forceinline__ void tk_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

/* wgmma.wait_group Pending: returns once at most Pending of this warpgroup's committed groups
 * are still running. The finished groups' accumulators may then be read and their
 * shared-memory operands overwritten (a stage released); follow with tk_wgmma_pin. */
template <int Pending> __device__ __forceinline__ void tk_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

/* Keeps the compiler from moving accesses to the accumulators across a wgmma wait: the asm
 * wrappers do not name the registers that an asynchronous wgmma still writes. Emits nothing. */
template <int N> __device__ __forceinline__ void tk_wgmma_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

/* Hides x's value from the optimiser at this point: what is derived from it is computed after it,
 * not hoisted out of the loop it sits in and kept live across the loop, which a warp with few
 * registers (a producer after tk_setmaxnreg_dec) may have to spill. Emits nothing. */
__device__ __forceinline__ void tk_no_hoist(int &x) { asm volatile("" : "+r"(x)); }

/* ptxas may move register-only math past a wgmma wait: nothing in the wait names those
 * registers. Left alone it put the attention kernel's whole softmax after the wait for the P V
 * it was written to overlap, and the tensor cores idled through the exponentials. A store is
 * not moved past the wait (its "memory" clobber), so a store that uses x keeps x, and all the
 * math x depends on, before it. The store is never taken for x >= 0 or NaN (such as a row sum
 * of exponentials), and it goes to a shared word that nothing reads. */
__device__ __forceinline__ void tk_compute_before_wgmma_wait(float x, float *unread) {
    if (x < 0.0f)
        *unread = x;
}

/* wgmma.mma_async m64n256k16, both operands from shared memory (descriptors), f32 accumulators:
 * d (+)= A B^T for a 64 x 16 A tile and a 256 x 16 B tile of In (f16 or bf16), both K-major;
 * accumulate == 0 overwrites d. Issued by the 128 threads of a warpgroup together; asynchronous
 * until tk_wgmma_commit + tk_wgmma_wait. Accumulator layout (thread t, warp w = t / 32,
 * g = (t % 32) / 4, q = t % 4): for each n8 slice j, d[4j], d[4j+1] at row 16w + g, columns
 * 8j + 2q, 8j + 2q + 1, and d[4j+2], d[4j+3] at row 16w + g + 8. Another N is another operand
 * list: N / 2 accumulators per thread. */
#define TK_WGMMA_64x256(TYPE)                                                                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                       \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {" REGS                              \
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"                                                                \
                 : OPS                                                                                               \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate))

template <typename In>
__device__ __forceinline__ void tk_wgmma_64x256(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
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

/* The operand lists: accumulator slice j (n8 columns 8 j .. 8 j + 7) is d[j][0..3]; an mN
 * instruction takes N / 8 slices, as registers %0 .. %(N / 2 - 1). */
#define TK_WGMMA_D(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define TK_WGMMA_OPS_8 \
    TK_WGMMA_D(0), TK_WGMMA_D(1), TK_WGMMA_D(2), TK_WGMMA_D(3), TK_WGMMA_D(4), TK_WGMMA_D(5), TK_WGMMA_D(6), TK_WGMMA_D(7)
#define TK_WGMMA_OPS_10 TK_WGMMA_OPS_8, TK_WGMMA_D(8), TK_WGMMA_D(9)
#define TK_WGMMA_OPS_16 \
    TK_WGMMA_OPS_10, TK_WGMMA_D(10), TK_WGMMA_D(11), TK_WGMMA_D(12), TK_WGMMA_D(13), TK_WGMMA_D(14), TK_WGMMA_D(15)
#define TK_WGMMA_REGS_32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TK_WGMMA_REGS_40 TK_WGMMA_REGS_32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define TK_WGMMA_REGS_64 \
    TK_WGMMA_REGS_40 ", %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

/* d (=)+= A B^T, wgmma m64nNk16 for N = 128, 80 or 64 (attention's S = Q K^T for a tile of N
 * keys): A K-major from shared memory, B K-major (or with TRANS_B N-major, the transpose bit:
 * d += A B for a B stored k x N, N contiguous, such as the backward's K in dQ = dS K, described
 * by tk_wgmma_desc_n_major_sw128); d[j][e] is tk_wgmma_64x256's d[4j + e] (n8 slice j). */
template <typename T, int N, bool TRANS_B = false>
__device__ __forceinline__ void tk_wgmma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#define WGMMA_SS(SHAPE, TYPE, REGS, OPS, A, B, ACC, TB)                                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ACC ", 0;\n"                                     \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" REGS                 \
                 "}, %" A ", %" B ", p, 1, 1, 0, %" TB ";\n}\n"                                        \
                 : OPS                                                                                 \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B ? 1 : 0))
    static_assert(N == 128 || N == 80 || N == 64, "the widths the attention kernels use");
    static_assert(!TRANS_B || N == 64, "an N-major B of one 128-byte swizzle atom");
    constexpr bool F16 = std::is_same_v<T, __half>;
    if constexpr (N == 128 && F16)
        WGMMA_SS("m64n128k16", "f16", TK_WGMMA_REGS_64, TK_WGMMA_OPS_16, "64", "65", "66", "67");
    else if constexpr (N == 128)
        WGMMA_SS("m64n128k16", "bf16", TK_WGMMA_REGS_64, TK_WGMMA_OPS_16, "64", "65", "66", "67");
    else if constexpr (N == 80 && F16)
        WGMMA_SS("m64n80k16", "f16", TK_WGMMA_REGS_40, TK_WGMMA_OPS_10, "40", "41", "42", "43");
    else if constexpr (N == 80)
        WGMMA_SS("m64n80k16", "bf16", TK_WGMMA_REGS_40, TK_WGMMA_OPS_10, "40", "41", "42", "43");
    else if constexpr (F16)
        WGMMA_SS("m64n64k16", "f16", TK_WGMMA_REGS_32, TK_WGMMA_OPS_8, "32", "33", "34", "35");
    else
        WGMMA_SS("m64n64k16", "bf16", TK_WGMMA_REGS_32, TK_WGMMA_OPS_8, "32", "33", "34", "35");
#undef WGMMA_SS
}

/* d += A B, wgmma m64nNk16 for N = 64 or 128: A from registers in the mma.sync m16n8k16 A layout
 * per warp (attention's P), B N-major from shared memory (transpose bit; attention's V, N / 64
 * swizzle atoms: tk_wgmma_desc_n_major_sw128); d[j][e] is tk_wgmma_64x256's d[4j + e] (n8 slice
 * j), so the m64n128k16 accumulators are those of two m64n64k16 on columns 0-63 and 64-127, in
 * that order. */
template <typename T, int N>
__device__ __forceinline__ void tk_wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b) {
#define WGMMA_RS(SHAPE, TYPE, REGS, OPS, A0, A1, A2, A3, B, ACC)                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ACC ", 0;\n"                                     \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" REGS                 \
                 "}, {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" B ", p, 1, 1, 1;\n}\n"                   \
                 : OPS                                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))
    static_assert(N == 128 || N == 64, "one or two 64-column swizzle atoms of B");
    constexpr bool F16 = std::is_same_v<T, __half>;
    if constexpr (N == 128 && F16)
        WGMMA_RS("m64n128k16", "f16", TK_WGMMA_REGS_64, TK_WGMMA_OPS_16, "64", "65", "66", "67", "68", "69");
    else if constexpr (N == 128)
        WGMMA_RS("m64n128k16", "bf16", TK_WGMMA_REGS_64, TK_WGMMA_OPS_16, "64", "65", "66", "67", "68", "69");
    else if constexpr (F16)
        WGMMA_RS("m64n64k16", "f16", TK_WGMMA_REGS_32, TK_WGMMA_OPS_8, "32", "33", "34", "35", "36", "37");
    else
        WGMMA_RS("m64n64k16", "bf16", TK_WGMMA_REGS_32, TK_WGMMA_OPS_8, "32", "33", "34", "35", "36", "37");
#undef WGMMA_RS
}

#undef TK_WGMMA_REGS_64
#undef TK_WGMMA_OPS_16
#undef TK_WGMMA_REGS_40
#undef TK_WGMMA_OPS_10
#undef TK_WGMMA_REGS_32
#undef TK_WGMMA_OPS_8
#undef TK_WGMMA_D

/* tk_wgmma_pin for registers in n8 slices: accumulators (float) or A fragments (uint32_t) that
 * an asynchronous wgmma still writes or reads. Emits nothing. */
template <typename E, int N> __device__ __forceinline__ void tk_wgmma_pin(E (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if constexpr (std::is_same_v<E, float>)
                asm volatile("" : "+f"(d[j][e])::"memory");
            else
                asm volatile("" : "+r"(d[j][e])::"memory");
        }
}

#endif

#endif
