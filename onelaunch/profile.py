"""Where the time of a step goes: the GPU's own record of each kernel in a replay, per op.

``step_profile`` replays an engine's captured CUDA graph under ``torch.profiler`` (the
CUDA activity: CUPTI records every kernel of a graph replay with its start and end on
the GPU) and gives each launch of the plan the time it *adds* to the step. Under
programmatic dependent launch (PDL) a kernel starts while the one before it still runs
and waits inside, so its duration is not its cost; what it adds is how much later the
step ends because of it:

    added_k = end_k - end_{k-1}        (the first launch: its own duration)

which sums to the replay's span, first start to last end. Each op (summed over layers,
median over replays) is then split into the time its bytes need at the streaming-read
bandwidth measured in the same process (``bytes_ms``) and the time beyond it
(``beyond_ms``). ``profile_rows`` does this for each rung of the ladder (the engine
settings ``bench.RUNG_SETTINGS``), each engine checked against the oracle first (a rung
that fails the check is refused, never profiled), and ``draw_profile`` draws what each
rung removed.

The attribution is a pure function of ``(name, start_us, end_us)`` kernel events and the
plan's ``(op, bytes)`` list (:func:`attribute`): the k-th kernel of a replay is the k-th
launch of the plan, checked by name (a Triton kernel is named for its ``@triton.jit``
function, ``_down_residual_kernel``; :data:`OP_KERNELS`). A launch that issues several
kernels takes the consecutive kernels that match its op. A mapping that does not hold
is an error, never a guess.

    python -m onelaunch.profile --model qwen2.5-1.5b --ctx 512 --json out.json --png out.png
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import warnings

import torch

# op -> the kernel names (substrings) its launch issues. Triton names a kernel for its
# @triton.jit function; an all-reduce is NCCL's kernel or symmetric memory's one-shot.
OP_KERNELS: dict[str, tuple[str, ...]] = {
    "embed": ("_embed_kernel",),
    "rms_qkv": ("_rms_qkv_kernel",),
    "qk_sumsq": ("_qk_sumsq_kernel",),
    "rope_kv_write": ("_rope_kv_write_kernel",),
    "attention": ("_attention_kernel",),
    "attention_partial": ("_attn_partial_kernel",),
    "attention_reduce": ("_attn_reduce_kernel",),
    "attention_onekernel": ("_attn_onekernel_kernel",),
    "o_proj_residual": ("_o_proj_residual_kernel",),
    "rms_gate_up_swiglu": ("_rms_gate_up_swiglu_kernel",),
    "down_residual": ("_down_residual_kernel",),
    "moe_router": ("_moe_router_kernel",),
    "moe_gate_up_swiglu": ("_moe_gate_up_kernel",),
    "moe_down_residual": ("_moe_down_kernel",),
    "lm_head_argmax": ("_lm_head_argmax_kernel",),
    "residual_add": ("_residual_add_kernel",),
    "allreduce_residual": ("_residual_add_kernel",),
    "argmax_merge": ("_argmax_merge_kernel",),
    "layer_persistent": ("_layer_kernel",),
    "all_reduce": ("nccl", "all_reduce", "allreduce", "one_shot"),
}

EAGER_NOTE = ("eager launches: the host's launch time shows as gaps between kernels "
              "(the profiler's own hooks add to it)")
FALLBACK_NOTE = ("no kernel events were recorded inside the CUDA graph's replays: profiled "
                 "the same plan launched eagerly (with PDL where the rung has it), not the graph")


class ProfileError(RuntimeError):
    """The profile cannot be taken, or its kernels do not map onto the plan."""


# ---- the attribution (pure: plain events in, rows out) ----------------------------------
def kernel_events(trace: dict) -> list[tuple[str, float, float]]:
    """The GPU kernels of a Chrome trace (``torch.profiler``'s export): (name, start_us,
    end_us), copies and memsets left out."""
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and str(ev.get("cat", "")).lower() == "kernel":
            ts = float(ev["ts"])
            out.append((ev.get("name", ""), ts, ts + float(ev.get("dur", 0.0))))
    return out


def _base(name: str) -> str:
    """A kernel's name without a C++ signature or return type."""
    b = name.split("(")[0].strip()
    return b[5:] if b.startswith("void ") else b


def _matches(name: str, patterns) -> bool:
    b = _base(name)
    return any(p in b for p in patterns)


BAD_TS_US = 60e6      # a kernel record this far (us) from the session's median start is corrupt


