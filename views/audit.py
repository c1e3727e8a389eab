"""Audit: does an implementation do what its rule declares? Run an audit at one layer, read its verdict and evidence."""

from __future__ import annotations

import streamlit as st

from diagnostics.audit import audit_recorded_run
from diagnostics.audit.reporting import json_safe, pair_rows, summary_line, worst_position_rows
from diagnostics.audit.suite import (
    ENGINE_IMPLEMENTATIONS,
    MODEL_BUDGET,
    RULE_IMPLEMENTATIONS,
    TINY_BUDGET,
    AuditError,
    describe,
    model_setup,
    real_positions,
    run_engine_audit,
    run_rule_audit,
    tiny_setup,
)
from diagnostics.charts import audit_figure
from diagnostics.inspection import target_spec
from diagnostics.models import ModelError
from diagnostics.report import build_report
from diagnostics.rules import RuleError, get_rule
from views.common import default_target, file_name_part, literal, md, model_consent, open_store, plain, run_label, run_link, show_error, try_model

LAYERS = {
    "Rule level": "One verification step run many times on a battery of (p, q) pairs; its output law tested against p.",
    "Engine level": "Many seeded generations; every token's randomized PIT under the target's law recomputed by teacher forcing.",
    "Recorded run": "Replay every stored decision from its uniforms; recompute p with plain forwards when the model is here.",
}

st.title("Audit")
st.caption("Does an implementation do what its rule declares? An audit of a rule or of the engine tests whether its output "
           "law is the target's (lossless) or a declared lossy rule's: a correct one fails with probability at most the level "
           "(1%), and each verdict states the smallest error its sample size could detect. An audit of a stored run checks "
           "that its decisions are consistent with the rule it declares, lossless or not.")
store = open_store()
if store is None:
    st.stop()


@st.cache_resource(show_spinner="Building the tiny audit models…")
def _tiny():
    return tiny_setup()


@st.cache_resource(show_spinner="Loading the target and its early-exit draft…")
def _real(spec: str):
    return model_setup(spec)


def _save(evidence: dict) -> None:
    evidence = json_safe(evidence)
    if store.read_only:
        st.session_state["audit_unsaved"] = evidence
        st.session_state.pop("audit_selected", None)
        st.info("This database is a shared file, opened read-only: the audit is shown but not stored.")
        return
    st.session_state["audit_selected"] = store.add_audit(evidence, summary_line(evidence))
    st.session_state.pop("audit_unsaved", None)


# The summary line names the verdict; the banner says it once, before it.
VERDICT_MARK = "\u2063VERDICT\u2063"


def line_without_verdict(evidence: dict) -> str:
    """The audit's summary line without its verdict (the banner leads with it)."""
    return summary_line({**evidence, "verdict": VERDICT_MARK}).replace(f" · {VERDICT_MARK}", "", 1)


def recorded_claim(evidence: dict, failed: bool) -> str:
    """What a recorded-run audit checked: the stored decisions against the run's declared rule,
    which may be lossy (a PASS then means "did what the rule says", not "lossless")."""
    run = store.get_run(str(evidence.get("run_id")))
    if run is None:
        return "the recorded decisions are " + ("not " if failed else "") + "consistent with the run's declared rule (the run is not in this database)"
    try:
        lossy = get_rule(run["rule"]).lossy
    except RuleError:
        lossy = None
    note = " (a lossy rule: not a lossless guarantee)" if lossy else " (a lossless rule)" if lossy is False else ""
    return md("the recorded decisions are " + ("not " if failed else "") + "consistent with the declared rule {rule}", rule=run["rule"]) + note


