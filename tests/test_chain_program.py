"""The round as one tensor program (``diagnostics.engine.chain_program``) against the per-row programs it replaced.

* Fed the same ``P`` and ``Q`` (random laws, every single-draft rule, budgets, EOS drafts), one group's
  verification (``chain_verify.verify_group``) decides and records exactly what ``reference.chain._verify_block``
  does row by row.
* End to end on float64 tiny models (the direct Llama forward, a module forward, the early exit with
  and without reused layers, a separate draft model, prompt lookup; every rule; mixed rules, policies, prompts and
  budgets in one batch; continuous batching): the same tokens, kinds, uniforms and counters, and record
  scalars within 1e-12 (measured: 4.4e-16, one float64 rounding).
* Growth: dispatched aten ops and host reads for a whole ``generate_batch`` of 32 rows stay within 1.5×
  of 4 rows (a per-row loop grows 4–8×: the per-row programs are the negative control).
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from devices import DEVICE
from diagnostics.engine import CORRECT, generate_batch
from diagnostics.engine.reference.chain import _verify_block
from diagnostics.engine.records import Run
from diagnostics.engine.chain_verify import Columns, verify_group
from diagnostics.models import early_exit_model
from diagnostics.policy import Policy
from diagnostics.rng import round_uniforms
from diagnostics.rules import EXAMPLE_SPECS, get_rule
from diagnostics.tiny import tiny_llama
from tiny_models import tiny_lm

VOCAB = 12
SCALARS = ("p_token", "p_draft", "q_draft", "accept_prob", "alpha", "tv_pq", "entropy_p", "entropy_q", "overshoot",
           "severe_overshoot", "allowed_size", "allowed_mass", "tv_target", "tv_baseline", "kl_target", "p_tail", "q_tail")
EXACT = ("position", "block", "index_in_block", "kind", "token", "draft_token", "u_draft", "u_accept", "u_fallback",
         "p_top_ids", "q_top_ids", "token_text", "draft_text", "tree_node")


def _laws(rows: int, width: int, vocab: int, seed: int, sharp: float) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(rows, width, vocab, generator=generator, dtype=torch.float64) * sharp
    logits[..., 0] -= 40.0  # a token with (almost) no mass, as after truncation
    return torch.softmax(logits, -1).to(DEVICE)


@pytest.mark.parametrize("spec", EXAMPLE_SPECS)
def test_one_group_decides_and_records_as_the_per_row_block(spec: str) -> None:
    rule, gamma, rows, eos = get_rule(spec), 4, 24, {7}
    p_laws = _laws(rows, gamma + 1, VOCAB, 1, 2.0)
    q_laws = _laws(rows, gamma, VOCAB, 2, 2.0)
    seeds, positions = list(range(rows)), [3 * row for row in range(rows)]
    uniforms = round_uniforms(seeds, positions, gamma + 1, DEVICE)
    drafts = torch.multinomial(q_laws.reshape(-1, VOCAB).cpu(), 1, generator=torch.Generator().manual_seed(5)).view(rows, gamma).to(DEVICE)
    budgets = [1 + row % 6 for row in range(rows)]  # some rows end inside the block, some exactly at its end
    # The drafter stops after an EOS draft or at the budget: those are the drafts that count.
    limits = []
    for row in range(rows):
        count = min(gamma, budgets[row])
        listed = drafts[row, :count].tolist()
        limits.append(next((index + 1 for index, token in enumerate(listed) if token in eos), count))
    columns = Columns(gamma, 5, True)
    packed = verify_group(rule, p_laws, q_laws, drafts, uniforms, torch.tensor(limits, device=DEVICE),
                          torch.tensor(budgets, device=DEVICE), torch.tensor(sorted(eos), device=DEVICE),
                          CORRECT.fallback_law, columns).cpu()
    for row in range(rows):
        limit = limits[row]
        run = Run(tokens=[], records=[], prompt_ids=[1], rule=spec, draft="d", gamma=gamma, seed=seeds[row],
                  policy=Policy(), draft_policy=Policy())
        emitted, accepted, _ = _verify_block(run, rule, drafts[row, :limit].tolist(), p_laws[row, : limit + 1],
                                             q_laws[row, :limit], positions[row], seeds[row], eos, budgets[row], True, 5,
                                             None, None)
        values = packed[row]
        n, emit, token = int(values[0]), bool(values[2]), int(values[3])
        assert n == accepted and int(values[1]) == limit
        assert drafts[row, :n].tolist() + ([token] if emit else []) == emitted
        for slot, record in enumerate(run.records):
            every = {name: float(values[columns.every(name)][slot]) for name in ("p_token", "entropy_p", "tv_target", "tv_baseline", "kl_target", "p_tail")}
            for name, value in every.items():
                assert value == pytest.approx(getattr(record, name), abs=1e-12), (spec, row, slot, name)
            ids, probs = columns.p_top(slot)
            assert [int(v) for v in values[ids]] == record.p_top_ids
            if record.kind != "bonus":
                assert float(values[columns.verified("alpha")][slot]) == pytest.approx(record.alpha, abs=1e-12)
                assert float(values[columns.verified("accept_prob")][slot]) == pytest.approx(record.accept_prob, abs=1e-12)
                assert float(values[columns.verified("tv_pq")][slot]) == pytest.approx(record.tv_pq, abs=1e-12)


def _models():
    llama = tiny_llama(3, vocab=VOCAB, layers=4, sharpness=1.5, device=DEVICE, dtype=torch.float64)
    module = tiny_lm(VOCAB, seed=1, sharpness=1.5, dtype=torch.float64)
    module_draft = tiny_lm(VOCAB, seed=2, sharpness=1.5, dtype=torch.float64)
    return {
        "plain, direct forward": (llama, None, {}),
        "plain, module forward": (module, None, {}),
        "early exit, reused layers": (llama, early_exit_model(llama, 2), {}),
        "early exit, two forwards": (llama, early_exit_model(llama, 2), {"reuse_layers": False}),
        "draft model, module forward": (module, module_draft, {}),
        "early exit, adaptive drafting": (llama, early_exit_model(llama, 1), {"draft_stop": 0.3}),
        "n-gram lookup": (module, "ngram:2", {}),
    }


MODELS = _models()


def _same_runs(tensor_runs, row_runs) -> float:
    worst = 0.0
    for ours, oracle in zip(tensor_runs, row_runs):
        assert ours.tokens == oracle.tokens
        for name in ("blocks", "drafted", "accepted", "status", "stop_reason", "rule", "draft", "gamma", "seed", "device"):
            assert getattr(ours, name) == getattr(oracle, name), name
        assert len(ours.records) == len(oracle.records)
        for left, right in zip(ours.records, oracle.records):
            for name in EXACT:
                assert getattr(left, name) == getattr(right, name), name
            for name in SCALARS:
                a, b = getattr(left, name), getattr(right, name)
                assert (a is None) == (b is None), name
                if a is not None:
                    worst = max(worst, abs(a - b))
            for a, b in zip(left.p_top_probs + left.q_top_probs, right.p_top_probs + right.q_top_probs):
                worst = max(worst, abs(a - b))
    return worst


@pytest.mark.parametrize("setup", list(MODELS))
def test_the_tensor_program_gives_what_the_per_row_programs_give(setup: str) -> None:
    target, draft, extra = MODELS[setup]
    prompts = [[1, 2, 3, 4, 1, 2, 3], [5, 6], [7], [1, 2, 3, 4, 5, 6, 7], [2, 2, 2, 2], [9, 8, 7, 9, 8]]
    specs = list(EXAMPLE_SPECS) if draft is not None else ["lossless", "greedy", "lenience:0.5"]
    rules = [specs[index % len(specs)] for index in range(len(prompts) * 2)]
    policies = [Policy(temperature=0.9, top_k=5) if index % 3 == 0 else Policy() for index in range(len(rules))]
    kwargs = dict(gamma=3, max_new_tokens=[4 + index % 9 for index in range(len(rules))], policies=policies,
                  eos_token_id=[VOCAB - 1], batch_size=5, top_k_record=4, **extra)
    prompts = (prompts * 2)[: len(rules)]
    seeds = list(range(len(rules)))
    tensor_runs = generate_batch(target, draft, prompts, rules, seeds, core="tensor", **kwargs)
    row_runs = generate_batch(target, draft, prompts, rules, seeds, core="reference", **kwargs)
    assert any(run.stop_reason == "eos" for run in row_runs) and any(run.stop_reason == "length" for run in row_runs)
    assert _same_runs(tensor_runs, row_runs) <= 1e-12


def test_an_interrupted_row_is_kept_and_marked() -> None:
    target, draft, _ = MODELS["early exit, reused layers"]
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    runs = generate_batch(target, draft, [[1, 2, 3]] * 2, "lenience:0.5", [0, 1], gamma=2, max_new_tokens=30,
                          eos_token_id=[], should_stop=[stop, None], core="tensor")
    assert runs[0].status == "interrupted" and runs[0].stop_reason == "stopped" and 0 < len(runs[0].tokens) < 30
    assert runs[1].status == "complete" and len(runs[1].tokens) == 30
    assert len(runs[0].records) == len(runs[0].tokens)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class _Reads(TorchFunctionMode):
    NAMES = {"item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy"}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _counts(target, draft, rows: int, rule: str, core: str) -> tuple[int, int]:
    ops, reads = _Ops(), _Reads()
    with reads, ops:
        generate_batch(target, draft, [[1, 2, 3, 4]] * rows, rule, [0] * rows, max_new_tokens=8, eos_token_id=[],
                       batch_size=rows, core=core)
    return ops.count, reads.count


GROWTH = {"plain": (None, "lossless"), "early exit, lenience": ("early-exit", "lenience:0.5"),
          "draft model, cascade": ("model", "cascade:0.5")}


@pytest.mark.parametrize("setup", list(GROWTH))
def test_work_per_round_does_not_grow_with_rows(setup: str) -> None:
    """32 rows cost at most 1.5× the dispatched ops and host reads of 4 rows (on a GPU each read is a
    sync, each op a launch); the per-row programs, a per-row loop, grow by 4× or more and fail it."""
    target = tiny_llama(3, vocab=VOCAB, layers=4, device=DEVICE)
    kind, rule = GROWTH[setup]  # the n-gram chain is in the oracle test above
    draft = {None: None, "early-exit": early_exit_model(target, 2), "model": tiny_llama(4, vocab=VOCAB, layers=1, device=DEVICE)}[kind]
    ops4, reads4 = _counts(target, draft, 4, rule, "tensor")
    ops32, reads32 = _counts(target, draft, 32, rule, "tensor")
    assert ops32 <= 1.5 * ops4 and reads32 <= 1.5 * reads4, (ops4, ops32, reads4, reads32)
    # Negative control: the same count sees the per-row loop.
    row_ops4, row_reads4 = _counts(target, draft, 4, rule, "reference")
    row_ops32, row_reads32 = _counts(target, draft, 32, rule, "reference")
    assert row_ops32 > 3 * row_ops4 and row_reads32 > 3 * row_reads4


def test_every_planted_engine_bug_plants_in_the_tensor_program() -> None:
    """The seams are batched hooks: each engine and batch mutant changes what the program emits (the
    end-to-end losslessness tests then reject them; here, that they plant at all)."""
    from diagnostics.audit.mutants import BATCH_MUTANTS, ENGINE_MUTANT_POLICY, ENGINE_MUTANTS

    target = tiny_lm(VOCAB, seed=1, sharpness=1.5, dtype=torch.float64)
    draft = tiny_lm(VOCAB, seed=2, sharpness=1.5, dtype=torch.float64)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 1, 2], [3, 3]] * 4
    for name, (_, seams) in {**ENGINE_MUTANTS, **BATCH_MUTANTS}.items():
        policy = Policy(**ENGINE_MUTANT_POLICY.get(name, {}))
        kwargs = dict(gamma=3, max_new_tokens=10, policies=policy, eos_token_id=[], record=False, core="tensor")
        correct = generate_batch(target, draft, prompts, "lossless", list(range(len(prompts))), **kwargs)
        planted = generate_batch(target, draft, prompts, "lossless", list(range(len(prompts))), seams=seams, **kwargs)
        assert any(a.tokens != b.tokens for a, b in zip(correct, planted)), name
