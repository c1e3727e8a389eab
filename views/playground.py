"""Playground: pick a synthetic ``p`` and ``q`` and a rule; see the exact law it induces."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.charts import CHART_CONFIG, draft_path_figure, law_figure
from diagnostics.distortion_curve import PATH_RULES, PATH_TREE_RULES, distortion_path
from diagnostics.explain import explain_step, rule_table
from diagnostics.rules import EXAMPLE_SPECS, RULES, RuleError, get_rule
from diagnostics.synthetic import PRESETS, make_pair
from views.common import show_error

# Widget bounds per rule parameter: (min, max, default, step).
PARAM_BOUNDS = {
    ("cascade", "m"): (0.01, 1.0, 0.5, 0.01),
    ("typical", "eta"): (0.001, 1.0, 0.1, 0.01),
    ("medusa", "eps"): (0.001, 1.0, 0.09, 0.01),
    ("medusa", "delta"): (0.01, 1.0, 0.3, 0.01),
    ("lenience", "l"): (0.01, 1.0, 0.5, 0.01),
    ("cos", "lam"): (0.0, 1.0, 0.4, 0.05),
    ("mentored", "alpha"): (0.01, 1.0, 0.5, 0.01),
    ("mentored", "beta"): (1.0, 20.0, 2.0, 0.1),
}

st.title("Playground")
st.caption(
    "Exact one-step laws of every verification rule on a synthetic target p and draft q. "
    "Nothing here is sampled: every number is computed in closed form."
)

with st.sidebar:
    st.subheader("Target and draft")
    preset = st.selectbox("Preset", list(PRESETS), format_func=PRESETS.get, key="preset")
    vocab, concentration, noise, seed = 4, 1.0, 0.5, 0
    if preset != "toy":
        vocab = st.slider("Vocabulary size", 2, 64, 12, key="vocab")
        if preset in ("dirichlet", "noisy"):
            concentration = st.slider("Dirichlet concentration", 0.05, 10.0, 1.0, 0.05, key="concentration",
                                      help="Small: peaked laws. Large: near-uniform laws.")
        if preset == "noisy":
            noise = st.slider("Noise in the draft", 0.0, 1.0, 0.5, 0.01, key="noise",
                              help="q = (1 − noise)·p + noise·u with u ~ Dirichlet(1).")
        seed = int(st.number_input("Seed", 0, 10_000, 0, key="seed"))
    st.subheader("Rule")
    name = st.selectbox("Verification rule", list(RULES), key="rule",
                        format_func=lambda n: f"{n} — {RULES[n].summary}")
    params = {}
    for param in RULES[name].param_names:
        low, high, default, step = PARAM_BOUNDS[(name, param)]
        params[param] = st.number_input(param, low, high, default, step, key=f"param_{name}_{param}", format="%.3f")  # literal-ok: a rule's parameter name
    typed = st.text_input("…or type a rule spec", key="spec_text", placeholder="e.g. lenience:0.3",  # literal-ok: help lists constants
                          help="Same strings as the command line: " + ", ".join(EXAMPLE_SPECS))
    tree_k = st.slider("Tree candidates k (draft's top-k)", 1, 4, 1, key="tree_k")

pair = make_pair(preset, vocab=vocab, concentration=concentration, noise=noise, seed=seed)
try:
    rule = get_rule(typed) if typed.strip() else get_rule(name, **params)
except RuleError as error:
    show_error(error)
    st.stop()

view = explain_step(rule, pair.p_target, pair.q_draft, pair.labels)
st.subheader(f"{rule.spec} on “{pair.description}”")  # literal-ok: a parsed spec (known name, numbers) and a preset
cols = st.columns(5)
cols[0].metric("acceptance α = Σ q·a", f"{view.alpha:.4f}")
cols[1].metric("TV(P, p)", f"{view.tv_target:.4f}", help="Distance of the emitted law from the target.")
cols[2].metric("TV(P, baseline)", f"{view.tv_baseline:.4f}",
               help="Distance from the target sampled losslessly under the same truncation.")
cols[3].metric("TV(p, q)", f"{view.tv_draft:.4f}", help="= overshoot mass Σ(q − p)+; lossless rejects with this probability.")
if view.severe_overshoot is not None:
    cols[4].metric("mass of q ≥ p/l", f"{view.severe_overshoot:.4f}", help="Draft mass at or above the ceiling p/l.")
elif view.allowed_mass is not None:
    cols[4].metric("p(A), |A|", f"{view.allowed_mass:.4f}, {int(view.allowed.sum())}",
                   help="Target mass of the allowed set A and its size.")
else:
    cols[4].metric("H(p)", f"{view.entropy_target:.4f}", help="Entropy of the target, natural log.")

st.plotly_chart(law_figure(view), key="law_chart", config=CHART_CONFIG)

st.subheader("Every rule at this pair")
table = pd.DataFrame(rule_table(pair.p_target, pair.q_draft, PATH_RULES + ("lossless",), PATH_TREE_RULES + ("lossless",), tree_k))
st.dataframe(table, hide_index=True, key="rule_table",
             column_config={c: st.column_config.NumberColumn(format="%.4f") for c in table.columns[2:]})

st.subheader("Distortion as the draft improves")
against = st.radio("Measure distortion against", ["baseline", "target"], horizontal=True, key="against",
                   format_func={"baseline": "matched baseline", "target": "target p"}.get)
sweep = distortion_path(pair.p_target, pair.q_draft, tree_k=tree_k)
st.plotly_chart(draft_path_figure(sweep, against), key="sweep_chart", config=CHART_CONFIG)
st.caption(
    "Truncation rules level off at p(Aᶜ)² against their matched baseline (p(A)·p(Aᶜ) against p): "
    "inside A they follow the draft's shape, not p's. Lenience vanishes single-draft as q → p, "
    "but not in a tree, where acceptance min(1, p/l) ignores q."
)

with st.expander("Definitions"):
    st.markdown(  # literal-ok: the rule library's own text
        "\n".join(f"- **{n}**: {cls.summary}" for n, cls in RULES.items())
        + "\n- **α**: expected acceptance Σ_v q(v)·a(v).\n- **TV(a, b)** = ½ Σ |a − b|."
        "\n- **matched baseline**: the target sampled losslessly under the same truncation (p_A = p·1_A / p(A) "
        "for truncation rules, p otherwise).\n- **induced P** = q·a + (1 − α)·f, exact."
    )
