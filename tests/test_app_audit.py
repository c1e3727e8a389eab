"""The Audit page under AppTest: run an audit at each layer, read the verdict and evidence, and the report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from app_support import open_page

from diagnostics.models import load_model
from diagnostics.runner import RunRequest, record_run
from diagnostics.store import Store



@pytest.fixture
def database(tmp_path: Path, tiny_folder: str, monkeypatch) -> Path:
    db = tmp_path / "runs.duckdb"
    monkeypatch.setenv("SPECLAB_DB", str(db))
    monkeypatch.setenv("SPECLAB_TARGET", tiny_folder)
    return db


def _audit_page() -> AppTest:
    return open_page("views/audit.py", timeout=180)


def test_empty_database_says_how_to_start(database) -> None:
    at = _audit_page()
    assert at.title[0].value == "Audit"
    assert any("No audits yet" in info.value for info in at.info)


def test_rule_level_audit_of_a_planted_bug_fails_with_evidence(database) -> None:
    at = _audit_page()
    at.selectbox(key="audit_rule_impl").set_value("residual_softmax")
    at.number_input(key="audit_samples").set_value(20_000)
    at.button(key="audit_rule_go").click()
    at.run(timeout=180)
    assert not at.exception, [e.value for e in at.exception]
    banner = at.error[0].value if at.error else ""
    assert banner.startswith("**FAIL** · Rule-level audit of ` planted:residual_softmax `: its output law differs from the target's p")
    # One paragraph: the verdict once, in words, not beside a monospace copy of the summary line.
    assert banner.count("FAIL") == 1 and banner.count(" · ") == 1 and "Worst pair ` " in banner and "\n" not in banner
    assert not any(markdown.value.startswith("- ") for markdown in at.markdown)
    assert len(at.get("plotly_chart")) == 1 and len(at.dataframe) >= 1
    stored = Store(database, read_only=True).list_audits()
    assert stored["verdict"].tolist() == ["fail"] and stored["layer"].tolist() == ["rule"]
    assert at.get("download_button")  # the audit's report
    at.run()  # the next interaction: the form the user just used stays open (it closed once an audit existed)
    assert at.expander[0].proto.expanded


def test_engine_level_audit_of_our_engine_passes(database) -> None:
    at = _audit_page()
    at.radio(key="audit_layer").set_value("Engine level")
    at.run()
    at.number_input(key="audit_generations_True").set_value(200)
    at.button(key="audit_engine_go").click()
    at.run(timeout=180)
    assert not at.exception, [e.value for e in at.exception]
    assert at.success and at.success[0].value.startswith("**PASS** · Engine-level audit of ` ours (lossless engine) `: its output law is consistent "
                                                         "with the target's law. ")
    assert len(at.get("plotly_chart")) == 1  # the PIT histogram


def _recorded_audit(database, tiny_folder, **settings) -> tuple[str, object]:
    """Record a run on the tiny model, then audit it from the Audit page (the newest run is preselected)."""
    request = {"prompt": "w1 w2 w3 w1 w2", "draft": "ngram:2", "gamma": 3, "max_new_tokens": 16, "seed": 2, "raw": True} | settings
    run_id, _ = record_run(Store(database), load_model(tiny_folder), "ngram:2", RunRequest(**request))
    at = _audit_page()
    at.radio(key="audit_layer").set_value("Recorded run")
    at.run()
    at.button(key="audit_run_go").click()
    at.run(timeout=180)
    assert not at.exception, [e.value for e in at.exception]
    return run_id, at


def test_recorded_run_audit_links_to_inspect(database, tiny_folder) -> None:
    run_id, at = _recorded_audit(database, tiny_folder)
    assert at.success and f"Run ` {run_id} `" in at.success[0].value and "p recomputed" in at.success[0].value
    assert any(f"/inspect?run={run_id}&pos=" in markdown.value for markdown in at.markdown)
    assert Store(database, read_only=True).list_audits(run_ids=[run_id])["verdict"].tolist() == ["pass"]


def test_recorded_audit_of_a_lossy_run_says_what_it_checked_and_links_each_worst_position(database, tiny_folder) -> None:
    """A lossy run's recorded audit: PASS once, as "consistent with the declared rule", never as
    lossless; one Inspect link per listed position, in the table's (worst-first) order."""
    run_id, at = _recorded_audit(database, tiny_folder, rule="lenience:0.5", max_new_tokens=24, seed=5)
    banner = at.success[0].value
    assert banner.startswith("**PASS** · The recorded decisions are consistent with the declared rule ` lenience:0.5 ` (a lossy rule")
    assert banner.count("PASS") == 1 and f"Run ` {run_id} `" in banner
    table = next(frame.value for frame in at.dataframe if "check" in frame.value.columns)
    listed = list(dict.fromkeys(int(position) for position in table["position"] if position >= 0))
    assert len(listed) == 10 and listed != sorted(listed)  # worst first, not positions 0-4
    links = [markdown.value for markdown in at.markdown if "/inspect?run=" in markdown.value]
    assert len(links) == 1
    linked = [int(position) for position in re.findall(rf"\(/inspect\?run={run_id}&pos=(\d+)\)", links[0])]
    assert linked == listed


