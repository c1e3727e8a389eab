"""A direct forward for Llama-family decoders: the model's own modules, without its wrapper's overhead.

transformers' ``LlamaForCausalLM.forward`` wraps the decoder loop in config merging, output
capturing, mask construction and output dataclasses. On a 2-layer test model that wrapper is 40%
of a forward (profiled: 1.0 ms per call, 0.6 ms of it in the layers), and the engine-level audit
runs tens of thousands of them. ``DecoderParts`` calls the same modules in the same order:
embedding, rotary embedding, each decoder layer with the KV cache, final norm, head, so the
logits equal the wrapper's to float rounding (``tests/test_self_speculation.py`` checks them
against a cache-free forward). ``engine.forward.DirectStage`` runs it for a batch of rows, and
``self_speculation.SplitStages`` runs the layers in two parts (self-speculation).

Only for model types whose forward is exactly that loop (``DIRECT_MODEL_TYPES``), without a
sliding window or logit soft-capping; any other model uses its own ``forward``.

Inside the loop, ``LeanLayer`` runs each decoder layer's arithmetic itself, the same operations
in the same order as the layer's modules (RMSNorm, the projections, rotary, the cache update,
SDPA with the same GQA handling, the MLP), so its output is *bitwise* the module's
(``tests/test_self_speculation.py``): it only skips the 13 ``nn.Module`` calls of a layer (the
layer, two norms, attention, four projections, the MLP, its three projections and activation)
and the dispatch around them, which on a 2-core CPU is a tenth of a decoding step of the
embedded model (9.4% more tokens/s measured). A layer with hooks on it is
called as a module, so that whoever hooked it sees it run.

A one-token projection (decoding, drafting) runs as ``SplitLinear``: two half-row products in one
``bmm``, which torch spreads over its threads where a single-row ``F.linear`` uses one core. It
is checked bitwise against ``F.linear`` once per weight on the machine at hand and used only where
equal; on 2 cores it decodes the embedded model 1.5× faster with the same records.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

from diagnostics.models import LoadedModel, float_logits

DIRECT_MODEL_TYPES = ("llama", "mistral", "qwen2")


def supports_direct_forward(loaded: LoadedModel) -> bool:
    """Whether this model's forward is the plain loop ``DecoderParts`` reproduces: a known decoder
    family, rotary positions, one final norm and head, no sliding window, no logit soft-capping."""
    config = getattr(loaded.model, "config", None)
    inner = getattr(loaded.model, "model", None)
    if config is None or getattr(config, "model_type", None) not in DIRECT_MODEL_TYPES or inner is None:
        return False
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if not hasattr(loaded.model, "get_output_embeddings") or loaded.model.get_output_embeddings() is None:
        return False
    windowed = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    capped = getattr(config, "final_logit_softcapping", None) is not None
    return not windowed and not capped


# One token's projection ``x Wᵀ`` as two half-row products in one ``bmm``. On CPU, torch runs a
# single-row ``F.linear`` on one thread, whatever ``torch.get_num_threads()`` says (a 49,152 × 576
# head: about 8 ms with 1 thread or 2), so decoding one token leaves a core idle. ``bmm`` over the two
# halves runs them on torch's own thread pool: 1.7× faster on the head and 1.4× on the embedded
# model's 210 layer matrices (2 cores). Each output element is the same dot product by the same
# kernel, so the result is *bitwise* ``F.linear``'s; that is checked once per weight on this
# machine (``_split_ok``), and a weight that differs keeps ``F.linear``.
SPLIT_MIN_ELEMENTS = 65_536  # smaller matrices: the second thread's start costs more than it saves


def _split_ok(weight: torch.Tensor, halves: torch.Tensor, threads: int) -> bool:
    """Whether the two-half product of one random row equals ``F.linear``'s bit for bit; the verdict
    is kept on the weight (a forward is built per generation), with what it was checked for."""
    key = (weight.data_ptr(), weight._version, threads, weight.dtype)
    known = getattr(weight, "_diagnostics_split", None)
    if known is not None and known[0] == key:
        return known[1]
    generator = torch.Generator().manual_seed(0)
    row = torch.randn(1, 1, weight.shape[1], generator=generator, device="cpu").to(device=weight.device, dtype=weight.dtype)
    with torch.inference_mode():
        same = torch.equal(_two_halves(row, halves), F.linear(row, weight))
    weight._diagnostics_split = (key, same)
    return same


def _two_halves(row: torch.Tensor, halves: torch.Tensor) -> torch.Tensor:
    """``row`` ``[…, 1, K]`` times the two ``[K, N/2]`` halves: ``[…, 1, N]`` (first half, then second)."""
    width = row.shape[-1]
    return torch.bmm(row.reshape(1, 1, width).expand(2, 1, width), halves).reshape(*row.shape[:-1], -1)


class SplitLinear:
    """``F.linear(x, W, b)``, bitwise, with one-token inputs split over two threads where that is
    faster (CPU, at least 2 threads, no bias, an even number of rows, a large matrix)."""

    def __init__(self, linear: Any) -> None:
        self.weight, self.bias = linear.weight, linear.bias
        self.threads = torch.get_num_threads()
        self.halves = None
        weight = self.weight
        if (self.bias is None and weight.dim() == 2 and weight.shape[0] % 2 == 0 and weight.is_contiguous()
                and weight.device.type == "cpu" and self.threads >= 2 and weight.numel() >= SPLIT_MIN_ELEMENTS):
            halves = weight.detach().view(2, weight.shape[0] // 2, weight.shape[1]).transpose(1, 2)
            if _split_ok(weight, halves, self.threads):
                self.halves = halves

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.halves is not None and x.numel() == x.shape[-1] and torch.get_num_threads() == self.threads:
            return _two_halves(x, self.halves)
        return F.linear(x, self.weight, self.bias)


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight · x / sqrt(mean(x²) + eps)`` computed in float32, as the family's RMSNorm does."""
    dtype = hidden.dtype
    if dtype != torch.float32:
        hidden = hidden.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (hidden if dtype == torch.float32 else hidden.to(dtype))


