/*
 * Long-row softmax designs on the H200, one binary (issue 3: 4096 x 131072 bf16 forward at 0.72
 * of copy). Includes cuda/softmax.cu to time its kernels with other launch parameters:
 *   stream      the library's two-pass kernel (512 threads x unroll 4, one block per SM), and
 *               1024 threads x unroll 2, and 2 blocks of 512 per SM (launch bounds 512, 2)
 *   cluster     a row split over a cluster of B blocks, each block's slice brought into shared
 *               memory by one bulk copy, (max, sum) exchanged through distributed shared memory:
 *               B = 4 / 8 / 16, one slice per block (S1) or two (S2: the next row's slice loads
 *               while this one is worked on), grid of one cluster per row (np) or as many
 *               clusters as fit (p), output by 16-byte stores (st) or one bulk store (bulk)
 * Time: median of REPS runs, L2 flushed (memset of 2 x L2) before each, cudaEvents; bytes = read
 * x + write y; ratio = time of a device-to-device copy of the same bytes / time. Every variant's
 * output is compared with the stream kernel's (max abs difference; non-finite must match), and
 * the cluster kernels also on small causal / padded / log shapes.
 *
 *   nvcc -Iinclude -Icuda -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a \
 *        experiments/softmax_long_rows.cu -o build/softmax_long_rows
 */
#include "../cuda/softmax.cu"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static const int REPS = 10;

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

static tk_device dev;
static void *flush_buf;
static size_t flush_bytes;

static float time_ms(const std::function<cudaError_t()> &f) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r <= REPS; r++) {
        CHECK(cudaMemsetAsync(flush_buf, r & 0xff, flush_bytes));
        CHECK(cudaEventRecord(e0));
        CHECK(f());
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0)
            t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return t[t.size() / 2];
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

/* (b) The stream with its two passes software-pipelined: while a block re-reads and writes row r
 * (pass 2, L2 hits, last-use loads), it reads row r + gridDim.x (pass 1) in the same loop, so
 * that DRAM sees reads and writes all along. Experiment only: forward, no mask, cols % Vec == 0. */
template <typename T, int Vec>
__device__ __forceinline__ void stats_chunk(const tk_pack<T, Vec> (&xs)[4], int base, int whole, float c2, float &m,
                                            float &s, const tk_softmax_call &a) {
    row_extremes<T, Vec> ext;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int c0 = base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec;
        if (c0 < whole)
            ext.add_pack(xs[u]);
    }
    const float chunk_max = ext.max_times(c2);
    if (chunk_max > m) {
        s *= fast_exp2(m - chunk_max);
        m = chunk_max;
    }
    if (m != -INFINITY) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            accumulate_pack<T, Vec, false>(a, xs[u], xs[u], base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec,
                                           whole, c2, m, &s);
    }
}

template <typename T, int Vec>
__device__ __forceinline__ row_stats block_stats(float m, float s, float *scratch) {
    const float row_m = tk_block_max(m, scratch);
    const float scaled = m == -INFINITY ? 0.0f : s * fast_exp2(m - row_m);
    row_stats st;
    st.lse = row_m + log2f(tk_block_sum(scaled, scratch));
    return st;
}

