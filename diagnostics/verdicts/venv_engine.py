"""Engines that live in their own virtual environment (vLLM's CPU build, OpenVINO GenAI): the
verdict table drives each through a worker script run by that environment's interpreter, over the
JSON-lines protocol of ``verdicts.workers`` (the worker imports only its engine, never this lab).

* ``ENGINES``: where each engine's environment is (``data/<name>/venv``, or ``$VLLM_VENV`` …), its
  worker script and the script of ours that builds the environment on demand.
* ``WorkerProcess``: one worker, started lazily, every answer read with a time bound and a size
  bound, every answer checked (one list of ids per seed, each id an int, none longer than
  ``max_tokens``); what the engine raises, a worker that dies or an answer that breaks the
  protocol is a ``RuntimeError`` with one line, which the table records as ``engine error``.
* ``venv_generator``: the audit's generator protocol (``run``, ``run.batch``, ``run.counters``)
  on top of a worker; the speculative side sums the engine's own drafted and accepted counts.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from diagnostics.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
START_TIMEOUT_S = 900.0  # an engine's first start compiles, exports or warms up: minutes on 2 cores
REQUEST_TIMEOUT_S = 3600.0  # one request's seeds (``VenvEngine.batch_size``): 64 at once, or 8 one after another
MAX_ANSWER_BYTES = 64 << 20  # 64 seeds × a few thousand ids each is far below this
DRAFTS = ROOT / "data" / "engines" / "drafts"
HEADS = ROOT / "data" / "engines" / "heads"


@dataclass(frozen=True)
class VenvEngine:
    """An engine with its own environment: ``name``, the variable that may point at another
    environment (a version matrix keeps several), its worker script and its build script."""

    name: str
    env_var: str
    worker: str
    build: str
    batch_size: int = 64  # seeds per request: an engine that speculates one sequence at a time gets fewer

    def venv(self) -> Path:
        configured = os.environ.get(self.env_var)
        return Path(configured).expanduser() if configured else ROOT / "data" / self.name / "venv"

    def python(self) -> Path:
        """The environment's interpreter; ``RuntimeError`` (one line, what to run) when it is not built."""
        path = self.venv() / "bin" / "python"
        if not path.is_file():
            raise RuntimeError(f"{self.name} is not installed ({path} is missing): run {self.build} "
                               f"(it builds its own environment; or point {self.env_var} at one)")
        return path

    def worker_path(self) -> Path:
        return Path(self.worker) if Path(self.worker).is_absolute() else WORKERS / self.worker


ENGINES = {
    "vllm": VenvEngine("vllm", "VLLM_VENV", "vllm_worker.py", "tools/build-vllm.sh"),
    "openvino": VenvEngine("openvino", "OPENVINO_VENV", "openvino_worker.py", "tools/build-openvino.sh"),
    "onnxruntime-genai": VenvEngine("onnxruntime-genai", "ORTGENAI_VENV", "onnxruntime_genai_worker.py",
                                    "tools/build-onnxruntime-genai.sh", batch_size=8),
}


def engine_cache(engine: VenvEngine) -> Path:
    """Where an engine's worker may write (its model exports): ``data/engines/<name>``."""
    return ROOT / "data" / "engines" / engine.name


def installed_version(engine: VenvEngine) -> str:
    """The first line of the environment's ``VERSION`` file (its build script writes it), else its name."""
    recorded = engine.venv().parent / "VERSION"
    if recorded.is_file():
        first = recorded.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        if first:
            return " ".join(first[0].split())[:120]
    return engine.name


