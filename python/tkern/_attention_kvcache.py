"""Attention over a KV cache, for serving: tk_attention_kvcache_fwd, _workspace_size and
_supported."""

import ctypes

from . import _lib
from ._arrays import FLOATS, Call, ptr
from ._attention import alibi_and_window

_INT32 = ("int32",)


def _token_strides(a):
    """q_strides-style {batch, seq, head, dim} of a [batch, seq, heads, dim] array, or of a
    varlen [total, heads, dim] one (its batch stride is ignored by the library)."""
    return list(a.strides) if a.ndim == 4 else [0] + list(a.strides)


def _setup(q, k_cache, v_cache, cache_seqlens, *, block_table, cu_seqlens_q, max_seqlen_q,
           k_new, v_new, causal, window, softcap, scale, alibi_slopes, return_lse, num_splits,
           out, lse, stream, sinks=None, chunk_size=0):
    """Checks what only the binding knows (shapes against each other, int32 dtypes), allocates
    the outputs and the workspace: (Call, params, out, lse)."""
    c = Call(stream, q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
             block_table=block_table, cu_seqlens_q=cu_seqlens_q, k_new=k_new, v_new=v_new,
             alibi_slopes=alibi_slopes, sinks=sinks, out=out, lse=lse)
    qa = c["q"].check_dtype(FLOATS)
    varlen = c.get("cu_seqlens_q") is not None
    if varlen:
        qa.check_ndim((3,), "3-D [total_q, heads_q, head_dim] with cu_seqlens_q")
        cua = c["cu_seqlens_q"].check_dtype(_INT32).check_ndim((1,), "1-D [batch + 1]")
        cua.check_contiguous()
        batch, total_q = cua.shape[0] - 1, qa.shape[0]
        seqlen_q = max(total_q, 1) if max_seqlen_q is None else max_seqlen_q
    else:
        qa.check_ndim((4,), "4-D [batch, seqlen_q, heads_q, head_dim] (or 3-D with "
                            "cu_seqlens_q)")
        batch, seqlen_q, total_q = qa.shape[0], qa.shape[1], 0
    hq, dim = qa.shape[-2], qa.shape[-1]
    ka = c["k_cache"].check_dtype((qa.dtype,)).check_ndim((4,), "4-D")
    c["v_cache"].check_dtype((qa.dtype,)).check_shape(ka.shape)
    if ka.shape[3] != dim:
        raise ValueError(f"argument 'k_cache' has shape {ka.shape}: its head_dim must match "
                         f"q's {qa.shape}")
    hkv = ka.shape[2]
    c["cache_seqlens"].check_dtype(_INT32).check_shape((batch,)).check_contiguous()
    paging = dict(max_seqlen_k=ka.shape[1])
    ba = c.get("block_table")
    if ba is not None:
        ba.check_dtype(_INT32).check_ndim((2,), "2-D [batch, max_pages_per_seq]")
        if ba.shape[0] != batch or (ba.shape[1] != 1 and ba.strides[1] != 1):
            raise ValueError(f"argument 'block_table' must be [batch = {batch}, "
                             f"max_pages_per_seq] with contiguous rows, but has "
                             f"{ba.describe()}")
        # A one-sequence table's row stride is any value (DLPack may report 1): rows are dense.
        row_stride = ba.strides[0] if batch != 1 else ba.shape[1]
        paging = dict(num_pages=ka.shape[0], page_size=ka.shape[1],
                      max_pages_per_seq=ba.shape[1], block_table_stride=row_stride)
    new_strides = {}
    for name in ("k_new", "v_new"):
        na = c.get(name)
        if na is not None:
            na.check_dtype((qa.dtype,)).check_shape(qa.shape[:-2] + (hkv, dim))
            new_strides[name + "_strides"] = _token_strides(na)
    aa, left, right = alibi_and_window(c, hq, window)
    out, oa = c.output("out", out, qa.shape, qa.dtype)
    lse_obj, la = None, None
    if return_lse:
        lse_shape = (hq, total_q) if varlen else (batch, hq, seqlen_q)
        lse_obj, la = c.output("lse", lse, lse_shape, "float32")
    p = _lib.AttentionKvcacheParams(
        dtype=_lib.DTYPES[qa.dtype], q=qa.ptr, k_cache=ka.ptr, v_cache=c["v_cache"].ptr,
        o=oa.ptr, batch=batch, seqlen_q=seqlen_q, cu_seqlens_q=ptr(c.get("cu_seqlens_q")),
        total_q=total_q, seqlens_k=c["cache_seqlens"].ptr, heads_q=hq, heads_kv=hkv,
        head_dim=dim, block_table=ptr(ba), q_strides=_token_strides(qa),
        k_strides=ka.strides, v_strides=c["v_cache"].strides, o_strides=_token_strides(oa),
        softmax_scale=0.0 if scale is None else scale, causal=int(bool(causal)),
        window_left=left, window_right=right, softcap=softcap or 0.0, alibi_slopes=ptr(aa),
        return_lse=int(bool(return_lse)), lse=ptr(la), num_splits=num_splits,
        k_new=ptr(c.get("k_new")), v_new=ptr(c.get("v_new")), sinks=ptr(c.get("sinks")),
        chunk_size=chunk_size, **paging, **new_strides)
    n = ctypes.c_size_t(0)
    c.run("tk_attention_kvcache_workspace_size", _lib.byref(p), _lib.byref(n))
    if n.value:
        _, wsa = c.output("workspace", None, (n.value,), "uint8")
        p.workspace, p.workspace_bytes = wsa.ptr, n.value
    return c, p, out, lse_obj


