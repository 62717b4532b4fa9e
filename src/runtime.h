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

/* ---- devices ---- */

/* The calling thread's current device, described once per device (thread-safe) and cached for
 * the life of the process. TK_ERROR_NO_DEVICE without a usable driver / device,
 * TK_ERROR_ARCH_NOT_SUPPORTED for a device this build has no code for. */
tk_status tk_current_device(const char *fn, const tk_device **dev);

/* ---- variants ---- */

/* A call's arguments, as the family packed them for its launchers (cuda/<family>.h). */
typedef const void *tk_call_args;

typedef struct tk_variant {
    const char *name;
    int min_cc;             /* lowest compute capability the code needs, e.g. 800 */
    bool arch_specific;     /* needs an sm_XYa build for exactly this device (wgmma, setmaxnreg) */
    /* Whether this variant can run the call (shape, alignment); NULL = any call. */
    bool (*supports)(tk_call_args call);
    cudaError_t (*launch)(tk_call_args call, const tk_device *dev, cudaStream_t stream);
} tk_variant;

/* One operation's variants, best first. */
typedef struct tk_op {
    const char *name;       /* as used by tk_experimental_force_variant, e.g. "activation" */
    const tk_variant *variants;
    int count;
} tk_op;

/* The first variant of `op` that the device, the compiled architectures and the call allow, or
 * the variant forced for this op (TK_ERROR_NOT_SUPPORTED if it cannot run the call). */
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
