"""Timing and floors: the one place anything in this project is timed.

``time_ms`` warms up, then times each call with CUDA events and reports the median over
many calls, with their spread (the fastest and the slowest call). ``read_bandwidth`` measures the streaming-read bandwidth of the GPU in the
same process, so every ratio to the floor uses a floor measured in the same run.
On the CPU both fall back to wall-clock (their numbers are for smoke runs, never published).

The rules of a run live here once: :func:`floor_ms` (the bandwidth floor of a step, from
the spec's bytes and the bandwidth measured in this run), :func:`run_bandwidth` (that
bandwidth, measured once per run and handed on), :func:`run_ctx` (the positions an engine
needs for a run: context, checked tokens, timed steps and a margin), :func:`graph_time`
(a launch captured in a CUDA graph, per launch) and :func:`time_engine_step`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, asdict

import torch


@dataclass
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    iters: int
    min_ms: float | None = None      # the spread: fastest and slowest timed call
    max_ms: float | None = None

    def as_dict(self):
        return asdict(self)

    def spread(self, digits: int = 4) -> dict:
        """``{"ms_min", "ms_max", "timed"}``: the fastest and slowest of the timed
        calls and how many there were, as a row carries them beside its median."""
        r = lambda v: None if v is None else round(v, digits)
        return {"ms_min": r(self.min_ms), "ms_max": r(self.max_ms), "timed": self.iters}


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, iters: int = 100, warmup: int = 10, device="cuda") -> Timing:
    """Median wall time of ``fn()`` in ms: CUDA events around each call on a GPU."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    if torch.device(device).type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
    return Timing(statistics.median(times), q(0.1), q(0.9), iters, times[0], times[-1])


def read_bandwidth(device="cuda", gib: float = 2.0, iters: int = 30) -> float:
    """Streaming-read bandwidth in TB/s: ``x.sum()`` over a bf16 buffer far larger than
    L2.

    This is the denominator of every floor: the fastest the GPU reads bytes it has not
    seen, in this process, on this card, today."""
    n = int(gib * (1 << 30)) // 2
    x = torch.empty(n, dtype=torch.bfloat16, device=device).uniform_(-1, 1)
    t = time_ms(lambda: x.sum(dtype=torch.float32), iters=iters, warmup=3,
                device=device)
    del x
    return n * 2 / (t.median_ms * 1e-3) / 1e12


def copy_bandwidth(device="cuda", gib: float = 2.0, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in TB/s, bytes read plus bytes written."""
    n = int(gib * (1 << 30)) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device=device).uniform_(-1, 1)
    b = torch.empty_like(a)
    t = time_ms(lambda: b.copy_(a), iters=iters, warmup=3, device=device)
    del a, b
    return 2 * n * 2 / (t.median_ms * 1e-3) / 1e12


def run_bandwidth(device) -> float | None:
    """The bandwidth of a run: :func:`read_bandwidth` on a GPU, measured once and passed
    to everything the run reports; None on the CPU (no floor for a smoke run)."""
    return read_bandwidth(device) if torch.device(device).type == "cuda" else None


def floor_ms(spec, read_tbps: float | None, ctx: int) -> float | None:
    """The floor of one step at context ``ctx``: the spec's bytes at ``read_tbps``
    (``ModelSpec.floor_ms``); None when there is no bandwidth (the CPU)."""
    return spec.floor_ms(read_tbps, ctx) if read_tbps else None


def plan_floor_ms(launches, read_tbps: float | None, ctx: int) -> float | None:
    """The floor of one step of a built plan (``plan.bytes_per_step``: what one
    tensor-parallel rank reads, say) at ``read_tbps``; None without a bandwidth."""
    from ..plan import bytes_per_step
    return bytes_per_step(launches, ctx) / (read_tbps * 1e9) if read_tbps else None


# An engine for a run holds the context, the checked tokens, the timed steps and this
# margin (the warm-up steps and the profile's lead-in).
CTX_MARGIN = 64


def run_ctx(ctx: int, tokens: int, iters: int) -> int:
    """The positions an engine needs for a run at context ``ctx`` that checks ``tokens``
    tokens and times ``iters`` steps: ``ctx + tokens + iters + 64``."""
    return ctx + tokens + iters + CTX_MARGIN


def graph_time(launch, n_launch: int, device, iters: int, info: dict | None = None) -> float:
    """Median microseconds per launch, ``launch()`` recording ``n_launch`` launches;
    ``info`` (a dict) gets the spread per launch: ``us_min``, ``us_max``, ``timed``."""
    if torch.device(device).type != "cuda":      # the interpreter: nothing to warm up
        t = time_ms(launch, iters=max(2, iters // 10), warmup=0, device=device)
        _us_spread(t, n_launch, info)
        return t.median_ms * 1e3 / n_launch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        launch()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch()
    t = time_ms(g.replay, iters=iters, warmup=5, device=device)
    _us_spread(t, n_launch, info)
    return t.median_ms * 1e3 / n_launch


def _us_spread(t: Timing, n_launch: int, info: dict | None) -> None:
    """:meth:`Timing.spread` in microseconds per launch, into ``info`` (if given)."""
    if info is not None:
        info.update(us_min=round(t.min_ms * 1e3 / n_launch, 4),
                    us_max=round(t.max_ms * 1e3 / n_launch, 4), timed=t.iters)


def time_engine_timing(e, graph: bool, iters: int, device) -> Timing:
    """One step of engine ``e`` (its CUDA graph when ``graph``), timed ``iters`` times:
    the median and the spread (:meth:`Timing.spread`). Warm-up steps on a GPU only: on
    the CPU the kernels run in Triton's interpreter, with nothing to compile, cache or
    clock up, so a warm-up step would only cost an interpreted step."""
    warmup = min(5, iters) if torch.device(device).type == "cuda" else 0
    return time_ms(lambda: e.step(graph), iters=iters, warmup=warmup, device=device)


def time_engine_step(e, graph: bool, iters: int, device,
                     info: dict | None = None) -> float:
    """Median ms of one step of engine ``e`` (its CUDA graph when ``graph``); ``info``
    (a dict) gets the spread (:meth:`Timing.spread`)."""
    t = time_engine_timing(e, graph, iters, device)
    if info is not None:
        info.update(t.spread())
    return t.median_ms
