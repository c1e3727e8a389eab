"""The ONNX Runtime GenAI worker (diagnostics/verdicts/workers/onnxruntime_genai_worker.py) speaks
the protocol of ``verdicts.workers``: the real script, run as a subprocess by this interpreter, over
a fake ``onnxruntime_genai`` package (tests/fakes/onnxruntime_genai, its ``models.builder`` a fake
exporter) that prints to stdout, writes to fd 1, raises on seed 666, stops at its own EOS (2)
unless the configuration empties it, and counts drafts per generator.

Tier: everyday; 3.7-7 s for the file, measured while other builds shared the 2 cores (load ~15),
11 s at worst (each test starts one to three workers and the fake builder, ~0.1-0.5 s each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from worker_harness import Worker as ScriptWorker
from worker_harness import check_counted_requests, load_fake

FAKE = load_fake("onnxruntime_genai", "fake_onnxruntime_genai_for_tests")


class Worker(ScriptWorker):
    """onnxruntime_genai_worker.py over the fake engine, its builder recording each export in
    ``builds``; the precision is the worker's default."""

    def __init__(self, builds: Path) -> None:
        super().__init__("onnxruntime_genai_worker.py", FAKE_ORTGENAI_BUILDS=str(builds), ORTGENAI_WORKER_PRECISION=None)


class Lab:
    """A target and a draft Hugging Face folder (config.json and weights), the cache the worker
    writes, and the file where the fake builder records each export."""

    def __init__(self, root: Path) -> None:
        self.target = self.hf_folder(root / "target", {"num_hidden_layers": 30})
        self.draft = self.hf_folder(root / "draft", {"num_hidden_layers": 26})
        self.cache = root / "cache"
        self.builds = root / "builds.txt"

    @staticmethod
    def hf_folder(folder: Path, config: dict) -> Path:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "model.safetensors").write_bytes(b"weights")
        return folder

    def start(self, speculative: dict | None, model: Path | None = None) -> tuple[Worker, dict]:
        worker = Worker(self.builds)
        worker.send({"model": str(model or self.target), "speculative": speculative, "cache": str(self.cache), "threads": 1})
        return worker, worker.answer()

    def exports(self) -> list[str]:
        return self.builds.read_text().splitlines() if self.builds.is_file() else []

    def run_configs(self) -> list[dict]:
        return [json.loads(path.read_text()) for path in sorted((self.cache / "runs").glob("*/genai_config.json"))]


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path)


def _request(prompt: list[int], seeds: list[int], max_tokens: int, eos_ids: list[int], **sampling) -> dict:
    return {"prompt_ids": prompt, "seeds": seeds, "max_tokens": max_tokens, "temperature": 1.0, "top_k": None,
            "top_p": None, "min_p": None, "eos_ids": eos_ids, **sampling}


