/*
 * Attention backward on Hopper (variant "wgmma_sm90", sm_90a only; head dims 64 and 128, f16 and
 * bf16, every mask and option of the portable backward, softcap at head dim 128 only: see
 * bwd_sm90_plan): FlashAttention-3's backward on the device layer of core/sm90.cuh, around the
 * pieces every backward shares (attention_bwd.cuh: parameters, the f32 dQ accumulator, the row
 * kernels, the deterministic order, P and dS). One kernel body; the tiles per head dim are
 * bwd_sm90_plan<D> (below).
 *
 * Math (docs/kernels/attention_bwd.md has it whole): per (batch, query head), with P the forward's
 * softmax recomputed from its lse and D_i = dO_i . O_i (attn_bwd_pre),
 *   dV = P^T dO,   dP = dO V^T,   dS = P o (dP - D),   dQ = scale dS K,   dK = scale dS^T Q,
 * dK and dV summed over the query heads of a GQA group.
 *
 * Block: one CTA per (key tile of BN = 128 keys, batch, key/value head), in sections of (batch,
 * key/value head) pairs (attn_bwd_section: for the atomic kernel without a mask one pair a
 * section, the key tiles fastest; otherwise L2-sized sections, or sections of one to two waves
 * where none holds a wave), 3 warpgroups of
 * 128 threads, one CTA per SM (195 KiB of shared memory at head dim 128, 196 KiB at 64):
 * - Consumers 0 and 1 (232 registers after setmaxnreg): warpgroup w owns keys 64 w .. 64 w + 63
 *   of the tile and keeps their dK and dV (64 x D each: D f32 per thread) in registers for the
 *   whole CTA.
 * - Producer (warpgroup 2, 40 registers): warp 0's lane 0 loads K and V once (TMA, on kv_full),
 *   then per step the Q and dO tiles of BM query rows (64 at head dim 128, 128 at 64) into a ring
 *   of 2 stages (full barriers); the consumers' 8 warps free a stage on its empty barrier. Warp 1
 *   is the dQ writer (below). The step's lse * log2(e) and D (2 BM floats) are brought by the
 *   consumers' first 2 BM threads a step ahead (load_stat).
 * Steps: the (query head of the group, query tile) pairs that see a key of the tile (the key
 * table, attn_key_rows), in attn_bwd_walk's order. Per step, warpgroup w, all of it wgmma with
 * M = 64 keys or query rows and K = 16:
 *   S^T = K_w Q^T and dP^T = V_w dO^T: D / 16 + D / 16 of N = BM, both operands K-major from
 *     shared memory. Keys are rows and queries columns, so each warp's 16 rows are the portable
 *     kernel's fragments and attn_bwd_probs applies as is.
 *   dV_w += P^T dO: BM / 16 x D / 64 of N = 64, P^T from registers (each warp's n8 slices of S^T
 *     pair up into the m16 x k16 A fragments, as the forward's P) and dO an N-major B (the
 *     transpose bit).
 *   dS^T is stored transposed (stmatrix .trans) as dS [query][key], this warpgroup's 64-key
 *     half of a 128-byte swizzled tile of the stage, before dV is issued.
 *   Named barrier DS_READY (both halves written, each after fence.proxy.async), then the
 *   warpgroup's 64 x 64 block of dQ = dS K over all 128 keys: 8 of N = 64, dS K-major, K an
 *   N-major B. The block is columns 64 w .. 64 w + 63 of the step's 64 rows at head dim 128,
 *   rows 64 w .. 64 w + 63 of the step's 128, every column, at head dim 64 (bwd_sm90_plan says
 *   why).
 *   dK_w += dS^T Q: as dV with dS^T, issued last (FlashAttention-3's order: dV, dQ, dK).
 *   dQ reaches the f32 accumulator as in FlashAttention-3: each consumer warpgroup writes its
 *   64 x 64 block (times the scale), in the accumulator's order, to shared memory, and the dQ
 *   writer adds it into the accumulator with 4 bulk reductions of 4 KiB (one per 16 rows;
 *   cp.reduce.async.bulk): one instruction in L2 per 256 vector atomics, which the warps would
 *   otherwise issue themselves (red.global.add.v4.f32: 1.07-1.09x slower, 1.14-1.16x
 *   deterministic, docs/kernels/attention_bwd.md). Named barriers DQ_FREE / DQ_WRITTEN per
 *   warpgroup pass the block between them. The two blocks of a step never overlap (other
 *   columns or other rows), so each float of the accumulator gets one add per step.
 * Overlap: within a warpgroup, P forms while dP^T runs, dV runs across DS_READY, the dQ block's
 * trip to shared memory runs while dK does, and a step's dQ reductions are still in flight
 * while the next step's S^T and dP^T run. The warpgroups meet at DS_READY every step,
 * so their element-wise phases coincide: the tensor cores idle through P and dS (what
 * FlashAttention-3's backward does too). With softcap (head dim 128), P waits for dP^T as well:
 * its derivative needs the score beside dP, and holding 32 more values does not fit.
 * Shared memory: K and V (2 x BN x D x 2 bytes), 2 stages of Q, dO and dS (BM x D x 2 bytes
 * each, dS BM x 128 x 2), the consumers' dQ blocks (2 x 16 KiB), 2 stages of lse and D
 * (2 BM floats each), the key table (1 KiB), the barriers. dS needs no stage of its own: it is
 * in the step's stage, and a warpgroup writes a stage's dS two steps later only after passing
 * the next step's DS_READY, which the other warpgroup reaches only after its dQ of the first is
 * done.
 * Deterministic: the dQ writer keeps the order of the adds: it waits on the query tile's
 * semaphore before a step's bulk adds and publishes the step once they are done in global memory
 * (the bulk group's completion, then fence.proxy.async.global before the release store, and
 * after the acquiring load), so the consumers never wait on another CTA.
 */
