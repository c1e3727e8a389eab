"""Losslessness audit, rule level: run a verification step many times and test its output law.

Adapter signature (document it to users as is)::

    verify(p_target: Tensor[V], q_draft: Tensor[V], drafts: LongTensor[n], generator) -> LongTensor[n]

``drafts`` are ``n`` tokens the auditor drew from ``q``; ``verify`` performs one verification
step per draft (accept it, or emit its fallback) and returns the emitted tokens. Wrap any
implementation in that shape: ours (``rule_adapter``), transformers' ``_speculative_sampling``
(``transformers_adapter``), or your own callable.

Each pair of a battery gets a χ² test of the emitted tokens against ``p`` (or, for a declared
lossy rule, against its ``induced`` law). The p-values are adjusted with Holm's method, so the
chance that a correct implementation is flagged on any pair is at most ``level`` (1% by
default) by construction. The report states, per pair, the smallest TV the test detects with
probability ≥ 0.9 at its Bonferroni level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from diagnostics.gof import chi_square_gof, counts_of, detectable_tv
from diagnostics.metrics import total_variation
from diagnostics.rng import sample_inverse_cdf
from diagnostics.rules import Rule, as_laws, get_rule, normalise_or
from diagnostics.synthetic import dirichlet, keep_top

Verify = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]
DETECTION_POWER = 0.9


@dataclass
class PairResult:
    label: str
    n: int
    statistic: float
    dof: int
    p_value: float
    adjusted_p: float
    detectable_tv: float
    observed_tv: float
    impossible: int


@dataclass
class RuleAudit:
    """Verdict with its evidence."""

    implementation: str
    reference: str  # "p" (lossless claim) or the declared rule's spec
    level: float
    n_per_pair: int
    verdict: str
    pairs: list[PairResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def worst(self) -> PairResult:
        return min(self.pairs, key=lambda pair: pair.adjusted_p)

    @property
    def max_detectable_tv(self) -> float:
        return max(pair.detectable_tv for pair in self.pairs)

    def as_dict(self) -> dict:
        payload = asdict(self)
        payload["max_detectable_tv"] = self.max_detectable_tv
        payload["worst_pair"] = self.worst.label
        return payload


def battery(vocab: int = 12, seed: int = 0, extra: list[tuple[str, torch.Tensor, torch.Tensor]] | None = None) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(label, p, q)`` pairs: Dirichlet at several concentrations, truncated policies, a peaked
    target, drafts with zeros; ``extra`` adds pairs taken from real runs."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for concentration in (0.2, 1.0, 5.0):
        pairs.append((f"dirichlet({concentration:g})", dirichlet(vocab, concentration, generator), dirichlet(vocab, concentration, generator)))
    p, q = dirichlet(vocab, 1.0, generator), dirichlet(vocab, 1.0, generator)
    pairs.append(("truncated target and draft", keep_top(p, vocab // 2), keep_top(q, vocab // 2 + 1)))
    peaked = torch.softmax(-1.5 * torch.randperm(vocab, generator=generator).to(torch.float64), -1)
    pairs.append(("peaked target", peaked, dirichlet(vocab, 2.0, generator)))
    q_zero = dirichlet(vocab, 1.0, generator)
    p_zero = dirichlet(vocab, 1.0, generator)
    q_zero[p_zero.argmax()] = 0.0
    pairs.append(("draft with zeros (never proposes p's favourite)", p_zero, q_zero / q_zero.sum()))
    return pairs + list(extra or [])


def rule_adapter(rule: Rule | str) -> Verify:
    """Our rule as an adapter: coin ``u < a(x)``, else a draw from ``f``."""
    rule = get_rule(rule)

    def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        accept = rule.accept_prob(p, q)[drafts]
        coins = torch.rand(drafts.shape, generator=generator, dtype=torch.float64)
        fallback = sample_inverse_cdf(rule.fallback(p, q).expand(drafts.numel(), -1),
                                      torch.rand(drafts.shape, generator=generator, dtype=torch.float64))
        return torch.where(coins < accept, drafts, fallback)

    return verify


def transformers_adapter() -> Verify:
    """transformers' ``_speculative_sampling`` with one candidate: logits ``log q`` and ``log p``."""
    from transformers.generation.utils import _speculative_sampling

    def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        candidate_logits = torch.log(q.float()).reshape(1, 1, -1)
        new_logits = torch.log(p.float()).reshape(1, 1, -1).expand(1, 2, -1)  # position 0 and the bonus position
        emitted = torch.empty_like(drafts)
        for index, draft in enumerate(drafts.tolist()):
            tokens, _ = _speculative_sampling(torch.tensor([[draft]]), candidate_logits, 1, new_logits)
            emitted[index] = tokens[0, 0]
        return emitted

    return verify


