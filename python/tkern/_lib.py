"""Loading libtkern and declaring its C ABI to ctypes.

Everything that mirrors include/tkern.h lives here: the table of entry-point signatures, the
enum values and the option structs. python/tests/test_host.py parses the header and checks
this file against it, so a change to the header that is not mirrored here fails a test.

Wrapping a new entry point is: one line in SIGNATURES (and a Structure below if it takes a new
params struct), then a small Python function in an ops module that calls call("tk_...", ...).
"""

import ctypes
import operator
import os
import threading

# The major version of the C ABI this binding was written for (TK_VERSION_MAJOR).
EXPECTED_MAJOR = 0

_i32 = ctypes.c_int
_i64 = ctypes.c_int64
_f32 = ctypes.c_float
_size = ctypes.c_size_t
_ptr = ctypes.c_void_p      # any pointer, the stream included
_str = ctypes.c_char_p      # const char *
_strp = ctypes.POINTER(ctypes.c_char_p)  # const char **
_status = ctypes.c_int      # tk_status and every other enum travel as int

# name -> (restype, argtypes). One line per TK_API function in include/tkern.h.
SIGNATURES = {
    "tk_version": (_i32, []),
    "tk_status_string": (_str, [_status]),
    "tk_last_error": (_str, []),
    "tk_device_query": (_status, [_ptr]),
    "tk_last_variant": (_str, []),
    "tk_experimental_force_variant": (_status, [_str, _str]),
    # activations: kind, dtype, x, bias, y, rows, cols, stream
    "tk_activation_fwd": (_status, [_i32, _i32, _ptr, _ptr, _ptr, _i64, _i64, _ptr]),
    "tk_activation_bwd": (_status, [_i32, _i32, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _ptr]),
    "tk_gelu_fwd": (_status, [_i32, _i32, _ptr, _ptr, _i64, _ptr]),
    "tk_gelu_bwd": (_status, [_i32, _i32, _ptr, _ptr, _ptr, _i64, _ptr]),
    "tk_glu_fwd": (_status, [_ptr, _ptr, _ptr, _ptr]),
    "tk_glu_bwd": (_status, [_ptr, _ptr, _ptr, _ptr, _ptr]),
    # norms
    "tk_rmsnorm_fwd": (_status, [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr]),
    "tk_layernorm_fwd": (_status, [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr]),
    "tk_norm_bwd_workspace_size": (_status, [_ptr, _i32, _ptr]),
    "tk_rmsnorm_bwd": (_status, [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _size, _ptr]),
    "tk_layernorm_bwd": (_status,
                         [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _size, _ptr]),
    # softmax
    "tk_softmax_fwd": (_status, [_ptr, _ptr, _ptr, _ptr]),
    "tk_softmax_bwd": (_status, [_ptr, _ptr, _ptr, _ptr, _ptr]),
    # rope
    "tk_rope_fwd": (_status, [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr]),
    "tk_rope_bwd": (_status, [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr]),
    # attention
    "tk_attention_fwd": (_status, [_ptr, _ptr]),
    "tk_attention_sliding_fwd": (_status, [_ptr, _i64, _ptr]),
    "tk_attention_supported": (_status, [_ptr, _strp]),
    "tk_attention_kvcache_fwd": (_status, [_ptr, _ptr]),
    "tk_attention_kvcache_workspace_size": (_status, [_ptr, _ptr]),
    "tk_attention_kvcache_supported": (_status, [_ptr, _strp]),
    "tk_attention_bwd_workspace_size": (_status, [_ptr, _ptr]),
    "tk_attention_bwd": (_status, [_ptr, _ptr]),
    # gemm
    "tk_gemm": (_status, [_ptr, _ptr]),
    "tk_gemm_supported": (_status, [_ptr, _strp]),
}

