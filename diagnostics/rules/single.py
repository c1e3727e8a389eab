"""Verification rules: accept probability, fallback, bonus, and the exact induced law.

A single-draft rule is a triple ``(a, f, b)`` (see ``docs/maths.md#notation``): the draft token
``x ~ q`` is kept with probability ``a(x)``; on rejection a token is drawn from the fallback
law ``f``; after a fully accepted block the bonus token is drawn from ``b``. Its exact one-step
law is ``P = q·a + (1 − α)·f`` with ``α = Σ q·a``; each rule also implements the closed form
of ``P`` from the paper, and tests check one against the other and against simulation.

Every function takes ``p`` (target law after the target policy) and ``q`` (the law the draft
token was drawn from) with a trailing vocabulary dimension and any leading batch dimensions,
normalises them, and computes in float64.

Ratios ``p/q`` use the convention ``x/0 = +inf`` for ``x > 0`` and ``0/0 = 0``, so a token the
draft could not have proposed is accepted only if the target allows it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch

from diagnostics.metrics import entropy
from diagnostics.policy import medusa_gate
from diagnostics.rng import sample_inverse_cdf


class RuleError(ValueError):
    """A rule spec that cannot be built; the message says what to write instead."""


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


# Set (``laws_from_engine``) while the round program verifies laws it made itself with a softmax: the
# checks below read a tensor back to the host, a device sync per call on a GPU, for inputs that
# cannot fail them. The normalisation stays, so the laws are bit for bit those of a checked call.
_ENGINE_LAWS: contextvars.ContextVar[bool] = contextvars.ContextVar("engine_laws", default=False)


@contextlib.contextmanager
def laws_from_engine() -> Iterator[None]:
    """Within this block ``as_law`` normalises without validating (no host read): only for laws the
    engine computed as probabilities, never for a caller's input."""
    token = _ENGINE_LAWS.set(True)
    try:
        yield
    finally:
        _ENGINE_LAWS.reset(token)


def as_law(x: torch.Tensor, name: str = "p") -> torch.Tensor:
    """``x / Σ x`` in float64 after checking ``x`` is finite, non-negative, with positive mass.

    A tensor stays on its device; a list or array is host data and becomes a CPU tensor."""
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x, device="cpu")
    if not torch.is_floating_point(x):
        x = x.to(torch.float64)
    x = x.to(torch.float64)
    if x.dim() == 0:
        raise RuleError(f"{name} must have a vocabulary dimension, got a scalar")
    if _ENGINE_LAWS.get():
        return x / x.sum(-1, keepdim=True)
    # One fused pass in the common case; diagnose only when something is wrong.
    if not ((x >= 0) & (x < math.inf)).all():
        if not torch.isfinite(x).all():
            raise RuleError(f"{name} contains inf or nan; pass probabilities, not logits")
        raise RuleError(f"{name} has negative entries; pass probabilities, not logits")
    total = x.sum(-1, keepdim=True)
    if (total <= 0).any():
        raise RuleError(f"{name} has a row with zero total mass")
    return x / total


def as_laws(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate and normalise a target/draft pair; shapes must agree (vocabularies too)."""
    p_target, q_draft = as_law(p, "p"), as_law(q, "q")
    if p_target.shape[-1] != q_draft.shape[-1]:
        raise RuleError(
            f"p and q have different vocabulary sizes ({p_target.shape[-1]} vs "
            f"{q_draft.shape[-1]}); draft and target must share one vocabulary"
        )
    p_target, q_draft = torch.broadcast_tensors(p_target, q_draft)
    return p_target, q_draft


def coin_draws(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """``U[0, 1)`` float64 draws of ``shape`` on ``device``, from ``generator``.

    Drawn on the generator's own device (a CPU generator gives the same draws whatever device the
    laws live on, so a fixed seed is one sample everywhere), then moved to ``device``."""
    source = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=source).to(device)


def safe_ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``num / den`` with ``x/0 = +inf`` for ``x > 0`` and ``0/0 = 0``."""
    ratio = numerator / denominator
    return torch.where(numerator == 0, torch.zeros_like(ratio), ratio)


def normalise_or(residual: torch.Tensor, default: torch.Tensor) -> torch.Tensor:
    """``residual / Σ residual``, or ``default`` in rows where the residual has no mass.

    An empty residual only happens where rejection has probability 0, so the default never
    changes a law; it keeps ``fallback`` a valid distribution everywhere.
    """
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / torch.where(mass > 0, mass, 1.0), default)


def one_hot_argmax(p_target: torch.Tensor) -> torch.Tensor:
    """``δ_argmax p`` (first index at ties, as ``torch.argmax``)."""
    return torch.zeros_like(p_target).scatter_(-1, p_target.argmax(-1, keepdim=True), 1.0)


