"""Divergence from any run: a stored run's coupled partner is found or recorded, linked, and shown
where and why it parts; a second request finds the stored partner instead of recording again."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from diagnostics.comparison import reference_first, references, run_group
from diagnostics.coupling import CouplingError, couple, plan_coupling, stored_divergence
from diagnostics.models import load_model
from diagnostics.runner import RunRequest, record_run
from diagnostics.store import Store

BASE = {"prompt": "w1 w2 w3 w1 w2", "draft": "ngram:2", "gamma": 3, "max_new_tokens": 24, "raw": True}
LOSSY = "lenience:0.3"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_model(save_tiny_model(tmp_path_factory.mktemp("coupling") / "tiny", seed=0, vocab=64))


def _lossy_run(store: Store, target, seed: int = 0, rule: str = LOSSY) -> str:
    run_id, _ = record_run(store, target, "ngram:2", RunRequest(rule=rule, seed=seed, **BASE))
    return run_id


def _run_count(store: Store) -> int:
    return len(store.list_runs())


def _columns(store: Store, run_id: str):
    return store.positions(run_id)[["position", "kind", "token", "draft_token", "u_accept", "u_fallback", "accept_prob"]]


def test_a_lossy_run_gets_its_coupled_lossless_run_and_a_second_request_finds_it(tmp_path: Path, target) -> None:
    store = Store(tmp_path / "runs.duckdb")
    # A seed where the lossy rule leaves the lossless run after a shared prefix (most do on this model).
    for seed in range(12):
        lossy = _lossy_run(store, target, seed)
        coupling = couple(store, lossy, target, "ngram:2")
        if coupling.divergence is not None and coupling.divergence >= 1:
            break
    else:
        pytest.fail("no seed in 0-11 made lenience:0.3 leave the lossless run after position 0")
    assert coupling.recorded and coupling.lossy_id == lossy and coupling.lossless_rule == "lossless"
    lossless, lossy_run = store.get_run(coupling.lossless_id), store.get_run(lossy)
    for name in ("prompt", "seed", "target", "draft", "gamma", "max_new_tokens", "policy", "draft_policy"):
        assert lossless[name] == lossy_run[name], name
    # Coupled: the same uniforms, so every position before the divergence is the same decision on
    # the same draft with the same coins; at the divergence the same coin, a different decision.
    left, right = _columns(store, coupling.lossless_id), _columns(store, lossy)
    d = coupling.divergence
    assert left.iloc[:d][["kind", "token", "draft_token"]].equals(right.iloc[:d][["kind", "token", "draft_token"]])
    assert left.iloc[:d + 1]["u_accept"].fillna(-1).tolist() == right.iloc[:d + 1]["u_accept"].fillna(-1).tolist()
    assert (left.iloc[d]["kind"], left.iloc[d]["token"]) != (right.iloc[d]["kind"], right.iloc[d]["token"])
    assert left.iloc[d]["draft_token"] == right.iloc[d]["draft_token"]
    assert "u = " in coupling.why and "lossless" in coupling.why and LOSSY in coupling.why, coupling.why
    # Linked as a group: the lossless run is the reference (though recorded after), the divergence stored.
    members = store.group(coupling.group_id)
    assert set(members["run_id"]) == {lossy, coupling.lossless_id}
    assert references(members)[int(lossy_run["seed"])] == coupling.lossless_id
    # Named reference first wherever the group is listed (creation order puts the lossy run first).
    assert members["run_id"].tolist() == [lossy, coupling.lossless_id]
    assert reference_first(members)["rule"].tolist() == ["lossless", LOSSY]
    assert store.get_run(lossy)["divergence_position"] == d and store.get_run(coupling.lossless_id)["divergence_position"] is None
    # The second click: found, linked already, nothing recorded or changed.
    count = _run_count(store)
    again = couple(store, lossy, target, "ngram:2")
    assert not again.recorded and again.lossless_id == coupling.lossless_id and again.divergence == d
    assert _run_count(store) == count and again.group_id == coupling.group_id
    # And from the lossless side, with the same lossy rule: the same pair.
    assert couple(store, coupling.lossless_id, None, None, LOSSY).lossy_id == lossy and _run_count(store) == count


def test_a_stored_lossless_run_is_found_only_when_it_is_coupled(tmp_path: Path, target) -> None:
    store = Store(tmp_path / "runs.duckdb")
    other_seed, _ = record_run(store, target, "ngram:2", RunRequest(rule="lossless", seed=1, **BASE))
    other_budget, _ = record_run(store, target, "ngram:2", RunRequest(rule="lossless", seed=0, **{**BASE, "max_new_tokens": 23}))
    lossless, _ = record_run(store, target, "ngram:2", RunRequest(rule="lossless", seed=0, **BASE))
    lossy = _lossy_run(store, target, 0)
    plan = plan_coupling(store, lossy)
    assert plan.partner_id == lossless  # not the other seed's, nor the other budget's (negative controls)
    count = _run_count(store)
    coupling = couple(store, lossy, target, "ngram:2")
    assert not coupling.recorded and coupling.lossless_id == lossless and _run_count(store) == count
    assert store.get_run(other_seed)["group_id"] is None and store.get_run(other_budget)["group_id"] is None
    assert coupling.divergence == stored_divergence(store, lossless, lossy)


def test_stored_divergence_reads_an_empty_token_as_the_comparison_does(tmp_path: Path, target) -> None:
    """A position whose token a file left empty (NULL) is compared as the Compare page compares it
    (``comparison.positions_divergence``), not an error: empty on both sides agrees, on one side parts."""
    store = Store(tmp_path / "runs.duckdb")
    lossless, _ = record_run(store, target, "ngram:2", RunRequest(rule="lossless", seed=0, **BASE))
    same, _ = record_run(store, target, "ngram:2", RunRequest(rule="lossless", seed=0, **BASE))
    assert stored_divergence(store, lossless, same) is None
    with store.connect() as con:
        con.execute("UPDATE positions SET token = NULL WHERE position = 2 AND run_id IN (?, ?)", [lossless, same])
    assert stored_divergence(store, lossless, same) is None
    with store.connect() as con:
        con.execute("UPDATE positions SET token = NULL WHERE position = 1 AND run_id = ?", [same])
    assert stored_divergence(store, lossless, same) == 1


def test_a_lossless_run_gets_the_lossy_rule_the_user_picks_and_bad_rules_are_one_line(tmp_path: Path, target) -> None:
    store = Store(tmp_path / "runs.duckdb")
    lossless, _ = record_run(store, target, "ngram:2", RunRequest(rule="lossless", seed=3, **BASE))
    count = _run_count(store)
    for rule, fragment in ((None, "type a lossy rule"), ("lossless", "lossless already"), ("lenience:7", "rule: "),
                           ("nonsense", "rule: ")):
        with pytest.raises(CouplingError) as error:
            couple(store, lossless, target, "ngram:2", rule)
        assert fragment in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert _run_count(store) == count and store.get_run(lossless)["group_id"] is None  # nothing stored or linked
    first = couple(store, lossless, target, "ngram:2", "lenience:0.3")
    second = couple(store, lossless, target, "ngram:2", "typical:0.1")
    assert first.recorded and second.recorded and first.group_id == second.group_id
    assert store.get_run(second.lossy_id)["rule"] == "typical:0.1"
    assert references(store.group(first.group_id))[3] == lossless  # the lossless run stays the reference


def test_runs_that_cannot_be_coupled_say_why_and_nothing_changes(tmp_path: Path, target) -> None:
    store = Store(tmp_path / "runs.duckdb")
    # A Compare group measured against a lossy reference: linking it elsewhere would break the group.
    group_id, results, _ = run_group(store, target, "ngram:2", [RunRequest(rule=rule, seed=0, **BASE) for rule in (LOSSY, "lenience:0.5")])
    count = _run_count(store)
    for run_id, _ in results:
        with pytest.raises(CouplingError) as error:
            couple(store, run_id, target, "ngram:2")
        assert "on Compare" in str(error.value) and "\n" not in str(error.value)
    assert _run_count(store) == count and set(store.group(group_id)["run_id"]) == {run_id for run_id, _ in results}
    with pytest.raises(CouplingError, match="no run 'nope'"):
        plan_coupling(store, "nope")
    lossy = _lossy_run(store, target, 5)
    shared = Store(store.path, read_only=True)
    with pytest.raises(CouplingError, match="read-only"):
        plan_coupling(shared, lossy)
    # Another target than the run's: refused before anything is recorded.
    other = load_model(save_tiny_model(tmp_path / "other", seed=1, vocab=64))
    count = _run_count(store)
    with pytest.raises(CouplingError, match="load its own target"):
        couple(store, lossy, other, "ngram:2")
    assert _run_count(store) == count


def test_a_stopped_partner_is_kept_interrupted_and_not_linked(tmp_path: Path, target) -> None:
    store = Store(tmp_path / "runs.duckdb")
    lossy = _lossy_run(store, target, 0)
    with pytest.raises(CouplingError, match="stopped after"):
        couple(store, lossy, target, "ngram:2", should_stop=lambda: True)
    runs = store.list_runs()
    assert sorted(runs["status"]) == ["complete", "interrupted"] and runs["group_id"].isna().all()
    assert plan_coupling(store, lossy).partner_id is None  # an interrupted partner is not found: recorded whole next time


def _cli(capsys, *argv: str) -> tuple[int, list[dict], str]:
    import json

    from diagnostics.cli import main

    try:
        status = main(list(argv))
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    return status, [json.loads(line) for line in captured.out.splitlines() if line.strip()], captured.err


def test_cli_run_with_lossless_records_links_and_says_where_and_why(capsys, tmp_path: Path, target) -> None:
    db = tmp_path / "runs.duckdb"
    settings = ["--prompt", BASE["prompt"], "--target", target.name, "--draft", "ngram:2", "--gamma", "3", "--max-new-tokens", "24",
                "--raw", "--seed", "0", "--db", str(db), "--no-progress"]
    status, lines, err = _cli(capsys, "run", *settings, "--rule", LOSSY, "--with-lossless")
    assert status == 0 and len(lines) == 1, err
    line = lines[0]
    store = Store(db)
    lossless = store.get_run(line["lossless_run"])
    assert lossless["rule"] == "lossless" and lossless["seed"] == 0 and not line["lossless_found"]
    assert {store.get_run(line["run_id"])["group_id"], lossless["group_id"]} == {line["group_id"]}
    # Seed 0 on this model: the lossy rule keeps a draft the lossless rule rejects (see the library test).
    assert line["divergence_position"] == stored_divergence(store, line["lossless_run"], line["run_id"]) == 5
    assert line["divergence_why"].startswith("lossless rejects the draft 'w61': u = 0.222 ≥ a = 0.184"), line["divergence_why"]
    assert f"{LOSSY} keeps the draft 'w61': u = 0.222 < a = 0.614" in line["divergence_why"]
    # Again with the same settings: a new lossy run, and the stored lossless run found, not recorded again.
    status, lines, _ = _cli(capsys, "run", *settings, "--rule", LOSSY, "--with-lossless")
    assert status == 0 and lines[0]["lossless_found"] and lines[0]["lossless_run"] == line["lossless_run"]
    assert len(store.list_runs()) == 3 and lines[0]["group_id"] == line["group_id"]


@pytest.mark.parametrize("extra, fragment", [
    (["--rule", "lossless"], "pass a lossy --rule"),
    (["--rule", "lenience:1"], "lenience:1 is lossless"),
    (["--rule", "lenience:0.5", "--replay", "abc"], "--with-lossless and --replay exclude each other"),
])
def test_cli_with_lossless_refusals_are_one_line_and_store_nothing(capsys, tmp_path: Path, target, extra, fragment) -> None:
    db = tmp_path / "runs.duckdb"
    argv = ["run", "--target", target.name, "--draft", "ngram:2", "--db", str(db), "--no-progress", "--with-lossless", *extra]
    if "--replay" not in extra:
        argv += ["--prompt", BASE["prompt"]]
    status, lines, err = _cli(capsys, *argv)
    assert status == 2 and not lines and err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
    assert not db.exists()  # refused before the database is opened


def test_help_states_the_with_lossless_option(capsys) -> None:
    from diagnostics.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--with-lossless" in text and "divergence_position" in text and "divergence_why" in text


def test_a_pair_that_never_parts_is_linked_and_its_lossless_run_still_takes_another_rule(tmp_path: Path, target) -> None:
    store = Store(tmp_path / "runs.duckdb")
    lossy = _lossy_run(store, target, 1)  # seed 1 on this model: lenience:0.3 never leaves the lossless run
    coupling = couple(store, lossy, target, "ngram:2")
    assert coupling.divergence is None and "never leaves" in coupling.why
    assert plan_coupling(store, lossy).linked  # the second click finds the linked pair
    # The lossy run, recorded first, is the group's reference; the lossless run is identical to it,
    # so another rule run beside the lossless run joins the group measured against the same tokens.
    beside = couple(store, coupling.lossless_id, target, "ngram:2", "lenience:0.05")
    assert beside.group_id == coupling.group_id
    assert beside.divergence == stored_divergence(store, lossy, beside.lossy_id)


EQUIVALENT = ("lenience:1", "cos:0", "mentored:1,1")


def test_a_lossless_equivalent_rule_is_refused_as_the_lossy_partner_and_would_not_part(tmp_path: Path, target) -> None:
    """Everyday, ~1 s. ``lenience:1``, ``cos:0`` and ``mentored:1,1`` offered beside a lossless run
    are refused in one line that says they are lossless and the runs will not part; recorded on the
    lossless run's seed, each indeed emits its tokens (the claim, checked on the real engine)."""
    store = Store(tmp_path / "runs.duckdb")
    lossless, _ = record_run(store, target, "ngram:2", RunRequest(rule="lossless", seed=5, **BASE))
    count = _run_count(store)
    for rule in EQUIVALENT:
        with pytest.raises(CouplingError) as error:
            couple(store, lossless, target, "ngram:2", rule)
        message = str(error.value)
        assert message.startswith(f"{rule} is lossless") and "will not part" in message and "\n" not in message, message
    assert _run_count(store) == count and store.get_run(lossless)["group_id"] is None
    tokens = store.positions(lossless)["token"].tolist()
    for rule in EQUIVALENT:
        same = _lossy_run(store, target, seed=5, rule=rule)
        assert store.positions(same)["token"].tolist() == tokens, rule
    assert couple(store, lossless, target, "ngram:2", "lenience:0.99").recorded  # just off 1: a lossy partner
