"""The tree speaks of what the code does and what a run measured, never of how it came
to be: no sittings, issue or log-entry numbers, device calls or edit history in code,
tests, lab, ci, results, README or book. That history lives in ``NOTES.md`` and
``notes/`` alone, which the search leaves out. ``git grep`` over the tracked files (text
only); a hit fails with its file, line and text."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Written so that this file does not match itself: "\bsession" needs a word boundary
# before the s, "left as it wa[s]" a bracket, and so on.
WORDS = (r"\bsession", r"issue ?[0-9]", r"entry [0-9]", r"entries [0-9]", r"step \(b\)",
         r"left as it wa[s]", r"once ha[d]", r"_call[0-9]", r"NOTES(\.md)? [0-9]")
HISTORY = ("NOTES.md", "notes/")

needs_git = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                               reason="needs git and a checkout")


def hits(root: Path) -> list[str]:
    """``path:line:text`` of every tracked text line under ``root`` that holds a word."""
    cmd = ["git", "grep", "-nIiE", "|".join(WORDS), "--", "."]
    cmd += [f":(exclude){p}" for p in HISTORY]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if out.returncode not in (0, 1):                       # 1: nothing found
        raise RuntimeError(f"git grep failed: {out.stderr.strip()}")
    return out.stdout.splitlines()


@needs_git
def test_the_tree_names_no_process():
    found = hits(ROOT)
    assert not found, (f"{len(found)} line(s) speak of the process (say what the code does "
                       "or name the results file):\n" + "\n".join(found[:200]))


@needs_git
def test_the_search_finds_each_word_and_spares_the_log(tmp_path):
    """A scratch repository: each word in a tracked file is a hit, the same words in
    NOTES.md and notes/ are not, and an untouched line is not."""
    said = ["measured in se" + "ssion 8", "see iss" + "ue 25", "NOTES.md en" + "try 16",
            "en" + "tries 6-8", "ste" + "p (b) of it", "the rest left as " + "it was",
            "the import it on" + "ce had", "regress_c" + "all4.md", "NOTE" + "S 23"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "code.py").write_text("".join(f"# {s}\n" for s in said) + "x = 1\n")
    (tmp_path / "NOTES.md").write_text("\n".join(said) + "\n")
    (tmp_path / "notes" / "log.md").write_text("\n".join(said) + "\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(git + ["add", "."], cwd=tmp_path, check=True)
    found = hits(tmp_path)
    assert [h.split(":", 2)[:2] for h in found] == [["code.py", str(i + 1)]
                                                    for i in range(len(said))]
