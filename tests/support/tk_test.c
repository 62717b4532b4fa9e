/* Test support; see tk_test.h. */
#include "tk_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

const char *tk_test_gpu_missing_reason(void) {
    static char reason[256];
    tk_device_info info = TK_DEVICE_INFO_INIT;
    tk_status s = tk_device_query(&info);
    if (s != TK_SUCCESS) {
        snprintf(reason, sizeof reason, "no CUDA device: %s", tk_last_error());
        return reason;
    }
    if (!info.supported) {
        snprintf(reason, sizeof reason, "device %d (compute capability %d) is not supported by this build",
                 info.device, info.compute_capability);
        return reason;
    }
    return NULL;
}

bool tk_test_under_sanitizer(void) {
    const char *v = getenv("TKERN_TEST_UNDER_SANITIZER");
    return v && *v && strcmp(v, "0") != 0;
}

bool tk_test_under_racecheck(void) {
    const char *v = getenv("TKERN_TEST_UNDER_SANITIZER");
    return v != NULL && strcmp(v, "racecheck") == 0;
}

tk_status tk_test_attention_fwd(const tk_attention_params *p, int64_t sliding_left, tk_stream_t stream) {
    bool swapped = false;
    if (tk_test_under_racecheck() && p != NULL) {
        tk_attention_params query = *p;
        if (sliding_left >= 0)
            query.causal = 1, query.window_left = sliding_left, query.window_right = 0;
        const char *name = NULL;
        swapped = tk_attention_supported(&query, &name) == TK_SUCCESS && strcmp(name, "wgmma_sm90_persistent") == 0 &&
                  tk_experimental_force_variant("attention", "wgmma_sm90") == TK_SUCCESS;
    }
    const tk_status s =
        sliding_left >= 0 ? tk_attention_sliding_fwd(p, sliding_left, stream) : tk_attention_fwd(p, stream);
    if (swapped && s == TK_SUCCESS) /* on failure the caller reports tk_last_error() first */
        tk_experimental_force_variant("attention", NULL);
    return s;
}

