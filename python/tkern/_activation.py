"""Activations and gated linear units: tk_activation_*, tk_gelu_*, tk_glu_*."""

from . import _lib
from ._arrays import FLOATS, Call, Lane, Plans, enum, ptr

_ACT_ALIASES = {**_lib.ACTIVATIONS, "identity": 0, "gelu_erf": 1, "swish": 4, "relu2": 6}
_GLU_ALIASES = {**_lib.GLU_KINDS, "geglu_erf": 1}


def activation_kind(kind, name="kind"):
    """The tk_activation number of `kind` (a name such as "silu", None for identity, or an
    int)."""
    return 0 if kind is None else enum(_ACT_ALIASES, kind, name)


def gelu(x, approximate="none", *, out=None, stream=None):
    """GELU of a contiguous CUDA array, like torch.nn.functional.gelu.

    approximate: "none" (erf form) or "tanh". x: float32, float16 or bfloat16, any shape,
    contiguous. out: optional output of x's shape and dtype (out=x works in place); allocated
    through x's library when None. stream: a stream handle or object; default: the current
    stream of x's library. Returns out.
    """
    plan, s, key = _GELU_LANE.find(stream, (out,), (x,), (approximate,))
    if plan is not None:
        mode, dtype, n, new_y = plan
        y = new_y(x)
        _lib.replay("tk_gelu_fwd", mode, dtype, x.data_ptr(), y.data_ptr(), n, s)
        return y
    c = Call(stream, x=x, out=out)
    xa = c["x"].check_dtype(FLOATS).check_contiguous()
    mode = enum(_lib.GELU_APPROXIMATIONS, approximate, "approximate")
    dtype, n = _lib.DTYPES[xa.dtype], xa.numel
    out, oa = c.output("out", out, xa.shape, xa.dtype)
    c.run("tk_gelu_fwd", mode, dtype, xa.ptr, oa.ptr, n, c.stream)
    if key is not None:
        _GELU_LANE.put(key, (mode, dtype, n, Lane.allocator(x, x.shape, xa.dtype)))
    return out


_GELU_LANE = Lane()


def gelu_backward(grad_output, x, approximate="none", *, out=None, stream=None):
    """Gradient of gelu with respect to x: grad_output * gelu'(x) (aten's gelu_backward).

    grad_output and x: same shape and float dtype, contiguous. out may alias either. Returns the
    gradient (out).
    """
    c = Call(stream, grad_output=grad_output, x=x, out=out)
    xa = c["x"].check_dtype(FLOATS).check_contiguous()
    ga = c["grad_output"].check_dtype((xa.dtype,)).check_shape(xa.shape).check_contiguous()
    mode = enum(_lib.GELU_APPROXIMATIONS, approximate, "approximate")
    out, oa = c.output("out", out, xa.shape, xa.dtype)
    c.run("tk_gelu_bwd", mode, _lib.DTYPES[xa.dtype], ga.ptr, xa.ptr, oa.ptr, xa.numel, c.stream)
    return out


def _act_shape(c, x_name):
    xa = c[x_name].check_dtype(FLOATS).check_contiguous()
    cols = xa.shape[-1] if xa.ndim else 1
    rows = xa.numel // cols if cols else 0
    ba = c.get("bias")
    if ba is not None:
        ba.check_dtype((xa.dtype,)).check_shape((cols,)).check_contiguous()
    return xa, ba, rows, cols


def activation(x, kind, bias=None, *, out=None, stream=None):
    """out = f(x + bias) over the last dimension of a contiguous CUDA array.

    kind: "none" (a bias add), "gelu" (erf), "gelu_tanh", "quick_gelu", "silu", "relu",
    "relu_squared" (or the tk_activation number). bias: optional [x.shape[-1]] array of x's
    dtype. out: optional, x's shape and dtype; out=x is in place. Returns out.
    """
    c = Call(stream, x=x, bias=bias, out=out)
    xa, ba, rows, cols = _act_shape(c, "x")
    k = activation_kind(kind)
    out, oa = c.output("out", out, xa.shape, xa.dtype)
    c.run("tk_activation_fwd", k, _lib.DTYPES[xa.dtype], xa.ptr, ptr(ba), oa.ptr, rows, cols,
          c.stream)
    return out


def activation_backward(grad_output, x, kind, bias=None, *, out=None, stream=None):
    """Gradient of activation(x, kind, bias) with respect to x: grad_output * f'(x + bias).

    (The bias gradient is this result summed over rows.) Shapes and dtypes as activation;
    out may alias grad_output or x. Returns out.
    """
    c = Call(stream, grad_output=grad_output, x=x, bias=bias, out=out)
    xa, ba, rows, cols = _act_shape(c, "x")
    ga = c["grad_output"].check_dtype((xa.dtype,)).check_shape(xa.shape).check_contiguous()
    k = activation_kind(kind)
    out, oa = c.output("out", out, xa.shape, xa.dtype)
    c.run("tk_activation_bwd", k, _lib.DTYPES[xa.dtype], ga.ptr, xa.ptr, ptr(ba), oa.ptr, rows,
          cols, c.stream)
    return out


