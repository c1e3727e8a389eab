"""Medusa heads, in the published layout (``medusa_lm_head``: ``{k}.{j}.linear.{weight,bias}``, ``{k}.{L}.weight``)
or in vLLM's (``blocks.{k}.layers.{j}.weight[, bias]``, ``lm_heads.{k}.weight``; config ``num_heads``,
``num_hidden_layers``), read into one module (``read_medusa``).

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
        return self.logits_by_head(hidden.expand(count, -1)[None])[0]

    @torch.inference_mode()
    def logits_by_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Many rows at once: ``hidden`` ``[B, K, H]``, head ``j`` applied to column ``j`` → float32 ``[B, K, V]``."""
        weight = self.heads[0][-1].weight
        hidden = hidden.to(weight.dtype)
        return torch.stack([self.heads[index](hidden[:, index]).float() for index in range(hidden.shape[1])], dim=1)

    def published_state(self) -> dict[str, torch.Tensor]:
        """The weights under Medusa's key names (``0.0.linear.weight`` … ``0.{L}.weight``)."""
        return {key.removeprefix("heads."): value for key, value in self.state_dict().items()}

    def load_published(self, state: dict[str, torch.Tensor]) -> None:
        self.load_state_dict({f"heads.{key}": value for key, value in state.items()}, strict=True)


def read_medusa(raw: dict[str, Any], state: dict[str, torch.Tensor]) -> tuple[MedusaConfig, dict[str, torch.Tensor]]:
    """The config and the published-layout weights of a Medusa checkpoint in either layout.

    Medusa's own ``config.json`` names only ``medusa_num_heads`` and ``medusa_num_layers`` (the
    base model gives the rest): the width and vocabulary are then read off the heads' weights.
    vLLM's layout may leave out the blocks' biases (``medusa_fc_bias`` false: zero) and share one
    head (``original_lm_head``). A truncated draft vocabulary (vLLM's ``token_map``) is refused:
    its ``q`` would need the map, which this lab does not read."""
    state = {key.removeprefix("medusa_heads.").removeprefix("medusa_head."): value for key, value in state.items()}
    heads = int(raw.get("medusa_num_heads", raw.get("num_heads", 0)) or 0)
    layers = int(raw.get("medusa_num_layers", raw.get("num_hidden_layers", 1)))
    if heads < 1 or layers < 0:
        raise ValueError("config.json names no medusa_num_heads (or num_heads) of at least 1")
    if "token_map" in state or int(raw.get("truncated_vocab_size") or 0) not in (0, int(raw.get("vocab_size") or 0)):
        raise ValueError("its heads draft over a truncated vocabulary (token_map), which this lab does not read")
    if any(key.startswith(("blocks.", "lm_heads.")) for key in state):
        state = _from_vllm(state, heads, layers, bool(raw.get("original_lm_head")))
    head = state[f"0.{layers}.weight"]
    hidden, vocab = int(raw.get("hidden_size") or head.shape[1]), int(raw.get("vocab_size") or head.shape[0])
    return MedusaConfig(heads, layers, hidden, vocab), state


def _from_vllm(state: dict[str, torch.Tensor], heads: int, layers: int, shared: bool) -> dict[str, torch.Tensor]:
    """vLLM's keys → the published ones (``blocks.k.layers.j`` → ``k.j.linear``, ``lm_heads.k`` → ``k.L``)."""
    published: dict[str, torch.Tensor] = {}
    for k in range(heads):
        for j in range(layers):
            weight = state[f"blocks.{k}.layers.{j}.weight"]
            published[f"{k}.{j}.linear.weight"] = weight
            published[f"{k}.{j}.linear.bias"] = state.get(f"blocks.{k}.layers.{j}.bias", torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device))
        published[f"{k}.{layers}.weight"] = state["lm_heads.0.weight" if shared else f"lm_heads.{k}.weight"]
    return published


__all__ = ["MedusaConfig", "MedusaHeads", "ResBlock", "read_medusa"]
