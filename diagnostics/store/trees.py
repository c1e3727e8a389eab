"""The tree tables of a runs database: one row per round and one per drafted node of tree runs.

A mixin of ``Store`` (which owns connections and the file checks); files older than schema 3
have no tree tables and read as having no tree rounds.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from diagnostics.store.schema import TREE_NODE_COLUMNS, TREE_ROUND_COLUMNS

_ARROW = {"VARCHAR": pa.string(), "INTEGER": pa.int32(), "DOUBLE": pa.float64()}


def _arrow_table(columns: dict[str, str], rows: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema([pa.field(name, _ARROW[sql.split()[0]]) for name, sql in columns.items()])
    return pa.table({name: [row.get(name) for row in rows] for name in columns}, schema=schema)


class TreeTables:
    """Writes and reads of ``tree_rounds`` and ``tree_nodes``."""

    @staticmethod
    def _has_tree_tables(con: duckdb.DuckDBPyConnection) -> bool:
        rows = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'tree_nodes'").fetchall()
        return bool(rows[0][0])

    def add_tree_rounds(self, run_id: str, rounds: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        """Append rounds and their nodes (dicts of ``RoundRecord`` / ``NodeRecord`` fields) in two Arrow batches."""
        self._writable()
        if not rounds and not nodes:
            return
        with self.connect() as con:
            self.insert_tree_rows(con, [{**row, "run_id": run_id} for row in rounds], [{**row, "run_id": run_id} for row in nodes])

    @staticmethod
    def insert_tree_rows(con: duckdb.DuckDBPyConnection, rounds: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        """Insert round and node rows (each with its ``run_id``) on an open connection, one Arrow batch each."""
        con.register("round_batch", _arrow_table(TREE_ROUND_COLUMNS, rounds))
        con.register("node_batch", _arrow_table(TREE_NODE_COLUMNS, nodes))
        con.execute("INSERT INTO tree_rounds SELECT * FROM round_batch")
        con.execute("INSERT INTO tree_nodes SELECT * FROM node_batch")
        con.unregister("round_batch")
        con.unregister("node_batch")

    def tree_rounds(self, run_id: str) -> pd.DataFrame:
        """A tree run's rounds in order (empty for a chain run or an older file)."""
        with self.connect() as con:
            if not self._has_tree_tables(con):
                return pd.DataFrame(columns=list(TREE_ROUND_COLUMNS))
            return con.execute("SELECT * FROM tree_rounds WHERE run_id = ? ORDER BY block", [run_id]).df()

    def tree_nodes(self, run_id: str, block: int | None = None) -> pd.DataFrame:
        """A tree run's nodes (of one round when ``block`` is given), breadth-first within each round."""
        with self.connect() as con:
            if not self._has_tree_tables(con):
                return pd.DataFrame(columns=list(TREE_NODE_COLUMNS))
            where, params = "run_id = ?", [run_id]
            if block is not None:
                where, params = where + " AND block = ?", [run_id, int(block)]
            return con.execute(f"SELECT * FROM tree_nodes WHERE {where} ORDER BY block, node", params).df()
