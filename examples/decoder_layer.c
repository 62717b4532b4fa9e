/* A whole Mistral-style decoder layer through libtkern, from plain C: a prefill of P tokens per
 * sequence for a batch, then D decode steps that append to a KV cache, with per-phase times,
 * tokens/s and the share of each op.
 *
 *   cc -std=c11 decoder_layer.c $(pkg-config --cflags --libs tkern) -lcudart -lm -o decoder_layer
 *   ./decoder_layer                      timing at Mistral 7B's sizes (see --help for the flags)
 *   ./decoder_layer --check              small sizes, compared with the f32 CPU layer below
 *
 * One layer, bf16 activations and weights, weights random with a fixed seed:
 *
 *   a   = rmsnorm(x) * w_attn_norm
 *   qkv = a Wqkv^T                       one GEMM, rows [q (heads_q) | k (heads_kv) | v (heads_kv)]
 *   q, k = rope(q, k)                    NeoX style, in place in the packed qkv rows
 *   cache <- k, v                        appended at the tokens' positions
 *   o   = attention(q, cache)            causal sliding window (Mistral sliding_window = N sees
 *                                        N keys, itself included), GQA
 *   h   = x + o Wo^T                     the residual is the GEMM epilogue's C with beta = 1
 *   f   = rmsnorm(h) * w_ffn_norm
 *   g|u = f Wgu^T                        one GEMM, rows [gate (ffn) | up (ffn)]
 *   y   = h + (silu(g) * u) Wdown^T      SwiGLU, then the residual again in the GEMM epilogue
 *
 * Weights are stored as PyTorch Linear weights, [out_features, in_features]: the GEMM's B in
 * its default [N, K] layout. The library never allocates: every buffer is allocated up front.
 *
 * The KV cache is a contiguous [batch, prefill + decode, 2 * heads_kv, head_dim] buffer (each
 * position holds its K row, then its V row, as the qkv GEMM writes them). Each step copies the
 * new tokens' K|V there and runs the plain attention entry point with seqlen_q = new tokens and
 * seqlen_k = cache length: the mask is aligned bottom-right, so the new rows face the newest
 * keys. This moves to the KV-cache attention entry point when the library has one.
 *
 * Exit status: 0 on success, 1 on an error or (--check) a mismatch, 2 when there is no usable
 * GPU (the message says why). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <tkern.h>

typedef struct dims {
    int64_t hidden, heads_q, heads_kv, head_dim, ffn, window, batch, prefill, decode;
} dims;

/* Mistral 7B's layer; prefill 4096 tokens (the window), so decode steps slide the window. */
static const dims timing_dims = {4096, 32, 8, 128, 14336, 4096, 4, 4096, 128};
/* Small enough for the CPU, with a window shorter than the prefill, GQA groups of 2 and a
 * hidden size that differs from heads_q * head_dim, so that a mixed-up dimension shows. */
static const dims check_dims = {384, 4, 2, 128, 640, 20, 3, 37, 6};

static const float rope_theta = 10000.0f, norm_eps = 1e-5f;
static const uint64_t seed = 0x5eed;

/* ------------------------------------------------------------------------- the layer ---- */

enum { OP_ATTN_NORM, OP_QKV, OP_ROPE, OP_KV_APPEND, OP_ATTENTION, OP_O_PROJ, OP_FFN_NORM,
       OP_GATE_UP, OP_SWIGLU, OP_DOWN, OP_COUNT };
static const char *const op_names[OP_COUNT] = {
    "rmsnorm (attention)", "gemm qkv", "rope", "kv append (copy)", "attention (sliding, gqa)",
    "gemm out + residual", "rmsnorm (ffn)", "gemm gate|up", "swiglu", "gemm down + residual"};

typedef uint16_t bf16; /* storage only: the library computes, the host converts */

typedef struct layer {
    dims d;
    int64_t qkv_width, kv_width, attn_width, max_len;
    bf16 *w_attn_norm, *w_qkv, *w_o, *w_ffn_norm, *w_gate_up, *w_down; /* device */
    bf16 *normed, *qkv, *attn, *h, *gate_up, *act, *cache;                /* device */
    cudaStream_t stream;
} layer;

