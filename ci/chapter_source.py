"""Reading a chapter's source: ``notebooks/<stem>.md`` (MyST markdown, jupytext) as a
notebook, and its code cells as the source has them.

Shared by the runner (``ci/notebooks.py``), the staleness check (``ci/check_stale.py``)
and the prose refresh (``ci/refresh_prose.py``); it imports none of them, so the three
import it without a circle.
"""
from __future__ import annotations

from pathlib import Path

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def read_source(src: Path):
    """The chapter source ``src`` as a notebook, with the kernelspec papermill needs."""
    import jupytext
    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)  # papermill needs one
    return nb


def code_cells(nb) -> list[str]:
    """Code cells as the source has them (papermill's injected cell left out)."""
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"
            and "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
