"""GPU tests: every tkern function against a float64 PyTorch reference, on torch and CuPy
inputs, with strided inputs (handled or rejected, never wrong) and non-default streams.

Tolerances are those of the C suites: |got - ref| <= rtol * (scale + |ref|) with rtol 1e-5
(float32), 1e-3 (float16), 1e-2 (bfloat16); attention follows FlashAttention's rule (error at
most twice that of a naive same-precision implementation plus the rounding near 0.3).
Skipped without torch or without a CUDA GPU; the CuPy cases are skipped without CuPy.
"""

import contextlib
import math

import pytest

torch = pytest.importorskip("torch", reason="the GPU tests need torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import tkern  # noqa: E402

try:
    import cupy
except ImportError:
    cupy = None

needs_cupy = pytest.mark.skipif(cupy is None, reason="CuPy is not installed")

DEV = "cuda"
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
RTOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def rand(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float64) * scale).to(dtype)


def as_torch(a):
    return a if isinstance(a, torch.Tensor) else torch.from_dlpack(a)


def check(got, ref, what, scale=1.0, dtype=None):
    """Asserts got (torch or CuPy) matches the float64 ref elementwise; equal values (incl.
    +-inf) and NaN where ref is NaN pass."""
    g = as_torch(got)
    torch.cuda.synchronize()
    rtol = RTOL[dtype or g.dtype]
    g, r = g.double(), ref.double().to(g.device)
    assert g.shape == r.shape, f"{what}: shape {tuple(g.shape)}, reference {tuple(r.shape)}"
    same = (g == r) | (torch.isnan(g) & torch.isnan(r))
    err = (g - r).abs()
    bad = ~same & ~(err <= rtol * (scale + r.abs()))
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {g.numel()} elements off (rtol {rtol}, scale {scale});"
            f" first at flat index {i}: got {g.flatten()[i].item()}, ref "
            f"{r.flatten()[i].item()}; max error {err[~same].max().item():.3g}")


def cp(t):
    """A CuPy view of a torch tensor (zero copy)."""
    return cupy.from_dlpack(t)


# ------------------------------------------------------------------------ activations -------
ACT_REF = {
    "none": lambda h: h,
    "gelu": F.gelu,
    "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"),
    "quick_gelu": lambda h: h * torch.sigmoid(1.702 * h),
    "silu": F.silu,
    "relu": F.relu,
    "relu_squared": lambda h: F.relu(h) ** 2,
}


def act_grad(f, h, dy):
    h = h.detach().clone().requires_grad_(True)
    f(h).backward(dy)
    return h.grad


def test_gelu_and_gradient():
    for dtype in FLOATS:
        for approx in ("none", "tanh"):
            for shape in [(7,), (3, 1000), (2, 129, 4096)]:
                what = f"gelu {approx} {NAMES[dtype]} {shape}"
                x = rand(*shape, dtype=dtype, scale=3.0)
                check(tkern.gelu(x, approximate=approx), F.gelu(x.double(), approximate=approx),
                      what)
                dy = rand(*shape, dtype=dtype)
                ref = act_grad(lambda h: F.gelu(h, approximate=approx), x.double(), dy.double())
                check(tkern.gelu_backward(dy, x, approximate=approx), ref, what + " backward")
                inplace = x.clone()
                assert tkern.gelu(inplace, approximate=approx, out=inplace) is inplace
                check(inplace, F.gelu(x.double(), approximate=approx), what + " in place")


def test_activation_every_kind_with_and_without_bias():
    for dtype in FLOATS:
        for kind, f in ACT_REF.items():
            for rows, cols in [(1, 1), (33, 200), (4, 4096)]:
                x = rand(rows, cols, dtype=dtype, scale=2.0)
                dy = rand(rows, cols, dtype=dtype)
                for bias in (None, rand(cols, dtype=dtype)):
                    what = (f"activation {kind} {NAMES[dtype]} [{rows}, {cols}] "
                            f"bias={bias is not None}")
                    h = x.double() + (0 if bias is None else bias.double())
                    check(tkern.activation(x, kind, bias=bias), f(h), what)
                    check(tkern.activation_backward(dy, x, kind, bias=bias),
                          act_grad(f, h, dy.double()), what + " backward")


def glu_ref(x, kind, layout, alpha=1.702, limit=7.0):
    d = x.shape[-1] // 2
    if layout == "gate_first":
        gate, up = x[..., :d], x[..., d:]
    elif layout == "up_first":
        up, gate = x[..., :d], x[..., d:]
    else:
        gate, up = x[..., 0::2], x[..., 1::2]
    if kind == "swiglu_clamped":
        g = gate.clamp(max=limit)
        u = up.clamp(-limit, limit)
        return g * torch.sigmoid(alpha * g) * (u + 1)
    act = {"swiglu": F.silu, "geglu": F.gelu, "geglu_tanh": lambda t: F.gelu(t, approximate="tanh"),
           "reglu": F.relu}[kind]
    return act(gate) * up


# The clamp bound of swiglu_clamped: a float32 value no float16 / bfloat16 input can equal, so
# no input sits exactly on the clamp (where "active" is a convention).
LIMIT = float(torch.tensor(6.9, dtype=torch.float32))


def test_glu_every_kind_and_layout_with_gradient():
    for dtype in FLOATS:
        for kind in ("swiglu", "geglu", "geglu_tanh", "reglu", "swiglu_clamped"):
            for layout in ("gate_first", "up_first", "interleaved"):
                for rows, d in [(1, 8), (37, 1000), (3, 4096)]:
                    what = f"glu {kind} {layout} {NAMES[dtype]} [{rows}, 2x{d}]"
                    x = rand(rows, 2 * d, dtype=dtype, scale=4.0)
                    check(tkern.glu(x, kind, layout, limit=LIMIT),
                          glu_ref(x.double(), kind, layout, limit=LIMIT), what)
                    dy = rand(rows, d, dtype=dtype)
                    ref = act_grad(lambda t: glu_ref(t, kind, layout, limit=LIMIT), x.double(),
                                   dy.double())
                    check(tkern.glu_backward(dy, x, kind, layout, limit=LIMIT), ref,
                          what + " backward")
    x = rand(5, 3, 2 * 256, dtype=torch.bfloat16)
    check(tkern.swiglu(x), F.silu(x[..., :256].double()) * x[..., 256:].double(), "swiglu 3-D")


def test_activation_layouts_strided_handled_or_rejected():
    wide = rand(16, 3000, dtype=torch.bfloat16)
    x = wide[:, :2048]  # strided rows: GLU takes a row stride
    check(tkern.swiglu(x), glu_ref(x.double(), "swiglu", "gate_first"), "swiglu of a column slice")
    out_wide = torch.full((16, 1500), float("nan"), device=DEV, dtype=torch.bfloat16)
    tkern.swiglu(x, out=out_wide[:, :1024])
    check(out_wide[:, :1024], glu_ref(x.double(), "swiglu", "gate_first"), "swiglu into a slice")
    assert torch.isnan(out_wide[:, 1024:].float()).all(), "swiglu wrote outside its output slice"
    with pytest.raises(ValueError, match="argument 'x' must be contiguous"):
        tkern.gelu(rand(64, 32, dtype=torch.float16).t())
    with pytest.raises(ValueError, match="argument 'x' must be contiguous"):
        tkern.activation(wide[:, :100], "silu")
    with pytest.raises(ValueError, match="argument 'x': the last dimension must be contiguous"):
        tkern.glu(rand(64, 32, dtype=torch.float16).t())


def test_autograd_leaves_are_accepted():
    x = rand(4, 64).requires_grad_(True)
    check(tkern.gelu(x), F.gelu(x.detach().double()), "gelu of a leaf requiring grad")


# ----------------------------------------------------------------------------- norms -------
def rms_ref(h, w, eps, gemma=False):
    y = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * ((1 + w) if gemma else w)
    return y


