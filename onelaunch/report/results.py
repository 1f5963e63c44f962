"""Results files: every published number is written to ``results/<gpu>/<name>.json``.

Layout: ``{"meta": {gpu, gpu_name, torch, triton, transformers, commit, run, date,
gpu_mem_cap_gb, parameters}, "rows": [...]}``. ``run`` names one GPU book run
(``ci/notebooks.py gpu`` sets ``ONELAUNCH_RUN``): every file and row it writes carries it,
so ``ci/check_one_commit.py`` can tell one run from several. The ladder (``ladder.json``)
has one row per measurement with at least ``model, rung, ctx, ms_per_token, floor_ms,
agree`` (and, where timed, its spread ``ms_min, ms_max`` over ``timed`` repeats), and the
``chapter`` that wrote it; rows are merged by (model, rung, ctx), so a chapter rerun
replaces its own rows and keeps the others, and within one run the first chapter that
measures a row owns it.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import re
import subprocess
from pathlib import Path

import torch

from .. import env
from ..measure.agree import NEAR_TIE_LOGITS

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "results"


def gpu_name(device="cuda") -> str:
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def gpu_slug(device="cuda") -> str:
    """A short slug for the results folder: ``h200``, ``rtx4090``, ``cpu``..."""
    name = gpu_name(device).lower()
    if name == "cpu":
        return "cpu"
    name = name.replace("nvidia", "").replace("geforce", "")
    m = re.search(r"(rtx\s*\d{4}\w*|[abhl]\d{2,3}\w*|gb?\d{3}\w*)", name)
    slug = m.group(1) if m else name
    return re.sub(r"[^a-z0-9]+", "", slug) or "gpu"


def git_commit() -> str:
    """The commit being run: ONELAUNCH_COMMIT where the tree has no .git (the GPU run)."""
    if env.get("ONELAUNCH_COMMIT"):
        return env.get("ONELAUNCH_COMMIT")[:12]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except Exception:
        return "unknown"


def run_id() -> str | None:
    """The GPU book run this process belongs to (``ONELAUNCH_RUN``), or None."""
    return env.get("ONELAUNCH_RUN")


def run_key(row_or_meta: dict):
    """The run a row (or a file's ``meta``) comes from: its ``run`` id where it has one,
    else its commit."""
    return row_or_meta.get("run") or row_or_meta.get("commit")


def this_run() -> str:
    """The run this process writes: :func:`run_id`, else the commit (:func:`run_key` of
    every row it writes)."""
    return run_id() or git_commit()


def load_this_run(name: str, gpu: str) -> dict | None:
    """``results/<gpu>/<name>.json`` if this process's run wrote it, else None: a page
    reads an earlier chapter's numbers only from the same run."""
    data = load(name, gpu)
    if data is None or run_key(data.get("meta", {})) != this_run():
        return None
    return data


@functools.lru_cache(maxsize=1)
def driver_version() -> str | None:
    """The NVIDIA driver's version (``nvidia-smi``), or None where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
    except Exception:
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def meta(device="cuda", parameters: dict | None = None) -> dict:
    import platform

    import triton
    import transformers

    from ..memcap import cap_gb
    return {
        "gpu": gpu_slug(device),
        "gpu_name": gpu_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "driver": driver_version() if torch.device(device).type == "cuda" else None,
        "python": platform.python_version(),
        "commit": git_commit(),
        "run": run_id(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu_mem_cap_gb": cap_gb(),
        "parameters": parameters or {},
    }


def path_for(name: str, gpu: str) -> Path:
    return RESULTS / gpu / f"{name}.json"


def load(name: str, gpu: str) -> dict | None:
    p = path_for(name, gpu)
    return json.loads(p.read_text()) if p.exists() else None


@contextlib.contextmanager
def locked(p: Path):
    """Hold an exclusive lock for results file ``p`` (a lock file in the temporary
    folder): chapters run side by side on the CPU merge rows into one file."""
    import fcntl
    import hashlib
    import tempfile
    tag = hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"onelaunch-results-{tag}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write(name: str, rows: list[dict], device="cuda", parameters: dict | None = None,
          merge_keys: tuple[str, ...] | None = None, gpu: str | None = None,
          keep=None) -> Path:
    """Write (or merge into) ``results/<gpu>/<name>.json``, under :func:`locked`. With
    ``merge_keys``, rows of an existing file whose keys are not in ``rows`` are kept;
    ``keep(old_rows, rows)``, where given, picks which of ``rows`` to write first."""
    gpu = gpu or gpu_slug(device)
    p = path_for(name, gpu)
    p.parent.mkdir(parents=True, exist_ok=True)
    m = meta(device, parameters)
    with locked(p):
        old = json.loads(p.read_text()) if p.exists() else {}
        if keep is not None:
            rows = keep(old.get("rows", []), rows)
        if merge_keys and old:
            key = lambda r: tuple(r.get(k) for k in merge_keys)
            new_keys = {key(r) for r in rows}
            kept = [r for r in old.get("rows", []) if key(r) not in new_keys]
            rows = kept + rows
        p.write_text(json.dumps({"meta": m, "rows": rows}, indent=1) + "\n")
    return p


LADDER_KEYS = ("model", "rung", "ctx")


def write_ladder(rows: list[dict], device="cuda", parameters=None, gpu=None,
                 chapter: str | None = None) -> Path:
    """Merge ``rows`` into ``ladder.json``. Each row gets the commit and run it comes
    from, and the chapter that wrote it (``chapter``, the notebook's stem, e.g.
    ``"05_split_k"``: a chapter's figure draws only its own run's rows of chapters up to
    itself, :func:`onelaunch.report.ladder_file.chapter_rows`). A row this run's file
    already has from another chapter is not written again: the first chapter that
    measures a quantity owns it, a later one shows its own measurement labelled. An
    "oracle eager" row whose ``agree`` is the oracle's check against Hugging Face gets
    that check's disagreements as its ``flips`` (from ``oracle_check.json`` of the same
    GPU and commit), so every page judges it by the same near-tie rule."""
    gpu = gpu or gpu_slug(device)
    check = load("oracle_check", gpu)
    if check is not None and check.get("meta", {}).get("commit") == git_commit():
        attach_reference_flips(rows, check.get("rows", []))
    for r in rows:
        for k in ("model", "rung", "ctx", "ms_per_token", "floor_ms", "agree"):
            if k not in r:
                raise ValueError(f"ladder row lacks {k!r}: {r}")
        r.setdefault("commit", git_commit())
        if run_id():
            r.setdefault("run", run_id())
        if chapter:
            r.setdefault("chapter", chapter)
    # the first chapter of a run that measures a quantity writes it: a later chapter's
    # second measurement of the same (model, rung, ctx) in the same run is not merged
    def first_owns(old_rows, rows):
        first = {tuple(r.get(k) for k in LADDER_KEYS): r.get("chapter")
                 for r in old_rows if run_key(r) == this_run()}
        return [r for r in rows
                if first.get(tuple(r.get(k) for k in LADDER_KEYS), r.get("chapter"))
                in (None, r.get("chapter"))]
    return write("ladder", rows, device=device, parameters=parameters,
                 merge_keys=LADDER_KEYS, gpu=gpu, keep=first_owns)


# ---- what a row's oracle check says ------------------------------------------------------
# logits: the agreement rule for records with a gap but no top logit (agree.NEAR_TIE_LOGITS)
NEAR_TIE = NEAR_TIE_LOGITS


def attach_reference_flips(rows: list[dict], check_rows: list[dict]) -> None:
    """The "oracle eager" row's ``agree`` is the oracle against Hugging Face (chapter 2);
    its disagreements, with HF's logit gap at each, are that check's rows (``check_rows``,
    from ``oracle_check.json``). Gives such a row its ``flips``, in place, where it has none
    and the check is for the same model with the same agreement."""
    checks = {r["model"]: r for r in check_rows if "model" in r}
    for r in rows:
        c = checks.get(r.get("model"))
        if r.get("rung") == "oracle eager" and r.get("flips") is None and c is not None \
                and c.get("agree") == r.get("agree"):
            r["flips"] = [{"step": d["step"], "margin": d["hf_gap"], "near_tie_below": NEAR_TIE}
                          for d in c.get("disagreements", [])]


def agree_ok(agree) -> bool:
    """``"12/12"`` -> True, ``"6/8"`` -> False; ``True``/``False`` as they are."""
    if isinstance(agree, bool):
        return agree
    try:
        a, b = str(agree).split("/")
        return int(a) == int(b) and int(b) > 0
    except ValueError:
        return False


def flips_are_near_ties(row: dict) -> bool | None:
    """Whether every recorded disagreement is a near tie by the agreement rule
    (:mod:`onelaunch.measure.agree`: each row carries its verdict); rows of older runs carry a
    margin and a threshold instead. None: nothing recorded."""
    if row.get("flips") is not None:
        return all(f["verdict"] != "flip" if "verdict" in f else f["margin"] <= f["near_tie_below"]
                   for f in row["flips"])
    if row.get("flip_margin") is not None:
        return row["flip_margin"] <= NEAR_TIE
    return None


def row_passes(row: dict) -> bool:
    """A row that may be reported as a number: it has a time, and its oracle check passed:
    full agreement, or disagreements only at recorded near ties (``agree`` None marks the
    reference itself). A row the benchmark refused has no time and is never reported."""
    import math
    ms = row.get("ms_per_token")
    if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0) or row.get("refused"):
        return False
    agree = row.get("agree")
    if agree is None or agree_ok(agree):
        return True
    return bool(flips_are_near_ties(row))


NO_CHECK = "no check possible"


def check_status(row: dict) -> str:
    """The row's oracle check in words, the same on every page, table and figure (the
    one answer: nothing else words a check): ``"pass"`` (full agreement, or the
    reference itself), ``"near ties only"`` (it differs from the oracle only at recorded
    near ties), ``"no check possible"`` (a peer that shows no logits, llama.cpp: its own
    timing, shown unchecked), ``"refused"`` (no time may be shown)."""
    if not row_passes(row):
        return "refused"
    if row.get("unchecked"):
        return NO_CHECK
    agree = row.get("agree")
    return "pass" if agree is None or agree_ok(agree) else "near ties only"


def agree_text(row: dict) -> str:
    """A row's ``agree`` as a table shows it: ``"10/12"``; "reference" for the reference
    itself; "–" for a row that could not be checked (:data:`NO_CHECK`)."""
    if row.get("agree") is not None:
        return str(row["agree"])
    return "–" if row.get("unchecked") else "reference"
