/*
 * The benchmark harness behind `make bench`: one binary (build/bench/tkbench) that runs every
 * family's benchmarks and prints one table, plus JSON lines.
 *
 * Method (GUIDE section 6): CUDA events around the region only, warm-up first, L2 flushed
 * (a memset of a buffer twice the L2 size) before every repetition, the median of many
 * repetitions, random inputs. Each row carries the ratio to a baseline measured in the same
 * run: a device-to-device copy of the same bytes for memory-bound ops, cuBLAS / cuBLASLt for
 * GEMM, a cuBLAS-composed attention for attention. ratio = baseline_ms / ms (> 1: faster).
 * The compute-bound families (GEMM, attention) idle before each timing, theirs and the
 * baseline's (bench_settle).
 */
#ifndef TK_BENCH_H
#define TK_BENCH_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "tkern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bench_ctx bench_ctx;

/* Something to time: enqueue the work on `stream` (all the harness passes). */
typedef void (*bench_fn)(void *arg, cudaStream_t stream);

/* Median time in ms of `fn` over the context's repetitions, L2 flushed before each. */
double bench_time_ms(bench_ctx *ctx, bench_fn fn, void *arg);

/* As bench_time_ms, with the GPU left idle for idle_ms (bench_settle) before every repetition:
 * each launch starts from the same idle power state, however long the kernel or its neighbours
 * run. For kernels that hold the GPU at its power limit, where a run of back-to-back launches
 * slows down as the clocks drop, and drops more the longer the kernel (GEMM). */
double bench_time_idle_ms(bench_ctx *ctx, bench_fn fn, void *arg, int idle_ms);

/* Waits for the device, then leaves it idle for idle_ms, so that the timing that follows starts
 * from an idle power state whatever ran before it. Families whose work holds the GPU at its
 * power limit (GEMM, attention and their cuBLAS baselines) call it before every timing, ours
 * and the baseline's alike: without it a row is timed while the clocks recover from the row
 * before (docs/performance.md, "Method"). Each family passes the pause it measured to suffice. */
void bench_settle(int idle_ms);

/* Median time in ms of a device-to-device copy of `bytes_moved / 2` bytes (so that the copy
 * reads and writes bytes_moved in total, the same traffic as the op it is compared with). */
double bench_copy_ms(bench_ctx *ctx, size_t bytes_moved);

/* Median time in ms of launching an empty kernel (one warp), timed as every row is: the floor
 * under any call, whatever it does. Measured once per run, on first use. */
double bench_launch_floor_ms(bench_ctx *ctx);

/* Calls of at most this many tokens (rows) are decode-sized: their time is launch latency,
 * not bandwidth. */
#define BENCH_DECODE_TOKENS 64

/* The baseline of a memory-bound row: a copy of the same bytes ("copy"), or for a decode-sized
 * call the launch floor ("launch": ratio 0.5 = twice the time of an empty kernel). Returns its
 * name and sets *baseline_ms. */
const char *bench_memory_baseline(bench_ctx *ctx, int64_t tokens, double bytes, double *baseline_ms);

/* One table row. Set bytes for a memory-bound op (GB/s is printed), flops for a compute-bound
 * op (TFLOP/s is printed); baseline_ms <= 0 prints no ratio. */
typedef struct bench_row {
    const char *op;          /* e.g. "gelu_erf fwd" */
    const char *shape;       /* e.g. "16384x4096" */
    tk_dtype dtype;
    const char *variant;     /* tk_last_variant() after a call */
    double ms;
    double bytes;            /* bytes that must move (each input read once, output written once) */
    double flops;
    const char *baseline;    /* e.g. "copy", "cuBLAS", "cuBLASLt bias+gelu" */
    double baseline_ms;
} bench_row;
void bench_report(bench_ctx *ctx, const bench_row *row);

/* A device buffer of `bytes` filled with uniform random values in [lo, hi) of dtype. Freed by
 * the harness at exit. Aborts the benchmark run with a message on allocation failure. */
void *bench_random(bench_ctx *ctx, tk_dtype dtype, int64_t count, float lo, float hi);
/* An uninitialised device buffer, freed by the harness at exit. */
void *bench_alloc(bench_ctx *ctx, size_t bytes);
/* Frees every buffer from bench_random / bench_alloc (call at the end of a family's section to
 * keep peak memory low). */
void bench_free_all(bench_ctx *ctx);

/* Reports a failed tk_* call in a benchmark (prints the status and tk_last_error) and exits. */
void bench_check(tk_status status, const char *what);
/* Same for a CUDA runtime call. */
void bench_check_cuda(cudaError_t err, const char *what);

/* Whether the family/op `name` was selected on the command line (--only NAME[,NAME]). */
int bench_selected(const bench_ctx *ctx, const char *name);
/* Whether a row of this shape (as printed) runs: every one, or those whose shape contains the
 * text given with --shape. The families whose rows take seconds (attention, attention_masks,
 * attention_bwd) ask before timing one. */
int bench_shape_selected(const bench_ctx *ctx, const char *shape);

const char *bench_dtype_name(tk_dtype dtype);

/* The harness's main: parses --json / --only / --shape / --reps, runs the selected families in
 * order. */
typedef void (*bench_family)(bench_ctx *ctx);
int bench_main(int argc, char **argv, const char *const *names, const bench_family *families, int count);

/* Each family's benchmarks: benchmarks/bench_<family>.{c,cu} defines one of these and adds it
 * to the list in benchmarks/bench_main.c. */
void bench_activation(bench_ctx *ctx);
void bench_norm(bench_ctx *ctx);
void bench_softmax(bench_ctx *ctx);
void bench_rope(bench_ctx *ctx);
void bench_attention(bench_ctx *ctx);
void bench_attention_masks(bench_ctx *ctx);
void bench_attention_kvcache(bench_ctx *ctx);
void bench_attention_bwd(bench_ctx *ctx);
void bench_gemm(bench_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
