#!/usr/bin/env bash
# The README's main command: build the book, then print where to open it.
#
#   bash ci/book.sh            # set up, stage the sources, build _build/html
#   ONELAUNCH_SKIP_SETUP=1 bash ci/book.sh   # skip ci/setup.sh (tests do this)
#   bash ci/book.sh -p results_gpu rtx4090   # every page shows results/rtx4090/
#
# Chapters with an executed GPU notebook (notebooks/NN_*.ipynb, committed) are rendered
# as they are; a chapter without one is executed on the CPU with its small default
# parameters first (into _build/cpu-notebooks, reused while its source, the package and
# the parameters are unchanged) and shows the numbers of the GPU run it names. The
# book's pages that compute (the introduction, the ladder) are executed too. The
# sources are staged in _build/src (ci/notebooks.py stage, which takes the arguments
# given here) and built there with warnings as errors:
#   jupyter-book build . -W -n --keep-going
# The widget JavaScript comes from npm (@jupyter-widgets/html-manager, pinned in
# package.json) and is served from _static/, never from a CDN.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PY:-$ROOT/.venv/bin/python}
[ "${ONELAUNCH_SKIP_SETUP:-0}" = 1 ] || bash ci/setup.sh

# widget JavaScript -> _static/jupyter-widgets/ (embed.js and the fonts it loads)
dist=node_modules/@jupyter-widgets/html-manager/dist
if [ ! -f "$dist/embed.js" ]; then
  echo "[book] npm ci (@jupyter-widgets/html-manager)"
  npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
fi
mkdir -p _static/jupyter-widgets
cp "$dist"/embed.js _static/jupyter-widgets/
find "$dist" -maxdepth 1 -type f \( -name '*.woff*' -o -name '*.ttf' -o -name '*.eot' -o -name '*.svg' \) \
  -exec cp {} _static/jupyter-widgets/ \;

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" ci/notebooks.py stage --reuse "$@"
cd _build/src
# --all: the results page reads results/ and the prose pages glue from the chapters,
# so nothing may be skipped as unchanged
"$(dirname "$PY")/jupyter-book" build . -W -n --keep-going --all --path-output "$ROOT"
echo
echo "[book] built: open $ROOT/_build/html/index.html"
echo "[book] (or serve it: $PY -m http.server -d $ROOT/_build/html 8000)"
