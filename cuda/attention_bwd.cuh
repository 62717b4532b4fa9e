/* The pieces of the attention backward that every main kernel shares (attention_bwd.cu's
 * portable "mma_sm80*" kernels, attention_bwd_sm90.cu's Hopper "wgmma_sm90"): the kernel
 * parameters, the f32 dQ accumulator's layout, the row kernels around the main one (D, dsinks,
 * dQ's conversion, the order words' clearing), the deterministic order of the dQ adds, the
 * per-element P and dS, and the launch sequence. docs/kernels/attention_bwd.md has the math. */
#ifndef TK_ATTENTION_BWD_CUH
#define TK_ATTENTION_BWD_CUH

#include <cuda/atomic>

#include "attention.cuh"
#include "attention_bwd.h"
#include "attention_sections.cuh"

namespace {

/* The row kernels' blocks (pre, dq, dsinks, order_clear): one warp per row or a strided loop, so
 * any size serves. */
constexpr int ROW_WARPS = 4;
constexpr int ROW_THREADS = 32 * ROW_WARPS;

/* ---- the dQ accumulator's layout ----
 * Every key tile that a query row sees adds its share of that row's dQ, so the main kernel's f32
 * reductions into the accumulator are the bulk of its memory traffic, and what one warp
 * instruction of them costs grows with the 128-byte lines it touches. A warp's dQ product is
 * made of m16 x n8 accumulator fragments (core/sm80.cuh): lane l = 4 g + t holds rows g and
 * g + 8, columns 2t and 2t + 1. Stored row-major, each of the warp's reductions covers 8 rows of
 * 8 (one pair per lane) or 4 (scalar) floats: 8 lines. So the accumulator is stored in the
 * fragments' order instead (FlashAttention-2 permutes its dQ accumulator to the same end):
 *   - each (batch, query head) has seqlen_q rows padded up to a multiple of 16, a whole number
 *     of 16-row slabs (ATTN_BWD_SLAB; pad rows only ever receive zeros, dS being 0 there, and are
 *     never read);
 *   - a slab is D / 8 blocks of 16 rows x 8 columns (128 floats, 512 bytes), in column order;
 *   - element (row 8 hh + g, column 2 t + c) of a block, register e = 2 hh + c of lane 4 g + t,
 *     is float 4 (4 g + t) + e of the block on sm_90 and newer, so that each lane adds its
 *     fragment with one red.global.add.v4.f32 and the warp's instruction covers 512 contiguous
 *     bytes, 4 lines, each wholly; before sm_90, which has no vector f32 reduction in PTX, it is
 *     float 32 e + 4 g + t, so that each of the four scalar reductions of a fragment covers 128
 *     contiguous bytes, 1 line.
 * Float (padded row r, column c) of a head is thus at 16 D (r / 16) + 128 (c / 8) + slot: a
 * fragment whose first row is a multiple of 16 and first column a multiple of 8 (every dQ block
 * of attn_bwd_shape) is one whole block. The accumulator starts at a 128-byte boundary
 * (attn_bwd_acc_start), so a block is 4 whole lines. The slot depends on __CUDA_ARCH__: each
 * translation unit with a main kernel (attention_bwd.cu, attention_bwd_sm90.cu) launches its own
 * attn_bwd_dq from this header, so the writer and the reader of a call run from the same device
 * image and agree. */
constexpr int ATTN_BWD_SLAB = 16;       /* rows per slab: an m16 fragment's */
constexpr int ATTN_BWD_BLOCK = 16 * 8;  /* floats per block: an m16 x n8 fragment's */
constexpr int ATTN_BWD_ACC_ALIGN = 128; /* bytes: an L2 line */

/* Rows of one (batch, query head) in the accumulator: seqlen_q padded to whole slabs. */
__host__ __device__ __forceinline__ int64_t attn_bwd_acc_rows(int seqlen_q) {
    return ((int64_t)seqlen_q + ATTN_BWD_SLAB - 1) / ATTN_BWD_SLAB * ATTN_BWD_SLAB;
}

/* Lane `lane`'s fragment (x0..x3 = registers 0..3) added to the block at `block`. */
__device__ __forceinline__ void attn_bwd_acc_add(float *block, int lane, float x0, float x1,
                                                 float x2, float x3) {
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4 *>(block) + lane, make_float4(x0, x1, x2, x3));
#else
    atomicAdd(block + lane, x0);
    atomicAdd(block + 32 + lane, x1);
    atomicAdd(block + 64 + lane, x2);
    atomicAdd(block + 96 + lane, x3);
#endif
}

