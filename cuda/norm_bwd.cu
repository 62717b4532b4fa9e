/*
 * RMSNorm and LayerNorm backward. With the forward's stats (mu = 0 for RMSNorm) per row,
 * xhat = (x - mu) rstd and g = dy w' (w' = w, 1 + w or 1):
 *
 *     dx = rstd (g - mean(g) - xhat mean(g xhat))     (RMSNorm: without the mean(g) term)
 *     dw = sum over rows of dy xhat,   db = sum over rows of dy
 *
 * dw and db are reduced deterministically in two stages: stage 1 (the dx kernel) leaves one
 * f32 partial sum per column for each row group in the caller's workspace ([slots][cols] for
 * dw, then the same for db), each group summing its rows in a fixed order; stage 2
 * (norm_reduce_slots) adds the partials of each column in a fixed order (interleaved sequences
 * of slots, then those sequences by a fixed tree). Same inputs and same device => same bits.
 *
 * Why it is fast: 3 tensors move (x and dy in, dx out); ~20 flops per element: memory-bound,
 * and near the SM's instruction-issue limit as well (a bf16 element has ~30 instructions of
 * issue budget at the copy bandwidth of an H200), so the kernels count instructions too.
 * The ring and rows kernels stride over rows with a grid of at most one occupancy wave (capped
 * by the workspace slots), and a thread always owns the same columns, so it keeps its dw / db
 * partials (2 x 16 floats; ring kernel at 4 packs 2 x 32) in registers across all rows of its
 * group; they leave once per group, not once per row (16-byte stores). For the same reason w'
 * is loaded once, before the row loop.
 * - "ring" kernel (16-bit rows in 16-byte packs whose group is a whole block: more than 512 and at
 *   most 16384 columns, i.e. the "vec16" variant's 16-bit rows except the narrow ones; the launcher
 *   chooses it on the host, and every other shape takes the rows kernel): up to 512 threads, one
 *   row per block at a time. The next row's x and dy go by cp.async into a per-thread 2-stage ring
 *   in shared memory at the top of each iteration, before the wait for the current row, and its
 *   rstd / mean into registers: a block has a row's reads in flight through all of its current
 *   row's work, without holding them in registers. The op (LayerNorm, which of dw / db) is a
 *   template parameter: RMSNorm reduces one value and does no mean arithmetic. So is the pack count
 *   per thread and tensor, chosen on the host from the width (cuda/norm.h):
 *   - 2 packs (16 elements, up to 8192 columns; with 103-128 registers, the ops that keep dw or db,
 *     an SM holds 2 blocks of 256 threads, 16 warps; 3 at 70-78 without): pass 1 converts each
 *     element once and keeps xhat and g = dy w' in f32 registers across the row reduction (one
 *     barrier); w' is held as f32 with Gemma's 1 added; dw / db are accumulated there; pass 2 is
 *     two FMAs and a pack per element. Loop: 243 static SASS instructions per 16 elements for
 *     RMSNorm with dw (bf16 w), 318 for LayerNorm with dw and db (f32 w) (sm_90a).
 *   - 4 packs (32 elements, 8193 to 16384 columns): a 512-thread block may use 128 registers a
 *     thread, and the partials alone take 32 (RMSNorm with dw) to 64 (LayerNorm with dw and
 *     db), which leaves no room for 64 f32 values of xhat and g, nor for w' (32 more). So w' is
 *     written once, as f32 with Gemma's 1 added, into the thread's slots of shared memory past
 *     the ring, and pass 2 converts x and dy again from the stage that pass 1 read (it is
 *     refilled only by the next iteration's copies), one pack at a time (a loop that is not
 *     unrolled: unrolled, the scheduler holds several packs' temporaries beside the partials and
 *     LayerNorm with dw and db spills), with rstd (and for 16-bit rows the mean) folded into the
 *     row's constants: three operations an element (f32 LayerNorm four). 384 bytes of shared
 *     memory a thread: 192 KB for a 16384-wide row, 1 block per SM (H100 / H200; the host
 *     checks the device's limit).
 * - "cluster" mode of the ring kernel (sm_90, the "cluster_vec16" variant: 16-bit rows of 16385
 *   to 131072 columns, f32 rows of 8193 to 65536): a row split into the forward cluster kernel's
 *   slices of at most 32 KB per tensor over the 2 to 8 blocks of a thread-block cluster (a
 *   65536-wide bf16 row on 4), each slice run on the 4-pack plan above (the slice of a block is
 *   at most a 16384-wide 16-bit row: up to 512 threads, 192 KB of shared memory for 16-bit
 *   slices, 160 KB for f32 ones; 1 block of 16 warps per SM), so the row is read from DRAM once,
 *   where the wide kernel reads it twice (the second time mostly from DRAM as well: the card's
 *   Numbers). The slice of x and of dy lands in the ring's stage as one bulk
 *   copy (cp.async.bulk) each, issued by thread 0 a row ahead, so a block keeps 64 KB of reads in
 *   flight through its whole current row, counted on the stage's mbarrier; thread 0 refills a
 *   stage only after a block barrier that follows every thread's last read of it (the end of the
 *   row's pass 2; the row sums already hold the warps together once a row). The row sums
 *   (one for RMSNorm, two for LayerNorm, sent together) go to every block of the cluster by
 *   st.async (norm_cluster_sum, shared with the forward), double-buffered by row, each block adding
 *   the same slots in the same order: every block gets the same bits. The grid is persistent: as
 *   many clusters as are resident (the occupancy query), at most one per row and, with dw / db,
 *   at most the workspace's slots; a cluster takes rows c, c + clusters, ..., and each block keeps
 *   the dw / db partials of its slice's columns in registers across them and leaves them once, in
 *   the cluster's slot, for the same stage 2 (docs/kernels/norm.md, Cluster mode).
 * - "rows" kernel (the rest: f32 packs, scalars, narrow rows): a group of threads holds the
 *   row (norm.cuh), 16 elements per thread for 16-byte packs (2 bf16 / 4 f32 packs) and 8 for
 *   scalars, groups of up to 512 threads (rows up to 8192 / 4096); several narrow groups share
 *   a block. w' is held as stored (16-bit weights two per register: +8 registers for 16
 *   elements, f32 ones +16) rather than re-read from L1 in front of both passes of every row,
 *   except by the f32-pack kernel (why: in the kernel). A group loads its next row into
 *   registers while it reduces and stores the current one, and converts its packs again in
 *   pass 2 (the op is a run-time value there).
 * - "wide" kernels (any width): a 512-thread block per row group; pass A reads the row for the
 *   two row sums, pass B reads it again (L2) for dx and adds into the group's workspace row
 *   (read-modify-write, overwritten on the group's first row: no memset needed), 16 bytes at a
 *   time for 16-byte packs (the same f32 addition per element as one at a time).
 * - Stage 2 reads slots x cols floats (a few MB: ~2-5% of the dx traffic at 16384 x 4096, most
 *   of it from L2), a latency-bound pass unless every SM keeps tens of KB of loads in flight:
 *   lanes of 4 columns (16-byte loads; 1 column where cols is not a multiple of 4) and enough
 *   lanes of slots that each lane issues all of its loads at once (at most 8; more rounds only
 *   past 1024 slots). On sm_90 it is launched as a programmatic dependent of stage 1, so that
 *   its launch overlaps stage 1's last blocks instead of following its end.
 */
#include "core/sm90.cuh"
#include "norm.cuh"

