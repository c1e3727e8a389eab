"""Run, Inspect, Compare and Runs pages under AppTest, on a tiny local model and temporary databases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from app_support import open_page

from diagnostics.engine import PositionRecord
from diagnostics.models import load_model
from diagnostics.runner import RunRequest, compare_rules, record_run
from diagnostics.store import Store



@pytest.fixture
def populated(tmp_path: Path, tiny_folder: str, monkeypatch) -> dict:
    db = tmp_path / "runs.duckdb"
    monkeypatch.setenv("SPECLAB_DB", str(db))
    monkeypatch.setenv("SPECLAB_TARGET", tiny_folder)
    store = Store(db)
    target = load_model(tiny_folder)
    base = {"prompt": "w1 w2 w3 w1 w2", "draft": "ngram:2", "gamma": 3, "max_new_tokens": 16, "seed": 2, "raw": True}
    run_id, _ = record_run(store, target, "ngram:2", RunRequest(rule="lenience:0.5", **base))
    group_id, results, divergence = compare_rules(store, target, "ngram:2", [RunRequest(rule=r, **base) for r in ("lossless", "lenience:0.1")])
    return {"db": db, "run_id": run_id, "group_id": group_id, "results": results, "divergence": divergence, "store": store}


def _open(page: str | None = None, query: dict | None = None) -> AppTest:
    return open_page(page, query)


def _html(at: AppTest) -> str:
    return "".join(element.proto.body for element in at.get("html"))


def test_deep_link_opens_inspect(populated) -> None:
    at = _open(query={"run": populated["run_id"]})
    assert at.title[0].value == "Inspect a run"
    strip = _html(at)
    assert 'class="tok tok-' in strip and strip.count('data-position="') == 16
    assert len(at.get("plotly_chart")) == 2  # tracks and the laws at the selected position
    assert [m.label for m in at.metric][:3] == ["acceptance rate", "block efficiency", "tokens/s"]
    at.number_input(key="inspect_position").set_value(5).run()
    assert not at.exception
    assert "Position 5" in " ".join(header.value for header in at.subheader)
    law = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert {"target p", "draft q", "induced P"} <= {trace.get("name") for trace in law["data"]}
    assert "exact" in " ".join(caption.value for caption in at.caption)


def test_deep_link_to_a_missing_run(populated) -> None:
    at = _open(query={"run": "nosuchrun"})
    assert "There is no run ` nosuchrun `" in at.error[0].value


def test_compare_page_marks_the_divergence(populated) -> None:
    at = _open("views/compare.py", {"group": populated["group_id"]})
    assert at.title[0].value == "Compare"
    table = at.dataframe[0].value
    assert list(table["rule"]) == ["lossless", "lenience:0.1"]
    lossy_id = populated["results"][1][0]
    expected = populated["divergence"][lossy_id]
    if expected is not None:
        assert f'class="tok tok-{"rejected"}' in _html(at) or "tok-diverge" in _html(at)
        assert f'tok-diverge" data-position="{expected}"' in _html(at)
        assert any(f"position **{expected}**" in md.value for md in at.markdown)


def test_runs_page_lists_and_filters(populated) -> None:
    at = _open("views/runs.py")
    assert len(at.dataframe[0].value) == 3
    at.text_input(key="runs_search").set_value("lenience:0.1").run()
    assert len(at.dataframe[0].value) == 1


def test_run_page_records_a_run(populated, tiny_folder: str) -> None:
    at = _open("views/run.py")
    at.text_area(key="run_prompt").set_value("w1 w2 w3 w1 w2")
    at.checkbox(key="run_raw").check()
    at.selectbox(key="run_draft_kind").set_value("ngram")
    at.number_input(key="run_max_tokens").set_value(10)
    at.button(key="run_start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    newest = Store(populated["db"]).list_runs().iloc[0]
    assert newest["status"] == "complete" and newest["n_tokens"] == 10 and newest["rule"] == "lenience:0.5"
    assert _html(at).count('data-position="') == 10


def test_run_page_bad_rule_is_a_message(populated) -> None:
    at = _open("views/run.py")
    at.text_input(key="run_rule").set_value("lenience:0").run()
    assert "out of range" in at.error[0].value


@pytest.mark.parametrize("page", ["views/inspect.py", "views/compare.py", "views/runs.py"])
def test_empty_database(tmp_path: Path, monkeypatch, page: str) -> None:
    monkeypatch.setenv("SPECLAB_DB", str(tmp_path / "fresh" / "runs.duckdb"))
    at = _open(page)
    assert at.info and "No " in at.info[0].value


@pytest.mark.parametrize("page", ["views/inspect.py", "views/compare.py", "views/runs.py"])
def test_corrupt_database_is_a_clear_message(tmp_path: Path, monkeypatch, page: str) -> None:
    corrupt = tmp_path / "runs.duckdb"
    corrupt.write_bytes(b"garbage" * 100)
    monkeypatch.setenv("SPECLAB_DB", str(corrupt))
    at = _open(page)
    assert "not a readable DuckDB database" in at.error[0].value
    assert corrupt.read_bytes() == b"garbage" * 100


def test_untrusted_token_text_is_escaped_on_inspect(tmp_path: Path, monkeypatch) -> None:
    db = tmp_path / "runs.duckdb"
    monkeypatch.setenv("SPECLAB_DB", str(db))
    store = Store(db)
    run_id = store.start_run({"prompt": "<script>alert(1)</script>", "rule": "lossless", "target": "elsewhere/model",
                              "draft": "ngram:2", "tokens": [5], "prompt_ids": [1], "policy": "{}", "draft_policy": "{}"})
    store.add_positions(run_id, [PositionRecord(
        position=0, block=0, index_in_block=0, kind="bonus", token=5, draft_token=None, p_token=1.0, p_draft=None,
        q_draft=None, accept_prob=None, u_draft=None, u_accept=None, u_fallback=0.3, p_top_ids=[5], p_top_probs=[1.0],
        p_tail=0.0, token_text='<img src=x onerror="alert(1)"><script>alert(2)</script>')])
    store.finish_run(run_id, "complete", {"n_tokens": 1})
    at = _open(query={"run": run_id})
    strip = _html(at)
    assert "<script>" not in strip and "<img" not in strip and "&lt;script&gt;" in strip


def test_a_run_naming_another_model_asks_before_loading_it(populated, tiny_folder: str, monkeypatch) -> None:
    """A run's target that is not the app's configured one (a shared file can name any folder) is
    loaded only after a click on a button that names it, never on page load."""
    monkeypatch.setenv("SPECLAB_TARGET", "default")
    from views import common

    loads: list[str] = []
    monkeypatch.setattr(common, "load_model", lambda spec, **kwargs: loads.append(spec) or load_model(spec))
    common.try_model.clear()
    at = _open(query={"run": populated["run_id"], "pos": "3"})
    buttons = [button for button in at.button if button.key == "inspect_load_models"]
    assert len(buttons) == 1 and f"` {tiny_folder} `" in buttons[0].label and loads == []
    assert "rebuilt from the stored top-20" in " ".join(caption.value for caption in at.caption)
    buttons[0].click().run()
    assert not at.exception and loads == [tiny_folder]
    assert "exact" in " ".join(caption.value for caption in at.caption)
    common.try_model.clear()


@pytest.mark.parametrize("pos", ["²", "-1", "1e3", "99999999999", "3 "])
def test_a_position_in_the_link_that_is_not_a_position_is_ignored(populated, pos: str) -> None:
    """'²'.isdigit() is true and int('²') raises: only ASCII digits in range select a position."""
    at = _open(query={"run": populated["run_id"], "pos": pos})
    assert "Position 0:" in " ".join(header.value for header in at.subheader)


def test_the_early_exit_default_follows_the_target(populated, tiny_folder: str) -> None:
    """The forms default to the last-but-one layer of a shallow target (the tiny one has 2), to 26
    on the embedded model, and refresh the default when the target changes."""
    for page, prefix in (("views/run.py", "run"), ("views/compare.py", "cmp")):
        at = _open(page)
        assert at.number_input(key=f"{prefix}_layer_2").value == 1
        at.text_input(key=f"{prefix}_target").set_value("default").run()
        assert at.number_input(key=f"{prefix}_layer_30").value == 26
    at = _open("views/run.py")
    at.text_area(key="run_prompt").set_value("w1 w2 w3 w1 w2")
    at.checkbox(key="run_raw").check()
    at.number_input(key="run_max_tokens").set_value(6)
    at.button(key="run_start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert Store(populated["db"]).list_runs().iloc[0]["draft"] == "early-exit:1"


def test_the_models_a_run_names_are_parsed_as_the_loader_parses_them() -> None:
    """Whatever spelling would load a draft model also asks first: 'MODEL: path' is a model draft."""
    from diagnostics.inspection import models_to_load

    run = {"target": "/their/target", "draft": "MODEL: /their/draft"}
    assert models_to_load(run) == ["/their/target", "/their/draft"]
    assert models_to_load({**run, "draft": "none (plain decoding)"}) == ["/their/target"]
    assert models_to_load({**run, "draft": "ngram:3", "target": "default"}) == []
    assert models_to_load({**run, "target": "mine"}, trusted=("default", "mine")) == ["/their/draft"]
