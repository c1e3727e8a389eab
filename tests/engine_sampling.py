"""Many seeded generations on tiny models, batched, in worker processes, and the exact law they must follow.

Each worker generates its seeds as rows of batches of ``BATCH``, mixed with distractor rows of
other prompt lengths, rules, policies and budgets (``_distractor``), so that the end-to-end tests
check the batched engine, rows that share forwards with rows unlike them included.

Kept in a module of its own so spawned workers can import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing
import os
from dataclasses import dataclass, field

import torch
from devices import DEVICE

from diagnostics.audit.mutants import BATCH_MUTANTS, TREE_MUTANTS, StaleRollbackScorer
from diagnostics.engine.drafting import TargetScorer
from diagnostics.engine import CORRECT, generate_batch
from diagnostics.engine.head_drafting import PLANTED as HEAD_PLANTED
from diagnostics.gof import gof_tokens, power, required_samples
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
    planted: str | None = None  # "rollback": keep one stale token in the caches; or a TREE_MUTANTS or BATCH_MUTANTS name
    tree: tuple[int, ...] | str | None = None  # a tree shape K1,…,Kd (or sparse paths "[[0],[1],[0,0]]") instead of the chain
    children: str = "top"
    budget: int | None = None  # a budget tree of this many nodes (depth: gamma)
    draft_stop: float | None = None  # adaptive drafting: end a block after a draft x with q(x) below this
    distractors: bool = True  # mix rows of other prompts, rules and budgets into each batch

    @property
    def max_new_tokens(self) -> int:
        return self.start + 2


HEADS = ("eagle3", "medusa")  # drafts from a head that reads a 4-layer tiny Llama's hidden states


def models(setup: Setup):
    if setup.draft in HEADS:
        return _head_models(setup.draft, setup.vocab)
    target = tiny_lm(setup.vocab, seed=10, sharpness=0.8)
    draft = tiny_lm(setup.vocab, seed=11, sharpness=0.8) if setup.draft == "model" else setup.draft
    return target, draft


_HEADS: dict = {}


def _head_models(kind: str, vocab: int):
    """A 4-layer tiny Llama target and a random head written by ``make_head`` and read back by
    ``load_head`` (the on-disk path a user takes), built once per process."""
    if (kind, vocab) not in _HEADS:
        import tempfile

        from diagnostics.heads.layout import load_head, make_head
        from diagnostics.tiny import tiny_llama

        target = tiny_llama(10, vocab=vocab, layers=4, sharpness=0.8, device=DEVICE)
        with tempfile.TemporaryDirectory() as folder:
            make_head(kind, target, folder, seed=3, scale=0.5)
            _HEADS[(kind, vocab)] = (target, load_head(kind, folder, target))
    return _HEADS[(kind, vocab)]


# Planted bug: rollback off by one, so the first refused draft's keys and values stay cached.
stale_rollback = StaleRollbackScorer.rollback


@contextlib.contextmanager
def _plant(setup: Setup):
    """The rollback bug patched into this worker for one job only (the workers serve every test)."""
    correct = TargetScorer.rollback
    if setup.planted == "rollback":
        TargetScorer.rollback = stale_rollback
    try:
        yield
    finally:
        TargetScorer.rollback = correct


# Rows per forward. The batched program's cost per row falls with the batch (measured on 2 cores, one
# torch thread, model-drafted chain γ 3: 2,380 generations/s at 64 rows, 3,499 at 256, 6,147 at 1,024;
# tree 2,2,1: 898, 1,897, 2,159), and flattens past 1,024 (4,096 rows: within 15% of 1,024).
BATCH = 1024
DISTRACTOR_EVERY = 8  # after every eighth tested row, a row of another prompt length, rule, policy, seed and budget


def _distractor(setup: Setup, seed: int) -> tuple[list[int], str, Policy, int]:
    """A row that shares the batch but not the test: its prompt, rule, policy and budget differ, so a
    row that leaked into a tested row (its p, its cache) would move the tested law."""
    k = seed // DISTRACTOR_EVERY
    prompt = list(setup.prompt[: 3 + k % 4]) if k % 2 else list(setup.prompt) + [t % setup.vocab for t in [1, 2, 3][: 1 + k % 3]]
    if setup.tree is not None and setup.children != "top":
        rule = "lossless"  # sampled children are verified losslessly only
    else:
        rule = ("lenience:0.5", "lossless", "cascade:0.3" if setup.tree is None and setup.budget is None else "lossless")[k % 3]
    return prompt, rule, Policy(temperature=0.8, top_k=3 if k % 2 else None), setup.max_new_tokens + k % 2


def _windows(job: tuple[Setup, int, int]) -> list[int]:
    """The tested window of each seed's generation, generated in batches of ``BATCH`` rows mixed with
    distractor rows (``_distractor``)."""
    setup, first_seed, count = job
    torch.set_num_threads(1)
    with _plant(setup):
        return _tested_windows(setup, first_seed, count)


def _tested_windows(setup: Setup, first_seed: int, count: int) -> list[int]:
    target, draft = models(setup)
    policy = Policy(**setup.policy)
    seams = {**TREE_MUTANTS, **BATCH_MUTANTS}[setup.planted][1] if setup.planted in {**TREE_MUTANTS, **BATCH_MUTANTS} else CORRECT
    shape = {}
    if setup.tree is not None:
        shape = {"tree": setup.tree, "tree_children": setup.children}
    elif setup.budget is not None:
        shape = {"tree_budget": setup.budget, "tree_depth": setup.gamma}
    prompts, rules, seeds, policies, budgets, tested = [], [], [], [], [], []
    for seed in range(first_seed, first_seed + count):
        prompts.append(list(setup.prompt)), rules.append("lossless"), seeds.append(seed)
        policies.append(policy), budgets.append(setup.max_new_tokens), tested.append(True)
        if setup.distractors and seed % DISTRACTOR_EVERY == 0:
            prompt, rule, other, budget = _distractor(setup, seed)
            prompts.append(prompt), rules.append(rule), seeds.append(10**6 + seed)
            policies.append(other), budgets.append(budget), tested.append(False)
    if setup.planted in HEAD_PLANTED:
        draft = dataclasses.replace(draft, planted=setup.planted)
    runs = generate_batch(target, draft, prompts, rules, seeds, gamma=setup.gamma, max_new_tokens=budgets, policies=policies,
                          eos_token_id=[], record=False, seams=seams, draft_stop=setup.draft_stop, batch_size=BATCH, **shape)
    cells = []
    for run, is_tested in zip(runs, tested):
        if is_tested:
            window = run.tokens[setup.start : setup.start + 2]
            cells.append(window[0] * setup.vocab + window[1])
    return cells


_POOL: list = []  # one pool of spawned workers for the whole test session (they import torch once)


def _pool():
    if not _POOL:
        import atexit

        workers = max(1, min(4, os.cpu_count() or 1))
        pool = multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=None)
        atexit.register(pool.terminate)
        _POOL.append((pool, workers))
    return _POOL[0]


def sample_windows(setup: Setup, n: int, first_seed: int = 0) -> torch.Tensor:
    """Cell index ``y_s·V + y_{s+1}`` of ``n`` generations with seeds ``first_seed …``, over the CPU cores."""
    pool, workers = _pool()
    chunk = -(-n // workers)
    jobs = [(setup, first_seed + i * chunk, min(chunk, n - i * chunk)) for i in range(workers)]
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


# The end-to-end tests' sizing: a window of two tokens over V tokens has V² − 1 degrees of freedom; the
# number of generations is the smallest that rejects a TV error of 0.01 at LEVEL with probability POWER.
LEVEL = 1e-3
POWER = 0.95
THREE = (1, 2, 0, 1, 2, 0, 1, 2)  # a prompt over 3 tokens (the heads' vocabulary)


def samples_for(setup: Setup, tv: float = 0.01) -> int:
    """Generations that catch a TV of ``tv`` with probability ``POWER`` in the setup's window (dof ``V² − 1``)."""
    return required_samples(tv, dof=setup.vocab**2 - 1, level=LEVEL, target_power=POWER)


def assert_lossless(label: str, setup: Setup) -> None:
    """``samples_for(setup)`` seeded generations follow the exact window law (chi-square at ``LEVEL``)."""
    result = gof_tokens(sample_windows(setup, samples_for(setup), first_seed=0), exact_window_law(setup))
    assert result.impossible == 0, f"{label}: emitted a window the target forbids"
    assert result.p_value >= LEVEL, f"{label}: X²={result.statistic:.1f}, dof={result.dof}, p={result.p_value:.2e}"


def assert_caught(label: str, setup: Setup) -> None:
    """A planted bug's generations fail the same test. Its effect is large, so a tenth of the samples
    that catch a TV of 0.01 already rejects it."""
    result = gof_tokens(sample_windows(setup, samples_for(setup) // 10, first_seed=0), exact_window_law(setup))
    assert result.p_value < LEVEL, f"{label} passed: X²={result.statistic:.1f}, p={result.p_value:.2e}"


def assert_sizes_catch_one_percent(setups: dict[str, Setup]) -> None:
    """Every setup's sample size has the stated power against a TV of 0.01."""
    for setup in setups.values():
        assert power(samples_for(setup), 0.01, setup.vocab**2 - 1, LEVEL) >= POWER
