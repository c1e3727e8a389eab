"""The tree engine, checked exactly: against the chain, against teacher forcing, against its own
stored coins, and the closed forms of the expected tokens per round and of the lossy node laws.

The statistical end-to-end losslessness of the tree engine is in ``test_tree_lossless.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from devices import DEVICE

from diagnostics.engine import EngineError, generate
from diagnostics.gof import gof_tokens, power, required_samples
from diagnostics.models import early_exit_model
from diagnostics.policy import Policy, probabilities
from diagnostics.rng import sample_inverse_cdf
from diagnostics.rules import get_rule, get_tree_rule
from diagnostics.tiny import tiny_llama
from diagnostics.engine.tree_attention import TokenTree
from diagnostics.engine.tree_draft import DraftTree, TreeSpecError, parse_tree, spec_from_text
from diagnostics.engine.reference.tree_walk import all_node_steps, node_steps, walk

PROMPT = [1, 5, 2, 7, 1, 5, 2, 8]
VOCAB = 12


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=21, vocab=VOCAB, layers=3, sharpness=2.0, eos=VOCAB - 1, device=DEVICE)


@pytest.fixture(scope="module")
def draft(target):
    """The target's first two layers (a drafter that agrees with it often enough to accept paths)."""
    return early_exit_model(target, 2)


@torch.inference_mode()
def _teacher_forced(loaded, prefix: list[int], policy: Policy) -> torch.Tensor:
    logits = loaded.model(input_ids=torch.tensor([prefix]), use_cache=False).logits[0, -1].float()
    return probabilities(logits, policy)


SHAPES = {
    "top 3,2,1": {"tree": (3, 2, 1)},
    "sample 2,2,2": {"tree": (2, 2, 2), "tree_children": "sample"},
    "sample-distinct 3,2": {"tree": (3, 2), "tree_children": "sample-distinct"},
    "budget 10, depth 4": {"tree_budget": 10, "tree_depth": 4},
    "sparse top (medusa_choices)": {"tree": "[[0],[1],[0,0],[0,1],[1,0],[0,0,0],[2]]"},
    "sparse sample-distinct": {"tree": "[[0],[1],[0,0],[0,0,0],[0,0,1]]", "tree_children": "sample-distinct"},
}
SPARSE = "[[0],[1],[0,0],[0,1],[1,0],[0,0,0],[2]]"


def _round_paths(run, block: int) -> set[tuple[int, ...]]:
    """The child-number paths of one stored round's nodes (``sibling``: the node's number among its parent's children)."""
    paths: dict[int, tuple[int, ...]] = {-1: ()}
    for node in sorted((node for node in run.nodes if node.block == block), key=lambda node: node.node):
        paths[node.node] = paths[node.parent] + (node.sibling,)
    return {path for node, path in paths.items() if node >= 0}


def test_a_sparse_tree_drafts_exactly_its_listed_paths(target, draft) -> None:
    """``--tree '[[0],[1],[0,0],…]'`` (Medusa's ``medusa_choices``) drafts those nodes and no others:
    node ``[0, 1]`` is the second most likely child of the root's most likely child."""
    expected = {(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)}
    run = generate(target, draft, PROMPT, tree=SPARSE, max_new_tokens=16, seed=3, eos_token_id=[])
    assert run.rounds
    for round_ in run.rounds:
        paths = _round_paths(run, round_.block)
        budget_cut = {path for path in expected if len(path) <= max(len(p) for p in paths)}
        assert paths == budget_cut, round_.block
        nodes = {node.node: node for node in run.nodes if node.block == round_.block}
        for node in nodes.values():  # top children: siblings by decreasing q
            siblings = sorted((other for other in nodes.values() if other.parent == node.parent), key=lambda n: n.sibling)
            assert [n.q_token for n in siblings] == sorted((n.q_token for n in siblings), reverse=True)
    ngram = generate(target, "ngram:3", [1, 5, 2, 7, 1, 5, 2, 8, 1, 5, 3, 1, 5, 2], tree="[[0],[1],[0,0]]",
                     max_new_tokens=12, seed=1, eos_token_id=[])
    for round_ in ngram.rounds:
        assert _round_paths(ngram, round_.block) <= {(0,), (1,), (0, 0)}
    assert any(len(_round_paths(ngram, round_.block)) > 1 for round_ in ngram.rounds)


