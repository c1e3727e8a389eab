"""Inspect one run: headline figures, token strip (click a token), tracks, jumps, and the laws at a position.

The exact laws of the whole run are computed once per server (one teacher-forced forward per
model, ``views.common.run_laws``); a position change only projects two hidden states and
redraws, so it answers in well under a second.
"""

from __future__ import annotations

import re

import streamlit as st

from diagnostics.charts import CHART_CONFIG, law_figure, token_strip_html, tracks_figure, tree_candidates_figure, tree_round_figure
from diagnostics.coupling import divergence_partners
from diagnostics.divergence import SEVERE_OVERSHOOT, decision_line, jump_targets, tree_decision_line
from diagnostics.inspection import position_view, target_spec, tree_node_view
from diagnostics.policy import policy_words
from views.common import (
    decoder,
    headline_metrics,
    literal,
    md,
    model_consent,
    target_consented,
    open_store,
    plain,
    run_label,
    run_laws,
    try_model,
)
from views import coupling_panel
from views.strip import token_strip

st.title("Inspect a run")
store = open_store()
if store is None:
    st.stop()
runs = store.list_runs()
if runs.empty:
    st.info("No runs yet. Start one on the Run page, or with `python -m diagnostics run --prompt …`.")
    st.stop()

ids = runs["run_id"].tolist()
coupling_panel.settle_stopped()
coupling_panel.take_goto(ids)
requested = st.query_params.get("run")
if requested and requested not in ids:
    st.error(md("There is no run {run} in {path}. Pick one below.", run=requested, path=store.path))
    requested = None
labels = {row.run_id: run_label(row) for row in runs.itertuples()}
# A keyed select box with a value ignores index=; giving one then only draws Streamlit's duplicate-value warning.
index = ids.index(requested) if requested and "inspect_run" not in st.session_state else 0
run_id = st.selectbox("Run", ids, index=index, format_func=labels.get, key="inspect_run")
st.query_params["run"] = run_id
run = store.get_run(run_id)
positions = store.positions(run_id)

shape = (f"tree {run['tree']} ({run.get('tree_children') or 'top'} children)" if run.get("tree")
         else f"γ = {run['gamma']}")
st.caption(md("target {target} · draft {draft} · rule **{rule}** · {shape} · seed {seed} · status {status} · ran on {device}",
              target=run["target"], draft=run["draft"], rule=run["rule"], shape=shape, seed=run["seed"], status=run["status"],
              device=run.get("device") or "unknown (recorded before schema 7)"))
with st.expander("Prompt, policy and output"):
    st.text(plain(run["prompt"], keep="\n\t"))  # bidi overrides and escapes shown, not obeyed
    st.text(plain(f"policy: {policy_words(run['policy'])} · draft policy: {policy_words(run['draft_policy'])}"))
    st.text(plain(run["output_text"] or "", keep="\n\t"))

if positions.empty:
    st.warning("This run recorded no positions.")
    st.stop()

records = positions.to_dict("records")
count = len(records)
allowed = model_consent(run, key="inspect_load_models")
laws, unavailable = run_laws(store, run, [int(record["token"]) for record in records]) if allowed else (None, "models not loaded")
# The target labels tokens even where its laws cannot be recomputed (a head run, a tree run whose laws
# are rebuilt from the stored top-k, a run whose head folder is not loaded yet): ids alone are not a
# reading. The target needs no click when it is the embedded or configured one; it only decodes here,
# and the metrics (which load the run's drafter to time it) get it only once every model is allowed.
labeller = try_model(target_spec(run)) if allowed or target_consented(run) else None
headline_metrics(run, positions, labeller if allowed else None, key="inspect")

if "inspect_position" not in st.session_state or st.session_state.get("inspect_for") != run_id:
    st.session_state.inspect_position = int(records[0]["position"])
    st.session_state.inspect_for = run_id
    st.session_state.inspect_track_points = None
    wanted = st.query_params.get("pos") or ""
    # ASCII digits only: "²".isdigit() is true, and int("²") raises.
    if re.fullmatch(r"[0-9]{1,9}", wanted) and int(wanted) < count:
        st.session_state.inspect_position = int(wanted)

# Where this run and a coupled run of its group part: its own divergence from its reference, or for
# a reference, the earliest member's.
partners = divergence_partners(store, run)
divergence = min((where for _, where in partners if where is not None), default=None)


def _go(position: int) -> None:
    st.session_state.inspect_position = int(position)


centre = int(st.session_state.inspect_position)
targets = jump_targets(records, centre, divergence)
buttons = st.columns(5)
for column, name in zip(buttons, ["previous rejection", "next rejection", "previous severe overshoot", "next severe overshoot"]):
    where = targets[name]
    what = f"a severe overshoot (draft mass at q ≥ p/l of at least {SEVERE_OVERSHOOT})" if "severe" in name else "a rejection"
    column.button(("← " if name.startswith("previous") else "→ ") + name, key=f"jump_{name}",  # literal-ok: names from the constant list
                  disabled=where is None, on_click=_go, args=(where or 0,), use_container_width=True,
                  help=(f"No {what} {'before' if name.startswith('previous') else 'after'} this position." if where is None  # literal-ok: constant phrases
                        else f"Jump to {what} at position {int(where)}."))
