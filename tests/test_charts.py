"""Figures carry what the pages promise: limits, shading, escaped labels."""

from __future__ import annotations

import torch
from conftest import dirichlet

from diagnostics.charts import draft_path_figure, law_figure, safe_label
from diagnostics.distortion_curve import distortion_path
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
    top = figure["layout"]["yaxis"]["range"][1]
    assert max(ceiling["y"]) < min(top, 1.1)  # p/l = 1.1 is clipped at the chart's top, its value kept for the hover


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
    # The rare token is the last bar: its label reads leftwards, inside the chart (rightwards it was cut off).
    assert bars["x"][-1] == safe_label(view.labels[rare])
    sides = {trace["text"][0]: trace["textposition"] for trace in figure["data"] if trace.get("mode") == "markers+text"}
    assert sides["emitted"] == "middle left"
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
    # Named once, in the legend, not over a track's title.
    assert [name for name in names if "first divergence" in name] == ["first divergence (position 3)"]
    assert not [a for a in figure["layout"]["annotations"] if "divergence" in a["text"]]
    # Every track's small values in scientific notation, not SI prefixes ("1μ" read as a unit: issue 45).
    axes = [name for name in figure["layout"] if name.startswith("yaxis")]
    assert len(axes) == 5 and all(figure["layout"][name].get("exponentformat") == "e" for name in axes)
    # ... and in the hover: a(x) of 1e-5 read "0.0000" at four fixed decimals (a browser walk, issue 45).
    templates = [trace["hovertemplate"] for trace in figure["data"] if "hovertemplate" in trace and "= %{y" in trace["hovertemplate"]]
    assert templates and all("%{y:.4~g}" in template for template in templates)


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


# -- issue 32: charts that tell the truth ------------------------------------------------------------

# plotly.js decodes only these named entities (its svg_text_utils entityToUnicode), plus numeric ones.
PLOTLY_ENTITIES = {"mu": "μ", "amp": "&", "lt": "<", "gt": ">", "nbsp": "\xa0", "times": "×", "plusmn": "±", "deg": "°"}


def _as_plotly_shows(text: str) -> str:
    """The text plotly.js draws for a label: its own entity decoding (one pass), nothing else."""
    import re

    def decode(match: re.Match) -> str:
        name = match.group(1)
        if name.startswith("#"):
            return chr(int(name[2:], 16) if name[1] == "x" else int(name[1:]))
        return PLOTLY_ENTITIES.get(name, match.group(0))

    return re.sub(r"&(#\d+|#x[\da-fA-F]+|[a-z]+);", decode, text)


def test_a_token_with_a_quote_is_escaped_exactly_once() -> None:
    """Inspect showed `&quot;` as a tick: html.escape(quote=True) writes &quot;, which plotly.js
    does not decode. Each label, decoded as plotly.js does, is the token itself; no tag survives."""
    import html

    p_target = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    q_draft = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    labels = ['say "hi"', "it's", "a&amp;b", "<b>x</b>"]
    view = explain_step(get_rule("lossless"), p_target, q_draft, labels)
    shown = law_figure(view, draft_token=1, emitted_token=0).to_dict()["data"][0]["x"]
    assert [_as_plotly_shows(label) for label in shown] == labels
    assert '"' in shown[0] and "&quot;" not in "".join(shown) and "<b>" not in "".join(shown)
    # Negative control: the old escaping shows the entity itself.
    assert _as_plotly_shows(html.escape('say "hi"', quote=True)) == "say &quot;hi&quot;"


