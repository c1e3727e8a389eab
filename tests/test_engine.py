"""Engine behaviour on tiny random models: replay, recorded laws, coupling, edge cases, errors."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama, tiny_lm
from devices import DEVICE

from diagnostics.engine import EngineError, generate
from diagnostics.metrics import total_variation
from diagnostics.models import ModelError, early_exit_model
from diagnostics.policy import Policy, probabilities
from diagnostics.rng import sample_inverse_cdf, uniform_scalar
from diagnostics.rules import get_rule

PROMPT = [1, 2, 3, 4, 1, 2, 3]
# Cached and cache-free forwards differ by float32 rounding (~1e-7); a stale cache moves p by far more.
TOL = 1e-5


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, vocab=12, sharpness=2.0, device=DEVICE)


@pytest.fixture(scope="module")
def draft():
    return tiny_llama(1, vocab=12, sharpness=2.0, device=DEVICE)


@torch.inference_mode()
def _law(loaded, prefix: list[int], policy: Policy) -> torch.Tensor:
    """Independent recomputation: a plain cache-free forward on the committed prefix."""
    logits = loaded.model(input_ids=torch.tensor([prefix]), use_cache=False).logits[0, -1].float()
    return probabilities(logits, policy)


def _replay(run, target, draft, policy: Policy) -> None:
    """Every stored decision follows from the stored uniforms and independently recomputed p, q."""
    rule = get_rule(run.rule)
    context = list(run.prompt_ids)
    for record in run.records:
        prefix = context + run.tokens[: record.position]
        p_target = _law(target, prefix, policy)
        assert record.u_fallback is None or record.u_fallback == uniform_scalar(run.seed, record.position, "fallback")
        if record.kind == "bonus":
            expected = sample_inverse_cdf(rule.bonus(p_target), torch.tensor(record.u_fallback))
            assert record.token == int(expected)
            continue
        # q was drawn on the prefix plus the block's earlier drafts, which equal the emitted tokens.
        q_draft = _law(draft, prefix, policy)
        assert record.u_draft == uniform_scalar(run.seed, record.position, "draft")
        assert record.u_accept == uniform_scalar(run.seed, record.position, "accept")
        assert record.draft_token == int(sample_inverse_cdf(q_draft, torch.tensor(record.u_draft)))
        accept = float(rule.accept_prob(p_target, q_draft)[record.draft_token])
        assert record.accept_prob == pytest.approx(accept, abs=TOL)
        assert (record.u_accept < accept) == (record.kind == "accepted")
        if record.kind == "rejected":
            fallback = rule.fallback(p_target, q_draft)
            assert record.token == int(sample_inverse_cdf(fallback, torch.tensor(record.u_fallback)))
        # The recorded distortion is that of the rule's exact law at this (p, q).
        induced = rule.induced(p_target, q_draft)
        assert record.tv_target == pytest.approx(float(total_variation(induced, p_target)), abs=TOL)
        assert record.tv_baseline == pytest.approx(float(total_variation(induced, rule.baseline(p_target))), abs=TOL)
        assert record.alpha == pytest.approx(float(rule.acceptance(p_target, q_draft)), abs=TOL)
        top = torch.topk(p_target, len(record.p_top_ids))
        assert record.p_top_ids == top.indices.tolist()
        assert record.p_top_probs == pytest.approx(top.values.tolist(), abs=TOL)


@pytest.mark.parametrize("rule", ["lossless", "lenience:0.4", "cascade:0.3", "typical:0.2", "medusa:0.09,0.3", "cos:0.5", "greedy"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_every_decision_replays_and_lossy_laws_match_induced(target, draft, rule: str, gamma: int) -> None:
    policy = Policy(temperature=0.9, top_k=8)
    for seed in range(3):
        run = generate(target, draft, PROMPT, rule=rule, gamma=gamma, max_new_tokens=12, seed=seed,
                       temperature=0.9, top_k=8, eos_token_id=[])
        assert len(run.tokens) == 12 and len(run.records) == 12
        assert [record.position for record in run.records] == list(range(12))
        _replay(run, target, draft, policy)


def test_replay_catches_a_stale_cache(target, draft, monkeypatch) -> None:
    """Negative control: with the rollback off by one, recorded p no longer matches recomputation."""
    from engine_sampling import stale_rollback

    from diagnostics.engine.drafting import TargetScorer

    monkeypatch.setattr(TargetScorer, "rollback", stale_rollback)
    run = generate(target, draft, PROMPT, rule="lossless", gamma=3, max_new_tokens=12, seed=1, eos_token_id=[])
    assert any(record.kind == "rejected" for record in run.records[:-1])
    with pytest.raises(AssertionError):
        _replay(run, target, draft, Policy())


def test_coupled_runs_agree_until_the_first_different_decision(target, draft) -> None:
    from diagnostics.runner import first_divergence

    for seed in range(6):
        reference = generate(target, draft, PROMPT, rule="lossless", gamma=3, max_new_tokens=16, seed=seed, eos_token_id=[])
        lossy = generate(target, draft, PROMPT, rule="lenience:0.2", gamma=3, max_new_tokens=16, seed=seed, eos_token_id=[])
        divergence = first_divergence(reference, lossy)
        end = 16 if divergence is None else divergence
        assert reference.tokens[:end] == lossy.tokens[:end]
        for left, right in zip(reference.records[:end], lossy.records[:end]):
            assert (left.kind, left.draft_token, left.u_accept, left.u_fallback) == (right.kind, right.draft_token, right.u_accept, right.u_fallback)
        if divergence is not None:
            left, right = reference.records[divergence], lossy.records[divergence]
            assert left.draft_token == right.draft_token and left.u_accept == right.u_accept
            # Same draft and coin: the rules themselves decided differently here.
            assert (left.kind, left.token) != (right.kind, right.token)
    # A different seed is not coupled: the runs part almost at once.
    other = generate(target, draft, PROMPT, rule="lossless", gamma=3, max_new_tokens=16, seed=99, eos_token_id=[])
    assert other.tokens != reference.tokens


def test_same_seed_reproduces_and_recording_does_not_change_tokens(target, draft) -> None:
    first = generate(target, draft, PROMPT, gamma=3, max_new_tokens=10, seed=4)
    again = generate(target, draft, PROMPT, gamma=3, max_new_tokens=10, seed=4, record=False)
    assert first.tokens == again.tokens and again.records == []


def test_eos_inside_a_block_ends_without_bonus(target) -> None:
    """Greedy self-drafting accepts everything; the EOS in the middle of the first block ends the run."""
    plain = generate(target, None, PROMPT, temperature=0, max_new_tokens=6, eos_token_id=[])
    eos = plain.tokens[2]
    first_eos = plain.tokens.index(eos)
    run = generate(target, target, PROMPT, gamma=5, max_new_tokens=6, temperature=0, eos_token_id=eos)
    assert run.tokens == plain.tokens[: first_eos + 1]
    assert run.stop_reason == "eos" and run.blocks == 1
    assert [record.kind for record in run.records] == ["accepted"] * (first_eos + 1)


def test_gamma_larger_than_the_budget_and_one_token(target, draft) -> None:
    run = generate(target, draft, PROMPT, gamma=10, max_new_tokens=3, seed=2, eos_token_id=[])
    # Each block drafts at most what the budget still allows (3, then 2, then 1 at worst).
    assert len(run.tokens) == 3 and run.drafted <= 3 + 2 + 1
    assert all(record.position < 3 for record in run.records)
    one = generate(target, draft, PROMPT, gamma=4, max_new_tokens=1, seed=2, eos_token_id=[])
    assert len(one.tokens) == 1 and len(one.records) == 1 and one.blocks == 1


def test_temperature_zero_matches_plain_greedy(target, draft) -> None:
    plain = generate(target, None, PROMPT, temperature=0, max_new_tokens=12, eos_token_id=[])
    for drafter in (draft, "ngram:2", "early-exit:1"):
        spec = generate(target, drafter, PROMPT, temperature=0, gamma=3, max_new_tokens=12, eos_token_id=[])
        assert spec.tokens == plain.tokens
    assert all(record.kind == "bonus" and record.u_fallback is not None for record in plain.records)
    assert plain.block_efficiency == 1.0


def test_plain_decoding_samples_p_with_the_fallback_stream(target) -> None:
    run = generate(target, None, PROMPT, max_new_tokens=8, seed=3, eos_token_id=[])
    for record in run.records:
        p_target = _law(target, PROMPT + run.tokens[: record.position], Policy())
        assert record.token == int(sample_inverse_cdf(p_target, torch.tensor(uniform_scalar(3, record.position, "fallback"))))


def test_ngram_drafter_proposes_from_the_context(target) -> None:
    repetitive = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    run = generate(target, "ngram:3", repetitive, gamma=4, max_new_tokens=8, seed=0, eos_token_id=[])
    first = run.records[0]
    assert first.draft_token == 4 and first.q_draft == 1.0  # a point mass on the looked-up token


def test_early_exit_shares_weights_and_checks_the_layer(target) -> None:
    shell = early_exit_model(target, 1)
    assert shell.model.model.layers[0] is target.model.model.layers[0]
    assert shell.model.config.num_hidden_layers == 1 and target.model.config.num_hidden_layers == 2
    with pytest.raises(ModelError, match="out of range"):
        early_exit_model(target, 2)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"prompt_ids": []}, "prompt is empty"),
        ({"prompt_ids": [1] * 300}, "the prompt does not fit the target's context"),
        ({"gamma": 250}, "gamma does not fit the target's context"),
        ({"max_new_tokens": 250}, r"max-new-tokens 250 does not fit the target's context of 256 tokens \(prompt 7 tokens, gamma 3\): use at most 245"),
        ({"gamma": -1}, r"gamma must lie in \[0, 1,024\]"),
        ({"gamma": 3_000_000_000}, r"gamma must lie in \[0, 1,024\]"),
        ({"max_new_tokens": 0}, r"max-new-tokens must lie in \[1, 1,000,000\]"),
        ({"seed": 2**63}, r"seed must lie in \[0, 9,223,372,036,854,775,807\]"),
        ({"prompt_ids": [99]}, "token ids must lie"),
    ],
)
def test_bad_settings_are_one_line_errors(target, draft, kwargs: dict, fragment: str) -> None:
    settings = {"prompt_ids": PROMPT, "gamma": 3, "max_new_tokens": 4, **kwargs}
    with pytest.raises(EngineError, match=fragment):
        generate(target, draft, settings.pop("prompt_ids"), **settings)


def test_draft_with_another_vocabulary_is_refused(target) -> None:
    with pytest.raises(ModelError, match="vocabularies differ"):
        generate(target, tiny_llama(3, vocab=10, device=DEVICE), PROMPT, max_new_tokens=2)
    with pytest.raises(ModelError, match="unknown drafter"):
        generate(target, "medusa-heads:3", PROMPT, max_new_tokens=2)


def test_one_test_says_which_drafts_mean_plain_decoding() -> None:
    """``is_plain_draft`` for typed values and stored labels alike: what a run stores without a
    drafter reads back as plain everywhere (loading, validating, replaying, a shared file's check)."""
    from diagnostics.drafts import load_draft
    from diagnostics.models import PLAIN_DRAFT, is_plain_draft
    from diagnostics.request import RunRequest, request_from_run

    for plain in (None, "", "  ", "none", "None", "plain", " PLAIN ", PLAIN_DRAFT, "plain (no drafter)"):
        assert is_plain_draft(plain), plain
    for drafted in ("ngram:2", "model:none", "early-exit:1", "nonesuch", "plainly", "none:3"):
        assert not is_plain_draft(drafted), drafted
    loaded = type("Loaded", (), {"device": DEVICE})()
    assert load_draft(PLAIN_DRAFT, loaded) is None and load_draft("Plain", loaded) is None
    RunRequest(prompt="w1", rule="lossless", draft=PLAIN_DRAFT).validate()  # no drafter to parse
    with pytest.raises(ModelError, match="unknown drafter 'nonesuch'"):
        RunRequest(prompt="w1", rule="lossless", draft="nonesuch").validate()
    stored = {"prompt": "w1", "rule": "lossless", "seed": 0, "max_new_tokens": 4, "draft": PLAIN_DRAFT}
    assert request_from_run(stored).draft is None and request_from_run({**stored, "draft": "ngram:2"}).draft == "ngram:2"


def test_tiny_lm_cache_path_matches_cache_free_forward() -> None:
    """The fast test model gives the same logits with and without its KV cache (the engine's slot store)."""
    from diagnostics.engine.forward import Forward, ModuleStage, full_stage

    loaded = tiny_lm(5, seed=3)
    stage = full_stage(loaded, 1, 16, order=1)
    assert isinstance(stage, ModuleStage)
    slot = stage.store.attach()
    first = stage.run([Forward(stage, slot, 0, tokens=[1, 2, 3], keep=3)])[0].logits
    second = stage.run([Forward(stage, slot, 3, tokens=[4, 0], keep=2)])[0].logits
    whole = loaded.model(input_ids=torch.tensor([[1, 2, 3, 4, 0]]), use_cache=False).logits[0]
    assert torch.allclose(torch.cat([first, second]), whole, atol=1e-5)


def test_caches_are_laid_out_as_transformers_lays_them_out() -> None:
    """Each cache has the layers ``DynamicCache(config=…)`` would give, also for an early-exit shell
    copied from a target whose layout was already read (the shell has fewer layers)."""
    from transformers import DynamicCache

    from diagnostics.engine.caches import new_cache

    target = tiny_llama(seed=0, layers=3, device=DEVICE)
    new_cache(target.model)  # the target's layout is read (and kept) before the shell is copied
    for model in (early_exit_model(target, 1).model, target.model):
        built, expected = new_cache(model), DynamicCache(config=model.config)
        assert [type(layer) for layer in built.layers] == [type(layer) for layer in expected.layers]
        assert len(built.layers) == model.config.num_hidden_layers
