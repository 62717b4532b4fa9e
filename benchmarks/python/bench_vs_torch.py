#!/usr/bin/env python3
"""libtkern (through the Python binding) against what a PyTorch user has: eager PyTorch,
torch.compile, and for attention SDPA's flash and cuDNN backends and FlexAttention.

Shapes are those of `make bench`: activations bf16 16384 x 4096, SwiGLU 16384 x (2 x 14336),
norms and softmax 16384 x 4096, RoPE Llama-3-8B-like (16384 tokens, 32/8 heads, D 128),
attention B4 H32/8 S4096 D128 (causal, and a 1024-key sliding window), GEMM 8192^3 bf16.

Timing: CUDA events around `--inner` back-to-back calls (so Python launch overhead overlaps the
GPU work, as in a real model), median of `--reps` such repetitions after `--warmup` calls; the
`memory` table (norms, their backward, and softmax against Quack and Liger, which are used when
importable) and the `flash` table (attention against FlashAttention-4 and SDPA's cuDNN and
FlashAttention-2 backends, at the shapes of docs/kernels/attention.md) replay those calls from a
CUDA graph, so no column pays its host cost; the `backward` table times the attention backward
against the same peers' backward passes (milliseconds per call, so host cost does not show). In
the flash and backward tables (compute-bound) every column is timed in two rounds, in order and
then reversed, each timing after --settle seconds of idle GPU (as tkbench pauses), and its
faster round is kept;
every tensor is far larger than L2 except the GEMM / attention operands, which are
compute-bound. Each op's section is independent: a failure prints an error row and the script
goes on. torch.compile gets a total budget (--compile-budget seconds); past it, or when it
fails, the column says so. Prints a Markdown table and, with --out, writes it with the date,
GPU and versions.

    make -j && python3 benchmarks/python/bench_vs_torch.py --out build/bench_vs_torch.md
"""

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tkern  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
# The shapes of `make bench`.
ROWS, COLS, FFN = 16384, 4096, 14336           # activations / norms / softmax; SwiGLU width
ROPE = (16384, 32, 8, 128)                    # tokens, heads_q, heads_kv, head_dim
ATTN = (4, 4096, 32, 8, 128)                  # batch, seq, heads_q, heads_kv, head_dim
WINDOW = 1024                                 # the sliding-window row
GEMM = 8192                                   # m = n = k


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the Markdown report to this file")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions (median)")
    ap.add_argument("--inner", type=int, default=5, help="back-to-back calls per repetition")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile-budget", type=float, default=75.0,
                    help="seconds of torch.compile compilation (FlexAttention aside) in total "
                         "before the remaining ops skip it")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile and Flex")
    ap.add_argument("--settle", type=float, default=0.3,
                    help="seconds of idle GPU before each timing of the flash and backward "
                         "tables (tkbench's pause: a compute-bound timing right after another "
                         "runs while the clocks recover from the power limit)")
    ap.add_argument("--only", help="comma-separated substrings of op names to run")
    ap.add_argument("--tables", default="ops,attention,memory,flash,backward",
                    help="comma-separated tables to print: ops (vs eager and torch.compile), "
                         "attention (vs SDPA and Flex), memory (memory-bound ops vs Quack and "
                         "Liger, CUDA-graph timed), flash (attention vs FlashAttention-4 and "
                         "cuDNN, CUDA-graph timed), backward (attention backward vs "
                         "FlashAttention-4, cuDNN and FlashAttention-2)")
    return ap.parse_args()


ARGS = None
COMPILE_SPENT = [0.0]  # seconds spent in torch.compile of the op baselines
FLEX_SPENT = [0.0]     # seconds spent compiling and timing FlexAttention (not budgeted)


def warm(fn):
    """--warmup calls of fn (JIT compilation, caches, clocks), then a synchronize."""
    for _ in range(ARGS.warmup):
        fn()
    torch.cuda.synchronize()


def inner_calls(fn):
    for _ in range(ARGS.inner):
        fn()


def median_ms(run):
    """Median milliseconds per call over --reps CUDA-event timings of run(), which enqueues
    --inner calls."""
    times = []
    for _ in range(ARGS.reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / ARGS.inner)
    return statistics.median(times)


def bench(fn):
    """Median milliseconds per call of fn (which enqueues GPU work), called back to back."""
    warm(fn)
    return median_ms(lambda: inner_calls(fn))


