"""RMSNorm and LayerNorm: tk_rmsnorm_*, tk_layernorm_*, tk_norm_bwd_workspace_size."""

import ctypes

from . import _lib
from ._arrays import FLOATS, Call, Lane, Plans, enum, ptr


def _params(c, eps, gemma, weight_names):
    xa = c["x"].check_dtype(FLOATS)
    if xa.ndim == 0:
        raise ValueError("argument 'x' must have at least one dimension")
    rows, cols, stride = xa.rows()
    wdtype = xa.dtype
    for name in weight_names:
        wa = c.get(name)
        if wa is not None:
            wa.check_dtype((xa.dtype, "float32")).check_shape((cols,)).check_contiguous()
            wdtype = wa.dtype
    dtypes = {c[n].dtype for n in weight_names if c.get(n) is not None}
    if len(dtypes) > 1:
        raise TypeError(f"arguments {', '.join(repr(n) for n in weight_names)} must share one "
                        f"dtype, got {sorted(dtypes)}")
    p = _lib.NormParams(dtype=_lib.DTYPES[xa.dtype], weight_dtype=_lib.DTYPES[wdtype], rows=rows,
                        cols=cols, x_row_stride=stride, eps=eps, gemma=int(bool(gemma)))
    return xa, p, wdtype


def _residual(c, xa, p):
    ra = c.get("residual")
    if ra is not None:
        ra.check_dtype((xa.dtype,)).check_shape(xa.shape)
        p.residual_row_stride = ra.rows()[2]
    return ra


def _out_rows(c, name, obj, xa, p):
    obj, oa = (c.output(name, None, xa.shape, xa.dtype) if obj is None
               else (obj, c[name].check_shape(xa.shape).check_dtype((xa.dtype,))))
    p.y_row_stride = oa.rows()[2]
    return obj, oa


def _stat(c, name, xa, wanted):
    if not wanted:
        return None, None
    return c.output(name, None, xa.shape[:-1], "float32")


def rms_norm(x, weight=None, eps=1e-6, residual=None, *, gemma=False, out=None,
             return_rstd=False, stream=None):
    """RMSNorm over the last dimension, like torch.nn.functional.rms_norm(x, (n,), weight, eps).

    y = h / sqrt(mean(h^2) + eps) * w, with h = x, or h = x + residual when residual is given:
    then residual is updated in place to h (vLLM's fused_add_rms_norm). gemma=True scales by
    (1 + weight). x, residual, out: [..., n] float32/float16/bfloat16, last dimension
    contiguous, rows may be strided; weight: [n] of x's dtype or float32 (None: 1).
    Returns y, or (y, rstd) with return_rstd (rstd: float32 [...], for rms_norm_backward).
    """
    plan, s, lane_key = _RMS_LANE.find(stream, (out,), (x, weight, residual),
                                       (eps, gemma, return_rstd))
    if plan is not None:  # a replay (see Lane); pointers read inline: this is the hot path
        params, new_y, new_stat = plan
        y = new_y(x)
        rstd = new_stat(x) if return_rstd else None
        _lib.replay("tk_rmsnorm_fwd", params, x.data_ptr(),
                    0 if residual is None else residual.data_ptr(),
                    0 if weight is None else weight.data_ptr(), y.data_ptr(),
                    0 if rstd is None else rstd.data_ptr(), s)
        return (y, rstd) if return_rstd else y
    c = Call(stream, x=x, weight=weight, residual=residual, out=out)
    key = Plans.key(c, eps, gemma)
    p = _RMS_PLANS.get(key)
    if p is None:
        xa, p, _ = _params(c, eps, gemma, ("weight",))
        _residual(c, xa, p)
        out, oa = _out_rows(c, "out", out, xa, p)
        _RMS_PLANS.put(key, p)
    else:
        xa, out, oa = _planned_out(c, out)
    rstd, sa = _stat(c, "rstd", xa, return_rstd)
    c.run("tk_rmsnorm_fwd", _lib.byref(p), xa.ptr, ptr(c.get("residual")),
          ptr(c.get("weight")), oa.ptr, ptr(sa), c.stream)
    if lane_key is not None:
        _RMS_LANE.put(lane_key, _lane_plan(p, x, xa, return_rstd))
    return (out, rstd) if return_rstd else out