def split_replays(events, ops: list[str], replays: int | None = None,
                  kernels: dict = OP_KERNELS, lead_in: int = 0):
    """Group kernel events into replays of the plan, each launch with its kernels.

    ``events``: (name, start_us, end_us); ``ops``: the plan's op per launch, in order.
    Walks the kernels in start order: each launch takes the next kernel, which must match
    its op's names (:data:`OP_KERNELS`; an op with no entry takes one kernel whatever its
    name), then any following kernels that match its op and not the next launch's. When
    every op has names, kernels matching none of them (another library's, between
    replays) are set aside and counted, as are records whose start lies a minute or more
    from the others' (CUPTI hands back such corrupt records at a session's head).

    ``lead_in``: the session ran that many steps before the ``replays`` it measures (its
    head records can be missing or corrupt: pytorch/pytorch#192021). The walk then goes
    from the last kernel backwards, takes exactly ``replays`` whole replays and leaves
    the rest, which must be no more than ``lead_in`` replays' kernels.

    Returns ``(replays, set_aside)``: a list of replays, each a list (one per launch) of
    event lists, and a dict of what was set aside (``foreign`` names, ``bad_timestamps``,
    ``lead_in`` kernel count). Raises :class:`ProfileError` when the kernels do not form
    whole replays of the plan."""
    if not ops:
        raise ProfileError("the plan is empty")
    if lead_in and replays is None:
        raise ValueError("a lead-in needs the number of replays")
    ev = sorted(((str(n), float(s), float(e)) for n, s, e in events), key=lambda t: (t[1], t[2]))
    if not ev:
        raise ProfileError("no GPU kernel events were recorded (if torch.profiler records "
                           "none at all in this process, try --cupti-warmup)")
    n = len(ops)
    pats = [kernels.get(op) for op in ops]
    aside = {"foreign": [], "bad_timestamps": 0, "lead_in": 0}
    if all(p is not None for p in pats):
        every = tuple(p for ps in pats for p in ps)
        aside["foreign"] = [e[0] for e in ev if not _matches(e[0], every)]
        ev = [e for e in ev if _matches(e[0], every)]
        if not ev:
            raise ProfileError(f"none of the {len(aside['foreign'])} kernels recorded is one of "
                               f"the plan's (first: {aside['foreign'][0]!r}); expected names like "
                               f"{pats[0][0]!r}")
    mid = statistics.median(s for _, s, _ in ev)
    ok = [e for e in ev if abs(e[1] - mid) < BAD_TS_US and e[2] >= e[1]]
    aside["bad_timestamps"] = len(ev) - len(ok)
    ev = ok
    if lead_in:                    # from the tail: exactly `replays`, the head left over
        back, used = _walk(ev[::-1], ops[::-1], pats[::-1], replays, backwards=True)
        out = [[sorted(ks, key=lambda t: t[1]) for ks in rep[::-1]] for rep in back[::-1]]
        if len(out) < replays:
            raise ProfileError(f"the kernels make {len(out)} whole replays of the plan ({n} "
                               f"launches), not the {replays} that ran after the lead-in")
        per = sum(len(ks) for ks in out[0])
        left = len(ev) - used
        if left > lead_in * per:
            raise ProfileError(f"{left} kernels before the last {replays} replays: more than "
                               f"the lead-in's {lead_in} steps of {per} kernels")
        aside["lead_in"] = left
        return out, aside
    out, used = _walk(ev, ops, pats, None)
    if replays is not None and len(out) != replays:
        raise ProfileError(f"the kernels make {len(out)} replays of the plan ({n} launches), "
                           f"not the {replays} that ran")
    return out, aside


def _walk(ev, ops, pats, limit, backwards=False):
    """Take whole replays of ``ops`` from the kernels ``ev`` in order (at most ``limit``):
    ``(replays, kernels used)``. ``backwards``: ev and ops are reversed (messages count
    from the last kernel)."""
    n = len(ops)
    where = lambda i: (f"kernel {i + 1} from the last ({ev[i][0]!r})" if backwards
                       else f"kernel {i + 1} of {len(ev)} ({ev[i][0]!r})")
    launch = lambda k: n - k if backwards else k + 1
    out, i = [], 0
    while i < len(ev) and (limit is None or len(out) < limit):
        rep, r = [], len(out) + 1
        for k in range(n):
            if i >= len(ev):
                if backwards:          # the head of the lead-in: not a whole replay
                    return out, i - sum(len(ks) for ks in rep)
                raise ProfileError(
                    f"replay {r} ends after {k} of the plan's {n} launches: {len(ev)} kernels "
                    f"do not make whole replays (one kernel per launch would be {n} a replay)")
            if pats[k] is not None and not _matches(ev[i][0], pats[k]):
                raise ProfileError(
                    f"{where(i)} should be launch {launch(k)} of replay {r}"
                    f"{' from the last' if backwards else ''}, op {ops[k]!r} (a kernel named "
                    f"like {' or '.join(map(repr, pats[k]))}): the kernels do not map onto "
                    "the plan")
            got = [ev[i]]
            i += 1
            nxt = pats[(k + 1) % n]
            while pats[k] is not None and i < len(ev) and _matches(ev[i][0], pats[k]) \
                    and not (nxt is not None and _matches(ev[i][0], nxt)):
                got.append(ev[i])
                i += 1
            rep.append(got)
        out.append(rep)
    return out, i