bool tk_test_have_device(void) {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void tk_fill_sentinel(void *p, size_t bytes) { memset(p, TK_SENTINEL_BYTE, bytes); }

bool tk_is_sentinel(const void *p, size_t bytes) {
    const unsigned char *c = p;
    for (size_t i = 0; i < bytes; i++)
        if (c[i] != TK_SENTINEL_BYTE)
            return false;
    return true;
}

/* ---- host dtype conversion ---- */

size_t tk_test_dtype_size(tk_dtype dtype) { return dtype == TK_F32 ? 4 : 2; }

const char *tk_test_dtype_name(tk_dtype dtype) {
    return dtype == TK_F32 ? "f32" : dtype == TK_F16 ? "f16" : dtype == TK_BF16 ? "bf16" : "?";
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static double half_to_double(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
    double v;
    if (exp == 0)
        v = ldexp(mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexp(mant + 1024, exp - 25);
    return sign ? -v : v;
}

static uint16_t double_to_half(double d) {
    float f = (float)d; /* double rounding is harmless for test data that is f16-exact or random */
    uint32_t x = float_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    if (isnan(f))
        return (uint16_t)(sign | 0x7e00);
    float a = fabsf(f);
    if (a >= 65520.0f)
        return (uint16_t)(sign | 0x7c00);
    if (a < ldexpf(1.0f, -14)) { /* subnormal: multiples of 2^-24, round to nearest even */
        float q = a * ldexpf(1.0f, 24);
        return (uint16_t)(sign | (uint16_t)nearbyintf(q));
    }
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    float scaled = ldexpf(m, 11); /* 11 significant bits */
    uint32_t q = (uint32_t)nearbyintf(scaled);
    if (q == 2048) {
        q = 1024;
        e++;
    }
    return (uint16_t)(sign | ((uint32_t)(e + 14) << 10) | (q - 1024));
}

static double bf16_to_double(uint16_t b) { return bits_to_float((uint32_t)b << 16); }

static uint16_t double_to_bf16(double d) {
    float f = (float)d;
    uint32_t x = float_to_bits(f);
    if (isnan(f))
        return (uint16_t)((x >> 16) | 0x40);
    uint32_t rounding = 0x7fff + ((x >> 16) & 1);
    return (uint16_t)((x + rounding) >> 16);
}

double tk_test_load(tk_dtype dtype, const void *base, int64_t i) {
    switch (dtype) {
    case TK_F32: return ((const float *)base)[i];
    case TK_F16: return half_to_double(((const uint16_t *)base)[i]);
    case TK_BF16: return bf16_to_double(((const uint16_t *)base)[i]);
    }
    return NAN;
}

void tk_test_store(tk_dtype dtype, void *base, int64_t i, double v) {
    switch (dtype) {
    case TK_F32: ((float *)base)[i] = (float)v; break;
    case TK_F16: ((uint16_t *)base)[i] = double_to_half(v); break;
    case TK_BF16: ((uint16_t *)base)[i] = double_to_bf16(v); break;
    }
}

double tk_test_round(tk_dtype dtype, double v) {
    uint32_t tmp;
    tk_test_store(dtype, &tmp, 0, v);
    return tk_test_load(dtype, &tmp, 0);
}

/* ---- random ---- */

tk_rng tk_rng_seeded(uint64_t seed) {
    tk_rng r = {seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull};
    return r;
}

double tk_rng_uniform(tk_rng *rng, double lo, double hi) {
    /* splitmix64 */
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * ((double)(z >> 11) * 0x1.0p-53);
}

void tk_fill_uniform(tk_rng *rng, tk_dtype dtype, void *host, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++)
        tk_test_store(dtype, host, i, tk_rng_uniform(rng, lo, hi));
}

/* ---- device ---- */

void *tk_dev_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    cr_assert_eq(e, cudaSuccess, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    return p;
}

void tk_dev_free(void *p) { cudaFree(p); }

void tk_to_dev(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    cr_assert_eq(e, cudaSuccess, "cudaMemcpy to device: %s", cudaGetErrorString(e));
}

void tk_to_host(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    cr_assert_eq(e, cudaSuccess, "cudaMemcpy to host: %s", cudaGetErrorString(e));
}

void tk_dev_poison(void *p, size_t bytes) {
    cudaError_t e = cudaMemset(p, 0xff, bytes);
    cr_assert_eq(e, cudaSuccess, "cudaMemset: %s", cudaGetErrorString(e));
}

void tk_dev_sync(void) {
    cudaError_t e = cudaDeviceSynchronize();
    cr_assert_eq(e, cudaSuccess, "kernel failed: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
}

/* ---- compare ---- */

tk_compare tk_compare_to_ref(tk_dtype dtype, const void *got, const double *ref, int64_t n,
                             double atol_scale) {
    tk_compare c = {0, 0, -1, 0};
    for (int64_t i = 0; i < n; i++) {
        double g = tk_test_load(dtype, got, i);
        if (!isfinite(g) && isfinite(ref[i])) {
            if (c.nan_count++ == 0)
                c.worst_index = i;
            continue;
        }
        if (!isfinite(ref[i]))
            continue;
        double abs_err = fabs(g - ref[i]);
        double rel = abs_err / (atol_scale + fabs(ref[i]));
        if (abs_err > c.max_abs_err)
            c.max_abs_err = abs_err;
        if (rel > c.max_rel_err) {
            c.max_rel_err = rel;
            if (c.nan_count == 0)
                c.worst_index = i;
        }
    }
    return c;
}

double tk_default_rtol(tk_dtype dtype) {
    return dtype == TK_F32 ? 1e-5 : dtype == TK_F16 ? 1e-3 : 1e-2;
}

double tk_subnormal_half_step(tk_dtype dtype) {
    return ldexp(1.0, dtype == TK_F32 ? -150 : dtype == TK_F16 ? -25 : -134);
}

bool tk_build_has_arch(const char *arch) {
    static const char archs[] = TK_COMPILED_ARCHS;
    const size_t len = strlen(arch);
    for (const char *s = archs; (s = strstr(s, arch)) != NULL; s += len)
        if ((s == archs || s[-1] == ' ') && (s[len] == ' ' || s[len] == '\0'))
            return true;
    return false;
}

bool tk_build_runs_variant(int min_cc, int cc) {
    const char *s = TK_COMPILED_ARCHS;
    while (*s) {
        while (*s == ' ')
            s++;
        const bool ptx = strncmp(s, "compute_", 8) == 0;
        if (ptx)
            s += 8;
        int arch_cc = 0;
        for (; *s >= '0' && *s <= '9'; s++)
            arch_cc = arch_cc * 10 + (*s - '0');
        arch_cc *= 10;
        const bool arch_specific = *s == 'a';
        while (*s && *s != ' ')
            s++;
        if (arch_cc == 0 || arch_cc < min_cc)
            continue;
        if (ptx ? arch_cc <= cc
                : arch_specific ? arch_cc == cc : arch_cc / 100 == cc / 100 && arch_cc <= cc)
            return true;
    }
    return false;
}

bool tk_sm90_runs_here(void) {
    static int runs = -1;
    if (runs < 0) {
        tk_device_info info = TK_DEVICE_INFO_INIT;
        cr_assert_eq(tk_device_query(&info), TK_SUCCESS, "%s", tk_last_error());
        runs = info.compute_capability == 900 && tk_build_runs_variant(900, info.compute_capability);
    }
    return runs == 1;
}

int tk_attention_bwd_bn128_smem(int64_t head_dim) {
    const int bm = head_dim <= 80 || head_dim == 128 ? 64 : 32, row = 2 * (int)head_dim + 16;
    return 2 * 128 * row + 2 * (2 * bm * row + 2 * bm * 4) + 128 * (2 * bm + 16) + 128 * 8 + 128;
}

int tk_attention_bwd_d256_smem(void) {
    const int row = 2 * 256 + 16;
    return 2 * 64 * row + 2 * (2 * 32 * row + 2 * 32 * 4) + 2 * 64 * (2 * 32 + 16) + 64 * 8 + 128;
}

void tk_assert_dev_bytes_equal(const void *dev, const void *want, size_t bytes, const char *what) {
    unsigned char *got = malloc(bytes);
    cr_assert(got != NULL);
    tk_to_host(got, dev, bytes);
    size_t first = 0;
    while (first < bytes && got[first] == ((const unsigned char *)want)[first])
        first++;
    free(got);
    cr_assert(first == bytes, "%s: byte %zu of %zu differs from the out-of-place result", what, first, bytes);
}
