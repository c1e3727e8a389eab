"""Tree and multi-draft verification: ordered candidates at a tree node, and sampled multi-draft.

At a node with target law ``p`` and ordered candidates ``c_1 … c_K``: ``p_1 = p``; candidate
``c_j`` is accepted with ``a_j = a(p_j, c_j)`` (the rule's ``tree_accept``), and on refusal
``p_{j+1}`` is ``p_j`` with ``c_j`` zeroed and renormalised; if every candidate is refused the
token is drawn from ``p_{K+1}``. Exact node law: ``P(c_j) = a_j·Π_{i<j}(1 − a_i)``,
``P(v ∉ C) = Π_i (1 − a_i)·p_{K+1}(v)`` (``docs/maths.md#trees-and-multi-draft-verification``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from diagnostics.rng import sample_inverse_cdf
from diagnostics.rules.base import Rule, RuleError, as_law, as_laws, coin_draws, normalise_or, safe_ratio
from diagnostics.rules.specs import TREE_RULES, get_rule

# --------------------------------------------------------------------------------------------
# Tree verification with ordered deterministic candidates (EAGLE-style)
# --------------------------------------------------------------------------------------------


def _without(p_node: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """``p_{j+1}``: ``p_j`` with ``candidate`` zeroed and renormalised (zeros if nothing is left)."""
    removed = p_node.scatter(-1, candidate.unsqueeze(-1), 0.0)
    return normalise_or(removed, torch.zeros_like(removed))


@dataclass(frozen=True)
class TreeRule:
    """A node of a token tree: candidates ``c_1 … c_K`` tried in order with ``a(p_j, c_j)``.

    From: Li et al., EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees (2024,
    arXiv:2406.16858), whose top-``k`` children are verified this way (lossless: ``a = p_j(c_j)``).
    On rejection of ``c_j``, ``p_{j+1} = p_j`` with ``c_j`` zeroed and renormalised; if every
    candidate is rejected a token is drawn from ``p_{K+1}``.
    """

    rule: Rule
    kind: ClassVar[str] = "tree"

    def __post_init__(self) -> None:
        if not self.rule.tree_capable:
            raise RuleError(f"rule {self.rule.spec!r} has no tree form; tree rules: {', '.join(TREE_RULES)}")

    @property
    def spec(self) -> str:
        return f"tree:{self.rule.spec}"

    def _nodes(self, p: torch.Tensor, candidates: torch.Tensor):
        """Yield ``(c_j, a_j)`` down the sibling list, then ``p_{K+1}``, following the mechanism."""
        p_node = as_law(p, "p")
        candidates = torch.as_tensor(candidates, dtype=torch.long, device=p_node.device)
        candidates = candidates.expand(*p_node.shape[:-1], candidates.shape[-1])
        if (candidates < 0).any() or (candidates >= p_node.shape[-1]).any():
            raise RuleError(f"tree candidates must be token ids in [0, {p_node.shape[-1]})")
        steps = []
        for j in range(candidates.shape[-1]):
            candidate = candidates[..., j]
            has_mass = p_node.sum(-1) > 0
            accept = torch.where(has_mass, self.rule.tree_accept(p_node, candidate), 0.0)
            steps.append((candidate, accept))
            p_node = _without(p_node, candidate)
        return steps, p_node

    def induced(self, p: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Exact node law: ``P(c_j) = a_j·Π_{i<j}(1 − a_i)``, ``P(v ∉ C) = Π_i(1 − a_i)·p_{K+1}(v)``."""
        steps, p_rest = self._nodes(p, candidates)
        law = torch.zeros_like(p_rest)
        survive = torch.ones(p_rest.shape[:-1], dtype=torch.float64, device=p_rest.device)
        for candidate, accept in steps:
            law.scatter_add_(-1, candidate.unsqueeze(-1), (survive * accept).unsqueeze(-1))
            survive = survive * (1.0 - accept)
        return law + survive.unsqueeze(-1) * p_rest

    def acceptance(self, p: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Probability that some candidate is accepted: ``1 − Π_j (1 − a_j)``."""
        steps, p_rest = self._nodes(p, candidates)
        survive = torch.ones(p_rest.shape[:-1], dtype=torch.float64, device=p_rest.device)
        for _, accept in steps:
            survive = survive * (1.0 - accept)
        return 1.0 - survive

    def baseline(self, p: torch.Tensor) -> torch.Tensor:
        """Same matched baseline as the single-draft rule."""
        return self.rule.baseline(p)

    def simulate(
        self, p: torch.Tensor, candidates: torch.Tensor, n: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``n`` tokens per row from the sibling mechanism: one coin per candidate in order, then ``p_{K+1}``."""
        steps, p_rest = self._nodes(p, candidates)
        shape = (*p_rest.shape[:-1], n)
        has_rest = p_rest.sum(-1, keepdim=True) > 0
        # Rows where nothing is left always accept a candidate; give them a dummy law to draw from.
        p_rest = torch.where(has_rest, p_rest, torch.ones_like(p_rest))
        device = p_rest.device
        emitted = sample_inverse_cdf(p_rest, coin_draws(shape, generator, device))
        decided = torch.zeros(shape, dtype=torch.bool, device=device)
        for candidate, accept in steps:
            coin = coin_draws(shape, generator, device)
            take = ~decided & (coin < accept.unsqueeze(-1))
            emitted = torch.where(take, candidate.unsqueeze(-1).expand(shape), emitted)
            decided |= take
        return emitted


def get_tree_rule(spec: str | Rule, **params: float) -> TreeRule:
    """Tree form of a rule spec (``lossless``, ``lenience:l``, ``cascade:m``, ``typical:eta``)."""
    return TreeRule(get_rule(spec, **params))


def top_candidates(q: torch.Tensor, k: int) -> torch.Tensor:
    """The draft's top-``k`` tokens in decreasing ``q`` (ties by lower id): EAGLE's candidates."""
    q_draft = as_law(q, "q")
    order = torch.sort(-q_draft, dim=-1, stable=True).indices
    return order[..., :k]


# --------------------------------------------------------------------------------------------
# Sampled multi-draft lossless verification (SpecInfer-style)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampledMultiDraft:
    """``K`` i.i.d. drafts ``x_j ~ q``; accept ``x_j`` w.p. ``min(1, p_j(x_j)/q(x_j))``, ``p_{j+1} = norm((p_j − q)+)``.

    From: Miao et al., SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative
    Inference and Verification (2024, arXiv:2305.09781): multi-step speculative sampling."""

    k: int = 2
    spec: ClassVar[str] = "multidraft"

    def __post_init__(self) -> None:
        if int(self.k) != self.k or self.k < 1:
            raise RuleError(f"multi-draft verification needs k >= 1 drafts, got {self.k}")

    def _residuals(self, p_target: torch.Tensor, q_draft: torch.Tensor) -> list[torch.Tensor]:
        laws = [p_target]
        for _ in range(self.k):
            laws.append(normalise_or((laws[-1] - q_draft).clamp(min=0.0), laws[-1]))
        return laws

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``P = Σ_j Π_{i<j}(1 − α_i)·min(p_j, q) + Π_i(1 − α_i)·p_{K+1}``, ``α_j = Σ min(p_j, q)``; equals ``p``."""
        p_target, q_draft = as_laws(p, q)
        laws = self._residuals(p_target, q_draft)
        law = torch.zeros_like(p_target)
        survive = torch.ones((*p_target.shape[:-1], 1), dtype=torch.float64, device=p_target.device)
        for p_node in laws[:-1]:
            kept = torch.minimum(p_node, q_draft)
            law = law + survive * kept
            survive = survive * (1.0 - kept.sum(-1, keepdim=True)).clamp(min=0.0)
        return law + survive * laws[-1]

    def simulate(
        self, p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``n`` tokens per row: draw each ``x_j ~ q``, coin against ``p_j(x_j)/q(x_j)``, then ``p_{K+1}``."""
        p_target, q_draft = as_laws(p, q)
        laws = self._residuals(p_target, q_draft)
        shape = (*p_target.shape[:-1], n)
        device = p_target.device
        emitted = sample_inverse_cdf(laws[-1], coin_draws(shape, generator, device))
        decided = torch.zeros(shape, dtype=torch.bool, device=device)
        for p_node in laws[:-1]:
            drafted = sample_inverse_cdf(q_draft, coin_draws(shape, generator, device))
            accept = safe_ratio(p_node, q_draft).clamp(max=1.0).gather(-1, drafted)
            take = ~decided & (coin_draws(shape, generator, device) < accept)
            emitted = torch.where(take, drafted, emitted)
            decided |= take
        return emitted