/* Lane `lane`'s fragment (registers 0..3) read back from the block at `block`: one warp
 * instruction reads 512 contiguous bytes (sm_90 and newer) or four read 128 each. */
__device__ __forceinline__ float4 attn_bwd_acc_load(const float *block, int lane) {
#if __CUDA_ARCH__ >= 900
    return reinterpret_cast<const float4 *>(block)[lane];
#else
    return make_float4(block[lane], block[32 + lane], block[64 + lane], block[96 + lane]);
#endif
}

struct attn_bwd_params {
    const void *q, *k, *v, *o, *dout;
    void *dq, *dk, *dv;
    const float *lse, *alibi_slopes;
    float *dsum;   /* D, [batch, heads_q, seqlen_q] */
    float *dq_acc; /* [batch, heads_q, attn_bwd_acc_rows(seqlen_q), head_dim] in slabs, above */
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
    int64_t do_sb, do_ss, do_sh, dq_sb, dq_ss, dq_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, group;
    int window_left, window_right;
    const float *sinks;
    int chunk, prefix;
    const int *doc_ids;
    float *dsinks; /* [heads_q], with sinks */
    int transform;
    float scale, softcap, softcap_in, exp_scale;
    int section; /* (batch, key/value head) pairs per section of the grid order (attn_bwd_keys_of) */
};

/* Row r = (b * heads_q + h) * seqlen_q + i of the accumulator and of D. */
__device__ __forceinline__ void attn_bwd_row(const attn_bwd_params &p, int64_t r, int64_t *b,
                                             int64_t *h, int64_t *i) {
    *i = r % p.seqlen_q;
    r /= p.seqlen_q;
    *h = r % p.heads_q;
    *b = r / p.heads_q;
}

/* One warp per row: D_i = dO_i . O_i in f32. And the whole dQ accumulator zeroed, pad rows
 * included, by 16-byte stores strided over the grid: in its slab layout a row's floats are
 * scattered, so the zeroing does not follow the rows. */
