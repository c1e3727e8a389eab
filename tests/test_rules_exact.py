"""Closed forms against brute-force enumeration of each rule's mechanism, and the paper's limits.

The reference below is written straight from the table of docs/maths.md#single-draft-rules in plain Python
loops, independent of ``diagnostics.rules``: for every token ``x`` the draft could propose it
adds ``q(x)·a(x)`` to ``x`` and ``q(x)·(1 − a(x))·f(v)`` to every ``v``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import corner_pairs, dirichlet

from diagnostics.metrics import total_variation
from diagnostics.rules import (
    EXAMPLE_SPECS,
    RuleError,
    SampledMultiDraft,
    get_rule,
    get_tree_rule,
    induced_by_mechanism,
)

ATOL = 1e-12


def _ratio(num: float, den: float) -> float:
    if num == 0:
        return 0.0
    return math.inf if den == 0 else num / den


def _norm(values: list[float], default: list[float]) -> list[float]:
    total = sum(values)
    return [v / total for v in values] if total > 0 else list(default)


def _entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def reference_triple(spec: str, p: list[float], q: list[float]) -> tuple[list[float], list[float]]:
    """``(a, f)`` for one rule, transcribed from the table in docs/maths.md#single-draft-rules."""
    name, _, args = spec.partition(":")
    params = [float(x) for x in args.split(",")] if args else []
    V = len(p)
    top = max(range(V), key=lambda v: (p[v], -v))
    delta_top = [1.0 if v == top else 0.0 for v in range(V)]
    residual = _norm([max(p[v] - q[v], 0.0) for v in range(V)], p)
    if name == "lossless":
        return [min(1.0, _ratio(p[v], q[v])) for v in range(V)], residual
    if name == "greedy":
        return delta_top, delta_top
    if name == "cascade":
        (m,) = params
        return [1.0 if p[v] >= m * max(p) else 0.0 for v in range(V)], list(p)
    if name == "typical":
        (eta,) = params
        tau = min(eta, math.sqrt(eta) * math.exp(-_entropy(p)))
        return [1.0 if (p[v] >= tau or v == top) else 0.0 for v in range(V)], list(p)
    if name == "medusa":
        eps, delta = params
        h_prime = -sum(x * math.log(x + 1e-5) for x in p)
        tau = min(eps, delta * math.exp(-h_prime))
        return [1.0 if p[v] > tau else 0.0 for v in range(V)], delta_top
    if name == "lenience":
        (l,) = params
        return [min(1.0, _ratio(p[v], l * q[v])) for v in range(V)], residual
    if name == "cos":
        (lam,) = params
        r = [lam * q[v] + (1 - lam) * p[v] for v in range(V)]
        return [min(1.0, _ratio(r[v], q[v])) for v in range(V)], residual  # norm((r − q)+) = norm((p − q)+)
    if name == "mentored":
        alpha, beta = params
        return [min(1.0, _ratio(p[v], alpha * q[v])) for v in range(V)], _norm(
            [max(p[v] / beta - q[v], 0.0) for v in range(V)], p
        )
    raise AssertionError(spec)


def enumerate_law(spec: str, p: list[float], q: list[float]) -> np.ndarray:
    """Brute force: ``Σ_x q(x)·[a(x)·δ_x + (1 − a(x))·f]``."""
    a, f = reference_triple(spec, p, q)
    law = np.zeros(len(p))
    for x, qx in enumerate(q):
        if qx == 0:
            continue
        law[x] += qx * a[x]
        law += qx * (1 - a[x]) * np.asarray(f)
    return law


def enumerate_tree(spec: str, p: list[float], candidates: list[int]) -> np.ndarray:
    """Brute force of the sibling mechanism at one node, candidate by candidate."""
    name, _, args = spec.partition(":")
    param = float(args) if args else None
    law = np.zeros(len(p))
    current = list(p)
    survive = 1.0
    for c in candidates:
        if sum(current) == 0:
            break
        if name == "lossless":
            a = current[c]
        elif name == "lenience":
            a = min(1.0, current[c] / param)
        elif name == "cascade":
            a = 1.0 if current[c] >= param * max(current) else 0.0
        elif name == "typical":
            tau = min(param, math.sqrt(param) * math.exp(-_entropy(current)))
            a = min(1.0, current[c] / tau)
        law[c] += survive * a
        survive *= 1 - a
        current[c] = 0.0
        total = sum(current)
        current = [x / total for x in current] if total > 0 else [0.0] * len(p)
    return law + survive * np.asarray(current)


