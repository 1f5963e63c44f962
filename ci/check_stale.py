#!/usr/bin/env python3
"""Fail if an executed chapter's code differs from its source's.

For every committed ``notebooks/<stem>.ipynb`` the code cells (papermill's injected
parameters cell left out) must equal the code cells of ``notebooks/<stem>.md``, in order.
Prose may differ: ``ci/refresh_prose.py`` copies it over without a rerun, and so may the
layout and comments of the code (the same syntax tree, cell by cell: what ran is what the
source says). A changed code cell needs a GPU rerun (``ci/gpu_book.sh``). An executed notebook with no source fails too.

    python ci/check_stale.py [NOTEBOOK.ipynb ...]      # exit 1 and a diff when stale
"""
from __future__ import annotations

import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
from chapter_source import code_cells, read_source  # noqa: E402


def same_program(a: list[str], b: list[str]) -> bool:
    """Cells that differ only in layout and comments: the same Python syntax tree, cell
    by cell (so what ran is what the source says). Cells that do not parse as Python
    (magics) must match as text."""
    import ast

    def tree(cell):
        try:
            return ast.dump(ast.parse(cell))
        except SyntaxError:
            return cell
    return len(a) == len(b) and all(tree(x) == tree(y) for x, y in zip(a, b))


def stale(nb_path: Path) -> list[str]:
    """Problems with one executed notebook (empty when its code matches its source)."""
    import nbformat
    src = nb_path.with_suffix(".md")
    if not src.exists():
        return [f"{nb_path.name}: no source {src.name}"]
    done = code_cells(nbformat.read(nb_path, as_version=4))
    want = code_cells(read_source(src))
    if done == want or same_program(done, want):
        return []
    out = [f"{nb_path.name}: code differs from {src.name} (rerun it on the GPU: ci/gpu_book.sh)"]
    diff = difflib.unified_diff("\n\n".join(want).splitlines(), "\n\n".join(done).splitlines(),
                                f"{src.name} (source)", f"{nb_path.name} (executed)", lineterm="", n=1)
    out += ["    " + l for l in list(diff)[:40]]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    problems = [p for nb in paths for p in stale(nb)]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(f"[check_stale] {len(paths)} executed notebook(s) match their sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
