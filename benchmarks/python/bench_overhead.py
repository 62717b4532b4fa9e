#!/usr/bin/env python3
"""Per-call cost of the Python binding against torch eager, on tiny bf16 tensors.

Each op is called --calls times back to back (outputs allocated by the binding, as a model
does) followed by one synchronize; the time per call is then the host's cost of a call, kernel
launch included, since the kernels on tensors this small take less time than their launch.
The same torch eager op runs in the same process right after. The host's noise moves such
figures by up to 2x from one run to the next, so every op is timed in each of --rounds rounds,
ours and torch's back to back (in alternating order), with Python's garbage collector off
while a call sequence runs, and the table gives the median round of each, with the range of
the rounds beside it. Targets: <= 12 us per call for the elementwise, norm, softmax and RoPE
functions, <= 20 us for attention and gemm.

A last section captures a decode step of tkern calls (norm, QKV gemm, RoPE, attention, output
gemm, norm, SwiGLU, down gemm) in a CUDA graph and compares a replay with the eager step: the
way to take the host cost out of a decode step (docs/python.md).

    make -j && python3 benchmarks/python/bench_overhead.py [--out build/bench_overhead.md]
"""

import argparse
import datetime
import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tkern  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
ROWS, COLS = 4, 1024              # elementwise, norms, softmax: [4, 1024]
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 128
CONTEXT = 256                     # keys a decode query sees
TARGETS = {"attention": 20.0, "gemm": 20.0}  # others: 12 us
TARGET = 12.0


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per timed round")
    ap.add_argument("--rounds", type=int, default=9,
                    help="timed rounds per op and side (the median is reported)")
    ap.add_argument("--out", help="also write the Markdown report to this file")
    return ap.parse_args()


