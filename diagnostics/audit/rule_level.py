"""Losslessness audit, rule level: run a verification step many times and test its output law.

Adapter signature (document it to users as is)::

    verify(p_target: Tensor[V], q_draft: Tensor[V], drafts: LongTensor[n], generator) -> LongTensor[n]

``drafts`` are ``n`` tokens the auditor drew from ``q``; ``verify`` performs one verification
step per draft (accept it, or emit its fallback) and returns the emitted tokens. Wrap any
implementation in that shape: ours (``rule_adapter``), transformers' ``_speculative_sampling``
(``transformers_adapter``), or your own callable.

A battery of ``(p, q)`` pairs mixes synthetic laws (Dirichlet at several concentrations,
truncated policies, a peaked target, drafts with zeros) with positions of real runs
(``model_pairs``: full-vocabulary ``p`` and ``q`` of a model and its draft on a real prefix).

Each pair of a battery gets a χ² test of the emitted tokens against ``p`` (or, for a declared
lossy rule, against its ``induced`` law). The p-values are adjusted with Holm's method, so the
chance that a correct implementation is flagged on any pair is at most ``level`` (1% by
default) by construction. The report states, per pair, the smallest TV the test detects with
probability ≥ 0.9 at its Bonferroni level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from diagnostics.gof import GofResult, chi_square_gof, counts_of, detectable_tv
from diagnostics.metrics import total_variation
from diagnostics.rng import sample_inverse_cdf
from diagnostics.rules.base import Rule, as_laws, coin_draws
from diagnostics.rules.specs import get_rule
from diagnostics.synthetic import dirichlet, keep_top

__all__ = ["PairResult", "RuleAudit", "Verify", "audit_rule", "battery", "holm", "model_pairs", "rule_adapter", "transformers_adapter"]

Verify = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]
DETECTION_POWER = 0.9


@dataclass
class PairResult:
    label: str
    n: int
    statistic: float
    dof: int
    p_value: float
    adjusted_p: float
    detectable_tv: float
    observed_tv: float
    impossible: int
    pooled_mass: float = 0.0


@dataclass
class RuleAudit:
    """Verdict with its evidence."""

    implementation: str
    reference: str  # "p" (lossless claim) or the declared rule's spec
    level: float
    n_per_pair: int
    verdict: str
    pairs: list[PairResult] = field(default_factory=list)
    layer: str = "rule"

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def worst(self) -> PairResult:
        return min(self.pairs, key=lambda pair: pair.adjusted_p)

    @property
    def max_detectable_tv(self) -> float:
        return max(pair.detectable_tv for pair in self.pairs)

    def as_dict(self) -> dict:
        payload = asdict(self)
        payload["max_detectable_tv"] = self.max_detectable_tv
        payload["worst_pair"] = self.worst.label
        return payload


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: ``p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j))`` in sorted order.

    Rejecting every ``p̃ < level`` keeps the family-wise false-alarm rate at most ``level``
    whatever the dependence between the tests.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda index: p_values[index])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def battery(vocab: int = 12, seed: int = 0, extra: list[tuple[str, torch.Tensor, torch.Tensor]] | None = None) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(label, p, q)`` pairs: Dirichlet at several concentrations, truncated policies, a peaked
    target, drafts with zeros; ``extra`` adds pairs taken from real runs."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for concentration in (0.2, 1.0, 5.0):
        pairs.append((f"dirichlet({concentration:g})", dirichlet(vocab, concentration, generator), dirichlet(vocab, concentration, generator)))
    p, q = dirichlet(vocab, 1.0, generator), dirichlet(vocab, 1.0, generator)
    pairs.append(("truncated target and draft", keep_top(p, vocab // 2), keep_top(q, vocab // 2 + 1)))
    peaked = torch.softmax(-1.5 * torch.randperm(vocab, generator=generator, device=generator.device).to(torch.float64), -1)
    pairs.append(("peaked target", peaked, dirichlet(vocab, 2.0, generator)))
    q_zero = dirichlet(vocab, 1.0, generator)
    p_zero = dirichlet(vocab, 1.0, generator)
    q_zero[p_zero.argmax()] = 0.0
    pairs.append(("draft with zeros (never proposes p's favourite)", p_zero, q_zero / q_zero.sum()))
    return pairs + list(extra or [])


def model_pairs(target, draft, prompt_ids: list[int], tokens: list[int], count: int = 3,
                policy=None, draft_policy=None) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``count`` real positions: ``p`` of ``target`` and ``q`` of ``draft`` (full vocabulary, after
    their policies) on the prefixes ``prompt + tokens[:t]``, one plain forward each.

    Picks the positions where the draft is farthest from the target (largest TV(p, q) below 0.9)
    and the median one: where a wrong rule shows most, and a typical position.
    """
    from diagnostics.inspection import teacher_forced_laws
    from diagnostics.policy import Policy

    policy = policy or Policy()
    p_rows = teacher_forced_laws(target, prompt_ids, tokens, policy)[:-1]
    q_rows = teacher_forced_laws(draft, prompt_ids, tokens, draft_policy or policy, target.vocab_size)[:-1]
    distance = total_variation(p_rows, q_rows)
    order = torch.argsort(distance, descending=True).tolist()
    # A position with TV(p, q) near 1 never accepts (its output is a plain draw from p): it tests
    # nothing of the accept path, so prefer the farthest positions that still overlap.
    overlapping = [index for index in order if float(distance[index]) < 0.9] or order
    chosen = overlapping[: max(0, count - 1)] + [order[len(order) // 2]]
    seen: list[int] = []
    for index in chosen:
        if index not in seen:
            seen.append(index)
    short = str(target.name).split(" (")[0]
    return [(f"{short} position {index} (TV(p, q) = {float(distance[index]):.3f})", p_rows[index], q_rows[index])
            for index in seen[:count]]


def rule_adapter(rule: Rule | str) -> Verify:
    """Our rule as an adapter: coin ``u < a(x)``, else a draw from ``f``."""
    rule = get_rule(rule)

    def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        accept = rule.accept_prob(p, q)[drafts]
        coins = coin_draws(drafts.shape, generator, p.device)
        fallback = sample_inverse_cdf(rule.fallback(p, q), coin_draws(drafts.shape, generator, p.device))
        return torch.where(coins < accept, drafts, fallback)

    return verify


CANDIDATES_PER_CALL = 16


def transformers_adapter(candidates: int = CANDIDATES_PER_CALL) -> Verify:
    """transformers' ``_speculative_sampling`` on our drafts, ``candidates`` drafts per call.

    One call verifies a block of drafts from the same ``(q, p)`` (logits ``log q`` and ``log p`` on
    every position): it returns the accepted prefix and, at the first refusal, its fallback draw.
    Each of those is one verification outcome of one draft; the drafts after a refusal are never
    looked at and go back to the pool. The drafts are i.i.d. and which are verified depends only on
    earlier outcomes, so the outcomes are i.i.d. draws of the per-draft output law, exactly as one
    call per draft gives them (a block fully accepted also draws a bonus from ``p``, which verifies
    nothing and is dropped). The function's batch axis cannot be used instead: it counts matches
    with a cumulative sum over the whole tensor, so rows of a batch would stop each other.
    """
    from transformers.generation.utils import _speculative_sampling

    def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)))
        size = min(candidates, drafts.numel()) or 1
        candidate_logits = torch.log(q.float()).reshape(1, 1, -1).expand(1, size, -1)
        new_logits = torch.log(p.float()).reshape(1, 1, -1).expand(1, size + 1, -1)  # every candidate and the bonus position
        emitted = torch.empty_like(drafts)
        done, total = 0, drafts.numel()
        while done < total:
            block = drafts[done : done + size]
            count = block.numel()
            tokens, matches = _speculative_sampling(block.reshape(1, -1), candidate_logits[:, :count], count,
                                                    new_logits[:, : count + 1])
            outcomes = tokens[0, : min(int(matches) + 1, count)]  # the accepted drafts, then the refused one's fallback
            emitted[done : done + outcomes.numel()] = outcomes
            done += outcomes.numel()
        return emitted

    return verify


