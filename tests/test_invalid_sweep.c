/* Bad input at random, on the host (runs everywhere): per family, hundreds of valid calls of
 * random shape with one argument broken (NULL pointers, negative, zero and overflowing sizes,
 * unknown enums, short strides, misaligned or overlapping pointers, a wrong params size), each
 * asserting that the call fails before it reaches the device, that its message names the
 * argument, and that no buffer was written. Host buffers stand in for device memory: the
 * library validates every argument before its first CUDA call. A failure prints the family, the
 * seed and the case; each case draws from its own generator, seeded with seed + case.
 *
 * Also the params `size` rule, for every params struct: the 0.1 size and a larger size with a
 * zero tail are accepted, a non-zero unknown tail and a smaller size are rejected. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "support/tk_test.h"

#define CASES 300
#define SEED 20240611u

/* Inputs live in in_buf, outputs in out_buf, at the offsets each family chooses; a params struct
 * is copied into params_buf, which leaves room for a tail past its size. */
#define SLOT (64 * 1024)
static unsigned char in_buf[4 * SLOT] __attribute__((aligned(16)));
static unsigned char out_buf[2 * SLOT] __attribute__((aligned(16)));
static unsigned char params_buf[8192] __attribute__((aligned(16)));

static void reset_buffers(void) {
    tk_fill_sentinel(in_buf, sizeof in_buf);
    tk_fill_sentinel(out_buf, sizeof out_buf);
}

/* A uniform integer in [lo, hi]. */
static int64_t pick(tk_rng *rng, int64_t lo, int64_t hi) {
    const double span = (double)hi - (double)lo; /* in double: hi - lo may not fit int64 */
    const double u = tk_rng_uniform(rng, 0.0, span + 1.0);
    return u >= span ? hi : lo + (int64_t)u;
}

static tk_dtype pick_dtype(tk_rng *rng) { return (tk_dtype)pick(rng, TK_F32, TK_BF16); }

/* A value no enum of the library accepts. */
static int bad_enum(tk_rng *rng) { return pick(rng, 0, 1) ? (int)pick(rng, 7, 1000) : (int)pick(rng, -1000, -1); }

/* ------------------------------------------------------------------- the params size ---- */

/* The first corruptions of every params family break its size field. */
enum { SIZE_SMALL, SIZE_TAIL, SIZE_HUGE, SIZE_CORRUPTIONS };

/* The smallest size field the library takes for a struct that has grown since libtkern 0.1
 * (src/runtime.h: older callers' layouts); the others have their sizeof. */
#define ATTENTION_PARAMS_SIZE_0_1 280
#define ATTENTION_BWD_PARAMS_SIZE_0_1 448

/* Copies the params struct `p` of `size` bytes into params_buf and, for the size corruptions,
 * breaks it: a size below the smallest accepted (size_0_1), a larger size whose tail holds a
 * non-zero byte, or a size no struct has. Returns params_buf. */
static void *place_grown_params(tk_rng *rng, const void *p, size_t size, size_t size_0_1, int which,
                                const char **needle) {
    memset(params_buf, 0, sizeof params_buf);
    memcpy(params_buf, p, size);
    size_t s = size;
    if (which == SIZE_SMALL) {
        s = (size_t)pick(rng, 0, (int64_t)size_0_1 - 1);
    } else if (which == SIZE_TAIL) {
        s = size + (size_t)pick(rng, 1, 256);
        params_buf[size + (size_t)pick(rng, 0, (int64_t)(s - size) - 1)] = (unsigned char)pick(rng, 1, 255);
    } else if (which == SIZE_HUGE) {
        s = (size_t)1 << pick(rng, 20, 62);
    }
    if (which < SIZE_CORRUPTIONS)
        *needle = "p->size";
    memcpy(params_buf, &s, sizeof s);
    return params_buf;
}

static void *place_params(tk_rng *rng, const void *p, size_t size, int which, const char **needle) {
    return place_grown_params(rng, p, size, size, which, needle);
}

/* ------------------------------------------------------------------------ the sweep ---- */

/* Runs case `which` of a family with generator `rng`: a valid call with one argument broken.
 * Sets *needle to what the message must name and `what` to a description of the case. */
typedef tk_status (*sweep_case)(tk_rng *rng, int which, const char **needle, char *what, size_t what_size);

static void sweep(const char *family, int corruptions, sweep_case run) {
    for (int i = 0; i < CASES; i++) {
        tk_rng rng = tk_rng_seeded(SEED + (uint64_t)i);
        const int which = i % corruptions;
        const char *needle = "";
        char what[256] = "";
        reset_buffers();
        const tk_status s = run(&rng, which, &needle, what, sizeof what);
        cr_assert(s != TK_SUCCESS && TK_STATUS_GROUP(s) <= 2,
                  "%s seed %u case %d (corruption %d: %s): returned %s, expected an argument error "
                  "(last error \"%s\")",
                  family, SEED, i, which, what, tk_status_string(s), tk_last_error());
        cr_assert(strstr(tk_last_error(), needle) != NULL,
                  "%s seed %u case %d (corruption %d: %s): message \"%s\" does not name \"%s\"", family, SEED,
                  i, which, what, tk_last_error(), needle);
        cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s seed %u case %d (%s): an output was written",
                  family, SEED, i, what);
        cr_assert(tk_is_sentinel(in_buf, sizeof in_buf), "%s seed %u case %d (%s): an input was written",
                  family, SEED, i, what);
    }
}

