"""The shape of a runs database: tables, columns, types, versions, and the check that a file has it.

A file is this tool's when its ``meta`` table names a schema version this tool knows and every
table of that version has exactly this tool's columns, in order, with these types. Anything
else is refused *before* anything is written (``schema_problem`` only reads).
"""

from __future__ import annotations

from dataclasses import fields

import duckdb
import pyarrow as pa

from diagnostics.engine import PositionRecord

SCHEMA_VERSION = 7
# Read-only opens accept files this old: newer schemas only added tables (read as empty) and
# trailing columns (read as NULL).
OLDEST_READABLE = 1
STATUSES = ("running", "complete", "interrupted", "failed")
KINDS = ("accepted", "rejected", "bonus")

META_COLUMNS: dict[str, str] = {"key": "VARCHAR PRIMARY KEY", "value": "VARCHAR"}

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
    "tree": "VARCHAR",  # schema 3: the tree shape ("3,2,1", "budget 16, depth 5"); NULL for a chain
    "tree_children": "VARCHAR",  # schema 3: top, sample or sample-distinct
    "draft_stop": "DOUBLE",  # schema 5: adaptive drafting, stop a block after a draft x with q(x) < this; NULL: off
    "device": "VARCHAR",  # schema 7: where it ran, "cuda:0 bfloat16" (and "; draft …" when the draft ran elsewhere); NULL: unknown
}
# Columns schema 3 appended; files of schema 1 and 2 lack them.
RUN_COLUMNS_ADDED_IN_3 = ("tree", "tree_children")
POSITION_COLUMNS_ADDED_IN_3 = ("tree_node",)
# The column schema 5 appended; files of schema 1 to 4 lack it.
RUN_COLUMNS_ADDED_IN_5 = ("draft_stop",)
# The column schema 7 appended; files of schema 1 to 6 lack it (their device reads as unknown).
RUN_COLUMNS_ADDED_IN_7 = ("device",)

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
    "tree_node": "INTEGER",  # schema 3: the node (−1 the root) whose children decided the position
}
POSITIONS_KEY = ", PRIMARY KEY (run_id, position)"
ARROW_POSITIONS = pa.schema(
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


TREE_ROUND_COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR",
    "block": "INTEGER",
    "position": "INTEGER",  # the round's first output position
    "nodes": "INTEGER",
    "depth": "INTEGER",
    "expected_tokens": "DOUBLE",  # exact, given the drafted tree
    "emitted": "INTEGER",
    "accepted": "INTEGER",
}
TREE_NODE_COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR",
    "block": "INTEGER",
    "node": "INTEGER",
    "parent": "INTEGER",  # −1: the root (the last committed token)
    "depth": "INTEGER",
    "sibling": "INTEGER",  # the order in which the parent tries its children
    "token": "INTEGER",
    "q_token": "DOUBLE",
    "u_draft": "DOUBLE",
    "p_token": "DOUBLE",
    "residual": "DOUBLE",
    "accept_prob": "DOUBLE",
    "u_accept": "DOUBLE",
    "decision": "VARCHAR",  # accepted, refused or untried
    "reach": "DOUBLE",
    "token_text": "VARCHAR",
}
NODE_DECISIONS = ("accepted", "refused", "untried")

SWEEP_COLUMNS: dict[str, str] = {
    "sweep_id": "VARCHAR PRIMARY KEY",
    "created": "TIMESTAMP",
    "finished": "TIMESTAMP",
    "status": "VARCHAR",  # running, complete, interrupted, failed
    "settings": "VARCHAR",  # JSON: prompts, rules, seeds and the shared generation settings
    "units": "INTEGER",  # (prompt, seed) units planned
    "units_done": "INTEGER",
    "error": "VARCHAR",
    "software_version": "VARCHAR",
}
SWEEP_RUN_COLUMNS: dict[str, str] = {
    "sweep_id": "VARCHAR",
    "unit": "INTEGER",
    "prompt_id": "VARCHAR",
    "seed": "BIGINT",
    "role": "VARCHAR",  # lossless, rule or baseline
    "label": "VARCHAR",  # the rule spec, or "baseline of SPEC"
    "rule_for": "VARCHAR",  # a baseline: the rule it is the baseline of
    "run_id": "VARCHAR",
    "score": "DOUBLE",  # schema 6: the checker's score of the run's output (0 or 1), stored when the sweep ran; NULL: none
}
# The column schema 6 appended; sweep files of schema 4 and 5 lack it (their scores read as missing).
SWEEP_RUN_COLUMNS_ADDED_IN_6 = ("score",)
SWEEP_ROLES = ("lossless", "rule", "baseline")
SWEEP_RUNS_KEY = ", PRIMARY KEY (sweep_id, run_id)"


def create_statement(table: str, columns: dict[str, str], suffix: str = "") -> str:
    return f"CREATE TABLE IF NOT EXISTS {table} (" + ", ".join(f"{name} {sql}" for name, sql in columns.items()) + suffix + ")"


