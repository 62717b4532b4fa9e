"""GPU tests of tkern.autograd: each function's gradients against torch autograd through the
float64 torch reference of test_gpu.py, on the same inputs and output gradients.

The library takes float32, float16 and bfloat16 (no float64), so the ops run in float32 where
they support it (norms, activations, GLU, softmax, RoPE), and gemm in float16 and bfloat16.
Tolerance, over a whole gradient: max |got - ref| <= rtol * max |ref|, rtol 1e-4 (float32),
5e-3 (float16), 3e-2 (bfloat16: the forward output, hence the pre-activation gradient, is
rounded to 8 bits before the backward gemms).

Attention runs in float16 and bfloat16 and follows FlashAttention's rule per gradient, as
tests/test_attention_bwd.c: max |got - ref| <= 2 x that of a naive same-precision autograd (the
float64 reference rounded to the dtype wherever it stores a tensor, gradients included) + twice the
representation error near 0.3. The reference is F.scaled_dot_product_attention in float64 (K and V
repeated over the GQA group, seqlen_q == seqlen_k so tkern's bottom-right causal mask is SDPA's
is_causal, a window as an explicit boolean mask), or test_gpu's attn_ref for softcap and ALiBi,
which SDPA does not have.
"""

import pytest

torch = pytest.importorskip("torch", reason="the GPU tests need torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import tkern.autograd as tka  # noqa: E402
from test_gpu import (ACT_REF, DEV, LIMIT, MASK_CASES, NAMES, attn_ref, glu_ref,  # noqa: E402
                      ln_ref, mask_case, rand, representation_term, rms_ref, rope_ref,
                      softmax_ref)

RTOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(4321)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def compare(got, ref, what, dtype):
    assert got is not None, f"{what}: no gradient"
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    err = (got.double() - ref).abs().max().item()
    bound = RTOL[dtype] * max(ref.abs().max().item(), 1e-30)
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g} (rtol {RTOL[dtype]})"


def run_both(ours, reference, inputs, dtype, what):
    """Runs ours(*leaves) and reference(*float64 leaves), backpropagates the same random output
    gradients through both and compares every input's gradient. inputs: name -> tensor or None
    (None and non-float tensors get no gradient)."""
    mine = {n: None if t is None else leaf(t) for n, t in inputs.items()}
    ref = {n: None if t is None else leaf(t.double()) for n, t in inputs.items()}
    out, out_ref = ours(**mine), reference(**ref)
    outs = out if isinstance(out, tuple) else (out,)
    outs_ref = out_ref if isinstance(out_ref, tuple) else (out_ref,)
    pairs = [(o, r) for o, r in zip(outs, outs_ref) if o is not None]
    dys = [rand(*o.shape, dtype=o.dtype) for o, _ in pairs]
    torch.autograd.backward([o for o, _ in pairs], dys)
    torch.autograd.backward([r for _, r in pairs], [d.double() for d in dys])
    for n, t in mine.items():
        if t is not None:
            compare(t.grad, ref[n].grad, f"{what}: d{n}", dtype)


def test_rms_norm_gradients_with_fused_residual():
    f32 = torch.float32
    for fused in (False, True):
        for weight in (None, "weight"):
            for gemma in ((False, True) if weight else (False,)):
                what = f"rms_norm residual={fused} weight={weight} gemma={gemma}"
                x = rand(6, 3, 512)
                inputs = dict(x=x, w=rand(512, scale=0.5) if weight else None,
                              r=rand(6, 3, 512) if fused else None)

                def ours(x, w, r):
                    return tka.rms_norm(x, w, 1e-5, residual=r, gemma=gemma)

                def reference(x, w, r):
                    h = x if r is None else x + r
                    y = rms_ref(h, w, 1e-5, gemma)
                    return y if r is None else (y, h)

                run_both(ours, reference, inputs, f32, what)
    x, r = leaf(rand(4, 64)), rand(4, 64)
    before = r.clone()
    _, h = tka.rms_norm(x, None, residual=r)
    assert torch.equal(r, before) and h.data_ptr() != r.data_ptr(), "the residual was changed"


def test_layer_norm_gradients():
    for fused in (False, True):
        for params in (False, True):
            what = f"layer_norm residual={fused} params={params}"
            inputs = dict(x=rand(5, 700, scale=2.0) + 0.5,
                          w=rand(700) if params else None, b=rand(700) if params else None,
                          r=rand(5, 700) if fused else None)

            def ours(x, w, b, r):
                return tka.layer_norm(x, w, b, 1e-5, residual=r)

            def reference(x, w, b, r):
                h = x if r is None else x + r
                y = ln_ref(h, w, b, 1e-5)
                return y if r is None else (y, h)

            run_both(ours, reference, inputs, torch.float32, what)


