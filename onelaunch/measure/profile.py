"""The step profile on the GPU: each rung's captured step replayed under
``torch.profiler``, its kernels attributed to the plan (:mod:`onelaunch.measure.trace`);
and the persistent layer's own clock, phase by phase (:func:`clock_phases` reads the
programs' stamps, :func:`phase_rows` pairs them with each phase's bytes).

``step_profile`` replays an engine's captured CUDA graph under ``torch.profiler`` (the
CUDA activity: CUPTI records every kernel of a graph replay with its start and end on
the GPU) and gives each launch of the plan the time it *adds* to the step.
``profile_rows`` does this for each rung (:data:`onelaunch.measure.rungs.RUNGS`), each
engine checked against the oracle first (a rung that fails the check is refused, never
profiled); :mod:`onelaunch.report.profile_figures` draws what each rung removed.

    python -m onelaunch.profile --model qwen2.5-1.5b --ctx 512 --json out.json --png out.png
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings

import torch

from .. import plan
from ..kernels import config
from . import agree
from .ladder import ladder_prompt
from .rungs import MEGA, RUNGS
from .timing import read_bandwidth, time_ms
from .trace import ProfileError, attribute, kernel_events


EAGER_NOTE = ("eager launches: the host's launch time shows as gaps between kernels "
              "(the profiler's own hooks add to it)")


FALLBACK_NOTE = ("no kernel events were recorded inside the CUDA graph's replays: profiled "
                 "the same plan launched eagerly (with PDL where the rung has it), not the graph")


LEAD_IN = 2          # steps a recording runs before the measured ones (left out)


def _require_cuda(dev: torch.device) -> None:
    if dev.type != "cuda":
        raise ProfileError(f"the step profile needs a CUDA GPU (torch.profiler records the "
                           f"kernels through CUPTI); this is a {dev.type} device")


def _record(engine, graph: bool, replays: int, trace_path: str | None = None):
    """Kernel events of ``replays`` steps under torch.profiler (CUDA activity only)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize(engine.device)
    with warnings.catch_warnings():    # one profiler recording: "clears events ... each cycle"
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                engine.step(graph)
            torch.cuda.synchronize(engine.device)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "trace.json")
        prof.export_chrome_trace(p)
        with open(p) as f:
            trace = json.load(f)
        if trace_path:
            import shutil
            shutil.copyfile(p, trace_path)
    return kernel_events(trace)


@torch.no_grad()
def step_profile(engine, ctx: int, replays: int = 20, read_tbps: float | None = None,
                 graph: bool = True, warmup: int = 3, timed_iters: int = 50,
                 trace_path: str | None = None, lead_in: int = LEAD_IN) -> list[dict]:
    """Profile ``replays`` steps of ``engine`` from position ``ctx`` (its captured CUDA
    graph; ``graph=False``: the same launches eagerly) and attribute the GPU's kernel
    events to the plan (:func:`attribute`). The caller has checked the engine (its cache
    holds a real prefix up to ``ctx``); the steps here write no token (``prompt_len`` is
    set past them), and each advances the position by one.

    Rows as :func:`attribute`'s, plus ``graph`` (what was profiled), ``ctx``, ``note``
    where it is not the graph, and ``step_ms``: the same step timed with CUDA events
    outside the profiler, to show what the profiler's presence costs. If no kernel
    events come from the graph's replays, the plan is profiled eagerly instead and the
    rows say so (``note``). Each recording runs ``lead_in`` steps first, from ``ctx -
    lead_in``, whose kernels are left out (a recording's first records can be lost or
    corrupt); the ``replays`` measured ones run at positions ctx, ctx + 1, ..."""
    dev = torch.device(engine.device)
    _require_cuda(dev)
    if ctx < lead_in:
        raise ProfileError(f"ctx {ctx} is shorter than the lead-in ({lead_in} steps)")
    need = ctx + max(warmup, 1) + max(replays, timed_iters + 10) + 2
    if need > engine.max_ctx:
        raise ProfileError(f"the profile runs steps up to position {need}: build the engine "
                           f"with max_ctx >= {need} (it has {engine.max_ctx})")
    plan = [(L.op, L.bytes_at(ctx)) for L in engine.plan]
    if graph and engine.graph is None:
        engine.capture()
    saved = (engine.pos.clone(), engine.prompt_len.clone())
    engine.prompt_len.fill_(1 << 30)              # every step "forced": no token written
    engine.pos.fill_(ctx)
    for _ in range(warmup):
        engine.step(graph)
    engine.pos.fill_(ctx - lead_in)
    note = None if graph else EAGER_NOTE
    events = _record(engine, graph, lead_in + replays, trace_path)
    if graph and not events:
        graph, note = False, FALLBACK_NOTE
        engine.pos.fill_(ctx - lead_in)
        events = _record(engine, False, lead_in + replays, trace_path)
    rows = attribute(events, plan, replays, read_tbps, lead_in=lead_in)
    engine.pos.fill_(ctx)
    t = time_ms(lambda: engine.step(graph), iters=timed_iters, warmup=5, device=dev)
    step_ms = t.median_ms
    engine.pos.copy_(saved[0])
    engine.prompt_len.copy_(saved[1])
    for r in rows:
        r.update(graph=graph, ctx=ctx, step_ms=step_ms, step_min_ms=t.min_ms,
                 step_max_ms=t.max_ms, span_over_step=r["span_ms"] / step_ms)
        if note:
            r["note"] = note
    return rows