/* ---- activations: tk_activation_fwd / _bwd, tk_gelu_fwd ---- */

static tk_status activation_case(tk_rng *rng, int which, const char **needle, char *what, size_t what_size) {
    tk_activation kind = (tk_activation)pick(rng, TK_ACT_NONE, TK_ACT_RELU_SQUARED);
    tk_dtype dtype = pick_dtype(rng);
    int64_t rows = pick(rng, 1, 8), cols = pick(rng, 2, 256);
    const size_t es = tk_test_dtype_size(dtype);
    const unsigned char *x = in_buf, *dy = in_buf + SLOT, *bias = pick(rng, 0, 1) ? in_buf + 2 * SLOT : NULL;
    unsigned char *out = out_buf;
    bool backward = pick(rng, 0, 1);
    const char *out_name = backward ? "'dx'" : "'y'";
    switch (which) {
    case 0: x = NULL; *needle = "'x'"; break;
    case 1: out = NULL; *needle = out_name; break;
    case 2: backward = true; dy = NULL; *needle = "'dy'"; break;
    case 3: rows = -pick(rng, 1, INT64_MAX); *needle = "'rows'"; break;
    case 4: cols = -pick(rng, 1, INT64_MAX); *needle = "'cols'"; break;
    case 5: rows = INT64_MAX / pick(rng, 2, 1000); cols = pick(rng, 1001, 1 << 20); *needle = "overflows"; break;
    case 6: kind = (tk_activation)bad_enum(rng); *needle = "'kind'"; break;
    case 7: dtype = (tk_dtype)bad_enum(rng); *needle = "'dtype'"; break;
    case 8: out = (unsigned char *)x + es * (size_t)pick(rng, 1, rows * cols - 1); *needle = "overlaps 'x'"; break;
    case 9: x = in_buf + pick(rng, 1, (int64_t)es - 1); *needle = "'x'"; break;
    case 10: bias = out_buf + es * (size_t)pick(rng, 0, rows * cols - 1); *needle = "'bias'"; break;
    case 11: {
        snprintf(what, what_size, "tk_gelu_fwd approximate bad");
        *needle = "'approximate'";
        return tk_gelu_fwd((tk_gelu_approximation)bad_enum(rng), dtype, x, out, rows * cols, NULL);
    }
    case 12: {
        snprintf(what, what_size, "tk_gelu_fwd n < 0");
        *needle = "'n'";
        return tk_gelu_fwd(TK_GELU_TANH, dtype, x, out, -pick(rng, 1, INT64_MAX), NULL);
    }
    }
    snprintf(what, what_size, "%s kind %d dtype %d rows %lld cols %lld bias %d x %p dy %p y %p",
             backward ? "bwd" : "fwd", (int)kind, (int)dtype, (long long)rows, (long long)cols, bias != NULL,
             (const void *)x, (const void *)dy, (void *)out);
    return backward ? tk_activation_bwd(kind, dtype, dy, x, bias, out, rows, cols, NULL)
                    : tk_activation_fwd(kind, dtype, x, bias, out, rows, cols, NULL);
}

Test(invalid_sweep, activation, .timeout = 60) { sweep("activation", 13, activation_case); }

/* ---- GLU: tk_glu_fwd / _bwd ---- */

