"""Every figure of the project, built with Plotly, shared by the pages and the HTML report.

Token text is untrusted: every label passes through ``safe_label`` (HTML-escaped, control
characters made visible) before it reaches a figure, because Plotly renders a subset of HTML
in labels and hover text.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
import torch

from diagnostics.draft_path import DraftPath
from diagnostics.explain import StepView
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
RULE_COLORS = ["#d62728", "#9467bd", "#1f77b4", "#2ca02c", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def safe_label(text: str, limit: int = 40) -> str:
    """Token text made safe for a chart: control characters shown as escapes, HTML escaped, cut to ``limit``."""
    return html.escape(visible(text, limit=limit), quote=True)


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


def _category_labels(view: StepView, tokens: list[int]) -> list[str]:
    labels = [safe_label(view.labels[index]) for index in tokens]
    # Plotly needs distinct category names; prefix ids only when labels collide.
    if len(set(labels)) != len(labels):
        labels = [f"{index}:{label}" for index, label in zip(tokens, labels)]
    return labels


def _mark_tokens(figure: go.Figure, labels: list[str], tokens: list[int], marks: list[tuple[int | None, str, str, str]],
                 height: float, **where: int) -> None:
    """Labelled markers above the bars of chosen tokens: ``(token, text, symbol, colour)``; two
    marks on one token stack."""
    level = 0
    for token, text, symbol, color in marks:
        if token is None or int(token) not in tokens:
            continue
        column = tokens.index(int(token))
        # One height per mark, so labels on neighbouring tokens never overlap.
        figure.add_scatter(x=[labels[column]], y=[height * (1.06 + 0.09 * level)], mode="markers+text", name=text,
                           text=[text], textposition="middle right", showlegend=False, cliponaxis=False,
                           marker={"symbol": symbol, "size": 13, "color": color},
                           hovertemplate=f"%{{x}}: {text}<extra></extra>", **where)
        level += 1


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
    labels = _category_labels(view, tokens)
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
    top = max([*p_values, *q_values, *values(view.induced), *(values(view.fallback) if show_fallback else [])], default=1.0) or 1.0
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
    _mark_tokens(figure, labels, tokens, [
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
        title=f"{html.escape(view.spec)}: target, draft, induced law and matched baseline (tokens by p)",
        xaxis_title="token",
        xaxis_type="category",  # tokens such as "1" and "2" must not become numbers on a linear axis
        yaxis_title="probability",
        yaxis_range=[-0.07 * top, top * 1.3],
        # A legend beside the plot never covers a bar (below it, it hid the fallback law).
        legend={"orientation": "v", "x": 1.01, "y": 1.0},
        margin={"t": 50, "b": 40, "l": 50, "r": 10},
        height=450,
    )
    return figure


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
    labels = _category_labels(first_view, tokens)
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
        spec = html.escape(view.spec)
        if record["kind"] == "rejected":
            fallback = values(view.fallback)
            tallest = max(tallest, *fallback)
            figure.add_bar(name=f"fallback law of {spec}", x=labels, y=fallback, marker_color=color, opacity=0.75, row=1, col=1,
                           hovertemplate=f"%{{x}}<br>{spec} fallback = %{{y:.4f}}<extra></extra>")
        marks.append((int(record["token"]), f"{spec} emits", "star", color))
    _mark_tokens(figure, labels, tokens, marks, tallest, row=1, col=1)
    coin = steps[0][1].get("u_accept")
    specs = [html.escape(view.spec) for view, _ in steps]
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
    figure.update_layout(barmode="group", height=440, margin={"t": 40, "b": 40, "l": 50, "r": 10},
                         legend={"orientation": "h", "y": -0.15}, xaxis_type="category")
    return figure


def draft_path_figure(sweep: DraftPath, against: str = "baseline") -> go.Figure:
    """Distortion of every rule as ``q`` moves to ``p``; tree rules dashed, truncation limits dotted.

    ``against="baseline"`` plots ``TV(P_t, baseline)`` with the limit ``p(Aᶜ)²`` for truncation
    rules; ``against="target"`` plots ``TV(P_t, p)`` with the limit ``p(A)·p(Aᶜ)``.
    """
    if against not in ("baseline", "target"):
        raise ValueError("against must be 'baseline' or 'target'")
    figure = go.Figure()
    colors: dict[str, str] = {}
    for curve in sweep.curves:
        color = colors.setdefault(curve.spec, RULE_COLORS[len(colors) % len(RULE_COLORS)])
        values = curve.tv_baseline if against == "baseline" else curve.tv_target
        figure.add_scatter(
            name=html.escape(curve.label),
            x=curve.t,
            y=values,
            mode="lines",
            line={"color": color, "dash": "dash" if curve.tree else "solid", "width": 2},
            customdata=curve.acceptance,
            hovertemplate=f"{html.escape(curve.label)}<br>t = %{{x:.3f}}<br>TV = %{{y:.4f}}"
            "<br>acceptance = %{customdata:.3f}<extra></extra>",
        )
        limit = curve.limit_baseline if against == "baseline" else curve.limit_target
        if limit is not None:
            name = "p(Aᶜ)²" if against == "baseline" else "p(A)·p(Aᶜ)"
            figure.add_scatter(
                name=f"limit {name}, {html.escape(curve.spec)}",
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
        legend={"orientation": "v"},
        margin={"t": 50, "b": 40, "l": 50, "r": 10},
        height=450,
    )
    return figure


KIND_STYLE = {
    "accepted": ("#d4f4dd", "#1a7f37", "accepted draft"),
    "rejected": ("#ffe1dc", "#cf222e", "rejected → fallback"),
    "bonus": ("#dbeafe", "#0550ae", "bonus"),
}


def _fmt(value: object, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def token_strip_html(records: list[dict], selected: int | None = None, divergence: int | None = None) -> str:
    """Emitted tokens as coloured spans (accepted / rejected → fallback / bonus), every text escaped.

    Each span's tooltip gives ``p(x)``, ``q(x)``, ``a(x)``, the coin ``u`` and the decision; the
    selected position is outlined and the first divergence marked with a red bar. Styles are
    classes defined once, so a 2,000-token strip stays small.
    """
    spans = []
    for record in records:
        kind = record["kind"]
        label = KIND_STYLE.get(kind, ("", "", kind))[2]
        position = int(record["position"])
        text = record.get("token_text")
        shown = safe_label(text if text is not None else f"⟨{record['token']}⟩", limit=60).replace("\\n", "↵")
        tip_lines = [f"position {position}, block {record.get('block')}: {label}",
                     f"emitted {record['token']}: p = {_fmt(record.get('p_token'))}"]
        if record.get("draft_token") is not None and kind != "bonus":
            draft_text = record.get("draft_text")
            tip_lines += [
                f"draft {record['draft_token']} {draft_text!r}" if draft_text is not None else f"draft {record['draft_token']}",
                f"p(x) = {_fmt(record.get('p_draft'))}, q(x) = {_fmt(record.get('q_draft'))}, a(x) = {_fmt(record.get('accept_prob'))}",
                f"coin u = {_fmt(record.get('u_accept'))} → {'accept' if kind == 'accepted' else 'reject'}",
            ]
        classes = f"tok tok-{html.escape(kind)}" + (" tok-selected" if selected == position else "") + (" tok-diverge" if divergence == position else "")
        tip = html.escape("\n".join(tip_lines), quote=True)
        spans.append(f'<span class="{classes}" data-position="{position}" title="{tip}">{shown}</span>')
    style = "".join(
        f".tok-{kind}{{background:{background};border-bottom:2px solid {border};}}" for kind, (background, border, _) in KIND_STYLE.items()
    )
    legend = " ".join(f'<span class="tok tok-{kind}">{name}</span>' for kind, (_, _, name) in KIND_STYLE.items())
    return (
        "<style>.tok{display:inline-block;margin:1px;padding:0 2px;border-radius:3px;white-space:pre-wrap;font-family:monospace;}"
        f"{style}.tok-selected{{outline:2px solid #111;}}.tok-diverge{{border-left:3px solid #cf222e;padding-left:2px;}}</style>"
        f'<div class="token-strip" style="line-height:1.9;">{"".join(spans)}</div>'
        f'<div style="font-size:0.8em;margin-top:4px;">{legend}</div>'
    )


def _vertical(x: float, color: str, width: int, dash: str) -> dict:
    return {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1, "layer": "below",
            "line": {"color": color, "width": width, "dash": dash}}


def tracks_figure(positions: "object", selected: int | None = None, divergence: int | None = None) -> go.Figure:
    """Per-position tracks of a run: acceptance ``a(x)`` and ``α``, ``TV(p, q)``, ``H(p)``, the
    target log-likelihood ``log p(y_t)`` of each emitted token, and the distortion of the emitted
    law (``TV(P, p)``, ``TV(P, baseline)``, ``KL(P ‖ p)``).

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
    hover = [safe_label(str(text)) for text in frame["token_text"].fillna("").tolist()]
    traces = [
        (1, "a(x)", series("accept_prob"), "#1a7f37", "markers"),
        (1, "α", series("alpha"), "#8250df", "lines"),
        (2, "TV(p, q)", series("tv_pq"), "#bc4c00", "lines"),
        (3, "H(p)", series("entropy_p"), "#0550ae", "lines"),
        (4, "log p(y)", log_p, "#6e7781", "lines"),  # no markers: 2,000 SVG points cost the browser
        (5, "TV(P, p)", series("tv_target"), "#cf222e", "lines"),
        (5, "TV(P, baseline)", series("tv_baseline"), "#57606a", "lines"),
        (5, "KL(P ‖ p)", series("kl_target"), "#bf8700", "lines"),
    ]
    for index, (row, name, values, color, mode) in enumerate(traces):
        # The token text rides on the first trace only; "x unified" hover shows it for all.
        extra = {"customdata": hover, "hovertemplate": f"position %{{x}} %{{customdata}}<br>{name} = %{{y:.4f}}<extra></extra>"} \
            if index == 0 else {"hovertemplate": f"{name} = %{{y:.4f}}<extra></extra>"}
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
        # One label above the first track (a vline's own annotation repeats on every subplot).
        figure.add_annotation(x=divergence, y=1.0, xref="x", yref="paper", yanchor="bottom", showarrow=False,
                              text="first divergence", font={"color": "#cf222e"})
    figure.update_layout(shapes=shapes)
    figure.update_layout(height=740, margin={"t": 40, "b": 30, "l": 50, "r": 10}, legend={"orientation": "h", "y": -0.1},
                         clickmode="event+select", hovermode="x unified")
    figure.update_xaxes(title_text="position", row=5, col=1)
    return figure


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
        figure.update_layout(title=f"Output law vs {html.escape(evidence['reference'])}: observed TV per (p, q) pair "
                                   "(red: Holm-adjusted p below the level)",
                             yaxis_title="TV (tested cells)", height=380, margin={"t": 50, "b": 40, "l": 50, "r": 10})
        return figure
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
        return figure
    return None