def restrict(p_target: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``p_A = p·1_A / p(A)``: the target truncated to ``A`` and renormalised."""
    return normalise_or(p_target * allowed, one_hot_argmax(p_target))


def induced_by_mechanism(rule: "Rule", p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``P = q·a + (1 − α)·f`` with ``α = Σ q·a``: the law of draw, coin, fallback, no closed form."""
    p_target, q_draft = as_laws(p, q)
    accept = rule.accept_prob(p_target, q_draft)
    kept = q_draft * accept
    alpha = kept.sum(-1, keepdim=True)
    return kept + (1.0 - alpha).clamp(min=0.0) * rule.fallback(p_target, q_draft)


# --------------------------------------------------------------------------------------------
# Single-draft rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """Base class: a single-draft verification rule ``(a, f, b)`` with its exact law."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    param_names: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""
    tree_capable: ClassVar[bool] = False

    @property
    def params(self) -> dict[str, float]:
        return {key: getattr(self, key) for key in self.param_names}

    @property
    def spec(self) -> str:
        """The string ``get_rule`` parses back into this rule, e.g. ``lenience:0.5``."""
        if not self.param_names:
            return self.name
        return self.name + ":" + ",".join(f"{getattr(self, key):g}" for key in self.param_names)

    @property
    def lossy(self) -> bool:
        return self.family != "lossless"

    # Parameters at which a lossy family's rule *is* the lossless rule: the same acceptance
    # ``min(1, p/q)`` and fallback ``norm((p − q)+)``, computed bit for bit alike, so with the same
    # coins it emits the same tokens (``lenience:1``, ``cos:0``, ``mentored:1,1``).
    lossless_params: ClassVar[dict[str, float] | None] = None

    @property
    def lossless_equivalent(self) -> bool:
        """Whether this rule's mechanism is the lossless one (``a = min(1, p/q)``, ``f = norm((p − q)+)``,
        so ``P = p``): the lossless rule itself, or a lossy family at its lossless parameters."""
        if self.name == "lossless":
            return True  # greedy shares the lossless family (exact at temperature 0) but not its mechanism
        return self.lossless_params is not None and all(getattr(self, key) == value for key, value in self.lossless_params.items())

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``a(v)`` for every token ``v``: the probability of keeping ``v`` when it is drafted."""
        raise NotImplementedError

    def fallback(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Fallback law ``f`` sampled after a rejection (independent of the rejected token)."""
        raise NotImplementedError

    def bonus(self, p: torch.Tensor) -> torch.Tensor:
        """Bonus law ``b`` sampled after a fully accepted block: ``p`` unless the rule says."""
        return as_law(p, "p")

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Exact one-step law of the emitted token, by the rule's closed form."""
        return induced_by_mechanism(self, p, q)

    def baseline(self, p: torch.Tensor) -> torch.Tensor:
        """Matched baseline: the target sampled losslessly under the same truncation (``p``)."""
        return as_law(p, "p")

    def allowed_set(self, p: torch.Tensor) -> torch.Tensor | None:
        """Truncation set ``A`` (bool ``[..., V]``) for truncation rules, else ``None``."""
        return None

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Per-position acceptance probability ``α = Σ_v q(v)·a(v)``."""
        p_target, q_draft = as_laws(p, q)
        return (q_draft * self.accept_prob(p_target, q_draft)).sum(-1)

    def tree_accept(self, p_node: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        """Acceptance of a deterministic candidate at a tree node with current law ``p_j``."""
        raise RuleError(f"rule {self.spec!r} has no tree form; tree rules: {', '.join(TREE_RULES)}")

    def simulate(
        self, p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``n`` emitted tokens per row from the real mechanism: ``x ~ q``, coin ``u < a(x)``, else ``y ~ f``.

        Returns ``LongTensor[..., n]``. Draws use inverse-CDF sampling, as the engine does.
        """
        p_target, q_draft = as_laws(p, q)
        shape = (*p_target.shape[:-1], n)
        u_draft, u_accept, u_fallback = (coin_draws(shape, generator, p_target.device) for _ in range(3))
        drafted = sample_inverse_cdf(q_draft, u_draft)
        accept = self.accept_prob(p_target, q_draft).gather(-1, drafted)
        fallback = sample_inverse_cdf(self.fallback(p_target, q_draft), u_fallback)
        return torch.where(u_accept < accept, drafted, fallback)


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
        _check_range("cascade", "m", self.m, 0.0, 1.0, low_open=True, hint="the min-p gate relative to max p")

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
        _check_range("typical", "eta", self.eta, 0.0, 1.0, low_open=True, hint="the eta cutoff")

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
        _check_range("medusa", "eps", self.eps, 0.0, 1.0, low_open=True, hint="the posterior threshold")
        _check_range("medusa", "delta", self.delta, 0.0, 1.0, low_open=True, hint="the entropy factor")

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
        _check_range("lenience", "l", self.l, 0.0, 1.0, low_open=True, hint="1 is lossless, smaller is more lenient")

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
        _check_range("cos", "lam", self.lam, 0.0, 1.0, hint="the draft's weight in the ensemble; 0 is lossless")

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
        _check_range("mentored", "alpha", self.alpha, 0.0, 1.0, low_open=True, hint="the acceptance ceiling p/alpha")
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta >= 1.0):
            raise RuleError(f"mentored:{self.alpha:g},{self.beta:g} is out of range: beta must be >= 1 (the floor p/beta)")

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


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