class WorkerProcess:
    """One engine worker: ``start(setup)`` sends the set-up and waits for ``ready``; ``request``
    sends one request and returns its answer. The worker's stderr (the engine's own log) goes to
    ``log``; an error says where to read it."""

    def __init__(self, command: list[str], log: Path, *, env: dict[str, str] | None = None,
                 start_timeout_s: float | None = None, request_timeout_s: float | None = None) -> None:
        self.command, self.log, self.env = command, log, env
        self.start_timeout_s = START_TIMEOUT_S if start_timeout_s is None else start_timeout_s
        self.request_timeout_s = REQUEST_TIMEOUT_S if request_timeout_s is None else request_timeout_s
        self.process: subprocess.Popen | None = None
        self.ready: dict[str, Any] | None = None
        self._log_handle: IO[bytes] | None = None
        self._pending = b""

    def start(self, setup: dict[str, Any]) -> dict[str, Any]:
        """Start the worker with ``setup``; its ready answer (``engine``, ``settings``)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_handle = self.log.open("ab")
        self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_handle,
                                        env=self.env, cwd=ROOT, start_new_session=True)
        answer = self._exchange(setup, self.start_timeout_s, "starting")
        if answer.get("ready") is not True:
            raise RuntimeError(f"the worker answered its set-up without ready: {_short(answer)}")
        settings = answer.get("settings")
        self.ready = {"engine": str(answer.get("engine") or "")[:200], "settings": settings if isinstance(settings, dict) else {}}
        return self.ready

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        return self._exchange(message, self.request_timeout_s, "generating")

    def _exchange(self, message: dict[str, Any], timeout_s: float, doing: str) -> dict[str, Any]:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RuntimeError(self._died(doing)) from None
        line = self._read_line(timeout_s, doing)
        try:
            answer = json.loads(line)
        except ValueError:
            raise RuntimeError(f"the worker's answer while {doing} is not JSON: {_short(line.decode(errors='replace'))} "
                               f"(its log: {self.log})") from None
        if not isinstance(answer, dict):
            raise RuntimeError(f"the worker's answer while {doing} is not a JSON object: {_short(answer)}")
        if "error" in answer:
            raise RuntimeError(" ".join(str(answer["error"]).split())[:500])
        return answer

    def _read_line(self, timeout_s: float, doing: str) -> bytes:
        """One line of the worker's stdout, within ``timeout_s`` and ``MAX_ANSWER_BYTES``."""
        assert self.process is not None and self.process.stdout is not None
        stream = self.process.stdout
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(stream, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close(kill=True)  # a hung engine does not read its stdin's end either
                    raise RuntimeError(f"the worker gave no answer in {timeout_s:.0f} s while {doing} (its log: {self.log})")
                if not selector.select(min(left, 1.0)):
                    continue
                chunk = os.read(stream.fileno(), 1 << 20)
                if not chunk:
                    raise RuntimeError(self._died(doing))
                self._pending += chunk
                if len(self._pending) > MAX_ANSWER_BYTES:
                    self.close(kill=True)
                    raise RuntimeError(f"the worker's answer while {doing} exceeds {MAX_ANSWER_BYTES >> 20} MiB")
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _died(self, doing: str) -> str:
        assert self.process is not None
        try:
            status = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            status = None
        return f"the worker exited (status {status}) while {doing}: {_last_line(self.log)} (its log: {self.log})"

    def close(self, kill: bool = False) -> None:
        """Close its stdin (the worker exits), and end it if it does not within 30 s (at once: ``kill``)."""
        if self.process is not None:
            if kill and self.process.poll() is None:
                self.process.kill()
            if self.process.stdin is not None and not self.process.stdin.closed:
                try:
                    self.process.stdin.close()
                except OSError:
                    pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None


def bounded_settings(settings: dict[str, Any], limit: int = 4096) -> dict[str, Any]:
    """An engine's own statement of its settings, kept in order while it fits ``limit`` bytes of
    JSON (the table bounds a row's settings); values are shown as JSON scalars or cut texts."""
    kept: dict[str, Any] = {}
    for name, value in settings.items():
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            value = json.dumps(value, default=str)
        if isinstance(value, str):
            value = value[:300]
        trial = {**kept, str(name)[:80]: value}
        if len(json.dumps(trial, ensure_ascii=False).encode()) > limit:
            kept["settings_left_out"] = len(settings) - len(kept)
            break
        kept = trial
    return kept


def _short(value: Any) -> str:
    return " ".join(str(value).split())[:300]


def _last_line(log: Path) -> str:
    """The last non-empty line of a log (the engine's own last words), cut to one line."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 8192))
            lines = [line for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return _short(lines[-1]) if lines else "its log is empty"


def check_outputs(answer: dict[str, Any], seeds: list[int], max_tokens: int) -> list[list[int]]:
    """The answer's outputs, checked: one list per seed of ints in ``[0, 2^31)``, none longer than
    ``max_tokens`` (an engine that returns more than it was asked for is an engine error)."""
    outputs = answer.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(seeds):
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise RuntimeError(f"the engine answered {got} outputs for {len(seeds)} seeds")
    checked = []
    for seed, ids in zip(seeds, outputs):
        if not isinstance(ids, list) or not all(isinstance(token, int) and not isinstance(token, bool) for token in ids):
            raise RuntimeError(f"the engine's output for seed {seed} is not a list of integer ids")
        if len(ids) > max_tokens:
            raise RuntimeError(f"the engine returned {len(ids)} tokens for seed {seed} where max_tokens is {max_tokens}")
        bad = next((token for token in ids if not 0 <= token < 2**31), None)
        if bad is not None:
            raise RuntimeError(f"the engine returned id {bad} for seed {seed}, outside any vocabulary")
        checked.append(ids)
    return checked


def _count(answer: dict[str, Any], name: str) -> int | None:
    value = answer.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RuntimeError(f"the engine's {name} count is not a count: {_short(value)}")
    return value


def venv_generator(worker: WorkerProcess, setup: dict[str, Any], policy: Policy, max_tokens: int, eos: set[int],
                   speculative: bool, source: str, batch_size: int = 64) -> Callable[[list[int], int], list[int]]:
    """The audit's generator on an engine worker: ``run.batch(prompt_ids, seeds)`` is one request
    (the engine batches the seeds); the worker starts at the first request, so an engine that
    fails to start is that side's outcome. With speculation on, ``run.counters`` sums the
    engine's own drafted and accepted counts (counted only when the engine reports them)."""
    started: dict[str, Any] = {}
    counters = {"drafted": 0, "accepted": 0, "generations": 0, "source": source}

    def ensure_started() -> None:
        if "error" in started:  # a failed start is not retried for every seed
            raise RuntimeError(started["error"])
        if "ready" not in started:
            try:
                started["ready"] = worker.start(setup)
            except RuntimeError as error:
                started["error"] = str(error)
                worker.close()
                raise

    def batch(prompt_ids: list[int], seeds: list[int]) -> list[list[int]]:
        ensure_started()
        answer = worker.request({"prompt_ids": [int(token) for token in prompt_ids], "seeds": [int(seed) for seed in seeds],
                                 "max_tokens": max_tokens, "temperature": policy.temperature, "top_k": policy.top_k,
                                 "top_p": policy.top_p, "min_p": policy.min_p, "eos_ids": sorted(eos)})
        outputs = check_outputs(answer, seeds, max_tokens)
        drafted, accepted = _count(answer, "drafted"), _count(answer, "accepted")
        if speculative and drafted is not None and accepted is not None:
            if accepted > drafted:
                raise RuntimeError(f"the engine says it accepted {accepted} of {drafted} drafted tokens")
            counters["drafted"] += drafted
            counters["accepted"] += accepted
            counters["generations"] += len(seeds)
        return outputs

    def run(prompt_ids: list[int], seed: int) -> list[int]:
        return batch(prompt_ids, [seed])[0]

    run.batch = batch  # type: ignore[attr-defined]
    run.batch_size = batch_size  # type: ignore[attr-defined]  # seeds per request (``table.fill``)
    run.ready = started  # type: ignore[attr-defined]  # the worker's ready answer, once started
    if speculative:
        run.counters = counters  # type: ignore[attr-defined]
    return run


def draft_folder(layer: int) -> Path:
    """The embedded target's early exit at ``layer`` (first layers, final norm and head) as a
    Hugging Face folder, the draft model every engine's draft-model row uses; made once, atomically."""
    from diagnostics.verdicts.llama_server import _save_early_exit

    folder = DRAFTS / f"early-exit-{layer}"
    if not (folder / "config.json").is_file():
        partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
        try:
            _save_early_exit(layer, partial)
            if not (folder / "config.json").is_file():
                shutil.rmtree(folder, ignore_errors=True)  # an incomplete copy
                partial.rename(folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)  # another process finished first, or this one failed
    return folder


def eagle3_head_folder(target: Any) -> Path:
    """An untrained EAGLE-3 head for the embedded ``target`` (``make-head eagle3``, seed 0, over the
    whole vocabulary, so its file carries no d2t/t2d, as vLLM reads it), made once, atomically."""
    from diagnostics.heads import make_head

    folder = HEADS / "eagle3-random-0"
    if not (folder / "config.json").is_file():
        partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
        try:
            shutil.rmtree(partial, ignore_errors=True)
            make_head("eagle3", target, partial, seed=0)
            if not (folder / "config.json").is_file():
                shutil.rmtree(folder, ignore_errors=True)
                partial.rename(folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return folder
