"""Early-exit self-speculation with one KV cache (layers 1..L computed once), and adaptive drafting.

Exactness of the reuse path is shown by coupling: on the same uniforms it emits the same tokens
as the two-forward path (whose law the end-to-end losslessness test checks), and every recorded
``p`` equals a plain cache-free forward's ``p`` (float64 models: to ``P_TOLERANCE``). ``--draft-stop`` is in the
end-to-end losslessness test (``test_engine_lossless.py``); here its plumbing and errors.
"""

from __future__ import annotations

import math

import pytest
import torch
from devices import DEVICE

from diagnostics.audit.mutants import StaleRollbackScorer
from diagnostics.engine import CORRECT, EngineError, EngineSeams, generate
from diagnostics.inspection import teacher_forced_laws
from diagnostics.models import early_exit_model
from diagnostics.policy import Policy
from diagnostics.engine.drafting import TargetScorer
from diagnostics.engine.self_speculation import shares_layers, split_layer, supports_layer_reuse
from diagnostics.request import request_from_run
from diagnostics.runner import RunRequest, generate_request, store_finished_run
from diagnostics.store import Store
from diagnostics.tiny import tiny_llama

PROMPT = [1, 2, 3, 4, 5, 6, 2, 3]
# A float64 target: a batched and a one-token-at-a-time forward agree to ~1e-15, but for the one
# float32 step (Llama's RMSNorm rounds its input to float32, as transformers' does), where a flipped
# rounding moves p by at most 6.3e-7 on this model (tests/test_batch.py derives the same bound).
# In float32 the two differ by ~1e-6 here, by an amount that depends on the CPU's kernels.
P_TOLERANCE = 8 * torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def target():
    return tiny_llama(3, vocab=40, layers=4, sharpness=2.0, eos=39, device=DEVICE, dtype=torch.float64)


def _layer_tokens(model) -> list[int]:
    """Count the tokens each decoder layer processes, via forward hooks (returns the live counters)."""
    counts = [0] * len(model.model.layers)

    def hook(index):
        def count(module, args, kwargs, output):
            counts[index] += args[0].shape[1] if args else kwargs["hidden_states"].shape[1]
        return count

    handles = [layer.register_forward_hook(hook(index), with_kwargs=True) for index, layer in enumerate(model.model.layers)]
    return counts, handles


@pytest.mark.parametrize("layer", [1, 2, 3])
def test_reuse_emits_the_same_tokens_and_a_plain_forwards_p(target, layer: int) -> None:
    """Seeds × γ × policies: the reuse run's tokens equal the two-forward run's, and each recorded
    p(token) and top-k of p equals teacher forcing with cache-free forwards; q is the early exit's."""
    shell = early_exit_model(target, layer)
    for seed in range(6):
        for gamma, policy in ((1, Policy()), (3, Policy(top_k=8, temperature=0.8)), (6, Policy(top_p=0.9))):
            reused = generate(target, shell, PROMPT, gamma=gamma, max_new_tokens=24, seed=seed, policy=policy)
            separate = generate(target, shell, PROMPT, gamma=gamma, max_new_tokens=24, seed=seed, policy=policy, reuse_layers=False)
            assert reused.tokens == separate.tokens, (layer, seed, gamma)
            assert [r.kind for r in reused.records] == [r.kind for r in separate.records]
            p_rows = teacher_forced_laws(target, PROMPT, reused.tokens, policy)
            q_rows = teacher_forced_laws(shell, PROMPT, reused.tokens, policy, target.vocab_size)
            for record in reused.records:
                assert abs(record.p_token - float(p_rows[record.position, record.token])) < P_TOLERANCE
                assert max(abs(a - float(p_rows[record.position, b])) for a, b in zip(record.p_top_probs, record.p_top_ids)) < P_TOLERANCE
                if record.draft_token is not None and record.kind != "rejected":  # q after an accepted prefix is teacher-forced
                    assert abs(record.q_draft - float(q_rows[record.position, record.draft_token])) < P_TOLERANCE


