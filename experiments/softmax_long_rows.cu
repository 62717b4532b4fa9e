/*
 * Long-row softmax forward on the H200, one binary (issue 3: 4096 x 131072 bf16 at 0.72 of
 * copy). Includes cuda/softmax.cu to time its kernels with other launch parameters:
 *   regs        the row-in-registers kernel (rows up to 32768 bf16)
 *   stream      the two-pass kernel (512 threads x 4 packs, one block per SM)
 *   pipelined   the two passes interleaved, a row split over a cluster of B = 1, 2, 4, 8 blocks
 *               with T threads each and chunks of U packs per thread and row (the library:
 *               T512 U4, B the fewest with slices of at most 128 KB, rows of 64 to 512 KB)
 * Time: median of REPS runs, L2 flushed (memset of 2 x L2) before each, cudaEvents; bytes = read
 * x + write y; ratio = time of a device-to-device copy of the same bytes / time, the copy timed
 * twice before the variants (the first timing of a fresh buffer can be ~10% slow; the second is
 * the reference) and once after them. Every output is compared with the stream kernel's (max abs
 * difference; non-finite values must match) and with an fp64 reference (max relative error,
 * 'WRONG' past 2^-7 bf16, 2^-10 f16, 1e-5 f32); the pipelined variants also on small causal /
 * padded / log shapes against the stream. softmax_long_rows_h200.txt holds the H200 outputs.
 * `softmax_long_rows profile` runs the library's kernel for 4096 x 131072 bf16 once (for ncu).
 *
 * Earlier forms of this file in the git history: commit b8eb870 (a row's slices loaded into the
 * shared memory of a cluster's blocks by cp.async.bulk, (max, sum) through distributed shared
 * memory; the stream with 1024 threads or two blocks per SM; the pipelined loop on whole rows),
 * commit 76577e9 (the pipelined kernel with and without loads issued one chunk ahead, chunks of 2
 * or 4 packs per thread, before its chunks were held as raw words).
 *
 *   nvcc -Iinclude -Icuda -Iexperiments -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a \
 *        experiments/softmax_long_rows.cu -o build/softmax_long_rows
 */
#include "../cuda/softmax.cu"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "experiment.h"

static const int REPS = 15;

template <typename T> __global__ void fill(T *x, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = tk_from_float<T>((float)(h & 0xffffff) / 16777216.0f * 10.0f - 5.0f);
    }
}

/* max |a - b| over finite pairs into worst[0] (float bits), non-finite mismatches into worst[1]. */
template <typename T> __global__ void compare(const T *a, const T *b, int64_t n, unsigned *worst) {
    float w = 0.0f;
    unsigned bad = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float x = tk_to_float(a[i]), y = tk_to_float(b[i]);
        if (isfinite(x) && isfinite(y))
            w = fmaxf(w, fabsf(x - y));
        else if (!(x == y) && !(isnan(x) && isnan(y))) /* padding: NaN in both */
            bad++;
    }
    atomicMax(&worst[0], __float_as_uint(w));
    atomicAdd(&worst[1], bad);
}

/* fp64 reference, one block per row (no mask, scale 1): out = softmax or log-softmax of x. */
template <typename T> __global__ void reference(const T *x, float *out, int64_t cols, bool log) {
    __shared__ double red[32];
    const T *row = x + blockIdx.x * cols;
    double m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        m = fmax(m, (double)tk_to_float(row[c]));
    for (int o = 16; o > 0; o >>= 1)
        m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++)
        m = fmax(m, red[w]);
    __syncthreads();
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        s += exp((double)tk_to_float(row[c]) - m);
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = s;
    __syncthreads();
    s = 0.0;
    for (int w = 0; w < (int)blockDim.x / 32; w++)
        s += red[w];
    const double lse = m + ::log(s);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const double t = (double)tk_to_float(row[c]) - lse;
        out[blockIdx.x * cols + c] = (float)(log ? t : exp(t));
    }
}

/* max over elements of |got - ref| / max(|ref|, floor) into worst (float bits); floor: the
 * smallest normal number of T (f16 softmax outputs of 131072-wide rows are subnormal or 0). */
