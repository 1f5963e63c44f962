"""The book's answer (the closing page, ``notebooks/09_the_answer.md``), read from
results files only: how close one request gets to the floor for each model on one GPU
and on two, beside the peers of the same run, and the figures others report (cited as
reported, never re-measured). No GPU work: the page reads the same files on any machine.

:func:`answer` gathers the numbers (one dict a model), :func:`table_rows` the closing
table, and the ``*_text`` functions the prose, each sentence built from those numbers;
where a row is missing (llama.cpp before its first measured run, or no two-GPU file)
the text says so instead of a number.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import ladder_file
from ..measure.rungs import MEGA
from ..peers.llama_cpp import NAME as LLAMA
from .results import RESULTS, row_passes

H200_DATASHEET_TBPS = 4.8          # NVIDIA H200 datasheet, HBM3e
COMPILED = ("gpt-fast compiled", "oracle compiled", "HF static")   # strongest first

# Figures others report: cited, with their source, never measured here.
REPORTED = {
    "seed_4090_qwen": {"ms": 3.72, "floor_ms": 3.06, "gpu": "RTX 4090",
                       "src": "the seed post (fused + graph + split-K)"},
    "seed_4090_olmoe": {"ms": 3.28, "floor_ms": 2.34, "gpu": "RTX 4090",
                        "src": "the seed post (fused MoE)"},
    "seed_vllm_olmoe": {"ms": 3.70, "floor_ms": 2.34, "gpu": "RTX 4090",
                        "src": "the seed post (vLLM 0.11, CUDA graphs on)"},
    "hazy": {"text": "Hazy Research's low-latency megakernel for Llama-3.2-1B reports "
                     "under 1 ms a forward pass on an H100, 78% of the datasheet "
                     "bandwidth, about 2.5x faster than vLLM and 1.5x than SGLang "
                     "(\"Look Ma, No Bubbles\", 2025)", "datasheet_share": 0.78},
    "mirage": {"text": "Mirage's Persistent Kernel (MPK, arXiv 2512.22219) reports up "
                       "to 1.7x lower latency than vLLM and SGLang and 1-2 µs "
                       "between tasks; an independent run put it at 1.02x a measured "
                       "copy floor for Qwen3-8B on an A100 (cloudrift-ai/emmy PR 502)"},
}


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _ours(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not ladder_file.is_peer(r) and r["rung"] != LLAMA]


def _fastest(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if row_passes(r)]
    return min(ok, key=lambda r: r["ms_per_token"]) if ok else None


def one_gpu(rows: list[dict], model: str) -> dict:
    """One model's one-GPU numbers from the ladder's rows (one run): the floor, our
    fastest rung that passed its check, the strongest compiled peer, llama.cpp (this
    model's fastest llama.cpp row that passed, in this run one chapter measures it: 6
    for OLMoE, 8 for Qwen; else one that gave no time, so the page can say why)."""
    mine = [r for r in rows if r["model"] == model]
    floor = ladder_file.summary(rows, model)["floor_ms"]
    compiled = [r for r in mine if r["rung"] in COMPILED]
    llama = [r for r in mine if r["rung"] == LLAMA]
    bw = next((r["read_tbps"] for r in mine if r.get("read_tbps")), None)
    return {"floor_ms": floor, "best": _fastest(_ours(mine)),
            "one_launch": _fastest([r for r in mine if r["rung"] == MEGA]),
            "compiled": _fastest(compiled),
            "llama": _fastest(llama) or (llama[0] if llama else None),
            "read_tbps": bw}


def two_gpu(rows: list[dict], model: str) -> dict | None:
    """One model's two-GPU numbers from the tensor-parallel file: the fastest all-reduce
    rung that passed (``ok``), the one-GPU step and floor of the same run."""
    mine = [r for r in rows if r["model"] == model]
    one = next((r for r in mine if r.get("tp") == 1), None)
    two = [r for r in mine
           if r.get("tp") == 2 and r.get("ok") and r.get("ms_per_token")]
    if one is None or not two:
        return None
    best = min(two, key=lambda r: r["ms_per_token"])
    return {"rung": best["rung"], "ms": best["ms_per_token"],
            "one_gpu_ms": one["ms_per_token"], "one_gpu_floor_ms": one["floor_ms"],
            "own_floor_ms": best["floor_ms"],
            "agree": best.get("agree"), "row": best}


def what_is_left(rows: list[dict], model: str, rung: str, top: int = 3) -> dict | None:
    """Where our fastest chained rung spends its time beyond the bytes, per op, from the
    step profile (``profile.json``): the ops with the most time beyond their bytes."""
    mine = [r for r in rows if r["model"] == model and r["rung"] == rung]
    if not mine:
        return None
    ops = sorted(mine, key=lambda r: -r["beyond_ms"])
    return {"rung": rung, "beyond_ms": sum(r["beyond_ms"] for r in mine),
            "step_ms": mine[0].get("step_ms"), "floor_ms": mine[0].get("floor_ms"),
            "top": [(r["op"], r["beyond_ms"], r.get("launches")) for r in ops[:top]]}


def answer(root: Path = RESULTS, gpu: str | None = None) -> dict:
    """Everything the closing page prints, per model, with the files' run and commit."""
    data = ladder_file.load_ladder(gpu, root)
    if data is None:
        return {"gpu": None, "models": {}}
    gpu = data["meta"]["gpu"]
    rows, _ = ladder_file.one_run(data["rows"])
    tp = _load(Path(root) / f"{gpu}x2" / "tp.json")
    # the step profile and the one launch's clock: only the ladder's own run's
    same_run = lambda d: d if d and d["meta"].get("run") == data["meta"].get("run") else None
    prof = same_run(_load(Path(root) / gpu / "profile.json"))
    clock = same_run(_load(Path(root) / gpu / "step_clock.json"))
    models = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        a = one_gpu(rows, m)
        a["two"] = two_gpu(tp["rows"], m) if tp else None
        best = a["best"]
        a["left"] = (what_is_left(prof["rows"], m, best["rung"])
                     if prof and best else None)
        a["clock"] = next((r for r in (clock or {}).get("rows", [])
                           if r["model"] == m and r.get("op") is None), None)
        models[m] = a
    meta = data["meta"]
    return {"gpu": gpu, "gpu_name": meta.get("gpu_name", gpu), "run": meta.get("run"),
            "commit": meta.get("commit"), "models": models,
            "tp_commit": tp["meta"].get("commit") if tp else None}


