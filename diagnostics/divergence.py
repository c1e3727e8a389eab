"""Why two coupled runs part: the one-line reason, each run's decision at a position as a line and
a figure, and where the notable positions of a run are.

Coupled runs share every uniform (``diagnostics.rng``: keyed by seed, position and slot), so up
to their first divergence they draft the same ``x`` with the same ``u_draft``, test it with the
same coin ``u_accept`` and, after a rejection, draw the fallback with the same ``u_fallback``. At
the divergence exactly one of these differs in effect: the decisions (``u < a(x)`` for one rule,
``u ≥ a(x)`` for the other), or two fallback or bonus laws that the same uniform maps to
different tokens. The line says which, with the numbers: from two records (``divergence_reason``)
or from two stored runs (``why_they_part``, which ``coupling.couple`` and the Run page use).

The Compare page and the report tell it alike with ``chain_divergence`` and ``run_decision``:
``laws`` are a run's exact laws when its models are loaded, else ``None`` and the views are
rebuilt from the stored top-k (``unavailable`` says why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from diagnostics.charts import divergence_figure, law_figure, tree_candidates_figure
from diagnostics.explain import explain_step
from diagnostics.inspection import RunLaws, position_view, tree_node_view
from diagnostics.rules import get_rule
from diagnostics.store import Store

Decode = Callable[[int], str] | None

# Draft mass at q ≥ p/l worth a jump button: below this the overshoot is a rounding-level effect.
SEVERE_OVERSHOOT = 0.05


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if value != value else value


def _token(record: dict[str, Any], text: Callable[[int], str] | None, column: str = "token") -> str:
    """A token as the line shows it: decoded by ``text``, else the text the run stored, else its id."""
    token = record.get(column)
    if token is None or token != token:  # a missing draft comes back from a DataFrame as NaN
        return "–"
    if text:
        return repr(text(int(token)))
    stored = record.get("token_text" if column == "token" else "draft_text")
    return repr(stored) if isinstance(stored, str) else str(int(token))


def decision_line(spec: str, record: dict[str, Any], text: Callable[[int], str] | None = None) -> str:
    """What ``spec`` did at one position: ``lossless rejects: u = 0.251 ≥ a = 0.185, draws 'the'``."""
    kind = record["kind"]
    if kind == "bonus":
        return f"{spec} draws the bonus {_token(record, text)} from b(p)"
    accept, coin = _number(record.get("accept_prob")), _number(record.get("u_accept"))
    numbers = f"u = {coin:.3f}" if coin is not None else "u = –"
    numbers += f" {'<' if kind == 'accepted' else '≥'} a = {accept:.3f}" if accept is not None else ""
    if kind == "accepted":
        return f"{spec} keeps the draft {_token(record, text, 'draft_token')}: {numbers}"
    return f"{spec} rejects the draft {_token(record, text, 'draft_token')}: {numbers}; its fallback law gives {_token(record, text)}"


def tree_decision_line(spec: str, kind: str, candidates: list[dict[str, Any]], emitted: str) -> str:
    """What ``spec`` did at a tree node: each candidate tried in order with its coin, then the outcome,
    e.g. ``lossless tries ' the' (u = 0.61 ≥ a = 0.40, refused), ' a' (u = 0.12 < a = 0.55, kept)``."""
    tries = []
    for candidate in candidates:
        coin, accept = _number(candidate.get("u_accept")), _number(candidate.get("accept_prob"))
        if coin is None:
            break
        kept = candidate.get("decision") == "accepted"
        numbers = f"u = {coin:.3f} {'<' if kept else '≥'} a = {accept:.3f}" if accept is not None else f"u = {coin:.3f}"
        tries.append(f"{str(candidate.get('label'))!r} ({numbers}, {'kept' if kept else 'refused'})")
    line = f"{spec} tries " + ", ".join(tries) if tries else f"{spec} tries no candidate"
    if kind == "rejected":
        line += f"; every candidate refused, the law left after them gives {emitted}"
    return line


def divergence_reason(reference_spec: str, reference: dict[str, Any], other_spec: str, other: dict[str, Any],
                      text: Callable[[int], str] | None = None) -> str:
    """One line on why ``other`` leaves ``reference`` at this position (both records at the first divergence)."""
    kinds = (reference["kind"], other["kind"])
    if reference.get("draft_token") != other.get("draft_token") and "bonus" not in kinds:
        return (f"the drafts differ ({_token(reference, text, 'draft_token')} vs {_token(other, text, 'draft_token')}): "
                "the runs are not coupled here (different drafter or settings)")
    if kinds == ("rejected", "rejected"):
        coin = _number(reference.get("u_accept"))
        fallback = _number(reference.get("u_fallback"))
        return (f"both reject the draft {_token(reference, text, 'draft_token')}"
                + (f" (u = {coin:.3f}, a = {_number(reference.get('accept_prob')):.3f} and {_number(other.get('accept_prob')):.3f})"
                   if coin is not None and _number(reference.get("accept_prob")) is not None and _number(other.get("accept_prob")) is not None
                   else "")
                + "; the same uniform"
                + (f" u_f = {fallback:.3f}" if fallback is not None else "")
                + f" lands on different tokens of the two fallback laws: {reference_spec} → {_token(reference, text)}, "
                f"{other_spec} → {_token(other, text)}")
    if kinds == ("bonus", "bonus"):
        return (f"both draw the bonus with the same uniform; the bonus laws differ: {reference_spec} → {_token(reference, text)}, "
                f"{other_spec} → {_token(other, text)}")
    return f"{decision_line(reference_spec, reference, text)}; {decision_line(other_spec, other, text)}"


def why_they_part(store: Store, reference_id: str, other_id: str, divergence: int | None,
                  decode: Callable[[int], str] | None = None) -> str:
    """One line on why ``other_id`` leaves ``reference_id`` at ``divergence``: each rule's coin ``u``
    against its ``a(x)``, or the fallback or bonus laws the shared uniform lands on differently."""
    reference, other = store.get_run(reference_id), store.get_run(other_id)
    if divergence is None:
        return (f"{other['rule']} never leaves {reference['rule']}: the two runs are identical over all "
                f"{int(reference.get('n_tokens') or 0)} positions")
    records = {run_id: store.position(run_id, divergence) for run_id in (reference_id, other_id)}
    for run_id, row in ((reference_id, reference), (other_id, other)):
        if records[run_id] is None:
            return f"the {row['rule']} run ends at position {divergence} ({row.get('stop_reason') or row.get('status')}); the other goes on"
    return divergence_reason(str(reference["rule"]), records[reference_id], str(other["rule"]), records[other_id], decode)


def chain_divergence(reference_run: dict[str, Any], reference_record: dict[str, Any], other_rule: str,
                     other_record: dict[str, Any], laws: RunLaws | None, decode: Decode,
                     unavailable: str | None) -> tuple[str, go.Figure, str | None]:
    """Two chain runs at their first divergence: the reason (the shared coin ``u`` against each rule's
    ``a(x)``, or each fallback draw), the figure of ``p``, ``q`` and each rule's step on them, and the
    note on rebuilt laws (``None`` when exact). Same prefix up to here, so ``p`` and ``q`` are the
    reference's."""
    reason = divergence_reason(reference_run["rule"], reference_record, other_rule, other_record, decode)
    detail = position_view(reference_run, reference_record, laws, decode, unavailable=unavailable)
    steps = []
    for spec, record in ((reference_run["rule"], reference_record), (other_rule, other_record)):
        view = explain_step(get_rule(spec), detail.view.p_target, detail.view.q_draft, detail.view.labels)
        if not detail.exact:  # rebuilt laws index the stored top-k (a token outside it: the tail bar)
            tail = len(detail.ids or [])
            record = {**record, "token": detail.index_of(record["token"], tail),
                      "draft_token": detail.index_of(record.get("draft_token"), tail)}
        steps.append((view, record))
    figure = divergence_figure(detail.view.p_target, detail.view.q_draft, steps)
    return reason, figure, None if detail.exact else detail.note


