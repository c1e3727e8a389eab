"""The draft → verify → accept loop, recording every verified or bonus position.

One block: the drafter proposes ``γ`` tokens ``x_i ~ q_i``; the target scores ``γ + 1``
positions in one forward; position ``i`` is verified with ``p_i``, ``q_i`` of the same position
(accept iff ``u_accept < a(x_i)``); the first rejection emits a fallback draw from
``f(p_i, q_i)``; if all are accepted the bonus is drawn from ``b(p_γ)``. Both KV caches are
then cut back to the committed prefix.

Every uniform comes from ``diagnostics.rng`` keyed by ``(seed, absolute output position,
slot)``: a run is reproducible, each decision replays from stored uniforms, and runs with the
same seed and different rules stay coupled until they decide differently.

Plain decoding (``draft=None``) uses the same loop with ``γ = 0``: every position is a bonus
position drawn from ``p``.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from diagnostics.drafters import Drafter, ModelDrafter, NgramDrafter, TargetScorer, fit_vocabulary
from diagnostics.metrics import entropy, kl_divergence, overshoot_mass, severe_overshoot_mass, total_variation
from diagnostics.models import LoadedModel, check_vocabularies, early_exit_model, load_model, parse_draft, wrap_model
from diagnostics.policy import Policy, probabilities
from diagnostics.rng import sample_token, uniform_scalar
from diagnostics.rules import Rule, get_rule
from diagnostics.tree_draft import TreeSpec, parse_tree
from diagnostics.tree_walk import all_node_steps


class EngineError(ValueError):
    """Bad generation settings; the message says what to change."""


def target_laws(logits: torch.Tensor, policy: Policy, drafted: int) -> torch.Tensor:
    """``p`` for the ``drafted`` verified positions and the bonus position: the policy on every row.

    ``drafted`` is unused here; it is in the signature so an audit's planted bug can treat the
    verified rows differently from the bonus row (see ``EngineSeams``).
    """
    return probabilities(logits, policy)


def fallback_law(rule: Rule, p_laws: torch.Tensor, q_laws: torch.Tensor, index: int) -> torch.Tensor:
    """The law the token is drawn from after rejecting the draft at block index ``index``: ``f(p_i, q_i)``."""
    return rule.fallback(p_laws[index], q_laws[index])


@dataclass(frozen=True)
class EngineSeams:
    """The three steps of the loop a losslessness audit may replace with a planted bug.

    The defaults are the correct steps; ``diagnostics.audit.mutants`` builds wrong ones. Passed
    explicitly (never patched globally) so a planted engine cannot leak into another run.
    """

    target_laws: Callable[[torch.Tensor, Policy, int], torch.Tensor] = target_laws
    fallback_law: Callable[[Rule, torch.Tensor, torch.Tensor, int], torch.Tensor] = fallback_law
    scorer: type = TargetScorer
    tree_steps: Callable[..., dict] = all_node_steps


CORRECT = EngineSeams()


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
    nodes: list[Any] = field(default_factory=list)  # tree runs: tree_engine.NodeRecord per drafted node
    rounds: list[Any] = field(default_factory=list)  # tree runs: tree_engine.RoundRecord per round

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


def _eos_ids(loaded: LoadedModel, eos_token_id: int | list[int] | None) -> set[int]:
    if eos_token_id is not None:
        return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    found: set[int] = set()
    config = getattr(loaded.model, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), getattr(loaded.model.config, "eos_token_id", None)):
        if isinstance(source, int):
            found.add(source)
        elif isinstance(source, (list, tuple)):
            found.update(int(value) for value in source)
    if loaded.tokenizer is not None and loaded.tokenizer.eos_token_id is not None:
        found.add(int(loaded.tokenizer.eos_token_id))
    return found


def make_drafter(draft: Any, target: LoadedModel, policy: Policy) -> Drafter | None:
    """``None`` (plain decoding), a model object, a ``LoadedModel`` or a spec string."""
    if draft is None:
        return None
    if isinstance(draft, str):
        spec = parse_draft(draft)
        if spec.kind == "ngram":
            return NgramDrafter(int(spec.value))
        if spec.kind == "early-exit":
            return ModelDrafter(early_exit_model(target, int(spec.value)), policy, spec.spec)
        loaded = load_model(spec.value, device=target.device)
        check_vocabularies(target, loaded)
        return ModelDrafter(loaded, policy, spec.spec)
    if hasattr(draft, "propose") and hasattr(draft, "commit"):
        return draft
    loaded = wrap_model(draft)
    check_vocabularies(target, loaded)
    name = loaded.name if loaded.name.startswith("early-exit:") else f"model:{loaded.name}"
    return ModelDrafter(loaded, policy, name)


def _top(law: torch.Tensor, k: int) -> tuple[list[int], list[float], float]:
    k = min(k, law.shape[-1])
    values, ids = torch.topk(law, k)
    return ids.tolist(), values.tolist(), max(0.0, 1.0 - float(values.sum()))


def _decode_one(tokenizer: Any, token: int | None) -> str | None:
    if tokenizer is None or token is None:
        return None
    return tokenizer.decode([token])


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
) -> Run:
    """Generate with speculative decoding under ``rule`` (or plain decoding when ``draft`` is ``None``).

    ``q`` is always the law the draft token was drawn from (the draft policy, by default the
    target's); ``p`` is the target's law after its policy. Returns a ``Run``; each record is
    also passed to ``on_record`` as soon as its block is verified. ``should_stop`` is polled
    between blocks: when it returns true the run ends with status ``interrupted``. ``seams`` is
    for audits only (planted bugs); leave it at the default.

    ``tree`` (``(3, 2, 1)``, ``"3,2,1"`` or a ``TreeSpec``) or ``tree_budget``/``tree_depth``
    drafts a token tree per round instead of a chain of ``gamma`` (``diagnostics.tree_engine``);
    ``tree_children`` is ``top``, ``sample`` or ``sample-distinct``. ``on_round(round, nodes)``
    receives each round's ``RoundRecord`` and ``NodeRecord`` list. ``policy``, when given, is the
    whole target policy (a matched baseline's Medusa gate, say) and replaces ``temperature`` …
    ``eta``.

    With an ``early-exit:L`` draft, ``reuse_layers`` (the default) keeps one KV cache for the
    target's layers and verifies with layers ``L+1..N`` only (``diagnostics.self_speculation``);
    ``p`` is a plain forward's to float rounding. ``draft_stop`` ends a block's drafting early
    after a draft ``x`` the draft is unsure of (``q(x) < draft_stop``); it depends on the draft
    alone, so the output law is unchanged.
    """
    loaded = wrap_model(target) if not isinstance(target, LoadedModel) else target
    verify_rule = get_rule(rule)
    policy = policy or Policy(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, eta=eta)
    draft_policy = draft_policy or policy
    prompt = [int(token) for token in (prompt_ids.reshape(-1).tolist() if isinstance(prompt_ids, torch.Tensor) else prompt_ids)]
    spec = tree if isinstance(tree, TreeSpec) else tree_spec_or_error(tree, tree_budget, tree_depth, tree_children)
    if spec is not None:
        check_tree_settings(spec, verify_rule, draft)
        gamma = spec.max_depth
    check_settings(loaded, prompt, gamma, max_new_tokens, int(seed), top_k_record)
    check_draft_stop(draft_stop, draft)
    drafter = make_drafter(draft, loaded, draft_policy)
    if draft_stop is not None:
        if spec is not None or not hasattr(drafter, "draft_stop"):
            raise EngineError("--draft-stop ends a chain of drafts early; use it without a tree, with a model or early-exit drafter")
        drafter.draft_stop = float(draft_stop)
    if spec is not None:
        from diagnostics.tree_engine import generate_tree

        return generate_tree(loaded, drafter, verify_rule, spec, prompt, max_new_tokens=max_new_tokens, seed=int(seed),
                             policy=policy, draft_policy=draft_policy, eos=_eos_ids(loaded, eos_token_id), record=record,
                             top_k_record=top_k_record, on_record=on_record, on_round=on_round, should_stop=should_stop,
                             seams=seams)
    vocab = loaded.vocab_size
    eos = _eos_ids(loaded, eos_token_id)
    scorer = seams.scorer(loaded)
    if reuse_layers and drafter is not None:
        from diagnostics.self_speculation import reusing_pair

        pair = reusing_pair(loaded, drafter, seams.scorer)
        if pair is not None:
            drafter, scorer = pair
    run = Run(tokens=[], records=[], prompt_ids=prompt, rule=verify_rule.spec,
              draft=getattr(drafter, "name", None), gamma=gamma if drafter else 0, seed=int(seed),
              policy=policy, draft_policy=draft_policy)
    committed = list(prompt)
    start = time.perf_counter()
    for position, budget in rounds(run, max_new_tokens, should_stop):
        count = min(gamma, budget) if drafter is not None else 0

        def draw(q_draft: torch.Tensor, index: int, _position: int = position) -> int:
            return sample_token(q_draft, uniform_scalar(seed, _position + index, "draft"))

        drafts, q_laws = drafter.propose(committed, count, draw, vocab, eos) if count else ([], None)
        logits = fit_vocabulary(scorer.score(committed, drafts), vocab)
        p_laws = seams.target_laws(logits, policy, len(drafts))
        emitted, accepted, finished = _verify_block(
            run, verify_rule, drafts, p_laws, q_laws, position, int(seed), eos, budget,
            record, top_k_record, loaded.tokenizer, on_record, seams.fallback_law,
        )
        run.blocks += 1
        run.drafted += len(drafts)
        run.accepted += accepted
        # Roll both caches back to the committed prefix: prompt + earlier tokens + accepted drafts.
        scorer.rollback(len(committed) + accepted)
        if drafter is not None:
            drafter.commit(len(committed) + accepted)
        committed.extend(emitted)
        run.tokens.extend(emitted)
        if finished:
            run.stop_reason = "eos"
            break
    return finish(run, start, loaded.tokenizer)


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


def _verify_block(
    run: Run,
    rule: Rule,
    drafts: list[int],
    p_laws: torch.Tensor,
    q_laws: torch.Tensor | None,
    position: int,
    seed: int,
    eos: set[int],
    budget: int,
    record: bool,
    top_k_record: int,
    tokenizer: Any,
    on_record: Callable[[PositionRecord], None] | None,
    fallback_of: Callable[[Rule, torch.Tensor, torch.Tensor, int], torch.Tensor] = fallback_law,
) -> tuple[list[int], int, bool]:
    """Verify one block in order; return the emitted tokens, the accepted count, and whether EOS ended it."""
    count = len(drafts)
    accept_rows = rule.accept_prob(p_laws[:count], q_laws) if count else None
    emitted: list[int] = []
    kinds: list[str] = []
    coins: list[tuple[float | None, float | None]] = []
    finished = False
    for index, draft_token in enumerate(drafts):
        u_accept = uniform_scalar(seed, position + index, "accept")
        if u_accept < float(accept_rows[index, draft_token]):
            emitted.append(draft_token)
            kinds.append("accepted")
            coins.append((u_accept, None))
        else:
            u_fallback = uniform_scalar(seed, position + index, "fallback")
            fallback = fallback_of(rule, p_laws, q_laws, index)
            emitted.append(sample_token(fallback, u_fallback))
            kinds.append("rejected")
            coins.append((u_accept, u_fallback))
        if emitted[-1] in eos:
            finished = True
        if kinds[-1] == "rejected" or finished:
            break
    if not finished and kinds.count("accepted") == count and count < budget:
        u_fallback = uniform_scalar(seed, position + count, "fallback")
        emitted.append(sample_token(rule.bonus(p_laws[count]), u_fallback))
        kinds.append("bonus")
        coins.append((None, u_fallback))
        finished = emitted[-1] in eos
    accepted = kinds.count("accepted")
    if record:
        for record_ in _block_records(run, rule, drafts, emitted, kinds, coins, p_laws, q_laws, accept_rows,
                                      position, seed, top_k_record, tokenizer):
            run.records.append(record_)
            if on_record is not None:
                on_record(record_)
    return emitted, accepted, finished


def _block_records(
    run: Run,
    rule: Rule,
    drafts: list[int],
    emitted: list[int],
    kinds: list[str],
    coins: list[tuple[float | None, float | None]],
    p_laws: torch.Tensor,
    q_laws: torch.Tensor | None,
    accept_rows: torch.Tensor | None,
    position: int,
    seed: int,
    top_k_record: int,
    tokenizer: Any,
) -> list[PositionRecord]:
    """Records of one block, with the exact full-vocabulary scalars computed in one batch."""
    verified = sum(1 for kind in kinds if kind != "bonus")
    records: list[PositionRecord] = []
    if verified:
        p_rows, q_rows = p_laws[:verified], q_laws[:verified]
        induced = rule.induced(p_rows, q_rows)
        baseline = rule.baseline(p_rows)
        allowed = rule.allowed_set(p_rows)
        lenience = getattr(rule, "l", None) or (getattr(rule, "alpha", None) if rule.name == "mentored" else None)
        scalars = {
            "alpha": (q_rows * accept_rows[:verified]).sum(-1),
            "tv_pq": total_variation(p_rows, q_rows),
            "entropy_p": entropy(p_rows),
            "entropy_q": entropy(q_rows),
            "overshoot": overshoot_mass(p_rows, q_rows),
            "tv_target": total_variation(induced, p_rows),
            "tv_baseline": total_variation(induced, baseline),
            "kl_target": kl_divergence(induced, p_rows),
        }
        if lenience:
            scalars["severe_overshoot"] = severe_overshoot_mass(p_rows, q_rows, float(lenience))
        if allowed is not None:
            scalars["allowed_size"] = allowed.sum(-1)
            scalars["allowed_mass"] = (p_rows * allowed).sum(-1)
        for index in range(verified):
            draft_token = drafts[index]
            p_ids, p_probs, p_tail = _top(p_rows[index], top_k_record)
            q_ids, q_probs, q_tail = _top(q_rows[index], top_k_record)
            values = {name: tensor[index].item() for name, tensor in scalars.items()}
            if "allowed_size" in values:
                values["allowed_size"] = int(values["allowed_size"])
            records.append(PositionRecord(
                position=position + index, block=run.blocks, index_in_block=index, kind=kinds[index],
                token=emitted[index], draft_token=draft_token,
                p_token=float(p_rows[index, emitted[index]]), p_draft=float(p_rows[index, draft_token]),
                q_draft=float(q_rows[index, draft_token]), accept_prob=float(accept_rows[index, draft_token]),
                u_draft=uniform_scalar(seed, position + index, "draft"),
                u_accept=coins[index][0], u_fallback=coins[index][1],
                p_top_ids=p_ids, p_top_probs=p_probs, p_tail=p_tail,
                q_top_ids=q_ids, q_top_probs=q_probs, q_tail=q_tail,
                token_text=_decode_one(tokenizer, emitted[index]), draft_text=_decode_one(tokenizer, draft_token),
                **values,
            ))
    if kinds and kinds[-1] == "bonus":
        index = len(kinds) - 1
        p_row = p_laws[index]
        bonus = rule.bonus(p_row)
        p_ids, p_probs, p_tail = _top(p_row, top_k_record)
        records.append(PositionRecord(
            position=position + index, block=run.blocks, index_in_block=index, kind="bonus",
            token=emitted[index], draft_token=None, p_token=float(p_row[emitted[index]]),
            p_draft=None, q_draft=None, accept_prob=None, u_draft=None, u_accept=None, u_fallback=coins[index][1],
            entropy_p=entropy(p_row).item(),
            tv_target=total_variation(bonus, p_row).item(),
            tv_baseline=total_variation(bonus, rule.baseline(p_row)).item(),
            kl_target=kl_divergence(bonus, p_row).item(),
            p_top_ids=p_ids, p_top_probs=p_probs, p_tail=p_tail,
            token_text=_decode_one(tokenizer, emitted[index]),
        ))
    return records


def check_draft_stop(draft_stop: float | None, draft: Any) -> None:
    """``--draft-stop`` is a probability in (0, 1], for a drafter with a law (a model or an early exit)."""
    if draft_stop is None:
        return
    if isinstance(draft_stop, bool) or not isinstance(draft_stop, (int, float)) or not 0 < float(draft_stop) <= 1:
        raise EngineError(f"--draft-stop must be a probability in (0, 1] (stop drafting after a draft x with q(x) below it), got {draft_stop!r}")
    if draft is None:
        raise EngineError("--draft-stop needs a drafter (e.g. --draft early-exit:26); plain decoding drafts nothing")
    if isinstance(draft, str) and draft.strip().lower().startswith("ngram"):
        raise EngineError("--draft-stop reads the draft's confidence q(x); an n-gram draft is a point mass (q(x) = 1): "
                          "use a model or early-exit drafter")


def tree_spec_or_error(tree: Any, budget: Any, depth: Any, children: str | None) -> TreeSpec | None:
    """``parse_tree`` with its errors as ``EngineError`` (one line, says what to write)."""
    try:
        return parse_tree(tree, budget, depth, children)
    except ValueError as error:
        raise EngineError(str(error)) from None


def check_tree_settings(spec: TreeSpec, rule: Rule, draft: Any) -> None:
    """A tree needs a drafter that drafts trees, a rule with a tree form, and, for sampled
    children, the lossless rule (the lossy tree rules are defined for ordered deterministic
    candidates, as EAGLE drafts them)."""
    if draft is None:
        raise EngineError("a tree needs a drafter (e.g. --draft early-exit:26); plain decoding has nothing to verify")
    if not rule.tree_capable:
        from diagnostics.rules import TREE_RULES

        raise EngineError(f"rule {rule.spec!r} has no tree form; tree rules: {', '.join(TREE_RULES)}")
    if spec.children != "top" and rule.lossy:
        raise EngineError(f"lossy tree rules try ordered deterministic candidates; {rule.spec} needs --tree-children top "
                          f"(sampled children, {spec.children}, are verified losslessly only)")
    if isinstance(draft, str) and draft.strip().lower().startswith("ngram") and spec.children != "top":
        raise EngineError("n-gram drafts are deterministic; use --tree-children top with an n-gram drafter")


# Hard limits whatever the model: they fit the store's INTEGER and BIGINT columns, and a model
# with no stated context cannot take more anyway.
MAX_GAMMA = 1024
MAX_NEW_TOKENS = 1_000_000
MAX_SEED = 2**63 - 1


def _whole(name: str, value: object, low: int, high: int, hint: str) -> int:
    try:
        value = operator.index(value)  # ints and numpy integers; a float or a string is refused
    except TypeError:
        raise EngineError(f"{name} must be a whole number, got {value!r}") from None
    if not low <= value <= high:
        raise EngineError(f"{name} must lie in [{low}, {high:,}] ({hint}), got {value:,}")
    return value


def check_numbers(gamma: int, max_new_tokens: int, seed: int, top_k_record: int) -> None:
    """γ, the token budget, the seed and the recorded top-k are whole numbers in range."""
    _whole("gamma", gamma, 0, MAX_GAMMA, "draft tokens per block")
    _whole("max-new-tokens", max_new_tokens, 1, MAX_NEW_TOKENS, "the token budget")
    _whole("seed", seed, 0, MAX_SEED, "the run's random stream")
    _whole("the recorded top-k", top_k_record, 1, 100_000, "top tokens of p and q stored per position")


def check_settings(loaded: LoadedModel, prompt: list[int], gamma: int, max_new_tokens: int, seed: int, top_k_record: int) -> None:
    """Everything ``generate`` checks before any model work: ranges of γ, the token budget, the
    seed and the recorded top-k, and that prompt + budget + γ fit the target's context. Callers
    that record a run call it first, so a run that cannot start leaves nothing behind."""
    if not prompt:
        raise EngineError("the prompt is empty; give at least one token")
    check_numbers(gamma, max_new_tokens, seed, top_k_record)
    limit = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    if limit is not None:
        if len(prompt) + gamma + 2 > limit:
            what = "gamma" if gamma >= len(prompt) else "the prompt"
            raise EngineError(
                f"{what} does not fit the target's context of {limit:,} tokens: the prompt has {len(prompt):,} tokens "
                f"and gamma is {gamma:,}; " + ("lower gamma" if what == "gamma" else "shorten the prompt")
            )
        if len(prompt) + max_new_tokens + gamma + 1 > limit:
            room = limit - len(prompt) - gamma - 1
            raise EngineError(
                f"max-new-tokens {max_new_tokens:,} does not fit the target's context of {limit:,} tokens "
                f"(prompt {len(prompt):,} tokens, gamma {gamma:,}): use at most {room:,}, or shorten the prompt"
            )
    vocab = loaded.vocab_size
    if any(token < 0 or token >= vocab for token in prompt):
        raise EngineError(f"prompt token ids must lie in [0, {vocab})")
