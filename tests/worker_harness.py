"""The engine workers' tests' shared harness (tests/test_vllm_worker.py, test_openvino_worker.py,
test_onnxruntime_genai_worker.py): the REAL worker script of ``diagnostics/verdicts/workers`` run
as a subprocess of this interpreter, with the fake engines of ``tests/fakes`` first on its
``PYTHONPATH``, and the lines exchanged with it; and a fake engine loaded here, so that a test
computes what the worker should answer.

Pytest does not rewrite the asserts of this module (it is no test file): each assert says what it
got in its message."""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ROOT / "diagnostics" / "verdicts" / "workers"
FAKES = Path(__file__).resolve().parent / "fakes"


def load_fake(package: str, name: str) -> ModuleType:
    """The fake engine ``tests/fakes/<package>`` loaded in this process as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, FAKES / package / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def worker_env(**variables: str | None) -> dict[str, str]:
    """This process's environment with the fakes on ``PYTHONPATH`` and ``variables`` (``None``:
    the variable removed)."""
    environment = {**os.environ, "PYTHONPATH": str(FAKES), **variables}
    return {name: value for name, value in environment.items() if value is not None}


def line(message: dict | str) -> bytes:
    """One protocol line: a dict as JSON, a string as it is (a test's malformed line)."""
    return (message if isinstance(message, str) else json.dumps(message)).encode() + b"\n"


class Worker:
    """The worker ``script`` as a subprocess (environment: ``worker_env(**variables)``); ``send``
    writes one message, ``answer`` reads one line (within 30 s) and fails the test unless it is a
    JSON object."""

    def __init__(self, script: str, **variables: str | None) -> None:
        self.process = subprocess.Popen([sys.executable, str(WORKERS / script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=worker_env(**variables))

    def send(self, message: dict | str) -> None:
        self.process.stdin.write(line(message))
        self.process.stdin.flush()

    def answer(self) -> dict:
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            assert selector.select(30), "the worker gave no answer in 30 s"
        answer_line = self.process.stdout.readline()
        assert answer_line, f"the worker closed its stdout; stderr: {self.process.stderr.read().decode()[-2000:]}"
        answer = json.loads(answer_line)  # a print that leaked into stdout fails here
        assert isinstance(answer, dict), answer
        return answer

    def close(self) -> tuple[int, bytes, str]:
        """Close stdin; the exit status, what is left on stdout, and stderr."""
        self.process.stdin.close()
        status = self.process.wait(timeout=30)
        return status, self.process.stdout.read(), self.process.stderr.read().decode()


def run_through(script: str, messages: list, *, cwd: Path, timeout: float = 60, **variables: str | None) -> subprocess.CompletedProcess:
    """The worker ``script`` fed ``messages`` (one line each, as ``line``) then the end of its input,
    run to its exit; stdout and stderr captured."""
    return subprocess.run([sys.executable, str(WORKERS / script)], input=b"".join(line(message) for message in messages),
                          capture_output=True, env=worker_env(**variables), timeout=timeout, cwd=cwd)


def check_counted_requests(worker: Worker, fake: ModuleType, request: Callable[..., dict]) -> None:
    """Two requests to a started speculative ``worker`` over a ``fake`` whose generation is
    ``fake.fake_tokens(prompt, seed, count)`` and whose counters say 3 drafted and 1 accepted a
    generated token: the outputs come in the seeds' order, one stops at the request's EOS (kept as
    its last id), and the counters are each request's alone, not the totals since the start.
    ``request(prompt, seeds, max_tokens, eos_ids)`` is the test's request (its own sampling)."""
    prompt, seeds = [1, 2, 3], [5, 1, 9]
    eos = fake.fake_tokens(prompt, 1, 6)[2]  # seed 1 generates it third: its output stops there, EOS kept
    assert all(eos not in fake.fake_tokens(prompt, seed, 6) for seed in (5, 9))
    worker.send(request(prompt, seeds, 6, [eos]))
    first = worker.answer()
    assert first["outputs"] == [fake.fake_tokens(prompt, 5, 6), fake.fake_tokens(prompt, 1, 3), fake.fake_tokens(prompt, 9, 6)], first
    assert first["outputs"][1][-1] == eos, first
    assert (first["drafted"], first["accepted"]) == (3 * 15, 15), first

    worker.send(request([4], [2, 3], 4, []))  # the counters of this request alone, not since the start
    second = worker.answer()
    assert second["outputs"] == [fake.fake_tokens([4], 2, 4), fake.fake_tokens([4], 3, 4)], second
    assert (second["drafted"], second["accepted"]) == (3 * 8, 8), second
