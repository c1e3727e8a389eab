"""The ``runs`` and ``positions`` tables of a runs database: a run starts ``running``, gains its
positions in Arrow batches (with its tree rounds and nodes), and ends ``complete``,
``interrupted`` or ``failed`` with its summary columns. A mixin of ``Store``."""

from __future__ import annotations

import json
import os
import socket
import uuid
from datetime import datetime, timezone
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from diagnostics import __version__
from diagnostics.engine import PositionRecord
from diagnostics.store.errors import StoreError
from diagnostics.store.schema import ARROW_POSITIONS, POSITION_COLUMNS, RUN_COLUMNS, STATUSES


def now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # stored as UTC


def writer_tag() -> str:
    """``host:pid`` of this process, stored with the runs it writes (to find them when it dies)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def writer_alive(tag: str | None) -> bool:
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


def summary_from_positions(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
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


class RunTables:
    """Writes and reads of ``runs`` and ``positions``."""

    def start_run(self, fields_: dict[str, Any]) -> str:
        """Insert a ``running`` run and return its id."""
        self._writable()
        run_id = fields_.get("run_id") or uuid.uuid4().hex[:12]
        row = {name: None for name in RUN_COLUMNS}
        row.update({key: value for key, value in fields_.items() if key in RUN_COLUMNS})
        row.update(run_id=run_id, created=now(), status="running", software_version=__version__, writer=writer_tag())
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
        values.update(status=status, error=error, finished=now())
        return run_id, values

    def finish_from_positions(self, run_id: str, error: str) -> None:
        """End a ``running`` run as ``interrupted`` with the summary columns its stored positions
        determine (``summary_from_positions``): for a run whose writer could not compute them (a
        Ctrl-C, a dashboard Stop that reruns the page, a writer that died)."""
        with self.connect() as con:
            values = {**summary_from_positions(con, run_id), "status": "interrupted", "finished": now(),
                      "stop_reason": "interrupted", "error": error}
            assignments = ", ".join(f"{key} = ?" for key in values)
            con.execute(f"UPDATE runs SET {assignments} WHERE run_id = ? AND status = 'running'", [*values.values(), run_id])

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

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """One run as a dict; a run still being written (or whose writer died, in a file opened
        read-only) gets its token list, count and text from its stored positions."""
        row = self._one("SELECT * FROM runs WHERE run_id = ?", [run_id])
        if row is not None and (row["tokens"] is None or row["n_tokens"] is None):
            with self.connect() as con:
                rebuilt = summary_from_positions(con, run_id)
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

    def group(self, group_id: str) -> pd.DataFrame:
        """The coupled runs of one comparison, in the order they were run."""
        with self.connect() as con:
            return con.execute("SELECT * FROM runs WHERE group_id = ? ORDER BY created", [group_id]).df()

    # -- bounded reads of long runs (the report): nothing here grows with a run's length ---------

    def run_header(self, run_id: str) -> dict[str, Any] | None:
        """One run as a dict without its token list and output text (a 10⁶-token run's would be tens of
        MB): every other column; ``n_tokens`` counted from the stored positions where the writer
        has not set it."""
        row = self._one("SELECT * EXCLUDE (tokens, output_text) FROM runs WHERE run_id = ?", [run_id])
        if row is not None and row["n_tokens"] is None:
            row["n_tokens"] = self.position_count(run_id)
        return row

    def group_members(self, group_id: str) -> pd.DataFrame:
        """``group``'s runs (same order) with only the columns that find each seed's reference
        (``comparison.seed_references``): no token lists."""
        with self.connect() as con:
            return con.execute("SELECT run_id, seed, divergence_position, created FROM runs WHERE group_id = ? "
                               "ORDER BY created", [group_id]).df()

    def position_count(self, run_id: str) -> int:
        """How many positions a run stored."""
        with self.connect() as con:
            return int(con.execute("SELECT count(*) FROM positions WHERE run_id = ?", [run_id]).fetchone()[0])

    def positions_window(self, run_id: str, start: int, limit: int) -> pd.DataFrame:
        """At most ``limit`` positions of a run from position ``start`` on, in order (``positions``' columns)."""
        with self.connect() as con:
            return con.execute("SELECT * FROM positions WHERE run_id = ? AND position >= ? ORDER BY position LIMIT ?",
                               [run_id, int(start), int(limit)]).df()

    def positions_summary(self, run_id: str) -> dict[str, Any]:
        """Figures over every stored position of a run, computed in the database (bounded memory
        whatever the length): ``positions``, ``blocks``, ``accepted`` / ``rejected`` / ``bonus``
        counts, ``log_likelihood`` (``metrics.log_likelihood``: Σ log max(p, 1e-300); NaN when a
        ``p_token`` is missing, as there), and mean / max ``TV(P, p)``, mean ``TV(P, baseline)``."""
        names = ["positions", "blocks", "accepted", "rejected", "bonus", "log_likelihood",
                 "mean_tv_target", "max_tv_target", "mean_tv_baseline"]
        with self.connect() as con:
            # fsum: a compensated sum, so 10⁶ log-probabilities add up as exactly as metrics' float64 sum.
            row = con.execute(
                "SELECT count(*), count(DISTINCT block), count(*) FILTER (WHERE kind = 'accepted'), "
                "count(*) FILTER (WHERE kind = 'rejected'), count(*) FILTER (WHERE kind = 'bonus'), "
                "CASE WHEN count(*) = 0 THEN 'NaN'::DOUBLE WHEN count(p_token) < count(*) OR bool_or(isnan(p_token)) "
                "THEN 'NaN'::DOUBLE ELSE fsum(ln(greatest(p_token, 1e-300))) END, "
                "avg(tv_target), max(tv_target), avg(tv_baseline) FROM positions WHERE run_id = ?", [run_id]).fetchone()
        return dict(zip(names, row))

    def first_divergence(self, reference_id: str, run_id: str, chunk: int = 65_536) -> int | None:
        """``comparison.positions_divergence`` of two stored runs, in the database: the first
        position where the two decide differently (kind or token), else the shorter run's length
        when the lengths differ, else ``None``. Positions are numbered 0 … n − 1 (the writer numbers
        them so; a shared file is checked for it), so the i-th row is position i. Compared ``chunk``
        positions at a time, from the start: memory bounded by the chunk, not by the runs' length."""
        with self.connect() as con:
            left, right = (int(con.execute("SELECT count(*) FROM positions WHERE run_id = ?", [side]).fetchone()[0])
                           for side in (reference_id, run_id))
            for start in range(0, min(left, right), chunk):
                found = con.execute(
                    "SELECT min(r.position) FROM positions r JOIN positions o ON o.run_id = ? AND o.position = r.position "
                    "WHERE r.run_id = ? AND r.position >= ? AND r.position < ? AND o.position >= ? AND o.position < ? "
                    "AND (r.kind IS DISTINCT FROM o.kind OR r.token IS DISTINCT FROM o.token)",
                    [run_id, reference_id, start, start + chunk, start, start + chunk]).fetchone()[0]
                if found is not None:
                    return int(found)
        return min(left, right) if left != right else None

    def token_texts(self, run_ids: list[str], token_ids: list[int]) -> dict[int, str]:
        """The text the runs stored for each of ``token_ids`` (as emitted, else as drafted), the one
        a report's token labels take: the first run in ``run_ids`` order, the emitted column before
        the drafted one, the earliest position. Ids none of them stored are left out."""
        run_ids, token_ids = list(dict.fromkeys(run_ids)), sorted({int(token) for token in token_ids})
        if not run_ids or not token_ids:
            return {}
        runs = ", ".join("?" for _ in run_ids)
        tokens = ", ".join("?" for _ in token_ids)
        # Rank = (run's place, column, position) packed in one BIGINT: positions < 2³¹ (INTEGER).
        order = "(list_position([" + runs + "], run_id)::BIGINT * 2 + {column}) * 4294967296 + position"
        with self.connect() as con:
            rows = con.execute(
                f"SELECT token, arg_min(text, rank) FROM ("
                f"  SELECT token, token_text AS text, {order.format(column=0)} AS rank FROM positions "
                f"  WHERE run_id IN ({runs}) AND token IN ({tokens}) AND token_text IS NOT NULL "
                f"  UNION ALL "
                f"  SELECT draft_token, draft_text, {order.format(column=1)} FROM positions "
                f"  WHERE run_id IN ({runs}) AND draft_token IN ({tokens}) AND draft_text IS NOT NULL"
                f") GROUP BY token",
                [*run_ids, *run_ids, *token_ids, *run_ids, *run_ids, *token_ids]).fetchall()
        return {int(token): text for token, text in rows}


__all__ = ["RunTables", "now", "summary_from_positions", "writer_tag"]
