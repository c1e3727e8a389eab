"""Sweeps: launch one (progress, Stop, Resume), then the Pareto chart of speed against quality,
the per-setting table with intervals and verdicts, and each setting's runs (to Inspect)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.charts import CHART_CONFIG, pareto_figure, token_strip_html
from diagnostics.engine import EngineError
from diagnostics.evaluation.answers import needs_sandbox, recheck_sweep, require_sandbox_for
from diagnostics.evaluation.plan import unit_members
from diagnostics.evaluation.prompts import PromptSetError, load_prompts
from diagnostics.evaluation.sandbox import SandboxUnavailable
from diagnostics.evaluation.settings import checkers_of, resolve_cost, stored_cost, stored_cost_flag, sweep_analytic_cost
from diagnostics.evaluation.stats import summarise_sweep, sweep_table, with_interval
from diagnostics.evaluation.sweeper import (
    base_request,
    expand_rules,
    plan_units,
    run_sweep,
    settings_of,
)
from diagnostics.drafts import load_draft
from diagnostics.models import ModelError
from diagnostics.rules import RuleError, split_specs
from diagnostics.store import StoreError
from views.common import (
    MAX_COST_RATIO,
    Launch,
    cached_model,
    cost_ratio_input,
    literal,
    md,
    open_store,
    plain,
    run_link,
    show_error,
    target_if_allowed,
)
from views.run_form import RULE_HELP, request_widgets

SETS = {"general (24 short chat prompts)": "general", "HumanEval (164 problems)": "humaneval", "a JSONL file": None}

st.title("Sweeps")
store = open_store()
if store is None:
    st.stop()


def plan_from_widgets() -> dict | None:
    """The sweep the launch form describes (its stored settings), or ``None`` with the reason shown."""
    choice = st.selectbox("Prompt set", list(SETS), key="sw_set",
                          help="JSONL: one object per line with \"prompt\", optional \"id\" and \"checker\" (exact, regex, humaneval)")
    source = SETS[choice] or st.text_input("JSONL file (a path on this machine)", key="sw_file")
    cols = st.columns(2)
    limit = cols[0].number_input("Prompts (the first N; 0 = all)", 0, 100000, 4, key="sw_limit")
    seeds = cols[1].number_input("Seeds per prompt", 1, 64, 2, key="sw_seeds")
    rules_text = st.text_input("Rules (ranges LOW..HIGH:COUNT allowed)", "lenience:0.2..1.0:5, cascade:0.3, typical:0.2", key="sw_rules",
                               help="Each runs beside the lossless run and its matched baseline, coupled (same prompt, seed "
                                    "and uniforms). " + RULE_HELP)
    target_name, request = request_widgets("sw", "lossless", with_prompt=False)
    if not source or request is None:
        return None
    try:
        prompts = load_prompts(source)
        prompts = prompts[: int(limit)] if limit else prompts
        settings = {**settings_of(prompts, expand_rules(split_specs(rules_text)), int(seeds), request, str(source)),
                    "target": target_name.strip() or "default"}
        units = plan_units(settings)
        members = unit_members(base_request(settings), settings["rules"])
        for member in members:
            member.request.validate()
    except (PromptSetError, RuleError, EngineError, ValueError) as error:
        show_error(error)
        return None
    runs = len(units) * len(members)
    st.caption(f"{len(units)} units (prompt × seed) × {len(members)} coupled runs = {runs} runs of at most "  # literal-ok: counts
               f"{int(request.max_new_tokens)} tokens")
    return settings


def run_on_page(settings: dict, sweep_id: str | None) -> None:
    """Run (or resume) a sweep in this script: a progress bar per unit, the running member's tokens,
    and Stop (any click stops the script; the finished units are kept, the sweep is ``interrupted``)."""
    try:
        require_sandbox_for(checkers_of(settings))  # HumanEval checks need bubblewrap: say so before loading models
        target = cached_model(settings.get("target", "default"))
        draft = load_draft(base_request(settings).draft, target)
    except (ModelError, ValueError, SandboxUnavailable) as error:
        show_error(error)
        st.stop()
    launch = Launch({"sweep_id": sweep_id})
    holder = launch.info
    st.session_state["sw_launching"] = launch  # the next script run finds what a Stop left
    st.button("Stop", key="sw_stop", help="Stops the sweep after the running block: finished units are kept; Resume runs the rest.")
    bar, line, strip = st.progress(0.0, text="loading"), st.empty(), st.empty()

    def on_open(plan) -> None:
        holder["sweep_id"] = plan.sweep_id
        bar.progress(len(plan.finished) / len(plan.units), text=f"{len(plan.finished)} / {len(plan.units)} units")  # literal-ok: counts

    def on_unit(done: int, total: int, _unit) -> None:
        bar.progress(done / total, text=f"{done} / {total} units")  # literal-ok: counts

    def on_record_for(unit, member):
        records: list[dict] = []

        def show(record) -> None:
            records.append(record.as_dict())
            line.markdown(md("unit {unit} · prompt {prompt} · seed {seed} · {label}: ", unit=unit.index, prompt=unit.prompt_id,  # literal-ok: md()
                             seed=unit.seed, label=member.label) + f"{len(records)} tokens")
            strip.html(token_strip_html(records))
        return show

    try:
        try:
            sweep_id = run_sweep(store, target, draft, settings, sweep_id=sweep_id, on_open=on_open, on_unit=on_unit,
                                 on_record_for=on_record_for, should_stop=launch.stopping.is_set)
        finally:
            launch.finished.set()
    except (RuleError, EngineError, ModelError, StoreError, ValueError, SandboxUnavailable) as error:
        st.session_state.pop("sw_launching", None)
        show_error(error)
        st.stop()
    st.session_state.pop("sw_launching", None)
    st.session_state["sw_show"] = sweep_id  # picked on the rerun, before the picker exists
    st.query_params["sweep"] = sweep_id
    st.rerun()


def settle_stopped_launch() -> None:
    """After a Stop: wait for the stopped script's thread, then make sure nothing it ran is left
    ``running`` (the sweep and its unit's runs are marked ``interrupted``), and show that sweep."""
    launch: Launch = st.session_state.pop("sw_launching")
    launch.settle("sweep")
    stopped = launch.info.get("sweep_id")
    if stopped is None:
        return
    try:
        sweep = store.get_sweep(stopped)
        if sweep is not None and sweep["status"] == "running":
            store.set_sweep_status(stopped, "interrupted", error="stopped by the user")
        runs = store.list_runs()
        if not runs.empty:
            left = runs[(runs["status"] == "running") & runs["group_id"].fillna("").str.startswith(f"{stopped}-u")]
            store.mark_interrupted(left["run_id"].tolist())
    except StoreError as error:
        show_error(error)
    st.session_state["sweep_pick"] = stopped
    st.query_params["sweep"] = stopped


if "sw_launching" in st.session_state:
    settle_stopped_launch()
if "sw_show" in st.session_state:
    st.session_state["sweep_pick"] = st.session_state.pop("sw_show")
sweeps = store.list_sweeps()
with st.expander("Launch a sweep", expanded=sweeps.empty):
    planned = plan_from_widgets()
    start = st.button("Run the sweep", type="primary", key="sw_start", disabled=planned is None or store.read_only,
                      help="Runs here, in the dashboard; keep this page open. Long sweeps: python -m diagnostics sweep (or --ray).")
if start and planned:
    run_on_page(planned, None)
if sweeps.empty:
    st.info("No sweeps yet: launch one above, or run `python -m diagnostics sweep --prompts general --rule lenience:0.2..1.0:5 "
            "--rule cascade:0.3 --seeds 2`.")
    st.stop()

ids = sweeps["sweep_id"].tolist()
requested = st.query_params.get("sweep")
labels = {row.sweep_id: plain(f"{row.sweep_id} · {row.status} · {row.units_done}/{row.units} units", limit=200)
          for row in sweeps.itertuples()}
sweep_id = st.selectbox("Sweep", ids, index=ids.index(requested) if requested in ids else 0, format_func=labels.get, key="sweep_pick")
st.query_params["sweep"] = sweep_id
try:
    sweep = store.get_sweep(sweep_id)
except StoreError as error:  # settings nothing can use, in the user's own database
    show_error(error)
    st.stop()
settings = sweep["settings"]
request = settings.get("request", {})
shape = f"tree {request['tree']}" if request.get("tree") else f"γ = {request.get('gamma')}"
st.caption(md("prompts {file} ({count}) · rules {rules} · {seeds} seeds · draft {draft} · {shape} · {tokens} tokens · status {status}",
              file=settings.get("prompt_file"), count=len(settings.get("prompts", [])), rules=", ".join(settings.get("rules", [])),
              seeds=settings.get("seeds"), draft=request.get("draft"), shape=shape, tokens=request.get("max_new_tokens"),
              status=sweep["status"]))
writer = store.sweep_writer(sweep_id) if sweep["status"] == "running" else None
if writer is not None:
    # Another process (the CLI, another dashboard) is running it: resuming here would run its units twice.
    st.info(md("This sweep is being run by another process ({writer}): shown read-only, with the units that have "
               "finished so far; reload the page to see more.", writer=writer))
elif sweep["status"] != "complete":
    st.warning(f"This sweep is {sweep['status']} with {int(sweep['units_done'] or 0)} of {int(sweep['units'] or 0)} units; "  # literal-ok: status from the validated set, counts
               "the figures below use the units that finished. Resume runs only the missing units (here, or with "
               "`python -m diagnostics sweep --resume` and the sweep's id).")
    if st.button("Resume", key="sw_resume", disabled=store.read_only, help="Loads the sweep's models and runs its missing units here"):
        run_on_page(settings, sweep_id)



def sweep_cost_ratio(settings: dict, first_run: dict | None) -> float | None:
    """The c of the modelled speed-ups: ``resolve_cost``'s (the one stored with the sweep, else its
    rule for an older sweep stored without one), as the CLI and the report use it, editable. A c
    measured on this machine only when the user asks for it, labelled re-measured. A stored c that
    is implausible is flagged (``stored_cost_flag``); "c from" offers the analytic one."""
    if first_run is None:
        return None
    ratio, source = resolve_cost(settings, None)
    stored = stored_cost(settings) is not None
    # source: resolve_cost's constant phrases and a checked number.
    remeasure = st.toggle("Re-measure c on this machine", key="sweep_remeasure",  # literal-ok: source
                          help=f"The figures start from c = {ratio:g}, {source}; re-measuring loads the models here.")
    if not remeasure:
        if not stored:
            st.caption(f"This sweep was stored without its cost ratio (an older version): c = {ratio:g} is assumed, as the "
                       "CLI's sweep and the report assume it. Re-measure c here, or resume the sweep to store one.")
        analytic = sweep_analytic_cost(settings)
        if analytic is not None and round(analytic.ratio, 4) != ratio:
            # analytic.basis: constant words and counts (cost.pair_analytic_cost).
            if st.radio("c from", ("the sweep", "analytic"), horizontal=True, key=f"sweep_cost_from_{sweep_id}",  # literal-ok: basis
                        help=f"analytic: c = {analytic.ratio:.4g}, {analytic.basis} (the CLI's sweep and report: "
                             "--cost analytic)") == "analytic":
                return st.number_input("draft/target cost c (analytic)", 0.0, MAX_COST_RATIO, round(analytic.ratio, 4), 0.01,  # literal-ok: basis
                                       format="%.4f", key=f"sweep_cost_analytic_{sweep_id}",
                                       help=f"c = {analytic.ratio:.4g}, {analytic.basis}.")
        flag = stored_cost_flag(settings)
        if flag:
            st.warning(f"Cost ratio: {flag}" + (" Choose \"analytic\" under \"c from\"." if analytic is not None else ""),  # literal-ok: cost_flag's constant words and numbers
                       icon="⚠️")
        # Keyed by sweep: another sweep's box would keep this one's value.
        return st.number_input("draft/target cost c (stored with the sweep)" if stored else "draft/target cost c (none stored)",  # literal-ok: source
                               0.0, max(MAX_COST_RATIO, ratio), ratio, 0.01, format="%.4f", key=f"sweep_cost_stored_{sweep_id}",
                               help=f"Time of one draft step over one target step. c = {ratio:g}, {source}; the CLI's sweep and "
                                    "the report use it. Type your hardware's ratio to model its speed-up.")
    st.caption("c re-measured on this machine (or estimated where the models are not loaded): the speed-ups differ "
               "from those the CLI's sweep and the report print.")
    # Inspect's default: measured here when the models may be loaded, else L/N for an early exit.
    return cost_ratio_input(first_run, target_if_allowed(first_run), "sweep_remeasured", st)


linked = store.sweep_runs(sweep_id)
first_run = store.get_run(linked["run_id"].iloc[0]) if not linked.empty else None
cost = sweep_cost_ratio(settings, first_run)
rechecked = st.session_state.setdefault("sweep_rechecked", {})  # (file, sweep id) → scores of a re-check in this session
checked_key = (str(store.path), sweep_id)


def answer_check(checkers: dict) -> None:
    """The checkers' scores come from the sweep as stored. Where some are missing (a sweep of an
    older version, or a unit the sweep could not check), they are computed only when the user asks:
    a HumanEval checker runs each output as code (in the bubblewrap sandbox). A shared file's
    scores of a re-check are kept for this session only (the file stays as it is)."""
    checked = linked["prompt_id"].map(lambda prompt_id: checkers.get(prompt_id) is not None)
    scores = linked["score"] if "score" in linked else pd.Series([None] * len(linked), index=linked.index)
    missing = int(((linked["status"] == "complete") & checked & scores.isna()).sum())
    if not missing or checked_key in rechecked:
        return
    runs_code = needs_sandbox(checkers)
    st.info(f"{missing} finished runs of this sweep have no stored answer score, so accuracy leaves them out. "  # literal-ok: a count
            + ("Checking them runs each output as Python code, inside the bubblewrap sandbox only (no network, no files "
               "of this machine, time and memory limits)." if runs_code else "Checking them compares each output with its answer."))
    if st.button("Check the answers", key="sw_recheck", help="Scores each finished run's output with its prompt's checker, now"):
        try:
            with st.spinner("checking the answers"):
                rechecked[checked_key] = recheck_sweep(store, sweep_id, save=not store.read_only)
        except (SandboxUnavailable, StoreError, ValueError) as error:
            show_error(error)
            return
        st.rerun()


answer_check(checkers_of(settings))
table = sweep_table(store, sweep_id, 0.0 if cost is None else cost, scores=rechecked.get(checked_key))
summaries = summarise_sweep(table)
if not summaries:
    st.info("No unit of this sweep has finished yet.")
    st.stop()
has_accuracy = any(summary.figures["accuracy"][0] == summary.figures["accuracy"][0] for summary in summaries)
choices = ["TV(P, baseline)", "TV(P, p)", "path KL"] + (["accuracy"] if has_accuracy else [])
against = st.radio("Quality axis", choices, horizontal=True, key="sweep_axis")
st.plotly_chart(pareto_figure(summaries, against), key="sweep_pareto", config=CHART_CONFIG)


def _cell(value: tuple[float, float, float], digits: int = 3) -> str:
    return with_interval(value, f".{digits}f")


st.subheader("Per setting (95% intervals over prompts and seeds)")
# Two tables, speed then quality: one table of every figure with its interval was wider than a
# 1400 px window and hid its last columns behind a scroll bar.
speed_rows = [{"setting": summary.label, "role": summary.role, "units": summary.units,
               **{name: _cell(summary.figures[name]) for name in ("modelled speed-up", "acceptance")}} for summary in summaries]
st.dataframe(pd.DataFrame(speed_rows), hide_index=True, key="sweep_table", width="stretch")
quality = ("TV(P, baseline)", "TV(P, p)", "path KL", "log-likelihood") + (("accuracy",) if has_accuracy else ())
quality_rows = [{"setting": summary.label, **{name: _cell(summary.figures[name]) for name in quality}} for summary in summaries]
st.dataframe(pd.DataFrame(quality_rows), hide_index=True, key="sweep_quality_table", width="stretch")
st.subheader("Verdicts")
for summary in summaries:
    if summary.role == "rule":
        st.markdown(literal(summary.verdict()))

st.subheader("Runs of a setting")
setting = st.selectbox("Setting", [summary.label for summary in summaries], key="sweep_setting")
for row in table[table["label"] == setting].itertuples():
    st.markdown(md("unit {unit} · prompt {prompt} · seed {seed} · ", unit=int(row.unit), prompt=row.prompt_id, seed=int(row.seed))  # literal-ok: md() plus run_link
                + run_link("inspect", row.run_id))
