"""Where the one-launch step's time goes, from its per-instruction clock: the tables, the
per-SM timeline and the bytes in flight, and the prose that reads them.

The clock is ``MegaStep(engine, clock=True).clk`` after a step (``measure.step_clock``
takes one): int64 ``[P, N, 4]`` globaltimer ns per instruction of SM p's list,

    [0] start (before its counter waits)   [1] counters in   [2] end
    [3] when the SM's loader asked for the instruction's last weight tile (0: no tiles,
        or a clock from before the loader stamped)

with ``prog`` the schedule's ``[P, N, WIDTH]`` rows (``isa``) and ``nbytes`` ``[P, N]``
each instruction's weight bytes (``loads.weight_bytes``).

    c = Clock.of(clk, prog, nbytes, stages)     # or from_file(path, spec, ctx)
    op_rows(c); stage_ends(c); layer_window(c); in_flight(c, times, ring); draw(c)

In flight on an SM at time t: what its loader has asked for by t minus what its compute
has finished by t. Two counts:

- weight bytes, each instruction's asked evenly from the SM's previous ask stamp to its
  own and finished evenly over its work (counters in to end). The stamps bound each; the
  even spread between them is an estimate, and it overcounts: the loader does not ask
  evenly, it fills every free stage at once and then waits, so the estimate can exceed
  what the ring holds (on the H200's clock, ~310 KiB of weights "in flight" above a
  192 KiB ring).
- ring stages (``ring`` given): each instruction's stages (:func:`loader_stages`, the
  loader's rule), asked as early as the ring lets it. By t the compute has finished at
  least the stages asked by the stamps passed (``lo``) less the ring (each tile asked
  needed a free stage), and its even spread otherwise; the loader has asked ``done +
  ring`` stages, but no more than those of the instructions whose predecessor's stamp
  has passed. Never more than the ring.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..megakernel.isa import (LAYER, NONE, OP, ROWS, OP_ARGMAX, OP_ATTN_FUSED, OP_ATTN_MERGE,
                              OP_ATTN_PARTIAL, OP_DOWN, OP_EMBED, OP_END, OP_EXPERT_DOWN,
                              OP_EXPERT_GATE_UP, OP_GATE_UP, OP_LM_HEAD, OP_O_PROJ,
                              OP_RMS_QKV, OP_ROPE_KV, OP_ROUTER, OP_TOPK, OPCODES)
from .figures import DPI, FONT, PAGE_W

START, IN, END, ASKED = range(4)


@dataclass
class Clock:
    t: torch.Tensor          # float64 [P, N, 4]: µs from the step's first start (nan: none)
    live: torch.Tensor       # bool [P, N]: a real instruction (not OP_END padding)
    op: torch.Tensor         # int64 [P, N]
    layer: torch.Tensor      # int64 [P, N] (NONE: the embedding, the head)
    nbytes: torch.Tensor     # float64 [P, N]: weight bytes (0 where not live)
    stages: torch.Tensor | None = None   # float64 [P, N]: ring stages (loader_stages)

    @classmethod
    def of(cls, clk, prog, nbytes=None, stages=None) -> "Clock":
        clk, prog = torch.as_tensor(clk), torch.as_tensor(prog)
        live = prog[:, :, OP] != OP_END
        if not live.any():
            raise ValueError("the clock has no instructions")
        t = (clk - clk[..., START][live].min()).double() / 1e3
        t[..., ASKED] = torch.where(clk[..., ASKED] > 0, t[..., ASKED], float("nan"))
        t[~live] = float("nan")
        nb = (torch.zeros(live.shape) if nbytes is None else torch.as_tensor(nbytes))
        st = None if stages is None else torch.where(live, torch.as_tensor(stages).double(),
                                                     0.0)
        return cls(t, live, prog[:, :, OP].long(), prog[:, :, LAYER].long(),
                   torch.where(live, nb.double(), 0.0), st)

    @property
    def P(self) -> int:
        return self.live.shape[0]

    @property
    def step_us(self) -> float:
        return float(self.t[..., END][self.live].max())

    @property
    def has_asks(self) -> bool:
        """The loader's stamps are there (a clock from before them has none)."""
        return bool((~self.t[..., ASKED][self.live & (self.nbytes > 0)].isnan()).any())