template <typename T> __global__ void relative_error(const float *ref, const T *got, int64_t n, float floor,
                                                     unsigned *worst) {
    float w = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float r = ref[i], g = tk_to_float(got[i]);
        const float e = fabsf(g - r) / fmaxf(fabsf(r), floor);
        w = fmaxf(w, e == e ? e : INFINITY); /* NaN output: infinite error */
    }
    atomicMax(worst, __float_as_uint(w));
}

static tk_device dev;
static void *flush_buf;
static size_t flush_bytes;

static float time_ms(const std::function<cudaError_t()> &f) {
    return experiment_time_ms(f, 1, REPS, flush_buf, flush_bytes);
}

template <typename T> static void compare_out(const T *ref, const T *got, int64_t n, float *max_diff, unsigned *bad) {
    unsigned *w;
    CHECK(cudaMalloc(&w, 8));
    CHECK(cudaMemset(w, 0, 8));
    compare<T><<<1024, 256>>>(ref, got, n, w);
    unsigned h[2];
    CHECK(cudaMemcpy(h, w, 8, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(w));
    memcpy(max_diff, &h[0], 4);
    *bad = h[1];
}

struct variant {
    std::string name;
    std::function<cudaError_t(const tk_softmax_call *)> run;
};

/* pipelined with T threads per block, U packs per thread and row per chunk (the library's
 * kernel is T512 U4), B blocks per row; T256 runs two blocks per SM. */
template <typename T, int Threads, int Unroll> static variant pipelined(int blocks) {
    return {"pipelined B" + std::to_string(blocks) + " T" + std::to_string(Threads) + " U" + std::to_string(Unroll),
            [=](const tk_softmax_call *a) {
                return launch_pipelined<T, 16 / sizeof(T), Threads, Unroll>(a, &dev, 0, blocks);
            }};
}

/* regs where it fits, the stream, and the pipelined kernel on B = 1, 2, 4, 8 blocks with slices
 * of 16 to 128 KB (T512 U4, the library's); on the library's B (the fewest with slices of at
 * most 128 KB) also T1024 U2 (as many bytes in flight) and T256 U4 (two blocks per SM). */
template <typename T> static std::vector<variant> variants(int64_t cols) {
    constexpr int V = 16 / sizeof(T);
    std::vector<variant> v;
    if (cols <= tk_softmax_regs_max_cols((int)sizeof(T), true, false))
        v.push_back({"regs", [](const tk_softmax_call *a) { return launch_rows<T, V, FORWARD>(a, 0); }});
    v.push_back({"stream", [](const tk_softmax_call *a) { return launch_stream<T, V, false>(a, &dev, 0); }});
    const int library_blocks = pipelined_blocks(cols, (int)sizeof(T));
    for (int blocks : {1, 2, 4, 8}) {
        const int64_t slice_bytes = cols * (int64_t)sizeof(T) / blocks;
        if (slice_bytes < 16384 || slice_bytes > PIPE_SLICE_BYTES)
            continue;
        v.push_back(pipelined<T, 512, 4>(blocks));
        if (blocks == library_blocks) {
            v.push_back(pipelined<T, 1024, 2>(blocks));
            v.push_back(pipelined<T, 256, 4>(blocks));
        }
    }
    return v;
}

static tk_softmax_call make_call(int dtype, int64_t rows, int64_t cols, int64_t stride, bool log, const void *x, void *y) {
    tk_softmax_call a = {};
    a.dtype = dtype;
    a.log = log;
    a.in = x;
    a.out = y;
    a.rows = rows;
    a.cols = cols;
    a.in_stride = a.out_stride = stride;
    a.scale = 1.0f;
    a.causal_period = 1;
    return a;
}

template <typename T> static void bench_shape(const char *dtype_name, int dtype, int64_t rows, int64_t cols, bool log) {
    const int64_t n = rows * cols;
    T *x, *y, *ref;
    CHECK(cudaMalloc(&x, n * sizeof(T)));
    CHECK(cudaMalloc(&y, n * sizeof(T)));
    CHECK(cudaMalloc(&ref, n * sizeof(T)));
    fill<T><<<4096, 256>>>(x, n, 1234u);
    CHECK(cudaGetLastError());
    const double bytes = 2.0 * n * sizeof(T);
    auto copy = [&] { return cudaMemcpyAsync(y, x, n * sizeof(T), cudaMemcpyDeviceToDevice); };
    time_ms(copy); /* a fresh buffer */
    const float copy_ms = time_ms(copy);
    printf("\n%s fwd %lldx%lld %s: copy %.4f ms (%.1f GB/s)\n", log ? "log_softmax" : "softmax", (long long)rows,
           (long long)cols, dtype_name, copy_ms, bytes / copy_ms / 1e6);
    const tk_softmax_call a = make_call(dtype, rows, cols, cols, log, x, ref);
    CHECK((launch_stream<T, 16 / sizeof(T), false>(&a, &dev, 0)));
    CHECK(cudaDeviceSynchronize());
    float *exact;
    unsigned *worst;
    CHECK(cudaMalloc(&exact, n * sizeof(float)));
    CHECK(cudaMalloc(&worst, 4));
    reference<T><<<(unsigned)rows, 1024>>>(x, exact, cols, log);
    CHECK(cudaGetLastError());
    /* bf16 / f16 outputs: half an ulp of rounding plus the f32 arithmetic; f32: a few ulps */
    const float tolerance = sizeof(T) == 2 ? (dtype == TK_BF16 ? 1.0f / 128 : 1.0f / 1024) : 1e-5f;
    for (const variant &v : variants<T>(cols)) {
        CHECK(cudaMemset(y, 0xff, n * sizeof(T)));
        tk_softmax_call b = a;
        b.out = y;
        cudaError_t e = v.run(&b);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            printf("  %-24s failed: %s\n", v.name.c_str(), cudaGetErrorString(e));
            cudaGetLastError();
            continue;
        }
        float diff, rel;
        unsigned bad;
        compare_out(ref, y, n, &diff, &bad);
        CHECK(cudaMemset(worst, 0, 4));
        relative_error<T><<<1024, 256>>>(exact, y, n, dtype == TK_F16 ? 0x1p-14f : 0x1p-126f, worst);
        CHECK(cudaMemcpy(&rel, worst, 4, cudaMemcpyDeviceToHost));
        const float ms = time_ms([&] { return v.run(&b); });
        printf("  %-24s %.4f ms %7.1f GB/s %.3fx copy   max|diff| vs stream %.3g nonfinite-mismatch %u  "
               "max rel err vs fp64 %.3g %s\n",
               v.name.c_str(), ms, bytes / ms / 1e6, copy_ms / ms, diff, bad, rel, rel <= tolerance ? "ok" : "WRONG");
    }
    CHECK(cudaFree(exact));
    CHECK(cudaFree(worst));
    const float copy_after = time_ms(copy);
    printf("  copy again       %.4f ms\n", copy_after);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(ref));
}

