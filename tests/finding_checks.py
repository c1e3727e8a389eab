"""What every finding's tests check (tests/test_findings_*.py): its ``fix.patch`` parsed and applied
exactly without the ``patch`` tool, and the modules its standalone ``repro.py`` imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_patch(text: str) -> dict[str, list[dict]]:
    """Each file the unified diff changes, with its hunks (old start, new start, tagged lines).
    Text before the first ``--- a/`` is a preamble. ``ValueError`` when the diff is not well formed:
    a header pair missing or renaming, a line without a diff tag, hunk counts that do not add up, or
    a hunk whose new start disagrees with its old start and the hunks before it."""
    lines = text.splitlines()
    index = next((i for i, line in enumerate(lines) if line.startswith("--- a/")), None)
    if index is None:
        raise ValueError("no '--- a/' header")
    files: dict[str, list[dict]] = {}
    while index < len(lines):
        if not lines[index].startswith("--- a/"):
            raise ValueError(f"line {index + 1}: expected '--- a/...', got {lines[index][:40]!r}")
        if index + 1 >= len(lines) or not lines[index + 1].startswith("+++ b/"):
            raise ValueError(f"line {index + 2}: expected '+++ b/...'")
        old = lines[index][len("--- a/"):].split("\t")[0]
        new = lines[index + 1][len("+++ b/"):].split("\t")[0]
        if old != new:
            raise ValueError(f"renames {old} to {new}")
        if old in files:
            raise ValueError(f"{old} appears twice")
        index += 2
        if index >= len(lines) or not HUNK.match(lines[index]):
            raise ValueError(f"{old}: no hunk")
        hunks, shift = [], 0
        while index < len(lines) and HUNK.match(lines[index]):
            match = HUNK.match(lines[index])
            old_start, new_start = int(match.group(1)), int(match.group(3))
            want_old, want_new = int(match.group(2) or 1), int(match.group(4) or 1)
            if new_start != old_start + shift:
                raise ValueError(f"{old}: hunk {match.group(0)} starts at new line {new_start}, "
                                 f"the hunks before it say {old_start + shift}")
            index += 1
            body, got_old, got_new = [], 0, 0
            while index < len(lines) and (got_old < want_old or got_new < want_new):
                line = lines[index]
                tag = line[:1] or " "
                if tag not in " +-":
                    raise ValueError(f"{old}: line {index + 1} has no diff tag: {line[:40]!r}")
                got_old += tag in " -"
                got_new += tag in " +"
                body.append((tag, line[1:]))
                index += 1
            if (got_old, got_new) != (want_old, want_new):
                raise ValueError(f"{old}: hunk counts {got_old}/{got_new}, header says {want_old}/{want_new}")
            hunks.append({"old_start": old_start, "lines": body})
            shift += want_new - want_old
        files[old] = hunks
    return files


def hunk_lines(hunks: list[dict], tag: str) -> list[str]:
    """The text of every line of ``hunks`` tagged ``tag`` (``"-"`` removed, ``"+"`` added, ``" "`` context)."""
    return [text for hunk in hunks for line_tag, text in hunk["lines"] if line_tag == tag]


def apply_hunks(source: str, hunks: list[dict]) -> str:
    """``source`` with ``hunks`` applied exactly (context and removed lines must be the source's
    lines at the stated place); ``ValueError`` naming the hunk otherwise."""
    lines = source.split("\n")
    offset = 0
    for hunk in hunks:
        start = hunk["old_start"] - 1 + offset
        expected = [text for tag, text in hunk["lines"] if tag in " -"]
        if lines[start:start + len(expected)] != expected:
            raise ValueError(f"hunk at old line {hunk['old_start']} does not match the source")
        replacement = [text for tag, text in hunk["lines"] if tag in " +"]
        lines[start:start + len(expected)] = replacement
        offset += len(replacement) - len(expected)
    return "\n".join(lines)


def imported_roots(script: Path) -> set[str]:
    """The top-level modules ``script`` imports (a relative import fails the test: a reproduction stands alone)."""
    roots = set()
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{script.name}: relative import"
            roots.add((node.module or "").split(".")[0])
    return roots
