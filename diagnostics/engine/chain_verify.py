"""One chain round's verification for a group of rows sharing a rule, as tensors, with no host read.

Row ``b`` of a group (one rule, one target and draft policy) drafted ``D[b, :γ]`` from ``Q[b]``; the
target's laws are ``P[b, :γ + 1]``; ``U[b, j, s]`` are its uniforms (``s``: draft, accept, fallback);
``limit[b] ≤ γ`` drafts count (the token budget, the first EOS draft, adaptive drafting's stop) and
``budget[b]`` tokens may still be emitted. Then, as in ``reference.chain._verify_block`` one position at a time:

* ``a_j = a(P_j, Q_j)[D_j]``; draft ``j`` is accepted iff ``U[j, accept] < a_j`` and ``j < limit``;
* the accepted length is ``n = Σ_j Π_{i ≤ j} accepted_i`` (a cumulative product: the accepted prefix);
* one emission law per row: the fallback ``f(P_n, Q_n)`` where ``n < limit``, else the bonus
  ``b(P_limit)`` (emitted when ``limit < budget`` and the last counted draft is not EOS);
* one inverse-CDF draw with ``U[n, fallback]``.

The record columns (every stored scalar and the top-k of ``p`` and ``q``) are computed for every
slot and packed with the decisions into one float64 buffer ``[G, width]`` (``Columns``): the round
program copies all groups' buffers to the host at once. The exact per-row program is
``reference.chain._verify_block``; ``tests/test_chain_program.py`` checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

import torch

from diagnostics.metrics import entropy, kl_divergence, overshoot_mass, severe_overshoot_mass, total_variation
from diagnostics.rng import SLOTS
from diagnostics.rules import Rule

DRAFT, ACCEPT, FALLBACK = SLOTS["draft"], SLOTS["accept"], SLOTS["fallback"]

# Scalars of a verified slot (j < γ) and of every slot (j ≤ γ), in buffer order.
VERIFIED = ("p_draft", "q_draft", "accept_prob", "alpha", "tv_pq", "entropy_q", "overshoot", "severe_overshoot",
            "allowed_size", "allowed_mass", "q_tail")
EVERY_SLOT = ("p_token", "entropy_p", "tv_target", "tv_baseline", "kl_target", "p_tail")


class Header(NamedTuple):
    """A row's decisions, the head of its buffer (in this order): ``accepted`` drafts ``n``, the drafts that
    counted (``limit``), whether a token was emitted after them (``emit``), that ``token``, then the
    ``drafts`` themselves."""

    accepted: int
    limit: int
    emit: bool
    token: int
    drafts: list[int]


@dataclass(frozen=True)
class Columns:
    """Where each value of a row sits in the packed buffer of a round with ``gamma`` drafts and ``top_k``
    recorded entries: decisions first (``n``, ``limit``, ``emit``, ``token``, the drafts), then, when
    recording, the scalars and top-k of every slot."""

    gamma: int
    top_k: int
    record: bool

    @property
    def decisions(self) -> int:
        return len(Header._fields) - 1 + self.gamma

    def header(self, values: np.ndarray) -> Header:
        """A row's ``Header`` read from its host buffer."""
        accepted, limit, emit, token = (int(value) for value in values[:4])
        return Header(accepted, limit, bool(emit), token, [int(value) for value in values[4 : 4 + self.gamma]])

    def verified(self, name: str) -> slice:
        start = self.decisions + VERIFIED.index(name) * self.gamma
        return slice(start, start + self.gamma)

    def every(self, name: str) -> slice:
        start = self.decisions + len(VERIFIED) * self.gamma + EVERY_SLOT.index(name) * (self.gamma + 1)
        return slice(start, start + self.gamma + 1)

    @property
    def tops(self) -> int:
        return self.decisions + len(VERIFIED) * self.gamma + len(EVERY_SLOT) * (self.gamma + 1)

    def p_top(self, slot: int) -> tuple[slice, slice]:
        """``(ids, probs)`` of ``p``'s top-k at ``slot``."""
        start = self.tops + 2 * slot * self.top_k
        return slice(start, start + self.top_k), slice(start + self.top_k, start + 2 * self.top_k)

    def q_top(self, slot: int) -> tuple[slice, slice]:
        start = self.tops + 2 * (self.gamma + 1) * self.top_k + 2 * slot * self.top_k
        return slice(start, start + self.top_k), slice(start + self.top_k, start + 2 * self.top_k)

    @property
    def width(self) -> int:
        if not self.record:
            return self.decisions
        return self.tops + 2 * (2 * self.gamma + 1) * self.top_k


