"""Medusa heads, in the published layout (``medusa_lm_head``: ``{k}.{j}.linear.{weight,bias}``, ``{k}.{L}.weight``)
or in vLLM's (``blocks.{k}.layers.{j}.weight[, bias]``, ``lm_heads.{k}.weight``; config ``num_heads``,
``num_hidden_layers``), read into one module (``medusa_config``, ``medusa_slots``).

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

from diagnostics.heads.bounds import MAX_MEDUSA_HEADS, MAX_MEDUSA_LAYERS, Slot, flag, same, slots_of, whole
from diagnostics.models import ModelError


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



def medusa_config(raw: dict[str, Any], where: str, hidden: int, vocab: int) -> tuple[MedusaConfig, bool]:
    """The checked config of a Medusa checkpoint for a target of width ``hidden`` over ``vocab`` ids, and
    whether its heads share one ``lm_head`` (vLLM's ``original_lm_head``).

    Medusa's own ``config.json`` names only ``medusa_num_heads`` and ``medusa_num_layers`` (the
    base model gives the rest); ``hidden_size`` and ``vocab_size``, when given, must be the target's.
    A truncated draft vocabulary (vLLM's ``truncated_vocab_size``, ``token_map``) is refused: its
    ``q`` would need the map, which this lab does not read."""
    heads = whole(raw, ("medusa_num_heads", "num_heads"), where, 1, MAX_MEDUSA_HEADS, why="heads (MAX_MEDUSA_HEADS)")
    layers = whole(raw, ("medusa_num_layers", "num_hidden_layers"), where, 0, MAX_MEDUSA_LAYERS, default=1,
                   why="residual blocks per head (MAX_MEDUSA_LAYERS)")
    same("hidden_size", whole(raw, "hidden_size", where, 1, 2**62, default=hidden), hidden)
    same("vocab_size", whole(raw, "vocab_size", where, 1, 2**62, default=vocab), vocab)
    if whole(raw, "truncated_vocab_size", where, 0, 2**62, default=0) not in (0, vocab):
        raise ModelError(f"{where}: its heads draft over a truncated vocabulary (token_map), which this lab does not read")
    return MedusaConfig(heads, layers, hidden, vocab), flag(raw, "original_lm_head", where)


def canonical_medusa_key(name: str) -> str:
    """A Medusa file's tensor name without the prefixes some checkpoints carry (``medusa_head.``, ``medusa_heads.``)."""
    return name.removeprefix("medusa_heads.").removeprefix("medusa_head.")


def medusa_slots(config: MedusaConfig, names: set[str], shared: bool) -> list[Slot]:
    """The tensors ``config`` needs, named as the file names them: Medusa's published keys
    (``k.j.linear.{weight,bias}``, ``k.L.weight``), or vLLM's when the file has ``blocks.*``/``lm_heads.*``
    (block biases optional: zero, as with ``medusa_fc_bias`` false; one shared head when ``shared``)."""
    if "token_map" in names:
        raise ModelError("the Medusa heads draft over a truncated vocabulary (token_map), which this lab does not read")
    hidden, vocab, layers = config.hidden_size, config.vocab_size, config.medusa_num_layers
    if not any(name.startswith(("blocks.", "lm_heads.")) for name in names):
        with torch.device("meta"):  # shapes only: nothing is allocated
            return slots_of(MedusaHeads(config), lambda key: key.removeprefix("heads."))
    slots: list[Slot] = []
    for k in range(config.medusa_num_heads):
        for j in range(layers):
            slots.append(Slot(f"heads.{k}.{j}.linear.weight", f"blocks.{k}.layers.{j}.weight", (hidden, hidden)))
            slots.append(Slot(f"heads.{k}.{j}.linear.bias", f"blocks.{k}.layers.{j}.bias", (hidden,), optional=True))
        slots.append(Slot(f"heads.{k}.{layers}.weight", "lm_heads.0.weight" if shared else f"lm_heads.{k}.weight", (vocab, hidden)))
    return slots


def medusa_ignored(config: MedusaConfig, shared: bool) -> tuple[str, ...]:
    """Tensors a shared-head vLLM file may also hold and that are not read (its other ``lm_heads``)."""
    return tuple(f"lm_heads.{k}.weight" for k in range(1, config.medusa_num_heads)) if shared else ()


__all__ = ["MedusaConfig", "MedusaHeads", "ResBlock", "canonical_medusa_key", "medusa_config", "medusa_ignored", "medusa_slots"]