#include "attention.h"
#include "attention_bwd.cuh"
#include "attention_sm90.cuh"
#include "core/sm90.cuh"

namespace {

/* The tiles of head dim D (FlashAttention-3's at both: 128 keys per CTA, and 64 or 128 query
 * rows per step). Each consumer warpgroup computes a 64 x 64 block of a step's dQ:
 * - D = 128, BM = 64: dQ is 64 x 128, split by columns (warpgroup w the head-dim half w).
 *   Registers per consumer thread: dK, dV 128 for the whole CTA; S^T, dP^T 64 (64 x 64 each)
 *   until they are packed into their A fragments (32), P^T's until dV is done and dS^T's until
 *   dK is, beside dQ (32): 192 at the peak, plus addresses, within 232.
 * - D = 64, BM = 128: dQ is 128 x 64, split by rows (warpgroup w rows 64 w ..). With 64 rows a
 *   step there would be one 64-column block, the sum of both warpgroups' dS_w K_w: summed in
 *   shared memory it costs a second hand-off between the warpgroups every step, and added as
 *   two bulk reductions into the same addresses the deterministic order needs the first done
 *   in global memory before the second is issued (two adds in flight at once are not ordered).
 *   128 rows also halve the per-step costs (barriers, hand-offs, waits) per FLOP, which at
 *   64 rows would be those of a head dim 128 step for half its products. Registers: dK, dV 64;
 *   S^T, dP^T 128 (64 x 128 each), then their A fragments 64 and dQ 32: 192 at the peak, as at
 *   128. Shared memory: K, V 32 KiB, stages 2 x 64 KiB (Q, dO 16 KiB each, dS 32 KiB).
 * Either way each float of the accumulator gets exactly one bulk add per step, so the
 * deterministic order (per query tile of BM rows, in key-tile order) is the same argument. */
template <int HEAD_DIM> struct bwd_sm90_plan {
    static constexpr int D = HEAD_DIM;
    static_assert(D == 64 || D == 128, "the head dims whose tiles are planned here");
    static constexpr int HALVES = D / HALF;
    static constexpr int CONSUMERS = 2;
    static constexpr int BN = 64 * CONSUMERS; /* keys per CTA: 64 per consumer warpgroup */
    static constexpr int BM = D == 64 ? 128 : 64; /* query rows per step: the N of S^T and dP^T */
    /* dQ's 64 x 64 blocks: by query rows (BM = 128) or by head-dim halves (BM = 64). */
    static constexpr bool DQ_BY_ROWS = BM == 64 * CONSUMERS;
    static_assert(DQ_BY_ROWS ? HALVES == 1 : BM == 64 && HALVES == CONSUMERS,
                  "one 64 x 64 block of the step's dQ per consumer warpgroup");
    /* Softcap at head dim 64 is left to the portable kernels: its P and dS pass after dP^T, with
     * S^T and dP^T 64 x 128 both live, spilled (ptxas of CUDA 13.0: 152 bytes; 64 in 64-column
     * parts, 32 in 32-column ones), and is compiled out of the head dim 64 kernel. */
    static constexpr bool SOFTCAP = D == 128;
    static constexpr int STAGES = 2;
    static constexpr int THREADS = 128 * (CONSUMERS + 1);
    /* 2 x 128 x 232 + 128 x 40 = 64512 of the launch's 168 x 384. The dQ writer needs its step's
     * rows and head beside the loads, which 24 producer registers do not hold without spilling. */
    static constexpr int CONSUMER_REGS = 232, PRODUCER_REGS = 40;
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    static_assert(CONSUMERS * 128 * CONSUMER_REGS + 128 * PRODUCER_REGS <= LAUNCH_REGS * THREADS,
                  "the warpgroups' registers fit what the launch holds");
    static constexpr int KV_HALF_BYTES = BN * HALF * 2; /* 64 columns of K or V: 16 KiB */
    static constexpr int KV_BYTES = HALVES * KV_HALF_BYTES;
    static constexpr int Q_HALF_BYTES = BM * HALF * 2; /* 64 columns of Q or dO: 8 or 16 KiB */
    static constexpr int Q_BYTES = HALVES * Q_HALF_BYTES;
    static constexpr int DS_HALF_BYTES = BM * 64 * 2; /* dS of one warpgroup's 64 keys: 8 or 16 KiB */
    static constexpr int STAGE_BYTES = 2 * Q_BYTES + CONSUMERS * DS_HALF_BYTES; /* Q, dO, dS */
    static constexpr int PIPE_BYTES = 2 * KV_BYTES + STAGES * STAGE_BYTES;
    /* Each consumer warpgroup's 64 x 64 block of dQ in f32, in the accumulator's order: 4 slabs
     * of 16 rows, one per warp. */
    static constexpr int DQ_HALF_BYTES = 64 * 64 * 4; /* 16 KiB */
    static constexpr int STATS_OFFSET = PIPE_BYTES + CONSUMERS * DQ_HALF_BYTES;
    static constexpr int STATS_FLOATS = 2 * BM; /* a stage's lse * log2(e), then D */
    static_assert(STATS_FLOATS <= 128 * CONSUMERS, "one consumer thread per float of the stats");
    static constexpr int TABLE_OFFSET = STATS_OFFSET + STAGES * STATS_FLOATS * 4;
    static constexpr int BARRIER_OFFSET = TABLE_OFFSET + BN * 8; /* each key's rows (int2) */
    static constexpr int BARRIER_BYTES = (1 + 2 * STAGES) * 8;   /* kv_full, full[], empty[] */
    static constexpr int SMEM_BYTES = BARRIER_OFFSET + BARRIER_BYTES + 1024; /* + alignment to 1024 */
    static_assert(SMEM_BYTES <= 227 * 1024, "one block fits an sm_90 SM's opt-in shared memory");
    static_assert(KV_HALF_BYTES % 1024 == 0 && Q_HALF_BYTES % 1024 == 0 && DS_HALF_BYTES % 1024 == 0,
                  "swizzle-aligned tiles");
};

template <typename T, int HEAD_DIM, bool DET>
__global__ void __launch_bounds__(bwd_sm90_plan<HEAD_DIM>::THREADS, 1)
    attn_bwd_sm90(const __grid_constant__ attn_bwd_params p, const __grid_constant__ CUtensorMap map_q,
                  const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                  const __grid_constant__ CUtensorMap map_do) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using plan = bwd_sm90_plan<HEAD_DIM>;
    /* Named barriers (0 is __syncthreads'): the step's dS is in shared memory; per consumer
     * warpgroup w, its dQ block is free to write (DQ_FREE + w) and written (DQ_WRITTEN + w), each
     * between the warpgroup and the dQ writer warp. */
    constexpr int DS_READY = 1, DQ_FREE = 2, DQ_WRITTEN = 2 + plan::CONSUMERS, DQ_THREADS = 128 + 32;
    constexpr int D = plan::D, BN = plan::BN, BM = plan::BM, STAGES = plan::STAGES, CONSUMERS = plan::CONSUMERS;
    constexpr int KV_HALF_BYTES = plan::KV_HALF_BYTES, KV_BYTES = plan::KV_BYTES, Q_HALF_BYTES = plan::Q_HALF_BYTES,
                  Q_BYTES = plan::Q_BYTES, DS_HALF_BYTES = plan::DS_HALF_BYTES, STAGE_BYTES = plan::STAGE_BYTES;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = tk_smem_address(smem_raw);
    const uint32_t s_k = (raw + 1023) & ~1023u;
    unsigned char *const smem = smem_raw + (s_k - raw);
    const uint32_t s_v = s_k + KV_BYTES;
    const uint32_t s_stage = s_v + KV_BYTES; /* stage s: Q, dO, dS at s_stage + s STAGE_BYTES */
    const uint32_t s_dq = s_k + plan::PIPE_BYTES; /* consumer w's dQ block at + w DQ_HALF_BYTES */
    float *const stats = reinterpret_cast<float *>(smem + plan::STATS_OFFSET);
    int2 *const table = reinterpret_cast<int2 *>(smem + plan::TABLE_OFFSET);
    const uint32_t kv_full = s_k + plan::BARRIER_OFFSET, full = kv_full + 8, empty = full + 8 * STAGES;

