"""Verifying one drafted tree: the acceptance steps at every node, the walk, the exact laws.

At a node with target law ``p`` (row of the one tree forward) and children ``c_1 … c_K`` in
order, ``r_1 = p`` and child ``c_j`` is tried with its own coin ``u_j`` (keyed by the output
position the node decides and the sibling index ``j``):

* deterministic children (``top``): accept with ``a_j = a(r_j, c_j)`` (the rule's tree form;
  ``r_j(c_j)`` for lossless); on refusal ``r_{j+1}`` = ``r_j`` with ``c_j`` zeroed, renormalised;
* sampled children (lossless only): accept with ``a_j = min(1, r_j(x_j)/q_j(x_j))``; on refusal
  ``r_{j+1} = norm((r_j − q_j)+)``; without replacement ``q_{j+1}`` is ``q_j`` without ``x_j``.

An accepted child becomes the current node; if every child is refused the token is drawn from
``r_{K+1}`` (the ``fallback`` uniform of that position); a leaf reached by acceptance gets the
bonus from ``b(p_leaf)``. The node's exact emitted law is ``P(c_j) = a_j·Π_{i<j}(1 − a_i)`` plus
``Π_i (1 − a_i)·r_{K+1}`` (for sampled children averaged over the draws, which is ``p``).

Exact expected tokens per round, given the drafted tree: every node is emitted with probability
``reach(v) = Π_{u on the path to v} a_u·Π_{siblings tried before u}(1 − a)``, and a final token
(fallback or bonus) follows unless the round ends at an accepted EOS or at a leaf at the token
budget: ``E = Σ_v reach(v) + 1 − Σ_{v ends the round without a draw} reach(v)``; for a lossless
``top`` tree with no EOS this is ``1 + Σ_v Π p(path to v)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from diagnostics.rng import sample_token, uniform_scalar
from diagnostics.rules import Rule
from diagnostics.engine.tree_draft import DraftTree


@dataclass
class NodeSteps:
    """The acceptance steps at one node with children (``node`` −1 is the root)."""

    node: int
    children: list[int]
    accept: list[float]  # a_j, the probability child j is kept when it is tried
    residual: list[float]  # r_j(token of child j) when it is tried
    rest: torch.Tensor  # r_{K+1}: the law drawn from when every child is refused
    law: torch.Tensor  # the exact law of the token emitted at this node


def without(law: torch.Tensor, token: int) -> torch.Tensor:
    """``law`` with ``token`` zeroed and renormalised (zeros when nothing is left)."""
    removed = law.clone()
    removed[token] = 0.0
    total = float(removed.sum())
    return removed / total if total > 0 else removed


def _positive_part(r_node: torch.Tensor, q_law: torch.Tensor) -> torch.Tensor:
    """``norm((r − q)+)``, or ``r`` itself when ``r ≤ q`` everywhere (then every draft is kept)."""
    residual = (r_node - q_law).clamp(min=0.0)
    total = float(residual.sum())
    return residual / total if total > 0 else r_node


def node_steps(rule: Rule, p_node: torch.Tensor, q_node: torch.Tensor, tokens: list[int], sampled: bool,
               distinct: bool, trace: list[torch.Tensor] | None = None) -> tuple[list[float], list[float], torch.Tensor, torch.Tensor]:
    """``(a_j, r_j(c_j), r_{K+1}, P)`` at one node for the children ``tokens`` in order; ``trace``
    (a list) receives ``r_1 … r_{K+1}``, the law before each try and the one drawn from at the end."""
    accept: list[float] = []
    residual: list[float] = []
    law = torch.zeros_like(p_node)
    r_node, q_law, survive = p_node, q_node, 1.0
    plain = rule.name == "lossless"
    for token in tokens:
        if trace is not None:
            trace.append(r_node)
        r_value = float(r_node[token])
        if sampled:
            q_value = float(q_law[token])
            a_value = min(1.0, r_value / q_value) if q_value > 0 else (1.0 if r_value > 0 else 0.0)
            r_next = _positive_part(r_node, q_law)
            if distinct:
                q_law = without(q_law, token)
        else:
            if plain:
                a_value = r_value  # lossless: a_j = r_j(c_j)
            else:
                a_value = float(rule.tree_accept(r_node, torch.tensor(token, device=r_node.device))) if float(r_node.sum()) > 0 else 0.0
            r_next = without(r_node, token)
            if r_value > 0 and not bool((r_next > 0).any()):
                # r_j sat on c_j alone: a_j is 1 up to rounding, and nothing is left to fall back to.
                a_value = 1.0
        accept.append(a_value)
        residual.append(r_value)
        if not sampled:
            law[token] += survive * a_value
        survive *= 1.0 - a_value
        r_node = r_next
    if trace is not None:
        trace.append(r_node)
    if sampled:
        law = p_node.clone()  # averaged over the draws of the children, the node emits p (lossless)
    elif survive > 0:
        law = law + survive * r_node
    return accept, residual, r_node, law


class NodeStepsMap(Mapping):
    """The steps at every node with children (−1: the root), each computed when first asked for:
    a walk visits one node per depth, so a generation that records nothing never pays for the
    rest of the tree; reading every value (``reach_probabilities``) computes them all."""

    def __init__(self, compute: Callable[[int, list[int]], NodeSteps], children: dict[int, list[int]]) -> None:
        self._compute = compute
        self._children = children
        self._done: dict[int, NodeSteps] = {}

    def __getitem__(self, node: int) -> NodeSteps:
        if node not in self._done:
            if node not in self._children:
                raise KeyError(node)
            self._done[node] = self._compute(node, self._children[node])
        return self._done[node]

    def __iter__(self):
        return iter(self._children)

    def __len__(self) -> int:
        return len(self._children)


def all_node_steps(rule: Rule, draft: DraftTree, p_laws: torch.Tensor, mode: str,
                   steps_of: Callable[..., tuple] = node_steps) -> NodeStepsMap:
    """Steps at every node that has children, keyed by node (−1: the root), computed on first use.
    ``steps_of``: an audit's planted bug may replace ``node_steps``."""
    sampled = mode != "top"
    children = {row - 1: kids for row, kids in enumerate(draft.children) if kids}

    def compute(node: int, kids: list[int]) -> NodeSteps:
        tokens = [draft.tree.tokens[child] for child in kids]
        accept, residual, rest, law = steps_of(rule, p_laws[node + 1], draft.q_laws[node + 1], tokens, sampled,
                                               mode == "sample-distinct")
        return NodeSteps(node, kids, accept, residual, rest, law)

    return NodeStepsMap(compute, children)


