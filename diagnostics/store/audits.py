"""The ``audits`` table: one row per losslessness audit, its whole evidence kept as JSON (read back
through ``untrusted_json``), optionally tied to the run it audited. A mixin of ``Store``; a
schema-1 file has no such table and simply has no audits."""

from __future__ import annotations

import json
import uuid
from typing import Any

import duckdb
import pandas as pd

from diagnostics import __version__
from diagnostics.audit.reporting import json_safe
from diagnostics.store.runs import now
from diagnostics.store.schema import AUDIT_COLUMNS
from diagnostics.untrusted_json import loads


def _json_default(value: Any) -> Any:
    """JSON for what ``json`` does not know (numpy scalars, sets); infinities are written as null later."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


class AuditTables:
    """Writes and reads of ``audits``."""

    def add_audit(self, evidence: dict[str, Any], summary: str, run_id: str | None = None) -> str:
        """Store one audit (``evidence`` is its ``as_dict()``, with ``layer``, ``implementation``
        or ``run_id``, and ``verdict``) and return its id."""
        self._writable()
        audit_id = uuid.uuid4().hex[:12]
        implementation = evidence.get("implementation") or f"recorded run {evidence.get('run_id')}"
        with self.connect() as con:
            con.execute(
                f"INSERT INTO audits ({', '.join(AUDIT_COLUMNS)}) VALUES ({', '.join('?' for _ in AUDIT_COLUMNS)})",
                [audit_id, now(), evidence.get("layer"), implementation, evidence.get("verdict"),
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


__all__ = ["AuditTables"]