def test_activation_and_gelu_gradients():
    for kind, f in ACT_REF.items():
        for bias in (False, True):
            inputs = dict(x=rand(9, 300, scale=2.0), b=rand(300) if bias else None)
            run_both(lambda x, b: tka.activation(x, kind, b),
                     lambda x, b: f(x if b is None else x + b), inputs, torch.float32,
                     f"activation {kind} bias={bias}")
    for approx in ("none", "tanh"):
        run_both(lambda x: tka.gelu(x, approx), lambda x: F.gelu(x, approximate=approx),
                 dict(x=rand(3, 5, 128, scale=3.0)), torch.float32, f"gelu {approx}")


def test_glu_gradients_every_kind_and_layout():
    for kind in ("swiglu", "geglu", "geglu_tanh", "reglu", "swiglu_clamped"):
        for layout in ("gate_first", "up_first", "interleaved"):
            run_both(lambda x: tka.glu(x, kind, layout, limit=LIMIT),
                     lambda x: glu_ref(x, kind, layout, limit=LIMIT),
                     dict(x=rand(7, 2 * 192, scale=4.0)), torch.float32, f"glu {kind} {layout}")
    wide = rand(8, 600)
    x = leaf(wide)
    y = tka.glu(x[:, :512])  # strided rows
    y.backward(torch.ones_like(y))
    assert x.grad.shape == wide.shape and bool((x.grad[:, 512:] == 0).all())


def test_softmax_and_log_softmax_gradients():
    for log in (False, True):
        for causal, offset, period in [(False, 0, 0), (True, 0, 4), (True, 3, 0)]:
            fn = tka.log_softmax if log else tka.softmax
            x = rand(2, 8, 333, scale=3.0)
            # A masked log-softmax output is -inf whatever x is: its gradient is taken as 0 (as
            # libtkern does), where torch's formula would fold it into the row's sum.
            masked = torch.isinf(softmax_ref(x, 0.7, log, causal, offset, period))

            def ours(x):
                return fn(x, scale=0.7, causal=causal, causal_offset=offset,
                          causal_period=period).masked_fill(masked, 0.0)

            def reference(x):
                return softmax_ref(x, 0.7, log, causal, offset, period).masked_fill(masked, 0.0)

            run_both(ours, reference, dict(x=x), torch.float32,
                     f"{'log_' if log else ''}softmax causal={causal} {offset} {period}")


def test_rope_gradients():
    T, HQ, HK = 11, 4, 2
    pos = torch.randint(0, 4096, (T,), device=DEV, dtype=torch.int64)
    for style in ("neox", "gptj"):
        for head_dim, rotary_dim in [(64, None), (128, 32)]:
            def reference(q, k):
                return (rope_ref(q, pos, rotary_dim, style),
                        rope_ref(k, pos, rotary_dim, style))

            run_both(lambda q, k: tka.rope(q, k, pos, style=style, rotary_dim=rotary_dim),
                     reference, dict(q=rand(T, HQ, head_dim), k=rand(T, HK, head_dim)),
                     torch.float32, f"rope {style} D={head_dim} rd={rotary_dim}")
    q = leaf(rand(T, HQ, 64))
    qo, none = tka.rope(q, None, pos)
    assert none is None
    qo.sum().backward()  # a broadcast (stride 0) output gradient
    compare(q.grad, rope_ref(torch.ones(T, HQ, 64, device=DEV, dtype=torch.float64), pos, None,
                             "neox", inverse=True), "rope of q alone, sum()", torch.float32)


def test_gemm_gradients_with_epilogue():
    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in [(48, 80, 64), (5, 24, 40)]:
            for epi in ({}, {"bias": True, "activation": "gelu"},
                        {"c": True, "alpha": 0.5, "beta": 0.25, "activation": "silu"},
                        {"bias": True, "out_dtype": "float32", "activation": "relu"}):
                odt = getattr(torch, epi.get("out_dtype", str(dtype)[6:]))
                act = epi.get("activation")
                alpha, beta = epi.get("alpha", 1.0), epi.get("beta")
                inputs = dict(a=rand(2, m, k, dtype=dtype, scale=k ** -0.25),
                              w=rand(n, k, dtype=dtype, scale=k ** -0.25),
                              bias=rand(n, dtype=odt) if epi.get("bias") else None,
                              c=rand(2, m, n, dtype=odt) if epi.get("c") else None)

                def ours(a, w, bias, c):
                    return tka.gemm(a, w.t(), bias, act, c=c, alpha=alpha, beta=beta,
                                    out_dtype=epi.get("out_dtype"))

                def reference(a, w, bias, c):
                    z = alpha * (a @ w.t())
                    if c is not None:
                        z = z + (1.0 if beta is None else beta) * c
                    if bias is not None:
                        z = z + bias
                    return ACT_REF[act or "none"](z)

                run_both(ours, reference, inputs, dtype, f"gemm {dtype} m{m} n{n} k{k} {epi}")
    # b given row-major [k, n] (no transpose) works the same.
    a, b = rand(16, 32, dtype=torch.bfloat16), rand(32, 48, dtype=torch.bfloat16)
    run_both(lambda a, b: tka.gemm(a, b), lambda a, b: a @ b, dict(a=a, b=b), torch.bfloat16,
             "gemm b [k, n]")


