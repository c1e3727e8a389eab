"""The Playground renders under AppTest for every preset and every rule, with its figures."""

from __future__ import annotations

import json

import pytest
from app_support import open_page
from streamlit.testing.v1 import AppTest

from diagnostics.rules import RULES
from diagnostics.synthetic import PRESETS



def _app() -> AppTest:
    return open_page("views/playground.py", timeout=60)


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def test_playground_page_renders() -> None:
    at = _app()
    assert at.title[0].value == "Playground"
    assert len(_figures(at)) == 2
    assert [m.label for m in at.metric][:3] == ["acceptance α = Σ q·a", "TV(P, p)", "TV(P, baseline)"]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_and_rule_renders(preset: str) -> None:
    at = _app()
    at.selectbox(key="preset").set_value(preset).run()
    assert not at.exception
    for name in RULES:
        at.selectbox(key="rule").set_value(name).run()
        assert not at.exception, (preset, name, [e.value for e in at.exception])
        law, sweep = _figures(at)
        names = {trace.get("name") for trace in law["data"]}
        assert {"target p", "draft q", "induced P", "matched baseline"} <= names
        if name == "lenience":
            assert "ceiling p/l" in names
        if name in ("cascade", "typical", "medusa"):
            assert any(str(trace_name).startswith("allowed set A (p(A) = ") for trace_name in names)
        assert any(trace.get("name", "").startswith("tree ") for trace in sweep["data"])
        assert not at.error


def test_sliders_and_tree_k_rerender() -> None:
    at = _app()
    at.selectbox(key="preset").set_value("noisy").run()
    at.slider(key="noise").set_value(0.1).run()
    at.slider(key="vocab").set_value(30).run()
    at.slider(key="tree_k").set_value(3).run()
    at.radio(key="against").set_value("target").run()
    assert not at.exception
    sweep = _figures(at)[1]
    assert any("top-3" in trace.get("name", "") for trace in sweep["data"])
    assert "TV(P, p)" in sweep["layout"]["yaxis"]["title"]["text"]


def test_typed_spec_errors_are_one_line_messages() -> None:
    at = _app()
    for spec, fragment in [("lenience:0", "out of range"), ("cos:1.5", "out of range"), ("nonsense", "unknown rule")]:
        at.text_input(key="spec_text").set_value(spec).run()
        assert not at.exception
        assert fragment in at.error[0].value and "\n" not in at.error[0].value
    at.text_input(key="spec_text").set_value("medusa:0.2,0.5").run()
    assert not at.error and "medusa:0.2,0.5" in at.subheader[0].value
