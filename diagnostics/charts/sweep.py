"""Sweeps' figure: speed against quality across a sweep's settings."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.charts.common import COLORS, below_toolbar, chart_text, denoise, safe_label


def pareto_figure(summaries: list, against: str = "TV(P, baseline)") -> go.Figure:
    """Speed against quality across a sweep's settings: modelled speed-up on x, ``against`` (a
    distortion per token, or accuracy) on y, each point with its 95% bootstrap interval on both
    axes; lossless and baselines marked apart; hover names the setting."""
    figure = go.Figure()
    styles = {"lossless": ("star", "#000000"), "baseline": ("square", COLORS["baseline"]), "rule": ("circle", COLORS["p"])}
    for role in ("rule", "baseline", "lossless"):
        chosen = [summary for summary in summaries if summary.role == role]
        if not chosen:
            continue
        x = [summary.figures["modelled speed-up"] for summary in chosen]
        y = [denoise(list(summary.figures[against])) for summary in chosen]  # lossless: 0 [0, 0], not 1e-16
        names = [safe_label(summary.label, 60) for summary in chosen]
        symbol, color = styles[role]
        figure.add_scatter(
            x=[value[0] for value in x], y=[value[0] for value in y], mode="markers+text" if role == "rule" else "markers", name=role,
            text=names, textposition="top center", marker={"symbol": symbol, "size": 11, "color": color},
            error_x={"type": "data", "symmetric": False, "array": [value[2] - value[0] for value in x],
                     "arrayminus": [value[0] - value[1] for value in x], "thickness": 1},
            error_y={"type": "data", "symmetric": False, "array": [value[2] - value[0] for value in y],
                     "arrayminus": [value[0] - value[1] for value in y], "thickness": 1},
            hovertext=[f"{name}<br>speed-up {sx[0]:.3f} [{sx[1]:.3f}, {sx[2]:.3f}]<br>{chart_text(against)} {sy[0]:.4f} "
                       f"[{sy[1]:.4f}, {sy[2]:.4f}]" for name, sx, sy in zip(names, x, y)],
            hoverinfo="text",
        )
    figure.update_layout(height=460, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                         title=f"Modelled speed-up against {chart_text(against)} (95% intervals over prompts and seeds)",
                         xaxis_title="modelled speed-up over plain decoding", yaxis_title=chart_text(against),
                         legend={"orientation": "h", "y": -0.15})
    return below_toolbar(figure)
