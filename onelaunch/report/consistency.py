"""One value per quantity per run, across the book: every page that prints a quantity
of a run (a rung's ms per token, a floor, a ratio) must print the same value, and the
same as the run's results file.

A *fact* is ``{"where", "run", "key", "text"}``: ``key`` is ``(model, rung, ctx,
quantity)`` as strings, ``text`` the value as printed. Pages give facts through the
glue they publish with a key (:func:`onelaunch.report.chapter.glue` with ``key=`` and
``run=``: :func:`notebook_facts`); the results files give the run's own values
(:func:`ladder_facts`). :func:`conflicts` names every key of one run printed with two
values. Two printed values agree when the more precise one, rounded to the other's
decimals, reads the same ("1.176" and "1.18" agree; "1.18" and "1.2" agree; "1.18" and
"1.19" do not).
"""
from __future__ import annotations

import re
from pathlib import Path

_NUM = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _key(model, rung, ctx, quantity) -> tuple:
    return tuple(str(k) for k in (model, rung, ctx, quantity))


def number(text: str) -> tuple[float, int] | None:
    """The first number in ``text`` and its decimals (``"6.5% slower"`` -> (6.5, 1))."""
    m = _NUM.search(str(text))
    if not m:
        return None
    t = m.group(0).replace(",", "")
    return float(t), len(t.split(".")[1]) if "." in t else 0


def agree(a: str, b: str) -> bool:
    """Whether two printed values are one value at their precisions."""
    x, y = number(a), number(b)
    if x is None or y is None:
        return str(a).strip() == str(b).strip()
    (va, da), (vb, db) = x, y
    d = min(da, db)
    return abs(round(va, d) - round(vb, d)) < 0.5 * 10 ** -d + 1e-9


def notebook_facts(nb, where: str) -> list[dict]:
    """The keyed glue of one executed notebook (an ``nbformat`` notebook)."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            md = o.get("metadata", {}) or {}
            key = (md.get("onelaunch") or {}).get("key")
            if not key:
                continue
            data = o.get("data", {})
            text = next((v for k, v in data.items() if k.endswith("text/plain")), None)
            out.append({"where": f"{where}::{md.get('scrapbook', {}).get('name')}",
                        "run": (md.get("onelaunch") or {}).get("run"),
                        "key": tuple(str(k) for k in key), "text": str(text)})
    return out


def ladder_facts(data: dict, where: str) -> list[dict]:
    """A ladder file's values (``results/<gpu>/ladder.json``): each row's ms per token
    and ratio to its floor, each model's floor and read bandwidth, with full precision."""
    from .results import run_key
    out = []
    for r in data.get("rows", []):
        run, ms, floor = run_key(r), r.get("ms_per_token"), r.get("floor_ms")
        base = {"where": f"{where} ({r['model']}, {r['rung']})", "run": run}
        if ms:
            out.append({**base, "key": _key(r["model"], r["rung"], r["ctx"], "ms_per_token"),
                        "text": repr(ms)})
        if ms and floor:
            out.append({**base, "key": _key(r["model"], r["rung"], r["ctx"], "x_floor"),
                        "text": repr(ms / floor)})
    for (model, ctx, run), floors in _by_model(data).items():
        floors.sort()
        out.append({"where": f"{where} ({model} floor)", "run": run,
                    "key": _key(model, None, ctx, "floor_ms"),
                    "text": repr(floors[len(floors) // 2])})
    return out


def _by_model(data: dict) -> dict:
    from .results import run_key
    by = {}
    for r in data.get("rows", []):
        if isinstance(r.get("floor_ms"), (int, float)):
            by.setdefault((r["model"], r["ctx"], run_key(r)), []).append(r["floor_ms"])
    return by


def conflicts(facts: list[dict]) -> list[str]:
    """One line per (run, key) printed with values that are not one value."""
    groups: dict = {}
    for f in facts:
        groups.setdefault((f["run"], tuple(f["key"])), []).append(f)
    out = []
    for (run, key), fs in groups.items():
        bad = [(a, b) for i, a in enumerate(fs) for b in fs[i + 1:]
               if not agree(a["text"], b["text"])]
        if bad:
            a, b = bad[0]
            out.append(f"{', '.join(key)} of run {run}: {a['text']} ({a['where']}) but "
                       f"{b['text']} ({b['where']})")
    return out


def book_facts(notebooks: list[Path], results_root: Path) -> list[dict]:
    """Every keyed glue of ``notebooks`` and every ladder file under ``results_root``."""
    import json

    import nbformat
    facts = []
    for p in notebooks:
        facts += notebook_facts(nbformat.read(p, as_version=4), p.stem)
    for p in sorted(Path(results_root).glob("*/ladder.json")):
        facts += ladder_facts(json.loads(p.read_text()), str(p.relative_to(results_root)))
    return facts
