"""The GPU memory cap and the peak a chapter's kernel records (onelaunch/memcap.py,
ci/notebooks.py), on the CPU: torch.cuda is faked, but the device index goes through
torch's own check, the one that refused a bare "cuda" in every GPU book run before."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from onelaunch import memcap

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))


def _fake_cuda(monkeypatch, total_gb: float = 48.0):
    from torch.cuda._utils import _get_device_index
    calls = []

    def set_fraction(fraction, device=None):
        calls.append((fraction, _get_device_index(device)))   # raises on a bare "cuda"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: SimpleNamespace(total_memory=int(total_gb * memcap.GIB)))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * memcap.GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 4 * memcap.GIB)
    monkeypatch.setattr(memcap, "_applied", {})
    return calls


def test_cap_applied_on_the_current_gpu_and_recorded_with_the_peak(monkeypatch, tmp_path):
    calls = _fake_cuda(monkeypatch)
    monkeypatch.setenv(memcap.ENV, "24")
    assert memcap.apply_memory_cap() == 24.0
    assert calls == [(0.5, 0)]
    out = tmp_path / "peak.json"
    memcap.write_peak(out)
    import json
    assert json.loads(out.read_text()) == {"peak_allocated_gb": 3.0, "peak_reserved_gb": 4.0,
                                           "cap_gb": 24.0}


def test_peak_names_no_cap_when_none_was_applied(monkeypatch):
    _fake_cuda(monkeypatch)
    monkeypatch.setenv(memcap.ENV, "24")            # asked, but never applied here
    assert memcap.peak()["cap_gb"] is None


def test_run_log_warns_of_a_missing_peak_or_cap():
    from notebooks import memory_line
    assert "WARNING" in memory_line("01_x", {"gpu_memory": None, "gpu_mem_cap_gb": 24.0})
    unapplied = {"gpu_memory": {"peak_allocated_gb": 3.0, "peak_reserved_gb": 4.0,
                                "cap_gb": None}, "gpu_mem_cap_gb": 24.0}
    assert "applied none" in memory_line("01_x", unapplied)
    ok = {"gpu_memory": {"peak_allocated_gb": 3.0, "peak_reserved_gb": 4.0, "cap_gb": 24.0},
          "gpu_mem_cap_gb": 24.0}
    assert "WARNING" not in memory_line("01_x", ok) and "peak 3.0 GB" in memory_line("01_x", ok)
