/*
 * Runtime shared by every op family; see runtime.h for the contract.
 *
 * State: one thread-local error message, one thread-local "last variant" name, thread-local
 * forced variants, and a per-device cache filled once under a mutex. Nothing else is global.
 */
#include "runtime.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TK_COMPILED_ARCHS
#error "TK_COMPILED_ARCHS must list the build's GPU targets (the Makefile passes ARCHS)"
#endif

/* ------------------------------------------------------------------ version and status ---- */

TK_API int tk_version(void) { return TK_VERSION_NUMBER; }

TK_API const char *tk_status_string(tk_status status) {
    switch (status) {
    case TK_SUCCESS: return "TK_SUCCESS";
    case TK_ERROR_NULL_POINTER: return "TK_ERROR_NULL_POINTER";
    case TK_ERROR_INVALID_VALUE: return "TK_ERROR_INVALID_VALUE";
    case TK_ERROR_OVERLAP: return "TK_ERROR_OVERLAP";
    case TK_ERROR_MISALIGNED: return "TK_ERROR_MISALIGNED";
    case TK_ERROR_NOT_SUPPORTED: return "TK_ERROR_NOT_SUPPORTED";
    case TK_ERROR_ARCH_NOT_SUPPORTED: return "TK_ERROR_ARCH_NOT_SUPPORTED";
    case TK_ERROR_NO_DEVICE: return "TK_ERROR_NO_DEVICE";
    case TK_ERROR_CUDA: return "TK_ERROR_CUDA";
    case TK_ERROR_INTERNAL: return "TK_ERROR_INTERNAL";
    }
    return "TK_UNKNOWN_STATUS";
}

/* ---------------------------------------------------------------------------- errors ---- */

static _Thread_local char last_error[512];
static _Thread_local const char *last_variant = "";

TK_API const char *tk_last_error(void) { return last_error; }
TK_API const char *tk_last_variant(void) { return last_variant; }

void tk_begin_call(void) { last_error[0] = '\0'; }

tk_status tk_fail(tk_status status, const char *fn, const char *fmt, ...) {
    int used = snprintf(last_error, sizeof last_error, "%s: ", fn);
    if (used < 0 || (size_t)used >= sizeof last_error)
        return status;
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error + used, sizeof last_error - (size_t)used, fmt, args);
    va_end(args);
    return status;
}

tk_status tk_cuda_check(const char *fn, const char *what, cudaError_t err) {
    if (err == cudaSuccess)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_CUDA, fn, "%s failed: %s: %s", what, cudaGetErrorName(err),
                   cudaGetErrorString(err));
}

/* ---------------------------------------------------------------------- arg checks ---- */

bool tk_dtype_valid(tk_dtype dtype) {
    return dtype == TK_F32 || dtype == TK_F16 || dtype == TK_BF16;
}

size_t tk_dtype_size(tk_dtype dtype) { return dtype == TK_F32 ? 4 : 2; }

const char *tk_dtype_name(tk_dtype dtype) {
    switch (dtype) {
    case TK_F32: return "TK_F32";
    case TK_F16: return "TK_F16";
    case TK_BF16: return "TK_BF16";
    }
    return "unknown";
}

tk_status tk_check_not_null(const char *fn, const char *name, const void *p) {
    if (p != NULL)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_NULL_POINTER, fn, "argument '%s' is NULL; a device pointer is required",
                   name);
}

tk_status tk_check_dtype(const char *fn, const char *name, tk_dtype dtype) {
    if (tk_dtype_valid(dtype))
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                   "argument '%s' = %d is not a dtype; accepted: TK_F32, TK_F16, TK_BF16", name,
                   (int)dtype);
}

tk_status tk_mul_checked(const char *fn, const char *what, int64_t a, int64_t b, int64_t *out) {
    if (a != 0 && b > INT64_MAX / a)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "%s = %lld * %lld overflows int64", what,
                       (long long)a, (long long)b);
    *out = a * b;
    return TK_SUCCESS;
}

bool tk_ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    if (a_bytes == 0 || b_bytes == 0)
        return false;
    return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

