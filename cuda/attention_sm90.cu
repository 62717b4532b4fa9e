/*
 * Attention forward on Hopper (variants "wgmma_sm90", "wgmma_sm90_persistent" and
 * "wgmma_sm90_wide", sm_90a only): the FlashAttention-3 structure on the device layer of
 * core/sm90.cuh, head dims 64, 128 and 256, f16 and bf16, every mask and option of the portable
 * kernel (attention.cuh: its header has the math and the mask
 * convention; the transform, mask and online softmax are attention_softmax.cuh's, shared).
 *
 * Block: a producer warpgroup and CONSUMERS = 2 consumer warpgroups (384 threads, one block per
 * SM), BM = 128 query rows of one (batch, query head), key tiles of BN = 128 keys (80 at head
 * dim 256; in the wide variant, head dim 64 only, 3 consumers, BM = 192, 512 threads;
 * sm90_plan):
 * - Producer (warpgroup CONSUMERS, one thread, 24 registers after setmaxnreg; in the persistent
 *   variant one warp, which finds each work tile's key range): the Q tile once onto q_full, then
 *   per key tile: waits for the stage's k_empty and issues the TMA copies of the K tile (counted
 *   on k_full), then its v_empty and the V tile's (v_full) into the stage. Tensor maps are 4D
 *   (head dim, position, head, batch) with the call's strides, so any strided layout loads
 *   with the same copies, and TMA zero-fills positions past seqlen_q / seqlen_k.
 * - Consumers (warpgroups 0 .. CONSUMERS - 1, 240 registers, 160 with 3):
 *   warpgroup c owns query rows 64c .. 64c + 63.
 *   S = Q K^T is D / 16 wgmma m64nBNk16 (both operands K-major from shared memory, 128-byte swizzle
 *   as TMA writes it); transform, mask and online softmax run in registers (BN / 2 S accumulators
 *   per thread: each warp's 16 rows are an m16 slab in the mma.sync accumulator layout, so
 *   attention_softmax.cuh applies as is); P is packed to the input dtype in place of the A
 *   register fragment (the m64 A fragment of wgmma is that of mma.sync m16n8k16 per warp);
 *   O += P V is BN / 16 x D / PV_N wgmma m64nPV_Nk16 with A from registers and V as an N-major B
 *   operand (transpose bit): PV_N = 128, the whole head dim at 128 as FlashAttention-3 (two
 *   instructions at 256), its B spanning the tile's 64-column halves (one 128-byte swizzle atom
 *   each, the halves' distance in the descriptor's leading byte offset); 64 at head dim 64 and in
 *   the wide tiles (sm90_plan). Pipelined within the warpgroup as FlashAttention-3: per key tile
 *   t (after the first) wait k_full, issue Q K_t^T, wait v_full of tile t - 1, issue P_{t-1} V_{t-1},
 *   wait until only the P V group runs, one arrival per warp on tile t's k_empty (count 8),
 *   softmax of S_t while P V runs, wait for it, one arrival per warp on tile t - 1's v_empty,
 *   O *= alpha_t, pack P_t. K is freed a softmax before V, so a ring of 2 stages (head dim
 *   256) loads K_{t+1} while the consumers still hold V_{t-1}.
 * - Shared memory at head dim 128: Q 32 KiB + 3 stages x (K 32 KiB + V 32 KiB) = 224 KiB, each
 *   64-column half of a tile one TMA box of 128-byte rows. Three stages let the producer load
 *   tile t + 1 while the consumers hold tiles t - 1 (P V) and t (Q K^T). Head dim 256: Q 64 KiB
 *   + 2 stages x 64 KiB (sm90_plan).
 * Key tiles are skipped as in attention.cuh (only the tiles meeting the block's visible key
 * range), the per-element mask runs only on tiles that can hold a masked pair, and the grid
 * runs query tiles last to first (longest first under a causal mask) within sections of heads
 * whose K and V fit the L2 (sm90_work_of). With one work tile per CTA, each consumer warpgroup
 * stores its O by TMA from its own Q rows, dead after its last Q K^T (the epilogue).
 *
 * The consumers take turns issuing their GEMMs (ping-pong, named barriers), so that one's
 * softmax overlaps the other's GEMMs.
 *
 * Persistent (variant "wgmma_sm90_persistent", head dims 64 and 128): one CTA per SM, CTA c
 * taking work tiles (query tile, head, batch) c, c + grid, ... in the same longest-first order,
 * each computed exactly as above (so the same bits), with the rings carried from one work tile
 * to the next (FlashAttention-3's persistent kernel), and the consumers' pipeline too: a tile's
 * last P V is issued in the same turn as the next tile's first Q K^T, the next tile's first
 * softmax runs while it completes, and the finished tile's epilogue follows while the other
 * warpgroup has the tensor cores, so that a work tile's start and end leave them idle no longer
 * than a key tile does. Q is double-buffered and O staged for its TMA store in a buffer of its
 * own (head dim 128: 2 x 32 + 32 + 2 x 64 KiB, two stages instead of three): work tile k's Q goes
 * into buffer k % 2, which the consumer warps free (q_empty) once the tile's last Q K^T is done,
 * for tile k + 2. The producer warp finds each tile's key range from the band's two ends (closed
 * form; a warp search for documents) and issues its Q and K / V tiles as soon as the buffer and
 * the ring's stages are free, so during the previous tile's last key tiles. Each consumer
 * warpgroup fills its own 64 rows of the mask table per tile, while that tile's first GEMMs run
 * (nothing is handed between parties).
 *
 * Wide (variant "wgmma_sm90_wide", head dim 64): FlashAttention-3's and -4's taller tiles there,
 * one CTA per work tile: three consumer warpgroups (BM = 192) taking turns, so that each softmax
 * overlaps two other warpgroups' GEMMs.
 * Not here (see docs/kernels/attention.md): head dims 80 and 96.
 */
#include "attention.h"

#include "attention_sections.cuh"
#include "attention_sm90.cuh"
#include "attention_softmax.cuh"
#include "common.cuh"
#include "core/sm80.cuh"
#include "core/sm90.cuh"
#include "tkern.h"

