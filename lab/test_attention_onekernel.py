"""The one-kernel attention (RoPE + KV write + split-K partial + last-arrival merge) against
the three launches it replaces: ``rope_kv_write`` then ``attention_splitk``.

The one kernel rounds at the same points and sums in the same order, so the comparison is
bit for bit: ``out``, both caches and the valid partials must be identical, not merely
close. As in test_splitk.py, one fixed launch (splits sized for the maximum context) must
be right at every length: 1, a chunk minus one, a chunk, a chunk plus one, several
multiples plus and minus one, and the maximum; and the arrival counter must be left zero,
so the next call (the next layer, the next step) can use it.

Runs in Triton's interpreter on the CPU; on a GPU host the same tests compile the
kernels and check the same identities there. A lab check (the kernel is
``lab/attention_onekernel.py``), outside the CPU suite:

    python -m pytest lab/test_attention_onekernel.py
"""
import importlib

import pytest
import torch

from onelaunch import kernels as K
from onelaunch.oracle import rope_cos_sin

from test_kernels import ref_attention as attention_ref, rel, rnd

AO = importlib.import_module("attention_onekernel")      # lab/, on the path (conftest)
AS = importlib.import_module("onelaunch.kernels.attention_splitk")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
bf = torch.bfloat16
Hq, Hkv, D = 6, 2, 16          # tiny-qwen2-like: GROUP = 3, padded to 16 rows
MAX = 70                       # the cache; the last split is ragged
LAYERS, LAYER = 2, 1           # caches are one layer of [layers, Hkv, C, D], as in the engine
# (chunk, BLOCK_T): one tile a chunk, two tiles a chunk, and a single split. BLOCK_T = 8
# runs in the interpreter only: a GPU's tl.dot needs K >= 16 (here p @ v over the tile).
CASES = [(16, 16), (32, 16), (128, 64)] + ([(8, 8), (16, 8)] if DEV == "cpu" else [])


def lengths_for(chunk):
    top = (MAX // chunk) * chunk
    ls = {1, chunk - 1, chunk, chunk + 1, 2 * chunk - 1, 2 * chunk, 2 * chunk + 1,
          3 * chunk + 1, 4 * chunk - 1, top - 1, top, top + 1, MAX - 1, MAX}
    return sorted(length for length in ls if 1 <= length <= MAX)


PARAMS = [(c, bt, length) for c, bt in CASES for length in lengths_for(c)]


def same_bits(a, b):
    """Bit-identical (NaNs included); bf16 and fp32 compared as integers."""
    as_int = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.view(as_int), b.view(as_int))


def make_state(chunk, seed=0, cap=MAX):
    """qkv before RoPE, the RoPE tables, and a cache full of random values: the slot at pos
    holds garbage until a kernel writes it. Each chunk's values get their own offset, so a
    tile that strayed into a neighbour's chunk would change the result."""
    qkv = rnd((Hq + 2 * Hkv) * D, seed=seed + 1).to(DEV)
    kc = rnd(LAYERS, Hkv, cap, D, seed=seed + 2)
    vc = rnd(LAYERS, Hkv, cap, D, seed=seed + 3)
    off = torch.arange(cap).div(chunk, rounding_mode="floor").float()[None, None, :, None]
    vc = (vc.float() + off).to(bf)
    cos, sin = rope_cos_sin(torch.arange(cap), D, 1e6, bf)
    return qkv, kc.to(DEV), vc.to(DEV), cos.contiguous().to(DEV), sin.contiguous().to(DEV)


def partials(chunk, cap=MAX):
    ns = K.attention_splitk.n_splits_for(cap, chunk)
    nan = dict(device=DEV, dtype=torch.float32)
    return (torch.full((Hq, ns, D), float("nan"), **nan), torch.full((Hq, ns), float("nan"), **nan),
            torch.full((Hq, ns), float("nan"), **nan))


def pos_of(length):
    return torch.tensor([length - 1], dtype=torch.int32, device=DEV)


def reference(qkv, kc, vc, cos, sin, length, chunk, cfg):
    """The three launches the one kernel replaces, on the caches given (updated in place)."""
    q = torch.full((Hq * D,), float("nan"), dtype=bf, device=DEV)
    out = torch.full((Hq * D,), float("nan"), dtype=bf, device=DEV)
    po, pm, pl = partials(chunk, kc.shape[2])
    p = pos_of(length)
    K.rope_kv_write.rope_kv_write(qkv, q, kc[LAYER], vc[LAYER], cos, sin, p, Hq, Hkv, D)
    K.attention_splitk.attention_splitk(q, kc[LAYER], vc[LAYER], out, p, po, pm, pl, Hq, Hkv, D, chunk, cfg)
    return out, q, (po, pm, pl)


def one_kernel(qkv, kc, vc, cos, sin, length, chunk, cfg, counter, fuse_reduce=True):
    out = torch.full((Hq * D,), float("nan"), dtype=bf, device=DEV)
    po, pm, pl = partials(chunk, kc.shape[2])
    AO.attention_onekernel(qkv, kc[LAYER], vc[LAYER], cos, sin, out, pos_of(length), po, pm, pl,
                           counter, Hq, Hkv, D, chunk, cfg, fuse_reduce=fuse_reduce)
    return out, (po, pm, pl)