namespace {

constexpr int WIDE_THREADS = 512;
/* Stage 2: lanes of columns per block, loads in flight per lane, the largest block. */
constexpr int REDUCE_COL_LANES = 8, REDUCE_UNROLL = 8, REDUCE_MAX_THREADS = 1024;

template <int VEC> constexpr int bwd_packs() {
    return (VEC > 1 ? TK_NORM_BWD_ELEMS_VEC : TK_NORM_BWD_ELEMS_SCALAR) / VEC;
}

/* Warps in the widest block: the slots of block_sum's shared-memory step. */
constexpr int MAX_WARPS = TK_NORM_ROWS_MAX_THREADS / 32;
/* The ring kernel's narrow plan, LayerNorm's: 2 packs on blocks of at most NARROW_THREADS (16-bit
 * rows of up to 4096 columns), NARROW_BLOCKS of them per SM under the launch bounds (80 registers),
 * with w' in shared memory and xhat, g converted again in pass 2, as at 4 packs: 24 warps per SM
 * where LayerNorm's held form (128 registers) allows 16. RMSNorm keeps its held form (106
 * registers, also 16 warps): it has one row sum, not two, and was slower on this plan
 * (docs/kernels/norm.md: Mapping, Tried). */
constexpr int NARROW_THREADS = 256, NARROW_BLOCKS = 3;

/* N row sums over `width` lanes (a power of two <= 32), returned to each of them. Fixed order. */
template <int N> __device__ __forceinline__ void shuffle_sum(float (&v)[N], int width) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        if (offset < width) {
#pragma unroll
            for (int n = 0; n < N; n++)
                v[n] += __shfl_xor_sync(0xffffffffu, v[n], offset);
        }
}

/* The block step of a row sum whose group is the block, after shuffle_sum over each warp: one
 * shared-memory step behind a single barrier (the partials alternate between two buffers by
 * `parity`, so that a reduction never overwrites partials a slower thread still reads from the
 * previous one), after which lane l takes warp l % MAX_WARPS's partial and 4 shuffle levels add
 * them: every lane ends with the same bits. Fixed order. */
template <int N>
__device__ __forceinline__ void block_sum(float (&v)[N], tk_pack<float, N> (*scratch)[MAX_WARPS], int &parity) {
    tk_pack<float, N> *buf = scratch[parity];
    parity ^= 1;
    const int lane = threadIdx.x & 31, warp = lane % MAX_WARPS;
    if (lane == 0) {
        tk_pack<float, N> mine;
#pragma unroll
        for (int n = 0; n < N; n++)
            mine.v[n] = v[n];
        buf[threadIdx.x >> 5] = mine;
    }
    __syncthreads();
    tk_pack<float, N> part = {};
    if (warp < (int)(blockDim.x >> 5))
        part = buf[warp];
#pragma unroll
    for (int n = 0; n < N; n++)
        v[n] = part.v[n];
    shuffle_sum(v, MAX_WARPS);
}

/* N row sums over the threads of one row's group (norm.cuh's mapping), returned to all of them. */
template <int N>
__device__ __forceinline__ void group_sum(float (&v)[N], int group, tk_pack<float, N> (*scratch)[MAX_WARPS],
                                          int &parity) {
    shuffle_sum(v, group < 32 ? group : 32);
    if (group > 32)
        block_sum(v, scratch, parity);
}

/* A thread's dw or db partials (packs j = lane + p * group, those inside the row) into its
 * group's workspace row `ws`: 16-byte stores where a pack is whole groups of 4 floats (VEC a
 * multiple of 4; cols is then one too, so every workspace row starts on 16 bytes), where 4-byte
 * stores 32 bytes apart across a warp would each touch a sector per lane. */
template <int PACKS, int VEC>
__device__ __forceinline__ void store_partials(float *ws, const float (&acc)[PACKS][VEC], int lane, int group,
                                               int packs_row) {
    constexpr int CHUNK = VEC % 4 == 0 ? 4 : 1;
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const int j = lane + p * group;
        if (j < packs_row) {
#pragma unroll
            for (int k = 0; k < VEC; k += CHUNK) {
                tk_pack<float, CHUNK> chunk;
#pragma unroll
                for (int e = 0; e < CHUNK; e++)
                    chunk.v[e] = acc[p][k + e];
                tk_store_pack<float, CHUNK>(ws + j * VEC + k, chunk);
            }
        }
    }
}

/* A pack's dw or db parts into its columns `ws` of the wide kernel's running sums (the group's
 * workspace row): overwritten on the group's first row, so no memset is needed, else added to.
 * 16-byte loads and stores where the pack is whole groups of 4 floats (as in store_partials),
 * each element the same addition as one at a time. */
template <int VEC>
__device__ __forceinline__ void add_running(float *ws, const float (&part)[VEC], bool first) {
    constexpr int CHUNK = VEC % 4 == 0 ? 4 : 1;
#pragma unroll
    for (int k = 0; k < VEC; k += CHUNK) {
        tk_pack<float, CHUNK> sum;
        if (first) {
#pragma unroll
            for (int e = 0; e < CHUNK; e++)
                sum.v[e] = part[k + e];
        } else {
            sum = tk_load_pack<float, CHUNK>(ws + k);
#pragma unroll
            for (int e = 0; e < CHUNK; e++)
                sum.v[e] += part[k + e];
        }
        tk_store_pack<float, CHUNK>(ws + k, sum);
    }
}

/* The raw w' of pack j of a row: the stored pack of the weight, 1 without one or past the row.
 * f32 weights get gemma's 1 added here, once (the same f32 addition as scale_of's). */
template <typename W, int VEC>
__device__ __forceinline__ tk_pack<W, VEC> load_scale_raw(const W *w, float w_add, int j, int packs_row) {
    tk_pack<W, VEC> r;
    if (w && j < packs_row) {
        r = norm_load_raw<W, VEC>(w, (int64_t)j * VEC);
    } else {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            r.v[e] = tk_from_float<W>(1.0f);
    }
    if constexpr (std::is_same_v<W, float>) {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            r.v[e] += w_add;
    }
    return r;
}

/* w' as f32 from load_scale_raw's pack: 16-bit weights are converted and get gemma's 1 here,
 * at each use (1 + w rounded to 16 bits would lose the low bits of w). */
