/*
 * Host runtime shared by every op family: the last-error message, the per-device cache, the
 * variant tables and the conversion of CUDA errors into tk_status. Internal, C11.
 *
 * The shape of every entry point (see src/activation.c):
 *
 *     tk_status tk_foo(...) {
 *         static const char fn[] = "tk_foo";
 *         tk_begin_call();
 *         ...validate every argument, return tk_fail(...) naming it...   (no CUDA call yet)
 *         if (nothing to do) return TK_SUCCESS;
 *         const tk_device *dev;  TK_TRY(tk_current_device(fn, &dev));
 *         const tk_variant *v;   TK_TRY(tk_select_variant(fn, &tk_op_foo, dev, &call, &v));
 *         return tk_launched(fn, v, v->launch(&call, dev, stream));
 *     }
 */
#ifndef TK_RUNTIME_H
#define TK_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "tkern.h"
#include "../cuda/launch.h"

#if defined(__GNUC__)
#define TK_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define TK_PRINTF(fmt_index, first_arg)
#endif

/* Return early from the enclosing function when a tk_status expression fails. */
#define TK_TRY(expr)                              \
    do {                                          \
        tk_status tk_try_status_ = (expr);        \
        if (tk_try_status_ != TK_SUCCESS)         \
            return tk_try_status_;                \
    } while (0)

/* ---- errors ---- */

/* Clears the calling thread's last-error message; every entry point calls it first. */
void tk_begin_call(void);

/* Records "<fn>: <formatted message>" as the thread's last error and returns status. */
tk_status tk_fail(tk_status status, const char *fn, const char *fmt, ...) TK_PRINTF(3, 4);

/* TK_SUCCESS for cudaSuccess, else TK_ERROR_CUDA with "<fn>: <what>: <cuda error name>: <text>". */
tk_status tk_cuda_check(const char *fn, const char *what, cudaError_t err);

/* ---- argument checks shared by the families; each returns tk_fail(...) on failure ---- */

bool tk_dtype_valid(tk_dtype dtype);
size_t tk_dtype_size(tk_dtype dtype);
const char *tk_dtype_name(tk_dtype dtype);

/* TK_ERROR_NULL_POINTER naming `name` unless p != NULL. */
tk_status tk_check_not_null(const char *fn, const char *name, const void *p);
/* TK_ERROR_INVALID_VALUE for an unknown dtype. */
tk_status tk_check_dtype(const char *fn, const char *name, tk_dtype dtype);
/* a * b into *out, TK_ERROR_INVALID_VALUE naming `what` when it overflows int64. Both >= 0. */
tk_status tk_mul_checked(const char *fn, const char *what, int64_t a, int64_t b, int64_t *out);

/* true when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte. */
bool tk_ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes);

/* TK_ERROR_OVERLAP naming both unless the output's bytes and the input's are disjoint (or the
 * input is NULL). With in_place_ok, the output may be exactly the input: the same pointer and
 * span; the caller also compares whatever else in place needs (equal strides). */
tk_status tk_check_overlap(const char *fn, const char *out_name, const void *out, size_t out_bytes,
                           const char *in_name, const void *in, size_t in_bytes, bool in_place_ok);

/* Whether p is 16-byte aligned (NULL is), and whether a stride of `stride` elements of `elem`
 * bytes keeps a 16-byte aligned row start aligned. The vectorised variants' conditions. */
bool tk_aligned16(const void *p);
bool tk_stride_keeps_alignment(int64_t stride, size_t elem);

/* TK_ERROR_MISALIGNED naming `name` unless p (NULL passes) is a multiple of `alignment` bytes. */
tk_status tk_check_aligned(const char *fn, const char *name, const void *p, size_t alignment);

/* A strided tensor as the checks see it: up to 3 strided dimensions over a contiguous run of
 * `inner` elements at each index (a row, a head vector). Strides in elements, >= 0. */
typedef struct tk_layout {
    int rank;
    int64_t dims[3];
    int64_t strides[3];
    int64_t inner;
} tk_layout;

/* Rows of `width` elements, `stride` apart: the layout of every 2-D tensor of the library. */
tk_layout tk_rows_layout(int64_t rows, int64_t width, int64_t stride);

/* *bytes = the bytes from the first element to one past the last (0 for an empty tensor);
 * TK_ERROR_INVALID_VALUE naming `name` when that overflows int64. */
tk_status tk_layout_bytes(const char *fn, const char *name, const tk_layout *l, size_t elem,
                          size_t *bytes);

/* TK_ERROR_INVALID_VALUE naming `strides_name` when two elements of the tensor `name` share
 * memory (a stride smaller than the extent it steps over). Every output is checked with it, so
 * that no element is written twice. Call after tk_layout_bytes (which bounds the extents). */
tk_status tk_check_disjoint(const char *fn, const char *name, const char *strides_name,
                            const tk_layout *l);

/* ---- params structs ---- */

