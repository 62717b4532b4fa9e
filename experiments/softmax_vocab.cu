/*
 * Vocabulary rows (issue 3: softmax / log-softmax forward 4096 x 131072 bf16 at >= 0.90 of the
 * copy bandwidth; the stream kernel measured 0.7155 ms = 0.71x on the H200). Is the bf16 row
 * limited by the exponentials (2 MUFU.EX2 per element: 1.07 G per call, ~0.26 ms of the SMs'
 * 16-lane MUFU pipes at ~2 GHz) that the stream does not overlap with its loads? One binary,
 * including cuda/softmax.cu to time its kernels with other template knobs:
 *   stream nopf     each step's loads issued after the previous step is used (as the stream of
 *                   main: load, wait, compute)
 *   stream pf       the loads of the next step issued before the current step is used
 *   U               packs per thread and step (32 KB in flight per block for U4)
 *   poly S/O        of each pack of 8, S exponentials of pass 1 (sum) and O of pass 2 (output)
 *                   on the FMA pipe (poly_exp2) instead of MUFU.EX2
 *   sum ex2.bf16x2  pass 1's exponentials two per MUFU op (args rounded to bf16; reduced precision)
 *   DIAG noexp      exponentials replaced by one FFMA: WRONG results, bounds what memory allows
 *   pipelined B     the cluster kernel (two passes of consecutive rows interleaved, B blocks/row)
 * Time: median of REPS runs, L2 flushed (memset of 2 x L2) before each, cudaEvents; bytes = read
 * x + write y (backward: y, dy, dx); ratio = time of a copy of the same bytes (timed twice before
 * the variants: a fresh buffer's first copy can be ~10% slow) / time. Checks per variant: max
 * |diff| against the first variant of the shape, and against an fp64 CPU reference on 6 rows
 * with the tolerance of tests/test_softmax.c: "tol" = worst |got - ref| / (rtol (atol + |ref|)),
 * must be <= 1. Then stream variants against the CPU reference on every row of small edge shapes
 * (causal, padded, log, negative scale, f16). `softmax_vocab profile` runs three kernels once each
 * (for ncu). H200 output: softmax_vocab_h200.txt.
 *
 * Found (H200): every stream variant of this form took 1.12-1.23 ms (0.41-0.45x copy), the
 * stream of main 0.7155 ms: its SASS issues each chunk load (LDG.E.128 or LDG.E.EF.128, both
 * predicated, one per pass) followed by PRMTs that merge the two loads' 16-bit elements into one
 * pack, which wait for the data, so a step's loads go out one at a time (with or without the
 * one-step-ahead loads alike). The exponentials are not what bounds these kernels: the no-exp
 * diagnostic gained 1% (stream) and 3% (pipelined B2: 0.7644 against 0.7852 ms), and the FMA
 * polynomial (1 to 3 of 8 exponentials per pack) or the packed bf16x2 sum were slower or equal.
 *
 * The knobs are not in the library (that stream kernel was slower than main's): build this file
 * against commit bb77f83's cuda/softmax.cu, which has them, put first on the include path:
 *   mkdir -p /tmp/sv && git show bb77f83:cuda/softmax.cu > /tmp/sv/softmax.cu
 *   nvcc -I/tmp/sv -Iinclude -Icuda -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a \
 *        experiments/softmax_vocab.cu -o build/softmax_vocab
 */
#include "softmax.cu" /* cuda/ or the directory named first with -I */

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "experiment.h"

static const int REPS = 15;

template <typename T> __global__ void fill(T *x, int64_t n, uint32_t seed, float lo, float hi) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = tk_from_float<T>(lo + (float)(h & 0xffffff) / 16777216.0f * (hi - lo));
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
        else if (!(x == y) && !(isnan(x) && isnan(y)))
            bad++;
    }
    atomicMax(&worst[0], __float_as_uint(w));
    atomicAdd(&worst[1], bad);
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

/* ---- fp64 CPU reference (tests/ref/softmax_ref.c's formulas) and the tests' tolerance ---- */

