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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from diagnostics.audit.engine_level import AUXILIARY_SEED, PitSample, randomized_pits
from diagnostics.audit.samples import MAX_ID, Sample, SamplesError
from diagnostics.policy import Policy, probabilities

MAX_TOP = 1024  # returned log-probabilities per position that a file may hold
SUM_TOLERANCE = 1e-3  # Σ exp ℓ over the returned entries may exceed 1 by this (float32 servers)
OK, MISSING, IMPOSSIBLE = "ok", "missing", "impossible"


@dataclass(frozen=True)
class PositionScores:
    """The server's scores at one output position: ``ℓ(y_t)`` and its top ``k`` ``(id, ℓ)`` by rank."""

    token_logprob: float | None
    top: tuple[tuple[int, float], ...]

    def as_json(self) -> dict[str, Any]:
        return {"logprob": self.token_logprob, "top": [[token, logprob] for token, logprob in self.top]}


def _logprob(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 1e-6:
        raise SamplesError(f"{where}: a log-probability must be a number <= 0 or null, got {str(value)[:40]}")
    return max(float(value), -1e30)  # a server's "-inf" stand-in (-9999) and -inf itself both mean probability 0


def parse_scores(value: Any, tokens: int, where: str) -> list[PositionScores | None] | None:
    """A line's ``"scores"`` (one entry per emitted token, or null), checked; ``SamplesError`` naming ``where``."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != tokens:
        raise SamplesError(f"{where}: 'scores' must be a list with one entry per token id ({tokens})")
    parsed: list[PositionScores | None] = []
    for position, entry in enumerate(value):
        if entry is None:
            parsed.append(None)
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("top", []), list) or len(entry.get("top", [])) > MAX_TOP:
            raise SamplesError(f"{where}: scores[{position}] must be {{\"logprob\": number, \"top\": [[id, logprob], …]}} "
                               f"with at most {MAX_TOP} entries")
        top = []
        for item in entry.get("top", []):
            if (not isinstance(item, list) or len(item) != 2 or isinstance(item[0], bool) or not isinstance(item[0], int)
                    or not 0 <= item[0] <= MAX_ID):
                raise SamplesError(f"{where}: scores[{position}].top holds [token id, logprob] pairs")
            logprob = _logprob(item[1], where)
            if logprob is None:
                raise SamplesError(f"{where}: scores[{position}].top has a null log-probability")
            top.append((item[0], logprob))
        if top and not sum(math.exp(logprob) for _, logprob in top) > 0:  # log of 0 later: "math domain error"
            raise SamplesError(f"{where}: scores[{position}].top gives every listed id log-probability -inf (probability 0), "
                               "so it is no law's top: collect the scores again")
        parsed.append(PositionScores(_logprob(entry.get("logprob"), where), tuple(top)))
    return parsed


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


def position_pit(scores: PositionScores | None, token: int, policy: Policy, generator: torch.Generator) -> tuple[str, float | None]:
    """``(OK, u)``, ``(IMPOSSIBLE, None)`` (the declared law gives ``y_t`` probability 0) or
    ``(MISSING, None)`` (the scores cannot settle this position); see the module's docstring."""
    if scores is None or scores.token_logprob is None or not scores.top:
        return MISSING, None
    top = dict(scores.top)
    if len(top) != len(scores.top):
        return MISSING, None  # an id listed twice: not a top-k list
    logprobs = np.array(list(top.values()), dtype=np.float64)
    if not 0 < np.exp(logprobs).sum() <= 1 + SUM_TOLERANCE:
        return MISSING, None  # placeholders (llama.cpp's 0.0) or not log-probabilities of one law
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
            logprob = _logprob(item.get("logprob"), "prompt_logprobs")
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
        pairs = [(item[1], _logprob(item[0], "input_top_logprobs")) for item in (top or [])
                 if isinstance(item, list) and len(item) >= 2 and isinstance(item[1], int) and item[0] is not None]
        scores.append(PositionScores(_logprob(mine[0], "input_token_logprobs"), tuple(pairs)))
    return scores


SCORE_APIS = ("vllm", "sglang")


def score_request(api: str, model: str, ids: list[int], k: int) -> tuple[str, dict[str, Any]]:
    """The path and body that ask ``api`` to score ``ids`` (prompt then continuation) with its top ``k``, generating nothing."""
    if api == "vllm":
        return "/v1/completions", {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}
    if api == "sglang":
        return "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                             "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": k}
    raise SamplesError(f"unknown scores API {api!r}: use one of {', '.join(SCORE_APIS)}")


__all__ = ["MISSING", "OK", "IMPOSSIBLE", "PositionScores", "SCORE_APIS", "ScoredPits", "parse_scores", "position_pit",
           "score_request", "scored_pits", "scores_from_sglang", "scores_from_vllm", "unsupported"]
