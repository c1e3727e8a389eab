"""The ``Store``: one DuckDB file of runs, opened in short connections; its tables' reads and writes
live in one mixin per table family (``runs``, ``audits``, ``trees``, ``sweeps``).

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

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from diagnostics.store.schema import CREATE, MIGRATIONS, SCHEMA_VERSION, schema_problem
from diagnostics.store.audits import AuditTables
from diagnostics.store.errors import StoreBusy, StoreError, StoreFull
from diagnostics.store.runs import RunTables, writer_alive
from diagnostics.store.sweeps import SweepTables
from diagnostics.store.trees import TreeTables
from diagnostics.store.validation import content_problem

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



class Store(RunTables, AuditTables, TreeTables, SweepTables):
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
        dead = [run_id for run_id, writer in running if not writer_alive(writer)]
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
        for run_id in run_ids:
            self.finish_from_positions(run_id, "the writing process ended before the run finished; kept what it stored")

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only (a shared file); import it into your own database to change it")

    def _one(self, sql: str, params: list[Any]) -> dict[str, Any] | None:
        """One row as a plain dict (``None`` for SQL NULL), or ``None`` when there is no row."""
        with self.connect() as con:
            cursor = con.execute(sql, params)
            row = cursor.fetchone()
            names = [column[0] for column in cursor.description]
        return dict(zip(names, row)) if row is not None else None
