#!/usr/bin/env bash
# The test command (README): set up, then the CPU test suite (kernels in Triton's
# interpreter), the CPU papermill run of every chapter, the strict book build and the
# browser test. GPU tests are marked `gpu` and run on the GPU host (ci/gpu_run.sh).
#
# A run here sees what a fresh clone on a new machine sees: every cache a run could
# reuse (Triton's compiled kernels, torch inductor's, pip's and npm's downloads,
# matplotlib's font list, Hugging Face's hub, Jupyter's kernelspecs and config, HOME's
# dot folders, the temporary folder) is a new empty folder, removed at the end, and the
# checkout's own outputs of an earlier run (_build/, results/cpu/, chapter 7's progress
# files) are deleted first.
set -euo pipefail
cd "$(dirname "$0")/.."
FRESH=$(mktemp -d "${TMPDIR:-/tmp}/onelaunch-test.XXXXXX")
trap 'rm -rf "$FRESH"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$FRESH"/{home,tmp,cache,config,data,state}

# set-up keeps HOME (pip's and npm's configuration, pyenv's python3 live there) but
# downloads into empty caches, as on a new machine
PIP_CACHE_DIR="$FRESH/pip" npm_config_cache="$FRESH/npm" bash ci/setup.sh

# the tests: HOME and every cache fresh; git keeps the user's configuration (a
# safe.directory, say), which is no cache
if [ -z "${GIT_CONFIG_GLOBAL:-}" ] && [ -f "$HOME/.gitconfig" ]; then
  export GIT_CONFIG_GLOBAL="$HOME/.gitconfig"
fi
export HOME="$FRESH/home" TMPDIR="$FRESH/tmp"
export XDG_CACHE_HOME="$FRESH/cache" XDG_CONFIG_HOME="$FRESH/config" \
  XDG_DATA_HOME="$FRESH/data" XDG_STATE_HOME="$FRESH/state"
export TRITON_HOME="$FRESH/triton" TRITON_CACHE_DIR="$FRESH/triton/cache" \
  TORCHINDUCTOR_CACHE_DIR="$FRESH/inductor" TORCH_HOME="$FRESH/torch" \
  MPLCONFIGDIR="$FRESH/matplotlib" HF_HOME="$FRESH/huggingface" \
  IPYTHONDIR="$FRESH/ipython" JUPYTER_CONFIG_DIR="$FRESH/jupyter/config" \
  JUPYTER_DATA_DIR="$FRESH/jupyter/data" JUPYTER_RUNTIME_DIR="$FRESH/jupyter/runtime" \
  PIP_CACHE_DIR="$FRESH/pip"
unset TRANSFORMERS_CACHE HF_HUB_CACHE HF_DATASETS_CACHE JUPYTER_PATH
# an earlier run's chapters, results and book: a fresh clone has none of them (the
# chapters merge their rows into results/cpu/ladder.json and read each other's results
# there; chapter 7 shows the rows of its progress file when a run stops)
rm -rf _build results/cpu notebooks/*.progress.json

export TRITON_INTERPRET=1
# one thread a process: the pytest workers and the chapters' kernels already fill the two
# cores, and torch's own thread pool in each would oversubscribe them
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# three workers on two cores, a test file's tests in order in one of them: the CPU run
# of the chapters (tests/test_book.py, itself two processes: the chapters that share the
# ladder file in order, chapter 7 beside them) in one, every other file in the other two.
# With two workers the second ran all the other files one after another and set the end
# time (fresh clone at 0508929: pytest 995 s, of which the chapter run 846 s).
# --no-loadscope-reorder: files in collection order, which tests/conftest.py sets: the
# chapter run first, then the files with the most CPU work, longest first
# -p no:cacheprovider: no .pytest_cache read or written
.venv/bin/python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder \
  --durations=25 -m "not gpu and not browser" tests "$@"
# the book: tests/test_book.py (in the run above) executed every chapter on the CPU with
# papermill and built the book with -W -n; now open it in headless chromium, offline
.venv/bin/python -m pytest -q -p no:cacheprovider -m browser tests/test_browser.py \
  tests/test_page_width.py