template <typename W, int VEC>
__device__ __forceinline__ void scale_of(const tk_pack<W, VEC> &raw, float w_add, float (&scale)[VEC]) {
    tk_unpack(raw, scale);
    if constexpr (!std::is_same_v<W, float>) {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            scale[e] += w_add;
    }
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(TK_NORM_ROWS_MAX_THREADS) norm_bwd_rows(tk_norm_call a, int group) {
    constexpr int PACKS = bwd_packs<VEC>();
    /* Prefetch the next row when a tensor's share of the row is at most 8 registers (16-bit
     * packs, scalars): the f32 packs (16 registers per tensor) spilled at the 128-register cap. */
    constexpr bool Prefetch = PACKS * sizeof(tk_pack<T, VEC>) <= 32;
    __shared__ tk_pack<float, 2> scratch[2][MAX_WARPS];
    int parity = 0;
#if __CUDA_ARCH__ >= 900
    /* Stage 2 may start now (programmatic dependent launch): its blocks take the SM space this
     * grid frees and wait in cudaGridDependencySynchronize, which returns once this grid has
     * finished and its partials are visible. Only when a stage 2 follows: a caller's next kernel
     * is not to be let in early. */
    if (a.dw || a.db)
        cudaTriggerProgrammaticLaunchCompletion();
#endif
    const W *w = static_cast<const W *>(a.weight);
    const int packs_row = (int)(a.cols / VEC);
    const int groups_per_block = blockDim.x / group;
    const int local = threadIdx.x / group, lane = threadIdx.x % group;
    const int64_t first_group = (int64_t)blockIdx.x * groups_per_block;
    const int64_t step = (int64_t)gridDim.x * groups_per_block;
    const float inv_n = 1.0f / (float)a.cols;

    float dw_acc[PACKS][VEC], db_acc[PACKS][VEC];
#pragma unroll
    for (int p = 0; p < PACKS; p++)
#pragma unroll
        for (int e = 0; e < VEC; e++)
            dw_acc[p][e] = db_acc[p][e] = 0.0f;

    /* x, dy and the stats of the group's row in the block-row `base` (nothing past the last row). */
    auto load_row = [&](int64_t base, tk_pack<T, VEC> (&xs)[PACKS], tk_pack<T, VEC> (&dys)[PACKS], float &mean,
                        float &rstd) {
        const int64_t row = base + local;
        if (row >= a.rows)
            return;
        /* In-row offsets are 32-bit (cols <= 262144); only the row bases are 64-bit. */
        const T *__restrict__ x_row = static_cast<const T *>(a.x) + row * a.x_stride;
        const T *__restrict__ dy_row = static_cast<const T *>(a.dy) + row * a.y_stride;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int j = lane + p * group;
            if (j < packs_row) {
                xs[p] = tk_load_pack<T, VEC>(x_row + j * VEC);
                dys[p] = tk_load_pack<T, VEC>(dy_row + j * VEC);
            }
        }
        mean = a.layernorm ? a.mean_in[row] : 0.0f;
        rstd = a.rstd_in[row];
    };

    tk_pack<T, VEC> xs[PACKS], dys[PACKS];
    float mean = 0.0f, rstd = 0.0f;
    if constexpr (Prefetch)
        load_row(first_group, xs, dys, mean, rstd);
    /* w' of the thread's columns is the same on every row. The kernels that prefetch (16-bit
     * packs, scalars) load it once and hold it as stored (16-bit weights 2 per register,
     * converted at each use), rather than re-read it from L1 in front of both passes of every
     * row. The f32-pack kernel re-reads it: held, its 16 registers (122 in all, against 97)
     * would cost a block per SM for groups of 64 to 288 threads (f32 rows of 1024 to 4608). */
    constexpr bool HoldScale = Prefetch;
    const float w_add = w && a.gemma ? 1.0f : 0.0f;
    tk_pack<W, VEC> scale_raw[HoldScale ? PACKS : 1];
    if constexpr (HoldScale) {
#pragma unroll
        for (int p = 0; p < PACKS; p++)
            scale_raw[p] = load_scale_raw<W, VEC>(w, w_add, lane + p * group, packs_row);
    }
    auto scale_of_pack = [&](int p, int j, float (&scale)[VEC]) {
        if constexpr (HoldScale)
            scale_of(scale_raw[p], w_add, scale);
        else
            norm_load_scale<W, VEC>(w, a.gemma, j * VEC, scale);
    };
    for (int64_t base = first_group; base < a.rows; base += step) {
        if constexpr (!Prefetch)
            load_row(base, xs, dys, mean, rstd);
        if constexpr (HoldScale)
            keep_packed(scale_raw); /* converted at each use, not held as f32 across the loop */
        const int64_t row = base + local;
        const bool active = row < a.rows;
        T *dx_row = static_cast<T *>(a.dx) + row * a.x_stride;
        float sums[2] = {0.0f, 0.0f}; /* of g xhat, of g */
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int j = lane + p * group;
            if (active && j < packs_row) {
                float scale[VEC];
                scale_of_pack(p, j, scale);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const float xhat = (tk_to_float(xs[p].v[e]) - mean) * rstd;
                    const float d = tk_to_float(dys[p].v[e]);
                    const float g = d * scale[e];
                    sums[0] += g * xhat;
                    sums[1] += g;
                    dw_acc[p][e] += d * xhat;
                    db_acc[p][e] += d;
                }
            }
        }
        /* The next row's loads go out before this row's reduction and dx stores, so that the
         * block keeps reads in flight while it reduces and stores (a persistent block has no
         * other row of its own to overlap with; at 97-128 registers an SM holds only 2 blocks
         * of 256 threads). */
        tk_pack<T, VEC> next_xs[PACKS], next_dys[PACKS];
        float next_mean = 0.0f, next_rstd = 0.0f;
        if constexpr (Prefetch)
            load_row(base + step, next_xs, next_dys, next_mean, next_rstd);
        group_sum<2>(sums, group, scratch, parity);
        const float c_gx = sums[0] * inv_n;
        const float c_g = a.layernorm ? sums[1] * inv_n : 0.0f;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int j = lane + p * group;
            if (active && j < packs_row) {
                float scale[VEC];
                scale_of_pack(p, j, scale);
                tk_pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const float xhat = (tk_to_float(xs[p].v[e]) - mean) * rstd;
                    const float g = tk_to_float(dys[p].v[e]) * scale[e];
                    out.v[e] = tk_from_float<T>(rstd * (g - c_g - xhat * c_gx));
                }
                tk_store_pack<T, VEC>(dx_row + j * VEC, out);
            }
        }
        if constexpr (Prefetch) {
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                xs[p] = next_xs[p];
                dys[p] = next_dys[p];
            }
            mean = next_mean;
            rstd = next_rstd;
        }
    }

    /* The group's partials: groups with no row (past the last one) have nothing to leave. */
    const int64_t slot = first_group + local;
    if (slot >= a.rows || (a.dw == nullptr && a.db == nullptr))
        return;
    if (a.dw)
        store_partials(a.workspace + slot * a.cols, dw_acc, lane, group, packs_row);
    if (a.db)
        store_partials(a.workspace + (a.workspace_slots + slot) * a.cols, db_acc, lane, group, packs_row);
}

/* The ring kernel's x and dy of one pack, from the thread's slots, as f32. */
template <typename T, int VEC>
__device__ __forceinline__ void ring_unpack(const uint4 *x_slot, const uint4 *dy_slot, float (&xf)[VEC],
                                            float (&df)[VEC]) {
    tk_unpack(*reinterpret_cast<const tk_pack<T, VEC> *>(x_slot), xf);
    tk_unpack(*reinterpret_cast<const tk_pack<T, VEC> *>(dy_slot), df);
}

/* xhat = (x - mean) rstd (RMSNorm: x rstd) and g = dy w' of one element. */
template <bool LayerNorm>
__device__ __forceinline__ void ring_element(float x, float dy, float scale, float mean, float rstd, float &xhat,
                                             float &g) {
    xhat = (LayerNorm ? x - mean : x) * rstd;
    g = dy * scale;
}

/* The 4-pack ring kernel's w' of one pack, in its VEC / 4 shared-memory slots `threads` apart. */
template <int VEC>
__device__ __forceinline__ void ring_scale_store(float4 *slot, int threads, const float (&scale)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC / 4; k++)
        slot[k * threads] = make_float4(scale[4 * k], scale[4 * k + 1], scale[4 * k + 2], scale[4 * k + 3]);
}

template <int VEC>
__device__ __forceinline__ void ring_scale_load(const float4 *slot, int threads, float (&scale)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC / 4; k++) {
        const float4 v = slot[k * threads];
        scale[4 * k] = v.x;
        scale[4 * k + 1] = v.y;
        scale[4 * k + 2] = v.z;
        scale[4 * k + 3] = v.w;
    }
}

/* The cluster mode of the ring kernel (norm_bwd_ring<..., Cluster = true>) runs only on sm_90
 * and later ("cluster_vec16" needs cc 9.0): compiled for an older target, its pieces below trap,
 * so that the kernel body has no #if. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define NORM_NO_CLUSTERS
#endif

/* The cluster mode's shared state beside the dynamic ring: the row sums the cluster's blocks
 * exchange (norm_cluster_sum), two buffers used by alternate rows, each warp of each block a slot;
 * the barriers on which they land; and the stages' barriers, on which each stage's two bulk
 * copies land. */
template <int SUMS> struct ring_cluster_state {
    tk_pack<float, SUMS> sums[2][TK_NORM_CLUSTER_MAX_BLOCKS * MAX_WARPS];
    uint64_t landed[2], loaded[2];
};

struct no_cluster_state {};

/* The blocks of the cluster (x) and this block's rank in it (y). */
__device__ __forceinline__ int2 ring_cluster_place() {
#ifdef NORM_NO_CLUSTERS
    __trap();
    return make_int2(1, 0);
#else
    return make_int2(tk_cluster_blocks(), tk_cluster_rank());
#endif
}

