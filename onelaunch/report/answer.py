"""The book's answer, read from results files only (the introduction and the closing
page, ``notebooks/09_the_answer.md``): for each model, the floor, our fastest rung that
passed its check, the one launch, the peers a user would pick (the strongest compiled
PyTorch step, llama.cpp), two GPUs, and where the fastest rung's step goes, op by op.
No GPU work: the pages read the same files on any machine.

:func:`answer` gathers the numbers, each with the run it comes from; a missing row
(llama.cpp before its first run, no two-GPU file, no profile) is ``None`` and the pages
say so. The one-launch lab measurement of OLMoE (:func:`lab_one_launch`) is not a book
run: it is read where the lab wrote it and named by its file.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from . import ladder_file
from ..measure.rungs import MEGA
from ..peers.llama_cpp import NAME as LLAMA
from .results import RESULTS, ROOT, row_passes

COMPILED = ("gpt-fast compiled", "oracle compiled", "HF static")   # strongest first
NAMES = {"qwen2.5-1.5b": "Qwen2.5-1.5B", "olmoe-1b-7b": "OLMoE-1B-7B"}

# As reported, cited (the seed post, on an RTX 4090): never measured here.
SEED_4090 = {"ms": 3.72, "floor_ms": 3.06, "gpu": "RTX 4090", "model": "qwen2.5-1.5b"}


def name(model: str) -> str:
    return NAMES.get(model, model)


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _fastest(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if row_passes(r)]
    return min(ok, key=lambda r: r["ms_per_token"]) if ok else None


def one_gpu(rows: list[dict], model: str) -> dict:
    """One model's one-GPU numbers from the ladder's rows (one run): the floor, our
    fastest rung that passed, the one launch, the strongest compiled peer, llama.cpp
    (its fastest row that gave a time, else the row that says why it gave none)."""
    mine = [r for r in rows if r["model"] == model]
    ours = [r for r in mine if not ladder_file.is_peer(r) and r["rung"] != LLAMA]
    llama = [r for r in mine if r["rung"] == LLAMA]
    compiled = [_fastest([r for r in mine if r["rung"] == c]) for c in COMPILED]
    return {"floor_ms": ladder_file.summary(rows, model)["floor_ms"],
            "best": _fastest(ours),
            "one_launch": _fastest([r for r in mine if r["rung"] == MEGA]),
            "compiled": next((r for r in compiled if r), None),
            "llama": _fastest(llama) or (llama[0] if llama else None),
            "read_tbps": next((r["read_tbps"] for r in mine if r.get("read_tbps")), None),
            "ctx": next((r["ctx"] for r in mine), None)}


def two_gpu(data: dict | None, model: str) -> dict | None:
    """One model's two-GPU numbers (``results/<gpu>x2/tp.json``, a run of its own): the
    fastest rung on two GPUs that passed, and the one-GPU step and floor of that run."""
    if not data:
        return None
    mine = [r for r in data["rows"] if r["model"] == model]
    one = next((r for r in mine if r.get("tp") == 1), None)
    two = [r for r in mine if r.get("tp") == 2 and r.get("ok") and r.get("ms_per_token")]
    if one is None or not two:
        return None
    best = min(two, key=lambda r: r["ms_per_token"])
    return {"rung": best["rung"], "ms": best["ms_per_token"], "row": best,
            "one_gpu_ms": one["ms_per_token"], "one_gpu_floor_ms": one["floor_ms"]}


def ops(data: dict | None, model: str, rung: str) -> list[dict] | None:
    """Where one rung's step goes, op by op in step order (``profile.json``): each op's
    time, the time its bytes need at the run's read bandwidth, the rest, its launches."""
    if not data:
        return None
    mine = sorted((r for r in data["rows"] if r["model"] == model and r["rung"] == rung
                   and r.get("op") and r.get("ms") is not None),
                  key=lambda r: r.get("step", 0))
    return mine or None


