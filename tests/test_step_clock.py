"""The one-launch step's clock read back (onelaunch/report/step_clock.py) on a synthetic
clock of two SMs whose every number is worked out by hand below: the per-op table, the
stage ends, the bytes in flight, the picture, and the prose that reads them."""
import pytest
import torch

from onelaunch.megakernel import isa
from onelaunch.report import step_clock as sc

# SM 0: gate/up then down of layer 0; SM 1: an attention partial, the LM head, the argmax.
# (op, layer, start, counters in, end, last tile asked) in ns; bytes of weights
ROWS = [[(isa.OP_GATE_UP, 0, 0, 1000, 5000, 3000, 4096),
         (isa.OP_DOWN, 0, 5000, 6000, 9000, 7000, 2048)],
        [(isa.OP_ATTN_PARTIAL, 0, 1000, 2000, 4000, 0, 0),
         (isa.OP_LM_HEAD, isa.NONE, 4000, 4000, 10000, 8000, 8192),
         (isa.OP_ARGMAX, isa.NONE, 10000, 11000, 12000, 0, 0)]]
T0 = 1_700_000_000_000_000_000          # globaltimer ns: the step's first start


def synthetic(asks=True):
    P, N = len(ROWS), 4                              # one OP_END row of padding at least
    clk = torch.zeros(P, N, 4, dtype=torch.int64)
    prog = torch.zeros(P, N, isa.WIDTH, dtype=torch.int32)
    nbytes = torch.zeros(P, N)
    for p, rows in enumerate(ROWS):
        for i, (op, layer, s, w, e, a, b) in enumerate(rows):
            prog[p, i, isa.OP], prog[p, i, isa.LAYER] = op, layer
            clk[p, i] = torch.tensor([T0 + s, T0 + w, T0 + e, T0 + a if a and asks else 0])
            nbytes[p, i] = b
    return sc.Clock.of(clk, prog, nbytes)


def test_tables_from_the_stamps():
    c = synthetic()
    assert c.step_us == pytest.approx(12.0)
    by = {r["op"]: r for r in sc.op_rows(c)}
    assert set(by) == {"gate_up", "down", "attn_partial", "lm_head", "argmax"}
    assert (by["gate_up"]["wait_us"], by["gate_up"]["work_us"]) == pytest.approx((1.0, 4.0))
    assert (by["lm_head"]["wait_us"], by["lm_head"]["work_us"]) == pytest.approx((0.0, 6.0))
    assert by["gate_up"]["work_per_sm_us"] == pytest.approx(2.0)       # 4 µs over 2 SMs
    assert sc.op_rows(c)[0]["op"] == "lm_head"                          # most work first
    ends = sc.stage_ends(c)
    assert ends[0] == pytest.approx({"layer": 0, "gate_up": 5.0, "down": 9.0,
                                     "attn_partial": 4.0})
    assert ends[1]["layer"] is None and ends[1]["argmax"] == pytest.approx(12.0)


def test_bytes_in_flight_by_hand():
    c = synthetic()
    f = sc.in_flight(c, [0.0, 2.0, 5.0, 6.0, 12.0])
    # SM 0 at 2 µs: gate/up asked over [0, 3] (2/3 of 4096), worked over [1, 5] (1/4)
    assert f[0, 1] == pytest.approx(4096 * 2 / 3 - 4096 / 4)
    # at 6 µs: gate/up done; down asked over [3, 7] (3/4 of 2048), its work not begun
    assert f[0, 3] == pytest.approx(2048 * 3 / 4)
    # SM 1 at 5 µs: the LM head asked over [1, 8] (the SM's first start to its stamp),
    # worked over [4, 10]; the partial and the argmax have no tiles
    assert f[1, 2] == pytest.approx(8192 * 4 / 7 - 8192 / 6)
    assert f[:, 0].tolist() == [0.0, 0.0] and f[:, -1].abs().max() < 1e-9
    assert sc.in_flight(synthetic(asks=False), [1.0]) is None


def test_the_picture_draws_what_the_clock_has():
    import matplotlib
    matplotlib.use("Agg")
    fig = sc.draw(synthetic(), ring_bytes=8192)
    top, bottom = fig.axes[:2]
    assert len(fig.axes) == 2 and top.get_xlim() == pytest.approx((0.0, 12.0))
    # per SM: the waits (grey), then per op its work and its loader's asks
    assert len(top.collections) == 1 + 2 * 2 + 1 + 2 * 3
    median = bottom.lines[-2].get_ydata()          # then the ring's capacity
    assert max(median) > 0 and bottom.lines[-1].get_ydata()[0] == pytest.approx(8.0)
    one = sc.draw(synthetic(asks=False))
    assert len(one.axes) == 1                       # no ask stamps: no bytes-in-flight panel


def test_the_prose_reads_the_numbers():
    c = synthetic()
    s = sc.summary(c, read_tbps=1e-3, ring_bytes=4096)    # 1 GB/s: 14336 B take 14.3 µs
    assert s["wait_share"] == pytest.approx(((2 / 12) + (2 / 12)) / 2)
    assert s["most_work"]["op"] == "lm_head" and s["bytes_us"] == pytest.approx(14.336)
    slow = sc.bound_text(s, mega_ms=1.3, chain_ms=1.2, chain_name="+ PDL")
    assert "slower than + PDL (1.2 ms in the same process, 1.08x)" in slow and "in flight" in slow
    assert "faster than" in sc.bound_text(s, 1.1, 1.2)
    assert "no one-launch step" in sc.bound_text(s, None, 1.2)
    none = sc.bound_text(sc.summary(synthetic(asks=False)), 1.1, 1.2)
    assert "no loader stamps" in none


def test_ring_in_use_by_hand():
    # SM 0 only, in ring stages: gate/up 4 stages, down 2, a ring of 2 stages
    c = synthetic()
    c.stages = torch.zeros_like(c.nbytes)
    c.stages[0, 0], c.stages[0, 1] = 4, 2
    f = sc.in_flight(c, [2.0, 3.5, 6.0, 8.0], ring=2)[0]
    # at 2 µs: 1 stage done (evenly over [1, 5]), the loader 2 ahead, gate/up's 4 the most
    # it may have asked; at 3.5 the stamp says all 4 asked, done 2.5; at 8 down's stamp
    # (7) says all 6 asked, done 4 + 2/3 x 2: less than a ring left to ask
    assert f.tolist() == pytest.approx([2.0, 2.0, 2.0, 6 - (4 + 4 / 3)])
    assert float(sc.in_flight(c, torch.linspace(0, 12, 97), ring=2).max()) <= 2 + 1e-9


def test_loader_stages_follow_the_loader():
    from onelaunch.specs import get_spec
    prog = torch.zeros(1, 4, isa.WIDTH, dtype=torch.int32)
    for i, (op, rows) in enumerate([(isa.OP_RMS_QKV, 12), (isa.OP_GATE_UP, 12),
                                    (isa.OP_DOWN, 12), (isa.OP_ATTN_FUSED, 1)]):
        prog[0, i, isa.OP], prog[0, i, isa.ROWS] = op, rows
    # QKV: pairs of 4-row blocks; gate/up: a block a stage; down (Qwen's 8960 = 35 K
    # tiles): 2 boxes of 16 tiles and a tail box a block; attention: no weights
    assert sc.loader_stages(prog, get_spec("qwen2.5-1.5b"))[0].tolist() == [2, 3, 9, 0]
