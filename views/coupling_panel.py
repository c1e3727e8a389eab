"""Inspect's divergence control: jump to where a run leaves its coupled partner, or first find or
record that partner (``diagnostics.coupling``) with progress and Stop. The Run page hands a run
over with ``ask_to_couple``; Inspect does the work, so there is one path."""

from __future__ import annotations

from typing import Any, NamedTuple

import streamlit as st

from diagnostics.charts import token_strip_html
from diagnostics.coupling import CouplingError, couple, is_lossless, partner_rule, plan_coupling
from diagnostics.divergence import why_they_part
from diagnostics.engine import EngineError
from diagnostics.inspection import target_spec
from diagnostics.models import ModelError, is_plain_draft, parse_draft
from diagnostics.rules import RuleError
from diagnostics.store import Store, StoreError
from views.common import Launch, decoder, literal, md, run_drafter, run_link, show_error, try_model
from views.run_form import RULE_HELP

PENDING_KEY = "inspect_couple"  # (run id, rule or None): couple this run as Inspect opens it (the Run page's button)
GOTO_KEY = "inspect_goto"  # (run id, position): where Inspect opens after a coupling
NOTE_KEY = "inspect_coupling_note"  # what the last coupling did, shown once
LAUNCH_KEY = "inspect_coupling"  # the coupling in flight, for the script run after a Stop
MAX_RULE_CHARS = 200  # a rule spec is a name and a few numbers: longer input is cut at the box
RECORD_HELP = ("Runs the coupled lossless run (same prompt, seed, target, draft, γ or tree, policy and token budget: the same "
               "random numbers), links the two as a group and jumps to where they part, with why; Stop keeps what it ran.")


def ask_to_couple(run_id: str, rule: str | None = None) -> None:
    """Open Inspect on ``run_id`` and couple it there at once (the Run page's next step)."""
    st.session_state[PENDING_KEY] = (run_id, rule)
    st.switch_page("views/inspect.py", query_params={"run": run_id})


class Offer(NamedTuple):
    """Whether the lossless run can be found or recorded beside a lossy run now, from one ``plan_coupling``."""

    reason: str | None  # why it cannot (``None``: it can)
    partner_id: str | None = None  # the stored coupled run it would find (``None``: it would record one)


def offer(store: Store, run: dict[str, Any], models_allowed: bool = True) -> Offer:
    """Why the lossless run cannot be found or recorded beside this lossy run now (``reason`` ``None``:
    it can), and the stored partner it would find."""
    if is_lossless_run(run):
        return Offer("This run is lossless: type a lossy rule below and run it beside this one.")
    try:
        plan = plan_coupling(store, run["run_id"])
    except CouplingError as error:
        return Offer(str(error))
    if plan.linked:
        return Offer(f"It never leaves its coupled lossless run {plan.partner_id}: the two are identical over all "
                     f"{int(run.get('n_tokens') or 0)} positions.", plan.partner_id)
    if plan.partner_id is None:
        if not models_allowed:
            return Offer("Load the run's models first (the button above): the coupled lossless run is recorded on them.")
        if try_model(target_spec(run)) is None:
            return Offer(f"The target {target_spec(run)} is not on this machine: the coupled lossless run cannot be recorded.")
    return Offer(None, plan.partner_id)


def is_lossless_run(run: dict[str, Any]) -> bool:
    """Whether the run's rule is lossless (an unknown rule counts as lossy: the offer then says why not)."""
    try:
        return is_lossless(str(run["rule"]))
    except RuleError:
        return False