/* Thread 0: the barriers, before the first copy (the fence makes the initialisation visible to
 * the copies' and the other blocks' complete_tx). */
template <int SUMS> __device__ __forceinline__ void ring_cluster_init(ring_cluster_state<SUMS> &st) {
#ifdef NORM_NO_CLUSTERS
    __trap();
#else
    for (int k = 0; k < 2; k++) {
        tk_mbarrier_init(tk_smem_address(&st.landed[k]), 1);
        tk_mbarrier_init(tk_smem_address(&st.loaded[k]), 1);
    }
    tk_fence_mbarrier_init();
    tk_fence_proxy_async_shared();
#endif
}

/* Every thread, with the first copies in flight: tk_cluster_start (a trap where clusters do not
 * compile, so that the kernel body has no #if). */
__device__ __forceinline__ void ring_cluster_start() {
#ifdef NORM_NO_CLUSTERS
    __trap();
#else
    tk_cluster_start();
#endif
}

/* Thread 0: a row's slice of x and dy (`bytes` each) into a stage, counted on its barrier (once
 * the stage's readers are done with it: ring_cluster_release). */
template <int SUMS>
__device__ __forceinline__ void ring_cluster_copy(ring_cluster_state<SUMS> &st, int stage, uint32_t x_dst,
                                                  uint32_t dy_dst, const void *x, const void *dy, uint32_t bytes) {
#ifdef NORM_NO_CLUSTERS
    __trap();
#else
    const uint32_t loaded = tk_smem_address(&st.loaded[stage]);
    tk_mbarrier_arrive_expect_tx(loaded, 2 * bytes);
    tk_bulk_load(x_dst, x, bytes, loaded);
    tk_bulk_load(dy_dst, dy, bytes, loaded);
#endif
}

template <int SUMS>
__device__ __forceinline__ void ring_cluster_wait_loaded(ring_cluster_state<SUMS> &st, int stage, uint32_t parity) {
#ifdef NORM_NO_CLUSTERS
    __trap();
#else
    tk_mbarrier_wait(tk_smem_address(&st.loaded[stage]), parity);
#endif
}

/* The row sums over the cluster, row `iteration` of the block's: buffer and barrier iteration %
 * 2, phase parity iteration / 2 % 2. A buffer is written again two rows later, by blocks that
 * have received this block's sums of the row between, which each of its warps sends only after
 * it has read this row's: so no block overwrites sums that another still reads, and the phase
 * in which they land is the next one (the receiver's thread 0 armed this one before its wait). */
template <int SUMS>
__device__ __forceinline__ void ring_cluster_sum(ring_cluster_state<SUMS> &st, float (&sums)[SUMS], int iteration,
                                                 int warps) {
#ifdef NORM_NO_CLUSTERS
    __trap();
#else
    const int k = iteration & 1;
    norm_cluster_sum<SUMS, TK_NORM_CLUSTER_MAX_BLOCKS * MAX_WARPS>(sums, st.sums[k], tk_smem_address(&st.landed[k]),
                                                                   (uint32_t)(iteration >> 1) & 1, warps);
#endif
}

/* Every thread, after its last read of the row's stage, where a later copy refills the stage
 * (`refilled`, uniform): a fence of its reads (generic proxy) against that copy's writes (async
 * proxy), then a block barrier, after which thread 0 issues the copy. A block barrier rather than
 * an mbarrier that the readers arrive on and thread 0 waits for: racecheck does not order
 * shared-memory accesses through mbarrier arrive / wait (tests/support/tk_test.h), and reported
 * the copies' writes against these reads in that form; the row sums already hold the block's
 * warps within a row of each other, so the barrier costs little waiting. */
__device__ __forceinline__ void ring_cluster_release(bool refilled) {
#ifdef NORM_NO_CLUSTERS
    __trap();
#else
    if (!refilled)
        return;
    tk_fence_proxy_async_shared();
    __syncthreads();
#endif
}

/* The ring kernel: rows of one block (see the top of the file), or (Cluster) slices of a row of
 * one thread-block cluster. Each thread's PACKS packs of x and dy for the next row go into its
 * own slots of a 2-stage ring in shared memory (dynamic, laid out [stage][tensor][pack][thread]:
 * tk_norm_bwd_ring_bytes_per_thread), consecutive threads' 16 bytes adjacent (LDS.128 without
 * bank conflicts). The op is compile-time: LayerNorm (the mean and mean(g) terms, two row sums),
 * Dw and Db (which partials are kept). The grid has at most one block (cluster) per row
 * (grid_for, launch_ring_op), so every block has a first row; its loop bound is uniform.
 * PACKS is 2 or 4 (the host's choice from the width; why 4 packs hold less in registers: the
 * top of the file). At 4, w' is f32 in shared memory past the ring, [pack][slot][thread] (VEC / 4
 * 16-byte slots a pack), written once and read in both passes, and pass 2 reads x and dy again
 * from the stage pass 1 read: its next copies are issued in the next iteration, after pass 2's
 * reads have been consumed by its stores.
 * Rows of one block: a thread copies its own slots with cp.async and reads back only what it
 * copied, so its cp.async wait is the only synchronisation; the row sums meet in one block step.
 * Cluster (sm_90, 4 packs): the block of rank r takes packs [r slice_packs, + slice_packs) of
 * the cluster's rows (the last block fewer), rows first_row, + clusters, ...; a row's pack
 * j = p * threads + thread is then also the j-th pack of the slice, so that the slice of each
 * tensor lands in its stage as one contiguous bulk copy (thread 0 issues both, counted on the
 * stage's barrier, after the block barrier that ends the stage's last reads), and the row sums go over
 * the cluster (ring_cluster_sum) instead of the block step. */
