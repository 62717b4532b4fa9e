/* Attention backward on the tensor cores of sm_80 and newer (FlashAttention-2 style); the math,
 * launch shape, tiles and register budget are in docs/kernels/attention_bwd.md. Three kernels:
 *   attn_bwd_pre:  D_i = rowsum(dO_i o O_i) (f32) and the f32 dQ accumulator zeroed;
 *   attn_bwd_main: one CTA per (key tile, batch, key/value head): K and V of BN keys stay in
 *                  shared memory while Q, dO tiles of BM rows of every query head of the GQA
 *                  group stream through a two-stage cp.async ring; dK, dV in registers, dQ by
 *                  f32 atomics into the accumulator, stored in the order of the mma fragments
 *                  (its layout below; deterministic: the same atomics, each query tile's in
 *                  key-tile order, attn_bwd_order below); BN = 128 keys and
 *                  8 warps ("mma_sm80_bn128"), or 64 keys and 4 warps where a device's shared
 *                  memory per block cannot hold the former ("mma_sm80"; attn_bwd_shape); at
 *                  head dim 256 64 keys and 8 warps, two per key ("mma_sm80_d256");
 *   attn_bwd_dq:   the accumulator back in row order, converted to the dtype with dq's strides;
 *   attn_bwd_dsinks (with sinks): dsinks_h = -sum_i exp(sink_h - lse_i) D_i, one CTA per head,
 *                  summed in a fixed order;
 *   attn_bwd_order_clear (deterministic): the ticket counter and semaphores zeroed.
 * The mask is attention_softmax.cuh's, seen from the keys: a CTA's table holds, per key, the
 * query rows that see it (attn_key_rows), which bounds the query tiles it visits and masks the
 * tiles that are not fully visible.
 * Tiles use rows padded by 16 bytes (every ldmatrix phase, plain or transposed, then hits 8
 * different 16-byte bank groups) and the forward's tile loader (attention.cuh). */
#include "attention_bwd.cuh"

