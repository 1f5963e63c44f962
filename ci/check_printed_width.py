#!/usr/bin/env python3
"""Fail if a line of package source or docstring that a chapter prints is over 88 columns.

The chapters print package code as code blocks, and a line over ``MAX`` (88) characters
makes such a block scroll sideways. What they print, found in each chapter's code cells:

* ``chapter.show_source(EXPR)`` or ``show_source(EXPR, lines=(A, B))``: the source of
  ``EXPR`` (``inspect.getsource``), cut to lines ``A:B`` if ``lines=`` is given;
* ``show_kernel(name, kernel, *bodies)`` (chapter 3): ``kernel`` of
  ``onelaunch/kernels/<name>.py`` and each body, from that file or from ``_common.py``
  (a ``@triton.jit`` function prints as its Python function, ``.fn``);
* ``show_doc(name)`` (chapter 3): the module docstring of ``onelaunch/kernels/<name>.py``;
* ``EXPR.__doc__`` in a chapter's statement (e.g. ``engine.__doc__.strip()`` shown in a
  text block): the docstring of the module ``EXPR``;
* a MyST ```` ```{literalinclude} ../onelaunch/FILE.py ```` directive in the prose: the
  file's ``:pyobject:`` (``Class.method`` too, decorators included), cut by
  ``:start-at:``, ``:end-at:`` and ``:lines:``, and ``:dedent:``, as Sphinx cuts them.

Calls inside a ``def`` (the helpers themselves) are not printing sites. The expressions are
evaluated in a namespace built from the chapter itself: its imports, its
``x = importlib.import_module("...")`` assignments, its top-level ``def``s, and the
assignments earlier in the same cell, each taken only if a needed name depends on it. An
expression that cannot be resolved is an error, never a skip.

    TRITON_INTERPRET=1 python ci/check_printed_width.py            # every chapter
    TRITON_INTERPRET=1 python ci/check_printed_width.py notebooks/03_fused_kernels.md

Exit 1, naming ``file:line`` of each printed line over 88 characters (and each site that
could not be resolved).
"""
from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import inspect
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX = 88
SHOW = ("show_source", "show_kernel", "show_doc")

sys.path.insert(0, str(ROOT / "ci"))
sys.path.insert(0, str(ROOT))
from check_code_width import split  # noqa: E402


class Unresolved(Exception):
    """A printing site whose object could not be found."""


@dataclass
class Printed:
    """One block a chapter prints: ``lines`` of text, the first from ``path:first``."""
    what: str
    path: Path
    first: int
    lines: list[str]
    site: str          # chapter file:line of the call


@dataclass
class Stmt:
    node: ast.stmt
    cell: int
    binds: set[str]
    uses: set[str]


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp,
          ast.DictComp, ast.GeneratorExp)


def _names(node) -> set[str]:
    """Free names of ``node``: the names it reads that are not bound inside a def,
    lambda or comprehension of its own (their arguments, locals and loop variables)."""
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Load) else set()
    free = set().union(*(_names(c) for c in ast.iter_child_nodes(node)))
    if isinstance(node, SCOPES):
        local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                 and not isinstance(n.ctx, ast.Load)}
        local |= {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)}
        free -= local
    return free


def _is_import_module(value) -> bool:
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr == "import_module")


def _binds(stmt) -> set[str]:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, ast.Assign):
        return {n.id for t in stmt.targets for n in ast.walk(t)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return set()


def _callee(call: ast.Call) -> str | None:
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
        else None
    return name if name in SHOW else None


def _sites(tree: ast.Module):
    """Printing expressions of one cell, outside any def: ``(kind, node, top statement)``;
    kind is a SHOW name or ``"__doc__"``."""
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        stack = [top]
        while stack:
            n = stack.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                              ast.ClassDef)):
                continue
            if isinstance(n, ast.Call) and _callee(n):
                yield _callee(n), n, top
            elif isinstance(n, ast.Attribute) and n.attr == "__doc__":
                yield "__doc__", n, top
            stack.extend(ast.iter_child_nodes(n))


