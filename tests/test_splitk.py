"""Split-K flash-decode attention at the boundaries of its chunks, in the interpreter.

One fixed launch (splits sized for the maximum context) must be right at every length:
1, a chunk minus one, a chunk, a chunk plus one, several multiples plus and minus one, and
the maximum. Each chunk's keys and values differ, so a tile that read into its
neighbour's chunk would count those tokens twice and miss the reference.
"""
import pytest
import torch

from onelaunch import kernels as K
from onelaunch.kernels import attention_splitk as AS

from test_kernels import ref_attention as attention_ref, rel, rnd

Hq, Hkv, D = 6, 2, 16
CHUNK, MAX = 16, 70            # 5 splits; the last one is ragged
LENGTHS = sorted({1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 1,
                  3 * CHUNK + 1, 4 * CHUNK - 1, MAX})
TOL = 1e-2


def setup():
    q = rnd(Hq * D, seed=1)
    kc, vc = rnd(Hkv, MAX, D, seed=2), rnd(Hkv, MAX, D, seed=3)
    # make chunks distinguishable: a different offset per chunk
    off = torch.arange(MAX).div(CHUNK, rounding_mode="floor").float()[None, :, None]
    vc = (vc.float() + off).to(torch.bfloat16)
    ns = K.attention_splitk.n_splits_for(MAX, CHUNK)
    po = torch.full((Hq, ns, D), float("nan"))
    pm = torch.full((Hq, ns), float("nan"))
    pl = torch.full((Hq, ns), float("nan"))
    return q, kc, vc, po, pm, pl


@pytest.mark.parametrize("length", LENGTHS)
def test_splitk_lengths(length):
    q, kc, vc, po, pm, pl = setup()
    out = torch.full((Hq * D,), float("nan"), dtype=torch.bfloat16)
    K.attention_splitk.attention_splitk(q, kc, vc, out, torch.tensor([length - 1], dtype=torch.int32), po, pm, pl,
                       Hq, Hkv, D, CHUNK, dict(BLOCK_T=8, num_warps=4))
    assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL


def test_same_buffers_serve_every_length():
    """One set of partial buffers, lengths going down and up: stale partials from a longer
    call must not leak into a shorter one (the reduce reads only the valid splits)."""
    q, kc, vc, po, pm, pl = setup()
    for length in (MAX, 5, 2 * CHUNK + 1, CHUNK):
        out = torch.empty(Hq * D, dtype=torch.bfloat16)
        K.attention_splitk.attention_splitk(q, kc, vc, out, torch.tensor([length - 1], dtype=torch.int32), po, pm,
                           pl, Hq, Hkv, D, CHUNK, dict(BLOCK_T=16, num_warps=4))
        assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL, length


@pytest.mark.parametrize("length", [CHUNK + 1, 2 * CHUNK + 3, MAX])
def test_tile_wider_than_chunk_does_not_double_count(length):
    """Launch the partial kernel directly with a tile twice the chunk (the launcher
    refuses this). Each split must still stop at its own chunk's end."""
    q, kc, vc, po, pm, pl = setup()
    ns = pm.shape[1]
    pos = torch.tensor([length - 1], dtype=torch.int32)
    AS._attention_partial_kernel[(Hkv, ns)](
        q, kc, vc, po, pm, pl, pos, kc.stride(0), kc.stride(1), ns, ns, D ** -0.5, GROUP=Hq // Hkv,
        GROUP_PAD=16, D=D, BLOCK_D=16, CHUNK=CHUNK, BLOCK_T=2 * CHUNK, DOT_F32=True, USE_PDL=False)
    out = torch.empty(Hq * D, dtype=torch.bfloat16)
    AS._attention_reduce_kernel[(Hq,)](po, pm, pl, out, pos, ns, ns, D=D, BLOCK_D=16, CHUNK=CHUNK,
                                  BLOCK_S=4, BLOCK_M=8, USE_PDL=False)
    assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL


