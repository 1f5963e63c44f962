"""References for the kernels: the oracle's ops in fp32, rounded to bf16 exactly where the
kernel rounds, and the tolerances a kernel is held to against them.

Every kernel row (:mod:`onelaunch.measure.kernel_rows`), launch configuration
(:mod:`onelaunch.measure.tune`) and kernel test compares a kernel's output with one of
these by :func:`rel_err`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# A kernel accumulates in fp32 and rounds its intermediates to bf16 where HF's bf16 model
# rounds them. Against a plain fp32 reference that rounding alone costs a few bf16 ulps
# (2^-8 relative each, ~4e-3), which would hide a bug of the same size: one dropped column
# of a 1536-wide GEMV changes the output by ~3e-3 to 2e-2. These references round at the
# same points, so a correct kernel differs from them only where its fp32 sums (summed in
# another order) straddle a bf16 rounding boundary: a fraction of a percent of the
# elements, by one ulp. Measured: bit-identical in the interpreter at every test shape and
# at 512 x 1536; at Qwen2.5-1.5B's shapes an fp32 sum and an exact one round to the same
# bf16 outputs but for 13 of the 151936 logits (3.8e-5 relative L2). GEMV_TOL, a quarter of an ulp on average,
# leaves room for another GPU's summation order and sits far below a one-column bug at
# those shapes: a dropped column is 1.4e-2 (down) to 5.9e-2 (gate/up), a column counted
# twice at a split-K boundary 4.6e-3, a dropped QKV bias 5.8e-2.
GEMV_TOL = 1e-3
# Attention: the split-K kernel on a GPU multiplies bf16 probabilities by bf16 values in
# tl.dot (the plain kernel and the interpreter keep them fp32), so against the fp32
# softmax reference its error includes a bf16 rounding of each p: measured 2.1e-3 on the
# H200 at ctx 512 (plain: 1.6e-3, against an unrounded reference), hence 5e-3.
ATTN_TOL = 5e-3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def bf16r(t: torch.Tensor) -> torch.Tensor:
    """Round to the nearest bf16 (ties to even), kept in fp32: the kernels' ``bf16_round``."""
    return t.float().to(torch.bfloat16).float()


def ref_rms(x, g, eps):
    """rmsnorm(x) * g as the kernels (and HF in bf16) compute it: the statistic in fp32,
    (x * rstd) rounded to bf16, times the gain, rounded again. x, g: [K] -> fp32 [K]."""
    x = x.float()
    rstd = 1.0 / torch.sqrt((x * x).mean() + eps)
    return bf16r(bf16r(x * rstd) * g.float())


def _gemv(w, v):
    return F.linear(v.float()[None], w.float())[0]


def ref_rms_qkv(x, g, w, b, eps):
    """bf16(bf16(W @ xn) + b): the projection rounded, then the bias added and rounded."""
    y = bf16r(_gemv(w, ref_rms(x, g, eps)))
    return y if b is None else bf16r(y + b.float())


def ref_matvec_residual(a, w, x):
    """x + W @ a as o_proj_residual and down_residual round it: bf16(x + bf16(W @ a))."""
    return bf16r(x.float() + bf16r(_gemv(w, a)))


def ref_swiglu(gate, up):
    """silu(gate) * up as the kernels round it: gate, up, silu(gate), then the product."""
    gate, up = bf16r(gate), bf16r(up)
    return bf16r(bf16r(gate / (1.0 + torch.exp(-gate))) * up)


def ref_rms_gate_up_swiglu(x, g, w_gate_up, eps):
    I = w_gate_up.shape[0] // 2
    gu = _gemv(w_gate_up, ref_rms(x, g, eps))
    return ref_swiglu(gu[:I], gu[I:])


def ref_lm_head(x, g, w, eps):
    """bf16-rounded logits (fp32 [V]) and their argmax (the first index among equals)."""
    logits = bf16r(_gemv(w, ref_rms(x, g, eps)))
    return logits, int(logits.argmax())


def ref_attention(q, kc, vc, length, heads, kv_heads, head_dim):
    """Decode attention in fp32 over the first ``length`` positions, output rounded."""
    grp = heads // kv_heads
    Kr = kc[:, :length].float().repeat_interleave(grp, 0)
    Vr = vc[:, :length].float().repeat_interleave(grp, 0)
    sc = torch.einsum("hd,hcd->hc", q.view(heads, head_dim).float(), Kr) * head_dim ** -0.5
    return bf16r(torch.einsum("hc,hcd->hd", sc.softmax(-1), Vr).flatten())


def splits_written(scratch: torch.Tensor, n: int) -> int:
    """How many [n]-rows of a NaN-filled split-K scratch buffer a launch wrote: the split
    count the kernel really ran (0 when it did not split)."""
    rows = scratch[: (scratch.numel() // n) * n].view(-1, n)
    return int((~torch.isnan(rows)).all(1).sum())