class Chapter:
    def __init__(self, path: Path):
        self.path = path
        self.rel = _rel(path)
        self.cells = []                       # (first line, tree)
        for start, _meta, code in split(path.read_text(encoding="utf-8"))[1]:
            src = "".join(code)
            try:
                tree = ast.parse(src)
            except SyntaxError as e:
                raise Unresolved(f"{self.rel}:{start}: a code cell does not parse: {e}")
            # line numbers of the chapter file, not of the cell
            ast.increment_lineno(tree, start - 1 + len(_meta))
            self.cells.append((start, tree))
        self.stmts = [Stmt(s, k, _binds(s), _names(s))
                      for k, (_, tree) in enumerate(self.cells) for s in tree.body]

    def _pool(self, cell: int, before: ast.stmt):
        """Statements a printing site may depend on, latest first: imports, import_module
        assignments and defs of earlier cells, and everything binding earlier in its cell
        (assignments only)."""
        out = []
        for st in self.stmts:
            if st.cell > cell or (st.cell == cell and st.node.lineno >= before.lineno):
                continue
            node = st.node
            general = (isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))
                       or (isinstance(node, ast.Assign) and _is_import_module(node.value)))
            local = st.cell == cell and isinstance(node, ast.Assign)
            if general or local:
                out.append(st)
        return out[::-1]

    def namespace(self, exprs, cell: int, top: ast.stmt) -> dict:
        """Execute, in order, the statements the names of ``exprs`` depend on."""
        need = set().union(*(_names(e) for e in exprs))
        take = []
        for st in self._pool(cell, top):            # latest first
            hit = st.binds & need
            if hit:
                take.append(st)
                need -= hit
                need |= st.uses
        ns: dict = {"__name__": "__check_printed_width__"}
        missing = need - set(dir(builtins))
        if missing:
            raise Unresolved(f"no definition of {', '.join(sorted(missing))}")
        for st in sorted(take, key=lambda s: (s.cell, s.node.lineno)):
            mod = ast.Module(body=[st.node], type_ignores=[])
            exec(compile(mod, str(self.path), "exec"), ns)
        return ns

    def printed(self) -> list[Printed]:
        out = included(self.path)
        for k, (_, tree) in enumerate(self.cells):
            for kind, node, top in _sites(tree):
                site = f"{self.rel}:{node.lineno}"
                try:
                    out += _resolve(self, kind, node, k, top, site)
                except Unresolved as e:
                    raise Unresolved(f"{site}: cannot resolve "
                                     f"{ast.unparse(node)!r}: {e}") from None
                except Exception as e:   # noqa: BLE001 - any failure is unresolved
                    raise Unresolved(f"{site}: cannot resolve {ast.unparse(node)!r}: "
                                     f"{type(e).__name__}: {e}") from None
        return out


INCLUDE = re.compile(r"^```\{literalinclude\}[ \t]+(\S+)[ \t]*\n((?::[\w-]+:.*\n)*)",
                     re.M)


def _pyobject(tree: ast.Module, dotted: str):
    """The def or class ``dotted`` (``A.b`` for a method) names in ``tree``, or None."""
    body = tree.body
    node = None
    for part in dotted.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                       ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def _cut(lines: list[str], first: int, opts: dict, site: str) -> tuple[list[str], int]:
    """``lines`` (the first is file line ``first``) cut as the directive's options say."""
    for key, keep in (("start-at", True), ("end-at", False)):
        if key in opts:
            mark = opts[key].strip().strip('"')
            hit = next((i for i, ln in enumerate(lines) if mark in ln), None)
            if hit is None:
                raise Unresolved(f"{site}: cannot resolve :{key}: {mark!r}")
            if keep:
                lines, first = lines[hit:], first + hit
            else:
                lines = lines[:hit + 1]
    if "lines" in opts:
        a, _, b = opts["lines"].strip().partition("-")
        lines, first = lines[int(a) - 1:int(b or a)], first + int(a) - 1
    if "dedent" in opts:
        n = opts["dedent"].strip()
        n = int(n) if n else min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()),
                                 default=0)
        lines = [ln[n:] for ln in lines]
    return lines, first


def included(chapter: Path) -> list[Printed]:
    """The blocks a chapter's ``{literalinclude}`` directives show; a file or object that
    cannot be found is an error."""
    text = chapter.read_text(encoding="utf-8")
    out = []
    for m in INCLUDE.finditer(text):
        site = f"{_rel(chapter)}:{text.count(chr(10), 0, m.start()) + 1}"
        path = (chapter.parent / m.group(1)).resolve()
        opts = dict(re.match(r":([\w-]+):\s*(.*)", o).groups()
                    for o in m.group(2).splitlines())
        if not path.is_file():
            raise Unresolved(f"{site}: cannot resolve literalinclude {m.group(1)}")
        src = path.read_text(encoding="utf-8").splitlines()
        first, lines = 1, src
        if "pyobject" in opts:
            node = _pyobject(ast.parse("\n".join(src)), opts["pyobject"])
            if node is None:
                raise Unresolved(f"{site}: cannot resolve :pyobject: {opts['pyobject']}")
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = src[first - 1:node.end_lineno]
        lines, first = _cut(lines, first, opts, site)
        what = f"{_rel(path)}::{opts.get('pyobject') or 'file'}"
        out.append(Printed(what, path, first, lines, site))
    return out


def _rel(path) -> str:
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def _kernel_file(name: str):
    return importlib.import_module(f"onelaunch.kernels.{name}")


