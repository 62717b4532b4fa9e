/*
 * Support shared by the Criterion suites: GPU detection, device buffers, random inputs,
 * poisoning, dtype conversion on the host, and comparison against fp64 references.
 *
 * GPU tests start with TK_REQUIRE_GPU(); it skips (with the reason) where no device is present,
 * so CI without a GPU runs the host-side tests and the GPU machine runs them all.
 */
#ifndef TK_TEST_H
#define TK_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <criterion/criterion.h>

#include "tkern.h"

/* Skips the current test unless a CUDA device that libtkern supports is present. */
#define TK_REQUIRE_GPU()                                              \
    do {                                                              \
        const char *tk_skip_reason_ = tk_test_gpu_missing_reason();   \
        if (tk_skip_reason_)                                          \
            cr_skip_test("%s", tk_skip_reason_);                      \
    } while (0)

/* Skips the current test when the suite runs under compute-sanitizer: `make sanitize` sets
 * TKERN_TEST_UNDER_SANITIZER=1. For tests whose buffers of hundreds of MB or several GB make the
 * tools take far too long (smaller tests run the same code paths), and for tests that provoke a
 * CUDA error on purpose (memcheck counts every failing CUDA call as an error). */
#define TK_SKIP_UNDER_SANITIZER(reason)                                      \
    do {                                                                     \
        if (tk_test_under_sanitizer())                                       \
            cr_skip_test("skipped under compute-sanitizer: %s", (reason));   \
    } while (0)

/* Whether TKERN_TEST_UNDER_SANITIZER is set to anything but "" or "0"; randomized sweeps read it
 * to run fewer cases under the sanitizer. */
bool tk_test_under_sanitizer(void);
/* Whether the sanitizer is racecheck (`make sanitize` sets the variable to the tool's name). Its
 * shared-memory race detection does not model mbarrier arrive (release) / wait (acquire): a
 * hand-off of ordinary shared-memory stores and loads through an mbarrier is reported as a race
 * (a one-mbarrier probe: 2 hazards on the H200, CUDA 13.0). The persistent attention's earlier
 * form was reported for its mask-table hand-off through named barriers; its present form has not
 * run under racecheck yet (docs/kernels/attention.md, Persistent). Tests do not run, under
 * racecheck alone, the variants whose correctness rests on such a hand-off, nor the persistent
 * attention until a racecheck run of it is clean, and say so. */
bool tk_test_under_racecheck(void);
/* tk_attention_fwd(p) (sliding_left < 0) or tk_attention_sliding_fwd(p, sliding_left), for tests
 * that run the forward's automatic choice only to feed another check (the backward, concurrency):
 * under racecheck, where that choice is "wgmma_sm90_persistent" (above), the call runs
 * "wgmma_sm90" instead, forced on the calling thread and released after a success. */
tk_status tk_test_attention_fwd(const tk_attention_params *p, int64_t sliding_left, tk_stream_t stream);

/* NULL when a supported GPU is present, else why not (static string). */
const char *tk_test_gpu_missing_reason(void);
/* Whether a CUDA device is present at all (for tests of the no-device behaviour). */
bool tk_test_have_device(void);

/* Whether the build's space-separated ARCHS list (TK_COMPILED_ARCHS, e.g. "80 90a compute_90")
 * names the target `arch` exactly: "90a" does not match "90" or "compute_90a". */
bool tk_build_has_arch(const char *arch);

/* Whether the build has code for a variant of minimum compute capability min_cc (e.g. 900) that
 * a device of compute capability cc can run, by the runtime's rules: "compute_XY" (PTX) runs on
 * cc >= XY0, "XYa" only on cc == XY0, "XY" (SASS) within its major version on cc >= XY0. */
bool tk_build_runs_variant(int min_cc, int cc);

/* Whether the Hopper variants ("wgmma_sm90" and its kin, min_cc 900, arch-specific) run on this
 * machine: a cc 9.0 device and a build with its code (the runtime's rule; the library's builds
 * for sm_90 include sm_90a). Asserts that the device query succeeds. */
bool tk_sm90_runs_here(void);

/* Shared memory per block of the attention backward's "mma_sm80_bn128" at a head dim (K and V of
 * 128 keys, two stages of Q, dO, lse and D over BM = 64 query rows at head dims 64, 80 and 128,
 * 32 at 96, dS^T, the key table; rows padded by 16 bytes) and of "mma_sm80_d256" (K and V of
 * 64 keys, two stages of 32 query rows, dS^T and P^T, the key table), each with the static shared
 * memory (the deterministic kernel's ticket, 128 bytes with the dynamic part's alignment): a
 * variant claims its head dims on the devices whose shared memory per block holds it (bn128 at
 * 80 and 128, and d256, not on sm_86 / sm_89). */
int tk_attention_bwd_bn128_smem(int64_t head_dim);
int tk_attention_bwd_d256_smem(void);

/* Asserts a call's status, and that tk_last_error() mentions `needle` (e.g. the argument's
 * name) when the status is a failure. */