template <typename T, int D>
__global__ void __launch_bounds__(ROW_THREADS) attn_bwd_pre(const attn_bwd_params p, int64_t rows) {
    const int64_t acc_vectors = (int64_t)p.batch * p.heads_q * attn_bwd_acc_rows(p.seqlen_q) * (D / 4);
    for (int64_t x = (int64_t)blockIdx.x * ROW_THREADS + threadIdx.x; x < acc_vectors;
         x += (int64_t)gridDim.x * ROW_THREADS)
        reinterpret_cast<float4 *>(p.dq_acc)[x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * ROW_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    int64_t b, h, i;
    attn_bwd_row(p, r, &b, &h, &i);
    const T *o = static_cast<const T *>(p.o) + b * p.o_sb + i * p.o_ss + h * p.o_sh;
    const T *d = static_cast<const T *>(p.dout) + b * p.do_sb + i * p.do_ss + h * p.do_sh;
    float sum = 0.0f;
#pragma unroll
    for (int e = lane; e < D; e += 32)
        sum += tk_to_float(o[e]) * tk_to_float(d[e]);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (lane == 0)
        p.dsum[r] = sum;
}

/* dsinks_h = -sum over (b, i) of exp(sink_h - lse_bhi) D_bhi: CTA h, each thread a strided
 * share of the rows, then a fixed tree over the threads, so the sum is the same every run. */
__global__ void __launch_bounds__(ROW_THREADS) attn_bwd_dsinks(const attn_bwd_params p) {
    __shared__ float part[ROW_WARPS];
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float sink = p.sinks[h];
    const int64_t rows = (int64_t)p.batch * p.seqlen_q;
    float sum = 0.0f;
    for (int64_t x = threadIdx.x; x < rows; x += ROW_THREADS) {
        const int64_t r = (x / p.seqlen_q * p.heads_q + h) * p.seqlen_q + x % p.seqlen_q;
        sum += expf(sink - p.lse[r]) * p.dsum[r];
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (lane == 0)
        part[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < ROW_WARPS; w++)
            total += part[w];
        p.dsinks[h] = -total;
    }
}

/* dQ = the accumulator in the dtype, un-permuted: one warp per 16-row slab, whose lanes read
 * their fragment of each block (the warp's reads contiguous, as the adds were) and write its
 * two columns of rows g and g + 8 as one 4-byte pair each (dq's rows are 16-byte aligned, which
 * the host checks); rows past seqlen_q are pad and stay unwritten. */
template <typename T, int D>
__global__ void __launch_bounds__(ROW_THREADS) attn_bwd_dq(const attn_bwd_params p, int64_t slabs) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int64_t s = (int64_t)blockIdx.x * ROW_WARPS + (threadIdx.x >> 5);
    if (s >= slabs)
        return;
    const int64_t head_slabs = attn_bwd_acc_rows(p.seqlen_q) / ATTN_BWD_SLAB;
    const int64_t bh = s / head_slabs, b = bh / p.heads_q, h = bh % p.heads_q;
    const int i = (int)(s % head_slabs) * ATTN_BWD_SLAB + g;
    const float *block = p.dq_acc + s * ATTN_BWD_SLAB * D;
    T *dq = static_cast<T *>(p.dq) + b * p.dq_sb + h * p.dq_sh + i * p.dq_ss + 2 * tq;
    const bool low = i < p.seqlen_q, high = i + 8 < p.seqlen_q;
#pragma unroll
    for (int c = 0; c < D / 8; c++) {
        const float4 v = attn_bwd_acc_load(block + c * ATTN_BWD_BLOCK, lane);
        if (low)
            *reinterpret_cast<uint32_t *>(dq + 8 * c) = tk_pack2<T>(v.x, v.y);
        if (high)
            *reinterpret_cast<uint32_t *>(dq + 8 * p.dq_ss + 8 * c) = tk_pack2<T>(v.z, v.w);
    }
}

/* ---- attn_bwd_order: the deterministic kernel's order of the dQ adds ----
 * A query tile's dQ (batch, query head, BM rows) is the sum of one product per key tile that
 * visits it. f32 addition is not associative, so the deterministic kernel makes the same atomic
 * adds in key-tile order: each query tile has a semaphore in the workspace, zeroed before the
 * launch, and key tile n waits until it reads n (tile n - 1 has added), adds, and publishes
 * n + 1. Every mask gives each key a range of rows whose ends are non-decreasing in the key
 * (attention_softmax.cuh), so the key tiles that visit a query tile are consecutive, and tile n
 * has a predecessor at query tile m exactly when tile n - 1's last row, that of key n0 - 1,
 * reaches m's first row; the first tile of each chain does not wait. Only the visits form the
 * chain: a tile that the mask keeps away from a query tile neither waits for nor holds it.
 *
 * No deadlock: a CTA takes its (key tile, batch, key/value head) from a ticket, a counter that
 * each CTA bumps as it starts, decoded as the block order is (attn_bwd_keys_of: a pair's key
 * tile n - 1 before its tile n in every section size), so it only ever waits for a CTA with an
 * earlier ticket, which is resident or done; a chain of waits descends in tickets and ends at a
 * CTA that computes. Each CTA walks its query tiles from the last down, the
 * group's heads fastest: tile n - 1's query tiles end no later than n's, so it reaches each tile
 * they share no later in its walk than n does, and the waits mostly find the semaphore set. */
constexpr int ORDER_HEADER = 4; /* ints before the semaphores: the ticket counter, 16 bytes */
constexpr int ORDER_ROWS = 32;  /* query rows per semaphore in the workspace: the smallest BM
                                  * (each main kernel asserts that its BM is a multiple) */

/* The deterministic kernel's words, after the dQ accumulator: the ticket counter, then from
 * ORDER_HEADER on the semaphores. */
template <int D>
__host__ __device__ __forceinline__ int *attn_bwd_order_words(const attn_bwd_params &p) {
    return reinterpret_cast<int *>(p.dq_acc + (int64_t)p.batch * p.heads_q * attn_bwd_acc_rows(p.seqlen_q) * D);
}