def load(path) -> tuple[torch.Tensor, torch.Tensor]:
    """(clk of the last step saved, prog) from a ``lab/step_check.py --clock`` file."""
    d = torch.load(path)
    clk = d["clk"]
    return (clk[-1] if clk.dim() == 4 else clk), d["prog"]


def loader_stages(prog, spec, num_warps: int = 4) -> torch.Tensor:
    """float64 [P, N]: the ring stages the dense kernel's loader fills for each
    instruction (``megakernel.gluon.dense._loader``'s rule): QKV, O and the LM head a stage per pair
    of TN-row blocks; gate/up a stage per block (its gate and up rows); down NF stages a
    block (boxes of 2 KB K tiles) and one more for the tail box."""
    from ..megakernel.boxes import KB, TK, TN, down_boxes
    prog = torch.as_tensor(prog)
    op, rows = prog[:, :, OP].long(), prog[:, :, ROWS].double()
    nf, tail = down_boxes(spec.intermediate // TK, 2 * KB, True, num_warps)
    blocks = torch.ceil(rows / TN)
    out = torch.zeros(op.shape, dtype=torch.float64)
    out = torch.where((op == OP_RMS_QKV) | (op == OP_O_PROJ) | (op == OP_LM_HEAD),
                      torch.ceil(rows / (2 * TN)), out)
    out = torch.where(op == OP_GATE_UP, blocks, out)
    return torch.where(op == OP_DOWN, blocks * (nf + (tail > 0)), out)


def from_file(path, spec, ctx: int, attention: str | None = None) -> Clock:
    """The clock a file holds (``save``'s, or ``lab/step_check.py --clock``'s), with each
    instruction's weight bytes and ring stages from the schedule replanned at its shape;
    raises where the file's instructions are not that schedule."""
    from ..megakernel.loads import weight_bytes_grid
    from ..megakernel.step import plan_schedule
    clk, prog = load(path)
    sched = plan_schedule(spec, clk.shape[0], ctx, attention)
    k = prog.shape[2]
    if sched.instr.shape[:2] != prog.shape[:2] or not torch.equal(
            sched.instr[..., :k], prog.to(sched.instr.dtype)):
        raise ValueError(f"{path}: its instructions are not the schedule of {spec.name} at "
                         f"ctx {ctx}, attention {attention!r}")
    return Clock.of(clk, prog, weight_bytes_grid(sched), loader_stages(sched.instr, spec))


def save(path, got: dict) -> None:
    """``profile.step_clock``'s clock to ``path`` (what :func:`from_file` reads)."""
    torch.save({"clk": got["clk"][None], "prog": got["prog"][:, :, :4].clone(),
                "counters": got.get("counters")}, path)


def op_name(op: int) -> str:
    return OPCODES[op][3:].lower()


# the dense step's opcodes in step order (isa), the MoE's after them
STEP_ORDER = [OP_EMBED, OP_RMS_QKV, OP_ROPE_KV, OP_ATTN_PARTIAL, OP_ATTN_FUSED, OP_ATTN_MERGE,
              OP_O_PROJ, OP_GATE_UP, OP_DOWN, OP_LM_HEAD, OP_ARGMAX, OP_ROUTER, OP_TOPK,
              OP_EXPERT_GATE_UP, OP_EXPERT_DOWN]


def colours(ops: list[str]) -> dict[str, tuple]:
    """op name -> colour: tab20's dark shades but its grey (grey means waiting), by the
    op's place in :data:`STEP_ORDER`, so a figure's colours do not depend on its data."""
    import matplotlib
    t20 = matplotlib.colormaps["tab20"]
    shades = [t20(2 * i) for i in range(10) if i != 7] + [t20(2 * i + 1) for i in range(10)
                                                         if i != 7]
    where = {op_name(o): i for i, o in enumerate(STEP_ORDER)}
    return {o: shades[where.get(o, len(STEP_ORDER)) % len(shades)] for o in ops}


# ---- tables -----------------------------------------------------------------------------
def op_rows(c: Clock) -> list[dict]:
    """Per op: instructions, mean wait (start to counters in) and work (counters in to
    end) in µs, and its work summed over the step divided by P; most work first."""
    wait = c.t[..., IN] - c.t[..., START]
    work = c.t[..., END] - c.t[..., IN]
    rows = []
    for op in c.op[c.live].unique().tolist():
        m = c.live & (c.op == op)
        n = int(m.sum())
        rows.append({"op": op_name(op), "n": n, "wait_us": float(wait[m].mean()),
                     "work_us": float(work[m].mean()),
                     "work_per_sm_us": float(work[m].sum()) / c.P,
                     "wait_per_sm_us": float(wait[m].sum()) / c.P,
                     "bytes": float(c.nbytes[m].sum())})
    return sorted(rows, key=lambda r: -r["work_per_sm_us"])


def stage_ends(c: Clock) -> list[dict]:
    """Per layer: when each op's last instruction ended (µs from the first start); the
    critical path reads off as the gaps between them."""
    out: dict[int, dict] = {}
    for layer in c.layer[c.live].unique().tolist():
        row = out.setdefault(layer, {"layer": None if layer == NONE else layer})
        for op in c.op[c.live & (c.layer == layer)].unique().tolist():
            m = c.live & (c.layer == layer) & (c.op == op)
            row[op_name(op)] = float(c.t[..., END][m].max())
    return [out[k] for k in sorted(out, key=lambda l: (l == NONE, l))]


def layer_window(c: Clock) -> dict:
    """Medians over the dense step's layers: ``layer_us``, from one layer's last down to
    the next one's; ``window_us``, on each SM from its down's end to its next gate/up's
    counters in (the attention's chain: QKV, the partials, the merges, O)."""
    import statistics

    def when(op, l, k, f):
        m = c.live & (c.op == op) & (c.layer == l)
        return f(c.t[..., k][m]) if m.any() else None

    layers = sorted(x for x in c.layer[c.live & (c.op == OP_DOWN)].unique().tolist())
    ends = [when(OP_DOWN, l, END, torch.max) for l in layers]
    gaps = [float(b - a) for a, b in zip(ends, ends[1:])]
    win = []
    for p in range(c.P):
        for l in layers[:-1]:
            d = c.live[p] & (c.op[p] == OP_DOWN) & (c.layer[p] == l)
            g = c.live[p] & (c.op[p] == OP_GATE_UP) & (c.layer[p] == l + 1)
            if d.any() and g.any():
                win.append(float(c.t[p, :, IN][g].min() - c.t[p, :, END][d].max()))
    return {"layer_us": statistics.median(gaps) if gaps else None,
            "window_us": statistics.median(win) if win else None}


# ---- bytes in flight --------------------------------------------------------------------
def _ramps(a: torch.Tensor, b: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """[P, N, T]: 0 before a, 1 after b, linear between (a step at b where a >= b)."""
    tt = times.view(1, 1, -1)
    span = (b - a).unsqueeze(-1)
    frac = ((tt - a.unsqueeze(-1)) / span.clamp(min=1e-9)).clamp(0, 1)
    return torch.where(span > 0, frac, (tt >= b.unsqueeze(-1)).double())


def ask_spans(c: Clock) -> tuple[torch.Tensor, torch.Tensor]:
    """(from, to) µs of each instruction's asks on its SM's loader: from the previous
    ask stamp on the SM (its first: the SM's first start) to its own. nan: no tiles."""
    asked = c.t[..., ASKED]
    has = c.live & (c.nbytes > 0) & ~asked.isnan()
    prev = torch.full_like(asked, float("nan"))
    for p in range(c.P):
        last = float(c.t[p, :, START][c.live[p]].min())
        for i in torch.nonzero(has[p]).flatten().tolist():
            prev[p, i] = last
            last = float(asked[p, i])
    return prev, torch.where(has, asked, float("nan"))


def in_flight(c: Clock, times, ring: int | None = None) -> torch.Tensor | None:
    """float64 [P, T]: what each SM's loader has asked for by each time minus what its
    compute has finished: weight bytes spread evenly between the stamps, or with ``ring``
    (the ring's stages) ring stages asked as early as the ring lets them (module
    docstring). None: the clock has no ask stamps (or, with ``ring``, no stages)."""
    if not c.has_asks or (ring and c.stages is None):
        return None
    times = torch.as_tensor(times, dtype=torch.float64)
    a0, a1 = ask_spans(c)
    ok = ~a1.isnan()
    zero = torch.zeros_like(a0)
    b = torch.where(ok, c.stages if ring else c.nbytes, 0.0).unsqueeze(-1)
    w0 = torch.where(ok, c.t[..., IN], zero)
    w1 = torch.where(ok, c.t[..., END], zero)
    done = (b * _ramps(w0, w1, times)).sum(1)
    if not ring:
        asked = (b * _ramps(torch.where(ok, a0, zero), torch.where(ok, a1, zero),
                            times)).sum(1)
        return asked - done
    tt = times.view(1, 1, -1)
    lo = (b * (tt >= torch.where(ok, a1, zero).unsqueeze(-1))).sum(1)
    hi = (b * (tt >= torch.where(ok, a0, zero).unsqueeze(-1))).sum(1)
    done = torch.maximum(done, lo - ring)   # a stage was free for every tile asked
    asked = torch.minimum(done + ring, hi)
    return asked - done


# ---- the picture ------------------------------------------------------------------------
def draw(c: Clock, until: float | None = None, ring_bytes: int | None = None,
         points: int = 400, title: str = "", ring_stages: int | None = None):
    """Top: per SM (one row each) its compute's instructions, waiting on counters in grey
    and working in its op's colour; its loader's asks above each row, a thin line in the
    op's colour. Bottom (with ask stamps): what is in flight per SM, each SM a faint
    line, the median over SMs in black, the ring's capacity dashed: with ``ring_stages``
    (and the clock's stages) the ring's stages in use, in KiB of the ring
    (``ring_bytes`` / ``ring_stages`` a stage), shaded grey where fewer than half the
    SMs are working on an instruction that reads weights; else the weight bytes'
    even-spread estimate, which overcounts (module docstring). Returns the figure."""
    import matplotlib.pyplot as plt

    until = until or c.step_us
    ops = [op_name(o) for o in sorted(c.op[c.live].unique().tolist(), key=STEP_ORDER.index)]
    col = colours(ops)
    flight = c.has_asks
    fig, axes = plt.subplots(2 if flight else 1, 1, figsize=(PAGE_W, 6.4 if flight else 4.6),
                             dpi=DPI, sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3] if flight else [1]})
    ax = axes[0, 0]
    a0, a1 = ask_spans(c)
    for p in range(c.P):
        m = c.live[p] & (c.t[p, :, START] <= until)
        s, w, e = (c.t[p, m, k].tolist() for k in (START, IN, END))
        names = [op_name(o) for o in c.op[p, m].tolist()]
        ax.broken_barh([(x, y - x) for x, y in zip(s, w)], (p - 0.45, 0.7), color="0.82",
                       linewidth=0)
        for o in set(names):
            ax.broken_barh([(x, y - x) for x, y, n in zip(w, e, names) if n == o],
                           (p - 0.45, 0.7), color=col[o], linewidth=0)
            spans = [(float(a0[p, i]), float(a1[p, i] - a0[p, i]))
                     for i in torch.nonzero(m).flatten().tolist()
                     if op_name(int(c.op[p, i])) == o and not a1[p, i].isnan()]
            ax.broken_barh(spans, (p + 0.27, 0.18), color=col[o], linewidth=0)
    for o in ops:
        ax.barh(0, 0, color=col[o], label=o)
    ax.barh(0, 0, color="0.82", label="waiting on counters")
    ax.set_xlim(0, until)
    ax.set_ylim(c.P, -1)
    ax.set_ylabel("SM", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.set_title(title or "One step: each SM's compute (bars) and loader (thin lines)",
                 fontsize=FONT + 1, loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06 if flight else -0.14),
              fontsize=FONT - 2, ncol=5, frameon=False)
    if flight:
        times = torch.linspace(0, until, points, dtype=torch.float64)
        ring = ring_stages if (ring_stages and ring_bytes and c.stages is not None) else None
        f = (in_flight(c, times, ring) * (ring_bytes / ring) if ring
             else in_flight(c, times)) / 1024
        bx = axes[1, 0]
        for p in range(c.P):
            bx.plot(times, f[p], color="0.6", linewidth=0.3, alpha=0.4)
        bx.plot(times, f.median(0).values, color="black", linewidth=1.2,
                label="median over SMs")
        if ring:         # where most SMs read no weights: the ring cannot refill
            tt = times.view(1, 1, -1)
            on = (c.live & (c.nbytes > 0)).unsqueeze(-1) & (
                c.t[..., IN].unsqueeze(-1) <= tt) & (tt < c.t[..., END].unsqueeze(-1))
            idle = on.any(1).double().mean(0) < 0.5
            bx.fill_between(times, 0, ring_bytes / 1024, where=idle.numpy(),
                            color="#c8c8c8", alpha=0.6, linewidth=0,
                            label="most SMs read no weights")
        if ring_bytes:
            bx.axhline(ring_bytes / 1024, color="#55a868", linestyle="--", linewidth=1.2,
                       label=f"the ring ({ring} stages)" if ring else "the ring's capacity")
        bx.set_ylabel("ring in use, KiB" if ring else "KiB in flight", fontsize=FONT)
        bx.legend(fontsize=FONT - 2, loc="lower right", frameon=True, ncol=3)
        bx.tick_params(labelsize=FONT)
    axes[-1, 0].set_xlabel("µs from the step's first instruction", fontsize=FONT)
    fig.tight_layout()
    return fig