template <typename T, typename W, int PACKS, bool LayerNorm, bool Dw, bool Db, bool Cluster, bool Narrow>
__global__ void __launch_bounds__(Narrow ? NARROW_THREADS : TK_NORM_ROWS_MAX_THREADS, Narrow ? NARROW_BLOCKS : 1)
    norm_bwd_ring(tk_norm_call a, int slice_packs) {
    constexpr int VEC = 16 / (int)sizeof(T), SUMS = LayerNorm ? 2 : 1;
    static_assert(Cluster || sizeof(T) == 2, "rows of one block: 16-bit rows, 8 elements per pack");
    static_assert(LayerNorm || !Db, "db is LayerNorm's");
    static_assert(PACKS == 2 || PACKS == TK_NORM_BWD_RING_MAX_PACKS, "the host's plan (tk_norm_bwd_ring_packs)");
    static_assert(!Cluster || PACKS == TK_NORM_BWD_RING_MAX_PACKS, "a cluster's slices: the 4-pack plan");
    static_assert(!Narrow || (PACKS == 2 && !Cluster), "the narrow plan: 2 packs, rows of one block");
    constexpr bool Hold = PACKS == 2 && !Narrow; /* xhat, g and w' held in registers across the reduction */
    constexpr int PASS2_UNROLL = Hold ? PACKS : 1;
    extern __shared__ uint4 ring[];
    __shared__ tk_pack<float, SUMS> scratch[Cluster ? 1 : 2][MAX_WARPS];
    __shared__ std::conditional_t<Cluster, ring_cluster_state<SUMS>, no_cluster_state> cluster;
    static_assert(Cluster ? sizeof(scratch) + sizeof(cluster) <= TK_NORM_BWD_CLUSTER_STATIC_SMEM
                          : sizeof(scratch) <= TK_NORM_BWD_RING_STATIC_SMEM,
                  "the host's shared-memory check");
    int parity = 0;
#if __CUDA_ARCH__ >= 900
    if constexpr (Dw || Db)
        cudaTriggerProgrammaticLaunchCompletion(); /* as in norm_bwd_rows */
#endif
    const int threads = blockDim.x, warps = threads / 32;
    /* The block's columns: [col0, col0 + packs * VEC) of every row it takes. */
    int blocks = 1, col0 = 0, packs = (int)(a.cols / VEC);
    if constexpr (Cluster) {
        const int2 place = ring_cluster_place();
        blocks = place.x;
        col0 = place.y * slice_packs * VEC;
        packs = min(slice_packs, packs - col0 / VEC);
    }
    const float inv_n = 1.0f / (float)a.cols;
    /* Rows first_row, first_row + row_step, ...; the block (cluster) leaves its partials in slot
     * first_row. Running pointers to the thread's first pack (in a cluster: to the slice) in the
     * row in flight (x, dy) and to the thread's first pack in the row being written (dx), each
     * advanced by a row step; pack p is p * threads packs on. */
    const int64_t first_row = blockIdx.x / blocks, row_step = gridDim.x / blocks;
    int64_t row = first_row;
    const int64_t x_step = row_step * a.x_stride, y_step = row_step * a.y_stride;
    const unsigned thread_col = Cluster ? 0u : threadIdx.x * VEC;
    const T *x_next = static_cast<const T *>(a.x) + row * a.x_stride + col0 + thread_col;
    const T *dy_next = static_cast<const T *>(a.dy) + row * a.y_stride + col0 + thread_col;
    T *dx_row = static_cast<T *>(a.dx) + row * a.x_stride + col0 + threadIdx.x * VEC;
    /* The thread's slots of a stage: tensor t, pack p at [(t * PACKS + p) * threads]. The stage
     * being filled and the one being read swap every row. */
    uint4 *fill = ring + threadIdx.x, *held = fill + 2 * PACKS * threads;
    /* At 4 packs, the thread's w' past the ring: pack p's VEC values in VEC / 4 16-byte slots. */
    float4 *const scale_slots = reinterpret_cast<float4 *>(ring + 2 * 2 * PACKS * threads) + threadIdx.x;
    const uint32_t bytes = (uint32_t)packs * 16;

    /* Packs past the block's columns (the last threads' last packs, where they are not a multiple
     * of PACKS * threads packs) are never copied: their slots hold zeros from here on, so they add
     * nothing to the sums (g = 0) and need no test in pass 1. A thread's first pack is always
     * inside: threads <= packs for every row (slice) this kernel takes (at least 65 packs; a
     * cluster's slices over 1000). */
    bool inside[PACKS];
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        inside[p] = p == 0 || (int)threadIdx.x + p * threads < packs;
        if (!inside[p]) {
#pragma unroll
            for (int t = 0; t < 2; t++)
                fill[(t * PACKS + p) * threads] = held[(t * PACKS + p) * threads] = make_uint4(0, 0, 0, 0);
        }
    }
    /* x and dy of the next row into `fill`: per thread, one commit group per row (an empty one
     * past the last row, so that the wait below always leaves exactly the newest group in
     * flight); in a cluster, thread 0's two bulk copies into stage `iteration + 1` (mod 2), which
     * the iteration before released (ring_cluster_release; nothing read it before iteration 1). */
    auto issue = [&](bool any, int iteration) {
        if constexpr (Cluster) {
            const uint4 *stage = fill - threadIdx.x;
            if (any && threadIdx.x == 0)
                ring_cluster_copy(cluster, (iteration + 1) & 1, tk_smem_address(stage),
                                  tk_smem_address(stage + PACKS * threads), x_next, dy_next, bytes);
        } else {
            if (any) {
#pragma unroll
                for (int p = 0; p < PACKS; p++) {
                    if (inside[p]) {
                        tk_cp_async_16(tk_smem_address(fill + p * threads), x_next + p * threads * VEC);
                        tk_cp_async_16(tk_smem_address(fill + (PACKS + p) * threads), dy_next + p * threads * VEC);
                    }
                }
            }
            tk_cp_async_commit();
        }
        x_next += x_step;
        dy_next += y_step;
    };

    if constexpr (Cluster) {
        if (threadIdx.x == 0)
            ring_cluster_init(cluster);
    }
    issue(true, -1);
    if constexpr (Cluster)
        ring_cluster_start();
    /* w' as f32 with Gemma's 1 added, once: at 2 packs held across the loop (16 registers:
     * keep_f32), at 4 in shared memory, read at each use; the loop converts nothing but the row
     * itself. */
    const W *w = static_cast<const W *>(a.weight);
    if constexpr (Cluster) {
        if (w)
            w += col0;
    }
    const float w_add = w && a.gemma ? 1.0f : 0.0f;
    float scale[PACKS][VEC];
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        scale_of(load_scale_raw<W, VEC>(w, w_add, threadIdx.x + p * threads, packs), w_add, scale[p]);
        if constexpr (!Hold)
            ring_scale_store(scale_slots + VEC / 4 * p * threads, threads, scale[p]);
    }
    float dw_acc[PACKS][VEC] = {}, db_acc[PACKS][VEC] = {};
    float rstd = a.rstd_in[row], mean = LayerNorm ? a.mean_in[row] : 0.0f;

    for (int iteration = 0; row < a.rows; row += row_step, iteration++) {
        /* The next row's copies go out before this row is waited for (the stage they fill was
         * last read in the previous iteration), and its stats with them: a block keeps a row of
         * reads in flight through all of this row's work. */
        const int64_t next = row + row_step;
        uint4 *const swap = fill;
        fill = held;
        held = swap;
        issue(next < a.rows, iteration);
        float next_rstd = 0.0f, next_mean = 0.0f;
        if (next < a.rows) {
            next_rstd = a.rstd_in[next];
            if constexpr (LayerNorm)
                next_mean = a.mean_in[next];
        }
        if constexpr (Cluster)
            ring_cluster_wait_loaded(cluster, iteration & 1, (uint32_t)(iteration >> 1) & 1);
        else
            tk_cp_async_wait<1>();
        if constexpr (Hold) {
#pragma unroll
            for (int p = 0; p < PACKS; p++)
                keep_f32(scale[p]);
        }

        /* Pass 1 converts each element (at 2 packs once: xhat and g stay f32 across the row
         * reduction). */
        float xhat[Hold ? PACKS : 1][VEC], g[Hold ? PACKS : 1][VEC], sums[SUMS] = {}; /* of g xhat (, of g) */
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int h = Hold ? p : 0;
            float xf[VEC], df[VEC];
            ring_unpack<T>(held + p * threads, held + (PACKS + p) * threads, xf, df);
            if constexpr (!Hold)
                ring_scale_load(scale_slots + VEC / 4 * p * threads, threads, scale[h]);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                ring_element<LayerNorm>(xf[e], df[e], scale[h][e], mean, rstd, xhat[h][e], g[h][e]);
                sums[0] += g[h][e] * xhat[h][e];
                if constexpr (LayerNorm)
                    sums[1] += g[h][e];
                if constexpr (Dw)
                    dw_acc[p][e] += df[e] * xhat[h][e];
                if constexpr (Db)
                    db_acc[p][e] += df[e];
            }
        }
        if constexpr (Cluster) {
            ring_cluster_sum(cluster, sums, iteration, warps);
        } else {
            shuffle_sum(sums, 32);
            block_sum(sums, scratch, parity);
        }
        /* dx = rstd (g - mean(g) - xhat mean(g xhat)) as rstd g + k0 - xhat kx: two FMAs. */
        const float kx = rstd * (sums[0] * inv_n);
        const float k0 = LayerNorm ? -rstd * (sums[SUMS - 1] * inv_n) : 0.0f;
        /* Unheld, pass 2 starts again from x and dy as stored, so rstd goes into the row's
         * constants rather than into xhat and g: dx = (rstd w') dy - xk (x - mean) + k0 with
         * xk = rstd kx, three operations an element for RMSNorm and four for LayerNorm, where
         * forming xhat and g first took four and five. 16-bit rows fold the mean as well,
         * dx = (rstd w') dy - xk x + c0 with c0 = k0 + xk mean: three for LayerNorm too. That
         * sum cancels when |mean| is large against the row's spread: c0's rounding, up to
         * |mean| |xk| 2^-24, stays below the rounding of a bf16 / f16 dx as long as such x can
         * resolve the spread at all (|mean| / std below 2^8 / 2^11), but not below the 1e-5 of
         * an f32 dx at a mean of 1000 and std 1, so f32 rows keep x - mean
         * (docs/kernels/norm.md, Numerics of pass 2). */
        const float xk = rstd * kx;
        constexpr bool FoldMean = LayerNorm && sizeof(T) == 2;
        const float c0 = FoldMean ? fmaf(mean, xk, k0) : k0;
        /* At 4 packs a pack at a time, converted again (see above). */