    /* Block -> (key tile, batch, key/value head); each key's rows, and from them the query tiles
     * and steps of this CTA. */
    const int tid = threadIdx.x;
    const attn_bwd_keys keys = attn_bwd_keys_of<D, BN, DET>(p);
    const int head_kv = keys.head_kv, n0 = keys.n0, k_rows = keys.k_rows;
    const int64_t batch = keys.batch;
    const attn_mask &mask = keys.mask;
    attn_fill_table(mask, table, n0, n0 + k_rows - 1, BN, true, tid, plan::THREADS);
    if (tid == 0) {
        tk_mbarrier_init(kv_full, 1);
        for (int s = 0; s < STAGES; s++) {
            tk_mbarrier_init(full + 8 * s, 1);              /* the TMA thread's expect_tx */
            tk_mbarrier_init(empty + 8 * s, 4 * CONSUMERS); /* one arrival per consumer warp */
        }
        tk_fence_mbarrier_init();
    }
    __syncthreads(); /* the table and the barriers */
    const int2 query_tiles = attn_bwd_query_tiles<BM>(table, k_rows);
    const int m_begin = query_tiles.x, m_tiles = query_tiles.y;
    auto step_at = [&](int it, int &h, int &m0) {
        const attn_bwd_walk<BM, DET> w = attn_bwd_walk<BM, DET>::at(it, head_kv * p.group, p.group, m_begin, m_tiles);
        h = w.h;
        m0 = w.m0;
    };

