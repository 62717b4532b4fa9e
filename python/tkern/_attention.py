"""Attention forward: tk_attention_fwd, tk_attention_sliding_fwd, tk_attention_supported."""

import ctypes

from . import _lib
from ._arrays import FLOATS, Call, Lane, Plans, ptr

# Where batch, sequence, head and head_dim sit in the array's dimensions, per layout.
_LAYOUTS = {"bshd": ((0, 1, 2, 3), "[batch, seq, heads, head_dim]"),
            "bhsd": ((0, 2, 1, 3), "[batch, heads, seq, head_dim]")}


def _dims(a, layout):
    order, meaning = _LAYOUTS[layout]
    a.check_ndim((4,), f"4-D {meaning} (layout={layout!r})")
    return tuple(a.shape[i] for i in order), [a.strides[i] for i in order]


_PLANS = Plans()


def alibi_and_window(c, heads_q, window):
    """The checked alibi_slopes Array of Call c (or None) and window's (left, right); the sinks
    Array, when c has one, is checked the same way (float32 [heads_q])."""
    aa = c.get("alibi_slopes")
    if aa is not None:
        aa.check_dtype(("float32",)).check_shape((heads_q,)).check_contiguous()
    sa = c.get("sinks")
    if sa is not None:
        sa.check_dtype(("float32",)).check_shape((heads_q,)).check_contiguous()
    if window is None:
        window = (-1, -1)
    if len(window) != 2:
        raise ValueError(f"argument 'window' = {window!r}; expected (left, right), -1 or None "
                         "for unbounded")
    left, right = (-1 if w is None else w for w in window)
    return aa, left, right


def _setup(q, k, v, *, causal, window, softcap, scale, alibi_slopes, return_lse, layout, out,
           lse, stream, sinks=None, chunk_size=0, prefix_len=0, document_ids=None):
    if layout not in _LAYOUTS:
        raise ValueError(f"argument 'layout' = {layout!r}; accepted: 'bshd', 'bhsd'")
    c = Call(stream, q=q, k=k, v=v, alibi_slopes=alibi_slopes, sinks=sinks,
             document_ids=document_ids, out=out, lse=lse)
    key = Plans.key(c, causal, window, softcap, scale, return_lse, layout, chunk_size, prefix_len)
    p = _PLANS.get(key)
    if p is None:
        p, out, lse_obj = _checked(c, causal=causal, window=window, softcap=softcap, scale=scale,
                                   return_lse=return_lse, layout=layout, out=out, lse=lse,
                                   chunk_size=chunk_size, prefix_len=prefix_len)
        _PLANS.put(key, p)
        return c, p, out, lse_obj
    # Checked before for this key: only the outputs and the pointers are new.
    qa = c["q"]
    if out is None:
        out, oa = c.output("out", None, qa.shape, qa.dtype)
    else:
        oa = c["out"]
    lse_obj, la = None, None
    if return_lse:
        lse_obj, la = c.output("lse", lse, (p.batch, p.heads_q, p.seqlen_q), "float32")
    p.q, p.k, p.v, p.o = qa.ptr, c["k"].ptr, c["v"].ptr, oa.ptr
    p.alibi_slopes, p.lse = ptr(c.get("alibi_slopes")), ptr(la)
    p.sinks, p.document_ids = ptr(c.get("sinks")), ptr(c.get("document_ids"))
    return c, p, out, lse_obj


def document_ids_checked(c, batch, seqlen_k):
    """The checked document_ids Array of Call c (int32 [batch, seqlen_k], contiguous), or None."""
    da = c.get("document_ids")
    if da is not None:
        da.check_dtype(("int32",)).check_shape((batch, seqlen_k)).check_contiguous()
    return da


