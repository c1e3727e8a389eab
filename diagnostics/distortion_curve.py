"""The Playground's distortion curve: distortion of every rule as the draft moves toward the target (q → p).

``q_t = (1 − t)·q_0 + t·p`` for ``t`` from 0 to 1. For each rule and each ``t`` the exact law
``P_t`` is computed in closed form (no sampling), then ``TV(P_t, p)`` and
``TV(P_t, baseline)``. Tree rules use the draft's top-``k`` tokens at ``q_t`` as ordered
deterministic candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from diagnostics.metrics import total_variation
from diagnostics.rules import Rule, TreeRule, get_rule, get_tree_rule, top_candidates

PATH_RULES: tuple[str, ...] = ("lenience:0.5", "cos:0.4", "cascade:0.5", "typical:0.1", "medusa:0.09,0.3")
PATH_TREE_RULES: tuple[str, ...] = ("lenience:0.5", "cascade:0.5", "typical:0.1")


@dataclass
class PathCurve:
    """One rule's curve: ``t``, distortion against ``p`` and against the matched baseline, acceptance."""

    label: str
    spec: str
    tree: bool
    t: list[float]
    tv_target: list[float]
    tv_baseline: list[float]
    acceptance: list[float]
    limit_baseline: float | None = None
    limit_target: float | None = None


@dataclass
class DraftPath:
    curves: list[PathCurve] = field(default_factory=list)


def truncation_limits(rule: Rule, p_target: torch.Tensor) -> tuple[float, float] | None:
    """Limits as ``q → p`` for a truncation rule that falls back on ``p``: ``(p(Aᶜ)², p(A)·p(Aᶜ))``."""
    if rule.family != "truncation" or rule.name == "medusa":
        return None
    outside = float(p_target[~rule.allowed_set(p_target)].sum())
    return outside**2, (1.0 - outside) * outside


def distortion_path(
    p_target: torch.Tensor,
    q_start: torch.Tensor,
    specs: tuple[str, ...] = PATH_RULES,
    tree_specs: tuple[str, ...] = PATH_TREE_RULES,
    steps: int = 41,
    tree_k: int = 1,
) -> DraftPath:
    """Exact distortion curves for ``q_t = (1 − t)·q_0 + t·p``, ``t ∈ [0, 1]`` in ``steps`` points."""
    t = torch.linspace(0.0, 1.0, steps, dtype=torch.float64, device=p_target.device)
    p = p_target.to(torch.float64)
    q_t = (1.0 - t[:, None]) * q_start.to(torch.float64)[None, :] + t[:, None] * p[None, :]
    p_rows = p.expand_as(q_t)

    def curve(label: str, spec: str, law: torch.Tensor, baseline: torch.Tensor, acceptance: torch.Tensor,
              tree: bool, limits: tuple[float, float] | None = None) -> PathCurve:
        return PathCurve(label=label, spec=spec, tree=tree, t=t.tolist(),
                          tv_target=total_variation(law, p_rows).tolist(),
                          tv_baseline=total_variation(law, baseline).tolist(),
                          acceptance=acceptance.tolist(),
                          limit_baseline=limits[0] if limits else None,
                          limit_target=limits[1] if limits else None)

    sweep = DraftPath()
    for spec in specs:
        rule = get_rule(spec)
        sweep.curves.append(curve(spec, spec, rule.induced(p_rows, q_t), rule.baseline(p_rows),
                                  rule.acceptance(p_rows, q_t), False, truncation_limits(rule, p)))
    for spec in tree_specs:
        tree: TreeRule = get_tree_rule(spec)
        candidates = top_candidates(q_t, tree_k)
        sweep.curves.append(curve(f"tree {spec} (top-{tree_k})", spec, tree.induced(p_rows, candidates),
                                  tree.baseline(p_rows), tree.acceptance(p_rows, candidates), True))
    return sweep
