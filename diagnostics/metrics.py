"""Distances and speculative-decoding metrics over a trailing vocabulary dimension.

All functions take float tensors ``[..., V]`` and reduce the last dimension. Natural logs.
"""

from __future__ import annotations

import torch


# Values closer to 0 than this are float rounding, read as 0 wherever a distortion meets a person
# (charts, tables, the CLI's JSON). Distortions are computed in float64: a sum over a 49,152-token
# vocabulary accumulates at most about 49,152 × 2.2e-16 ≈ 1e-11 of rounding (a lossless run
# stores 8e-16), while the smallest distortion shown (4 decimals) is 1e-4: 1e-9 sits between.
FLOAT_NOISE = 1e-9


def noise_as_zero(value: float | None) -> float | None:
    """A distortion for reading: ``0.0`` where ``|value| < FLOAT_NOISE`` (float rounding), else as is."""
    return 0.0 if value is not None and abs(value) < FLOAT_NOISE else value


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def total_variation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``TV(a, b) = ½ Σ_v |a(v) − b(v)|``."""
    return 0.5 * (_f64(a) - _f64(b)).abs().sum(-1)


def kl_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``KL(a ‖ b) = Σ_v a(v) log(a(v) / b(v))``; ``+inf`` where ``a > 0 = b``.

    Clamped at 0: a negative value can only be rounding (``KL ≥ 0``).
    """
    a, b = _f64(a), _f64(b)
    terms = torch.xlogy(a, a) - torch.xlogy(a, b)
    return terms.sum(-1).clamp(min=0.0)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """``H(p) = −Σ_v p(v) log p(v)`` (``0 log 0 = 0``)."""
    p = _f64(p)
    return -torch.xlogy(p, p).sum(-1)


def overshoot_mass(p_target: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """``Σ_v (q(v) − p(v))+``: the draft mass above the target (equals ``TV(p, q)`` for laws)."""
    return (_f64(q_draft) - _f64(p_target)).clamp(min=0).sum(-1)


def severe_overshoot_mass(p_target: torch.Tensor, q_draft: torch.Tensor, lenience: float) -> torch.Tensor:
    """``Σ_v q(v)·1[q(v) ≥ p(v)/l]``: draft mass on tokens at or above lenience's ceiling ``p/l``.

    Only tokens the draft can propose count (``q > 0``).
    """
    p, q = _f64(p_target), _f64(q_draft)
    return (q * ((q >= p / lenience) & (q > 0))).sum(-1)


def ceiling_excess(p_target: torch.Tensor, q_draft: torch.Tensor, lenience: float) -> torch.Tensor:
    """``β = Σ_v (q(v) − p(v)/l)+ = 1 − Σ_v min(q, p/l)``: lenience's rejection probability."""
    return (_f64(q_draft) - _f64(p_target) / lenience).clamp(min=0).sum(-1)


def acceptance_probability(q_draft: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
    """Per-position acceptance ``α = Σ_v q(v)·a(v)`` for a single-draft rule with ``a``."""
    return (_f64(q_draft) * _f64(accept)).sum(-1)


def expected_block_efficiency(alpha: torch.Tensor | float, gamma: int) -> torch.Tensor:
    """Emitted tokens per target pass with i.i.d. acceptance: ``(1 − α^{γ+1}) / (1 − α)``.

    Equals ``γ + 1`` at ``α = 1`` (the limit) and ``1`` at ``α = 0``.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    # A tensor keeps its device; a number is host data.
    alpha = torch.as_tensor(alpha, dtype=torch.float64, device=alpha.device if isinstance(alpha, torch.Tensor) else "cpu")
    powers = torch.stack([alpha**i for i in range(gamma + 1)])
    # Σ_{i=0..γ} α^i is the same quantity without the 0/0 at α = 1.
    return powers.sum(0)


def acceptance_rate(accepted: int, drafted: int) -> float:
    """Observed acceptance: accepted drafts / drafted tokens (``nan`` when nothing was drafted)."""
    return accepted / drafted if drafted else float("nan")


def block_efficiency(emitted: int, target_passes: int) -> float:
    """Emitted tokens per target forward pass (plain decoding gives 1.0)."""
    return emitted / target_passes if target_passes else float("nan")


def log_likelihood(p_tokens) -> float:
    """``Σ_t log p_t(y_t)`` of an output under the target's policy law; ``p = 0`` counts as ``log 1e-300``
    so that one impossible token (possible under CoS) shows as a very large finite penalty."""
    values = torch.as_tensor(list(p_tokens), dtype=torch.float64, device="cpu")  # host floats from the records
    return float(torch.log(values.clamp(min=1e-300)).sum()) if values.numel() else float("nan")


def verified_acceptance(accepted: int, rejected: int) -> float:
    """``α̂ = accepted / (accepted + rejected)``: the per-verification acceptance, the maximum-likelihood
    ``α`` of the i.i.d. model (a draft discarded after a rejection was never verified, so it is not
    counted; ``nan`` when nothing was verified)."""
    verified = accepted + rejected
    return accepted / verified if verified else float("nan")


def modelled_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Speed-up over plain decoding from ``α``, ``γ`` and the draft/target cost ratio ``c`` of one
    forward step: ``(1 − α^{γ+1}) / ((1 − α)(γ·c + 1))``, i.e. expected tokens per block over the
    block's cost in target forwards. Hardware enters only through ``c``; ``γ = 0`` gives 1."""
    if cost_ratio < 0:
        raise ValueError(f"the cost ratio must be >= 0, got {cost_ratio}")
    if gamma == 0 or alpha != alpha:
        return 1.0
    return float(expected_block_efficiency(alpha, gamma)) / (gamma * cost_ratio + 1.0)


def modelled_tree_speedup(tokens_per_round: float, depth: int, cost_ratio: float) -> float:
    """Speed-up of tree verification over plain decoding: tokens per round (one target forward)
    over the round's cost in target forwards, ``E / (D·c + 1)``: ``D`` draft forwards (one per
    level, each over that level's nodes) at ``c`` each. ``c`` is a single draft step's cost, so
    a level with many nodes counts as one step (true while the draft is memory-bound, as on a GPU)."""
    if cost_ratio < 0:
        raise ValueError(f"the cost ratio must be >= 0, got {cost_ratio}")
    if depth <= 0 or tokens_per_round != tokens_per_round:
        return 1.0
    return float(tokens_per_round) / (depth * cost_ratio + 1.0)
