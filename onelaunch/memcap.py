"""Run as if the GPU had less memory: ``ONELAUNCH_GPU_MEM_GB=24`` is an RTX 4090.

The cap is torch's per-process memory fraction (``torch.cuda.set_per_process_memory_fraction``):
the caching allocator refuses to hold more than ``GB * 2**30`` bytes, so a chapter that
fits under the cap on an H200 fits on a 24 GB card too (CUDA's own context and Triton's
compiled kernels sit outside torch's allocator and are not counted). The GPU book run
(``ci/notebooks.py gpu``) sets it to 24 by default, applies it in every chapter's kernel
before the first cell, and records it, with each chapter's peak, in the notebook's
metadata and the results files' ``meta``.

    ONELAUNCH_GPU_MEM_GB=24 python -c "from onelaunch import memcap; memcap.apply_memory_cap()"
"""
from __future__ import annotations

import json

from . import env

ENV = "ONELAUNCH_GPU_MEM_GB"
PEAK_FILE_ENV = "ONELAUNCH_PEAK_FILE"
GIB = 2 ** 30


def cap_gb() -> float | None:
    """The cap asked for, in GB (GiB), or None. ``0`` or empty means no cap."""
    v = (env.get(ENV) or "").strip()
    if not v:
        return None
    gb = float(v)
    if gb < 0:
        raise ValueError(f"{ENV}={v}: give the GPU memory in GB, e.g. 24")
    return gb or None


# The cap this process applied (GB), set by apply_memory_cap: what peak() records.
_applied: dict[str, float] = {}


def apply_memory_cap(device=None) -> float | None:
    """Cap torch's memory on ``device`` (default: the current GPU) at ``ONELAUNCH_GPU_MEM_GB``.
    Returns the cap in GB, or None when there is none or no GPU. Idempotent."""
    gb = cap_gb()
    if gb is None:
        return None
    import torch
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda" if device is None else device)
    if dev.index is None:    # torch's fraction setter wants an index, not a bare "cuda"
        dev = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gb * GIB / total), dev)
    _applied["cap_gb"] = gb
    return gb


def peak() -> dict | None:
    """torch's peak allocated and reserved GPU memory in this process, in GB."""
    import torch
    if not torch.cuda.is_initialized():
        return None
    return {"peak_allocated_gb": round(torch.cuda.max_memory_allocated() / GIB, 2),
            "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / GIB, 2),
            "cap_gb": _applied.get("cap_gb")}       # the cap applied here, not the one asked


def write_peak(path=None) -> None:
    """Write :func:`peak` to ``path`` (default ``$ONELAUNCH_PEAK_FILE``) as JSON."""
    path = path or env.get(PEAK_FILE_ENV)
    if not path:
        return
    p = peak()
    if p is not None:
        with open(path, "w") as f:
            json.dump(p, f)


# What ci/notebooks.py runs in each chapter's kernel before the first cell (an IPython
# startup file): after every cell the peak so far, for the notebook's metadata (registered
# first, so that it records even if the cap fails), and the cap. IPython only logs an
# error raised here, so the peak file names the cap actually applied (None if it failed).
KERNEL_STARTUP = '''\
# written by ci/notebooks.py: runs in the chapter's kernel before its first cell
import warnings
# the fp32 reference sets its own precision; compiled bf16 peers do not use TF32
warnings.filterwarnings("ignore", message=".*TensorFloat32 tensor cores.*")
from onelaunch import memcap as _memcap
get_ipython().events.register("post_run_cell", lambda *_: _memcap.write_peak())
_memcap.apply_memory_cap()
'''
