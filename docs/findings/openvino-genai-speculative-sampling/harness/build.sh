#!/bin/bash
# Builds and runs the unit harnesses for fix.patch (openvino-genai-speculative-sampling), stock and patched.
# Needs: the openvino.genai mirror (tag 2026.3.0.0), the OpenVINO venv (headers + libs of 2026.4.1),
# minja and nlohmann/json headers (here: llama.cpp's vendor folder from the llama-cpp-python 0.3.16 sdist).
set -euo pipefail
# Usage: OPENVINO_GENAI_GIT=<a clone of openvino.genai> VENDOR=<a folder with minja/ and nlohmann/> bash build.sh
# The builds go to a temporary folder (OUT), never beside these files.
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
GIT=${OPENVINO_GENAI_GIT:?set OPENVINO_GENAI_GIT to a clone of github.com/openvinotoolkit/openvino.genai}
PATCH=${PATCH:-$HERE/../fix.patch}
VENV=${VENV:-$ROOT/data/openvino/venv/lib/python3.11/site-packages}
VENDOR=${VENDOR:?set VENDOR to a folder holding minja/ and nlohmann/ headers, e.g. llama.cpp vendor/ from the llama-cpp-python 0.3.16 sdist}
H=${OUT:-$(mktemp -d)}
cp "$HERE/loop.cpp" "$H/loop.cpp"
OVI=$VENV/openvino/include L1=$VENV/openvino/libs L2=$VENV/openvino_genai
mkdir -p "$H/stub" && printf 'enum gguf_tensor_type { GGUF_TYPE_F32 = 0 };\nstruct gguf_tensor;\n' > "$H/stub/gguflib.h"
for kind in stock patched; do
  T=$H/$kind; rm -rf "$T"; mkdir -p "$T/open/sampling"
  git -C "$GIT" archive 2026.3.0.0 src/cpp | tar -x -C "$T"
  [ $kind = patched ] && (cd "$T" && patch -s -p1 < "$PATCH")
  S=$T/src/cpp; D=; [ $kind = stock ] && D=-DSTOCK
  sed 's/^class Sampler {$/class Sampler { public:/' "$S/src/sampling/sampler.hpp" > "$T/open/sampling/sampler.hpp"
  INC="-I $S/src -I $S/include -I $OVI -I $VENDOR -I $H/stub"
  for f in sampling/sampler.cpp sequence_group.cpp generation_config.cpp; do
    nice -n 10 g++ -std=c++17 -O1 -fPIC -c $INC "$S/src/$f" -o "$T/$(basename "$f" .cpp).o"; done
  nice -n 10 g++ -std=c++17 -O1 -fPIC $D -c -I "$T/open" -I "$S/src/sampling" $INC "$H/loop.cpp" -o "$T/loop.o"
  g++ -o "$T/loop" "$T"/{loop,sampler,sequence_group,generation_config}.o "$L2/libopenvino_genai.so.2641" "$L1/libopenvino.so.2641" -Wl,-rpath,"$L1:$L2" 2>/dev/null
  for k in 0 3; do echo "== $kind, top_k $k"; LD_LIBRARY_PATH=$L1:$L2 "$T/loop" 100000 $k || true; done
done