def _checked(c, *, causal, window, softcap, scale, return_lse, layout, out, lse, chunk_size,
             prefix_len):
    """Checks the arguments of Call c and allocates the outputs: (params, out, lse)."""
    qa = c["q"].check_dtype(FLOATS)
    (batch, sq, hq, dim), q_strides = _dims(qa, layout)
    kv = {}
    for name in ("k", "v"):
        a = c[name].check_dtype((qa.dtype,))
        kv[name] = _dims(a, layout)
        (b, _, _, d), _ = kv[name]
        if b != batch or d != dim:
            raise ValueError(f"argument '{name}' has shape {a.shape}: its batch and head_dim "
                             f"must match q's {qa.shape} (layout={layout!r})")
    if kv["k"][0] != kv["v"][0]:
        raise ValueError(f"arguments 'k' and 'v' must have the same shape, got {c['k'].shape} "
                         f"and {c['v'].shape}")
    (_, sk, hkv, _), k_strides = kv["k"]
    v_strides = kv["v"][1]
    aa, left, right = alibi_and_window(c, hq, window)
    if out is None:
        out, oa = c.output("out", None, qa.shape, qa.dtype)
    else:
        oa = c["out"].check_shape(qa.shape).check_dtype((qa.dtype,))
    lse_obj, la = None, None
    if return_lse:
        lse_obj, la = c.output("lse", lse, (batch, hq, sq), "float32")
    p = _lib.AttentionParams(
        dtype=_lib.DTYPES[qa.dtype], q=qa.ptr, k=c["k"].ptr, v=c["v"].ptr, o=oa.ptr,
        batch=batch, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=dim,
        softmax_scale=0.0 if scale is None else scale, causal=int(bool(causal)),
        window_left=left, window_right=right, softcap=softcap or 0.0, alibi_slopes=ptr(aa),
        return_lse=int(bool(return_lse)), lse=ptr(la), q_strides=q_strides,
        k_strides=k_strides, v_strides=v_strides, o_strides=_dims(oa, layout)[1],
        sinks=ptr(c.get("sinks")), chunk_size=chunk_size, prefix_len=prefix_len,
        document_ids=ptr(document_ids_checked(c, batch, sk)))
    return p, out, lse_obj


def attention(q, k, v, *, causal=False, window=None, softcap=0.0, scale=None,
              alibi_slopes=None, return_lse=False, layout="bshd", out=None, lse=None,
              stream=None, sinks=None, chunk_size=0, prefix_len=0, document_ids=None):
    """Attention forward (FlashAttention-style), softmax(scale * q k^T + mask) v.

    q: [batch, seq_q, heads_q, head_dim], k and v: [batch, seq_k, heads_kv, head_dim] with
    layout="bshd" (FlashAttention's), or [batch, heads, seq, head_dim] with layout="bhsd"
    (PyTorch SDPA's); any strides with head_dim contiguous (16-byte aligned). float16 or
    bfloat16; head_dim 64, 80, 96, 128 or 256; heads_q a multiple of heads_kv (GQA / MQA).
    causal: masks aligned bottom-right (the last query sees the last key), as FlashAttention.
    window=(left, right): query i sees keys i + shift - left .. i + shift + right (shift =
    seq_k - seq_q; -1 or None = unbounded); Hugging Face sliding_window=N is causal=True,
    window=(N - 1, 0). softcap > 0: Gemma 2's tanh capping. scale: default 1/sqrt(head_dim).
    alibi_slopes: float32 [heads_q]. Returns out (q's shape), or (out, lse) with return_lse
    (lse: float32 [batch, heads_q, seq_q], natural log). A query that sees no key gets 0.
    The specialised masks (docs/kernels/attention.md has a picture of each):
    sinks: float32 [heads_q] logits that join each row's softmax denominator without a value
    (GPT-OSS; FlashAttention's learnable_sink); lse includes them. chunk_size=C: chunked local
    attention, query and key in the same block of C positions (Llama 4, FlashAttention-3's
    attention_chunk; with causal=True causal inside each chunk). prefix_len=P with causal=True:
    prefix-LM, positions < P see every key < P (PaliGemma, FlexAttention's prefix_lm).
    document_ids: int32 [batch, seq_k], non-decreasing along each row (packed documents,
    FlexAttention's document mask): query i sees key j only in its own document, query i being
    key position i + seq_k - seq_q.
    """
    lane, s, lane_key = _LANE.find(stream, (out, lse), (q, k, v, alibi_slopes, sinks, document_ids),
                                   (causal, window, softcap, scale, return_lse, layout, chunk_size,
                                    prefix_len))
    if lane is not None:
        p, out, lse = _replay(lane, q, k, v, alibi_slopes, return_lse, sinks, document_ids)
        _lib.replay("tk_attention_fwd", _lib.byref(p), s)
        return (out, lse) if return_lse else out
    c, p, out, lse = _setup(q, k, v, causal=causal, window=window, softcap=softcap, scale=scale,
                            alibi_slopes=alibi_slopes, return_lse=return_lse, layout=layout,
                            out=out, lse=lse, stream=stream, sinks=sinks, chunk_size=chunk_size,
                            prefix_len=prefix_len, document_ids=document_ids)
    c.run("tk_attention_fwd", _lib.byref(p), c.stream)
    if lane_key is not None:
        _LANE.put(lane_key, _plan(p, c))
    return (out, lse) if return_lse else out