def ln_ref(h, w, b, eps):
    y = (h - h.mean(-1, keepdim=True)) * torch.rsqrt(h.var(-1, unbiased=False, keepdim=True) + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def test_rms_norm_with_residual_weights_and_gradient():
    for dtype in FLOATS:
        for rows, cols in [(1, 1), (17, 4096), (5, 1000), (2, 100_000)]:
            for wdtype in (None, dtype, torch.float32):
                for fused in (False, True):
                    what = (f"rms_norm {NAMES[dtype]} [{rows}, {cols}] weight "
                            f"{NAMES.get(wdtype)} residual={fused}")
                    x = rand(rows, cols, dtype=dtype)
                    w = None if wdtype is None else rand(cols, dtype=wdtype)
                    res = rand(rows, cols, dtype=dtype) if fused else None
                    h = (x.double() + res.double()).to(dtype) if fused else x
                    y, rstd = tkern.rms_norm(x, w, 1e-5, residual=res, return_rstd=True)
                    w64 = None if w is None else w.double()
                    check(y, rms_ref(h.double(), w64, 1e-5), what)
                    if fused:
                        check(res, h.double(), what + " (updated residual)")
                    check(rstd, torch.rsqrt((h.double() ** 2).mean(-1) + 1e-5), what + " rstd")
                    if cols == 1:
                        continue  # dx = rstd g eps / (h^2 + eps): ill-conditioned, checked in C
                    dy = rand(rows, cols, dtype=dtype)
                    hh = h.double().requires_grad_(True)
                    ww = None if w is None else w.double().requires_grad_(True)
                    rms_ref(hh, ww, 1e-5).backward(dy.double())
                    dx, dw = tkern.rms_norm_backward(dy, h, rstd, w, weight_grad=w is not None)
                    check(dx, hh.grad, what + " dx")
                    if w is not None:
                        check(dw, ww.grad, what + " dw")
    x = rand(8, 512, dtype=torch.bfloat16)
    w = rand(512, dtype=torch.bfloat16, scale=0.1)
    check(tkern.rms_norm(x, w, 1e-6, gemma=True), rms_ref(x.double(), w.double(), 1e-6, True),
          "rms_norm gemma")


def test_layer_norm_and_gradient():
    for dtype in FLOATS:
        for rows, cols in [(3, 7), (17, 4096), (4, 10_000)]:
            for params in (False, True):
                what = f"layer_norm {NAMES[dtype]} [{rows}, {cols}] params={params}"
                x = rand(rows, cols, dtype=dtype, scale=2.0) + 0.5
                w = rand(cols, dtype=dtype) if params else None
                b = rand(cols, dtype=dtype) if params else None
                res = rand(rows, cols, dtype=dtype)
                h = (x.double() + res.double()).to(dtype)
                y, mean, rstd = tkern.layer_norm(x, w, b, 1e-5, residual=res, return_stats=True)
                ref = ln_ref(h.double(), None if w is None else w.double(),
                             None if b is None else b.double(), 1e-5)
                check(y, ref, what)
                check(mean, h.double().mean(-1), what + " mean", scale=1.0)
                dy = rand(rows, cols, dtype=dtype)
                hh = h.double().requires_grad_(True)
                ones = torch.ones(cols, device=DEV, dtype=torch.float64)
                ww = (w.double() if params else ones).requires_grad_(True)
                bb = (b.double() if params else torch.zeros_like(ones)).requires_grad_(True)
                ln_ref(hh, ww, bb, 1e-5).backward(dy.double())
                dx, dw, db = tkern.layer_norm_backward(dy, h, mean, rstd, w)
                check(dx, hh.grad, what + " dx")
                check(dw, ww.grad, what + " dw")
                check(db, bb.grad, what + " db")
    assert tkern.norm_backward_workspace_size(rand(64, 4096, dtype=torch.bfloat16), "rms") > 0


def test_norm_strided_rows_and_rejections():
    wide = rand(9, 5000, dtype=torch.float16)
    x = wide[:, :4096]
    w = rand(4096, dtype=torch.float16)
    check(tkern.rms_norm(x, w, 1e-6), rms_ref(x.double(), w.double(), 1e-6), "rms_norm of a slice")
    with pytest.raises(ValueError, match="argument 'x': the last dimension must be contiguous"):
        tkern.rms_norm(rand(64, 32, dtype=torch.float16).t(), None)
    with pytest.raises(ValueError, match=r"argument 'weight' has shape \(100,\)"):
        tkern.rms_norm(x, rand(100, dtype=torch.float16))
    with pytest.raises(ValueError, match="argument 'x' has a zero or negative stride"):
        tkern.rms_norm(x[:1].expand(9, -1), w)  # broadcast rows
    with pytest.raises(tkern.TkernError, match="TK_ERROR_INVALID_VALUE") as e:
        tkern.rms_norm(x, w, eps=-1.0)
    assert "eps" in e.value.message


# --------------------------------------------------------------------------- softmax -------
def softmax_ref(x, scale, log, causal, offset, period):
    s = x.double() * scale
    if causal:
        flat_rows = x.numel() // x.shape[-1]
        r = torch.arange(flat_rows, device=DEV).reshape(x.shape[:-1])
        q = r % (period or flat_rows)
        c = torch.arange(x.shape[-1], device=DEV)
        visible = c <= (q + offset).unsqueeze(-1)
        s = s.masked_fill(~visible, float("-inf"))
        seen = visible.any(-1, keepdim=True)
    else:
        seen = torch.ones_like(s[..., :1], dtype=torch.bool)
    out = torch.log_softmax(s, -1) if log else torch.softmax(s, -1)
    blank = torch.full_like(out, float("-inf") if log else 0.0)
    return torch.where(seen, out, blank)


def test_softmax_forward_backward_masks():
    for dtype in FLOATS:
        for shape in [(1, 1), (13, 1000), (2, 3, 4096), (3, 70_000)]:
            for log in (False, True):
                for causal, offset, period in [(False, 0, 0), (True, 0, 0), (True, -2, 5),
                                               (True, 300, 0)]:
                    if causal and len(shape) < 2:
                        continue
                    what = (f"{'log_' if log else ''}softmax {NAMES[dtype]} {shape} causal="
                            f"{causal} offset={offset} period={period}")
                    x = rand(*shape, dtype=dtype, scale=3.0)
                    fn = tkern.log_softmax if log else tkern.softmax
                    y = fn(x, scale=0.7, causal=causal, causal_offset=offset, causal_period=period)
                    ref = softmax_ref(x, 0.7, log, causal, offset, period)
                    check(y, ref, what)
                    dy = rand(*shape, dtype=dtype)
                    yd, dyd = y.double(), dy.double()
                    if log:
                        dx_ref = 0.7 * (dyd - torch.exp(yd) * dyd.masked_fill(
                            torch.isinf(ref), 0).sum(-1, keepdim=True))
                    else:
                        dx_ref = 0.7 * yd * (dyd - (dyd * yd).sum(-1, keepdim=True))
                    dx_ref = dx_ref.masked_fill(torch.isinf(ref) | ((ref == 0) & causal), 0.0)
                    dx = tkern.softmax_backward(y, dy, log=log, scale=0.7, causal=causal,
                                                causal_offset=offset, causal_period=period)
                    check(dx, dx_ref, what + " backward")


def test_softmax_strided_rows():
    wide = rand(12, 3000, dtype=torch.bfloat16)
    x = wide[:, 1000:2500]
    out = torch.full((12, 2000), float("nan"), device=DEV, dtype=torch.bfloat16)
    tkern.softmax(x, out=out[:, :1500])
    check(out[:, :1500], torch.softmax(x.double(), -1), "softmax slice into slice")
    assert torch.isnan(out[:, 1500:].float()).all()
    with pytest.raises(ValueError, match="argument 'dim'"):
        tkern.softmax(x, dim=0)


# ------------------------------------------------------------------------------ rope -------
def rope_ref(x, pos, rotary_dim, style, theta=10000.0, cache=None, inverse=False):
    """x [..., H, D] float64, pos [...] -> rotated copy."""
    d = x.shape[-1]
    rd = rotary_dim or d
    half = rd // 2
    if cache is None:
        inv = theta ** (-2.0 * torch.arange(half, device=DEV, dtype=torch.float64) / rd)
        ang = pos.double().unsqueeze(-1) * inv
        cos, sin = torch.cos(ang), torch.sin(ang)
    else:
        cos = cache[pos.long(), :half].double()
        sin = cache[pos.long(), half:rd].double()
    if inverse:
        sin = -sin
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = x.clone()
    if style == "neox":
        x1, x2 = x[..., :half], x[..., half:rd]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rd] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2] = x1 * cos - x2 * sin
        out[..., 1:rd:2] = x2 * cos + x1 * sin
    return out


def test_rope_styles_positions_caches_inplace_and_packed():
    for dtype in FLOATS:
        for style in ("neox", "gptj"):
            for head_dim, rotary_dim in [(64, None), (128, 32), (80, 80)]:
                what = f"rope {style} {NAMES[dtype]} D={head_dim} rd={rotary_dim}"
                T, HQ, HK = 37, 8, 2
                q = rand(T, HQ, head_dim, dtype=dtype)
                k = rand(T, HK, head_dim, dtype=dtype)
                pos = torch.randint(0, 4096, (T,), device=DEV, dtype=torch.int32)
                qo, ko = tkern.rope(q, k, pos, style=style, rotary_dim=rotary_dim)
                check(qo, rope_ref(q.double(), pos, rotary_dim, style), what + " q")
                check(ko, rope_ref(k.double(), pos, rotary_dim, style), what + " k")
                # In place, int64 positions, Llama 3 theta.
                q2, k2 = q.clone(), k.clone()
                r = tkern.rope_(q2, k2, pos.long(), theta=500000.0, style=style,
                                rotary_dim=rotary_dim)
                assert r[0] is q2 and r[1] is k2
                check(q2, rope_ref(q.double(), pos, rotary_dim, style, 500000.0), what + " q_")
                check(k2, rope_ref(k.double(), pos, rotary_dim, style, 500000.0), what + " k_")
                # No positions: position_start + token index; q only.
                start = torch.arange(T, device=DEV) + 11
                qo, none = tkern.rope(q, None, position_start=11, style=style,
                                      rotary_dim=rotary_dim)
                assert none is None
                check(qo, rope_ref(q.double(), start, rotary_dim, style), what + " no positions")
                # vLLM-style cos_sin_cache [max_position, rotary_dim].
                rd = rotary_dim or head_dim
                inv = 10000.0 ** (-2.0 * torch.arange(rd // 2, device=DEV,
                                                       dtype=torch.float64) / rd)
                ang = torch.arange(4096, device=DEV, dtype=torch.float64).unsqueeze(-1) * inv
                cache = torch.cat([torch.cos(ang), torch.sin(ang)], -1).float()
                qo, ko = tkern.rope(q, k, pos, style=style, rotary_dim=rotary_dim,
                                    cos_sin_cache=cache)
                check(qo, rope_ref(q.double(), pos, rotary_dim, style, cache=cache),
                      what + " cache")
                half = rd // 2
                qo, _ = tkern.rope(q, None, pos, style=style, rotary_dim=rotary_dim,
                                   cos=cache[:, :half], sin=cache[:, half:])
                check(qo, rope_ref(q.double(), pos, rotary_dim, style, cache=cache),
                      what + " cos/sin")
                # Backward: the opposite rotation.
                dq, dk = tkern.rope_backward(q, k, pos, style=style, rotary_dim=rotary_dim)
                check(dq, rope_ref(q.double(), pos, rotary_dim, style, inverse=True), what + " dq")
                check(dk, rope_ref(k.double(), pos, rotary_dim, style, inverse=True), what + " dk")
    # A packed QKV buffer [B, S, HQ + 2 HK, D]: rotate the q and k views in place, v untouched.
    B, S, HQ, HK, D = 2, 33, 8, 2, 128
    qkv = rand(B, S, HQ + 2 * HK, D, dtype=torch.bfloat16)
    orig = qkv.clone()
    pos = torch.randint(0, 8192, (B, S), device=DEV, dtype=torch.int64)
    tkern.rope_(qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HK], pos)
    check(qkv[:, :, :HQ], rope_ref(orig[:, :, :HQ].double(), pos, None, "neox"), "packed q")
    check(qkv[:, :, HQ:HQ + HK], rope_ref(orig[:, :, HQ:HQ + HK].double(), pos, None, "neox"),
          "packed k")
    assert torch.equal(qkv[:, :, HQ + HK:], orig[:, :, HQ + HK:]), "rope_ touched v"
    with pytest.raises(ValueError, match="argument 'positions' has 10 elements"):
        tkern.rope_(qkv[:, :, :HQ], None, pos.flatten()[:10])
    with pytest.raises(ValueError, match="argument 'q': head_dim"):
        tkern.rope_(qkv.transpose(2, 3), None)