#define TK_EXPECT_STATUS(call, expected, needle)                                                 \
    do {                                                                                         \
        tk_status tk_got_ = (call);                                                              \
        cr_assert_eq(tk_got_, (expected), "%s returned %s, expected %s (last error: \"%s\")",    \
                     #call, tk_status_string(tk_got_), tk_status_string(expected),               \
                     tk_last_error());                                                           \
        if ((expected) != TK_SUCCESS)                                                            \
            cr_assert(strstr(tk_last_error(), (needle)) != NULL,                                 \
                      "%s: message \"%s\" does not name \"%s\"", #call, tk_last_error(),         \
                      (needle));                                                                 \
    } while (0)

/* ---- host buffers that stand in for outputs in bad-input tests (never dereferenced by the
 * library): filled with a sentinel byte, then checked untouched. ---- */
#define TK_SENTINEL_BYTE 0x5a
void tk_fill_sentinel(void *p, size_t bytes);
bool tk_is_sentinel(const void *p, size_t bytes);

/* ---- dtype conversion on the host (round to nearest even) ---- */
size_t tk_test_dtype_size(tk_dtype dtype);
const char *tk_test_dtype_name(tk_dtype dtype);
double tk_test_load(tk_dtype dtype, const void *base, int64_t index);
void tk_test_store(tk_dtype dtype, void *base, int64_t index, double value);
/* The value that storing `value` in dtype and reading it back gives. */
double tk_test_round(tk_dtype dtype, double value);

/* ---- random inputs ---- */
/* A reproducible generator: every test seeds its own. */
typedef struct tk_rng {
    uint64_t state;
} tk_rng;
tk_rng tk_rng_seeded(uint64_t seed);
double tk_rng_uniform(tk_rng *rng, double lo, double hi);
/* Fills n elements of a host array of dtype with uniform values in [lo, hi), rounded to dtype. */
void tk_fill_uniform(tk_rng *rng, tk_dtype dtype, void *host, int64_t n, double lo, double hi);

/* ---- device buffers; each asserts success (cr_assert) ---- */
void *tk_dev_alloc(size_t bytes);
void tk_dev_free(void *p);
void tk_to_dev(void *dst, const void *src, size_t bytes);
void tk_to_host(void *dst, const void *src, size_t bytes);
/* Fills with 0xff bytes: NaN in f32, f16 and bf16, so unwritten outputs fail comparisons. */
void tk_dev_poison(void *p, size_t bytes);
/* cudaDeviceSynchronize, asserting no error (kernel faults surface here). */
void tk_dev_sync(void);

/* ---- comparison ---- */
typedef struct tk_compare {
    double max_abs_err;       /* max |got - ref| */
    double max_rel_err;       /* max |got - ref| / (atol_scale + |ref|) */
    int64_t worst_index;
    int64_t nan_count;        /* NaN or Inf in got where ref is finite */
} tk_compare;
/* Compares n elements of `got` (host copy of an output of dtype) with fp64 `ref`. */
tk_compare tk_compare_to_ref(tk_dtype dtype, const void *got, const double *ref, int64_t n,
                             double atol_scale);
/* Default relative tolerance per dtype: f32 1e-5, f16 1e-3, bf16 1e-2 (GUIDE section 5),
 * for results computed in f32 and rounded once to dtype. */
double tk_default_rtol(tk_dtype dtype);
/* Half the spacing of dtype's subnormals (f16 2^-25, bf16 2^-134, f32 2^-150): how far a value
 * rounded correctly to dtype may lie from the exact one where |value| is below dtype's smallest
 * normal, and relative tolerances no longer bound it. An absolute term of every such check. */
double tk_subnormal_half_step(tk_dtype dtype);

/* Asserts that `got` matches `ref` within rtol (relative to atol_scale + |ref|), with no NaN,
 * naming `what` (the case) in the failure message. */
#define TK_ASSERT_CLOSE(dtype, got, ref, n, rtol, atol_scale, what)                              \
    do {                                                                                         \
        tk_compare tk_c_ = tk_compare_to_ref((dtype), (got), (ref), (n), (atol_scale));          \
        cr_assert(tk_c_.nan_count == 0, "%s: %lld non-finite outputs (first bad index %lld)",   \
                  (what), (long long)tk_c_.nan_count, (long long)tk_c_.worst_index);             \
        cr_assert(tk_c_.max_rel_err <= (rtol),                                                   \
                  "%s: max rel err %.3g > %.3g at index %lld (max abs err %.3g)", (what),        \
                  tk_c_.max_rel_err, (double)(rtol), (long long)tk_c_.worst_index,               \
                  tk_c_.max_abs_err);                                                            \
    } while (0)

/* Asserts that `bytes` bytes of device memory at dev equal the host bytes at want (an in-place
 * result against its out-of-place one, bit for bit), naming `what` and the first differing byte. */
void tk_assert_dev_bytes_equal(const void *dev, const void *want, size_t bytes, const char *what);

#endif
