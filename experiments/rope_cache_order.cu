/*
 * RoPE with angles from a caller's cos / sin cache (issue 3's benchmark shape: 16384 tokens x
 * (32 Q + 8 K heads) x 128, bf16, NeoX, in place, random int64 positions in [0, 131072)), on
 * the H200: make bench measured the cache row at 0.81 of copy where the theta rows reach
 * 0.92-0.95. With a cache a block's angle table is two dependent loads (position, then the
 * cache row at that position); the library issued both after the thread's data loads.
 * Includes cuda/rope.cu to reuse its helpers and to time its launcher ("lib"; in the run of
 * rope_cache_order_h200.txt the branch's kernel was "position first + L2 prefetch two waves
 * ahead", as table O1 5x3 ahead2, 0.808; the library now uses O2, measured here as
 * "table O2 5x3", 0.932).
 *
 *   table O0 5x3    main's order: data loads, then position, then cache row (one f32 per thread)
 *   table O1 5x3    position load first, then data, then the cache row (the library now)
 *   table O2 5x3    position, cache row, then the data loads (the thread waits for the position)
 *   ... 4x4 cacheonly  4 units per thread, 4 blocks of 256 per SM (64 registers), 3 tokens a block,
 *                   the theta branch compiled out (it spills at 64 registers)
 *   ... vfill       the table filled by a quarter of the threads with 16-byte cache loads
 *   ... aheadW      each block also loads the positions of the block W resident waves (W x 3 x
 *                   132 blocks) on, and prefetches that block's cache rows into L2
 *                   (prefetch.global.L2): the later block's chain is two L2 hits, not two DRAM
 *                   round trips; "el": prefetch.global.L2::evict_last, so that the ~30-60 MB of
 *                   data streamed through L2 before the later block runs does not evict them
 *   direct 5x3      no table, no barrier: each unit reads its 8 cos and 8 sin from the cache
 *                   (2 + 2 16-byte loads, L1 / L2 hits after the first head of a token)
 * Theta rows (angles computed, same random positions) for O0, O1 and lib, so that the change
 * of order is seen not to cost them.
 *
 * Time: median of REPS runs, L2 flushed (memset of 2 x L2) before each, cudaEvents; bytes as
 * benchmarks/bench_rope.cu (Q and K read and written, positions, a 512-byte cos + sin row per
 * token); ratio = time of a device-to-device copy of the same bytes (timed before and after the
 * variants) / time. Each variant's output (one run on fresh inputs) is compared with a CPU
 * reference (f64 angles for theta; the cache values for the cache).
 *
 *   nvcc -Iinclude -Icuda -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
 *        experiments/rope_cache_order.cu -o build/rope_cache_order
 */
#include "../cuda/rope.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "experiment.h"