# ---- what bounds it ---------------------------------------------------------------------
def summary(c: Clock, read_tbps: float | None = None, ring_bytes: int | None = None,
            points: int = 400, ring_stages: int | None = None) -> dict:
    """The numbers the prose reads: the step, each SM's share of it waiting on counters
    and working (medians over SMs), the op whose instructions wait the most and the op
    that works the most, a layer and its attention's window (:func:`layer_window`), and
    with ask stamps what is in flight (the median SM's mean over the step, and the share
    of the step it holds a full ring): in ring stages with ``ring_stages``, else bytes."""
    step = c.step_us
    wait = torch.nansum(torch.where(c.live, c.t[..., IN] - c.t[..., START], 0.0), 1)
    work = torch.nansum(torch.where(c.live, c.t[..., END] - c.t[..., IN], 0.0), 1)
    rows = op_rows(c)
    out = {"step_us": step, "P": c.P, "instructions": int(c.live.sum()),
           "wait_share": float(wait.median()) / step, "work_share": float(work.median()) / step,
           "most_waiting": max(rows, key=lambda r: r["wait_per_sm_us"]),
           "most_work": rows[0], "bytes": float(c.nbytes.sum())}
    if read_tbps:
        out["bytes_us"] = out["bytes"] / (read_tbps * 1e6)
    out.update(layer_window(c))
    ring = ring_stages if (ring_stages and ring_bytes and c.stages is not None) else None
    if c.has_asks:
        times = torch.linspace(0, step, points, dtype=torch.float64)
        f = in_flight(c, times, ring)
        full = (f >= ring - 0.5) if ring else (f >= 0.95 * ring_bytes) if ring_bytes else None
        if ring:
            f = f * (ring_bytes / ring)
        out["in_flight_mean"] = float(f.mean(1).median())
        if full is not None:
            out["full_share"] = float(full.double().mean())
    return out


