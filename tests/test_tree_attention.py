"""The tree forward: logits at every node equal a sequential forward along that node's path, with
and without a prefix cache, and each documented trap (0/1 float mask, default positions, a shared
cache) is caught by the same comparison."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from devices import DEVICE

from diagnostics.tiny import tiny_llama
from diagnostics.engine.tree_attention import TokenTree, tree_inputs, tree_logits

PREFIX = [1, 5, 2, 7, 3]
# Depth 1: nodes 0, 1, 2; depth 2: 3, 4 under 0 and 5 under 1; depth 3: 6 under 3 (a 3,2,1-like shape).
TREE = TokenTree(parents=(-1, -1, -1, 0, 0, 1, 3), tokens=(4, 6, 4, 8, 9, 4, 10))


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=3, vocab=12, layers=2, device=DEVICE)


def _sequential(model, prefix: list[int], tree: TokenTree) -> torch.Tensor:
    """Row 0 after the prefix, row i + 1 after the path to node i: one plain forward each."""
    rows = []
    for node in [None, *range(len(tree.tokens))]:
        path = [] if node is None else [tree.tokens[i] for i in tree.path(node)]
        with torch.inference_mode():
            logits = model.model(input_ids=torch.tensor([prefix + path], device=DEVICE), use_cache=False).logits
        rows.append(logits[0, -1].float().cpu())  # tree_logits returns the host copy
    return torch.stack(rows)


def test_tree_logits_equal_sequential_forwards_along_each_path(model) -> None:
    expected = _sequential(model, PREFIX, TREE)
    assert torch.allclose(tree_logits(model, PREFIX, TREE), expected, atol=1e-4)


def test_with_a_prefix_cache_that_is_left_untouched(model) -> None:
    cache = DynamicCache()
    with torch.inference_mode():
        model.model(input_ids=torch.tensor([PREFIX[:-1]], device=DEVICE), past_key_values=cache, use_cache=True)
    before = cache.get_seq_length()
    got = tree_logits(model, PREFIX, TREE, cache=cache)
    assert torch.allclose(got, _sequential(model, PREFIX, TREE), atol=1e-4)
    assert cache.get_seq_length() == before  # sibling branches never share (or grow) the caller's cache
    with pytest.raises(ValueError, match="leave at least the last one"):
        tree_logits(model, PREFIX[:-1], TREE, cache=cache)


def _forward(model, mask: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    ids = torch.tensor([PREFIX + list(TREE.tokens)], device=DEVICE)
    with torch.inference_mode():
        kwargs = {"position_ids": positions} if positions is not None else {}
        return model.model(input_ids=ids, attention_mask=mask, use_cache=False, **kwargs).logits[0, len(PREFIX) - 1 :].float().cpu()


def test_the_documented_traps_are_caught(model) -> None:
    """Negative controls: each mistake changes the logits the equality test compares."""
    expected = _sequential(model, PREFIX, TREE)
    mask, positions = tree_inputs(len(PREFIX), TREE, torch.float32, device=DEVICE)
    assert torch.allclose(_forward(model, mask, positions), expected, atol=1e-4)
    zero_one = (mask == 0).to(torch.float32)  # a 0/1 float mask: added to the scores, it hides nothing
    assert not torch.allclose(_forward(model, zero_one, positions), expected, atol=1e-3)
    assert not torch.allclose(_forward(model, mask, None), expected, atol=1e-3)  # positions counted per node


def test_tree_shape_checks() -> None:
    assert TREE.depths == [1, 1, 1, 2, 2, 2, 3] and TREE.path(6) == [0, 3, 6]
    with pytest.raises(ValueError, match="not an earlier node"):
        TokenTree(parents=(0,), tokens=(1,))
    with pytest.raises(ValueError, match="one parent per token"):
        TokenTree(parents=(-1,), tokens=(1, 2))