#pragma unroll PASS2_UNROLL
        for (int p = 0; p < PACKS; p++) {
            if (Hold ? inside[p] : p == 0 || (int)threadIdx.x + p * threads < packs) {
                float out[VEC];
                if constexpr (Hold) {
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        out[e] = fmaf(-xhat[p][e], kx, fmaf(rstd, g[p][e], k0));
                } else {
                    float xf[VEC], df[VEC];
                    ring_unpack<T>(held + p * threads, held + (PACKS + p) * threads, xf, df);
                    ring_scale_load(scale_slots + VEC / 4 * p * threads, threads, scale[0]);
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const float centred = LayerNorm && !FoldMean ? xf[e] - mean : xf[e];
                        out[e] = fmaf(rstd * scale[0][e], df[e], fmaf(-xk, centred, c0));
                    }
                }
                tk_store_pack<T, VEC>(dx_row + p * threads * VEC, tk_pack_of<T>(out));
            }
        }
        if constexpr (Cluster)
            ring_cluster_release(row + 2 * row_step < a.rows); /* refilled by the row after next */
        dx_row += x_step;
        rstd = next_rstd;
        mean = next_mean;
    }

    /* The partials of the block's columns, in slot first_row (one per block, or per cluster).
     * No cluster barrier before the exit: a block's last wait (ring_cluster_sum) returns only
     * once everything the other blocks send it has landed, and nothing is sent after it. */
    if constexpr (Dw)
        store_partials(a.workspace + first_row * a.cols + col0, dw_acc, threadIdx.x, threads, packs);
    if constexpr (Db)
        store_partials(a.workspace + (a.workspace_slots + first_row) * a.cols + col0, db_acc, threadIdx.x, threads,
                       packs);
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(WIDE_THREADS) norm_bwd_wide(tk_norm_call a) {
#if __CUDA_ARCH__ >= 900
    if (a.dw || a.db)
        cudaTriggerProgrammaticLaunchCompletion(); /* as in norm_bwd_rows */
#endif
    __shared__ float scratch[32];
    const T *__restrict__ x = static_cast<const T *>(a.x);
    const T *__restrict__ dy = static_cast<const T *>(a.dy);
    const W *w = static_cast<const W *>(a.weight);
    T *dx = static_cast<T *>(a.dx);
    const int64_t packs_row = a.cols / VEC;
    const float inv_n = 1.0f / (float)a.cols;
    float *ws_w = a.workspace + (int64_t)blockIdx.x * a.cols;
    float *ws_b = a.workspace + (a.workspace_slots + blockIdx.x) * a.cols;

    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const bool first = row == blockIdx.x;
        const T *x_row = x + row * a.x_stride;
        const T *dy_row = dy + row * a.y_stride;
        const float mean = a.layernorm ? a.mean_in[row] : 0.0f;
        const float rstd = a.rstd_in[row];
        float sum_gx = 0.0f, sum_g = 0.0f;
        for (int64_t j = threadIdx.x; j < packs_row; j += blockDim.x) {
            const tk_pack<T, VEC> xs = tk_load_pack<T, VEC>(x_row + j * VEC);
            const tk_pack<T, VEC> ds = tk_load_pack<T, VEC>(dy_row + j * VEC);
            float scale[VEC];
            norm_load_scale<W, VEC>(w, a.gemma, j * VEC, scale);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float g = tk_to_float(ds.v[e]) * scale[e];
                sum_gx += g * (tk_to_float(xs.v[e]) - mean) * rstd;
                sum_g += g;
            }
        }
        const float c_gx = tk_block_sum(sum_gx, scratch) * inv_n;
        const float c_g = a.layernorm ? tk_block_sum(sum_g, scratch) * inv_n : 0.0f;
        for (int64_t j = threadIdx.x; j < packs_row; j += blockDim.x) {
            const tk_pack<T, VEC> xs = tk_load_pack<T, VEC>(x_row + j * VEC);
            const tk_pack<T, VEC> ds = tk_load_pack<T, VEC>(dy_row + j * VEC);
            float scale[VEC];
            norm_load_scale<W, VEC>(w, a.gemma, j * VEC, scale);
            tk_pack<T, VEC> out;
            float dw_part[VEC], db_part[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float xhat = (tk_to_float(xs.v[e]) - mean) * rstd;
                const float d = tk_to_float(ds.v[e]);
                out.v[e] = tk_from_float<T>(rstd * (d * scale[e] - c_g - xhat * c_gx));
                dw_part[e] = d * xhat;
                db_part[e] = d;
            }
            tk_store_pack<T, VEC>(dx + row * a.x_stride + j * VEC, out);
            if (a.dw)
                add_running(ws_w + j * VEC, dw_part, first);
            if (a.db)
                add_running(ws_b + j * VEC, db_part, first);
        }
    }
}

/* Stage 2: out[c] = sum over slots s < used of partials[s][c]; blockIdx.y = 0 for dw, 1 for db.
 * A block is REDUCE_COL_LANES lanes of CV columns each (CV = 4: 16-byte loads) by blockDim.x /
 * REDUCE_COL_LANES lanes of slots. Lane (cl, sl) adds slots sl, sl + slot_lanes, ... in that
 * order, REDUCE_UNROLL loads issued before their adds; the 4 slot lanes of a warp then add by a
 * fixed shuffle tree, and the warps' sums meet in shared memory, added in warp order. The order
 * depends on the block size only, which the launcher derives from the shape and the slot count:
 * the same inputs on the same device give the same bits. */
template <typename W, int CV>
__global__ void __launch_bounds__(REDUCE_MAX_THREADS) norm_reduce_slots(tk_norm_call a, int64_t used) {
#if __CUDA_ARCH__ >= 900
    /* Launched early (programmatic dependent launch): no partial is read before stage 1 has
     * finished. Every block waits, so this grid never completes before stage 1 does. */
    cudaGridDependencySynchronize();
#endif
    constexpr int COLS = REDUCE_COL_LANES * CV;
    __shared__ float part[REDUCE_MAX_THREADS / 32][COLS];
    W *out = static_cast<W *>(blockIdx.y == 0 ? a.dw : a.db);
    if (out == nullptr)
        return; /* uniform per block */
    const float *ws = a.workspace + (blockIdx.y == 0 ? 0 : a.workspace_slots * a.cols);
    const int cl = threadIdx.x % REDUCE_COL_LANES, sl = threadIdx.x / REDUCE_COL_LANES;
    const int slot_lanes = blockDim.x / REDUCE_COL_LANES;
    const int64_t c = (int64_t)blockIdx.x * COLS + cl * CV; /* cols is a multiple of CV */
    float sum[CV];
#pragma unroll
    for (int e = 0; e < CV; e++)
        sum[e] = 0.0f;
    if (c < a.cols) {
        const int64_t lane_step = (int64_t)slot_lanes * a.cols; /* from one of the lane's slots to its next */
        const float *p = ws + sl * a.cols + c;
        for (int64_t s0 = sl; s0 < used; s0 += (int64_t)slot_lanes * REDUCE_UNROLL, p += lane_step * REDUCE_UNROLL) {
            tk_pack<float, CV> v[REDUCE_UNROLL];
#pragma unroll
            for (int u = 0; u < REDUCE_UNROLL; u++)
                if (s0 + (int64_t)u * slot_lanes < used)
                    v[u] = tk_load_pack<float, CV>(p + u * lane_step);
#pragma unroll
            for (int u = 0; u < REDUCE_UNROLL; u++) {
                if (s0 + (int64_t)u * slot_lanes < used) {
#pragma unroll
                    for (int e = 0; e < CV; e++)
                        sum[e] += v[u].v[e];
                }
            }
        }
    }
    /* Lanes l, l + 8, l + 16, l + 24 of a warp hold the same columns (slot lanes 4w .. 4w + 3). */
    static_assert(REDUCE_COL_LANES == 8, "4 slot lanes per warp");
#pragma unroll
    for (int e = 0; e < CV; e++) {
        sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], 8);
        sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], 16);
    }
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    if (threadIdx.x % 32 < REDUCE_COL_LANES) {
#pragma unroll
        for (int e = 0; e < CV; e++)
            part[warp][cl * CV + e] = sum[e];
    }
    __syncthreads();
    const int64_t col = (int64_t)blockIdx.x * COLS + threadIdx.x;
    if (threadIdx.x < COLS && col < a.cols) {
        float total = part[0][threadIdx.x];
        for (int k = 1; k < warps; k++)
            total += part[k][threadIdx.x];
        out[col] = tk_from_float<W>(total);
    }
}