PROFILE_RUNGS = ("fused eager", "fused + graph", "+ split-K", "+ PDL")


def profile_rows(spec, weights, device="cuda", ctx: int = 512, rungs=PROFILE_RUNGS,
                 replays: int = 20, tokens: int = 12, read_tbps: float | None = None,
                 seed: int = 0, trace_dir: str | None = None, echo: bool = False,
                 cupti_warmup: bool = False) -> list[dict]:
    """The step profile of each rung (:data:`onelaunch.measure.rungs.RUNGS`): an engine built with the
    rung's settings is checked against the oracle first (``agree.judge``, teacher-forced,
    the agreement rule; the ladder's check), which also runs it over a prompt of ``ctx``
    random tokens; then :func:`step_profile` from position ``ctx``. The prompt (seed
    ``seed``) and the engine's size are the ladder's (``ladder.ladder_rows``' defaults).
    A rung that fails the check is one row with ``refused`` and no times; one whose
    kernels cannot be attributed, one row with ``error``. PDL rungs are
    left out on a GPU without PDL (as the ladder does).

    ``cupti_warmup``: open an empty profiler recording before any graph is captured
    (``torch.profiler._utils._init_for_cuda_graphs``, PyTorch's documented workaround for
    graphs captured before the profiler's first use). Off by default: on CUDA 13 it has
    been reported to leave the process with no kernel records at all (and attaching after
    capture to work), so it is the second try, not the first."""
    dev = torch.device(device)
    _require_cuda(dev)
    bad = [r for r in rungs if r not in RUNGS]
    if bad:
        raise ProfileError(f"unknown rung(s) {bad}: pick from {list(RUNGS)}")
    if cupti_warmup:
        from torch.profiler._utils import _init_for_cuda_graphs
        _init_for_cuda_graphs()
    read_tbps = read_tbps or read_bandwidth(dev)
    # the ladder's prompt and engine (its default 100 timed steps, or the replays)
    prompt, _, max_ctx = ladder_prompt(spec, ctx, tokens, max(100, replays), seed)
    ref = agree.oracle_tokens(spec, weights, prompt, tokens, max_ctx)
    rows = []
    for rung in rungs:
        before = len(rows)
        st = RUNGS[rung]
        if st.pdl and not config.pdl_supported(dev):
            continue
        e = st.engine(spec, weights, max_ctx)
        j = agree.judge(e, prompt, ref, st.graph)
        base = {"model": spec.name, "rung": rung, "ctx": ctx, "agree": j["agree"],
                "launches_per_step": e.launches_per_step(), "pdl": e.pdl,
                "cupti_warmup": cupti_warmup}
        if not j["ok"]:
            rows.append({**base, "op": None, "ms": None, "refused": agree.refusal(j["flips"])})
        else:
            trace = os.path.join(trace_dir, f"{spec.name}_{_slug(rung)}.json") if trace_dir else None
            try:
                for r in step_profile(e, ctx, replays, read_tbps, graph=st.graph,
                                      trace_path=trace):
                    rows.append({**base, **r})
            except ProfileError as ex:         # reported in the rows, never skipped silently
                rows.append({**base, "op": None, "ms": None, "error": f"ProfileError: {ex}"})
        if echo:
            for r in rows[before:]:
                print(json.dumps(r), flush=True)
        del e
        torch.cuda.empty_cache()
    return rows