def audit_rule(
    verify: Verify,
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]],
    n: int = 60_000,
    level: float = 0.01,
    declared: str | Rule | None = None,
    seed: int = 0,
    implementation: str = "callable",
) -> RuleAudit:
    """Test ``verify``'s output law on every pair against ``p`` (or the declared rule's induced law).

    Verdict ``pass`` when no Holm-adjusted p-value falls below ``level``; the family-wise false
    alarm rate of a correct implementation is then at most ``level``.
    """
    generator = torch.Generator().manual_seed(seed)
    reference_rule = get_rule(declared) if declared is not None else None
    raw = []
    for label, p, q in pairs:
        p_target, q_draft = as_laws(p, q)
        law = reference_rule.induced(p_target, q_draft) if reference_rule else p_target
        drafts = sample_inverse_cdf(q_draft.expand(n, -1), torch.rand(n, generator=generator, dtype=torch.float64))
        emitted = verify(p_target, q_draft, drafts, generator)
        counts = counts_of(emitted, p_target.numel())
        result = chi_square_gof(counts, law)
        observed_tv = float(total_variation(counts / counts.sum(), law))
        raw.append((label, result, observed_tv, law))
    m = len(raw)
    order = sorted(range(m), key=lambda index: raw[index][1].p_value)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * raw[index][1].p_value))
        adjusted[index] = running
    results = []
    for index, (label, result, observed_tv, law) in enumerate(raw):
        dof = max(1, int((law > 0).sum()) - 1)
        results.append(PairResult(label=label, n=n, statistic=result.statistic, dof=result.dof, p_value=result.p_value,
                                  adjusted_p=adjusted[index], detectable_tv=detectable_tv(n, dof, level / m, DETECTION_POWER),
                                  observed_tv=observed_tv, impossible=result.impossible))
    verdict = "fail" if any(pair.adjusted_p < level for pair in results) else "pass"
    return RuleAudit(implementation=implementation, reference=reference_rule.spec if reference_rule else "p (lossless)",
                     level=level, n_per_pair=n, verdict=verdict, pairs=results)


# --------------------------------------------------------------------------------------------
# Planted bugs at the rule level (one per bug class that a single verification step can show)
# --------------------------------------------------------------------------------------------


def _lossless_step(p: torch.Tensor, q_verify: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator,
                   residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                   reuse_coin: bool = False) -> torch.Tensor:
    accept = torch.where(q_verify[drafts] > 0, (p[drafts] / q_verify[drafts]).clamp(max=1.0), torch.ones(()))
    coins = torch.rand(drafts.shape, generator=generator, dtype=torch.float64)
    law = residual(p, q_verify) if residual else normalise_or((p - q_verify).clamp(min=0.0), p)
    second = coins if reuse_coin else torch.rand(drafts.shape, generator=generator, dtype=torch.float64)
    fallback = sample_inverse_cdf(law.expand(drafts.numel(), -1), second)
    return torch.where(coins < accept, drafts, fallback)


