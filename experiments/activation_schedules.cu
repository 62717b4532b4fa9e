// Activation kernel design experiment: bf16 16384x4096, ratio to cudaMemcpy.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <math.h>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); exit(1);} } while (0)

typedef __nv_bfloat16 bf16;
enum { RELU, SILU, GELU_ERF, GELU_TANH, IDENT };
static const char *opname[] = {"relu", "silu", "gelu_erf", "gelu_tanh", "ident"};

__device__ __forceinline__ float sigm(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
template <int OP> __device__ __forceinline__ float act(float x) {
    if (OP == RELU) return x < 0.f ? 0.f : x;
    if (OP == SILU) return x * sigm(x);
    if (OP == GELU_TANH) { float u = 0.79788456f * x * (1.f + 0.044715f * x * x); return x * sigm(2.f * u); }
    if (OP == GELU_ERF) {
        const float z = fabsf(x) * 0.70710678f;
        const float t = __fdividef(1.0f, 1.0f + 0.3275911f * z);
        const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
        const float h = 0.5f * poly * __expf(-z * z);
        return x * (x < 0.f ? h : 1.f - h);
    }
    return x;
}

struct alignas(16) P8 { bf16 v[8]; };
template <int OP> __device__ __forceinline__ P8 apply(P8 a) {
    P8 r;
#pragma unroll
    for (int e = 0; e < 8; e++) r.v[e] = __float2bfloat16_rn(act<OP>(__bfloat162float(a.v[e])));
    return r;
}
__device__ __forceinline__ P8 ld(const P8 *p) { P8 r; *(uint4 *)&r = *(const uint4 *)p; return r; }
__device__ __forceinline__ P8 ld_na(const P8 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return *(P8 *)&r;
}
__device__ __forceinline__ void st(P8 *p, P8 v) { *(uint4 *)p = *(uint4 *)&v; }
__device__ __forceinline__ void st_cs(P8 *p, P8 v) { __stcs((uint4 *)p, *(uint4 *)&v); }

// One-shot: each thread U packs, blockDim apart; grid covers everything.
template <int OP, int U, bool NA, bool CS>
__global__ void __launch_bounds__(256) oneshot(const P8 *x, P8 *y, int64_t packs) {
    int64_t base = (int64_t)blockIdx.x * 256 * U + threadIdx.x;
    P8 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) { int64_t p = base + u * 256; if (p < packs) v[u] = NA ? ld_na(x + p) : ld(x + p); }
#pragma unroll
    for (int u = 0; u < U; u++) { int64_t p = base + u * 256; if (p < packs) { P8 r = apply<OP>(v[u]); if (CS) st_cs(y + p, r); else st(y + p, r); } }
}

// Current library design: persistent, software pipelined, U=2.
template <int OP>
__global__ void __launch_bounds__(256) pipelined(const P8 *x, P8 *y, int64_t packs) {
    constexpr int U = 2;
    const int64_t step = (int64_t)gridDim.x * 256 * U;
    int64_t first = (int64_t)blockIdx.x * 256 * U + threadIdx.x;
    P8 cur[U], nxt[U];
#pragma unroll
    for (int u = 0; u < U; u++) if (first + u * 256 < packs) cur[u] = ld(x + first + u * 256);
    for (; first < packs; first += step) {
#pragma unroll
        for (int u = 0; u < U; u++) if (first + step + u * 256 < packs) nxt[u] = ld(x + first + step + u * 256);
#pragma unroll
        for (int u = 0; u < U; u++) if (first + u * 256 < packs) st(y + first + u * 256, apply<OP>(cur[u]));
#pragma unroll
        for (int u = 0; u < U; u++) cur[u] = nxt[u];
    }
}

// ---- bulk copy (TMA 1-D) pipeline ----
__device__ __forceinline__ uint32_t sa(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(sa(b)), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sa(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(sa(b)), "r"(parity) : "memory");
    } while (!done);
}

// CHUNK packs per stage (256 threads x PPT packs), STAGES stages.
template <int OP, int PPT, int STAGES, bool CS>
__global__ void __launch_bounds__(256) bulk(const P8 *x, P8 *y, int64_t packs) {
    constexpr int CHUNK = 256 * PPT;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    P8 *buf = (P8 *)smem_raw;
    __shared__ uint64_t bar[STAGES];
    const int64_t chunks = (packs + CHUNK - 1) / CHUNK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&bar[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // chunk c of this block: blockIdx.x + k*gridDim.x, k = 0,1,...
    auto issue = [&](int64_t k) {
        int64_t c = blockIdx.x + k * gridDim.x;
        if (c < chunks) {
            int s = (int)(k % STAGES);
            int64_t p0 = c * CHUNK;
            int64_t n = packs - p0 < CHUNK ? packs - p0 : CHUNK;
            mbar_expect(&bar[s], (uint32_t)(n * 16));
            bulk_load(buf + s * CHUNK, x + p0, (uint32_t)(n * 16), &bar[s]);
        }
    };
    if (threadIdx.x == 0)
        for (int k = 0; k < STAGES - 1; k++) issue(k);
    for (int64_t k = 0;; k++) {
        int64_t c = blockIdx.x + k * gridDim.x;
        if (c >= chunks) break;
        if (threadIdx.x == 0) issue(k + STAGES - 1);
        int s = (int)(k % STAGES);
        mbar_wait(&bar[s], (uint32_t)((k / STAGES) & 1));
        int64_t p0 = c * CHUNK;
        P8 v[PPT];
#pragma unroll
        for (int u = 0; u < PPT; u++) v[u] = buf[s * CHUNK + u * 256 + threadIdx.x];
        __syncthreads(); // stage s free (refilled at iteration k+1 for k+STAGES)
#pragma unroll
        for (int u = 0; u < PPT; u++) {
            int64_t p = p0 + u * 256 + threadIdx.x;
            if (p < packs) { P8 r = apply<OP>(v[u]); if (CS) st_cs(y + p, r); else st(y + p, r); }
        }
    }
}

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

struct Ctx { void *flush; size_t flush_bytes; cudaEvent_t a, b; };
template <typename F> float timeit(Ctx &c, F f, int reps = 25) {
    for (int i = 0; i < 3; i++) f();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CK(cudaMemsetAsync(c.flush, i & 0xff, c.flush_bytes));
        CK(cudaEventRecord(c.a));
        f();
        CK(cudaEventRecord(c.b));
        CK(cudaEventSynchronize(c.b));
        float ms; CK(cudaEventElapsedTime(&ms, c.a, c.b)); t.push_back(ms);
    }
    CK(cudaGetLastError());
    return median(t);
}