static tk_status glu_case(tk_rng *rng, int which, const char **needle, char *what, size_t what_size) {
    tk_glu_params p = TK_GLU_PARAMS_INIT;
    p.kind = (tk_glu)pick(rng, TK_GLU_SWIGLU, TK_GLU_SWIGLU_CLAMPED);
    p.dtype = pick_dtype(rng);
    p.layout = (tk_glu_layout)pick(rng, TK_GLU_GATE_FIRST, TK_GLU_INTERLEAVED);
    p.rows = pick(rng, 1, 8);
    p.d = pick(rng, 2, 128);
    const size_t es = tk_test_dtype_size(p.dtype);
    const unsigned char *x = in_buf, *dy = in_buf + SLOT;
    unsigned char *out = out_buf;
    bool backward = pick(rng, 0, 1);
    const char *out_name = backward ? "'dx'" : "'y'";
    const void *params = NULL;
    switch (which) {
    case SIZE_CORRUPTIONS: *needle = "'p'"; break;
    case 4: p.kind = (tk_glu)bad_enum(rng); *needle = "p->kind"; break;
    case 5: p.dtype = (tk_dtype)bad_enum(rng); *needle = "p->dtype"; break;
    case 6: p.layout = (tk_glu_layout)bad_enum(rng); *needle = "p->layout"; break;
    case 7: p.rows = -pick(rng, 1, INT64_MAX); *needle = "p->rows"; break;
    case 8: p.d = -pick(rng, 0, INT64_MAX); *needle = "p->d"; break;
    case 9: p.x_row_stride = pick(rng, 1, 2 * p.d - 1); *needle = "p->x_row_stride"; break;
    case 10: p.y_row_stride = pick(rng, 1, p.d - 1); *needle = "p->y_row_stride"; break;
    case 11: x = NULL; *needle = "'x'"; break;
    case 12: out = NULL; *needle = out_name; break;
    case 13: backward = true; dy = NULL; *needle = "'dy'"; break;
    case 14: x = in_buf + pick(rng, 1, (int64_t)es - 1); *needle = "'x'"; break;
    case 15: backward = false; out = (unsigned char *)x + es * (size_t)pick(rng, 1, 2 * p.d * p.rows - 1); *needle = "overlaps 'x'"; break;
    case 16: /* in place with interleaved rows */
        backward = false; p.layout = TK_GLU_INTERLEAVED; p.y_row_stride = p.x_row_stride = 2 * p.d;
        out = (unsigned char *)x; *needle = "overlaps 'x'"; break;
    case 17: p.kind = TK_GLU_SWIGLU_CLAMPED; p.alpha = NAN; *needle = "p->alpha"; break;
    case 18: p.kind = TK_GLU_SWIGLU_CLAMPED; p.limit = pick(rng, 0, 1) ? NAN : -(float)pick(rng, 0, 100); *needle = "p->limit"; break;
    case 19: p.rows = pick(rng, 20, 1000); p.d = INT64_MAX / pick(rng, 8, 16); *needle = "overflows"; break;
    }
    if (which != SIZE_CORRUPTIONS)
        params = place_params(rng, &p, sizeof p, which, needle);
    snprintf(what, what_size, "%s kind %d dtype %d layout %d rows %lld d %lld strides %lld/%lld x %p y %p",
             backward ? "bwd" : "fwd", (int)p.kind, (int)p.dtype, (int)p.layout, (long long)p.rows, (long long)p.d,
             (long long)p.x_row_stride, (long long)p.y_row_stride, (const void *)x, (void *)out);
    return backward ? tk_glu_bwd(params, dy, x, out, NULL) : tk_glu_fwd(params, x, out, NULL);
}

Test(invalid_sweep, glu, .timeout = 60) { sweep("glu", 20, glu_case); }

/* ---- norms: tk_rmsnorm_fwd, tk_layernorm_fwd ---- */

static tk_status norm_case(tk_rng *rng, int which, const char **needle, char *what, size_t what_size) {
    tk_norm_params p = TK_NORM_PARAMS_INIT;
    p.dtype = pick_dtype(rng);
    p.weight_dtype = pick(rng, 0, 1) ? TK_F32 : p.dtype;
    p.rows = pick(rng, 1, 8);
    p.cols = pick(rng, 2, 512);
    const size_t es = tk_test_dtype_size(p.dtype);
    const unsigned char *x = in_buf, *weight = in_buf + 2 * SLOT, *bias = in_buf + 3 * SLOT;
    unsigned char *residual = pick(rng, 0, 1) ? in_buf + SLOT : NULL, *y = out_buf;
    float *stats = (float *)(out_buf + SLOT);
    const bool layernorm = pick(rng, 0, 1);
    const void *params = NULL;
    switch (which) {
    case SIZE_CORRUPTIONS: *needle = "'p'"; break;
    case 4: p.dtype = (tk_dtype)bad_enum(rng); *needle = "p->dtype"; break;
    case 5: p.weight_dtype = (tk_dtype)bad_enum(rng); *needle = "p->weight_dtype"; break;
    case 6: p.dtype = TK_BF16; p.weight_dtype = TK_F16; *needle = "p->weight_dtype"; break;
    case 7: p.rows = -pick(rng, 1, INT64_MAX); *needle = "p->rows"; break;
    case 8: p.cols = pick(rng, 0, 1) ? -pick(rng, 0, INT64_MAX) : pick(rng, 262145, INT64_MAX); *needle = "p->cols"; break;
    case 9: p.x_row_stride = pick(rng, 1, p.cols - 1); *needle = "p->x_row_stride"; break;
    case 10: p.y_row_stride = pick(rng, 1, p.cols - 1); *needle = "p->y_row_stride"; break;
    case 11: residual = in_buf + SLOT; p.residual_row_stride = pick(rng, 1, p.cols - 1); *needle = "p->residual_row_stride"; break;
    case 12: p.eps = pick(rng, 0, 1) ? -(float)pick(rng, 0, 10) : (pick(rng, 0, 1) ? NAN : INFINITY); *needle = "p->eps"; break;
    case 13: p.gemma = bad_enum(rng); *needle = "p->gemma"; break;
    case 14: x = NULL; *needle = "'x'"; break;
    case 15: y = NULL; *needle = "'y'"; break;
    case 16: x = in_buf + pick(rng, 1, (int64_t)es - 1); *needle = "'x'"; break;
    case 17: y = (unsigned char *)x + es * (size_t)pick(rng, 1, p.cols * p.rows - 1); *needle = "'y' overlaps 'x'"; break;
    case 18: stats = (float *)(y + 4 * (size_t)pick(rng, 0, (p.cols * p.rows * (int64_t)es) / 4 - 1)); *needle = "'rstd'"; break;
    case 19: p.rows = INT64_MAX / pick(rng, 2, 64); p.x_row_stride = 1 << 20; *needle = "overflows"; break;
    }
    if (which != SIZE_CORRUPTIONS)
        params = place_params(rng, &p, sizeof p, which, needle);
    snprintf(what, what_size, "%s dtype %d weight %d rows %lld cols %lld strides %lld/%lld/%lld x %p y %p",
             layernorm ? "layernorm" : "rmsnorm", (int)p.dtype, (int)p.weight_dtype, (long long)p.rows,
             (long long)p.cols, (long long)p.x_row_stride, (long long)p.residual_row_stride,
             (long long)p.y_row_stride, (const void *)x, (void *)y);
    return layernorm ? tk_layernorm_fwd(params, x, residual, weight, bias, y, NULL, stats, NULL)
                     : tk_rmsnorm_fwd(params, x, residual, weight, y, stats, NULL);
}