def test_leading_and_trailing_spaces_show_as_a_visible_space_on_every_token_chart() -> None:
    """` In` and `In` are different tokens but SVG trims a tick's leading space: every chart draws
    it as ␣ (trailing spaces and runs of spaces too; a space between words stays)."""
    from types import SimpleNamespace

    import pandas as pd

    from diagnostics.charts import divergence_figure, tracks_figure, tree_candidates_figure, tree_round_figure

    p_target = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    q_draft = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    labels = [" In", "In", "In ", "a  b c"]
    expected = ["␣In", "In", "In␣", "a␣␣b c"]
    view = explain_step(get_rule("lossless"), p_target, q_draft, labels)
    assert list(law_figure(view).to_dict()["data"][0]["x"]) == expected
    steps = [(view, {"kind": "rejected", "token": 0, "draft_token": 1, "accept_prob": 0.5, "u_accept": 0.7})]
    assert list(divergence_figure(p_target, q_draft, steps).to_dict()["data"][0]["x"]) == expected
    node_view = SimpleNamespace(p_target=p_target, law=p_target, laws=[p_target] * 3, labels=labels,
                                candidates=[{"index": 0, "label": " In", "decision": "refused", "accept_prob": 0.5},
                                            {"index": 1, "label": "In", "decision": "accepted", "accept_prob": 0.9}])
    candidates = tree_candidates_figure(node_view).to_dict()["data"]
    assert list(candidates[0]["x"])[2:] == expected[2:] and candidates[1]["name"] == "r2: after refusing ␣In"
    assert sorted(candidates[0]["x"][:2]) == ["In", "␣In"]  # the candidates first, in the order tried
    nodes = pd.DataFrame([{"node": 0, "parent": -1, "depth": 1, "sibling": 0, "token": 1, "token_text": " In", "p_token": 0.3,
                           "q_token": 0.6, "residual": 0.3, "accept_prob": 0.5, "u_accept": 0.7, "decision": "refused", "reach": 0.6}])
    tree = next(trace for trace in tree_round_figure(nodes).to_dict()["data"] if trace.get("name") == "refused")
    assert list(tree["text"]) == ["␣In"] and tree["hovertext"][0].startswith("␣In ")
    frame = pd.DataFrame({"position": [0, 1], "index_in_block": [0, 1], "token_text": [" In", "In"], "tv_target": [0.0, 0.0]})
    assert list(tracks_figure(frame).to_dict()["data"][0]["customdata"]) == ["␣In", "In"]


def test_the_y_axis_shows_the_whole_of_every_bar() -> None:
    """A truncation rule whose allowed set is one token has a matched baseline of mass 1.0 there
    while p tops out at 0.37: the axis was scaled to p, q, P and cut the baseline bar."""
    p_target = torch.tensor([0.37, 0.33, 0.30], dtype=torch.float64)
    q_draft = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    view = explain_step(get_rule("cascade:0.9"), p_target, q_draft, ["a", "b", "c"])
    assert float(view.baseline.max()) == 1.0 and float(p_target.max()) < 0.4  # the case the user met
    for kind in ("accepted", "rejected"):  # the fallback hidden (legend only) or shown: either way it fits
        figure = law_figure(view, draft_token=2, emitted_token=0, kind=kind).to_dict()
        low, high = figure["layout"]["yaxis"]["range"]
        bars = [value for trace in figure["data"] if trace["type"] == "bar" for value in trace["y"]]
        assert high >= max(bars) >= 1.0 and low <= min(bars)


def test_float_noise_is_drawn_as_zero_on_distortion_tracks() -> None:
    """A lossless run stores TV(P, p) = 8e-16 and the like: its distortion track was scaled to the
    noise ("1f 2f 3f" ticks, spikes). Values under FLOAT_NOISE are drawn as 0 on a non-negative
    axis; a real distortion (1e-4) is kept."""
    from types import SimpleNamespace

    import pandas as pd

    from diagnostics.charts import FLOAT_NOISE, pareto_figure, tracks_figure

    noise = [1e-16, 8e-16, -2e-17, 3e-12]
    frame = pd.DataFrame({"position": range(4), "index_in_block": [0, 1, 0, 1], "token_text": ["a"] * 4,
                          "tv_target": noise, "tv_baseline": noise, "kl_target": [2e-16, 0.0, 1e-4, None]})
    figure = tracks_figure(frame).to_dict()
    distortion = {trace["name"]: list(trace["y"]) for trace in figure["data"] if trace["yaxis"] == "y5"}
    assert distortion == {"TV(P, p)": [0.0] * 4, "TV(P, baseline)": [0.0] * 4, "KL(P ‖ p)": [0.0, 0.0, 1e-4, None]}
    assert figure["layout"]["yaxis5"]["rangemode"] == "nonnegative"
    assert max(abs(value) for value in noise) < FLOAT_NOISE < 1e-4
    lossless = SimpleNamespace(role="lossless", label="lossless", figures={"modelled speed-up": (1.5, 1.4, 1.6),
                                                                            "TV(P, baseline)": (1e-16, 0.0, 4e-16)})
    point = next(trace for trace in pareto_figure([lossless]).to_dict()["data"] if trace["name"] == "lossless")
    assert list(point["y"]) == [0.0] and list(point["error_y"]["array"]) == [0.0]
    flat = SimpleNamespace(spec="lossless", label="lossless", t=[0.0, 0.5, 1.0], tv_target=[1e-16, 5e-17, 0.0], tv_baseline=[0.1] * 3,
                           acceptance=[0.5] * 3, limit_target=None, limit_baseline=None, tree=False)
    playground = draft_path_figure(SimpleNamespace(curves=[flat]), "target").to_dict()
    assert list(playground["data"][0]["y"]) == [0.0] * 3 and playground["layout"]["yaxis"]["rangemode"] == "nonnegative"