def test_a_chain_shaped_sampled_tree_is_the_chain(target, draft) -> None:
    """Tree 1,1,1 with sampled children uses the chain's uniforms slot for slot: same run."""
    for seed in range(4):
        chain = generate(target, draft, PROMPT, gamma=3, max_new_tokens=24, seed=seed)
        tree = generate(target, draft, PROMPT, tree=(1, 1, 1), tree_children="sample", max_new_tokens=24, seed=seed)
        assert tree.tokens == chain.tokens
        for left, right in zip(chain.records, tree.records):
            assert (left.kind, left.token, left.draft_token, left.u_accept, left.u_fallback) == (
                right.kind, right.token, right.draft_token, right.u_accept, right.u_fallback)
            assert right.p_token == pytest.approx(left.p_token, abs=1e-5)
            assert right.tv_target == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("label", list(SHAPES))
def test_every_recorded_law_equals_teacher_forcing(target, draft, label: str) -> None:
    """After each round both caches keep only the accepted path: every later ``p`` (target) and ``q``
    (draft) is the law a cache-free forward on the emitted prefix gives. A cache that kept a refused
    node, or lost an accepted one, would move these laws."""
    policy = Policy(temperature=0.9)
    run = generate(target, draft, PROMPT, max_new_tokens=30, seed=5, temperature=0.9, eos_token_id=[], **SHAPES[label])
    assert len(run.tokens) == 30 and run.blocks < 30
    assert any(round_.accepted >= 2 for round_ in run.rounds)
    for record in run.records:
        prefix = PROMPT + run.tokens[: record.position]
        p_exact = _teacher_forced(target, prefix, policy)
        assert record.p_token == pytest.approx(float(p_exact[record.token]), abs=1e-5), record.position
        if record.kind != "bonus":
            q_exact = _teacher_forced(draft, prefix, policy)
            assert record.q_top_probs[0] == pytest.approx(float(q_exact.max()), abs=1e-5)


def test_ngram_and_early_exit_trees_keep_exact_laws(target) -> None:
    policy = Policy()
    prompt = [1, 5, 2, 7, 1, 5, 2, 8, 1, 5, 3, 1, 5, 2]
    for drafter, shape in (("ngram:3", {"tree": (2, 2, 1)}), ("early-exit:2", {"tree": (3, 2, 1)})):
        run = generate(target, drafter, prompt, max_new_tokens=24, seed=1, eos_token_id=[], **shape)
        assert run.accepted > 0, drafter
        for record in run.records:
            p_exact = _teacher_forced(target, prompt + run.tokens[: record.position], policy)
            assert record.p_token == pytest.approx(float(p_exact[record.token]), abs=1e-5), (drafter, record.position)


def _draft_tree_of(run, block: int, vocab: int) -> tuple[DraftTree, list]:
    nodes = [node for node in run.nodes if node.block == block]
    tree = TokenTree(parents=tuple(node.parent for node in nodes), tokens=tuple(node.token for node in nodes))
    return DraftTree(tree=tree, q_laws=torch.zeros(len(nodes) + 1, vocab, dtype=torch.float64),
                     q_token=[1.0] * len(nodes), u_draft=[None] * len(nodes)), nodes


