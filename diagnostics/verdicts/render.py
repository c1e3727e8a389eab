"""The verdict table for people: Markdown rows for the README (between two marker lines the
command rewrites), the HTML section of a report (``report --verdicts``) and the rows the Audit page
shows. Every string from the table file is untrusted (a row may be imported): each cell is made
safe by ``diagnostics.untrusted``, the one place that knows how (``visible`` for the page's data,
``markdown_cell`` for the README, ``html_text`` for the report). An imported row that disagrees
with the row run here for the same engine and policy says so in its verdict cell."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import re
from dataclasses import dataclass, field

from diagnostics.untrusted import html_text, markdown_cell, visible
from diagnostics.verdicts.findings import finding_for
from diagnostics.verdicts.table import CONTROL_FAILED, ENGINE_ERROR, SPECULATION_INACTIVE, disagreement, is_run_here
from diagnostics.verdicts.table_file import write_atomically

START = "<!-- verdicts:start (written by `python -m diagnostics verdicts`; edits here are overwritten) -->"
END = "<!-- verdicts:end -->"


# Each outcome's class (a CSS class in reports, a colour on the Audit page, a mark in Markdown).
VERDICT_CLASSES = {"pass": "pass", "fail": "fail", "inconclusive": "inconclusive", ENGINE_ERROR: "error",
                   SPECULATION_INACTIVE: "inactive", CONTROL_FAILED: "control"}
VERDICT_COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#9a6700", "error": "#8250df", "inactive": "#6e7781",
                   "control": "#bc4c00"}
# Markdown has no colour: a coloured mark before the verdict does its work in the README.
VERDICT_MARKS = {"pass": "🟢", "fail": "🔴", "inconclusive": "🟡", "error": "🟣", "inactive": "⚪", "control": "🟠"}
# Engine families in the order the table groups them: this lab first, then by engine.
FAMILIES = ("ours", "mutant:", "transformers", "llama-cpp-python", "llama-server", "vllm", "openvino", "onnxruntime-genai")


def verdict_class(verdict: object) -> str:
    """``pass``, ``fail``, ``inconclusive``, ``error``, ``inactive`` or ``control`` (its control failed)."""
    return VERDICT_CLASSES.get(str(verdict), "inconclusive")


def short_version(version: object) -> str:
    """A version as the table shows it: ``llama.cpp 4227c9b`` for ``llama.cpp commit 4227c9be4
    (llama-server --version: …)``, ``llama.cpp b6800`` for a numbered build, the rest without what
    follows its first parenthesis or comma (the whole build string stays in the JSON)."""
    text = " ".join(str(version).split())
    commit = re.match(r"llama\.cpp commit ([0-9a-f]{7})", text)
    if commit:
        return f"llama.cpp {commit.group(1)}"
    build = re.match(r"llama\.cpp (b\d+)", text)
    if build:
        return f"llama.cpp {build.group(1)}"
    return text.split(" (", 1)[0].split(", ", 1)[0][:60]


def _figure(value: Any, spec: str = ".3g") -> str:
    return "–" if not isinstance(value, (int, float)) or isinstance(value, bool) else format(value, spec)


def policy_text(settings: dict[str, Any]) -> str:
    """``temperature 1 · top-k 20`` from a row's settings (unset fields left out)."""
    words = [f"temperature {_figure(settings.get('temperature'), 'g')}"]
    for key, name in (("top_k", "top-k"), ("top_p", "top-p"), ("min_p", "min-p")):
        if settings.get(key) is not None:
            words.append(f"{name} {_figure(settings[key], 'g')}")
    return " · ".join(words)


def _side_p(side: dict[str, Any]) -> str:
    """A side's p-value, with the tokens the law gives probability 0 and the generations cut short
    of max_tokens without EOS (each a fail whatever p says)."""
    extra = ""
    for key, words in (("impossible", "impossible tokens"), ("stopped_short", "generations cut short")):
        count = side.get(key)
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            extra += f" · {count:,} {words}"
    p_value = side.get("p_value")
    # A p-value below the smallest double is stored as 0: it is tiny, not zero.
    shown = "< 1e-300" if p_value == 0 and not isinstance(p_value, bool) else _figure(p_value, ".2g")
    return f"{shown}{extra}"


def _verdict_cell(row: dict[str, Any]) -> str:
    """The row's verdict, with what an engine error said (its first 120 characters) or what the
    engine's counters say when speculation was inactive."""
    verdict = str(row["verdict"])
    if verdict == ENGINE_ERROR:
        said = next((row[side].get("error") for side in ("on", "off") if row[side].get("error")), "")
        return f"{verdict}: {said[:120]}" if said else verdict
    if verdict == SPECULATION_INACTIVE:
        counters = row["on"].get("speculation") or {}
        return f"{verdict} ({counters.get('drafted', '?')} drafted, {counters.get('accepted', '?')} accepted)"
    return verdict