/* The shared memory that a main kernel holds besides its dynamic part: the deterministic
 * kernel's ticket (below), which the dynamic part's 128-byte alignment rounds up to 128 bytes
 * (ptxas -v). */
constexpr int ATTN_BWD_STATIC_SMEM = 128;

/* The CTA's ticket: its place in the order in which the CTAs started. */
__device__ __forceinline__ unsigned attn_bwd_ticket(int *counter) {
    __shared__ unsigned ticket;
    if (threadIdx.x == 0)
        ticket = atomicAdd(reinterpret_cast<unsigned *>(counter), 1u);
    __syncthreads();
    return ticket;
}

/* A main kernel's key tile: block blockIdx.x (deterministic: the CTA's ticket, which must be
 * taken by every thread) as (key tile of BN keys, batch, key/value head), and the mask its keys
 * are seen through. The (batch, key/value head) pairs run in sections of p.section
 * (attention_sections.cuh): within a section the key tiles slowest (under causal the longest
 * CTAs, the first keys, first) and the section's pairs fastest. The launcher picks the size
 * (attn_bwd_section): for the atomic kernels without a mask one pair a section (Hopper: key
 * tiles fastest, a wave holds every key tile of a few pairs, which walk the same query tiles
 * together, so that each Q / dO tile and dQ accumulator line serves all of them while in L2) or
 * one section of every pair (portable: the heads fastest); for every other call sections whose
 * Q, dO and dQ accumulator fit half the L2, or where none that holds a wave does, sections of
 * one to two waves (the portable kernels under a mask: one section). The deterministic
 * order holds for every size: key tile n - 1 of a pair is in n's section and comes before it
 * there (the key tiles slowest), and a section comes before the next, so n - 1 has the earlier
 * ticket and n never waits on a CTA that has not started. */
struct attn_bwd_keys {
    int head_kv, n0, k_rows; /* first key, keys in the tile */
    int64_t batch;
    attn_mask mask;
};

template <int D, int BN, bool DET>
__device__ __forceinline__ attn_bwd_keys attn_bwd_keys_of(const attn_bwd_params &p) {
    unsigned block = blockIdx.x;
    if constexpr (DET)
        block = attn_bwd_ticket(attn_bwd_order_words<D>(p));
    const attn_section_item item = attn_section_walk(block, (unsigned)p.batch * (unsigned)p.heads_kv,
                                                     (unsigned)p.section, (unsigned)((p.seqlen_k + BN - 1) / BN));
    attn_bwd_keys t;
    t.head_kv = (int)(item.unit % (unsigned)p.heads_kv);
    t.batch = item.unit / (unsigned)p.heads_kv;
    t.n0 = (int)item.place * BN;
    t.k_rows = min(BN, p.seqlen_k - t.n0);
    t.mask = {p.seqlen_k - p.seqlen_q, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right, p.chunk, p.prefix,
              p.doc_ids ? p.doc_ids + t.batch * p.seqlen_k : nullptr};
    return t;
}

/* From the table of the key tile's rows (attn_fill_table with keys = true, k_rows entries): the
 * first query tile of BM rows that sees a key of the tile (x) and how many tiles do (y, 0 for
 * none). The first and last keys bound the rows, the rows' ends being non-decreasing in the key. */
template <int BM> __device__ __forceinline__ int2 attn_bwd_query_tiles(const int2 *table, int k_rows) {
    const int row_lo = table[0].x, row_hi = table[k_rows - 1].y;
    const int m_begin = row_lo / BM;
    return make_int2(m_begin, row_hi >= row_lo ? row_hi / BM + 1 - m_begin : 0);
}

/* A main kernel's walk over the (query head, query tile of BM rows) pairs that see its keys: the
 * group's heads from head0, tiles m_begin .. m_begin + m_tiles - 1; tiles fastest, from the
 * first; deterministic: heads fastest, tiles from the last down (above: the order of the dQ adds
 * relies on it). Two ways along it, one order: at(it), step `it` from its index (a division and
 * a remainder by the tile count or the group), and next(), from a step to the one after by a
 * compare and an add. The portable kernels carry the step from one to the next with next(), so
 * that no division runs between a step's top barrier and its first MMA; the Hopper kernel takes
 * at(it) in each of its roles, where a carried step made ptxas spill its consumers (the
 * deterministic kernel at head dim 128). */
