"""Helpers shared by the pages: the store, cached models, and clear messages. Thin by design."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

import streamlit as st

from diagnostics.cost import AnalyticCost, CostMeasurement, cost_flag, measure_cost, pair_analytic_cost
from diagnostics.inspection import (
    RunLaws,
    as_list,
    draft_model,
    models_to_load,
    target_spec,
)
from diagnostics.metrics import (
    modelled_speedup,
    modelled_tree_speedup,
    verified_acceptance,
)
from diagnostics.models import (
    LoadedModel,
    ModelError,
    layer_count,
    load_model,
    parse_draft,
)
from diagnostics.store import Store, StoreError, default_db_path
from diagnostics.untrusted import markdown_literal, visible


def open_store(read_only: bool = False) -> Store | None:
    """The runs database (a shared file read-only when one is open), or ``None`` after a one-line message."""
    shared = st.session_state.get("shared_db")
    path = shared or default_db_path()
    try:
        return Store(path, read_only=read_only or bool(shared), lock_wait_s=5)
    except StoreError as error:
        show_error(error)
        return None


def default_target() -> str:
    """``$SPECLAB_TARGET`` (tests point the app at a tiny model) or the embedded default."""
    return os.environ.get("SPECLAB_TARGET", "default")


@st.cache_resource(show_spinner="Loading the model (the embedded one: 30–45 s the first time, while it is unpacked into "
                                 "data/models/, then about 5 s; longer on a busy machine; once per server)…")
def cached_model(spec: str, _local_only: bool = False) -> LoadedModel:
    """One loaded copy of each model per server, whichever page asked first (``_local_only`` is not
    part of the key: the Run page's network-allowed load and Inspect's local one share the copy)."""
    return load_model(spec, local_only=_local_only)


def try_model(spec: str) -> LoadedModel | None:
    """The model if it is available without the network (embedded, local folder, HF cache), else ``None``."""
    try:
        return cached_model(spec, _local_only=True)
    except ModelError:
        return None


@st.cache_resource(max_entries=4, show_spinner="Loading the draft head…")
def cached_head(draft_spec: str, target_name: str, _target: LoadedModel):
    """A run's EAGLE-3 or Medusa head for ``target_name``, loaded once per server (local folders only)."""
    return draft_model({"draft": draft_spec}, _target)


def run_drafter(run: dict, target: LoadedModel):
    """The run's draft model or head, from the server's cache (``None`` for n-gram drafts)."""
    draft = parse_draft(run["draft"])
    if draft.kind == "model":
        loaded = try_model(draft.value)
        if loaded is None:
            raise ModelError(f"the draft model {draft.value} is not available on this machine")
        return loaded
    if draft.kind in ("eagle3", "medusa"):
        return cached_head(draft.spec, target.name, target)
    return draft_model(run, target)


@st.cache_resource(max_entries=6, show_spinner="Computing p and q at every position: one forward pass per model…")
def cached_run_laws(db_path: str, run_id: str, positions: int, status: str, target_name: str,
                    _run: dict, _tokens: list[int], _target: LoadedModel) -> RunLaws:
    """A run's exact laws, computed once per server and kept for its later clicks; a run that
    gained positions (still running) or changed status gets a new entry."""
    return RunLaws(_run, _tokens, _target, run_drafter(_run, _target))


def run_laws(store, run: dict, tokens: list[int]) -> tuple[RunLaws | None, str | None]:
    """The exact laws of ``run``, or ``None`` and why (plain, untrusted text: show it with ``literal``)."""
    target = try_model(target_spec(run))
    if target is None:
        return None, f"the target {target_spec(run)} is not available on this machine"  # plain text: shown through literal()
    try:
        laws = cached_run_laws(str(store.path), str(run["run_id"]), len(tokens), str(run["status"]), target.name,
                               run, tokens, target)
    except (ModelError, OSError, ValueError) as error:
        return None, str(error).splitlines()[0] if str(error) else error.__class__.__name__
    return laws, None


def decoder(model: LoadedModel | None):
    """Token id → text for labels (``None`` when there is no tokenizer)."""
    if model is None or model.tokenizer is None:
        return None
    tokenizer = model.tokenizer

    def decode(token: int) -> str:
        try:
            return tokenizer.decode([int(token)])
        except (OverflowError, IndexError, TypeError, ValueError):  # an id from a file, outside the vocabulary
            return f"⟨{int(token)}⟩"

    return decode


def literal(text: object, limit: int | None = None) -> str:
    """Untrusted text (anything from a file, the URL, a model or a user) for a Markdown context:
    shown literally, on one line. The one way such text reaches ``st.markdown``, ``st.caption``,
    ``st.error``, widget labels and the like (``tests/test_views_literal.py`` checks the pages)."""
    return markdown_literal(text, limit=limit)


