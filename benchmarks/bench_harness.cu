/* The benchmark harness: timing, L2 flushing, baselines, random inputs, reporting (bench.h). */
#include "bench.h"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <vector>

/* GPU time each measurement first spends warming up (see bench_time_ms). */
#define WARMUP_MS 25.0f

struct bench_ctx {
    int reps;
    FILE *json;
    const char *only;      /* comma-separated family names, or NULL for all */
    const char *shape;     /* text the rows' shapes must contain (bench_shape_selected), or NULL */
    void *flush;           /* L2-sized scratch memset before each repetition */
    size_t flush_bytes;
    cudaStream_t stream;
    cudaEvent_t start[256], stop[256];
    std::vector<void *> buffers;
    void *copy_src, *copy_dst; /* grown on demand for copy baselines */
    size_t copy_bytes;
    double launch_floor_ms; /* 0 until bench_launch_floor_ms measures it */
    volatile int *release;       /* pinned, mapped: the host's "go" for hold_stream */
    const int *release_on_device;
};

extern "C" void bench_check_cuda(cudaError_t err, const char *what) {
    if (err != cudaSuccess) {
        fprintf(stderr, "bench: %s failed: %s\n", what, cudaGetErrorString(err));
        exit(1);
    }
}

extern "C" void bench_check(tk_status status, const char *what) {
    if (status != TK_SUCCESS) {
        fprintf(stderr, "bench: %s failed: %s: %s\n", what, tk_status_string(status), tk_last_error());
        exit(1);
    }
}

extern "C" const char *bench_dtype_name(tk_dtype dtype) {
    return dtype == TK_F32 ? "f32" : dtype == TK_F16 ? "f16" : "bf16";
}

/* Spins (one thread) until the host sets *release, or for at most a second, so that a
 * repetition queued after it runs back to back on the GPU even when the host is slow to queue it
 * (see bench_time_idle_ms). The time limit keeps a call that synchronises from hanging the run. */
__global__ void hold_stream(const volatile int *release) {
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (!*release && now - start < 1000000000ull);
}

extern "C" double bench_time_idle_ms(bench_ctx *ctx, bench_fn fn, void *arg, int idle_ms) {
    /* Warm-up: module load, first touch, the launch path's caches and the clocks. It runs for a
     * fixed GPU time rather than a fixed number of calls, so that a 70 us elementwise op and a
     * 5 ms GEMM both reach a steady state before the timed repetitions. */
    float warm_ms = 0.0f;
    bench_check_cuda(cudaEventRecord(ctx->start[0], ctx->stream), "cudaEventRecord");
    for (int calls = 0; warm_ms < WARMUP_MS && calls < 10000; calls++) {
        fn(arg, ctx->stream);
        bench_check_cuda(cudaEventRecord(ctx->stop[0], ctx->stream), "cudaEventRecord");
        bench_check_cuda(cudaEventSynchronize(ctx->stop[0]), "warm-up");
        bench_check_cuda(cudaEventElapsedTime(&warm_ms, ctx->start[0], ctx->stop[0]), "cudaEventElapsedTime");
    }
    /* After an idle pause the GPU is ahead of the host: it would reach the start event while the
     * host, back from sleep, is still queuing the call (a library's host work, e.g. cuBLAS's, took
     * longer than the flush), and time that gap. So each such repetition is queued behind
     * hold_stream and released at once, as nvbench's blocking kernel does. Without a pause the
     * host queues the repetitions ahead of the GPU. */
    for (int i = 0; i < ctx->reps; i++) {
        if (idle_ms > 0) {
            bench_settle(idle_ms);
            *ctx->release = 0;
            hold_stream<<<1, 1, 0, ctx->stream>>>(ctx->release_on_device);
        }
        bench_check_cuda(cudaMemsetAsync(ctx->flush, i & 0xff, ctx->flush_bytes, ctx->stream), "L2 flush");
        bench_check_cuda(cudaEventRecord(ctx->start[i], ctx->stream), "cudaEventRecord");
        fn(arg, ctx->stream);
        bench_check_cuda(cudaEventRecord(ctx->stop[i], ctx->stream), "cudaEventRecord");
        if (idle_ms > 0)
            *ctx->release = 1;
    }
    bench_check_cuda(cudaStreamSynchronize(ctx->stream), "benchmark run");
    std::vector<float> ms(ctx->reps);
    for (int i = 0; i < ctx->reps; i++)
        bench_check_cuda(cudaEventElapsedTime(&ms[i], ctx->start[i], ctx->stop[i]), "cudaEventElapsedTime");
    std::sort(ms.begin(), ms.end());
    return ctx->reps % 2 ? ms[ctx->reps / 2] : 0.5 * (ms[ctx->reps / 2 - 1] + ms[ctx->reps / 2]);
}

extern "C" double bench_time_ms(bench_ctx *ctx, bench_fn fn, void *arg) { return bench_time_idle_ms(ctx, fn, arg, 0); }

