"""transformers' universal assisted decoding (an assistant with ANOTHER tokenizer) as a verdict-table
engine, built locally: no second tokenizer is downloaded.

transformers 5 takes its Universal Speculative Decoding path (``UniversalSpeculativeDecodingGenerator``:
a vocabulary translator, the assistant's LM head pruned to the tokens both vocabularies share,
speculative-sampling verification) when ``generate`` gets ``assistant_model``, ``tokenizer``,
``assistant_tokenizer`` and ``do_sample=True``, and refuses ``assistant_tokenizer`` unless the
assistant's config ``vocab_size`` differs from the target's. ``universal_assistant`` makes such an
assistant out of the target's early-exit draft: the same token strings under other ids, plus extra
tokens the target does not have, so the draft's law is known exactly (the early-exit law, relabelled).

What the row finds with transformers 5.x (``misplaced_draft_logits``): with the pruned head,
``AssistantToTargetTranslator.get_target_logits`` writes the pruned row ``i`` (assistant id
``assistant_overlap_token_ids[i]``, in ``get_vocab()``'s hash order) under the ``i``-th shared
target id in assistant-id order, so the ``q`` handed to the verification is not the law the draft
was drawn from and the output is not the target's law. ``corrected_draft_logits`` scatters each row
under its own token: the same generation then passes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from diagnostics.policy import Policy

EXTRA_TOKENS = 2
EXTRA_TOKEN = "<|usd-extra-{}|>"


def _fixed_ids(tokenizer: Any, data: dict) -> set[int]:
    """Ids that keep their place: the special tokens (named ones and every special added token)."""
    fixed = {int(token_id) for token_id in tokenizer.all_special_ids}
    fixed.update(int(token["id"]) for token in data.get("added_tokens", []) if token.get("special"))
    return fixed


def token_permutation(tokenizer: Any, seed: int = 0) -> list[int]:
    """``permutation[target_id] = assistant_id`` over the tokenizer's ids: every non-special id shuffled
    (``torch.randperm`` from ``seed``), special ids fixed."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    size = len(tokenizer)
    fixed = _fixed_ids(tokenizer, data)
    movable = [index for index in range(size) if index not in fixed]
    order = torch.randperm(len(movable), generator=torch.Generator().manual_seed(seed), device="cpu").tolist()
    permutation = list(range(size))
    for source, place in zip(movable, order):
        permutation[source] = movable[place]
    return permutation