    /* Deterministic: the last row of key tile n - 1, whose adds come first where it reaches. */
    const int n = n0 / BN;
    int prev_last = -1;
    if constexpr (DET)
        if (n > 0)
            prev_last = attn_bwd_last_row(mask, n0 - 1);

    const int warpgroup = tid / 128, warp = tid / 32 % 4, lane = tid % 32;
    if (warpgroup == CONSUMERS) {
        tk_setmaxnreg_dec<plan::PRODUCER_REGS>();
        /* Each role counts its steps after setmaxnreg: a count live across it was kept in local
         * memory by ptxas (4 bytes, the deterministic kernel). */
        const int steps = m_tiles * p.group;
        if (steps == 0)
            return; /* nothing to load: the consumers store zeros */
        tk_stage_ring<STAGES> ring = {0, 0};
        if (warp == 0 && lane == 0) {
            tk_mbarrier_arrive_expect_tx(kv_full, 2 * KV_BYTES);
            for (int h = 0; h < plan::HALVES; h++) {
                tk_tma_load_4d(s_k + h * KV_HALF_BYTES, &map_k, h * HALF, n0, head_kv, (int)batch, kv_full);
                tk_tma_load_4d(s_v + h * KV_HALF_BYTES, &map_v, h * HALF, n0, head_kv, (int)batch, kv_full);
            }
            for (int it = 0; it < steps; it++, ring.next()) {
                int head, m0;
                step_at(it, head, m0);
                tk_mbarrier_wait(ring.barrier(empty), ring.phase ^ 1); /* round 0 finds it free */
                const uint32_t q_dst = s_stage + ring.stage * STAGE_BYTES;
                tk_mbarrier_arrive_expect_tx(ring.barrier(full), 2 * Q_BYTES);
                for (int h = 0; h < plan::HALVES; h++) {
                    tk_tma_load_4d(q_dst + h * Q_HALF_BYTES, &map_q, h * HALF, m0, head, (int)batch,
                                   ring.barrier(full));
                    tk_tma_load_4d(q_dst + Q_BYTES + h * Q_HALF_BYTES, &map_do, h * HALF, m0, head, (int)batch,
                                   ring.barrier(full));
                }
            }
        }
        if (warp == 1) {
            /* The dQ writer: per step and consumer warpgroup w, once w has written its block
             * (4 KiB per warp r: at head dim 128 columns 64 w .. 64 w + 63 of rows m0 + 16 r ..,
             * the accumulator's blocks 8 w .. 8 w + 7 of slab r; at 64 rows m0 + 64 w + 16 r ..,
             * slab 4 w + r whole: contiguous there too), one bulk add per slab below seqlen_q;
             * the block is free again once read. */
            for (int w = 0; w < CONSUMERS; w++)
                tk_named_barrier_arrive<DQ_THREADS>(DQ_FREE + w);
            /* The accumulator's rows get an add from every key tile that sees them: kept in L2
             * (FlashAttention-3 adds with the same hint). */
            const uint64_t keep_in_l2 = tk_l2_evict_last_policy();
            for (int it = 0; it < steps; it++) {
                int head, m0;
                step_at(it, head, m0);
                const int slabs = min(BM, p.seqlen_q - m0 + ATTN_BWD_SLAB - 1) / ATTN_BWD_SLAB;
                float *const acc = p.dq_acc + ((batch * p.heads_q + head) * attn_bwd_acc_rows(p.seqlen_q) + m0) * D;
                for (int w = 0; w < CONSUMERS; w++) {
                    /* The block's first slab of the step and first 8-column block of a slab. */
                    const int slab0 = plan::DQ_BY_ROWS ? 4 * w : 0, col_block0 = plan::DQ_BY_ROWS ? 0 : 8 * w;
                    tk_named_barrier_sync<DQ_THREADS>(DQ_WRITTEN + w);
                    if (lane == 0) {
                        if constexpr (DET)
                            if (w == 0 && m0 <= prev_last) { /* key tile n - 1 adds here first */
                                attn_bwd_wait_turn(attn_bwd_semaphore<D, BM>(p, batch, head, m0), n);
                                tk_fence_proxy_async_global(); /* its sums, then our bulk adds */
                            }
                        for (int r = 0; r < 4 && slab0 + r < slabs; r++)
                            tk_bulk_reduce_add_f32(acc + (slab0 + r) * ATTN_BWD_SLAB * D + col_block0 * ATTN_BWD_BLOCK,
                                                   s_dq + w * plan::DQ_HALF_BYTES + r * 4096, 4096, keep_in_l2);
                        tk_bulk_commit();
                        tk_bulk_wait_read<0>();
                    }
                    __syncwarp();
                    if (it + 1 < steps) /* the last step's arrival would have no partner */
                        tk_named_barrier_arrive<DQ_THREADS>(DQ_FREE + w);
                }
                if constexpr (DET) {
                    /* The step's sums done in global memory, then published. The completion
                     * implies a generic-async proxy fence (PTX ISA, async proxy); the explicit
                     * one states the order where the acquiring side needs its own. */
                    if (lane == 0) {
                        tk_bulk_wait<0>();
                        tk_fence_proxy_async_global();
                        attn_bwd_semaphore<D, BM>(p, batch, head, m0).store(n + 1, cuda::memory_order_release);
                    }
                    __syncwarp(); /* the warp whole again for the next step's bar.sync */
                }
            }
            if (lane == 0)
                tk_bulk_wait<0>();
        }
        return;
    }