def display_rows(table: dict[str, Any]) -> list[dict[str, str]]:
    """One dict of readable cells per row (plain text, not Markdown: the page shows them as data)."""
    out = []
    for row in table["rows"]:
        on, off = row["on"], row["off"]
        interval = (f"{_figure(on.get('distortion'), '.3f')} [{_figure(on.get('distortion_low'), '.3f')}, "
                    f"{_figure(on.get('distortion_high'), '.3f')}]")
        other = disagreement(table, row)
        verdict = _verdict_cell(row)
        if other is not None:
            verdict = f"{verdict} · disagrees with the row run here ({other})"
        # An imported side's audit lives in its maker's store: named, never taken for one of this store's.
        audit = on.get("audit_id") or (f"{on['audit_id_elsewhere']} (elsewhere)" if on.get("audit_id_elsewhere") else "–")
        cells = {
            "engine": row["label"], "version": short_version(row["version"]), "policy": policy_text(row["settings"]), "verdict": verdict,
            "p": _side_p(on), "tokens": _figure(on.get("tokens"), ","),
            "detects TV ≥": _figure(on.get("detectable_tv"), ".3f"), "distortion [95%]": interval,
            "control (off)": f"{off.get('verdict')} (p {_side_p(off)})",
            "evidence": f"{on.get('file') or '–'} sha256 {str(on.get('sha256') or '–')[:12]} · audit {audit}",
            # An imported row took no time here: "–", and where it came from.
            "time here": f"{_figure(row.get('time_s'), '.0f')} s" if is_run_here(row) else f"– ({row.get('provenance')})",
        }
        out.append({name: visible(cell) for name, cell in cells.items()})  # data, but shown: no invisible character acts
    return out


@dataclass
class GlanceRow:
    """One engine mode (an engine row, run here or imported) with its policies side by side:
    readable cells (plain text), each policy cell's verdict class, and its finding page."""

    cells: dict[str, str]
    classes: dict[str, str] = field(default_factory=dict)
    finding: Any = None  # findings.Finding


def _counters_text(side: dict[str, Any]) -> str:
    counters = side.get("speculation")
    if not isinstance(counters, dict):
        return ""
    text = f"{counters.get('accepted', 0):,} of {counters.get('drafted', 0):,} drafts kept"
    counted, generations = counters.get("generations"), side.get("generations")
    # Counts over part of the side (replayed on its first generations, ``replay``) say over how many.
    if isinstance(counted, int) and isinstance(generations, int) and counted < generations:
        text += f" in {counted:,} of {generations:,} generations"
    return text


def _glance_cell(row: dict[str, Any], table: dict[str, Any]) -> str:
    """A policy's cell: the verdict, its p-value (or the engine's error, cut), what the engine's own
    counters say, and a disagreement with the row run here."""
    verdict = str(row["verdict"])
    if verdict == ENGINE_ERROR:
        said = str(next((row[side].get("error") for side in ("on", "off") if row[side].get("error")), ""))
        if said.startswith(str(row["label"])) and ": " in said:  # the row's name is the line's own: what it said matters
            said = said.split(": ", 1)[1]
        cell = f"{verdict}: {said[:100]}{'…' if len(said) > 100 else ''}" if said else verdict
    elif verdict == SPECULATION_INACTIVE:
        counters = row["on"].get("speculation") or {}
        cell = f"{verdict} ({counters.get('drafted', '?')} drafted, {counters.get('accepted', '?')} accepted)"
    elif verdict == CONTROL_FAILED:  # what failed is the control: its figures, not speculation's
        cell = f"{verdict} · control p {_side_p(row['off'])}"
    else:
        cell = f"{verdict} · p {_side_p(row['on'])}"
        counted = _counters_text(row["on"])
        # A row without the engine's own counts (an engine that reports none, or a row made before
        # they were kept) says so: its pass does not show that speculation ran.
        cell += f" · {counted}" if counted else " · drafts not counted"
    other = disagreement(table, row)
    return f"{cell} · disagrees with the row run here ({other})" if other is not None else cell


def _family(engine: str) -> int:
    return next((index for index, prefix in enumerate(FAMILIES) if engine.startswith(prefix)), len(FAMILIES))


def glance_rows(table: dict[str, Any]) -> list[GlanceRow]:
    """The table at a glance: one row per engine mode (run here, and each import apart), grouped by
    engine family, its policies side by side (columns named as ``policy_text`` names them), its
    short version and its finding. Cells are plain text (``visible``), as ``display_rows``."""
    policies: list[str] = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in table["rows"]:
        shown = policy_text(row["settings"])
        if shown not in policies:
            policies.append(shown)
        groups.setdefault((row["engine"], "" if is_run_here(row) else str(row.get("provenance"))), []).append(row)
    policies.sort(key=lambda text: (text != "temperature 1", text))  # plain temperature 1 first, then the truncations
    out = []
    ordered = sorted(groups.items(), key=lambda item: (_family(item[0][0]), list(groups).index(item[0])))
    for (engine, imported), rows in ordered:
        first = rows[0]
        label = first["label"] if not imported else f"{first['label']} · imported ({imported})"
        finding = finding_for(engine) if any(row["verdict"] == "fail" or row["verdict"] == ENGINE_ERROR for row in rows) else None
        cells = {"engine": label, "version": short_version(first["version"])}
        classes = {}
        for policy in policies:
            row = next((row for row in rows if policy_text(row["settings"]) == policy), None)
            cells[policy] = "–" if row is None else _glance_cell(row, table)
            if row is not None:
                classes[policy] = verdict_class(row["verdict"])
        cells["finding"] = finding.title if finding is not None else "–"
        out.append(GlanceRow({name: visible(cell) for name, cell in cells.items()}, classes, finding))
    return out


