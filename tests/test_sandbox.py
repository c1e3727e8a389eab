"""The HumanEval checker's sandbox: every escape attempt of ``sandbox_attacks`` fails or is
contained, each attack gets out of a plain child process (the negative control), HumanEval's
canonical solutions still pass, and where bubblewrap is missing or refused nothing runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sandbox_attacks import ATTACKS, SECRET_VARIABLE, TIME_LIMIT_S

import diagnostics.evaluation.sandbox as sandbox
from diagnostics.evaluation.prompts import humaneval_problems, score
from diagnostics.evaluation.sandbox import SandboxUnavailable

ATTACK_SCRIPT = Path(__file__).resolve().parent / "sandbox_attacks.py"


def require_sandbox() -> None:
    """Skip where bubblewrap cannot run (fail under ``REQUIRE_SANDBOX=1``, as CI sets)."""
    problem = sandbox.sandbox_problem()
    if problem is None:
        return
    if os.environ.get("REQUIRE_SANDBOX") == "1":
        pytest.fail(problem)
    pytest.skip(problem)


def _run_attacks(mode: str, folder: Path) -> dict[str, dict]:
    output = folder / f"{mode}.json"
    env = {**os.environ, SECRET_VARIABLE: f"speclab-secret-{os.getpid()}"}
    subprocess.run([sys.executable, str(ATTACK_SCRIPT), mode, str(output)], env=env, check=True, timeout=300)
    return json.loads(output.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def attacks(tmp_path_factory) -> dict[str, dict]:
    require_sandbox()
    return _run_attacks("sandbox", tmp_path_factory.mktemp("attacks"))


@pytest.fixture(scope="module")
def control(tmp_path_factory) -> dict[str, dict]:
    return _run_attacks("naive", tmp_path_factory.mktemp("control"))


# Attacks whose program passes the check on purpose (what they try is judged from outside).
PASS_ON_PURPOSE = {"double_fork_daemon", "subprocess_and_fork"}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_every_escape_attempt_fails_or_is_contained(name: str, attacks: dict[str, dict]) -> None:
    """Nothing reaches this machine: no marker file outside, no process left when the check returns
    (pass or fail), no connection to its loopback, no signal to the caller, its memory bounded."""
    result = attacks[name]
    assert not result["marker"] and result["survivors"] == 0, result
    assert result["connections"] == 0 and result["signals"] == 0, result
    assert result["peak_mb"] < 16, result  # 1 GB of error output is drained, not kept
    assert result["seconds"] < TIME_LIMIT_S + 3, result  # the wall-clock limit holds, whatever the program ignores
    if name == "stderr_1gb":
        assert result["reason"] == "wrote it all", result  # the tail was kept: the last line says why
    elif name not in PASS_ON_PURPOSE:
        assert not result["passed"], result


@pytest.mark.parametrize("name", [name for name, (_, in_naive) in ATTACKS.items() if in_naive])
def test_each_attack_gets_out_of_a_plain_child_process(name: str, control: dict[str, dict]) -> None:
    """The negative control: without the sandbox, each attack does what it tries, so its failure
    under the sandbox is the sandbox's doing."""
    result = control[name]
    if name == "read_shadow" and os.geteuid() != 0:
        pytest.skip("only root reads /etc/shadow, even without a sandbox")
    evidence = {"stderr_1gb": result["peak_mb"] > 200, "write_outside": result["marker"],
                "double_fork_daemon": result["survivors"] > 0, "signal_the_parent": result["signals"] > 0,
                "socket_connect": result["connections"] > 0, "_socket_connect": result["connections"] > 0,
                "ctypes_connect": result["connections"] > 0}
    assert evidence.get(name, result["passed"]), result


def test_canonical_humaneval_solutions_pass_in_the_sandbox() -> None:
    """All 164 canonical solutions pass as a fenced reply (the sweep's path); a sample also as a
    bare body continuing the prompt; wrong ones fail; the code never runs in this process."""
    require_sandbox()
    problems = humaneval_problems()
    assert len(problems) == 164

    def check(task_id: str) -> tuple[str, float]:
        problem = problems[task_id]
        return task_id, score({"type": "humaneval", "task_id": task_id},
                              "Sure:\n```python\n" + problem["prompt"] + problem["canonical_solution"] + "```\n")

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [task_id for task_id, value in pool.map(check, problems) if value != 1.0]
    assert not failed, failed
    for task_id in list(problems)[::20]:
        problem = problems[task_id]
        checker = {"type": "humaneval", "task_id": task_id}
        assert score(checker, problem["canonical_solution"]) == 1.0, task_id
        wrong = f"```python\ndef {problem['entry_point']}(*args, **kwargs):\n    return None\n```"
        assert score(checker, wrong) == 0.0, task_id
    outcome = sandbox.run_program("import os\nraise SystemExit(f'pid {os.getpid()} uid {os.getuid()}')")
    assert not outcome.passed and outcome.reason.startswith("pid ") and outcome.reason.endswith("uid 65534")
    assert outcome.reason != f"pid {os.getpid()} uid 65534"


@pytest.fixture
def fresh_probe():
    sandbox.sandbox_problem.cache_clear()
    yield
    sandbox.sandbox_problem.cache_clear()


def test_without_bubblewrap_nothing_runs(fresh_probe, monkeypatch, tmp_path: Path) -> None:
    """Missing, or refused (no user namespaces): one line saying how to enable it; never an
    unisolated run, and a HumanEval score raises rather than reading as a failed answer."""
    marker = tmp_path / "ran"
    program = f"open({str(marker)!r}, 'w').write('ran')"
    monkeypatch.setattr(sandbox, "BWRAP", "bwrap-not-installed")
    with pytest.raises(SandboxUnavailable) as error:
        sandbox.run_program(program)
    assert "'bwrap-not-installed' is not on PATH" in str(error.value) and "apt-get install bubblewrap" in str(error.value)
    assert "\n" not in str(error.value)
    with pytest.raises(SandboxUnavailable):
        score({"type": "humaneval", "task_id": "HumanEval/0"}, "```python\n" + program + "\n```")

    sandbox.sandbox_problem.cache_clear()
    folder = Path(tempfile.mkdtemp(prefix="speclab-fake-bwrap-"))  # a folder uid 65534 may enter, as bwrap's would be
    folder.chmod(0o755)
    refusing = folder / "bwrap-refusing"
    refusing.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n", encoding="utf-8")
    refusing.chmod(0o755)
    monkeypatch.setenv("PATH", f"{refusing.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(sandbox, "BWRAP", refusing.name)
    with pytest.raises(SandboxUnavailable) as error:
        sandbox.run_program(program)
    assert "refused to start a sandbox here (bwrap: No permissions to creating new namespace)" in str(error.value)
    assert "user namespaces" in str(error.value) and "\n" not in str(error.value)
    assert not marker.exists()
