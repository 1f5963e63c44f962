"""The fused TP rung on the CPU: two processes, one per rank, each running the kernels in
Triton's interpreter, exchanging through ``PeerBuffers`` whose tensors live in shared
memory (the interpreter reads and writes CPU tensors in place, so one rank's spin loop sees
the other's stores). Each rank holds a column slice of the weights (a vocabulary slice of
the LM head, half the heads' q/k), and every rank must end with the same bits as the
unfused path (partials from ``out=`` summed in rank order, ``residual_add``; keys summed
and ``argmax_merge``) computed here in the parent.

A bug that deadlocks the exchange must not hang the suite: the ranks are joined with a
timeout, then terminated, and the test fails.
"""
import io
import traceback

import pytest
import torch
import torch.multiprocessing as mp
from queue import Empty as queue_empty

from onelaunch import kernels as K

bf = torch.bfloat16
I32 = dict(dtype=torch.int32)
CFG = dict(BLOCK_N=16, BLOCK_K=64, num_warps=4)
DOWN = dict(CFG, SPLIT_K=2)
MOE = dict(BLOCK_N=8, BLOCK_K=32, num_warps=4)
N, KO, KD, V, H_K = 37, 150, 300, 301, 32
SITES, N_MAX, TILES = 8, 64, 8
TIMEOUT = 240


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(bf)


def inputs():
    """Everything both ranks and the reference use (seeded: the same in every process)."""
    u = rnd(H_K, seed=22)
    w_head = (-u.float()[None].repeat(V, 1)).to(bf)
    w_head[[140, 150, 230]] = u                        # the maximum tied across the halves
    return dict(a=rnd(KO, seed=1), w_o=rnd(N, KO, seed=2), x=rnd(N, seed=3),
                h=rnd(KD, seed=4), w_d=rnd(N, KD, seed=5),
                w_m=rnd(6, N, 40, seed=6), h_m=rnd(3, 40, seed=7),
                ids=torch.tensor([4, 1, 5], **I32), wts=torch.tensor([0.5, 0.3125, 0.1875]),
                xh=rnd(H_K, seed=8), g=torch.ones(H_K, dtype=bf), w_head=w_head,
                w_head2=rnd(V, H_K, seed=9), qkv=rnd(12 * 16, seed=10),
                p=[torch.randn(N, generator=torch.Generator().manual_seed(11 + r)) for r in range(2)])