def test_reuse_runs_the_shared_layers_once(target) -> None:
    """With reuse, layer 1 sees each token about once (prompt, drafts, fallbacks); without it, the draft
    and the target both run it: the saving is real, not a silent fallback to two forwards."""
    shell = early_exit_model(target, 3)
    counts, handles = _layer_tokens(target.model)
    try:
        run = generate(target, shell, PROMPT, gamma=4, max_new_tokens=40, seed=0, eos_token_id=[])
        reused = list(counts)
        counts[:] = [0] * len(counts)
        generate(target, shell, PROMPT, gamma=4, max_new_tokens=40, seed=0, eos_token_id=[], reuse_layers=False)
        separate = list(counts)
    finally:
        for handle in handles:
            handle.remove()
    # Each token fed once through layers 1..3: the prompt, and per round the pending token and gamma drafts
    # (the round program drafts all gamma under a mask where fewer count, as at the budget's end).
    assert reused[0] <= len(PROMPT) + run.blocks * (4 + 1)
    assert separate[0] >= reused[0] + len(PROMPT) + run.drafted  # the target recomputed them
    # The upper layer (4) sees every verified block once in both paths.
    assert reused[3] == separate[3]


def test_reuse_applies_only_to_the_targets_own_early_exit(target) -> None:
    shell = early_exit_model(target, 2)
    assert shares_layers(target, shell) == 2 and supports_layer_reuse(target)
    other = tiny_llama(4, vocab=40, layers=2, device=DEVICE)
    assert shares_layers(target, other) is None
    assert split_layer(target, shell, TargetScorer) == 2
    # An audit's planted scorer keeps the two-forward path: the planted bug must stay visible.
    assert split_layer(target, shell, StaleRollbackScorer) is None
    assert split_layer(target, other, TargetScorer) is None
    windowed = tiny_llama(3, vocab=40, layers=4, device=DEVICE)
    windowed.model.config.model_type = "mistral"
    windowed.model.config.sliding_window = 16
    assert not supports_layer_reuse(windowed)


def test_a_planted_rollback_bug_still_changes_the_tokens(target) -> None:
    """The planted scorer must not be bypassed by the reuse path (the audit's negative controls)."""
    shell = early_exit_model(target, 2)
    planted = EngineSeams(scorer=StaleRollbackScorer)
    differ = sum(generate(target, shell, PROMPT, gamma=3, max_new_tokens=20, seed=seed, seams=planted).tokens
                 != generate(target, shell, PROMPT, gamma=3, max_new_tokens=20, seed=seed, seams=CORRECT).tokens
                 for seed in range(5))
    assert differ >= 3


def test_draft_stop_shortens_blocks_and_keeps_the_tokens_coupled(target) -> None:
    """A higher threshold stops sooner (fewer drafts per block); every block still drafts at least one
    token; reuse and the two-forward path agree under it; a block stops only after an unsure draft."""
    shell = early_exit_model(target, 2)
    drafted = []
    for stop in (None, 0.3, 0.6, 0.95):
        run = generate(target, shell, PROMPT, gamma=6, max_new_tokens=40, seed=2, draft_stop=stop, eos_token_id=[])
        assert run.tokens == generate(target, shell, PROMPT, gamma=6, max_new_tokens=40, seed=2, draft_stop=stop,
                                      eos_token_id=[], reuse_layers=False).tokens
        drafted.append(run.drafted / run.blocks)
        blocks: dict[int, list] = {}
        for record in run.records:
            blocks.setdefault(record.block, []).append(record)
        for records in blocks.values():
            verified = [r for r in records if r.draft_token is not None]
            assert verified, "every block drafts at least one token"
    assert drafted == sorted(drafted, reverse=True) and drafted[-1] < drafted[0]


