"""Run: one prompt, one rule; tokens appear block by block, coloured by kind, recorded as they come."""

from __future__ import annotations

import streamlit as st

from diagnostics.charts import token_strip_html
from diagnostics.engine import EngineError
from diagnostics.models import ModelError, load_draft
from diagnostics.rules import RULES, RuleError, get_rule
from diagnostics.runner import record_run
from diagnostics.store import StoreError
from views.common import METRIC_HELP, cached_model, md, open_store, run_link, show_error
from views.run_form import RULE_HELP, request_widgets

st.title("Run")
st.caption("Generate with speculative decoding under a verification rule; every position is recorded. "
           "Pressing any other control stops the run and keeps it, marked interrupted.")
rule_spec = st.text_input("Rule", "lenience:0.5", key="run_rule", help=RULE_HELP)
try:
    get_rule(rule_spec)
except RuleError as error:
    show_error(error)
target_spec, request = request_widgets("run", rule_spec)
start = st.button("Run", type="primary", key="run_start", disabled=request is None)

if start and request is not None:
    store = open_store()
    if store is None:
        st.stop()
    try:
        target = cached_model(target_spec.strip() or "default")
        draft = load_draft(request.draft, target)
    except (ModelError, ValueError) as error:
        show_error(error)
        st.stop()
    progress = st.progress(0.0, text="starting…")
    st.button("Stop", key="run_stop", help="Stops after the current block; what was recorded is kept, marked interrupted.")
    strip = st.empty()
    records: list[dict] = []

    def show(record) -> None:
        records.append(record.as_dict())
        progress.progress(min(1.0, len(records) / request.max_new_tokens), text=f"{len(records)} / {int(request.max_new_tokens)} tokens")
        strip.html(token_strip_html(records))

    try:
        run_id, run = record_run(store, target, draft, request, on_record=show)
    except (RuleError, EngineError, ModelError, StoreError, ValueError) as error:
        show_error(error)
        st.stop()
    progress.progress(1.0, text=md("{status}: ", status=run.status) + f"{len(run.tokens)} tokens")
    st.session_state["last_run"] = run_id
    summary = run.summary()
    cols = st.columns(4)
    for col, (name, key) in zip(cols, [("acceptance rate", "acceptance_rate"), ("block efficiency", "block_efficiency"),
                                       ("tokens/s", "tokens_per_s"), ("mean TV(P, p)", "mean_tv_target")]):
        value = summary[key]
        col.metric(name, "–" if value is None else f"{value:.3f}", help=METRIC_HELP[name])  # literal-ok: names from the list above
    st.markdown(run_link(f"Inspect run {run_id}", run_id))
elif st.session_state.get("last_run"):
    st.markdown("Last run: " + run_link(f"inspect {st.session_state['last_run']}", st.session_state["last_run"]))

with st.expander("Rules"):
    st.markdown("\n".join(f"- **{name}**: {cls.summary}" for name, cls in RULES.items()))  # literal-ok: the rule library's own text
