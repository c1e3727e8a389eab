"""``verdicts --import`` and the table's rendering against hostile files: a table made elsewhere is
evidence of nothing here, so an imported row never replaces a row run here, every figure is checked
for its range, the file is read with a size bound (regular files only: a device or a pipe is refused
at once), nothing is written until everything is checked, the re-audit follows no symbolic link, and
every string from the file reaches the README and the report shown, not acted on.

Everyday tier: no model is loaded; each test takes under 0.4 s, the file's 38 tests 0.7 s together
on a 2-core machine (after about 4 s of imports at collection)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from diagnostics.cli import main
from diagnostics.store import Store
from diagnostics.verdicts.render import END, START, markdown_table
from diagnostics.verdicts.table import (MAX_SETTINGS_BYTES, MAX_TABLE_BYTES, evidence_file, evidence_unchanged, load_table,
                                        reaudit_side, save_table, sha256)

ROOT = Path(__file__).resolve().parents[1]


def _side(**changes) -> dict:
    return {"verdict": "pass", "p_value": 0.4, "tokens": 1000, "detectable_tv": 0.08, "distortion": 0.0, "distortion_low": 0.0,
            "distortion_high": 0.02, "file": "x.jsonl", "sha256": "ab" * 32, "audit_id": "48d1b4838fce", **changes}


def _row(**changes) -> dict:
    return {"engine": "ours", "label": "this lab's engine", "version": "spec-verify-lab 0.1.0", "policy": "t1", "verdict": "pass",
            "settings": {"temperature": 1.0, "top_k": None}, "on": _side(), "off": _side(), "provenance": "run here", **changes}


def _import(tmp_path: Path, source: Path, *extra: str) -> int:
    return main(["verdicts", "--import", str(source), "--out", str(tmp_path / "verdicts.json"), "--readme", "none", *extra])


def _one_line_error(capsys, fragment: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    return err


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, bytes]:
    """A table with one row run here; its bytes, which a refused import must leave as they are."""
    out = tmp_path / "verdicts.json"
    save_table(out, {"rows": [_row()]})
    return out, out.read_bytes()


def test_an_imported_row_keyed_like_a_row_run_here_is_added_beside_it_and_the_disagreement_shown(tmp_path: Path, stored, capsys) -> None:
    """Everyday tier, about 0.1 s. The issue's forged import (engine ours, policy t1, p 0.99, a
    made-up hash) used to replace the row run here, which kept the local audit id beside the forged hash."""
    out, _ = stored
    run_here = json.loads(out.read_text())["rows"][0]
    forged = _row(verdict="fail", on=_side(verdict="fail", p_value=0.99, sha256="0" * 64), provenance="run here")
    source = tmp_path / "forged.json"
    source.write_text(json.dumps({"rows": [forged]}))
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n{START}\n{END}\n")
    assert _import(tmp_path, source, "--readme", str(readme)) == 0
    err = capsys.readouterr().err
    assert "disagree" in err and "run here" in err, err
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and rows[0] == run_here  # the row run here, untouched
    imported = rows[1]
    assert imported["provenance"].startswith("imported from forged.json") and imported["on"]["sha256"] == "0" * 64
    # Its audit id names an audit in another machine's store: never linked to this one's.
    assert imported["on"]["audit_id"] is None and imported["on"]["audit_id_elsewhere"] == "48d1b4838fce"
    glance, detail = _glance_and_detail(readme.read_text())
    lines = [line for line in detail if line.startswith("| this lab")]
    assert len(lines) == 2 and "| pass |" in lines[0] and "disagrees with the row run here" not in lines[0]
    assert "fail · disagrees with the row run here \\(pass\\)" in lines[1], lines[1]
    # At a glance: the imported row is its own line, named as imported, with the disagreement.
    lines = [line for line in glance if line.startswith("| this lab")]
    assert len(lines) == 2 and "🟢 pass · p 0.4" in lines[0] and "disagrees" not in lines[0]
    assert "· imported \\(imported from forged.json" in lines[1] and "🔴 fail · p 0.99" in lines[1], lines[1]
    assert "disagrees with the row run here \\(pass\\)" in lines[1]
    # Imported again: the imported row is replaced (the same key, imported), never the row run here.
    assert _import(tmp_path, source) == 0
    assert "disagree" in capsys.readouterr().err
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and rows[0] == run_here
    # Negative control: an imported row that agrees is shown without a note.
    source.write_text(json.dumps({"rows": [_row(on=_side(p_value=0.5))]}))
    assert _import(tmp_path, source) == 0
    assert "disagree" not in capsys.readouterr().err
    assert "disagrees" not in markdown_table(load_table(out))


@pytest.mark.parametrize("row, fragment", [
    (_row(on=_side(p_value=1e308)), "on.p_value must be a number in [0, 1]"),
    (_row(off=_side(distortion=-1e308)), "off.distortion must be a number in [0, 1]"),
    (_row(on=_side(detectable_tv=1.5)), "on.detectable_tv must be a number in [0, 1]"),
    (_row(on=_side(tokens=-5)), "on.tokens must be a whole number in [0, "),
    (_row(on=_side(tokens=10.5)), "on.tokens must be a whole number in [0, "),
    (_row(on=_side(impossible=True)), "on.impossible must be a whole number"),
    (_row(on=_side(time_s=1e300)), "on.time_s must be a number of seconds in [0, "),
    (_row(time_s=-1), "time_s must be a number of seconds in [0, "),
    (_row(on=_side(sha256="zz")), "on.sha256 must be 64 hexadecimal digits"),
    (_row(on=_side(reasons=["x" * 5000])), "on.reasons must be a list of"),
    (_row(settings={"temperature": 1e308}), "settings.temperature must be a number in [0, "),
    (_row(settings={"temperature": 1.0, "top_p": 7}), "settings.top_p must be a number in [0, 1]"),
    (_row(settings={"temperature": 1.0, "level": 0}), "settings.level must be a number in (0, 1)"),
    (_row(settings={"temperature": 1.0, "blob": "x" * 100_000}), f"settings must serialise to at most {MAX_SETTINGS_BYTES:,} bytes"),
    (_row(settings={f"k{index}": index for index in range(2000)}), f"settings must serialise to at most {MAX_SETTINGS_BYTES:,} bytes"),
    (_row(note="n" * 5000), "note must be text of at most"),
    (_row(junk={"a": 1}), "junk is not a field of a verdict table's row"),
    (_row(on={**_side(), "junk": 1}), "on.junk is not a field of a side"),
])
def test_an_imported_figure_out_of_its_range_is_refused_in_one_line(tmp_path: Path, stored, capsys, row, fragment) -> None:
    """Everyday tier, about 0.02 s each: finite is not enough (p 1e308 and distortion -1e308 were
    accepted); each field has its meaning's range, and a table has a bounded size."""
    out, before = stored
    source = tmp_path / "bad.json"
    source.write_text(json.dumps({"rows": [row]}))
    assert _import(tmp_path, source) == 2
    _one_line_error(capsys, fragment)
    assert out.read_bytes() == before and not list(tmp_path.glob("*.partial"))


