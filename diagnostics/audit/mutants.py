"""Planted bugs: one per bug class of docs/maths.md#planted-bugs, each to be caught by some audit layer.

Rule level (one verification step; ``Verify`` adapters): residual by softmax, accept coin reused
for the residual, greedy draft scored with its softmax, raw vs processed ``q``, temperature on
one side only, ids past the vocabulary. Engine level (a whole generator; ``EngineSeams`` passed
to ``generate``): KV-cache rollback off by one, residual from the wrong position, truncation
dropped on the verified positions; and for batches (``generate_batch``), rows leaking into each
other: a row verified with its neighbour's ``p``, two rows' cache slots swapped. The correct counterparts must pass the same audits (the
negative controls of the audit itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from diagnostics.engine.drafting import TargetScorer
from diagnostics.engine import EngineSeams, fallback_law, target_laws
from diagnostics.engine.forward import Block, BlockOutput, Forward, Output
from diagnostics.engine.chain_verify import at_index
from diagnostics.policy import Policy, probabilities
from diagnostics.rng import sample_inverse_cdf
from diagnostics.rules import Rule, normalise_or
from diagnostics.rules.base import coin_draws
from diagnostics.engine.tree_attention import tree_inputs
from diagnostics.engine.tree_verify import unzeroed_steps_rows
from diagnostics.engine.reference.tree_walk import all_node_steps

Verify = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


# -- rule level --------------------------------------------------------------------------------


def _lossless_step(p: torch.Tensor, q_verify: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator,
                   residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                   reuse_coin: bool = False) -> torch.Tensor:
    accept = torch.where(q_verify[drafts] > 0, (p[drafts] / q_verify[drafts]).clamp(max=1.0), 1.0)
    coins = coin_draws(drafts.shape, generator, p.device)
    law = residual(p, q_verify) if residual else normalise_or((p - q_verify).clamp(min=0.0), p)
    second = coins if reuse_coin else coin_draws(drafts.shape, generator, p.device)
    fallback = sample_inverse_cdf(law, second)
    return torch.where(coins < accept, drafts, fallback)


def _softmax_residual(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return _lossless_step(p, q, drafts, generator, residual=lambda a, b: torch.softmax(a - b, -1))


def _reused_coin(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return _lossless_step(p, q, drafts, generator, reuse_coin=True)


def _greedy_draft_softmax_q(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # The drafter proposes argmax q every time, but verification is told the draft law was q.
    greedy = torch.full_like(drafts, int(q.argmax()))
    return _lossless_step(p, q, greedy, generator)


def _raw_q(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # Drafts come from q; verification uses the draft's law before its policy (here: q flattened, as raw logits would be).
    raw = normalise_or(q.sqrt(), q)
    return _lossless_step(p, raw, drafts, generator)


def _temperature_one_side(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # The verifier sharpens p with T = 0.7 that the baseline policy does not apply.
    hot = normalise_or(p ** (1 / 0.7), p)
    return _lossless_step(hot, q, drafts, generator)


def _padded_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # The residual over a head padded to a multiple of 64 whose padding keeps a little mass
    # (logits 0 instead of −inf): now and then an id past the vocabulary comes out.
    residual = normalise_or((p - q).clamp(min=0.0), p)
    padding = torch.full((64 - p.numel() % 64 or 64,), 1e-3, dtype=residual.dtype, device=residual.device)
    return torch.cat([residual, padding])


def _padded_vocabulary(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return _lossless_step(p, q, drafts, generator, residual=_padded_residual)


RULE_MUTANTS: dict[str, tuple[str, Verify]] = {
    "residual_softmax": ("residual taken as softmax(p − q) instead of norm((p − q)+)", _softmax_residual),
    "coin_reused": ("the accept coin reused for the residual draw", _reused_coin),
    "greedy_draft_softmax_q": ("greedy draft, but its softmax used as q", _greedy_draft_softmax_q),
    "raw_q": ("q taken before the draft policy (raw) while drafts follow the processed q", _raw_q),
    "temperature_one_side": ("temperature applied on one side only: the verifier's p is not the baseline's", _temperature_one_side),
    "out_of_vocabulary": ("residual drawn over a padded head: ids past the vocabulary", _padded_vocabulary),
}


# -- engine level ------------------------------------------------------------------------------


class StaleRollbackScorer(TargetScorer):
    """Rollback off by one: the first refused draft's keys and values stay in the target's cache."""

    def rollback(self, length: int) -> None:
        self.cached = min(self.cached, length + 1)


def _residual_next_position(rule: Rule, p_laws: torch.Tensor, q_laws: torch.Tensor, index) -> torch.Tensor:
    # Off-by-one indexing: the residual pairs q_i with p_{i+1} (the row after the rejected one).
    return rule.fallback(at_index(p_laws, index + 1), at_index(q_laws, index))


def _untruncated_verification(logits: torch.Tensor, policy: Policy, drafted: int) -> torch.Tensor:
    # The verified rows get temperature only (top-k, top-p, min-p, eta dropped); the bonus row is right.
    laws = probabilities(logits, policy)
    if drafted:
        laws = laws.clone()
        laws[..., :drafted, :] = probabilities(logits[..., :drafted, :], Policy(temperature=policy.temperature))
    return laws


# -- tree engine -------------------------------------------------------------------------------


def _unzeroed_steps(rule: Rule, p_node: torch.Tensor, q_node: torch.Tensor, tokens: list[int], sampled: bool,
                    distinct: bool):
    # A refused sibling is not zeroed before the next is tried: every child is tried against p itself,
    # and the fallback draws from p, which may give back a refused candidate.
    accept = [float(p_node[token]) for token in tokens]
    law = torch.zeros_like(p_node)
    survive = 1.0
    for token, a_value in zip(tokens, accept):
        law[token] += survive * a_value
        survive *= 1.0 - a_value
    return accept, [float(p_node[token]) for token in tokens], p_node, law + survive * p_node


def _unzeroed_tree_steps(rule: Rule, draft, p_laws: torch.Tensor, mode: str) -> dict:
    return all_node_steps(rule, draft, p_laws, mode, steps_of=_unzeroed_steps)


class FlatPositionScorer(TargetScorer):
    """Tree positions counted along the flattened tree (prefix + node index) instead of by depth."""

    @staticmethod
    def tree_inputs(prefix_length, tree, dtype, cached=0, first_node=0, *, device):
        mask, positions = tree_inputs(prefix_length, tree, dtype, cached, first_node, device=device)
        fresh = prefix_length - cached
        flat = positions.clone()
        flat[0, fresh:] = prefix_length + torch.arange(len(tree.tokens) - first_node, device=device) + first_node
        return mask, flat


    @staticmethod
    def tree_positions(prefix_lengths, depths):
        return prefix_lengths[:, None] + torch.arange(depths.shape[-1], device=depths.device)[None, :]


class SiblingRowScorer(TargetScorer):
    """KV compaction that keeps, for each accepted node, the row of its first sibling: right when the
    first candidate was accepted, a refused sibling's keys and values otherwise."""

    @staticmethod
    def path_rows(prefix_length, tree, path):
        rows = list(range(prefix_length))
        for node in path:
            first = tree.parents.index(tree.parents[node])
            rows.append(prefix_length + first)
        return rows