def plain(text: object, limit: int | None = None, keep: str = "") -> str:
    """Untrusted text for a plain-text context (``st.text``, select box options): control and
    format characters (but those in ``keep``) shown as escapes; nothing else is interpreted there."""
    return visible(text, keep=keep, limit=limit)


def md(template: str, /, **untrusted: object) -> str:
    """Trusted Markdown ``template`` with each ``{name}`` filled by ``untrusted[name]`` shown literally:
    ``st.error(md("There is no run {run}.", run=requested))``."""
    return template.format(**{name: literal(value, limit=300) for name, value in untrusted.items()})


def run_link(label: str, run_id: object, position: int | None = None) -> str:
    """A Markdown link to Inspect a run (``/inspect?run=ID&pos=N``): the label shown literally, the id
    percent-encoded, so a hostile id can neither leave the app nor break out of the link. (Old links,
    ``/?run=ID&pos=N``, still open Inspect: app.py sends them on.)"""
    query = {"run": str(run_id)} | ({"pos": str(int(position))} if position is not None else {})
    return f"[{literal(label)}](/inspect?{urlencode(query, quote_via=quote)})"


def file_name_part(text: object) -> str:
    """A download-name-safe form of untrusted text (letters, digits, '-', '_', '.'; at most 40)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._")[:40] or "file"


def run_label(row) -> str:
    """A run in a select box: id, rule, draft (a folder by its last part), tree, status, start time
    and the start of its prompt, as plain text: runs of one prompt differ by their draft and time."""
    draft = str(getattr(row, "draft", None) or "plain")
    kind, _, where = draft.partition(":")
    if "/" in where:
        draft = f"{kind}:{where.rstrip('/').rsplit('/', 1)[-1]}"
    tree = getattr(row, "tree", None)
    shape = f" tree {tree}" if isinstance(tree, str) and tree else ""
    created = getattr(row, "created", None)
    when = f" · {created:%m-%d %H:%M}" if hasattr(created, "strftime") and created == created else ""
    return plain(f"{row.run_id} · {row.rule} · {draft[:32]}{shape[:32]} · {row.status}{when} · {str(row.prompt)[:40]}")


def show_error(error: object) -> None:
    """An exception's one-line message in an error box, literally (messages quote typed input and file contents)."""
    st.error(literal(error))


def _pending_models(run: dict) -> list[str]:
    """The models ``run`` names that may not load without the user's click: neither the embedded
    default, nor the app's configured target, nor allowed earlier in this session."""
    allowed = st.session_state.get("allowed_models", set())
    return [name for name in models_to_load(run, trusted=("default", default_target())) if name not in allowed]


def target_consented(run: dict) -> bool:
    """Whether the run's target alone may be loaded now (the embedded default, the app's configured
    target, or allowed earlier): enough to label tokens with text while a head or draft the run also
    names still waits for the user's click."""
    return target_spec(run) not in _pending_models(run)


def model_consent(run: dict, key: str) -> bool:
    """Whether the models ``run`` names may be loaded. The embedded default and the app's configured
    target may; any other path or hub id (a shared file can name any folder) only after the user
    presses a button that names it, once per session. Never loads anything itself."""
    pending = _pending_models(run)
    if not pending:
        return True
    st.caption("This run names models that are not loaded: until you load them, p is not recomputed "
               "and p and q are rebuilt from the stored top-20.")
    if st.button(md("Load {names} (local files only) to recompute p and q exactly", names=", ".join(pending)), key=key):
        st.session_state.setdefault("allowed_models", set()).update(pending)
        st.rerun()  # drawn again without the button and the caption, which would otherwise stay up while p and q load
    return False


METRIC_HELP = {
    "acceptance α": "Accepted drafts / verified drafts (a draft discarded after a rejection was never verified): "
                    "the per-draft acceptance α of the i.i.d. model. Hardware-independent.",
    "modelled speed-up": "(1 − α^(γ+1)) / ((1 − α)(γ·c + 1)): expected tokens per block over the block's cost in target "
                         "forwards, with the draft/target cost ratio c. Plain decoding = 1.0.",
    "acceptance rate": "Accepted drafts / drafted tokens (every proposed draft, including those discarded after a rejection).",
    "block efficiency": "Emitted tokens per target forward pass, the fallback or bonus token included. Plain decoding = 1.0.",
    "tokens/s": "Emitted tokens per second of wall time for the whole generation (prefill included).",
    "mean TV(P, p)": "Mean over positions of the total variation between the law the token was drawn from and the target p. 0 for lossless.",
    "mean TV(P, baseline)": "The same against the matched baseline: the target sampled losslessly under the rule's truncation.",
}


