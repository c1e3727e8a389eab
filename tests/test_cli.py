"""The command line: JSON per run, one-line errors, interruption, and the real embedded model."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from diagnostics.cli import main
from diagnostics.rules import split_specs
from diagnostics.store import Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    return save_tiny_model(tmp_path_factory.mktemp("cli") / "tiny", seed=0)


def _run(capsys, *argv: str) -> tuple[int, list[dict], str]:
    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse's own errors (one line too: see cli._Parser)
        status = exit_.code
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines() if line.strip()]
    return status, lines, captured.err


def test_run_prints_one_json_object(capsys, tiny_folder: str, tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    status, lines, _ = _run(capsys, "run", "--prompt", "w1 w2 w3 w1 w2", "--rule", "lenience:0.5", "--target", tiny_folder,
                            "--draft", "ngram:2", "--max-new-tokens", "10", "--raw", "--db", str(db), "--no-progress")
    assert status == 0 and len(lines) == 1
    result = lines[0]
    assert set(result) >= {"run_id", "tokens", "acceptance_rate", "block_efficiency", "tokens_per_s", "mean_tv_target"}
    stored = Store(db).get_run(result["run_id"])
    assert stored["status"] == "complete" and stored["n_tokens"] == result["tokens"]


def test_compare_prints_the_coupled_group(capsys, tiny_folder: str, tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    status, lines, _ = _run(capsys, "compare", "--prompt", "w1 w2 w3 w1 w2", "--rules", "lossless,lenience:0.1,medusa:0.09,0.3",
                            "--target", tiny_folder, "--draft", "early-exit:1", "--max-new-tokens", "12", "--raw",
                            "--db", str(db), "--no-progress")
    assert status == 0 and [line["rule"] for line in lines] == ["lossless", "lenience:0.1", "medusa:0.09,0.3"]
    assert len({line["group_id"] for line in lines}) == 1 and lines[0]["divergence_position"] is None
    assert all(line["reference_run"] == lines[0]["run_id"] for line in lines)


def test_compare_over_several_seeds_makes_one_group_with_a_reference_per_seed(capsys, tiny_folder: str, tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    status, lines, _ = _run(capsys, "compare", "--prompt", "w1 w2 w3 w1 w2", "--rules", "lossless,lenience:0.1", "--seeds", "3-4",
                            "--target", tiny_folder, "--draft", "ngram:2", "--max-new-tokens", "12", "--raw",
                            "--db", str(db), "--no-progress")
    assert status == 0 and [(line["seed"], line["rule"]) for line in lines] == [(3, "lossless"), (3, "lenience:0.1"),
                                                                                 (4, "lossless"), (4, "lenience:0.1")]
    assert len({line["group_id"] for line in lines}) == 1
    assert [line["reference_run"] for line in lines] == [lines[0]["run_id"]] * 2 + [lines[2]["run_id"]] * 2
    assert lines[0]["divergence_position"] is None and lines[2]["divergence_position"] is None
    status, lines, err = _run(capsys, "compare", "--prompt", "x", "--rules", "lossless", "--seeds", "4-1", "--db", str(db))
    assert status == 2 and len(err.strip().splitlines()) == 1 and "backwards" in err


def test_tree_runs_and_a_chain_vs_tree_group_with_matched_baselines(capsys, tiny_folder: str, tmp_path: Path, monkeypatch) -> None:
    """``run --tree`` records a tree run that replays token for token; ``compare --shapes "chain;3,2"
    --baselines`` runs every rule under both shapes, each truncation rule beside its matched baseline
    (lossless under min-p m, same drafts); the Compare page names every member apart and draws each
    tree member's node at its divergence."""
    from app_support import open_page

    db = tmp_path / "runs.duckdb"
    common = ["--prompt", "w1 w2 w3 w1 w2", "--target", tiny_folder, "--draft", "early-exit:1", "--max-new-tokens", "12",
              "--raw", "--db", str(db), "--no-progress"]
    status, (line,), _ = _run(capsys, "run", "--rule", "lenience:0.5", "--tree", "3,2", "--tree-children", "top", *common)
    assert status == 0 and line["tree"] == "3,2" and line["tree_children"] == "top"
    status, (again,), _ = _run(capsys, "run", "--replay", line["run_id"], "--db", str(db), "--no-progress")
    assert status == 0 and again["reproduced"] is True and again["tree"] == "3,2"
    status, lines, _ = _run(capsys, "compare", "--rules", "lossless,cascade:0.3", "--shapes", "chain;3,2", "--baselines", *common)
    assert status == 0
    assert [(entry["rule"], entry["tree"]) for entry in lines] == [
        ("lossless", None), ("cascade:0.3", None), ("lossless", None), ("lossless", "3,2"), ("cascade:0.3", "3,2"), ("lossless", "3,2")]
    status, _lines, err = _run(capsys, "run", "--rule", "cos:0.5", "--tree", "3,2", *common)
    assert status == 2 and "has no tree form" in err and len(err.strip().splitlines()) == 1
    store = Store(db)
    baseline = store.get_run(lines[-1]["run_id"])
    assert json.loads(baseline["policy"])["min_p"] == 0.3 and json.loads(baseline["draft_policy"]).get("min_p") is None
    monkeypatch.setenv("SPECLAB_DB", str(db))
    monkeypatch.setenv("SPECLAB_TARGET", tiny_folder)
    at = open_page("views/compare.py", {"group": lines[0]["group_id"]})
    table = at.dataframe[0].value
    assert list(table["rule"]) == ["lossless", "cascade:0.3", "lossless · baseline policy min-p 0.3", "lossless · tree 3,2",
                                   "cascade:0.3 · tree 3,2", "lossless · tree 3,2 · baseline policy min-p 0.3"]


