"""Every fused kernel against its oracle op, in Triton's interpreter on the CPU.

Shapes are awkward on purpose (rows and columns that are not multiples of the blocks), so
masks are exercised. Inputs are fresh random bf16 values, never zeros. Tolerance: the
kernels round where HF's bf16 model rounds, so against an fp32 reference on the same bf16
inputs they sit a few bf16 ulps away (2^-8 = 4e-3 relative each): 1e-2 relative L2 error.
An indexing or masking bug gives errors of order 1.
"""
import pytest
import torch
import torch.nn.functional as F

from onelaunch import kernels as K
from onelaunch.oracle import apply_rope, rms_norm, rope_cos_sin

TOL = 1e-2
bf = torch.bfloat16


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(bf)


def rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


CFG = dict(BLOCK_N=16, BLOCK_K=64, num_warps=4)


WHOLE_K = dict(BLOCK_N=8, BLOCK_K=256, num_warps=4)   # one tile covers all of K (masked)


@pytest.mark.parametrize("cfg", [CFG, WHOLE_K], ids=["tiled-K", "whole-K"])
@pytest.mark.parametrize("N,K_", [(37, 150), (64, 96)])
def test_rms_qkv(N, K_, cfg):
    x, g, w, b = rnd(K_, seed=1), 1 + 0.1 * rnd(K_, seed=2), rnd(N, K_, seed=3), rnd(N, seed=4)
    out = torch.full((N,), float("nan"), dtype=bf)
    K.rms_qkv(x, g, w, b, out, 1e-6, cfg=cfg)
    ref = F.linear(rms_norm(x.float()[None], g.float(), 1e-6), w.float(), b.float())[0]
    assert rel(out, ref) < TOL


def test_rope_kv_write():
    Hq, Hkv, D, C, pos = 6, 2, 16, 40, 29
    qkv = rnd((Hq + 2 * Hkv) * D, seed=5)
    q = torch.full((Hq * D,), float("nan"), dtype=bf)
    kc = torch.zeros(Hkv, C, D, dtype=bf)
    vc = torch.zeros(Hkv, C, D, dtype=bf)
    cos, sin = rope_cos_sin(torch.arange(C), D, 1e6, bf)
    K.rope_kv_write(qkv, q, kc, vc, cos, sin, torch.tensor([pos], dtype=torch.int32), Hq, Hkv, D)
    c1, s1 = cos[pos: pos + 1], sin[pos: pos + 1]
    q_ref = apply_rope(qkv[: Hq * D].view(1, Hq, D), c1, s1).flatten()
    k_ref = apply_rope(qkv[Hq * D: (Hq + Hkv) * D].view(1, Hkv, D), c1, s1)[0]
    # the kernel rounds exactly where HF's bf16 RoPE rounds: bit-identical
    assert torch.equal(q, q_ref)
    assert torch.equal(kc[:, pos], k_ref)
    assert torch.equal(vc[:, pos], qkv[(Hq + Hkv) * D:].view(Hkv, D))
    # nothing else in the cache was touched
    assert kc[:, :pos].abs().sum() == 0 and kc[:, pos + 1:].abs().sum() == 0


def attention_ref(q, kc, vc, length, Hq, Hkv, D):
    g = Hq // Hkv
    Kr = kc[:, :length].float().repeat_interleave(g, 0)
    Vr = vc[:, :length].float().repeat_interleave(g, 0)
    s = torch.einsum("hd,hcd->hc", q.view(Hq, D).float(), Kr) * D ** -0.5
    return torch.einsum("hc,hcd->hd", s.softmax(-1), Vr).flatten()


def test_attention_plain():
    Hq, Hkv, D, C = 6, 2, 16, 50
    q, kc, vc = rnd(Hq * D, seed=6), rnd(Hkv, C, D, seed=7), rnd(Hkv, C, D, seed=8)
    for length in (1, 17, 50):
        out = torch.full((Hq * D,), float("nan"), dtype=bf)
        K.attention(q, kc, vc, out, torch.tensor([length - 1], dtype=torch.int32), Hq, Hkv, D,
                    dict(BLOCK_T=16, num_warps=4))
        assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL, length


@pytest.mark.parametrize("N,K_", [(37, 150), (40, 64)])
def test_o_proj_residual(N, K_):
    a, w, x = rnd(K_, seed=9), rnd(N, K_, seed=10), rnd(N, seed=11)
    xo = x.clone()
    K.o_proj_residual(a, w, xo, cfg=CFG)
    assert rel(xo, x.float() + F.linear(a.float()[None], w.float())[0]) < TOL


def test_rms_gate_up_swiglu():
    I, K_ = 45, 96
    x, g, w = rnd(K_, seed=12), 1 + 0.1 * rnd(K_, seed=13), rnd(2 * I, K_, seed=14)
    h = torch.full((I,), float("nan"), dtype=bf)
    K.rms_gate_up_swiglu(x, g, w, h, 1e-6, cfg=CFG)
    gu = F.linear(rms_norm(x.float()[None], g.float(), 1e-6), w.float())[0]
    assert rel(h, F.silu(gu[:I]) * gu[I:]) < TOL


