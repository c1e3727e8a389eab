"""The eight single-draft rules, each a triple ``(a, f, b)`` with its exact one-step law in closed form
(``docs/maths.md``), each citing the paper it comes from. The contract and the helpers are in ``base``;
parsing a spec (``get_rule``) is in ``specs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from diagnostics.metrics import entropy
from diagnostics.policy import medusa_gate
from diagnostics.rules.base import (
    Rule,
    RuleError,
    check_range,
    as_law,
    as_laws,
    induced_by_mechanism,
    normalise_or,
    one_hot_argmax,
    restrict,
    safe_ratio,
)


@dataclass(frozen=True)
class Lossless(Rule):
    """From: Leviathan et al., Fast Inference from Transformers via Speculative Decoding (2023, arXiv:2211.17192)."""

    name: ClassVar[str] = "lossless"
    family: ClassVar[str] = "lossless"
    summary: ClassVar[str] = "accept x with min(1, p/q); on rejection sample norm((p − q)+). Emits exactly p."
    tree_capable: ClassVar[bool] = True

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``a = min(1, p/q)``."""
        p_target, q_draft = as_laws(p, q)
        return safe_ratio(p_target, q_draft).clamp(max=1.0)

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``f = norm((p − q)+)``."""
        p_target, q_draft = as_laws(p, q)
        return normalise_or((p_target - q_draft).clamp(min=0.0), p_target)

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``P = p``."""
        return as_laws(p, q)[0].clone()

    def tree_accept(self, p_node: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        """``a_j = p_j(c)``."""
        return p_node.gather(-1, candidate.unsqueeze(-1)).squeeze(-1)


@dataclass(frozen=True)
class Greedy(Rule):
    """From: Stern et al., Blockwise Parallel Decoding for Deep Autoregressive Models (2018)."""

    name: ClassVar[str] = "greedy"
    family: ClassVar[str] = "lossless"
    summary: ClassVar[str] = "accept x only if it is argmax p; emit argmax p otherwise (lossless for T = 0)."

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``a = 1[v = argmax p]``."""
        return one_hot_argmax(as_laws(p, q)[0])

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``f = δ_argmax p``."""
        return one_hot_argmax(as_laws(p, q)[0])

    def bonus(self, p: torch.Tensor) -> torch.Tensor:
        """``b = δ_argmax p``."""
        return one_hot_argmax(as_law(p, "p"))

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``P = δ_argmax p``."""
        return one_hot_argmax(as_laws(p, q)[0])

    def baseline(self, p: torch.Tensor) -> torch.Tensor:
        """Greedy target decoding: ``δ_argmax p``."""
        return one_hot_argmax(as_law(p, "p"))


@dataclass(frozen=True)
class _Truncation(Rule):
    """Deterministic gate ``a = 1_A(v)``; fallback and bonus ``p`` (full): ``P = q·1_A + q(Aᶜ)·p``."""

    family: ClassVar[str] = "truncation"

    def _gate(self, p_target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def allowed_set(self, p: torch.Tensor) -> torch.Tensor:
        return self._gate(as_law(p, "p"))

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``a = 1_A(v)``: no coin, the gate is deterministic."""
        p_target, _ = as_laws(p, q)
        return self._gate(p_target).to(torch.float64)

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``f = p`` (the full target, not truncated)."""
        return as_laws(p, q)[0].clone()

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``P = q·1_A + q(Aᶜ)·f``."""
        p_target, q_draft = as_laws(p, q)
        allowed = self._gate(p_target)
        rejected_mass = (q_draft * ~allowed).sum(-1, keepdim=True)
        return q_draft * allowed + rejected_mass * self.fallback(p_target, q_draft)

    def baseline(self, p: torch.Tensor) -> torch.Tensor:
        """``p_A = p·1_A / p(A)``: lossless sampling under the same truncation."""
        p_target = as_law(p, "p")
        return restrict(p_target, self._gate(p_target))


@dataclass(frozen=True)
class Cascade(_Truncation):
    """From: Narasimhan et al., Faster Cascades via Speculative Decoding (2024), here as a min-p gate."""

    m: float = 0.5
    name: ClassVar[str] = "cascade"
    param_names: ClassVar[tuple[str, ...]] = ("m",)
    summary: ClassVar[str] = "SpecCascade token rule: keep x iff p(x) ≥ m·max p; else sample p."
    tree_capable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_range("cascade", "m", self.m, 0.0, 1.0, low_open=True, hint="the min-p gate relative to max p")

    def _gate(self, p_target: torch.Tensor) -> torch.Tensor:
        """``A = {v : p(v) ≥ m·max p}`` (contains the argmax since ``m ≤ 1``)."""
        return p_target >= self.m * p_target.amax(-1, keepdim=True)

    def tree_accept(self, p_node: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        """``a_j = 1[p_j(c) ≥ m·max p_j]``."""
        picked = p_node.gather(-1, candidate.unsqueeze(-1)).squeeze(-1)
        return (picked >= self.m * p_node.amax(-1)).to(torch.float64)


def eta_threshold(p_target: torch.Tensor, eta: float) -> torch.Tensor:
    """``τ(p) = min(η, √η·e^{−H(p)})`` with its trailing dimension kept.

    From: Hewitt et al., Truncation Sampling as Language Model Desmoothing (2022, arXiv:2210.15191).
    """
    return torch.clamp(math.sqrt(eta) * torch.exp(-entropy(p_target)), max=eta).unsqueeze(-1)


@dataclass(frozen=True)
class Typical(_Truncation):
    """From: Cai et al., Medusa (2024, arXiv:2401.10774), typical acceptance with the eta-sampling threshold."""

    eta: float = 0.1
    name: ClassVar[str] = "typical"
    param_names: ClassVar[tuple[str, ...]] = ("eta",)
    summary: ClassVar[str] = "eta gate: keep x iff p(x) ≥ min(η, √η·e^{−H(p)}); else sample p."
    tree_capable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_range("typical", "eta", self.eta, 0.0, 1.0, low_open=True, hint="the eta cutoff")

    def _gate(self, p_target: torch.Tensor) -> torch.Tensor:
        """``A = {v : p(v) ≥ τ(p)}``; the argmax is in ``A`` for ``η ≤ 1`` (forced against rounding)."""
        allowed = p_target >= eta_threshold(p_target, self.eta)
        return allowed | one_hot_argmax(p_target).bool()

    def tree_accept(self, p_node: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        """Soft gate ``a_j = min(1, p_j(c)/τ(p_j))``, ``τ`` recomputed on each ``p_j``."""
        picked = p_node.gather(-1, candidate.unsqueeze(-1)).squeeze(-1)
        return (picked / eta_threshold(p_node, self.eta).squeeze(-1)).clamp(max=1.0)


@dataclass(frozen=True)
class Medusa(_Truncation):
    """From: Cai et al., Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads (2024)."""

    eps: float = 0.09
    delta: float = 0.3
    name: ClassVar[str] = "medusa"
    param_names: ClassVar[tuple[str, ...]] = ("eps", "delta")
    summary: ClassVar[str] = "Medusa typical acceptance: keep x iff p(x) > min(ε, δ·e^{−H'}); else argmax p."

    def __post_init__(self) -> None:
        check_range("medusa", "eps", self.eps, 0.0, 1.0, low_open=True, hint="the posterior threshold")
        check_range("medusa", "delta", self.delta, 0.0, 1.0, low_open=True, hint="the entropy factor")

    def _gate(self, p_target: torch.Tensor) -> torch.Tensor:
        """``A = {v : p(v) > min(ε, δ·e^{−H'(p)})}``, ``H' = −Σ p·log(p + 1e−5)``.

        Not forced to contain the argmax: for a near-uniform ``p`` the threshold can exceed
        ``max p``, every draft is rejected and the fallback ``δ_argmax`` is emitted.
        """
        return medusa_gate(p_target, self.eps, self.delta)

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``f = δ_argmax p``."""
        return one_hot_argmax(as_laws(p, q)[0])

    def bonus(self, p: torch.Tensor) -> torch.Tensor:
        """``b = δ_argmax p``."""
        return one_hot_argmax(as_law(p, "p"))

    def baseline(self, p: torch.Tensor) -> torch.Tensor:
        """``p`` truncated to ``A ∪ {argmax}`` (a truncation always keeps the top token)."""
        p_target = as_law(p, "p")
        return restrict(p_target, self._gate(p_target) | one_hot_argmax(p_target).bool())


@dataclass(frozen=True)
class Lenience(Rule):
    """From: Leviathan et al., Fast Inference from Transformers via Speculative Decoding (2023): lenience l."""

    l: float = 0.5  # noqa: E741 - the paper's name for the lenience factor
    name: ClassVar[str] = "lenience"
    family: ClassVar[str] = "collaborative"
    param_names: ClassVar[tuple[str, ...]] = ("l",)
    summary: ClassVar[str] = "accept x with min(1, p/(l·q)); on rejection sample norm((p − q)+). P ≤ p/l."
    lossless_params: ClassVar[dict[str, float] | None] = {"l": 1.0}
    tree_capable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_range("lenience", "l", self.l, 0.0, 1.0, low_open=True, hint="1 is lossless, smaller is more lenient")

    @property
    def ceiling_factor(self) -> float:
        """The ceiling ``p/l``."""
        return float(self.l)

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``a = min(1, p/(l·q))``."""
        p_target, q_draft = as_laws(p, q)
        return safe_ratio(p_target, self.l * q_draft).clamp(max=1.0)

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``f = norm((p − q)+)`` with the unscaled ``q``."""
        p_target, q_draft = as_laws(p, q)
        return normalise_or((p_target - q_draft).clamp(min=0.0), p_target)

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Three regions, with ``Δ = β / TV(p, q)`` and ``β = Σ (q − p/l)+``.

        ``q ≤ p``: ``Δ·p + (1 − Δ)·q``; ``p < q < p/l``: ``q``; ``q ≥ p/l``: ``p/l``.
        ``β`` and ``TV`` are summed from positive parts so that ``Δ`` stays accurate as ``q → p``.
        """
        p_target, q_draft = as_laws(p, q)
        ceiling = p_target / self.l
        beta = (q_draft - ceiling).clamp(min=0.0).sum(-1, keepdim=True)
        tv = (p_target - q_draft).clamp(min=0.0).sum(-1, keepdim=True)
        delta = torch.where(tv > 0, beta / torch.where(tv > 0, tv, 1.0), 0.0)
        under = delta * p_target + (1.0 - delta) * q_draft
        return torch.where(q_draft <= p_target, under, torch.minimum(q_draft, ceiling))

    def tree_accept(self, p_node: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        """``a_j = min(1, p_j(c)/l)``."""
        return (p_node.gather(-1, candidate.unsqueeze(-1)).squeeze(-1) / self.l).clamp(max=1.0)


@dataclass(frozen=True)
class CoS(Rule):
    """From: Fast Large Language Model Collaborative Decoding via Speculation (2025)."""

    lam: float = 0.4
    name: ClassVar[str] = "cos"
    family: ClassVar[str] = "collaborative"
    param_names: ClassVar[tuple[str, ...]] = ("lam",)
    summary: ClassVar[str] = "CoS ensemble: lossless verification of r = λ·q + (1 − λ)·p (λ = draft weight)."
    lossless_params: ClassVar[dict[str, float] | None] = {"lam": 0.0}

    def __post_init__(self) -> None:
        check_range("cos", "lam", self.lam, 0.0, 1.0, hint="the draft's weight in the ensemble; 0 is lossless")

    def ensemble(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``r = λ·q + (1 − λ)·p``."""
        return self._mix(*as_laws(p, q))

    def _mix(self, p_target: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
        # On laws already checked and normalised: normalising twice moves p by an ulp, and at λ = 0
        # the mixture must be p bit for bit (cos:0 is then the lossless mechanism itself).
        return self.lam * q_draft + (1.0 - self.lam) * p_target

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``a = min(1, r/q)``."""
        p_target, q_draft = as_laws(p, q)
        return safe_ratio(self._mix(p_target, q_draft), q_draft).clamp(max=1.0)

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``f = norm((r − q)+) = norm((p − q)+)``.

        ``(r − q)+ = (1 − λ)·(p − q)+``; the right-hand form avoids normalising rounding noise
        at ``λ = 1``, where the fallback is never used.
        """
        p_target, q_draft = as_laws(p, q)
        return normalise_or((p_target - q_draft).clamp(min=0.0), p_target)

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``P = r``."""
        return self.ensemble(p, q)


@dataclass(frozen=True)
class Mentored(Rule):
    """From: Tran-Thien, An Optimal Lossy Variant of Speculative Decoding (Hugging Face blog): mentored decoding."""

    alpha: float = 0.5
    beta: float = 2.0
    name: ClassVar[str] = "mentored"
    family: ClassVar[str] = "collaborative"
    param_names: ClassVar[tuple[str, ...]] = ("alpha", "beta")
    summary: ClassVar[str] = "accept x with min(1, p/(α·q)); on rejection sample norm((p/β − q)+)."
    lossless_params: ClassVar[dict[str, float] | None] = {"alpha": 1.0, "beta": 1.0}

    def __post_init__(self) -> None:
        check_range("mentored", "alpha", self.alpha, 0.0, 1.0, low_open=True, hint="the acceptance ceiling p/alpha")
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta >= 1.0):
            raise RuleError(f"mentored:{self.alpha:g},{self.beta:g} is out of range: beta must be >= 1 (the floor p/beta)")

    @property
    def ceiling_factor(self) -> float:
        """The ceiling ``p/α``."""
        return float(self.alpha)

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``a = min(1, p/(α·q))``."""
        p_target, q_draft = as_laws(p, q)
        return safe_ratio(p_target, self.alpha * q_draft).clamp(max=1.0)

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``f = norm((p/β − q)+)``; ``p`` where that residual is empty."""
        p_target, q_draft = as_laws(p, q)
        return normalise_or((p_target / self.beta - q_draft).clamp(min=0.0), p_target)

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``P = min(q, p/α) + (1 − α_acc)·norm((p/β − q)+)``; equals ``clip(q, p/β, p/α)`` when masses match."""
        return induced_by_mechanism(self, p, q)
