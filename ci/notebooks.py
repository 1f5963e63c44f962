#!/usr/bin/env python3
"""Chapters: jupytext source -> notebook -> papermill, and the staged book sources.

    python ci/notebooks.py cpu   [CHAPTER ...] [--out DIR]   # CPU smoke run (scratch)
    python ci/notebooks.py gpu   [CHAPTER ...]               # GPU run -> notebooks/*.ipynb
    python ci/notebooks.py stage [--reuse] [-p results_gpu G] # book sources -> _build/src
    python ci/notebooks.py list                              # chapters and GPU parameters

A chapter is ``notebooks/<stem>.md`` (MyST markdown, jupytext) whose first code cell is
tagged ``parameters``. Its defaults are the CPU smoke run; the ``gpu`` set is the
``onelaunch: gpu_parameters:`` mapping in the chapter's front matter (injected with
papermill, like ``papermill -p``). ``-p NAME VALUE`` (VALUE as YAML) adds to either set.

* ``cpu`` executes into a scratch folder (default ``_build/cpu-notebooks/``, ignored),
  :data:`CPU_WORKERS` chapters at a time, and exits non-zero if any cell of any chapter
  raises. A ``results_gpu`` parameter (a chapter's default: ``h200``) names the results
  folder its figures show; the ``gpu`` run sets it to None (the run's own).
* ``gpu`` writes the executed notebooks to ``notebooks/<stem>.ipynb``: the committed
  outputs the book renders. The commit they come from is ``$ONELAUNCH_COMMIT`` or ``git
  rev-parse HEAD`` and is stored in the notebook's metadata (``onelaunch.commit``), with
  the run's id (``onelaunch.run``: one id for every chapter of one invocation, also in
  every results file the chapters write), the chapter's wall time and torch's peak GPU
  memory. GPU memory is capped at ``--mem-gb`` (default 24 GB, an RTX 4090's; 0: no cap)
  through ``ONELAUNCH_GPU_MEM_GB`` (:mod:`onelaunch.memcap`), applied in each chapter's
  kernel by an IPython startup file before the first cell.
* ``stage`` (``ci/stage_book.py``) lays out the book's sources in ``_build/src`` for
  ``jupyter-book build``: the config, ``book/``, ``_static/`` and, per chapter, the
  committed GPU notebook (with a
  one-line note if the package changed since its run) or else a CPU execution (reused
  from the scratch folder when its source, the package and the parameters are
  unchanged, with ``--reuse``), then the book's own pages that compute (``book/*.md``
  with a kernelspec: the introduction, the ladder), executed with papermill. Staging
  keeps CPU outputs out of ``notebooks/``, where only GPU runs are committed. A GPU
  notebook whose code matches its source is staged with the source's prose
  (``ci/refresh_prose.py``, applied to the staged copy), so a prose edit shows in the
  book without a rerun and without touching the committed notebook.
  ``-p results_gpu rtx4090`` makes every page that is executed here (the CPU chapters,
  the introduction, the ladder) show ``results/rtx4090/`` instead of the book's run.

On every page the parameters cell and papermill's injected one are hidden (tag
``remove-cell``); the stage (``ci/stage_book.py``) adds one line saying what ran.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
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
CPU_WORKERS = 2              # chapters executed at once on the CPU (ci/test.sh: two cores)
HIDDEN = ("parameters", "injected-parameters")      # cells tagged so are not shown


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
    """The GPU run's parameters: :data:`DEFAULT_GPU`, ``results_gpu`` None (the page
    shows the run's own results) where the chapter has that parameter, and the front
    matter's ``gpu_parameters`` (jupytext drops a null there: None is set here)."""
    p = dict(DEFAULT_GPU)
    if any("results_gpu" in c.source for c in nb.cells
           if "parameters" in c.get("metadata", {}).get("tags", [])):
        p["results_gpu"] = None
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


def kernel_env() -> str:
    """What a chapter's kernel inherits: the commit, this tree on ``PYTHONPATH`` (the
    package is imported from it, installed or not: a GPU run gets a bare copy of the
    tree) and the IPython start-up file. Returns the commit."""
    env_commit = commit()
    os.environ.setdefault("ONELAUNCH_COMMIT", env_commit)
    pp = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([pp] if pp else []))
    os.environ["IPYTHONDIR"] = str(kernel_startup())
    return env_commit


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
    env_commit = kernel_env()
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
    hide_parameters(done)
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


def hide_parameters(nb) -> None:
    """Tag the parameters cell and papermill's injected-parameters cell ``remove-cell``:
    bookkeeping the page does not show (:func:`ran_note` says what ran in one line)."""
    for c in nb.cells:
        tags = c.get("metadata", {}).get("tags", [])
        if any(t in tags for t in HIDDEN) and "remove-cell" not in tags:
            c.metadata["tags"] = list(tags) + ["remove-cell"]


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
            say(f"[notebooks] {run}: {src.relative_to(ROOT)} -> {shown}")
            try:
                s = execute(src, out, run, extra, timeout)
                say(f"[notebooks]   {src.stem} ok in {s:.0f} s")
            except Exception as e:  # papermill's error names the cell and the exception
                failed.append(src.stem)
                msg = str(e).strip().splitlines()
                print(f"[notebooks]   {src.stem} FAILED: {type(e).__name__}", file=sys.stderr)
                print("\n".join(msg[-40:]), file=sys.stderr)

    todo = chapters(names)
    if run == "cpu":
        # the CPU run uses every core: CPU_WORKERS chapters at once, each taking the next
        # in order (results.write locks a results file while it merges rows into it); on
        # the CPU a chapter shows the GPU run's files, so no chapter waits for another's.
        # The GPU run keeps strict chapter order.
        in_parallel(todo, run_in_order)
    else:
        run_in_order(todo)
    if failed:
        print(f"[notebooks] {len(failed)} chapter(s) raised: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def say(line: str) -> None:
    """One line of the log in one write (chapters run side by side)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def in_parallel(todo: list[Path], run_in_order, workers: int = CPU_WORKERS) -> None:
    """Run ``run_in_order([src])`` for each of ``todo`` on ``workers`` threads, each
    taking the next chapter in order."""
    import queue
    import threading
    q = queue.Queue()
    for src in todo:
        q.put(src)

    def worker():
        while True:
            try:
                src = q.get_nowait()
            except queue.Empty:
                return
            run_in_order([src])
    threads = [threading.Thread(target=worker) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


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
        from stage_book import stage
        return stage(a.reuse, a.timeout, extra)
    out_dir = a.out or (SCRATCH if a.what == "cpu" else NOTEBOOKS)
    return run_all(a.what, a.chapters, out_dir.resolve(), extra, a.timeout, a.mem_gb)


if __name__ == "__main__":
    sys.exit(main())
