"""Small helpers the chapters share: glue, run banners, staleness notes, showing source.

A chapter imports these instead of redefining them (QuantEcon's habit: shared code lives
in the package). Nothing here needs the jupyter packages to be importable except IPython,
so the chapters also run as plain scripts; ``glue`` writes the same display data that
``myst_nb.glue`` writes, so a GPU run needs no myst-nb to publish a number.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# the MIME prefix myst-nb reads back when the value was glued with display=False
GLUE_PREFIX = "application/papermill.record/"


def _display(obj, **kw):
    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython ships with every kernel
        print(obj)
        return
    display(obj, **kw)


class _Text:
    """Displays as its text, without the quotes a ``str`` repr adds."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def glue(name: str, value, fmt: str | None = None, *, key: tuple | None = None,
         run: str | None = None):
    """Store ``value`` under ``name`` for ``{glue}`name``` in the prose (or
    ``{glue}`path/to/page.ipynb::name``` from another page), without showing it in the
    cell's output. ``fmt`` (e.g. ``".2f"``) stores the formatted text; strings are
    stored as plain text. Returns nothing, so a cell that ends with it shows nothing.

    ``key`` names the quantity, ``(model, rung, ctx, quantity)`` (e.g. ``("qwen2.5-1.5b",
    "+ PDL", 512, "ms_per_token")``), and ``run`` the run it comes from: every page that
    prints the same quantity of the same run must print one value
    (:mod:`onelaunch.report.consistency` checks it across the book)."""
    if fmt:
        shown = _Text(format(value, fmt))
    elif isinstance(value, str):
        shown = _Text(value)
    else:
        shown = value
    try:
        from IPython.core.formatters import format_display_data
        from IPython.display import display
    except ImportError:  # plain script: nothing to glue into
        return
    bundle, metadata = format_display_data(shown)
    metadata["scrapbook"] = {"name": name, "mime_prefix": GLUE_PREFIX}
    if key is not None:
        metadata["onelaunch"] = {"key": [str(k) for k in key], "run": run}
    display({GLUE_PREFIX + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)


def glue_from(name: str, get, fmt: str | None = None, *, key: tuple | None = None,
              run: str | None = None, missing: str = "–"):
    """:func:`glue` of ``get()``, or of ``missing`` when the results this page reads lack
    what ``get`` looks up (a reader's run without that rung or file): the page still
    builds, and says "–" where the number would be."""
    try:
        value = get()
    except (KeyError, TypeError, AttributeError, IndexError, ZeroDivisionError,
            StopIteration):
        value = None
    if value is None:
        return glue(name, missing)
    return glue(name, value, fmt, key=key, run=run)


def markdown(text: str):
    """Show MyST markdown (admonitions included: the book renders ``text/markdown``
    outputs as MyST)."""
    try:
        from IPython.display import Markdown
    except ImportError:  # pragma: no cover
        print(text)
        return
    _display(Markdown(text))


def show_source(obj, lines: tuple[int, int] | None = None):
    """Show the source of a package function or class: one source, never a pasted copy."""
    src = inspect.getsource(obj)
    if lines:
        src = "\n".join(src.splitlines()[lines[0]:lines[1]])
    mod = inspect.getmodule(obj)
    where = f"{mod.__name__}.{getattr(obj, '__qualname__', '')}" if mod else ""
    markdown(f"`{where}`\n\n```python\n{src.rstrip()}\n```")


@contextlib.contextmanager
def watchdog(seconds: float, what: str):
    """End this process (the notebook's kernel) if the block outlives ``seconds``: a GPU
    kernel that never finishes cannot be interrupted, and a stuck chapter would hold the
    whole GPU run. The chapter then fails with the kernel's death, named on stderr."""
    def fire():
        print(f"watchdog: {what} did not finish within {seconds:.0f} s; ending the kernel",
              file=sys.stderr, flush=True)
        os._exit(3)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    try:
        yield
    finally:
        t.cancel()


def is_smoke(device) -> bool:
    import torch
    return torch.device(device).type != "cuda"


def run_banner(device, chapter: str | None = None):
    """The run's identity glued for the prose (``run_gpu``, ``run_torch``, ...), shown
    nowhere itself: the page names what ran in one line (``ci/notebooks.py stage``) and
    the run behind its numbers in another (:func:`numbers_line`). Returns the meta."""
    from . import results
    m = results.meta(device)
    m["commit"] = commit()
    # the run's identity, for the prose of this page and of others (path::key)
    glue("run_gpu", m["gpu_name"] if not is_smoke(device) else "a CPU (smoke run)")
    for k in ("torch", "triton", "transformers", "commit"):
        glue(f"run_{k}", str(m[k]))
    glue("run_date", m["date"][:10])
    glue("run_cuda", str(m.get("cuda")))
    return m


def commit() -> str:
    """The commit the code comes from: ``ONELAUNCH_COMMIT`` if set (a GPU run gets
    a copy of the tree without ``.git``), else ``git rev-parse``."""
    from .results import git_commit
    return git_commit()


def changed_since(commit_id: str, paths=("onelaunch",)) -> list[str] | None:
    """One-line log entries that touched ``paths`` after ``commit_id``; ``None`` when git
    or the commit is not available (then nothing can be said)."""
    if not commit_id or commit_id == "unknown":
        return None
    try:
        out = subprocess.run(["git", "log", "--oneline", f"{commit_id}..HEAD", "--", *paths],
                             cwd=ROOT, capture_output=True, text=True, timeout=30)
    except Exception:
        return None
    if out.returncode != 0:
        return None
    return [l for l in out.stdout.splitlines() if l.strip()]


def staleness_note(chapter: str, commit_id: str | None = None) -> str | None:
    """One line (MyST markdown) for a chapter whose package code changed after the run
    that produced its numbers, naming that run's commit; ``None`` when the numbers are
    current or nothing can be said.

    ``chapter`` is the notebook's stem; the commit is read from the executed notebook's
    metadata (``ci/notebooks.py`` writes it) unless given."""
    if commit_id is None:
        nb = ROOT / "notebooks" / f"{chapter}.ipynb"
        if not nb.exists():
            return None
        import json
        meta = json.loads(nb.read_text()).get("metadata", {}).get("onelaunch", {})
        commit_id = meta.get("commit")
    if not changed_since(commit_id):
        return None
    return (f":::{{note}}\nThese numbers come from commit `{commit_id}`; the package has "
            f"changed since (now `{commit()}`).\n:::")


def table(rows: list[dict], columns: dict[str, str] | None = None, fmt: dict | None = None):
    """Show rows as a markdown table. ``columns`` maps row keys to headers (and picks
    them); ``fmt`` maps keys to a format spec or a function."""
    if not rows:
        markdown("*(no rows)*")
        return
    columns = columns or {k: k for k in rows[0]}
    fmt = fmt or {}

    def cell(r, k):
        v = r.get(k)
        f = fmt.get(k)
        if v is None:
            return "–"
        if callable(f):
            return f(v)
        if f:
            return format(v, f)
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    head = "| " + " | ".join(columns.values()) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cell(r, k) for k in columns) + " |" for r in rows]
    markdown("\n".join([head, sep, *body]))


