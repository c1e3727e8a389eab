"""Row-level drafters and the target scorer: what one sequence asks of the batched forwards.

A drafter proposes up to ``count`` tokens after the committed sequence and returns the law each
was drawn from (``q``, over the target's vocabulary). Randomness comes from the engine through
``draw(q, index)``, so the drafters hold no random state of their own.

Every method that needs a model is a generator: it yields ``forward.Forward`` requests and gets
back ``forward.Output`` (``diagnostics.engine.batch`` runs the requests of many rows in one
call). A row knows how many of its tokens its slot holds (``cached``); rolling back is lowering
that number, and the next request overwrites what was refused.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

import torch

from diagnostics.engine.forward import Forward, Output
from diagnostics.engine.tree_attention import TokenTree, tree_inputs
from diagnostics.engine.tree_draft import DraftTree, TreeDraftingModel, TreeSpec, Uniform, ngram_tree
from diagnostics.policy import Policy, probabilities

Draw = Callable[[torch.Tensor, int], int]
Asks = Generator[Forward, Output, Any]  # a row's requests; the value it returns is the answer


def fit_vocabulary(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits over exactly ``vocab`` ids: extra rows dropped, missing ids padded with ``-inf``.

    Dropping happens *before* the policy and sampling, so the law returned for a draft is still
    the law its token was drawn from; padded ids get probability 0 and are never drafted.
    """
    size = logits.shape[-1]
    if size == vocab:
        return logits
    if size > vocab:
        return logits[..., :vocab]
    pad = torch.full((*logits.shape[:-1], vocab - size), -torch.inf, dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=-1)


class TargetScorer:
    """Scores ``γ + 1`` positions in one forward: after the committed prefix and after each draft.

    For a tree, ``score_tree`` scores the root and every node in one forward under the tree mask
    (``diagnostics.engine.tree_attention``), and ``keep_path`` then keeps the prefix and the
    accepted path's rows of the slot. ``rollback``, ``tree_inputs`` and ``path_rows`` are the
    steps an audit's planted bug may replace in a subclass.
    """

    def __init__(self, stage: Any, slot: int) -> None:
        self.stage, self.slot = stage, slot
        self.cached = 0  # tokens of this row whose keys and values the slot holds
        self._features: torch.Tensor | None = None  # [≥ cached, k·H] when the stage taps hidden states

    @property
    def features(self) -> torch.Tensor | None:
        """The tapped hidden states of the cached tokens ``[cached, k·H]`` (a draft head's input), if tapped."""
        return None if self._features is None else self._features[: self.cached]

    def _keep_features(self, start: int, output: Output) -> None:
        if output.taps is not None:
            self._features = output.taps if start == 0 or self._features is None else torch.cat([self._features[:start], output.taps])

    def score(self, committed: list[int], drafts: list[int]) -> Asks:
        """Logits ``[len(drafts) + 1, V]``: after ``committed`` and after each draft."""
        feed = committed[self.cached :] + drafts
        output = yield Forward(self.stage, self.slot, self.cached, tokens=feed, keep=len(drafts) + 1)
        self._keep_features(self.cached, output)
        self.cached += len(feed)
        return output.logits

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` cached tokens (the committed prefix); the rest is overwritten next."""
        self.cached = min(self.cached, length)

    tree_inputs = staticmethod(tree_inputs)

    @staticmethod
    def tree_positions(prefix_lengths: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` rotary positions of every row's tree nodes in the round program: node ``i`` of row ``b``
        (``prefix_lengths[b]`` committed tokens, ``depths`` ``[B, N]``) sits at ``prefix_lengths[b] − 1 + depths[b, i]``
        (as ``tree_inputs``)."""
        return prefix_lengths[:, None] - 1 + depths

    @staticmethod
    def path_rows(prefix_length: int, tree: TokenTree, path: list[int]) -> list[int]:
        """Cache rows to keep after a round: the prefix, then each accepted node's row in path order."""
        return list(range(prefix_length)) + [prefix_length + node for node in path]

    def score_tree(self, committed: list[int], tree: TokenTree) -> Asks:
        """Logits ``[N + 1, V]``: row 0 after ``committed`` (the root), row ``i + 1`` after the path to node ``i``."""
        feed = committed[self.cached :]
        if not tree.tokens:
            output = yield Forward(self.stage, self.slot, self.cached, tokens=feed, keep=1)
            self._keep_features(self.cached, output)
            self.cached += len(feed)
            return output.logits
        mask, positions = self.tree_inputs(len(committed), tree, torch.float32, self.cached, device=self.stage.device)
        output = yield Forward(self.stage, self.slot, self.cached, tokens=feed + list(tree.tokens),
                               positions=positions[0], visible=mask[0, 0] == 0, keep=len(tree.tokens) + 1)
        self._keep_features(self.cached, output)
        self.cached = len(committed) + len(tree.tokens)
        return output.logits

    def keep_path(self, prefix_length: int, tree: TokenTree, path: list[int]) -> None:
        """Gather the prefix and the accepted path's rows; every other node's keys and values go."""
        rows = self.path_rows(prefix_length, tree, path)
        if rows != list(range(len(rows))):
            self.stage.keep_rows(self.slot, rows)
            if self._features is not None:  # a draft head's features follow the same rows
                self._features = self._features[torch.tensor(rows, dtype=torch.long, device=self._features.device)]
        self.cached = len(rows)