template <int BM, bool DET> struct attn_bwd_walk {
    int h, m0;      /* the step's query head and first query row */
    int first, end; /* for next(): the heads first .. end - 1 (deterministic); else the rows of the
                     * first tile and past the last */

    static __host__ __device__ __forceinline__ attn_bwd_walk at(int it, int head0, int group, int m_begin,
                                                                int m_tiles) {
        if constexpr (DET)
            return {head0 + it % group, (m_begin + m_tiles - 1 - it / group) * BM, head0, head0 + group};
        else
            return {head0 + it / m_tiles, (m_begin + it % m_tiles) * BM, m_begin * BM, (m_begin + m_tiles) * BM};
    }
    __host__ __device__ __forceinline__ void next() {
        if constexpr (DET) {
            if (++h == end) {
                h = first;
                m0 -= BM;
            }
        } else {
            m0 += BM;
            if (m0 == end) {
                m0 = first;
                h++;
            }
        }
    }
};

/* The semaphore of query tile (batch, head h, rows m0 .. m0 + BM - 1) in the deterministic order. */
template <int D, int BM>
__device__ __forceinline__ cuda::atomic_ref<int, cuda::thread_scope_device>
attn_bwd_semaphore(const attn_bwd_params &p, int64_t batch, int h, int m0) {
    static_assert(BM % ORDER_ROWS == 0, "a query tile needs its own semaphore");
    const int64_t tile = (batch * p.heads_q + h) * ((p.seqlen_q + BM - 1) / BM) + m0 / BM;
    return cuda::atomic_ref<int, cuda::thread_scope_device>(*(attn_bwd_order_words<D>(p) + ORDER_HEADER + tile));
}

/* Waits until key tile n - 1 has published its dQ adds to the query tile of `sem` (its count has
 * reached n): the deterministic order's one wait, made by one lane. */
__device__ __forceinline__ void attn_bwd_wait_turn(cuda::atomic_ref<int, cuda::thread_scope_device> sem, int n) {
    while (sem.load(cuda::memory_order_acquire) < n)
        __nanosleep(64);
}

/* The last query row that sees key j, negative for none (attn_key_rows); every lane of the
 * calling warp calls it. */
__device__ __forceinline__ int attn_bwd_last_row(const attn_mask &m, int j) {
    attn_docs d;
    if (m.doc_ids)
        d = attn_doc_band(m, j, j);
    return attn_key_rows(m, d, j).y;
}

/* The ticket counter and the semaphores zeroed. */
__global__ void __launch_bounds__(ROW_THREADS) attn_bwd_order_clear(int *order, int64_t words) {
    for (int64_t w = (int64_t)blockIdx.x * ROW_THREADS + threadIdx.x; w < words;
         w += (int64_t)gridDim.x * ROW_THREADS)
        order[w] = 0;
}

/* Words of the deterministic kernel's workspace (attn_bwd_order): the ticket counter, one
 * semaphore per (batch, query head, ORDER_ROWS query rows), rounded up to 16 bytes. */
size_t attn_bwd_order_count(const tk_attention_call *c) {
    const size_t tiles = (size_t)c->batch * (size_t)c->heads_q *
                         (size_t)((c->seqlen_q + ORDER_ROWS - 1) / ORDER_ROWS);
    return (ORDER_HEADER + tiles + 3) / 4 * 4;
}

/* The dQ accumulator in the workspace: the first 128-byte boundary after D ([rows] f32, rounded
 * up to 16 bytes). The workspace is promised 16-byte alignment only; its size reserves the gap
 * (tk_attention_bwd_workspace_bytes). */
float *attn_bwd_acc_start(float *workspace, int64_t rows) {
    const uintptr_t after_d = reinterpret_cast<uintptr_t>(workspace + (rows + 3) / 4 * 4);
    return reinterpret_cast<float *>((after_d + ATTN_BWD_ACC_ALIGN - 1) &
                                     ~(uintptr_t)(ATTN_BWD_ACC_ALIGN - 1));
}