Test(invalid_sweep, norm, .timeout = 60) { sweep("norm", 20, norm_case); }

/* ---- softmax: tk_softmax_fwd / _bwd ---- */

static tk_status softmax_case(tk_rng *rng, int which, const char **needle, char *what, size_t what_size) {
    tk_softmax_params p = TK_SOFTMAX_PARAMS_INIT;
    p.dtype = pick_dtype(rng);
    p.rows = pick(rng, 1, 8);
    p.cols = pick(rng, 2, 1024);
    p.log = (int)pick(rng, 0, 1);
    const size_t es = tk_test_dtype_size(p.dtype);
    const unsigned char *in = in_buf, *dy = in_buf + SLOT;
    unsigned char *out = out_buf;
    bool backward = pick(rng, 0, 1);
    const char *in_name = backward ? "'y'" : "'x'", *out_name = backward ? "'dx'" : "'y'";
    const void *params = NULL;
    switch (which) {
    case SIZE_CORRUPTIONS: *needle = "'p'"; break;
    case 4: p.dtype = (tk_dtype)bad_enum(rng); *needle = "p->dtype"; break;
    case 5: p.rows = -pick(rng, 1, INT64_MAX); *needle = "p->rows"; break;
    case 6: p.cols = -pick(rng, 0, INT64_MAX); *needle = "p->cols"; break;
    case 7: p.cols = pick(rng, (INT64_C(1) << 30) + 1, INT64_MAX); *needle = "p->cols"; break;
    case 8: p.x_row_stride = pick(rng, 1, p.cols - 1); *needle = "p->x_row_stride"; break;
    case 9: p.y_row_stride = pick(rng, 1, p.cols - 1); *needle = "p->y_row_stride"; break;
    case 10: p.scale = pick(rng, 0, 1) ? NAN : -INFINITY; *needle = "p->scale"; break;
    case 11: p.log = bad_enum(rng); *needle = "p->log"; break;
    case 12: p.causal = bad_enum(rng); *needle = "p->causal"; break;
    case 13: p.causal = 1; p.causal_period = -pick(rng, 1, INT64_MAX); *needle = "p->causal_period"; break;
    case 14: in = NULL; *needle = in_name; break;
    case 15: out = NULL; *needle = out_name; break;
    case 16: in = in_buf + pick(rng, 1, (int64_t)es - 1); *needle = in_name; break;
    case 17: out = (unsigned char *)in + es * (size_t)pick(rng, 1, p.cols * p.rows - 1); *needle = "overlaps"; break;
    case 18: p.rows = INT64_MAX / pick(rng, 2, 64); *needle = "overflows"; break;
    }
    if (which != SIZE_CORRUPTIONS)
        params = place_params(rng, &p, sizeof p, which, needle);
    snprintf(what, what_size, "%s dtype %d rows %lld cols %lld strides %lld/%lld log %d causal %d in %p out %p",
             backward ? "bwd" : "fwd", (int)p.dtype, (long long)p.rows, (long long)p.cols,
             (long long)p.x_row_stride, (long long)p.y_row_stride, p.log, p.causal, (const void *)in, (void *)out);
    return backward ? tk_softmax_bwd(params, in, dy, out, NULL) : tk_softmax_fwd(params, in, out, NULL);
}

Test(invalid_sweep, softmax, .timeout = 60) { sweep("softmax", 19, softmax_case); }

/* ---- rope: tk_rope_fwd / _bwd ---- */

