"""Sampling policy: logits -> the law a token is actually drawn from.

The steps and their order are those of Hugging Face ``generate`` with ``do_sample=True``:
temperature, top-k, top-p, min-p, eta. Each step masks logits to ``-inf`` with the same
comparison transformers uses, so the same tokens survive at ties and at the top-p crossing:

* top-k keeps every token whose logit is ``>=`` the k-th largest (ties at the boundary all stay);
* top-p sorts ascending with ``torch.sort`` and drops tokens whose cumulative probability is
  ``<= 1 - top_p``, always keeping the largest;
* min-p drops tokens with ``prob < min_p * max prob``;
* eta drops tokens with ``prob < min(eta, sqrt(eta) * exp(-H))`` but never the top token.

Temperature ``0`` means greedy: a point mass on ``argmax`` (first index at ties), whatever the
truncation, since every truncation keeps the argmax.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


# Logits are float32 (at most about 3.4e38): dividing logits as large as 1e8 by a temperature
# below this would overflow to inf and the softmax to NaN. Smaller temperatures are refused.
MIN_TEMPERATURE = 1e-30


class PolicyError(ValueError):
    """An impossible policy parameter; the message says which and what is allowed."""


@dataclass(frozen=True)
class Policy:
    """Temperature and truncation settings of one side (target or draft)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    eta: float | None = None
    # Medusa's gate as a truncation (the matched baseline of medusa:eps,delta): keep
    # {v : p(v) > min(ε, δ·e^{−H'(p)})} and the top token, on the law the other settings give.
    medusa_eps: float | None = None
    medusa_delta: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            raise PolicyError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.temperature < 0:
            raise PolicyError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise PolicyError(
                f"temperature {self.temperature:g} is too small to compute: logits / T overflow float32; "
                f"use 0 for greedy decoding (the limit T → 0), or a temperature >= {MIN_TEMPERATURE:g}"
            )
        if self.top_k is not None and (int(self.top_k) != self.top_k or self.top_k < 1):
            raise PolicyError(f"top_k must be a whole number >= 1, got {self.top_k}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise PolicyError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.min_p is not None and not (0.0 <= self.min_p <= 1.0):
            raise PolicyError(f"min_p must lie in [0, 1], got {self.min_p}")
        if self.eta is not None and not (0.0 < self.eta < 1.0):
            raise PolicyError(f"eta must lie in (0, 1), got {self.eta}")
        if (self.medusa_eps is None) != (self.medusa_delta is None):
            raise PolicyError("the Medusa gate needs both medusa_eps and medusa_delta, or neither")
        for name in ("medusa_eps", "medusa_delta"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0.0 < value <= 1.0):
                raise PolicyError(f"{name} must lie in (0, 1], got {value!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


# A stored policy's fields as a person reads them, in this order.
_POLICY_WORDS = {"temperature": "temperature", "top_k": "top-k", "top_p": "top-p", "min_p": "min-p", "eta": "η",
                 "medusa_eps": "Medusa ε", "medusa_delta": "Medusa δ"}


def policy_words(stored: str | None) -> str:
    """A run's stored policy (JSON text, maybe a shared file's: bounded parse) for a person:
    ``temperature 1 · top-k 20``, unset fields left out, ``temperature 1, no truncation`` when only
    the temperature is set; ``–`` for none, and ``unreadable`` for text that is not a policy."""
    from diagnostics.untrusted_json import loads

    if not stored:
        return "–"
    try:
        fields = loads(stored, "a run's policy", allow_non_finite=True)
    except (TypeError, ValueError):
        return "unreadable"
    if not isinstance(fields, dict):
        return "unreadable"
    words = [f"{_POLICY_WORDS.get(key, str(key))} {value:g}" if isinstance(value, float) else f"{_POLICY_WORDS.get(key, str(key))} {value}"
             for key, value in sorted(fields.items(), key=lambda item: list(_POLICY_WORDS).index(item[0]) if item[0] in _POLICY_WORDS else 99)
             if value is not None]
    if not words:
        return "–"
    return " · ".join(words) + (", no truncation" if list(fields.get(key) for key in ("top_k", "top_p", "min_p", "eta")) == [None] * 4 else "")


def _masked(scores: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    return scores.masked_fill(remove, -math.inf)


def apply_top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep tokens with ``score >= kth largest score`` (ties at the k-th value all survive)."""
    k = min(int(top_k), scores.size(-1))
    kth = torch.topk(scores, k)[0][..., -1, None]
    return _masked(scores, scores < kth)


def apply_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Drop tokens whose ascending cumulative probability is ``<= 1 - top_p``; keep the top one."""
    if top_p >= 1.0:
        return scores
    sorted_scores, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    sorted_remove = cumulative <= (1 - top_p)
    sorted_remove[..., -1:] = False
    remove = sorted_remove.scatter(-1, sorted_indices, sorted_remove)
    return _masked(scores, remove)


def apply_min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens with ``prob < min_p * max prob`` (the top token always survives)."""
    probs = torch.softmax(scores, dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    remove.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)
    return _masked(scores, remove)


def apply_eta(scores: torch.Tensor, eta: float) -> torch.Tensor:
    """Drop tokens with ``prob < min(eta, sqrt(eta) * exp(-H(prob)))``, never the top token."""
    probs = scores.softmax(dim=-1)
    log_probs = torch.log_softmax(scores, dim=-1).clamp(min=torch.finfo(scores.dtype).min)
    entropy = -(probs * log_probs).sum(-1)
    eta_t = torch.tensor(eta, dtype=scores.dtype, device=scores.device)
    threshold = torch.min(eta_t, torch.sqrt(eta_t) * torch.exp(-entropy))[..., None]
    top = torch.topk(scores, 1)[0][..., -1, None]
    return _masked(scores, (probs < threshold) & (scores < top))


def medusa_gate(p_target: torch.Tensor, eps: float, delta: float) -> torch.Tensor:
    """Medusa's accept set ``A = {v : p(v) > min(ε, δ·e^{−H'(p)})}``, ``H' = −Σ p·log(p + 1e−5)``."""
    h_prime = -(p_target * torch.log(p_target + 1e-5)).sum(-1, keepdim=True)
    threshold = torch.clamp(delta * torch.exp(-h_prime), max=eps)
    return p_target > threshold


