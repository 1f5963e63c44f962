#!/usr/bin/env bash
# llama.cpp's llama-bench for the llama.cpp peer (onelaunch/peers/llama_cpp.py), into
# .llama/ (git-ignored). Its source is the llama.cpp that the PyPI sdist of
# llama-cpp-python 0.3.36 vendors (llama.cpp commit 0c1e57098).
#   bash ci/llama_build.sh fetch          # here, with network: download the sdist and
#                                         # repack vendor/llama.cpp (no models, docs,
#                                         # media, tests, web UI) as .llama/src.tar.gz
#                                         # (~10 MB: carry .llama/src.tar.gz to the GPU)
#   bash ci/llama_build.sh build [ARCH]   # GPU host, no network: unpack into
#                                         # .llama/src, build
#                                         # .llama/build/bin/llama-bench; ARCH:
#                                         # 90-real (H200, default), 89-real (4090)
# The build: CUDA backend (GGML_CUDA=ON) for ARCH only, curl, OpenSSL and the server
# off, target llama-bench, 16 jobs (about 200 s on the GPU host). gguf-py, which
# writes the GGUFs, comes with the source: .llama/src/gguf-py (ci/gpu_run.sh puts it on
# PYTHONPATH where the gguf package is not installed).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
D=.llama
mkdir -p "$D"
case "${1:-}" in
fetch)
  PY=${PY:-.venv/bin/python}
  [ -x "$PY" ] || PY=python3
  rm -rf "$D/sdist" && mkdir -p "$D/sdist"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$D/sdist" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  top=llama_cpp_python-$VERSION/vendor/llama.cpp
  tmp=$(mktemp -d)
  tar xzf "$D/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$tmp" "$top"
  log=llama_cpp_python-$VERSION/CHANGELOG.md
  tar xzOf "$D/sdist/llama_cpp_python-$VERSION.tar.gz" "$log" \
    | grep -q "llama.cpp@0c1e57098" \
    || echo "[llama] warning: the sdist's CHANGELOG names another llama.cpp commit"
  src=$tmp/$top
  rm -rf "$src"/{models,docs,media,benches,tests,.github,.devops,tools/ui,examples/*/} \
    "$src"/tools/server/public* 2>/dev/null || true
  mkdir -p "$src/examples"                # CMake only adds it with LLAMA_BUILD_EXAMPLES
  tar czf "$D/src.tar.gz" -C "$tmp/llama_cpp_python-$VERSION/vendor" llama.cpp
  rm -rf "$tmp" "$D/sdist"
  echo "[llama] $D/src.tar.gz ($(du -h "$D/src.tar.gz" | cut -f1)): llama.cpp 0c1e57098"
  ;;
build)
  ARCH=${2:-90-real}
  if [ ! -f "$D/src.tar.gz" ]; then
    echo "[llama] no $D/src.tar.gz: run 'bash ci/llama_build.sh fetch' where there is"
    echo "        network, and carry .llama/src.tar.gz to this machine"
    exit 1
  fi
  bin=$D/build/bin/llama-bench
  if [ -x "$bin" ] && [ "$bin" -nt "$D/src.tar.gz" ] && [ -d "$D/src/gguf-py" ] \
     && [ "$(cat "$D/build/arch" 2>/dev/null)" = "$ARCH" ]; then
    echo "[llama] $bin ($ARCH) is newer than its source: kept"; exit 0
  fi
  rm -rf "$D/src" && mkdir -p "$D/src"
  tar xzf "$D/src.tar.gz" -C "$D/src" --strip-components=1
  cmake -S "$D/src" -B "$D/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF
  cmake --build "$D/build" --target llama-bench -j 16
  echo "$ARCH" > "$D/build/arch"
  ls -la "$D/build/bin/llama-bench"
  ;;
*)
  sed -n '2,16p' "$0"; exit 2 ;;
esac
