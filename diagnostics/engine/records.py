"""What a run leaves behind: one record per emitted position, per drafted tree node, per tree round,
and the ``Run`` that holds them with its counters. Plain dataclasses: the engine fills them, the
store, pages and audits read them; nothing here touches a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from diagnostics.policy import Policy
from diagnostics.engine.tree_draft import TreeSpec


@dataclass
class PositionRecord:
    """Everything a diagnosis needs about one emitted position.

    ``kind`` is ``accepted`` (the draft token was kept), ``rejected`` (the draft was refused and
    ``token`` is the fallback draw) or ``bonus`` (drawn from ``b(p)`` after a full block; every
    position of plain decoding). ``p_draft``, ``q_draft``, ``accept_prob`` are ``p(x)``,
    ``q(x)``, ``a(x)`` of the drafted ``x``; the scalars are exact, over the full vocabulary,
    for the law ``P`` this position's token was drawn from (``induced`` when a draft was
    verified, the bonus law otherwise).
    """

    position: int
    block: int
    index_in_block: int
    kind: str
    token: int
    draft_token: int | None
    p_token: float
    p_draft: float | None
    q_draft: float | None
    accept_prob: float | None
    u_draft: float | None
    u_accept: float | None
    u_fallback: float | None
    alpha: float | None = None
    tv_pq: float | None = None
    entropy_p: float | None = None
    entropy_q: float | None = None
    overshoot: float | None = None
    severe_overshoot: float | None = None
    allowed_size: int | None = None
    allowed_mass: float | None = None
    tv_target: float | None = None
    tv_baseline: float | None = None
    kl_target: float | None = None
    p_top_ids: list[int] = field(default_factory=list)
    p_top_probs: list[float] = field(default_factory=list)
    p_tail: float | None = None
    q_top_ids: list[int] = field(default_factory=list)
    q_top_probs: list[float] = field(default_factory=list)
    q_tail: float | None = None
    token_text: str | None = None
    draft_text: str | None = None
    tree_node: int | None = None  # tree runs: the node (−1 the root) whose children decided this position

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Run:
    """The result of ``generate``: emitted tokens, per-position records and counters."""

    tokens: list[int]
    records: list[PositionRecord]
    prompt_ids: list[int]
    rule: str
    draft: str | None
    gamma: int
    seed: int
    policy: Policy
    draft_policy: Policy
    blocks: int = 0
    drafted: int = 0
    accepted: int = 0
    time_s: float = 0.0
    status: str = "complete"
    stop_reason: str = "length"
    text: str | None = None
    tree: TreeSpec | None = None
    verified: int = 0  # tree runs: positions decided at a node with children
    nodes: list[Any] = field(default_factory=list)  # tree runs: a NodeRecord (below) per drafted node
    rounds: list[Any] = field(default_factory=list)  # tree runs: a RoundRecord (below) per round
    device: str | None = None  # where it ran: "cuda:0 bfloat16" (``models.device_label``)

    @property
    def acceptance_rate(self) -> float | None:
        """Chain: accepted drafts / drafted tokens. Tree: accepted positions / positions decided at a
        node with children (a tree drafts many nodes per position, so per node would mislead)."""
        if self.tree is not None:
            return self.accepted / self.verified if self.verified else None
        return self.accepted / self.drafted if self.drafted else None

    @property
    def block_efficiency(self) -> float | None:
        """Emitted tokens per target forward pass (plain decoding: 1.0)."""
        return len(self.tokens) / self.blocks if self.blocks else None

    @property
    def tokens_per_second(self) -> float | None:
        return len(self.tokens) / self.time_s if self.time_s > 0 else None

    def mean(self, name: str) -> float | None:
        values = [getattr(record, name) for record in self.records if getattr(record, name) is not None]
        return sum(values) / len(values) if values else None

    def summary(self) -> dict[str, Any]:
        """The numbers a user reads first, with the metric definitions implied by their names."""
        return {
            "tokens": len(self.tokens),
            "status": self.status,
            "stop_reason": self.stop_reason,
            "acceptance_rate": self.acceptance_rate,
            "block_efficiency": self.block_efficiency,
            "tokens_per_s": self.tokens_per_second,
            "mean_tv_target": self.mean("tv_target"),
            "mean_tv_baseline": self.mean("tv_baseline"),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "target_passes": self.blocks,
            "time_s": self.time_s,
        }


@dataclass
class NodeRecord:
    """One drafted node of one round. ``p_token``: the target's ``p`` of the token at its parent;
    ``residual``: ``r_j`` of the token when its turn came (or would come); ``accept_prob``: ``a_j``;
    ``decision``: ``accepted``, ``refused`` or ``untried``; ``reach``: the exact probability that
    the walk accepts this node."""

    block: int
    node: int
    parent: int
    depth: int
    sibling: int
    token: int
    q_token: float | None
    u_draft: float | None
    p_token: float
    residual: float | None
    accept_prob: float | None
    u_accept: float | None
    decision: str
    reach: float
    token_text: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RoundRecord:
    """One round: its first output position, the tree's size and depth, the exact expected number
    of emitted tokens given the drafted tree, and how many were emitted and accepted."""

    block: int
    position: int
    nodes: int
    depth: int
    expected_tokens: float
    emitted: int
    accepted: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The fields that describe a drafted token; a bonus position had none.
DRAFT_FIELDS = ("draft_token", "p_draft", "q_draft", "accept_prob", "u_draft", "u_accept", "alpha", "tv_pq",
                "entropy_q", "overshoot", "severe_overshoot", "q_top_ids", "q_top_probs", "q_tail")
_INTEGERS = ("draft_token", "allowed_size")
_ID_LISTS = ("p_top_ids", "q_top_ids")
_PROB_LISTS = ("p_top_probs", "q_top_probs")


def position_record(kind: str, position: int, block: int, index: int, token: int, values: Mapping[str, Any],
                    text: Callable[[int], str | None], tree_node: int | None = None) -> PositionRecord:
    """The record of one emitted position: the one builder every program uses (the reference chain and tree
    from their tensors, the tensor core from its host buffer), so the four cannot drift apart.

    ``values``: ``PositionRecord`` fields by name, as numbers of any kind; a field absent or ``None`` stays
    ``None``. Made uniform here: Python ``int``/``float``; a ``NaN`` draft uniform (a top-``k`` choice is not
    drawn) is ``None``; a ``bonus`` keeps no draft field; ``u_fallback`` only where a fallback or bonus draw
    used it (``rejected``, ``bonus``); ``token_text`` and ``draft_text`` decoded by ``text``."""
    fields: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or (kind == "bonus" and name in DRAFT_FIELDS):
            continue
        if name in _ID_LISTS:
            value = [int(v) for v in value]
        elif name in _PROB_LISTS:
            value = [float(v) for v in value]
        elif name in _INTEGERS:
            value = int(value)
        else:
            value = float(value)
            if name == "u_draft" and value != value:
                continue
        fields[name] = value
    if kind == "accepted":
        fields.pop("u_fallback", None)
    draft_token = fields.get("draft_token")
    return PositionRecord(
        position=position, block=block, index_in_block=index, kind=kind, token=int(token),
        draft_token=draft_token, p_token=fields.pop("p_token"), p_draft=fields.pop("p_draft", None),
        q_draft=fields.pop("q_draft", None), accept_prob=fields.pop("accept_prob", None),
        u_draft=fields.pop("u_draft", None), u_accept=fields.pop("u_accept", None),
        u_fallback=fields.pop("u_fallback", None), token_text=text(int(token)),
        draft_text=None if draft_token is None else text(draft_token), tree_node=tree_node,
        **{name: value for name, value in fields.items() if name != "draft_token"},
    )


def top_entries(law: torch.Tensor, k: int) -> tuple[list[int], list[float], float]:
    k = min(k, law.shape[-1])
    values, ids = torch.topk(law, k)
    return ids.tolist(), values.tolist(), max(0.0, 1.0 - float(values.sum()))


def decode_one(tokenizer: Any, token: int | None) -> str | None:
    if tokenizer is None or token is None:
        return None
    return tokenizer.decode([token])


def rounds(run: Run, max_new_tokens: int, should_stop: Callable[[], bool] | None) -> Iterator[tuple[int, int]]:
    """``(first output position, remaining token budget)`` of each block or round until the budget
    is spent; when ``should_stop`` says so (polled between rounds) the run ends ``interrupted``."""
    while len(run.tokens) < max_new_tokens:
        if should_stop is not None and should_stop():
            run.status, run.stop_reason = "interrupted", "stopped"
            return
        yield len(run.tokens), max_new_tokens - len(run.tokens)


def finish(run: Run, start: float, tokenizer: Any) -> Run:
    """Stamp the wall time since ``start`` and decode the text (ids keep the EOS; the text does not)."""
    run.time_s = time.perf_counter() - start
    if tokenizer is not None:
        run.text = tokenizer.decode(run.tokens, skip_special_tokens=True)
    return run


