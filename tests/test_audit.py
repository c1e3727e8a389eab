"""Rule-level audit: correct implementations pass, every planted bug is caught, the power claim holds."""

from __future__ import annotations

import pytest
import torch
from devices import DEVICE

from diagnostics.audit import BATCH_MUTANTS, ENGINE_MUTANTS, RULE_MUTANTS, audit_rule, battery, rule_adapter, transformers_adapter
from diagnostics.rules import normalise_or

N = 60_000


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_our_lossless_rule_passes(seed: int) -> None:
    audit = audit_rule(rule_adapter("lossless"), battery(seed=seed), n=N, seed=seed, implementation="ours")
    assert audit.passed, audit.worst
    assert audit.max_detectable_tv < 0.03 and all(pair.impossible == 0 for pair in audit.pairs)


@pytest.mark.parametrize("spec", ["lenience:0.5", "typical:0.1", "cascade:0.5"])
def test_declared_lossy_rules_match_their_law_and_fail_losslessness(spec: str) -> None:
    pairs = battery(seed=4)
    assert audit_rule(rule_adapter(spec), pairs, n=N, declared=spec, seed=4).passed
    assert not audit_rule(rule_adapter(spec), pairs, n=N, seed=4).passed


@pytest.mark.slow  # slow tier: rule-level statistics against transformers (about 6 s a case)
@pytest.mark.parametrize("seed", [0, 1])
def test_transformers_speculative_sampling_passes_at_rule_level(seed: int) -> None:
    """transformers' `_speculative_sampling` given the true q: the step itself is lossless."""
    audit = audit_rule(transformers_adapter(), battery(seed=seed)[:3], n=20_000, seed=seed, implementation="transformers")
    assert audit.passed, audit.worst


@pytest.mark.parametrize("seed", [7, 8])
@pytest.mark.parametrize("name", list(RULE_MUTANTS))
def test_every_rule_level_mutant_is_caught(name: str, seed: int) -> None:
    _, mutant = RULE_MUTANTS[name]
    audit = audit_rule(mutant, battery(seed=seed), n=N, seed=seed, implementation=name)
    assert not audit.passed, (name, audit.worst)


def _off_by(tv: float):
    """A step whose output law is p moved by exactly ``tv`` toward the draft: P = p + tv·(q' − p)/TV(q', p)."""
    def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        other = normalise_or(torch.ones_like(p) * (p > 0), p)  # uniform on p's support
        distance = 0.5 * (other - p).abs().sum()
        law = p + (tv / distance) * (other - p)
        return torch.multinomial(law, drafts.numel(), replacement=True, generator=generator)

    return verify


def test_power_claim_tv_two_percent_is_caught() -> None:
    """At the documented sample size (60,000 per pair, 6 pairs, level 1%), a TV error of 0.02 is caught."""
    for seed in range(3):
        audit = audit_rule(_off_by(0.02), battery(seed=seed), n=N, seed=seed)
        assert not audit.passed
    # The documented guarantee: every pair detects TV 0.012 with probability ≥ 0.9 at its Bonferroni level.
    assert audit.max_detectable_tv <= 0.0125


