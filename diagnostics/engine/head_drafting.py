"""Chains drafted by a head that reads the target's hidden states (EAGLE-3, Medusa).

The target's stage taps the boundaries the head reads (``forward.DirectStage(taps=…)``), so the
verification forward of one round also gives the features of every token it fed; the row's
``TargetScorer`` keeps them for the committed tokens (``features``). With ``n`` committed tokens
the target has fed (at least) the first ``n − 1``, and:

* **EAGLE-3** runs its layer over the new pairs ``(g_s, x_{s+1})``, ``s ≤ n − 2`` (target features,
  its cache keeps them), then drafts autoregressively from its own outputs; the draft pairs are
  forgotten after the round (the next round recomputes them from the target's features). The
  layer runs as a ``HeadStage``: one call for every row waiting on it, each row's keys and values
  in its slot of a ``forward.SlotStore`` (rolling back is lowering the row's ``pairs``);
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
from diagnostics.engine.forward import Forward, Output, SlotStore, additive_mask, lock_step, padded_hidden, positions_of
from diagnostics.engine.tree_attention import TokenTree
from diagnostics.engine.tree_draft import DraftTree, TreeSpec, Uniform, finish, grow
from diagnostics.policy import Policy, probabilities

PLANTED = ("pairing_off_by_one", "wrong_taps")  # integration bugs for the audit (see ``diagnostics.heads.check``)


class HeadStage:
    """An EAGLE-3 head's layer for every row waiting on it, in one call (``Eagle3Head.step_rows``).

    A request feeds ``n`` pairs: ``tokens`` (embedded with the target's embeddings) and ``hidden``
    ``[n, H]`` (fused target features, or the head's own outputs), written at the row's cache rows
    ``start…`` at rotary ``positions`` (default ``start…``), seeing ``visible`` (default causal).
    It gets back the head's logits over the target's ids for its last ``keep`` inputs and its
    outputs ``o`` for all of them (``Output.hidden``)."""

    def __init__(self, head: Any, embed: Any, store: SlotStore, vocab: int, order: int = 0) -> None:
        self.head, self.embed, self.store, self.vocab, self.order = head, embed, store, vocab, order
        self.takes_hidden = self.keeps_hidden = True
        self.device = head.fc.weight.device

    @torch.inference_mode()
    def run(self, requests: list[Forward]) -> list[Output]:
        head = self.head
        device, dtype = head.fc.weight.device, head.fc.weight.dtype
        count = max(r.size for r in requests)
        ids = torch.tensor([list(r.tokens) + [0] * (count - r.size) for r in requests], dtype=torch.long, device=device)
        hidden = padded_hidden(requests, count).to(device=device, dtype=dtype)
        width = self.store.prepare([r.slot for r in requests], [r.start for r in requests], count, device)
        # One input per row at one common start: every key of the row is visible, no mask needed.
        mask = None if count == 1 and lock_step(requests) else additive_mask(requests, count, width, dtype, device)
        out = head.step_rows(self.embed(ids), hidden, positions_of(requests, count, device), mask, self.store)
        kept = torch.cat([out[row, r.size - r.keep : r.size] for row, r in enumerate(requests)])
        logits = torch.split(head.logits(kept, self.vocab), [r.keep for r in requests])
        return [Output(logits=row_logits, hidden=out[row, : r.size]) for row, (row_logits, r) in enumerate(zip(logits, requests))]


class MedusaStage:
    """Medusa heads for every row waiting on them, in one call per head (``MedusaHeads.logits_by_head``).

    A request's ``hidden`` ``[k, H]`` repeats the target's last-layer state (before its final norm)
    ``k`` times: input ``j`` goes to head ``j``. It gets back the logits of heads ``0 … k − 1`` ``[k, V]``.
    Heads keep no cache, so the slot and start are unused."""

    def __init__(self, heads: Any, norm: Any, order: int = 0) -> None:
        self.heads, self.norm, self.order = heads, norm, order
        self.takes_hidden, self.keeps_hidden = True, False
        self.device = norm.weight.device

    @torch.inference_mode()
    def run(self, requests: list[Forward]) -> list[Output]:
        count = max(r.size for r in requests)
        hidden = padded_hidden(requests, count)
        logits = self.heads.logits_by_head(self.norm(hidden.to(self.norm.weight.dtype)))
        return [Output(logits=logits[row, : r.size]) for row, r in enumerate(requests)]


class HeadDrafter:
    """One row's drafts from a ``heads.LoadedHead``, reading ``scorer.features``; the head runs on
    ``stage`` (``head_stage`` builds it, shared by a batch's rows), an EAGLE-3 head in the row's ``slot``."""

    def __init__(self, head: Any, scorer: Any, target: Any, policy: Policy, planted: str | None = None,
                 stage: Any = None, slot: int = 0) -> None:
        self.head, self.scorer, self.policy = head, scorer, policy
        self.name = head.name
        if stage is None:  # a row on its own: a stage of one slot
            stage = head_stage(head, target, 1, 64)
            slot = stage.store.attach() if head.kind == "eagle3" else 0
        self.stage, self.slot = stage, slot
        self.pairs = 0  # EAGLE-3 pairs in the head's cache computed from the target's features
        self.planted = planted

    def propose(self, committed: list[int], count: int, draw: Draw, vocab: int, eos: set[int]) -> Asks:
        features, known = self._features(committed)
        if features is None:
            return [], torch.empty(0, vocab, dtype=torch.float64, device=self.stage.device)
        if self.head.kind == "medusa":
            return (yield from self._medusa(features, known, count, draw, vocab, eos))
        return (yield from self._eagle3(committed, features, known, count, draw, vocab, eos))

    def _features(self, committed: list[int]) -> tuple[torch.Tensor | None, int]:
        """The target's features of positions ``0 … n − 2`` and ``n − 1`` (``known``); ``None`` before
        the target has scored them (the first round)."""
        features, known = self.scorer.features, len(committed) - 1
        if features is None or known < 1 or features.shape[0] < known:
            return None, known
        return features, known

    def _draw(self, logits: torch.Tensor, index: int, draw: Draw, vocab: int) -> tuple[int, torch.Tensor]:
        q_draft = probabilities(fit_vocabulary(logits, vocab), self.policy)
        return draw(q_draft, index), q_draft

    def _medusa_logits(self, features: torch.Tensor, known: int, count: int) -> Asks:
        """Logits of heads ``0 … count − 1`` at the state whose law gave the last committed token."""
        # planted: the state one position older than the one whose law gave the last committed token
        state = known - 2 if self.planted == "pairing_off_by_one" and known >= 2 else known - 1
        output = yield Forward(self.stage, self.slot, 0, hidden=features[state].expand(count, -1))
        return output.logits

    def _medusa(self, features: torch.Tensor, known: int, count: int, draw: Draw, vocab: int, eos: set[int]) -> Asks:
        count = min(count, self.head.module.config.medusa_num_heads)
        tokens, laws = [], []
        for index, logits in enumerate((yield from self._medusa_logits(features, known, count))):
            token, q_draft = self._draw(logits, index, draw, vocab)
            tokens.append(token)
            laws.append(q_draft)
            if token in eos:
                break
        return tokens, torch.stack(laws)

    def _eagle3(self, committed: list[int], features: torch.Tensor, known: int, count: int, draw: Draw, vocab: int,
                eos: set[int]) -> Asks:
        logits, last = yield from self._pairs_output(committed, features, known)
        tokens, laws = [], []
        for index in range(count):
            token, q_draft = self._draw(logits, index, draw, vocab)
            tokens.append(token)
            laws.append(q_draft)
            if token in eos or index == count - 1:
                break
            output = yield Forward(self.stage, self.slot, known + index, tokens=[token], hidden=last[None])
            logits, last = output.logits[0], output.hidden[-1]
        return tokens, torch.stack(laws)  # the draft pairs' rows are overwritten next round

    def _pairs_output(self, committed: list[int], features: torch.Tensor, known: int) -> Asks:
        """EAGLE-3: run the head over the pairs ``(g_s, x_{s+1})`` not yet cached, ``s < known``; the
        last one's logits and output."""
        start = min(self.pairs, known - 1)  # at least the last pair, whose output the drafts start from
        shift = 0 if self.planted == "pairing_off_by_one" else 1  # planted: g_s paired with x_s instead of x_{s+1}
        with torch.inference_mode():
            fused = self.head.module.fuse(features[start:known])
        output = yield Forward(self.stage, self.slot, start, tokens=committed[start + shift : known + shift], hidden=fused)
        self.pairs = known
        return output.logits[0], output.hidden[-1]

    def commit(self, length: int) -> None:
        """``length`` tokens are committed: the pairs that read only committed tokens stay cached."""
        self.pairs = min(self.pairs, max(0, length - 1))

    def propose_tree(self, committed: list[int], spec: TreeSpec, uniform: Uniform, vocab: int, eos: set[int]) -> Asks:
        """A tree of drafts (``tree_draft.grow``: fixed shapes, sampled children, budget trees).

        Medusa: every node at depth ``d`` gets head ``d``'s law (heads do not read the path), so the
        tree is at most ``medusa_num_heads`` deep. EAGLE-3: a level's nodes run through the head at
        once, each on its parent's output and its own token, at position ``n − 2 + depth``, seeing
        the committed pairs, its ancestors and itself (a tree mask in the head's attention)."""
        features, known = self._features(committed)
        if features is None:
            return _empty_tree(vocab, self.stage.device)
        if self.head.kind == "medusa":
            spec = spec.limited(self.head.module.config.medusa_num_heads)
            laws = [probabilities(fit_vocabulary(logits, vocab), self.policy)
                    for logits in (yield from self._medusa_logits(features, known, spec.max_depth))]

            def expand_medusa(built, level: list[int]):
                yield from ()
                return [laws[built.depths[node]] for node in level]  # children of a depth-d node: head d

            built = yield from grow(spec, laws[0], expand_medusa, uniform, eos)
            return finish(built, spec, vocab, 0)
        return (yield from self._eagle3_tree(committed, features, known, spec, uniform, vocab, eos))

    def _eagle3_tree(self, committed: list[int], features: torch.Tensor, known: int, spec: TreeSpec, uniform: Uniform,
                     vocab: int, eos: set[int]) -> Asks:
        root_logits, root = yield from self._pairs_output(committed, features, known)
        outputs = {-1: root}
        root_law = probabilities(fit_vocabulary(root_logits, vocab), self.policy)

        def expand_eagle(built, level: list[int]):
            first = level[0]  # nodes are fed in creation order: cache rows known + node
            # Each node sees the prefix, itself and its ancestors: the rows as host lists, one tensor on the device.
            sees = [[True] * known + [False] * (first + len(level)) for _ in level]
            for row, node in enumerate(level):
                ancestor = node
                while ancestor >= 0:
                    sees[row][known + ancestor] = True
                    ancestor = built.parents[ancestor]
            device = self.stage.device
            output = yield Forward(self.stage, self.slot, known + first, tokens=[built.tokens[node] for node in level],
                                   hidden=torch.stack([outputs[built.parents[node]] for node in level]),
                                   positions=torch.tensor([known - 1 + built.depths[node] for node in level], device=device),
                                   visible=torch.tensor(sees, dtype=torch.bool, device=device), keep=len(level))
            for node, row in zip(level, output.hidden):
                outputs[node] = row
            return list(probabilities(fit_vocabulary(output.logits, vocab), self.policy))

        built = yield from grow(spec, root_law, expand_eagle, uniform, eos)
        return finish(built, spec, vocab, 0)

    def commit_tree(self, prefix_length: int, draft: DraftTree, path: list[int]) -> None:
        """The round's draft pairs are forgotten; the next round pairs the target's features of the path."""
        self.commit(prefix_length)


def head_stage(head: Any, target: Any, rows: int, capacity: int) -> HeadStage | MedusaStage:
    """The stage a batch's rows run ``head`` on: an EAGLE-3 head's layer with a slot per row, or Medusa's heads."""
    if head.kind == "medusa":
        return MedusaStage(head.module, target.model.model.norm)
    return HeadStage(head.module, target.model.get_input_embeddings(), SlotStore(rows, capacity), int(target.vocab_size))


def _empty_tree(vocab: int, device: torch.device) -> DraftTree:
    """No drafts (the first round, before the target has scored anything): the target emits alone."""
    return DraftTree(tree=TokenTree(parents=(), tokens=()), q_laws=torch.zeros(1, vocab, dtype=torch.float64, device=device),
                     q_token=[], u_draft=[], cache_rows=[])


__all__ = ["HeadDrafter", "HeadStage", "MedusaStage", "PLANTED", "head_stage"]