def test_draft_model_ready_outputs_in_seed_order_eos_kept_and_counters_per_request(lab: Lab) -> None:
    worker, ready = lab.start({"draft_model": str(lab.draft), "max_draft_tokens": 4})
    assert ready["ready"] is True and ready["engine"] == "onnxruntime-genai 0.0.fake"
    settings = ready["settings"]
    assert all(not isinstance(value, (dict, list)) for value in settings.values()), "settings must be flat"
    assert json.loads(settings["speculative"]) == {"max_draft_tokens": 4}
    assert json.loads(settings["speculative_effective"])["max_draft_tokens"] == 4.0  # read back from the engine
    assert settings["draft_model"] == str(lab.draft.resolve()) and settings["precision"] == "fp32"
    # Both folders exported once, by the builder, for the CPU; the run's configuration: the draft
    # as model.draft inside the run folder (no ".."), the engine's EOS emptied, the threads set.
    assert sorted(lab.exports()) == sorted(f"{folder.resolve()} fp32 cpu" for folder in (lab.target, lab.draft))
    (config,) = lab.run_configs()
    assert config["model"]["eos_token_id"] == [] and config["model"]["draft"]["filename"] == "draft/model.onnx"
    assert config["speculative"] == {"max_draft_tokens": 4}
    assert config["model"]["draft"]["session_options"]["intra_op_num_threads"] == 1
    assert config["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 1

    check_counted_requests(worker, FAKE, _request)  # seeds in order, the EOS kept, each request's own counters

    status, rest, stderr = worker.close()
    assert (status, rest) == (0, b"")
    assert "a C library writes to fd 1" in stderr and "fake builder: exporting" in stderr  # the noise: the log

    again, ready_again = lab.start({"draft_model": str(lab.draft), "max_draft_tokens": 4})
    assert ready_again["ready"] is True and len(lab.exports()) == 2, "a second start must reuse the exports"
    assert again.close()[:2] == (0, b"")


def test_control_stops_only_at_the_requests_eos_and_has_null_counters(lab: Lab) -> None:
    worker, ready = lab.start(None)
    assert ready["ready"] is True and ready["settings"]["speculative"] is None and ready["settings"]["counters"] is None
    assert FAKE.fake_tokens([996], 0, 5) == [996, 999, 2, 5, 8]  # 2: the exported model's own EOS
    worker.send(_request([996], [0], 5, []))
    assert worker.answer() == {"outputs": [[996, 999, 2, 5, 8]], "drafted": None, "accepted": None}
    worker.send(_request([996], [0], 5, [2]))
    assert worker.answer()["outputs"] == [[996, 999, 2]]
    assert worker.close()[:2] == (0, b"")


def test_ngram_alone_speculates_and_counts(lab: Lab) -> None:
    worker, ready = lab.start({"ngram_size": 3, "max_draft_tokens": 4})
    assert ready["ready"] is True and ready["settings"]["draft_model"] is None
    assert len(lab.exports()) == 1 and "draft" not in lab.run_configs()[0]["model"]
    worker.send(_request([3], [1], 4, []))
    assert worker.answer() == {"outputs": [FAKE.fake_tokens([3], 1, 4)], "drafted": 12, "accepted": 4}
    assert worker.close()[:2] == (0, b"")


def test_failing_requests_answer_one_error_line_and_the_worker_goes_on(lab: Lab) -> None:
    worker, ready = lab.start({"ngram_size": 2})
    assert ready["ready"] is True
    worker.send(_request([1], [3, FAKE.RAISING_SEED], 4, []))
    error = worker.answer()
    assert set(error) == {"error"} and "Gather node" in error["error"] and "\n" not in error["error"]
    worker.send(_request([1], [3], 4, [], min_p=0.1))  # no min_p in this engine: refused, not ignored
    assert "min_p" in worker.answer()["error"]
    worker.send(_request([1000], [3], 4, []))  # an id outside the fake's 1000-token vocabulary
    assert "prompt_ids" in worker.answer()["error"]
    worker.send(_request([1], [3], 64, []))  # the prompt and 64 tokens do not fit the 64-token context
    assert "max_tokens" in worker.answer()["error"]
    worker.send({"seeds": [1], "max_tokens": 4})
    assert "prompt_ids" in worker.answer()["error"]
    worker.send("not json")
    assert "error" in worker.answer()
    worker.send(_request([2], [1], 2, []))
    assert worker.answer() == {"outputs": [FAKE.fake_tokens([2], 1, 2)], "drafted": 6, "accepted": 2}
    assert worker.close()[:2] == (0, b"")


@pytest.mark.parametrize("speculative, expected", [
    ({"draft_model": "X", "num_speculative_tokens": 3}, "unknown speculative options ['num_speculative_tokens']"),
    ({"max_draft_tokens": 4}, "enables no speculation"),
    ({"ngram_size": 3, "cooldown": 1}, "cooldown must be true or false"),
    ({"draft_model": "/no/such/folder"}, "speculative draft_model must be a Hugging Face folder"),
])
def test_a_bad_speculative_set_up_is_one_error_line_and_exit_1(lab: Lab, speculative: dict, expected: str) -> None:
    if speculative.get("draft_model") == "X":
        speculative = {**speculative, "draft_model": str(lab.draft)}
    worker, answer = lab.start(speculative)
    assert set(answer) == {"error"} and expected in answer["error"] and "\n" not in answer["error"]
    assert worker.close()[:2] == (1, b"")
    assert lab.exports() == [], "a set-up refused for its options exports nothing"


def test_a_draft_with_another_vocabulary_is_refused(lab: Lab) -> None:
    other = Lab.hf_folder(lab.cache.parent / "other-draft", {"vocab_size": 999})
    worker, answer = lab.start({"draft_model": str(other)})
    assert "vocabulary (999) is not the target's (1000)" in answer["error"]
    assert worker.close()[:2] == (1, b"")


def test_a_failed_export_is_one_error_line_and_leaves_nothing_to_reuse(lab: Lab, tmp_path: Path) -> None:
    broken = Lab.hf_folder(tmp_path / "broken", {"fake_export_fails": True})
    worker, answer = lab.start(None, model=broken)
    assert "exporting" in answer["error"] and "exited 3" in answer["error"] and "\n" not in answer["error"]
    assert worker.close()[:2] == (1, b"")
    assert list((lab.cache / "exports").iterdir()) == [], "half an export must not stay where it would be reused"
    missing, answer = lab.start(None, model=tmp_path / "no-such-model")
    assert "config.json" in answer["error"]
    assert missing.close()[:2] == (1, b"")


def test_stdin_closed_before_the_set_up_exits_0(lab: Lab) -> None:
    assert Worker(lab.builds).close()[:2] == (0, b"")
