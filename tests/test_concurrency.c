/* Concurrency on the GPU, over one fixed workload that calls every launching entry point once on
 * its own buffers: several host threads on their own streams give the bits of the same calls run
 * serially; a CUDA graph captured from the calls and replayed on new inputs gives the bits of
 * direct calls; with a second device, calls there after device 0, then alternating between the
 * devices, give the same bits each time (the library keeps per-device state). */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "support/tk_test.h"

/* ------------------------------------------------------------------------- workload ---- */

#define ACT_ROWS 64
#define ACT_COLS 1000
#define ACT_N (ACT_ROWS * ACT_COLS)
#define GLU_ROWS 32
#define GLU_D 512
#define NORM_ROWS 64
#define NORM_COLS 1000
#define SM_ROWS 48
#define SM_COLS 1024
#define SMP_ROWS 2      /* f32 rows of 256 KB: the pipelined (cluster) softmax where it runs */
#define SMP_COLS 65536
#define ROPE_T 40
#define ROPE_HQ 8
#define ROPE_HK 2
#define ROPE_D 128
#define ATT_B 2
#define ATT_SQ 100
#define ATT_SK 130
#define ATT_HQ 4
#define ATT_HKV 2
#define ATT_D 128
#define ATT_WINDOW 31
#define GEMM_M 200
#define GEMM_N 256
#define GEMM_K 192

enum {
    /* inputs, random */
    ACT_X, ACT_DY, ACT_BIAS, GLU_X, GLU_DY, NORM_X, NORM_W, NORM_B, NORM_DY, SM_X, SM_DY, SMP_X, ROPE_Q,
    ROPE_K, ATT_Q, ATT_K, ATT_V, GEMM_A, GEMM_B, GEMM_C, GEMM_BIAS,
    /* outputs, compared bit for bit */
    ACT_Y, ACT_DX, GELU_Y, GELU_DX, GLU_Y, GLU_DX, RMS_Y, RMS_RSTD, LN_Y, LN_MEAN, LN_RSTD, RMS_DX, RMS_DW,
    LN_DX, LN_DW, LN_DB, SM_Y, SM_DX, SMP_Y, ROPE_QO, ROPE_KO, ROPE_DQ, ROPE_DK, ATT_O, ATT_LSE, SLIDE_O,
    SLIDE_LSE, GEMM_D,
    /* norm backward workspaces: scratch */
    RMS_WS, LN_WS,
    BUF_COUNT
};
#define FIRST_OUTPUT ACT_Y
#define FIRST_SCRATCH RMS_WS

