"""DuckDB storage of runs and positions: the only module that speaks SQL.

* ``runs``: one row per run (status ``running`` → ``complete`` / ``interrupted`` / ``failed``).
* ``positions``: one row per emitted position, written in Arrow batches.
* ``audits``: one row per losslessness audit (layer, implementation, verdict, and the whole
  evidence as JSON), optionally tied to the run it audited (schema 2).
* ``meta``: the schema version; older files are migrated, newer ones refused with a message.

Connections are opened briefly and retried while another process holds the file's lock, so
a CLI writing while the dashboard reads gets its turn or a clear ``StoreBusy`` after a bounded
wait. A run whose writer died is found by its pid and marked ``interrupted``; what it recorded
is kept.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from diagnostics import __version__
from diagnostics.audit.reporting import json_safe
from diagnostics.engine import PositionRecord

SCHEMA_VERSION = 2
# Read-only opens accept files this old: newer schemas only added tables, read as empty.
OLDEST_READABLE = 1
DEFAULT_DB = Path(__file__).resolve().parents[1] / "data" / "runs.duckdb"
LOCK_WAIT_S = 20.0
STATUSES = ("running", "complete", "interrupted", "failed")


class StoreError(RuntimeError):
    """The database cannot be used as asked; the message says what to do."""


class StoreBusy(StoreError):
    """Another process kept the database locked for longer than the bounded wait."""


def default_db_path() -> Path:
    """``$SPECLAB_DB`` when set, else ``data/runs.duckdb`` in the checkout."""
    configured = os.environ.get("SPECLAB_DB")
    return Path(configured).expanduser() if configured else DEFAULT_DB


RUN_COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR PRIMARY KEY",
    "created": "TIMESTAMP",
    "finished": "TIMESTAMP",
    "status": "VARCHAR",
    "error": "VARCHAR",
    "target": "VARCHAR",
    "draft": "VARCHAR",
    "rule": "VARCHAR",
    "rule_name": "VARCHAR",
    "rule_params": "VARCHAR",
    "policy": "VARCHAR",
    "draft_policy": "VARCHAR",
    "gamma": "INTEGER",
    "seed": "BIGINT",
    "max_new_tokens": "INTEGER",
    "prompt": "VARCHAR",
    "prompt_ids": "INTEGER[]",
    "raw_prompt": "BOOLEAN",
    "output_text": "VARCHAR",
    "tokens": "INTEGER[]",
    "n_tokens": "INTEGER",
    "drafted": "INTEGER",
    "accepted": "INTEGER",
    "target_passes": "INTEGER",
    "acceptance_rate": "DOUBLE",
    "block_efficiency": "DOUBLE",
    "tokens_per_s": "DOUBLE",
    "time_s": "DOUBLE",
    "mean_tv_target": "DOUBLE",
    "mean_tv_baseline": "DOUBLE",
    "max_tv_target": "DOUBLE",
    "stop_reason": "VARCHAR",
    "group_id": "VARCHAR",
    "divergence_position": "INTEGER",
    "software_version": "VARCHAR",
    "writer": "VARCHAR",
}

POSITION_COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR",
    "position": "INTEGER",
    "block": "INTEGER",
    "index_in_block": "INTEGER",
    "kind": "VARCHAR",
    "token": "INTEGER",
    "draft_token": "INTEGER",
    "p_token": "DOUBLE",
    "p_draft": "DOUBLE",
    "q_draft": "DOUBLE",
    "accept_prob": "DOUBLE",
    "u_draft": "DOUBLE",
    "u_accept": "DOUBLE",
    "u_fallback": "DOUBLE",
    "alpha": "DOUBLE",
    "tv_pq": "DOUBLE",
    "entropy_p": "DOUBLE",
    "entropy_q": "DOUBLE",
    "overshoot": "DOUBLE",
    "severe_overshoot": "DOUBLE",
    "allowed_size": "INTEGER",
    "allowed_mass": "DOUBLE",
    "tv_target": "DOUBLE",
    "tv_baseline": "DOUBLE",
    "kl_target": "DOUBLE",
    "p_top_ids": "INTEGER[]",
    "p_top_probs": "DOUBLE[]",
    "p_tail": "DOUBLE",
    "q_top_ids": "INTEGER[]",
    "q_top_probs": "DOUBLE[]",
    "q_tail": "DOUBLE",
    "token_text": "VARCHAR",
    "draft_text": "VARCHAR",
}
_ARROW_SCHEMA = pa.schema(
    [
        pa.field(
            name,
            {
                "VARCHAR": pa.string(), "INTEGER": pa.int32(), "DOUBLE": pa.float64(),
                "INTEGER[]": pa.list_(pa.int32()), "DOUBLE[]": pa.list_(pa.float64()),
            }[sql],
        )
        for name, sql in POSITION_COLUMNS.items()
    ]
)
assert set(POSITION_COLUMNS) - {"run_id"} == {f.name for f in fields(PositionRecord)}

AUDIT_COLUMNS: dict[str, str] = {
    "audit_id": "VARCHAR PRIMARY KEY",
    "created": "TIMESTAMP",
    "layer": "VARCHAR",  # rule, engine or recorded
    "implementation": "VARCHAR",
    "verdict": "VARCHAR",  # pass or fail
    "run_id": "VARCHAR",  # the audited run (recorded layer), else NULL
    "summary": "VARCHAR",
    "evidence": "VARCHAR",  # JSON: the audit's as_dict()
    "software_version": "VARCHAR",
}
_CREATE_AUDITS = "CREATE TABLE IF NOT EXISTS audits (" + ", ".join(f"{name} {sql}" for name, sql in AUDIT_COLUMNS.items()) + ")"

# Migrations from version N to N + 1, applied in order to older files.
MIGRATIONS: dict[int, list[str]] = {1: [_CREATE_AUDITS]}


def _json_default(value: Any) -> Any:
    """JSON for what ``json`` does not know (numpy scalars, sets); infinities are written as null later."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # stored as UTC


