/* What the experiment drivers share: CHECK(call) stops the program with the file, line, call and
 * CUDA error when a runtime call fails (an experiment has nothing to recover). */
#ifndef TK_EXPERIMENT_H
#define TK_EXPERIMENT_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#endif
