"""Shared files: a real export opens everywhere; each malformed file of a seeded corpus (one
defect each) is refused by the import with one line and left byte-identical, or opens and
renders on every page and in the report. Hostile text in a valid file renders literally."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from app_support import visit_every_page
from shared_files import DEFECTS, PAYLOAD, SWEEP_DEFECTS, SWEEP_ID, hostile_export, malformed_corpus, real_export, sweep_corpus

from diagnostics.cli import main
from diagnostics.report import build_report
from diagnostics.store import Store, StoreError, export_runs, import_runs


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_folder: str):
    return real_export(tmp_path_factory.mktemp("shared"), tiny_folder)


@pytest.fixture(scope="module")
def corpus(base, tmp_path_factory):
    return {name: (path, expectation) for name, path, expectation in malformed_corpus(base, tmp_path_factory.mktemp("corpus"))}


@pytest.fixture(scope="module")
def sweeps(base, tmp_path_factory):
    return {name: (path, expectation) for name, path, expectation in sweep_corpus(base, tmp_path_factory.mktemp("sweeps"))}


@pytest.fixture
def app_env(tmp_path: Path, monkeypatch) -> None:
    """The app's own database is empty; its configured target is not the shared file's."""
    monkeypatch.setenv("SPECLAB_DB", str(tmp_path / "mine.duckdb"))
    monkeypatch.setenv("SPECLAB_TARGET", "default")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _renders(path: Path, tmp_path: Path, capsys) -> None:
    opened = import_runs(path, tmp_path / "imported.duckdb")
    run_ids = opened.list_runs()["run_id"].tolist()
    audit_ids = opened.list_audits()["audit_id"].tolist()
    group = next((opened.get_run(run_id)["group_id"] for run_id in run_ids if opened.get_run(run_id)["group_id"]), None)
    pages = visit_every_page(str(opened.path), run_id=run_ids[-1], group=group, audit_id=audit_ids[0] if audit_ids else None)
    assert pages["views/inspect.py"].title[0].value == "Inspect a run"
    for run_id in run_ids:
        if opened.get_run(run_id).get("tree"):  # a tree run: its candidates and its round's tree are drawn
            charts = visit_every_page(str(opened.path), run_id=run_id)["views/inspect.py"].get("plotly_chart")
            assert len(charts) == 3 and "round's tree" in charts[2].proto.spec
    text = build_report(opened, run_ids, audit_ids)
    assert text.count("<section class=\"run\">") == len(run_ids) + bool(audit_ids)
    output = tmp_path / "report.html"
    assert main(["report", *run_ids, "--db", str(opened.path), "-o", str(output)]) == 0 and output.stat().st_size > 0
    capsys.readouterr()


def _refused_in_one_line(path: Path, expectation: str, tmp_path: Path, capsys) -> None:
    """The import refuses the file with the expected line, and the CLI says so in one line too."""
    with pytest.raises(StoreError) as error:
        import_runs(path, tmp_path / "imported.duckdb")
    message = str(error.value)
    assert expectation.removeprefix("refused: ") in message and "\n" not in message, message
    assert main(["report", "x", "--db", str(path), "-o", str(tmp_path / "r.html")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_real_export_opens_everywhere(base, tmp_path: Path, app_env, capsys) -> None:
    """The control: the file every defect is made from is accepted and renders."""
    _renders(base.path, tmp_path, capsys)


MALFORMED = [name for name, _, _ in DEFECTS] + ["truncated to half"]
# Every page is opened on every malformed file in the slow tier (about 2.5 s a file); the everyday
# tier walks the pages for one refused file, one that renders and the truncated one, and checks the
# import's and the CLI's answer for every file (``test_each_malformed_shared_file_is_answered_in_one_line``).
EVERYDAY_WALKS = {"policy not JSON", "NULL tokens", "truncated to half"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in EVERYDAY_WALKS else pytest.mark.slow) for name in MALFORMED])
def test_a_malformed_shared_file_is_refused_or_renders(name: str, corpus, tmp_path: Path, app_env, capsys) -> None:
    path, expectation = corpus[name]
    before = _sha(path)
    if expectation.startswith("refused: "):
        _refused_in_one_line(path, expectation, tmp_path, capsys)
        visit_every_page(str(path))  # the pages too (a file opened read-only by path)
    else:
        _renders(path, tmp_path, capsys)
    assert _sha(path) == before


@pytest.mark.parametrize("name", MALFORMED)
def test_each_malformed_shared_file_is_answered_in_one_line(name: str, corpus, tmp_path: Path, capsys) -> None:
    """Everyday tier, without the pages: a refused file is refused by the import and by the CLI in one
    line; a file that renders imports and makes a report; either way it is left byte-identical."""
    path, expectation = corpus[name]
    before = _sha(path)
    if expectation.startswith("refused: "):
        _refused_in_one_line(path, expectation, tmp_path, capsys)
    else:
        opened = import_runs(path, tmp_path / "imported.duckdb")
        run_ids = opened.list_runs()["run_id"].tolist()
        audit_ids = opened.list_audits()["audit_id"].tolist()
        assert build_report(opened, run_ids, audit_ids).count("<section class=\"run\">") == len(run_ids) + bool(audit_ids)
    assert _sha(path) == before


def test_hostile_text_in_a_valid_file_renders_literally(base, tmp_path: Path, app_env, capsys, monkeypatch) -> None:
    """Payloads in every text column, token text and audit evidence: accepted (they are valid
    values), and every Markdown element that carries them is a code span (the browser test
    checks what the page then shows)."""
    from test_sweep import _forbid_checking

    marker = tmp_path / "payload-ran"
    hostile = hostile_export(base, tmp_path / "hostile.duckdb", marker)
    calls = _forbid_checking(monkeypatch)  # opening and reporting the hostile sweep checks nothing
    opened = import_runs(hostile.path, tmp_path / "imported.duckdb")
    group = opened.get_run(hostile.run_ids[0])["group_id"]
    pages = visit_every_page(str(opened.path), run_id=hostile.run_ids[0], group=group, audit_id=hostile.audit_ids[0])
    for page, at in pages.items():
        for kind in ("markdown", "caption", "error", "warning", "info", "success", "subheader"):
            for element in at.get(kind):
                body = getattr(element, "value", "") or ""
                if "PWN" in body:
                    # Only inside code spans: strip them and no payload is left.
                    outside = re.sub(r"\]\(/(?:inspect)?\?[^)\s]*\)", "]", re.sub(r"(`+) .*? \1", "", body))  # links are percent-encoded
                    assert "PWN" not in outside, (page, kind, body[:300])
    text = build_report(opened, hostile.run_ids, hostile.audit_ids)
    body = text.split("</head>", 1)[1]
    assert "<script>window" not in body and "<img src=http" not in body and "\x1b" not in body and "\u202e" not in body
    assert "\\x1b[2J\\u202eEND" in body and "PWN" in body
    assert PAYLOAD not in body  # never raw
    report = tmp_path / "sweep.html"
    assert main(["report", "--sweep", hostile.sweep_id, "--db", str(hostile.path), "-o", str(report)]) == 0
    sweep_body = report.read_text(encoding="utf-8").split("</head>", 1)[1]
    assert "<script>window" not in sweep_body and "<img src=http" not in sweep_body and "PWN" in sweep_body
    assert calls == [] and not marker.exists()


def test_one_member_of_a_group_is_shared_with_its_reference(base, tmp_path: Path, app_env, capsys) -> None:
    """Exporting only the second run of the real export's group writes its reference too, so the
    file opens and renders with the divergence pointing at a run it holds."""
    from diagnostics.store import complete_groups, export_runs

    shared = import_runs(base.path, tmp_path / "base.duckdb")
    assert complete_groups(shared, base.run_ids[1:]).added == {shared.get_run(base.run_ids[0])["group_id"]: base.run_ids[:1]}
    exported = export_runs(shared, base.run_ids[1:], tmp_path / "member.duckdb")
    opened = import_runs(exported, tmp_path / "member-imported.duckdb")
    assert sorted(opened.list_runs()["run_id"]) == sorted(base.run_ids)
    assert "reference run of group" in build_report(opened, base.run_ids[1:])
    _renders(exported, tmp_path, capsys)


def test_a_tree_run_travels_in_both_export_formats(base, tmp_path: Path, app_env) -> None:
    """DuckDB exports carry a tree run's rounds and nodes; a Parquet export carries its positions
    only, and Inspect then says why the node's candidates cannot be drawn instead of drawing a
    chain step's law for a tree position."""
    shared = Store(base.path, read_only=True)
    nodes = shared.tree_nodes(base.tree_run_id)
    assert not nodes.empty and len(shared.tree_rounds(base.tree_run_id)) == nodes["block"].nunique()
    copy = export_runs(shared, [base.tree_run_id], tmp_path / "tree.duckdb")
    assert Store(copy, read_only=True).tree_nodes(base.tree_run_id).equals(nodes)
    parquet = export_runs(shared, [base.tree_run_id], tmp_path / "tree.parquet", "parquet")
    opened = import_runs(parquet, tmp_path / "from_parquet.duckdb")
    assert opened.get_run(base.tree_run_id)["tree"] == "2,2" and opened.tree_nodes(base.tree_run_id).empty
    assert opened.positions(base.tree_run_id)["tree_node"].notna().all()
    positions = opened.positions(base.tree_run_id)
    verified = int(positions.loc[positions["kind"] != "bonus", "position"].iloc[0])
    at = visit_every_page(str(opened.path), run_id=base.tree_run_id)["views/inspect.py"]
    at.number_input(key="inspect_position").set_value(verified).run()
    assert not at.exception and any("holds no tree nodes" in info.value for info in at.info)


