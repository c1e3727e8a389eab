"""One target forward over a token tree: the 4D attention mask, the positions, the per-node logits.

A tree of draft nodes hangs below the last committed token (the root). Node ``i`` has a parent
(``-1``: the root) and a token; its depth is 1 + its parent's depth (the root's children have
depth 1). In the forward over ``prefix + nodes``, node ``i`` must see the prefix, its ancestors
and itself, and nothing else, at position ``len(prefix) − 1 + depth(i)`` (where it would sit
in a plain sequence along its path). Then the logits at node ``i`` are the laws after the path
to ``i``, exactly as a sequential forward along that path would give them.

Traps, each checked by ``tests/test_tree_attention.py``: a float mask is *additive* (0 where
visible, the dtype's most negative value where hidden), so a 0/1 float mask is silently wrong;
``position_ids`` must be passed explicitly (the default counts nodes, not depths); a
``DynamicCache`` is modified in place by every forward, so a tree forward gets a copy of the
prefix cache, never the one a chain of calls keeps using.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch

from diagnostics.models import LoadedModel, float_logits


@dataclass(frozen=True)
class TokenTree:
    """Draft nodes in breadth-first order: ``parents[i]`` is an earlier node's index or ``-1`` (the root)."""

    parents: tuple[int, ...]
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.tokens):
            raise ValueError(f"a tree needs one parent per token: {len(self.parents)} parents, {len(self.tokens)} tokens")
        for index, parent in enumerate(self.parents):
            if not -1 <= parent < index:
                raise ValueError(f"node {index}'s parent {parent} is not an earlier node or -1 (the root)")

    @cached_property
    def depths(self) -> list[int]:
        """Depth of each node: 1 for the root's children."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node``, inclusive."""
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def visible(self, device: torch.device | str) -> torch.Tensor:
        """``[N, N]`` bool on ``device``: node ``i`` sees node ``j`` iff ``j`` is ``i`` or one of its ancestors."""
        return self._visible.to(device=device, copy=True)

    @cached_property
    def _visible(self) -> torch.Tensor:
        # Built on the host once per tree (a row-by-row OR over parents), copied to the model's device.
        count = len(self.parents)
        sees = torch.eye(count, dtype=torch.bool, device="cpu")
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                sees[node] |= sees[parent]  # a parent is an earlier node, so its row is complete
        return sees


def tree_inputs(
    prefix_length: int, tree: TokenTree, dtype: torch.dtype, cached: int = 0, first_node: int = 0, *,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The additive 4D mask ``[1, 1, Q, K]`` and ``position_ids`` ``[1, Q]`` of a forward whose queries
    are the uncached prefix tokens (``prefix_length − cached`` of them) and then the nodes from
    ``first_node`` on, and whose keys are the whole prefix and every node (the cache holds the
    prefix's first ``cached`` tokens and the nodes before ``first_node``, in breadth-first order).
    Visible: 0; hidden: ``finfo(dtype).min``. Node ``i`` sits at position ``prefix_length − 1 + depth(i)``.

    The result depends on the tree's shape only (not its tokens), and rounds and rows of a batch
    repeat shapes, so it is built once per shape and ``device`` (where the model lives); the tensors
    returned are copies."""
    if first_node and cached != prefix_length:
        raise ValueError("feeding later nodes needs the whole prefix in the cache")
    mask, positions = _shape_inputs(prefix_length, tree.parents, dtype, cached, first_node, torch.device(device))
    return mask.clone(), positions.clone()


@lru_cache(maxsize=4096)
def _shape_inputs(prefix_length: int, parents: tuple[int, ...], dtype: torch.dtype, cached: int,
                  first_node: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tree = TokenTree(parents=parents, tokens=(0,) * len(parents))
    count = len(parents)
    fresh = prefix_length - cached
    keys = prefix_length + count
    allowed = torch.zeros(fresh + count - first_node, keys, dtype=torch.bool, device=device)
    rows = torch.arange(cached, prefix_length, device=device)
    allowed[:fresh, :prefix_length] = torch.arange(prefix_length, device=device)[None, :] <= rows[:, None]  # causal prefix
    allowed[fresh:, :prefix_length] = True  # every node sees the whole prefix
    allowed[fresh:, prefix_length:] = tree.visible(device)[first_node:]
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=device).masked_fill(allowed, 0.0)
    depths = torch.tensor(tree.depths[first_node:], dtype=torch.long, device=device)
    positions = torch.cat([rows, prefix_length - 1 + depths])
    return mask[None, None], positions[None]


def keep_rows(cache, rows: list[int]) -> None:
    """Keep only the cached tokens at ``rows`` (in that order) in every layer of a ``DynamicCache``:
    after a tree round, the committed prefix and the accepted path's nodes, in path order."""
    index = None
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or not getattr(layer, "is_initialized", True):
            continue
        if index is None or index.device != layer.keys.device:
            index = torch.tensor(rows, dtype=torch.long, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)


@torch.inference_mode()
def tree_logits(loaded: LoadedModel, prefix: list[int], tree: TokenTree, cache=None) -> torch.Tensor:
    """Logits ``[N + 1, V]``: row 0 after the prefix (the root's law), row ``i + 1`` after the path to
    node ``i``. ``cache``: a ``DynamicCache`` holding a leading part of ``prefix``; it is copied,
    never extended, so the caller's cache is left as it was."""
    import copy

    cached = cache.get_seq_length() if cache is not None else 0
    if cached >= len(prefix):
        raise ValueError(f"the cache holds {cached} of the prefix's {len(prefix)} tokens: leave at least the last one "
                         "out of it, its logits are the root's law")
    dtype = next(loaded.model.parameters()).dtype
    mask, positions = tree_inputs(len(prefix), tree, dtype, cached, device=loaded.device)
    ids = torch.tensor([list(prefix[cached:]) + list(tree.tokens)], device=loaded.device)
    work = copy.deepcopy(cache) if cache is not None else None
    out = loaded.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                       past_key_values=work, use_cache=work is not None)
    fresh = len(prefix) - cached
    return float_logits(out.logits[0, fresh - 1 :]).cpu()
