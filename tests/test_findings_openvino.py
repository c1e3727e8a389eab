"""The finding page docs/findings/openvino-genai-speculative-sampling: its standalone reproduction
(repro.py) and its fix (fix.patch, against openvino.genai tag 2026.3.0.0).

* Everyday tier (well under a second in all, no openvino needed): repro.py imports only the
  standard library, openvino, openvino_genai and numpy (ast check); fix.patch is a well-formed
  unified diff (header pairs, hunk line counts, and each hunk's new start agreeing with the old
  start and the hunks before it) that changes sampler.cpp, removes the 101-point acceptance draw and
  the resampling from the next position, and adds the min(1, p/q) test and the residual draw; a
  corrupted copy is refused by the same checks; the page links both files. Where the openvino.genai
  sources are at hand (``$OPENVINO_GENAI_GIT``, a git directory with the tag 2026.3.0.0; by default
  the lab's mirror), every hunk's context and removed lines must match those sources exactly.
* Slow tier (about 15-30 s on 2 shared cores): repro.py run with data/openvino/venv against the
  exported IR under data/engines/openvino/openvino-ir prints BROKEN and exits 1 (stock
  openvino-genai 2026.4.1.0); skipped when the venv or the IR is absent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from finding_checks import HUNK, apply_hunks, imported_roots, parse_patch

ROOT = Path(__file__).resolve().parents[1]
FINDING = ROOT / "docs" / "findings" / "openvino-genai-speculative-sampling"
PAGE = ROOT / "docs" / "findings" / "openvino-genai-speculative-sampling.md"
REPRO = FINDING / "repro.py"
PATCH = FINDING / "fix.patch"
SAMPLER = "src/cpp/src/sampling/sampler.cpp"
BASE_TAG = "2026.3.0.0"
DEFAULT_GIT = Path("/work/.mirror/openvinotoolkit+openvino.genai/repo")
ENGINE_PYTHON = ROOT / "data" / "openvino" / "venv" / "bin" / "python"
IR_ROOT = ROOT / "data" / "engines" / "openvino" / "openvino-ir"



def changed(hunks: list[dict], tag: str) -> list[str]:
    return [text.strip() for hunk in hunks for line_tag, text in hunk["lines"] if line_tag == tag]


def test_repro_imports_only_stdlib_openvino_genai_numpy() -> None:
    """Everyday (<0.1 s): repro.py is standalone: every import is the standard library, openvino,
    openvino_genai or numpy (no ``diagnostics``, no torch)."""
    roots = imported_roots(REPRO)
    engine = {"openvino", "openvino_genai", "numpy"}
    foreign = {name for name in roots if name not in sys.stdlib_module_names and name not in engine}
    assert not foreign, f"repro.py imports {sorted(foreign)}"
    assert engine <= roots


def test_fix_patch_is_well_formed_and_makes_the_fix() -> None:
    """Everyday (<0.1 s): fix.patch parses; it changes sampler.cpp (and the files that carry the
    draft's law to it); sampler.cpp loses the 101-point draw and get_p_prime's resampling from the
    next position, and gains the min(1, p/q) test with a uniform real draw and the residual draw."""
    files = parse_patch(PATCH.read_text(encoding="utf-8"))
    assert SAMPLER in files
    assert set(files) <= {SAMPLER, "src/cpp/src/sampling/sampler.hpp", "src/cpp/src/sequence_group.hpp",
                          "src/cpp/src/speculative_decoding/continuous_batching/update_request_structs.hpp",
                          "src/cpp/src/speculative_decoding/continuous_batching/pipeline_impl.cpp"}
    removed, added = changed(files[SAMPLER], "-"), changed(files[SAMPLER], "+")
    assert any("uniform_int_distribution<>(0, 100)" in line for line in removed)
    assert any(line.startswith("float get_p_prime(") for line in removed)
    assert not any("get_p_prime" in line for line in added)
    assert any("uniform_real_distribution" in line for line in added)
    assert any("uniform(rng_engine) * q_x < p_x" in line for line in added)  # u < p(x)/q(x)
    assert any("std::max(0.0" in line and "target_law[i].second" in line for line in added)  # max(0, p - q)


def test_a_corrupted_patch_is_refused() -> None:
    """Everyday (<0.1 s), negative control of the parser: a hunk that lost a body line, a renaming
    header, and a hunk whose new start was altered are all refused."""
    text = PATCH.read_text(encoding="utf-8")
    lines = text.splitlines()
    dropped = next(i for i, line in enumerate(lines) if "uniform_int_distribution<>(0, 100)" in line)
    with pytest.raises(ValueError, match="hunk counts|no diff tag"):
        parse_patch("\n".join(lines[:dropped] + lines[dropped + 1:]) + "\n")
    with pytest.raises(ValueError, match="renames"):
        parse_patch(text.replace(f"+++ b/{SAMPLER}", "+++ b/src/cpp/src/sampling/other.cpp", 1))
    second = [i for i, line in enumerate(lines) if HUNK.match(line)][1]
    match = HUNK.match(lines[second])
    moved = lines[second].replace(f"+{match.group(3)},", f"+{int(match.group(3)) + 5},", 1)
    with pytest.raises(ValueError, match="starts at new line"):
        parse_patch("\n".join(lines[:second] + [moved] + lines[second + 1:]) + "\n")


def test_page_links_the_reproduction_and_the_patch() -> None:
    """Everyday (<0.1 s): the page names both files by their path under docs/findings."""
    page = PAGE.read_text(encoding="utf-8")
    assert "openvino-genai-speculative-sampling/repro.py" in page
    assert "openvino-genai-speculative-sampling/fix.patch" in page
    assert BASE_TAG in page


def base_sources() -> str | None:
    """The git directory holding openvino.genai's tag 2026.3.0.0, where there is one."""
    git_dir = Path(os.environ.get("OPENVINO_GENAI_GIT", DEFAULT_GIT))
    if not git_dir.is_dir():
        return None
    found = subprocess.run(["git", "-C", str(git_dir), "rev-parse", "-q", "--verify", f"refs/tags/{BASE_TAG}"],
                           capture_output=True, text=True)
    return str(git_dir) if found.returncode == 0 else None


def test_fix_patch_matches_the_2026_3_0_0_sources() -> None:
    """Everyday (about 0.1 s, five ``git show``): every hunk's context and removed lines are the
    2026.3.0.0 sources' lines at the stated place, and after the patch sampler.cpp no longer
    resamples from the next position. Skipped without the sources ($OPENVINO_GENAI_GIT)."""
    git_dir = base_sources()
    if git_dir is None:
        pytest.skip(f"no openvino.genai git directory with tag {BASE_TAG}: set OPENVINO_GENAI_GIT "
                    "(a clone of github.com/openvinotoolkit/openvino.genai)")
    for path, hunks in parse_patch(PATCH.read_text(encoding="utf-8")).items():
        source = subprocess.run(["git", "-C", git_dir, "show", f"{BASE_TAG}:{path}"], capture_output=True,
                                text=True, check=True).stdout
        patched = apply_hunks(source, hunks)
        if path == SAMPLER:
            assert "get_p_prime" in source and "get_p_prime" not in patched
            assert "uniform_int_distribution<>(0, 100)" not in patched


def ir_folders() -> tuple[Path, Path] | None:
    """The exported target (SmolLM2-135M-Instruct) and draft (early-exit-26) IR folders, if any."""
    targets = sorted(IR_ROOT.glob("smollm2-135m-instruct-*/openvino_model.xml"))
    drafts = sorted(IR_ROOT.glob("early-exit-26-*/openvino_model.xml"))
    return (targets[0].parent, drafts[0].parent) if targets and drafts else None


@pytest.mark.slow
def test_repro_says_broken_against_the_stock_engine() -> None:
    """Slow (about 15-30 s on 2 shared cores): repro.py with data/openvino/venv (stock
    openvino-genai 2026.4.1.0) prints BROKEN and exits 1; the control emits nothing outside the top 20."""
    folders = ir_folders()
    if not ENGINE_PYTHON.is_file() or folders is None:
        pytest.skip("no OpenVINO venv (tools/build-openvino.sh) or no exported IR under data/engines/openvino")
    done = subprocess.run([str(ENGINE_PYTHON), str(REPRO), str(folders[0]), str(folders[1])],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("BROKEN")
    assert re.search(r"^control: 0 of \d+ ", done.stdout, re.M)
