"""Hostile and messy samples files and shared databases (issue 31): each is refused with one line
naming the file and the line (or the audit), stores nothing and leaves the file byte-identical,
or, where the input is only messy (a BOM, text without ids, an engine that overshoots
max_tokens), is audited honestly.

Negative controls, observed before the fixes: a line nested 100,000 deep raised ``RecursionError``
(a traceback, exit 1); a 5,000-digit integer said "Exceeds the limit (4300 digits)" without a
line; a BOM made line 1 "not a JSON object"; a lone surrogate was accepted; an id >= the
vocabulary raised ``IndexError``; ``"text"`` with ``"token_ids": []`` was audited as 0 tokens; the
two-sample audit of two 8,192-token lines peaked at 725 MB (quadratic: 4.7–8.5 GB at 32,768).
The tests below that check mechanics (linear memory, evidence with 2^63) also state what the old
code would have done, in a check that runs here."""

from __future__ import annotations

import hashlib
import json
import os
import math
import random
from collections import Counter
import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest

from diagnostics.audit.reporting import evidence_problem, summary_line
from diagnostics.audit.samples import MAX_TOKENS, Sample, SamplesError, load_samples, retokenize
from diagnostics.audit.two_sample import _context_tests, two_sample_audit
from diagnostics.cli import main
from peak_memory import PEAK_RSS_SOURCE

ROOT = Path(__file__).resolve().parents[1]
PEAK_BYTES = 2 * 2**30  # the bound the issue sets for two 32,768-token lines
WALL_S = 60.0  # "well under 120 s" (the old code took 61 s and 4.7–8.5 GB)


def _line(**fields) -> str:
    return json.dumps({"prompt": "w1 w2", "token_ids": [3, 4], "temperature": 1.0, **fields})


