"""The verdict table (``python -m diagnostics verdicts``) end to end on tiny models: one real engine's
row (transformers' assisted generation) with its control, resume, the README copy, imports of
tables made elsewhere, and the planted-bug engines coming out ``fail`` through the same path.

Sizes: a row's sides get the tokens that detect a PIT-law TV of ``--detect-tv`` at 90% power:
906 tokens at 0.1 (about 80 generations of 12 tokens, 10 s here), 3,626 at 0.05 for the planted
bug that shifts the law least (the swapped KV cache: at 0.1 it passed here), 0.1 for the others.
Rows with the same control (plain sampling in our engine) share its file and its audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from diagnostics.cli import main
from diagnostics.engine import eos_ids
from diagnostics.models import load_model
from diagnostics.store import Store
from diagnostics.verdicts.render import END, START, display_rows, markdown_table
from diagnostics.verdicts.table import CONTROL_FAILED, check_table, evidence_file, reaudit_side, row_verdict, sha256

PROMPT = "w1 w2 w3 w1 w2"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verdict-models")
    return save_tiny_model(folder / "target", seed=0, vocab=12), save_tiny_model(folder / "draft", seed=1, vocab=12)


def _verdicts(models, tmp_path: Path, *extra: str) -> list[str]:
    target, draft = models
    return ["verdicts", "--target", target, "--draft", draft, "--prompt", PROMPT, "--max-tokens", "12",
            "--out", str(tmp_path / "verdicts.json"), "--evidence", str(tmp_path / "evidence"),
            "--db", str(tmp_path / "audits.duckdb"), *extra]


def _rows(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]


@pytest.mark.slow  # slow tier: the verdict table's CI row, end to end (about 25 s)
def test_a_real_engines_row_end_to_end_with_its_control_evidence_and_resume(models, tmp_path: Path, capsys) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{START}\nold table\n{END}\nafter\n")
    command = _verdicts(models, tmp_path, "--engine", "transformers-assistant", "--policy", "t1", "--detect-tv", "0.1",
                        "--readme", str(readme))
    assert main(command) == 0
    [line] = _rows(capsys)
    assert line["engine"] == "transformers-assistant" and line["verdict"] == "pass" and line["control"] == "pass"
    table = json.loads((tmp_path / "verdicts.json").read_text())
    assert check_table(table) is None
    [row] = table["rows"]
    assert row["version"].startswith("transformers ") and row["settings"]["num_assistant_tokens"] == 4
    assert row["settings"]["temperature"] == 1.0 and row["settings"]["top_k"] is None and row["settings"]["prompts"] == [PROMPT]
    # transformers' own counters prove speculation ran on the on side (the control keeps none)
    counts = row["on"]["speculation"]
    assert counts["generations"] == row["on"]["generations"] and 0 < counts["accepted"] <= counts["drafted"], counts
    assert "speculation" not in row["off"]
    store = Store(tmp_path / "audits.duckdb", read_only=True)
    for side, speculative in (("on", True), ("off", False)):
        evidence = row[side]
        path = tmp_path / "evidence" / evidence["file"]
        assert sha256(path) == evidence["sha256"] and evidence["tokens"] >= 906 and evidence["detectable_tv"] <= 0.1
        lines = [json.loads(text) for text in path.read_text().splitlines()]
        assert {item["speculative"] for item in lines} == {speculative} and all(item["max_tokens"] == 12 for item in lines)
        assert store.get_audit(evidence["audit_id"])["evidence"]["verdict"] == evidence["verdict"]
    # Anyone can audit a side's committed evidence again: the same file and test give the same verdict and p.
    target_model = load_model(models[0])
    again = reaudit_side(row, "on", tmp_path / "evidence", target_model, eos_ids(target_model, None))
    assert (again["verdict"], again["p_value"], again["tokens"]) == (row["on"]["verdict"], row["on"]["p_value"], row["on"]["tokens"])
    with pytest.raises(ValueError, match="names no evidence file"):
        evidence_file({**row, "off": {**row["off"], "file": "../verdicts.json"}}, "off", tmp_path / "evidence")
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# Title\n\nbefore\n") and text.endswith(f"{END}\nafter\n")
    assert "transformers generate, assistant model" in text and "| pass |" in text
    # Resume: the row's evidence is unchanged, so nothing runs again.
    assert main(command) == 0
    assert "kept (pass), its evidence unchanged" in capsys.readouterr().err
    # A row made before the table kept counters gets them by replaying its first generations (each
    # must give its stored tokens); the evidence and the verdict stay as they were.
    from diagnostics.verdicts.table_file import load_table, save_table

    older = load_table(tmp_path / "verdicts.json")
    del older["rows"][0]["on"]["speculation"]
    save_table(tmp_path / "verdicts.json", older)
    assert main([*command, "--count-drafts", "8"]) == 0
    assert "over 8 replayed generations, each the stored tokens" in capsys.readouterr().err
    [replayed] = json.loads((tmp_path / "verdicts.json").read_text())["rows"]
    counted = replayed["on"].pop("speculation")
    assert counted["generations"] == 8 and 0 < counted["accepted"] <= counted["drafted"] and "replayed on 8 of" in counted["source"]
    assert replayed["on"] == {name: value for name, value in row["on"].items() if name != "speculation"}
    assert replayed["verdict"] == row["verdict"]
    # A changed evidence file is not trusted: the row is made again from what the file holds.
    on_file = tmp_path / "evidence" / row["on"]["file"]
    made_by_workers = on_file.read_text().splitlines()
    on_file.write_text("".join(line + "\n" for line in made_by_workers[:10]))
    with pytest.raises(ValueError, match="changed since the verdict was made"):
        evidence_file(row, "on", tmp_path / "evidence")
    assert main([*command, "--workers", "1"]) == 0
    assert "kept" not in capsys.readouterr().err
    again = json.loads((tmp_path / "verdicts.json").read_text())["rows"][0]
    assert again["on"]["sha256"] == sha256(on_file) != row["on"]["sha256"] and again["on"]["tokens"] >= 906
    # A file made under other settings is not continued: one line, nothing changed.
    before = on_file.read_bytes()
    assert main([*command, "--max-tokens", "10", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "was made with other settings" in err and on_file.read_bytes() == before
    # Continued from seed 10 in this process: each seed's generation is the one the two workers made.
    continued = on_file.read_text().splitlines()
    assert continued == made_by_workers[: len(continued)] and len(continued) > 10


@pytest.mark.slow  # slow tier: each planted engine bug through the table (about 20 s)
def test_every_planted_engine_bug_fails_through_the_table(models, tmp_path: Path, capsys) -> None:
    from diagnostics.audit import BATCH_MUTANTS, ENGINE_MUTANTS

    subtle = "mutant:row_cache_swapped"  # shifts the law by less than 0.1 here: sized for 0.05
    others = ",".join(f"mutant:{name}" for name in {**ENGINE_MUTANTS, **BATCH_MUTANTS} if f"mutant:{name}" != subtle)
    assert main(_verdicts(models, tmp_path, "--engine", others, "--detect-tv", "0.1", "--readme", "none")) == 0
    capsys.readouterr()
    first = json.loads((tmp_path / "verdicts.json").read_text())["rows"]
    shared = {(row["off"]["file"], row["off"]["audit_id"]) for row in first if row["policy"] == "t1"}
    assert len(shared) == 1 and len([row for row in first if row["policy"] == "t1"]) == 3  # one control, audited once
    assert main(_verdicts(models, tmp_path, "--engine", subtle, "--detect-tv", "0.05", "--readme", "none")) == 0
    rows = {row["engine"]: {"verdict": row["verdict"], "control": row["off"]["verdict"]}
            for row in json.loads((tmp_path / "verdicts.json").read_text())["rows"]}
    assert set(rows) == {f"mutant:{name}" for name in {**ENGINE_MUTANTS, **BATCH_MUTANTS}}
    assert {name: row["verdict"] for name, row in rows.items()} == {name: "fail" for name in rows}
    assert all(row["control"] == "pass" for row in rows.values())  # speculation off: the same engine without the bug path


def test_a_failed_control_is_not_blamed_on_speculation() -> None:
    assert row_verdict({"verdict": "fail"}, {"verdict": "fail"}) == CONTROL_FAILED
    assert row_verdict({"verdict": "pass"}, {"verdict": "fail"}) == CONTROL_FAILED
    assert row_verdict({"verdict": "fail"}, {"verdict": "pass"}) == "fail"
    assert row_verdict({"verdict": "inconclusive"}, {"verdict": "inconclusive"}) == "inconclusive"


def _side(**changes) -> dict:
    return {"verdict": "pass", "p_value": 0.4, "tokens": 1000, "detectable_tv": 0.08, "distortion": 0.0, "distortion_low": 0.0,
            "distortion_high": 0.02, "file": "x.jsonl", "sha256": "ab" * 32, "audit_id": None, **changes}


def _table(**changes) -> dict:
    row = {"engine": "vllm-eagle3", "label": "vLLM, EAGLE-3", "version": "vllm 0.9.1", "policy": "t1", "verdict": "pass",
           "settings": {"temperature": 1.0, "top_k": None}, "on": _side(), "off": _side(), "provenance": "run here", **changes}
    return {"rows": [row]}


def test_a_side_failed_by_impossible_tokens_says_so_beside_its_p_value() -> None:
    # A side with tokens of probability 0 fails whatever its PIT p-value says: the cell must say why.
    table = _table(verdict=CONTROL_FAILED, on=_side(verdict="fail", p_value=0.7, impossible=32),
                   off=_side(verdict="fail", p_value=0.6, impossible=30))
    [row] = display_rows(table)
    assert row["p"] == "0.7 · 32 impossible tokens"
    assert row["control (off)"] == "fail (p 0.6 · 30 impossible tokens)"
    assert display_rows(_table())[0]["p"] == "0.4"  # none impossible: the p-value alone


def test_a_table_from_elsewhere_is_imported_with_its_origin_and_runs_nothing(tmp_path: Path, capsys) -> None:
    source = tmp_path / "gpu-row.json"
    source.write_text(json.dumps(_table(label="vLLM [click](http://evil) | <b>x</b>")))
    out = tmp_path / "verdicts.json"
    assert main(["verdicts", "--import", str(source), "--out", str(out), "--readme", "none"]) == 0
    [line] = _rows(capsys)
    assert line["provenance"] == f"imported from gpu-row.json (sha256 {sha256(source)[:12]})"
    markdown = markdown_table(json.loads(out.read_text()))
    # A link GitHub would form from the text: shown literally as code spans, the pipe escaped between them (one cell).
    assert "| ` vLLM [click](http://evil)  `\\|`  <b>x</b> ` |" in markdown
    plain = markdown_table(_table(label="vLLM [click] (x) | <b>x</b>"))  # text alone: Markdown's punctuation escaped
    assert "| vLLM \\[click\\] \\(x\\) \\| \\<b\\>x\\</b\\> |" in plain
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    detail_header = next(line for line in rows if "| policy |" in line)
    assert rows[-1].count(" | ") == detail_header.count(" | ")  # the escaped pipe splits no cell of the detail table
    # A report can carry the table: escaped there too.
    Store(tmp_path / "runs.duckdb")
    assert main(["report", "--verdicts", str(out), "--db", str(tmp_path / "runs.duckdb"), "-o", str(tmp_path / "r.html")]) == 0
    report = (tmp_path / "r.html").read_text()
    assert "Verdicts on real engines" in report and "&lt;b&gt;x&lt;/b&gt;" in report and "<b>x" not in report
    assert "imported from gpu-row.json" in report


@pytest.mark.parametrize("table, fragment", [
    (_table(verdict="looks fine"), "verdict 'looks fine' is not one of"),
    (_table(on=_side(p_value=float("nan"))), "NaN is not a JSON number"),
    (_table(on=_side(p_value="0.4")), "on.p_value must be a number in [0, 1]"),
    (_table(off="fail"), "off (speculation off) must be an object"),
    ({"rows": "x"}, "not a verdict table"),
    ("[" * 10_000, "nest"),
])
def test_a_bad_table_is_refused_in_one_line_and_the_table_is_left_alone(tmp_path: Path, capsys, table, fragment) -> None:
    source, out = tmp_path / "bad.json", tmp_path / "verdicts.json"
    source.write_text(table if isinstance(table, str) else json.dumps(table, allow_nan=True))
    out.write_text(json.dumps(_table()))
    before = out.read_bytes()
    assert main(["verdicts", "--import", str(source), "--out", str(out), "--readme", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert out.read_bytes() == before


@pytest.mark.parametrize("extra, fragment", [
    (["--engine", "nope"], "unknown engine 'nope'"),
    (["--policy", "t2"], "unknown policy t2"),
    (["--endpoint", "http://127.0.0.1:9"], "an endpoint row needs"),
    (["--detect-tv", "2"], "--detect-tv and --level"),
])
def test_bad_options_are_one_line(models, tmp_path: Path, capsys, extra, fragment) -> None:
    assert main(_verdicts(models, tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "verdicts.json").exists()


@pytest.mark.slow  # slow tier: a served row audited against the server's scores (about 12 s)
def test_an_endpoint_row_audited_against_the_servers_own_scores(tmp_path: Path, capsys) -> None:
    """A GPU user's row (``--endpoint``, ``--oracle server``) on a fake vLLM over the tiny target:
    no local copy of the model is loaded, the server tokenizes and its prompt log-probs are the oracle."""
    from fake_vllm import fake_vllm_server

    from diagnostics.audit.suite import tiny_setup

    with fake_vllm_server(tiny_setup().target) as url:
        code = main(["verdicts", "--endpoint", url, "--baseline-endpoint", url, "--model", "tiny", "--label", "fake vLLM, EAGLE",
                     "--version", "fakevllm 1.0", "--settings", '{"method": "eagle", "num_speculative_tokens": 3}',
                     "--oracle", "server", "--score-logprobs", "12", "--policy", "t1", "--prompt", "1 2 3 4", "--prompt", "5 6 7",
                     "--max-tokens", "12", "--detect-tv", "0.1", "--out", str(tmp_path / "verdicts.json"),
                     "--evidence", str(tmp_path / "evidence"), "--db", str(tmp_path / "audits.duckdb"), "--readme", "none"])
    assert code == 0, capsys.readouterr().err
    [row] = json.loads((tmp_path / "verdicts.json").read_text())["rows"]
    assert row["engine"] == "endpoint" and row["label"] == "fake vLLM, EAGLE" and row["version"] == "fakevllm 1.0"
    assert row["verdict"] == "pass" and row["off"]["verdict"] == "pass" and row["on"]["tokens"] >= 906
    assert row["oracle"] == "the server's own scores (vllm)" and row["settings"]["num_speculative_tokens"] == 3
    lines = [json.loads(text) for text in (tmp_path / "evidence" / row["on"]["file"]).read_text().splitlines()]
    assert all(line["scores"] and len(line["scores"]) == len(line["token_ids"]) for line in lines)


def test_lines_the_audit_leaves_out_are_made_up_for(tmp_path: Path) -> None:
    """A server row whose texts do not all tokenise back (left out by the audit) is filled further
    until the audited tokens reach the figure the row is sized by, not left 'inconclusive'."""
    from diagnostics.audit.samples import Sample
    from diagnostics.policy import Policy
    from diagnostics.verdicts.engines import EngineRow
    from diagnostics.verdicts.table import Job, needed_tokens, run_row

    def collect(speculative: bool):
        return lambda text, ids, seeds: [Sample(prompt=text, token_ids=[1] * 10, temperature=1.0, prompt_ids=list(ids),
                                                speculative=speculative, seed=seed, max_tokens=10) for seed in seeds]

    def auditor(samples, source) -> dict:  # every fifth line left out, as a retokenised text can be
        tokens = sum(len(sample.token_ids) for index, sample in enumerate(samples) if index % 5)
        return {"verdict": "pass", "tokens": tokens, "p_value": 0.5}

    row = EngineRow("server-x", "a server", "server")
    jobs = [Job(row, "t1", Policy(), on, [("p", [1, 2])], 10, tmp_path / f"{on}.jsonl", "ctl", collect=collect(on))
            for on in (True, False)]
    result = run_row(*jobs, auditor, set(), detect_tv=0.1, level=0.01, store=None, version="x", target_name="t")
    assert result["on"]["tokens"] >= needed_tokens(0.1) and result["off"]["tokens"] >= needed_tokens(0.1)


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (read from /proc: no extra package)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


@pytest.mark.slow  # slow tier: a table run killed mid-row and continued (about 22 s)
def test_a_killed_table_run_stops_its_workers_keeps_its_files_and_continues(models, tmp_path: Path) -> None:
    """SIGTERM unwinds like Ctrl-C: exit 130 in seconds, the worker processes gone, every line of the
    side's file whole, and the same command continues the file (not starting it again)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    command = [sys.executable, "-m", "diagnostics", *_verdicts(models, tmp_path, "--engine", "transformers-assistant", "--policy",
                                                                "t1", "--detect-tv", "0.02", "--readme", "none", "--workers", "2")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    on_file = tmp_path / "evidence" / "transformers-assistant--t1--on.jsonl"
    deadline = time.monotonic() + 300
    while not (on_file.exists() and on_file.read_text().count("\n") >= 32):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.5)
    workers = _children(process.pid)
    assert len(workers) >= 2  # the spawned pool (and its resource tracker)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "the same command continues them" in err, err[-2000:]
    time.sleep(1)
    assert not [pid for pid in workers if _alive(pid)]
    kept = on_file.read_text().splitlines()
    assert all(json.loads(line)["speculative"] for line in kept)  # whole lines only
    # Continued, not restarted: the lines written before the kill stay first.
    assert main(_verdicts(models, tmp_path, "--engine", "transformers-assistant", "--policy", "t1", "--detect-tv", "0.1",
                          "--readme", "none", "--workers", "1")) == 0
    assert on_file.read_text().splitlines()[: len(kept)] == kept


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended
