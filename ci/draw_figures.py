#!/usr/bin/env python3
"""Figures the book draws when it is built, from a committed GPU run's rows.

    python ci/draw_figures.py            # -> _static/generated/profile_<model>.png

Chapter 8's step profiles: ``results/h200/profile.json`` (written by the chapter's GPU run)
drawn with :func:`onelaunch.profile.draw_profile`, one figure a model, as the chapter's
own cell draws them. The book build (ci/book.sh) runs this before staging the sources;
the chapter's prose shows the files. Nothing is measured here: only that run's rows.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "_static" / "generated"


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import matplotlib
    matplotlib.use("Agg")
    from onelaunch import profile
    src = ROOT / "results" / "h200" / "profile.json"
    if not src.exists():
        print(f"[draw_figures] no {src.relative_to(ROOT)}: nothing to draw")
        return 0
    data = json.loads(src.read_text())
    rows = [r for r in data["rows"] if not (r.get("refused") or r.get("error"))]
    OUT.mkdir(parents=True, exist_ok=True)
    for model in dict.fromkeys(r["model"] for r in rows):
        fig = profile.draw_profile(rows, model)
        path = OUT / f"profile_{model}.png"
        fig.savefig(path, dpi=150)
        print(f"[draw_figures] {path.relative_to(ROOT)} (run {data['meta'].get('run')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