tk_status tk_check_overlap(const char *fn, const char *out_name, const void *out, size_t out_bytes,
                           const char *in_name, const void *in, size_t in_bytes, bool in_place_ok) {
    if (in == NULL || !tk_ranges_overlap(out, out_bytes, in, in_bytes))
        return TK_SUCCESS;
    if (in_place_ok && out == in && out_bytes == in_bytes)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_OVERLAP, fn, "argument '%s' overlaps '%s'%s", out_name, in_name,
                   in_place_ok ? "; only in place is allowed (the same pointer and strides)"
                               : "; they must not overlap");
}

bool tk_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

bool tk_stride_keeps_alignment(int64_t stride, size_t elem) {
    return stride % (int64_t)(16 / elem) == 0; /* elem divides 16; no product to overflow */
}

tk_status tk_check_aligned(const char *fn, const char *name, const void *p, size_t alignment) {
    if ((uintptr_t)p % alignment == 0)
        return TK_SUCCESS;
    return tk_fail(TK_ERROR_MISALIGNED, fn, "argument '%s' = %p is not aligned to %zu bytes", name,
                   p, alignment);
}

tk_layout tk_rows_layout(int64_t rows, int64_t width, int64_t stride) {
    return (tk_layout){1, {rows, 0, 0}, {stride, 0, 0}, width};
}

static bool layout_empty(const tk_layout *l) {
    if (l->inner == 0)
        return true;
    for (int d = 0; d < l->rank; d++)
        if (l->dims[d] == 0)
            return true;
    return false;
}

tk_status tk_layout_bytes(const char *fn, const char *name, const tk_layout *l, size_t elem,
                          size_t *bytes) {
    *bytes = 0;
    if (layout_empty(l))
        return TK_SUCCESS;
    int64_t last = l->inner - 1; /* offset of the last element */
    for (int d = 0; d < l->rank; d++) {
        if (l->dims[d] == 1)
            continue;
        if (l->strides[d] > (INT64_MAX - last) / (l->dims[d] - 1))
            return tk_fail(TK_ERROR_INVALID_VALUE, fn, "the extent of '%s' overflows int64", name);
        last += (l->dims[d] - 1) * l->strides[d];
    }
    if (last >= INT64_MAX / (int64_t)elem)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "the byte size of '%s' overflows int64", name);
    *bytes = (size_t)(last + 1) * elem;
    return TK_SUCCESS;
}

tk_status tk_check_disjoint(const char *fn, const char *name, const char *strides_name,
                            const tk_layout *l) {
    if (layout_empty(l))
        return TK_SUCCESS;
    /* The dimensions of more than one index, by increasing stride: each stride must step over
     * everything the smaller ones span. */
    int order[3], n = 0;
    for (int d = 0; d < l->rank; d++) {
        if (l->dims[d] < 2)
            continue;
        int at = n++;
        while (at > 0 && l->strides[order[at - 1]] > l->strides[d]) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = d;
    }
    int64_t extent = l->inner;
    for (int i = 0; i < n; i++) {
        const int d = order[i];
        if (l->strides[d] < extent)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "%s: stride %lld is smaller than the %lld elements it must step over, "
                           "so elements of '%s' overlap",
                           strides_name, (long long)l->strides[d], (long long)extent, name);
        extent += (l->dims[d] - 1) * l->strides[d];
    }
    return TK_SUCCESS;
}

/* Appending a field makes sizeof larger; removing or shrinking one would break 0.1 callers. */
_Static_assert(sizeof(tk_device_info) >= TK_DEVICE_INFO_SIZE_0_1, "tk_device_info shrank");
_Static_assert(sizeof(tk_glu_params) >= TK_GLU_PARAMS_SIZE_0_1, "tk_glu_params shrank");
_Static_assert(sizeof(tk_norm_params) >= TK_NORM_PARAMS_SIZE_0_1, "tk_norm_params shrank");
_Static_assert(sizeof(tk_softmax_params) >= TK_SOFTMAX_PARAMS_SIZE_0_1, "tk_softmax_params shrank");
_Static_assert(sizeof(tk_rope_params) >= TK_ROPE_PARAMS_SIZE_0_1, "tk_rope_params shrank");
_Static_assert(sizeof(tk_attention_params) >= TK_ATTENTION_PARAMS_SIZE_0_1,
               "tk_attention_params shrank");