_LANE = Lane()


def _plan(p, c):
    """What a replay of the call of params p and Call c needs (see Lane): the params and the
    allocators of out and lse (None without lse)."""
    qa, la = c["q"], c.get("lse")
    return (p, Lane.allocator(qa.obj, qa.shape, qa.dtype),
            None if la is None else Lane.allocator(qa.obj, la.shape, "float32"))


def _replay(plan, q, k, v, alibi_slopes, return_lse, sinks=None, document_ids=None):
    """(params, out, lse) of a replayed call: the plan's params with this call's pointers."""
    template, new_out, new_lse = plan
    p = type(template).from_buffer_copy(template)
    out = new_out(q)
    lse = new_lse(q) if return_lse else None
    set_field = _lib.set_field  # data_ptr()s: always within void *, nothing to check
    set_field(p, "q", q.data_ptr())
    set_field(p, "k", k.data_ptr())
    set_field(p, "v", v.data_ptr())
    set_field(p, "o", out.data_ptr())
    # An array absent here was absent from the plan's call (the key says which are present):
    # its field is 0 in the template.
    if alibi_slopes is not None:
        set_field(p, "alibi_slopes", alibi_slopes.data_ptr())
    if lse is not None:
        set_field(p, "lse", lse.data_ptr())
    if sinks is not None:
        set_field(p, "sinks", sinks.data_ptr())
    if document_ids is not None:
        set_field(p, "document_ids", document_ids.data_ptr())
    return p, out, lse


def sliding_window_attention(q, k, v, window_left, *, softcap=0.0, scale=None,
                             alibi_slopes=None, return_lse=False, layout="bshd", out=None,
                             lse=None, stream=None):
    """Causal local attention (tk_attention_sliding_fwd): query i sees keys
    i + shift - window_left .. i + shift. Same as attention(..., causal=True,
    window=(window_left, 0)); Mistral / Hugging Face sliding_window = N is window_left = N - 1.
    """
    lane, s, lane_key = _SLIDING_LANE.find(stream, (out, lse), (q, k, v, alibi_slopes),
                                           (window_left, softcap, scale, return_lse, layout))
    if lane is not None:
        p, out, lse = _replay(lane, q, k, v, alibi_slopes, return_lse)
        _lib.replay("tk_attention_sliding_fwd", _lib.byref(p), p.window_left, s)
        return (out, lse) if return_lse else out
    c, p, out, lse = _setup(q, k, v, causal=True, window=(window_left, 0), softcap=softcap,
                            scale=scale, alibi_slopes=alibi_slopes, return_lse=return_lse,
                            layout=layout, out=out, lse=lse, stream=stream)
    c.run("tk_attention_sliding_fwd", _lib.byref(p), p.window_left, c.stream)
    if lane_key is not None:
        _SLIDING_LANE.put(lane_key, _plan(p, c))
    return (out, lse) if return_lse else out


_SLIDING_LANE = Lane()


def attention_supported(q, k, v, **kwargs):
    """Whether attention(q, k, v, **kwargs) would run on the current device, launching nothing:
    (True, variant_name) or (False, "<status name>: <reason>"). Output arrays are allocated
    (and dropped) as attention would."""
    kwargs.pop("stream", None)
    kw = dict(causal=False, window=None, softcap=0.0, scale=None, alibi_slopes=None,
              return_lse=False, layout="bshd", out=None, lse=None, sinks=None, chunk_size=0,
              prefix_len=0, document_ids=None)
    unknown = set(kwargs) - set(kw)
    if unknown:
        raise TypeError(f"unexpected arguments: {', '.join(sorted(unknown))}")
    kw.update(kwargs)
    c, p, _, _ = _setup(q, k, v, stream=None, **kw)
    return _supported("tk_attention_supported", c, p)


def _supported(fn, c, p):
    name = ctypes.c_char_p()
    try:
        c.run(fn, _lib.byref(p), _lib.byref(name))
    except _lib.TkernError as e:
        return False, f"{e.status_name}: {e.message}"
    return True, (name.value or b"").decode()
