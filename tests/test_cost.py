"""The draft/target cost ratio c (issue 45, rough edge 8): the analytic c, the measurement's spread,
and the flag on an implausible measured c. Everyday tier, about 3 s: tiny models, planted timings."""

from __future__ import annotations

import pytest

import diagnostics.cost as cost
from diagnostics.cost import (
    AnalyticCost,
    CostMeasurement,
    analytic_cost_ratio,
    cost_flag,
    measure_cost,
    non_embedding_parameters,
    pair_analytic_cost,
)
from diagnostics.evaluation.settings import checked_cost, cost_option, resolve_cost, stored_cost_flag
from diagnostics.models import early_exit_model
from diagnostics.tiny import tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, layers=3)


def test_the_analytic_cost_ratio_of_each_drafter_kind(target) -> None:
    """early-exit:L → L/N on a tiny 3-layer model; a draft model → the ratio of non-embedding
    parameters (the 1-layer Llama's over the 3-layer one's, embeddings and head left out);
    an n-gram → 0; unknown counts → None."""
    assert pair_analytic_cost("early-exit:2", target) == AnalyticCost(2 / 3, "L/N: 2 of the target's 3 layers")
    assert pair_analytic_cost("early-exit:26", target_layers=30).ratio == pytest.approx(26 / 30)
    assert pair_analytic_cost("ngram:3").ratio == 0.0 and analytic_cost_ratio("ngram") == 0.0
    draft = tiny_llama(1, layers=1)
    analytic = pair_analytic_cost("model:tiny", target, draft)
    layer = sum(p.numel() for p in target.model.model.layers[0].parameters())
    norm = sum(p.numel() for p in target.model.model.norm.parameters())  # the final norm counts too
    assert analytic.ratio == pytest.approx((layer + norm) / (3 * layer + norm)) and analytic.basis.startswith("non-embedding parameters: ")
    embedding = target.model.get_input_embeddings().weight.numel() + target.model.get_output_embeddings().weight.numel()
    assert non_embedding_parameters(target.model) == sum(p.numel() for p in target.model.parameters()) - embedding
    assert analytic_cost_ratio("medusa", draft_params=10, target_params=1000) == 0.01
    assert pair_analytic_cost("model:tiny", target) is None and pair_analytic_cost("early-exit:2") is None
    assert pair_analytic_cost("nonsense") is None


def _planted(monkeypatch, target, draft_seconds) -> None:
    """Every timed step of the target takes 1 s; the draft's, ``draft_seconds(call)`` s."""
    calls = []

    def seconds(self, steps: int) -> float:
        if self.loaded is target:
            return 1.0
        calls.append(steps)
        return draft_seconds(len(calls))

    monkeypatch.setattr(cost._Stepper, "seconds", seconds)


def test_a_planted_slow_draft_measurement_is_flagged_and_a_sane_one_is_not(target, monkeypatch) -> None:
    """The issue's case on a tiny model: an early exit measured slower than its target (c = 1.7,
    impossible) is flagged with what to do; so is one far below L/N, and one whose repeats spread
    widely; a measurement near L/N with agreeing repeats is not (negative control)."""
    draft = early_exit_model(target, 2)
    analytic = pair_analytic_cost("early-exit:2", target)

    _planted(monkeypatch, target, lambda call: 1.7)  # call 1 is the warm-up
    slow = measure_cost(target, draft, [1, 2, 3])
    assert slow.ratio == pytest.approx(1.7) and len(slow.ratios) == cost.COST_REPEATS and slow.spread == 0
    flag = cost_flag("early-exit", slow.ratio, analytic, slow.spread)
    assert flag.startswith("c = 1.7 is impossible for an early exit") and "take the analytic c = 0.667" in flag

    _planted(monkeypatch, target, lambda call: 0.2)
    flag = cost_flag("early-exit", measure_cost(target, draft, [1, 2, 3]).ratio, analytic)
    assert "0.3× the layer ratio 0.667" in flag and "measure again when it is idle" in flag

    _planted(monkeypatch, target, lambda call: (0.4, 0.9)[call % 2])  # a busy machine: the repeats disagree
    noisy = measure_cost(target, draft, [1, 2, 3])
    assert noisy.spread > cost.FLAG_SPREAD and "relative IQR" in cost_flag("early-exit", noisy.ratio, analytic, noisy.spread)

    _planted(monkeypatch, target, lambda call: 0.7 + 0.01 * (call % 2))  # sane: near L/N, repeats agree
    sane = measure_cost(target, draft, [1, 2, 3])
    assert sane.ratio == pytest.approx(0.7, abs=0.011) and sane.spread < cost.FLAG_SPREAD
    assert cost_flag("early-exit", sane.ratio, analytic, sane.spread) is None


def test_the_flag_rule_at_its_edges() -> None:
    """The factor 1.5 either way, with a floor of 0.1 (a very short exit's shared head is real); a
    draft model is flagged only at c ≥ 1 (its analytic c is a lower bound); an n-gram never."""
    exit26 = AnalyticCost(26 / 30, "L/N: 26 of the target's 30 layers")
    assert cost_flag("early-exit", 1.099, exit26).startswith("c = 1.1 is impossible")
    assert cost_flag("early-exit", 0.95, exit26) is None and cost_flag("early-exit", 0.75, exit26) is None
    exit1 = AnalyticCost(1 / 30, "L/N: 1 of the target's 30 layers")
    assert cost_flag("early-exit", 0.1, exit1) is None and "× the layer ratio" in cost_flag("early-exit", 0.2, exit1)
    small = AnalyticCost(0.01, "non-embedding parameters: 68M over the target's 6.5e+03M non-embedding")
    assert cost_flag("model", 0.15, small) is None  # launch-bound on a GPU: real, not flagged
    assert "as slow as the target's" in cost_flag("model", 1.2, small)
    assert cost_flag("ngram", 0.0, AnalyticCost(0.0, "an n-gram lookup runs no forward")) is None
    assert CostMeasurement(0.5, (0.5,)).spread == 0 and CostMeasurement(0.0, (0.0, 0.0)).spread == 0


def test_a_sweep_stored_with_the_issues_c_is_flagged_and_takes_the_analytic_one() -> None:
    """Settings as a sweep stores them: c = 1.7274 measured for early-exit:26 of the embedded
    30-layer target is flagged; ``--cost analytic`` resolves to 26/30; a c the user gave is not
    flagged; an analytic c that needs the models loaded is refused in one line."""
    settings = {"request": {"draft": "early-exit:26"}, "target": "default", "cost": {"ratio": 1.7274, "source": "measured"}}
    assert stored_cost_flag(settings).startswith("c = 1.73 is impossible for an early exit")
    assert resolve_cost(settings, cost_option("Analytic")) == (0.8667, "analytic (--cost analytic): L/N: 26 of the target's 30 layers")
    assert stored_cost_flag({**settings, "cost": {"ratio": 0.88, "source": "measured"}}) is None
    assert stored_cost_flag({**settings, "cost": {"ratio": 1.7274, "source": "given"}}) is None
    assert checked_cost("analytic") == "analytic" and cost_option("0.25") == 0.25
    with pytest.raises(ValueError, match="no analytic c known without loading"):
        resolve_cost({"request": {"draft": "model:some/draft"}, "target": "default"}, "analytic")
