"""Every fused kernel against its reference, in Triton's interpreter on the CPU.

Shapes are awkward on purpose (rows and columns that are not multiples of the blocks), so
masks are exercised. Inputs are fresh random bf16 values, never zeros, and outputs start
as NaN, so an element a kernel never writes fails the test.

The references (``measure.references.ref_*``) are the oracle's ops in fp32, rounded to bf16
exactly where the kernel rounds (the projection, the bias add, the residual add, the
normalised activation, SwiGLU's steps). So a correct kernel differs from its reference
only where its fp32 sum, taken in another order, lands on the other side of a bf16
rounding boundary: rarely, by one ulp. Measured: 0 (bit-identical) at every shape here
and at 512 x 1536. TOL (``references.GEMV_TOL``, 1e-3) sits above that and
an order of magnitude below the smallest real bug at these shapes: one dropped column of
a 96- to 500-wide GEMV is 3e-2 to 1e-1 (``ci/mutants.py`` applies such bugs one at a time
and shows that this file fails for each).
"""
import pytest
import torch

from onelaunch import kernels as K
from onelaunch.measure.references import (GEMV_TOL, bf16r, ref_attention, ref_lm_head,
                                          ref_matvec_residual, ref_rms, ref_rms_gate_up_swiglu,
                                          ref_rms_qkv, ref_swiglu, splits_written)
from onelaunch.oracle import apply_rope, rope_cos_sin

TOL = GEMV_TOL
bf = torch.bfloat16


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(bf)


def rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def nans(n, dtype=bf):
    return torch.full((n,), float("nan"), dtype=dtype)


CFG = dict(BLOCK_N=16, BLOCK_K=64, num_warps=4)
WHOLE_K = dict(BLOCK_N=8, BLOCK_K=256, num_warps=4)   # one tile covers all of K (masked)


@pytest.mark.parametrize("cfg", [CFG, WHOLE_K], ids=["tiled-K", "whole-K"])
@pytest.mark.parametrize("N,K_", [(37, 150), (64, 96)])
def test_rms_qkv(N, K_, cfg):
    x, g, w, b = rnd(K_, seed=1), 1 + 0.1 * rnd(K_, seed=2), rnd(N, K_, seed=3), rnd(N, seed=4)
    out = nans(N)
    K.rms_qkv.rms_qkv(x, g, w, b, out, 1e-6, cfg=cfg)
    assert rel(out, ref_rms_qkv(x, g, w, b, 1e-6)) < TOL
    # the bias is there: without it the answer is far off (a test that would see it dropped)
    assert rel(ref_rms_qkv(x, g, w, None, 1e-6), ref_rms_qkv(x, g, w, b, 1e-6)) > 100 * TOL


