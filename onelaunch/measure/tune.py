"""Tuning: launch configurations checked, then timed, and the fastest written to the
tuned table (``kernels/tuned/<arch>.json``).

:func:`config_sweep` tries configurations of each GEMV kernel alone (each checked against
its reference first); :func:`plan_config_sweep` tries them inside the whole step, one op
at a time, each trial engine checked against the oracle first. A configuration that fails
its check, or raises, is a row that says why and has no time.
"""
from __future__ import annotations

import json
import traceback

import torch

from .. import kernels as K
from .. import plan
from ..kernels import config, tuned
from ..prompt import random_prompt
from ..specs import get_spec
from ..weights import pack_weights
from . import agree
from .references import (GEMV_TOL, ref_lm_head, ref_matvec_residual,
                         ref_rms_gate_up_swiglu, ref_rms_qkv, rel_err)
from .rungs import make_engine
from .timing import floor_ms, graph_time, run_ctx, time_engine_step


def config_sweep(spec, w, device="cuda", iters=30, read_tbps=None, pdl=None,
                 grid: dict | None = None, echo: bool = True) -> list[dict]:
    """Check, then time, launch configurations of each GEMV kernel; one row per config.

    Each config first runs once on layer 0 and is compared with its reference (``ref_*``,
    tolerance ``GEMV_TOL``; for the LM head also the token, by the agreement rule); only a
    config that passes is timed. A config that fails its check, or raises, is a row with
    ``check`` (or ``error``) saying why and no time: reported, never skipped.
    Timing: each config runs once per layer, back to back in one CUDA graph, with
    programmatic dependent launch where the GPU has it (as in the engine's fastest rung),
    so the numbers include what a kernel's boundary costs inside the step. PREFETCH is how
    many weight tiles a program keeps in flight (requested before its ``gdc_wait``, then
    one more per tile consumed); BLOCK_K 2048 covers all of K = 1536 in one (masked) tile.
    The first entry of each op is the previous sweep's winner, so the table can only
    improve. ``grid`` ({op: [config, ...]}) replaces the built-in list."""
    pdl = config.pdl_supported(device) if pdl is None else pdl

    def cfgs(*rows, keys=("BLOCK_N", "BLOCK_K", "PREFETCH", "num_warps")):
        return [dict(zip(keys, r)) for r in rows]
    down_keys = ("BLOCK_N", "BLOCK_K", "PREFETCH", "num_warps", "SPLIT_K")
    grid = grid or {
        "rms_qkv": cfgs((8, 2048, 1, 4), (8, 512, 2, 4), (8, 512, 3, 4), (4, 512, 2, 4), (16, 512, 2, 4)),
        "o_proj_residual": cfgs((8, 2048, 1, 8), (8, 512, 2, 4), (8, 512, 3, 8), (16, 512, 2, 8), (4, 512, 2, 4)),
        "rms_gate_up_swiglu": cfgs((4, 512, 2, 4), (4, 512, 3, 4), (2, 512, 2, 4), (8, 512, 2, 4), (4, 256, 4, 4),
                        (4, 256, 3, 4), (4, 512, 2, 8)),
        "down_residual": cfgs((2, 1024, 4, 4, 1), (2, 1024, 2, 4, 1), (2, 1024, 3, 4, 1), (2, 512, 4, 4, 1),
                     (4, 512, 4, 4, 1), (4, 1024, 2, 4, 1), (2, 1024, 2, 8, 1), (8, 512, 2, 4, 5),
                     (4, 512, 3, 4, 5), keys=down_keys),
        "lm_head_argmax": cfgs((64, 256, 1, 4), (64, 256, 2, 4), (32, 256, 2, 4), (32, 256, 3, 4)),
    }
    P = pack_weights(spec, w)          # once: packing copies the weights
    out = []
    for op, cands in grid.items():
        for c in cands:
            r = _time_one(spec, w, device, op, c, iters, read_tbps, packed=P, pdl=pdl)
            if echo:
                print(json.dumps(r), flush=True)     # a sweep cut short still reports
            out.append(r)
    bad = agree.failures(out)
    if echo and bad:
        print(f"config sweep: {len(bad)} of {len(out)} configurations failed their check "
              "or raised (rows above); they were not timed", flush=True)
    return out