#define TK_CHECK(call)                                                                           \
    do {                                                                                         \
        tk_status status_ = (call);                                                              \
        if (status_ != TK_SUCCESS) {                                                             \
            fprintf(stderr, "%s: %s\n", tk_status_string(status_), tk_last_error());             \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

#define CUDA_CHECK(call)                                                                         \
    do {                                                                                         \
        cudaError_t error_ = (call);                                                             \
        if (error_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(error_)); \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

/* Inside layer_forward: an event before each op when timing. */
#define MARK(op)                                                                                 \
    do {                                                                                         \
        if (events)                                                                              \
            CUDA_CHECK(cudaEventRecord(events[op], l->stream));                                  \
    } while (0)

static tk_status rmsnorm(const layer *l, int64_t tokens, const bf16 *x, const bf16 *weight, bf16 *y) {
    tk_norm_params p = TK_NORM_PARAMS_INIT;
    p.dtype = TK_BF16;
    p.weight_dtype = TK_BF16;
    p.rows = tokens;
    p.cols = l->d.hidden;
    p.eps = norm_eps;
    return tk_rmsnorm_fwd(&p, x, NULL, weight, y, NULL, l->stream);
}

/* d[m, n] = a[m, k] w[n, k]^T (+ residual[m, n]), all dense. */
static tk_status linear(const layer *l, int64_t m, int64_t n, int64_t k, const bf16 *a,
                        const bf16 *w, const bf16 *residual, bf16 *d) {
    tk_gemm_params p = TK_GEMM_PARAMS_INIT;
    p.m = m;
    p.n = n;
    p.k = k;
    p.input_dtype = TK_BF16;
    p.output_dtype = TK_BF16;
    p.b_layout = TK_GEMM_B_NK;
    p.a = a;
    p.lda = k;
    p.b = w;
    p.ldb = k;
    p.d = d;
    p.ldd = n;
    if (residual) {
        p.c = residual;
        p.ldc = n;
        p.beta = 1.0f;
    }
    return tk_gemm(&p, l->stream);
}

/* One pass of the layer over `tokens_new` new tokens of each sequence, at positions pos0 ..
 * pos0 + tokens_new - 1 (positions[b * tokens_new + i] holds them, on the device). x and y are
 * [batch, tokens_new, hidden]. With events, events[op] is recorded before each op and
 * events[OP_COUNT] after the last. */
static int layer_forward(const layer *l, const bf16 *x, int64_t tokens_new, int64_t pos0,
                         const int32_t *positions, bf16 *y, cudaEvent_t *events) {
    const dims *d = &l->d;
    const int64_t tokens = d->batch * tokens_new, hd = d->head_dim;
    bf16 *k = l->qkv + d->heads_q * hd;

    MARK(OP_ATTN_NORM);
    TK_CHECK(rmsnorm(l, tokens, x, l->w_attn_norm, l->normed));

    MARK(OP_QKV);
    TK_CHECK(linear(l, tokens, l->qkv_width, d->hidden, l->normed, l->w_qkv, NULL, l->qkv));

    MARK(OP_ROPE);
    tk_rope_params rp = TK_ROPE_PARAMS_INIT;
    rp.dtype = TK_BF16;
    rp.style = TK_ROPE_NEOX;
    rp.tokens = tokens;
    rp.heads_q = d->heads_q;
    rp.heads_k = d->heads_kv;
    rp.head_dim = hd;
    rp.q_strides[0] = rp.k_strides[0] = l->qkv_width;
    rp.q_strides[1] = rp.k_strides[1] = hd;
    rp.positions32 = positions;
    rp.theta = rope_theta;
    TK_CHECK(tk_rope_fwd(&rp, l->qkv, k, l->qkv, k, l->stream));

    /* K|V of each new token is contiguous in its qkv row: one strided copy into the cache. */
    MARK(OP_KV_APPEND);
    const size_t row_bytes = (size_t)l->kv_width * sizeof(bf16);
    if (tokens_new == 1) {
        CUDA_CHECK(cudaMemcpy2DAsync(l->cache + pos0 * l->kv_width, (size_t)(l->max_len * l->kv_width) * sizeof(bf16),
                                     k, (size_t)l->qkv_width * sizeof(bf16), row_bytes, (size_t)d->batch,
                                     cudaMemcpyDeviceToDevice, l->stream));
    } else {
        for (int64_t b = 0; b < d->batch; b++)
            CUDA_CHECK(cudaMemcpy2DAsync(l->cache + (b * l->max_len + pos0) * l->kv_width, row_bytes,
                                         k + b * tokens_new * l->qkv_width, (size_t)l->qkv_width * sizeof(bf16),
                                         row_bytes, (size_t)tokens_new, cudaMemcpyDeviceToDevice, l->stream));
    }

    MARK(OP_ATTENTION);
    tk_attention_params ap = TK_ATTENTION_PARAMS_INIT;
    ap.dtype = TK_BF16;
    ap.q = l->qkv;
    ap.k = l->cache;
    ap.v = l->cache + d->heads_kv * hd;
    ap.o = l->attn;
    ap.batch = d->batch;
    ap.seqlen_q = tokens_new;
    ap.seqlen_k = pos0 + tokens_new;
    ap.heads_q = d->heads_q;
    ap.heads_kv = d->heads_kv;
    ap.head_dim = hd;
    const int64_t q_strides[4] = {tokens_new * l->qkv_width, l->qkv_width, hd, 1};
    const int64_t kv_strides[4] = {l->max_len * l->kv_width, l->kv_width, hd, 1};
    memcpy(ap.q_strides, q_strides, sizeof q_strides);
    memcpy(ap.k_strides, kv_strides, sizeof kv_strides);
    memcpy(ap.v_strides, kv_strides, sizeof kv_strides);
    /* o dense [batch, tokens_new, heads_q, head_dim] = [tokens, attn_width] for the next GEMM. */
    TK_CHECK(tk_attention_sliding_fwd(&ap, d->window - 1, l->stream));

    MARK(OP_O_PROJ);
    TK_CHECK(linear(l, tokens, d->hidden, l->attn_width, l->attn, l->w_o, x, l->h));

    MARK(OP_FFN_NORM);
    TK_CHECK(rmsnorm(l, tokens, l->h, l->w_ffn_norm, l->normed));

    MARK(OP_GATE_UP);
    TK_CHECK(linear(l, tokens, 2 * d->ffn, d->hidden, l->normed, l->w_gate_up, NULL, l->gate_up));

    MARK(OP_SWIGLU);
    tk_glu_params gp = TK_GLU_PARAMS_INIT;
    gp.kind = TK_GLU_SWIGLU;
    gp.dtype = TK_BF16;
    gp.layout = TK_GLU_GATE_FIRST;
    gp.rows = tokens;
    gp.d = d->ffn;
    TK_CHECK(tk_glu_fwd(&gp, l->gate_up, l->act, l->stream));

    MARK(OP_DOWN);
    TK_CHECK(linear(l, tokens, d->hidden, d->ffn, l->act, l->w_down, l->h, y));
    MARK(OP_COUNT);
    return 0;
}

/* -------------------------------------------------------------- host-side helpers ---- */

static uint16_t to_bf16(float f) { /* round to nearest even; the inputs are finite */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t rng_state = seed;
static float uniform(void) { /* splitmix64, then [-1, 1) */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* Allocates n bf16 elements on the device filled with center + scale * U[-1, 1); when keep is
 * not NULL it receives *keep, a host copy of the rounded values as f32 (for the CPU layer). */
static int random_tensor(bf16 **dev, int64_t n, float center, float scale, float **keep) {
    bf16 *host = malloc((size_t)n * sizeof *host);
    if (!host) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    if (keep && !(*keep = malloc((size_t)n * sizeof **keep))) {
        free(host);
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        host[i] = to_bf16(center + scale * uniform());
        if (keep)
            (*keep)[i] = from_bf16(host[i]);
    }
    cudaError_t e = cudaMalloc((void **)dev, (size_t)n * sizeof(bf16));
    if (e == cudaSuccess)
        e = cudaMemcpy(*dev, host, (size_t)n * sizeof(bf16), cudaMemcpyHostToDevice);
    free(host);
    CUDA_CHECK(e);
    return 0;
}

/* ------------------------------------------------------------- the f32 CPU layer ---- */

/* The same layer in f32 (sums in f64) on the host, from the same bf16 weights and inputs;
 * the GPU rounds every intermediate to bf16, this does not. */
typedef struct cpu_layer {
    float *w_attn_norm, *w_qkv, *w_o, *w_ffn_norm, *w_gate_up, *w_down;
    float *cache; /* [batch, max_len, kv_width] as on the GPU */
} cpu_layer;

static void cpu_rmsnorm(int64_t tokens, int64_t n, const float *x, const float *w, float *y) {
    for (int64_t t = 0; t < tokens; t++) {
        double ss = 0;
        for (int64_t c = 0; c < n; c++)
            ss += (double)x[t * n + c] * x[t * n + c];
        const double rstd = 1.0 / sqrt(ss / (double)n + norm_eps);
        for (int64_t c = 0; c < n; c++)
            y[t * n + c] = (float)(x[t * n + c] * rstd * w[c]);
    }
}

static void cpu_linear(int64_t m, int64_t n, int64_t k, const float *a, const float *w,
                       const float *residual, float *y) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = residual ? residual[i * n + j] : 0.0;
            for (int64_t kk = 0; kk < k; kk++)
                acc += (double)a[i * k + kk] * w[j * k + kk];
            y[i * n + j] = (float)acc;
        }
}

/* NeoX rotation of one head in place: pairs (x[i], x[i + hd / 2]). */
static void cpu_rope_head(float *x, int64_t hd, int64_t pos) {
    for (int64_t i = 0; i < hd / 2; i++) {
        const double angle = (double)pos * pow(rope_theta, -2.0 * (double)i / (double)hd);
        const double c = cos(angle), s = sin(angle), x1 = x[i], x2 = x[i + hd / 2];
        x[i] = (float)(x1 * c - x2 * s);
        x[i + hd / 2] = (float)(x2 * c + x1 * s);
    }
}

static int cpu_forward(const layer *l, const cpu_layer *c, const float *x, int64_t tokens_new,
                       int64_t pos0, float *h, float *y) {
    const dims *d = &l->d;
    const int64_t tokens = d->batch * tokens_new, hd = d->head_dim, group = d->heads_q / d->heads_kv;
    float *normed = malloc((size_t)(tokens * d->hidden) * sizeof(float));
    float *qkv = malloc((size_t)(tokens * l->qkv_width) * sizeof(float));
    float *attn = malloc((size_t)(tokens * l->attn_width) * sizeof(float));
    float *gate_up = malloc((size_t)(tokens * 2 * d->ffn) * sizeof(float));
    float *act = malloc((size_t)(tokens * d->ffn) * sizeof(float));
    double *p = malloc((size_t)l->max_len * sizeof(double));
    if (!normed || !qkv || !attn || !gate_up || !act || !p) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    cpu_rmsnorm(tokens, d->hidden, x, c->w_attn_norm, normed);
    cpu_linear(tokens, l->qkv_width, d->hidden, normed, c->w_qkv, NULL, qkv);
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t i = 0; i < tokens_new; i++) {
            float *row = qkv + (b * tokens_new + i) * l->qkv_width;
            for (int64_t head = 0; head < d->heads_q + d->heads_kv; head++)
                cpu_rope_head(row + head * hd, hd, pos0 + i);
            memcpy(c->cache + (b * l->max_len + pos0 + i) * l->kv_width, row + d->heads_q * hd,
                   (size_t)l->kv_width * sizeof(float));
        }
    const double scale = 1.0 / sqrt((double)hd);
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t i = 0; i < tokens_new; i++)
            for (int64_t head = 0; head < d->heads_q; head++) {
                const int64_t pos = pos0 + i, first = pos - (d->window - 1) > 0 ? pos - (d->window - 1) : 0;
                const float *q = qkv + (b * tokens_new + i) * l->qkv_width + head * hd;
                const int64_t kv_head = head / group;
                double max = -INFINITY, sum = 0;
                for (int64_t j = first; j <= pos; j++) {
                    const float *key = c->cache + (b * l->max_len + j) * l->kv_width + kv_head * hd;
                    double s = 0;
                    for (int64_t e = 0; e < hd; e++)
                        s += (double)q[e] * key[e];
                    p[j] = s * scale;
                    max = p[j] > max ? p[j] : max;
                }
                for (int64_t j = first; j <= pos; j++)
                    sum += (p[j] = exp(p[j] - max));
                float *o = attn + (b * tokens_new + i) * l->attn_width + head * hd;
                for (int64_t e = 0; e < hd; e++) {
                    double acc = 0;
                    for (int64_t j = first; j <= pos; j++)
                        acc += p[j] * c->cache[(b * l->max_len + j) * l->kv_width + (d->heads_kv + kv_head) * hd + e];
                    o[e] = (float)(acc / sum);
                }
            }
    cpu_linear(tokens, d->hidden, l->attn_width, attn, c->w_o, x, h);
    cpu_rmsnorm(tokens, d->hidden, h, c->w_ffn_norm, normed);
    cpu_linear(tokens, 2 * d->ffn, d->hidden, normed, c->w_gate_up, NULL, gate_up);
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t j = 0; j < d->ffn; j++) {
            const double g = gate_up[t * 2 * d->ffn + j], u = gate_up[t * 2 * d->ffn + d->ffn + j];
            act[t * d->ffn + j] = (float)(g / (1.0 + exp(-g)) * u);
        }
    cpu_linear(tokens, d->hidden, d->ffn, act, c->w_down, h, y);
    free(normed);
    free(qkv);
    free(attn);
    free(gate_up);
    free(act);
    free(p);
    return 0;
}