@pytest.mark.parametrize("rule", ["lossless", "lenience:0.5", "cascade:0.3", "typical:0.2"])
def test_decisions_replay_from_the_stored_coins(target, draft, rule: str) -> None:
    """From the stored nodes, coins and the teacher-forced ``p`` alone, each round's walk is
    recomputed and gives the same tokens: ``accept ⇔ u < a`` for every tried node, the fallback is
    the inverse-CDF draw of ``r_{K+1}`` at ``u_fallback``, the bonus that of ``p`` at the leaf."""
    run = generate(target, draft, PROMPT, rule=rule, tree=(3, 2, 1), max_new_tokens=30, seed=7, eos_token_id=[])
    verify = get_rule(rule)
    kinds = set()
    for round_ in run.rounds:
        tree, nodes = _draft_tree_of(run, round_.block, VOCAB)
        for node in nodes:
            if node.decision != "untried":
                assert (node.u_accept < node.accept_prob) == (node.decision == "accepted")
        prefix = PROMPT + run.tokens[: round_.position]
        positions = [record for record in run.records if record.block == round_.block]
        # p at the root and at every node on the accepted path, by teacher forcing.
        p_laws = torch.zeros(len(nodes) + 1, VOCAB, dtype=torch.float64)
        p_laws[0] = _teacher_forced(target, prefix, Policy())
        path_tokens = []
        for record in positions:
            if record.kind == "accepted":
                path_tokens.append(record.token)
                node = next(n for n in nodes if n.token == record.token and n.decision == "accepted" and n.depth == len(path_tokens))
                p_laws[node.node + 1] = _teacher_forced(target, prefix + path_tokens, Policy())
        steps = {}
        for node_index in [-1] + [n.node for n in nodes if n.decision == "accepted"]:
            children = [n.node for n in nodes if n.parent == node_index]
            if children:
                tokens = [tree.tree.tokens[child] for child in children]
                accept, residual, rest, law = node_steps(verify, p_laws[node_index + 1], tree.q_laws[0], tokens, False, False)
                steps[node_index] = type("S", (), {"children": children, "accept": accept, "rest": rest, "law": law})()
                for child, a_value in zip(children, accept):
                    assert nodes[child].accept_prob == pytest.approx(a_value, abs=1e-5)
        replayed = walk(verify, tree, p_laws, steps, run.seed, round_.position, set(), 30 - round_.position)
        assert replayed.tokens == [record.token for record in positions]
        kinds |= {record.kind for record in positions}
        for record in positions:
            if record.kind == "accepted":
                assert record.u_accept < record.accept_prob
            elif record.kind == "rejected":
                assert record.u_accept >= record.accept_prob
    assert {"accepted", "rejected", "bonus"} <= kinds


def test_expected_tokens_per_round(target, draft) -> None:
    """Lossless top-k tree: ``E = 1 + Σ_v Π p(path to v)`` from the stored nodes; over many rounds
    the mean emitted count agrees with the mean expectation (within 4 standard errors)."""
    emitted, expected = [], []
    for seed in range(12):
        run = generate(target, draft, PROMPT, tree=(3, 2, 1), max_new_tokens=40, seed=seed, eos_token_id=[])
        for round_ in run.rounds:
            nodes = {node.node: node for node in run.nodes if node.block == round_.block}
            product = {}
            for index, node in nodes.items():
                product[index] = node.p_token * (1.0 if node.parent < 0 else product[node.parent])
                assert node.reach == pytest.approx(product[index], abs=1e-9)
            if round_.depth < 40 - round_.position:  # a budget-limited last round has no bonus
                assert round_.expected_tokens == pytest.approx(1.0 + sum(product.values()), abs=1e-9)
                emitted.append(round_.emitted)
                expected.append(round_.expected_tokens)
    diff = torch.tensor(emitted, dtype=torch.float64) - torch.tensor(expected, dtype=torch.float64)
    assert abs(float(diff.mean())) < 4 * float(diff.std()) / math.sqrt(len(diff))
    assert len(diff) > 100


# Lossy tree rules: the walk's emitted law at a node equals TreeRule.induced.
LAW_VOCAB = 8
LAW_LEVEL = 1e-3
LAW_POWER = 0.95
LAW_N = required_samples(0.01, dof=LAW_VOCAB - 1, level=LAW_LEVEL, target_power=LAW_POWER)


def test_lossy_law_sample_size_catches_one_percent() -> None:
    assert power(LAW_N, 0.01, LAW_VOCAB - 1, LAW_LEVEL) >= LAW_POWER


