"""Why coupled runs part (one line), jump targets, multi-seed groups with Stop, and the modelled speed-up."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from diagnostics.comparison import group_status, member_figures, parse_seeds, plan_group, references, run_group, summarise
from diagnostics.divergence import decision_line, divergence_reason, jump_targets
from diagnostics.engine import EngineError
from diagnostics.metrics import expected_block_efficiency, modelled_speedup, verified_acceptance
from diagnostics.models import load_model
from diagnostics.runner import RunRequest
from diagnostics.store import Store


def _record(kind: str, token: int, draft: int | None = 7, a: float | None = 0.185, u: float | None = 0.251, uf: float | None = 0.42):
    return {"kind": kind, "token": token, "draft_token": draft, "accept_prob": a, "u_accept": u, "u_fallback": uf}


def test_reasons_name_the_decisive_numbers() -> None:
    line = divergence_reason("lossless", _record("rejected", 3), "lenience:0.5", _record("accepted", 7, a=0.37))
    assert line == ("lossless rejects the draft 7: u = 0.251 ≥ a = 0.185; its fallback law gives 3; "
                    "lenience:0.5 keeps the draft 7: u = 0.251 < a = 0.370")
    both = divergence_reason("lossless", _record("rejected", 3), "typical:0.1", _record("rejected", 5, a=0.1))
    assert both.startswith("both reject the draft 7 (u = 0.251, a = 0.185 and 0.100); the same uniform u_f = 0.420 lands")
    assert both.endswith("lossless → 3, typical:0.1 → 5")
    bonus = divergence_reason("lossless", _record("bonus", 3, draft=None), "greedy", _record("bonus", 4, draft=None))
    assert bonus == "both draw the bonus with the same uniform; the bonus laws differ: lossless → 3, greedy → 4"
    stored = {**_record("rejected", 3), "token_text": " the", "draft_text": " sea"}
    assert decision_line("lossless", stored) == "lossless rejects the draft ' sea': u = 0.251 ≥ a = 0.185; its fallback law gives ' the'"
    texts = {3: "the", 7: "sea"}
    assert decision_line("cos:0.4", _record("accepted", 7), texts.get) == "cos:0.4 keeps the draft 'sea': u = 0.251 < a = 0.185"


def test_jump_targets() -> None:
    kinds = ["accepted", "rejected", "bonus", "accepted", "rejected", "accepted"]
    severe = [0.0, 0.2, None, 0.01, 0.06, 0.0]
    records = [{"position": i, "kind": k, "severe_overshoot": s} for i, (k, s) in enumerate(zip(kinds, severe))]
    jumps = jump_targets(records, 3, divergence=4)
    assert jumps == {"previous rejection": 1, "next rejection": 4, "previous severe overshoot": 1,
                     "next severe overshoot": 4, "first divergence": 4}
    assert jump_targets(records, 5, divergence=None)["next rejection"] is None
    assert jump_targets(records, 0, divergence=99)["first divergence"] is None


@pytest.mark.parametrize("text, seeds", [("0", [0]), ("0,1, 2", [0, 1, 2]), ("3-5", [3, 4, 5]), ("0-2,2,7", [0, 1, 2, 7])])
def test_seeds(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "5-3", "0-99", "1.5"])
def test_bad_seeds_get_one_line(text: str) -> None:
    with pytest.raises(EngineError) as error:
        parse_seeds(text)
    assert "\n" not in str(error.value) and "seed" in str(error.value)


def test_modelled_speedup() -> None:
    assert modelled_speedup(0.8, 4, 0.0) == pytest.approx(float(expected_block_efficiency(0.8, 4)))
    assert modelled_speedup(0.8, 4, 0.25) == pytest.approx((1 - 0.8**5) / (0.2 * 2.0))
    assert modelled_speedup(0.5, 0, 0.3) == 1.0 and modelled_speedup(float("nan"), 4, 0.3) == 1.0
    assert verified_acceptance(3, 1) == 0.75
    with pytest.raises(ValueError):
        modelled_speedup(0.5, 4, -1.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(save_tiny_model(tmp_path_factory.mktemp("group") / "model", seed=0, vocab=12))


def _base() -> RunRequest:
    return RunRequest(prompt="w1 w2 w3 w4 w1 w2", rule="lossless", draft="ngram:2", gamma=3, max_new_tokens=16, raw=True)


def test_a_multi_seed_group_measures_divergence_per_seed_and_summarises(tmp_path: Path, tiny) -> None:
    store = Store(tmp_path / "runs.duckdb")
    planned = plan_group("lossless, lenience:0.5, medusa:0.09,0.3", [0, 1, 2], _base())
    assert [(r.seed, r.rule) for r in planned[:4]] == [(0, "lossless"), (0, "lenience:0.5"), (0, "medusa:0.09,0.3"), (1, "lossless")]
    group_id, results, _ = run_group(store, tiny, "ngram:2", planned)
    members = store.group(group_id)
    assert len(members) == 9 and group_status(members) == "complete"
    refs = references(members)
    assert set(refs) == {0, 1, 2} and all(members.loc[members.run_id == run_id, "rule"].iloc[0] == "lossless" for run_id in refs.values())
    assert members.loc[members.run_id.isin(refs.values()), "divergence_position"].isna().all()
    figures = {row.run_id: member_figures(row, store.positions(row.run_id)) for row in members.itertuples()}
    summary = summarise(members, figures).set_index("rule")
    assert list(summary.index) == ["lossless", "lenience:0.5", "medusa:0.09,0.3"] and (summary["seeds"] == 3).all()
    assert summary.loc["lossless", "first divergence"] == "reference"
    lenient = [figures[r]["acceptance α"] for r in members.loc[members.rule == "lenience:0.5", "run_id"]]
    assert summary.loc["lenience:0.5", "acceptance α"] == pytest.approx(sum(lenient) / 3)


def test_stop_keeps_finished_members_and_marks_the_group_interrupted(tmp_path: Path, tiny) -> None:
    """The members run as one batch: a stop ends every member in flight after its round, each kept
    ``interrupted`` with what it recorded. With a batch of one member at a time, the members
    finished before the stop stay ``complete`` and the members not begun never start."""
    planned = plan_group("lossless, lenience:0.5, typical:0.1", [0], _base())
    for batch_size, expected in ((None, ["interrupted"] * 3), (1, ["complete", "interrupted"])):
        store = Store(tmp_path / f"runs{batch_size}.duckdb")
        seen: list[int] = []

        def on_record_for(index, request, seen=seen):
            return lambda record: seen.append(index)

        def should_stop(seen=seen) -> bool:
            return seen.count(1) >= 3  # stop once the second member has three positions

        group_id, results, _ = run_group(store, tiny, "ngram:2", planned, on_record_for=on_record_for, should_stop=should_stop,
                                         batch_size=batch_size)
        members = store.group(group_id)
        assert list(members["status"]) == expected and group_status(members) == "interrupted"
        for row in members.itertuples():  # each member kept every position it recorded
            assert len(store.positions(row.run_id)) == row.n_tokens > 0
        if batch_size == 1:
            assert 2 not in seen  # the third member never started