static const struct {
    const char *name;
    int64_t elems; /* 0 for the workspaces, sized by tk_norm_bwd_workspace_size */
    tk_dtype dtype;
} BUFS[BUF_COUNT] = {
    [ACT_X] = {"activation x", ACT_N, TK_BF16},
    [ACT_DY] = {"activation dy", ACT_N, TK_BF16},
    [ACT_BIAS] = {"activation bias", ACT_COLS, TK_BF16},
    [GLU_X] = {"glu x", GLU_ROWS * 2 * GLU_D, TK_BF16},
    [GLU_DY] = {"glu dy", GLU_ROWS * GLU_D, TK_BF16},
    [NORM_X] = {"norm x", NORM_ROWS * NORM_COLS, TK_BF16},
    [NORM_W] = {"norm weight", NORM_COLS, TK_BF16},
    [NORM_B] = {"norm bias", NORM_COLS, TK_BF16},
    [NORM_DY] = {"norm dy", NORM_ROWS * NORM_COLS, TK_BF16},
    [SM_X] = {"softmax x", SM_ROWS * SM_COLS, TK_BF16},
    [SM_DY] = {"softmax dy", SM_ROWS * SM_COLS, TK_BF16},
    [SMP_X] = {"long-row softmax x", SMP_ROWS * SMP_COLS, TK_F32},
    [ROPE_Q] = {"rope q", ROPE_T * ROPE_HQ * ROPE_D, TK_BF16},
    [ROPE_K] = {"rope k", ROPE_T * ROPE_HK * ROPE_D, TK_BF16},
    [ATT_Q] = {"attention q", ATT_B * ATT_SQ * ATT_HQ * ATT_D, TK_BF16},
    [ATT_K] = {"attention k", ATT_B * ATT_SK * ATT_HKV * ATT_D, TK_BF16},
    [ATT_V] = {"attention v", ATT_B * ATT_SK * ATT_HKV * ATT_D, TK_BF16},
    [GEMM_A] = {"gemm a", GEMM_M * GEMM_K, TK_BF16},
    [GEMM_B] = {"gemm b", GEMM_N * GEMM_K, TK_BF16},
    [GEMM_C] = {"gemm c", GEMM_M * GEMM_N, TK_BF16},
    [GEMM_BIAS] = {"gemm bias", GEMM_N, TK_BF16},
    [ACT_Y] = {"tk_activation_fwd y", ACT_N, TK_BF16},
    [ACT_DX] = {"tk_activation_bwd dx", ACT_N, TK_BF16},
    [GELU_Y] = {"tk_gelu_fwd y", ACT_N, TK_BF16},
    [GELU_DX] = {"tk_gelu_bwd dx", ACT_N, TK_BF16},
    [GLU_Y] = {"tk_glu_fwd y", GLU_ROWS * GLU_D, TK_BF16},
    [GLU_DX] = {"tk_glu_bwd dx", GLU_ROWS * 2 * GLU_D, TK_BF16},
    [RMS_Y] = {"tk_rmsnorm_fwd y", NORM_ROWS * NORM_COLS, TK_BF16},
    [RMS_RSTD] = {"tk_rmsnorm_fwd rstd", NORM_ROWS, TK_F32},
    [LN_Y] = {"tk_layernorm_fwd y", NORM_ROWS * NORM_COLS, TK_BF16},
    [LN_MEAN] = {"tk_layernorm_fwd mean", NORM_ROWS, TK_F32},
    [LN_RSTD] = {"tk_layernorm_fwd rstd", NORM_ROWS, TK_F32},
    [RMS_DX] = {"tk_rmsnorm_bwd dx", NORM_ROWS * NORM_COLS, TK_BF16},
    [RMS_DW] = {"tk_rmsnorm_bwd dw", NORM_COLS, TK_BF16},
    [LN_DX] = {"tk_layernorm_bwd dx", NORM_ROWS * NORM_COLS, TK_BF16},
    [LN_DW] = {"tk_layernorm_bwd dw", NORM_COLS, TK_BF16},
    [LN_DB] = {"tk_layernorm_bwd db", NORM_COLS, TK_BF16},
    [SM_Y] = {"tk_softmax_fwd y", SM_ROWS * SM_COLS, TK_BF16},
    [SM_DX] = {"tk_softmax_bwd dx", SM_ROWS * SM_COLS, TK_BF16},
    [SMP_Y] = {"tk_softmax_fwd y (long rows)", SMP_ROWS * SMP_COLS, TK_F32},
    [ROPE_QO] = {"tk_rope_fwd q_out", ROPE_T * ROPE_HQ * ROPE_D, TK_BF16},
    [ROPE_KO] = {"tk_rope_fwd k_out", ROPE_T * ROPE_HK * ROPE_D, TK_BF16},
    [ROPE_DQ] = {"tk_rope_bwd dq_out", ROPE_T * ROPE_HQ * ROPE_D, TK_BF16},
    [ROPE_DK] = {"tk_rope_bwd dk_out", ROPE_T * ROPE_HK * ROPE_D, TK_BF16},
    [ATT_O] = {"tk_attention_fwd o", ATT_B * ATT_SQ * ATT_HQ * ATT_D, TK_BF16},
    [ATT_LSE] = {"tk_attention_fwd lse", ATT_B * ATT_HQ * ATT_SQ, TK_F32},
    [SLIDE_O] = {"tk_attention_sliding_fwd o", ATT_B * ATT_SQ * ATT_HQ * ATT_D, TK_BF16},
    [SLIDE_LSE] = {"tk_attention_sliding_fwd lse", ATT_B * ATT_HQ * ATT_SQ, TK_F32},
    [GEMM_D] = {"tk_gemm d", GEMM_M * GEMM_N, TK_BF16},
    [RMS_WS] = {"tk_rmsnorm_bwd workspace", 0, TK_F32},
    [LN_WS] = {"tk_layernorm_bwd workspace", 0, TK_F32},
};

