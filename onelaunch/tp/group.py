"""One rank's view of the tensor-parallel group (``Group``), handed to the engine as
``tp=``: the plan's builders ask it for buffers, fused call sites and all-reduce launches
(``plan.into_residual``, ``plan.head``); and ``rank_engine``, one rank's engine.
"""
from __future__ import annotations

import torch

from ..specs import get_spec
from . import CPU_RUNGS, RUNGS, TPError
from .shard import shard_spec, vocab_range


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
            from ..kernels.peer import PeerBuffers
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
        """(fn, args, result): the call ``fn(*args)`` that sums ``t`` over the ranks (a
        plan's launch holds it as data), and the tensor the sum lands in (``t`` itself,
        in place, except for the one-shot, which writes a second buffer)."""
        import torch.distributed as dist
        if self.rung in ("nccl", "gloo"):
            return dist.all_reduce, (t,), t
        if self.rung == "symm":
            out = e.buf(f"{_name_of(e, t)}_sum", tuple(t.shape), t.dtype)
            op, g = torch.ops.symm_mem, self.group_name
            if hasattr(op, "one_shot_all_reduce_out"):
                return op.one_shot_all_reduce_out, (t, "sum", g, out), out
            return one_shot_all_reduce_into, (t, g, out), out
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
    passed to ``tp.launch`` as ``peers=``: the fused rung on the CPU (the interpreter)."""
    from ..kernels.peer import PeerBuffers
    slots, flags, seqnos = PeerBuffers.alloc_shared(world, *peer_sizes(spec, world))
    return slots, flags, seqnos


def one_shot_all_reduce_into(t: torch.Tensor, group_name: str, out: torch.Tensor):
    """Symmetric memory's one-shot all-reduce of ``t`` copied into ``out`` (for a
    PyTorch without ``one_shot_all_reduce_out``)."""
    out.copy_(torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group_name))


def _name_of(e, t) -> str:
    for k, v in e.buffers.items():
        if v is t:
            return k
    raise KeyError("all-reduce of a tensor that is not an engine buffer")


def rank_engine(spec, weights, rank: int, world: int, rung: str, device, max_ctx: int,
                pdl: bool = True, peers=None):
    """One rank's engine: the sharded spec, this rank's weights, the group's rung."""
    from ..engine import Engine
    group = Group(rank, world, rung, spec, device, peers=peers)
    e = Engine(shard_spec(spec, world), weights, max_ctx=max_ctx, attention="splitk", pdl=pdl,
               tp=group)
    group.reset()
    return e