# ------------------------------------------------------------------------------ enums --------
STATUS = {
    "TK_SUCCESS": 0,
    "TK_ERROR_NULL_POINTER": 100,
    "TK_ERROR_INVALID_VALUE": 101,
    "TK_ERROR_OVERLAP": 102,
    "TK_ERROR_MISALIGNED": 103,
    "TK_ERROR_NOT_SUPPORTED": 200,
    "TK_ERROR_ARCH_NOT_SUPPORTED": 201,
    "TK_ERROR_NO_DEVICE": 300,
    "TK_ERROR_CUDA": 301,
    "TK_ERROR_INTERNAL": 400,
}
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}          # tk_dtype
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
ACTIVATIONS = {                                                  # tk_activation
    "none": 0, "gelu": 1, "gelu_tanh": 2, "quick_gelu": 3, "silu": 4, "relu": 5,
    "relu_squared": 6,
}
GELU_APPROXIMATIONS = {"none": 0, "tanh": 1}                     # tk_gelu_approximation
GLU_KINDS = {                                                    # tk_glu
    "swiglu": 0, "geglu": 1, "geglu_tanh": 2, "reglu": 3, "swiglu_clamped": 4,
}
GLU_LAYOUTS = {"gate_first": 0, "up_first": 1, "interleaved": 2}  # tk_glu_layout
NORM_KINDS = {"rms": 0, "layer": 1}                              # tk_norm_kind
ROPE_STYLES = {"neox": 0, "gptj": 1}                             # tk_rope_style
ROPE_SCALINGS = {"none": 0, "llama3": 1, "yarn": 2}              # tk_rope_scaling
GEMM_B_LAYOUTS = {"kn": 0, "nk": 1}                              # tk_gemm_b_layout

# Header enum constant -> (table above, key), for the test that compares them with the header.
ENUM_MIRRORS = {
    "tk_status": (STATUS, {k: k for k in STATUS}),
    "tk_dtype": (DTYPES, {"TK_F32": "float32", "TK_F16": "float16", "TK_BF16": "bfloat16"}),
    "tk_activation": (ACTIVATIONS, {
        "TK_ACT_NONE": "none", "TK_ACT_GELU_ERF": "gelu", "TK_ACT_GELU_TANH": "gelu_tanh",
        "TK_ACT_QUICK_GELU": "quick_gelu", "TK_ACT_SILU": "silu", "TK_ACT_RELU": "relu",
        "TK_ACT_RELU_SQUARED": "relu_squared"}),
    "tk_gelu_approximation": (GELU_APPROXIMATIONS, {"TK_GELU_EXACT": "none",
                                                    "TK_GELU_TANH": "tanh"}),
    "tk_glu": (GLU_KINDS, {
        "TK_GLU_SWIGLU": "swiglu", "TK_GLU_GEGLU_ERF": "geglu", "TK_GLU_GEGLU_TANH": "geglu_tanh",
        "TK_GLU_REGLU": "reglu", "TK_GLU_SWIGLU_CLAMPED": "swiglu_clamped"}),
    "tk_glu_layout": (GLU_LAYOUTS, {"TK_GLU_GATE_FIRST": "gate_first",
                                    "TK_GLU_UP_FIRST": "up_first",
                                    "TK_GLU_INTERLEAVED": "interleaved"}),
    "tk_norm_kind": (NORM_KINDS, {"TK_NORM_RMS": "rms", "TK_NORM_LAYER": "layer"}),
    "tk_rope_style": (ROPE_STYLES, {"TK_ROPE_NEOX": "neox", "TK_ROPE_GPTJ": "gptj"}),
    "tk_rope_scaling": (ROPE_SCALINGS, {"TK_ROPE_SCALING_NONE": "none",
                                        "TK_ROPE_SCALING_LLAMA3": "llama3",
                                        "TK_ROPE_SCALING_YARN": "yarn"}),
    "tk_gemm_b_layout": (GEMM_B_LAYOUTS, {"TK_GEMM_B_KN": "kn", "TK_GEMM_B_NK": "nk"}),
}


# ----------------------------------------------------------------------- integer ranges ----
# ctypes stores an int into a C integer modulo 2**bits, silently (2**32 + 1 becomes 1): every
# integer is checked against its C type's range before it reaches ctypes.
_INT_RANGES = {
    _i32: ("int", -(1 << 31), (1 << 31) - 1),
    _i64: ("int64_t", -(1 << 63), (1 << 63) - 1),
    _size: ("size_t", 0, (1 << 64) - 1),
    _ptr: ("void *", 0, (1 << 64) - 1),
}


