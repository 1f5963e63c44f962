"""The persistent layer's switches as data: one frozen dataclass, passed explicitly.

    Engine(spec, w, persistent=True, persist=PersistentOptions(split="0-4,5-6"))

Every field left at its default takes the launch table's entry (``kernels/config.py``,
``layer_persistent``), so ``PersistentOptions()`` is the engine as measured. A field set
overrides the entry for that engine only: a measurement (``lab/persistent_check.py``,
``profile.phase_rows``) or a test asks for what it measures here, and nothing is read
from the environment.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PersistentOptions:
    # programs of the persistent grid (None: the entry's GRID, else SMs x per_sm)
    grid: int | None = None
    # programs per SM (None: the entry's PER_SM, else 1)
    per_sm: int | None = None
    # 0: each GEMV phase walks its tiles with a register ring, as the unfused kernels;
    # N > 0: one flat loop streamed through shared memory, N - 1 tiles ahead
    # (``stream_gemv``); None: the entry's STAGES
    stages: int | None = None
    # "BNxBK": the streamed phases' row tile, for all four GEMVs; "own": each op's own
    # tile; None: the entry's TILE
    tile: str | None = None
    # RoPE and the KV write inside the attention phase, one barrier fewer a layer (a
    # layer with q/k norms keeps its RoPE phase); None: the entry's FOLD_ROPE
    fold_rope: bool | None = None
    # a cooperative launch on a GPU (all programs resident: the barriers need it)
    coop: bool = True
    # PDL on the layer kernel (None: the entry's PDL, default on; never without the
    # engine's pdl)
    pdl: bool | None = None
    # "0": all phases in one launch; "1": one launch per phase, no barrier (isolates a
    # barrier bug; what the interpreter does); "0-4,5-7": those groups of phases, one
    # launch each (``layer_persistent.phase_ranges``)
    split: str = "0"
    # every program stamps %globaltimer at each phase's start and end into the engine's
    # ``layer_clock`` buffer (a GPU measurement: ``measure.profile.clock_phases``)
    clock: bool = False
