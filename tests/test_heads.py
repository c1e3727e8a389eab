"""EAGLE-3 and Medusa heads: the on-disk layout, loading as untrusted input, the recorded ``q``
against the head's law recomputed from scratch, the planted integration bugs, and the CLI.

End-to-end losslessness with heads is in ``test_engine_lossless.py`` (chains, at the chain test's power)
and ``test_tree_lossless.py`` (trees)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
import shutil

import pytest
import torch
from devices import DEVICE

from diagnostics.cli import main
from diagnostics.engine import generate_batch
from diagnostics.heads.check import check_run, reference_q
from diagnostics.heads.eagle3 import ARCHITECTURE, HeadCache, default_taps
from diagnostics.heads.layout import load_head, make_head
from diagnostics.models import ModelError
from diagnostics.policy import Policy
from diagnostics.tiny import tiny_llama
from tiny_models import save_tiny_model

def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


PROMPTS = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6], [7, 8, 9, 1, 2, 3]]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, vocab=12, layers=5, sharpness=2.0, device=DEVICE)


@pytest.fixture(scope="module")
def heads(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("heads")
    return {kind: (make_head(kind, target, folder / kind, seed=1, scale=0.5), load_head(kind, str(folder / kind), target))
            for kind in ("eagle3", "medusa")}


def test_the_written_layout_is_the_published_one(heads, target) -> None:
    from safetensors.torch import load_file

    folder, head = heads["eagle3"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] and config["num_hidden_layers"] == 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 2, 2] == list(default_taps(5))
    state = load_file(str(folder / "model.safetensors"))
    assert state["fc.weight"].shape == (32, 3 * 32)
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * 32  # q/k/v read cat(embedding, hidden)
    assert {"lm_head.weight", "norm.weight", "midlayer.hidden_norm.weight", "midlayer.mlp.down_proj.weight"} <= set(state)
    # A head over the whole vocabulary carries no d2t/t2d (vLLM refuses a d2t there); it loads as the identity map.
    assert not {"d2t", "t2d"} & set(state)
    assert not head.module.d2t.any() and head.module.t2d.all() and head.module.d2t.dtype == torch.int64
    assert torch.equal(head.module.fc.weight, state["fc.weight"])
    medusa_folder, medusa = heads["medusa"]
    keys = set(load_file(str(medusa_folder / "medusa_lm_head.safetensors")))
    assert {"0.0.linear.weight", "0.0.linear.bias", "0.1.weight", "3.1.weight"} <= keys
    assert medusa.taps == (5,) and default_taps(32) == (2, 16, 29)
    # Weights get the mode the config gets (the umask's), not safetensors' 0600.
    for written in (folder / "model.safetensors", medusa_folder / "medusa_lm_head.safetensors"):
        assert written.stat().st_mode & 0o777 == (folder / "config.json").stat().st_mode & 0o777 == 0o666 & ~_umask()


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_recorded_q_is_the_heads_law_recomputed_from_scratch(heads, target, kind) -> None:
    """Rows of one batch with other prompts, rules and policies: every drafted position's q (at the
    draft and its recorded top entries) equals the reference, which shares nothing with the engine."""
    _, head = heads[kind]
    policies = [Policy(temperature=0.8, top_k=6), Policy(), Policy(temperature=1.2, top_p=0.9), Policy(temperature=0.7)]
    runs = generate_batch(target, head, PROMPTS, ["lossless", "lenience:0.5", "lossless", "cascade:0.3"], [1, 2, 3, 4],
                          gamma=3, max_new_tokens=24, policies=policies, eos_token_id=[])
    checks = [check_run(run, head, target) for run in runs]
    assert all(check.verdict == "pass" for check in checks), [check.examples for check in checks]
    assert sum(check.positions for check in checks) > 60 and max(check.max_error for check in checks) < 1e-5
    assert sum(run.accepted for run in runs) > 0 and all(run.records[0].draft_token is None for run in runs)  # the target's own first token


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
@pytest.mark.parametrize("planted", ["pairing_off_by_one", "wrong_taps"])
def test_a_planted_integration_bug_is_flagged(heads, target, kind, planted) -> None:
    """A state paired with the wrong token, or a layer's output read where its input was meant: the
    output law stays exact (q is what was drawn from), so only the recomputed q can flag it."""
    _, head = heads[kind]
    runs = generate_batch(target, dataclasses.replace(head, planted=planted), PROMPTS[:2], seeds=[1, 2], gamma=3,
                          max_new_tokens=16, eos_token_id=[])
    checks = [check_run(run, head, target) for run in runs]
    assert all(check.verdict == "fail" for check in checks)
    assert min(check.mismatched / check.positions for check in checks) > 0.5 and max(c.max_error for c in checks) > 0.1


def test_medusa_drafts_no_deeper_than_its_heads(heads, target) -> None:
    from diagnostics.engine import EngineError

    with pytest.raises(EngineError, match="at most 4 tokens deep .* give --gamma 4 or less, not 5"):
        generate_batch(target, heads["medusa"][1], [[1, 2, 3]], gamma=5, max_new_tokens=4)
    with pytest.raises(EngineError, match="give a tree of depth 4 or less, not 5"):
        generate_batch(target, heads["medusa"][1], [[1, 2, 3]], tree="1,1,1,1,1", max_new_tokens=4)


def test_draft_vocabulary_maps_onto_the_targets_ids(target, tmp_path) -> None:
    """A draft vocabulary of 5 ids spread over the target's 12 (d2t offsets): q is zero elsewhere."""
    folder = make_head("eagle3", target, tmp_path / "h", draft_vocab=5, scale=0.5)
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    chosen = torch.tensor([0, 3, 5, 8, 11])
    state["d2t"] = chosen - torch.arange(5)
    state["t2d"] = torch.zeros(12, dtype=torch.bool).index_fill_(0, chosen, True)
    save_file(state, str(folder / "model.safetensors"))
    head = load_head("eagle3", str(folder), target)
    q_draft = reference_q(head, target, [1, 2, 3], [], Policy())
    assert set(torch.nonzero(q_draft).flatten().tolist()) == set(chosen.tolist())
    run = generate_batch(target, head, [[1, 2, 3]], seeds=[0], gamma=3, max_new_tokens=12, eos_token_id=[])[0]
    assert all(record.draft_token in chosen.tolist() for record in run.records if record.draft_token is not None)
    state["t2d"][1] = True  # t2d no longer marks exactly the mapped ids
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match="d2t and t2d disagree"):
        load_head("eagle3", str(folder), target)
    # A smaller draft vocabulary needs its map: without it the file is refused, not read as the identity.
    save_file({key: value for key, value in state.items() if key not in ("d2t", "t2d")}, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match="lacks the tensor 'd2t'"):
        load_head("eagle3", str(folder), target)


