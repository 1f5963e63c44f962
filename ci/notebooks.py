#!/usr/bin/env python3
"""Chapters: jupytext source -> notebook -> papermill, and the staged book sources.

    python ci/notebooks.py cpu   [CHAPTER ...] [--out DIR]   # CPU smoke run (scratch)
    python ci/notebooks.py gpu   [CHAPTER ...]               # GPU run -> notebooks/*.ipynb
    python ci/notebooks.py stage [--reuse]                   # book sources -> _build/src
    python ci/notebooks.py list                              # chapters and GPU parameters

A chapter is ``notebooks/<stem>.md`` (MyST markdown, jupytext) whose first code cell is
tagged ``parameters``. Its defaults are the CPU smoke run; the ``gpu`` set is the
``onelaunch: gpu_parameters:`` mapping in the chapter's front matter (injected with
papermill, like ``papermill -p``). ``-p NAME VALUE`` (VALUE as YAML) adds to either set.

* ``cpu`` executes into a scratch folder (default ``_build/cpu-notebooks/``, ignored) and
  exits non-zero if any cell of any chapter raises.
* ``gpu`` writes the executed notebooks to ``notebooks/<stem>.ipynb``: the committed
  outputs the book renders. The commit they come from is ``$ONELAUNCH_COMMIT`` or ``git
  rev-parse HEAD`` and is stored in the notebook's metadata (``onelaunch.commit``), with
  the run's id (``onelaunch.run``: one id for every chapter of one invocation, also in
  every results file the chapters write), the chapter's wall time and torch's peak GPU
  memory. GPU memory is capped at ``--mem-gb`` (default 24 GB, an RTX 4090's; 0: no cap)
  through ``ONELAUNCH_GPU_MEM_GB`` (:mod:`onelaunch.memcap`), applied in each chapter's
  kernel by an IPython startup file before the first cell.
* ``stage`` lays out the book's sources in ``_build/src`` for ``jupyter-book build``: the
  config, ``book/``, ``_static/`` and, per chapter, the committed GPU notebook (with a
  visible note if the package changed since its run) or else a CPU execution (reused
  from the scratch folder when its source and the package are unchanged, with
  ``--reuse``). Staging keeps CPU smoke outputs out of ``notebooks/``, where only GPU
  runs are committed. A GPU notebook whose code matches its source is staged with the
  source's prose (``ci/refresh_prose.py``, applied to the staged copy), so a prose edit
  shows in the book without a rerun and without touching the committed notebook.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
from chapter_source import read_source  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
SCRATCH = ROOT / "_build" / "cpu-notebooks"
STAGE = ROOT / "_build" / "src"
DEFAULT_GPU = {"device": "cuda"}
DEFAULT_GPU_MEM_GB = 24      # an RTX 4090: every chapter must fit (book/run_yourself.md)


def chapters(names=()) -> list[Path]:
    """Chapter sources, in order: ``notebooks/NN_*.md``, or the ones named (stem or path)."""
    found = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.md"))
    if not names:
        return found
    out = []
    for n in names:
        stem = Path(n).stem
        hit = [p for p in found if p.stem == stem]
        if not hit:
            sys.exit(f"no chapter {n!r}; chapters: {', '.join(p.stem for p in found)}")
        out += hit
    return out


def gpu_parameters(nb) -> dict:
    p = dict(DEFAULT_GPU)
    p.update(nb.metadata.get("onelaunch", {}).get("gpu_parameters", {}) or {})
    return p


def package_hash() -> str:
    h = hashlib.sha256()
    for p in sorted((ROOT / "onelaunch").rglob("*.py")):
        h.update(p.relative_to(ROOT).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def source_hash(src: Path) -> str:
    return hashlib.sha256(src.read_bytes()).hexdigest()[:16]


def commit() -> str:
    env = os.environ.get("ONELAUNCH_COMMIT")
    if env:
        return env[:12]
    import subprocess
    try:
        return subprocess.check_output(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                                       text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


_IPYTHONDIR: list[Path] = []


def kernel_startup() -> Path:
    """An IPython directory whose startup file applies the memory cap and records the
    peak (:data:`onelaunch.memcap.KERNEL_STARTUP`); papermill's kernel inherits
    ``IPYTHONDIR``, so it runs before every chapter's first cell. Made once a process."""
    import tempfile
    if _IPYTHONDIR:
        return _IPYTHONDIR[0]
    sys.path.insert(0, str(ROOT))
    from onelaunch.memcap import KERNEL_STARTUP
    d = Path(tempfile.mkdtemp(prefix="onelaunch-ipython-"))
    (d / "profile_default" / "startup").mkdir(parents=True)
    (d / "profile_default" / "startup" / "00-onelaunch.py").write_text(KERNEL_STARTUP)
    _IPYTHONDIR.append(d)
    return d


