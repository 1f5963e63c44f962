#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv with the pinned packages and the package itself.
# Idempotent: a second run only checks. Later sections (book, browser) add their needs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
stamp=.venv/.onelaunch-req
if [ ! -f "$stamp" ] || ! cmp -s requirements.txt "$stamp"; then
  echo "[setup] installing requirements.txt (torch CPU wheel, triton, transformers, ...)"
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e . 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  cp requirements.txt "$stamp"
fi
.venv/bin/python -c "import torch, triton, transformers, onelaunch" \
  || { echo "[setup] the virtualenv is broken: delete .venv and rerun ci/setup.sh"; exit 1; }