@st.cache_resource(max_entries=16, show_spinner="Measuring the draft/target cost ratio on this machine…")
def measured_cost_ratio(target_name: str, draft_spec: str, _target: LoadedModel, _drafter: LoadedModel | None,
                        _context: tuple[int, ...]) -> CostMeasurement:
    """``c`` for a (target, drafter) pair with the spread of its repeats, measured once per server."""
    return measure_cost(_target, _drafter, list(_context))


def _default_cost_ratio(run: dict, target: LoadedModel | None) -> tuple[float, str, CostMeasurement | None]:
    """The cost ratio to start from, where it comes from, and the measurement when it is one."""
    try:
        draft = parse_draft(run["draft"])
    except ModelError:
        return 1.0, "unknown drafter", None
    if draft.kind == "ngram":
        return 0.0, "an n-gram lookup costs no forward", None
    if target is not None:
        try:
            drafter = run_drafter(run, target)
            ids = tuple(int(token) for token in as_list(run.get("prompt_ids"))[:128])  # a list, or an array from a DataFrame row
            measured = measured_cost_ratio(target.name, str(run["draft"]), target, drafter, ids)
            return measured.ratio, (f"measured on this machine, the median of {len(measured.ratios)} paired timings "
                                    f"(relative IQR {measured.spread:.0%})"), measured
        except (ModelError, OSError, ValueError, RuntimeError):
            pass
    if draft.kind == "early-exit":
        layers = layer_count(target_spec(run))
        if layers:
            return int(draft.value) / layers, "layer count L/N (models not loaded)", None
    if draft.kind in ("eagle3", "medusa"):
        layers = layer_count(target_spec(run))
        if layers:
            return 1 / layers, "a head costs about one of the target's N layers, 1/N (models not loaded)", None
    return 0.5, "a guess (models not loaded)", None


def _analytic_cost(run: dict, target: LoadedModel) -> AnalyticCost | None:
    """``cost.pair_analytic_cost`` for ``run``'s pair, from the loaded target and drafter."""
    try:
        return pair_analytic_cost(str(run["draft"]), target, run_drafter(run, target))
    except (ModelError, OSError, ValueError, RuntimeError):
        return None


def target_if_allowed(run: dict) -> LoadedModel | None:
    """The run's target when it may be loaded without asking (trusted, or allowed earlier in this
    session) and is on this machine; never shows a button (``model_consent`` does)."""
    return None if _pending_models(run) else try_model(target_spec(run))


MAX_COST_RATIO = 10.0  # the cost ratio box's upper end: a draft ten times the target's cost never pays


def cost_ratio_input(run: dict, target: LoadedModel | None, key: str, container) -> float | None:
    """The draft/target cost ratio ``c`` for ``run``'s pair in an editable box (default: measured on
    this machine when the models are loaded); ``None`` for plain decoding, which has no draft.
    With the models loaded, "c from" offers the analytic c (``cost.pair_analytic_cost``) beside the
    measured one, and a measured c that is implausible is flagged below the box's row
    (``cost.cost_flag``: why, and what to do)."""
    if not int(run.get("gamma") or 0):
        container.metric("draft/target cost c", "–", help="Plain decoding: no draft.")
        return None
    start, source, measured = _default_cost_ratio(run, target)
    analytic = _analytic_cost(run, target) if measured is not None else None
    origin = "measured" if target is not None else "guess"
    if measured is not None and analytic is not None:
        # analytic.basis: constant words and counts (cost.pair_analytic_cost); source: constants and numbers.
        choice = container.radio("c from", ("measured", "analytic"), horizontal=True, key=f"{key}_cost_from_{run['run_id']}",  # literal-ok: source, basis
                                 help=f"measured: {source}; analytic: c = {analytic.ratio:.4g}, {analytic.basis}. "
                                      "Type a value in the box for your own hardware's.")
        if choice == "analytic":
            start, source, origin = analytic.ratio, f"analytic, {analytic.basis}", "analytic"
    if not 0.0 <= start <= MAX_COST_RATIO:
        # A timing on a busy machine can exceed the box's range (seen in CI: 11.4 for a 1-layer
        # early exit): a value outside it would crash the page, so it starts at the nearest end.
        source = f"{source}, {start:.3g} shown as {min(max(start, 0.0), MAX_COST_RATIO):g}"
        start = min(max(start, 0.0), MAX_COST_RATIO)
    value = container.number_input("draft/target cost c", 0.0, MAX_COST_RATIO, round(float(start), 3), 0.01, format="%.3f",  # literal-ok: source: constant strings of _default_cost_ratio, analytic bases and numbers
                                   # Keyed by where c comes from: loading the models brings the measured
                                   # default, which a box kept from before would hide behind the old guess.
                                   key=f"{key}_cost_{run['run_id']}_{origin}",
                                   help=f"Time of one draft step over one target step; default: {source}. "
                                        "Type your hardware's ratio to model its speed-up.")
    if measured is not None and origin == "measured":
        flag = cost_flag(parse_draft(run["draft"]).kind, measured.ratio, analytic, measured.spread)
        if flag:
            st.warning(f"Cost ratio: {flag}" + (" Choose \"analytic\" under \"c from\"." if analytic is not None else ""),  # literal-ok: cost_flag's constant words and numbers
                       icon="⚠️")
    return value


