/*
 * The sm_80 tensor-core layer: asynchronous global -> shared copies (cp.async), fragment loads
 * from shared memory (ldmatrix), the m16n8k16 matrix multiply-accumulate (mma.sync) with its
 * fragment layouts, the XOR swizzle that keeps those shared-memory accesses free of bank
 * conflicts, and named barriers (sm_90 code uses them too). The one home of the cp.async,
 * ldmatrix, mma.sync and bar.sync inline PTX; every wrapper is one PTX instruction (or a few
 * integer operations) and is forceinline: the names cost nothing.
 * Device-only, header-only; valid on sm_80 and newer (sm_90 keeps these instructions beside
 * wgmma).
 *
 * Shared-memory operands are 32-bit shared-state-space addresses (tk_smem_address of
 * common.cuh), which is what the instructions take; offsets are added to them as plain integers.
 *
 * The asm statements are volatile, and those touching memory also clobber it, so copies, waits,
 * fragment loads and the multiply-adds stay in source order relative to each other: where a
 * kernel places its copies among its fragment loads decides what they delay.
 */
#ifndef TK_CORE_SM80_CUH
#define TK_CORE_SM80_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

/* ---- named barriers (bar.sync with a thread count: sm_70 and newer) ---- */

/* Named barrier `id` (1..15; 0 is __syncthreads') of Threads threads, whole warps: sync waits
 * until Threads threads have arrived, this warp included; arrive counts this warp and goes on.
 * Threads that sync see the shared and global writes that the arriving threads made before
 * arriving (bar.sync / bar.arrive, CTA-scope ordering like __syncthreads). A pair of them hands
 * a turn from one warpgroup to another (ping-pong consumers). */
template <int Threads> __device__ __forceinline__ void tk_named_barrier_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(Threads) : "memory");
}

/* The same sync for a warp whose lanes may arrive apart (after a branch that one lane took
 * alone): barrier.sync without .aligned first waits for the warp's other non-exited lanes.
 * bar.sync is barrier.sync.aligned, which a warp must execute converged, all its lanes at once;
 * __syncwarp before it does not promise that (compute-sanitizer's synccheck reports such a warp:
 * "Divergent thread(s) in block"). */
template <int Threads> __device__ __forceinline__ void tk_named_barrier_sync_lanes_apart(int id) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "n"(Threads) : "memory");
}

template <int Threads> __device__ __forceinline__ void tk_named_barrier_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(Threads) : "memory");
}

/* ---- cp.async: 16-byte copies global -> shared that bypass registers and L1 ----
 *
 * A thread issues copies, closes them into a group with tk_cp_async_commit, and later waits
 * until at most Pending of its groups are still in flight (tk_cp_async_wait<Pending>). The wait
 * covers only the calling thread's copies: a __syncthreads after it publishes the data to the
 * block. An S-stage ring keeps S - 1 groups in flight: wait<S - 2>, barrier, compute the oldest
 * stage, refill the stage every thread has finished with. `.cg` caches in L2 only (the tile is
 * staged in shared memory, L1 would hold a second copy); it requires 16-byte copies, so dst and
 * src are 16-byte aligned. */

/* cp.async.cg.shared.global [dst], [src], 16: a chunk known to lie wholly inside its source.
 * Cheaper than the zero-filling form when the caller would otherwise compute a byte count: ptxas
 * folds the byte count into each copy's address operands. */
__device__ __forceinline__ void tk_cp_async_16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

/* cp.async.cg.shared.global [dst], [src], 16, src_bytes: reads the first src_bytes (0..16) bytes
 * and writes zeros to the rest of the 16. With src_bytes = 0 nothing is read and the chunk is 16
 * zero bytes: tile edges (rows past a matrix, a ragged last K step) are handled by the copy
 * itself, and zeros add nothing to a dot product. src must still be a valid global address. */
__device__ __forceinline__ void tk_cp_async_16_zfill(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

/* cp.async.commit_group: the copies issued since the last commit form one group. */
__device__ __forceinline__ void tk_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* cp.async.wait_group Pending: returns once at most Pending of this thread's committed groups are
 * still in flight (0: all have landed). */
template <int Pending> __device__ __forceinline__ void tk_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

/* st.shared.v4.u32 [dst], {w0..w3}: one 16-byte store, for tiles staged through registers where
 * the source rules out cp.async (unaligned pointers or strides). dst is 16-byte aligned. */
__device__ __forceinline__ void tk_st_shared_16(uint32_t dst, const uint32_t (&w)[4]) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
}

/* ---- the XOR swizzle of shared tiles ----
 *
 * A tile is rows of ChunksPerRow 16-byte chunks; chunk c of row r is stored at chunk position
 * c ^ tk_swizzle<ChunksPerRow>(r). Shared memory serves 128 bytes (32 banks of 4 bytes, 8 chunk
 * slots) per cycle. An ldmatrix phase reads one 16-byte chunk from each of 8 consecutive rows,
 * and a quarter-warp of cp.async writes 8 chunks; with rows a multiple of 128 bytes apart and no
 * swizzle the 8 chunks of one column would sit in the same slot, an 8-way conflict. XORing the
 * chunk index with row & 7 sends those 8 rows to 8 distinct slots, with no padding bytes:
 *
 *     row 0:  0 1 2 3 4 5 6 7      (stored position of logical chunk 0..7)
 *     row 1:  1 0 3 2 5 4 7 6
 *     row 2:  2 3 0 1 6 7 4 5      logical chunk 0 of rows 0..7 lands in slots 0..7
 *     ...
 *     row 7:  7 6 5 4 3 2 1 0
 *
 * Rows of 64 bytes (4 chunks) put two rows in one 128-byte line, so rows r and r + 1 already
 * differ in slot; XORing with (r >> 1) & 3 separates the 4 row pairs. The XOR depends only on
 * the row's low 3 bits, so rows 8 apart share it (fragment loads that step by 8 or 16 rows keep
 * one XOR per lane). Rows of any multiple of 8 chunks take the row & 7 XOR, which changes only
 * the low 3 bits of the chunk index, so a chunk never leaves its row; rows of other sizes (10
 * or 12 chunks at head dims 80 and 96) are padded up to 16 chunks, or padded by one chunk per
 * row instead of swizzled (attention's V). */
