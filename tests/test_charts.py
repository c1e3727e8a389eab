"""Figures carry what the pages promise: limits, shading, escaped labels."""

from __future__ import annotations

import torch
from conftest import dirichlet

from diagnostics.charts import draft_path_figure, law_figure, safe_label
from diagnostics.draft_path import distortion_path
from diagnostics.explain import explain_step, rule_table
from diagnostics.rules import get_rule
from diagnostics.synthetic import make_pair


def _curve(sweep, label):
    return next(curve for curve in sweep.curves if curve.label == label)


def test_sweep_shows_the_papers_limits() -> None:
    """Truncation levels at p(Aᶜ)²; lenience → 0 single-draft, not in the tree."""
    generator = torch.Generator().manual_seed(2)
    p, q = dirichlet(16, 0.6, generator), dirichlet(16, 0.6, generator)
    sweep = distortion_path(p, q, steps=21, tree_k=1)
    for spec in ("cascade:0.5", "typical:0.1"):
        curve = _curve(sweep, spec)
        outside = p[~get_rule(spec).allowed_set(p)].sum().item()
        assert abs(curve.tv_baseline[-1] - outside**2) < 1e-12 and curve.limit_baseline == outside**2
    assert _curve(sweep, "lenience:0.5").tv_target[-1] < 1e-12
    tree = _curve(sweep, "lenience:0.5 (top-1)".join(["tree ", ""]))
    assert abs(tree.tv_target[-1] - (min(1, p.max().item() / 0.5) - p.max().item())) < 1e-12
    figure = draft_path_figure(sweep, "baseline").to_plotly_json()
    dotted = [trace for trace in figure["data"] if trace["line"]["dash"] == "dot"]
    assert len(dotted) == 2 and {round(t["y"][0], 12) for t in dotted} == {
        round(c.limit_baseline, 12) for c in sweep.curves if c.limit_baseline is not None
    }
    assert any(trace["line"]["dash"] == "dash" for trace in figure["data"])


def test_law_figure_shades_overshoot_and_marks_the_ceiling() -> None:
    pair = make_pair("toy")
    view = explain_step(get_rule("lenience:0.5"), pair.p_target, pair.q_draft, pair.labels)
    figure = law_figure(view).to_plotly_json()
    shapes = figure["layout"]["shapes"]
    # Tokens ordered by p: 3, 2, 1, 0. q > p at tokens 1 and 0; token 0 is severe (0.55 ≥ 0.05/0.5).
    assert list(figure["data"][0]["x"]) == [pair.labels[index] for index in (3, 2, 1, 0)]
    assert [(s["x0"], s["fillcolor"]) for s in shapes] == [(1.5, "rgba(255, 127, 14, 0.12)"), (2.5, "rgba(214, 39, 40, 0.22)")]
    ceiling = next(t for t in figure["data"] if t["name"] == "ceiling p/l")
    assert list(ceiling["customdata"]) == [1.1, 0.5, 0.3, 0.1]
    assert max(ceiling["y"]) < 0.6  # p/l = 1.1 is clipped at the chart's top, its value kept for the hover


def test_labels_are_escaped() -> None:
    pair = make_pair("toy")
    labels = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "a\nb", "ok"]
    view = explain_step(get_rule("cascade:0.5"), pair.p_target, pair.q_draft, labels)
    text = law_figure(view).to_json()
    assert "<script>" not in text and "<img" not in text
    assert safe_label("<b>") == "&lt;b&gt;" and safe_label("a\nb") == "a\\nb"


def test_large_vocabulary_shows_the_top_tokens() -> None:
    generator = torch.Generator().manual_seed(1)
    p, q = dirichlet(49152, 0.05, generator), dirichlet(49152, 0.05, generator)
    view = explain_step(get_rule("typical:0.1"), p, q)
    figure = law_figure(view, top_n=25).to_plotly_json()
    assert len(figure["data"][0]["x"]) == 25


def test_rule_table_rows() -> None:
    pair = make_pair("toy")
    rows = rule_table(pair.p_target, pair.q_draft, ("lossless", "lenience:0.5"), ("lossless",), 1)
    assert [row["rule"] for row in rows] == ["lossless", "lenience:0.5", "lossless"]
    assert rows[0]["TV(P, p)"] < 1e-12 and abs(rows[0]["acceptance α"] - 0.4) < 1e-12
    assert rows[2]["TV(P, p)"] < 1e-12


