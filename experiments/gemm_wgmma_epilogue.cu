/*
 * The store pattern of the wgmma kernel's register epilogue (cuda/gemm_wgmma.cu, store_fragments
 * in cuda/gemm_epilogue.cuh). On the H200 the plain GEMM (no bias, no activation) measured
 * slower than the same kernel with a bias or bias + GELU in tkbench (8192^3: 1.64 ms against
 * 1.49 ms), although it does less work. In the fragment layout each thread writes 2 columns per
 * store (64 4-byte stores per thread and 256-column strip; a warp's store covers 8 rows x 16
 * bytes, half sectors), and without bias loads in between the plain epilogue issues them in one
 * burst while the other consumer warpgroup's main loop runs. The variants gather runs of 4 or 8
 * columns within each quad of lanes first (__shfl_xor_sync), for whole-sector 8- or 16-byte
 * stores, a half or a quarter of the store instructions:
 *
 *   main     tk_gemm of the library given on the command line (main's build: the current kernel)
 *   run2     this tree's kernel, runs of 2 (the fragment layout as it is)
 *   run4     runs of 4 (one exchange with the neighbouring lane)
 *   run8     runs of 8 (and a second exchange between the row halves)
 *
 * bf16 in and out, B as [N, K], each timing after 100 ms of idle GPU (the power state moves the
 * results), median of REPS with the L2 flushed before each call, the timings of a shape in one
 * order in round 1 and the reverse in round 2. Every variant's D is compared bit for bit with
 * main's (the arithmetic per element is the same), at the timed shapes and at small ones with M
 * and N edges, unaligned D rows, C separate and aliasing D, f16 / f32 outputs and activations;
 * the comparison covers the whole D allocation, padding included (nothing written outside D).
 *
 *   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -Iinclude -Icuda -gencode=arch=compute_90a,code=sm_90a \
 *        --split-compile=0 -cudart shared -o /tmp/gemm_wgmma_epilogue experiments/gemm_wgmma_epilogue.cu \
 *        -lcublas -ldl
 *   /tmp/gemm_wgmma_epilogue MAIN_LIBTKERN_SO [rounds]
 */
#include "gemm_wgmma.cu"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

#include <vector>

#include "experiment.h"
#include "tkern.h"

