"""Sweeps: plans, prompt sets, running and resuming into the store, and statistics whose
aggregates equal what the stored runs say (computed here by hand) and whose intervals cover."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from diagnostics.engine import EngineError
from diagnostics.evaluation.plan import expand_rule, unit_members
from diagnostics.evaluation.prompts import PromptSetError, load_prompts, score
from diagnostics.evaluation.stats import bootstrap_mean, summarise_sweep, sweep_table
from diagnostics.evaluation.sweeper import expand_rules, run_sweep, settings_of
from diagnostics.metrics import log_likelihood
from diagnostics.models import load_model
from diagnostics.runner import RunRequest
from diagnostics.store import Store

PROMPTS = [
    {"id": "a", "prompt": "w1 w2 w3", "checker": {"type": "regex", "pattern": "w2"}},
    {"id": "b", "prompt": "w3 w1 w2 w3"},
    {"id": "c", "prompt": "w2 w2 w1", "checker": {"type": "exact", "answer": "w1"}},
]


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "tiny.jsonl"
    path.write_text("\n".join(json.dumps(item) for item in PROMPTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_folder3(tmp_path_factory) -> str:
    from tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny3") / "m", seed=0, layers=3)


@pytest.fixture(scope="module")
def tiny_target(tiny_folder3: str):
    return load_model(tiny_folder3)


def _settings(prompt_file: Path, rules: list[str], seeds: int = 2) -> dict:
    base = RunRequest(prompt="-", draft="early-exit:2", gamma=3, max_new_tokens=8, raw=True)
    return {**settings_of(load_prompts(prompt_file), expand_rules(rules), seeds, base, str(prompt_file)), "target": "tiny"}


def test_rule_ranges_and_members() -> None:
    assert expand_rule("lenience:0.2..1.0:5") == ["lenience:0.2", "lenience:0.4", "lenience:0.6", "lenience:0.8", "lenience:1"]
    assert expand_rule("medusa:0.05..0.1:2,0.3") == ["medusa:0.05,0.3", "medusa:0.1,0.3"]
    for bad, fragment in (("lenience:0.2..1.0", "LOW..HIGH:COUNT"), ("lenience:0..1:3", "out of range"),
                          ("medusa:0.1..0.2:2,0.1..0.3:2", "only one parameter"), ("lenience:0.2..1:99", "1 to 50")):
        with pytest.raises(Exception, match=fragment):
            expand_rule(bad)
    members = unit_members(RunRequest(prompt="x"), ["lenience:0.5", "cascade:0.3", "typical:0.2"])
    assert [(m.role, m.label) for m in members] == [
        ("lossless", "lossless"), ("rule", "lenience:0.5"), ("rule", "cascade:0.3"), ("baseline", "baseline of cascade:0.3"),
        ("rule", "typical:0.2"), ("baseline", "baseline of typical:0.2")]
    assert members[3].request.policy.min_p == 0.3 and members[5].request.policy.eta == 0.2
    assert members[3].request.draft_policy.min_p is None  # the baseline verifies the same drafts
    medusa = unit_members(RunRequest(prompt="x"), ["medusa:0.09,0.3"])
    assert [(m.role, m.label) for m in medusa] == [("lossless", "lossless"), ("rule", "medusa:0.09,0.3"),
                                                   ("baseline", "baseline of medusa:0.09,0.3")]
    assert (medusa[2].request.policy.medusa_eps, medusa[2].request.policy.medusa_delta) == (0.09, 0.3)
    assert medusa[2].request.draft_policy.medusa_eps is None
    with pytest.raises(EngineError, match="at least one --rule"):
        expand_rules([])


def test_prompt_files_are_checked_with_one_line_errors(tmp_path: Path) -> None:
    assert len(load_prompts("general")) >= 20
    cases = {
        "not json": ("{oops", "line 1 is not JSON"),
        "no prompt": ('{"id": "x"}', 'line 1: each line needs a non-empty "prompt"'),
        "twice": ('{"id": "x", "prompt": "a"}\n{"id": "x", "prompt": "b"}', "line 2: the id 'x' is used twice"),
        "bad checker": ('{"prompt": "a", "checker": {"type": "fuzzy"}}', "checker must be an object with type exact or regex"),
        "bad regex": ('{"prompt": "a", "checker": {"type": "regex", "pattern": "("}}', "is not valid RE2 syntax"),
        "backreference": ('{"prompt": "a", "checker": {"type": "regex", "pattern": "(a)\\\\1"}}', "RE2 has no backreferences"),
        "regex not text": ('{"prompt": "a", "checker": {"type": "regex", "pattern": 7}}', 'needs a non-empty "pattern" string'),
        "exact without answer": ('{"prompt": "a", "checker": {"type": "exact"}}', 'needs a non-empty "answer" string'),
        "unknown task": ('{"prompt": "a", "checker": {"type": "humaneval", "task_id": "HumanEval/999"}}', 'known "task_id"'),
        "empty": ("\n\n", "holds no prompts"),
    }
    for name, (text, fragment) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(PromptSetError, match=fragment):
            load_prompts(path)
    with pytest.raises(PromptSetError, match="shipped set: general"):
        load_prompts(tmp_path / "missing.jsonl")


def test_regex_checkers_take_linear_time(tmp_path: Path) -> None:
    """A pattern that backtracks catastrophically in Python's ``re`` (``(a+)+$`` on a run of a's and
    one other letter: 2^n steps) is matched by RE2 in time linear in the output."""
    import time

    path = tmp_path / "redos.jsonl"
    path.write_text(json.dumps({"prompt": "say a", "checker": {"type": "regex", "pattern": "^(a+)+$"}}) + "\n", encoding="utf-8")
    checker = load_prompts(path)[0].checker
    started = time.monotonic()
    assert score(checker, "a" * 200_000 + "!") == 0.0 and score(checker, "A" * 50) == 1.0
    assert time.monotonic() - started < 1.0


def test_sweep_aggregates_equal_the_stored_runs(prompt_file: Path, tiny_target, tmp_path: Path) -> None:
    """Every figure of the summary is recomputed here from the stored runs and positions alone."""
    store = Store(tmp_path / "runs.duckdb")
    settings = _settings(prompt_file, ["lenience:0.5", "cascade:0.3"])
    sweep_id = run_sweep(store, tiny_target, "early-exit:2", settings)
    sweep = store.get_sweep(sweep_id)
    assert sweep["status"] == "complete" and sweep["units"] == sweep["units_done"] == 6
    linked = store.sweep_runs(sweep_id)
    assert len(linked) == 6 * 4 and set(linked["role"]) == {"lossless", "rule", "baseline"}
    table = sweep_table(store, sweep_id, cost=0.5)
    summaries = {summary.label: summary for summary in summarise_sweep(table)}

    def by_hand(label: str, column: str, reduce) -> dict[int, float]:
        values = {}
        for row in linked[linked["label"] == label].itertuples():
            positions = store.positions(row.run_id)
            values[int(row.unit)] = reduce(positions[column])
        return values

    tv = by_hand("lenience:0.5", "tv_baseline", lambda column: float(column.mean()))
    assert summaries["lenience:0.5"].figures["TV(P, baseline)"][0] == pytest.approx(np.mean(list(tv.values())), abs=1e-12)
    mine = by_hand("cascade:0.3", "p_token", log_likelihood)
    theirs = by_hand("baseline of cascade:0.3", "p_token", log_likelihood)
    lossless = by_hand("lossless", "p_token", log_likelihood)
    cascade = summaries["cascade:0.3"]
    assert cascade.against == "baseline of cascade:0.3"
    assert cascade.differences["log-likelihood"][0] == pytest.approx(np.mean([mine[u] - theirs[u] for u in mine]), abs=1e-9)
    assert cascade.versus_lossless["log-likelihood"][0] == pytest.approx(np.mean([mine[u] - lossless[u] for u in mine]), abs=1e-9)
    assert summaries["lenience:0.5"].against == "lossless"  # its baseline is p: the lossless run
    kl = by_hand("lenience:0.5", "kl_target", lambda column: float(column.sum()))
    assert summaries["lenience:0.5"].figures["path KL"][0] == pytest.approx(np.mean(list(kl.values())), abs=1e-12)
    # Each run's checker score was stored when its unit finished: the checker on its output.
    checkers = {item["id"]: item.get("checker") for item in PROMPTS}
    for row in linked.itertuples():
        expected = score(checkers[row.prompt_id], row.output_text) if checkers[row.prompt_id] else None
        assert (row.score if row.score == row.score else None) == expected, row
    assert linked["score"].notna().sum() == 4 * 4 and set(linked["score"].dropna()) <= {0.0, 1.0}
    accuracy = table[table["label"] == "lenience:0.5"]["accuracy"].dropna()
    assert summaries["lenience:0.5"].figures["accuracy"][0] == pytest.approx(accuracy.mean()) and len(accuracy) == 4
    # Accuracy: the checkers of prompts a (regex) and c (exact), on the stored output texts.
    runs = {row.run_id: store.get_run(row.run_id) for row in linked.itertuples()}
    expected = []
    for row in linked[linked["label"] == "lossless"].itertuples():
        text = runs[row.run_id]["output_text"] or ""
        if row.prompt_id == "a":
            expected.append(100.0 * ("w2" in text.lower()))
        elif row.prompt_id == "c":
            expected.append(100.0 * (text.strip().strip(".!?;:,\"'").strip().casefold() == "w1"))
    assert summaries["lossless"].figures["accuracy"][0] == pytest.approx(np.mean(expected))
    lo, mean, hi = (summaries["lenience:0.5"].figures["TV(P, baseline)"][index] for index in (1, 0, 2))
    assert lo <= mean <= hi
    assert "lenience:0.5: distortion" in summaries["lenience:0.5"].verdict()


@pytest.mark.slow  # slow tier: a sweep stopped and resumed (about 12 s)
def test_a_stopped_sweep_resumes_to_the_same_tokens(prompt_file: Path, tiny_target, tmp_path: Path) -> None:
    """Stopped mid-batch (some units done, the rows in flight interrupted, the rest never started),
    resumed: the missing units run, the partial ones again from the start, and every unit's tokens
    equal those of a sweep never stopped, run one unit at a time."""
    settings = _settings(prompt_file, ["lenience:0.5"])
    whole = Store(tmp_path / "whole.duckdb")
    reference = run_sweep(whole, tiny_target, "early-exit:2", settings, batch_size=2)
    stopped = Store(tmp_path / "stopped.duckdb")
    def stop() -> bool:  # polled between rounds: two units (4 rows) in flight, stop once a seventh row has started
        return len(stopped.list_runs()) >= 7

    sweep_id = run_sweep(stopped, tiny_target, "early-exit:2", settings, should_stop=stop, batch_size=4)
    partial = stopped.get_sweep(sweep_id)
    assert partial["status"] == "interrupted" and 1 <= partial["units_done"] < 6
    assert "interrupted" in set(stopped.list_runs()["status"]) and len(stopped.list_runs()) < 12
    run_sweep(stopped, tiny_target, "early-exit:2", stopped.get_sweep(sweep_id)["settings"], sweep_id=sweep_id)
    assert stopped.get_sweep(sweep_id)["status"] == "complete" and stopped.get_sweep(sweep_id)["units_done"] == 6

    def tokens(store: Store, sid: str) -> dict[tuple[int, str], list[int]]:
        return {(int(row.unit), row.label): list(store.get_run(row.run_id)["tokens"]) for row in store.sweep_runs(sid).itertuples()}

    assert tokens(stopped, sweep_id) == tokens(whole, reference)
    assert len(stopped.sweep_runs(sweep_id)) == 12 and set(stopped.sweep_runs(sweep_id)["status"]) == {"complete"}
    assert len(stopped.list_runs()) == 12  # the interrupted rows were dropped on resume

    # Ctrl-C mid-unit: runs of a unit that ended are stored before the unit could be linked;
    # resume drops them (found by the unit's group) with the interrupted ones, and runs the unit again.
    broken = Store(tmp_path / "broken.duckdb")
    def interrupt() -> bool:
        if len(broken.list_runs()) >= 4 and broken.list_runs()["status"].eq("running").any():
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):  # one run at a time: the first unit is done and linked before the fourth run
        run_sweep(broken, tiny_target, "early-exit:2", settings, should_stop=interrupt, batch_size=1)
    interrupted_id = broken.list_sweeps()["sweep_id"].iloc[0]
    assert broken.get_sweep(interrupted_id)["status"] == "interrupted" and len(broken.list_runs()) == 4
    assert len(broken.sweep_runs(interrupted_id)) == 2  # unit 2's runs were never linked
    assert set(broken.list_runs()["status"]) == {"complete", "interrupted"}
    run_sweep(broken, tiny_target, "early-exit:2", broken.get_sweep(interrupted_id)["settings"], sweep_id=interrupted_id)
    assert tokens(broken, interrupted_id) == tokens(whole, reference)
    assert len(broken.list_runs()) == 12  # no orphan left behind


@pytest.mark.slow  # slow tier: a sweep command killed and resumed (about 15 s)
def test_a_killed_sweep_command_resumes_to_the_same_tokens(prompt_file: Path, tiny_folder3: str, tiny_target, tmp_path: Path) -> None:
    """``sweep`` killed with SIGKILL after two units: ``--resume`` runs the rest, and every unit's
    tokens equal an uninterrupted sweep's; nothing the kill left half-written remains."""
    import os
    import signal
    import subprocess
    import sys

    from diagnostics.cli import main

    db = tmp_path / "killed.duckdb"
    command = [sys.executable, "-m", "diagnostics", "sweep", "--prompts", str(prompt_file), "--rule", "lenience:0.5",
               "--rule", "cascade:0.3", "--seeds", "2", "--target", tiny_folder3, "--draft", "early-exit:2",
               "--max-new-tokens", "24", "--raw", "--db", str(db), "--cost", "0.5"]
    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen(command, cwd=root, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                             env={**os.environ, "PYTHONPATH": str(root)})
    lines = []
    for line in child.stderr:
        lines.append(line)
        if "unit 2/6 done" in line:
            child.send_signal(signal.SIGKILL)
            break
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL, "".join(lines)
    sweep_id = lines[0].split()[1].rstrip(":")
    killed = Store(db)
    assert killed.get_sweep(sweep_id)["status"] == "running"  # a kill leaves no chance to say otherwise
    assert main(["sweep", "--resume", sweep_id, "--target", tiny_folder3, "--db", str(db), "--cost", "0.5"]) == 0
    assert killed.get_sweep(sweep_id)["status"] == "complete"
    whole = Store(tmp_path / "whole.duckdb")
    reference = run_sweep(whole, tiny_target, "early-exit:2", killed.get_sweep(sweep_id)["settings"])

    def tokens(store: Store, sid: str) -> dict[tuple[int, str], list[int]]:
        return {(int(row.unit), row.label): list(store.get_run(row.run_id)["tokens"]) for row in store.sweep_runs(sid).itertuples()}

    assert tokens(killed, sweep_id) == tokens(whole, reference)
    assert len(killed.list_runs()) == 6 * 4 and set(killed.list_runs()["status"]) == {"complete"}


