"""The mixture-of-experts kernels against torch, and the MoE engine against the oracle
(Triton's interpreter on tiny-olmoe: 12 experts, top-4, awkward sizes)."""
import pytest
import torch
import torch.nn.functional as F

from onelaunch import kernels as K
from onelaunch.engine import Engine
from onelaunch.oracle import Oracle, rms_norm
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

SPEC = get_spec("tiny-olmoe")
BF = torch.bfloat16


def _router(x, g, w, top_k, eps=1e-5, cfg=None):
    E, H = w.shape
    xn = torch.empty(H, dtype=BF)
    logits = torch.empty(E, dtype=torch.float32)
    ids = torch.full((top_k,), -1, dtype=torch.int32)
    wts = torch.full((top_k,), -1.0)
    cnt = torch.zeros(1, dtype=torch.int32)
    pos = torch.tensor([3], dtype=torch.int32)
    log = torch.full((8, 2, top_k), -1, dtype=torch.int32)
    K.moe_router.moe_router(x, g, w, xn, logits, ids, wts, cnt, pos, eps, log=log, layer=1, cfg=cfg)
    assert int(cnt) == 0, "the counter is left zero for the next call"
    assert torch.equal(log[3, 1], ids) and (log[:3] == -1).all() and (log[3, 0] == -1).all()
    return xn, logits, ids, wts


def _router_ref(x, g, w, top_k, eps=1e-5):
    # the oracle's arithmetic: bf16 normalised x, bf16 logits, fp32 softmax, torch.topk
    xn = rms_norm(x[None], g, eps)                                          # [1, H] bf16
    logits = F.linear(xn, w)                                                # bf16
    p = torch.softmax(logits, dim=-1, dtype=torch.float32)
    tw, ti = torch.sort(p, dim=-1, descending=True, stable=True)       # the oracle's top-k
    return xn[0], logits[0], ti[0, :top_k], tw[0, :top_k].to(BF)


@pytest.mark.parametrize("E,H,top_k,block_n", [(12, 80, 4, 8), (64, 200, 8, 4), (7, 33, 3, 16)])
def test_router_matches_torch(E, H, top_k, block_n):
    g = torch.Generator().manual_seed(E + H)
    x = torch.randn(H, generator=g).to(BF)
    gain = (1 + 0.1 * torch.randn(H, generator=g)).to(BF)
    w = (torch.randn(E, H, generator=g) / H ** 0.5).to(BF)
    cfg = dict(BLOCK_N=block_n, BLOCK_K=128, num_warps=4)
    xn, logits, ids, wts = _router(x, gain, w, top_k, cfg=cfg)
    xn_r, lg_r, ids_r, wts_r = _router_ref(x, gain, w, top_k)
    assert torch.equal(xn, xn_r)
    assert torch.allclose(logits, lg_r.float(), rtol=0, atol=2 ** -6 * lg_r.abs().max().item())
    # softmax and top-k: exactly torch's on the kernel's own (bf16) logits; the GEMV's
    # summation order may move a logit by an ulp, which can swap two near-equal experts
    tw, ti = torch.sort(torch.softmax(logits, dim=-1), descending=True, stable=True)
    assert ids.tolist() == ti[:top_k].tolist()
    assert torch.allclose(wts, tw[:top_k].to(BF).float(), rtol=2 ** -8, atol=0)


def test_router_ties_go_to_the_lower_expert():
    """Experts 2, 5 and 9 have the same router row, so the same probability: the top-k
    takes them lowest index first, as the oracle's stable sort does (torch.topk leaves the
    order of ties unspecified)."""
    E, H, top_k = 12, 80, 4
    g = torch.Generator().manual_seed(3)
    x = torch.randn(H, generator=g).to(BF)
    gain = torch.ones(H, dtype=BF)
    w = (0.01 * torch.randn(E, H, generator=g)).to(BF)
    big = (torch.randn(H, generator=g) / H ** 0.5).to(BF)
    if float(F.linear(rms_norm(x[None], gain, 1e-5), big[None])) < 0:
        big = -big                                    # make the tied experts the most probable
    for e in (9, 5, 2):
        w[e] = big
    _, _, ids, wts = _router(x, gain, w, top_k)
    _, _, ids_r, _ = _router_ref(x, gain, w, top_k)
    assert ids[:3].tolist() == [2, 5, 9] == ids_r[:3].tolist()
    assert wts[0] == wts[1] == wts[2]


