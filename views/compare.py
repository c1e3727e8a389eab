"""Compare: coupled runs (same prompt, seed and uniforms; only the rule differs) over one or more
seeds: live progress with Stop, a summary across seeds, and the first divergence told on one chart."""

from __future__ import annotations

import uuid

import pandas as pd
import streamlit as st

from diagnostics.charts import CHART_CONFIG, token_strip_html
from diagnostics.charts.compare import seed_runs_html
from diagnostics.comparison import (
    group_status,
    member_figures,
    member_label,
    parse_seeds,
    plan_group,
    reference_first,
    references,
    run_group,
    summarise,
)
from diagnostics.engine import EngineError
from diagnostics.inspection import target_spec
from diagnostics.metrics import modelled_speedup, modelled_tree_speedup
from diagnostics.drafts import load_draft
from diagnostics.models import ModelError
from diagnostics.rules import RuleError
from diagnostics.store import StoreError
from diagnostics.divergence import chain_divergence, run_decision, shape_label
from views.common import (
    Launch,
    cached_model,
    cost_ratio_input,
    decoder,
    literal,
    md,
    model_consent,
    open_store,
    plain,
    run_laws,
    run_link,
    show_error,
    target_if_allowed,
    try_model,
)
from views.run_form import RULE_HELP, request_widgets

st.title("Compare")
store = open_store()
if store is None:
    st.stop()
runs = store.list_runs()
groups = runs.dropna(subset=["group_id"]) if not runs.empty else runs

with st.expander("Launch a comparison", expanded=groups.empty or "cmp_launching" in st.session_state):
    rules_text = st.text_input("Rules (the first is each seed's reference)", "lossless, lenience:0.5, typical:0.1", key="cmp_rules",
                               help="Comma-separated rule specs, as on the command line (a rule's own parameters stay "
                                    "with it: medusa:0.09,0.3). " + RULE_HELP)
    seeds_text = st.text_input("Seeds", "0", key="cmp_seeds", help="One seed, a list (0,1,2) or a range (0-4): every rule runs at every seed.")
    target_name, request = request_widgets("cmp", "lossless", with_seed=False)
    try:
        planned = plan_group(rules_text, parse_seeds(seeds_text), request) if request is not None else None
    except (RuleError, EngineError, ValueError) as error:
        show_error(error)
        planned = None
    start = st.button("Run the coupled group", type="primary", key="cmp_start", disabled=planned is None or store.read_only)

if start and planned:
    try:
        target = cached_model(target_name.strip() or "default")
        draft = load_draft(planned[0].draft, target)
    except (ModelError, ValueError) as error:
        show_error(error)
        st.stop()
    group_id = uuid.uuid4().hex[:12]
    # Kept before the first token: if Stop (any click) interrupts the script, the next run shows
    # this group, once this thread has stored what it ran (``Launch.settle``).
    launch = Launch({"group_id": group_id})
    st.session_state["cmp_launching"] = launch
    st.subheader(f"Running {len(planned)} coupled runs")
    st.button("Stop", key="cmp_stop", help="Stops the group: its members run together, so each is kept as it is, finished or interrupted.")
    slots = []
    for member in planned:
        slots.append((st.empty(), st.empty()))
        slots[-1][0].progress(0.0, text=md("{rule} · seed {seed}: waiting", rule=member.rule, seed=member.seed))

    def on_record_for(index: int, member):
        records: list[dict] = []
        bar, strip = slots[index]

        def show(record) -> None:
            records.append(record.as_dict())
            bar.progress(min(1.0, len(records) / member.max_new_tokens),
                         text=md("{rule} · seed {seed}: ", rule=member.rule, seed=member.seed) + f"{len(records)} / {int(member.max_new_tokens)} tokens")
            strip.html(token_strip_html(records))
        return show

    try:
        try:
            group_id, _, _ = run_group(store, target, draft, planned, group_id=group_id, on_record_for=on_record_for,
                                       should_stop=launch.stopping.is_set)
        finally:
            launch.finished.set()
    except (RuleError, EngineError, ModelError, StoreError, ValueError) as error:
        st.session_state.pop("cmp_launching", None)
        show_error(error)
        st.stop()
    st.session_state.pop("cmp_launching", None)
    st.session_state["cmp_group"] = group_id
    st.query_params["group"] = group_id
    st.rerun()

launched = None
if "cmp_launching" in st.session_state:
    stopped_launch: Launch = st.session_state.pop("cmp_launching")
    stopped_launch.settle("group")
    launched = stopped_launch.info["group_id"]
    try:
        # Its thread is done (or stuck): a member it left "running" is not being written any more.
        # Seen once in CI under load, cause not found: the stopped thread's own write never landed.
        store.mark_interrupted(store.group(launched)["run_id"].tolist())
    except StoreError as error:
        show_error(error)