def clock_phases(clock: torch.Tensor, phases=None) -> list[dict]:
    """What the programs' stamps say, per phase, from ``clock`` int64 [layers, P,
    2 x phases] (slot 2k: program p starts phase k, after the barrier or the launch's
    PDL wait; 2k + 1: it ends, arriving at the next barrier or leaving the kernel), in
    us, the median over layers:

    * ``span``: first start to last end (the phase's wall time, all programs);
    * ``work``: the median program's end - start (torch's median: of two, the lower);
    * ``skew``: last end - median end (what the slowest programs keep the rest waiting);
    * ``release``: the last arrival to the first start of the next phase (what the
      barrier or the launch boundary costs once everyone is there); for the last phase,
      to the next layer's first start (the launch boundary between layers).

    Slots a launch did not stamp (zero) are left out."""
    c = clock.to(torch.float64).cpu() / 1e3                         # us
    n = c.shape[-1] // 2
    names = phases or [f"phase {k}" for k in range(n)]
    rows = []
    for k in range(n):
        st, en = c[:, :, 2 * k], c[:, :, 2 * k + 1]
        if not bool((st > 0).all() and (en > 0).all()):
            continue
        if k + 1 < n:
            nxt = c[:, :, 2 * k + 2].amin(1)
        else:
            nxt = torch.cat([c[1:, :, 0].amin(1), torch.tensor([float("nan")])])
        rel = nxt - en.amax(1)
        rows.append(dict(phase=names[k] if k < len(names) else f"phase {k}",
                         span=(en.amax(1) - st.amin(1)).median().item(),
                         work=(en - st).median(1).values.median().item(),
                         skew=(en.amax(1) - en.median(1).values).median().item(),
                         release=(rel[~rel.isnan()].median().item()
                                  if (~rel.isnan()).any() else float("nan"))))
    return rows


def phase_rows(spec, weights, device="cuda", ctx: int = 512, tokens: int = 12,
               replays: int = 20, read_tbps: float | None = None, seed: int = 0,
               ref=None) -> list[dict]:
    """One launch a layer from the inside. The ``+ persistent layer`` rung is built with
    the phases' clock (``PersistentOptions(clock=True)``: every program stamps the GPU's
    global clock at each phase's start and end), checked against the oracle as the
    ladder checks it, then replayed ``replays`` times from position ``ctx``. One row per
    phase (``clock_phases``: the last replay, median over layers), in
    us: the time the phase's bytes need at ``read_tbps`` (the chain's launch for the same
    phase says how many bytes), the median program's work beyond them, the wait for the
    slowest program (``span - work``) and the barrier's release after the last arrival.
    Per phase, ``span + release`` is the time from its first start to the next phase's,
    so the rows add up to one layer. A failed check is one row with ``refused``. ``ref``:
    the oracle's tokens for the ladder's prompt at ``ctx`` (``agree.oracle_tokens``),
    computed here when not given."""
    from ..kernels import layer_persistent as LP
    from ..options import PersistentOptions
    dev = torch.device(device)
    _require_cuda(dev)
    read_tbps = read_tbps or read_bandwidth(dev)
    prompt, _, max_ctx = ladder_prompt(spec, ctx, tokens, replays + 16, seed)
    if ref is None:
        ref = agree.oracle_tokens(spec, weights, prompt, tokens, max_ctx)
    rung = "+ persistent layer"
    e = RUNGS[rung].engine(spec, weights, max_ctx, persist=PersistentOptions(clock=True))
    base = {"model": spec.name, "rung": rung, "ctx": ctx}
    j = agree.judge(e, prompt, ref, graph=True)
    if not j["ok"]:
        return [{**base, "phase": None, "refused": agree.refusal(j["flips"])}]
    chain = RUNGS["+ PDL"].engine(spec, weights, max_ctx)
    ops = [L for L in chain.plan if L.layer == 0]
    names = LP.MOE_PHASES if spec.is_moe else LP.PHASES
    if len(ops) != len(names):
        raise ProfileError(f"the chain has {len(ops)} launches a layer, the persistent layer "
                           f"{len(names)} phases: cannot pair their bytes")
    e.prompt_len.fill_(1 << 30)                     # every step "forced": no token written
    e.pos.fill_(ctx)
    for _ in range(replays):
        e.step(True)
    torch.cuda.synchronize(dev)
    by = {ph["phase"]: ph for ph in clock_phases(e.buffers["layer_clock"], names)}
    missing = [n for n in names if n not in by]
    if missing:
        raise ProfileError(f"phases {missing} left no clock stamps (clock_phases): "
                           f"their bytes cannot be paired with a time")
    # RoPE folded into the attention phase (FOLD_ROPE; not under a q/k norm): its stamps
    # mark no phase of its own and no barrier follows it
    folded = bool(plan.persistent_cfgs(e)["layer_persistent"].get("FOLD_ROPE")
                  and not spec.qk_norm)
    rows = []
    for L, name in zip(ops, names):
        ph = by[name]
        need = L.bytes_at(ctx) / (read_tbps * 1e6)            # us
        inside = names[names.index(name) + 1] if folded and name == "rope_kv_write" else None
        rows.append({**base, "phase": ph["phase"], "inside": inside, "op": L.op,
                     "bytes": L.bytes_at(ctx),
                     "bytes_us": min(need, ph["work"]), "need_us": need,
                     "beyond_us": max(ph["work"] - need, 0.0),
                     "wait_us": ph["span"] - ph["work"], "release_us": ph["release"],
                     "work_us": ph["work"], "span_us": ph["span"], "skew_us": ph["skew"],
                     "layers": spec.layers, "read_tbps": read_tbps})
    del e, chain
    torch.cuda.empty_cache()
    return rows


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s).strip("_") or "rung"




