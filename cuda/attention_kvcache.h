/* Launcher of the KV-cache attention kernels (cuda/attention_kvcache.cu), called by
 * src/attention_kvcache.c after validation. Internal. */
#ifndef TK_CUDA_ATTENTION_KVCACHE_H
#define TK_CUDA_ATTENTION_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pairs of RoPE a head has at most (head_dim 256). */
#define TK_KVCACHE_MAX_ROPE_PAIRS 128

/* One call, resolved: strides explicit, the scale set, causal folded into window_right = 0. A
 * contiguous cache is a paged one whose page is the sequence: block_table NULL, page_size =
 * max_seqlen_k, page strides = batch strides. Every index fits in int32 except element
 * offsets, which the kernels compute in int64. */
typedef struct tk_attention_kvcache_call {
    int dtype;                    /* tk_dtype: TK_F16 or TK_BF16 */
    int head_dim;                 /* 64, 128 or 256 */
    const void *q;
    void *k, *v;                  /* written where k_new / v_new are appended */
    void *o;
    const void *k_new, *v_new;    /* NULL: nothing appended */
    float *lse;                   /* NULL: not written */
    const float *alibi_slopes;    /* NULL: no ALiBi */
    const int32_t *cu_seqlens_q;  /* NULL: every sequence has seqlen_q queries */
    const int32_t *seqlens_k;
    const int32_t *block_table;   /* NULL: sequence b's page is b */
    int64_t block_table_stride;
    int batch, seqlen_q, total_q, heads_q, heads_kv;
    int page_size, pages_per_seq, num_pages; /* capacity = pages_per_seq * page_size keys */
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3]; /* batch/page, position, head */
    int64_t k_new_stride[3], v_new_stride[3];                    /* batch, sequence, head */
    int window_left, window_right; /* -1 = unbounded */
    int chunk;                    /* chunked local attention: chunk_size, 0 = off */
    const float *sinks;           /* [heads_q] sink logits, or NULL */
    float scale;                  /* softmax scale, > 0 */
    float softcap;                /* 0 = off */
    int num_splits;               /* 1 .. 1024, or 0: the automatic plan */
    /* RoPE of q and k_new (rotary_dim 0: none), resolved: the cache's row stride explicit;
     * without a cache, each pair's inverse frequency with the scaling applied (f64) and the
     * factor on cos and sin (YaRN's; 1 otherwise). */
    int rotary_dim, rope_style;
    const float *rope_cos, *rope_sin;
    int64_t rope_cache_row_stride, rope_max_position;
    float rope_attention_factor;
    double rope_inv_freq[TK_KVCACHE_MAX_ROPE_PAIRS];
    void *workspace;              /* partial outputs and lse when the splits are > 1 */
} tk_attention_kvcache_call;

/* The query tokens of a call: total_q with cu_seqlens_q, else batch * seqlen_q. */
static inline int64_t tk_attention_kvcache_tokens(const tk_attention_kvcache_call *c) {
    return c->cu_seqlens_q ? c->total_q : (int64_t)c->batch * c->seqlen_q;
}

/* The most key ranges (splits) a sequence gets on this device: c->num_splits when set (every
 * sequence gets that many), else the bound of the automatic plan, which the kernels make per
 * sequence from the device-side lengths (about equal keys per split, at least 256). 1: no
 * merge, no workspace. */
int tk_attention_kvcache_splits(const tk_attention_kvcache_call *c, const tk_device *dev);

/* Workspace bytes for at most `splits` ranges a sequence: f32 partial outputs and lse of every
 * (token, head) and split, and each row's split count. */
size_t tk_attention_kvcache_workspace_bytes(const tk_attention_kvcache_call *c, int splits);

/* "decode_sm80": the append of k_new / v_new when given; then one CTA per (sequence, key/value
 * head, 16 query rows, key range), each warp streaming its own 16-key K/V tiles through a
 * cp.async ring and multiplying them with mma.sync; then the split merge when there are
 * splits. Any sm_80+ device. */
cudaError_t tk_attention_kvcache_launch_decode(const void *call, const tk_device *dev,
                                               cudaStream_t stream);

/* The append step of "decode_sm80" alone (k_new / v_new written into the cache at each
 * sequence's length): the first launch of every variant that appends. */
cudaError_t tk_attention_kvcache_append(const tk_attention_kvcache_call *c, const tk_device *dev,
                                        cudaStream_t stream);

/* "prefill_sm80": the append when k_new is set, then the FlashAttention-2 forward of
 * cuda/attention.cuh over the cache (one CTA per 128 positions, 64 at head dim 256, of one query
 * head), its K/V tiles read as rows of a contiguous cache or through the block table. Head dims
 * 64, 128 and 256, one split, any sm_80+ device. */
cudaError_t tk_attention_kvcache_launch_prefill(const void *call, const tk_device *dev,
                                                cudaStream_t stream);

/* The fewest queries per sequence (seqlen_q) for which "prefill_sm80" is chosen: half its query
 * tile. */
int tk_attention_kvcache_prefill_min_queries(int head_dim);

#ifdef __cplusplus
}
#endif

#endif
