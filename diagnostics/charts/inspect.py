"""Inspect's figures: the laws at one position and the per-position tracks of a run."""

from __future__ import annotations

import plotly.graph_objects as go
import torch

from diagnostics.charts.common import COLORS, below_toolbar, category_labels, chart_text, denoise, mark_tokens, shown_tokens, token_label
from diagnostics.explain import StepView

# A horizontal legend in rows at the figure's foot (container-referenced): Plotly's margin then holds the
# axis's rotated token labels and title above it (at paper y = -0.15 it sat on those labels).
LEGEND_AT_FOOT = {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0, "xanchor": "left"}


def law_figure(view: StepView, top_n: int = 30, show_fallback: bool | None = None, draft_token: int | None = None,
               emitted_token: int | None = None, kind: str | None = None) -> go.Figure:
    """Bars of ``p``, ``q``, the induced law ``P``, the matched baseline and the fallback ``f`` over the
    top tokens, ordered by ``p``; the drafted and emitted tokens always shown and marked.

    Background shading marks the overshoot region ``q > p`` (orange) and the severe overshoot
    ``q ≥ p/l`` (red) token by token; dashes mark the ceiling ``p/l``; a teal band under the
    axis marks the allowed set ``A``. At a rejection (``kind="rejected"``) the fallback law is
    shown by default: the token was drawn from it.
    """
    tokens = shown_tokens(view, top_n, (draft_token, emitted_token))
    labels = category_labels(view, tokens)
    if show_fallback is None:
        show_fallback = kind == "rejected"

    def values(tensor: torch.Tensor) -> list[float]:
        return [float(tensor[index]) for index in tokens]

    figure = go.Figure()
    series = [
        ("target p", view.p_target, COLORS["p"], True),
        ("draft q", view.q_draft, COLORS["q"], True),
        ("induced P", view.induced, COLORS["induced"], True),
        ("matched baseline", view.baseline, COLORS["baseline"], True),
        ("fallback f", view.fallback, COLORS["fallback"], True if show_fallback else "legendonly"),
    ]
    accept = values(view.accept)
    for name, tensor, color, shown in series:
        figure.add_bar(
            name=name,
            x=labels,
            y=values(tensor),
            marker_color=color,
            visible=shown,
            customdata=accept,
            hovertemplate=f"%{{x}}<br>{name} = %{{y:.4f}}<br>a(v) = %{{customdata:.3f}}<extra></extra>",
        )
    p_values, q_values = values(view.p_target), values(view.q_draft)
    ceiling = values(view.ceiling) if view.ceiling is not None else None
    shading = []
    for position, (p_v, q_v) in enumerate(zip(p_values, q_values)):
        if ceiling is not None and q_v > 0 and q_v >= ceiling[position]:
            fill = COLORS["severe"]
        elif q_v > p_v:
            fill = COLORS["overshoot"]
        else:
            continue
        shading.append({"type": "rect", "xref": "x", "yref": "paper", "x0": position - 0.5, "x1": position + 0.5, "y0": 0, "y1": 1,
                        "fillcolor": fill, "line": {"width": 0}, "layer": "below"})
    figure.update_layout(shapes=shading)  # one list: add_vrect per token is slow
    # Every bar fits, the hidden fallback's too (the legend shows it without rescaling the axis):
    # a matched baseline of mass 1.0 on one token was cut at 0.37 when it was left out.
    top = max([*p_values, *q_values, *values(view.induced), *values(view.baseline), *values(view.fallback)], default=1.0) or 1.0
    if ceiling is not None:
        figure.add_scatter(
            name="ceiling p/l",
            x=labels,
            y=[min(value, top * 1.02) for value in ceiling],  # p/l can exceed 1: clipped at the chart's top
            customdata=ceiling,
            mode="markers",
            marker={"symbol": "line-ew-open", "size": 30, "color": COLORS["ceiling"], "line": {"width": 3}},
            hovertemplate="%{x}<br>p/l = %{customdata:.4f}<extra></extra>",
        )
    if view.allowed is not None:
        allowed = [labels[i] for i, index in enumerate(tokens) if bool(view.allowed[index])]
        mass = f" (p(A) = {view.allowed_mass:.3f})" if view.allowed_mass is not None else ""
        figure.add_scatter(
            name=f"allowed set A{mass}",
            x=allowed,
            y=[-0.035 * top] * len(allowed),
            mode="markers",
            marker={"symbol": "square", "size": 14, "color": COLORS["allowed"]},
            hovertemplate="%{x} is in A<extra></extra>",
        )
    mark_tokens(figure, labels, tokens, [
        (draft_token, "drafted x" if kind != "accepted" else "drafted x, kept", "triangle-down", COLORS["q"]),
        (emitted_token if kind != "accepted" else None, "emitted", "star", "#111111"),
    ], top)
    # Legend-only entries explain the shading.
    figure.add_scatter(name="overshoot q > p", x=[None], y=[None], mode="markers",
                       marker={"symbol": "square", "size": 12, "color": "rgba(255,127,14,0.35)"})
    if ceiling is not None:
        figure.add_scatter(name="severe q ≥ p/l", x=[None], y=[None], mode="markers",
                           marker={"symbol": "square", "size": 12, "color": "rgba(214,39,40,0.45)"})
    figure.update_layout(
        barmode="group",
        # Two lines: in a half-width column one line of this length runs past the chart's right edge.
        title=f"{chart_text(view.spec)}: target, draft, induced law and matched baseline<br>tokens ordered by p",
        xaxis_title="token",
        xaxis_type="category",  # tokens such as "1" and "2" must not become numbers on a linear axis
        yaxis_title="probability",
        yaxis_range=[-0.07 * top, top * 1.3],
        # The legend in rows at the figure's foot, below the token labels and the axis title: beside the
        # plot it took a third of a narrow column; at paper y < 0 it covered the rotated labels, and
        # inside the plot it hid the fallback law.
        legend=LEGEND_AT_FOOT,
        margin={"t": 50, "b": 40, "l": 50, "r": 10},
        height=520,
    )
    return below_toolbar(figure)