def test_launcher_refuses_a_tile_that_straddles_chunks():
    q, kc, vc, po, pm, pl = setup()
    with pytest.raises(AssertionError):
        K.attention_splitk.attention_splitk(q, kc, vc, torch.empty(Hq * D, dtype=torch.bfloat16),
                           torch.tensor([3], dtype=torch.int32), po, pm, pl, Hq, Hkv, D, 24,
                           dict(BLOCK_T=16, num_warps=4))


def test_chunk_for_bounds_the_split_count():
    for c in (128, 2048, 4096, 33280, 131072):
        ch = K.attention_splitk.chunk_for(c)
        assert K.attention_splitk.n_splits_for(c, ch) <= 256 and ch >= 64


# ---- the live length shared out over a fixed grid; the newest token after the wait --------
# A grid of NS splits whatever the length: at run time each live split takes
# ceil(units / NS) units of U positions (tiles of BT), so with NS = 3 and 9 units a split
# holds up to 3 units (6 tiles), and the split that holds pos starts anywhere in a unit.
U, BT, NS = 8, 4, 3
PAST = [1, 2, BT - 1, BT, BT + 1, U - 1, U, U + 1, 2 * U, 2 * U + 1, 3 * U, 3 * U + 1,
        4 * U + BT, 4 * U + BT + 1, 6 * U + 1, 7 * U - 1, MAX - 1, MAX]


def grid_state(ns, length=None, seed=0):
    """q, caches with a per-unit offset on v (a tile read twice or missed shows), and NaN
    partials for a grid of ``ns`` splits."""
    q = rnd(Hq * D, seed=seed + 1)
    kc, vc = rnd(Hkv, MAX, D, seed=seed + 2), rnd(Hkv, MAX, D, seed=seed + 3)
    off = torch.arange(MAX).div(U, rounding_mode="floor").float()[None, :, None]
    vc = (vc.float() + off).to(torch.bfloat16)
    nan = lambda *s: torch.full(s, float("nan"))
    return q, kc, vc, nan(Hq, ns, D), nan(Hq, ns), nan(Hq, ns)


def run_grid(ns, length, block_t=BT, live_cap=None, **kw):
    q, kc, vc, po, pm, pl = grid_state(ns, **kw)
    out = torch.full((Hq * D,), float("nan"), dtype=torch.bfloat16)
    K.attention_splitk.attention_splitk(q, kc, vc, out, torch.tensor([length - 1], dtype=torch.int32), po, pm, pl,
                       Hq, Hkv, D, U, dict(BLOCK_T=block_t, num_warps=4), live_cap=live_cap)
    return out, (po, pm, pl), (q, kc, vc)


