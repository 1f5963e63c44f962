"""Where the time of a step goes, from the GPU's own record: kernel events attributed to
the plan's launches. Pure: plain ``(name, start_us, end_us)`` events and the plan's
``(op, bytes)`` list in, rows out; :mod:`onelaunch.measure.profile` records the events.

Under programmatic dependent launch (PDL) a kernel starts while the one before it still
runs and waits inside, so its duration is not its cost; what it adds is how much later the
step ends because of it:

    added_k = end_k - end_{k-1}        (the first launch: its own duration)

which sums to the replay's span, first start to last end. Each op (summed over layers,
median over replays) is then split into the time its bytes need at the streaming-read
bandwidth measured in the same process (``bytes_ms``) and the time beyond it
(``beyond_ms``).

The k-th kernel of a replay is the k-th launch of the plan, checked by name (a Triton
kernel is named for its ``@triton.jit`` function, ``_down_residual_kernel``;
:data:`OP_KERNELS`). A launch that issues several kernels takes the consecutive kernels
that match its op. A mapping that does not hold is an error, never a guess.
"""
from __future__ import annotations

import statistics

# op -> the kernel names (substrings) its launch issues. Triton names a kernel for its
# @triton.jit function; an all-reduce is NCCL's kernel or symmetric memory's one-shot.
OP_KERNELS: dict[str, tuple[str, ...]] = {
    "embed": ("_embed_kernel",),
    "rms_qkv": ("_rms_qkv_kernel",),
    "qk_sumsq": ("_qk_sumsq_kernel",),
    "rope_kv_write": ("_rope_kv_write_kernel",),
    "attention": ("_attention_kernel",),
    "attention_partial": ("_attention_partial_kernel",),
    "attention_reduce": ("_attention_reduce_kernel",),
    "o_proj_residual": ("_o_proj_residual_kernel",),
    "rms_gate_up_swiglu": ("_rms_gate_up_swiglu_kernel",),
    "down_residual": ("_down_residual_kernel",),
    "moe_router": ("_moe_router_kernel",),
    "moe_gate_up_swiglu": ("_moe_gate_up_swiglu_kernel",),
    "moe_down_residual": ("_moe_down_residual_kernel",),
    "lm_head_argmax": ("_lm_head_argmax_kernel",),
    "residual_add": ("_residual_add_kernel",),
    "allreduce_residual": ("_residual_add_kernel",),
    "argmax_merge": ("_argmax_merge_kernel",),
    "layer_persistent": ("_layer_persistent_kernel",),
    "all_reduce": ("nccl", "all_reduce", "allreduce", "one_shot"),
}


class ProfileError(RuntimeError):
    """The profile cannot be taken, or its kernels do not map onto the plan."""


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


BAD_TS_US = 60e6      # a kernel record this far (us) from the recording's median start is corrupt


def split_replays(events, ops: list[str], replays: int | None = None,
                  kernels: dict = OP_KERNELS, lead_in: int = 0):
    """Group kernel events into replays of the plan, each launch with its kernels.

    ``events``: (name, start_us, end_us); ``ops``: the plan's op per launch, in order.
    Walks the kernels in start order: each launch takes the next kernel, which must match
    its op's names (:data:`OP_KERNELS`; an op with no entry takes one kernel whatever its
    name), then any following kernels that match its op and not the next launch's. When
    every op has names, kernels matching none of them (another library's, between
    replays) are set aside and counted, as are records whose start lies a minute or more
    from the others' (CUPTI hands back such corrupt records at a recording's head).

    ``lead_in``: the recording ran that many steps before the ``replays`` it measures (its
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
    launch of the graph, outside the span) and ``replays``. The spread over the replays:
    ``ms_min``/``ms_max`` of the op's time, ``span_min_ms``/``span_max_ms`` of the step's."""
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
            "op": op, "step": i, "ms": ms, "ms_min": min(per_op[op]) / 1e3,
            "ms_max": max(per_op[op]) / 1e3, "bytes": bytes_of[op], "bytes_ms": bms,
            "beyond_ms": None if bms is None else ms - bms, "launches": launches[op],
            "kernels": names.get(op, []),
            "kernels_per_replay": sum(len(ks) for ks in reps[0]), "plan_launches": len(plan),
            "span_ms": span, "span_min_ms": min(spans) / 1e3, "span_max_ms": max(spans) / 1e3,
            "floor_ms": floor,
            "span_x_floor": span / floor if floor else None,
            "gap_ms": statistics.median(gaps) / 1e3 if gaps else None,
            "replays": len(reps), "read_tbps": read_tbps,
            "dropped_kernels": len(dropped), "bad_timestamps": aside["bad_timestamps"],
            "lead_in_kernels": aside["lead_in"],
        })
        if dropped:
            rows[-1]["dropped_names"] = sorted(set(map(_base, dropped)))[:8]
    return rows