/* The size of each params struct in libtkern 0.1, its first released layout: the smallest
 * `size` accepted. Fields appended later make sizeof larger; these numbers never change. */
#define TK_DEVICE_INFO_SIZE_0_1 32
#define TK_GLU_PARAMS_SIZE_0_1 64
#define TK_NORM_PARAMS_SIZE_0_1 64
#define TK_SOFTMAX_PARAMS_SIZE_0_1 80
#define TK_ROPE_PARAMS_SIZE_0_1 184
#define TK_ATTENTION_PARAMS_SIZE_0_1 280
#define TK_ATTENTION_BWD_PARAMS_SIZE_0_1 448
#define TK_GEMM_PARAMS_SIZE_0_1 136

/* Reads a caller's params struct (whose first member is `size_t size`) by the one rule for all
 * of them: `given` non-NULL (TK_ERROR_NULL_POINTER naming `arg`); size_0_1 <= size (an older
 * caller leaves the fields appended since unset: they read as zero); bytes past this library's
 * sizeof all zero (a newer caller may only leave unknown fields at their defaults); then
 * min(size, sizeof) bytes copied into the zeroed *local, which the caller uses from then on.
 * TK_ERROR_INVALID_VALUE naming `arg->size` otherwise. */
tk_status tk_read_params(const char *fn, const char *arg, const void *given, const char *type,
                         const char *init, size_t size_0_1, void *local, size_t local_size);
#define TK_READ_PARAMS(fn, arg, given, local, type, INIT, size_0_1)                            \
    tk_read_params(fn, arg, given, #type, #INIT, size_0_1, local, sizeof(type))

/* ---- devices ---- */

/* The calling thread's current device, described once per device (thread-safe) and cached for
 * the life of the process. TK_ERROR_NO_DEVICE without a usable driver / device,
 * TK_ERROR_ARCH_NOT_SUPPORTED for a device this build has no code for. */
tk_status tk_current_device(const char *fn, const tk_device **dev);

/* ---- variants ---- */

/* Compute capabilities (100 * major + 10 * minor) at which the variants' instructions appear:
 * sm_80 mma.sync / ldmatrix / cp.async, the oldest libtkern runs on; sm_90 clusters, TMA, wgmma. */
#define TK_CC_AMPERE 800
#define TK_CC_HOPPER 900

/* A call's arguments, as the family packed them for its launchers (cuda/<family>.h). */
typedef const void *tk_call_args;

typedef struct tk_variant {
    const char *name;
    int min_cc;             /* lowest compute capability the code needs, e.g. TK_CC_AMPERE */
    bool arch_specific;     /* needs an sm_XYa build for exactly this device (wgmma, setmaxnreg) */
    /* Whether this variant can run the call on this device (shape, alignment, shared memory,
     * SM count); NULL = any call. Calls carry no device facts: they come from dev. */
    bool (*supports)(tk_call_args call, const tk_device *dev);
    cudaError_t (*launch)(tk_call_args call, const tk_device *dev, cudaStream_t stream);
    /* For the automatic choice only: whether this variant is the best for a call it supports,
     * ahead of the rows after it; NULL = every such call. Lets a variant that wins on some calls
     * sit above a general one without taking the rest; forcing never asks it. */
    bool (*prefers)(tk_call_args call, const tk_device *dev);
} tk_variant;

/* One operation's variants, best first (a row with `prefers`: best on the calls it prefers).
 * Forward and backward are separate ops ("norm" and
 * "norm_bwd"), each listing only the variants that serve its direction; when both directions run
 * the same variants, the two ops share one table and are still forced separately. Each variant
 * has one row: its name is unique in the table. */
typedef struct tk_op {
    const char *name;       /* as used by tk_experimental_force_variant, e.g. "activation" */
    const tk_variant *variants;
    int count;
} tk_op;

/* The number of variants of a table, for tk_op's count. */
#define TK_VARIANT_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

/* The first variant of `op` that the device, the compiled architectures and the call allow and
 * that prefers the call, or the variant forced for this op (TK_ERROR_NOT_SUPPORTED if it cannot
 * run the call). */
tk_status tk_select_variant(const char *fn, const tk_op *op, const tk_device *dev,
                            tk_call_args call, const tk_variant **chosen);

/* Same as tk_select_variant without recording an error: NULL when nothing fits. For queries. */
const tk_variant *tk_find_variant(const tk_op *op, const tk_device *dev, tk_call_args call);

/* Whether this binary holds code for `v` that runs on `dev` (from the build's ARCHS). */
bool tk_variant_compiled_for(const tk_variant *v, const tk_device *dev);

/* After a launch: records the variant as the thread's last one on success, converts a CUDA
 * error otherwise. */
tk_status tk_launched(const char *fn, const tk_variant *v, cudaError_t launch_error);

/* Every op that tk_experimental_force_variant knows, defined in src/ops.c. */
extern const tk_op *const tk_all_ops[];
extern const int tk_all_ops_count;

#endif
