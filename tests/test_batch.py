"""The batched core: a row's run in a batch is the run it gives alone, whatever shares the batch.

Tokens, kinds and uniforms are equal exactly; the floats (``p``, ``q`` and the scalars computed
from them) to ``FLOAT_TOLERANCE``. The models are float64, where a batched product and the same
row alone round alike to ~1e-15 on any processor (in float32 the same comparison differed by up to
2.1e-5 on one CPU and 7.4e-6 on another: a tolerance measured on one machine is a coin toss on the next).
Rows differ in prompt length, rule, seed, policy and token budget; ``batch_size`` below the number
of rows makes rows join as others leave (continuous batching).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_lm

from diagnostics.engine import EngineError, generate, generate_batch
from diagnostics.policy import Policy
from diagnostics.tiny import tiny_llama
from devices import DEVICE

# Derived, not measured on one machine: float64 rows agree to ~1e-15 (measured 1.4e-15), but Llama's
# RMSNorm rounds its input to float32 (as transformers' does), so a float64 difference that straddles
# a float32 rounding boundary moves one normed element by one float32 ulp. Planting such a flip in
# any layer of the target moves p by at most 6.3e-7 (measured over every layer and a quarter of the
# dimensions). The bound is 8 float32 epsilons (9.5e-7): 20x below float32 disagreement, and a row
# that leaked another row's keys or uniforms differs by far more.
FLOAT_TOLERANCE = 8 * torch.finfo(torch.float32).eps
PROMPTS = [[1, 2, 3, 4, 5, 6, 2, 3], [5, 6], [7, 1, 2, 3, 1, 2, 3, 1, 2, 3, 9], [2, 2, 2, 2], [3, 1]]
RULES = ["lossless", "lenience:0.5", "cascade:0.3", "lossless", "typical:0.2"]
POLICIES = [Policy(), Policy(top_k=8), Policy(temperature=0.7), Policy(top_p=0.9), Policy(min_p=0.05)]
BUDGETS = [30, 12, 25, 40, 7]


@pytest.fixture(scope="module")
def pair():
    return (tiny_llama(3, vocab=40, layers=4, sharpness=2.0, eos=39, device=DEVICE, dtype=torch.float64),
            tiny_llama(4, vocab=40, layers=2, sharpness=2.0, eos=39, device=DEVICE, dtype=torch.float64))


SETUPS = {
    "early exit, one cache (self-speculation)": ("early-exit:2", {}),
    "early exit, two caches": ("early-exit:2", {"reuse_layers": False}),
    "draft model, draft stop": ("model", {"draft_stop": 0.3}),
    "n-gram": ("ngram:2", {}),
    "plain decoding": (None, {}),
    "tree, top children": ("model", {"tree": (3, 2, 1)}),
    "tree, sampled children": ("model", {"tree": (2, 2), "tree_children": "sample"}),
    "tree, sampled without replacement": ("model", {"tree": (3, 1), "tree_children": "sample-distinct"}),
    "budget tree, early exit": ("early-exit:2", {"tree_budget": 8, "tree_depth": 3}),
    "tree, n-gram": ("ngram:2", {"tree": (2, 2)}),
}


def _rules(kwargs: dict) -> list[str]:
    """Sampled children are verified losslessly only; cascade and typical have no tree form here."""
    if kwargs.get("tree_children", "top") != "top":
        return ["lossless"] * len(PROMPTS)
    if "tree" in kwargs or "tree_budget" in kwargs:
        return [rule if rule.startswith(("lossless", "lenience")) else "lossless" for rule in RULES]
    return RULES


def assert_same_run(alone, batched) -> None:
    assert batched.tokens == alone.tokens
    assert [(r.position, r.kind, r.token, r.draft_token, r.u_draft, r.u_accept, r.u_fallback, r.tree_node)
            for r in batched.records] == [(r.position, r.kind, r.token, r.draft_token, r.u_draft, r.u_accept, r.u_fallback,
                                           r.tree_node) for r in alone.records]
    assert (batched.blocks, batched.drafted, batched.accepted, batched.stop_reason) == (
        alone.blocks, alone.drafted, alone.accepted, alone.stop_reason)
    for left, right in zip(alone.records, batched.records):
        for name, value in left.as_dict().items():
            other = getattr(right, name)
            if isinstance(value, float):
                assert other == pytest.approx(value, abs=FLOAT_TOLERANCE), name
            elif isinstance(value, list) and value and isinstance(value[0], float):
                assert other == pytest.approx(value, abs=FLOAT_TOLERANCE), name
    assert [n.as_dict()["token"] for n in batched.nodes] == [n.as_dict()["token"] for n in alone.nodes]


@pytest.mark.parametrize("label", list(SETUPS))
def test_a_batched_row_is_the_run_it_gives_alone(pair, label: str) -> None:
    target, draft_model = pair
    draft, kwargs = SETUPS[label]
    draft = draft_model if draft == "model" else draft
    rules = _rules(kwargs)
    alone = [generate(target, draft, PROMPTS[i], rule=rules[i], seed=i, max_new_tokens=BUDGETS[i], policy=POLICIES[i], **kwargs)
             for i in range(len(PROMPTS))]
    for batch_size in (None, 2):  # every row at once; two at a time, rows joining as others finish
        batched = generate_batch(target, draft, PROMPTS, rules, list(range(len(PROMPTS))), max_new_tokens=BUDGETS,
                                 policies=POLICIES, batch_size=batch_size, **kwargs)
        for one, many in zip(alone, batched):
            assert_same_run(one, many)


def test_the_tiny_test_model_batches_through_its_own_forward() -> None:
    target = tiny_lm(8, seed=10, sharpness=0.8, dtype=torch.float64)
    draft = tiny_lm(8, seed=11, sharpness=0.8, dtype=torch.float64)
    prompts = [[1, 2, 3, 4], [5], [6, 1, 2, 3, 1, 2, 3, 4]]
    alone = [generate(target, draft, prompt, gamma=3, seed=seed, max_new_tokens=9) for seed, prompt in enumerate(prompts)]
    batched = generate_batch(target, draft, prompts, "lossless", [0, 1, 2], gamma=3, max_new_tokens=9)
    for one, many in zip(alone, batched):
        assert_same_run(one, many)


def test_rows_start_and_finish_in_order_and_a_stop_starts_no_new_row(pair) -> None:
    target, draft = pair
    events: list[tuple[str, int]] = []
    runs = generate_batch(target, "early-exit:2", PROMPTS, "lossless", 0, max_new_tokens=BUDGETS, batch_size=2,
                          on_start=lambda row: events.append(("start", row)),
                          on_finish=lambda row, run: events.append(("finish", row)))
    starts = [row for kind, row in events if kind == "start"]
    assert starts == list(range(len(PROMPTS))) and all(run.status == "complete" for run in runs)
    assert sum(kind == "finish" for kind, _ in events) == len(PROMPTS)
    # At most two rows in flight at any time.
    live = 0
    for kind, _ in events:
        live += 1 if kind == "start" else -1
        assert 0 <= live <= 2

    rounds = [0]

    def stop() -> bool:
        rounds[0] += 1
        return rounds[0] > 6

    stopped = generate_batch(target, "early-exit:2", PROMPTS, "lossless", 0, max_new_tokens=40, batch_size=2, should_stop=stop)
    assert [run is None for run in stopped] == [False, False, True, True, True]
    assert all(run.status == "interrupted" and run.stop_reason == "stopped" for run in stopped[:2])


def test_batch_settings_are_checked_before_any_row_runs(pair) -> None:
    target, _ = pair
    started: list[int] = []
    with pytest.raises(EngineError, match="one value per prompt"):
        generate_batch(target, None, PROMPTS, ["lossless"] * 2, on_start=started.append)
    with pytest.raises(EngineError, match="prompt is empty"):
        generate_batch(target, None, [[1, 2], []], on_start=started.append)
    with pytest.raises(EngineError, match="no prompts"):
        generate_batch(target, None, [])
    with pytest.raises(EngineError, match="batch size"):
        generate_batch(target, None, PROMPTS, batch_size=0)
    with pytest.raises(EngineError, match="seed"):
        generate_batch(target, None, PROMPTS, seeds=[0, 1, 2, 3, -1], on_start=started.append)
    assert started == []


def test_a_row_that_fails_ends_the_batch_with_its_error(pair) -> None:
    """An error in one row's callback stops the batch and is raised (callers mark what was running)."""
    target, _ = pair

    def boom(row: int, record) -> None:
        if row == 1 and record.position == 3:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        generate_batch(target, "ngram:2", PROMPTS, max_new_tokens=10, on_record=boom)


def test_slots_are_reused_and_the_store_grows(pair) -> None:
    """Rows joining reuse the slots of rows that left; a longer sequence grows the store's capacity."""
    from diagnostics.engine.forward import SlotStore

    store = SlotStore(slots=2, capacity=8)
    first, second = store.attach(), store.attach()
    third = store.attach()  # every slot taken: the store doubles
    assert (first, second, third) == (0, 1, 2) and store.slots == 4
    store.detach(first)
    assert store.attach() == 0
    key = torch.ones(1, 1, 3, 2)
    store.prepare([0], [20], 3, torch.device("cpu"))
    keys, _ = store.update(key, key, 0)
    assert keys.shape == (1, 1, 23, 2) and store.keys[0].shape[2] >= 23