def markdown_table(table: dict[str, Any]) -> str:
    """The table in Markdown: at a glance (each verdict after its coloured mark, each finding a link
    to its page), then every row in detail; escaped cell by cell."""
    rows = display_rows(table)
    if not rows:
        return "No verdicts yet: run `python -m diagnostics verdicts`."
    glance = glance_rows(table)
    header = list(glance[0].cells)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in glance:
        cells = []
        for name in header:
            cell = markdown_cell(row.cells[name])
            if name in row.classes:
                cell = f"{VERDICT_MARKS[row.classes[name]]} {cell}"
            if name == "finding" and row.finding is not None:  # our own page and title: a link
                cell = f"[{markdown_cell(row.finding.title)}]({row.finding.link})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    detail = list(rows[0])
    lines += ["", "<details><summary>Every row in detail (p-values, sample sizes, distortion, controls, evidence)</summary>", "",
              "| " + " | ".join(detail) + " |", "|" + "---|" * len(detail)]
    lines += ["| " + " | ".join(markdown_cell(row[name]) for name in detail) + " |" for row in rows]
    lines += ["", "</details>"]
    return "\n".join(lines)


def write_readme_table(readme: Path, table: dict[str, Any]) -> None:
    """Replace what lies between the marker lines of ``readme`` with the table (refused in one line
    when the markers are missing: the command never guesses where a table goes)."""
    write_atomically(readme, readme_with_table(readme, table).encode("utf-8"))


def readme_with_table(readme: Path, table: dict[str, Any]) -> str:
    """The text of ``readme`` with the table between its marker lines (``write_readme_table``);
    a one-line ``ValueError`` when the markers are missing. Nothing is written."""
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise ValueError(f"{readme} has no verdict table markers: put the line {START!r} and below it the line {END!r} "
                         "where the table goes")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{markdown_table(table)}\n{END}{tail}"


VERDICT_CSS = " ".join(f"td.verdict-{name} {{ background: {colour}; color: white; }}" for name, colour in VERDICT_COLOURS.items())
# The at-a-glance table fits its page: it takes the width it is given and its cells wrap (a grid of
# fixed-width columns cut the verdicts and the findings at a laptop's width).
GLANCE_CSS = ("table.verdict-glance { width: 100%; border-collapse: collapse; table-layout: auto; font-size: 0.9rem; } "
              "table.verdict-glance th, table.verdict-glance td { border: 1px solid #d0d7de; padding: 4px 6px; "
              "text-align: left; vertical-align: top; overflow-wrap: break-word; } "
              # a fill that reads in a light and a dark theme (the header's text follows the theme)
              "table.verdict-glance th { background: rgba(127, 127, 127, 0.15); }")


def glance_html(table: dict[str, Any]) -> str:
    """The at-a-glance table (``glance_rows``) as HTML that fits the width it is given: its own CSS,
    each verdict cell coloured by its class, every cell escaped (the file may come from elsewhere);
    "" for a table without rows."""
    glance = glance_rows(table)
    if not glance:
        return ""
    header = "".join(f"<th>{html.escape(name)}</th>" for name in glance[0].cells)
    body = "".join(
        "<tr>" + "".join(f'<td class="verdict-{row.classes[name]}">{html_text(cell)}</td>' if name in row.classes
                         else f"<td>{html_text(cell)}</td>" for name, cell in row.cells.items()) + "</tr>" for row in glance)
    return f'<style>{VERDICT_CSS} {GLANCE_CSS}</style><table class="verdict-glance"><tr>{header}</tr>{body}</table>'


def html_section(table: dict[str, Any]) -> str:
    """The table as an HTML section for a report: at a glance (each verdict cell coloured by its
    class, ``VERDICT_CSS``), then every row in detail; every cell escaped (the file may come from elsewhere)."""
    rows = display_rows(table)
    if not rows:
        return ""
    header = "".join(f"<th>{html.escape(name)}</th>" for name in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html_text(cell)}</td>" for cell in row.values()) + "</tr>" for row in rows)
    return ('<section class="run"><h2>Verdicts on real engines</h2><p class="meta">Each engine with speculation on and, as its '
            "control, off, under the same sampling settings, audited against the target's law; a row whose control fails reads "
            "'control failed: settings not matched'; a pass counts only where the engine's own counters show it drafted and kept "
            "tokens. 'detects TV ≥': the smallest distortion the sample finds at 90% power.</p>"
            f"{glance_html(table)}"
            f"<h3>Every row in detail</h3><table><tr>{header}</tr>{body}</table></section>")
