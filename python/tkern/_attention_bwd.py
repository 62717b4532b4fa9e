"""Attention backward: tk_attention_bwd, tk_attention_bwd_workspace_size."""

import ctypes

from . import _lib
from ._arrays import FLOATS, Call, ptr
from ._attention import _LAYOUTS, _dims, alibi_and_window, document_ids_checked


def attention_backward(q, k, v, out, lse, dout, *, causal=False, window=None, softcap=0.0,
                       scale=None, alibi_slopes=None, layout="bshd", dq=None, dk=None, dv=None,
                       workspace=None, stream=None, sinks=None, chunk_size=0, prefix_len=0,
                       document_ids=None, dsinks=None, deterministic=False):
    """Gradients (dq, dk, dv) of attention(q, k, v, ...) for the output gradient dout, and with
    sinks (dq, dk, dv, dsinks): dsinks float32 [heads_q], summed in a fixed order.

    out and lse are attention's outputs for the same call (return_lse=True); every option means
    what it means in attention (same layouts, masks, softcap, scale, ALiBi). dout is laid out
    like out, dq like q, dk and dv like k and v (GQA: summed over each group). head_dim 64, 80,
    96, 128 or 256 (256 needs 143 KB of shared memory per block, e.g. compute capability 8.0 or 9.0;
    elsewhere TkernError NOT_SUPPORTED). dq is accumulated with float32 atomics, so its last bits
    may vary from run to run;
    deterministic=True makes the same adds in a fixed order, so that dq is bit-identical from
    run to run (a little slower, and a little more workspace).
    workspace: a uint8 array of tk_attention_bwd_workspace_size bytes (at least 1), allocated
    here when None.
    """
    if layout not in _LAYOUTS:
        raise ValueError(f"argument 'layout' = {layout!r}; accepted: 'bshd', 'bhsd'")
    c = Call(stream, q=q, k=k, v=v, out=out, lse=lse, dout=dout, alibi_slopes=alibi_slopes,
             sinks=sinks, document_ids=document_ids, dq=dq, dk=dk, dv=dv, dsinks=dsinks)
    qa = c["q"].check_dtype(FLOATS)
    (batch, sq, hq, dim), q_strides = _dims(qa, layout)
    (_, sk, hkv, _), k_strides = _dims(c["k"].check_dtype((qa.dtype,)), layout)
    v_strides = _dims(c["v"].check_dtype((qa.dtype,)), layout)[1]
    o_strides = _dims(c["out"].check_dtype((qa.dtype,)), layout)[1]
    do_strides = _dims(c["dout"].check_dtype((qa.dtype,)), layout)[1]
    c["lse"].check_dtype(("float32",)).check_shape((batch, hq, sq)).check_contiguous()
    aa, left, right = alibi_and_window(c, hq, window)
    grads = {}
    for name, like in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        obj, a = c.output(name, {"dq": dq, "dk": dk, "dv": dv}[name], c[like].shape, qa.dtype)
        grads[name] = (obj, a)
    if sinks is not None:
        grads["dsinks"] = c.output("dsinks", dsinks, (hq,), "float32")
    p = _lib.AttentionBwdParams(
        dtype=_lib.DTYPES[qa.dtype], q=qa.ptr, k=c["k"].ptr, v=c["v"].ptr, o=c["out"].ptr,
        lse=c["lse"].ptr, dout=c["dout"].ptr, dq=grads["dq"][1].ptr, dk=grads["dk"][1].ptr,
        dv=grads["dv"][1].ptr, batch=batch, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv,
        head_dim=dim, q_strides=q_strides, k_strides=k_strides, v_strides=v_strides,
        o_strides=o_strides, dout_strides=do_strides,
        dq_strides=_dims(grads["dq"][1], layout)[1], dk_strides=_dims(grads["dk"][1], layout)[1],
        dv_strides=_dims(grads["dv"][1], layout)[1],
        softmax_scale=0.0 if scale is None else scale, causal=int(bool(causal)),
        window_left=left, window_right=right, softcap=softcap or 0.0, alibi_slopes=ptr(aa),
        sinks=ptr(c.get("sinks")), chunk_size=chunk_size, prefix_len=prefix_len,
        document_ids=ptr(document_ids_checked(c, batch, sk)),
        dsinks=ptr(grads["dsinks"][1]) if sinks is not None else 0,
        deterministic=int(bool(deterministic)))
    nbytes = ctypes.c_size_t()
    _lib.call("tk_attention_bwd_workspace_size", _lib.byref(p), _lib.byref(nbytes))
    _, wsa = c.output("workspace", workspace, (max(nbytes.value, 1),), "uint8")
    p.workspace, p.workspace_bytes = wsa.ptr, nbytes.value
    c.run("tk_attention_bwd", _lib.byref(p), c.stream)
    if sinks is not None:
        return grads["dq"][0], grads["dk"][0], grads["dv"][0], grads["dsinks"][0]
    return grads["dq"][0], grads["dk"][0], grads["dv"][0]
