"""Drafting every row's tree of a round at once, on the template (the tree round program's first half).

``TreeProgram`` (``tree_program``) mixes this in. A fixed shape (``_draft_fixed``) fills its template level
by level: each level's children of every row (top choices or sampled draws, ``tree_verify.top_children`` /
``sampled_children``), which exist in each row, and one draft forward of the level under the tree mask
(``_expand``). A budget tree (``_draft_budget``) keeps, level by level, the candidates that rank among the
``N`` best paths, then the ``N`` best nodes. A prompt-lookup trie (``_lookup_trees``) is found on the host.
Every result is a ``Drafted``: each row's tree numbered as the reference drafter (``tree_draft.grow``)
numbers it. The reference is ``tree_draft``; ``tests/test_tree_program.py`` compares the two.

The mixin reads the program's ``pair``, ``seams``, ``device``, ``vocab``, ``eos``, ``spec``, ``mode``,
``lookup``, ``depth``, ``nodes``, and for fixed shapes ``template``, ``parents``, ``siblings``,
``ancestors`` and ``widths`` (set by ``TreeProgram.__init__``), and its ``_forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from diagnostics.engine.drafting import fit_vocabulary
from diagnostics.engine.forward import Block
from diagnostics.engine.tree_draft import ngram_trie
from diagnostics.engine.tree_verify import sampled_children, top_children
from diagnostics.policy import probabilities
from diagnostics.rng import SLOTS

if TYPE_CHECKING:
    from diagnostics.engine.chain_program import _Row

DRAFT = SLOTS["draft"]


@dataclass
class Drafted:
    """Every row's tree of one round ``[B, N]``, numbered as the per-row drafter numbers it (with gaps where
    a row lacks a template node): tokens, which nodes exist, parents (−1: the root), depths, ``q`` of each
    token at its parent, the draft uniform of a sampled node (nan: a top choice), the draft laws
    ``[B, N + 1, V]`` (0: the root) and each node's draft cache column after the prefix."""

    tokens: torch.Tensor
    valid: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    q_token: torch.Tensor
    u_draft: torch.Tensor
    q_laws: torch.Tensor
    columns: torch.Tensor