def cols(r, n):
    return slice(0, n // 2) if r == 0 else slice(n // 2, n)


def local_qkv(qkv, r):
    """Rank r's q, k, v heads (2 of 4 each, D = 16)."""
    return qkv.view(3, 4, 16)[:, 2 * r:2 * r + 2].reshape(-1).contiguous()


def _head(x, g, w, offset, state, **kw):
    seq, pos, am = state
    n = -(-w.shape[0] // CFG["BLOCK_N"])
    K.lm_head_argmax.lm_head_argmax(x, g, w, torch.empty(w.shape[0]), torch.empty(n), torch.empty(n, **I32),
                     torch.zeros(1, **I32), seq, pos, torch.tensor([0], **I32), 1e-6, cfg=CFG,
                     argmax=am, vocab_offset=offset, **kw)


def head_state():
    return torch.zeros(8, **I32), torch.tensor([2], **I32), torch.full((8,), -1, **I32)


def _o_proj(d, r, x, **kw):
    K.o_proj_residual.o_proj_residual(d["a"][cols(r, KO)].contiguous(), d["w_o"][:, cols(r, KO)].contiguous(), x,
                      cfg=CFG, **kw)


def _down(d, r, x, **kw):
    K.down_residual.down_residual(d["h"][cols(r, KD)].contiguous(), d["w_d"][:, cols(r, KD)].contiguous(), x,
                    torch.empty(2 * N), torch.zeros(N, **I32), cfg=DOWN, **kw)


def _moe(d, r, x, **kw):
    K.moe_experts.moe_down_residual(d["h_m"][:, cols(r, 40)].contiguous(), d["w_m"][:, :, cols(r, 40)].contiguous(),
                        d["ids"], d["wts"], x, torch.empty(3 * N), torch.zeros(N, **I32), cfg=MOE, **kw)


def _head_slice(w, r):
    lo, hi = (0, 150) if r == 0 else (150, V)
    return w[lo:hi].contiguous(), lo


HEADS = ("head_tie", "w_head"), ("head", "w_head2")


def fused(r, d, site):
    """Rank r's part of every case through the peer sites: what it ends with."""
    res = {}
    x = d["x"].clone()
    for step in range(2):          # twice: the second exchange uses the other half of the slots
        _o_proj(d, r, x, peer=site(0))
        res[f"o_proj{step}"] = x.clone()
    for name, fn, i in (("down", _down, 1), ("moe_down", _moe, 2)):
        x = d["x"].clone()
        fn(d, r, x, peer=site(i))
        res[name] = x
    for name, key in HEADS:
        st = head_state()
        w, lo = _head_slice(d[key], r)
        _head(d["xh"], d["g"], w, lo, st, peer=site(3))
        res[name] = st
    ss = torch.full((2,), float("nan"))
    K.tp_ops.qk_sumsq(local_qkv(d["qkv"], r), ss, 32, 32, peer=site(4))
    res["ss"] = ss
    x = d["x"].clone()
    K.tp_ops.allreduce_residual(d["p"][r], x, site(5))
    res["allreduce"] = x
    return res


def unfused():
    """The reference: both ranks' partials (out=, keys=), summed in rank order (what an
    all-reduce gives), finished by residual_add / argmax_merge."""
    d = inputs()

    def summed(fn, x):
        ps = []
        for r in range(2):
            p = torch.full((N,), float("nan"))
            fn(d, r, x.clone(), out=p)
            ps.append(p)
        x = x.clone()
        K.tp_ops.residual_add(ps[0] + ps[1], x)
        return x
    ref = {}
    x = d["x"]
    for step in range(2):
        x = ref[f"o_proj{step}"] = summed(_o_proj, x)
    ref["down"] = summed(_down, d["x"])
    ref["moe_down"] = summed(_moe, d["x"])
    for name, key in HEADS:
        keys = []
        for r in range(2):
            k = torch.zeros(4)
            w, lo = _head_slice(d[key], r)
            _head(d["xh"], d["g"], w, lo, head_state(), keys=k, rank=r, world=2)
            keys.append(k)
        st = head_state()
        K.tp_ops.argmax_merge(keys[0] + keys[1], st[0], st[1], torch.tensor([0], **I32), 2, argmax=st[2])
        ref[name] = st
    ss = []
    for r in range(2):
        s = torch.full((2,), float("nan"))
        K.tp_ops.qk_sumsq(local_qkv(d["qkv"], r), s, 32, 32)
        ss.append(s)
    ref["ss"] = ss[0] + ss[1]
    x = d["x"].clone()
    K.tp_ops.residual_add(d["p"][0] + d["p"][1], x)
    ref["allreduce"] = ref["after_reset"] = x
    return ref


def _rank_main(r, bufs, barrier, queue):
    try:
        slots, flags, seqnos = bufs
        pb = K.peer.PeerBuffers.from_tensors(r, 2, slots, flags, seqnos[r])
        d = inputs()
        res = fused(r, d, pb.site)
        seqno = pb.seqno.clone()
        # a reset (every rank, between barriers) and a replay: the same answer
        barrier.wait(60)
        pb.reset()
        barrier.wait(60)
        x = d["x"].clone()
        K.tp_ops.allreduce_residual(d["p"][r], x, pb.site(5))
        res["after_reset"] = x
        res = {"results": res, "seqno": seqno}
        buf = io.BytesIO()          # bytes, not tensors: shared tensors die with this process
        torch.save(res, buf)
        queue.put((r, buf.getvalue(), None))
    except Exception:
        queue.put((r, None, traceback.format_exc()))


def test_peer_kernels_two_processes_match_unfused():
    ctx = mp.get_context("spawn")
    bufs = K.peer.PeerBuffers.alloc_shared(2, SITES, N_MAX, TILES)
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, bufs, barrier, queue), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    got, seqnos = {}, {}
    try:
        for _ in range(2):
            r, res, err = queue.get(timeout=TIMEOUT)
            assert err is None, f"rank {r} failed:\n{err}"
            got[r] = torch.load(io.BytesIO(res))["results"]
            seqnos[r] = torch.load(io.BytesIO(res))["seqno"]
    except queue_empty as e:        # a timeout: an exchange that never completed
        pytest.fail(f"the ranks did not finish in {TIMEOUT} s ({e!r}); flags: {bufs[1]}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    ref = unfused()
    assert set(got[0]) == set(got[1]) == set(ref)
    for name, want in ref.items():
        for r in range(2):
            a = got[r][name]
            if isinstance(want, tuple):     # the LM head's (seq, pos, argmax)
                for u, v in zip(a, want):
                    assert torch.equal(u, v), (name, r, a, want)
            else:
                assert torch.equal(a, want), (name, r)
    # the tie across the halves went to the lowest index, and the bookkeeping happened
    assert int(got[0]["head_tie"][0][3]) == int(got[0]["head_tie"][2][3]) == 140
    assert int(got[1]["head_tie"][1]) == 3
    # the exchange numbers: o_proj's 3 tiles twice, the others once; after the reset, one
    # allreduce (the flags and numbers were zeroed: it waited on the new flag 1, not an old 1)
    for r in range(2):
        assert seqnos[r][0, :4].tolist() == [2, 2, 2, 0]
        assert seqnos[r][1:6, 0].tolist() == [1, 1, 2, 1, 1]   # the LM head site: twice
        assert bufs[2][r][5, :2].tolist() == [1, 0] and bufs[2][r][0].abs().sum() == 0
