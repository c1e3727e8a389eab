"""Many sequences in lock-step rounds: each row drafts, all rows are verified in one target forward.

``generate_batch`` runs ``B`` rows that may differ in prompt, rule, seed, policy and token budget
(a coupled unit: the lossless run, each rule and each baseline with one prompt and seed). Each row
is a generator (``reference.chain.chain_row`` or ``reference.tree.tree_row``) that yields the forwards it needs; the
driver runs the pending requests of one stage for every row at once (draft stages before the
target's, so the rows reach verification together), sends each row its output, and repeats.
A row that finishes leaves and the next waiting row joins (continuous batching), so at most
``batch_size`` rows share a forward.

Nothing a row computes depends on the other rows: its uniforms are keyed by its own ``(seed,
position, slot)``, its keys and values live in its own slot, and its mask shows it only its own
keys. A row's tokens are the ones it would emit alone, up to float rounding of batched matrix
products (measured in ``tests/test_batch.py`` and the README).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from diagnostics.engine.admission import Admission
from diagnostics.engine.reference.chain import chain_row
from diagnostics.engine.drafting import ModelDrafter, NgramDrafter, TargetScorer
from diagnostics.engine.forward import full_stage
from diagnostics.engine.head_drafting import HeadDrafter, head_stage
from diagnostics.engine.tree_program import TreeProgram, supports_tree_program
from diagnostics.engine.chain_program import RoundProgram, supports_program
from diagnostics.engine.records import PositionRecord, Run
from diagnostics.engine.seams import CORRECT, EngineSeams
from diagnostics.engine.self_speculation import LayerSplitRow, SelfDrafter, SplitScorer, SplitStages, split_layer
from diagnostics.engine.settings import (
    EngineError,
    check_draft_stop,
    check_settings,
    check_tree_settings,
    eos_ids,
    tree_spec_or_error,
)
from diagnostics.engine.reference.tree import tree_row
from diagnostics.engine.tree_draft import TreeSpec
from diagnostics.models import (
    LoadedModel,
    check_vocabularies,
    device_label,
    early_exit_model,
    is_draft_head,
    load_model,
    parse_draft,
    wrap_model,
)
from diagnostics.policy import Policy
from diagnostics.rules import Rule, get_rule


@dataclass
class RowPlan:
    """One row of a batch: what to generate and where its records go."""

    prompt: list[int]
    rule: Rule
    seed: int
    policy: Policy
    draft_policy: Policy
    max_new_tokens: int
    eos: set[int]
    record: bool = True
    top_k_record: int = 20
    on_record: Callable[[PositionRecord], None] | None = None
    on_round: Callable[[Any, list[Any]], None] | None = None
    should_stop: Callable[[], bool] | None = None


def _per_row(value: Any, count: int, name: str) -> list[Any]:
    """A value for every row: a list of ``count`` values, or one value repeated."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise EngineError(f"{name}: give one value per prompt ({count}), got {len(value)}")
        return list(value)
    return [value] * count


def _prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, torch.Tensor):
        return [int(token) for token in prompt.reshape(-1).tolist()]
    return [int(token) for token in prompt]


@dataclass
class _DraftSource:
    """What every row's drafter is built from: nothing, an n-gram length, a draft model, or a split target."""

    kind: str  # "none", "ngram", "model", "split", "object", "head"
    name: str | None = None
    loaded: LoadedModel | None = None
    ngram: int = 0
    layer: int = 0
    custom: Any = None
    head: Any = None  # a ``heads.LoadedHead``