def check_same(length, chunk, got, want, kc, kc_ref, vc, vc_ref):
    (out, parts), (out_ref, _, parts_ref) = got, want
    n_valid = -(-length // chunk)
    assert same_bits(kc, kc_ref), "k cache differs"
    assert same_bits(vc, vc_ref), "v cache differs"
    for a, b, name in zip(parts, parts_ref, ("part_o", "part_m", "part_l")):
        assert same_bits(a[:, :n_valid].contiguous(), b[:, :n_valid].contiguous()), name
    assert same_bits(out, out_ref), "out differs"


def run_both(length, chunk, cfg, **state):
    """The one kernel and the three-kernel reference on copies of one state; checks they
    write the same bits and that the counter is left zero. Returns (got, want, caches)."""
    qkv, kc, vc, cos, sin = make_state(chunk, **state)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    counter = torch.zeros(Hkv, dtype=torch.int32, device=DEV)
    want = reference(qkv, kc_ref, vc_ref, cos, sin, length, chunk, cfg)
    got = one_kernel(qkv, kc, vc, cos, sin, length, chunk, cfg, counter)
    check_same(length, chunk, got, want, kc, kc_ref, vc, vc_ref)
    assert not counter.any(), counter
    return got, want, kc_ref, vc_ref


@pytest.mark.parametrize("chunk,block_t,length", PARAMS)
def test_one_kernel_equals_rope_then_splitk(chunk, block_t, length):
    got, want, kc_ref, vc_ref = run_both(length, chunk, dict(BLOCK_T=block_t, num_warps=4))
    # and both are attention: against an fp32 reference over the rotated q and the cache
    assert rel(got[0], attention_ref(want[1], kc_ref[LAYER], vc_ref[LAYER], length, Hq, Hkv, D)) < 1e-2


BIG = 16 * 40 + 5             # 41 splits of 16: more than one merge block of BLOCK_S = 32


@pytest.mark.parametrize("length", [32 * 16 - 1, 32 * 16, 32 * 16 + 1, 33 * 16 + 1, BIG])
def test_more_splits_than_one_merge_block(length):
    """Past BLOCK_S = 32 valid splits the merge walks the splits in blocks (two passes);
    the last block is ragged."""
    run_both(length, 16, dict(BLOCK_T=16, num_warps=4), cap=BIG)


@pytest.mark.parametrize("length", [1, 17, MAX])
def test_two_launch_mode_is_the_same(length):
    """fuse_reduce=False: the fused RoPE + partial kernel, then the split-K reduce kernel."""
    chunk, cfg = 16, dict(BLOCK_T=16, num_warps=4)
    qkv, kc, vc, cos, sin = make_state(chunk)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    counter = torch.zeros(Hkv, dtype=torch.int32, device=DEV)
    want = reference(qkv, kc_ref, vc_ref, cos, sin, length, chunk, cfg)
    got = one_kernel(qkv, kc, vc, cos, sin, length, chunk, cfg, counter, fuse_reduce=False)
    check_same(length, chunk, got, want, kc, kc_ref, vc, vc_ref)
    assert not counter.any(), counter


def test_counter_is_reused_across_calls():
    """Decode steps in a row on the same counter, partial buffers and caches (crossing a
    chunk boundary, and one step back to a short length): the counter left zero by one
    call must serve the next, and stale partials of a longer call must not leak."""
    chunk, cfg = 16, dict(BLOCK_T=16, num_warps=4)
    _, kc, vc, cos, sin = make_state(chunk)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    counter = torch.zeros(Hkv, dtype=torch.int32, device=DEV)
    out = torch.empty(Hq * D, dtype=bf, device=DEV)
    po, pm, pl = partials(chunk)
    for step, length in enumerate((2 * chunk - 1, 2 * chunk, 2 * chunk + 1, 3)):
        qkv = rnd((Hq + 2 * Hkv) * D, seed=100 + step).to(DEV)      # a new token each step
        want = reference(qkv, kc_ref, vc_ref, cos, sin, length, chunk, cfg)
        AO.attention_onekernel(qkv, kc[LAYER], vc[LAYER], cos, sin, out, pos_of(length), po, pm,
                               pl, counter, Hq, Hkv, D, chunk, cfg)
        check_same(length, chunk, (out, (po, pm, pl)), want, kc, kc_ref, vc, vc_ref)
        assert not counter.any(), (step, counter)


def test_launcher_refuses_bad_buffers():
    chunk = 16
    qkv, kc, vc, cos, sin = make_state(chunk)
    po, pm, pl = partials(chunk)
    out = torch.empty(Hq * D, dtype=bf, device=DEV)
    args = (qkv, kc[LAYER], vc[LAYER], cos, sin, out, pos_of(5), po, pm, pl)
    with pytest.raises(AssertionError):      # a tile straddling two chunks
        AO.attention_onekernel(*args, torch.zeros(Hkv, dtype=torch.int32, device=DEV),
                               Hq, Hkv, D, 24, dict(BLOCK_T=16, num_warps=4))
    with pytest.raises(AssertionError):      # one counter for two kv heads
        AO.attention_onekernel(*args, torch.zeros(1, dtype=torch.int32, device=DEV),
                               Hq, Hkv, D, chunk, dict(BLOCK_T=16, num_warps=4))


# ---- a grid smaller than the units: the live length shared out at run time ----------------
def grid_partials(ns):
    nan = dict(device=DEV, dtype=torch.float32)
    return (torch.full((Hq, ns, D), float("nan"), **nan), torch.full((Hq, ns), float("nan"), **nan),
            torch.full((Hq, ns), float("nan"), **nan))


SMALL = [(3, n) for n in (1, 16, 17, 33, 48, 49, MAX)] + [(1, n) for n in (1, 17, MAX)]


@pytest.mark.parametrize("ns,length", SMALL)
def test_one_kernel_over_a_small_grid(ns, length):
    """3 splits (or 1) of a cache of 70: each split holds up to 2 units (or all 5), the
    newest token anywhere in its range. Still bit for bit the three launches."""
    chunk, cfg = 16, dict(BLOCK_T=16, num_warps=4)
    qkv, kc, vc, cos, sin = make_state(chunk)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    p = pos_of(length)
    q = torch.full((Hq * D,), float("nan"), dtype=bf, device=DEV)
    out_ref = torch.full((Hq * D,), float("nan"), dtype=bf, device=DEV)
    parts_ref = grid_partials(ns)
    K.rope_kv_write.rope_kv_write(qkv, q, kc_ref[LAYER], vc_ref[LAYER], cos, sin, p, Hq, Hkv, D)
    K.attention_splitk.attention_splitk(q, kc_ref[LAYER], vc_ref[LAYER], out_ref, p, *parts_ref, Hq, Hkv, D, chunk, cfg)
    for fuse in (True, False):
        kc2, vc2 = kc.clone(), vc.clone()
        counter = torch.zeros(Hkv, dtype=torch.int32, device=DEV)
        out = torch.full((Hq * D,), float("nan"), dtype=bf, device=DEV)
        parts = grid_partials(ns)
        AO.attention_onekernel(qkv, kc2[LAYER], vc2[LAYER], cos, sin, out, p, *parts, counter, Hq,
                               Hkv, D, chunk, cfg, fuse_reduce=fuse)
        n = AS.live_splits_host(length, chunk, ns)
        assert same_bits(kc2, kc_ref) and same_bits(vc2, vc_ref)
        for a, b in zip(parts, parts_ref):
            assert same_bits(a[:, :n].contiguous(), b[:, :n].contiguous())
            assert a[:, n:].isnan().all()                # past the live splits: untouched
        assert same_bits(out, out_ref), fuse
        assert not counter.any()
    assert rel(out_ref, attention_ref(q, kc_ref[LAYER], vc_ref[LAYER], length, Hq, Hkv, D)) < 1e-2


@pytest.mark.skipif(DEV != "cpu", reason="emulates the PDL wait in Triton's interpreter")
@pytest.mark.parametrize("ns,length", [(3, 1), (3, 17), (3, 33), (5, 16), (5, 49), (3, MAX)])
def test_one_kernel_reads_qkv_only_after_its_wait(monkeypatch, ns, length):
    """The emulation of test_splitk's: every program starts with qkv (the previous
    kernel's output) and slot pos unwritten (NaN) and its wait writes them; keys and
    values older than pos may be read before it, and slot pos is never read from memory
    (the program that holds it folds the new token in from registers)."""
    from test_splitk import poisoned_until_the_wait
    chunk, cfg = 16, dict(BLOCK_T=16, num_warps=4)
    qkv, kc, vc, cos, sin = make_state(chunk)
    want_k, want_v = kc.clone(), vc.clone()
    want = torch.full((Hq * D,), float("nan"), dtype=bf)
    parts_want = grid_partials(ns)
    counter = torch.zeros(Hkv, dtype=torch.int32)
    AO.attention_onekernel(qkv, want_k[LAYER], want_v[LAYER], cos, sin, want, pos_of(length),
                           *parts_want, counter, Hq, Hkv, D, chunk, cfg)
    out = torch.full((Hq * D,), float("nan"), dtype=bf)
    parts = grid_partials(ns)
    kc[LAYER, :, length - 1], vc[LAYER, :, length - 1] = float("nan"), float("nan")
    with monkeypatch.context() as m:
        poisoned_until_the_wait(m, AO, None, None, length, [qkv])
        AO.attention_onekernel(qkv, kc[LAYER], vc[LAYER], cos, sin, out, pos_of(length), *parts,
                               counter, Hq, Hkv, D, chunk, cfg)
    assert same_bits(out, want)
    assert same_bits(kc, want_k) and same_bits(vc, want_v)
    assert not counter.any()
