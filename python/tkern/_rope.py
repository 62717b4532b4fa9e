"""Rotary position embedding: tk_rope_fwd, tk_rope_bwd."""

from . import _lib
from ._arrays import FLOATS, Call, Lane, Plans, enum, ptr


def _heads(a):
    """(tokens, heads, head_dim, [token_stride, head_stride]) of an array [..., heads, dim]."""
    if a.ndim < 3:
        raise ValueError(f"argument '{a.name}' must be [..., heads, head_dim] with at least one "
                         f"token dimension (e.g. [tokens, heads, head_dim] or [batch, seq, "
                         f"heads, head_dim]), but has shape {a.shape}")
    heads, dim = a.shape[-2], a.shape[-1]
    if dim != 1 and a.strides[-1] != 1:
        raise ValueError(f"argument '{a.name}': head_dim (the last dimension) must be "
                         f"contiguous, but it has {a.describe()}")
    head_stride = a.strides[-2] if heads != 1 else dim
    if head_stride <= 0:
        raise ValueError(f"argument '{a.name}' has a zero or negative head stride (a broadcast "
                         f"or reversed view): {a.describe()}")
    tokens, _, token_stride = a.collapse(a.ndim - 2, heads * head_stride)
    return tokens, heads, dim, [token_stride, head_stride]


def _cache(c, p):
    rd = p.rotary_dim or p.head_dim
    cache, cos, sin = c.get("cos_sin_cache"), c.get("cos"), c.get("sin")
    if cache is not None:
        if cos is not None or sin is not None:
            raise ValueError("pass either 'cos_sin_cache' or 'cos' and 'sin', not both")
        cache.check_dtype(("float32",)).check_ndim((2,), "[max_position, rotary_dim]")
        if cache.shape[1] != rd or cache.strides[1] != 1:
            raise ValueError(f"argument 'cos_sin_cache' must be [max_position, {rd}] with "
                             f"contiguous rows, but has {cache.describe()}")
        p.cache_row_stride, p.max_position = cache.strides[0], cache.shape[0]
    elif cos is not None or sin is not None:
        if cos is None or sin is None:
            raise ValueError("pass both 'cos' and 'sin' (float32 [max_position, rotary_dim/2])")
        for a in (cos, sin):
            a.check_dtype(("float32",)).check_ndim((2,), "[max_position, rotary_dim / 2]")
            if a.shape[1] != rd // 2 or a.strides[1] != 1:
                raise ValueError(f"argument '{a.name}' must be [max_position, {rd // 2}] with "
                                 f"contiguous rows, but has {a.describe()}")
        if cos.shape != sin.shape or cos.strides != sin.strides:
            raise ValueError(f"arguments 'cos' and 'sin' must have one shape and row stride: "
                             f"{cos.describe()} vs {sin.describe()}")
        p.cache_row_stride, p.max_position = cos.strides[0], cos.shape[0]


