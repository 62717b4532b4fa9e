"""Host-side tests (no GPU needed): loading, version, the ctypes declarations against
include/tkern.h, array checks with clear errors, and behaviour without a device."""

import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import HEADER, PACKAGE_DIR, PYTHON_DIR, REPO, FakeCudaArray

import tkern
from tkern import _arrays, _lib, _lifetime


# ------------------------------------------------------------------ header parsing ------
def _header_text():
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = text.replace("\\\n", " ")
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _enums(text):
    """typedef name -> {constant: value}."""
    out = {}
    for m in re.finditer(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
        values = {}
        for item in m.group(1).split(","):
            if item.strip():
                name, value = (s.strip() for s in item.split("="))
                values[name] = int(value)
        out[m.group(2)] = values
    return out


def _scalar_ctype(base, enums):
    base = " ".join(base.replace("const", " ").split())
    table = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32,
             "size_t": ctypes.c_size_t, "float": ctypes.c_float, "double": ctypes.c_double,
             "tk_stream_t": ctypes.c_void_p}
    if base in enums:
        return ctypes.c_int
    assert base in table, f"the test does not know the C type {base!r}: extend _scalar_ctype"
    return table[base]


def _ctype(base, stars, enums):
    """The ctypes type the binding must use for a C type: pointers are c_void_p except
    char * (c_char_p) and char ** (POINTER(c_char_p))."""
    plain = " ".join(base.replace("const", " ").split())
    if stars == 0:
        return _scalar_ctype(plain, enums)
    if plain == "char":
        return ctypes.c_char_p if stars == 1 else ctypes.POINTER(ctypes.c_char_p)
    assert stars == 1, f"unexpected {base} {'*' * stars}"
    return ctypes.c_void_p


_DECL = re.compile(r"^(?P<base>(?:const\s+)?\w+(?:\s+\w+)*?)\s*(?P<stars>(?:\*\s*(?:const\s*)?)*)"
                   r"(?P<name>\w+)?\s*(?:\[(?P<n>\d+)\])?$")


def _split_decl(decl):
    m = _DECL.match(" ".join(decl.split()))
    assert m, f"cannot parse the declaration {decl!r}"
    base, name = m.group("base"), m.group("name")
    if name is None and " " in base and not m.group("stars"):
        base, name = base.rsplit(" ", 1)
    if base.split()[-1] == "const":  # "const char" parsed whole
        base = base
    return base, m.group("stars").count("*"), name, m.group("n")


def _functions(text, enums):
    """name -> (restype, [argtypes]) from the TK_API declarations."""
    out = {}
    for m in re.finditer(r"\bTK_API\s+([^;(]*?)\b(tk_\w+)\s*\(([^)]*)\)\s*;", text, re.S):
        ret = m.group(1).strip()
        rbase, rstars, _, _ = _split_decl(ret + " x")
        args = [a.strip() for a in m.group(3).split(",")]
        argtypes = []
        if args != ["void"]:
            for a in args:
                base, stars, name, _ = _split_decl(a)
                argtypes.append(_ctype(base, stars, enums))
        out[m.group(2)] = (_ctype(rbase, rstars, enums), argtypes)
    return out