/* Stage 2's launch, behind stage 1 in the stream. Slot lanes: the fewest (at least a warp's 4)
 * that leave each lane at most REDUCE_UNROLL slots, so that its loads go out in one round, up to
 * REDUCE_MAX_THREADS threads (264 slots of 4096 columns: 64 slot lanes, 512 threads, 128 blocks
 * of 32 columns per tensor, ~33 KB of loads in flight each). Where its code waits for stage 1
 * (sm_90+), it is launched with programmatic stream serialization: its launch and block
 * scheduling overlap stage 1's end, which allows it at its start. */
template <typename W, int CV>
cudaError_t launch_reduce_cv(const tk_norm_call *a, int64_t used, const tk_device *dev, cudaStream_t stream) {
    constexpr auto kernel = norm_reduce_slots<W, CV>;
    int slot_lanes = 4;
    while (slot_lanes * REDUCE_COL_LANES < REDUCE_MAX_THREADS && (int64_t)slot_lanes * REDUCE_UNROLL < used)
        slot_lanes *= 2;
    constexpr int cols_per_block = REDUCE_COL_LANES * CV;
    const dim3 grid((unsigned)((a->cols + cols_per_block - 1) / cols_per_block), a->db ? 2 : 1);
    cudaLaunchAttribute early;
    unsigned early_count;
    const cudaError_t err = tk_early_launch<kernel>(dev, &early, &early_count);
    if (err != cudaSuccess)
        return err;
    const cudaLaunchConfig_t cfg = tk_launch_config(grid, slot_lanes * REDUCE_COL_LANES, 0, stream, &early, early_count);
    return tk_launch(cfg, kernel, *a, used);
}

/* 16-byte loads where every workspace row starts on 16 bytes (cols a multiple of 4). */
template <typename W>
cudaError_t launch_reduce(const tk_norm_call *a, int64_t used, const tk_device *dev, cudaStream_t stream) {
    if (a->dw == nullptr && a->db == nullptr)
        return cudaSuccess;
    return a->cols % 4 == 0 ? launch_reduce_cv<W, 4>(a, used, dev, stream)
                            : launch_reduce_cv<W, 1>(a, used, dev, stream);
}

/* Blocks for the row groups of `groups_per_block`: at most one wave, and with dw / db at most
 * the workspace's slots (min(rows, slots) groups leave partials). */
template <auto Kernel>
cudaError_t grid_for(const tk_norm_call *a, const tk_device *dev, int threads, int groups_per_block, size_t smem,
                     int64_t *blocks_out) {
    int64_t wave;
    const cudaError_t err = tk_wave_blocks<Kernel>(dev, threads, smem, &wave);
    if (err != cudaSuccess)
        return err;
    int64_t blocks = (a->rows + groups_per_block - 1) / groups_per_block;
    if (blocks > wave)
        blocks = wave;
    if ((a->dw || a->db) && blocks * groups_per_block > a->workspace_slots && a->workspace_slots < a->rows)
        blocks = a->workspace_slots / groups_per_block;
    *blocks_out = blocks < 1 ? 1 : blocks;
    return cudaSuccess;
}

/* Clusters of `blocks` blocks of Kernel, `threads` and `smem` each (the call's plan; the shared
 * memory follows from the block size in one instantiation), resident on the device at once, 0 for
 * none (tk_clusters_resident), cached per instantiation, device, cluster size and block size. */
template <auto Kernel>
cudaError_t clusters_resident(const tk_device *dev, int blocks, int threads, size_t smem, int *clusters) {
    static tk_device_cache<(TK_NORM_CLUSTER_MAX_BLOCKS - 1) * MAX_WARPS> cache; /* (blocks - 2, warps - 1) */
    return tk_clusters_resident<Kernel>(dev, cache, (blocks - 2) * MAX_WARPS + threads / 32 - 1,
                                        tk_launch_config(dim3(), threads, smem, nullptr), blocks, clusters);
}

/* The ring kernel of one op: `threads` per row (or per slice of a cluster's row),
 * tk_norm_bwd_ring_bytes_per_thread each. At 2 packs 32 KB for a 4096-wide row (with 103-128
 * registers, 2 blocks of 256 threads per SM by registers, 64 KB of ring, so shared memory does
 * not lower occupancy), 64 KB for 8192 (512 threads); at 4 packs (384 bytes per thread for
 * 16-bit rows) 108 KB for 8200 columns (288 threads) to 192 KB for 16384 (512 threads, 1 block
 * per SM). The opt-in, made once per device and kernel, is the most that the widest block or the
 * device allows (the host checked this shape against the device: tk_norm_bwd_ring_fit,
 * tk_norm_bwd_cluster_fit). *slots: the dw / db slots the grid fills.
 * Rows of one block: the grid is one occupancy wave or fewer (grid_for), as for the rows kernel:
 * each block's partials cover rows b, b + grid, ...
 * Cluster: as many clusters as are resident at once (a persistent grid: a cluster takes rows c,
 * c + clusters, ... and keeps its slice's partials across them), at most one per row, and with dw
 * or db at most the workspace's slots (a 65536-wide row has 64: an H100 holds 33 clusters of 4
 * blocks of 192 KB, one block per SM). With `resident`, nothing is launched: it receives the
 * clusters that fit (the variant's check that the device holds one). */
