"""torch.autograd.Function wrappers of the libtkern kernels, to train with them.

    import tkern.autograd as tka
    y, h = tka.rms_norm(x, weight, 1e-6, residual=res)   # h = x + res, a new tensor
    out = tka.gemm(y, W.t(), bias, activation="gelu")    # = F.gelu(F.linear(y, W, bias))

Each forward is the tkern function; each backward is libtkern's backward kernel (rms_norm,
layer_norm, activation / gelu, glu, softmax / log_softmax, rope, attention) or, for gemm,
tk_gemm calls and the activation backward.

This module imports torch (the core tkern package never does) and takes torch tensors only.
Differences from the plain functions: the fused residual is not updated in place (autograd
tracks no in-place change of an input): rms_norm and layer_norm return (y, h) with h = x +
residual a new tensor; RoPE angles from a cos / sin cache are constants (no gradient flows to
the cache).
"""

import torch

from . import _activation, _attention, _attention_bwd, _gemm, _norm, _rope, _softmax

__all__ = ["rms_norm", "layer_norm", "activation", "gelu", "glu", "softmax", "log_softmax",
           "rope", "gemm", "attention"]


def _contiguous(t):
    return None if t is None else t.contiguous()


def _sum_rows(t, like):
    """t summed over every dimension but the last, in float32, as like's dtype."""
    return t.reshape(-1, t.shape[-1]).float().sum(0).to(like.dtype)


# ------------------------------------------------------------------------------ norms -------
class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps, gemma):
        h = None if residual is None else residual.clone()  # becomes x + residual
        y, rstd = _norm.rms_norm(x, weight, eps, residual=h, gemma=gemma, return_rstd=True)
        ctx.save_for_backward(x if h is None else h, weight, rstd)
        ctx.gemma, ctx.fused = gemma, h is not None
        return (y, h) if h is not None else y

    @staticmethod
    def backward(ctx, dy, dh=None):
        h, weight, rstd = ctx.saved_tensors
        # The backward kernel writes dx with h's row stride: h dense, dx dense.
        dx, dw = _norm.rms_norm_backward(dy.contiguous(), h.contiguous(), rstd, weight,
                                         gemma=ctx.gemma,
                                         weight_grad=weight is not None
                                         and ctx.needs_input_grad[1])
        if dh is not None:
            dx = dx + dh
        return dx, dw, (dx if ctx.fused else None), None, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, residual, eps):
        h = None if residual is None else residual.clone()
        y, mean, rstd = _norm.layer_norm(x, weight, bias, eps, residual=h, return_stats=True)
        ctx.save_for_backward(x if h is None else h, weight, mean, rstd)
        ctx.fused, ctx.has_bias = h is not None, bias is not None
        return (y, h) if h is not None else y

    @staticmethod
    def backward(ctx, dy, dh=None):
        h, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = _norm.layer_norm_backward(
            dy.contiguous(), h.contiguous(), mean, rstd, weight,
            weight_grad=weight is not None and ctx.needs_input_grad[1],
            bias_grad=ctx.has_bias and ctx.needs_input_grad[2])
        if dh is not None:
            dx = dx + dh
        return dx, dw, db, (dx if ctx.fused else None), None


def rms_norm(x, weight=None, eps=1e-6, residual=None, *, gemma=False):
    """tkern.rms_norm with gradients for x, weight and residual. With residual, returns (y, h)
    where h = x + residual is a new tensor (the residual stream's next value); else y."""
    return _RMSNorm.apply(x, weight, residual, eps, gemma)


def layer_norm(x, weight=None, bias=None, eps=1e-5, residual=None):
    """tkern.layer_norm with gradients for x, weight, bias and residual. With residual, returns
    (y, h) where h = x + residual is a new tensor; else y."""
    return _LayerNorm.apply(x, weight, bias, residual, eps)


