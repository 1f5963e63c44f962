"""Tensor parallelism's kernel modes, unfused (one process, Triton's interpreter).

A rank computes a partial of each row-parallel projection from a column slice of the
weight (``out=``), the partials are summed in rank order (an all-reduce, here a torch
add), and ``residual_add`` finishes x = bf16(x + bf16(p_0 + p_1)). The LM head is split by
vocabulary: each rank's (max logit, global index) goes into a keys buffer (``keys=``),
summed over ranks, and ``argmax_merge`` picks the token. OLMoE's q/k norm spans all heads:
``qk_sumsq`` gives each rank's sums of squares, summed over ranks, and ``rope_kv_write(...,
ss=)`` uses them.

Where one rank's result must equal the one-GPU kernel it does so bit for bit (the same
fp32 sums in the same order); a real two-way split sums in another order, so it matches
the one-GPU kernel within bf16 rounding (``TOL``, as in test_kernels.py).
"""
import pytest
import torch

from onelaunch import kernels as K
from onelaunch.measure.references import GEMV_TOL as TOL, bf16r, ref_lm_head, splits_written
from onelaunch.oracle import rope_cos_sin

bf = torch.bfloat16
CFG = dict(BLOCK_N=16, BLOCK_K=64, num_warps=4)
I32 = dict(dtype=torch.int32)


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(bf)


def rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def nan32(n):
    return torch.full((n,), float("nan"))


def test_residual_add():
    N = 1500                                            # two programs, the second ragged
    x, s = rnd(N, seed=1), torch.randn(N, generator=torch.Generator().manual_seed(2)) * 3
    xo = x.clone()
    K.tp_ops.residual_add(s, xo)
    assert torch.equal(xo.float(), bf16r(x.float() + bf16r(s)))


# ---- `out`: the rank's partial, unrounded; the one-GPU kernel is out + residual_add ---
def _o_proj(a, w, x, out=None):
    xo = x.clone()
    K.o_proj_residual.o_proj_residual(a, w, xo, cfg=CFG, out=out)
    return xo


def _down(h, w, x, out=None, split=3, bk=64):
    N = w.shape[0]
    xo, scratch, cnt = x.clone(), torch.full((split * N,), float("nan")), torch.zeros(N, **I32)
    K.down_residual.down_residual(h, w, xo, scratch, cnt, cfg=dict(CFG, BLOCK_K=bk, SPLIT_K=split), out=out)
    assert cnt.abs().max() == 0 and splits_written(scratch, N) == (split if split > 1 else 0)
    return xo


def _moe_down(h, w, ids, wts, x, out=None):
    top_k, N = len(ids), w.shape[1]
    xo, cnt = x.clone(), torch.zeros(N, **I32)
    K.moe_experts.moe_down_residual(h, w, ids, wts, xo, torch.full((top_k * N,), float("nan")), cnt,
                        cfg=dict(BLOCK_N=8, BLOCK_K=32, num_warps=4), out=out)
    assert cnt.abs().max() == 0
    return xo


def _moe_inputs(E=6, I=40, H=37, seed=60):
    w = rnd(E, H, I, seed=seed)
    ids = torch.tensor([4, 1, 5], **I32)
    wts = torch.tensor([0.5, 0.3125, 0.1875])
    return w, ids, wts, rnd(3, I, seed=seed + 1), rnd(H, seed=seed + 2)


def _check_out_mode(run, N, ref_partial):
    """``run(out)`` leaves x alone and writes the fp32 partial; with residual_add it is
    the default kernel's x bit for bit."""
    x_plain = run(None)
    out = nan32(N)
    x_kept = run(out)
    x0 = run.x
    assert torch.equal(x_kept, x0), "out mode must not touch x"
    assert torch.allclose(out, ref_partial, rtol=1e-5, atol=1e-4)
    xs = x0.clone()
    K.tp_ops.residual_add(out, xs)
    assert torch.equal(xs, x_plain)


class _Run:
    def __init__(self, fn, x):
        self.fn, self.x = fn, x

    def __call__(self, out):
        return self.fn(self.x, out)


@pytest.mark.parametrize("N,K_", [(37, 150), (40, 64)])
def test_o_proj_out_mode(N, K_):
    a, w, x = rnd(K_, seed=9), rnd(N, K_, seed=10), rnd(N, seed=11)
    _check_out_mode(_Run(lambda x, out: _o_proj(a, w, x, out), x), N, w.float() @ a.float())


@pytest.mark.parametrize("split", [1, 3])
def test_down_out_mode_split_k(split):
    N, K_ = 37, 500                     # 3 splits of 192 columns, the last 116 (ragged)
    h, w, x = rnd(K_, seed=15), rnd(N, K_, seed=16), rnd(N, seed=17)
    _check_out_mode(_Run(lambda x, out: _down(h, w, x, out, split), x), N, w.float() @ h.float())


