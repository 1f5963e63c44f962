"""Tensor parallelism over the GPUs of one host, Megatron-style: a transformation of the
spec and the weights, made before the plan is built.

    rank spec    = shard_spec(spec, world)          heads, kv heads, (expert) MLP width / world
    rank weights = shard_weights(spec, w, rank, world)
    engine       = Engine(rank spec, rank weights, tp=Group(rank, world, rung, spec))

Column-parallel (a rank holds whole output rows, so its output needs no reduction): Q, K
and V by head; gate and up, each rank taking its part of both; OLMoE's experts on their
intermediate dimension (every rank holds part of every expert; the router is replicated
and picks the same experts on every rank). Row-parallel (a rank holds a slice of the input
columns, so its output is a partial sum): O, down and the experts' down. The LM head is
split by vocabulary: each rank finds its best (logit, index) and the merge keeps the larger
logit, the lower index on an exact tie, as one GPU's argmax does. The embedding and the
norms are replicated, so the kernels see ordinary, smaller shapes.

The plan (``plan.py``) then adds what sharding needs after each partial sum, per *rung*:

    nccl   the GEMV writes its fp32 partial; ``dist.all_reduce`` (captured in the graph);
           a residual-add launch                                    (3 launches)
    symm   the same with PyTorch symmetric memory's one-shot all-reduce (peer reads over
           NVLink; multicast is off on these machines)              (3 launches)
    p2p    the GEMV writes its fp32 partial; one Triton launch stores it into every rank's
           peer-mapped buffer, waits for the others' and adds the sum to x  (2 launches)
    fused  the GEMV's last program stores its fp32 rows into every rank's peer-mapped
           buffer, raises a flag, waits for the others', sums the ranks in rank order and
           adds the residual (``kernels/peer.py``)                  (1 launch)
    gloo   (CPU, Triton's interpreter) ``dist.all_reduce`` over gloo: the CI check of the
           sharding arithmetic
    none   no reduction at all: the fused rung's launches with nothing exchanged, the rank's
           compute alone, timed to split a step into compute and communication (its
           tokens are wrong and it is never a result)

``launch`` runs a job on every rank (one process per GPU), with a timeout and an error that
names the rank; it never calls ``destroy_process_group`` after a captured collective (that
hangs on these machines): ranks exit once their results are handed back.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import pickle
import queue
import socket
import time
import traceback

import torch

from .specs import get_spec

RUNGS = ("nccl", "symm", "p2p", "fused")     # the GPU rungs, in the order the chapter shows
CPU_RUNGS = ("gloo",)
# NVLink multicast can take a host's GPUs out of service on these machines: keep it off in
# every process we start (KINDS.md), whatever the caller's environment says.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


class TPError(RuntimeError):
    """A tensor-parallel run that cannot start or did not finish: the message says which
    rank and what to do."""


# ---- sharding: spec and weights --------------------------------------------------------
def shard_spec(spec, world: int):
    """The shapes one rank computes: heads, kv heads and the (per-expert) MLP width
    divided by ``world``. The vocabulary stays whole (prompts are validated against it);
    the LM head's rows are sliced in :func:`shard_weights`."""
    s = get_spec(spec)
    if world == 1:
        return s
    for what, n in (("query heads", s.heads), ("kv heads", s.kv_heads),
                    ("MLP width", s.intermediate)):
        if n % world:
            raise TPError(f"{s.name} has {n} {what}, not divisible by --tp {world}: "
                          f"use a tensor-parallel size that divides it")
    return dataclasses.replace(s, name=f"{s.name}/tp{world}", heads=s.heads // world,
                               kv_heads=s.kv_heads // world,
                               intermediate=s.intermediate // world)


def vocab_range(vocab: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s LM-head rows [lo, hi): contiguous blocks, the last possibly shorter."""
    per = -(-vocab // world)
    return min(vocab, rank * per), min(vocab, (rank + 1) * per)


def _rows(t, r, world):
    n = t.shape[0] // world
    return t[r * n:(r + 1) * n]


def _shard_one(spec, name: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """One HF-named tensor of the full model -> rank ``rank``'s part (a contiguous
    copy), or the tensor itself where it is replicated."""
    I = spec.intermediate
    if name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                      "v_proj.weight", "v_proj.bias", "q_norm.weight", "k_norm.weight",
                      "gate_proj.weight", "up_proj.weight")):
        return _rows(t, rank, world).contiguous()            # whole heads / MLP rows
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        n = t.shape[1] // world
        # input columns: a partial sum
        return t[:, rank * n:(rank + 1) * n].contiguous()
    if name.endswith("experts.gate_up_proj"):                # [E, 2I, H] = [gate; up]
        n = I // world
        return torch.cat([t[:, rank * n:(rank + 1) * n],
                          t[:, I + rank * n:I + (rank + 1) * n]], dim=1).contiguous()
    if name.endswith("experts.down_proj"):                   # [E, H, I]
        n = I // world
        return t[:, :, rank * n:(rank + 1) * n].contiguous()
    if name == "lm_head.weight":
        lo, hi = vocab_range(spec.vocab, rank, world)
        return t[lo:hi].contiguous()
    return t                                                 # embedding, norms, router


def shard_weights(spec, weights: dict[str, torch.Tensor], rank: int, world: int) -> dict:
    """Rank ``rank``'s HF-named weights (``pack_weights`` reads them as any model's)."""
    spec = get_spec(spec)
    if world == 1:
        return dict(weights)
    return {n: _shard_one(spec, n, t, rank, world) for n, t in weights.items()}


def rank_weights(spec, seed: int, rank: int, world: int, device) -> dict:
    """Seeded random weights for one rank, made one tensor at a time (the full model never
    sits in memory at once: OLMoE's 13.8 GB would not fit beside its half under 24 GB)."""
    from .weights import hf_param_shapes, random_tensor
    spec = get_spec(spec)
    w = {}
    for name, shape in hf_param_shapes(spec).items():
        if spec.tie_embeddings and name == "lm_head.weight":
            continue
        w[name] = random_tensor(spec, name, shape, seed, device)
        if name != "model.embed_tokens.weight":
            w[name] = _shard_one(spec, name, w[name], rank, world)
    if spec.tie_embeddings:                  # the head's slice of the shared matrix
        lo, hi = vocab_range(spec.vocab, rank, world)
        w["lm_head.weight"] = w["model.embed_tokens.weight"][lo:hi].contiguous()
    return w


# ---- the group: who we are and how partial sums meet ----------------------------------
class Group:
    """One rank's view of the tensor-parallel group, handed to the engine (``tp=``); the
    plan's builders ask it for buffers, call sites and all-reduce launches."""

    def __init__(self, rank: int, world: int, rung: str, full_spec, device, peers=None):
        import torch.distributed as dist
        valid = RUNGS + CPU_RUNGS + ("none",)
        if rung not in valid:
            raise TPError(f"unknown tensor-parallel rung {rung!r}: use one of {', '.join(valid)}")
        self.rank, self.world, self.rung = rank, world, rung
        self.full = get_spec(full_spec)
        self.device = torch.device(device)
        self.group_name = dist.group.WORLD.group_name if dist.is_initialized() else None
        self.sites = 0                        # fused call sites handed out so far
        self.peers = None
        if rung in ("fused", "p2p"):
            from .kernels.peer import PeerBuffers
            if peers is not None:             # CPU: shared-memory tensors made by the parent
                self.peers = PeerBuffers.from_tensors(rank, world, *peers[:2], peers[2][rank])
            else:
                self.peers = PeerBuffers.cuda(self.group_name, rank, world,
                                              *peer_sizes(self.full, world), device=self.device)

    # the plan's interface ----------------------------------------------------------------
    @property
    def fused(self) -> bool:
        return self.rung == "fused"

    def vocab_offset(self) -> int:
        return vocab_range(self.full.vocab, self.rank, self.world)[0]

    def site(self):
        """The next fused call site (each all-reduce in the step has its own buffers)."""
        i, self.sites = self.sites, self.sites + 1
        return self.peers.site(i)

    def buffer(self, e, name: str, shape, dtype=torch.float32) -> torch.Tensor:
        """A buffer an all-reduce reads: symmetric memory for the one-shot rung (every
        rank allocates the same buffers in the same order: the plan is deterministic)."""
        if self.rung != "symm":
            return e.buf(name, shape, dtype)
        t = e.buffers.get(name)
        if t is None:
            import torch.distributed._symmetric_memory as symm_mem
            t = symm_mem.empty(shape, device=self.device, dtype=dtype)
            t.zero_()
            symm_mem.rendezvous(t, self.group_name)
            e.buffers[name] = t
        return t

    def allreduce(self, e, t: torch.Tensor):
        """(launch, result): a closure that sums ``t`` over the ranks, and the tensor the
        sum lands in (``t`` itself, in place, except for the one-shot, which writes a
        second buffer)."""
        import torch.distributed as dist
        if self.rung in ("nccl", "gloo"):
            return (lambda: dist.all_reduce(t)), t
        if self.rung == "symm":
            out = e.buf(f"{_name_of(e, t)}_sum", tuple(t.shape), t.dtype)
            op, g = torch.ops.symm_mem, self.group_name
            if hasattr(op, "one_shot_all_reduce_out"):
                return (lambda: op.one_shot_all_reduce_out(t, "sum", g, out)), out
            return (lambda: out.copy_(op.one_shot_all_reduce(t, "sum", g))), out
        raise TPError(f"rung {self.rung!r} has no separate all-reduce launch")

    def reset(self):
        """Zero the fused rung's flags and counters on every rank (between barriers), so a
        replay after an interrupted one cannot wait for a flag that is never raised."""
        import torch.distributed as dist
        if self.peers is None:
            return
        dist.barrier()
        self.peers.reset()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dist.barrier()


def peer_sizes(spec, world: int) -> tuple[int, int, int]:
    """(call sites, values per exchange, tiles per site) the fused rungs need: O, down and
    q/k norm per layer, and the head; a row tile is at least one row, so at most
    ``hidden`` tiles; the head exchanges 2 values per rank."""
    s = get_spec(spec)
    return 3 * s.layers + 1, max(s.hidden, 2 * world), s.hidden


def shared_peers(spec, world: int):
    """Every rank's exchange buffers in shared CPU memory, made in the parent process and
    passed to :func:`launch` as ``peers=``: the fused rung on the CPU (the interpreter)."""
    from .kernels.peer import PeerBuffers
    slots, flags, seqnos = PeerBuffers.alloc_shared(world, *peer_sizes(spec, world))
    return slots, flags, seqnos


def _name_of(e, t) -> str:
    for k, v in e.buffers.items():
        if v is t:
            return k
    raise KeyError("all-reduce of a tensor that is not an engine buffer")


# ---- hardware checks: say what to use instead ----------------------------------------
def check_hardware(world: int, rungs, device: str = "cuda") -> None:
    """One-line errors before any process starts: too few GPUs, or no peer access for a
    rung that needs it (two RTX 4090s usually have none; NCCL works without it)."""
    if world < 2:
        raise TPError("--tp needs at least 2: with one GPU, run without --tp")
    if torch.device(device).type != "cuda":
        return
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < world:
        raise TPError(f"--tp {world} needs {world} GPUs; this machine has {n}: run without --tp "
                      f"(one GPU runs the whole model)")
    needs_peer = [r for r in rungs if r in ("symm", "p2p", "fused")]
    if needs_peer:
        for a in range(world):
            for b in range(world):
                if a != b and not torch.cuda.can_device_access_peer(a, b):
                    raise TPError(f"GPUs {a} and {b} have no peer access, which the "
                                  f"{'/'.join(needs_peer)} rung(s) need: use --tp-rungs nccl "
                                  f"(NCCL works without peer access)")


# ---- running a job on every rank --------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, device, job, kwargs, q, timeout_s):
    os.environ.update(SAFE_ENV)
    try:
        import torch.distributed as dist
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(rank)
            from .memcap import apply_memory_cap
            apply_memory_cap(rank)
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
            world_size=world, timeout=datetime.timedelta(seconds=timeout_s),
            **({"device_id": torch.device("cuda", rank)} if cuda else {}))
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
        out = job(rank, world, dev, **kwargs)
        # by value (plain pickle): the queue's own pickler would share tensors through this
        # process's file descriptors, gone once it exits
        q.put(("ok", rank, pickle.dumps(out)))
        code = 0
    except BaseException as ex:          # noqa: BLE001  (the parent reports it, one line)
        tb = traceback.extract_tb(ex.__traceback__)
        where = f" ({os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
        msg = (str(ex).strip().splitlines() or [""])[0][:400]
        q.put(("error", rank, f"{type(ex).__name__}: {msg}{where}"))
        code = 1
    q.close()
    q.join_thread()
    # No destroy_process_group: after a captured collective it hangs on these machines.
    os._exit(code)


