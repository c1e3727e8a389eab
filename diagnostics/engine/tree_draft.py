"""Drafting a token tree per round: the shape, the children of each node, the draft's KV cache.

Three shapes. A fixed shape ``K1,…,Kd`` expands every node at depth ``i − 1`` into ``Ki``
children (``3,2,1``: 3 + 6 + 6 nodes). A sparse shape lists its nodes as paths of child
numbers, as Medusa's ``medusa_choices`` do: ``[[0], [1], [0, 0]]`` is the root's first two
children and the first child of the first (``top``: the ``j``-th most likely token; sampled: the
``j``-th draw). A dynamic shape (EAGLE-2 style) keeps the ``N`` nodes of
depth ``≤ D`` with the highest path probability ``Π q(token | path)`` under the draft; since a
child's path probability never exceeds its parent's, the kept set is closed under ancestors.

Children of a node with draft law ``q``:

* ``top``: the ``K`` most likely tokens under ``q`` in decreasing order (ties: lower id first),
  a deterministic choice (EAGLE). The dynamic shape always uses it.
* ``sample``: ``K`` independent draws ``x_j ~ q`` (SpecInfer); siblings may repeat a token.
* ``sample-distinct``: draws without replacement, ``x_j ~ q`` with ``x_1 … x_{j−1}`` removed and
  renormalised (Sequoia); fewer than ``K`` children when ``q`` has fewer tokens.

Every draw uses the uniform keyed ``(seed, output position of the child, "draft", index of the
child within its depth)``: a chain-shaped tree ``1,1,…`` with ``sample`` draws exactly the
tokens the chain engine draws with the same seed.

A model drafter expands level by level: one forward for the uncached committed tokens (the
root's law), then one forward per depth over that depth's nodes under a tree attention mask
(``diagnostics.engine.tree_attention``). Its cache then holds the prefix and every node fed; after the
round it keeps the prefix and the accepted path's rows (gather, then the rest is gone).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import torch

from diagnostics.policy import Policy, probabilities
from diagnostics.rng import sample_inverse_cdf, sample_token
from diagnostics.engine.tree_attention import TokenTree, tree_inputs

CHILDREN_MODES = ("top", "sample", "sample-distinct")
MAX_TREE_NODES = 128
MAX_TREE_DEPTH = 32
DEFAULT_BUDGET_DEPTH = 5

Uniform = Callable[[int, int], float]  # (depth of the drawn child, its index within that depth) -> u


class TreeSpecError(ValueError):
    """A tree shape that cannot be drafted; the message says what to write instead."""


@dataclass(frozen=True)
class TreeSpec:
    """How each round's tree is drafted: a fixed ``branching``, sparse ``choices`` (paths of child
    numbers, Medusa's ``medusa_choices``) or a ``budget`` of nodes to ``depth``."""

    branching: tuple[int, ...] = ()
    budget: int | None = None
    depth: int | None = None
    children: str = "top"
    choices: tuple[tuple[int, ...], ...] = ()

    @property
    def fixed(self) -> bool:
        """The shape is given (``branching`` or ``choices``), not grown by path probability."""
        return bool(self.branching or self.choices)

    @property
    def max_depth(self) -> int:
        if self.choices:
            return max(len(path) for path in self.choices)
        return len(self.branching) if self.branching else int(self.depth or 0)

    def width(self, path: tuple[int, ...]) -> int:
        """How many children the node at ``path`` (child numbers from the root; ``()``: the root) may have."""
        if self.choices:
            return sum(1 for choice in self.choices if len(choice) == len(path) + 1 and choice[:-1] == path)
        if self.branching:
            return self.branching[len(path)] if len(path) < len(self.branching) else 0
        return int(self.budget or 0)

    @property
    def max_nodes(self) -> int:
        """Upper bound on the nodes of one round's tree."""
        if self.choices:
            return len(self.choices)
        if not self.branching:
            return int(self.budget or 0)
        total, width = 0, 1
        for k in self.branching:
            width *= k
            total += width
        return total

    @property
    def text(self) -> str:
        """What ``--tree`` (or ``--tree-budget``/``--tree-depth``) was: ``3,2,1``, ``[[0],[1],[0,0]]``
        or ``budget 16, depth 4``."""
        if self.choices:
            return "[" + ",".join("[" + ",".join(str(i) for i in path) + "]" for path in self.choices) + "]"
        if self.branching:
            return ",".join(str(k) for k in self.branching)
        return f"budget {self.budget}, depth {self.depth}"

    def limited(self, depth: int) -> TreeSpec:
        """The same shape cut to at most ``depth`` levels (the round's remaining token budget)."""
        if depth >= self.max_depth:
            return self
        if self.choices:
            return TreeSpec(choices=tuple(path for path in self.choices if len(path) <= depth), children=self.children)
        if self.branching:
            return TreeSpec(branching=self.branching[:depth], children=self.children)
        return TreeSpec(budget=self.budget, depth=depth, children=self.children)


