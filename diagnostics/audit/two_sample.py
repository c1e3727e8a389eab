"""Two-sample audit: the same engine with speculation on and off should give one output law.

No copy of the weights is needed and numeric differences between engines cancel: a lossless
speculative engine samples exactly the law its own plain decoding samples, whatever kernels both use.

For each prompt (and declared settings), the generations of both sides form a prefix tree. At every
context ``c = (prompt, y_<t)`` that at least ``MIN_CONTEXT`` generations of the two sides reach
together, the next symbol (a token, or the end of the generation) is compared across the sides by
a likelihood-ratio (G) test of homogeneity,

    G_c = 2 Σ_side Σ_v n_side,v · ln(n_side,v · N / (n_side · N_v)),

with symbols seen fewer than ``MIN_EXPECTED`` times in all pooled into one cell (chosen from the
pooled counts, so the choice does not depend on which side saw what). The G statistic of two
samples of whole sequences decomposes exactly into these conditional terms, so under the null
``Σ_c G_c`` is asymptotically χ² with ``Σ_c (K_c − 1)`` degrees of freedom; the sum over the
contexts at depth ``t`` is the test of output position ``t`` (Holm across positions). The pooled
test and the per-position family each get half the level, as in the one-sample audit.

Power: per context, ``λ_c ≥ 4·n_c·TV_c²`` with ``n_c = n_a·n_b/(n_a + n_b)``; a distortion of
TV ``ε`` at every context gives ``λ ≥ 4ε² Σ_c n_c``, which sizes ``detectable_tv``.
Generations censored by the token limit end nowhere: a context at the limit is not tested.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from scipy import stats

from diagnostics.audit.engine_level import PositionTest
from diagnostics.audit.external import DEFAULT_DETECT_TV, ExternalAudit, unknown_note
from diagnostics.audit.rule_level import DETECTION_POWER, holm
from diagnostics.audit.samples import Sample, SamplesError, usable
from diagnostics.gof import detectable_tv, required_samples

MIN_CONTEXT = 20  # generations of both sides together reaching a context before it is tested
MIN_EXPECTED = 5.0  # a symbol seen fewer times (both sides) joins the pooled cell
END = -1  # the "generation ended here" symbol


@dataclass
class ContextTest:
    depth: int
    statistic: float
    dof: int
    weight: float  # n_a·n_b/(n_a + n_b)


def _key(sample: Sample) -> tuple:
    ids = tuple(sample.prompt_ids) if sample.prompt_ids is not None else None
    return (sample.prompt, ids, sample.settings_key)


def _paths(samples: list[Sample], limit: int) -> list[tuple[int, ...]]:
    """Each generation's symbols: its tokens, then ``END`` when it ended before the limit."""
    paths = []
    for sample in samples:
        tokens = tuple(sample.token_ids[:limit])
        paths.append(tokens + ((END,) if len(tokens) < limit else ()))
    return paths


def _context_tests(side_a: list[tuple[int, ...]], side_b: list[tuple[int, ...]]) -> list[ContextTest]:
    """The G test at every context both sides reach ``MIN_CONTEXT`` times together."""
    next_symbols: dict[tuple[int, ...], list[Counter]] = defaultdict(lambda: [Counter(), Counter()])
    for side, paths in enumerate((side_a, side_b)):
        for path in paths:
            for depth, symbol in enumerate(path):
                next_symbols[path[:depth]][side][symbol] += 1
    tests = []
    for context, (count_a, count_b) in next_symbols.items():
        n_a, n_b = sum(count_a.values()), sum(count_b.values())
        if n_a + n_b < MIN_CONTEXT or not n_a or not n_b:
            continue
        both = count_a + count_b
        big = [symbol for symbol, total in both.items() if total >= MIN_EXPECTED]
        cells = [(count_a[symbol], count_b[symbol]) for symbol in big]
        rest = (n_a - sum(a for a, _ in cells), n_b - sum(b for _, b in cells))
        if rest[0] + rest[1] > 0:
            cells.append(rest)
        if len(cells) < 2:
            continue
        total = n_a + n_b
        statistic = 0.0
        for a, b in cells:
            column = a + b
            for observed, row in ((a, n_a), (b, n_b)):
                if observed:
                    statistic += 2.0 * observed * math.log(observed * total / (row * column))
        tests.append(ContextTest(len(context), statistic, len(cells) - 1, n_a * n_b / total))
    return tests


