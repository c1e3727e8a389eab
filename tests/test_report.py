"""The shareable report and the export/import of runs."""

from __future__ import annotations

import html
import json
import re
import shlex
from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from diagnostics.cli import main
from diagnostics.engine import PositionRecord
from diagnostics.models import load_model
from diagnostics.report import build_report
from diagnostics.comparison import compare_rules
from diagnostics.runner import RunRequest
from diagnostics.store import Store, StoreError, complete_groups, export_runs, import_runs


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
    diverges = store.get_run(run_ids[1])["divergence_position"] is not None  # then the why chart too
    assert text.count("<script") == 1 + len(run_ids) + diverges  # plotly.js once, then one small script per figure
    # plotly.js itself mentions URLs in strings (map tiles, its logo); the page around it must not load any.
    page = re.sub(r"<script>.*?</script>", "", text, count=1, flags=re.S)
    assert not re.search(r"""(src|href)=["']https?://""", page), "the report must not load anything from the network"
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert "lossless" in text and "cascade:0.5" in text and "seed 5" in text
    for run_id in run_ids:
        assert f"python -m diagnostics run --replay {run_id} --db runs.duckdb</code>" in text  # the base name only
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
    assert sorted(runs["run_id"]) == sorted(run_ids)  # the reference brings its group along
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


def _summary_rows(text: str) -> list[list[str]]:
    """The cells of the report's summary table (the one headed 'run', 'rule', 'first divergence')."""
    table = re.search(r"<table><tr><th>run</th><th>rule</th>.*?</table>", text, flags=re.S).group(0)
    rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]
    return [re.findall(r"<td>(.*?)</td>", row, flags=re.S) for row in rows]


def test_a_group_report_names_each_run_and_its_reference(group) -> None:
    """The reference row says 'reference'; every row names its run; asked for one member, the report
    brings the whole group (reference first) and says which runs it added."""
    store, run_ids = group
    for asked in (run_ids, run_ids[::-1], run_ids[1:]):
        text = build_report(store, asked)
        rows = _summary_rows(text)
        assert [row[0] for row in rows] == run_ids, asked
        assert rows[0][1:4] == ["lossless", "5", "reference"] and rows[1][1:3] == ["cascade:0.5", "5"] and rows[1][3] != "reference"
        assert "first divergence from the first run" not in text
        assert text.count("reference run of group ") == 1
        divergence = store.get_run(run_ids[1])["divergence_position"]
        sentence = (f"first divergence from the reference run {run_ids[0]} of group" if divergence is not None
                    else f"no divergence from the reference run {run_ids[0]} of group")
        assert sentence in text
        assert ("added 1 run of group" in text) == (asked == run_ids[1:])
    assert complete_groups(store, run_ids[1:]).notes("reported") == [
        f"added 1 run of group {store.get_run(run_ids[0])['group_id']} ({run_ids[0]}) so the group is reported whole"]


def test_the_report_command_says_which_runs_it_added(group, tmp_path: Path, capsys) -> None:
    store, run_ids = group
    output = tmp_path / "one.html"
    assert main(["report", run_ids[1], "--db", str(store.path), "-o", str(output)]) == 0
    captured = capsys.readouterr()
    written = json.loads(captured.out)
    group_id = store.get_run(run_ids[0])["group_id"]
    assert written["runs"] == run_ids and written["added_for_groups"] == {group_id: [run_ids[0]]}
    assert captured.err == f"note: added 1 run of group {group_id} ({run_ids[0]}) so the group is reported whole\n"


