"""Running a sweep into the store, unit by unit, and resuming one that was interrupted.

Each unit's members run coupled (same prompt, seed and uniforms) as rows of one continuous batch
with the other units' members, and are linked to the sweep as soon as the unit's last member ends. A unit is done when every member is
``complete``; on resume, units that are not done are dropped (their partial runs deleted) and
run again. Every uniform is keyed by ``(seed, position, slot)``, so a unit gives the same tokens
whether it runs first or on resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from diagnostics.comparison import divergences
from diagnostics.engine import EngineError, PositionRecord
from diagnostics.evaluation.answers import require_sandbox_for, scores_of
from diagnostics.evaluation.plan import Member, Unit, expand_rule, unit_members
from diagnostics.evaluation.settings import SHARED_FIELDS, base_request, checkers_of, plan_units, settings_of, stored_cost
from diagnostics.request import RunRequest
from diagnostics.runner import record_batch
from diagnostics.store import Store

def expand_rules(specs: list[str]) -> list[str]:
    """Every ``--rule`` expanded (ranges), in order, without repeats."""
    expanded: list[str] = []
    for spec in specs:
        expanded += [rule for rule in expand_rule(spec) if rule not in expanded]
    if not expanded:
        raise EngineError("give at least one --rule, e.g. --rule lenience:0.2..1.0:5")
    return expanded


def done_units(store: Store, sweep_id: str, members: int) -> set[int]:
    """Units with all ``members`` runs linked and every one ``complete``."""
    runs = store.sweep_runs(sweep_id)
    if runs.empty:
        return set()
    complete = runs.groupby("unit")["status"].apply(lambda statuses: len(statuses) == members and bool((statuses == "complete").all()))
    return {int(unit) for unit, ok in complete.items() if ok}


def unit_group_id(sweep_id: str, unit: Unit) -> str:
    """The coupled group of a unit's runs: fixed by the sweep and the unit, so that a resume can find
    (and drop) runs an interruption left before they were linked."""
    return f"{sweep_id}-u{unit.index}"


@dataclass
class SweepPlan:
    """A sweep ready to run: its id, units, the members of a unit (for their roles and labels) and
    the units already done (on resume)."""

    sweep_id: str
    units: list[Unit]
    base: RunRequest
    rules: list[str]
    finished: set[int]
    checkers: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # prompt id → checker

    def members(self, unit: Unit) -> list[Member]:
        return unit_members(replace(self.base, prompt=unit.prompt, seed=unit.seed), self.rules)

    @property
    def todo(self) -> list[Unit]:
        return [unit for unit in self.units if unit.index not in self.finished]


def open_sweep(store: Store, settings: dict[str, Any], sweep_id: str | None,
               on_open: Callable[[SweepPlan], None] | None = None) -> SweepPlan:
    """Check every member's settings and that a checker running generated code has its sandbox
    (before any model work or row), start the sweep (or take up ``sweep_id``), and drop the runs
    of units that are not done: they run again from the start."""
    planned = plan_units(settings)
    base = base_request(settings)
    for member in unit_members(replace(base, prompt=planned[0].prompt), settings["rules"]):
        member.request.validate()
    checkers = checkers_of(settings)
    require_sandbox_for(checkers)
    if sweep_id is None:
        # A new sweep times its own pair on its own machine: a c copied with another sweep's settings is dropped.
        sweep_id = store.start_sweep({key: value for key, value in settings.items() if key != "cost"}, len(planned))
    plan = SweepPlan(sweep_id, planned, base, list(settings["rules"]), set(), checkers)
    plan.finished = done_units(store, sweep_id, len(plan.members(planned[0])))
    for unit in plan.todo:
        store.drop_sweep_unit(sweep_id, unit.index, unit_group_id(sweep_id, unit))
    store.set_sweep_status(sweep_id, "running", units_done=len(plan.finished))
    if on_open is not None:
        on_open(plan)
    return plan


def link_unit(store: Store, plan: SweepPlan, unit: Unit, members: list[Member], run_ids: list[str]) -> None:
    """Link a unit's stored runs to the sweep, each complete run with its checker's score of its
    output (checked now, once per distinct output; a HumanEval check runs in the sandbox)."""
    runs = store.run_outcomes(run_ids)
    outputs = {run_id: run["output_text"] for run_id, run in runs.items() if run["status"] == "complete"}
    scores = scores_of(plan.checkers.get(unit.prompt_id), outputs)
    store.add_sweep_runs([
        {"sweep_id": plan.sweep_id, "unit": unit.index, "prompt_id": unit.prompt_id, "seed": unit.seed, "role": member.role,
         "label": member.label, "rule_for": member.rule_for, "run_id": run_id, "score": scores.get(run_id)}
        for member, run_id in zip(members, run_ids)])


def unit_finished(store: Store, plan: SweepPlan, unit: Unit, on_unit: Callable[[int, int, Unit], None] | None) -> None:
    plan.finished.add(unit.index)
    store.set_sweep_status(plan.sweep_id, "running", units_done=len(plan.finished))
    if on_unit is not None:
        on_unit(len(plan.finished), len(plan.units), unit)


@contextmanager
def sweep_status(store: Store, plan: SweepPlan) -> Iterator[None]:
    """Mark the sweep ``failed`` (an error) or ``interrupted`` (Ctrl-C, a kill the driver sees) with
    the units done so far, and raise again; ``complete`` when every unit is done."""
    try:
        yield
    except BaseException as error:
        status = "failed" if isinstance(error, Exception) else "interrupted"
        store.set_sweep_status(plan.sweep_id, status, units_done=len(plan.finished), error=f"{error.__class__.__name__}: {error}"[:500])
        raise
    if len(plan.finished) == len(plan.units):
        store.set_sweep_status(plan.sweep_id, "complete", units_done=len(plan.finished))
    else:
        store.set_sweep_status(plan.sweep_id, "interrupted", units_done=len(plan.finished), error="stopped by the user")


def pair_cost_ratio(target: Any, draft: Any, prompt_ids: list[int]) -> float:
    """The draft/target cost ratio ``c`` of one step (``cost.draft_cost_ratio``) at ``prompt_ids``,
    measured here: the one timing of a sweep's pair, in process and on a Ray worker alike.
    ``draft``: loaded, or a spec (loaded here); a head is timed as a head (a ``LoadedHead`` has no
    ``.model``: timing only ``.model`` gave heads c = 0); none, or an n-gram, runs no forward."""
    from diagnostics.cost import draft_cost_ratio
    from diagnostics.drafts import load_draft

    if isinstance(draft, str):
        draft = load_draft(draft, target)
    drafter = None if draft is None or isinstance(draft, str) else draft  # None or an n-gram spec: no forward
    return draft_cost_ratio(target, drafter, prompt_ids)


def measure_cost_ratio(target: Any, draft: Any, settings: dict[str, Any]) -> float:
    """``pair_cost_ratio`` for the sweep's pair at its first prompt."""
    from diagnostics.runner import encode_prompt

    return pair_cost_ratio(target, draft, encode_prompt(target, settings["prompts"][0]["prompt"], base_request(settings).raw))