def _vertical(x: float, color: str, width: int, dash: str) -> dict:
    return {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1, "layer": "below",
            "line": {"color": color, "width": width, "dash": dash}}


def tracks_figure(positions: "object", selected: int | None = None, divergence: int | None = None) -> go.Figure:
    """Per-position tracks of a run: acceptance ``a(x)`` and ``α``, ``TV(p, q)``, ``H(p)``, the
    target log-likelihood ``log p(y_t)`` of each emitted token, and the distortion of the emitted
    law (``TV(P, p)``, ``TV(P, baseline)``, ``KL(P ‖ p)``; float noise drawn as 0).

    Vertical dotted lines mark block starts; the selected position and the first divergence are
    marked on every track, the divergence labelled once. ``positions`` is the store's DataFrame
    of one run.
    """
    import math

    from plotly.subplots import make_subplots

    frame = positions
    x = frame["position"].tolist()
    figure = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.035,
                           subplot_titles=("acceptance: a(x) of the draft, α = Σ q·a", "TV(p, q)", "entropy H(p)",
                                           "target log-likelihood log p(y) of the emitted token",
                                           "distortion of the emitted law"))

    def series(name: str) -> list[float | None]:
        if name not in frame:
            return [None] * len(x)
        return [None if value != value else float(value) for value in frame[name].astype("float64").tolist()]

    log_p = [None if value is None else math.log(max(value, 1e-300)) for value in series("p_token")]
    hover = [token_label(str(text)) for text in frame["token_text"].fillna("").tolist()]
    traces = [
        (1, "a(x)", series("accept_prob"), "#1a7f37", "markers"),
        (1, "α", series("alpha"), "#8250df", "lines"),
        (2, "TV(p, q)", series("tv_pq"), "#bc4c00", "lines"),
        (3, "H(p)", series("entropy_p"), "#0550ae", "lines"),
        (4, "log p(y)", log_p, "#6e7781", "lines"),  # no markers: 2,000 SVG points cost the browser
        (5, "TV(P, p)", denoise(series("tv_target")), "#cf222e", "lines"),
        (5, "TV(P, baseline)", denoise(series("tv_baseline")), "#57606a", "lines"),
        (5, "KL(P ‖ p)", denoise(series("kl_target")), "#bf8700", "lines"),
    ]
    for index, (row, name, values, color, mode) in enumerate(traces):
        # The token text rides on the first trace only; "x unified" hover shows it for all.
        extra = {"customdata": hover, "hovertemplate": f"position %{{x}} %{{customdata}}<br>{name} = %{{y:.4~g}}<extra></extra>"} \
            if index == 0 else {"hovertemplate": f"{name} = %{{y:.4~g}}<extra></extra>"}
        figure.add_scatter(row=row, col=1, x=x, y=values, name=name, mode=mode,
                           line={"color": color, "width": 1.5}, marker={"color": color, "size": 4}, **extra)
    # Lines across every track as plain layout shapes (paper height): add_vline per subplot costs
    # seconds on a long run; one shape list costs milliseconds.
    shapes = []
    starts = frame.loc[frame["index_in_block"] == 0, "position"].tolist()
    if len(starts) <= 400:  # beyond that the lines are a grey wash; the hover still tells the block
        shapes += [_vertical(start - 0.5, "#d0d7de", 1, "dot") for start in starts]
    if selected is not None:
        shapes.append(_vertical(selected, "#111", 2, "solid"))
    if divergence is not None:
        shapes.append(_vertical(divergence, "#cf222e", 2, "dash"))
        # Named once, in the legend: a label on the chart sat on the first track's title (and a
        # vline's own annotation repeats on every subplot).
        figure.add_scatter(row=1, col=1, x=[None], y=[None], mode="lines", name=f"first divergence (position {int(divergence)})",
                           line={"color": "#cf222e", "width": 2, "dash": "dash"}, hoverinfo="skip")
    figure.update_layout(shapes=shapes)
    figure.update_layout(height=740, margin={"t": 40, "b": 30, "l": 50, "r": 10}, legend={"orientation": "h", "y": -0.1},
                         clickmode="event+select", hovermode="x unified")
    figure.update_xaxes(title_text="position", row=5, col=1)
    # A distortion is never negative: a lossless run's flat 0 sits on the axis's floor (0 to 1),
    # not in the middle of a symmetric -1 to 1 range.
    figure.update_yaxes(rangemode="nonnegative", row=5, col=1)
    # Small values in scientific notation: Plotly's default SI prefixes labelled a track's ticks
    # "1μ 2μ 3μ", which reads as a unit, not as 1e-6.
    figure.update_yaxes(exponentformat="e")
    return below_toolbar(figure)