def added_times(replay) -> list[float]:
    """The time each launch adds to its replay (us): ``end_k - end_{k-1}`` with ``end``
    the latest end so far (the first launch: its own duration). Sums to the span."""
    t0 = min(s for ks in replay for _, s, _ in ks)
    last, out = t0, []
    for ks in replay:
        end = max(e for _, _, e in ks)
        out.append(max(0.0, end - last))
        last = max(last, end)
    return out


def attribute(events, plan, replays: int | None = None, read_tbps: float | None = None,
              kernels: dict = OP_KERNELS, lead_in: int = 0) -> list[dict]:
    """Per op of ``plan`` (a list of ``(op, bytes)``, one per launch, in step order): the
    time it adds to the step, median over replays (``ms``), its bytes, the time those
    bytes need at ``read_tbps`` (``bytes_ms``) and the time beyond (``beyond_ms``).

    Every row also carries the step: ``span_ms`` (median over replays of first start to
    last end), ``floor_ms`` (the plan's bytes at ``read_tbps``), ``span_x_floor``,
    ``gap_ms`` (median idle time between one replay's end and the next one's start: the
    launch of the graph, outside the span) and ``replays``."""
    ops = [op for op, _ in plan]
    reps, aside = split_replays(events, ops, replays, kernels, lead_in)
    dropped = aside["foreign"]
    order = list(dict.fromkeys(ops))
    per_op = {op: [] for op in order}
    spans, gaps = [], []
    for ri, rep in enumerate(reps):
        add = added_times(rep)
        sums = dict.fromkeys(order, 0.0)
        for op, a in zip(ops, add):
            sums[op] += a
        for op in order:
            per_op[op].append(sums[op])
        start = min(s for ks in rep for _, s, _ in ks)
        end = max(e for ks in rep for _, _, e in ks)
        spans.append(end - start)
        if ri + 1 < len(reps):
            nxt = min(s for ks in reps[ri + 1] for _, s, _ in ks)
            gaps.append(max(0.0, nxt - end))
    bytes_of = dict.fromkeys(order, 0)
    launches = dict.fromkeys(order, 0)
    for op, b in plan:
        bytes_of[op] += int(b)
        launches[op] += 1
    to_ms = (lambda b: b / (read_tbps * 1e12) * 1e3) if read_tbps else (lambda b: None)
    floor = to_ms(sum(bytes_of.values()))
    span = statistics.median(spans) / 1e3
    names = {}
    for rep in reps[:1]:
        for op, ks in zip(ops, rep):
            names.setdefault(op, [])
            for k in ks:
                if _base(k[0]) not in names[op]:
                    names[op].append(_base(k[0]))
    rows = []
    for i, op in enumerate(order):
        ms = statistics.median(per_op[op]) / 1e3
        bms = to_ms(bytes_of[op])
        rows.append({
            "op": op, "step": i, "ms": ms, "bytes": bytes_of[op], "bytes_ms": bms,
            "beyond_ms": None if bms is None else ms - bms, "launches": launches[op],
            "kernels": names.get(op, []),
            "kernels_per_replay": sum(len(ks) for ks in reps[0]), "plan_launches": len(plan),
            "span_ms": span, "floor_ms": floor,
            "span_x_floor": span / floor if floor else None,
            "gap_ms": statistics.median(gaps) / 1e3 if gaps else None,
            "replays": len(reps), "read_tbps": read_tbps,
            "dropped_kernels": len(dropped), "bad_timestamps": aside["bad_timestamps"],
            "lead_in_kernels": aside["lead_in"],
        })
        if dropped:
            rows[-1]["dropped_names"] = sorted(set(map(_base, dropped)))[:8]
    return rows


# ---- on the GPU -------------------------------------------------------------------------
LEAD_IN = 2          # steps a session runs before the measured ones (left out)


def _require_cuda(dev: torch.device) -> None:
    if dev.type != "cuda":
        raise ProfileError(f"the step profile needs a CUDA GPU (torch.profiler records the "
                           f"kernels through CUPTI); this is a {dev.type} device")