/* Compares a [rows, hidden] device tensor with the CPU's. bf16 rounding of every intermediate
 * (about 2^-9 relative each, a dozen of them, carried through sums of random signs) keeps the
 * error near 1% of the tensor's RMS; a wrong index or mask gives errors of the tensor's size. */
static int compare(const char *what, const bf16 *dev, const float *ref, int64_t n, int *failures) {
    bf16 *host = malloc((size_t)n * sizeof *host);
    if (!host) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    cudaError_t e = cudaMemcpy(host, dev, (size_t)n * sizeof *host, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(host);
        CUDA_CHECK(e);
    }
    double ss_ref = 0, ss_err = 0, max_err = 0;
    for (int64_t i = 0; i < n; i++) {
        const double got = from_bf16(host[i]), err = isnan(got) ? INFINITY : fabs(got - ref[i]);
        ss_ref += (double)ref[i] * ref[i];
        ss_err += err * err;
        max_err = err > max_err ? err : max_err;
    }
    free(host);
    const double rms = sqrt(ss_ref / (double)n), rel_rms = sqrt(ss_err / (double)n) / rms,
                 rel_max = max_err / rms;
    const int ok = rel_rms <= 1.5e-2 && rel_max <= 8e-2;
    printf("  %-28s rms %.3f  error: rms %.2e, max %.2e (of the rms)  %s\n", what, rms, rel_rms, rel_max,
           ok ? "ok" : "MISMATCH");
    *failures += !ok;
    return 0;
}