def test_a_whole_vocabulary_head_that_carries_its_identity_map_still_loads(heads, target, tmp_path) -> None:
    """Heads written before the map was left out of whole-vocabulary files (everyday, < 1 s)."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = Path(shutil.copytree(heads["eagle3"][0], tmp_path / "with-map"))
    state = load_file(str(folder / "model.safetensors"))
    state.update(d2t=torch.zeros(12, dtype=torch.long), t2d=torch.ones(12, dtype=torch.bool))
    save_file(state, str(folder / "model.safetensors"))
    head = load_head("eagle3", str(folder), target)
    assert torch.equal(head.module.fc.weight, heads["eagle3"][1].module.fc.weight) and head.module.t2d.all()


def test_bad_heads_are_one_line_errors(heads, tmp_path) -> None:
    other = tiny_llama(0, vocab=12, layers=5, sharpness=2.0, device=DEVICE)
    other.model.config.hidden_size = 64  # a target of another width
    with pytest.raises(ModelError, match="target_hidden_size is 32 but the target's is 64"):
        load_head("eagle3", str(heads["eagle3"][0]), other)
    with pytest.raises(ModelError, match="no head folder"):
        load_head("medusa", str(tmp_path / "missing"), other)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": [ARCHITECTURE], "hidden_size": 32}))
    (broken / "model.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError):
        load_head("eagle3", str(broken), other)
    with pytest.raises(ModelError, match="not empty"):
        make_head("medusa", other, heads["medusa"][0])


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
@pytest.mark.parametrize("shape", [{"tree": "2,2,1"}, {"tree": "3,1", "tree_children": "sample"},
                                   {"tree": "2,2", "tree_children": "sample-distinct"}, {"tree_budget": 6, "tree_depth": 3},
                                   {"tree": "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]]"}],
                         ids=["top 2,2,1", "sampled 3,1", "distinct 2,2", "budget 6 depth 3", "sparse medusa_choices"])
def test_head_trees_record_the_heads_law(heads, target, kind, shape) -> None:
    """Trees drafted by a head (EAGLE-3: a tree mask in the head's own attention; Medusa: head d at
    depth d): every emitted position's q is the head's law on the accepted path, and a planted
    tap bug is flagged there too."""
    _, head = heads[kind]
    runs = generate_batch(target, head, PROMPTS, seeds=[1, 2, 3, 4], max_new_tokens=20, eos_token_id=[],
                          policies=Policy(temperature=0.8), **shape)
    checks = [check_run(run, head, target) for run in runs]
    assert all(check.verdict == "pass" for check in checks), [check.examples for check in checks]
    assert sum(run.accepted for run in runs) > 0 and sum(check.positions for check in checks) > 40
    planted = generate_batch(target, dataclasses.replace(head, planted="wrong_taps"), PROMPTS[:1], seeds=[1],
                             max_new_tokens=12, eos_token_id=[], **shape)[0]
    assert check_run(planted, head, target).verdict == "fail"


def test_medusa_heads_can_start_where_medusa_training_does(target, tmp_path) -> None:
    """``init="target"``: residual blocks zero (``x + SiLU(0) = x``) and each head the target's
    ``lm_head``, so every head's logits at a state are the target's own; EAGLE-3 has no such start."""
    folder = make_head("medusa", target, tmp_path / "medusa", init="target")
    head = load_head("medusa", str(folder), target)
    assert json.loads((folder / "config.json").read_text())["init"] == "target"
    state = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    expected = target.model.get_output_embeddings()(state).float()
    for row in state.unbind(0):
        assert torch.allclose(head.module.logits(row, 4), expected[None, state.tolist().index(row.tolist())].expand(4, -1), atol=1e-5)
    random_head = load_head("medusa", str(make_head("medusa", target, tmp_path / "random", scale=0.5)), target)
    assert not torch.allclose(random_head.module.logits(state[0], 1)[0], expected[0], atol=1e-2)
    with pytest.raises(ModelError, match="EAGLE-3 head has no such starting point"):
        make_head("eagle3", target, tmp_path / "eagle3", init="target")
    with pytest.raises(ModelError, match="unknown head init"):
        make_head("medusa", target, tmp_path / "other", init="trained")


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_one_eagle3_pair_is_the_layer_written_out(heads, target, tmp_path, norm_before_residual) -> None:
    """One pair on an empty cache attends to itself only (softmax over one key is 1), so the layer is
    ``o = r + o_proj(v(a))``, ``o ← o + mlp(post_attention_layernorm(o))`` with ``r = g``, or
    ``r = hidden_norm(g)`` for a head whose config says ``norm_before_residual`` (SpecForge's
    variant, read from config.json); a head of more than one layer is refused in one line."""
    folder = tmp_path / "head"
    shutil.copytree(heads["eagle3"][0], folder)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "norm_before_residual": norm_before_residual}))
    module = load_head("eagle3", str(folder), target).module
    assert module.config.norm_before_residual is norm_before_residual
    generator = torch.Generator().manual_seed(2)
    embed, fused = torch.randn(1, 32, generator=generator), torch.randn(1, 32, generator=generator)
    out = module.step(embed, fused, 0, HeadCache())
    layer, config = module.midlayer, module.config
    with torch.inference_mode():
        joint = torch.cat([layer.input_layernorm(embed), layer.hidden_norm(fused)], -1)
        values = layer.self_attn.v_proj(joint).view(config.num_key_value_heads, config.dim)
        mixed = values.repeat_interleave(config.num_attention_heads // config.num_key_value_heads, 0).reshape(1, -1)
        residual = layer.hidden_norm(fused) if norm_before_residual else fused
        expected = residual + layer.self_attn.o_proj(mixed)
        expected = expected + layer.mlp(layer.post_attention_layernorm(expected))
    assert torch.allclose(out, expected, atol=1e-5)
    (folder / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 2}))
    with pytest.raises(ModelError, match="one decoder layer"):
        load_head("eagle3", str(folder), target)


def test_medusa_checkpoints_in_medusas_and_vllms_layouts_load_alike(heads, target, tmp_path) -> None:
    """Medusa's own config (heads and layers only: width and vocabulary the target's) and
    vLLM's layout (``blocks``/``lm_heads``, biases optional, one shared head) give the same heads;
    a truncated draft vocabulary is a one-line refusal."""
    from safetensors.torch import load_file, save_file

    folder, published = heads["medusa"]
    state = load_file(str(folder / "medusa_lm_head.safetensors"))
    hidden = torch.randn(32, generator=torch.Generator().manual_seed(1))
    expected = published.module.logits(hidden, 4)

    medusa_one = tmp_path / "medusa-1"
    medusa_one.mkdir()
    (medusa_one / "config.json").write_text(json.dumps({"medusa_num_heads": 4, "medusa_num_layers": 1,
                                                        "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    torch.save({f"medusa_head.{key}": value for key, value in state.items()}, medusa_one / "medusa_lm_head.pt")
    # Published as a pickle: read by torch's weights-only unpickler, checked like a safetensors file.
    assert torch.allclose(load_head("medusa", str(medusa_one), target).module.logits(hidden, 4), expected)
    (medusa_one / "medusa_lm_head.pt").unlink()
    save_file({f"medusa_head.{key}": value for key, value in state.items()}, str(medusa_one / "medusa_lm_head.safetensors"))
    assert torch.allclose(load_head("medusa", str(medusa_one), target).module.logits(hidden, 4), expected)

    vllm = {}
    for k in range(4):
        vllm[f"blocks.{k}.layers.0.weight"] = state[f"{k}.0.linear.weight"]
        vllm[f"blocks.{k}.layers.0.bias"] = state[f"{k}.0.linear.bias"]
        vllm[f"lm_heads.{k}.weight"] = state[f"{k}.1.weight"]
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "num_heads": 4, "num_hidden_layers": 1,
              "hidden_size": 32, "vocab_size": 12}
    for name, weights, extra in (("vllm", vllm, {}),
                                 ("vllm-shared", {key: value for key, value in vllm.items() if not key.startswith(("lm_heads.1", "lm_heads.2", "lm_heads.3"))},
                                  {"original_lm_head": True}),
                                 ("vllm-token-map", {**vllm, "token_map": torch.arange(6)}, {"truncated_vocab_size": 6})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**config, **extra}))
        save_file({key: value.contiguous() for key, value in weights.items()}, str(tmp_path / name / "model.safetensors"))
    assert torch.allclose(load_head("medusa", str(tmp_path / "vllm"), target).module.logits(hidden, 4), expected)
    shared = load_head("medusa", str(tmp_path / "vllm-shared"), target).module.logits(hidden, 4)
    assert torch.allclose(shared[0], expected[0])
    with pytest.raises(ModelError, match="truncated vocabulary"):
        load_head("medusa", str(tmp_path / "vllm-token-map"), target)
    no_bias = {key: value for key, value in vllm.items() if not key.endswith("bias")}
    (tmp_path / "vllm-no-bias").mkdir()
    (tmp_path / "vllm-no-bias" / "config.json").write_text(json.dumps(config))
    save_file({key: value.contiguous() for key, value in no_bias.items()}, str(tmp_path / "vllm-no-bias" / "model.safetensors"))
    assert torch.allclose(load_head("medusa", str(tmp_path / "vllm-no-bias"), target).module.logits(hidden, 4), expected)  # biases are 0 here


def test_make_head_and_run_from_the_cli(tmp_path, capsys) -> None:
    model = save_tiny_model(tmp_path / "tiny", layers=4)
    for kind in ("eagle3", "medusa"):
        assert main(["make-head", kind, "--target", model, "-o", str(tmp_path / kind)]) == 0
        made = json.loads(capsys.readouterr().out)
        assert made["head"] == f"{kind}:{tmp_path / kind}"
        assert main(["run", "--target", model, "--draft", made["head"], "--prompt", "w1 w2 w3", "--raw", "--max-new-tokens", "8",
                     "--db", str(tmp_path / "runs.duckdb"), "--no-progress"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["status"] == "complete" and result["draft"] == made["head"] and 1 <= result["tokens"] <= 8
    assert main(["run", "--target", model, "--draft", "eagle3:" + str(tmp_path / "nowhere"), "--prompt", "w1", "--raw",
                 "--db", str(tmp_path / "runs.duckdb")]) == 2
    assert "no head folder" in capsys.readouterr().err


def test_inspect_recomputes_a_stored_head_runs_q(tmp_path) -> None:
    """A head run stored and reopened: Inspect's laws (all positions, and one position's) give the
    recorded q; the head's folder is named among the models a shared file would make us load."""
    from diagnostics.audit.recorded import audit_recorded_run
    from diagnostics.inspection import RunLaws, draft_model, exact_laws, models_to_load
    from diagnostics.drafts import load_draft
    from diagnostics.models import load_model
    from diagnostics.runner import RunRequest, record_run
    from diagnostics.store import Store

    model = save_tiny_model(tmp_path / "tiny", seed=1, layers=4)  # seed 0's target ends on EOS at once after this prompt
    target = load_model(model)
    store = Store(tmp_path / "runs.duckdb")
    for kind in ("eagle3", "medusa"):
        folder = make_head(kind, target, tmp_path / kind, scale=0.5)
        spec = f"{kind}:{folder}"
        request = RunRequest(prompt="w1 w2 w3 w4", raw=True, draft=spec, gamma=3, max_new_tokens=16, seed=4,
                             policy=Policy(temperature=0.9))
        run_id, _ = record_run(store, target, load_draft(spec, target), request)
        run = store.get_run(run_id)
        records = [row for row in store.positions(run_id).to_dict("records") if row["draft_token"] is not None]
        assert records and str(folder) in models_to_load(run, trusted=(model,))
        head = draft_model(run, target)
        laws = RunLaws(run, list(run["tokens"]), target, head)
        for record in records:
            q_draft = laws.q_at(int(record["position"]), record)
            assert abs(float(q_draft[int(record["draft_token"])]) - record["q_draft"]) < 1e-5
        _, q_once = exact_laws(run, records[-1], target, head)
        assert abs(float(q_once[int(records[-1]["draft_token"])]) - records[-1]["q_draft"]) < 1e-5
        # The recorded-run audit (audit --run ID --load-models) recomputes q the same way: the
        # correct run passes, a run drafted with the state paired one token off fails on q.
        assert audit_recorded_run(store, run_id, target).verdict == "pass"
        planted_id, _ = record_run(store, target, dataclasses.replace(load_draft(spec, target), planted="pairing_off_by_one"),
                                   request)
        audit = audit_recorded_run(store, planted_id, target)
        assert audit.verdict == "fail" and {flag["check"] for flag in audit.flags} == {"q recomputed"}, audit.flags