def test_moe_down_out_mode():
    w, ids, wts, h, x = _moe_inputs()
    ref = sum(bf16r(bf16r(w[e].float() @ h[j].float()) * wts[j]) for j, e in enumerate(ids.tolist()))
    _check_out_mode(_Run(lambda x, out: _moe_down(h, w, ids, wts, x, out), x), w.shape[1], ref)


# ---- two ranks simulated: column slices, partials summed in rank order ----------------
def _two_ranks(partial, x):
    """x after the unfused TP path: each rank's partial (``partial(r, out)``), the sum in
    rank order, residual_add."""
    ps = []
    for r in range(2):
        out = nan32(x.numel())
        partial(r, out)
        ps.append(out)
    xs = x.clone()
    K.tp_ops.residual_add(ps[0] + ps[1], xs)
    return xs


def test_two_rank_o_proj_and_down_match_one_gpu():
    N, K_ = 37, 300
    a, w, x = rnd(K_, seed=20), rnd(N, K_, seed=21), rnd(N, seed=22)
    c = [slice(0, 150), slice(150, 300)]              # what each rank holds of K
    one = _o_proj(a, w, x)
    two = _two_ranks(lambda r, out: _o_proj(a[c[r]].contiguous(), w[:, c[r]].contiguous(), x, out), x)
    assert rel(two, one) < TOL
    one = _down(a, w, x, split=3)
    two = _two_ranks(lambda r, out: _down(a[c[r]].contiguous(), w[:, c[r]].contiguous(), x, out,
                                          split=2), x)
    assert rel(two, one) < TOL


def test_two_rank_moe_down_matches_one_gpu():
    w, ids, wts, h, x = _moe_inputs(I=40)
    c = [slice(0, 20), slice(20, 40)]                 # each rank: half of every expert's I
    one = _moe_down(h, w, ids, wts, x)
    two = _two_ranks(lambda r, out: _moe_down(h[:, c[r]].contiguous(), w[:, :, c[r]].contiguous(),
                                              ids, wts, x, out), x)
    # each rank rounds its own expert outputs: a 2-way split is a different rounding
    # of the same sum, still within bf16 of the one-GPU answer
    assert rel(two, one) < 5 * TOL


# ---- the LM head split by vocabulary --------------------------------------------------
def _head_state(pos=4):
    return (torch.zeros(16, **I32), torch.tensor([pos], **I32), torch.full((16,), -1, **I32))