def _experts(H=80, I=48, E=12, top_k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    gu = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(BF)
    dn = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(BF)
    ids = torch.randperm(E, generator=g)[:top_k].to(torch.int32)
    wts = torch.softmax(torch.randn(top_k, generator=g), 0).to(BF).float()
    xn = torch.randn(H, generator=g).to(BF)
    x = torch.randn(H, generator=g).to(BF)
    return gu, dn, ids, wts, xn, x


def test_expert_gate_up_reads_the_chosen_experts():
    gu, dn, ids, wts, xn, x = _experts()
    top_k, I = ids.numel(), dn.shape[2]
    h = torch.full((top_k, I), float("nan"), dtype=BF)
    K.moe_experts.moe_gate_up_swiglu(xn, gu, ids, h, cfg=dict(BLOCK_N=16, BLOCK_K=32, num_warps=4))
    ref = torch.einsum("koh,h->ko", gu[ids.long()], xn)                  # [k, 2I] bf16, as the oracle
    gate, up = ref.chunk(2, dim=-1)
    want = F.silu(gate) * up
    # fp32 sums in another order: a bf16 ulp at most, per element
    assert ((h.float() - want.float()).abs() <= 2 ** -7 * want.float().abs() + 1e-30).all()
    assert not torch.isnan(h).any()


@pytest.mark.parametrize("block_n", [8, 64])
def test_expert_down_weights_and_residual(block_n):
    gu, dn, ids, wts, xn, x = _experts(seed=1)
    top_k, H, I = ids.numel(), dn.shape[1], dn.shape[2]
    h = torch.randn(top_k, I, generator=torch.Generator().manual_seed(2)).to(BF)
    scratch = torch.zeros(top_k * H)
    cnt = torch.zeros(H, dtype=torch.int32)
    out = x.clone()
    K.moe_experts.moe_down_residual(h, dn, ids, wts, out, scratch, cnt,
                        cfg=dict(BLOCK_N=block_n, BLOCK_K=32, num_warps=4))
    y = torch.einsum("khi,ki->kh", dn[ids.long()], h)                    # bf16 per expert
    ref = x + (y * wts.to(BF)[:, None]).sum(0)                           # the oracle's order
    assert (cnt == 0).all()
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= 2 ** -7 * ref.float().abs().max().item(), err        # a bf16 ulp or so
    # a different expert id must change the answer (the id is really read)
    ids2 = ids.clone()
    ids2[0] = (int(ids[0]) + 1) % dn.shape[0]
    out2 = x.clone()
    K.moe_experts.moe_down_residual(h, dn, ids2, wts, out2, scratch, cnt,
                        cfg=dict(BLOCK_N=block_n, BLOCK_K=32, num_warps=4))
    assert not torch.equal(out2, out)


def test_moe_engine_matches_the_oracle_and_logs_its_experts():
    # tiny-olmoe's bf16 logits (scale ~8, an ulp of 0.03-0.06) tie often; with this prompt
    # the oracle's top two differ by at least 0.19 at every step, so any flip is a bug
    w = random_weights(SPEC, 0)
    prompt = torch.randint(0, SPEC.vocab, (5,), generator=torch.Generator().manual_seed(9))
    ref = Oracle(SPEC, w, max_ctx=32).generate(prompt, 4).cpu()
    e = Engine(SPEC, w, max_ctx=32)
    got = e.generate(prompt, 4, graph=False)
    assert got.tolist() == ref.tolist()
    # (teacher-forced along these same tokens would replay these very steps: the
    # teacher-forced path is checked in test_engine.py, and per rung by the ladder)
    n = e.distinct_experts(0, prompt.numel() + 3)
    assert len(n) == SPEC.layers and all(SPEC.top_k <= k <= SPEC.experts for k in n)


def test_rope_with_qk_norm_matches_the_oracle():
    """OLMoE's q/k RMSNorm over all heads, folded into the RoPE kernel."""
    from onelaunch.oracle import apply_rope, rope_cos_sin
    s = SPEC
    g = torch.Generator().manual_seed(4)
    qkv = (3 * torch.randn(s.qkv_size, generator=g)).to(BF)
    qn = (1 + 0.1 * torch.randn(s.q_size, generator=g)).to(BF)
    kn = (1 + 0.1 * torch.randn(s.kv_size, generator=g)).to(BF)
    C, pos = 16, 11
    kc = torch.zeros(s.kv_heads, C, s.head_dim, dtype=BF)
    vc = torch.zeros_like(kc)
    cos, sin = rope_cos_sin(torch.arange(C), s.head_dim, s.rope_theta, BF)
    q = torch.empty(s.q_size, dtype=BF)
    K.rope_kv_write.rope_kv_write(qkv, q, kc, vc, cos, sin, torch.tensor([pos], dtype=torch.int32), s.heads,
                    s.kv_heads, s.head_dim, q_norm=qn, k_norm=kn, eps=s.rms_eps)
    q_ref = rms_norm(qkv[None, :s.q_size], qn, s.rms_eps).view(1, s.heads, s.head_dim)
    k_ref = rms_norm(qkv[None, s.q_size:s.q_size + s.kv_size], kn, s.rms_eps).view(1, s.kv_heads, s.head_dim)
    c, si = cos[pos:pos + 1], sin[pos:pos + 1]
    assert torch.equal(q, apply_rope(q_ref, c, si).flatten())
    assert torch.equal(kc[:, pos], apply_rope(k_ref, c, si)[0])
    assert torch.equal(vc[:, pos], qkv[s.q_size + s.kv_size:].view(s.kv_heads, s.head_dim))
    # the norm really is over all heads: a change in head 0 moves every head's output
    qkv2 = qkv.clone()
    qkv2[0] += 8
    q2 = torch.empty_like(q)
    K.rope_kv_write.rope_kv_write(qkv2, q2, kc, vc, cos, sin, torch.tensor([pos], dtype=torch.int32), s.heads,
                    s.kv_heads, s.head_dim, q_norm=qn, k_norm=kn, eps=s.rms_eps)
    assert not torch.equal(q2[-s.head_dim:], q[-s.head_dim:])