_Static_assert(sizeof(tk_gemm_params) >= TK_GEMM_PARAMS_SIZE_0_1, "tk_gemm_params shrank");

/* No params struct comes near this; a larger `size` is a wrong value, not a newer struct, and
 * its tail is not read. */
#define MAX_PARAMS_SIZE 4096

tk_status tk_read_params(const char *fn, const char *arg, const void *given, const char *type,
                         const char *init, size_t size_0_1, void *local, size_t local_size) {
    TK_TRY(tk_check_not_null(fn, arg, given));
    size_t size;
    memcpy(&size, given, sizeof size);
    if (size < size_0_1 || size > MAX_PARAMS_SIZE)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                       "argument '%s->size' = %zu is not the size of a %s (at least %zu bytes); "
                       "initialise the struct with %s",
                       arg, size, type, size_0_1, init);
    const unsigned char *bytes = given;
    for (size_t i = local_size; i < size; i++)
        if (bytes[i] != 0)
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "argument '%s->size' = %zu, and byte %zu, past the %zu bytes of this library's "
                           "%s, is not zero: a field this libtkern does not know is set (the "
                           "caller was built against a newer tkern.h)",
                           arg, size, i, local_size, type);
    memset(local, 0, local_size);
    memcpy(local, given, size < local_size ? size : local_size);
    return TK_SUCCESS;
}

/* -------------------------------------------------------------- compiled architectures ---- */

/* One GPU target of this build, from the Makefile's ARCHS ("80 86 89 90a compute_90"). */
typedef struct compiled_arch {
    int cc;
    bool arch_specific; /* sm_XYa */
    bool ptx;           /* compute_XY: PTX that the driver compiles for any newer device */
} compiled_arch;

static compiled_arch compiled_archs[16];
static int compiled_arch_count;

static void parse_compiled_archs(void) {
    const char *s = TK_COMPILED_ARCHS;
    while (*s && compiled_arch_count < (int)(sizeof compiled_archs / sizeof compiled_archs[0])) {
        while (*s == ' ')
            s++;
        if (!*s)
            break;
        compiled_arch a = {0, false, false};
        if (strncmp(s, "compute_", 8) == 0) {
            a.ptx = true;
            s += 8;
        }
        a.cc = (int)strtol(s, (char **)&s, 10) * 10;
        if (*s == 'a') {
            a.arch_specific = true;
            s++;
        }
        compiled_archs[compiled_arch_count++] = a;
        while (*s && *s != ' ')
            s++;
    }
}

/* Whether code compiled for `a` with features of at least min_cc runs on a device of cc. */
static bool arch_runs(const compiled_arch *a, int cc, int min_cc, bool arch_specific) {
    if (a->cc < min_cc)
        return false;
    if (arch_specific)
        return a->arch_specific && !a->ptx && a->cc == cc;
    if (a->ptx)
        return a->cc <= cc;
    if (a->arch_specific)
        return a->cc == cc;
    return a->cc / 100 == cc / 100 && a->cc <= cc; /* SASS runs within its major version */
}

bool tk_variant_compiled_for(const tk_variant *v, const tk_device *dev) {
    for (int i = 0; i < compiled_arch_count; i++)
        if (arch_runs(&compiled_archs[i], dev->cc, v->min_cc, v->arch_specific))
            return true;
    return false;
}

static bool build_runs_on(int cc) {
    for (int i = 0; i < compiled_arch_count; i++)
        if (arch_runs(&compiled_archs[i], cc, TK_CC_AMPERE, false))
            return true;
    return false;
}

/* ------------------------------------------------------------------ forced variants ---- */

#define MAX_FORCED 16

typedef struct forced_variant {
    const tk_op *op;
    int index;
} forced_variant;

/* From TKERN_FORCE_VARIANT, parsed once; then per-thread choices from the API, which take
 * precedence: index -1 there means automatic selection, which undoes the variable's forcing. */
