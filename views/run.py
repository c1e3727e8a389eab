"""Run: one prompt, one rule; tokens appear block by block, coloured by kind, recorded as they come."""

from __future__ import annotations

import time

import streamlit as st

from diagnostics.charts import token_strip_html
from diagnostics.engine import EngineError
from diagnostics.drafts import load_draft
from diagnostics.models import ModelError, device_label
from diagnostics.rules import RULES, RuleError, get_rule
from diagnostics.runner import record_run
from diagnostics.store import Store, StoreError
from views.common import cached_model, headline_metrics, literal, md, open_store, run_link, show_error
from views.coupling_panel import ask_to_couple, is_lossless_run, offer
from views.run_form import RULE_HELP, request_widgets

STOP_WAIT_S = 10


def remember_runs(store: Store) -> Store:
    """``store``, noting the id of each run it starts in the session before a token is generated:
    pressing Stop (any control) ends this script run mid-generation, and the next one shows the
    run's stored status from the database."""
    start_run = store.start_run

    def start_and_remember(fields: dict) -> str:
        run_id = start_run(fields)
        st.session_state["last_run"] = run_id
        return run_id

    store.start_run = start_and_remember
    return store


def next_step(store: Store, run_id: str) -> None:
    """After a run: the button that finds or records its coupled lossless run on Inspect and opens it
    at the first divergence, with why (greyed only with the reason beside it)."""
    run = store.get_run(run_id)
    if run is None:
        return
    if is_lossless_run(run):
        st.caption("A lossless run: on Inspect, type a lossy rule and run it beside this run to see where it leaves it.")
        return
    reason = offer(store, run).reason
    if st.button("Where does it leave the lossless run?", key="run_couple", disabled=reason is not None,
                 help=literal(reason or "Opens Inspect, runs (or finds, if stored) the lossless run with the same prompt, seed, "
                                        "models, shape, policy and budget, and jumps to the first position where they part.")):
        ask_to_couple(run_id)
    if reason is not None:
        st.caption(literal(reason))


def show_stored_run(run_id: str) -> None:
    """The last run of this session as stored: status, tokens, its error if it failed, an Inspect link."""
    store = open_store()
    run = store.get_run(run_id) if store is not None else None
    if run is not None and run["status"] == "running":
        # Stop reran the page on a new thread while the old one is still unwinding: it stores the
        # run as interrupted at its next step, well within a second (a stale run stays "running").
        with st.spinner("Stopping the run…"):
            deadline = time.monotonic() + STOP_WAIT_S
            while run is not None and run["status"] == "running" and time.monotonic() < deadline:
                time.sleep(0.1)
                run = store.get_run(run_id)
    if run is None:  # deleted since, or a shared file is open
        st.markdown("Last run: " + run_link(f"inspect {run_id}", run_id))
        return
    status, count, budget = run["status"], int(run["n_tokens"] or 0), int(run["max_new_tokens"] or 0)
    box = st.success if status == "complete" else st.warning if status in ("interrupted", "running") else st.error
    box(md("Last run {run}: {status} · ", run=run_id, status=status) + (f"{count:d} / {budget:d} tokens" if budget else f"{count:d} tokens")
        + (md(" · ran on {device}", device=run["device"]) if run.get("device") else ""))
    if status == "failed" and run.get("error"):
        show_error(run["error"])
    st.markdown(run_link(f"Inspect run {run_id}", run_id))
    next_step(store, run_id)


st.title("Run")
st.caption("Generate with speculative decoding under a verification rule; every position is recorded. "
           "Pressing any other control stops the run and keeps it, marked interrupted.")
rule_spec = st.text_input("Rule", "lenience:0.5", key="run_rule", help=RULE_HELP)
try:
    get_rule(rule_spec)
    rule_ok = True
except RuleError as error:
    show_error(error)  # the one message: Run stays disabled until the rule parses
    rule_ok = False
target_spec, request = request_widgets("run", rule_spec)
start = st.button("Run", type="primary", key="run_start", disabled=request is None or not rule_ok,
                  help=None if rule_ok else "Fix the rule first.")

if start and request is not None and rule_ok:
    try:
        request.validate()  # an empty prompt or a bad drafter: one message, before any model or row
    except (RuleError, EngineError, ModelError, ValueError) as error:
        show_error(error)
        st.stop()
    store = open_store()
    if store is None:
        st.stop()
    try:
        target = cached_model(target_spec.strip() or "default")
        draft = load_draft(request.draft, target)
    except (ModelError, ValueError) as error:
        show_error(error)
        st.stop()
    st.caption(md("Runs on {device}", device=device_label(target, draft) or "an unknown device"))
    progress = st.progress(0.0, text="starting…")
    stop_slot = st.empty()
    stop_slot.button("Stop", key="run_stop", help="Stops after the current block; what was recorded is kept, marked interrupted.")
    strip = st.empty()
    records: list[dict] = []

    def show(record) -> None:
        records.append(record.as_dict())
        progress.progress(min(1.0, len(records) / request.max_new_tokens), text=f"{len(records)} / {int(request.max_new_tokens)} tokens")
        strip.html(token_strip_html(records))

    try:
        run_id, run = record_run(remember_runs(store), target, draft, request, on_record=show)
    except (RuleError, EngineError, ModelError, StoreError, ValueError) as error:
        progress.empty()
        stop_slot.empty()
        show_error(error)
        st.stop()
    stop_slot.empty()  # the run is over: nothing left to stop
    progress.progress(1.0, text=md("{status}: ", status=run.status) + f"{len(run.tokens)} tokens")
    st.session_state["last_run"] = run_id
    # The same headline figures as Inspect: acceptance, block efficiency, modelled speed-up, distortion.
    headline_metrics(store.get_run(run_id), store.positions(run_id), target, key="run")
    st.markdown(run_link(f"Inspect run {run_id}", run_id))
    next_step(store, run_id)
elif st.session_state.get("last_run"):
    show_stored_run(st.session_state["last_run"])

with st.expander("Rules"):
    st.markdown("\n".join(f"- **{name}**: {cls.summary}" for name, cls in RULES.items()))  # literal-ok: the rule library's own text
