"""Tiny random-weight Llama models built locally in milliseconds.

The engine-level audit runs thousands of generations; on these models it takes seconds, and
the code path (transformers Llama, ``DynamicCache``, ``generate``) is the one real models use.
Nothing is downloaded.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from diagnostics.models import LoadedModel, wrap_model


def tiny_llama(seed: int, vocab: int = 12, layers: int = 2, sharpness: float = 1.0, eos: int | None = None,
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """A ``layers``-layer Llama over ``vocab`` tokens; ``sharpness`` scales the head (peakier laws).

    The weights are drawn on the CPU from ``seed`` (the same model on every device), then moved to
    ``device`` in ``dtype``: float64 makes a batched row and the same row alone agree to about 1e-12
    where float32 agrees to the rounding of the machine's matrix kernels."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.3, tie_word_embeddings=False,
        eos_token_id=eos if eos is not None else vocab - 1, bos_token_id=0, pad_token_id=None,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    model.generation_config.eos_token_id = config.eos_token_id
    return wrap_model(model.to(device=torch.device(device), dtype=dtype).eval(), tokenizer=None, name=f"tiny-llama-{seed}")