def _record(engine, graph: bool, replays: int, trace_path: str | None = None):
    """Kernel events of ``replays`` steps under torch.profiler (CUDA activity only)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize(engine.device)
    with warnings.catch_warnings():    # one profiler session: "clears events ... each cycle"
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
    rows say so (``note``). Each session runs ``lead_in`` steps first, from ``ctx -
    lead_in``, whose kernels are left out (a session's first records can be lost or
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
    from .timing import time_ms
    engine.pos.fill_(ctx)
    step_ms = time_ms(lambda: engine.step(graph), iters=timed_iters, warmup=5, device=dev).median_ms
    engine.pos.copy_(saved[0])
    engine.prompt_len.copy_(saved[1])
    for r in rows:
        r.update(graph=graph, ctx=ctx, step_ms=step_ms, span_over_step=r["span_ms"] / step_ms)
        if note:
            r["note"] = note
    return rows


PROFILE_RUNGS = ("fused eager", "fused + graph", "+ split-K", "+ PDL")


def profile_rows(spec_name, weights, device="cuda", ctx: int = 512, rungs=PROFILE_RUNGS,
                 replays: int = 20, tokens: int = 12, read_tbps: float | None = None,
                 seed: int = 0, trace_dir: str | None = None, echo: bool = False,
                 cupti_warmup: bool = False) -> list[dict]:
    """The step profile of each rung (``bench.RUNG_SETTINGS``): an engine built with the
    rung's settings is checked against the oracle first (``bench.judge``, teacher-forced,
    the agreement rule; the ladder's check), which also runs it over a prompt of ``ctx``
    random tokens; then :func:`step_profile` from position ``ctx``. The prompt (seed
    ``seed``) and the engine's size are the ladder's (``bench.ladder_rows``' defaults).
    A rung that fails the check is one row with ``refused`` and no times; one whose
    kernels cannot be attributed, one row with ``error``. PDL rungs are
    left out on a GPU without PDL (as the ladder does).

    ``cupti_warmup``: open an empty profiler session before any graph is captured
    (``torch.profiler._utils._init_for_cuda_graphs``, PyTorch's documented workaround for
    graphs captured before the profiler's first use). Off by default: on CUDA 13 it has
    been reported to leave the process with no kernel records at all (and attaching after
    capture to work), so it is the second try, not the first."""
    from . import bench
    from .kernels import config
    from .specs import get_spec
    from .timing import read_bandwidth
    spec = get_spec(spec_name)
    dev = torch.device(device)
    _require_cuda(dev)
    bad = [r for r in rungs if r not in bench.RUNG_SETTINGS]
    if bad:
        raise ProfileError(f"unknown rung(s) {bad}: pick from {list(bench.RUNG_SETTINGS)}")
    if cupti_warmup:
        from torch.profiler._utils import _init_for_cuda_graphs
        _init_for_cuda_graphs()
    read_tbps = read_tbps or read_bandwidth(dev)
    # the ladder's prompt and engine (its default 100 timed steps, or the replays)
    prompt, _, max_ctx = bench.ladder_prompt(spec, ctx, tokens, max(100, replays), seed)
    ref = bench.oracle_tokens(spec, weights, prompt, tokens, max_ctx)
    rows = []
    for rung in rungs:
        before = len(rows)
        st = bench.RUNG_SETTINGS[rung]
        if st["pdl"] and not config.pdl_supported(dev):
            continue
        e = bench.rung_engine(spec, weights, rung, max_ctx)
        j = bench.judge(e, prompt, ref, st["graph"])
        base = {"model": spec.name, "rung": rung, "ctx": ctx, "agree": j["agree"],
                "launches_per_step": e.launches_per_step(), "pdl": e.pdl,
                "cupti_warmup": cupti_warmup}
        if not j["ok"]:
            rows.append({**base, "op": None, "ms": None, "refused": bench.refusal(j["flips"])})
        else:
            trace = os.path.join(trace_dir, f"{spec.name}_{_slug(rung)}.json") if trace_dir else None
            try:
                for r in step_profile(e, ctx, replays, read_tbps, graph=st["graph"],
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


def phase_rows(spec_name, weights, device="cuda", ctx: int = 512, tokens: int = 12,
               replays: int = 20, read_tbps: float | None = None, seed: int = 0,
               ref=None) -> list[dict]:
    """One launch a layer from the inside. The ``+ persistent layer`` rung is built with
    the phases' clock (``PersistentOptions(clock=True)``: every program stamps the GPU's
    global clock at each phase's start and end), checked against the oracle as the
    ladder checks it, then replayed ``replays`` times from position ``ctx``. One row per
    phase (``layer_persistent.clock_phases``: the last replay, median over layers), in
    us: the time the phase's bytes need at ``read_tbps`` (the chain's launch for the same
    phase says how many bytes), the median program's work beyond them, the wait for the
    slowest program (``span - work``) and the barrier's release after the last arrival.
    Per phase, ``span + release`` is the time from its first start to the next phase's,
    so the rows add up to one layer. A failed check is one row with ``refused``. ``ref``:
    the oracle's tokens for the ladder's prompt at ``ctx`` (``bench.oracle_tokens``),
    computed here when not given."""
    import importlib
    from . import bench
    from .options import PersistentOptions
    from .specs import get_spec
    from .timing import read_bandwidth
    LP = importlib.import_module("onelaunch.kernels.layer_persistent")
    spec = get_spec(spec_name)
    dev = torch.device(device)
    _require_cuda(dev)
    read_tbps = read_tbps or read_bandwidth(dev)
    prompt, _, max_ctx = bench.ladder_prompt(spec, ctx, tokens, replays + 16, seed)
    if ref is None:
        ref = bench.oracle_tokens(spec, weights, prompt, tokens, max_ctx)
    rung = "+ persistent layer"
    e = bench.rung_engine(spec, weights, rung, max_ctx, persist=PersistentOptions(clock=True))
    base = {"model": spec.name, "rung": rung, "ctx": ctx}
    j = bench.judge(e, prompt, ref, graph=True)
    if not j["ok"]:
        return [{**base, "phase": None, "refused": bench.refusal(j["flips"])}]
    chain = bench.rung_engine(spec, weights, "+ PDL", max_ctx)
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
    by = {ph["phase"]: ph for ph in LP.clock_phases(e.buffers["layer_clock"], names)}
    missing = [n for n in names if n not in by]
    if missing:
        raise ProfileError(f"phases {missing} left no clock stamps (clock_phases): "
                           f"their bytes cannot be paired with a time")
    # RoPE folded into the attention phase (FOLD_ROPE; not under a q/k norm): its stamps
    # mark no phase of its own and no barrier follows it
    from . import plan
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


PHASE_PARTS = (("bytes_us", "its bytes at the read bandwidth"),
               ("beyond_us", "work beyond the bytes"),
               ("wait_us", "waiting for the slowest program"),
               ("release_us", "the barrier's release"))


def draw_phases(rows: list[dict]):
    """One panel per model (:func:`phase_rows`): a horizontal bar per phase of one layer,
    stacked from the left as :data:`PHASE_PARTS`. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r.get("phase")]
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        raise ValueError("draw_phases: no rows")
    n = [sum(r["model"] == m for r in rows) for m in models]
    height = 1.6 + 0.32 * sum(n) + 0.6 * len(models)                # inches
    fig, axes = plt.subplots(len(models), 1, figsize=(FIG_W, height), dpi=DPI,
                             squeeze=False, gridspec_kw={"height_ratios": n})
    colors = ("#1f77b4", "#aec7e8", "#ff7f0e", "#d62728")
    for ax, m in zip(axes[:, 0], models):
        mine = [r for r in rows if r["model"] == m][::-1]          # first phase on top
        left = [0.0] * len(mine)
        for (key, label), c in zip(PHASE_PARTS, colors):
            vals = [max(r[key], 0.0) for r in mine]
            ax.barh(range(len(mine)), vals, left=left, color=c, label=label, height=0.7)
            left = [a + b for a, b in zip(left, vals)]
        labels = [r["phase"] + (" (in the next)" if r.get("inside") else "") for r in mine]
        ax.set_yticks(range(len(mine)), labels, fontsize=FONT)
        total = sum(r["span_us"] + r["release_us"] for r in mine)
        ax.set_title(f"{m}: one layer, {total:.3g} us", fontsize=FONT + 1, loc="left")
        ax.tick_params(axis="x", labelsize=FONT)
        ax.set_xlabel("us", fontsize=FONT)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=FONT, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.55 / fig.get_size_inches()[1], 1, 1))   # the legend below
    return fig