def test_audit_command_prints_a_verdict(capsys) -> None:
    import json

    from diagnostics.cli import main

    assert main(["audit", "--samples", "20000"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert ours["verdict"] == "pass" and ours["reference"] == "p (lossless)" and len(ours["pairs"]) == 6
    assert main(["audit", "--implementation", "residual_softmax", "--samples", "20000"]) == 0
    planted = json.loads(capsys.readouterr().out)
    assert planted["verdict"] == "fail" and planted["pairs"][0]["adjusted_p"] <= 1.0


@pytest.mark.slow  # slow tier: every engine-level audit and its planted bugs (about 25 s)
def test_audit_all_gives_every_verdict_and_stores_them(tmp_path, capsys) -> None:
    """The whole table in one command: ours and transformers pass, every planted bug fails, at its layer."""
    import json

    from diagnostics.cli import main
    from diagnostics.store import Store

    db = tmp_path / "audits.duckdb"
    assert main(["audit", "--all", "--samples", "20000", "--generations", "300", "--save", "--db", str(db)]) == 0
    captured = capsys.readouterr()
    results = [json.loads(line) for line in captured.out.splitlines()]
    verdicts = {(result["layer"], result["implementation"]): result["verdict"] for result in results}
    assert len(verdicts) == 2 + len(RULE_MUTANTS) + 2 + len(ENGINE_MUTANTS) + len(BATCH_MUTANTS)
    for (layer, name), verdict in verdicts.items():
        planted = name.startswith("planted:")
        assert verdict == ("fail" if planted else "pass"), (layer, name, verdict)
    assert {name for layer, name in verdicts if layer == "engine"} >= {f"planted:{name}" for name in [*ENGINE_MUTANTS, *BATCH_MUTANTS]}
    assert "engine · planted:rollback_off_by_one · FAIL" in captured.err  # the table on stderr
    stored = Store(db, read_only=True).list_audits()
    assert len(stored) == len(results) and set(stored["audit_id"]) == {result["audit_id"] for result in results}


def test_audit_command_errors_are_one_line(capsys) -> None:
    from diagnostics.cli import main

    assert main(["audit", "--engine", "residual_softmax"]) == 2
    assert "rule-level planted bug" in capsys.readouterr().err
    assert main(["audit", "--implementation", "nope"]) == 2
    assert "unknown implementation 'nope'" in capsys.readouterr().err
    assert main(["audit", "--engine", "ours", "--generations", "0"]) == 2
    assert main(["audit", "--engine", "ours", "--run", "x"]) == 2


def _recorded(tmp_path, rule="lossless", planted=None, monkeypatch=None):
    from engine_sampling import stale_rollback
    from tiny_models import save_tiny_model

    from diagnostics.engine.drafting import TargetScorer
    from diagnostics.models import load_model
    from diagnostics.runner import RunRequest, record_run
    from diagnostics.store import Store

    target = load_model(save_tiny_model(tmp_path / "tiny", seed=0))
    draft_folder = save_tiny_model(tmp_path / "draft", seed=1)
    store = Store(tmp_path / "runs.duckdb")
    if planted == "rollback":
        monkeypatch.setattr(TargetScorer, "rollback", stale_rollback)
    run_id, _ = record_run(store, target, load_model(draft_folder),
                           RunRequest(prompt="w1 w2 w3 w4", rule=rule, draft=f"model:{draft_folder}", gamma=3,
                                      max_new_tokens=30, seed=3, raw=True))
    return store, run_id, target


def test_recorded_run_replays_cleanly(tmp_path) -> None:
    from diagnostics.audit import audit_recorded_run

    store, run_id, target = _recorded(tmp_path, rule="lenience:0.5")
    result = audit_recorded_run(store, run_id, target)
    assert result.verdict == "pass", result.flags
    assert result.max_p_difference < 1e-4 and result.positions > 0


@pytest.mark.parametrize("rule, children", [("lenience:0.5", "top"), ("lossless", "sample"), ("lossless", "sample-distinct")])
def test_recorded_tree_run_replays_cleanly_and_a_tampered_node_is_flagged(tmp_path, rule: str, children: str) -> None:
    """A tree run's positions replay node by node: each candidate's ``a_j`` from the recomputed ``p``,
    each decision from its coin, each fallback from ``r_{K+1}``; a stored coin changed is caught."""
    import duckdb
    from tiny_models import save_tiny_model

    from diagnostics.audit import audit_recorded_run
    from diagnostics.models import load_model
    from diagnostics.runner import RunRequest, record_run
    from diagnostics.store import Store

    target = load_model(save_tiny_model(tmp_path / "tiny", seed=0, layers=3))
    store = Store(tmp_path / "runs.duckdb")
    run_id, run = record_run(store, target, "early-exit:2", RunRequest(prompt="w1 w2 w3 w4", rule=rule, draft="early-exit:2",
                                                                       tree="3,2", tree_children=children, max_new_tokens=30,
                                                                       seed=3, raw=True))
    result = audit_recorded_run(store, run_id, target)
    assert result.verdict == "pass", result.flags
    assert {record.kind for record in run.records} >= {"accepted", "rejected"}
    refused = store.tree_nodes(run_id).query("decision == 'refused'").iloc[0]
    with duckdb.connect(str(store.path)) as con:
        con.execute("UPDATE tree_nodes SET u_accept = 0.0 WHERE run_id = ? AND block = ? AND node = ?",
                    [run_id, int(refused["block"]), int(refused["node"])])
    tampered = audit_recorded_run(store, run_id, target)
    assert tampered.verdict == "fail" and any(flag["check"] == "replay" for flag in tampered.flags)


def test_recorded_run_with_a_stale_cache_is_flagged(tmp_path, monkeypatch) -> None:
    from diagnostics.audit import audit_recorded_run

    store, run_id, target = _recorded(tmp_path, planted="rollback", monkeypatch=monkeypatch)
    monkeypatch.undo()
    result = audit_recorded_run(store, run_id, target)
    assert result.verdict == "fail" and any(flag["check"] == "p recomputed" for flag in result.flags)


def test_tampered_or_impossible_records_are_flagged(tmp_path) -> None:
    import duckdb

    from diagnostics.audit import audit_recorded_run

    store, run_id, _ = _recorded(tmp_path)
    with duckdb.connect(str(store.path)) as con:
        first = con.execute("SELECT min(position) FROM positions WHERE run_id = ? AND kind != 'bonus'", [run_id]).fetchone()[0]
        con.execute("UPDATE positions SET kind = CASE WHEN kind = 'accepted' THEN 'rejected' ELSE 'accepted' END, q_draft = 0 "
                    "WHERE run_id = ? AND position = ?", [run_id, first])
    result = audit_recorded_run(store, run_id)
    checks = {flag["check"] for flag in result.flags if flag["position"] == first}
    assert {"replay", "q(x) = 0"} <= checks and result.verdict == "fail"


def test_audit_command_on_a_recorded_run(tmp_path, capsys) -> None:
    import json

    from diagnostics.cli import main

    store, run_id, _ = _recorded(tmp_path)
    assert main(["audit", "--run", run_id, "--db", str(store.path), "--load-models"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "pass" and result["p_recomputed"] and result["positions"] > 0
    assert main(["audit", "--run", "nope", "--db", str(store.path)]) == 2


@pytest.mark.parametrize("first_seed", [0, 10_000])
def test_engine_audit_passes_our_engine_on_several_seed_ranges(first_seed: int) -> None:
    from diagnostics.audit.suite import run_engine_audit, tiny_setup

    result = run_engine_audit("ours", tiny_setup(DEVICE), generations=800, first_seed=first_seed)
    assert result.verdict == "pass" and result.errors == 0 and result.impossible == 0, result.reasons
    assert result.positions and all(item.tokens >= 100 for item in result.positions)  # per-position tests ran


@pytest.mark.parametrize("first_seed", [0, 5_000])
@pytest.mark.parametrize("name", [*ENGINE_MUTANTS, *BATCH_MUTANTS])
def test_every_engine_level_mutant_is_caught(name: str, first_seed: int) -> None:
    from diagnostics.audit.suite import run_engine_audit, tiny_setup

    result = run_engine_audit(name, tiny_setup(DEVICE), generations=400, first_seed=first_seed)
    assert result.verdict == "fail", result
    if name == "truncation_dropped":
        # Tokens outside the top-k that the baseline policy never emits.
        assert result.impossible > 0
    else:
        # Caught by the law of the generations that finished, not only by crashes.
        assert result.p_value < 1e-6 and result.worst_position_p < 1e-6


def test_batch_leaks_need_a_batch() -> None:
    """The row-leak mutants change nothing for one sequence (``generate`` is a batch of one): only a
    batched audit can see them, which is why the engine audit generates its seeds in batches."""
    from diagnostics.audit.suite import tiny_setup
    from diagnostics.engine import generate

    setup = tiny_setup(DEVICE)
    for name, (_, seams) in BATCH_MUTANTS.items():
        for seed in range(3):
            alone = generate(setup.target, setup.draft, setup.prompt_ids, gamma=3, max_new_tokens=12, seed=seed, seams=seams)
            right = generate(setup.target, setup.draft, setup.prompt_ids, gamma=3, max_new_tokens=12, seed=seed)
            assert alone.tokens == right.tokens, name


def test_engine_level_mutants_are_also_caught_in_a_recorded_run(tmp_path) -> None:
    """The recorded-run audit replays each decision against p recomputed independently."""
    from tiny_models import save_tiny_model

    from diagnostics.audit import ENGINE_MUTANTS, audit_recorded_run
    from diagnostics.models import load_model
    from diagnostics.policy import Policy
    from diagnostics.runner import RunRequest, record_run
    from diagnostics.store import Store

    target = load_model(save_tiny_model(tmp_path / "tiny", seed=0))
    draft = load_model(save_tiny_model(tmp_path / "draft", seed=1))
    store = Store(tmp_path / "runs.duckdb")
    request = RunRequest(prompt="w1 w2 w3 w4", draft=f"model:{draft.name}", gamma=3, max_new_tokens=40, seed=5, raw=True,
                         policy=Policy(top_k=4))
    run_id, _ = record_run(store, target, draft, request)
    assert audit_recorded_run(store, run_id, target).verdict == "pass"  # the control
    for name in ("residual_wrong_position", "truncation_dropped"):
        run_id, _ = record_run(store, target, draft, request, seams=ENGINE_MUTANTS[name][1])
        result = audit_recorded_run(store, run_id, target)
        assert result.verdict == "fail", (name, result.flags)


@pytest.mark.slow  # slow tier: transformers' assisted generation, one sequence at a time (about 50 s)
def test_engine_audit_of_transformers_assisted_generation() -> None:
    """transformers `generate(assistant_model=…, do_sample=True)` on tiny models: the assistant samples
    with the main generation config and verification uses its processed scores, so it passes."""
    from diagnostics.audit.suite import run_engine_audit, tiny_setup

    result = run_engine_audit("transformers", tiny_setup(DEVICE), generations=800)
    assert result.verdict == "pass" and result.impossible == 0, result
    assert result.tokens > 5000 and result.detectable_tv < 0.05


def test_randomized_pit_is_uniform_exactly_under_p_and_not_otherwise() -> None:
    """The engine-level statistic itself: uniform when tokens follow p (ties, zeros, one-hot included),
    pushed toward 1 when they follow a flatter law and toward 0 for a sharper one."""
    from scipy import stats

    from diagnostics.audit import randomized_pit
    from diagnostics.synthetic import dirichlet

    generator = torch.Generator().manual_seed(3)
    laws = [dirichlet(10, 0.5, generator) for _ in range(40)]
    laws[0] = torch.tensor([0.25, 0.25, 0.25, 0.25, 0, 0, 0, 0, 0, 0], dtype=torch.float64)  # ties and zeros
    laws[1] = torch.nn.functional.one_hot(torch.tensor(3), 10).to(torch.float64)

    def pits(sampling_law) -> list[float]:
        values = []
        for law in laws:
            tokens = torch.multinomial(sampling_law(law), 500, replacement=True, generator=generator)
            values += [randomized_pit(law, int(token), generator) for token in tokens]
        return values

    assert stats.kstest(pits(lambda law: law), "uniform").pvalue > 0.01
    flat = pits(lambda law: 0.8 * law + 0.2 * (law > 0) / (law > 0).sum())
    sharp = pits(lambda law: law**2 / (law**2).sum())
    assert stats.kstest(flat, "uniform").pvalue < 1e-6 and sum(flat) / len(flat) > 0.5
    assert stats.kstest(sharp, "uniform").pvalue < 1e-6 and sum(sharp) / len(sharp) < 0.5


def test_audit_command_on_a_local_model_folder(tmp_path, capsys) -> None:
    """`--target PATH`: real positions at the rule level and our engine, with the early-exit draft of that model."""
    import json

    from tiny_models import save_tiny_model

    from diagnostics.cli import main

    folder = save_tiny_model(tmp_path / "tiny", seed=0)
    assert main(["audit", "--target", folder, "--real-positions", "2", "--samples", "5000"]) == 0
    rule = json.loads(capsys.readouterr().out)
    assert rule["verdict"] == "pass" and len(rule["pairs"]) == 8 and "position" in rule["pairs"][-1]["label"]
    assert main(["audit", "--engine", "ours", "--target", folder, "--generations", "30", "--max-new-tokens", "6"]) == 0
    engine = json.loads(capsys.readouterr().out)
    assert engine["verdict"] == "pass" and engine["settings"]["draft"] == "early-exit:1" and engine["generations"] == 30


@pytest.mark.slow  # slow tier: engine audits of the tree engine and each planted tree bug (about 10 s)
def test_tree_engine_audit_passes_ours_and_fails_each_planted_tree_bug(capsys) -> None:
    """``audit --engine ours --tree 3,2,1`` passes; each planted tree bug fails the same audit (the
    unzeroed sibling shows most on a wide node, hence 6,1 for it)."""
    import json

    from diagnostics.audit.mutants import TREE_MUTANTS
    from diagnostics.audit.suite import run_engine_audit, tiny_setup
    from diagnostics.cli import main
    from diagnostics.engine.tree_draft import parse_tree

    assert main(["audit", "--engine", "ours", "--tree", "3,2,1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "pass" and result["settings"]["tree"] == "3,2,1" and result["impossible"] == 0
    setup = tiny_setup(DEVICE)
    for name in TREE_MUTANTS:
        shape = "6,1" if name == "sibling_not_zeroed" else "3,2,1"
        planted = run_engine_audit(name, setup, generations=400, tree=parse_tree(shape))
        assert planted.verdict == "fail" and min(planted.p_value, planted.worst_position_p or 1.0) < 1e-6, (name, planted.reasons)
    assert main(["audit", "--engine", "transformers", "--tree", "3,2,1"]) == 2
    assert "cannot be audited with --tree" in capsys.readouterr().err
    assert main(["audit", "--engine", "flat_position_ids"]) == 2
    assert "audit it with --tree" in capsys.readouterr().err
    assert main(["audit", "--tree", "3,2,1"]) == 2
    assert "--tree audits the tree engine" in capsys.readouterr().err


def test_writing_an_engines_samples_shows_progress_without_a_terminal(tmp_path, capsys) -> None:
    """A long ``--write-samples`` run redirected to a file or CI log says it is alive (everyday, ~2 s
    on the tiny target): stderr is not a terminal here, and the progress lines still come."""
    from diagnostics.cli import main

    out = tmp_path / "ours.jsonl"
    assert main(["audit", "--engine", "ours", "--generations", "20", "--max-new-tokens", "4", "--write-samples", str(out)]) == 0
    err = capsys.readouterr().err
    assert "writing the generations of ours (lossless engine): generation 20/20" in err and "wrote 20 generations" in err
    assert len(out.read_text().splitlines()) == 20


def test_writing_samples_of_a_generator_that_cannot_batch_keeps_each_generation_as_it_comes(tmp_path) -> None:
    """A generator without ``batch`` (transformers' ``generate``: seconds to minutes a seed on the
    embedded model) is written and reported seed by seed, so a run stopped after two seeds leaves
    their two lines and said 1/5, 2/5 (everyday, well under 1 s: no model). Before, the seeds went
    in chunks of 64, so 24 such seeds printed nothing and wrote no file until all were done."""
    from diagnostics.audit.suite import EnginePlan, EngineSetup, engine_samples
    from diagnostics.audit.samples import load_samples
    from diagnostics.policy import Policy

    def generate(prompt_ids: list[int], seed: int) -> list[int]:
        if seed == 2:
            raise KeyboardInterrupt  # the user stops the run during the third generation
        return [3, seed]

    setup = EngineSetup(target=None, draft=None, prompt_ids=[1, 2], eos={11}, description={"prompt": "p"})
    plan = EnginePlan(generate, Policy(), "unbatched", {}, range(5))
    out, reported = tmp_path / "unbatched.jsonl", []
    with pytest.raises(KeyboardInterrupt):
        engine_samples(plan, setup, str(out), progress=lambda done, total: reported.append((done, total)))
    assert reported == [(1, 5), (2, 5)]
    assert [sample.token_ids for sample in load_samples(str(out))] == [[3, 0], [3, 1]]


def test_importing_diagnostics_has_openmp_threads_wait_passively() -> None:
    """``import diagnostics`` sets ``OMP_WAIT_POLICY=PASSIVE`` before torch loads (libgomp reads it
    then), unless the user set a policy (everyday, ~1 s: two bare interpreters). Spinning waits made
    each of torch's parallel ops cost a scheduler slice on a shared 2-core machine: ``audit --engine
    transformers --target default`` took 146 s a generation at load 8 instead of 7.8 s."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    probe = "import sys, os, diagnostics; assert 'torch' not in sys.modules; print(os.environ['OMP_WAIT_POLICY'])"
    clean = {name: value for name, value in os.environ.items() if name != "OMP_WAIT_POLICY"}
    for chosen, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        env = clean if chosen is None else {**clean, "OMP_WAIT_POLICY": chosen}
        answer = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
                                cwd=Path(__file__).resolve().parents[1])
        assert answer.stdout.strip() == expected
