"""One tree round of a group of rows as tensors: the template, the children, the steps, the walk.

The round program (``diagnostics.engine.tree_program``) drafts every row's tree on one **template**:
the nodes a fixed shape (``--tree K1,K2,…`` or sparse ``choices``) can have, in the order the per-row
drafter creates them (by depth, then parent, then child number). Row ``b`` uses a subset of them,
``valid[b, n]``: a node exists when its parent does, its parent's token is not EOS, its depth is within
the row's token budget, and its child number is below what the parent's law allows (``top``: the
tokens with ``q > 0``; ``sample-distinct``: as many draws as ``q`` has tokens). Valid nodes keep the
template order, so row ``b``'s own tree is the template compacted to its valid nodes, numbered as the
per-row drafter numbers them (``tree_draft.grow``), and a valid node's ancestors are valid.

The verification of every row's tree (``reference.tree_walk``, one node at a time) becomes, over ``[G, N + 1, …]``
tensors with a fixed loop over the template's child numbers and then over its depths:

* **steps** at every parent slot (the root and each node) for children ``c_1 … c_K`` in order:
  ``r_1 = p``; ``a_j = a(r_j, c_j)`` (``top``: the rule's ``tree_accept``, ``r_j(c_j)`` for lossless;
  sampled: ``min(1, r_j(x_j)/q_j(x_j))``); ``r_{j+1}`` = ``r_j`` without ``c_j`` renormalised (``top``)
  or ``norm((r_j − q_j)+)`` (sampled); the node's exact law ``Σ_j a_j·Π_{i<j}(1 − a_i)·δ_{c_j} +
  Π_i (1 − a_i)·r_{K+1}`` (``top``) or ``p`` (sampled);
* the **walk**: at depth ``d`` the current node's children are tried with coins ``U[d, j]``, the first
  kept child becomes the current node; all refused: a token from ``r_{K+1}``; an accepted leaf: the
  bonus ``b(p_leaf)`` if the budget allows; an accepted EOS ends the round. One draw per row at the end;
* ``reach(v) = reach(parent)·Π_{i<j}(1 − a_i)·a_j`` and the exact expected tokens of the round.

The per-row code (``tree_draft``, ``reference.tree_walk``, ``reference.tree.tree_row``) is this module's oracle:
``tests/test_tree_program.py`` feeds both the same laws.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from diagnostics.engine.tree_draft import TreeSpec
from diagnostics.engine.chain_verify import draw_rows
from diagnostics.rules import Rule


@dataclass(frozen=True)
class Template:
    """The nodes of a fixed tree shape to ``depth`` levels, in creation order.

    ``parents[n]``: the template index of node ``n``'s parent (−1: the root); ``sibling[n]``: its child
    number; ``depths[n]``: 1 for the root's children; ``children[s]``: the template indices of the
    children of parent slot ``s`` (0: the root, ``n + 1``: node ``n``), −1 past the last."""

    parents: tuple[int, ...]
    sibling: tuple[int, ...]
    depths: tuple[int, ...]
    width: int  # the most children any slot has
    depth: int

    @staticmethod
    def of(spec: TreeSpec, depth: int | None = None) -> Template:
        """The template of a fixed ``spec`` cut to ``depth`` levels (default: its own depth)."""
        if not spec.fixed:
            raise ValueError("a template needs a fixed tree shape (--tree K1,K2,… or sparse choices)")
        depth = spec.max_depth if depth is None else min(depth, spec.max_depth)
        parents, siblings, depths, paths = [], [], [], []
        frontier = [(-1, ())]
        for level in range(1, depth + 1):
            nxt = []
            for parent, path in frontier:
                for child in range(spec.width(path)):
                    parents.append(parent)
                    siblings.append(child)
                    depths.append(level)
                    paths.append(path + (child,))
                    nxt.append((len(parents) - 1, path + (child,)))
            frontier = nxt
        widths = [0] * (len(parents) + 1)
        for parent in parents:
            widths[parent + 1] += 1
        return Template(tuple(parents), tuple(siblings), tuple(depths), max(widths, default=0), depth)

    @property
    def nodes(self) -> int:
        return len(self.parents)

    def level(self, depth: int) -> tuple[int, int]:
        """``[start, end)`` of the template indices at ``depth``."""
        start = next((n for n, d in enumerate(self.depths) if d == depth), self.nodes)
        end = next((n for n, d in enumerate(self.depths) if d > depth), self.nodes)
        return start, end

    @cached_property
    def children(self) -> list[list[int]]:
        table: list[list[int]] = [[] for _ in range(self.nodes + 1)]
        for node, parent in enumerate(self.parents):
            table[parent + 1].append(node)
        return [kids + [-1] * (self.width - len(kids)) for kids in table]

    def ancestors(self, device: torch.device) -> torch.Tensor:
        """``[N, N]`` bool: node ``i`` sees node ``j`` iff ``j`` is ``i`` or one of its ancestors."""
        sees = torch.eye(self.nodes, dtype=torch.bool, device="cpu")
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                sees[node] |= sees[parent]
        return sees.to(device)


def top_children(q_laws: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens of each law ``[M, V]`` in decreasing ``q``, ties by lower id
    (``tree_draft._top_children``), and how many of them have ``q > 0`` ``[M]``.

    Exact without a full sort: every token above the ``k``-th largest value, then the lowest ids among
    those equal to it, then a stable sort of the ``k`` by decreasing ``q`` over ids in increasing order."""
    k = min(k, q_laws.shape[-1])
    threshold = torch.topk(q_laws, k).values[..., k - 1 :]
    above = q_laws > threshold
    equal = q_laws == threshold
    needed = k - above.sum(-1, keepdim=True)
    chosen = above | (equal & (equal.to(torch.int64).cumsum(-1) <= needed))
    # The k chosen ids in increasing order (a stable sort of the mask puts them first, in id order).
    ids = torch.sort((~chosen).to(torch.int8), dim=-1, stable=True).indices[..., :k]
    order = torch.sort(-q_laws.gather(-1, ids), dim=-1, stable=True).indices
    ids = ids.gather(-1, order)
    return ids, (q_laws.gather(-1, ids) > 0).sum(-1)


