#!/usr/bin/env python3
"""Staging the book (``python ci/notebooks.py stage``): the book's sources laid out in
``_build/src`` for ``jupyter-book build``, every page that computes already executed.

Per chapter, the committed GPU notebook (with its source's prose, one line of what ran
and, if the package changed since its run, one line saying so) or else a CPU execution
(reused from ``_build/cpu-notebooks`` when its source, the package and the parameters
are unchanged, with ``--reuse``); then the book's own pages that compute (``book/*.md``
with a kernelspec), executed with papermill in the staged tree. ``extra`` parameters
(``-p results_gpu rtx4090``) go to every page executed here.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notebooks import (NOTEBOOKS, ROOT, SCRATCH, STAGE, chapters, commit,  # noqa: E402
                       execute, hide_parameters, in_parallel, kernel_env, package_hash,
                       say, source_hash)


def _params_text(params: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in (params or {}).items()
                     if v not in (None, "") and not isinstance(v, (list, dict)))


def ran_note(meta: dict, gpu_params: dict | None = None) -> str:
    """The one line a page shows of what ran: the GPU run's parameters, or that the code
    ran on a CPU at tiny shapes and the numbers are those of the GPU run the page names
    (with the parameters a GPU run gives it, ``gpu_params``)."""
    if meta.get("run") == "gpu":
        return (f"This page ran on the GPU ({_params_text(meta.get('parameters'))}) at "
                f"commit `{meta.get('commit')}`.")
    on_gpu = _params_text(gpu_params)
    return ("This page's code ran on a CPU at tiny shapes, to show that it runs; its "
            "numbers are those of the GPU run it names"
            + (f", which runs it with {on_gpu}." if on_gpu else "."))


def _fresh_cpu_run(src: Path, out: Path, params: dict | None = None) -> bool:
    if not out.exists():
        return False
    import nbformat
    m = nbformat.read(out, as_version=4).metadata.get("onelaunch", {})
    return (m.get("source_hash") == source_hash(src) and m.get("package_hash") ==
            package_hash() and (m.get("parameters") or {}) == (params or {}))


def _insert_note(nb, text: str):
    import nbformat
    cell = nbformat.v4.new_markdown_cell(text)
    cell.metadata["tags"] = ["onelaunch-note"]
    # under the title and the question that opens the chapter
    at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells.insert(at, cell)


def _note(text: str) -> str:
    return f"*{text}*"


def _refresh_prose(nb_path: Path) -> bool:
    import contextlib
    import io
    from refresh_prose import refresh
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return refresh(nb_path)


def _drop_repeated_glue(nb) -> list[str]:
    """Later outputs that glue a name already glued with the same value (a chapter that
    glues a default twice): myst-nb would warn and the strict build fail, though the page
    reads the same. A name glued twice with *different* values is left for the build to
    reject."""
    seen, dropped = {}, []
    for cell in nb.cells:
        keep = []
        for o in cell.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is not None:
                value = json.dumps(o.get("data", {}), sort_keys=True)
                if seen.get(name) == value:
                    dropped.append(name)
                    continue
                seen.setdefault(name, value)
            keep.append(o)
        if "outputs" in cell:
            cell["outputs"] = keep
    return dropped


def _stage_gpu_run(src: Path, gpu_nb: Path, dest: Path) -> None:
    """A committed GPU notebook, staged with its source's prose, its parameters hidden,
    one line of what ran and, if the package changed since, one line saying so."""
    import nbformat
    from onelaunch.report.chapter import staleness_note
    # the source's prose over the executed code and outputs (code must match:
    # check_stale), applied to the staged copy; the committed notebook is untouched
    shutil.copy2(src, dest.with_suffix(".md"))
    shutil.copy2(gpu_nb, dest)
    fresh = _refresh_prose(dest)
    dest.with_suffix(".md").unlink()
    nb = nbformat.read(dest, as_version=4)
    dropped = _drop_repeated_glue(nb)
    if dropped:
        print(f"[stage] {src.stem}: glued twice with the same value, kept once: "
              + ", ".join(dropped))
    meta = nb.metadata.get("onelaunch", {})
    hide_parameters(nb)
    note = staleness_note(src.stem, meta.get("commit"))
    _insert_note(nb, _note(ran_note(meta)) + (f"\n\n{note}" if note else ""))
    print(f"[stage] {src.stem}: GPU run" + ("" if fresh else ", prose as run (code "
          "differs, or the new prose reads values the run did not glue)")
          + (", package changed since (note added)" if note else ""))
    nbformat.write(nb, dest)


def _stage_cpu_run(src: Path, run: Path, dest: Path) -> None:
    import nbformat
    from chapter_source import read_source
    from notebooks import gpu_parameters
    nb = nbformat.read(run, as_version=4)
    hide_parameters(nb)
    _drop_repeated_glue(nb)
    _insert_note(nb, _note(ran_note(nb.metadata.get("onelaunch", {}),
                                    gpu_parameters(read_source(src)))))
    nbformat.write(nb, dest)


def pages() -> list[Path]:
    """The book's own pages that compute (``book/*.md`` with a kernelspec): executed
    when the book is staged, after the chapters."""
    return sorted(p for p in (ROOT / "book").glob("*.md")
                  if "kernelspec:" in p.read_text().split("\n---", 1)[0])


def _stage_page(src: Path, extra: dict, timeout: int) -> None:
    """Execute one of the book's pages in the staged tree (so that its paths to the
    staged chapters hold) and replace its source there with the executed notebook."""
    import nbformat
    staged = STAGE / "book" / src.name
    out = staged.with_suffix(".ipynb")
    params = {k: v for k, v in extra.items() if k in src.read_text()}
    cwd = str(STAGE / "book")
    kernel_env()
    import papermill as pm
    from chapter_source import read_source
    nb = read_source(src)
    tmp = out.with_name(f".{out.stem}.input.ipynb")
    nbformat.write(nb, tmp)
    try:
        pm.execute_notebook(str(tmp), str(out), parameters=params, kernel_name="python3",
                            cwd=cwd, progress_bar=False, log_output=False,
                            execution_timeout=timeout, report_mode=False)
    finally:
        tmp.unlink(missing_ok=True)
    done = nbformat.read(out, as_version=4)
    hide_parameters(done)
    done.metadata.pop("mystnb", None)        # executed here: the build only renders it
    _drop_repeated_glue(done)
    nbformat.write(done, out)
    staged.unlink()
    print(f"[stage] {src.relative_to(ROOT)}: executed" + (f" with {params}" if params else ""))


def stage(reuse: bool, timeout: int, extra: dict | None = None) -> int:
    extra = dict(extra or {})
    sys.path.insert(0, str(ROOT))
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "notebooks").mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / name, STAGE / name)
    shutil.copytree(ROOT / "book", STAGE / "book")
    if (ROOT / "_static").exists():
        shutil.copytree(ROOT / "_static", STAGE / "_static")
    # the package's source, for the pages' {literalinclude} of the kernels they show
    shutil.copytree(ROOT / "onelaunch", STAGE / "onelaunch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    os.environ.setdefault("ONELAUNCH_RUN", f"cpu-{commit()}-"
                          f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}")
    rc, on_cpu = 0, []
    for src in chapters():
        gpu_nb = NOTEBOOKS / f"{src.stem}.ipynb"
        if gpu_nb.exists():
            _stage_gpu_run(src, gpu_nb, STAGE / "notebooks" / gpu_nb.name)
        else:
            on_cpu.append(src)
    todo = [s for s in on_cpu if not (reuse and _fresh_cpu_run(
        s, SCRATCH / f"{s.stem}.ipynb", extra))]
    failed = []

    def run_in_order(srcs):
        for src in srcs:
            say(f"[stage] {src.stem}: no GPU run; executing on the CPU")
            try:
                secs = execute(src, SCRATCH / f"{src.stem}.ipynb", "cpu", extra, timeout)
                say(f"[stage]   {src.stem} ok in {secs:.0f} s")
            except Exception as e:
                print(f"[stage] {src.stem} FAILED: {e}", file=sys.stderr)
                failed.append(src)
    in_parallel(todo, run_in_order)
    for src in on_cpu:
        if src in failed:
            rc = 1
            continue
        if src not in todo:
            print(f"[stage] {src.stem}: no GPU run; reusing the CPU run in "
                  f"{SCRATCH.relative_to(ROOT)}")
        _stage_cpu_run(src, SCRATCH / f"{src.stem}.ipynb",
                       STAGE / "notebooks" / f"{src.stem}.ipynb")
    for page in pages():
        try:
            _stage_page(page, extra, timeout)
        except Exception as e:
            print(f"[stage] {page.name} FAILED: {e}", file=sys.stderr)
            rc = 1
    return rc