def _softmax_residual(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return _lossless_step(p, q, drafts, generator, residual=lambda a, b: torch.softmax(a - b, -1))


def _reused_coin(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return _lossless_step(p, q, drafts, generator, reuse_coin=True)


def _greedy_draft_softmax_q(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # The drafter proposes argmax q every time, but verification is told the draft law was q.
    greedy = torch.full_like(drafts, int(q.argmax()))
    return _lossless_step(p, q, greedy, generator)


def _raw_q(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # Drafts come from q; verification uses the draft's law before its policy (here: q flattened, as raw logits would be).
    raw = normalise_or(q.sqrt(), q)
    return _lossless_step(p, raw, drafts, generator)


def _temperature_one_side(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # The verifier sharpens p with T = 0.7 that the baseline policy does not apply.
    hot = normalise_or(p ** (1 / 0.7), p)
    return _lossless_step(hot, q, drafts, generator)


RULE_MUTANTS: dict[str, tuple[str, Verify]] = {
    "residual_softmax": ("residual taken as softmax(p − q) instead of norm((p − q)+)", _softmax_residual),
    "coin_reused": ("the accept coin reused for the residual draw", _reused_coin),
    "greedy_draft_softmax_q": ("greedy draft, but its softmax used as q", _greedy_draft_softmax_q),
    "raw_q": ("q taken before the draft policy (raw) while drafts follow the processed q", _raw_q),
    "temperature_one_side": ("temperature applied on one side only: the verifier's p is not the baseline's", _temperature_one_side),
}


# --------------------------------------------------------------------------------------------
# Recorded-run audit: replay every stored decision, recompute p independently
# --------------------------------------------------------------------------------------------


@dataclass
class RecordedAudit:
    """Checks on one stored run; ``flags`` lists every position that failed a check, with why."""

    run_id: str
    positions: int
    verdict: str
    acceptance_z: float | None
    accepted: int
    expected_accepted: float
    max_p_difference: float | None
    flags: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def audit_recorded_run(store, run_id: str, target=None, z_limit: float = 4.0, p_tolerance: float = 1e-4) -> RecordedAudit:
    """Replay a stored run: ``accept ⇔ u_accept < a(x)`` at every verified position; no drafted
    token with ``q(x) = 0`` and no emitted token with ``p(y) = 0``; the accepted count against
    ``Σ α`` (z-score, ``|z| > z_limit`` flags); and, when ``target`` (the run's model) is given,
    ``p`` and ``q`` recomputed by plain forwards on the committed prefix must reproduce the
    recorded ``a(x)``, top-k of ``p``, draft, fallback and bonus tokens from the stored uniforms.
    """
    from diagnostics.inspection import exact_laws

    run = store.get_run(run_id)
    if run is None:
        raise ValueError(f"there is no run {run_id!r} in {store.path}")
    rule = get_rule(run["rule"])
    records = store.positions(run_id).to_dict("records")
    flags: list[dict] = []

    def flag(position: int, check: str, detail: str) -> None:
        flags.append({"position": position, "check": check, "detail": detail})

    def present(value) -> bool:
        return value is not None and value == value

    accepted = 0
    alpha_sum = variance = 0.0
    max_difference = None
    for record in records:
        position, kind = int(record["position"]), record["kind"]
        if present(record.get("p_token")) and record["p_token"] <= 0:
            flag(position, "p(y) = 0", f"emitted token {record['token']} has target probability 0")
        if kind != "bonus":
            if present(record.get("q_draft")) and record["q_draft"] <= 0:
                flag(position, "q(x) = 0", f"drafted token {record['draft_token']} had draft probability 0")
            decided = record["u_accept"] < record["accept_prob"]
            if decided != (kind == "accepted"):
                flag(position, "replay", f"u = {record['u_accept']:.6f}, a(x) = {record['accept_prob']:.6f} but recorded {kind}")
            accepted += kind == "accepted"
            if present(record.get("alpha")):
                alpha_sum += record["alpha"]
                variance += record["alpha"] * (1 - record["alpha"])
        if target is None:
            continue
        p_target, q_draft = exact_laws(run, record, target)
        top_ids = [int(token) for token in record["p_top_ids"]]
        difference = float((p_target[top_ids] - torch.tensor(list(record["p_top_probs"]), dtype=torch.float64)).abs().max())
        max_difference = difference if max_difference is None else max(max_difference, difference)
        if difference > p_tolerance:
            flag(position, "p recomputed", f"recorded p differs from a plain forward on the prefix by {difference:.3g}")
            continue
        if kind == "bonus":
            expected = int(sample_inverse_cdf(rule.bonus(p_target), torch.tensor(record["u_fallback"])))
            if expected != record["token"]:
                flag(position, "bonus replay", f"u = {record['u_fallback']:.6f} gives {expected}, recorded {record['token']}")
            continue
        accept = float(rule.accept_prob(p_target, q_draft)[int(record["draft_token"])])
        if abs(accept - record["accept_prob"]) > p_tolerance:
            flag(position, "a(x) recomputed", f"recorded {record['accept_prob']:.6f}, recomputed {accept:.6f}")
        if kind == "rejected":
            expected = int(sample_inverse_cdf(rule.fallback(p_target, q_draft), torch.tensor(record["u_fallback"])))
            if expected != record["token"]:
                flag(position, "fallback replay", f"u = {record['u_fallback']:.6f} gives {expected}, recorded {record['token']}")
    z = (accepted - alpha_sum) / variance**0.5 if variance > 0 else None
    if z is not None and abs(z) > z_limit:
        flag(-1, "acceptance count", f"{accepted} accepted vs Σα = {alpha_sum:.1f} (z = {z:.1f})")
    return RecordedAudit(run_id=run_id, positions=len(records), verdict="fail" if flags else "pass", acceptance_z=z,
                         accepted=accepted, expected_accepted=alpha_sum, max_p_difference=max_difference, flags=flags)


# --------------------------------------------------------------------------------------------
# Engine level: a whole generator against the target's exact law (teacher forcing)
# --------------------------------------------------------------------------------------------

Generator = Callable[[list[int], int], list[int]]
PIT_BINS = 20


@dataclass
class EngineAudit:
    """Randomized-PIT test of a generator's emitted tokens against independently recomputed ``p``."""

    implementation: str
    generations: int
    tokens: int
    verdict: str
    statistic: float
    p_value: float
    impossible: int
    level: float
    detectable_tv: float
    bin_counts: list[int] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def teacher_forced_laws(target, prompt_ids: list[int], tokens: list[int], policy) -> torch.Tensor:
    """``p_t(· | prompt, y_<t)`` for every emitted position, from one plain cache-free forward."""
    from diagnostics.drafters import fit_vocabulary
    from diagnostics.policy import probabilities

    ids = torch.tensor([list(prompt_ids) + list(tokens)], device=target.device)
    logits = target.model(input_ids=ids, use_cache=False).logits[0].float().cpu()
    start = len(prompt_ids) - 1
    return probabilities(fit_vocabulary(logits[start : start + len(tokens)], target.vocab_size), policy)


def audit_generator(
    generate_fn: Generator,
    target,
    prompt_ids: list[int],
    seeds: range | list[int],
    policy=None,
    level: float = 0.01,
    eos: set[int] | None = None,
    implementation: str = "generator",
) -> EngineAudit:
    """Pool every emitted token of every seeded generation into one uniformity test.

    For token ``y_t`` with exact law ``p_t`` (teacher forcing, the baseline policy), the
    randomized PIT ``u_t = F_t(y_t − 1) + V·p_t(y_t)`` over a random order of the vocabulary
    (fresh per token, independent of the generator) is Uniform(0, 1) and independent across
    tokens exactly when the generator samples ``p``; a χ² test over ``PIT_BINS`` equal bins
    tests that. A token with ``p_t(y_t) = 0`` fails the audit outright.
    """
    from diagnostics.gof import chi_square_gof
    from diagnostics.policy import Policy

    policy = policy or Policy()
    stop = set(eos or ())
    auxiliary = torch.Generator().manual_seed(12345)
    pits: list[float] = []
    impossible = 0
    generations = 0
    errors, first_error = 0, None
    for seed in seeds:
        generations += 1
        try:
            tokens = list(generate_fn(list(prompt_ids), int(seed)))
        except Exception as error:  # a generator that crashes on some seeds is not a sampler of p
            errors += 1
            first_error = first_error or f"seed {seed}: {error.__class__.__name__}: {error}"
            continue
        for index, token in enumerate(tokens):
            if token in stop:
                tokens = tokens[: index + 1]
                break
        if not tokens:
            continue
        laws = teacher_forced_laws(target, prompt_ids, tokens, policy)
        for law, token in zip(laws, tokens):
            if law[token] <= 0:
                impossible += 1
                continue
            order = torch.randperm(law.numel(), generator=auxiliary)
            rank = int((order == token).nonzero())
            shuffled = law[order]
            below = float(shuffled[:rank].sum())
            pits.append(below + float(torch.rand((), generator=auxiliary, dtype=torch.float64)) * float(law[token]))
    values = torch.tensor(pits, dtype=torch.float64)
    counts = torch.histc(values, bins=PIT_BINS, min=0.0, max=1.0) if len(pits) else torch.zeros(PIT_BINS)
    result = chi_square_gof(counts, torch.full((PIT_BINS,), 1.0 / PIT_BINS))
    failed = impossible > 0 or errors > 0 or result.p_value < level
    return EngineAudit(errors=errors, first_error=first_error, implementation=implementation, generations=generations, tokens=len(pits),
                       verdict="fail" if failed else "pass", statistic=result.statistic, p_value=result.p_value,
                       impossible=impossible, level=level,
                       detectable_tv=detectable_tv(max(1, len(pits)), PIT_BINS - 1, level, DETECTION_POWER),
                       bin_counts=[int(count) for count in counts.tolist()])


def transformers_generator(target, assistant, max_new_tokens: int, **settings) -> Generator:
    """transformers ``generate`` with ``assistant_model`` and ``do_sample=True`` as an audited generator."""
    def run(prompt_ids: list[int], seed: int) -> list[int]:
        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids], device=target.device)
        with torch.inference_mode():
            output = target.model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant.model,
                                           do_sample=True, max_new_tokens=max_new_tokens, top_k=0, top_p=1.0,
                                           temperature=1.0, **settings)
        return output[0, len(prompt_ids):].tolist()

    return run


def engine_generator(target, draft, max_new_tokens: int, **settings) -> Generator:
    """Our engine as an audited generator."""
    from diagnostics.engine import generate

    def run(prompt_ids: list[int], seed: int) -> list[int]:
        return generate(target, draft, prompt_ids, max_new_tokens=max_new_tokens, seed=seed, record=False, **settings).tokens

    return run
