"""Imports point inwards: the engine core (specs, weights, oracle, plan, engine, prefill,
text, the kernels, the options and the environment registry) never imports measurement,
reporting, the peers or the CLI, not even inside a function; tensor parallelism
(``tp/``) imports the core only, so its benchmark jobs live in ``measure/tp.py``."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "onelaunch"
OUTER = ("measure", "report", "peers", "cli", "bench", "profile")
CORE = ([PKG / f"{m}.py" for m in ("specs", "weights", "oracle", "plan", "engine", "prefill",
                                     "text", "options", "env", "memcap", "prompt")]
        + sorted((PKG / "kernels").glob("*.py")) + sorted((PKG / "megakernel").glob("*.py"))
        + sorted((PKG / "tp").glob("*.py")))


def _imported(path: Path, text: str | None = None) -> set[str]:
    """Every onelaunch module ``path`` (or ``text`` as if it were there) imports, as a
    dotted name below the package."""
    here = path.relative_to(PKG.parent).with_suffix("").parts[:-1]    # its package
    out = set()
    for n in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(n, ast.ImportFrom):
            base = list(here[:len(here) - n.level + 1]) if n.level else []
            mod = ".".join(base + ([n.module] if n.module else []))
            out |= {mod} | {f"{mod}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return {m.removeprefix("onelaunch.") for m in out if m.startswith("onelaunch")}


def test_the_core_imports_no_outer_layer():
    bad = {}
    for p in CORE:
        if not p.exists():
            continue
        outer = sorted(m for m in _imported(p) if m.split(".")[0] in OUTER)
        if outer:
            bad[str(p.relative_to(PKG))] = outer
    assert not bad, f"the core imports the outer layers: {bad}"


def test_the_check_sees_a_lazy_outer_import():
    """The rule itself: an import of measurement inside a kernel's function is caught."""
    src = "def f():\n    from ..measure import agree\n    from .. import cli\n"
    assert {"measure.agree", "cli"} <= _imported(PKG / "kernels" / "x.py", src)