def attention_kvcache(q, k_cache, v_cache, cache_seqlens, *, block_table=None,
                      cu_seqlens_q=None, max_seqlen_q=None, k_new=None, v_new=None,
                      causal=False, window=None, softcap=0.0, scale=None, alibi_slopes=None,
                      return_lse=False, num_splits=0, out=None, lse=None, stream=None,
                      sinks=None, chunk_size=0):
    """Attention of new queries over a KV cache (flash_attn_with_kvcache), for decoding and
    chunked prefill.

    q: [batch, seqlen_q, heads_q, head_dim], or [total_q, heads_q, head_dim] with cu_seqlens_q
    (int32 [batch + 1], sequence b's queries are tokens cu_seqlens_q[b] .. cu_seqlens_q[b + 1]
    - 1; max_seqlen_q, the longest, sizes the grid: default total_q). float16 or bfloat16;
    head_dim 64, 128 or 256; heads_q a multiple of heads_kv (GQA / MQA).
    k_cache, v_cache: [batch, max_seqlen_k, heads_kv, head_dim], or paged [num_pages,
    page_size, heads_kv, head_dim] with block_table (int32 [batch, max_pages_per_seq], pages in
    any order). cache_seqlens: int32 [batch], the keys already in each sequence's cache.
    k_new, v_new (q's token layout with heads_kv): appended to the cache at cache_seqlens[b]
    onwards before attending, in place; cache_seqlens is not updated (add the new lengths for
    the next step). causal, window=(left, right), softcap, scale, alibi_slopes (float32
    [heads_q]): as attention(), masks aligned bottom-right per sequence. num_splits: 0 = the
    library's choice of split-KV, else 1 .. 1024. The split workspace is allocated here.
    sinks (float32 [heads_q]) and chunk_size: as attention(), per sequence, key positions
    counted from the cache's start.
    Returns out (q's shape), or (out, lse) with return_lse (float32 [batch, heads_q,
    seqlen_q], or [heads_q, total_q] with cu_seqlens_q). A sequence with no keys gets 0 and
    lse -inf (the sink with sinks).
    """
    c, p, out, lse = _setup(q, k_cache, v_cache, cache_seqlens, block_table=block_table,
                            cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, k_new=k_new,
                            v_new=v_new, causal=causal, window=window, softcap=softcap,
                            scale=scale, alibi_slopes=alibi_slopes, return_lse=return_lse,
                            num_splits=num_splits, out=out, lse=lse, stream=stream,
                            sinks=sinks, chunk_size=chunk_size)
    c.run("tk_attention_kvcache_fwd", _lib.byref(p), c.stream)
    return (out, lse) if return_lse else out


def attention_kvcache_supported(q, k_cache, v_cache, cache_seqlens, **kwargs):
    """Whether attention_kvcache(q, k_cache, v_cache, cache_seqlens, **kwargs) would run on the
    current device, launching nothing: (True, variant_name) or (False, "<status name>:
    <reason>"). Outputs and the workspace are allocated (and dropped) as attention_kvcache
    would."""
    kwargs.pop("stream", None)
    kw = dict(block_table=None, cu_seqlens_q=None, max_seqlen_q=None, k_new=None, v_new=None,
              causal=False, window=None, softcap=0.0, scale=None, alibi_slopes=None,
              return_lse=False, num_splits=0, out=None, lse=None, sinks=None, chunk_size=0)
    unknown = set(kwargs) - set(kw)
    if unknown:
        raise TypeError(f"unexpected arguments: {', '.join(sorted(unknown))}")
    kw.update(kwargs)
    name = ctypes.c_char_p()
    try:
        c, p, _, _ = _setup(q, k_cache, v_cache, cache_seqlens, stream=None, **kw)
        c.run("tk_attention_kvcache_supported", _lib.byref(p), _lib.byref(name))
    except _lib.TkernError as e:
        return False, f"{e.status_name}: {e.message}"
    return True, (name.value or b"").decode()