def graph_bench(fn):
    """Median milliseconds per call of fn, replayed from a CUDA graph of --inner calls: the
    host cost of every column (ours, torch's, the peers' Python layers) is out alike. fn is
    warmed up (and any JIT compilation done) outside the capture."""
    warm(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inner_calls(fn)
    graph.replay()
    torch.cuda.synchronize()
    return median_ms(graph.replay)


def graph_timed(candidate):
    """graph_bench of a callable, or the reason string, or 'n/a' when it fails."""
    if candidate is None:
        return "n/a"
    if isinstance(candidate, str):
        return candidate
    try:
        return graph_bench(candidate)
    except Exception as e:  # noqa: BLE001
        print(f"  failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        return "n/a"


def fair_rounds(timers):
    """Milliseconds per call of each column of a compute-bound row: every column timed in two
    rounds, in the given order and then reversed, each timing after --settle seconds of idle
    GPU, and the faster round kept. Without the pause and the reversal the first column ran
    right after the row's reference computation and each later one right after another column,
    at whatever clocks the power limit had left. timers maps a column to a function returning
    milliseconds or a reason string (kept when no round gave a time)."""
    rounds = {c: [] for c in timers}
    for order in (list(timers), list(reversed(timers))):
        for c in order:
            torch.cuda.synchronize()
            time.sleep(ARGS.settle)
            rounds[c].append(timers[c]())
    best = {}
    for c, got in rounds.items():
        times = [t for t in got if isinstance(t, float)]
        best[c] = min(times) if times else got[0]
    return best


def compiled(fn, *args):
    """torch.compile(fn), compiled now (timed against the budget); returns a zero-argument
    callable, or a string saying why there is none."""
    if ARGS.no_compile:
        return "skipped"
    if COMPILE_SPENT[0] > ARGS.compile_budget:
        return "skipped (budget)"
    t0 = time.time()
    try:
        cfn = torch.compile(fn, dynamic=False)
        cfn(*args)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any compile failure is reported, not fatal
        print(f"  torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return "n/a"
    finally:
        COMPILE_SPENT[0] += time.time() - t0
    return lambda: cfn(*args)


def timed(candidate):
    """ms for a callable, or the candidate's reason string, or 'n/a' on failure."""
    if candidate is None:
        return "n/a"
    if isinstance(candidate, str):
        return candidate
    try:
        return bench(candidate)
    except Exception as e:  # noqa: BLE001
        print(f"  baseline failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return "n/a"


def rnd(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(dtype)


def max_diff(a, b):
    if isinstance(a, (tuple, list)):
        return max(max_diff(x, y) for x, y in zip(a, b))
    return (a.float() - b.float()).abs().max().item()


def rate_cells(rates):
    """Markdown cells of rates: whole numbers, or the reason (a string) a column has none."""
    return " | ".join(f"{v:.0f}" if isinstance(v, float) else str(v) for v in rates)


def rates(ms, work, scale):
    """Per column, work / ms / scale (a rate), or the column's reason where it has no time."""
    return {c: work / x / scale if isinstance(x, float) else x for c, x in ms.items()}


def best_other(rates):
    """The highest rate of a column other than tkern's, None when none has one."""
    return max((v for c, v in rates.items() if c != "tkern" and isinstance(v, float)), default=None)


def ratio_cell(x, y):
    """x / y to two decimals, or "-" when either is not a figure (a column's reason)."""
    return f"{x / y:.2f}" if isinstance(x, float) and isinstance(y, float) and y else "-"


def diff_cell(diff):
    """A max diff to three figures, or the reason there is none."""
    return diff if isinstance(diff, str) else f"{diff:.3g}"


def error_row(lead, e, empty):
    """The row of a case that failed: its leading cells, the error, then `empty` blank cells
    (the traceback goes to the log)."""
    traceback.print_exc()
    return f"| {lead} | error: {type(e).__name__}: {str(e)[:200]} |" + " |" * empty


# ----------------------------------------------------------------------------- ops ---------
# Each returns a dict: tkern (callable returning the output), eager (callable returning the
# same thing), compile (zero-argument callable or reason), and work: ("GB", bytes) or
# ("TFLOP", flops) for the throughput column.

def op_activation(kind, approx=None, bias=False):
    def setup():
        x = rnd(ROWS, COLS)
        y = torch.empty_like(x)
        b = rnd(COLS) if bias else None
        f = {"gelu": lambda t: F.gelu(t, approximate=approx or "none"), "silu": F.silu,
             "relu": F.relu}[kind]
        if bias:
            def eager_fn(t, bb):
                return f(t + bb)
            args = (x, b)
            run = lambda: tkern.activation(x, kind, bias=b, out=y)  # noqa: E731
        else:
            def eager_fn(t):
                return f(t)
            args = (x,)
            if kind == "gelu":
                run = lambda: tkern.gelu(x, approximate=approx or "none", out=y)  # noqa: E731
            else:
                run = lambda: tkern.activation(x, kind, out=y)  # noqa: E731
        return dict(tkern=run, eager=lambda: eager_fn(*args), compile=compiled(eager_fn, *args),
                    work=("GB", 2 * x.nbytes + (b.nbytes if bias else 0)))
    return setup


def op_swiglu():
    d = FFN
    x = rnd(ROWS, 2 * d)
    y = torch.empty(ROWS, d, device=DEV, dtype=BF16)

    def eager_fn(t):
        return F.silu(t[:, :d]) * t[:, d:]
    return dict(tkern=lambda: tkern.swiglu(x, out=y), eager=lambda: eager_fn(x),
                compile=compiled(eager_fn, x), work=("GB", x.nbytes + y.nbytes))


def op_rms_norm(fused=False):
    def setup():
        x, w = rnd(ROWS, COLS), rnd(COLS)
        y = torch.empty_like(x)
        if fused:
            r = rnd(ROWS, COLS)
            r_eager = r.clone()

            def eager_fn(t, res, ww):
                h = t + res
                return F.rms_norm(h, (COLS,), ww, 1e-6), h
            run = lambda: (tkern.rms_norm(x, w, 1e-6, residual=r, out=y), r)  # noqa: E731
            args = (x, r_eager, w)
            work = 4 * x.nbytes
        else:
            def eager_fn(t, ww):
                return F.rms_norm(t, (COLS,), ww, 1e-6)
            run = lambda: tkern.rms_norm(x, w, 1e-6, out=y)  # noqa: E731
            args = (x, w)
            work = 2 * x.nbytes
        return dict(tkern=run, eager=lambda: eager_fn(*args), compile=compiled(eager_fn, *args),
                    work=("GB", work), check=not fused)
    return setup


def op_layer_norm():
    x, w, b = rnd(ROWS, COLS), rnd(COLS), rnd(COLS)
    y = torch.empty_like(x)

    def eager_fn(t, ww, bb):
        return F.layer_norm(t, (COLS,), ww, bb, 1e-5)
    return dict(tkern=lambda: tkern.layer_norm(x, w, b, 1e-5, out=y),
                eager=lambda: eager_fn(x, w, b), compile=compiled(eager_fn, x, w, b),
                work=("GB", 2 * x.nbytes))


def op_softmax(log=False):
    def setup():
        x = rnd(ROWS, COLS, scale=3.0)
        y = torch.empty_like(x)
        f = torch.log_softmax if log else torch.softmax

        def eager_fn(t):
            return f(t, -1)
        run = (lambda: tkern.log_softmax(x, out=y)) if log else (lambda: tkern.softmax(x, out=y))
        return dict(tkern=run, eager=lambda: eager_fn(x), compile=compiled(eager_fn, x),
                    work=("GB", 2 * x.nbytes))
    return setup


def op_rope():
    T, HQ, HK, D = ROPE
    q, k = rnd(T, HQ, D), rnd(T, HK, D)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    pos = torch.arange(T // 4, device=DEV).repeat(4)  # 4 sequences
    inv = 10000.0 ** (-torch.arange(0, D, 2, device=DEV, dtype=torch.float32) / D)
    ang = pos.float().unsqueeze(-1) * inv
    cos = torch.cat([ang.cos(), ang.cos()], -1).unsqueeze(1).to(BF16)
    sin = torch.cat([ang.sin(), ang.sin()], -1).unsqueeze(1).to(BF16)

    def eager_fn(qq, kk, c, s):  # Hugging Face's apply_rotary_pos_emb
        def rot(t):
            return torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1)
        return qq * c + rot(qq) * s, kk * c + rot(kk) * s
    return dict(tkern=lambda: tkern.rope(q, k, pos, q_out=qo, k_out=ko),
                eager=lambda: eager_fn(q, k, cos, sin),
                compile=compiled(eager_fn, q, k, cos, sin),
                work=("GB", 2 * (q.nbytes + k.nbytes) + pos.nbytes))


def op_gemm(epilogue=False):
    def setup():
        a, w = rnd(GEMM, GEMM, scale=0.1), rnd(GEMM, GEMM, scale=0.1)
        bias = rnd(GEMM) if epilogue else None
        d = torch.empty(GEMM, GEMM, device=DEV, dtype=BF16)
        if epilogue:
            def eager_fn(x, ww, bb):
                return F.gelu(F.linear(x, ww, bb))
            args = (a, w, bias)
        else:
            def eager_fn(x, ww):
                return F.linear(x, ww)
            args = (a, w)
        return dict(tkern=lambda: tkern.gemm(a, w.t(), bias, "gelu" if epilogue else None,
                                             out=d),
                    eager=lambda: eager_fn(*args), compile=compiled(eager_fn, *args),
                    work=("TFLOP", 2 * GEMM ** 3))
    return setup


def ops():
    rc = f"bf16 {ROWS}x{COLS}"
    return [
        ("gelu (erf)", rc, op_activation("gelu")),
        ("gelu (tanh)", rc, op_activation("gelu", "tanh")),
        ("silu", rc, op_activation("silu")),
        ("bias + gelu", rc, op_activation("gelu", bias=True)),
        ("swiglu", f"bf16 {ROWS}x(2x{FFN})", op_swiglu),
        ("rms_norm", rc, op_rms_norm()),
        ("add + rms_norm", rc, op_rms_norm(fused=True)),
        ("layer_norm", rc, op_layer_norm),
        ("softmax", rc, op_softmax()),
        ("log_softmax", rc, op_softmax(log=True)),
        ("rope (q, k)", "bf16 T{} H{}/{} D{}".format(*ROPE), op_rope),
        ("gemm", f"bf16 {GEMM}^3 (B = W^T)", op_gemm()),
        ("gemm + bias + gelu", f"bf16 {GEMM}^3 (B = W^T)", op_gemm(epilogue=True)),
    ]


# ------------------------------------------------------------------------ attention --------
def attention_rows():
    """Rows of the attention table: (op, shape, {column: ms or str}, flops)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, S, HQ, HKV, D = ATTN
    q, k, v = rnd(B, S, HQ, D), rnd(B, S, HKV, D), rnd(B, S, HKV, D)
    o = torch.empty_like(q)
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # SDPA's [B, H, S, D]
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = None if ARGS.no_compile else torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001
        print(f"  FlexAttention unavailable: {e}")
        flex, create_block_mask = None, None
    kx, vx = (t.repeat_interleave(HQ // HKV, 1) for t in (kh, vh))

    def sdpa_call(backend, gqa, **kw):
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            if gqa:
                return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True, **kw)
            return F.scaled_dot_product_attention(qh, kx, vx, **kw)

    def sdpa_time(backend, **kw):
        """ms with enable_gqa, else with K/V expanded to heads_q (marked *), else 'n/a'."""
        for gqa in (True, False):
            try:
                sdpa_call(backend, gqa, **kw)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"  SDPA {backend} enable_gqa={gqa}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:160] if str(e) else ''}")
                continue
            ms = timed(lambda: sdpa_call(backend, gqa, **kw))
            return ms if gqa or not isinstance(ms, float) else f"{ms:.3f}*"
        return "n/a"

    rows = []
    for name, window in (("attention causal", None), (f"attention sliding w={WINDOW}", WINDOW)):
        shape = f"bf16 B{B} H{HQ}/{HKV} S{S} D{D}"
        if ARGS.only and not any(s in name for s in ARGS.only.split(",")):
            continue
        print(f"{name} {shape}")
        cols = {}
        try:
            win = None if window is None else (window - 1, 0)
            run = lambda: tkern.attention(q, k, v, causal=True, window=win, out=o)  # noqa
            cols["tkern"] = bench(run)
            visible = (window or S)
            flops = 4 * B * HQ * D * sum(min(i + 1, visible) for i in range(S))
            if window is None:
                cols["SDPA default"] = sdpa_time(None, is_causal=True)
                cols["SDPA flash"] = sdpa_time(SDPBackend.FLASH_ATTENTION, is_causal=True)
                cols["SDPA cuDNN"] = sdpa_time(SDPBackend.CUDNN_ATTENTION, is_causal=True)
                ref = sdpa_call(None, True, is_causal=True)
            else:
                i = torch.arange(S, device=DEV)
                mask = (i.view(-1, 1) >= i.view(1, -1)) & (i.view(-1, 1) - i.view(1, -1) < window)
                cols["SDPA default"] = sdpa_time(None, attn_mask=mask)
                cols["SDPA flash"] = "no windows"
                cols["SDPA cuDNN"] = "no windows"
                ref = sdpa_call(None, True, attn_mask=mask)
            out = run()
            diff = max_diff(out.transpose(1, 2), ref)
            if flex is not None:
                def mask_mod(b, h, qi, ki, window=window):
                    causal = qi >= ki
                    return causal if window is None else causal & (qi - ki < window)
                t0 = time.time()
                try:
                    bm = create_block_mask(mask_mod, None, None, S, S, device=DEV)
                    fl = lambda: flex(qh, kh, vh, block_mask=bm, enable_gqa=True)  # noqa: E731
                    fl()
                    torch.cuda.synchronize()
                    cols["FlexAttention"] = timed(fl)
                except Exception as e:  # noqa: BLE001
                    print(f"  FlexAttention failed: {type(e).__name__}: {str(e)[:200]}")
                    cols["FlexAttention"] = "n/a"
                finally:
                    FLEX_SPENT[0] += time.time() - t0
            else:
                cols["FlexAttention"] = "skipped"
            rows.append((name, shape, cols, flops, diff))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            rows.append((name, shape, {"error": f"{type(e).__name__}: {e}"}, 0, None))
    return rows


# ------------------------------------------------------------- memory-bound vs peers --------
def peer(module, attr):
    """A peer library's function, or None when the library is not importable here."""
    try:
        mod = __import__(module, fromlist=[attr])
        return getattr(mod, attr)
    except Exception as e:  # noqa: BLE001 - a missing or broken peer is a column of n/a
        print(f"  {module}.{attr} unavailable: {type(e).__name__}: {str(e)[:120]}")
        return None


def checked_grads(name, make, ours):
    """A backward row's peer column. make() runs the peer's forward for its own statistics and
    returns its backward call, which returns the gradients in the order of ours (dx, dweight[,
    dbias]). The call runs once here and each gradient's largest |peer - tkern| goes to the log
    (the table only times), so that a wrong call shows. None when the peer did not import,
    'n/a' (reason printed) when it fails."""
    if make is None:
        return None
    try:
        fn = make()
        got = fn()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a peer that fails is a column of n/a
        print(f"  {name} failed: {type(e).__name__}: "
              f"{str(e).splitlines()[0][:200] if str(e) else ''}")
        return "n/a"
    print(f"  {name} against tkern, max |diff|: " + ", ".join(
        f"{g} {max_diff(a, b):.3g} (|{g}| up to {b.abs().max().item():.3g})"
        for g, a, b in zip(("dx", "dweight", "dbias"), got, ours)), flush=True)
    return fn


def memory_rows():
    """Rows of the memory-bound table: (op, shape, bytes moved, {column: callable or str}).
    Every column is CUDA-graph timed; 'copy' is a device-to-device copy of the same bytes. The
    backward rows call each library's backward op on its own forward's statistics; torch.compile
    has no column there."""
    q_rms = peer("quack.rmsnorm", "rmsnorm_fwd")
    q_ln = peer("quack.rmsnorm", "layernorm_fwd")
    q_rms_bwd = peer("quack.rmsnorm", "rmsnorm_bwd")
    q_ln_bwd = peer("quack.rmsnorm", "layernorm_bwd")
    q_sm = peer("quack.softmax", "softmax_fwd")
    l_rms = peer("liger_kernel.ops.rms_norm", "LigerRMSNormFunction")
    l_rms_fwd = peer("liger_kernel.ops.rms_norm", "rms_norm_forward")
    l_rms_bwd = peer("liger_kernel.ops.rms_norm", "rms_norm_backward")
    l_add = peer("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    l_ln = peer("liger_kernel.ops.layer_norm", "LigerLayerNormFunction")
    l_ln_fwd = peer("liger_kernel.ops.layer_norm", "layer_norm_forward")
    l_ln_bwd = peer("liger_kernel.ops.layer_norm", "layer_norm_backward")
    l_sm = peer("liger_kernel.ops.softmax", "LigerSoftmaxFunction")

    def rmsnorm(m, n):
        x, w = rnd(m, n), rnd(n)
        y = torch.empty_like(x)
        eager = lambda t, ww: F.rms_norm(t, (n,), ww, 1e-6)  # noqa: E731
        return 2 * x.nbytes, {
            "tkern": lambda: tkern.rms_norm(x, w, 1e-6, out=y),
            "Quack": q_rms and (lambda: q_rms(x, w, eps=1e-6)),
            "Liger": l_rms and (lambda: l_rms.apply(x, w, 1e-6, 0.0, "llama", False)),
            "torch.compile": compiled(eager, x, w)}

    def add_rmsnorm(m, n):
        x, r, w = rnd(m, n), rnd(m, n), rnd(n)
        y = torch.empty_like(x)
        eager = lambda t, res, ww: (F.rms_norm(t + res, (n,), ww, 1e-6), t + res)  # noqa: E731
        return 4 * x.nbytes, {
            "tkern": lambda: tkern.rms_norm(x, w, 1e-6, residual=r, out=y),
            "Quack": q_rms and (lambda: q_rms(x, w, residual=r, eps=1e-6)),
            "Liger": l_add and (lambda: l_add.apply(x, r, w, 1e-6)),
            "torch.compile": compiled(eager, x, r, w)}

    def layernorm(m, n):
        x, w, b = rnd(m, n), rnd(n), rnd(n)
        wf, bf = w.float(), b.float()  # Quack's layer norm takes f32 parameters
        y = torch.empty_like(x)
        eager = lambda t, ww, bb: F.layer_norm(t, (n,), ww, bb, 1e-5)  # noqa: E731
        return 2 * x.nbytes, {
            "tkern": lambda: tkern.layer_norm(x, w, b, 1e-5, out=y),
            "Quack": q_ln and (lambda: q_ln(x, wf, bf, eps=1e-5)),
            "Liger": l_ln and (lambda: l_ln.apply(x, w, b, 1e-5)),
            "torch.compile": compiled(eager, x, w, b)}

    def backward_columns(nbytes, ours, quack, liger):
        """A backward row: ours, and each peer's column checked against ours (checked_grads)."""
        grads = ours()
        return nbytes, {"tkern": ours, "Quack": checked_grads("Quack", quack, grads),
                        "Liger": checked_grads("Liger", liger, grads)}

    def rmsnorm_bwd(m, n):
        x, w, dy = rnd(m, n), rnd(n), rnd(m, n)
        rstd = tkern.rms_norm(x, w, 1e-6, return_rstd=True)[1]
        ours = lambda: tkern.rms_norm_backward(dy, x, rstd, w)  # noqa: E731

        def quack():
            q_rstd = q_rms(x, w, eps=1e-6, store_rstd=True)[2]
            return lambda: q_rms_bwd(x, w, dy, q_rstd)[:2]

        def liger():
            _, lx, l_rstd, block, warps, mode = l_rms_fwd(x, w, 1e-6, 0.0, "llama", None)
            dy_l = dy.clone()  # in_place, Liger's default, writes dx over dy: its own copy
            return lambda: l_rms_bwd(dy_l, lx, w, l_rstd, 0.0, mode, block, warps, True, None)
        return backward_columns(3 * x.nbytes, ours, q_rms_bwd and q_rms and quack,
                                l_rms_bwd and l_rms_fwd and liger)

    def layernorm_bwd(m, n):
        x, w, b, dy = rnd(m, n), rnd(n), rnd(n), rnd(m, n)
        wf, bf = w.float(), b.float()  # as in the forward: Quack's layer norm takes f32
        _, mean, rstd = tkern.layer_norm(x, w, b, 1e-5, return_stats=True)
        ours = lambda: tkern.layer_norm_backward(dy, x, mean, rstd, w)  # noqa: E731

        def quack():
            _, q_rstd, q_mean = q_ln(x, wf, bf, eps=1e-5, return_rstd=True, return_mean=True)
            return lambda: q_ln_bwd(x, wf, dy, q_rstd, q_mean)

        def liger():
            _, lx, l_mean, l_rstd, _, _ = l_ln_fwd(x, w, b, 1e-5)
            return lambda: l_ln_bwd(dy, lx, w, b, l_mean, l_rstd)
        return backward_columns(3 * x.nbytes, ours, q_ln_bwd and q_ln and quack,
                                l_ln_bwd and l_ln_fwd and liger)

    def softmax(m, n):
        x = rnd(m, n)
        y = torch.empty_like(x)
        eager = lambda t: torch.softmax(t, -1)  # noqa: E731
        return 2 * x.nbytes, {
            "tkern": lambda: tkern.softmax(x, out=y),
            "Quack": q_sm and (lambda: q_sm(x)),
            "Liger": l_sm and (lambda: l_sm.apply(x)),
            "torch.compile": compiled(eager, x)}

    def copy(m, n):
        x = rnd(m, n)
        y = torch.empty_like(x)
        return 2 * x.nbytes, {"tkern": lambda: y.copy_(x)}

    return [("copy", 16384, 4096, copy),
            ("rms_norm", 16384, 4096, rmsnorm), ("rms_norm", 4096, 16384, rmsnorm),
            ("rms_norm", 1024, 65536, rmsnorm),
            ("add + rms_norm", 16384, 4096, add_rmsnorm),
            ("layer_norm", 16384, 4096, layernorm), ("layer_norm", 4096, 16384, layernorm),
            ("rms_norm backward", 16384, 4096, rmsnorm_bwd),
            ("rms_norm backward", 4096, 16384, rmsnorm_bwd),
            ("layer_norm backward", 16384, 4096, layernorm_bwd),
            ("softmax", 16384, 4096, softmax), ("softmax", 4096, 131072, softmax),
            ("softmax", 32768, 32768, softmax)]


def memory_table():
    cols = ["tkern", "Quack", "Liger", "torch.compile"]
    out = ["| op (bf16) | shape | " + " | ".join(f"{c} GB/s" for c in cols) +
           " | tkern / best other | tkern / copy |",
           "| --- | --- | " + " | ".join("---:" for _ in cols) + " | ---: | ---: |"]
    copy_gbs = None
    for name, m, n, setup in memory_rows():
        shape = f"{m}x{n}"
        if ARGS.only and not any(s in name for s in ARGS.only.split(",")):
            continue
        print(f"{name} {shape}", flush=True)
        try:
            nbytes, fns = setup(m, n)
            gbs = rates({c: graph_timed(fns.get(c) or "-") for c in cols}, nbytes, 1e6)
            if name == "copy":
                copy_gbs = gbs["tkern"]
                out.append(f"| device copy | {shape} | {copy_gbs:.0f} | | | | | 1.00 |")
            else:
                ours = gbs["tkern"]
                out.append(f"| {name} | {shape} | {rate_cells(gbs.values())} | "
                           f"{ratio_cell(ours, best_other(gbs))} | {ratio_cell(ours, copy_gbs)} |")
        except Exception as e:  # noqa: BLE001
            out.append(error_row(f"{name} | {shape}", e, 5))
        finally:
            torch.cuda.empty_cache()
        print("  " + out[-1], flush=True)
    return out


# ---------------------------------------------------- attention vs FlashAttention-4 --------
FLASH_SHAPES = [  # batch, seqlen, heads_q, heads_kv, head_dim, masks ("dense", "causal", window)
    (4, 4096, 32, 8, 128, ("dense", "causal", 1024)),
    (1, 16384, 32, 8, 128, ("dense", "causal", 1024, 4096)),
    (8, 2048, 16, 16, 64, ("dense", "causal")),
    (4, 4096, 16, 8, 256, ("dense", "causal")),
]


def attention_reference(qh, kh, vh, causal, window):
    """f32 SDPA (math) of [B, H, S, D] inputs with K/V expanded over the GQA group, causal with
    an optional window of W keys; None when the score matrix would pass 2^31 elements."""
    B, HQ, S, _ = qh.shape
    if B * HQ * S * S > 2 ** 31:
        return None
    group = HQ // kh.shape[1]
    mask = None
    if causal:
        i = torch.arange(S, device=DEV)
        mask = (i.view(-1, 1) >= i.view(1, -1)) & (i.view(-1, 1) - i.view(1, -1) < (window or S))
    return F.scaled_dot_product_attention(qh.float(), kh.repeat_interleave(group, 1).float(),
                                          vh.repeat_interleave(group, 1).float(), attn_mask=mask)


def flash_table():
    """TFLOP/s of visible work, CUDA-graph timed: tkern (and the variant it ran), FlashAttention-4,
    SDPA's cuDNN and flash (FlashAttention-2) backends. Windows are causal with W keys."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fa4 = peer("flash_attn.cute.interface", "flash_attn_func")
    cols = ["tkern", "FA4", "cuDNN", "FA2"]
    out = ["| shape | mask | tkern variant | " + " | ".join(f"{c} TFLOP/s" for c in cols) +
           " | tkern / best other | max diff |",
           "| --- | --- | --- | " + " | ".join("---:" for _ in cols) + " | ---: | ---: |"]
    for B, S, HQ, HKV, D, masks in FLASH_SHAPES:
        shape = f"B{B} H{HQ}/{HKV} S{S} D{D}"
        q, k, v = rnd(B, S, HQ, D), rnd(B, S, HKV, D), rnd(B, S, HKV, D)
        o = torch.empty_like(q)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        for mask in masks:
            label = mask if isinstance(mask, str) else f"window {mask}"
            if ARGS.only and not any(s in f"attention {label}" for s in ARGS.only.split(",")):
                continue
            print(f"attention {shape} {label}", flush=True)
            causal = mask != "dense"
            window = mask if isinstance(mask, int) else None
            visible = sum(min(i + 1, window or S) if causal else S for i in range(S))
            flops = 4 * B * HQ * D * visible
            win = None if window is None else (window - 1, 0)

            def sdpa(backend):
                if window is not None:
                    return "no windows"

                def call():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal,
                                                              enable_gqa=HQ != HKV)
                return call
            fns = {"tkern": lambda: tkern.attention(q, k, v, causal=causal, window=win, out=o),
                   "FA4": fa4 and (lambda: fa4(q, k, v, causal=causal,
                                               window_size=win or (None, None))),
                   "cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
                   "FA2": sdpa(SDPBackend.FLASH_ATTENTION)}
            try:
                ref = attention_reference(qh, kh, vh, causal, window)
                out_t = fns["tkern"]()  # this row's call, whose variant is reported
                variant = tkern.last_variant()
                diff = max_diff(out_t.transpose(1, 2), ref) if ref is not None else "-"
                del ref
                ms = fair_rounds({c: (lambda c=c: graph_timed(fns[c] or "n/a")) for c in cols})
                tf = rates(ms, flops, 1e9)
                out.append(f"| {shape} | {label} | {variant} | {rate_cells(tf.values())} | "
                           f"{ratio_cell(tf['tkern'], best_other(tf))} | {diff_cell(diff)} |")
            except Exception as e:  # noqa: BLE001
                out.append(error_row(f"{shape} | {label}", e, 6))
            finally:
                torch.cuda.empty_cache()
            print("  " + out[-1], flush=True)
    return out


# -------------------------------------------------------------- attention backward --------
PORTABLE_BWD = "tkern mma_sm80_bn128"  # the backward's portable variant at these head dims
BWD_SHAPES = [  # batch, seqlen, heads_q, heads_kv, head_dim (issue 20's shape first)
    (4, 4096, 32, 8, 128),
    (8, 2048, 16, 16, 64),
]


def backward_table():
    """TFLOP/s of the attention backward (2.5x the forward's visible FLOPs, FlashAttention's
    convention), dense and causal: tkern (atomic and deterministic dQ; and its portable mma.sync
    kernel forced, beside FlashAttention-2 in the same harness), FlashAttention-4 when
    its backward runs here, SDPA's cuDNN and flash (FlashAttention-2) backends. The torch
    columns time torch.autograd.grad of a retained forward graph, so only the backward kernels
    run; their K/V are expanded to heads_q (leaves, so no group sum is timed; * marks it), as
    the flash backend does not take GQA. Each call takes milliseconds: timed back to back with
    CUDA events, no graph. 'max diff' is tkern's largest |d - d_FA2| over dq, dk, dv, FA2's
    dk / dv summed over each group in float32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fa4 = peer("flash_attn.cute.interface", "flash_attn_func")
    cols = ["tkern", "tkern deterministic", PORTABLE_BWD, "FA4", "cuDNN*", "FA2*"]
    out = ["| shape | mask | " + " | ".join(f"{c} TFLOP/s" for c in cols) +
           f" | tkern / FA2 | tkern / cuDNN | deterministic / atomic | {PORTABLE_BWD} / FA2 | max diff |",
           "| --- | --- | " + " | ".join("---:" for _ in cols) + " | ---: | ---: | ---: | ---: | ---: |"]
    for B, S, HQ, HKV, D in BWD_SHAPES:
        shape = f"B{B} H{HQ}/{HKV} S{S} D{D}"
        group = HQ // HKV
        q, k, v, dout = rnd(B, S, HQ, D), rnd(B, S, HKV, D), rnd(B, S, HKV, D), rnd(B, S, HQ, D)
        for causal in (False, True):
            label = "causal" if causal else "dense"
            if ARGS.only and not any(s in f"backward {label}" for s in ARGS.only.split(",")):
                continue
            print(f"attention backward {shape} {label}", flush=True)
            flops = 2.5 * 4 * B * HQ * D * (S * (S + 1) // 2 if causal else S * S)
            try:
                o, lse = tkern.attention(q, k, v, causal=causal, return_lse=True)
                grads = [torch.empty_like(t) for t in (q, k, v)]

                def ours(deterministic):
                    return lambda: tkern.attention_backward(
                        q, k, v, o, lse, dout, causal=causal, dq=grads[0], dk=grads[1],
                        dv=grads[2], deterministic=deterministic)

                def portable():
                    """The mma.sync kernel forced where the Hopper one would run: the
                    FlashAttention-2-class path, against FlashAttention-2 in one harness."""
                    tkern.force_variant("attention_bwd", PORTABLE_BWD.split()[1])
                    try:
                        return bench(ours(False))
                    finally:
                        tkern.force_variant("attention_bwd", None)

                def sdpa(backend):
                    leaves = [t.transpose(1, 2).detach().requires_grad_() for t in
                              (q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2))]
                    with sdpa_kernel(backend):
                        oh = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                    doh = dout.transpose(1, 2)

                    def call():
                        with sdpa_kernel(backend):
                            return torch.autograd.grad(oh, leaves, doh, retain_graph=True)
                    return call

                def flash4():
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                    o4 = fa4(*leaves, causal=causal)
                    o4 = o4[0] if isinstance(o4, tuple) else o4
                    return lambda: torch.autograd.grad(o4, leaves, dout, retain_graph=True)

                fns = {"tkern": ours(False), "tkern deterministic": ours(True),
                       "FA4": fa4 and flash4, "cuDNN*": lambda: sdpa(SDPBackend.CUDNN_ATTENTION),
                       "FA2*": lambda: sdpa(SDPBackend.FLASH_ATTENTION)}
                def timer(c):
                    try:
                        if c == PORTABLE_BWD:
                            return portable()
                        fn = fns[c] if c.startswith("tkern") else (fns[c] and fns[c]())
                        return bench(fn) if fn else "n/a"
                    except Exception as e:  # noqa: BLE001 - a backend that refuses is n/a
                        print(f"  {c} failed: {type(e).__name__}: {str(e)[:200]}")
                        return "n/a"
                    finally:
                        torch.cuda.empty_cache()
                ms = fair_rounds({c: (lambda c=c: timer(c)) for c in cols})
                diff = "-"
                fa2 = fns["FA2*"]()
                if fa2 is not None and ms["FA2*"] != "n/a":
                    dq2, dk2, dv2 = (t.transpose(1, 2).float() for t in fa2())
                    dk2, dv2 = (t.unflatten(2, (HKV, group)).sum(3) for t in (dk2, dv2))
                    ours(False)()
                    diff = max(max_diff(g, r) for g, r in zip(grads, (dq2, dk2, dv2)))
                    del dq2, dk2, dv2
                tf = rates(ms, flops, 1e9)
                out.append(f"| {shape} | {label} | {rate_cells(tf.values())} | "
                           f"{ratio_cell(tf['tkern'], tf['FA2*'])} | "
                           f"{ratio_cell(tf['tkern'], tf['cuDNN*'])} | "
                           f"{ratio_cell(tf['tkern deterministic'], tf['tkern'])} | "
                           f"{ratio_cell(tf[PORTABLE_BWD], tf['FA2*'])} | {diff_cell(diff)} |")
            except Exception as e:  # noqa: BLE001
                out.append(error_row(f"{shape} | {label}", e, 10))
            finally:
                torch.cuda.empty_cache()
            print("  " + out[-1], flush=True)
    return out


# ----------------------------------------------------------------------------- main --------
def fmt(v):
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def ratio(base, ours):
    return f"{base / ours:.2f}x" if isinstance(base, float) and isinstance(ours, float) else "-"


def ops_table():
    table = ["| op | shape | tkern ms | tkern throughput | eager ms | compile ms | "
             "eager / tkern | compile / tkern | max diff |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, shape, setup in ops():
        if ARGS.only and not any(s in name for s in ARGS.only.split(",")):
            continue
        print(f"{name} {shape}", flush=True)
        try:
            case = setup()
            ours = bench(case["tkern"])
            eager = timed(case["eager"])
            comp = timed(case["compile"])
            diff = max_diff(case["tkern"](), case["eager"]()) if case.get("check", True) else "-"
            unit, amount = case["work"]
            thr = f"{amount / ours / 1e6:.0f} GB/s" if unit == "GB" else \
                f"{amount / ours / 1e9:.0f} TFLOP/s"
            table.append(f"| {name} | {shape} | {fmt(ours)} | {thr} | {fmt(eager)} | {fmt(comp)} "
                         f"| {ratio(eager, ours)} | {ratio(comp, ours)} | "
                         f"{fmt(diff) if isinstance(diff, str) else f'{diff:.3g}'} |")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            msg = f"{type(e).__name__}: {e}".replace("|", "/").replace("\n", " ")[:300]
            table.append(f"| {name} | {shape} | error: {msg} | | | | | | |")
        finally:
            torch.cuda.empty_cache()
        print("  " + table[-1], flush=True)
    return table


def attention_table():
    attn = ["| op | shape | tkern ms | tkern TFLOP/s | SDPA default ms | SDPA flash ms | "
            "SDPA cuDNN ms | FlexAttention ms | best torch / tkern | max diff |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    try:
        for name, shape, cols, flops, diff in attention_rows():
            if "error" in cols:
                attn.append(f"| {name} | {shape} | error: {cols['error'][:300]} | | | | | | | |")
                continue
            ours = cols["tkern"]
            others = [float(str(v).rstrip("*")) for k, v in cols.items() if k != "tkern" and
                      (isinstance(v, float) or str(v).endswith("*"))]
            best = min(others) if others else None
            attn.append(
                f"| {name} | {shape} | {fmt(ours)} | {flops / ours / 1e9:.0f} | "
                f"{fmt(cols['SDPA default'])} | {fmt(cols['SDPA flash'])} | "
                f"{fmt(cols['SDPA cuDNN'])} | {fmt(cols['FlexAttention'])} | "
                f"{ratio(best, ours)} | {diff:.3g} |")
            print("  " + attn[-1], flush=True)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        attn.append(f"| attention | - | error: {type(e).__name__}: {e} | | | | | | | |")
    torch.cuda.empty_cache()
    return attn


def main():
    global ARGS
    ARGS = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_vs_torch.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    started = time.time()
    gpu = torch.cuda.get_device_name()
    header = [
        f"Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; "
        f"GPU: {gpu}; torch {torch.__version__} (CUDA {torch.version.cuda}); libtkern "
        f"{'.'.join(map(str, tkern.version()))} ({tkern.library_path()}).",
        f"Median of {ARGS.reps} x {ARGS.inner} back-to-back calls (CUDA events) after "
        f"{ARGS.warmup} warm-up calls. Ratios > 1 mean libtkern is faster. "
        "'max diff' is the largest |tkern - eager| over the output (attention: against an "
        "f32 SDPA). Attention: * = K/V expanded to heads_q because the backend refused "
        "enable_gqa; 'best torch' is the fastest of the torch columns. The memory and flash "
        "tables replay every column from a CUDA graph (host cost out alike); peers that do "
        "not import show n/a. The memory table's backward rows count x and dy read and dx "
        "written; the weight (and bias) gradients, float32 partial rows reduced in a second "
        "step (1-4 % more bytes at these shapes with one row per SM), are not counted.",
    ]
    tables = {"ops": ops_table, "attention": attention_table, "memory": memory_table,
              "flash": flash_table, "backward": backward_table}
    printed = []
    for name in ARGS.tables.split(","):
        if name not in tables:
            sys.exit(f"--tables: unknown table {name!r} (known: {', '.join(tables)})")
        printed += ["", *tables[name]()]
    report = "\n".join(["## libtkern vs PyTorch (benchmarks/python/bench_vs_torch.py)", ""]
                       + header + printed
                       + ["", f"Whole run: {time.time() - started:.0f} s, of which "
                              f"{COMPILE_SPENT[0]:.0f} s in torch.compile and "
                              f"{FLEX_SPENT[0]:.0f} s in FlexAttention."]) + "\n"
    print()
    print(report)
    if ARGS.out:
        os.makedirs(os.path.dirname(os.path.abspath(ARGS.out)), exist_ok=True)
        with open(ARGS.out, "w") as f:
            f.write(report)
        print(f"written to {ARGS.out}")


if __name__ == "__main__":
    main()
