#!/usr/bin/env bash
# Build ONNX Runtime GenAI's own virtual environment, so the verdict table can run its speculative
# decoding (a draft model, or n-gram lookup) through its worker,
# diagnostics/verdicts/workers/onnxruntime_genai_worker.py. Never part of requirements*.txt, never in CI.
#
#   tools/build-onnxruntime-genai.sh
#
# Result: data/onnxruntime-genai/venv (git-ignored) with onnxruntime-genai and its onnxruntime, plus
# what its model builder (the worker's export step) imports: a CPU-only torch, transformers, onnx,
# onnx-ir, safetensors; and data/onnxruntime-genai/VERSION (versions, install seconds, size),
# printed at the end. Idempotent: a venv that already holds the pinned versions is kept.
# Needs Python 3.10-3.13 with venv, PyPI, ~1.4 GB of disk (about 3 minutes on 2 cores). Environment:
#   ORTGENAI_VENV     where the venv goes (default data/onnxruntime-genai/venv); VERSION is written beside it
#   PYTHON            the interpreter the venv is made from (default python3)
#   TORCH_CPU_INDEX   where a CPU-only torch wheel is found when no local wheel (pip's find-links)
#                     has it (default https://download.pytorch.org/whl/cpu)
#   NICE              niceness of the install (default 10: other work shares the cores)
set -euo pipefail

ORTGENAI_VERSION=0.18.0
ONNXRUNTIME_VERSION=1.32.0
# The model builder's imports, pinned to what 0.18.0 was tried with here (an export is made by the same code each time).
TRANSFORMERS_VERSION=5.25.0
ONNX_VERSION=1.23.2
ONNX_IR_VERSION=1.1.0
SAFETENSORS_VERSION=0.8.0
NUMPY_VERSION=2.4.6
# A CPU wheel: the PyPI torch for Linux is the CUDA build, which pulls gigabytes of nvidia-* wheels.
TORCH_VERSION=2.13.0+cpu

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ORTGENAI_VENV:-$ROOT/data/onnxruntime-genai/venv}"
# DEST, PYTHON, TORCH_CPU_INDEX, NICE, PY; pins_hold, keep_built, start_install, install_cpu_torch,
# check_pins, write_version
source "$ROOT/tools/engine-venv-lib.sh"

# name==version pairs the venv must hold.
PINS=("onnxruntime-genai==$ORTGENAI_VERSION" "onnxruntime==$ONNXRUNTIME_VERSION" "transformers==$TRANSFORMERS_VERSION"
      "onnx==$ONNX_VERSION" "onnx-ir==$ONNX_IR_VERSION" "safetensors==$SAFETENSORS_VERSION" "numpy==$NUMPY_VERSION"
      "torch==$TORCH_VERSION")

# The engine and its builder must import (the builder's --help itself is broken in 0.18.0: a '%' in its text).
imports_work() {
    "$PY" -c "import onnxruntime_genai, onnxruntime_genai.models.builder, torch; assert not torch.version.cuda" >/dev/null 2>&1
}

keep_built imports_work
start_install
install_cpu_torch onnxruntime-genai  # sets CONSTRAINTS (torch pinned) for the install below

"${PIP[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION" \
    "onnxruntime-genai==$ORTGENAI_VERSION" "onnxruntime==$ONNXRUNTIME_VERSION" "numpy==$NUMPY_VERSION" \
    "transformers==$TRANSFORMERS_VERSION" "onnx==$ONNX_VERSION" "onnx-ir==$ONNX_IR_VERSION" \
    "safetensors==$SAFETENSORS_VERSION"
END=$(date +%s)

check_pins
imports_work || { echo "onnxruntime_genai, its model builder or a CPU-only torch does not import in $VENV" >&2; exit 1; }
# Speculative decoding must be reachable from Python (GeneratorParams.set_speculative_options and
# Generator.get_speculative_stats came with the release that the worker was written for).
"$PY" -c "import onnxruntime_genai as og; assert hasattr(og.GeneratorParams, 'set_speculative_options') and hasattr(og.Generator, 'get_speculative_stats')" \
    || { echo "this onnxruntime-genai has no speculative decoding API" >&2; exit 1; }

write_version \
    "onnxruntime-genai $ORTGENAI_VERSION, onnxruntime $ONNXRUNTIME_VERSION" \
    "builder: transformers $TRANSFORMERS_VERSION, onnx $ONNX_VERSION, onnx-ir $ONNX_IR_VERSION, safetensors $SAFETENSORS_VERSION, numpy $NUMPY_VERSION, torch $TORCH_VERSION"