def checked_int(value, ctype, what):
    """value as a Python int that fits the C integer type ctype; raises ValueError (TypeError
    for a non-integer) starting with `what`, e.g. "argument 'approximate'"."""
    name, lo, hi = _INT_RANGES[ctype]
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} = {value!r} is not an integer") from None
    if not lo <= value <= hi:
        raise ValueError(f"{what} = {value} does not fit the C type {name} ([{lo}, {hi}])")
    return value


# ---------------------------------------------------------------------------- structs -------
class _Params(ctypes.Structure):
    """A tk_*_params struct: created with the header's *_INIT values (see DEFAULTS).

    Only the struct's fields can be set (a misspelt name raises AttributeError instead of
    adding a Python attribute the C side never sees), integers are range-checked, and an array
    field is assigned whole from a sequence (p.q_strides = (s0, s1, s2, s3))."""

    DEFAULTS = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._types = dict(cls.__dict__.get("_fields_", ()))
        # name -> (ctype of its integers or None, lo, hi, array length or None), for the checks
        # of __setattr__ at the cost of one dict lookup and a comparison.
        cls._ranges = {}
        for name, ctype in cls._types.items():
            length = ctype._length_ if issubclass(ctype, ctypes.Array) else None
            base = ctype._type_ if length is not None else ctype
            lo, hi = _INT_RANGES[base][1:] if base in _INT_RANGES else (None, None)
            cls._ranges[name] = (base if lo is not None else None, lo, hi, length)

    def __init__(self, **fields):
        cls = type(self)
        template = cls.__dict__.get("_template")
        if template is None:
            # size and DEFAULTS, checked once; each instance starts as a copy of it.
            template = cls.__new__(cls)
            _Params.__setattr__(template, "size", ctypes.sizeof(cls))
            for name, value in self.DEFAULTS.items():
                _Params.__setattr__(template, name, value)
            cls._template = template
        ctypes.memmove(ctypes.addressof(self), ctypes.addressof(template), ctypes.sizeof(cls))
        for name, value in fields.items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        r = self._ranges.get(name)
        if r is None:
            raise AttributeError(f"{type(self).__name__} ({_struct_name(type(self))}) has no "
                                 f"field {name!r}; its fields: "
                                 f"{', '.join(f for f, _ in self._fields_)}")
        ctype, lo, hi, length = r
        if length is not None:
            if len(value) != length:
                raise ValueError(f"argument '{name}' needs {length} values, got {len(value)}")
            for v in value:
                if not (type(v) is int and lo <= v <= hi):
                    value = tuple(checked_int(v, ctype, f"argument '{name}[{i}]'")
                                  for i, v in enumerate(value))
                    break
            else:
                value = tuple(value)
        elif ctype is not None and not (type(value) is int and lo <= value <= hi):
            value = checked_int(value, ctype, f"argument '{name}'")
        _struct_setattr(self, name, value)


_struct_setattr = ctypes.Structure.__setattr__
set_field = _struct_setattr
"""set_field(params, name, value): sets a field without _Params's checks, for a replay's data
pointers (a torch data_ptr() is always within void *): about a third of the checked cost."""


class DeviceInfo(_Params):
    _fields_ = [("size", _size), ("device", _i32), ("compute_capability", _i32),
                ("sm_count", _i32), ("max_smem_per_block", _i32), ("l2_bytes", _i32),
                ("supported", _i32)]


class GluParams(_Params):
    _fields_ = [("size", _size), ("kind", _i32), ("dtype", _i32), ("layout", _i32),
                ("rows", _i64), ("d", _i64), ("x_row_stride", _i64), ("y_row_stride", _i64),
                ("alpha", _f32), ("limit", _f32)]
    DEFAULTS = {"dtype": DTYPES["bfloat16"], "alpha": 1.702, "limit": 7.0}


class NormParams(_Params):
    _fields_ = [("size", _size), ("dtype", _i32), ("weight_dtype", _i32), ("rows", _i64),
                ("cols", _i64), ("x_row_stride", _i64), ("residual_row_stride", _i64),
                ("y_row_stride", _i64), ("eps", _f32), ("gemma", _i32)]
    DEFAULTS = {"dtype": DTYPES["bfloat16"], "weight_dtype": DTYPES["bfloat16"], "eps": 1e-6}


