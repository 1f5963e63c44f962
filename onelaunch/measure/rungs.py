"""The rungs: every way of building and running our engine that the ladder measures, each
an object behind one interface (:class:`Rung`), in one registry (:data:`RUNGS`).

A rung says how its engine is built (attention, PDL, the persistent layer, launch
configurations) and whether its step replays a CUDA graph; :meth:`Rung.engine` is the one
place that turns those settings into an engine (the ladder, the profile and the phase
clock all build through it), and :meth:`Rung.supported` the one rule for where it runs.
The peers (what a user would run instead) share the interface's name and ``kind``
(:mod:`onelaunch.peers.rungs`).

Every engine the measurements build goes through :func:`make_engine`, which reads the
module's :data:`Engine`: a chapter on the CPU swaps in an engine that replays eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..engine import Engine, persistent_refusal
from ..kernels import config


def make_engine(spec, w, **kw):
    """An engine of this module's :data:`Engine` class (swappable: see the docstring)."""
    return Engine(spec, w, **kw)


@dataclass(frozen=True)
class Rung:
    """One rung of our ladder: the engine's settings and how its step runs.

    ``needs_pdl``: the rung is PDL itself (left out where the GPU has none; a later rung
    keeps its other steps without PDL). ``cfgs``: launch configurations that replace the
    table's for this rung."""
    name: str
    attention: str
    graph: bool
    pdl: bool
    persistent: bool = False
    cfgs: dict | None = None
    needs_pdl: bool = False
    megakernel: bool = False
    kind: ClassVar[str] = "ours"

    def supported(self, spec) -> bool:
        """Whether the rung applies to ``spec``'s model (the engine's own rule for its
        settings: the persistent layer, dense models only)."""
        if self.megakernel:
            from ..megakernel.step import refusal
            return refusal(spec) is None
        stages = (self.cfgs or {}).get("layer_persistent", {}).get("STAGES")
        return not (self.persistent and persistent_refusal(
            spec, self.attention, stages=stages))

    def engine(self, spec, w, max_ctx: int, persist=None):
        """The rung's engine for ``max_ctx`` positions (``persist``: the persistent
        layer's ``PersistentOptions``, for a measurement such as its phase clock)."""
        return make_engine(spec, w, max_ctx=max_ctx, attention=self.attention,
                           pdl=self.pdl,
                           persistent=self.persistent, cfgs=self.cfgs, persist=persist,
                           megakernel=self.megakernel)

    def runs_on(self, device) -> bool:
        """False for the PDL rung on a GPU without PDL, and for the one-launch step
        off Hopper (``megakernel.step.device_refusal``)."""
        if self.megakernel:
            from ..megakernel.step import device_refusal
            if device_refusal(device):
                return False
        return not self.needs_pdl or config.pdl_supported(torch.device(device))


def _rungs(*rs: Rung) -> dict[str, Rung]:
    return {r.name: r for r in rs}


MEGA = "one launch (megakernel)"      # the whole step in one launch (the rung's name)
RUNGS: dict[str, Rung] = _rungs(
    Rung("fused eager", attention="plain", graph=False, pdl=False),
    Rung("fused + graph", attention="plain", graph=True, pdl=False),
    Rung("+ split-K", attention="splitk", graph=True, pdl=False),
    Rung("+ PDL", attention="splitk", graph=True, pdl=True, needs_pdl=True),
    # one launch a dense layer (kernels/layer_persistent.py), chapter 8: each GEMV phase
    # with a register ring (STAGES 0), without and with the next phase's weight tiles
    # requested before each grid barrier; then streamed through shared memory (the table)
    Rung("persistent, nothing ahead", attention="splitk", graph=True, pdl=True,
         persistent=True, cfgs={"layer_persistent": {"NEXT": 0, "STAGES": 0}}),
    Rung("persistent, tiles ahead", attention="splitk", graph=True, pdl=True,
         persistent=True, cfgs={"layer_persistent": {"NEXT": 1, "STAGES": 0}}),
    Rung("+ persistent layer", attention="splitk", graph=True, pdl=True, persistent=True),
    # the whole step in one persistent Gluon launch (megakernel/step.py): on Hopper
    Rung(MEGA, attention="splitk", graph=True, pdl=False, megakernel=True),
)

# The ladder: the rungs every chapter's table shows, in order. "+ RoPE in attention"
# (ladder_rows(rungs=...) runs it) measured slower than + PDL on the H200 and is not a
# rung of the ladder (results/h200/2026-11-29_launch-tuning/ladder_d5af865030f4.json)
LADDER = ("fused eager", "fused + graph", "+ split-K", "+ PDL")
# bench's rungs: the ladder, then the one-launch step where it runs (dense, Hopper)
BENCH = LADDER + (MEGA,)


def rung(name: str) -> Rung:
    """The registered rung ``name`` (a ValueError naming the known ones otherwise)."""
    if name not in RUNGS:
        raise ValueError(f"unknown rung {name!r}: pick from {list(RUNGS)}")
    return RUNGS[name]


def rung_supported(spec, name: str) -> bool:
    """Whether rung ``name`` applies to ``spec``'s model (:meth:`Rung.supported`)."""
    return rung(name).supported(spec)
