"""Softmax and log-softmax over rows: tk_softmax_fwd, tk_softmax_bwd."""

from . import _lib
from ._arrays import FLOATS, Call, Lane, Plans


def _params(c, name, dim, scale, log, causal, causal_offset, causal_period):
    a = c[name].check_dtype(FLOATS)
    if a.ndim == 0:
        raise ValueError(f"argument '{name}' must have at least one dimension")
    if dim not in (-1, a.ndim - 1):
        raise ValueError(f"argument 'dim' = {dim}: libtkern reduces over the last dimension "
                         "only (dim=-1); move the dimension last first")
    rows, cols, stride = a.rows()
    p = _lib.SoftmaxParams(dtype=_lib.DTYPES[a.dtype], rows=rows, cols=cols, scale=scale,
                           log=int(bool(log)), causal=int(bool(causal)),
                           causal_offset=causal_offset, causal_period=causal_period)
    return a, p, stride


_PLANS, _LANE = Plans(), Lane()


def _forward(x, dim, scale, log, causal, causal_offset, causal_period, out, stream):
    lane, s, lane_key = _LANE.find(stream, (out,), (x,),
                                   (dim, scale, log, causal, causal_offset, causal_period))
    if lane is not None:
        params, new_y = lane
        y = new_y(x)
        _lib.replay("tk_softmax_fwd", params, x.data_ptr(), y.data_ptr(), s)
        return y
    c = Call(stream, x=x, out=out)
    key = Plans.key(c, dim, scale, log, causal, causal_offset, causal_period)
    p = _PLANS.get(key)
    if p is None:
        xa, p, xstride = _params(c, "x", dim, scale, log, causal, causal_offset, causal_period)
        p.x_row_stride = xstride
        out, oa = (c.output("out", None, xa.shape, xa.dtype) if out is None
                   else (out, c["out"].check_shape(xa.shape).check_dtype((xa.dtype,))))
        p.y_row_stride = oa.rows()[2]
        _PLANS.put(key, p)
    else:  # checked before for this key: only the output is new
        xa = c["x"]
        out, oa = c.output("out", None, xa.shape, xa.dtype) if out is None else (out, c["out"])
    c.run("tk_softmax_fwd", _lib.byref(p), xa.ptr, oa.ptr, c.stream)
    if lane_key is not None:
        _LANE.put(lane_key, (_lib.byref(p), Lane.allocator(x, x.shape, xa.dtype)))
    return out


def softmax(x, dim=-1, *, scale=1.0, causal=False, causal_offset=0, causal_period=0, out=None,
            stream=None):
    """Softmax over the last dimension of softmax(scale * x), like torch.softmax(x * scale, -1).

    x: [..., n] float32/float16/bfloat16, last dimension contiguous, rows may be strided.
    causal=True masks column c of row r unless c <= r % causal_period + causal_offset
    (causal_period 0 = all rows form one matrix); masked entries become 0. For attention
    scores [B, H, Sq, Sk]: causal_period = Sq, causal_offset = Sk - Sq (bottom-right) or 0
    (top-left, PyTorch's is_causal). out: optional, x's shape and dtype (out=x in place).
    Returns out.
    """
    return _forward(x, dim, scale, False, causal, causal_offset, causal_period, out, stream)


def log_softmax(x, dim=-1, *, scale=1.0, causal=False, causal_offset=0, causal_period=0,
                out=None, stream=None):
    """Log-softmax over the last dimension, like torch.log_softmax(x * scale, -1); masked
    entries (see softmax) become -inf. Returns out."""
    return _forward(x, dim, scale, True, causal, causal_offset, causal_period, out, stream)


def softmax_backward(y, grad_output, *, log=False, scale=1.0, causal=False, causal_offset=0,
                     causal_period=0, out=None, stream=None):
    """Gradient of softmax (log=False) or log_softmax (log=True) with respect to x, from the
    forward output y and grad_output (same shape, dtype and row stride as y), with the forward's
    scale and mask. out (may be y or grad_output) is allocated when None. Returns out."""
    c = Call(stream, y=y, grad_output=grad_output, out=out)
    ya, p, ystride = _params(c, "y", -1, scale, log, causal, causal_offset, causal_period)
    ga = c["grad_output"].check_dtype((ya.dtype,)).check_shape(ya.shape)
    if ga.rows()[2] != ystride:
        raise ValueError(f"argument 'grad_output' must have y's row stride {ystride}, but has "
                         f"{ga.describe()}")
    p.y_row_stride = ystride
    out, oa = (c.output("out", None, ya.shape, ya.dtype) if out is None
               else (out, c["out"].check_shape(ya.shape).check_dtype((ya.dtype,))))
    p.x_row_stride = oa.rows()[2]
    c.run("tk_softmax_bwd", _lib.byref(p), ya.ptr, ga.ptr, oa.ptr, c.stream)
    return out