@pytest.mark.slow  # slow tier: starts a Ray cluster and kills a worker (about 30 s)
def test_a_sweep_on_ray_gives_the_same_records_and_survives_a_lost_worker(prompt_file: Path, tiny_folder3: str, tiny_target,
                                                                         tmp_path: Path, monkeypatch, capsys) -> None:
    """``sweep --ray --workers 2`` (a local Ray): every stored record of every run (positions, tree
    rounds and nodes, summaries) equals the in-process sweep's, bit for bit, although the worker
    running unit 1 dies (it exits the first time) and the unit is run again on a new worker."""
    from diagnostics.cli import main
    from diagnostics.evaluation.distributed import CRASH_ONCE

    marker = tmp_path / "crashed"
    monkeypatch.setenv(CRASH_ONCE, f"{marker}:1")
    db = tmp_path / "ray.duckdb"
    status = main(["sweep", "--prompts", str(prompt_file), "--rule", "lenience:0.5", "--rule", "cascade:0.3", "--seeds", "2",
                   "--target", tiny_folder3, "--draft", "early-exit:2", "--tree", "2,1", "--max-new-tokens", "8", "--raw",
                   "--db", str(db), "--cost", "0.5", "--ray", "--workers", "2", "--no-progress"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert marker.exists()  # a worker did die
    on_ray = Store(db)
    sweep_id = json.loads(out.strip().splitlines()[-1])["sweep_id"]
    assert on_ray.get_sweep(sweep_id)["status"] == "complete"
    local = Store(tmp_path / "local.duckdb")
    # A worker computes with one thread; so does the reference here. A Ray worker runs each unit as
    # its own batch, the local sweep one continuous batch of every unit's members: the tokens, kinds
    # and counts agree exactly, the floats to the rounding of batched float32 products (~1e-6).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reference = run_sweep(local, tiny_target, "early-exit:2", on_ray.get_sweep(sweep_id)["settings"])
    finally:
        torch.set_num_threads(threads)

    def records(store: Store, sid: str) -> dict[tuple[int, str], tuple]:
        found = {}
        for row in store.sweep_runs(sid).itertuples():
            run = store.get_run(row.run_id)
            summary = {key: run[key] for key in ("tokens", "output_text", "drafted", "accepted", "target_passes", "status",
                                                   "mean_tv_target", "mean_tv_baseline", "divergence_position", "tree")}
            tables = [frame.drop(columns=["run_id"]).reset_index(drop=True) for frame in
                      (store.positions(row.run_id), store.tree_rounds(row.run_id), store.tree_nodes(row.run_id))]
            found[(int(row.unit), row.label)] = (summary, tables)
        return found

    assert len(on_ray.list_runs()) == 6 * 4
    ours, theirs = records(on_ray, sweep_id), records(local, reference)
    assert ours.keys() == theirs.keys()
    for key in ours:
        for name, value in ours[key][0].items():
            other = theirs[key][0][name]
            if isinstance(value, float) and isinstance(other, float):
                assert value == pytest.approx(other, rel=1e-4, abs=1e-6), (key, name)
            else:
                assert json.dumps(value, default=str) == json.dumps(other, default=str), (key, name)
        for table, expected in zip(ours[key][1], theirs[key][1]):
            pd.testing.assert_frame_equal(table, expected, check_exact=False, rtol=1e-4, atol=1e-6, obj=f"{key}")
    assert sum(len(nodes) for _summary, (_positions, _rounds, nodes) in ours.values()) > 100


def test_bootstrap_interval_covers_a_known_difference() -> None:
    """A synthetic paired difference with prompt effects and seed noise: the 95% interval covers
    the true mean in 88–99% of 200 repetitions (binomial band around the nominal 95%)."""
    generator = np.random.default_rng(1)
    covered = 0
    for repetition in range(200):
        prompts = np.repeat(np.arange(30), 3)
        effects = generator.normal(0.0, 0.5, 30)[prompts]
        values = 0.25 + effects + generator.normal(0.0, 0.3, prompts.size)
        _, low, high = bootstrap_mean(pd.Series(values), pd.Series(prompts), resamples=800, seed=repetition)
        covered += low <= 0.25 <= high
    assert 176 <= covered <= 198, covered


def test_sweep_command_prints_figures_and_verdicts(prompt_file: Path, tiny_folder3: str, tmp_path: Path, capsys) -> None:
    from diagnostics.cli import main

    folder = tiny_folder3
    db = tmp_path / "cli.duckdb"
    status = main(["sweep", "--prompts", str(prompt_file), "--rule", "lenience:0.4..0.8:2", "--seeds", "1", "--target", folder,
                   "--draft", "early-exit:2", "--max-new-tokens", "6", "--raw", "--db", str(db), "--cost", "0.5", "--no-progress"])
    out, err = capsys.readouterr()
    assert status == 0
    payload = json.loads(out.strip().splitlines()[-1])
    assert payload["status"] == "complete" and payload["units"] == 3 and payload["cost_ratio"] == 0.5
    assert [row["label"] for row in payload["settings"]] == ["lossless", "lenience:0.4", "lenience:0.8"]
    assert err.count("distortion") == 2
    assert main(["sweep", "--resume", payload["sweep_id"], "--target", folder, "--db", str(db), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sweep", "--rule", "lenience:0.5", "--db", str(db)]) == 2
    assert "pass --prompts FILE" in capsys.readouterr().err
    assert main(["sweep", "--resume", "nope", "--db", str(db)]) == 2
    assert "there is no sweep 'nope'" in capsys.readouterr().err
    assert main(["sweep", "--prompts", str(prompt_file), "--rule", "lenience:0.5", "--limit", "0", "--db", str(db)]) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err
    assert main(["sweep", "--prompts", str(prompt_file), "--rule", "lenience:0.5", "--workers", "2", "--db", str(db)]) == 2
    assert "--workers N needs --ray" in capsys.readouterr().err
    assert main(["sweep", "--prompts", str(prompt_file), "--rule", "lenience:0.5", "--threads", "0", "--db", str(db)]) == 2
    assert "--threads must be at least 1" in capsys.readouterr().err
    # Ray is imported only by a sweep that asks for it.
    import subprocess
    import sys

    probe = ("import sys, diagnostics.cli, diagnostics.evaluation.sweeper, diagnostics.evaluation.stats\n"
             "assert 'ray' not in sys.modules, 'ray imported'")
    assert subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parent.parent).returncode == 0


def test_sweep_page_shows_the_pareto_chart_table_and_verdicts(prompt_file: Path, tiny_target, tmp_path: Path, monkeypatch) -> None:
    from app_support import open_page

    db = tmp_path / "page.duckdb"
    store = Store(db)
    sweep_id = run_sweep(store, tiny_target, "early-exit:2", _settings(prompt_file, ["lenience:0.5", "cascade:0.3"], seeds=1))
    monkeypatch.setenv("SPECLAB_DB", str(db))
    at = open_page("views/sweep.py", {"sweep": sweep_id})
    assert at.title[0].value == "Sweeps" and not at.exception
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert {trace.get("name") for trace in chart["data"]} == {"rule", "baseline", "lossless"}
    table = at.dataframe[0].value
    assert list(table["setting"]) == ["lossless", "lenience:0.5", "cascade:0.3", "baseline of cascade:0.3"]
    # Speed and quality in two tables that each fit a window (one was wider than 1400 px).
    assert list(table.columns) == ["setting", "role", "units", "modelled speed-up", "acceptance"]
    assert list(at.dataframe[1].value.columns)[:5] == ["setting", "TV(P, baseline)", "TV(P, p)", "path KL", "log-likelihood"]
    assert sum("distortion" in markdown.value for markdown in at.markdown) == 2
    at.radio(key="sweep_axis").set_value("accuracy").run()
    assert not at.exception
    links = [markdown.value for markdown in at.markdown if "/inspect?run=" in markdown.value]
    assert len(links) == 3  # one per unit of the chosen setting


def test_a_humaneval_sweep_checks_in_the_sandbox_or_refuses_before_anything_runs(tiny_target, tiny_folder3: str, tmp_path: Path,
                                                                                 monkeypatch, capsys) -> None:
    """A sweep whose checker runs generated code stores each run's sandboxed score; where bubblewrap
    is missing it refuses in one line before any model work or row."""
    import diagnostics.evaluation.sandbox as sandbox
    from test_sandbox import require_sandbox, sandbox_turn

    from diagnostics.cli import main
    from diagnostics.evaluation.sandbox import SandboxUnavailable

    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps({"id": "he0", "prompt": "w1 w2 w3", "checker": {"type": "humaneval", "task_id": "HumanEval/0"}}) + "\n",
                    encoding="utf-8")
    store = Store(tmp_path / "he.duckdb")
    sandbox.sandbox_problem.cache_clear()
    monkeypatch.setattr(sandbox, "BWRAP", "bwrap-not-installed")
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_sweep(store, tiny_target, "early-exit:2", _settings(path, ["lenience:0.5"], seeds=1))
    assert store.list_sweeps().empty and store.list_runs().empty
    capsys.readouterr()
    assert main(["sweep", "--prompts", str(path), "--rule", "lenience:0.5", "--target", tiny_folder3,
                 "--draft", "early-exit:2", "--raw", "--db", str(tmp_path / "cli.duckdb")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: generated code runs only inside bubblewrap") and error.count("\n") == 1, error
    assert Store(tmp_path / "cli.duckdb").list_sweeps().empty
    monkeypatch.undo()
    sandbox.sandbox_problem.cache_clear()
    with sandbox_turn():  # never while test_sandbox counts sandboxed programs in another worker
        require_sandbox()
        sweep_id = run_sweep(store, tiny_target, "early-exit:2", _settings(path, ["lenience:0.5"], seeds=1))
    linked = store.sweep_runs(sweep_id)
    assert len(linked) == 2 and linked["score"].tolist() == [0.0, 0.0]  # a 3-layer random model writes no working code


def _forbid_checking(monkeypatch) -> list[str]:
    """Make any checker or sandbox call record itself (and fail): pages and reports must not check."""
    import diagnostics.evaluation.answers as answers
    import diagnostics.evaluation.prompts as prompts
    import diagnostics.evaluation.sandbox as sandbox

    calls: list[str] = []

    def forbidden(name: str):
        def call(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} ran")
        return call

    for module, name in ((prompts, "score"), (answers, "score"), (sandbox, "run_program"), (sandbox, "_run")):
        monkeypatch.setattr(module, name, forbidden(f"{module.__name__}.{name}"))
    return calls


def test_pages_and_reports_read_stored_scores_and_check_answers_only_when_asked(prompt_file: Path, tiny_target, tmp_path: Path,
                                                                             monkeypatch, capsys) -> None:
    """Opening a sweep (page, report, CLI figures) reads the scores stored when its units ran and
    never runs a checker. A sweep without stored scores (an older version's) shows "Check the
    answers"; the click scores its runs: stored in the user's own database, kept for the session
    only in a shared (read-only) file, which stays byte-identical."""
    import shutil

    from app_support import open_page

    from diagnostics.cli import main
    from diagnostics.report import build_report

    db = tmp_path / "mine.duckdb"
    store = Store(db)
    sweep_id = run_sweep(store, tiny_target, "early-exit:2", _settings(prompt_file, ["lenience:0.5"], seeds=1))
    stored = sweep_table(store, sweep_id, 0.5)["accuracy"]
    calls = _forbid_checking(monkeypatch)
    assert sweep_table(store, sweep_id, 0.5)["accuracy"].equals(stored) and stored.notna().sum() == 4
    assert "Sweep " in build_report(store, [], sweep_ids=[sweep_id])
    assert main(["report", "--sweep", sweep_id, "--db", str(db), "-o", str(tmp_path / "r.html")]) == 0
    monkeypatch.setenv("SPECLAB_DB", str(db))
    at = open_page("views/sweep.py", {"sweep": sweep_id})
    assert not any(button.key == "sw_recheck" for button in at.button)  # every score is stored
    assert calls == []

    import duckdb

    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE sweep_runs SET score = NULL")
    shared = tmp_path / "shared.duckdb"
    shutil.copyfile(db, shared)
    before = shared.read_bytes()
    assert sweep_table(store, sweep_id, 0.5)["accuracy"].isna().all() and calls == []
    at = open_page("views/sweep.py", {"sweep": sweep_id})
    assert any("4 finished runs of this sweep have no stored answer score" in info.value for info in at.info) and calls == []
    monkeypatch.undo()  # the user's click may run the checkers
    monkeypatch.setenv("SPECLAB_DB", str(db))
    at.button(key="sw_recheck").click().run()
    assert not at.exception and sweep_table(store, sweep_id, 0.5)["accuracy"].equals(stored)
    assert not any(button.key == "sw_recheck" for button in at.button)

    at = AppTest_with_shared(shared, sweep_id)
    assert any("no stored answer score" in info.value for info in at.info)
    at.button(key="sw_recheck").click().run()
    assert not at.exception and not any(button.key == "sw_recheck" for button in at.button)
    assert "accuracy" in [radio.options for radio in at.radio if radio.key == "sweep_axis"][0]
    assert shared.read_bytes() == before  # a shared file is never written
    with duckdb.connect(str(db)) as con:  # the command line's re-check, on the user's own database
        con.execute("UPDATE sweep_runs SET score = NULL")
    capsys.readouterr()
    assert main(["sweep", "--check-answers", sweep_id, "--db", str(db)]) == 0
    assert "4 runs checked" in capsys.readouterr().err and sweep_table(store, sweep_id, 0.5)["accuracy"].equals(stored)


def test_unusable_settings_in_the_users_own_database_are_one_line_everywhere(prompt_file: Path, tiny_target, tmp_path: Path,
                                                                          monkeypatch, capsys) -> None:
    """The user's own database is not checked value by value on open, so reading a sweep checks its
    settings: a sweep whose settings were damaged is one red line on the page and on the command line."""
    import duckdb
    from app_support import open_page

    from diagnostics.cli import main

    db = tmp_path / "own.duckdb"
    sweep_id = run_sweep(Store(db), tiny_target, "early-exit:2", _settings(prompt_file, ["lenience:0.5"], seeds=1))
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE sweeps SET settings = '{\"prompts\": 3}'")
    monkeypatch.setenv("SPECLAB_DB", str(db))
    at = open_page("views/sweep.py", {"sweep": sweep_id})
    assert any("have no prompts" in error.value for error in at.error)
    capsys.readouterr()
    assert main(["sweep", "--resume", sweep_id, "--db", str(db)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def AppTest_with_shared(path: Path, sweep_id: str):
    """The Sweeps page with ``path`` opened read-only, as the Runs page's import leaves it."""
    from app_support import APP
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["shared_db"] = str(path)
    at.query_params["sweep"] = sweep_id
    at.run()
    at.switch_page("views/sweep.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_a_sweep_goes_into_the_report(prompt_file: Path, tiny_target, tmp_path: Path, capsys) -> None:
    """``report --sweep ID``: the Pareto chart, every setting's figures with intervals, the verdicts;
    untrusted prompt-file text is escaped."""
    from diagnostics.cli import main

    hostile = tmp_path / "<img src=x onerror=alert(1)>.jsonl"  # the file name is shown in the report
    hostile.write_text(json.dumps({"id": "<script>alert(1)</script>", "prompt": "w1 w2 w3"}) + "\n", encoding="utf-8")
    store = Store(tmp_path / "report.duckdb")
    sweep_id = run_sweep(store, tiny_target, "early-exit:2", _settings(hostile, ["cascade:0.3"], seeds=2))
    output = tmp_path / "sweep.html"
    assert main(["report", "--sweep", sweep_id, "--db", str(store.path), "-o", str(output), "--cost", "0.25"]) == 0
    text = output.read_text(encoding="utf-8")
    assert f"Sweep {sweep_id}" in text and "cost ratio c = 0.25" in text and "cascade:0.3: distortion" in text
    assert "<img src=x" not in text and "&lt;img src=x onerror=alert(1)&gt;.jsonl" in text and "baseline of cascade:0.3" in text
    # Without --cost: the cost ratio stored with the sweep, as the CLI and the Sweeps page use it.
    from diagnostics.evaluation.settings import stored_cost

    stored = stored_cost(store.get_sweep(sweep_id)["settings"])
    assert stored is not None
    assert main(["report", "--sweep", sweep_id, "--db", str(store.path), "-o", str(output)]) == 0
    assert f"cost ratio c = {stored[0]:g} (" in output.read_text(encoding="utf-8") and "stored with the sweep" in output.read_text(encoding="utf-8")
    assert main(["report", "--sweep", "nope", "--db", str(store.path), "-o", str(output)]) == 2
    assert "there is no sweep 'nope'" in capsys.readouterr().err


def test_the_cli_and_the_report_take_one_c_and_one_phrase_with_and_without_a_stored_one(prompt_file: Path, tiny_target,
                                                                                         tmp_path: Path, capsys) -> None:
    """``resolve_cost`` is the one rule: the CLI's printout and the report give the same c with the
    same phrase for a sweep with a stored c, for an older sweep stored without one (before, the CLI
    used 0, the report 0.5 and the raw source key), and with ``--cost``."""
    import html

    import duckdb

    from diagnostics.cli.sweep import _print_sweep
    from diagnostics.evaluation.settings import NO_STORED_COST, resolve_cost, stored_cost
    from diagnostics.report import sweep_section

    store = Store(tmp_path / "c.duckdb")
    sweep_id = run_sweep(store, tiny_target, "early-exit:2", _settings(prompt_file, ["cascade:0.3"], seeds=1))

    def cli_and_report(given: float | None) -> tuple[tuple[float, str], str]:
        capsys.readouterr()
        assert _print_sweep(store, sweep_id, given) == 0
        printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        return (printed["cost_ratio"], printed["cost_ratio_source"]), sweep_section(store, sweep_id, 0, given)

    stored = stored_cost(store.get_sweep(sweep_id)["settings"])
    assert stored is not None and stored[1] == "measured"
    (c, phrase), section = cli_and_report(None)
    assert (c, phrase) == resolve_cost(store.get_sweep(sweep_id)["settings"], None) and c == stored[0]
    assert phrase == "stored with the sweep: measured on the machine that ran the sweep"
    assert f"cost ratio c = {c:g} ({html.escape(phrase)})" in section
    (c, phrase), section = cli_and_report(0.25)
    assert (c, phrase) == (0.25, "--cost of this command") and f"cost ratio c = 0.25 ({html.escape(phrase)})" in section

    with duckdb.connect(str(store.path)) as con:  # issue 45's c, measured on a busy machine: flagged in the report
        settings = json.loads(con.execute("SELECT settings FROM sweeps").fetchone()[0])
        con.execute("UPDATE sweeps SET settings = ?", [json.dumps({**settings, "cost": {"ratio": 1.7274, "source": "measured"}})])
    assert "Cost ratio: c = 1.73 is impossible for an early exit" in cli_and_report(None)[1]
    with duckdb.connect(str(store.path)) as con:  # the sweep as an older version stored it: no c
        settings.pop("cost")
        con.execute("UPDATE sweeps SET settings = ?", [json.dumps(settings)])
    (c, phrase), section = cli_and_report(None)
    assert c == NO_STORED_COST and phrase.startswith("none stored with this older sweep")
    assert f"cost ratio c = {c:g} ({html.escape(phrase)})" in section and "0.5" not in phrase
    with pytest.raises(ValueError, match="--cost must be a number from 0 to 1000"):
        resolve_cost(settings, 1001.0)


def test_sweep_page_launches_a_sweep_and_resumes_a_stopped_one(prompt_file: Path, tiny_folder3: str, tiny_target, tmp_path: Path,
                                                              monkeypatch) -> None:
    """The launch form plans the sweep (units × coupled runs), runs it in the page and shows it; an
    interrupted sweep gets a Resume button that runs only its missing units."""
    from app_support import open_page

    db = tmp_path / "launch.duckdb"
    monkeypatch.setenv("SPECLAB_DB", str(db))
    at = open_page("views/sweep.py")
    assert any("No sweeps yet" in info.value for info in at.info)
    at.selectbox(key="sw_set").set_value("a JSONL file").run()
    at.text_input(key="sw_file").set_value(str(prompt_file))
    at.text_input(key="sw_target").set_value(tiny_folder3).run()
    at.number_input(key="sw_limit").set_value(2)
    at.number_input(key="sw_seeds").set_value(1)
    at.text_input(key="sw_rules").set_value("lenience:0.5, cascade:0.3")
    at.number_input(key="sw_max_tokens").set_value(6)
    at.checkbox(key="sw_raw").set_value(True).run()
    assert not at.exception
    assert any("2 units (prompt × seed) × 4 coupled runs = 8 runs" in caption.value for caption in at.caption), (
        [c.value for c in at.caption], [e.value for e in at.error])
    at.button(key="sw_start").click().run()
    assert not at.exception, [e.value for e in at.exception]
    store = Store(db, read_only=True)
    sweeps = store.list_sweeps()
    assert len(sweeps) == 1 and sweeps["status"].iloc[0] == "complete" and sweeps["units_done"].iloc[0] == 2
    assert len(store.sweep_runs(sweeps["sweep_id"].iloc[0])) == 8
    assert at.dataframe and list(at.dataframe[0].value["setting"])[:2] == ["lossless", "lenience:0.5"]

    settings = store.get_sweep(sweeps["sweep_id"].iloc[0])["settings"]
    writer = Store(db)
    def stop() -> bool:  # the page's sweep is done; stop this one as soon as its first unit is
        return int((writer.list_sweeps()["units_done"] >= 1).sum()) >= 2

    stopped_id = run_sweep(writer, tiny_target, "early-exit:2", settings, should_stop=stop, batch_size=1)  # one run at a time
    assert writer.get_sweep(stopped_id)["status"] == "interrupted"
    at = open_page("views/sweep.py", {"sweep": stopped_id})
    assert any("interrupted with 1 of 2 units" in warning.value for warning in at.warning)
    at.button(key="sw_resume").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert writer.get_sweep(stopped_id)["status"] == "complete" and len(writer.sweep_runs(stopped_id)) == 8


def _speedups(rows: list[dict]) -> dict[str, str]:
    """Each setting's modelled speed-up as the Sweeps page's table formats it (3 decimals)."""
    return {row["label"]: f"{row['modelled speed-up'][0]:.3f}" for row in rows}


def test_the_page_and_the_cli_model_speed_ups_with_the_c_stored_with_the_sweep(prompt_file: Path, tiny_folder3: str, tmp_path: Path,
                                                                              monkeypatch, capsys) -> None:
    """A sweep stores the c it measured before its first unit; the CLI prints its figures with it, a
    resume prints the same c without measuring again, ``--cost`` overrides the printout only, and
    the Sweeps page starts from the stored c (nothing measured, no model loaded) with the CLI's
    speed-ups. A re-measured c is labelled as such and gives other speed-ups: the old page's
    behaviour, the negative control. An older sweep stored without c gets one on resume."""
    import duckdb
    from app_support import open_page

    import diagnostics.cost
    import views.common
    from diagnostics.cli import main

    measured: list[object] = []

    def fake_ratio(_target, drafter, _context, steps: int = 5) -> float:
        measured.append(drafter)
        return 0.42137  # stored rounded to 4 decimals

    def forbidden(*_args, **_kwargs) -> float:
        raise AssertionError("the page re-measured c")

    monkeypatch.setattr(diagnostics.cost, "draft_cost_ratio", fake_ratio)
    monkeypatch.setattr(views.common, "measure_cost", forbidden)
    db = tmp_path / "cost.duckdb"
    common = ["--target", tiny_folder3, "--db", str(db), "--no-progress"]
    for bad in ("nan", "5000", "-1"):  # refused before anything is loaded or stored (a NaN passed the old `< 0` check)
        assert main(["sweep", "--prompts", str(prompt_file), "--rule", "lenience:0.5", *common, "--cost", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--cost must be a number from 0 to 1000" in err and not db.exists()
    assert main(["sweep", "--prompts", str(prompt_file), "--rule", "lenience:0.5", "--rule", "cascade:0.3", "--seeds", "1",
                 "--draft", "early-exit:2", "--max-new-tokens", "6", "--raw", *common]) == 0
    printed = capsys.readouterr()
    first = json.loads(printed.out.strip().splitlines()[-1])
    sweep_id = first["sweep_id"]
    assert first["cost_ratio"] == 0.4214 and first["cost_ratio_source"].startswith("stored with the sweep: measured")
    # 0.4214 for early-exit:2 of 3 layers is 0.63× L/N: flagged (issue 45, rough edge 8), and on stderr.
    assert first["cost_ratio_flag"].startswith("c = 0.421 is 0.63× the layer ratio 0.667") and "cost ratio: c = 0.421" in printed.err
    assert len(measured) == 1 and measured[0] is not None  # the early exit was timed, once
    assert Store(db).get_sweep(sweep_id)["settings"]["cost"] == {"ratio": 0.4214, "source": "measured"}

    assert main(["sweep", "--resume", sweep_id, *common]) == 0
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["cost_ratio"] == 0.4214 and _speedups(resumed["settings"]) == _speedups(first["settings"]) and len(measured) == 1
    assert main(["sweep", "--resume", sweep_id, *common, "--cost", "0.9"]) == 0
    overridden = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert overridden["cost_ratio"] == 0.9 and overridden["cost_ratio_source"] == "--cost of this command"
    assert overridden["cost_ratio_flag"] is None  # a c the user gave is theirs
    assert _speedups(overridden["settings"]) != _speedups(first["settings"])  # c matters to the figures compared here
    assert Store(db).get_sweep(sweep_id)["settings"]["cost"]["ratio"] == 0.4214  # the stored c is kept

    monkeypatch.setenv("SPECLAB_DB", str(db))
    at = open_page("views/sweep.py", {"sweep": sweep_id})
    assert at.number_input(key=f"sweep_cost_stored_{sweep_id}").value == 0.4214
    table = at.dataframe[0].value
    shown = {row["setting"]: row["modelled speed-up"].split(" ")[0] for row in table.to_dict("records")}
    assert shown == _speedups(first["settings"])
    assert not any("re-measured" in caption.value for caption in at.caption)
    assert any(warning.value.startswith("Cost ratio: c = 0.421 is 0.63× the layer ratio") for warning in at.warning)
    at.radio(key=f"sweep_cost_from_{sweep_id}").set_value("analytic").run()  # the user takes L/N
    assert at.number_input(key=f"sweep_cost_analytic_{sweep_id}").value == 0.6667 and not at.warning
    assert {row["setting"]: row["modelled speed-up"].split(" ")[0] for row in at.dataframe[0].value.to_dict("records")} != shown

    at.toggle(key="sweep_remeasure").set_value(True).run()  # the tiny target needs consent: c falls back to L/N = 2/3
    assert not at.exception, [e.value for e in at.exception]
    assert any("c re-measured on this machine" in caption.value for caption in at.caption)
    table = at.dataframe[0].value
    assert {row["setting"]: row["modelled speed-up"].split(" ")[0] for row in table.to_dict("records")} != shown

    with duckdb.connect(str(db)) as con:  # the sweep as an older version stored it: no c
        settings = json.loads(con.execute("SELECT settings FROM sweeps").fetchone()[0])
        settings.pop("cost")
        con.execute("UPDATE sweeps SET settings = ?", [json.dumps(settings)])
    at = open_page("views/sweep.py", {"sweep": sweep_id})
    assert any("stored without its cost ratio" in caption.value for caption in at.caption)
    assert main(["sweep", "--resume", sweep_id, *common]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["cost_ratio"] == 0.4214 and len(measured) == 2
    assert Store(db).get_sweep(sweep_id)["settings"]["cost"] == {"ratio": 0.4214, "source": "measured"}


def test_a_head_is_timed_as_a_head_and_an_ngram_costs_nothing(prompt_file: Path, tiny_target, monkeypatch) -> None:
    """``measure_cost_ratio`` hands a loaded EAGLE-3/Medusa head to ``draft_cost_ratio``; the old
    ``hasattr(draft, "model")`` test handed it ``None``, which makes c = 0 (negative control)."""
    import diagnostics.cost
    from diagnostics.evaluation.sweeper import measure_cost_ratio
    from diagnostics.heads.layout import LoadedHead

    timed: list[object] = []
    monkeypatch.setattr(diagnostics.cost, "draft_cost_ratio", lambda _target, drafter, _context: timed.append(drafter) or 0.1)
    head = LoadedHead(kind="medusa", module=object(), taps=(1,), name="tiny head")
    settings = _settings(prompt_file, ["lenience:0.5"], seeds=1)
    measure_cost_ratio(tiny_target, head, settings)
    measure_cost_ratio(tiny_target, "ngram:3", settings)
    assert timed == [head, None] and not hasattr(head, "model")
    # A Ray worker times its pair with the same function (it had its own copy of the rule).
    from diagnostics.evaluation.distributed import UnitWorker
    from diagnostics.evaluation.sweeper import base_request

    worker = object.__new__(UnitWorker)  # its models set by hand: no Ray, nothing loaded by spec
    worker.target, worker.draft = tiny_target, head
    from dataclasses import replace

    timed.clear()
    first = replace(base_request(settings), prompt=settings["prompts"][0]["prompt"], seed=0)
    assert worker.cost_ratio(first) == 0.1 and timed == [head]
    worker.draft = "ngram:3"
    assert worker.cost_ratio(first) == 0.1 and timed == [head, None]


def test_a_summary_without_intervals_reads_without_nan() -> None:
    """Rough edge 7 of issue 45 (everyday, < 1 ms): one finished unit (a sweep still running) has
    means but no intervals; the verdict line showed "[nan, nan]" and "+nan"."""
    from diagnostics.evaluation.stats import RuleSummary

    nan = float("nan")
    summary = RuleSummary(label="lenience:0.5", role="rule", units=1,
                          figures={"TV(P, baseline)": (0.012, nan, nan), "modelled speed-up": (1.8, nan, nan)},
                          against="lossless", differences={"accuracy": (nan, nan, nan), "log-likelihood": (-0.5, nan, nan)},
                          versus_lossless={})
    line = summary.verdict()
    assert "nan" not in line, line
    assert line == "lenience:0.5: distortion 0.012 per token vs baseline; log-likelihood -0.50 vs lossless; modelled speed-up 1.80×"
    whole = RuleSummary(label="x", role="rule", units=9, figures={"TV(P, baseline)": (0.01, 0.0, 0.02), "modelled speed-up": (nan, nan, nan)},
                        against="lossless", differences={}, versus_lossless={})
    assert whole.verdict() == "x: distortion 0.010 [0.000, 0.020] per token vs baseline; modelled speed-up –"


def test_a_sweep_another_process_is_running_is_shown_read_only(prompt_file: Path, tiny_target, tmp_path: Path, monkeypatch) -> None:
    """Rough edge 7 of issue 45 (everyday, ~15 s): a sweep the CLI is still running (status
    ``running``, its runs written by a live other process) was offered Resume, which would run its
    units twice. The page now says who runs it and offers no Resume; a dead writer's sweep is offered
    Resume as before, and so is one this process itself wrote."""
    import subprocess
    import sys

    import duckdb
    from app_support import open_page

    from diagnostics.store.runs import writer_tag

    db = tmp_path / "runs.duckdb"
    store = Store(db)
    sweep_id = run_sweep(store, tiny_target, "early-exit:2", _settings(prompt_file, ["lenience:0.5"], seeds=1))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        live = f"{writer_tag().rsplit(':', 1)[0]}:{other.pid}"
        with duckdb.connect(str(db)) as con:
            con.execute("UPDATE sweeps SET status = 'running' WHERE sweep_id = ?", [sweep_id])
            con.execute("UPDATE runs SET writer = ? WHERE starts_with(group_id, ?)", [live, f"{sweep_id}-u"])
        assert store.sweep_writer(sweep_id) == live
        monkeypatch.setenv("SPECLAB_DB", str(db))
        at = open_page("views/sweep.py", {"sweep": sweep_id})
        assert not at.exception, [e.value for e in at.exception]
        assert any("being run by another process" in info.value and str(other.pid) in info.value for info in at.info)
        assert not any(button.key == "sw_resume" for button in at.button)
    finally:
        other.kill()
        other.wait()
    assert store.sweep_writer(sweep_id) is None  # its writer is gone: the sweep can be resumed
    at = open_page("views/sweep.py", {"sweep": sweep_id})
    assert any(button.key == "sw_resume" for button in at.button)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET writer = ? WHERE starts_with(group_id, ?)", [writer_tag(), f"{sweep_id}-u"])
    assert store.sweep_writer(sweep_id) is None  # this process's own sweep is not "another process"