def ensure_cost(store: Store, plan: SweepPlan, settings: dict[str, Any], measure: Callable[[], float],
                given: float | None = None) -> tuple[float, str]:
    """The sweep's stored ``(c, source)``; a sweep without one (new, or of an older version) gets
    ``given`` (``--cost``) or ``measure()`` stored first, before any unit runs, so an interrupted
    sweep has it too."""
    known = stored_cost(store.get_sweep(plan.sweep_id)["settings"])
    if known is not None:
        return known
    ratio, source = (given, "given") if given is not None else (measure(), "measured")
    return stored_cost(store.set_sweep_cost(plan.sweep_id, ratio, source))


DEFAULT_BATCH_SIZE = 32  # rows per forward for an in-process sweep (``bench --only batch``: the curve)


def run_sweep(
    store: Store,
    target: Any,
    draft: Any,
    settings: dict[str, Any],
    *,
    sweep_id: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_unit: Callable[[int, int, Unit], None] | None = None,
    on_open: Callable[[SweepPlan], None] | None = None,
    on_record_for: Callable[[Unit, Member], Callable[[PositionRecord], None] | None] | None = None,
    batch_size: int | None = None,
    cost: float | None = None,
) -> str:
    """Run every unit not yet done (all of them for a new sweep) in this process and return the
    sweep id. Every member of every unit is a row of one continuous batch of ``batch_size`` rows
    (``runner.record_batch``): rows join as others finish, units in order, so the batch stays full.
    A unit is linked when its last member ends. A stop or an interruption leaves the sweep
    ``interrupted`` with the units done so far; ``--resume`` goes on. ``on_open(plan)`` is told the
    sweep's id before the first unit runs; ``on_record_for(unit, member)`` may return a callback
    for each record of that member's run. A sweep without a stored cost ratio gets ``cost`` or the
    one measured here (``ensure_cost``)."""
    plan = open_sweep(store, settings, sweep_id, on_open)
    with sweep_status(store, plan):
        ensure_cost(store, plan, settings, lambda: measure_cost_ratio(target, draft, settings), cost)
        rows = [(unit, index, member) for unit in plan.todo for index, member in enumerate(plan.members(unit))]
        if not rows:
            return plan.sweep_id
        ended: dict[int, dict[int, tuple[str, Any]]] = {}

        def stored(row: int, run_id: str, run: Any) -> None:
            unit, index, _member = rows[row]
            got = ended.setdefault(unit.index, {})
            got[index] = (run_id, run)
            members = plan.members(unit)
            if len(got) < len(members):
                return
            ordered = [got[position] for position in range(len(members))]
            store.set_group([run_id for run_id, _ in ordered], unit_group_id(plan.sweep_id, unit),
                            divergences([(unit.seed, run_id, run) for run_id, run in ordered]))
            link_unit(store, plan, unit, members, [run_id for run_id, _ in ordered])
            if all(run.status == "complete" for _, run in ordered):
                unit_finished(store, plan, unit, on_unit)

        def callback(row: int, _request: RunRequest):
            unit, _index, member = rows[row]
            return on_record_for(unit, member) if on_record_for is not None else None

        record_batch(store, target, draft, [member.request for _, _, member in rows],
                     group_ids=[unit_group_id(plan.sweep_id, unit) for unit, _, _ in rows], on_record_for=callback,
                     should_stop=should_stop, batch_size=batch_size or DEFAULT_BATCH_SIZE, on_stored=stored)
    return plan.sweep_id


__all__ = ["DEFAULT_BATCH_SIZE", "SHARED_FIELDS", "SweepPlan", "base_request", "done_units", "ensure_cost", "expand_rules", "link_unit",
           "measure_cost_ratio", "open_sweep", "pair_cost_ratio", "plan_units", "run_sweep", "settings_of", "sweep_status", "unit_finished", "unit_group_id"]
