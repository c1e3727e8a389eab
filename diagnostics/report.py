"""One self-contained HTML file for a run or a compared group: works offline, opens anywhere.

plotly.js is inlined once; figures are the same as the pages' (``diagnostics.charts``). Every
piece of user or model text (prompt, output, token text) is HTML-escaped. A compared group is
reported whole (its reference first), so every divergence points at a run the report shows.
"""

from __future__ import annotations

import html
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import plotly.io as pio
from plotly.offline import get_plotlyjs

from diagnostics import __version__
from diagnostics.audit.reporting import pair_rows, worst_position_rows, worst_prompt_rows
from diagnostics.charts import audit_figure, token_strip_html, tracks_figure
from diagnostics.metrics import log_likelihood
from diagnostics.store import Store, StoreError, complete_groups
from diagnostics.untrusted import visible

SUMMARY_FIELDS = [
    ("acceptance rate", "acceptance_rate", "accepted drafts / drafted tokens"),
    ("block efficiency", "block_efficiency", "emitted tokens per target forward pass"),
    ("tokens/s", "tokens_per_s", "emitted tokens per second of wall time"),
    ("mean TV(P, p)", "mean_tv_target", "mean distortion against the target"),
    ("max TV(P, p)", "max_tv_target", "largest per-position distortion"),
    ("mean TV(P, baseline)", "mean_tv_baseline", "mean distortion against the matched baseline"),
    ("log-likelihood", "log_likelihood", "Σ log p(y) of the output under the target's policy law"),
]


def _text(value: Any, keep: str = "") -> str:
    """Untrusted text for HTML: control and format characters shown as escapes, then HTML-escaped."""
    return html.escape(visible(value, keep=keep))


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, float):
        return f"{value:.4f}"
    return _text(value)


def reproduce_command(run_id: str, db: str | Path) -> str:
    """The shell command that records a stored run again with its own settings and says whether it
    reproduced its tokens (``run --replay``); both arguments shell-quoted (a run id comes from a file)."""
    def option(name: str, value: str) -> str:
        # "--replay=-x": a value that starts with a dash must not read as an option.
        return f"{name}{'=' if value.startswith('-') else ' '}{shlex.quote(value)}"

    return f"python -m diagnostics run {option('--replay', str(run_id))} {option('--db', str(db))}"


