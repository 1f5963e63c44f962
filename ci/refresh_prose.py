#!/usr/bin/env python3
"""Copy the prose of the chapters' sources into their executed notebooks, without a rerun.

The executed ``notebooks/<stem>.ipynb`` keeps its code cells' outputs; its markdown cells
are replaced by the source's, in the source's order, and its code cells take the source's
text where only layout or comments differ (``check_stale.same_program``). Only allowed while the
code cells still match (``ci/check_stale.py``): otherwise the numbers would sit next to
code that did not produce them, and the chapter needs a GPU rerun instead. Nor while the
source's prose reads a glued value the executed notebook lacks (prose written for code
that has not run on the GPU yet): the prose as run stays until the next GPU run.

    python ci/refresh_prose.py [NOTEBOOK.ipynb ...]    # default: every executed chapter
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
from check_stale import stale  # noqa: E402
from chapter_source import read_source  # noqa: E402


GLUE_REF = re.compile(r"\{glue(?::\w+)?\}`([^`]+)`")


def glued_names(nb) -> set[str]:
    """Names the executed notebook's outputs glue (``myst_nb.glue``/``chapter.glue``)."""
    return {o.get("metadata", {}).get("scrapbook", {}).get("name")
            for c in nb.cells for o in c.get("outputs", [])} - {None}


def missing_glue(src_nb, done_nb) -> list[str]:
    """Names the source's prose reads from its own page that the executed notebook never
    glued: prose written for code that has not run on the GPU yet."""
    used = {m for c in src_nb.cells if c.cell_type == "markdown"
            for m in GLUE_REF.findall(c.source) if "::" not in m}
    return sorted(used - glued_names(done_nb))


def refresh(nb_path: Path) -> bool:
    import nbformat
    problems = stale(nb_path)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return False
    done = nbformat.read(nb_path, as_version=4)
    src = read_source(nb_path.with_suffix(".md"))
    missing = missing_glue(src, done)
    if missing:
        # the prose as run stays: the new prose needs values only the next GPU run glues
        print(f"{nb_path.name}: the source's prose reads values this run did not glue "
              f"({', '.join(missing)}); keeping the prose as run", file=sys.stderr)
        return False
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
    shown = nb_path.relative_to(ROOT) if nb_path.is_relative_to(ROOT) else nb_path
    print(f"[refresh_prose] {shown}: prose refreshed")
    return True


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    ok = all([refresh(p) for p in paths])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
