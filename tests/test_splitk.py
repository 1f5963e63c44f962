"""Split-K flash-decode attention at the boundaries of its chunks, in the interpreter.

One fixed launch (splits sized for the maximum context) must be right at every length:
1, a chunk minus one, a chunk, a chunk plus one, several multiples plus and minus one, and
the maximum. Each chunk's keys and values differ, so a tile that read into its
neighbour's chunk would count those tokens twice and miss the reference.
"""
import pytest
import torch

from onelaunch import kernels as K
import importlib

AS = importlib.import_module("onelaunch.kernels.attention_splitk")

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
    ns = K.n_splits_for(MAX, CHUNK)
    po = torch.full((Hq, ns, D), float("nan"))
    pm = torch.full((Hq, ns), float("nan"))
    pl = torch.full((Hq, ns), float("nan"))
    return q, kc, vc, po, pm, pl


@pytest.mark.parametrize("length", LENGTHS)
def test_splitk_lengths(length):
    q, kc, vc, po, pm, pl = setup()
    out = torch.full((Hq * D,), float("nan"), dtype=torch.bfloat16)
    K.attention_splitk(q, kc, vc, out, torch.tensor([length - 1], dtype=torch.int32), po, pm, pl,
                       Hq, Hkv, D, CHUNK, dict(BLOCK_T=8, num_warps=4))
    assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL


def test_same_buffers_serve_every_length():
    """One set of partial buffers, lengths going down and up: stale partials from a longer
    call must not leak into a shorter one (the reduce reads only the valid splits)."""
    q, kc, vc, po, pm, pl = setup()
    for length in (MAX, 5, 2 * CHUNK + 1, CHUNK):
        out = torch.empty(Hq * D, dtype=torch.bfloat16)
        K.attention_splitk(q, kc, vc, out, torch.tensor([length - 1], dtype=torch.int32), po, pm,
                           pl, Hq, Hkv, D, CHUNK, dict(BLOCK_T=16, num_warps=4))
        assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL, length


@pytest.mark.parametrize("length", [CHUNK + 1, 2 * CHUNK + 3, MAX])
def test_tile_wider_than_chunk_does_not_double_count(length):
    """Launch the partial kernel directly with a tile twice the chunk (the launcher
    refuses this). Each split must still stop at its own chunk's end."""
    q, kc, vc, po, pm, pl = setup()
    ns = pm.shape[1]
    pos = torch.tensor([length - 1], dtype=torch.int32)
    AS._attn_partial_kernel[(Hkv, ns)](
        q, kc, vc, po, pm, pl, pos, kc.stride(0), kc.stride(1), ns, D ** -0.5, GROUP=Hq // Hkv,
        GROUP_PAD=16, D=D, BLOCK_D=16, CHUNK=CHUNK, BLOCK_T=2 * CHUNK, DOT_F32=True, USE_PDL=False)
    out = torch.empty(Hq * D, dtype=torch.bfloat16)
    AS._attn_reduce_kernel[(Hq,)](po, pm, pl, out, pos, ns, D=D, BLOCK_D=16, CHUNK=CHUNK,
                                  BLOCK_S=4, BLOCK_M=8, USE_PDL=False)
    assert rel(out, attention_ref(q, kc, vc, length, Hq, Hkv, D)) < TOL


def test_launcher_refuses_a_tile_that_straddles_chunks():
    q, kc, vc, po, pm, pl = setup()
    with pytest.raises(AssertionError):
        K.attention_splitk(q, kc, vc, torch.empty(Hq * D, dtype=torch.bfloat16),
                           torch.tensor([3], dtype=torch.int32), po, pm, pl, Hq, Hkv, D, 24,
                           dict(BLOCK_T=16, num_warps=4))


def test_chunk_for_bounds_the_split_count():
    for c in (128, 2048, 4096, 33280, 131072):
        ch = K.chunk_for(c)
        assert K.n_splits_for(c, ch) <= 256 and ch >= 64
