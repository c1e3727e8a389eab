"""Early-exit self-speculation that does not pay twice for the shared layers (LayerSkip-style).

The ``early-exit:L`` draft *is* the target's first ``L`` layers followed by its final norm and
head. So one KV cache serves both: layers ``1..L`` hold the keys and values of every token fed
while drafting, and the hidden state after layer ``L`` of each fed token is kept. Verification
then runs only layers ``L+1..N`` on those hidden states (plus the last draft, which the drafting
loop never fed), instead of all ``N`` layers on the ``γ + 1`` tokens again.

Exactness: every layer sees the same inputs, positions and keys as in a plain forward over the
committed sequence and the drafts, so ``p`` equals a plain forward's ``p`` to float rounding
(``tests/test_self_speculation.py`` compares them position by position), and ``q`` is the
early-exit draft's law as before. The loop, the rules and the uniforms do not change.

Supported where ``diagnostics.fast_forward`` runs the model's layers directly (Llama, Mistral
without a window, Qwen2); any other model, a planted scorer in an audit, or a tree round keeps
the two separate forwards (``supports_layer_reuse``).
"""

from __future__ import annotations

from typing import Any

import torch

from diagnostics.fast_forward import DecoderParts, supports_direct_forward
from diagnostics.models import LoadedModel
from diagnostics.policy import Policy, probabilities

def shares_layers(target: LoadedModel, draft: LoadedModel) -> int | None:
    """``L`` when ``draft`` is ``early_exit_model(target, L)`` (the same layer objects, fewer of them), else ``None``."""
    target_inner, draft_inner = getattr(target.model, "model", None), getattr(draft.model, "model", None)
    if target_inner is None or draft_inner is None or getattr(draft_inner, "layers", None) is None:
        return None
    if draft_inner.layers is not getattr(target_inner, "layers", None):
        return None
    if draft.model.get_output_embeddings() is not target.model.get_output_embeddings():
        return None
    layer = int(draft.model.config.num_hidden_layers)
    return layer if 1 <= layer < target.num_layers else None


def supports_layer_reuse(target: LoadedModel) -> bool:
    """Whether the split reproduces this target's forward (``fast_forward.supports_direct_forward``)."""
    return supports_direct_forward(target)


class LayerSplitModel:
    """The target split after layer ``L``, with one KV cache for all its layers.

    ``low_cached`` tokens have been through layers ``1..L``, ``high_cached`` through ``L+1..N``;
    ``pending`` holds the hidden states after layer ``L`` of the tokens in between, waiting for
    the upper layers.
    """

    def __init__(self, target: LoadedModel, layer: int) -> None:
        from transformers import DynamicCache

        self.parts = DecoderParts(target)
        self.layer = layer
        self.lower, self.upper = self.parts.layers[:layer], self.parts.layers[layer:]
        self.cache = DynamicCache(config=target.model.config)
        self.low_cached = 0
        self.high_cached = 0
        self.pending: list[torch.Tensor] = []

    @torch.inference_mode()
    def lower_forward(self, tokens: list[int]) -> torch.Tensor:
        """Feed ``tokens`` through layers ``1..L``; their hidden states after layer ``L`` ``[1, m, H]``
        (also kept for the upper layers)."""
        hidden = self.parts.run(self.parts.embed_tokens(tokens), self.low_cached, self.lower, self.cache)
        self.low_cached += len(tokens)
        self.pending.append(hidden)
        return hidden

    @torch.inference_mode()
    def upper_forward(self, keep: int) -> torch.Tensor:
        """Run every pending hidden state through layers ``L+1..N``; the target's logits of the last ``keep``, ``[keep, V]``."""
        hidden = torch.cat(self.pending, dim=1) if len(self.pending) > 1 else self.pending[0]
        self.pending = []
        hidden = self.parts.run(hidden, self.high_cached, self.upper, self.cache)
        self.high_cached = self.low_cached
        return self.logits(hidden[:, -keep:])[0]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm and head on hidden states (after layer ``L`` for the draft, ``N`` for the target), as float32."""
        return self.parts.logits(hidden)

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` tokens in every layer's cache; forget pending states beyond them."""
        if length < self.low_cached:
            keep = max(0, length - self.high_cached)
            pending = torch.cat(self.pending, dim=1) if self.pending else None
            self.pending = [pending[:, :keep]] if pending is not None and keep else []
            self.low_cached = length
        self.high_cached = min(self.high_cached, length)
        for cached_layer in self.cache.layers:  # lower and upper layers may hold different lengths
            surplus = cached_layer.get_seq_length() - length
            if surplus > 0:
                cached_layer.crop(-surplus)  # transformers >= 5: a negative count removes that many


class SelfDrafter:
    """The early-exit draft on a ``LayerSplitModel``: ``q`` from the hidden state after layer ``L``."""

    def __init__(self, split: LayerSplitModel, policy: Policy, name: str, draft_stop: float | None = None) -> None:
        self.split = split
        self.policy = policy
        self.name = name
        self.draft_stop = draft_stop

    def propose(self, committed: list[int], count: int, draw, vocab: int, eos: set[int]) -> tuple[list[int], torch.Tensor]:
        from diagnostics.drafters import fit_vocabulary, unsure

        tokens: list[int] = []
        laws: list[torch.Tensor] = []
        feed = committed[self.split.low_cached :]
        for index in range(count):
            hidden = self.split.lower_forward(feed)
            q_draft = probabilities(fit_vocabulary(self.split.logits(hidden[:, -1:])[0, 0], vocab), self.policy)
            token = draw(q_draft, index)
            tokens.append(token)
            laws.append(q_draft)
            if token in eos or unsure(q_draft, token, self.draft_stop):
                break
            feed = [token]
        return tokens, torch.stack(laws) if laws else torch.empty(0, vocab, dtype=torch.float64)

    def commit(self, length: int) -> None:
        self.split.rollback(length)


class SplitScorer:
    """The target's scorer on a ``LayerSplitModel``: the unfed tokens through layers ``1..L``, then
    everything pending through ``L+1..N`` in one forward."""

    def __init__(self, split: LayerSplitModel) -> None:
        self.split = split

    def score(self, committed: list[int], drafts: list[int]) -> torch.Tensor:
        """Logits ``[len(drafts) + 1, V]``: after ``committed`` and after each draft (as ``TargetScorer.score``)."""
        sequence = committed + drafts
        if len(sequence) > self.split.low_cached:
            self.split.lower_forward(sequence[self.split.low_cached :])
        return self.split.upper_forward(keep=len(drafts) + 1)

    def rollback(self, length: int) -> None:
        self.split.rollback(length)


def reusing_pair(target: LoadedModel, drafter: Any, scorer_type: type) -> tuple[SelfDrafter, SplitScorer] | None:
    """The drafter and scorer sharing one split model when ``drafter`` is the target's early exit
    and the engine's scorer is the plain one (an audit's planted scorer keeps its own forward)."""
    from diagnostics.drafters import ModelDrafter, TargetScorer

    if scorer_type is not TargetScorer or not isinstance(drafter, ModelDrafter) or not supports_layer_reuse(target):
        return None
    layer = shares_layers(target, drafter.model.loaded)
    if layer is None:
        return None
    split = LayerSplitModel(target, layer)
    return SelfDrafter(split, drafter.policy, drafter.name, drafter.draft_stop), SplitScorer(split)
