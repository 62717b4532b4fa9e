/*
 * The contract between the host side (src/, C11) and the kernels' launchers (cuda/, CUDA C++).
 * Plain C: src/ includes it, and so does every cuda/<family>.h. Nothing here is public.
 *
 * Launchers never validate user input (src/ has done that); they compute a launch shape, launch
 * and return the error of their own CUDA calls (the launch's return value, cudaSuccess when all
 * went well), through the helpers of cuda/core/launch.cuh. They never read or clear the thread's
 * last error: a caller's earlier, unrelated error stays the caller's, and a launch that ran is
 * not reported as failed because of it.
 */
#ifndef TK_LAUNCH_H
#define TK_LAUNCH_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Filled once per device by src/runtime.c and passed to every launcher. */
typedef struct tk_device {
    int ordinal;
    int cc;                  /* 100 * major + 10 * minor */
    int sm_count;
    int max_smem_optin;      /* cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes */
    int smem_per_sm;         /* cudaDevAttrMaxSharedMemoryPerMultiprocessor, bytes */
    int l2_bytes;
    int max_threads_per_sm;
    int supported;           /* cc >= 800 and this binary has code that runs on it */
} tk_device;

/* Upper bound on device ordinals handled by the per-device caches. */
#define TK_MAX_DEVICES 64

#ifdef __cplusplus
}
#endif

#endif