def step_clock(spec, weights, device="cuda", ctx: int = 512, tokens: int = 12,
               steps: int = 3, seed: int = 0, ref=None) -> dict:
    """The one-launch step from the inside: the ``one launch (megakernel)`` rung rebuilt
    with its clock (``MegaStep(clock=True)``: each SM stamps the global clock at every
    instruction's start, counters in and end, and its loader when it asked for the
    instruction's last tile), checked against the oracle as the ladder checks it, then
    run ``steps`` times from position ``ctx`` (the first compiles nothing new: the check
    ran it). Returns ``{"clk": int64 [P, N, 4] of the last step, "prog": the schedule's
    rows, "nbytes": [P, N] weight bytes (``loads.weight_bytes_grid``), "counters"}``, or
    ``{"refused": why}`` when the check fails. ``ref``: the oracle's tokens for the
    ladder's prompt (``agree.oracle_tokens``), computed here when not given."""
    from ..megakernel.loads import weight_bytes_grid
    from ..megakernel.step import MegaStep
    dev = torch.device(device)
    _require_cuda(dev)
    prompt, _, max_ctx = ladder_prompt(spec, ctx, tokens, steps + 16, seed)
    if ref is None:
        ref = agree.oracle_tokens(spec, weights, prompt, tokens, max_ctx)
    e = RUNGS[MEGA].engine(spec, weights, max_ctx)
    if e.mega is None:
        raise ProfileError(f"{MEGA} ran the chain on this GPU (no Hopper): no clock")
    e.mega = MegaStep(e, ctx=ctx, clock=True)
    e.plan, e.graph = [e.mega.launch()], None
    j = agree.judge(e, prompt, ref, graph=True)
    if not j["ok"]:
        return {"refused": agree.refusal(j["flips"])}
    e.prompt_len.fill_(1 << 30)                     # every step "forced": no token written
    for _ in range(steps):
        e.pos.fill_(ctx)
        e.step_launches()
    torch.cuda.synchronize(dev)
    e.mega.check_stalls()
    sched = e.mega.sched
    out = {"clk": e.mega.clk.cpu().clone(), "prog": sched.instr.clone(),
           "nbytes": weight_bytes_grid(sched),
           "counters": list(sched.counters), "agree": j["agree"]}
    del e
    torch.cuda.empty_cache()
    return out
