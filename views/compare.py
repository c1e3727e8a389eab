"""Compare: coupled runs (same prompt, seed and uniforms) side by side, first divergence marked."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.charts import token_strip_html
from diagnostics.engine import EngineError
from diagnostics.metrics import log_likelihood
from diagnostics.models import ModelError, load_draft
from diagnostics.rules import RuleError
from diagnostics.runner import RunRequest, compare_rules
from diagnostics.store import StoreError
from views.common import cached_model, md, open_store, plain, run_link, show_error
from views.run_form import RULE_HELP, request_widgets

st.title("Compare")
store = open_store()
if store is None:
    st.stop()

with st.expander("Launch a comparison", expanded=False):
    rules_text = st.text_input("Rules (the first is the reference)", "lossless; lenience:0.5; typical:0.1", key="cmp_rules",
                               help="Separate specs with ';'. " + RULE_HELP)
    target_spec, request = request_widgets("cmp", "lossless")
    if st.button("Run the coupled group", type="primary", key="cmp_start", disabled=request is None or store.read_only):
        specs = [spec.strip() for spec in rules_text.split(";") if spec.strip()]
        try:
            target = cached_model(target_spec.strip() or "default")
            draft = load_draft(request.draft, target)
            requests = [RunRequest(**{**request.__dict__, "rule": spec}) for spec in specs]
            with st.spinner(f"Running {len(specs)} coupled runs…"):
                group_id, _, _ = compare_rules(store, target, draft, requests)
            st.query_params["group"] = group_id
        except (RuleError, EngineError, ModelError, StoreError, ValueError) as error:
            show_error(error)

runs = store.list_runs()
groups = runs.dropna(subset=["group_id"]) if not runs.empty else runs
if groups.empty:
    st.info("No compared groups yet: launch one above, or run `python -m diagnostics compare --rules lossless,lenience:0.5 …`.")
    st.stop()
order = list(dict.fromkeys(groups["group_id"].tolist()))
requested = st.query_params.get("group")
labels = {gid: plain(f"{gid} · " + ", ".join(groups.loc[groups.group_id == gid, "rule"].tolist()[::-1]), limit=200) for gid in order}
group_id = st.selectbox("Group", order, index=order.index(requested) if requested in order else 0, format_func=labels.get, key="cmp_group")
members = store.group(group_id)
reference = members.iloc[0]
st.caption(md("prompt: {prompt} · seed {seed} · draft {draft} · γ {gamma}", prompt=str(reference["prompt"])[:200],
              seed=reference["seed"], draft=reference["draft"], gamma=reference["gamma"]))

rows = []
strips = []
for member in members.itertuples():
    positions = store.positions(member.run_id)
    divergence = None if pd.isna(member.divergence_position) else int(member.divergence_position)
    loglik = log_likelihood(positions["p_token"])
    rows.append({"rule": member.rule, "run": member.run_id, "first divergence": divergence, "tokens": member.n_tokens,
                 "acceptance rate": member.acceptance_rate, "block efficiency": member.block_efficiency,
                 "tokens/s": member.tokens_per_s, "mean TV(P, p)": member.mean_tv_target, "max TV(P, p)": member.max_tv_target,
                 "log-likelihood Σ log p(y)": loglik})
    strips.append((member, positions, divergence))
table = pd.DataFrame(rows)
st.dataframe(table, hide_index=True, key="cmp_table",
             column_config={name: st.column_config.NumberColumn(format="%.4f") for name in table.columns[4:]})

divergences = [d for _, _, d in strips if d is not None]
if divergences:
    first = min(divergences)
    st.subheader(f"Aligned by position around the first divergence ({int(first)})")
    window = range(max(0, first - 3), first + 12)
    aligned = {"position": list(window)}
    for member, positions, _ in strips:
        by_position = positions.set_index("position")
        aligned[member.rule] = [
            f"{by_position.at[p, 'token_text'] if pd.notna(by_position.at[p, 'token_text']) else by_position.at[p, 'token']!s} · {by_position.at[p, 'kind']}"
            if p in by_position.index else "" for p in window
        ]
    st.dataframe(pd.DataFrame(aligned), hide_index=True, key="cmp_aligned")

for member, positions, divergence in strips:
    st.markdown(md("**{rule}** · run {run}", rule=member.rule, run=member.run_id)
                + (f" · leaves the reference at position **{int(divergence)}** ({run_link('inspect there', member.run_id, divergence)})"
                   if divergence is not None else " · identical to the reference"))
    st.html(token_strip_html(positions.to_dict("records"), divergence=divergence))
    if divergence is not None and divergence < len(positions):
        at = positions.iloc[divergence]
        cause = []
        if pd.notna(at["severe_overshoot"]):
            cause.append(f"draft mass at q ≥ p/l: {at['severe_overshoot']:.3f}")
        if pd.notna(at["allowed_mass"]) and pd.notna(at["allowed_size"]):
            cause.append(f"allowed set |A| = {int(at['allowed_size'])}, p(A) = {at['allowed_mass']:.3f}")
        cause.append(f"a(x) = {at['accept_prob']:.3f}, coin u = {at['u_accept']:.3f}" if at["kind"] != "bonus" else "bonus position")
        st.caption(md("At the divergence: {cause}", cause="; ".join(cause)))
