"""Inspect one run: token strip, per-position tracks, and the laws at a clicked position."""

from __future__ import annotations

import json
import re

import streamlit as st

from diagnostics.charts import law_figure, token_strip_html, tracks_figure
from diagnostics.inspection import position_view, target_spec
from views.common import METRIC_HELP, decoder, literal, md, model_consent, open_store, plain, run_label, try_model

st.title("Inspect a run")
store = open_store()
if store is None:
    st.stop()
runs = store.list_runs()
if runs.empty:
    st.info("No runs yet. Start one on the Run page, or with `python -m diagnostics run --prompt …`.")
    st.stop()

ids = runs["run_id"].tolist()
requested = st.query_params.get("run")
if requested and requested not in ids:
    st.error(md("There is no run {run} in {path}. Pick one below.", run=requested, path=store.path))
    requested = None
labels = {row.run_id: run_label(row) for row in runs.itertuples()}
run_id = st.selectbox("Run", ids, index=ids.index(requested) if requested else 0, format_func=labels.get, key="inspect_run")
st.query_params["run"] = run_id
run = store.get_run(run_id)
positions = store.positions(run_id)

st.caption(md("target {target} · draft {draft} · rule **{rule}** · γ = {gamma} · seed {seed} · status {status}", target=run["target"],
              draft=run["draft"], rule=run["rule"], gamma=run["gamma"], seed=run["seed"], status=run["status"]))
with st.expander("Prompt, policy and output"):
    st.text(plain(run["prompt"], keep="\n\t"))  # bidi overrides and escapes shown, not obeyed
    st.json({"policy": json.loads(run["policy"] or "{}"), "draft policy": json.loads(run["draft_policy"] or "{}")})
    st.text(plain(run["output_text"] or "", keep="\n\t"))

cols = st.columns(5)
summary = [
    ("acceptance rate", run["acceptance_rate"]),
    ("block efficiency", run["block_efficiency"]),
    ("tokens/s", run["tokens_per_s"]),
    ("mean TV(P, p)", run["mean_tv_target"]),
    ("mean TV(P, baseline)", run["mean_tv_baseline"]),
]
for col, (name, value) in zip(cols, summary):
    col.metric(name, "–" if value is None else f"{value:.3f}", help=METRIC_HELP[name])  # literal-ok: names from the list above

if positions.empty:
    st.warning("This run recorded no positions.")
    st.stop()

records = positions.to_dict("records")
count = len(records)
if "inspect_position" not in st.session_state or st.session_state.get("inspect_for") != run_id:
    st.session_state.inspect_position = int(records[0]["position"])
    st.session_state.inspect_for = run_id
    wanted = st.query_params.get("pos") or ""
    # ASCII digits only: "²".isdigit() is true, and int("²") raises.
    if re.fullmatch(r"[0-9]{1,9}", wanted) and int(wanted) < count:
        st.session_state.inspect_position = int(wanted)

divergence = run.get("divergence_position")
st.subheader("Tokens")
# A long run shows a window around the selected position: the whole text is in the expander above.
WINDOW = 400
centre = int(st.session_state.inspect_position)
first = max(0, min(centre - WINDOW // 2, count - WINDOW))
shown = records[first : first + WINDOW]
if count > WINDOW:
    st.caption(f"Positions {int(first)}–{int(first + len(shown) - 1)} of {int(count)}, around the selected position.")
st.html(token_strip_html(shown, selected=centre, divergence=divergence))

st.subheader("Per-position tracks")
event = st.plotly_chart(tracks_figure(positions, selected=st.session_state.inspect_position, divergence=divergence),
                        key="tracks", on_select="rerun", selection_mode="points")
points = getattr(getattr(event, "selection", None), "points", None) if event else None
if points:
    st.session_state.inspect_position = int(round(points[0]["x"]))

position = st.number_input("Position", 0, count - 1, key="inspect_position",
                           help="Click a point in the tracks, or type a position.")
record = records[int(position)]
target = try_model(target_spec(run)) if model_consent(run, key="inspect_load_models") else None
detail = position_view(run, record, target, decoder(target))
kind = record["kind"]
st.subheader(md(f"Position {int(position)}: {{kind}}", kind=kind))
left, right = st.columns([3, 1])
with left:
    st.plotly_chart(law_figure(detail.view, top_n=25), key="position_law")
with right:
    # The stored scalars are exact over the full vocabulary, whatever the chart could rebuild.
    def shown(name: str) -> str:
        value = record.get(name)
        return "–" if value is None or value != value else f"{value:.4f}"

    st.metric("α at this position", shown("alpha"))
    st.metric("TV(P, p)", shown("tv_target"))
    st.metric("TV(P, baseline)", shown("tv_baseline"))
    st.metric("draft mass at q ≥ p/l", shown("severe_overshoot"))
    st.metric("p(A) of the allowed set", shown("allowed_mass"))
    st.caption(literal(detail.note))
    if kind == "bonus":
        st.caption("Bonus position: no draft was verified; the token was drawn from the bonus law b(p).")