def test_the_runs_table_reads_as_text_for_people() -> None:
    """Human headers, 3 significant digits, float noise as 0, "–" for an empty cell, never "None";
    a small table keeps its numbers under the text (sorting by value), a large one is text."""
    import pandas as pd
    from pandas.io.formats.style import Styler

    from diagnostics.charts import RUN_HEADERS, format_number, runs_display, runs_table
    from diagnostics.charts.runs import STYLED_CELLS_MAX

    runs = pd.DataFrame({
        "run_id": ["r1", "r2"], "created": pd.to_datetime(["2025-01-02 03:04:05.678", "2025-01-02 03:05:00.000"]),
        "status": ["complete", "interrupted"], "rule": ["lossless", "lenience:0.5"], "draft": ["ngram:2", None],
        "n_tokens": [1234, 0], "acceptance_rate": [2 / 3, None], "block_efficiency": [1.23456, float("nan")],
        "tokens_per_s": [1234.5, 12.345], "mean_tv_target": [8e-16, 0.012345], "group_id": [None, "g1"], "prompt": ["hi", "yo"],
    })
    shown = runs_display(runs)
    assert list(shown.columns) == ["run", "created", "status", "rule", "draft", "tokens", "acceptance rate", "block efficiency",
                                   "tokens/s", "mean TV(P, p)", "group", "prompt"]
    assert shown.iloc[0].tolist() == ["r1", "2025-01-02 03:04:05", "complete", "lossless", "ngram:2", "1,234", "0.667", "1.23",
                                      "1,230", "0", "–", "hi"]
    assert shown.iloc[1].tolist()[4:11] == ["–", "0", "–", "–", "12.3", "0.0123", "g1"]
    assert format_number(-3e-17) == "0" and format_number(0.5) == "0.5" and format_number(float("inf")) == "inf"
    styled = runs_table(runs)
    assert isinstance(styled, Styler) and list(styled.data.columns) == list(shown.columns)
    text = styled.to_string(delimiter="|")
    assert "None" not in text and "nan" not in text and "8e-16" not in text and "|1,230|0|–|hi" in text
    # Streamlit draws a null cell as "None" over any display value: text cells hold their text.
    assert styled.data["group"].tolist() == ["–", "g1"] and styled.data["draft"].tolist() == ["ngram:2", "–"]
    assert styled.data["tokens"].tolist() == [1234, 0]  # numbers stay numbers (sorting by value)
    many = pd.concat([runs] * (STYLED_CELLS_MAX // (2 * len(RUN_HEADERS)) + 1), ignore_index=True)
    assert runs_display(many).equals(runs_table(many))  # past the bound: the same text, unstyled


def test_every_chart_keeps_its_title_and_top_legend_below_the_toolbar() -> None:
    """Rough edge 4 of issue 45 (everyday, < 1 s): the toolbar shown on hover (about 28 px at the top
    right) printed over titles, the tree legend and Compare's subplot titles. Each figure's top
    margin now leaves that row free, and a title is pinned below it."""
    import pandas as pd
    import plotly.graph_objects as go

    from diagnostics.charts import tracks_figure
    from diagnostics.charts.common import TOOLBAR_ROW, below_toolbar

    titled = below_toolbar(go.Figure(layout={"title": {"text": "a long title"}, "margin": {"t": 50}}))
    assert titled.layout.margin.t == 50 + TOOLBAR_ROW and titled.layout.title.pad.t == TOOLBAR_ROW
    assert titled.layout.title.yref == "container" and titled.layout.title.yanchor == "top"
    frame = pd.DataFrame({"position": range(3), "index_in_block": [0, 1, 0], "kind": ["accepted"] * 3, "accept_prob": [0.5] * 3,
                          "alpha": [0.4] * 3, "tv_pq": [0.2] * 3, "entropy_p": [1.0] * 3, "p_token": [0.5] * 3,
                          "tv_target": [0.0] * 3, "tv_baseline": [0.1] * 3, "kl_target": [0.01] * 3, "token_text": ["a"] * 3})
    assert tracks_figure(frame).layout.margin.t == 40 + TOOLBAR_ROW  # its subplot titles sit in that margin
