/*
 * Host-side launch plumbing shared by every launcher: the launch itself, the per-device caches
 * of launch facts (shared-memory opt-in, occupancy), occupancy-derived grid sizes, and the one
 * switch from a call's tk_dtype to a kernel's element type. Host-only, header-only.
 *
 * Every helper returns the CUDA error of its own runtime call and none reads the thread's last
 * error: that would also return, and clear, an earlier unrelated error of the caller's (a failed
 * cudaMalloc is not sticky), failing a launch that ran and losing the caller's error. The
 * exception is tk_clusters_resident: a query the device refuses has already replaced such an
 * error, and the helper clears its own.
 */
#ifndef TK_CORE_LAUNCH_CUH
#define TK_CORE_LAUNCH_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <utility>

#include "../launch.h"
#include "tkern.h"

/* ---- the launch ---- */

/* The configuration of kernel<<<grid, block, smem, stream>>>, with launch attributes such as a
 * cluster dimension (`attrs` must outlive the launch call). */
inline cudaLaunchConfig_t tk_launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                           cudaLaunchAttribute *attrs = nullptr, unsigned num_attrs = 0) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = num_attrs;
    return cfg;
}

/* The launch attribute that groups a 1D grid into thread-block clusters of `blocks` blocks. */
inline cudaLaunchAttribute tk_cluster_attribute(int blocks) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = (unsigned)blocks;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    return attr;
}

/* Launches kernel(args...) with `cfg` and returns the launch's own error. */
template <typename... Params, typename... Args>
cudaError_t tk_launch(const cudaLaunchConfig_t &cfg, void (*kernel)(Params...), Args &&...args) {
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

/* kernel<<<grid, block, smem, stream>>>(args...), returning the launch's own error. */
template <typename... Params, typename... Args>
cudaError_t tk_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args &&...args) {
    return tk_launch(tk_launch_config(grid, block, smem, stream), kernel, std::forward<Args>(args)...);
}

/* ---- per-device caches ---- */

/* `Slots` ints per device, each computed on first use and 0 until then. The cells are relaxed
 * atomics: threads racing on a first use compute and store the same value, and nothing else is
 * published through a cell. Declare one as a function-local static (zero-initialised, no guard). */
template <int Slots> class tk_device_cache {
  public:
    /* Slot `slot` of `dev` into *value, from fill(int *) -> cudaError_t on first use. The value
     * filled must be non-zero; a failed fill is returned and nothing is cached. */
    template <typename Fill> cudaError_t get(const tk_device *dev, int slot, int *value, Fill &&fill) {
        std::atomic<int> &cell = cells_[dev->ordinal][slot];
        int v = cell.load(std::memory_order_relaxed);
        if (v == 0) {
            const cudaError_t err = fill(&v);
            if (err != cudaSuccess)
                return err;
            cell.store(v, std::memory_order_relaxed);
        }
        *value = v;
        return cudaSuccess;
    }

  private:
    std::atomic<int> cells_[TK_MAX_DEVICES][Slots];
};

/* ---- driver functions ---- */

/* The driver API function `name` of ABI `version` (the PFN_*_v<version> typedef of
 * cudaTypedefs.h), reached through the runtime's entry-point table so that the library does not
 * link libcuda; nullptr when the driver lacks it. Callers keep it in a function-local static. */
template <typename Fn> Fn tk_driver_function(const char *name, int version) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
        return nullptr;
    return reinterpret_cast<Fn>(fn);
}

/* ---- kernel attributes ---- */

/* Sets the driver attribute `attribute` of Kernel to `value` on the current device.
 * Through the driver's cuFuncSetAttribute, not cudaFuncSetAttribute: the runtime call resets the
 * thread's last error even when it succeeds (CUDA 13 runtime, driver 580), which would lose a
 * caller's pending error; cudaGetFuncBySymbol and the driver call leave it alone.
 * cudaErrorNotSupported without the driver function, cudaErrorInvalidValue when the driver
 * refuses the value. */
template <auto Kernel> cudaError_t tk_set_kernel_attribute(CUfunction_attribute attribute, int value) {
    static const PFN_cuFuncSetAttribute_v9000 set =
        tk_driver_function<PFN_cuFuncSetAttribute_v9000>("cuFuncSetAttribute", 9000);
    if (!set)
        return cudaErrorNotSupported;
    cudaFunction_t function;
    const cudaError_t err = cudaGetFuncBySymbol(&function, reinterpret_cast<const void *>(Kernel));
    if (err != cudaSuccess)
        return err;
    return set(reinterpret_cast<CUfunction>(function), attribute, value) == CUDA_SUCCESS ? cudaSuccess
                                                                                         : cudaErrorInvalidValue;
}

