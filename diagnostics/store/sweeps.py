"""The sweep tables of a runs database: one row per sweep, one per run of a sweep.

A mixin of ``Store``. A sweep's results are always computed from its stored runs, so a sweep can
be re-analysed (other cost ratio, other statistics) without running anything again; files older
than schema 4 read as having no sweeps.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pandas as pd

from diagnostics.store.errors import StoreError
from diagnostics.store.runs import now, writer_alive, writer_tag
from diagnostics.store.schema import SWEEP_COLUMNS, SWEEP_RUN_COLUMNS


class SweepTables:
    """Writes and reads of ``sweeps`` and ``sweep_runs``."""

    @staticmethod
    def _has_sweeps(con) -> bool:
        rows = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'sweeps'").fetchall()
        return bool(rows[0][0])

    def start_sweep(self, settings: dict[str, Any], units: int) -> str:
        """Insert a ``running`` sweep with its settings (JSON) and planned unit count; returns its id."""
        from diagnostics import __version__

        self._writable()
        sweep_id = uuid.uuid4().hex[:12]
        with self.connect() as con:
            con.execute(f"INSERT INTO sweeps ({', '.join(SWEEP_COLUMNS)}) VALUES ({', '.join('?' for _ in SWEEP_COLUMNS)})",
                        [sweep_id, now(), None, "running", json.dumps(settings, sort_keys=True), units, 0, None, __version__])
        return sweep_id

    def set_sweep_status(self, sweep_id: str, status: str, units_done: int | None = None, error: str | None = None) -> None:
        """The sweep's status (and progress); a final status stamps ``finished``."""
        self._writable()
        values: dict[str, Any] = {"status": status, "error": error}
        if units_done is not None:
            values["units_done"] = units_done
        if status != "running":
            values["finished"] = now()
        assignments = ", ".join(f"{key} = ?" for key in values)
        with self.connect() as con:
            con.execute(f"UPDATE sweeps SET {assignments} WHERE sweep_id = ?", [*values.values(), sweep_id])

    def set_sweep_cost(self, sweep_id: str, ratio: float, source: str) -> dict[str, Any]:
        """Store the sweep's draft/target cost ratio ``c`` in its settings (``settings.with_cost``);
        returns the settings as stored. Every reader of the sweep then models speed-ups with it."""
        from diagnostics.evaluation.settings import check_settings, with_cost

        self._writable()
        sweep = self.get_sweep(sweep_id)
        if sweep is None:
            raise StoreError(f"there is no sweep {str(sweep_id)[:60]} in {self.path}")
        settings = check_settings(with_cost(sweep["settings"], ratio, source))
        with self.connect() as con:
            con.execute("UPDATE sweeps SET settings = ? WHERE sweep_id = ?", [json.dumps(settings, sort_keys=True), sweep_id])
        return settings

    def add_sweep_runs(self, rows: list[dict[str, Any]]) -> None:
        """Link runs to their sweep: unit, prompt id, seed, role, label, the rule a baseline is for, and
        the checker's score of the run's output (``None``: no checker, or the run did not finish)."""
        self._writable()
        if not rows:
            return
        with self.connect() as con:
            con.executemany(f"INSERT INTO sweep_runs ({', '.join(SWEEP_RUN_COLUMNS)}) VALUES ({', '.join('?' for _ in SWEEP_RUN_COLUMNS)})",
                            [[row.get(name) for name in SWEEP_RUN_COLUMNS] for row in rows])

    def set_sweep_scores(self, sweep_id: str, scores: dict[str, float]) -> None:
        """Store checker scores (``run_id → score``) of a sweep's runs, e.g. after a re-check."""
        self._writable()
        with self.connect() as con:
            con.executemany("UPDATE sweep_runs SET score = ? WHERE sweep_id = ? AND run_id = ?",
                            [[float(value), sweep_id, run_id] for run_id, value in scores.items()])

    def drop_sweep_unit(self, sweep_id: str, unit: int, group_id: str | None = None) -> list[str]:
        """Unlink and delete the runs of one unfinished unit (before it is run again on resume): those
        linked to it, and those of its coupled group (``group_id``) that an interruption left unlinked."""
        with self.connect() as con:
            run_ids = [row[0] for row in con.execute("SELECT run_id FROM sweep_runs WHERE sweep_id = ? AND unit = ?",
                                                      [sweep_id, unit]).fetchall()]
            if group_id is not None:
                run_ids += [row[0] for row in con.execute("SELECT run_id FROM runs WHERE group_id = ?", [group_id]).fetchall()
                            if row[0] not in run_ids]
            con.execute("DELETE FROM sweep_runs WHERE sweep_id = ? AND unit = ?", [sweep_id, unit])
        self.delete_runs(run_ids)
        return run_ids

    def get_sweep(self, sweep_id: str) -> dict[str, Any] | None:
        """One sweep as a dict with ``settings`` parsed and checked (``settings.check_settings``), or
        ``None``. Settings nothing could use raise ``StoreError`` (one line): a shared file's were
        checked when it was opened, but the user's own database is not checked value by value."""
        from diagnostics.evaluation.settings import SweepSettingsError, parse_settings

        with self.connect() as con:
            if not self._has_sweeps(con):
                return None
        sweep = self._one("SELECT * FROM sweeps WHERE sweep_id = ?", [sweep_id])
        if sweep is not None:
            try:
                sweep["settings"] = parse_settings(sweep["settings"])
            except SweepSettingsError as error:
                raise StoreError(f"the settings of sweep {str(sweep_id)[:60]} in {self.path} {error}") from None
        return sweep

    def list_sweeps(self) -> pd.DataFrame:
        """Sweeps, newest first."""
        with self.connect() as con:
            if not self._has_sweeps(con):
                return pd.DataFrame(columns=list(SWEEP_COLUMNS))
            return con.execute("SELECT * FROM sweeps ORDER BY created DESC").df()

    def sweep_writer(self, sweep_id: str) -> str | None:
        """The process (``host:pid``) that is running a sweep marked ``running``, when it is another
        live process than this one: the writer of its units' runs (each unit's runs carry the group
        ``{sweep_id}-u{unit}``, and keep their writer after they finish, so a sweep between two units
        is still found). ``None`` when the sweep is not running, or no live other process writes it
        (a dead writer's sweep can be resumed)."""

        with self.connect() as con:
            if not self._has_sweeps(con):
                return None
            status = con.execute("SELECT status FROM sweeps WHERE sweep_id = ?", [sweep_id]).fetchone()
            if status is None or status[0] != "running":
                return None
            writers = [row[0] for row in con.execute(
                "SELECT writer FROM runs WHERE starts_with(group_id, ?) AND writer IS NOT NULL "
                "GROUP BY writer ORDER BY max(created) DESC", [f"{sweep_id}-u"]).fetchall()]
        mine = writer_tag()
        return next((writer for writer in writers if writer != mine and writer_alive(writer)), None)

    def sweep_runs(self, sweep_id: str) -> pd.DataFrame:
        """The runs of a sweep with their unit, prompt, seed, role and label, joined to each run's
        status and summary columns."""
        with self.connect() as con:
            if not self._has_sweeps(con):
                return pd.DataFrame(columns=list(SWEEP_RUN_COLUMNS))
            return con.execute(
                "SELECT s.*, r.status, r.n_tokens, r.tokens, r.output_text, r.block_efficiency, r.gamma, r.tree, r.time_s, "
                "r.mean_tv_target, r.mean_tv_baseline, r.divergence_position, r.rule, r.target_passes "
                "FROM sweep_runs s JOIN runs r USING (run_id) WHERE s.sweep_id = ? ORDER BY s.unit, r.created",
                [sweep_id]).df()

    def sweep_position_figures(self, sweep_id: str) -> pd.DataFrame:
        """Per linked run, its positions reduced in one query: ``positions``, ``accepted``,
        ``rejected``, ``tv_target`` and ``tv_baseline`` (means), ``path_kl`` (``Σ kl_target``, a
        missing value as 0) and ``log_likelihood`` (``Σ ln p_token``, ``p = 0`` as ``1e-300``, as
        ``metrics.log_likelihood``)."""
        with self.connect() as con:
            if not self._has_sweeps(con):
                return pd.DataFrame(columns=["run_id", "positions", "accepted", "rejected", "tv_target", "tv_baseline",
                                             "path_kl", "log_likelihood"])
            return con.execute(
                "SELECT s.run_id, count(p.position) AS positions, "
                "count(*) FILTER (WHERE p.kind = 'accepted') AS accepted, count(*) FILTER (WHERE p.kind = 'rejected') AS rejected, "
                "avg(p.tv_target) AS tv_target, avg(p.tv_baseline) AS tv_baseline, sum(coalesce(p.kl_target, 0)) AS path_kl, "
                "sum(ln(greatest(p.p_token, 1e-300))) AS log_likelihood "
                "FROM sweep_runs s LEFT JOIN positions p ON p.run_id = s.run_id WHERE s.sweep_id = ? GROUP BY s.run_id",
                [sweep_id]).df()