TREE_MUTANTS: dict[str, tuple[str, EngineSeams]] = {
    "sibling_not_zeroed": ("a refused sibling is not zeroed (and the law renormalised) before the next is tried",
                           EngineSeams(tree_steps=_unzeroed_tree_steps, tree_steps_rows=unzeroed_steps_rows)),
    "flat_position_ids": ("tree position_ids counted along the flattened tree instead of by depth",
                          EngineSeams(scorer=FlatPositionScorer)),
    "kv_keeps_refused_sibling": ("KV compaction keeps a refused sibling's row instead of the accepted node's",
                                 EngineSeams(scorer=SiblingRowScorer)),
}


ENGINE_MUTANTS: dict[str, tuple[str, EngineSeams]] = {
    "rollback_off_by_one": ("KV-cache rollback off by one: the first refused draft stays cached",
                            EngineSeams(scorer=StaleRollbackScorer)),
    "residual_wrong_position": ("the residual after a rejection at block index i uses p of position i + 1",
                                EngineSeams(fallback_law=_residual_next_position)),
    "truncation_dropped": ("top-k / top-p applied to the bonus position only, not to the verified positions",
                           EngineSeams(target_laws=_untruncated_verification)),
}

# -- batched engine: rows that leak into each other ---------------------------------------------


def _neighbours_p(requests, outputs):
    # The target's logits handed to the wrong rows: each row verified with the next row's p (where the
    # next row asked for at least as many positions).
    if isinstance(requests, Block):  # the round program: every row asked for as many positions
        if len(requests.slots) < 2 or requests.stage.order < 1:
            return outputs
        return BlockOutput(logits=outputs.logits.roll(-1, dims=0), hidden=outputs.hidden)
    if len(outputs) < 2 or requests[0].stage.order < 1:
        return outputs
    leaked = []
    for index, output in enumerate(outputs):
        other = outputs[(index + 1) % len(outputs)]
        fits = output.logits is not None and other.logits is not None and other.logits.shape[0] >= output.logits.shape[0]
        leaked.append(Output(logits=other.logits[: output.logits.shape[0]], hidden=output.hidden) if fits else output)
    return leaked


def _swapped_slots(requests):
    # The verifier's slot table off by one row after prefill: a target forward over a cached prefix
    # runs each row on the next row's keys and values (a row's prompt, on its first forward, is right).
    if isinstance(requests, Block):  # the round program: one block of every row, in its own order
        slots = requests.slots
        if len(slots) < 2 or requests.stage.order < 1:
            return requests
        ordered = sorted(slots)  # the slot table: each row gets the next slot in use
        following = {slot: ordered[(index + 1) % len(ordered)] for index, slot in enumerate(ordered)}
        return replace(requests, slots=[following[slot] if start > 0 else slot
                                        for slot, start in zip(slots, requests.starts)])
    if len(requests) < 2 or requests[0].stage.order < 1:
        return requests
    slots = [request.slot for request in requests]
    return [replace(request, slot=slots[(index + 1) % len(slots)]) if request.start > 0 else request
            for index, request in enumerate(requests)]


BATCH_MUTANTS: dict[str, tuple[str, EngineSeams]] = {
    "row_gets_neighbours_p": ("batched verification hands each row the next row's target logits",
                              EngineSeams(hand_back=_neighbours_p)),
    "row_cache_swapped": ("the verifier's slot table is off by one row: each row is verified over the next row's KV cache",
                          EngineSeams(route=_swapped_slots)),
}

# The truncation mutant only differs from the correct engine under a truncating policy.
ENGINE_MUTANT_POLICY: dict[str, dict] = {"truncation_dropped": {"top_k": 4}}

__all__ = ["BATCH_MUTANTS", "ENGINE_MUTANTS", "ENGINE_MUTANT_POLICY", "RULE_MUTANTS", "TREE_MUTANTS", "StaleRollbackScorer", "fallback_law",
           "target_laws"]