def execute(src: Path, out: Path, run: str, extra: dict, timeout: int) -> float:
    """Execute one chapter with papermill; raises if a cell raises. Returns seconds."""
    import tempfile

    import nbformat
    import papermill as pm
    nb = read_source(src)
    params = gpu_parameters(nb) if run == "gpu" else {}
    params.update(extra)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.input.ipynb")
    nbformat.write(nb, tmp)
    t0 = time.time()
    env_commit = commit()
    os.environ.setdefault("ONELAUNCH_COMMIT", env_commit)
    # the kernel imports the package from this tree (installed or not: the GPU machine
    # gets a bare copy of the tree)
    pp = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([pp] if pp else []))
    os.environ["IPYTHONDIR"] = str(kernel_startup())
    if run == "cpu":
        # the chapters on the CPU turn the interpreter on themselves; on before the kernel
        # starts, the package's import at start-up sees it and spares the interpreter its
        # repeated set-up (onelaunch/interpreter.py)
        os.environ["TRITON_INTERPRET"] = "1"
    fd, peak_file = tempfile.mkstemp(prefix=f"{src.stem}-peak-", suffix=".json")
    os.close(fd)
    os.environ["ONELAUNCH_PEAK_FILE"] = peak_file
    try:
        pm.execute_notebook(str(tmp), str(out), parameters=params, kernel_name="python3",
                            cwd=str(NOTEBOOKS), progress_bar=False, log_output=False,
                            execution_timeout=timeout, report_mode=False)
    finally:
        tmp.unlink(missing_ok=True)
        peak_text = Path(peak_file).read_text()
        Path(peak_file).unlink(missing_ok=True)
    seconds = time.time() - t0
    done = nbformat.read(out, as_version=4)
    done.metadata["onelaunch"] = {
        **done.metadata.get("onelaunch", {}),
        "run": run, "run_id": os.environ.get("ONELAUNCH_RUN"), "commit": env_commit,
        "parameters": params,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1), "source_hash": source_hash(src),
        "package_hash": package_hash(),
        # torch's peak in the chapter's kernel, and the cap it ran under (GB = GiB)
        "gpu_memory": json.loads(peak_text) if peak_text.strip() else None,
        "gpu_mem_cap_gb": float(os.environ["ONELAUNCH_GPU_MEM_GB"])
        if os.environ.get("ONELAUNCH_GPU_MEM_GB") else None,
    }
    nbformat.write(done, out)
    if run == "gpu":
        print(memory_line(src.stem, done.metadata["onelaunch"]), flush=True)
    return seconds


def memory_line(stem: str, m: dict) -> str:
    """What the run log says of a chapter's memory: its kernel's peak and the cap it
    applied, or a warning when the kernel recorded no peak or did not apply the cap asked
    (the startup file's errors reach only the kernel's log)."""
    mem, asked = m.get("gpu_memory") or {}, m.get("gpu_mem_cap_gb")
    if not mem:
        return f"[notebooks]   WARNING {stem}: its kernel recorded no peak GPU memory"
    line = (f"[notebooks]   {stem}: peak {mem.get('peak_allocated_gb')} GB allocated, "
            f"{mem.get('peak_reserved_gb')} GB reserved, cap {mem.get('cap_gb')} GB")
    if asked and mem.get("cap_gb") != asked:
        line += f"; WARNING: {asked:g} GB was asked, the kernel applied none"
    return line


