/*
 * Main-loop schedules of the portable mma.sync GEMM (cuda/gemm.cu), timed against cuBLAS on the
 * H200 at the benchmark shapes (bf16 in and out, f32 accumulation, L2 flushed before every run,
 * median of REPS), after the mma.sync ceiling (mma from registers only). Every variant is the
 * library kernel with another tile_config, checked against cuBLAS's result (max |ours - cuBLAS|
 * over max |cuBLAS|), also at shapes with M, N and K edges. Every timing, cuBLAS's too, starts
 * after SETTLE_MS of idle GPU (as tkbench does: the GPU runs these GEMMs at its power limit,
 * and back-to-back timings inherit the clocks of the one before). gemm_mma_schedules_h200.txt
 * has the H200 runs behind docs/kernels/gemm.md (some with variants since removed: runs 6 and 7
 * name the commit whose driver and gemm.cu build them).
 *
 *   --only A,B,...  time only the variants whose name starts with one of the strings (the
 *                   checked-only shapes still check all), no mma.sync ceiling; with `-I DIR`
 *                   ahead of `-Icuda` the build takes another version of gemm.cu from DIR, for
 *                   a before/after pair in one run
 *   --settle-test   how long the GPU needs to idle after a burst of cuBLAS before a timing
 *                   reads the same as after a long idle (what SETTLE_MS and tkbench's pause
 *                   rest on)
 *   --one V S       run variant V once at shape S, nothing else (for a profiler)
 *
 *   nvcc -O3 -std=c++17 -Iinclude -Icuda -gencode=arch=compute_90a,code=sm_90a \
 *        -o /tmp/gemm_mma_schedules experiments/gemm_mma_schedules.cu -lcublas
 */
#include <stdio.h>
#include <stdlib.h>

#include "gemm.cu"

#include <cublas_v2.h>
#include <string.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "experiment.h"
#include "tkern.h"

namespace {

struct variant {
    const char *name;
    bool kn;
    cudaError_t (*launch)(const tk_gemm_call *c, cudaStream_t stream);
};

template <class Cfg, bool BKn> cudaError_t launch(const tk_gemm_call *c, cudaStream_t stream) {
    constexpr auto kernel = gemm_kernel<Cfg, __nv_bfloat16, BKn, true>;
    static bool opted_in;
    if (!opted_in) {
        const cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES);
        if (err != cudaSuccess)
            return err;
        opted_in = true;
    }
    kernel<<<(unsigned)tile_count<Cfg>(c), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(*c);
    return cudaGetLastError();
}

/* tile_config<BM, BN, BK, STAGES, blocks per SM, prefetch fragments, copy slices>: with
 * prefetched fragments, a K step's copies are spread over its first `copy slices` k16 slices;
 * without, the unaligned kernel's schedule (fragments loaded just before each slice's mma, all
 * copies at the top of the K step). */
const variant variants[] = {
    {"single-buffered 128x256x64 s3", false, launch<tile_config<128, 256, 64, 3, 1, false>, false>},
    {"prefetch s3 copies@3 (library)", false, launch<config_128x256, false>},
    {"prefetch s3 copies@2", false, launch<tile_config<128, 256, 64, 3, 1, true, 2>, false>},
    {"prefetch s4 copies@3", false, launch<tile_config<128, 256, 64, 4, 1, true, 3>, false>},
    {"256x128x64 prefetch s3 copies@3", false, launch<tile_config<256, 128, 64, 3, 1, true, 3>, false>},
    {"256x128x64 prefetch s3 copies@2", false, launch<tile_config<256, 128, 64, 3, 1, true, 2>, false>},
    {"128x256x128 prefetch s2 copies@4", false, launch<tile_config<128, 256, 128, 2, 1, true, 4>, false>},
    {"128x256x128 prefetch s2 copies@6", false, launch<tile_config<128, 256, 128, 2, 1, true, 6>, false>},
    {"single-buffered 128x128x32 s4 x2", false, launch<tile_config<128, 128, 32, 4, 2, false>, false>},
    {"128x128x32 s4 x2 copies@1 (library)", false, launch<config_128x128, false>},
    {"128x128x64 s3 x2 copies@2", false, launch<tile_config<128, 128, 64, 3, 2, true, 2>, false>},
    {"KN single-buffered 128x256x64 s3", true, launch<tile_config<128, 256, 64, 3, 1, false>, true>},
    {"KN prefetch s3 copies@3 (library)", true, launch<config_128x256, true>},
    {"KN prefetch s3 copies@2", true, launch<tile_config<128, 256, 64, 3, 1, true, 2>, true>},
    {"KN 256x128x64 prefetch s3 copies@3", true, launch<tile_config<256, 128, 64, 3, 1, true, 3>, true>},
};
constexpr int VARIANT_COUNT = sizeof variants / sizeof variants[0];