RULE_SPECS = EXAMPLE_SPECS + ("cascade:0.1", "typical:0.5", "lenience:0.1", "lenience:1", "cos:0", "cos:1", "medusa:0.3,0.9")
TREE_SPECS = ("lossless", "lenience:0.5", "lenience:0.2", "cascade:0.3", "typical:0.1", "typical:0.6")
PAIRS = corner_pairs(8, 120, seed=1) + corner_pairs(5, 60, seed=2) + corner_pairs(2, 20, seed=3)


@pytest.mark.parametrize("spec", RULE_SPECS)
def test_closed_form_equals_enumeration(spec: str) -> None:
    rule = get_rule(spec)
    for label, p, q in PAIRS:
        expected = enumerate_law(spec, p.tolist(), q.tolist())
        closed = rule.induced(p, q).numpy()
        assert np.allclose(closed, expected, atol=ATOL), (spec, label, closed, expected)
        assert np.allclose(induced_by_mechanism(rule, p, q).numpy(), expected, atol=ATOL), (spec, label)
        assert abs(closed.sum() - 1) < 1e-12 and (closed >= 0).all()


@pytest.mark.parametrize("spec", RULE_SPECS)
def test_accept_and_fallback_match_the_table(spec: str) -> None:
    rule = get_rule(spec)
    for label, p, q in PAIRS[::7]:
        a, f = reference_triple(spec, p.tolist(), q.tolist())
        assert np.allclose(rule.accept_prob(p, q).numpy(), a, atol=ATOL), (spec, label)
        assert np.allclose(rule.fallback(p, q).numpy(), f, atol=ATOL), (spec, label)


@pytest.mark.parametrize("spec", RULE_SPECS)
def test_batched_closed_form_matches_rows(spec: str) -> None:
    rule = get_rule(spec)
    p = torch.stack([pair[1] for pair in PAIRS[:120]]).reshape(4, 30, 8)
    q = torch.stack([pair[2] for pair in PAIRS[:120]]).reshape(4, 30, 8)
    batched = rule.induced(p, q)
    rows = torch.stack([rule.induced(p[i, j], q[i, j]) for i in range(4) for j in range(30)]).reshape(4, 30, 8)
    assert torch.allclose(batched, rows, atol=ATOL)
    assert rule.acceptance(p, q).shape == (4, 30)


@pytest.mark.parametrize("spec", RULE_SPECS)
def test_large_vocabulary(spec: str) -> None:
    """49,152 tokens (SmolLM2's vocabulary), peaked and truncated laws, against the mechanism form."""
    generator = torch.Generator().manual_seed(7)
    p = dirichlet(49152, 0.05, generator)
    q = dirichlet(49152, 0.05, generator)
    q[torch.topk(q, 40000, largest=False).indices] = 0.0  # a truncated draft policy
    q = q / q.sum()
    rule = get_rule(spec)
    closed = rule.induced(p, q)
    assert torch.allclose(closed, induced_by_mechanism(rule, p, q), atol=1e-12)
    assert abs(closed.sum().item() - 1) < 1e-10


@pytest.mark.parametrize("spec", TREE_SPECS)
def test_tree_law_equals_enumeration(spec: str) -> None:
    tree = get_tree_rule(spec)
    generator = torch.Generator().manual_seed(11)
    for label, p, q in PAIRS[::3]:
        for k in (1, 2, 3):
            candidates = torch.randperm(p.numel(), generator=generator)[: min(k, p.numel())]
            expected = enumerate_tree(spec, p.tolist(), candidates.tolist())
            assert np.allclose(tree.induced(p, candidates).numpy(), expected, atol=ATOL), (spec, label, k)


