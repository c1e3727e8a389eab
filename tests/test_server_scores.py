"""The server's own teacher-forced scores as the external audit's oracle.

Unit level: a PIT computed from top-k scores equals the PIT from the whole law where the law is
settled by them, and the tail stand-in at temperature 1 is exactly uniform (closed form against
simulation). End to end: a fake vLLM/SGLang server over the tiny target (it samples the exact law,
and scores by teacher forcing, with planted score bugs) driven through ``audit --endpoint``.

Sizes: a TV of 0.1 needs 1,178 PIT tokens (``--detect-tv 0.1``); 3 prompts × 50 generations of
12 tokens give about 1,700."""

from __future__ import annotations

import json
import math
from dataclasses import replace
import pytest
import torch
from devices import DEVICE
from fake_vllm import FakeVllm as _Fake
from fake_vllm import fake_vllm_server

from diagnostics.audit.engine_level import _uniformity, randomized_pits
from diagnostics.audit.external import audit_scored_samples
from diagnostics.audit.samples import Sample, SamplesError, load_samples
from diagnostics.audit.server_scores import IMPOSSIBLE, MISSING, OK, PositionScores, position_pit
from diagnostics.audit.suite import tiny_setup
from diagnostics.cli import main
from diagnostics.policy import Policy, probabilities

PROMPTS = ["1 2 3 4", "5 6 7", "2 9 4 4 1"]
PER_PROMPT = 50


def uniform_p_value(values: list[float]) -> float:
    return _uniformity(values, 20)[1].p_value


def _scores(law_raw: torch.Tensor, token: int, k: int) -> PositionScores:
    logprobs = torch.log(law_raw)
    order = sorted(range(law_raw.numel()), key=lambda i: (-float(law_raw[i]), i))[:k]
    return PositionScores(float(logprobs[token]), tuple((i, float(logprobs[i])) for i in order))


@pytest.mark.parametrize("policy", [Policy(temperature=0.7, top_k=4), Policy(temperature=1.3, top_k=5, top_p=0.8),
                                    Policy(temperature=1.0, top_k=3, min_p=0.2), Policy(temperature=0.6, min_p=0.3),
                                    Policy(temperature=1.0)])
def test_a_pit_from_scores_equals_the_pit_from_the_whole_law(policy: Policy) -> None:
    """Where the scores settle the law (and the token is in the top returned), the same draw gives the same PIT."""
    generator = torch.Generator().manual_seed(3)
    compared = 0
    for trial in range(60):
        logits = torch.randn(1, 12, generator=generator, dtype=torch.float64) * 2
        raw = torch.softmax(logits, -1)[0]
        law = probabilities(logits, policy)[0]
        token = int(torch.multinomial(law, 1, generator=generator))
        scores = _scores(raw, token, 6)
        status, value = position_pit(scores, token, policy, torch.Generator().manual_seed(trial))
        if status == MISSING or token not in dict(scores.top):  # outside the top: the tail stand-in, tested below
            continue
        expected = randomized_pits(law.reshape(1, -1), [token], torch.Generator().manual_seed(trial))[0]
        assert status == OK and value == pytest.approx(expected, abs=1e-9)
        compared += 1
    assert compared >= 30


def test_the_tail_stand_in_keeps_the_pit_exactly_uniform() -> None:
    """Temperature 1, top 2 of 12 returned: most tokens fall outside and get U[m, 1]; 20,000 PITs detect a binned TV of 0.035."""
    generator = torch.Generator().manual_seed(7)
    values, tail = [], 0
    for draw in range(20_000):
        if draw % 50 == 0:
            raw = torch.softmax(torch.randn(12, generator=generator, dtype=torch.float64), -1)
        token = int(torch.multinomial(raw, 1, generator=generator))
        scores = _scores(raw, token, 2)
        tail += token not in dict(scores.top)
        status, value = position_pit(scores, token, Policy(), generator)
        assert status == OK
        values.append(value)
    assert tail > 6_000 and uniform_p_value(values) > 0.001
    # Negative control: the tail's PIT drawn on [0, 1] instead of [m, 1] is caught at the same size.
    bad = []
    for draw in range(20_000):
        if draw % 50 == 0:
            raw = torch.softmax(torch.randn(12, generator=generator, dtype=torch.float64), -1)
        token = int(torch.multinomial(raw, 1, generator=generator))
        scores = _scores(raw, token, 2)
        if token in dict(scores.top):
            bad.append(position_pit(scores, token, Policy(), generator)[1])
        else:
            bad.append(float(torch.rand((), generator=generator)))
    assert uniform_p_value(bad) < 1e-6