namespace {

constexpr int REPS = 15;
using bf16 = __nv_bfloat16;
constexpr int VEC = 8;

/* The table kernel of cuda/rope.cu (bf16, NeoX, table path) with the order of the angle loads
 * and the fill as parameters. Order: 0 data / position / cache, 1 position / data / cache,
 * 2 position / cache / data. VecFill: 16-byte cache loads by group_tokens x half / 4 threads
 * (cache only). */
template <int Order, int PerThread, int MinBlocks, bool VecFill, bool CacheOnly = false, int Ahead = 0>
__global__ void __launch_bounds__(THREADS, MinBlocks) table_kernel(tk_rope_call a, rope_shape g, int64_t distance) {
    using T = bf16;
    constexpr int Vec = VEC;
    constexpr bool NeoX = true;
    extern __shared__ float4 table_storage[];
    float *const cos_table = reinterpret_cast<float *>(table_storage);
    float *const sin_table = cos_table + g.tokens_per_block * (a.rotary_dim / 2);
    const int64_t heads = a.heads_q + a.heads_k, half = a.rotary_dim / 2;
    const int64_t group = blockIdx.x / g.blocks_per_group, part = blockIdx.x - group * g.blocks_per_group;
    const int64_t first_token = group * g.tokens_per_block;
    const int64_t group_tokens = min(g.tokens_per_block, a.tokens - first_token);
    const int64_t first_unit = part * g.block_units;
    const int end = (int)min(g.block_units, group_tokens * heads * g.units - first_unit);
    const cursor start = cursor_at(first_unit, threadIdx.x, g.units, heads);
    const int tid = threadIdx.x;

    const int per_fill = VecFill ? 4 : 1;          /* pairs a fill step covers */
    const int fills = (int)(group_tokens * half) / per_fill;
    int64_t pos0 = 0;
    float4 c0 = make_float4(0, 0, 0, 0), s0 = c0;
    bool valid0 = true;
    if (Order >= 1 && tid < fills)
        pos0 = token_position(a, first_token + tid * per_fill / half);
    if (Order == 2 && tid < fills) {
        const int64_t i = tid * per_fill % half;
        valid0 = pos0 >= 0 && pos0 < a.max_position;
        const int64_t row = valid0 ? pos0 * a.cache_row_stride + i : 0;
        if (VecFill) {
            c0 = *reinterpret_cast<const float4 *>(a.cos_cache + row);
            s0 = *reinterpret_cast<const float4 *>(a.sin_cache + row);
        } else {
            c0.x = a.cos_cache[row];
            s0.x = a.sin_cache[row];
        }
    }

    /* Ahead: the position of this thread's entry in the block `distance` blocks on, whose cache
     * row this block prefetches into L2 (and whose position load becomes an L2 hit). */
    const int64_t ahead_token = (blockIdx.x + distance) * g.tokens_per_block + tid / half;
    int64_t ahead_pos = -1;
    if (Ahead && tid < g.tokens_per_block * half && ahead_token < a.tokens)
        ahead_pos = token_position(a, ahead_token);

    tk_pack<T, Vec> first[PerThread], second[PerThread];
    cursor c = start;
#pragma unroll
    for (int k = 0; k < PerThread; k++) {
        if (c.index < end) {
            const head_ref r = locate(a, first_token + c.token, c.head);
            const T *in = static_cast<const T *>(r.in) + r.in_offset;
            const int64_t j0 = c.unit * Vec;
            first[k] = tk_load_pack<T, Vec>(in + j0);
            second[k] = tk_load_pack<T, Vec>(in + j0 + half);
        }
        advance(c, g, heads);
    }

    for (int f = tid; f < fills; f += THREADS) {
        const int e = f * per_fill;
        const int token = e / (int)half;
        const int64_t pos = (Order >= 1 && f == tid) ? pos0 : token_position(a, first_token + token);
        const int64_t i = e - token * (int)half;
        if (CacheOnly || a.cos_cache) {
            float4 cv, sv;
            bool valid;
            if (Order == 2 && f == tid) {
                cv = c0;
                sv = s0;
                valid = valid0;
            } else {
                valid = pos >= 0 && pos < a.max_position;
                const int64_t row = valid ? pos * a.cache_row_stride + i : 0;
                if (VecFill) {
                    cv = *reinterpret_cast<const float4 *>(a.cos_cache + row);
                    sv = *reinterpret_cast<const float4 *>(a.sin_cache + row);
                } else {
                    cv.x = a.cos_cache[row];
                    sv.x = a.sin_cache[row];
                }
            }
            if (!valid)
                cv = sv = make_float4(NAN, NAN, NAN, NAN);
            if (a.backward)
                sv = make_float4(-sv.x, -sv.y, -sv.z, -sv.w);
            if (VecFill) {
                *reinterpret_cast<float4 *>(cos_table + e) = cv;
                *reinterpret_cast<float4 *>(sin_table + e) = sv;
            } else {
                cos_table[e] = cv.x;
                sin_table[e] = sv.x;
            }
        } else {
            pair_cos_sin(a, pos, i, &cos_table[e], &sin_table[e]);
        }
    }
    if (Ahead && a.cos_cache && ahead_pos >= 0 && ahead_pos < a.max_position) {
        const int64_t row = ahead_pos * a.cache_row_stride + tid % half;
        if (Ahead == 2) { /* keep them in L2 ahead of the streamed data */
            asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(a.cos_cache + row));
            asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(a.sin_cache + row));
        } else {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a.cos_cache + row));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a.sin_cache + row));
        }
    }
    __syncthreads();

    keep_packed(first);
    keep_packed(second);
    c = start;
    forget(c);