static forced_variant env_forced[MAX_FORCED];
static int env_forced_count;
/* Why TKERN_FORCE_VARIANT was rejected ("" when it was not): every call that reaches the device
 * fails with it, so that a misspelt name cannot silently run the automatic choice. */
static char env_forced_error[448];
static _Thread_local forced_variant thread_forced[MAX_FORCED];
static _Thread_local int thread_forced_count;

static const tk_op *find_op(const char *name, size_t len) {
    for (int i = 0; i < tk_all_ops_count; i++)
        if (strlen(tk_all_ops[i]->name) == len && strncmp(tk_all_ops[i]->name, name, len) == 0)
            return tk_all_ops[i];
    return NULL;
}

/* The first row of op's variant `name` (len bytes), or -1; the index that forcing records. */
static int find_variant(const tk_op *op, const char *name, size_t len) {
    for (int i = 0; i < op->count; i++)
        if (strlen(op->variants[i].name) == len && strncmp(op->variants[i].name, name, len) == 0)
            return i;
    return -1;
}

/* "\"a\", \"b\"": the names of op's variants, for messages. */
static void variant_names(const tk_op *op, char *names, size_t size) {
    names[0] = '\0';
    for (int i = 0; i < op->count; i++) {
        size_t used = strlen(names);
        snprintf(names + used, size - used, "%s\"%s\"", used ? ", " : "", op->variants[i].name);
    }
}

/* "activation", "glu", ...: the names of the ops, for messages. */
static void op_names(char *names, size_t size) {
    names[0] = '\0';
    for (int i = 0; i < tk_all_ops_count; i++) {
        size_t used = strlen(names);
        snprintf(names + used, size - used, "%s\"%s\"", i ? ", " : "", tk_all_ops[i]->name);
    }
}

/* Parses one "op=variant" item of TKERN_FORCE_VARIANT; false (and env_forced_error) if bad. */
static bool parse_env_item(const char *item, size_t len) {
    char names[256]; /* every op's name, or one op's variants */
    const char *eq = memchr(item, '=', len);
    if (!eq) {
        snprintf(env_forced_error, sizeof env_forced_error,
                 "TKERN_FORCE_VARIANT item \"%.*s\" is not op=variant", (int)len, item);
        return false;
    }
    const size_t op_len = (size_t)(eq - item), name_len = len - op_len - 1;
    const tk_op *op = find_op(item, op_len);
    if (!op) {
        op_names(names, sizeof names);
        snprintf(env_forced_error, sizeof env_forced_error,
                 "TKERN_FORCE_VARIANT names op \"%.*s\", which does not exist; accepted: %s",
                 (int)op_len, item, names);
        return false;
    }
    const int index = find_variant(op, eq + 1, name_len);
    if (index < 0) {
        variant_names(op, names, sizeof names);
        snprintf(env_forced_error, sizeof env_forced_error,
                 "TKERN_FORCE_VARIANT names variant \"%.*s\" of \"%s\", which does not exist; "
                 "accepted: %s",
                 (int)name_len, eq + 1, op->name, names);
        return false;
    }
    if (env_forced_count == MAX_FORCED) {
        snprintf(env_forced_error, sizeof env_forced_error,
                 "TKERN_FORCE_VARIANT has more than %d items", MAX_FORCED);
        return false;
    }
    env_forced[env_forced_count++] = (forced_variant){op, index};
    return true;
}

static void parse_env_forced(void) {
    const char *s = getenv("TKERN_FORCE_VARIANT");
    while (s && *s) {
        const char *end = strchr(s, ',');
        const size_t item_len = end ? (size_t)(end - s) : strlen(s);
        if (item_len > 0 && !parse_env_item(s, item_len)) {
            env_forced_count = 0; /* a rejected variable forces nothing */
            return;
        }
        s = end ? end + 1 : NULL;
    }
}

static pthread_once_t process_once = PTHREAD_ONCE_INIT;

static void process_init(void) {
    parse_compiled_archs();
    parse_env_forced();
}

