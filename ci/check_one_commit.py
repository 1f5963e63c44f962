#!/usr/bin/env python3
"""Fail unless the executed chapters and the results files the book shows come from one
GPU run: one commit (and, where recorded, one run id).

What is read:

* every executed chapter, ``notebooks/NN_*.ipynb``: ``metadata.onelaunch.commit`` (and
  ``run_id``), written by ``ci/notebooks.py gpu``;
* in the results folder the book draws (``results/<gpu>/``, the GPU of the ladder page:
  ``onelaunch.report.ladder_file.ladder_sources``), every file a chapter writes or reads (found in the
  chapters' code: ``results.write("NAME"``, ``results.load("NAME"``, ``write_ladder``) and
  ``oracle_check.json`` (the ladder page reads it): ``meta.commit`` (and ``meta.run``) and
  each row's ``commit`` (and ``run``) where rows carry one.

Each machine kind is one run of its own: a chapter whose front matter needs several GPUs
(``onelaunch: needs: 2 GPUs ...``, chapter 7) goes with ``results/<gpu>x2/``, which
a two-GPU host writes, and may come from another commit than the one-GPU chapters
and ``results/<gpu>/``. Prints one line per source, and exits 1 naming those whose
commit is not the commonest one of their machine kind (or whose run differs). ``ci/gpu_book.sh`` runs it after a full run; CI runs it on the
committed tree (tests/test_one_commit.py).

    python ci/check_one_commit.py [--root DIR]
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# files the book shows that no chapter names in its code
ALSO_SHOWN = ("ladder", "oracle_check")


def shown_results(root: Path) -> list[str]:
    """Names of the results files the chapters write or read, from their code."""
    names = set(ALSO_SHOWN)
    for src in sorted((root / "notebooks").glob("[0-9][0-9]_*.md")):
        text = src.read_text()
        names |= set(re.findall(r"results\.(?:write|load)\(\s*[\"'](\w+)[\"']", text))
        if "write_ladder(" in text:
            names.add("ladder")
    return sorted(names)


def _preferred_gpus() -> tuple:
    """``onelaunch.report.ladder_file.PREFERRED_GPUS``, read without importing torch."""
    import ast
    tree = ast.parse((ROOT / "onelaunch" / "report" / "ladder_file.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PREFERRED_GPUS"
                                                for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def book_gpu(root: Path) -> str | None:
    """The results folder the book draws: the ladder page's first choice, never the CPU's."""
    have = sorted(p.parent.name for p in (root / "results").glob("*/ladder.json"))
    if not have:
        have = sorted(p.name for p in (root / "results").iterdir() if p.is_dir()) \
            if (root / "results").exists() else []
    have = [g for g in have if g != "cpu"]
    preferred = _preferred_gpus()
    have.sort(key=lambda g: (g not in preferred, g))
    return have[0] if have else None


def gpus_needed(src: Path) -> int:
    """GPUs a chapter's front matter says it needs (``needs: 2 GPUs ...``; default 1)."""
    if not src.exists():
        return 1
    m = re.search(r"^\s*needs:\s*(\d+)\s*GPUs", src.read_text(), re.M)
    return int(m.group(1)) if m else 1


def sources(root: Path) -> list[dict]:
    """One entry per thing that names a commit: ``{what, commit, run, kind}``; ``kind``
    is the machine kind (``"1"``, ``"2"``: GPUs) whose run it belongs to."""
    out = []
    for nb in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        m = json.loads(nb.read_text()).get("metadata", {}).get("onelaunch", {})
        out.append({"what": f"notebooks/{nb.name}", "commit": m.get("commit"),
                    "run": m.get("run_id"), "kind": str(gpus_needed(nb.with_suffix(".md")))})
    gpu = book_gpu(root)
    if gpu is None:
        return out
    # the same GPU's multi-GPU results (results/h200x2/: chapter 7) are their own run
    folders = [gpu] + sorted(p.name for p in (root / "results").glob(f"{gpu}x[0-9]*") if p.is_dir())
    for folder, name in ((f, n) for f in folders for n in shown_results(root)):
        p = root / "results" / folder / f"{name}.json"
        if not p.exists():
            continue
        data = json.loads(p.read_text())
        meta = data.get("meta", {})
        rel = f"results/{folder}/{name}.json"
        kind = folder[len(gpu) + 1:] if folder != gpu else "1"
        out.append({"what": rel, "commit": meta.get("commit"), "run": meta.get("run"),
                    "kind": kind})
        rows = [r for r in data.get("rows", []) if isinstance(r, dict)]
        by = collections.Counter((r.get("commit"), r.get("run")) for r in rows
                                 if r.get("commit") or r.get("run"))
        for (c, run), n in sorted(by.items(), key=lambda kv: str(kv[0])):
            out.append({"what": f"{rel}, {n} row(s)", "commit": c or meta.get("commit"),
                        "run": run, "kind": kind})
    return out


def problems(found: list[dict]) -> list[str]:
    """Lines naming every source off the commonest commit or run of its machine kind
    (empty: one run per kind)."""
    kinds = sorted({s.get("kind", "1") for s in found})
    if len(kinds) > 1:
        return [p for k in kinds for p in problems(
            [dict(s, kind=None) for s in found if s.get("kind", "1") == k])]
    if not found:
        return []
    commits = collections.Counter(str(s["commit"]) for s in found)
    main = commits.most_common(1)[0][0]
    runs = collections.Counter(s["run"] for s in found if s["run"])
    main_run = runs.most_common(1)[0][0] if runs else None
    bad = []
    for s in found:
        if str(s["commit"]) != main:
            bad.append(f"{s['what']}: commit {s['commit']}, not {main}")
        elif main_run and s["run"] and s["run"] != main_run:
            bad.append(f"{s['what']}: run {s['run']}, not {main_run}")
    if len(commits) == 1 and "None" in commits:
        bad.append("no commit recorded anywhere")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this one)")
    a = ap.parse_args(argv)
    found = sources(a.root.resolve())
    for s in found:
        print(f"  {s['what']:48s} {s['commit']}" + (f"  run {s['run']}" if s["run"] else "")
              + (f"  ({s['kind']} GPUs)" if s.get("kind") not in (None, "1") else ""))
    bad = problems(found)
    if bad:
        print(f"[check_one_commit] the book mixes runs ({len(bad)} source(s) off the main one):",
              file=sys.stderr)
        print("\n".join("  " + b for b in bad), file=sys.stderr)
        print("  rerun every chapter in one GPU run: bash ci/gpu_book.sh", file=sys.stderr)
        return 1
    per = {}
    for s in found:
        per.setdefault(s.get("kind", "1"), s["commit"])
    print(f"[check_one_commit] {len(found)} source(s), one commit per machine kind: "
          + ", ".join(f"{k} GPU(s) {c}" for k, c in sorted(per.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
