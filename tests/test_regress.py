"""ci/regress.py on synthetic results: ratios beyond their noise band, checks that changed,
and the exit code."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _write(folder: Path, ladder, kernels, oracle=None):
    folder.mkdir(parents=True)
    (folder / "ladder.json").write_text(json.dumps({"meta": {}, "rows": ladder}))
    (folder / "kernels.json").write_text(json.dumps({"meta": {}, "rows": kernels}))
    if oracle is not None:
        (folder / "oracle_check.json").write_text(json.dumps({"meta": {}, "rows": oracle}))


def _rung(rung, ms, agree="12/12", floor=1.0, **kw):
    return {"model": "m", "rung": rung, "ctx": 512, "ms_per_token": ms, "floor_ms": floor,
            "agree": agree, **kw}


def _kernel(name, pct, check="pass"):
    return {"model": "m", "kernel": name, "ctx": 512, "pct_of_read": pct, "check": check}


def _regress(old, new):
    return subprocess.run([sys.executable, "ci/regress.py", "--old", str(old), "--new", str(new)],
                          cwd=ROOT, capture_output=True, text=True)


def test_within_noise_passes(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _write(old, [_rung("+ PDL", 1.20), _rung("fused eager", 4.2)], [_kernel("gemv", 70.0)])
    # step 1.20 -> 1.24 ms (+3.3% < 5%), eager 4.2 -> 9.0 (host-bound), kernel 70 -> 63% (-10%)
    _write(new, [_rung("+ PDL", 1.24), _rung("fused eager", 9.0)], [_kernel("gemv", 63.0)])
    p = _regress(old, new)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Within their band: 3 ratio(s)" in p.stdout and "Nothing moved" in p.stdout


def test_a_slower_step_and_kernel_are_regressions(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _write(old, [_rung("+ PDL", 1.20), _rung("+ split-K", 1.40)],
           [_kernel("gemv", 70.0), _kernel("lm", 90.0)])
    # + PDL 7.5% slower (step band 5%): regression; split-K 10% faster: improvement;
    # gemv 70 -> 56% of read (-20%, kernel band 12%): regression
    _write(new, [_rung("+ PDL", 1.29), _rung("+ split-K", 1.26)],
           [_kernel("gemv", 56.0), _kernel("lm", 91.0)])
    p = _regress(old, new)
    assert p.returncode == 1
    table = [l for l in p.stdout.splitlines() if l.startswith("| ladder") or l.startswith("| kernels")]
    verdicts = {l.split("|")[1].strip(): l.split("|")[-2].strip() for l in table}
    assert verdicts == {"ladder: m, + PDL, 512": "regression",
                        "ladder: m, + split-K, 512": "improvement",
                        "kernels: m, gemv, 512": "regression"}
    assert "+7.5%" in p.stdout and "-20.0%" in p.stdout


def test_checks_that_change_or_fail(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    tie = [{"step": 3, "margin": 0.0, "near_tie_below": 0.125}]
    real = [{"step": 3, "margin": 2.0, "near_tie_below": 0.125}]
    _write(old, [_rung("+ PDL", 1.2), _rung("graph", 1.9)], [_kernel("gemv", 70.0)],
           [{"model": "m", "agree": "12/12", "ok": True, "disagreements": []}])
    # + PDL now differs at a near tie (changed, still passes); graph at a real difference
    # (refused: a failed check); the kernel fails its check
    _write(new, [_rung("+ PDL", 1.2, "11/12", flips=tie), _rung("graph", 1.9, "11/12", flips=real)],
           [_kernel("gemv", 70.0, check="FAIL")],
           [{"model": "m", "agree": "11/12", "ok": False,
             "disagreements": [{"step": 3, "hf_gap": 0.01}]}])
    p = _regress(old, new)
    assert p.returncode == 1
    out = p.stdout
    assert "| ladder: m, + PDL, 512 | check | pass 12/12 | near ties only 11/12 |" in out
    assert "| ladder: m, graph, 512 | check | pass 12/12 | refused 11/12 |" in out
    assert "check failed" in out.split("ladder: m, graph, 512")[1].splitlines()[0]
    assert "| kernels: m, gemv, 512 | check | pass | FAIL |" in out
    assert "| oracle_check: m | check | pass 12/12 | near ties only 11/12 |" in out