class SoftmaxParams(_Params):
    _fields_ = [("size", _size), ("dtype", _i32), ("rows", _i64), ("cols", _i64),
                ("x_row_stride", _i64), ("y_row_stride", _i64), ("scale", _f32), ("log", _i32),
                ("causal", _i32), ("causal_offset", _i64), ("causal_period", _i64)]
    DEFAULTS = {"dtype": DTYPES["bfloat16"], "scale": 1.0}


class RopeParams(_Params):
    _fields_ = [("size", _size), ("dtype", _i32), ("style", _i32), ("tokens", _i64),
                ("heads_q", _i64), ("heads_k", _i64), ("head_dim", _i64), ("rotary_dim", _i64),
                ("q_strides", _i64 * 2), ("k_strides", _i64 * 2), ("q_out_strides", _i64 * 2),
                ("k_out_strides", _i64 * 2), ("positions32", _ptr), ("positions64", _ptr),
                ("position_start", _i64), ("theta", _f32), ("cos_cache", _ptr),
                ("sin_cache", _ptr), ("cache_row_stride", _i64), ("max_position", _i64)]
    DEFAULTS = {"dtype": DTYPES["bfloat16"], "theta": 10000.0}


class AttentionParams(_Params):
    _fields_ = [("size", _size), ("dtype", _i32), ("q", _ptr), ("k", _ptr), ("v", _ptr),
                ("o", _ptr), ("batch", _i64), ("seqlen_q", _i64), ("seqlen_k", _i64),
                ("heads_q", _i64), ("heads_kv", _i64), ("head_dim", _i64),
                ("q_strides", _i64 * 4), ("k_strides", _i64 * 4), ("v_strides", _i64 * 4),
                ("o_strides", _i64 * 4), ("softmax_scale", _f32), ("causal", _i32),
                ("window_left", _i64), ("window_right", _i64), ("softcap", _f32),
                ("alibi_slopes", _ptr), ("return_lse", _i32), ("lse", _ptr),
                ("sinks", _ptr), ("chunk_size", _i64), ("prefix_len", _i64),
                ("document_ids", _ptr)]
    DEFAULTS = {"dtype": DTYPES["bfloat16"], "window_left": -1, "window_right": -1}


class AttentionKvcacheParams(_Params):
    _fields_ = [("size", _size), ("dtype", _i32), ("q", _ptr), ("k_cache", _ptr),
                ("v_cache", _ptr), ("o", _ptr), ("batch", _i64), ("seqlen_q", _i64),
                ("cu_seqlens_q", _ptr), ("total_q", _i64), ("seqlens_k", _ptr),
                ("heads_q", _i64), ("heads_kv", _i64), ("head_dim", _i64),
                ("max_seqlen_k", _i64), ("block_table", _ptr), ("block_table_stride", _i64),
                ("num_pages", _i64), ("page_size", _i64), ("max_pages_per_seq", _i64),
                ("q_strides", _i64 * 4), ("k_strides", _i64 * 4), ("v_strides", _i64 * 4),
                ("o_strides", _i64 * 4), ("softmax_scale", _f32), ("causal", _i32),
                ("window_left", _i64), ("window_right", _i64), ("softcap", _f32),
                ("alibi_slopes", _ptr), ("return_lse", _i32), ("lse", _ptr),
                ("num_splits", _i64), ("workspace", _ptr), ("workspace_bytes", _size),
                ("k_new", _ptr), ("v_new", _ptr), ("k_new_strides", _i64 * 4),
                ("v_new_strides", _i64 * 4), ("rotary_dim", _i64), ("rope_style", _i32),
                ("rope_theta", _f32), ("rope_cos", _ptr), ("rope_sin", _ptr),
                ("rope_cache_row_stride", _i64), ("rope_max_position", _i64),
                ("rope_scaling", _i32), ("rope_factor", _f32), ("rope_low_freq_factor", _f32),
                ("rope_high_freq_factor", _f32), ("rope_original_max_position", _i64),
                ("rope_beta_fast", _f32), ("rope_beta_slow", _f32),
                ("rope_attention_factor", _f32), ("sinks", _ptr), ("chunk_size", _i64)]
    DEFAULTS = {"dtype": DTYPES["bfloat16"], "window_left": -1, "window_right": -1,
                "rope_theta": 10000.0, "rope_factor": 1.0, "rope_low_freq_factor": 1.0,
                "rope_high_freq_factor": 4.0, "rope_original_max_position": 8192,
                "rope_beta_fast": 32.0, "rope_beta_slow": 1.0}