def _writer_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(tag: str | None) -> bool:
    """Whether the process that wrote ``host:pid`` still runs (unknown hosts count as alive)."""
    if not tag or ":" not in tag:
        return True
    host, _, pid = tag.rpartition(":")
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


class Store:
    """A DuckDB file of runs. Every method opens and closes its own short connection."""

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False, lock_wait_s: float = LOCK_WAIT_S) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.read_only = read_only
        self.lock_wait_s = lock_wait_s
        if read_only:
            if not self.path.is_file():
                raise StoreError(f"no database at {self.path}; check the path")
            self._check_version()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._initialise()
            self._reap_dead_writers()

    # -- connections --------------------------------------------------------------------------

    @contextmanager
    def connect(self, read_only: bool | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short connection, retried while another process holds the lock (bounded wait)."""
        read_only = self.read_only if read_only is None else read_only or self.read_only
        deadline = time.monotonic() + self.lock_wait_s
        delay = 0.05
        while True:
            try:
                connection = duckdb.connect(str(self.path), read_only=read_only)
                break
            except duckdb.IOException as error:
                message = str(error)
                if "lock" in message.lower():
                    if time.monotonic() >= deadline:
                        raise StoreBusy(
                            f"{self.path} is busy: another process has held it for {self.lock_wait_s:.0f} s; "
                            "try again when it finishes"
                        ) from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                if "not a valid DuckDB database" in message or "corrupt" in message.lower():
                    raise StoreError(
                        f"{self.path} is not a readable DuckDB database (corrupt or another format); "
                        "move it aside or pass --db another file: nothing was changed"
                    ) from None
                raise StoreError(f"cannot open {self.path}: {message.splitlines()[0]}") from None
            except duckdb.Error as error:
                raise StoreError(f"cannot open {self.path}: {str(error).splitlines()[0]}") from None
        try:
            yield connection
        finally:
            connection.close()

    # -- schema -------------------------------------------------------------------------------

    def _initialise(self) -> None:
        with self.connect() as con:
            con.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
            row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            tables = {name for (name,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            if row is None and "runs" in tables:
                raise StoreError(f"{self.path} has runs but no schema version; it was not written by this tool")
            version = int(row[0]) if row else SCHEMA_VERSION
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} uses schema {version}, newer than this tool's {SCHEMA_VERSION}; upgrade the tool"
                )
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step]:
                    con.execute(statement)
            con.execute(
                "CREATE TABLE IF NOT EXISTS runs ("
                + ", ".join(f"{name} {sql}" for name, sql in RUN_COLUMNS.items()) + ")"
            )
            con.execute(
                "CREATE TABLE IF NOT EXISTS positions ("
                + ", ".join(f"{name} {sql}" for name, sql in POSITION_COLUMNS.items())
                + ", PRIMARY KEY (run_id, position))"
            )
            con.execute(_CREATE_AUDITS)
            con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])

    def _check_version(self) -> None:
        with self.connect(read_only=True) as con:
            try:
                row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            except duckdb.CatalogException:
                raise StoreError(f"{self.path} is not a runs database of this tool (no schema version)") from None
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} uses schema {version}, newer than this tool's {SCHEMA_VERSION}; upgrade the tool")
        if version < OLDEST_READABLE:
            raise StoreError(
                f"{self.path} uses schema {version}; open a copy without --read-only once to migrate it"
            )

    def schema_version(self) -> int:
        with self.connect(read_only=True) as con:
            return int(con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])

    def _reap_dead_writers(self) -> None:
        """Runs left ``running`` by a process that no longer exists become ``interrupted``."""
        with self.connect() as con:
            rows = con.execute("SELECT run_id, writer FROM runs WHERE status = 'running'").fetchall()
            for run_id, writer in rows:
                if not _alive(writer):
                    con.execute(
                        "UPDATE runs SET status = 'interrupted', error = 'the writing process ended before the run finished' "
                        "WHERE run_id = ?", [run_id],
                    )

    # -- writes -------------------------------------------------------------------------------

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only (a shared file); import it into your own database to change it")

    def start_run(self, fields_: dict[str, Any]) -> str:
        """Insert a ``running`` run and return its id."""
        self._writable()
        run_id = fields_.get("run_id") or uuid.uuid4().hex[:12]
        row = {name: None for name in RUN_COLUMNS}
        row.update({key: value for key, value in fields_.items() if key in RUN_COLUMNS})
        row.update(run_id=run_id, created=_now(), status="running", software_version=__version__, writer=_writer_tag())
        for key in ("rule_params", "policy", "draft_policy"):
            if row[key] is not None and not isinstance(row[key], str):
                row[key] = json.dumps(row[key], sort_keys=True)
        columns = list(row)
        with self.connect() as con:
            con.execute(
                f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                [row[name] for name in columns],
            )
        return run_id

    def add_positions(self, run_id: str, records: list[PositionRecord]) -> None:
        """Append records in one Arrow batch."""
        self._writable()
        if not records:
            return
        columns: dict[str, list[Any]] = {name: [] for name in POSITION_COLUMNS}
        for record in records:
            columns["run_id"].append(run_id)
            for name in POSITION_COLUMNS:
                if name != "run_id":
                    columns[name].append(getattr(record, name))
        batch = pa.table(columns, schema=_ARROW_SCHEMA)
        with self.connect() as con:
            con.register("position_batch", batch)
            con.execute("INSERT INTO positions SELECT * FROM position_batch")
            con.unregister("position_batch")

    def finish_run(self, run_id: str, status: str, summary: dict[str, Any] | None = None, error: str | None = None) -> None:
        """Set the final status and the summary columns."""
        self._writable()
        if status not in STATUSES:
            raise StoreError(f"unknown status {status!r}")
        values = {key: value for key, value in (summary or {}).items() if key in RUN_COLUMNS and key != "run_id"}
        values.update(status=status, error=error, finished=_now())
        assignments = ", ".join(f"{key} = ?" for key in values)
        with self.connect() as con:
            con.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?", [*values.values(), run_id])

    def set_group(self, run_ids: list[str], group_id: str, divergence: dict[str, int | None]) -> None:
        """Tag coupled runs with one group id and each run's first divergence from the group's first run."""
        self._writable()
        with self.connect() as con:
            for run_id in run_ids:
                con.execute(
                    "UPDATE runs SET group_id = ?, divergence_position = ? WHERE run_id = ?",
                    [group_id, divergence.get(run_id), run_id],
                )

    def delete_runs(self, run_ids: list[str]) -> int:
        """Delete runs and their positions; returns how many runs were removed."""
        self._writable()
        if not run_ids:
            return 0
        marks = ", ".join("?" for _ in run_ids)
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            con.execute(f"DELETE FROM positions WHERE run_id IN ({marks})", run_ids)
            con.execute(f"DELETE FROM audits WHERE run_id IN ({marks})", run_ids)
            removed = con.execute(f"DELETE FROM runs WHERE run_id IN ({marks}) RETURNING run_id", run_ids).fetchall()
            con.execute("COMMIT")
        return len(removed)

    # -- queries ------------------------------------------------------------------------------

    def list_runs(self, status: str | None = None, search: str | None = None) -> pd.DataFrame:
        """Runs, newest first, optionally filtered by status and by text in prompt, rule or models."""
        clauses, params = [], []
        if status:
            clauses.append("status = ?")
            params.append(status)
        if search:
            clauses.append("(prompt ILIKE ? OR rule ILIKE ? OR target ILIKE ? OR draft ILIKE ?)")
            params.extend([f"%{search}%"] * 4)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self.connect(read_only=self.read_only) as con:
            return con.execute(f"SELECT * FROM runs {where} ORDER BY created DESC", params).df()

    def _one(self, sql: str, params: list[Any]) -> dict[str, Any] | None:
        """One row as a plain dict (``None`` for SQL NULL), or ``None`` when there is no row."""
        with self.connect(read_only=self.read_only) as con:
            cursor = con.execute(sql, params)
            row = cursor.fetchone()
            names = [column[0] for column in cursor.description]
        return dict(zip(names, row)) if row is not None else None

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        return self._one("SELECT * FROM runs WHERE run_id = ?", [run_id])

    def positions(self, run_id: str) -> pd.DataFrame:
        """Every recorded position of a run, in order."""
        with self.connect(read_only=self.read_only) as con:
            return con.execute("SELECT * FROM positions WHERE run_id = ? ORDER BY position", [run_id]).df()

    def position(self, run_id: str, position: int) -> dict[str, Any] | None:
        """One position with its top-k of ``p`` and ``q``."""
        return self._one("SELECT * FROM positions WHERE run_id = ? AND position = ?", [run_id, position])

    # -- audits -------------------------------------------------------------------------------

    def add_audit(self, evidence: dict[str, Any], summary: str, run_id: str | None = None) -> str:
        """Store one audit (``evidence`` is its ``as_dict()``, with ``layer``, ``implementation``
        or ``run_id``, and ``verdict``) and return its id."""
        self._writable()
        audit_id = uuid.uuid4().hex[:12]
        implementation = evidence.get("implementation") or f"recorded run {evidence.get('run_id')}"
        with self.connect() as con:
            con.execute(
                f"INSERT INTO audits ({', '.join(AUDIT_COLUMNS)}) VALUES ({', '.join('?' for _ in AUDIT_COLUMNS)})",
                [audit_id, _now(), evidence.get("layer"), implementation, evidence.get("verdict"),
                 run_id or evidence.get("run_id"), summary, json.dumps(json_safe(evidence), default=_json_default), __version__],
            )
        return audit_id

    def _has_audits(self, con: duckdb.DuckDBPyConnection) -> bool:
        # A read-only schema-1 file has no audits table: it simply has no audits.
        rows = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'audits'").fetchall()
        return bool(rows[0][0])

    def list_audits(self, run_ids: list[str] | None = None) -> pd.DataFrame:
        """Audits, newest first (without the evidence JSON); only those of ``run_ids`` when given."""
        columns = [name for name in AUDIT_COLUMNS if name != "evidence"]
        with self.connect(read_only=self.read_only) as con:
            if not self._has_audits(con):
                return pd.DataFrame(columns=columns)
            where, params = "", []
            if run_ids is not None:
                where = f"WHERE run_id IN ({', '.join('?' for _ in run_ids)})" if run_ids else "WHERE false"
                params = list(run_ids)
            return con.execute(f"SELECT {', '.join(columns)} FROM audits {where} ORDER BY created DESC", params).df()

    def get_audit(self, audit_id: str) -> dict[str, Any] | None:
        """One audit with its evidence parsed back from JSON, or ``None``."""
        with self.connect(read_only=self.read_only) as con:
            if not self._has_audits(con):
                return None
        row = self._one("SELECT * FROM audits WHERE audit_id = ?", [audit_id])
        if row is not None:
            row["evidence"] = json.loads(row["evidence"])
        return row

    def group(self, group_id: str) -> pd.DataFrame:
        """The coupled runs of one comparison, in the order they were run."""
        with self.connect(read_only=self.read_only) as con:
            return con.execute("SELECT * FROM runs WHERE group_id = ? ORDER BY created", [group_id]).df()


class RunWriter:
    """Buffers one run's records and writes them in Arrow batches (by count or age)."""

    def __init__(self, store: Store, run_fields: dict[str, Any], batch_size: int = 256, max_age_s: float = 1.0) -> None:
        self.store = store
        self.run_id = store.start_run(run_fields)
        self.batch_size = batch_size
        self.max_age_s = max_age_s
        self._buffer: list[PositionRecord] = []
        self._since = time.monotonic()

    def add(self, record: PositionRecord) -> None:
        self._buffer.append(record)
        if len(self._buffer) >= self.batch_size or time.monotonic() - self._since >= self.max_age_s:
            self.flush()

    def flush(self) -> None:
        self.store.add_positions(self.run_id, self._buffer)
        self._buffer = []
        self._since = time.monotonic()

    def finish(self, status: str, summary: dict[str, Any] | None = None, error: str | None = None) -> None:
        """Flush what is buffered, then record the final status: nothing recorded is lost."""
        self.flush()
        self.store.finish_run(self.run_id, status, summary, error)


# -- sharing ---------------------------------------------------------------------------------

def export_runs(store: Store, run_ids: list[str], path: str | Path, fmt: str = "duckdb") -> Path:
    """Write the selected runs (their positions, and in ``duckdb`` their audits) to one file another user can open read-only.

    ``duckdb``: a database with this schema. ``parquet``: one table, each position row carrying
    its run's columns prefixed ``run.``; ``import_runs`` turns it back into a database.
    """
    path = Path(path)
    if not run_ids:
        raise StoreError("select at least one run to export")
    if path.exists():
        path.unlink()
    marks = ", ".join("?" for _ in run_ids)
    with store.connect(read_only=True) as con:
        runs = con.sql(f"SELECT * FROM runs WHERE run_id IN ({marks})", params=run_ids).to_arrow_table()
        positions = con.sql(f"SELECT * FROM positions WHERE run_id IN ({marks}) ORDER BY run_id, position", params=run_ids).to_arrow_table()
        audits = (con.sql(f"SELECT * FROM audits WHERE run_id IN ({marks})", params=run_ids).to_arrow_table()
                  if store._has_audits(con) else None)
    if fmt == "duckdb":
        target = Store(path)
        with target.connect() as con:
            con.register("incoming_runs", runs)
            con.register("incoming_positions", positions)
            con.execute("INSERT INTO runs SELECT * FROM incoming_runs")
            con.execute("INSERT INTO positions SELECT * FROM incoming_positions")
            if audits is not None:  # the audits of the exported runs travel with them
                con.register("incoming_audits", audits)
                con.execute("INSERT INTO audits SELECT * FROM incoming_audits")
        return path
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with duckdb.connect() as con:
            con.register("r", runs)
            con.register("p", positions)
            columns = ", ".join(f'r."{name}" AS "run.{name}"' for name in RUN_COLUMNS)
            table = con.sql(f"SELECT p.*, {columns} FROM p JOIN r USING (run_id) ORDER BY run_id, position").to_arrow_table()
        pq.write_table(table, path)
        return path
    raise StoreError(f"unknown export format {fmt!r}; use duckdb or parquet")


def import_runs(source: str | Path, destination: str | Path) -> Store:
    """Make a shared file browsable: a DuckDB file is checked and opened read-only as is; a Parquet
    export is rebuilt into the DuckDB file ``destination`` first."""
    source = Path(source)
    if source.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(source)
        except Exception as error:  # pyarrow raises several types for a bad file
            raise StoreError(f"{source.name} is not a Parquet export of this tool ({error.__class__.__name__})") from None
        names = table.column_names
        if "run.run_id" not in names:
            raise StoreError(f"{source.name} is not a Parquet export of this tool (no run columns)")
        destination = Path(destination)
        if destination.exists():
            destination.unlink()
        rebuilt = Store(destination)
        with rebuilt.connect() as con:
            con.register("shared", table)
            run_columns = ", ".join(f'"run.{name}" AS {name}' for name in RUN_COLUMNS)
            con.execute(f"INSERT INTO runs SELECT DISTINCT {run_columns} FROM shared")
            con.execute(f"INSERT INTO positions SELECT {', '.join(POSITION_COLUMNS)} FROM shared")
        return Store(destination, read_only=True)
    return Store(source, read_only=True)