def first_divergence_button(column, store: Store, run: dict[str, Any], divergence: int | None, count: int,
                            models_allowed: bool, go) -> bool:
    """The jump to the first divergence when there is one; otherwise the button that finds or records
    the coupled run first (``True`` when pressed). Never greyed without saying why."""
    key = "jump_first divergence"
    if divergence is not None and 0 <= divergence < count:
        column.button("⇥ first divergence", key=key, on_click=go, args=(divergence,), use_container_width=True,
                      help=f"Jump to position {int(divergence)}, where this run and its coupled run first decide differently.")
        return False
    if divergence is not None:
        column.button("⇥ first divergence", key=key, disabled=True, use_container_width=True,
                      help=f"The coupled runs part at position {int(divergence)}, where this run ended: nothing to jump to.")
        return False
    reason, partner_id = offer(store, run, models_allowed)
    if reason is None:
        tip = (f"Finds the stored coupled lossless run {partner_id}, links the two as a group and jumps to where they "
               "part, with why." if partner_id is not None else RECORD_HELP)
        return column.button("⇥ first divergence", key=key, use_container_width=True, help=literal(tip))
    column.button("⇥ first divergence", key=key, disabled=True, use_container_width=True, help=literal(reason))
    return False


def lossy_rule_picker(store: Store, run: dict[str, Any], models_allowed: bool) -> str | None:
    """On a lossless run: a box for a lossy rule and a button to run it beside this run; the rule
    when the button is pressed. A bad rule gets one line; the button says why when it is greyed."""
    left, right = st.columns([3, 1])
    rule = left.text_input("Lossy rule to run beside this run", "lenience:0.5", key="inspect_beside_rule", max_chars=MAX_RULE_CHARS,
                           help=f"Recorded with this run's prompt, seed, target, draft, shape, policy and budget (the same random "
                                f"numbers), so the two agree until the rule decides differently. At most {int(MAX_RULE_CHARS)} "
                                "characters. " + RULE_HELP)
    reason = None
    try:
        partner_rule(run, rule)
    except CouplingError as error:
        show_error(error)  # one line: the rule as typed is refused
        reason = str(error)
    if reason is None:
        try:
            plan = plan_coupling(store, run["run_id"], rule)
            if plan.partner_id is None and not models_allowed:
                reason = "Load the run's models first (the button above): the lossy run is recorded on them."
        except CouplingError as error:
            reason = str(error)
    pressed = right.button("Run it beside this run", key="inspect_beside_start", disabled=reason is not None,
                           use_container_width=True, help=literal(reason or "Finds it if it is stored, else records it; then "
                                                                  "jumps to where it leaves this run, with why."))
    if reason is not None and not reason.startswith("rule:") and "lossy rule" not in reason:
        st.caption(literal(reason))
    return rule if pressed else None


def _drafter(run: dict[str, Any], target: Any) -> Any:
    """The run's drafter as ``record_run`` takes it: an n-gram spec, a loaded model or head, or ``None``."""
    draft = str(run.get("draft") or "")
    if is_plain_draft(draft):
        return None
    parsed = parse_draft(draft)
    return parsed.spec if parsed.kind == "ngram" else run_drafter(run, target)


