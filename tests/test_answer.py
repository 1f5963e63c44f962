"""The closing page (report/answer.py) reads only results files: each number it prints
comes from a row of one run, a row that failed its check or belongs to another run is
never used, and a missing row (llama.cpp, two GPUs) is said to be missing."""
import json

import pytest

from onelaunch.report import answer

M = "qwen2.5-1.5b"


def _row(rung, ms, run="r1", **kw):
    return {"model": M, "rung": rung, "ctx": 512, "ms_per_token": ms, "floor_ms": 1.0,
            "agree": "12/12", "read_tbps": 4.0, "run": run, **kw}


def _write(root, rows, tp=None, profile=None, gpu="h200"):
    (root / gpu).mkdir(parents=True)
    meta = {"gpu": gpu, "gpu_name": "NVIDIA H200", "run": "r1", "commit": "c1"}
    (root / gpu / "ladder.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    if tp is not None:
        (root / f"{gpu}x2").mkdir()
        (root / f"{gpu}x2" / "tp.json").write_text(json.dumps(
            {"meta": {"commit": "c0"}, "rows": tp}))
    if profile is not None:
        (root / gpu / "profile.json").write_text(json.dumps({"meta": meta,
                                                             "rows": profile}))


LADDER = [_row("HF static", 3.0), _row("gpt-fast compiled", 2.0, peer=True),
          _row("fused + graph", 1.8), _row("+ PDL", 1.5),
          _row("+ broken", 1.1, agree="3/12",
               flips=[{"step": 1, "margin": 2.0, "near_tie_below": 0.1}]),
          _row("+ PDL", 1.2, run="r0")]          # an earlier run: never read


def test_one_gpu_reads_the_fastest_checked_rung_of_one_run(tmp_path):
    _write(tmp_path, LADDER)
    ans = answer.answer(tmp_path)
    a = ans["models"][M]
    assert a["best"]["rung"] == "+ PDL" and a["best"]["ms_per_token"] == 1.5
    assert a["compiled"]["rung"] == "gpt-fast compiled" and a["floor_ms"] == 1.0
    text = answer.model_text(M, a, ans["gpu_name"])
    assert "1.500 ms: 1.50x the floor" in text
    assert "ours is 1.33x faster" in text                        # 2.0 / 1.5
    assert "No two-GPU run" in text and "llama.cpp has no row in this run" in text
    table = answer.table_rows(ans)
    assert [r["ms_per_token"] for r in table if r["what"].startswith("llama")] == [None]
    assert "+ broken" not in str(table)
    assert 1.2 not in [r["ms_per_token"] for r in table]


def test_llama_and_two_gpus_where_measured(tmp_path):
    llama = _row("llama.cpp", 2.5, peer=True, agree=None, unchecked=True,
                 ms_min=2.4, ms_max=2.7)
    tp = [{"model": M, "tp": 1, "rung": "one GPU", "ms_per_token": 1.6, "floor_ms": 0.9,
           "ok": True},
          {"model": M, "tp": 2, "rung": "fused", "ms_per_token": 1.2, "floor_ms": 0.45,
           "ok": True},
          {"model": M, "tp": 2, "rung": "broken", "ms_per_token": 0.5, "floor_ms": 0.45,
           "ok": False}]
    _write(tmp_path, LADDER + [llama], tp=tp)
    ans = answer.answer(tmp_path)
    a = ans["models"][M]
    assert ans["tp_commit"] == "c0" and a["two"]["rung"] == "fused"
    text = answer.model_text(M, a, ans["gpu_name"])
    # two GPUs against the one-GPU floor of their own run (0.9), not the ladder's
    assert "1.200 ms: 1.33x the one-GPU floor, 0.75x the one-GPU step" in text
    assert "llama.cpp takes 2.500 ms, 2.400-2.700 over its repeats" in text
    assert "llama-bench's own timing, no oracle check possible" in text
    rows = {r["what"]: r for r in answer.table_rows(ans)}
    assert rows["llama.cpp (llama-bench)"]["spread"] == "2.400-2.700"
    assert rows["ours, two GPUs (fused)"]["x_floor"] == pytest.approx(1.2 / 0.9)


def test_fixed_costs_and_what_is_left_come_from_the_files(tmp_path):
    prof = [{"model": M, "rung": "+ PDL", "op": op, "beyond_ms": b, "launches": 28}
            for op, b in (("attention", 0.1), ("down", 0.3), ("qkv", 0.05),
                          ("norm", 0.01))]
    _write(tmp_path, LADDER, profile=prof)
    ans = answer.answer(tmp_path)
    left = answer.left_text(ans)
    assert "spends 0.460 ms beyond its bytes" in left
    at = left.index
    assert at("down 300 µs") < at("attention 100 µs") < at("qkv")
    assert "norm" not in left                                   # the top three only
    fixed = answer.fixed_cost_text(ans)
    # here 1.5 - 1.0 = 0.50 ms on a 1.0 ms floor; the 4090 as reported: 0.66 on 3.06
    assert "0.66 ms there to 0.50 ms here" in fixed and "50% of this floor" in fixed


def test_no_results_is_said(tmp_path):
    ans = answer.answer(tmp_path)
    assert ans["models"] == {}
    assert answer.left_text(ans) == "No step profile is on file for this run."


def test_a_faster_peer_is_said_so(tmp_path):
    llama = _row("llama.cpp", 1.2, peer=True, agree=None, unchecked=True)
    _write(tmp_path, LADDER + [llama])
    ans = answer.answer(tmp_path)
    text = answer.model_text(M, ans["models"][M], ans["gpu_name"])
    assert "llama.cpp is 1.25x faster than ours" in text            # 1.5 / 1.2


def test_the_one_launch_clock_of_the_same_run_only(tmp_path):
    _write(tmp_path, LADDER)
    clock = {"model": M, "ctx": 512, "op": None, "step_us": 1300.0, "wait_share": 0.19,
             "most_waiting_op": "o_proj"}

    def with_clock(run):
        (tmp_path / "h200" / "step_clock.json").write_text(json.dumps(
            {"meta": {"run": run}, "rows": [clock]}))
        return answer.left_text(answer.answer(tmp_path))
    left = with_clock("r1")
    assert "clocked step takes 1300 µs, its median SM waiting on counters 19% of it, " \
           "most before o_proj" in left
    assert with_clock("r0") == "No step profile is on file for this run."


@pytest.mark.parametrize("mega_ms, fastest", [(1.65, False), (1.3, True)])
def test_the_one_launch_is_set_against_the_fastest_step(tmp_path, mega_ms, fastest):
    """Chapter 8's rung has its own line in the table, and the page says whether it is
    the book's fastest step, from the run's own rows (a failed one is never used)."""
    bad = _row(answer.MEGA, 0.9, agree="3/12",
               flips=[{"step": 1, "margin": 2.0, "near_tie_below": 0.1}])
    _write(tmp_path, LADDER + [_row(answer.MEGA, mega_ms), bad])
    ans = answer.answer(tmp_path)
    a = ans["models"][M]
    assert a["one_launch"]["ms_per_token"] == mega_ms
    text = answer.left_text(ans)
    table = answer.table_rows(ans)
    if fastest:
        assert a["best"]["rung"] == answer.MEGA and "this book's fastest step" in text
        assert not any(r["what"] == f"ours, {answer.MEGA}" for r in table)
    else:
        assert "1.10 times the 1.5 ms of *+ PDL*" in text and "not yet" in text
        assert [r["ms_per_token"] for r in table if r["what"] == f"ours, {answer.MEGA}"] \
            == [mega_ms]


def test_llama_of_both_models_each_from_its_chapter(tmp_path):
    """Chapter 6 measures llama.cpp for OLMoE and chapter 8 for Qwen, in the same run:
    the closing page reads each model's row from the ladder (never measures again), and a
    row that gave no time is said so, not taken for a missing one."""
    moe = "olmoe-1b-7b"
    olmoe = [dict(_row("+ PDL", 1.0), model=moe, floor_ms=0.8),
             dict(_row("llama.cpp", 1.6, peer=True, agree=None, unchecked=True,
                       ms_min=1.5, ms_max=1.7, chapter="06_mixture_of_experts"),
                  model=moe, floor_ms=0.8)]
    qwen = _row("llama.cpp", 2.5, peer=True, agree=None, unchecked=True,
                chapter="08_one_launch")
    _write(tmp_path, LADDER + olmoe + [qwen])
    ans = answer.answer(tmp_path)
    assert ans["models"][moe]["llama"]["chapter"] == "06_mixture_of_experts"
    assert ans["models"][M]["llama"]["chapter"] == "08_one_launch"
    text = answer.model_text(moe, ans["models"][moe], ans["gpu_name"])
    assert "llama.cpp takes 1.600 ms, 1.500-1.700 over its repeats (2.00x;" in text
    assert "ours is 1.60x faster" in text                           # 1.6 / 1.0
    assert "llama.cpp takes 2.500 ms" in answer.model_text(M, ans["models"][M], "H200")
    llama = {r["model"]: r for r in answer.table_rows(ans)
             if r["what"] == "llama.cpp (llama-bench)"}
    assert llama["OLMoE-1B-7B"]["ms_per_token"] == 1.6
    assert llama["OLMoE-1B-7B"]["x_floor"] == pytest.approx(2.0)
    assert llama["Qwen2.5-1.5B"]["ms_per_token"] == 2.5


def test_a_llama_row_without_a_time_is_said_so(tmp_path):
    failed = _row("llama.cpp", None, peer=True, agree=None, unchecked=True,
                  error="llama-bench exited 1: out of memory\nmore")
    _write(tmp_path, LADDER + [failed])
    ans = answer.answer(tmp_path)
    text = answer.model_text(M, ans["models"][M], ans["gpu_name"])
    assert "llama.cpp gave no time in this run: llama-bench exited 1: out of memory." \
        in text and "no row" not in text
    row = next(r for r in answer.table_rows(ans) if r["what"].startswith("llama"))
    assert row["ms_per_token"] is None and row["note"] == "no time in this run"
