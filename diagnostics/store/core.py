"""DuckDB storage of runs and positions: the only place that speaks SQL (with ``schema`` and
``validation`` beside it).

* ``runs``: one row per run (status ``running`` → ``complete`` / ``interrupted`` / ``failed``).
* ``positions``: one row per emitted position, written in Arrow batches.
* ``audits``: one row per losslessness audit (layer, implementation, verdict, and the whole
  evidence as JSON), optionally tied to the run it audited (schema 2).
* ``meta``: the schema version; older files are migrated, newer ones refused with a message.

A file is looked at before anything is written to it: one that is not this tool's (another
program's tables, other columns, a schema version that is not a number, damaged bytes) is
refused with one line and left byte-identical. A file opened read-only (a colleague's) is
also checked value by value once (``validation``), so whatever opens renders everywhere.

Connections are opened briefly and retried while another process holds the file's lock, so
a CLI writing while the dashboard reads gets its turn or a clear ``StoreBusy`` after a bounded
wait. A run whose writer died is found by its pid and marked ``interrupted``, with its token
list, count and text rebuilt from the positions it stored. Every DuckDB error becomes a
``StoreError`` with one line (``StoreFull`` when the disk is full).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from diagnostics import __version__
from diagnostics.audit.reporting import json_safe
from diagnostics.engine import PositionRecord
from diagnostics.store.schema import (
    ARROW_POSITIONS,
    AUDIT_COLUMNS,
    CREATE,
    MIGRATIONS,
    POSITION_COLUMNS,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    STATUSES,
    schema_problem,
)
from diagnostics.store.errors import StoreBusy, StoreError, StoreFull
from diagnostics.store.sweeps import SweepTables
from diagnostics.store.trees import TreeTables
from diagnostics.store.validation import content_problem
from diagnostics.untrusted_json import loads

DEFAULT_DB = Path(__file__).resolve().parents[2] / "data" / "runs.duckdb"
LOCK_WAIT_S = 20.0
# Phrases of DuckDB (and OS) errors, lower case, by what they mean to the user.
_BUSY = ("lock", "different configuration", "unique file handle conflict")  # the last: two threads of one process connecting at once
_DISK_FULL = ("no space left", "file too large", "disk quota")
_DAMAGED = ("not a valid duckdb", "corrupt", "could not read enough bytes", "checksum", "invalid block",
            "serialization error", "failed to read")


def default_db_path() -> Path:
    """``$SPECLAB_DB`` when set, else ``data/runs.duckdb`` in the checkout."""
    configured = os.environ.get("SPECLAB_DB")
    return Path(configured).expanduser() if configured else DEFAULT_DB


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


# Files already checked in this process, so the dashboard's reruns do not look again:
# writable files by device and inode; read-only ones also by size and modification time.
_CHECKED: set[tuple] = set()


def _identity(path: Path, with_content: bool) -> tuple:
    stat = path.stat()
    return (stat.st_dev, stat.st_ino) + ((stat.st_size, stat.st_mtime_ns) if with_content else ())


def _blocking_file(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is a file (so no folder can be made there)."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def _summary_from_positions(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """The summary columns that the stored positions determine: the token list, its length and
    text (token texts joined), accepted drafts, target passes (blocks), block efficiency and
    the distortion means. Used for a run whose writer died before it wrote them."""
    tokens, count, text, accepted, blocks, mean_tv, mean_baseline, max_tv = con.execute(
        "SELECT list(token ORDER BY position), count(*), string_agg(token_text, '' ORDER BY position), "
        "count(*) FILTER (WHERE kind = 'accepted'), count(DISTINCT block), avg(tv_target), avg(tv_baseline), max(tv_target) "
        "FROM positions WHERE run_id = ?", [run_id]).fetchone()
    return {"tokens": list(tokens or []), "n_tokens": int(count), "output_text": text or "", "accepted": int(accepted),
            "target_passes": int(blocks), "block_efficiency": count / blocks if blocks else None,
            "mean_tv_target": mean_tv, "mean_tv_baseline": mean_baseline, "max_tv_target": max_tv}


class Store(TreeTables, SweepTables):
    """A DuckDB file of runs. Every method opens and closes its own short connection."""

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False, lock_wait_s: float = LOCK_WAIT_S) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.read_only = read_only
        self.lock_wait_s = lock_wait_s
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a folder, not a database file; pass a file path such as {self.path / 'runs.duckdb'}")
        if read_only:
            if not self.path.is_file():
                raise StoreError(f"no database at {self.path}; check the path")
            self._check_shared()
        else:
            self._make_folder()
            self._initialise()

    # -- connections --------------------------------------------------------------------------

    def _translated(self, error: BaseException) -> StoreError:
        """One line for a DuckDB or OS error: disk full, damaged file, or what DuckDB said."""
        message = str(error).strip() or error.__class__.__name__
        lower = message.lower()
        if any(phrase in lower for phrase in _DISK_FULL):
            reason = next(phrase for phrase in _DISK_FULL if phrase in lower)
            return StoreFull(f"the disk holding {self.path} is full ({reason}); free some space or pass --db a file on "
                             "another disk (runs already stored are kept)")
        if any(phrase in lower for phrase in _DAMAGED):
            return StoreError(f"{self.path} is not a readable DuckDB database (damaged, truncated or another format); "
                              "move it aside or pass --db another file: nothing was changed")
        return StoreError(f"cannot use {self.path}: {message.splitlines()[0][:300]}")

    def _open(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        deadline = time.monotonic() + self.lock_wait_s
        delay = 0.05
        while True:
            try:
                return duckdb.connect(str(self.path), read_only=read_only)
            except duckdb.Error as error:
                # Another process holds the lock, or another thread of this one holds a
                # connection opened read-only/read-write: wait for its turn (bounded).
                if any(phrase in str(error).lower() for phrase in _BUSY):
                    if time.monotonic() >= deadline:
                        raise StoreBusy(
                            f"{self.path} is busy: another process has held it for {self.lock_wait_s:.0f} s; "
                            "try again when it finishes"
                        ) from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                raise self._translated(error) from None
            except OSError as error:
                raise self._translated(error) from None

    @contextmanager
    def connect(self, read_only: bool | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short connection, retried while another process holds the lock (bounded wait); any
        DuckDB error inside becomes a one-line ``StoreError``."""
        read_only = self.read_only if read_only is None else read_only or self.read_only
        connection = self._open(read_only)
        try:
            yield connection
        except duckdb.Error as error:
            raise self._translated(error) from None
        finally:
            try:
                connection.close()  # closing may checkpoint: a full disk can show up here
            except duckdb.Error as error:
                raise self._translated(error) from None

    # -- schema -------------------------------------------------------------------------------

    def _make_folder(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            blocking = _blocking_file(self.path) or self.path.parent
            raise StoreError(f"cannot create {self.path}: {blocking} is a file, not a folder; pass --db a path inside a folder") from None
        except OSError as error:
            raise StoreError(f"cannot create the folder {self.path.parent}: {error.strerror or error}; pass --db a path you can write") from None

    def _initialise(self) -> None:
        """Look at an existing file first (read-only); create or migrate only a file of this tool,
        in one transaction; then reap the runs of writers that died."""
        exists = self.path.exists()
        if exists and self.path.stat().st_size == 0:
            raise StoreError(f"{self.path} is an empty file, not a DuckDB database; delete it or pass --db another file: nothing was changed")
        version, running = None, []
        if exists:
            known = _identity(self.path, with_content=False) in _CHECKED
            with self.connect(read_only=not known) as con:
                version, problem = schema_problem(con)
                if problem:
                    raise StoreError(f"{self.path} {problem}; nothing was changed")
                if version is not None:
                    running = con.execute("SELECT run_id, writer FROM runs WHERE status = 'running'").fetchall()
        if version is None or version < SCHEMA_VERSION:
            with self.connect() as con:
                con.execute("BEGIN TRANSACTION")
                try:
                    if version is None:
                        for statement in CREATE.values():
                            con.execute(statement)
                    else:
                        for step in range(version, SCHEMA_VERSION):
                            for statement in MIGRATIONS[step]:
                                con.execute(statement)
                    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
        _CHECKED.add(_identity(self.path, with_content=False))
        dead = [run_id for run_id, writer in running if not _alive(writer)]
        if dead:
            self._reap(dead)

    def _check_shared(self) -> None:
        """A file opened read-only: its schema, then every value the pages read (once per content)."""
        identity = ("shared", *_identity(self.path, with_content=True))
        if identity in _CHECKED:
            return
        with self.connect(read_only=True) as con:
            version, problem = schema_problem(con)
            if problem is None and version is None:
                problem = "is an empty database, not a runs file of this tool"
            if problem is None:
                problem = content_problem(con, has_audits=self._has_audits(con))
                problem = problem and f"is not a runs file this tool can show: {problem}"
        if problem:
            raise StoreError(f"{self.path} {problem}; nothing was changed")
        _CHECKED.add(identity)

    def schema_version(self) -> int:
        with self.connect(read_only=True) as con:
            return int(con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])

    def mark_interrupted(self, run_ids: list[str]) -> list[str]:
        """Those of ``run_ids`` still ``running`` become ``interrupted`` as the reaper leaves a dead
        writer's runs (summary rebuilt from their positions): for a writer of this process that was
        stopped and is gone, e.g. a page's generation ended by Stop. Returns the ids changed."""
        self._writable()
        running = [run_id for run_id in run_ids if (self.get_run(run_id) or {}).get("status") == "running"]
        if running:
            self._reap(running)
        return running

    def _reap(self, run_ids: list[str]) -> None:
        """Runs left ``running`` by a process that no longer exists become ``interrupted``, with the
        summary columns their positions determine (tokens, count, text, blocks, distortion)."""
        with self.connect() as con:
            for run_id in run_ids:
                values = {**_summary_from_positions(con, run_id), "status": "interrupted", "finished": _now(),
                          "stop_reason": "interrupted",
                          "error": "the writing process ended before the run finished; kept what it stored"}
                assignments = ", ".join(f"{key} = ?" for key in values)
                con.execute(f"UPDATE runs SET {assignments} WHERE run_id = ? AND status = 'running'", [*values.values(), run_id])

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
        self.add_many([(run_id, records)], [])

    def add_many(self, positions: list[tuple[str, list[PositionRecord]]],
                 trees: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]],
                 finishes: list[tuple[str, str, dict[str, Any] | None, str | None]] | None = None) -> None:
        """Append the records of several runs (and their tree rounds and nodes) in one connection,
        one Arrow batch per table, then set the final status of the runs in ``finishes`` (``run_id,
        status, summary, error``, as ``finish_run``): what a batch of runs writes as it goes."""
        self._writable()
        updates = [self._finish_values(*finish) for finish in finishes or []]
        columns: dict[str, list[Any]] = {name: [] for name in POSITION_COLUMNS}
        for run_id, records in positions:
            for record in records:
                columns["run_id"].append(run_id)
                for name in POSITION_COLUMNS:
                    if name != "run_id":
                        columns[name].append(getattr(record, name))
        rounds = [{**row, "run_id": run_id} for run_id, run_rounds, _ in trees for row in run_rounds]
        nodes = [{**row, "run_id": run_id} for run_id, _, run_nodes in trees for row in run_nodes]
        if not columns["run_id"] and not rounds and not nodes and not updates:
            return
        with self.connect() as con:
            if columns["run_id"]:
                con.register("position_batch", pa.table(columns, schema=ARROW_POSITIONS))
                con.execute("INSERT INTO positions SELECT * FROM position_batch")
                con.unregister("position_batch")
            if rounds or nodes:
                self.insert_tree_rows(con, rounds, nodes)
            for run_id, values in updates:
                con.execute(f"UPDATE runs SET {', '.join(f'{key} = ?' for key in values)} WHERE run_id = ?", [*values.values(), run_id])

    def finish_run(self, run_id: str, status: str, summary: dict[str, Any] | None = None, error: str | None = None) -> None:
        """Set the final status and the summary columns."""
        self.add_many([], [], [(run_id, status, summary, error)])

    @staticmethod
    def _finish_values(run_id: str, status: str, summary: dict[str, Any] | None, error: str | None) -> tuple[str, dict[str, Any]]:
        if status not in STATUSES:
            raise StoreError(f"unknown status {status!r}")
        values = {key: value for key, value in (summary or {}).items() if key in RUN_COLUMNS and key != "run_id"}
        values.update(status=status, error=error, finished=_now())
        return run_id, values

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
            con.execute(f"DELETE FROM tree_nodes WHERE run_id IN ({marks})", run_ids)
            con.execute(f"DELETE FROM tree_rounds WHERE run_id IN ({marks})", run_ids)
            con.execute(f"DELETE FROM sweep_runs WHERE run_id IN ({marks})", run_ids)
            removed = con.execute(f"DELETE FROM runs WHERE run_id IN ({marks}) RETURNING run_id", run_ids).fetchall()
            con.execute("COMMIT")
        return len(removed)

    # -- queries ------------------------------------------------------------------------------

    def list_runs(self, status: str | None = None, search: str | None = None) -> pd.DataFrame:
        """Runs, newest first, optionally filtered by status and by text in prompt, rule or models
        (``search`` is matched literally: ``%`` and ``_`` are not wildcards). A run whose writer
        is still going (or died in a read-only file) counts its stored positions as ``n_tokens``."""
        clauses, params = [], []
        if status:
            clauses.append("status = ?")
            params.append(status)
        if search:
            clauses.append("(" + " OR ".join(f"{column} ILIKE ? ESCAPE '\\'" for column in ("prompt", "rule", "target", "draft")) + ")")
            literal = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            params.extend([f"%{literal}%"] * 4)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self.connect() as con:
            # Only runs without a count (still being written, or a dead writer's in a read-only
            # file) have their positions counted: a full scan of positions would cost every page.
            return con.execute(
                "WITH missing AS (SELECT run_id FROM runs WHERE n_tokens IS NULL), "
                "counts AS (SELECT run_id, count(*)::INTEGER AS n FROM positions SEMI JOIN missing USING (run_id) GROUP BY run_id) "
                "SELECT runs.* REPLACE (coalesce(runs.n_tokens, counts.n, 0)::INTEGER AS n_tokens) "
                f"FROM runs LEFT JOIN counts USING (run_id) {where} ORDER BY created DESC", params).df()

    def _one(self, sql: str, params: list[Any]) -> dict[str, Any] | None:
        """One row as a plain dict (``None`` for SQL NULL), or ``None`` when there is no row."""
        with self.connect() as con:
            cursor = con.execute(sql, params)
            row = cursor.fetchone()
            names = [column[0] for column in cursor.description]
        return dict(zip(names, row)) if row is not None else None

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """One run as a dict; a run still being written (or whose writer died, in a file opened
        read-only) gets its token list, count and text from its stored positions."""
        row = self._one("SELECT * FROM runs WHERE run_id = ?", [run_id])
        if row is not None and (row["tokens"] is None or row["n_tokens"] is None):
            with self.connect() as con:
                rebuilt = _summary_from_positions(con, run_id)
            for key in ("tokens", "n_tokens", "output_text"):
                row[key] = rebuilt[key]
        return row

    def run_outcomes(self, run_ids: list[str]) -> dict[str, dict[str, Any]]:
        """``status`` and ``output_text`` of several finished runs, in one query."""
        if not run_ids:
            return {}
        with self.connect() as con:
            rows = con.execute(f"SELECT run_id, status, output_text FROM runs WHERE run_id IN ({', '.join('?' for _ in run_ids)})",
                               list(run_ids)).fetchall()
        return {run_id: {"status": status, "output_text": text} for run_id, status, text in rows}

    def positions(self, run_id: str) -> pd.DataFrame:
        """Every recorded position of a run, in order."""
        with self.connect() as con:
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

    @staticmethod
    def _has_audits(con: duckdb.DuckDBPyConnection) -> bool:
        # A read-only schema-1 file has no audits table: it simply has no audits.
        rows = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'audits'").fetchall()
        return bool(rows[0][0])

    def list_audits(self, run_ids: list[str] | None = None) -> pd.DataFrame:
        """Audits, newest first (without the evidence JSON); only those of ``run_ids`` when given."""
        columns = [name for name in AUDIT_COLUMNS if name != "evidence"]
        with self.connect() as con:
            if not self._has_audits(con):
                return pd.DataFrame(columns=columns)
            where, params = "", []
            if run_ids is not None:
                where = f"WHERE run_id IN ({', '.join('?' for _ in run_ids)})" if run_ids else "WHERE false"
                params = list(run_ids)
            return con.execute(f"SELECT {', '.join(columns)} FROM audits {where} ORDER BY created DESC", params).df()

    def get_audit(self, audit_id: str) -> dict[str, Any] | None:
        """One audit with its evidence parsed back from JSON, or ``None``."""
        with self.connect() as con:
            if not self._has_audits(con):
                return None
            cursor = con.execute("SELECT * FROM audits WHERE audit_id = ?", [audit_id])
            row = cursor.fetchone()
            names = [column[0] for column in cursor.description]
        if row is None:
            return None
        audit = dict(zip(names, row))
        # A shared file's evidence was checked when it was opened; bounds here too, so no file bypasses them.
        audit["evidence"] = loads(audit["evidence"], f"the evidence of audit {str(audit_id)[:60]}", allow_non_finite=True)
        return audit

    def group(self, group_id: str) -> pd.DataFrame:
        """The coupled runs of one comparison, in the order they were run."""
        with self.connect() as con:
            return con.execute("SELECT * FROM runs WHERE group_id = ? ORDER BY created", [group_id]).df()


