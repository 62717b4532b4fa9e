/* What the Hopper attention kernels (attention_sm90.cu forward, attention_bwd_sm90.cu backward)
 * share: tiles of 64-column halves of the head dim, each a TMA box of 128-byte rows in the
 * 128-byte swizzle, and the tensor maps that load them. */
#ifndef TK_ATTENTION_SM90_CUH
#define TK_ATTENTION_SM90_CUH

#include "core/sm90.cuh"
#include "tkern.h"

namespace {

constexpr int HALF = 64; /* head-dim columns per 128-byte swizzled row */

/* The 4D tensor map (head dim, position, head, batch) of a [batch, seqlen, heads, head_dim]
 * tensor of dtype (f16 or bf16) with the call's strides (elements: batch, position, head), read
 * in boxes of box_rows positions x 64 head-dim columns of one head in the 128-byte swizzle; TMA
 * fills positions past seqlen with zeros. Strides of dimensions of extent 1 are never used; they
 * are given as 16 bytes, which TMA accepts. */
inline cudaError_t attn_tensor_map(CUtensorMap *map, int dtype, const void *base, int head_dim, int batch, int seqlen,
                                   int heads, const int64_t stride[3], uint32_t box_rows) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode =
        tk_driver_function<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
    if (!encode)
        return cudaErrorNotSupported;
    const CUtensorMapDataType type =
        dtype == TK_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const cuuint64_t dims[4] = {(cuuint64_t)head_dim, (cuuint64_t)seqlen, (cuuint64_t)heads, (cuuint64_t)batch};
    const cuuint64_t strides[3] = {seqlen > 1 ? (cuuint64_t)stride[1] * 2 : 16,
                                   heads > 1 ? (cuuint64_t)stride[2] * 2 : 16,
                                   batch > 1 ? (cuuint64_t)stride[0] * 2 : 16};
    const cuuint32_t box[4] = {HALF, box_rows, 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    return encode(map, type, 4, const_cast<void *>(base), dims, strides, box, element_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? cudaSuccess
               : cudaErrorInvalidValue;
}

/* TMA takes strides below 2^40 bytes: a [batch, seqlen, heads, head_dim] tensor's strides (in
 * 16-bit elements) below 2^39. */
inline bool attn_tma_strides(const int64_t stride[3]) {
    const int64_t max_stride = (int64_t)1 << 39;
    return stride[0] < max_stride && stride[1] < max_stride && stride[2] < max_stride;
}

} // namespace

#endif