def _whole(name: str, value: object, low: int, high: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise TreeSpecError(f"{name}: {value!r} is not a whole number") from None
    if not low <= number <= high:
        raise TreeSpecError(f"{name} must lie in [{low}, {high}], got {number}")
    return number


def parse_tree(
    tree: str | Sequence[int] | None = None,
    budget: int | str | None = None,
    depth: int | str | None = None,
    children: str | None = "top",
) -> TreeSpec | None:
    """``--tree 3,2,1`` or ``--tree-budget N [--tree-depth D]`` (with ``--tree-children``) → a
    ``TreeSpec``; ``None`` when no tree was asked for (the chain engine). One-line errors."""
    children = (children or "top").strip().lower()
    if children not in CHILDREN_MODES:
        raise TreeSpecError(f"tree children {children!r} is not one of {', '.join(CHILDREN_MODES)}")
    if tree is not None and str(tree).strip() != "" and budget is not None:
        raise TreeSpecError("give either --tree K1,K2,… or --tree-budget N (with --tree-depth D), not both")
    if budget is not None:
        size = _whole("tree budget", budget, 1, MAX_TREE_NODES)
        levels = _whole("tree depth", depth if depth is not None else DEFAULT_BUDGET_DEPTH, 1, MAX_TREE_DEPTH)
        if children != "top":
            raise TreeSpecError("a budget tree keeps the nodes of highest draft probability, so its children are the "
                                "draft's top tokens; use --tree-children top, or a fixed shape --tree K1,K2,… to sample")
        return TreeSpec(budget=size, depth=levels, children=children)
    if depth is not None:
        raise TreeSpecError("--tree-depth goes with --tree-budget N; a fixed shape --tree K1,K2,… has its own depth")
    if tree is None or (isinstance(tree, str) and not tree.strip()):
        return None
    if isinstance(tree, str) and tree.strip().startswith("["):
        return TreeSpec(choices=parse_choices(tree), children=children)
    pieces = [piece.strip() for piece in tree.split(",")] if isinstance(tree, str) else list(tree)
    if not pieces or any(piece == "" for piece in pieces):
        raise TreeSpecError(f"tree {tree!r}: write the children per level, e.g. 3,2,1")
    branching = tuple(_whole("tree branching", piece, 1, MAX_TREE_NODES) for piece in pieces)
    if len(branching) > MAX_TREE_DEPTH:
        raise TreeSpecError(f"a tree is at most {MAX_TREE_DEPTH} levels deep, got {len(branching)}")
    spec = TreeSpec(branching=branching, children=children)
    if spec.max_nodes > MAX_TREE_NODES:
        raise TreeSpecError(f"tree {spec.text} has {spec.max_nodes} nodes; at most {MAX_TREE_NODES} per round")
    return spec


def parse_choices(text: str) -> tuple[tuple[int, ...], ...]:
    """A sparse tree ``[[0], [1], [0, 0], …]`` (Medusa's ``medusa_choices``) → its paths, breadth-first.

    Each path names a node by the child numbers leading to it. Every node's parent must be listed
    and its children numbered ``0, 1, …`` without gaps (child ``j`` is the ``j``-th most likely
    token, or the ``j``-th draw, so a gap would name a token that was never drafted)."""
    import json

    try:
        raw = json.loads(text)
    except ValueError:
        raise TreeSpecError("a sparse tree is a JSON list of paths such as [[0],[1],[0,0]]; this one does not parse") from None
    if not isinstance(raw, list) or not raw or not all(isinstance(path, list) and path for path in raw):
        raise TreeSpecError("a sparse tree is a non-empty list of non-empty paths such as [[0],[1],[0,0]]")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_TREE_NODES for path in raw for i in path):
        raise TreeSpecError(f"the child numbers of a sparse tree are whole numbers in [0, {MAX_TREE_NODES - 1}]")
    paths = sorted({tuple(path) for path in raw}, key=lambda path: (len(path), path))
    if len(paths) < len(raw):
        raise TreeSpecError("a sparse tree lists a path twice; list each node once")
    if len(paths) > MAX_TREE_NODES:
        raise TreeSpecError(f"the sparse tree has {len(paths)} nodes; at most {MAX_TREE_NODES} per round")
    if len(paths[-1]) > MAX_TREE_DEPTH:
        raise TreeSpecError(f"a tree is at most {MAX_TREE_DEPTH} levels deep, got {len(paths[-1])}")
    listed = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in listed:
            raise TreeSpecError(f"the sparse tree lists {list(path)} but not its parent {list(path[:-1])}; add the parent")
        if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in listed:
            raise TreeSpecError(f"the sparse tree lists {list(path)} but not {list(path[:-1] + (path[-1] - 1,))}: "
                                "number each node's children 0, 1, 2, … without gaps")
    return tuple(paths)