# Checked params of the forward calls (see Plans) and their replays (see Lane).
_RMS_PLANS, _LAYER_PLANS = Plans(), Plans()
_RMS_LANE, _LAYER_LANE = Lane(), Lane()


def _lane_plan(p, x, xa, stats):
    """The plan of a forward call (see Lane): params p (no pointers in it) as passed, and the
    allocators of y and of the statistics (None without them)."""
    return (_lib.byref(p), Lane.allocator(x, x.shape, xa.dtype),
            Lane.allocator(x, xa.shape[:-1], "float32") if stats else None)


def _planned_out(c, out):
    """x's Array and the output of a forward call whose arguments were checked before."""
    xa = c["x"]
    if out is None:
        return (xa,) + c.output("out", None, xa.shape, xa.dtype)
    return xa, out, c["out"]


def layer_norm(x, weight=None, bias=None, eps=1e-5, residual=None, *, out=None,
               return_stats=False, stream=None):
    """LayerNorm over the last dimension, like torch.nn.functional.layer_norm(x, (n,), weight,
    bias, eps): y = (h - mean) / sqrt(var + eps) * w + b (biased variance).

    residual (optional) is added first and updated in place to h = x + residual. Dtypes and
    layouts as rms_norm; bias has weight's dtype. Returns y, or (y, mean, rstd) with
    return_stats (float32 [...], for layer_norm_backward).
    """
    plan, s, lane_key = _LAYER_LANE.find(stream, (out,), (x, weight, bias, residual),
                                         (eps, return_stats))
    if plan is not None:  # a replay, as in rms_norm
        params, new_y, new_stat = plan
        y = new_y(x)
        mean, rstd = (new_stat(x), new_stat(x)) if return_stats else (None, None)
        _lib.replay("tk_layernorm_fwd", params, x.data_ptr(),
                    0 if residual is None else residual.data_ptr(),
                    0 if weight is None else weight.data_ptr(),
                    0 if bias is None else bias.data_ptr(), y.data_ptr(),
                    0 if mean is None else mean.data_ptr(),
                    0 if rstd is None else rstd.data_ptr(), s)
        return (y, mean, rstd) if return_stats else y
    c = Call(stream, x=x, weight=weight, bias=bias, residual=residual, out=out)
    key = Plans.key(c, eps)
    p = _LAYER_PLANS.get(key)
    if p is None:
        xa, p, _ = _params(c, eps, False, ("weight", "bias"))
        _residual(c, xa, p)
        out, oa = _out_rows(c, "out", out, xa, p)
        _LAYER_PLANS.put(key, p)
    else:
        xa, out, oa = _planned_out(c, out)
    mean, ma = _stat(c, "mean", xa, return_stats)
    rstd, sa = _stat(c, "rstd", xa, return_stats)
    c.run("tk_layernorm_fwd", _lib.byref(p), xa.ptr, ptr(c.get("residual")),
          ptr(c.get("weight")), ptr(c.get("bias")), oa.ptr, ptr(ma), ptr(sa), c.stream)
    if lane_key is not None:
        _LAYER_LANE.put(lane_key, _lane_plan(p, x, xa, return_stats))
    return (out, mean, rstd) if return_stats else out


def norm_backward_workspace_size(x, kind, weight_dtype=None):
    """Bytes of workspace tk_rmsnorm_bwd (kind "rms") or tk_layernorm_bwd ("layer") needs for
    x's shape ([..., n]) to compute the weight / bias gradients. weight_dtype: a dtype name
    (default: x's dtype). Needs no device."""
    c = Call(None, x=x)
    xa = c["x"].check_dtype(FLOATS)
    rows, cols, stride = xa.rows()
    p = _lib.NormParams(dtype=_lib.DTYPES[xa.dtype],
                        weight_dtype=enum(_lib.DTYPES, weight_dtype or xa.dtype, "weight_dtype"),
                        rows=rows, cols=cols, x_row_stride=stride)
    return _workspace_bytes(p, kind)