template <typename T, typename W, int PACKS, bool LayerNorm, bool Dw, bool Db, bool Cluster, bool Narrow>
cudaError_t launch_ring_op(const tk_norm_call *a, int threads, const tk_device *dev, cudaStream_t stream,
                           int64_t *slots, int *resident) {
    constexpr auto kernel = norm_bwd_ring<T, W, PACKS, LayerNorm, Dw, Db, Cluster, Narrow>;
    constexpr int VEC = 16 / (int)sizeof(T);
    const int per_thread = tk_norm_bwd_ring_bytes_per_thread(PACKS, VEC, PACKS > 2 || Narrow),
              smem = threads * per_thread;
    const int static_smem = Cluster ? TK_NORM_BWD_CLUSTER_STATIC_SMEM : TK_NORM_BWD_RING_STATIC_SMEM;
    int opt_in = TK_NORM_ROWS_MAX_THREADS * per_thread;
    if (opt_in > dev->max_smem_optin - static_smem)
        opt_in = dev->max_smem_optin - static_smem;
    const int64_t packs_row = a->cols / VEC;
    cudaError_t err;
    if ((err = tk_opt_in_smem<kernel>(dev, opt_in)) != cudaSuccess)
        return err;
    if constexpr (!Cluster) {
        if ((err = grid_for<kernel>(a, dev, threads, 1, smem, slots)) != cudaSuccess)
            return err;
        return tk_launch(kernel, (unsigned)*slots, threads, smem, stream, *a, (int)packs_row);
    } else {
        const int blocks = tk_norm_cluster_blocks(packs_row);
        int fit;
        if ((err = clusters_resident<kernel>(dev, blocks, threads, (size_t)smem, &fit)) != cudaSuccess)
            return err;
        if (resident) {
            *resident = fit;
            return cudaSuccess;
        }
        int64_t clusters = fit < a->rows ? fit : a->rows;
        if ((a->dw || a->db) && clusters > a->workspace_slots)
            clusters = a->workspace_slots;
        *slots = clusters < 1 ? 1 : clusters; /* none resident: the launch fails, with that error */
        cudaLaunchAttribute cluster = tk_cluster_attribute(blocks);
        const cudaLaunchConfig_t cfg =
            tk_launch_config(dim3((unsigned)(*slots * blocks)), threads, (size_t)smem, stream, &cluster, 1);
        return tk_launch(cfg, kernel, *a, tk_norm_cluster_slice_packs(packs_row));
    }
}

template <typename T, typename W, int PACKS, bool Cluster, bool NarrowLayerNorm = false>
cudaError_t launch_ring_packs(const tk_norm_call *a, int threads, const tk_device *dev, cudaStream_t stream,
                              int64_t *slots, int *resident) {
    const bool dw = a->dw != nullptr, db = a->db != nullptr;
    if (!a->layernorm)
        return dw ? launch_ring_op<T, W, PACKS, false, true, false, Cluster, false>(a, threads, dev, stream, slots, resident)
                  : launch_ring_op<T, W, PACKS, false, false, false, Cluster, false>(a, threads, dev, stream, slots, resident);
    if (db)
        return dw ? launch_ring_op<T, W, PACKS, true, true, true, Cluster, NarrowLayerNorm>(a, threads, dev, stream, slots, resident)
                  : launch_ring_op<T, W, PACKS, true, false, true, Cluster, NarrowLayerNorm>(a, threads, dev, stream, slots, resident);
    return dw ? launch_ring_op<T, W, PACKS, true, true, false, Cluster, NarrowLayerNorm>(a, threads, dev, stream, slots, resident)
              : launch_ring_op<T, W, PACKS, true, false, false, Cluster, NarrowLayerNorm>(a, threads, dev, stream, slots, resident);
}

/* The pack count and block size of the row's plan (cuda/norm.h: 2 packs up to 8192 columns). */
template <typename T, typename W>
cudaError_t launch_ring(const tk_norm_call *a, const tk_device *dev, cudaStream_t stream, int64_t *slots) {
    const int64_t packs_row = a->cols / 8;
    const int threads = tk_norm_bwd_ring_threads(packs_row);
    if (tk_norm_bwd_ring_packs(packs_row) == 2)
        return threads <= NARROW_THREADS
                   ? launch_ring_packs<T, W, 2, false, /*NarrowLayerNorm=*/true>(a, threads, dev, stream, slots, nullptr)
                   : launch_ring_packs<T, W, 2, false>(a, threads, dev, stream, slots, nullptr);
    return launch_ring_packs<T, W, TK_NORM_BWD_RING_MAX_PACKS, false>(a, threads, dev, stream, slots, nullptr);
}

enum bwd_kernel { ROWS, CLUSTER, WIDE };

/* Stage 1 (dx and the partials), then stage 2 (dw / db). "rows": 16-bit rows in packs whose group
 * is a whole block (more than 512 columns, at most 16384) take the ring kernel, the rest the rows
 * kernel. "cluster" (16-byte packs): the ring kernel in cluster mode; with `resident`, only the
 * count of clusters that fit. */
template <typename T, typename W, int VEC>
cudaError_t launch(const tk_norm_call *a, bwd_kernel which, const tk_device *dev, cudaStream_t stream,
                   int *resident) {
    int64_t blocks, groups;
    cudaError_t err;
    if constexpr (VEC > 1) {
        if (which == CLUSTER) {
            const int threads = tk_norm_bwd_cluster_threads(a->cols / VEC);
            if ((err = launch_ring_packs<T, W, TK_NORM_BWD_RING_MAX_PACKS, true>(a, threads, dev, stream, &blocks,
                                                                                 resident)) != cudaSuccess ||
                resident)
                return err;
            return launch_reduce<W>(a, blocks, dev, stream);
        }
    }
    if (which == WIDE) {
        constexpr auto kernel = norm_bwd_wide<T, W, VEC>;
        if ((err = grid_for<kernel>(a, dev, WIDE_THREADS, 1, 0, &blocks)) != cudaSuccess ||
            (err = tk_launch(kernel, (unsigned)blocks, WIDE_THREADS, 0, stream, *a)) != cudaSuccess)
            return err;
        groups = blocks;
    } else {
        constexpr int packs = bwd_packs<VEC>();
        const norm_rows_shape s = norm_shape_for((a->cols / VEC + packs - 1) / packs);
        if constexpr (sizeof(T) == 2 && VEC > 1) {
            if (s.group > 32) { /* blocks <= rows: one slot per block */
                if ((err = launch_ring<T, W>(a, dev, stream, &blocks)) != cudaSuccess)
                    return err;
                return launch_reduce<W>(a, blocks, dev, stream);
            }
        }
        constexpr auto kernel = norm_bwd_rows<T, W, VEC>;
        const int groups_per_block = s.threads / s.group;
        if ((err = grid_for<kernel>(a, dev, s.threads, groups_per_block, 0, &blocks)) != cudaSuccess ||
            (err = tk_launch(kernel, (unsigned)blocks, s.threads, 0, stream, *a, s.group)) != cudaSuccess)
            return err;
        groups = blocks * groups_per_block;
    }
    return launch_reduce<W>(a, groups < a->rows ? groups : a->rows, dev, stream);
}

template <typename T, int VEC>
cudaError_t launch_weight(const tk_norm_call *a, bwd_kernel which, const tk_device *dev, cudaStream_t stream,
                          int *resident) {
    if (a->weight_dtype == TK_F32)
        return launch<T, float, VEC>(a, which, dev, stream, resident);
    return launch<T, T, VEC>(a, which, dev, stream, resident);
}

/* 16-byte packs (vec) or elements; the rows, cluster or wide kernel. */
cudaError_t launch_variant(const void *call, bool vec, bwd_kernel which, const tk_device *dev, cudaStream_t stream,
                           int *resident = nullptr) {
    const tk_norm_call *a = static_cast<const tk_norm_call *>(call);
    return tk_dispatch_dtype(a->dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        return vec ? launch_weight<T, tk_pack_width<T>(true)>(a, which, dev, stream, resident)
                   : launch_weight<T, 1>(a, which, dev, stream, resident);
    });
}

} // namespace

extern "C" cudaError_t tk_launch_norm_bwd_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, true, ROWS, dev, stream);
}

extern "C" cudaError_t tk_launch_norm_bwd_cluster_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, true, CLUSTER, dev, stream);
}

extern "C" bool tk_norm_bwd_cluster_resident(const void *call, const tk_device *dev) {
    int resident = 0;
    return launch_variant(call, true, CLUSTER, dev, nullptr, &resident) == cudaSuccess && resident > 0;
}

extern "C" cudaError_t tk_launch_norm_bwd_scalar(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, false, ROWS, dev, stream);
}

extern "C" cudaError_t tk_launch_norm_bwd_wide_vec16(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, true, WIDE, dev, stream);
}

extern "C" cudaError_t tk_launch_norm_bwd_wide_scalar(const void *call, const tk_device *dev, cudaStream_t stream) {
    return launch_variant(call, false, WIDE, dev, stream);
}