template <typename T, int Vec>
__global__ void __launch_bounds__(512, 1) pipelined_stream_kernel(tk_softmax_call a) {
    constexpr int U = 4;
    __shared__ float scratch[32];
    const T *in = static_cast<const T *>(a.in);
    T *out = static_cast<T *>(a.out);
    const int whole = (int)a.cols;
    const int chunk = (int)blockDim.x * U * Vec;
    const float c2 = a.scale * LOG2E;
    int64_t row = blockIdx.x;
    if (row >= a.rows)
        return;
    row_stats st;
    {
        float m = -INFINITY, s = 0.0f;
        for (int base = 0; base < whole; base += chunk) {
            tk_pack<T, Vec> xs[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c0 = base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec;
                if (c0 < whole)
                    xs[u] = tk_load_pack<T, Vec>(in + row * a.in_stride + c0);
            }
            stats_chunk<T, Vec>(xs, base, whole, c2, m, s, a);
        }
        st = block_stats<T, Vec>(m, s, scratch);
    }
    for (; row < a.rows; row += gridDim.x) {
        const int64_t next = row + gridDim.x;
        const bool has_next = next < a.rows;
        float m = -INFINITY, s = 0.0f;
        for (int base = 0; base < whole; base += chunk) {
            tk_pack<T, Vec> xn[U], xc[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c0 = base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec;
                if (c0 < whole) {
                    if (has_next)
                        xn[u] = tk_load_pack<T, Vec>(in + next * a.in_stride + c0);
                    xc[u] = load_last_use<T, Vec>(in + row * a.in_stride + c0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c0 = base + (u * (int)blockDim.x + (int)threadIdx.x) * Vec;
                if (c0 < whole)
                    store_streaming<T, Vec>(out + row * a.out_stride + c0,
                                            output_pack<T, Vec, false>(a, st, xc[u], xc[u], c0, whole, c2));
            }
            if (has_next)
                stats_chunk<T, Vec>(xn, base, whole, c2, m, s, a);
        }
        if (has_next)
            st = block_stats<T, Vec>(m, s, scratch);
    }
}

template <typename T, int Vec> cudaError_t launch_pipelined(const tk_softmax_call *a) {
    const int64_t row_bytes = a->cols * (int64_t)sizeof(T);
    int64_t blocks = (int64_t)dev.l2_bytes / 2 / row_bytes;
    if (blocks < dev.sm_count)
        blocks = dev.sm_count;
    if (blocks > dev.sm_count)
        blocks = dev.sm_count; /* 512 threads, 1 block per SM by launch bounds */
    if (blocks > a->rows)
        blocks = a->rows;
    pipelined_stream_kernel<T, Vec><<<(unsigned)blocks, 512>>>(*a);
    return cudaGetLastError();
}

template <typename T, int Stages, int Threads, int MinBlocks, bool Backward = false>
static void add(std::vector<variant> &v, int blocks, bool persistent) {
    constexpr int V = 16 / sizeof(T);
    char name[64];
    for (int bulk = 0; bulk < 2; bulk++) {
        snprintf(name, sizeof name, "cluster B%d S%d %s T%d/%d %s", blocks, Stages, persistent ? "p" : "np", Threads,
                 MinBlocks, bulk ? "bulk" : "st");
        if (bulk)
            v.push_back({name, [=](const tk_softmax_call *a) {
                             return launch_cluster<T, V, Backward, Stages, true, Threads, MinBlocks>(a, &dev, 0, blocks, persistent);
                         }});
        else
            v.push_back({name, [=](const tk_softmax_call *a) {
                             return launch_cluster<T, V, Backward, Stages, false, Threads, MinBlocks>(a, &dev, 0, blocks, persistent);
                         }});
    }
}

template <typename T> static std::vector<variant> variants(int64_t cols, bool backward = false) {
    constexpr int V = 16 / sizeof(T);
    std::vector<variant> v;
    if (backward) {
        v.push_back({"stream bwd", [](const tk_softmax_call *a) { return launch_stream<T, V, true>(a, &dev, 0); }});
        add<T, 1, 256, 6, true>(v, 16, false);
        add<T, 1, 256, 6, true>(v, 16, true);
        add<T, 1, 128, 12, true>(v, 16, true);
        add<T, 2, 256, 1, true>(v, 16, true);
        add<T, 2, 128, 1, true>(v, 16, true);
        return v;
    }
    if (cols <= tk_softmax_regs_max_cols((int)sizeof(T), true, false))
        v.push_back({"regs", [](const tk_softmax_call *a) { return launch_rows<T, V, FORWARD>(a, 0); }});
    v.push_back({"stream 512x4", [](const tk_softmax_call *a) { return launch_stream<T, V, false>(a, &dev, 0); }});
    v.push_back({"stream 1024x2", [](const tk_softmax_call *a) { return launch_stream<T, V, false, 1024, 1, 2>(a, &dev, 0); }});
    v.push_back({"stream pipelined 512x4", [](const tk_softmax_call *a) { return launch_pipelined<T, V>(a); }});
    v.push_back({"stream 512x2 2/SM", [](const tk_softmax_call *a) {
                     return launch_stream<T, V, false, 512, 2, 2>(a, &dev, 0, 2 * dev.sm_count);
                 }});
    /* blocks per cluster, stages, persistent; each with 16-byte stores and with a bulk store */
    add<T, 1, 256, 1>(v, 4, false);
    add<T, 1, 256, 1>(v, 4, true);
    add<T, 1, 256, 6>(v, 8, false);
    add<T, 1, 128, 1>(v, 8, false);
    add<T, 1, 256, 6>(v, 8, true);
    add<T, 1, 128, 1>(v, 8, true);
    add<T, 2, 256, 1>(v, 8, true);
    add<T, 1, 256, 6>(v, 16, false);
    add<T, 1, 128, 12>(v, 16, false);
    add<T, 1, 256, 6>(v, 16, true);
    add<T, 1, 128, 12>(v, 16, true);
    add<T, 2, 256, 6>(v, 16, true);
    add<T, 2, 128, 1>(v, 16, true);
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

/* Backward: y = x's buffer (random values stand in for a softmax output), dy a second random
 * buffer; bytes = y + dy + dx, the ratio against the copy bandwidth measured on n elements. */
template <typename T>
static void bench_shape(const char *dtype_name, int dtype, int64_t rows, int64_t cols, bool log, bool backward = false) {
    const int64_t n = rows * cols;
    T *x, *y, *ref, *g = nullptr;
    CHECK(cudaMalloc(&x, n * sizeof(T)));
    CHECK(cudaMalloc(&y, n * sizeof(T)));
    CHECK(cudaMalloc(&ref, n * sizeof(T)));
    fill<T><<<4096, 256>>>(x, n, 1234u);
    if (backward) {
        CHECK(cudaMalloc(&g, n * sizeof(T)));
        fill<T><<<4096, 256>>>(g, n, 777u);
    }
    CHECK(cudaGetLastError());
    const double bytes = (backward ? 3.0 : 2.0) * n * sizeof(T);
    const float copy = time_ms([&] { return cudaMemcpyAsync(y, x, n * sizeof(T), cudaMemcpyDeviceToDevice); })
                       * (backward ? 1.5f : 1.0f);
    printf("\n%s %s %lldx%lld %s: copy %.4f ms (%.1f GB/s)\n", log ? "log_softmax" : "softmax", backward ? "bwd" : "fwd",
           (long long)rows, (long long)cols, dtype_name, copy, bytes / copy / 1e6);
    tk_softmax_call a = make_call(dtype, rows, cols, cols, log, x, ref);
    a.backward = backward;
    a.dy = g;
    if (backward)
        CHECK((launch_stream<T, 16 / sizeof(T), true>(&a, &dev, 0)));
    else
        CHECK((launch_stream<T, 16 / sizeof(T), false>(&a, &dev, 0)));
    CHECK(cudaDeviceSynchronize());
    for (const variant &v : variants<T>(cols, backward)) {
        CHECK(cudaMemset(y, 0xff, n * sizeof(T)));
        tk_softmax_call b = a;
        b.out = y;
        cudaError_t e = v.run(&b);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            printf("  %-32s failed: %s\n", v.name.c_str(), cudaGetErrorString(e));
            cudaGetLastError();
            continue;
        }
        float diff;
        unsigned bad;
        compare_out(ref, y, n, &diff, &bad);
        const float ms = time_ms([&] { return v.run(&b); });
        printf("  %-32s %.4f ms %7.1f GB/s %.3fx copy   max|diff| %.3g nonfinite-mismatch %u\n", v.name.c_str(), ms,
               bytes / ms / 1e6, copy / ms, diff, bad);
        fflush(stdout);
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(ref));
    if (g)
        CHECK(cudaFree(g));
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
        {37, 131072, 131072, false, true, 37, 16370, 1.0f},
        {37, 131072, 131072, false, true, 37, 8180, 1.0f},
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
            if (v.name.rfind("cluster", 0) != 0)
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

int main() {
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
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 4096, 131072, false);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 4096, 131072, true);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 4096, 131072, true, true);
    check_edges<__nv_bfloat16>("bf16", TK_BF16);
    check_edges<float>("f32", TK_F32);
    bench_shape<float>("f32", TK_F32, 2048, 131072, false);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 8192, 65536, false);
    bench_shape<__nv_bfloat16>("bf16", TK_BF16, 16384, 32768, false);
    return 0;
}