# the plan's ops whose launch configuration a step sweep tries, and the weight each reads
PLAN_SWEEP_WEIGHT = {"rms_qkv": "w_qkv", "o_proj_residual": "w_o", "rms_gate_up_swiglu": "w_gate_up", "down_residual": "w_down",
                     "moe_router": "w_router", "moe_gate_up_swiglu": "w_experts_gate_up",
                     "moe_down_residual": "w_experts_down"}


def plan_config_sweep(spec, w, device="cuda", grid: dict | None = None, ctx: int = 512,
                      iters: int = 100, tokens: int = 4, read_tbps=None, echo: bool = True,
                      seed: int = 0) -> list[dict]:
    """Launch configurations tried in the whole step, one op at a time (greedy: each op
    keeps the best found so far for the ops before it). Every trial engine is checked
    against the oracle (teacher-forced, the agreement rule) before its graph step is timed
    at context ``ctx`` with PDL; a trial that fails is reported, never timed. Rows carry the
    op, the weight shape the entry is keyed by, the config, and ms per token."""
    dev = torch.device(device)
    pdl = config.pdl_supported(dev)
    c = lambda *r, keys=("BLOCK_N", "BLOCK_K", "PREFETCH", "num_warps"): dict(zip(keys, r))
    grid = grid or ({
        "moe_router": [c(4, 512, 1, 4), c(1, 2048, 1, 4), c(2, 2048, 1, 4), c(2, 512, 4, 4), c(8, 512, 2, 4)],
        "moe_gate_up_swiglu": [c(8, 512, 1, 4), c(8, 512, 2, 4), c(4, 512, 2, 4), c(16, 512, 2, 4),
                        c(4, 1024, 2, 4), c(8, 256, 4, 4)],
        "moe_down_residual": [c(8, 512, 1, 4), c(8, 512, 2, 4), c(4, 512, 2, 4), c(16, 512, 2, 4),
                     c(4, 1024, 1, 4), c(2, 1024, 1, 4), c(16, 1024, 1, 8)],
        "rms_qkv": [c(8, 2048, 1, 4), c(8, 512, 2, 4), c(16, 512, 2, 4), c(4, 512, 3, 4)],
        "o_proj_residual": [c(8, 2048, 1, 8), c(4, 512, 2, 4), c(8, 512, 2, 4), c(16, 512, 2, 8)],
    } if spec.is_moe else {})
    prompt = random_prompt(spec, ctx, 9 + seed)
    max_ctx = run_ctx(ctx, tokens, iters)
    floor = floor_ms(spec, read_tbps, ctx)
    ref = agree.oracle_tokens(spec, w, prompt, tokens, max_ctx)
    best: dict[str, dict] = {}
    rows = []
    for op, cands in grid.items():
        timed = []
        for cfg in cands:
            e = make_engine(spec, w, max_ctx=max_ctx, pdl=pdl, cfgs={**best, op: cfg})
            weight = e.W["layers"][0][PLAN_SWEEP_WEIGHT[op]]
            r = {"op": op, "shape": list(weight.shape[-2:]), "cfg": cfg, "pdl": e.pdl}
            try:
                j = agree.judge(e, prompt, ref, graph=True)
                r["agree"] = j["agree"]
                if j["ok"]:
                    r["ms_per_token"] = time_engine_step(e, True, iters, dev)
                    r["x_floor"] = r["ms_per_token"] / floor if floor else None
                    timed.append(r)
                else:
                    r["refused"] = agree.refusal(agree.disagreements(j))
            except Exception as ex:                      # reported, never skipped silently
                r["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
            if echo:
                print(json.dumps(r), flush=True)
            rows.append(r)
            del e
        if timed:
            best[op] = min(timed, key=lambda r: r["ms_per_token"])["cfg"]
    return rows


def write_plan_table(rows: list[dict], model: str) -> str:
    """Merge the fastest config of each (op, shape) of a step sweep into
    ``kernels/tuned/<arch>.json`` (``tuned.write_table``), keyed by the weight shape."""
    import datetime
    best = {}
    for r in rows:
        if r.get("ms_per_token") is None:
            continue
        k = (r["op"], tuned.shape_key(r["shape"]))
        if k not in best or r["ms_per_token"] < best[k]["ms_per_token"]:
            best[k] = r
    entries, notes = {}, {}
    for (op, key), r in best.items():
        entries.setdefault(op, {})[key] = r["cfg"]
        notes[f"{op} {key}"] = {"model": model, "ms_per_token": r["ms_per_token"],
                                "date": datetime.date.today().isoformat()}
    return tuned.write_table(config.arch(0), entries, notes={"step_sweeps": notes})


def write_table(sweep: list[dict], read_tbps: float, model: str) -> str:
    """Merge the fastest configuration of each op (ties: the first in grid order), among
    the configurations that passed their check, into ``kernels/tuned/<arch>.json``
    (``tuned.write_table``: keyed by ``model``'s weight shape; other entries stay)."""
    import datetime
    best = {}
    for r in sweep:
        if r.get("check") == "pass" and r.get("us") is not None and \
                (r["op"] not in best or r["us"] < best[r["op"]]["us"]):
            best[r["op"]] = r
    spec = get_spec(model)
    key = {op: tuned.shape_key(plan.weight_shape(spec, op)) for op in best}
    meta = {"gpu": torch.cuda.get_device_name(), "model": model, "read_tbps": read_tbps,
            "date": datetime.date.today().isoformat()}
    measured = {f"{op} {key[op]}": {"us": r["us"], "pct_of_read": r["pct_of_read"]}
                for op, r in best.items()}
    return tuned.write_table(config.arch(0), {op: {key[op]: r["cfg"]} for op, r in best.items()},
                             meta=meta, notes={"measured": measured})


def _check_one(op, c, x, L0, P, s, eps, pdl, dev):
    """Run ``op`` with config ``c`` once on layer 0 and compare it with its reference.
    Returns ``(rel_err, failure or None)``."""
    bf = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(3)
    if op == "rms_qkv":
        out = torch.full((s.qkv_size,), float("nan"), dtype=bf, device=dev)
        K.rms_qkv.rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], out, eps, use_pdl=pdl, cfg=c)
        return rel_err(out, ref_rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], eps)), None
    if op == "o_proj_residual":
        a = torch.randn(s.q_size, generator=g).to(dev, bf)
        xo = x.clone()
        K.o_proj_residual.o_proj_residual(a, L0["w_o"], xo, use_pdl=pdl, cfg=c)
        return rel_err(xo, ref_matvec_residual(a, L0["w_o"], x)), None
    if op == "rms_gate_up_swiglu":
        h = torch.full((s.intermediate,), float("nan"), dtype=bf, device=dev)
        K.rms_gate_up_swiglu.rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], h, eps, use_pdl=pdl, cfg=c)
        return rel_err(h, ref_rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], eps)), None
    if op == "down_residual":
        hh = torch.randn(s.intermediate, generator=g).to(dev, bf)
        sc = torch.zeros(16 * s.hidden, dtype=torch.float32, device=dev)
        cnt = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
        xd = x.clone()
        K.down_residual.down_residual(hh, L0["w_down"], xd, sc, cnt, use_pdl=pdl, cfg=c)
        left = int(cnt.abs().max())
        return (rel_err(xd, ref_matvec_residual(hh, L0["w_down"], x)),
                f"counters left at {left}, not 0" if left else None)
    n_prog = -(-s.vocab // c["BLOCK_N"])
    lg = torch.full((s.vocab,), float("nan"), dtype=torch.float32, device=dev)
    seq = torch.zeros(8, dtype=torch.int32, device=dev)
    p0 = torch.zeros(1, dtype=torch.int32, device=dev)
    K.lm_head_argmax.lm_head_argmax(x, P["norm"], P["lm_head"], lg, torch.empty(n_prog, device=dev),
                     torch.empty(n_prog, dtype=torch.int32, device=dev),
                     torch.zeros(1, dtype=torch.int32, device=dev), seq, p0,
                     torch.zeros(1, dtype=torch.int32, device=dev), eps, use_pdl=pdl, cfg=c)
    ref, _ = ref_lm_head(x, P["norm"], P["lm_head"], eps)
    t = agree.judge_step(0, ref, int(seq[1]))
    return rel_err(lg, ref), (f"token {t['got_token']} is a flip against {t['ref_token']}"
                              if t["verdict"] == "flip" else None)


def _time_one(spec, w, device, op, c, iters, read_tbps, packed=None, pdl=False):
    """Check one launch configuration, then time it if it passed. An exception is
    recorded in the row (``error``, with the last lines of its traceback), not hidden."""
    s, dev, bf = spec, torch.device(device), torch.bfloat16
    P = packed or pack_weights(spec, w)
    Ls, eps = P["layers"], s.rms_eps
    x = torch.randn(s.hidden, generator=torch.Generator().manual_seed(4)).to(dev, bf)
    row = {"op": op, "cfg": c, "pdl": bool(pdl)}
    try:
        err, fail = _check_one(op, c, x, Ls[0], P, s, eps, pdl, dev)
    except Exception as ex:
        row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
        row["traceback"] = traceback.format_exc(limit=-3)
        return row
    row["rel_err"] = err
    if err > GEMV_TOL or fail:
        row["check"] = f"FAIL ({fail})" if fail else f"FAIL (rel err {err:.2e} > {GEMV_TOL:.0e})"
        return row
    row["check"] = "pass"
    if op == "rms_qkv":
        out = torch.empty(s.qkv_size, dtype=bf, device=dev)
        fn = lambda: [K.rms_qkv.rms_qkv(x, L["input_norm"], L["w_qkv"], L["b_qkv"], out, eps, use_pdl=pdl, cfg=c) for L in Ls]
        nbytes, n = Ls[0]["w_qkv"].numel() * 2, len(Ls)
    elif op == "o_proj_residual":
        a = torch.randn(s.q_size, device=dev).to(bf)
        xo = x.clone()
        fn = lambda: [K.o_proj_residual.o_proj_residual(a, L["w_o"], xo, use_pdl=pdl, cfg=c) for L in Ls]
        nbytes, n = Ls[0]["w_o"].numel() * 2, len(Ls)
    elif op == "rms_gate_up_swiglu":
        h = torch.empty(s.intermediate, dtype=bf, device=dev)
        fn = lambda: [K.rms_gate_up_swiglu.rms_gate_up_swiglu(x, L["post_norm"], L["w_gate_up"], h, eps, use_pdl=pdl, cfg=c) for L in Ls]
        nbytes, n = Ls[0]["w_gate_up"].numel() * 2, len(Ls)
    elif op == "down_residual":
        hh = torch.randn(s.intermediate, device=dev).to(bf)
        sc = torch.zeros(16 * s.hidden, dtype=torch.float32, device=dev)
        cnt = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
        xd = x.clone()
        fn = lambda: [K.down_residual.down_residual(hh, L["w_down"], xd, sc, cnt, use_pdl=pdl, cfg=c) for L in Ls]
        nbytes, n = Ls[0]["w_down"].numel() * 2, len(Ls)
    else:
        n_prog = -(-s.vocab // c["BLOCK_N"])
        lg = torch.empty(s.vocab, dtype=torch.float32, device=dev)
        pv = torch.empty(n_prog, dtype=torch.float32, device=dev)
        pi = torch.empty(n_prog, dtype=torch.int32, device=dev)
        cnt = torch.zeros(1, dtype=torch.int32, device=dev)
        seq = torch.zeros(64, dtype=torch.int32, device=dev)
        p0 = torch.zeros(1, dtype=torch.int32, device=dev)
        pl = torch.full((1,), 10 ** 6, dtype=torch.int32, device=dev)
        fn = lambda: [K.lm_head_argmax.lm_head_argmax(x, P["norm"], P["lm_head"], lg, pv, pi, cnt, seq, p0, pl, eps, use_pdl=pdl, cfg=c)
                      for _ in range(4)]
        nbytes, n = P["lm_head"].numel() * 2, 4
    try:
        us = graph_time(fn, n, dev, iters)
    except Exception as ex:
        row["error"] = f"while timing: {type(ex).__name__}: {str(ex)[:300]}"
        row["traceback"] = traceback.format_exc(limit=-3)
        return row
    gbps = nbytes / (us * 1e-6) / 1e9
    row.update(us=us, gbps=gbps, pct_of_read=100 * gbps / (read_tbps * 1e3) if read_tbps else None)
    return row
