#!/usr/bin/env python3
"""Prove that a re-wrap changed layout only: the code of each file is the code at git REF.

    python ci/same_code.py main onelaunch/oracle.py onelaunch/kernels/*.py

For each file, the module at git ``REF`` and the file now must have identical
``ast.dump`` once every docstring (module, class, function) is taken out, and each
docstring must be equal after collapsing runs of whitespace: comments, line breaks,
indentation and the wrapping of docstrings may differ, nothing else. Exit 1, naming each
file that differs.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _strip_docstrings(tree: ast.Module) -> list[str]:
    """Remove the docstrings of ``tree`` in place; return them, whitespace collapsed, in
    the order of the nodes that held them."""
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docs.append(" ".join(first.value.value.split()))
                node.body = node.body[1:] or [ast.Pass()]
    return docs


def same(old: str, new: str) -> list[str]:
    """What differs between two module sources beyond layout (empty: nothing)."""
    t_old, t_new = ast.parse(old), ast.parse(new)
    d_old, d_new = _strip_docstrings(t_old), _strip_docstrings(t_new)
    out = []
    if ast.dump(t_old) != ast.dump(t_new):
        out.append("syntax tree (docstrings removed) differs")
    if d_old != d_new:
        n = sum(a != b for a, b in zip(d_old, d_new)) + abs(len(d_old) - len(d_new))
        out.append(f"{n} docstring(s) differ beyond whitespace")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    ref, files = argv[0], argv[1:]
    bad = 0
    for f in files:
        rel = Path(f).resolve().relative_to(ROOT).as_posix()
        old = subprocess.run(["git", "show", f"{ref}:{rel}"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        problems = same(old, Path(f).read_text(encoding="utf-8"))
        for p in problems:
            print(f"{rel}: {p} (against {ref})", file=sys.stderr)
        bad += bool(problems)
        if not problems:
            print(f"{rel}: same code as {ref} (AST identical without docstrings, "
                  f"docstrings equal up to whitespace)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
