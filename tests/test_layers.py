"""The package's layers, in order: a module imports from its own layer or lower ones.

    core     what a decode step needs: specs, weights, oracle, plan, engine, prefill,
             text, prompt, memcap, options, env, interpreter, kernels, megakernel
    tp       tensor parallelism: sharding, the group, the spawner
    measure  timing and floors, agreement, the rungs and the ladder, sweeps, profiles,
             the tensor-parallel benchmark jobs
    peers    what a user would run instead, and ``bench``'s run beside the ladder
    report   results files, figures, chapters' tables
    cli      the command line and its ``python -m`` entry points

So a circle between two layers cannot pass: one of its imports climbs. Within a layer
imports are free (a package folder such as ``megakernel/`` is one layer). Read from each
module's import statements (``ast``: also the imports inside functions), so a lazy
import that climbs is caught as well.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "onelaunch"
LAYERS = {
    "core": ("__init__", "specs", "weights", "checkpoint", "oracle", "plan", "engine", "prefill", "text",
             "prompt", "memcap", "options", "env", "interpreter", "kernels", "megakernel"),
    "tp": ("tp",),
    "measure": ("measure",),
    "peers": ("peers",),
    "report": ("report",),
    "cli": ("cli", "bench", "profile", "__main__"),
}
ORDER = list(LAYERS)
LAYER_OF = {top: name for name, tops in LAYERS.items() for top in tops}


def layer(mod: str) -> int | None:
    """The layer (an index into ORDER) of the dotted module ``mod`` under onelaunch;
    None for a module outside the package."""
    parts = mod.split(".")
    if parts[0] != "onelaunch":
        return None
    top = parts[1] if len(parts) > 1 else "__init__"
    assert top in LAYER_OF, f"onelaunch.{top} has no layer: add it to LAYERS"
    return ORDER.index(LAYER_OF[top])


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts)


def imported(path: Path, name: str | None = None) -> set[str]:
    """The onelaunch modules ``path`` imports, as dotted names under onelaunch.
    ``name``: the module's dotted name (default: from its place under the package)."""
    rel = tuple((name or module_name(path)).split("."))
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


def climbs(path: Path, name: str | None = None) -> list[str]:
    """The imports of ``path`` from a layer above its own."""
    own = layer(name or module_name(path))
    return sorted(m for m in imported(path, name) if layer(m) > own)


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PKG)))
def test_imports_come_from_the_same_or_a_lower_layer(path):
    bad = climbs(path)
    own = ORDER[layer(module_name(path))]
    assert not bad, f"{path.relative_to(PKG.parent)} ({own}) imports from above: {bad}"


@pytest.mark.parametrize("name, src", [
    ("onelaunch.text", "from .measure.hf_check import compare_with_hf\n"),   # relative
    ("onelaunch.engine", "def f():\n    from . import tp\n"),             # lazy
    ("onelaunch.weights", "import onelaunch.report.results\n"),             # absolute
    ("onelaunch.oracle", "import importlib\nimportlib.import_module('onelaunch.peers.hf')\n"),
    ("onelaunch.measure.ladder", "def f():\n    from ..peers.rungs import peer_rungs\n"),
    ("onelaunch.tp.group", "from ..measure import agree\n"),
    ("onelaunch.peers.rungs", "from ..report import results\n"),
])
def test_the_checker_sees_a_climbing_import(tmp_path, name, src):
    """An import from a higher layer, written relative, absolute, lazily inside a
    function or through importlib, is seen; the same module's imports from lower
    layers are not."""
    p = tmp_path / "probe.py"
    p.write_text(src)
    assert climbs(p, name), src
    p.write_text("from . import agree\nfrom ..engine import Engine\nimport onelaunch.specs\n")
    assert not climbs(p, "onelaunch.measure.probe")