def test_placeholders_and_impossible_tokens() -> None:
    generator = torch.Generator().manual_seed(0)
    placeholder = PositionScores(0.0, ((3, 0.0), (5, 0.0), (7, 0.0)))  # llama.cpp's logprob 0.0 stand-ins
    assert position_pit(placeholder, 3, Policy(), generator)[0] == MISSING
    assert position_pit(None, 3, Policy(), generator)[0] == MISSING
    top = PositionScores(math.log(0.1), ((1, math.log(0.5)), (2, math.log(0.3)), (4, math.log(0.1))))
    assert position_pit(top, 9, Policy(temperature=0.8, top_k=2), generator)[0] == IMPOSSIBLE
    assert position_pit(top, 1, Policy(temperature=0.0), generator)[0] == OK
    assert position_pit(top, 2, Policy(temperature=0.0), generator)[0] == IMPOSSIBLE
    assert position_pit(top, 1, Policy(temperature=0.8, top_k=5), generator)[0] == MISSING  # fewer than top-k returned


def test_an_id_outside_the_targets_vocabulary_is_a_one_line_error_in_the_cross_check() -> None:
    """Cross-checking the scores against ``target`` forwards the ids: one beyond its 12 ids is refused by name first."""
    target = tiny_setup(DEVICE).target

    def scored(token: int) -> PositionScores:
        return PositionScores(math.log(0.5), ((token, math.log(0.5)), (0, math.log(0.3))))

    samples = [Sample(prompt="p", token_ids=[3, 4, 5], temperature=1.0, prompt_ids=[1, 2],
                      scores=[scored(3), scored(4), scored(5)], where=f"s.jsonl line {line + 1}") for line in range(20)]
    samples[7].token_ids, samples[7].scores = [3, 40, 5], [scored(3), scored(40), scored(5)]
    with pytest.raises(SamplesError, match=r"s.jsonl line 8: token_ids holds the id 40, outside the target's vocabulary of 12"):
        audit_scored_samples(samples, target=target)
    samples[7].token_ids, samples[7].prompt_ids = [3, 4, 5], [1, 99]
    with pytest.raises(SamplesError, match="prompt_ids holds the id 99"):
        audit_scored_samples(samples, target=target)


def test_scores_all_minus_infinity_are_missing_to_the_audit_and_its_cross_check() -> None:
    """One predicate (``usable_scores``) for the PIT and the cross-check: a position whose listed
    log-probs are all -inf is left out by both (the cross-check's copy raised 'math domain error')."""
    target = tiny_setup(DEVICE).target
    dead = PositionScores(-math.inf, ((3, -math.inf), (0, -math.inf)))
    assert position_pit(dead, 3, Policy(), torch.Generator().manual_seed(0)) == (MISSING, None)

    def scored(token: int) -> PositionScores:
        return PositionScores(math.log(0.5), ((token, math.log(0.5)), (0, math.log(0.3))))

    samples = [Sample(prompt="p", token_ids=[3, 4, 5], temperature=1.0, prompt_ids=[1, 2], scores=[dead] * 3) for _ in range(20)]
    samples[0].scores = [scored(3), scored(4), scored(5)]
    result = audit_scored_samples(samples, target=target)
    assert result.score_check["positions"] == 3 and result.tokens == 3  # the one generation with usable scores