#pragma unroll
    for (int k = 0; k < PerThread; k++) {
        if (c.index < end) {
            const head_ref r = locate(a, first_token + c.token, c.head);
            T *out = static_cast<T *>(r.out) + r.out_offset;
            const int64_t j0 = c.unit * Vec;
            constexpr int STEP = pairs_per_step<Vec>();
#pragma unroll
            for (int e0 = 0; e0 < Vec; e0 += STEP) {
                const tk_pack<float, STEP> cs = *reinterpret_cast<const tk_pack<float, STEP> *>(cos_table + c.token * half + j0 + e0);
                const tk_pack<float, STEP> sn = *reinterpret_cast<const tk_pack<float, STEP> *>(sin_table + c.token * half + j0 + e0);
                rotate_step<T, Vec, NeoX>(first[k], second[k], e0, cs, sn);
                keep_packed(first[k]);
                keep_packed(second[k]);
            }
            tk_store_pack<T, Vec>(out + j0, first[k]);
            tk_store_pack<T, Vec>(out + j0 + half, second[k]);
        }
        advance(c, g, heads);
    }
}

/* No table: each unit's angles straight from the cache (cache calls only). */
template <int PerThread, int MinBlocks>
__global__ void __launch_bounds__(THREADS, MinBlocks) direct_kernel(tk_rope_call a, rope_shape g) {
    using T = bf16;
    constexpr int Vec = VEC;
    const int64_t heads = a.heads_q + a.heads_k, half = a.rotary_dim / 2;
    const int64_t first_token = blockIdx.x * g.tokens_per_block;
    const int64_t group_tokens = min(g.tokens_per_block, a.tokens - first_token);
    const int end = (int)min(g.block_units, group_tokens * heads * g.units);
    const cursor start = cursor_at(0, threadIdx.x, g.units, heads);

    tk_pack<T, Vec> first[PerThread], second[PerThread];
    int64_t pos[PerThread];
    cursor c = start;
#pragma unroll
    for (int k = 0; k < PerThread; k++) {
        if (c.index < end) {
            const head_ref r = locate(a, first_token + c.token, c.head);
            const T *in = static_cast<const T *>(r.in) + r.in_offset;
            const int64_t j0 = c.unit * Vec;
            first[k] = tk_load_pack<T, Vec>(in + j0);
            second[k] = tk_load_pack<T, Vec>(in + j0 + half);
            pos[k] = token_position(a, first_token + c.token);
        }
        advance(c, g, heads);
    }
    keep_packed(first);
    keep_packed(second);
    c = start;
    forget(c);
#pragma unroll
    for (int k = 0; k < PerThread; k++) {
        if (c.index < end) {
            const head_ref r = locate(a, first_token + c.token, c.head);
            T *out = static_cast<T *>(r.out) + r.out_offset;
            const int64_t j0 = c.unit * Vec;
            const bool valid = pos[k] >= 0 && pos[k] < a.max_position;
            const int64_t row = valid ? pos[k] * a.cache_row_stride + j0 : 0;
#pragma unroll
            for (int e0 = 0; e0 < Vec; e0 += 4) {
                tk_pack<float, 4> cs = *reinterpret_cast<const tk_pack<float, 4> *>(a.cos_cache + row + e0);
                tk_pack<float, 4> sn = *reinterpret_cast<const tk_pack<float, 4> *>(a.sin_cache + row + e0);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if (!valid)
                        cs.v[j] = sn.v[j] = NAN;
                    if (a.backward)
                        sn.v[j] = -sn.v[j];
                }
                rotate_step<T, Vec, true>(first[k], second[k], e0, cs, sn);
                keep_packed(first[k]);
                keep_packed(second[k]);
            }
            tk_store_pack<T, Vec>(out + j0, first[k]);
            tk_store_pack<T, Vec>(out + j0 + half, second[k]);
        }
        advance(c, g, heads);
    }
}

