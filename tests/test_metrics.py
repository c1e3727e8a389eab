"""Metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from diagnostics.metrics import (
    acceptance_probability,
    acceptance_rate,
    block_efficiency,
    ceiling_excess,
    entropy,
    expected_block_efficiency,
    kl_divergence,
    overshoot_mass,
    severe_overshoot_mass,
    total_variation,
)
from diagnostics.rules import get_rule


def test_distances_on_the_toy_pair(toy_pair) -> None:
    p, q = toy_pair
    assert total_variation(p, q).item() == pytest.approx(0.6)
    assert overshoot_mass(p, q).item() == pytest.approx(0.6)
    assert kl_divergence(p, p).item() == pytest.approx(0.0)
    expected_kl = sum(a * math.log(a / b) for a, b in zip(p.tolist(), q.tolist()))
    assert kl_divergence(p, q).item() == pytest.approx(expected_kl)
    assert entropy(torch.tensor([0.5, 0.5, 0.0])).item() == pytest.approx(math.log(2))


def test_kl_is_infinite_off_support() -> None:
    assert kl_divergence(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])).item() == math.inf


def test_overshoot_regions(toy_pair) -> None:
    p, q = toy_pair
    # q ≥ p/0.5 = [.1, .3, .5, 1.1] only at token 0 (0.55 ≥ 0.1).
    assert severe_overshoot_mass(p, q, 0.5).item() == pytest.approx(0.55)
    assert ceiling_excess(p, q, 0.5).item() == pytest.approx(0.45)
    assert 1 - get_rule("lenience:0.5").acceptance(p, q).item() == pytest.approx(0.45)


def test_acceptance_and_block_efficiency(toy_pair) -> None:
    p, q = toy_pair
    accept = get_rule("lossless").accept_prob(p, q)
    alpha = acceptance_probability(q, accept).item()
    assert alpha == pytest.approx(1 - 0.6)
    for gamma in (1, 4):
        assert expected_block_efficiency(alpha, gamma).item() == pytest.approx((1 - alpha ** (gamma + 1)) / (1 - alpha))
        assert expected_block_efficiency(1.0, gamma).item() == gamma + 1
    assert expected_block_efficiency(0.0, 3).item() == 1.0
    assert acceptance_rate(3, 4) == 0.75 and math.isnan(acceptance_rate(0, 0))
    assert block_efficiency(10, 4) == 2.5


def test_log_likelihood() -> None:
    from diagnostics.metrics import log_likelihood

    assert log_likelihood([0.5, 0.25]) == pytest.approx(math.log(0.125))
    assert log_likelihood([1.0, 0.0]) == pytest.approx(math.log(1e-300))
    assert math.isnan(log_likelihood([]))
