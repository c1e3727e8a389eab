"""Whole-run exact laws (one teacher-forced forward per model) against per-prefix forwards and the
engine's own recorded values, for each kind of drafter; and the per-position view built on them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import save_tiny_model

from diagnostics.inspection import RunLaws, draft_model, exact_laws, position_view
from diagnostics.models import load_model
from diagnostics.runner import RunRequest, record_run
from diagnostics.store import Store


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inspection")
    target = load_model(save_tiny_model(folder / "target", seed=0, vocab=16, layers=3))
    other = save_tiny_model(folder / "draft", seed=5, vocab=16, layers=1)
    store = Store(folder / "runs.duckdb")
    runs = {}
    for draft in ("early-exit:2", f"model:{other}", "ngram:2", None):
        request = RunRequest(prompt="w1 w2 w3 w4 w1 w2", rule="lenience:0.5", draft=draft, gamma=3,
                             max_new_tokens=24, seed=3, raw=True)
        run_id, _ = record_run(store, target, draft and (load_model(other) if draft.startswith("model:") else draft), request)
        runs["model" if draft and draft.startswith("model:") else draft] = run_id
    return store, target, runs


@pytest.mark.parametrize("draft", ["early-exit:2", "model", "ngram:2", None])
def test_whole_run_laws_equal_per_prefix_forwards_and_the_recorded_values(setting, draft) -> None:
    store, target, runs = setting
    run_id = runs[draft]
    run = store.get_run(run_id)
    records = store.positions(run_id).to_dict("records")
    drafter = draft_model(run, target) if draft else None
    laws = RunLaws(run, [record["token"] for record in records], target, drafter)
    assert laws.count == len(records) > 10
    for record in records:
        position = int(record["position"])
        p_reference, q_reference = exact_laws(run, record, target, drafter)
        assert torch.allclose(laws.p_at(position), p_reference, atol=1e-6)
        q_whole = laws.q_at(position, record)
        assert (q_whole is None) == (q_reference is None)
        if q_whole is not None:
            assert torch.allclose(q_whole, q_reference, atol=1e-6)
            # The engine recorded q(x) and p(x) of the drafted token with its KV caches.
            assert float(q_whole[int(record["draft_token"])]) == pytest.approx(record["q_draft"], abs=1e-5)
            assert float(laws.p_at(position)[int(record["draft_token"])]) == pytest.approx(record["p_draft"], abs=1e-5)
        assert float(laws.p_at(position)[int(record["token"])]) == pytest.approx(record["p_token"], abs=1e-5)


def test_a_shifted_row_is_caught(setting) -> None:
    """Negative control: laws read one row off (the classic teacher-forcing off-by-one) disagree."""
    store, target, runs = setting
    run_id = runs["early-exit:2"]
    run = store.get_run(run_id)
    records = store.positions(run_id).to_dict("records")
    laws = RunLaws(run, [record["token"] for record in records], target, draft_model(run, target))
    mismatches = sum(not torch.allclose(laws.p_at(int(record["position"]) + 1), exact_laws(run, record, target)[0], atol=1e-6)
                     for record in records[:-1])
    assert mismatches == len(records) - 1


def test_position_view_is_exact_with_laws_and_says_why_without(setting) -> None:
    store, target, runs = setting
    run_id = runs["ngram:2"]
    run = store.get_run(run_id)
    records = store.positions(run_id).to_dict("records")
    laws = RunLaws(run, [record["token"] for record in records], target, None)
    exact = position_view(run, records[3], laws)
    assert exact.exact and exact.view.p_target.numel() == 16
    rebuilt = position_view(run, records[3], None, unavailable="model not found")
    assert not rebuilt.exact and "model not found" in rebuilt.note


def test_a_run_with_foreign_ids_is_refused(setting, tmp_path: Path) -> None:
    store, target, runs = setting
    run = store.get_run(runs["ngram:2"])
    with pytest.raises(ValueError, match="outside this target's vocabulary"):
        RunLaws(run, [3, 99], target, None)
    # A drafted id out of range (a hostile file): a one-line refusal at that position, and the
    # position view falls back to the stored top-k saying why, instead of an IndexError.
    records = store.positions(runs["ngram:2"]).to_dict("records")
    laws = RunLaws(run, [record["token"] for record in records], target, None)
    verified = next(record for record in records if record["kind"] != "bonus")
    hostile = {**verified, "draft_token": 10**6}
    with pytest.raises(ValueError, match="drafted token id 1000000"):
        laws.q_at(int(hostile["position"]), hostile)
    view = position_view(run, hostile, laws)
    assert not view.exact and "drafted token id 1000000" in view.note


def test_index_of_maps_token_ids_to_the_bars_of_a_view(setting) -> None:
    """Exact views index by token id; rebuilt ones by the stored top-k (else ``missing``, e.g. the
    tail); a missing draft (None, or NaN from a DataFrame row, as at a bonus position) is no bar."""
    store, target, runs = setting
    run = store.get_run(runs["ngram:2"])
    records = store.positions(runs["ngram:2"]).to_dict("records")
    rebuilt = position_view(run, records[3], None)
    exact = position_view(run, records[3], RunLaws(run, [r["token"] for r in records], target, None))
    stored = rebuilt.ids[2]
    assert exact.index_of(stored) == stored and exact.index_of(float("nan")) is None and exact.index_of(None) is None
    assert rebuilt.index_of(stored) == 2 and rebuilt.index_of(float(stored)) == 2
    absent = 1000  # the tiny vocabulary is all in the stored top-20: an id outside it is in no bar
    assert rebuilt.index_of(absent) is None and rebuilt.index_of(absent, len(rebuilt.ids)) == len(rebuilt.ids)
    assert rebuilt.index_of(float("nan"), len(rebuilt.ids)) is None