# The one table form of the book's near ties (every page that reports agreement): a row
# per step where a run's token differs from the reference's, by the agreement rule.
TIE_COLUMNS = {"model": "model", "rung": "rung", "step": "step",
               "ref_token": "reference's token", "got_token": "its token",
               "gap": "gap (logits)", "gap_ulps": "gap (bf16 ulps)",
               "threshold": "near tie below", "verdict": "verdict"}


def tie_rows(rows: list[dict]) -> list[dict]:
    """Every step where a row's token differed from the reference's, one row each: the
    rows' ``flips`` (a rung or peer judged by :func:`onelaunch.measure.agree.judge`) or
    ``disagreements`` (the oracle's check against Hugging Face, whose reference is HF),
    with the row's model and rung. Older records keep a margin and a bound only."""
    out = []
    for r in rows:
        for f in r.get("flips") or r.get("disagreements") or []:
            gap = f.get("gap", f.get("margin"))
            bound = f.get("threshold", f.get("near_tie_below"))
            verdict = f.get("verdict") or (None if gap is None or bound is None else
                                           "near tie" if gap <= bound else "flip")
            out.append({"model": r.get("model"), "rung": r.get("rung") or "oracle",
                        "step": f.get("step"), "ref_token": f.get("ref_token"),
                        "got_token": f.get("got_token"), "gap": gap,
                        "gap_ulps": f.get("gap_ulps"), "threshold": bound,
                        "verdict": verdict})
    return out