def two_sample_audit(speculative: list[Sample], baseline: list[Sample], *, level: float = 0.01,
                     detect_tv: float = DEFAULT_DETECT_TV, source: str = "samples") -> ExternalAudit:
    """Do ``speculative``'s generations follow the law of ``baseline``'s (the same engine, speculation
    off)? Prompts are matched by prompt, prompt ids and declared settings; see the module docstring."""
    if not 0 < level < 1 or not 0 < detect_tv < 1:
        raise SamplesError(f"the level and the TV to detect must lie in (0, 1), got {level} and {detect_tv}")
    started = time.perf_counter()
    speculative, unknown_a = usable(speculative)
    baseline, unknown_b = usable(baseline)
    groups_a: dict[tuple, list[Sample]] = defaultdict(list)
    groups_b: dict[tuple, list[Sample]] = defaultdict(list)
    for sample in speculative:
        groups_a[_key(sample)].append(sample)
    for sample in baseline:
        groups_b[_key(sample)].append(sample)
    shared = [key for key in groups_a if key in groups_b]
    if not shared:
        raise SamplesError("no prompt with the same declared settings is in both files: the baseline must run the same "
                           "prompts with the same temperature, top-k, top-p and min-p")
    coupled = sum(len({sample.seed for sample in groups_a[key] if sample.seed is not None}
                      & {sample.seed for sample in groups_b[key] if sample.seed is not None}) for key in shared)
    if coupled:
        raise SamplesError(f"{coupled} generations share a prompt and a seed with the baseline: with the same seed a "
                           "lossless engine may return the same text on both sides; collect the baseline with other seeds")
    tests: list[ContextTest] = []
    for key in shared:
        # The token limit both sides were held to: the longest generation seen on either side.
        limit = max(len(sample.token_ids) for sample in groups_a[key] + groups_b[key])
        tests.extend(_context_tests(_paths(groups_a[key], limit), _paths(groups_b[key], limit)))
    statistic = sum(test.statistic for test in tests)
    dof = sum(test.dof for test in tests)
    p_value = float(stats.chi2.sf(statistic, dof)) if dof else 1.0
    by_depth: dict[int, list[ContextTest]] = defaultdict(list)
    for test in tests:
        by_depth[test.depth].append(test)
    raw = [(depth, sum(t.statistic for t in group), sum(t.dof for t in group), len(group)) for depth, group in sorted(by_depth.items())]
    raw_p = [float(stats.chi2.sf(g, d)) for _, g, d, _ in raw]
    adjusted = holm(raw_p)
    positions = [PositionTest(position=depth, tokens=count, statistic=g, p_value=p, adjusted_p=adj)
                 for (depth, g, _, count), p, adj in zip(raw, raw_p, adjusted)]
    worst = min(positions, key=lambda item: item.adjusted_p) if positions else None
    weight = sum(test.weight for test in tests)
    detectable = detectable_tv(max(1, int(weight)), max(1, dof), level / 2, DETECTION_POWER) if tests else 1.0
    failed = p_value < level / 2 or (worst is not None and worst.adjusted_p < level / 2)
    verdict = "fail" if failed else ("inconclusive" if detectable > detect_tv else "pass")
    needed = required_samples(detect_tv, max(1, dof), level / 2, DETECTION_POWER) if verdict == "inconclusive" else 0
    used_a = sum(len(groups_a[key]) for key in shared)
    used_b = sum(len(groups_b[key]) for key in shared)
    notes = [f"two-sample: {used_a} generations with speculation against {used_b} without, {len(shared)} prompts, "
             f"{len(tests)} contexts tested (G = {statistic:.1f}, dof {dof})"]
    if verdict == "inconclusive":
        notes.append(f"about {needed:,} comparable tokens (n_a·n_b/(n_a+n_b) summed over contexts) would detect TV {detect_tv:g}; "
                     f"this sample has {int(weight):,}")
    if unknown_a or unknown_b:
        notes.append(unknown_note(unknown_a) + f" with speculation, {unknown_b} without")
    engines = sorted({sample.engine for sample in speculative if sample.engine})
    return ExternalAudit(
        source=source, design="two-sample: speculation off", verdict=verdict, generations=used_a, tokens=int(weight),
        prompts=len(shared), level=level, detect_tv=detect_tv, detectable_tv=detectable, needed_tokens=needed,
        statistic=statistic, p_value=p_value, positions=positions, worst_position=worst.position if worst else None,
        worst_position_p=worst.adjusted_p if worst else None, engine=", ".join(engines) or None,
        time_s=time.perf_counter() - started, notes=notes,
        settings={"baseline_generations": used_b, "contexts": len(tests), "dof": dof},
    )


__all__ = ["MIN_CONTEXT", "two_sample_audit"]
