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

A results file from another run than the commonest one is accepted only where every page
that reads it names that run: its executed page (the GPU run's ``notebooks/NN_*.ipynb``,
or one in a ``--pages`` folder: ``_build/cpu-notebooks``, ``_build/html/notebooks``)
shows the file's run id or commit; a page with no executed page names it in its code,
through ``chapter.numbers_line(gpu, "NAME")`` (the line that prints the file's run). An
unnamed mix fails.

Each machine kind is one run of its own: a chapter whose front matter needs several GPUs
(``onelaunch: needs: 2 GPUs ...``, chapter 7) goes with ``results/<gpu>x2/``, which
a two-GPU host writes, and may come from another commit than the one-GPU chapters
and ``results/<gpu>/``. Prints one line per source, and exits 1 naming those whose
commit is not the commonest one of their machine kind (or whose run differs). ``ci/gpu_book.sh`` runs it after a full run; CI runs it on the
committed tree (tests/test_one_commit.py).

    python ci/check_one_commit.py [--root DIR] [--pages DIR ...]
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
# files a page reads through a report module (onelaunch/report/answer.py's answer())
READ_THROUGH = {"answer.answer(": ("ladder", "profile", "tp")}
LOADS = re.compile(r"results\.(?:load|load_this_run)\(\s*[\"'](\w+)[\"']")
NAMED = re.compile(r"numbers_line\(\s*[^,()]+(?:\([^()]*\))?\s*(?:,\s*[\"'](\w+)[\"'])?")


def page_reads(root: Path) -> dict[str, set[str]]:
    """The results files each chapter's code reads, by page (``notebooks/NN_x.md``)."""
    out = {}
    for src in sorted((root / "notebooks").glob("[0-9][0-9]_*.md")):
        text = src.read_text()
        names = set(LOADS.findall(text)) | {n or "ladder" for n in NAMED.findall(text)}
        if "load_ladder(" in text:
            names.add("ladder")
        for call, more in READ_THROUGH.items():
            if call in text:
                names |= set(more)
        out[f"notebooks/{src.name}"] = names
    return out


def shown_results(root: Path) -> list[str]:
    """Names of the results files the chapters write or read, from their code."""
    names = set(ALSO_SHOWN)
    for src in sorted((root / "notebooks").glob("[0-9][0-9]_*.md")):
        text = src.read_text()
        names |= set(re.findall(r"results\.(?:write|load)\(\s*[\"'](\w+)[\"']", text))
        if "write_ladder(" in text:
            names.add("ladder")
    return sorted(names | set().union(*page_reads(root).values()))


def executed_text(root: Path, page: str, pages: list[Path]) -> str | None:
    """The text of ``page``'s executed version: the GPU run's notebook beside it, else
    one in a ``pages`` folder (``.ipynb`` or built ``.html``); None where there is none."""
    stem = Path(page).stem
    for p in [root / "notebooks" / f"{stem}.ipynb"] + [
            Path(d) / f"{stem}{ext}" for d in pages for ext in (".ipynb", ".html")]:
        if p.exists() and p.suffix == ".ipynb":
            return _shown_text(json.loads(p.read_text()))
        if p.exists():
            return p.read_text(errors="replace")
    return None


def _shown_text(nb: dict) -> str:
    """What an executed notebook shows: its markdown and its cells' outputs (its
    metadata, which names the page's own run, is left out)."""
    out = []
    for c in nb.get("cells", []):
        if c.get("cell_type") == "markdown":
            out.append("".join(c.get("source", "")))
        for o in c.get("outputs", []):
            out.append("".join(o.get("text", "")))
            out += ["".join(v) if isinstance(v, list) else str(v)
                    for v in (o.get("data") or {}).values()]
    return "\n".join(out)


def names_run(root: Path, page: str, name: str, src: dict, pages: list[Path]) -> bool:
    """Whether ``page`` names the run of results file ``name`` (``src``: its entry)."""
    text = executed_text(root, page, pages)
    if text is not None:
        return any(k and str(k) in text for k in (src.get("run"), src.get("commit")))
    code = (root / page).read_text()
    return name in {n or "ladder" for n in NAMED.findall(code)}


def accept_named(root: Path, found: list[dict], bad: list[str],
                 pages: list[Path]) -> tuple[list[str], list[str]]:
    """(problems left, lines saying which off-run file which page names): a whole results
    file off the main run passes where every page that reads it names its run."""
    reads = page_reads(root)
    by_what = {s["what"]: s for s in found}
    left, named = [], []
    for line in bad:
        src = by_what.get(line.split(": ")[0])
        readers = [p for p, names in reads.items() if src and src.get("name") in names]
        if src and src.get("name") and readers and all(
                names_run(root, p, src["name"], src, pages) for p in readers):
            named.append(f"{src['what']}: run {src['run'] or src['commit']}, named by "
                         + ", ".join(readers))
        else:
            left.append(line)
    return left, named


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
                    "kind": kind, "name": name})
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
    ap.add_argument("--pages", type=Path, action="append", default=[],
                    help="a folder of executed or built pages (NN_x.ipynb or NN_x.html)")
    a = ap.parse_args(argv)
    found = sources(a.root.resolve())
    for s in found:
        print(f"  {s['what']:48s} {s['commit']}" + (f"  run {s['run']}" if s["run"] else "")
              + (f"  ({s['kind']} GPUs)" if s.get("kind") not in (None, "1") else ""))
    bad, named = accept_named(a.root.resolve(), found, problems(found), a.pages)
    for line in named:
        print(f"  from another run, named on its page: {line}")
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
