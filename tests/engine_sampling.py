"""Many seeded generations on tiny models, in worker processes, and the exact law they must follow.

Kept in a module of its own so spawned workers can import it.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from dataclasses import dataclass, field

import torch

from diagnostics.audit.mutants import TREE_MUTANTS, StaleRollbackScorer
from diagnostics.engine.drafting import TargetScorer
from diagnostics.engine import CORRECT, generate
from diagnostics.policy import Policy, probabilities
from tiny_models import tiny_lm


@dataclass(frozen=True)
class Setup:
    """One end-to-end configuration: which drafter, γ, policy, and which window of tokens to test."""

    draft: str  # "model" or an n-gram spec such as "ngram:2"
    gamma: int
    policy: dict = field(default_factory=dict)
    start: int = 0  # the window is tokens[start : start + 2]
    vocab: int = 4
    prompt: tuple[int, ...] = (1, 2, 3, 1, 2, 3, 1, 2)
    planted: str | None = None  # "rollback": keep one stale token in the caches; or a TREE_MUTANTS name
    tree: tuple[int, ...] | None = None  # a tree shape K1,…,Kd instead of the chain of gamma
    children: str = "top"
    budget: int | None = None  # a budget tree of this many nodes (depth: gamma)
    draft_stop: float | None = None  # adaptive drafting: end a block after a draft x with q(x) below this

    @property
    def max_new_tokens(self) -> int:
        return self.start + 2


def models(setup: Setup):
    target = tiny_lm(setup.vocab, seed=10, sharpness=0.8)
    draft = tiny_lm(setup.vocab, seed=11, sharpness=0.8) if setup.draft == "model" else setup.draft
    return target, draft


# Planted bug: rollback off by one, so the first refused draft's keys and values stay cached.
stale_rollback = StaleRollbackScorer.rollback


def _plant(setup: Setup) -> None:
    if setup.planted == "rollback":
        TargetScorer.rollback = stale_rollback


def _windows(job: tuple[Setup, int, int]) -> list[int]:
    setup, first_seed, count = job
    torch.set_num_threads(1)
    _plant(setup)
    target, draft = models(setup)
    policy = Policy(**setup.policy)
    cells = []
    seams = TREE_MUTANTS[setup.planted][1] if setup.planted in TREE_MUTANTS else CORRECT
    shape = {}
    if setup.tree is not None:
        shape = {"tree": setup.tree, "tree_children": setup.children}
    elif setup.budget is not None:
        shape = {"tree_budget": setup.budget, "tree_depth": setup.gamma}
    for seed in range(first_seed, first_seed + count):
        run = generate(
            target, draft, list(setup.prompt), gamma=setup.gamma, max_new_tokens=setup.max_new_tokens, seed=seed,
            temperature=policy.temperature, top_k=policy.top_k, top_p=policy.top_p, min_p=policy.min_p, eta=policy.eta,
            eos_token_id=[], record=False, seams=seams, draft_stop=setup.draft_stop, **shape,
        )
        window = run.tokens[setup.start : setup.start + 2]
        cells.append(window[0] * setup.vocab + window[1])
    return cells


def sample_windows(setup: Setup, n: int, first_seed: int = 0) -> torch.Tensor:
    """Cell index ``y_s·V + y_{s+1}`` of ``n`` generations with seeds ``first_seed …``, over the CPU cores."""
    workers = max(1, min(4, os.cpu_count() or 1))
    chunk = -(-n // workers)
    jobs = [(setup, first_seed + i * chunk, min(chunk, n - i * chunk)) for i in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        parts = pool.map(_windows, jobs)
    return torch.tensor(list(itertools.chain.from_iterable(parts)), dtype=torch.long)


@torch.inference_mode()
def exact_window_law(setup: Setup) -> torch.Tensor:
    """Exact law of ``(y_s, y_{s+1})`` by teacher forcing: plain cache-free forwards on every prefix.

    ``P(y_1 … y_T) = Π_t p_t(y_t | prompt, y_<t)`` with ``p_t`` the policy-applied target law;
    the window's law sums the joint over the tokens before it.
    """
    target, _ = models(setup)
    policy = Policy(**setup.policy)
    vocab = setup.vocab
    law = torch.zeros(vocab * vocab, dtype=torch.float64)
    frontier = [((), 1.0)]
    for _ in range(setup.max_new_tokens):
        grown = []
        for prefix, mass in frontier:
            ids = torch.tensor([list(setup.prompt) + list(prefix)])
            p_target = probabilities(target.model(input_ids=ids, past_key_values=None, use_cache=False).logits[0, -1], policy)
            grown.extend((prefix + (token,), mass * float(p_target[token])) for token in range(vocab) if p_target[token] > 0)
        frontier = grown
    for sequence, mass in frontier:
        law[sequence[setup.start] * vocab + sequence[setup.start + 1]] += mass
    return law
