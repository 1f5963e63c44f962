"""Counting launches: the kernels (GPU) or aten ops (CPU) that one call of a function
makes, with ``torch.profiler`` (chapter 1's count of what HF ``generate`` launches).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch


def _is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def _sync(device):
    if _is_cuda(device):
        torch.cuda.synchronize(device)


# aten ops that only make a view or read metadata: no kernel on a GPU
_NO_KERNEL = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::transpose", "aten::t",
    "aten::permute", "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::select",
    "aten::slice", "aten::chunk", "aten::split", "aten::split_with_sizes", "aten::unbind",
    "aten::as_strided", "aten::alias", "aten::detach", "aten::_unsafe_view", "aten::empty",
    "aten::empty_strided", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::view_as", "aten::narrow", "aten::numpy_T", "aten::item", "aten::_local_scalar_dense",
    "aten::is_nonzero", "aten::to", "aten::_to_copy", "aten::type_as",
}


@dataclass
class LaunchCount:
    """What one call of a function made. ``count`` is the headline number, in ``unit``:
    ``"cuda kernels"`` on a GPU (kernels that ran, from CUPTI; memcpy/memset are in
    ``memops``; ``host_launch_calls`` counts cudaLaunchKernel/cuLaunchKernel/cudaGraphLaunch
    calls, so a CUDA-graph replay is many kernels but one launch call), or on the CPU
    ``"aten ops (cpu proxy)"``: top-level aten calls that are not views, each at least one
    kernel launch on a GPU (``to``/``_to_copy`` are left out: on a GPU they launch only
    when they convert)."""
    count: int
    unit: str
    memops: int = 0
    host_launch_calls: int | None = None
    by_name: dict = field(default_factory=dict)

    def __int__(self):
        return self.count

    def as_dict(self):
        return asdict(self)


def count_launches(fn, device="cuda", warmup: int = 1, top: int = 15) -> LaunchCount:
    """Kernels (GPU) or aten ops (CPU) that one call of ``fn`` makes, with torch.profiler.
    ``fn`` is called ``warmup`` times first (cuBLAS handles, compilation, autotuning)."""
    from collections import Counter
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(warmup):
            fn()
        _sync(device)
        cuda = _is_cuda(device)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            fn()
            _sync(device)
    events = prof.events()
    if cuda:
        kern, mem = Counter(), 0
        host = 0
        for e in events:
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
                if e.name.startswith(("Memcpy", "Memset")):
                    mem += 1
                else:
                    kern[e.name] += 1
            elif e.name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch",
                                    "cuGraphLaunch", "cudaLaunchCooperativeKernel")):
                host += 1
        return LaunchCount(sum(kern.values()), "cuda kernels", mem, host,
                           dict(kern.most_common(top)))
    ops = Counter()
    for e in events:
        if not e.name.startswith("aten::") or e.name in _NO_KERNEL:
            continue
        p, nested = e.cpu_parent, False
        while p is not None:
            if p.name.startswith("aten::"):
                nested = True
                break
            p = p.cpu_parent
        if not nested:
            ops[e.name] += 1
    return LaunchCount(sum(ops.values()), "aten ops (cpu proxy)", 0, None,
                       dict(ops.most_common(top)))
