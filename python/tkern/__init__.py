"""tkern: Python binding of libtkern (hand-tuned CUDA transformer kernels) through ctypes.

Pure Python, no compiled extension. Any CUDA array works as input (torch, CuPy, or anything
with DLPack or __cuda_array_interface__); torch is never imported by this package unless the
inputs are torch tensors. Outputs are allocated through the input's own library when not
given (torch in -> torch out, CuPy in -> CuPy out), and work runs on the producer's current
stream unless stream= says otherwise.

    import torch, tkern
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    y = tkern.gelu(x, approximate="tanh")

The library is found through TKERN_LIBRARY, then the in-tree build (build/lib), then the
dynamic loader's path; see tkern.load_library. Failing calls raise tkern.TkernError.
"""

import ctypes

from . import _lib
from ._lib import LibraryNotFoundError, TkernError
from ._activation import (activation, activation_backward, gelu, gelu_backward, glu,
                         glu_backward, swiglu)
from ._attention import attention, attention_supported, sliding_window_attention
from ._attention_kvcache import attention_kvcache, attention_kvcache_supported
from ._attention_bwd import attention_backward
from ._gemm import gemm, gemm_supported
from ._norm import (layer_norm, layer_norm_backward, norm_backward_workspace_size, rms_norm,
                   rms_norm_backward)
from ._rope import rope, rope_, rope_backward
from ._softmax import log_softmax, softmax, softmax_backward

__version__ = "0.1.0"
EXPECTED_MAJOR = _lib.EXPECTED_MAJOR

__all__ = [
    "TkernError", "LibraryNotFoundError", "load_library", "library_path", "version",
    "device_query", "last_variant", "force_variant", "status_name",
    "gelu", "gelu_backward", "activation", "activation_backward", "glu", "glu_backward",
    "swiglu", "rms_norm", "rms_norm_backward", "layer_norm", "layer_norm_backward",
    "norm_backward_workspace_size", "softmax", "log_softmax", "softmax_backward", "rope",
    "rope_", "rope_backward", "attention", "sliding_window_attention", "attention_supported",
    "attention_backward", "attention_kvcache", "attention_kvcache_supported", "gemm",
    "gemm_supported",
]


def load_library():
    """Loads libtkern now (it is otherwise loaded at the first call) and returns its path.

    Tried in order: TKERN_LIBRARY (a file, or a directory holding libtkern.so.<major>; when set,
    nothing else is tried), the in-tree build ../../build/lib/libtkern.so.<major> relative to
    this package, then libtkern.so.<major> on the dynamic loader's path. Raises
    LibraryNotFoundError listing each place tried and why it failed, or ImportError when the
    library's major version is not EXPECTED_MAJOR.
    """
    _lib.load()
    return _lib.library_path()


def library_path():
    """Path (or loader name) of the loaded libtkern."""
    return _lib.library_path()


def version():
    """The loaded library's (major, minor, patch)."""
    v = _lib.version()
    return v // 10000, v // 100 % 100, v % 100


def status_name(status):
    """The name of a tk_status number, e.g. status_name(101) == "TK_ERROR_INVALID_VALUE"."""
    return _lib.status_name(status)


def device_query():
    """What libtkern knows about the calling thread's current CUDA device, as a dict: device,
    compute_capability (e.g. 900), sm_count, max_smem_per_block, l2_bytes, supported (bool).
    Raises TkernError (TK_ERROR_NO_DEVICE) without a usable device."""
    info = _lib.DeviceInfo()
    _lib.call("tk_device_query", ctypes.byref(info))
    return {name: (bool(getattr(info, name)) if name == "supported" else getattr(info, name))
            for name, _ in info._fields_ if name != "size"}


def last_variant():
    """Name of the kernel variant the calling thread's last successful call used ("" before
    any)."""
    return _lib.function("tk_last_variant")().decode()


def force_variant(op, variant):
    """Experimental, for tests and benchmarks: make this thread's calls of operation `op`
    ("activation", "glu", "norm", "softmax", "rope", "attention", "attention_kvcache", "gemm",
    and the backward ops "activation_bwd", "glu_bwd", "norm_bwd", "softmax_bwd", "rope_bwd",
    "attention_bwd", forced separately) use the kernel variant named `variant`, or automatic selection again
    with variant=None. Raises TkernError for an unknown op or variant."""
    _lib.call("tk_experimental_force_variant", op.encode(),
              None if variant is None else variant.encode())