CREATE = {
    "meta": create_statement("meta", META_COLUMNS),
    "runs": create_statement("runs", RUN_COLUMNS),
    "positions": create_statement("positions", POSITION_COLUMNS, POSITIONS_KEY),
    "audits": create_statement("audits", AUDIT_COLUMNS),
    "tree_rounds": create_statement("tree_rounds", TREE_ROUND_COLUMNS, ", PRIMARY KEY (run_id, block)"),
    "tree_nodes": create_statement("tree_nodes", TREE_NODE_COLUMNS, ", PRIMARY KEY (run_id, block, node)"),
    "sweeps": create_statement("sweeps", SWEEP_COLUMNS),
    "sweep_runs": create_statement("sweep_runs", SWEEP_RUN_COLUMNS, SWEEP_RUNS_KEY),
}
# Migrations from version N to N + 1, applied in order to older files.
MIGRATIONS: dict[int, list[str]] = {
    1: [CREATE["audits"]],
    2: [*(f"ALTER TABLE runs ADD COLUMN {name} {RUN_COLUMNS[name]}" for name in RUN_COLUMNS_ADDED_IN_3),
        *(f"ALTER TABLE positions ADD COLUMN {name} {POSITION_COLUMNS[name]}" for name in POSITION_COLUMNS_ADDED_IN_3),
        CREATE["tree_rounds"], CREATE["tree_nodes"]],
    3: [CREATE["sweeps"], create_statement("sweep_runs", {name: sql for name, sql in SWEEP_RUN_COLUMNS.items()
                                                          if name not in SWEEP_RUN_COLUMNS_ADDED_IN_6}, SWEEP_RUNS_KEY)],
    4: [f"ALTER TABLE runs ADD COLUMN {name} {RUN_COLUMNS[name]}" for name in RUN_COLUMNS_ADDED_IN_5],
    5: [f"ALTER TABLE sweep_runs ADD COLUMN {name} {SWEEP_RUN_COLUMNS[name]}" for name in SWEEP_RUN_COLUMNS_ADDED_IN_6],
    6: [f"ALTER TABLE runs ADD COLUMN {name} {RUN_COLUMNS[name]}" for name in RUN_COLUMNS_ADDED_IN_7],
}


def tables_of(version: int) -> dict[str, dict[str, str]]:
    """The tables (and their columns) a file of schema ``version`` has."""
    later = (RUN_COLUMNS_ADDED_IN_5 if version < 5 else ()) + (RUN_COLUMNS_ADDED_IN_7 if version < 7 else ())
    if version >= 3:
        runs, positions = {name: sql for name, sql in RUN_COLUMNS.items() if name not in later}, POSITION_COLUMNS
    else:
        runs = {name: sql for name, sql in RUN_COLUMNS.items() if name not in RUN_COLUMNS_ADDED_IN_3 + later}
        positions = {name: sql for name, sql in POSITION_COLUMNS.items() if name not in POSITION_COLUMNS_ADDED_IN_3}
    tables = {"meta": META_COLUMNS, "runs": runs, "positions": positions}
    if version >= 2:
        tables["audits"] = AUDIT_COLUMNS
    if version >= 3:
        tables["tree_rounds"] = TREE_ROUND_COLUMNS
        tables["tree_nodes"] = TREE_NODE_COLUMNS
    if version >= 4:
        tables["sweeps"] = SWEEP_COLUMNS
        tables["sweep_runs"] = {name: sql for name, sql in SWEEP_RUN_COLUMNS.items()
                                if version >= 6 or name not in SWEEP_RUN_COLUMNS_ADDED_IN_6}
    return tables


def sql_type(declared: str) -> str:
    return declared.split()[0]  # "VARCHAR PRIMARY KEY" -> "VARCHAR"


def existing_tables(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, str]]:
    """Every table of the file's main schema with its columns (in order) and their types."""
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"
    ).fetchall()
    tables: dict[str, dict[str, str]] = {}
    for table, column, data_type in rows:
        tables.setdefault(table, {})[column] = data_type
    return tables


def _columns_problem(table: str, actual: dict[str, str], expected: dict[str, str]) -> str | None:
    missing = [name for name in expected if name not in actual]
    extra = [name for name in actual if name not in expected]
    if missing or extra:
        parts = ([f"missing {', '.join(missing[:5])}"] if missing else []) + ([f"unexpected {', '.join(extra[:5])}"] if extra else [])
        return f"its table {table} has other columns than this tool writes ({'; '.join(parts)})"
    if list(actual) != list(expected):
        return f"its table {table} has this tool's columns in another order"
    for name, declared in expected.items():
        if actual[name] != sql_type(declared):
            return f"its column {table}.{name} is {actual[name]}, not {sql_type(declared)}"
    return None


def schema_problem(con: duckdb.DuckDBPyConnection) -> tuple[int | None, str | None]:
    """``(version, None)`` for a file of this tool, ``(None, None)`` for an empty database, else
    ``(None, why)``: one phrase that completes "<path> …". Only reads."""
    tables = existing_tables(con)
    if not tables:
        return None, None
    if "meta" not in tables:
        return None, "is not a runs database of this tool (it has tables but no meta table with a schema version)"
    problem = _columns_problem("meta", tables["meta"], META_COLUMNS)
    if problem:
        return None, problem
    row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None or row[0] is None:
        return None, "is not a runs database of this tool (its meta table has no schema version)"
    text = str(row[0]).strip()
    if not (text.isascii() and text.isdigit()):
        return None, f"has schema version {text[:20]!r}, not a whole number: it was not written by this tool, or it is damaged"
    version = int(text)
    if version > SCHEMA_VERSION:
        return None, f"uses schema {version}, newer than this tool's {SCHEMA_VERSION}; upgrade the tool"
    if version < OLDEST_READABLE:
        return None, f"uses schema {version}, which no version of this tool wrote"
    for table, columns in tables_of(version).items():
        if table not in tables:
            return None, f"claims schema {version} but has no {table} table"
        problem = _columns_problem(table, tables[table], columns)
        if problem:
            return None, problem
    return version, None
