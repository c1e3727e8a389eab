"""Token-tree figures (Inspect and Compare at a tree position): a node's candidates, a round's tree."""

from __future__ import annotations

import plotly.graph_objects as go
import torch

from diagnostics.charts.common import COLORS, below_toolbar, mark_tokens, token_label


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
    labels = [token_label(view.labels[index]) for index in tokens]
    if len(set(labels)) != len(labels):
        labels = [f"{index}:{label}" for index, label in zip(tokens, labels)]
    figure = go.Figure()
    shades = ["#1f77b4", "#6baed6", "#9ecae1", "#c6dbef", "#deebf7"]
    count = len(view.candidates)
    for step, law in enumerate(view.laws):
        if step < count:
            candidate = view.candidates[step]
            name = "r₁ = p" if step == 0 else f"r{step + 1}: after refusing {token_label(view.candidates[step - 1]['label'], 16)}"
        else:
            name = "fallback law (every candidate refused)"
        color = COLORS["fallback"] if step == count else shades[min(step, len(shades) - 1)]
        figure.add_bar(x=labels, y=[float(law[token]) for token in tokens], name=name, marker_color=color,
                       hovertemplate="%{x}: %{y:.4f}<extra>" + name + "</extra>")
    figure.add_scatter(x=labels, y=[float(view.law[token]) for token in tokens], mode="markers", name="P (emitted law)",
                       marker={"symbol": "diamond", "size": 11, "color": COLORS["induced"], "line": {"width": 1, "color": "#000"}},
                       hovertemplate="%{x}: P = %{y:.4f}<extra></extra>")
    # Marks sit above the tallest bar of any law (a law after refusals can outgrow p).
    height = max([float(law[tokens].max()) for law in [p_target, view.law, *view.laws]] + [1e-9])
    marks = []
    for order, candidate in enumerate(view.candidates, start=1):
        marks.append((candidate["index"], f"c{order} {candidate['decision']}, a={candidate['accept_prob']:.2f}",
                      "triangle-down", "#2ca02c" if candidate["decision"] == "accepted" else "#d62728"
                      if candidate["decision"] == "refused" else "#7f7f7f"))
    if emitted_token is not None:
        marks.append((emitted_token, "emitted", "star", "#000000"))
    mark_tokens(figure, labels, tokens, marks, height)
    figure.update_layout(barmode="group", height=420, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                         title="Candidates in the order tried, the law after each refusal, then the likeliest tokens",
                         legend={"orientation": "v", "x": 1.02, "y": 1}, yaxis_title="probability", xaxis_type="category")
    return below_toolbar(figure)


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
            return (f"{token_label(row.get('token_text') or str(row['token']))} (node {int(row['node'])}, try {int(row['sibling']) + 1})"
                    f"<br>p = {row['p_token']:.4f}, q = {q_text}<br>r at its try = {row['residual']:.4f}, a = {row['accept_prob']:.4f}"
                    f"<br>coin u = {coin_text}: {decision}<br>P(walk accepts it) = {row['reach']:.4f}")

        sizes = [18 if selected_node is not None and int(row["node"]) == selected_node else 12 for row, _ in chosen]
        figure.add_scatter(
            x=[int(row["depth"]) for row, _ in chosen], y=[y_value for _, y_value in chosen], mode="markers+text", name=decision,
            text=[token_label(row.get("token_text") or str(row["token"]), 12) for row, _ in chosen],
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
    return below_toolbar(figure)