def _big_view(spec: str = "lenience:0.5"):
    generator = torch.Generator().manual_seed(3)
    p, q = dirichlet(49152, 0.05, generator), dirichlet(49152, 0.05, generator)
    return explain_step(get_rule(spec), p, q)


def test_the_draft_and_emitted_tokens_are_always_shown_and_marked() -> None:
    """An emitted token with p = 0.0007 was missing from the bars: now it is shown and marked,
    tokens are ordered by p, and the fallback law is visible at a rejection."""
    view = _big_view()
    rare = int(torch.argsort(view.p_target)[1000])  # far outside the top 25 of p, q, P
    draft = int(torch.argmax(view.q_draft))
    figure = law_figure(view, top_n=25, draft_token=draft, emitted_token=rare, kind="rejected").to_plotly_json()
    bars = figure["data"][0]
    assert len(bars["x"]) in (26, 27) and safe_label(view.labels[rare]) in bars["x"]
    p_shown = list(bars["y"])
    assert p_shown == sorted(p_shown, reverse=True)
    marks = {trace["text"][0]: trace["x"][0] for trace in figure["data"] if trace.get("mode") == "markers+text"}
    assert marks == {"drafted x": safe_label(view.labels[draft]), "emitted": safe_label(view.labels[rare])}
    fallback = next(trace for trace in figure["data"] if trace["name"] == "fallback f")
    assert fallback["visible"] is True
    accepted = law_figure(view, top_n=25, draft_token=draft, emitted_token=draft, kind="accepted").to_plotly_json()
    assert next(trace for trace in accepted["data"] if trace["name"] == "fallback f")["visible"] == "legendonly"
    assert [trace["text"][0] for trace in accepted["data"] if trace.get("mode") == "markers+text"] == ["drafted x, kept"]


def test_divergence_figure_shows_both_decisions_against_one_coin() -> None:
    from diagnostics.charts import divergence_figure

    pair = make_pair("toy")
    lossless = explain_step(get_rule("lossless"), pair.p_target, pair.q_draft, pair.labels)
    lenient = explain_step(get_rule("lenience:0.5"), pair.p_target, pair.q_draft, pair.labels)
    coin = 0.3
    steps = [(lossless, {"kind": "rejected", "token": 3, "draft_token": 0, "accept_prob": float(lossless.accept[0]), "u_accept": coin}),
             (lenient, {"kind": "accepted", "token": 0, "draft_token": 0, "accept_prob": float(lenient.accept[0]), "u_accept": coin})]
    figure = divergence_figure(pair.p_target, pair.q_draft, steps).to_plotly_json()
    names = [trace["name"] for trace in figure["data"]]
    assert "fallback law of lossless" in names and "fallback law of lenience:0.5" not in names  # only the rule that rejected
    acceptance = next(trace for trace in figure["data"] if trace["name"] == "a(x)")
    assert list(acceptance["y"]) == [steps[0][1]["accept_prob"], steps[1][1]["accept_prob"]]
    assert next(trace for trace in figure["data"] if trace["name"].startswith("coin u"))["y"][0] == coin
    emits = sorted(trace["text"][0] for trace in figure["data"] if trace.get("mode") == "markers+text")
    assert emits == ["drafted x", "lenience:0.5 emits", "lossless emits"]


def test_tracks_add_log_likelihood_and_kl_and_label_the_divergence_once() -> None:
    import pandas as pd

    from diagnostics.charts import tracks_figure

    frame = pd.DataFrame({"position": range(6), "index_in_block": [0, 1, 2, 0, 1, 0], "kind": ["accepted"] * 6,
                          "accept_prob": [0.5] * 6, "alpha": [0.4] * 6, "tv_pq": [0.2] * 6, "entropy_p": [1.0] * 6,
                          "p_token": [0.5, 0.25, 1.0, 0.1, 0.2, 0.3], "tv_target": [0.0] * 6, "tv_baseline": [0.1] * 6,
                          "kl_target": [0.01] * 6, "token_text": ["a"] * 6})
    figure = tracks_figure(frame, selected=2, divergence=3).to_plotly_json()
    names = [trace["name"] for trace in figure["data"]]
    assert "log p(y)" in names and "KL(P ‖ p)" in names
    log_p = next(trace for trace in figure["data"] if trace["name"] == "log p(y)")
    assert abs(log_p["y"][1] - torch.log(torch.tensor(0.25)).item()) < 1e-6
    labels = [a["text"] for a in figure["layout"]["annotations"] if a["text"] == "first divergence"]
    assert labels == ["first divergence"]