def test_rule_level_audit_with_real_positions_of_the_target(database) -> None:
    """The Run page's target (here a tiny 2-layer model: its early-exit draft is layer 1) adds two real pairs."""
    at = _audit_page()
    at.number_input(key="audit_samples").set_value(5_000)
    at.checkbox(key="audit_real").check()
    at.button(key="audit_rule_go").click()
    at.run(timeout=180)
    assert not at.exception, [e.value for e in at.exception]
    assert at.success and "on each of 8 pairs" in at.success[0].value


def test_the_verdict_table_links_each_row_to_its_stored_audits(database, tmp_path: Path, monkeypatch) -> None:
    """The Audit page shows ``docs/verdicts.json`` (here ``$SPECLAB_VERDICTS``): cells as data (a
    hostile label stays text), each side linked to its stored audit when this database holds it."""
    import json

    store = Store(database)
    audit_id = store.add_audit({"layer": "external", "verdict": "pass", "implementation": "x", "p_value": 0.5}, "pass · x")
    side = {"verdict": "pass", "p_value": 0.5, "tokens": 10_063, "detectable_tv": 0.03, "distortion": 0.0, "distortion_low": 0.0,
            "distortion_high": 0.01, "file": "a.jsonl", "sha256": "ab" * 32, "audit_id": audit_id}
    row = {"engine": "e", "label": "vLLM [x](http://evil) **bold**", "version": "v 1", "policy": "t1", "verdict": "pass",
           "settings": {"temperature": 1.0}, "on": side, "off": {**side, "audit_id": "not-here"}, "provenance": "run here", "time_s": 12}
    table = tmp_path / "verdicts.json"
    table.write_text(json.dumps({"rows": [row]}))
    monkeypatch.setenv("SPECLAB_VERDICTS", str(table))
    del store
    at = _audit_page()
    assert not at.exception, [e.value for e in at.exception]
    [shown] = [frame.value for frame in at.dataframe if "detects TV ≥" in frame.value.columns]
    assert shown["engine"].tolist() == ["vLLM [x](http://evil) **bold**"] and shown["verdict"].tolist() == ["pass"]
    assert shown["audit (on)"].tolist() == [f"/audit?audit={audit_id}"] and shown["audit (off)"].isna().all()
    assert shown["tokens"].tolist() == ["10,063"] and shown["time here"].tolist() == ["12 s"]
    assert not any("evil" in element.value for element in [*at.markdown, *at.caption])
    # At a glance: one row per engine mode, its policies side by side, the verdict with its p-value
    # and what the engine's counters say (none here: "drafts not counted").
    # It is HTML that wraps to the page's width (a grid of fixed columns was cut at a laptop's width),
    # the file's text escaped in it: a label with markup is shown as its characters.
    [glance] = [element.proto.body for element in at.get("html") if "verdict-glance" in element.proto.body]
    assert '<td class="verdict-pass">pass · p 0.5 · drafts not counted</td>' in glance
    assert "<td>vLLM [x](http://evil) **bold**</td>" in glance and "width: 100%" in glance and "overflow-wrap: break-word" in glance
    hostile = {**row, "label": '<img src=x onerror="alert(1)">'}
    table.write_text(json.dumps({"rows": [hostile]}))
    at = _audit_page()
    [glance] = [element.proto.body for element in at.get("html") if "verdict-glance" in element.proto.body]
    assert "<img" not in glance and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in glance
    table.write_text('{"rows": "no"}')
    at = _audit_page()
    assert any("not a verdict table" in element.value for element in at.error) and table.read_text() == '{"rows": "no"}'