# ------------------------------------------------------------------------- attention -------
def attn_ref(q, k, v, causal=False, window=None, softcap=0.0, scale=None, alibi=None,
             naive=None, sinks=None, chunk_size=0, prefix_len=0, document_ids=None):
    """q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] (float64) -> (o [B, Sq, Hq, D], lse [B, Hq, Sq],
    visible mask). naive: a dtype to round every intermediate to (the naive same-precision
    attention). sinks [Hq] join each row's denominator (and lse); chunk_size, prefix_len and
    document_ids [B, Sk] as tkern.attention's."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=2)
    v = v.repeat_interleave(Hq // Hkv, dim=2)
    rnd = (lambda t: t.to(naive).double()) if naive is not None else (lambda t: t)
    scale = scale or 1.0 / math.sqrt(D)
    s = rnd(torch.einsum("bqhd,bkhd->bhqk", q, k) * scale)
    if softcap:
        s = rnd(softcap * torch.tanh(s / softcap))
    shift = Sk - Sq
    i = torch.arange(Sq, device=DEV).view(-1, 1)
    j = torch.arange(Sk, device=DEV).view(1, -1)
    if alibi is not None:
        s = rnd(s - alibi.double().view(1, -1, 1, 1) * (i + shift - j).abs())
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    visible = torch.ones(Sq, Sk, dtype=torch.bool, device=DEV)
    if left is not None and left >= 0:
        visible &= j >= i + shift - left
    if right is not None and right >= 0:
        visible &= j <= i + shift + right
    pos = i + shift
    if chunk_size:
        visible &= (torch.div(pos, chunk_size, rounding_mode="floor")
                    == torch.div(j, chunk_size, rounding_mode="floor"))
    if prefix_len:
        visible |= (pos < prefix_len) & (j < prefix_len)
    if document_ids is not None:  # query i is key position i + shift: its document's keys only
        ids = document_ids.long()
        mine = ids[:, pos.clamp(0, Sk - 1).flatten()]
        visible = (visible & (pos >= 0)).view(1, 1, Sq, Sk) & (mine.view(B, 1, Sq, 1)
                                                               == ids.view(B, 1, 1, Sk))
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    if sinks is not None:
        sink = sinks.double().view(1, -1, 1, 1)
        m = torch.maximum(m, sink.expand_as(m))
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sink - m)
    p = rnd(torch.where(total > 0, e / total.clamp_min(1e-300), torch.zeros_like(e)))
    o = rnd(torch.einsum("bhqk,bkhd->bqhd", p, v))
    lse = torch.where(total > 0, m + torch.log(total.clamp_min(1e-300)),
                      torch.full_like(m, float("-inf"))).squeeze(-1)
    return o, lse, visible


def representation_term(exact, dt):
    """FlashAttention's atol: twice the largest change that adding and removing 0.3 in dtype dt
    makes to a reference value."""
    r = exact.to(dt).double()
    shifted = ((r + 0.3).to(dt).double() - 0.3).to(dt).double()
    return 2 * (shifted - r).abs().max().item()


def check_attention(o, q, k, v, what, lse=None, **kw):
    """FlashAttention's rule, as tests/test_attention.c."""
    o = as_torch(o).double()
    dt = q.dtype
    exact, lse_ref, _ = attn_ref(q.double(), k.double(), v.double(), **kw)
    naive, _, _ = attn_ref(q.double(), k.double(), v.double(), naive=dt, **kw)
    assert torch.isfinite(o).all(), f"{what}: non-finite outputs"
    err = (o - exact).abs().max().item()
    err_naive = (naive - exact).abs().max().item()
    atol = representation_term(exact, dt)
    assert err <= 2 * err_naive + atol, (
        f"{what}: max |o - ref| = {err:.3g} > 2 x naive error {err_naive:.3g} + {atol:.3g}")
    if lse is not None:
        check(lse, lse_ref, what + " lse")


ATTN_CASES = [
    dict(B=2, Sq=128, Sk=128, Hq=4, Hkv=4, D=64),
    dict(B=1, Sq=200, Sk=333, Hq=8, Hkv=2, D=128, causal=True),
    dict(B=2, Sq=256, Sk=256, Hq=4, Hkv=1, D=128, causal=True, window=(63, 0)),
    dict(B=1, Sq=150, Sk=300, Hq=4, Hkv=2, D=128, window=(40, 17)),
    dict(B=1, Sq=96, Sk=96, Hq=2, Hkv=2, D=256, causal=True, softcap=30.0),
    dict(B=1, Sq=64, Sk=190, Hq=4, Hkv=4, D=64, alibi=True, scale=0.2),
]


def test_attention_against_fp64_reference():
    for dtype in (torch.float16, torch.bfloat16):
        for case in ATTN_CASES:
            for layout in ("bshd", "bhsd"):
                c = dict(case)
                B, Sq, Sk, Hq, Hkv, D = (c.pop(n) for n in ("B", "Sq", "Sk", "Hq", "Hkv", "D"))
                alibi = rand(Hq).abs().float() * 0.1 if c.pop("alibi", False) else None
                what = f"attention {NAMES[dtype]} {layout} B{B} Sq{Sq} Sk{Sk} H{Hq}/{Hkv} D{D} {c}"
                q = rand(B, Sq, Hq, D, dtype=dtype)
                k = rand(B, Sk, Hkv, D, dtype=dtype)
                v = rand(B, Sk, Hkv, D, dtype=dtype)
                if layout == "bhsd":
                    qi, ki, vi = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                else:
                    qi, ki, vi = q, k, v
                o, lse = tkern.attention(qi, ki, vi, alibi_slopes=alibi, return_lse=True,
                                         layout=layout, **c)
                assert o.shape == qi.shape and lse.shape == (B, Hq, Sq)
                if layout == "bhsd":
                    o = o.transpose(1, 2)
                check_attention(o, q, k, v, what, lse=lse, alibi=alibi, **c)