def spec_from_text(text: str | None, children: str | None) -> TreeSpec | None:
    """The ``TreeSpec`` a stored ``runs.tree`` (``TreeSpec.text``) and ``tree_children`` describe."""
    if text is None or not str(text).strip():
        return None
    import re

    match = re.fullmatch(r"\s*budget\s+(\d+),\s*depth\s+(\d+)\s*", str(text))
    if match:
        return parse_tree(budget=match.group(1), depth=match.group(2), children=children)
    return parse_tree(str(text), children=children)


@dataclass
class DraftTree:
    """One round's drafted tree.

    ``q_laws[0]`` is the draft law at the root, ``q_laws[i + 1]`` at node ``i`` (zeros where a
    node was not expanded); ``q_token[i]`` is the parent's ``q`` of node ``i``'s token and
    ``u_draft[i]`` the uniform it was drawn with (``None``: a deterministic choice).
    """

    tree: TokenTree
    q_laws: torch.Tensor
    q_token: list[float]
    u_draft: list[float | None]
    cache_rows: list[int | None] = field(default_factory=list)  # a node's row in the draft cache after the prefix

    @property
    def children(self) -> list[list[int]]:
        """``children[0]``: the root's children in order; ``children[i + 1]``: node ``i``'s."""
        result: list[list[int]] = [[] for _ in range(len(self.tree.tokens) + 1)]
        for node, parent in enumerate(self.tree.parents):
            result[parent + 1].append(node)
        return result


@dataclass
class _Building:
    """The nodes drafted so far, in the order they were created (by depth)."""

    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    paths: list[tuple[int, ...]] = field(default_factory=list)  # child numbers from the root
    q_token: list[float] = field(default_factory=list)
    u_draft: list[float | None] = field(default_factory=list)
    score: list[float] = field(default_factory=list)  # path probability under the draft
    laws: dict[int, torch.Tensor] = field(default_factory=dict)  # node (-1: root) -> its draft law

    def path(self, node: int) -> tuple[int, ...]:
        return () if node < 0 else self.paths[node]

    def add(self, parent: int, token: int, q_parent: torch.Tensor, u: float | None) -> None:
        q_value = float(q_parent[token])
        self.parents.append(parent)
        self.tokens.append(int(token))
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.paths.append(self.path(parent) + (sum(1 for other in self.parents[:-1] if other == parent),))
        self.q_token.append(q_value)
        self.u_draft.append(u)
        self.score.append((1.0 if parent < 0 else self.score[parent]) * q_value)


def _top_children(q_draft: torch.Tensor, k: int) -> list[int]:
    """The ``k`` most likely tokens with ``q > 0``, in decreasing ``q``, ties by lower id.

    ``topk`` of a few more than ``k`` then a stable order among them: a full sort of a
    49,152-token law per expanded node cost a tenth of a tree round on CPU. A tie running past
    the extra margin falls back to the full sort, so the order is always the documented one."""
    vocab = q_draft.shape[-1]
    k = min(k, vocab)
    margin = min(vocab, k + 8)
    values, ids = torch.topk(q_draft, margin)
    if margin < vocab and k > 0 and float(values[-1]) == float(values[k - 1]):
        order = torch.sort(-q_draft, stable=True).indices[:k].tolist()
    else:
        order = sorted(zip((-values).tolist(), ids.tolist()))[:k]
        order = [token for _, token in order]
    return [int(token) for token in order if q_draft[token] > 0]


def _children(q_draft: torch.Tensor, k: int, mode: str, depth: int, first_index: int,
              uniform: Uniform) -> list[tuple[int, float | None]]:
    """``k`` children of a node with draft law ``q_draft``: ``(token, uniform used)`` in order."""
    if mode == "top":
        return [(token, None) for token in _top_children(q_draft, k)]
    if mode == "sample":
        us = [uniform(depth, first_index + j) for j in range(k)]
        tokens = sample_inverse_cdf(q_draft, torch.tensor(us, dtype=torch.float64, device=q_draft.device)[None])[0]
        return [(int(token), u) for token, u in zip(tokens, us)]
    chosen: list[tuple[int, float | None]] = []
    law = q_draft
    for j in range(k):
        if not (law > 0).any():
            break
        u = uniform(depth, first_index + j)
        token = sample_token(law, u)
        chosen.append((token, u))
        law = law.clone()
        law[token] = 0.0
    return chosen