def _sweep_page(path: Path):
    """The Sweeps page with ``path`` opened read-only (as the Runs page's import leaves it)."""
    from app_support import APP
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["shared_db"] = str(path)
    at.run()
    at.switch_page("views/sweep.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("name", [name for name, _, _ in SWEEP_DEFECTS])
def test_a_malformed_shared_sweep_is_refused_or_renders(name: str, sweeps, tmp_path: Path, app_env, capsys, monkeypatch) -> None:
    """Each defect of a shared file's sweep (settings, checkers, links) is refused by the import in
    one line, the file byte-identical, or the file opens and its sweep renders on the Sweeps page and
    in ``report --sweep``. No checker runs either way."""
    from test_sweep import _forbid_checking

    path, expectation = sweeps[name]
    before = _sha(path)
    calls = _forbid_checking(monkeypatch)
    report = tmp_path / "sweep.html"
    if expectation.startswith("refused: "):
        with pytest.raises(StoreError) as error:
            import_runs(path, tmp_path / "imported.duckdb")
        message = str(error.value)
        assert expectation.removeprefix("refused: ") in message and "\n" not in message, message
        assert main(["report", "--sweep", SWEEP_ID, "--db", str(path), "-o", str(report)]) == 2
        assert capsys.readouterr().err.count("\n") == 1
        at = _sweep_page(path)
        assert any("is not a runs file this tool can show" in error.value for error in at.error)
    else:
        opened = import_runs(path, tmp_path / "imported.duckdb")
        at = _sweep_page(opened.path)
        assert at.title[0].value == "Sweeps"
        assert f"Sweep {SWEEP_ID}" in build_report(opened, [], sweep_ids=[SWEEP_ID])
        assert main(["report", "--sweep", SWEEP_ID, "--db", str(path), "-o", str(report)]) == 0
    assert _sha(path) == before and calls == []


def test_the_real_sweep_shows_its_stored_scores(base, tmp_path: Path, app_env, monkeypatch) -> None:
    """The control of the sweep corpus: the real export's sweep opens, with the accuracy its units
    stored and nothing checked."""
    from test_sweep import _forbid_checking

    calls = _forbid_checking(monkeypatch)
    at = _sweep_page(base.path)
    table = at.dataframe[1].value  # the quality table (speed is the first)
    assert list(table["setting"]) == ["lossless", "lenience:0.1"] and table["accuracy"].str.match(r"^\d").all()
    assert not any(button.key == "sw_recheck" for button in at.button) and calls == []
