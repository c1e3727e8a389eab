"""The lab's side of engines in their own environment (``verdicts.venv_engine``, the vLLM and
OpenVINO rows), against a planted engine behind the same worker protocol
(``tests/fakes/planted_engine_worker.py``, run by this interpreter as the engine's environment):
an honest engine's row passes with its own counters, and each way an engine or its worker goes
wrong is the row's ``engine error`` with one line, or ``speculation inactive``; none is a
traceback or a pass. Everyday tier: the protocol failures, about 1 s in all; slow tier: the three
table runs on a tiny target, about 60 s together on a quiet machine (each starts workers that
import torch and transformers, and audits its rows)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from diagnostics.policy import Policy
from diagnostics.verdicts import run as verdicts_run
from diagnostics.verdicts import venv_engine
from diagnostics.verdicts.render import display_rows
from diagnostics.verdicts.table import ENGINE_ERROR, SPECULATION_INACTIVE, check_table
from diagnostics.verdicts.venv_engine import VenvEngine, WorkerProcess, check_outputs, venv_generator

PLANTED = Path(__file__).parent / "fakes" / "planted_engine_worker.py"
DETECT_TV = 0.3  # few tokens a side: the outcomes, not the audit's power, are under test
MAX_TOKENS = 8


@pytest.fixture
def planted(monkeypatch, tmp_path: Path):
    """The vllm engine's environment replaced by this interpreter running the planted worker;
    returns a function that sets its mode."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "VERSION").write_text("planted-engine 1.0\ninstalled in 0 s\n")
    monkeypatch.setitem(venv_engine.ENGINES, "vllm", VenvEngine("vllm", "PLANTED_VENV", str(PLANTED), "tools/build-planted.sh"))
    monkeypatch.setenv("PLANTED_VENV", str(venv))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    return lambda mode: monkeypatch.setenv("PLANTED_MODE", mode)


def _worker(tmp_path: Path, **timeouts) -> WorkerProcess:
    return WorkerProcess([sys.executable, str(PLANTED)], tmp_path / "worker.log", **timeouts)


def _generator(tmp_path: Path, speculative: bool = True, **timeouts):
    setup = {"model": "unused", "speculative": {"method": "ngram"} if speculative else None, "cache": str(tmp_path), "threads": 1}
    return venv_generator(_worker(tmp_path, **timeouts), setup, Policy(temperature=1.0), MAX_TOKENS, {11}, speculative, "planted")


@pytest.mark.parametrize("mode, message", [
    ("start-error", "planted: the engine refused its set-up"),
    ("die", "the worker exited (status 3) while generating"),
    ("not-json", "the worker's answer while generating is not JSON: INFO engine says hello"),
    ("too-long", f"the engine returned {MAX_TOKENS + 1} tokens for seed 0 where max_tokens is {MAX_TOKENS}"),
])
def test_a_worker_that_breaks_the_protocol_raises_one_line(monkeypatch, tmp_path: Path, mode: str, message: str) -> None:
    monkeypatch.setenv("PLANTED_MODE", mode)
    run = _generator(tmp_path)
    with pytest.raises(RuntimeError) as raised:
        run.batch([1, 2], [0, 1])
    assert message in str(raised.value) and "\n" not in str(raised.value), raised.value
    if mode == "start-error":  # a failed start is the side's outcome once, not a new start for every seed
        with pytest.raises(RuntimeError, match="refused its set-up"):
            run([1, 2], 5)
        assert run.ready == {"error": str(raised.value)}