@pytest.mark.parametrize("length", [1, 2 * U, 2 * U + 1, 5 * U + 1, MAX])
def test_a_cap_on_live_splits_makes_them_longer_not_more(length):
    """With the live splits capped at 2 a kv head, a grid of NS splits shares the length
    out over at most 2 (each holding more units): right against the reference, exactly
    those written; below the cap the same bits as without it."""
    out, (po, pm, pl), (q, kc, vc) = run_grid(NS, length, live_cap=2)
    assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL
    n_live = AS.live_splits_host(length, U, AS.live_share(NS, 2))
    assert n_live == min(2, -(-length // U))
    assert not pm[:, :n_live].isnan().any() and pm[:, n_live:].isnan().all()
    if length <= 2 * U:
        free, _, _ = run_grid(NS, length)
        assert torch.equal(out.view(torch.int16), free.view(torch.int16))
    assert AS.live_share(NS, None) == NS and AS.live_share(NS, 10 ** 6) == NS


@pytest.mark.parametrize("length", PAST)
def test_live_length_over_a_small_grid(length):
    """pos at a tile's first and last slot, a unit's, in the first and the last split,
    length 1 and the whole cache: against the fp32 reference; exactly the live splits
    (the host's count) are written, the others are left as they were (NaN)."""
    out, (po, pm, pl), (q, kc, vc) = run_grid(NS, length)
    assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL
    n_live = AS.live_splits_host(length, U, NS)
    units = -(-length // U)
    assert n_live == -(-units // -(-units // NS)) and 1 <= n_live <= NS
    assert not pm[:, :n_live].isnan().any() and pm[:, n_live:].isnan().all()
    assert not po[:, :n_live].isnan().any() and po[:, n_live:].isnan().all()


@pytest.mark.parametrize("length", [1, U, U + 1, 3 * U, 3 * U + 1, MAX])
def test_one_unit_per_split_is_independent_of_the_grid(length):
    """Engines of different max_ctx differ only in their grid. While units <= splits each
    live split holds one unit, so grids of 9 and 20 splits do the same work in the same
    order: the same bits. A grid of 3 splits shares the same length out differently past
    3 units (the same bits up to there, else within rounding)."""
    a, pa, _ = run_grid(9, length)
    b, pb, (q, kc, vc) = run_grid(20, length)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    n = AS.live_splits_host(length, U, 9)
    assert n == AS.live_splits_host(length, U, 20)
    for x, y in zip(pa, pb):
        assert torch.equal(x[:, :n], y[:, :n])
    c, _, _ = run_grid(NS, length)
    if -(-length // U) <= NS:
        assert torch.equal(a.view(torch.int16), c.view(torch.int16))
    else:
        assert rel(c, a) < TOL and rel(c, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL


def poisoned_until_the_wait(monkeypatch, module, kc, vc, length, before):
    """Programmatic dependent launch, emulated in the interpreter: every program of the
    kernel starts with what the previous kernel writes still unwritten (NaN: the tensors
    ``before`` and, unless ``kc`` is None, the keys and values at slot pos), and its wait
    writes them. A program that read any of it before its wait gets NaN."""
    pos = length - 1
    if kc is None:                            # the kernel writes slot pos itself
        kc, vc, pos = torch.zeros(1, 1), torch.zeros(1, 1), 0
    real_k, real_v = kc[:, pos].clone(), vc[:, pos].clone()
    state = [t.clone() for t in before]
    split_range, nan = module.split_range, float("nan")

    def program_start(*a, **k):               # the first thing every program does after pos
        for t in before:
            t.fill_(nan)
        kc[:, pos], vc[:, pos] = nan, nan
        return split_range(*a, **k)

    def wait(*a, **k):
        for t, s in zip(before, state):
            t.copy_(s)
        kc[:, pos], vc[:, pos] = real_k, real_v

    monkeypatch.setattr(module, "split_range", program_start)
    monkeypatch.setattr(module, "pdl_wait", wait)


@pytest.mark.parametrize("ns,length", [(NS, n) for n in (1, BT, BT + 1, U + 1, 3 * U + 1, MAX)]
                         + [(9, n) for n in (1, U, U + 1, MAX)])
def test_partial_reads_only_old_keys_before_its_wait(monkeypatch, ns, length):
    """q and slot pos are read after the wait; pos and keys, values older than pos may be
    read before it. Same bits as the run without the emulation."""
    want, parts_want, _ = run_grid(ns, length)
    q, kc, vc, po, pm, pl = grid_state(ns)
    p = torch.tensor([length - 1], dtype=torch.int32)
    with monkeypatch.context() as m:
        poisoned_until_the_wait(m, AS, kc, vc, length, [q])
        K.attention_splitk.attention_partial(q, kc, vc, p, po, pm, pl, Hq, Hkv, D, U, dict(BLOCK_T=BT, num_warps=4))
    out = torch.full((Hq * D,), float("nan"), dtype=torch.bfloat16)
    K.attention_splitk.attention_reduce(po, pm, pl, out, p, D, U)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    n = AS.live_splits_host(length, U, ns)
    for x, y in zip((po, pm, pl), parts_want):
        assert torch.equal(x[:, :n], y[:, :n])


def test_split_count_as_before():
    """The grid per kv head is what max_ctx gave before the live length was shared out
    (at most MAX_SPLITS, a power-of-two number of units each at max_ctx): Qwen's default
    engine keeps its 130 splits, so at ctx 32768 each split reads the same 256 positions."""
    assert K.attention_splitk.chunk_for(1024) == K.attention_splitk.chunk_for(33280) == 64
    assert K.attention_splitk.n_splits_for(1024, 64) == 16 and K.attention_splitk.n_splits_for(33280, 64) == 130
    assert K.attention_splitk.n_splits_for(16384, 64) == 256 and K.attention_splitk.n_splits_for(16385, 64) == 129
    assert AS.live_splits_host(513, 64, 16) == AS.live_splits_host(513, 64, 130) == 9
    assert AS.live_splits_host(32769, 64, 130) == 129                   # 128 x 256 + 1


def test_engines_of_different_max_ctx_step_alike(monkeypatch):
    """Whole steps of tiny-qwen2 engines that differ only in max_ctx (so in their grid of
    splits), from the same cache at positions in the first unit, on a unit's first and
    last slot and past the grid of the sharing-out engine below. With a unit of 4 positions the
    engines built for 64 and 256 positions have 16 and 64 splits: each live split holds
    one unit in both, so every step is bit-identical (the attention output, the logits).
    With at most 2 splits the same lengths are shared out differently: the logits agree
    within rounding."""
    from onelaunch.engine import Engine
    from onelaunch.specs import get_spec
    from onelaunch.weights import random_weights
    spec = get_spec("tiny-qwen2")
    w = random_weights(spec, 0)
    ids = torch.randint(0, spec.vocab, (16,), generator=torch.Generator().manual_seed(3))
    shape = (spec.layers, spec.kv_heads, 16, spec.head_dim)
    kc, vc = rnd(*shape, seed=4), rnd(*shape, seed=5)
    monkeypatch.setattr(K.attention_splitk, "chunk_for", lambda max_ctx: 4)

    def steps(max_ctx):
        e = Engine(spec, w, max_ctx=max_ctx, attention="splitk")
        assert e.partials()[0].shape[1] == K.attention_splitk.n_splits_for(max_ctx, 4)
        outs = []
        for pos in (0, 4, 7, 12):                        # lengths 1, 5, 8, 13: 1 to 4 units
            e.adopt_cache(kc, vc, pos, ids[: pos + 1])
            e.step(graph=False)
            outs.append((e.attn.clone(), e.logits.clone()))
        return outs

    small, big = steps(64), steps(256)
    for (a1, l1), (a2, l2) in zip(small, big):
        assert torch.equal(a1.view(torch.int16), a2.view(torch.int16))
        assert torch.equal(l1, l2)
    monkeypatch.setattr(AS, "MAX_SPLITS", 2)
    for (a1, l1), (a2, l2) in zip(small, steps(256)):
        assert rel(a2, a1) < TOL and rel(l2, l1) < TOL


def test_maxctx_bench_checks_each_engine_then_times_it(monkeypatch):
    """``bench --what maxctx`` (``sweeps.maxctx_rows``) on tiny-qwen2: an engine for 32 positions and one for the
    model's 256, each checked against the oracle at ctx 9 before it is timed (the timing
    stubbed here), the same tokens and logits bit for bit, and the ratio of the times."""
    from onelaunch.measure import agree, sweeps
    from onelaunch.specs import get_spec
    from onelaunch.weights import random_weights
    w = random_weights("tiny-qwen2", 0)
    timed = []
    monkeypatch.setattr(sweeps, "time_engine_step",
                        lambda e, *a, **k: timed.append(e.max_ctx) or 1.0 + e.max_ctx / 1000)
    rows = sweeps.maxctx_rows(get_spec("tiny-qwen2"), w, "cpu", ctx=9, max_ctxs=(32, None),
                              iters=2, check_tokens=2)
    small, big, summary = rows
    assert timed == [32, 256]
    assert (small["max_ctx"], big["max_ctx"]) == (32, 256) and small["agree"] == big["agree"] == "2/2"
    assert big["same_as_first"] is True and small["live_splits"] == big["live_splits"] == 1
    assert summary["ratio"] == pytest.approx(1.256 / 1.032)
    assert not agree.failures(rows)