static tk_status rope_case(tk_rng *rng, int which, const char **needle, char *what, size_t what_size) {
    tk_rope_params p = TK_ROPE_PARAMS_INIT;
    p.dtype = pick_dtype(rng);
    p.style = (tk_rope_style)pick(rng, TK_ROPE_NEOX, TK_ROPE_GPTJ);
    p.tokens = pick(rng, 2, 8);
    p.heads_q = pick(rng, 1, 4);
    p.heads_k = pick(rng, 1, 2);
    p.head_dim = 2 * pick(rng, 1, 32);
    const size_t es = tk_test_dtype_size(p.dtype);
    const unsigned char *q = in_buf, *k = in_buf + SLOT;
    unsigned char *q_out = out_buf, *k_out = out_buf + SLOT;
    const bool backward = pick(rng, 0, 1);
    const void *params = NULL;
    static float cache[64];
    static int32_t pos32[8];
    static int64_t pos64[8];
    switch (which) {
    case SIZE_CORRUPTIONS: *needle = "'p'"; break;
    case 4: p.dtype = (tk_dtype)bad_enum(rng); *needle = "p->dtype"; break;
    case 5: p.style = (tk_rope_style)bad_enum(rng); *needle = "p->style"; break;
    case 6: p.tokens = -pick(rng, 1, INT64_MAX); *needle = "p->tokens"; break;
    case 7: p.heads_q = -pick(rng, 1, INT64_MAX); *needle = "p->heads_q"; break;
    case 8: p.heads_k = -pick(rng, 1, INT64_MAX); *needle = "p->heads_k"; break;
    case 9: p.head_dim = pick(rng, -1000, 1); *needle = "p->head_dim"; break;
    case 10: p.rotary_dim = pick(rng, 0, 1) ? 2 * pick(rng, 0, p.head_dim / 2 - 1) + 1 : p.head_dim + 2 * pick(rng, 1, 8); *needle = "p->rotary_dim"; break;
    case 11: p.q_strides[0] = -pick(rng, 1, 1000); p.q_strides[1] = p.head_dim; *needle = "p->q_strides"; break;
    case 12: /* output rows on top of one another */
        p.q_out_strides[0] = pick(rng, 0, p.head_dim - 1); p.q_out_strides[1] = p.tokens * p.head_dim; *needle = "p->q_out_strides"; break;
    case 13: p.positions32 = pos32; p.positions64 = pos64; *needle = "positions"; break;
    case 14: p.theta = pick(rng, 0, 1) ? -(float)pick(rng, 0, 100) : NAN; *needle = "p->theta"; break;
    case 15: p.cos_cache = cache; *needle = "p->sin_cache"; break;
    case 16: q = NULL; *needle = backward ? "'dq'" : "'q'"; break;
    case 17: k_out = NULL; *needle = backward ? "'dk_out'" : "'k_out'"; break;
    case 18: q = in_buf + pick(rng, 1, (int64_t)es - 1); *needle = backward ? "'dq'" : "'q'"; break;
    case 19: q_out = (unsigned char *)q + es * (size_t)pick(rng, 1, p.head_dim - 1); *needle = backward ? "'dq_out' overlaps 'dq'" : "'q_out' overlaps 'q'"; break;
    case 20: p.tokens = INT64_MAX / pick(rng, 2, 3); *needle = "overflow"; break;
    }
    if (which != SIZE_CORRUPTIONS)
        params = place_params(rng, &p, sizeof p, which, needle);
    snprintf(what, what_size, "%s dtype %d style %d tokens %lld heads %lld/%lld head_dim %lld rotary %lld q %p q_out %p",
             backward ? "bwd" : "fwd", (int)p.dtype, (int)p.style, (long long)p.tokens, (long long)p.heads_q,
             (long long)p.heads_k, (long long)p.head_dim, (long long)p.rotary_dim, (const void *)q, (void *)q_out);
    return backward ? tk_rope_bwd(params, q, k, q_out, k_out, NULL) : tk_rope_fwd(params, q, k, q_out, k_out, NULL);
}

Test(invalid_sweep, rope, .timeout = 60) { sweep("rope", 21, rope_case); }

/* ---- attention: tk_attention_fwd, tk_attention_supported ---- */