def _guarded(call, seconds: float = 20.0):
    """``call()``'s result from a daemon thread, or a failure after ``seconds``: a read that blocks
    (a pipe without a writer) fails the test instead of hanging the suite."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s"
    return result[0]


def test_a_device_a_pipe_and_a_folder_are_refused_at_once(tmp_path: Path, stored, capsys) -> None:
    """Everyday tier, about 0.05 s (a regression hangs 20 s, then fails): /dev/zero used to be read
    until a traceback at 5.2 GB, and a FIFO without a writer blocked for ever."""
    out, before = stored
    fifo = tmp_path / "table.fifo"
    os.mkfifo(fifo)
    try:
        for source in (Path("/dev/zero"), fifo, tmp_path):
            assert _guarded(lambda: _import(tmp_path, source)) == 2
            _one_line_error(capsys, "is not a regular file")
    finally:
        try:  # a reader still blocked in open() gets its end of file (a no-op when none is)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert out.read_bytes() == before


def test_a_table_file_over_the_size_limit_is_refused(tmp_path: Path, stored, capsys) -> None:
    """Everyday tier, about 0.05 s: a valid table padded past ``MAX_TABLE_BYTES`` (4 MiB) is refused
    before it is parsed; one just under it is read (the negative control)."""
    out, before = stored
    source = tmp_path / "big.json"
    text = json.dumps({"rows": [_row(engine="gpu")]})
    source.write_text(text + " " * (MAX_TABLE_BYTES - len(text) + 1))
    assert _import(tmp_path, source) == 2
    _one_line_error(capsys, "the limit is 4 MiB")
    assert out.read_bytes() == before
    source.write_text(text + " " * (MAX_TABLE_BYTES - len(text)))
    assert _import(tmp_path, source) == 0


def test_a_lone_surrogate_is_refused_naming_the_file_and_line_before_anything_is_written(tmp_path: Path, stored, capsys) -> None:
    """Everyday tier, about 0.02 s: a lone ``\\ud800`` used to print '1 row(s) imported', then an
    error that named nothing, and leave a 0-byte ``.partial`` file."""
    out, before = stored
    source = tmp_path / "surrogate.json"
    row = json.dumps(_row(engine="gpu", label="LABEL"), indent=1).replace("LABEL", "vLLM \\ud800")
    source.write_text('{"rows": [\n' + row + "\n]}")
    line = source.read_text().splitlines().index(next(text for text in source.read_text().splitlines() if "ud800" in text)) + 1
    assert _import(tmp_path, source) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert f"{source}: line {line}" in captured.err and "surrogate" in captured.err, captured.err
    assert "imported" not in captured.err and not captured.out
    assert out.read_bytes() == before and not list(tmp_path.glob("*.partial"))
    # A pair (an emoji written as two escapes, as json.dumps writes it) is text: imported.
    source.write_text(json.dumps({"rows": [_row(engine="gpu", label="vLLM \U0001f680")]}))
    assert _import(tmp_path, source) == 0
    assert load_table(out)["rows"][1]["label"] == "vLLM \U0001f680"


def test_a_table_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path: Path, stored) -> None:
    """Everyday tier, about 0.01 s: text that is not UTF-8 (a lone surrogate from a command line
    argument) is refused before the partial file is made, and the table keeps its bytes."""
    out, before = stored
    with pytest.raises(ValueError, match="surrogate"):
        save_table(out, {"rows": [_row(label="x \udcff")]})
    assert out.read_bytes() == before and not list(tmp_path.glob("*.partial"))


def test_a_bad_utf8_byte_names_the_file_and_line(tmp_path: Path, stored, capsys) -> None:
    """Everyday tier, about 0.02 s."""
    out, before = stored
    source = tmp_path / "latin1.json"
    source.write_bytes(b'{"rows": [\n{"engine": "caf\xe9"}\n]}')
    assert _import(tmp_path, source) == 2
    _one_line_error(capsys, f"{source}: line 2: not UTF-8 text")
    assert out.read_bytes() == before


def _evidence(tmp_path: Path) -> tuple[dict, Path, Path]:
    """A row whose on side names ``on.jsonl`` in ``folder``, with the hash of a real file kept elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = elsewhere / "on.jsonl"
    real.write_text('{"prompt": "p", "token_ids": [1]}\n')
    folder = tmp_path / "evidence"
    folder.mkdir()
    return _row(on=_side(file="on.jsonl", sha256=sha256(real))), folder, real