    tk_setmaxnreg_inc<plan::CONSUMER_REGS>();
    const int steps = m_tiles * p.group;
    const int g = lane / 4, tq = lane % 4;
    const int wk = 64 * warpgroup;            /* this warpgroup's first key in the tile */
    const int key0 = n0 + wk + 16 * warp + g; /* this thread's keys: key0 and key0 + 8 */
    const int2 rows[2] = {table[key0 - n0], table[key0 - n0 + 8]};
    /* The rows of the warpgroup's first and last keys: its tile classifier's bounds. */
    const int2 first_key = table[wk], last_key = table[wk + 63];
    const bool keys_past_end = n0 + wk + 64 > p.seqlen_k;
    /* stmatrix .trans: lane l stores row l % 8 of matrix l / 8 of a 16 x 16 block (queries 16 kk
     * + 8 (l / 16) + l % 8, keys 16 warp + 8 (l / 8 % 2) of the half): 16 bytes at that query's
     * row, in the 16-byte chunk of those keys swizzled by the row (the 128-byte swizzle XORs the
     * chunk index with row % 8 = l % 8). */
    const int ds_row = 8 * (lane / 16) + lane % 8, ds_chunk = (2 * warp + lane / 8 % 2) ^ (lane % 8);
    const uint32_t ds_lane = (uint32_t)(warpgroup * DS_HALF_BYTES + ds_row * 128 + ds_chunk * 16);

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[j][e] = dv[j][e] = 0.0f;

