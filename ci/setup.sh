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

# ---- the book (ci/book.sh) and its browser test (tests/test_browser.py) ----------------
# widget JavaScript for the static pages: npm @jupyter-widgets/html-manager, pinned in
# package.json / package-lock.json (served from _static/, never from a CDN)
if [ ! -f node_modules/@jupyter-widgets/html-manager/dist/embed.js ] \
   || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; }
  echo "[setup] npm ci (@jupyter-widgets/html-manager)"
  npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
fi
# Debian's chromium for the headless browser test (never `playwright install`)
if [ ! -x /usr/bin/chromium ]; then
  echo "[setup] apt-get install chromium"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