/* What attn_bwd_probs forms beside P in s: nothing (softcap must be off: a kernel that forms P
 * while dP^T is still being computed forms dS itself, dS = P (dP - D)); with softcap, its
 * derivative 1 - tanh^2 in dp, which must not hold dP^T yet (a kernel that forms P before it
 * computes dP^T); or dS in place of dP^T. */
enum attn_bwd_form { ATTN_BWD_P, ATTN_BWD_P_DERIV, ATTN_BWD_P_DS };

/* P_ij = exp(score_ij - lse_i), invisible pairs 0, and with ATTN_BWD_P_DS dS_ij = P_ij (dP_ij -
 * D_i) times softcap's derivative 1 - tanh^2 (its scale factor is applied to dK and dQ at the
 * end), on a warp's fragments s of S^T and dp of dP^T in the tensor cores' accumulator layout
 * (that of mma.sync m16n8 and of each warp's 16 rows of wgmma m64nN), keys by rows and queries by
 * columns: element [nt][e] pairs key key0 + 8 (e >> 1) with query column qc = qc0 + 8 nt +
 * (e & 1) of the tile of rows m0.., whose lse * log2(e) and D are lse2[qc] and dsum[qc]. On a
 * tile that may hold invisible pairs (partial), a pair is visible when the query row lies in
 * rows[e >> 1], the rows of that key (attn_key_rows). FORM says what dp receives
 * (attn_bwd_form).
 * Without a transform (no softcap, no ALiBi: the common call) each element is one FFMA and one
 * exponential, and the mask a pass of its own on partial tiles only: both conditions are
 * uniform over the warp, and tested per element (as the transform's fused loop does) they cost
 * a branch and the mask's compares and selects on every element of every tile. */
template <attn_bwd_form FORM, int NT>
__device__ __forceinline__ void attn_bwd_probs(const attn_bwd_params &p, float (&s)[NT][4], float (&dp)[NT][4],
                                               int m0, int qc0, int key0, const int2 (&rows)[2], bool partial,
                                               float slope, const float *lse2, const float *dsum) {
    const int shift = p.seqlen_k - p.seqlen_q;
    if (p.transform) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = qc0 + 8 * nt + (e & 1);
                const int i = m0 + qc, j = key0 + 8 * (e >> 1);
                float x = s[nt][e], dfac = 1.0f;
                if (FORM != ATTN_BWD_P && p.softcap > 0.0f) {
                    const float t = tanhf(x * p.softcap_in);
                    x = p.softcap * t;
                    dfac = 1.0f - t * t;
                } else {
                    x *= p.scale;
                }
                if (p.alibi_slopes)
                    x -= slope * (float)abs(i + shift - j);
                float pe = tk_exp2_approx(fmaf(x, p.exp_scale, -lse2[qc]));
                if (partial && (i < rows[e >> 1].x || i > rows[e >> 1].y))
                    pe = 0.0f;
                s[nt][e] = pe;
                if constexpr (FORM == ATTN_BWD_P_DS)
                    dp[nt][e] = pe * (dp[nt][e] - dsum[qc]) * dfac;
                else if constexpr (FORM == ATTN_BWD_P_DERIV)
                    dp[nt][e] = dfac;
            }
        return;
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s[nt][e] = tk_exp2_approx(fmaf(s[nt][e], p.exp_scale, -lse2[qc0 + 8 * nt + (e & 1)]));
    if (partial)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = m0 + qc0 + 8 * nt + (e & 1);
                if (i < rows[e >> 1].x || i > rows[e >> 1].y)
                    s[nt][e] = 0.0f;
            }
    if constexpr (FORM == ATTN_BWD_P_DS) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dp[nt][e] = s[nt][e] * (dp[nt][e] - dsum[qc0 + 8 * nt + (e & 1)]);
    }
}

/* dK (times the score scale) and dV from one thread's accumulators, whose rows are keys key0 and
 * key0 + 8 and columns col0 + 8 c + 2 (lane % 4) (+ 1), c < NC (the accumulator layout of
 * mma.sync and of a warp's 16 rows of wgmma), as 4-byte pairs; keys past seqlen_k are not stored. */
