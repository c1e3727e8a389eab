"""``request.matched_baseline``: a truncation rule's baseline run is lossless under the rule's gate folded
into the user's target policy, exactly, or refused in one line where no single policy can express it.
Everyday tier: pure tensor maths on random logits, well under a second."""

from __future__ import annotations

import pytest
import torch

from diagnostics.engine import EngineError
from diagnostics.policy import Policy, probabilities
from diagnostics.request import RunRequest, matched_baseline
from diagnostics.rules import get_rule

LOGITS = torch.randn(64, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3


def _request(rule: str, policy: Policy) -> RunRequest:
    return RunRequest(prompt="x", rule=rule, policy=policy)


@pytest.mark.parametrize("rule, policy", [
    ("cascade:0.1", Policy(min_p=0.3)),  # the user's stricter min-p must survive (it was overwritten by 0.1)
    ("cascade:0.3", Policy(min_p=0.1, top_k=20)),
    ("cascade:0.2", Policy(temperature=0.7, top_p=0.9)),
    ("typical:0.1", Policy(min_p=0.05, top_k=30)),
    ("medusa:0.09,0.3", Policy(top_p=0.95)),
])
def test_the_baseline_policy_is_the_rules_gate_after_the_users_policy(rule: str, policy: Policy) -> None:
    """The baseline run's law is the rule's per-position baseline of the lossy run's law, to 1e-12."""
    baseline = matched_baseline(_request(rule, policy))
    assert baseline is not None and baseline.rule == "lossless" and baseline.draft_policy == policy
    p_user = probabilities(LOGITS, policy)
    expected = get_rule(rule).baseline(p_user)
    assert torch.allclose(probabilities(LOGITS, baseline.policy), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("rule, policy, why", [
    ("typical:0.1", Policy(eta=0.2), "already sets eta 0.2"),
    ("cascade:0.2", Policy(eta=0.2), "after the policy's eta"),
    ("medusa:0.09,0.3", Policy(medusa_eps=0.1, medusa_delta=0.2), "already sets a Medusa gate"),
])
def test_a_mix_no_single_policy_expresses_is_refused_in_one_line(rule: str, policy: Policy, why: str) -> None:
    with pytest.raises(EngineError) as raised:
        matched_baseline(_request(rule, policy))
    message = str(raised.value)
    assert why in message and "drop that truncation" in message and "\n" not in message


def test_rules_whose_baseline_is_the_lossless_run_have_no_baseline_run() -> None:
    for rule in ("lossless", "lenience:0.5", "cos:0.4", "mentored:0.5,2"):
        assert matched_baseline(_request(rule, Policy(min_p=0.2))) is None