def _structs(text, enums):
    """typedef name -> [(field, ctypes type)] in declaration order."""
    out = {}
    for m in re.finditer(r"typedef\s+struct\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
        fields = []
        for decl in filter(None, (d.strip() for d in m.group(1).split(";"))):
            first, *rest = [p.strip() for p in decl.split(",")]
            base, stars, name, n = _split_decl(first)
            declarators = [(stars, name, n)]
            for r in rest:
                rm = re.match(r"^((?:\*\s*)*)(\w+)\s*(?:\[(\d+)\])?$", r)
                declarators.append((rm.group(1).count("*"), rm.group(2), rm.group(3)))
            for stars, name, n in declarators:
                t = _ctype(base, stars, enums)
                fields.append((name, t * int(n) if n else t))
        out[m.group(2)] = fields
    return out


TEXT = _header_text()
ENUMS = _enums(TEXT)
FUNCTIONS = _functions(TEXT, ENUMS)
STRUCTS = _structs(TEXT, ENUMS)


def _same_ctype(a, b):
    if hasattr(a, "_length_") or hasattr(b, "_length_"):
        return (getattr(a, "_length_", None) == getattr(b, "_length_", None)
                and a._type_ == b._type_)
    return a is b


def _name(t):
    return f"{t._type_.__name__}*{t._length_}" if hasattr(t, "_length_") else t.__name__


# ------------------------------------------------------------------------ loading -------
def _run_python(code, env_update, cwd=None, path=os.path.dirname(PACKAGE_DIR)):
    env = {k: v for k, v in os.environ.items() if k != "TKERN_LIBRARY"}
    env.update(env_update)
    env["PYTHONPATH"] = path
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_library_loads_and_reports_version():
    path = tkern.load_library()
    assert os.path.exists(path) or path.startswith("libtkern.so.")
    numbers = {k: int(re.search(rf"#define TK_VERSION_{k} (\d+)", open(HEADER).read()).group(1))
               for k in ("MAJOR", "MINOR", "PATCH")}
    assert tkern.version() == (numbers["MAJOR"], numbers["MINOR"], numbers["PATCH"])
    assert tkern.EXPECTED_MAJOR == numbers["MAJOR"], (
        "include/tkern.h changed TK_VERSION_MAJOR: update EXPECTED_MAJOR in tkern/_lib.py")
    if os.environ.get("TKERN_LIBRARY"):
        assert os.path.samefile(path, os.environ["TKERN_LIBRARY"])


def test_library_loads_from_in_tree_build():
    soname = os.path.join(REPO, "build", "lib", f"libtkern.so.{tkern.EXPECTED_MAJOR}")
    if not os.path.exists(soname):
        pytest.skip(f"no in-tree build at {soname} (built elsewhere with BUILD=...)")
    r = _run_python("import tkern; print(tkern.load_library()); print(tkern.version())", {},
                    path=PYTHON_DIR)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == soname


def test_load_failure_says_what_was_tried(tmp_path):
    r = _run_python("import tkern; tkern.gelu", {"TKERN_LIBRARY": str(tmp_path / "nope.so")})
    assert r.returncode == 0, "import tkern must work without the library: " + r.stderr
    r = _run_python("import tkern; tkern.load_library()",
                    {"TKERN_LIBRARY": str(tmp_path / "nope.so")})
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr and "TKERN_LIBRARY" in r.stderr
    assert str(tmp_path / "nope.so") in r.stderr
    # A copy of the package away from the source tree, with nothing on the loader path: both
    # the in-tree location and the loader name are reported.
    shutil.copytree(PACKAGE_DIR, tmp_path / "pkg" / "python" / "tkern")
    r = _run_python("import tkern; tkern.load_library()", {"LD_LIBRARY_PATH": ""},
                    path=str(tmp_path / "pkg" / "python"))
    if r.returncode == 0:
        pytest.skip("libtkern is installed on the loader path, so loading succeeded")
    assert "in-tree build" in r.stderr and "loader path" in r.stderr
    assert f"libtkern.so.{tkern.EXPECTED_MAJOR}" in r.stderr


def test_core_package_never_imports_torch():
    r = _run_python("import sys, tkern; tkern.load_library(); print('torch' in sys.modules)",
                    {"TKERN_LIBRARY": tkern.library_path()})
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    r = _run_python("import tkern.autograd", {})
    if "No module named 'torch'" not in r.stderr:
        assert r.returncode == 0, r.stderr


def test_major_version_mismatch_is_refused():
    r = _run_python("import tkern._lib as l; l.EXPECTED_MAJOR = 99\n"
                    "import tkern; tkern.load_library()",
                    {"TKERN_LIBRARY": tkern.library_path()})
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "major version 99" in r.stderr


# ----------------------------------------------------------------- ABI mirroring --------
def test_header_parsed():
    assert len(FUNCTIONS) >= 20 and "tk_glu_params" in STRUCTS and "tk_dtype" in ENUMS


def test_every_header_function_is_declared_with_matching_types():
    problems = []
    for name, (restype, argtypes) in FUNCTIONS.items():
        if name not in _lib.SIGNATURES:
            problems.append(f"{name}: declared in include/tkern.h, missing from SIGNATURES")
            continue
        got_res, got_args = _lib.SIGNATURES[name]
        if got_res is not restype:
            problems.append(f"{name}: restype {_name(got_res)}, header says {_name(restype)}")
        if len(got_args) != len(argtypes):
            problems.append(f"{name}: {len(got_args)} argtypes, header has {len(argtypes)}")
            continue
        for i, (g, h) in enumerate(zip(got_args, argtypes)):
            if g is not h:
                problems.append(f"{name}: argument {i} is {_name(g)}, header says {_name(h)}")
    for name in set(_lib.SIGNATURES) - set(FUNCTIONS):
        problems.append(f"{name}: in SIGNATURES but not declared TK_API in include/tkern.h")
    assert not problems, "\n".join(problems)


def test_loaded_functions_carry_the_declarations():
    lib = _lib.load()
    for name, (restype, argtypes) in _lib.SIGNATURES.items():
        if name in _lib._state["missing"]:
            continue
        fn = getattr(lib, name)
        assert fn.restype is restype and list(fn.argtypes) == argtypes, name


def test_every_entry_point_has_a_python_function():
    sources = ""
    for path in glob.glob(os.path.join(PACKAGE_DIR, "*.py")):
        if not path.endswith("_lib.py"):
            sources += open(path).read()
    # _lib.py calls these three itself (version check, TkernError); every other entry point is
    # named by a public function's module.
    called = set(re.findall(r'"(tk_\w+)"', sources))
    called |= {"tk_version", "tk_status_string", "tk_last_error"}
    missing = [n for n in FUNCTIONS if n not in called]
    assert not missing, f"entry points without a Python wrapper: {missing}"


def test_enums_match_header():
    problems = []
    for enum, (table, names) in _lib.ENUM_MIRRORS.items():
        assert enum in ENUMS, f"{enum} not found in the header"
        if set(ENUMS[enum]) != set(names):
            problems.append(f"{enum}: header constants {sorted(ENUMS[enum])}, binding maps "
                            f"{sorted(names)}")
            continue
        for const, value in ENUMS[enum].items():
            if table[names[const]] != value:
                problems.append(f"{enum}.{const} = {value} in the header, "
                                f"{table[names[const]]} in the binding")
    enums_used = {e for e in ENUMS if e != "tk_status"}
    assert enums_used <= set(_lib.ENUM_MIRRORS), (
        f"enums without a mirror: {sorted(enums_used - set(_lib.ENUM_MIRRORS))}")
    assert not problems, "\n".join(problems)


def test_struct_mirrors_match_header_fields():
    assert set(STRUCTS) == set(_lib.STRUCTS), (
        f"header structs {sorted(STRUCTS)}, mirrored {sorted(_lib.STRUCTS)}")
    problems = []
    for name, fields in STRUCTS.items():
        mirror = _lib.STRUCTS[name]._fields_
        if [f for f, _ in mirror] != [f for f, _ in fields]:
            problems.append(f"{name}: fields {[f for f, _ in mirror]}, header "
                            f"{[f for f, _ in fields]}")
            continue
        for (f, t), (_, h) in zip(mirror, fields):
            if not _same_ctype(t, h):
                problems.append(f"{name}.{f}: {_name(t)}, header says {_name(h)}")
    assert not problems, "\n".join(problems)


def _compile_and_run(tmp_path, source):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(cc):
        pytest.skip("no C compiler to measure the C layouts")
    (tmp_path / "layout.c").write_text(source)
    exe = tmp_path / "layout"
    r = subprocess.run([cc, "-std=c11", "-I", os.path.join(REPO, "include"),
                        str(tmp_path / "layout.c"), "-o", str(exe)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def test_struct_layouts_and_init_values_match_c(tmp_path):
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <tkern.h>",
             "int main(void) {"]
    for name, cls in _lib.STRUCTS.items():
        init = name.upper() + "_INIT"
        lines.append(f"  {{ {name} v = {init}; (void)v;")
        lines.append(f'  printf("{name} sizeof %zu\\n", sizeof({name}));')
        for field, t in cls._fields_:
            lines.append(f'  printf("{name}.{field} offset %zu\\n", offsetof({name}, {field}));')
            if field == "size":
                continue
            if hasattr(t, "_length_"):
                for i in range(t._length_):
                    lines.append(f'  printf("{name}.{field}[{i}] init %.9g\\n", '
                                 f"(double)v.{field}[{i}]);")
            elif t is ctypes.c_void_p:
                lines.append(f'  printf("{name}.{field} init %d\\n", v.{field} != NULL);')
            else:
                lines.append(f'  printf("{name}.{field} init %.9g\\n", (double)v.{field});')
        lines.append("  }")
    lines += ["  return 0;", "}"]
    out = _compile_and_run(tmp_path, "\n".join(lines) + "\n")
    c_values = dict(line.rsplit(" ", 1) for line in out.splitlines())
    problems = []
    for name, cls in _lib.STRUCTS.items():
        py = {f"{name} sizeof": str(ctypes.sizeof(cls))}
        inst = cls()
        for field, t in cls._fields_:
            py[f"{name}.{field} offset"] = str(getattr(cls, field).offset)
            if field == "size":
                continue
            value = getattr(inst, field)
            if hasattr(t, "_length_"):
                for i in range(t._length_):
                    py[f"{name}.{field}[{i}] init"] = "%.9g" % value[i]
            elif t is ctypes.c_void_p:
                py[f"{name}.{field} init"] = str(int(bool(value)))
            else:
                py[f"{name}.{field} init"] = "%.9g" % value
        for key, v in py.items():
            if c_values.get(key) != v:
                problems.append(f"{key}: C {c_values.get(key)}, Python {v}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- array handling --------
def test_non_array_inputs_name_the_argument():
    with pytest.raises(TypeError, match=r"argument 'x' \(builtins.list\) is not a CUDA array"):
        tkern.gelu([1.0, 2.0])
    x = FakeCudaArray((4, 64))
    with pytest.raises(TypeError, match=r"argument 'weight'.*not a CUDA array"):
        tkern.rms_norm(x, weight=3.0, out=FakeCudaArray((4, 64)))
    with pytest.raises(TypeError, match="argument 'x' is None"):
        tkern.gelu(None)


def test_host_numpy_arrays_are_rejected_naming_the_argument():
    np = pytest.importorskip("numpy")
    host = np.zeros((4, 64), dtype=np.float16)
    with pytest.raises(TypeError, match=r"argument 'x' \(numpy.ndarray\) is on DLPack device "
                                        r"kDLCPU; libtkern needs CUDA"):
        tkern.gelu(host)
    fake = FakeCudaArray((4, 64))
    with pytest.raises(TypeError, match="argument 'bias'.*kDLCPU"):
        tkern.activation(fake, "silu", bias=np.zeros(64, np.float16), out=FakeCudaArray((4, 64)))
    with pytest.raises(TypeError, match="argument 'b'.*kDLCPU"):
        tkern.gemm(FakeCudaArray((8, 16)), np.zeros((16, 8), np.float16))
    q = FakeCudaArray((1, 8, 2, 64))
    with pytest.raises(TypeError, match="argument 'k'.*kDLCPU"):
        tkern.attention(q, np.zeros((1, 8, 2, 64), np.float16), q)


def test_dlpack_capsules_are_parsed_exactly():
    np = pytest.importorskip("numpy")
    base = np.arange(6 * 10, dtype=np.float32).reshape(6, 10)
    cases = {
        "dense f32": base,
        "f16": base.astype(np.float16),
        "int64": base.astype(np.int64),
        "int32 column slice": base.astype(np.int32)[1:5, 2:9],
        "transposed": base.T,
        "step slice": base[::2, 1::3],
        "0-d": np.array(3.0, dtype=np.float32),
    }
    for what, arr in cases.items():
        a = _arrays._from_dlpack(arr, "x", None)
        assert a.dtype == arr.dtype.name, what
        assert a.shape == arr.shape, what
        assert a.strides == tuple(s // arr.itemsize for s in arr.strides) or arr.size <= 1, what
        assert a.ptr == arr.ctypes.data, what
        assert a.is_contiguous() == arr.flags.c_contiguous, what
        assert a.device_type == 1, what


def test_rows_view_accepts_strided_rows_and_rejects_the_rest():
    np = pytest.importorskip("numpy")
    base = np.zeros((4, 6, 32), dtype=np.float16)
    rows = lambda arr: _arrays._from_dlpack(arr, "x", None).rows()  # noqa: E731
    assert rows(base) == (24, 32, 32)
    assert rows(base[:, :, :16]) == (24, 16, 32)
    assert rows(base[1:3]) == (12, 32, 32)
    with pytest.raises(ValueError, match="argument 'x': the last dimension must be contiguous"):
        rows(base.transpose(0, 2, 1))
    assert rows(base[:, ::2, :]) == (12, 32, 64)  # every other row: still one row stride
    with pytest.raises(ValueError, match="argument 'x': its leading dimensions cannot be"):
        rows(base[:, :3, :])
    # A broadcast row (stride 0) must not reach a library where a row stride of 0 means dense.
    with pytest.raises(ValueError, match="argument 'x' has a zero or negative stride"):
        rows(np.lib.stride_tricks.as_strided(base[0, 0], (5, 32), (0, 2)))
    with pytest.raises(ValueError, match="argument 'x' has a zero or negative stride"):
        rows(base[::-1])


def test_cuda_array_interface_checks():
    x = FakeCudaArray((8, 64), "<f2")
    a = _arrays.as_array(x, "x")
    assert (a.dtype, a.shape, a.strides, a.ptr) == ("float16", (8, 64), (64, 1),
                                                     ctypes.addressof(x.buffer))
    t = FakeCudaArray((64, 8), "<f4", strides=(4, 256))
    assert _arrays.as_array(t, "x").strides == (1, 64)
    with pytest.raises(TypeError, match=r"argument 'x'.*'<V2'.*bfloat16.*DLPack"):
        tkern.gelu(FakeCudaArray((8, 64), "<V2"))
    with pytest.raises(TypeError, match=r"argument 'x' has dtype int32; accepted: float32"):
        tkern.gelu(FakeCudaArray((8, 64), "<i4"))
    with pytest.raises(ValueError, match=r"argument 'x' must be contiguous"):
        tkern.gelu(t, out=FakeCudaArray((64, 8), "<f4"))
    with pytest.raises(ValueError, match=r"argument 'out' has shape \(8, 32\), expected"):
        tkern.gelu(x, out=FakeCudaArray((8, 32)))
    with pytest.raises(TypeError, match=r"argument 'out' has dtype float32; accepted: float16"):
        tkern.gelu(x, out=FakeCudaArray((8, 64), "<f4"))
    with pytest.raises(ValueError, match=r"argument 'approximate' = 'fast'; accepted"):
        tkern.gelu(x, approximate="fast", out=x)
    with pytest.raises(TypeError, match="cannot allocate 'out'.*pass 'out' explicitly"):
        tkern.gelu(x)
    with pytest.raises(ValueError, match="argument 'dim' = 0"):
        tkern.softmax(x, dim=0, out=x)
    with pytest.raises(ValueError, match="argument 'x' must have an even last dimension"):
        tkern.swiglu(FakeCudaArray((8, 63)), out=FakeCudaArray((8, 31)))
    with pytest.raises(ValueError, match=r"argument 'q' must be 4-D"):
        tkern.attention(x, x, x)
    with pytest.raises(ValueError, match=r"arguments 'a' \(8, 64\) and 'b' \(32, 8\) do not chain"):
        tkern.gemm(x, FakeCudaArray((32, 8)))
    with pytest.raises(TypeError, match="argument 'stream'"):
        tkern.gelu(x, out=x, stream="default")


def test_library_errors_raise_tkern_error_with_status_and_message():
    x, y = FakeCudaArray((8, 64)), FakeCudaArray((8, 64))
    with pytest.raises(tkern.TkernError) as e:
        tkern.gelu(x, approximate=7, out=y)
    err = e.value
    assert err.status == 101 and err.status_name == "TK_ERROR_INVALID_VALUE"
    assert err.function == "tk_gelu_fwd" and "tk_gelu_fwd" in err.message
    assert "TK_ERROR_INVALID_VALUE" in str(err) and err.message in str(err)
    assert y.untouched()
    # Partial overlap of the output with the input is the library's to reject.
    big = FakeCudaArray((9, 64))
    shifted = FakeCudaArray((8, 64))
    shifted.__cuda_array_interface__ = dict(big.__cuda_array_interface__, shape=(8, 64),
                                            data=(ctypes.addressof(big.buffer) + 128, False))
    ref = FakeCudaArray((8, 64))
    ref.__cuda_array_interface__ = dict(big.__cuda_array_interface__, shape=(8, 64))
    with pytest.raises(tkern.TkernError) as e:
        tkern.activation(ref, "relu", out=shifted)
    assert e.value.status_name == "TK_ERROR_OVERLAP" and "'y'" in e.value.message
    assert big.untouched()
    assert tkern.status_name(0) == "TK_SUCCESS"


def _library_rejections():
    """One argument per family that the binding passes on and the library rejects before any
    device work: (call, function, the argument its message names, the arrays involved)."""
    nan, inf = float("nan"), float("inf")
    x, y, w = FakeCudaArray((8, 64)), FakeCudaArray((8, 64)), FakeCudaArray((64,))
    glu_out = FakeCudaArray((8, 32))
    q, k = FakeCudaArray((2, 16, 4, 64)), FakeCudaArray((2, 16, 2, 64))
    v, o, do = FakeCudaArray((2, 16, 2, 64)), FakeCudaArray((2, 16, 4, 64)), FakeCudaArray((2, 16, 4, 64))
    lse = FakeCudaArray((2, 4, 16), "<f4")
    dq, dk, dv = FakeCudaArray((2, 16, 4, 64)), FakeCudaArray((2, 16, 2, 64)), FakeCudaArray((2, 16, 2, 64))
    a, b, d = FakeCudaArray((16, 64)), FakeCudaArray((64, 32)), FakeCudaArray((16, 32))
    return [
        (lambda: tkern.glu(x, "swiglu_clamped", alpha=nan, out=glu_out), "tk_glu_fwd", "alpha",
         (x, glu_out)),
        (lambda: tkern.rms_norm(x, w, eps=nan, out=y), "tk_rmsnorm_fwd", "eps", (x, w, y)),
        (lambda: tkern.softmax(x, scale=inf, out=y), "tk_softmax_fwd", "scale", (x, y)),
        (lambda: tkern.rope_(q, k, theta=-1.0), "tk_rope_fwd", "theta", (q, k)),
        (lambda: tkern.attention(q, k, v, scale=inf, out=o), "tk_attention_fwd", "softmax_scale",
         (q, k, v, o)),
        (lambda: tkern.attention_backward(q, k, v, o, lse, do, scale=inf, dq=dq, dk=dk, dv=dv,
                                          workspace=FakeCudaArray((64,), "|u1")),
         "tk_attention_bwd_workspace_size", "softmax_scale", (q, k, v, o, lse, do, dq, dk, dv)),
        (lambda: tkern.gemm(a, b, alpha=inf, out=d), "tk_gemm", "alpha", (a, b, d)),
    ]


@pytest.mark.parametrize("case", range(len(_library_rejections())))
def test_library_rejections_through_the_binding_name_the_argument_and_write_nothing(case):
    call, function, argument, arrays = _library_rejections()[case]
    with pytest.raises(tkern.TkernError) as e:
        call()
    assert e.value.status_name == "TK_ERROR_INVALID_VALUE", e.value.message
    assert e.value.function == function and argument in e.value.message
    assert all(arr.untouched() for arr in arrays)


def _has_device():
    try:
        tkern.device_query()
        return True
    except tkern.TkernError:
        return False


def test_without_a_device_calls_fail_cleanly():
    if _has_device():
        pytest.skip("a CUDA device is present: the no-device behaviour cannot be observed")
    with pytest.raises(tkern.TkernError) as e:
        tkern.device_query()
    assert e.value.status_name == "TK_ERROR_NO_DEVICE" and e.value.message
    x, y = FakeCudaArray((8, 64)), FakeCudaArray((8, 64))
    with pytest.raises(tkern.TkernError) as e:
        tkern.gelu(x, out=y)
    assert e.value.status_name == "TK_ERROR_NO_DEVICE" and "tk_gelu_fwd" in e.value.message
    assert x.untouched() and y.untouched()
    with pytest.raises(tkern.TkernError) as e:
        tkern.swiglu(FakeCudaArray((4, 128)), out=FakeCudaArray((4, 64)))
    assert e.value.status_name == "TK_ERROR_NO_DEVICE"


def test_force_variant_and_last_variant():
    tkern.force_variant("activation", None)
    assert isinstance(tkern.last_variant(), str)
    with pytest.raises(tkern.TkernError, match="TK_ERROR_INVALID_VALUE"):
        tkern.force_variant("no_such_op", "x")


def test_dlpack_bfloat16_and_views_from_torch():
    torch = pytest.importorskip("torch")
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    for t in (base.to(torch.bfloat16), base.to(torch.float16)[1:5, 2:9], base.t(),
              base[::2, 1::3], base.to(torch.int64)):
        a = _arrays._from_dlpack(t, "x", None)
        assert a.dtype == str(t.dtype).replace("torch.", "")
        assert (a.shape, a.strides, a.ptr) == (tuple(t.shape), t.stride(), t.data_ptr())
    with pytest.raises(TypeError, match=r"argument 'x' \(torch.Tensor\) is on DLPack device"):
        tkern.gelu(base.requires_grad_(True))


# ------------------------------------------------------------------- nested tensors ------
# Each array-taking public function, called with a nested tensor n for every array argument:
# (the name of the argument it must report, the call). The first array argument is reported.
_NESTED_CALLS = {
    "gelu": ("x", lambda n: tkern.gelu(n)),
    "gelu_backward": ("grad_output", lambda n: tkern.gelu_backward(n, n)),
    "activation": ("x", lambda n: tkern.activation(n, "silu", n)),
    "activation_backward": ("grad_output", lambda n: tkern.activation_backward(n, n, "relu")),
    "glu": ("x", lambda n: tkern.glu(n)),
    "glu_backward": ("grad_output", lambda n: tkern.glu_backward(n, n)),
    "swiglu": ("x", lambda n: tkern.swiglu(n)),
    "rms_norm": ("x", lambda n: tkern.rms_norm(n, n, residual=n)),
    "rms_norm_backward": ("grad_output", lambda n: tkern.rms_norm_backward(n, n, n, n)),
    "layer_norm": ("x", lambda n: tkern.layer_norm(n, n, n)),
    "layer_norm_backward": ("grad_output", lambda n: tkern.layer_norm_backward(n, n, n, n, n)),
    "norm_backward_workspace_size": ("x", lambda n: tkern.norm_backward_workspace_size(n, "rms")),
    "softmax": ("x", lambda n: tkern.softmax(n)),
    "log_softmax": ("x", lambda n: tkern.log_softmax(n)),
    "softmax_backward": ("y", lambda n: tkern.softmax_backward(n, n)),
    "rope": ("q", lambda n: tkern.rope(n, n, n)),
    "rope_": ("q", lambda n: tkern.rope_(n, None)),
    "rope_backward": ("grad_q", lambda n: tkern.rope_backward(n, n, n)),
    "attention": ("q", lambda n: tkern.attention(n, n, n)),
    "sliding_window_attention": ("q", lambda n: tkern.sliding_window_attention(n, n, n, 15)),
    "attention_supported": ("q", lambda n: tkern.attention_supported(n, n, n)),
    "attention_backward": ("q", lambda n: tkern.attention_backward(n, n, n, n, n, n)),
    "attention_kvcache": ("q", lambda n: tkern.attention_kvcache(n, n, n, n)),
    "attention_kvcache_supported": ("q", lambda n: tkern.attention_kvcache_supported(n, n, n, n)),
    "gemm": ("a", lambda n: tkern.gemm(n, n)),
    "gemm_supported": ("a", lambda n: tkern.gemm_supported(n, n)),
}
_NO_ARRAYS = {"TkernError", "LibraryNotFoundError", "load_library", "library_path", "version",
              "device_query", "last_variant", "force_variant", "status_name"}


def _nested_rejected(fn, name):
    with pytest.raises(TypeError, match=rf"^argument '{name}' \(torch\.[\w.]+\) is a nested "
                                        r"tensor \(torch\.nested\).*strided array"):
        fn()


def _assert_every_function_rejects(n):
    for name, call in _NESTED_CALLS.values():
        _nested_rejected(lambda: call(n), name)


@pytest.fixture
def no_launch(monkeypatch):
    """Fails a test that would reach libtkern with a (fake or host) tensor's pointer."""
    def launch(fn, *args):
        raise AssertionError(f"{fn} was called")
    monkeypatch.setattr(_lib, "call", launch)
    monkeypatch.setattr(_lib, "replay", launch)


def test_nested_calls_cover_every_array_function():
    assert set(_NESTED_CALLS) | _NO_ARRAYS == set(tkern.__all__)


class _FakeDevice:
    def __init__(self, kind):
        self.type = kind


class _FakeNestedTensor:
    """What tkern sees of a torch nested tensor of strided layout (torch.nested.nested_tensor(
    ..., layout=torch.strided)): its type is the one the fake torch tables below call
    torch.Tensor and its layout is strided, so it passes plain_torch's checks, and, as in torch,
    its shape, strides and DLPack export fail inside torch."""

    __module__ = "torch"  # producer() reads the type's module
    dtype, layout, is_nested, requires_grad = "f16", "strided", True, False

    def __init__(self, cuda):
        self.is_cuda, self.device = cuda, _FakeDevice("cuda" if cuda else "cpu")

    def is_neg(self):
        return False

    def get_device(self):
        return 0 if self.is_cuda else -1

    def dim(self):
        return 3

    def data_ptr(self):
        return 0x1000

    @property
    def shape(self):
        raise RuntimeError("Internal error: NestedTensorImpl doesn't support sizes.")

    def stride(self):
        raise RuntimeError("Internal error: NestedTensorImpl doesn't support strides.")

    def __dlpack_device__(self):
        return (_arrays._KDL_CUDA if self.is_cuda else _arrays._KDL_CPU, 0)

    def __dlpack__(self, stream=None):
        raise RuntimeError("Internal error: NestedTensorImpl doesn't support sizes.")


def test_nested_tensors_are_refused_with_the_argument_named(monkeypatch, no_launch):
    """Without torch: fake torch tables in which the fake nested tensor is a plain CUDA tensor.
    Every function names the argument, whether the tensor takes the fast lane's checks and then
    the plain-tensor path (CUDA) or DLPack (host memory, the path of anything not plain)."""
    class Other:
        pass

    tables = type("Tables", (), dict(types=(_FakeNestedTensor, Other), strided="strided",
                                     dtypes={"f16": "float16"}, stream=staticmethod(lambda d: 0),
                                     device=staticmethod(lambda: 0)))()
    monkeypatch.setattr(_arrays, "_torch_state", [tables])
    cuda, host = _FakeNestedTensor(cuda=True), _FakeNestedTensor(cuda=False)
    assert _arrays.plain_torch(cuda) is not None  # what made the fast path take it
    assert _arrays.Lane().find(None, (None,), (cuda,), (1.0,)) == (None, None, None)
    for n in (cuda, host):
        _assert_every_function_rejects(n)
        _nested_rejected(lambda: _arrays.as_array(n, "x"), "x")


def test_torch_nested_tensors_are_refused_with_the_argument_named(monkeypatch, no_launch):
    """Real (CPU) torch nested tensors, of strided and jagged layout: through DLPack as they
    are, and, posing as CUDA tensors, through the fast lane and the plain-tensor path."""
    torch = pytest.importorskip("torch")
    parts = [torch.randn(2, 64, dtype=torch.float16), torch.randn(3, 64, dtype=torch.float16)]
    strided = torch.nested.nested_tensor(parts, layout=torch.strided)
    jagged = torch.nested.nested_tensor(parts, layout=torch.jagged)
    plain = torch.randn(2, 64, dtype=torch.float16)
    for n in (strided, jagged):
        _assert_every_function_rejects(n)
    # As CUDA tensors: is_cuda True, device -1 current, stream 0 (no_launch stops any launch).
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    tables = _arrays._torch()
    monkeypatch.setattr(tables, "stream", lambda device: 0)
    monkeypatch.setattr(tables, "device", lambda: -1)
    assert type(strided) is torch.Tensor and strided.layout is torch.strided
    assert _arrays.plain_torch(strided) is not None  # what made the fast path take it
    assert _arrays.Lane().find(None, (None,), (strided,), (1.0,)) == (None, None, None)
    for n in (strided, jagged):
        _assert_every_function_rejects(n)
    _nested_rejected(lambda: tkern.gelu(plain, out=strided), "out")
    _nested_rejected(lambda: tkern.gelu(strided, stream=5), "x")  # another stream: DLPack


def test_every_family_builds_parameters_the_library_accepts():
    """Each function's ctypes parameters pass the C library's full argument validation, which
    then stops at the missing device (fake host buffers must never reach a real GPU)."""
    if _has_device():
        pytest.skip("a CUDA device is present: the GPU tests cover these calls")
    F2, F4 = "<f2", "<f4"

    def f(*shape, t=F2, strides=None):
        return FakeCudaArray(shape, t, strides)

    x, y = f(8, 256), f(8, 256)
    calls = {
        "gelu": lambda: tkern.gelu(x, out=y),
        "gelu_backward": lambda: tkern.gelu_backward(x, x, "tanh", out=y),
        "activation": lambda: tkern.activation(x, "silu", bias=f(256), out=y),
        "activation_backward": lambda: tkern.activation_backward(x, x, "relu", out=y),
        "glu": lambda: tkern.glu(x, "swiglu_clamped", "interleaved", out=f(8, 128)),
        "glu_backward": lambda: tkern.glu_backward(f(8, 128), x, out=y),
        "rms_norm": lambda: tkern.rms_norm(x, f(256, t=F4), 1e-6, residual=f(8, 256), out=y),
        "layer_norm": lambda: tkern.layer_norm(x, f(256), f(256), out=y),
        "softmax": lambda: tkern.softmax(x, causal=True, causal_period=4, out=y),
        "log_softmax": lambda: tkern.log_softmax(x, out=y),
        "softmax_backward": lambda: tkern.softmax_backward(x, x, out=y),
        "rope_": lambda: tkern.rope_(f(4, 6, 8, 64), f(4, 6, 2, 64), f(4, 6, t="<i8")),
        "rope": lambda: tkern.rope(f(24, 8, 64), None, cos_sin_cache=f(100, 64, t=F4),
                                   q_out=f(24, 8, 64)),
        "rope_backward": lambda: tkern.rope_backward(f(24, 8, 64), f(24, 2, 64), inplace=True),
        "attention": lambda: tkern.attention(f(2, 64, 8, 128), f(2, 96, 2, 128),
                                             f(2, 96, 2, 128), causal=True, window=(31, 0),
                                             out=f(2, 64, 8, 128)),
        "attention bhsd": lambda: tkern.attention(f(2, 8, 64, 64), f(2, 8, 64, 64),
                                                  f(2, 8, 64, 64), layout="bhsd", softcap=30.0,
                                                  out=f(2, 8, 64, 64)),
        "sliding_window_attention": lambda: tkern.sliding_window_attention(
            f(1, 64, 4, 64), f(1, 64, 4, 64), f(1, 64, 4, 64), 15, out=f(1, 64, 4, 64)),
        "attention_kvcache": lambda: tkern.attention_kvcache(
            f(2, 1, 8, 128), f(2, 256, 2, 128), f(2, 256, 2, 128), f(2, t="<i4"),
            causal=True, return_lse=True, out=f(2, 1, 8, 128), lse=f(2, 8, 1, t=F4)),
        "attention_kvcache paged varlen append": lambda: tkern.attention_kvcache(
            f(7, 4, 64), f(9, 16, 4, 64), f(9, 16, 4, 64), f(3, t="<i4"),
            block_table=f(3, 3, t="<i4"), cu_seqlens_q=f(4, t="<i4"), max_seqlen_q=5,
            k_new=f(7, 4, 64), v_new=f(7, 4, 64), window=(15, 0), out=f(7, 4, 64)),
        "gemm": lambda: tkern.gemm(f(64, 128), f(128, 32), f(32), "gelu", out=f(64, 32)),
        "gemm W^T": lambda: tkern.gemm(f(64, 128), f(128, 32, strides=(2, 256)), c=f(64, 32, t=F4),
                                       out_dtype="float32", out=f(64, 32, t=F4)),
    }
    for what, fn in calls.items():
        with pytest.raises(tkern.TkernError) as e:
            fn()
        assert e.value.status_name == "TK_ERROR_NO_DEVICE", f"{what}: {e.value}"
    ok, reason = tkern.gemm_supported(f(64, 128), f(128, 32), out=f(64, 32))
    assert not ok and reason.startswith("TK_ERROR_NO_DEVICE"), reason


def test_every_public_function_is_documented():
    undocumented = [n for n in tkern.__all__ if not (getattr(tkern, n).__doc__ or "").strip()]
    assert not undocumented, f"public names without a docstring: {undocumented}"


# ------------------------------------------------------------- integers and params ------
def test_integers_are_range_checked_before_ctypes():
    """ctypes stores an int modulo 2**bits: approximate=2**32 + 1 would run as 1 (tanh)."""
    x, y = FakeCudaArray((8, 64)), FakeCudaArray((8, 64))
    negative = FakeCudaArray((8, 64))
    negative.__cuda_array_interface__ = dict(x.__cuda_array_interface__, data=(-16, False))
    cases = {
        "approximate' = 4294967297 does not fit the C type int":
            lambda: tkern.gelu(x, approximate=2**32 + 1, out=y),
        "kind' = -2147483649 does not fit": lambda: tkern.activation(x, -2**31 - 1, out=y),
        "style' = 4294967296": lambda: tkern.rope_(FakeCudaArray((4, 2, 64)), None,
                                                   style=2**32),
        "causal_offset' = 9223372036854775808 does not fit the C type int64_t":
            lambda: tkern.softmax(x, causal=True, causal_offset=2**63, out=y),
        "window_left' = -9223372036854775809": lambda: tkern.attention(
            *(FakeCudaArray((1, 8, 2, 64)) for _ in range(3)), window=(-2**63 - 1, 0),
            out=FakeCudaArray((1, 8, 2, 64))),
        "stream' = -1 does not fit the C type void *": lambda: tkern.gelu(x, out=y, stream=-1),
        "stream' = 18446744073709551616": lambda: tkern.gelu(x, out=y, stream=2**64),
        "status' = 4294967296": lambda: tkern.status_name(2**32),
        # What no check before the call looks at (here a pointer) is caught at the call.
        "tk_gelu_fwd's argument 3 = -16 does not fit the C type void *":
            lambda: tkern.gelu(negative, out=y),
    }
    for message, fn in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            fn()
    assert x.untouched() and y.untouched()
    with pytest.raises(TypeError, match=r"argument 'causal_period' = 2.5 is not an integer"):
        tkern.softmax(x, causal=True, causal_period=2.5, out=y)
    with pytest.raises(TypeError, match=r"argument 'window_left' = 3.5 is not an integer"):
        tkern.attention(*(FakeCudaArray((1, 8, 2, 64)) for _ in range(3)), window=(3.5, 0),
                        out=FakeCudaArray((1, 8, 2, 64)))
    with pytest.raises(ValueError, match=r"argument 'kind' = 'rmss'; accepted: 'rms', 'layer'"):
        tkern.norm_backward_workspace_size(x, "rmss")
    with pytest.raises(ValueError, match=r"argument 'weight_dtype' = 'f32'"):
        tkern.norm_backward_workspace_size(x, "rms", weight_dtype="f32")


def test_params_fields_are_range_checked():
    for cls in _lib.STRUCTS.values():
        for field, t in cls._fields_:
            base = getattr(t, "_type_", t)
            if base not in (ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p):
                continue
            bits = 32 if base is ctypes.c_int else 64
            signed = base in (ctypes.c_int, ctypes.c_int64)
            too_big = 1 << (bits - 1 if signed else bits)
            too_small = -too_big - 1 if signed else -1
            for bad in (too_big, too_small):
                value = [0] * t._length_ if hasattr(t, "_length_") else bad
                if hasattr(t, "_length_"):
                    value[-1] = bad
                with pytest.raises(ValueError, match=rf"argument '{field}(\[\d\])?' = {bad} "
                                                     "does not fit the C type"):
                    cls(**{field: value})
    p = _lib.AttentionParams(q_strides=(1, 2, 3, 4), window_left=2**63 - 1)
    assert list(p.q_strides) == [1, 2, 3, 4] and p.window_left == 2**63 - 1
    with pytest.raises(ValueError, match=r"argument 'k_strides' needs 4 values, got 3"):
        p.k_strides = (1, 2, 3)


def test_params_reject_unknown_field_names():
    for name, cls in _lib.STRUCTS.items():
        with pytest.raises(AttributeError, match=rf"\({name}\) has no field 'no_such_field'"):
            cls(no_such_field=1)
        p = cls()
        with pytest.raises(AttributeError, match="has no field 'Size'; its fields: size, "):
            p.Size = 0
        assert p.size == ctypes.sizeof(cls)
    p = _lib.SoftmaxParams()
    with pytest.raises(AttributeError, match="no field 'casual'"):
        p.casual = 1
    q = FakeCudaArray((1, 8, 2, 64))
    with pytest.raises(TypeError, match="unexpected arguments: windw"):
        tkern.attention_supported(q, q, q, windw=(1, 0))
    with pytest.raises(TypeError, match="unexpected arguments: causl"):
        tkern.attention_kvcache_supported(q, q, q, FakeCudaArray((1,), "<i4"), causl=True)


def test_attention_kvcache_argument_errors_are_the_librarys():
    """What the header's sizes say is checked by libtkern, whose message surfaces unchanged;
    the binding checks only what it alone knows: shapes against each other and int32 arrays."""
    def f(*shape, t="<f2"):
        return FakeCudaArray(shape, t)

    lens = f(2, t="<i4")
    cases = {
        ("TK_ERROR_NOT_SUPPORTED", "p->head_dim = 96 is not supported; accepted: 64, 128, 256"):
            (f(2, 1, 4, 96), f(2, 32, 2, 96), f(2, 32, 2, 96), dict(out=f(2, 1, 4, 96))),
        ("TK_ERROR_INVALID_VALUE", "p->heads_q = 3 is not a multiple of p->heads_kv = 2"):
            (f(2, 1, 3, 64), f(2, 32, 2, 64), f(2, 32, 2, 64), dict(out=f(2, 1, 3, 64))),
        ("TK_ERROR_NOT_SUPPORTED", "p->dtype = TK_F32 is not supported"):
            (f(2, 1, 4, 64, t="<f4"), f(2, 32, 2, 64, t="<f4"), f(2, 32, 2, 64, t="<f4"),
             dict(out=f(2, 1, 4, 64, t="<f4"))),
    }
    for (status, message), (q, k, v, kw) in cases.items():
        with pytest.raises(tkern.TkernError) as e:
            tkern.attention_kvcache(q, k, v, lens, **kw)
        assert e.value.status_name == status and message in e.value.message, str(e.value)
        ok, reason = tkern.attention_kvcache_supported(q, k, v, lens, **kw)
        assert not ok and reason.startswith(status + ": ") and message in reason, reason
    q, k, out = f(2, 1, 4, 64), f(2, 32, 2, 64), f(2, 1, 4, 64)
    binding = {
        "argument 'cache_seqlens' has dtype int64": lambda: tkern.attention_kvcache(
            q, k, k, f(2, t="<i8"), out=out),
        r"argument 'cache_seqlens' has shape \(3,\), expected \(2,\)":
            lambda: tkern.attention_kvcache(q, k, k, f(3, t="<i4"), out=out),
        r"argument 'v_cache' has shape \(2, 16, 2, 64\)": lambda: tkern.attention_kvcache(
            q, k, f(2, 16, 2, 64), lens, out=out),
        r"argument 'k_new' has shape \(2, 1, 4, 64\), expected \(2, 1, 2, 64\)":
            lambda: tkern.attention_kvcache(q, k, k, lens, k_new=q, v_new=q, out=out),
        "argument 'q' must be 3-D": lambda: tkern.attention_kvcache(
            q, k, k, lens, cu_seqlens_q=f(3, t="<i4"), out=out),
        r"argument 'block_table' must be \[batch = 2": lambda: tkern.attention_kvcache(
            q, k, k, lens, block_table=f(3, 4, t="<i4"), out=out),
    }
    for message, fn in binding.items():
        with pytest.raises((TypeError, ValueError), match=message):
            fn()


# ------------------------------------------------------------- lifetimes on streams -----
def test_cuda_runtime_is_found_through_libtkern():
    """The events that keep non-torch arrays alive come from the CUDA runtime libtkern links."""
    rt = _lifetime.runtime()
    assert set(_lifetime._RUNTIME_SIGNATURES) <= set(rt)


class FakeRuntime:
    """The CUDA calls of tkern._lifetime, with events that complete when told."""

    def __init__(self):
        self.done, self.destroyed, self.recorded, self.capturing = set(), [], [], False
        self.next_event = 1

        def create(pevent, flags):
            pevent._obj.value, self.next_event = self.next_event, self.next_event + 1
            return 0

        def is_capturing(stream, pstatus):
            pstatus._obj.value = int(self.capturing)
            return 0

        self.fns = {
            "cudaEventCreateWithFlags": create,
            "cudaEventRecord": lambda e, s: self.recorded.append((e.value, s)) or 0,
            "cuEventQuery": lambda e: 0 if e.value in self.done else 600,
            "cudaEventDestroy": lambda e: self.destroyed.append(e.value) or 0,
            "cudaStreamIsCapturing": is_capturing,
            "cudaStreamSynchronize": lambda s: 0,
            "cudaThreadExchangeStreamCaptureMode": lambda pmode: 0,
        }


@pytest.fixture
def fake_launch(monkeypatch):
    """A fake CUDA runtime for tkern._lifetime, and libtkern calls that succeed without a
    device (the launch is what is faked: everything before it is the binding's own code)."""
    rt = FakeRuntime()
    monkeypatch.setattr(_lifetime, "_runtime_fns", rt.fns)
    monkeypatch.setattr(_lifetime, "_pending", [])
    monkeypatch.setattr(_lib, "call", lambda name, *args: None)
    return rt


def test_arrays_used_on_an_explicit_stream_are_held_until_its_event_completes(fake_launch):
    import weakref
    rt = fake_launch
    x, y = FakeCudaArray((8, 64)), FakeCudaArray((8, 64))
    alive = [weakref.ref(x), weakref.ref(y)]
    tkern.gelu(x, out=y, stream=0x1234)
    assert rt.recorded == [(1, 0x1234)] and len(_lifetime._pending) == 1
    del x, y
    assert all(r() is not None for r in alive), "released while the kernel may still run"
    tkern.gelu(FakeCudaArray((8, 64)), out=FakeCudaArray((8, 64)))  # event 1 not complete
    assert all(r() is not None for r in alive) and rt.destroyed == []
    rt.done.add(1)
    tkern.gelu(FakeCudaArray((8, 64)), out=FakeCudaArray((8, 64)))  # implicit: none held
    assert all(r() is None for r in alive), "still held after the event completed"
    assert rt.destroyed == [1] and _lifetime._pending == [] and len(rt.recorded) == 1


def test_nothing_is_held_without_a_launch_or_under_capture(fake_launch, monkeypatch):
    rt = fake_launch
    x, y = FakeCudaArray((8, 64)), FakeCudaArray((8, 64))
    rt.capturing = True
    tkern.gelu(x, out=y, stream=7)
    assert rt.recorded == [] and _lifetime._pending == []
    rt.capturing = False

    def fail(status):
        def call(name, *args):
            raise _lib.TkernError(_lib.STATUS[status], status, name, "failed")
        return call

    monkeypatch.setattr(_lib, "call", fail("TK_ERROR_INVALID_VALUE"))
    with pytest.raises(tkern.TkernError):
        tkern.gelu(x, out=y, stream=7)
    assert _lifetime._pending == []
    # After a CUDA error a launch may have been queued before it: held all the same.
    monkeypatch.setattr(_lib, "call", fail("TK_ERROR_CUDA"))
    with pytest.raises(tkern.TkernError):
        tkern.gelu(x, out=y, stream=7)
    assert len(_lifetime._pending) == 1


# ------------------------------------------------------------- cached checked params ----
def test_checked_params_are_cached_and_errors_never_are(fake_launch, monkeypatch):
    """A call whose checks passed leaves its params for the next call with the same scalars and
    array layouts, which then passes the library the same struct with its own pointers; a call
    that failed a check leaves nothing, and a scalar that could change (a non-plain object)
    disables the cache."""
    from tkern import _attention, _gemm

    monkeypatch.setattr(_gemm._PLANS, "_plans", {})
    monkeypatch.setattr(_attention._PLANS, "_plans", {})
    calls = []
    monkeypatch.setattr(_lib, "call", lambda name, *args: calls.append(
        {f: getattr(args[0]._obj, f) for f, _ in args[0]._obj._fields_}))

    def gemm(alpha=1.0, b=(128, 32)):
        a, bb, out = FakeCudaArray((64, 128)), FakeCudaArray(b), FakeCudaArray((64, 32))
        tkern.gemm(a, bb, activation="gelu", alpha=alpha, out=out)
        return {"a": ctypes.addressof(a.buffer), "b": ctypes.addressof(bb.buffer),
                "d": ctypes.addressof(out.buffer)}

    first = gemm()
    assert len(_gemm._PLANS._plans) == 1
    second = gemm()
    assert len(_gemm._PLANS._plans) == 1 and len(calls) == 2
    for call, ptrs in zip(calls, (first, second)):
        assert {k: call[k] for k in ptrs} == ptrs
    assert {k: v for k, v in calls[0].items() if k not in first} == \
        {k: v for k, v in calls[1].items() if k not in first}
    gemm(alpha=-0.0)
    assert len(_gemm._PLANS._plans) == 2 and str(calls[-1]["alpha"]) == "-0.0"
    for _ in range(2):  # a failed check is never cached
        with pytest.raises(ValueError, match="do not chain"):
            gemm(b=(100, 32))
    assert len(_gemm._PLANS._plans) == 2

    class Scale(float):
        pass

    q = FakeCudaArray((1, 8, 2, 64))
    tkern.attention(q, q, q, scale=Scale(0.5), out=FakeCudaArray((1, 8, 2, 64)))
    assert not _attention._PLANS._plans and calls[-1]["softmax_scale"] == 0.5
    tkern.attention(q, q, q, window=(3, 0), out=FakeCudaArray((1, 8, 2, 64)))
    assert len(_attention._PLANS._plans) == 1 and calls[-1]["window_left"] == 3


def test_scalar_keys_tell_apart_what_a_call_could_tell_apart():
    """The key of a call's scalar arguments (Plans and the fast lane) holds each value's type and
    each float's sign, and refuses anything that could change between calls."""
    key = _arrays._scalars_key
    assert key((1e-6, False, None, "swiglu", (3, None), 7)) is not None
    assert key((1e-6, False)) == key((1e-6, False))
    assert key((0.0,)) != key((-0.0,))          # alpha=-0.0 is not alpha=0.0
    assert len({key((1,)), key((True,)), key((1.0,))}) == 3  # equal values, other types
    assert key(((1, None),)) != key(((1, 2),))
    assert key((object(),)) is None               # mutable or unknown: never keyed
    assert key(((True, None),)) is None           # a tuple holds ints and None only
    assert key(([3, None],)) is None


def test_lane_scalar_key_memo_goes_by_identity():
    """A lane reuses the last call's scalar key only for the very same objects: equal values of
    another type or sign get their own key, and a scalar that could change is never keyed."""
    key, lane = _arrays._scalars_key, _arrays.Lane()
    one = (1e-6, "neox", None, 0, (3, None))
    assert lane._values(one) == key(one)
    assert lane._values(one) is lane._values(one)  # the memo
    equal = (float("1e-6"), "".join(("ne", "ox")), None, 0, tuple([3, None]))
    assert equal[0] is not one[0] and equal[1] is not one[1]
    assert lane._values(equal) == key(equal)
    for a, b in (((0.0,), (-0.0,)), ((1,), (True,)), ((1,), (1.0,)), ((2.5, 1), (2.5, 1.0))):
        assert lane._values(a) == key(a) and lane._values(b) == key(b) != key(a)
    assert lane._values((0.0, 1)) == key((0.0, 1))
    assert lane._values((0.0,)) == key((0.0,))  # a shorter tuple than the memo's
    scale = type("Scale", (), {})()
    assert lane._values((scale,)) is None
    assert lane._values((scale,)) is None  # not memoized
    assert lane._values(([3, None],)) is None
