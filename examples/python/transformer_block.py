#!/usr/bin/env python3
"""A Llama-style transformer block's kernels from Python: libtkern on torch tensors.

    make -j && PYTHONPATH=python python3 examples/python/transformer_block.py

Runs RMSNorm, RoPE, causal GQA attention, the projections (GEMM), SwiGLU and the fused residual
add + RMSNorm on bf16 tensors, checks each against PyTorch and prints the differences.
Exits with status 2 and a message when there is no usable GPU.
"""

import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("this example needs PyTorch")

import tkern

if not torch.cuda.is_available():
    print("no usable CUDA device: this example needs a GPU", file=sys.stderr)
    sys.exit(2)

torch.manual_seed(0)
B, S, H, HKV, D, HIDDEN, FFN = 2, 512, 16, 4, 128, 2048, 5632
dev, bf16 = "cuda", torch.bfloat16


def param(*shape):
    return (torch.randn(*shape, device=dev) / shape[-1] ** 0.5).to(bf16)


x = torch.randn(B, S, HIDDEN, device=dev, dtype=bf16)
norm_w = torch.ones(HIDDEN, device=dev, dtype=bf16)
w_qkv = param((H + 2 * HKV) * D, HIDDEN)  # Linear weights [out, in]
w_o = param(HIDDEN, H * D)
w_up = param(2 * FFN, HIDDEN)  # [gate | up]
w_down = param(HIDDEN, FFN)
positions = torch.arange(S, device=dev).repeat(B)

print(f"libtkern {'.'.join(map(str, tkern.version()))} from {tkern.library_path()}, "
      f"device {tkern.device_query()}")

# Attention half: norm, QKV projection, RoPE in place on the q / k views, attention, output.
h = tkern.rms_norm(x, norm_w, 1e-5)
qkv = tkern.gemm(h, w_qkv.t()).view(B, S, H + 2 * HKV, D)  # b = W^T: x @ W^T as F.linear
q, k, v = qkv[:, :, :H], qkv[:, :, H:H + HKV], qkv[:, :, H + HKV:]
tkern.rope_(q, k, positions, theta=500000.0)
attn = tkern.attention(q, k, v, causal=True)  # [B, S, H, D], GQA 16 / 4
attn_out = tkern.gemm(attn.view(B, S, H * D), w_o.t())

# MLP half: fused residual add + norm (x becomes x + attn_out), gate/up GEMM, SwiGLU, down.
residual = x.clone()
h2 = tkern.rms_norm(attn_out, norm_w, 1e-5, residual=residual)
mlp = tkern.gemm(tkern.swiglu(tkern.gemm(h2, w_up.t())), w_down.t(), c=residual)
print(f"block output {tuple(mlp.shape)} {mlp.dtype}, last kernel variant "
      f"'{tkern.last_variant()}'")

# The same block in PyTorch.
rh = F.rms_norm(x, (HIDDEN,), norm_w, 1e-5)
rqkv = F.linear(rh, w_qkv).view(B, S, H + 2 * HKV, D)
inv = 500000.0 ** (-torch.arange(0, D, 2, device=dev, dtype=torch.float64) / D)
ang = positions.view(B, S, 1, 1).double() * inv
cos, sin = ang.cos(), ang.sin()


def rope_ref(t):
    t = t.double()
    t1, t2 = t[..., :D // 2], t[..., D // 2:]
    return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1).to(bf16)


rq, rk, rv = rope_ref(rqkv[:, :, :H]), rope_ref(rqkv[:, :, H:H + HKV]), rqkv[:, :, H + HKV:]
ra = F.scaled_dot_product_attention(rq.transpose(1, 2), rk.transpose(1, 2), rv.transpose(1, 2),
                                    is_causal=True, enable_gqa=True).transpose(1, 2)
r_attn_out = F.linear(ra.reshape(B, S, H * D), w_o)
r_res = x + r_attn_out
rh2 = F.rms_norm(r_res, (HIDDEN,), norm_w, 1e-5)
gate, up = F.linear(rh2, w_up).chunk(2, -1)
r_mlp = F.linear(F.silu(gate) * up, w_down) + r_res

for name, ours, ref in [("rms_norm", h, rh), ("attention", attn, ra), ("residual", residual, r_res),
                        ("block", mlp, r_mlp)]:
    err = (ours.float() - ref.float()).abs().max().item()
    print(f"{name:10s} max |tkern - torch| = {err:.3g}  (|torch| max {ref.abs().max().item():.3g})")
