#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (CPU only) from the llama.cpp sources that the
# llama-cpp-python source package carries (vendor/llama.cpp), so the verdict table can run
# llama.cpp's draft-model speculative decoding (`-md`) next to llama-cpp-python's server.
#
#   tools/build-llama-server.sh [path/to/llama_cpp_python-X.Y.Z.tar.gz]
#
# Without a path it downloads the sdist: pip download --no-deps --no-binary :all: llama-cpp-python==$VERSION
# Result: data/llama.cpp/bin/llama-server, data/llama.cpp/VERSION, and the same sources' GGUF converter
# (data/llama.cpp/convert: convert_hf_to_gguf.py and gguf-py, used for the draft GGUF), all git-ignored.
# Needs cmake, a C++17 compiler and ~2 GB of scratch space. Environment:
#   LLAMA_CPP_PYTHON_VERSION  sdist version to download (default 0.3.16)
#   JOBS                      parallel compile jobs (default: nproc)
#   KEEP_BUILD=1              keep the temporary source/build folder (its path is printed)
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.16}"
JOBS="${JOBS:-$(nproc)}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/data/llama.cpp"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")"
cleanup() { if [[ "${KEEP_BUILD:-0}" == 1 ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

if [[ $# -ge 1 ]]; then
    SDIST="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
    [[ -f "$SDIST" ]] || { echo "no such sdist: $1" >&2; exit 1; }
else
    echo "downloading the llama-cpp-python $VERSION sdist"
    python -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK/sdist"
    SDIST="$(ls "$WORK"/sdist/llama_cpp_python-*.tar.gz)"
fi

echo "extracting vendor/llama.cpp from $SDIST"
tar -xzf "$SDIST" -C "$WORK" --wildcards '*/vendor/llama.cpp/*' '*/CHANGELOG.md' '*/PKG-INFO'
PKG="$(ls -d "$WORK"/llama_cpp_python-*/)"
SRC="$PKG/vendor/llama.cpp"
# The sdist's vendor/llama.cpp/.git is a dangling submodule pointer: drop it so that cmake's
# build-info does not ask git (it would fail, or worse, describe some enclosing repository).
rm -f "$SRC/.git"

# The sdist has no git history; its CHANGELOG names the llama.cpp commit of this release.
PY_VERSION="$(sed -n 's/^Version: //p' "$PKG/PKG-INFO" | head -n1)"
COMMIT="$(awk -v v="## [$PY_VERSION]" 'index($0, v) == 1 {on = 1; next} on && /^## \[/ {exit}
          on && match($0, /llama\.cpp@[0-9a-f]+/) {print substr($0, RSTART + 10, RLENGTH - 10); exit}' "$PKG/CHANGELOG.md")"
COMMIT="${COMMIT:-unknown}"
SHORT="${COMMIT:0:9}"
echo "llama-cpp-python $PY_VERSION vendors llama.cpp commit $COMMIT"

START=$(date +%s)
cmake -S "$SRC" -B "$WORK/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DLLAMA_BUILD_COMMIT="$SHORT" \
    > "$WORK/configure.log" || { cat "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" --config Release --target llama-server -j "$JOBS"
END=$(date +%s)

mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-server" "$DEST/bin/llama-server"
# The converter of the same llama.cpp commit, for diagnostics.verdicts.llama_server.draft_gguf.
rm -rf "$DEST/convert"
mkdir -p "$DEST/convert"
cp "$SRC/convert_hf_to_gguf.py" "$DEST/convert/"
cp -r "$SRC/gguf-py" "$DEST/convert/gguf-py"
SERVER_VERSION="$("$DEST/bin/llama-server" --version 2>&1 | tr '\n' ' ' | sed 's/ *$//')"
{
    echo "llama.cpp commit $COMMIT"
    echo "source: llama-cpp-python $PY_VERSION sdist ($(basename "$SDIST")), vendor/llama.cpp"
    echo "llama-server --version: $SERVER_VERSION"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((END - START)) s with $JOBS jobs on $(uname -m)"
} > "$DEST/VERSION"
cat "$DEST/VERSION"
echo "llama-server: $DEST/bin/llama-server"