# -------------------------------------------------------------------------- attention -------
ATTN_GRAD_CASES = [
    dict(B=2, S=130, Hq=4, Hkv=4, D=64),
    dict(B=1, S=160, Hq=8, Hkv=2, D=128, causal=True),
    dict(B=1, S=200, Hq=4, Hkv=1, D=64, causal=True, window=(63, 0)),
    dict(B=1, S=150, Hq=2, Hkv=2, D=128, window=(40, 17)),
    dict(B=1, S=96, Hq=4, Hkv=2, D=64, causal=True, softcap=30.0, alibi=True, scale=0.2),
    dict(B=1, S=130, Hq=4, Hkv=2, D=80, causal=True),
    dict(B=2, S=100, Hq=2, Hkv=1, D=96, window=(30, 10)),
]


def attn_sdpa(q, k, v, causal=False, window=None, scale=None):
    """Attention of q [B, S, Hq, D], k, v [B, S, Hkv, D] through SDPA, K and V repeated over the
    GQA group; a window (with causal or not) as attn_ref's boolean mask."""
    group = q.shape[2] // k.shape[2]
    mask = None
    if window is not None:
        with torch.no_grad():
            mask = attn_ref(q, k, v, causal=causal, window=window)[2]
        causal = False
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k.repeat_interleave(group, 2),
                                              v.repeat_interleave(group, 2)))
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal,
                                          scale=scale).transpose(1, 2)


def attn_grads(fn, q, k, v, dout):
    """[dq, dk, dv] of fn on float64 copies of q, k, v for the output gradient dout."""
    leaves = [leaf(t.double()) for t in (q, k, v)]
    fn(*leaves).backward(dout.double())
    return [t.grad for t in leaves]


def check_attention_grads(got, q, k, v, dout, what, alibi=None, **kw):
    """got [dq, dk, dv] ([B, S, H, D]) against float64 autograd, by FlashAttention's rule."""
    dt = q.dtype
    if kw.get("softcap") or alibi is not None:
        exact = attn_grads(lambda *t: attn_ref(*t, alibi=alibi, **kw)[0], q, k, v, dout)
    else:
        exact = attn_grads(lambda *t: attn_sdpa(*t, **kw), q, k, v, dout)
    naive = attn_grads(lambda *t: attn_ref(*t, alibi=alibi, naive=dt, **kw)[0], q, k, v, dout)
    for name, g, e, n in zip(("dq", "dk", "dv"), got, exact, naive):
        assert g is not None and g.shape == e.shape, f"{what}: {name} missing or misshaped"
        assert torch.isfinite(g).all(), f"{what}: non-finite {name}"
        err = (g.double() - e).abs().max().item()
        err_naive = (n.to(dt).double() - e).abs().max().item()
        atol = representation_term(e, dt)
        assert err <= 2 * err_naive + atol, (
            f"{what}: max |{name} - ref| = {err:.3g} > 2 x naive error {err_naive:.3g} + "
            f"{atol:.3g}")


def test_attention_gradients_against_sdpa():
    for dtype in (torch.float16, torch.bfloat16):
        for case in ATTN_GRAD_CASES:
            for layout in ("bshd", "bhsd"):
                c = dict(case)
                B, S, Hq, Hkv, D = (c.pop(n) for n in ("B", "S", "Hq", "Hkv", "D"))
                alibi = rand(Hq).abs().float() * 0.1 if c.pop("alibi", False) else None
                what = (f"attention {NAMES[dtype]} {layout} B{B} S{S} H{Hq}/{Hkv} D{D} {c} "
                        f"alibi={alibi is not None}")
                q = rand(B, S, Hq, D, dtype=dtype)
                k, v = rand(B, S, Hkv, D, dtype=dtype), rand(B, S, Hkv, D, dtype=dtype)
                dout = rand(B, S, Hq, D, dtype=dtype)
                # bhsd: [B, H, S, D] leaves, and a transposed (strided) output gradient.
                flip = (lambda t: t.transpose(1, 2)) if layout == "bhsd" else (lambda t: t)
                mine = [leaf(flip(t).contiguous()) for t in (q, k, v)]
                o = tka.attention(*mine, alibi_slopes=alibi, layout=layout, **c)
                o.backward(flip(dout))
                check_attention_grads([flip(t.grad) for t in mine], q, k, v, dout, what,
                                      alibi=alibi, **c)


