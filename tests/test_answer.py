"""The book's answer (report/answer.py, the introduction's figure and chapter 9) reads only
results files: each number comes from a row of one run, a row that failed its check or
belongs to another run is never used, a missing row (llama.cpp, two GPUs, the profile)
is None and drawn as "not in this run", and the lab's one launch of an MoE is read where
the lab wrote it."""
import json

import pytest

from onelaunch.report import answer, answer_figure

M, MOE = "qwen2.5-1.5b", "olmoe-1b-7b"


def _row(rung, ms, run="r1", model=M, **kw):
    return {"model": model, "rung": rung, "ctx": 512, "ms_per_token": ms, "floor_ms": 1.0,
            "agree": "12/12", "read_tbps": 4.0, "run": run, **kw}


def _write(root, rows, tp=None, profile=None, gpu="h200"):
    (root / gpu).mkdir(parents=True)
    meta = {"gpu": gpu, "gpu_name": "NVIDIA H200", "run": "r1", "commit": "c1",
            "date": "2026-12-03T00:00:00"}
    (root / gpu / "ladder.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    if tp is not None:
        (root / f"{gpu}x2").mkdir()
        (root / f"{gpu}x2" / "tp.json").write_text(json.dumps(
            {"meta": {"commit": "c0", "run": "r0", "date": "2026-11-30"}, "rows": tp}))
    if profile is not None:
        (root / gpu / "profile.json").write_text(json.dumps(
            {"meta": dict(meta, run="r0"), "rows": profile}))


LADDER = [_row("HF static", 3.0), _row("gpt-fast compiled", 2.0, peer=True),
          _row("fused + graph", 1.8), _row("+ PDL", 1.5),
          _row("+ broken", 1.1, agree="3/12",
               flips=[{"step": 1, "margin": 2.0, "near_tie_below": 0.1}]),
          _row("+ PDL", 1.2, run="r0")]          # an earlier run: never read


def test_the_fastest_checked_rung_of_one_run(tmp_path):
    _write(tmp_path, LADDER)
    a = answer.answer(tmp_path)["models"][M]
    assert a["best"]["rung"] == "+ PDL" and a["best"]["ms_per_token"] == 1.5
    assert a["compiled"]["rung"] == "gpt-fast compiled" and a["floor_ms"] == 1.0
    assert a["one_launch"] is None and a["llama"] is None and a["two"] is None
    assert answer.x_floor(a["best"], a["floor_ms"]) == 1.5


def test_no_results_is_said(tmp_path):
    assert answer.answer(tmp_path) == {"gpu": None, "models": {}}


def test_the_figure_draws_every_bar_and_says_who_wins(tmp_path):
    llama = _row("llama.cpp", 2.5, peer=True, agree=None, unchecked=True)
    mega = _row(answer.MEGA, 1.65)
    _write(tmp_path, LADDER + [llama, mega])
    ans = answer.answer(tmp_path)
    bars = answer_figure.bars(ans["models"][M])
    assert [r["rung"] for _, r, _ in bars] == ["+ PDL", answer.MEGA, "gpt-fast compiled",
                                               "llama.cpp"]
    fig = answer_figure.draw(ans)
    assert fig.png[:4] == b"\x89PNG"
    assert "the chain is 1.33x faster than the fastest peer (gpt-fast compiled)" in fig.caption


def test_a_faster_peer_is_said_so(tmp_path):
    llama = _row("llama.cpp", 1.2, peer=True, agree=None, unchecked=True)
    _write(tmp_path, LADDER + [llama])
    cap = answer_figure.caption(answer.answer(tmp_path))
    assert "the chain is 1.25x slower than the fastest peer (llama.cpp)" in cap


def test_a_model_without_a_row_draws_not_in_this_run(tmp_path):
    moe = [_row("+ PDL", 1.0, model=MOE), _row("oracle compiled", 3.0, model=MOE)]
    _write(tmp_path, LADDER + moe)
    a = answer.answer(tmp_path)["models"][MOE]
    bars = answer_figure.bars(a)
    assert [r is None for _, r, _ in bars] == [False, True, False, True]
    assert answer_figure.draw(answer.answer(tmp_path)).png[:4] == b"\x89PNG"


def test_two_gpus_from_their_own_run(tmp_path):
    tp = [{"model": M, "tp": 1, "rung": "one GPU", "ms_per_token": 1.6, "floor_ms": 0.9,
           "ok": True},
          {"model": M, "tp": 2, "rung": "fused", "ms_per_token": 1.2, "floor_ms": 0.45,
           "ok": True},
          {"model": M, "tp": 2, "rung": "broken", "ms_per_token": 0.5, "floor_ms": 0.45,
           "ok": False}]
    _write(tmp_path, LADDER, tp=tp)
    ans = answer.answer(tmp_path)
    t = ans["models"][M]["two"]
    assert t["rung"] == "fused" and t["one_gpu_ms"] == 1.6 and t["one_gpu_floor_ms"] == 0.9
    assert ans["tp_meta"]["run"] == "r0"


def test_the_profile_and_the_fixed_costs(tmp_path):
    prof = [{"model": M, "rung": "+ PDL", "op": op, "step": i, "ms": b + 0.1,
             "bytes_ms": 0.1, "beyond_ms": b, "launches": n, "step_ms": 1.4,
             "floor_ms": 1.0}
            for i, (op, b, n) in enumerate((("qkv", 0.05, 28), ("attention", 0.1, 28),
                                            ("down", 0.3, 28), ("head", 0.01, 1)))]
    prof.append(dict(prof[0], rung="fused + graph"))       # another rung: not read
    _write(tmp_path, LADDER, profile=prof)
    ans = answer.answer(tmp_path)
    ops = ans["models"][M]["ops"]
    assert [r["op"] for r in ops] == ["qkv", "attention", "down", "head"]
    assert ans["profile_meta"]["run"] == "r0"           # its own run, named on the page
    b = answer.beyond(ops)
    assert b["ms"] == pytest.approx(0.46) and b["launches"] == 85
    assert [r["op"] for r in b["top"][:2]] == ["down", "attention"]
    f = answer.fixed_cost(ans)
    # 0.46 ms beyond the bytes: 46% of this 1.0 ms floor, 15% of the 4090's 3.06 ms
    assert f["share_here"] == pytest.approx(0.46)
    assert f["share_4090"] == pytest.approx(0.46 / 3.06)
    assert f["bandwidth_x"] == pytest.approx(3.06)


def test_the_lab_one_launch_is_read_where_the_lab_wrote_it(tmp_path):
    _write(tmp_path, LADDER)
    assert answer.answer(tmp_path)["lab"] is None
    lab = tmp_path / "h200" / "2026-12-03_moe-one-launch"
    lab.mkdir()
    run = lambda ms: {"mega": {"median_ms": ms, "agree": "31/32"},
                      "chain": {"median_ms": 1.0}}
    (lab / "moe_bt.json").write_text(json.dumps(
        {"model": MOE, "runs": {"512": {"floor_ms": 0.57, "v_bt16": run(2.3),
                                        "v_bt64": run(2.6)},
                                "1": {"v_bt16": run(1.1)}}}))
    got = answer.answer(tmp_path)["lab"]
    assert got["ms"] == 2.3 and got["chain_ms"] == 1.0 and got["ctx"] == 512
    assert got["file"].endswith("2026-12-03_moe-one-launch/moe_bt.json")
