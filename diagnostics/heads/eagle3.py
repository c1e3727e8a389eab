"""An EAGLE-3 draft head, in the layout the EAGLE authors publish and vLLM/SGLang load.

The head reads three of the target's hidden states at position ``s`` (the states entering the
target's layers ``{2, L//2, L−3}`` by default: boundary indices, 0 being the embeddings), fuses
them, ``g_s = fc(cat(h_low, h_mid, h_high))``, and pairs ``g_s`` with the *next* token
``x_{s+1}``. One Llama decoder layer whose attention takes ``2H`` inputs,

    a_s = cat(input_layernorm(embed(x_{s+1})), hidden_norm(g_s)),
    o_s = g_s + o_proj(attention(a_s)),   o_s ← o_s + mlp(post_attention_layernorm(o_s)),

(``norm_before_residual``, as SpecForge trains some heads: ``hidden_norm(g_s)`` instead of ``g_s``
starts the residual stream),

then ``lm_head(norm(o_s))`` gives logits over the draft vocabulary for ``x_{s+2}``. Drafting
further, the head feeds back its own output: the pair ``(o_s, x̂_{s+2})`` at position ``s + 1``.
Draft id ``i`` is target id ``i + d2t[i]``; the logits are spread onto the target's vocabulary
with ``−inf`` elsewhere, so ``q`` is a law over the target's ids (zero outside the draft
vocabulary). Embeddings come from the target. Rotary positions are the pair's position ``s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from diagnostics.heads.bounds import (FIX, MAX_ATTENTION_FACTOR, MAX_INTERMEDIATE_FACTOR, MAX_ROPE_THETA, flag, real, same,
                                      whole)
from diagnostics.models import ModelError

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_taps(layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default tapped boundaries ``(2, L//2, L−3)``, kept inside ``[1, L]`` for shallow targets."""
    return tuple(min(layers, max(1, index)) for index in (2, layers // 2, layers - 3))  # type: ignore[return-value]


@dataclass
class Eagle3Config:
    """What ``config.json`` of an EAGLE-3 head says (the fields this lab reads)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    head_dim: int | None = None
    aux_layer_ids: list[int] | None = None
    norm_before_residual: bool = False  # SpecForge's variant: the residual stream starts from hidden_norm(g), not g
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str, hidden: int, vocab: int, layers: int) -> "Eagle3Config":
        """The config of ``raw`` (a head's ``config.json`` at ``where``), every field's type and range
        checked against a target of width ``hidden``, ``vocab`` ids and ``layers`` layers (one line otherwise)."""
        architectures = raw.get("architectures")
        if not isinstance(architectures, list) or ARCHITECTURE not in architectures:
            raise ModelError(f"{where} does not declare {ARCHITECTURE} in architectures: not an EAGLE-3 head")
        if whole(raw, "num_hidden_layers", where, 0, 2**62, default=1) != 1:
            raise ModelError(f"{where} has num_hidden_layers {raw.get('num_hidden_layers')}: this lab reads EAGLE-3 heads "
                             "of one decoder layer (midlayer), as the EAGLE authors publish them")
        eagle = raw.get("eagle_config", {})
        if eagle is None:
            eagle = {}
        if not isinstance(eagle, dict):
            raise ModelError(f"{where}: eagle_config is {type(eagle).__name__}; it must be an object ({FIX})")
        # The head embeds tokens with the target's embeddings, so its width is the target's too.
        same("target_hidden_size", whole(raw, "target_hidden_size", where, 1, 2**62, default=hidden), hidden)
        same("hidden_size", whole(raw, "hidden_size", where, 1, 2**62), hidden)
        same("vocab_size", whole(raw, "vocab_size", where, 1, 2**62), vocab)
        heads = whole(raw, "num_attention_heads", where, 1, hidden, why="(at most the hidden size)")
        kv_heads = whole(raw, "num_key_value_heads", where, 1, heads, default=heads, why="(at most num_attention_heads)")
        if heads % kv_heads:
            raise ModelError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads} ({FIX})")
        head_dim = whole(raw, "head_dim", where, 0, hidden, default=0, why="(at most the hidden size)") or hidden // heads
        if head_dim < 2 or head_dim % 2 or heads * head_dim > MAX_ATTENTION_FACTOR * hidden:
            raise ModelError(f"{where}: a head_dim of {head_dim} over {heads} heads does not fit: it must be even, at least 2, "
                             f"and heads x head_dim at most {MAX_ATTENTION_FACTOR} x hidden_size ({FIX})")
        return cls(
            hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
            intermediate_size=whole(raw, "intermediate_size", where, 1, MAX_INTERMEDIATE_FACTOR * hidden,
                                    why=f"(at most {MAX_INTERMEDIATE_FACTOR} x hidden_size)"),
            vocab_size=vocab, draft_vocab_size=whole(raw, "draft_vocab_size", where, 1, vocab, default=vocab,
                                                     why="(the target's vocabulary at most)"),
            target_hidden_size=hidden,
            rms_norm_eps=real(raw, "rms_norm_eps", where, 0.0, 1.0, 1e-6),
            rope_theta=real(raw, "rope_theta", where, 0.0, MAX_ROPE_THETA, 10000.0),
            head_dim=head_dim if raw.get("head_dim") else None,
            aux_layer_ids=_taps(eagle, where, layers),
            norm_before_residual=flag(raw, "norm_before_residual", where, flag(eagle, "norm_before_residual", where)),
        )

    def to_json(self) -> dict[str, Any]:
        raw = {"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_size": self.hidden_size,
               "num_hidden_layers": 1, "num_attention_heads": self.num_attention_heads,
               "num_key_value_heads": self.num_key_value_heads, "intermediate_size": self.intermediate_size,
               "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
               "target_hidden_size": self.target_hidden_size, "rms_norm_eps": self.rms_norm_eps,
               "rope_theta": self.rope_theta, "hidden_act": "silu", "tie_word_embeddings": False}
        if self.head_dim:
            raw["head_dim"] = self.head_dim
        if self.aux_layer_ids:
            raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        if self.norm_before_residual:
            raw["norm_before_residual"] = True
        return raw


def _taps(eagle: dict[str, Any], where: str, layers: int) -> list[int] | None:
    """``eagle_aux_hidden_state_layer_ids``: three boundaries in ``[0, layers]``, or ``None`` (the defaults)."""
    taps = eagle.get("eagle_aux_hidden_state_layer_ids")
    if taps is None or taps == []:
        return None
    if (not isinstance(taps, list) or len(taps) != 3
            or not all(isinstance(tap, int) and not isinstance(tap, bool) and 0 <= tap <= layers for tap in taps)):
        raise ModelError(f"{where}: eagle_aux_hidden_state_layer_ids {str(taps)[:60]} must be 3 boundaries in [0, {layers}] "
                         f"for this {layers}-layer target")
    return list(taps)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device="cpu"))  # built on the host; load_head moves the head
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``w · x / sqrt(mean(x²) + eps)``, in float32 as Llama computes it."""
        if x.dtype == torch.float32:
            return nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_table(length: int, dim: int, theta: float, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` ``[length, dim]`` of Llama's rotary embedding for positions ``0 … length − 1``."""
    inverse = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    angles = torch.arange(length, dtype=torch.float32, device=device)[:, None] * inverse[None, :]
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[…, heads, n, d]`` rotated by the table rows ``cos``, ``sin`` ``[…, 1, n, d]`` (half-split layout)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class _Attention(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        width, dim = 2 * config.hidden_size, config.dim
        self.q_proj = nn.Linear(width, config.num_attention_heads * dim, bias=False)
        self.k_proj = nn.Linear(width, config.num_key_value_heads * dim, bias=False)
        self.v_proj = nn.Linear(width, config.num_key_value_heads * dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * dim, config.hidden_size, bias=False)
        self.config = config


class _MLP(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)


@dataclass
class HeadCache:
    """One row's keys and values of the head's attention ``[kv_heads, n, d]`` (cut back by slicing)."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[1])

    def cut(self, length: int) -> None:
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :length], self.values[:, :length]


class Eagle3Head(nn.Module):
    """The head's modules under their published names (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``)."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long, device="cpu"))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool, device="cpu"))
        self._rotary: tuple[torch.Tensor, torch.Tensor] | None = None  # grown on demand

    def _table(self, end: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rotary is None or self._rotary[0].shape[0] < end or self._rotary[0].dtype != like.dtype:
            length = max(256, 2 * end)
            self._rotary = rotary_table(length, self.config.dim, self.config.rope_theta, like.device, like.dtype)
        return self._rotary

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """``g = fc(cat(h_low, h_mid, h_high))``: ``[n, 3·H_target]`` → ``[n, H]``."""
        return self.fc(taps.to(self.fc.weight.dtype))

    def _rotary_at(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` of the rotary table at ``positions`` (any shape ``S``): ``[*S, d]``."""
        cos, sin = self._table(int(positions.max()) + 1, like)
        index = positions.to(device=cos.device, dtype=torch.long)
        return cos[index], sin[index]

    def _layer(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               attend: Any, mask: torch.Tensor | None) -> torch.Tensor:
        """The mid layer on ``[B, Q, ·]`` inputs: ``attend(keys, values)`` stores the new keys and values
        ``[B, kv_heads, Q, d]`` and returns every key and value the queries read ``[B, kv_heads, K, d]``;
        ``mask`` ``[B, 1, Q, K]`` (bool: visible, or additive) or ``None`` (every key visible)."""
        config, layer = self.config, self.midlayer
        dtype = self.fc.weight.dtype
        embeds, hidden = embeds.to(dtype), hidden.to(dtype)
        rows, count = hidden.shape[0], hidden.shape[1]
        normed = layer.hidden_norm(hidden)
        joint = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
        attn = layer.self_attn
        heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.dim
        cos, sin = cos[:, None].to(joint.dtype), sin[:, None].to(joint.dtype)
        queries = rotate(attn.q_proj(joint).view(rows, count, heads, dim).transpose(1, 2), cos, sin)
        keys = rotate(attn.k_proj(joint).view(rows, count, kv_heads, dim).transpose(1, 2), cos, sin)
        values = attn.v_proj(joint).view(rows, count, kv_heads, dim).transpose(1, 2)
        keys, values = attend(keys, values)
        mixed = nn.functional.scaled_dot_product_attention(queries, keys.to(queries.dtype), values.to(queries.dtype),
                                                           attn_mask=mask, enable_gqa=heads != kv_heads)
        residual = normed if config.norm_before_residual else hidden
        out = residual + attn.o_proj(mixed.transpose(1, 2).reshape(rows, count, heads * dim))
        return out + layer.mlp(layer.post_attention_layernorm(out))

    @torch.inference_mode()
    def step(self, embeds: torch.Tensor, hidden: torch.Tensor, start: int, cache: HeadCache,
             positions: torch.Tensor | None = None, visible: torch.Tensor | None = None) -> torch.Tensor:
        """The mid layer over ``n`` new pairs ``(hidden_s, embed(x_{s+1}))`` of one sequence, written at
        cache rows ``start…`` (``cache`` is cut there and extended in place), returning the outputs
        ``o`` ``[n, H]``. By default they sit at rotary positions ``start…`` and attend causally; a
        tree level gives its nodes' ``positions`` ``[n]`` and ``visible`` ``[n, start + n]`` (the
        prefix, its ancestors, itself)."""
        count = hidden.shape[0]
        if positions is None:
            positions = torch.arange(start, start + count, device=hidden.device)
        cos, sin = self._rotary_at(positions, hidden)
        cache.cut(start)

        def attend(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            cache.keys = keys[0] if cache.keys is None else torch.cat([cache.keys, keys[0]], dim=1)
            cache.values = values[0] if cache.values is None else torch.cat([cache.values, values[0]], dim=1)
            return cache.keys[None], cache.values[None]

        mask = None
        if visible is not None:
            mask = visible.to(device=hidden.device, dtype=torch.bool)[None, None]
        elif count > 1:  # query i (cache row start + i) sees rows 0 … start + i
            mask = (torch.arange(start + count, device=hidden.device)[None, :]
                    <= torch.arange(start, start + count, device=hidden.device)[:, None])[None, None]
        return self._layer(embeds[None], hidden[None], cos[None], sin[None], attend, mask)[0]

    @torch.inference_mode()
    def step_rows(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                  store: Any) -> torch.Tensor:
        """``step`` for a batch of sequences padded to ``Q`` inputs: ``embeds``, ``hidden`` ``[B, Q, H]``,
        rotary ``positions`` ``[B, Q]``, an additive ``mask`` ``[B, 1, Q, K]`` (``None``: every key
        visible), keys and values through ``store.update`` (a ``forward.SlotStore`` prepared for
        these rows). Returns the outputs ``[B, Q, H]``."""
        cos, sin = self._rotary_at(positions, hidden)
        return self._layer(embeds, hidden, cos, sin, lambda keys, values: store.update(keys, values, 0), mask)

    @torch.inference_mode()
    def logits(self, out: torch.Tensor, vocab: int) -> torch.Tensor:
        """Float32 logits over the target's ``vocab`` ids: draft id ``i`` at ``i + d2t[i]``, ``−inf`` elsewhere."""
        draft = self.lm_head(self.norm(out)).float()
        full = torch.full((*draft.shape[:-1], vocab), float("-inf"), dtype=torch.float32, device=draft.device)
        ids = torch.arange(self.config.draft_vocab_size, device=draft.device) + self.d2t
        inside = ids < vocab
        full[..., ids[inside]] = draft[..., inside]
        return full


__all__ = ["ARCHITECTURE", "Eagle3Config", "Eagle3Head", "HeadCache", "default_taps", "rotary_table", "rotate"]