def launch(job, world: int = 2, device: str = "cuda", timeout_s: float = 600, uses=(),
           **kwargs):
    """Run ``job(rank, world, device, **kwargs)`` in ``world`` processes (one per GPU;
    gloo and Triton's interpreter on the CPU) and return every rank's result, rank 0 first.
    A rank that raises ends the run with ``TPError("rank r: ...")``; a run that outlives
    ``timeout_s`` is killed and named. ``uses``: the rungs the job runs (checked against
    the hardware first). The job must be a module-level function."""
    import torch.multiprocessing as mp
    check_hardware(world, uses, device)
    os.environ.update(SAFE_ENV)           # children inherit it
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, device, job, kwargs, q, timeout_s),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout_s

    def stop(msg):
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
        raise TPError(msg)

    while len(results) < world:
        try:
            kind, rank, payload = q.get(timeout=1.0)
        except queue.Empty:
            for r, p in enumerate(procs):
                if r not in results and p.exitcode not in (None, 0):
                    stop(f"rank {r} exited with code {p.exitcode} before reporting "
                         f"(killed or out of memory?)")
            if time.monotonic() > deadline:
                missing = [r for r in range(world) if r not in results]
                stop(f"rank(s) {', '.join(map(str, missing))} did not finish within "
                     f"{timeout_s:.0f} s; stopped them (raise the timeout for longer runs)")
            continue
        if kind == "error":
            stop(f"rank {rank}: {payload}")
        results[rank] = pickle.loads(payload)
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    return [results[r] for r in range(world)]