def test_attention_matches_sdpa_with_explicit_window_mask():
    B, S, Hq, Hkv, D = 2, 384, 8, 2, 128
    q = rand(B, Hq, S, D, dtype=torch.bfloat16)
    k = rand(B, Hkv, S, D, dtype=torch.bfloat16)
    v = rand(B, Hkv, S, D, dtype=torch.bfloat16)
    for causal, window in [(True, None), (True, (127, 0)), (False, (64, 64))]:
        what = f"attention vs SDPA causal={causal} window={window}"
        _, _, visible = attn_ref(q.transpose(1, 2).double(), k.transpose(1, 2).double(),
                                 v.transpose(1, 2).double(), causal=causal, window=window)
        sdpa = F.scaled_dot_product_attention(
            q.float(), k.float().repeat_interleave(Hq // Hkv, 1),
            v.float().repeat_interleave(Hq // Hkv, 1), attn_mask=visible)
        o = tkern.attention(q, k, v, causal=causal, window=window, layout="bhsd")
        err = (o.double() - sdpa.double()).abs().max().item()
        check_attention(o.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2),
                        v.transpose(1, 2), what, causal=causal, window=window)
        assert err < 2e-2, f"{what}: max |tkern - SDPA(f32, explicit mask)| = {err:.3g}"
        if window and window[1] == 0:
            o2 = tkern.sliding_window_attention(q, k, v, window[0], layout="bhsd")
            assert torch.equal(o2, o), f"{what}: sliding_window_attention differs"


def test_attention_strided_views_supported_query_and_errors():
    B, S, H, D = 2, 128, 4, 64
    qkv = rand(B, S, 3, H, D, dtype=torch.float16)  # packed QKV
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o = tkern.attention(q, k, v, causal=True)
    check_attention(o, q, k, v, "attention on packed QKV views", causal=True)
    qt = rand(B, H, S, D, dtype=torch.float16).transpose(1, 2)  # BSHD view of a BHSD buffer
    o = tkern.attention(qt, k, v)
    check_attention(o, qt, k, v, "attention on a transposed q")
    ok, variant = tkern.attention_supported(q, k, v, causal=True)
    assert ok and variant, variant
    bad = rand(1, 16, 2, 72, dtype=torch.float16)  # head_dim 72: not one of 64, 80, 96, 128, 256
    ok, reason = tkern.attention_supported(bad, bad, bad)
    assert not ok and reason.startswith("TK_ERROR_NOT_SUPPORTED") and "head_dim" in reason
    with pytest.raises(tkern.TkernError) as e:
        tkern.attention(bad, bad, bad)
    assert e.value.status_name == "TK_ERROR_NOT_SUPPORTED"
    f32 = rand(1, 16, 2, 64)
    with pytest.raises(tkern.TkernError, match="TK_ERROR_NOT_SUPPORTED"):
        tkern.attention(f32, f32, f32)
    with pytest.raises(ValueError, match="argument 'k' has shape"):
        tkern.attention(q, rand(B, S, H, 128, dtype=torch.float16), v)


def doc_ids(B, Sk, doc_len):
    """int32 [B, Sk] packed documents of about doc_len keys, lengths varying per batch."""
    j = torch.arange(Sk, device=DEV) + 7 * torch.arange(B, device=DEV).view(-1, 1)
    starts = (j % doc_len == 0) | ((j % doc_len == doc_len // 3) & (j // doc_len % 2 == 1))
    starts[:, 0] = False
    return starts.long().cumsum(1).to(torch.int32)


MASK_CASES = [
    dict(B=1, Sq=300, Sk=300, Hq=4, Hkv=2, D=128, causal=True, chunk_size=64),
    dict(B=2, Sq=200, Sk=333, Hq=2, Hkv=2, D=64, chunk_size=100),
    dict(B=1, Sq=300, Sk=300, Hq=4, Hkv=1, D=128, causal=True, prefix_len=70),
    dict(B=2, Sq=250, Sk=250, Hq=4, Hkv=2, D=64, causal=True, docs=40),
    dict(B=1, Sq=100, Sk=300, Hq=8, Hkv=2, D=128, window=(20, 9), docs=64, softcap=20.0),
    dict(B=2, Sq=300, Sk=300, Hq=4, Hkv=2, D=128, causal=True, window=(37, 0), sinks=True),
    dict(B=1, Sq=333, Sk=200, Hq=2, Hkv=1, D=64, causal=True, sinks=True),  # rows: sink only
]


def mask_case(case, dtype):
    """(q, k, v, keyword arguments, description) of a MASK_CASES entry."""
    c = dict(case)
    B, Sq, Sk, Hq, Hkv, D = (c.pop(n) for n in ("B", "Sq", "Sk", "Hq", "Hkv", "D"))
    if c.pop("sinks", False):
        c["sinks"] = (torch.rand(Hq, device=DEV, dtype=torch.float64) * 6 - 2).float()
    docs = c.pop("docs", 0)
    if docs:
        c["document_ids"] = doc_ids(B, Sk, docs)
    what = f"attention {NAMES[dtype]} B{B} Sq{Sq} Sk{Sk} H{Hq}/{Hkv} D{D} {case}"
    return (rand(B, Sq, Hq, D, dtype=dtype), rand(B, Sk, Hkv, D, dtype=dtype),
            rand(B, Sk, Hkv, D, dtype=dtype), c, what)


def test_attention_masks_and_sinks_against_fp64_reference():
    for dtype in (torch.float16, torch.bfloat16):
        for case in MASK_CASES:
            q, k, v, c, what = mask_case(case, dtype)
            o, lse = tkern.attention(q, k, v, return_lse=True, **c)
            check_attention(o, q, k, v, what, lse=lse, **c)
    q, k, v, c, _ = mask_case(MASK_CASES[3], torch.bfloat16)
    with pytest.raises(ValueError, match="argument 'document_ids'"):
        tkern.attention(q, k, v, document_ids=c["document_ids"][:, :100])
    with pytest.raises(tkern.TkernError, match="p->prefix_len = 8 needs p->causal = 1"):
        tkern.attention(q, k, v, prefix_len=8)


# ------------------------------------------------------------------ attention over a KV cache --
def paged(full, page_size, table=None, spare=3):
    """full [B, capacity, H, D] scattered into shuffled pages: (pages [num_pages, page_size, H,
    D], block_table int32 [B, capacity / page_size]); `spare` random pages belong to no
    sequence. A given table places a second cache (the values) in the same pages."""
    B, cap = full.shape[:2]
    per_seq = cap // page_size
    if table is None:
        table = torch.randperm(B * per_seq + spare, device=DEV)[:B * per_seq].view(B, per_seq)
        table = table.to(torch.int32)
    pages = rand(B * per_seq + spare, page_size, *full.shape[2:], dtype=full.dtype)
    pages[table.long().flatten()] = full.reshape(B * per_seq, page_size, *full.shape[2:])
    return pages, table


def unpaged(pages, table):
    """The [B, capacity, H, D] view of a paged cache, for comparing what was written."""
    B, per_seq = table.shape
    return pages[table.long().flatten()].reshape(B, per_seq * pages.shape[1], *pages.shape[2:])


KVCACHE_CASES = [
    dict(B=3, Sq=1, Hq=8, Hkv=2, D=128, lens=[1, 77, 300]),
    dict(B=2, Sq=1, Hq=4, Hkv=1, D=64, lens=[513, 1000], causal=True, window=(127, 0)),
    dict(B=2, Sq=4, Hq=4, Hkv=4, D=256, lens=[4, 250], causal=True, softcap=30.0),
    dict(B=4, Sq=3, Hq=16, Hkv=2, D=128, lens=[3, 64, 65, 1023], causal=True, num_splits=1),
    dict(B=1, Sq=1, Hq=8, Hkv=8, D=64, lens=[4096], num_splits=16, scale=0.2),
]


def test_attention_kvcache_contiguous_and_paged_against_fp64_reference():
    for dtype in (torch.float16, torch.bfloat16):
        for case in KVCACHE_CASES:
            c = dict(case)
            B, Sq, Hq, Hkv, D, lens = (c.pop(n) for n in ("B", "Sq", "Hq", "Hkv", "D", "lens"))
            splits = c.pop("num_splits", 0)
            cap = (max(lens) + 63) // 64 * 64
            q = rand(B, Sq, Hq, D, dtype=dtype)
            k = rand(B, cap, Hkv, D, dtype=dtype)
            v = rand(B, cap, Hkv, D, dtype=dtype)
            seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
            for page_size in (None, 16, 64):
                what = (f"attention_kvcache {NAMES[dtype]} page_size={page_size} B{B} Sq{Sq} "
                        f"H{Hq}/{Hkv} D{D} lens={lens} splits={splits} {c}")
                if page_size is None:
                    kc, vc, table = k, v, None
                else:
                    kc, table = paged(k, page_size)
                    vc, _ = paged(v, page_size, table)
                kc0, vc0 = kc.clone(), vc.clone()
                o, lse = tkern.attention_kvcache(q, kc, vc, seqlens, block_table=table,
                                                 return_lse=True, num_splits=splits, **c)
                assert o.shape == q.shape and lse.shape == (B, Hq, Sq), what
                assert torch.equal(kc, kc0) and torch.equal(vc, vc0), f"{what}: cache written"
                for b, n in enumerate(lens):
                    check_attention(o[b:b + 1], q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n],
                                    f"{what} sequence {b}", lse=lse[b:b + 1], **c)


def test_attention_kvcache_sinks_and_chunked_local():
    """sinks and chunk_size as attention()'s, per sequence (key positions from the cache's
    start): decode and 3-query steps, split automatically, into 3 and unsplit, paged and not."""
    B, Hq, Hkv, D, cap = 3, 8, 2, 128, 2048
    lens = [5, 300, 2000]
    sinks = torch.linspace(-1.0, 3.0, Hq, device=DEV, dtype=torch.float32)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    k = rand(B, cap, Hkv, D, dtype=torch.bfloat16)
    v = rand(B, cap, Hkv, D, dtype=torch.bfloat16)
    for Sq, chunk, splits, page_size in ((1, 64, 0, 16), (3, 100, 3, None), (1, 0, 0, 64),
                                         (3, 1000, 1, None)):
        q = rand(B, Sq, Hq, D, dtype=torch.bfloat16)
        if page_size is None:
            kc, vc, table = k, v, None
        else:
            kc, table = paged(k, page_size)
            vc, _ = paged(v, page_size, table)
        o, lse = tkern.attention_kvcache(q, kc, vc, seqlens, block_table=table, causal=True,
                                         sinks=sinks, chunk_size=chunk, num_splits=splits,
                                         return_lse=True)
        what = f"attention_kvcache sinks chunk={chunk} Sq={Sq} splits={splits} page={page_size}"
        for b, n in enumerate(lens):
            check_attention(o[b:b + 1], q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n],
                            f"{what} sequence {b}", lse=lse[b:b + 1], causal=True, sinks=sinks,
                            chunk_size=chunk)


def test_attention_kvcache_varlen_chunked_prefill_appends_then_attends():
    B, Hq, Hkv, D, cap = 3, 8, 2, 128, 128
    q_lens, lens = [1, 5, 17], [10, 0, 40]
    starts, total = [0, 1, 6, 23], 23
    cu = torch.tensor(starts, dtype=torch.int32, device=DEV)
    for dtype in (torch.float16, torch.bfloat16):
        for page_size in (None, 16):
            for window in (None, (7, 0)):
                what = f"attention_kvcache append {NAMES[dtype]} page_size={page_size} {window}"
                q = rand(total, Hq, D, dtype=dtype)
                k_new, v_new = rand(total, Hkv, D, dtype=dtype), rand(total, Hkv, D, dtype=dtype)
                k, v = rand(B, cap, Hkv, D, dtype=dtype), rand(B, cap, Hkv, D, dtype=dtype)
                k_after, v_after = k.clone(), v.clone()
                for b in range(B):
                    rows = slice(lens[b], lens[b] + q_lens[b])
                    k_after[b, rows] = k_new[starts[b]:starts[b + 1]]
                    v_after[b, rows] = v_new[starts[b]:starts[b + 1]]
                if page_size is None:
                    kc, vc, table = k.clone(), v.clone(), None
                else:
                    kc, table = paged(k, page_size)
                    vc, _ = paged(v, page_size, table)
                spare = kc.clone(), vc.clone()
                seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
                o, lse = tkern.attention_kvcache(
                    q, kc, vc, seqlens, block_table=table, cu_seqlens_q=cu,
                    max_seqlen_q=max(q_lens), k_new=k_new, v_new=v_new, causal=True,
                    window=window, return_lse=True)
                assert o.shape == q.shape and lse.shape == (Hq, total), what
                assert seqlens.tolist() == lens, f"{what}: cache_seqlens was updated"
                if page_size is None:
                    assert torch.equal(kc, k_after) and torch.equal(vc, v_after), what
                else:
                    assert torch.equal(unpaged(kc, table), k_after), f"{what}: k pages"
                    assert torch.equal(unpaged(vc, table), v_after), f"{what}: v pages"
                    unused = torch.ones(kc.shape[0], dtype=torch.bool, device=DEV)
                    unused[table.long().flatten()] = False
                    assert torch.equal(kc[unused], spare[0][unused]), f"{what}: spare pages"
                    assert torch.equal(vc[unused], spare[1][unused]), f"{what}: spare pages"
                for b in range(B):
                    tokens, n = slice(starts[b], starts[b + 1]), lens[b] + q_lens[b]
                    check_attention(o[tokens].unsqueeze(0), q[tokens].unsqueeze(0),
                                    k_after[b:b + 1, :n], v_after[b:b + 1, :n],
                                    f"{what} sequence {b}", lse=lse[:, tokens].unsqueeze(0),
                                    causal=True, window=window)


def test_attention_kvcache_empty_sequence_supported_query_and_errors():
    q = rand(2, 1, 4, 64, dtype=torch.bfloat16)
    k, v = rand(2, 64, 2, 64, dtype=torch.bfloat16), rand(2, 64, 2, 64, dtype=torch.bfloat16)
    seqlens = torch.tensor([0, 33], dtype=torch.int32, device=DEV)
    o, lse = tkern.attention_kvcache(q, k, v, seqlens, return_lse=True)
    assert torch.equal(o[0], torch.zeros_like(o[0])), "a sequence with no keys gets o = 0"
    assert bool(torch.isneginf(lse[0]).all()), "a sequence with no keys gets lse = -inf"
    check_attention(o[1:], q[1:], k[1:, :33], v[1:, :33], "attention_kvcache next to an empty "
                    "sequence", lse=lse[1:])
    ok, variant = tkern.attention_kvcache_supported(q, k, v, seqlens)
    assert ok and variant == "decode_sm80", variant
    bad = rand(2, 1, 4, 96, dtype=torch.bfloat16)
    kbad = rand(2, 64, 2, 96, dtype=torch.bfloat16)
    ok, reason = tkern.attention_kvcache_supported(bad, kbad, kbad, seqlens)
    assert not ok and reason.startswith("TK_ERROR_NOT_SUPPORTED") and "head_dim" in reason
    with pytest.raises(tkern.TkernError, match="TK_ERROR_INVALID_VALUE") as e:
        tkern.attention_kvcache(q, k, v, seqlens, num_splits=2000)
    assert "num_splits" in e.value.message, e.value.message


# ------------------------------------------------------------------------------ gemm -------
def test_gemm_layouts_epilogues_and_dtypes():
    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in [(1, 1, 1), (64, 64, 64), (129, 257, 96), (300, 1000, 512), (37, 8, 40)]:
            for b_layout in ("kn", "nk"):
                for out_dtype in (None, torch.float32):
                    for epi in ({}, {"bias": True, "activation": "gelu"},
                                {"c": True, "alpha": 0.7, "beta": 0.5, "activation": "silu"}):
                        odt = out_dtype or dtype
                        what = (f"gemm {NAMES[dtype]}->{NAMES[odt]} m{m} n{n} k{k} "
                                f"{b_layout} {epi}")
                        a = rand(m, k, dtype=dtype)
                        w = rand(k, n, dtype=dtype) if b_layout == "kn" else rand(n, k, dtype=dtype)
                        b = w if b_layout == "kn" else w.t()
                        bias = rand(n, dtype=odt) if epi.get("bias") else None
                        c = rand(m, n, dtype=odt) if epi.get("c") else None
                        alpha, beta = epi.get("alpha", 1.0), epi.get("beta")
                        out = tkern.gemm(a, b, bias, epi.get("activation"), c=c, alpha=alpha,
                                         beta=beta,
                                         out_dtype=None if out_dtype is None else "float32")
                        assert out.dtype == odt
                        ref = alpha * (a.double() @ b.double())
                        if c is not None:
                            ref = ref + beta * c.double()
                        if bias is not None:
                            ref = ref + bias.double()
                        ref = ACT_REF[epi.get("activation") or "none"](ref)
                        scale = abs(alpha) * math.sqrt(k) + abs(beta or 0.0) + 1.0
                        check(out, ref, what, scale=scale)


def test_gemm_batched_strided_and_rejections():
    a_wide = rand(2, 33, 200, dtype=torch.bfloat16)
    a = a_wide[..., :128]  # lda = 200
    w = rand(96, 128, dtype=torch.bfloat16)  # Linear weight [out, in]
    out = tkern.gemm(a, w.t(), activation="relu")
    assert out.shape == (2, 33, 96)
    check(out, F.relu(a.double() @ w.double().t()), "gemm batched a with lda, b = W.t()",
          scale=math.sqrt(128) + 1)
    ok, variant = tkern.gemm_supported(a, w.t())
    assert ok and variant, variant
    with pytest.raises(ValueError, match="argument 'b' must have one unit stride"):
        tkern.gemm(rand(8, 64, dtype=torch.bfloat16), rand(128, 64, dtype=torch.bfloat16)[::2, ::2])
    with pytest.raises(TypeError, match="argument 'a' has dtype float32"):
        tkern.gemm(rand(8, 64), rand(64, 8))


# ---------------------------------------------------------------------- CuPy inputs -------
@needs_cupy
def test_cupy_inputs_give_cupy_outputs():
    for dtype in (torch.float32, torch.float16):
        x = rand(17, 4096, dtype=dtype)
        y = tkern.gelu(cp(x), approximate="tanh")
        assert isinstance(y, cupy.ndarray) and y.dtype == cupy.dtype(NAMES[dtype].replace(
            "f", "float"))
        check(y, F.gelu(x.double(), approximate="tanh"), f"CuPy gelu {NAMES[dtype]}")
        check(tkern.activation(cp(x), "silu", bias=cp(x[0])), F.silu(x.double() + x[0].double()),
              f"CuPy activation {NAMES[dtype]}")
        check(tkern.swiglu(cp(x)), glu_ref(x.double(), "swiglu", "gate_first"),
              f"CuPy swiglu {NAMES[dtype]}")
        w = rand(4096, dtype=dtype)
        check(tkern.rms_norm(cp(x), cp(w), 1e-6), rms_ref(x.double(), w.double(), 1e-6),
              f"CuPy rms_norm {NAMES[dtype]}")
        check(tkern.layer_norm(cp(x), cp(w), cp(w), 1e-5),
              ln_ref(x.double(), w.double(), w.double(), 1e-5), f"CuPy layer_norm {NAMES[dtype]}")
        check(tkern.softmax(cp(x)), torch.softmax(x.double(), -1), f"CuPy softmax {NAMES[dtype]}")
        sliced = cp(x)[:, 100:3000]
        check(tkern.log_softmax(sliced), torch.log_softmax(x[:, 100:3000].double(), -1),
              f"CuPy log_softmax of a slice {NAMES[dtype]}")
        q = rand(9, 4, 64, dtype=dtype)
        pos = torch.arange(9, device=DEV, dtype=torch.int32) * 7
        qo, _ = tkern.rope(cp(q), None, cp(pos))
        assert isinstance(qo, cupy.ndarray)
        check(qo, rope_ref(q.double(), pos, None, "neox"), f"CuPy rope {NAMES[dtype]}")
        with pytest.raises(ValueError, match="argument 'x' must be contiguous"):
            tkern.gelu(cp(x).T)
        # CuPy exports a reversed view's strides through DLPack as huge positive numbers; the
        # binding must still refuse it, naming the argument.
        with pytest.raises(ValueError, match="argument 'x' has (a zero or negative stride|stride)"):
            tkern.softmax(cp(x)[::-1])
    q = rand(1, 64, 4, 128, dtype=torch.float16)
    o = tkern.attention(cp(q), cp(q), cp(q), causal=True)
    assert isinstance(o, cupy.ndarray)
    check_attention(o, q, q, q, "CuPy attention", causal=True)
    a, b = rand(64, 256, dtype=torch.float16), rand(256, 128, dtype=torch.float16)
    d = tkern.gemm(cp(a), cp(b))
    assert isinstance(d, cupy.ndarray)
    check(d, a.double() @ b.double(), "CuPy gemm", scale=math.sqrt(256) + 1)
    with pytest.raises(TypeError, match="CuPy has no bfloat16"):
        tkern.gemm(cp(a), cp(b), out_dtype="bfloat16")


@needs_cupy
def test_cupy_stream_is_used():
    x = rand(1 << 20, dtype=torch.float16)
    with cupy.cuda.Stream(non_blocking=True) as s:
        xc = cupy.full(x.shape, cupy.nan, dtype=cupy.float16)
        _delay_on_cupy(s)
        xc[...] = cp(x)  # ordered after the delay, on s
        y = tkern.gelu(xc)  # must run on s, after the copy
    s.synchronize()
    check(y, F.gelu(x.double()), "gelu on a CuPy stream")


def _delay_on_cupy(s):
    """Keeps stream s busy for a while (a chain of matrix products)."""
    m = cupy.ones((2048, 2048), dtype=cupy.float32)
    for _ in range(20):
        m = m @ m * (1.0 / 2048)


# ----------------------------------------------------- __cuda_array_interface__ only -------
class CAIOnly:
    """Hides DLPack: only __cuda_array_interface__ (as Numba or another library would)."""

    def __init__(self, t):
        self.t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


def test_cuda_array_interface_inputs():
    for dtype in (torch.float32, torch.float16):
        x = rand(33, 1000, dtype=dtype)
        y = torch.full_like(x, float("nan"))
        tkern.gelu(CAIOnly(x), out=CAIOnly(y))
        check(y, F.gelu(x.double()), f"gelu through __cuda_array_interface__ {NAMES[dtype]}")
        wide = rand(33, 1500, dtype=dtype)
        out = torch.full((33, 1000), float("nan"), device=DEV, dtype=dtype)
        tkern.softmax(CAIOnly(wide[:, :1000]), out=CAIOnly(out))
        check(out, torch.softmax(wide[:, :1000].double(), -1), f"softmax CAI slice {NAMES[dtype]}")
        with pytest.raises(TypeError, match="pass 'out' explicitly"):
            tkern.gelu(CAIOnly(x))


# --------------------------------------------------------------------------- streams -------
def _busy(stream):
    """Enqueues a long kernel on `stream`."""
    with torch.cuda.stream(stream):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(100_000_000)
        else:
            m = torch.ones(4096, 4096, device=DEV)
            for _ in range(20):
                m = m @ m / 4096


def test_current_and_explicit_streams_order_the_work():
    src = rand(1 << 22, dtype=torch.bfloat16)
    # The current torch stream: x is filled on s after a long kernel; gelu must run after it.
    s = torch.cuda.Stream()
    x = torch.full_like(src, float("nan"))
    torch.cuda.current_stream().synchronize()
    _busy(s)
    with torch.cuda.stream(s):
        x.copy_(src)
        y = tkern.gelu(x)
        z = tkern.rms_norm(x.view(1024, -1), None, 1e-6)
    s.synchronize()
    check(y, F.gelu(src.double()), "gelu on torch's current (non-default) stream")
    check(z, rms_ref(src.view(1024, -1).double(), None, 1e-6), "rms_norm on the current stream")
    # An explicit stream= (object and int handle), with the default stream current.
    for handle in (lambda st: st, lambda st: st.cuda_stream):
        s2 = torch.cuda.Stream()
        x2 = torch.full_like(src, float("nan"))
        out = torch.empty_like(src)
        torch.cuda.synchronize()
        _busy(s2)
        with torch.cuda.stream(s2):
            x2.copy_(src)
        tkern.gelu(x2, approximate="tanh", out=out, stream=handle(s2))
        s2.synchronize()
        check(out, F.gelu(src.double(), approximate="tanh"), "gelu with an explicit stream")


def _no_cached_blocks():
    """Waits for the device and empties the allocators' caches, so that the next allocation of
    a size is served by the block of that size freed last (which the tests below probe)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()


def _scribble_torch(nbytes, count=4):
    """Allocates and fills (0xFF bytes: NaN in every float dtype) blocks of nbytes on torch's
    current stream: what a freed block still in use elsewhere would get overwritten by."""
    return [torch.full((nbytes,), 255, device=DEV, dtype=torch.uint8) for _ in range(count)]


def _scribble_cupy(nbytes, count=4):
    """_scribble_torch on CuPy's current stream, from CuPy's memory pool."""
    return [cupy.full((nbytes,), 255, dtype=cupy.uint8) for _ in range(count)]


def _nbytes(t):
    return t.numel() * t.element_size()


def test_explicit_stream_keeps_torch_temporaries_outputs_and_workspace_alive():
    """Temporaries, outputs and workspaces come from torch's current stream while the kernel
    runs on stream=: when dropped, the caching allocator must not hand their blocks to new work
    on the current stream before the kernel is done (record_stream)."""
    for attempt in range(4):
        s = torch.cuda.Stream()
        src = rand(1 << 22, dtype=torch.bfloat16)
        h = rand(512, 4096, dtype=torch.float32)
        dy = rand(512, 4096, dtype=torch.float32)
        w = rand(4096, dtype=torch.float32)
        _, rstd = tkern.rms_norm(h, w, 1e-6, return_rstd=True)
        hh, ww = h.double().requires_grad_(True), w.double().requires_grad_(True)
        rms_ref(hh, ww, 1e-6).backward(dy.double())
        _no_cached_blocks()
        _busy(s)  # the kernels below wait on s while the current stream runs ahead
        y = tkern.gelu(src * 1.0, stream=s)  # the temporary is dropped when gelu returns
        junk = _scribble_torch(_nbytes(src))
        dx, dw = tkern.rms_norm_backward(dy, h, rstd, w, stream=s)  # workspace dropped
        junk += _scribble_torch(tkern.norm_backward_workspace_size(h, "rms", "float32"))
        junk += _scribble_torch(_nbytes(src))
        s.synchronize()
        torch.cuda.synchronize()
        check(y, F.gelu(src.double()), f"gelu of a temporary on a side stream, try {attempt}")
        check(dx, hh.grad, f"rms_norm_backward dx on a side stream, try {attempt}")
        check(dw, ww.grad, f"rms_norm_backward dw on a side stream, try {attempt}")
        del junk


def test_explicit_stream_output_dropped_by_the_caller_stays_alive():
    """An output allocated by tkern on the current stream and dropped at once by the caller
    (its kernel still queued on stream=) must not be reused before that kernel ends: else the
    kernel writes into memory that new work owns."""
    for attempt in range(4):
        s = torch.cuda.Stream()
        src = rand(1 << 22, dtype=torch.float32)
        _no_cached_blocks()
        _busy(s)
        tkern.gelu(src, stream=s)  # output dropped while its kernel waits on s
        mine = torch.zeros_like(src)  # the current stream's next block of that size
        s.synchronize()
        torch.cuda.synchronize()
        assert int(torch.count_nonzero(mine)) == 0, (
            f"a kernel on a side stream wrote into a block reused on the current stream "
            f"(try {attempt})")


@needs_cupy
def test_explicit_stream_keeps_cupy_arrays_alive():
    """CuPy's pool reuses a freed block for the next allocation on the stream it came from;
    CuPy arrays used on stream= are held until an event recorded after the kernel completes."""
    from tkern import _lifetime

    for attempt in range(4):
        s = torch.cuda.Stream()
        src = rand(1 << 22, dtype=torch.float32)
        src_c = cp(src)
        _no_cached_blocks()
        _busy(s)
        y = tkern.gelu(src_c.copy(), stream=s)  # temporary and output from CuPy's null stream
        assert isinstance(y, cupy.ndarray)
        junk = _scribble_cupy(_nbytes(src))
        s.synchronize()
        cupy.cuda.get_current_stream().synchronize()
        check(y, F.gelu(src.double()), f"gelu of a CuPy temporary on a side stream, try {attempt}")
        del junk
    torch.cuda.synchronize()
    _lifetime.release_finished()
    assert _lifetime._pending == [], "references held after their work completed"


@needs_cupy
def test_mixed_producers_without_stream_are_ordered_and_kept_alive():
    """torch and CuPy inputs with different current streams and no stream=: the work runs on
    the first array's library's current stream; the other library's pending work on its own
    current stream is ordered before it, and its arrays stay alive until the work is done."""
    for attempt in range(3):
        torch_s, cupy_s = torch.cuda.Stream(), cupy.cuda.Stream(non_blocking=True)
        x = rand(256, 4096)
        b = rand(4096)
        ref = F.silu(x.double() + b.double())
        _no_cached_blocks()
        with torch.cuda.stream(torch_s), cupy_s:
            # Ordering: CuPy writes the bias on its stream after a long kernel; the activation
            # (on torch's stream, x being first) must wait for it.
            bias_c = cupy.full((4096,), cupy.nan, dtype=cupy.float32)
            _busy(torch.cuda.ExternalStream(cupy_s.ptr))
            bias_c[...] = cp(b)
            y1 = tkern.activation(x, "silu", bias=bias_c)
            # Lifetime: the activation waits on torch's stream while CuPy's stream is idle; the
            # CuPy temporary dropped after the call must not be reused on CuPy's stream first.
            cupy_s.synchronize()
            _busy(torch_s)
            y2 = tkern.activation(x, "silu", bias=cp(b).copy())
            junk = _scribble_cupy(_nbytes(b))
            # The same with the roles swapped: CuPy first, a torch temporary.
            cupy_s.synchronize()
            torch_s.synchronize()
            _busy(torch.cuda.ExternalStream(cupy_s.ptr))
            y3 = tkern.activation(cp(x), "silu", bias=b * 1.0)
            junk_t = _scribble_torch(_nbytes(b))
        torch_s.synchronize()
        cupy_s.synchronize()
        check(y1, ref, f"mixed producers: CuPy's pending write ordered first, try {attempt}")
        check(y2, ref, f"mixed producers: a CuPy temporary kept alive, try {attempt}")
        assert isinstance(y3, cupy.ndarray)
        check(y3, ref, f"mixed producers: a torch temporary kept alive, try {attempt}")
        del junk, junk_t


# ------------------------------------------------------------------ runtime queries -------
def test_device_query_variants_and_forcing():
    info = tkern.device_query()
    assert info["supported"] and info["compute_capability"] >= 800 and info["sm_count"] > 0
    assert info["device"] == torch.cuda.current_device()
    x = rand(64, 4096, dtype=torch.bfloat16)
    w = rand(4096, dtype=torch.bfloat16)
    dy = rand(64, 4096, dtype=torch.bfloat16)
    y = torch.softmax(x.double(), -1).to(torch.bfloat16)
    yd, dyd = y.double(), dy.double()
    # Forward and backward are separate ops; scalar_regs holds backward rows of up to 2048 only.
    forced = {
        "softmax": (["vec16_regs", "vec16_stream", "scalar_regs", "scalar_stream"],
                    lambda: tkern.softmax(x), torch.softmax(x.double(), -1)),
        "softmax_bwd": (["vec16_regs", "vec16_stream", "scalar_stream"],
                        lambda: tkern.softmax_backward(y, dy), yd * (dyd - (dyd * yd).sum(-1, keepdim=True))),
        "norm": (["vec16", "wide_vec16", "scalar", "wide_scalar"],
                 lambda: tkern.rms_norm(x, w, 1e-6), rms_ref(x.double(), w.double(), 1e-6)),
        "activation": (["vec16", "scalar"], lambda: tkern.gelu(x), F.gelu(x.double())),
        "activation_bwd": (["vec16", "scalar"], lambda: tkern.gelu_backward(dy, x),
                           act_grad(F.gelu, x.double(), dyd)),
    }
    try:
        for op, (variants, run, ref) in forced.items():
            for v in variants:
                tkern.force_variant(op, v)
                out = run()
                assert tkern.last_variant() == v, f"{op}: forced {v}, ran {tkern.last_variant()}"
                check(out, ref, f"{op} forced to {v}")
            tkern.force_variant(op, None)
            run()
            assert tkern.last_variant() == variants[0], f"{op}: automatic choice"
    finally:
        for op in forced:
            tkern.force_variant(op, None)


# ------------------------------------------------------- the fast path for torch tensors -------
class Recorder:
    """Stands in for tkern._lib.call: records each call's arguments (a params struct by its
    fields) and, with forward=True, makes the call."""

    def __init__(self, forward=False):
        from tkern import _lib

        self.real, self.forward, self.calls = _lib.call, forward, []

    def __call__(self, name, *args):
        self.calls.append((name, [_plain_arg(a) for a in args]))
        if self.forward:
            self.real(name, *args)


def _plain_arg(arg):
    struct = getattr(arg, "_obj", None)  # ctypes.byref(struct)
    if struct is None:
        return arg
    if not hasattr(struct, "_fields_"):
        return type(struct).__name__
    return {f: (tuple(getattr(struct, f)) if hasattr(getattr(struct, f), "_length_")
                else getattr(struct, f)) for f, _ in struct._fields_}


def _labelled(calls, inputs):
    """calls with every device pointer replaced by 'name+offset' for the inputs and 'new#i'
    (in order of appearance) for memory the binding allocated, so that two runs compare."""
    spans = [(t.data_ptr(), t.data_ptr() + max(t.numel() * t.element_size(), 1), n)
             for n, t in inputs.items()]
    fresh = {}

    def label(v):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1 << 32:
            return v
        for lo, hi, n in spans:
            if lo <= v < hi:
                return f"{n}+{v - lo}"
        return fresh.setdefault(v, f"new#{len(fresh)}")

    out = []
    for name, args in calls:
        out.append((name, [{f: (tuple(map(label, v)) if isinstance(v, tuple) else label(v))
                            for f, v in a.items()} if isinstance(a, dict) else label(a)
                           for a in args]))
    return out


def _fast_path_calls():
    """Calls of every family on plain tensors, Parameters, views with size-1 dimensions and
    strided rows, outputs allocated by the binding; returns (inputs by name, thunks)."""
    bf, f16 = torch.bfloat16, torch.float16
    t = {
        "x": rand(1, 8, 256, dtype=bf),
        "w": torch.nn.Parameter(rand(256, dtype=bf)),
        "b": rand(256, dtype=bf),
        "res": rand(1, 8, 256, dtype=bf),
        "wide": rand(8, 1, 600, dtype=bf),
        "qkv": rand(1, 5, 8 + 2 * 2, 64, dtype=bf),
        "pos": torch.arange(5, device=DEV, dtype=torch.int32),
        "cache": rand(64, 64),
        "q": rand(1, 1, 8, 64, dtype=f16),
        "kv": rand(1, 16, 2, 2, 64, dtype=f16),
        "a": rand(1, 3, 128, dtype=f16),
        "W": torch.nn.Parameter(rand(64, 128, dtype=f16)),
        "bias": rand(64, dtype=f16),
        "dy": rand(1, 8, 256, dtype=bf),
        "f32": rand(8, 256),
        "rstd": rand(1, 8),
        "qt": rand(2, 8, 1, 64, dtype=f16),
    }
    x, w = t["x"], t["w"]
    thunks = [
        lambda: tkern.gelu(x, approximate="tanh"),
        lambda: tkern.activation(x, "silu", bias=t["b"]),
        lambda: tkern.activation_backward(t["dy"], x, "relu"),
        lambda: tkern.glu(t["wide"][:, :, :512], "geglu"),
        lambda: tkern.glu_backward(t["dy"][..., :128], x, "swiglu"),
        lambda: tkern.rms_norm(x, w, 1e-6, residual=t["res"], return_rstd=True),
        lambda: tkern.layer_norm(t["wide"][:, :, :256], w, t["b"], return_stats=True),
        lambda: tkern.rms_norm_backward(t["dy"], x, t["rstd"], w),
        lambda: tkern.softmax(t["wide"][..., :300], causal=True, causal_period=4),
        lambda: tkern.log_softmax(t["f32"], scale=0.5),
        lambda: tkern.rope(t["qkv"][:, :, :8], t["qkv"][:, :, 8:10], t["pos"].view(1, 5)),
        lambda: tkern.rope_(t["qkv"][:, :, :8], None, cos_sin_cache=t["cache"]),
        lambda: tkern.attention(t["q"], t["kv"][:, :, 0], t["kv"][:, :, 1], causal=True,
                                return_lse=True),
        lambda: tkern.attention(t["qt"], t["qt"], t["qt"], layout="bhsd", window=(3, 0)),
        lambda: tkern.gemm(t["a"], t["W"].t(), t["bias"], "gelu"),
        lambda: tkern.gemm(t["a"], t["W"].t(), out_dtype="float32", alpha=0.5),
        lambda: tkern.attention_supported(t["q"], t["kv"][:, :, 0], t["kv"][:, :, 1]),
        lambda: tkern.gemm_supported(t["a"], t["W"].t()),
    ]
    return t, thunks


def _tensors(result):
    """The tensors of a tkern function's result (one, a tuple, or a supported() answer)."""
    return [t for t in (result if isinstance(result, tuple) else (result,))
            if isinstance(t, torch.Tensor)]


def test_fast_path_passes_what_dlpack_passes(monkeypatch):
    """Plain torch tensors are read directly (data_ptr, shape, stride, device); the result must
    be exactly what DLPack gives, call by call, at the ctypes layer: first calls (checked),
    repeated calls (from the caches of checked params), and the DLPack path for everything."""
    from tkern import _activation, _arrays, _attention, _gemm, _lib, _norm, _rope, _softmax

    modules = (_activation, _attention, _gemm, _norm, _rope, _softmax)
    caches = [v for m in modules for v in vars(m).values()
              if isinstance(v, (_arrays.Plans, _arrays.Lane))]
    assert len(caches) == 7 + 11
    inputs, thunks = _fast_path_calls()
    runs, replayed, layouts = {}, {}, {}
    for what in ("fast, first", "fast, cached", "dlpack"):
        if what != "fast, cached":
            for cache in caches:
                monkeypatch.setattr(cache, "_plans", {})
        if what == "dlpack":
            monkeypatch.setattr(_arrays, "plain_torch", lambda obj: None)
            monkeypatch.setattr(_arrays.Lane, "find", lambda self, *args: (None, None, None))
        rec, replays = Recorder(), []
        monkeypatch.setattr(_lib, "call", rec)
        monkeypatch.setattr(_lib, "replay", lambda name, *args: (replays.append(name),
                                                                  rec(name, *args)))
        results = [fn() for fn in thunks]
        runs[what], replayed[what] = _labelled(rec.calls, inputs), replays
        # What the binding allocated: a replay's allocators are chosen when its plan is stored.
        layouts[what] = [[(t.shape, t.dtype, t.is_contiguous()) for t in _tensors(r)]
                         for r in results]
        del results
    assert len(runs["dlpack"]) >= len(thunks)
    for what in ("fast, first", "fast, cached"):
        for i, (got, ref) in enumerate(zip(runs[what], runs["dlpack"])):
            assert got == ref, f"call {i} ({ref[0]}), {what}: {got} != DLPack's {ref}"
        assert len(runs[what]) == len(runs["dlpack"])
        assert layouts[what] == layouts["dlpack"], what
    # The repeated calls of the functions with a fast lane were replays.
    assert replayed["fast, first"] == []
    assert set(replayed["fast, cached"]) == {
        "tk_gelu_fwd", "tk_glu_fwd", "tk_rmsnorm_fwd", "tk_layernorm_fwd", "tk_softmax_fwd",
        "tk_rope_fwd", "tk_attention_fwd", "tk_gemm"}, replayed["fast, cached"]


def recorded_replays(monkeypatch, *caches):
    """Empties the plans of the given lanes / plan caches and returns the list to which every
    replayed call's entry point is appended from then on."""
    from tkern import _lib

    for cache in caches:
        monkeypatch.setattr(cache, "_plans", {})
    replays = []
    real = _lib.replay
    monkeypatch.setattr(_lib, "replay", lambda name, *args: (replays.append(name),
                                                              real(name, *args)))
    return replays


def test_lane_replays_only_calls_checked_before(monkeypatch):
    """A replay needs an earlier successful call with the same dtypes, shapes, strides, device
    and scalars, no output and no stream; anything else takes the full path, and an error is
    raised again, never stored."""
    from tkern import _activation

    replays = recorded_replays(monkeypatch, _activation._GELU_LANE)
    x = rand(64, 256, dtype=torch.bfloat16)
    tkern.gelu(x)
    assert replays == []
    check(tkern.gelu(x), F.gelu(x.double()), "gelu, replayed")
    assert replays == ["tk_gelu_fwd"]
    x2 = rand(64, 256, dtype=torch.bfloat16)
    check(tkern.gelu(x2), F.gelu(x2.double()), "gelu of other data, replayed")
    assert len(replays) == 2
    tkern.gelu(rand(64, 128, dtype=torch.bfloat16))  # another shape
    tkern.gelu(x, approximate="tanh")  # another scalar
    tkern.gelu(x, out=torch.empty_like(x))  # an output given
    tkern.gelu(x, stream=torch.cuda.current_stream())  # a stream given
    transposed = rand(256, 64, dtype=torch.bfloat16).t()  # x's shape, other strides
    for _ in range(2):
        with pytest.raises(ValueError, match="argument 'x' must be contiguous"):
            tkern.gelu(transposed)
    assert len(replays) == 2


def test_rope_lane_reads_every_calls_positions_cache_and_outputs(monkeypatch):
    """RoPE's params hold pointers (positions, the cos / sin cache): a replay must take this
    call's, in place and out of place, and never leave them in the stored params."""
    from tkern import _rope

    lanes = (_rope._LANE, _rope._INPLACE_LANE)  # rope's and rope_'s
    replays = recorded_replays(monkeypatch, *lanes, _rope._PLANS)
    T, rd = 16, 32
    inv = 10000.0 ** (-2.0 * torch.arange(rd // 2, device=DEV, dtype=torch.float64) / rd)
    for i in range(3):
        q, k = rand(T, 4, 64, dtype=torch.bfloat16), rand(T, 2, 64, dtype=torch.bfloat16)
        pos = torch.randperm(256, device=DEV)[:T]
        ang = (torch.arange(256, device=DEV, dtype=torch.float64) + i).unsqueeze(-1) * inv
        cache = torch.cat([torch.cos(ang), torch.sin(ang)], -1).float()
        qo, ko = tkern.rope(q, k, pos, rotary_dim=rd, cos_sin_cache=cache)
        check(qo, rope_ref(q.double(), pos, rd, "neox", cache=cache), f"rope q, call {i}")
        check(ko, rope_ref(k.double(), pos, rd, "neox", cache=cache), f"rope k, call {i}")
        q2 = q.clone()
        assert tkern.rope_(q2, None, pos, rotary_dim=rd, cos=cache[:, :rd // 2],
                           sin=cache[:, rd // 2:])[0] is q2
        check(q2, rope_ref(q.double(), pos, rd, "neox", cache=cache), f"rope_ q, call {i}")
    assert replays == ["tk_rope_fwd"] * 4  # every call but the first of each key
    plans = [plan for lane in lanes for plan in lane._plans.values()]
    assert len(plans) == 2
    for plan in plans:
        p = plan[1]  # the stored params (see _rope._lane_plan)
        assert not any((p.positions32, p.positions64, p.cos_cache, p.sin_cache))


def test_rope_replay_follows_the_positions_buffer_and_cache(monkeypatch):
    """A replay keeps the params it made for the last positions / cache pointers (a decode loop
    passes the same buffers call after call): new values in the same buffer, another buffer, or
    another cache must each be what the next call reads."""
    from tkern import _rope

    replays = recorded_replays(monkeypatch, _rope._LANE, _rope._PLANS)
    T, D = 4, 64
    q, k = rand(T, 8, D, dtype=torch.bfloat16), rand(T, 2, D, dtype=torch.bfloat16)
    inv = 10000.0 ** (-2.0 * torch.arange(D // 2, device=DEV, dtype=torch.float64) / D)
    caches = []
    for shift in (0.0, 0.5):
        ang = (torch.arange(512, device=DEV, dtype=torch.float64) + shift).unsqueeze(-1) * inv
        caches.append(torch.cat([torch.cos(ang), torch.sin(ang)], -1).float())
    buf_a = torch.arange(T, device=DEV, dtype=torch.int32) + 100
    buf_b = torch.arange(T, device=DEV, dtype=torch.int32) + 300
    calls = 0
    for step, (pos, cache) in enumerate([(buf_a, 0), (buf_a, 0), (buf_b, 0), (buf_a, 0),
                                         (buf_a, 1), (buf_a, 1)]):
        if step == 1:
            buf_a += 7  # the next position, written in place as a decode loop does
        expected = [rope_ref(x.double(), pos, None, "neox", cache=caches[cache]) for x in (q, k)]
        for got, want, name in zip(tkern.rope(q, k, pos, cos_sin_cache=caches[cache]), expected,
                                   "qk"):
            check(got, want, f"rope {name}, step {step}")
        calls += 1
    assert replays == ["tk_rope_fwd"] * (calls - 1)


def test_fast_path_takes_only_plain_cuda_tensors():
    from tkern import _arrays

    x = rand(4, 64, dtype=torch.bfloat16)

    class Sub(torch.Tensor):
        pass

    assert _arrays.plain_torch(x) is not None
    assert _arrays.plain_torch(torch.nn.Parameter(x)) is not None
    assert _arrays.plain_torch(x.requires_grad_(False).as_subclass(Sub)) is None
    assert _arrays.plain_torch(x.cpu()) is None
    assert _arrays.plain_torch(x.to(torch.complex64)) is None
    assert _arrays.plain_torch(x.float().to_sparse()) is None
    # A subclass still works, through DLPack (tkern allocates outputs only through torch and
    # CuPy themselves, so out= is needed for a class defined elsewhere).
    out = torch.empty_like(x)
    tkern.gelu(x.as_subclass(Sub), out=out)
    check(out, F.gelu(x.double()), "gelu of a Tensor subclass")
    with pytest.raises(TypeError, match="argument 'x' has dtype float64"):
        tkern.gelu(x.double())
    with pytest.raises(ValueError, match="argument 'x' must be contiguous"):
        tkern.gelu(rand(64, 32, dtype=torch.float16).t())


def test_stream_set_with_torch_cuda_stream_is_read_at_every_call(monkeypatch):
    from tkern import _lib

    rec = Recorder(forward=True)
    monkeypatch.setattr(_lib, "call", rec)
    monkeypatch.setattr(_lib, "replay", rec)
    x = rand(64, 256, dtype=torch.bfloat16)
    q = rand(1, 1, 8, 64, dtype=torch.bfloat16)
    a, w = rand(8, 128, dtype=torch.bfloat16), rand(64, 128, dtype=torch.bfloat16)
    r, pos = rand(8, 4, 64, dtype=torch.bfloat16), torch.arange(8, device=DEV)
    nw = rand(256, dtype=torch.bfloat16)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()  # the inputs are ready for any stream
    expected = []
    for s in (s1, s2, None, s1):  # the first call of each function checks, the others replay
        with torch.cuda.stream(s) if s is not None else contextlib.nullcontext():
            tkern.gelu(x)
            tkern.attention(q, q, q)
            tkern.gemm(a, w.t())
            tkern.rope(r, r, pos)
            tkern.rope_(r, None, pos)
            tkern.rms_norm(x, nw, return_rstd=True)
            tkern.layer_norm(x, nw, nw)
            tkern.softmax(x)
            tkern.glu(x)
        expected += [(s or torch.cuda.current_stream()).cuda_stream] * 9
    torch.cuda.synchronize()
    got = [args[-1] for _, args in rec.calls]
    assert got == expected, f"streams passed {got}, current streams {expected}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device_than_the_current_one():
    x = rand(64, 256, dtype=torch.bfloat16).to("cuda:1")
    assert torch.cuda.current_device() == 0
    y = tkern.gelu(x)
    assert y.device == x.device and torch.cuda.current_device() == 0
    check(y, F.gelu(x.double()), "gelu on device 1 with device 0 current")
    with pytest.raises(ValueError, match="is on CUDA device 0 but 'x' is on device 1"):
        tkern.gelu(x, out=torch.empty(64, 256, device=DEV, dtype=torch.bfloat16))


def test_cuda_graph_capture_of_a_decode_step():
    """A sequence of tkern calls captured in a CUDA graph and replayed on new inputs: the way to
    take the host cost out of a decode step (see docs/python.md)."""
    torch.manual_seed(7)
    D, F_, H, KV, HD, S = 256, 512, 4, 2, 64, 40
    bf = torch.bfloat16
    w_norm = rand(D, dtype=bf)
    w_qkv = rand((H + 2 * KV) * HD, D, dtype=bf, scale=D ** -0.5)
    w_o = rand(D, H * HD, dtype=bf, scale=(H * HD) ** -0.5)
    w_up = rand(2 * F_, D, dtype=bf, scale=D ** -0.5)
    w_down = rand(D, F_, dtype=bf, scale=F_ ** -0.5)
    k_cache = rand(1, S, KV, HD, dtype=bf)
    v_cache = rand(1, S, KV, HD, dtype=bf)
    x = rand(1, D, dtype=bf)
    pos = torch.tensor([S - 1], device=DEV, dtype=torch.int32)

    def step():
        h = tkern.rms_norm(x, w_norm, 1e-6)
        qkv = tkern.gemm(h, w_qkv.t()).view(1, H + 2 * KV, HD)
        q, k = tkern.rope(qkv[:, :H], qkv[:, H:H + KV], pos)
        k_cache[:, S - 1] = k
        v_cache[:, S - 1] = qkv[:, H + KV:]
        o = tkern.attention(q.view(1, 1, H, HD), k_cache, v_cache, causal=True)
        y = tkern.gemm(o.view(1, H * HD), w_o.t(), c=x)
        g = tkern.glu(tkern.gemm(tkern.rms_norm(y, w_norm, 1e-6), w_up.t()), "swiglu")
        return tkern.gemm(g, w_down.t(), c=y)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for trial in range(3):
        x.copy_(rand(1, D, dtype=bf))
        pos.fill_(S - 1 - trial)
        graph.replay()
        replayed = static_out.clone()
        check(replayed, step(), f"replay {trial} against the eager step")