def _x(ms, floor):
    return ms / floor if ms and floor else None


def spread(row: dict | None) -> str | None:
    """``"min-max"`` ms over a row's timed repeats, where its run recorded them."""
    lo, hi = (row or {}).get("ms_min"), (row or {}).get("ms_max")
    return f"{lo:.3f}-{hi:.3f}" if lo is not None and hi is not None else None


def table_rows(ans: dict) -> list[dict]:
    """The closing table: per model, each way to run one request, its ms/token, spread
    and ratio to the one-GPU floor (for the two-GPU row, the floor of its own run)."""
    out = []
    for m, a in ans["models"].items():
        f = a["floor_ms"]

        def add(what, ms, floor=f, row=None, note=""):
            out.append({"model": _name(m), "what": what, "ms_per_token": ms,
                        "spread": spread(row), "x_floor": _x(ms, floor), "note": note})
        add("floor: bytes / read bandwidth", f)
        if a["best"]:
            add(f"ours, one GPU ({a['best']['rung']})", a["best"]["ms_per_token"],
                row=a["best"])
        one = a.get("one_launch")
        if one and one is not a["best"]:
            add(f"ours, {MEGA}", one["ms_per_token"], row=one)
        if a["two"]:
            t = a["two"]
            add(f"ours, two GPUs ({t['rung']})", t["ms"], floor=t["one_gpu_floor_ms"],
                row=t.get("row"), note="x its run's one-GPU floor"
                + ("" if spread(t.get("row")) else "; that run recorded no spread"))
        if a["compiled"]:
            c = a["compiled"]
            add(f"compiled peer ({c['rung']})", c["ms_per_token"], row=c)
        lm = a["llama"]
        if lm and row_passes(lm):
            add("llama.cpp (llama-bench)", lm["ms_per_token"], row=lm,
                note="its own timing, no oracle check")
        else:
            add("llama.cpp (llama-bench)", None,
                note="no time in this run" if lm else "not measured in this run")
    return out


