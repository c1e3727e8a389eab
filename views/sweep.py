"""Sweeps: the Pareto chart of speed against quality, the per-setting table with intervals and
verdicts, and each setting's runs (to Inspect). Sweeps are launched with ``python -m diagnostics sweep``."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.charts import pareto_figure
from diagnostics.evaluation.stats import summarise_sweep, sweep_table
from views.common import literal, md, open_store, plain, run_link

st.title("Sweeps")
store = open_store()
if store is None:
    st.stop()
sweeps = store.list_sweeps()
if sweeps.empty:
    st.info("No sweeps yet. Run one with `python -m diagnostics sweep --prompts general --rule lenience:0.2..1.0:5 "
            "--rule cascade:0.3 --seeds 2`.")
    st.stop()

ids = sweeps["sweep_id"].tolist()
requested = st.query_params.get("sweep")
labels = {row.sweep_id: plain(f"{row.sweep_id} · {row.status} · {row.units_done}/{row.units} units", limit=200)
          for row in sweeps.itertuples()}
sweep_id = st.selectbox("Sweep", ids, index=ids.index(requested) if requested in ids else 0, format_func=labels.get, key="sweep_pick")
st.query_params["sweep"] = sweep_id
sweep = store.get_sweep(sweep_id)
settings = sweep["settings"]
request = settings.get("request", {})
shape = f"tree {request['tree']}" if request.get("tree") else f"γ = {request.get('gamma')}"
st.caption(md("prompts {file} ({count}) · rules {rules} · {seeds} seeds · draft {draft} · {shape} · {tokens} tokens · status {status}",
              file=settings.get("prompt_file"), count=len(settings.get("prompts", [])), rules=", ".join(settings.get("rules", [])),
              seeds=settings.get("seeds"), draft=request.get("draft"), shape=shape, tokens=request.get("max_new_tokens"),
              status=sweep["status"]))
if sweep["status"] != "complete":
    st.warning(f"This sweep is {sweep['status']} with {int(sweep['units_done'] or 0)} of {int(sweep['units'] or 0)} units; "  # literal-ok: status from the validated set, counts
               "the figures below use the units that finished. Resume it with `python -m diagnostics sweep --resume ID`.")

cost = st.number_input("draft/target cost c", 0.0, 10.0, 0.5, 0.01, format="%.3f", key="sweep_cost",
                       help="Time of one draft step over one target step, for the modelled speed-up. Type your hardware's.")
table = sweep_table(store, sweep_id, cost)
summaries = summarise_sweep(table)
if not summaries:
    st.info("No unit of this sweep has finished yet.")
    st.stop()
has_accuracy = any(summary.figures["accuracy"][0] == summary.figures["accuracy"][0] for summary in summaries)
choices = ["TV(P, baseline)", "TV(P, p)", "path KL"] + (["accuracy"] if has_accuracy else [])
against = st.radio("Quality axis", choices, horizontal=True, key="sweep_axis")
st.plotly_chart(pareto_figure(summaries, against), key="sweep_pareto")


def _cell(value: tuple[float, float, float], digits: int = 3) -> str:
    mean, low, high = value
    if mean != mean:
        return "–"
    return f"{mean:.{digits}f}" + (f" [{low:.{digits}f}, {high:.{digits}f}]" if low == low else "")


st.subheader("Per setting (95% intervals over prompts and seeds)")
rows = []
for summary in summaries:
    rows.append({"setting": summary.label, "role": summary.role, "units": summary.units,
                 **{name: _cell(summary.figures[name]) for name in ("modelled speed-up", "acceptance", "TV(P, baseline)", "TV(P, p)",
                                                                     "path KL", "log-likelihood", "accuracy")}})
st.dataframe(pd.DataFrame(rows), hide_index=True, key="sweep_table", width="stretch")
st.subheader("Verdicts")
for summary in summaries:
    if summary.role == "rule":
        st.markdown(literal(summary.verdict()))

st.subheader("Runs of a setting")
setting = st.selectbox("Setting", [summary.label for summary in summaries], key="sweep_setting")
for row in table[table["label"] == setting].itertuples():
    st.markdown(md("unit {unit} · prompt {prompt} · seed {seed} · ", unit=int(row.unit), prompt=row.prompt_id, seed=int(row.seed))  # literal-ok: md() plus run_link
                + run_link("inspect", row.run_id))