namespace {

constexpr int Q_HALF_BYTES = 64 * HALF * 2; /* one consumer's rows, one half: 8 KiB */
constexpr int UNREAD_BYTES = 16;   /* tk_compute_before_wgmma_wait's word */

/* The kernel's three schedules, each a variant: one CTA per work tile (query tile, head, batch;
 * "wgmma_sm90"), one CTA per SM looping over them ("wgmma_sm90_persistent"), and one CTA per work
 * tile of 192 query rows on three consumer warpgroups at head dim 64 ("wgmma_sm90_wide"). */
enum sm90_kind { SM90_ONE_TILE, SM90_PERSISTENT, SM90_WIDE };

/* The tiles at head dim D (64, 128 or 256): each tile is D / 64 halves of 64 columns; a consumer
 * warpgroup owns 64 query rows, two of them BM = 128 (three, 192, in the wide plan at D 64).
 * Up to D 128: BN = 128 keys and 3 stages (Q 32 KiB + 3 x 64 KiB). At D 256 a consumer thread
 * holds 128 O accumulators, so S takes BN = 80 keys (40 accumulators, P 20 registers: FlashAttention-4's
 * tile there, 1.02-1.03x over 64 keys), and a stage of K and V is 80 KiB: 2 stages (Q 64 KiB + 2 x
 * 80 KiB = 224 KiB), the consumers holding tile t - 1 (P V) and tile t (Q K^T) while the producer
 * waits for the first. */
template <int D, sm90_kind KIND> struct sm90_plan {
    static_assert(D % HALF == 0 && D <= 256, "whole 64-column halves; O fits the registers up to 256");
    static_assert(KIND != SM90_WIDE || D == 64, "the wide tiles are head dim 64's");
    static constexpr bool PERSISTENT = KIND == SM90_PERSISTENT;
    static constexpr int CONSUMERS = KIND == SM90_WIDE ? 3 : 2;
    static constexpr int BM = 64 * CONSUMERS;
    static constexpr int THREADS = 128 * (CONSUMERS + 1);
    static constexpr int TABLE_BYTES = BM * 8; /* each row's keys (int2, attention_softmax.cuh's mask) */
    /* Registers per thread after setmaxnreg, within what the launch holds (65536 / THREADS,
     * rounded down to 8: 168 x 384 = 64512, or 128 x 512): 2 x 128 x 240 + 128 x 24; three
     * consumers: 3 x 128 x 160 + 128 x 24 = 64512. */
    static constexpr int CONSUMER_REGS = CONSUMERS == 3 ? 160 : 240;
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8; /* per thread, as ptxas allots them */
    static_assert(CONSUMERS * 128 * CONSUMER_REGS + 128 * PRODUCER_REGS <= LAUNCH_REGS * THREADS,
                  "the warpgroups' registers fit what the launch holds");
    static_assert(CONSUMER_REGS % 8 == 0 && PRODUCER_REGS % 8 == 0 && PRODUCER_REGS >= 24 &&
                      CONSUMER_REGS <= 256 && PRODUCER_REGS <= LAUNCH_REGS && CONSUMER_REGS >= LAUNCH_REGS,
                  "setmaxnreg counts: multiples of 8 in [24, 256], decreasing and increasing");
    static constexpr int HALVES = D / HALF;
    /* The N of O += P V's wgmma: at head dim 128 the whole of it, one m64n128k16 per 16 keys
     * whose B spans the tile's two 64-column halves (FlashAttention-3's; one issue and one read
     * of the A fragment where two m64n64k16 took two), at 256 two of them. */
    static constexpr int PV_N = D == 64 ? 64 : 128;
    static_assert(D % PV_N == 0, "O is whole P V instructions wide");
    static constexpr int BN = D <= 128 ? 128 : 80;
    static constexpr int KV_HALF_BYTES = BN * HALF * 2; /* 16 or 10 KiB */
    static constexpr int Q_BYTES = CONSUMERS * HALVES * Q_HALF_BYTES; /* BM x D */
    static constexpr int KV_BYTES = HALVES * KV_HALF_BYTES;            /* BN x D */
    static constexpr int STAGE_BYTES = 2 * KV_BYTES;
    /* PERSISTENT: two Q buffers, so that the next work tile's Q loads during this one, and a
     * staging buffer for O's TMA store (BM x D, as Q), so that a Q buffer is free once its
     * tile's last Q K^T is done. With one work tile per CTA O goes through the Q rows. */
    static constexpr int Q_BUFFERS = PERSISTENT ? 2 : 1;
    static constexpr int O_STAGING_BYTES = PERSISTENT ? Q_BYTES : 0;
    /* Per Q buffer q_full and q_empty (q_empty used by PERSISTENT, reserved in every plan so that
     * no barrier address falls on the table), and the stages' four. */
    static constexpr int barrier_bytes(int stages) { return (2 * Q_BUFFERS + 4 * stages) * 8; }
    static constexpr int pipe_bytes(int stages) {
        return Q_BUFFERS * Q_BYTES + O_STAGING_BYTES + stages * STAGE_BYTES;
    }
    static constexpr int smem_bytes(int stages) {
        return pipe_bytes(stages) + barrier_bytes(stages) + TABLE_BYTES + UNREAD_BYTES + 1024; /* + alignment */
    }
    /* 3 stages where they fit (BN = 128 with one Q buffer, or two at head dim 64), else 2: the
     * persistent plan at head dim 128 (2 x 32 + 32 + 2 x 64 KiB, FlashAttention-3's two stages
     * there) and head dim 256. */
    static constexpr int STAGES = BN == 128 && smem_bytes(3) <= 227 * 1024 ? 3 : 2;
    static constexpr int BARRIER_BYTES = barrier_bytes(STAGES);
    static constexpr int PIPE_BYTES = pipe_bytes(STAGES);
    static constexpr int SMEM_BYTES = PIPE_BYTES + BARRIER_BYTES + TABLE_BYTES + UNREAD_BYTES + 1024; /* + alignment */
    static_assert(SMEM_BYTES <= 227 * 1024, "one block of the plan fits an sm_90 SM's opt-in shared memory");
    static_assert(Q_HALF_BYTES % 1024 == 0 && KV_HALF_BYTES % 1024 == 0, "swizzle-aligned boxes");
};

struct sm90_params {
    void *o;
    float *lse;
    const float *alibi_slopes;
    int64_t o_sb, o_ss, o_sh;
    int seqlen_q, seqlen_k, heads_q, group, m_blocks, batch;
    int window_left, window_right;
    const float *sinks;
    int chunk, prefix;
    const int *doc_ids;
    int transform; /* softcap or ALiBi: scores are rewritten in natural-log units */
    float scale, softcap, softcap_in, exp_scale;
    int section; /* (batch, query head) pairs per section of the work order (sm90_work_of) */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Work tile `tile` of the grid: (query head, batch, query tile). The (batch, query head) pairs,
 * heads fastest, are cut into sections of p.section pairs whose K and V fit a quarter of the L2
 * (launch_sm90); the grid runs section after section (attention_sections.cuh), within one the
 * query tiles last to first (the longest first under a causal mask, as attention.cuh) and the
 * section's pairs fastest. A wave of CTAs then reads the K / V of one section's heads, which
 * stay in L2 through its query tiles. With the pairs fastest over the whole grid, a wave read
 * those of 132 pairs, evicted before the next query tile came back to them: at head dim 64, B8
 * H16 S2048, by estimate about
 * 1 GiB of K / V from HBM per call (~3 TB/s at the rate measured there). */
struct sm90_work {
    int head, batch, m0, q_rows;
};

template <int BM> __device__ __forceinline__ sm90_work sm90_work_of(const sm90_params &p, unsigned tile) {
    const attn_section_item item = attn_section_walk(tile, (unsigned)p.heads_q * (unsigned)p.batch,
                                                     (unsigned)p.section, (unsigned)p.m_blocks);
    sm90_work w;
    w.head = (int)(item.unit % (unsigned)p.heads_q);
    w.batch = (int)(item.unit / (unsigned)p.heads_q);
    w.m0 = (p.m_blocks - 1 - (int)item.place) * BM;
    w.q_rows = min(BM, p.seqlen_q - w.m0);
    return w;
}

__device__ __forceinline__ attn_mask sm90_mask(const sm90_params &p, int batch) {
    return {p.seqlen_k - p.seqlen_q, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right, p.chunk, p.prefix,
            p.doc_ids ? p.doc_ids + (int64_t)batch * p.seqlen_k : nullptr};
}

#endif

/* The key tiles [x, y) of BN keys that a band of rows visits, given the keys its first and
 * last rows see (attn_fill_table's entries; rows past seqlen_q repeat the last one). */
template <int BN> __device__ __forceinline__ int2 sm90_key_tiles(int2 front, int2 back) {
    const int begin = front.x / BN;
    return make_int2(begin, back.y >= front.x ? back.y / BN + 1 : begin);
}

template <typename T, int D, sm90_kind KIND>
__global__ void __launch_bounds__(sm90_plan<D, KIND>::THREADS, 1)
    attention_sm90_kernel(const __grid_constant__ sm90_params p, const __grid_constant__ CUtensorMap map_q,
                          const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                          const __grid_constant__ CUtensorMap map_o) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using plan = sm90_plan<D, KIND>;
    constexpr bool PERSISTENT = plan::PERSISTENT;
    constexpr int BM = plan::BM, CONSUMERS = plan::CONSUMERS, THREADS = plan::THREADS;
    constexpr int HALVES = plan::HALVES, PV_N = plan::PV_N, BN = plan::BN, STAGES = plan::STAGES,
                  Q_BYTES = plan::Q_BYTES, KV_HALF_BYTES = plan::KV_HALF_BYTES, KV_BYTES = plan::KV_BYTES,
                  STAGE_BYTES = plan::STAGE_BYTES;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t s_q = (tk_smem_address(smem_raw) + 1023) & ~1023u;
    /* Q buffer b at s_q + b Q_BYTES, then (PERSISTENT) O's staging buffer; stage s: K at s_kv +
     * s STAGE_BYTES, V KV_BYTES further */
    const uint32_t s_o = s_q + plan::Q_BUFFERS * Q_BYTES;
    const uint32_t s_kv = s_o + plan::O_STAGING_BYTES;
    const uint32_t q_full = s_q + plan::PIPE_BYTES; /* Q buffer b's at q_full + 8 b */
    const uint32_t k_full = q_full + 8 * plan::Q_BUFFERS, v_full = k_full + 8 * STAGES;
    const uint32_t k_empty = v_full + 8 * STAGES, v_empty = k_empty + 8 * STAGES;
    /* PERSISTENT: Q buffer b (q_empty + 8 b) is free for a next work tile: every consumer warp's
     * last Q K^T of its tile is done. */
    const uint32_t q_empty = v_empty + 8 * STAGES;
    int2 *const table = reinterpret_cast<int2 *>(smem_raw + (q_full - tk_smem_address(smem_raw)) + plan::BARRIER_BYTES);
    float *const unread = reinterpret_cast<float *>(table + BM);

