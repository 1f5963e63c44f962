"""The lab's MLP probe (``gluon_mlp.py``, its host side ``mlp_stream.py``): its schedule on
the CPU (every row once, every counter's target equal to its bumps, bytes balanced over
the SMs) and its Gluon kernel compiled for sm_90 (TMA boxes, mbarrier ring, bounded
waits), since Gluon kernels do not run in Triton's interpreter.

    python -m pytest lab/test_mlp_stream.py
"""
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from mlp_stream import mlp_schedule, split_rows
from onelaunch.megakernel import isa
from onelaunch.megakernel.boxes import TN

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("n,parts", [(2240, 132), (384, 132), (7, 3), (3, 8)])
def test_split_rows_covers_each_block_once(n, parts):
    runs = split_rows(n, parts)
    blocks = [b for first, count in runs for b in range(first, first + count)]
    assert blocks == list(range(n))
    sizes = [c for _, c in runs]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("P", [132, 16, 5])
def test_schedule_counters_and_rows(P):
    L, H, I = 3, 1536, 8960
    prog = mlp_schedule(L, H, I, P)
    rows = prog.reshape(-1, isa.WIDTH).tolist()
    live = [r for r in rows if r[isa.OP] != isa.OP_END]
    bumps = Counter(r[isa.BUMP] for r in live)
    for r in live:                                  # a wait's target is all of its bumps
        if r[isa.WAIT0] != isa.NONE:
            assert r[isa.TARGET0] == bumps[r[isa.WAIT0]], r
    for l in range(L):
        for op, n in ((isa.OP_GATE_UP, I), (isa.OP_DOWN, H)):
            mine = sorted((r[isa.ROW0], r[isa.ROWS]) for r in live
                          if r[isa.OP] == op and r[isa.LAYER] == l)
            covered = [x for r0, k in mine for x in range(r0, r0 + k)]
            assert covered == list(range(n)), (l, op)
            assert all(k % TN == 0 for _, k in mine)
        # gate/up of layer l waits for the down of l - 1, down for the gate/up of l
        gu = [r for r in live if r[isa.OP] == isa.OP_GATE_UP and r[isa.LAYER] == l]
        dn = [r for r in live if r[isa.OP] == isa.OP_DOWN and r[isa.LAYER] == l]
        assert all(r[isa.WAIT0] == (2 * l - 1 if l else isa.NONE) for r in gu)
        assert all(r[isa.WAIT0] == 2 * l and r[isa.BUMP] == 2 * l + 1 for r in dn)
    # weight bytes an SM: within 2% of the mean at the real grid
    per_sm = [sum(r[isa.ROWS] * (2 * H if r[isa.OP] == isa.OP_GATE_UP else I)
                  for r in prog[p].tolist() if r[isa.OP] != isa.OP_END) for p in range(P)]
    if P == 132:
        assert max(per_sm) / (sum(per_sm) / P) < 1.02


def test_compiles_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(ROOT / "lab" / "mlp_stream.py"), "--aot",
                        "--stages", "6", "--warps", "4"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [l for l in r.stdout.splitlines() if l.startswith("[gluon_mlp] sm_90")]
    assert len(line) == 1 and "'tma': 5" in line[0], r.stdout   # this version's TMA copy sites
    shared = int(line[0].split("'shared': ")[1].split(",")[0])
    assert 190_000 < shared <= 227 * 1024            # the ring and h fill the shared memory
