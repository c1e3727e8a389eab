"""DuckDB storage of runs, positions and audits: the only package that speaks SQL.

``core`` (the ``Store``: connections, locks, the file check, reaping dead writers), one mixin per
table family (``runs``: runs and positions; ``audits``; ``trees``; ``sweeps``), ``writers``
(``RunWriter``, ``WriterGroup``), ``errors``, ``schema`` (tables, columns), ``validation`` (value
checks of a shared file), ``sharing`` (export and read-only import).
"""

from diagnostics.store.core import (
    DEFAULT_DB,
    LOCK_WAIT_S,
    Store,
    default_db_path,
)
from diagnostics.store.errors import StoreBusy, StoreError, StoreFull
from diagnostics.store.writers import RunWriter, WriterGroup
from diagnostics.store.schema import (
    AUDIT_COLUMNS,
    KINDS,
    POSITION_COLUMNS,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    STATUSES,
)
from diagnostics.store.sharing import GroupCompletion, complete_groups, export_runs, import_runs

__all__ = [
    "AUDIT_COLUMNS", "DEFAULT_DB", "KINDS", "LOCK_WAIT_S", "POSITION_COLUMNS", "RUN_COLUMNS", "SCHEMA_VERSION",
    "STATUSES", "GroupCompletion", "RunWriter", "Store", "WriterGroup", "StoreBusy", "StoreError", "StoreFull", "complete_groups",
    "default_db_path", "export_runs", "import_runs",
]