static float host_bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static double ref(int op, double x) {
    switch (op) {
    case RELU: return x < 0 ? 0 : x;
    case SILU: return x / (1 + exp(-x));
    case GELU_ERF: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case GELU_TANH: return 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
    }
    return x;
}

int main() {
    const int64_t rows = 16384, cols = 4096, n = rows * cols, packs = n / 8;
    const size_t bytes = n * 2;
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::vector<uint16_t> hx(n);
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < n; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; float f = ((s >> 40) / 16777216.0f) * 8.f - 4.f; uint32_t u; memcpy(&u, &f, 4); hx[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }
    P8 *x, *y; CK(cudaMalloc(&x, bytes)); CK(cudaMalloc(&y, bytes));
    CK(cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice));
    Ctx c; c.flush_bytes = 512u << 20; CK(cudaMalloc(&c.flush, c.flush_bytes)); CK(cudaEventCreate(&c.a)); CK(cudaEventCreate(&c.b));
    void *cp; CK(cudaMalloc(&cp, bytes));
    float tcopy = timeit(c, [&] { CK(cudaMemcpyAsync(cp, x, bytes, cudaMemcpyDeviceToDevice)); });
    printf("copy %.4f ms  %.1f GB/s\n", tcopy, 2.0 * bytes / tcopy / 1e6);
    std::vector<uint16_t> hy(n);
    auto check = [&](int op) {
        CK(cudaMemcpy(hy.data(), y, bytes, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int64_t i = 0; i < n; i += 7) {
            double r = ref(op, host_bf(hx[i])), g = host_bf(hy[i]);
            double e = fabs(g - r) / (fabs(r) > 1 ? fabs(r) : 1.0);
            if (!(e <= worst)) worst = e;
        }
        return worst;
    };
    auto report = [&](const char *v, int op, float t) {
        double err = check(op);
        printf("%-10s %-24s %.4f ms %7.1f GB/s %.3fx copy  err %.2e %s\n", opname[op], v, t, 2.0 * bytes / t / 1e6, tcopy / t, err, err < 1e-2 ? "ok" : "FAIL");
    };
    auto run_op = [&](auto opc) {
        constexpr int OP = decltype(opc)::value;
        auto poison = [&] { CK(cudaMemset(y, 0xff, bytes)); };
#define ONESHOT(U, NA, CS) { poison(); auto k = oneshot<OP, U, NA, CS>; int64_t g = (packs + 256 * U - 1) / (256 * U); \
        float t = timeit(c, [&] { k<<<(unsigned)g, 256>>>(x, y, packs); }); report("oneshot U" #U " na" #NA " cs" #CS, OP, t); }
        ONESHOT(1, false, false) ONESHOT(2, false, false) ONESHOT(4, false, false) ONESHOT(2, true, false) ONESHOT(4, true, true) ONESHOT(2, false, true)
        {
            poison(); auto k = pipelined<OP>; int bps; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k, 256, 0));
            float t = timeit(c, [&] { k<<<bps * sms, 256>>>(x, y, packs); });
            char nm[64]; snprintf(nm, 64, "pipelined(lib) bps%d", bps); report(nm, OP, t);
        }
#define BULK(PPT, ST, CS) { poison(); auto k = bulk<OP, PPT, ST, CS>; size_t sm = (size_t)256 * PPT * 16 * ST; \
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm)); int bps; \
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k, 256, sm)); \
        float t = timeit(c, [&] { k<<<bps * sms, 256, sm>>>(x, y, packs); }); \
        char nm[64]; snprintf(nm, 64, "bulk ppt%d st%d cs%d bps%d", PPT, ST, (int)CS, bps); report(nm, OP, t); }
        BULK(2, 2, false) BULK(2, 4, false) BULK(4, 2, false) BULK(4, 3, false) BULK(4, 4, false) BULK(2, 4, true) BULK(8, 3, false)
    };
    run_op(std::integral_constant<int, RELU>());
    run_op(std::integral_constant<int, SILU>());
    run_op(std::integral_constant<int, GELU_ERF>());
    run_op(std::integral_constant<int, GELU_TANH>());
    tcopy = timeit(c, [&] { CK(cudaMemcpyAsync(cp, x, bytes, cudaMemcpyDeviceToDevice)); });
    printf("copy again %.4f ms  %.1f GB/s\n", tcopy, 2.0 * bytes / tcopy / 1e6);
    return 0;
}