/* The forced variant index of op for this thread, or -1. */
static int forced_index(const tk_op *op) {
    for (int i = 0; i < thread_forced_count; i++)
        if (thread_forced[i].op == op)
            return thread_forced[i].index;
    for (int i = 0; i < env_forced_count; i++)
        if (env_forced[i].op == op)
            return env_forced[i].index;
    return -1;
}

TK_API tk_status tk_experimental_force_variant(const char *op_name, const char *variant) {
    static const char fn[] = "tk_experimental_force_variant";
    tk_begin_call();
    pthread_once(&process_once, process_init);
    TK_TRY(tk_check_not_null(fn, "op", op_name));
    const tk_op *op = find_op(op_name, strlen(op_name));
    if (!op)
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "argument 'op' = \"%s\" names no operation",
                       op_name);
    int index = -1; /* NULL: automatic selection, whatever TKERN_FORCE_VARIANT says */
    if (variant != NULL) {
        index = find_variant(op, variant, strlen(variant));
        if (index < 0) {
            char names[256];
            variant_names(op, names, sizeof names);
            return tk_fail(TK_ERROR_INVALID_VALUE, fn,
                           "argument 'variant' = \"%s\" is not a variant of \"%s\"; accepted: %s",
                           variant, op_name, names);
        }
    }
    int slot = 0;
    while (slot < thread_forced_count && thread_forced[slot].op != op)
        slot++;
    if (slot == thread_forced_count) {
        if (thread_forced_count == MAX_FORCED)
            return tk_fail(TK_ERROR_INTERNAL, fn, "more than %d forced variants", MAX_FORCED);
        thread_forced_count++;
    }
    thread_forced[slot] = (forced_variant){op, index};
    return TK_SUCCESS;
}

/* ---------------------------------------------------------------------- device cache ---- */

typedef struct device_slot {
    atomic_int filled; /* 0 empty, 1 filled; written once under cache_mutex */
    tk_device dev;
} device_slot;

static device_slot device_cache[TK_MAX_DEVICES];
static pthread_mutex_t cache_mutex = PTHREAD_MUTEX_INITIALIZER;

static tk_status describe_device(const char *fn, int ordinal, tk_device *d) {
    int major = 0, minor = 0;
    struct {
        enum cudaDeviceAttr attr;
        int *out;
    } reads[] = {
        {cudaDevAttrComputeCapabilityMajor, &major},
        {cudaDevAttrComputeCapabilityMinor, &minor},
        {cudaDevAttrMultiProcessorCount, &d->sm_count},
        {cudaDevAttrMaxSharedMemoryPerBlockOptin, &d->max_smem_optin},
        {cudaDevAttrMaxSharedMemoryPerMultiprocessor, &d->smem_per_sm},
        {cudaDevAttrL2CacheSize, &d->l2_bytes},
        {cudaDevAttrMaxThreadsPerMultiProcessor, &d->max_threads_per_sm},
    };
    for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++)
        TK_TRY(tk_cuda_check(fn, "cudaDeviceGetAttribute",
                             cudaDeviceGetAttribute(reads[i].out, reads[i].attr, ordinal)));
    d->ordinal = ordinal;
    d->cc = 100 * major + 10 * minor;
    d->supported = d->cc >= TK_CC_AMPERE && build_runs_on(d->cc);
    return TK_SUCCESS;
}

/* The current device's cache entry, filled on first use. Does not judge support. */
static tk_status lookup_device(const char *fn, const tk_device **out) {
    pthread_once(&process_once, process_init);
    if (env_forced_error[0])
        return tk_fail(TK_ERROR_INVALID_VALUE, fn, "%s", env_forced_error);
    int ordinal = -1;
    cudaError_t err = cudaGetDevice(&ordinal);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* do not leave the sticky-free error for the caller's next call */
        return tk_fail(TK_ERROR_NO_DEVICE, fn, "no usable CUDA device: %s: %s",
                       cudaGetErrorName(err), cudaGetErrorString(err));
    }
    if (ordinal < 0 || ordinal >= TK_MAX_DEVICES)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn, "device ordinal %d is beyond the %d supported",
                       ordinal, TK_MAX_DEVICES);
    device_slot *slot = &device_cache[ordinal];
    if (!atomic_load_explicit(&slot->filled, memory_order_acquire)) {
        pthread_mutex_lock(&cache_mutex);
        tk_status status = TK_SUCCESS;
        if (!atomic_load_explicit(&slot->filled, memory_order_relaxed)) {
            status = describe_device(fn, ordinal, &slot->dev);
            if (status == TK_SUCCESS)
                atomic_store_explicit(&slot->filled, 1, memory_order_release);
        }
        pthread_mutex_unlock(&cache_mutex);
        TK_TRY(status);
    }
    *out = &slot->dev;
    return TK_SUCCESS;
}

