"""Engine-level audit: a whole generator's tokens against the target's exact law (teacher forcing).

A generator is any callable ``generate_fn(prompt_ids, seed) -> tokens`` (ours, transformers'
``generate`` with an assistant, or a user's). For each emitted token ``y_t`` the exact law
``p_t(· | prompt, y_<t)`` is recomputed independently, by one plain cache-free forward of the
target on the committed prefix under the baseline policy. The randomized probability integral
transform

    u_t = F_t(y_t − 1) + V·p_t(y_t),   V ~ Uniform(0, 1), F over the tokens by decreasing p_t,

is Uniform(0, 1), independently across tokens, exactly when the generator samples ``p``
(Brockwell 2007). Two χ² families test that: every ``u_t`` pooled into ``PIT_BINS`` bins, and
each output position ``t`` on its own (``POSITION_BINS`` bins, Holm-adjusted across positions;
they show *where* a generator goes wrong). Each family gets half the level (Bonferroni), so a
correct generator fails with probability at most ``level``. A token with ``p_t(y_t) = 0`` or a
crash fails outright.

Limits, stated in every verdict: the binned PIT has power against an alternative only through
the PIT law it induces, so it detects a TV of ``detectable_tv`` *in the PIT law*; an error that
cancels inside a bin is invisible here, which is why the rule-level and recorded-run layers
exist beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from diagnostics.audit.rule_level import DETECTION_POWER, holm
from diagnostics.gof import chi_square_gof, detectable_tv
from diagnostics.inspection import teacher_forced_laws

Generator = Callable[[list[int], int], list[int]]
PIT_BINS = 20
POSITION_BINS = 10
POSITION_MIN_TOKENS = 100  # a position is tested on its own once it has ≥ 10 expected per bin


@dataclass
class PositionTest:
    position: int
    tokens: int
    statistic: float
    p_value: float
    adjusted_p: float


@dataclass
class EngineAudit:
    """Randomized-PIT tests of a generator's emitted tokens against independently recomputed ``p``."""

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
    positions: list[PositionTest] = field(default_factory=list)
    worst_position: int | None = None
    worst_position_p: float | None = None
    time_s: float = 0.0
    settings: dict = field(default_factory=dict)
    layer: str = "engine"

    @property
    def reasons(self) -> list[str]:
        """Why the verdict is what it is, one line per finding."""
        found = []
        if self.errors:
            found.append(f"{self.errors} of {self.generations} generations crashed ({self.first_error})")
        if self.impossible:
            found.append(f"{self.impossible} emitted tokens have probability 0 under the target's law")
        if self.p_value < self.level / 2:
            found.append(f"pooled PIT not uniform: χ² = {self.statistic:.1f}, p = {self.p_value:.2g}")
        if self.worst_position_p is not None and self.worst_position_p < self.level / 2:
            found.append(f"position {self.worst_position} not uniform: Holm-adjusted p = {self.worst_position_p:.2g}")
        return found

    def as_dict(self) -> dict:
        payload = asdict(self)
        payload["reasons"] = self.reasons
        return payload


def randomized_pit(law: torch.Tensor, token: int, generator: torch.Generator) -> float:
    """``F(y − 1) + V·p(y)`` with the vocabulary ordered by decreasing ``p`` (ties by token id).

    Any order fixed before ``y`` is drawn makes the value exactly Uniform(0, 1) under ``p``; this
    one sends too-unlikely tokens (a wrong residual, dropped truncation, a stale cache) toward 1
    and too-likely ones (a sharpened law) toward 0, where the χ² bins see them.
    """
    return randomized_pits(law.reshape(1, -1), [token], generator)[0]


