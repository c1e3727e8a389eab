"""Running a sweep into the store, unit by unit, and resuming one that was interrupted.

Each unit's members run coupled (``comparison.run_group``: same prompt, seed and uniforms) and
are linked to the sweep as soon as the unit completes. A unit is done when every member is
``complete``; on resume, units that are not done are dropped (their partial runs deleted) and
run again. Every uniform is keyed by ``(seed, position, slot)``, so a unit gives the same tokens
whether it runs first or on resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from diagnostics.comparison import run_group
from diagnostics.engine import EngineError
from diagnostics.evaluation.plan import Unit, expand_rule, unit_members, units
from diagnostics.evaluation.prompts import PromptItem
from diagnostics.policy import Policy
from diagnostics.runner import RunRequest
from diagnostics.store import Store

# RunRequest fields a sweep shares across its runs (prompt, rule and seed vary by member and unit).
SHARED_FIELDS = ("draft", "gamma", "max_new_tokens", "raw", "top_k_record", "tree", "tree_children", "tree_budget", "tree_depth")


def settings_of(prompts: list[PromptItem], rules: list[str], seeds: int, base: RunRequest, prompt_file: str) -> dict[str, Any]:
    """Everything needed to run (and re-run) the sweep, stored with it as JSON."""
    return {
        "prompt_file": prompt_file,
        "prompts": [{"id": item.id, "prompt": item.prompt, "checker": item.checker} for item in prompts],
        "rules": rules, "seeds": seeds,
        "request": {**{name: getattr(base, name) for name in SHARED_FIELDS}, "policy": base.policy.as_dict(),
                    "draft_policy": base.draft_policy.as_dict() if base.draft_policy is not None else None},
    }


def base_request(settings: dict[str, Any]) -> RunRequest:
    """The shared request stored in ``settings`` (prompt and seed are placeholders)."""
    shared = dict(settings["request"])
    policy = Policy(**shared.pop("policy"))
    draft_policy = shared.pop("draft_policy")
    return RunRequest(prompt="-", policy=policy, draft_policy=Policy(**draft_policy) if draft_policy else None, **shared)


def plan_units(settings: dict[str, Any]) -> list[Unit]:
    prompts = settings["prompts"]
    return units([item["id"] for item in prompts], [item["prompt"] for item in prompts], int(settings["seeds"]))


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


def run_sweep(
    store: Store,
    target: Any,
    draft: Any,
    settings: dict[str, Any],
    *,
    sweep_id: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_unit: Callable[[int, int, Unit], None] | None = None,
) -> str:
    """Run every unit not yet done (all of them for a new sweep) and return the sweep id. A stop or
    an interruption leaves the sweep ``interrupted`` with the units done so far; ``--resume`` goes on."""
    planned = plan_units(settings)
    base = base_request(settings)
    members_per_unit = unit_members(replace(base, prompt=planned[0].prompt), settings["rules"])
    for member in members_per_unit:
        member.request.validate()  # every member checked before any model work or row
    if sweep_id is None:
        sweep_id = store.start_sweep(settings, len(planned))
    finished = done_units(store, sweep_id, len(members_per_unit))
    for unit in planned:
        if unit.index not in finished:
            store.drop_sweep_unit(sweep_id, unit.index)
    store.set_sweep_status(sweep_id, "running", units_done=len(finished))
    try:
        for unit in planned:
            if unit.index in finished:
                continue
            members = unit_members(replace(base, prompt=unit.prompt, seed=unit.seed), settings["rules"])
            _, results, _ = run_group(store, target, draft, [member.request for member in members], should_stop=should_stop)
            store.add_sweep_runs([
                {"sweep_id": sweep_id, "unit": unit.index, "prompt_id": unit.prompt_id, "seed": unit.seed, "role": member.role,
                 "label": member.label, "rule_for": member.rule_for, "run_id": run_id}
                for member, (run_id, _run) in zip(members, results)])
            if len(results) < len(members) or any(run.status != "complete" for _, run in results):
                store.set_sweep_status(sweep_id, "interrupted", units_done=len(finished), error="stopped by the user")
                return sweep_id
            finished.add(unit.index)
            store.set_sweep_status(sweep_id, "running", units_done=len(finished))
            if on_unit is not None:
                on_unit(len(finished), len(planned), unit)
    except BaseException as error:
        status = "failed" if isinstance(error, Exception) else "interrupted"
        store.set_sweep_status(sweep_id, status, units_done=len(finished), error=f"{error.__class__.__name__}: {error}"[:500])
        raise
    store.set_sweep_status(sweep_id, "complete", units_done=len(finished))
    return sweep_id


__all__ = ["SHARED_FIELDS", "base_request", "done_units", "expand_rules", "plan_units", "run_sweep", "settings_of"]