static double host_value(const void *p, int dtype, int64_t i) {
    if (dtype == TK_F32)
        return ((const float *)p)[i];
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    if (dtype == TK_BF16) {
        uint32_t b = (uint32_t)h << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    const int e = h >> 10 & 31, m = h & 1023, s = h >> 15 ? -1 : 1;
    if (e == 31)
        return m ? NAN : s * INFINITY;
    return s * (e ? std::ldexp(1024.0 + m, e - 25) : std::ldexp((double)m, -24));
}

static int64_t visible(const tk_softmax_call &a, int64_t row) {
    if (!a.causal)
        return a.cols;
    const int64_t last = row % a.causal_period + a.causal_offset;
    return last < 0 ? 0 : std::min(last + 1, a.cols);
}

/* Worst |got - ref| / (rtol (atol + |ref|)) over `rows` (forward; backward: log-softmax only,
 * y and dy given), every column; non-finite must match exactly (returns 1e9 otherwise). */
static double tol_ratio(const tk_softmax_call &a, const std::vector<int64_t> &rows) {
    const size_t es = a.dtype == TK_F32 ? 4 : 2;
    const double rtol = a.dtype == TK_F32 ? 1e-5 : a.dtype == TK_F16 ? 1e-3 : 1e-2;
    std::vector<char> in(a.cols * es), g(a.cols * es), out(a.cols * es);
    std::vector<double> ref(a.cols);
    double worst = 0.0;
    for (int64_t r : rows) {
        const int64_t len = visible(a, r);
        CHECK(cudaMemcpy(in.data(), (const char *)a.in + r * a.in_stride * es, a.cols * es, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(out.data(), (const char *)a.out + r * a.out_stride * es, a.cols * es, cudaMemcpyDeviceToHost));
        double max_abs = 0.0, atol;
        if (a.backward) { /* log-softmax: dx = scale (dy - e^y sum dy) */
            CHECK(cudaMemcpy(g.data(), (const char *)a.dy + r * a.in_stride * es, a.cols * es, cudaMemcpyDeviceToHost));
            double dot = 0.0;
            for (int64_t c = 0; c < len; c++)
                dot += host_value(g.data(), a.dtype, c);
            for (int64_t c = 0; c < a.cols; c++) {
                ref[c] = c >= len ? 0.0
                                  : a.scale * (host_value(g.data(), a.dtype, c) - std::exp(host_value(in.data(), a.dtype, c)) * dot);
                max_abs = std::max(max_abs, std::fabs(ref[c]));
            }
            atol = max_abs;
        } else {
            double m = -INFINITY, s = 0.0;
            for (int64_t c = 0; c < len; c++)
                m = std::max(m, (double)a.scale * host_value(in.data(), a.dtype, c));
            for (int64_t c = 0; c < len; c++)
                s += std::exp(a.scale * host_value(in.data(), a.dtype, c) - m);
            for (int64_t c = 0; c < a.cols; c++) {
                const double t = a.scale * host_value(in.data(), a.dtype, c) - m;
                ref[c] = c >= len ? (a.log ? -INFINITY : 0.0) : a.log ? t - std::log(s) : std::exp(t) / s;
            }
            atol = a.log ? 1.0 : a.dtype == TK_F16 ? 1e-4 : 1e-6;
        }
        for (int64_t c = 0; c < a.cols; c++) {
            const double v = host_value(out.data(), a.dtype, c);
            if (!std::isfinite(ref[c])) {
                if (!(v == ref[c]))
                    return 1e9;
                continue;
            }
            if (!std::isfinite(v))
                return 1e9;
            worst = std::max(worst, std::fabs(v - ref[c]) / (rtol * (atol + std::fabs(ref[c]))));
        }
    }
    return worst;
}

/* ---- variants ---- */

struct variant {
    std::string name;
    std::function<cudaError_t(const tk_softmax_call *)> run;
};

template <typename T, bool Backward, int Unroll, int PolySum, int PolyOut, bool Prefetch>
static variant stream_variant(const char *name) {
    return {name, [](const tk_softmax_call *a) {
                return launch_stream<T, 16 / sizeof(T), Backward, Unroll, PolySum, PolyOut, Prefetch>(a, &dev, 0);
            }};
}

template <typename T, int PolySum, int PolyOut> static variant pipelined_variant(const char *name, int blocks) {
    return {name, [=](const tk_softmax_call *a) {
                return launch_pipelined<T, 16 / sizeof(T), PolySum, PolyOut>(a, &dev, 0, blocks);
            }};
}

/* Forward variants for 16-bit rows (the poly knobs need 16-bit types). */
template <typename T> static std::vector<variant> forward_variants(bool full) {
    std::vector<variant> v = {
        stream_variant<T, false, 4, 0, 0, false>("stream nopf U4"),
        stream_variant<T, false, 4, 0, 0, true>("stream pf U4"),
    };
    if (!full)
        return v;
    for (const variant &w : {
             stream_variant<T, false, 2, 0, 0, true>("stream pf U2"),
             stream_variant<T, false, 6, 0, 0, true>("stream pf U6"),
             stream_variant<T, false, 4, 1, 1, true>("stream pf U4 poly 1/1"),
             stream_variant<T, false, 4, 2, 2, true>("stream pf U4 poly 2/2"),
             stream_variant<T, false, 4, 3, 3, true>("stream pf U4 poly 3/3"),
             stream_variant<T, false, 4, 2, 0, true>("stream pf U4 poly 2/0"),
             stream_variant<T, false, 4, 0, 2, true>("stream pf U4 poly 0/2"),
             stream_variant<T, false, 4, -2, 0, true>("stream pf U4 sum ex2.bf16x2"),
             stream_variant<T, false, 4, -2, 2, true>("stream pf U4 sum bf16x2 poly -/2"),
             stream_variant<T, false, 2, 2, 2, true>("stream pf U2 poly 2/2"),
             stream_variant<T, false, 6, 2, 2, true>("stream pf U6 poly 2/2"),
             pipelined_variant<T, 0, 0>("pipelined B2", 2),
             pipelined_variant<T, 2, 2>("pipelined B2 poly 2/2", 2),
             pipelined_variant<T, 1, 1>("pipelined B2 poly 1/1", 2),
             stream_variant<T, false, 4, -1, -1, true>("DIAG stream pf U4 noexp"),
             stream_variant<T, false, 4, -1, -1, false>("DIAG stream nopf U4 noexp"),
             pipelined_variant<T, -1, -1>("DIAG pipelined B2 noexp", 2),
         })
        v.push_back(w);
    return v;
}

static tk_softmax_call make_call(int dtype, int64_t rows, int64_t cols, int64_t stride, bool log, const void *x,
                                 void *y) {
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

template <typename T>
static void bench_shape(const char *dtype_name, int dtype, int64_t rows, int64_t cols, bool log, bool backward,
                        const std::vector<variant> &vs) {
    const int64_t n = rows * cols;
    T *x, *g = nullptr, *y, *ref;
    CHECK(cudaMalloc(&x, n * sizeof(T)));
    CHECK(cudaMalloc(&y, n * sizeof(T)));
    CHECK(cudaMalloc(&ref, n * sizeof(T)));
    if (backward) { /* log-softmax: y around log(1 / cols), dy random */
        CHECK(cudaMalloc(&g, n * sizeof(T)));
        fill<T><<<4096, 256>>>(x, n, 1234u, -13.0f, -10.0f);
        fill<T><<<4096, 256>>>(g, n, 777u, -1.0f, 1.0f);
    } else {
        fill<T><<<4096, 256>>>(x, n, 1234u, -8.0f, 8.0f); /* tkbench's range */
    }
    CHECK(cudaGetLastError());
    const double bytes = (backward ? 3.0 : 2.0) * n * sizeof(T);
    printf("\n%s %s %lldx%lld %s\n", log ? "log_softmax" : "softmax", backward ? "bwd" : "fwd", (long long)rows,
           (long long)cols, dtype_name);
    const size_t copy_bytes = (size_t)(bytes / 2);
    void *c0, *c1;
    CHECK(cudaMalloc(&c0, copy_bytes));
    CHECK(cudaMalloc(&c1, copy_bytes));
    CHECK(cudaMemset(c0, 0, copy_bytes));
    auto copy = [&] { return cudaMemcpyAsync(c1, c0, copy_bytes, cudaMemcpyDeviceToDevice); };
    time_ms(copy);
    const float copy_ms = time_ms(copy);
    printf("  copy of the same bytes     %.4f ms %7.1f GB/s  (timed twice, the second is the reference)\n", copy_ms,
           bytes / copy_ms / 1e6);
    CHECK(cudaFree(c0));
    CHECK(cudaFree(c1));
    tk_softmax_call a = make_call(dtype, rows, cols, cols, log, x, ref);
    a.backward = backward;
    a.dy = g;
    const std::vector<int64_t> check_rows = {0, 1, 2, rows / 2, rows - 2, rows - 1};
    for (size_t i = 0; i < vs.size(); i++) {
        const variant &v = vs[i];
        tk_softmax_call b = a;
        b.out = i == 0 ? ref : y;
        CHECK(cudaMemset(b.out, 0xff, n * sizeof(T)));
        cudaError_t e = v.run(&b);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            printf("  %-28s failed: %s\n", v.name.c_str(), cudaGetErrorString(e));
            cudaGetLastError();
            continue;
        }
        float diff = 0.0f;
        unsigned bad = 0;
        if (i > 0)
            compare_out(ref, y, n, &diff, &bad);
        const double tol = (backward && !log) ? -1.0 : tol_ratio(b, check_rows);
        const float ms = time_ms([&] { return v.run(&b); });
        printf("  %-28s %.4f ms %7.1f GB/s %.3fx copy  max|diff| %.3g nonfinite-mismatch %u  tol %.3f\n",
               v.name.c_str(), ms, bytes / ms / 1e6, copy_ms / ms, diff, bad, tol);
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(ref));
    if (g)
        CHECK(cudaFree(g));
}

/* Every row of small shapes with the edges (padded stride, partial last pack, causal rows that
 * see nothing, masks ending inside a chunk, log, negative scale) against the CPU reference. */
template <typename T> static void check_edges(const char *dtype_name, int dtype) {
    struct edge {
        int64_t rows, cols, stride;
        bool log, causal;
        int64_t period, offset;
        float scale;
    } edges[] = {
        {5, 131067, 131072, false, false, 1, 0, 1.0f},
        {5, 131067, 131072, true, false, 1, 0, -0.7f},
        {7, 131072, 131072, false, true, 7, -3, 1.0f},
        {7, 131072, 131072, true, true, 7, 65530, 1.0f},
        {7, 100003, 100008, false, true, 7, 99990, 0.5f},
        {9, 40000, 40000, false, false, 1, 0, 2.0f},
        {9, 7, 8, false, false, 1, 0, 1.0f},
        {300, 5000, 5000, false, true, 300, -100, 1.0f},
    };
    const std::vector<variant> vs = {
        stream_variant<T, false, 4, 0, 0, true>("stream pf U4"),
        stream_variant<T, false, 4, 2, 2, true>("stream pf U4 poly 2/2"),
        stream_variant<T, false, 4, 3, 3, true>("stream pf U4 poly 3/3"),
        stream_variant<T, false, 2, 0, 0, true>("stream pf U2"),
    };
    double worst[4] = {0, 0, 0, 0};
    for (const edge &e : edges) {
        const int64_t n = e.rows * e.stride;
        T *x, *y;
        CHECK(cudaMalloc(&x, n * sizeof(T)));
        CHECK(cudaMalloc(&y, n * sizeof(T)));
        fill<T><<<1024, 256>>>(x, n, 99u, -5.0f, 5.0f);
        tk_softmax_call a = make_call(dtype, e.rows, e.cols, e.stride, e.log, x, y);
        a.causal = e.causal;
        a.causal_period = e.period;
        a.causal_offset = e.offset;
        a.scale = e.scale;
        std::vector<int64_t> all(e.rows);
        for (int64_t r = 0; r < e.rows; r++)
            all[r] = r;
        for (size_t i = 0; i < vs.size(); i++) {
            CHECK(cudaMemset(y, 0xff, n * sizeof(T)));
            CHECK(vs[i].run(&a));
            CHECK(cudaDeviceSynchronize());
            const double t = tol_ratio(a, all);
            worst[i] = std::max(worst[i], t);
            if (t > 1.0)
                printf("  EDGE FAIL %s %s rows %lld cols %lld stride %lld log %d causal %d offset %lld: tol %.3f\n",
                       dtype_name, vs[i].name.c_str(), (long long)e.rows, (long long)e.cols, (long long)e.stride,
                       e.log, e.causal, (long long)e.offset, t);
        }
        CHECK(cudaFree(x));
        CHECK(cudaFree(y));
    }
    printf("edge checks %s (fp64 reference, every row):", dtype_name);
    for (size_t i = 0; i < vs.size(); i++)
        printf("  %s tol %.3f", vs[i].name.c_str(), worst[i]);
    printf("\n");
}

/* One launch each of three stream kernels on 4096 x 131072 bf16 (for ncu). */
static void profile() {
    const int64_t rows = 4096, cols = 131072, n = rows * cols;
    __nv_bfloat16 *x, *y;
    CHECK(cudaMalloc(&x, n * 2));
    CHECK(cudaMalloc(&y, n * 2));
    fill<__nv_bfloat16><<<4096, 256>>>(x, n, 1234u, -8.0f, 8.0f);
    const tk_softmax_call a = make_call(TK_BF16, rows, cols, cols, false, x, y);
    CHECK((launch_stream<__nv_bfloat16, 8, false, 4, 0, 0, false>(&a, &dev, 0)));
    CHECK((launch_stream<__nv_bfloat16, 8, false, 4, 0, 0, true>(&a, &dev, 0)));
    CHECK((launch_stream<__nv_bfloat16, 8, false, 4, 2, 2, true>(&a, &dev, 0)));
    CHECK(cudaDeviceSynchronize());
    printf("profile: stream nopf U4, stream pf U4, stream pf U4 poly 2/2 launched\n");
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
    if (argc > 1 && strcmp(argv[1], "profile") == 0) {
        profile();
        return 0;
    }
    printf("%s, %d SMs, L2 %d MB\n", prop.name, dev.sm_count, dev.l2_bytes >> 20);
    flush_bytes = 2 * (size_t)dev.l2_bytes;
    CHECK(cudaMalloc(&flush_buf, flush_bytes));
    using bf16 = __nv_bfloat16;
    bench_shape<bf16>("bf16", TK_BF16, 4096, 131072, false, false, forward_variants<bf16>(true));
    bench_shape<bf16>("bf16", TK_BF16, 4096, 131072, true, false, forward_variants<bf16>(true));
    bench_shape<__half>("f16", TK_F16, 4096, 131072, false, false, forward_variants<__half>(true));
    bench_shape<bf16>("bf16", TK_BF16, 4096, 131072, true, true,
                      {stream_variant<bf16, true, 2, 0, 0, false>("stream nopf U2"),
                       stream_variant<bf16, true, 2, 0, 0, true>("stream pf U2"),
                       stream_variant<bf16, true, 2, 0, 2, true>("stream pf U2 poly -/2"),
                       stream_variant<bf16, true, 4, 0, 0, true>("stream pf U4"),
                       stream_variant<bf16, true, 2, 0, -1, true>("DIAG stream pf U2 noexp")});
    bench_shape<bf16>("bf16", TK_BF16, 8192, 65536, false, false, forward_variants<bf16>(false));
    bench_shape<float>("f32", TK_F32, 2048, 131072, false, false,
                       {stream_variant<float, false, 4, 0, 0, false>("stream nopf U4"),
                        stream_variant<float, false, 4, 0, 0, true>("stream pf U4"),
                        pipelined_variant<float, 0, 0>("pipelined B4", 4)});
    check_edges<bf16>("bf16", TK_BF16);
    check_edges<__half>("f16", TK_F16);
    return 0;
}