def _draft_source(draft: Any, target: LoadedModel) -> _DraftSource:
    """``None`` (plain decoding), a spec string, a model object or ``LoadedModel``, or a drafter object."""
    if draft is None:
        return _DraftSource("none")
    if isinstance(draft, str):
        spec = parse_draft(draft)
        if spec.kind == "ngram":
            return _DraftSource("ngram", name=spec.spec, ngram=int(spec.value))
        if spec.kind == "early-exit":
            return _DraftSource("model", name=spec.spec, loaded=early_exit_model(target, int(spec.value)))
        if spec.kind in ("eagle3", "medusa"):
            from diagnostics.heads.layout import load_head

            head = load_head(spec.kind, spec.value, target)
            return _DraftSource("head", name=head.name, head=head)
        loaded = load_model(spec.value, device=target.device)
        check_vocabularies(target, loaded)
        return _DraftSource("model", name=spec.spec, loaded=loaded)
    if is_draft_head(draft):  # a heads.LoadedHead
        return _DraftSource("head", name=draft.name, head=draft)
    if hasattr(draft, "propose") and hasattr(draft, "commit"):
        return _DraftSource("object", name=getattr(draft, "name", None), custom=draft)
    loaded = wrap_model(draft)
    check_vocabularies(target, loaded)
    name = loaded.name if loaded.name.startswith("early-exit:") else f"model:{loaded.name}"
    return _DraftSource("model", name=name, loaded=loaded)


class _Pair:
    """The batch's forwards (target stage, draft stage or split stages) and each row's drafter and scorer."""

    def __init__(self, target: LoadedModel, source: _DraftSource, seams: EngineSeams, tree: bool, reuse_layers: bool,
                 rows: int, capacity: int, draft_stop: float | None) -> None:
        self.source, self.seams, self.draft_stop = source, seams, draft_stop
        self.split = None
        if source.kind == "model" and reuse_layers and not tree:
            layer = split_layer(target, source.loaded, seams.scorer)
            if layer is not None:
                self.split = SplitStages(target, layer, rows, capacity)
        self.target = target
        if self.split is None:
            self.target_stage = full_stage(target, rows, capacity, order=1,
                                           taps=source.head.engine_taps if source.kind == "head" else None)
            self.draft_stage = full_stage(source.loaded, rows, capacity, order=0) if source.kind == "model" else None
        # Every row's head in one call per step (an EAGLE-3 head's keys and values in a slot per row).
        self.head_stage = head_stage(source.head, target, rows, capacity) if source.kind == "head" else None

    def row(self, plan: RowPlan) -> tuple[Any, Any, Callable[[], None]]:
        """The drafter and scorer of one new row, and how to give its slots back."""
        source = self.source
        if self.split is not None:
            store = self.split.store
            slot = store.attach()
            split = LayerSplitRow(self.split, slot)
            drafter = SelfDrafter(split, plan.draft_policy, source.name, self.draft_stop)
            return drafter, SplitScorer(split), lambda: store.detach(slot)
        target_store = self.target_stage.store
        target_slot = target_store.attach()
        scorer = self.seams.scorer(self.target_stage, target_slot)
        drafter: Any = None
        draft_slot = head_slot = None
        if source.kind == "ngram":
            drafter = NgramDrafter(source.ngram, self.target.device)
        elif source.kind == "object":
            drafter = source.custom
        elif source.kind == "head":
            head_slot = self.head_stage.store.attach() if source.head.kind == "eagle3" else None
            drafter = HeadDrafter(source.head, scorer, self.target, plan.draft_policy, planted=source.head.planted,
                                  stage=self.head_stage, slot=0 if head_slot is None else head_slot)
        elif source.kind == "model":
            draft_slot = self.draft_stage.store.attach()
            drafter = ModelDrafter(self.draft_stage, draft_slot, plan.draft_policy, source.name, self.draft_stop)

        def release() -> None:
            target_store.detach(target_slot)
            if draft_slot is not None:
                self.draft_stage.store.detach(draft_slot)
            if head_slot is not None:
                self.head_stage.store.detach(head_slot)

        return drafter, scorer, release


