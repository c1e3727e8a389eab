"""One self-contained HTML file for a run or a compared group: works offline, opens anywhere.

plotly.js is inlined once; figures are the same as the pages' (``diagnostics.charts``). Every
piece of user or model text (prompt, output, token text) is HTML-escaped. A compared group is
reported whole (its reference first), so every divergence points at a run the report shows; each
run is told against its own seed's reference, with the chart of why it leaves it.

A report is made to be shared: nothing of the sender's machine goes in. Absolute paths (a model
folder, a samples file, the database) are cut to their last part, URLs to their scheme, and the
reproduce lines name the database by its base name (``SHARED_DB_NAME`` where that name would
tell the user or host name).

A report is built in memory bounded whatever a run's length (a shared file may hold a run of 10⁶
positions): a run of up to ``SHOWN_POSITIONS`` positions is shown whole; a longer one shows its
first ``SHOWN_POSITIONS`` in the token strip and the tracks, and says so in one line with the
figures of all its positions, computed in the database (counts by kind, blocks, log-likelihood,
distortion); its first divergence and the step there are found in the database too.
"""

from __future__ import annotations

import functools
import html
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from diagnostics import __version__
from diagnostics.audit.reporting import pair_rows, worst_position_rows, worst_prompt_rows
from diagnostics.charts import audit_figure, token_strip_html, tracks_figure
from diagnostics.comparison import positions_divergence, seed_references
from diagnostics.inspection import target_spec
from diagnostics.metrics import log_likelihood
from diagnostics.models import DEFAULT_TARGET, ModelError, embedded_tokenizer
from diagnostics.policy import policy_words
from diagnostics.shareable import machine_free, shared_db_name
from diagnostics.store import Store, StoreError, complete_groups
from diagnostics.untrusted import visible
from diagnostics.divergence import chain_divergence, run_decision, shape_label

# Runs up to this many positions are reported whole (as they always were); a longer run shows this
# many (the token strip and the tracks were made for about 2,000) and summarises the rest.
SHOWN_POSITIONS = 2_000

SUMMARY_FIELDS = [
    ("acceptance rate", "acceptance_rate", "accepted drafts / drafted tokens (tree: / positions decided at a node with children)"),
    ("block efficiency", "block_efficiency", "emitted tokens per target forward pass"),
    ("tokens/s", "tokens_per_s", "emitted tokens per second of wall time"),
    ("mean TV(P, p)", "mean_tv_target", "mean distortion against the target"),
    ("max TV(P, p)", "max_tv_target", "largest per-position distortion"),
    ("mean TV(P, baseline)", "mean_tv_baseline", "mean distortion against the matched baseline"),
    ("log-likelihood", "log_likelihood", "Σ log p(y) of the output under the target's policy law"),
]


def _text(value: Any, keep: str = "", content: bool = False) -> str:
    """Untrusted text for HTML: paths and URLs cut (``machine_free``; not in ``content``, the
    prompt a user wrote, which is shown as written), control and format characters shown as
    escapes, then HTML-escaped."""
    if not content and isinstance(value, str):
        value = machine_free(value)
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


@dataclass(frozen=True)
class ShownPositions:
    """A run's positions as a report holds them: ``frame`` is every position (``summary`` ``None``)
    or, for a run longer than ``SHOWN_POSITIONS``, its first ``SHOWN_POSITIONS``, with ``summary``
    the figures of all of them (``Store.positions_summary``)."""

    frame: pd.DataFrame
    summary: dict[str, Any] | None = None

    @property
    def whole(self) -> bool:
        """Whether ``frame`` holds every position of the run."""
        return self.summary is None


def shown_positions(store: Store, run_id: str, limit: int | None = None) -> ShownPositions:
    """A run's positions for the report: all of them up to ``limit`` (default ``SHOWN_POSITIONS``),
    else the first ``limit`` and the figures of all (in the database: memory bounded whatever the
    run's length)."""
    limit = SHOWN_POSITIONS if limit is None else limit
    if store.position_count(run_id) <= limit:
        return ShownPositions(store.positions(run_id))
    return ShownPositions(store.positions_window(run_id, 0, limit), store.positions_summary(run_id))


