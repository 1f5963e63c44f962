"""The README's headline table is the book's published run, read by
``ci/readme_table.py`` from ``results/h200/ladder.json``: a number typed in by hand, or a
new run the README has not taken, fails here."""
import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("readme_table", ROOT / "ci" / "readme_table.py")
rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rt)


@pytest.fixture(scope="module")
def ladder():
    return json.loads(rt.LADDER.read_text())


def test_the_readme_table_is_the_published_run(ladder):
    assert rt.readme_block(rt.README.read_text()) == rt.block(ladder)
    assert rt.main(["--check"]) == 0


def test_a_number_that_moved_fails_the_check(ladder, tmp_path):
    moved = copy.deepcopy(ladder)
    row = next(r for r in moved["rows"] if r["rung"] == rt.CHAIN and r["ctx"] == rt.CTX
               and r.get("run") == moved["meta"]["run"])
    row["ms_per_token"] += 0.01
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(moved))
    assert rt.block(moved) != rt.block(ladder)
    assert rt.main(["--check", "--ladder", str(path)]) == 1


def test_a_missing_row_is_a_dash_and_says_why(ladder):
    text = " ".join(rt.block(ladder).split())
    for model, name in rt.MODELS:
        for rung, label in rt.ROWS:
            if (model, rung) not in rt.rows_at(ladder):
                assert f"for {name}, {rt.WHY_NONE.get(rung, rung + ' did not run')}" in text
    assert "—" in text or all((m, r) in rt.rows_at(ladder) for m, _ in rt.MODELS
                              for r, _ in rt.ROWS)