def test_attention_deterministic_gradients_repeat_bit_for_bit():
    """deterministic=True: dq, dk, dv identical over 3 backward passes where many key tiles add
    to each query tile (causal GQA) and under a window on both sides, and right by the rule."""
    for case in (dict(B=1, S=1024, Hq=8, Hkv=2, D=128, causal=True),
                 dict(B=2, S=600, Hq=4, Hkv=2, D=64, window=(100, 40))):
        c = dict(case)
        B, S, Hq, Hkv, D = (c.pop(n) for n in ("B", "S", "Hq", "Hkv", "D"))
        what = f"deterministic attention bfloat16 B{B} S{S} H{Hq}/{Hkv} D{D} {c}"
        q = rand(B, S, Hq, D, dtype=torch.bfloat16)
        k, v = rand(B, S, Hkv, D, dtype=torch.bfloat16), rand(B, S, Hkv, D, dtype=torch.bfloat16)
        dout = rand(B, S, Hq, D, dtype=torch.bfloat16)
        runs = []
        for _ in range(3):
            mine = [leaf(t) for t in (q, k, v)]
            tka.attention(*mine, deterministic=True, **c).backward(dout)
            runs.append([t.grad for t in mine])
        for r, grads in enumerate(runs[1:], 1):
            for name, first, again in zip(("dq", "dk", "dv"), runs[0], grads):
                assert torch.equal(first, again), f"{what}: run {r}'s {name} differs from run 0's"
        check_attention_grads(runs[0], q, k, v, dout, what, **c)


def test_attention_masks_and_sinks_gradients():
    """dq, dk, dv under each specialised mask against float64 autograd through attn_ref, and
    dsinks within 2 % of the magnitude of its terms (p_sink_i |dout_i . o_i|)."""
    for case in MASK_CASES:
        if case["Sq"] != case["Sk"] and case.get("sinks"):
            continue  # covered by the forward test; here the gradients of full rows
        q, k, v, c, what = mask_case(case, torch.bfloat16)
        dout = rand(*q.shape, dtype=torch.bfloat16)
        mine = [leaf(t) for t in (q, k, v)]
        sinks = c.pop("sinks", None)
        sink_leaf = leaf(sinks) if sinks is not None else None
        o = tka.attention(*mine, sinks=sink_leaf, **c)
        o.backward(dout)
        exact_leaves = [leaf(t.double()) for t in (q, k, v)]
        exact_sink = leaf(sinks.double()) if sinks is not None else None
        attn_ref(*exact_leaves, sinks=exact_sink, **c)[0].backward(dout.double())
        naive = attn_grads(lambda *t: attn_ref(*t, sinks=sinks, naive=torch.bfloat16, **c)[0],
                           q, k, v, dout)
        for name, g, e, n in zip(("dq", "dk", "dv"), mine, exact_leaves, naive):
            err = (g.grad.double() - e.grad).abs().max().item()
            err_naive = (n.to(torch.bfloat16).double() - e.grad).abs().max().item()
            atol = representation_term(e.grad, torch.bfloat16)
            assert err <= 2 * err_naive + atol, (
                f"{what}: max |{name} - ref| = {err:.3g} > 2 x naive {err_naive:.3g} + {atol:.3g}")
        if sinks is None:
            continue
        with torch.no_grad():
            o64, lse64, _ = attn_ref(q.double(), k.double(), v.double(), sinks=sinks, **c)
            p_sink = torch.exp(sinks.double().view(1, -1, 1) - lse64)  # [B, Hq, Sq]
            d = (dout.double() * o64).sum(-1).transpose(1, 2)  # [B, Hq, Sq]
            bound = 0.02 * (p_sink * d.abs()).sum((0, 2)) + 1e-4
        err = (sink_leaf.grad.double() - exact_sink.grad).abs()
        assert (err <= bound).all(), f"{what}: dsinks {sink_leaf.grad} vs {exact_sink.grad}"


def test_attention_broadcast_output_gradient():
    q = rand(1, 64, 4, 128, dtype=torch.bfloat16)
    k, v = rand(1, 64, 2, 128, dtype=torch.bfloat16), rand(1, 64, 2, 128, dtype=torch.bfloat16)
    mine = [leaf(t) for t in (q, k, v)]
    tka.attention(*mine, causal=True).sum().backward()  # a stride-0 output gradient
    check_attention_grads([t.grad for t in mine], q, k, v, torch.ones_like(q),
                          "attention, sum() of the output", causal=True)