def test_the_reaudit_follows_no_symbolic_link_in_the_evidence_folder(tmp_path: Path) -> None:
    """Everyday tier, about 0.01 s: a link named like the evidence file (to any file whose hash the
    table states) or a linked evidence folder is refused in one line; the file itself is accepted
    (the negative control)."""
    row, folder, real = _evidence(tmp_path)
    (folder / "on.jsonl").symlink_to(real)
    for call in (lambda: evidence_file(row, "on", folder), lambda: reaudit_side(row, "on", folder, None, set())):
        with pytest.raises(ValueError, match="is a symbolic link") as error:
            call()
        assert "\n" not in str(error.value)
    assert not evidence_unchanged({**row, "off": row["on"]}, folder)
    linked = tmp_path / "linked"
    linked.symlink_to(real.parent, target_is_directory=True)
    with pytest.raises(ValueError, match="is a symbolic link"):
        evidence_file(row, "on", linked)
    (folder / "on.jsonl").unlink()
    (folder / "on.jsonl").write_bytes(real.read_bytes())
    assert evidence_file(row, "on", folder) == folder / "on.jsonl"


HOSTILE_LABEL = "vLLM \x1b[2J\x07\u202eevil https://evil.example www.evil.example $x^2$ :rocket: a@b.co &#x202e; | [x](y)"


def _glance_and_detail(readme: str) -> tuple[list[str], list[str]]:
    """The README table's lines at a glance and in detail (after ``<details>``), header lines first."""
    table = readme.split(START, 1)[1].split(END, 1)[0]
    glance, detail = table.split("<details>", 1)
    return ([line for line in glance.splitlines() if line.startswith("|")],
            [line for line in detail.splitlines() if line.startswith("|")])