def test_the_reproduce_line_is_quoted_for_the_shell_and_escaped(tmp_path: Path) -> None:
    """A run id and a database path with quotes, markup and a leading dash reach the report
    shell-quoted and then HTML-escaped."""
    import duckdb

    db = tmp_path / "it's <b>mine</b>.duckdb"
    store = Store(db)
    run_id = store.start_run({"prompt": "p", "rule": "lossless", "target": "t", "draft": "ngram:2", "policy": "{}",
                              "draft_policy": "{}", "gamma": 4, "seed": 0, "max_new_tokens": 1})
    store.finish_run(run_id, "complete")
    hostile = "-x'; rm -rf ~ <script>alert(1)</script>"
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET run_id = ? WHERE run_id = ?", [hostile, run_id])
    text = build_report(store, [hostile])
    command = f"python -m diagnostics run --replay={shlex.quote(hostile)} --db {shlex.quote(db.name)}"
    assert f"<code>{html.escape(command)}</code>" in text
    from diagnostics.cli import build_parser

    parsed = build_parser().parse_args(shlex.split(command)[3:])  # what the shell hands the CLI
    assert parsed.replay == hostile and parsed.db == db.name
    assert "<script>alert(1)" not in text.split("</head>", 1)[1]


@pytest.mark.parametrize("fmt", ["duckdb", "parquet"])
def test_exporting_one_member_exports_its_whole_group(group, tmp_path: Path, fmt: str) -> None:
    """The file never claims a divergence from a reference it does not hold."""
    store, run_ids = group
    completion = complete_groups(store, run_ids[1:])
    assert completion.run_ids == run_ids and list(completion.added.values()) == [run_ids[:1]]
    exported = export_runs(store, run_ids[1:], tmp_path / f"member.{fmt}", fmt)
    shared = import_runs(exported, tmp_path / "imported.duckdb")
    assert sorted(shared.list_runs()["run_id"]) == sorted(run_ids)
    group_id = store.get_run(run_ids[0])["group_id"]
    assert shared.group(group_id)["run_id"].tolist() == run_ids
    for run_id in run_ids:
        assert len(shared.positions(run_id)) == len(store.positions(run_id))
    assert _summary_rows(build_report(shared, run_ids[1:]))[0][:4] == [run_ids[0], "lossless", "5", "reference"]


def _run_sections(text: str) -> dict[str, str]:
    """Each run's section of a report, by run id (its heading says ``run ID``)."""
    sections = re.findall(r'<section class="run">\s*<h2>.*?</section>', text, flags=re.S)
    return {re.search(r"<small>run (\S+) ·", section).group(1): section for section in sections if "<small>run " in section}


