"""End-to-end losslessness of the tree engine, at the power of the chain test.

Each setup is one children mode on a tree shape (full shapes, one three levels deep, and a sparse
one listed as Medusa's ``medusa_choices``); many seeded
generations on tiny models give the joint law of two consecutive emitted tokens, which must equal
the target's exact law by teacher forcing (χ² at level ``engine_sampling.LEVEL`` with ``samples_for(setup)`` generations: power
``≥ POWER`` against a total-variation error of 0.01, dof 15). The window (tokens 1 and 2) spans
the first round's descent and, whenever that round emits fewer than three tokens, the second
round, so the KV compaction between rounds is inside the test.

The generations are rows of batches mixed with rows of other prompt lengths, rules, policies and
seeds (``engine_sampling``). Each planted tree bug must fail the same test, and so must rows of a
batch leaking into each other (a neighbour's p; a slot table out of step): a refused sibling not zeroed before the next is
tried, ``position_ids`` counted along the flattened tree, KV compaction that keeps a refused
sibling's row. Their effects are large (TV ≥ 0.03), so a tenth of the samples rejects them.
"""

from __future__ import annotations

import pytest
from engine_sampling import THREE, Setup, assert_caught, assert_lossless, assert_sizes_catch_one_percent


# Slow tier: end-to-end losslessness statistics of the tree engine (about 10^5 generations a setup) and their planted bugs
pytestmark = pytest.mark.slow

SETUPS = {
    "top-k children, tree 2,2,1, top-k 3 at T 0.9": Setup(draft="model", gamma=0, start=1, tree=(2, 2, 1), children="top",
                                                          policy={"top_k": 3, "temperature": 0.9}),
    "sampled children, tree 2,2,1": Setup(draft="model", gamma=0, start=1, tree=(2, 2, 1), children="sample"),
    "sampled without replacement, tree 3,1": Setup(draft="model", gamma=0, start=1, tree=(3, 1), children="sample-distinct"),
    # Draft heads on a 4-layer tiny Llama over 3 tokens (dof 8: 93,880 windows give the same power).
    "EAGLE-3 head, top-k children, tree 2,1 at T 0.9": Setup(draft="eagle3", gamma=0, start=1, vocab=3, prompt=THREE,
                                                             tree=(2, 1), children="top", policy={"temperature": 0.9}),
    # A sparse tree as Medusa's medusa_choices give it: the last child of 2,2 left out.
    "Medusa heads, sampled children, sparse tree [[0],[1],[0,0],[0,1],[1,0]]": Setup(
        draft="medusa", gamma=0, start=1, vocab=3, prompt=THREE, tree="[[0],[1],[0,0],[0,1],[1,0]]", children="sample"),
}

PLANTED = {
    "sibling_not_zeroed": Setup(draft="model", gamma=0, start=1, tree=(2, 2, 1), children="top", planted="sibling_not_zeroed"),
    "flat_position_ids": Setup(draft="model", gamma=0, start=1, tree=(2, 2, 1), children="top", planted="flat_position_ids"),
    "kv_keeps_refused_sibling": Setup(draft="model", gamma=0, start=1, tree=(3, 1), children="top",
                                      planted="kv_keeps_refused_sibling"),
    "row_gets_neighbours_p": Setup(draft="model", gamma=0, start=1, tree=(2, 2, 1), children="sample",
                                   planted="row_gets_neighbours_p"),
    "row_cache_swapped": Setup(draft="model", gamma=0, start=1, tree=(2, 2, 1), children="top", planted="row_cache_swapped"),
}


def test_sample_size_catches_one_percent() -> None:
    assert_sizes_catch_one_percent(SETUPS)


@pytest.mark.parametrize("label", list(SETUPS))
def test_tree_engine_is_lossless(label: str) -> None:
    assert_lossless(label, SETUPS[label])


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_tree_bug_fails(name: str) -> None:
    assert_caught(name, PLANTED[name])
