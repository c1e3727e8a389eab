"""Outcomes of a verdict-table row beyond pass, fail and inconclusive, through ``run_row`` with
planted engines on a tiny target: an engine that raises, or returns ids outside the vocabulary,
gives ``engine error`` with its message; a speculative side whose engine's own counters say it
drafted or accepted nothing reads ``speculation inactive`` whatever its audit says; counters that
show speculation ran leave the audit's verdict. Everyday tier, about 6 s for the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from diagnostics.engine import eos_ids
from diagnostics.models import load_model
from diagnostics.verdicts.engines import POLICIES, EngineRow, ours_generator
from diagnostics.verdicts.render import display_rows
from diagnostics.verdicts.table import (
    ENGINE_ERROR,
    SPECULATION_INACTIVE,
    Job,
    check_table,
    row_verdict,
    run_row,
    target_auditor,
)

DETECT_TV = 0.3  # few tokens a side: the outcomes, not the audit's power, are under test
MAX_TOKENS = 8
ROW = EngineRow("planted", "a planted engine", "mutant", {"method": "planted"})


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_model(save_tiny_model(tmp_path_factory.mktemp("outcomes") / "target", seed=0, vocab=12))


def _row(target, tmp_path: Path, on_generator) -> dict:
    """One row: ``on_generator`` speculation on, plain sampling of the target as its control."""
    eos = eos_ids(target, None)
    policy = POLICIES["t1"]
    prompts = [("w1 w2", [1, 2])]
    plain = ours_generator(target, None, policy, MAX_TOKENS, eos, speculative=False)
    jobs = [Job(ROW, "t1", policy, speculative, prompts, MAX_TOKENS, tmp_path / f"{side}.jsonl", control="plain",
                generator=generator) for side, speculative, generator in (("on", True, on_generator(plain)), ("off", False, plain))]
    row = run_row(*jobs, target_auditor(target, eos, DETECT_TV, 0.01), eos, detect_tv=DETECT_TV, level=0.01, store=None,
                  version="planted 0", target_name="tiny")
    assert check_table({"rows": [row]}) is None, check_table({"rows": [row]})  # every outcome is a row the table keeps
    json.dumps(row)
    return row


def _counting(drafted_per_call: int, accepted_per_call: int):
    """Plain sampling that reports speculation counters as an engine's own metrics would."""
    def wrap(plain):
        def run(prompt_ids, seed):
            run.counters["drafted"] += drafted_per_call
            run.counters["accepted"] += accepted_per_call
            run.counters["generations"] += 1
            return plain(prompt_ids, seed)

        run.counters = {"drafted": 0, "accepted": 0, "generations": 0, "source": "the planted engine's counters"}
        return run
    return wrap


def test_an_engine_that_raises_is_an_engine_error_with_its_message(target, tmp_path: Path) -> None:
    asked: list[int] = []

    def raising(plain):
        def run(prompt_ids, seed):
            asked.append(seed)
            if seed >= 3:
                raise IndexError("index -188010736 is out of bounds for dimension 1 with size 49152")
            return plain(prompt_ids, seed)
        return run

    row = _row(target, tmp_path, raising)
    # The side ends at the first seed that crashes: the rest of the chunk is not asked to crash again.
    assert asked == [0, 1, 2, 3], asked
    assert row["verdict"] == ENGINE_ERROR and row["on"]["verdict"] == "error" and row["off"]["verdict"] != "error"
    assert "crashed at seed 3" in row["on"]["error"] and "out of bounds for dimension 1" in row["on"]["error"]
    assert "\n" not in row["on"]["error"]
    assert display_rows({"rows": [row]})[0]["verdict"].startswith(f"{ENGINE_ERROR}: a planted engine (speculation on) crashed at seed 3")  # the message, shown


def test_ids_outside_the_vocabulary_are_an_engine_error(target, tmp_path: Path) -> None:
    row = _row(target, tmp_path, lambda plain: (lambda prompt_ids, seed: [3, 40_000]))
    assert row["verdict"] == ENGINE_ERROR and "outside the target's vocabulary" in row["on"]["error"], row["on"]
    assert row["on"]["file"] == "on.jsonl" and len(row["on"]["sha256"]) == 64  # what it gave is kept as evidence


