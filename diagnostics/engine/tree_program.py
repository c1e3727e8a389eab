"""A tree round of every row as one tensor program (trees drafted by a model or by prompt lookup).

``RoundProgram`` runs chains; this runs trees (a fixed shape ``--tree K1,K2,…`` or sparse choices with
every children mode, or a budget ``--tree-budget N --tree-depth D``) drafted by a draft model, the
target's early exit or each row's prompt-lookup trie, over every row at once, on a static template per
batch (``tree_verify.Template``; a budget tree's template is ``D`` levels of ``N`` slots). A round of the ``B`` active rows:

1. **Uniforms** ``U[B, D + 1, X, slot]`` keyed by each row's ``(seed, position + t, slot, sibling)`` in one
   host call (``rng.tree_round_uniform_array``), copied once.
2. **Drafting** (``tree_batch_draft.TreeDrafting``): one forward of each row's pending tokens (the root's law), then per depth ``d``: the
   children of every node of depth ``d − 1`` for every row (``tree_verify.top_children`` or sampled draws),
   which of them exist in each row (a budget tree: the candidates that rank among the ``N`` best paths,
   then the ``N`` best nodes kept), and one draft forward of the level under a tree mask (``Block`` with
   per-row positions and visibility). Template nodes a row does not have are fed too, under the mask,
   so the loop has no data-dependent exit. Each row's tree is then numbered as its per-row drafter
   numbers it (``Drafted``: per-row parents and depths).
3. **Verification**: one target forward over every row's pending tokens and all template nodes; then
   per group of rows sharing a rule and policies: the steps at every node (``seams.tree_steps_rows``),
   the walk (``tree_verify.walk_rows``), one draw per row, and the record columns of every depth.
4. **One host copy** of every group's packed buffer (a ``TreeHeader`` per row, then its ``Layout``); the
   host builds each row's records with ``records.position_record`` (its tree is
   the template compacted to its nodes, numbered as the per-row drafter numbers them) and keeps each
   row's accepted path in both caches with one batched move per store (``SlotStore.move_rows``).

The per-row programs (``reference.tree.tree_row``) are the oracle (``tests/test_tree_program.py``). Draft heads
and a split target still run per row.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from diagnostics.engine.drafting import fit_vocabulary
from diagnostics.engine.chain_program import RoundProgram, _Row
from diagnostics.engine.tree_batch_draft import Drafted, TreeDrafting
from diagnostics.engine.records import NodeRecord, PositionRecord, RoundRecord, position_record
from diagnostics.engine.tree_attention import TokenTree
from diagnostics.engine.tree_draft import TreeSpec
from diagnostics.engine.tree_verify import BONUS, NO_DRAW, REJECTED, Template, WalkRows, ancestors_rows, present_rows, \
    reach_rows, shape_rows, walk_rows
from diagnostics.engine.chain_verify import _top, row_chunks
from diagnostics.metrics import entropy, kl_divergence, overshoot_mass, total_variation
from diagnostics.rng import SLOTS, tree_round_uniform_array
from diagnostics.rules.base import laws_from_engine

DRAFT, ACCEPT, FALLBACK = SLOTS["draft"], SLOTS["accept"], SLOTS["fallback"]
NODE_FIELDS = ("valid", "token", "parent", "sibling", "depth", "column", "q_token", "u_draft", "p_token", "residual", "accept", "coin", "tried", "kept", "reach")
SLOT_FIELDS = ("entropy_p", "tv_target", "tv_baseline", "kl_target", "allowed_size", "allowed_mass", "p_tail",
               "tv_pq", "entropy_q", "overshoot", "q_tail")


def supports_tree_program(pair: Any, spec: TreeSpec) -> bool:
    """Whether ``generate_batch`` runs this tree batch as one tensor program: a tree drafted by a model
    (or the target's early exit) or by prompt lookup, not a split target, over stages with a batched forward."""
    if pair.source.kind not in ("model", "ngram") or pair.split is not None:
        return False
    stages = [pair.target_stage] + ([pair.draft_stage] if pair.source.kind == "model" else [])
    return all(hasattr(stage, "run_block") for stage in stages)


class TreeHeader(NamedTuple):
    """A row's round, the head of its buffer (in this order): the ``accepted`` path length, how the round
    ended (``end``: ``REJECTED``, a bonus, or ``NO_DRAW``), the final ``token``, whether an EOS ``finished`` the row,
    the exact ``expected_tokens`` of the round and ``final_p``, the target's ``p`` of the final token."""

    accepted: int
    end: int
    token: int
    finished: bool
    expected_tokens: float
    final_p: float


class Layout:
    """Where each value of a row sits in a tree round's packed buffer."""

    def __init__(self, nodes: int, depth: int, top_k: int, record: bool) -> None:
        self.nodes, self.depth, self.top_k, self.record = nodes, depth, top_k, record
        self.header = len(TreeHeader._fields)
        self.path = self.header
        self.slots = self.path + self.depth
        self.node = self.slots + self.depth + 1
        self.slot_scalars = self.node + len(NODE_FIELDS) * self.nodes
        self.tops = self.slot_scalars + len(SLOT_FIELDS) * (self.depth + 1)
        self.width = self.tops + 4 * (self.depth + 1) * top_k if record else self.slot_scalars

    @staticmethod
    def read_header(values: np.ndarray) -> TreeHeader:
        """A row's ``TreeHeader`` read from its host buffer."""
        accepted, end, token, finished = (int(value) for value in values[:4])
        return TreeHeader(accepted, end, token, bool(finished), float(values[4]), float(values[5]))

    def node_field(self, name: str) -> slice:
        start = self.node + NODE_FIELDS.index(name) * self.nodes
        return slice(start, start + self.nodes)

    def slot_field(self, name: str) -> slice:
        start = self.slot_scalars + SLOT_FIELDS.index(name) * (self.depth + 1)
        return slice(start, start + self.depth + 1)

    def top(self, which: str, level: int) -> tuple[slice, slice]:
        """``(ids, probs)`` of ``p``'s (``which`` = ``p``) or ``q``'s top-k at depth ``level``'s decision."""
        start = self.tops + (0 if which == "p" else 2 * (self.depth + 1) * self.top_k) + 2 * level * self.top_k
        return slice(start, start + self.top_k), slice(start + self.top_k, start + 2 * self.top_k)


class TreeProgram(TreeDrafting, RoundProgram):
    """Runs every row of a tree batch to its end, one round of all active rows at a time."""

    def __init__(self, pair: Any, plans: list[Any], limit: int, spec: TreeSpec, loaded: Any, where: str) -> None:
        super().__init__(pair, plans, limit, spec.max_depth, loaded, where)
        self.spec, self.mode = spec, spec.children
        device = self.device
        if spec.fixed and self.lookup is None:
            self.template = template = Template.of(spec)
            self.depth, self.nodes, self.width = template.depth, template.nodes, template.width
            self.parents = torch.tensor(template.parents, dtype=torch.long, device=device)
            self.siblings = torch.tensor(template.sibling, dtype=torch.long, device=device)
            self.ancestors = template.ancestors(device)
            self.widths = [sum(1 for kid in kids if kid >= 0) for kids in template.children]
            levels = [template.level(d) for d in range(1, template.depth + 1)]
            self.spread = max([stop - start for start, stop in levels] + [template.width, 1])
        elif self.lookup is not None:  # prompt-lookup tries: at most the shape's nodes
            self.depth, self.nodes, self.width = spec.max_depth, spec.max_nodes, spec.max_nodes
            self.spread = max(1, spec.max_nodes)
        else:  # a budget tree: D levels of N slots while drafting, then the N best nodes
            self.budget = int(spec.budget)
            self.depth, self.nodes, self.width = int(spec.depth), self.budget, self.budget
            self.spread = self.budget
        self.gamma = 0  # a tree run stores no chain length

    def _new_run(self, plan: Any):
        run = super()._new_run(plan)
        run.tree = self.spec
        return run

    # -- verification ------------------------------------------------------------------------

    def _verify_logits(self, rows: list[_Row], drafted: Drafted, prefix: torch.Tensor) -> torch.Tensor:
        """The target's logits ``[B, N + 1, V]``: after each row's committed tokens (the root) and after
        the path to each node, in one forward of the pending tokens and every node."""
        device, nodes, tokens = self.device, self.nodes, drafted.tokens
        pending = [row.committed[row.scorer.cached:] for row in rows]
        counts = [len(feed) for feed in pending]
        longest = max(counts)
        count = longest + nodes
        feed = torch.tensor([p + [0] * (longest - len(p)) for p in pending], dtype=torch.long, device=device)
        inputs = self._after_pending(feed, counts, tokens)
        starts = [row.scorer.cached for row in rows]
        width = max(starts) + count
        cached = torch.tensor(starts, dtype=torch.long, device=device)
        fresh = torch.tensor(counts, dtype=torch.long, device=device)
        query = torch.arange(count, device=device)
        node = query[None, :] - fresh[:, None]  # [B, Q]: the node of each query (pending: < 0)
        is_node = (node >= 0) & (node < nodes)
        node_positions = type(rows[0].scorer).tree_positions(prefix, drafted.depths)  # [B, N] (a scorer seam)
        positions = torch.where(is_node, node_positions.gather(1, node.clamp(0, nodes - 1)), cached[:, None] + query)
        keys = torch.arange(width, device=device)
        causal = keys[None, None, :] <= (cached[:, None] + query[None, :])[:, :, None]
        relative = keys[None, :] - prefix[:, None]
        inside = (relative >= 0) & (relative < nodes)
        ancestors = ancestors_rows(drafted.parents, drafted.depths, self.depth)  # [B, N, N]
        sees = ancestors.gather(1, node.clamp(0, nodes - 1)[..., None].expand(-1, -1, nodes))  # [B, Q, N]
        sees = sees.gather(2, relative.clamp(0, nodes - 1)[:, None, :].expand(-1, count, -1))  # [B, Q, K]
        tree_sees = (relative < 0)[:, None, :] | (sees & inside[:, None, :])
        visible = torch.where(is_node[..., None], tree_sees, causal)
        output = self._tree_forward(self.pair.target_stage, [row.target_slot for row in rows], starts,
                                    [size + nodes for size in counts], nodes + 1, inputs, positions, visible)
        for row, size in zip(rows, counts):
            row.scorer.cached += size + nodes
        return fit_vocabulary(output.logits, self.vocab)

    # -- one round ---------------------------------------------------------------------------

    def round(self, rows: list[_Row]) -> None:
        """Draft every row's tree, verify, walk and record one round of ``rows`` (see the module docstring)."""
        device, nodes = self.device, self.nodes
        groups = self._groups(rows)
        positions = [len(row.run.tokens) for row in rows]
        budgets = [row.plan.max_new_tokens - position for row, position in zip(rows, positions)]
        host_u = tree_round_uniform_array([row.plan.seed for row in rows], positions, self.depth, self.spread)
        uniforms = torch.from_numpy(host_u).to(device)
        budget = torch.tensor(budgets, dtype=torch.long, device=device)
        row_depth = budget.clamp(max=self.depth)
        prefix = torch.tensor([len(row.committed) for row in rows], dtype=torch.long, device=device)
        drafted = self._draft(rows, groups, uniforms, row_depth, prefix)
        logits = self._verify_logits(rows, drafted, prefix)
        buffers, layouts = [], []
        with laws_from_engine():
            for group_lo, group_hi in groups:
                plan = rows[group_lo].plan
                layout = Layout(nodes, self.depth, min(plan.top_k_record, self.vocab), plan.record)
                layouts.append(layout)
                for lo, hi in row_chunks(group_lo, group_hi, 4 * (nodes + 1) * self.vocab, device):
                    p_laws = self.seams.target_laws(logits[lo:hi], plan.policy, nodes)
                    part = Drafted(*(getattr(drafted, name)[lo:hi] for name in Drafted.__dataclass_fields__))
                    buffers.append(self._verify_group(plan.rule, p_laws, part, uniforms[lo:hi], budget[lo:hi], layout))
        host = self._to_host(buffers)
        moves: dict[str, list] = {"draft": [], "target": []}
        for (lo, hi), layout in zip(groups, layouts):
            has_allowed = self._has_allowed(rows[lo].plan.rule)
            for offset in range(lo, hi):
                self._commit_tree(rows[offset], host[offset], host_u[offset, :, 0, FALLBACK], positions[offset],
                                  budgets[offset], layout, has_allowed, moves)
        if self.model_draft:
            self._move(self.pair.draft_stage, moves["draft"])
        self._move(self.pair.target_stage, moves["target"])

    def _verify_group(self, rule: Any, p_laws: torch.Tensor, drafted: Drafted, uniforms: torch.Tensor,
                      budget: torch.Tensor, layout: Layout) -> torch.Tensor:
        """The packed buffer ``[G, layout.width]`` of one group's tree round."""
        groups, slots = p_laws.shape[0], self.nodes + 1
        vocab = p_laws.shape[-1]
        device = p_laws.device
        tokens, valid, q_laws = drafted.tokens, drafted.valid, drafted.q_laws
        children, sibling = shape_rows(drafted.parents, valid, max(1, self.width))
        present = present_rows(children, valid)
        child_tokens = torch.where(present, tokens.gather(1, children.clamp(min=0).reshape(groups, -1)).reshape(children.shape), 0)
        steps = self.seams.tree_steps_rows(rule, p_laws.reshape(-1, vocab), q_laws.reshape(-1, vocab),
                                          child_tokens.reshape(groups * slots, -1), present.reshape(groups * slots, -1),
                                          self.mode)
        walk = walk_rows(rule, self.depth, children, present, steps, p_laws, tokens, uniforms[:, :, :, ACCEPT],
                         uniforms[:, :, 0, FALLBACK], budget, self.eos)
        accept = steps.accept.reshape(groups, slots, -1)
        residual = steps.residual.reshape(groups, slots, -1)
        parent_slot = (drafted.parents + 1).clamp(min=0)
        rows = torch.arange(groups, device=device)
        reach = reach_rows(accept, drafted.parents, sibling, drafted.depths, valid, self.depth)
        parent_laws = p_laws.gather(1, parent_slot[..., None].expand(-1, -1, vocab))
        nodes = {
            "valid": valid, "token": tokens, "parent": drafted.parents, "sibling": sibling, "depth": drafted.depths,
            "column": drafted.columns, "q_token": drafted.q_token, "u_draft": drafted.u_draft,
            "p_token": parent_laws.gather(-1, tokens[..., None]).squeeze(-1),
            "residual": residual[rows[:, None], parent_slot, sibling], "accept": accept[rows[:, None], parent_slot, sibling],
            "coin": walk.coin, "tried": walk.tried, "kept": walk.kept, "reach": reach,
        }
        expected = self._expected(reach, tokens, valid, present, budget, drafted.depths)
        final_p = p_laws[rows, walk.slots.gather(1, walk.accepted[:, None]).squeeze(-1)].gather(
            -1, walk.token[:, None]).squeeze(-1)
        # The row's ``TreeHeader``, in its order.
        header = torch.stack([walk.accepted, walk.end, walk.token, walk.finished.to(torch.long)], dim=-1).to(torch.float64)
        parts = [header, expected[:, None], final_p[:, None], walk.path.to(torch.float64), walk.slots.to(torch.float64)]
        parts += [nodes[name].to(torch.float64) for name in NODE_FIELDS]
        if layout.record:
            parts += self._slot_columns(rule, p_laws, q_laws, steps.law.reshape(groups, slots, -1), walk, layout)
        return torch.cat(parts, dim=-1)

    def _expected(self, reach: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, present: torch.Tensor,
                  budget: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """``E = Σ_v reach(v) + 1 − Σ_{v ends the round without a draw} reach(v)`` (``reference.tree_walk.expected_tokens``)."""
        has_children = present[:, 1:].any(-1)
        silent = valid & (torch.isin(tokens, self.eos) | (~has_children & (depths >= budget[:, None])))
        return reach.sum(-1) + 1.0 - torch.where(silent, reach, 0.0).sum(-1)

    def _slot_columns(self, rule: Any, p_laws: torch.Tensor, q_laws: torch.Tensor, laws: torch.Tensor, walk: WalkRows,
                      layout: Layout) -> list[torch.Tensor]:
        """The V-wide record scalars and top-k of the decision at every depth: ``p`` and ``q`` of the slot
        that decided it, and its exact law (the node's, or the bonus law where the round ended on one)."""
        groups, levels = p_laws.shape[0], walk.slots.shape[1]
        index = walk.slots[..., None].expand(-1, -1, p_laws.shape[-1])
        p_rows, q_rows, node_laws = (tensor.gather(1, index) for tensor in (p_laws, q_laws, laws))
        depth = torch.arange(levels, device=p_laws.device)
        is_bonus = (depth[None, :] == walk.accepted[:, None]) & (walk.end == BONUS)[:, None]
        emitted = torch.where(is_bonus[..., None], rule.bonus(p_rows), node_laws)
        zero = torch.zeros((groups, levels), dtype=torch.float64, device=p_laws.device)
        allowed = rule.allowed_set(p_rows)
        p_ids, p_probs, p_tail = _top(p_rows, layout.top_k)
        q_ids, q_probs, q_tail = _top(q_rows, layout.top_k)
        tv_target = total_variation(emitted, p_rows)
        columns = {
            "entropy_p": entropy(p_rows), "tv_target": tv_target,
            "tv_baseline": total_variation(emitted, rule.baseline(p_rows)),
            "kl_target": kl_divergence(emitted, p_rows),
            "allowed_size": allowed.sum(-1) if allowed is not None else zero,
            "allowed_mass": (p_rows * allowed).sum(-1) if allowed is not None else zero,
            "p_tail": p_tail, "tv_pq": total_variation(p_rows, q_rows), "entropy_q": entropy(q_rows),
            "overshoot": overshoot_mass(p_rows, q_rows), "q_tail": q_tail,
        }
        parts = [columns[name].to(torch.float64) for name in SLOT_FIELDS]
        for ids, probs in ((p_ids, p_probs), (q_ids, q_probs)):
            parts.append(torch.stack([ids.to(torch.float64), probs.to(torch.float64)], dim=2).reshape(groups, -1))
        return parts

    # -- the host's part ---------------------------------------------------------------------

    def _commit_tree(self, row: _Row, values: np.ndarray, u_fallback: np.ndarray, position: int, budget: int,
                     layout: Layout, has_allowed: bool, moves: dict[str, list]) -> None:
        """A row's round on the host: its compact tree, records, tokens, counters and the cache moves."""
        run, plan = row.run, row.plan
        accepted, end, final, finished, expected, final_p = layout.read_header(values)
        path = [int(node) for node in values[layout.path : layout.path + accepted]]
        node = {name: values[layout.node_field(name)] for name in NODE_FIELDS}
        parents = [int(parent) for parent in node["parent"]]
        kept_nodes = [n for n in range(self.nodes) if node["valid"][n] > 0]
        compact = {n: index for index, n in enumerate(kept_nodes)}
        tree = TokenTree(parents=tuple(-1 if parents[n] < 0 else compact[parents[n]] for n in kept_nodes),
                         tokens=tuple(int(node["token"][n]) for n in kept_nodes))
        emitted = [int(node["token"][n]) for n in path] + ([final] if end != NO_DRAW else [])
        kinds = ["accepted"] * accepted + (["rejected" if end == REJECTED else "bonus"] if end != NO_DRAW else [])
        if plan.record:
            self._tree_records(row, values, u_fallback, node, kept_nodes, compact, tree, path, emitted, kinds, position,
                               budget, expected, final_p, layout, has_allowed)
        run.blocks += 1
        run.drafted += len(kept_nodes)
        run.accepted += accepted
        run.verified += sum(1 for kind in kinds if kind != "bonus")
        # Both caches keep the prefix, then the accepted path's rows (the draft's only where it fed them).
        prefix = len(row.committed)
        rows_kept = row.scorer.path_rows(prefix, tree, [compact[n] for n in path])
        target_sources = [rows_kept[k] if rows_kept[k] < prefix else prefix + kept_nodes[rows_kept[k] - prefix]
                          for k in range(prefix, len(rows_kept))]
        moves["target"].append((row.target_slot, prefix, target_sources))
        row.scorer.cached = len(rows_kept)
        fed = [n for n in path if node["depth"][n] < min(self.depth, budget)]  # a prefix of the path
        if self.model_draft:
            moves["draft"].append((row.draft_slot, prefix, [prefix + int(node["column"][n]) for n in fed]))
            row.draft_cached = prefix + len(fed)
        row.committed.extend(emitted)
        run.tokens.extend(emitted)
        if finished:
            run.stop_reason = "eos"

    def _move(self, stage: Any, moves: list[tuple[int, int, list[int]]]) -> None:
        """Every row's path rows into place after its prefix, in one batched move on ``stage``'s store."""
        longest = max((len(sources) for _, _, sources in moves), default=0)
        if not longest:
            return
        slots = torch.tensor([slot for slot, _, _ in moves], dtype=torch.long, device=self.device)
        targets = [[prefix + k for k in range(longest)] for _, prefix, _ in moves]
        sources = [sources + target[len(sources):] for (_, _, sources), target in zip(moves, targets)]
        stage.store.move_rows(slots, torch.tensor(sources, dtype=torch.long, device=self.device),
                              torch.tensor(targets, dtype=torch.long, device=self.device))

    def _tree_records(self, row: _Row, values: np.ndarray, u_fallback: np.ndarray, node: dict, kept_nodes: list[int], compact: dict[int, int],
                      tree: TokenTree, path: list[int], emitted: list[int], kinds: list[str], position: int, budget: int,
                      expected: float, final_p: float, layout: Layout, has_allowed: bool) -> None:
        run, plan = row.run, row.plan
        depths = tree.depths
        round_ = RoundRecord(block=run.blocks, position=position, nodes=len(kept_nodes), depth=max(depths, default=0),
                             expected_tokens=expected, emitted=len(emitted), accepted=len(path))
        nodes = []
        for n in kept_nodes:
            tried = node["tried"][n] > 0
            decision = "untried" if not tried else ("accepted" if node["kept"][n] > 0 else "refused")
            u_draft = float(node["u_draft"][n])
            parent = int(node["parent"][n])
            nodes.append(NodeRecord(
                block=run.blocks, node=compact[n], parent=-1 if parent < 0 else compact[parent], depth=int(node["depth"][n]),
                sibling=int(node["sibling"][n]), token=int(node["token"][n]), q_token=float(node["q_token"][n]),
                u_draft=None if u_draft != u_draft else u_draft, p_token=float(node["p_token"][n]),
                residual=float(node["residual"][n]), accept_prob=float(node["accept"][n]),
                u_accept=float(node["coin"][n]) if tried else None, decision=decision, reach=float(node["reach"][n]),
                token_text=self.texts(int(node["token"][n])),
            ))
        run.rounds.append(round_)
        run.nodes.extend(nodes)
        if plan.on_round is not None:
            plan.on_round(round_, nodes)
        slots = [int(slot) for slot in values[layout.slots : layout.slots + self.depth + 1]]
        for index, (kind, token) in enumerate(zip(kinds, emitted)):
            record = self._tree_position(row, values, float(u_fallback[index]), node, compact, slots[index], index, kind,
                                         token, position, path, final_p, layout, has_allowed)
            run.records.append(record)
            if plan.on_record is not None:
                plan.on_record(record)

    def _tree_position(self, row: _Row, values: np.ndarray, u_final: float, node: dict, compact: dict[int, int], slot: int, index: int,
                       kind: str, token: int, position: int, path: list[int], final_p: float, layout: Layout,
                       has_allowed: bool) -> PositionRecord:
        """The record of the position decided at depth ``index`` (at parent slot ``slot``: 0 the root)."""
        column = {name: values[layout.slot_field(name)][index] for name in SLOT_FIELDS}
        fields: dict[str, Any] = {name: column[name] for name in ("entropy_p", "tv_target", "tv_baseline", "kl_target", "p_tail")}
        fields["p_top_ids"], fields["p_top_probs"] = (values[part] for part in layout.top("p", index))
        fields.update(p_token=final_p, u_fallback=u_final)
        if has_allowed:
            fields.update(allowed_size=column["allowed_size"], allowed_mass=column["allowed_mass"])
        if kind != "bonus":
            children = [kid for kid in range(self.nodes) if node["valid"][kid] > 0 and int(node["parent"][kid]) == slot - 1]
            child = path[index] if kind == "accepted" else children[0]
            survive = 1.0
            for kid in children:
                survive *= 1.0 - float(node["accept"][kid])
            fields["q_top_ids"], fields["q_top_probs"] = (values[part] for part in layout.top("q", index))
            fields.update(
                p_token=node["p_token"][child] if kind == "accepted" else final_p, draft_token=node["token"][child],
                p_draft=node["p_token"][child], q_draft=node["q_token"][child], accept_prob=node["accept"][child],
                u_draft=node["u_draft"][child], u_accept=node["coin"][child], q_tail=column["q_tail"],
                alpha=1.0 - survive, tv_pq=column["tv_pq"], entropy_q=column["entropy_q"], overshoot=column["overshoot"])
        return position_record(kind, position + index, row.run.blocks, index, token, fields, self.texts,
                               tree_node=-1 if slot == 0 else compact[slot - 1])