    /* A step's lse * log2(e) and D rows, 0 past seqlen_q (those rows are masked): consumer thread
     * t < 2 BM (warpgroup 0 at head dim 128, both at 64) brings float t of the stage's slot (lse
     * of row t, then D of row t - BM) from global memory. The loads of step it + 1 are issued
     * during step it and stored before its DS_READY, which orders them before every read of
     * step it + 1 and after every read of step it - 1 (the slot's previous step): the hand-off
     * needs no barrier of its own. The lse is scaled where it is stored (stat_to_store), not
     * where it is loaded: with the multiply beside the load, ptxas placed it, and so the wait for
     * the load's round trip, ahead of the step's P on the warps that bring an lse. */
    auto load_stat = [&](int at) {
        int head, m0;
        step_at(at, head, m0);
        const int i = m0 + tid % BM;
        if (i >= p.seqlen_q)
            return 0.0f;
        const int64_t r = (batch * p.heads_q + head) * p.seqlen_q + i;
        return tid < BM ? p.lse[r] : p.dsum[r];
    };
    auto stat_to_store = [&](float loaded) { return tid < BM ? loaded * ATTN_LOG2E : loaded; };
    const bool brings_stat = tid < plan::STATS_FLOATS;
    if (brings_stat && steps > 0)
        stats[tid] = stat_to_store(load_stat(0));
    tk_named_barrier_sync<128 * CONSUMERS>(DS_READY); /* step 0's stats */

    if (steps > 0)
        tk_mbarrier_wait(kv_full, 0);
    tk_stage_ring<STAGES> ring = {0, 0};
    uint32_t k_tile = s_k, v_tile = s_v;
    for (int it = 0; it < steps; it++, ring.next()) {
        /* Left alone, ptxas hoists the 24 descriptors of K and V out of the loop into registers,
         * and spills: hidden from it here, each is built beside its wgmma from these two. */
        asm volatile("" : "+r"(k_tile), "+r"(v_tile));
        int h, m0;
        step_at(it, h, m0);
        const uint32_t s_q = s_stage + ring.stage * STAGE_BYTES, s_do = s_q + Q_BYTES, s_ds = s_do + Q_BYTES;
        const float *const lse2 = stats + ring.stage * plan::STATS_FLOATS, *const dsum = lse2 + BM;
        tk_mbarrier_wait(ring.barrier(full), ring.phase);

        /* S^T = K_w Q^T and dP^T = V_w dO^T, each over the head dim's D / 16 k16 slices (slice ks
         * of a 64-column half is 32 bytes into each swizzled row), each committed as a group. */
        float s[BM / 8][4], dp[BM / 8][4];
        auto issue_keys_by_rows = [&](float(&acc)[BM / 8][4], uint32_t keys_tile, uint32_t rows_tile) {
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++)
                tk_wgmma_ss<T, BM>(acc,
                                   tk_wgmma_desc_sw128(keys_tile + (ks / 4) * KV_HALF_BYTES + wk * 128 + (ks % 4) * 32),
                                   tk_wgmma_desc_sw128(rows_tile + (ks / 4) * Q_HALF_BYTES + (ks % 4) * 32), ks > 0);
            tk_wgmma_commit();
        };
        tk_wgmma_fence();
        issue_keys_by_rows(s, k_tile, s_q);
        issue_keys_by_rows(dp, v_tile, s_do);
        const bool stat_next = brings_stat && it + 1 < steps;
        const float next_stat = stat_next ? load_stat(it + 1) : 0.0f;

        /* Uniform over the warpgroup: can a pair of its keys and this step's rows be invisible? */
        const bool partial =
            m0 + BM > p.seqlen_q || keys_past_end || m0 < last_key.x || m0 + BM - 1 > first_key.y;
        const float slope = p.alibi_slopes ? p.alibi_slopes[h] : 0.0f;
        /* P while dP^T runs; with softcap both wait for dP^T (the header says why). */
        tk_wgmma_wait<1>(); /* S^T, committed first */
        tk_wgmma_pin(s);
        const bool softcap = plan::SOFTCAP && p.softcap > 0.0f;
        if (!softcap)
            attn_bwd_probs<ATTN_BWD_P>(p, s, dp, m0, 2 * tq, key0, rows, partial, slope, lse2, dsum);
        tk_wgmma_wait<0>();
        tk_wgmma_pin(dp);
        if (softcap) {
            attn_bwd_probs<ATTN_BWD_P_DS>(p, s, dp, m0, 2 * tq, key0, rows, partial, slope, lse2, dsum);
        } else {
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dp[nt][e] = s[nt][e] * (dp[nt][e] - dsum[8 * nt + 2 * tq + (e & 1)]);
        }