/* --------------------------------------------------------------------------- main ---- */

static int parse_args(int argc, char **argv, dims *d, int *check) {
    static const char usage[] =
        "usage: decoder_layer [--check] [--hidden N] [--heads N] [--kv-heads N] [--head-dim N]\n"
        "                     [--ffn N] [--window N] [--batch N] [--prefill N] [--decode N]\n"
        "  --check   small sizes (unless given), compare every output with the f32 CPU layer\n";
    *check = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--check"))
            *check = 1;
    *d = *check ? check_dims : timing_dims;
    const struct { const char *flag; int64_t *value; int64_t min; } flags[] = {
        {"--hidden", &d->hidden, 1},   {"--heads", &d->heads_q, 1},      {"--kv-heads", &d->heads_kv, 1},
        {"--head-dim", &d->head_dim, 2}, {"--ffn", &d->ffn, 1},          {"--window", &d->window, 1},
        {"--batch", &d->batch, 1},     {"--prefill", &d->prefill, 1},    {"--decode", &d->decode, 0},
    };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check"))
            continue;
        size_t f = 0;
        while (f < sizeof flags / sizeof flags[0] && strcmp(argv[i], flags[f].flag))
            f++;
        char *end = NULL;
        if (f == sizeof flags / sizeof flags[0] || i + 1 == argc ||
            (*flags[f].value = strtoll(argv[i + 1], &end, 10), *end != '\0') || *flags[f].value < flags[f].min) {
            fputs(usage, stderr);
            return 1;
        }
        i++;
    }
    if (d->heads_q % d->heads_kv) {
        fprintf(stderr, "--heads (%lld) must be a multiple of --kv-heads (%lld)\n", (long long)d->heads_q,
                (long long)d->heads_kv);
        return 1;
    }
    return 0;
}