static tk_status attention_case(tk_rng *rng, int which, const char **needle, char *what, size_t what_size) {
    tk_attention_params p = TK_ATTENTION_PARAMS_INIT;
    p.dtype = pick(rng, 0, 1) ? TK_F16 : TK_BF16;
    p.batch = pick(rng, 1, 2);
    p.seqlen_q = pick(rng, 2, 32);
    p.seqlen_k = pick(rng, 1, 32);
    p.heads_kv = pick(rng, 1, 2);
    p.heads_q = p.heads_kv * pick(rng, 1, 2);
    p.head_dim = 64;
    p.q = in_buf;
    p.k = in_buf + SLOT;
    p.v = in_buf + 2 * SLOT;
    p.o = out_buf;
    p.return_lse = (int)pick(rng, 0, 1);
    p.lse = (float *)(out_buf + SLOT);
    const void *params = NULL;
    switch (which) {
    case SIZE_CORRUPTIONS: *needle = "'p'"; break;
    case 4: p.dtype = pick(rng, 0, 1) ? TK_F32 : (tk_dtype)bad_enum(rng); *needle = "p->dtype"; break;
    case 5: p.batch = -pick(rng, 1, INT64_MAX); *needle = "p->batch"; break;
    case 6: p.seqlen_q = -pick(rng, 0, INT64_MAX); *needle = "p->seqlen_q"; break;
    case 7: p.heads_kv = 2; p.heads_q = 2 * pick(rng, 0, 8) + 1; *needle = "p->heads_q"; break;
    case 8: p.head_dim = pick(rng, 65, 79); *needle = "p->head_dim"; break;
    case 9: p.softmax_scale = pick(rng, 0, 1) ? -(float)pick(rng, 1, 10) : NAN; *needle = "p->softmax_scale"; break;
    case 10: p.causal = bad_enum(rng); *needle = "p->causal"; break;
    case 11: p.window_left = -pick(rng, 2, INT64_MAX); *needle = "p->window_left"; break;
    case 12: p.causal = 1; p.window_right = pick(rng, 1, 100); *needle = "p->window_right"; break;
    case 13: p.softcap = pick(rng, 0, 1) ? -1.0f : INFINITY; *needle = "p->softcap"; break;
    case 14: p.return_lse = 1; p.lse = NULL; *needle = "p->lse"; break;
    case 15: p.q = NULL; *needle = "'p->q'"; break;
    case 16: p.o = NULL; *needle = "'p->o'"; break;
    case 17: p.o = out_buf + 2 * pick(rng, 1, 7); *needle = "'p->o'"; break;
    case 18: p.o = in_buf + 16 * pick(rng, 0, 64); *needle = "'p->o' overlaps 'p->q'"; break;
    case 19: p.o_strides[0] = 0; p.o_strides[1] = 8 * pick(rng, 0, 7); p.o_strides[2] = 0; p.o_strides[3] = 1; *needle = "p->o_strides"; break;
    case 20: p.q_strides[0] = p.seqlen_q * p.heads_q * 64; p.q_strides[1] = p.heads_q * 64; p.q_strides[2] = 64;
        p.q_strides[3] = pick(rng, 2, 64); *needle = "p->q_strides[3]"; break;
    case 21: p.k_strides[0] = -8 * pick(rng, 1, 100); p.k_strides[3] = 1; *needle = "p->k_strides"; break;
    }
    if (which != SIZE_CORRUPTIONS)
        params = place_grown_params(rng, &p, sizeof p, ATTENTION_PARAMS_SIZE_0_1, which, needle);
    snprintf(what, what_size, "dtype %d batch %lld seqlen %lld/%lld heads %lld/%lld head_dim %lld o %p",
             (int)p.dtype, (long long)p.batch, (long long)p.seqlen_q, (long long)p.seqlen_k, (long long)p.heads_q,
             (long long)p.heads_kv, (long long)p.head_dim, p.o);
    const bool query = pick(rng, 0, 1);
    const char *name = "untouched";
    const tk_status s = query ? tk_attention_supported(params, &name) : tk_attention_fwd(params, NULL);
    cr_assert(!query || name == NULL, "%s: tk_attention_supported did not clear its variant name on failure", what);
    return s;
}

Test(invalid_sweep, attention, .timeout = 60) { sweep("attention", 22, attention_case); }

/* ---- GEMM: tk_gemm, tk_gemm_supported ---- */

static tk_status gemm_case(tk_rng *rng, int which, const char **needle, char *what, size_t what_size) {
    tk_gemm_params p = TK_GEMM_PARAMS_INIT;
    p.m = pick(rng, 1, 64);
    p.n = pick(rng, 1, 64);
    p.k = pick(rng, 1, 64);
    p.input_dtype = pick(rng, 0, 1) ? TK_F16 : TK_BF16;
    p.output_dtype = pick_dtype(rng);
    p.b_layout = (tk_gemm_b_layout)pick(rng, TK_GEMM_B_KN, TK_GEMM_B_NK);
    p.a = in_buf;
    p.lda = p.k;
    p.b = in_buf + SLOT;
    p.ldb = p.b_layout == TK_GEMM_B_KN ? p.n : p.k;
    p.c = in_buf + 2 * SLOT;
    p.ldc = p.n;
    p.beta = (float)pick(rng, 0, 1);
    p.bias = pick(rng, 0, 1) ? in_buf + 3 * SLOT : NULL;
    p.d = out_buf;
    p.ldd = p.n;
    const void *params = NULL;
    switch (which) {
    case SIZE_CORRUPTIONS: *needle = "'p'"; break;
    case 4: p.m = -pick(rng, 0, INT64_MAX); *needle = "p->m"; break;
    case 5: p.n = -pick(rng, 0, INT64_MAX); *needle = "p->n"; break;
    case 6: p.k = -pick(rng, 0, INT64_MAX); *needle = "p->k"; break;
    case 7: p.input_dtype = pick(rng, 0, 1) ? TK_F32 : (tk_dtype)bad_enum(rng); *needle = "p->input_dtype"; break;
    case 8: p.output_dtype = (tk_dtype)bad_enum(rng); *needle = "p->output_dtype"; break;
    case 9: p.b_layout = (tk_gemm_b_layout)bad_enum(rng); *needle = "p->b_layout"; break;
    case 10: p.activation = (tk_activation)bad_enum(rng); *needle = "p->activation"; break;
    case 11: p.alpha = pick(rng, 0, 1) ? NAN : INFINITY; *needle = "p->alpha"; break;
    case 12: p.beta = pick(rng, 0, 1) ? NAN : -INFINITY; *needle = "p->beta"; break;
    case 13: p.a = NULL; *needle = "'p->a'"; break;
    case 14: p.d = NULL; *needle = "'p->d'"; break;
    case 15: p.beta = 1.0f; p.c = NULL; *needle = "'p->c'"; break;
    case 16: p.k = pick(rng, 2, 64); p.lda = pick(rng, 1, p.k - 1); *needle = "p->lda"; break;
    case 17: p.n = pick(rng, 2, 64); p.ldd = pick(rng, 1, p.n - 1); p.ldc = p.n; p.ldb = p.n + p.k; *needle = "p->ldd"; break;
    case 18: p.a = in_buf + 1; *needle = "'p->a'"; break;
    case 19: p.d = (void *)((const unsigned char *)p.a + 4 * pick(rng, 0, (p.m * p.k - 1) / 2)); *needle = "'p->a'"; break;
    case 20: p.m = INT64_MAX / pick(rng, 4, 64); p.lda = p.k = p.n = p.ldc = p.ldd = 64; p.ldb = 128; *needle = "overflows"; break;
    }
    if (which != SIZE_CORRUPTIONS)
        params = place_params(rng, &p, sizeof p, which, needle);
    snprintf(what, what_size, "m %lld n %lld k %lld dtypes %d/%d layout %d ld %lld/%lld/%lld/%lld beta %g a %p d %p",
             (long long)p.m, (long long)p.n, (long long)p.k, (int)p.input_dtype, (int)p.output_dtype,
             (int)p.b_layout, (long long)p.lda, (long long)p.ldb, (long long)p.ldc, (long long)p.ldd,
             (double)p.beta, p.a, p.d);
    const bool query = pick(rng, 0, 1);
    const char *name = "untouched";
    const tk_status s = query ? tk_gemm_supported(params, &name) : tk_gemm(params, NULL);
    cr_assert(!query || name == NULL, "%s: tk_gemm_supported did not clear its variant name on failure", what);
    return s;
}