def run_coupling(store: Store, run: dict[str, Any], rule: str | None) -> None:
    """Find or record the coupled run with a progress bar, its tokens as they come and Stop; then
    open Inspect on the lossy run at the first divergence (``GOTO_KEY``), saying what was done."""
    target = try_model(target_spec(run))
    if target is None:
        show_error(f"the target {target_spec(run)} is not on this machine; the coupled run cannot be recorded")
        return
    try:
        drafter = _drafter(run, target)
    except (ModelError, OSError, ValueError) as error:
        show_error(error)
        return
    budget = int(run.get("max_new_tokens") or 1)
    launch = Launch({"run_id": run["run_id"]})
    st.session_state[LAUNCH_KEY] = launch  # before the first token: a Stop's rerun settles it
    bar = st.progress(0.0, text="finding or recording the coupled run…")
    stop = st.empty()
    stop.button("Stop", key="inspect_couple_stop", help="Stops the coupled run after its current round: it is kept, marked "
                                                         "interrupted, and not linked.")
    strip = st.empty()
    records: list[dict] = []

    def show(record) -> None:
        records.append(record.as_dict())
        bar.progress(min(1.0, len(records) / budget), text=f"coupled run: {len(records)} / {int(budget)} tokens")
        strip.html(token_strip_html(records))

    try:
        try:
            coupling = couple(store, run["run_id"], target, drafter, rule, on_record=show, should_stop=launch.stopping.is_set,
                              decode=decoder(target))
        finally:
            launch.finished.set()
    except (CouplingError, RuleError, EngineError, ModelError, StoreError, ValueError) as error:
        st.session_state.pop(LAUNCH_KEY, None)
        bar.empty()
        stop.empty()
        show_error(error)
        return
    st.session_state.pop(LAUNCH_KEY, None)
    where = coupling.divergence if coupling.divergence is not None else 0
    st.session_state[GOTO_KEY] = (coupling.lossy_id, int(where))
    done = "Recorded" if coupling.recorded else "Found the stored"
    partner = coupling.partner_id
    st.session_state[NOTE_KEY] = (
        md(f"{done} coupled run {{partner}} ({{rule}}), linked as group {{group}}: ", partner=partner,
           rule=coupling.lossless_rule if coupling.lossless_id == partner else coupling.lossy_rule, group=coupling.group_id)
        + (md("{lossy} leaves {lossless} at position ", lossy=coupling.lossy_rule, lossless=coupling.lossless_rule)
           + f"{int(coupling.divergence)}." if coupling.divergence is not None else "they never part.")
    )
    st.rerun()


def settle_stopped() -> None:
    """After a Stop (any click) during a coupling: wait for its thread to store what it ran, and say so."""
    launch = st.session_state.pop(LAUNCH_KEY, None)
    if launch is None:
        return
    launch.settle("coupled run")
    st.warning("The coupled run was stopped: what it recorded is kept, marked interrupted, and not linked; press "
               "⇥ first divergence (or Run it beside this run) again to record it whole.")


def take_goto(ids: list[str]) -> None:
    """Open the run and position a coupling ended on (before the run select box is drawn)."""
    goto = st.session_state.pop(GOTO_KEY, None)
    if goto is None or goto[0] not in ids:
        return
    run_id, position = goto
    st.session_state["inspect_run"] = run_id
    st.session_state["inspect_for"] = run_id
    st.session_state["inspect_position"] = int(position)
    st.session_state["inspect_track_points"] = None
    st.query_params["run"] = run_id
    st.query_params["pos"] = str(int(position))


def pending_for(run_id: str) -> tuple[bool, str | None]:
    """Whether the Run page asked to couple ``run_id`` as Inspect opens it, and with which rule."""
    pending = st.session_state.pop(PENDING_KEY, None)  # once: a request for another run (since deleted) is dropped
    if pending is None or pending[0] != run_id:
        return False, None
    return True, pending[1]


def show_note() -> None:
    """What the last coupling did (once)."""
    note = st.session_state.pop(NOTE_KEY, None)
    if note:
        st.success(note)  # literal-ok: built from md() and numbers in run_coupling


def why_here(store: Store, run: dict[str, Any], partners: list[tuple[str, int | None]], position: int, decode) -> None:
    """At a position where this run and a coupled run part: why, in one line each, with a link to the other run there."""
    for partner_id, divergence in partners:
        if divergence != position:
            continue
        partner = store.get_run(partner_id)
        if partner is None:
            continue
        stored = run.get("divergence_position")
        member_is_run = stored is not None and stored == stored  # a member measured against its reference (NaN: none)
        reference_id, member_id = (partner_id, run["run_id"]) if member_is_run else (run["run_id"], partner_id)
        line = why_they_part(store, reference_id, member_id, position, decode)
        st.markdown(md("**Why {member} leaves {reference} here:** ", member=(run if member_is_run else partner)["rule"],
                       reference=(partner if member_is_run else run)["rule"])
                    + literal(line) + " · " + run_link(f"inspect the {partner['rule']} run there", partner_id, position))
