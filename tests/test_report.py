"""The shareable report and the export/import of runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from diagnostics.cli import main
from diagnostics.engine import PositionRecord
from diagnostics.models import load_model
from diagnostics.report import build_report
from diagnostics.runner import RunRequest, compare_rules
from diagnostics.store import Store, StoreError, export_runs, import_runs


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    target = load_model(save_tiny_model(folder / "tiny", seed=0))
    store = Store(folder / "runs.duckdb")
    base = {"prompt": "w1 w2 w3 w1 w2", "draft": "ngram:2", "gamma": 3, "max_new_tokens": 14, "seed": 5, "raw": True}
    group_id, results, _ = compare_rules(store, target, "ngram:2", [RunRequest(rule=r, **base) for r in ("lossless", "cascade:0.5")])
    return store, [run_id for run_id, _ in results]


def test_report_is_self_contained_and_offline(group) -> None:
    store, run_ids = group
    text = build_report(store, run_ids)
    assert text.count("<script") == 1 + len(run_ids)  # plotly.js once, then one small script per figure
    # plotly.js itself mentions URLs in strings (map tiles, its logo); the page around it must not load any.
    page = re.sub(r"<script>.*?</script>", "", text, count=1, flags=re.S)
    assert not re.search(r"""(src|href)=["']https?://""", page), "the report must not load anything from the network"
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert "lossless" in text and "cascade:0.5" in text and "--seed 5" in text
    assert text.count('data-position="') == 28


def test_report_escapes_untrusted_text(tmp_path: Path) -> None:
    store = Store(tmp_path / "runs.duckdb")
    run_id = store.start_run({"prompt": "<script>alert(1)</script>", "rule": "lossless", "target": "t", "draft": "ngram:2",
                              "policy": "{}", "draft_policy": "{}", "gamma": 4, "seed": 0, "max_new_tokens": 1})
    store.add_positions(run_id, [PositionRecord(
        position=0, block=0, index_in_block=0, kind="bonus", token=5, draft_token=None, p_token=1.0, p_draft=None,
        q_draft=None, accept_prob=None, u_draft=None, u_accept=None, u_fallback=0.3, p_top_ids=[5], p_top_probs=[1.0],
        p_tail=0.0, token_text="<img src=x onerror=alert(1)>")])
    store.finish_run(run_id, "complete", {"output_text": "</pre><script>alert(3)</script>"})
    text = build_report(store, [run_id])
    body = text.split("</head>", 1)[1]
    assert "<script>alert" not in body and "<img" not in body and "&lt;script&gt;" in body


def test_report_shows_control_characters_visibly(tmp_path: Path) -> None:
    """ESC, NUL and a right-to-left override in the prompt and the model names reach the report as
    visible escapes (as the token strip shows them), in the prompt block and the meta lines."""
    store = Store(tmp_path / "runs.duckdb")
    run_id = store.start_run({"prompt": "line one\n\tcafé \x1b[2J \x00 \u202eevil", "rule": "lossless", "target": "t\x1b]0;x\x07",
                              "draft": "ngram:2", "policy": "{}", "draft_policy": "{}", "gamma": 4, "seed": 0, "max_new_tokens": 1})
    store.finish_run(run_id, "complete")
    body = build_report(store, [run_id]).split("</head>", 1)[1]
    assert not any(char in body for char in "\x1b\x00\u202e\x07")
    assert "line one\n\tcafé \\x1b[2J \\x00 \\u202eevil" in body  # newlines and tabs kept in the prompt block
    assert "target t\\x1b]0;x\\x07" in body


def test_report_command_writes_the_same_file(group, tmp_path: Path, capsys) -> None:
    store, run_ids = group
    output = tmp_path / "report.html"
    assert main(["report", *run_ids, "--db", str(store.path), "-o", str(output)]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["bytes"] == len(output.read_bytes()) and output.stat().st_size < 6_000_000
    assert main(["report", "missing", "--db", str(store.path), "-o", str(output)]) == 2


@pytest.mark.parametrize("fmt", ["duckdb", "parquet"])
def test_export_then_import_read_only(group, tmp_path: Path, fmt: str) -> None:
    store, run_ids = group
    exported = export_runs(store, run_ids[:1], tmp_path / f"share.{fmt}", fmt)
    shared = import_runs(exported, tmp_path / "imported.duckdb")
    assert shared.read_only
    runs = shared.list_runs()
    assert list(runs["run_id"]) == run_ids[:1]
    assert len(shared.positions(run_ids[0])) == len(store.positions(run_ids[0]))
    assert shared.get_run(run_ids[0])["tokens"] == store.get_run(run_ids[0])["tokens"]
    with pytest.raises(StoreError, match="read-only"):
        shared.delete_runs(run_ids[:1])


def test_import_refuses_a_foreign_file(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.parquet"
    bogus.write_bytes(b"PAR1 nothing")
    with pytest.raises(StoreError, match="not a Parquet export"):
        import_runs(bogus, tmp_path / "x.duckdb")


def test_report_carries_the_runs_audits_escaped(tmp_path: Path, capsys) -> None:
    """A run's stored audits appear in its report; an audit alone makes a report too; untrusted text stays inert."""
    from diagnostics.audit import audit_recorded_run, audit_rule, battery, rule_adapter
    from diagnostics.audit.reporting import summary_line

    target_folder = save_tiny_model(tmp_path / "tiny", seed=0)
    store = Store(tmp_path / "runs.duckdb")
    _, results, _ = compare_rules(store, load_model(target_folder), "ngram:2",
                                  [RunRequest(prompt="w1 w2 w3 w1", draft="ngram:2", gamma=2, max_new_tokens=8, seed=1, raw=True)])
    run_id = results[0][0]
    recorded = audit_recorded_run(store, run_id, load_model(target_folder)).as_dict()
    linked = store.add_audit(recorded, summary_line(recorded))
    pairs = battery(seed=0)[:2]
    pairs[0] = ("<img src=x onerror=alert(7)>", pairs[0][1], pairs[0][2])
    rule = audit_rule(rule_adapter("lossless"), pairs, n=5_000, implementation="<script>alert(8)</script>").as_dict()
    alone = store.add_audit(rule, summary_line(rule))
    text = build_report(store, [run_id])
    assert "Losslessness audits" in text and linked in text and alone not in text
    text = build_report(store, [], [alone])
    assert "onerror=alert(7)" not in text.replace("&lt;img src=x onerror=alert(7)&gt;", "")
    assert "<script>alert(8)" not in text and "&lt;script&gt;alert(8)" in text
    assert text.count("<script") == 2  # plotly.js and the audit's chart
    out = tmp_path / "audit.html"
    assert main(["report", "--audit", alone, "--db", str(store.path), "-o", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["audits"] == [alone] and out.stat().st_size > 1_000_000
    assert main(["report", "--audit", "nope", "--db", str(store.path), "-o", str(out)]) == 2
