"""The finding page docs/findings/transformers-universal-assisted-decoding: its standalone reproduction
(repro.py, with the two bundled tokenizers) and its fix (fix.patch), against the transformers installed here.

* Everyday tier (each under a second): repro.py imports only the standard library, torch and
  transformers; the bundled tokenizer files stay small; fix.patch applies exactly to the installed
  ``transformers/generation/candidate_generator.py`` (``patch -p3``, as the page says) and makes the one
  change the page describes, and it is refused by a copy whose line it changes is not there (negative control).
* Slow tier (each about 20-30 s of CPU, 1-4 min wall on 2 busy cores): repro.py against the installed
  transformers must print BROKEN and exit 1 (5.23.0 misfiles the pruned head's rows); against a copy of
  the same package with fix.patch applied (a folder of symlinks to the installed package, with only
  ``generation/candidate_generator.py`` copied and patched, put first on PYTHONPATH) it must print OK and
  exit 0. A wrong patch fails the second test: repro.py then still prints BROKEN.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from finding_checks import imported_roots

ROOT = Path(__file__).resolve().parents[1]
FINDING = ROOT / "docs" / "findings" / "transformers-universal-assisted-decoding"
REPRO = FINDING / "repro.py"
PATCH = FINDING / "fix.patch"
TOKENIZERS = [FINDING / "llama3-tokenizer.json.xz", FINDING / "qwen2-tokenizer.json.xz"]
CANDIDATE_GENERATOR = Path("generation") / "candidate_generator.py"
REPRO_TIMEOUT_S = 900  # a busy 2-core machine: about 4 minutes seen; the test's own bound


def installed_transformers() -> Path:
    """The installed transformers package folder, found without importing it (an import costs seconds)."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin, "transformers is not installed"
    return Path(spec.origin).resolve().parent


def patched_copy(destination: Path) -> Path:
    """``destination/transformers``: a package that is the installed transformers, entry by entry a symlink,
    except ``generation/`` (a folder of symlinks) whose ``candidate_generator.py`` is a copy with fix.patch
    applied. Returns the folder to put on PYTHONPATH; raises ``AssertionError`` when the patch does not apply."""
    source = installed_transformers()
    package = destination / "transformers"
    package.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name not in ("generation", "__pycache__"):
            (package / entry.name).symlink_to(entry)
    generation = package / "generation"
    generation.mkdir()
    for entry in (source / "generation").iterdir():
        if entry.name not in ("candidate_generator.py", "__pycache__"):
            (generation / entry.name).symlink_to(entry)
    shutil.copyfile(source / CANDIDATE_GENERATOR, generation / "candidate_generator.py")
    applied = subprocess.run(["patch", "-p3", "--forward", "--batch", "-i", str(PATCH)], cwd=package,
                             capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, f"fix.patch does not apply to the installed transformers: {applied.stdout}{applied.stderr}"
    return destination


def run_repro(pythonpath: Path | None) -> subprocess.CompletedProcess:
    """repro.py with this venv's python, transformers from ``pythonpath`` first when given (no bytecode written
    into the installed package through the symlinks)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, str(REPRO)], capture_output=True, text=True, env=env,
                          timeout=REPRO_TIMEOUT_S)


def test_repro_imports_only_stdlib_torch_transformers() -> None:
    """Everyday (< 0.1 s): the reproduction is standalone, not a part of this lab."""
    roots = imported_roots(REPRO)
    outside = roots - set(sys.stdlib_module_names) - {"torch", "transformers", "__future__"}
    assert not outside, f"repro.py imports {sorted(outside)}"


def test_bundled_tokenizers_are_small() -> None:
    """Everyday (< 0.1 s): the two vocabularies repro.py needs are committed and under 5 MB together."""
    assert all(path.is_file() for path in TOKENIZERS)
    assert sum(path.stat().st_size for path in TOKENIZERS) < 5_000_000


def test_patch_applies_to_installed_source_and_sorts_the_pruned_rows(tmp_path: Path) -> None:
    """Everyday (about 0.1 s): fix.patch applies exactly (no fuzz, no offset) to the installed
    candidate_generator.py and its one change is the ``sorted(...)`` of the pruned head's assistant ids."""
    work = tmp_path / "transformers"
    (work / "generation").mkdir(parents=True)
    original = (installed_transformers() / CANDIDATE_GENERATOR).read_text()
    (work / CANDIDATE_GENERATOR).write_text(original)
    applied = subprocess.run(["patch", "-p3", "--forward", "--batch", "-i", str(PATCH)], cwd=work,
                             capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "offset" not in applied.stdout and "fuzz" not in applied.stdout, applied.stdout
    patched = (work / CANDIDATE_GENERATOR).read_text()
    ast.parse(patched)
    assert "list(self.target_to_assistant_input_ids.values())" in original
    assert "list(self.target_to_assistant_input_ids.values())" not in patched
    assert "sorted(self.target_to_assistant_input_ids.values())" in patched
    removed = [line for line in PATCH.read_text().splitlines() if re.match(r"^-(?!--)", line)]
    assert len(removed) == 1, removed


def test_patch_is_refused_where_its_line_is_absent(tmp_path: Path) -> None:
    """Everyday (about 0.1 s), negative control: a copy without the line the patch changes is refused
    (so the test above can fail)."""
    work = tmp_path / "transformers"
    (work / "generation").mkdir(parents=True)
    original = (installed_transformers() / CANDIDATE_GENERATOR).read_text()
    (work / CANDIDATE_GENERATOR).write_text(original.replace("list(self.target_to_assistant_input_ids.values())",
                                                             "tuple(self.target_to_assistant_input_ids.values())"))
    applied = subprocess.run(["patch", "-p3", "--forward", "--batch", "-i", str(PATCH)], cwd=work,
                             capture_output=True, text=True, timeout=60)
    assert applied.returncode != 0


@pytest.mark.slow
def test_repro_prints_broken_against_installed_transformers() -> None:
    """Slow (about 20 s of CPU; 1-3 min wall on 2 busy cores): the installed transformers (5.23.0) misfiles
    the pruned assistant head's rows, so repro.py exits 1 with BROKEN."""
    result = run_repro(None)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("BROKEN"), result.stdout
    assert str(installed_transformers()) in lines[0], lines[0]
    misfiled = int(re.search(r"filed under another token's id by get_target_logits: (\d+)", result.stdout).group(1))
    assert misfiled > 1000, result.stdout


@pytest.mark.slow
def test_repro_prints_ok_against_patched_copy(tmp_path: Path) -> None:
    """Slow (about 25 s of CPU; 1-4 min wall on 2 busy cores): the same transformers with fix.patch
    keeps the target's law: repro.py exits 0 with OK, 0 misfiled rows and 0 wrong q."""
    folder = patched_copy(tmp_path / "patched")
    result = run_repro(folder)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("OK"), result.stdout
    assert str(folder / "transformers") in lines[0], lines[0]  # the patched copy, not the installed package
    assert "get_target_logits: 0" in result.stdout and "they were drawn with: 0" in result.stdout
