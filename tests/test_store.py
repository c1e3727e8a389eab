"""DuckDB store: round trip, schema version, interrupted and dead runs, concurrency, bad files."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from tiny_models import save_tiny_model

from diagnostics.engine import PositionRecord
from diagnostics.models import load_model
from diagnostics.comparison import compare_rules
from diagnostics.runner import RunRequest, record_run
from diagnostics.store import SCHEMA_VERSION, Store, StoreBusy, StoreError
from diagnostics.store.schema import (
    POSITION_COLUMNS_ADDED_IN_3,
    RUN_COLUMNS_ADDED_IN_3,
    RUN_COLUMNS_ADDED_IN_5,
    RUN_COLUMNS_ADDED_IN_7,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return load_model(save_tiny_model(folder / "model", seed=0))


def _request(**overrides) -> RunRequest:
    settings = {"prompt": "w1 w2 w3 w4 w1 w2", "rule": "lenience:0.5", "draft": "ngram:2", "gamma": 3,
                "max_new_tokens": 12, "seed": 1, "raw": True}
    settings.update(overrides)
    return RunRequest(**settings)


def test_round_trip(tmp_path: Path, tiny) -> None:
    store = Store(tmp_path / "runs.duckdb")
    run_id, run = record_run(store, tiny, "ngram:2", _request())
    row = store.get_run(run_id)
    assert row["status"] == "complete" and row["n_tokens"] == len(run.tokens) == row["target_passes"] * 0 + len(run.tokens)
    assert row["rule"] == "lenience:0.5" and row["software_version"] and row["prompt"] == "w1 w2 w3 w4 w1 w2"
    assert list(row["tokens"]) == run.tokens
    positions = store.positions(run_id)
    assert len(positions) == len(run.records)
    for record, (_, stored) in zip(run.records, positions.iterrows()):
        for name, value in record.as_dict().items():
            saved = stored[name]
            if isinstance(value, list):
                assert list(saved) == pytest.approx(value)
            elif value is None:
                assert saved is None or pd.isna(saved)
            else:
                assert saved == pytest.approx(value), name
    one = store.position(run_id, 0)
    assert len(one["p_top_ids"]) == 12 and one["p_tail"] == pytest.approx(0.0, abs=1e-9)


def test_schema_version_and_newer_files(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    assert Store(path).schema_version() == SCHEMA_VERSION
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="newer than this tool"):
        Store(path)
    with pytest.raises(StoreError, match="newer than this tool"):
        Store(path, read_only=True)


def test_foreign_and_corrupt_files_are_refused_untouched(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.duckdb"
    corrupt.write_bytes(b"not a database" * 100)
    before = corrupt.read_bytes()
    with pytest.raises(StoreError, match="not a readable DuckDB database") as error:
        Store(corrupt)
    assert "\n" not in str(error.value) and corrupt.read_bytes() == before
    foreign = tmp_path / "foreign.duckdb"
    with duckdb.connect(str(foreign)) as con:
        con.execute("CREATE TABLE runs (x INTEGER)")
    with pytest.raises(StoreError, match="no meta table"):
        Store(foreign)
    with pytest.raises(StoreError, match="no database at"):
        Store(tmp_path / "missing.duckdb", read_only=True)


def test_interrupted_runs_keep_what_was_recorded(tmp_path: Path, tiny) -> None:
    store = Store(tmp_path / "runs.duckdb")
    seen = []
    run_id, run = record_run(store, tiny, "ngram:2", _request(max_new_tokens=40),
                             on_record=seen.append, should_stop=lambda: len(seen) >= 5)
    row = store.get_run(run_id)
    assert row["status"] == "interrupted" and row["n_tokens"] == len(run.tokens) >= 5
    assert len(store.positions(run_id)) == len(run.tokens)

    def boom(record) -> None:
        if record.position >= 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        record_run(store, tiny, "ngram:2", _request(max_new_tokens=40), on_record=boom)
    latest = store.list_runs().iloc[0]
    assert latest["status"] == "interrupted" and len(store.positions(latest["run_id"])) >= 4
    # Cut off before its summary (Ctrl-C, or a dashboard Stop rerunning the page): the summary its
    # stored positions determine, as for a dead writer, and the drafted count left unknown.
    cut = store.get_run(latest["run_id"])
    positions = store.positions(latest["run_id"])
    assert cut["n_tokens"] == len(positions) and cut["tokens"] == positions["token"].tolist()
    assert cut["accepted"] == int((positions["kind"] == "accepted").sum())
    assert cut["target_passes"] == positions["block"].nunique() and cut["block_efficiency"] == len(positions) / positions["block"].nunique()
    assert cut["mean_tv_target"] == pytest.approx(positions["tv_target"].mean())
    assert cut["drafted"] is None and cut["error"] == "interrupted by the user" and cut["stop_reason"] == "interrupted"


def test_failed_run_keeps_its_error(tmp_path: Path, tiny) -> None:
    store = Store(tmp_path / "runs.duckdb")

    def broken(record) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        record_run(store, tiny, "ngram:2", _request(), on_record=broken)
    row = store.list_runs().iloc[0]
    assert row["status"] == "failed" and "disk full" in row["error"]


def test_runs_of_a_dead_writer_become_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    store = Store(path)
    run_id = store.start_run({"prompt": "x", "rule": "lossless"})
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE runs SET writer = ? WHERE run_id = ?", [f"{__import__('socket').gethostname()}:999999999", run_id])
    assert Store(path).get_run(run_id)["status"] == "interrupted"


def test_compare_groups_and_delete(tmp_path: Path, tiny) -> None:
    store = Store(tmp_path / "runs.duckdb")
    requests = [_request(rule=rule) for rule in ("lossless", "lenience:0.1", "cascade:0.9")]
    group_id, results, divergence = compare_rules(store, tiny, "ngram:2", requests)
    group = store.group(group_id)
    assert list(group["rule"]) == ["lossless", "lenience:0.1", "cascade:0.9"]
    assert pd.isna(group.iloc[0]["divergence_position"])
    for run_id, _ in results:
        assert store.get_run(run_id)["divergence_position"] == divergence[run_id]
    assert store.delete_runs([results[1][0]]) == 1
    assert len(store.list_runs()) == 2 and len(store.positions(results[1][0])) == 0
    assert len(store.list_runs(search="cascade")) == 1


def _hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import duckdb, time, sys
        con = duckdb.connect({str(path)!r})
        print("locked", flush=True)
        time.sleep({seconds})
        con.close()
    """)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


