"""Medusa heads, in the published layout (``medusa_lm_head``: ``{k}.{j}.linear.{weight,bias}``, ``{k}.{L}.weight``).

Head ``k`` (``0 ≤ k < medusa_num_heads``) maps the target's last hidden state at position ``s``
(after its final norm, as the base model returns it) through ``medusa_num_layers`` residual
blocks ``x ← x + SiLU(W_j x + b_j)`` and a linear head to logits over the target's vocabulary for
the token at ``s + 2 + k``: the base model's own head predicts ``s + 1``, and the heads look
further. Heads do not read each other's drafts: ``q`` of draft ``k`` is the same whatever was
drafted before it, which is still the law the draft was drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class MedusaConfig:
    medusa_num_heads: int
    medusa_num_layers: int
    hidden_size: int
    vocab_size: int

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "MedusaConfig":
        return cls(int(raw["medusa_num_heads"]), int(raw.get("medusa_num_layers", 1)), int(raw["hidden_size"]),
                   int(raw["vocab_size"]))

    def to_json(self) -> dict[str, Any]:
        return {"architectures": ["MedusaModel"], "medusa_num_heads": self.medusa_num_heads,
                "medusa_num_layers": self.medusa_num_layers, "hidden_size": self.hidden_size, "vocab_size": self.vocab_size}


class ResBlock(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(size, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x + SiLU(W x + b)``."""
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``medusa_num_heads`` sequential stacks, each ``[ResBlock × L, Linear(H, V, bias=False)]`` (Medusa's ``medusa_head``)."""

    def __init__(self, config: MedusaConfig) -> None:
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.medusa_num_layers)],
                          nn.Linear(config.hidden_size, config.vocab_size, bias=False))
            for _ in range(config.medusa_num_heads))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, count: int) -> torch.Tensor:
        """Float32 logits ``[count, V]`` of heads ``0 … count−1`` at one normed hidden state ``[H]``."""
        weight = self.heads[0][-1].weight
        hidden = hidden.to(weight.dtype)
        return torch.stack([self.heads[index](hidden).float() for index in range(count)])

    def published_state(self) -> dict[str, torch.Tensor]:
        """The weights under Medusa's key names (``0.0.linear.weight`` … ``0.{L}.weight``)."""
        return {key.removeprefix("heads."): value for key, value in self.state_dict().items()}

    def load_published(self, state: dict[str, torch.Tensor]) -> None:
        state = {key.removeprefix("medusa_head."): value for key, value in state.items()}
        self.load_state_dict({f"heads.{key}": value for key, value in state.items()}, strict=True)


__all__ = ["MedusaConfig", "MedusaHeads", "ResBlock"]
