"""Sharing runs: export the selected runs as one file, and open a colleague's file read-only.

A compared group travels whole: its members' divergences are measured from its first run (the
reference), so a file with only some members would point at a run it does not hold
(``complete_groups``).

A shared file is untrusted: ``import_runs`` opens a DuckDB file read-only (so it is checked,
schema and values, before any page reads it, and never written), and rebuilds a Parquet export
into a fresh DuckDB file only after checking its columns and types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from diagnostics.store.core import Store
from diagnostics.store.errors import StoreError
from diagnostics.store.schema import (
    POSITION_COLUMNS,
    POSITION_COLUMNS_ADDED_IN_3,
    RUN_COLUMNS,
    RUN_COLUMNS_ADDED_IN_3,
    RUN_COLUMNS_ADDED_IN_5,
    RUN_COLUMNS_ADDED_IN_7,
    sql_type,
)


@dataclass(frozen=True)
class GroupCompletion:
    """A selection of runs made whole: ``run_ids`` is the selection with every member of each
    group it touches (a group's members together, reference first, in creation order); ``added``
    maps a group id to the runs that were not selected."""

    run_ids: list[str]
    added: dict[str, list[str]] = field(default_factory=dict)

    def notes(self, verb: str = "exported") -> list[str]:
        """One sentence per completed group, e.g. ``added 2 runs of group G so the group is exported whole``."""
        return [f"added {len(ids)} run{'s' if len(ids) != 1 else ''} of group {group_id} ({', '.join(ids)}) "
                f"so the group is {verb} whole" for group_id, ids in self.added.items()]


def complete_groups(store: Store, run_ids: list[str]) -> GroupCompletion:
    """``run_ids`` with every member of any compared group one of them belongs to (ids not in the
    store are kept as given, for the caller to refuse). Order: the selection's order, with each
    group placed at its first selected member, reference first."""
    selected = list(dict.fromkeys(run_ids))
    members: dict[str, list[str]] = {}
    group_of: dict[str, str] = {}
    if selected:
        marks = ", ".join("?" for _ in selected)
        with store.connect(read_only=True) as con:
            rows = con.execute(
                f"SELECT run_id, group_id FROM runs WHERE group_id IN "
                f"(SELECT group_id FROM runs WHERE run_id IN ({marks}) AND group_id IS NOT NULL) "
                "ORDER BY group_id, created, run_id", selected).fetchall()
        for run_id, group_id in rows:
            members.setdefault(group_id, []).append(run_id)
            group_of.setdefault(run_id, group_id)
    ordered: list[str] = []
    added: dict[str, list[str]] = {}  # groups in the order the selection reaches them
    chosen = set(selected)
    for run_id in selected:
        group_id = group_of.get(run_id)
        if group_id is not None and group_id not in added:
            added[group_id] = [member for member in members[group_id] if member not in chosen]
        for member in members[group_id] if group_id is not None else [run_id]:
            if member not in ordered:
                ordered.append(member)
    return GroupCompletion(ordered, {group_id: ids for group_id, ids in added.items() if ids})


def export_runs(store: Store, run_ids: list[str], path: str | Path, fmt: str = "duckdb") -> Path:
    """Write the selected runs (their positions, and in ``duckdb`` their audits) to one file another user can open read-only.

    Every member of a compared group one of ``run_ids`` belongs to is written too, so that the
    file holds each group's reference (``complete_groups`` says which runs that adds).
    ``duckdb``: a database with this schema. ``parquet``: one table, each position row carrying
    its run's columns prefixed ``run.``; ``import_runs`` turns it back into a database.
    """
    path = Path(path)
    if not run_ids:
        raise StoreError("select at least one run to export")
    run_ids = complete_groups(store, run_ids).run_ids
    if fmt not in ("duckdb", "parquet"):
        raise StoreError(f"unknown export format {fmt!r}; use duckdb or parquet")
    if path.exists():
        path.unlink()
    marks = ", ".join("?" for _ in run_ids)
    with store.connect(read_only=True) as con:
        runs = con.sql(f"SELECT * FROM runs WHERE run_id IN ({marks})", params=run_ids).to_arrow_table()
        positions = con.sql(f"SELECT * FROM positions WHERE run_id IN ({marks}) ORDER BY run_id, position", params=run_ids).to_arrow_table()
        audits = (con.sql(f"SELECT * FROM audits WHERE run_id IN ({marks})", params=run_ids).to_arrow_table()
                  if store._has_audits(con) else None)
        trees = ([con.sql(f"SELECT * FROM {table} WHERE run_id IN ({marks})", params=run_ids).to_arrow_table()
                  for table in ("tree_rounds", "tree_nodes")] if store._has_tree_tables(con) else None)
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
            if trees is not None:  # and the rounds and nodes of tree runs
                for table, rows in zip(("tree_rounds", "tree_nodes"), trees):
                    con.register(f"incoming_{table}", rows)
                    con.execute(f"INSERT INTO {table} SELECT * FROM incoming_{table}")
        return path
    import pyarrow.parquet as pq

    with duckdb.connect() as con:
        con.register("r", runs)
        con.register("p", positions)
        columns = ", ".join(f'r."{name}" AS "run.{name}"' for name in RUN_COLUMNS)
        table = con.sql(f"SELECT p.*, {columns} FROM p JOIN r USING (run_id) ORDER BY run_id, position").to_arrow_table()
    pq.write_table(table, path)
    return path


_OPTIONAL = (*POSITION_COLUMNS_ADDED_IN_3, *(f"run.{name}" for name in RUN_COLUMNS_ADDED_IN_3 + RUN_COLUMNS_ADDED_IN_5
                                                                    + RUN_COLUMNS_ADDED_IN_7))


def _select(columns: list[str], present: set[str], prefix: str = "") -> str:
    """``"prefix.name" AS name`` for each column, ``NULL AS name`` where an older export lacks it."""
    return ", ".join(f'"{prefix}{name}" AS {name}' if f"{prefix}{name}" in present else f"NULL AS {name}" for name in columns)


def _parquet_problem(table) -> str | None:
    """Why a Parquet table is not this tool's export (missing or mistyped columns), or ``None``."""
    with duckdb.connect() as con:
        con.register("shared", table)
        types = {name: kind for name, kind, *_ in con.execute("DESCRIBE shared").fetchall()}
    expected = {**{name: sql_type(sql) for name, sql in POSITION_COLUMNS.items()},
                **{f"run.{name}": sql_type(sql) for name, sql in RUN_COLUMNS.items()}}
    for name in _OPTIONAL:  # columns that exports of older versions lack: read as NULL
        if name not in types:
            expected.pop(name)
    missing = [name for name in expected if name not in types]
    if missing:
        return f"it lacks the column {missing[0]!r}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
    for name, kind in expected.items():
        if types[name] != kind:
            return f"its column {name!r} is {types[name]}, not {kind}"
    return None


def import_runs(source: str | Path, destination: str | Path) -> Store:
    """Make a shared file browsable: a DuckDB file is checked (schema and values) and opened
    read-only as it is; a Parquet export is checked, rebuilt into the DuckDB file ``destination``
    and that is checked the same way. Refuses with one line naming what is wrong."""
    source = Path(source)
    if source.suffix != ".parquet":
        return Store(source, read_only=True)
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(source)
    except Exception as error:  # pyarrow raises several types for a bad file
        raise StoreError(f"{source.name} is not a Parquet export of this tool ({error.__class__.__name__})") from None
    problem = "it has no run columns" if "run.run_id" not in table.column_names else _parquet_problem(table)
    if problem:
        raise StoreError(f"{source.name} is not a Parquet export of this tool: {problem}")
    destination = Path(destination)
    if destination.exists():
        destination.unlink()
    rebuilt = Store(destination)
    try:
        with rebuilt.connect() as con:
            con.register("shared", table)
            present = set(table.column_names)
            con.execute(f"INSERT INTO runs SELECT DISTINCT {_select(list(RUN_COLUMNS), present, 'run.')} FROM shared")
            con.execute(f"INSERT INTO positions SELECT {_select(list(POSITION_COLUMNS), present)} FROM shared")
        return Store(destination, read_only=True)
    except StoreError as error:
        destination.unlink(missing_ok=True)
        raise StoreError(f"{source.name} cannot be opened: {error}") from None
