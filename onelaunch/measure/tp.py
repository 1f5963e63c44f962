"""The tensor-parallel benchmark and CI jobs: what every rank runs under
``tp.launch(job, ...)`` (``bench --tp``, chapter 7, ``tests/test_tp.py``), and the table
they print. Every time is taken only after the rank's tokens passed the oracle check.
"""
from __future__ import annotations

import torch

from ..specs import get_spec
from ..tp import RUNGS
from ..tp.group import rank_engine
from ..tp.shard import rank_weights, shard_weights


def _from_rank0(obj):
    """Rank 0's ``obj`` on every rank."""
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(value) -> list:
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def sync_points(e) -> int:
    """Places per step where the ranks' partial sums meet (all-reduces, fused or not)."""
    return sum(L.op in ("o_proj_residual", "down_residual", "moe_down_residual", "qk_sumsq",
                        "lm_head_argmax") for L in e.plan)


def _alone_us(e, device, iters: int = 50) -> float | None:
    """The step's all-reduce launches by themselves, captured in one graph: µs per call."""
    from .timing import time_ms
    runs = [L.run for L in e.plan if L.op in ("all_reduce", "allreduce_residual")]
    if not runs or torch.device(device).type != "cuda":
        return None
    import torch.distributed as dist
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for r in runs:
            r()
    torch.cuda.synchronize()
    dist.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for r in runs:
            r()
    torch.cuda.synchronize()
    dist.barrier()
    return time_ms(g.replay, iters=iters, warmup=5, device=device).median_ms * 1e3 / len(runs)


def bench_job(rank, world, device, model, ctx=512, tokens=12, iters=100, rungs=RUNGS, seed=0,
              progress=None):
    """TP=1 (rank 0, same run), then every rung and the compute-only split: checked against
    the oracle (teacher-forced, the agreement rule) before it is timed. Rows on rank 0;
    with ``progress`` (a path) rank 0 also writes the rows so far after each rung, so a
    run stopped by its timeout still shows what it measured."""
    import json
    import torch.distributed as dist
    from ..engine import Engine
    from . import agree
    from .timing import plan_floor_ms, read_bandwidth, run_ctx, time_engine_step
    from ..prompt import random_prompt
    from ..weights import random_weights
    spec = get_spec(model)
    cuda = torch.device(device).type == "cuda"
    bw = read_bandwidth(device) if cuda else None
    max_ctx = run_ctx(ctx, tokens, iters)
    prompt = random_prompt(spec, ctx, seed)
    ref, one = None, None
    if rank == 0:                          # the reference and the one-GPU step, same run
        w = random_weights(spec, seed, device=device)
        ref = agree.oracle_tokens(spec, w, prompt, tokens, max_ctx)
        e = Engine(spec, w, max_ctx=max_ctx, attention="splitk", pdl=True)
        j = agree.judge(e, prompt, ref, graph=True)
        spread = {}
        one = {"model": spec.name, "tp": 1, "rung": "one GPU", "ctx": ctx, "agree": j["agree"],
               "flips": j["flips"], "ok": j["ok"], "launches": e.launches_per_step(),
               "read_tbps": bw, "floor_ms": plan_floor_ms(e.plan, bw, ctx),
               "ms_per_token": time_engine_step(e, True, iters, device, spread)
               if j["ok"] else None}
        one.update(spread)
        del e, w
        if cuda:
            torch.cuda.empty_cache()
    dist.barrier()
    ref = _from_rank0(ref)
    w = rank_weights(spec, seed, rank, world, device)
    rows = []
    for rung in list(rungs) + ["none"]:
        e = rank_engine(spec, w, rank, world, rung, device, max_ctx)
        if rung == "none":                 # compute alone: fill the same cache, time, no check
            e.teacher_forced(prompt, ref[0], graph=True)
            j = None
        else:
            j = agree.judge(e, prompt, ref, graph=True)
        ok_all = _gather(None if j is None else j["ok"])      # every rank times, or none
        timed = all(ok is not False for ok in ok_all)
        spread = {}
        ms = time_engine_step(e, True, iters, device, spread) if timed else None
        floor = plan_floor_ms(e.plan, bw, ctx)
        alone = _alone_us(e, device) if timed else None
        per_rank = _gather({"ms": ms, "floor_ms": floor, "read_tbps": bw, "alone_us": alone,
                            **spread})
        times = [p["ms"] for p in per_rank]
        r = {"model": spec.name, "tp": world, "rung": rung, "ctx": ctx,
             "launches": e.launches_per_step(), "sync_points": sync_points(e),
             "ms_per_token": max(times) if None not in times else None,
             **rank_spread(per_rank),
             "ms_per_rank": times, "floor_ms": max(p["floor_ms"] or 0 for p in per_rank) or None,
             "read_tbps_per_rank": [p["read_tbps"] for p in per_rank],
             "allreduce_alone_us": per_rank[0]["alone_us"]}
        if j is not None:
            r.update(agree=j["agree"], flips=j["flips"], ok=all(ok_all),
                     rule=f"gap < {agree.NEAR_TIE_ULPS} bf16 ulps of the top logit")
            if not r["ok"]:
                r["ms_per_token"] = None
                r["refused"] = agree.refusal(j["flips"])
        else:
            r["note"] = "compute only: no reduction, tokens not valid; not a result"
        rows.append(r)
        if progress and rank == 0:
            with open(progress, "w") as f:
                json.dump([one] + rows, f)
        del e
        if cuda:
            torch.cuda.empty_cache()
        dist.barrier()
    return finish_rows([one] + rows) if rank == 0 else None


