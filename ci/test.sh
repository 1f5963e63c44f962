#!/usr/bin/env bash
# The test command (README): set up, then the CPU test suite (kernels in Triton's
# interpreter), the CPU papermill run of every chapter, the strict book build and the
# browser test. GPU tests are marked `gpu` and run on the GPU machine (ci/gpu_run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export TRITON_INTERPRET=1
# one thread a process: two pytest workers and the chapters' kernel already fill the two
# cores, and torch's own thread pool in each would oversubscribe them
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# two workers (both cores), a test file's tests in order in one of them: the CPU run of
# the chapters (tests/test_book.py, about 10 minutes) beside everything else
# --no-loadscope-reorder: files in name order, so the long chapter run (test_book.py, the
# second file) starts at once instead of after the files with the most tests
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder \
  -m "not gpu and not browser" tests "$@"
# the book: tests/test_book.py (in the run above) executed every chapter on the CPU with
# papermill and built the book with -W -n; now open it in headless chromium, offline
.venv/bin/python -m pytest -q -m browser tests/test_browser.py
