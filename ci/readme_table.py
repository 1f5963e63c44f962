#!/usr/bin/env python3
"""The README's headline table, read from the book's published run
(``results/h200/ladder.json``, ctx 512): the floor, the chain of kernels + PDL, the one
launch, gpt-fast compiled and llama.cpp, for both models, with ms per token (min-max) and
x floor as the file holds them, and the sentence that says which rung wins.

    python ci/readme_table.py                 # print the block
    python ci/readme_table.py --write         # put it into README.md between the markers
    python ci/readme_table.py --check         # exit 1 if README.md's block differs

The block sits between ``BEGIN`` and ``END``; nothing in it is typed by hand.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LADDER = ROOT / "results" / "h200" / "ladder.json"
README = ROOT / "README.md"
BEGIN = "<!-- ladder table: python ci/readme_table.py --write -->"
END = "<!-- end of ladder table -->"
CTX = 512
MODELS = (("qwen2.5-1.5b", "Qwen2.5-1.5B"), ("olmoe-1b-7b", "OLMoE-1B-7B"))
CHAIN, MEGA = "+ PDL", "one launch (megakernel)"
WHY_NONE = {MEGA: "its one launch is measured in the lab, not in the book's run "
                  "(chapter 8)",
            "gpt-fast compiled": "gpt-fast has no mixture-of-experts step"}
ROWS = ((CHAIN, "the chain of kernels + PDL (the engine)"),
        (MEGA, "one launch (megakernel)"),
        ("gpt-fast compiled", "gpt-fast compiled (torch.compile)"),
        ("llama.cpp", "llama.cpp (llama-bench)"))


def rows_at(ladder: dict, ctx: int = CTX) -> dict:
    """{(model, rung): row} of the run the file's meta names, at ``ctx``."""
    run = ladder["meta"]["run"]
    return {(r["model"], r["rung"]): r for r in ladder["rows"]
            if r["ctx"] == ctx and r.get("run") == run}


def _cell(row: dict | None) -> tuple[str, str]:
    if row is None:
        return "—", "—"
    return (f"{row['ms_per_token']:.3f} ({row['ms_min']:.3f}-{row['ms_max']:.3f})",
            f"{row['x_floor']:.2f}")


def block(ladder: dict) -> str:
    meta, rows = ladder["meta"], rows_at(ladder)
    for model, _ in MODELS:
        if (model, CHAIN) not in rows:
            raise SystemExit(f"error: {LADDER} has no '{CHAIN}' row for {model} at ctx {CTX} "
                             f"in run {meta['run']}: rerun the book's chapters")
    head = "| ctx 512, batch 1, bf16 |" + "".join(
        f" {name}: ms / token (min-max) | x floor |" for _, name in MODELS)
    out = [head, "|---|" + "---|---|" * len(MODELS)]
    floor = "| floor (the bytes a token reads / the read bandwidth measured in the run) |"
    for model, _ in MODELS:
        floor += f" {rows[model, CHAIN]['floor_ms']:.3f} | 1.00 |"
    out.append(floor)
    for rung, label in ROWS:
        line = f"| {label} |"
        for model, _ in MODELS:
            ms, x = _cell(rows.get((model, rung)))
            line += f" {ms} | {x} |"
        out.append(line)
    out += ["", _fill(_caption(meta, rows)), "", _fill(_winner(rows))]
    return "\n".join(out)


def _fill(text: str) -> str:
    return textwrap.fill(text, 90, break_on_hyphens=False)


def _caption(meta: dict, rows: dict) -> str:
    tbps = rows[MODELS[0][0], CHAIN]["read_tbps"]
    missing = [f"for {name}, {WHY_NONE.get(rung, rung + ' did not run')}"
               for model, name in MODELS for rung, _ in ROWS[1:] if (model, rung) not in rows]
    text = (f"{meta['gpu_name']}, the book's run `{meta['run']}` (commit `{meta['commit']}`, "
            f"{meta['date'][:10]}), read bandwidth {tbps:.2f} TB/s; ratios are to each "
            "model's own floor (OLMoE's: the bytes of its active parameters). The engine's "
            "rungs and gpt-fast were checked against the oracle before they were timed; "
            "llama.cpp times itself.")
    if missing:
        text += " A dash: " + "; ".join(missing) + "."
    return text


def _winner(rows: dict) -> str:
    model = MODELS[0][0]
    chain = rows[model, CHAIN]["ms_per_token"]
    parts = [f"{rows[model, rung]['ms_per_token'] / chain:.2f}x faster than {label.split(' (')[0]}"
             for rung, label in ROWS[2:] if (model, rung) in rows]
    text = ("The chain of kernels + PDL wins, not the one launch: for Qwen it is "
            + ", ".join(parts) + ".")
    if (model, MEGA) in rows:
        mega = rows[model, MEGA]["ms_per_token"]
        text += (f" The one launch is {100 * (mega / chain - 1):.0f}% slower than the chain; "
                 "chapter 8 shows where its time goes.")
    return text


def readme_block(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"error: README.md has no '{BEGIN}' ... '{END}' block")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="put the block into README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md differs")
    ap.add_argument("--ladder", type=Path, default=LADDER)
    ap.add_argument("--readme", type=Path, default=README)
    a = ap.parse_args(argv)
    want = block(json.loads(a.ladder.read_text()))
    if a.write:
        text = a.readme.read_text()
        readme_block(text)
        head, rest = text.split(BEGIN, 1)
        a.readme.write_text(head + BEGIN + "\n" + want + "\n" + END + rest.split(END, 1)[1])
    elif a.check:
        have = readme_block(a.readme.read_text())
        if have != want:
            print(f"README.md's table is not {a.ladder}'s: run python ci/readme_table.py "
                  "--write", file=sys.stderr)
            return 1
    else:
        print(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