def randomized_pits(laws: torch.Tensor, tokens: list[int], generator: torch.Generator) -> list[float]:
    """``randomized_pit`` of each row of ``laws[T, V]`` at its token, with one draw of ``V`` per row
    in order: the mass ordered before ``y`` is that of ``{v : p(v) > p(y)} ∪ {v < y : p(v) = p(y)}``,
    one comparison per entry (O(V), not a sort)."""
    device = laws.device
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    p_token = laws.gather(1, ids.reshape(-1, 1))
    ahead = (laws > p_token) | ((laws == p_token) & (torch.arange(laws.shape[1], device=device).reshape(1, -1) < ids.reshape(-1, 1)))
    below = (laws * ahead).sum(dim=1).tolist()  # one host read for every row
    draw = generator.device
    return [min(1.0, before + float(torch.rand((), generator=generator, dtype=torch.float64, device=draw)) * mass)
            for before, mass in zip(below, p_token.reshape(-1).tolist())]


def _uniformity(values: list[float], bins: int):
    counts = torch.histc(torch.tensor(values, dtype=torch.float64, device="cpu"), bins=bins, min=0.0, max=1.0)
    return counts, chi_square_gof(counts, torch.full((bins,), 1.0 / bins, device="cpu"))  # host statistics


@dataclass
class PitSample:
    """What a batch of seeded generations contributes to an engine audit: the PIT of every emitted
    token (by output position), impossible tokens and crashes. Batches of disjoint seeds merge
    (``merge``) into exactly what one pass over all the seeds gives."""

    by_position: dict[int, list[float]] = field(default_factory=dict)
    impossible: int = 0
    errors: int = 0
    first_error: str | None = None
    generations: int = 0
    time_s: float = 0.0

    def merge(self, other: "PitSample") -> "PitSample":
        merged = PitSample({position: list(values) for position, values in self.by_position.items()},
                           self.impossible + other.impossible, self.errors + other.errors,
                           self.first_error or other.first_error, self.generations + other.generations,
                           self.time_s + other.time_s)
        for position, values in other.by_position.items():
            merged.by_position.setdefault(position, []).extend(values)
        return merged


def pit_sample(generate_fn: Generator, target, prompt_ids: list[int], seeds: range | list[int], policy=None,
               eos: set[int] | None = None, progress: Callable[[int, int], None] | None = None) -> PitSample:
    """Run ``generate_fn`` on each seed and take the randomized PIT of each emitted token against
    the target's law recomputed by teacher forcing. The PIT's auxiliary uniform ``V`` of a
    generation comes from a generator keyed by its seed (independent of the generator under
    audit), so any split of the seeds gives the same values."""
    from diagnostics.policy import Policy

    policy = policy or Policy()
    stop = set(eos or ())
    sample = PitSample()
    seeds = list(seeds)
    started = time.perf_counter()
    batch = getattr(generate_fn, "batch", None)
    for first in range(0, len(seeds), BATCH_SEEDS if batch is not None else 1):
        chunk = seeds[first : first + (BATCH_SEEDS if batch is not None else 1)]
        outputs = _generate_chunk(generate_fn, batch, prompt_ids, chunk)
        for seed, output in zip(chunk, outputs):
            sample.generations += 1
            if progress is not None:
                progress(sample.generations, len(seeds))
            if isinstance(output, Exception):  # a generator that crashes on some seeds is not a sampler of p
                sample.errors += 1
                sample.first_error = sample.first_error or f"seed {seed}: {output.__class__.__name__}: {output}"
                continue
            _add_pits(sample, target, prompt_ids, seed, output, policy, stop)
    sample.time_s = time.perf_counter() - started
    return sample


AUXILIARY_SEED = 12345
BATCH_SEEDS = 64  # seeds generated as one batch when the generator can batch (``generate_fn.batch``)