extern "C" void bench_settle(int idle_ms) {
    bench_check_cuda(cudaDeviceSynchronize(), "settle");
    usleep((useconds_t)idle_ms * 1000);
}

struct copy_arg {
    bench_ctx *ctx;
    size_t bytes;
};

static void run_copy(void *arg, cudaStream_t stream) {
    copy_arg *c = static_cast<copy_arg *>(arg);
    bench_check_cuda(cudaMemcpyAsync(c->ctx->copy_dst, c->ctx->copy_src, c->bytes, cudaMemcpyDeviceToDevice, stream),
                     "copy baseline");
}

__global__ void empty_kernel() {}

static void run_empty(void *, cudaStream_t stream) {
    empty_kernel<<<1, 32, 0, stream>>>();
    bench_check_cuda(cudaGetLastError(), "empty kernel launch");
}

extern "C" double bench_launch_floor_ms(bench_ctx *ctx) {
    if (ctx->launch_floor_ms == 0)
        ctx->launch_floor_ms = bench_time_ms(ctx, run_empty, NULL);
    return ctx->launch_floor_ms;
}

extern "C" const char *bench_memory_baseline(bench_ctx *ctx, int64_t tokens, double bytes, double *baseline_ms) {
    if (tokens <= BENCH_DECODE_TOKENS) {
        *baseline_ms = bench_launch_floor_ms(ctx);
        return "launch";
    }
    *baseline_ms = bench_copy_ms(ctx, (size_t)bytes);
    return "copy";
}

extern "C" double bench_copy_ms(bench_ctx *ctx, size_t bytes_moved) {
    const size_t bytes = bytes_moved / 2;
    if (bytes > ctx->copy_bytes) {
        cudaFree(ctx->copy_src);
        cudaFree(ctx->copy_dst);
        bench_check_cuda(cudaMalloc(&ctx->copy_src, bytes), "cudaMalloc copy baseline");
        bench_check_cuda(cudaMalloc(&ctx->copy_dst, bytes), "cudaMalloc copy baseline");
        bench_check_cuda(cudaMemset(ctx->copy_src, 0x3c, bytes), "cudaMemset");
        ctx->copy_bytes = bytes;
    }
    copy_arg c = {ctx, bytes};
    return bench_time_ms(ctx, run_copy, &c);
}

/* Uniform values from a counter-based hash: reproducible, no state, any size. */
template <typename T>
__global__ void fill_uniform(T *p, int64_t n, float lo, float hi, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        const float v = lo + (hi - lo) * u;
        if constexpr (sizeof(T) == 4)
            p[i] = v;
        else if constexpr (std::is_same<T, __half>::value)
            p[i] = __float2half_rn(v);
        else
            p[i] = __float2bfloat16_rn(v);
    }
}