def run_all(run: str, names, out_dir: Path, extra: dict, timeout: int,
            mem_gb: float | None = None) -> int:
    # one id for every chapter of this invocation (and every results file and ladder row
    # they write): a chapter's figure draws this run's rows only (ladder_file.chapter_rows)
    os.environ.setdefault("ONELAUNCH_RUN", ("" if run == "gpu" else f"{run}-") + f"{commit()}-"
                          f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}")
    if run == "gpu":
        gb = DEFAULT_GPU_MEM_GB if mem_gb is None else mem_gb
        if gb:
            os.environ["ONELAUNCH_GPU_MEM_GB"] = f"{gb:g}"
        else:
            os.environ.pop("ONELAUNCH_GPU_MEM_GB", None)
        print(f"[notebooks] run {os.environ['ONELAUNCH_RUN']}; GPU memory cap "
              f"{os.environ.get('ONELAUNCH_GPU_MEM_GB', 'none')} GB", flush=True)
    failed = []

    def run_in_order(srcs):
        for src in srcs:
            out = out_dir / f"{src.stem}.ipynb"
            shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
            print(f"[notebooks] {run}: {src.relative_to(ROOT)} -> {shown}", flush=True)
            try:
                s = execute(src, out, run, extra, timeout)
                print(f"[notebooks]   {src.stem} ok in {s:.0f} s", flush=True)
            except Exception as e:  # papermill's error names the cell and the exception
                failed.append(src.stem)
                msg = str(e).strip().splitlines()
                print(f"[notebooks]   {src.stem} FAILED: {type(e).__name__}", file=sys.stderr)
                print("\n".join(msg[-40:]), file=sys.stderr)

    todo = chapters(names)
    if run == "cpu":
        # The CPU smoke run uses both cores: the chapters that merge rows into the shared
        # ladder file run in order, the others (their own results files only) beside them.
        # The GPU run keeps strict chapter order.
        import threading
        shared = [s for s in todo if "write_ladder(" in s.read_text()]
        alone = [s for s in todo if s not in shared]
        side = threading.Thread(target=run_in_order, args=(alone,))
        side.start()
        run_in_order(shared)
        side.join()
    else:
        run_in_order(todo)
    if failed:
        print(f"[notebooks] {len(failed)} chapter(s) raised: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# ---- staging the book -----------------------------------------------------------------
def _fresh_cpu_run(src: Path, out: Path) -> bool:
    if not out.exists():
        return False
    import nbformat
    m = nbformat.read(out, as_version=4).metadata.get("onelaunch", {})
    return m.get("source_hash") == source_hash(src) and m.get("package_hash") == package_hash()


def _insert_note(nb, text: str):
    import nbformat
    cell = nbformat.v4.new_markdown_cell(text)
    cell.metadata["tags"] = ["onelaunch-note"]
    # after the title cell, so the note sits right under the chapter's heading
    at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells.insert(at, cell)


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


def stage(reuse: bool, timeout: int) -> int:
    import nbformat
    sys.path.insert(0, str(ROOT))
    from onelaunch.report.chapter import staleness_note
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "notebooks").mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / name, STAGE / name)
    shutil.copytree(ROOT / "book", STAGE / "book")
    if (ROOT / "_static").exists():
        shutil.copytree(ROOT / "_static", STAGE / "_static")
    rc = 0
    for src in chapters():
        gpu_nb = NOTEBOOKS / f"{src.stem}.ipynb"
        dest = STAGE / "notebooks" / gpu_nb.name
        if gpu_nb.exists():
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
            note = staleness_note(src.stem, nb.metadata.get("onelaunch", {}).get("commit"))
            if note:
                _insert_note(nb, note)
            print(f"[stage] {src.stem}: GPU run" + ("" if fresh else ", prose as run (code "
                  "differs, or the new prose reads values the run did not glue)")
                  + (", package changed since (note added)" if note else ""))
            nbformat.write(nb, dest)
            continue
        out = SCRATCH / gpu_nb.name
        if not (reuse and _fresh_cpu_run(src, out)):
            print(f"[stage] {src.stem}: no GPU run; executing on the CPU", flush=True)
            try:
                execute(src, out, "cpu", {}, timeout)
            except Exception as e:
                print(f"[stage] {src.stem} FAILED: {e}", file=sys.stderr)
                rc = 1
                continue
        else:
            print(f"[stage] {src.stem}: no GPU run; reusing the CPU run in {out.relative_to(ROOT)}")
        shutil.copy2(out, dest)
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["cpu", "gpu", "stage", "list"])
    ap.add_argument("chapters", nargs="*", help="chapter stems (default: all)")
    ap.add_argument("--out", type=Path, help="output folder (cpu: default _build/cpu-notebooks)")
    ap.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="extra parameter (VALUE parsed as YAML)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    ap.add_argument("--reuse", action="store_true",
                    help="stage: reuse CPU runs whose source and package are unchanged")
    ap.add_argument("--mem-gb", type=float, default=None,
                    help=f"gpu: cap torch's GPU memory at this many GB (default "
                         f"{DEFAULT_GPU_MEM_GB}, an RTX 4090; 0: no cap)")
    a = ap.parse_args(argv)
    import yaml
    extra = {k: yaml.safe_load(v) for k, v in a.p}
    if a.what == "list":
        for src in chapters(a.chapters):
            print(f"{src.stem}: gpu parameters {json.dumps(gpu_parameters(read_source(src)))}")
        return 0
    if a.what == "stage":
        return stage(a.reuse, a.timeout)
    out_dir = a.out or (SCRATCH if a.what == "cpu" else NOTEBOOKS)
    return run_all(a.what, a.chapters, out_dir.resolve(), extra, a.timeout, a.mem_gb)


if __name__ == "__main__":
    sys.exit(main())