def grow(spec: TreeSpec, root_law: torch.Tensor, expand: Callable[[_Building, list[int]], Generator],
         uniform: Uniform, eos: set[int]) -> Generator:
    """Grow a tree level by level (a generator: it passes on the forwards ``expand`` asks for).
    ``expand(building, nodes)`` returns the draft law after each of ``nodes`` (a forward of the
    draft over them). Fixed shapes add ``K_d`` children to each
    non-EOS node of depth ``d − 1``, sparse shapes the children their paths list; budget shapes keep the ``N`` nodes of highest path
    probability (each level's candidates are every kept node's top ``N`` children)."""
    built = _Building(laws={-1: root_law})
    frontier = [-1]
    for depth in range(1, spec.max_depth + 1):
        level_start = len(built.tokens)
        if spec.fixed:
            for parent in frontier:
                k = spec.width(built.path(parent))
                if k == 0 or (parent >= 0 and built.tokens[parent] in eos):
                    continue
                for token, u in _children(built.laws[parent], k, spec.children, depth, len(built.tokens) - level_start, uniform):
                    built.add(parent, token, built.laws[parent], u)
        else:
            _grow_budget_level(built, frontier, int(spec.budget), eos)
        level = list(range(level_start, len(built.tokens)))
        if not level:
            break
        if depth < spec.max_depth:
            for node, law in zip(level, (yield from expand(built, level))):
                built.laws[node] = law
        frontier = level
    return built


def _grow_budget_level(built: _Building, frontier: list[int], budget: int, eos: set[int]) -> None:
    """Add the candidates of this level that rank among the ``budget`` best nodes so far."""
    candidates: list[tuple[float, int, int, float]] = []  # (score, parent, token, q value)
    for parent in frontier:
        if parent >= 0 and built.tokens[parent] in eos:
            continue
        q_draft = built.laws[parent]
        base = 1.0 if parent < 0 else built.score[parent]
        for token in _top_children(q_draft, budget):
            candidates.append((base * float(q_draft[token]), parent, token, float(q_draft[token])))
    if not candidates:
        return
    # Rank old nodes first on ties so a kept set stays closed under ancestors.
    ranked = sorted([(score, 0, index) for index, score in enumerate(built.score)]
                    + [(score, 1, index) for index, (score, *_rest) in enumerate(candidates)],
                    key=lambda item: (-item[0], item[1], item[2]))[:budget]
    # Added in candidate order (by parent, then decreasing q): the order a parent tries its children.
    for index in sorted(index for _score, is_new, index in ranked if is_new):
        _, parent, token, _q = candidates[index]
        built.add(parent, token, built.laws[parent], None)


def finish(built: _Building, spec: TreeSpec, vocab: int, fed: int) -> DraftTree:
    """The round's tree: for a budget shape the ``N`` best nodes, renumbered breadth-first."""
    count = len(built.tokens)
    if spec.fixed or count <= int(spec.budget or 0):
        keep = list(range(count))
    else:
        keep = sorted(sorted(range(count), key=lambda node: (-built.score[node], built.depths[node], node))[: spec.budget])
    new_index = {old: new for new, old in enumerate(keep)}
    parents = tuple(-1 if built.parents[old] < 0 else new_index[built.parents[old]] for old in keep)
    root = built.laws[-1]
    q_laws = torch.zeros(len(keep) + 1, vocab, dtype=torch.float64, device=root.device)
    q_laws[0] = root
    for new, old in enumerate(keep):
        if old in built.laws:
            q_laws[new + 1] = built.laws[old]
    return DraftTree(
        tree=TokenTree(parents=parents, tokens=tuple(built.tokens[old] for old in keep)),
        q_laws=q_laws,
        q_token=[built.q_token[old] for old in keep],
        u_draft=[built.u_draft[old] for old in keep],
        cache_rows=[old if old < fed else None for old in keep],
    )


