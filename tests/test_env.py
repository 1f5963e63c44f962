"""The environment is read in one place (``onelaunch/env.py``): every variable the package
names is registered there with what it does; the engine core, the kernels, tensor
parallelism and the CLI read none directly; the persistent layer's switches are options
(``options.PersistentOptions``), not variables."""
import ast
from pathlib import Path

import pytest

from onelaunch import env
from onelaunch.options import PersistentOptions

PKG = Path(__file__).resolve().parent.parent / "onelaunch"
# the engine core and the layers this rule covers (measurement and reporting read the
# run's commit and id through env too, once they move to it)
CORE = [p for p in PKG.glob("*.py")] + [p for d in ("kernels", "tp", "cli", "megakernel")
                                        for p in (PKG / d).glob("*.py")]
# writes the NCCL / symmetric-memory safety settings its rank processes inherit
WRITES_ONLY = {PKG / "tp" / "spawn.py"}


def _environ_reads(path: Path) -> list[int]:
    """Lines of ``path`` that read os.environ or call os.getenv."""
    lines = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv") and \
                isinstance(n.value, ast.Name) and n.value.id == "os":
            lines.append(n.lineno)
    return lines


def test_only_env_reads_the_environment():
    bad = {str(p.relative_to(PKG)): _environ_reads(p) for p in CORE
           if p.name != "env.py" and p not in WRITES_ONLY and _environ_reads(p)}
    assert not bad, f"read the environment through onelaunch.env: {bad}"


def test_every_named_variable_is_registered():
    """Each ONELAUNCH_* name in the package is in ``env.VARS``, and none is a persistent
    layer switch (those are ``PersistentOptions`` fields)."""
    named = set()
    for p in PKG.rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and \
                    n.value.startswith("ONELAUNCH_"):
                named.add(n.value)
    assert named and named <= set(env.VARS), named - set(env.VARS)
    assert not [v for v in env.VARS if v.startswith("ONELAUNCH_PERSIST")]
    assert all(isinstance(what, str) and len(what) > 20 for what in env.VARS.values())


def test_reader(monkeypatch):
    monkeypatch.setenv("ONELAUNCH_NO_PROGRESS", "1")
    assert env.flag("ONELAUNCH_NO_PROGRESS") and env.get("ONELAUNCH_NO_PROGRESS") == "1"
    monkeypatch.setenv("ONELAUNCH_RUN", "")
    assert env.get("ONELAUNCH_RUN", "none") == "none"          # empty is unset
    with pytest.raises(KeyError, match="not a registered"):
        env.get("ONELAUNCH_PERSIST_GRID")


def test_persistent_options_are_frozen_defaults():
    """``PersistentOptions()`` is the launch table as measured: no override set."""
    o = PersistentOptions()
    assert (o.grid, o.per_sm, o.stages, o.tile, o.fold_rope, o.pdl) == (None,) * 6
    assert (o.coop, o.split, o.clock) == (True, "0", False)
    with pytest.raises(Exception):
        o.clock = True