def _divergence(run: dict[str, Any], references: dict[str, str | None]) -> tuple[str, str]:
    """A run's place in its compared group: (table cell, sentence for the meta line, HTML-escaped).
    ``references`` maps a group id to its reference run, or to ``None`` when the file lacks it."""
    group_id = run.get("group_id")
    if group_id is None:
        return "–", ""
    reference = references.get(group_id)
    if reference == run["run_id"]:
        return "reference", f"reference run of group {_text(group_id)}"
    position = run.get("divergence_position")
    where = (f"the reference run {_text(reference)} of group {_text(group_id)}" if reference is not None
             else f"the reference run of group {_text(group_id)} (not in this file)")
    if position is None:
        return "none", f"no divergence from {where}"
    return _number(position), f"first divergence from {where}: {_number(position)}"


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    header = "".join(f"<th>{_text(name)}</th>" for name in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{_number(value)}</td>" for value in row.values()) + "</tr>" for row in rows)
    return f"<table><tr>{header}</tr>{body}</table>"


def audit_section(audit: dict[str, Any], index: int) -> str:
    """One stored audit (a ``Store.get_audit`` row): verdict, summary, chart and evidence tables."""
    evidence = audit["evidence"]
    verdict = str(audit["verdict"])
    figure = audit_figure(evidence)
    chart = pio.to_html(figure, include_plotlyjs=False, full_html=False, div_id=f"audit-{index}") if figure else ""
    reasons = evidence.get("reasons") or [f"{flag['check']} at position {flag['position']}: {flag['detail']}" for flag in evidence.get("flags", [])[:10]]
    return f"""
<section class="audit">
  <h3>{_text(audit['layer'])} audit · {_text(audit['implementation'])}
      <span class="verdict {verdict if verdict in ('fail', 'inconclusive') else 'pass'}">{_text(verdict.upper())}</span></h3>
  <p class="meta">audit {_text(audit['audit_id'])} · {_text(audit['created'])}</p>
  <p>{_text(audit['summary'])}</p>
  {''.join(f'<p class="reason">{_text(reason)}</p>' for reason in reasons)}
  {chart}
  {_table(pair_rows(evidence)) if evidence.get('layer') == 'rule' else ''}
  {_table(worst_position_rows(evidence))}
  {_table(worst_prompt_rows(evidence))}
</section>"""


def sweep_section(store: Store, sweep_id: str, index: int, cost: float = 0.5) -> str:
    """One stored sweep: its settings, the Pareto chart, every setting's figures with intervals, the verdicts."""
    from diagnostics.charts import pareto_figure
    from diagnostics.evaluation.stats import summarise_sweep, sweep_table

    sweep = store.get_sweep(sweep_id)
    if sweep is None:
        raise StoreError(f"there is no sweep {sweep_id!r} in {store.path}")
    settings = sweep["settings"]
    summaries = summarise_sweep(sweep_table(store, sweep_id, cost))
    chart = (pio.to_html(pareto_figure(summaries), include_plotlyjs=False, full_html=False, div_id=f"sweep-{index}")
             if summaries else "<p>No unit has finished.</p>")

    def cell(value: tuple[float, float, float]) -> str:
        mean, low, high = value
        return "–" if mean != mean else f"{mean:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low == low else "")

    rows = [{"setting": summary.label, "role": summary.role, "units": summary.units,
             **{name: cell(summary.figures[name]) for name in ("modelled speed-up", "TV(P, baseline)", "path KL", "accuracy")}}
            for summary in summaries]
    verdicts = "".join(f'<p class="reason">{_text(summary.verdict())}</p>' for summary in summaries if summary.role == "rule")
    return f"""
<section class="run">
  <h2>Sweep {_text(sweep_id)} <small>{_text(sweep['status'])} · {_number(sweep['units_done'])} of {_number(sweep['units'])} units</small></h2>
  <p class="meta">prompts {_text(settings.get('prompt_file'))} ({len(settings.get('prompts', []))}) · rules {_text(', '.join(settings.get('rules', [])))} ·
     {_number(settings.get('seeds'))} seeds · draft {_text(settings.get('request', {}).get('draft'))} · cost ratio c = {cost:g} for the modelled speed-up ·
     95% intervals: bootstrap over prompts, then seeds</p>
  {chart}
  {_table(rows)}
  {verdicts}
</section>"""


def build_report(store: Store, run_ids: list[str], audit_ids: list[str] | None = None, sweep_ids: list[str] | None = None,
                 cost: float = 0.5) -> str:
    """HTML text of the report for ``run_ids`` (one run, or a coupled group in order), with the
    stored audits of those runs, the audits ``audit_ids`` and the sweeps ``sweep_ids`` (their
    figures at draft/target cost ratio ``cost``). Every member of a compared group one of the
    runs belongs to is included (the report says which were added); the reproduce line of each
    run is its ``run --replay`` command against this store's file."""
    audit_ids = list(audit_ids or [])
    sweep_ids = list(sweep_ids or [])
    if not run_ids and not audit_ids and not sweep_ids:
        raise StoreError("give at least one run id, audit id or sweep id")
    completion = complete_groups(store, run_ids)
    run_ids = completion.run_ids
    db_path = store.path.absolute()
    runs = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        if run is None:
            raise StoreError(f"there is no run {run_id!r} in {store.path}")
        positions = store.positions(run_id)
        run["log_likelihood"] = log_likelihood(positions["p_token"]) if len(positions) else None
        runs.append((run, positions))
    linked = store.list_audits(run_ids)["audit_id"].tolist() if run_ids else []
    audits = []
    for audit_id in dict.fromkeys(linked + audit_ids):
        audit = store.get_audit(audit_id)
        if audit is None:
            raise StoreError(f"there is no audit {audit_id!r} in {store.path}")
        audits.append(audit)
    references: dict[str, str | None] = {}
    for run, _ in runs:  # complete_groups puts each group's members in creation order: the first is the reference,
        if run.get("group_id") is not None and run["group_id"] not in references:  # unless it diverges (the file lacks it)
            references[run["group_id"]] = run["run_id"] if run.get("divergence_position") is None else None
    sections = []
    for index, (run, positions) in enumerate(runs):
        records = positions.to_dict("records")
        divergence = run.get("divergence_position") if references.get(run.get("group_id")) != run["run_id"] else None
        _, place = _divergence(run, references)
        figure = tracks_figure(positions, divergence=divergence) if len(positions) else None
        figure_html = pio.to_html(figure, include_plotlyjs=False, full_html=False, div_id=f"tracks-{index}") if figure else "<p>No positions.</p>"
        sections.append(f"""
<section class="run">
  <h2>{_text(run['rule'])} <small>run {_text(run['run_id'])} · {_text(run['status'])}</small></h2>
  <p class="meta">target {_text(run['target'])} · draft {_text(run['draft'])} · γ = {_number(run['gamma'])} · seed {_number(run['seed'])} ·
     max new tokens {_number(run.get('max_new_tokens'))} · policy {_text(run['policy'] or '')} · ran on {_text(run.get('device') or 'unknown')}{' · ' + place if place else ''}</p>
  <h3>Output</h3>
  {token_strip_html(records, divergence=divergence)}
  <h3>Per-position tracks</h3>
  {figure_html}
  <p class="meta">Reproduce: <code>{_text(reproduce_command(run['run_id'], db_path))}</code></p>
</section>""")
    sections += [sweep_section(store, sweep_id, index, cost) for index, sweep_id in enumerate(sweep_ids)]
    if audits:
        sections.append('<section class="run"><h2>Losslessness audits</h2>'
                        '<p class="meta">A correct implementation fails an audit with probability at most its level (1% by default).</p>'
                        + "".join(audit_section(audit, index) for index, audit in enumerate(audits)) + "</section>")
    header_cells = "".join(f"<th title='{html.escape(help_)}'>{html.escape(name)}</th>" for name, _, help_ in SUMMARY_FIELDS)
    rows = "".join(
        f"<tr><td>{_text(run['run_id'])}</td><td>{_text(run['rule'])}</td><td>{_divergence(run, references)[0]}</td>"
        + "".join(f"<td>{_number(run.get(key))}</td>" for _, key, _ in SUMMARY_FIELDS) + "</tr>"
        for run, _ in runs
    )
    added = "".join(f'<p class="meta">Note: {_text(note)}.</p>' for note in completion.notes("reported"))
    summary = (f"""<h3>Prompt</h3><pre>{_text(runs[0][0]['prompt'] or '', keep=chr(10) + chr(9))}</pre>
<h3>Summary</h3>{added}
<table><tr><th>run</th><th>rule</th><th title="first position where the run decides differently from the reference run of its group">first divergence</th>{header_cells}</tr>{rows}</table>
<p class="meta">Definitions: hover a column title. TV(a, b) = ½ Σ |a − b|; P is the exact law each token was drawn from.</p>"""
               if runs else "")
    subject = f"target {runs[0][0]['target']}" if runs else (f"{len(sweep_ids)} sweep(s)" if sweep_ids else f"{len(audits)} audit(s)")
    title = ", ".join(run["rule"] for run, _ in runs) or ("sweeps" if sweep_ids else "losslessness audits")
    created = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; font-src data:">
<title>Speculative decoding report: {_text(title)}</title>
<style>
 body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #1f2328; }}
 table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #d0d7de; padding: 4px 8px; text-align: right; }}
 .meta {{ color: #57606a; font-size: 0.9em; }} section.run {{ border-top: 1px solid #d0d7de; margin-top: 2em; }}
 pre {{ white-space: pre-wrap; background: #f6f8fa; padding: 8px; }}
 .verdict {{ padding: 2px 8px; border-radius: 4px; color: white; }} .verdict.pass {{ background: #1a7f37; }} .verdict.fail {{ background: #cf222e; }} .verdict.inconclusive {{ background: #9a6700; }}
</style>
<script>{get_plotlyjs()}</script>
</head><body>
<h1>Speculative decoding verification report</h1>
<p class="meta">spec-verify-lab {html.escape(__version__)} · written {created} · {_text(subject)}</p>
{summary}
{''.join(sections)}
</body></html>
"""