@pytest.mark.slow  # slow tier: a verdict's evidence audited again at its full size (about 30 s)
def test_a_verdicts_evidence_is_audited_again_on_the_page(database, tmp_path: Path, monkeypatch) -> None:
    """A fresh clone has the committed evidence files but not the audits: one click audits a
    side's file again against the embedded target, checked against the table's sha256; a row whose
    file changed is not offered."""
    import json

    from diagnostics.models import EMBEDDED_NAME
    from diagnostics.verdicts.table import sha256

    folder = tmp_path / "verdicts"
    folder.mkdir()
    docs = Path(__file__).resolve().parents[1] / "docs" / "verdicts"
    rows = []
    for engine, source in (("ours", "ours--t1--on.jsonl"), ("tampered", "ours-plain--t1--off.jsonl")):
        path = folder / f"{engine}.jsonl"
        path.write_text("".join(docs.joinpath(source).read_text().splitlines(keepends=True)[:20]))
        side = {"verdict": "pass", "p_value": 0.5, "tokens": 640, "detectable_tv": 0.1, "file": path.name, "sha256": sha256(path)}
        rows.append({"engine": engine, "label": f"engine {engine}", "version": "v 1", "policy": "t1", "verdict": "pass",
                     "target": EMBEDDED_NAME, "settings": {"temperature": 1.0, "detect_tv": 0.1, "level": 0.01},
                     "on": side, "off": side, "provenance": "run here", "time_s": 1})
    (folder / "tampered.jsonl").write_text("{}\n")
    table = tmp_path / "verdicts.json"
    table.write_text(json.dumps({"rows": rows}))
    monkeypatch.setenv("SPECLAB_VERDICTS", str(table))
    at = _audit_page()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="verdict_reaudit_row").options == ["engine ours · temperature 1 · pass"]
    at.button(key="verdict_reaudit_go").click()
    at.run(timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    [stored] = Store(database, read_only=True).list_audits()["audit_id"].tolist()
    evidence = Store(database, read_only=True).get_audit(stored)["evidence"]
    assert evidence["layer"] == "external" and evidence["implementation"] == "engine ours (speculation on)"
    assert evidence["detect_tv"] == 0.1 and evidence["generations"] == 20
    # The page's audit is the library's: the same file and test give the same figures.
    from diagnostics.engine import eos_ids
    from diagnostics.verdicts.table import reaudit_side

    target = load_model("default")
    library = reaudit_side(rows[0], "on", folder, target, eos_ids(target, None))
    assert (evidence["verdict"], evidence["p_value"], evidence["tokens"]) == (library["verdict"], library["p_value"], library["tokens"])


def test_tiny_p_values_and_timestamps_read_as_people_write_them(database, tmp_path: Path) -> None:
    """An external audit's tables show p as three significant figures ("1e-22", not
    0.0000000000000000000001) and the audit picker shows its time to the second (everyday, ~15 s:
    40 tiny generations, one page run)."""
    from diagnostics.audit.external import audit_samples
    from diagnostics.audit.samples import load_samples
    from diagnostics.audit.suite import engine_samples, plan_engine_audit, tiny_setup

    setup = tiny_setup()
    samples_file = tmp_path / "ours.jsonl"
    engine_samples(plan_engine_audit("ours", setup, generations=40, max_new_tokens=8), setup, str(samples_file))
    result = audit_samples(load_samples(samples_file), setup.target, eos=setup.eos).as_dict()
    assert result["worst_prompts"], result.keys()
    result["worst_prompts"][0]["p_value"] = 1e-22
    store = Store(database)
    store.add_audit(result, "external · ours")
    del store
    at = _audit_page()
    assert not at.exception, [e.value for e in at.exception]
    [prompts] = [frame.value for frame in at.dataframe if "Holm-adjusted p" in frame.value.columns and "prompt" in frame.value.columns]
    assert prompts["p"].tolist()[0] == "1e-22"
    [picker] = [box for box in at.selectbox if box.label == "Show"]
    created = picker.options[0].rsplit(" · ", 1)[1]
    assert len(created) == 19 and created[4] == "-" and created[13] == ":", created  # "2026-12-07 18:40:12", no microseconds