class AttentionBwdParams(_Params):
    _fields_ = [("size", _size), ("dtype", _i32), ("q", _ptr), ("k", _ptr), ("v", _ptr),
                ("o", _ptr), ("lse", _ptr), ("dout", _ptr), ("dq", _ptr), ("dk", _ptr),
                ("dv", _ptr), ("batch", _i64), ("seqlen_q", _i64), ("seqlen_k", _i64),
                ("heads_q", _i64), ("heads_kv", _i64), ("head_dim", _i64),
                ("q_strides", _i64 * 4), ("k_strides", _i64 * 4), ("v_strides", _i64 * 4),
                ("o_strides", _i64 * 4), ("dout_strides", _i64 * 4), ("dq_strides", _i64 * 4),
                ("dk_strides", _i64 * 4), ("dv_strides", _i64 * 4), ("softmax_scale", _f32),
                ("causal", _i32), ("window_left", _i64), ("window_right", _i64),
                ("softcap", _f32), ("alibi_slopes", _ptr), ("workspace", _ptr),
                ("workspace_bytes", _size), ("sinks", _ptr), ("chunk_size", _i64),
                ("prefix_len", _i64), ("document_ids", _ptr), ("dsinks", _ptr),
                ("deterministic", _i32)]
    DEFAULTS = {"dtype": DTYPES["bfloat16"], "window_left": -1, "window_right": -1}


class GemmParams(_Params):
    _fields_ = [("size", _size), ("m", _i64), ("n", _i64), ("k", _i64), ("input_dtype", _i32),
                ("output_dtype", _i32), ("b_layout", _i32), ("a", _ptr), ("lda", _i64),
                ("b", _ptr), ("ldb", _i64), ("c", _ptr), ("ldc", _i64), ("bias", _ptr),
                ("d", _ptr), ("ldd", _i64), ("activation", _i32), ("alpha", _f32),
                ("beta", _f32)]
    DEFAULTS = {"input_dtype": DTYPES["bfloat16"], "output_dtype": DTYPES["bfloat16"],
                "b_layout": GEMM_B_LAYOUTS["nk"], "alpha": 1.0}


# Header struct name -> ctypes mirror, for the layout test.
STRUCTS = {
    "tk_device_info": DeviceInfo,
    "tk_glu_params": GluParams,
    "tk_norm_params": NormParams,
    "tk_softmax_params": SoftmaxParams,
    "tk_rope_params": RopeParams,
    "tk_attention_params": AttentionParams,
    "tk_attention_kvcache_params": AttentionKvcacheParams,
    "tk_attention_bwd_params": AttentionBwdParams,
    "tk_gemm_params": GemmParams,
}


def _struct_name(cls):
    return next((name for name, c in STRUCTS.items() if c is cls), cls.__name__)


# ------------------------------------------------------------------------------ errors ------
class TkernError(RuntimeError):
    """A libtkern call returned a failing tk_status.

    Attributes: ``status`` (the number), ``status_name`` (e.g. "TK_ERROR_INVALID_VALUE"),
    ``function`` (the C entry point) and ``message`` (tk_last_error(), which names the argument
    and what is accepted).
    """

    def __init__(self, status, status_name, function, message):
        self.status = status
        self.status_name = status_name
        self.function = function
        self.message = message
        super().__init__(f"{function} failed with {status_name} ({status}): {message}")


class LibraryNotFoundError(OSError):
    """libtkern could not be loaded; the message lists every place that was tried."""


# ----------------------------------------------------------------------------- loading ------
_lock = threading.Lock()
_state = {"lib": None, "path": None, "missing": ()}


def _candidates():
    """(description, path-or-name) pairs in search order, and whether TKERN_LIBRARY decided."""
    soname = f"libtkern.so.{EXPECTED_MAJOR}"
    env = os.environ.get("TKERN_LIBRARY")
    if env:
        path = os.path.join(env, soname) if os.path.isdir(env) else env
        return [("TKERN_LIBRARY", path)], True
    here = os.path.dirname(os.path.abspath(__file__))
    in_tree = os.path.normpath(os.path.join(here, "..", "..", "build", "lib", soname))
    return [("in-tree build", in_tree), ("loader path", soname)], False