def run_decision(run: dict[str, Any], record: dict[str, Any], nodes: Any, laws: RunLaws | None, decode: Decode,
                 unavailable: str | None) -> tuple[str, go.Figure]:
    """One run's decision at a position: a tree run's node view (``nodes``: the round's stored
    ``tree_nodes``; candidates in order, the law after each refusal) or a chain run's step on ``p``
    and ``q``, each as its one-line decision and its figure."""
    view = tree_node_view(run, record, nodes, laws, decode, unavailable) if nodes is not None else None
    if view is not None:
        emitted = repr(decode(int(record["token"]))) if decode else repr(record.get("token_text") or str(record["token"]))
        return (tree_decision_line(run["rule"], record["kind"], view.candidates, emitted),
                tree_candidates_figure(view, top_n=12, emitted_token=view.index_of(record["token"])))
    detail = position_view(run, record, laws, decode, unavailable=unavailable)
    draft_token = None if record["kind"] == "bonus" else detail.index_of(record.get("draft_token"))
    return (decision_line(run["rule"], record, decode),
            law_figure(detail.view, top_n=12, draft_token=draft_token, emitted_token=detail.index_of(record["token"]),
                       kind=record["kind"]))


def shape_label(run: dict[str, Any]) -> str:
    """``tree 2,1`` or ``chain γ = 4``: how a run drafted."""
    return f"tree {run['tree']}" if run.get("tree") else f"chain γ = {run['gamma']}"


def jump_targets(records: list[dict[str, Any]], current: int, divergence: int | None = None) -> dict[str, int | None]:
    """Positions to jump to from ``current``: the previous/next rejection, the previous/next severe
    overshoot (draft mass at ``q ≥ p/l`` at least ``SEVERE_OVERSHOOT``) and the first divergence
    (``None`` where there is none)."""
    rejections = [int(r["position"]) for r in records if r["kind"] == "rejected"]
    severe = [int(r["position"]) for r in records if (_number(r.get("severe_overshoot")) or 0.0) >= SEVERE_OVERSHOOT]

    def before(positions: list[int]) -> int | None:
        earlier = [position for position in positions if position < current]
        return earlier[-1] if earlier else None

    def after(positions: list[int]) -> int | None:
        return next((position for position in positions if position > current), None)

    count = len(records)
    return {
        "previous rejection": before(rejections), "next rejection": after(rejections),
        "previous severe overshoot": before(severe), "next severe overshoot": after(severe),
        "first divergence": divergence if divergence is not None and 0 <= divergence < count else None,
    }
