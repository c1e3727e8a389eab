"""End-to-end losslessness: the engine's emitted tokens follow the target's exact sequence law.

For each setup, many seeded generations on tiny random models give the joint law of two
consecutive emitted tokens; the exact law comes from teacher forcing (cache-free forwards on
every prefix). The χ² test at level ``engine_sampling.LEVEL`` uses ``samples_for(setup)`` generations, enough to catch any
error of total variation 0.01 with probability ≥ ``POWER`` (dof = V² − 1 = 15, the largest
a window can have). The generations are rows of batches, mixed with rows of other prompt
lengths, rules, policies and seeds (``engine_sampling``). A planted off-by-one in the KV-cache
rollback, and rows of a batch leaking into each other, must fail the same test.
"""

from __future__ import annotations

import pytest
from engine_sampling import THREE, Setup, assert_caught, assert_lossless, assert_sizes_catch_one_percent


# Slow tier: end-to-end losslessness statistics (about 10^5 generations a setup) and their planted bugs
pytestmark = pytest.mark.slow

SETUPS = {
    "model drafter, gamma 1, no truncation": Setup(draft="model", gamma=1, start=0),
    "model drafter, gamma 3, top-k 3 at T 0.9": Setup(draft="model", gamma=3, start=1, policy={"top_k": 3, "temperature": 0.9}),
    "ngram drafter, gamma 3, top-p 0.85": Setup(draft="ngram:2", gamma=3, start=2, policy={"top_p": 0.85}),
    "ngram drafter, gamma 5, no truncation": Setup(draft="ngram:2", gamma=5, start=3),
    # Adaptive drafting: a block ends after a draft x with q(x) < 0.4 (2.1 drafts per block here
    # instead of 2.7 without the stop, with this budget).
    "model drafter, gamma 4, draft-stop 0.4": Setup(draft="model", gamma=4, start=1, draft_stop=0.4),
    # Draft heads reading a 4-layer tiny Llama's hidden states (the first round is the target's alone).
    # Over 3 tokens (dof 8): 93,880 generations give the same power against a TV of 0.01.
    "EAGLE-3 head, gamma 3, top-k 2 at T 0.9": Setup(draft="eagle3", gamma=3, start=1, vocab=3, prompt=THREE,
                                                      policy={"top_k": 2, "temperature": 0.9}),
    "Medusa heads, gamma 3, no truncation": Setup(draft="medusa", gamma=3, start=1, vocab=3, prompt=THREE),
}


def test_sample_size_catches_one_percent() -> None:
    assert_sizes_catch_one_percent(SETUPS)


@pytest.mark.parametrize("label", list(SETUPS))
def test_engine_is_lossless(label: str) -> None:
    assert_lossless(label, SETUPS[label])


@pytest.mark.parametrize("planted", ["row_gets_neighbours_p", "row_cache_swapped"])
def test_planted_row_leak_fails(planted: str) -> None:
    """Rows of a batch leaking into each other (a row verified with its neighbour's p; a slot table
    out of step, so a row reads another row's cache) must fail the same test; their effect is large,
    so a tenth of the samples rejects them."""
    setup = Setup(draft="model", gamma=3, start=1, planted=planted)
    assert_caught(planted, setup)


def test_planted_rollback_off_by_one_fails() -> None:
    """Keeping the refused draft's keys and values in the target cache must be caught.

    The bug moves the window's law by TV ≈ 0.6, so a tenth of the samples already rejects at any
    reasonable level; more samples would only reject harder.
    """
    # Without distractor rows: on a longer row the bug also crashes (a bonus row it never scored),
    # which would end the batch; the law of the tested rows is what must fail here.
    setup = Setup(draft="model", gamma=3, start=1, planted="rollback", distractors=False)
    assert_caught("rollback", setup)