def _glu_params(c, kind, layout, alpha, limit):
    xa = c["x"].check_dtype(FLOATS)
    if xa.ndim == 0 or xa.shape[-1] % 2:
        raise ValueError(f"argument 'x' must have an even last dimension (2 * d), but has "
                         f"shape {xa.shape}")
    rows, width, stride = xa.rows()
    p = _lib.GluParams(kind=enum(_GLU_ALIASES, kind, "kind"), dtype=_lib.DTYPES[xa.dtype],
                       layout=enum(_lib.GLU_LAYOUTS, layout, "layout"), rows=rows, d=width // 2,
                       x_row_stride=stride, alpha=alpha, limit=limit)
    return xa, p


def glu(x, kind="swiglu", layout="gate_first", *, alpha=1.702, limit=7.0, out=None,
        stream=None):
    """Gated linear unit over the last dimension: out[..., j] = act(gate[..., j]) * up[..., j].

    x: [..., 2 * d], float dtype; the last dimension contiguous, leading dimensions may be
    strided (e.g. a column slice of a wider buffer). kind: "swiglu" (silu), "geglu" (erf GELU),
    "geglu_tanh", "reglu", "swiglu_clamped" (GPT-OSS, uses alpha and limit). layout:
    "gate_first" ([gate | up]), "up_first" ([up | gate]) or "interleaved" (gate at even, up at
    odd positions). out: [..., d] of x's dtype (rows may be strided), allocated when None.
    Returns out.
    """
    lane, s, lane_key = _GLU_LANE.find(stream, (out,), (x,), (kind, layout, alpha, limit))
    if lane is not None:
        params, new_y = lane
        y = new_y(x)
        _lib.replay("tk_glu_fwd", params, x.data_ptr(), y.data_ptr(), s)
        return y
    c = Call(stream, x=x, out=out)
    key = Plans.key(c, kind, layout, alpha, limit)
    p = _GLU_PLANS.get(key)
    if p is None:
        xa, p = _glu_params(c, kind, layout, alpha, limit)
        out_shape = xa.shape[:-1] + (p.d,)
        if out is None:
            out, oa = c.output("out", None, out_shape, xa.dtype)
        else:
            oa = c["out"].check_shape(out_shape).check_dtype((xa.dtype,))
        p.y_row_stride = oa.rows()[2]
        _GLU_PLANS.put(key, p)
    else:  # checked before for this key: only the output is new
        xa = c["x"]
        out, oa = (c.output("out", None, xa.shape[:-1] + (p.d,), xa.dtype) if out is None
                   else (out, c["out"]))
    c.run("tk_glu_fwd", _lib.byref(p), xa.ptr, oa.ptr, c.stream)
    if lane_key is not None:
        _GLU_LANE.put(lane_key, (_lib.byref(p), Lane.allocator(x, oa.shape, xa.dtype)))
    return out


_GLU_PLANS, _GLU_LANE = Plans(), Lane()


def swiglu(x, *, out=None, stream=None):
    """SwiGLU: silu(x[..., :d]) * x[..., d:] for x of shape [..., 2 * d] (glu with kind
    "swiglu", layout "gate_first"). Returns an array of shape [..., d]."""
    return glu(x, "swiglu", "gate_first", out=out, stream=stream)


def glu_backward(grad_output, x, kind="swiglu", layout="gate_first", *, alpha=1.702,
                 limit=7.0, out=None, stream=None):
    """Gradient of glu with respect to x: an array laid out like x ([..., 2 * d]) from
    grad_output ([..., d]) and x. out (x's shape and dtype, may be x itself) is allocated when
    None; its row stride must equal x's. Returns out."""
    c = Call(stream, grad_output=grad_output, x=x, out=out)
    xa, p = _glu_params(c, kind, layout, alpha, limit)
    ga = c["grad_output"].check_dtype((xa.dtype,)).check_shape(xa.shape[:-1] + (p.d,))
    p.y_row_stride = ga.rows()[2]
    if out is None:
        out, oa = c.output("out", None, xa.shape, xa.dtype)
        if oa.rows()[2] != p.x_row_stride:
            raise ValueError("argument 'x' has strided rows; tk_glu_bwd writes the gradient with "
                             "x's row stride: pass 'out' with the same layout as x (or x itself)")
    else:
        oa = c["out"].check_shape(xa.shape).check_dtype((xa.dtype,))
        if oa.rows()[2] != p.x_row_stride:
            raise ValueError(f"argument 'out' must have x's row stride {p.x_row_stride}, but "
                             f"has {oa.describe()}")
    c.run("tk_glu_bwd", _lib.byref(p), ga.ptr, xa.ptr, oa.ptr, c.stream)
    return out
