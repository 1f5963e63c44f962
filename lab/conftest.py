"""Set-up for the lab's checks (``python -m pytest lab/test_X.py``), as tests/conftest.py
does for the suite: without a GPU, Triton kernels run in Triton's CPU interpreter (chosen
before any kernel module is imported); lab/ and tests/ are on the path, so a check
imports its lab module and the suite's small helpers (``test_kernels``)."""
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]