def _source(obj, lines, site) -> Printed:
    """What ``chapter.show_source(obj, lines)`` prints, with where each line is from."""
    src = inspect.getsource(obj)
    text = src.splitlines()
    obj = inspect.unwrap(obj)       # getsource unwraps a decorated function; so must we
    first = inspect.getsourcelines(obj)[1]
    if lines:
        a = lines[0] if lines[0] >= 0 else len(text) + lines[0]
        text = text[lines[0]:lines[1]]
        first += a
    path = Path(inspect.getsourcefile(obj))
    what = f"{getattr(inspect.getmodule(obj), '__name__', '?')}." \
           f"{getattr(obj, '__qualname__', '')}"
    return Printed(what, path, first, text, site)


def _module_doc(mod, site) -> Printed:
    """What ``mod.__doc__.strip()`` prints, with the file line of its first line."""
    if not isinstance(mod, types.ModuleType):
        raise Unresolved(f"{mod!r} is not a module")
    if not mod.__doc__:
        raise Unresolved(f"module {mod.__name__} has no docstring")
    path = Path(mod.__file__)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = tree.body[0].value       # the docstring's constant
    raw = mod.__doc__
    lead = raw[:len(raw) - len(raw.lstrip())].count("\n")
    return Printed(f"{mod.__name__} (docstring)", path, node.lineno + lead,
                   raw.strip().splitlines(), site)


def _jit_fn(obj):
    """The Python function of a ``@triton.jit`` function (``.fn``)."""
    fn = getattr(obj, "fn", None)
    if fn is None:
        raise Unresolved(f"{obj!r} has no .fn (not a @triton.jit function?)")
    return fn


def _resolve(ch: Chapter, kind, node, cell, top, site) -> list[Printed]:
    if kind == "__doc__":
        ns = ch.namespace([node.value], cell, top)
        return [_module_doc(eval(compile(ast.Expression(node.value), site, "eval"), ns),
                            site)]
    if any(isinstance(a, ast.Starred) for a in node.args) or \
            any(k.arg is None for k in node.keywords):
        raise Unresolved("starred arguments")
    exprs = list(node.args) + [k.value for k in node.keywords]
    ns = ch.namespace(exprs, cell, top)

    def ev(e):
        return eval(compile(ast.Expression(e), site, "eval"), ns)
    args = [ev(a) for a in node.args]
    kw = {k.arg: ev(k.value) for k in node.keywords}
    if kind == "show_source":
        if not args:
            raise Unresolved("no object")
        return [_source(args[0], kw.get("lines", args[1] if len(args) > 1 else None),
                        site)]
    if kind == "show_doc":
        if len(args) != 1 or kw:
            raise Unresolved("show_doc takes one kernel name")
        return [_module_doc(_kernel_file(args[0]), site)]
    # show_kernel(name, kernel, *bodies), as chapter 3 defines it
    if len(args) < 2 or kw:
        raise Unresolved("show_kernel takes (name, kernel, *bodies)")
    name, kernel, *bodies = args
    mod = _kernel_file(name)
    out = [_source(_jit_fn(getattr(mod, kernel)), None, site)]
    for b in bodies:
        f = getattr(mod, b, None) or getattr(_kernel_file("_common"), b)
        out.append(_source(_jit_fn(f), None, site))
    return out


def too_wide(blocks: list[Printed]) -> list[str]:
    """``file:line`` of each printed line over ``MAX`` characters, each line once."""
    out, seen = [], set()
    for b in blocks:
        for i, line in enumerate(b.lines):
            where = (b.path, b.first + i)
            if len(line) > MAX and where not in seen:
                seen.add(where)
                out.append(f"{_rel(b.path)}:{b.first + i}: {len(line)} > {MAX} characters"
                           f" (printed by {b.site}, {b.what})")
    return out


def chapters() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))


def check(paths) -> tuple[list[str], list[Printed]]:
    """(problems, printed blocks) of the chapters at ``paths``."""
    problems, blocks = [], []
    for p in paths:
        try:
            blocks += Chapter(Path(p)).printed()
        except Unresolved as e:
            problems.append(str(e))
    return problems + too_wide(blocks), blocks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path,
                    help="chapter sources (default: notebooks/[0-9][0-9]_*.md)")
    a = ap.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    files = a.files or chapters()
    problems, blocks = check(files)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"[check_printed_width] {len(problems)} problem(s) in {len(blocks)} printed "
              f"block(s) of {len(files)} chapter(s)", file=sys.stderr)
        return 1
    n = sum(len(b.lines) for b in blocks)
    print(f"[check_printed_width] {len(files)} chapter(s), {len(blocks)} printed blocks, "
          f"{n} lines: none over {MAX} characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
