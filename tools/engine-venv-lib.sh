# shellcheck shell=bash
# What the build scripts of the engines' own virtual environments share (tools/build-openvino.sh,
# tools/build-onnxruntime-genai.sh): sourced by each (from its own folder) once it has set VENV,
# never run. Sourcing sets the settings below from VENV and the environment; the script then sets
# PINS (name==version pairs the venv must hold) and TORCH_VERSION before it calls the functions.
# tools/build-vllm.sh shares none of it: it rebuilds from scratch, keeps no pins and writes its own
# VERSION lines (vLLM pins its own torch, and its preloads are checked on every run).

DEST="$(dirname "$VENV")"  # VERSION is written beside the venv
PYTHON="${PYTHON:-python3}"  # the interpreter the venv is made from
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
NICE="${NICE:-10}"  # niceness of the install: other work shares the cores
PY="$VENV/bin/python"

# name==version pairs the venv must hold (PINS), checked without importing the (slow) packages.
pins_hold() {
    [[ -x "$PY" ]] || return 1
    "$PY" - "${PINS[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    try:
        if version(name) != wanted:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
}

# keep_built CHECK...: a venv that holds the pins, passes the script's own import check (the
# command CHECK...) and has its VERSION is kept: VERSION is printed and the script exits 0.
keep_built() {
    if pins_hold && "$@" && [[ -f "$DEST/VERSION" ]]; then
        echo "kept $VENV: it holds the pinned versions"
        cat "$DEST/VERSION"
        exit 0
    fi
}

# start_install: the venv made where it is missing, the install's clock started (START) and
# PIP, the niced pip install command.
start_install() {
    mkdir -p "$DEST"
    START=$(date +%s)
    [[ -x "$PY" ]] || "$PYTHON" -m venv "$VENV"
    PIP=(nice -n "$NICE" "$PY" -m pip install --quiet)
}

# install_cpu_torch NAME: torch first, from a local wheel if pip's find-links has one (its
# dependencies come with the rest of the install), else from the CPU index; then CONSTRAINTS (a
# temporary file named after NAME, removed at exit) keeps the resolver from swapping it for
# PyPI's CUDA build.
install_cpu_torch() {
    if ! "${PIP[@]}" --no-index --no-deps "torch==$TORCH_VERSION" 2>/dev/null; then
        echo "no local torch $TORCH_VERSION wheel: installing it from $TORCH_CPU_INDEX"
        "${PIP[@]}" --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION"
    fi
    CONSTRAINTS="$(mktemp "${TMPDIR:-/tmp}/$1-constraints.XXXXXX")"
    trap 'rm -f "$CONSTRAINTS"' EXIT
    echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
}

# check_pins: after the install, the pins must hold (else the script stops with status 1).
check_pins() {
    pins_hold || { echo "the venv at $VENV does not hold the pinned versions after installing: see pip's output above" >&2; exit 1; }
}

# write_version LINE...: $DEST/VERSION, the script's own LINEs (what it installed) then the venv's
# python, when and how long the install took (START to END) where, and the venv's size; printed.
write_version() {
    local size
    size="$(du -sh "$VENV" | cut -f1)"
    {
        printf '%s\n' "$@"
        echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0])') ($VENV)"
        echo "installed: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((END - START)) s on $(uname -m), $(nproc) cores, nice $NICE"
        echo "size: $size"
    } > "$DEST/VERSION"
    cat "$DEST/VERSION"
}