def test_a_two_seed_group_report_tells_each_run_against_its_own_seed_and_nothing_of_this_machine(tmp_path: Path, capsys) -> None:
    """``compare --seeds 3-4`` then ``report``: each run is told against its own seed's reference
    (divergence recomputed from the positions and equal to what the group stored per seed), the
    summary has a seed column, each diverging run carries the Compare page's why chart, and no
    absolute path, home folder, user or host name of this machine is anywhere in the HTML.

    Negative control: before the fix the report took the group's first run as every run's
    reference, so every seed-4 section said "... from the reference run <seed 3's lossless run>"
    (asserted absent below), the summary had no seed column (its third cell was the divergence),
    there was no why chart, and the target's folder and the database's absolute path (both under
    ``tmp_path``, whose name carries the user name) were printed verbatim."""
    import getpass
    import socket

    from plotly.offline import get_plotlyjs

    from diagnostics.comparison import plan_group, run_group

    target_folder = save_tiny_model(tmp_path / "models" / "tiny", seed=0)
    db = tmp_path / "data" / "runs.duckdb"
    db.parent.mkdir()
    store = Store(db)
    requests = plan_group("lossless, lenience:0.5", [3, 4], RunRequest(prompt="w1 w2 w3 w1 w2", draft="ngram:2", gamma=3,
                                                                      max_new_tokens=12, raw=True))
    group_id, results, stored = run_group(store, load_model(target_folder), "ngram:2", requests)
    run_ids = [run_id for run_id, _ in results]
    seeds = [request.seed for request in requests]
    references = {3: run_ids[0], 4: run_ids[2]}
    diverging = [run_id for run_id in run_ids if stored[run_id] is not None]
    assert diverging, "the fixture must have a run that leaves its reference (else there is no why chart to check)"
    assert store.get_run(run_ids[0])["target"] == target_folder and str(tmp_path) in target_folder  # the input is hostile

    output = tmp_path / "report.html"
    assert main(["report", run_ids[3], "--db", str(db), "-o", str(output)]) == 0
    capsys.readouterr()
    text = output.read_text(encoding="utf-8")

    rows = _summary_rows(text)
    assert [row[:3] for row in rows] == [[run_id, request.rule, str(request.seed)] for run_id, request in zip(run_ids, requests)]
    sections = _run_sections(text)
    assert list(sections) == run_ids
    for run_id, seed, row in zip(run_ids, seeds, rows):
        meta = re.search(r'<p class="meta">target .*?</p>', sections[run_id], flags=re.S).group(0)
        other = references[7 - seed]
        assert other not in meta, f"seed {seed}'s run {run_id} names the other seed's reference"
        if run_id == references[seed]:
            assert row[3] == "reference" and f"reference run of group {group_id} at seed {seed}" in meta
            continue
        where = f"the reference run {references[seed]} of group {group_id} at seed {seed}"
        position = stored[run_id]
        assert row[3] == ("never" if position is None else str(position))
        assert (f"no divergence from {where}" if position is None else f"first divergence from {where}: {position}") in meta
        why = f"Why it leaves the reference lossless at position {position}"
        assert (why in sections[run_id]) == (position is not None)
        if position is not None:  # the chart itself: a plotly div with the page's two panels
            assert re.search(r'<div id="why-\d+"', sections[run_id]) and "a(x) of the draft vs the coin u" in sections[run_id]
    assert text.count('<div id="why-') == len(diverging)

    # Nothing of this machine: tmp_path (which holds the model folder and the database) nowhere at all;
    # the home folder, user and host name nowhere outside plotly.js (a fixed bundle, the same on every
    # machine, whose code has words like "root" and "vm").
    assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text
    bundle = get_plotlyjs()
    assert text.count(bundle) == 1
    page = text.replace(bundle, "")
    assert str(Path.home()) + "/" not in page and not re.search(rf"{re.escape(str(Path.home()))}\b", page)
    for word in (getpass.getuser(), socket.gethostname()):
        assert not re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", page, flags=re.I), word
    assert "target …/tiny" in text
    assert all(f"--replay {run_id} --db runs.duckdb</code>" in text for run_id in run_ids)
    assert "Reproduce lines name the runs file runs.duckdb" in text


def test_machine_free_cuts_paths_and_urls_but_leaves_specs_alone() -> None:
    """Paths of every form lose all but their last part, URLs their host; rule specs, ratios and
    relative names stay as written."""
    from diagnostics.shareable import machine_free

    cases = {
        "/home/alice/models/tiny": "…/tiny",
        "/home/alice/My Models/<img src=x> tiny (v2).jsonl": "…/<img src=x> tiny (v2).jsonl",  # one path as a whole: its name kept whole
        "cannot load '/home/alice/m' (no config)": "cannot load '…/m' (no config)",
        "model:/home/alice/draft/": "model:…/draft",
        "see ~/models/x and ~bob/y/z": "see …/x and …/z",
        "~/models/x": "…/x",
        r"C:\Users\alice\runs.duckdb": "…/runs.duckdb",
        r"\\fileserver\share\m": "…/m",
        "http://alice-laptop.local:8080/v1/completions": "http://…",
        "lenience:0.5, medusa:0.09,0.3 · 1/2 · data/runs.duckdb · early-exit:1": "lenience:0.5, medusa:0.09,0.3 · 1/2 · data/runs.duckdb · early-exit:1",
    }
    for text, expected in cases.items():
        assert machine_free(text) == expected, text