def _generate_chunk(generate_fn: Generator, batch: Callable | None, prompt_ids: list[int], seeds: list[int],
                    first_error_only: bool = False) -> list:
    """Each seed's tokens, or the exception its generation raised. A batch that raises is run again
    seed by seed, so a crash is charged to the seeds that crash; with ``first_error_only`` the list
    ends at the first seed that raises (the verdict table stops there: the rest would only repeat
    the crash, and an engine's log with it)."""
    if batch is not None:
        try:
            return [list(tokens) for tokens in batch(list(prompt_ids), [int(seed) for seed in seeds])]
        except Exception:  # noqa: BLE001 - attributed seed by seed below
            pass
    outputs: list = []
    for seed in seeds:
        try:
            outputs.append(list(generate_fn(list(prompt_ids), int(seed))))
        except Exception as error:  # noqa: BLE001 - recorded as this seed's crash
            outputs.append(error)
            if first_error_only:
                break
    return outputs


def _add_pits(sample: PitSample, target, prompt_ids: list[int], seed: int, tokens: list[int], policy, stop: set[int]) -> None:
    """The randomized PIT of each token of one generation (cut after its first EOS) against teacher forcing."""
    for index, token in enumerate(tokens):
        if token in stop:
            tokens = tokens[: index + 1]
            break
    if not tokens:
        return
    auxiliary = torch.Generator().manual_seed((AUXILIARY_SEED + int(seed)) % 2**63)
    laws = teacher_forced_laws(target, prompt_ids, tokens, policy)  # the last row (after every token) is unused
    values, impossible = pits_of(laws, tokens, auxiliary)
    sample.impossible += impossible
    for position, value in values.items():
        sample.by_position.setdefault(position, []).append(value)


def pits_of(laws: torch.Tensor, tokens: list[int], generator: torch.Generator) -> tuple[dict[int, float], int]:
    """The randomized PIT of each possible token (``p_t(y_t) > 0``) by output position, and the
    number of impossible ones (outside the vocabulary or of probability 0: no draw is made for them)."""
    rows = laws[: len(tokens)]
    possible = [position for position, token in enumerate(tokens)
                if 0 <= token < rows.shape[1] and float(rows[position, token]) > 0]
    if not possible:
        return {}, len(tokens)
    values = randomized_pits(rows[possible], [tokens[position] for position in possible], generator)
    return dict(zip(possible, values)), len(tokens) - len(possible)


