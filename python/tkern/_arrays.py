"""CUDA arrays from any library, without importing one: DLPack first, then
__cuda_array_interface__; output allocation and streams through the input's own library.

An Array is a checked description of one argument (pointer, shape, element strides, dtype,
device) that keeps its producer's memory alive while a call uses it. Call gathers the arguments
of one libtkern call, the stream and the device, and runs the C function.

Plain torch tensors (exactly torch.Tensor or nn.Parameter, strided, on a CUDA device, of a dtype
libtkern names) take a fast path: data_ptr(), shape, stride() and the device index are read
directly, which describes them exactly as DLPack would at a fraction of the cost (the per-call
cost is what a decode step of small calls pays); everything else, subclasses included, goes
through DLPack or __cuda_array_interface__.
"""

import contextlib
import ctypes
import importlib
import math
import operator
import sys

from . import _lib, _lifetime

FLOATS = ("float32", "float16", "bfloat16")
HALVES = ("float16", "bfloat16")

# DLPack (dlpack.h): device types and the (type code, bits) of the dtypes we name.
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13
_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
                 8: "kDLMetal", 10: "kDLROCM", 13: "kDLCUDAManaged", 14: "kDLOneAPI"}
_DL_DTYPES = {(2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16", (2, 64): "float64",
              (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
              (1, 8): "uint8", (6, 8): "bool"}
# __cuda_array_interface__ typestr (without byte order) -> dtype.
_CAI_DTYPES = {"f4": "float32", "f2": "float16", "f8": "float64", "i1": "int8", "i2": "int16",
               "i4": "int32", "i8": "int64", "u1": "uint8", "b1": "bool"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "int16": 2,
            "int32": 4, "int64": 8, "uint8": 1, "bool": 1}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def producer(obj):
    """The top-level module of obj's type: "torch", "cupy", "numpy", ..."""
    return type(obj).__module__.partition(".")[0]


class Array:
    """One checked array argument: ptr (data + byte offset), shape, strides in elements, dtype
    name, device, and the objects that keep its memory alive."""

    __slots__ = ("obj", "name", "ptr", "shape", "strides", "dtype", "device_type", "device_id",
                 "producer", "_keep")

    @property
    def itemsize(self):
        return ITEMSIZE[self.dtype]

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def is_contiguous(self):
        """Row-major dense (strides of size-1 dimensions do not matter)."""
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def describe(self):
        return f"shape {self.shape}, strides {self.strides} (elements), dtype {self.dtype}"

    # ---- checks, each raising with the argument's name ----
    def check_dtype(self, accepted):
        if self.dtype not in accepted:
            raise TypeError(f"argument '{self.name}' has dtype {self.dtype}; accepted: "
                            f"{', '.join(accepted)}")
        return self

    def check_contiguous(self):
        if not self.is_contiguous():
            raise ValueError(f"argument '{self.name}' must be contiguous (row-major dense), but "
                             f"has {self.describe()}; pass a contiguous copy")
        return self

    def check_shape(self, shape):
        if tuple(self.shape) != tuple(shape):
            raise ValueError(f"argument '{self.name}' has shape {self.shape}, expected "
                             f"{tuple(shape)}")
        return self

    def check_ndim(self, ndims, meaning):
        if self.ndim not in ndims:
            raise ValueError(f"argument '{self.name}' must be {meaning}, but has shape "
                             f"{self.shape}")
        return self

    def rows(self):
        """(rows, cols, row_stride) of this array seen as a matrix of its last dimension, the
        leading dimensions collapsed; raises when they cannot be (or the last dimension is not
        contiguous)."""
        if self.ndim == 0:
            return 1, 1, 1
        cols = self.shape[-1]
        if cols != 1 and self.strides[-1] != 1:
            raise ValueError(f"argument '{self.name}': the last dimension must be contiguous "
                             f"(stride 1), but it has {self.describe()}")
        return self.collapse(self.ndim - 1, cols)

    def collapse(self, end, inner_extent):
        """(count, inner, stride) for dimensions [0, end) collapsed into one whose stride is
        `stride`; inner is inner_extent (what one step of the collapsed dimension spans)."""
        count, stride, expected = 1, None, None
        for i in reversed(range(end)):
            size, st = self.shape[i], self.strides[i]
            count *= size
            if size == 1:
                continue
            if st <= 0:
                raise ValueError(f"argument '{self.name}' has a zero or negative stride (a "
                                 f"broadcast or reversed view): {self.describe()}; pass a "
                                 "contiguous copy")
            if stride is None:
                stride = st
            elif st != expected:
                raise ValueError(f"argument '{self.name}': its leading dimensions cannot be "
                                 f"collapsed into one (a layout libtkern cannot address): "
                                 f"{self.describe()}; pass a contiguous copy")
            expected = st * size
        return count, inner_extent, inner_extent if stride is None else stride


def _dlpack_capsule(obj, name, stream_arg):
    try:
        return obj.__dlpack__() if stream_arg is None else obj.__dlpack__(stream=stream_arg)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise TypeError(f"argument '{name}': its __dlpack__() failed: {e}") from e


def _from_dlpack(obj, name, stream_arg):
    capsule = _dlpack_capsule(obj, name, stream_arg)
    if not _capsule_is_valid(capsule, b"dltensor"):
        raise TypeError(f"argument '{name}': __dlpack__() did not return an unused 'dltensor' "
                        "capsule")
    managed = _DLManagedTensor.from_address(_capsule_get_pointer(capsule, b"dltensor"))
    t = managed.dl_tensor
    a = Array()
    a.obj, a.name = obj, name
    a.device_type, a.device_id = t.device.device_type, t.device.device_id
    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in _DL_DTYPES:
        raise TypeError(f"argument '{name}' has a DLPack dtype (code {t.dtype.code}, "
                        f"{t.dtype.bits} bits, {t.dtype.lanes} lanes) that libtkern has no use for")
    a.dtype = _DL_DTYPES[key]
    a.shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        a.strides = tuple(t.strides[i] for i in range(t.ndim))
    else:
        a.strides = _dense_strides(a.shape)
    a.ptr = (t.data or 0) + t.byte_offset
    # The capsule's destructor (the producer's) frees the DLManagedTensor, and with it the
    # reference to the producer's memory, when this Array is dropped.
    a._keep = (capsule, obj)
    return a


def _from_cai(obj, name, cai):
    a = Array()
    a.obj, a.name = obj, name
    a.device_type, a.device_id = _KDL_CUDA, None
    typestr = cai.get("typestr", "")
    kind = typestr[1:]
    if typestr[:1] == ">" or kind not in _CAI_DTYPES:
        extra = (" (bfloat16 has no standard __cuda_array_interface__ typestr: pass an array "
                 "that supports DLPack, __dlpack__)") if kind.startswith("V") else ""
        raise TypeError(f"argument '{name}' has __cuda_array_interface__ typestr "
                        f"{typestr!r}, which libtkern does not accept{extra}")
    a.dtype = _CAI_DTYPES[kind]
    a.shape = tuple(int(s) for s in cai["shape"])
    strides = cai.get("strides")
    if strides is None:
        a.strides = _dense_strides(a.shape)
    else:
        if any(s % a.itemsize for s in strides):
            raise ValueError(f"argument '{name}' has byte strides {tuple(strides)} that are not "
                             f"multiples of its element size {a.itemsize}")
        a.strides = tuple(int(s) // a.itemsize for s in strides)
    a.ptr = int(cai["data"][0] or 0)
    a._keep = (obj,)
    return a


def _dense_strides(shape):
    """Row-major strides (elements) of `shape` as torch, NumPy and CuPy lay it out: a dimension of
    size 0 steps as one of size 1."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def as_array(obj, name, stream_arg=None):
    """Describes obj (a CUDA array from any library) as an Array named `name`.

    DLPack (__dlpack_device__ / __dlpack__) is used when obj has it, else
    __cuda_array_interface__. stream_arg is what __dlpack__ receives as `stream` (None: the
    producer's own default; -1, no synchronisation, for torch and CuPy, whose current stream is
    then the one we run on). Raises TypeError naming the argument for anything that is not CUDA
    device memory.
    """
    if obj is None:
        raise TypeError(f"argument '{name}' is None; a CUDA array is needed")
    lib = producer(obj)
    if lib == "torch" and getattr(obj, "is_nested", False):
        raise _nested_error(obj, name)  # its __dlpack__ fails inside torch, or exports no layout
    if getattr(obj, "requires_grad", False) and hasattr(obj, "detach"):
        obj = obj.detach()  # neither DLPack nor the CUDA array interface export autograd leaves
    if hasattr(obj, "__dlpack_device__") and hasattr(obj, "__dlpack__"):
        device_type, _ = obj.__dlpack_device__()
        if int(device_type) not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
            raise TypeError(
                f"argument '{name}' ({type(obj).__module__}.{type(obj).__qualname__}) is on "
                f"DLPack device {_DEVICE_NAMES.get(int(device_type), int(device_type))}; "
                "libtkern needs CUDA device memory (kDLCUDA)")
        if stream_arg is None and lib in ("torch", "cupy"):
            stream_arg = -1  # we run on this library's current stream: nothing to order
        a = _from_dlpack(obj, name, stream_arg)
    elif hasattr(obj, "__cuda_array_interface__"):
        a = _from_cai(obj, name, obj.__cuda_array_interface__)
    else:
        raise TypeError(
            f"argument '{name}' ({type(obj).__module__}.{type(obj).__qualname__}) is not a CUDA "
            "array: it has neither __dlpack__ nor __cuda_array_interface__")
    _check_strides(a)
    a.producer = lib
    return a


def _nested_error(obj, name):
    return TypeError(
        f"argument '{name}' ({type(obj).__module__}.{type(obj).__qualname__}) is a nested "
        "tensor (torch.nested), which has no single shape and strides; libtkern needs a strided "
        "array: pass its components (unbind()) or a padded copy "
        "(torch.nested.to_padded_tensor)")


def _unit_strides(shape, strides):
    """strides with dimensions of size 0 or 1 given the stride 1: no element is ever reached
    through them, and producers differ (torch's DLPack export normalises them in some versions,
    not in others), so a tensor is passed to libtkern the same way whichever path described it."""
    if 1 in shape or 0 in shape:
        return tuple([st if size > 1 else 1 for size, st in zip(shape, strides)])
    return strides


def _check_strides(a):
    """Normalises a's strides (_unit_strides) and refuses a stride no allocation can span."""
    shape = a.shape
    if not shape:
        return
    a.strides = strides = _unit_strides(shape, a.strides)
    if max(strides) * max(shape) < 1 << 62 and min(strides) * max(shape) > -1 << 62:
        return  # no dimension can reach the bound below: skip the per-dimension loop
    for size, stride in zip(shape, strides):
        # Seen with CuPy 14: a reversed view's DLPack strides arrive as an unsigned byte stride
        # divided by the item size (2**62 - 4096 for -4096 float32 elements). No allocation
        # spans that; refuse rather than hand the kernel a garbage layout.
        if size > 1 and abs(stride) * (size - 1) >= 1 << 62:
            raise ValueError(f"argument '{a.name}' has stride {stride} in a dimension of size "
                             f"{size}, which no CUDA allocation can span (a reversed view whose "
                             "producer exported its strides wrongly?); pass a contiguous copy")


class _Torch:
    """What the fast path needs from torch, looked up once torch has been imported (by the
    caller: tkern never imports it). stream(device_index) is the raw current stream of a device
    (the cheap internal behind torch.cuda.current_stream(d).cuda_stream), device() the current
    device; both are read on every call, never cached, since `with torch.cuda.stream(s)` and
    torch.cuda.set_device change them."""

    def __init__(self, torch):
        self.types = (torch.Tensor, torch.nn.Parameter)
        self.strided = torch.strided
        self.dtypes = {getattr(torch, n): n for n in ITEMSIZE}
        self.torch_dtypes = {n: t for t, n in self.dtypes.items()}
        self.empty_like = torch.empty_like
        self.empty_strided = torch.empty_strided
        self.stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda device: torch.cuda.current_stream(device).cuda_stream)
        self.device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


_torch_state = [None]


def _torch():
    """The _Torch tables, or None while torch is not imported."""
    t = _torch_state[0]
    if t is None and "torch" in sys.modules:
        t = _torch_state[0] = _Torch(sys.modules["torch"])
    return t


def plain_torch(obj):
    """(tables, dtype name, device index) when obj takes the fast path: exactly a torch.Tensor or
    nn.Parameter, strided, on a CUDA device, of a dtype in the table, without the negative bit
    (which DLPack refuses to export); else None."""
    t = _torch()
    if t is None:
        return None
    tp = type(obj)
    if tp is not t.types[0] and tp is not t.types[1]:
        return None
    dtype = t.dtypes.get(obj.dtype)
    if dtype is None or not obj.is_cuda or obj.layout is not t.strided or obj.is_neg():
        return None
    return t, dtype, obj.get_device()


def _from_torch(obj, name, dtype, device_index):
    """The Array of a plain torch tensor (see plain_torch): what DLPack would describe. The tensor
    itself is kept, so its memory lives as long as the Array. torch checks every view against
    its storage's bounds, so its strides need only _unit_strides, not _check_strides."""
    a = Array()
    a.obj = obj
    a.name = name
    a.producer = "torch"
    a.device_type = _KDL_CUDA
    a.device_id = device_index
    a.dtype = dtype
    try:
        a.shape = shape = tuple(obj.shape)
    except RuntimeError:
        # A nested tensor of strided layout passes plain_torch's checks (its type is
        # torch.Tensor); it is told apart here, where that costs a plain tensor nothing.
        if obj.is_nested:
            raise _nested_error(obj, name) from None
        raise
    a.strides = _unit_strides(shape, obj.stride())
    a.ptr = obj.data_ptr()
    a._keep = (obj,)
    return a


def allocator(tables, ref, shape, dtype):
    """The function that allocates an output of `shape` and dtype name `dtype` for plain torch
    tensor ref (new(ref)), on ref's device whatever the current one is: empty_like when that is
    what it describes (a contiguous ref of that shape and dtype; the cheapest call), else
    empty_strided with torch's contiguous strides on ref's device (what new_empty makes, at
    about two thirds of its cost). The choice depends on ref's shape, strides, dtype and device
    alone, so a replay (Lane), whose key holds them, makes it once, when its plan is stored."""
    torch_dtype = tables.torch_dtypes[dtype]
    if ref.dtype is torch_dtype and ref.shape == shape and ref.is_contiguous():
        return tables.empty_like
    shape, device, empty_strided = tuple(shape), ref.device, tables.empty_strided
    strides = _dense_strides(shape)
    return lambda like: empty_strided(shape, strides, dtype=torch_dtype, device=device)


def torch_output(tables, ref, shape, dtype):
    """A new dense tensor for plain torch tensor ref (see allocator)."""
    return allocator(tables, ref, shape, dtype)(ref)


def current_stream(obj):
    """The current stream (cudaStream_t as int) of obj's library for torch tensors and CuPy
    arrays; None for any other producer, which has no such notion."""
    lib = producer(obj)
    if lib == "torch" and getattr(getattr(obj, "device", None), "type", None) == "cuda":
        return _torch().stream(obj.get_device())
    if lib == "cupy":
        return sys.modules["cupy"].cuda.get_current_stream().ptr
    return None


def stream_handle(stream, ref):
    """The cudaStream_t (as int) to run on: `stream` when given (an int handle, or an object
    with .cuda_stream (torch) or .ptr (CuPy)), else the current stream of ref's library, else
    the stream named by ref's __cuda_array_interface__, else 0 (the legacy default stream)."""
    if stream is not None:
        if isinstance(stream, bool):
            raise TypeError("argument 'stream' must be a stream handle (int) or a stream object")
        if isinstance(stream, int):
            return _lib.checked_int(stream, ctypes.c_void_p, "argument 'stream'")
        if isinstance(stream, ctypes.c_void_p):
            return stream.value or 0
        for attr in ("cuda_stream", "ptr", "handle"):
            value = getattr(stream, attr, None)
            if isinstance(value, int):
                return _lib.checked_int(value, ctypes.c_void_p, "argument 'stream'")
        raise TypeError(f"argument 'stream' ({type(stream).__qualname__}) is neither an int "
                        "handle nor an object with .cuda_stream or .ptr")
    current = current_stream(ref)
    if current is not None:
        return current
    if not hasattr(ref, "__dlpack__"):
        cai = getattr(ref, "__cuda_array_interface__", None)
        if isinstance(cai, dict) and cai.get("stream"):
            return int(cai["stream"])
    return 0


def _object_device_context(obj):
    """device_context for an object not yet described (torch tensors only)."""
    device = getattr(obj, "device", None)
    if producer(obj) == "torch" and getattr(device, "type", None) == "cuda":
        return sys.modules["torch"].cuda.device(device)
    return contextlib.nullcontext()


def device_context(a):
    """A context that makes a's device the current one through a's own library (the library
    runs on the calling thread's current device)."""
    if a.device_id is None:
        return contextlib.nullcontext()
    if a.producer == "torch":
        return sys.modules["torch"].cuda.device(a.device_id)
    if a.producer == "cupy":
        return sys.modules["cupy"].cuda.Device(a.device_id)
    return contextlib.nullcontext()


def empty(like, shape, dtype, name):
    """A new dense array of `shape` and `dtype` from the library of Array `like`, on its device.
    The output argument's name is used in errors."""
    shape = tuple(int(s) for s in shape)
    if like.producer == "torch":
        torch = importlib.import_module("torch")
        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.obj.device)
    if like.producer == "cupy":
        cupy = importlib.import_module("cupy")
        if dtype == "bfloat16":
            raise TypeError(f"cannot allocate '{name}': CuPy has no bfloat16 dtype; pass "
                            f"'{name}' explicitly")
        with cupy.cuda.Device(like.device_id):
            return cupy.empty(shape, dtype=dtype)
    raise TypeError(
        f"cannot allocate '{name}': argument '{like.name}' is a {type(like.obj).__module__}."
        f"{type(like.obj).__qualname__}, and tkern allocates only torch tensors and CuPy arrays; "
        f"pass '{name}' explicitly")


def enum(table, value, name):
    """An enum argument: a name from `table` (case-insensitive) or a raw int, which libtkern
    itself validates once it is known to fit the C int."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _lib.checked_int(value, ctypes.c_int, f"argument '{name}'")
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    raise ValueError(f"argument '{name}' = {value!r}; accepted: {', '.join(map(repr, table))}")


class Call:
    """The arguments of one libtkern call.

    Call(stream, x=x, out=out, ...) resolves the stream (`stream`, else the current stream of
    the first array's library), describes every array that is not None and checks they share
    a device. An array whose library's current stream is not that stream (any array with an
    explicit stream, except those whose library's current stream it is; with an implicit one,
    a torch tensor next to CuPy arrays or the reverse) is a foreign one: its producer is asked
    through DLPack to order its pending work before ours, and it is kept alive until our work
    is done (see _lifetime).
    """

    def __init__(self, stream, **objs):
        present = [(k, v) for k, v in objs.items() if v is not None]
        if not present:
            raise TypeError(f"argument '{next(iter(objs))}' is None; a CUDA array is needed")
        ref_name, ref = present[0]
        self.explicit_stream = stream is not None
        self._ref_obj = ref
        self._plain_ref = plain = plain_torch(ref)
        self._streams = {}  # device index -> torch's current stream there, read once per call
        if plain is not None and stream is None:
            self.stream = self._streams[plain[2]] = plain[0].stream(plain[2])
        else:
            self.stream = stream_handle(stream, ref)
        self.arrays = {}
        self._foreign = []
        for k, v in present:
            self._describe(k, v, plain if v is ref else plain_torch(v))
        self.ref = ref_array = self.arrays[ref_name]
        for a in self.arrays.values():
            if a.device_id != ref_array.device_id:
                self._check_device(a)

    def _describe(self, name, obj, plain):
        if plain is not None:
            tables, dtype, device = plain
            current = self._streams.get(device)
            if current is None:
                current = self._streams[device] = tables.stream(device)
        else:
            current = current_stream(obj)
        if current is None and not self.explicit_stream:
            current = self.stream  # no library stream to go by: ours is the one it names
        foreign = current != self.stream
        if plain is not None and not foreign:
            a = _from_torch(obj, name, dtype, device)
        else:
            # Not foreign: nothing to order (see as_array). Foreign: DLPack's stream convention
            # (1 is the legacy default stream, 0 is not valid). torch exports a tensor through
            # DLPack only while its device is the current one.
            with _object_device_context(self._ref_obj):
                a = as_array(obj, name, (self.stream or 1) if foreign else None)
            if foreign:
                self._foreign.append(a)
        self.arrays[name] = a
        return a

    def _check_device(self, a):
        if (a.device_id is not None and self.ref.device_id is not None
                and a.device_id != self.ref.device_id):
            raise ValueError(f"argument '{a.name}' is on CUDA device {a.device_id} but "
                             f"'{self.ref.name}' is on device {self.ref.device_id}")

    def __getitem__(self, name):
        return self.arrays[name]

    def get(self, name):
        return self.arrays.get(name)

    def output(self, name, obj, shape, dtype):
        """The output `name`: obj checked for shape, dtype, device and density, or (obj None)
        a new array from the reference input's library. Returns (object, Array)."""
        if obj is None and self._plain_ref is not None:
            plain = self._plain_ref
            obj = torch_output(plain[0], self.ref.obj, tuple(shape), dtype)
            return obj, self._describe(name, obj, (plain[0], dtype, plain[2]))
        with device_context(self.ref):
            if obj is None:
                obj = empty(self.ref, shape, dtype, name)
                a = self._describe(name, obj, plain_torch(obj))
            else:
                a = self.arrays.get(name) or self._describe(name, obj, plain_torch(obj))
                a.check_shape(shape).check_dtype((dtype,)).check_contiguous()
        self._check_device(a)
        return obj, a

    def run(self, fn, *args):
        """Calls the C entry point `fn` on the reference input's device; args are passed as
        they are (the stream must be among them). Raises TkernError on failure."""
        plain = self._plain_ref
        if plain is not None and plain[0].device() == plain[2]:
            self._launch(fn, args)  # already on the reference's device: no switch to undo
        else:
            with device_context(self.ref):
                self._launch(fn, args)

    def _launch(self, fn, args):
        _lifetime.release_finished()
        try:
            _lib.call(fn, *args)
        except _lib.TkernError as e:
            # A launch may have been queued before a CUDA failure; nothing was otherwise.
            if e.status_name == "TK_ERROR_CUDA" and self._foreign:
                _lifetime.keep_alive(self.stream, self._foreign)
            raise
        if self._foreign:
            _lifetime.keep_alive(self.stream, self._foreign)


def ptr(a):
    """The device pointer of an optional Array (0 for None)."""
    return 0 if a is None else a.ptr


_KEY_SCALARS = frozenset((int, bool, float, str, type(None)))
_PLAIN_INDICES = (int, type(None))


def _scalars_key(scalars):
    """The scalar arguments as a key, or None when one is not a plain immutable value (an int,
    bool, float, str, None, or a tuple of ints and None): an object such as a 0-d tensor could
    change between calls. The key holds each value's type (True, 1 and 1.0 are equal values)
    and each float's sign (alpha=-0.0 is not alpha=0.0)."""
    types = tuple([type(v) for v in scalars])  # faster than map() for a few values
    if not _KEY_SCALARS.issuperset(types) and not all(
            t in _KEY_SCALARS or (t is tuple and all(type(e) in _PLAIN_INDICES for e in v))
            for v, t in zip(scalars, types)):
        return None
    if float in types:
        return types, scalars, tuple([math.copysign(1.0, v) for v in scalars if type(v) is float])
    return types, scalars


class Plans:
    """Validated call descriptions of one function: the params struct its checks produced, keyed
    on the scalar arguments and every array's shape, strides, dtype, device and library, and
    reused for a later call with that key with only the pointers changed. None of the checks
    depends on anything else (a pointer's alignment is the library's to check, at every call).
    Only a description whose checks all passed is stored: errors are never cached."""

    LIMIT = 512

    def __init__(self):
        self._plans = {}

    @staticmethod
    def key(c, *scalars):
        """The key of Call c with these scalar arguments, or None (nothing is cached) when one is
        not a plain immutable value (see _scalars_key)."""
        values = _scalars_key(scalars)
        if values is None:
            return None
        arrays = tuple((k, a.shape, a.strides, a.dtype, a.device_id, a.producer)
                       for k, a in c.arrays.items())
        return values, arrays

    def get(self, key):
        """A copy of the params stored for key, or None."""
        p = None if key is None else self._plans.get(key)
        return None if p is None else type(p).from_buffer_copy(p)

    def put(self, key, params):
        if key is not None:
            if len(self._plans) >= self.LIMIT:
                self._plans.clear()
            self._plans[key] = type(params).from_buffer_copy(params)


class Lane:
    """The fast lane of one function: its calls on plain torch tensors, replayed.

    A call whose arrays are all plain torch tensors (see plain_torch) on the current device,
    with no output and no stream given (how a model's forward calls), is keyed on each
    tensor's dtype, shape, strides and device and on the scalar arguments (a tensor with the
    negative bit, which DLPack refuses to export, takes the full path and its error). The
    first call with a key takes the function's full path, which checks everything and then
    stores its plan under the key: what a replay passes besides this call's pointers and
    stream (the params struct, as the byref() to pass when it holds no pointer), and how it
    allocates each output (see allocator), all decided then. A later call with that key replays
    the plan: it allocates the outputs, reads the tensors' pointers and torch's current stream,
    and calls libtkern through _lib.replay (on the current device, which find() checked is the
    tensors'), which checks the pointers as on every call. No check of the full path
    depends on anything but the key (see Plans), and only plans of calls that succeeded are
    stored. Every other call takes the full path.
    """

    LIMIT = 512
    _MISS = (None, None, None)

    def __init__(self):
        self._plans = {}
        # (scalars, _scalars_key(scalars)) of the last call that had a key, or None. A model
        # passes a function the same scalar objects call after call (the defaults, its
        # literals, its config's attributes), whose key is then found by identity, much cheaper
        # than building it again. The pair is replaced whole, so a thread reads either the old
        # pair or the new one.
        self._scalars_memo = None

    def _values(self, scalars):
        """_scalars_key(scalars), from the memo when scalars are the very objects of the last
        call (is, not ==: 1, True and 1.0 are equal, and so are 0.0 and -0.0)."""
        memo = self._scalars_memo
        if (memo is not None and len(memo[0]) == len(scalars)
                and all(map(operator.is_, scalars, memo[0]))):
            return memo[1]
        values = _scalars_key(scalars)
        if values is not None:
            self._scalars_memo = (scalars, values)
        return values

    def find(self, stream, outs, tensors, scalars):
        """(plan, stream handle, key) of a call with these output arguments (the lane takes
        calls that give none), array arguments (None for an absent one) and scalar arguments:
        the stored plan and torch's current stream on a hit; (None, None, key) on a miss, key
        to be passed to put() once the full path succeeded (None when the call cannot take the
        lane). A hit is the start of a replayed call: it releases the references held for
        earlier calls whose work has finished, as the full path does (see _lifetime)."""
        t = _torch_state[0] or _torch()
        if t is None or stream is not None or outs.count(None) != len(outs):
            return self._MISS
        values = self._values(scalars)
        if values is None:
            return self._MISS
        (tensor, parameter), strided = t.types, t.strided
        # The key: the scalars, then per array slot None (absent) or its dtype, shape and
        # strides (a dtype is never None, so the slots read back unambiguously), then the device.
        key, device = [values], None
        for x in tensors:
            if x is None:
                key.append(None)
                continue
            tp = type(x)
            if ((tp is not tensor and tp is not parameter) or not x.is_cuda
                    or x.layout is not strided or x.is_neg()):
                return self._MISS
            if device is None:
                device = x.get_device()
            elif x.get_device() != device:
                return self._MISS
            try:
                key += (x.dtype, x.shape, x.stride())
            except RuntimeError:  # a nested tensor has no shape: the full path names it
                return self._MISS
        if device is None or t.device() != device:
            return self._MISS
        key.append(device)
        key = tuple(key)
        plan = self._plans.get(key)
        if plan is None:
            return None, None, key
        if _lifetime._pending:  # release_finished's own test, without its call when nothing is held
            _lifetime.release_finished()
        return plan, t.stream(device), key

    def put(self, key, plan):
        """Stores plan under key (from find; nothing is stored for None)."""
        if key is not None:
            if len(self._plans) >= self.LIMIT:
                self._plans.clear()
            self._plans[key] = plan

    @staticmethod
    def allocator(ref, shape, dtype):
        """For a plan: how a replay allocates an output of `shape` and dtype name `dtype` like
        the full path's, a function of the replay's reference tensor (see allocator)."""
        return allocator(_torch(), ref, shape, dtype)