def test_a_worker_that_never_answers_is_ended_at_its_time_bound(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PLANTED_MODE", "hang")
    run = _generator(tmp_path, request_timeout_s=1.0)
    with pytest.raises(RuntimeError, match=r"no answer in 1 s while generating"):
        run.batch([1, 2], [0])


@pytest.mark.parametrize("answer, message", [
    ({"outputs": [[1, 2]]}, "answered 1 outputs for 2 seeds"),
    ({"outputs": [[1, 2], [1, True]]}, "output for seed 1 is not a list of integer ids"),
    ({"outputs": [[1, 2], [1, -4]]}, "returned id -4 for seed 1, outside any vocabulary"),
    ({"outputs": [[1, 2], "12"]}, "output for seed 1 is not a list"),
])
def test_outputs_are_checked_before_they_are_kept(answer: dict, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        check_outputs(answer, [0, 1], MAX_TOKENS)
    assert check_outputs({"outputs": [[1, 2], []]}, [0, 1], MAX_TOKENS) == [[1, 2], []]


def test_an_engine_not_installed_is_one_line_naming_its_build_script(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError) as raised:
        venv_engine.ENGINES["vllm"].python()
    assert "vllm is not installed" in str(raised.value) and "tools/build-vllm.sh" in str(raised.value)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> verdicts_run.Setup:
    folder = save_tiny_model(tmp_path_factory.mktemp("venv-engine") / "target", seed=0, vocab=12)
    return verdicts_run.load_setup(folder, layer=1, prompts=["w1 w2"], draft_spec=folder)


def _table(tiny, tmp_path: Path, rows: list[str], policies: list[str], rerun: bool = False) -> list[dict]:
    done = verdicts_run.run_table([verdicts_run.engine_rows()[name] for name in rows], policies, tiny, out=tmp_path / "table.json",
                                  evidence=tmp_path / "evidence", store=None, detect_tv=DETECT_TV, level=0.01,
                                  max_tokens=MAX_TOKENS, rerun=rerun, say=lambda line: None)
    table = json.loads((tmp_path / "table.json").read_text())
    assert check_table(table) is None
    return done


@pytest.mark.slow
def test_an_honest_engine_passes_with_its_counters_and_a_crash_under_top_k_is_an_engine_error(planted, tiny,
                                                                                            tmp_path: Path) -> None:
    planted("raise")  # honest, except that it raises for any request with top-k (vLLM 0.32.0's CPU build did)
    by_policy = {row["policy"]: row for row in _table(tiny, tmp_path, ["vllm-draft"], ["t1", "t1-top-k-20"])}
    row = by_policy["t1"]
    assert row["verdict"] in ("pass", "inconclusive") and row["on"]["verdict"] == row["verdict"], row
    counters = row["on"]["speculation"]
    assert counters["generations"] == row["on"]["generations"] > 0
    assert counters["drafted"] == 4 * counters["generations"] and counters["accepted"] == 2 * counters["generations"]
    assert "speculation" not in row["off"]  # the control drafts nothing and says so by reporting nothing
    assert row["version"] == "planted-engine 1.0" and row["settings"]["engine"] == "planted 1.0"
    # The row's draft (the assistant) reached the engine as a model folder it can load.
    stated = json.loads(row["settings"]["engine_settings"]["speculative"])
    assert stated == {"method": "draft_model", "model": str(Path(tiny.draft_source).resolve()), "num_speculative_tokens": 4}
    log = (tmp_path / "evidence" / "vllm-draft--t1--on.log").read_text()
    assert "planted engine loading" in log  # what the engine printed went to its log, not into the answers

    crashed = by_policy["t1-top-k-20"]
    assert crashed["verdict"] == ENGINE_ERROR and crashed["on"]["verdict"] == crashed["off"]["verdict"] == "error"
    assert "index -188010736 is out of bounds" in crashed["on"]["error"] and "crashed at seed 0" in crashed["on"]["error"]
    shown = display_rows({"rows": [crashed]})[0]["verdict"]
    assert shown.startswith(ENGINE_ERROR) and "out of bounds" in shown
    # Made again (--rerun), a row's engine log starts anew: it tells of this run only.
    crashed_log = tmp_path / "evidence" / "vllm-draft--t1-top-k-20--on.log"
    crashed_log.write_text(crashed_log.read_text() + "A LINE FROM THE RUN BEFORE\n")
    [again] = _table(tiny, tmp_path, ["vllm-draft"], ["t1-top-k-20"], rerun=True)
    assert again["verdict"] == ENGINE_ERROR and "A LINE FROM THE RUN BEFORE" not in crashed_log.read_text()
    assert "planted engine loading" in crashed_log.read_text()


@pytest.mark.slow
def test_an_engine_that_accepts_nothing_reads_speculation_inactive(planted, tiny, tmp_path: Path) -> None:
    planted("inactive")
    [row] = _table(tiny, tmp_path, ["vllm-ngram"], ["t1"])
    assert row["on"]["verdict"] in ("pass", "inconclusive") and row["verdict"] == SPECULATION_INACTIVE
    assert row["on"]["speculation"]["accepted"] == 0 < row["on"]["speculation"]["drafted"]


@pytest.mark.slow
def test_ids_outside_the_vocabulary_are_an_engine_error(planted, tiny, tmp_path: Path) -> None:
    planted("out-of-vocab")
    [row] = _table(tiny, tmp_path, ["vllm-ngram"], ["t1"])
    assert row["verdict"] == ENGINE_ERROR and "outside the target's vocabulary" in row["on"]["error"], row["on"]


def test_an_eagle3_row_gets_a_whole_vocabulary_head_without_a_vocabulary_map(tiny, monkeypatch, tmp_path: Path) -> None:
    """The vllm-eagle3 row's head (everyday, about 1 s on the tiny target): made once, in the layout
    vLLM loads (no d2t/t2d over the whole vocabulary), and one that our own loader reads back; a
    target other than the embedded one is refused in one line before anything is made."""
    from safetensors import safe_open

    from diagnostics.heads import load_head

    monkeypatch.setattr(venv_engine, "HEADS", tmp_path / "heads")
    folder = venv_engine.eagle3_head_folder(tiny.target)
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        assert not {"d2t", "t2d"} & set(handle.keys()) and "fc.weight" in handle.keys()
    made = (folder / "model.safetensors").stat().st_mtime_ns
    assert venv_engine.eagle3_head_folder(tiny.target) == folder and (folder / "model.safetensors").stat().st_mtime_ns == made
    assert load_head("eagle3", str(folder), tiny.target).module.t2d.all()
    assert sorted(path.name for path in (tmp_path / "heads").iterdir()) == ["eagle3-random-0"]  # no partial folder left
    with pytest.raises(ValueError, match="run it with --target default"):
        verdicts_run._eagle3_head(tiny)
