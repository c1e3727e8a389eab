"""Tiny random-weight causal LMs built locally: the same code path as real models, in milliseconds."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import LlamaConfig

from devices import DEVICE
from diagnostics.models import LoadedModel, wrap_model
from diagnostics.tiny import tiny_llama  # noqa: F401  (re-exported for the tests)


class TinyCausalLM(torch.nn.Module):
    """A one-layer, one-head causal transformer with a real ``DynamicCache``, ~20 torch ops a forward.

    Same interface as a transformers causal LM for what the engine uses (``input_ids``,
    ``past_key_values``, ``use_cache``, ``logits_to_keep`` → ``.logits``, and for token trees an
    additive 4D ``attention_mask`` with explicit ``position_ids``). Absolute position embeddings
    read the cache length (or ``position_ids``), and attention reads every cached key, so a stale
    or missing cache entry, or a wrong position, changes the law: what the losslessness tests
    need, at a fraction of a Llama forward's Python overhead.

    It takes the engine's batched slot store as its cache (``accepts_slot_cache``): rows of a
    batch with their own ``position_ids`` and additive mask.
    """

    accepts_slot_cache = True

    def __init__(self, vocab: int, seed: int, dim: int = 8, sharpness: float = 1.5, max_positions: int = 64) -> None:
        super().__init__()
        from transformers import GenerationConfig

        self.config = LlamaConfig(
            vocab_size=vocab, hidden_size=dim, intermediate_size=dim, num_hidden_layers=1,
            num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=max_positions,
            eos_token_id=vocab - 1,
        )
        self.generation_config = GenerationConfig(eos_token_id=vocab - 1)
        generator = torch.Generator().manual_seed(seed)

        def weight(*shape: int, scale: float = 1.0) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=generator) * scale, requires_grad=False)

        self.embed = weight(vocab, dim)
        self.positions = weight(max_positions, dim)
        self.query, self.key, self.value = weight(dim, dim, scale=dim**-0.5), weight(dim, dim, scale=dim**-0.5), weight(dim, dim, scale=dim**-0.5)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = weight(vocab, dim, scale=sharpness)
        self.scale = dim**-0.5

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.head

    def forward(self, input_ids: torch.Tensor, past_key_values=None, use_cache: bool = True, logits_to_keep: int = 0,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None, **_: object):
        start = past_key_values.get_seq_length() if past_key_values is not None else 0
        length = input_ids.shape[1]
        positions = self.positions[position_ids] if position_ids is not None else self.positions[start : start + length][None]
        hidden = self.embed[input_ids] + positions
        query = (hidden @ self.query)[:, None]
        keys, values = (hidden @ self.key)[:, None], (hidden @ self.value)[:, None]
        if past_key_values is not None:
            keys, values = past_key_values.update(keys, values, 0)
        scores = (query @ keys.transpose(-1, -2)) * self.scale
        if attention_mask is not None and attention_mask.dim() == 4:
            scores = scores + attention_mask.to(scores.dtype)  # additive: 0 visible, most negative hidden
        elif length > 1:  # one query (the last position) sees every key: nothing to mask
            total = keys.shape[-2]
            steps = torch.arange(total, device=scores.device)
            causal = steps[None, :] > (steps[:length, None] + total - length)
            scores = scores.masked_fill(causal, -torch.inf)
        attended = torch.softmax(scores, dim=-1) @ values
        logits = torch.nn.functional.linear(torch.tanh(hidden + attended[:, 0]), self.head.weight)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits)


def tiny_lm(vocab: int, seed: int, sharpness: float = 1.5, device: str | torch.device = DEVICE,
            dtype: torch.dtype = torch.float32) -> LoadedModel:
    """A ``TinyCausalLM`` drawn on the CPU from ``seed``, then moved to ``device`` in ``dtype``."""
    model = TinyCausalLM(vocab, seed, sharpness=sharpness).to(device=torch.device(device), dtype=dtype)
    return wrap_model(model.eval(), tokenizer=None, name=f"tiny-lm-{seed}")


def tiny_tokenizer(vocab: int):
    """A word-level fast tokenizer over ``w0 … w{vocab-1}`` (``w{vocab-1}`` is EOS, ``w0`` unknown)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{index}": index for index in range(vocab)}
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="w0", eos_token=f"w{vocab - 1}")


def save_tiny_model(folder, seed: int = 0, vocab: int = 12, layers: int = 2, sharpness: float = 2.0) -> str:
    """A tiny Llama with its tokenizer saved as a local model folder (loadable by path)."""
    loaded = tiny_llama(seed, vocab=vocab, layers=layers, sharpness=sharpness)
    loaded.model.save_pretrained(folder)
    tiny_tokenizer(vocab).save_pretrained(folder)
    return str(folder)