def phase_caption(rows: list[dict]) -> str:
    """What :func:`draw_phases` shows, from the same rows: per model, one layer's time,
    what its bytes need, and the time spent waiting and releasing."""
    out = []
    for m in dict.fromkeys(r["model"] for r in rows if r.get("phase")):
        mine = [r for r in rows if r["model"] == m and r.get("phase")]
        total = sum(r["span_us"] + r["release_us"] for r in mine)
        need = sum(r["need_us"] for r in mine)
        beyond = sum(r["beyond_us"] for r in mine)
        wait = sum(r["wait_us"] for r in mine)
        barriers = [r for r in mine if not r.get("inside")]
        rel = sum(r["release_us"] for r in barriers)
        worst = max(mine, key=lambda r: r["wait_us"])
        inside = "".join(f" ({r['phase']} runs inside {r['inside']}: no barrier of its own)"
                         for r in mine if r.get("inside"))
        light = [r for r in mine if r["need_us"] < 0.01 * need]       # (almost) no bytes
        lt = sum(r["span_us"] + r["release_us"] for r in light)
        out.append(f"{m}: one layer takes {total:.3g} us, of which its bytes need {need:.3g} "
                   f"({need / total:.0%}); the median program works {beyond:.3g} us beyond "
                   f"them, programs wait {wait:.3g} us for the slowest one (most in "
                   f"{worst['phase']}, {worst['wait_us']:.2g} us), and the {len(barriers)} "
                   f"releases take {rel:.2g} us{inside}; over {mine[0]['layers']} layers "
                   f"that is {total * mine[0]['layers'] / 1e3:.3g} ms."
                   + (f" The phases with almost no bytes ({', '.join(r['phase'] for r in light)}) "
                      f"take {lt:.3g} us of the layer ({lt / total:.0%})." if light else ""))
    return " ".join(out)


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s).strip("_") or "rung"


