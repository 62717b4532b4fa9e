/* The list of operations whose variants tk_experimental_force_variant can force. Each family's
 * src/<family>.c defines its tk_op (and its "<family>_bwd" op, where it has a backward); add
 * them here when adding a family. */
#include "runtime.h"

extern const tk_op tk_op_activation, tk_op_activation_bwd, tk_op_glu, tk_op_glu_bwd, tk_op_norm,
    tk_op_norm_bwd, tk_op_softmax, tk_op_softmax_bwd, tk_op_rope, tk_op_rope_bwd, tk_op_attention,
    tk_op_attention_bwd, tk_op_attention_kvcache, tk_op_gemm;

const tk_op *const tk_all_ops[] = {
    &tk_op_activation, &tk_op_activation_bwd, &tk_op_glu, &tk_op_glu_bwd, &tk_op_norm, &tk_op_norm_bwd,
    &tk_op_softmax, &tk_op_softmax_bwd, &tk_op_rope, &tk_op_rope_bwd, &tk_op_attention, &tk_op_attention_bwd,
    &tk_op_attention_kvcache, &tk_op_gemm,
};
const int tk_all_ops_count = (int)(sizeof tk_all_ops / sizeof tk_all_ops[0]);