def generate_batch(
    target: Any,
    draft: Any,
    prompts: Sequence[list[int] | torch.Tensor],
    rules: str | Rule | Sequence[str | Rule] = "lossless",
    seeds: int | Sequence[int] = 0,
    *,
    gamma: int = 4,
    max_new_tokens: int | Sequence[int] = 32,
    policies: Policy | Sequence[Policy] | None = None,
    draft_policies: Policy | Sequence[Policy | None] | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    eta: float | None = None,
    eos_token_id: int | list[int] | None = None,
    record: bool = True,
    top_k_record: int = 20,
    on_record: Callable[[int, PositionRecord], None] | None = None,
    on_round: Callable[[int, Any, list[Any]], None] | None = None,
    should_stop: Callable[[], bool] | Sequence[Callable[[], bool] | None] | None = None,
    seams: EngineSeams = CORRECT,
    tree: TreeSpec | str | tuple[int, ...] | None = None,
    tree_children: str = "top",
    tree_budget: int | None = None,
    tree_depth: int | None = None,
    reuse_layers: bool = True,
    draft_stop: float | None = None,
    batch_size: int | None = None,
    on_start: Callable[[int], None] | None = None,
    on_finish: Callable[[int, Run], None] | None = None,
    core: str = "tensor",
) -> list[Run | None]:
    """Generate one ``Run`` per prompt, ``batch_size`` rows (default: all) per forward, in prompt order.

    ``rules``, ``seeds``, ``max_new_tokens``, ``policies``, ``draft_policies`` and ``should_stop``
    take one value for every row or a list with one per prompt; the drafter, ``gamma`` and the
    tree shape are the batch's. ``policies`` default to ``Policy(temperature, top_k, top_p,
    min_p, eta)`` and ``draft_policies`` to each row's policy. ``on_record(row, record)`` and
    ``on_round(row, round, nodes)`` receive each row's records as its rounds are verified.
    Everything is checked before any model work (one ``EngineError`` line for the first bad row).
    Each row's ``Run`` is what ``generate`` gives for it alone (see the module docstring).

    ``on_start(row)`` is called when a row joins the batch and ``on_finish(row, run)`` when it
    ends (a caller stores runs as they finish). A ``should_stop`` that is one callable for the
    whole batch also keeps rows that have not started from starting: their result is ``None``;
    the rows in flight end ``interrupted`` at their next round.

    ``core``: ``tensor`` (the default) runs a chain of plain decoding, a draft model, the early exit or
    n-grams as one tensor program per round (``diagnostics.engine.chain_program``: host work flat as rows grow);
    ``reference`` runs each row's own program (``reference.chain.chain_row``, ``reference.tree.tree_row``), the tensor programs'
    oracle. Trees drafted by a model, the early exit or prompt lookup run as ``tree_program.TreeProgram``;
    draft heads and custom drafters always run per row.
    """
    loaded = wrap_model(target) if not isinstance(target, LoadedModel) else target
    if core not in ("tensor", "reference"):
        raise EngineError(f"core must be 'tensor' or 'reference', got {core!r}")
    count = len(prompts)
    if count == 0:
        raise EngineError("no prompts: give at least one")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise EngineError(f"batch size must be a whole number >= 1, got {batch_size!r}")
    base = Policy(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, eta=eta) if policies is None else None
    per_row = {name: _per_row(value, count, label) for name, value, label in (
        ("policy", policies if policies is not None else base, "policies"), ("draft_policy", draft_policies, "draft policies"),
        ("rule", rules, "rules"), ("seed", seeds, "seeds"), ("budget", max_new_tokens, "max-new-tokens"),
        ("stop", should_stop, "should_stop"))}
    per_row["rule"] = [get_rule(rule) for rule in per_row["rule"]]
    spec = tree if isinstance(tree, TreeSpec) else tree_spec_or_error(tree, tree_budget, tree_depth, tree_children)
    if spec is not None:
        gamma = spec.max_depth
    check_draft_stop(draft_stop, draft)
    if draft_stop is not None and spec is not None:
        raise EngineError("--draft-stop ends a chain of drafts early; use it without a tree, with a model or early-exit drafter")
    eos = eos_ids(loaded, eos_token_id)
    plans = [_row_plan(loaded, prompts[index], {name: values[index] for name, values in per_row.items()}, index, spec,
                       gamma, draft, eos, record, top_k_record, on_record, on_round)
             for index in range(count)]
    source = _checked_source(draft, loaded, gamma, spec, count)
    rows = min(batch_size or count, count)
    capacity = max(len(plan.prompt) + plan.max_new_tokens for plan in plans) + gamma + (spec.max_nodes if spec else 0) + 2
    pair = _Pair(loaded, source, seams, spec is not None, reuse_layers, rows, capacity, draft_stop)
    stop_all = should_stop if callable(should_stop) else None
    if core == "tensor" and spec is not None and supports_tree_program(pair, spec):
        where = device_label(loaded, source.loaded or source.head)
        return TreeProgram(pair, plans, rows, spec, loaded, where).run(stop_all, on_start, on_finish)
    if core == "tensor" and supports_program(pair, spec is not None):
        where = device_label(loaded, source.loaded or source.head)
        return RoundProgram(pair, plans, rows, gamma, loaded, where).run(stop_all, on_start, on_finish)
    return _drive(pair, plans, rows, gamma, spec, loaded, stop_all, on_start, on_finish)