/* The virtual architecture of Kernel's code that runs on this device, __CUDA_ARCH__ / 10 of the
 * pass it was compiled in: not always the device's (an sm_87 device runs sm_86 SASS; a build
 * whose only code for an H100 is compute_80 PTX runs that). From the driver's cuFuncGetAttribute
 * (PTX_VERSION); 0 where the driver does not say. Cached per device. */
template <auto Kernel> cudaError_t tk_code_arch(const tk_device *dev, int *arch) {
    static tk_device_cache<1> cache;
    return cache.get(dev, 0, arch, [](int *v) {
        static const PFN_cuFuncGetAttribute_v2020 get =
            tk_driver_function<PFN_cuFuncGetAttribute_v2020>("cuFuncGetAttribute", 2020);
        *v = 0;
        if (!get)
            return cudaSuccess;
        cudaFunction_t function;
        const cudaError_t e = cudaGetFuncBySymbol(&function, reinterpret_cast<const void *>(Kernel));
        if (e != cudaSuccess)
            return e;
        if (get(v, CU_FUNC_ATTRIBUTE_PTX_VERSION, reinterpret_cast<CUfunction>(function)) != CUDA_SUCCESS)
            *v = 0;
        return cudaSuccess;
    });
}

/* Programmatic dependent launch: the attribute that lets Kernel be launched while the kernel
 * before it in the stream still runs (*count = 1), where Kernel's code waits for that kernel
 * (cudaGridDependencySynchronize, compiled in from sm_90), else *count = 0 (an ordinary launch).
 * The check is of the code that runs (tk_code_arch), not of the device; where the driver does
 * not say, the launch is ordinary. */
template <auto Kernel> cudaError_t tk_early_launch(const tk_device *dev, cudaLaunchAttribute *attr, unsigned *count) {
    int arch = 0;
    const cudaError_t err = tk_code_arch<Kernel>(dev, &arch);
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    *count = arch >= 90 ? 1 : 0;
    return err;
}

/* Lets Kernel use `bytes` of dynamic shared memory past the 48 KB every kernel may use. The
 * attribute belongs to the function on the current device: set once per device. */
