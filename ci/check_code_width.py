#!/usr/bin/env python3
"""Fail if a line inside a chapter's code cell is wider than the book shows unscrolled.

A code cell of a MyST source (```` ```{code-cell} ipython3 ```` ... ```` ``` ````) is shown as
a code block; a line over ``MAX`` (88) characters makes that block scroll sideways.

    python ci/check_code_width.py notebooks/*.md          # exit 1, naming file:line of each
    python ci/check_code_width.py --against main notebooks/0[1-6]_*.md

``--against REF`` also proves a re-wrap changed layout only: for each file, the version at
git ``REF`` must have the same number of code cells, the same cell metadata lines, an
identical ``ast.dump`` for every cell (comments and line breaks drop out of the AST), and
byte-identical text outside the code cells.
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX = 88
FENCE = "```{code-cell}"


def split(text: str):
    """(prose, cells): prose is every line outside code cells (fences included), cells a
    list of (first line number, metadata lines, code lines) for each code cell."""
    prose, cells, cur = [], [], None
    for i, line in enumerate(text.splitlines(keepends=True), 1):
        if cur is None:
            prose.append(line)
            if line.startswith(FENCE):
                cur = (i + 1, [], [])
        elif line.rstrip("\n") == "```":
            prose.append(line)
            cells.append(cur)
            cur = None
        elif not cur[2] and (line.startswith(":") or (cur[1] and not line.strip())):
            cur[1].append(line)  # ":tags: [...]" and the blank line after it
        else:
            cur[2].append(line)
    if cur is not None:
        raise ValueError(f"unclosed code cell starting at line {cur[0] - 1}")
    return "".join(prose), cells


def too_wide(path, text: str) -> list[str]:
    """``file:line`` of each code-cell line over ``MAX`` characters."""
    out = []
    for start, meta, code in split(text)[1]:
        for j, line in enumerate(meta + code):
            n = len(line.rstrip("\n"))
            if n > MAX:
                out.append(f"{path}:{start + j}: {n} > {MAX} characters")
    return out


def _dump(code: str) -> str:
    return ast.dump(ast.parse(code))


def differs(path: Path, text: str, ref: str) -> list[str]:
    """Problems of ``text`` (the file at ``path``) against the file at git ``ref``."""
    rel = path.resolve().relative_to(ROOT).as_posix()
    old = subprocess.run(["git", "show", f"{ref}:{rel}"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return compare(path, old, text, ref)


def compare(path, old: str, text: str, ref: str) -> list[str]:
    """Problems of ``text`` unless it is ``old`` with only its code cells' layout changed."""
    (p_old, c_old), (p_new, c_new) = split(old), split(text)
    out = []
    if p_old != p_new:
        out.append(f"{path}: text outside the code cells differs from {ref}")
    if len(c_old) != len(c_new):
        return out + [f"{path}: {len(c_new)} code cells, {ref} has {len(c_old)}"]
    for k, ((_, m_old, old_code), (start, m_new, new_code)) in enumerate(zip(c_old, c_new), 1):
        if m_old != m_new:
            out.append(f"{path}:{start}: cell {k}'s metadata differs from {ref}")
        try:
            same = _dump("".join(old_code)) == _dump("".join(new_code))
        except SyntaxError as e:
            out.append(f"{path}:{start}: cell {k} does not parse: {e}")
            continue
        if not same:
            out.append(f"{path}:{start}: cell {k}'s AST differs from {ref}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--against", metavar="REF",
                    help="also check that only layout changed since git REF")
    a = ap.parse_args(argv)
    problems, cells = [], 0
    for path in a.files:
        text = path.read_text(encoding="utf-8")
        problems += too_wide(path, text)
        cells += len(split(text)[1])
        if a.against:
            problems += differs(path, text, a.against)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    what = f", and only their layout changed since {a.against}" if a.against else ""
    print(f"[check_code_width] {len(a.files)} file(s), {cells} code cells: "
          f"no line over {MAX} characters{what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