    /* The CTA's work tiles: blockIdx.x, and (PERSISTENT) every gridDim.x-th tile after it (the
     * count is recomputed from the parameters there rather than kept live across the tiles). */
    unsigned tile = blockIdx.x;
    sm90_work w = sm90_work_of<BM>(p, tile);
    const int shift = p.seqlen_k - p.seqlen_q;
    auto next_work = [&]() { /* false once the CTA's tiles are done; always after one without PERSISTENT */
        if constexpr (!PERSISTENT)
            return false;
        tile += gridDim.x;
        if (tile >= (unsigned)p.m_blocks * (unsigned)p.heads_q * (unsigned)p.batch)
            return false;
        w = sm90_work_of<BM>(p, tile);
        return true;
    };

    /* Work tile w's Q into Q buffer b, by the producer's loading thread. */
    auto load_q = [&](int b) {
        const uint32_t full = q_full + 8 * b, dst = s_q + b * Q_BYTES;
        tk_mbarrier_arrive_expect_tx(full, Q_BYTES);
        for (int c = 0; c < CONSUMERS; c++)
            for (int h = 0; h < HALVES; h++)
                tk_tma_load_4d(dst + (HALVES * c + h) * Q_HALF_BYTES, &map_q, h * HALF, w.m0 + 64 * c, w.head,
                               w.batch, full);
    };
    const bool loads = threadIdx.x == CONSUMERS * 128; /* the producer's loading thread */
    if (loads) {
        /* The tensor maps' descriptors, fetched while the barriers are set up and the table
         * filled, ahead of the first copies through them. */
        tk_tma_prefetch_map(&map_q);
        tk_tma_prefetch_map(&map_k);
        tk_tma_prefetch_map(&map_v);
        tk_tma_prefetch_map(&map_o);
        for (int b = 0; b < plan::Q_BUFFERS; b++)
            tk_mbarrier_init(q_full + 8 * b, 1);
        for (int s = 0; s < STAGES; s++) {
            tk_mbarrier_init(k_full + 8 * s, 1);              /* the producer's expect_tx */
            tk_mbarrier_init(v_full + 8 * s, 1);
            tk_mbarrier_init(k_empty + 8 * s, 4 * CONSUMERS); /* one arrival per consumer warp */
            tk_mbarrier_init(v_empty + 8 * s, 4 * CONSUMERS);
        }
        if constexpr (PERSISTENT) {
            for (int b = 0; b < plan::Q_BUFFERS; b++)
                tk_mbarrier_init(q_empty + 8 * b, 4 * CONSUMERS); /* one arrival per consumer warp */
        }
        tk_fence_mbarrier_init();
        /* Q does not depend on the mask: without PERSISTENT its load overlaps the table's fill
         * below (for documents, a search of dependent loads). */
        if constexpr (!PERSISTENT)
            load_q(0);
    }
    if constexpr (!PERSISTENT) /* PERSISTENT: each consumer warpgroup fills its rows per work tile */
        attn_fill_table(sm90_mask(p, w.batch), table, w.m0, w.m0 + w.q_rows - 1, BM, false, threadIdx.x, THREADS);
    __syncthreads(); /* the barriers (and without PERSISTENT the table) */