def _file(folder: Path, name: str, lines: list[str], prefix: bytes = b"") -> Path:
    path = folder / name
    path.write_bytes(prefix + "".join(line + "\n" for line in lines).encode("utf-8"))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refused(argv: list[str], files: list[Path], db: Path, capsys) -> str:
    """Run the CLI with ``--save``: exit 2, one ``error:`` line, files unchanged, nothing stored."""
    before = [_sha(path) for path in files]
    assert main(["audit", *argv, "--save", "--db", str(db)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert [_sha(path) for path in files] == before and not db.exists()
    return captured.err


# -- samples lines ------------------------------------------------------------------------------

HOSTILE_LINES = {
    "nested 100,000 deep": ('{"prompt": "a", "token_ids": [1], "temperature": 1, "raw": ' + "[" * 100_000 + "]" * 100_000 + "}",
                            "nested 100001 deep; at most 64"),
    "a 5,000-digit integer": ('{"prompt": "a", "token_ids": [1], "temperature": 1, "seed": ' + "9" * 5000 + "}",
                              "5,000 digits; at most 19"),
    "an id of 2^63": ('{"prompt": "a", "token_ids": [1, 9223372036854775808], "temperature": 1}', "does not fit 64 bits"),
    "a lone surrogate in the prompt": ('{"prompt": "a\\ud800b", "token_ids": [1], "temperature": 1}', "lone UTF-16 surrogate"),
    "a negative prompt id": ('{"prompt": "a", "prompt_ids": [1, -7], "token_ids": [1], "temperature": 1}', "it holds -7"),
    "-inf for every top score": ('{"prompt": "a", "token_ids": [1], "temperature": 1, "scores": '
                                 '[{"logprob": -1, "top": [[1, -Infinity], [2, -9999]]}]}', "log-probability -inf"),
    # Fields that contradict the data: ids "retokenized" from a text the line does not have.
    "retokenized ids without text": ('{"prompt": "a", "token_ids": [1], "temperature": 1, "ids_source": "retokenized"}',
                                     "says its token_ids were retokenized from its text, but it has no text"),
    "an unknown ids_source": ('{"prompt": "a", "token_ids": [1], "temperature": 1, "ids_source": "trust me"}',
                              "'ids_source' must be \"engine\", \"retokenized\" or null"),
}


@pytest.mark.parametrize("name", list(HOSTILE_LINES))
def test_a_hostile_line_is_one_line_naming_file_and_line(name: str, tmp_path: Path, capsys) -> None:
    bad, message = HOSTILE_LINES[name]
    path = _file(tmp_path, "hostile.jsonl", [_line(), bad])
    for argv in (["--samples", str(path), "--baseline-samples", str(path)], ["--samples", str(path), "--oracle", "server"]):
        error = _refused(argv, [path], tmp_path / "runs.duckdb", capsys)
        assert "hostile.jsonl line 2" in error and message in error, error


def test_a_bom_at_the_start_is_accepted(tmp_path: Path, capsys) -> None:
    """Windows editors write one; before, line 1 was "not a JSON object"."""
    lines = [_line(seed=index, token_ids=[1 + index % 3]) for index in range(30)]
    path = _file(tmp_path, "bom.jsonl", lines, prefix=b"\xef\xbb\xbf")
    assert len(load_samples(path)) == 30
    assert main(["audit", "--samples", str(path), "--baseline-samples", str(_file(tmp_path, "b.jsonl", [
        _line(seed=100 + index, token_ids=[1 + index % 3]) for index in range(30)]))]) == 0
    assert json.loads(capsys.readouterr().out)["generations"] == 30


def test_ids_beyond_the_targets_vocabulary_are_refused_before_any_forward(tmp_path: Path, capsys, monkeypatch) -> None:
    """The tiny target reads 12 ids: 12 in line 3 is named, and no forward runs (before: IndexError)."""
    from diagnostics.audit import external

    def no_forward(*_args, **_kwargs):
        raise AssertionError("a forward ran")

    monkeypatch.setattr(external, "teacher_forced_batch", no_forward)
    good = _line(prompt_ids=[1, 2])  # the tiny target has no tokenizer: the engine's prompt ids
    for field, ids in (("token_ids", [3, 12]), ("prompt_ids", [1, 2, 4096])):
        path = _file(tmp_path, f"vocab-{field}.jsonl", [good, good, _line(**{"prompt_ids": [1, 2], field: ids})])
        error = _refused(["--samples", str(path), "--target", "tiny"], [path], tmp_path / "runs.duckdb", capsys)
        bad = ids[-1]
        assert f"vocab-{field}.jsonl line 3: {field} holds the id {bad}, outside the target's vocabulary of 12 ids" in error


# -- text-only lines ----------------------------------------------------------------------------

def _word_tokenize(text: str) -> list[int]:
    """The tiny tokenizer's split (``w3`` -> 3), for the library-level checks."""
    return [int(word[1:]) for word in text.split()]


def test_text_only_lines_are_retokenised_and_miscounted_ones_left_out() -> None:
    samples = [Sample(prompt="w1 w2", token_ids=[], temperature=1.0, text=" w3 w4", where="f line 1"),
               Sample(prompt="w1 w2", token_ids=[], temperature=1.0, text=" w5", completion_tokens=2, where="f line 2"),
               Sample(prompt="w1 w2", token_ids=[7], temperature=1.0, text=" w3", where="f line 3")]
    assert samples[0].text_only and samples[1].text_only and not samples[2].text_only
    assert retokenize(samples, _word_tokenize, eos_id=11) == 2
    assert samples[0].token_ids == [3, 4] and samples[0].ids_source == "retokenized"
    assert samples[1].token_ids == [5] and samples[1].ids_unknown  # the engine said 2 tokens: a non-canonical split
    assert samples[2].token_ids == [7] and samples[2].ids_source is None  # the engine's own ids are kept


def test_retokenize_with_target_names_a_missing_tokenizer_and_uses_one_that_is_there() -> None:
    """One function for the CLI's ``--target`` and the Audit page: a text-only line and a target
    without a tokenizer is refused naming the line and the target (the page used to skip the
    retokenising and fail later with an unrelated message); with one, every group is retokenised."""
    from types import SimpleNamespace

    from diagnostics.audit.samples import retokenize_with_target

    def text_only(where: str) -> Sample:
        return Sample(prompt="w1 w2", token_ids=[], temperature=1.0, text=" w3 w4", where=where)

    no_tokenizer = SimpleNamespace(tokenizer=None)
    assert retokenize_with_target(no_tokenizer, [[Sample(prompt="w1", token_ids=[3], temperature=1.0)]]) == 0  # nothing to do
    for named in ("the target", "--target"):
        with pytest.raises(SamplesError) as refused:
            retokenize_with_target(no_tokenizer, [[], [text_only("f line 4")]], named)
        assert str(refused.value) == (f"f line 4 has text but no token_ids, and {named} has no tokenizer to make them: "
                                      "give token_ids, or a target with its tokenizer")

    class Tokenizer:
        eos_token_id = 11

        def __call__(self, text: str) -> dict:
            return {"input_ids": _word_tokenize(text)}

    groups = [[text_only("a line 1")], [text_only("b line 1")]]
    assert retokenize_with_target(SimpleNamespace(tokenizer=Tokenizer()), groups) == 2
    assert [group[0].token_ids for group in groups] == [[3, 4], [3, 4]]


def test_a_sampled_eos_is_put_back_alike_by_the_collector_and_retokenize() -> None:
    """One rule (``samples.continuation_ids`` then ``with_sampled_eos``) for an answer's text and a
    text-only line: a stop that counted one token more than its text shows ends with the EOS id."""
    from diagnostics.audit.completions import Sampling, sample_from_answer

    for finish, count, expected in (("stop", 3, [3, 4, 11]), ("stop", 2, [3, 4]), ("length", 3, [3, 4]), ("stop", None, [3, 4])):
        answer = {"choices": [{"text": " w3 w4", "finish_reason": finish}]}
        if count is not None:
            answer["usage"] = {"completion_tokens": count}
        collected = sample_from_answer(answer, "w1 w2", Sampling(max_tokens=8), 0, "vllm", None, _word_tokenize, [1, 2], 11)
        line = Sample(prompt="w1 w2", token_ids=[], temperature=1.0, text=" w3 w4", finish_reason=finish,
                      completion_tokens=count, where="f line 1")
        assert retokenize([line], _word_tokenize, eos_id=11) == 1
        assert collected.token_ids == line.token_ids == expected, (finish, count)
        assert collected.ids_source == line.ids_source == "retokenized"


def test_text_only_file_needs_target_and_is_audited_with_its_tokenizer(tmp_path: Path, tiny_folder: str, capsys) -> None:
    lines = [json.dumps({"prompt": "w1 w2", "text": " w3 w4 w5", "token_ids": [], "temperature": 1.0})] * 20
    lines.append(json.dumps({"prompt": "w1 w2", "text": " w3", "completion_tokens": 2, "temperature": 1.0}))
    path = _file(tmp_path, "text.jsonl", lines)
    # Without --target (a baseline needs no weights, but text needs a tokenizer): refused, naming the line.
    error = _refused(["--samples", str(path), "--baseline-samples", str(path)], [path], tmp_path / "runs.duckdb", capsys)
    assert "text.jsonl line 1 has text but no token_ids" in error and "give --target" in error
    # With it: 3 tokens a line (not 0), the miscounted line left out and said.
    assert main(["audit", "--samples", str(path), "--target", tiny_folder]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["generations"] == 20 and result["tokens"] == 60
    assert any(reason.startswith("1 generations left out") for reason in result["reasons"]), result["reasons"]


# -- the two-sample test ------------------------------------------------------------------------

def test_two_single_32768_token_lines_stay_linear_in_memory_and_time(tmp_path: Path) -> None:
    """The issue's input, in a fresh process: peak RSS (imports included) and wall time bounded."""
    rng = random.Random(0)
    files = []
    for name in ("a", "b"):
        files.append(_file(tmp_path, f"{name}.jsonl", [_line(token_ids=[rng.randrange(1, 50) for _ in range(MAX_TOKENS)])]))
    probe = ("import json, sys, time\n" + PEAK_RSS_SOURCE +
             "from diagnostics.cli import main\n"
             "started = time.perf_counter()\n"
             f"code = main(['audit', '--samples', {str(files[0])!r}, '--baseline-samples', {str(files[1])!r}])\n"
             "print(json.dumps({'code': code, 'seconds': time.perf_counter() - started,\n"
             "                  'peak': peak_rss()}), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    measured = json.loads(done.stderr.strip().splitlines()[-1])
    assert measured["code"] == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["verdict"] == "inconclusive"  # one generation a side: nothing testable, said so
    assert measured["peak"] < PEAK_BYTES and measured["seconds"] < WALL_S, measured


def _identical(length: int, generations: int = 20) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    path = tuple(random.Random(1).randrange(100) for _ in range(length))
    return [path] * generations, [path] * generations


def _peak_bytes(function, *args) -> int:
    tracemalloc.start()
    try:
        function(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_prefix_walk_is_linear_where_every_context_is_reached() -> None:
    """Forty generations sharing one path reach every depth: the walk holds one level's groups
    (references to the paths), so its own memory does not grow with the length. The old walk (a
    tuple prefix per token) grows as the square: shown on a small case."""
    small, large = _peak_bytes(_context_tests, *_identical(2000)), _peak_bytes(_context_tests, *_identical(4000))
    assert large < 2.6 * small and large < 2**20, (small, large)

    def old_walk(side_a, side_b):  # the replaced code's data structure, kept here as the negative control
        contexts = {}
        for paths in (side_a, side_b):
            for path in paths:
                for depth in range(len(path)):
                    contexts.setdefault(path[:depth], 0)
        return contexts

    old_small, old_large = _peak_bytes(old_walk, *_identical(500)), _peak_bytes(old_walk, *_identical(1000))
    assert old_large > 3.2 * old_small, (old_small, old_large)
    spec = [Sample(prompt="x", token_ids=list(_identical(MAX_TOKENS, 1)[0][0]), temperature=1.0, seed=i) for i in range(20)]
    base = [Sample(prompt="x", token_ids=list(spec[0].token_ids), temperature=1.0, seed=100 + i) for i in range(20)]
    assert _peak_bytes(two_sample_audit, spec, base) < 256 * 2**20  # 32,768 depths walked


def _overshooting(generations: int, seed: int, overshoot: bool, stop: float = 0.15, limit: int = 8) -> list[Sample]:
    """Token 1 repeated, ending with probability ``stop`` a step; at the limit an overshooting
    engine runs 1–5 more tokens (whole speculation rounds), a plain one stops."""
    rng = random.Random(seed)
    samples = []
    for index in range(generations):
        length = 0
        while length < limit and rng.random() >= stop:
            length += 1
        extra = rng.randint(1, 5) if overshoot and length == limit else 0
        samples.append(Sample(prompt="p", token_ids=[1] * (length + extra), temperature=1.0, max_tokens=limit,
                              seed=seed * 10_000 + index, speculative=overshoot))
    return samples


def test_max_tokens_is_the_limit_and_overshoot_is_said() -> None:
    spec, plain = _overshooting(600, 1, True), _overshooting(600, 2, False)
    # Without the field, the limit is guessed from the longest generation: the overshoot fails.
    guessed = two_sample_audit([Sample(**{**vars(s), "max_tokens": None}) for s in spec],
                               [Sample(**{**vars(s), "max_tokens": None}) for s in plain])
    assert guessed.verdict == "fail" and guessed.worst_position == 8, guessed.reasons
    declared = two_sample_audit(spec, plain)
    assert declared.verdict != "fail", declared.reasons
    over = sum(len(sample.token_ids) > 8 for sample in spec)
    assert over > 50 and declared.settings["longer_than_max_tokens"] == over
    assert any(f"{over} generations ({over} with speculation, 0 without) are longer than their declared max_tokens" in reason
               for reason in declared.reasons), declared.reasons
    # A real difference of law still fails with the limit declared.
    shorter = two_sample_audit(_overshooting(600, 3, True, stop=0.3), plain)
    assert shorter.verdict == "fail", shorter.reasons


def test_two_samples_of_empty_generations_give_a_result(tmp_path) -> None:
    """No line declares max_tokens and every generation is empty: the limit is 0 and no path has a
    symbol, so nothing is compared (was an IndexError at depth 0); a group beside it is still tested."""
    empty = [_line(prompt="e", token_ids=[], seed=i) for i in range(30)]
    spec = load_samples(_file(tmp_path, "a.jsonl", empty))
    base = load_samples(_file(tmp_path, "b.jsonl", [_line(prompt="e", token_ids=[], seed=100 + i) for i in range(30)]))
    result = two_sample_audit(spec, base)
    assert result.verdict == "inconclusive" and result.tokens == 0 and result.positions == []
    assert any("30 generations of sample A against 30 of sample B, 1 prompts, 0 contexts tested" in reason
               for reason in result.reasons), result.reasons
    spec = load_samples(_file(tmp_path, "c.jsonl", empty + [_line(token_ids=[3], seed=200 + i) for i in range(30)]))
    base = load_samples(_file(tmp_path, "d.jsonl", [_line(prompt="e", token_ids=[], seed=300 + i) for i in range(30)]
                              + [_line(token_ids=[4], seed=400 + i) for i in range(30)]))
    mixed = two_sample_audit(spec, base)
    assert mixed.verdict == "fail" and [test.position for test in mixed.positions] == [0]


def test_two_sample_wording_says_what_was_tested() -> None:
    spec, plain = _overshooting(600, 4, False, stop=0.3), _overshooting(600, 5, False)
    for sample in spec:
        sample.speculative = None  # no "speculative" fields: the samples are named A and B
    result = two_sample_audit(spec, plain)
    assert result.verdict == "fail" and result.design == "two-sample: baseline sample"
    text = " ".join(result.reasons)
    assert "G test of homogeneity" in text and "PIT" not in text and "speculation" not in text, text
    assert "600 generations of sample A against 600 of sample B" in text
    assert result.positions[0].position == 0 and result.positions[0].tokens == 1200  # symbols compared, both samples
    small = two_sample_audit(_overshooting(30, 8, False), _overshooting(30, 9, False))
    assert small.verdict == "inconclusive" and "comparable tokens detect a TV" in summary_line(small.as_dict())


# -- shared databases ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_db(tmp_path_factory, tiny_folder: str) -> Path:
    """A real runs file: one recorded run and an external (two-sample) audit."""
    from diagnostics.models import load_model
    from diagnostics.runner import RunRequest, record_run
    from diagnostics.store import Store

    path = tmp_path_factory.mktemp("shared") / "real.duckdb"
    store = Store(path)
    record_run(store, load_model(tiny_folder), "ngram:2",
               RunRequest(prompt="w1 w2 w3 w1 w2", draft="ngram:2", gamma=3, max_new_tokens=6, seed=2, raw=True))
    evidence = two_sample_audit(_overshooting(200, 6, False), _overshooting(200, 7, False)).as_dict()
    store.add_audit(evidence, summary_line(evidence))
    return path


def _variant(shared_db: Path, folder: Path, name: str, sql: str, parameter: str) -> Path:
    path = folder / f"{name}.duckdb"
    path.write_bytes(shared_db.read_bytes())
    with duckdb.connect(str(path)) as con:
        con.execute(sql, [parameter])
    return path


def _deep(text: str, depth: int = 50_000) -> str:
    return text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"


def _big_int_evidence(shared_db: Path) -> str:
    with duckdb.connect(str(shared_db), read_only=True) as con:
        evidence = json.loads(con.execute("SELECT evidence FROM audits").fetchone()[0])
    evidence["positions"][0]["tokens"] = 2**63  # the first integer an int64 column cannot hold
    return json.dumps(evidence)


def _variants(shared_db: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    with duckdb.connect(str(shared_db), read_only=True) as con:
        evidence, policy = con.execute("SELECT (SELECT evidence FROM audits), (SELECT policy FROM runs)").fetchone()
    return {
        "deep evidence": (_variant(shared_db, folder, "deep-evidence", "UPDATE audits SET evidence = ?", _deep(evidence)),
                          "is not a JSON object within bounds"),
        "deep policy": (_variant(shared_db, folder, "deep-policy", "UPDATE runs SET policy = ?", _deep(policy)),
                        "a run's policy is not a valid policy"),
        "2^63 in an external audit's rows": (_variant(shared_db, folder, "big", "UPDATE audits SET evidence = ?",
                                                      _big_int_evidence(shared_db)), "does not fit 64 bits"),
    }


def test_the_real_file_opens(shared_db: Path, tmp_path: Path) -> None:
    """The control every variant below is made from."""
    from diagnostics.store import import_runs

    opened = import_runs(shared_db, tmp_path / "imported.duckdb")
    assert len(opened.list_runs()) == 1 and len(opened.list_audits()) == 1


def test_hostile_json_in_a_shared_file_is_refused_with_one_line(shared_db: Path, tmp_path: Path, capsys) -> None:
    from diagnostics.store import StoreError, import_runs

    # The negative control for 2^63: the structure check alone accepts it (the old import did).
    assert evidence_problem(json.loads(_big_int_evidence(shared_db))) is None
    for name, (path, message) in _variants(shared_db, tmp_path).items():
        before = _sha(path)
        with pytest.raises(StoreError) as error:
            import_runs(path, tmp_path / "imported.duckdb")
        assert message in str(error.value) and "\n" not in str(error.value), (name, str(error.value))
        assert main(["report", "x", "--db", str(path), "-o", str(tmp_path / "r.html")]) == 2  # before: exit 1, a traceback
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, (name, err)
        assert _sha(path) == before and not (tmp_path / "r.html").exists()


def _fake_upload(monkeypatch, uploads: dict[str, tuple[str, bytes]]) -> None:
    """``st.file_uploader`` answers the given (name, bytes) for its key: what a user's upload gives the page."""
    import streamlit

    real = streamlit.file_uploader

    def uploader(label, *args, key=None, **kwargs):
        if key in uploads:
            name, data = uploads[key]
            return SimpleNamespace(name=name, size=len(data), getvalue=lambda: data)
        return real(label, *args, key=key, **kwargs)

    monkeypatch.setattr(streamlit, "file_uploader", uploader)


def test_the_runs_page_refuses_a_hostile_shared_file_and_keeps_no_copy(shared_db: Path, tmp_path: Path, monkeypatch) -> None:
    from app_support import open_page

    monkeypatch.setenv("SPECLAB_DB", str(tmp_path / "mine.duckdb"))
    folder = tmp_path / "variants"
    folder.mkdir()
    for name, (path, message) in _variants(shared_db, folder).items():
        before = _sha(path)
        _fake_upload(monkeypatch, {"import_file": (path.name, path.read_bytes())})
        at = open_page("views/runs.py")  # raises on a traceback
        assert any(message in error.value and "\n" not in error.value.strip() for error in at.error), (name, [e.value for e in at.error])
        assert not list((tmp_path / "shared").glob("*")), name  # the refused copy is not kept
        assert _sha(path) == before


def test_the_audit_page_upload_refuses_hostile_lines_and_audits_text(tmp_path: Path, tiny_folder: str, monkeypatch) -> None:
    """The page's upload path: a hostile line is one error line at upload (no traceback), an id
    beyond the vocabulary one at audit time (nothing stored), text-only lines are tokenised."""
    from app_support import open_page

    from diagnostics.store import Store

    monkeypatch.setenv("SPECLAB_DB", str(tmp_path / "runs.duckdb"))
    monkeypatch.setenv("SPECLAB_TARGET", tiny_folder)
    cases = {
        "deep.jsonl": (HOSTILE_LINES["nested 100,000 deep"][0], "deep.jsonl line 2: JSON nested 100001 deep"),
        "vocab.jsonl": (_line(token_ids=[3, 12]), "vocab.jsonl line 2: token_ids holds the id 12"),
        "text.jsonl": (json.dumps({"prompt": "w1 w2", "text": " w3 w4", "token_ids": [], "temperature": 1.0}), None),
    }
    for name, (bad, message) in cases.items():
        _fake_upload(monkeypatch, {"audit_ext_file": (name, (_line() + "\n" + bad + "\n").encode())})
        at = open_page("views/audit.py", timeout=180)
        at.radio(key="audit_layer").set_value("External engine").run()
        if name != "deep.jsonl":  # a file refused at upload offers no button
            at.button(key="audit_ext_go").click().run(timeout=180)
        assert not at.exception, [e.value for e in at.exception]
        audits = Store(tmp_path / "runs.duckdb").list_audits()
        if message is None:  # text only: its 2 tokens are audited with the target's tokenizer (2 + 2, not 2 + 0)
            evidence = Store(tmp_path / "runs.duckdb").get_audit(audits["audit_id"][0])["evidence"]
            assert len(audits) == 1 and evidence["tokens"] == 4, evidence["reasons"]
        else:
            assert any(message in error.value for error in at.error), (name, [e.value for e in at.error])
            assert audits.empty


def _diverging(generations: int, seed: int, speculative: bool, length: int = 12) -> list[Sample]:
    """Two laws that agree at position 0 (uniform over 8 ids) and part after it: the speculative
    side stays uniform, the plain side draws id 3 with probability 0.4 (TV 0.35 a position)."""
    rng = random.Random(seed)
    samples = []
    for index in range(generations):
        ids = [rng.randrange(3, 11)]
        for _ in range(length - 1):
            ids.append(rng.randrange(3, 11) if speculative or rng.random() >= 0.4 else 3)
        samples.append(Sample(prompt="p", token_ids=ids, temperature=1.0, max_tokens=length, finish_reason="length",
                              seed=seed * 10_000 + index, speculative=speculative))
    return samples


def test_one_lines_max_tokens_censors_that_line_only_and_a_fail_stays_a_fail() -> None:
    """Everyday, ~1 s. Two 400-generation samples whose laws part after position 0 fail; setting one
    line's ``max_tokens`` to 1 used to cut every generation of the prompt, both files, at 1 token and
    the comparison passed on position 0 alone. Now that line alone is censored, and the note says so."""
    spec, plain = _diverging(400, 1, True), _diverging(400, 2, False)
    honest = two_sample_audit(spec, plain)
    assert honest.verdict == "fail" and honest.settings["censored_lines"] == 0, honest.reasons
    spec[17] = Sample(**{**vars(spec[17]), "max_tokens": 1})
    bent = two_sample_audit(spec, plain)
    assert bent.verdict == "fail" and len(bent.positions) > 1, bent.reasons
    assert bent.settings["censored_lines"] == 1 and bent.settings["censored_tokens"] == 11
    assert any("1 generations with speculation declare a smaller max_tokens than the largest of their prompt (1 against up to 12)" in note
               for note in bent.notes), bent.notes


def test_limits_that_cut_away_most_of_the_evidence_cannot_pass() -> None:
    """Everyday, ~1 s. Both samples of one law (a pass with the limits as collected); declaring
    max_tokens 1 on every line of one side leaves position 0 only: most of the tokens held are cut,
    which the note says, and the verdict is inconclusive however many generations position 0 has."""
    spec, plain = _diverging(3000, 3, True, length=4), _diverging(3000, 4, True, length=4)
    assert two_sample_audit(spec, plain, detect_tv=0.2).verdict == "pass"
    cut = [Sample(**{**vars(sample), "max_tokens": 1}) for sample in spec]
    result = two_sample_audit(cut, plain, detect_tv=0.2)
    assert result.verdict == "inconclusive" and [test.position for test in result.positions] == [0], result.reasons
    assert any("that is most of the evidence, so the comparison cannot pass" in note for note in result.notes), result.notes


def test_repeated_lines_are_counted_once_and_said() -> None:
    """Everyday, ~1 s. An honest sample of 100 generations written 16 times over, against 1,600 of the
    same law: counted 1,600 times, each draw's deviation weighs 16-fold and the comparison fails; each
    seeded draw is now counted once and the note says what the repeats would have done. Unseeded
    repeats cannot be told from draws that came out alike: they are kept, counted and said."""
    honest, baseline = _diverging(100, 5, True, length=6), _diverging(1600, 6, True, length=6)
    repeated = [Sample(**vars(sample)) for _ in range(16) for sample in honest]
    result = two_sample_audit(repeated, baseline, detect_tv=0.3)
    assert result.verdict != "fail" and result.generations == 100, result.reasons
    assert result.settings["repeated_lines"] == 1500 and result.settings["repeated_without_seed"] == 0
    assert any(note.startswith("1500 lines repeat another generation exactly (same prompt, settings, seed and ids)")
               for note in result.notes), result.notes
    unseeded = [Sample(**{**vars(sample), "seed": None}) for sample in repeated]
    kept = two_sample_audit(unseeded, baseline, detect_tv=0.3)
    assert kept.generations == 1600 and kept.settings["repeated_without_seed"] == 1500
    assert any("lines without a seed repeat another's prompt, settings and ids" in note for note in kept.notes)


def _rejections(monkeypatch, g_test, replicates: int = 200, level: float = 0.05) -> float:
    """How often the pooled two-sample test rejects at ``level`` when 100 and 1,600 three-token
    generations come from one law (uniform over 8 ids), each context tested by ``g_test``."""
    from scipy import stats

    from diagnostics.audit import two_sample

    monkeypatch.setattr(two_sample, "_g_test", g_test)
    rng = random.Random(3)
    rejected = 0
    for _ in range(replicates):
        side_a = [tuple(rng.randrange(8) for _ in range(3)) for _ in range(100)]
        side_b = [tuple(rng.randrange(8) for _ in range(3)) for _ in range(1600)]
        tests = _context_tests(side_a, side_b)
        dof = sum(test.dof for test in tests)
        rejected += dof > 0 and stats.chi2.sf(sum(test.statistic for test in tests), dof) < level
    monkeypatch.undo()
    return rejected / replicates


def _pooled_by_total(depth: int, count_a: Counter, count_b: Counter):
    """The planted bug (the rule used before): a symbol is its own cell when its *total* count
    reaches 5, so the smaller side of 100 against 1,600 expects 0.3 in it; no Williams correction."""
    from diagnostics.audit.two_sample import ContextTest

    n_a, n_b = sum(count_a.values()), sum(count_b.values())
    big = [symbol for symbol, total in (count_a + count_b).items() if total >= 5]
    cells = [(count_a[symbol], count_b[symbol]) for symbol in big]
    rest = (n_a - sum(a for a, _ in cells), n_b - sum(b for _, b in cells))
    if sum(rest):
        cells.append(rest)
    total = n_a + n_b
    statistic = sum(2.0 * observed * math.log(observed * total / (row * (a + b)))
                    for a, b in cells for observed, row in ((a, n_a), (b, n_b)) if observed)
    return ContextTest(depth, statistic, len(cells) - 1, n_a * n_b / total, total)


def test_the_g_test_keeps_its_level_when_one_sample_is_sixteen_times_smaller(monkeypatch) -> None:
    """Everyday, ~2 s. 200 null replicates of 100 against 1,600 generations: the two-sample test
    rejects at 5% no more often than 5% + 3 standard errors (9.6%); 4.5% here. The planted bug, the
    cells chosen by their total count (the rule before), rejects 23% of true nulls and is caught by
    the same check; whole audits of 100 against 1,600 six-token generations rejected 23.5% then."""
    from diagnostics.audit.two_sample import _g_test

    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)
    assert _rejections(monkeypatch, _g_test) <= bound
    assert _rejections(monkeypatch, _pooled_by_total) > bound  # negative control
