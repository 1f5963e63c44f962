#!/usr/bin/env bash
# Download the wheels that executing the chapters needs on a GPU host with no network,
# into .whl/ (git-ignored; it travels with the run as a carried path). Such a host has
# torch, triton, transformers, matplotlib, ... but no jupyter packages; ci/gpu_book.sh
# installs these with
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#
#   bash ci/fetch_wheels.sh          # idempotent: clears .whl/ and fetches again
#   PYVER=3.11 IMAGE="$(cat have.txt)" bash ci/fetch_wheels.sh   # another host
#
# PYVER: the GPU host's Python (default 3.12). IMAGE: the packages it already has (one
# name a word; default: the H200 image's list below); their wheels are dropped, so that
# /tmp/site never shadows e.g. numpy or pyyaml.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WANT=(papermill==2.7.0 nbclient==0.11.0 nbformat==5.11.1 jupyter_client==8.10.0
      ipykernel==7.4.0 ipython==9.18.1 jupytext==1.19.6 ipywidgets==8.1.9)
# the H200 image's Python packages (`pip list` there), the default of IMAGE
IMAGE=${IMAGE:-"absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama
contourpy coverage cycler cython filelock flatbuffers fonttools frozenlist fsspec h11 h5py
hf-xet httpcore httpx huggingface-hub idna imageio iniconfig jinja2 joblib kiwisolver
lxml markdown markdown-it-py markupsafe matplotlib mdurl ml-dtypes mpmath msgpack
multidict networkx ninja numpy packaging pandas pathspec pillow pip pluggy
prometheus-client propcache protobuf psutil pyarrow pygments pyparsing python-dateutil
pytest pyyaml regex requests rich safetensors scipy setuptools shellingham six sympy
tabulate tokenizers torch tqdm transformers triton typer typing-extensions urllib3
wheel wrapt yarl zipp"}
PYVER=${PYVER:-3.12}
ABI=cp${PYVER/./}
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --python-version "$PYVER" --implementation cp --abi "$ABI" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any \
  -d .whl "${WANT[@]}" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
kept=0
for w in .whl/*.whl; do
  name=$(norm "$(basename "$w" | cut -d- -f1)")
  if echo " $(echo $IMAGE) " | grep -q " $name "; then rm "$w"; else kept=$((kept+1)); fi
done
echo "[fetch_wheels] $kept wheels in .whl/ ($(du -sh .whl | cut -f1)):"
ls .whl | sed 's/-py[23].*//; s/-cp3.*//' | tr '\n' ' '; echo
