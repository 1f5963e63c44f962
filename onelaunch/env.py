"""Every environment variable onelaunch reads, in one place: its name, what it does, and
the one function that reads it.

The engine's and the persistent kernel's switches are not here: they are arguments
(``Engine(..., persistent=True, persist=PersistentOptions(...))``, ``options.py``). What
is left describes the run rather than the engine: where it runs, which commit and book
run it belongs to, how much GPU memory it may take, whether a progress bar may draw.
"""
from __future__ import annotations

import os

VARS: dict[str, str] = {
    "TRITON_INTERPRET": "1: Triton runs the kernels in its CPU interpreter (tiny shapes "
                        "only; the tests, the CPU chapters and `--device cpu` set it)",
    "ONELAUNCH_COMMIT": "the commit being run, where the tree has no .git (the GPU book "
                        "run copies the tree; ci/gpu_book.sh sets it)",
    "ONELAUNCH_RUN": "the book run a process belongs to (ci/notebooks.py sets it, on "
                     "the GPU and on the CPU): every results file and row it writes "
                     "carries it, and a chapter's figure draws only its rows",
    "ONELAUNCH_GPU_MEM_GB": "cap torch's GPU memory at this many GB (24: an RTX 4090's; "
                            "0 or empty: no cap; memcap.py)",
    "ONELAUNCH_PEAK_FILE": "where a chapter's kernel writes its peak GPU memory as JSON "
                           "(ci/notebooks.py sets it; memcap.write_peak)",
    "ONELAUNCH_NO_PROGRESS": "1: no progress bar even on a terminal (text.progress)",
    # read by the scripts around the package, listed here so that one list has them all
    "ONELAUNCH_SKIP_SETUP": "1: ci/book.sh skips ci/setup.sh (the tests' book build)",
    "ONELAUNCH_CHROMIUM": "the browser tests/test_browser.py drives (default "
                          "/usr/bin/chromium)",
}


def get(name: str, default: str | None = None) -> str | None:
    """The value of the registered variable ``name``; ``default`` when unset or empty."""
    if name not in VARS:
        raise KeyError(f"{name} is not a registered environment variable (env.VARS)")
    v = os.environ.get(name)
    return default if v in (None, "") else v


def flag(name: str) -> bool:
    """Whether the registered variable ``name`` is set to 1."""
    return get(name) == "1"


def interpreting() -> bool:
    """Triton's CPU interpreter is on (``TRITON_INTERPRET=1``)."""
    return flag("TRITON_INTERPRET")


def use_interpreter() -> None:
    """Turn Triton's interpreter on for this process (before the kernels are imported:
    Triton reads the variable when a kernel is decorated), without its repeated set-up
    (:mod:`onelaunch.interpreter`)."""
    os.environ["TRITON_INTERPRET"] = "1"
    from .interpreter import speed_up
    speed_up()