template <int ChunksPerRow> __device__ __forceinline__ int tk_swizzle(int row) {
    static_assert(ChunksPerRow == 4 || ChunksPerRow % 8 == 0,
                  "rows of 64 bytes or multiples of 128 bytes");
    if constexpr (ChunksPerRow == 4)
        return (row >> 1) & 3;
    else
        return row & 7;
}

/* Byte offset of logical chunk `chunk` of row `row` in a swizzled tile. */
template <int ChunksPerRow>
__device__ __forceinline__ uint32_t tk_swizzled_offset(int row, int chunk) {
    return (uint32_t)(row * ChunksPerRow * 16 + ((chunk ^ tk_swizzle<ChunksPerRow>(row)) << 4));
}

/* ---- ldmatrix: four 8x8 matrices of 16-bit elements from shared memory into fragments ----
 *
 * ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r0, r1, r2, r3}, [addr]. Warp-wide: lane l
 * gives the address of row l % 8 of matrix l / 8 (8 contiguous 16-bit elements, 16-byte
 * aligned), and register i of every lane receives a piece of matrix i. With g = lane / 4,
 * t = lane % 4:
 *     plain:  r[i] = matrix i's row g, columns 2t and 2t + 1 (lower column in the low half)
 *     .trans: r[i] = matrix i's column g, rows 2t and 2t + 1 (the matrix transposed)
 * These are exactly the pieces the mma.sync fragments below are made of, so one ldmatrix.x4
 * loads a whole 16x16 A fragment, or the B fragments of two n8 tiles: the plain form for an
 * operand stored with k contiguous (A row-major, B as [N, K]), .trans for B stored as [K, N]. */
template <bool Trans>
__device__ __forceinline__ void tk_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    if constexpr (Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}

/* ldmatrix .x2 .trans: matrices 0 and 1 only, named by lanes 0-15 (the other lanes' addresses
 * are not read): the B fragment of one n8 tile stored as [K, N]. */
__device__ __forceinline__ void tk_ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}

/* ---- mma.sync m16n8k16: D (16x8, f32) += A (16x16) B (16x8), inputs f16 or bf16 ----
 *
 * mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32. Warp-wide; each lane holds a
 * fragment: A in 4 registers of 2 inputs, B in 2, D in 4 floats. With g = lane / 4 (the row
 * group) and t = lane % 4, every register holds two adjacent columns (of A and D) or rows (of B),
 * 2t and 2t + 1, the lower index in the low half:
 *
 *            A (rows x k)                 B (k x columns)            D (rows x columns)
 *             k 0-7    k 8-15                  column g                   columns 2t, 2t+1
 *   row g     a[0]     a[2]          k 2t, 2t+1      b0          row g      d[0], d[1]
 *   row g+8   a[1]     a[3]          k 8+2t, 8+2t+1  b1          row g+8    d[2], d[3]
 *
 * ldmatrix.x4 of the 16x16 A block as matrices (rows 0-7, k 0-7) (rows 8-15, k 0-7)
 * (rows 0-7, k 8-15) (rows 8-15, k 8-15) yields a[0..3] in this order. Of a 16 (columns) x 16 (k)
 * B block it yields the B fragments of two n8 tiles, each matrix one register: matrix (columns
 * 0-7, k 0-7) is b0 of the first tile, (columns 0-7, k 8-15) its b1, and the same for columns
 * 8-15; which register is which follows from the order in which the lanes name the matrices. */
template <typename T>
__device__ __forceinline__ void tk_mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "f16 or bf16");
    if constexpr (std::is_same_v<T, __half>)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats rounded to T (f16 or bf16) in one register, `lo` in the low half: the lower column
 * of a fragment register. */
template <typename T> __device__ __forceinline__ uint32_t tk_pack2(float lo, float hi) {
    uint32_t r;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        memcpy(&r, &v, 4);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        memcpy(&r, &v, 4);
    }
    return r;
}

/* The inverse of tk_pack2: the register's two T (f16 or bf16) as floats, the low half first. A
 * bf16 is the high half of its float, so each is one shift or mask. */
template <typename T> __device__ __forceinline__ float2 tk_unpack2(uint32_t r) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
    else {
        __half2 v;
        memcpy(&v, &r, 4);
        return __half22float2(v);
    }
}

/* The accumulators of one product reused as the A operand of the next, without shared memory
 * (attention's P V: P = the S = Q K^T accumulators after the softmax). The D fragments of two
 * n8 tiles side by side, columns 0-7 (left) and 8-15 (right), hold a 16x16 block in exactly the
 * lane/register positions of the A fragment above, whose k are those 16 columns; rounded to T:
 *     a[0] = left row g, a[1] = left row g + 8, a[2] = right row g, a[3] = right row g + 8
 * (each the lane's two columns 2t, 2t + 1). */
template <typename T>
__device__ __forceinline__ void tk_mma_a_from_acc(uint32_t (&a)[4], const float (&left)[4],
                                                  const float (&right)[4]) {
    a[0] = tk_pack2<T>(left[0], left[1]);
    a[1] = tk_pack2<T>(left[2], left[3]);
    a[2] = tk_pack2<T>(right[0], right[1]);
    a[3] = tk_pack2<T>(right[2], right[3]);
}

#endif
