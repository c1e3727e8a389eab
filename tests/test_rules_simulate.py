"""``simulate`` (the real mechanism) against ``induced`` by a χ² test sized to catch TV = 0.01.

Every test runs at level ``LEVEL`` with ``N`` samples chosen by ``required_samples`` so that
any alternative at total variation 0.01 is rejected with probability ≥ 0.99. The negative
controls at the end show that power on planted bugs and on worst-case perturbations.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from conftest import dirichlet, truncate_top

from diagnostics.gof import detectable_tv, gof_tokens, power, required_samples
from diagnostics.metrics import total_variation
from diagnostics.rules import (
    EXAMPLE_SPECS,
    Lenience,
    Lossless,
    SampledMultiDraft,
    get_rule,
    get_tree_rule,
    induced_by_mechanism,
    normalise_or,
)

VOCAB = 8
LEVEL = 1e-4
TV_TO_CATCH = 0.01
N = required_samples(TV_TO_CATCH, dof=VOCAB - 1, level=LEVEL, target_power=0.99)


def _pairs(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    p_sharp, q_flat = dirichlet(VOCAB, 0.3, generator), dirichlet(VOCAB, 3.0, generator)
    p_flat, q_sharp = dirichlet(VOCAB, 3.0, generator), dirichlet(VOCAB, 0.3, generator)
    p_cut = truncate_top(dirichlet(VOCAB, 1.0, generator), 4)
    q_cut = truncate_top(dirichlet(VOCAB, 1.0, generator), 3)
    return [(p_sharp, q_flat), (p_flat, q_sharp), (p_cut, q_cut), (p_flat, p_flat.clone())]


def _check(tokens: torch.Tensor, law: torch.Tensor, label: str) -> None:
    result = gof_tokens(tokens, law)
    assert result.impossible == 0, f"{label}: emitted a token the law forbids"
    assert result.pooled_mass < 1e-3, f"{label}: pooled mass {result.pooled_mass} blunts the test"
    assert result.p_value >= LEVEL, f"{label}: X²={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"


def test_sample_size_has_the_claimed_power() -> None:
    assert power(N, TV_TO_CATCH, VOCAB - 1, LEVEL) >= 0.99
    assert detectable_tv(N, VOCAB - 1, LEVEL) <= TV_TO_CATCH


@pytest.mark.parametrize("spec", EXAMPLE_SPECS + ("lenience:0.1", "cascade:0.2"))
def test_simulate_matches_induced(spec: str) -> None:
    rule = get_rule(spec)
    for index, (p, q) in enumerate(_pairs(seed=21)):
        generator = torch.Generator().manual_seed(1000 + index)
        tokens = rule.simulate(p, q, N, generator)
        _check(tokens, rule.induced(p, q), f"{spec} pair {index}")


def test_lossless_simulate_matches_p_in_a_batch() -> None:
    pairs = _pairs(seed=22)
    p = torch.stack([pair[0] for pair in pairs])
    q = torch.stack([pair[1] for pair in pairs])
    tokens = get_rule("lossless").simulate(p, q, N, torch.Generator().manual_seed(3))
    assert tokens.shape == (len(pairs), N)
    for row in range(len(pairs)):
        _check(tokens[row], p[row], f"lossless row {row}")


@pytest.mark.parametrize("spec", ["lossless", "lenience:0.5", "cascade:0.3", "typical:0.1"])
def test_tree_simulate_matches_tree_law(spec: str) -> None:
    tree = get_tree_rule(spec)
    for index, (p, q) in enumerate(_pairs(seed=23)):
        candidates = torch.sort(-q, stable=True).indices[:3]
        tokens = tree.simulate(p, candidates, N, torch.Generator().manual_seed(2000 + index))
        _check(tokens, tree.induced(p, candidates), f"tree {spec} pair {index}")


@pytest.mark.parametrize("k", [1, 3])
def test_multi_draft_simulate_is_lossless(k: int) -> None:
    rule = SampledMultiDraft(k)
    for index, (p, q) in enumerate(_pairs(seed=24)):
        tokens = rule.simulate(p, q, N, torch.Generator().manual_seed(3000 + index))
        _check(tokens, p, f"multidraft k={k} pair {index}")


# ------------------------------------------------------------------------------------------
# Negative controls: planted bugs and worst-case perturbations must fail the same test.
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxResidual(Lossless):
    """Planted bug: residual by ``softmax(p − q)`` instead of ``norm((p − q)+)``."""

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return torch.softmax(p - q, dim=-1)


@dataclass(frozen=True)
class UnclippedResidual(Lossless):
    """Planted bug: residual ``norm(|p − q|)`` (absolute value instead of positive part)."""

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return normalise_or((p - q).abs(), p)


def _rejects(tokens: torch.Tensor, law: torch.Tensor) -> bool:
    return gof_tokens(tokens, law).p_value < LEVEL


@pytest.mark.parametrize("bug", [SoftmaxResidual(), UnclippedResidual()])
def test_planted_residual_bugs_fail(bug: Lossless) -> None:
    p = torch.tensor([0.05, 0.15, 0.25, 0.55, 0, 0, 0, 0], dtype=torch.float64)
    q = torch.tensor([0.55, 0.25, 0.15, 0.05, 0, 0, 0, 0], dtype=torch.float64)
    tokens = bug.simulate(p, q, N, torch.Generator().manual_seed(4))
    assert _rejects(tokens, p)


def _worst_case_shift(law: torch.Tensor, tv: float) -> torch.Tensor:
    """An alternative at exactly ``TV = tv`` spread in proportion to ``law`` (the hardest shape)."""
    order = torch.argsort(law, descending=True)
    half = order[: len(order) // 2]
    up = torch.zeros_like(law)
    up[half] = law[half]
    down = law - up
    shifted = law + tv * up / up.sum() - tv * down / down.sum()
    assert abs(total_variation(shifted, law).item() - tv) < 1e-12 and (shifted >= 0).all()
    return shifted


@pytest.mark.parametrize("seed", range(6))
def test_tv_of_one_percent_is_caught(seed: int) -> None:
    """Sampling from a law 0.01 away in TV (the least favourable shape) fails the test."""
    generator = torch.Generator().manual_seed(50 + seed)
    law = dirichlet(VOCAB, 2.0, generator)
    shifted = _worst_case_shift(law, TV_TO_CATCH)
    tokens = torch.multinomial(shifted, N, replacement=True, generator=generator)
    assert _rejects(tokens, law)


def test_biased_rule_tv_is_measured() -> None:
    """The softmax-residual bug moves the toy pair's law by a TV far above what the test sees."""
    p = torch.tensor([0.05, 0.15, 0.25, 0.55], dtype=torch.float64)
    q = torch.tensor([0.55, 0.25, 0.15, 0.05], dtype=torch.float64)
    law = induced_by_mechanism(SoftmaxResidual(), p, q)
    assert total_variation(law, p).item() > 0.05


@dataclass(frozen=True)
class ScaledResidualLenience(Lenience):
    """Planted bug: lenience's residual from the scaled draft, ``norm((p − l·q)+)``."""

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return normalise_or((p - self.l * q).clamp(min=0.0), p)


def test_planted_lossy_bug_fails_against_the_closed_form(toy_pair) -> None:
    p, q = toy_pair
    bug, right = ScaledResidualLenience(l=0.5), get_rule("lenience:0.5")
    assert total_variation(induced_by_mechanism(bug, p, q), right.induced(p, q)).item() > TV_TO_CATCH
    tokens = bug.simulate(p, q, N, torch.Generator().manual_seed(6))
    assert _rejects(tokens, right.induced(p, q))