def apply_medusa_gate(p_target: torch.Tensor, eps: float, delta: float) -> torch.Tensor:
    """``p`` truncated to ``A ∪ {argmax p}`` and renormalised (a truncation keeps the top token)."""
    keep = medusa_gate(p_target, eps, delta)
    keep.scatter_(-1, p_target.argmax(-1, keepdim=True), True)
    kept = p_target * keep
    return kept / kept.sum(-1, keepdim=True)


def warp_logits(logits: torch.Tensor, policy: Policy) -> torch.Tensor:
    """Policy-applied logits (``-inf`` where truncated), in transformers' order and dtype."""
    scores = logits
    if policy.temperature not in (0, 1):
        scores = scores / float(policy.temperature)
    if policy.top_k is not None:
        scores = apply_top_k(scores, policy.top_k)
    if policy.top_p is not None:
        scores = apply_top_p(scores, policy.top_p)
    if policy.min_p is not None:
        scores = apply_min_p(scores, policy.min_p)
    if policy.eta is not None:
        scores = apply_eta(scores, policy.eta)
    return scores


def probabilities(logits: torch.Tensor, policy: Policy | None = None) -> torch.Tensor:
    """The sampling law ``softmax(warp(logits))`` in float64, or ``δ_argmax`` at temperature 0.

    The mask is decided in the logits' own dtype (as transformers decides it); the softmax of
    the surviving logits is then taken in float64 so the law sums to 1 to double precision.
    """
    policy = policy or Policy()
    if policy.greedy:
        greedy = torch.zeros(logits.shape, dtype=torch.float64, device=logits.device)
        return greedy.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    law = torch.softmax(warp_logits(logits, policy).to(torch.float64), dim=-1)
    if policy.medusa_eps is not None:
        # On the float64 law, as the medusa rule computes its gate, so the baseline is its p_A exactly.
        law = apply_medusa_gate(law, float(policy.medusa_eps), float(policy.medusa_delta))
    return law
