"""External audit: does a file of generations from *any* engine follow the target's law?

One-sample design (an oracle law): for each emitted token ``y_t`` of each generation, the law
``p_t(· | prompt, y_<t)`` under the declared sampling settings comes from teacher forcing our
copy of the target (batched: generations of one length share a forward). The randomized PIT

    u_t = F_t(y_t − 1) + V·p_t(y_t),   V ~ Uniform(0, 1), F over tokens by decreasing p_t (rank bins),

is exactly Uniform(0, 1) and independent across tokens when the engine samples ``p``. The tests
are those of the engine-level audit (pooled χ² over ``PIT_BINS`` bins, each output position on its
own with Holm, half the level each), plus:

* **detectable TV**: the smallest TV of the PIT law that the sample detects with power
  ``DETECTION_POWER`` (Pearson χ², ``λ ≥ 4n·TV²``). When it exceeds the TV the user asked about
  (``--detect-tv``, default ``DEFAULT_DETECT_TV``), a clean sample is ``inconclusive`` ("not
  enough samples to detect TV x"), never ``pass``;
* **distortion estimate**: ``½ Σ_b |ĉ_b − 1/B|`` of the binned PIT law minus its mean under exact
  uniformity at the same ``n`` (so ≈ 0 for a correct engine), with a bootstrap interval over
  generations. It is the distance of the PIT law from uniform, a lower bound on what the engine's
  error does to the token law;
* **worst prompts**: each prompt's PIT on its own (Holm across prompts), smallest p first.

The engine's numerics differ from ours (another kernel, a quantized copy): the one-sample design
then sees that difference too. The two-sample design (``two_sample``) does not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from diagnostics.audit.engine_level import (
    AUXILIARY_SEED,
    PIT_BINS,
    EngineAudit,
    PitSample,
    PositionTest,
    _uniformity,
    engine_audit,
    pits_of,
)
from diagnostics.audit.rule_level import DETECTION_POWER, holm
from diagnostics.audit.samples import (
    Repeats,
    Sample,
    SamplesError,
    check_retokenized,
    distinct_draws,
    stopped_short,
    target_tokenize,
    usable,
)
from diagnostics.engine.drafting import fit_vocabulary
from diagnostics.gof import required_samples
from diagnostics.models import float_logits
from diagnostics.policy import probabilities

DEFAULT_DETECT_TV = 0.05  # the distortion a user wants ruled out by default: the bugs engines had moved TV 0.05–0.7
FORWARD_TOKENS = 4096  # tokens per teacher-forcing forward (rows × length)
BOOTSTRAP = 400


@dataclass
class PromptTest:
    prompt: str
    generations: int
    tokens: int
    p_value: float
    adjusted_p: float


@dataclass
class ExternalAudit:
    """The verdict on a file of generations, with its evidence."""

    source: str
    design: str
    verdict: str  # pass | fail | inconclusive
    generations: int
    tokens: int
    prompts: int
    level: float
    detect_tv: float
    detectable_tv: float
    needed_tokens: int
    statistic: float
    p_value: float
    bin_counts: list[int] = field(default_factory=list)
    positions: list[PositionTest] = field(default_factory=list)
    worst_position: int | None = None
    worst_position_p: float | None = None
    impossible: int = 0
    stopped_short: int = 0  # generations ended short of max_tokens without EOS (``samples.stopped_short``)
    distortion: float | None = None
    distortion_low: float | None = None
    distortion_high: float | None = None
    worst_prompts: list[PromptTest] = field(default_factory=list)
    prompt_mismatches: int = 0
    engine: str | None = None
    time_s: float = 0.0
    settings: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    layer: str = "external"
    rests_on: str | None = None  # what the verdict takes on trust (the server's scores, with --oracle server)
    score_check: dict | None = None  # the server's scores against --target (``server_scores.cross_check``)

    @property
    def implementation(self) -> str:
        return f"{self.engine or 'engine'} · {self.design}"

    @property
    def reasons(self) -> list[str]:
        """Why the verdict is what it is, one line per finding."""
        found = []
        if self.impossible:
            found.append(f"{self.impossible} emitted tokens have probability 0 under the declared law")
        if self.stopped_short:
            found.append(f"{self.stopped_short} generations ended with fewer tokens than their max_tokens and no EOS: "
                         "the engine dropped tokens (or its context ran out); a sampler that follows the declared law "
                         "emits max_tokens tokens unless it samples EOS")
        two_sample = self.design.startswith("two-sample")  # a G test of homogeneity, not a PIT
        if self.p_value < self.level / 2:
            found.append(f"the two samples' laws differ (pooled G test of homogeneity): G = {self.statistic:.1f}, "
                         f"p = {self.p_value:.2g}" if two_sample else
                         f"pooled PIT not uniform: χ² = {self.statistic:.1f}, p = {self.p_value:.2g}")
        if self.worst_position_p is not None and self.worst_position_p < self.level / 2:
            found.append(f"output position {self.worst_position} " + ("differs between the samples" if two_sample else "not uniform")
                         + f": Holm-adjusted p = {self.worst_position_p:.2g}")
        if self.verdict == "inconclusive":
            found.append(f"not enough samples to detect TV {self.detect_tv:g}: {self.tokens:,} "
                         + ("comparable tokens" if two_sample else "tokens") + " detect a TV of "
                         f"{self.detectable_tv:.3f} or more at {DETECTION_POWER:.0%} power; about {self.needed_tokens:,} are needed")
        if self.prompt_mismatches:
            found.append(f"{self.prompt_mismatches} prompts tokenise differently here than the engine's prompt_ids "
                         "(the engine's ids were used)")
        return found + list(self.notes)

    def as_dict(self) -> dict:
        payload = asdict(self)
        payload["implementation"] = self.implementation
        payload["reasons"] = self.reasons
        return payload


def _prompt_ids(target: Any, sample: Sample, cache: dict[str, list[int]]) -> tuple[list[int], bool]:
    """The ids the engine conditioned on (its ``prompt_ids`` when given) and whether ours differ."""
    if sample.prompt not in cache:
        if target.tokenizer is None:
            cache[sample.prompt] = []
        else:
            cache[sample.prompt] = list(target.tokenizer(sample.prompt)["input_ids"]) if sample.prompt else []
    ours = cache[sample.prompt]
    if sample.prompt_ids is not None:
        return list(sample.prompt_ids), bool(sample.prompt) and target.tokenizer is not None and ours != sample.prompt_ids
    if not ours:
        raise SamplesError("a sample has no prompt_ids and the target has no tokenizer to make them: add prompt_ids")
    return ours, False


@torch.inference_mode()
def teacher_forced_batch(target: Any, sequences: Sequence[tuple[list[int], list[int]]], policies: Sequence[Any],
                         on_done: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """``p_t(· | prompt, y_<t)`` for ``t < len(tokens)`` of each ``(prompt_ids, tokens)``, under its
    policy: one cache-free forward per group of equal total length (no padding, no mask: exactly
    the forward ``teacher_forced_laws`` makes, with more rows), at most ``FORWARD_TOKENS`` tokens each."""
    laws: list[torch.Tensor | None] = [None] * len(sequences)
    by_length: dict[int, list[int]] = {}
    for index, (prompt, tokens) in enumerate(sequences):
        if tokens:
            by_length.setdefault(len(prompt) + len(tokens), []).append(index)
        else:
            laws[index] = torch.zeros(0, target.vocab_size, dtype=torch.float64, device="cpu")  # laws come back to the host below
    done = 0
    for length, indices in sorted(by_length.items()):
        rows = max(1, FORWARD_TOKENS // length)
        for first in range(0, len(indices), rows):
            chunk = indices[first : first + rows]
            keep = max(len(sequences[index][1]) for index in chunk) + 1
            ids = torch.tensor([list(sequences[index][0]) + list(sequences[index][1]) for index in chunk], device=target.device)
            logits = float_logits(target.model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits[:, -keep:]).cpu()
            logits = fit_vocabulary(logits, target.vocab_size)
            for row, index in enumerate(chunk):
                count = len(sequences[index][1])
                laws[index] = probabilities(logits[row, keep - 1 - count : keep - 1], policies[index])
            done += len(chunk)
            if on_done is not None:
                on_done(done)
    return laws  # type: ignore[return-value]


def _tv_from_uniform(laws: np.ndarray) -> np.ndarray:
    """``½ Σ_b |π_b − 1/B|`` over the last axis."""
    return 0.5 * np.abs(laws - 1.0 / laws.shape[-1]).sum(-1)


# A line's ``speculative`` field in the settings a person reads.
SPECULATION_WORDS = {True: "on", False: "off", None: "not stated"}
CALIBRATION_GRID = np.linspace(0.0, 1.0, 21)
CALIBRATION_DRAWS = 40


def _calibrated_tv(counts: np.ndarray, generator: np.random.Generator) -> float:
    """The PIT law's TV from uniform, debiased by calibration along the shrinkage path.

    The plug-in ``T̂ = TV(ĉ)`` overstates the truth by sampling noise, and by how much depends on
    the law: subtracting the noise of an exactly uniform law (the earlier estimator) took 0.116
    off a true 0.143. Here, for laws ``π_λ = u + λ(ĉ − u)`` (``λ`` in ``CALIBRATION_GRID``), the
    mean plug-in at this ``n`` is simulated (multinomial draws); the ``λ`` whose mean equals
    ``T̂`` gives the estimate ``λ·T̂`` (0 when ``T̂`` is no more than uniform noise; beyond
    ``λ = 1``, ``T̂`` less the noise at ``ĉ``). Measured on simulated PIT samples (4,000 values
    in 100 generations, truths 0 to 0.14): mean bias at most 0.008, near 0, from clipping at 0."""
    total = int(counts.sum())
    observed = counts / max(1, total)
    plug_in = float(_tv_from_uniform(observed))
    uniform = np.full_like(observed, 1.0 / observed.size)
    laws = uniform + CALIBRATION_GRID[:, None] * (observed - uniform)
    draws = generator.multinomial(total, laws, size=(CALIBRATION_DRAWS, len(CALIBRATION_GRID))) / total
    means = np.maximum.accumulate(_tv_from_uniform(draws).mean(0))  # monotone in λ up to simulation noise
    if plug_in <= means[0]:
        return 0.0
    if plug_in >= means[-1]:
        return max(0.0, plug_in - (means[-1] - plug_in))
    return float(np.interp(plug_in, means, CALIBRATION_GRID)) * plug_in


def distortion_estimate(per_generation: list[np.ndarray], bins: int = PIT_BINS, resamples: int = BOOTSTRAP,
                        seed: int = 0) -> tuple[float, float, float]:
    """The pooled PIT's distortion ``½ Σ_b |c_b − 1/B|`` (``_calibrated_tv``), with a 95% interval
    from resampling generations: the resampled estimates' percentiles, shifted by their own bias
    (their mean minus the estimate; a resample adds noise of its own, and unshifted percentiles
    laid the whole interval above the estimate, ``0.005 [0.005, 0.069]``). Coverage measured on
    simulated samples at truths 0, 0.01, 0.02, 0.05, 0.14: 0.9, 1.0, 0.88, 0.95, 0.98 (40 each)."""
    # A generation with no PIT values (every score missing) carries no information, and a
    # resample made only of such generations would have no law at all: resample the others.
    per_generation = [values for values in per_generation if len(values)]
    if not per_generation:
        return float("nan"), float("nan"), float("nan")
    generator = np.random.default_rng(seed)
    counts = np.stack([np.histogram(values, bins=bins, range=(0.0, 1.0))[0] for values in per_generation])
    estimate = _calibrated_tv(counts.sum(0), generator)
    boots = np.array([_calibrated_tv(counts[generator.integers(0, len(counts), len(counts))].sum(0), generator)
                      for _ in range(resamples)])
    low, high = np.percentile(boots - (boots.mean() - estimate), [2.5, 97.5])
    return estimate, max(0.0, float(low)), max(0.0, float(high))


def _prompt_tests(per_prompt: dict[str, list[float]], generations: dict[str, int], limit: int = 5) -> list[PromptTest]:
    """Each prompt's PIT on its own (bins: about 10 expected per bin, 2 to ``PIT_BINS``), Holm across prompts."""
    raw = []
    for prompt, values in per_prompt.items():
        bins = max(2, min(PIT_BINS, len(values) // 10))
        if len(values) < 20:
            continue
        raw.append((prompt, len(values), _uniformity(values, bins)[1].p_value))
    adjusted = holm([p for _, _, p in raw])
    tests = [PromptTest(prompt, generations.get(prompt, 0), count, p, adj) for (prompt, count, p), adj in zip(raw, adjusted)]
    return sorted(tests, key=lambda test: test.adjusted_p)[:limit]


def audit_samples(samples: list[Sample], target: Any, *, level: float = 0.01, detect_tv: float = DEFAULT_DETECT_TV,
                  source: str = "samples", eos: set[int] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> ExternalAudit:
    """One-sample audit of ``samples`` against ``target``'s law under each sample's declared
    settings (see the module's docstring). ``eos``: a generation is cut after its first EOS id."""
    _checked(level, detect_tv)
    started = time.perf_counter()
    tokenize, eos_id = target_tokenize(target)
    if tokenize is not None:  # a claim of retokenised ids is checked against the text wherever it can be
        check_retokenized(samples, tokenize, eos_id)
    samples, unknown = usable(samples)
    samples, repeats = distinct_draws(samples)
    if not samples:
        raise SamplesError("no generation has known ids: every text tokenises to another count than the engine reported")
    stop = set(eos or ())
    cache: dict[str, list[int]] = {}
    sequences, policies, mismatched = [], [], set()
    for sample in samples:
        prompt_ids, differs = _prompt_ids(target, sample, cache)
        if differs:
            mismatched.add(sample.prompt)
        tokens = list(sample.token_ids)
        for index, token in enumerate(tokens):
            if token in stop:
                tokens = tokens[: index + 1]
                break
        sequences.append((prompt_ids, tokens))
        policies.append(sample.policy)
    _check_vocabulary(target, samples, sequences)
    longest = max(len(prompt) + len(tokens) for prompt, tokens in sequences)
    limit = getattr(getattr(target.model, "config", None), "max_position_embeddings", None)
    if limit and longest > limit:
        raise SamplesError(f"a prompt with its generation is {longest} tokens, more than the target's {limit}: drop it")
    laws = teacher_forced_batch(target, sequences, policies,
                                on_done=None if progress is None else (lambda done: progress(done, len(sequences))))
    pit = PitSample(generations=len(samples))
    per_generation: list[np.ndarray] = []
    per_prompt: dict[str, list[float]] = {}
    for index, ((prompt_ids, tokens), law) in enumerate(zip(sequences, laws)):
        auxiliary = torch.Generator().manual_seed((AUXILIARY_SEED + index) % 2**63)
        by_position, impossible = pits_of(law, tokens, auxiliary)
        pit.impossible += impossible
        values = list(by_position.values())
        for position, value in by_position.items():
            pit.by_position.setdefault(position, []).append(value)
        per_generation.append(np.asarray(values, dtype=np.float64))
        per_prompt.setdefault(samples[index].prompt, []).extend(values)
    pit.time_s = time.perf_counter() - started
    core = engine_audit(pit, [], [], level=level, implementation="external")
    result = _verdict(core, samples, per_generation, per_prompt, level=level, detect_tv=detect_tv, source=source,
                      design="one-sample: local target", mismatches=len(mismatched), started=started)
    _check_lengths(result, samples, stop)
    _note_repeats(result, repeats)
    if unknown:
        result.notes.append(unknown_note(unknown))
    return result


def _note_repeats(result: ExternalAudit, repeats: Repeats) -> None:
    """Say what repeated lines do to the tests' independence (``samples.distinct_draws``)."""
    result.notes.extend(repeats.notes())
    result.settings["repeated_lines"] = repeats.seeded
    result.settings["repeated_without_seed"] = repeats.unseeded


def vocabulary_size(target: Any) -> int:
    """The ids the target can read and score: its output rows, and its input embedding's rows when fewer."""
    size = int(target.vocab_size)
    embeddings = getattr(target.model, "get_input_embeddings", lambda: None)()
    weight = getattr(embeddings, "weight", None)
    return min(size, int(weight.shape[0])) if weight is not None else size


def _check_vocabulary(target: Any, samples: list[Sample], sequences: list[tuple[list[int], list[int]]]) -> None:
    """Every id (prompt and generation) inside the target's vocabulary, before any forward: an id
    beyond it would index past the embedding (``IndexError`` deep in the model)."""
    size = vocabulary_size(target)
    for sample, (prompt_ids, tokens) in zip(samples, sequences):
        for name, ids in (("prompt_ids", prompt_ids), ("token_ids", tokens)):
            bad = next((token for token in ids if not 0 <= token < size), None)
            if bad is not None:
                raise SamplesError(f"{sample.where or 'a generation'}: {name} holds the id {bad}, outside the target's "
                                   f"vocabulary of {size:,} ids (0 … {size - 1:,}): was the file made with another model?")


def _checked(level: float, detect_tv: float) -> None:
    if not 0 < level < 1:
        raise SamplesError(f"the level must lie in (0, 1), got {level}")
    if not 0 < detect_tv < 1:
        raise SamplesError(f"the TV to detect must lie in (0, 1), got {detect_tv}")


def audit_scored_samples(samples: list[Sample], *, level: float = 0.01, detect_tv: float = DEFAULT_DETECT_TV,
                         source: str = "samples", eos: set[int] | None = None, target: Any = None,
                         score_tolerance: float | None = None) -> ExternalAudit:
    """One-sample audit of ``samples`` against the server's own teacher-forced scores stored in
    them (``server_scores``): the same tests as ``audit_samples``, with each token's PIT from its
    scores (exact where the declared law is settled by the top-k returned, see ``server_scores``).

    The verdict rests on the scores being the engine's true target law (``rests_on`` says so): a
    server that forges scores to match its outputs passes. With ``target``, a sample of the scores
    is recomputed here (``server_scores.cross_check``) and a disagreement fails the verdict."""
    from diagnostics.audit.server_scores import SCORE_TOLERANCE, TRUST_CAVEAT, cross_check, scored_pits

    _checked(level, detect_tv)
    started = time.perf_counter()
    tokenize, eos_id = target_tokenize(target) if target is not None else (None, None)
    if tokenize is not None:
        check_retokenized(samples, tokenize, eos_id)
    samples, unknown = usable(samples)
    samples, repeats = distinct_draws(samples)
    if not any(sample.scores is not None for sample in samples):
        raise SamplesError("no generation carries the server's scores: collect with --oracle server (vLLM or SGLang), "
                           "or audit against --target")
    scored = scored_pits(samples, eos)
    if not scored.pit.by_position and not scored.pit.impossible:
        raise SamplesError(f"the server's scores settle no token ({scored.missing} positions left out): ask for more "
                           "log-probabilities per token, or audit against --target")
    core = engine_audit(scored.pit, [], [], level=level, implementation="external")
    result = _verdict(core, samples, scored.per_generation, scored.per_prompt, level=level, detect_tv=detect_tv,
                      source=source, design="one-sample: server's scores", mismatches=0, started=started)
    _check_lengths(result, samples, set(eos or ()))
    _note_repeats(result, repeats)
    if scored.missing:
        result.notes.append(f"{scored.missing} token positions left out: their scores cannot settle the declared law "
                            "(missing, placeholder 0.0 log-probs, or a cut beyond the top-k returned)")
    if scored.unscored:
        result.notes.append(f"{scored.unscored} generations carry no scores and were left out")
    if unknown:
        result.notes.append(unknown_note(unknown))
    if target is None:
        result.rests_on = TRUST_CAVEAT
        result.notes.append(TRUST_CAVEAT)
        return result
    cache: dict[str, list[int]] = {}
    scored_samples = [sample for sample in samples if sample.scores is not None]  # the cross-check's candidates
    _check_vocabulary(target, scored_samples,
                      [(_prompt_ids(target, sample, cache)[0], list(sample.token_ids)) for sample in scored_samples])
    check = cross_check(samples, target, lambda sample: _prompt_ids(target, sample, cache)[0],
                        tolerance=SCORE_TOLERANCE if score_tolerance is None else score_tolerance)
    result.score_check = asdict(check)
    if not check.positions:
        result.rests_on = TRUST_CAVEAT
        result.notes.append("the server's scores could not be cross-checked against --target (no checkable position); "
                            + TRUST_CAVEAT)
        return result
    result.rests_on = (f"the server's scores being its engine's true target law, cross-checked against --target at "
                       f"{check.positions} positions")
    result.notes.append(check.sentence())
    if not check.agrees:
        result.verdict = "fail"
    return result


def _check_lengths(result: ExternalAudit, samples: list[Sample], eos: set[int]) -> None:
    """Fail ``result`` when generations stopped short of their max_tokens without EOS (probability 0
    under the declared law; the per-token tests cannot see tokens that were dropped)."""
    result.stopped_short = sum(stopped_short(sample, eos) for sample in samples)
    if result.stopped_short:
        result.verdict = "fail"


def unknown_note(count: int) -> str:
    return (f"{count} generations left out: their text tokenises to another count than the engine reported "
            "(a non-canonical split was sampled, so its ids are unknown)")


def _verdict(core: EngineAudit, samples: list[Sample], per_generation: list[np.ndarray], per_prompt: dict[str, list[float]], *,
             level: float, detect_tv: float, source: str, design: str, mismatches: int, started: float) -> ExternalAudit:
    needed = required_samples(detect_tv, PIT_BINS - 1, level / 2, DETECTION_POWER)
    verdict = core.verdict
    if verdict == "pass" and core.detectable_tv > detect_tv:
        verdict = "inconclusive"
    distortion = distortion_estimate(per_generation)
    engines = sorted({sample.engine for sample in samples if sample.engine})
    settings = sorted({sample.settings_key for sample in samples}, key=str)
    return ExternalAudit(
        source=source, design=design, verdict=verdict, generations=len(samples), tokens=core.tokens,
        prompts=len({sample.prompt for sample in samples}), level=level, detect_tv=detect_tv,
        detectable_tv=core.detectable_tv, needed_tokens=needed, statistic=core.statistic, p_value=core.p_value,
        bin_counts=core.bin_counts, positions=core.positions, worst_position=core.worst_position,
        worst_position_p=core.worst_position_p, impossible=core.impossible,
        distortion=None if math.isnan(distortion[0]) else distortion[0],
        distortion_low=None if math.isnan(distortion[1]) else distortion[1],
        distortion_high=None if math.isnan(distortion[2]) else distortion[2],
        worst_prompts=_prompt_tests(per_prompt, _count_by_prompt(samples)), prompt_mismatches=mismatches, engine=", ".join(engines) or None,
        time_s=time.perf_counter() - started,
        settings={"declared": [dict(zip(("temperature", "top_k", "top_p", "min_p"), key)) for key in settings][:10],
                  "speculation": sorted({SPECULATION_WORDS[sample.speculative] for sample in samples})},
    )


def _count_by_prompt(samples: list[Sample]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sample in samples:
        counts[sample.prompt] = counts.get(sample.prompt, 0) + 1
    return counts


def recommended_generations(tokens_per_generation: float, detect_tv: float = DEFAULT_DETECT_TV, level: float = 0.01) -> int:
    """Generations whose tokens detect a PIT-law TV of ``detect_tv`` with ``DETECTION_POWER``."""
    needed = required_samples(detect_tv, PIT_BINS - 1, level / 2, DETECTION_POWER)
    return max(1, math.ceil(needed / max(1.0, tokens_per_generation)))


__all__ = ["DEFAULT_DETECT_TV", "ExternalAudit", "PromptTest", "audit_samples", "audit_scored_samples", "distortion_estimate",
           "recommended_generations", "teacher_forced_batch"]