def summarised_line(shown: ShownPositions, divergence: int | None) -> str:
    """The one line that says what a long run's section shows and summarises (HTML-escaped); ``""``
    for a run shown whole."""
    if shown.summary is None:
        return ""
    figures, count = shown.summary, len(shown.frame)
    total = int(figures["positions"])
    where = ""
    if divergence is not None and divergence >= count:
        where = f" The first divergence, position {divergence:,}, lies beyond the positions shown: its step is charted below."
    return (f'<p class="meta summarised">Positions 0 … {count - 1:,} shown of {total:,}; the other {total - count:,} are summarised. '
            f"Over all {total:,} positions: {int(figures['accepted']):,} accepted drafts, {int(figures['rejected']):,} rejected → "
            f"fallback, {int(figures['bonus']):,} bonus tokens in {int(figures['blocks']):,} blocks; mean TV(P, p) "
            f"{_number(figures['mean_tv_target'])} (max {_number(figures['max_tv_target'])}), mean TV(P, baseline) "
            f"{_number(figures['mean_tv_baseline'])}; log-likelihood {_number(figures['log_likelihood'])}.{where}</p>")


def _references(store: Store, runs: list[dict[str, Any]]) -> dict[tuple[str, int], str | None]:
    """Each (group, seed)'s reference run id, ``None`` where the file lacks it (``seed_references``)."""
    found: dict[tuple[str, int], str | None] = {}
    for group_id in dict.fromkeys(run["group_id"] for run in runs if run.get("group_id") is not None):
        # group_members: the columns that find the references, not the members' token lists.
        for seed, run_id in seed_references(store.group_members(group_id)).items():
            found[(group_id, seed)] = run_id
    return found


def _reference_of(run: dict[str, Any], references: dict[tuple[str, int], str | None]) -> str | None:
    """The run's own seed's reference in its group (``None``: not grouped, or not in the file)."""
    if run.get("group_id") is None or run.get("seed") is None:
        return None
    return references.get((run["group_id"], int(run["seed"])))


def _divergence(run: dict[str, Any], reference: str | None, position: int | None) -> tuple[str, str]:
    """A run's place in its compared group: (table cell, sentence for the meta line, HTML-escaped).
    ``reference``: its seed's reference run (``None`` when the file lacks it); ``position``: its
    first divergence from that run."""
    group_id = run.get("group_id")
    if group_id is None:
        return "–", ""
    of_group = f"of group {_text(group_id)} at seed {_number(run.get('seed'))}"
    if reference == run["run_id"]:
        return "reference", f"reference run {of_group}"
    where = (f"the reference run {_text(reference)} {of_group}" if reference is not None
             else f"the reference run {of_group} (not in this file)")
    if position is None:
        return "never", f"no divergence from {where}"
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
    # The chart's title names the reference law, maybe by a model folder's path: cut like the text.
    figure = audit_figure({**evidence, "reference": machine_free(str(evidence["reference"]))} if "reference" in evidence else evidence)
    chart = _figure_html(figure, f"audit-{index}") if figure else ""
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


def sweep_section(store: Store, sweep_id: str, index: int, cost: float | str | None = None) -> str:
    """One stored sweep: its settings, the Pareto chart, every setting's figures with intervals, the
    verdicts; the modelled speed-ups at ``cost`` (a number, or ``"analytic"``), else at the cost
    ratio stored with the sweep (so the report, the Sweeps page and the CLI agree): ``resolve_cost``'s
    c, named by its phrase, and flagged when implausible (``stored_cost_flag``)."""
    from diagnostics.charts import pareto_figure
    from diagnostics.evaluation.settings import resolve_cost, stored_cost_flag
    from diagnostics.evaluation.stats import summarise_sweep, sweep_table

    sweep = store.get_sweep(sweep_id)
    if sweep is None:
        raise StoreError(f"there is no sweep {sweep_id!r} in {store.path}")
    settings = sweep["settings"]
    given = cost
    cost, source = resolve_cost(settings, cost)
    cost_note = f"cost ratio c = {cost:g} ({_text(source)}) for the modelled speed-up"
    flag = stored_cost_flag(settings) if given is None else None
    cost_flag = f'<p class="reason">Cost ratio: {_text(flag)} (report --cost analytic takes it.)</p>' if flag else ""
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
     {_number(settings.get('seeds'))} seeds · draft {_text(settings.get('request', {}).get('draft'))} · {cost_note} ·
     95% intervals: bootstrap over prompts, then seeds</p>
  {cost_flag}
  {chart}
  {_table(rows)}
  {verdicts}