def _workspace_bytes(p, kind):
    n = ctypes.c_size_t(0)
    _lib.call("tk_norm_bwd_workspace_size", _lib.byref(p), enum(_lib.NORM_KINDS, kind, "kind"),
              _lib.byref(n))
    return n.value


def _backward(c, p, xa, kind, grads):
    """Allocates dx and the requested parameter gradients and the workspace; returns them."""
    ga = c["grad_output"].check_dtype((xa.dtype,)).check_shape(xa.shape)
    p.y_row_stride = ga.rows()[2]
    for name in ("rstd", "mean"):
        sa = c.get(name)
        if sa is not None:
            sa.check_dtype(("float32",)).check_shape(xa.shape[:-1]).check_contiguous()
    dx, dxa = c.output("dx", None, xa.shape, xa.dtype)
    if dxa.rows()[2] != p.x_row_stride:
        raise ValueError("argument 'x' has strided rows; the backward pass writes dx with x's "
                         "row stride, so pass a contiguous x")
    wdtype = [k for k, v in _lib.DTYPES.items() if v == p.weight_dtype][0]
    outs = [c.output(name, None, (p.cols,), wdtype) if want else (None, None)
            for name, want in grads]
    ws, wsa = None, None
    if any(want for _, want in grads):
        ws, wsa = c.output("workspace", None, (max(_workspace_bytes(p, kind), 1),), "uint8")
    return ga, dx, dxa, outs, ws, wsa


def rms_norm_backward(grad_output, x, rstd, weight=None, *, gemma=False, weight_grad=True,
                      stream=None):
    """Gradients of rms_norm: returns (dx, dweight).

    x is the forward's normalised input (h, with a fused residual) and rstd its float32 [...]
    statistic (rms_norm(..., return_rstd=True)). dweight (weight's dtype, or x's without a
    weight) is computed when weight_grad, deterministically; else it is None.
    """
    c = Call(stream, grad_output=grad_output, x=x, rstd=rstd, weight=weight)
    xa, p, _ = _params(c, 1e-6, gemma, ("weight",))
    ga, dx, dxa, outs, ws, wsa = _backward(c, p, xa, "rms", [("dweight", weight_grad)])
    (dw, dwa), = outs
    c.run("tk_rmsnorm_bwd", _lib.byref(p), ga.ptr, xa.ptr, ptr(c.get("weight")), c["rstd"].ptr,
          dxa.ptr, ptr(dwa), ptr(wsa), wsa.numel if wsa else 0, c.stream)
    return dx, dw


def layer_norm_backward(grad_output, x, mean, rstd, weight=None, *, weight_grad=True,
                        bias_grad=True, stream=None):
    """Gradients of layer_norm: returns (dx, dweight, dbias).

    mean and rstd are the forward's float32 statistics (layer_norm(..., return_stats=True)).
    dweight / dbias (weight's dtype, or x's) are computed when weight_grad / bias_grad, else
    None.
    """
    c = Call(stream, grad_output=grad_output, x=x, mean=mean, rstd=rstd, weight=weight)
    xa, p, _ = _params(c, 1e-5, False, ("weight",))
    ga, dx, dxa, outs, ws, wsa = _backward(c, p, xa, "layer",
                                           [("dweight", weight_grad), ("dbias", bias_grad)])
    (dw, dwa), (db, dba) = outs
    c.run("tk_layernorm_bwd", _lib.byref(p), ga.ptr, xa.ptr, ptr(c.get("weight")),
          c["mean"].ptr, c["rstd"].ptr, dxa.ptr, ptr(dwa), ptr(dba), ptr(wsa),
          wsa.numel if wsa else 0, c.stream)
    return dx, dw, db