template <typename T, int NC>
__device__ __forceinline__ void attn_bwd_store_dk_dv(const attn_bwd_params &p, int64_t batch, int head_kv, int key0,
                                                     int col0, const float (&dk)[NC][4], const float (&dv)[NC][4]) {
    T *dkg = static_cast<T *>(p.dk) + batch * p.dk_sb + head_kv * p.dk_sh;
    T *dvg = static_cast<T *>(p.dv) + batch * p.dv_sb + head_kv * p.dv_sh;
    const int tq = threadIdx.x % 4;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int j = key0 + 8 * hh;
        if (j < p.seqlen_k)
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int col = col0 + 8 * c + 2 * tq;
                *reinterpret_cast<uint32_t *>(dkg + j * p.dk_ss + col) =
                    tk_pack2<T>(dk[c][2 * hh] * p.scale, dk[c][2 * hh + 1] * p.scale);
                *reinterpret_cast<uint32_t *>(dvg + j * p.dv_ss + col) = tk_pack2<T>(dv[c][2 * hh], dv[c][2 * hh + 1]);
            }
    }
}

/* The main kernels, whose grid orders attn_bwd_section picks. */
enum attn_bwd_main_kind { BWD_SM90_ATOMIC, BWD_SM90_DETERMINISTIC, BWD_PORTABLE_ATOMIC, BWD_PORTABLE_DETERMINISTIC };

/* The grid's sections (attn_bwd_keys_of), in (batch, key/value head) pairs, for main kernel
 * `kind` running call c on dev with BN keys per CTA (docs/kernels/attention_bwd.md, "Grid order").
 * - L2-sized sections: what the CTAs of a pair share is its Q and dO (16-bit) and dQ accumulator
 *   (f32): group x seqlen_q x D x 8 bytes. A section holds at most as many pairs as half the L2
 *   holds of those (most), and at least a wave of CTAs (least: smaller sections take the key
 *   tiles fastest order's tail, a section's longest CTAs starting beside the previous sections'
 *   last ones); of the sizes between, attn_section_size's.
 * - Sections of waves, where no L2-sized section holds a wave (most < least): one to two waves of
 *   CTAs (the fullest last section of the sizes least .. 2 least; 8 pairs at head dim 128 B4 Hkv8
 *   S4096, 16 MiB a pair, where one section of the 32 spreads each pair's key tiles over ~8
 *   waves). The fewer waves a pair's key tiles are spread over, the more of its CTAs share each
 *   of its Q / dO tiles and accumulator lines while that is in L2.
 * Each kernel's choice:
 * - The atomic kernels without a mask, where every CTA has the same steps and the order leaves
 *   the tail as it is: the Hopper kernel one pair a section (the key tiles fastest: a wave that
 *   holds every key tile of a few pairs reads each of their Q / dO tiles, and adds into each of
 *   their dQ accumulator lines, while it is in L2, FlashAttention-2's and -4's grids), the
 *   portable kernels one section of every pair (the key tiles fastest left them as they were).
 * - Every other call: L2-sized sections, else sections of waves, but for the portable kernels
 *   under a mask, whose deterministic rows sections of waves cost 1-3 %: one section of every
 *   pair, the heads fastest over the grid. Under a mask a pair's CTAs differ in length (under
 *   causal key tile n walks the query tiles from n on), and the key tiles slowest within a
 *   section start the longest first. The deterministic kernels' walk keeps a pair's key tiles on
 *   the same query tiles at the same time (each turn waits on the one before), so with or without
 *   a mask its traffic grows with the waves a pair's key tiles are spread over. */
