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

The package: ``shard.py`` (the transformation of spec and weights), ``group.py`` (one
rank's view of the group: buffers, call sites, all-reduce launches; its engine),
``spawn.py`` (one process per rank, hardware checks); the benchmark and CI jobs that run
on every rank are measurements (``onelaunch/measure/tp.py``). ``tp.shard_spec``,
``tp.Group``, ``tp.launch`` and the rest are imported on first use, so importing the
package for :data:`RUNGS` loads nothing else.
"""
from __future__ import annotations

import importlib

RUNGS = ("nccl", "symm", "p2p", "fused")     # the GPU rungs, in the order the chapter shows
CPU_RUNGS = ("gloo",)


class TPError(RuntimeError):
    """A tensor-parallel run that cannot start or did not finish: the message says which
    rank and what to do."""


# name -> the module of this package that holds it
_HOME = {"shard_spec": "shard", "vocab_range": "shard", "shard_weights": "shard",
         "_shard_one": "shard",
         "rank_weights": "shard", "Group": "group", "peer_sizes": "group",
         "shared_peers": "group", "rank_engine": "group", "SAFE_ENV": "spawn",
         "check_hardware": "spawn", "launch": "spawn"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
