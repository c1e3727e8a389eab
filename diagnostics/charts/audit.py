"""Audit's figure: the evidence of one audit (per-pair TV, or the PIT histogram)."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.charts.common import below_toolbar, chart_text, safe_label


def audit_figure(evidence: dict) -> go.Figure | None:
    """The evidence of one audit as a chart (rule level: per-pair TV; engine level: PIT histogram).

    Rule level: the observed TV of each pair (on the tested cells) beside the smallest TV the test
    detects with power 0.9; a bar above its marker is an error the test must see. Engine level:
    the pooled PIT's bin counts against the uniform expectation with a ±3σ band; a lossless
    generator's bars stay in the band. Recorded runs have no chart (their flags are a table).
    """
    layer = evidence.get("layer")
    if layer == "rule":
        pairs = evidence["pairs"]
        labels = [safe_label(pair["label"], 48) for pair in pairs]
        colors = ["#cf222e" if (pair["adjusted_p"] or 0.0) < evidence["level"] else "#1a7f37" for pair in pairs]
        figure = go.Figure()
        figure.add_bar(name="observed TV", x=labels, y=[pair["observed_tv"] for pair in pairs], marker_color=colors,
                       customdata=[pair["adjusted_p"] for pair in pairs],
                       hovertemplate="%{x}<br>observed TV = %{y:.4f}<br>Holm-adjusted p = %{customdata:.3g}<extra></extra>")
        figure.add_scatter(name="detectable TV (power 0.9)", x=labels, y=[pair["detectable_tv"] for pair in pairs],
                           mode="markers", marker={"symbol": "line-ew-open", "size": 28, "color": "#57606a", "line": {"width": 2}},
                           hovertemplate="detects TV ≥ %{y:.4f}<extra></extra>")
        figure.update_layout(title=f"Output law vs {chart_text(evidence['reference'])}: observed TV per (p, q) pair "
                                   "(red: Holm-adjusted p below the level)",
                             yaxis_title="TV (tested cells)", height=380, margin={"t": 50, "b": 40, "l": 50, "r": 10})
        return below_toolbar(figure)
    if layer in ("engine", "external"):
        counts = evidence.get("bin_counts") or []
        if not counts or not sum(counts):
            return None
        total, bins = sum(counts), len(counts)
        expected = total / bins
        band = 3 * (expected * (1 - 1 / bins)) ** 0.5
        edges = [(index + 0.5) / bins for index in range(bins)]
        figure = go.Figure()
        figure.add_bar(name="tokens in bin", x=edges, y=counts, width=[0.9 / bins] * bins,
                       marker_color="#cf222e" if evidence["verdict"] == "fail" else "#0550ae",
                       hovertemplate=f"PIT ∈ [%{{x:.3f}} ± {0.5 / bins:.3f}]<br>%{{y}} tokens<extra></extra>")
        figure.add_scatter(name="uniform ± 3σ", x=[0, 1, 1, 0, 0], y=[expected - band, expected - band, expected + band, expected + band, expected - band],
                           fill="toself", mode="lines", line={"width": 0}, fillcolor="rgba(87,96,106,0.15)", hoverinfo="skip")
        figure.add_scatter(name="uniform", x=[0, 1], y=[expected, expected], mode="lines", line={"color": "#57606a", "dash": "dash"},
                           hoverinfo="skip")
        oracle = ("the server's own teacher-forced scores" if "server" in str(evidence.get("design") or "")
                  else "the teacher-forced target law")
        figure.update_layout(title=f"Randomized PIT of every emitted token under {oracle} "
                                   "(flat when the generator samples p)",
                             xaxis_title="PIT value u = F(y − 1) + V·p(y)", yaxis_title="tokens", height=380,
                             margin={"t": 50, "b": 40, "l": 50, "r": 10}, bargap=0.05)
        return below_toolbar(figure)
    return None