def bound_text(s: dict, mega_ms: float | None, chain_ms: float | None,
               chain_name: str = "the chain") -> str:
    """What bounds the one-launch step in this run, in sentences built from ``summary``
    and the ladder's two rows (None: not timed in this run)."""
    mw, mk = s["most_waiting"], s["most_work"]
    out = (f"In the clocked step the {s['P']} SMs run {s['instructions']} instructions in "
           f"{s['step_us']:.0f} µs. The median SM spends {s['wait_share']:.0%} of it "
           f"waiting on counters and {s['work_share']:.0%} working; the most waiting is "
           f"before {mw['op']} ({mw['wait_per_sm_us']:.0f} µs an SM over the step), the "
           f"most work in {mk['op']} ({mk['work_per_sm_us']:.0f} µs an SM).")
    if s.get("bytes_us"):
        out += (f" The weights it streams take {s['bytes_us']:.0f} µs at this run's "
                f"bandwidth: the step is {s['step_us'] / s['bytes_us']:.2f} times that.")
    if "in_flight_mean" in s:
        out += (f" The median SM keeps {s['in_flight_mean'] / 1024:.0f} KiB in flight on "
                "average")
        out += (f", a full ring for {s['full_share']:.0%} of the step."
                if "full_share" in s else ".")
    else:
        out += (" This clock has no loader stamps, so it cannot say how many bytes were "
                "in flight.")
    if mega_ms and chain_ms:
        verdict = ("faster than" if mega_ms < chain_ms else "slower than"
                   if mega_ms > chain_ms else "as fast as")
        out += (f" Timed beside each other in this chapter, the one launch takes "
                f"{mega_ms:.4g} ms a token, {verdict} {chain_name} ({chain_ms:.4g} ms in "
                f"the same process, {mega_ms / chain_ms:.2f}x).")
    else:
        out += " This run timed no one-launch step beside the chain."
    return out
