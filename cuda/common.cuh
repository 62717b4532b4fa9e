/*
 * Device-side helpers shared by every kernel: dtype conversion, 16-byte vector access, warp and
 * block reductions; and, through core/launch.cuh, the launch helpers of every launcher. Kept
 * small on purpose: a kernel file should read on its own with this one include.
 */
#ifndef TK_COMMON_CUH
#define TK_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "core/launch.cuh"

/* ---- dtype conversion: every kernel computes in f32 ---- */

template <typename T> __device__ __forceinline__ float tk_to_float(T v);
template <> __device__ __forceinline__ float tk_to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float tk_to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float tk_to_float<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T tk_from_float(float v);
template <> __device__ __forceinline__ float tk_from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half tk_from_float<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 tk_from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

__host__ __device__ __forceinline__ bool tk_aligned16(const void *p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

/* ---- reductions ---- */

__device__ __forceinline__ float tk_warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float tk_warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

/* Sum over the whole block, returned to every thread. `scratch` holds >= 32 floats of shared
 * memory; blockDim.x is a multiple of 32. Contains __syncthreads(): call from all threads. */
__device__ __forceinline__ float tk_block_sum(float v, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = tk_warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous reduction */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return tk_warp_sum(v);
}

__device__ __forceinline__ float tk_block_max(float v, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = tk_warp_max(v);
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : -INFINITY;
    return tk_warp_max(v);
}

/* ---- N-element packs: a 16-byte pack is one LDG.128 / STG.128; N = 1 is a plain scalar access,
 * which is what a kernel falls back to for pointers that are not 16-byte aligned. ---- */

template <typename T, int N> struct alignas(sizeof(T) * N) tk_pack {
    T v[N];
};

/* prefetch.global.L1: asks for the line holding p in this SM's L1 (and in L2) without waiting
 * and without a register: a hint, for data that a kernel reads later, behind a dependency. */
__device__ __forceinline__ void tk_prefetch_l1(const void *p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

template <typename T, int N> __device__ __forceinline__ tk_pack<T, N> tk_load_pack(const T *p) {
    if constexpr (sizeof(T) * N == 16) {
        tk_pack<T, N> r;
        *reinterpret_cast<uint4 *>(&r) = *reinterpret_cast<const uint4 *>(p);
        return r;
    } else {
        return *reinterpret_cast<const tk_pack<T, N> *>(p);
    }
}

/* The elements of a pack as f32. bf16 pairs convert per 32-bit word: the low element is the
 * word shifted left by 16 and the high one the word with its low half cleared, one instruction
 * each, where converting element by element moves the high half down first (two). */
template <typename T, int N> __device__ __forceinline__ void tk_unpack(const tk_pack<T, N> &p, float (&f)[N]) {
    if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
        const uint32_t *words = reinterpret_cast<const uint32_t *>(&p);
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            f[2 * i] = __uint_as_float(words[i] << 16);
            f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            f[i] = tk_to_float(p.v[i]);
    }
}

/* f32 values to a pack, the inverse of tk_unpack: two elements per conversion instruction for
 * 16-bit types (F2FP packs a pair), where converting element by element takes one each and then
 * a PRMT per pair to combine the halves. */
template <typename T, int Vec> __device__ __forceinline__ tk_pack<T, Vec> tk_pack_of(const float (&f)[Vec]) {
    tk_pack<T, Vec> r;
    if constexpr (Vec % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
        for (int i = 0; i < Vec / 2; i++)
            reinterpret_cast<__nv_bfloat162 *>(r.v)[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    } else if constexpr (Vec % 2 == 0 && std::is_same_v<T, __half>) {
#pragma unroll
        for (int i = 0; i < Vec / 2; i++)
            reinterpret_cast<__half2 *>(r.v)[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    } else {
#pragma unroll
        for (int e = 0; e < Vec; e++)
            r.v[e] = tk_from_float<T>(f[e]);
    }
    return r;
}

/* p points to global memory. A 16-byte pack is stored with one explicit st.global.v4: written
 * as a uint4 assignment, nvcc 13 split the stores of kernels that fill a pack element by
 * element into four 4-byte STG, whose partial writes cost L2 bandwidth (docs/kernels/activation.md). */
template <typename T, int N> __device__ __forceinline__ void tk_store_pack(T *p, const tk_pack<T, N> &v) {
    if constexpr (sizeof(T) * N == 16) {
        const uint4 w = *reinterpret_cast<const uint4 *>(&v);
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
                     : "memory");
    } else {
        *reinterpret_cast<tk_pack<T, N> *>(p) = v;
    }
}

/* Makes the compiler forget what the pack's registers hold, so that it converts the elements
 * to f32 again where they are next used instead of keeping every converted value alive across
 * a reduction: the row stays in registers as raw packs (bf16: 2 elements per register), half
 * the registers of f32 copies. Emits no instruction. */
template <typename T, int Vec> __device__ __forceinline__ void keep_packed(tk_pack<T, Vec> &p) {
    if constexpr (sizeof(p) % 4 == 0) {
        uint32_t *words = reinterpret_cast<uint32_t *>(&p);
#pragma unroll
        for (int i = 0; i < (int)(sizeof(p) / 4); i++)
            asm("" : "+r"(words[i]));
    } else {
        static_assert(sizeof(p) == 2, "packs are 16 bytes or one element");
        asm("" : "+h"(*reinterpret_cast<unsigned short *>(&p)));
    }
}

template <typename T, int Vec, int N> __device__ __forceinline__ void keep_packed(tk_pack<T, Vec> (&packs)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++)
        keep_packed(packs[i]);
}

/* The converse of keep_packed: makes the compiler forget how f32 values were computed, so that
 * it holds them in registers across a loop instead of computing them again from what they came
 * from at each use (a weight converted to f32 once, not again from its 16-bit pack every row).
 * Call it inside the loop. Emits no instruction. */
template <int N> __device__ __forceinline__ void keep_f32(float (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++)
        asm("" : "+f"(v[i]));
}

/* ---- shared-memory addresses ---- */

/* The 32-bit shared-state-space address of a pointer into shared memory, as PTX wants it. */
__device__ __forceinline__ uint32_t tk_smem_address(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#endif