runs = store.list_runs()
groups = runs.dropna(subset=["group_id"]) if not runs.empty else runs
if groups.empty:
    st.info("No compared groups yet: launch one above, or run `python -m diagnostics compare --rules lossless,lenience:0.5 …`.")
    st.stop()
order = list(dict.fromkeys(groups["group_id"].tolist()))
requested = launched if launched in order else st.query_params.get("group")
if requested in order and (launched or st.session_state.get("cmp_group") not in order):
    st.session_state["cmp_group"] = requested  # a keyed select box ignores index= once it has a value
# Each group named by its rules, its references' first (creation order would name a coupled pair
# from Inspect "lenience:0.5, lossless").
labels = {gid: plain(f"{gid} · " + ", ".join(dict.fromkeys(reference_first(groups[groups.group_id == gid].iloc[::-1])["rule"])), limit=200)
          for gid in order}
group_id = st.selectbox("Group", order, index=order.index(requested) if requested in order else 0, format_func=labels.get, key="cmp_group")
st.query_params["group"] = group_id
members = reference_first(store.group(group_id))
# A member is named by its rule, plus its tree shape and any policy that differs from its seed's
# reference (a matched baseline): "lossless" under min-p 0.3 is not the lossless reference.
_first_of_seed = {int(row["seed"]): row for row in reversed(members.to_dict("records"))}  # each seed's reference
members["label"] = [member_label(row, _first_of_seed[int(row["seed"])]) for row in members.to_dict("records")]
status = group_status(members)
if launched == group_id:
    st.warning(f"The group was stopped: {int((members.status == 'complete').sum())} member(s) complete, "
               f"{int((members.status == 'interrupted').sum())} interrupted; the runs below are kept.")
reference = members.iloc[0]
st.caption(md("prompt: {prompt} · draft {draft} · γ {gamma} · status {status}", prompt=str(reference["prompt"])[:200],
              draft=reference["draft"], gamma=reference["gamma"], status=status))
refs = references(members)
# A seed's reference has no divergence of its own: a first member that has one was measured
# against a run this file does not hold (one member exported alone).
if any(not pd.isna(members.loc[members.run_id == run_id, "divergence_position"].iloc[0]) for run_id in refs.values()):
    st.warning("This file holds only part of the group: its reference run is missing, so the divergence positions "
               "stored with these runs refer to a run you cannot see here.")

positions = {row.run_id: store.positions(row.run_id) for row in members.itertuples()}
figures = {row.run_id: member_figures(row, positions[row.run_id]) for row in members.itertuples()}
seeds = sorted(int(seed) for seed in members["seed"].unique())
heading, cost_box = st.columns([4, 1])
heading.subheader("Across seeds" if len(seeds) > 1 else "Summary")
cost = cost_ratio_input(reference.to_dict(), target_if_allowed(reference.to_dict()), "cmp", cost_box)
for row in members.itertuples():
    alpha = figures[row.run_id]["acceptance α"]
    if cost is None:
        figures[row.run_id]["modelled speed-up"] = 1.0
    elif isinstance(getattr(row, "tree", None), str) and row.tree:  # tokens per round over D draft levels + 1
        figures[row.run_id]["modelled speed-up"] = modelled_tree_speedup(figures[row.run_id]["block efficiency"], int(row.gamma or 0), cost)
    else:
        figures[row.run_id]["modelled speed-up"] = modelled_speedup(alpha, int(row.gamma or 0), cost)
summary = summarise(members.assign(rule=members["label"]), figures)
shown = pd.DataFrame({"rule": summary["rule"], "seeds": summary["seeds"]})


def _tree_or_chain_step(run_row: dict, record: dict, laws, decode, unavailable: str | None, key: str) -> None:
    """One run's decision at a position of a compared group (``divergence.run_decision``)."""
    st.markdown(md("**{rule}** · {shape}", rule=run_row["rule"], shape=shape_label(run_row)))
    nodes = store.tree_nodes(run_row["run_id"], block=int(record["block"])) if run_row.get("tree") else None
    line, figure = run_decision(run_row, record, nodes, laws, decode, unavailable)
    st.caption(literal(line))
    st.plotly_chart(figure, key=key, config=CHART_CONFIG)


def _mean_sd(name: str, digits: int) -> list[str]:
    out = []
    for mean, sd in zip(summary[name], summary[f"{name} sd"]):
        text = "–" if pd.isna(mean) else f"{mean:.{digits}f}"
        out.append(text + (f" ± {sd:.{digits}f}" if not pd.isna(sd) and not pd.isna(mean) else ""))
    return out


