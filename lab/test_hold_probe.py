"""The Gluon probe of tiles held in shared memory (lab/hold_probe.py) compiles for sm_90:
its layouts, 16-byte async copies and clock survive a Triton upgrade before a GPU run.
A lab check, outside the CPU suite (pytest's testpaths is tests/):

    python -m pytest lab/test_hold_probe.py"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_hold_probe_compiles_for_hopper():
    # Gluon compiles only outside Triton's interpreter (ci/test.sh sets TRITON_INTERPRET=1)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "lab/hold_probe.py", "--aot"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("[hold_probe] sm_90")]
    assert len(lines) == 2, r.stdout
    # BUF 4 without HOLD: 3 + 3 issue sites (prologue, loop) x 8 copies a thread
    assert "BUF 4 HOLD 0: 48 cp.async, shared 65536 B" in lines[0], lines[0]