with st.expander("New audit", expanded=store.list_audits().empty):
    layer = st.radio("Layer", list(LAYERS), horizontal=True, key="audit_layer")
    st.caption(LAYERS[layer])
    try:
        if layer == "Rule level":
            implementation = st.selectbox("Implementation", RULE_IMPLEMENTATIONS, format_func=lambda name: plain(f"{name}: {describe(name)}"),
                                          key="audit_rule_impl")
            left, middle, right = st.columns(3)
            rule = left.text_input("Our rule (for 'ours')", "lossless", key="audit_rule_spec")
            declared = middle.text_input("Test against a declared lossy rule (empty: p)", "", key="audit_declared")
            samples = right.number_input("Steps per pair", 1_000, 1_000_000, 60_000, step=10_000, key="audit_samples")
            real = st.checkbox("Add 2 real positions of the target (full-vocabulary p and its early-exit q)", key="audit_real")
            if st.button("Run the rule-level audit", type="primary", key="audit_rule_go"):
                with st.spinner("Auditing…"):
                    pairs = real_positions(_real(default_target()), 2) if real else None
                    result = run_rule_audit(implementation, rule=rule or None, samples=int(samples),
                                            declared=declared or None, real_pairs=pairs)
                _save(result.as_dict())
        elif layer == "Engine level":
            implementation = st.selectbox("Generator", ENGINE_IMPLEMENTATIONS, format_func=lambda name: plain(f"{name}: {describe(name)}"),
                                          key="audit_engine_impl")
            models = st.radio("Models", ["tiny", "target"], key="audit_models",
                              format_func={"tiny": "tiny (random 12-token Llamas, seconds)",
                                           "target": md("the target {target} with its early-exit draft (minutes)", target=default_target())}.get)
            tiny = models == "tiny"
            left, middle, right = st.columns(3)
            default_generations, default_tokens = TINY_BUDGET if tiny else MODEL_BUDGET
            generations = left.number_input("Generations", 10, 5_000, default_generations, key=f"audit_generations_{tiny}")
            max_new = middle.number_input("Tokens per generation", 1, 64, default_tokens, key=f"audit_tokens_{tiny}")
            gamma = right.number_input("γ (draft tokens per block)", 1, 8, 3, key="audit_gamma")
            if st.button("Run the engine-level audit", type="primary", key="audit_engine_go"):
                setup = _tiny() if tiny else _real(default_target())
                bar = st.progress(0.0, text="Generating…")
                result = run_engine_audit(implementation, setup, generations=int(generations), max_new_tokens=int(max_new),
                                          gamma=int(gamma), progress=lambda done, total: bar.progress(done / total, text=f"Generation {int(done)}/{int(total)}"))
                bar.empty()
                _save(result.as_dict())
        else:
            runs = store.list_runs()
            if runs.empty:
                st.info("No runs yet: record one on the Run page first.")
            else:
                labels = {row.run_id: run_label(row) for row in runs.itertuples()}
                run_id = st.selectbox("Run", list(labels), format_func=labels.get, key="audit_run")
                chosen = store.get_run(run_id)
                # Loading the run's models (to recompute p) is the user's call when a file names them.
                allowed = model_consent(chosen, key="audit_load_models")
                if st.button("Audit this run", type="primary", key="audit_run_go"):
                    with st.spinner("Replaying every decision…"):
                        target = try_model(target_spec(chosen)) if allowed else None
                        evidence = audit_recorded_run(store, run_id, target).as_dict()
                    evidence["p_recomputed"] = target is not None
                    _save(evidence)
    except (AuditError, RuleError, ModelError, ValueError) as error:
        show_error(error)

st.subheader("Audits")
audits = store.list_audits()
unsaved = st.session_state.get("audit_unsaved")
if audits.empty and unsaved is None:
    st.info("No audits yet. Run one above, or `python -m diagnostics audit --all --save` for every implementation and planted bug.")
    st.stop()

evidence = unsaved
audit_id = None
if not audits.empty:
    shown = audits[["audit_id", "created", "layer", "implementation", "verdict", "run_id", "summary"]]
    ids = shown["audit_id"].tolist()
    # The audit just run wins over the one in the link (?audit=ID).
    wanted = st.session_state.get("audit_selected") or st.query_params.get("audit")
    audit_id = st.selectbox("Show", ids, index=ids.index(wanted) if wanted in ids else 0, key=f"audit_show_{wanted}",
                            format_func=lambda value: plain(" · ".join(str(item) for item in shown.set_index("audit_id").loc[value, ["verdict", "layer", "implementation", "created"]])))
    with st.expander(f"All {len(shown)} stored audits"):
        st.dataframe(shown, hide_index=True, column_config={"summary": st.column_config.TextColumn("summary", width="large")})
    if unsaved is None or st.session_state.get("audit_selected"):
        evidence = store.get_audit(audit_id)["evidence"]

verdict = evidence["verdict"]
headline = "**FAIL** · " if verdict == "fail" else "**PASS** · "  # a constant: the stored verdict is only compared
if evidence.get("layer") == "recorded":
    headline += recorded_claim(evidence, verdict == "fail") + " · "
(st.error if verdict == "fail" else st.success)(headline + md("{line}", line=line_without_verdict(evidence)),
                                               icon="🚨" if verdict == "fail" else "✅")
for reason in evidence.get("reasons") or []:
    st.markdown(f"- {literal(reason)}")
figure = audit_figure(evidence)
if figure is not None:
    st.plotly_chart(figure, key="audit_chart")
if evidence.get("layer") == "rule":
    st.markdown("**Evidence per (p, q) pair** (worst first; Holm-adjusted across the pairs)")
    st.dataframe(pair_rows(evidence), hide_index=True)
rows = worst_position_rows(evidence)
if rows:
    st.markdown("**Worst positions**" + (" (output position: the t-th emitted token of every generation)" if evidence.get("layer") == "engine" else ""))
    st.dataframe(rows, hide_index=True)
    if evidence.get("layer") == "recorded":
        # The positions the table lists, in its order (flags first, then the largest |Δp|), each linked to itself.
        positions = list(dict.fromkeys(int(row["position"]) for row in rows if row["position"] >= 0))
        if positions:
            st.markdown("Inspect: " + " · ".join(run_link(f"position {position}", evidence["run_id"], position) for position in positions))  # literal-ok: run_link pieces
elif evidence.get("layer") == "engine":
    st.caption("No output position had the 100 tokens needed for a test of its own; only the pooled test ran.")
settings = evidence.get("settings")
if settings:
    st.caption(md("Settings: {settings}", settings=", ".join(f"{key} = {value}" for key, value in settings.items())))
if audit_id is not None and evidence is not unsaved:
    st.download_button("Download report (HTML)", build_report(store, [], [audit_id]), file_name=f"audit-{file_name_part(audit_id)}.html",
                       mime="text/html", key="audit_report")