# ------------------------------------------------------------------------ activations -------
class _Activation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, kind):
        ctx.save_for_backward(x, bias)
        ctx.kind = kind
        return _activation.activation(x, kind, bias)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx = _activation.activation_backward(dy.contiguous(), x, ctx.kind, bias)
        db = _sum_rows(dx, bias) if bias is not None and ctx.needs_input_grad[1] else None
        return dx, db, None


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return _activation.gelu(x, approximate)

    @staticmethod
    def backward(ctx, dy):
        x, = ctx.saved_tensors
        return _activation.gelu_backward(dy.contiguous(), x, ctx.approximate), None


class _Glu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kind, layout, alpha, limit):
        ctx.save_for_backward(x)
        ctx.args = (kind, layout, alpha, limit)
        return _activation.glu(x, kind, layout, alpha=alpha, limit=limit)

    @staticmethod
    def backward(ctx, dy):
        x, = ctx.saved_tensors
        kind, layout, alpha, limit = ctx.args
        # The gradient is written with x's row stride: a dense x gives a dense gradient.
        dx = _activation.glu_backward(dy.contiguous(), x.contiguous(), kind, layout,
                                      alpha=alpha, limit=limit)
        return dx, None, None, None, None


def activation(x, kind, bias=None):
    """tkern.activation (f(x + bias)) with gradients for x and bias."""
    return _Activation.apply(x, bias, kind)


def gelu(x, approximate="none"):
    """tkern.gelu with its gradient."""
    return _Gelu.apply(x, approximate)


def glu(x, kind="swiglu", layout="gate_first", *, alpha=1.702, limit=7.0):
    """tkern.glu with its gradient (every kind and layout)."""
    return _Glu.apply(x, kind, layout, alpha, limit)


# ---------------------------------------------------------------------------- softmax -------
class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log, scale, causal, causal_offset, causal_period):
        ctx.args = dict(log=log, scale=scale, causal=causal, causal_offset=causal_offset,
                        causal_period=causal_period)
        y = _softmax._forward(x, -1, scale, log, causal, causal_offset, causal_period, None,
                              None)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, = ctx.saved_tensors
        return (_softmax.softmax_backward(y, dy.contiguous(), **ctx.args),
                None, None, None, None, None)


def softmax(x, dim=-1, *, scale=1.0, causal=False, causal_offset=0, causal_period=0):
    """tkern.softmax with its gradient (over the last dimension)."""
    _check_dim(x, dim)
    return _Softmax.apply(x, False, scale, causal, causal_offset, causal_period)


def log_softmax(x, dim=-1, *, scale=1.0, causal=False, causal_offset=0, causal_period=0):
    """tkern.log_softmax with its gradient (over the last dimension)."""
    _check_dim(x, dim)
    return _Softmax.apply(x, True, scale, causal, causal_offset, causal_period)


def _check_dim(x, dim):
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"argument 'dim' = {dim}: libtkern reduces over the last dimension "
                         "only (dim=-1); move the dimension last first")


# ------------------------------------------------------------------------------- rope -------
class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, positions, kwargs):
        ctx.save_for_backward(positions)
        ctx.kwargs = kwargs
        return _rope.rope(q, k, positions, **kwargs)

    @staticmethod
    def backward(ctx, dq, dk):
        positions, = ctx.saved_tensors
        gq, gk = _rope.rope_backward(_contiguous(dq) if ctx.needs_input_grad[0] else None,
                                     _contiguous(dk) if ctx.needs_input_grad[1] else None,
                                     positions, **ctx.kwargs)
        return gq, gk, None, None


def rope(q, k, positions=None, *, theta=10000.0, style="neox", rotary_dim=None,
         position_start=0, cos=None, sin=None, cos_sin_cache=None):
    """tkern.rope (out of place) with gradients for q and k: returns (q_rotated, k_rotated),
    None for a None input."""
    kwargs = dict(theta=theta, style=style, rotary_dim=rotary_dim,
                  position_start=position_start, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache)
    return _Rope.apply(q, k, positions, kwargs)