def reach_probabilities(draft: DraftTree, steps: dict[int, NodeSteps]) -> list[float]:
    """``reach(v)``: the exact probability that the walk accepts node ``v``."""
    reach = [0.0] * len(draft.tree.tokens)
    for node_steps_ in sorted(steps.values(), key=lambda item: item.node):
        base = 1.0 if node_steps_.node < 0 else reach[node_steps_.node]
        survive = 1.0
        for child, a_value in zip(node_steps_.children, node_steps_.accept):
            reach[child] = base * survive * a_value
            survive *= 1.0 - a_value
    return reach


def expected_tokens(draft: DraftTree, reach: list[float], eos: set[int], budget: int) -> float:
    """``E = Σ_v reach(v) + 1 − Σ_{v ends the round without a draw} reach(v)`` (see the module doc)."""
    depths = draft.tree.depths
    has_children = {parent for parent in draft.tree.parents}
    silent = sum(reach[node] for node, token in enumerate(draft.tree.tokens)
                 if token in eos or (node not in has_children and depths[node] >= budget))
    return sum(reach) + 1.0 - silent


@dataclass
class Decision:
    """What decided one emitted position: the node it was drawn at and its coins."""

    node: int  # −1: the root
    kind: str  # accepted, rejected or bonus
    token: int
    child: int | None  # the accepted child, or the first candidate (rejected), None for a bonus
    accept_prob: float | None
    u_accept: float | None
    u_fallback: float | None
    law: torch.Tensor  # the exact law this position's token came from


@dataclass
class Walk:
    """One round's outcome: the emitted positions in order, the accepted path, the coins tried."""

    decisions: list[Decision] = field(default_factory=list)
    path: list[int] = field(default_factory=list)
    tried: dict[int, tuple[float, bool]] = field(default_factory=dict)  # child -> (u_accept, kept)
    finished: bool = False

    @property
    def tokens(self) -> list[int]:
        return [decision.token for decision in self.decisions]


def walk(rule: Rule, draft: DraftTree, p_laws: torch.Tensor, steps: dict[int, NodeSteps], seed: int, position: int,
         eos: set[int], budget: int) -> Walk:
    """Walk the tree from the root with the run's coins; stop at an all-refused node, an accepted
    leaf (bonus, if the token budget allows), or an accepted EOS."""
    result = Walk()
    depths = draft.tree.depths
    node = -1
    while True:
        here = position + (0 if node < 0 else depths[node])
        at = steps.get(node)
        if at is None:
            if len(result.decisions) < budget:
                u_fallback = uniform_scalar(seed, here, "fallback")
                bonus = rule.bonus(p_laws[node + 1])
                token = sample_token(bonus, u_fallback)
                result.decisions.append(Decision(node, "bonus", token, None, None, None, u_fallback, bonus))
                result.finished = token in eos
            return result
        kept = None
        for sibling, (child, a_value) in enumerate(zip(at.children, at.accept)):
            u_accept = uniform_scalar(seed, here, "accept", sibling)
            result.tried[child] = (u_accept, u_accept < a_value)
            if u_accept < a_value:
                kept = child
                result.decisions.append(Decision(node, "accepted", draft.tree.tokens[child], child, a_value, u_accept, None, at.law))
                break
        if kept is None:
            u_fallback = uniform_scalar(seed, here, "fallback")
            token = sample_token(at.rest, u_fallback)
            first = at.children[0]
            result.decisions.append(Decision(node, "rejected", token, first, at.accept[0], result.tried[first][0], u_fallback, at.law))
            result.finished = token in eos
            return result
        result.path.append(kept)
        if draft.tree.tokens[kept] in eos:
            result.finished = True
            return result
        node = kept
