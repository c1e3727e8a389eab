"""The audit on the embedded SmolLM2-135M model: transformers' assisted generation, our engine, a planted
bug, and the rule level on real positions. Verdicts asserted; the evidence is in the closing note."""

from __future__ import annotations

import pytest

from diagnostics.audit import RULE_MUTANTS, audit_rule, rule_adapter, transformers_adapter
from diagnostics.audit.suite import model_setup, real_positions, run_engine_audit

# Slow tier: audits on the embedded SmolLM2-135M model (transformers' assisted generation one sequence at a time)
pytestmark = pytest.mark.slow

GENERATIONS = 48  # × 16 tokens ≈ 760 tokens, about 90 s each on 2 CPU cores


@pytest.fixture(scope="module")
def embedded():
    return model_setup("default")


def test_transformers_assisted_generation_on_the_embedded_model(embedded) -> None:
    """transformers 5.23 `generate(assistant_model=early-exit:26, do_sample=True)`: consistent with lossless."""
    result = run_engine_audit("transformers", embedded, generations=GENERATIONS, max_new_tokens=16)
    assert result.errors == 0 and result.impossible == 0 and result.tokens >= 600, result.reasons
    assert result.verdict == "pass", result.as_dict()
    assert result.detectable_tv < 0.15


def test_our_engine_on_the_embedded_model(embedded) -> None:
    result = run_engine_audit("ours", embedded, generations=GENERATIONS, max_new_tokens=16)
    assert result.verdict == "pass" and result.tokens >= 600, result.as_dict()


def test_a_planted_engine_bug_on_the_embedded_model_is_caught(embedded) -> None:
    result = run_engine_audit("rollback_off_by_one", embedded, generations=12, max_new_tokens=16)
    assert result.verdict == "fail" and result.p_value < 1e-6, result.as_dict()


def test_rule_level_on_real_positions_of_the_embedded_model(embedded) -> None:
    """Full-vocabulary p and q (49,152 tokens) of the embedded model and its early-exit draft."""
    pairs = real_positions(embedded, 2)
    assert all(pair[1].numel() == 49_152 for pair in pairs)
    ours = audit_rule(rule_adapter("lossless"), pairs, n=60_000, implementation="ours")
    assert ours.passed, ours.as_dict()
    assert max(pair.detectable_tv for pair in ours.pairs) < 0.1  # rare tokens pooled: their mass is added
    theirs = audit_rule(transformers_adapter(), pairs, n=4_000, implementation="transformers")
    assert theirs.passed, theirs.as_dict()
    planted = audit_rule(RULE_MUTANTS["residual_softmax"][1], pairs, n=60_000)
    assert not planted.passed