def test_tree_figures_escape_token_text_and_mark_the_path() -> None:
    import pandas as pd

    from diagnostics.charts import tree_round_figure

    payload = "<img src=x onerror=alert(1)>"
    nodes = pd.DataFrame([
        {"node": 0, "parent": -1, "depth": 1, "sibling": 0, "token": 5, "token_text": payload, "p_token": 0.2, "q_token": 0.5,
         "residual": 0.2, "accept_prob": 0.2, "u_accept": 0.7, "decision": "refused", "reach": 0.2},
        {"node": 1, "parent": -1, "depth": 1, "sibling": 1, "token": 6, "token_text": "b", "p_token": 0.3, "q_token": 0.3,
         "residual": 0.375, "accept_prob": 0.375, "u_accept": 0.1, "decision": "accepted", "reach": 0.3},
        {"node": 2, "parent": 1, "depth": 2, "sibling": 0, "token": 7, "token_text": "c", "p_token": 0.9, "q_token": float("nan"),
         "residual": 0.9, "accept_prob": 0.9, "u_accept": float("nan"), "decision": "untried", "reach": 0.27},
    ])
    spec = tree_round_figure(nodes, selected_node=1).to_json()
    assert payload not in spec and "&lt;img" in spec
    traces = {trace.name: trace for trace in tree_round_figure(nodes).data if trace.name}
    assert set(traces) == {"accepted", "refused", "untried"} and list(traces["accepted"].x) == [1]


def test_token_axes_stay_categories_when_tokens_look_like_numbers() -> None:
    """Digits are common tokens: a Plotly axis infers "linear" from labels "1", "2", … and then
    draws the bars at those numbers (seen on Inspect: ticks 0–8, no token names). Every token axis
    is a category axis, and a space is drawn as ␣ in the tree too."""
    from types import SimpleNamespace

    import pandas as pd

    from diagnostics.charts import divergence_figure, law_figure, tree_candidates_figure, tree_round_figure

    p_target = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q_draft = torch.tensor([0.1, 0.6, 0.2, 0.1], dtype=torch.float64)
    labels = ["1", "2", "10", " 3"]
    view = explain_step(get_rule("lossless"), p_target, q_draft, labels)
    assert law_figure(view, draft_token=1, emitted_token=0).to_plotly_json()["layout"]["xaxis"]["type"] == "category"
    steps = [(view, {"kind": "rejected", "token": 0, "draft_token": 1, "accept_prob": 0.5, "u_accept": 0.7})]
    assert divergence_figure(p_target, q_draft, steps).to_plotly_json()["layout"]["xaxis"]["type"] == "category"
    nodes = pd.DataFrame([
        {"node": 0, "parent": -1, "depth": 1, "sibling": 0, "token": 1, "token_text": " 3", "p_token": 0.3, "q_token": 0.6,
         "residual": 0.3, "accept_prob": 0.5, "u_accept": 0.7, "decision": "refused", "reach": 0.6},
    ])
    texts = [text for trace in tree_round_figure(nodes).data if trace.name == "refused" for text in trace.text]
    assert texts == ["␣3"]
    node_view = SimpleNamespace(p_target=p_target, law=p_target, laws=[p_target, p_target], labels=labels,
                                candidates=[{"index": 1, "label": "2", "decision": "refused", "accept_prob": 0.5}])
    assert tree_candidates_figure(node_view, emitted_token=0).to_plotly_json()["layout"]["xaxis"]["type"] == "category"
    from diagnostics.metrics import modelled_tree_speedup

    assert modelled_tree_speedup(3.0, 3, 0.5) == 3.0 / 2.5
    assert modelled_tree_speedup(float("nan"), 3, 0.5) == 1.0
