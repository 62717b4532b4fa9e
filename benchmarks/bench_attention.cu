/* Attention forward: bf16 prefill shapes of current models (Llama / Mistral GQA, D 128 and 64; Gemma 2, D 256), each against a cuBLAS-composed
 * attention on the same inputs in the same run, the path people take without a fused kernel:
 *     S = scale Q K^T   cublasGemmBatchedEx, one GEMM per (batch, query head); a GQA group
 *                       points at the same K
 *     P = softmax(S)    masked row softmax in place, in bf16 (the kernel below)
 *     O = P V           cublasGemmBatchedEx
 * TFLOP/s count only visible (query, key) pairs: 4 * batch * heads_q * head_dim * pairs, for
 * both. After timing, our o is compared with the composed one (a wrong fast path shows).
 * Each timing, ours and the composed one, starts from an idle GPU (bench_settle): the composed
 * path runs the H200 at its 700 W power limit, and a row timed right after the previous row's
 * baseline was timed while the clocks recovered from it (window 1024: 245 TFLOP/s against 302
 * after a pause, the same kernel; docs/kernels/attention.md). */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "bench.h"

extern "C" void bench_attention(bench_ctx *ctx);
extern "C" void bench_attention_masks(bench_ctx *ctx);

namespace {

const int SOFTMAX_THREADS = 256;
/* Idle time before each timing (bench_settle): the pause measured to restore the window-1024
 * row (docs/kernels/attention.md). */
const int SETTLE_MS = 300;

/* Merges two (max, sum of exp(x - max)) pairs. */
__device__ void merge_max_sum(float &m, float &l, float m2, float l2) {
    const float mx = fmaxf(m, m2);
    if (mx == -INFINITY)
        return;
    l = (m == -INFINITY ? 0.0f : l * __expf(m - mx)) + (m2 == -INFINITY ? 0.0f : l2 * __expf(m2 - mx));
    m = mx;
}

/* One block per row of S (row = (batch * heads + head) * seqlen_q + i, length seqlen_k, a
 * multiple of 8): P = softmax over the visible keys, 0 elsewhere, written over S. */
__global__ void __launch_bounds__(SOFTMAX_THREADS)
    masked_softmax_rows(__nv_bfloat16 *s, int seqlen_q, int seqlen_k, int window_left, int window_right) {
    const int64_t row = blockIdx.x;
    const int i = (int)(row % seqlen_q), shift = seqlen_k - seqlen_q;
    const int lo = window_left >= 0 ? max(0, i + shift - window_left) : 0;
    const int hi = window_right >= 0 ? min(seqlen_k - 1, i + shift + window_right) : seqlen_k - 1;
    __nv_bfloat16 *x = s + row * seqlen_k;
    float m = -INFINITY, l = 0.0f;
    for (int c = threadIdx.x * 8; c < seqlen_k; c += SOFTMAX_THREADS * 8) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(x + c);
        const __nv_bfloat16 *v = reinterpret_cast<const __nv_bfloat16 *>(&raw);
        for (int e = 0; e < 8; e++)
            if (c + e >= lo && c + e <= hi)
                merge_max_sum(m, l, __bfloat162float(v[e]), 1.0f);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, offset);
        merge_max_sum(m, l, m2, l2);
    }
    __shared__ float warp_m[SOFTMAX_THREADS / 32], warp_l[SOFTMAX_THREADS / 32];
    if (threadIdx.x % 32 == 0) {
        warp_m[threadIdx.x / 32] = m;
        warp_l[threadIdx.x / 32] = l;
    }
    __syncthreads();
    m = warp_m[0];
    l = warp_l[0];
    for (int w = 1; w < SOFTMAX_THREADS / 32; w++)
        merge_max_sum(m, l, warp_m[w], warp_l[w]);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int c = threadIdx.x * 8; c < seqlen_k; c += SOFTMAX_THREADS * 8) {
        uint4 raw = *reinterpret_cast<const uint4 *>(x + c);
        __nv_bfloat16 *v = reinterpret_cast<__nv_bfloat16 *>(&raw);
        for (int e = 0; e < 8; e++) {
            const bool visible = c + e >= lo && c + e <= hi;
            v[e] = __float2bfloat16_rn(visible ? __expf(__bfloat162float(v[e]) - m) * inv : 0.0f);
        }
        *reinterpret_cast<uint4 *>(x + c) = raw;
    }
}