    /* Through a shuffle from lane 0, so that ptxas knows it is the same in every lane of a warp
     * (threadIdx.x / 128 alone it does not): the Q descriptors built from it then live in
     * uniform registers instead of being moved there before every Q K^T instruction. Not at head
     * dim 256, where ptxas then spilled 8 bytes. */
    const int warpgroup = D <= 128 ? __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0) : (int)(threadIdx.x / 128);
    constexpr int TURN = 1; /* named barriers TURN .. TURN + CONSUMERS - 1: the consumers' turns (0: __syncthreads) */
    /* PERSISTENT: named barriers TABLE_READY + c, consumer warpgroup c's rows of the mask table
     * are filled for the work tile (its 128 threads sync; no other party writes or reads them). */
    constexpr int TABLE_READY = TURN + CONSUMERS;
    static_assert(!PERSISTENT || CONSUMERS == 2, "TABLE_READY's ids end below O_READY");
    /* Named barriers O_READY + c: consumer warpgroup c's O tile is in shared memory (and,
     * PERSISTENT, before that: the previous tile's store has read its staging rows). */
    constexpr int O_READY = TABLE_READY + 2;
    static_assert(O_READY + CONSUMERS <= 16, "named barriers 0 .. 15");
    if (warpgroup == CONSUMERS) {
        tk_setmaxnreg_dec<plan::PRODUCER_REGS>();
        /* One thread: work tile w's Q, then its key tiles [tile_begin, tile_end) through the ring. */
        tk_stage_ring<STAGES> ring = {0, 0};
        auto load_tiles = [&](int tile_begin, int tile_end) {
            const int head_kv = w.head / p.group;
            for (int t = tile_begin; t < tile_end; t++) {
                /* The first round finds every stage free (parity phase ^ 1). K and V of a stage
                 * are freed apart: K once the consumers' Q K^T of it is done, V after their
                 * P V, a softmax later, so the next K into the stage need not wait for that. */
                tk_mbarrier_wait(ring.barrier(k_empty), ring.phase ^ 1);
                const uint32_t k_dst = s_kv + ring.stage * STAGE_BYTES, v_dst = k_dst + KV_BYTES;
                tk_mbarrier_arrive_expect_tx(ring.barrier(k_full), KV_BYTES);
                for (int h = 0; h < HALVES; h++)
                    tk_tma_load_4d(k_dst + h * KV_HALF_BYTES, &map_k, h * HALF, t * BN, head_kv, w.batch,
                                   ring.barrier(k_full));
                tk_mbarrier_wait(ring.barrier(v_empty), ring.phase ^ 1);
                tk_mbarrier_arrive_expect_tx(ring.barrier(v_full), KV_BYTES);
                for (int h = 0; h < HALVES; h++)
                    tk_tma_load_4d(v_dst + h * KV_HALF_BYTES, &map_v, h * HALF, t * BN, head_kv, w.batch,
                                   ring.barrier(v_full));
                ring.next();
            }
        };
        if constexpr (PERSISTENT) {
            /* One warp, running ahead of the consumers as far as the ring and the Q buffers let
             * it: for work tile k its key tiles from the band's two ends (closed form, or the
             * whole warp's document search), then by lane 0 its Q into buffer k % 2 once the
             * consumers' last Q K^T of tile k - 2 is done (q_empty), and its K / V tiles as the
             * ring frees stages. Tile k's Q and first K / V tiles thus load during the consumers'
             * last key tiles of tile k - 1. */
            if (threadIdx.x / 32 != 4 * CONSUMERS)
                return;
            int k = 0;
            do {
                /* The mask's bounds read afresh for each tile: hoisted out of the loop, the
                 * values derived from them spilled in the warp's 24 registers. */
                attn_mask m = sm90_mask(p, w.batch);
                tk_no_hoist(m.window_left);
                tk_no_hoist(m.window_right);
                tk_no_hoist(m.chunk);
                tk_no_hoist(m.prefix);
                int2 front, back;
                attn_band_ends<1>(m, w.m0, w.m0 + w.q_rows - 1, front, back);
                const int2 range = sm90_key_tiles<BN>(front, back);
                if (threadIdx.x % 32 == 0) {
                    tk_mbarrier_wait(q_empty + 8 * (k & 1), ((k >> 1) & 1) ^ 1); /* the first use finds it free */
                    load_q(k & 1);
                    load_tiles(range.x, range.y);
                }
                __syncwarp(); /* the next tile's document search takes the whole warp */
                k++;
            } while (next_work());
        } else if (loads) {
            const int2 range = sm90_key_tiles<BN>(table[0], table[BM - 1]);
            load_tiles(range.x, range.y);
        }
        return;
    }

