/* Attention forward, head dim 80, f16 and bf16: the kernel and its launch shape are described in
 * attention.cuh. One file per head dim so that the instantiations compile in parallel. */
#include "attention.cuh"

TK_ATTENTION_DEFINE_LAUNCHER(80)