        /* P^T and dS^T as A fragments (k16 slice kk of the queries: n8 slices 2 kk, 2 kk + 1), dS^T
         * to shared memory as dS for dQ; then dV += P^T dO and dK += dS^T Q, B N-major. */
        uint32_t pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            tk_mma_a_from_acc<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
            tk_mma_a_from_acc<T>(da[kk], dp[2 * kk], dp[2 * kk + 1]);
            tk_stmatrix_x4_trans(s_ds + ds_lane + kk * 16 * 128, da[kk]);
        }
        /* The step's last three products in FlashAttention-3's order: dV (it runs across the
         * DS_READY barrier), dQ, then dK, whose run covers this thread's dQ hand-off below. */
        auto issue_dv_or_dk = [&](float(&acc)[D / 8][4], const uint32_t(&a)[BM / 16][4], uint32_t b_tile) {
            tk_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++)
#pragma unroll
                for (int hh = 0; hh < plan::HALVES; hh++)
                    tk_wgmma_rs<T, 64>(*reinterpret_cast<float(*)[8][4]>(&acc[8 * hh]), a[kk],
                                       tk_wgmma_desc_n_major_sw128(b_tile + hh * Q_HALF_BYTES + kk * 16 * 128));
            tk_wgmma_commit();
        };
        issue_dv_or_dk(dv, pa, s_do);
        if (stat_next)
            stats[(ring.stage + 1) % STAGES * plan::STATS_FLOATS + tid] = stat_to_store(next_stat);
        tk_fence_proxy_async_shared();
        tk_named_barrier_sync<128 * CONSUMERS>(DS_READY);

        /* The warpgroup's block of dQ = dS K over the 128 keys: the step's rows dq_row0 .. + 63,
         * columns 64 dq_half .. + 63. K16 slice kk of the keys is in dS half kk / 4, and rows 16 kk
         * .. of K's half dq_half. */
        const int dq_row0 = plan::DQ_BY_ROWS ? 64 * warpgroup : 0, dq_half = plan::DQ_BY_ROWS ? 0 : warpgroup;
        float dq[8][4];
        tk_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            tk_wgmma_ss<T, 64, true>(
                dq, tk_wgmma_desc_sw128(s_ds + (kk / 4) * DS_HALF_BYTES + dq_row0 * 128 + (kk % 4) * 32),
                tk_wgmma_desc_n_major_sw128(k_tile + dq_half * KV_HALF_BYTES + kk * 16 * 128), kk > 0);
        tk_wgmma_commit();
        tk_wgmma_wait<1>(); /* dV */
        tk_wgmma_pin(dv);
        tk_wgmma_pin(pa);
        issue_dv_or_dk(dk, da, s_q);
        tk_wgmma_wait<1>(); /* dQ; dK still runs */
        tk_wgmma_pin(dq);

        /* This warp's fragments (its 16 rows of the block) into its 4 KiB of the warpgroup's
         * block (consumer warp c = 4 w + warp: 4 KiB c of the dQ area), in the accumulator's
         * order (512 contiguous bytes per store: no bank conflict), for the dQ writer. The thread index is hidden from
         * ptxas here so that what derives from it is built beside its use: held through the
         * loop, it spilled at 232 registers. */
        int t = tid;
        asm volatile("" : "+r"(t));
        tk_named_barrier_sync<DQ_THREADS>(DQ_FREE + t / 128);
        float4 *const block = reinterpret_cast<float4 *>(smem + plan::PIPE_BYTES + (t / 32) * 4096);
#pragma unroll
        for (int j = 0; j < 8; j++)
            block[j * 32 + t % 32] =
                make_float4(dq[j][0] * p.scale, dq[j][1] * p.scale, dq[j][2] * p.scale, dq[j][3] * p.scale);
        tk_fence_proxy_async_shared();
        tk_named_barrier_arrive<DQ_THREADS>(DQ_WRITTEN + t / 128);
        tk_wgmma_wait<0>(); /* dK */
        tk_wgmma_pin(dk);
        tk_wgmma_pin(da);
        if (lane == 0) /* the warpgroup's wgmma are done with the stage's Q and dO */
            tk_mbarrier_arrive(ring.barrier(empty));
    }

    /* dK and dV of this thread's keys, every column. */
    attn_bwd_store_dk_dv<T>(p, batch, head_kv, key0, 0, dk, dv);
