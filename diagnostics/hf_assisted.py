"""transformers' assisted generation at the settings we ask for.

transformers reads ``num_assistant_tokens``, ``num_assistant_tokens_schedule`` and
``assistant_confidence_threshold`` from the *assistant's* ``generation_config`` (filled with its
defaults: 20 drafts, a constant schedule, a 0.4 confidence stop), not from ``generate``'s
keyword arguments, which it accepts and ignores. A peer or an audit that means "γ = 4" must set
them there; this context manager does, and restores them after the call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ASSISTANT_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def fixed_gamma(gamma: int) -> dict[str, Any]:
    """``γ`` drafts per block, no schedule, no confidence stop: transformers' like-for-like peer of a fixed γ."""
    return {"num_assistant_tokens": int(gamma), "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}


@contextmanager
def assistant_settings(assistant: Any, settings: dict[str, Any] | None) -> Iterator[None]:
    """Set ``settings`` (``ASSISTANT_FIELDS`` only) on ``assistant.generation_config`` for the block."""
    settings = settings or {}
    unknown = sorted(set(settings) - set(ASSISTANT_FIELDS))
    if unknown:
        raise ValueError(f"not assistant settings: {', '.join(unknown)}")
    config = assistant.generation_config
    saved = {name: getattr(config, name, None) for name in settings}
    for name, value in settings.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


@contextmanager
def counting_drafts(counters: dict[str, Any]) -> Iterator[None]:
    """Count, in ``counters["drafted"]`` and ``counters["accepted"]``, the tokens transformers'
    assisted generation drafts and keeps inside the block: each candidate generator ``generate``
    makes (assistant model, prompt lookup, early exit, universal) is wrapped where it is made, its
    ``get_candidates`` adding ``len(candidates) − len(input)`` and its ``update_candidate_strategy``
    the ``n_matches`` verification kept. The engine's own figures, for the verdict table's proof
    that speculation ran; one generation at a time (batch rows would be summed)."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin._get_candidate_generator

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        generator = original(self, *args, **kwargs)
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

        def candidates(input_ids: Any, *more: Any, **options: Any) -> Any:
            candidate_ids, logits = get_candidates(input_ids, *more, **options)
            counters["drafted"] += int(candidate_ids.shape[-1] - input_ids.shape[-1])
            return candidate_ids, logits

        def strategy(input_ids: Any, scores: Any, num_matches: Any, *more: Any, **options: Any) -> Any:
            counters["accepted"] += int(num_matches)
            return update(input_ids, scores, num_matches, *more, **options)

        generator.get_candidates, generator.update_candidate_strategy = candidates, strategy
        return generator

    GenerationMixin._get_candidate_generator = counted
    try:
        yield
    finally:
        GenerationMixin._get_candidate_generator = original