namespace {

using tk_gemm_fn = tk_status (*)(const tk_gemm_params *, tk_stream_t);
using launcher = cudaError_t (*)(const tk_gemm_call *, const tk_device *, cudaStream_t);

struct store_variant {
    const char *name;
    launcher launch;
};
const store_variant store_variants[] = {
    {"run2", launch_kernel<__nv_bfloat16, 2>},
    {"run4", launch_kernel<__nv_bfloat16, 4>},
    {"run8", launch_kernel<__nv_bfloat16, 8>},
};
constexpr int STORE_VARIANTS = sizeof store_variants / sizeof store_variants[0];

const int REPS = 7;
const int SETTLE_MS = 100;
void *flush_buf;
const size_t FLUSH_BYTES = 256u << 20;
tk_device device;
tk_gemm_fn main_gemm;

/* tk_gemm's packing of validated parameters (src/gemm.c). */
tk_gemm_call call_of(const tk_gemm_params &p) {
    tk_gemm_call c = {};
    c.m = p.m; c.n = p.n; c.k = p.k;
    c.input_dtype = p.input_dtype; c.output_dtype = p.output_dtype;
    c.b_layout = p.b_layout; c.activation = p.activation;
    c.a = p.a; c.b = p.b; c.c = p.beta != 0.0f ? p.c : nullptr; c.bias = p.bias; c.d = p.d;
    c.lda = p.lda; c.ldb = p.ldb; c.ldc = p.beta != 0.0f ? p.ldc : 0; c.ldd = p.ldd;
    c.alpha = p.alpha; c.beta = p.beta;
    c.sm_count = device.sm_count; c.max_smem_optin = device.max_smem_optin;
    return c;
}

cudaError_t run_main(const tk_gemm_params &p) {
    return main_gemm(&p, nullptr) == TK_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

cudaError_t run_variant(int v, const tk_gemm_params &p) {
    const tk_gemm_call c = call_of(p);
    return store_variants[v].launch(&c, &device, 0);
}

double settled_ms(const std::function<cudaError_t()> &f) {
    CHECK(cudaDeviceSynchronize());
    usleep(SETTLE_MS * 1000);
    return experiment_time_ms(f, 1, REPS, flush_buf, FLUSH_BYTES);
}

__global__ void fill_uniform(__nv_bfloat16 *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15; h *= 0x85EBCA77u; h ^= h >> 13; h *= 0xC2B2AE3Du; h ^= h >> 16;
        x[i] = __float2bfloat16((h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

/* How many 16-bit words of a and b differ. */
__global__ void count_differences(const uint16_t *a, const uint16_t *b, size_t n, unsigned long long *count) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        local += a[i] != b[i];
    if (local)
        atomicAdd(count, local);
}

unsigned long long differences(const void *a, const void *b, size_t bytes) {
    static unsigned long long *count;
    if (!count)
        CHECK(cudaMalloc(&count, sizeof *count));
    CHECK(cudaMemset(count, 0, sizeof *count));
    count_differences<<<1024, 256>>>(static_cast<const uint16_t *>(a), static_cast<const uint16_t *>(b), bytes / 2,
                                     count);
    unsigned long long h;
    CHECK(cudaMemcpy(&h, count, sizeof h, cudaMemcpyDeviceToHost));
    return h;
}

/* ---- bit-exact checks at small shapes with edges ---- */

struct epilogue_case {
    const char *name;
    tk_activation act;
    tk_dtype out;
    float alpha, beta;
    bool bias, alias;
};
const epilogue_case edge_epilogues[] = {
    {"plain bf16", TK_ACT_NONE, TK_BF16, 1.0f, 0.0f, false, false},
    {"gelu_erf f32 alpha bias", TK_ACT_GELU_ERF, TK_F32, 0.5f, 0.0f, true, false},
    {"gelu_tanh bf16 C bias", TK_ACT_GELU_TANH, TK_BF16, 1.0f, 1.0f, true, false},
    {"quick_gelu f16 C=D", TK_ACT_QUICK_GELU, TK_F16, -1.25f, 0.5f, false, true},
    {"silu f32 C=D bias", TK_ACT_SILU, TK_F32, 0.75f, -2.0f, true, true},
    {"relu_sq f16 C", TK_ACT_RELU_SQUARED, TK_F16, 0.25f, 1.0f, false, false},
    {"relu f16 bias", TK_ACT_RELU, TK_F16, 2.0f, 0.0f, true, false},
};

/* M x N x K with D's rows padded by `pad` elements and D, C and bias shifted by `offset`
 * elements; every epilogue of edge_epilogues through main and every variant. Returns the number
 * of mismatches. */
int check_edges(int64_t m, int64_t n, int64_t k, int64_t pad, int offset) {
    const int64_t lda = (k + 7) / 8 * 8, ldd = n + pad, ldc_sep = ldd + 8;
    __nv_bfloat16 *a, *b;
    CHECK(cudaMalloc(&a, m * lda * 2));
    CHECK(cudaMalloc(&b, n * lda * 2));
    fill_uniform<<<256, 256>>>(a, m * lda, 11);
    fill_uniform<<<256, 256>>>(b, n * lda, 12);
    int bad = 0;
    for (const epilogue_case &e : edge_epilogues) {
        const size_t es = e.out == TK_F32 ? 4 : 2;
        const int64_t ldc = e.alias ? ldd : ldc_sep;
        const size_t d_bytes = (size_t)(m * ldd + offset) * es, c_bytes = (size_t)(m * ldc + offset) * es;
        void *d, *ref, *c, *bias;
        CHECK(cudaMalloc(&d, d_bytes));
        CHECK(cudaMalloc(&ref, d_bytes));
        CHECK(cudaMalloc(&c, c_bytes));
        CHECK(cudaMalloc(&bias, (n + offset) * es));
        /* random 16-bit words: finite f16 / bf16 values and f32 values of any size */
        fill_uniform<<<256, 256>>>(static_cast<__nv_bfloat16 *>(c), c_bytes / 2, 13);
        fill_uniform<<<256, 256>>>(static_cast<__nv_bfloat16 *>(bias), (n + offset) * es / 2, 14);
        tk_gemm_params p = TK_GEMM_PARAMS_INIT;
        p.m = m; p.n = n; p.k = k;
        p.input_dtype = TK_BF16; p.output_dtype = e.out; p.b_layout = TK_GEMM_B_NK;
        p.a = a; p.lda = lda; p.b = b; p.ldb = lda;
        p.ldd = ldd; p.ldc = ldc;
        p.bias = e.bias ? static_cast<char *>(bias) + offset * es : nullptr;
        p.activation = e.act; p.alpha = e.alpha; p.beta = e.beta;
        /* D starts as C (aliased) or as 0xff bytes (NaN), the same for every kernel */
        auto run_into = [&](void *out, const std::function<cudaError_t()> &f) {
            if (e.alias)
                CHECK(cudaMemcpy(out, c, d_bytes, cudaMemcpyDeviceToDevice));
            else
                CHECK(cudaMemset(out, 0xff, d_bytes));
            p.d = static_cast<char *>(out) + offset * es;
            p.c = e.beta == 0.0f ? nullptr : e.alias ? p.d : static_cast<char *>(c) + offset * es;
            CHECK(f());
            CHECK(cudaDeviceSynchronize());
        };
        run_into(ref, [&] { return run_main(p); });
        for (int v = 0; v < STORE_VARIANTS; v++) {
            run_into(d, [&] { return run_variant(v, p); });
            const unsigned long long diff = differences(d, ref, d_bytes);
            if (diff) {
                printf("MISMATCH %lldx%lldx%lld pad %lld offset %d %s %s: %llu of %zu 16-bit words differ\n",
                       (long long)m, (long long)n, (long long)k, (long long)pad, offset, e.name,
                       store_variants[v].name, diff, d_bytes / 2);
                bad++;
            }
        }
        cudaFree(d); cudaFree(ref); cudaFree(c); cudaFree(bias);
    }
    cudaFree(a); cudaFree(b);
    return bad;
}

/* ---- timed shapes ---- */

struct timing {
    const char *kernel;
    int variant; /* -1: main's tk_gemm, -2: cuBLAS */
    int epilogue; /* 0 plain, 1 bias, 2 bias + GELU tanh */
};
const char *const epilogue_names[] = {"plain", "bias", "bias+gelu_tanh"};

void time_shape(int64_t m, int64_t n, int64_t k, int rounds, cublasHandle_t blas) {
    __nv_bfloat16 *a, *b, *bias, *d, *ref;
    CHECK(cudaMalloc(&a, m * k * 2));
    CHECK(cudaMalloc(&b, n * k * 2));
    CHECK(cudaMalloc(&bias, n * 2));
    CHECK(cudaMalloc(&d, m * n * 2));
    CHECK(cudaMalloc(&ref, m * n * 2));
    fill_uniform<<<1024, 256>>>(a, m * k, 1);
    fill_uniform<<<1024, 256>>>(b, n * k, 2);
    fill_uniform<<<1024, 256>>>(bias, n, 3);
    tk_gemm_params params[3];
    for (int e = 0; e < 3; e++) {
        tk_gemm_params p = TK_GEMM_PARAMS_INIT;
        p.m = m; p.n = n; p.k = k;
        p.input_dtype = TK_BF16; p.output_dtype = TK_BF16; p.b_layout = TK_GEMM_B_NK;
        p.a = a; p.lda = k; p.b = b; p.ldb = k; p.d = d; p.ldd = n;
        p.bias = e > 0 ? bias : nullptr;
        p.activation = e == 2 ? TK_ACT_GELU_TANH : TK_ACT_NONE;
        params[e] = p;
    }
    auto cublas = [&] {
        const float alpha = 1.0f, beta = 0.0f;
        return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, b, CUDA_R_16BF, (int)k,
                            a, CUDA_R_16BF, (int)k, &beta, d, CUDA_R_16BF, (int)n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS
                   ? cudaSuccess
                   : cudaErrorUnknown;
    };
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)m, (long long)n, (long long)k);

    /* D of every variant and epilogue against main's, bit for bit; main's plain D against cuBLAS */
    unsigned *err;
    CHECK(cudaMalloc(&err, 2 * sizeof(unsigned)));
    for (int e = 0; e < 3; e++) {
        tk_gemm_params p = params[e];
        p.d = ref;
        CHECK(run_main(p));
        if (e == 0) {
            CHECK(cublas());
            CHECK(cudaMemset(err, 0, 2 * sizeof(unsigned)));
            experiment_max_error_bf16<<<1024, 256>>>(ref, d, m * n, err);
            unsigned h[2];
            CHECK(cudaMemcpy(h, err, sizeof h, cudaMemcpyDeviceToHost));
            float diff, mag;
            memcpy(&diff, &h[0], 4);
            memcpy(&mag, &h[1], 4);
            printf("%-17s main plain against cuBLAS: max |diff| / max |cuBLAS| %.2e\n", shape, diff / mag);
        }
        for (int v = 0; v < STORE_VARIANTS; v++) {
            CHECK(cudaMemset(d, 0xff, m * n * 2));
            CHECK(run_variant(v, params[e]));
            const unsigned long long diff = differences(d, ref, m * n * 2);
            printf("%-17s %s %-15s against main: %llu of %lld differ%s\n", shape, store_variants[v].name,
                   epilogue_names[e], diff, (long long)(m * n), diff ? "  MISMATCH" : "");
        }
    }
    cudaFree(err);
    fflush(stdout);

    std::vector<timing> order = {{"cuBLAS", -2, 0}};
    for (int e = 0; e < 3; e++)
        order.push_back({"main", -1, e});
    for (int v = 0; v < STORE_VARIANTS; v++)
        for (int e = 0; e < 3; e++)
            order.push_back({store_variants[v].name, v, e});
    const double flops = 2.0 * m * n * k;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < order.size(); i++) {
            const timing &t = order[r % 2 ? order.size() - 1 - i : i];
            const tk_gemm_params &p = params[t.epilogue];
            const double ms = t.variant == -2   ? settled_ms(cublas)
                              : t.variant == -1 ? settled_ms([&] { return run_main(p); })
                                                : settled_ms([&] { return run_variant(t.variant, p); });
            printf("%-17s round %d %-6s %-15s %8.4f ms %6.1f TFLOP/s\n", shape, r + 1, t.kernel,
                   epilogue_names[t.epilogue], ms, flops / ms * 1e-9);
            fflush(stdout);
        }
    }
    cudaFree(a); cudaFree(b); cudaFree(bias); cudaFree(d); cudaFree(ref);
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MAIN_LIBTKERN_SO [rounds]\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib || !(main_gemm = reinterpret_cast<tk_gemm_fn>(dlsym(lib, "tk_gemm")))) {
        fprintf(stderr, "%s: %s\n", argv[1], dlerror());
        return 2;
    }
    const int rounds = argc > 2 ? atoi(argv[2]) : 2;
    CHECK(cudaDeviceGetAttribute(&device.sm_count, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaDeviceGetAttribute(&device.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    CHECK(cudaMalloc(&flush_buf, FLUSH_BYTES));
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }

    /* M x N x K, padding, offset: M and N edges inside a tile (n = 1000: 232 columns of the last
     * strip; n = 261 with 16-byte aligned rows: the last run has 5 of its 8 columns and stores
     * them one by one, the others move whole), odd padding (rows alternately misaligned),
     * shifted pointers */
    const int64_t edge_shapes[][5] = {
        {1000, 1000, 1000, 0, 0}, {129, 261, 64, 3, 0}, {129, 264, 64, 3, 0},
        {300, 777, 129, 7, 1},    {200, 4100, 72, 8, 2},
    };
    int bad = 0;
    for (const auto &e : edge_shapes)
        bad += check_edges(e[0], e[1], e[2], e[3], (int)e[4]);
    printf("edge checks: %d mismatches (%zu epilogues x %zu shapes x %d variants against main)\n", bad,
           sizeof edge_epilogues / sizeof edge_epilogues[0], sizeof edge_shapes / sizeof edge_shapes[0],
           STORE_VARIANTS);
    fflush(stdout);

    const int64_t shapes[][3] = {{8192, 8192, 8192}, {16384, 4096, 4096}, {16384, 14336, 4096}, {4096, 4096, 4096}};
    for (const auto &s : shapes)
        time_shape(s[0], s[1], s[2], rounds, blas);
    cublasDestroy(blas);
    return 0;
}