static void print_phase(const char *name, const double op_ms[OP_COUNT], int64_t tokens, int64_t steps) {
    double total = 0;
    for (int op = 0; op < OP_COUNT; op++)
        total += op_ms[op];
    printf("%s: %.3f ms", name, total);
    if (steps > 1)
        printf(" (%.3f ms per step)", total / (double)steps);
    printf(", %.0f tokens/s\n", (double)tokens / (total * 1e-3));
    for (int op = 0; op < OP_COUNT; op++)
        printf("  %-26s %10.3f ms %6.1f%%\n", op_names[op], op_ms[op], 100.0 * op_ms[op] / total);
}

/* Times are added up per op, from events[step * (OP_COUNT + 1) + op]. */
static int add_times(cudaEvent_t *events, int64_t steps, double op_ms[OP_COUNT]) {
    for (int64_t s = 0; s < steps; s++)
        for (int op = 0; op < OP_COUNT; op++) {
            float ms;
            CUDA_CHECK(cudaEventElapsedTime(&ms, events[s * (OP_COUNT + 1) + op], events[s * (OP_COUNT + 1) + op + 1]));
            op_ms[op] += ms;
        }
    return 0;
}

int main(int argc, char **argv) {
    dims d;
    int check;
    if (parse_args(argc, argv, &d, &check))
        return 1;

    tk_device_info info = TK_DEVICE_INFO_INIT;
    tk_status status = tk_device_query(&info);
    if (status != TK_SUCCESS || !info.supported) {
        fprintf(stderr, "libtkern %d: %s\n", tk_version(),
                status != TK_SUCCESS ? tk_last_error() : "this GPU is older than sm_80");
        return 2;
    }
    printf("device %d: compute capability %d.%d, %d SMs\n", info.device, info.compute_capability / 100,
           info.compute_capability / 10 % 10, info.sm_count);
    printf("layer: hidden %lld, heads %lld/%lld x %lld, ffn %lld, window %lld; batch %lld, prefill %lld, "
           "decode %lld\n",
           (long long)d.hidden, (long long)d.heads_q, (long long)d.heads_kv, (long long)d.head_dim,
           (long long)d.ffn, (long long)d.window, (long long)d.batch, (long long)d.prefill, (long long)d.decode);

    layer l = {.d = d};
    l.attn_width = d.heads_q * d.head_dim;
    l.kv_width = 2 * d.heads_kv * d.head_dim;
    l.qkv_width = l.attn_width + l.kv_width;
    l.max_len = d.prefill + d.decode;
    const int64_t max_tokens = d.batch * d.prefill;

    /* Scales that keep every activation near unit RMS, so that each branch moves the output. */
    cpu_layer c = {0};
    float *x_host = NULL;
    bf16 *x = NULL;
    if (random_tensor(&l.w_attn_norm, d.hidden, 1.0f, 0.1f, check ? &c.w_attn_norm : NULL) ||
        random_tensor(&l.w_qkv, l.qkv_width * d.hidden, 0.0f, sqrtf(3.0f / (float)d.hidden), check ? &c.w_qkv : NULL) ||
        random_tensor(&l.w_o, d.hidden * l.attn_width, 0.0f, sqrtf(3.0f / (float)l.attn_width), check ? &c.w_o : NULL) ||
        random_tensor(&l.w_ffn_norm, d.hidden, 1.0f, 0.1f, check ? &c.w_ffn_norm : NULL) ||
        random_tensor(&l.w_gate_up, 2 * d.ffn * d.hidden, 0.0f, sqrtf(3.0f / (float)d.hidden), check ? &c.w_gate_up : NULL) ||
        random_tensor(&l.w_down, d.hidden * d.ffn, 0.0f, sqrtf(3.0f / (float)d.ffn), check ? &c.w_down : NULL) ||
        /* the inputs: the prefill's [batch, prefill, hidden], then each decode step's [batch, hidden] */
        random_tensor(&x, (max_tokens + d.decode * d.batch) * d.hidden, 0.0f, 1.0f, check ? &x_host : NULL))
        return 1;

    int32_t *positions_host = malloc((size_t)(max_tokens + d.decode * d.batch) * sizeof(int32_t)), *positions;
    if (!positions_host) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    for (int64_t b = 0; b < d.batch; b++)
        for (int64_t i = 0; i < d.prefill; i++)
            positions_host[b * d.prefill + i] = (int32_t)i;
    for (int64_t s = 0; s < d.decode; s++)
        for (int64_t b = 0; b < d.batch; b++)
            positions_host[max_tokens + s * d.batch + b] = (int32_t)(d.prefill + s);
    CUDA_CHECK(cudaMalloc((void **)&positions, (size_t)(max_tokens + d.decode * d.batch) * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(positions, positions_host, (size_t)(max_tokens + d.decode * d.batch) * sizeof(int32_t),
                          cudaMemcpyHostToDevice));

    bf16 *out;
    const struct { bf16 **buffer; int64_t elements; } buffers[] = {
        {&l.normed, max_tokens * d.hidden},  {&l.qkv, max_tokens * l.qkv_width},
        {&l.attn, max_tokens * l.attn_width}, {&l.h, max_tokens * d.hidden},
        {&l.gate_up, max_tokens * 2 * d.ffn}, {&l.act, max_tokens * d.ffn},
        {&out, max_tokens * d.hidden},        {&l.cache, d.batch * l.max_len * l.kv_width},
    };
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        CUDA_CHECK(cudaMalloc((void **)buffers[i].buffer, (size_t)buffers[i].elements * sizeof(bf16)));
    CUDA_CHECK(cudaStreamCreate(&l.stream));

    const bf16 *x_decode = x + max_tokens * d.hidden;
    const int32_t *positions_decode = positions + max_tokens;

    if (check) {
        float *h_ref = malloc((size_t)(max_tokens * d.hidden) * sizeof(float));
        float *y_ref = malloc((size_t)(max_tokens * d.hidden) * sizeof(float));
        c.cache = malloc((size_t)(d.batch * l.max_len * l.kv_width) * sizeof(float));
        if (!h_ref || !y_ref || !c.cache) {
            fprintf(stderr, "out of host memory\n");
            return 1;
        }
        int failures = 0;
        for (int64_t s = -1; s < d.decode; s++) { /* step -1 is the prefill */
            const int64_t tokens_new = s < 0 ? d.prefill : 1, pos0 = s < 0 ? 0 : d.prefill + s;
            const int64_t offset = s < 0 ? 0 : max_tokens + s * d.batch; /* in tokens */
            if (layer_forward(&l, x + offset * d.hidden, tokens_new, pos0, positions + offset, out, NULL))
                return 1;
            CUDA_CHECK(cudaStreamSynchronize(l.stream));
            if (cpu_forward(&l, &c, x_host + offset * d.hidden, tokens_new, pos0, h_ref, y_ref))
                return 1;
            if (s < 0)
                printf("prefill, %lld tokens per sequence:\n", (long long)d.prefill);
            else
                printf("decode step %lld (position %lld):\n", (long long)s, (long long)pos0);
            const int64_t n = d.batch * tokens_new * d.hidden;
            if (compare("after attention (x + o Wo^T)", l.h, h_ref, n, &failures) ||
                compare("layer output", out, y_ref, n, &failures))
                return 1;
        }
        printf("%s\n", failures ? "decoder layer: MISMATCH against the CPU" : "decoder layer matches the CPU");
        return failures ? 1 : 0;
    }

    /* Timing: one untimed pass (first calls, clocks), then the timed one. */
    const int64_t event_count = (1 + d.decode) * (OP_COUNT + 1);
    cudaEvent_t *events = malloc((size_t)event_count * sizeof *events);
    if (!events) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    for (int64_t i = 0; i < event_count; i++)
        CUDA_CHECK(cudaEventCreate(&events[i]));
    for (int timed = 0; timed < 2; timed++) {
        if (layer_forward(&l, x, d.prefill, 0, positions, out, timed ? events : NULL))
            return 1;
        for (int64_t s = 0; s < d.decode; s++)
            if (layer_forward(&l, x_decode + s * d.batch * d.hidden, 1, d.prefill + s, positions_decode + s * d.batch,
                              out, timed ? events + (1 + s) * (OP_COUNT + 1) : NULL))
                return 1;
        CUDA_CHECK(cudaStreamSynchronize(l.stream));
    }
    double prefill_ms[OP_COUNT] = {0}, decode_ms[OP_COUNT] = {0};
    if (add_times(events, 1, prefill_ms) || add_times(events + OP_COUNT + 1, d.decode, decode_ms))
        return 1;
    print_phase("prefill", prefill_ms, d.batch * d.prefill, 1);
    if (d.decode > 0)
        print_phase("decode", decode_ms, d.batch * d.decode, d.decode);
    return 0;
}
