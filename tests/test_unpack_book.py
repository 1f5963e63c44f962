"""ci/unpack_book.py: a book call's archive is unpacked only if it started from the state
the previous call left (no chapter in it older than here)."""
import importlib.util
import io
import json
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("unpack_book", HERE.parent / "ci" / "unpack_book.py")
unpack_book = importlib.util.module_from_spec(spec)
spec.loader.exec_module(unpack_book)


def _nb(end: str) -> bytes:
    return json.dumps({"cells": [], "metadata": {"papermill": {"end_time": end}}}).encode()


def _archive(path: Path, files: dict) -> str:
    with tarfile.open(path, "w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return str(path)


def test_refuses_an_archive_that_started_before_the_last_unpack(tmp_path):
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / "01_a.ipynb").write_bytes(_nb("2026-11-30T10:00"))
    stale = _archive(tmp_path / "stale.tar.gz", {
        "notebooks/01_a.ipynb": _nb("2026-11-30T09:00"),     # the old copy, not run
        "notebooks/02_b.ipynb": _nb("2026-11-30T11:00"),
        "results/h200/x.json": b"{}"})
    assert unpack_book.main([stale], root) == 2
    assert not (root / "notebooks" / "02_b.ipynb").exists()
    assert not (root / "results").exists()


def test_copies_the_chapters_and_gpu_results(tmp_path, capsys):
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / "01_a.ipynb").write_bytes(_nb("2026-11-30T10:00"))
    good = _archive(tmp_path / "good.tar.gz", {
        "notebooks/01_a.ipynb": _nb("2026-11-30T10:00"),     # as here: not run, fine
        "notebooks/02_b.ipynb": _nb("2026-11-30T11:00"),
        "results/h200/x.json": b'{"rows": []}',
        "results/cpu/y.json": b"{}"})
    assert unpack_book.main([good], root) == 0
    assert "02_b.ipynb" in capsys.readouterr().out
    assert (root / "notebooks" / "02_b.ipynb").exists()
    assert (root / "results" / "h200" / "x.json").read_text() == '{"rows": []}'
    assert not (root / "results" / "cpu").exists()
