"""Goodness-of-fit of sampled tokens against an exact law, with its power stated up front.

Pearson's statistic ``X² = Σ (O − nP)² / (nP)`` over the support of ``P``. Under an
alternative ``P'`` it is approximately noncentral χ² with ``λ = n Σ (P' − P)²/P``, and by
Cauchy–Schwarz ``Σ (P' − P)²/P ≥ (Σ |P' − P|)² = 4·TV(P', P)²``. So ``λ ≥ 4nε²`` for every
alternative at total variation ``ε``, whatever its shape: sizing ``n`` on ``4nε²`` gives a
power that holds for the least detectable alternative.

Cells whose expected count is below ``min_expected`` are pooled into one cell so the χ²
approximation holds; a token with ``P = 0`` that is observed makes the p-value exactly 0.
Pooling can hide an error that stays inside the pooled cell, so the pooled mass is reported
and subtracted from the detectable TV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from scipy import stats


@dataclass(frozen=True)
class GofResult:
    """Outcome of one test: statistic, degrees of freedom, p-value and what the test could see."""

    statistic: float
    dof: int
    p_value: float
    n: int
    impossible: int
    pooled_mass: float

    def rejects(self, level: float) -> bool:
        return self.p_value < level


def counts_of(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Histogram of token ids over ``vocab`` bins."""
    return torch.bincount(tokens.reshape(-1).to(torch.long), minlength=vocab).to(torch.float64)


def chi_square_gof(counts: torch.Tensor, law: torch.Tensor, min_expected: float = 5.0) -> GofResult:
    """Pearson χ² test of observed ``counts[V]`` against the exact law ``law[V]``."""
    counts = counts.to(torch.float64).reshape(-1)
    law = law.to(torch.float64).reshape(-1)
    law = law / law.sum()
    n = int(counts.sum().item())
    impossible = int(counts[law <= 0].sum().item())
    if impossible:
        return GofResult(math.inf, 0, 0.0, n, impossible, 0.0)
    expected = law * n
    support = law > 0
    small = support & (expected < min_expected)
    big = support & ~small
    observed_cells = [counts[big]]
    expected_cells = [expected[big]]
    pooled_mass = float(law[small].sum().item())
    if small.any():
        observed_cells.append(counts[small].sum().reshape(1))
        expected_cells.append(expected[small].sum().reshape(1))
    observed = torch.cat(observed_cells)
    wanted = torch.cat(expected_cells)
    dof = observed.numel() - 1
    if dof < 1:
        return GofResult(0.0, 0, 1.0, n, 0, pooled_mass)
    statistic = float(((observed - wanted) ** 2 / wanted).sum().item())
    return GofResult(statistic, dof, float(stats.chi2.sf(statistic, dof)), n, 0, pooled_mass)


def gof_tokens(tokens: torch.Tensor, law: torch.Tensor, min_expected: float = 5.0) -> GofResult:
    """χ² test of sampled token ids against ``law[V]``."""
    return chi_square_gof(counts_of(tokens, law.shape[-1]), law, min_expected)


def power(n: int, tv: float, dof: int, level: float) -> float:
    """Lower bound on the power against any alternative at ``TV = tv``: ``P(χ²'(dof, 4n·tv²) > crit)``."""
    critical = stats.chi2.isf(level, dof)
    return float(stats.ncx2.sf(critical, dof, 4.0 * n * tv * tv))


def required_samples(tv: float, dof: int, level: float = 1e-3, target_power: float = 0.99) -> int:
    """Smallest ``n`` with ``power(n, tv, dof, level) ≥ target_power`` (bisection on ``n``)."""
    low, high = 1, 16
    while power(high, tv, dof, level) < target_power:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if power(middle, tv, dof, level) >= target_power:
            high = middle
        else:
            low = middle
    return high


def detectable_tv(n: int, dof: int, level: float = 1e-3, target_power: float = 0.99) -> float:
    """Smallest TV that ``n`` samples detect with ``target_power`` at ``level`` (bisection on TV)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if power(n, middle, dof, level) >= target_power:
            high = middle
        else:
            low = middle
    return high