#endif
}

template <typename T, int D, bool DET>
cudaError_t bwd_sm90_launch(const tk_attention_bwd_call *bc, const tk_device *dev, cudaStream_t stream) {
    using plan = bwd_sm90_plan<D>;
    const tk_attention_call *c = &bc->fwd;
    CUtensorMap map_q, map_k, map_v, map_do;
    cudaError_t err = attn_tensor_map(&map_q, c->dtype, c->q, plan::D, c->batch, c->seqlen_q, c->heads_q,
                                      c->q_stride, plan::BM);
    if (err == cudaSuccess)
        err = attn_tensor_map(&map_do, c->dtype, bc->dout, plan::D, c->batch, c->seqlen_q, c->heads_q, bc->do_stride,
                              plan::BM);
    if (err == cudaSuccess)
        err = attn_tensor_map(&map_k, c->dtype, c->k, plan::D, c->batch, c->seqlen_k, c->heads_kv, c->k_stride,
                              plan::BN);
    if (err == cudaSuccess)
        err = attn_tensor_map(&map_v, c->dtype, c->v, plan::D, c->batch, c->seqlen_k, c->heads_kv, c->v_stride,
                              plan::BN);
    if (err != cudaSuccess)
        return err;
    constexpr auto kernel = attn_bwd_sm90<T, D, DET>;
    err = tk_opt_in_smem<kernel>(dev, plan::SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    const int section = attn_bwd_section<plan::D, plan::BN>(c, dev, DET ? BWD_SM90_DETERMINISTIC : BWD_SM90_ATOMIC);
    return attn_bwd_run<T, plan::D, DET>(bc, section, stream, [&](const attn_bwd_params &p) {
        /* One CTA per (key tile, batch, key/value head), in sections of pairs (attn_bwd_section). */
        const unsigned blocks = (unsigned)((int64_t)(c->seqlen_k + plan::BN - 1) / plan::BN * c->batch * c->heads_kv);
        return tk_launch(kernel, blocks, plan::THREADS, plan::SMEM_BYTES, stream, p, map_q, map_k, map_v, map_do);
    });
}

/* A planned head dim (64 or 128) and what its plan takes (softcap at 128 only); TMA's stride
 * limit on the four tensors it loads; the shared memory. */
template <int D> bool bwd_sm90_plan_takes(const tk_attention_bwd_call *c, const tk_device *dev) {
    using plan = bwd_sm90_plan<D>;
    return (plan::SOFTCAP || !(c->fwd.softcap > 0.0f)) &&
           plan::SMEM_BYTES + ATTN_BWD_STATIC_SMEM <= dev->max_smem_optin;
}

bool bwd_sm90_supports(const tk_attention_bwd_call *c, const tk_device *dev) {
    const int d = c->fwd.head_dim;
    return (d == 64 ? bwd_sm90_plan_takes<64>(c, dev) : d == 128 && bwd_sm90_plan_takes<128>(c, dev)) &&
           attn_tma_strides(c->fwd.q_stride) && attn_tma_strides(c->fwd.k_stride) &&
           attn_tma_strides(c->fwd.v_stride) && attn_tma_strides(c->do_stride);
}

template <typename T, int D>
cudaError_t bwd_sm90_launch_det(const tk_attention_bwd_call *c, const tk_device *dev, cudaStream_t stream) {
    return c->deterministic ? bwd_sm90_launch<T, D, true>(c, dev, stream)
                            : bwd_sm90_launch<T, D, false>(c, dev, stream);
}

} // namespace

extern "C" bool tk_attention_bwd_supports_sm90(const void *call, const tk_device *dev) {
    return bwd_sm90_supports(static_cast<const tk_attention_bwd_call *>(call), dev);
}

extern "C" cudaError_t tk_attention_bwd_launch_sm90(const void *call, const tk_device *dev, cudaStream_t stream) {
    const tk_attention_bwd_call *c = static_cast<const tk_attention_bwd_call *>(call);
    return tk_dispatch_dtype16(c->fwd.dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        /* bwd_sm90_supports took 64 and 128 only. */
        return c->fwd.head_dim == 64 ? bwd_sm90_launch_det<T, 64>(c, dev, stream)
                                     : bwd_sm90_launch_det<T, 128>(c, dev, stream);
    });
}