def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding ``x·cos + rotate_half(x)·sin`` (``rotate_half(x) = [−x₂, x₁]``)."""
    half = states.shape[-1] // 2
    return states * cos + torch.cat((-states[..., half:], states[..., :half]), dim=-1) * sin


class LeanLayer:
    """One Llama-family decoder layer's forward without its modules' dispatch, bitwise the layer's.

    ``h = x + o(attn(rope(q(n₁(x))), rope(k(n₁(x))), v(n₁(x))))``, ``out = h + down(silu(gate(n₂(h))) · up(n₂(h)))``.
    """

    def __init__(self, layer: Any) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        self.layer = layer
        self.index = attention.layer_idx
        self.head_dim = attention.head_dim
        self.groups = attention.num_key_value_groups
        self.scaling = attention.scaling
        self.q, self.k, self.v, self.o = (SplitLinear(module) for module in
                                          (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj))
        self.gate, self.up, self.down = (SplitLinear(module) for module in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.norm_in, self.norm_post = layer.input_layernorm, layer.post_attention_layernorm

    @staticmethod
    def supported(layer: Any, config: Any) -> bool:
        """The layer is the plain family layer this class reproduces (SiLU MLP, RMSNorm, SDPA attention)."""
        attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        needed = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "num_key_value_groups", "scaling", "layer_idx")
        return (attention is not None and mlp is not None and all(hasattr(attention, name) for name in needed)
                and all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj"))
                and all(hasattr(layer, name) for name in ("input_layernorm", "post_attention_layernorm"))
                and getattr(config, "hidden_act", None) == "silu"
                and getattr(config, "_attn_implementation", None) == "sdpa"
                and not any(hasattr(attention, name) for name in ("q_norm", "k_norm")))

    def hooked(self) -> bool:
        """Hooks on the layer: call it as a module so that they run (checked per call: hooks come and go)."""
        return bool(self.layer._forward_hooks or self.layer._forward_pre_hooks)

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 cache: Any) -> torch.Tensor:
        """``cos``, ``sin``: the rotary tables ``[batch, 1, count, head_dim]`` (one head axis, shared by every layer)."""
        batch, count = hidden.shape[:2]
        normed = _rms_norm(hidden, self.norm_in.weight, self.norm_in.variance_epsilon)
        query = self.q(normed).view(batch, count, -1, self.head_dim).transpose(1, 2)
        key = self.k(normed).view(batch, count, -1, self.head_dim).transpose(1, 2)
        value = self.v(normed).view(batch, count, -1, self.head_dim).transpose(1, 2)
        key, value = cache.update(_rotate(key, cos, sin), value, self.index)
        query = _rotate(query, cos, sin)
        extra: dict[str, Any] = {}
        if self.groups > 1:  # transformers' choice: GQA inside SDPA without a mask, repeated heads with one
            if mask is None and key.shape[-1] <= 256:
                extra["enable_gqa"] = True
            else:
                key, value = repeat_kv(key, self.groups), repeat_kv(value, self.groups)
        attended = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, scale=self.scaling,
                                                  is_causal=False, **extra)
        attended = attended.transpose(1, 2).reshape(batch, count, -1).contiguous()
        hidden = hidden + self.o(attended)
        normed = _rms_norm(hidden, self.norm_post.weight, self.norm_post.variance_epsilon)
        gated = F.silu(self.gate(normed)) * self.up(normed)
        return hidden + self.down(gated)


class DecoderParts:
    """The modules of a Llama-family causal LM, and the loop over a slice of its layers."""

    def __init__(self, loaded: LoadedModel) -> None:
        inner = loaded.model.model
        self.device = loaded.device
        self.embed, self.norm, self.rotary = inner.embed_tokens, inner.norm, inner.rotary_emb
        self.layers = list(inner.layers[: int(loaded.model.config.num_hidden_layers)])
        self.head = loaded.model.get_output_embeddings()
        self.head_split = SplitLinear(self.head) if isinstance(self.head, torch.nn.Linear) else None
        self.dtype = next(loaded.model.parameters()).dtype
        config = loaded.model.config
        lean = all(LeanLayer.supported(layer, config) for layer in self.layers)
        self.lean = {id(layer): LeanLayer(layer) for layer in self.layers} if lean else {}
        # Set to a dict to receive the input of each layer run (key: its index in the slice) and the
        # last layer's output (key: the slice's length): the hidden states a draft head reads.
        self.capture: dict[int, torch.Tensor] | None = None

    def embed_tokens(self, tokens: list[int]) -> torch.Tensor:
        return self.embed(torch.tensor([tokens], dtype=torch.long, device=self.device))

    def run(self, hidden: torch.Tensor, start: int, layers: list[Any], cache: Any) -> torch.Tensor:
        """``hidden`` ``[1, m, H]`` at positions ``start … start + m − 1`` through ``layers``, appending their keys to ``cache``."""
        count = hidden.shape[1]
        positions = torch.arange(start, start + count, device=hidden.device).unsqueeze(0)
        rotary = self.rotary(hidden, positions)
        mask = None  # one query attends to every cached key: no mask, as transformers does
        if count > 1:
            # Additive causal mask over the cached prefix and the new tokens (sdpa and eager alike):
            # 0 where visible, the dtype's most negative value where hidden.
            hidden_from = torch.arange(start + count, device=hidden.device).unsqueeze(0) > positions.reshape(-1, 1)
            mask = torch.zeros(hidden_from.shape, dtype=self.dtype, device=hidden.device)
            mask.masked_fill_(hidden_from, torch.finfo(self.dtype).min)
            mask = mask[None, None]
        return self._layers(hidden, positions, rotary, mask, layers, cache)

    def run_rows(self, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, layers: list[Any],
                 cache: Any) -> torch.Tensor:
        """``hidden`` ``[B, Q, H]`` of rows with their own ``positions`` ``[B, Q]`` and additive ``mask``
        ``[B, 1, Q, K]`` (``diagnostics.engine.forward``) through ``layers``."""
        return self._layers(hidden, positions, self.rotary(hidden, positions), mask, layers, cache)

    def _layers(self, hidden: torch.Tensor, positions: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None, layers: list[Any], cache: Any) -> torch.Tensor:
        cos, sin = rotary[0].unsqueeze(1), rotary[1].unsqueeze(1)  # a head axis, once for every lean layer
        capture = self.capture
        for index, layer in enumerate(layers):
            if capture is not None:
                capture[index] = hidden
            lean = self.lean.get(id(layer))
            if lean is not None and not lean.hooked():
                hidden = lean(hidden, mask, cos, sin, cache)
            else:
                hidden = layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=cache,
                               use_cache=True, position_embeddings=rotary)
        if capture is not None:
            capture[len(layers)] = hidden
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm and head, as float32 ``[…, V]`` (float64 for a float64 model)."""
        head = self.head
        if self.head_split is None or head._forward_hooks or head._forward_pre_hooks:
            return float_logits(head(self.norm(hidden)))
        return float_logits(self.head_split(self.norm(hidden)))