# ---- the picture --------------------------------------------------------------------------
FIG_W = 6.5          # inches: a page's text width
FONT = 10            # points: the smallest text
DPI = 150


def op_order(rows: list[dict]) -> list[str]:
    """The ops of every rung in step order: each rung's order, an op a later rung adds
    (split-K's partial and reduce) placed just before the op that follows it there."""
    merged: list[str] = []
    for rung in dict.fromkeys(r["rung"] for r in rows):
        seq = [r["op"] for r in sorted((r for r in rows if r["rung"] == rung and r.get("op")),
                                       key=lambda r: r.get("step", 0))]
        for i, op in enumerate(seq):
            if op not in merged:
                after = next((o for o in seq[i + 1:] if o in merged), None)
                merged.insert(merged.index(after) if after else len(merged), op)
    return merged


def op_colors(ops: list[str]) -> dict[str, tuple]:
    """op -> (solid colour, light colour): tab20's pairs but its grey (the legend's
    solid/hatched keys are black and white), then tab20b's."""
    import matplotlib
    t20, t20b = matplotlib.colormaps["tab20"], matplotlib.colormaps["tab20b"]
    pairs = [(t20(2 * i), t20(2 * i + 1)) for i in range(10) if i != 7]
    pairs += [(t20b(4 * j), t20b(4 * j + 2)) for j in range(5)]
    return {op: pairs[i % len(pairs)] for i, op in enumerate(ops)}