def permuted_tokenizer(tokenizer: Any, permutation: list[int], first_extra: int, extra: int = EXTRA_TOKENS) -> Any:
    """``tokenizer`` with token ``t``'s id moved to ``permutation[t]`` (its fast tokenizer's JSON edited:
    ``model.vocab``, ``added_tokens`` and any post-processor ids), plus ``extra`` special tokens
    ``<|usd-extra-i|>`` at ids ``first_extra + i`` that the target's vocabulary lacks."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    data = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    if isinstance(vocab, dict):  # BPE, WordLevel, WordPiece: token -> id
        data["model"]["vocab"] = {token: permutation[index] for token, index in vocab.items()}
    else:  # Unigram: a list of [token, score] whose position is the id
        moved: list[Any] = [None] * len(vocab)
        for index, entry in enumerate(vocab):
            moved[permutation[index]] = entry
        data["model"]["vocab"] = moved
        if data["model"].get("unk_id") is not None:
            data["model"]["unk_id"] = permutation[data["model"]["unk_id"]]
    for token in data.get("added_tokens", []):
        token["id"] = permutation[token["id"]]
    processor = data.get("post_processor") or {}
    for processors in [processor, *processor.get("processors", [])]:
        for entry in (processors.get("special_tokens") or {}).values():
            entry["ids"] = [permutation[index] for index in entry["ids"]]
        for key in ("sep", "cls"):  # BertProcessing / RobertaProcessing: [token, id]
            if isinstance(processors.get(key), list):
                processors[key][1] = permutation[processors[key][1]]
    for index in range(extra):
        data.setdefault("added_tokens", []).append(
            {"id": first_extra + index, "content": EXTRA_TOKEN.format(index), "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True})
    backend = Tokenizer.from_str(json.dumps(data))
    named = {name: value for name, value in tokenizer.special_tokens_map.items() if isinstance(value, str)}
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, **named)
    for attribute in ("clean_up_tokenization_spaces", "padding_side"):
        if hasattr(tokenizer, attribute):
            setattr(fast, attribute, getattr(tokenizer, attribute))
    return fast


def universal_assistant(target: Any, layer: int, seed: int = 0, extra: int = EXTRA_TOKENS) -> tuple[Any, Any]:
    """An assistant for transformers' universal assisted decoding: ``(model, tokenizer)``.

    Construction. The tokenizer is the target's with every non-special token id permuted
    (``token_permutation``: ``torch.randperm`` seeded with ``seed``; special tokens keep their ids)
    and ``extra`` (default 2) special tokens ``<|usd-extra-i|>`` appended after the target's last id,
    so the two vocabularies differ in ids and in size and share every target token string.

    The model is the target's first ``layer`` decoder layers, its final norm (shared with the target,
    as in ``models.early_exit_model``) with its OWN input embedding and LM head: row ``permutation[t]``
    of each is row ``t`` of the target's, so the assistant's logit for assistant id ``permutation[t]``
    equals the early-exit draft's logit for target id ``t`` and its law is the early-exit law,
    relabelled. The extra tokens' rows are zero in both; they never reach a draft: transformers prunes
    the assistant's head to the tokens both vocabularies share. ``config.vocab_size`` is the target's
    plus ``extra`` (transformers refuses ``assistant_tokenizer`` for an equal size), the embeddings are
    untied, and the ``generation_config`` is the assistant's own copy. The model is on
    ``target.device`` in the target's dtype. transformers' translator (built by ``universal_generator``,
    else by the first universal ``generate``; cached per tokenizer pair) then rewires the model in
    place: its head pruned to the shared tokens, its input embedding wrapped; so build a fresh
    assistant per target rather than reusing the model with another tokenizer.
    """
    from diagnostics.models import early_exit_model

    if target.tokenizer is None:
        raise ValueError("universal assisted decoding needs the target's tokenizer")
    shell = early_exit_model(target, layer).model
    tokenizer_size = len(target.tokenizer)
    model_size = int(target.model.config.get_text_config().vocab_size)
    base = max(model_size, tokenizer_size)
    permutation = token_permutation(target.tokenizer, seed) + list(range(tokenizer_size, base))  # padding rows stay
    tokenizer = permuted_tokenizer(target.tokenizer, permutation, first_extra=base, extra=extra)
    source = torch.tensor(permutation, device=target.device)  # assistant row permutation[t] <- target row t

    def moved(weight: torch.Tensor) -> torch.Tensor:
        rows = weight.new_zeros((base + extra, weight.shape[-1]))
        count = min(len(permutation), weight.shape[0])  # a tokenizer longer than the model: its extra ids have no row
        rows[source[:count]] = weight.detach()[:count]
        return rows

    embedding, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    with torch.no_grad():
        new_embedding = torch.nn.Embedding(base + extra, embedding.weight.shape[1], device=target.device,
                                           dtype=embedding.weight.dtype, padding_idx=embedding.padding_idx)
        new_embedding.weight.copy_(moved(embedding.weight))
        new_head = torch.nn.Linear(head.weight.shape[1], base + extra, bias=head.bias is not None, device=target.device,
                                   dtype=head.weight.dtype)
        new_head.weight.copy_(moved(head.weight))
        if head.bias is not None:
            new_head.bias.copy_(moved(head.bias[:, None])[:, 0])
    new_embedding.requires_grad_(False)
    new_head.requires_grad_(False)
    shell.config.vocab_size = base + extra
    shell.config.tie_word_embeddings = False
    shell.set_input_embeddings(new_embedding)
    shell.set_output_embeddings(new_head)
    shell.generation_config = copy.deepcopy(target.model.generation_config)
    return shell.eval(), tokenizer


def universal_generator(target: Any, assistant: Any, assistant_tokenizer: Any, policy: Policy, max_tokens: int,
                        eos: set[int], speculative: bool = True,
                        drafting: dict[str, Any] | None = None) -> Callable[[list[int], int], list[int]]:
    """transformers ``generate(assistant_model=assistant, tokenizer=target.tokenizer,
    assistant_tokenizer=...)`` under ``policy`` (``engines._sampling``: do_sample, every setting
    stated), ``torch.manual_seed(seed)`` per call; returns the new ids. ``drafting``: the assistant's
    ``hf_assisted.ASSISTANT_FIELDS`` (default: fixed γ = ``engines.GAMMA``, constant schedule, no
    confidence stop, as the ``transformers-assistant`` row). ``speculative=False``: the plain-sampling
    control of the transformers rows (batched over seeds), for the row's off column."""
    from diagnostics.hf_assisted import assistant_settings, counting_drafts, fixed_gamma
    from diagnostics.verdicts.engines import GAMMA, TRANSFORMERS_ROWS, _sampling, transformers_generator

    if not speculative:
        from types import SimpleNamespace

        return transformers_generator(TRANSFORMERS_ROWS[0], target, SimpleNamespace(model=assistant), 0, policy, max_tokens, eos,
                                      False)
    drafting = fixed_gamma(GAMMA) if drafting is None else drafting
    # transformers builds (and caches, per tokenizer pair) its translator on the first generate, and
    # pruning the head draws a fresh ``nn.Linear``'s init from the global RNG after our seed: built
    # here, every call of a seed draws the same tokens.
    from transformers.generation.candidate_generator import AssistantVocabTranslatorCache

    AssistantVocabTranslatorCache.get_translator(target.tokenizer, assistant_tokenizer,
                                                 target.model.config.get_text_config().vocab_size,
                                                 assistant_model=assistant, assistant_prune_lm_head=True)
    sampling = {**_sampling(policy), "max_new_tokens": max_tokens, "eos_token_id": sorted(eos), "pad_token_id": min(eos)}

    counters = {"drafted": 0, "accepted": 0, "generations": 0, "source": "transformers' candidate generator"}

    def run(prompt_ids: list[int], seed: int) -> list[int]:
        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids], device=target.device)
        with assistant_settings(assistant, drafting), counting_drafts(counters), torch.inference_mode():
            output = target.model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant,
                                           tokenizer=target.tokenizer, assistant_tokenizer=assistant_tokenizer, **sampling)
        counters["generations"] += 1
        return output[0, len(prompt_ids):].tolist()

    run.counters = counters  # type: ignore[attr-defined]  (the verdict table's proof that speculation ran)
    return run


