"""Chains drafted by a head that reads the target's hidden states (EAGLE-3, Medusa).

The target's stage taps the boundaries the head reads (``forward.DirectStage(taps=…)``), so the
verification forward of one round also gives the features of every token it fed; the row's
``TargetScorer`` keeps them for the committed tokens (``features``). With ``n`` committed tokens
the target has fed (at least) the first ``n − 1``, and:

* **EAGLE-3** runs its layer over the new pairs ``(g_s, x_{s+1})``, ``s ≤ n − 2`` (target features,
  its cache keeps them), then drafts autoregressively from its own outputs; the draft pairs are
  forgotten after the round (the next round recomputes them from the target's features);
* **Medusa** applies head ``k`` to the target's normed last hidden state at ``n − 2`` (the state
  whose law gave the last committed token) for draft ``k + 1``.

In the first round nothing has been fed yet: the row drafts nothing and the target alone emits
the first token (as EAGLE and Medusa do). ``q`` is always the law the draft was drawn from (the
head's logits under the draft policy), so every rule and record works unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from diagnostics.engine.drafting import Asks, Draw, fit_vocabulary
from diagnostics.heads.eagle3 import HeadCache
from diagnostics.policy import Policy, probabilities

PLANTED = ("pairing_off_by_one", "wrong_taps")  # integration bugs for the audit (see ``diagnostics.heads.check``)


class HeadDrafter:
    """One row's drafts from a ``heads.LoadedHead``, reading ``scorer.features``."""

    def __init__(self, head: Any, scorer: Any, target: Any, policy: Policy, planted: str | None = None) -> None:
        self.head, self.scorer, self.policy = head, scorer, policy
        self.name = head.name
        self.embed = target.model.get_input_embeddings()
        self.norm = target.model.model.norm
        self.cache = HeadCache()
        self.pairs = 0  # EAGLE-3 pairs in the head's cache computed from the target's features
        self.planted = planted

    def propose(self, committed: list[int], count: int, draw: Draw, vocab: int, eos: set[int]) -> Asks:
        yield from ()
        features = self.scorer.features
        known = len(committed) - 1  # features needed: positions 0 … n − 2
        if features is None or known < 1 or features.shape[0] < known:
            return [], torch.empty(0, vocab, dtype=torch.float64)
        if self.head.kind == "medusa":
            return self._medusa(features, known, count, draw, vocab, eos)
        return self._eagle3(committed, features, known, count, draw, vocab, eos)

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        return self.embed(torch.tensor(tokens, dtype=torch.long, device=self.embed.weight.device))

    def _draw(self, logits: torch.Tensor, index: int, draw: Draw, vocab: int) -> tuple[int, torch.Tensor]:
        q_draft = probabilities(fit_vocabulary(logits, vocab), self.policy)
        return draw(q_draft, index), q_draft

    @torch.inference_mode()
    def _medusa(self, features: torch.Tensor, known: int, count: int, draw: Draw, vocab: int, eos: set[int]):
        heads = self.head.module
        count = min(count, heads.config.medusa_num_heads)
        # planted: the state one position older than the one whose law gave the last committed token
        state = known - 2 if self.planted == "pairing_off_by_one" and known >= 2 else known - 1
        hidden = self.norm(features[state].to(self.norm.weight.dtype))
        tokens, laws = [], []
        for index, logits in enumerate(heads.logits(hidden, count)):
            token, q_draft = self._draw(logits, index, draw, vocab)
            tokens.append(token)
            laws.append(q_draft)
            if token in eos:
                break
        return tokens, torch.stack(laws)

    @torch.inference_mode()
    def _eagle3(self, committed: list[int], features: torch.Tensor, known: int, count: int, draw: Draw, vocab: int,
                eos: set[int]):
        head = self.head.module
        start = min(self.pairs, known)
        shift = 0 if self.planted == "pairing_off_by_one" else 1  # planted: g_s paired with x_s instead of x_{s+1}
        if start < known:
            fused = head.fuse(features[start:known])
            last = head.step(self._embed(committed[start + shift : known + shift]), fused, start, self.cache)[-1]
        else:  # every pair is cached: recompute the last one's output (its keys are already there)
            fused = head.fuse(features[known - 1 : known])
            last = head.step(self._embed(committed[known - 1 + shift : known + shift]), fused, known - 1, self.cache)[-1]
        self.pairs = known
        tokens, laws = [], []
        for index in range(count):
            token, q_draft = self._draw(head.logits(last, vocab), index, draw, vocab)
            tokens.append(token)
            laws.append(q_draft)
            if token in eos or index == count - 1:
                break
            last = head.step(self._embed([token]), last[None], known + index, self.cache)[-1]
        self.cache.cut(self.pairs)  # the draft pairs go; the next round pairs the target's own features
        return tokens, torch.stack(laws)

    def commit(self, length: int) -> None:
        """``length`` tokens are committed: the pairs that read only committed tokens stay cached."""
        self.pairs = min(self.pairs, max(0, length - 1))
        self.cache.cut(self.pairs)


__all__ = ["HeadDrafter", "PLANTED"]
