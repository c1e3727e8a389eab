"""Sweeps' figure: speed against quality across a sweep's settings."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.charts.common import COLORS, below_toolbar, chart_text, denoise, safe_label

# A label's size in fractions of the axes' spans, for a plot about 700 by 300 px: 7 px a character, 18 px high.
_CHAR_WIDTH, _LABEL_HEIGHT, _MARKER = 0.01, 0.06, 0.012
# Error bars drawn faint: a label that another point's bar still crosses stays readable.
_BAR_OPACITY = 0.5
# Diagonal places first: a point's own error bars cross at the point, so a label above or beside it sat on one.
_PLACES = ("top right", "top left", "bottom right", "bottom left")


def _label_places(points: list[tuple[tuple[float, float, float], tuple[float, float, float]]], labels: dict[int, str]) -> dict[int, str]:
    """A text position for each labelled point (``labels``: index → text): the diagonal place whose
    estimated box crosses the fewest error bars and other labels and stays inside the axes, taken
    left to right (a tie keeps the first of ``_PLACES``; to the left first in the right third)."""
    xs = [value for x, _ in points for value in x if value == value]
    ys = [value for _, y in points for value in y if value == value]
    if not xs or not ys:
        return {index: "top right" for index in labels}
    x_low, y_low = min(xs), min(ys)
    x_span, y_span = (max(xs) - x_low) or 1.0, (max(ys) - y_low) or 1.0

    def scaled(x: float, y: float) -> tuple[float, float]:
        return (x - x_low) / x_span, (y - y_low) / y_span

    bars = []  # (x0, x1, y0, y1) of every error bar, in fractions of the spans
    for x, y in points:
        (cx, cy), (x_lo, y_lo), (x_hi, y_hi) = scaled(x[0], y[0]), scaled(x[1], y[1]), scaled(x[2], y[2])
        bars += [(x_lo, x_hi, cy, cy), (cx, cx, y_lo, y_hi)]
    placed: list[tuple[float, float, float, float]] = []
    chosen = {}
    for index in sorted(labels, key=lambda index: (points[index][0][0], points[index][1][0])):
        cx, cy = scaled(points[index][0][0], points[index][1][0])
        width = _CHAR_WIDTH * len(labels[index])
        order = _PLACES if cx < 2 / 3 else ("top left", "top right", "bottom left", "bottom right")
        best = None
        for place in order:
            x0 = cx + _MARKER if place.endswith("right") else cx - _MARKER - width
            y0 = cy + _MARKER if place.startswith("top") else cy - _MARKER - _LABEL_HEIGHT
            box = (x0, x0 + width, y0, y0 + _LABEL_HEIGHT)
            crossings = sum(box[0] <= bar[1] and bar[0] <= box[1] and box[2] <= bar[3] and bar[2] <= box[3] for bar in bars)
            overlaps = sum(box[0] < other[1] and other[0] < box[1] and box[2] < other[3] and other[2] < box[3] for other in placed)
            outside = box[0] < -0.02 or box[1] > 1.02 or box[2] < -0.05 or box[3] > 1.05
            cost = 3 * overlaps + crossings + 2 * outside
            if best is None or cost < best[0]:
                best = (cost, place, box)
        chosen[index] = best[1]
        placed.append(best[2])
    return chosen


def _faint(color: str) -> str:
    """``#rrggbb`` as ``rgba`` at ``_BAR_OPACITY``."""
    red, green, blue = (int(color[index:index + 2], 16) for index in (1, 3, 5))
    return f"rgba({red}, {green}, {blue}, {_BAR_OPACITY})"


def pareto_figure(summaries: list, against: str = "TV(P, baseline)") -> go.Figure:
    """Speed against quality across a sweep's settings: modelled speed-up on x, ``against`` (a
    distortion per token, or accuracy) on y, each point with its 95% bootstrap interval on both
    axes; lossless and baselines marked apart; hover names the setting. Each rule's label sits
    diagonally beside its point (``_label_places``), off the error bars that cross there."""
    figure = go.Figure()
    styles = {"lossless": ("star", "#000000"), "baseline": ("square", COLORS["baseline"]), "rule": ("circle", COLORS["p"])}
    roles = [role for role in ("rule", "baseline", "lossless") if any(summary.role == role for summary in summaries)]
    chosen = [summary for role in roles for summary in summaries if summary.role == role]
    points = [(list(summary.figures["modelled speed-up"]), denoise(list(summary.figures[against]))) for summary in chosen]  # lossless: 0 [0, 0], not 1e-16
    names = [safe_label(summary.label, 60) for summary in chosen]
    places = _label_places(points, {index: names[index] for index, summary in enumerate(chosen) if summary.role == "rule"})
    for role in roles:
        indices = [index for index, summary in enumerate(chosen) if summary.role == role]
        x = [points[index][0] for index in indices]
        y = [points[index][1] for index in indices]
        symbol, color = styles[role]
        faint = _faint(color)
        figure.add_scatter(
            x=[value[0] for value in x], y=[value[0] for value in y], mode="markers+text" if role == "rule" else "markers", name=role,
            text=[names[index] for index in indices], textposition=[places.get(index, "top right") for index in indices],
            cliponaxis=False, marker={"symbol": symbol, "size": 11, "color": color},
            error_x={"type": "data", "symmetric": False, "array": [value[2] - value[0] for value in x],
                     "arrayminus": [value[0] - value[1] for value in x], "thickness": 1, "color": faint},
            error_y={"type": "data", "symmetric": False, "array": [value[2] - value[0] for value in y],
                     "arrayminus": [value[0] - value[1] for value in y], "thickness": 1, "color": faint},
            hovertext=[f"{names[index]}<br>speed-up {sx[0]:.3f} [{sx[1]:.3f}, {sx[2]:.3f}]<br>{chart_text(against)} {sy[0]:.4f} "
                       f"[{sy[1]:.4f}, {sy[2]:.4f}]" for index, sx, sy in zip(indices, x, y)],
            hoverinfo="text",
        )
    figure.update_layout(height=460, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                         title=f"Modelled speed-up against {chart_text(against)} (95% intervals over prompts and seeds)",
                         xaxis_title="modelled speed-up over plain decoding", yaxis_title=chart_text(against),
                         legend={"orientation": "h", "y": -0.15})
    return below_toolbar(figure)
