"""Issue 45, rough edges 5 and 9: layouts that keep labels, legends and tables readable.

Everyday tier: figures and HTML built in memory, no browser, about a second in all. What they
guard was measured in headless chromium at 1280 px (the Compare, Sweeps and Inspect pages):
Compare's legend covered five rotated token labels, its runs table was 944 px wide in an 818-px
frame with its scroll bar over the third row, three of four Pareto labels sat on error bars, and
the law chart's plot took 64% of its width beside a vertical legend.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from diagnostics.charts import divergence_figure, law_figure, pareto_figure
from diagnostics.charts.compare import seed_runs_html
from diagnostics.explain import explain_step
from diagnostics.rules import get_rule
from diagnostics.synthetic import make_pair

WORDS = [" interaction", " molecules", " twilight", " the", " a", " moon", " silver", " dark", " shades", " calm", " hues",
         " shadow", " darkness", " shadows", " lunar", " every"]


def _at_the_foot(legend: dict) -> bool:
    """A horizontal legend anchored at the figure's bottom edge (container-referenced): Plotly's
    automargin then keeps the axis's rotated labels and title above it."""
    return (legend.get("orientation") == "h" and legend.get("yref") == "container" and legend.get("y") == 0
            and legend.get("yanchor") == "bottom")


def _views():
    generator = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(len(WORDS), generator=generator) * 2.5, 0)
    q = torch.softmax(torch.randn(len(WORDS), generator=generator) * 2.5, 0)
    return p, q, {spec: explain_step(get_rule(spec), p, q, WORDS) for spec in ("lossless", "lenience:0.5")}


def test_compares_legend_sits_below_the_rotated_token_labels() -> None:
    """Rough edge 5: at paper y = -0.15 the legend lay on the rotated token labels; at the foot,
    with the axis's automargin on, the margin holds both (0 of 14 labels covered, was 5)."""
    p, q, views = _views()
    steps = [(views["lossless"], {"kind": "rejected", "token": 3, "draft_token": 1, "accept_prob": 0.2, "u_accept": 0.3}),
             (views["lenience:0.5"], {"kind": "accepted", "token": 1, "draft_token": 1, "accept_prob": 0.4, "u_accept": 0.3})]
    layout = divergence_figure(p, q, steps).to_plotly_json()["layout"]
    assert _at_the_foot(layout["legend"])
    assert layout["xaxis"].get("automargin", True) is not False  # the template's automargin makes room for the labels
    assert layout["height"] >= 480  # the legend's rows come out of the figure's height, not the plot's


def test_the_law_charts_legend_runs_across_the_foot_so_the_plot_takes_the_width() -> None:
    """Rough edge 9: a vertical legend beside the plot left it 64% of a 607-px column (87% now)."""
    pair = make_pair("toy")
    view = explain_step(get_rule("lenience:0.5"), pair.p_target, pair.q_draft, pair.labels)
    layout = law_figure(view, draft_token=0, emitted_token=0, kind="accepted").to_plotly_json()["layout"]
    assert _at_the_foot(layout["legend"]) and layout["legend"].get("x", 0) <= 0.02
    assert layout["margin"]["r"] <= 20  # no room kept on the right for a legend
    assert layout["height"] >= 500


def _summary(label: str, role: str, speed: tuple[float, float, float], tv: tuple[float, float, float]) -> SimpleNamespace:
    return SimpleNamespace(label=label, role=role, figures={"modelled speed-up": speed, "TV(P, baseline)": tv, "accuracy": tv})


def _label_boxes(figure) -> list[tuple[str, float, float, str]]:
    return [(text, x, y, place) for trace in figure.to_plotly_json()["data"] if trace.get("mode") == "markers+text"
            for text, x, y, place in zip(trace["text"], trace["x"], trace["y"], trace["textposition"])]


def test_pareto_labels_sit_diagonally_off_their_error_bars() -> None:
    """Rough edge 9: "top center" put each label on its own vertical error bar (3 of 4 labels crossed
    a bar in the browser, 0 now). Each label is placed diagonally, where both of its point's bars
    are clear, and two settings at one quality and near speeds go to different places."""
    summaries = [_summary("lossless", "lossless", (0.38, 0.32, 0.49), (0.0, 0.0, 0.0)),
                 _summary("baseline of typical:0.1", "baseline", (0.38, 0.33, 0.46), (0.0, 0.0, 0.0)),
                 _summary("lenience:0.3", "rule", (0.459, 0.38, 0.55), (0.16, 0.09, 0.21)),
                 _summary("lenience:0.6", "rule", (0.41, 0.35, 0.47), (0.08, 0.05, 0.12)),
                 _summary("typical:0.1", "rule", (0.454, 0.33, 0.58), (0.28, 0.17, 0.40))]
    labels = _label_boxes(pareto_figure(summaries))
    assert {text for text, *_ in labels} == {"lenience:0.3", "lenience:0.6", "typical:0.1"}
    assert all(place in ("top right", "top left", "bottom right", "bottom left") for *_, place in labels)
    # Accuracy ties: two settings at the same height, close in speed, must not share a place.
    tied = [_summary("a:0.3", "rule", (0.459, 0.38, 0.55), (50.0, 17.0, 83.0)), _summary("b:0.1", "rule", (0.454, 0.33, 0.58), (50.0, 0.0, 100.0))]
    (_, _, _, first), (_, _, _, second) = _label_boxes(pareto_figure(tied, "accuracy"))
    assert first != second
    error = next(trace for trace in pareto_figure(summaries).to_plotly_json()["data"] if trace["name"] == "rule")["error_x"]
    assert error["color"].startswith("rgba(") and error["color"].endswith(", 0.5)")  # faint: a label another bar crosses reads


def test_compares_runs_table_is_html_that_fits_and_escapes() -> None:
    """Rough edge 5: the per-seed runs table as HTML at the page's width (cells wrap, no inner scroll
    bar, every row shown), each header and cell escaped: a rule label is text from a database."""
    rows = [{"rule": "<img src=x onerror=alert(1)>", "run": "630c6678095e", "status": "complete", "first divergence": "reference",
             "tokens": "32", "acceptance α": "0.4688", "modelled speed-up": "0.3736"},
            {"rule": "lenience:0.5", "run": "7d1358690a05", "status": "complete", "first divergence": "1", "tokens": "32",
             "acceptance α": "–", "modelled speed-up": "0.3736"}]
    page = seed_runs_html(rows)
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert page.count("<tr>") == 1 + len(rows) and page.count("<th>") == len(rows[0])
    assert "<th>modelled speed-up</th>" in page
    assert "width: 100%" in page and "overflow-wrap" in page and "height" not in page  # wraps; no fixed height, so no inner scroll
    assert "@container (max-width" in page  # in a narrow column every cell may break (at 540 px it was 760 wide)
    assert '<td class="number">0.4688</td>' in page and "<td>complete</td>" in page
    assert seed_runs_html([]) == ""
