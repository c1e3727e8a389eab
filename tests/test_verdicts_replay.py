"""Draft counters for rows made before the table kept them (``verdicts.replay``): the first N stored
generations are replayed by seed, and the counts are kept only when every replayed generation gives
exactly its stored tokens. Everyday tier: pure Python fakes, well under a second. The end-to-end use
(``verdicts --count-drafts``) is in ``test_verdicts.py``'s slow row test."""

from __future__ import annotations

import random

from diagnostics.audit.samples import Sample
from diagnostics.verdicts.replay import counting_call, replay, replay_chunks
from diagnostics.verdicts.table import row_verdict

EOS = {0}
PROMPTS = ([5, 6], [7, 8, 9])


def _engine(drafted_per_call: int = 4, accepted_per_call: int = 1, wobble_seed: int | None = None):
    """A deterministic fake engine: a seed's tokens are a function of (prompt, seed), ending at EOS
    for some seeds; it counts its drafts. ``wobble_seed`` plants one seed whose output differs on
    replay (a nondeterministic engine)."""
    calls = {"n": 0}
    counters = {"drafted": 0, "accepted": 0, "generations": 0, "source": "a fake engine's counters"}

    def run(prompt_ids: list[int], seed: int) -> list[int]:
        calls["n"] += 1
        rng = random.Random(hash((tuple(prompt_ids), seed)))
        tokens = [rng.randrange(1, 20) for _ in range(6)] + ([0] if seed % 3 == 0 else []) + [rng.randrange(1, 20)]
        if seed == wobble_seed and calls["n"] > 1_000:  # replayed: a different token
            tokens[1] += 1
        counters["drafted"] += drafted_per_call
        counters["accepted"] += accepted_per_call
        counters["generations"] += 1
        return tokens

    run.counters = counters  # type: ignore[attr-defined]
    return run, calls


def _stored(engine, count: int) -> list[Sample]:
    """A side's samples file as ``table.fill`` writes it: prompts in turn, seeds from 0, cut after EOS."""
    samples = []
    for seed in range(count):
        prompt = PROMPTS[seed // 4 % 2]
        tokens = engine(list(prompt), seed)
        ended = next((place for place, token in enumerate(tokens) if token in EOS), None)
        samples.append(Sample(prompt=str(prompt), token_ids=tokens if ended is None else tokens[: ended + 1], temperature=1.0,
                              prompt_ids=list(prompt), speculative=True, seed=seed, max_tokens=8))
    return samples[::-1]  # stored order does not matter: replay goes by seed


def test_replayed_counts_are_kept_when_every_replayed_generation_is_the_stored_one() -> None:
    engine, calls = _engine()
    stored = _stored(engine, 40)
    calls["n"] = 1_000
    found = replay(stored, 10, EOS, counting_call(engine))
    assert (found.replayed, found.identical, found.stored) == (10, 10, 40)
    counters = found.counters
    assert counters is not None and (counters["drafted"], counters["accepted"], counters["generations"]) == (40, 10, 10)
    assert "replayed on 10 of 40 stored generations" in counters["source"] and counters["source"].startswith("a fake engine's")
    # The first ten seeds, in runs of one prompt: seeds 0-3 on one prompt, 4-7 on the other, 8-9 on the first.
    assert [[sample.seed for sample in chunk] for _, chunk in replay_chunks(stored, 10)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # A batching engine was given blocks of ``step`` seeds: a request never spans two blocks.
    assert [[sample.seed for sample in chunk] for _, chunk in replay_chunks(stored, 10, step=3)] == [
        [0, 1, 2], [3], [4, 5], [6, 7], [8], [9]]


def test_one_replayed_generation_that_differs_keeps_no_counts() -> None:
    """Negative control: an engine that does not give the stored tokens for one seed proves nothing
    about the process that made the file, so no counts are written."""
    engine, calls = _engine(wobble_seed=6)
    stored = _stored(engine, 40)
    calls["n"] = 1_000
    found = replay(stored, 10, EOS, counting_call(engine))
    assert (found.replayed, found.identical) == (10, 9) and found.counters is None
    # Seeds past the wobbling one are not replayed: counting only five stays clean.
    assert replay(stored, 5, EOS, counting_call(engine)).counters is not None


def test_an_engine_that_replays_exactly_but_drafts_nothing_makes_the_row_speculation_inactive() -> None:
    engine, calls = _engine(drafted_per_call=0, accepted_per_call=0)
    stored = _stored(engine, 12)
    found = replay(stored, 8, EOS, counting_call(engine))
    assert found.counters is not None and found.counters["drafted"] == 0
    on = {"verdict": "pass", "speculation": found.counters}
    assert row_verdict(on, {"verdict": "pass"}) == "speculation inactive"
    assert row_verdict({"verdict": "pass"}, {"verdict": "pass"}) == "pass"


def test_an_engine_without_counters_is_refused_in_one_line() -> None:
    def plain(prompt_ids: list[int], seed: int) -> list[int]:
        return [1, 2, 3]

    stored = _stored(_engine()[0], 4)
    try:
        replay(stored, 4, EOS, counting_call(plain))
    except ValueError as error:
        assert "keeps no draft counters" in str(error) and "\n" not in str(error)
    else:
        raise AssertionError("an engine without counters was replayed")
