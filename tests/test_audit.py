"""Rule-level audit: correct implementations pass, every planted bug is caught, the power claim holds."""

from __future__ import annotations

import pytest
import torch

from diagnostics.audit import RULE_MUTANTS, audit_rule, battery, rule_adapter, transformers_adapter
from diagnostics.rules import get_rule, normalise_or

N = 60_000


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_our_lossless_rule_passes(seed: int) -> None:
    audit = audit_rule(rule_adapter("lossless"), battery(seed=seed), n=N, seed=seed, implementation="ours")
    assert audit.passed, audit.worst
    assert audit.max_detectable_tv < 0.03 and all(pair.impossible == 0 for pair in audit.pairs)


@pytest.mark.parametrize("spec", ["lenience:0.5", "typical:0.1", "cascade:0.5"])
def test_declared_lossy_rules_match_their_law_and_fail_losslessness(spec: str) -> None:
    pairs = battery(seed=4)
    assert audit_rule(rule_adapter(spec), pairs, n=N, declared=spec, seed=4).passed
    assert not audit_rule(rule_adapter(spec), pairs, n=N, seed=4).passed


@pytest.mark.parametrize("seed", [0, 1])
def test_transformers_speculative_sampling_passes_at_rule_level(seed: int) -> None:
    """transformers' `_speculative_sampling` given the true q: the step itself is lossless."""
    audit = audit_rule(transformers_adapter(), battery(seed=seed)[:3], n=20_000, seed=seed, implementation="transformers")
    assert audit.passed, audit.worst


@pytest.mark.parametrize("name", list(RULE_MUTANTS))
def test_every_rule_level_mutant_is_caught(name: str) -> None:
    _, mutant = RULE_MUTANTS[name]
    audit = audit_rule(mutant, battery(seed=7), n=N, seed=7, implementation=name)
    assert not audit.passed, (name, audit.worst)


def _off_by(tv: float):
    """A step whose output law is p moved by exactly ``tv`` toward the draft: P = p + tv·(q' − p)/TV(q', p)."""
    def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        other = normalise_or(torch.ones_like(p) * (p > 0), p)  # uniform on p's support
        distance = 0.5 * (other - p).abs().sum()
        law = p + (tv / distance) * (other - p)
        return torch.multinomial(law, drafts.numel(), replacement=True, generator=generator)

    return verify


def test_power_claim_tv_two_percent_is_caught() -> None:
    """At the documented sample size (60,000 per pair, 6 pairs, level 1%), a TV error of 0.02 is caught."""
    for seed in range(3):
        audit = audit_rule(_off_by(0.02), battery(seed=seed), n=N, seed=seed)
        assert not audit.passed
    # The documented guarantee: every pair detects TV 0.012 with probability ≥ 0.9 at its Bonferroni level.
    assert audit.max_detectable_tv <= 0.0125


def test_audit_command_prints_a_verdict(capsys) -> None:
    import json

    from diagnostics.cli import main

    assert main(["audit", "--samples", "20000"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert ours["verdict"] == "pass" and ours["reference"] == "p (lossless)" and len(ours["pairs"]) == 6
    assert main(["audit", "--implementation", "residual_softmax", "--samples", "20000"]) == 0
    planted = json.loads(capsys.readouterr().out)
    assert planted["verdict"] == "fail" and planted["pairs"][0]["adjusted_p"] <= 1.0