def test_rule_lists_split_like_a_person_writes_them() -> None:
    assert split_specs("lossless,lenience:0.5,medusa:0.09,0.3,cos:0.4") == ["lossless", "lenience:0.5", "medusa:0.09,0.3", "cos:0.4"]
    assert split_specs("lossless;medusa:0.09,0.3") == ["lossless", "medusa:0.09,0.3"]


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--rule", "lenience:0"], "out of range"),
        (["--rule", "magic"], "unknown rule"),
        (["--rule", "cos:1.5"], "out of range"),
        (["--prompt", "   "], "prompt is empty"),
        (["--draft", "medusa-heads:2"], "unknown drafter"),
        (["--draft", "early-exit:7"], "out of range"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--target", "/no/such/model"], "no model folder"),
        (["--max-new-tokens", "100000"], "max-new-tokens 100,000 does not fit the target's context of 256 tokens"),
        # Numbers that overflowed the store's INTEGER/BIGINT columns (a traceback from the INSERT).
        (["--gamma", "3000000000"], "gamma must lie in [0, 1,024]"),
        (["--max-new-tokens", "3000000000"], "max-new-tokens must lie in [1, 1,000,000]"),
        (["--seed", str(2**63)], "seed must lie in [0, 9,223,372,036,854,775,807]"),
        # gamma is named, not the prompt or the budget.
        (["--gamma", "1000"], "gamma does not fit the target's context of 256 tokens: the prompt has 2 tokens and gamma is 1,000; lower gamma"),
        (["--gamma", "x"], "argument --gamma: invalid int value: 'x'"),
        (["--prompt", "caf\udce9 \udcff"], "the prompt is not valid UTF-8 text (byte 0xe9 at character 3)"),
        (["--prompt", "w1 " * 400_000], "the prompt does not fit the target's context of 256 tokens: the prompt has 400,000 tokens"),
        (["--temperature", "1e-300"], "temperature 1e-300 is too small to compute"),
        (["--rule", "lenience:1e-400"], "lenience:1e-400 is out of range: l must lie in (0, 1]"),
        (["--top-k", "0"], "top_k must be a whole number >= 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tiny_folder: str, tmp_path: Path, extra: list[str], fragment: str) -> None:
    """One line, exit 2, and nothing written: a run that never started leaves no row."""
    db = tmp_path / "runs.duckdb"
    argv = ["run", "--prompt", "w1 w2", "--target", tiny_folder, "--draft", "ngram:2", "--raw", "--db", str(db), "--no-progress"]
    status, lines, err = _run(capsys, *argv, *extra)
    assert status == 2 and not lines
    assert err.startswith("error: ") and fragment in err and err.count("\n") == 1, err
    assert not db.exists() or Store(db).list_runs().empty


def test_a_folder_that_holds_no_model_says_what_a_model_folder_is(capsys, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    status, _, err = _run(capsys, "run", "--prompt", "hi", "--target", str(tmp_path), "--draft", "none", "--db", str(tmp_path / "r.duckdb"))
    assert status == 2 and err.count("\n") == 1
    assert f"{tmp_path} is not a model folder: it has no config.json (a model folder holds config.json, the tokenizer files" in err


def test_errors_quoting_hostile_text_print_it_visibly(capsys, tiny_folder: str, tmp_path: Path) -> None:
    """A message that quotes typed or stored text never sends raw escape sequences to the terminal."""
    status, _, err = _run(capsys, "run", "--prompt", "w1", "--target", "/no/such/\x1b[2J\u202emodel", "--draft", "none",
                          "--db", str(tmp_path / "r.duckdb"))
    assert status == 2 and "\x1b" not in err and "\u202e" not in err
    assert "no model folder at /no/such/\\x1b[2J\\u202emodel" in err


def test_corrupt_database_is_refused_and_kept(capsys, tiny_folder: str, tmp_path: Path) -> None:
    db = tmp_path / "corrupt.duckdb"
    db.write_bytes(b"garbage" * 50)
    status, _, err = _run(capsys, "run", "--prompt", "w1", "--target", tiny_folder, "--draft", "ngram:2", "--db", str(db), "--no-progress")
    assert status == 2 and "not a readable DuckDB database" in err and db.read_bytes() == b"garbage" * 50


def test_a_target_without_a_draft_says_what_to_pass(capsys, tiny_folder: str, tmp_path: Path) -> None:
    status, _, err = _run(capsys, "run", "--prompt", "w1", "--target", tiny_folder, "--db", str(tmp_path / "x.duckdb"))
    assert status == 2 and "--draft" in err


def _cli(*argv: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "diagnostics", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.slow  # slow tier: the embedded model through the command line (about 8 s)
def test_real_embedded_model_end_to_end(tmp_path: Path) -> None:
    """The README's example on the embedded SmolLM2-135M-Instruct, through the command line."""
    db = tmp_path / "runs.duckdb"
    process = _cli("run", "--prompt", "Name a color.", "--rule", "lenience:0.5", "--draft", "early-exit:26",
                   "--max-new-tokens", "12", "--seed", "3", "--db", str(db))
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    result = json.loads(out)
    assert 1 <= result["tokens"] <= 12 and result["text"] and 0 <= result["acceptance_rate"] <= 1
    stored = Store(db, read_only=True)
    row = stored.get_run(result["run_id"])
    assert row["status"] == "complete" and row["target"].startswith("SmolLM2-135M-Instruct")
    positions = stored.positions(result["run_id"])
    assert len(positions) == result["tokens"] and positions["p_top_ids"].map(len).eq(20).all()
    assert positions["tv_target"].notna().all()


def _stored_positions(db: Path) -> int:
    """Positions a running CLI has flushed to ``db`` so far (0 while the file is new or its lock is held).

    Stderr is a pipe here, so the CLI draws no progress bar: the tests watch the database instead.
    """
    import duckdb

    try:
        with duckdb.connect(str(db), read_only=True) as con:
            return int(con.execute("SELECT count(*) FROM positions").fetchone()[0])
    except duckdb.Error:  # not created yet, or the writer holds it for a moment
        return 0


def _wait_for_positions(process: subprocess.Popen, db: Path, count: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if db.exists() and _stored_positions(db) >= count:
            return
        time.sleep(0.2)


@pytest.mark.slow  # slow tier: a run interrupted by a signal (about 8 s)
def test_ctrl_c_keeps_the_run_marked_interrupted(tmp_path: Path) -> None:
    """Ctrl-C in the middle of a run on the embedded model (slow enough to interrupt).

    The test watches the database to know the run is under way.
    """
    import threading

    db = tmp_path / "runs.duckdb"
    # A shell that starts the test suite in the background leaves SIGINT ignored in its children,
    # and Python keeps an ignored SIGINT ignored: give the CLI the default disposition, as a terminal would.
    process = _cli("run", "--prompt", "Tell a long story.", "--draft", "none", "--max-new-tokens", "300", "--db", str(db),
                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    chunks: list[bytes] = []

    def read() -> None:
        while chunk := os.read(process.stderr.fileno(), 4096):
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    _wait_for_positions(process, db, 10)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    reader.join(timeout=10)
    err = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 130 and "interrupted" in err, err[-2000:]
    row = Store(db).list_runs().iloc[0]
    assert row["status"] == "interrupted" and 0 < len(Store(db).positions(row["run_id"])) < 200


def test_report_output_and_database_paths_are_checked(capsys, tiny_folder: str, tmp_path: Path) -> None:
    """-o into a missing folder or onto a folder, --db under a file, a file with schema 'two': one line each."""
    db = tmp_path / "runs.duckdb"
    status, lines, _ = _run(capsys, "run", "--prompt", "w1 w2", "--target", tiny_folder, "--draft", "ngram:2", "--raw",
                            "--max-new-tokens", "4", "--db", str(db), "--no-progress")
    run_id = lines[0]["run_id"]
    cases = [
        (["report", run_id, "--db", str(db), "-o", str(tmp_path / "missing" / "r.html")], f"the folder {tmp_path / 'missing'} does not exist"),
        (["report", run_id, "--db", str(db), "-o", str(tmp_path)], f"{tmp_path} is a folder; give -o a file name"),
        (["run", "--prompt", "w1", "--target", tiny_folder, "--draft", "none", "--db", str(db / "x.duckdb")],
         f"cannot create {db}/x.duckdb: {db} is a file, not a folder"),
        (["audit", "--real-positions", "-1"], "--real-positions must be >= 0"),
    ]
    for argv, fragment in cases:
        status, out, err = _run(capsys, *argv)
        assert status == 2 and not out and err.startswith("error: ") and fragment in err and err.count("\n") == 1, err
    import duckdb

    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE meta SET value = 'two' WHERE key = 'schema_version'")
    before = db.read_bytes()
    for argv in (["report", run_id, "--db", str(db), "-o", str(tmp_path / "r.html")], ["audit", "--run", run_id, "--db", str(db)],
                 ["run", "--prompt", "w1", "--target", tiny_folder, "--draft", "none", "--db", str(db)]):
        status, out, err = _run(capsys, *argv)
        assert status == 2 and "has schema version 'two', not a whole number" in err and err.count("\n") == 1, err
    assert db.read_bytes() == before


def test_a_recorded_audit_loads_the_runs_models_only_when_asked(capsys, tiny_folder: str, tmp_path: Path) -> None:
    """A database can name any folder as a run's target: `audit --run` loads it only with --load-models."""
    db = tmp_path / "runs.duckdb"
    _, lines, _ = _run(capsys, "run", "--prompt", "w1 w2 w3", "--target", tiny_folder, "--draft", "ngram:2", "--raw",
                       "--max-new-tokens", "8", "--db", str(db), "--no-progress")
    status, out, err = _run(capsys, "audit", "--run", lines[0]["run_id"], "--db", str(db))
    assert status == 0 and out[0]["p_recomputed"] is False and out[0]["verdict"] == "pass"
    assert f"the run names {tiny_folder}; pass --load-models" in err
    status, out, err = _run(capsys, "audit", "--run", lines[0]["run_id"], "--db", str(db), "--load-models")
    assert status == 0 and out[0]["p_recomputed"] is True and out[0]["verdict"] == "pass"


def _start_and_wait(db: Path, tokens: int, *argv: str) -> tuple[subprocess.Popen, list[bytes]]:
    """A CLI run on the embedded model (slow enough to stop), returned once ``tokens`` positions are stored."""
    import threading

    process = _cli("run", "--db", str(db), *argv, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    chunks: list[bytes] = []

    def read() -> None:
        while chunk := os.read(process.stderr.fileno(), 4096):
            chunks.append(chunk)

    threading.Thread(target=read, daemon=True).start()
    _wait_for_positions(process, db, tokens)
    return process, chunks


@pytest.mark.slow  # slow tier: a writer process killed mid-run (about 12 s)
def test_a_killed_writer_leaves_a_run_whose_audit_passes(capsys, tmp_path: Path) -> None:
    """kill -9 halfway: the run is reaped as interrupted with every stored position, its tokens and
    text rebuilt from them, and the recorded-run audit (p recomputed) passes."""
    db = tmp_path / "runs.duckdb"
    process, _ = _start_and_wait(db, 24, "--prompt", "Tell a long story about a lighthouse.", "--rule", "lossless",
                                 "--draft", "early-exit:26", "--gamma", "3", "--max-new-tokens", "300")
    time.sleep(1.5)  # let the writer flush a batch (every second)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    store = Store(db)  # reaps the dead writer's run
    row = store.list_runs().iloc[0]
    run = store.get_run(row["run_id"])
    count = len(store.positions(row["run_id"]))
    assert run["status"] == "interrupted" and 0 < count < 300
    assert run["n_tokens"] == count and len(run["tokens"]) == count and run["output_text"]
    status, out, _ = _run(capsys, "audit", "--run", row["run_id"], "--db", str(db))
    assert status == 0 and out[0]["p_recomputed"] is True and out[0]["verdict"] == "pass", out[0]["flags"][:3]
    assert out[0]["positions"] == count


def _small_disk(folder: Path) -> bool:
    """Make ``folder`` an 8 MB tmpfs; ``False`` where mounting is not allowed (not root, a sandbox)
    or ``SPECLAB_TEST_RLIMIT`` asks for the file-size-limit path instead."""
    folder.mkdir()
    if os.environ.get("SPECLAB_TEST_RLIMIT"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True).returncode == 0


def test_a_full_disk_is_one_line_and_keeps_earlier_runs(capsys, tiny_folder: str, tmp_path: Path) -> None:
    """The database's disk fills during a run: `error: the disk … is full`, exit 2, earlier runs intact,
    no run left 'running'. A real full tmpfs when this machine lets the test mount one; otherwise
    the process's file-size limit (RLIMIT_FSIZE), which fails the same writes with EFBIG."""
    import resource

    folder = tmp_path / "small"
    mounted = _small_disk(folder)
    try:
        db = folder / "runs.duckdb"
        _, lines, _ = _run(capsys, "run", "--prompt", "w1 w2 w3", "--target", tiny_folder, "--draft", "ngram:2", "--raw",
                           "--max-new-tokens", "16", "--db", str(db), "--no-progress")
        earlier = lines[0]["run_id"]
        # Four coupled runs of 240 tokens, written together (about 0.5 MB): more than a checkpoint
        # that shrinks the file frees, so the disk fills during the runs.
        argv = ["compare", "--prompt", "w1 w2 w3 w4 w5", "--rules", "lossless,lenience:0.5,cascade:0.3,typical:0.2",
                "--target", tiny_folder, "--draft", "ngram:2", "--raw", "--top-k-record", "12",
                "--max-new-tokens", "240", "--db", str(db), "--no-progress"]
        if mounted:
            filler = folder / "filler"
            free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
            filler.write_bytes(b"\0" * max(0, free - 16_384))
            process = _cli(*argv)
        else:
            limit = 16_384  # the new run's write-ahead log and any checkpoint outgrow this at once

            def cap() -> None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

            process = _cli(*argv, preexec_fn=cap)
        out, err = process.communicate(timeout=300)
        assert process.returncode == 2 and not out.strip(), err[-2000:]
        assert err.startswith("error: the disk holding ") and " is full (" in err and err.count("\n") == 1, err[-2000:]
        if mounted:
            filler.unlink()
        store = Store(db)
        runs = store.list_runs()
        assert "running" not in runs["status"].tolist()
        kept = store.get_run(earlier)
        assert kept["status"] == "complete" and len(store.positions(earlier)) == kept["n_tokens"] == 16
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=False)


def _help(capsys, *argv: str) -> str:
    """A (sub)command's --help, whitespace-normalised (argparse wraps at the terminal's width)."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_lists_every_rule_and_every_default(capsys) -> None:
    from diagnostics.cli import build_parser
    from diagnostics.rules import EXAMPLE_SPECS

    run_help = _help(capsys, "run")
    for spec in EXAMPLE_SPECS:
        assert spec in run_help, spec
    assert "mentored:0.5,2" in run_help
    assert "--max-new-tokens MAX_NEW_TOKENS token budget of the generation (default: 64)" in run_help
    assert "--gamma GAMMA draft tokens per block (default: 4)" in run_help
    assert "(default: 0)" in run_help and "(default: lossless)" in run_help
    compare_help = _help(capsys, "compare")
    assert "a bare number continues the previous spec" in compare_help and "'lossless,medusa:0.09,0.3' is two rules" in compare_help
    assert "';' also separates" in compare_help
    bench_help = _help(capsys, "bench")
    assert "(default: 48)" in bench_help and "(default: 3)" in bench_help and "smoke test" in bench_help
    parser = build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        text = " ".join(sub.format_help().split())
        assert "(default: None)" not in text and "(default: False)" not in text and "(default: [])" not in text, name
        assert not re.search(r"default[^()]*\) \(default", text), f"{name}: a default said twice"
        for action in sub._actions:
            assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest} has no help"


def test_redirected_stderr_gets_no_progress_bars(tiny_folder: str, tmp_path: Path) -> None:
    """stderr is a pipe (a log file, CI): no tqdm bar of ours or of the libraries, so no carriage
    returns or escape codes; stdout still carries the JSON."""
    process = subprocess.run(
        [sys.executable, "-m", "diagnostics", "run", "--prompt", "w1 w2 w3", "--target", tiny_folder, "--draft", "ngram:2",
         "--raw", "--max-new-tokens", "16", "--db", str(tmp_path / "runs.duckdb")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.returncode == 0, process.stderr[-2000:]
    assert json.loads(process.stdout)["tokens"] >= 1
    assert "\x1b[" not in process.stderr and "\r" not in process.stderr, repr(process.stderr[-500:])
    assert "it/s" not in process.stderr and "tok/s" not in process.stderr and "%|" not in process.stderr


def _stored_tokens(db: Path, run_id: str) -> list[int]:
    return [int(token) for token in Store(db).get_run(run_id)["tokens"]]


@pytest.mark.parametrize("settings", [
    ["--rule", "lenience:0.5", "--draft", "ngram:2", "--gamma", "3", "--temperature", "0.8", "--top-k", "6", "--seed", "3"],
    ["--rule", "lossless", "--draft", "none", "--draft-temperature", "0.5", "--seed", "11"],
])
def test_a_replayed_run_reproduces_its_tokens(capsys, tiny_folder: str, tmp_path: Path, settings: list[str]) -> None:
    """`run --replay ID` records the stored run again with the run's own settings: same tokens."""
    db = tmp_path / "runs.duckdb"
    status, lines, _ = _run(capsys, "run", "--prompt", "w1 w2 w3 w1 w2", "--target", tiny_folder, "--raw",
                            "--max-new-tokens", "14", "--db", str(db), *settings)
    assert status == 0
    original = lines[0]
    status, lines, err = _run(capsys, "run", "--replay", original["run_id"], "--db", str(db))
    assert status == 0 and len(lines) == 1, err
    replay = lines[0]
    assert replay["replay_of"] == original["run_id"] and replay["reproduced"] is True
    assert replay["run_id"] != original["run_id"] and replay["rule"] == original["rule"] and replay["text"] == original["text"]
    assert _stored_tokens(db, replay["run_id"]) == _stored_tokens(db, original["run_id"]) != []
    old, new = Store(db).get_run(original["run_id"]), Store(db).get_run(replay["run_id"])
    for column in ("target", "draft", "rule", "gamma", "seed", "max_new_tokens", "policy", "draft_policy", "raw_prompt",
                   "prompt", "prompt_ids"):
        assert new[column] == old[column], column


def test_replay_refusals_are_one_line(capsys, tiny_folder: str, tmp_path: Path) -> None:
    """A missing id (named with its database), a changed tokenizer, --prompt with --replay, neither
    of them, and a typed setting: one line each, exit 2, no new run."""
    import duckdb

    db = tmp_path / "runs.duckdb"
    _, lines, _ = _run(capsys, "run", "--prompt", "w1 w2 w3", "--target", tiny_folder, "--draft", "ngram:2", "--raw",
                       "--max-new-tokens", "6", "--db", str(db))
    run_id = lines[0]["run_id"]
    with duckdb.connect(str(db)) as con:
        con.execute("INSERT INTO runs SELECT * REPLACE ('changed' AS run_id, [1, 2, 9] AS prompt_ids) FROM runs")
    cases = [
        (["run", "--replay", "nope", "--db", str(db)], f"there is no run 'nope' in {db}"),
        (["run", "--replay", "nope", "--db", str(tmp_path / "missing.duckdb")], f"there is no database at {tmp_path / 'missing.duckdb'}"),
        (["run", "--replay", "changed", "--db", str(db)], "now encodes to other token ids than were stored"),
        (["run", "--replay", run_id, "--prompt", "w1", "--db", str(db)], "--prompt and --replay exclude each other"),
        (["run", "--target", tiny_folder, "--db", str(db)], "pass --prompt TEXT, or --replay RUN_ID"),
        (["run", "--replay", run_id, "--seed", "4", "--db", str(db)], "--replay takes the stored run's own settings; drop --seed"),
    ]
    for argv, fragment in cases:
        status, out, err = _run(capsys, *argv)
        assert status == 2 and not out, err
        assert err.startswith("error: ") and fragment in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert len(Store(db).list_runs()) == 2 and not (tmp_path / "missing.duckdb").exists()


def test_replay_of_a_missing_id_through_the_command_line(tiny_folder: str, tmp_path: Path) -> None:
    """The real process: exit status 2 and one line on stderr, no traceback."""
    db = tmp_path / "runs.duckdb"
    Store(db)
    process = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--replay", "ghost", "--db", str(db)],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 2 and not process.stdout
    assert process.stderr == f"error: there is no run 'ghost' in {db}; check the id, or pass --db the file that holds it\n"


def test_a_device_this_machine_lacks_is_a_one_line_error(capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")  # the error is for machines without it
    assert main(["run", "--device", "cuda", "--prompt", "hi"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --device cuda: this torch") and len(error.splitlines()) == 1
    assert main(["run", "--device", "gpu0", "--prompt", "hi"]) == 2
    assert "unknown device 'gpu0'" in capsys.readouterr().err


def test_json_on_stdout_escapes_characters_that_act():
    """A bidi override, a zero-width joiner or a lone surrogate from a prompt or a model name is
    printed as its JSON escape (the terminal shows what it is, and printing cannot fail); readable
    text stays as it is, and the line parses back to the very same strings."""
    import json

    from diagnostics.cli.common import json_line

    payload = {"prompt": "café \u202eevil\u200d \ud800 \U000e0041 ok", "n": 1}
    line = json_line(payload)
    assert "\u202e" not in line and "\u200d" not in line and "\ud800" not in line and "\U000e0041" not in line
    assert "café" in line and "\\u202e" in line and "\\udb40\\udc41" in line
    line.encode("utf-8")  # a lone surrogate would raise here: the finished result would be lost at print time
    assert json.loads(line) == payload
