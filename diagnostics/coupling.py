"""Divergence from any run: find or record a stored run's coupled partner and link the two.

A lossy run's partner is the lossless run with the same prompt, seed, target, drafter, γ or tree,
draft stop, policies and token budget; a lossless run's partner is a lossy rule the user picks,
under the same settings. Coupled runs share every uniform (``diagnostics.rng``), so they agree
token for token until a rule decides differently: the first divergence. ``plan_coupling`` says,
without any model, whether a run can be coupled and whether its partner is already stored;
``couple`` finds or records the partner, links the pair as a group (``Store.set_group``) and
says where and why they part (``divergence.why_they_part``). Inspect, the Run page and
``run --with-lossless`` all go through it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from diagnostics.comparison import positions_divergence, references
from diagnostics.divergence import why_they_part
from diagnostics.engine import EngineError, PositionRecord
from diagnostics.inspection import as_list
from diagnostics.request import RunRequest, request_from_run
from diagnostics.rules import RuleError, get_rule
from diagnostics.runner import check_replay_prompt, record_run, run_fields
from diagnostics.store import Store
from diagnostics.untrusted_json import loads

LOSSLESS = "lossless"
# The stored fields that make two runs coupled (same uniforms, same drafts); the rule is compared apart.
COUPLING_FIELDS = ("target", "draft", "gamma", "tree", "tree_children", "seed", "max_new_tokens", "prompt", "raw_prompt",
                   "draft_stop")


class CouplingError(ValueError):
    """Why a run cannot be coupled, in one line that says what to do."""


@dataclass(frozen=True)
class CouplingPlan:
    """What ``couple`` will do for a run, decided from the store alone."""

    run: dict[str, Any]
    request: RunRequest  # the partner's request: the run's own, with the partner's rule
    partner_id: str | None  # a stored coupled partner; ``None``: it must be recorded
    group_id: str | None  # the group the pair is (or will be) in; ``None``: a new one
    run_is_lossless: bool

    @property
    def linked(self) -> bool:
        """Whether the stored partner is already in the run's group (nothing left to write)."""
        return self.partner_id is not None and self.group_id is not None and self.group_id == self.run.get("group_id")


@dataclass(frozen=True)
class Coupling:
    """A run and its coupled partner, linked: where the lossy one first leaves the lossless one, and why."""

    run_id: str
    partner_id: str
    lossless_id: str
    lossy_id: str
    lossless_rule: str
    lossy_rule: str
    group_id: str
    divergence: int | None  # ``None``: the two runs never part
    recorded: bool  # ``False``: the partner was found in the store
    why: str


def is_lossless(spec: str) -> bool:
    """Whether a rule spec is the lossless rule itself (greedy, cascade, … are the lossy side here)."""
    return get_rule(spec).name == LOSSLESS


def partner_rule(run: dict[str, Any], rule: str | None = None) -> str:
    """The rule of ``run``'s partner: ``lossless`` for a lossy run; for a lossless run, ``rule``,
    which must be a valid lossy rule spec (raises ``CouplingError`` in one line)."""
    try:
        run_lossless = is_lossless(str(run["rule"]))
    except RuleError as error:
        raise CouplingError(f"run {run['run_id']!r} has a rule this version does not know ({error}); it cannot be coupled") from None
    if not run_lossless:
        return LOSSLESS
    if rule is None or not str(rule).strip():
        raise CouplingError("this run is lossless: type a lossy rule to run beside it, e.g. lenience:0.5")
    try:
        spec = get_rule(str(rule).strip()).spec
    except RuleError as error:
        raise CouplingError(f"rule: {error}") from None
    if is_lossless(spec):
        raise CouplingError("this run is lossless already: type a lossy rule to run beside it, e.g. lenience:0.5")
    if get_rule(spec).lossless_equivalent:
        raise CouplingError(lossless_equivalent_message(spec))
    return spec


def lossless_equivalent_message(spec: str) -> str:
    """Why a lossless-equivalent rule (``lenience:1``, ``cos:0``, ``mentored:1,1``) cannot be a lossy partner."""
    return (f"{spec} is lossless: at these parameters it accepts with min(1, p/q) and resamples norm((p − q)+), "
            "so its law is p and, on the same coins, it emits the lossless run's tokens: the two runs will not part. "
            "Type a lossy rule, e.g. lenience:0.5")


