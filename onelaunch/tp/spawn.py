"""Running a job on every rank: one process per GPU (gloo and Triton's interpreter on
the CPU), with a timeout and an error that names the rank; and the one-line hardware
checks made before any process starts.

It never calls ``destroy_process_group`` after a captured collective (that hangs on these
machines): ranks exit once their results are handed back.
"""
from __future__ import annotations

import datetime
import os
import pickle
import queue
import socket
import time
import traceback

import torch

from . import TPError

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, device, job, kwargs, q, timeout_s, release):
    os.environ.update(SAFE_ENV)
    try:
        import torch.distributed as dist
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(rank)
            from ..memcap import apply_memory_cap
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
    # rank 0 serves the rendezvous store: leaving before every rank has reported would
    # cut off a rank still setting up (it then fails with "connection reset", not its own
    # error), so every rank waits for the parent's word (or is killed)
    release.wait(timeout_s)
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
    q, release = ctx.Queue(), ctx.Event()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, device, job, kwargs, q,
                                                  timeout_s, release), daemon=True)
             for r in range(world)]
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
    release.set()
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    return [results[r] for r in range(world)]