namespace {

/* The warps an SM runs: the 64K registers hold 256 threads at up to 255 registers each (the main
 * kernel needs over 220), as one CTA of 8 warps or two of 4. */
constexpr int BWD_SM_WARPS = 8;
/* Warps per CTA of the main kernel: BWD_WARPS, 128 keys ("mma_sm80_bn128", FlashAttention-2's
 * tile), where each streamed Q / dO tile and each dQ reduction serves twice the keys it serves
 * with BWD_WARPS_SMALL, 64 keys ("mma_sm80"), which runs where a device's shared memory per block
 * cannot hold the 8-warp tiles (D 128 on sm_86 and sm_89). */
constexpr int BWD_WARPS = 8;
constexpr int BWD_WARPS_SMALL = 4;

/* The shared memory per block of code compiled for `arch` (__CUDA_ARCH__ / 10 of its pass) where
 * it holds fewer than some main kernels' tiles: 99 KB on sm_86 and sm_89 (sm_80 and sm_90 hold
 * every shape here). A main kernel whose tiles exceed it compiles to a trap there, so that ptxas
 * neither builds nor allocates registers for code that cannot run (the 8-warp kernel at D 128
 * spilled 20-28 bytes on sm_86 and sm_89 when built there), and attn_bwd_fits, which asks which
 * pass runs on the device, never launches it: an sm_87 device (163 KB) runs the sm_86 pass. */
constexpr int attn_bwd_arch_smem(int arch) { return arch == 86 || arch == 89 ? 99 * 1024 : 1 << 30; }
#ifdef __CUDA_ARCH__
constexpr int BWD_ARCH_SMEM = attn_bwd_arch_smem(__CUDA_ARCH__ / 10);
#else
constexpr int BWD_ARCH_SMEM = attn_bwd_arch_smem(0); /* the host pass compiles no kernel body */
#endif

/* Per head dim and warps: BM query rows per streamed tile; KEY_ROWS, the keys of a warp's block
 * (16 or 32: one or two m16 tiles); COL_WARPS, the warps that share a block of keys; SPLIT,
 * whether a warp computes S^T, P and dV before dP^T rather than S^T and dP^T in one k-loop (the
 * step's two orders are in attn_bwd_main).
 * A block's warps split its dK and dV by columns (D / COL_WARPS each) and its S^T and dP^T by
 * queries (BM / COL_WARPS each), so a thread holds 2 x KEY_ROWS D / (32 COL_WARPS) accumulators
 * of dK, dV and KEY_ROWS BM / (32 COL_WARPS) each of S^T and dP^T (only one of them at a time
 * when SPLIT), in kernels that use 200 to 255 of their 255 registers.
 * Per k16 step a warp's S^T loads KEY_ROWS / 16 A fragments (K rows) and BM / (16 COL_WARPS)
 * B fragments (Q rows, ldmatrix.x4 each) for their product of MMAs, so the squarer the block the
 * fewer loads per MMA: 16 keys x 64 queries load 1 + 4 per 8 MMAs, 32 x 32 (FlashAttention-2's
 * warp tile at D 128) 2 + 2. D 128 with 8 warps takes 32 keys x 32 queries, two warps per block
 * (BN 128, BM 64), and their dV and dK 32 keys x 64 columns, A (P^T, dS^T over all 64 queries)
 * from the tile where both warps store their halves: 144 ldmatrix.x4 per warp and step, as
 * FlashAttention-2's partition, where 16 keys x 64 queries with A from the accumulators took 176
 * (S^T and dP^T 80 -> 64, dV and dK 64 -> 48, dQ 32). That needs SPLIT: 128 + 32 at the peak
 * builds without spills, with P waiting for dP^T in shared memory, where 128 + 64 spilled. BM
 * stays 32 with 4 warps, whose 64-key tiles are for devices with 99 KB of shared memory per block
 * (BM 64: 112.5 KB). Where the registers allow the fused k-loop it is kept: it is the faster
 * order there (the card's BM section). At D 256 one warp per 16 keys would need 256
 * registers for dK and dV alone, so two warps share each 16: 128 + 2 x 8 (BM 64 there would need
 * 217.5 KB of shared memory, sm_90 only). D 80 takes BM = 64 (80 + 64): with 32 rows its dQ
 * (32 x 80: two m16 by ten n8) has no even split over 8 warps (attn_bwd_dq_col_warps). D 96 takes
 * BM = 32 with 4 warps (96 + 32: the fused order at 64 spilled) and with 8 warps D 128's split
 * plan (BM 64, 48 columns a warp): a step then covers 64 query rows, so the deterministic kernel
 * waits for its turn and fences half as often per unit of work. */
template <int D, int WARPS> struct attn_bwd_tile {
    static constexpr int BM = D <= 80 ? 64 : 32, KEY_ROWS = 16, COL_WARPS = D == 256 ? 2 : 1;
    static constexpr bool SPLIT = false;
};
template <> struct attn_bwd_tile<128, BWD_WARPS> {
    static constexpr int BM = 64, KEY_ROWS = 32, COL_WARPS = 2;
    static constexpr bool SPLIT = true;
};
template <> struct attn_bwd_tile<96, BWD_WARPS> : attn_bwd_tile<128, BWD_WARPS> {};

/* The column blocks of dQ (BM x D) over `warps` warps, the remaining warps splitting the rows:
 * of the splits in which the warps, D's n8 tiles and BM's m16 rows all divide evenly (down to 16
 * columns a block), the one that loads the fewest 8x8 matrices per k16 step, 4 per m16 row block
 * of dS and 2 per n8 tile of K, ties to more column blocks. At BM 64, D 128, 8 warps that is 2 x 4
 * blocks of 32 x 32 (2 A and 2 B ldmatrix.x4 per 8 MMAs), where as many column blocks as warps
 * (1 x 8 of 64 x 16) would load 4 A and 1 B per 8. */
constexpr int attn_bwd_dq_col_warps(int d, int warps, int bm) {
    int best = 1, best_cost = 1 << 30;
    for (int cols = warps < d / 16 ? warps : d / 16; cols >= 1; cols--)
        if (warps % cols == 0 && d / 8 % cols == 0 && bm / 16 % (warps / cols) == 0) {
            const int cost = 2 * (bm / 16 / (warps / cols)) + d / 8 / cols;
            if (cost < best_cost)
                best = cols, best_cost = cost;
        }
    return best;
}

/* The main kernel's plan for WARPS warps: BN = KEY_ROWS WARPS / COL_WARPS keys, warp w owning
 * keys KEY_ROWS (w / COL_WARPS) .. + KEY_ROWS - 1, of them queries BM / COL_WARPS (w % COL_WARPS)
 * .. + BM / COL_WARPS - 1 of S^T and dP^T and columns D / COL_WARPS (w % COL_WARPS) .. of dK and
 * dV. With COL_WARPS > 1 a block's warps trade P^T and dS^T through shared memory (dS^T is there
 * for dQ anyway), so S^T and dP^T are computed once: in the fused order P^T has a tile of its
 * own; in the split order it passes through the warp's own slots of the dS^T tile before dS^T
 * does (attn_bwd_main). dQ = dS K (BM x D over the BN keys) is split into DQ_ROW_WARPS x
 * DQ_COL_WARPS blocks of DQ_ROWS x DQ_COLS, one per warp (attn_bwd_dq_col_warps). Per k16 step a
 * warp loads DQ_ROWS / 16 A fragments (dS) and DQ_COLS / 8 B fragments (K, by transposed
 * ldmatrix: .x4 per two n8 tiles, .x2 for an odd last one) for DQ_ROWS / 16 x DQ_COLS / 8 MMAs:
 * 4 warps 32 x 32 (D 64 and 128), 32 x 40 (D 80), 32 x 24 (D 96); 8 warps 32 x 16 at D 64,
 * 16 x 40 at D 80, 32 x 24 at D 96, 32 x 32 at D 128 and 256. */
template <int D, int WARPS> struct attn_bwd_shape {
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int MIN_CTAS = BWD_SM_WARPS / WARPS;
    static constexpr int COL_WARPS = attn_bwd_tile<D, WARPS>::COL_WARPS;
    static constexpr int KEY_ROWS = attn_bwd_tile<D, WARPS>::KEY_ROWS;
    static constexpr int BN = KEY_ROWS * WARPS / COL_WARPS;
    static constexpr int BM = attn_bwd_tile<D, WARPS>::BM;
    static constexpr int DQ_COL_WARPS = attn_bwd_dq_col_warps(D, WARPS, BM);
    static constexpr int DQ_ROW_WARPS = WARPS / DQ_COL_WARPS;
    static constexpr int DQ_ROWS = BM / DQ_ROW_WARPS, DQ_COLS = D / DQ_COL_WARPS;
    static_assert(DQ_ROW_WARPS * DQ_COL_WARPS == WARPS && DQ_ROWS % 16 == 0 && DQ_COLS % 8 == 0,
                  "whole m16 rows and n8 columns of dQ per warp");
    static constexpr int ROW = 2 * D + 16;  /* bytes per padded Q, K, V, dO row */
    static constexpr int S_ROW = 2 * BM + 16; /* bytes per padded dS^T row (one key) */
    static constexpr int K_BYTES = BN * ROW;
    static constexpr int Q_BYTES = BM * ROW;
    static constexpr int STAGE_BYTES = 2 * Q_BYTES + 2 * BM * 4; /* Q, dO, lse, D */
    static constexpr int S_BYTES = BN * S_ROW;
    /* P^T, laid out as dS^T: the fused order's, with COL_WARPS > 1 */
    static constexpr int P_BYTES = COL_WARPS > 1 && !attn_bwd_tile<D, WARPS>::SPLIT ? S_BYTES : 0;
    static constexpr int TABLE_OFFSET = 2 * K_BYTES + 2 * STAGE_BYTES + S_BYTES + P_BYTES;
    static constexpr int SMEM_BYTES = TABLE_OFFSET + BN * 8; /* + each key's rows (int2) */
};

template <typename T, int D, int WARPS, bool DET>
__global__ void __launch_bounds__(32 * WARPS, attn_bwd_shape<D, WARPS>::MIN_CTAS)
    attn_bwd_main(const attn_bwd_params p) {
    using shape = attn_bwd_shape<D, WARPS>;
    constexpr int BM = shape::BM, BN = shape::BN, ROW = shape::ROW, S_ROW = shape::S_ROW;
    constexpr int THREADS = shape::THREADS, CW = shape::COL_WARPS;
    constexpr bool SPLIT = attn_bwd_tile<D, WARPS>::SPLIT;
    constexpr int KR = shape::KEY_ROWS, KM = KR / 16; /* this warp's keys, their m16 tiles */
    constexpr int QT = BM / 8 / CW;  /* n8 tiles of this warp's S^T (queries) */
    constexpr int QS = BM / 16;      /* k16 steps over queries (dV, dK) */
    constexpr int OWN_QS = QS / CW;  /* of them over this warp's own queries */
    constexpr int KSTEPS = D / 16;   /* k16 steps over the head dim (S^T, dP^T) */
    constexpr int DT = D / 8 / CW;   /* n8 tiles of this warp's dK, dV */
    constexpr int MQ = shape::DQ_ROWS / 16; /* m16 tiles of this warp's dQ block */
    constexpr int WDT = shape::DQ_COLS / 8; /* n8 tiles of this warp's dQ block */
    extern __shared__ __align__(128) unsigned char smem[];
    if constexpr (shape::SMEM_BYTES + ATTN_BWD_STATIC_SMEM > BWD_ARCH_SMEM) {
        __trap(); /* never launched where this pass runs (attn_bwd_fits): a launch is a dispatch bug */
        return;
    }

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3, lrow = lane & 7, lmat = lane >> 3;
    /* This warp's block of KR keys, first query of its S^T and first column of its dK, dV
     * (shape). */
    const int key_warp = warp / CW, q_own = warp % CW * (BM / CW), c_own = warp % CW * (D / CW);

    /* Block -> (key tile, batch, key/value head); from each key's rows (attn_key_rows) the query
     * tiles that see any key of this tile. */
    const attn_bwd_keys keys = attn_bwd_keys_of<D, BN, DET>(p);
    const int head_kv = keys.head_kv, n0 = keys.n0, k_rows = keys.k_rows;
    const int64_t batch = keys.batch;
    const attn_mask &mask = keys.mask;
    int2 *const table = reinterpret_cast<int2 *>(smem + shape::TABLE_OFFSET);
    attn_fill_table(mask, table, n0, n0 + k_rows - 1, BN, true, tid, THREADS);
    __syncthreads();
    const int2 query_tiles = attn_bwd_query_tiles<BM>(table, k_rows);
    const int m_begin = query_tiles.x, m_tiles = query_tiles.y;
    const int steps = m_tiles * p.group; /* (query head, query tile) pairs */

    /* The (query head, first row) pairs in the walk's order (attn_bwd_walk: tiles fastest, from
     * the first; deterministic: heads fastest, tiles from the last down), carried from step to
     * step: at a step's top `at` is that step, and it moves on where the next step's loads are
     * issued. */
    using walk = attn_bwd_walk<BM, DET>;
    walk at = walk::at(0, head_kv * p.group, p.group, m_begin, m_tiles);

    const T *kg = static_cast<const T *>(p.k) + batch * p.k_sb + head_kv * p.k_sh + n0 * p.k_ss;
    const T *vg = static_cast<const T *>(p.v) + batch * p.v_sb + head_kv * p.v_sh + n0 * p.v_ss;

    const uint32_t s_k = tk_smem_address(smem);
    const uint32_t s_v = s_k + shape::K_BYTES;
    const uint32_t s_stage = s_v + shape::K_BYTES; /* two stages: Q, dO, lse, D */
    const uint32_t s_ds = s_stage + 2 * shape::STAGE_BYTES;
    const uint32_t s_p = s_ds + shape::S_BYTES; /* P^T, with COL_WARPS > 1 */
    float *stage_f = reinterpret_cast<float *>(smem + 2 * shape::K_BYTES + 2 * shape::Q_BYTES);

    /* The loads of step w into stage `st`: Q, dO by cp.async (load_tiles); lse, D (4-byte aligned
     * only) by plain loads into the registers of threads tid < BM (load_stats, its row's pair),
     * which store_stats puts into the stage later, before a barrier that publishes it: stored
     * beside their loads, they made warp 0 wait for the loads' round trip at the top of every
     * step. */
    auto load_tiles = [&](walk w, int st) {
        const int h = w.h, m0 = w.m0;
        const uint32_t s_q = s_stage + st * shape::STAGE_BYTES;
        attn_load_tile<T, D, BM, ROW, false, THREADS>(s_q, static_cast<const T *>(p.q) + batch * p.q_sb +
                                                               h * p.q_sh + m0 * p.q_ss,
                                                      p.q_ss, p.seqlen_q - m0, tid);
        attn_load_tile<T, D, BM, ROW, false, THREADS>(s_q + shape::Q_BYTES,
                                                      static_cast<const T *>(p.dout) + batch * p.do_sb +
                                                          h * p.do_sh + m0 * p.do_ss,
                                                      p.do_ss, p.seqlen_q - m0, tid);
    };
    auto load_stats = [&](walk w) {
        const int h = w.h, m0 = w.m0;
        float2 stat = make_float2(0.0f, 0.0f);
        if (tid < BM && m0 + tid < p.seqlen_q) {
            const int64_t r = (batch * p.heads_q + h) * p.seqlen_q + m0 + tid;
            stat = make_float2(p.lse[r], p.dsum[r]);
        }
        return stat;
    };
    /* The stage's lse * log2(e) and D from load_step's registers (rows past seqlen_q: zeros). */
    auto store_stats = [&](float2 stat, int st) {
        if (tid < BM) {
            float *f = reinterpret_cast<float *>(reinterpret_cast<unsigned char *>(stage_f) + st * shape::STAGE_BYTES);
            f[tid] = stat.x * ATTN_LOG2E;
            f[BM + tid] = stat.y;
        }
    };

    attn_load_tile<T, D, BN, ROW, false, THREADS>(s_k, kg, p.k_ss, k_rows, tid);
    attn_load_tile<T, D, BN, ROW, false, THREADS>(s_v, vg, p.v_ss, k_rows, tid);
    if (steps > 0) {
        load_tiles(at, 0);
        store_stats(load_stats(at), 0);
    }
    tk_cp_async_commit();

    /* ldmatrix lane addresses (attention.cuh's convention: lane l names row (l & 7) of matrix
     * l >> 3). Plain, for A (K, V rows of this warp's keys): row lrow + 8 (lmat & 1), chunk
     * lmat >> 1, the registers a0 a1 a2 a3. Transposed, for B stored [k][n] (dO, Q over query
     * rows; K over keys): the same rows and chunks. Plain for B stored [n][k] (Q, dO rows of
     * S^T and dP^T): row lrow + 8 (lmat >> 1), chunk lmat & 1, so that each n8 tile's b0, b1
     * land in adjacent registers (b[0], b[1] and b[2], b[3]), the register pair an HMMA reads;
     * with A's order they were b[0], b[2] and b[1], b[3], and ptxas moved each pair into place
     * (~110 moves per step and warp). Transposed for A stored [k][m] (dS^T over keys, for dQ):
     * key row lrow + 8 (lmat >> 1), query chunk lmat & 1. */
    const uint32_t ab_lane = (uint32_t)((lrow + 8 * (lmat & 1)) * ROW + ((lmat >> 1) << 4));
    const uint32_t b_lane = (uint32_t)((lrow + 8 * (lmat >> 1)) * ROW + ((lmat & 1) << 4));
    const uint32_t kw = (uint32_t)(key_warp * KR * ROW); /* this warp's KR keys */
    const uint32_t ds_lane = (uint32_t)((lrow + 8 * (lmat >> 1)) * S_ROW + ((lmat & 1) << 4));

    float dk[KM][DT][4], dv[KM][DT][4];
#pragma unroll
    for (int km = 0; km < KM; km++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dk[km][dt][e] = dv[km][dt][e] = 0.0f;

    /* This thread's keys: j = n0 + KR key_warp + 16 km + g (+ 8 for e >= 2) of m16 tile km; this
     * warp's dQ block. */
    const int key_base = n0 + key_warp * KR + g;
    const int dq_row0 = shape::DQ_ROW_WARPS > 1 ? warp / shape::DQ_COL_WARPS * shape::DQ_ROWS : 0;
    const int dq_col0 = (shape::DQ_ROW_WARPS > 1 ? warp % shape::DQ_COL_WARPS : warp) * shape::DQ_COLS;

    /* Deterministic: the semaphore of the step at (h, m0), and the last row of key tile n - 1
     * (none before the first), whose adds come first on the query tiles it reaches
     * (attn_bwd_order). */
    const int n = n0 / BN;
    auto semaphore = [&](int h, int m0) { return attn_bwd_semaphore<D, BM>(p, batch, h, m0); };
    int prev_last = -1;
    if constexpr (DET)
        if (n > 0)
            prev_last = attn_bwd_last_row(mask, n0 - 1);

    /* Products x0 .. x1 - 1 of (S^T = K Q^T, dP^T = V dO^T) into acc[x], for this warp's KR keys x
     * BM / CW queries, Q and dO at s_q and s_q + Q_BYTES (the split order takes one at a time). */
    auto keys_by_queries = [&](int x0, int x1, float (&acc)[2][KM][QT][4], uint32_t s_q) {
        const uint32_t keys_at[2] = {s_k, s_v}, rows_at[2] = {s_q, s_q + shape::Q_BYTES};
#pragma unroll
        for (int x = x0; x < x1; x++)
#pragma unroll
            for (int i = 0; i < KM * QT * 4; i++)
                acc[x][i / (QT * 4)][i / 4 % QT][i % 4] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            uint32_t a[2][KM][4];
#pragma unroll
            for (int x = x0; x < x1; x++)
#pragma unroll
                for (int km = 0; km < KM; km++)
                    tk_ldmatrix_x4<false>(a[x][km], keys_at[x] + kw + km * 16 * ROW + ab_lane + ks * 32);
#pragma unroll
            for (int np = 0; np < QT / 2; np++) {
                uint32_t b[2][4];
#pragma unroll
                for (int x = x0; x < x1; x++)
                    tk_ldmatrix_x4<false>(b[x], rows_at[x] + (q_own + np * 16) * ROW + b_lane + ks * 32);
#pragma unroll
                for (int x = x0; x < x1; x++)
#pragma unroll
                    for (int km = 0; km < KM; km++) {
                        tk_mma_16816<T>(acc[x][km][2 * np], a[x][km], b[x][0], b[x][1]);
                        tk_mma_16816<T>(acc[x][km][2 * np + 1], a[x][km], b[x][2], b[x][3]);
                    }
            }
        }
    };
    /* acc (dV or dK: this warp's keys x its columns) += A B over the 16 queries of k16 slice qs
     * and columns 16 cp .. + 15 of this warp's, A those queries of P^T or dS^T (one fragment per
     * m16 tile of keys), B the same rows of `rows` (dO or Q) stored [query][d] (transposed
     * ldmatrix), loaded once for the KM tiles. */
    auto keys_by_cols = [&](float (&acc)[KM][DT][4], uint32_t rows, int qs, int cp, const uint32_t (&a)[KM][4]) {
        uint32_t b[4];
        tk_ldmatrix_x4<true>(b, rows + qs * 16 * ROW + ab_lane + c_own * 2 + cp * 32);
#pragma unroll
        for (int km = 0; km < KM; km++) {
            tk_mma_16816<T>(acc[km][2 * cp], a[km], b[0], b[1]);
            tk_mma_16816<T>(acc[km][2 * cp + 1], a[km], b[2], b[3]);
        }
    };
    /* dV += P^T dO and dK += dS^T Q over the queries of k16 slice qs (Q at s_q, dO after it),
     * both products' B fragments loaded before their MMAs. */
    auto dv_dk_step = [&](uint32_t s_q, int qs, const uint32_t (&ap)[KM][4], const uint32_t (&ad)[KM][4]) {
        const uint32_t s_do = s_q + shape::Q_BYTES;
#pragma unroll
        for (int cp = 0; cp < DT / 2; cp++) {
            uint32_t b[4], bq[4];
            tk_ldmatrix_x4<true>(b, s_do + qs * 16 * ROW + ab_lane + c_own * 2 + cp * 32);
            tk_ldmatrix_x4<true>(bq, s_q + qs * 16 * ROW + ab_lane + c_own * 2 + cp * 32);
#pragma unroll
            for (int km = 0; km < KM; km++) {
                tk_mma_16816<T>(dv[km][2 * cp], ap[km], b[0], b[1]);
                tk_mma_16816<T>(dv[km][2 * cp + 1], ap[km], b[2], b[3]);
                tk_mma_16816<T>(dk[km][2 * cp], ad[km], bq[0], bq[1]);
                tk_mma_16816<T>(dk[km][2 * cp + 1], ad[km], bq[2], bq[3]);
            }
        }
    };
    /* A fragments of this warp's keys x queries (P^T, dS^T) into the [key][query] tile at
     * `tile`: register r of slice kk, m16 tile km is key row 16 km + g + 8 (r & 1), query columns
     * q_own + 16 kk + 8 (r >> 1) + 2 tq and the next (tk_mma_a_from_acc), at byte
     * key_query_at(kk, km, r). */
    auto key_query_at = [&](int kk, int km, int r) {
        return (key_warp * KR + 16 * km + g + 8 * (r & 1)) * S_ROW + (q_own + 16 * kk + 8 * (r >> 1) + 2 * tq) * 2;
    };
    auto store_keys_by_queries = [&](uint32_t tile, const uint32_t (&a)[OWN_QS][KM][4]) {
#pragma unroll
        for (int kk = 0; kk < OWN_QS; kk++)
#pragma unroll
            for (int km = 0; km < KM; km++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    *reinterpret_cast<uint32_t *>(smem + (tile - s_k) + key_query_at(kk, km, r)) = a[kk][km][r];
    };
    /* And back, written by either warp of the block: the A fragments of the block's keys over the
     * 16 queries of k16 slice qs from the [key][query] tile at `tile` (plain ldmatrix: it is
     * row-major m x k). */
    const uint32_t kq_lane = (uint32_t)((key_warp * KR + lrow + 8 * (lmat & 1)) * S_ROW + ((lmat >> 1) << 4));
    auto load_keys_by_queries = [&](uint32_t tile, int qs, uint32_t (&a)[KM][4]) {
#pragma unroll
        for (int km = 0; km < KM; km++)
            tk_ldmatrix_x4<false>(a[km], tile + kq_lane + km * 16 * S_ROW + qs * 32);
    };
    /* Split order: acc (dV or dK) += the block's P^T or dS^T, whichever the dS^T tile holds, over
     * all BM queries times `rows` (dO or Q). */
    auto block_by_cols = [&](float (&acc)[KM][DT][4], uint32_t rows) {
#pragma unroll
        for (int qs = 0; qs < QS; qs++) {
            uint32_t a[KM][4];
            load_keys_by_queries(s_ds, qs, a);
#pragma unroll
            for (int cp = 0; cp < DT / 2; cp++)
                keys_by_cols(acc, rows, qs, cp, a);
        }
    };

    int h_before = 0, m0_before = 0; /* deterministic: the step before, published in this one */
    for (int it = 0; it < steps; it++) {
        const int st = it & 1;
        tk_cp_async_wait<0>();
        __syncthreads(); /* step it has landed; every warp is done with step it - 1 */
        const bool next = it + 1 < steps;
        const int h = at.h, m0 = at.m0;
        /* The walk on to step it + 1, and its loads into the other stage, whose last reads (step
         * it - 1's) are behind the barrier above and which the next step's top waits for. The
         * fused order issues them here. The split order issues the copies once S^T's MMAs are
         * out and the lse / D loads once P is packed: from the barrier the tensor cores then
         * wait only for the step's first fragments, not for every warp's addresses and copies
         * (both sets together, after S^T or after P, made ptxas spill the deterministic kernel on
         * sm_80 or on sm_90a). In the split order a stage's last reads, dK's, come before the
         * step's dS^T barrier; with two warps per key in the fused order (D 256) dV and dK read
         * it after that barrier. */
        float2 next_stat = make_float2(0.0f, 0.0f);
        auto load_next = [&]() {
            /* Head dim 256 (the fused order with two warps per key) derives the next step from its
             * index: carried, its steps measured 2-3 % slower (docs/kernels/attention_bwd.md). */
            if constexpr (!SPLIT && CW > 1)
                at = walk::at(it + 1, head_kv * p.group, p.group, m_begin, m_tiles);
            else
                at.next();
            if (next)
                load_tiles(at, st ^ 1);
            tk_cp_async_commit();
        };
        auto load_next_stats = [&]() {
            if (next)
                next_stat = load_stats(at);
        };
        if constexpr (!SPLIT) {
            load_next();
            load_next_stats();
        }
        const uint32_t s_q = s_stage + st * shape::STAGE_BYTES;
        const uint32_t s_do = s_q + shape::Q_BYTES;
        const float *lse2 = reinterpret_cast<const float *>(
            reinterpret_cast<const unsigned char *>(stage_f) + st * shape::STAGE_BYTES);
        const float *dsum = lse2 + BM;

        /* S^T and dP^T (sd[0], sd[1]), P and dS from them (attn_bwd_probs; this thread's queries
         * from column q_own + 2 tq, its keys' visible rows `rows`), dV and dK, and dS^T to shared
         * memory, in one of two orders (attn_bwd_tile::SPLIT). The braces of each `if constexpr`
         * are load-bearing: CUDA 13.0's front end drops the #pragma unroll statement that follows
         * a discarded unbraced `if constexpr` whose body is a loop, which at CW = 2 (D 256) once
         * removed the dS^T / P^T stores and the barrier after them (no ex2 in the D 256 PTX; dK,
         * dV, dQ then read stale shared memory). */
        float sd[2][KM][QT][4];
        if constexpr (SPLIT) {
            /* Two warps per block of keys (D 128: 32 keys, each warp 32 of the 64 queries of S^T
             * and dP^T, 64 of the 128 columns of dK and dV). S^T first, P rounded to the dtype and
             * dV += P^T dO, then dP^T, dS and dK += dS^T Q (FlashAttention-2's and -3's order):
             * beside dK and dV only one product's f32 accumulators are live at a time. The block's
             * P^T and dS^T meet in the dS^T tile, each warp writing its own slots ([key][query])
             * and both reading the block's keys over all BM queries as A fragments (plain
             * ldmatrix), with a named barrier of the pair between:
             *   P^T to the slots | pair barrier | dV over all BM | pair barrier (the partner has
             *   read the slots) | with softcap, P times the cap's derivative over P | dP^T, dS =
             *   (the factor in the slots) (dP - D), dS^T over it | pair barrier | dK over all BM.
             * dS's factor waits for dP^T in shared memory (held in registers through dP^T it is
             * the margin between BM = 64 at D 128 and a spill); the softcap factor is rounded once
             * (the naive backward rounds P, and dS twice there). A straight from the accumulators
             * over the warp's own 16-query slices would save 8 of the 144 ldmatrix a step, but
             * ptxas spilled with it (4 to 52 bytes, by the arch and the product), the softcap
             * factor and P both held through dV. */
            static_assert(CW == 2, "the split order pairs two warps per block of keys");
            const int pair_barrier = 1 + key_warp; /* named barrier of the block's two warps */
            const bool partial =
                m0 + BM > p.seqlen_q || k_rows < BN || m0 < table[BN - 1].x || m0 + BM - 1 > table[0].y;
            const float slope_h = p.alibi_slopes ? p.alibi_slopes[h] : 0.0f;
            keys_by_queries(0, 1, sd, s_q);
            load_next();
            /* P in place of S^T, with softcap its derivative in sd[1], rounded into pa and pf one
             * m16 tile of keys at a time, so that the transform's per-element code holds one
             * tile's derivative, not both. */
            uint32_t pa[OWN_QS][KM][4], pf[OWN_QS][KM][4];
#pragma unroll
            for (int km = 0; km < KM; km++) {
                const int2 rows[2] = {table[key_warp * KR + 16 * km + g], table[key_warp * KR + 16 * km + g + 8]};
                attn_bwd_probs<ATTN_BWD_P_DERIV>(p, sd[0][km], sd[1][km], m0, q_own + 2 * tq, key_base + 16 * km,
                                                 rows, partial, slope_h, lse2, dsum);
#pragma unroll
                for (int qs = 0; qs < OWN_QS; qs++)
                    tk_mma_a_from_acc<T>(pa[qs][km], sd[0][km][2 * qs], sd[0][km][2 * qs + 1]);
                if (p.softcap > 0.0f) {
#pragma unroll
                    for (int qs = 0; qs < OWN_QS; qs++) {
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            sd[0][km][2 * qs][e] *= sd[1][km][2 * qs][e];
                            sd[0][km][2 * qs + 1][e] *= sd[1][km][2 * qs + 1][e];
                        }
                        tk_mma_a_from_acc<T>(pf[qs][km], sd[0][km][2 * qs], sd[0][km][2 * qs + 1]);
                    }
                }
            }
            load_next_stats();
            store_keys_by_queries(s_ds, pa);
            tk_named_barrier_sync<32 * CW>(pair_barrier); /* the partner's P^T is stored */
            block_by_cols(dv, s_do);
            tk_named_barrier_sync<32 * CW>(pair_barrier); /* the partner has read this warp's P^T */
            if (p.softcap > 0.0f)
                store_keys_by_queries(s_ds, pf);

            keys_by_queries(1, 2, sd, s_q);
            /* dS = (dS's factor waiting above) (dP - D); register r of slice qs, m16 tile km holds
             * n8 tile 2 qs + (r >> 1), key row 16 km + g + 8 (r & 1) (tk_mma_a_from_acc). */
            uint32_t da[OWN_QS][KM][4];
#pragma unroll
            for (int qs = 0; qs < OWN_QS; qs++)
#pragma unroll
                for (int km = 0; km < KM; km++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const int nt = 2 * qs + (r >> 1), qc = q_own + 2 * tq + 8 * nt;
                        const float2 f = tk_unpack2<T>(
                            *reinterpret_cast<const uint32_t *>(smem + (s_ds - s_k) + key_query_at(qs, km, r)));
                        da[qs][km][r] = tk_pack2<T>(f.x * (sd[1][km][nt][2 * (r & 1)] - dsum[qc]),
                                                    f.y * (sd[1][km][nt][2 * (r & 1) + 1] - dsum[qc + 1]));
                    }
            store_keys_by_queries(s_ds, da);
            tk_named_barrier_sync<32 * CW>(pair_barrier); /* the partner's dS^T is stored */
            block_by_cols(dk, s_q);
        } else {
            /* S^T and dP^T in one k-loop, then P and dS = P (dP - D) in f32 in their place. The loop
             * is written out and the mask's inputs are read after it: through keys_by_queries, or
             * with those reads ahead of the loop, ptxas schedules every kernel differently, and
             * the D 64 kernel ran slower (the card's Tried table). */
#pragma unroll
            for (int km = 0; km < KM; km++)
#pragma unroll
                for (int nt = 0; nt < QT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        sd[0][km][nt][e] = sd[1][km][nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                uint32_t a[KM][4], av[KM][4];
#pragma unroll
                for (int km = 0; km < KM; km++) {
                    tk_ldmatrix_x4<false>(a[km], s_k + kw + km * 16 * ROW + ab_lane + ks * 32);
                    tk_ldmatrix_x4<false>(av[km], s_v + kw + km * 16 * ROW + ab_lane + ks * 32);
                }
#pragma unroll
                for (int np = 0; np < QT / 2; np++) {
                    uint32_t b[4], bo[4];
                    tk_ldmatrix_x4<false>(b, s_q + (q_own + np * 16) * ROW + b_lane + ks * 32);
                    tk_ldmatrix_x4<false>(bo, s_do + (q_own + np * 16) * ROW + b_lane + ks * 32);
#pragma unroll
                    for (int km = 0; km < KM; km++) {
                        tk_mma_16816<T>(sd[0][km][2 * np], a[km], b[0], b[1]);
                        tk_mma_16816<T>(sd[0][km][2 * np + 1], a[km], b[2], b[3]);
                        tk_mma_16816<T>(sd[1][km][2 * np], av[km], bo[0], bo[1]);
                        tk_mma_16816<T>(sd[1][km][2 * np + 1], av[km], bo[2], bo[3]);
                    }
                }
            }
            const bool partial =
                m0 + BM > p.seqlen_q || k_rows < BN || m0 < table[BN - 1].x || m0 + BM - 1 > table[0].y;
            const float slope_h = p.alibi_slopes ? p.alibi_slopes[h] : 0.0f;
#pragma unroll
            for (int km = 0; km < KM; km++) {
                const int2 rows[2] = {table[key_warp * KR + 16 * km + g], table[key_warp * KR + 16 * km + g + 8]};
                attn_bwd_probs<ATTN_BWD_P_DS>(p, sd[0][km], sd[1][km], m0, q_own + 2 * tq, key_base + 16 * km, rows,
                                              partial, slope_h, lse2, dsum);
            }
            /* One warp per block of keys (every shape but D 256 and D 128 on 8 warps) holds all BM
             * queries of P^T and dS^T: dV and dK with A straight from the accumulators (k = queries). */
            if constexpr (CW == 1) {
#pragma unroll
                for (int qs = 0; qs < QS; qs++) {
                    uint32_t ap[KM][4], ad[KM][4];
#pragma unroll
                    for (int km = 0; km < KM; km++) {
                        tk_mma_a_from_acc<T>(ap[km], sd[0][km][2 * qs], sd[0][km][2 * qs + 1]);
                        tk_mma_a_from_acc<T>(ad[km], sd[1][km][2 * qs], sd[1][km][2 * qs + 1]);
                    }
                    dv_dk_step(s_q, qs, ap, ad);
                }
            }
            /* dS^T to shared memory, [key][query], for dQ = dS K summed over all BN keys; with
             * CW > 1 P^T beside it, for the block's other warps. */
#pragma unroll
            for (int km = 0; km < KM; km++)
#pragma unroll
                for (int nt = 0; nt < QT; nt++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int at =
                            (key_warp * KR + 16 * km + g + 8 * hh) * S_ROW + (q_own + 8 * nt + 2 * tq) * 2;
                        *reinterpret_cast<uint32_t *>(smem + (s_ds - s_k) + at) =
                            tk_pack2<T>(sd[1][km][nt][2 * hh], sd[1][km][nt][2 * hh + 1]);
                        if constexpr (CW > 1)
                            *reinterpret_cast<uint32_t *>(smem + (s_p - s_k) + at) =
                                tk_pack2<T>(sd[0][km][nt][2 * hh], sd[0][km][nt][2 * hh + 1]);
                    }
        }
        if (next) /* read from step it + 1 on, after the barrier at its top */
            store_stats(next_stat, st ^ 1);
        __syncthreads();
        /* Deterministic: every thread made the previous step's adds before the barriers since,
         * so they are published (a release after a barrier covers the whole CTA's writes). */
        if constexpr (DET)
            if (tid == 0 && it > 0)
                semaphore(h_before, m0_before).store(n + 1, cuda::memory_order_release);

        /* CW > 1 in the fused order (D 256): the block's P^T and dS^T over all BM queries from
         * shared memory, A fragments by plain ldmatrix ([key][query] is row-major m x k); they
         * stay until the next step's first barrier. */
        if constexpr (CW > 1 && !SPLIT) {
#pragma unroll
            for (int qs = 0; qs < QS; qs++) {
                uint32_t ap[KM][4], ad[KM][4];
                load_keys_by_queries(s_p, qs, ap);
                load_keys_by_queries(s_ds, qs, ad);
                dv_dk_step(s_q, qs, ap, ad);
            }
        }

        /* dQ of this warp's block (DQ_ROWS x DQ_COLS from row dq_row0, column dq_col0) = dS
         * (those rows x BN) K (BN x those columns), added to the accumulator by f32 atomics. */
        float dq[MQ][WDT][4];
#pragma unroll
        for (int mq = 0; mq < MQ; mq++)
#pragma unroll
            for (int nt = 0; nt < WDT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dq[mq][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            uint32_t a[MQ][4];
#pragma unroll
            for (int mq = 0; mq < MQ; mq++)
                tk_ldmatrix_x4<true>(a[mq], s_ds + ks * 16 * S_ROW + ds_lane + dq_row0 * 2 + mq * 32);
            const uint32_t k_at = s_k + ks * 16 * ROW + ab_lane + dq_col0 * 2;
#pragma unroll
            for (int np = 0; np < WDT / 2; np++) {
                uint32_t b[4];
                tk_ldmatrix_x4<true>(b, k_at + np * 32);
#pragma unroll
                for (int mq = 0; mq < MQ; mq++) {
                    tk_mma_16816<T>(dq[mq][2 * np], a[mq], b[0], b[1]);
                    tk_mma_16816<T>(dq[mq][2 * np + 1], a[mq], b[2], b[3]);
                }
            }
            /* An odd last n8 tile (D 80, 96): lanes 0-15 name its two matrices. */
            if constexpr (WDT % 2) {
                uint32_t b[2];
                tk_ldmatrix_x2_trans(b, k_at + WDT / 2 * 32);
#pragma unroll
                for (int mq = 0; mq < MQ; mq++)
                    tk_mma_16816<T>(dq[mq][WDT - 1], a[mq], b[0], b[1]);
            }
        }
        if constexpr (DET) {
            /* Key tile n - 1 adds first where it reaches these rows. */
            if (lane == 0 && m0 <= prev_last)
                attn_bwd_wait_turn(semaphore(h, m0), n);
            __syncwarp();
        }
        /* Fragment (mq, nt) is the whole block of padded row m0 + dq_row0 + 16 mq, column
         * dq_col0 + 8 nt (the accumulator's layout, above); a slab from seqlen_q on is past the
         * head's padded rows and is skipped, while pad rows inside the last slab take their
         * zeros with the rest of the fragment. */
        float *acc = p.dq_acc +
                     ((batch * p.heads_q + h) * attn_bwd_acc_rows(p.seqlen_q) + m0 + dq_row0) * D +
                     dq_col0 / 8 * ATTN_BWD_BLOCK;
#pragma unroll
        for (int mq = 0; mq < MQ; mq++)
            if (m0 + dq_row0 + 16 * mq < p.seqlen_q)
#pragma unroll
                for (int nt = 0; nt < WDT; nt++)
                    attn_bwd_acc_add(acc + mq * ATTN_BWD_SLAB * D + nt * ATTN_BWD_BLOCK, lane,
                                     dq[mq][nt][0] * p.scale, dq[mq][nt][1] * p.scale,
                                     dq[mq][nt][2] * p.scale, dq[mq][nt][3] * p.scale);
        h_before = h;
        m0_before = m0;
    }

    if constexpr (DET) {
        __syncthreads();
        if (tid == 0 && steps > 0)
            semaphore(h_before, m0_before).store(n + 1, cuda::memory_order_release);
    }

    /* dK and dV of this warp's keys and columns, from the accumulators. */
#pragma unroll
    for (int km = 0; km < KM; km++)
        attn_bwd_store_dk_dv<T>(p, batch, head_kv, key_base + 16 * km, c_own, dk[km], dv[km]);
}

template <typename T, int D, int WARPS, bool DET>
cudaError_t attn_bwd_launch(const tk_attention_bwd_call *bc, const tk_device *dev,
                            cudaStream_t stream) {
    using shape = attn_bwd_shape<D, WARPS>;
    constexpr auto kernel = attn_bwd_main<T, D, WARPS, DET>;
    const cudaError_t err = tk_opt_in_smem<kernel>(dev, shape::SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    /* The grid in sections of (batch, key/value head) pairs (attn_bwd_section). */
    const int section =
        attn_bwd_section<D, shape::BN>(&bc->fwd, dev, DET ? BWD_PORTABLE_DETERMINISTIC : BWD_PORTABLE_ATOMIC);
    return attn_bwd_run<T, D, DET>(bc, section, stream, [&](const attn_bwd_params &p) {
        /* One CTA per (key tile, batch, key/value head); MIN_CTAS of them per SM, 8 warps. */
        const tk_attention_call *c = &bc->fwd;
        const unsigned blocks =
            (unsigned)((int64_t)(c->seqlen_k + shape::BN - 1) / shape::BN * c->batch * c->heads_kv);
        return tk_launch(kernel, blocks, shape::THREADS, shape::SMEM_BYTES, stream, p);
    });
}

template <typename T, int D, int WARPS>
cudaError_t attn_bwd_head(const tk_attention_bwd_call *c, const tk_device *dev, cudaStream_t stream) {
    return c->deterministic ? attn_bwd_launch<T, D, WARPS, true>(c, dev, stream)
                            : attn_bwd_launch<T, D, WARPS, false>(c, dev, stream);
}

/* Head dims 64, 80, 96 and 128 on WARPS warps (head dim 256: tk_attention_bwd_launch_mma_d256). */
template <int WARPS>
cudaError_t attn_bwd_variant(const tk_attention_bwd_call *c, const tk_device *dev, cudaStream_t stream) {
    return tk_dispatch_dtype16(c->fwd.dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        switch (c->fwd.head_dim) {
        case 64:
            return attn_bwd_head<T, 64, WARPS>(c, dev, stream);
        case 80:
            return attn_bwd_head<T, 80, WARPS>(c, dev, stream);
        case 96:
            return attn_bwd_head<T, 96, WARPS>(c, dev, stream);
        case 128:
            return attn_bwd_head<T, 128, WARPS>(c, dev, stream);
        }
        return cudaErrorInvalidValue; /* the supports functions admit only the head dims above */
    });
}

/* Whether shape <D, WARPS> runs here: the device's shared memory per block and that of the pass
 * whose code runs on it (attn_bwd_arch_smem) hold its tiles, the deterministic kernel's static
 * ticket counted too. Every instantiation of the kernel comes from the same pass: one tells. */
template <int D, int WARPS> bool attn_bwd_fits(const tk_device *dev) {
    int arch = 0;
    if (tk_code_arch<attn_bwd_main<__nv_bfloat16, D, WARPS, false>>(dev, &arch) != cudaSuccess)
        return false;
    const int pass_smem = attn_bwd_arch_smem(arch);
    const int limit = dev->max_smem_optin < pass_smem ? dev->max_smem_optin : pass_smem;
    return attn_bwd_shape<D, WARPS>::SMEM_BYTES + ATTN_BWD_STATIC_SMEM <= limit;
}

} // namespace

/* D, the gap that puts the accumulator on a 128-byte boundary (attn_bwd_acc_start; at most 112
 * bytes past a 16-byte aligned address), the accumulator's padded rows, the order words. */
extern "C" size_t tk_attention_bwd_workspace_bytes(const tk_attention_call *c, int deterministic) {
    const size_t rows = (size_t)c->batch * (size_t)c->heads_q * (size_t)c->seqlen_q;
    const size_t acc_rows = (size_t)c->batch * (size_t)c->heads_q * (size_t)attn_bwd_acc_rows(c->seqlen_q);
    const size_t order = deterministic ? attn_bwd_order_count(c) : 0;
    return ((rows + 3) / 4 * 4 + acc_rows * (size_t)c->head_dim + order) * sizeof(float) +
           (ATTN_BWD_ACC_ALIGN - 16);
}

/* The 8-warp tiles need 92 KB (D 64), 108 KB (D 80), 124 KB (D 96, BM 64) or 156 KB (D 128, BM 64)
 * per block: D 80 to 128 are beyond the 99 KB of sm_86 and sm_89; all fit sm_80's 163 KB. */
extern "C" bool tk_attention_bwd_supports_bn128(const void *call, const tk_device *dev) {
    switch (static_cast<const tk_attention_bwd_call *>(call)->fwd.head_dim) {
    case 64: return attn_bwd_fits<64, BWD_WARPS>(dev);
    case 80: return attn_bwd_fits<80, BWD_WARPS>(dev);
    case 96: return attn_bwd_fits<96, BWD_WARPS>(dev);
    case 128: return attn_bwd_fits<128, BWD_WARPS>(dev);
    default: return false;
    }
}

extern "C" cudaError_t tk_attention_bwd_launch_mma_bn128(const void *call, const tk_device *dev,
                                                         cudaStream_t stream) {
    return attn_bwd_variant<BWD_WARPS>(static_cast<const tk_attention_bwd_call *>(call), dev, stream);
}

/* D 256: 64 keys, 8 warps, 143 KB per block: sm_80 and sm_90 (163 and 227 KB), not sm_86 / sm_89.
 * With 4 warps (32 keys) it would still need 104.75 KB, so no shape of this kernel runs D 256
 * there. */
extern "C" bool tk_attention_bwd_supports_d256(const void *call, const tk_device *dev) {
    return static_cast<const tk_attention_bwd_call *>(call)->fwd.head_dim == 256 &&
           attn_bwd_fits<256, BWD_WARPS>(dev);
}

extern "C" cudaError_t tk_attention_bwd_launch_mma_d256(const void *call, const tk_device *dev,
                                                        cudaStream_t stream) {
    const tk_attention_bwd_call *c = static_cast<const tk_attention_bwd_call *>(call);
    return tk_dispatch_dtype16(c->fwd.dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return attn_bwd_head<T, 256, BWD_WARPS>(c, dev, stream);
    });
}

/* The 4-warp tiles fit every sm_80+ device at head dims 64 to 128 (76.5 KB at most, D 80). */
extern "C" bool tk_attention_bwd_supports_mma(const void *call, const tk_device *) {
    const int d = static_cast<const tk_attention_bwd_call *>(call)->fwd.head_dim;
    return d == 64 || d == 80 || d == 96 || d == 128;
}

extern "C" cudaError_t tk_attention_bwd_launch_mma(const void *call, const tk_device *dev,
                                                   cudaStream_t stream) {
    return attn_bwd_variant<BWD_WARPS_SMALL>(static_cast<const tk_attention_bwd_call *>(call), dev,
                                             stream);
}