def plan_coupling(store: Store, run_id: str, rule: str | None = None) -> CouplingPlan:
    """Whether ``run_id`` can be coupled and how: its partner's request, the stored partner if there
    is one, the group to link them in. Raises ``CouplingError`` (one line) when it cannot be."""
    run = store.get_run(run_id)
    if run is None:
        raise CouplingError(f"there is no run {run_id!r} in {store.path}; pick a stored run")
    _check_status(run)
    spec = partner_rule(run, rule)
    try:
        request = replace(request_from_run(run), rule=spec)
        request.validate()
    except (RuleError, EngineError, ValueError) as error:
        raise CouplingError(str(error).splitlines()[0]) from None
    run_is_lossless = spec != LOSSLESS
    group_id = run.get("group_id") if isinstance(run.get("group_id"), str) else None
    if group_id is not None:
        return _plan_in_group(store, run, request, group_id, run_is_lossless)
    if store.read_only:  # an ungrouped run: linking it writes, whether its partner is stored or not
        raise CouplingError(_READ_ONLY)
    partner, partner_group = _stored_partner(store, run, request, run_is_lossless)
    return CouplingPlan(run, request, partner, partner_group, run_is_lossless)


_READ_ONLY = "the open file is read-only (a shared file): nothing can be recorded or linked in it; open your own database"


def _check_status(run: dict[str, Any]) -> None:
    status = run.get("status")
    if status == "running":
        raise CouplingError(f"run {run['run_id']!r} is still being recorded; wait until it ends")
    if status == "failed":
        raise CouplingError(f"run {run['run_id']!r} failed ({str(run.get('error') or 'no reason stored').splitlines()[0][:200]}); "
                            "record it again before comparing it")


def _plan_in_group(store: Store, run: dict[str, Any], request: RunRequest, group_id: str, run_is_lossless: bool) -> CouplingPlan:
    """A run in a group: its partner is a member at its seed, or (a lossless reference) a new member."""
    members = store.group(group_id)
    seed = int(run["seed"])
    at_seed = [row for row in members.to_dict("records") if int(row["seed"]) == seed and row["run_id"] != run["run_id"]]
    found = next((row["run_id"] for row in at_seed if row.get("status") == "complete" and is_coupled(row, run, request)), None)
    if found is not None:
        return CouplingPlan(run, request, found, group_id, run_is_lossless)
    reference = references(members).get(seed)
    if run_is_lossless and (reference == run["run_id"] or _identical_reference(members, reference, run, request)):
        if store.read_only:
            raise CouplingError(_READ_ONLY)
        return CouplingPlan(run, request, None, group_id, run_is_lossless)
    reference_rule = next((row["rule"] for row in members.to_dict("records") if row["run_id"] == reference), "?")
    raise CouplingError(f"run {run['run_id']!r} is in group {group_id} measured against {reference_rule} "
                        f"(run {reference}); on Compare, launch lossless and {run['rule'] if not run_is_lossless else request.rule} "
                        "together to see where they part")


def _identical_reference(members: Any, reference: str | None, run: dict[str, Any], request: RunRequest) -> bool:
    """Whether a lossless ``run`` that is not its seed's reference never leaves it and is coupled with
    it (a lossy run recorded first that never left its lossless run): a member measured against
    either is measured against the same tokens."""
    row = next((row for row in members.to_dict("records") if row["run_id"] == reference), None)
    return (row is not None and _divergence_of(run) is None
            and is_coupled(row, run, replace(request, rule=str(row["rule"]))))


def _stored_partner(store: Store, run: dict[str, Any], request: RunRequest, run_is_lossless: bool) -> tuple[str | None, str | None]:
    """A complete stored run coupled with ``run`` under ``request``'s rule that can be linked: an
    ungrouped one, or (a lossless partner) the reference of its group at this seed."""
    candidates = store.list_runs(status="complete", search=str(run["prompt"]))
    for row in candidates.iloc[::-1].to_dict("records"):  # oldest first: the first recorded partner
        if row["run_id"] == run["run_id"] or not is_coupled(row, run, request):
            continue
        group = row.get("group_id") if isinstance(row.get("group_id"), str) else None
        if group is None:
            return row["run_id"], None
        if not run_is_lossless and references(store.group(group)).get(int(run["seed"])) == row["run_id"]:
            return row["run_id"], group
    return None, None


def is_coupled(row: dict[str, Any], run: dict[str, Any], request: RunRequest) -> bool:
    """Whether stored ``row`` is ``request`` recorded on ``run``'s target and prompt token ids: the
    same settings field by field (as ``runner.run_fields`` stores them) and the same rule."""
    expected = run_fields(request, str(run["target"]), as_list(run.get("prompt_ids")))
    for name in COUPLING_FIELDS:
        if _normal(row.get(name)) != _normal(expected.get(name)):
            return False
    if str(row.get("rule")) != expected["rule"] or as_list(row.get("prompt_ids")) != expected["prompt_ids"]:
        return False
    return all(_policy(row.get(name)) == expected[name] for name in ("policy", "draft_policy"))