# -- token trees -----------------------------------------------------------------------------------


def tree_candidates_figure(view: "object", top_n: int = 20, emitted_token: int | None = None) -> go.Figure:
    """At a tree node: the law before each try (``r_1 = p``, ``r_j`` after refusing ``c_{j−1}``), the
    law drawn from when every candidate is refused, and the exact emitted law ``P`` (diamonds).
    Each candidate is marked with its ``a_j``, its coin and what happened."""
    p_target = view.p_target
    vocab = p_target.numel()
    must = [candidate["index"] for candidate in view.candidates] + ([emitted_token] if emitted_token is not None else [])
    if vocab <= top_n:
        tokens = list(range(vocab))
    else:
        score = torch.stack([p_target, view.law]).amax(0)
        tokens = torch.topk(score, top_n).indices.tolist()
        tokens += [int(token) for token in must if token is not None and int(token) not in tokens]
    # The candidates first, in the order they were tried, then the rest by p.
    tried = list(dict.fromkeys(int(candidate["index"]) for candidate in view.candidates))
    tokens = tried + sorted(set(tokens) - set(tried), key=lambda token: (-float(p_target[token]), token))
    # A space is drawn as ␣: " In" and "In" are different tokens, and a draft often proposes the other.
    labels = [safe_label(view.labels[index]).replace(" ", "␣") for index in tokens]
    if len(set(labels)) != len(labels):
        labels = [f"{index}:{label}" for index, label in zip(tokens, labels)]
    figure = go.Figure()
    shades = ["#1f77b4", "#6baed6", "#9ecae1", "#c6dbef", "#deebf7"]
    count = len(view.candidates)
    for step, law in enumerate(view.laws):
        if step < count:
            candidate = view.candidates[step]
            name = "r₁ = p" if step == 0 else f"r{step + 1}: after refusing {safe_label(view.candidates[step - 1]['label'], 16).replace(' ', '␣')}"
        else:
            name = "fallback law (every candidate refused)"
        color = COLORS["fallback"] if step == count else shades[min(step, len(shades) - 1)]
        figure.add_bar(x=labels, y=[float(law[token]) for token in tokens], name=name, marker_color=color,
                       hovertemplate="%{x}: %{y:.4f}<extra>" + name + "</extra>")
    figure.add_scatter(x=labels, y=[float(view.law[token]) for token in tokens], mode="markers", name="P (emitted law)",
                       marker={"symbol": "diamond", "size": 11, "color": COLORS["induced"], "line": {"width": 1, "color": "#000"}},
                       hovertemplate="%{x}: P = %{y:.4f}<extra></extra>")
    height = max(float(p_target[tokens].max()), float(view.law[tokens].max()), 1e-9)
    marks = []
    for order, candidate in enumerate(view.candidates, start=1):
        marks.append((candidate["index"], f"c{order} {candidate['decision']}, a={candidate['accept_prob']:.2f}",
                      "triangle-down", "#2ca02c" if candidate["decision"] == "accepted" else "#d62728"
                      if candidate["decision"] == "refused" else "#7f7f7f"))
    if emitted_token is not None:
        marks.append((emitted_token, "emitted", "star", "#000000"))
    _mark_tokens(figure, labels, tokens, marks, height)
    figure.update_layout(barmode="group", height=420, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                         title="Candidates (left, in the order tried) and the law after each refusal; then the likeliest tokens",
                         legend={"orientation": "v", "x": 1.02, "y": 1}, yaxis_title="probability", xaxis_type="category")
    return figure


