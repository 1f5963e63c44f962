#!/usr/bin/env python3
"""Copy the prose of the chapters' sources into their executed notebooks, without a rerun.

The executed ``notebooks/<stem>.ipynb`` keeps its code cells' outputs; its markdown cells
are replaced by the source's, in the source's order, and its code cells take the source's
text where only layout or comments differ (``check_stale.same_program``). Only allowed while the
code cells still match (``ci/check_stale.py``): otherwise the numbers would sit next to
code that did not produce them, and the chapter needs a GPU rerun instead.

    python ci/refresh_prose.py [NOTEBOOK.ipynb ...]    # default: every executed chapter
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
from check_stale import stale  # noqa: E402
from chapter_source import read_source  # noqa: E402


def refresh(nb_path: Path) -> bool:
    import nbformat
    problems = stale(nb_path)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return False
    done = nbformat.read(nb_path, as_version=4)
    src = read_source(nb_path.with_suffix(".md"))
    injected = [c for c in done.cells
                if "injected-parameters" in c.get("metadata", {}).get("tags", [])]
    executed = iter([c for c in done.cells if c.cell_type == "code" and c not in injected])
    cells = []
    for c in src.cells:
        if c.cell_type == "code":
            ran = next(executed)
            ran.metadata = {**ran.metadata, "tags": c.metadata.get("tags", [])}
            ran.source = c.source       # same syntax tree (check_stale): the source's layout
            cells.append(ran)
            if "parameters" in c.metadata.get("tags", []):
                cells += injected  # papermill's cell stays right after the defaults
        else:
            cells.append(c)
    done.cells = cells
    # the front matter (title, gpu_parameters, ...) from the source as well
    for k, v in src.metadata.items():
        if k not in ("kernelspec", "language_info", "papermill", "widgets"):
            done.metadata[k] = v if k != "onelaunch" else {**done.metadata.get(k, {}), **v}
    nbformat.write(done, nb_path)
    print(f"[refresh_prose] {nb_path.relative_to(ROOT)}: prose refreshed")
    return True


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    ok = all([refresh(p) for p in paths])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
