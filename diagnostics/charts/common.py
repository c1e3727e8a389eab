"""What every figure shares: colours, safe token labels, the tokens worth showing, marks above bars.

Token text is untrusted: every label passes through ``safe_label`` (HTML-escaped, control
characters made visible) before it reaches a figure, because Plotly renders a subset of HTML
in labels and hover text.
"""

from __future__ import annotations

import html
import re

import plotly.graph_objects as go
import torch

from diagnostics.explain import StepView
from diagnostics.metrics import FLOAT_NOISE, noise_as_zero
from diagnostics.untrusted import visible

COLORS = {
    "p": "#1f77b4",  # target
    "q": "#ff7f0e",  # draft
    "induced": "#2ca02c",
    "baseline": "#7f7f7f",
    "fallback": "#9467bd",
    "overshoot": "rgba(255, 127, 14, 0.12)",
    "severe": "rgba(214, 39, 40, 0.22)",
    "allowed": "#17becf",
    "ceiling": "#d62728",
}
# Plotly's toolbar as every page and report shows it: zoom, pan, reset and a PNG download. Its full
# set (box and lasso select, zoom in and out, autoscale, spikes, two hover modes, the logo) ran
# across the top of the figure and printed over its title and legend.
CHART_CONFIG = {"displaylogo": False,
                "modeBarButtonsToRemove": ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d", "toggleSpikelines",
                                           "hoverClosestCartesian", "hoverCompareCartesian"]}
# The toolbar's row at a figure's top right (its buttons and Streamlit's fullscreen: 26 px, 3 px from the top),
# with a margin: titles, subplot titles and top legends start below it (``below_toolbar``).
TOOLBAR_ROW = 38


def below_toolbar(figure: go.Figure) -> go.Figure:
    """``figure`` with its top margin grown by ``TOOLBAR_ROW`` and its title pinned that far below the
    container's top, so the toolbar shown on hover covers neither the title nor the subplot titles
    and legends that sit just above the plot (measured in headless chromium: a 152-px bar over the
    law, candidates and PIT titles, the tree legend and Compare's subplot title)."""
    top = figure.layout.margin.t
    figure.update_layout(margin={"t": (40 if top is None else top) + TOOLBAR_ROW})
    if figure.layout.title.text:
        figure.update_layout(title={"yref": "container", "y": 1, "yanchor": "top", "pad": {"t": TOOLBAR_ROW}})
    return figure


RULE_COLORS = ["#d62728", "#9467bd", "#1f77b4", "#2ca02c", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


VISIBLE_SPACE = "␣"
# Spaces SVG text would trim or collapse (Plotly sets no xml:space): leading, trailing, runs of 2+.
_HIDDEN_SPACES = re.compile(r"^ +| +$| {2,}")


def safe_label(text: str, limit: int = 40) -> str:
    """Token text made safe for a chart: control characters shown as escapes, ``& < >`` escaped
    once, cut to ``limit``. Quotes stay as they are: plotly.js decodes only ``&amp; &lt; &gt;``,
    numeric and a few named entities, so ``&quot;`` would be shown as those six characters,
    and with ``<`` escaped no tag (where a quote could matter) can form."""
    return html.escape(visible(text, limit=limit), quote=False)


def chart_text(text: object, limit: int = 200) -> str:
    """Untrusted text other than a token (a rule spec, a setting's label) for a chart's title,
    legend or hover: escaped once as ``safe_label`` does."""
    return safe_label(str(text), limit)


def token_label(text: str, limit: int = 40) -> str:
    """``safe_label`` with the spaces a chart would lose drawn as ␣: `` In`` and ``In`` are
    different tokens (a draft often proposes the other), but SVG trims a tick's leading space."""
    return visible_spaces(safe_label(text, limit))


def visible_spaces(text: str) -> str:
    """``text`` with its leading and trailing spaces, and runs of two or more, drawn as ␣."""
    return _HIDDEN_SPACES.sub(lambda match: VISIBLE_SPACE * len(match.group()), text)


def denoise(values: list[float | None]) -> list[float | None]:
    """Distortion values with float noise (``|x| < FLOAT_NOISE``) drawn as 0, so a lossless
    run's track is flat 0 instead of being scaled to 1e-16 ("1f 2f 3f" ticks, spikes)."""
    return [noise_as_zero(value) for value in values]


def shown_tokens(view: StepView, top_n: int, must: tuple[int | None, ...] = ()) -> list[int]:
    """Tokens worth showing, ordered by ``p`` (largest first): all when the vocabulary is small, else
    the top ``top_n`` by ``max(p, q, P, f)`` plus every token in ``must`` (the drafted and emitted
    tokens are always shown, however unlikely)."""
    vocab = view.p_target.numel()
    if vocab <= top_n:
        tokens = list(range(vocab))
    else:
        score = torch.stack([view.p_target, view.q_draft, view.induced, view.fallback]).amax(0)
        tokens = torch.topk(score, top_n).indices.tolist()
        tokens += [int(token) for token in must if token is not None and 0 <= int(token) < vocab and int(token) not in tokens]
    return sorted(tokens, key=lambda token: (-float(view.p_target[token]), token))


def category_labels(view: StepView, tokens: list[int]) -> list[str]:
    """The chart labels of ``tokens`` (``token_label``), made distinct when two tokens look alike."""
    labels = [token_label(view.labels[index]) for index in tokens]
    # Plotly needs distinct category names; prefix ids only when labels collide.
    if len(set(labels)) != len(labels):
        labels = [f"{index}:{label}" for index, label in zip(tokens, labels)]
    return labels


def mark_tokens(figure: go.Figure, labels: list[str], tokens: list[int], marks: list[tuple[int | None, str, str, str]],
                 height: float, **where: int) -> None:
    """Labelled markers above the bars of chosen tokens: ``(token, text, symbol, colour)``; two
    marks on one token stack."""
    level = 0
    for token, text, symbol, color in marks:
        if token is None or int(token) not in tokens:
            continue
        column = tokens.index(int(token))
        # A label reads away from the nearer edge: to the right of the last bar it was cut off.
        side = "middle right" if column < len(labels) / 2 else "middle left"
        # One height per mark, so labels on neighbouring tokens never overlap.
        figure.add_scatter(x=[labels[column]], y=[height * (1.06 + 0.09 * level)], mode="markers+text", name=text,
                           text=[text], textposition=side, showlegend=False, cliponaxis=False,
                           marker={"symbol": symbol, "size": 13, "color": color},
                           hovertemplate=f"%{{x}}: {text}<extra></extra>", **where)
        level += 1

def fmt_value(value: object, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)

