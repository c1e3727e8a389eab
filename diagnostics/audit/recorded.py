"""Recorded-run audit: replay every stored decision and recompute ``p`` independently.

Checks, position by position: the decision replays from the stored uniforms
(``accept ⇔ u_accept < a(x)``); no drafted token has ``q(x) = 0`` and no emitted token has
``p(y) = 0``; the accepted count is near ``Σ α`` (a z-score); and, when the run's model is
available, ``p`` and ``q`` recomputed by plain forwards on the committed prefix reproduce the
recorded ``a(x)``, top-k of ``p``, and the fallback and bonus tokens from their uniforms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from diagnostics.rng import sample_inverse_cdf
from diagnostics.rules import get_rule

WORST_SHOWN = 10


@dataclass
class RecordedAudit:
    """Checks on one stored run; ``flags`` lists every position that failed a check, with why."""

    run_id: str
    positions: int
    verdict: str
    acceptance_z: float | None
    accepted: int
    expected_accepted: float
    max_p_difference: float | None
    flags: list[dict] = field(default_factory=list)
    worst_positions: list[dict] = field(default_factory=list)
    layer: str = "recorded"

    def as_dict(self) -> dict:
        return asdict(self)


def _replay_tree_node(run: dict, rule, record: dict, nodes, p_target: torch.Tensor, q_draft: torch.Tensor | None,
                      tolerance: float, flag) -> None:
    """A tree position: the node's candidates (from the stored nodes) tried in order against the
    recomputed ``p`` must give the stored ``a_j``, the stored decisions from the stored coins, and
    (all refused) the emitted token from ``r_{K+1}`` at ``u_fallback``."""
    from diagnostics.engine.reference.tree_walk import node_steps

    position, node = int(record["position"]), record.get("tree_node")
    if nodes is None or nodes.empty or node is None or node != node:
        flag(position, "tree nodes", "the run is a tree run but this file holds no nodes for the round")
        return
    children = nodes[nodes["parent"] == int(node)].sort_values("sibling")
    mode = run.get("tree_children") or "top"
    tokens = [int(token) for token in children["token"]]
    q_law = q_draft if q_draft is not None and mode != "top" else torch.zeros_like(p_target)
    accept, _residual, rest, _law = node_steps(rule, p_target, q_law, tokens, mode != "top", mode == "sample-distinct")
    kept = None
    for a_value, row in zip(accept, children.itertuples()):
        if abs(a_value - float(row.accept_prob)) > tolerance:
            flag(position, "a(x) recomputed", f"candidate {row.token}: recorded {row.accept_prob:.6f}, recomputed {a_value:.6f}")
        if row.decision == "untried" or kept is not None:
            continue
        if (row.u_accept < a_value) != (row.decision == "accepted"):
            flag(position, "replay", f"candidate {row.token}: u = {row.u_accept:.6f}, a = {a_value:.6f} but recorded {row.decision}")
        if row.decision == "accepted":
            kept = int(row.token)
    if record["kind"] == "accepted" and kept != int(record["token"]):
        flag(position, "replay", f"recorded token {record['token']} is not the accepted candidate {kept}")
    if record["kind"] == "rejected":
        expected = int(sample_inverse_cdf(rest, torch.tensor(record["u_fallback"], device=rest.device)))
        if expected != record["token"]:
            flag(position, "fallback replay", f"u = {record['u_fallback']:.6f} gives {expected}, recorded {record['token']}")


def audit_recorded_run(store, run_id: str, target=None, z_limit: float = 4.0, p_tolerance: float = 1e-4) -> RecordedAudit:
    """Replay a stored run: ``accept ⇔ u_accept < a(x)`` at every verified position; no drafted
    token with ``q(x) = 0`` and no emitted token with ``p(y) = 0``; the accepted count against
    ``Σ α`` (z-score, ``|z| > z_limit`` flags); and, when ``target`` (the run's model) is given,
    ``p`` and ``q`` recomputed by teacher-forced forwards (one per model over prompt + output,
    ``inspection.RunLaws``: equal to a plain forward on each committed prefix; a draft head's ``q``
    from ``heads.check``) must reproduce the recorded ``q(x)``, ``a(x)``, top-k of ``p``, draft,
    fallback and bonus tokens from the stored uniforms.
    """
    from diagnostics.inspection import RunLaws, draft_model

    run = store.get_run(run_id)
    if run is None:
        raise ValueError(f"there is no run {run_id!r} in {store.path}")
    rule = get_rule(run["rule"])
    records = store.positions(run_id).to_dict("records")
    flags: list[dict] = []

    def flag(position: int, check: str, detail: str) -> None:
        flags.append({"position": position, "check": check, "detail": detail})

    def present(value) -> bool:
        return value is not None and value == value

    # Every position's laws from one forward per model (a forward per position made this O(n²)).
    laws = RunLaws(run, [int(record["token"]) for record in records], target, draft_model(run, target)) \
        if target is not None else None
    tree_nodes = store.tree_nodes(run_id) if run.get("tree") else None

    def nodes_of(block: int):
        return tree_nodes[tree_nodes["block"] == block] if tree_nodes is not None else None

    accepted = 0
    alpha_sum = variance = 0.0
    max_difference = None
    differences: list[dict] = []
    for record in records:
        position, kind = int(record["position"]), record["kind"]
        if present(record.get("p_token")) and record["p_token"] <= 0:
            flag(position, "p(y) = 0", f"emitted token {record['token']} has target probability 0")
        if kind != "bonus":
            if present(record.get("q_draft")) and record["q_draft"] <= 0:
                flag(position, "q(x) = 0", f"drafted token {record['draft_token']} had draft probability 0")
            decided = record["u_accept"] < record["accept_prob"]
            if decided != (kind == "accepted"):
                flag(position, "replay", f"u = {record['u_accept']:.6f}, a(x) = {record['accept_prob']:.6f} but recorded {kind}")
            accepted += kind == "accepted"
            if present(record.get("alpha")):
                alpha_sum += record["alpha"]
                variance += record["alpha"] * (1 - record["alpha"])
        if laws is None:
            continue
        p_target, q_draft = laws.p_at(position), laws.q_at(position, record)
        top_ids = [int(token) for token in record["p_top_ids"]]
        difference = float((p_target[top_ids] - torch.tensor(list(record["p_top_probs"]), dtype=torch.float64, device=p_target.device)).abs().max())
        max_difference = difference if max_difference is None else max(max_difference, difference)
        differences.append({"position": position, "kind": kind, "token": int(record["token"]), "p_difference": difference})
        if difference > p_tolerance:
            flag(position, "p recomputed", f"recorded p differs from a plain forward on the prefix by {difference:.3g}")
            continue
        if q_draft is not None and present(record.get("q_draft")):
            q_difference = abs(float(q_draft[int(record["draft_token"])]) - float(record["q_draft"]))
            if q_difference > p_tolerance:  # e.g. a draft head fed the wrong state: the output law stays exact, q does not
                flag(position, "q recomputed", f"recorded q(x) differs from the drafter's law recomputed on the prefix "
                                               f"by {q_difference:.3g}")
                continue
        if kind == "bonus":
            expected = int(sample_inverse_cdf(rule.bonus(p_target), torch.tensor(record["u_fallback"], device=p_target.device)))
            if expected != record["token"]:
                flag(position, "bonus replay", f"u = {record['u_fallback']:.6f} gives {expected}, recorded {record['token']}")
            continue
        if run.get("tree"):
            _replay_tree_node(run, rule, record, nodes_of(int(record["block"])), p_target, q_draft, p_tolerance, flag)
            continue
        accept = float(rule.accept_prob(p_target, q_draft)[int(record["draft_token"])])
        if abs(accept - record["accept_prob"]) > p_tolerance:
            flag(position, "a(x) recomputed", f"recorded {record['accept_prob']:.6f}, recomputed {accept:.6f}")
        if kind == "rejected":
            expected = int(sample_inverse_cdf(rule.fallback(p_target, q_draft),
                                              torch.tensor(record["u_fallback"], device=p_target.device)))
            if expected != record["token"]:
                flag(position, "fallback replay", f"u = {record['u_fallback']:.6f} gives {expected}, recorded {record['token']}")
    z = (accepted - alpha_sum) / variance**0.5 if variance > 0 else None
    if z is not None and abs(z) > z_limit:
        flag(-1, "acceptance count", f"{accepted} accepted vs Σα = {alpha_sum:.1f} (z = {z:.1f})")
    worst = sorted(differences, key=lambda item: -item["p_difference"])[:WORST_SHOWN]
    return RecordedAudit(run_id=run_id, positions=len(records), verdict="fail" if flags else "pass", acceptance_z=z,
                         accepted=accepted, expected_accepted=alpha_sum, max_p_difference=max_difference, flags=flags,
                         worst_positions=worst)


