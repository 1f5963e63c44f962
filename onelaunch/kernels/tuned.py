"""Measured launch tables: ``kernels/tuned/<arch>.json``, one schema, one reader, one
merging writer.

A sweep on a GPU (``python -m onelaunch bench --model NAME --what sweepcfg --write-table``
for each kernel alone, ``--what sweepplan --write-table`` in the whole step) writes the
fastest configuration it found for each op at each weight shape; ``config.get`` prefers such an
entry to the hand-written ``config.TABLE``. The file:

    {"arch": "sm_90", "gpu": ..., "model": ..., "read_tbps": ..., "date": ...,
     "ops": {op: {"N,K": config, ...}, ...},          # keyed by the weight's (N, K)
     "measured": {"op N,K": {...}, ...},              # what the kernel sweep timed
     "step_sweeps": {"op N,K": {...}, ...}}           # what the step sweep timed

Writing merges: an entry for another op or another shape stays, so the two sweeps (and
sweeps of two models, whose shapes differ) add to one table instead of replacing it.
"""
from __future__ import annotations

import functools
import json
import math
import os

DIR = os.path.join(os.path.dirname(__file__), "tuned")


def path(arch: str) -> str:
    return os.path.join(DIR, f"{arch}.json")


def shape_key(shape) -> str:
    return f"{shape[0]},{shape[1]}"


@functools.lru_cache(maxsize=None)
def read(arch: str) -> dict:
    """op -> {"N,K": config} of ``arch``'s table ({} where there is none)."""
    p = path(arch)
    if not os.path.exists(p):
        return {}
    with open(p) as f:
        return json.load(f).get("ops", {})


def nearest(entries: dict, shape) -> dict | None:
    """The entry measured at the shape nearest ``shape`` (N, K) in log space (any entry
    when ``shape`` is None)."""
    if not entries:
        return None
    if shape is None:
        return next(iter(entries.values()))

    def dist(key):
        n, k = (int(v) for v in key.split(","))
        return abs(math.log(n / shape[0])) + abs(math.log(k / shape[1]))
    return entries[min(entries, key=dist)]


def write_table(arch: str, entries: dict, meta: dict | None = None,
                notes: dict | None = None) -> str:
    """Merge ``entries`` ({op: {"N,K": config}}) into ``arch``'s table and return its
    path. What is there stays unless ``entries`` replaces that very (op, shape);
    ``meta`` (gpu, model, read_tbps, date) updates the top-level fields; ``notes``
    ({"measured" or "step_sweeps": {"op N,K": row}}) merges into those sections."""
    p = path(arch)
    d = {"arch": arch, "ops": {}}
    if os.path.exists(p):
        with open(p) as f:
            d = json.load(f)
    d.update(meta or {})
    d["arch"] = arch
    for op, by_shape in entries.items():
        d.setdefault("ops", {}).setdefault(op, {}).update(by_shape)
    for section, rows in (notes or {}).items():
        d.setdefault(section, {}).update(rows)
    os.makedirs(DIR, exist_ok=True)
    with open(p, "w") as f:
        json.dump(d, f, indent=1)
    read.cache_clear()
    return p