def test_a_locked_file_gets_its_turn_or_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    Store(path)
    holder = _hold_lock(path, 1.5)
    started = time.monotonic()
    assert len(Store(path, lock_wait_s=20).list_runs()) == 0  # waited for its turn
    assert time.monotonic() - started >= 0.5
    holder.wait()
    holder = _hold_lock(path, 5)
    with pytest.raises(StoreBusy, match="is busy"):
        Store(path, lock_wait_s=0.5)
    holder.kill()
    holder.wait()


def test_concurrent_writer_and_reader(tmp_path: Path) -> None:
    """A writer process appends batches while this process reads: no crash, no torn run."""
    path = tmp_path / "runs.duckdb"
    Store(path)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from diagnostics.engine import PositionRecord
        from diagnostics.store import Store, RunWriter
        store = Store({str(path)!r})
        writer = RunWriter(store, {{"prompt": "concurrent", "rule": "lossless", "target": "t"}}, batch_size=10, max_age_s=600)
        for position in range(400):
            writer.add(PositionRecord(position=position, block=position, index_in_block=0, kind="bonus", token=1,
                                      draft_token=None, p_token=0.5, p_draft=None, q_draft=None, accept_prob=None,
                                      u_draft=None, u_accept=None, u_fallback=0.5))
        writer.finish("complete", {{"n_tokens": 400}})
    """)
    writer = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    reader = Store(path, read_only=False)
    counts = []
    while writer.poll() is None:
        runs = reader.list_runs()
        if len(runs):
            counts.append(len(reader.positions(runs.iloc[0]["run_id"])))
        time.sleep(0.02)
    assert writer.returncode == 0, writer.stderr.read()
    final = reader.list_runs().iloc[0]
    assert final["status"] == "complete" and len(reader.positions(final["run_id"])) == 400
    assert counts == sorted(counts) and all(count % 10 == 0 for count in counts)
    shared = Store(path, read_only=True)
    assert len(shared.list_runs()) == 1


def test_read_only_store_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    Store(path).start_run({"prompt": "x", "rule": "lossless", "target": "t"})
    shared = Store(path, read_only=True)
    with pytest.raises(StoreError):
        shared.delete_runs([shared.list_runs().iloc[0]["run_id"]])


def _downgrade(path: Path, version: int) -> None:
    """Make a file of this tool look as an older version wrote it."""
    import duckdb

    with duckdb.connect(str(path)) as con:
        con.execute("DROP TABLE sweep_runs")
        con.execute("DROP TABLE sweeps")
        con.execute("DROP TABLE tree_nodes")
        con.execute("DROP TABLE tree_rounds")
        for table, columns in (("runs", RUN_COLUMNS_ADDED_IN_3 + RUN_COLUMNS_ADDED_IN_5 + RUN_COLUMNS_ADDED_IN_7), ("positions", POSITION_COLUMNS_ADDED_IN_3)):
            for column in columns:
                con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        if version < 2:
            con.execute("DROP TABLE audits")
        con.execute(f"UPDATE meta SET value = '{version}' WHERE key = 'schema_version'")


def test_audits_round_trip_and_old_files_stay_readable(tmp_path) -> None:
    """Schema 2 adds the audits table: a schema-1 file opens read-only (no audits) and migrates on a writable open."""
    path = tmp_path / "runs.duckdb"
    store = Store(path)
    audit_id = store.add_audit({"layer": "rule", "implementation": "ours", "verdict": "pass", "statistic": float("inf"),
                                "pairs": [{"label": "<script>x</script>"}]}, "summary", run_id=None)
    row = store.get_audit(audit_id)
    assert row["verdict"] == "pass" and row["evidence"]["statistic"] is None  # strict JSON: no Infinity
    assert row["evidence"]["pairs"][0]["label"] == "<script>x</script>"
    assert store.list_audits()["audit_id"].tolist() == [audit_id] and store.list_audits(run_ids=[]).empty
    _downgrade(path, 1)
    old = Store(path, read_only=True)
    assert old.list_audits().empty and old.get_audit(audit_id) is None
    migrated = Store(path)
    assert migrated.schema_version() == SCHEMA_VERSION and migrated.list_audits().empty


def test_a_schema_2_file_keeps_its_runs_and_gains_the_tree_tables(tmp_path) -> None:
    """Schema 3 appends tree columns and tables: a schema-2 file opens read-only as it is (no tree
    rounds, runs and positions intact) and migrates on a writable open, its rows unchanged."""
    path = tmp_path / "runs.duckdb"
    store = Store(path)
    run_id = store.start_run({"rule": "lossless", "prompt": "hi", "target": "tiny"})
    store.add_positions(run_id, [PositionRecord(position=0, block=0, index_in_block=0, kind="bonus", token=3,
                                                draft_token=None, p_token=0.5, p_draft=None, q_draft=None,
                                                accept_prob=None, u_draft=None, u_accept=None, u_fallback=0.2)])
    store.finish_run(run_id, "complete", {"n_tokens": 1, "tokens": [3]})
    _downgrade(path, 2)
    old = Store(path, read_only=True)
    assert old.get_run(run_id)["n_tokens"] == 1 and old.tree_rounds(run_id).empty and old.tree_nodes(run_id).empty
    assert "tree_node" not in old.positions(run_id).columns
    migrated = Store(path)
    assert migrated.schema_version() == SCHEMA_VERSION
    run = migrated.get_run(run_id)
    assert run["tokens"] == [3] and run["tree"] is None
    assert migrated.positions(run_id)["tree_node"].isna().all() and migrated.tree_rounds(run_id).empty


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _foreign(path: Path, *statements: str) -> Path:
    with duckdb.connect(str(path)) as con:
        for statement in statements:
            con.execute(statement)
    return path


@pytest.mark.parametrize(
    "statements, fragment",
    [
        (["CREATE TABLE measurements (x INTEGER)"], "no meta table"),
        (["CREATE TABLE meta (key VARCHAR, value VARCHAR)", "CREATE TABLE runs (x INTEGER)"], "no schema version"),
        (["CREATE TABLE meta (key VARCHAR, value VARCHAR)", "INSERT INTO meta VALUES ('schema_version', 'two')"],
         "has schema version 'two', not a whole number"),
        (["CREATE TABLE meta (key VARCHAR, value VARCHAR)", "INSERT INTO meta VALUES ('schema_version', '2')",
          "CREATE TABLE runs (run_id VARCHAR, prompt VARCHAR)"], "its table runs has other columns than this tool writes"),
        (["CREATE TABLE meta (key VARCHAR, value VARCHAR)", "INSERT INTO meta VALUES ('schema_version', '2')"],
         "claims schema 2 but has no runs table"),
        (["CREATE TABLE meta (key VARCHAR, value VARCHAR)", "INSERT INTO meta VALUES ('schema_version', '0')"], "uses schema 0"),
        (["CREATE TABLE meta (key VARCHAR, value INTEGER)"], "its column meta.value is INTEGER, not VARCHAR"),
    ],
)
def test_a_file_written_by_another_program_is_refused_byte_identical(tmp_path: Path, statements: list[str], fragment: str) -> None:
    """Looked at before anything is written: no meta or positions table appears, nothing crashes."""
    path = _foreign(tmp_path / "other.duckdb", *statements)
    before = _sha(path)
    for read_only in (False, True):
        with pytest.raises(StoreError, match=fragment) as error:
            Store(path, read_only=read_only)
        assert "\n" not in str(error.value) and "nothing was changed" in str(error.value)
        assert _sha(path) == before and not path.with_suffix(".duckdb.wal").exists()


def test_a_file_whose_columns_drift_from_a_known_schema_is_refused(tmp_path: Path) -> None:
    """meta claims the current schema, but positions lacks a column: refused before the migration or any crash."""
    path = tmp_path / "runs.duckdb"
    Store(path)
    with duckdb.connect(str(path)) as con:
        con.execute("ALTER TABLE positions DROP COLUMN token_text")
    before = _sha(path)
    with pytest.raises(StoreError, match="its table positions has other columns than this tool writes .missing token_text"):
        Store(path)
    assert _sha(path) == before


def test_a_truncated_or_empty_file_is_a_message_not_a_crash(tmp_path: Path, tiny) -> None:
    path = tmp_path / "runs.duckdb"
    store = Store(path)
    for seed in range(6):  # enough data that half the file cuts through tables
        record_run(store, tiny, "ngram:2", _request(seed=seed, max_new_tokens=40))
    data = path.read_bytes()
    half = tmp_path / "half.duckdb"
    half.write_bytes(data[: len(data) // 2])
    for read_only in (True, False):
        with pytest.raises(StoreError, match="not a readable DuckDB database .damaged, truncated or another format") as error:
            Store(half, read_only=read_only).list_runs()
        assert "\n" not in str(error.value)
    assert half.read_bytes() == data[: len(data) // 2]
    empty = tmp_path / "empty.duckdb"
    empty.touch()
    with pytest.raises(StoreError, match="is an empty file, not a DuckDB database"):
        Store(empty)
    assert empty.read_bytes() == b""


def test_a_path_under_a_file_or_onto_a_folder_is_a_message(tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(StoreError, match=f"cannot create {blocker}/sub/runs.duckdb: {blocker} is a file, not a folder"):
        Store(blocker / "sub" / "runs.duckdb")
    with pytest.raises(StoreError, match="is a folder, not a database file"):
        Store(tmp_path)


def test_search_is_literal_text(tmp_path: Path) -> None:
    """'%' and '_' in the search box are characters, not wildcards."""
    store = Store(tmp_path / "runs.duckdb")
    for prompt in ("100% sure", "1000 sure", "snake_case", "snakeXcase"):
        store.start_run({"prompt": prompt, "rule": "lossless", "target": "t"})
    assert store.list_runs(search="0%")["prompt"].tolist() == ["100% sure"]
    assert store.list_runs(search="e_c")["prompt"].tolist() == ["snake_case"]
    assert store.list_runs(search="\\").empty


def test_a_reaped_run_gets_its_tokens_back_from_its_positions(tmp_path: Path, tiny) -> None:
    """A writer killed with kill -9 leaves a 'running' row with empty summary columns: the reaper
    (and a read-only reader of an unreaped copy) rebuilds tokens, count and text from the positions."""
    path = tmp_path / "runs.duckdb"
    store = Store(path)
    _, run = record_run(store, tiny, "ngram:2", _request(max_new_tokens=20))
    run_id = store.list_runs().iloc[0]["run_id"]
    with duckdb.connect(str(path)) as con:  # what kill -9 leaves behind
        con.execute("UPDATE runs SET status = 'running', tokens = NULL, n_tokens = NULL, output_text = NULL, writer = ? "
                    "WHERE run_id = ?", [f"{__import__('socket').gethostname()}:999999999", run_id])
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(path.read_bytes())
    shared = Store(copy, read_only=True).get_run(run_id)
    assert shared["status"] == "running" and list(shared["tokens"]) == run.tokens and shared["n_tokens"] == len(run.tokens)
    row = Store(path).get_run(run_id)
    assert row["status"] == "interrupted" and list(row["tokens"]) == run.tokens and row["n_tokens"] == len(run.tokens)
    assert row["output_text"] == "".join(record.token_text for record in run.records) and row["target_passes"] == run.blocks


def test_complete_groups_brings_every_member_reference_first(tmp_path: Path, tiny) -> None:
    """A selection touching two groups and a lone run: each group whole, in creation order, placed
    at its first selected member; the added runs are named per group; unknown ids are kept."""
    from diagnostics.store import complete_groups, export_runs

    store = Store(tmp_path / "runs.duckdb")
    first, results_a, _ = compare_rules(store, tiny, "ngram:2", [_request(rule=rule) for rule in ("lossless", "lenience:0.1", "cascade:0.9")])
    second, results_b, _ = compare_rules(store, tiny, "ngram:2", [_request(rule=rule, seed=2) for rule in ("lossless", "greedy")])
    lone, _ = record_run(store, tiny, "ngram:2", _request())
    a, b = [run_id for run_id, _ in results_a], [run_id for run_id, _ in results_b]
    completion = complete_groups(store, [lone, b[1], a[2], "missing", a[0]])
    assert completion.run_ids == [lone, *b, *a, "missing"]
    assert completion.added == {second: [b[0]], first: [a[1]]}
    assert completion.notes() == [f"added 1 run of group {second} ({b[0]}) so the group is exported whole",
                                  f"added 1 run of group {first} ({a[1]}) so the group is exported whole"]
    whole = complete_groups(store, [*a, lone])
    assert whole.run_ids == [*a, lone] and whole.added == {} and whole.notes() == []
    assert complete_groups(store, []).run_ids == []
    exported = Store(export_runs(store, [a[1]], tmp_path / "one.duckdb"))
    assert exported.group(first)["run_id"].tolist() == a and len(exported.list_runs()) == 3


def test_the_decoded_text_skips_special_tokens_but_the_ids_keep_eos(tmp_path: Path, tiny) -> None:
    """A run that ends on EOS: its token ids end with the EOS id, its text (printed and stored) does not show it."""
    store = Store(tmp_path / "runs.duckdb")
    eos = tiny.tokenizer.eos_token_id
    for seed in range(40):
        run_id, run = record_run(store, tiny, "ngram:2", _request(seed=seed, max_new_tokens=40, rule="lossless"))
        if run.stop_reason == "eos":
            break
    assert run.stop_reason == "eos" and run.tokens[-1] == eos, "no seed ended on EOS"
    eos_text = tiny.tokenizer.convert_ids_to_tokens(eos)
    assert eos_text not in run.text.split()
    assert run.text == tiny.tokenizer.decode(run.tokens, skip_special_tokens=True)
    row = store.get_run(run_id)
    assert row["output_text"] == run.text and list(row["tokens"])[-1] == eos


def test_mark_interrupted_closes_only_runs_left_running(tmp_path: Path, tiny) -> None:
    store = Store(tmp_path / "runs.duckdb")
    done, _ = record_run(store, tiny, "ngram:2", _request())
    left = store.start_run({"prompt": "p", "rule": "lossless", "target": "t", "draft": "ngram:2", "gamma": 3, "seed": 0,
                            "max_new_tokens": 8, "policy": "{}", "draft_policy": "{}", "prompt_ids": [1]})
    assert store.mark_interrupted([done, left]) == [left]
    assert store.get_run(left)["status"] == "interrupted" and store.get_run(done)["status"] == "complete"
    assert store.mark_interrupted([left]) == []


def test_a_schema_4_file_gains_the_draft_stop_column(tmp_path) -> None:
    """Schema 5 appends runs.draft_stop: a schema-4 file (sweeps, no draft stop) opens read-only as it
    is and replays as a run without adaptive drafting; a writable open migrates it, rows unchanged."""
    import duckdb

    from diagnostics.request import request_from_run

    path = tmp_path / "runs.duckdb"
    store = Store(path)
    run_id = store.start_run({"rule": "lossless", "prompt": "hi", "target": "tiny", "seed": 1, "max_new_tokens": 4,
                              "draft": "early-exit:1", "gamma": 3, "draft_stop": 0.5})
    assert request_from_run(store.get_run(run_id)).draft_stop == 0.5
    with duckdb.connect(str(path)) as con:
        con.execute("ALTER TABLE runs DROP COLUMN draft_stop")
        con.execute("ALTER TABLE runs DROP COLUMN device")
        con.execute("ALTER TABLE sweep_runs DROP COLUMN score")
        con.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    old = Store(path, read_only=True)
    assert "draft_stop" not in old.get_run(run_id) and request_from_run(old.get_run(run_id)).draft_stop is None
    migrated = Store(path)
    assert migrated.schema_version() == SCHEMA_VERSION and migrated.get_run(run_id)["draft_stop"] is None


def test_a_file_handle_conflict_between_threads_is_waited_out(tmp_path: Path, monkeypatch) -> None:
    """DuckDB refuses a connect made while another thread of the process is connecting to the same
    file ("Unique file handle conflict"; 4 in 600 connects from three threads here, and once in CI,
    where it failed the Sweeps page after a Stop). The store retries it like a lock."""
    import diagnostics.store.core as core

    store = Store(tmp_path / "runs.duckdb")
    real = core.duckdb.connect
    refused: list[str] = []

    def once_busy(path, **kwargs):
        if not refused:
            refused.append(path)
            raise duckdb.IOException('Resource In Use Error: Unique file handle conflict: Cannot attach "runs" - '
                                     'the database file "runs.duckdb" is already attached by database "runs"')
        return real(path, **kwargs)

    monkeypatch.setattr(core.duckdb, "connect", once_busy)
    assert store.list_runs().empty and refused


def test_a_schema_6_file_gains_the_device_column(tmp_path) -> None:
    """Schema 7 appends runs.device (where a run ran): a schema-6 file opens read-only with the device
    unknown, and a writable open migrates it, its rows unchanged; new runs store the device."""
    import duckdb

    path = tmp_path / "runs.duckdb"
    store = Store(path)
    run_id = store.start_run({"rule": "lossless", "prompt": "hi", "target": "tiny", "seed": 1, "max_new_tokens": 4,
                              "device": "cuda:0 bfloat16"})
    assert store.get_run(run_id)["device"] == "cuda:0 bfloat16"
    with duckdb.connect(str(path)) as con:
        con.execute("ALTER TABLE runs DROP COLUMN device")
        con.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    old = Store(path, read_only=True)
    assert old.schema_version() == 6 and "device" not in old.get_run(run_id)
    migrated = Store(path)
    assert migrated.schema_version() == SCHEMA_VERSION == 7
    assert migrated.get_run(run_id)["device"] is None and migrated.get_run(run_id)["prompt"] == "hi"