@pytest.fixture(scope="module")
def server():
    with fake_vllm_server(tiny_setup(DEVICE).target) as url:
        yield url


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in PROMPTS))
    return path


def _collect_and_audit(server, prompts, out, capsys, *extra: str, bug: str | None = None) -> dict:
    _Fake.bug = bug
    try:
        code = main(["audit", "--endpoint", server, "--model", "tiny", "--prompts", str(prompts), "--n", str(PER_PROMPT),
                     "--max-tokens", "12", "--rate", "10000", "--oracle", "server", "--detect-tv", "0.1", "--out", str(out), *extra])
    finally:
        _Fake.bug = None
    assert code == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow  # slow tier: full-size audits against fake servers (about 7 s a case)
@pytest.mark.parametrize("extra", [["--score-logprobs", "3"], ["--temperature", "0.8", "--top-k", "4", "--score-logprobs", "5"],
                                   ["--scores-api", "sglang", "--temperature", "0.7", "--min-p", "0.1", "--score-logprobs", "8"]],
                         ids=["vllm-t1-tail", "vllm-topk", "sglang-minp"])
def test_a_correct_server_passes_against_its_own_scores(server, prompts, tmp_path, capsys, extra) -> None:
    result = _collect_and_audit(server, prompts, tmp_path / "s.jsonl", capsys, *extra)
    assert result["verdict"] == "pass", result["reasons"]
    assert result["design"] == "one-sample: server's scores" and result["tokens"] >= 1178
    again = audit_scored_samples(load_samples(tmp_path / "s.jsonl"), detect_tv=0.1)  # the file alone gives the same verdict
    assert again.verdict == "pass" and again.tokens == result["tokens"]


@pytest.mark.slow  # slow tier: audits sized to catch a shift, against fake servers (about 12 s)
def test_shifted_scores_and_a_hotter_engine_fail(server, prompts, tmp_path, capsys) -> None:
    """llama-cpp-python's echo scores each token with the next position's law: that oracle fails a correct engine.
    An engine sampling at 1.5× the declared temperature fails against correct scores."""
    shifted = _collect_and_audit(server, prompts, tmp_path / "shift.jsonl", capsys, "--score-logprobs", "3", bug="shift")
    assert shifted["verdict"] == "fail" and shifted["p_value"] < 1e-6
    hot = _collect_and_audit(server, prompts, tmp_path / "hot.jsonl", capsys, "--temperature", "0.6", "--top-k", "6",
                             "--score-logprobs", "6", bug="hot")
    assert hot["verdict"] == "fail" and hot["p_value"] < 1e-4


def test_placeholder_scores_are_missing_not_a_verdict(server, prompts, tmp_path, capsys) -> None:
    _Fake.bug = "placeholder"
    try:
        code = main(["audit", "--endpoint", server, "--model", "tiny", "--prompts", str(prompts), "--n", "2",
                     "--max-tokens", "4", "--rate", "10000", "--oracle", "server", "--out", str(tmp_path / "p.jsonl")])
    finally:
        _Fake.bug = None
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and "settle no token (24 positions left out)" in error


def test_unsupported_settings_and_misuse_are_one_line_errors(server, prompts, tmp_path, capsys) -> None:
    path = tmp_path / "s.jsonl"
    _collect_and_audit(server, prompts, path, capsys, "--score-logprobs", "3")
    samples = load_samples(path)
    for sample in samples:
        sample.temperature = 0.8
    with pytest.raises(SamplesError, match="temperature 0.8 without top-k"):
        audit_scored_samples(samples)
    assert main(["audit", "--samples", str(path), "--oracle", "server", "--baseline-samples", str(path)]) == 2
    assert "choose one" in capsys.readouterr().err
    line = json.loads(path.read_text().splitlines()[0])
    line["scores"] = line["scores"][:-1]
    (tmp_path / "bad.jsonl").write_text(json.dumps(line) + "\n")
    assert main(["audit", "--samples", str(tmp_path / "bad.jsonl"), "--oracle", "server"]) == 2
    assert "one entry per token id" in capsys.readouterr().err


