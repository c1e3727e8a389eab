"""What git ignores: the bulky outputs users are told to write inside the checkout, never the package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_make_head_output_is_ignored_but_the_heads_package_is_not() -> None:
    """``make-head -o heads/…`` (the README's commands) writes 134–458 MB: ``heads/`` is ignored;
    the pattern is anchored, so ``diagnostics/heads/`` (the code) stays tracked (the control)."""
    assert _ignored("heads/medusa/medusa_lm_head.safetensors") and _ignored("heads/eagle3/model.safetensors")
    assert not _ignored("diagnostics/heads/layout.py")
    assert _ignored("data/models/x.safetensors")
