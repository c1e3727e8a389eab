"""The store's errors: every DuckDB failure reaches a caller as one of these, with one line."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The database cannot be used as asked; the message says what to do."""


class StoreBusy(StoreError):
    """Another process kept the database locked for longer than the bounded wait."""


class StoreFull(StoreError):
    """The disk holding the database is full (or the file hit a size limit)."""


__all__ = ["StoreBusy", "StoreError", "StoreFull"]