template <int D, int BN>
int attn_bwd_section(const tk_attention_call *c, const tk_device *dev, attn_bwd_main_kind kind) {
    const int64_t pairs = (int64_t)c->batch * c->heads_kv;
    const bool masked = c->window_left >= 0 || c->window_right >= 0 || c->chunk > 0 || c->prefix > 0 || c->doc_ids;
    const bool portable = kind == BWD_PORTABLE_ATOMIC || kind == BWD_PORTABLE_DETERMINISTIC;
    if (!masked && kind == BWD_SM90_ATOMIC)
        return 1;
    if (!masked && kind == BWD_PORTABLE_ATOMIC)
        return (int)pairs;
    const int64_t key_tiles = (c->seqlen_k + BN - 1) / BN;
    const int64_t pair_bytes = (int64_t)8 * (c->heads_q / c->heads_kv) * c->seqlen_q * D;
    const int64_t least = (dev->sm_count + key_tiles - 1) / key_tiles, budget = dev->l2_bytes / 2;
    const int64_t section = attn_section_size(pairs, pair_bytes, budget, least);
    if (section * pair_bytes <= budget || (masked && portable))
        return (int)section; /* attn_section_size gives one section where none holds a wave */
    return (int)attn_section_size(pairs, 1, 2 * least, least);
}

/* One backward call around its main kernel: the parameters from the call (the grid order in
 * sections of `section` (batch, key/value head) pairs, attn_bwd_keys_of), then attn_bwd_pre (D
 * and the zeroed accumulator), attn_bwd_dsinks (with sinks), attn_bwd_order_clear (DET), the
 * main kernel by launch_main(p), and attn_bwd_dq. */
template <typename T, int D, bool DET, typename LaunchMain>
cudaError_t attn_bwd_run(const tk_attention_bwd_call *bc, int section, cudaStream_t stream, LaunchMain launch_main) {
    const tk_attention_call *c = &bc->fwd;
    attn_bwd_params p;
    attn_set_tensors(p, c); /* the forward's q, k, v, o, lse, slopes and strides */
    p.dout = bc->dout;
    p.dq = bc->dq, p.dk = bc->dk, p.dv = bc->dv;
    const int64_t rows = (int64_t)c->batch * c->heads_q * c->seqlen_q;
    p.dsum = bc->workspace;
    p.dq_acc = attn_bwd_acc_start(bc->workspace, rows);
    p.do_sb = bc->do_stride[0], p.do_ss = bc->do_stride[1], p.do_sh = bc->do_stride[2];
    p.dq_sb = bc->dq_stride[0], p.dq_ss = bc->dq_stride[1], p.dq_sh = bc->dq_stride[2];
    p.dk_sb = bc->dk_stride[0], p.dk_ss = bc->dk_stride[1], p.dk_sh = bc->dk_stride[2];
    p.dv_sb = bc->dv_stride[0], p.dv_ss = bc->dv_stride[1], p.dv_sh = bc->dv_stride[2];
    p.batch = c->batch;
    p.seqlen_q = c->seqlen_q;
    p.seqlen_k = c->seqlen_k;
    p.heads_q = c->heads_q;
    p.heads_kv = c->heads_kv;
    p.group = c->heads_q / c->heads_kv;
    attn_set_mask(p, c);
    p.dsinks = bc->dsinks;
    attn_set_score(p, c->scale, c->softcap, c->alibi_slopes != NULL);
    p.section = section;
    const unsigned row_blocks = (unsigned)((rows + ROW_WARPS - 1) / ROW_WARPS);
    cudaError_t err = tk_launch(attn_bwd_pre<T, D>, row_blocks, ROW_THREADS, 0, stream, p, rows);
    if (err == cudaSuccess && c->sinks)
        err = tk_launch(attn_bwd_dsinks, (unsigned)c->heads_q, ROW_THREADS, 0, stream, p);
    if (err == cudaSuccess && DET) {
        const int64_t words = (int64_t)attn_bwd_order_count(c);
        const int64_t clear_blocks = (words + ROW_THREADS - 1) / ROW_THREADS;
        err = tk_launch(attn_bwd_order_clear, (unsigned)(clear_blocks < 1024 ? clear_blocks : 1024),
                        ROW_THREADS, 0, stream, attn_bwd_order_words<D>(p), words);
    }
    if (err == cudaSuccess)
        err = launch_main(p);
    if (err != cudaSuccess)
        return err;
    const int64_t slabs = (int64_t)c->batch * c->heads_q * attn_bwd_acc_rows(c->seqlen_q) / ATTN_BWD_SLAB;
    return tk_launch(attn_bwd_dq<T, D>, (unsigned)((slabs + ROW_WARPS - 1) / ROW_WARPS), ROW_THREADS,
                     0, stream, p, slabs);
}

} // namespace

#endif
