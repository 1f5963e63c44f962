"""Test-wide set-up. Without a GPU, Triton kernels run in Triton's CPU interpreter; that
must be chosen before any kernel module is imported (``@triton.jit`` reads it then).
On a GPU host the variable is left alone, so GPU tests compile real kernels."""
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))   # test modules share small helpers

# The order files are handed to pytest-xdist's workers (ci/test.sh: --dist loadfile
# --no-loadscope-reorder hands them out in collection order, one file to the next idle
# worker): the chapters' CPU run first (tests/test_book.py, the longest by far), then the
# files with the most CPU work, longest first, so that no long file starts last and the
# workers finish together; every other file after them, in name order. Tests keep their
# order within a file. Measured CPU seconds are in the commit that set this order.
LONGEST_FIRST = ("test_book.py", "test_persistent.py", "test_tp.py", "test_engine.py",
                 "test_cli.py", "test_splitk.py", "test_sm89.py", "test_gates.py",
                 "test_moe.py", "test_prefill.py", "test_kernels.py", "test_paths.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = os.path.basename(str(item.path))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)      # stable: name order, and each file's own order, kept