# ---- jobs: what every rank runs (``launch(job, ...)``) ---------------------------------
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


def rank_engine(spec, weights, rank: int, world: int, rung: str, device, max_ctx: int,
                pdl: bool = True, peers=None):
    """One rank's engine: the sharded spec, this rank's weights, the group's rung."""
    from .engine import Engine
    group = Group(rank, world, rung, spec, device, peers=peers)
    e = Engine(shard_spec(spec, world), weights, max_ctx=max_ctx, attention="splitk", pdl=pdl,
               tp=group)
    group.reset()
    return e


def sync_points(e) -> int:
    """Places per step where the ranks' partial sums meet (all-reduces, fused or not)."""
    return sum(L.op in ("o_proj_residual", "down_residual", "moe_down_residual", "qk_sumsq",
                        "lm_head_argmax") for L in e.plan)


def _alone_us(e, device, iters: int = 50) -> float | None:
    """The step's all-reduce launches by themselves, captured in one graph: µs per call."""
    from .measure.timing import time_ms
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
    from . import plan
    from .engine import Engine
    from .measure import agree
    from .measure.timing import read_bandwidth, run_ctx, time_engine_step
    from .prompt import random_prompt
    from .weights import random_weights
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
        one = {"model": spec.name, "tp": 1, "rung": "one GPU", "ctx": ctx, "agree": j["agree"],
               "flips": j["flips"], "ok": j["ok"], "launches": e.launches_per_step(),
               "read_tbps": bw, "floor_ms": plan.bytes_per_step(e.plan, ctx) / (bw * 1e9) if bw else None,
               "ms_per_token": time_engine_step(e, True, iters, device) if j["ok"] else None}
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
        ms = time_engine_step(e, True, iters, device) if timed else None
        floor = plan.bytes_per_step(e.plan, ctx) / (bw * 1e9) if bw else None
        alone = _alone_us(e, device) if timed else None
        per_rank = _gather({"ms": ms, "floor_ms": floor, "read_tbps": bw, "alone_us": alone})
        times = [p["ms"] for p in per_rank]
        r = {"model": spec.name, "tp": world, "rung": rung, "ctx": ctx,
             "launches": e.launches_per_step(), "sync_points": sync_points(e),
             "ms_per_token": max(times) if None not in times else None,
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
    from .engine import Engine
    from .measure import agree
    from .prompt import random_prompt
    from .weights import random_weights
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


def generate_job(rank, world, device, model, prompt, tokens, rung="fused", seed=0,
                 checkpoint=None, max_ctx=None, check=False):
    """``generate --tp``: every rank decodes (the prompt step by step); rank 0 reports the
    ids, time to first token and ms/token, and with ``check`` the oracle's verdict."""
    from .measure import agree
    from .measure.mechanisms import judge_generated
    from .measure.timing import run_ctx
    from .weights import load_checkpoint, random_weights
    spec = get_spec(model)
    cuda = torch.device(device).type == "cuda"
    if checkpoint:
        spec, full = load_checkpoint(checkpoint, spec, device=device)
        w = shard_weights(spec, full, rank, world)
        if not (check and rank == 0):
            del full
    else:
        w = rank_weights(spec, seed, rank, world, device)
    max_ctx = max_ctx or min(spec.max_ctx, run_ctx(prompt.numel(), tokens, 0))
    e = rank_engine(spec, w, rank, world, rung, device, max_ctx)
    if cuda:                                   # compile, capture and warm up
        e.generate(prompt[:16], 1, graph=True)
        torch.cuda.synchronize()
    stamps = []
    t0 = time.perf_counter()
    ids = e.generate(prompt, tokens, graph=cuda, read_every=64,
                     on_tokens=lambda b: stamps.append((time.perf_counter(), len(b))))
    if rank != 0:
        return None
    rest = tokens - stamps[0][1]
    out = {"ids": ids.tolist(), "ttft_s": stamps[0][0] - t0,
           "ms_per_token": (stamps[-1][0] - stamps[0][0]) / rest * 1e3 if rest > 0 else None}
    if check:
        del e
        full = full if checkpoint else random_weights(spec, seed, device=device)
        j = judge_generated(spec, full, prompt, ids, max_ctx)
        out.update(ok=j["ok"], verdict=agree.describe(j))
    return out


def format_rows(rows: list[dict]) -> str:
    """The bench --tp table: each rung against the one-GPU step of the same run."""
    f = lambda v, spec=".3f": "-" if v is None else format(v, spec)
    lines = [f"{'rung':<10} {'ms/token':>9} {'x floor':>8} {'vs 1 GPU':>9} {'compute':>8} "
             f"{'comm':>7} {'us/AR':>6} {'alone':>6} {'launches':>8}  check"]
    for r in rows:
        check = r.get("agree", "-") if r.get("ok") is not False else "REFUSED " + r.get("agree", "")
        if r["rung"] == "none":
            check = "compute only"
        lines.append(f"{r['rung']:<10} {f(r.get('ms_per_token')):>9} {f(r.get('x_floor'), '.2f'):>8} "
                     f"{f(r.get('vs_one_gpu'), '.2f'):>9} {f(r.get('compute_ms')):>8} "
                     f"{f(r.get('comm_ms')):>7} {f(r.get('allreduce_us_in_step'), '.1f'):>6} "
                     f"{f(r.get('allreduce_alone_us'), '.1f'):>6} {r.get('launches', '-'):>8}  {check}")
    return "\n".join(lines)
