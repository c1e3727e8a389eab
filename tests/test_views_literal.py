"""Every text a page hands to Streamlit's Markdown is a constant, or goes through the one helper.

Streamlit renders Markdown (links, images, formulas, emoji, colours, autolinks) in ``st.markdown``,
``st.caption``, ``st.error`` and friends, and in widget labels, help texts and radio options.
Text from a file, the URL, a model or a user must reach them only through ``views.common``'s
``md`` / ``literal`` / ``run_link`` (an inline code span, percent-encoded links). This test reads
the page sources and fails on any other expression in those places, so a new page cannot
forget; a line may opt out with ``# literal-ok: <why>`` when its values are provably not text
from outside (the reason is reviewed like code).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from diagnostics.untrusted import markdown_literal, visible

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "views").glob("*.py")) + [ROOT / "app.py"]
# Calls whose first argument is Markdown (body or label).
MARKDOWN_FIRST = {
    "markdown", "caption", "error", "warning", "info", "success", "toast", "title", "header", "subheader", "write",
    "button", "download_button", "checkbox", "toggle", "radio", "selectbox", "multiselect", "text_input", "text_area",
    "number_input", "slider", "select_slider", "expander", "popover", "metric", "file_uploader", "spinner", "page_link",
    "link_button", "form_submit_button", "status",
}
MARKDOWN_KEYWORDS = {"body", "label", "help", "text"}
SAFE_CALLS = {"md", "literal", "run_link"}
NUMBER_CALLS = {"int", "float", "len", "round"}
CONSTANTS = {"METRIC_HELP", "LAYERS", "RULE_HELP", "__version__"}
NUMERIC_SPEC_END = tuple("fegd%,")


def _safe(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, int, float)) or node.value is None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in SAFE_CALLS | NUMBER_CALLS
    if isinstance(node, ast.Name):
        return node.id in CONSTANTS
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        return node.value.id in CONSTANTS
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _safe(node.left) and _safe(node.right)
    if isinstance(node, ast.IfExp):
        return _safe(node.body) and _safe(node.orelse)
    if isinstance(node, ast.JoinedStr):
        return all(_safe_part(part) for part in node.values)
    return False


def _safe_part(part: ast.AST) -> bool:
    if isinstance(part, ast.Constant):
        return True
    assert isinstance(part, ast.FormattedValue)
    spec = part.format_spec
    if isinstance(spec, ast.JoinedStr) and all(isinstance(value, ast.Constant) for value in spec.values):
        text = "".join(value.value for value in spec.values)
        if text.endswith(NUMERIC_SPEC_END):  # a number format raises on text
            return True
    return _safe(part.value)


def unsafe_markdown(source: str) -> list[tuple[int, str]]:
    """``(line, code)`` of every Markdown argument that is not provably constant or escaped."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name = node.func.attr
        arguments = []
        if name in MARKDOWN_FIRST and node.args:
            arguments.append(node.args[0])
        if name in MARKDOWN_FIRST or name == "progress":
            arguments += [keyword.value for keyword in node.keywords if keyword.arg in MARKDOWN_KEYWORDS]
        for argument in arguments:
            if "# literal-ok:" in lines[node.lineno - 1] or _safe(argument):
                continue
            found.append((argument.lineno, ast.unparse(argument)))
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.name)
def test_pages_pass_untrusted_text_to_markdown_only_through_the_helper(path: Path) -> None:
    assert unsafe_markdown(path.read_text()) == []


def test_the_checker_catches_what_it_must() -> None:
    """Negative controls: interpolated text is caught, escaped and numeric text is not."""
    caught = unsafe_markdown(
        'st.caption(f"target {run[\'target\']}")\n'
        'st.error(str(error))\n'
        'st.markdown("**" + rule + "**")\n'
        'col.metric(name, 1)\n'
        'st.button(label=f"Load {path}")\n'
        'bar.progress(0.5, text=status)\n'
    )
    assert [line for line, _ in caught] == [1, 2, 3, 4, 5, 6]
    assert unsafe_markdown(
        'st.caption(md("target {t}", t=run["target"]))\n'
        'st.error(literal(error))\n'
        'st.markdown(f"{count:,} runs · {int(first)} · " + run_link("x", run_id))\n'
        'st.metric("α", f"{value:.3f}", help=METRIC_HELP[name])\n'
        'st.caption(f"{x} made safe")  # literal-ok: x is a loop counter\n'
    ) == []


def test_literal_text_is_a_code_span_that_renders_nothing() -> None:
    """The helper's output: one code span (longer fence than any backtick run), invisible
    characters escaped, and Streamlit's ``:material/`` rewrite split off."""
    assert markdown_literal("![i](http://x/p.png)") == "` ![i](http://x/p.png) `"
    assert markdown_literal("a``b") == "``` a``b ```"
    assert markdown_literal("") == "` `"
    assert markdown_literal("x\x1b[2J\u202e\n") == "` x\\x1b[2J\\u202e\\n `"
    assert markdown_literal(":material/home:") == "` :material `/` home: `"
    assert markdown_literal("x:material/") == "` x:material `/"
    assert visible("café\x00") == "café\\x00"


def test_run_labels_tell_runs_of_one_prompt_apart() -> None:
    """Twenty runs of one prompt read alike by id, rule and status alone: the label adds the draft (a
    folder by its last part), the tree and the start time, as plain text (control characters escaped)."""
    from types import SimpleNamespace

    import pandas as pd

    from views.common import run_label

    row = SimpleNamespace(run_id="db6b75ae8a6e", rule="lossless", draft="medusa:/tmp/heads/medusa_t", tree="[[0],[1]]",
                          status="complete", created=pd.Timestamp("2026-12-03 19:21:05"), prompt="Count:\n1, 2")
    assert run_label(row) == "db6b75ae8a6e · lossless · medusa:medusa_t tree [[0],[1]] · complete · 12-03 19:21 · Count:\\n1, 2"
    bare = SimpleNamespace(run_id="a", rule="lossless", draft=None, tree=None, status="running", created=pd.NaT, prompt="x")
    assert run_label(bare) == "a · lossless · plain · running · x"