def misplaced_draft_logits(translator: Any) -> int:
    """How many of the pruned assistant head's logits transformers' ``get_target_logits`` writes
    under another target id than the token that logit belongs to (0: ``q`` is reported right).

    With a pruned head (the assistant has tokens the target lacks), pruned row ``i`` is assistant id
    ``assistant_overlap_token_ids[i]`` (the order of ``assistant_tokenizer.get_vocab()``), but
    ``get_target_logits`` scatters row ``i`` to the ``i``-th target id in ASSISTANT-ID order."""
    if not getattr(translator, "assistant_prune_lm_head", False) or not hasattr(translator, "assistant_overlap_token_ids"):
        return 0
    to_target = translator._assistant_to_target_input_ids
    written = to_target[to_target != translator.SUPPRESS_TOKEN_ID]
    owner = to_target[translator.assistant_overlap_token_ids]
    return int((written != owner).sum())


@contextmanager
def corrected_draft_logits() -> Iterator[None]:
    """transformers' USD with ``get_target_logits`` fixed for the block: pruned row ``i`` lands on the
    target id of assistant id ``assistant_overlap_token_ids[i]``. A control for the verdict (the same
    generation with ``q`` reported as drawn), not an engine of the table."""
    from transformers.generation.candidate_generator import AssistantToTargetTranslator

    original = AssistantToTargetTranslator.get_target_logits

    def get_target_logits(self: Any, assistant_logits: torch.Tensor) -> torch.Tensor:
        if not self.assistant_prune_lm_head or not hasattr(self, "assistant_overlap_token_ids"):
            return original(self, assistant_logits)
        shape = (*assistant_logits.shape[:-1], self.target_vocab_size)
        logits = torch.full(shape, self.FILTER_VALUE, device=self._assistant_model_device)
        logits[..., self._assistant_to_target_input_ids[self.assistant_overlap_token_ids]] = assistant_logits.to(logits.dtype)
        return logits

    AssistantToTargetTranslator.get_target_logits = get_target_logits
    try:
        yield
    finally:
        AssistantToTargetTranslator.get_target_logits = original