/* out[0] = max |a - b| (NaN counts as infinite), out[1] = max |b|, over n bf16 values; both
 * non-negative floats, so their bits order like unsigned integers. */
__global__ void max_abs_diff(const __nv_bfloat16 *a, const __nv_bfloat16 *b, int64_t n, unsigned *out) {
    float worst = 0.0f, largest = 0.0f;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
        const float d = fabsf(__bfloat162float(a[k]) - __bfloat162float(b[k]));
        worst = d == d ? fmaxf(worst, d) : INFINITY;
        largest = fmaxf(largest, fabsf(__bfloat162float(b[k])));
    }
    atomicMax(&out[0], __float_as_uint(worst));
    atomicMax(&out[1], __float_as_uint(largest));
}

void check_cublas(cublasStatus_t s, const char *what) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench: %s failed: cuBLAS status %d\n", what, (int)s);
        exit(1);
    }
}

struct attn_shape {
    const char *op, *shape;
    int64_t batch, seqlen, heads_q, heads_kv, head_dim;
    int causal;
    int64_t window_left; /* >= 0: through tk_attention_sliding_fwd */
};

struct ours_arg {
    tk_attention_params p;
    int64_t window_left;
};

void run_ours(void *arg, cudaStream_t stream) {
    ours_arg *a = static_cast<ours_arg *>(arg);
    bench_check(a->window_left >= 0 ? tk_attention_sliding_fwd(&a->p, a->window_left, stream)
                                    : tk_attention_fwd(&a->p, stream),
                "attention");
}

struct composed_arg {
    cublasHandle_t handle;
    const void **k_ptrs, **q_ptrs, **v_ptrs, **p_ptrs;
    void **s_ptrs, **o_ptrs;
    __nv_bfloat16 *s;
    int batch_count, seqlen_q, seqlen_k, head_dim, ld_q, ld_kv;
    int window_left, window_right;
    float scale;
};