def audit_generator(
    generate_fn: Generator,
    target,
    prompt_ids: list[int],
    seeds: range | list[int],
    policy=None,
    level: float = 0.01,
    eos: set[int] | None = None,
    implementation: str = "generator",
    settings: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> EngineAudit:
    """Pool every emitted token of every seeded generation into uniformity tests of its PIT.

    Verdict ``fail`` when a generation crashes, an emitted token has ``p_t(y_t) = 0``, the pooled
    PIT's χ² p-value is below ``level/2``, or some position's Holm-adjusted p-value is below
    ``level/2``. A correct generator passes with probability at least ``1 − level``.
    """
    sample = pit_sample(generate_fn, target, prompt_ids, seeds, policy=policy, eos=eos, progress=progress)
    return engine_audit(sample, prompt_ids, seeds, level=level, implementation=implementation, settings=settings)


def engine_audit(sample: PitSample, prompt_ids: list[int], seeds: range | list[int], level: float = 0.01,
                 implementation: str = "generator", settings: dict | None = None) -> EngineAudit:
    """The verdict and evidence of ``sample`` (one batch, or merged batches covering ``seeds``)."""
    seeds = list(seeds)
    by_position = sample.by_position
    pooled = [value for position in sorted(by_position) for value in by_position[position]]
    counts, result = _uniformity(pooled, PIT_BINS) if pooled else (torch.zeros(PIT_BINS, device="cpu"), None)
    statistic, p_value = (result.statistic, result.p_value) if result else (0.0, 1.0)
    tested = [(position, values) for position, values in sorted(by_position.items()) if len(values) >= POSITION_MIN_TOKENS]
    raw = [(position, len(values), _uniformity(values, POSITION_BINS)[1]) for position, values in tested]
    adjusted = holm([test.p_value for _, _, test in raw])
    positions = [PositionTest(position=position, tokens=count, statistic=test.statistic, p_value=test.p_value, adjusted_p=adj)
                 for (position, count, test), adj in zip(raw, adjusted)]
    worst = min(positions, key=lambda item: item.adjusted_p) if positions else None
    failed = (sample.impossible > 0 or sample.errors > 0 or p_value < level / 2
              or (worst is not None and worst.adjusted_p < level / 2))
    return EngineAudit(
        implementation=implementation, generations=sample.generations, tokens=len(pooled),
        verdict="fail" if failed else "pass", statistic=statistic, p_value=p_value, impossible=sample.impossible, level=level,
        detectable_tv=detectable_tv(max(1, len(pooled)), PIT_BINS - 1, level / 2, DETECTION_POWER),
        bin_counts=[int(count) for count in counts.tolist()], errors=sample.errors, first_error=sample.first_error,
        positions=positions, worst_position=worst.position if worst else None,
        worst_position_p=worst.adjusted_p if worst else None, time_s=sample.time_s,
        settings=dict(settings or {}, prompt_ids=list(prompt_ids), seeds=f"{seeds[0]}..{seeds[-1]}" if seeds else ""),
    )


def transformers_generator(target, assistant, max_new_tokens: int, policy=None, gamma: int | None = None,
                           **settings) -> Generator:
    """transformers ``generate`` with ``assistant_model`` and ``do_sample=True`` as an audited generator;
    ``gamma`` fixes its drafts per block (set on the assistant's ``generation_config``, where
    transformers reads it; its confidence stop is then off), else its own defaults."""
    from diagnostics.hf_assisted import assistant_settings, fixed_gamma
    from diagnostics.policy import Policy

    policy = policy or Policy()
    sampling = {"do_sample": not policy.greedy, "top_k": policy.top_k or 0, "top_p": policy.top_p or 1.0,
                "temperature": policy.temperature or 1.0}
    if policy.min_p is not None:
        sampling["min_p"] = policy.min_p
    if policy.eta is not None:
        sampling["eta_cutoff"] = policy.eta

    drafting = fixed_gamma(gamma) if gamma is not None else None

    def run(prompt_ids: list[int], seed: int) -> list[int]:
        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids], device=target.device)
        with assistant_settings(assistant.model, drafting), torch.inference_mode():
            output = target.model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant.model,
                                           max_new_tokens=max_new_tokens, **sampling, **settings)
        return output[0, len(prompt_ids):].tolist()

    return run


def engine_generator(target, draft, max_new_tokens: int, policy=None, **settings) -> Generator:
    """Our engine (``settings`` go to ``generate``: ``gamma``, ``rule``, ``seams``, …) as an audited
    generator; its ``batch(prompt_ids, seeds)`` generates many seeds as rows of one batch
    (``generate_batch``: each row's tokens are the ones ``generate`` gives for its seed)."""
    from diagnostics.engine import generate, generate_batch
    from diagnostics.policy import Policy

    policy = policy or Policy()
    # The engine's own count of what it drafted and accepted (``RunResult``), over every generation
    # this generator made: the verdict table's proof that speculation ran (``verdicts.table``).
    counters = {"drafted": 0, "accepted": 0, "generations": 0, "source": "this lab's engine (its run results)"}

    def counted(result):
        counters["drafted"] += int(result.drafted)
        counters["accepted"] += int(result.accepted)
        counters["generations"] += 1
        return result.tokens

    def run(prompt_ids: list[int], seed: int) -> list[int]:
        return counted(generate(target, draft, prompt_ids, max_new_tokens=max_new_tokens, seed=seed, record=False,
                                policy=policy, **settings))

    def batch(prompt_ids: list[int], seeds: list[int]) -> list[list[int]]:
        options = dict(settings)
        rule = options.pop("rule", "lossless")
        runs = generate_batch(target, draft, [prompt_ids] * len(seeds), rule, seeds, max_new_tokens=max_new_tokens,
                              record=False, policies=policy, **options)
        return [counted(result) for result in runs]

    run.batch = batch  # type: ignore[attr-defined]
    run.counters = counters  # type: ignore[attr-defined]
    return run
