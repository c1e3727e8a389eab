"""The engines of the verdict table and how each generates, with speculation on and, as its
control, off, under the same sampling settings.

A generator is the audit's protocol: ``run(prompt_ids, seed) -> tokens`` and optionally
``run.batch(prompt_ids, seeds) -> [tokens]`` (``audit.engine_level``). In-process engines
(transformers, ours, planted bugs) build one here; server engines (llama-cpp-python) are driven
through the endpoint collector instead (``verdicts.servers``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from diagnostics.policy import Policy

# The truncated policy beside plain temperature 1: truncation is where implementations slip.
POLICIES: dict[str, Policy] = {"t1": Policy(temperature=1.0), "t1-top-k-20": Policy(temperature=1.0, top_k=20)}
# transformers' assistant: drafts per block where the row fixes them.
GAMMA = 4
ASSISTANT = "the draft model (default: the target's first layers, as a model)"
# An engine's EAGLE-3 head for the embedded target: untrained (``make-head``, seed 0), so it is
# rarely accepted; what it tests is the engine's sampling path with an EAGLE-3 drafter.
EAGLE3_HEAD = "an untrained EAGLE-3 head for the target (make-head eagle3, seed 0)"
PROMPT_LOOKUP_TOKENS = 4


@dataclass(frozen=True)
class EngineRow:
    """One engine of the table: its name (``--engine NAME``), what it is, its speculative settings
    (every one stated) and how it runs (``kind``: "transformers", "ours", "mutant", "server")."""

    name: str
    label: str
    kind: str
    speculative: dict[str, Any] = field(default_factory=dict)
    note: str = ""


TRANSFORMERS_ROWS = [
    EngineRow("transformers-assistant", "transformers generate, assistant model (fixed γ)", "transformers",
              {"assistant_model": ASSISTANT, "num_assistant_tokens": GAMMA,
               "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}),
    EngineRow("transformers-assistant-defaults", "transformers generate, assistant model (its defaults)", "transformers",
              {"assistant_model": ASSISTANT, "num_assistant_tokens": 20,
               "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4},
              "transformers' default drafting: up to 20 drafts, stopped when the assistant's confidence falls under 0.4"),
    EngineRow("transformers-assistant-heuristic", "transformers generate, assistant model, heuristic schedule", "transformers",
              {"assistant_model": ASSISTANT, "num_assistant_tokens": GAMMA,
               "num_assistant_tokens_schedule": "heuristic", "assistant_confidence_threshold": 0.4},
              "drafts per block grow after a fully accepted block and shrink after a rejection"),
    EngineRow("transformers-prompt-lookup", "transformers generate, prompt lookup", "transformers",
              {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}),
    EngineRow("transformers-universal", "transformers generate, universal assisted decoding (assistant with another tokenizer)",
              "universal", {"assistant_model": ASSISTANT + " with a second tokenizer: the same tokens under shuffled ids, plus 2",
                            "num_assistant_tokens": GAMMA, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0},
              "the assistant's tokenizer differs (two more tokens, ids shuffled), so generate verifies through its "
              "vocabulary translator (UniversalSpeculativeDecodingGenerator)"),
    EngineRow("transformers-early-exit", "transformers generate, assistant_early_exit", "transformers",
              {"assistant_early_exit": "the early-exit layer"}),
]


def transformers_version() -> str:
    import transformers

    return f"transformers {transformers.__version__}"


def _sampling(policy: Policy) -> dict[str, Any]:
    """``generate``'s sampling arguments for ``policy``, every one stated (transformers' own
    defaults, top-k 50 among them, would otherwise apply)."""
    return {"do_sample": True, "temperature": policy.temperature, "top_k": policy.top_k or 0, "top_p": policy.top_p or 1.0,
            **({"min_p": policy.min_p} if policy.min_p is not None else {})}


def _assistant_fields(row: EngineRow) -> dict[str, Any]:
    from diagnostics.hf_assisted import ASSISTANT_FIELDS

    return {name: row.speculative[name] for name in ASSISTANT_FIELDS if name in row.speculative}


def transformers_generator(row: EngineRow, target: Any, assistant: Any, early_exit_layer: int, policy: Policy,
                           max_tokens: int, eos: set[int], speculative: bool) -> Callable[[list[int], int], list[int]]:
    """transformers ``generate`` as ``row`` runs it (speculation on), or plain sampling under the
    same settings (off: batched over seeds, one prompt, so no padding)."""
    from diagnostics.hf_assisted import assistant_settings, counting_drafts

    sampling = {**_sampling(policy), "max_new_tokens": max_tokens, "eos_token_id": sorted(eos), "pad_token_id": min(eos)}

    def extra() -> dict[str, Any]:
        if row.name == "transformers-prompt-lookup":
            return {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
        if row.name == "transformers-early-exit":
            return {"assistant_early_exit": early_exit_layer}
        return {"assistant_model": assistant.model}

    # transformers' own count of drafted and kept tokens (``counting_drafts``): the verdict table's
    # proof that speculation ran; the plain control drafts nothing.
    counters = {"drafted": 0, "accepted": 0, "generations": 0, "source": "transformers' candidate generator"}

    def run(prompt_ids: list[int], seed: int) -> list[int]:
        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids], device=target.device)
        options = extra() if speculative else {}
        drafting = _assistant_fields(row) if speculative and "assistant_model" in options else None
        with assistant_settings(assistant.model, drafting), counting_drafts(counters), torch.inference_mode():
            output = target.model.generate(ids, attention_mask=torch.ones_like(ids), **sampling, **options)
        counters["generations"] += 1
        return output[0, len(prompt_ids):].tolist()

    def batch(prompt_ids: list[int], seeds: list[int]) -> list[list[int]]:
        torch.manual_seed(seeds[0])
        ids = torch.tensor([prompt_ids] * len(seeds), device=target.device)
        with torch.inference_mode():
            output = target.model.generate(ids, attention_mask=torch.ones_like(ids), **sampling)
        return [row_ids[len(prompt_ids):].tolist() for row_ids in output]

    if not speculative:
        run.batch = batch  # type: ignore[attr-defined]
    else:
        run.counters = counters  # type: ignore[attr-defined]
    return run


def ours_generator(target: Any, draft: Any, policy: Policy, max_tokens: int, eos: set[int], speculative: bool,
                   seams: Any = None) -> Callable[[list[int], int], list[int]]:
    """This lab's engine (lossless, γ = ``GAMMA``; ``seams``: a planted bug), or plain sampling (off)."""
    from diagnostics.audit.engine_level import engine_generator

    options: dict[str, Any] = {"eos_token_id": sorted(eos)}
    if speculative:
        options.update(gamma=GAMMA, **({"seams": seams} if seams is not None else {}))
    return engine_generator(target, draft if speculative else None, max_tokens, policy=policy, **options)