def _row_plan(loaded: LoadedModel, prompt: Any, row: dict[str, Any], index: int, spec: TreeSpec | None, gamma: int,
              draft: Any, eos: set[int], record: bool, top_k_record: int,
              on_record: Callable[[int, PositionRecord], None] | None,
              on_round: Callable[[int, Any, list[Any]], None] | None) -> RowPlan:
    """Row ``index``'s plan from its own values (``row``: policy, draft policy, rule, seed, budget, stop),
    checked before any model work (``EngineError``)."""
    prompt_ids, rule = _prompt_ids(prompt), row["rule"]
    if spec is not None:
        check_tree_settings(spec, rule, draft)
    check_settings(loaded, prompt_ids, gamma, row["budget"], row["seed"], top_k_record)
    policy = row["policy"]
    return RowPlan(
        prompt=prompt_ids, rule=rule, seed=int(row["seed"]), policy=policy, draft_policy=row["draft_policy"] or policy,
        max_new_tokens=int(row["budget"]), eos=eos, record=record, top_k_record=top_k_record, should_stop=row["stop"],
        on_record=None if on_record is None else (lambda rec, _i=index: on_record(_i, rec)),
        on_round=None if on_round is None else (lambda rnd, nodes, _i=index: on_round(_i, rnd, nodes)),
    )


def _checked_source(draft: Any, loaded: LoadedModel, gamma: int, spec: TreeSpec | None, count: int) -> Any:
    """The batch's draft source, refused in one line where it cannot serve these settings."""
    source = _draft_source(draft, loaded)
    if source.kind == "head" and source.head.kind == "medusa":
        heads = source.head.module.config.medusa_num_heads
        if gamma > heads:  # for a tree, gamma is its depth
            what = "a tree of depth" if spec is not None else "--gamma"
            raise EngineError(f"these Medusa heads draft at most {heads} tokens deep (one per head): "
                              f"give {what} {heads} or less, not {gamma}")
    if source.kind == "object" and count > 1:
        raise EngineError("a drafter object keeps one sequence's state; give a draft spec or model to batch")
    if spec is not None and source.kind == "object" and not hasattr(source.custom, "propose_tree"):
        raise EngineError(f"the drafter {source.name!r} cannot draft trees; use early-exit:L, model:ID or ngram:N")
    return source


def _drive(pair: _Pair, plans: list[RowPlan], limit: int, gamma: int, spec: TreeSpec | None, loaded: LoadedModel,
           stop_all: Callable[[], bool] | None = None, on_start: Callable[[int], None] | None = None,
           on_finish: Callable[[int, Run], None] | None = None) -> list[Run | None]:
    """Run every row to its end, at most ``limit`` at a time; each step runs one stage for every row
    waiting on it (the stage with the lowest ``order`` first: drafts before verification)."""
    vocab, tokenizer, seams = loaded.vocab_size, loaded.tokenizer, pair.seams
    where = device_label(loaded, pair.source.loaded or pair.source.head)

    def program(plan: RowPlan):
        drafter, scorer, release = pair.row(plan)
        try:
            if spec is not None:
                run = yield from tree_row(plan, drafter, scorer, spec, vocab, tokenizer, seams)
            else:
                run = yield from chain_row(plan, drafter, scorer, gamma, vocab, tokenizer, seams)
            run.device = where
            return run
        finally:
            release()

    results: list[Run | None] = [None] * len(plans)
    waiting = Admission(len(plans), stop_all, on_start)
    active: dict[int, tuple[Any, Any]] = {}

    def advance(index: int, rows: Any, value: Any) -> None:
        try:
            request = rows.send(value)
        except StopIteration as stop:
            results[index] = stop.value
            active.pop(index, None)
            if on_finish is not None:
                on_finish(index, stop.value)
            return
        active[index] = (rows, request)

    try:
        while waiting or active:
            for index in waiting.take(limit - len(active)):
                advance(index, program(plans[index]), None)
            if not active:
                continue
            stage = min((request.stage for _, request in active.values()), key=lambda item: item.order)
            group = sorted(((index, request) for index, (_, request) in active.items() if request.stage is stage),
                           key=lambda item: item[1].slot)
            # A joining row's first forward (its prompt) runs apart from the other rows' few tokens:
            # padded together, every row would pay for the longest prompt.
            prefill = [item for item in group if item[1].start == 0]
            if prefill and len(prefill) < len(group):
                group = prefill
            requests = [request for _, request in group]
            outputs = seams.hand_back(requests, stage.run(seams.route(requests)))
            for (index, _), output in zip(group, outputs):
                advance(index, active[index][0], output)
    finally:
        for rows, _ in list(active.values()):
            rows.close()
    return results  # type: ignore[return-value]


