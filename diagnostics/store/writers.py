"""Buffered writers of runs: a ``RunWriter`` per run, and a ``WriterGroup`` so that the rows of one
batch (which share their forwards) also share one connection per flush."""

from __future__ import annotations

import time
from typing import Any

from diagnostics.engine import PositionRecord
from diagnostics.store.core import Store
from diagnostics.store.errors import StoreError


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
        record what can still be written, never raise; an ``interrupted`` run without a
        ``summary`` gets the one its stored positions determine. Returns why something could not
        be written, or ``None`` when everything was."""
        self.closed = True
        problem = None
        try:
            self.flush()
        except StoreError as failure:
            problem = str(failure)
            self._buffer, self._rounds, self._nodes = [], [], []
        try:
            if status == "interrupted" and summary is None:
                self.store.finish_from_positions(self.run_id, error or "interrupted")
            else:
                self.store.finish_run(self.run_id, status, summary, error)
        except StoreError as failure:
            problem = problem or str(failure)
        return problem


__all__ = ["RunWriter", "WriterGroup"]
