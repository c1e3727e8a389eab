"""Every figure of the project, built with Plotly, shared by the pages and the HTML report.

Token text is untrusted: every label passes through ``safe_label`` (HTML-escaped, control
characters made visible) before it reaches a figure, because Plotly renders a subset of HTML
in labels and hover text.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
import torch

from diagnostics.explain import StepView
from diagnostics.sweep import Sweep
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


def _top_tokens(view: StepView, top_n: int) -> list[int]:
    """Tokens worth showing: all when the vocabulary is small, else the top ``top_n`` by ``max(p, q, P)``."""
    vocab = view.p_target.numel()
    if vocab <= top_n:
        return list(range(vocab))
    score = torch.stack([view.p_target, view.q_draft, view.induced]).amax(0)
    return torch.topk(score, top_n).indices.sort().values.tolist()


def law_figure(view: StepView, top_n: int = 30, show_fallback: bool = False) -> go.Figure:
    """Bars of ``p``, ``q``, the induced law ``P`` and the matched baseline over the top tokens.

    Background shading marks the overshoot region ``q > p`` (orange) and the severe overshoot
    ``q ≥ p/l`` (red); dashes mark the ceiling ``p/l``; triangles mark the allowed set ``A``.
    """
    tokens = _top_tokens(view, top_n)
    labels = [safe_label(view.labels[index]) for index in tokens]
    # Plotly needs distinct category names; prefix ids only when labels collide.
    if len(set(labels)) != len(labels):
        labels = [f"{index}:{label}" for index, label in zip(tokens, labels)]

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
    for position, (p_v, q_v) in enumerate(zip(p_values, q_values)):
        if ceiling is not None and q_v > 0 and q_v >= ceiling[position]:
            fill = COLORS["severe"]
        elif q_v > p_v:
            fill = COLORS["overshoot"]
        else:
            continue
        figure.add_vrect(x0=position - 0.5, x1=position + 0.5, fillcolor=fill, line_width=0, layer="below")
    if ceiling is not None:
        figure.add_scatter(
            name="ceiling p/l",
            x=labels,
            y=ceiling,
            mode="markers",
            marker={"symbol": "line-ew-open", "size": 26, "color": COLORS["ceiling"], "line": {"width": 2}},
            hovertemplate="%{x}<br>p/l = %{y:.4f}<extra></extra>",
        )
    if view.allowed is not None:
        allowed = [labels[i] for i, index in enumerate(tokens) if bool(view.allowed[index])]
        figure.add_scatter(
            name="allowed set A",
            x=allowed,
            y=[0.0] * len(allowed),
            mode="markers",
            marker={"symbol": "triangle-up", "size": 11, "color": COLORS["allowed"]},
            hovertemplate="%{x} is in A<extra></extra>",
        )
    # Legend-only entries explain the shading.
    figure.add_scatter(name="overshoot q > p", x=[None], y=[None], mode="markers",
                       marker={"symbol": "square", "size": 12, "color": "rgba(255,127,14,0.35)"})
    if ceiling is not None:
        figure.add_scatter(name="severe q ≥ p/l", x=[None], y=[None], mode="markers",
                           marker={"symbol": "square", "size": 12, "color": "rgba(214,39,40,0.45)"})
    figure.update_layout(
        barmode="group",
        title=f"{html.escape(view.spec)}: target, draft, induced law and matched baseline",
        xaxis_title="token",
        yaxis_title="probability",
        legend={"orientation": "h", "y": -0.25},
        margin={"t": 50, "b": 40, "l": 50, "r": 10},
        height=430,
    )
    return figure


def sweep_figure(sweep: Sweep, against: str = "baseline") -> go.Figure:
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
        "<style>.tok{margin:1px;padding:0 2px;border-radius:3px;white-space:pre-wrap;font-family:monospace;}"
        f"{style}.tok-selected{{outline:2px solid #111;}}.tok-diverge{{border-left:3px solid #cf222e;padding-left:2px;}}</style>"
        f'<div class="token-strip" style="line-height:1.9;">{"".join(spans)}</div>'
        f'<div style="font-size:0.8em;margin-top:4px;">{legend}</div>'
    )


def tracks_figure(positions: "object", selected: int | None = None, divergence: int | None = None) -> go.Figure:
    """Per-position tracks of a run: acceptance ``a(x)`` and ``α``, ``TV(p, q)``, ``H(p)``, distortion.

    Vertical dotted lines mark block starts; the selected position and the first divergence are
    marked. ``positions`` is the store's DataFrame of one run.
    """
    from plotly.subplots import make_subplots

    frame = positions
    x = frame["position"].tolist()
    figure = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                           subplot_titles=("acceptance: a(x) of the draft, α = Σ q·a", "TV(p, q)",
                                           "entropy H(p)", "distortion of the emitted law"))

    def series(name: str) -> list[float | None]:
        return [None if value != value else float(value) for value in frame[name].astype("float64").tolist()]

    hover = [safe_label(str(text)) for text in frame["token_text"].fillna("").tolist()]
    traces = [
        (1, "a(x)", "accept_prob", "#1a7f37", "markers"),
        (1, "α", "alpha", "#8250df", "lines"),
        (2, "TV(p, q)", "tv_pq", "#bc4c00", "lines"),
        (3, "H(p)", "entropy_p", "#0550ae", "lines"),
        (4, "TV(P, p)", "tv_target", "#cf222e", "lines"),
        (4, "TV(P, baseline)", "tv_baseline", "#57606a", "lines"),
    ]
    for index, (row, name, column, color, mode) in enumerate(traces):
        # The token text rides on the first trace only; "x unified" hover shows it for all.
        extra = {"customdata": hover, "hovertemplate": f"position %{{x}} %{{customdata}}<br>{name} = %{{y:.4f}}<extra></extra>"} \
            if index == 0 else {"hovertemplate": f"{name} = %{{y:.4f}}<extra></extra>"}
        figure.add_scatter(row=row, col=1, x=x, y=series(column), name=name, mode=mode,
                           line={"color": color, "width": 1.5}, marker={"color": color, "size": 5}, **extra)
    starts = frame.loc[frame["index_in_block"] == 0, "position"].tolist()
    if len(starts) <= 400:  # beyond that the lines are a grey wash; the hover still tells the block
        for start in starts:
            figure.add_vline(x=start - 0.5, line={"color": "#d0d7de", "width": 1, "dash": "dot"})
    if selected is not None:
        figure.add_vline(x=selected, line={"color": "#111", "width": 2})
    if divergence is not None:
        figure.add_vline(x=divergence, line={"color": "#cf222e", "width": 2, "dash": "dash"},
                         annotation_text="first divergence", annotation_position="top")
    figure.update_layout(height=620, margin={"t": 40, "b": 30, "l": 50, "r": 10}, legend={"orientation": "h", "y": -0.08},
                         clickmode="event+select", hovermode="x unified")
    figure.update_xaxes(title_text="position", row=4, col=1)
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
    if layer == "engine":
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
        figure.update_layout(title="Randomized PIT of every emitted token under the teacher-forced target law "
                                   "(flat when the generator samples p)",
                             xaxis_title="PIT value u = F(y − 1) + V·p(y)", yaxis_title="tokens", height=380,
                             margin={"t": 50, "b": 40, "l": 50, "r": 10}, bargap=0.05)
        return figure
    return None