void run_composed(void *arg, cudaStream_t stream) {
    composed_arg *a = static_cast<composed_arg *>(arg);
    const float one = 1.0f, zero = 0.0f;
    check_cublas(cublasSetStream(a->handle, stream), "cublasSetStream");
    /* Column-major: S^T (seqlen_k x seqlen_q) = K Q^T, from row-major K and Q. */
    check_cublas(cublasGemmBatchedEx(a->handle, CUBLAS_OP_T, CUBLAS_OP_N, a->seqlen_k, a->seqlen_q,
                                     a->head_dim, &a->scale, a->k_ptrs, CUDA_R_16BF, a->ld_kv,
                                     a->q_ptrs, CUDA_R_16BF, a->ld_q, &zero, a->s_ptrs, CUDA_R_16BF,
                                     a->seqlen_k, a->batch_count, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT),
                 "cublasGemmBatchedEx Q K^T");
    masked_softmax_rows<<<(unsigned)((int64_t)a->batch_count * a->seqlen_q), SOFTMAX_THREADS, 0, stream>>>(
        a->s, a->seqlen_q, a->seqlen_k, a->window_left, a->window_right);
    bench_check_cuda(cudaGetLastError(), "masked softmax");
    /* O^T (head_dim x seqlen_q) = V^T P^T. */
    check_cublas(cublasGemmBatchedEx(a->handle, CUBLAS_OP_N, CUBLAS_OP_N, a->head_dim, a->seqlen_q,
                                     a->seqlen_k, &one, a->v_ptrs, CUDA_R_16BF, a->ld_kv, a->p_ptrs,
                                     CUDA_R_16BF, a->seqlen_k, &zero, a->o_ptrs, CUDA_R_16BF, a->ld_q,
                                     a->batch_count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmBatchedEx P V");
}

template <typename P> P *device_array(bench_ctx *ctx, const std::vector<P> &host) {
    P *d = static_cast<P *>(bench_alloc(ctx, host.size() * sizeof(P)));
    bench_check_cuda(cudaMemcpy(d, host.data(), host.size() * sizeof(P), cudaMemcpyHostToDevice),
                     "cudaMemcpy pointer array");
    return d;
}

void bench_shape(bench_ctx *ctx, cublasHandle_t handle, const attn_shape &s) {
    const int64_t b = s.batch, sq = s.seqlen, sk = s.seqlen, hq = s.heads_q, hkv = s.heads_kv,
                  d = s.head_dim;
    const int64_t nq = b * sq * hq * d, nk = b * sk * hkv * d;
    __nv_bfloat16 *q = static_cast<__nv_bfloat16 *>(bench_random(ctx, TK_BF16, nq, -2.0f, 2.0f));
    __nv_bfloat16 *k = static_cast<__nv_bfloat16 *>(bench_random(ctx, TK_BF16, nk, -2.0f, 2.0f));
    __nv_bfloat16 *v = static_cast<__nv_bfloat16 *>(bench_random(ctx, TK_BF16, nk, -1.0f, 1.0f));
    __nv_bfloat16 *o = static_cast<__nv_bfloat16 *>(bench_alloc(ctx, (size_t)nq * 2));
    __nv_bfloat16 *o_ref = static_cast<__nv_bfloat16 *>(bench_alloc(ctx, (size_t)nq * 2));
    __nv_bfloat16 *sbuf = static_cast<__nv_bfloat16 *>(bench_alloc(ctx, (size_t)(b * hq * sq * sk) * 2));

    const tk_attention_params init = TK_ATTENTION_PARAMS_INIT;
    ours_arg ours;
    ours.p = init;
    ours.p.dtype = TK_BF16;
    ours.p.batch = b;
    ours.p.seqlen_q = sq;
    ours.p.seqlen_k = sk;
    ours.p.heads_q = hq;
    ours.p.heads_kv = hkv;
    ours.p.head_dim = d;
    ours.p.q = q;
    ours.p.k = k;
    ours.p.v = v;
    ours.p.o = o;
    ours.p.causal = s.causal;
    ours.window_left = s.window_left;
    const int window_left = s.window_left >= 0 ? (int)s.window_left : -1;
    const int window_right = s.causal || s.window_left >= 0 ? 0 : -1;
    /* A forced variant that does not take this shape (the wide one declines masks; no Hopper
     * variant has head dim 80): the row says so instead of ending the run. */
    tk_attention_params query = ours.p;
    if (s.window_left >= 0)
        query.causal = 1, query.window_left = s.window_left;
    if (tk_attention_supported(&query, NULL) == TK_ERROR_NOT_SUPPORTED) {
        printf("%-28s %-22s skipped: %s\n", s.op, s.shape, tk_last_error());
        bench_free_all(ctx);
        return;
    }

    /* Visible pairs of one (batch, head), as the mask defines them. */
    int64_t pairs = 0;
    for (int64_t i = 0; i < sq; i++) {
        const int64_t lo = window_left >= 0 ? std::max<int64_t>(0, i - window_left) : 0;
        const int64_t hi = window_right >= 0 ? i : sk - 1;
        pairs += hi - lo + 1;
    }
    const double flops = 4.0 * (double)(b * hq * d) * (double)pairs;

    std::vector<const void *> k_ptrs, q_ptrs, v_ptrs, p_ptrs;
    std::vector<void *> s_ptrs, o_ptrs;
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t h = 0; h < hq; h++) {
            const int64_t kv_head = h / (hq / hkv);
            __nv_bfloat16 *s_head = sbuf + (bi * hq + h) * sq * sk;
            k_ptrs.push_back(k + bi * sk * hkv * d + kv_head * d);
            v_ptrs.push_back(v + bi * sk * hkv * d + kv_head * d);
            q_ptrs.push_back(q + bi * sq * hq * d + h * d);
            o_ptrs.push_back(o_ref + bi * sq * hq * d + h * d);
            s_ptrs.push_back(s_head);
            p_ptrs.push_back(s_head);
        }
    composed_arg composed;
    composed.handle = handle;
    composed.k_ptrs = device_array(ctx, k_ptrs);
    composed.q_ptrs = device_array(ctx, q_ptrs);
    composed.v_ptrs = device_array(ctx, v_ptrs);
    composed.p_ptrs = device_array(ctx, p_ptrs);
    composed.s_ptrs = device_array(ctx, s_ptrs);
    composed.o_ptrs = device_array(ctx, o_ptrs);
    composed.s = sbuf;
    composed.batch_count = (int)(b * hq);
    composed.seqlen_q = (int)sq;
    composed.seqlen_k = (int)sk;
    composed.head_dim = (int)d;
    composed.ld_q = (int)(hq * d);
    composed.ld_kv = (int)(hkv * d);
    composed.window_left = window_left;
    composed.window_right = window_right;
    composed.scale = 1.0f / sqrtf((float)d);

    bench_settle(SETTLE_MS);
    const double ms = bench_time_ms(ctx, run_ours, &ours);
    const char *variant = tk_last_variant();
    bench_settle(SETTLE_MS);
    const double base_ms = bench_time_ms(ctx, run_composed, &composed);

    unsigned *stats = static_cast<unsigned *>(bench_alloc(ctx, 2 * sizeof(unsigned)));
    bench_check_cuda(cudaMemset(stats, 0, 2 * sizeof(unsigned)), "cudaMemset");
    max_abs_diff<<<1024, 256>>>(o, o_ref, nq, stats);
    unsigned stat_bits[2] = {0, 0};
    bench_check_cuda(cudaMemcpy(stat_bits, stats, sizeof stat_bits, cudaMemcpyDeviceToHost), "check");
    float diff, largest;
    memcpy(&diff, &stat_bits[0], sizeof diff);
    memcpy(&largest, &stat_bits[1], sizeof largest);

    bench_row row = {s.op, s.shape, TK_BF16, variant, ms, 0.0, flops, "cuBLAS-composed", base_ms};
    bench_report(ctx, &row);
    /* Both round P to bf16 and the composed path also rounds S: a few percent of max |o| apart
     * is expected, a wrong result is far more. */
    printf("    check: max |o - o_composed| = %.3g, max |o_composed| = %.3g%s\n", diff, largest,
           diff <= 0.1f * largest ? "" : "  <-- MISMATCH");
    bench_free_all(ctx);
}

} // namespace

