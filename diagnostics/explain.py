"""Everything one verification step does to a ``(p, q)`` pair, gathered for charts and pages."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diagnostics.metrics import (
    entropy,
    kl_divergence,
    overshoot_mass,
    severe_overshoot_mass,
    total_variation,
)
from diagnostics.rules import Rule, as_laws, get_rule, get_tree_rule, top_candidates


@dataclass(frozen=True)
class StepView:
    """Per-token laws (float64 ``[V]``) and scalars of one rule at one ``(p, q)``.

    ``ceiling`` is ``p/l`` for lenience-like rules, ``allowed`` the truncation set ``A``;
    both are ``None`` where the rule has none.
    """

    spec: str
    labels: list[str]
    p_target: torch.Tensor
    q_draft: torch.Tensor
    accept: torch.Tensor
    fallback: torch.Tensor
    induced: torch.Tensor
    baseline: torch.Tensor
    allowed: torch.Tensor | None
    ceiling: torch.Tensor | None
    alpha: float
    tv_target: float
    tv_baseline: float
    kl_target: float
    tv_draft: float
    overshoot: float
    severe_overshoot: float | None
    entropy_target: float
    allowed_mass: float | None


def explain_step(rule: Rule, p: torch.Tensor, q: torch.Tensor, labels: list[str] | None = None) -> StepView:
    """Compute ``a``, ``f``, ``P``, the baseline, ``A``, ``p/l`` and the scalar metrics for one position.

    Scalars: ``α = Σ q·a``, ``TV(P, p)``, ``TV(P, baseline)``, ``KL(P ‖ p)``, ``TV(p, q)``,
    ``Σ (q − p)+``, the draft mass at or above ``p/l``, ``H(p)`` and ``p(A)``.
    """
    p_target, q_draft = as_laws(p, q)
    if p_target.dim() != 1:
        raise ValueError("explain_step takes one position: p and q of shape [V]")
    accept = rule.accept_prob(p_target, q_draft)
    induced = rule.induced(p_target, q_draft)
    baseline = rule.baseline(p_target)
    allowed = rule.allowed_set(p_target)
    lenience = rule.ceiling_factor
    return StepView(
        spec=rule.spec,
        labels=labels or [str(index) for index in range(p_target.numel())],
        p_target=p_target,
        q_draft=q_draft,
        accept=accept,
        fallback=rule.fallback(p_target, q_draft),
        induced=induced,
        baseline=baseline,
        allowed=allowed,
        ceiling=p_target / lenience if lenience else None,
        alpha=float((q_draft * accept).sum()),
        tv_target=float(total_variation(induced, p_target)),
        tv_baseline=float(total_variation(induced, baseline)),
        kl_target=float(kl_divergence(induced, p_target)),
        tv_draft=float(total_variation(p_target, q_draft)),
        overshoot=float(overshoot_mass(p_target, q_draft)),
        severe_overshoot=float(severe_overshoot_mass(p_target, q_draft, lenience)) if lenience else None,
        entropy_target=float(entropy(p_target)),
        allowed_mass=float(p_target[allowed].sum()) if allowed is not None else None,
    )



def rule_table(
    p: torch.Tensor, q: torch.Tensor, specs: tuple[str, ...], tree_specs: tuple[str, ...], tree_k: int = 1
) -> list[dict[str, float | str]]:
    """One row per rule at this ``(p, q)``: acceptance, ``TV(P, p)``, ``TV(P, baseline)``, ``KL(P ‖ p)``.

    Tree rows use the draft's top-``tree_k`` tokens as ordered candidates.
    """
    p_target, q_draft = as_laws(p, q)
    rows: list[dict[str, float | str]] = []
    for spec in specs:
        rule = get_rule(spec)
        law = rule.induced(p_target, q_draft)
        rows.append(_row(spec, "single draft", rule.acceptance(p_target, q_draft), law, p_target, rule.baseline(p_target)))
    candidates = top_candidates(q_draft, tree_k)
    for spec in tree_specs:
        tree = get_tree_rule(spec)
        law = tree.induced(p_target, candidates)
        rows.append(_row(spec, f"tree, top-{tree_k}", tree.acceptance(p_target, candidates), law, p_target, tree.baseline(p_target)))
    return rows


def _row(spec: str, mode: str, alpha: torch.Tensor, law: torch.Tensor, p_target: torch.Tensor, baseline: torch.Tensor) -> dict[str, float | str]:
    return {
        "rule": spec,
        "verification": mode,
        "acceptance α": float(alpha),
        "TV(P, p)": float(total_variation(law, p_target)),
        "TV(P, baseline)": float(total_variation(law, baseline)),
        "KL(P ‖ p)": float(kl_divergence(law, p_target)),
    }