Test(invalid_sweep, gemm, .timeout = 60) { sweep("gemm", 21, gemm_case); }

/* ------------------------------------------------------------ the params size rule ---- */

/* One params struct: a valid call of its entry point on host buffers, with the struct at p. */
typedef struct params_family {
    const char *name;
    size_t size;     /* sizeof the struct */
    size_t size_0_1; /* the smallest size field accepted: the 0.1 layout */
    void (*fill)(void *p);
    tk_status (*call)(const void *p);
} params_family;

static void fill_glu(void *p) {
    tk_glu_params g = TK_GLU_PARAMS_INIT;
    g.rows = 4, g.d = 16;
    memcpy(p, &g, sizeof g);
}
static tk_status call_glu(const void *p) { return tk_glu_fwd(p, in_buf, out_buf, NULL); }

static void fill_norm(void *p) {
    tk_norm_params n = TK_NORM_PARAMS_INIT;
    n.rows = 4, n.cols = 64;
    memcpy(p, &n, sizeof n);
}
static tk_status call_norm(const void *p) {
    return tk_rmsnorm_fwd(p, in_buf, NULL, in_buf + SLOT, out_buf, (float *)(out_buf + SLOT), NULL);
}

static void fill_softmax(void *p) {
    tk_softmax_params s = TK_SOFTMAX_PARAMS_INIT;
    s.rows = 4, s.cols = 64;
    memcpy(p, &s, sizeof s);
}
static tk_status call_softmax(const void *p) { return tk_softmax_fwd(p, in_buf, out_buf, NULL); }

static void fill_rope(void *p) {
    tk_rope_params r = TK_ROPE_PARAMS_INIT;
    r.tokens = 4, r.heads_q = 2, r.heads_k = 1, r.head_dim = 16;
    memcpy(p, &r, sizeof r);
}
static tk_status call_rope(const void *p) { return tk_rope_fwd(p, in_buf, in_buf + SLOT, out_buf, out_buf + SLOT, NULL); }

static void fill_attention(void *p) {
    tk_attention_params a = TK_ATTENTION_PARAMS_INIT;
    a.batch = 1, a.seqlen_q = a.seqlen_k = 16, a.heads_q = a.heads_kv = 1, a.head_dim = 64;
    a.q = in_buf, a.k = in_buf + SLOT, a.v = in_buf + 2 * SLOT, a.o = out_buf;
    memcpy(p, &a, sizeof a);
}
static tk_status call_attention(const void *p) { return tk_attention_fwd(p, NULL); }

static void fill_attention_bwd(void *p) {
    tk_attention_bwd_params a = TK_ATTENTION_BWD_PARAMS_INIT;
    a.batch = 1, a.seqlen_q = a.seqlen_k = 16, a.heads_q = a.heads_kv = 1, a.head_dim = 64;
    a.q = in_buf, a.k = in_buf + SLOT, a.v = in_buf + 2 * SLOT, a.o = in_buf + 3 * SLOT;
    a.lse = (const float *)(in_buf + 3 * SLOT + 4096), a.dout = in_buf + 3 * SLOT + 8192;
    a.dq = out_buf, a.dk = out_buf + 4096, a.dv = out_buf + 8192;
    a.workspace = out_buf + SLOT, a.workspace_bytes = SLOT;
    memcpy(p, &a, sizeof a);
}
static tk_status call_attention_bwd(const void *p) { return tk_attention_bwd(p, NULL); }