extern "C" void bench_attention(bench_ctx *ctx) {
    cublasHandle_t handle;
    check_cublas(cublasCreate(&handle), "cublasCreate");
    static const attn_shape shapes[] = {
        {"attention fwd dense", "B4 H32/8 S4096 D128", 4, 4096, 32, 8, 128, 0, -1},
        {"attention fwd causal", "B4 H32/8 S4096 D128", 4, 4096, 32, 8, 128, 1, -1},
        {"attention fwd causal", "B1 H32/8 S16384 D128", 1, 16384, 32, 8, 128, 1, -1},
        {"attention fwd sliding wl=4096", "B1 H32/8 S16384 D128", 1, 16384, 32, 8, 128, 1, 4096},
        {"attention fwd sliding wl=1024", "B1 H32/8 S16384 D128", 1, 16384, 32, 8, 128, 1, 1024},
        {"attention fwd dense", "B8 H16 S2048 D64", 8, 2048, 16, 16, 64, 0, -1},
        {"attention fwd causal", "B8 H16 S2048 D64", 8, 2048, 16, 16, 64, 1, -1},
        {"attention fwd dense", "B4 H16/8 S4096 D256", 4, 4096, 16, 8, 256, 0, -1},
        {"attention fwd causal", "B4 H16/8 S4096 D256", 4, 4096, 16, 8, 256, 1, -1},
    };
    for (const attn_shape &s : shapes)
        if (bench_shape_selected(ctx, s.shape))
            bench_shape(ctx, handle, s);
    check_cublas(cublasDestroy(handle), "cublasDestroy");
}

/* ---- the specialised masks, against causal on the same path ----
 * B1 Hq32/Hkv8 S16384 D128 bf16, each mask's TFLOP/s per visible FLOP (4 * heads_q * head_dim *
 * visible pairs) as a ratio to causal attention's on the same variant: the ratio column is (its
 * TFLOP/s) / (causal's TFLOP/s), causal's timed just before and just after each mask (their
 * mean), since the same call's time drifts within a run by more than the few percent these
 * ratios are about. Results are checked by the tests. */
