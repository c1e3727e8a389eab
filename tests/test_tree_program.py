"""A tree round as one tensor program (``diagnostics.engine.tree_program``) against the per-row tree programs.

* End to end on float64 tiny models (the direct Llama forward with an early-exit draft, a module
  forward with a separate draft module): fixed shapes, sparse choices, every children mode, every
  tree rule, mixed policies, prompts and budgets, EOS, continuous batching: the same tokens, counters,
  position records, node records and round records as ``reference.tree.tree_row`` (scalars within 1e-12).
* The children of a node (``tree_verify.top_children``) follow the per-row drafter's order at ties.
* Growth: a tree batch of 32 rows costs at most 1.5× the dispatched ops and host reads of 4 rows (the
  per-row programs, the negative control, grow 4× or more).
* Every planted tree and batch bug still plants in the program.
"""

from __future__ import annotations

import pytest
import torch

from devices import DEVICE
from diagnostics.engine import generate_batch
from diagnostics.engine.tree_draft import _top_children
from diagnostics.engine.tree_program import TreeProgram
from diagnostics.engine.tree_verify import top_children
from diagnostics.models import early_exit_model
from diagnostics.policy import Policy
from diagnostics.tiny import tiny_llama
from test_chain_program import EXACT, SCALARS, _Ops, _Reads
from tiny_models import tiny_lm

VOCAB = 12
NODE_EXACT = ("block", "node", "parent", "depth", "sibling", "token", "u_draft", "u_accept", "decision", "token_text")
NODE_SCALARS = ("q_token", "p_token", "residual", "accept_prob", "reach")
TREE_RULES = ["lossless", "lenience:0.5", "cascade:0.2", "typical:0.3"]


def _models():
    llama = tiny_llama(3, vocab=VOCAB, layers=4, sharpness=1.5, device=DEVICE, dtype=torch.float64)
    module = tiny_lm(VOCAB, seed=1, sharpness=1.5, dtype=torch.float64)
    return {"direct forward, early-exit draft": (llama, early_exit_model(llama, 2)),
            "module forward, draft module": (module, tiny_lm(VOCAB, seed=2, sharpness=1.5, dtype=torch.float64)),
            "direct forward, n-gram trie": (llama, "ngram:2")}


MODELS = _models()
SHAPES = {"2,1 top": ("2,1", "top"), "3,2,1 top": ("3,2,1", "top"), "2,2 sample": ("2,2", "sample"),
          "3,2 sample-distinct": ("3,2", "sample-distinct"), "sparse top": ("[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]", "top"),
          "budget 5, depth 3": ((5, 3), "top"), "budget 3, depth 4": ((3, 4), "top")}


def _close(a, b, worst: float) -> float:
    assert (a is None) == (b is None)
    return worst if a is None else max(worst, abs(a - b))


def _same_tree_runs(tensor_runs, row_runs) -> float:
    worst = 0.0
    for ours, oracle in zip(tensor_runs, row_runs):
        assert ours.tokens == oracle.tokens
        for name in ("blocks", "drafted", "accepted", "verified", "status", "stop_reason", "rule", "draft", "gamma", "seed",
                     "tree", "device"):
            assert getattr(ours, name) == getattr(oracle, name), name
        assert len(ours.records) == len(oracle.records) and len(ours.nodes) == len(oracle.nodes)
        for left, right in zip(ours.records, oracle.records):
            for name in EXACT:
                assert getattr(left, name) == getattr(right, name), name
            for name in SCALARS:
                worst = _close(getattr(left, name), getattr(right, name), worst)
            for a, b in zip(left.p_top_probs + left.q_top_probs, right.p_top_probs + right.q_top_probs):
                worst = max(worst, abs(a - b))
        for left, right in zip(ours.nodes, oracle.nodes):
            for name in NODE_EXACT:
                assert getattr(left, name) == getattr(right, name), name
            for name in NODE_SCALARS:
                worst = _close(getattr(left, name), getattr(right, name), worst)
        assert [(r.block, r.position, r.nodes, r.depth, r.emitted, r.accepted) for r in ours.rounds] == \
               [(r.block, r.position, r.nodes, r.depth, r.emitted, r.accepted) for r in oracle.rounds]
        for left, right in zip(ours.rounds, oracle.rounds):
            worst = max(worst, abs(left.expected_tokens - right.expected_tokens))
    return worst


# A prompt-lookup trie has only deterministic children (check_tree_settings refuses sampled ones).
CASES = [(setup, shape) for setup in MODELS for shape in SHAPES if "n-gram" not in setup or SHAPES[shape][1] == "top"]


