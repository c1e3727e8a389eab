"""The OpenVINO GenAI worker (``diagnostics/verdicts/workers/openvino_worker.py``) speaks the worker
protocol: the REAL script runs under this lab's interpreter with a FAKE ``openvino_genai`` (and
``openvino``, and optimum's exporter) from ``tests/fakes`` first on its ``PYTHONPATH``; the fakes
record what the worker asked of the engine in ``$FAKE_OV_LOG``.

Everyday tier: each test starts one or two worker processes (about 0.2 s each, the fake export
included); the file takes about 3 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

from worker_harness import load_fake, run_through

VOCAB = 100
PROMPT = [1, 5, 9, 13]
FAKE = load_fake("openvino_genai", "fake_openvino_genai")


def hf_folder(path: Path, weights: bytes = b"weights") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"vocab_size": VOCAB, "model_type": "llama"}))
    (path / "model.safetensors").write_bytes(weights)
    return path


def request(seeds: list[int], temperature: float = 1.0, prompt: list[int] | None = None, **extra) -> dict:
    return {"prompt_ids": PROMPT if prompt is None else prompt, "seeds": seeds, "max_tokens": 8, "temperature": temperature,
            "top_k": 20, "top_p": None, "min_p": None, "eos_ids": [2], **extra}


def run_worker(tmp_path: Path, setup: dict, requests: list, **env: str) -> tuple[int, list[dict], list[str], str]:
    """The worker fed ``setup`` and ``requests`` then end of input: (status, answers, the engine's
    log events, stderr). Every stdout line must be JSON: anything else corrupted the protocol."""
    log = tmp_path / "fake_engine.log"
    finished = run_through("openvino_worker.py", [setup, *requests], cwd=tmp_path, FAKE_OV_LOG=str(log), **env)
    answers = [json.loads(line) for line in finished.stdout.decode().splitlines()]
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return finished.returncode, answers, events, finished.stderr.decode()


def setup_for(tmp_path: Path, speculative: dict | None) -> dict:
    return {"model": str(hf_folder(tmp_path / "target")), "speculative": speculative, "cache": str(tmp_path / "cache"), "threads": 2}


def expected(seed: int, temperature: float = 1.0, prompt: list[int] = PROMPT) -> list[int]:
    return FAKE.expected_tokens(prompt, seed, 8, temperature, [2], False)


def test_control_answers_one_output_per_seed_in_order_with_eos_kept_and_no_counters(tmp_path: Path) -> None:
    """Ready line, outputs in the seeds' order (the fake returns them reversed), an EOS kept as the
    last id, null counters for the control; the engine's prints (Python's and fd 1's) stay out of
    stdout; stdin closed: exit 0. Also: the export ran once, offline, as fp32, and the control is
    the same ContinuousBatchingPipeline with f32 precision and prefix caching off."""
    status, answers, events, stderr = run_worker(tmp_path, setup_for(tmp_path, None), [request([5, 2, 8])], FAKE_OV_PRINT="1")
    assert status == 0, stderr
    assert len(answers) == 2
    ready, answer = answers
    assert ready["ready"] is True and ready["engine"] == "openvino-genai 2026.4.1.0-fake"
    assert ready["settings"]["speculation"] == "control" and ready["settings"]["scheduler_enable_prefix_caching"] is False
    assert answer == {"outputs": [expected(5), expected(2), expected(8)], "drafted": None, "accepted": None}
    assert answer["outputs"][0][-1] == 2 and len(answer["outputs"][0]) == 4  # odd seed: stopped at EOS, EOS kept
    assert "fake engine (C++ core): generate" in stderr and "fake engine (python): imported" in stderr
    exports = [event for event in events if event["event"] == "export"]
    assert len(exports) == 1 and exports[0]["weight_format"] == "fp32" and exports[0]["hub_offline"] == "1"
    build = next(event for event in events if event["event"] == "build")
    assert build["draft"] is None and build["prompt_lookup"] is False
    assert build["scheduler"]["max_num_batched_tokens"] >= 64 * 256  # 64 seeds of a 256-id prompt in one step
    assert build["properties"] == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "INFERENCE_NUM_THREADS": 2}
    assert build["scheduler"]["enable_prefix_caching"] is False
    generate = next(event for event in events if event["event"] == "generate")
    assert [config["rng_seed"] for config in generate["configs"]] == [5, 2, 8]
    assert all(config["do_sample"] and config["top_k"] == 20 and config["stop_token_ids"] == [2] for config in generate["configs"])


def test_draft_model_reports_the_engines_counters_and_passes_its_settings(tmp_path: Path) -> None:
    """A draft-model set-up: the draft is exported and given to the pipeline with the same plugin
    properties, num_assistant_tokens reaches every sub-request, greedy is do_sample off, and the
    answer carries the engine's drafted and accepted counts of that generate call."""
    draft = hf_folder(tmp_path / "draft", b"draft weights")
    setup = setup_for(tmp_path, {"draft_model": str(draft), "num_assistant_tokens": 3})
    status, answers, events, stderr = run_worker(tmp_path, setup, [request([1, 4], temperature=0.0)])
    assert status == 0, stderr
    ready, answer = answers
    assert ready["settings"]["speculation"] == "draft_model" and ready["settings"]["num_assistant_tokens"] == 3
    generated = len(expected(1, 0.0)) + len(expected(4, 0.0))
    assert answer == {"outputs": [expected(1, 0.0), expected(4, 0.0)], "drafted": 2 * generated, "accepted": generated // 2}
    assert {event["model"] for event in events if event["event"] == "export"} == {setup["model"], str(draft)}
    build = next(event for event in events if event["event"] == "build")
    assert build["draft"]["draft_model"].startswith(str(tmp_path / "cache" / "openvino-ir" / "draft-"))
    assert build["draft"]["properties"]["INFERENCE_PRECISION_HINT"] == "f32"
    configs = next(event for event in events if event["event"] == "generate")["configs"]
    assert all(config["num_assistant_tokens"] == 3 and config["do_sample"] is False for config in configs)


def test_nothing_drafted_is_nothing_accepted(tmp_path: Path) -> None:
    """With no draft token recorded the engine's accepted count is its batch-size estimate, not an
    acceptance: the worker reports 0 accepted of 0 drafted, never more accepted than drafted."""
    draft = hf_folder(tmp_path / "draft", b"draft weights")
    setup = setup_for(tmp_path, {"draft_model": str(draft), "num_assistant_tokens": 4})
    status, answers, _, stderr = run_worker(tmp_path, setup, [request([3, 6])], FAKE_OV_DEAD="1")
    assert status == 0, stderr
    assert answers[1]["drafted"] == 0 and answers[1]["accepted"] == 0


def test_prompt_lookup_passes_its_settings_and_reports_no_counters(tmp_path: Path) -> None:
    setup = setup_for(tmp_path, {"prompt_lookup": True, "num_assistant_tokens": 4, "max_ngram_size": 3})
    status, answers, events, stderr = run_worker(tmp_path, setup, [request([0])])
    assert status == 0, stderr
    assert answers[1] == {"outputs": [expected(0)], "drafted": None, "accepted": None}
    assert next(event for event in events if event["event"] == "build")["prompt_lookup"] is True
    config = next(event for event in events if event["event"] == "generate")["configs"][0]
    assert config["max_ngram_size"] == 3 and config["num_assistant_tokens"] == 4


def test_a_raising_generate_is_one_error_line_and_the_worker_rebuilds_and_keeps_serving(tmp_path: Path) -> None:
    """The engine's exception (with its newline) becomes one error line; the next request is served
    by a new pipeline (a speculative pipeline that raised keeps its speculation dead); bad requests
    (not JSON, an id outside the vocabulary, no seeds, more prompt ids than one prefill step takes)
    are one error line each, and serving goes on."""
    draft = hf_folder(tmp_path / "draft", b"draft weights")
    setup = setup_for(tmp_path, {"draft_model": str(draft), "num_assistant_tokens": 4})
    too_many = request(list(range(64)), prompt=[1] * 257)  # 64 x 257 ids: over the one-step prefill
    requests = [request([1], prompt=[1, FAKE.RAISE_ID]), request([2]), "{not json", request([3], prompt=[1, VOCAB]),
                request([]), too_many, request([4])]
    status, answers, events, stderr = run_worker(tmp_path, setup, requests)
    assert status == 0, stderr
    ready, raised, served, *bad, last = answers
    assert ready["ready"] is True
    assert list(raised) == ["error"] and "content_length <= prompt_ids.size()" in raised["error"] and "\n" not in raised["error"]
    assert served["outputs"] == [expected(2)]
    assert [list(answer) for answer in bad] == [["error"]] * 4
    assert "not JSON" in bad[0]["error"] and "prompt id" in bad[1]["error"] and "seeds" in bad[2]["error"]
    assert "fewer seeds" in bad[3]["error"]  # never a split prefill
    assert last["outputs"] == [expected(4)]
    assert [event["event"] for event in events if event["event"] in ("build", "generate")] == [
        "build", "generate", "build", "generate", "generate"]


def test_exports_are_reused_until_the_model_changes(tmp_path: Path) -> None:
    """A second worker on the same folders exports nothing; a changed weights file exports again."""
    setup = setup_for(tmp_path, None)
    for _ in range(2):
        assert run_worker(tmp_path, setup, [])[0] == 0
    (tmp_path / "target" / "model.safetensors").write_bytes(b"other weights, other size")
    assert run_worker(tmp_path, setup, [])[0] == 0
    exports = [json.loads(line) for line in (tmp_path / "fake_engine.log").read_text().splitlines()
               if json.loads(line)["event"] == "export"]
    assert len(exports) == 2
    assert len([path for path in (tmp_path / "cache" / "openvino-ir").glob("target-*") if (path / "export.json").is_file()]) == 2


def test_a_bad_set_up_or_a_failed_export_is_one_error_line_and_exit_1(tmp_path: Path) -> None:
    """A misspelt speculative key must not run as a control; a draft without its step setting, a
    missing model folder and a failing export are refused with one line that says what to do."""
    target = str(hf_folder(tmp_path / "target"))
    draft = str(hf_folder(tmp_path / "draft"))
    cache = str(tmp_path / "cache")
    cases = [
        ({"draft_model": draft, "num_assistant_token": 4}, "does not know"),
        ({"draft_model": draft}, "exactly one of num_assistant_tokens"),
        ({"prompt_lookup": True, "num_assistant_tokens": 4}, "max_ngram_size"),
    ]
    for speculative, says in cases:
        status, answers, _, _ = run_worker(tmp_path, {"model": target, "speculative": speculative, "cache": cache, "threads": 1}, [])
        assert status == 1 and len(answers) == 1 and says in answers[0]["error"], answers
    status, answers, _, _ = run_worker(tmp_path, {"model": str(tmp_path / "nowhere"), "speculative": None, "cache": cache, "threads": 1}, [])
    assert status == 1 and "no config.json" in answers[0]["error"]
    status, answers, _, _ = run_worker(tmp_path, {"model": target, "speculative": None, "cache": cache, "threads": 1}, [],
                                       FAKE_OV_EXPORT_FAIL="1")
    assert status == 1 and "failed (status 3)" in answers[0]["error"] and "export.log" in answers[0]["error"]
    assert not [path for path in (tmp_path / "cache" / "openvino-ir").iterdir() if path.is_dir()], "a failed export must leave no IR behind"
    # Negative control: the same set-up without the planted failure starts.
    assert run_worker(tmp_path, {"model": target, "speculative": None, "cache": cache, "threads": 1}, [])[0] == 0