def _pointers(c, p):
    """Sets the pointer fields of p (positions, angle cache) from Call c's arrays."""
    pa = c.get("positions")
    if pa is not None:
        if pa.dtype == "int32":
            p.positions32 = pa.ptr
        else:
            p.positions64 = pa.ptr
    cache, cos = c.get("cos_sin_cache"), c.get("cos")
    if cache is not None:
        rd = p.rotary_dim or p.head_dim
        p.cos_cache, p.sin_cache = cache.ptr, cache.ptr + (rd // 2) * 4
    elif cos is not None:
        p.cos_cache, p.sin_cache = cos.ptr, c["sin"].ptr


def _checked(c, names, style, theta, position_start, rotary_dim):
    """The params of Call c but its pointers and output strides, with every check."""
    qn, kn = names
    p = _lib.RopeParams(style=enum(_lib.ROPE_STYLES, style, "style"),
                        theta=theta, position_start=position_start, rotary_dim=rotary_dim or 0)
    shapes, dtype = {}, None
    for name, field in ((qn, "q"), (kn, "k")):
        a = c.get(name)
        if a is None:
            continue
        a.check_dtype((dtype,) if dtype else FLOATS)
        dtype = a.dtype
        tokens, heads, dim, strides = _heads(a)
        shapes[name] = (tokens, dim)
        setattr(p, "heads_" + field, heads)
        setattr(p, field + "_strides", strides)
        p.tokens, p.head_dim = tokens, dim
    if len(set(shapes.values())) > 1:
        raise ValueError(f"arguments '{qn}' and '{kn}' must have the same tokens and head_dim, "
                         f"got {c[qn].shape} and {c[kn].shape}")
    p.dtype = _lib.DTYPES[dtype]
    pa = c.get("positions")
    if pa is not None:
        pa.check_dtype(("int32", "int64")).check_contiguous()
        if pa.numel != p.tokens:
            raise ValueError(f"argument 'positions' has {pa.numel} elements for {p.tokens} "
                             f"tokens (shape {pa.shape})")
    _cache(c, p)
    return p


_PLANS = Plans()
# A lane per entry point (see Lane): which function is called, and in place or not, is then
# no part of a lane's key.
_INPLACE_LANE, _LANE, _BACKWARD_LANE = Lane(), Lane(), Lane()


def _lane_plan(fn, p, c, names, inplace):
    """The plan of a call (see Lane), from its params p before this call's pointers are set: p
    itself (a replay takes a copy of it to set the pointers in, when there are any, so that
    the stored params hold none) and its byref() for a replay without pointers to set; the
    positions field; the sin half's offset in a cos_sin_cache; an allocator per output (None:
    the output is the input, in place or absent); and the params of the last replay that set
    pointers, with those pointers (see _replay)."""
    template = _lib.RopeParams.from_buffer_copy(p)
    pa = c.get("positions")
    allocators = [None if inplace or c.get(name) is None
                  else Lane.allocator(c[name].obj, c[name].shape, c[name].dtype)
                  for name in names]
    return (fn, template, _lib.byref(template),
            "positions32" if pa is not None and pa.dtype == "int32" else "positions64",
            ((p.rotary_dim or p.head_dim) // 2) * 4, *allocators, [None])


def _replay(plan, q, k, positions, cos, sin, cos_sin_cache, stream):
    """A call of the lane (see Lane): the plan's params, with this call's pointers set in a copy
    as _pointers sets them, and its outputs. A decode loop passes the same positions buffer (and
    angle cache) call after call, so the params made for the last pointers are kept in the plan
    and passed again while the pointers are the same: they hold nothing else, and are never
    written once made (a thread reads the old pair or the new one, as in Lane)."""
    fn, template, params, positions_field, sin_offset, new_q, new_k, last = plan
    if positions is not None or cos is not None or cos_sin_cache is not None:
        pointers = (None if positions is None else positions.data_ptr(),
                    None if cos_sin_cache is None else cos_sin_cache.data_ptr(),
                    None if cos is None else cos.data_ptr(),
                    None if sin is None else sin.data_ptr())
        made = last[0]
        if made is not None and made[0] == pointers:
            params = made[1]
        else:
            p = _lib.RopeParams.from_buffer_copy(template)
            set_field = _lib.set_field  # data_ptr()s: always within void *, nothing to check
            pos_ptr, cache, cos_ptr, sin_ptr = pointers
            if positions is not None:
                set_field(p, positions_field, pos_ptr)
            if cos_sin_cache is not None:
                set_field(p, "cos_cache", cache)
                set_field(p, "sin_cache", cache + sin_offset)
            elif cos is not None:
                set_field(p, "cos_cache", cos_ptr)
                set_field(p, "sin_cache", sin_ptr)
            params = _lib.byref(p)
            last[0] = (pointers, params)
    q_out = q if new_q is None else new_q(q)
    k_out = k if new_k is None else new_k(k)
    _lib.replay(fn, params, 0 if q is None else q.data_ptr(), 0 if k is None else k.data_ptr(),
                0 if q_out is None else q_out.data_ptr(), 0 if k_out is None else k_out.data_ptr(),
                stream)
    return q_out, k_out


def _rope(fn, names, q, k, positions, outs, lane, lane_key, *, inplace, theta, style,
          rotary_dim, position_start, cos, sin, cos_sin_cache, stream):
    """The full path of rope_, rope and rope_backward, for a call that their lane did not
    replay; stores the call's plan in that lane under lane_key (from lane.find, None: nothing
    to store)."""
    qn, kn = names
    if q is None and k is None:
        raise TypeError(f"at least one of '{qn}' and '{kn}' must be given")
    c = Call(stream, **{qn: q, kn: k}, positions=positions, cos=cos, sin=sin,
             cos_sin_cache=cos_sin_cache,
             **({} if inplace else {qn + "_out": outs[0], kn + "_out": outs[1]}))
    key = Plans.key(c, fn, inplace, theta, style, rotary_dim, position_start)
    p = _PLANS.get(key)
    checked = p is None  # else checked before for this key: the output strides are in p
    if checked:
        p = _checked(c, names, style, theta, position_start, rotary_dim)
    results, ptrs = [], []
    for name, field, obj in ((qn, "q", outs[0]), (kn, "k", outs[1])):
        a = c.get(name)
        if a is None:
            results.append(None)
            ptrs.append(0)
        elif inplace:
            results.append(a.obj if obj is None else obj)
            ptrs.append(a.ptr)
        else:
            if obj is None:
                o, oa = c.output(name + "_out", None, a.shape, a.dtype)
            else:
                o, oa = obj, c[name + "_out"]
                if checked:
                    oa.check_shape(a.shape).check_dtype((a.dtype,))
            if checked:
                setattr(p, field + "_out_strides", _heads(oa)[3])
            results.append(o)
            ptrs.append(oa.ptr)
    if checked:
        _PLANS.put(key, p)
    plan = None if lane_key is None else _lane_plan(fn, p, c, names, inplace)
    _pointers(c, p)
    c.run(fn, _lib.byref(p), ptr(c.get(qn)), ptr(c.get(kn)), ptrs[0], ptrs[1], c.stream)
    lane.put(lane_key, plan)
    return tuple(results)


def rope_(q, k, positions=None, *, theta=10000.0, style="neox", rotary_dim=None,
          position_start=0, cos=None, sin=None, cos_sin_cache=None, stream=None):
    """Rotary position embedding applied in place to q and k (either may be None).

    q: [..., heads_q, head_dim], k: [..., heads_k, head_dim] (GQA allowed), float dtype, one
    dtype; the leading dimensions ([tokens] or [batch, seq]) are the tokens and may be strided
    (e.g. views of a packed QKV buffer); head_dim contiguous. positions: CUDA int32/int64 with
    one entry per token; None: position_start + token index. style: "neox" (rotate halves,
    Hugging Face Llama) or "gptj" (interleaved pairs). rotary_dim: the rotated prefix of each
    head (default head_dim). Angles from theta, or from a float32 cache: cos_sin_cache
    [max_position, rotary_dim] (vLLM's layout, cos then sin) or cos and sin [max_position,
    rotary_dim / 2]. Returns (q, k).
    """
    # The lane is looked up here, not in _rope: a replay then skips _rope's call (the hot path).
    plan, s, key = _INPLACE_LANE.find(stream, (), (q, k, positions, cos, sin, cos_sin_cache),
                                      (theta, style, rotary_dim, position_start))
    if plan is not None:
        return _replay(plan, q, k, positions, cos, sin, cos_sin_cache, s)
    return _rope("tk_rope_fwd", ("q", "k"), q, k, positions, (q, k), _INPLACE_LANE, key,
                 inplace=True, theta=theta, style=style, rotary_dim=rotary_dim,
                 position_start=position_start, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache,
                 stream=stream)


def rope(q, k, positions=None, *, theta=10000.0, style="neox", rotary_dim=None,
         position_start=0, cos=None, sin=None, cos_sin_cache=None, q_out=None, k_out=None,
         stream=None):
    """Out-of-place rope_: returns (q_rotated, k_rotated), new arrays (or q_out / k_out) of the
    inputs' shapes; elements past rotary_dim are copied. Arguments as rope_."""
    plan, s, key = _LANE.find(stream, (q_out, k_out), (q, k, positions, cos, sin, cos_sin_cache),
                              (theta, style, rotary_dim, position_start))
    if plan is not None:  # as in rope_
        return _replay(plan, q, k, positions, cos, sin, cos_sin_cache, s)
    return _rope("tk_rope_fwd", ("q", "k"), q, k, positions, (q_out, k_out), _LANE, key,
                 inplace=False, theta=theta, style=style, rotary_dim=rotary_dim,
                 position_start=position_start, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache,
                 stream=stream)


def rope_backward(grad_q, grad_k, positions=None, *, theta=10000.0, style="neox",
                  rotary_dim=None, position_start=0, cos=None, sin=None, cos_sin_cache=None,
                  inplace=False, stream=None):
    """Gradient of rope: rotates grad_q and grad_k by the opposite angles (the exact gradient).
    Same arguments as rope; inplace=True overwrites grad_q / grad_k. Returns (dq, dk)."""
    plan, s, key = _BACKWARD_LANE.find(stream, (), (grad_q, grad_k, positions, cos, sin,
                                                    cos_sin_cache),
                                       (inplace, theta, style, rotary_dim, position_start))
    if plan is not None:  # as in rope_
        return _replay(plan, grad_q, grad_k, positions, cos, sin, cos_sin_cache, s)
    return _rope("tk_rope_bwd", ("grad_q", "grad_k"), grad_q, grad_k, positions, (None, None),
                 _BACKWARD_LANE, key, inplace=inplace, theta=theta, style=style,
                 rotary_dim=rotary_dim, position_start=position_start, cos=cos, sin=sin,
                 cos_sin_cache=cos_sin_cache, stream=stream)