def lab_one_launch(root: Path, gpu: str, model: str = "olmoe-1b-7b") -> dict | None:
    """The one launch of an MoE as the lab measured it outside the book's runs (the
    fastest variant of ``moe_bt.json`` at the context the book uses, 512, beside the
    chain timed in the same process), with the file and the commit that added it."""
    found = sorted(Path(root).glob(f"{gpu}/*/moe_bt.json"))
    if not found:
        return None
    data = json.loads(found[-1].read_text())
    runs = data.get("runs", {}).get("512", {})
    variants = [v for v in runs.values() if isinstance(v, dict) and "mega" in v]
    if data.get("model") != model or not variants:
        return None
    v = min(variants, key=lambda v: v["mega"]["median_ms"])
    rel = found[-1].relative_to(Path(root).parent) if Path(root).parent in \
        found[-1].parents else found[-1]
    try:            # the commit that first added it (--follow: through the folder's rename)
        adds = subprocess.run(["git", "log", "--follow", "--format=%h %ad", "--date=short",
                               "--diff-filter=A", "--", str(found[-1])], cwd=ROOT,
                              capture_output=True, text=True, timeout=30).stdout.split()
        commit = adds[-2:]                           # the oldest: git log lists newest first
    except Exception:
        commit = []
    # the date of the run: the dated folder's name (results/<gpu>/<date>_<what>/)
    day = re.match(r"\d{4}-\d{2}-\d{2}", found[-1].parent.name)
    return {"ms": v["mega"]["median_ms"], "chain_ms": v["chain"]["median_ms"],
            "agree": v["mega"].get("agree"), "ctx": 512, "file": str(rel),
            "commit": commit[0] if commit else None,
            "date": day.group(0) if day else (commit[1] if len(commit) > 1 else None)}


def answer(root: Path | None = None, gpu: str | None = None) -> dict:
    """Everything the introduction and the closing page print, per model, each part
    with the run it comes from."""
    root = Path(root) if root is not None else RESULTS
    data = ladder_file.load_ladder(gpu, root)
    if data is None:
        return {"gpu": None, "models": {}}
    gpu = data["meta"]["gpu"]
    rows, _ = ladder_file.one_run(data["rows"])
    tp = _load(root / f"{gpu}x2" / "tp.json")
    prof = _load(root / gpu / "profile.json")
    models = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        a = one_gpu(rows, m)
        a["two"] = two_gpu(tp, m)
        a["ops"] = ops(prof, m, a["best"]["rung"]) if a["best"] else None
        models[m] = a
    meta = data["meta"]
    return {"gpu": gpu, "gpu_name": meta.get("gpu_name", gpu), "run": meta.get("run"),
            "commit": meta.get("commit"), "date": (meta.get("date") or "")[:10],
            "models": models, "rows": rows,
            "tp_meta": tp["meta"] if tp else None,
            "profile_meta": prof["meta"] if prof else None,
            "lab": lab_one_launch(root, gpu)}


def x_floor(row: dict | None, floor_ms: float | None) -> float | None:
    ms = (row or {}).get("ms_per_token")
    return ms / floor_ms if ms and floor_ms else None


def beyond(ops_rows: list[dict]) -> dict:
    """The time a step's ops take beyond their bytes: in all, per launch, and the ops
    that take most of it (largest first)."""
    total = sum(r["beyond_ms"] for r in ops_rows)
    launches = sum(r.get("launches") or 0 for r in ops_rows)
    top = sorted(ops_rows, key=lambda r: -r["beyond_ms"])
    return {"ms": total, "launches": launches,
            "us_per_launch": total * 1e3 / launches if launches else None,
            "bytes_ms": sum(r["bytes_ms"] for r in ops_rows),
            "step_ms": ops_rows[0].get("step_ms"), "floor_ms": ops_rows[0].get("floor_ms"),
            "top": top}


def fixed_cost(ans: dict, model: str = SEED_4090["model"]) -> dict | None:
    """Why the H200 sits further from its floor than a 4090: the time the step spends
    beyond its bytes (this run's profile) set against this run's floor and against the
    floor the seed post reports for an RTX 4090 (as reported, cited)."""
    a = ans["models"].get(model)
    if not a or not a.get("ops") or not a["floor_ms"]:
        return None
    b = beyond(a["ops"])
    s = SEED_4090
    return {"beyond_ms": b["ms"], "us_per_launch": b["us_per_launch"],
            "launches": b["launches"], "floor_ms": a["floor_ms"],
            "share_here": b["ms"] / a["floor_ms"], "share_4090": b["ms"] / s["floor_ms"],
            "seed_x": s["ms"] / s["floor_ms"], "seed_floor_ms": s["floor_ms"],
            "bandwidth_x": s["floor_ms"] / a["floor_ms"]}
