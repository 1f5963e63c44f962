"""Test-wide set-up. Without a GPU, Triton kernels run in Triton's CPU interpreter; that
must be chosen before any kernel module is imported (``@triton.jit`` reads it then).
On a GPU machine the variable is left alone, so GPU tests compile real kernels."""
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))   # test modules share small helpers