# On a CPU the V-wide rule and record maths are bound by memory traffic: a group's [G, γ+1, V] float64
# laws (63 MB at 32 rows, γ 4 and the embedded model's 49,152 tokens) leave the caches at every
# elementwise op. Verified in chunks of rows of about this many elements (4 MB), the same maths is 5-7x
# faster there (measured, 2 cores). An accelerator runs each group in one piece.
CPU_CHUNK_ELEMENTS = 1 << 19


def row_chunks(lo: int, hi: int, per_row: int, device: torch.device) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into consecutive ``[a, b)`` chunks of rows with about ``CPU_CHUNK_ELEMENTS``
    elements of ``per_row`` each on a CPU (at least one row per chunk); one chunk elsewhere."""
    if torch.device(device).type != "cpu":
        return [(lo, hi)]
    size = max(1, CPU_CHUNK_ELEMENTS // max(1, per_row))
    return [(start, min(hi, start + size)) for start in range(lo, hi, size)]


def at_index(laws: torch.Tensor, index: int | torch.Tensor) -> torch.Tensor:
    """Row ``index`` of ``laws`` ``[…, n, V]``: ``laws[…, index, :]`` for an int, or per leading row for an
    index tensor ``[G]`` (``laws`` ``[G, n, V]`` gives ``[G, V]``)."""
    if isinstance(index, int):
        return laws[..., index, :]
    return laws.gather(-2, index[:, None, None].expand(-1, 1, laws.shape[-1])).squeeze(-2)


def draw_rows(laws: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``laws`` ``[…, V]`` by inverse CDF with ``u`` ``[…]``: ``v`` with
    ``F(v−1) ≤ u·F(V−1) < F(v)``, bit for bit ``rng.sample_token`` row by row, without its validity
    check (a host read): the laws come from the rules, which return valid laws."""
    cdf = laws.to(torch.float64).cumsum(-1)
    tokens = torch.searchsorted(cdf, (u.to(torch.float64)[..., None] * cdf[..., -1:]).contiguous(), right=True)
    # Past the end only when u·total rounds onto the total: the last token with positive mass.
    last_positive = laws.shape[-1] - 1 - (laws > 0).flip(-1).to(torch.int64).argmax(-1, keepdim=True)
    return torch.minimum(tokens, last_positive).squeeze(-1)