# ---- the prose: every number from ``answer()`` or ``REPORTED`` ----------------------
NAMES = {"qwen2.5-1.5b": "Qwen2.5-1.5B", "olmoe-1b-7b": "OLMoE-1B-7B"}


def _name(m: str) -> str:
    return NAMES.get(m, m)


def _faster(ours: float, theirs: float, who: str) -> str:
    """Which is faster, said the right way round."""
    if theirs >= ours:
        return f"ours is {theirs / ours:.2f}x faster"
    return f"{who} is {ours / theirs:.2f}x faster than ours"


def model_text(m: str, a: dict, gpu_name: str) -> str:
    """One model's paragraph: one GPU, two GPUs, the compiled peer, llama.cpp."""
    f, best = a["floor_ms"], a["best"]
    if best is None or not f:
        return f"**{_name(m)}.** No rung of ours has a checked time in this run."
    ms = best["ms_per_token"]
    s = (f"**{_name(m)}.** The floor is {f:.3f} ms a token (its bytes at the "
         f"{a['read_tbps']:.2f} TB/s this run measured). Our fastest rung, "
         f"*{best['rung']}*, takes {ms:.3f} ms: {ms / f:.2f}x the floor.")
    if a["read_tbps"]:
        tbps = f * a["read_tbps"] / ms
        s += (f" It streams {tbps:.2f} TB/s, {tbps / H200_DATASHEET_TBPS:.0%} of the "
              f"{gpu_name}'s datasheet {H200_DATASHEET_TBPS} TB/s.")
    t = a["two"]
    if t:
        s += (f" On two GPUs the *{t['rung']}* exchange takes {t['ms']:.3f} ms: "
              f"{t['ms'] / t['one_gpu_floor_ms']:.2f}x the one-GPU floor, "
              f"{t['ms'] / t['one_gpu_ms']:.2f}x the one-GPU step of the same run, and "
              f"{t['ms'] / t['own_floor_ms']:.2f}x the floor of the half that each GPU "
              "reads.")
    else:
        s += " No two-GPU run of this model is on file."
    c = a["compiled"]
    if c:
        s += (f" The strongest compiled peer, *{c['rung']}*, takes "
              f"{c['ms_per_token']:.3f} ms ({c['ms_per_token'] / f:.2f}x): "
              f"{_faster(ms, c['ms_per_token'], 'it')}.")
    lm = a["llama"]
    if lm and row_passes(lm):
        lo, hi = lm.get("ms_min"), lm.get("ms_max")
        spread = f", {lo:.3f}-{hi:.3f} over its repeats" if lo and hi else ""
        s += (f" llama.cpp takes {lm['ms_per_token']:.3f} ms{spread} "
              f"({lm['ms_per_token'] / f:.2f}x; llama-bench's own timing, no oracle "
              f"check possible): {_faster(ms, lm['ms_per_token'], 'llama.cpp')}.")
    elif lm:
        why = str(lm.get("error") or lm.get("refused") or "no time").splitlines()[0]
        s += f" llama.cpp gave no time in this run: {why[:200]}."
    else:
        s += (" llama.cpp has no row in this run's ladder: the chapters measure it "
              "where llama-bench was built before the book ran (`bash ci/gpu_run.sh "
              "llama,book`), and until then no figure is shown for it.")
    return s