def _normal(value: Any) -> Any:
    """A stored scalar compared by value: NaN and ``None`` alike, numpy numbers as Python ones."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


def _policy(text: Any) -> dict[str, Any] | None:
    """A stored policy column as a dict (``None`` when unreadable: then it matches nothing)."""
    try:
        value = loads(text, "a stored policy", allow_non_finite=True) if isinstance(text, str) else text
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def couple(
    store: Store,
    run_id: str,
    target: Any,
    draft: Any,
    rule: str | None = None,
    *,
    on_record: Callable[[PositionRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    decode: Callable[[int], str] | None = None,
) -> Coupling:
    """Find or record ``run_id``'s coupled partner (``plan_coupling``), link the two as a group with
    the lossy run's first divergence, and say where and why they part. ``target`` and ``draft``
    (as ``record_run`` takes them) are used only to record a partner. A partner stopped half-way is
    kept, marked interrupted, and not linked (``CouplingError``)."""
    plan = plan_coupling(store, run_id, rule)
    run, recorded = plan.run, plan.partner_id is None
    partner_id = plan.partner_id
    if partner_id is None:
        if getattr(target, "name", None) != run["target"]:
            raise CouplingError(f"run {run_id!r} was recorded on {run['target']}, not on {getattr(target, 'name', target)}; "
                                "load its own target to record its coupled run")
        check_replay_prompt(target, plan.request, as_list(run.get("prompt_ids")) or None, run_id)
        partner_id, partner = record_run(store, target, draft, plan.request, on_record=on_record, should_stop=should_stop)
        if partner is None or partner.status != "complete":
            count = len(partner.tokens) if partner is not None else 0
            raise CouplingError(f"the {plan.request.rule} run {partner_id} was stopped after {count} tokens: it is kept, marked "
                                "interrupted, and not linked; run it again to see where the two part")
    lossless_id, lossy_id = (run_id, partner_id) if plan.run_is_lossless else (partner_id, run_id)
    divergence = stored_divergence(store, lossless_id, lossy_id)
    group_id = plan.group_id or uuid.uuid4().hex[:12]
    if not plan.linked:
        joining = [member for member in (lossless_id, lossy_id) if store.get_run(member).get("group_id") != group_id]
        store.set_group(joining, group_id, {lossless_id: None, lossy_id: divergence})
    lossless_rule, lossy_rule = (run["rule"], plan.request.rule) if plan.run_is_lossless else (plan.request.rule, run["rule"])
    return Coupling(run_id=run_id, partner_id=partner_id, lossless_id=lossless_id, lossy_id=lossy_id, lossless_rule=lossless_rule,
                    lossy_rule=lossy_rule, group_id=group_id, divergence=divergence, recorded=recorded,
                    why=why_they_part(store, lossless_id, lossy_id, divergence, decode))


def divergence_partners(store: Store, run: dict[str, Any]) -> list[tuple[str, int | None]]:
    """The runs ``run`` is compared with in its group, at its seed, and where each pair parts: its
    seed's reference for a member, the members that leave it for a reference; ``[]`` ungrouped."""
    group_id = run.get("group_id")
    if not isinstance(group_id, str):
        return []
    members = store.group(group_id)
    seed = int(run["seed"])
    reference = references(members).get(seed)
    if reference is None:
        return []
    if reference != run["run_id"]:
        return [(reference, _divergence_of(run))]
    return [(row["run_id"], _divergence_of(row)) for row in members.to_dict("records")
            if int(row["seed"]) == seed and row["run_id"] != run["run_id"] and _divergence_of(row) is not None]


def _divergence_of(row: dict[str, Any]) -> int | None:
    value = _normal(row.get("divergence_position"))
    return None if value is None else int(value)


def stored_divergence(store: Store, reference_id: str, other_id: str) -> int | None:
    """First position where two stored coupled runs decide differently (kind or token), as
    ``runner.first_divergence`` reads two runs; the shorter length when one ends first; ``None`` if never."""
    return positions_divergence(store.positions(reference_id), store.positions(other_id))


__all__ = ["COUPLING_FIELDS", "Coupling", "CouplingError", "CouplingPlan", "LOSSLESS", "couple", "divergence_partners", "is_coupled", "is_lossless",
           "partner_rule", "plan_coupling", "stored_divergence"]