extern "C" void *bench_alloc(bench_ctx *ctx, size_t bytes) {
    void *p = NULL;
    bench_check_cuda(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    ctx->buffers.push_back(p);
    return p;
}

extern "C" void *bench_random(bench_ctx *ctx, tk_dtype dtype, int64_t count, float lo, float hi) {
    const size_t es = dtype == TK_F32 ? 4 : 2;
    void *p = bench_alloc(ctx, (size_t)count * es);
    static uint64_t seed = 12345;
    seed += 0x632be59bd9b4e019ull;
    const unsigned grid = 1024, block = 256;
    if (dtype == TK_F32)
        fill_uniform<float><<<grid, block, 0, ctx->stream>>>((float *)p, count, lo, hi, seed);
    else if (dtype == TK_F16)
        fill_uniform<__half><<<grid, block, 0, ctx->stream>>>((__half *)p, count, lo, hi, seed);
    else
        fill_uniform<__nv_bfloat16><<<grid, block, 0, ctx->stream>>>((__nv_bfloat16 *)p, count, lo, hi, seed);
    bench_check_cuda(cudaGetLastError(), "random fill");
    return p;
}

extern "C" void bench_free_all(bench_ctx *ctx) {
    bench_check_cuda(cudaStreamSynchronize(ctx->stream), "sync before free");
    for (void *p : ctx->buffers)
        cudaFree(p);
    ctx->buffers.clear();
    cudaFree(ctx->copy_src);
    cudaFree(ctx->copy_dst);
    ctx->copy_src = ctx->copy_dst = NULL;
    ctx->copy_bytes = 0;
}

extern "C" int bench_selected(const bench_ctx *ctx, const char *name) {
    if (!ctx->only)
        return 1;
    const size_t len = strlen(name);
    for (const char *s = ctx->only; *s;) {
        const char *end = strchr(s, ',');
        const size_t item = end ? (size_t)(end - s) : strlen(s);
        if (item == len && strncmp(s, name, len) == 0)
            return 1;
        s += item + (end ? 1 : 0);
    }
    return 0;
}

extern "C" int bench_shape_selected(const bench_ctx *ctx, const char *shape) {
    return !ctx->shape || strstr(shape, ctx->shape) != NULL;
}

extern "C" void bench_report(bench_ctx *ctx, const bench_row *r) {
    const double gbps = r->bytes > 0 ? r->bytes / (r->ms * 1e-3) / 1e9 : 0;
    const double tflops = r->flops > 0 ? r->flops / (r->ms * 1e-3) / 1e12 : 0;
    const double ratio = r->baseline_ms > 0 ? r->baseline_ms / r->ms : 0;
    char rate[32], ratio_text[48];
    if (r->flops > 0)
        snprintf(rate, sizeof rate, "%8.1f TFLOP/s", tflops);
    else
        snprintf(rate, sizeof rate, "%8.1f GB/s   ", gbps);
    if (r->baseline_ms > 0)
        snprintf(ratio_text, sizeof ratio_text, "%5.2fx %s", ratio, r->baseline ? r->baseline : "");
    else
        snprintf(ratio_text, sizeof ratio_text, "-");
    printf("%-28s %-22s %-5s %-12s %9.4f ms %s  %s\n", r->op, r->shape, bench_dtype_name(r->dtype),
           r->variant ? r->variant : "-", r->ms, rate, ratio_text);
    fflush(stdout);
    if (ctx->json)
        fprintf(ctx->json,
                "{\"op\":\"%s\",\"shape\":\"%s\",\"dtype\":\"%s\",\"variant\":\"%s\",\"ms\":%.6f,"
                "\"gbps\":%.2f,\"tflops\":%.2f,\"baseline\":\"%s\",\"baseline_ms\":%.6f,\"ratio\":%.4f}\n",
                r->op, r->shape, bench_dtype_name(r->dtype), r->variant ? r->variant : "", r->ms, gbps, tflops,
                r->baseline ? r->baseline : "", r->baseline_ms, ratio);
}

/* ---- main ---- */

extern "C" int bench_main(int argc, char **argv, const char *const *names, const bench_family *families, int count) {
    bench_ctx ctx = {};
    ctx.reps = 30;
    const char *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json_path = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            ctx.only = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            ctx.shape = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            ctx.reps = std::max(1, std::min(256, atoi(argv[++i])));
        else {
            fprintf(stderr,
                    "usage: %s [--json FILE] [--only family[,family]] [--shape TEXT] [--reps N]\n"
                    "--shape: in the attention families, only the rows whose shape contains "
                    "TEXT (e.g. D64)\nfamilies:",
                    argv[0]);
            for (int f = 0; f < count; f++)
                fprintf(stderr, " %s", names[f]);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    tk_device_info info = TK_DEVICE_INFO_INIT;
    if (tk_device_query(&info) != TK_SUCCESS || !info.supported) {
        fprintf(stderr, "bench: needs a supported CUDA GPU: %s\n", tk_last_error());
        return 1;
    }
    cudaDeviceProp prop;
    bench_check_cuda(cudaGetDeviceProperties(&prop, info.device), "cudaGetDeviceProperties");
    ctx.flush_bytes = (size_t)2 * info.l2_bytes;
    bench_check_cuda(cudaMalloc(&ctx.flush, ctx.flush_bytes), "cudaMalloc L2 flush buffer");
    bench_check_cuda(cudaStreamCreate(&ctx.stream), "cudaStreamCreate");
    int *release = NULL;
    bench_check_cuda(cudaHostAlloc((void **)&release, sizeof *release, cudaHostAllocMapped), "cudaHostAlloc");
    bench_check_cuda(cudaHostGetDevicePointer((void **)&ctx.release_on_device, release, 0), "cudaHostGetDevicePointer");
    ctx.release = release;
    for (int i = 0; i < ctx.reps; i++) {
        bench_check_cuda(cudaEventCreate(&ctx.start[i]), "cudaEventCreate");
        bench_check_cuda(cudaEventCreate(&ctx.stop[i]), "cudaEventCreate");
    }
    if (json_path && !(ctx.json = fopen(json_path, "w"))) {
        fprintf(stderr, "bench: cannot write %s\n", json_path);
        return 1;
    }
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    printf("libtkern %d on %s (cc %d, %d SMs, L2 %d MB), CUDA runtime %d; median of %d runs, L2 flushed\n",
           tk_version(), prop.name, info.compute_capability, info.sm_count, info.l2_bytes >> 20, runtime, ctx.reps);
    printf("ratio = baseline time / our time, baseline measured in the same run (copy = device-to-device copy of the "
           "same bytes; launch = an empty kernel, for calls of <= %d tokens)\n\n",
           BENCH_DECODE_TOKENS);
    printf("%-28s %-22s %-5s %-12s %12s %15s  %s\n", "op", "shape", "dtype", "variant", "time", "rate", "vs baseline");
    for (int f = 0; f < count; f++)
        if (bench_selected(&ctx, names[f])) {
            families[f](&ctx);
            bench_free_all(&ctx);
        }
    if (ctx.json)
        fclose(ctx.json);
    cudaFreeHost((void *)ctx.release);
    return 0;
}