def _open():
    candidates, _ = _candidates()
    tried = []
    for what, path in candidates:
        if what != "loader path" and not os.path.exists(path):
            tried.append(f"{what}: {path} (no such file)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{what}: {path} ({e})")
    raise LibraryNotFoundError(
        "cannot load libtkern; tried, in order:\n  " + "\n  ".join(tried) +
        "\nBuild it with `make` in the repository, install it (`make install`, then ldconfig), "
        "or set TKERN_LIBRARY to the path of libtkern.so." + str(EXPECTED_MAJOR))


def _declare(lib):
    missing = []
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    return tuple(missing)


def load():
    """Loads libtkern once (thread-safe) and returns the ctypes.CDLL.

    Search order: the file (or directory holding libtkern.so.<major>) named by TKERN_LIBRARY;
    else the in-tree build (build/lib/libtkern.so.<major> next to python/); else
    libtkern.so.<major> on the dynamic loader's path. Raises LibraryNotFoundError listing what
    was tried, or ImportError when the loaded library's major version differs from the one this
    binding was written for.
    """
    lib = _state["lib"]
    if lib is not None:
        return lib
    with _lock:
        if _state["lib"] is None:
            lib, path = _open()
            missing = _declare(lib)
            if "tk_version" in missing:
                raise LibraryNotFoundError(f"{path} does not export tk_version: not libtkern")
            version = lib.tk_version()
            if version // 10000 != EXPECTED_MAJOR:
                raise ImportError(
                    f"{path} is libtkern {version // 10000}.{version // 100 % 100}."
                    f"{version % 100}, but this binding needs major version {EXPECTED_MAJOR}; "
                    "use the python/ directory of the same source tree, or set TKERN_LIBRARY")
            _state.update(lib=lib, path=path, missing=missing)
    return _state["lib"]


def library_path():
    """The path (or loader name) libtkern was loaded from; loads it if needed."""
    load()
    return _state["path"]


def version():
    """The loaded library's version number, 10000 * major + 100 * minor + patch."""
    return load().tk_version()


def status_name(status):
    """tk_status_string(status) as a str, e.g. "TK_ERROR_INVALID_VALUE"."""
    return load().tk_status_string(checked_int(status, _status, "argument 'status'")).decode()


def last_error():
    """tk_last_error() of the calling thread as a str ("" after a successful call)."""
    return load().tk_last_error().decode(errors="replace")


def function(name):
    """The ctypes function `name`, or a clear error when the loaded library lacks it."""
    lib = load()
    if name in _state["missing"]:
        raise NotImplementedError(
            f"{_state['path']} does not export {name}: it was built from an older source tree; "
            "rebuild it with `make`")
    return getattr(lib, name)


_prototypes = {}


def _prototype(name):
    """(ctypes function, ((index, ctype, lo, hi) of each integer parameter)) of `name`, built
    once: the per-call work is then the range comparisons and the call itself."""
    proto = _prototypes.get(name)
    if proto is None:
        ints = tuple((i, ctype) + _INT_RANGES[ctype][1:]
                     for i, ctype in enumerate(SIGNATURES[name][1]) if ctype in _INT_RANGES)
        proto = _prototypes[name] = (function(name), ints)
    return proto


def call(name, *args):
    """Calls the entry point `name`; raises TkernError unless it returns TK_SUCCESS, and
    ValueError before the call for an int argument outside its C type's range."""
    fn, ints = _prototypes.get(name) or _prototype(name)
    for i, ctype, lo, hi in ints:
        arg = args[i]
        if isinstance(arg, int) and not lo <= arg <= hi:
            checked_int(arg, ctype, f"{name}'s argument {i + 1}")
    status = fn(*args)
    if status != 0:
        raise TkernError(status, status_name(status), name, last_error())


def replay(name, *args):
    """call() without its integer range checks, for a replayed call (_arrays.Lane): its
    integers come from a plan whose call passed them, its pointers and stream from torch."""
    proto = _prototypes.get(name) or _prototype(name)
    status = proto[0](*args)
    if status != 0:
        raise TkernError(status, status_name(status), name, last_error())


byref = ctypes.byref