template <auto Kernel> cudaError_t tk_opt_in_smem(const tk_device *dev, int bytes) {
    static tk_device_cache<1> opted_in;
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    int done;
    return opted_in.get(dev, 0, &done, [bytes](int *v) {
        *v = 1;
        return tk_set_kernel_attribute<Kernel>(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
    });
}

/* The most blocks a cluster of Kernel may have on this device, launched as `cfg` (block size,
 * shared memory; the query ignores its grid and cluster size): 8 is the portable limit; past it,
 * up to 16 on an H100/H200, only with the function's non-portable opt-in, which this sets (where
 * the driver refuses it, the answer is at most 8). The driver's answer also accounts for a
 * smaller device (a MIG slice). Cached per device. */
template <auto Kernel> cudaError_t tk_max_cluster_blocks(const tk_device *dev, cudaLaunchConfig_t cfg, int *blocks) {
    static tk_device_cache<1> cache;
    return cache.get(dev, 0, blocks, [&](int *v) {
        /* A driver that refuses the opt-in leaves the query at the portable limit. */
        (void)tk_set_kernel_attribute<Kernel>(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
        int size = 0;
        const cudaError_t err = cudaOccupancyMaxPotentialClusterSize(&size, Kernel, &cfg);
        *v = size > 1 ? size : 1;
        return err;
    });
}

/* Clusters of `blocks` blocks of Kernel (cfg's block size and dynamic shared memory) that are
 * resident on the device at once, 0 for none: the occupancy query, host work that a launch need
 * not repeat, kept in slot `slot` of the caller's cache (one cache per instantiation, a slot per
 * cluster and block size it queries; the cache holds the count + 1, so that 0 is kept too). A
 * query the device refuses counts as none, and its error is taken back from the runtime's last
 * error, which it would otherwise leave set for the caller of a call that then runs on another
 * variant. */
template <auto Kernel, int Slots>
cudaError_t tk_clusters_resident(const tk_device *dev, tk_device_cache<Slots> &cache, int slot, cudaLaunchConfig_t cfg,
                                 int blocks, int *clusters) {
    int count_plus_one = 1; /* a failed query: none */
    const cudaError_t err = cache.get(dev, slot, &count_plus_one, [&](int *v) {
        cudaLaunchAttribute attr = tk_cluster_attribute(blocks);
        cfg.attrs = &attr, cfg.numAttrs = 1;
        cfg.gridDim = dim3((unsigned)blocks);
        int fit = 0;
        if (cudaOccupancyMaxActiveClusters(&fit, Kernel, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            fit = 0;
        }
        *v = fit + 1;
        return cudaSuccess;
    });
    *clusters = count_plus_one - 1;
    return err;
}

/* ---- launch shape ---- */

#define TK_MAX_BLOCK_WARPS 32

/* Resident blocks per SM of `Kernel` at this block size and dynamic shared memory, from the
 * occupancy calculator, cached per device and block size (one cache per kernel instantiation).
 * Kernels whose dynamic shared memory varies from call to call must not use the cache: call
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor. */
template <auto Kernel>
cudaError_t tk_blocks_per_sm(const tk_device *dev, int threads, size_t dynamic_smem, int *blocks) {
    static tk_device_cache<TK_MAX_BLOCK_WARPS + 1> cache;
    return cache.get(dev, threads / 32, blocks, [&](int *v) {
        const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(v, Kernel, threads, dynamic_smem);
        if (*v < 1) /* a block that cannot be resident fails at its launch, with that error */
            *v = 1;
        return err;
    });
}

/* Blocks that fill every SM to its occupancy limit: one full wave. */
template <auto Kernel>
cudaError_t tk_wave_blocks(const tk_device *dev, int threads, size_t dynamic_smem, int64_t *blocks) {
    int per_sm = 0;
    const cudaError_t err = tk_blocks_per_sm<Kernel>(dev, threads, dynamic_smem, &per_sm);
    *blocks = (int64_t)per_sm * dev->sm_count;
    return err;
}

/* Launch shape of the row-chunked elementwise kernels (activation, GLU): blockIdx.x picks a
 * chunk of `threads * unroll` packs within a row, blockIdx.y a row (striding by gridDim.y only
 * past the 65535 rows a grid can hold). The chunk count is chosen first, then the block size is
 * trimmed so that the chunks cover the row with less than one warp of idle threads (a 3584-wide
 * bf16 row is 448 packs: one chunk of 224 threads x 2, not a 256 x 2 chunk with 32 idle
 * threads).
 * Every chunk is its own block, not a persistent grid striding over the tensor: each thread
 * loads its packs, computes and stores once, and the block scheduler keeps every SM full of
 * blocks in all three phases (docs/kernels/activation.md has the measurements). */
typedef struct tk_row_chunks {
    dim3 grid;
    int threads;
} tk_row_chunks;

static inline tk_row_chunks tk_row_chunk_shape(int64_t rows, int64_t packs_per_row, int unroll, int max_threads) {
    const int64_t per_chunk_max = (int64_t)max_threads * unroll;
    int64_t chunks = (packs_per_row + per_chunk_max - 1) / per_chunk_max;
    if (chunks < 1)
        chunks = 1;
    const int64_t threads_needed = (packs_per_row + chunks * unroll - 1) / (chunks * unroll);
    int threads = (int)((threads_needed + 31) / 32 * 32);
    if (threads < 32)
        threads = 32;
    int64_t row_blocks = rows < 65535 ? rows : 65535;
    if (row_blocks < 1)
        row_blocks = 1;
    tk_row_chunks shape = {dim3((unsigned)chunks, (unsigned)row_blocks, 1), threads};
    return shape;
}

/* ---- dtype to element type ---- */

/* An element type passed as a value to the functions given to tk_dispatch_dtype:
 * `using T = typename decltype(type)::type;`. */
template <typename T> struct tk_type {
    using type = T;
};

/* Elements per access of a kernel over T: a 16-byte pack (Wide) or one element. */
template <typename T> constexpr int tk_pack_width(bool wide) { return wide ? (int)(16 / sizeof(T)) : 1; }

/* Returns f(tk_type<T>{}) for the 16-bit element type T of `dtype` (tensor-core kernels). */
template <typename F> cudaError_t tk_dispatch_dtype16(int dtype, F &&f) {
    switch (dtype) {
    case TK_F16: return f(tk_type<__half>{});
    case TK_BF16: return f(tk_type<__nv_bfloat16>{});
    }
    return cudaErrorInvalidValue; /* src/ admits no other dtype */
}

/* Returns f(tk_type<T>{}) for the element type T of `dtype`: float, __half or __nv_bfloat16. */
template <typename F> cudaError_t tk_dispatch_dtype(int dtype, F &&f) {
    if (dtype == TK_F32)
        return f(tk_type<float>{});
    return tk_dispatch_dtype16(dtype, f);
}

#endif