def draw_profile(rows: list[dict], model: str | None = None, head: str = "",
                 smoke: bool = False, per_op: bool = True):
    """One figure for one model's profile rows (:func:`profile_rows`).

    Top: one horizontal bar per rung, stacked from the left in step order; each op is
    the time its bytes need at the measured read bandwidth (solid) and the time it adds
    beyond that (light, hatched). The step's span and its ratio to the floor (the dashed
    line: every byte of the plan at the read bandwidth) stand right of each bar, with how
    much the rung removed from the one above. Bottom (``per_op``): the time beyond the
    bytes per op, one bar per rung: where each rung's savings came from. Returns the
    matplotlib Figure (6.5 inches wide, 150 dpi, no text under 10 pt)."""
    import matplotlib
    import matplotlib.pyplot as plt      # (no backend switch: a notebook keeps its own)
    from matplotlib.patches import Patch

    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        raise ValueError("draw_profile: no rows")
    model = model or models[0]
    rows = [r for r in rows if r["model"] == model]
    rungs = list(dict.fromkeys(r["rung"] for r in rows))
    ops = op_order(rows)
    colors = op_colors(ops)
    by = {(r["rung"], r.get("op")): r for r in rows}
    refused = {}                                  # rung -> why it has no bar
    for r in rows:
        if r.get("refused"):
            refused[r["rung"]] = "check failed: not profiled"
        elif r.get("error"):
            refused.setdefault(r["rung"], "no profile (error)")
    first = {g: next(r for r in rows if r["rung"] == g) for g in rungs}
    n = len(rungs)

    label_w = 0.15 + 0.075 * max(len(g) for g in rungs)
    value_w = 1.8
    ax_w = FIG_W - label_w - value_w - 0.1
    head_lines = [head or f"{model}: where the step's time goes, context "
                          f"{first[rungs[0]].get('ctx', '')}"]
    if smoke:
        head_lines.append("CPU SMOKE RUN, NOT A MEASUREMENT")
    head_h = 0.15 + 0.22 * len(head_lines)
    top_h = 0.45 * n + 0.1
    floors = [first[g].get("floor_ms") for g in rungs if first[g].get("floor_ms")]
    floor = statistics.median(floors) if floors else None
    leg_rows = -(-(len(ops) + 2 + bool(floor)) // 3)
    leg_h = 0.22 * leg_rows + 0.15
    gap1 = 0.6                                   # x label of the top axes
    bot_h, bot_lab = (2.3, 0.5 + 0.075 * max(len(o) for o in ops) * 0.6) if per_op else (0, 0)
    gap2 = 0.45 if per_op else 0
    fig_h = head_h + 0.25 + top_h + gap1 + leg_h + gap2 + bot_h + bot_lab + 0.1
    fig = plt.figure(figsize=(FIG_W, fig_h), dpi=DPI)
    y = lambda inch: 1 - inch / fig_h            # inches from the top -> figure fraction

    fig.text(0.012, y(0.1), "\n".join(head_lines), va="top", ha="left", fontsize=FONT + 1,
             color="#c92a2a" if smoke else "black", linespacing=1.35)

    # ---- top: stacked bars, one per rung ------------------------------------------------
    t0 = head_h + 0.25
    ax = fig.add_axes([label_w / FIG_W, y(t0 + top_h), ax_w / FIG_W, top_h / fig_h])
    side = ax.get_yaxis_transform()
    totals, prev = [], None
    for i, g in enumerate(rungs):
        if g in refused:
            ax.text(0.02, i, refused[g], transform=side, va="center",
                    fontsize=FONT, color="#c92a2a", zorder=5,
                    bbox=dict(facecolor="white", edgecolor="none", pad=1.5))
            ax.text(1.03, i, "no time shown", transform=side, va="center", fontsize=FONT,
                    color="#c92a2a", clip_on=False)
            continue
        left = 0.0
        for op in ops:
            r = by.get((g, op))
            if r is None or r.get("ms") is None:
                continue
            dark, light = colors[op]
            solid = r["ms"] if r.get("bytes_ms") is None else min(r["ms"], r["bytes_ms"])
            ax.barh(i, solid, left=left, height=0.62, color=dark, lw=0)
            left += solid
            extra = r["ms"] - solid
            if extra > 0:
                ax.barh(i, extra, left=left, height=0.62, color=light, edgecolor=dark,
                        hatch="///", lw=0)
                left += extra
        totals.append(left)
        span = first[g].get("span_ms")
        line1 = f"{span:.3g} ms" + (f", {span / floor:.2f}x floor" if span and floor else "")
        ax.text(1.03, i - 0.17, line1, transform=side, va="center", fontsize=FONT,
                clip_on=False)
        if prev is not None and span is not None:
            ax.text(1.03, i + 0.24, f"{span - prev:+.3g} ms vs above", transform=side,
                    va="center", fontsize=FONT, color="#555555", clip_on=False)
        elif first[g].get("note"):
            ax.text(1.03, i + 0.24, "eager (not a graph)", transform=side, va="center",
                    fontsize=FONT, color="#555555", clip_on=False)
        prev = span if span is not None else prev
    hi = max(totals + [floor or 0, 1e-9])
    ax.set_xlim(0, hi * 1.04)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels(rungs, fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_xlabel("ms per step: each op is the time it adds to the step", fontsize=FONT)
    ax.grid(axis="x", alpha=0.2)
    if floor:
        ax.axvline(floor, color="black", ls="--", lw=1.2, zorder=1)
    handles = [Patch(facecolor=colors[o][0], label=o) for o in ops]
    handles += [Patch(facecolor="black", label="bytes at read bandwidth"),
                Patch(facecolor="white", edgecolor="black", hatch="///", lw=0.8,
                      label="beyond the bytes")]
    if floor:
        from matplotlib.lines import Line2D
        handles.append(Line2D([], [], color="black", ls="--", lw=1.2,
                              label=f"floor {floor:.3g} ms"))
    leg_top = t0 + top_h + gap1
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.012, y(leg_top)),
               ncol=3, fontsize=FONT, frameon=False, handlelength=1.4, columnspacing=1.0,
               borderaxespad=0.0, handletextpad=0.5)

    # ---- bottom: time beyond the bytes, per op and rung ---------------------------------
    if per_op:
        b0 = leg_top + leg_h + gap2
        bx = fig.add_axes([0.75 / FIG_W, y(b0 + bot_h), (FIG_W - 0.95) / FIG_W, bot_h / fig_h])
        shown = [g for g in rungs if g not in refused]
        width = 0.8 / max(1, len(shown))
        shades = [matplotlib.colormaps["Blues"](0.35 + 0.6 * k / max(1, len(shown) - 1))
                  for k in range(len(shown))]
        for k, g in enumerate(shown):
            xs, vs = [], []
            for j, op in enumerate(ops):
                r = by.get((g, op))
                if r is not None and r.get("beyond_ms") is not None:
                    xs.append(j - 0.4 + width * (k + 0.5))
                    vs.append(r["beyond_ms"])
            bx.bar(xs, vs, width=width * 0.92, color=shades[k], label=g)
        bx.axhline(0, color="black", lw=0.8)
        bx.set_xticks(range(len(ops)))
        bx.set_xticklabels(ops, rotation=35, ha="right", fontsize=FONT)
        bx.tick_params(axis="y", labelsize=FONT)
        bx.set_xlim(-0.6, len(ops) - 0.4)
        bx.set_ylabel("ms beyond the bytes", fontsize=FONT)
        bx.grid(axis="y", alpha=0.2)
        bx.legend(fontsize=FONT, frameon=False, ncol=min(4, len(shown)), loc="lower left",
                  bbox_to_anchor=(0.0, 1.0), borderaxespad=0.1, handlelength=1.4)
    return fig


def caption(rows: list[dict], model: str | None = None) -> str:
    """What the figure shows, in one sentence per rung, from the same rows."""
    model = model or rows[0]["model"]
    rows = [r for r in rows if r["model"] == model]
    parts, prev = [], None
    for g in dict.fromkeys(r["rung"] for r in rows):
        mine = [r for r in rows if r["rung"] == g]
        if any(r.get("refused") for r in mine):
            parts.append(f"{g}: refused by the oracle check, not profiled")
            continue
        if any(r.get("error") for r in mine):
            parts.append(f"{g}: not profiled (its kernels could not be attributed)")
            continue
        top = max((r for r in mine if r.get("beyond_ms") is not None),
                  key=lambda r: r["beyond_ms"], default=None)
        span = mine[0]["span_ms"]
        s = f"{g}: {span:.3g} ms a step"
        if prev is not None:
            s += f" ({span - prev:+.3g} ms)"
        if top is not None and top["beyond_ms"] > 0:
            s += f", most time beyond its bytes in {top['op']} ({top['beyond_ms']:.3g} ms)"
        parts.append(s)
        prev = span
    return f"{model}: " + "; ".join(parts) + "."


