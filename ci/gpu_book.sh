#!/usr/bin/env bash
# Run on a GPU: execute every chapter with its GPU parameters, compare the new
# results with the committed ones, and pack the executed notebooks and results into one
# archive. The regression run of the README: exit 1 if a chapter raised, a ratio moved
# beyond its noise band the wrong way, or a check failed (ci/regress.py; its table is
# printed and written to regress.md beside the archive).
#
#   bash ci/gpu_book.sh [ARCHIVE] [CHAPTER ...]   # default archive: $OUT/book-gpu.tar.gz
#   ONELAUNCH_GPU_MEM_GB=0 bash ci/gpu_book.sh    # no memory cap (default: 24 GB, a 4090's)
#
# That machine has torch, triton and transformers but no network and no jupyter
# packages: run `bash ci/fetch_wheels.sh` here first and carry `.whl` with the run. The
# wheels go to /tmp/site (PYTHONPATH), a python3 kernelspec is registered for papermill,
# and `ci/notebooks.py gpu` writes notebooks/NN_*.ipynb and results/<gpu>/*.json.
# Set ONELAUNCH_COMMIT to the commit being run (the copied tree has no .git); it is
# recorded in each notebook and, where results say "unknown", in the results files.
# Back on this machine: python ci/unpack_book.py book-gpu.tar.gz (it refuses an archive
# whose call started before the last one was unpacked), check, commit notebooks/ and
# results/. A run in several calls: unpack each call before starting the next.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ARCHIVE=${1:-${OUT:?set OUT or give the archive path}/book-gpu.tar.gz}
shift || true
set -- $(echo "$@" | tr ',' ' ')          # chapters as "a b" or "a,b"
PY=${PY:-python3}
[ -d .whl ] || { echo "[gpu_book] no .whl/: run ci/fetch_wheels.sh and carry .whl"; exit 2; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/site/bin:$PATH"
export JUPYTER_PATH=/tmp/jupyter JUPYTER_DATA_DIR=/tmp/jupyter JUPYTER_RUNTIME_DIR=/tmp/jupyter/runtime
"$PY" -m ipykernel install --name python3 --display-name "Python 3" --prefix /tmp/jupyter-prefix >/dev/null
mkdir -p /tmp/jupyter/kernels
cp -r /tmp/jupyter-prefix/share/jupyter/kernels/python3 /tmp/jupyter/kernels/
export ONELAUNCH_COMMIT=${ONELAUNCH_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1
echo "[gpu_book] commit $ONELAUNCH_COMMIT; $("$PY" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())')"
# the committed results, before this run overwrites them (the tree here has no .git)
BEFORE=$(mktemp -d)
cp -r results/. "$BEFORE/" 2>/dev/null || true
rc=0
"$PY" ci/notebooks.py gpu "$@" --mem-gb "${ONELAUNCH_GPU_MEM_GB:-24}" || rc=$?
# results written where git was missing say commit "unknown": name the commit run
"$PY" - <<'PYEOF'
import json, os, pathlib
c = os.environ.get("ONELAUNCH_COMMIT", "unknown")
for p in pathlib.Path("results").glob("*/*.json"):
    d = json.loads(p.read_text())
    changed = False
    if d.get("meta", {}).get("commit") in (None, "unknown") and c != "unknown":
        d["meta"]["commit"] = c; changed = True
    for r in d.get("rows", []):
        if isinstance(r, dict) and r.get("commit") == "unknown" and c != "unknown":
            r["commit"] = c; changed = True
    if changed:
        p.write_text(json.dumps(d, indent=1) + "\n")
PYEOF
# what moved against the committed results, and whether everything is one run
GPU=$("$PY" -c 'from onelaunch.report.results import gpu_slug; print(gpu_slug())')
mkdir -p "$(dirname "$ARCHIVE")"
REPORT="$(dirname "$ARCHIVE")/regress.md"
if [ -d "$BEFORE/$GPU" ]; then
  "$PY" ci/regress.py --gpu "$GPU" --old "$BEFORE/$GPU" --new "results/$GPU" --out "$REPORT" \
    || rc=$((rc ? rc : 1))
else
  echo "[gpu_book] no committed results/$GPU: nothing to compare" | tee "$REPORT"
fi
if [ $# -eq 0 ]; then   # every chapter ran: the book must now come from this one run
  "$PY" ci/check_one_commit.py || rc=$((rc ? rc : 1))
fi
tar czf "$ARCHIVE" notebooks/*.ipynb $(ls -d results/*/ 2>/dev/null | grep -v '^results/cpu/$' || true)
echo "[gpu_book] packed $(tar tzf "$ARCHIVE" | wc -l) files into $ARCHIVE (exit $rc)"
exit $rc