@pytest.mark.parametrize("stop, draft, message", [
    (0.0, "early-exit:2", "probability in (0, 1]"),
    (1.5, "early-exit:2", "probability in (0, 1]"),
    (math.nan, "early-exit:2", "probability in (0, 1]"),
    (0.5, "ngram:2", "n-gram draft is a point mass"),
    (0.5, None, "plain decoding drafts nothing"),
])
def test_bad_draft_stop_is_one_clear_error(target, stop, draft, message) -> None:
    with pytest.raises(EngineError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        generate(target, draft, PROMPT, gamma=3, max_new_tokens=4, draft_stop=stop)
    with pytest.raises(EngineError, match="without a tree"):
        RunRequest(prompt="x", draft="early-exit:2", tree="2,1", draft_stop=0.5).validate()


def test_draft_stop_is_stored_and_replayed(target, tmp_path) -> None:
    store = Store(tmp_path / "runs.duckdb")
    request = RunRequest(prompt="x", draft="early-exit:2", gamma=5, max_new_tokens=12, seed=3, draft_stop=0.6)
    run = generate_request(target, early_exit_model(target, 2), request, PROMPT)
    run_id = store_finished_run(store, "tiny", request, PROMPT, run)
    stored = store.get_run(run_id)
    assert stored["draft_stop"] == 0.6
    again = request_from_run(stored)
    assert again.draft_stop == 0.6
    assert generate(target, early_exit_model(target, 2), PROMPT, gamma=5, max_new_tokens=12, seed=3,
                    draft_stop=again.draft_stop).tokens == run.tokens
    assert torch.equal(torch.tensor(run.tokens), torch.tensor(stored["tokens"]))


def _family(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from diagnostics.models import wrap_model

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    config_class, model_class = classes[kind]
    torch.manual_seed(5)
    config = config_class(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=128, sliding_window=None, tie_word_embeddings=False)
    return wrap_model(model_class(config).eval())


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_direct_forward_equals_the_models_own_forward(kind: str) -> None:
    """The engine's direct loop over the model's modules (a ``DirectStage`` over the slot store) gives the
    wrapper's logits: a prompt in one forward, then one token at a time and blocks of several, with
    rollbacks in between."""
    from diagnostics.engine.fast_forward import supports_direct_forward
    from diagnostics.engine.forward import DirectStage, Forward, full_stage

    loaded = _family(kind)
    assert supports_direct_forward(loaded)
    stage = full_stage(loaded, 1, 8, order=1)  # a small capacity: the store grows as the sequence does
    assert isinstance(stage, DirectStage)
    slot = stage.store.attach()
    sequence = [3, 7, 1, 9, 4, 4, 2, 8, 11, 5, 6, 30, 31, 2]
    steps = [(0, 6), (6, 7), (7, 10), (8, 9), (9, 14)]  # (cached after rollback, fed up to)
    for start, end in steps:
        got = stage.run([Forward(stage, slot, start, tokens=sequence[start:end], keep=end - start)])[0].logits
        with torch.inference_mode():
            want = loaded.model(input_ids=torch.tensor([sequence[:end]]), use_cache=False).logits[0, start:end].float()
        assert torch.allclose(got, want, atol=2e-5, rtol=0), (kind, start, end, float((got - want).abs().max()))


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_lean_layers_are_bitwise_the_modules(kind: str) -> None:
    """The lean layer loop (no nn.Module dispatch) computes exactly what calling the layers does:
    bitwise equal logits and cache for one token at a time (GQA inside SDPA) and for blocks (a mask,
    repeated heads), on every family; a hooked layer is called as a module (its hook sees it run)."""
    from transformers import DynamicCache

    from diagnostics.engine.fast_forward import DecoderParts

    loaded = _family(kind)
    parts = DecoderParts(loaded)
    assert len(parts.lean) == 3
    modules = DecoderParts(loaded)
    modules.lean = {}  # the same loop, calling each layer as a module
    sequence = [3, 7, 1, 9, 4, 4, 2, 8, 11, 5, 6, 30, 31, 2]
    lean_cache, module_cache = DynamicCache(config=loaded.model.config), DynamicCache(config=loaded.model.config)
    with torch.inference_mode():
        for start, end in ((0, 6), (6, 7), (7, 8), (8, 12), (12, 13), (13, 14)):
            got = parts.logits(parts.run(parts.embed_tokens(sequence[start:end]), start, parts.layers, lean_cache))
            want = modules.logits(modules.run(modules.embed_tokens(sequence[start:end]), start, modules.layers, module_cache))
            assert torch.equal(got, want), (kind, start, end, float((got - want).abs().max()))
        for lean_layer, module_layer in zip(lean_cache.layers, module_cache.layers):
            assert torch.equal(lean_layer.keys, module_layer.keys) and torch.equal(lean_layer.values, module_layer.values)
        seen = []
        handle = parts.layers[1].register_forward_hook(lambda module, args, output: seen.append(1))
        try:
            parts.run(parts.embed_tokens([4]), 14, parts.layers, lean_cache)
        finally:
            handle.remove()
        assert seen == [1]


def _wide_llama():
    """A 2-layer Llama wide enough for the two-thread one-token products (q, o, the MLP and the head
    are over ``SPLIT_MIN_ELEMENTS``; k and v are not), with GQA as in the embedded model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from diagnostics.models import wrap_model

    torch.manual_seed(11)
    config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=4, max_position_embeddings=128, tie_word_embeddings=True)
    return wrap_model(LlamaForCausalLM(config).eval())


def test_one_token_products_over_two_threads_are_bitwise_the_modules(monkeypatch) -> None:
    """One-token projections run as two half-row products (both cores) give bitwise the modules'
    logits and cache, one token at a time and in blocks (which keep F.linear); the split is in use
    for every large matrix, and not for the small ones."""
    from transformers import DynamicCache

    from diagnostics.engine import fast_forward
    from diagnostics.engine.fast_forward import DecoderParts

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # the split needs two threads; CI has them, so does this test
    loaded = _wide_llama()
    parts = DecoderParts(loaded)
    lean = parts.lean[id(parts.layers[0])]
    assert all(linear.halves is not None for linear in (lean.q, lean.o, lean.gate, lean.up, lean.down, parts.head_split))
    assert lean.k.halves is None and lean.v.halves is None  # 32,768 elements: below SPLIT_MIN_ELEMENTS
    modules = DecoderParts(loaded)
    modules.lean, modules.head_split = {}, None  # the layers and the head called as modules
    sequence = [3, 7, 1, 9, 4, 4, 2, 8, 11, 5, 6, 30, 31, 2, 1500, 2047, 17]
    lean_cache, module_cache = DynamicCache(config=loaded.model.config), DynamicCache(config=loaded.model.config)
    calls = []
    real = fast_forward._two_halves
    monkeypatch.setattr(fast_forward, "_two_halves", lambda row, halves: calls.append(1) or real(row, halves))
    with torch.inference_mode():
        for start, end in ((0, 6), (6, 7), (7, 8), (8, 12), (12, 13), (13, 14), (14, 15), (15, 17)):
            got = parts.logits(parts.run(parts.embed_tokens(sequence[start:end]), start, parts.layers, lean_cache))
            want = modules.logits(modules.run(modules.embed_tokens(sequence[start:end]), start, modules.layers, module_cache))
            assert torch.equal(got, want), (start, end, float((got - want).abs().max()))
        for lean_layer, module_layer in zip(lean_cache.layers, module_cache.layers):
            assert torch.equal(lean_layer.keys, module_layer.keys) and torch.equal(lean_layer.values, module_layer.values)
    assert len(calls) == 5 * (5 * 2 + 1)  # 5 one-token steps × (5 split products × 2 layers + the head)


def test_a_split_product_that_is_not_bitwise_is_not_used(monkeypatch) -> None:
    """Negative control: where the two-half product differs from F.linear by one rounding step on
    this machine, the check refuses it and the projection stays F.linear."""
    from diagnostics.engine import fast_forward

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    real = fast_forward._two_halves
    monkeypatch.setattr(fast_forward, "_two_halves", lambda row, halves: torch.nextafter(real(row, halves), torch.tensor(math.inf)))
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 512, bias=False)
    split = fast_forward.SplitLinear(linear)
    assert split.halves is None
    row = torch.randn(1, 1, 256)
    with torch.inference_mode():
        assert torch.equal(split(row), torch.nn.functional.linear(row, linear.weight))
    monkeypatch.setattr(fast_forward, "_two_halves", real)
    assert fast_forward.SplitLinear(torch.nn.Linear(256, 512, bias=False)).halves is not None  # a fresh weight passes the check


def test_models_outside_the_direct_loop_keep_their_forward() -> None:
    from diagnostics.engine.fast_forward import supports_direct_forward
    from diagnostics.engine.forward import RowStage, full_stage

    windowed = _family("mistral")
    windowed.model.config.sliding_window = 16
    assert not supports_direct_forward(windowed) and isinstance(full_stage(windowed, 1, 16, order=1), RowStage)
    capped = _family("llama")
    capped.model.config.final_logit_softcapping = 30.0
    assert not supports_direct_forward(capped)