couple_now = coupling_panel.first_divergence_button(buttons[4], store, run, divergence, count, allowed, _go)
beside_rule = coupling_panel.lossy_rule_picker(store, run, allowed) if coupling_panel.is_lossless_run(run) else None
pending, pending_rule = coupling_panel.pending_for(run_id)
if couple_now or beside_rule is not None or pending:
    coupling_panel.run_coupling(store, run, beside_rule or pending_rule)
coupling_panel.show_note()

st.subheader("Tokens")
# A long run shows a window around the selected position: the whole text is in the expander above.
WINDOW = 400
first = max(0, min(centre - WINDOW // 2, count - WINDOW))
shown = records[first : first + WINDOW]
st.caption(("Click a token to inspect it." if count <= WINDOW else
            f"Positions {int(first)}–{int(first + len(shown) - 1)} of {int(count)}, around the selected position. Click a token to inspect it."))
clicked = token_strip(token_strip_html(shown, selected=centre, divergence=divergence), key="inspect_strip")
if clicked is not None and clicked != centre and 0 <= clicked < count:
    st.session_state.inspect_position = clicked
    st.rerun()

st.subheader("Per-position tracks")
event = st.plotly_chart(tracks_figure(positions, selected=centre, divergence=divergence),
                        key="tracks", on_select="rerun", selection_mode="points", config=CHART_CONFIG)
points = getattr(getattr(event, "selection", None), "points", None) if event else None
chosen = int(round(points[0]["x"])) if points else None
# A chart keeps its selection across reruns: act on a new selection only, or a jump would be undone.
if chosen is not None and chosen != st.session_state.get("inspect_track_points"):
    st.session_state.inspect_track_points = chosen
    if chosen != centre and 0 <= chosen < count:
        st.session_state.inspect_position = chosen
        st.rerun()

position = st.number_input("Position", 0, count - 1, key="inspect_position",
                           help="Click a token, a point in the tracks, a jump button, or type a position.")
record = records[int(position)]
decode = decoder(labeller)
kind = record["kind"]
round_nodes = store.tree_nodes(run_id, block=int(record["block"])) if run.get("tree") else None
node_view = tree_node_view(run, record, round_nodes, laws, decode, unavailable=unavailable) if run.get("tree") else None
detail = position_view(run, record, laws, decode, unavailable=unavailable) if node_view is None else node_view
st.subheader(md(f"Position {int(position)}: {{kind}}", kind=kind))
if node_view is not None:
    emitted = repr(decode(int(record["token"]))) if decode else repr(record.get("token_text") or str(record["token"]))
    st.caption(literal(tree_decision_line(run["rule"], kind, node_view.candidates, emitted)))
else:
    st.caption(literal(decision_line(run["rule"], record, decode)))
coupling_panel.why_here(store, run, partners, int(position), decode)
left, right = st.columns([3, 1])
with left:
    if node_view is not None:
        st.plotly_chart(tree_candidates_figure(node_view, top_n=15, emitted_token=node_view.index_of(record["token"])),
                        key="position_tree_law", config=CHART_CONFIG)
    elif run.get("tree") and (round_nodes is None or round_nodes.empty) and kind != "bonus":
        # A chain step's chart would show the wrong law for a tree node.
        st.info("This file holds no tree nodes for this run (a Parquet export carries positions only), so the node's "
                "candidates and law cannot be drawn; the figures on the right are the exact ones stored with the position.")
    else:
        # Rebuilt laws index the union of the stored top-k ids: index_of maps a token id to its bar.
        draft_token = None if kind == "bonus" else detail.index_of(record.get("draft_token"))
        st.plotly_chart(law_figure(detail.view, top_n=25, draft_token=draft_token, emitted_token=detail.index_of(record["token"]),
                                   kind=kind), key="position_law", config=CHART_CONFIG)
with right:
    # The stored scalars are exact over the full vocabulary, whatever the chart could rebuild.
    def shown_value(name: str) -> str:
        value = record.get(name)
        return "–" if value is None or value != value else f"{value:.4f}"

    st.metric("α at this position", shown_value("alpha"))
    st.metric("TV(P, p)", shown_value("tv_target"))
    st.metric("TV(P, baseline)", shown_value("tv_baseline"))
    st.metric("KL(P ‖ p)", shown_value("kl_target"))
    st.metric("draft mass at q ≥ p/l", shown_value("severe_overshoot"))
    st.metric("p(A) of the allowed set", shown_value("allowed_mass"))
    st.caption(literal(detail.note))
    if kind == "bonus":
        st.caption("Bonus position: no draft was verified; the token was drawn from the bonus law b(p).")

if round_nodes is not None and len(round_nodes):
    rounds = store.tree_rounds(run_id)
    this_round = rounds[rounds["block"] == int(record["block"])]
    st.subheader(md("Round {block}: the drafted tree", block=int(record["block"])))
    if not this_round.empty:
        summary = this_round.iloc[0]
        st.caption(md("{nodes} nodes to depth {depth}; expected tokens this round (exact, given the tree) {expected}, emitted "
                      "{emitted}", nodes=int(summary["nodes"]), depth=int(summary["depth"]),
                      expected=f"{summary['expected_tokens']:.3f}", emitted=int(summary["emitted"])))
    node = record.get("tree_node")
    st.plotly_chart(tree_round_figure(round_nodes, selected_node=None if node is None or node != node else int(node),
                                      decode=decode), key="round_tree", config=CHART_CONFIG)