def _tree_layout(parents: list[int]) -> list[float]:
    """A vertical slot per node: leaves in depth-first order, a parent centred on its children."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    slots = [0.0] * len(parents)
    counter = [0]

    def place(node: int) -> float:
        kids = children.get(node, [])
        if not kids:
            counter[0] += 1
            value = float(counter[0])
        else:
            value = sum(place(kid) for kid in kids) / len(kids)
        if node >= 0:
            slots[node] = value
        return value

    root = place(-1)
    return [root] + slots


def tree_round_figure(nodes: "object", selected_node: int | None = None, decode=None) -> go.Figure:
    """One round's drafted tree (``decode``: token id → text, else the stored texts): nodes by depth
    (the root, the last committed token, at depth 0), edges to their parents, the accepted path in green, refused nodes red, untried grey; hover
    gives ``p`` and ``q`` of the token, ``a``, the coin and the probability the walk accepts it."""
    rows = nodes.sort_values("node").to_dict("records")
    if decode is not None:  # the page's decoder keeps a token's leading space; stored texts may not
        rows = [{**row, "token_text": decode(int(row["token"]))} for row in rows]
    parents = [int(row["parent"]) for row in rows]
    slots = _tree_layout(parents)
    y_root, y_nodes = slots[0], slots[1:]
    figure = go.Figure()
    edge_x: list[float | None] = []
    edge_y: list[float | None] = []
    for row, y_value in zip(rows, y_nodes):
        parent = int(row["parent"])
        edge_x += [int(row["depth"]) - 1, int(row["depth"]), None]
        edge_y += [y_root if parent < 0 else y_nodes[parent], y_value, None]
    figure.add_scatter(x=edge_x, y=edge_y, mode="lines", line={"color": "#bbbbbb", "width": 1}, hoverinfo="skip", showlegend=False)
    figure.add_scatter(x=[0], y=[y_root], mode="markers+text", text=["root"], textposition="middle left", showlegend=False,
                       marker={"size": 14, "color": "#444444", "symbol": "square"}, hovertemplate="the last committed token<extra></extra>")
    colors = {"accepted": "#2ca02c", "refused": "#d62728", "untried": "#bbbbbb"}
    for decision, color in colors.items():
        chosen = [(row, y_value) for row, y_value in zip(rows, y_nodes) if row["decision"] == decision]
        if not chosen:
            continue

        def hover(row: dict) -> str:
            coin = row.get("u_accept")
            coin_text = "–" if coin is None or coin != coin else f"{coin:.3f}"
            q_value = row.get("q_token")
            q_text = "–" if q_value is None or q_value != q_value else f"{q_value:.4f}"
            return (f"{safe_label(row.get('token_text') or str(row['token']))} (node {int(row['node'])}, try {int(row['sibling']) + 1})"
                    f"<br>p = {row['p_token']:.4f}, q = {q_text}<br>r at its try = {row['residual']:.4f}, a = {row['accept_prob']:.4f}"
                    f"<br>coin u = {coin_text}: {decision}<br>P(walk accepts it) = {row['reach']:.4f}")

        sizes = [18 if selected_node is not None and int(row["node"]) == selected_node else 12 for row, _ in chosen]
        figure.add_scatter(
            x=[int(row["depth"]) for row, _ in chosen], y=[y_value for _, y_value in chosen], mode="markers+text", name=decision,
            text=[safe_label(row.get("token_text") or str(row["token"]), 12).replace(" ", "␣") for row, _ in chosen],
            textposition="middle right",
            marker={"size": sizes, "color": color, "line": {"width": 1, "color": "#333333"}},
            hovertext=[hover(row) for row, _ in chosen], hoverinfo="text",
        )
    depth = max([int(row["depth"]) for row in rows] or [1])
    # The legend sits at the top right: below the axis it covered the depth-0 tick.
    figure.update_layout(height=max(260, 26 * max(len(rows), 4)), margin={"l": 10, "r": 10, "t": 40, "b": 10},
                         title="This round's tree: accepted path green, refused red, untried grey",
                         xaxis={"title": "depth", "dtick": 1, "range": [-0.5, depth + 0.9]},
                         yaxis={"visible": False},
                         legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"})
    return figure


# -- sweeps ----------------------------------------------------------------------------------------


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
        y = [summary.figures[against] for summary in chosen]
        names = [safe_label(summary.label, 60) for summary in chosen]
        symbol, color = styles[role]
        figure.add_scatter(
            x=[value[0] for value in x], y=[value[0] for value in y], mode="markers+text" if role == "rule" else "markers", name=role,
            text=names, textposition="top center", marker={"symbol": symbol, "size": 11, "color": color},
            error_x={"type": "data", "symmetric": False, "array": [value[2] - value[0] for value in x],
                     "arrayminus": [value[0] - value[1] for value in x], "thickness": 1},
            error_y={"type": "data", "symmetric": False, "array": [value[2] - value[0] for value in y],
                     "arrayminus": [value[0] - value[1] for value in y], "thickness": 1},
            hovertext=[f"{name}<br>speed-up {sx[0]:.3f} [{sx[1]:.3f}, {sx[2]:.3f}]<br>{html.escape(against)} {sy[0]:.4f} "
                       f"[{sy[1]:.4f}, {sy[2]:.4f}]" for name, sx, sy in zip(names, x, y)],
            hoverinfo="text",
        )
    figure.update_layout(height=460, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                         title=f"Modelled speed-up against {html.escape(against)} (95% intervals over prompts and seeds)",
                         xaxis_title="modelled speed-up over plain decoding", yaxis_title=html.escape(against),
                         legend={"orientation": "h", "y": -0.15})
    return figure
