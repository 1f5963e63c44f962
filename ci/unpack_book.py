#!/usr/bin/env python3
"""Unpack one book call's archive (``ci/gpu_book.sh``) into this checkout: the executed
chapters and the GPU results files (never ``results/cpu``).

    python ci/unpack_book.py ARCHIVE

A book run may take several device calls (the chapters in groups), and each call runs on
a copy of this working tree as it was when the call started; its archive holds every
chapter and results file of that copy, run or not. Unpacking a call whose copy predates
the previous call's unpacking would put the previous call's chapters and results back to
their older state. So, before copying anything: every chapter in the archive must be at
least as new (papermill's ``end_time``) as the one here. If one is older, nothing is
copied and the script exits 2: start the next call only after unpacking the last one.
"""
from __future__ import annotations

import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def end_time(path: Path) -> str:
    """papermill's end time of an executed chapter ('' if it has none)."""
    try:
        meta = json.loads(path.read_text())["metadata"]
    except (OSError, ValueError, KeyError):
        return ""
    return (meta.get("papermill") or {}).get("end_time") or ""


def main(argv: list[str], root: Path = ROOT) -> int:
    if len(argv) != 1:
        print("usage: python ci/unpack_book.py ARCHIVE", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        with tarfile.open(argv[0]) as t:
            t.extractall(d, filter="data")
        src = Path(d)
        chapters = sorted((src / "notebooks").glob("*.ipynb"))
        stale = [p.name for p in chapters
                 if end_time(p) < end_time(root / "notebooks" / p.name)]
        if stale:
            print(f"[unpack_book] {argv[0]}: {', '.join(stale)} older than here: this call "
                  "started before the last archive was unpacked; nothing copied (rerun "
                  "the call, or merge by hand)", file=sys.stderr)
            return 2
        new = [p.name for p in chapters
               if end_time(p) > end_time(root / "notebooks" / p.name)]
        for p in chapters:
            shutil.copy2(p, root / "notebooks" / p.name)
        for gpu in sorted((src / "results").glob("*/")):
            if gpu.name != "cpu":
                shutil.copytree(gpu, root / "results" / gpu.name, dirs_exist_ok=True)
    print(f"[unpack_book] {argv[0]}: chapters run in this call: {', '.join(new) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