static void fill_gemm(void *p) {
    tk_gemm_params g = TK_GEMM_PARAMS_INIT;
    g.m = g.n = g.k = 16, g.lda = g.ldb = g.ldd = 16;
    g.a = in_buf, g.b = in_buf + SLOT, g.d = out_buf;
    memcpy(p, &g, sizeof g);
}
static tk_status call_gemm(const void *p) { return tk_gemm(p, NULL); }

static void fill_device_info(void *p) {
    tk_device_info i = TK_DEVICE_INFO_INIT;
    memcpy(p, &i, sizeof i);
}
static tk_status call_device_info(const void *p) { return tk_device_query((tk_device_info *)(uintptr_t)p); }

static const params_family PARAMS_FAMILIES[] = {
    {"tk_glu_params", sizeof(tk_glu_params), sizeof(tk_glu_params), fill_glu, call_glu},
    {"tk_norm_params", sizeof(tk_norm_params), sizeof(tk_norm_params), fill_norm, call_norm},
    {"tk_softmax_params", sizeof(tk_softmax_params), sizeof(tk_softmax_params), fill_softmax, call_softmax},
    {"tk_rope_params", sizeof(tk_rope_params), sizeof(tk_rope_params), fill_rope, call_rope},
    {"tk_attention_params", sizeof(tk_attention_params), ATTENTION_PARAMS_SIZE_0_1, fill_attention,
     call_attention},
    {"tk_attention_bwd_params", sizeof(tk_attention_bwd_params), ATTENTION_BWD_PARAMS_SIZE_0_1,
     fill_attention_bwd, call_attention_bwd},
    {"tk_gemm_params", sizeof(tk_gemm_params), sizeof(tk_gemm_params), fill_gemm, call_gemm},
    {"tk_device_info", sizeof(tk_device_info), sizeof(tk_device_info), fill_device_info, call_device_info},
};

/* The struct in params_buf with the given size field and, past the struct, `tail_byte` at
 * `tail_at` bytes past its end (none when tail_at < 0). */
static tk_status call_with_size(const params_family *f, size_t size, int tail_at, unsigned char tail_byte) {
    memset(params_buf, 0, sizeof params_buf);
    f->fill(params_buf);
    memcpy(params_buf, &size, sizeof size);
    if (tail_at >= 0)
        params_buf[f->size + (size_t)tail_at] = tail_byte;
    reset_buffers();
    return f->call(params_buf);
}

/* Rejected: the status, a message naming the size field, nothing written (the struct itself
 * included: tk_device_query writes its output struct only on success). */
static void expect_size_rejected(const params_family *f, size_t size, int tail_at, const char *why) {
    const tk_status s = call_with_size(f, size, tail_at, 0x7f);
    cr_assert_eq(s, TK_ERROR_INVALID_VALUE, "%s, size %zu (%s): returned %s (\"%s\")", f->name, size, why,
                 tk_status_string(s), tk_last_error());
    cr_assert(strstr(tk_last_error(), "size") != NULL, "%s (%s): \"%s\" does not name size", f->name, why,
              tk_last_error());
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf) && tk_is_sentinel(in_buf, sizeof in_buf),
              "%s (%s): a buffer was written", f->name, why);
    cr_assert_eq(memcmp(params_buf, &size, sizeof size), 0, "%s (%s): the struct was written", f->name, why);
}

/* Accepted: the call gets past validation to the device, which this machine lacks. */
static void expect_size_accepted(const params_family *f, size_t size, const char *why) {
    const tk_status s = call_with_size(f, size, -1, 0);
    cr_assert_eq(s, TK_ERROR_NO_DEVICE, "%s, size %zu (%s): returned %s (\"%s\")", f->name, size, why,
                 tk_status_string(s), tk_last_error());
    cr_assert(tk_is_sentinel(out_buf, sizeof out_buf), "%s (%s): an output was written", f->name, why);
}

Test(params_size, smaller_and_unknown_nonzero_tail_rejected) {
    for (size_t i = 0; i < sizeof PARAMS_FAMILIES / sizeof PARAMS_FAMILIES[0]; i++) {
        const params_family *f = &PARAMS_FAMILIES[i];
        expect_size_rejected(f, 0, -1, "zero");
        expect_size_rejected(f, f->size_0_1 - 8, -1, "one field short");
        expect_size_rejected(f, f->size_0_1 - 1, -1, "one byte short");
        expect_size_rejected(f, f->size + 1, 0, "the byte after the struct set");
        expect_size_rejected(f, f->size + 64, 63, "the last byte of a longer struct set");
        expect_size_rejected(f, (size_t)1 << 40, -1, "no struct is this large");
    }
}

Test(params_size, this_and_later_layouts_accepted) {
    if (tk_test_have_device())
        cr_skip_test("a CUDA device is present; host buffers cannot stand in for a valid call");
    for (size_t i = 0; i < sizeof PARAMS_FAMILIES / sizeof PARAMS_FAMILIES[0]; i++) {
        const params_family *f = &PARAMS_FAMILIES[i];
        expect_size_accepted(f, f->size_0_1, "the 0.1 layout");
        expect_size_accepted(f, f->size, "this layout");
        expect_size_accepted(f, f->size + 8, "a later layout, its new field left zero");
        expect_size_accepted(f, f->size + 200, "a much later layout, its new fields left zero");
    }
}