def agreement(row: dict) -> str:
    """A judged row's agreement as a check line prints it, naming its near ties' count:
    ``"12/12"``, ``"11/12 (1 near tie)"``, ``"10/12 (1 near tie, 1 flip)"``; steps that
    differ with no record say so. The book's one form for near ties in a line of text
    (chapter 2 draws them instead: :mod:`onelaunch.report.tie_figure`)."""
    from .results import agree_ok, agree_text
    text = agree_text(row)
    if row.get("agree") is None or agree_ok(row["agree"]):
        return text
    verdicts = [t["verdict"] for t in tie_rows([row])]
    if not verdicts:
        return f"{text} (the differing steps were not recorded)"
    plural = lambda n, w: f"{n} {w}{'s' if n != 1 else ''}"
    ties = verdicts.count("near tie")
    parts = [plural(ties, "near tie")] + ([plural(len(verdicts) - ties, "flip")]
                                          if ties < len(verdicts) else [])
    return f"{text} ({', '.join(parts)})"


def near_ties(rows: list[dict], reference: str = "the oracle") -> list[dict]:
    """Show the steps where ``rows``' tokens differed from ``reference``'s as one table
    (:func:`tie_rows`; the model column only when the rows hold more than one model), or
    say that none did. The book's one form for its near ties. Returns the table's rows."""
    ties = tie_rows(rows)
    if not ties:
        markdown(f"Every checked step chose {reference}'s token: no near tie.")
        return ties
    cols = dict(TIE_COLUMNS)
    if len({t["model"] for t in ties}) < 2:
        del cols["model"]
    markdown(f"Steps whose token differs from {reference}'s (teacher-forced), each judged "
             "by the agreement rule:")
    table(ties, cols, {"gap": ".3g", "gap_ulps": ".1f", "threshold": ".3g"})
    return ties


MS_SPREAD = ("ms_min", "ms_max")      # a step's time (ladder, sweep and two-GPU rows)
US_SPREAD = ("us_min", "us_max")      # a launch's (kernel and op rows: graph_time)


def spread_text(row: dict, fmt: str = ".3g", keys: tuple = MS_SPREAD) -> str:
    """A row's spread as a table shows it: ``"min–max"`` over its timed repeats (``keys``:
    ``ms_min``/``ms_max``, or ``us_min``/``us_max`` for a launch), or "–" when the run
    that wrote it recorded none."""
    lo, hi = (row.get(k) for k in keys)
    if lo is None or hi is None:
        return "–"
    return f"{format(lo, fmt)}–{format(hi, fmt)}"


def with_spread(rows: list[dict], fmt: str = ".3g", keys: tuple = MS_SPREAD) -> list[dict]:
    """``rows`` (copies) with ``spread`` (:func:`spread_text`) for a table's column."""
    return [{**r, "spread": spread_text(r, fmt, keys)} for r in rows]


def within_spread(a: dict, b: dict, keys=("ms_per_token", "ms_min", "ms_max")) -> bool | None:
    """Whether rows ``a`` and ``b`` differ by less than their spread: either one's median
    inside the other's min–max range (None when either recorded no spread). Prose draws
    no conclusion from such a difference. ``keys``: the median's, the min's and the max's
    names in the rows."""
    med, lo, hi = keys

    def inside(x, r):
        return r[lo] <= x[med] <= r[hi]
    if any(r.get(k) is None for r in (a, b) for k in keys):
        return None
    return inside(a, b) or inside(b, a)


def compare(a: dict | None, b: dict | None) -> str:
    """``a``'s time against ``b``'s in words, from the rows and their spread: "3.1%
    faster", "2.0% slower", or "no different within the spread (…)" when the difference
    is inside it (a row without a spread says so); "(not measured: see above)" when
    either has no time."""
    ta, tb = (None if r is None else r.get("ms_per_token") for r in (a, b))
    if ta is None or tb is None:
        return "(not measured: see above)"
    pct = f"{abs(ta / tb - 1) * 100:.1f}%"
    inside = within_spread(a, b)
    if inside:
        return f"no different within the spread of the timed steps ({pct} apart)"
    return f"{pct} " + ("slower" if ta > tb else "faster") + \
        (" (no spread recorded to judge it by)" if inside is None else "")


def run_read_tbps(device, gib: float, iters: int) -> tuple[float, str]:
    """The run's read bandwidth and where it comes from: chapter 1's
    (``floor.json`` of this run: one bandwidth, so one floor, for every page), else
    measured here (:func:`onelaunch.measure.timing.read_bandwidth`)."""
    from . import results
    from ..measure.timing import read_bandwidth
    saved = results.load_this_run("floor", results.gpu_slug(device))
    bw = [r["read_tbps"] for r in (saved or {}).get("rows", []) if r.get("read_tbps")]
    if bw:
        return bw[0], "chapter 1, this run"
    return read_bandwidth(device, gib=gib, iters=iters), "measured in this chapter"


