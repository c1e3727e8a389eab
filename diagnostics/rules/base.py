"""The rule contract and the law helpers every rule is built from: accept probability, fallback, bonus, exact law.

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

from diagnostics.rng import sample_inverse_cdf


class RuleError(ValueError):
    """A rule spec that cannot be built; the message says what to write instead."""


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

    @property
    def ceiling_factor(self) -> float | None:
        """``l`` of an acceptance ceiling ``p/l`` (``a = min(1, p/(l·q))``: lenience's ``l``, mentored's
        ``α``), for the draft mass at or above it (``metrics.severe_overshoot_mass``); ``None`` without one."""
        return None

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Per-position acceptance probability ``α = Σ_v q(v)·a(v)``."""
        p_target, q_draft = as_laws(p, q)
        return (q_draft * self.accept_prob(p_target, q_draft)).sum(-1)

    def tree_accept(self, p_node: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        """Acceptance of a deterministic candidate at a tree node with current law ``p_j``."""
        raise RuleError(f"rule {self.spec!r} has no tree form; tree rules: {', '.join(tree_capable_names())}")

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


def tree_capable_names(cls: type[Rule] = Rule) -> list[str]:
    """The names of the rules with a tree form, in the order they are defined (``specs.TREE_RULES``)."""
    names = [cls.name] if cls.name and cls.tree_capable else []
    for subclass in cls.__subclasses__():
        names += [name for name in tree_capable_names(subclass) if name not in names]
    return names


def check_range(
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