/* Small shapes with every edge: padded stride, partial last pack, causal rows that see nothing,
 * masks ending near slice boundaries, log, negative scale. Cluster kernels vs the stream. */
template <typename T> static void check_edges(const char *dtype_name, int dtype) {
    struct edge {
        int64_t rows, cols, stride;
        bool log, causal;
        int64_t period, offset;
        float scale;
    } edges[] = {
        {37, 131067, 131072, false, false, 1, 0, 1.0f},
        {37, 131067, 131072, true, false, 1, 0, -0.7f},
        {37, 131072, 131072, false, true, 37, -10, 1.0f},
        {37, 131072, 131072, true, true, 37, -10, 1.0f},
        {37, 131072, 131072, false, true, 37, 65500, 1.0f},
        {37, 131072, 131072, true, true, 37, 65530, 1.0f},
        {37, 100003, 100008, true, true, 37, 99990, 0.5f},
        {9, 40000, 40000, false, false, 1, 0, 2.0f},
        {9, 32771, 32776, false, true, 9, 32760, 1.0f},
    };
    for (const edge &g : edges) {
        const int64_t n = g.rows * g.stride;
        T *x, *y, *ref;
        CHECK(cudaMalloc(&x, n * sizeof(T)));
        CHECK(cudaMalloc(&y, n * sizeof(T)));
        CHECK(cudaMalloc(&ref, n * sizeof(T)));
        fill<T><<<1024, 256>>>(x, n, 99u);
        CHECK(cudaMemset(ref, 0xff, n * sizeof(T)));
        tk_softmax_call a = make_call(dtype, g.rows, g.cols, g.stride, g.log, x, ref);
        a.causal = g.causal;
        a.causal_period = g.period;
        a.causal_offset = g.offset;
        a.scale = g.scale;
        CHECK((launch_stream<T, 16 / sizeof(T), false>(&a, &dev, 0)));
        for (const variant &v : variants<T>(g.cols)) {
            if (v.name.rfind("pipelined", 0) != 0)
                continue;
            CHECK(cudaMemset(y, 0xff, n * sizeof(T)));
            tk_softmax_call b = a;
            b.out = y;
            cudaError_t e = v.run(&b);
            if (e == cudaSuccess)
                e = cudaDeviceSynchronize();
            float diff = -1.0f;
            unsigned bad = 0;
            if (e == cudaSuccess)
                compare_out(ref, y, n, &diff, &bad); /* padding: both 0xff (NaN), must match */
            else
                cudaGetLastError();
            if (e != cudaSuccess || diff > 1e-2f || bad)
                printf("  EDGE FAIL %s %s rows %lld cols %lld stride %lld log %d causal %d offset %lld: %s diff %g bad %u\n",
                       dtype_name, v.name.c_str(), (long long)g.rows, (long long)g.cols, (long long)g.stride, g.log,
                       g.causal, (long long)g.offset, cudaGetErrorString(e), diff, bad);
        }
        CHECK(cudaFree(x));
        CHECK(cudaFree(y));
        CHECK(cudaFree(ref));
    }
    printf("edge checks %s done\n", dtype_name);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    dev.ordinal = 0;
    dev.cc = prop.major * 100 + prop.minor * 10;
    dev.sm_count = prop.multiProcessorCount;
    dev.max_smem_optin = (int)prop.sharedMemPerBlockOptin;
    dev.smem_per_sm = (int)prop.sharedMemPerMultiprocessor;
    dev.l2_bytes = prop.l2CacheSize;
    dev.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
    dev.supported = 1;
    printf("%s, %d SMs, L2 %d MB\n", prop.name, dev.sm_count, dev.l2_bytes >> 20);
    flush_bytes = 2 * (size_t)dev.l2_bytes;
    CHECK(cudaMalloc(&flush_buf, flush_bytes));
    if (argc > 1) { /* "profile": the library's choice for 4096 x 131072 bf16, once (for ncu) */
        const int64_t n = 4096 * (int64_t)131072;
        __nv_bfloat16 *x, *y;
        CHECK(cudaMalloc(&x, n * 2));
        CHECK(cudaMalloc(&y, n * 2));
        fill<__nv_bfloat16><<<4096, 256>>>(x, n, 1234u);
        const tk_softmax_call a = make_call(TK_BF16, 4096, 131072, 131072, false, x, y);
        CHECK((launch_pipelined<__nv_bfloat16, 8>(&a, &dev, 0, 2)));
        CHECK(cudaDeviceSynchronize());
        printf("profile run done (%s)\n", argv[1]);
        return 0;
    }
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 4096, 131072, false);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 4096, 131072, true);
    bench_shape<float>("f32", TK_F32, 2048, 131072, false);
    bench_shape<__half>("f16", TK_F16, 4096, 131072, false);
    check_edges<__nv_bfloat16>("bf16", TK_BF16);
    check_edges<__half>("f16", TK_F16);
    check_edges<float>("f32", TK_F32);
    /* the library's range, 64 to 512 KB rows, and either side of it */
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 32768, 16384, false);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 16384, 32768, false);
    bench_shape<float>("f32", TK_F32, 16384, 16384, false);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 8192, 65536, false);
    bench_shape<float>("f32", TK_F32, 4096, 65536, false);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 2048, 262144, false);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 1024, 524288, false);
    return 0;
}