for name, digits in (("acceptance α", 3), ("block efficiency", 2), ("modelled speed-up", 2), ("mean TV(P, p)", 4),
                     ("log-likelihood", 1)):
    shown[name] = _mean_sd(name, digits)
shown["first divergence"] = summary["first divergence"]
st.dataframe(shown, hide_index=True, key="cmp_summary", width="stretch")
st.caption("Mean ± standard deviation over seeds. acceptance α: accepted / verified drafts; block efficiency: tokens per "
           "target forward; modelled speed-up: (1 − α^(γ+1)) / ((1 − α)(γc + 1)) with the cost ratio c at the right; "
           "log-likelihood: Σ log p(y) of the output under the target. Wall-clock speed is on each run's Inspect page.")

# Not "cmp_seed": a key the shared launch form would give a seed input (the Seeds field above plans them).
seed = st.selectbox("Seed", seeds, key="cmp_group_seed") if len(seeds) > 1 else seeds[0]
at_seed = members[members.seed == seed]
reference_id = refs.get(seed)
rows = []
for member in at_seed.itertuples():
    divergence = None if pd.isna(member.divergence_position) else int(member.divergence_position)
    rows.append({"rule": member.label, "run": member.run_id, "status": member.status,
                 "first divergence": "reference" if member.run_id == reference_id else ("never" if divergence is None else str(divergence)),
                 "tokens": "–" if pd.isna(member.n_tokens) else str(int(member.n_tokens)), **{name: "–" if pd.isna(value) else f"{value:.4f}"
                                                            for name, value in figures[member.run_id].items()}})
# As HTML that wraps to the page: a data grid of these ten columns ran past the right edge and its
# scroll bar hid the third row. Every header and cell escaped by seed_runs_html (a rule label is a file's text).
st.html(seed_runs_html(rows))

# The divergence story: each member that leaves the reference, at that position, on one chart.
reference_run = store.get_run(reference_id) if reference_id else None
ref_records = positions[reference_id].to_dict("records") if reference_id else []
diverging = [m for m in at_seed.itertuples() if m.run_id != reference_id and not pd.isna(m.divergence_position)]
if reference_run is not None and diverging:
    st.subheader("Where and why each rule leaves the reference")
    allowed = model_consent(reference_run, key="cmp_load_models")
    laws, unavailable = run_laws(store, reference_run, [int(r["token"]) for r in ref_records]) if allowed else (None, "models not loaded")
    decode = decoder(try_model(target_spec(reference_run))) if laws is not None else None
    for member in diverging:
        position = int(member.divergence_position)
        other_records = positions[member.run_id].to_dict("records")
        if position >= len(ref_records) or position >= len(other_records):
            st.markdown(md("**{rule}** leaves the reference at position ", rule=member.label) + f"{position}: one run ended there.")  # literal-ok: md() plus an int
            continue
        ref_record, other_record = ref_records[position], other_records[position]
        st.markdown(md("**{rule}** vs **{reference}** at position ", rule=member.label, reference=reference_run["rule"])  # literal-ok: md() plus an int and run_link pieces
                    + f"{position} · " + run_link("inspect the reference there", reference_id, position) + " · "
                    + run_link(f"inspect {member.label} there", member.run_id, position))
        member_run = store.get_run(member.run_id)
        if reference_run.get("tree") or member_run.get("tree"):
            # A tree node tries several candidates: each run's own node view, side by side.
            for column, (run_row, record) in zip(st.columns(2), ((reference_run, ref_record), (member_run, other_record))):
                with column:
                    _tree_or_chain_step(run_row, record, laws, decode, unavailable, key=f"cmp_tree_{member.run_id}_{run_row['run_id']}")
            continue
        reason, figure, note = chain_divergence(reference_run, ref_record, member.rule, other_record, laws, decode, unavailable)
        st.caption(literal(reason))
        st.plotly_chart(figure, key=f"cmp_divergence_{member.run_id}", config=CHART_CONFIG)
        if note:
            st.caption(literal(note))

st.subheader("Tokens")
for member in at_seed.itertuples():
    divergence = None if pd.isna(member.divergence_position) else int(member.divergence_position)
    where = "reference" if member.run_id == reference_id else (
        "identical to the reference" if divergence is None else f"leaves the reference at position {divergence}")
    st.markdown(md("**{rule}** · run {run} · ", rule=member.label, run=member.run_id) + where + " · "  # literal-ok: md(), a constant or int phrase, run_link
                + run_link("inspect", member.run_id, divergence))
    st.html(token_strip_html(positions[member.run_id].to_dict("records"), divergence=divergence))
