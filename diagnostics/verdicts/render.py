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

from diagnostics.untrusted import html_text, markdown_cell, visible
from diagnostics.verdicts.table import ENGINE_ERROR, SPECULATION_INACTIVE, disagreement, is_run_here
from diagnostics.verdicts.table_file import write_atomically

START = "<!-- verdicts:start (written by `python -m diagnostics verdicts`; edits here are overwritten) -->"
END = "<!-- verdicts:end -->"


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
    return f"{_figure(side.get('p_value'), '.2g')}{extra}"


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
            "engine": row["label"], "version": row["version"], "policy": policy_text(row["settings"]), "verdict": verdict,
            "p": _side_p(on), "tokens": _figure(on.get("tokens"), ","),
            "detects TV ≥": _figure(on.get("detectable_tv"), ".3f"), "distortion [95%]": interval,
            "control (off)": f"{off.get('verdict')} (p {_side_p(off)})",
            "evidence": f"{on.get('file') or '–'} sha256 {str(on.get('sha256') or '–')[:12]} · audit {audit}",
            # An imported row took no time here: "–", and where it came from.
            "time here": f"{_figure(row.get('time_s'), '.0f')} s" if is_run_here(row) else f"– ({row.get('provenance')})",
        }
        out.append({name: visible(cell) for name, cell in cells.items()})  # data, but shown: no invisible character acts
    return out


def markdown_table(table: dict[str, Any]) -> str:
    """The table in Markdown, escaped cell by cell."""
    rows = display_rows(table)
    if not rows:
        return "No verdicts yet: run `python -m diagnostics verdicts`."
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(markdown_cell(row[name]) for name in header) + " |" for row in rows]
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


def html_section(table: dict[str, Any]) -> str:
    """The table as an HTML section for a report, every cell escaped (the file may come from elsewhere)."""
    rows = display_rows(table)
    if not rows:
        return ""
    header = "".join(f"<th>{html.escape(name)}</th>" for name in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html_text(cell)}</td>" for cell in row.values()) + "</tr>" for row in rows)
    return ('<section class="run"><h2>Verdicts on real engines</h2><p class="meta">Each engine with speculation on and, as its '
            "control, off, under the same sampling settings, audited against the target's law; a row whose control fails reads "
            "'control failed: settings not matched'. 'detects TV ≥': the smallest distortion the sample finds at 90% power.</p>"
            f"<table><tr>{header}</tr>{body}</table></section>")