def headline_metrics(run: dict, positions, target: LoadedModel | None, key: str) -> None:
    """The hardware-independent figures first (acceptance α̂, block efficiency), the modelled
    speed-up ``(1 − α̂^{γ+1}) / ((1 − α̂)(γc + 1))`` with an editable cost ratio ``c``, the
    distortion; wall-clock tokens/s as a detail (it measures this machine, not the method)."""
    kinds = positions["kind"].value_counts() if len(positions) else {}
    accepted, rejected = int(kinds.get("accepted", 0)), int(kinds.get("rejected", 0))
    alpha = verified_acceptance(accepted, rejected)
    gamma = int(run.get("gamma") or 0)
    columns = st.columns(6)
    cost = cost_ratio_input(run, target, key, columns[5])
    tree = run.get("tree")
    if cost is None:
        speedup = 1.0
    elif tree:  # a round's tokens are measured (block efficiency); its cost is one draft forward per level
        efficiency = run.get("block_efficiency")
        speedup = modelled_tree_speedup(float("nan") if efficiency is None else float(efficiency), gamma, cost)
    else:
        speedup = modelled_speedup(alpha, gamma, cost)
    figures = [
        ("acceptance α", alpha), ("block efficiency", run.get("block_efficiency")), ("modelled speed-up", speedup),
        ("mean TV(P, p)", run.get("mean_tv_target")), ("mean TV(P, baseline)", run.get("mean_tv_baseline")),
    ]
    for column, (name, value) in zip(columns, figures):
        shown = "–" if value is None or value != value else f"{value:.3f}" + ("×" if name == "modelled speed-up" else "")
        column.metric(name, shown, help=METRIC_HELP[name])  # literal-ok: names from the list above
    rate, speed = run.get("acceptance_rate"), run.get("tokens_per_s")
    drafted = run.get("drafted")
    drafted = "–" if drafted is None or drafted != drafted else int(drafted)  # unknown for a run cut off before its summary
    if run.get("status") == "interrupted":
        st.caption(md("Interrupted ({why}): the figures cover the positions it stored.", why=run.get("error") or "no reason stored"))
    if tree:
        st.caption(f"Details: {accepted} positions kept a drafted node and {rejected} refused every candidate; "  # literal-ok: counts and formatted numbers
                   f"{drafted} nodes drafted in {int(run.get('target_passes') or 0)} rounds "
                   f"(one target forward each); modelled speed-up = tokens per round / (depth·c + 1); wall clock on the "
                   f"machine that ran it: {'–' if speed is None or speed != speed else f'{speed:.1f}'} tokens/s.")
        return
    st.caption(f"Details: {accepted} accepted and {rejected} rejected of {drafted} drafted tokens "  # literal-ok: counts and formatted numbers
               f"(acceptance rate over every drafted token, discarded ones included: {'–' if rate is None or rate != rate else f'{rate:.3f}'}); "
               f"wall clock on the machine that ran it: {'–' if speed is None or speed != speed else f'{speed:.1f}'} tokens/s.")


STOP_WAIT_S = 300  # how long a Stop waits for the stopped script's thread to store what it ran


@dataclass
class Launch:
    """A run launched by a page, as the next script run finds it after a Stop. With Streamlit's fast
    reruns, a click starts the next run in a new thread at once while this one is asked to stop at
    its next st call; ``stopping`` (the engine's ``should_stop``) also ends the rows in flight at
    their next round, so the stopped thread ends promptly even in a stretch of forwards without
    st calls, and ``finished`` says when it has stored what it ran."""

    info: dict = field(default_factory=dict)
    finished: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)

    def settle(self, what: str) -> None:
        """Stop the launched run's thread and wait (with a spinner) until it has stored what it ran."""
        self.stopping.set()
        if not self.finished.wait(timeout=1):
            with st.spinner(f"Stopping the {what}: keeping what it ran"):  # literal-ok: what is a constant of the page
                self.finished.wait(timeout=STOP_WAIT_S)
