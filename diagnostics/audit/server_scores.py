"""The server's own teacher-forced scores as the oracle: no copy of the weights needed.

After a generation, the continuation is sent back as a prompt and the server scores every token
of it (vLLM ``prompt_logprobs``, SGLang ``input_token_logprobs`` with ``input_top_logprobs``).
At output position ``t`` that gives ``ℓ_t(y_t)``, the raw log-probability of the emitted token,
and the ``k`` largest raw log-probabilities ``ℓ_t(v), v ∈ S_t``. A file stores them per token as
``"scores": [{"logprob": ℓ_t(y_t), "top": [[id, ℓ], …]} | null, …]``.

The declared law is known exactly from ``S_t`` in these cases, and only these:

* **greedy** (temperature 0): ``δ`` at the top of ``S_t``;
* **top-k ≤ k**: the declared top-k keeps ``K ≤ |S_t|`` tokens, all in ``S_t``; temperature, then
  top-p and min-p, act on those ``K`` alone (our order, transformers' order), so the law is the
  policy applied to the ``K`` returned log-probabilities;
* **temperature 1, no truncation**: ``p_t(v) = exp ℓ_t(v)`` on ``S_t``. A token in ``S_t`` gets its
  exact randomized PIT. A token outside gets ``u ~ Uniform[m_t, 1]``, ``m_t = Σ_{S_t} p_t``: under
  ``H0`` the exact PIT lies in ``[m_t, 1]`` exactly when ``y_t ∉ S_t`` (probability ``1 − m_t``)
  and is uniform there, so the stand-in keeps every PIT exactly Uniform(0, 1) (the tail loses power only);
* **min-p without top-p**: min-p keeps ``ℓ ≥ ℓ_max + T·ln(min_p)``; when the smallest returned
  ``ℓ`` is below that cut the whole support lies in ``S_t`` and the law is exact. Where it is not
  (the cut lies beyond what was returned) the position is left out.

A position is left out (counted, never a failure) when it has no score, or its log-probabilities
sum above 1 (llama.cpp's ``logprob: 0.0`` placeholders; processed rather than raw log-probs).
Leaving a position out depends on the history only, never on ``y_t``, so the PITs kept stay
exactly uniform. Other settings (a temperature other than 1 without top-k, top-p without top-k)
need the whole vocabulary's normaliser: the audit says so and asks for the local target.

Trust: the scores come from the server under audit. A biased engine whose server forges scores
consistent with its own outputs passes, so every verdict states that it rests on them
(``TRUST_CAVEAT``); with the local target, ``cross_check`` recomputes up to ``CHECKED_POSITIONS``
of them and a difference above ``SCORE_TOLERANCE`` fails the verdict.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from diagnostics.audit.engine_level import AUXILIARY_SEED, PitSample, randomized_pits
from diagnostics.audit.samples import PositionScores, Sample, SamplesError, checked_logprob
from diagnostics.policy import Policy, probabilities

CHECKED_POSITIONS = 200  # positions whose scores a cross-check against --target recomputes (at most 200 generations' forwards)
# Largest |ℓ_server − ℓ_target| (nats) taken as float noise: float32 implementations agree to ~1e-4;
# a bfloat16 server's logits round to 2^-8 relative (≈ 0.03 nats at a logit of 8). 0.05 nats moves a
# probability by 5%, the size of distortion the audit is asked to detect by default (--detect-tv 0.05).
SCORE_TOLERANCE = 0.05
COMPARED_FLOOR = math.log(1e-4)  # entries both sides give less probability carry no mass the audit tests
SUM_TOLERANCE = 1e-3  # Σ exp ℓ over the returned entries may exceed 1 by this (float32 servers)
OK, MISSING, IMPOSSIBLE = "ok", "missing", "impossible"


def unsupported(policy: Policy) -> str | None:
    """Why the server's top-k scores cannot give ``policy``'s law (``None``: they can)."""
    if policy.greedy or policy.top_k is not None:
        return None
    if policy.top_p is not None:
        return "top-p without top-k needs the whole vocabulary's law"
    if policy.min_p is None and policy.temperature != 1:
        return f"temperature {policy.temperature:g} without top-k or min-p needs the whole vocabulary's normaliser"
    return None


def _pit_among(ids: list[int], logprobs: list[float], policy: Policy, token: int, generator: torch.Generator) -> tuple[str, float | None]:
    """The randomized PIT of ``token`` under ``policy`` applied to the logits ``logprobs`` of ``ids``
    (columns in id order, so ties break by id as over the whole vocabulary)."""
    order = sorted(range(len(ids)), key=lambda index: ids[index])
    ordered_ids = [ids[index] for index in order]
    logits = torch.tensor([[logprobs[index] for index in order]], dtype=torch.float64, device="cpu")  # a server's scores: host data
    law = probabilities(logits, policy)
    if token not in ordered_ids or float(law[0, ordered_ids.index(token)]) <= 0:
        return IMPOSSIBLE, None
    return OK, randomized_pits(law, [ordered_ids.index(token)], generator)[0]


def usable_scores(scores: PositionScores | None) -> bool:
    """Whether ``scores`` read as one law's top log-probabilities: the token's and a top list, no id
    listed twice (else not a top-k list), probabilities summing to more than 0 (not all -inf) and at
    most 1 + ``SUM_TOLERANCE`` (not placeholders such as llama.cpp's 0.0). The audit and its cross-check
    read only these."""
    if scores is None or scores.token_logprob is None or not scores.top:
        return False
    top = dict(scores.top)
    if len(top) != len(scores.top):
        return False
    return bool(0 < np.exp(np.array(list(top.values()), dtype=np.float64)).sum() <= 1 + SUM_TOLERANCE)


def position_pit(scores: PositionScores | None, token: int, policy: Policy, generator: torch.Generator) -> tuple[str, float | None]:
    """``(OK, u)``, ``(IMPOSSIBLE, None)`` (the declared law gives ``y_t`` probability 0) or
    ``(MISSING, None)`` (the scores cannot settle this position); see the module's docstring."""
    if not usable_scores(scores):
        return MISSING, None
    top = dict(scores.top)
    logprobs = np.array(list(top.values()), dtype=np.float64)
    ranked = sorted(top.items(), key=lambda item: (-item[1], item[0]))
    if policy.greedy:
        if token != ranked[0][0]:
            return IMPOSSIBLE, None
        return OK, float(torch.rand((), generator=generator, dtype=torch.float64, device=generator.device))
    if policy.top_k is not None:
        if len(ranked) < policy.top_k:
            return MISSING, None
        kept = ranked[: policy.top_k]
        within = Policy(temperature=policy.temperature, top_p=policy.top_p, min_p=policy.min_p)
        return _pit_among([i for i, _ in kept], [lp for _, lp in kept], within, token, generator)
    if policy.min_p is not None and policy.top_p is None:
        cut = ranked[0][1] + policy.temperature * math.log(policy.min_p)
        if ranked[-1][1] >= cut:
            return MISSING, None  # the support may reach beyond what the server returned
        return _pit_among([i for i, _ in ranked], [lp for _, lp in ranked], policy, token, generator)
    if policy.temperature == 1 and policy.top_p is None and policy.min_p is None:
        mass = float(np.exp(logprobs).sum())
        draw = float(torch.rand((), generator=generator, dtype=torch.float64, device=generator.device))
        if token not in top:
            return OK, min(1.0, mass + draw * max(0.0, 1.0 - mass))
        p_token = math.exp(top[token])
        before = sum(math.exp(lp) for i, lp in ranked if lp > top[token] or (lp == top[token] and i < token))
        return OK, min(1.0, before + draw * p_token)
    raise SamplesError(f"the server's scores cannot give this law: {unsupported(policy)}; audit against --target instead")


@dataclass
class ScoredPits:
    """What the server's scores give: the PIT sample, per generation and per prompt, and the positions left out."""

    pit: PitSample
    per_generation: list[np.ndarray]
    per_prompt: dict[str, list[float]]
    missing: int = 0
    unscored: int = 0  # generations without any scores


def scored_pits(samples: list[Sample], eos: set[int] | None = None) -> ScoredPits:
    """The randomized PIT of every emitted token from each sample's own ``scores`` (see the module's docstring)."""
    started = time.perf_counter()
    for sample in samples:
        reason = unsupported(sample.policy)
        if reason:
            raise SamplesError(f"the server's scores cannot give the declared law: {reason}; audit against --target "
                               "instead, or collect with top_k at most the scores returned")
    result = ScoredPits(PitSample(generations=len(samples)), [], {})
    stop = set(eos or ())
    for index, sample in enumerate(samples):
        if sample.scores is None:
            result.unscored += 1
            result.per_generation.append(np.zeros(0))
            continue
        generator = torch.Generator().manual_seed((AUXILIARY_SEED + index) % 2**63)
        values = []
        for position, (token, scores) in enumerate(zip(sample.token_ids, sample.scores)):
            status, value = position_pit(scores, token, sample.policy, generator)
            if status == IMPOSSIBLE:
                result.pit.impossible += 1
            elif status == MISSING:
                result.missing += 1
            else:
                result.pit.by_position.setdefault(position, []).append(value)
                values.append(value)
            if token in stop:
                break
        result.per_generation.append(np.asarray(values, dtype=np.float64))
        result.per_prompt.setdefault(sample.prompt, []).extend(values)
    result.pit.time_s = time.perf_counter() - started
    return result


def scores_from_vllm(answer: dict[str, Any], prompt_length: int, tokens: list[int], k: int) -> list[PositionScores | None]:
    """vLLM's ``choices[0].prompt_logprobs`` (one ``{id: {logprob, rank}}`` per prompt token, the
    token itself always included) for the continuation's tokens: top = the entries of rank ≤ ``k``."""
    choices = answer.get("choices")
    entries = choices[0].get("prompt_logprobs") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if not isinstance(entries, list) or len(entries) != prompt_length + len(tokens):
        raise SamplesError("the server's answer has no prompt_logprobs for every token: is it vLLM (prompt_logprobs)?")
    scores: list[PositionScores | None] = []
    for position, token in enumerate(tokens):
        entry = entries[prompt_length + position]
        if not isinstance(entry, dict):
            scores.append(None)
            continue
        top, token_logprob = [], None
        for key, item in entry.items():
            if not (isinstance(key, str) and key.isdigit() and isinstance(item, dict)):
                continue
            logprob = checked_logprob(item.get("logprob"), "prompt_logprobs")
            rank = item.get("rank")
            if int(key) == token:
                token_logprob = logprob
            if isinstance(rank, int) and 1 <= rank <= k and logprob is not None:
                top.append((rank, int(key), logprob))
        scores.append(PositionScores(token_logprob, tuple((token_id, lp) for _, token_id, lp in sorted(top))))
    return scores


def scores_from_sglang(answer: Any, tokens: list[int]) -> list[PositionScores | None]:
    """SGLang's ``meta_info.input_token_logprobs`` (``[logprob, id, text]`` per input token) and
    ``input_top_logprobs`` (a list of them per token), aligned on the continuation's last ids."""
    answer = answer[0] if isinstance(answer, list) and answer else answer
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    own = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
    tops = meta.get("input_top_logprobs") if isinstance(meta, dict) else None
    if not isinstance(own, list) or not isinstance(tops, list) or len(own) < len(tokens) or len(tops) != len(own):
        raise SamplesError("the server's answer has no input_token_logprobs/input_top_logprobs: is it SGLang (return_logprob)?")
    own, tops = own[len(own) - len(tokens):], tops[len(tops) - len(tokens):]
    scores: list[PositionScores | None] = []
    for token, mine, top in zip(tokens, own, tops):
        if not (isinstance(mine, list) and len(mine) >= 2 and mine[1] == token):
            raise SamplesError("the server scored other ids than the continuation's: the scores are not aligned")
        pairs = [(item[1], checked_logprob(item[0], "input_top_logprobs")) for item in (top or [])
                 if isinstance(item, list) and len(item) >= 2 and isinstance(item[1], int) and item[0] is not None]
        scores.append(PositionScores(checked_logprob(mine[0], "input_token_logprobs"), tuple(pairs)))
    return scores


TRUST_CAVEAT = ("this verdict rests on the server's scores being its engine's true target law: a server that forges "
                "scores consistent with its own outputs passes; give --target to cross-check them")


@dataclass
class ScoreCheck:
    """The server's scores against the local target's raw log-probabilities at ``positions`` positions."""

    positions: int
    entries: int
    max_difference: float
    disagreeing: int  # positions where some entry differs by more than ``tolerance``
    tolerance: float
    worst: str = ""

    @property
    def agrees(self) -> bool:
        return self.disagreeing == 0

    def sentence(self) -> str:
        if self.agrees:
            return (f"server scores cross-checked against --target at {self.positions} positions: max |Δ log p| = "
                    f"{self.max_difference:.2g} <= {self.tolerance:g}")
        return (f"server scores disagree with --target: max |Δ log p| = {self.max_difference:.3g} at {self.disagreeing} of "
                f"{self.positions} positions checked (tolerance {self.tolerance:g} nats; {self.worst}): the server's "
                "scores are not the target's law, so a verdict against them means nothing")


def _chosen_positions(samples: list[Sample], limit: int, seed: int = 0) -> dict[int, list[int]]:
    """Up to ``limit`` checkable positions drawn at random (seeded) from all the file's positions:
    spread over generations and positions alike (evenly spaced picks would alias with a fixed length)."""
    lengths = np.array([len(sample.scores) if sample.scores else 0 for sample in samples], dtype=np.int64)
    total = int(lengths.sum())
    if total == 0 or limit < 1:
        return {}
    ends = np.cumsum(lengths)
    picks = np.unique(np.random.default_rng(seed).integers(0, total, size=min(limit, total) * 2))
    chosen: dict[int, list[int]] = {}
    count = 0
    for flat in np.random.default_rng(seed + 1).permutation(picks):
        index = int(np.searchsorted(ends, flat, side="right"))
        position = int(flat - (ends[index] - lengths[index]))
        if usable_scores(samples[index].scores[position]):  # what position_pit reads
            chosen.setdefault(index, []).append(position)
            count += 1
            if count == limit:
                break
    return {index: sorted(positions) for index, positions in sorted(chosen.items())}


@torch.inference_mode()
def cross_check(samples: list[Sample], target: Any, prompt_ids_of: Any, *, limit: int = CHECKED_POSITIONS,
                tolerance: float = SCORE_TOLERANCE) -> ScoreCheck:
    """The server's scores at up to ``limit`` positions (drawn at random, seeded) against ``target``'s raw log-probabilities
    there (teacher forcing; generations of one length share a forward). Raw against raw: the audit applies each
    sample's declared policy to the raw scores, so raw agreement within ``tolerance`` is agreement
    of the declared law. An entry is compared where either side gives it probability >= 1e-4;
    an id outside the target's vocabulary is a disagreement."""
    from diagnostics.engine.drafting import fit_vocabulary
    from diagnostics.models import float_logits

    if not (math.isfinite(tolerance) and tolerance > 0):
        raise SamplesError(f"the score tolerance must be a number > 0 (nats), got {tolerance}")
    longest = getattr(getattr(target.model, "config", None), "max_position_embeddings", None)
    check = ScoreCheck(0, 0, 0.0, 0, tolerance)
    by_length: dict[int, list[tuple[int, list[int], list[int]]]] = {}
    for index, positions in _chosen_positions(samples, limit).items():
        prompt = list(prompt_ids_of(samples[index]))
        length = len(prompt) + len(samples[index].token_ids)
        if prompt and not (longest and length > longest):
            by_length.setdefault(length, []).append((index, prompt, positions))
    for length, rows in sorted(by_length.items()):  # generations of one length share a forward (at most limit rows)
        ids = torch.tensor([prompt + list(samples[index].token_ids) for index, prompt, _ in rows], device=target.device)
        logits = float_logits(target.model(input_ids=ids, use_cache=False).logits).cpu()
        laws = torch.log_softmax(fit_vocabulary(logits, target.vocab_size).double(), dim=-1)
        for row, (index, prompt, positions) in enumerate(rows):
            sample = samples[index]
            for position in positions:
                _compare(check, laws[row, len(prompt) - 1 + position], sample.scores[position], sample.token_ids[position],
                         index, position)
    return check


def _compare(check: ScoreCheck, law: torch.Tensor, scores: PositionScores, token: int, generation: int, position: int) -> None:
    """Adds one position's entries (the emitted token and the top returned) to ``check``."""
    worst = 0.0
    for token_id, logprob in ((token, scores.token_logprob), *scores.top):
        ours = float(law[token_id]) if token_id < law.numel() else -math.inf
        if max(ours, logprob) < COMPARED_FLOOR:
            continue
        difference = abs(ours - logprob) if math.isfinite(ours) else math.inf
        check.entries += 1
        if difference > worst:
            worst = difference
            if difference > check.max_difference:
                check.max_difference = difference
                check.worst = (f"generation {generation + 1}, position {position}, token {token_id}: server "
                               f"{logprob:.4g}, target {ours:.4g}")
    check.positions += 1
    check.disagreeing += worst > check.tolerance


SCORE_APIS = ("vllm", "sglang")


def score_request(api: str, model: str, ids: list[int], k: int) -> tuple[str, dict[str, Any]]:
    """The path and body that ask ``api`` to score ``ids`` (prompt then continuation) with its top ``k``, generating nothing."""
    if api == "vllm":
        return "/v1/completions", {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}
    if api == "sglang":
        return "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                             "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": k}
    raise SamplesError(f"unknown scores API {api!r}: use one of {', '.join(SCORE_APIS)}")


__all__ = ["CHECKED_POSITIONS", "MISSING", "OK", "IMPOSSIBLE", "PositionScores", "SCORE_APIS", "SCORE_TOLERANCE", "ScoreCheck",
           "ScoredPits", "TRUST_CAVEAT", "cross_check", "position_pit",
           "score_request", "scored_pits", "scores_from_sglang", "scores_from_vllm", "unsupported"]
