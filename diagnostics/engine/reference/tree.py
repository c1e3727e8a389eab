"""The tree loop: draft a tree, verify every node in one target forward, walk it, keep the path.

One round (``diagnostics.engine.tree_draft``, ``diagnostics.engine.reference.tree_walk``):

1. the drafter grows a tree below the last committed token;
2. the target scores the root and every node in one forward under a tree attention mask
   (``position_ids = prefix length − 1 + depth``), so row ``i + 1`` is ``p`` after the path to
   node ``i``;
3. the walk tries each node's children in order with per-sibling coins and emits one token per
   depth reached, then a fallback (all children refused) or a bonus (accepted leaf);
4. both KV caches keep the prefix and the accepted path's rows, in order (gather, then crop).

Records: one ``PositionRecord`` per emitted position with the exact law of the node it was drawn
at (``TreeRule.induced``, or ``p`` for lossless), one ``NodeRecord`` per drafted node (parent,
depth, sibling, ``q`` and ``p`` of its token, ``a``, the coin, the decision, the exact
probability the walk accepts it), and one ``RoundRecord`` per round with the exact expected
number of tokens beside the number emitted. ``tree_row`` yields its forwards like ``reference.chain.chain_row``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from diagnostics.engine.drafting import fit_vocabulary
from diagnostics.engine.records import (NodeRecord, PositionRecord, RoundRecord, Run, decode_one, finish, position_record, rounds,
                                        top_entries)
from diagnostics.engine.seams import EngineSeams
from diagnostics.metrics import entropy, kl_divergence, overshoot_mass, total_variation
from diagnostics.rng import uniform_scalar
from diagnostics.rules import Rule
from diagnostics.engine.tree_draft import DraftTree, TreeSpec
from diagnostics.engine.reference.tree_walk import Decision, NodeSteps, Walk, expected_tokens, reach_probabilities, walk


def tree_row(row: Any, drafter: Any, scorer: Any, spec: TreeSpec, vocab: int, tokenizer: Any, seams: EngineSeams):
    """Generate one row (``batch.RowPlan``) with tree rounds; a generator like ``reference.chain.chain_row``."""
    rule, seed, eos = row.rule, row.seed, row.eos
    run = Run(tokens=[], records=[], prompt_ids=row.prompt, rule=rule.spec, draft=drafter.name, gamma=0, seed=seed,
              policy=row.policy, draft_policy=row.draft_policy, tree=spec)
    committed = list(row.prompt)
    start = time.perf_counter()
    for position, budget in rounds(run, row.max_new_tokens, row.should_stop):
        def uniform(depth: int, index: int, _position: int = position) -> float:
            return uniform_scalar(seed, _position + depth - 1, "draft", index)

        draft = yield from drafter.propose_tree(committed, spec.limited(budget), uniform, vocab, eos)
        logits = fit_vocabulary((yield from scorer.score_tree(committed, draft.tree)), vocab)
        p_laws = seams.target_laws(logits, row.policy, len(draft.tree.tokens))
        steps = seams.tree_steps(rule, draft, p_laws, spec.children)
        result = walk(rule, draft, p_laws, steps, seed, position, eos, budget)
        if row.record:  # the exact expectation needs every node's steps; a run that records nothing skips them
            reach = reach_probabilities(draft, steps)
            round_ = RoundRecord(block=run.blocks, position=position, nodes=len(draft.tree.tokens),
                                 depth=max(draft.tree.depths, default=0),
                                 expected_tokens=expected_tokens(draft, reach, eos, budget),
                                 emitted=len(result.decisions), accepted=len(result.path))
            _keep_records(run, rule, draft, p_laws, steps, result, reach, round_, tokenizer, row.top_k_record,
                          row.on_record, row.on_round)
        run.blocks += 1
        run.drafted += len(draft.tree.tokens)
        run.accepted += len(result.path)
        run.verified += sum(1 for decision in result.decisions if decision.kind != "bonus")
        scorer.keep_path(len(committed), draft.tree, result.path)
        drafter.commit_tree(len(committed), draft, result.path)
        committed.extend(result.tokens)
        run.tokens.extend(result.tokens)
        if result.finished:
            run.stop_reason = "eos"
            break
    return finish(run, start, tokenizer)


def _keep_records(run: Run, rule: Rule, draft: DraftTree, p_laws: torch.Tensor, steps: dict[int, NodeSteps],
                  result: Walk, reach: list[float], round_: RoundRecord, tokenizer: Any, top_k_record: int,
                  on_record: Callable[[PositionRecord], None] | None,
                  on_round: Callable[[RoundRecord, list[NodeRecord]], None] | None) -> None:
    nodes = node_records(run.blocks, draft, p_laws, steps, result, reach, tokenizer)
    run.rounds.append(round_)
    run.nodes.extend(nodes)
    if on_round is not None:
        on_round(round_, nodes)
    for index, decision in enumerate(result.decisions):
        position_record = _position_record(run.blocks, round_.position + index, index, rule, draft, p_laws, steps,
                                           decision, tokenizer, top_k_record)
        run.records.append(position_record)
        if on_record is not None:
            on_record(position_record)


def node_records(block: int, draft: DraftTree, p_laws: torch.Tensor, steps: dict[int, NodeSteps], result: Walk,
                 reach: list[float], tokenizer: Any) -> list[NodeRecord]:
    """One record per drafted node, in breadth-first order."""
    records = []
    depths = draft.tree.depths
    for node, (parent, token) in enumerate(zip(draft.tree.parents, draft.tree.tokens)):
        at = steps[parent]
        sibling = at.children.index(node)
        tried = result.tried.get(node)
        decision = "untried" if tried is None else ("accepted" if tried[1] else "refused")
        records.append(NodeRecord(
            block=block, node=node, parent=parent, depth=depths[node], sibling=sibling, token=token,
            q_token=draft.q_token[node], u_draft=draft.u_draft[node], p_token=float(p_laws[parent + 1, token]),
            residual=at.residual[sibling], accept_prob=at.accept[sibling], u_accept=None if tried is None else tried[0],
            decision=decision, reach=reach[node], token_text=decode_one(tokenizer, token),
        ))
    return records


def _position_record(block: int, position: int, index: int, rule: Rule, draft: DraftTree, p_laws: torch.Tensor,
                     steps: dict[int, NodeSteps], decision: Decision, tokenizer: Any, top_k_record: int) -> PositionRecord:
    """The record of one emitted position, with the exact law of the node it was drawn at."""
    row = decision.node + 1
    p_row = p_laws[row]
    law = decision.law
    p_ids, p_probs, p_tail = top_entries(p_row, top_k_record)
    values: dict[str, Any] = {
        "p_token": p_row[decision.token], "u_fallback": decision.u_fallback,
        "entropy_p": entropy(p_row), "tv_target": total_variation(law, p_row),
        "tv_baseline": total_variation(law, rule.baseline(p_row)), "kl_target": kl_divergence(law, p_row),
        "p_top_ids": p_ids, "p_top_probs": p_probs, "p_tail": p_tail,
    }
    allowed = rule.allowed_set(p_row)
    if allowed is not None:
        values.update(allowed_size=allowed.sum(), allowed_mass=(p_row * allowed).sum())
    if decision.kind != "bonus":
        survive = 1.0
        for a_value in steps[decision.node].accept:
            survive *= 1.0 - a_value
        child = decision.child
        draft_token = draft.tree.tokens[child]
        q_row = draft.q_laws[row]
        q_ids, q_probs, q_tail = top_entries(q_row, top_k_record)
        values.update(draft_token=draft_token, p_draft=p_row[draft_token], q_draft=draft.q_token[child],
                      accept_prob=decision.accept_prob, u_draft=draft.u_draft[child], u_accept=decision.u_accept,
                      q_top_ids=q_ids, q_top_probs=q_probs, q_tail=q_tail, alpha=1.0 - survive,
                      tv_pq=total_variation(p_row, q_row), entropy_q=entropy(q_row), overshoot=overshoot_mass(p_row, q_row))
    return position_record(decision.kind, position, block, index, decision.token, values,
                           lambda token: decode_one(tokenizer, token), tree_node=decision.node)