def test_rms_epsilon_changes_the_answer():
    """A residual whose mean square is the size of epsilon: the normalisation's epsilon
    changes the output by tens of percent, so a kernel that dropped it (or used another)
    fails here, while at ordinary scales it is invisible (1e-6 against ~1)."""
    N, K_, eps = 40, 96, 1e-5
    x, g, w = (3e-3 * rnd(K_, seed=40).float()).to(bf), 1 + 0.1 * rnd(K_, seed=41), rnd(N, K_, seed=42)
    assert rel(ref_rms(x, g, 0.0), ref_rms(x, g, eps)) > 0.1            # epsilon matters here
    out = nans(N)
    K.rms_qkv.rms_qkv(x, g, w, None, out, eps, cfg=CFG)
    assert rel(out, ref_rms_qkv(x, g, w, None, eps)) < TOL
    h = nans(N // 2)
    K.rms_gate_up_swiglu.rms_gate_up_swiglu(x, g, w, h, eps, cfg=CFG)
    assert rel(h, ref_rms_gate_up_swiglu(x, g, w, eps)) < TOL
    lg = nans(N, torch.float32)
    K.lm_head_argmax.lm_head_argmax(x, g, w, lg, torch.empty(4), torch.empty(4, dtype=torch.int32),
                     torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32),
                     torch.tensor([0], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                     eps, cfg=CFG)
    assert rel(lg, ref_lm_head(x, g, w, eps)[0]) < TOL


def test_rope_kv_write():
    Hq, Hkv, D, C, pos = 6, 2, 16, 40, 29
    qkv = rnd((Hq + 2 * Hkv) * D, seed=5)
    q = nans(Hq * D)
    kc = torch.zeros(Hkv, C, D, dtype=bf)
    vc = torch.zeros(Hkv, C, D, dtype=bf)
    cos, sin = rope_cos_sin(torch.arange(C), D, 1e6, bf)
    K.rope_kv_write.rope_kv_write(qkv, q, kc, vc, cos, sin, torch.tensor([pos], dtype=torch.int32), Hq, Hkv, D)
    c1, s1 = cos[pos: pos + 1], sin[pos: pos + 1]
    q_ref = apply_rope(qkv[: Hq * D].view(1, Hq, D), c1, s1).flatten()
    k_ref = apply_rope(qkv[Hq * D: (Hq + Hkv) * D].view(1, Hkv, D), c1, s1)[0]
    # the kernel rounds exactly where HF's bf16 RoPE rounds: bit-identical
    assert torch.equal(q, q_ref)
    assert torch.equal(kc[:, pos], k_ref)
    assert torch.equal(vc[:, pos], qkv[(Hq + Hkv) * D:].view(Hkv, D))
    # nothing else in the cache was touched
    assert kc[:, :pos].abs().sum() == 0 and kc[:, pos + 1:].abs().sum() == 0


def test_attention_plain():
    Hq, Hkv, D, C = 6, 2, 16, 50
    q, kc, vc = rnd(Hq * D, seed=6), rnd(Hkv, C, D, seed=7), rnd(Hkv, C, D, seed=8)
    for length in (1, 17, 50):
        out = nans(Hq * D)
        K.attention.attention(q, kc, vc, out, torch.tensor([length - 1], dtype=torch.int32), Hq, Hkv, D,
                    dict(BLOCK_T=16, num_warps=4))
        assert rel(out, ref_attention(q, kc, vc, length, Hq, Hkv, D)) < TOL, length


@pytest.mark.parametrize("N,K_", [(37, 150), (40, 64)])
def test_o_proj_residual(N, K_):
    a, w, x = rnd(K_, seed=9), rnd(N, K_, seed=10), rnd(N, seed=11)
    xo = x.clone()
    K.o_proj_residual.o_proj_residual(a, w, xo, cfg=CFG)
    assert rel(xo, ref_matvec_residual(a, w, x)) < TOL


def test_rms_gate_up_swiglu():
    I, K_ = 45, 96
    x, g, w = rnd(K_, seed=12), 1 + 0.1 * rnd(K_, seed=13), rnd(2 * I, K_, seed=14)
    h = nans(I)
    K.rms_gate_up_swiglu.rms_gate_up_swiglu(x, g, w, h, 1e-6, cfg=CFG)
    assert rel(h, ref_rms_gate_up_swiglu(x, g, w, 1e-6)) < TOL


# K = 500 in 32- or 64-wide tiles: 3 splits of 192 (the last 116, ragged) or 4 of 128 (the
# last 116); the launcher rounds a split up to whole tiles, so these are the splits it runs
@pytest.mark.parametrize("bk", [32, 64])
@pytest.mark.parametrize("split", [1, 3, 4])
def test_down_residual_split_k(split, bk):
    N, K_ = 37, 500
    h, w, x = rnd(K_, seed=15), rnd(N, K_, seed=16), rnd(N, seed=17)
    ref = ref_matvec_residual(h, w, x)
    counter = torch.zeros(N, dtype=torch.int32)
    outs = []
    for _ in range(2):        # a second call must find the counters clean
        scratch = torch.full((split * N,), float("nan"), dtype=torch.float32)  # overwritten
        xd = x.clone()
        K.down_residual.down_residual(h, w, xd, scratch, counter, cfg=dict(CFG, BLOCK_K=bk, SPLIT_K=split))
        assert splits_written(scratch, N) == (split if split > 1 else 0)   # it really split
        assert rel(xd, ref) < TOL
        assert counter.abs().max() == 0
        outs.append(xd)
    assert torch.equal(outs[0], outs[1])     # a fixed summation order: deterministic


def test_lm_head_argmax_and_bookkeeping():
    V, K_ = 301, 96
    x, g, w = rnd(K_, seed=18), 1 + 0.1 * rnd(K_, seed=19), rnd(V, K_, seed=20)
    n_prog = -(-V // 16)
    logits = nans(V, torch.float32)
    pv, pi = torch.empty(n_prog), torch.empty(n_prog, dtype=torch.int32)
    cnt = torch.zeros(1, dtype=torch.int32)
    seq = torch.zeros(16, dtype=torch.int32)
    pos = torch.tensor([4], dtype=torch.int32)
    ref, ref_tok = ref_lm_head(x, g, w, 1e-6)
    # inside the prompt: the token is not written, the position advances
    K.lm_head_argmax.lm_head_argmax(x, g, w, logits, pv, pi, cnt, seq, pos, torch.tensor([9], dtype=torch.int32),
                     1e-6, cfg=CFG)
    assert int(pos) == 5 and seq[5] == 0 and int(cnt) == 0
    assert rel(logits, ref) < TOL
    # past the prompt: seq[pos + 1] = argmax (the first index among equal maxima)
    K.lm_head_argmax.lm_head_argmax(x, g, w, logits, pv, pi, cnt, seq, pos, torch.tensor([1], dtype=torch.int32),
                     1e-6, cfg=CFG)
    assert int(pos) == 6 and int(seq[6]) == int(torch.argmax(logits)) == ref_tok


def _tied_head(V, K_, rows):
    """A [V, K] head whose maximum logit is shared, exactly, by ``rows`` (identical rows)."""
    u = rnd(K_, seed=22)
    w = (-u.float()[None].repeat(V, 1)).to(bf)
    w[list(rows)] = u
    return w


def _argmax(w, cfg, K_=16):
    V = w.shape[0]
    n_prog = -(-V // cfg["BLOCK_N"])
    x, g = rnd(K_, seed=21), torch.ones(K_, dtype=bf)
    seq, pos = torch.zeros(8, dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    K.lm_head_argmax.lm_head_argmax(x, g, w, torch.empty(V), torch.empty(n_prog), torch.empty(n_prog, dtype=torch.int32),
                     torch.zeros(1, dtype=torch.int32), seq, pos, torch.tensor([0], dtype=torch.int32),
                     1e-6, cfg=cfg)
    return int(seq[1])


def test_lm_head_argmax_ties_pick_first_index():
    # rows 5 and 10 tie inside the first 16-row program, 50 in the fourth: one reduction block
    assert _argmax(_tied_head(64, 32, (5, 10, 50)), CFG, 32) == 5


def test_lm_head_argmax_ties_across_reduction_lanes():
    """1040 one-row programs: more partial maxima than one 1024-wide reduction block, so the
    last program folds two blocks lane by lane, then takes the lowest index among the lanes
    that hold the maximum. The maximum is tied at rows 3 and 1027 (the same lane of the two
    blocks), 1023 and 1024 (neighbouring programs across the block boundary): the lowest
    index, 3, must win, as torch.argmax picks it. (One launch: 1040 programs take ~20 s in
    the interpreter.)"""
    w = _tied_head(1040, 16, (1027, 1024, 1023, 3))
    assert _argmax(w, dict(BLOCK_N=1, BLOCK_K=16, num_warps=1)) == 3


def test_embed():
    E = rnd(50, 96, seed=23)
    x = torch.zeros(96, dtype=bf)
    seq = torch.tensor([3, 41, 7], dtype=torch.int32)
    K.embed.embed(E, x, seq, torch.tensor([1], dtype=torch.int32))
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
        K.rms_qkv.rms_qkv(x, g, w, b, qkv, 1e-6, cfg=c)
        K.rms_gate_up_swiglu.rms_gate_up_swiglu(x, g, wgu, h, 1e-6, cfg=c)
        K.o_proj_residual.o_proj_residual(x, w, xo, cfg=c)
        xd = b.clone()
        K.down_residual.down_residual(x, w, xd, torch.empty(2 * N), torch.zeros(N, dtype=torch.int32),
                        cfg=dict(c, SPLIT_K=2, BLOCK_K=64))
        lg = torch.empty(N)
        K.lm_head_argmax.lm_head_argmax(x, g, w, lg, torch.empty(4), torch.empty(4, dtype=torch.int32),
                         torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32),
                         torch.tensor([0], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                         1e-6, cfg=c)
        outs[name] = (qkv, h, xo, xd, lg)
    for a, c in zip(outs["one"], outs["more"]):
        assert torch.equal(a, c)


# ---- the mixture of experts: router, then the experts read by id ----------------------
needs_moe = pytest.mark.skipif(not hasattr(K, "moe_router"), reason="no MoE kernels in this tree")


def ref_router(x, g, w_r, eps, top_k):
    """bf16 router logits, fp32 softmax, top-k by probability (lower index on ties),
    weights rounded to bf16: HF's OLMoE router with norm_topk_prob False."""
    xn = ref_rms(x, g, eps)
    logits = bf16r(w_r.float() @ xn)
    p = torch.softmax(logits, -1)
    order = sorted(range(p.numel()), key=lambda e: (-float(p[e]), e))[:top_k]
    return xn, logits, torch.tensor(order), bf16r(p[order])


@needs_moe
def test_moe_router():
    E, K_, top_k = 12, 80, 4
    x, g, w = rnd(K_, seed=50), 1 + 0.1 * rnd(K_, seed=51), rnd(E, K_, seed=52)
    xn, lg, ids, wts = nans(K_), nans(E, torch.float32), torch.full((top_k,), -1, dtype=torch.int32), nans(top_k, torch.float32)
    K.moe_router.moe_router(x, g, w, xn, lg, ids, wts, torch.zeros(1, dtype=torch.int32),
                 torch.tensor([0], dtype=torch.int32), 1e-5, cfg=dict(BLOCK_N=4, BLOCK_K=64, num_warps=4))
    r_xn, r_lg, r_ids, r_w = ref_router(x, g, w, 1e-5, top_k)
    assert rel(xn, r_xn) < TOL and rel(lg, r_lg) < TOL
    assert ids.tolist() == r_ids.tolist()
    assert rel(wts, r_w) < TOL


def _moe_inputs(E=6, I=40, H=72, top_k=3):
    w_gu = rnd(E, 2 * I, H, seed=60)
    w_dn = rnd(E, H, I, seed=61)
    ids = torch.tensor([4, 1, 5], dtype=torch.int32)[:top_k]        # distinct, out of order
    wts = torch.tensor([0.5, 0.3125, 0.1875])[:top_k]               # distinct weights
    return w_gu, w_dn, ids, wts


@needs_moe
def test_moe_gate_up_reads_each_slots_expert():
    w_gu, _, ids, _ = _moe_inputs()
    E, two_i, H = w_gu.shape
    I = two_i // 2
    xn = rnd(H, seed=62)
    h = nans(len(ids) * I)
    K.moe_experts.moe_gate_up_swiglu(xn, w_gu, ids, h, cfg=dict(BLOCK_N=8, BLOCK_K=32, num_warps=4))
    for j, e in enumerate(ids.tolist()):
        gu = w_gu[e].float() @ xn.float()
        assert rel(h[j * I:(j + 1) * I], ref_swiglu(gu[:I], gu[I:])) < TOL, (j, e)


@needs_moe
def test_moe_down_weights_and_sums_the_experts():
    _, w_dn, ids, wts = _moe_inputs()
    E, H, I = w_dn.shape
    top_k = len(ids)
    h, x = rnd(top_k, I, seed=63), rnd(H, seed=64)
    total = torch.zeros(H)
    for j, e in enumerate(ids.tolist()):        # slot order, fp32, as the kernel sums
        total = total + bf16r(bf16r(w_dn[e].float() @ h[j].float()) * wts[j])
    ref = bf16r(x.float() + bf16r(total))
    xd = x.clone()
    cnt = torch.zeros(H, dtype=torch.int32)
    K.moe_experts.moe_down_residual(h, w_dn, ids, wts, xd, torch.full((top_k * H,), float("nan")), cnt,
                        cfg=dict(BLOCK_N=8, BLOCK_K=32, num_warps=4))
    assert rel(xd, ref) < TOL and cnt.abs().max() == 0