class _WordTokenizer:
    """The fake server's tokenizer (a word is its id) in Hugging Face's calling shape."""

    eos_token_id = 11

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [int(word) for word in text.split()]}


@pytest.mark.parametrize("bug", [None, "drop"])
def test_llama_cpp_native_ids_and_generations_cut_short(server, tmp_path, bug) -> None:
    """llama-server's own /completion returns the ids it generated, so nothing is retokenised or left
    out. Its speculative path once dropped accepted tokens at the length limit while still reporting
    n_predict: a generation ended by length, short of max_tokens, without EOS, has probability 0
    under the declared law, and the audit fails it (the per-token test alone cannot see a dropped token)."""
    from diagnostics.audit.collect import collect
    from diagnostics.audit.completions import Sampling
    from diagnostics.audit.external import audit_samples

    target = tiny_setup(DEVICE).target
    _Fake.bug = bug
    try:
        out = collect(server, "tiny", PROMPTS, tmp_path / "native.jsonl", n=21, sampling=Sampling(max_tokens=12),
                      rate=10_000, api="llama.cpp", tokenize=lambda text: [int(word) for word in text.split()])
    finally:
        _Fake.bug = None
    samples = load_samples(out)
    assert all(sample.ids_source == "engine" and sample.finish_reason == "length" for sample in samples)
    result = audit_samples(samples, target, detect_tv=0.1)
    dropped = sum(len(sample.token_ids) < 12 for sample in samples)
    # 63 generations (756 tokens): too few to pass at TV 0.1, enough to see every cut generation.
    if bug is None:
        assert dropped == 0 and result.verdict == "inconclusive" and result.stopped_short == 0, result.reasons
    else:
        assert dropped == len(samples) // 3 and result.stopped_short == dropped and result.verdict == "fail"
        assert any("ended with fewer tokens than their max_tokens and no EOS" in reason for reason in result.reasons)
        assert result.p_value > 0.01  # what survives follows the law: only the length check catches it
        # The file cannot switch the check off: no finish_reason, a claim of retokenised ids, or "stop"
        # on the engine's own ids (which would hold the EOS it sampled) leave the cut generations cut.
        for change in ({"finish_reason": None}, {"ids_source": "retokenized", "completion_tokens": None},
                       {"finish_reason": "stop"}):
            bent = audit_samples([Sample(**{**vars(sample), **change}) for sample in samples], target, detect_tv=0.1)
            assert bent.stopped_short == dropped and bent.verdict == "fail", (change, bent.reasons)
        # A claim of retokenised ids is checked against the text where the target has a tokenizer:
        # text that does not give the ids is refused, naming the line; text that does is accepted.
        claimed = [Sample(**{**vars(sample), "ids_source": "retokenized", "completion_tokens": None}) for sample in samples]
        assert audit_samples(claimed, replace(target, tokenizer=_WordTokenizer()), detect_tv=0.1).stopped_short == dropped
        claimed[5].text = " 9" + (claimed[5].text or "")
        with pytest.raises(SamplesError, match=r"line 6: says its token_ids were retokenized from its text, but its "
                                                r"text tokenises to other ids"):
            audit_samples(claimed, replace(target, tokenizer=_WordTokenizer()), detect_tv=0.1)


def test_the_cli_collects_llama_cpp_ids_and_fails_generations_cut_short(server, prompts, tmp_path, capsys) -> None:
    result = _collect_and_audit(server, prompts, tmp_path / "cli.jsonl", capsys, "--score-logprobs", "3",
                                "--completion-api", "llama.cpp", "--n", "12", bug="drop")
    assert result["verdict"] == "fail" and result["stopped_short"] == len(PROMPTS) * 12 // 3
    assert {sample.ids_source for sample in load_samples(tmp_path / "cli.jsonl")} == {"engine"}
