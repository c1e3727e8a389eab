"""Playground's figure: the distortion of every rule as the draft moves toward the target."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.charts.common import RULE_COLORS, below_toolbar, chart_text, denoise
from diagnostics.distortion_curve import DraftPath


def draft_path_figure(sweep: DraftPath, against: str = "baseline") -> go.Figure:
    """Distortion of every rule as ``q`` moves to ``p``; tree rules dashed, truncation limits dotted.

    ``against="baseline"`` plots ``TV(P_t, baseline)`` with the limit ``p(Aᶜ)²`` for truncation
    rules; ``against="target"`` plots ``TV(P_t, p)`` with the limit ``p(A)·p(Aᶜ)``. Float noise
    is drawn as 0 (the lossless rule's curve is flat 0).
    """
    if against not in ("baseline", "target"):
        raise ValueError("against must be 'baseline' or 'target'")
    figure = go.Figure()
    colors: dict[str, str] = {}
    for curve in sweep.curves:
        color = colors.setdefault(curve.spec, RULE_COLORS[len(colors) % len(RULE_COLORS)])
        values = denoise(list(curve.tv_baseline if against == "baseline" else curve.tv_target))
        figure.add_scatter(
            name=chart_text(curve.label),
            x=curve.t,
            y=values,
            mode="lines",
            line={"color": color, "dash": "dash" if curve.tree else "solid", "width": 2},
            customdata=curve.acceptance,
            hovertemplate=f"{chart_text(curve.label)}<br>t = %{{x:.3f}}<br>TV = %{{y:.4f}}"
            "<br>acceptance = %{customdata:.3f}<extra></extra>",
        )
        limit = curve.limit_baseline if against == "baseline" else curve.limit_target
        if limit is not None:
            name = "p(Aᶜ)²" if against == "baseline" else "p(A)·p(Aᶜ)"
            figure.add_scatter(
                name=f"limit {name}, {chart_text(curve.spec)}",
                x=[0.0, 1.0],
                y=[limit, limit],
                mode="lines",
                line={"color": color, "dash": "dot", "width": 1},
                hovertemplate=f"{name} = {limit:.4f}<extra></extra>",
            )
    ylabel = "TV(P, matched baseline)" if against == "baseline" else "TV(P, p)"
    figure.update_layout(
        title=f"Distortion as the draft moves toward the target: q_t = (1 − t)·q + t·p ({ylabel})",
        xaxis_title="interpolation t (0 = the draft, 1 = a perfect draft q = p)",
        yaxis_title=ylabel,
        yaxis_rangemode="nonnegative",  # lossless alone (flat 0) gets a 0-to-1 axis, not -1 to 1
        legend={"orientation": "v"},
        margin={"t": 50, "b": 40, "l": 50, "r": 10},
        height=450,
    )
    return below_toolbar(figure)

