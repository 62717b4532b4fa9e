"""GEMM with a fused epilogue: tk_gemm, tk_gemm_supported."""

from . import _lib
from ._activation import activation_kind
from ._arrays import FLOATS, HALVES, Call, Lane, Plans, ptr
from ._attention import _supported


_PLANS = Plans()


def _setup(a, b, bias, activation, c_in, alpha, beta, out_dtype, out, stream):
    c = Call(stream, a=a, b=b, bias=bias, c=c_in, out=out)
    key = Plans.key(c, activation, alpha, beta, out_dtype)
    p = _PLANS.get(key)
    if p is None:
        p, out = _checked(c, activation, alpha, beta, out_dtype, out)
        _PLANS.put(key, p)
        return c, p, out
    # Checked before for this key: only the output and the pointers are new.
    aa = c["a"]
    if out is None:
        out, oa = c.output("out", None, aa.shape[:-1] + (p.n,),
                           _lib.DTYPE_NAMES[p.output_dtype])
    else:
        oa = c["out"]
    p.a, p.b, p.c, p.bias, p.d = aa.ptr, c["b"].ptr, ptr(c.get("c")), ptr(c.get("bias")), oa.ptr
    return c, p, out


def _checked(c, activation, alpha, beta, out_dtype, out):
    """Checks the arguments of Call c and allocates the output: (params, out)."""
    aa = c["a"].check_dtype(HALVES)
    if aa.ndim < 1:
        raise ValueError("argument 'a' must be [..., k]")
    m, k, lda = aa.rows()
    ba = c["b"].check_dtype((aa.dtype,)).check_ndim((2,), "2-D [k, n]")
    if ba.shape[0] != k:
        raise ValueError(f"arguments 'a' {aa.shape} and 'b' {ba.shape} do not chain: b must be "
                         f"[{k}, n]")
    n = ba.shape[1]
    # B as stored: rows of n (KN) or, for a transposed view such as W.t() of a Linear weight
    # [n, k], rows of k (NK).
    if ba.strides[1] == 1 or n == 1:
        layout, ldb = "kn", ba.strides[0] if k > 1 else n
    elif ba.strides[0] == 1 or k == 1:
        layout, ldb = "nk", ba.strides[1] if n > 1 else k
    else:
        raise ValueError(f"argument 'b' must have one unit stride (row-major [k, n], or a "
                         f"transposed [n, k] such as weight.t()), but has {ba.describe()}")
    odtype = out_dtype or aa.dtype
    if odtype not in FLOATS:
        raise ValueError(f"argument 'out_dtype' = {odtype!r}; accepted: {', '.join(FLOATS)}")
    out_shape = aa.shape[:-1] + (n,)
    if out is None:
        out, oa = c.output("out", None, out_shape, odtype)
    else:
        oa = c["out"].check_shape(out_shape).check_dtype((odtype,))
    bias_a = c.get("bias")
    if bias_a is not None:
        bias_a.check_dtype((odtype,)).check_shape((n,)).check_contiguous()
    ca = c.get("c")
    if beta is None:
        beta = 0.0 if ca is None else 1.0
    ldc = 0
    if ca is not None:
        ldc = ca.check_dtype((odtype,)).check_shape(out_shape).rows()[2]
    p = _lib.GemmParams(m=m, n=n, k=k, input_dtype=_lib.DTYPES[aa.dtype],
                        output_dtype=_lib.DTYPES[odtype], b_layout=_lib.GEMM_B_LAYOUTS[layout],
                        a=aa.ptr, lda=lda, b=ba.ptr, ldb=ldb, c=ptr(ca), ldc=ldc,
                        bias=ptr(bias_a), d=oa.ptr, ldd=oa.rows()[2],
                        activation=activation_kind(activation, "activation"), alpha=alpha,
                        beta=beta)
    return p, out


def gemm(a, b, bias=None, activation=None, *, c=None, alpha=1.0, beta=None, out_dtype=None,
         out=None, stream=None):
    """out = act(alpha * a @ b + beta * c + bias), like torch.nn.functional.linear followed by
    the activation (for a Linear weight W [n, k], pass b=W.t()).

    a: [..., k] (the leading dimensions are the rows m; last dimension contiguous), float16 or
    bfloat16. b: [k, n] of a's dtype, row-major or a transposed view of [n, k] (one unit
    stride). bias: [n] of the output dtype. activation: None, "gelu", "gelu_tanh", "silu",
    "relu", ... (see activation). c: optional [..., n] residual added before the activation,
    with beta (default 1 when c is given, else 0). out_dtype: "float16", "bfloat16" or
    "float32" (default a's dtype). Products summed in float32. Returns out ([..., n]).
    """
    lane, s, lane_key = _LANE.find(stream, (out,), (a, b, bias, c),
                                   (activation, alpha, beta, out_dtype))
    if lane is not None:
        template, new_out = lane
        p = _lib.GemmParams.from_buffer_copy(template)
        out = new_out(a)
        # The pointers are data_ptr()s, always within a void *: no range check to make.
        set_field = _lib.set_field
        set_field(p, "a", a.data_ptr())
        set_field(p, "b", b.data_ptr())
        set_field(p, "c", 0 if c is None else c.data_ptr())
        set_field(p, "bias", 0 if bias is None else bias.data_ptr())
        set_field(p, "d", out.data_ptr())
        _lib.replay("tk_gemm", _lib.byref(p), s)
        return out
    ctx, p, out = _setup(a, b, bias, activation, c, alpha, beta, out_dtype, out, stream)
    ctx.run("tk_gemm", _lib.byref(p), ctx.stream)
    if lane_key is not None:
        oa = ctx["out"]
        _LANE.put(lane_key, (p, Lane.allocator(a, oa.shape, oa.dtype)))
    return out


_LANE = Lane()


def gemm_supported(a, b, bias=None, activation=None, *, c=None, alpha=1.0, beta=None,
                   out_dtype=None, out=None):
    """Whether gemm(...) with these arguments would run on the current device, launching
    nothing: (True, variant_name) or (False, "<status name>: <reason>")."""
    ctx, p, _ = _setup(a, b, bias, activation, c, alpha, beta, out_dtype, out, None)
    return _supported("tk_gemm_supported", ctx, p)