@pytest.mark.parametrize("rule", ["lenience:0.5", "cascade:0.3", "typical:0.2", "lossless"])
def test_lossy_node_law_by_the_walk(rule: str) -> None:
    """``LAW_N`` walks of a fixed 3,1-shaped tree with the engine's coins (seeds 0 …): the law of the
    token emitted at the root equals ``get_tree_rule(rule).induced(p, candidates)`` (χ² at level
    ``LAW_LEVEL``, power ``LAW_POWER`` against a TV error of 0.01)."""
    generator = torch.Generator().manual_seed(3)
    p_root = torch.softmax(torch.randn(LAW_VOCAB, generator=generator, dtype=torch.float64) * 1.5, -1)
    q_root = torch.softmax(torch.randn(LAW_VOCAB, generator=generator, dtype=torch.float64) * 1.5, -1)
    candidates = torch.sort(-q_root, stable=True).indices[:3].tolist()
    tree = TokenTree(parents=(-1, -1, -1, 0), tokens=(*candidates, candidates[0]))
    draft = DraftTree(tree=tree, q_laws=torch.stack([q_root] + [q_root] * 4), q_token=[0.0] * 4, u_draft=[None] * 4)
    p_laws = torch.stack([p_root] * 5)
    verify = get_rule(rule)
    steps = all_node_steps(verify, draft, p_laws, "top")
    tokens = [walk(verify, draft, p_laws, steps, seed, 0, set(), 1).tokens[0] for seed in range(LAW_N)]
    law = get_tree_rule(rule).induced(p_root, torch.tensor(candidates))
    assert torch.allclose(steps[-1].law, law, atol=1e-12)
    result = gof_tokens(torch.tensor(tokens), law)
    assert result.impossible == 0 and result.p_value >= LAW_LEVEL, f"{rule}: p={result.p_value:.2e}"