def test_the_reproduce_line_names_no_user_or_host(tmp_path: Path) -> None:
    """A database named after the user or the host is named by the placeholder instead."""
    import getpass
    import socket

    from diagnostics.shareable import SHARED_DB_NAME, shared_db_name

    assert shared_db_name(tmp_path / "mine.duckdb") == "mine.duckdb"
    assert shared_db_name(tmp_path / f"{getpass.getuser()}-runs.duckdb") == SHARED_DB_NAME
    assert shared_db_name(tmp_path / f"runs.{socket.gethostname()}.duckdb") == SHARED_DB_NAME


def test_a_chain_vs_tree_group_report_draws_each_runs_node_at_the_divergence(tmp_path: Path) -> None:
    """A group comparing a chain and a tree: the why part shows each run's own decision there (the
    chain's step, the tree's candidates in the order tried), one chart per run, as the Compare page."""
    from dataclasses import replace

    from diagnostics.comparison import plan_group, run_group

    store = Store(tmp_path / "runs.duckdb")
    chain = plan_group("lossless, lenience:0.5", [3], RunRequest(prompt="w1 w2 w3 w1 w2", draft="early-exit:1", gamma=3,
                                                                  max_new_tokens=12, raw=True))
    requests = [chain[0], replace(chain[1], tree="3,2")]
    _, results, stored = run_group(store, load_model(save_tiny_model(tmp_path / "tiny", seed=0)), "early-exit:1", requests)
    tree_run = results[1][0]
    assert stored[tree_run] is not None, "the fixture's tree run must leave the chain"
    section = _run_sections(build_report(store, [tree_run]))[tree_run]
    assert f"Why it leaves the reference lossless at position {stored[tree_run]}" in section
    assert "<h4>lossless · chain γ = 3</h4>" in section and "<h4>lenience:0.5 · tree 3,2</h4>" in section
    assert "lenience:0.5 tries " in section and section.count('<div id="why-') == 2


def test_a_divergence_that_cannot_be_charted_leaves_the_rest_of_the_report(group, monkeypatch) -> None:
    """Positions of a shared file that are valid row by row yet make no step: the why part says so
    in one line and the report is still written (stand-in: the chart function refuses)."""
    import diagnostics.divergence

    store, run_ids = group
    position = store.get_run(run_ids[1])["divergence_position"]
    assert position is not None, "the fixture's second run must leave the reference"

    def refuse(*_args, **_kwargs):
        raise ValueError("the drafted token is not in the stored top-k\nsecond line")

    monkeypatch.setattr(diagnostics.divergence, "divergence_figure", refuse)
    text = build_report(store, run_ids)
    assert "The stored positions there cannot be charted: the drafted token is not in the stored top-k.</p>" in text
    assert "second line" not in text and '<div id="why-' not in text and text.count('<div id="tracks-') == 2


def test_a_report_labels_top_k_neighbours_with_the_embedded_tokenizer() -> None:
    """A token no run emitted or drafted (a neighbour in the stored top-k) was labelled ``id N`` in a
    report of an embedded-model run; the embedded tokenizer (our own file) now names it. A run of
    any other target never makes a report load anything: its neighbours stay ``id N``."""
    import pandas as pd

    from diagnostics.models import EMBEDDED_NAME, embedded_tokenizer
    from diagnostics.report import _stored_decoder

    frame = pd.DataFrame({"token": [504], "token_text": ["stored"], "draft_token": [None], "draft_text": [None]})
    decode = _stored_decoder({"target": EMBEDDED_NAME}, frame)
    assert decode(504) == "stored"  # what the run stored wins
    assert decode(1000) == embedded_tokenizer().decode([1000]) and not decode(1000).startswith("id ")
    assert decode(10**9) == "id 1000000000"  # outside the vocabulary: the id
    other = _stored_decoder({"target": "/somewhere/else"}, frame)
    assert other(1000) == "id 1000" and other(504) == "stored"