def _top(laws: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-``k`` ids and probabilities of every row, and the tail ``max(0, 1 − Σ top)``."""
    values, ids = torch.topk(laws, k)
    return ids, values, (1.0 - values.sum(-1)).clamp(min=0.0)


def _distances(rule: Rule, emitted: torch.Tensor, p_laws: torch.Tensor) -> dict[str, torch.Tensor]:
    """``TV(e, p)``, ``TV(e, baseline(p))`` and ``KL(e ‖ p)`` of emitted laws ``e`` against ``p`` (same shape)."""
    tv_target = total_variation(emitted, p_laws)
    # The default baseline is ``p`` itself: the same distance, not computed twice over V.
    default = type(rule).baseline is Rule.baseline
    return {"tv_target": tv_target,
            "tv_baseline": tv_target if default else total_variation(emitted, rule.baseline(p_laws)),
            "kl_target": kl_divergence(emitted, p_laws)}


def verify_group(
    rule: Rule,
    p_laws: torch.Tensor,
    q_laws: torch.Tensor | None,
    drafts: torch.Tensor,
    u: torch.Tensor,
    limit: torch.Tensor,
    budget: torch.Tensor,
    eos: torch.Tensor,
    fallback_law,
    columns: Columns,
) -> torch.Tensor:
    """The packed buffer ``[G, columns.width]`` of one group's round (see the module docstring).

    ``p_laws`` ``[G, γ+1, V]``, ``q_laws`` ``[G, γ, V]`` (``None`` for plain decoding), ``drafts``
    ``[G, γ]``, ``u`` ``[G, γ+1, 3]``, ``limit`` and ``budget`` ``[G]`` long, ``eos`` ``[E]`` long;
    ``fallback_law(rule, p_laws, q_laws, index)`` is the engine seam (``EngineSeams.fallback_law``)."""
    rows, width, vocab = p_laws.shape
    gamma = width - 1
    device = p_laws.device
    slot = torch.arange(width, device=device)
    if gamma:
        accept_laws = rule.accept_prob(p_laws[:, :gamma], q_laws)
        a_drafted = accept_laws.gather(-1, drafts[..., None]).squeeze(-1)
        accepted = (u[:, :gamma, ACCEPT] < a_drafted) & (slot[None, :gamma] < limit[:, None])
        n = accepted.to(torch.int64).cumprod(-1).sum(-1)
        fallback = fallback_law(rule, p_laws, q_laws, n.clamp(max=gamma - 1))
        last_draft = drafts.gather(-1, (limit - 1).clamp(min=0)[:, None]).squeeze(-1)
        eos_last = (limit > 0) & torch.isin(last_draft, eos)
    else:
        n = torch.zeros(rows, dtype=torch.int64, device=device)
        eos_last = torch.zeros(rows, dtype=torch.bool, device=device)
    p_at_limit = at_index(p_laws, limit)
    bonus = rule.bonus(p_at_limit)
    rejected = n < limit
    emit = rejected | ((limit < budget) & ~eos_last)
    law = torch.where(rejected[:, None], fallback, bonus) if gamma else bonus
    token = draw_rows(law, u[:, :, FALLBACK].gather(-1, n[:, None]).squeeze(-1))
    # The row's ``Header``, in its order.
    parts = [torch.stack([n, limit, emit.to(torch.int64), token], dim=-1).to(torch.float64), drafts.to(torch.float64)]
    if not columns.record:
        return torch.cat(parts, dim=-1)
    # Every slot's token: the accepted drafts, then the emitted token at slot n.
    tokens = torch.cat([drafts, token[:, None]], dim=-1) if gamma else token[:, None]
    tokens = torch.where(slot[None, :] == n[:, None], token[:, None], tokens)
    # The law each slot's token was drawn from is the rule's induced law where a draft was verified and
    # the bonus law at ``limit``: its distances to p are computed for each once, then picked per slot
    # (slot γ only ever holds the bonus).
    distances = _distances(rule, bonus, p_at_limit)
    distances = {name: value[:, None].expand(rows, width) for name, value in distances.items()}
    verified: dict[str, torch.Tensor] = {}
    if gamma:
        p_verified = p_laws[:, :gamma]
        at_limit = slot[None, :] == limit[:, None]
        for name, value in _distances(rule, rule.induced(p_verified, q_laws), p_verified).items():
            distances[name] = torch.where(at_limit, distances[name], torch.nn.functional.pad(value, (0, 1)))
        lenience = rule.ceiling_factor
        allowed = rule.allowed_set(p_verified)
        zero = torch.zeros(rows, gamma, dtype=torch.float64, device=device)
        overshoot = overshoot_mass(p_verified, q_laws)
        verified = {
            "p_draft": p_verified.gather(-1, drafts[..., None]).squeeze(-1),
            "q_draft": q_laws.gather(-1, drafts[..., None]).squeeze(-1),
            "accept_prob": a_drafted,
            "alpha": (q_laws * accept_laws).sum(-1),
            "tv_pq": overshoot,  # Σ (q − p)+ = TV(p, q) for two laws: one pass over V, not two
            "entropy_q": entropy(q_laws),
            "overshoot": overshoot,
            "severe_overshoot": severe_overshoot_mass(p_verified, q_laws, float(lenience)) if lenience else zero,
            "allowed_size": allowed.sum(-1) if allowed is not None else zero,
            "allowed_mass": (p_verified * allowed).sum(-1) if allowed is not None else zero,
        }
    p_ids, p_probs, p_tail = _top(p_laws, columns.top_k)
    every = {
        "p_token": p_laws.gather(-1, tokens[..., None]).squeeze(-1),
        "entropy_p": entropy(p_laws),
        **distances,
        "p_tail": p_tail,
    }
    tops = [torch.stack([p_ids.to(torch.float64), p_probs.to(torch.float64)], dim=2).reshape(rows, -1)]
    if gamma:
        q_ids, q_probs, q_tail = _top(q_laws, columns.top_k)
        verified["q_tail"] = q_tail
        tops.append(torch.stack([q_ids.to(torch.float64), q_probs.to(torch.float64)], dim=2).reshape(rows, -1))
    parts += [verified[name].to(torch.float64) for name in VERIFIED if gamma]
    parts += [every[name].to(torch.float64) for name in EVERY_SLOT]
    return torch.cat(parts + tops, dim=-1)