def test_an_imported_label_is_shown_not_acted_on_in_the_readme_and_the_report(tmp_path: Path, capsys) -> None:
    """Everyday tier, about 0.2 s (the report). Raw ESC, BEL and U+202E reached README.md and
    ``report --verdicts``, and bare URLs, ``www.`` names, ``$…$``, ``:emoji:`` and character
    references that GitHub turns into links, maths, emoji and characters. In the README such a
    cell is one code span (GitHub neither links nor renders anything in code); in the report,
    escaped HTML with the invisible characters shown."""
    source = tmp_path / "gpu.json"
    source.write_text(json.dumps({"rows": [_row(engine="gpu", label=HOSTILE_LABEL, version="vllm :100: www.x.io")]}))
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n{START}\n{END}\n")
    assert _import(tmp_path, source, "--readme", str(readme)) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    text = readme.read_text()
    glance, detail = _glance_and_detail(text)
    [line] = [line for line in detail if "evil" in line]
    [glance_line] = [line for line in glance if "evil" in line]
    assert glance_line.startswith("| ` vLLM \\x1b[2J\\x07\\u202eevil https://evil.example") and "imported from gpu.json" in glance_line
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in text
    cells = line.split(" | ")
    # Code spans, the pipe between them escaped outside (GFM splits cells before it parses code).
    assert cells[0] == ("| ` vLLM \\x1b[2J\\x07\\u202eevil https://evil.example www.evil.example $x^2$ :rocket: a@b.co "
                        "&#x202e;  `\\|`  [x](y) `")
    assert cells[1] == "` vllm :100: www.x.io `"
    assert len(cells) == len(detail[0].split(" | "))  # one cell each: the escaped pipe splits nothing
    Store(tmp_path / "runs.duckdb")
    assert main(["report", "--verdicts", str(tmp_path / "verdicts.json"), "--db", str(tmp_path / "runs.duckdb"),
                 "-o", str(tmp_path / "r.html")]) == 0
    report = (tmp_path / "r.html").read_text()
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in report
    assert "vLLM \\x1b[2J\\x07\\u202eevil https://evil.example" in report and "&amp;#x202e;" in report


def test_plain_labels_keep_their_look_and_the_committed_table_renders_as_the_readme_shows() -> None:
    """Everyday tier, about 0.05 s: the negative control. Text GitHub reads as text only keeps its
    backslash-escaped form (no code span), and docs/verdicts.json still loads and renders to the
    README's table exactly."""
    markdown = markdown_table({"rows": [_row(label="transformers (fixed γ) x_y", version="llama.cpp commit 4227c9be4 (llama-server "
                                                                                        "--version: version: 0 (4227c9be4))")]})
    # The version cut to its short form (the build string stays in the JSON).
    assert "| transformers \\(fixed γ\\) x\\_y | llama.cpp 4227c9b |" in markdown
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = readme.split(START, 1)[1].split(END, 1)[0].strip()
    assert markdown_table(load_table(ROOT / "docs" / "verdicts.json")) == shown


@pytest.mark.parametrize("text, cell", [
    ("transformers (fixed γ) a_b | c", "transformers \\(fixed γ\\) a\\_b \\| c"),  # text alone: punctuation escaped
    ("x\x1b\u202e :rocket:", "` x\\x1b\\u202e :rocket: `"),
    ("price $5 or $6", "` price $5 or $6 `"),
    ("see www.example.org", "` see www.example.org `"),
    ("mail a@b.co", "` mail a@b.co `"),
    ("ref &#x202e; here", "` ref &#x202e; here `"),
    ("`tick` https://x.y", "`` `tick` https://x.y ``"),
    # A backslash of the text before a pipe: GFM's cell scanner reads "\\" as one escaped backslash,
    # so the pipe is escaped outside the code spans, where no backslash of the text stands before it.
    ("a\\|b www.x", "` a\\ `\\|` b www.x `"),
    ("two\nlines\tand  spaces", "two lines and spaces"),
])
def test_markdown_cell_keeps_text_as_text_on_github(text: str, cell: str) -> None:
    """Everyday tier, under 0.01 s: ``untrusted.markdown_cell``, the README's neutraliser."""
    from diagnostics.untrusted import markdown_cell

    assert markdown_cell(text) == cell
    assert "|" not in cell.replace("\\|", "")  # every pipe escaped: the row keeps its cells


@pytest.mark.parametrize("extra, fragment", [
    (["--endpoint", "http://127.0.0.1:9", "--baseline-endpoint", "http://127.0.0.1:9", "--model", "m", "--label", "l",
      "--version", "v", "--settings", json.dumps({f"k{index}": "v" * 150 for index in range(20)})],
     "--settings must be a JSON object of up to 30 short values (2,048 bytes in all)"),
    (["--engine", "ours", "--prompt", "p" * 5000], "the table keeps at most 4,096 bytes of prompts a row"),
])
def test_what_a_row_keeps_of_the_command_line_is_bounded_before_anything_runs(tmp_path: Path, capsys, extra, fragment) -> None:
    """Everyday tier, about 0.02 s each: a row's settings hold its ``--settings`` and prompts, and a
    table's settings are bounded (``MAX_SETTINGS_BYTES``): too much is refused before any model or
    server is touched, not after an hour of generation when the table is written."""
    assert main(["verdicts", "--out", str(tmp_path / "verdicts.json"), "--evidence", str(tmp_path / "evidence"),
                 "--db", str(tmp_path / "audits.duckdb"), "--readme", "none", *extra]) == 2
    _one_line_error(capsys, fragment)
    assert not (tmp_path / "verdicts.json").exists()