def sampled_children(q_laws: torch.Tensor, u: torch.Tensor, distinct: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``K`` draws per law ``[M, V]`` with uniforms ``u`` ``[M, K]`` (``tree_draft._children``): independent
    (``sample``) or without replacement (``sample-distinct``: the drawn token zeroed, not renormalised),
    and how many exist ``[M]`` (distinct: at most the tokens with ``q > 0``)."""
    count = u.shape[-1]
    if not distinct:
        draws = torch.stack([draw_rows(q_laws, u[:, j]) for j in range(count)], dim=-1)
        return draws, torch.full(q_laws.shape[:-1], count, dtype=torch.long, device=q_laws.device)
    law, draws = q_laws, []
    for j in range(count):
        draws.append(draw_rows(law, u[:, j]))
        law = law.scatter(-1, draws[-1][:, None], 0.0)
    return torch.stack(draws, dim=-1), torch.minimum((q_laws > 0).sum(-1), torch.tensor(count, device=q_laws.device))


@dataclass
class Steps:
    """The steps at every parent slot ``[M, …]``: ``accept`` and ``residual`` ``[M, W]`` (``a_j`` and
    ``r_j(c_j)``), ``rest`` ``[M, V]`` (``r_{K+1}``) and ``law`` ``[M, V]`` (the node's exact law)."""

    accept: torch.Tensor
    residual: torch.Tensor
    rest: torch.Tensor
    law: torch.Tensor


def _without(law: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``law`` with ``tokens`` ``[M]`` zeroed and renormalised (zeros when nothing is left)."""
    removed = law.scatter(-1, tokens[:, None], 0.0)
    total = removed.sum(-1, keepdim=True)
    return torch.where(total > 0, removed / torch.where(total > 0, total, 1.0), removed)


def steps_rows(rule: Rule, p_nodes: torch.Tensor, q_nodes: torch.Tensor, tokens: torch.Tensor, present: torch.Tensor,
               mode: str) -> Steps:
    """``reference.tree_walk.node_steps`` at ``M`` parent slots at once: laws ``[M, V]``, children ``tokens`` and
    ``present`` ``[M, W]`` (the present children come first)."""
    rows, width = tokens.shape
    device = p_nodes.device
    sampled, distinct, plain = mode != "top", mode == "sample-distinct", rule.name == "lossless"
    accept = torch.zeros((rows, width), dtype=torch.float64, device=device)
    residual = torch.zeros((rows, width), dtype=torch.float64, device=device)
    law = torch.zeros_like(p_nodes)
    r_node, q_law = p_nodes, q_nodes
    survive = torch.ones(rows, dtype=torch.float64, device=device)
    for j in range(width):
        token, on = tokens[:, j], present[:, j]
        r_value = r_node.gather(-1, token[:, None]).squeeze(-1)
        if sampled:
            q_value = q_law.gather(-1, token[:, None]).squeeze(-1)
            ratio = (r_value / torch.where(q_value > 0, q_value, 1.0)).clamp(max=1.0)
            a_value = torch.where(q_value > 0, ratio, (r_value > 0).to(torch.float64))
            positive = (r_node - q_law).clamp(min=0.0)
            total = positive.sum(-1, keepdim=True)
            r_next = torch.where(total > 0, positive / torch.where(total > 0, total, 1.0), r_node)
            if distinct:
                q_law = torch.where(on[:, None], _without(q_law, token), q_law)
        else:
            if plain:
                a_value = r_value
            else:
                has_mass = r_node.sum(-1) > 0
                a_value = torch.where(has_mass, rule.tree_accept(r_node, token).to(torch.float64), 0.0)
            r_next = _without(r_node, token)
            # r_j sat on c_j alone: a_j is 1 up to rounding, and nothing is left to fall back to.
            a_value = torch.where((r_value > 0) & ~(r_next > 0).any(-1), 1.0, a_value)
            law = torch.where(on[:, None], law.scatter_add(-1, token[:, None], (survive * a_value)[:, None]), law)
        accept[:, j] = torch.where(on, a_value, 0.0)
        residual[:, j] = torch.where(on, r_value, 0.0)
        survive = torch.where(on, survive * (1.0 - a_value), survive)
        r_node = torch.where(on[:, None], r_next, r_node)
    if sampled:
        law = p_nodes.clone()
    else:
        law = torch.where((survive > 0)[:, None], law + survive[:, None] * r_node, law)
    return Steps(accept, residual, r_node, law)


def unzeroed_steps_rows(rule: Rule, p_nodes: torch.Tensor, q_nodes: torch.Tensor, tokens: torch.Tensor,
                        present: torch.Tensor, mode: str) -> Steps:
    """The planted ``sibling_not_zeroed`` bug (``audit.mutants``) at ``M`` parent slots: every child tried
    against ``p`` itself, the fallback drawn from ``p``."""
    rows, width = tokens.shape
    accept = torch.where(present, p_nodes.gather(-1, tokens), 0.0)
    law = torch.zeros_like(p_nodes)
    survive = torch.ones(rows, dtype=torch.float64, device=p_nodes.device)
    for j in range(width):
        on = present[:, j]
        law = torch.where(on[:, None], law.scatter_add(-1, tokens[:, j : j + 1], (survive * accept[:, j])[:, None]), law)
        survive = torch.where(on, survive * (1.0 - accept[:, j]), survive)
    return Steps(accept, accept.clone(), p_nodes, law + survive[:, None] * p_nodes)


def shape_rows(parents: torch.Tensor, valid: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's children table ``[G, N + 1, W]`` (the nodes under each parent slot, in node order, −1
    after) and each node's child number ``[G, N]``, from ``parents`` ``[G, N]`` (−1: the root) and ``valid``."""
    groups, nodes = parents.shape
    device = parents.device
    slot = parents + 1
    member = (slot[:, None, :] == torch.arange(nodes + 1, device=device)[None, :, None]) & valid[:, None, :]
    rank = member.to(torch.int64).cumsum(-1) - 1  # [G, S, N]: a node's rank among its slot's children
    sibling = rank.gather(1, slot.clamp(0, nodes)[:, None, :]).squeeze(1)
    children = torch.full((groups, nodes + 1, width + 1), -1, dtype=torch.long, device=device)
    index = torch.where(member, rank.clamp(max=width), width)
    children.scatter_(2, index, torch.arange(nodes, device=device)[None, None, :].expand(groups, nodes + 1, -1))
    children[..., width] = -1
    return children[..., :width], torch.where(valid, sibling, 0)


def ancestors_rows(parents: torch.Tensor, depths: torch.Tensor, depth: int) -> torch.Tensor:
    """``[G, N, N]`` bool: node ``i`` of each row sees node ``j`` iff ``j`` is ``i`` or one of its
    ancestors (``parents`` and ``depths`` ``[G, N]``; a parent is one level up)."""
    groups, nodes = parents.shape
    device = parents.device
    sees = torch.eye(nodes, dtype=torch.bool, device=device).expand(groups, nodes, nodes).clone()
    rows = torch.arange(groups, device=device)[:, None]
    for level in range(2, depth + 1):
        inherited = sees[rows, parents.clamp(min=0)]  # [G, N, N]: each node's parent's row
        sees = torch.where((depths == level)[..., None], sees | inherited, sees)
    return sees


@dataclass
class WalkRows:
    """The walk of ``G`` rows: ``path`` ``[G, D]`` (nodes accepted at depths 1…, −1 after),
    ``accepted`` ``[G]``, ``end`` ``[G]`` (``NO_DRAW``, ``REJECTED`` or ``BONUS``), ``token`` ``[G]`` (the
    final draw), ``finished`` ``[G]`` (an EOS ended the round), ``tried`` and ``kept`` ``[G, N]`` and the coin
    of every tried node ``coin`` ``[G, N]``; ``slots`` ``[G, D + 1]``: the parent slot deciding each depth."""

    path: torch.Tensor
    accepted: torch.Tensor
    end: torch.Tensor
    token: torch.Tensor
    finished: torch.Tensor
    tried: torch.Tensor
    kept: torch.Tensor
    coin: torch.Tensor
    slots: torch.Tensor


NO_DRAW, REJECTED, BONUS = 0, 1, 2


def walk_rows(rule: Rule, depth: int, children: torch.Tensor, present: torch.Tensor, steps: Steps,
              p_laws: torch.Tensor, tokens: torch.Tensor, u_accept: torch.Tensor, u_fallback: torch.Tensor,
              budget: torch.Tensor, eos: torch.Tensor) -> WalkRows:
    """``reference.tree_walk.walk`` of every row as a fixed loop over the depths (see the module docstring).

    ``children`` and ``present`` ``[G, N + 1, W]``; ``steps`` over ``[G·(N + 1)]`` parent slots; ``p_laws``
    ``[G, N + 1, V]``; ``tokens`` ``[G, N]``; ``u_accept`` ``[G, D + 1, ≥ W]``, ``u_fallback`` ``[G, D + 1]``."""
    groups, slots_count, width = children.shape
    nodes = slots_count - 1
    device = p_laws.device
    accept = steps.accept.reshape(groups, slots_count, width)
    rows = torch.arange(groups, device=device)
    sibling = torch.arange(width, device=device)
    current = torch.zeros(groups, dtype=torch.long, device=device)  # parent slot: 0 the root, n + 1 node n
    alive = torch.ones(groups, dtype=torch.bool, device=device)
    path = torch.full((groups, max(1, depth)), -1, dtype=torch.long, device=device)
    end = torch.full((groups,), NO_DRAW, dtype=torch.long, device=device)
    end_slot = torch.zeros(groups, dtype=torch.long, device=device)
    end_depth = torch.zeros(groups, dtype=torch.long, device=device)
    finished = torch.zeros(groups, dtype=torch.bool, device=device)
    tried = torch.zeros((groups, nodes + 1), dtype=torch.bool, device=device)  # column N: a sink
    kept = torch.zeros_like(tried)
    coin = torch.zeros((groups, nodes + 1), dtype=torch.float64, device=device)
    decided = torch.zeros((groups, depth + 1), dtype=torch.long, device=device)
    for level in range(depth + 1):
        here_children = children[rows, current]  # [G, W]
        here_present = present[rows, current]
        coins = u_accept[:, level, :width]
        hit = (coins < accept[rows, current]) & here_present
        any_hit = hit.any(-1)
        first = hit.to(torch.int64).argmax(-1)
        leaf = ~here_present.any(-1)
        decided[:, level] = current
        # Siblings tried: up to the kept one, or every present one when all were refused.
        tried_now = here_present & (sibling[None, :] <= torch.where(any_hit, first, width)[:, None]) & alive[:, None]
        columns = torch.where(tried_now, here_children, nodes)
        tried[rows[:, None], columns] = True
        coin[rows[:, None], columns] = torch.where(tried_now, coins, 0.0)
        child = here_children.gather(-1, first[:, None]).squeeze(-1)
        accepted_now = alive & any_hit
        kept[rows, torch.where(accepted_now, child, nodes)] = True
        refused_now = alive & ~leaf & ~any_hit
        leaf_now = alive & leaf
        bonus_now = leaf_now & (level < budget)
        end = torch.where(refused_now, REJECTED, torch.where(bonus_now, BONUS, end))
        ends_here = refused_now | leaf_now
        end_slot = torch.where(ends_here, current, end_slot)
        end_depth = torch.where(ends_here, level, end_depth)
        if level < depth:
            path[:, level] = torch.where(accepted_now, child, -1)
        child_token = tokens.gather(-1, child.clamp(min=0)[:, None]).squeeze(-1) if nodes else child
        eos_child = accepted_now & torch.isin(child_token, eos)
        finished = finished | eos_child
        alive = accepted_now & ~eos_child
        current = torch.where(accepted_now, child + 1, current)
    accepted = (path[:, :depth] >= 0).sum(-1)
    law = torch.where((end == REJECTED)[:, None], steps.rest.reshape(groups, slots_count, -1)[rows, end_slot],
                      rule.bonus(p_laws[rows, end_slot]))
    token = draw_rows(law, u_fallback.gather(-1, end_depth[:, None]).squeeze(-1))
    finished = finished | ((end != NO_DRAW) & torch.isin(token, eos))
    return WalkRows(path[:, :depth], accepted, end, token, finished, tried[:, :-1], kept[:, :-1], coin[:, :-1], decided)


def present_rows(children: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[G, N + 1, W]``: whether each child entry of each parent slot is a node of the row."""
    padded = torch.nn.functional.pad(valid, (0, 1))  # column N: the −1 padding, never present
    index = torch.where(children >= 0, children, valid.shape[1])
    return padded.gather(1, index.reshape(index.shape[0], -1)).reshape(children.shape)


def reach_rows(accept: torch.Tensor, parents: torch.Tensor, sibling: torch.Tensor, depths: torch.Tensor,
               valid: torch.Tensor, depth: int) -> torch.Tensor:
    """``reach(v)`` ``[G, N]``: ``reach(parent)·Π_{i<j}(1 − a_i)·a_j`` (``reference.tree_walk.reach_probabilities``);
    ``accept`` ``[G, N + 1, W]``, the rest ``[G, N]``."""
    survive = torch.cumprod(torch.nn.functional.pad(1.0 - accept, (1, 0), value=1.0), dim=-1)[..., :-1]
    slot = (parents + 1).clamp(min=0)
    number = sibling.clamp(min=0, max=max(0, accept.shape[-1] - 1))
    rows = torch.arange(accept.shape[0], device=accept.device)[:, None]
    before, own = survive[rows, slot, number], accept[rows, slot, number]
    reach = torch.zeros(valid.shape, dtype=torch.float64, device=accept.device)
    for level in range(1, depth + 1):
        base = torch.ones_like(reach) if level == 1 else reach.gather(1, parents.clamp(min=0))
        reach = torch.where(depths == level, base * before * own, reach)
    return torch.where(valid, reach, 0.0)
