"""Synthetic target/draft pairs for the Playground: no model needed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRESETS: dict[str, str] = {
    "dirichlet": "Random Dirichlet pair (concentration slider)",
    "toy": "Toy pair: q = [.55, .25, .15, .05], p = [.05, .15, .25, .55]",
    "peaked": "Peaked target, flat draft",
    "noisy": "Draft = p mixed with noise (noise slider)",
}


@dataclass(frozen=True)
class Pair:
    """A target law ``p_target`` and draft law ``q_draft`` over ``len(labels)`` tokens."""

    p_target: torch.Tensor
    q_draft: torch.Tensor
    labels: list[str]
    description: str


def dirichlet(vocab: int, concentration: float, generator: torch.Generator) -> torch.Tensor:
    """A ``Dirichlet(concentration)`` law over ``vocab`` tokens, in float64 (normalised gamma draws)."""
    alpha = torch.full((vocab,), float(concentration), dtype=torch.float64, device=generator.device)
    draws = torch._standard_gamma(alpha, generator=generator).clamp(min=1e-300)
    return draws / draws.sum()


def keep_top(law: torch.Tensor, keep: int) -> torch.Tensor:
    """Zero all but the ``keep`` largest entries and renormalise: a truncated policy."""
    kept = torch.zeros_like(law)
    top = torch.topk(law, keep).indices
    kept[top] = law[top]
    return kept / kept.sum()


def _labels(vocab: int) -> list[str]:
    return [f"t{index}" for index in range(vocab)]


def make_pair(
    preset: str, *, vocab: int = 12, concentration: float = 1.0, noise: float = 0.5, seed: int = 0
) -> Pair:
    """Build a preset pair.

    * ``dirichlet``: ``p, q ~ Dirichlet(concentration)`` independently;
    * ``toy``: the paper's 4-token pair (``vocab`` ignored);
    * ``peaked``: ``p ∝ exp(−rank)·4``-sharp target, ``q ~ Dirichlet(2)`` flat draft;
    * ``noisy``: ``q = (1 − noise)·p + noise·u`` with ``u ~ Dirichlet(1)``.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    if preset == "toy":
        p = torch.tensor([0.05, 0.15, 0.25, 0.55], dtype=torch.float64, device="cpu")  # the Playground's laws live on the host
        q = torch.tensor([0.55, 0.25, 0.15, 0.05], dtype=torch.float64, device="cpu")
        return Pair(p, q, _labels(4), PRESETS[preset])
    if vocab < 2:
        raise ValueError(f"vocabulary size must be at least 2, got {vocab}")
    if concentration <= 0:
        raise ValueError(f"concentration must be positive, got {concentration}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must lie in [0, 1], got {noise}")
    generator = torch.Generator().manual_seed(int(seed))
    if preset == "dirichlet":
        p = dirichlet(vocab, concentration, generator)
        q = dirichlet(vocab, concentration, generator)
    elif preset == "peaked":
        ranks = torch.randperm(vocab, generator=generator, device=generator.device).to(torch.float64)
        p = torch.softmax(-1.5 * ranks, dim=-1)
        q = dirichlet(vocab, 2.0, generator)
    else:
        p = dirichlet(vocab, concentration, generator)
        q = (1.0 - noise) * p + noise * dirichlet(vocab, 1.0, generator)
    return Pair(p, q, _labels(vocab), PRESETS[preset])