class WriterGroup:
    """The writers of a batch of runs flushing together: one connection per flush for all of them
    (by count or age), so rows that share a forward also share their writes."""

    def __init__(self, store: Store, batch_size: int = 1024, max_age_s: float = 1.0) -> None:
        self.store = store
        self.batch_size = batch_size
        self.max_age_s = max_age_s
        self.writers: list[RunWriter] = []
        self.finishes: list[tuple[str, str, dict[str, Any] | None, str | None]] = []
        self._since = time.monotonic()

    def due(self) -> bool:
        buffered = sum(len(writer._buffer) for writer in self.writers)
        return buffered >= self.batch_size or time.monotonic() - self._since >= self.max_age_s

    def flush(self) -> None:
        positions, trees = [], []
        for writer in self.writers:
            if writer._buffer:
                positions.append((writer.run_id, writer._buffer))
            if writer._rounds or writer._nodes:
                trees.append((writer.run_id, writer._rounds, writer._nodes))
        for writer in self.writers:
            writer._buffer, writer._rounds, writer._nodes = [], [], []
        finishes, self.finishes = self.finishes, []
        self.writers = [writer for writer in self.writers if not writer.closed]
        self._since = time.monotonic()
        self.store.add_many(positions, trees, finishes)


class RunWriter:
    """Buffers one run's records and writes them in Arrow batches (by count or age); with a
    ``group``, together with the other runs of its batch."""

    def __init__(self, store: Store, run_fields: dict[str, Any], batch_size: int = 256, max_age_s: float = 1.0,
                 group: WriterGroup | None = None) -> None:
        self.store = store
        self.run_id = store.start_run(run_fields)
        self.batch_size = batch_size
        self.max_age_s = max_age_s
        self.group = group
        self.closed = False
        self._buffer: list[PositionRecord] = []
        self._rounds: list[dict[str, Any]] = []
        self._nodes: list[dict[str, Any]] = []
        self._since = time.monotonic()
        if group is not None:
            group.writers.append(self)

    def add(self, record: PositionRecord) -> None:
        self._buffer.append(record)
        if self.group is not None:
            if self.group.due():
                self.group.flush()
        elif len(self._buffer) >= self.batch_size or time.monotonic() - self._since >= self.max_age_s:
            self.flush()

    def add_round(self, round_record: Any, node_records: list[Any]) -> None:
        """A tree round and its nodes (``RoundRecord``, ``NodeRecord``), written with the positions."""
        self._rounds.append(round_record.as_dict())
        self._nodes.extend(node.as_dict() for node in node_records)

    def flush(self) -> None:
        """Write what this run has buffered (with a group: what every run of the group has)."""
        if self.group is not None:
            self.group.flush()
            return
        positions, rounds, nodes = self._buffer, self._rounds, self._nodes
        self._buffer, self._rounds, self._nodes = [], [], []
        self._since = time.monotonic()
        self.store.add_many([(self.run_id, positions)] if positions else [],
                            [(self.run_id, rounds, nodes)] if rounds or nodes else [])

    def finish(self, status: str, summary: dict[str, Any] | None = None, error: str | None = None) -> None:
        """Flush what is buffered, then record the final status: nothing recorded is lost."""
        self.closed = True
        if self.group is not None:  # the status goes in with the group's next write, made now
            self.group.finishes.append((self.run_id, status, summary, error))
            self.group.flush()
            return
        self.flush()
        self.store.finish_run(self.run_id, status, summary, error)

    def close_quietly(self, status: str, summary: dict[str, Any] | None = None, error: str | None = None) -> str | None:
        """``finish`` for a run that is ending badly (an error, Ctrl-C, a full disk): flush and
        record what can still be written, never raise. Returns why something could not be
        written, or ``None`` when everything was."""
        self.closed = True
        problem = None
        try:
            self.flush()
        except StoreError as failure:
            problem = str(failure)
            self._buffer, self._rounds, self._nodes = [], [], []
        try:
            self.store.finish_run(self.run_id, status, summary, error)
        except StoreError as failure:
            problem = problem or str(failure)
        return problem