@pytest.mark.parametrize("drafted, accepted, inactive", [(0, 0, True), (4, 0, True), (4, 3, False)])
def test_speculation_that_drafted_or_accepted_nothing_is_inactive(target, tmp_path: Path, drafted, accepted, inactive) -> None:
    row = _row(target, tmp_path, _counting(drafted, accepted))
    counters = row["on"]["speculation"]
    assert counters["drafted"] == drafted * counters["generations"] and counters["accepted"] == accepted * counters["generations"]
    assert counters["generations"] > 0 and row["on"]["verdict"] in ("pass", "inconclusive")
    assert (row["verdict"] == SPECULATION_INACTIVE) is inactive, row["verdict"]
    if inactive:
        assert display_rows({"rows": [row]})[0]["verdict"].startswith(f"{SPECULATION_INACTIVE} (0 drafted" if not drafted
                                                                     else f"{SPECULATION_INACTIVE} ({counters['drafted']} drafted, 0 accepted)")
    else:
        assert row["verdict"] == row["on"]["verdict"]


def test_row_verdict_orders_the_outcomes() -> None:
    """Everyday, < 0.01 s: an error beats everything, a failed control beats the counters, and a
    fail with speculation inactive stays a fail (the engine's sampling is wrong either way)."""
    passing, failing, error = {"verdict": "pass"}, {"verdict": "fail"}, {"verdict": "error", "error": "boom"}
    idle = {"verdict": "pass", "speculation": {"drafted": 0, "accepted": 0}}
    assert row_verdict(error, passing) == row_verdict(passing, error) == ENGINE_ERROR
    assert row_verdict(idle, failing).startswith("control failed")
    assert row_verdict(idle, passing) == SPECULATION_INACTIVE
    assert row_verdict({**idle, "verdict": "fail"}, passing) == "fail"
    assert row_verdict(passing, passing) == "pass"


def test_the_table_refuses_outcomes_without_their_evidence() -> None:
    """Everyday, < 0.01 s: an error side needs its message; counters must be counts, accepted <= drafted."""
    from diagnostics.verdicts.table_file import check_table as check

    base = {"engine": "e", "label": "l", "version": "v", "policy": "t1", "verdict": ENGINE_ERROR, "settings": {},
            "on": {"verdict": "error", "error": "boom"}, "off": {"verdict": "pass"}, "provenance": "run here"}
    assert check({"rows": [base]}) is None
    assert "must say what the engine did" in check({"rows": [{**base, "on": {"verdict": "error"}}]})
    bad = {**base, "verdict": "pass", "on": {"verdict": "pass", "speculation": {"drafted": 1, "accepted": 5}}}
    assert "accepts more tokens than it drafted" in check({"rows": [bad]})
    worse = {**base, "verdict": "pass", "on": {"verdict": "pass", "speculation": {"drafted": -1}}}
    assert "whole number" in check({"rows": [worse]})


def test_counters_are_kept_only_where_they_watched_this_sides_generations(tmp_path: Path) -> None:
    """Everyday, < 0.01 s: no counters where nothing was generated and counted here (a resumed side,
    or workers whose chunks carried no counts); a worker's chunks' counts are summed; otherwise the
    generator's own."""
    from diagnostics.verdicts.table import engine_counters

    def generator(prompt_ids, seed):
        return []

    generator.counters = {"drafted": 0, "accepted": 0, "generations": 0}
    job = Job(ROW, "t1", POLICIES["t1"], True, [("p", [1])], 4, tmp_path / "on.jsonl", generator=generator)
    assert engine_counters(job) is None  # nothing generated here
    generator.counters.update(drafted=9, accepted=4, generations=3)
    assert engine_counters(job) == {"drafted": 9, "accepted": 4, "generations": 3, "source": "the engine's counters"}
    job.submit = lambda prompt_ids, seeds: None
    assert engine_counters(job) is None  # worker processes generated nothing that was counted
    from diagnostics.verdicts.table import _worker_outputs

    for _ in range(2):  # two workers' chunks, each with its counts: summed
        assert _worker_outputs(job, {"outputs": [[1]], "counters": {"drafted": 5, "accepted": 2, "generations": 1,
                                                                   "source": "a worker"}}) == [[1]]
    assert engine_counters(job) == {"drafted": 10, "accepted": 4, "generations": 2, "source": "a worker"}