def unsure(q_draft: torch.Tensor, token: int, draft_stop: float | None) -> bool:
    """Adaptive drafting: stop the block after the draft ``x`` when ``q(x) < draft_stop``, the draft's
    own confidence in the token it just drew (transformers' ``assistant_confidence_threshold``).

    The decision reads the draft's law and draw only, never ``p`` or a coin of the verifier, so
    which tokens get verified is a function of the draft alone and the output law stays exact.
    """
    return draft_stop is not None and float(q_draft[token]) < draft_stop


class Drafter(Protocol):
    name: str

    def propose(self, committed: list[int], count: int, draw: Draw, vocab: int, eos: set[int]) -> Asks:
        """Up to ``count`` draft tokens after ``committed`` and their laws ``[n, vocab]`` (a generator)."""

    def commit(self, length: int) -> None:
        """The first ``length`` tokens of the last proposal's context are now committed."""


class ModelDrafter:
    """One row of a separate draft model (or the target's early exit) sampled autoregressively."""

    def __init__(self, stage: Any, slot: int, policy: Policy, name: str, draft_stop: float | None = None) -> None:
        self.stage, self.slot = stage, slot
        self.cached = 0
        self.policy = policy
        self.name = name
        self.draft_stop = draft_stop  # end the block after a draft x with q(x) below this
        self.trees = TreeDraftingModel(self, policy, fit_vocabulary)

    def forward(self, tokens: list[int], keep: int, positions: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> Asks:
        """Feed ``tokens`` after the cached ones; logits of the last ``keep`` ``[keep, V]``."""
        output = yield Forward(self.stage, self.slot, self.cached, tokens=tokens, keep=keep, positions=positions, visible=visible)
        self.cached += len(tokens)
        return output.logits

    def propose_tree(self, committed: list[int], spec: TreeSpec, uniform: Uniform, vocab: int, eos: set[int]) -> Asks:
        """A tree of drafts after ``committed`` (see ``diagnostics.engine.tree_draft``)."""
        return (yield from self.trees.propose(committed, spec, uniform, vocab, eos))

    def commit_tree(self, prefix_length: int, draft: DraftTree, path: list[int]) -> None:
        """The prefix and the accepted path's nodes are committed; every other node is forgotten."""
        self.trees.commit(prefix_length, draft, path)

    def propose(self, committed: list[int], count: int, draw: Draw, vocab: int, eos: set[int]) -> Asks:
        tokens: list[int] = []
        laws: list[torch.Tensor] = []
        feed = committed[self.cached :]
        for index in range(count):
            logits = fit_vocabulary((yield from self.forward(feed, keep=1))[0], vocab)
            q_draft = probabilities(logits, self.policy)
            token = draw(q_draft, index)
            tokens.append(token)
            laws.append(q_draft)
            if token in eos or unsure(q_draft, token, self.draft_stop):
                break  # anything drafted after EOS could never be emitted
            feed = [token]
        # The last drafted token was never fed: the slot holds committed + tokens[:-1].
        return tokens, torch.stack(laws) if laws else torch.empty(0, vocab, dtype=torch.float64, device=self.stage.device)

    def commit(self, length: int) -> None:
        self.cached = min(self.cached, length)


class NgramDrafter:
    """Prompt lookup: copy what followed the latest earlier occurrence of the context's last n-gram.

    Tries ``n``, then shorter n-grams down to 1. The proposal is deterministic, so each draft's
    law is a point mass ``q = δ_x``. It asks no model for anything; its laws are built on ``device``
    (the target's), where they are verified.
    """

    def __init__(self, n: int, device: torch.device | str) -> None:
        self.n = n
        self.name = f"ngram:{n}"
        self.device = torch.device(device)

    def propose_tree(self, committed: list[int], spec: TreeSpec, uniform: Uniform, vocab: int, eos: set[int]) -> Asks:
        """A trie of the continuations of several earlier matches (see ``tree_draft.ngram_tree``)."""
        yield from ()
        return ngram_tree(committed, self.n, spec, vocab, eos, self.device)

    def commit_tree(self, prefix_length: int, draft: DraftTree, path: list[int]) -> None:
        return None

    def propose(self, committed: list[int], count: int, draw: Draw, vocab: int, eos: set[int]) -> Asks:
        yield from ()
        tokens = self._lookup(committed, count)
        for index, token in enumerate(tokens):
            if token in eos:
                tokens = tokens[: index + 1]
                break
        laws = torch.zeros(len(tokens), vocab, dtype=torch.float64, device=self.device)
        if tokens:
            laws[torch.arange(len(tokens), device=self.device), torch.tensor(tokens, device=self.device)] = 1.0
        return tokens, laws

    def _lookup(self, context: list[int], count: int) -> list[int]:
        if count <= 0:
            return []
        length = len(context)
        for size in range(min(self.n, length - 1), 0, -1):
            suffix = context[length - size :]
            # Latest earlier occurrence whose continuation is non-empty.
            for start in range(length - size - 1, -1, -1):
                if context[start : start + size] == suffix:
                    continuation = context[start + size : start + size + count]
                    if continuation:
                        return continuation
        return []

    def commit(self, length: int) -> None:
        return None