def generate(
    target: Any,
    draft: Any,
    prompt_ids: list[int] | torch.Tensor,
    rule: str | Rule = "lossless",
    gamma: int = 4,
    max_new_tokens: int = 32,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    eta: float | None = None,
    *,
    policy: Policy | None = None,
    draft_policy: Policy | None = None,
    eos_token_id: int | list[int] | None = None,
    record: bool = True,
    top_k_record: int = 20,
    on_record: Callable[[PositionRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    seams: EngineSeams = CORRECT,
    tree: TreeSpec | str | tuple[int, ...] | None = None,
    tree_children: str = "top",
    tree_budget: int | None = None,
    tree_depth: int | None = None,
    on_round: Callable[[Any, list[Any]], None] | None = None,
    reuse_layers: bool = True,
    draft_stop: float | None = None,
    core: str = "tensor",
) -> Run:
    """Generate one sequence with speculative decoding under ``rule`` (plain decoding when ``draft`` is ``None``):
    ``generate_batch`` with one row.

    ``q`` is always the law the draft token was drawn from (the draft policy, by default the
    target's); ``p`` is the target's law after its policy. Returns a ``Run``; each record is
    also passed to ``on_record`` as soon as its block is verified. ``should_stop`` is polled
    between blocks: when it returns true the run ends with status ``interrupted``. ``seams`` is
    for audits only (planted bugs); leave it at the default.

    ``tree`` (``(3, 2, 1)``, ``"3,2,1"`` or a ``TreeSpec``) or ``tree_budget``/``tree_depth``
    drafts a token tree per round instead of a chain of ``gamma`` (``diagnostics.engine.reference.tree``);
    ``tree_children`` is ``top``, ``sample`` or ``sample-distinct``. ``on_round(round, nodes)``
    receives each round's ``RoundRecord`` and ``NodeRecord`` list. ``policy``, when given, is the
    whole target policy (a matched baseline's Medusa gate, say) and replaces ``temperature`` …
    ``eta``.

    With an ``early-exit:L`` draft, ``reuse_layers`` (the default) keeps one KV cache for the
    target's layers and verifies with layers ``L+1..N`` only (``diagnostics.engine.self_speculation``);
    ``p`` is a plain forward's to float rounding. ``draft_stop`` ends a block's drafting early
    after a draft ``x`` the draft is unsure of (``q(x) < draft_stop``); it depends on the draft
    alone, so the output law is unchanged.
    """
    runs = generate_batch(
        target, draft, [prompt_ids], rule, seed, gamma=gamma, max_new_tokens=max_new_tokens,
        policies=policy, draft_policies=draft_policy, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        eta=eta, eos_token_id=eos_token_id, record=record, top_k_record=top_k_record,
        on_record=None if on_record is None else (lambda _row, rec: on_record(rec)),
        on_round=None if on_round is None else (lambda _row, rnd, nodes: on_round(rnd, nodes)),
        should_stop=should_stop, seams=seams, tree=tree, tree_children=tree_children, tree_budget=tree_budget,
        tree_depth=tree_depth, reuse_layers=reuse_layers, draft_stop=draft_stop, core=core,
    )
    return runs[0]


__all__ = ["RowPlan", "TargetScorer", "generate", "generate_batch"]