def test_our_engine_counts_what_it_drafted_and_accepted() -> None:
    """Everyday, ~1 s: the lab's own engine's generator keeps drafted and accepted tokens, one-by-one
    and batched alike; without a draft it drafts nothing."""
    from diagnostics.audit.engine_level import engine_generator
    from diagnostics.audit.suite import tiny_setup

    setup = tiny_setup()
    speculative = engine_generator(setup.target, setup.draft, 10, gamma=3)
    speculative(setup.prompt_ids, 1)
    speculative.batch(setup.prompt_ids, [2, 3])
    counts = speculative.counters
    assert counts["generations"] == 3 and counts["drafted"] > 0 and 0 <= counts["accepted"] <= counts["drafted"]
    plain = engine_generator(setup.target, None, 10)
    plain(setup.prompt_ids, 1)
    assert (plain.counters["drafted"], plain.counters["generations"]) == (0, 1)


def test_transformers_assisted_generation_counts_its_drafts(tmp_path: Path) -> None:
    """Everyday, ~3 s: each transformers row's generator (assistant, its defaults, heuristic, prompt
    lookup, early exit) counts what its candidate generator drafted and verification kept; the
    plain control keeps no counters; generate's class is left as it was."""
    from transformers.generation.utils import GenerationMixin

    from diagnostics.verdicts.engines import TRANSFORMERS_ROWS, transformers_generator

    target = load_model(save_tiny_model(tmp_path / "t", seed=0, vocab=12))
    draft = load_model(save_tiny_model(tmp_path / "d", seed=1, vocab=12))
    eos = eos_ids(target, None)
    before = GenerationMixin._get_candidate_generator
    for row in (row for row in TRANSFORMERS_ROWS if row.kind == "transformers"):
        generator = transformers_generator(row, target, draft, 1, POLICIES["t1"], 8, eos, True)
        for seed in range(2):
            generator([1, 2, 3, 1, 2], seed)
        counts = generator.counters
        assert counts["generations"] == 2 and counts["drafted"] > 0 and 0 <= counts["accepted"] <= counts["drafted"], (row.name, counts)
    assert GenerationMixin._get_candidate_generator is before
    assert not hasattr(transformers_generator(TRANSFORMERS_ROWS[0], target, draft, 1, POLICIES["t1"], 8, eos, False), "counters")


def test_llama_cpp_answers_state_their_drafts_and_the_committed_rows_drafted() -> None:
    """Everyday, ~0.5 s: llama.cpp's answers carry ``timings.draft_n`` and ``draft_n_accepted``; summed
    over the committed llama-server evidence they show speculation ran (16,063 drafted, 1,650 kept at
    t1), the plain control states none, and a forged count (more kept than drafted) is not counted."""
    from diagnostics.audit.samples import Sample, load_samples
    from diagnostics.verdicts.table import answer_counters

    folder = Path(__file__).resolve().parents[1] / "docs" / "verdicts"
    on = answer_counters(load_samples(folder / "llama-server--t1--on.jsonl"))
    assert (on["drafted"], on["accepted"], on["generations"]) == (16_063, 1_650, 336)
    assert answer_counters(load_samples(folder / "llama-server-plain--t1--off.jsonl")) is None
    forged = [Sample(prompt="p", token_ids=[1], temperature=1.0, raw={"timings": {"draft_n": 2, "draft_n_accepted": 9}})]
    assert answer_counters(forged) is None
    idle = [Sample(prompt="p", token_ids=[1], temperature=1.0, raw={"timings": {"draft_n": 0, "draft_n_accepted": 0}})]
    assert answer_counters(idle) == {"drafted": 0, "accepted": 0, "generations": 1,
                                     "source": "llama.cpp's timings (draft_n, draft_n_accepted) in each answer"}


def test_the_committed_tables_counters_are_its_evidences() -> None:
    """Everyday, ~1 s: every committed row whose counters come from llama.cpp's answers states exactly
    what its evidence file's answers sum to (a table's figures are decided by its evidence)."""
    from diagnostics.audit.samples import load_samples
    from diagnostics.verdicts.table import answer_counters, evidence_file
    from diagnostics.verdicts.table_file import load_table

    docs = Path(__file__).resolve().parents[1] / "docs"
    rows = [row for row in load_table(docs / "verdicts.json")["rows"] if "llama.cpp's timings" in str(row["on"].get("speculation"))]
    assert len(rows) == 2
    for row in rows:
        assert row["on"]["speculation"] == answer_counters(load_samples(evidence_file(row, "on", docs / "verdicts")))