tk_device dev;

/* cuda/rope.cu's launch shape for whole tokens per block (the benchmark shape). */
rope_shape shape_for(const tk_rope_call &a, int per_thread) {
    const int64_t heads = a.heads_q + a.heads_k, half = a.rotary_dim / 2;
    rope_shape g;
    g.rot_units = half / VEC;
    g.units = g.rot_units;
    g.block_units = THREADS * per_thread;
    g.tokens_per_block = std::min<int64_t>(g.block_units / (heads * g.units), a.tokens);
    g.blocks_per_group = 1;
    const int64_t rows = THREADS / g.units;
    g.step_unit = THREADS % g.units;
    g.step_head = rows % heads;
    g.step_token = (int)(rows / heads);
    (void)half;
    return g;
}

int64_t blocks_for(const tk_rope_call &a, const rope_shape &g) {
    return (a.tokens + g.tokens_per_block - 1) / g.tokens_per_block;
}

/* Waves: prefetch distance in resident waves (MinBlocks x SMs blocks), 0 = none; EvictLast: the
 * prefetch marks the lines evict_last. */
template <int Order, int PerThread, int MinBlocks, bool VecFill, bool CacheOnly = false, int Waves = 0,
          bool EvictLast = false>
cudaError_t run_table(const tk_rope_call *a) {
    const rope_shape g = shape_for(*a, PerThread);
    const size_t smem = (size_t)(g.tokens_per_block * (a->rotary_dim / 2)) * 2 * sizeof(float);
    const int64_t distance = (int64_t)Waves * MinBlocks * dev.sm_count;
    table_kernel<Order, PerThread, MinBlocks, VecFill, CacheOnly, Waves == 0 ? 0 : EvictLast ? 2 : 1>
        <<<(unsigned)blocks_for(*a, g), THREADS, smem>>>(*a, g, distance);
    return cudaGetLastError();
}

template <int PerThread, int MinBlocks> cudaError_t run_direct(const tk_rope_call *a) {
    const rope_shape g = shape_for(*a, PerThread);
    direct_kernel<PerThread, MinBlocks><<<(unsigned)blocks_for(*a, g), THREADS>>>(*a, g);
    return cudaGetLastError();
}

void *flush_buf;
size_t flush_bytes;

float time_ms(const std::function<cudaError_t()> &f) {
    return experiment_time_ms(f, 3, REPS, flush_buf, flush_bytes);
}

float bf16_to_float(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    float f;
    memcpy(&f, &w, 4);
    return f;
}

uint16_t float_to_bf16(float f) { /* round to nearest even; inputs are finite */
    uint32_t w;
    memcpy(&w, &f, 4);
    return (uint16_t)((w + 0x7fff + ((w >> 16) & 1)) >> 16);
}

struct variant {
    std::string name;
    bool theta_ok, cache_ok;
    std::function<cudaError_t(const tk_rope_call *)> run;
};

} // namespace