def fixed_cost_text(ans: dict, model: str = "qwen2.5-1.5b") -> str:
    """Why the H200 sits further from its floor than the seed's RTX 4090: the bytes got
    faster, the costs beyond them did not shrink in proportion."""
    a = ans["models"].get(model)
    if not a or not a["best"] or not a["floor_ms"]:
        return ""
    r = REPORTED["seed_4090_qwen"]
    f, ms = a["floor_ms"], a["best"]["ms_per_token"]
    here, there = ms - f, r["ms"] - r["floor_ms"]
    weigh = (here / f) / (there / r["floor_ms"])
    faster = r["floor_ms"] / f
    return (f"The seed post reached {r['ms'] / r['floor_ms']:.2f}x the floor for "
            f"{_name(model)} on an {r['gpu']} ({r['ms']:.2f} ms against a "
            f"{r['floor_ms']:.2f} ms floor, as reported). The {ans['gpu_name']} reads "
            f"the same bytes {faster:.1f} times as fast, but what a step pays beyond "
            f"its bytes shrank only from {there:.2f} ms there to {here:.2f} ms here: "
            f"{there / r['floor_ms']:.0%} of the {r['gpu']}'s floor, {here / f:.0%} of "
            "this floor. Launch boundaries, each kernel's wait for the one before it "
            "and the last programs of each phase cost microseconds whatever the "
            f"bandwidth, so they weigh {weigh:.1f} times as much against a short byte "
            "time.")


def others_text() -> str:
    """The peers that cannot run here and the published megakernels, as reported."""
    v, o = REPORTED["seed_vllm_olmoe"], REPORTED["seed_4090_olmoe"]
    return ("vLLM and SGLang cannot be brought to the GPU host the book runs on (no network there, "
            "and their wheels are far larger than what a run can carry), so they are "
            f"cited, not measured: on an {v['gpu']} the seed post reports vLLM 0.11 at "
            f"{v['ms']:.2f} ms a token for OLMoE-1B-7B, {v['ms'] / v['floor_ms']:.2f}x "
            f"its active-weight floor, against {o['ms']:.2f} ms "
            f"({o['ms'] / o['floor_ms']:.2f}x) for its fused MoE kernels. "
            f"{REPORTED['hazy']['text']}. "
            f"{REPORTED['mirage']['text']}.")


def one_launch_text(ans: dict) -> str:
    """Chapter 8's one launch set against the book's fastest step, per model that has it."""
    out = ""
    for m, a in ans["models"].items():
        one, best = a.get("one_launch"), a.get("best")
        if one and best and one is not best:
            out += (f"For {_name(m)} it takes {one['ms_per_token']:.4g} ms a token "
                    f"({_x(one['ms_per_token'], a['floor_ms']):.2f}x the floor), "
                    f"{one['ms_per_token'] / best['ms_per_token']:.2f} times the "
                    f"{best['ms_per_token']:.4g} ms of *{best['rung']}*: the one launch is "
                    "not yet this book's fastest step. ")
        elif one:
            out += (f"For {_name(m)} it is this book's fastest step: "
                    f"{one['ms_per_token']:.4g} ms a token. ")
    return out


def left_text(ans: dict) -> str:
    """What is left: the time beyond the bytes, per op, of our fastest rung (the step
    profile), where chapter 8's one launch stands, and where it waits (its clock), each
    where this run has it on file."""
    parts, clocks = [], []
    for m, a in ans["models"].items():
        left = a.get("left")
        if left:
            ops = ", ".join(f"{op} {b * 1e3:.0f} µs" for op, b, _ in left["top"])
            parts.append(f"{_name(m)}'s *{left['rung']}* step spends "
                         f"{left['beyond_ms']:.3f} ms beyond its bytes, most of it in "
                         f"{ops}")
        c = a.get("clock")
        if c:
            clocks.append(f"{_name(m)}'s clocked step takes {c['step_us']:.0f} µs, its "
                          f"median SM waiting on counters {c['wait_share']:.0%} of it, "
                          f"most before {c['most_waiting_op']}")
    one = one_launch_text(ans)
    if not parts and not clocks and not one:
        return "No step profile is on file for this run."
    out = ("; ".join(parts) + ". None of it is arithmetic: each op waits for the one "
           "before it, then reads its vector, then streams its weights, and the memory "
           "idles while it waits. " if parts else "")
    out += ("Chapter 8's one launch a step keeps the weights streaming through those "
            "waits: a loader on every SM that never waits on a dependency, and counters "
            "in place of barriers, as in Hazy Research's megakernel. " + one)
    if clocks:
        out += ("What is left is in its clock: " + "; ".join(clocks) + ". Each stage of "
                "a layer that reads few bytes still costs a counter edge and a round trip "
                "through memory.")
    else:
        out += "This run has no clock of it on file."
    return out
