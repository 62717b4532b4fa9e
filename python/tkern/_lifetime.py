"""Keeping the arrays of a call alive until the work it queued on a stream is done.

A library's allocator hands a freed block out again at once to new work on the stream it was
allocated on: correct for work on that stream, a use after free for a kernel still running on
another one (a temporary such as `tkern.gelu(x * 1.0, stream=s)`, an output or workspace
allocated on the current stream and dropped). So every array used on a stream other than its
library's current stream is kept alive past the call:

- a torch tensor through Tensor.record_stream (the caching allocator then waits for the
  stream's work before it reuses the block);
- any other array (CuPy, another DLPack or __cuda_array_interface__ producer) by holding a
  reference until a CUDA event recorded after the work completes; finished entries are released
  at the start of later calls. The events come from the CUDA runtime that libtkern itself
  links, found through libtkern's handle, so no CUDA Python package is needed; they are polled
  with the driver's cuEventQuery, which, unlike cudaEventQuery, records no "last error" (a
  pending event's cudaErrorNotReady would otherwise overwrite the caller's error state).

Under CUDA graph capture nothing is held: the arrays of a captured kernel must live as long as
the graph is replayed, which only the caller can ensure.
"""

import ctypes
import sys
import threading

from . import _lib

_SUCCESS = 0                                   # cudaSuccess, CUDA_SUCCESS
_EVENT_DISABLE_TIMING = 2                      # cudaEventDisableTiming
_CAPTURE_NONE, _CAPTURE_MODE_RELAXED = 0, 2    # cudaStreamCaptureStatusNone, ...ModeRelaxed

_v, _u = ctypes.c_void_p, ctypes.c_uint
_RUNTIME_SIGNATURES = {
    "cudaEventCreateWithFlags": [_v, _u],
    "cudaEventRecord": [_v, _v],
    "cudaEventDestroy": [_v],
    "cudaStreamIsCapturing": [_v, _v],
    "cudaStreamSynchronize": [_v],
    "cudaThreadExchangeStreamCaptureMode": [_v],
}

_lock = threading.Lock()
_runtime_fns = {}
_pending = []  # (event, references) in recording order


def runtime():
    """The CUDA runtime functions above, as libtkern links them: dlsym on libtkern's handle
    searches its dependencies, so this is the very runtime (and version) libtkern uses."""
    if not _runtime_fns:
        lib = _lib.load()
        fns = {}
        for name, argtypes in _RUNTIME_SIGNATURES.items():
            try:
                fn = lib[name]
            except AttributeError:
                raise RuntimeError(
                    f"{_lib.library_path()} does not expose the CUDA runtime's {name} (linked "
                    "with a static cudart?): tkern needs it to keep arrays that are not torch "
                    "tensors alive while a kernel on another stream uses them") from None
            fn.restype, fn.argtypes = ctypes.c_int, argtypes
            fns[name] = fn
        _runtime_fns.update(fns)
    return _runtime_fns


def _event_query():
    """The driver's cuEventQuery. libcuda is loaded by then: the runtime that recorded the
    event loaded it."""
    fns = runtime()
    if "cuEventQuery" not in fns:
        fn = ctypes.CDLL("libcuda.so.1")["cuEventQuery"]
        fn.restype, fn.argtypes = ctypes.c_int, [_v]
        fns["cuEventQuery"] = fn
    return fns["cuEventQuery"]


def torch_stream(handle, device):
    """The torch stream object of a cudaStream_t handle on `device`."""
    torch = sys.modules["torch"]
    if handle in (0, 1):  # the legacy default stream (0, or cudaStreamLegacy)
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(handle, device=device)


def keep_alive(stream, arrays):
    """Keeps `arrays` (described Arrays) alive until the work queued so far on `stream` is
    done."""
    held = []
    for a in arrays:
        if a.producer == "torch":
            a.obj.record_stream(torch_stream(stream, a.obj.device))
        else:
            held.append(a._keep)
    if held:
        _hold(stream, held)


def _hold(stream, refs):
    rt = runtime()
    status = ctypes.c_int(_CAPTURE_NONE)
    if rt["cudaStreamIsCapturing"](stream, ctypes.byref(status)) != _SUCCESS or status.value:
        return  # captured work: see the module docstring
    event = ctypes.c_void_p()
    if rt["cudaEventCreateWithFlags"](ctypes.byref(event), _EVENT_DISABLE_TIMING) == _SUCCESS:
        if rt["cudaEventRecord"](event, stream) == _SUCCESS:
            with _lock:
                _pending.append((event, refs))
            return
        rt["cudaEventDestroy"](event)
    rt["cudaStreamSynchronize"](stream)  # no event to wait for later: wait for the work now


def release_finished():
    """Drops the references whose event has completed."""
    if not _pending:
        return
    rt, query = runtime(), _event_query()
    # Event queries are among the calls a global-mode graph capture on another stream (or
    # thread) forbids; relaxed mode allows them for events outside the capture, as ours are.
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    rt["cudaThreadExchangeStreamCaptureMode"](ctypes.byref(mode))
    done = []
    try:
        with _lock:
            keep = []
            for event, refs in _pending:
                if query(event) == _SUCCESS:
                    rt["cudaEventDestroy"](event)
                    done.append(refs)
                else:  # not ready, or not knowable from here (no context, a failed device)
                    keep.append((event, refs))
            _pending[:] = keep
    finally:
        rt["cudaThreadExchangeStreamCaptureMode"](ctypes.byref(mode))
    del done  # the last references go here, outside the lock: a release runs producer code