def test_tree_lossless_is_exact_and_formula_holds() -> None:
    """``P(c_j) = a_j Π(1 − a_i)``, ``P(v ∉ C) = Π(1 − a_i)·p(v)/(1 − Σ p(c_i))``; lossless gives ``p``."""
    tree = get_tree_rule("lenience:0.4")
    for _, p, _ in PAIRS[:40]:
        candidates = torch.topk(p, 3).indices
        law = tree.induced(p, candidates)
        assert torch.allclose(get_tree_rule("lossless").induced(p, candidates), p, atol=ATOL)
        rest = torch.ones_like(p, dtype=torch.bool)
        rest[candidates] = False
        survive = 1 - tree.acceptance(p, candidates)
        outside = survive * p[rest] / (1 - p[candidates].sum())
        if p[candidates].sum() < 1 - 1e-9:
            assert torch.allclose(law[rest], outside, atol=1e-10)


def test_multi_draft_law_is_p() -> None:
    for k in (1, 2, 4):
        rule = SampledMultiDraft(k)
        for _, p, q in PAIRS[::4]:
            assert torch.allclose(rule.induced(p, q), p, atol=ATOL)


def test_lenience_regions(toy_pair) -> None:
    """``P ≤ p/l`` everywhere; ``P = q`` on moderate overshoot; ``l = 1`` is lossless."""
    for _, p, q in PAIRS[::5]:
        for l in (0.2, 0.5, 0.9):
            law = get_rule("lenience", l=l).induced(p, q)
            assert (law <= p / l + 1e-12).all()
            moderate = (q > p) & (q < p / l)
            assert torch.allclose(law[moderate], q[moderate], atol=ATOL)
        assert torch.allclose(get_rule("lenience:1").induced(p, q), p, atol=ATOL)
    p, q = toy_pair
    assert torch.allclose(get_rule("lenience:0.5").induced(p, q), torch.tensor([0.1, 0.25, 0.225, 0.425], dtype=torch.float64))


def test_cos_is_the_ensemble() -> None:
    for _, p, q in PAIRS[::5]:
        law = get_rule("cos:0.3").induced(p, q)
        assert torch.allclose(law, 0.3 * q + 0.7 * p, atol=ATOL)


def test_mentored_is_the_clip_when_masses_match() -> None:
    """When ``Σ clip(q, p/β, p/α) = 1`` the mechanism's law is the clip."""
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    # Token 3 overshoots the ceiling p/α by 0.05 and token 0 falls 0.05 below the floor p/β.
    q = torch.tensor([0.15, 0.3, 1 / 3, 13 / 60], dtype=torch.float64)
    rule = get_rule("mentored:0.6,2")
    clip = torch.minimum(torch.maximum(q, p / 2), p / 0.6)
    assert abs(clip.sum().item() - 1.0) < 1e-12
    assert torch.allclose(rule.induced(p, q), clip, atol=ATOL)


def _interpolate(p: torch.Tensor, q0: torch.Tensor, t: float) -> torch.Tensor:
    return (1 - t) * q0 + t * p


@pytest.mark.parametrize("spec", ["cascade:0.3", "typical:0.2"])
def test_truncation_limits(spec: str) -> None:
    """As ``q → p``: ``TV(P, baseline) → p(Aᶜ)²`` and ``TV(P, p) → p(A)·p(Aᶜ)``."""
    rule = get_rule(spec)
    generator = torch.Generator().manual_seed(5)
    for _ in range(30):
        p = dirichlet(12, 0.7, generator)
        q0 = dirichlet(12, 0.7, generator)
        outside = p[~rule.allowed_set(p)].sum()
        levels = [total_variation(rule.induced(p, _interpolate(p, q0, t)), rule.baseline(p)) for t in (0.9, 0.99, 0.999, 1.0)]
        assert abs(levels[-1] - outside**2) < 1e-12
        assert abs(levels[-2] - outside**2) < 2e-3
        assert abs(total_variation(rule.induced(p, p), p) - (1 - outside) * outside) < 1e-12