tk_status tk_current_device(const char *fn, const tk_device **dev) {
    TK_TRY(lookup_device(fn, dev));
    if (!(*dev)->supported)
        return tk_fail(TK_ERROR_ARCH_NOT_SUPPORTED, fn,
                       "device %d has compute capability %d.%d; libtkern needs 8.0 or newer and "
                       "this build has code for: %s",
                       (*dev)->ordinal, (*dev)->cc / 100, (*dev)->cc / 10 % 10, TK_COMPILED_ARCHS);
    return TK_SUCCESS;
}

TK_API tk_status tk_device_query(tk_device_info *info) {
    static const char fn[] = "tk_device_query";
    tk_begin_call();
    tk_device_info local;
    TK_TRY(TK_READ_PARAMS(fn, "info", info, &local, tk_device_info, TK_DEVICE_INFO_INIT,
                          TK_DEVICE_INFO_SIZE_0_1));
    const tk_device *d;
    TK_TRY(lookup_device(fn, &d));
    local.device = d->ordinal;
    local.compute_capability = d->cc;
    local.sm_count = d->sm_count;
    local.max_smem_per_block = d->max_smem_optin;
    local.l2_bytes = d->l2_bytes;
    local.supported = d->supported;
    memcpy(info, &local, local.size < sizeof local ? local.size : sizeof local);
    return TK_SUCCESS;
}

/* -------------------------------------------------------------------- variant choice ---- */

static bool variant_fits(const tk_variant *v, const tk_device *dev, tk_call_args call) {
    return tk_variant_compiled_for(v, dev) && (v->supports == NULL || v->supports(call, dev));
}

const tk_variant *tk_find_variant(const tk_op *op, const tk_device *dev, tk_call_args call) {
    int forced = forced_index(op);
    if (forced >= 0)
        return variant_fits(&op->variants[forced], dev, call) ? &op->variants[forced] : NULL;
    for (int i = 0; i < op->count; i++) {
        const tk_variant *v = &op->variants[i];
        if ((v->prefers == NULL || v->prefers(call, dev)) && variant_fits(v, dev, call)) /* the cheap test first */
            return v;
    }
    return NULL;
}

tk_status tk_select_variant(const char *fn, const tk_op *op, const tk_device *dev,
                            tk_call_args call, const tk_variant **chosen) {
    *chosen = tk_find_variant(op, dev, call);
    if (*chosen)
        return TK_SUCCESS;
    int forced = forced_index(op);
    if (forced >= 0)
        return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                       "the forced variant \"%s\" of \"%s\" cannot run this call on compute "
                       "capability %d (its shape or alignment, or the build's ARCHS \"%s\")",
                       op->variants[forced].name, op->name, dev->cc, TK_COMPILED_ARCHS);
    return tk_fail(TK_ERROR_NOT_SUPPORTED, fn,
                   "no variant of \"%s\" can run this call on compute capability %d with this "
                   "build's ARCHS \"%s\"",
                   op->name, dev->cc, TK_COMPILED_ARCHS);
}

tk_status tk_launched(const char *fn, const tk_variant *v, cudaError_t launch_error) {
    if (launch_error != cudaSuccess) {
        /* Launch-configuration errors are not sticky; clear them so the caller's next CUDA call
         * does not see ours. */
        cudaGetLastError();
        return tk_fail(TK_ERROR_CUDA, fn, "launching variant \"%s\" failed: %s: %s", v->name,
                       cudaGetErrorName(launch_error), cudaGetErrorString(launch_error));
    }
    last_variant = v->name;
    return TK_SUCCESS;
}