    tk_setmaxnreg_inc<plan::CONSUMER_REGS>();
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, tq = lane % 4;
    tk_stage_ring<STAGES> ring = {0, 0};

    /* The work tile in flight: one m16 slab per warp (attention_softmax.cuh's MT = 1), O's D / 8
     * n8 slices (PV_N / 8 of them per P V instruction), S of the current key tile, and P as A
     * fragments (key slice kk, 16 keys, is n8 slices 2kk, 2kk + 1). */
    float o[1][D / 8][4];
    float row_max[1][2], row_sum[1][2];
    float s[1][BN / 8][4], alpha[1][2];
    bool rescale; /* whether a row of the warp took a new max in the last softmax */
    uint32_t pa[BN / 16][4];
    auto zero_o = [&]() {
#pragma unroll
        for (int j = 0; j < D / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[0][j][e] = 0.0f;
    };
    auto reset_rows = [&]() {
        for (int r = 0; r < 2; r++) {
            row_max[0][r] = -INFINITY;
            row_sum[0][r] = 0.0f;
        }
    };
    auto issue_pv = [&](tk_stage_ring<STAGES> at) { /* O += P V, committed, not waited for */
        const uint64_t v_desc = tk_wgmma_desc_n_major_sw128(s_kv + at.stage * STAGE_BYTES + KV_BYTES, KV_HALF_BYTES);
        tk_mbarrier_wait(at.barrier(v_full), at.phase);
        tk_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int n = 0; n < D / PV_N; n++) {
                /* Keys 16 kk .. 16 kk + 15 of the halves that hold columns PV_N n .. */
                tk_wgmma_rs<T, PV_N>(*reinterpret_cast<float(*)[PV_N / 8][4]>(&o[0][PV_N / 8 * n]), pa[kk],
                                     tk_wgmma_desc_add(v_desc, n * (PV_N / HALF) * KV_HALF_BYTES + kk * 16 * 128));
            }
        tk_wgmma_commit();
    };
    auto pack_p = [&]() {
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            tk_mma_a_from_acc<T>(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
    };
    /* One arrival per warp on a stage's k_empty (after the wait for its Q K^T) or v_empty (after
     * the wait for its P V), or (PERSISTENT) on a Q buffer's q_empty (after its last Q K^T). */
    auto release = [&](uint32_t barrier) {
        if (lane == 0)
            tk_mbarrier_arrive(barrier);
    };

    /* Epilogue of work tile wt, whose O is complete in o and whose rows' running max and sum are
     * mx, sm: normalise, store O, write lse. O goes through this warpgroup's 64 rows of a staging
     * area in shared memory, in the 128-byte swizzle of the Q box, so that one TMA store per 64
     * columns writes them (rows past seqlen_q fall outside the tensor and are not written): 32
     * conflict-free shared stores per thread at head dim 128 in place of 32 4-byte global stores
     * that each touched 8 rows' lines. The staging area is the warpgroup's Q rows with one work
     * tile per CTA (dead after its last Q K^T), and (PERSISTENT) a buffer of its own, so that the
     * Q buffers are free for the next tiles as soon as their last Q K^T is done; there the
     * store issued for the previous tile must have read the rows first. */
    auto store_o = [&](const sm90_work &wt, uint32_t staging, const float (&mx)[2], const float (&sm)[2]) {
        const int wm0 = wt.m0 + 64 * warpgroup, row0 = wm0 + 16 * warp + g;
        const int64_t lse_row0 = ((int64_t)wt.batch * p.heads_q + wt.head) * p.seqlen_q;
        const float sink2 = p.sinks ? p.sinks[wt.head] * ATTN_LOG2E : -INFINITY;
        if constexpr (PERSISTENT) {
            if (threadIdx.x % 128 == 0)
                tk_bulk_wait_read<0>();
            tk_named_barrier_sync_lanes_apart<128>(O_READY + warpgroup); /* after one lane's wait */
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = sm[r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            float inv, lse;
            attn_finish_row(sum, mx[r] * p.exp_scale, sink2, inv, lse);
            const int i = row0 + 8 * r;
            /* Row 16 warp + g + 8 r of the warpgroup's 64, 16-byte chunk j of each half's
             * 128-byte row, swizzled by the row (its low three bits: g). */
            unsigned char *const row_at =
                smem_raw + (staging - tk_smem_address(smem_raw)) + (16 * warp + g + 8 * r) * 128 + 4 * tq;
#pragma unroll
            for (int h = 0; h < HALVES; h++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    *reinterpret_cast<uint32_t *>(row_at + h * Q_HALF_BYTES + ((j ^ g) << 4)) =
                        tk_pack2<T>(o[0][8 * h + j][2 * r] * inv, o[0][8 * h + j][2 * r + 1] * inv);
            if (i >= p.seqlen_q)
                continue;
            if (p.lse && tq == 0)
                p.lse[lse_row0 + i] = lse;
        }
        tk_fence_proxy_async_shared();
        tk_named_barrier_sync<128>(O_READY + warpgroup);
        if (threadIdx.x % 128 == 0 && wm0 < p.seqlen_q) {
            for (int h = 0; h < HALVES; h++)
                tk_tma_store_4d(&map_o, staging + h * Q_HALF_BYTES, h * HALF, wm0, wt.head, wt.batch);
            tk_bulk_commit();
            if constexpr (!PERSISTENT)
                tk_bulk_wait_read<0>(); /* before the block exits */
        }
    };
    const uint32_t o_staging = s_o + HALVES * warpgroup * Q_HALF_BYTES; /* PERSISTENT */

    /* The key tiles [x, y) of work tile wt: without PERSISTENT from the table the whole CTA
     * filled; PERSISTENT from the band's two ends, as the producer finds them (every lane of the
     * warp calls: the document search), through a shuffle from lane 0 so that ptxas knows that
     * every lane has the same (as warpgroup's): from the band's ends alone it did not, and kept
     * the key loop's ring and descriptors out of the uniform registers (33 R2UR per key tile at
     * head dim 128). */
    auto key_tiles_of = [&](const sm90_work &wt) {
        if constexpr (!PERSISTENT)
            return sm90_key_tiles<BN>(table[0], table[BM - 1]);
        int2 front, back;
        attn_band_ends(sm90_mask(p, wt.batch), wt.m0, wt.m0 + wt.q_rows - 1, front, back);
        int2 range = sm90_key_tiles<BN>(front, back);
        range.x = __shfl_sync(0xffffffffu, range.x, 0);
        range.y = __shfl_sync(0xffffffffu, range.y, 0);
        return range;
    };

    /* PERSISTENT: the work tiles are one pipeline. A tile's last P V is issued in the same turn as
     * the next tile's first Q K^T, and the softmax of that first key tile runs while it completes;
     * the finished tile's epilogue follows, while the other warpgroup has its turn on the tensor
     * cores. With one work tile per CTA, before a tile that sees no key and after the CTA's last
     * tile, the last P V is issued alone and waited for (issue_last_pv; close adds the epilogue).
     * `open`: a finished tile's last P V is still to issue, `finished` that tile. */
    bool open = false;
    sm90_work finished = w;
    auto issue_last_pv = [&]() {
        if (warpgroup == 0)
            tk_named_barrier_sync<256>(TURN);
        issue_pv(ring);
        tk_wgmma_wait<0>();
        tk_wgmma_pin(o[0]);
        release(ring.barrier(v_empty));
        ring.next();
    };
    auto close = [&]() { /* PERSISTENT */
        issue_last_pv();
        store_o(finished, o_staging, row_max[0], row_sum[0]);
    };
    /* The work tiles done: tile k's Q is in buffer k % 2 (PERSISTENT), whose barriers are in
     * phase k / 2. */
    int k = 0;
    do {
        /* Through a shuffle (as warpgroup): from k & 1 alone ptxas rebuilt the Q descriptor in
         * every key tile (11 more uniform instructions per tile at head dim 128). */
        const int q_buffer = PERSISTENT ? __shfl_sync(0xffffffffu, k & 1, 0) : 0;
        const uint32_t q_wg = s_q + q_buffer * Q_BYTES + HALVES * warpgroup * Q_HALF_BYTES;
        const int head = w.head, m0 = w.m0;
        /* PERSISTENT: found before this warpgroup waits for its turn, behind which the search
         * (documents) hides. */
        const int2 range = key_tiles_of(w);
        const int tile_begin = range.x, tile_end = range.y;
        const int row0 = m0 + 64 * warpgroup + 16 * warp + g; /* this thread's rows: row0 and row0 + 8 */
        const float slope = p.alibi_slopes ? p.alibi_slopes[head] : 0.0f;
        /* This warpgroup's first and last rows' keys: the tile classifier's bounds (PERSISTENT:
         * read once prepare has put this tile's rows in the table). */
        int2 front, back;
        if constexpr (!PERSISTENT) {
            front = table[64 * warpgroup];
            back = table[64 * warpgroup + 63];
        }
        /* PERSISTENT: this warpgroup's 64 rows of the mask table for this tile (no other party
         * reads them), while the tile's first GEMMs run. The table's last reads, the previous
         * tile's softmaxes, are behind the turn barrier this warpgroup synced on since (the
         * close's or this tile's) or behind the O_READY of an epilogue. */
        auto prepare = [&]() {
            if constexpr (PERSISTENT) {
                int2 first_keys, last_keys;
                attn_fill_table_rows(sm90_mask(p, w.batch), table, m0, m0 + w.q_rows - 1, 64 * warpgroup, 64,
                                     threadIdx.x % 128, 128, first_keys, last_keys);
                tk_named_barrier_sync<128>(TABLE_READY + warpgroup);
                front = table[64 * warpgroup];
                back = table[64 * warpgroup + 63];
            }
        };

        /* Descriptors: each tile's built once, then stepped per k slice (tk_wgmma_desc_add). */
        const uint64_t q_desc = tk_wgmma_desc_sw128(q_wg);
        auto issue_qk = [&](tk_stage_ring<STAGES> at) { /* S = Q K^T, committed, not waited for */
            const uint64_t k_desc = tk_wgmma_desc_sw128(s_kv + at.stage * STAGE_BYTES);
            tk_mbarrier_wait(at.barrier(k_full), at.phase);
            tk_wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) {
                const uint32_t off = (ks % 4) * 32; /* k16 slice inside the swizzled row */
                tk_wgmma_ss<T, BN>(s[0], tk_wgmma_desc_add(q_desc, (ks / 4) * Q_HALF_BYTES + off),
                                   tk_wgmma_desc_add(k_desc, (ks / 4) * KV_HALF_BYTES + off), ks > 0);
            }
            tk_wgmma_commit();
        };
        auto softmax = [&](int t) { /* transform, mask, online softmax of S; alpha for O */
            const int n0 = t * BN;
            const int col0 = n0 + 2 * tq;
            if (p.transform)
                attn_transform_scores(s, p.softcap, p.softcap_in, p.scale, p.alibi_slopes != nullptr, slope, row0,
                                      col0, shift);
            /* Uniform over the warpgroup: can any pair of this tile be invisible to its rows? */
            if (attn_tile_partial(n0, BN, front, back)) {
                if (n0 >= back.x) /* the tile starts at or past every row's first key */
                    attn_mask_scores<1, BN / 8, false>(s, row0, col0, table, m0);
                else
                    attn_mask_scores(s, row0, col0, table, m0);
            }
            rescale = attn_softmax_scores(s, row_max, row_sum, p.exp_scale, alpha);
        };
        /* Intra-warpgroup pipelining (FlashAttention-3): the Q K^T of tile t and the P V of tile
         * t - 1 are in flight together while this warpgroup waits for the first, then the softmax
         * of tile t runs while the tensor cores finish the second; O takes tile t's alpha after.
         * Ping-pong between the warpgroups (FlashAttention-3): they take turns issuing a tile's two
         * GEMMs, so that one's softmax runs while the tensor cores do another's GEMMs. Warpgroup c
         * issues after named barrier TURN + c (its 128 threads sync, the previous one's 128 arrive)
         * and then arrives on the next one's, c + 1 (mod CONSUMERS). All run the same tiles. The
         * turns start with the first Q K^T: warpgroup 0 issues it, then each next one after the
         * previous one's, so that each first softmax runs while the next warpgroup's Q K^T is on
         * the tensor cores (issued together, the first softmaxes ran together with the tensor
         * cores idle, a cost of every work tile). Warpgroup 0 takes the last one's last arrival
         * in the close. */
        tk_mbarrier_wait(q_full + 8 * q_buffer, PERSISTENT ? (k >> 1) & 1 : 0);
        if (!open) {
            zero_o();
            reset_rows();
        }
        if (tile_begin < tile_end) {
            if (open) {
                /* The previous tile's last P V beside this tile's first Q K^T, in one turn; its
                 * epilogue follows this tile's first softmax. */
                const tk_stage_ring<STAGES> prev = ring;
                ring.next();
                tk_named_barrier_sync<256>(TURN + warpgroup);
                issue_qk(ring);
                issue_pv(prev);
                tk_named_barrier_arrive<256>(TURN + 1 - warpgroup);
                prepare();
                tk_wgmma_wait<1>(); /* the Q K^T, committed first */
                tk_wgmma_pin(s[0]);
                release(ring.barrier(k_empty));
                const float finished_max[2] = {row_max[0][0], row_max[0][1]};
                const float finished_sum[2] = {row_sum[0][0], row_sum[0][1]};
                reset_rows();
                softmax(tile_begin); /* O starts from zero: no rescale */
                tk_compute_before_wgmma_wait(row_sum[0][0] + row_sum[0][1], unread);
                tk_wgmma_wait<0>();
                tk_wgmma_pin(o[0]);
                tk_wgmma_pin(pa);
                release(prev.barrier(v_empty));
                store_o(finished, o_staging, finished_max, finished_sum);
                zero_o();
            } else {
                if (warpgroup > 0)
                    tk_named_barrier_sync<256>(TURN + warpgroup);
                issue_qk(ring);
                tk_named_barrier_arrive<256>(TURN + (warpgroup + 1) % CONSUMERS);
                prepare();
                tk_wgmma_wait<0>();
                tk_wgmma_pin(s[0]);
                release(ring.barrier(k_empty));
                softmax(tile_begin); /* O is zero: no rescale */
            }
            pack_p();
            for (int t = tile_begin + 1; t < tile_end; t++) {
                const tk_stage_ring<STAGES> prev = ring;
                ring.next();
                tk_named_barrier_sync<256>(TURN + warpgroup);
                issue_qk(ring);
                issue_pv(prev);
                tk_named_barrier_arrive<256>(TURN + (CONSUMERS == 2 ? 1 - warpgroup : (warpgroup + 1) % CONSUMERS));
                tk_wgmma_wait<1>(); /* the Q K^T, committed first */
                tk_wgmma_pin(s[0]);
                release(ring.barrier(k_empty));
                softmax(t);
                tk_compute_before_wgmma_wait(row_sum[0][0] + row_sum[0][1], unread);
                tk_wgmma_wait<0>();
                tk_wgmma_pin(o[0]);
                tk_wgmma_pin(pa);
                release(prev.barrier(v_empty));
                if (rescale)
                    attn_rescale_o(o, alpha);
                pack_p();
            }
            finished = w;
            if constexpr (PERSISTENT) {
                release(q_empty + 8 * q_buffer); /* the tile's last Q K^T is done */
                open = true;
            } else {
                issue_last_pv();
            }
        } else {
            /* No key: O = 0 (lse -inf, or the sink). */
            if (open) {
                close();
                open = false;
                zero_o();
                reset_rows();
            }
            if constexpr (PERSISTENT)
                release(q_empty + 8 * q_buffer);
        }
        if (!open)
            store_o(w, PERSISTENT ? o_staging : q_wg, row_max[0], row_sum[0]);
        k++;
    } while (next_work());
    if constexpr (PERSISTENT) {
        if (open)
            close();
        if (threadIdx.x % 128 == 0)
            tk_bulk_wait_read<0>(); /* the last work tile's store, before the block exits */
    }
#endif
}

/* ---- host side ---- */

template <typename T, int D, sm90_kind KIND>
cudaError_t launch_sm90(const tk_attention_call *c, const tk_device *dev, cudaStream_t stream) {
    using plan = sm90_plan<D, KIND>;
    CUtensorMap map_q, map_k, map_v, map_o;
    cudaError_t err = attn_tensor_map(&map_q, c->dtype, c->q, D, c->batch, c->seqlen_q, c->heads_q, c->q_stride, 64);
    /* O has Q's shape and boxes (the epilogue stores it from Q's place). */
    if (err == cudaSuccess)
        err = attn_tensor_map(&map_o, c->dtype, c->o, D, c->batch, c->seqlen_q, c->heads_q, c->o_stride, 64);
    if (err == cudaSuccess)
        err = attn_tensor_map(&map_k, c->dtype, c->k, D, c->batch, c->seqlen_k, c->heads_kv, c->k_stride, plan::BN);
    if (err == cudaSuccess)
        err = attn_tensor_map(&map_v, c->dtype, c->v, D, c->batch, c->seqlen_k, c->heads_kv, c->v_stride, plan::BN);
    if (err != cudaSuccess)
        return err;
    constexpr auto kernel = attention_sm90_kernel<T, D, KIND>;
    err = tk_opt_in_smem<kernel>(dev, plan::SMEM_BYTES);
    if (err != cudaSuccess)
        return err;
    sm90_params p;
    p.o = c->o;
    p.lse = c->lse;
    p.alibi_slopes = c->alibi_slopes;
    p.o_sb = c->o_stride[0], p.o_ss = c->o_stride[1], p.o_sh = c->o_stride[2];
    p.seqlen_q = c->seqlen_q;
    p.seqlen_k = c->seqlen_k;
    p.heads_q = c->heads_q;
    p.group = c->heads_q / c->heads_kv;
    p.m_blocks = (c->seqlen_q + plan::BM - 1) / plan::BM;
    p.batch = c->batch;
    /* The work order's sections (sm90_work_of): the query heads of at most as many K / V heads as
     * a quarter of the L2 holds (K and V of one (batch, head): 2 seqlen_k D 16-bit values each),
     * at least one K / V head's (attn_section_size). */
    const int64_t kv_heads =
        attn_section_size((int64_t)c->heads_kv * c->batch, (int64_t)4 * c->seqlen_k * D, dev->l2_bytes / 4, 1);
    p.section = (int)(kv_heads * p.group);
    attn_set_mask(p, c);
    attn_set_score(p, c->scale, c->softcap, c->alibi_slopes != NULL);
    /* One CTA per work tile, or (PERSISTENT) one per SM (the shared memory allows one), each
     * striding over the work tiles. */
    const int64_t tiles = (int64_t)p.m_blocks * c->heads_q * c->batch;
    const unsigned blocks = (unsigned)(plan::PERSISTENT && tiles > dev->sm_count ? dev->sm_count : tiles);
    return tk_launch(kernel, blocks, plan::THREADS, plan::SMEM_BYTES, stream, p, map_q, map_k, map_v, map_o);
}

/* The head dims a schedule takes: all three with one CTA per work tile, 64 and 128 persistent (at
 * 256 two Q buffers of 64 KiB and two stages of 80 KiB do not fit), 64 wide. A plan outside this
 * is never instantiated. */
template <int D, sm90_kind KIND>
constexpr bool sm90_has_plan = KIND == SM90_ONE_TILE || (KIND == SM90_PERSISTENT && D <= 128) || D == 64;

template <int D, sm90_kind KIND> bool sm90_plan_fits(const tk_device *dev) {
    if constexpr (sm90_has_plan<D, KIND>)
        return sm90_plan<D, KIND>::SMEM_BYTES <= dev->max_smem_optin;
    else
        return false;
}

template <sm90_kind KIND> bool sm90_fits(const tk_attention_call *c, const tk_device *dev) {
    /* TMA (src/attention.c has checked the 16-byte alignment). */
    if (!attn_tma_strides(c->q_stride) || !attn_tma_strides(c->k_stride) || !attn_tma_strides(c->v_stride) ||
        !attn_tma_strides(c->o_stride))
        return false;
    switch (c->head_dim) {
    case 64:
        return sm90_plan_fits<64, KIND>(dev);
    case 128:
        return sm90_plan_fits<128, KIND>(dev);
    case 256:
        return sm90_plan_fits<256, KIND>(dev);
    default:
        return false;
    }
}

template <typename T, int D, sm90_kind KIND>
cudaError_t sm90_launch_plan(const tk_attention_call *c, const tk_device *dev, cudaStream_t stream) {
    if constexpr (sm90_has_plan<D, KIND>)
        return launch_sm90<T, D, KIND>(c, dev, stream);
    else
        return cudaErrorInvalidValue; /* sm90_fits takes no such call */
}

template <sm90_kind KIND>
cudaError_t sm90_launch(const tk_attention_call *c, const tk_device *dev, cudaStream_t stream) {
    return tk_dispatch_dtype16(c->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        switch (c->head_dim) {
        case 64:
            return sm90_launch_plan<T, 64, KIND>(c, dev, stream);
        case 128:
            return sm90_launch_plan<T, 128, KIND>(c, dev, stream);
        default: /* 256: sm90_fits took no other */
            return sm90_launch_plan<T, 256, KIND>(c, dev, stream);
        }
    });
}

} // namespace