def per_call_us(fn, calls):
    """Microseconds per call of `calls` calls back to back and one synchronize, after a warm-up,
    with the garbage collector off (as timeit does)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / calls * 1e6
    finally:
        if gc_was_on:
            gc.enable()


def rounds_us(table, calls, rounds):
    """name -> (our per-call times, torch's) over `rounds` rounds. A round times every op of
    `table` (name -> (ours, torch's)), each op's two sides back to back, the first in
    alternating order: a slow spell of the host (seen: every op 1.5x slower for the first
    minute of a run) then lands in one round of every op, which the median leaves out, rather
    than in every round of the first ops."""
    times = {name: ([], []) for name in table}
    for r in range(rounds):
        for name, (ours, theirs) in table.items():
            pair = ((ours, times[name][0]), (theirs, times[name][1]))
            for fn, into in (pair if r % 2 == 0 else pair[::-1]):
                into.append(per_call_us(fn, calls))
    return times


def median_and_range(times):
    return f"{statistics.median(times):.1f} ({min(times):.1f}-{max(times):.1f})"


def rand(*shape, dtype=BF16, scale=1.0):
    return torch.randn(*shape, device=DEV, dtype=dtype) * scale


def torch_rope(q, k, cos, sin, pos):
    """NeoX RoPE in eager torch (Hugging Face's rotate_half form)."""
    c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)

    def rot(t):
        t1, t2 = t.chunk(2, -1)
        return t * c + torch.cat((-t2, t1), -1) * s
    return rot(q), rot(k)


def ops():
    """name -> (shape text, tkern call, torch eager call)."""
    x = rand(ROWS, COLS)
    x2 = rand(ROWS, 2 * COLS)
    w, b = rand(COLS), rand(COLS)
    tokens = ROWS
    q, k = rand(tokens, HEADS, HEAD_DIM), rand(tokens, KV_HEADS, HEAD_DIM)
    q_inplace, k_inplace = q.clone(), k.clone()  # rotated again at every call: norms kept
    pos = torch.arange(tokens, device=DEV, dtype=torch.int64) + 100
    inv = 10000.0 ** (-torch.arange(0, HEAD_DIM, 2, device=DEV, dtype=torch.float32) / HEAD_DIM)
    ang = torch.arange(4096, device=DEV, dtype=torch.float32)[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(BF16), torch.cat([ang.sin()] * 2, -1).to(BF16)
    # Decode attention, [batch, heads, seq, head_dim] for both (SDPA's layout).
    qa = rand(1, HEADS, 1, HEAD_DIM)
    ka, va = rand(1, HEADS, CONTEXT, HEAD_DIM), rand(1, HEADS, CONTEXT, HEAD_DIM)
    a, wl = rand(ROWS, COLS), rand(COLS, COLS, scale=COLS ** -0.5)
    d = COLS
    return {
        "gelu": (f"[{ROWS}, {COLS}]", lambda: tkern.gelu(x), lambda: F.gelu(x)),
        "softmax": (f"[{ROWS}, {COLS}]", lambda: tkern.softmax(x),
                    lambda: torch.softmax(x, -1)),
        "glu": (f"[{ROWS}, 2x{COLS}] swiglu", lambda: tkern.glu(x2, "swiglu"),
                lambda: F.silu(x2[:, :d]) * x2[:, d:]),
        "rms_norm": (f"[{ROWS}, {COLS}]", lambda: tkern.rms_norm(x, w, 1e-6),
                     lambda: F.rms_norm(x, (COLS,), w, 1e-6)),
        "layer_norm": (f"[{ROWS}, {COLS}]", lambda: tkern.layer_norm(x, w, b),
                       lambda: F.layer_norm(x, (COLS,), w, b)),
        "rope": (f"{tokens} tokens, {HEADS}/{KV_HEADS} heads, D {HEAD_DIM}",
                 lambda: tkern.rope(q, k, pos), lambda: torch_rope(q, k, cos, sin, pos)),
        # In place, as an engine applies it to its QKV buffer (vLLM's rotary op); torch's column
        # is the same out-of-place code as the row above (eager torch has no in-place RoPE).
        "rope_": (f"{tokens} tokens, in place", lambda: tkern.rope_(q_inplace, k_inplace, pos),
                  lambda: torch_rope(q_inplace, k_inplace, cos, sin, pos)),
        "attention": (f"decode B1 H{HEADS} Sk{CONTEXT} D{HEAD_DIM} (SDPA)",
                      lambda: tkern.attention(qa, ka, va, layout="bhsd"),
                      lambda: F.scaled_dot_product_attention(qa, ka, va)),
        "gemm": (f"[{ROWS}, {COLS}] x W[{COLS}, {COLS}]^T (F.linear)",
                 lambda: tkern.gemm(a, wl.t()), lambda: F.linear(a, wl)),
    }


def decode_step_graph(calls):
    """(eager us per step, replay us per step, tkern calls per step) of a decode step."""
    D, FF, S = COLS, 2 * COLS, CONTEXT
    H, KV, HD = HEADS, KV_HEADS, HEAD_DIM
    w_norm = rand(D)
    w_qkv = rand((H + 2 * KV) * HD, D, scale=D ** -0.5)
    w_o = rand(D, H * HD, scale=(H * HD) ** -0.5)
    w_up, w_down = rand(2 * FF, D, scale=D ** -0.5), rand(D, FF, scale=FF ** -0.5)
    k_cache, v_cache = rand(1, S, KV, HD), rand(1, S, KV, HD)
    x = rand(1, D)
    pos = torch.tensor([S - 1], device=DEV, dtype=torch.int32)

    def step():
        h = tkern.rms_norm(x, w_norm, 1e-6)
        qkv = tkern.gemm(h, w_qkv.t()).view(1, H + 2 * KV, HD)
        q, _ = tkern.rope(qkv[:, :H], qkv[:, H:H + KV], pos)
        o = tkern.attention(q.view(1, 1, H, HD), k_cache, v_cache, causal=True)
        y = tkern.gemm(o.view(1, H * HD), w_o.t(), c=x)
        g = tkern.glu(tkern.gemm(tkern.rms_norm(y, w_norm, 1e-6), w_up.t()), "swiglu")
        return tkern.gemm(g, w_down.t(), c=y)

    steps = max(calls // 10, 50)
    eager = per_call_us(step, steps)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    replay = per_call_us(graph.replay, steps)
    return eager, replay, 9


def main():
    args = parse_args()
    lines = [f"# Python binding: per-call cost against torch eager ({datetime.date.today()})", "",
             f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; libtkern "
             f"{'.'.join(map(str, tkern.version()))} ({tkern.library_path()}); "
             f"{args.calls} calls back to back and one synchronize per round; the median of "
             f"{args.rounds} rounds per op and side (ours and torch's interleaved), the range of "
             "the rounds in parentheses; garbage collector off while a round runs; bf16.", "",
             "| op | shape | tkern us/call, median (range) | torch us/call, median (range) | "
             "ratio of medians | target | met |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    print("\n".join(lines), flush=True)
    table = ops()
    times = rounds_us({name: (ours, theirs) for name, (_, ours, theirs) in table.items()}, args.calls,
                      args.rounds)
    for name, (shape, _, _) in table.items():
        t_ours, t_torch = times[name]
        m_ours, m_torch = statistics.median(t_ours), statistics.median(t_torch)
        target = TARGETS.get(name, TARGET)
        met = "yes" if m_ours <= target else "NO"
        row = (f"| {name} | {shape} | {median_and_range(t_ours)} | {median_and_range(t_torch)} "
               f"| {m_ours / m_torch:.2f} | <= {target:.0f} | {met} |")
        lines.append(row)
        print(row, flush=True)
    eager, replay, n = decode_step_graph(args.calls)
    tail = ["", f"Decode step of {n} tkern calls (D {COLS}, {HEADS}/{KV_HEADS} heads, "
            f"{CONTEXT} keys): eager {eager:.1f} us per step, CUDA graph replay {replay:.1f} us "
            "per step."]
    lines += tail
    print("\n".join(tail))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