def _tested_cells(law: torch.Tensor, n: int, min_expected: float = 5.0) -> tuple[int, float]:
    """Degrees of freedom and pooled mass of the χ² test of ``n`` draws against ``law`` (as in
    ``chi_square_gof``), from the law alone, so the bound is the same whether or not the
    implementation emitted an impossible token."""
    support = law > 0
    small = support & (law * n < min_expected)
    cells = int((support & ~small).sum()) + int(bool(small.any()))
    return max(1, cells - 1), float(law[small].sum())


def _pooled_tv(counts: torch.Tensor, law: torch.Tensor, min_expected: float = 5.0) -> float:
    """TV between the observed and the exact law on the cells the χ² test used (rare tokens pooled),
    so that on a large vocabulary it is not dominated by the sampling noise of unseen tokens."""
    n = float(counts.sum())
    rare = law * n < min_expected
    observed = torch.cat([counts[~rare] / n, (counts[rare].sum() / n).reshape(1)])
    expected = torch.cat([law[~rare], law[rare].sum().reshape(1)])
    return float(total_variation(observed, expected))


def audit_rule(
    verify: Verify,
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]],
    n: int = 60_000,
    level: float = 0.01,
    declared: str | Rule | None = None,
    seed: int = 0,
    implementation: str = "callable",
) -> RuleAudit:
    """Test ``verify``'s output law on every pair against ``p`` (or the declared rule's induced law).

    Verdict ``pass`` when no Holm-adjusted p-value falls below ``level``; the family-wise false
    alarm rate of a correct implementation is then at most ``level``.
    """
    generator = torch.Generator().manual_seed(seed)
    reference_rule = get_rule(declared) if declared is not None else None
    raw = []
    for label, p, q in pairs:
        p_target, q_draft = as_laws(p, q)
        law = reference_rule.induced(p_target, q_draft) if reference_rule else p_target
        drafts = sample_inverse_cdf(q_draft, coin_draws((n,), generator, q_draft.device))
        emitted = torch.as_tensor(verify(p_target, q_draft, drafts, generator), device=q_draft.device).reshape(-1).to(torch.long)
        vocab = p_target.numel()
        # An id outside the vocabulary (a padded head, a bad offset) is impossible under any law on it.
        outside = int(((emitted < 0) | (emitted >= vocab)).sum())
        counts = counts_of(emitted[(emitted >= 0) & (emitted < vocab)], vocab)
        result = chi_square_gof(counts, law)
        if outside:
            result = GofResult(math.inf, 0, 0.0, result.n + outside, result.impossible + outside, result.pooled_mass)
        observed_tv = _pooled_tv(counts, law)
        raw.append((label, result, observed_tv, law))
    m = len(raw)
    adjusted = holm([result.p_value for _, result, _, _ in raw])
    results = []
    for index, (label, result, observed_tv, law) in enumerate(raw):
        # Tokens too rare to test one by one are pooled into one cell; an error that only moves
        # mass inside that cell is invisible, so its mass is added to the detectable TV.
        dof, pooled_mass = _tested_cells(law, n)
        detectable = min(1.0, detectable_tv(n, dof, level / m, DETECTION_POWER) + pooled_mass)
        results.append(PairResult(label=label, n=n, statistic=result.statistic, dof=result.dof, p_value=result.p_value,
                                  adjusted_p=adjusted[index], detectable_tv=detectable, pooled_mass=pooled_mass,
                                  observed_tv=observed_tv, impossible=result.impossible))
    verdict = "fail" if any(pair.adjusted_p < level for pair in results) else "pass"
    return RuleAudit(implementation=implementation, reference=reference_rule.spec if reference_rule else "p (lossless)",
                     level=level, n_per_pair=n, verdict=verdict, pairs=results)