int main() {
    CHECK(cudaSetDevice(0));
    dev.ordinal = 0;
    CHECK(cudaDeviceGetAttribute(&dev.sm_count, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaDeviceGetAttribute(&dev.l2_bytes, cudaDevAttrL2CacheSize, 0));
    flush_bytes = 2 * (size_t)dev.l2_bytes;
    CHECK(cudaMalloc(&flush_buf, flush_bytes));

    const int64_t tokens = 16384, hq = 32, hk = 8, hd = 128, half = hd / 2, max_position = 131072;
    const int64_t nq = tokens * hq * hd, nk = tokens * hk * hd, n = nq + nk;
    std::vector<uint16_t> x(n);
    std::vector<int64_t> positions(tokens);
    std::vector<float> cos_h(max_position * half), sin_h(max_position * half);
    uint64_t z = 0x243f6a8885a308d3ull;
    auto next = [&]() {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        return z;
    };
    auto uniform = [&](float lo, float hi) { return lo + (hi - lo) * (float)(next() >> 40) * (1.0f / 16777216.0f); };
    for (auto &v : x)
        v = float_to_bf16(uniform(-2, 2));
    for (auto &p : positions)
        p = (int64_t)(next() % max_position);
    for (auto &v : cos_h)
        v = uniform(-1, 1);
    for (auto &v : sin_h)
        v = uniform(-1, 1);

    bf16 *qk, *pristine;
    int64_t *pos_d;
    float *cos_d, *sin_d;
    CHECK(cudaMalloc(&qk, n * 2));
    CHECK(cudaMalloc(&pristine, n * 2));
    CHECK(cudaMalloc(&pos_d, tokens * 8));
    CHECK(cudaMalloc(&cos_d, cos_h.size() * 4));
    CHECK(cudaMalloc(&sin_d, sin_h.size() * 4));
    CHECK(cudaMemcpy(pristine, x.data(), n * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(pos_d, positions.data(), tokens * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(cos_d, cos_h.data(), cos_h.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(sin_d, sin_h.data(), sin_h.size() * 4, cudaMemcpyHostToDevice));

    tk_rope_call base = {};
    base.dtype = TK_BF16;
    base.style = TK_ROPE_NEOX;
    base.q = base.q_out = qk;
    base.k = base.k_out = qk + nq;
    base.tokens = tokens;
    base.heads_q = hq;
    base.heads_k = hk;
    base.head_dim = base.rotary_dim = hd;
    base.q_strides[0] = base.q_out_strides[0] = hq * hd;
    base.k_strides[0] = base.k_out_strides[0] = hk * hd;
    base.q_strides[1] = base.q_out_strides[1] = base.k_strides[1] = base.k_out_strides[1] = hd;
    base.positions64 = pos_d;
    base.cache_row_stride = half;

    std::vector<variant> vs = {
        {"lib", true, true, [](const tk_rope_call *a) { return tk_launch_rope_vec16(a, &dev, 0); }},
        {"table O0 5x3", true, true, run_table<0, 5, 3, false>},
        {"table O1 5x3", true, true, run_table<1, 5, 3, false>},
        {"table O2 5x3", false, true, run_table<2, 5, 3, false>},
        {"table O1 5x3 vfill", false, true, run_table<1, 5, 3, true>},
        {"table O2 5x3 vfill", false, true, run_table<2, 5, 3, true>},
        {"table O1 5x3 ahead1", true, true, run_table<1, 5, 3, false, false, 1>},
        {"table O1 5x3 ahead2", true, true, run_table<1, 5, 3, false, false, 2>},
        {"table O0 5x3 ahead2", false, true, run_table<0, 5, 3, false, false, 2>},
        {"table O1 5x3 ahead4", false, true, run_table<1, 5, 3, false, false, 4>},
        {"table O1 5x3 ahead1 el", false, true, run_table<1, 5, 3, false, false, 1, true>},
        {"table O1 5x3 ahead2 el", false, true, run_table<1, 5, 3, false, false, 2, true>},
        {"table O1 5x3 ahead4 el", false, true, run_table<1, 5, 3, false, false, 4, true>},
        {"table O1 5x3 cacheonly", false, true, run_table<1, 5, 3, false, true>},
        {"table O1 4x4 cacheonly", false, true, run_table<1, 4, 4, false, true>},
        {"table O2 4x4 cacheonly", false, true, run_table<2, 4, 4, false, true>},
        {"table O2 4x4 vfill co", false, true, run_table<2, 4, 4, true, true>},
        {"direct 5x3", false, true, run_direct<5, 3>},
    };

    const double bytes_theta = (double)n * 2 * 2 + tokens * 8.0, bytes_cache = bytes_theta + tokens * hd * 4.0;
    void *copy_src, *copy_dst;
    CHECK(cudaMalloc(&copy_src, (size_t)(bytes_cache / 2) + 16));
    CHECK(cudaMalloc(&copy_dst, (size_t)(bytes_cache / 2) + 16));
    CHECK(cudaMemset(copy_src, 0x3c, (size_t)(bytes_cache / 2) + 16));
    auto copy_ms = [&](double bytes) {
        return time_ms([&]() { return cudaMemcpyAsync(copy_dst, copy_src, (size_t)(bytes / 2), cudaMemcpyDeviceToDevice); });
    };
    copy_ms(bytes_cache);
    const float copy_before = copy_ms(bytes_cache);
    printf("device: %d SMs, L2 %d MB; median of %d runs, L2 flushed\n", dev.sm_count, dev.l2_bytes >> 20, REPS);
    printf("copy of the cache row's bytes: %.4f ms\n", copy_before);

    std::vector<uint16_t> got(n);
    std::vector<float> ref(n);
    for (int mode = 0; mode < 2; mode++) {
        const bool cache = mode == 1;
        tk_rope_call a = base;
        if (cache) {
            a.cos_cache = cos_d;
            a.sin_cache = sin_d;
            a.max_position = max_position;
        } else {
            a.log2_inv_freq_step = -2.0 * log2(500000.0) / (double)hd;
        }
        /* reference */
        for (int64_t t = 0; t < tokens; t++) {
            double cs[64], sn[64];
            for (int64_t i = 0; i < half; i++) {
                if (cache) {
                    cs[i] = cos_h[positions[t] * half + i];
                    sn[i] = sin_h[positions[t] * half + i];
                } else {
                    const double ang = (double)positions[t] * pow(500000.0, -2.0 * (double)i / (double)hd);
                    cs[i] = cos(ang);
                    sn[i] = sin(ang);
                }
            }
            for (int64_t h = 0; h < hq + hk; h++) {
                const int64_t row = h < hq ? (t * hq + h) * hd : nq + (t * hk + h - hq) * hd;
                for (int64_t i = 0; i < half; i++) {
                    const double x1 = bf16_to_float(x[row + i]), x2 = bf16_to_float(x[row + i + half]);
                    ref[row + i] = (float)(x1 * cs[i] - x2 * sn[i]);
                    ref[row + i + half] = (float)(x2 * cs[i] + x1 * sn[i]);
                }
            }
        }
        const double bytes = cache ? bytes_cache : bytes_theta;
        const float copy = copy_ms(bytes);
        printf("\n%s rows (copy of the same bytes %.4f ms)\n", cache ? "cache" : "theta", copy);
        for (const variant &v : vs) {
            if (!(cache ? v.cache_ok : v.theta_ok))
                continue;
            CHECK(cudaMemcpy(qk, pristine, n * 2, cudaMemcpyDeviceToDevice));
            CHECK(v.run(&a));
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(got.data(), qk, n * 2, cudaMemcpyDeviceToHost));
            double worst = 0;
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) {
                const double d = fabs((double)bf16_to_float(got[i]) - (double)ref[i]);
                /* bf16 rounding: half an ulp is at most 2^-8 |out|; f32 arithmetic and the
                 * angle add < 1e-6 */
                if (!(d <= fabs((double)ref[i]) * (1.0 / 256) + 2e-6))
                    bad++;
                worst = std::max(worst, d);
            }
            const float ms = time_ms([&]() { return v.run(&a); });
            printf("  %-22s %.4f ms  %7.1f GB/s  %.3fx copy   max |diff| %.2e  %s\n", v.name.c_str(), ms,
                   bytes / ms * 1e-6, copy / ms, worst, bad ? "WRONG" : "ok");
            if (bad)
                printf("    %lld elements off\n", (long long)bad);
        }
    }
    printf("\ncopy of the cache row's bytes, again: %.4f ms\n", copy_ms(bytes_cache));
    return 0;
}
