/* A first libtkern program: SwiGLU over a small batch, checked against the CPU.
 *
 *   cc -std=c11 activation.c $(pkg-config --cflags --libs tkern) -lcudart -o activation
 *
 * Exit status: 0 on success, 2 when there is no usable GPU (the message says why), 1 on error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>
#include <tkern.h>

int main(void) {
    enum { ROWS = 4, D = 1024 };
    tk_device_info info = TK_DEVICE_INFO_INIT;
    tk_status status = tk_device_query(&info);
    if (status != TK_SUCCESS || !info.supported) {
        fprintf(stderr, "libtkern %d: %s\n", tk_version(),
                status != TK_SUCCESS ? tk_last_error() : "this GPU is older than sm_80");
        return 2;
    }
    printf("device %d: compute capability %d.%d, %d SMs\n", info.device, info.compute_capability / 100,
           info.compute_capability / 10 % 10, info.sm_count);

    /* x holds [gate | up] per row, f32 */
    static float x[ROWS * 2 * D], y[ROWS * D];
    for (int i = 0; i < ROWS * 2 * D; i++)
        x[i] = sinf(0.01f * (float)i) * 3.0f;
    float *dx, *dy;
    if (cudaMalloc((void **)&dx, sizeof x) != cudaSuccess || cudaMalloc((void **)&dy, sizeof y) != cudaSuccess)
        return 1;
    cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);

    tk_glu_params p = TK_GLU_PARAMS_INIT;
    p.kind = TK_GLU_SWIGLU;
    p.dtype = TK_F32;
    p.rows = ROWS;
    p.d = D;
    status = tk_glu_fwd(&p, dx, dy, NULL);
    if (status != TK_SUCCESS) {
        fprintf(stderr, "tk_glu_fwd: %s: %s\n", tk_status_string(status), tk_last_error());
        return 1;
    }
    cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost);

    double max_err = 0;
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < D; j++) {
            double g = x[r * 2 * D + j], u = x[r * 2 * D + D + j];
            double ref = g / (1.0 + exp(-g)) * u;
            max_err = fmax(max_err, fabs(y[r * D + j] - ref));
        }
    printf("swiglu %dx%d on the GPU (variant %s): max abs error vs CPU %.2e\n", ROWS, D, tk_last_variant(), max_err);
    cudaFree(dx);
    cudaFree(dy);
    return max_err < 1e-4 ? 0 : 1;
}