typedef struct workload {
    int device;
    void *dev[BUF_COUNT];
    size_t bytes[BUF_COUNT];
} workload;

static tk_norm_params norm_params(void) {
    tk_norm_params p = TK_NORM_PARAMS_INIT;
    p.rows = NORM_ROWS;
    p.cols = NORM_COLS;
    p.eps = 1e-5f;
    return p;
}

static void set_device(int device) {
    const cudaError_t e = cudaSetDevice(device);
    cr_assert_eq(e, cudaSuccess, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
}

static void workload_new(workload *w, int device) {
    set_device(device);
    w->device = device;
    const tk_norm_params p = norm_params();
    for (int i = 0; i < BUF_COUNT; i++)
        w->bytes[i] = (size_t)BUFS[i].elems * tk_test_dtype_size(BUFS[i].dtype);
    cr_assert_eq(tk_norm_bwd_workspace_size(&p, TK_NORM_RMS, &w->bytes[RMS_WS]), TK_SUCCESS, "%s", tk_last_error());
    cr_assert_eq(tk_norm_bwd_workspace_size(&p, TK_NORM_LAYER, &w->bytes[LN_WS]), TK_SUCCESS, "%s", tk_last_error());
    for (int i = 0; i < BUF_COUNT; i++)
        w->dev[i] = tk_dev_alloc(w->bytes[i]);
}

/* Poisons the outputs and the workspaces. */
static void workload_poison(const workload *w) {
    set_device(w->device);
    for (int i = FIRST_OUTPUT; i < BUF_COUNT; i++)
        tk_dev_poison(w->dev[i], w->bytes[i]);
    tk_dev_sync();
}

/* New random inputs from `seed`, outputs poisoned; synchronised with every stream. */
static void workload_fill(const workload *w, uint64_t seed) {
    set_device(w->device);
    tk_rng rng = tk_rng_seeded(seed);
    for (int i = 0; i < FIRST_OUTPUT; i++) {
        void *host = malloc(w->bytes[i]);
        cr_assert(host != NULL);
        tk_fill_uniform(&rng, BUFS[i].dtype, host, BUFS[i].elems, -1.0, 1.0);
        tk_to_dev(w->dev[i], host, w->bytes[i]);
        free(host);
    }
    workload_poison(w);
}

/* Host copies of every output, one after the other (caller frees). */
static unsigned char *workload_outputs(const workload *w) {
    set_device(w->device);
    size_t total = 0;
    for (int i = FIRST_OUTPUT; i < FIRST_SCRATCH; i++)
        total += w->bytes[i];
    unsigned char *host = malloc(total), *at = host;
    cr_assert(host != NULL);
    for (int i = FIRST_OUTPUT; i < FIRST_SCRATCH; i++) {
        tk_to_host(at, w->dev[i], w->bytes[i]);
        at += w->bytes[i];
    }
    return host;
}

static void workload_free(workload *w) {
    set_device(w->device);
    for (int i = 0; i < BUF_COUNT; i++)
        tk_dev_free(w->dev[i]);
}

/* Asserts two sets of outputs (workload_outputs) equal bit for bit, naming the first output
 * that differs. */
static void expect_same_outputs(const workload *w, const unsigned char *got, const unsigned char *want,
                                const char *what) {
    size_t at = 0;
    for (int i = FIRST_OUTPUT; i < FIRST_SCRATCH; i++) {
        if (memcmp(got + at, want + at, w->bytes[i]) != 0) {
            size_t b = 0;
            while (got[at + b] == want[at + b])
                b++;
            cr_assert_fail("%s: %s differs first at byte %zu of %zu", what, BUFS[i].name, b, w->bytes[i]);
        }
        at += w->bytes[i];
    }
}

/* Every launching entry point once, on `stream`, on the current device. Returns the first
 * failure's status, with the call and tk_last_error() in `failed`. No CUDA call but the
 * library's: the threads and the capture run it. */
static tk_status run_sequence(const workload *w, tk_stream_t stream, char *failed, size_t size) {
#define STEP(call)                                                                               \
    do {                                                                                         \
        const tk_status st_ = (call);                                                            \
        if (st_ != TK_SUCCESS) {                                                                 \
            snprintf(failed, size, "%s: %s", #call, tk_last_error());                            \
            return st_;                                                                          \
        }                                                                                        \
    } while (0)
    void *const *b = w->dev;
    STEP(tk_activation_fwd(TK_ACT_GELU_TANH, TK_BF16, b[ACT_X], b[ACT_BIAS], b[ACT_Y], ACT_ROWS, ACT_COLS, stream));
    STEP(tk_activation_bwd(TK_ACT_SILU, TK_BF16, b[ACT_DY], b[ACT_X], b[ACT_BIAS], b[ACT_DX], ACT_ROWS, ACT_COLS,
                           stream));
    STEP(tk_gelu_fwd(TK_GELU_EXACT, TK_BF16, b[ACT_X], b[GELU_Y], ACT_N, stream));
    STEP(tk_gelu_bwd(TK_GELU_TANH, TK_BF16, b[ACT_DY], b[ACT_X], b[GELU_DX], ACT_N, stream));

    tk_glu_params g = TK_GLU_PARAMS_INIT;
    g.dtype = TK_BF16;
    g.rows = GLU_ROWS;
    g.d = GLU_D;
    STEP(tk_glu_fwd(&g, b[GLU_X], b[GLU_Y], stream));
    STEP(tk_glu_bwd(&g, b[GLU_DY], b[GLU_X], b[GLU_DX], stream));

    /* The backward passes read the forward's statistics: ordered on the stream. */
    const tk_norm_params n = norm_params();
    STEP(tk_rmsnorm_fwd(&n, b[NORM_X], NULL, b[NORM_W], b[RMS_Y], b[RMS_RSTD], stream));
    STEP(tk_layernorm_fwd(&n, b[NORM_X], NULL, b[NORM_W], b[NORM_B], b[LN_Y], b[LN_MEAN], b[LN_RSTD], stream));
    STEP(tk_rmsnorm_bwd(&n, b[NORM_DY], b[NORM_X], b[NORM_W], b[RMS_RSTD], b[RMS_DX], b[RMS_DW], b[RMS_WS],
                        w->bytes[RMS_WS], stream));
    STEP(tk_layernorm_bwd(&n, b[NORM_DY], b[NORM_X], b[NORM_W], b[LN_MEAN], b[LN_RSTD], b[LN_DX], b[LN_DW],
                          b[LN_DB], b[LN_WS], w->bytes[LN_WS], stream));

    tk_softmax_params sm = TK_SOFTMAX_PARAMS_INIT;
    sm.dtype = TK_BF16;
    sm.rows = SM_ROWS;
    sm.cols = SM_COLS;
    sm.causal = 1;
    sm.causal_offset = SM_COLS - 16;
    sm.causal_period = 16;
    STEP(tk_softmax_fwd(&sm, b[SM_X], b[SM_Y], stream));
    STEP(tk_softmax_bwd(&sm, b[SM_Y], b[SM_DY], b[SM_DX], stream)); /* reads the forward's y */
    tk_softmax_params long_rows = TK_SOFTMAX_PARAMS_INIT;
    long_rows.dtype = TK_F32;
    long_rows.rows = SMP_ROWS;
    long_rows.cols = SMP_COLS;
    long_rows.log = 1;
    STEP(tk_softmax_fwd(&long_rows, b[SMP_X], b[SMP_Y], stream));

    tk_rope_params rp = TK_ROPE_PARAMS_INIT;
    rp.dtype = TK_BF16;
    rp.tokens = ROPE_T;
    rp.heads_q = ROPE_HQ;
    rp.heads_k = ROPE_HK;
    rp.head_dim = ROPE_D;
    rp.position_start = 7;
    STEP(tk_rope_fwd(&rp, b[ROPE_Q], b[ROPE_K], b[ROPE_QO], b[ROPE_KO], stream));
    STEP(tk_rope_bwd(&rp, b[ROPE_Q], b[ROPE_K], b[ROPE_DQ], b[ROPE_DK], stream));

    tk_attention_params at = TK_ATTENTION_PARAMS_INIT;
    at.dtype = TK_BF16;
    at.q = b[ATT_Q];
    at.k = b[ATT_K];
    at.v = b[ATT_V];
    at.o = b[ATT_O];
    at.batch = ATT_B;
    at.seqlen_q = ATT_SQ;
    at.seqlen_k = ATT_SK;
    at.heads_q = ATT_HQ;
    at.heads_kv = ATT_HKV;
    at.head_dim = ATT_D;
    at.causal = 1;
    at.return_lse = 1;
    at.lse = b[ATT_LSE];
    STEP(tk_attention_fwd(&at, stream));
    at.o = b[SLIDE_O];
    at.lse = b[SLIDE_LSE];
    STEP(tk_test_attention_fwd(&at, ATT_WINDOW, stream)); /* racecheck: tk_test_attention_fwd */

    tk_gemm_params gm = TK_GEMM_PARAMS_INIT;
    gm.m = GEMM_M;
    gm.n = GEMM_N;
    gm.k = GEMM_K;
    gm.a = b[GEMM_A];
    gm.lda = GEMM_K;
    gm.b = b[GEMM_B];
    gm.ldb = GEMM_K;
    gm.c = b[GEMM_C];
    gm.ldc = GEMM_N;
    gm.bias = b[GEMM_BIAS];
    gm.d = b[GEMM_D];
    gm.ldd = GEMM_N;
    gm.activation = TK_ACT_GELU_TANH;
    gm.beta = 0.5f;
    STEP(tk_gemm(&gm, stream));
#undef STEP
    return TK_SUCCESS;
}

/* Runs the sequence on the calling thread's current device and waits for it. */
static void run_and_wait(const workload *w, tk_stream_t stream, const char *what) {
    char failed[512] = "";
    const tk_status s = run_sequence(w, stream, failed, sizeof failed);
    cr_assert_eq(s, TK_SUCCESS, "%s: %s returned %s", what, failed, tk_status_string(s));
    const cudaError_t e = cudaStreamSynchronize(stream);
    cr_assert_eq(e, cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
}

/* ---------------------------------------------------------------- threads and streams ---- */

#define THREADS 4
#define THREAD_REPEATS 3

/* A thread's work; the thread records its result, the test body asserts (Criterion's asserts
 * belong to the test's own thread). */
typedef struct worker {
    const workload *w;
    tk_status status;
    char failed[512];
} worker;

static void *worker_main(void *arg) {
    worker *k = arg;
    cudaStream_t stream = NULL;
    cudaError_t e = cudaSetDevice(k->w->device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        k->status = TK_ERROR_CUDA;
        snprintf(k->failed, sizeof k->failed, "cudaSetDevice / cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
        return NULL;
    }
    for (int i = 0; i < THREAD_REPEATS && k->status == TK_SUCCESS; i++)
        k->status = run_sequence(k->w, stream, k->failed, sizeof k->failed);
    e = cudaStreamSynchronize(stream);
    if (k->status == TK_SUCCESS && e != cudaSuccess) {
        k->status = TK_ERROR_CUDA;
        snprintf(k->failed, sizeof k->failed, "cudaStreamSynchronize: %s", cudaGetErrorString(e));
    }
    cudaStreamDestroy(stream);
    return NULL;
}

/* The threads run first, so that they also meet the library's per-device state cold; the serial
 * run on the legacy default stream comes after, on the same inputs. */
Test(concurrency_gpu, threads_on_own_streams_match_serial, .timeout = 120) {
    TK_REQUIRE_GPU();
    workload w[THREADS];
    worker k[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workload_new(&w[i], 0);
        workload_fill(&w[i], 100 + (uint64_t)i);
        k[i].w = &w[i];
        k[i].status = TK_SUCCESS;
        k[i].failed[0] = '\0';
    }
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, worker_main, &k[i]), 0);
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_join(threads[i], NULL), 0);
    unsigned char *got[THREADS];
    for (int i = 0; i < THREADS; i++) {
        cr_assert_eq(k[i].status, TK_SUCCESS, "thread %d: %s returned %s", i, k[i].failed,
                     tk_status_string(k[i].status));
        got[i] = workload_outputs(&w[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        char what[64];
        snprintf(what, sizeof what, "thread %d's workload, serial", i);
        workload_poison(&w[i]);
        run_and_wait(&w[i], NULL, what);
        unsigned char *want = workload_outputs(&w[i]);
        snprintf(what, sizeof what, "thread %d on its own stream vs serial", i);
        expect_same_outputs(&w[i], got[i], want, what);
        free(want);
        free(got[i]);
        workload_free(&w[i]);
    }
}

/* ---------------------------------------------------------------------- CUDA graphs ---- */

/* Captured before any direct call (the library's first use of each kernel is inside the
 * capture), replayed twice with new inputs copied in between, each replay compared with direct
 * calls on the same inputs. */
Test(concurrency_gpu, graph_capture_and_replay_match_direct_calls, .timeout = 120) {
    TK_REQUIRE_GPU();
    workload w;
    workload_new(&w, 0);
    workload_fill(&w, 200);
    cudaStream_t stream = NULL;
    cr_assert_eq(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    cr_assert_eq(e, cudaSuccess, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
    char failed[512] = "";
    const tk_status captured = run_sequence(&w, stream, failed, sizeof failed);
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(stream, &graph);
    cr_assert_eq(captured, TK_SUCCESS, "during capture: %s returned %s", failed, tk_status_string(captured));
    cr_assert_eq(e, cudaSuccess, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cr_assert_eq(e, cudaSuccess, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
    for (int replay = 0; replay < 2; replay++) {
        workload_fill(&w, 201 + (uint64_t)replay);
        e = cudaGraphLaunch(exec, stream);
        cr_assert_eq(e, cudaSuccess, "cudaGraphLaunch: %s", cudaGetErrorString(e));
        e = cudaStreamSynchronize(stream);
        cr_assert_eq(e, cudaSuccess, "replay %d: %s", replay, cudaGetErrorString(e));
        unsigned char *got = workload_outputs(&w);
        workload_poison(&w);
        run_and_wait(&w, stream, "direct calls");
        unsigned char *want = workload_outputs(&w);
        char what[64];
        snprintf(what, sizeof what, "graph replay %d vs direct calls", replay);
        expect_same_outputs(&w, got, want, what);
        free(got);
        free(want);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    workload_free(&w);
}

/* ------------------------------------------------------------------- a second device ---- */

#define DEVICE_ROUNDS 4

/* Device 1 after device 0 has run everything (state kept for device 0 only would show here:
 * a launch with an attribute never set on device 1), then the two alternating. Each run's
 * outputs must equal that device's first; the devices' first runs must be equal too when the
 * devices are alike (same kernels chosen). */
Test(concurrency_gpu, second_device_and_alternating_devices, .timeout = 120) {
    TK_REQUIRE_GPU();
    int count = 0;
    cr_assert_eq(cudaGetDeviceCount(&count), cudaSuccess);
    if (count < 2)
        cr_skip_test("only %d CUDA device: this test needs a second one", count);
    tk_device_info info[2];
    for (int d = 0; d < 2; d++) {
        set_device(d);
        info[d] = (tk_device_info)TK_DEVICE_INFO_INIT;
        cr_assert_eq(tk_device_query(&info[d]), TK_SUCCESS, "device %d: %s", d, tk_last_error());
    }
    if (!info[1].supported)
        cr_skip_test("device 1 (compute capability %d) is not supported by this build", info[1].compute_capability);
    const bool alike = info[0].compute_capability == info[1].compute_capability &&
                       info[0].sm_count == info[1].sm_count &&
                       info[0].max_smem_per_block == info[1].max_smem_per_block;
    workload w[2];
    unsigned char *first[2];
    for (int d = 0; d < 2; d++) {
        workload_new(&w[d], d);
        workload_fill(&w[d], 300); /* the same inputs on both */
    }
    for (int d = 0; d < 2; d++) {
        char what[64];
        snprintf(what, sizeof what, "device %d, first run", d);
        set_device(d);
        run_and_wait(&w[d], NULL, what);
        first[d] = workload_outputs(&w[d]);
    }
    if (alike)
        expect_same_outputs(&w[0], first[1], first[0], "device 1 vs device 0");
    for (int round = 0; round < DEVICE_ROUNDS; round++) {
        const int d = round % 2;
        char what[64];
        snprintf(what, sizeof what, "device %d, round %d", d, round);
        workload_poison(&w[d]);
        run_and_wait(&w[d], NULL, what);
        unsigned char *again = workload_outputs(&w[d]);
        expect_same_outputs(&w[d], again, first[d], what);
        free(again);
    }
    for (int d = 0; d < 2; d++) {
        free(first[d]);
        workload_free(&w[d]);
    }
}