# ---- the command ------------------------------------------------------------------------
def main(argv=None) -> int:
    import matplotlib
    matplotlib.use("Agg")                   # the command draws to files, headless
    ap = argparse.ArgumentParser(prog="python -m onelaunch.profile",
                                 description="Where each rung's step time goes, per op, from "
                                             "the GPU's kernel record (needs a CUDA GPU).")
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--rungs", default=",".join(PROFILE_RUNGS),
                    help="comma list of bench.RUNG_SETTINGS keys")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write {meta, read_tbps, rows} here")
    ap.add_argument("--png", default=None, help="draw the figure here")
    ap.add_argument("--trace-dir", default=None, help="keep each rung's Chrome trace here")
    ap.add_argument("--cupti-warmup", action="store_true",
                    help="an empty profiler session before any graph capture (PyTorch's "
                         "workaround; try it if the first run records no kernels or crashes)")
    ap.add_argument("--results", action="store_true",
                    help="also merge the rows into results/<gpu>/profile.json")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the step profile needs a CUDA GPU (torch.profiler records the kernels "
              "through CUPTI); none is visible", file=sys.stderr)
        return 2
    from . import results
    from .specs import get_spec
    from .timing import read_bandwidth
    from .weights import random_weights
    dev = "cuda"
    spec = get_spec(a.model)
    rungs = tuple(r.strip() for r in a.rungs.split(",") if r.strip())
    if a.trace_dir:
        os.makedirs(a.trace_dir, exist_ok=True)
    w = random_weights(spec, a.seed, device=dev)
    bw = read_bandwidth(dev)
    print(f"{spec.name}, ctx {a.ctx}, on {torch.cuda.get_device_name()}: read bandwidth "
          f"{bw:.3f} TB/s", flush=True)
    rows = profile_rows(spec.name, w, dev, ctx=a.ctx, rungs=rungs, replays=a.replays,
                        read_tbps=bw, seed=a.seed, trace_dir=a.trace_dir, echo=True,
                        cupti_warmup=a.cupti_warmup)
    commit, gpu = results.git_commit(), results.gpu_name(dev)
    for r in rows:
        r.setdefault("commit", commit)
        r.setdefault("device", gpu)
        if results.run_id():
            r.setdefault("run", results.run_id())
    params = {"model": spec.name, "ctx": a.ctx, "replays": a.replays, "rungs": list(rungs),
              "seed": a.seed, "cupti_warmup": a.cupti_warmup}
    for g in dict.fromkeys(r["rung"] for r in rows):
        mine = [r for r in rows if r["rung"] == g]
        if mine[0].get("refused") or mine[0].get("error"):
            why = mine[0].get("refused") or mine[0].get("error")
            print(f"{g:>16}: {'REFUSED' if mine[0].get('refused') else 'ERROR'} ({why[:300]})")
            continue
        m = mine[0]
        print(f"{g:>16}: span {m['span_ms']:.4f} ms ({m['span_x_floor']:.2f}x floor "
              f"{m['floor_ms']:.4f}), step {m['step_ms']:.4f} ms timed unprofiled"
              + (f"; {m['note']}" if m.get("note") else ""))
        for r in mine:
            print(f"{'':>18}{r['op']:<22} {r['ms']:.4f} ms = bytes {r['bytes_ms']:.4f} "
                  f"+ beyond {r['beyond_ms']:+.4f}  ({r['launches']} launches)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": results.meta(dev, params), "read_tbps": bw, "rows": rows}, f,
                      indent=1)
        print(f"wrote {a.json}")
    if a.results:
        p = results.write("profile", rows, dev, params, merge_keys=("model", "rung", "op", "ctx"))
        print(f"wrote {p}")
    if a.png and any(r.get("ms") is not None for r in rows):
        fig = draw_profile(rows, spec.name)
        fig.savefig(a.png, dpi=DPI)
        print(f"wrote {a.png}")
        print(caption(rows, spec.name))
    errors = [r for r in rows if r.get("error")]
    refused = [r for r in rows if r.get("refused")]
    if errors:
        print(f"FAILED: no profile for {', '.join(r['rung'] for r in errors)} "
              f"({errors[0]['error'][:200]})", file=sys.stderr)
        return 3
    if refused:
        print(f"FAILED: refused by the oracle check: "
              f"{', '.join(r['rung'] for r in refused)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