def test_lenience_vanishes_single_draft_but_not_in_tree() -> None:
    generator = torch.Generator().manual_seed(9)
    for _ in range(30):
        p = dirichlet(12, 0.5, generator)
        q0 = dirichlet(12, 0.5, generator)
        for l in (0.3, 0.7):
            distortions = [total_variation(get_rule("lenience", l=l).induced(p, _interpolate(p, q0, t)), p).item() for t in (0.0, 0.5, 0.9, 0.999, 1.0)]
            assert distortions[-1] < 1e-12 and distortions[-2] < 5e-3
            top = p.argmax().reshape(1)
            tree_tv = total_variation(get_tree_rule("lenience", l=l).induced(p, top), p).item()
            expected = min(1.0, p.max().item() / l) - p.max().item()
            assert abs(tree_tv - expected) < 1e-12


def test_tree_cascade_with_perfect_draft_is_greedy() -> None:
    generator = torch.Generator().manual_seed(13)
    for _ in range(30):
        p = dirichlet(12, 0.5, generator)
        for k in (1, 3):
            law = get_tree_rule("cascade:0.5").induced(p, torch.topk(p, k).indices)
            assert torch.equal(law, torch.nn.functional.one_hot(p.argmax(), 12).to(torch.float64))


def test_spec_round_trip_and_keywords() -> None:
    for spec in EXAMPLE_SPECS:
        assert get_rule(spec).spec == spec
        assert get_rule(get_rule(spec).spec) == get_rule(spec)
    assert get_rule("lenience", l=0.5) == get_rule("lenience:0.5")
    assert get_rule("medusa", eps=0.09, delta=0.3) == get_rule("medusa:0.09,0.3")


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("lenience:0", "out of range"),
        ("cos:1.5", "out of range"),
        ("typical:-1", "out of range"),
        ("cascade:0", "out of range"),
        ("medusa:0.1", "takes 2 parameter"),
        ("lenience:abc", "not a number"),
        ("lenience", "needs l"),
        ("magic:1", "unknown rule 'magic'"),
        ("", "empty rule spec"),
        ("mentored:0.5,0.5", "beta must be >= 1"),
        ("lenience:nan", "out of range"),
    ],
)
def test_bad_specs_give_one_line_errors(spec: str, fragment: str) -> None:
    with pytest.raises(RuleError) as error:
        get_rule(spec)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_bad_inputs_are_refused() -> None:
    rule = get_rule("lossless")
    with pytest.raises(RuleError, match="different vocabulary sizes"):
        rule.induced(torch.ones(4) / 4, torch.ones(5) / 5)
    with pytest.raises(RuleError, match="negative"):
        rule.induced(torch.tensor([-0.1, 1.1]), torch.tensor([0.5, 0.5]))
    with pytest.raises(RuleError, match="zero total mass"):
        rule.induced(torch.zeros(3), torch.ones(3))
    with pytest.raises(RuleError, match="no tree form"):
        get_tree_rule("cos:0.5")


@pytest.mark.parametrize("spec, equivalent", [
    ("lossless", True), ("lenience:1", True), ("cos:0", True), ("mentored:1,1", True),
    ("lenience:0.999", False), ("cos:0.001", False), ("mentored:1,1.001", False), ("mentored:0.999,1", False),
    ("greedy", False), ("cascade:1", False), ("typical:0.1", False),
])
def test_lossless_equivalent_rules_are_the_lossless_mechanism_bit_for_bit(spec: str, equivalent: bool) -> None:
    """Everyday, < 0.1 s. A rule flagged lossless-equivalent has the lossless rule's acceptance and
    fallback bit for bit (so the same coins give the same tokens) and induced law ``p``; the rules just
    off those parameters (negative controls) are flagged lossy and their law differs from ``p``."""
    rule, lossless = get_rule(spec), get_rule("lossless")
    assert rule.lossless_equivalent is equivalent
    generator = torch.Generator().manual_seed(11)
    p = torch.stack([dirichlet(32, 0.3, generator) for _ in range(64)])
    q = torch.stack([dirichlet(32, 0.3, generator) for _ in range(64)])
    same_mechanism = (torch.equal(rule.accept_prob(p, q), lossless.accept_prob(p, q))
                      and torch.equal(rule.fallback(p, q), lossless.fallback(p, q)))
    law_is_p = torch.allclose(rule.induced(p, q), p, atol=1e-12)
    assert same_mechanism is equivalent and law_is_p is equivalent