extern "C" bool tk_attention_supports_sm90(const void *call, const tk_device *dev) {
    return sm90_fits<SM90_ONE_TILE>(static_cast<const tk_attention_call *>(call), dev);
}

extern "C" cudaError_t tk_attention_launch_sm90(const void *call, const tk_device *dev, cudaStream_t stream) {
    return sm90_launch<SM90_ONE_TILE>(static_cast<const tk_attention_call *>(call), dev, stream);
}

extern "C" bool tk_attention_supports_sm90_persistent(const void *call, const tk_device *dev) {
    return sm90_fits<SM90_PERSISTENT>(static_cast<const tk_attention_call *>(call), dev);
}

extern "C" cudaError_t tk_attention_launch_sm90_persistent(const void *call, const tk_device *dev,
                                                           cudaStream_t stream) {
    return sm90_launch<SM90_PERSISTENT>(static_cast<const tk_attention_call *>(call), dev, stream);
}

/* Head dim 64, under every mask: the three consumer warpgroups are what pays (each softmax
 * beside two others' GEMMs; 1.11-1.12x unmasked, and 1.035x forced on a causal call), as in
 * FlashAttention-3 and 4, whose D64 tile is 192 rows. At head dim 128 FlashAttention-3's 176-key
 * tile (calls without a mask) ran behind the 128 x 128 plan (docs/kernels/attention.md, Tried). */
extern "C" bool tk_attention_supports_sm90_wide(const void *call, const tk_device *dev) {
    return sm90_fits<SM90_WIDE>(static_cast<const tk_attention_call *>(call), dev);
}

extern "C" cudaError_t tk_attention_launch_sm90_wide(const void *call, const tk_device *dev, cudaStream_t stream) {
    return sm90_launch<SM90_WIDE>(static_cast<const tk_attention_call *>(call), dev, stream);
}
