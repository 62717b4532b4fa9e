/* `make bench`: every family's benchmarks, in one table. A family adds its entry here. */
#include "bench.h"

int main(int argc, char **argv) {
    static const char *const names[] = {"activation", "norm", "softmax", "rope", "attention", "attention_masks",
                                        "attention_bwd", "attention_kvcache", "gemm"};
    static const bench_family families[] = {bench_activation, bench_norm,          bench_softmax,
                                            bench_rope,       bench_attention,     bench_attention_masks,
                                            bench_attention_bwd, bench_attention_kvcache, bench_gemm};
    return bench_main(argc, argv, names, families, (int)(sizeof families / sizeof families[0]));
}
