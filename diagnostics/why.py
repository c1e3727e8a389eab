"""Why two coupled runs part at a position, as a sentence and a figure: shared by the Compare page
and the report, so both tell it alike. ``laws`` are a run's exact laws when its models are loaded,
else ``None`` and the views are rebuilt from the stored top-k (``unavailable`` says why)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from diagnostics.charts import divergence_figure, law_figure, tree_candidates_figure
from diagnostics.divergence import decision_line, divergence_reason, tree_decision_line
from diagnostics.explain import explain_step
from diagnostics.inspection import RunLaws, position_view, tree_node_view
from diagnostics.rules import get_rule

Decode = Callable[[int], str] | None


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