# ------------------------------------------------------------------------------- gemm -------
class _Gemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, bias, c, activation, alpha, beta, out_dtype):
        if beta is None:
            beta = 0.0 if c is None else 1.0
        ctx.save_for_backward(a, b, bias, c)
        ctx.args = (activation, alpha, beta, out_dtype)
        return _gemm.gemm(a, b, bias, activation, c=c, alpha=alpha, beta=beta,
                          out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, dout):
        a, b, bias, c = ctx.saved_tensors
        activation, alpha, beta, out_dtype = ctx.args
        dz = dout.contiguous()
        if _activation.activation_kind(activation, "activation") != 0:
            # The pre-activation z = alpha a b + beta c + bias, recomputed rather than kept.
            z = _gemm.gemm(a, b, bias, None, c=c, alpha=alpha, beta=beta, out_dtype=out_dtype)
            dz = _activation.activation_backward(dz, z, activation)
        k = a.shape[-1]
        dz2 = dz.reshape(-1, dz.shape[-1])
        dz_in = dz2.to(a.dtype)  # tk_gemm's operands share the input dtype
        da = db = None
        if ctx.needs_input_grad[0]:  # alpha dz b^T
            da = _gemm.gemm(dz_in, b.t(), alpha=alpha).view(a.shape)
        if ctx.needs_input_grad[1]:  # alpha a^T dz, a^T made row-major for tk_gemm
            db = _gemm.gemm(a.reshape(-1, k).t().contiguous(), dz_in, alpha=alpha,
                            out_dtype=_dtype_name(b.dtype))
        dbias = _sum_rows(dz, bias) if bias is not None and ctx.needs_input_grad[2] else None
        dc = (dz * beta).to(c.dtype) if c is not None and ctx.needs_input_grad[3] else None
        return da, db, dbias, dc, None, None, None, None


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def gemm(a, b, bias=None, activation=None, *, c=None, alpha=1.0, beta=None, out_dtype=None):
    """tkern.gemm (act(alpha a @ b + beta c + bias)) with gradients for a, b, bias and c; the
    backward pass is tk_gemm calls (the pre-activation recomputed when there is an activation)
    and the activation's backward kernel."""
    return _Gemm.apply(a, b, bias, c, activation, alpha, beta, out_dtype)


# -------------------------------------------------------------------------- attention -------
class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, sinks, document_ids, kwargs, deterministic):
        out, lse = _attention.attention(q, k, v, alibi_slopes=alibi_slopes, sinks=sinks,
                                        document_ids=document_ids, return_lse=True, **kwargs)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, sinks, document_ids)
        ctx.kwargs = kwargs
        ctx.deterministic = deterministic
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, alibi_slopes, sinks, document_ids = ctx.saved_tensors
        # dout may be a broadcast (stride 0) gradient; the kernel needs head_dim contiguous.
        grads = _attention_bwd.attention_backward(q, k, v, out, lse, dout.contiguous(),
                                                  alibi_slopes=alibi_slopes, sinks=sinks,
                                                  document_ids=document_ids,
                                                  deterministic=ctx.deterministic, **ctx.kwargs)
        dsinks = grads[3] if sinks is not None else None
        return grads[0], grads[1], grads[2], None, dsinks, None, None, None


def attention(q, k, v, *, causal=False, window=None, softcap=0.0, scale=None, alibi_slopes=None,
              layout="bshd", sinks=None, chunk_size=0, prefix_len=0, document_ids=None,
              deterministic=False):
    """tkern.attention with gradients for q, k and v (GQA: dk, dv summed over each group) and
    the sink logits (sinks, float32 [heads_q], as learnable_sink). The forward keeps its output
    and log-sum-exp for the backward kernel (tk_attention_bwd), which takes every forward option
    (chunk_size, prefix_len and document_ids too) and every forward head_dim (256 on a device
    without the shared memory for it raises tkern.TkernError when backpropagated). No gradient
    flows to alibi_slopes or document_ids. deterministic=True makes dq bit-identical from run to
    run (attention_backward's deterministic)."""
    kwargs = dict(causal=causal, window=window, softcap=softcap, scale=scale, layout=layout,
                  chunk_size=chunk_size, prefix_len=prefix_len)
    return _Attention.apply(q, k, v, alibi_slopes, sinks, document_ids, kwargs, deterministic)
