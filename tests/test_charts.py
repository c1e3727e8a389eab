"""Figures carry what the pages promise: limits, shading, escaped labels."""

from __future__ import annotations

import torch
from conftest import dirichlet

from diagnostics.charts import law_figure, safe_label, sweep_figure
from diagnostics.explain import explain_step, rule_table
from diagnostics.rules import get_rule
from diagnostics.sweep import distortion_sweep
from diagnostics.synthetic import make_pair


def _curve(sweep, label):
    return next(curve for curve in sweep.curves if curve.label == label)


def test_sweep_shows_the_papers_limits() -> None:
    """Truncation levels at p(Aᶜ)²; lenience → 0 single-draft, not in the tree."""
    generator = torch.Generator().manual_seed(2)
    p, q = dirichlet(16, 0.6, generator), dirichlet(16, 0.6, generator)
    sweep = distortion_sweep(p, q, steps=21, tree_k=1)
    for spec in ("cascade:0.5", "typical:0.1"):
        curve = _curve(sweep, spec)
        outside = p[~get_rule(spec).allowed_set(p)].sum().item()
        assert abs(curve.tv_baseline[-1] - outside**2) < 1e-12 and curve.limit_baseline == outside**2
    assert _curve(sweep, "lenience:0.5").tv_target[-1] < 1e-12
    tree = _curve(sweep, "lenience:0.5 (top-1)".join(["tree ", ""]))
    assert abs(tree.tv_target[-1] - (min(1, p.max().item() / 0.5) - p.max().item())) < 1e-12
    figure = sweep_figure(sweep, "baseline").to_plotly_json()
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
    # q > p at tokens 0 and 1; token 0 is severe (0.55 ≥ 0.05/0.5).
    assert [(s["x0"], s["fillcolor"]) for s in shapes] == [(-0.5, "rgba(214, 39, 40, 0.22)"), (0.5, "rgba(255, 127, 14, 0.12)")]
    ceiling = next(t for t in figure["data"] if t["name"] == "ceiling p/l")
    assert list(ceiling["y"]) == [0.1, 0.3, 0.5, 1.1]


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