class TreeDrafting:
    """Drafting every row's tree on the template (see the module docstring)."""

    def _draft(self, rows: list[_Row], groups: list[tuple[int, int]], uniforms: torch.Tensor, row_depth: torch.Tensor,
               prefix: torch.Tensor) -> Drafted:
        """Every row's tree: the root's law from one forward of the pending tokens, then the levels (a
        prompt-lookup trie: found on the host, no forward)."""
        if self.lookup is not None:
            return self._lookup_trees(rows, row_depth)
        feeds = [row.committed[row.draft_cached:] for row in rows]
        output = self._forward(self.pair.draft_stage, [row.draft_slot for row in rows],
                               [row.draft_cached for row in rows], feeds, 1)
        for row, feed in zip(rows, feeds):
            row.draft_cached += len(feed)
        root = self._draft_laws(fit_vocabulary(output.logits[:, 0], self.vocab), rows, groups)
        if self.spec.fixed:
            return self._draft_fixed(rows, groups, uniforms, row_depth, prefix, root)
        return self._draft_budget(rows, groups, row_depth, prefix, root)

    def _draft_fixed(self, rows: list[_Row], groups: list[tuple[int, int]], uniforms: torch.Tensor,
                     row_depth: torch.Tensor, prefix: torch.Tensor, root: torch.Tensor) -> Drafted:
        """A fixed shape on its template: which nodes each row has, their tokens, ``q`` of each token at its
        parent, the draft uniform of each sampled node, and the draft laws (zeros where not expanded)."""
        template, device = self.template, self.device
        count, nodes = len(rows), template.nodes
        q_laws = torch.zeros((count, nodes + 1, self.vocab), dtype=torch.float64, device=device)
        q_laws[:, 0] = root
        tokens = torch.zeros((count, nodes), dtype=torch.long, device=device)
        valid = torch.zeros((count, nodes), dtype=torch.bool, device=device)
        q_token = torch.zeros((count, nodes), dtype=torch.float64, device=device)
        u_draft = torch.full((count, nodes), float("nan"), dtype=torch.float64, device=device)
        for depth in range(1, template.depth + 1):
            start, stop = template.level(depth)
            if start == stop:
                break
            parent_nodes = sorted({template.parents[n] for n in range(start, stop)})
            where = {parent: index for index, parent in enumerate(parent_nodes)}
            widest = max(self.widths[parent + 1] for parent in parent_nodes)
            parent_slots = torch.tensor([parent + 1 for parent in parent_nodes], dtype=torch.long, device=device)
            at_parent = torch.tensor([where[template.parents[n]] for n in range(start, stop)], dtype=torch.long, device=device)
            number = self.siblings[start:stop]
            laws = q_laws[:, parent_slots]  # [B, P, V]
            level_parents = self.parents[start:stop]
            parent_ok = level_parents[None, :] < 0
            if depth > 1:
                parent_column = level_parents.clamp(min=0)
                parent_ok = valid[:, parent_column] & ~torch.isin(tokens[:, parent_column], self.eos)
            exists = parent_ok & (depth <= row_depth[:, None])
            if self.mode == "top":
                ids, positive = top_children(laws.reshape(-1, self.vocab), widest)
                ids, positive = ids.reshape(count, len(parent_nodes), -1), positive.reshape(count, -1)
                exists = exists & (number[None, :] < positive[:, at_parent])
            else:
                if self.mode == "sample-distinct":
                    exists = exists & (number[None, :] < (laws > 0).sum(-1)[:, at_parent])
                # A sampled child is the i-th node of its level: its uniform is U[d − 1, i, draft].
                index = exists.to(torch.int64).cumsum(-1) - 1
                first = torch.zeros((count, len(parent_nodes)), dtype=torch.long, device=device)
                first = first.scatter_reduce(1, at_parent[None, :].expand(count, -1),
                                             torch.where(exists, index, 10**9), "amin", include_self=False)
                first = torch.where(first >= 10**9, 0, first)
                columns = (first[..., None] + torch.arange(widest, device=device)).clamp(max=uniforms.shape[2] - 1)
                level_u = uniforms[:, depth - 1, :, DRAFT].gather(1, columns.reshape(count, -1)).reshape(count, len(parent_nodes), -1)
                ids, _ = sampled_children(laws.reshape(-1, self.vocab), level_u.reshape(-1, widest),
                                          self.mode == "sample-distinct")
                ids = ids.reshape(count, len(parent_nodes), -1)
                u_draft[:, start:stop] = torch.where(exists, level_u[:, at_parent, number], float("nan"))
            level_tokens = ids[:, at_parent, number]
            tokens[:, start:stop] = torch.where(exists, level_tokens, 0)
            valid[:, start:stop] = exists
            q_token[:, start:stop] = laws[:, at_parent].gather(-1, level_tokens[..., None]).squeeze(-1)
            if depth < template.depth:
                sees = self.ancestors[start:stop].expand(count, -1, -1)
                q_laws[:, start + 1 : stop + 1] = self._expand(rows, groups, tokens[:, start:stop], prefix, start, stop,
                                                              depth, sees) * (depth < row_depth)[:, None, None]
        depths = torch.tensor(template.depths, dtype=torch.long, device=device).expand(count, -1)
        columns = torch.arange(nodes, device=device).expand(count, -1)
        return Drafted(tokens, valid, self.parents.expand(count, -1), depths, q_token, u_draft, q_laws, columns)

    def _draft_budget(self, rows: list[_Row], groups: list[tuple[int, int]], row_depth: torch.Tensor,
                      prefix: torch.Tensor, root: torch.Tensor) -> Drafted:
        """A budget tree (``tree_draft._grow_budget_level`` and ``finish`` for every row at once): level ``d``'s
        candidates are the top ``N`` children of every node of level ``d − 1``; a candidate joins if it ranks
        among the ``N`` best paths so far (by ``−score``, old nodes first, then candidate order); at the end
        the ``N`` best nodes are kept (by ``−score``, then creation order), numbered in creation order."""
        device, budget, depth = self.device, self.budget, self.depth
        count, nodes = len(rows), depth * budget  # the template: D levels of N slots
        vocab = self.vocab
        q_laws = torch.zeros((count, nodes + 1, vocab), dtype=torch.float64, device=device)
        q_laws[:, 0] = root
        tokens = torch.zeros((count, nodes), dtype=torch.long, device=device)
        valid = torch.zeros((count, nodes), dtype=torch.bool, device=device)
        parents = torch.full((count, nodes), -1, dtype=torch.long, device=device)
        score = torch.zeros((count, nodes), dtype=torch.float64, device=device)
        q_token = torch.zeros((count, nodes), dtype=torch.float64, device=device)
        sees = torch.eye(nodes, dtype=torch.bool, device=device).expand(count, nodes, nodes).clone()
        rows_index = torch.arange(count, device=device)[:, None]
        for level in range(1, depth + 1):
            start = (level - 1) * budget
            if level == 1:
                frontier = torch.zeros(1, dtype=torch.long, device=device)  # the root's slot
                frontier_ok = torch.ones((count, 1), dtype=torch.bool, device=device)
                base = torch.ones((count, 1), dtype=torch.float64, device=device)
            else:
                frontier = torch.arange(start - budget, start, device=device) + 1
                frontier_ok = valid[:, start - budget : start] & ~torch.isin(tokens[:, start - budget : start], self.eos)
                base = score[:, start - budget : start]
            laws = q_laws[:, frontier]  # [B, F, V]
            width = frontier.shape[0]
            ids, positive = top_children(laws.reshape(-1, vocab), budget)
            ids, positive = ids.reshape(count, width, -1), positive.reshape(count, width)
            number = torch.arange(ids.shape[-1], device=device)
            candidate_ok = frontier_ok[..., None] & (number[None, None, :] < positive[..., None]) & (level <= row_depth)[:, None, None]
            candidate_q = laws.gather(-1, ids)
            candidate_score = (base[..., None] * candidate_q).reshape(count, -1)
            candidate_ok = candidate_ok.reshape(count, -1)
            # A candidate's rank: old nodes at least as good, then candidates better or as good and earlier.
            old = (valid[:, None, :start] & (score[:, None, :start] >= candidate_score[..., None])).sum(-1)
            order = torch.arange(candidate_score.shape[1], device=device)
            ahead = (candidate_score[:, None, :] > candidate_score[..., None]) | (
                (candidate_score[:, None, :] == candidate_score[..., None]) & (order[None, None, :] < order[None, :, None]))
            new = (candidate_ok[:, None, :] & ahead).sum(-1)
            chosen = candidate_ok & (old + new < budget)
            place = torch.where(chosen, chosen.to(torch.int64).cumsum(-1) - 1, budget)  # the level slot, in candidate order
            def put(target: torch.Tensor, values: torch.Tensor) -> None:
                level_values = torch.zeros((count, budget + 1), dtype=target.dtype, device=device)
                level_values.scatter_(1, place, values.reshape(count, -1).to(target.dtype))
                target[:, start : start + budget] = level_values[:, :budget]
            put(tokens, ids)
            put(valid, chosen)
            put(score, candidate_score)
            put(q_token, candidate_q)
            parent_node = (frontier - 1)[None, :, None].expand(count, width, ids.shape[-1])
            put(parents, parent_node)
            level_parents = parents[:, start : start + budget]
            inherited = sees[rows_index, level_parents.clamp(min=0)]
            own = sees[:, start : start + budget]
            sees[:, start : start + budget] = torch.where((level_parents >= 0)[..., None], own | inherited, own)
            if level < depth:
                q_laws[:, start + 1 : start + budget + 1] = self._expand(
                    rows, groups, tokens[:, start : start + budget], prefix, start, start + budget, level,
                    sees[:, start : start + budget]) * (level < row_depth)[:, None, None]
        # The N best nodes (ties: earlier first), in creation order: each row's own numbering.
        index = torch.arange(nodes, device=device)
        better = (score[:, None, :] > score[..., None]) | ((score[:, None, :] == score[..., None]) & (index[None, None, :] < index[None, :, None]))
        rank = (valid[:, None, :] & better).sum(-1)
        valid = valid & (rank < budget)
        slot = torch.where(valid, valid.to(torch.int64).cumsum(-1) - 1, budget)
        compact = torch.full((count, budget + 1), -1, dtype=torch.long, device=device)
        compact.scatter_(1, slot, index[None, :].expand(count, -1))
        columns = compact[:, :budget]  # the template node of each kept node (its draft cache column)
        kept = columns >= 0
        source = columns.clamp(min=0)
        renumber = torch.full((count, nodes + 1), -1, dtype=torch.long, device=device)
        renumber.scatter_(1, torch.where(valid, index, nodes), torch.where(valid, slot, -1))
        kept_parents = parents.gather(1, source)
        tree_parents = torch.where(kept_parents >= 0, renumber.gather(1, kept_parents.clamp(min=0)), -1)
        level_of = (source // budget + 1)
        tree_laws = torch.cat([q_laws[:, :1], q_laws.gather(1, (source + 1)[..., None].expand(-1, -1, vocab))], dim=1)
        return Drafted(torch.where(kept, tokens.gather(1, source), 0), kept, torch.where(kept, tree_parents, -1),
                       level_of, torch.where(kept, q_token.gather(1, source), 0.0),
                       torch.full((count, budget), float("nan"), dtype=torch.float64, device=device), tree_laws,
                       torch.where(kept, columns, 0))

    def _lookup_trees(self, rows: list[_Row], row_depth: torch.Tensor) -> Drafted:
        """Each row's prompt-lookup trie (``tree_draft.ngram_trie``, host lists) laid out ``[B, N]`` in one copy;
        ``q`` at each parent is the point mass of its first child (``tree_draft.ngram_tree``)."""
        device, nodes, count = self.device, self.nodes, len(rows)
        table = np.zeros((4, count, nodes), dtype=np.int64)  # tokens, parents, depths, valid
        first = np.full((count, nodes + 1), -1, dtype=np.int64)
        for index, row in enumerate(rows):
            spec = self.spec.limited(min(self.depth, row.plan.max_new_tokens - len(row.run.tokens)))
            trie = ngram_trie(row.committed, self.lookup.n, spec, row.plan.eos)
            size = len(trie.tokens)
            table[0, index, :size], table[1, index, :size] = trie.tokens, trie.parents
            table[2, index, :size], table[3, index, :size] = trie.depths, 1
            for node in range(size - 1, -1, -1):  # ends on each parent's first child
                first[index, trie.parents[node] + 1] = trie.tokens[node]
        tokens, parents, depths, valid = torch.from_numpy(table).to(device)
        laws = torch.zeros((count, nodes + 2, self.vocab + 1), dtype=torch.float64, device=device)
        first_token = torch.from_numpy(first).to(device)
        laws.scatter_(2, torch.where(first_token >= 0, first_token, self.vocab)[..., None], 1.0)
        valid = valid.bool()
        return Drafted(tokens, valid, torch.where(valid, parents, -1), torch.where(valid, depths, 1),
                       valid.to(torch.float64), torch.full((count, nodes), float("nan"), dtype=torch.float64, device=device),
                       laws[:, : nodes + 1, : self.vocab], torch.zeros((count, nodes), dtype=torch.long, device=device))

    def _draft_laws(self, logits: torch.Tensor, rows: list[_Row], groups: list[tuple[int, int]]) -> torch.Tensor:
        laws = [probabilities(logits[lo:hi], rows[lo].plan.draft_policy) for lo, hi in groups]
        return laws[0] if len(laws) == 1 else torch.cat(laws)

    def _expand(self, rows: list[_Row], groups: list[tuple[int, int]], level_tokens: torch.Tensor, prefix: torch.Tensor,
                start: int, stop: int, depth: int, sees: torch.Tensor) -> torch.Tensor:
        """One draft forward over a level's template nodes ``[start, stop)`` of every row under the tree mask
        (``sees`` ``[B, L, M]``: which template nodes each sees): their laws ``[B, L, V]``."""
        size = stop - start
        starts = [row.draft_cached + start for row in rows]
        width = max(starts) + size
        keys = torch.arange(width, device=self.device)
        relative = keys[None, :] - prefix[:, None]  # [B, K]: the template node each key column holds
        inside = (relative >= 0) & (relative < stop)
        seen = sees.gather(2, relative.clamp(0, sees.shape[-1] - 1)[:, None, :].expand(-1, size, -1))  # [B, L, K]
        visible = (relative < 0)[:, None, :] | (seen & inside[:, None, :])
        positions = (prefix - 1 + depth)[:, None].expand(-1, size)
        output = self._tree_forward(self.pair.draft_stage, [row.draft_slot for row in rows], starts, [size] * len(rows),
                                    size, level_tokens, positions, visible)
        return self._draft_laws(fit_vocabulary(output.logits, self.vocab), rows, groups)

    def _tree_forward(self, stage: Any, slots: list[int], starts: list[int], sizes: list[int], keep: int,
                      tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor):
        """One batched tree-step forward through the seams (``route`` and ``hand_back`` see the ``Block``)."""
        block = self.seams.route(Block(stage, slots, starts, sizes, keep, tokens=tokens, positions=positions,
                                       visible=visible))
        return self.seams.hand_back(block, stage.run_block(block))