def test_a_wrong_node_law_is_caught_by_the_same_test() -> None:
    """Negative control: the lenience walk's tokens against the lossless law must be rejected."""
    generator = torch.Generator().manual_seed(3)
    p_root = torch.softmax(torch.randn(LAW_VOCAB, generator=generator, dtype=torch.float64) * 1.5, -1)
    q_root = torch.softmax(torch.randn(LAW_VOCAB, generator=generator, dtype=torch.float64) * 1.5, -1)
    candidates = torch.sort(-q_root, stable=True).indices[:3].tolist()
    tree = TokenTree(parents=(-1, -1, -1), tokens=tuple(candidates))
    draft = DraftTree(tree=tree, q_laws=torch.stack([q_root] * 4), q_token=[0.0] * 3, u_draft=[None] * 3)
    p_laws = torch.stack([p_root] * 4)
    verify = get_rule("lenience:0.5")
    steps = all_node_steps(verify, draft, p_laws, "top")
    tokens = [walk(verify, draft, p_laws, steps, seed, 0, set(), 1).tokens[0] for seed in range(LAW_N // 10)]
    assert gof_tokens(torch.tensor(tokens), p_root).p_value < LAW_LEVEL


def test_bad_tree_settings_get_one_line_errors(target, draft) -> None:
    cases = [
        ({"tree": "3,0"}, "tree branching must lie in"),
        ({"tree": "3,,1"}, "write the children per level"),
        ({"tree": "a"}, "is not a whole number"),
        ({"tree": "20,20"}, "at most 128 per round"),
        ({"tree": (2, 1), "tree_children": "random"}, "is not one of top, sample, sample-distinct"),
        ({"tree": (2, 1), "tree_budget": 8}, "not both"),
        ({"tree_depth": 3}, "goes with --tree-budget"),
        ({"tree_budget": 8, "tree_children": "sample"}, "budget tree"),
        ({"tree": (2, 1), "tree_children": "sample", "rule": "lenience:0.5"}, "needs --tree-children top"),
        ({"tree": (2, 1), "rule": "cos:0.5"}, "has no tree form"),
        ({"tree": "[[0],[2]]"}, r"lists \[2\] but not \[1\]"),
        ({"tree": "[[0,0]]"}, r"but not its parent \[0\]"),
        ({"tree": "[[0],[0]]"}, "lists a path twice"),
        ({"tree": "[[0],"}, "does not parse"),
        ({"tree": "[]"}, "non-empty list"),
    ]
    for kwargs, message in cases:
        kwargs = dict(kwargs)
        rule = kwargs.pop("rule", "lossless")
        with pytest.raises(EngineError, match=message):
            generate(target, draft, PROMPT, rule=rule, max_new_tokens=4, **kwargs)
    with pytest.raises(EngineError, match="a tree needs a drafter"):
        generate(target, None, PROMPT, tree=(2, 1), max_new_tokens=4)
    with pytest.raises(EngineError, match="n-gram drafts are deterministic"):
        generate(target, "ngram:2", PROMPT, tree=(2, 1), tree_children="sample", max_new_tokens=4)
    with pytest.raises(TreeSpecError):
        parse_tree("1," * 40 + "1")
    assert parse_tree(None) is None and parse_tree("3, 2, 1").text == "3,2,1"
    assert parse_tree(budget=16).text == "budget 16, depth 5"
    sparse = parse_tree("[[1], [0], [0, 0]]", children="sample")
    assert sparse.text == "[[0],[1],[0,0]]" and sparse.max_depth == 2 and sparse.max_nodes == 3
    assert sparse.limited(1).text == "[[0],[1]]" and (sparse.width(()), sparse.width((0,)), sparse.width((1,))) == (2, 1, 0)
    for spec in (parse_tree("3,2,1", children="sample"), parse_tree(budget=16, depth=4), sparse):  # what runs.tree stores reads back
        assert spec_from_text(spec.text, spec.children) == spec
    with pytest.raises(TreeSpecError):
        spec_from_text("budget 999, depth 5", "top")


def test_sampled_children_use_keyed_uniforms() -> None:
    """Children drawn i.i.d. from q (sample) may repeat; without replacement (sample-distinct) never do."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    accept, _residual, rest, law = node_steps(get_rule("lossless"), p, q, [0, 0], True, False)
    assert accept[0] == pytest.approx(0.5 / 0.7) and torch.allclose(law, p)
    # r_2 = norm((p − q)+) = (0, .5, .5); r_3 = norm((r_2 − q)+) = (0, .3, .4) / .7
    assert torch.allclose(rest, torch.tensor([0.0, 0.3, 0.4], dtype=torch.float64) / 0.7)
    accept, _residual, rest, _law = node_steps(get_rule("lossless"), p, q, [0, 1], True, True)
    assert accept[1] == pytest.approx(min(1.0, (0.1 / 0.2) / (0.2 / 0.3)))
    sampled = sample_inverse_cdf(q, torch.tensor([0.1, 0.95], dtype=torch.float64)[None])[0]
    assert sampled.tolist() == [0, 2]


def test_top_children_are_the_stable_top_k_of_q() -> None:
    """The fast top-k (``topk`` plus a margin) gives exactly the stable sort's order, ties included."""
    from diagnostics.engine.tree_draft import _top_children

    generator = torch.Generator().manual_seed(0)
    for trial in range(300):
        vocab = int(torch.randint(2, 60, (1,), generator=generator))
        q_draft = torch.softmax(torch.randn(vocab, generator=generator, dtype=torch.float64), -1)
        if trial % 3 == 0:  # coarse values: many ties, and zeros
            q_draft = torch.round(q_draft * 20) / 20
        k = int(torch.randint(1, vocab + 3, (1,), generator=generator))
        expected = [int(token) for token in torch.sort(-q_draft, stable=True).indices[:k] if q_draft[token] > 0]
        assert _top_children(q_draft, k) == expected


def test_budget_trees_keep_the_best_paths_and_try_children_by_decreasing_q(target, draft) -> None:
    """A budget tree holds the N nodes of highest path probability Π q (closed under ancestors) and
    each parent's children are in decreasing q, the order they are tried in."""
    run = generate(target, draft, PROMPT, tree_budget=6, tree_depth=3, max_new_tokens=12, seed=2, eos_token_id=[])
    for round_ in run.rounds:
        nodes = [node for node in run.nodes if node.block == round_.block]
        assert len(nodes) <= 6
        by_parent: dict[int, list] = {}
        for node in nodes:
            by_parent.setdefault(node.parent, []).append(node)
            assert node.parent < node.node
        for children in by_parent.values():
            qs = [child.q_token for child in sorted(children, key=lambda child: child.sibling)]
            assert qs == sorted(qs, reverse=True)
        score = {}
        for node in nodes:
            score[node.node] = node.q_token * (1.0 if node.parent < 0 else score[node.parent])
        assert min(score.values()) >= 0