@pytest.mark.parametrize("bk", [64, 256])
@pytest.mark.parametrize("split", [1, 3, 4])
def test_down_residual_split_k(split, bk):
    N, K_ = 37, 200            # 200 columns in 3 or 4 splits of a 64-wide tile: ragged
    h, w, x = rnd(K_, seed=15), rnd(N, K_, seed=16), rnd(N, seed=17)
    scratch = torch.full((split * N,), float("nan"), dtype=torch.float32)  # overwritten
    counter = torch.zeros(N, dtype=torch.int32)
    ref = x.float() + F.linear(h.float()[None], w.float())[0]
    xd = x.clone()
    outs = []
    for _ in range(2):        # a second call must find the counters clean
        xd = x.clone()
        K.down_residual(h, w, xd, scratch, counter, cfg=dict(CFG, BLOCK_K=bk, SPLIT_K=split))
        assert rel(xd, ref) < TOL
        assert counter.abs().max() == 0
        outs.append(xd)
    assert torch.equal(outs[0], outs[1])     # a fixed summation order: deterministic


def test_lm_head_argmax_and_bookkeeping():
    V, K_ = 301, 96
    x, g, w = rnd(K_, seed=18), 1 + 0.1 * rnd(K_, seed=19), rnd(V, K_, seed=20)
    n_prog = -(-V // 16)
    logits = torch.empty(V)
    pv, pi = torch.empty(n_prog), torch.empty(n_prog, dtype=torch.int32)
    cnt = torch.zeros(1, dtype=torch.int32)
    seq = torch.zeros(16, dtype=torch.int32)
    pos = torch.tensor([4], dtype=torch.int32)
    ref = F.linear(rms_norm(x.float()[None], g.float(), 1e-6), w.float())[0]
    # inside the prompt: the token is not written, the position advances
    K.lm_head_argmax(x, g, w, logits, pv, pi, cnt, seq, pos, torch.tensor([9], dtype=torch.int32),
                     1e-6, cfg=CFG)
    assert int(pos) == 5 and seq[5] == 0 and int(cnt) == 0
    assert rel(logits, ref) < TOL
    # past the prompt: seq[pos + 1] = argmax (the first index among equal maxima)
    K.lm_head_argmax(x, g, w, logits, pv, pi, cnt, seq, pos, torch.tensor([1], dtype=torch.int32),
                     1e-6, cfg=CFG)
    assert int(pos) == 6 and int(seq[6]) == int(torch.argmax(logits))
    assert int(seq[6]) == int(ref.argmax())


def test_lm_head_argmax_ties_pick_first_index():
    V, K_ = 64, 32
    x, g = rnd(K_, seed=21), torch.ones(K_, dtype=bf)
    w = torch.zeros(V, K_, dtype=bf)
    w[:] = rnd(K_, seed=22)[None] * -1
    w[10] = w[50] = rnd(K_, seed=22) * 1            # rows 10 and 50 tie for the maximum
    logits, pv, pi = torch.empty(V), torch.empty(4), torch.empty(4, dtype=torch.int32)
    seq, pos = torch.zeros(8, dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    K.lm_head_argmax(x, g, w, logits, pv, pi, torch.zeros(1, dtype=torch.int32), seq, pos,
                     torch.tensor([0], dtype=torch.int32), 1e-6, cfg=CFG)
    assert int(seq[1]) == 10


def test_embed():
    E = rnd(50, 96, seed=23)
    x = torch.zeros(96, dtype=bf)
    seq = torch.tensor([3, 41, 7], dtype=torch.int32)
    K.embed(E, x, seq, torch.tensor([1], dtype=torch.int32))
    assert torch.equal(x, E[41])


@pytest.mark.parametrize("pf", [2, 3, 4])
def test_prefetched_tiles_change_no_bit(pf):
    """Requesting 2-4 weight tiles before the PDL wait (PREFETCH) is a schedule, not new
    arithmetic: every GEMV kernel gives bit-for-bit what it gives with one tile. K = 200 in
    64-wide tiles is 4 tiles, the last ragged, so PREFETCH 2 and 3 also run the loop."""
    N, I, K_ = 37, 45, 200
    one, more = dict(CFG, PREFETCH=1), dict(CFG, PREFETCH=pf)
    x, g, b = rnd(K_, seed=30), 1 + 0.1 * rnd(K_, seed=31), rnd(N, seed=32)
    w, wgu = rnd(N, K_, seed=33), rnd(2 * I, K_, seed=34)
    outs = {}
    for name, c in (("one", one), ("more", more)):
        qkv, h, xo = torch.empty(N, dtype=bf), torch.empty(I, dtype=bf), b.clone()
        K.rms_qkv(x, g, w, b, qkv, 1e-6, cfg=c)
        K.rms_gate_up_swiglu(x, g, wgu, h, 1e-6, cfg=c)
        K.o_proj_residual(x, w, xo, cfg=c)
        xd = b.clone()
        K.down_residual(x, w, xd, torch.empty(2 * N), torch.zeros(N, dtype=torch.int32),
                        cfg=dict(c, SPLIT_K=2, BLOCK_K=64))
        lg = torch.empty(N)
        K.lm_head_argmax(x, g, w, lg, torch.empty(4), torch.empty(4, dtype=torch.int32),
                         torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32),
                         torch.tensor([0], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                         1e-6, cfg=c)
        outs[name] = (qkv, h, xo, xd, lg)
    for a, c in zip(outs["one"], outs["more"]):
        assert torch.equal(a, c)