</section>"""


def _divergence_position(store: Store, run: dict[str, Any], reference: str | None, shown: ShownPositions,
                         by_id: dict[str, tuple[dict[str, Any], ShownPositions]]) -> int | None:
    """The run's first divergence from its own seed's reference: recomputed from both runs' stored
    positions when the report holds the reference (in the database when either run is longer than
    the report shows), else the stored position (measured, when it was run, against a reference
    this file lacks); ``None`` for the reference itself and ungrouped runs."""
    if run.get("group_id") is None or reference == run["run_id"]:
        return None
    if reference in by_id:
        reference_shown = by_id[reference][1]
        if reference_shown.whole and shown.whole:
            return positions_divergence(reference_shown.frame, shown.frame)
        return store.first_divergence(reference, run["run_id"])
    stored = run.get("divergence_position")
    return None if pd.isna(stored) else int(stored)


def _stored_decoder(run: dict[str, Any], *frames: Any):
    """Token id → the text the runs stored for it; for an id none of them emitted or drafted (a
    top-k neighbour), the embedded default's tokenizer when the run's target is that model (our own
    file: a name in a shared database never makes a report load anything else), else ``id N``.
    A report loads no model weights."""
    texts: dict[int, str | None] = {}
    for frame in frames:
        for token_column, text_column in (("token", "token_text"), ("draft_token", "draft_text")):
            if token_column in frame and text_column in frame:
                for token, text in zip(frame[token_column], frame[text_column]):
                    if isinstance(text, str) and not pd.isna(token):  # a bonus has no draft: NA
                        texts.setdefault(int(token), text)
    return _decoder(run, texts)


def _store_decoder(store: Store, run: dict[str, Any], run_ids: list[str],
                   records: list[dict[str, Any]]) -> Callable[[Any], str]:
    """``_stored_decoder`` of runs too long to hold: the texts of the ids at ``records`` (emitted,
    drafted, the top-k of ``p`` and ``q``) looked up in the database at once, any other id when it
    is asked for (each lookup bounded: one id, a scan in the database)."""
    wanted: set[int] = set()
    for record in records:
        for name in ("token", "draft_token"):
            if record.get(name) is not None and not pd.isna(record[name]):
                wanted.add(int(record[name]))
        for name in ("p_top_ids", "q_top_ids"):
            values = record.get(name)
            wanted.update(int(token) for token in ([] if values is None else values))
    texts: dict[int, str | None] = dict.fromkeys(wanted)
    texts.update(store.token_texts(run_ids, sorted(wanted)))
    return _decoder(run, texts, lambda token: store.token_texts(run_ids, [token]).get(token))


def _decoder(run: dict[str, Any], texts: dict[int, str | None],
             lookup: Callable[[int], str | None] | None = None) -> Callable[[Any], str]:
    """Token id → ``texts[id]``; an id not in ``texts`` is asked of ``lookup`` (remembered); one with
    no stored text (``None``): the embedded tokenizer for a run of the embedded default, else ``id N``."""
    tokenizer = _embedded_tokenizer() if target_spec(run) == DEFAULT_TARGET else None

    def decode(token: Any) -> str:
        token = int(token)
        if token not in texts and lookup is not None:
            texts[token] = lookup(token)
        if texts.get(token) is not None:
            return texts[token]
        if tokenizer is not None and 0 <= token < len(tokenizer):
            return tokenizer.decode([token])
        return f"id {token}"

    return decode


@functools.lru_cache(maxsize=1)
def _embedded_tokenizer() -> Any:
    """The embedded tokenizer, or ``None`` when it cannot be read here (labels fall back to ``id N``)."""
    try:
        return embedded_tokenizer()
    except (ModelError, OSError, ValueError):
        return None


def _figure_html(figure: Any, div_id: str) -> str:
    from diagnostics.charts import CHART_CONFIG

    return pio.to_html(figure, include_plotlyjs=False, full_html=False, div_id=div_id, config=CHART_CONFIG)


NO_MODEL = "a report loads no model"


def _record_at(positions: Any, position: int) -> dict[str, Any] | None:
    """The stored position ``position`` of a run, ``None`` where the run has none (it ended before)."""
    rows = positions[positions["position"] == position] if len(positions) else positions
    return rows.iloc[0].to_dict() if len(rows) else None


def why_section(store: Store, reference_run: dict[str, Any], reference_positions: Any, run: dict[str, Any], positions: Any,
                position: int, index: int, whole: bool = True) -> str:
    """Why ``run`` leaves its seed's reference at ``position``, as the Compare page tells it: the one-line
    reason and the chart (``divergence_figure``; with a tree run, each run's node view), drawn
    from the stored top-k of ``p`` and ``q`` (a report loads no model). ``whole``: the two frames
    hold every position of their runs; else they are the first ones shown, and the records at
    ``position`` and the token texts are read from the database."""
    heading = f"<h3>Why it leaves the reference {_text(reference_run['rule'])} at position {int(position)}</h3>"
    if whole:
        ref_record, record = _record_at(reference_positions, position), _record_at(positions, position)
    else:
        ref_record, record = (_record_at(store.positions_window(side["run_id"], position, 1), position)
                              for side in (reference_run, run))
    if ref_record is None or record is None:
        return heading + "<p>One run ended there.</p>"
    decode = (_stored_decoder(reference_run, reference_positions, positions) if whole
              else _store_decoder(store, reference_run, [reference_run["run_id"], run["run_id"]], [ref_record, record]))
    try:
        if reference_run.get("tree") or run.get("tree"):
            return heading + "".join(_tree_or_chain_step(store, side, side_record, decode, f"why-{index}-{which}")
                                     for which, (side, side_record) in enumerate(((reference_run, ref_record), (run, record))))
        return heading + _chain_why(reference_run, ref_record, run, record, decode, f"why-{index}")
    except (KeyError, IndexError, TypeError, ValueError) as error:
        # A shared file's positions can be valid row by row yet not make a step (top-k ids that do
        # not hold the drafted token, say): the rest of the report is still worth having.
        return heading + f'<p class="meta">The stored positions there cannot be charted: {_text(str(error).splitlines()[0] if str(error) else type(error).__name__)}.</p>'


def _chain_why(reference_run: dict[str, Any], ref_record: dict[str, Any], run: dict[str, Any], record: dict[str, Any],
               decode: Any, div_id: str) -> str:
    """Two chain runs at their divergence (``divergence.chain_divergence`` on the stored top-k)."""
    reason, figure, note = chain_divergence(reference_run, ref_record, run["rule"], record, None, decode, NO_MODEL)
    return (f'<p class="reason">{_text(reason, content=True)}</p>{_figure_html(figure, div_id)}'
            f'<p class="meta">{_text(note or "")}</p>')


def _tree_or_chain_step(store: Store, run: dict[str, Any], record: dict[str, Any], decode: Any, div_id: str) -> str:
    """One run's decision at a divergence of a group with a tree run (``divergence.run_decision``)."""
    title = f"<h4>{_text(run['rule'])} · {_text(shape_label(run))}</h4>"
    nodes = store.tree_nodes(run["run_id"], block=int(record["block"])) if run.get("tree") else None
    line, figure = run_decision(run, record, nodes, None, decode, NO_MODEL)
    return f'{title}<p class="reason">{_text(line, content=True)}</p>{_figure_html(figure, div_id)}'


def build_report(store: Store, run_ids: list[str], audit_ids: list[str] | None = None, sweep_ids: list[str] | None = None,
                 cost: float | None = None, verdicts: dict | None = None) -> str:
    """HTML text of the report for ``run_ids`` (one run, or a coupled group in order), with the
    stored audits of those runs, the audits ``audit_ids`` and the sweeps ``sweep_ids`` (their
    figures at draft/target cost ratio ``cost``). Every member of a compared group one of the
    runs belongs to is included (the report says which were added), each run told against its own
    seed's reference; the reproduce line of each run is its ``run --replay`` command against this
    store's file, named by ``shared_db_name`` (nothing of this machine in the report)."""
    audit_ids = list(audit_ids or [])
    sweep_ids = list(sweep_ids or [])
    if not run_ids and not audit_ids and not sweep_ids and not verdicts:
        raise StoreError("give at least one run id, audit id or sweep id (or --verdicts)")
    completion = complete_groups(store, run_ids)
    run_ids = completion.run_ids
    db_name = shared_db_name(store.path)
    runs = _reported_runs(store, run_ids)
    audits = _reported_audits(store, run_ids, audit_ids)
    references = _references(store, [run for run, _ in runs])
    by_id = {run["run_id"]: (run, shown) for run, shown in runs}
    places: dict[str, tuple[str, str]] = {}
    sections = []
    for index, (run, shown) in enumerate(runs):
        reference = _reference_of(run, references)
        divergence = _divergence_position(store, run, reference, shown, by_id)
        places[run["run_id"]] = _divergence(run, reference, divergence)
        sections.append(run_section(store, run, shown, index, reference, divergence, places[run["run_id"]][1], by_id, db_name))
    sections += [sweep_section(store, sweep_id, index, cost) for index, sweep_id in enumerate(sweep_ids)]
    if audits:
        sections.append('<section class="run"><h2>Losslessness audits</h2>'
                        '<p class="meta">A correct implementation fails an audit with probability at most its level (1% by default).</p>'
                        + "".join(audit_section(audit, index) for index, audit in enumerate(audits)) + "</section>")
    if verdicts:
        from diagnostics.verdicts.render import html_section

        sections.append(html_section(verdicts))
    summary = summary_html(runs, places, completion.notes("reported"), db_name) if runs else ""
    subject = (f"target {machine_free(str(runs[0][0]['target']))}" if runs else f"{len(sweep_ids)} sweep(s)" if sweep_ids
               else f"{len(audits)} audit(s)" if audits else "verdicts on real engines")
    title = ", ".join(run["rule"] for run, _ in runs) or ("sweeps" if sweep_ids else "losslessness audits" if audits else "verdicts")
    return report_page(title, subject, summary, sections)


def _reported_runs(store: Store, run_ids: list[str]) -> list[tuple[dict[str, Any], Any]]:
    """Each run to report with its positions as shown (``shown_positions``) and its log-likelihood;
    ``StoreError`` for an id not in the store."""
    runs = []
    for run_id in run_ids:
        # run_header: the run without its token list and output text (the report shows neither;
        # a long run's would be tens of MB); its positions as shown (bounded whatever its length).
        run = store.run_header(run_id)
        if run is None:
            raise StoreError(f"there is no run {run_id!r} in {store.path}")
        shown = shown_positions(store, run_id)
        if shown.whole:
            run["log_likelihood"] = log_likelihood(shown.frame["p_token"]) if len(shown.frame) else None
        else:  # over every position, in the database
            run["log_likelihood"] = shown.summary["log_likelihood"]
        runs.append((run, shown))
    return runs


def _reported_audits(store: Store, run_ids: list[str], audit_ids: list[str]) -> list[dict[str, Any]]:
    """The stored audits of ``run_ids``, then ``audit_ids``, each once; ``StoreError`` for an id not in the store."""
    linked = store.list_audits(run_ids)["audit_id"].tolist() if run_ids else []
    audits = []
    for audit_id in dict.fromkeys(linked + audit_ids):
        audit = store.get_audit(audit_id)
        if audit is None:
            raise StoreError(f"there is no audit {audit_id!r} in {store.path}")
        audits.append(audit)
    return audits


def run_section(store: Store, run: dict[str, Any], shown: Any, index: int, reference: str | None, divergence: int | None,
                place: str, by_id: dict[str, tuple[dict[str, Any], Any]], db_name: str) -> str:
    """One run's section: its settings, output strip, why it leaves its ``reference`` at
    ``divergence`` (when the reference is reported too), per-position tracks and reproduce line."""
    positions = shown.frame
    records = positions.to_dict("records")  # at most SHOWN_POSITIONS rows
    # A divergence past the positions shown is not marked: its line would stretch the x axis.
    marked = divergence if shown.whole or (divergence is not None and divergence < len(positions)) else None
    figure = tracks_figure(positions, divergence=marked) if len(positions) else None
    figure_html = _figure_html(figure, f"tracks-{index}") if figure else "<p>No positions.</p>"
    why = ""
    if divergence is not None and reference in by_id:
        reference_run, reference_shown = by_id[reference]
        why = why_section(store, reference_run, reference_shown.frame, run, positions, divergence, index,
                          whole=reference_shown.whole and shown.whole)
    return f"""
<section class="run">
  <h2>{_text(run['rule'])} <small>run {_text(run['run_id'])} · {_text(run['status'])}</small></h2>
  <p class="meta">target {_text(run['target'])} · draft {_text(run['draft'])} · γ = {_number(run['gamma'])} · seed {_number(run['seed'])} ·
     max new tokens {_number(run.get('max_new_tokens'))} · policy {_text(policy_words(run['policy']))} · ran on {_text(run.get('device') or 'unknown')}{' · ' + place if place else ''}</p>{summarised_line(shown, divergence)}
  <h3>Output</h3>
  {token_strip_html(records, divergence=marked)}
  {why}
  <h3>Per-position tracks</h3>
  {figure_html}
  <p class="meta">Reproduce: <code>{_text(reproduce_command(run['run_id'], db_name), content=True)}</code></p>
</section>"""


def summary_html(runs: list[tuple[dict[str, Any], Any]], places: dict[str, tuple[str, str]], notes: list[str], db_name: str) -> str:
    """The prompt and the summary table of the reported runs (one row a run, ``places``: each run's
    first divergence cell), ``notes`` on the runs added to complete a group, and the definitions."""
    header_cells = "".join(f"<th title='{html.escape(help_)}'>{html.escape(name)}</th>" for name, _, help_ in SUMMARY_FIELDS)
    rows = "".join(
        f"<tr><td>{_text(run['run_id'])}</td><td>{_text(run['rule'])}</td><td>{_number(run.get('seed'))}</td>"
        f"<td>{places[run['run_id']][0]}</td>"
        + "".join(f"<td>{_number(run.get(key))}</td>" for _, key, _ in SUMMARY_FIELDS) + "</tr>"
        for run, _ in runs
    )
    added = "".join(f'<p class="meta">Note: {_text(note)}.</p>' for note in notes)
    return f"""<h3>Prompt</h3><pre>{_text(runs[0][0]['prompt'] or '', keep=chr(10) + chr(9))}</pre>
<h3>Summary</h3>{added}
<table><tr><th>run</th><th>rule</th><th>seed</th><th title="first position where the run decides differently from the reference run of its group at its seed">first divergence</th>{header_cells}</tr>{rows}</table>
<p class="meta">Definitions: hover a column title. TV(a, b) = ½ Σ |a − b|; P is the exact law each token was drawn from.
 The acceptance rate counts every drafted token, those after a block's first rejection too (never verified); the Compare
 page's acceptance α divides by verified drafts only, so α is at least the acceptance rate.
 In a compared group each seed's first run is that seed's reference.</p>
<p class="meta">Reproduce lines name the runs file {_text(db_name, content=True)}: give the path of your copy of it.
 Nothing of the sender's machine is in this report (paths are cut to their last part, URLs to their scheme).</p>"""


def report_page(title: str, subject: str, summary: str, sections: list[str]) -> str:
    """The self-contained HTML page: the styles, Plotly's script, the heading, ``summary`` and ``sections``."""
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