namespace {

struct mask_shape {
    const char *op;
    int64_t chunk, prefix, doc_len;
    bool sinks;
};

/* Visible pairs of one head under causal plus one of the masks (each row's range lo..i, or
 * up to the prefix's end). */
int64_t mask_pairs(const mask_shape &m, int64_t seqlen) {
    int64_t pairs = 0;
    for (int64_t i = 0; i < seqlen; i++) {
        int64_t lo = 0, hi = i;
        if (m.chunk > 0)
            lo = i / m.chunk * m.chunk;
        if (m.doc_len > 0)
            lo = i / m.doc_len * m.doc_len;
        if (m.prefix > 0)
            hi = std::max(hi, m.prefix - 1);
        pairs += hi - lo + 1;
    }
    return pairs;
}

void bench_masks_on(bench_ctx *ctx, const char *variant) {
    const int64_t sq = 16384, hq = 32, hkv = 8, d = 128;
    static const mask_shape masks[] = {
        {"attention fwd causal", 0, 0, 0, false},
        {"attention fwd chunk 8192", 8192, 0, 0, false},
        {"attention fwd docs 16x1024", 0, 0, 1024, false},
        {"attention fwd causal+sinks", 0, 0, 0, true},
        {"attention fwd prefix 1024", 0, 1024, 0, false},
    };
    void *q = bench_random(ctx, TK_BF16, sq * hq * d, -2.0f, 2.0f);
    void *k = bench_random(ctx, TK_BF16, sq * hkv * d, -2.0f, 2.0f);
    void *v = bench_random(ctx, TK_BF16, sq * hkv * d, -1.0f, 1.0f);
    void *o = bench_alloc(ctx, (size_t)(sq * hq * d) * 2);
    float *sinks = static_cast<float *>(bench_random(ctx, TK_F32, hq, 0.0f, 2.0f));
    std::vector<int32_t> host_ids((size_t)sq);
    for (int64_t j = 0; j < sq; j++)
        host_ids[(size_t)j] = (int32_t)(j / 1024);
    int32_t *ids = device_array(ctx, host_ids);
    bench_check(tk_experimental_force_variant("attention", variant), "force variant");
    auto call_of = [&](const mask_shape &m) {
        ours_arg ours;
        ours.p = TK_ATTENTION_PARAMS_INIT;
        ours.window_left = -1;
        tk_attention_params &p = ours.p;
        p.dtype = TK_BF16;
        p.batch = 1, p.seqlen_q = p.seqlen_k = sq, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
        p.q = q, p.k = k, p.v = v, p.o = o;
        p.causal = 1;
        p.chunk_size = m.chunk;
        p.prefix_len = m.prefix;
        p.document_ids = m.doc_len > 0 ? ids : NULL;
        p.sinks = m.sinks ? sinks : NULL;
        return ours;
    };
    ours_arg causal = call_of(masks[0]);
    if (tk_attention_supported(&causal.p, NULL) != TK_SUCCESS) { /* a forced variant this device does not run */
        bench_check(tk_experimental_force_variant("attention", NULL), "force variant");
        return;
    }
    const double causal_flops = 4.0 * (double)(hq * d) * (double)mask_pairs(masks[0], sq);
    bench_settle(SETTLE_MS);
    double causal_before_ms = bench_time_ms(ctx, run_ours, &causal);
    bench_row causal_row = {masks[0].op, "B1 H32/8 S16384 D128", TK_BF16, tk_last_variant(), causal_before_ms,
                            0.0, causal_flops, "of causal's TFLOP/s", causal_before_ms};
    bench_report(ctx, &causal_row);
    for (size_t i = 1; i < sizeof masks / sizeof masks[0]; i++) {
        const mask_shape &m = masks[i];
        ours_arg ours = call_of(m);
        if (tk_attention_supported(&ours.p, NULL) != TK_SUCCESS)
            continue; /* a mask this variant does not take */
        const double flops = 4.0 * (double)(hq * d) * (double)mask_pairs(m, sq);
        bench_settle(SETTLE_MS);
        const double ms = bench_time_ms(ctx, run_ours, &ours);
        const char *variant_ran = tk_last_variant();
        const double causal_after_ms = bench_time_ms(ctx, run_ours, &causal);
        const double causal_tflops = causal_flops / (0.5 * (causal_before_ms + causal_after_ms) * 1e-3) / 1e12;
        const double tflops = flops / (ms * 1e-3) / 1e12;
        /* baseline_ms such that baseline_ms / ms is the ratio of TFLOP/s to causal's. */
        const double as_causal_ms = ms * tflops / causal_tflops;
        bench_row row = {m.op, "B1 H32/8 S16384 D128", TK_BF16, variant_ran, ms, 0.0, flops, "of causal's TFLOP/s",
                         as_causal_ms};
        bench_report(ctx, &row);
        causal_before_ms = causal_after_ms; /* the next mask's "before" */
    }
    bench_check(tk_experimental_force_variant("attention", NULL), "force variant");
}

} // namespace

extern "C" void bench_attention_masks(bench_ctx *ctx) {
    if (!bench_shape_selected(ctx, "B1 H32/8 S16384 D128")) /* every row's shape */
        return;
    bench_masks_on(ctx, NULL); /* the automatic choice: on Hopper wgmma_sm90, documents the persistent one */
    bench_masks_on(ctx, "wgmma_sm90_persistent");
    bench_masks_on(ctx, "mma_sm80");
    bench_free_all(ctx);
}
