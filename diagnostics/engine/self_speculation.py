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

Supported where ``diagnostics.engine.fast_forward`` runs the model's layers directly (Llama, Mistral
without a window, Qwen2); any other model, a planted scorer in an audit, or a tree round keeps
the two separate forwards (``supports_layer_reuse``). In a batch, every row's lower and upper
halves run as two batched stages over one slot store (``SplitStages``).
"""

from __future__ import annotations

import torch

from diagnostics.engine.fast_forward import DecoderParts, supports_direct_forward
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


class SplitStages:
    """The target split after layer ``L`` as two batched stages over one slot store: ``lower``
    (tokens through layers ``1..L``, returning their hidden states and the draft's logits of the
    last) and ``upper`` (hidden states through ``L+1..N``, returning the target's logits)."""

    def __init__(self, target: LoadedModel, layer: int, rows: int, capacity: int) -> None:
        from diagnostics.engine.forward import DirectStage, SlotStore

        parts = DecoderParts(target)
        self.store = SlotStore(rows, capacity)
        self.layer = layer
        self.lower = DirectStage(parts, self.store, parts.layers[:layer], order=0, keeps_hidden=True)
        self.upper = DirectStage(parts, self.store, parts.layers[layer:], order=1, takes_hidden=True)


class LayerSplitRow:
    """One row of the split model: ``low_cached`` tokens have been through layers ``1..L``,
    ``high_cached`` through ``L+1..N``; ``pending`` holds the hidden states after layer ``L`` of the
    tokens in between, waiting for the upper layers. Both halves write the row's one slot."""

    def __init__(self, stages: SplitStages, slot: int) -> None:
        self.stages, self.slot = stages, slot
        self.low_cached = 0
        self.high_cached = 0
        self.pending: list[torch.Tensor] = []

    def lower_forward(self, tokens: list[int]):
        """Feed ``tokens`` through layers ``1..L`` (kept pending for the upper layers); the draft's logits of the last ``[1, V]``."""
        from diagnostics.engine.forward import Forward

        output = yield Forward(self.stages.lower, self.slot, self.low_cached, tokens=tokens, keep=1)
        self.low_cached += len(tokens)
        self.pending.append(output.hidden)
        return output.logits

    def upper_forward(self, keep: int):
        """Run every pending hidden state through layers ``L+1..N``; the target's logits of the last ``keep``, ``[keep, V]``."""
        from diagnostics.engine.forward import Forward

        hidden = torch.cat(self.pending, dim=0) if len(self.pending) > 1 else self.pending[0]
        self.pending = []
        output = yield Forward(self.stages.upper, self.slot, self.high_cached, hidden=hidden, keep=keep)
        self.high_cached = self.low_cached
        return output.logits

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` tokens in every layer; forget pending states beyond them."""
        if length < self.low_cached:
            keep = max(0, length - self.high_cached)
            pending = torch.cat(self.pending, dim=0) if self.pending else None
            self.pending = [pending[:keep]] if pending is not None and keep else []
            self.low_cached = length
        self.high_cached = min(self.high_cached, length)


class SelfDrafter:
    """The early-exit draft on a ``LayerSplitRow``: ``q`` from the hidden state after layer ``L``."""

    def __init__(self, split: LayerSplitRow, policy: Policy, name: str, draft_stop: float | None = None) -> None:
        self.split = split
        self.policy = policy
        self.name = name
        self.draft_stop = draft_stop

    def propose(self, committed: list[int], count: int, draw, vocab: int, eos: set[int]):
        from diagnostics.engine.drafting import fit_vocabulary, unsure

        tokens: list[int] = []
        laws: list[torch.Tensor] = []
        feed = committed[self.split.low_cached :]
        for index in range(count):
            logits = yield from self.split.lower_forward(feed)
            q_draft = probabilities(fit_vocabulary(logits[0], vocab), self.policy)
            token = draw(q_draft, index)
            tokens.append(token)
            laws.append(q_draft)
            if token in eos or unsure(q_draft, token, self.draft_stop):
                break
            feed = [token]
        device = self.split.stages.lower.device
        return tokens, torch.stack(laws) if laws else torch.empty(0, vocab, dtype=torch.float64, device=device)

    def commit(self, length: int) -> None:
        self.split.rollback(length)


class SplitScorer:
    """The target's scorer on a ``LayerSplitRow``: the unfed tokens through layers ``1..L``, then
    everything pending through ``L+1..N`` in one forward."""

    def __init__(self, split: LayerSplitRow) -> None:
        self.split = split

    def score(self, committed: list[int], drafts: list[int]):
        """Logits ``[len(drafts) + 1, V]``: after ``committed`` and after each draft (as ``TargetScorer.score``)."""
        sequence = committed + drafts
        if len(sequence) > self.split.low_cached:
            yield from self.split.lower_forward(sequence[self.split.low_cached :])
        return (yield from self.split.upper_forward(keep=len(drafts) + 1))

    def rollback(self, length: int) -> None:
        self.split.rollback(length)


def split_layer(target: LoadedModel, draft: LoadedModel, scorer_type: type) -> int | None:
    """``L`` when the draft is the target's early exit ``L``, the target's family runs split
    (``supports_layer_reuse``) and the engine's scorer is the plain one (an audit's planted scorer
    keeps its own forward); else ``None``."""
    from diagnostics.engine.drafting import TargetScorer

    if scorer_type is not TargetScorer or not supports_layer_reuse(target):
        return None
    return shares_layers(target, draft)