def set_floor(rows: list[dict], spec, read_tbps: float):
    """Give ladder rows the floor from the bandwidth this chapter measured (the same run),
    and their ratio to it."""
    for r in rows:
        floor = spec.floor_ms(read_tbps, r["ctx"])
        r["floor_ms"] = round(floor, 4)
        r["read_tbps"] = round(read_tbps, 3)
        ms = r.get("ms_per_token")
        r["x_floor"] = None if ms is None else round(ms / floor, 3)
    return rows


def family_key(spec) -> str:
    """``"dense"`` or ``"moe"``: glue names say which model a number is about, the same
    on the CPU (tiny models) and the GPU (full size)."""
    return "moe" if spec.is_moe else "dense"


class GateFailed(RuntimeError):
    """A check in a chapter failed. The cell has already shown its rows; raising makes
    papermill, and so the CPU test run and the GPU book run, fail."""


def require(rows, what: str, show: bool = False) -> None:
    """Raise :class:`GateFailed` if any of ``rows`` (kernel rows, ladder rows, peer rows,
    sweep rows, or one result dict) failed its check: refused, a ``check`` other than
    "pass", an ``error``, or ``ok`` False. Call it after the cell has shown the rows, or
    with ``show=True`` to show them (as a table) before raising."""
    from ..measure.agree import failures
    bad = failures(rows)
    if not bad:
        return
    if show:
        table([rows] if isinstance(rows, dict) else list(rows))
    def name(r):
        return r.get("kernel") or r.get("rung") or r.get("op") or r.get("model", "?")

    def why(r):
        return (r.get("refused") or r.get("error") or
                (r.get("check") if r.get("check") not in (None, "pass") else None) or
                f"agree {r.get('agree')}")
    lines = [f"{name(r)} (ctx {r['ctx']})" if "ctx" in r else name(r) for r in bad]
    raise GateFailed(f"{what}: {len(bad)} failed their check: " +
                     "; ".join(f"{n}: {why(r)}" for n, r in zip(lines, bad)))


# ---- what a page shows: one results folder, named in one line ------------------------
#
# A chapter measures on whatever device it runs on and writes ``results/<gpu>/``; its
# figures and the numbers in its prose read one folder, ``shown``: the run's own on a
# GPU, ``results/h200/`` (the book's published run) by default on a CPU, or whatever the
# ``results_gpu`` parameter names (``-p results_gpu rtx4090`` shows a reader's own run).

def shown(device, results_gpu: str | None = None) -> str:
    """The results folder (a GPU slug under ``results/``) this page's figures read."""
    from . import results
    return results_gpu or results.gpu_slug(device)


def numbers_line(gpu: str, name: str = "ladder",
                 what: str = "Numbers on this page") -> dict | None:
    """Show one line naming the run behind the page's numbers (GPU, versions, commit,
    date) and, when the package changed after it, the commit the code is at now. A page
    that also shows a file of another run names that run in a line of its own, ``what``
    saying which numbers (``numbers_line(gpu, "phase_clock", "The phase clock")``):
    ``ci/check_one_commit.py`` accepts a file of another run only where it is named.
    Returns that run's meta (``None``, and a line saying so, when the file is missing):
    a cell that ends with the call shows that dict too, so assign it (``m = ...``).
    ``gpu`` ``h200x2`` names a run on two H200s (chapter 7's ``numbers_line("h200x2",
    "tp")``)."""
    from . import results
    data = results.load(name, gpu)
    if data is None:
        markdown(f":::{{note}}\nNo `results/{gpu}/{name}.json` yet: run this chapter on "
                 f"that GPU to draw its figures.\n:::")
        return None
    m = data["meta"]
    import re
    many = re.fullmatch(r".*\dx(\d)", gpu)       # h200x2: a run on two H200s
    many = many.group(1) if many else ""
    line = (f"{what}: {f'{many} x ' if many else ''}{m['gpu_name']}, torch "
            f"{m['torch']}, Triton {m['triton']}, commit `{m['commit']}`, "
            f"{m['date'][:10]}.")
    if changed_since(m["commit"]):
        line += f" The package has changed since (now `{commit()}`)."
    markdown(f":::{{note}}\n{line}\n:::")
    return m
