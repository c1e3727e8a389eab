#!/usr/bin/env bash
# Build the OpenVINO GenAI engine's own virtual environment, so the verdict table can run
# OpenVINO GenAI's speculative decoding (a draft model, or prompt lookup) through its worker,
# diagnostics/verdicts/workers/openvino_worker.py. Never part of requirements*.txt, never in CI.
#
#   tools/build-openvino.sh
#
# Result: data/openvino/venv (git-ignored) with openvino-genai and the matching openvino and
# openvino-tokenizers, plus what the worker's export step needs (optimum-intel[openvino] over a
# CPU-only torch), and data/openvino/VERSION (versions, install seconds, size), printed at the end.
# Idempotent: a venv that already holds the pinned versions is kept (its VERSION is reprinted).
# Needs Python 3.10-3.13 with venv, PyPI, ~2.5 GB of disk. Environment:
#   OPENVINO_VENV     where the venv goes (default data/openvino/venv); VERSION is written beside it
#   PYTHON            the interpreter the venv is made from (default python3)
#   TORCH_CPU_INDEX   where a CPU-only torch wheel is found when no local wheel (pip's find-links)
#                     has it (default https://download.pytorch.org/whl/cpu)
#   NICE              niceness of the install (default 10: other work shares the cores)
set -euo pipefail

OPENVINO_GENAI_VERSION=2026.4.1.0
OPENVINO_VERSION=2026.4.1
OPENVINO_TOKENIZERS_VERSION=2026.4.1.0
OPTIMUM_INTEL_VERSION=2.2.0
# What optimum-intel 2.2.0 resolves to here; pinned so an export is made by the same code each time.
OPTIMUM_VERSION=2.3.0
TRANSFORMERS_VERSION=5.5.4
NNCF_VERSION=3.4.0
# A CPU wheel: the PyPI torch for Linux is the CUDA build, which pulls gigabytes of nvidia-* wheels.
TORCH_VERSION=2.13.0+cpu
# optimum-intel requires torchvision, but PyPI's Linux torchvision is built against CUDA torch and
# does not load with a CPU torch (`operator torchvision::nms does not exist`), and then transformers
# fails to import PreTrainedModel. Text-model export never uses it: a CPU torchvision 0.28 (torch
# 2.13's) is installed where a local wheel or the CPU index has one, else torchvision is removed.
TORCHVISION_VERSION=0.28.0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${OPENVINO_VENV:-$ROOT/data/openvino/venv}"
# DEST, PYTHON, TORCH_CPU_INDEX, NICE, PY; pins_hold, keep_built, start_install, install_cpu_torch,
# check_pins, write_version
source "$ROOT/tools/engine-venv-lib.sh"

# name==version pairs the venv must hold.
PINS=("openvino-genai==$OPENVINO_GENAI_VERSION" "openvino==$OPENVINO_VERSION"
      "openvino-tokenizers==$OPENVINO_TOKENIZERS_VERSION" "optimum-intel==$OPTIMUM_INTEL_VERSION"
      "optimum==$OPTIMUM_VERSION" "transformers==$TRANSFORMERS_VERSION" "nncf==$NNCF_VERSION"
      "torch==$TORCH_VERSION")

# The export's own imports: PyPI's torchvision (CUDA build) breaks `from transformers import PreTrainedModel`.
export_imports() {
    "$PY" -c "from transformers import PreTrainedModel; import optimum.exporters.openvino" 2>/dev/null
}

keep_built export_imports
start_install
install_cpu_torch openvino  # sets CONSTRAINTS (torch pinned) for the install below
# A CPU torchvision if one can be had quickly (few retries: the CPU index may be unreachable).
"${PIP[@]}" --no-index --no-deps "torchvision==$TORCHVISION_VERSION+cpu" 2>/dev/null \
    || "${PIP[@]}" --retries 1 --timeout 20 --no-deps --index-url "$TORCH_CPU_INDEX" \
           "torchvision==$TORCHVISION_VERSION+cpu" 2>/dev/null \
    || echo "no CPU torchvision $TORCHVISION_VERSION wheel here: PyPI's will be removed after the install"

"${PIP[@]}" -c "$CONSTRAINTS" \
    "openvino-genai==$OPENVINO_GENAI_VERSION" "openvino==$OPENVINO_VERSION" \
    "openvino-tokenizers==$OPENVINO_TOKENIZERS_VERSION" \
    "optimum-intel[openvino]==$OPTIMUM_INTEL_VERSION" "optimum==$OPTIMUM_VERSION" \
    "transformers==$TRANSFORMERS_VERSION" "nncf==$NNCF_VERSION"
if ! "$PY" -c "import torchvision" 2>/dev/null; then
    "$PY" -m pip uninstall --quiet --yes torchvision
fi
END=$(date +%s)

check_pins
# The engine must load and no CUDA runtime may have come along.
"$PY" -c "import openvino_genai, torch; assert not torch.version.cuda, torch.version.cuda" \
    || { echo "openvino_genai or torch does not import in $VENV" >&2; exit 1; }
# The export's own imports (what failed with PyPI's torchvision).
export_imports || { echo "optimum-intel's exporter does not import in $VENV" >&2; exit 1; }
TORCHVISION="$("$PY" -c "from importlib.metadata import version; print(version('torchvision'))" 2>/dev/null \
    || echo "none (PyPI's CUDA build removed; text export does not use it)")"

write_version \
    "openvino-genai $OPENVINO_GENAI_VERSION, openvino $OPENVINO_VERSION, openvino-tokenizers $OPENVINO_TOKENIZERS_VERSION" \
    "export: optimum-intel $OPTIMUM_INTEL_VERSION, optimum $OPTIMUM_VERSION, transformers $TRANSFORMERS_VERSION, nncf $NNCF_VERSION, torch $TORCH_VERSION, torchvision $TORCHVISION"
