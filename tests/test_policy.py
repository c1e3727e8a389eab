"""The policy matches transformers' logits warpers token for token, ties included."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from diagnostics.policy import Policy, PolicyError, probabilities, warp_logits


def _logits(seed: int, rows: int = 64, vocab: int = 50, tied: bool = False) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 3
    if tied:  # coarse grid: many exact ties, including at the top-k and top-p boundaries
        logits = torch.round(logits)
    return logits


def _transformers(policy: Policy) -> LogitsProcessorList:
    processors = LogitsProcessorList()
    if policy.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(float(policy.temperature)))
    if policy.top_k is not None:
        processors.append(TopKLogitsWarper(top_k=policy.top_k))
    if policy.top_p is not None and policy.top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=policy.top_p))
    if policy.min_p is not None:
        processors.append(MinPLogitsWarper(min_p=policy.min_p))
    if policy.eta is not None:
        processors.append(EtaLogitsWarper(epsilon=policy.eta))
    return processors


POLICIES = [
    Policy(temperature=0.7),
    Policy(top_k=5),
    Policy(top_k=1),
    Policy(top_p=0.9),
    Policy(top_p=0.3),
    Policy(min_p=0.1),
    Policy(eta=0.02),
    Policy(eta=0.3),
    Policy(temperature=1.3, top_k=20, top_p=0.8, min_p=0.05, eta=0.01),
    Policy(temperature=0.5, top_p=0.95, eta=0.1),
]


@pytest.mark.parametrize("policy", POLICIES, ids=str)
@pytest.mark.parametrize("tied", [False, True])
def test_same_tokens_survive_as_in_transformers(policy: Policy, tied: bool) -> None:
    for seed in range(5):
        logits = _logits(seed, tied=tied)
        theirs = _transformers(policy)(torch.zeros(64, 1, dtype=torch.long), logits.clone())
        ours = warp_logits(logits, policy)
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
        assert torch.allclose(probabilities(logits, policy), torch.softmax(theirs.double(), -1), atol=1e-12)


def test_top_k_keeps_every_tie_at_the_boundary() -> None:
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]])
    kept = ~torch.isinf(warp_logits(logits, Policy(top_k=2)))
    assert kept.tolist() == [[True, True, True, True, False]]


def test_greedy_is_a_point_mass_on_the_first_argmax() -> None:
    logits = torch.tensor([[1.0, 5.0, 5.0, 0.0]])
    p = probabilities(logits, Policy(temperature=0, top_k=3))
    assert p.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_probabilities_sum_to_one_in_float64() -> None:
    p = probabilities(_logits(3, vocab=49152), Policy(top_p=0.9))
    assert p.dtype == torch.float64
    assert torch.allclose(p.sum(-1), torch.ones(64, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"eta": 1.0}, "eta"),
        ({"medusa_eps": 0.09}, "both medusa_eps and medusa_delta"),
        ({"medusa_eps": 0.09, "medusa_delta": 0.0}, "medusa_delta must lie in"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict, fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        Policy(**kwargs)


def test_the_medusa_gate_policy_is_the_medusa_rules_baseline_law() -> None:
    """Lossless under the Medusa gate (the matched baseline of ``medusa:ε,δ``) samples exactly the
    law the rule's TV(P, baseline) is measured against: ``p`` truncated to ``A ∪ {argmax}``,
    including rows where ``A`` is empty (a flat ``p``: only the argmax is left)."""
    from diagnostics.rules import get_rule

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50, generator=generator) * torch.tensor([3.0, 1.0, 0.3, 0.01, 2.0, 5.0])[:, None]
    for eps, delta in ((0.09, 0.3), (0.3, 0.09), (1.0, 1.0)):
        for base in (Policy(), Policy(temperature=0.7, top_k=20)):
            gated = probabilities(logits, Policy(**{**base.as_dict(), "medusa_eps": eps, "medusa_delta": delta}))
            expected = get_rule(f"medusa:{eps},{delta}").baseline(probabilities(logits, base))
            # Same support exactly; the values to rounding (the rule renormalises its input first).
            assert torch.equal(gated > 0, expected > 0)
            assert torch.allclose(gated, expected, rtol=0, atol=1e-15)
            assert torch.allclose(gated.sum(-1), torch.ones(6, dtype=torch.float64))
    flat = probabilities(torch.zeros(1, 50), Policy(medusa_eps=1.0, medusa_delta=1.0))  # e^{−H'} = 1/50 + 1e-5 > p
    assert int((flat > 0).sum()) == 1  # the gate is empty for a flat p; the top token is kept


def test_a_stored_policy_reads_as_words() -> None:
    """Reports and Inspect show a policy as words, not JSON with nulls."""
    import json

    from diagnostics.policy import Policy, policy_words

    assert policy_words(json.dumps(Policy(temperature=1.0).as_dict())) == "temperature 1, no truncation"
    assert policy_words(json.dumps(Policy(temperature=0.7, top_k=20).as_dict())) == "temperature 0.7 · top-k 20"
    assert "null" not in policy_words(json.dumps(Policy(top_p=0.9).as_dict()))
    assert policy_words(None) == "–" and policy_words("[1]") == "unreadable" and policy_words("{") == "unreadable"
    assert policy_words("[" * 100_000) == "unreadable"  # bounded parse of a shared file's text
