"""The engine core imports nothing from the outer layers.

The core (specs, weights, oracle, plan, engine, prefill, text, prompt, memcap, options,
env, interpreter, kernels, megakernel) is what a decode step needs; measurement (``measure/``), the peers
(``peers/``), reporting (``report/``), tensor parallelism's launcher and benchmark, and
the command line sit around it and may import it, never the other way. Read from each
core module's import statements (``ast``: also the imports inside functions), so a lazy
import that climbs is caught as well.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "onelaunch"
CORE = ("specs", "weights", "oracle", "plan", "engine", "prefill", "text", "prompt",
        "memcap", "options", "env", "interpreter", "kernels", "megakernel")
OUTER = ("measure", "peers", "report", "tp", "cli", "bench", "profile", "__main__")


def core_files():
    for name in CORE:
        p = PKG / name
        yield from (sorted(p.rglob("*.py")) if p.is_dir() else [PKG / f"{name}.py"])


def imported(path: Path, name: str | None = None) -> set[str]:
    """The onelaunch modules ``path`` imports, as dotted names under onelaunch.
    ``name``: the module's dotted name (default: from its place under the package)."""
    rel = tuple(name.split(".")) if name else path.relative_to(PKG.parent).with_suffix("").parts
    pkg = rel[:-1]                      # the package a relative import starts from
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("onelaunch")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if not mod.startswith("onelaunch"):
                continue
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}    # from . import tp
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("onelaunch"):
                out.add(arg.value)
    return out


def outer(mod: str) -> bool:
    parts = mod.split(".")
    return len(parts) > 1 and parts[0] == "onelaunch" and parts[1] in OUTER


@pytest.mark.parametrize("path", list(core_files()), ids=lambda p: str(p.relative_to(PKG)))
def test_core_imports_no_outer_layer(path):
    bad = sorted(m for m in imported(path) if outer(m))
    assert not bad, f"{path.relative_to(PKG.parent)} imports the outer layers: {bad}"


def test_the_checker_sees_a_climbing_import(tmp_path):
    """The parse catches a climbing import (``text`` importing an exception from ``check``),
    written relative, absolute or lazily inside a function."""
    for src in ("from .measure.hf_check import compare_with_hf\n",
                "def f():\n    from . import tp\n",
                "import onelaunch.report.results\n",
                "import importlib\nimportlib.import_module('onelaunch.peers.hf')\n"):
        p = tmp_path / "probe.py"
        p.write_text(src)
        assert any(outer(m) for m in imported(p, "onelaunch.probe")), src
    assert not any(outer(m) for m in imported(PKG / "engine.py"))


@pytest.mark.parametrize("path", sorted((PKG / "tp").glob("*.py")),
                         ids=lambda p: str(p.relative_to(PKG)))
def test_tp_imports_only_the_core(path):
    """Sharding, the group and the spawner import the core and each other only: the
    tensor-parallel benchmark jobs live in ``measure/tp.py``."""
    bad = sorted(m for m in imported(path) if outer(m) and m.split(".")[1] != "tp")
    assert not bad, f"{path.relative_to(PKG.parent)} imports the outer layers: {bad}"