def _lm_head(x, g, w, seq, pos, prompt_len, argmax=None, **kw):
    V = w.shape[0]
    n = -(-V // CFG["BLOCK_N"])
    cnt = torch.zeros(1, **I32)
    lg = nan32(V)
    K.lm_head_argmax.lm_head_argmax(x, g, w, lg, torch.empty(n), torch.empty(n, **I32), cnt, seq, pos,
                     torch.tensor([prompt_len], **I32), 1e-6, cfg=CFG, argmax=argmax, **kw)
    assert int(cnt) == 0
    return lg


def _split_head(x, g, w, cut, prompt_len, pos=4):
    """Both ranks' keys (vocabulary [0, cut) and [cut, V)), summed, then argmax_merge."""
    keys = torch.zeros(4)
    for r, (lo, hi) in enumerate([(0, cut), (cut, w.shape[0])]):
        k = torch.full((4,), 7.0)                      # the kernel must zero the other slots
        seq, p, am = _head_state(pos)
        _lm_head(x, g, w[lo:hi].contiguous(), seq, p, prompt_len, am, keys=k, vocab_offset=lo,
                 rank=r, world=2)
        assert int(p) == pos and (seq == 0).all() and (am == -1).all(), "keys mode: no bookkeeping"
        assert k[2 * (1 - r):2 * (1 - r) + 2].abs().sum() == 0
        keys += k
    seq, p, am = _head_state(pos)
    K.tp_ops.argmax_merge(keys, seq, p, torch.tensor([prompt_len], **I32), 2, argmax=am)
    return keys, seq, p, am


def test_lm_head_keys_and_merge_give_one_gpus_token():
    V, K_ = 301, 96
    x, g, w = rnd(K_, seed=18), 1 + 0.1 * rnd(K_, seed=19), rnd(V, K_, seed=20)
    ref_logits, ref_tok = ref_lm_head(x, g, w, 1e-6)
    for prompt_len in (9, 1):                          # inside the prompt, then past it
        seq1, p1, am1 = _head_state()
        _lm_head(x, g, w, seq1, p1, prompt_len, am1)
        keys, seq, p, am = _split_head(x, g, w, 150, prompt_len)
        assert torch.equal(seq, seq1) and torch.equal(p, p1) and torch.equal(am, am1)
        assert int(am[5]) == ref_tok and int(p) == 5
        assert float(keys[2 * (ref_tok >= 150) + 1]) == ref_tok


def _tied_head(V, K_, rows):
    u = rnd(K_, seed=22)
    w = (-u.float()[None].repeat(V, 1)).to(bf)
    w[list(rows)] = u
    return w


@pytest.mark.parametrize("rows", [(40, 200), (149, 150), (210, 160)])
def test_lm_head_tie_across_ranks_takes_the_lower_index(rows):
    """The maximum is tied exactly between a row of each half (and, last case, within the
    second half): the merged token is the lowest global index, as on one GPU."""
    V, K_ = 301, 32
    w = _tied_head(V, K_, rows)
    x, g = rnd(K_, seed=21), torch.ones(K_, dtype=bf)
    seq1, p1, am1 = _head_state()
    _lm_head(x, g, w, seq1, p1, 0, am1)
    keys, seq, p, am = _split_head(x, g, w, 150, 0)
    assert int(seq[5]) == int(seq1[5]) == min(rows)
    assert float(keys[0]) == float(keys[2]) or 150 <= min(rows)


def test_argmax_merge_ties_and_order():
    """keys as the all-reduce leaves them, in any order of indices: the largest value, the
    lowest index among equal values (padding lanes of a world that is not a power of 2)."""
    for keys, world, tok in (([5.0, 7, 5.0, 3], 2, 3), ([5.0, 7, 6.0, 30], 2, 30),
                             ([-1.0, 9, 2.0, 4, 2.0, 1], 3, 1)):
        seq, p, am = _head_state(0)
        K.tp_ops.argmax_merge(torch.tensor(keys), seq, p, torch.tensor([0], **I32), world, argmax=am)
        assert int(seq[1]) == int(am[1]) == tok and int(p) == 1


# ---- OLMoE's q/k norm over heads split between ranks ----------------------------------
def _rope(qkv, Hq, Hkv, D, qn, kn, pos, **kw):
    C = 24
    cos, sin = rope_cos_sin(torch.arange(C), D, 1e4, bf)
    q = torch.full((Hq * D,), float("nan"), dtype=bf)
    kc, vc = torch.zeros(Hkv, C, D, dtype=bf), torch.zeros(Hkv, C, D, dtype=bf)
    K.rope_kv_write.rope_kv_write(qkv, q, kc, vc, cos, sin, torch.tensor([pos], **I32), Hq, Hkv, D,
                    q_norm=qn, k_norm=kn, eps=1e-5, **kw)
    return q, kc[:, pos], vc[:, pos]


def test_qk_sumsq_and_rope_with_ss():
    Hq = Hkv = 4
    D, pos = 32, 11
    qkv = rnd((Hq + 2 * Hkv) * D, seed=70)
    qn, kn = 1 + 0.1 * rnd(Hq * D, seed=71), 1 + 0.1 * rnd(Hkv * D, seed=72)
    one = _rope(qkv, Hq, Hkv, D, qn, kn, pos)
    # one rank: qk_sumsq sums as the kernel's own norm does, so the same bits
    ss = nan32(2)
    K.tp_ops.qk_sumsq(qkv, ss, Hq * D, Hkv * D)
    q, k = qkv[:Hq * D].float(), qkv[Hq * D:(Hq + Hkv) * D].float()
    assert torch.allclose(ss, torch.stack([(q * q).sum(), (k * k).sum()]), rtol=1e-5)
    same = _rope(qkv, Hq, Hkv, D, qn, kn, pos, ss=ss, q_total=Hq * D, k_total=Hkv * D)
    for a, b in zip(same, one):
        assert torch.equal(a, b)
    # two ranks, two heads of q, k and v each
    qkv3 = qkv.view(3, Hq, D)                          # q, k, v heads (Hq == Hkv here)
    h = [slice(0, 2), slice(2, 4)]
    local = [qkv3[:, h[r]].reshape(-1).contiguous() for r in range(2)]
    ss2 = []
    for r in range(2):
        s = nan32(2)
        K.tp_ops.qk_sumsq(local[r], s, 2 * D, 2 * D)
        ss2.append(s)
    ss_sum = ss2[0] + ss2[1]
    outs = [_rope(local[r], 2, 2, D, qn.view(Hq, D)[h[r]].reshape(-1).contiguous(),
                  kn.view(Hkv, D)[h[r]].reshape(-1).contiguous(), pos, ss=ss_sum,
                  q_total=Hq * D, k_total=Hkv * D) for r in range(2)]
    q2 = torch.cat([outs[0][0], outs[1][0]])
    k2 = torch.cat([outs[0][1], outs[1][1]])
    v2 = torch.cat([outs[0][2], outs[1][2]])
    assert rel(q2, one[0]) < TOL and rel(k2, one[1]) < TOL
    assert torch.equal(v2, one[2])