@pytest.mark.parametrize(("setup", "shape"), CASES)
def test_the_tree_program_gives_what_the_per_row_trees_give(setup: str, shape: str, monkeypatch) -> None:
    target, draft = MODELS[setup]
    rounds = []  # the tensor side really runs the program
    original = TreeProgram.round
    monkeypatch.setattr(TreeProgram, "round", lambda self, rows: (rounds.append(len(rows)), original(self, rows))[1])
    tree, mode = SHAPES[shape]
    shape_kwargs = dict(tree_budget=tree[0], tree_depth=tree[1]) if isinstance(tree, tuple) else dict(tree=tree, tree_children=mode)
    prompts = [[1, 2, 3, 4, 1, 2, 3], [5, 6], [7], [2, 2, 2, 2], [9, 8, 7, 9, 8]] * 2
    rules = TREE_RULES if mode == "top" else ["lossless"]
    kwargs = dict(**shape_kwargs, max_new_tokens=[3 + index % 8 for index in range(len(prompts))],
                  policies=[Policy(temperature=0.9, top_k=5) if index % 3 == 0 else Policy() for index in range(len(prompts))],
                  eos_token_id=[VOCAB - 1], batch_size=4, top_k_record=4)
    row_rules = [rules[index % len(rules)] for index in range(len(prompts))]
    seeds = list(range(len(prompts)))
    tensor_runs = generate_batch(target, draft, prompts, row_rules, seeds, core="tensor", **kwargs)
    assert rounds and max(rounds) > 1
    count = len(rounds)
    row_runs = generate_batch(target, draft, prompts, row_rules, seeds, core="reference", **kwargs)
    assert len(rounds) == count
    assert any(run.stop_reason == "eos" for run in row_runs) and any(run.stop_reason == "length" for run in row_runs)
    if isinstance(tree, tuple):  # the budget binds: some round drafted more nodes than it kept
        assert any(len({node.depth for node in run.nodes}) > 1 for run in row_runs)
    assert any(node.decision == "refused" for run in row_runs for node in run.nodes)
    assert _same_tree_runs(tensor_runs, row_runs) <= 1e-12


def test_children_follow_the_per_row_order_at_ties() -> None:
    generator = torch.Generator().manual_seed(3)
    laws = torch.randint(0, 4, (64, 30), generator=generator).to(torch.float64)  # many equal values, some zeros
    laws[:8] = 0.0
    laws[:8, :3] = 1.0  # fewer positive tokens than children asked for
    laws = laws / laws.sum(-1, keepdim=True).clamp(min=1.0)
    for k in (1, 3, 5):
        ids, positive = top_children(laws.to(DEVICE), k)
        for row in range(laws.shape[0]):
            expected = _top_children(laws[row], k)
            assert ids[row, : int(positive[row])].tolist() == expected


def _counts(target, draft, rows: int, core: str) -> tuple[int, int]:
    ops, reads = _Ops(), _Reads()
    with reads, ops:
        generate_batch(target, draft, [[1, 2, 3, 4]] * rows, "lossless", [0] * rows, max_new_tokens=8, eos_token_id=[],
                       batch_size=rows, tree="2,1", core=core)
    return ops.count, reads.count


def test_tree_work_per_round_does_not_grow_with_rows() -> None:
    target = tiny_llama(3, vocab=VOCAB, layers=4, device=DEVICE)
    draft = early_exit_model(target, 2)
    ops4, reads4 = _counts(target, draft, 4, "tensor")
    ops32, reads32 = _counts(target, draft, 32, "tensor")
    assert ops32 <= 1.5 * ops4 and reads32 <= 1.5 * reads4, (ops4, ops32, reads4, reads32)
    row_ops4, row_reads4 = _counts(target, draft, 4, "reference")
    row_ops32, row_reads32 = _counts(target, draft, 32, "reference")
    assert row_ops32 > 3 * row_ops4 and row_reads32 > 3 * row_reads4


def test_every_planted_tree_and_batch_bug_plants_in_the_tree_program() -> None:
    from diagnostics.audit.mutants import BATCH_MUTANTS, TREE_MUTANTS

    target = tiny_lm(VOCAB, seed=1, sharpness=1.5, dtype=torch.float64)
    draft = tiny_lm(VOCAB, seed=2, sharpness=1.5, dtype=torch.float64)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 1, 2], [3, 3]] * 4
    for name, (_, seams) in {**TREE_MUTANTS, **BATCH_MUTANTS}.items():
        kwargs = dict(tree="3,2", max_new_tokens=10, eos_token_id=[], record=False, core="tensor")
        correct = generate_batch(target, draft, prompts, "lossless", list(range(len(prompts))), **kwargs)
        planted = generate_batch(target, draft, prompts, "lossless", list(range(len(prompts))), seams=seams, **kwargs)
        assert any(a.tokens != b.tokens for a, b in zip(correct, planted)), name


def test_an_interrupted_tree_row_is_kept_and_marked() -> None:
    target, draft = MODELS["direct forward, early-exit draft"]
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    runs = generate_batch(target, draft, [[1, 2, 3]] * 2, "lossless", [0, 1], tree="2,1", max_new_tokens=30,
                          eos_token_id=[], should_stop=[stop, None], core="tensor")
    assert runs[0].status == "interrupted" and runs[0].stop_reason == "stopped" and 0 < len(runs[0].tokens) < 30
    assert runs[1].status == "complete" and len(runs[1].tokens) == 30
    for run in runs:
        assert len(run.records) == len(run.tokens) and len(run.rounds) == run.blocks