class TreeDraftingModel:
    """The tree side of one row of a model drafter: level-by-level forwards under a tree mask,
    path-only commit. ``row`` is the ``drafting.ModelDrafter`` (its ``forward`` and its slot)."""

    def __init__(self, row, policy: Policy, fit: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
        self.row = row
        self.policy = policy
        self.fit = fit

    def propose(self, committed: list[int], spec: TreeSpec, uniform: Uniform, vocab: int, eos: set[int]) -> Generator:
        row = self.row
        root_logits = (yield from row.forward(committed[row.cached :], keep=1))[0]
        root_law = probabilities(self.fit(root_logits, vocab), self.policy)
        prefix_length = len(committed)
        fed = [0]

        def expand(built: _Building, level: list[int]) -> Generator:
            so_far = TokenTree(parents=tuple(built.parents), tokens=tuple(built.tokens))
            # Every node of an earlier depth was fed in creation order, so the slot holds the
            # prefix and nodes[:level[0]], and this level's nodes are the queries.
            assert fed[0] == level[0], "a tree level must follow every earlier node in the draft cache"
            mask, positions = tree_inputs(prefix_length, so_far, torch.float32, cached=prefix_length, first_node=level[0],
                                          device=row.stage.device)
            logits = yield from row.forward([built.tokens[node] for node in level], keep=len(level),
                                            positions=positions[0], visible=mask[0, 0] == 0)
            fed[0] += len(level)
            return list(probabilities(self.fit(logits, vocab), self.policy))

        built = yield from grow(spec, root_law, expand, uniform, eos)
        return finish(built, spec, vocab, fed[0])

    def commit(self, prefix_length: int, draft: DraftTree, path: list[int]) -> None:
        """Keep the prefix and the rows of the accepted path's nodes that were fed, in path order."""
        rows = list(range(prefix_length))
        for node in path:
            row = draft.cache_rows[node]
            if row is None:
                break
            rows.append(prefix_length + row)
        if rows != list(range(len(rows))):
            self.row.stage.keep_rows(self.row.slot, rows)
        self.row.cached = len(rows)


def ngram_tree(context: list[int], n: int, spec: TreeSpec, vocab: int, eos: set[int], device: torch.device) -> DraftTree:
    """Prompt lookup as a tree: the continuations after earlier occurrences of the context's last
    ``n``-gram (then shorter ones), latest first, merged into a trie within the shape. Every choice
    is deterministic (``q`` a point mass per candidate)."""
    tree = ngram_trie(context, n, spec, eos)
    q_laws = torch.zeros(len(tree.tokens) + 1, vocab, dtype=torch.float64, device=device)
    for node, parent in reversed(list(enumerate(tree.parents))):
        q_laws[parent + 1] = 0.0
        q_laws[parent + 1, tree.tokens[node]] = 1.0  # ends on the first child: q = δ of the top candidate
    count = len(tree.tokens)
    return DraftTree(tree=tree, q_laws=q_laws, q_token=[1.0] * count, u_draft=[None] * count, cache_rows=[None] * count)


def ngram_trie(context: list[int], n: int, spec: TreeSpec, eos: set[int]) -> TokenTree:
    """The trie of ``ngram_tree``, on the host: its nodes breadth-first, each node's children in the order
    their continuations were found (the first is the node's point-mass ``q``)."""
    parents: list[int] = []
    tokens: list[int] = []
    depths: list[int] = []
    children: dict[int, dict[int, int]] = {-1: {}}
    paths: dict[int, tuple[int, ...]] = {-1: ()}  # child numbers from the root, for a sparse shape
    limit, levels = spec.max_nodes, spec.max_depth
    length = len(context)
    full = False
    for size in range(min(n, length - 1), 0, -1):
        suffix = context[length - size :]
        for start in range(length - size - 1, -1, -1):
            if full:
                break
            if context[start : start + size] != suffix:
                continue
            node = -1
            for depth, token in enumerate(context[start + size : start + size + levels], start=1):
                if token in children[node]:
                    node = children[node][token]
                    continue
                cap = spec.width(paths[node]) if spec.fixed else limit
                if len(children[node]) >= cap or (node >= 0 and tokens[node] in eos):
                    break
                if len(tokens) >= limit:
                    full = True
                    break
                paths[len(tokens)] = paths[node] + (len(children[node]),)
                parents.append(node)
                tokens.append(int(token))
                depths.append(depth)
                children[len(tokens) - 1] = {}
                children[node][int(token)] = len(tokens) - 1
                node = len(tokens) - 1
    # Renumber breadth-first, keeping each node's children in the order they were found.
    order = sorted(range(len(tokens)), key=lambda node: (depths[node], node))
    new_index = {old: new for new, old in enumerate(order)}
    return TokenTree(parents=tuple(-1 if parents[old] < 0 else new_index[parents[old]] for old in order),
                     tokens=tuple(tokens[old] for old in order))