def rank_spread(per_rank: list[dict]) -> dict:
    """The spread of a step timed on every rank: the widest range the ranks' timed steps
    allow (the fastest of any rank to the slowest of any), as ``ms_min``/``ms_max``;
    None where a rank recorded none."""
    lo = [p.get("ms_min") for p in per_rank]
    hi = [p.get("ms_max") for p in per_rank]
    if None in lo or None in hi or not per_rank:
        return {"ms_min": None, "ms_max": None}
    return {"ms_min": min(lo), "ms_max": max(hi), "timed": per_rank[0].get("timed")}


def finish_rows(rows: list[dict]) -> list[dict]:
    """The ratios of a bench --tp run, from its measured rows (also those of a run stopped
    part way, as far as they go): each row's x floor, each rung against the one-GPU step,
    and, once the compute-only row exists, each rung's split into compute and
    communication and its cost per sync point."""
    by = {r["rung"]: r for r in rows}
    one = by.get("one GPU", {}).get("ms_per_token")
    compute = by.get("none", {}).get("ms_per_token")
    for r in rows:
        ms = r.get("ms_per_token")
        if ms is None:
            continue
        r["x_floor"] = ms / r["floor_ms"] if r.get("floor_ms") else None
        if one and r["rung"] != "one GPU":
            r["vs_one_gpu"] = ms / one
        if r["rung"] not in ("none", "one GPU") and compute:
            r["compute_ms"], r["comm_ms"] = compute, ms - compute
            r["allreduce_us_in_step"] = (ms - compute) * 1e3 / r["sync_points"]
    return rows


def compare_job(rank, world, device, model, rung="gloo", seed=0, prompt_len=6, tokens=4,
                peers=None):
    """The sharded step against the unsharded one (CI, on the CPU): teacher-forced argmax
    along the oracle's tokens, the agreement verdict, and the residual stream after."""
    from ..engine import Engine
    from . import agree
    from ..prompt import random_prompt
    from ..weights import random_weights
    spec = get_spec(model)
    w = random_weights(spec, seed, device=device)
    prompt = random_prompt(spec, prompt_len, seed)
    max_ctx = prompt_len + tokens + 8
    ref = agree.oracle_tokens(spec, w, prompt, tokens, max_ctx)
    e = rank_engine(spec, shard_weights(spec, w, rank, world), rank, world, rung, device,
                    max_ctx, peers=peers)
    j = agree.judge(e, prompt, ref, graph=True)
    out = {"tokens": j["teacher_forced"], "ok": j["ok"], "agree": j["agree"],
           "x": e.x.float().cpu(), "launches": e.launches_per_step()}
    if rank == 0:
        one = Engine(spec, w, max_ctx=max_ctx, attention="splitk", pdl=True)
        j1 = agree.judge(one, prompt, ref, graph=True)
        out["one_gpu"] = {"tokens": j1["teacher_forced"], "ok": j1["ok"], "x": one.x.float().cpu()}
    return out


def format_rows(rows: list[dict]) -> str:
    """The bench --tp table: each rung against the one-GPU step of the same run."""
    f = lambda v, spec=".3f": "-" if v is None else format(v, spec)
    lines = [f"{'rung':<10} {'ms/token':>9} {'min-max':>11} {'x floor':>8} {'vs 1 GPU':>9} "
             f"{'compute':>8} {'comm':>7} {'us/AR':>6} {'alone':>6} {'launches':>8}  check"]
    for r in rows:
        check = r.get("agree", "-") if r.get("ok") is not False else "REFUSED " + r.get("agree", "")
        if r["rung"] == "none":
            check = "compute only"
        lo, hi = r.get("ms_min"), r.get("ms_max")
        spread = "-" if lo is None or hi is None else f"{lo:.3f}-{hi:.3f}"
        lines.append(f"{r['rung']:<10} {f(r.get('ms_per_token')):>9} {spread:>11} "
                     f"{f(r.get('x_floor'), '.2f'):>8} "
                     f"{f(r.get('vs_one_gpu'), '.2f'):>9} {f(r.get('compute_ms')):>8} "
                     f"{f(r.get('comm_ms')):>7} {f(r.get('allreduce_us_in_step'), '.1f'):>6} "
                     f"{f(r.get('allreduce_alone_us'), '.1f'):>6} {r.get('launches', '-'):>8}  {check}")
    return "\n".join(lines)
