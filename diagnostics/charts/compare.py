"""Compare's figure (the first divergence of several rules at one position) and its table of the runs at one seed."""

from __future__ import annotations

import plotly.graph_objects as go
import torch

from diagnostics.charts.common import COLORS, RULE_COLORS, below_toolbar, category_labels, chart_text, mark_tokens, shown_tokens
from diagnostics.charts.inspect import LEGEND_AT_FOOT
from diagnostics.explain import StepView
from diagnostics.untrusted import html_text

# Compare's runs at one seed: a table that fits the width it is given (cells wrap). As a data grid it
# was wider than the page (its "modelled speed-up" column cut at the edge) and its horizontal scroll
# bar covered the third row.
SEED_RUNS_CSS = ("table.seed-runs { width: 100%; border-collapse: collapse; table-layout: auto; font-size: 0.9rem; } "
                 "table.seed-runs th, table.seed-runs td { border: 1px solid #d0d7de; padding: 4px 6px; text-align: left; "
                 "vertical-align: top; } "
                 # words stay whole where they fit ("complete", a run id); a rule label too long for its column breaks anywhere
                 "table.seed-runs td { overflow-wrap: break-word; } "
                 "table.seed-runs td:first-child { overflow-wrap: anywhere; min-width: 7em; } "
                 "table.seed-runs td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; } "
                 # a fill that reads in a light and a dark theme (the header's text follows the theme)
                 "table.seed-runs th { background: rgba(127, 127, 127, 0.15); font-weight: 600; } "
                 # In a narrow column (its ten columns' words no longer fit) every cell may break anywhere, in a
                 # smaller font; past that the frame scrolls (at 540 px the table was 760 wide, cut at the edge).
                 "div.seed-runs-frame { container-type: inline-size; overflow-x: auto; } "
                 "@container (max-width: 760px) { table.seed-runs { font-size: 0.8rem; } "
                 "table.seed-runs th, table.seed-runs td, table.seed-runs td.number { overflow-wrap: anywhere; white-space: normal; } }")


def divergence_figure(p_target: torch.Tensor, q_draft: torch.Tensor, steps: list[tuple[StepView, dict]],
                      top_n: int = 14) -> go.Figure:
    """The first divergence on one chart: left, ``p``, ``q`` and each rule's fallback law over the
    tokens that matter (by ``p``; the drafted token and every rule's emitted token always shown,
    each marked); right, each rule's ``a(x)`` of the drafted token against the shared coin ``u``
    (a bar that reaches above the line accepts).

    ``steps``: one ``(view, record)`` per rule, the view from ``explain_step`` at the shared
    ``(p, q)`` and the record of that rule's run at the divergence.
    """
    from plotly.subplots import make_subplots

    first_view = steps[0][0]
    draft_token = steps[0][1].get("draft_token")
    emitted = [int(record["token"]) for _, record in steps]
    tokens = shown_tokens(first_view, top_n, (draft_token, *emitted))
    labels = category_labels(first_view, tokens)
    figure = make_subplots(rows=1, cols=2, column_widths=[0.74, 0.26], horizontal_spacing=0.09,
                           subplot_titles=("laws at this position", "a(x) of the draft vs the coin u"))

    def values(tensor: torch.Tensor) -> list[float]:
        return [float(tensor[index]) for index in tokens]

    figure.add_bar(name="target p", x=labels, y=values(p_target), marker_color=COLORS["p"], row=1, col=1,
                   hovertemplate="%{x}<br>p = %{y:.4f}<extra></extra>")
    figure.add_bar(name="draft q", x=labels, y=values(q_draft), marker_color=COLORS["q"], row=1, col=1,
                   hovertemplate="%{x}<br>q = %{y:.4f}<extra></extra>")
    marks: list[tuple[int | None, str, str, str]] = [(draft_token, "drafted x", "triangle-down", COLORS["q"])]
    tallest = max(values(p_target) + values(q_draft))
    for index, (view, record) in enumerate(steps):
        color = RULE_COLORS[index % len(RULE_COLORS)]
        spec = chart_text(view.spec)
        if record["kind"] == "rejected":
            fallback = values(view.fallback)
            tallest = max(tallest, *fallback)
            figure.add_bar(name=f"fallback law of {spec}", x=labels, y=fallback, marker_color=color, opacity=0.75, row=1, col=1,
                           hovertemplate=f"%{{x}}<br>{spec} fallback = %{{y:.4f}}<extra></extra>")
        marks.append((int(record["token"]), f"{spec} emits", "star", color))
    mark_tokens(figure, labels, tokens, marks, tallest, row=1, col=1)
    coin = steps[0][1].get("u_accept")
    specs = [chart_text(view.spec) for view, _ in steps]
    accepts = [record.get("accept_prob") for _, record in steps]
    if draft_token is not None and all(value is not None for value in accepts):
        figure.add_bar(name="a(x)", x=specs, y=accepts, showlegend=False, row=1, col=2,
                       marker_color=[RULE_COLORS[index % len(RULE_COLORS)] for index in range(len(steps))],
                       hovertemplate="%{x}<br>a(x) = %{y:.4f}<extra></extra>")
        if coin is not None:
            figure.add_scatter(name=f"coin u = {coin:.3f}", x=specs, y=[coin] * len(specs), mode="lines+markers", row=1, col=2,
                               line={"color": "#111111", "dash": "dash", "width": 2}, marker={"size": 6},
                               hovertemplate="coin u = %{y:.4f}<extra></extra>")
        figure.update_yaxes(range=[0, 1.05], title_text="probability", row=1, col=2)
    figure.update_yaxes(title_text="probability", range=[0, tallest * 1.35], row=1, col=1)
    # The legend at the figure's foot (container-referenced): at paper y = -0.15 it sat on the rotated
    # token labels, which Plotly's automargin places below the axis; from the foot, the margin holds both.
    figure.update_layout(barmode="group", height=480, margin={"t": 40, "b": 40, "l": 50, "r": 10},
                         legend=LEGEND_AT_FOOT, xaxis_type="category")
    return below_toolbar(figure)


def seed_runs_html(rows: list[dict[str, object]]) -> str:
    """Compare's runs at one seed (one dict a run, its keys the headers) as an HTML table that fits
    the width it is given, every row shown (no inner scroll bar): headers and cells escaped, as a
    rule's label and a run's text come from a database that may be someone else's; a cell that
    reads as a number is right-aligned. "" for no rows."""
    if not rows:
        return ""
    names = list(rows[0])
    header = "".join(f"<th>{html_text(name)}</th>" for name in names)

    def cell(value: object) -> str:
        text = "–" if value is None else str(value)
        number = text.replace(".", "", 1).lstrip("-").isdigit()
        return f'<td class="number">{html_text(text)}</td>' if number else f"<td>{html_text(text)}</td>"

    body = "".join("<tr>" + "".join(cell(row.get(name)) for name in names) + "</tr>" for row in rows)
    return f'<style>{SEED_RUNS_CSS}</style><div class="seed-runs-frame"><table class="seed-runs"><tr>{header}</tr>{body}</table></div>'