RULES: dict[str, type[Rule]] = {
    cls.name: cls for cls in (Lossless, Greedy, Cascade, Typical, Medusa, Lenience, CoS, Mentored)
}
TREE_RULES: tuple[str, ...] = tuple(name for name, cls in RULES.items() if cls.tree_capable)
EXAMPLE_SPECS: tuple[str, ...] = (
    "lossless", "greedy", "cascade:0.5", "typical:0.1", "medusa:0.09,0.3",
    "lenience:0.5", "cos:0.4", "mentored:0.5,2",
)


def _check_range(
    rule: str, param: str, value: float, low: float, high: float, *, low_open: bool = False, hint: str = ""
) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        shown = f"{value:g}" if isinstance(value, (int, float)) else repr(value)
        raise RuleError(
            f"{rule}:{shown} is out of range: {param} must lie in {interval}" + (f" ({hint})" if hint else "")
        )


def split_specs(text: str) -> list[str]:
    """A list of rule specs as typed on the CLI and the Compare page: ``lossless,lenience:0.5,medusa:0.09,0.3``.

    Comma-separated; a bare number continues the previous spec (a rule's own parameters), and
    ``;`` also separates (``lossless;medusa:0.09,0.3``).
    """
    if ";" in text:
        return [piece.strip() for piece in text.split(";") if piece.strip()]
    pieces = [piece.strip() for piece in text.split(",") if piece.strip()]
    specs: list[str] = []
    for piece in pieces:
        # A bare number continues the previous spec (medusa:0.09,0.3).
        if specs and _is_number(piece) and ":" in specs[-1]:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _usage(name: str) -> str:
    cls = RULES[name]
    return name + (":" + ",".join(cls.param_names) if cls.param_names else "")


def get_rule(spec: str | Rule, **params: float) -> Rule:
    """Build a rule from a spec (``"lenience:0.5"``, ``"medusa:0.09,0.3"``) or a name plus keywords.

    ``get_rule("lenience", l=0.5) == get_rule("lenience:0.5")``. Raises ``RuleError`` with a
    one-line message for an unknown name, a wrong parameter count or an out-of-range value.
    """
    if isinstance(spec, Rule):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise RuleError(f"empty rule spec; use one of {', '.join(EXAMPLE_SPECS)}")
    name, _, arg_text = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in RULES:
        raise RuleError(f"unknown rule {name!r}; use one of {', '.join(_usage(n) for n in RULES)} (e.g. lenience:0.5)")
    cls = RULES[name]
    values: dict[str, float] = {}
    if arg_text.strip():
        pieces = [piece.strip() for piece in arg_text.split(",")]
        if len(pieces) != len(cls.param_names):
            raise RuleError(f"rule {name} takes {len(cls.param_names)} parameter(s): write {_usage(name)}")
        for key, piece in zip(cls.param_names, pieces):
            try:
                values[key] = float(piece)
            except ValueError:
                raise RuleError(f"rule {name}: {key}={piece!r} is not a number; write {_usage(name)}") from None
    unknown = set(params) - set(cls.param_names)
    if unknown:
        raise RuleError(f"rule {name} has no parameter {sorted(unknown)[0]!r}; write {_usage(name)}")
    values.update({key: float(value) for key, value in params.items()})
    missing = [key for key in cls.param_names if key not in values]
    if missing:
        raise RuleError(f"rule {name} needs {', '.join(missing)}: write {_usage(name)}, e.g. {_example(name)}")
    try:
        return cls(**values)
    except RuleError as error:
        _, separator, why = str(error).partition(" is out of range: ")
        if not (separator and arg_text.strip()):
            raise
        # Echo what was typed, not its float: "lenience:1e-400" rounds to 0.
        typed = ",".join(piece.strip() for piece in arg_text.split(","))
        rounded = [piece for piece in typed.split(",")
                   if float(piece) == 0 and any(digit in piece.lower().split("e")[0] for digit in "123456789")]
        note = f" ({rounded[0]} rounds to 0 in double precision)" if rounded else ""
        raise RuleError(f"{name}:{typed} is out of range: {why}{note}") from None


def _example(name: str) -> str:
    return next(spec for spec in EXAMPLE_SPECS if spec.split(":")[0] == name)