const int REPS = 7;
const int SETTLE_MS = 300;

/* Waits for the GPU, then leaves it idle for `ms`. */
void idle(int ms) {
    if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "device error\n");
        exit(1);
    }
    usleep(ms * 1000);
}

/* Seconds since the epoch, to line rows up with a clock log (nvidia-smi --query-gpu). */
double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/* Whether `name` starts with one of the comma-separated strings of `list`. */
bool selected(const char *list, const char *name) {
    for (const char *s = list; *s;) {
        const char *end = strchr(s, ',');
        const size_t len = end ? (size_t)(end - s) : strlen(s);
        if (strncmp(name, s, len) == 0)
            return true;
        s += len + (end ? 1 : 0);
    }
    return false;
}

__global__ void fill_uniform(__nv_bfloat16 *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15; h *= 0x85EBCA77u; h ^= h >> 13; h *= 0xC2B2AE3Du; h ^= h >> 16;
        x[i] = __float2bfloat16((h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

struct problem {
    int64_t m, n, k, lda, ldb; /* ldb: of B as the variant reads it, [N, K] or [K, N] */
    __nv_bfloat16 *a, *b, *d, *ref;
    cublasHandle_t blas;
};

void *flush_buf;
const size_t FLUSH_BYTES = 256u << 20;

template <class F> double median_ms(F run) {
    idle(SETTLE_MS);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<float> t;
    for (int r = 0; r < REPS + 1; r++) {
        CHECK(cudaMemsetAsync(flush_buf, r, FLUSH_BYTES));
        CHECK(cudaEventRecord(start));
        run();
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (r > 0)
            t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return t[t.size() / 2];
}

void run_cublas(const problem &p, bool kn, __nv_bfloat16 *out) {
    const float alpha = 1.0f, beta = 0.0f;
    if (cublasGemmEx(p.blas, kn ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, (int)p.n, (int)p.m, (int)p.k,
                     &alpha, p.b, CUDA_R_16BF, (int)p.ldb, p.a, CUDA_R_16BF, (int)p.lda, &beta,
                     out, CUDA_R_16BF, (int)p.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
        CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasGemmEx failed\n");
        exit(1);
    }
}

/* D = A B (bf16 in and out, no epilogue) as the kernels see it. */
tk_gemm_call call_of(const problem &p, bool kn, int sm_count, int smem_optin) {
    tk_gemm_call c = {};
    c.m = p.m; c.n = p.n; c.k = p.k;
    c.input_dtype = TK_BF16; c.output_dtype = TK_BF16;
    c.b_layout = kn ? TK_GEMM_B_KN : TK_GEMM_B_NK;
    c.activation = TK_ACT_NONE;
    c.a = p.a; c.b = p.b; c.d = p.d;
    c.lda = p.lda; c.ldb = p.ldb; c.ldd = p.n;
    c.alpha = 1.0f; c.beta = 0.0f;
    c.sm_count = sm_count; c.max_smem_optin = smem_optin;
    return c;
}

/* The mma.sync ceiling: WARPS warps per block, one block per SM, each warp issuing independent
 * m16n8k16 mma on 16 accumulator tiles from registers (no shared memory, no loads). */
template <int WARPS> __global__ void __launch_bounds__(WARPS * 32, 1) mma_peak(float *out, int iters) {
    const uint32_t x = 0x3f803f80u ^ (threadIdx.x * 0x00010001u & 0x001f001fu);
    const uint32_t a[4] = {x, x ^ 1u, x ^ 2u, x ^ 3u};
    float acc[16][4] = {};
    for (int it = 0; it < iters; it++)
#pragma unroll
        for (int t = 0; t < 16; t++)
            mma_16816<__nv_bfloat16>(acc[t], a, x ^ (uint32_t)t, x);
    float sum = 0.0f;
    for (int t = 0; t < 16; t++)
        sum += acc[t][0] + acc[t][1] + acc[t][2] + acc[t][3];
    if (sum == 1.2345f)
        out[threadIdx.x] = sum;
}

template <int WARPS> void report_mma_peak(int sm_count, float *out) {
    const int iters = 32768 / WARPS;
    mma_peak<WARPS><<<sm_count, WARPS * 32>>>(out, iters);
    const double ms = median_ms([&] { mma_peak<WARPS><<<sm_count, WARPS * 32>>>(out, iters); });
    const double flops = 2.0 * 16 * 8 * 16 * 16.0 * iters * WARPS * sm_count;
    printf("mma.sync peak, %2d warps per SM: %.4f ms, %.1f TFLOP/s\n", WARPS, ms, flops / ms * 1e-9);
}

/* A row of tkbench as the power state sees it: the previous row's ~100 ms of back-to-back
 * GEMMs (cuBLAS here), an idle pause, then tkbench's timing (25 ms of warm-up calls, then
 * REPS launches with the L2 flushed before each, median) of the library's 128x256 kernel at
 * 16384 x 4096 x 4096, for pauses from 0 to 1000 ms. */
void settle_test(problem &p, int sm_count, int smem_optin) {
    p.m = 16384; p.n = 4096; p.k = 4096; p.lda = p.ldb = p.k;
    CHECK(cudaMalloc(&p.a, p.m * p.k * 2));
    CHECK(cudaMalloc(&p.b, p.n * p.k * 2));
    CHECK(cudaMalloc(&p.d, p.m * p.n * 2));
    fill_uniform<<<1024, 256>>>(p.a, p.m * p.k, 1);
    fill_uniform<<<1024, 256>>>(p.b, p.n * p.k, 2);
    const tk_gemm_call c = call_of(p, false, sm_count, smem_optin);
    const double flops = 2.0 * p.m * p.n * p.k;
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    /* GPU time of `calls` back-to-back launches of f */
    auto burst_ms = [&](auto f, int calls) {
        CHECK(cudaEventRecord(start));
        for (int i = 0; i < calls; i++)
            f();
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        return ms;
    };
    auto ours = [&] { CHECK((launch<config_128x256, false>(&c, 0))); };
    const double ms_per_call = burst_ms(ours, 3) / 3;
    printf("settle test, 16384x4096x4096, prefetch s3 copies@3 (library): after ~100 ms of cuBLAS, "
           "idle, then 25 ms of warm-up and the median of %d flushed launches\n", REPS);
    const int pauses[] = {1000, 0, 300, 30, 100, 0, 300, 100};
    for (int pause : pauses) {
        idle(0);
        burst_ms([&] { run_cublas(p, false, p.d); }, 130);
        idle(pause);
        burst_ms(ours, (int)(25.0 / ms_per_call) + 1);
        std::vector<float> t;
        for (int r = 0; r < REPS; r++) {
            CHECK(cudaMemsetAsync(flush_buf, r, FLUSH_BYTES));
            float ms;
            CHECK(cudaEventRecord(start));
            ours();
            CHECK(cudaEventRecord(stop));
            CHECK(cudaEventSynchronize(stop));
            CHECK(cudaEventElapsedTime(&ms, start, stop));
            t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        printf("pause %4d ms: %.4f ms %6.1f TFLOP/s (min %.4f, max %.4f) at %.3f\n", pause,
               t[REPS / 2], flops / t[REPS / 2] * 1e-9, t[0], t[REPS - 1], wall_seconds());
        fflush(stdout);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(p.a); cudaFree(p.b); cudaFree(p.d);
}

} // namespace

int main(int argc, char **argv) {
    const bool one = argc == 4 && strcmp(argv[1], "--one") == 0;
    const char *only = argc == 3 && strcmp(argv[1], "--only") == 0 ? argv[2] : nullptr;
    const bool settle_only = argc == 2 && strcmp(argv[1], "--settle-test") == 0;
    const int one_variant = one ? atoi(argv[2]) : -1, one_shape = one ? atoi(argv[3]) : -1;
    int sm_count, smem_optin;
    CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    CHECK(cudaMalloc(&flush_buf, FLUSH_BYTES));
    unsigned *err;
    CHECK(cudaMalloc(&err, 2 * sizeof(unsigned)));
    problem p = {};
    cublasCreate(&p.blas);
    const variant *vs = variants;
    if (settle_only) {
        settle_test(p, sm_count, smem_optin);
        return 0;
    }
    if (!one && !only) {
        float *out;
        CHECK(cudaMalloc(&out, 4096));
        report_mma_peak<4>(sm_count, out);
        report_mma_peak<8>(sm_count, out);
        report_mma_peak<16>(sm_count, out);
        cudaFree(out);
    }

    /* M, N, K, timed: edges in M, N and K (leading dimensions rounded up to 8), checked only;
     * the benchmark shapes; one below a wave of 128x256 tiles (the library runs 128x128). */
    const int64_t shapes[][4] = {
        {1000, 4353, 129, 0},   {777, 1000, 1000, 0},    {1100, 600, 4100, 0},
        {4096, 4096, 4096, 1},  {8192, 8192, 8192, 1},   {16384, 4096, 4096, 1},
        {16384, 14336, 4096, 1}, {16384, 4096, 14336, 1}, {1024, 4096, 4096, 1},
    };
    printf("%-22s %-40s %9s %8s %7s %9s %s\n", "shape", "variant", "ms", "TFLOP/s", "xcuBLAS",
           "max err", "ended at (s since 1970)");
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        const int64_t *s = shapes[si];
        if (one && si != one_shape)
            continue;
        p.m = s[0]; p.n = s[1]; p.k = s[2];
        const bool timed = s[3] != 0;
        p.lda = (p.k + 7) / 8 * 8;
        const int64_t b_elems = (p.k + 7) / 8 * 8 * ((p.n + 7) / 8 * 8);
        CHECK(cudaMalloc(&p.a, p.m * p.lda * 2));
        CHECK(cudaMalloc(&p.b, b_elems * 2));
        CHECK(cudaMalloc(&p.d, p.m * p.n * 2));
        CHECK(cudaMalloc(&p.ref, p.m * p.n * 2));
        fill_uniform<<<1024, 256>>>(p.a, p.m * p.lda, 1);
        fill_uniform<<<1024, 256>>>(p.b, b_elems, 2);
        const double flops = 2.0 * p.m * p.n * p.k;
        char shape[64];
        for (int kn = 0; kn < 2; kn++) {
            if (one && vs[one_variant].kn != (kn == 1))
                continue;
            p.ldb = kn ? (p.n + 7) / 8 * 8 : p.lda;
            snprintf(shape, sizeof shape, "%lldx%lldx%lld%s", (long long)p.m, (long long)p.n,
                     (long long)p.k, kn ? " KN" : "");
            if (one) {
                tk_gemm_call c = call_of(p, kn == 1, sm_count, smem_optin);
                CHECK(vs[one_variant].launch(&c, 0));
                CHECK(cudaDeviceSynchronize());
                continue;
            }
            /* --only: the selected variants where timed (the checked-only shapes check all) */
            auto skipped = [&](int v) {
                return vs[v].kn != (kn == 1) || (timed && only && !selected(only, vs[v].name));
            };
            int runs = 0;
            for (int v = 0; v < VARIANT_COUNT; v++)
                runs += !skipped(v);
            if (runs == 0)
                continue;
            run_cublas(p, kn, p.ref);
            const double blas_ms = timed ? median_ms([&] { run_cublas(p, kn, p.d); }) : 0.0;
            if (timed)
                printf("%-22s %-40s %9.4f %8.1f %7s %9s %.3f\n", shape, "cuBLAS", blas_ms,
                       flops / blas_ms * 1e-9, "", "", wall_seconds());
            for (int v = 0; v < VARIANT_COUNT; v++) {
                if (skipped(v))
                    continue;
                tk_gemm_call c = call_of(p, kn == 1, sm_count, smem_optin);
                CHECK(cudaMemset(p.d, 0, p.m * p.n * 2));
                CHECK(vs[v].launch(&c, 0));
                CHECK(cudaMemset(err, 0, 2 * sizeof(unsigned)));
                experiment_max_error_bf16<<<1024, 256>>>(p.d, p.ref, p.m * p.n, err);
                unsigned h[2];
                CHECK(cudaMemcpy(h, err, sizeof h, cudaMemcpyDeviceToHost));
                const double ms = timed ? median_ms([&] { CHECK(vs[v].launch(&c, 0)); }) : 0.0;
                float diff, mag;
                memcpy(&diff, &h[0], 4);
                memcpy(&mag, &h[1], 4);
                if (timed)
                    printf("%-22s %-40s %9.4f %8.1f %7.2f %9.2e %.3f\n", shape, vs[v].name, ms,
                           flops / ms * 1e-9, blas_ms / ms, diff / mag, wall_seconds());
                else
                    printf("%-22s %-40s %9s %8s %7s %9.2e\n", shape, vs[v].name, "-", "-", "-", diff / mag);
            }
        }
        fflush(stdout);
        cudaFree(p.a); cudaFree(p.b); cudaFree(p.d); cudaFree(p.ref);
    }
    return 0;
}
