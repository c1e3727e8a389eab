"""Two-sample audit: two samples of one engine (speculation on and off) should give one output law.

No copy of the weights is needed and numeric differences between engines cancel: a lossless
speculative engine samples exactly the law its own plain decoding samples, whatever kernels both use.

For each prompt (and declared settings), the generations of both sides form a prefix tree. At every
context ``c = (prompt, y_<t)`` that at least ``MIN_CONTEXT`` generations of the two sides reach
together, the next symbol (a token, or the end of the generation) is compared across the sides by
a likelihood-ratio (G) test of homogeneity,

    G_c = 2 Σ_side Σ_v n_side,v · ln(n_side,v · N / (n_side · N_v)),

divided by Williams' correction ``q``, with a symbol its own cell only where the *smaller* side
expects ``MIN_EXPECTED`` of it (``min(n_a, n_b)·N_v/N ≥ 5``), the rest pooled (the cells are chosen
from the pooled counts, so the choice does not depend on which side saw what). The G statistic of two
samples of whole sequences decomposes exactly into these conditional terms, so under the null
``Σ_c G_c`` is asymptotically χ² with ``Σ_c (K_c − 1)`` degrees of freedom; the sum over the
contexts at depth ``t`` is the test of output position ``t`` (Holm across positions; its
``tokens`` are the symbols compared there, both sides). The pooled G test and the per-position
family each get half the level, as in the one-sample audit.

The tree is walked depth by depth, and only the generations of a context both sides reach with
``MIN_CONTEXT`` generations in all go one level deeper (no deeper context can be tested otherwise):
time and memory are linear in the tokens walked (no prefix is ever copied), so two single
32,768-token generations cost nothing and ``MAX_TOKENS``-long files stay within memory.

Power: per context, ``λ_c ≥ 4·n_c·TV_c²`` with ``n_c = n_a·n_b/(n_a + n_b)``; a distortion of
TV ``ε`` at every context gives ``λ ≥ 4ε² Σ_c n_c``, which sizes ``detectable_tv``.

The token limit is each line's own: its ``max_tokens``, else (no limit declared) the longest
generation of its prompt's group, both sides. A generation is compared up to its own limit: one
that reaches it ends nowhere (it is censored there and takes no part in deeper contexts), so an
engine that overshoots its ``max_tokens`` by whole speculation rounds is not mistaken for another
law, and one line's small limit censors that line only, never its group. Censoring by a limit
fixed before sampling leaves every law at a shallower context unchanged, so the tests stay exact.
Tokens a file holds within its group's largest limit but past their own line's are counted: when
they are most of the tokens, the comparison rests on what is left and cannot pass (inconclusive),
and the note says so; how many generations exceeded their limit is said too.
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
from diagnostics.audit.samples import Sample, SamplesError, distinct_draws, usable
from diagnostics.gof import detectable_tv, required_samples

MIN_CONTEXT = 20  # generations of both sides together reaching a context before it is tested
MIN_EXPECTED = 5.0  # a symbol the smaller side expects fewer times of joins the pooled cell
END = -1  # the "generation ended here" symbol


@dataclass
class ContextTest:
    depth: int
    statistic: float
    dof: int
    weight: float  # n_a·n_b/(n_a + n_b)
    symbols: int  # n_a + n_b: the next symbols compared at this context


def _key(sample: Sample) -> tuple:
    ids = tuple(sample.prompt_ids) if sample.prompt_ids is not None else None
    return (sample.prompt, ids, sample.settings_key)


def _limits(samples: list[Sample], fallback: int) -> list[int]:
    """Each generation's own token limit: its declared ``max_tokens``, else ``fallback`` (the
    longest generation of its prompt's group, both sides: the limit both were held to)."""
    return [sample.max_tokens if sample.max_tokens is not None else fallback for sample in samples]


def _over_limit(samples: list[Sample]) -> int:
    """Generations longer than their own declared ``max_tokens``."""
    return sum(sample.max_tokens is not None and len(sample.token_ids) > sample.max_tokens for sample in samples)


def _paths(samples: list[Sample], limits: list[int]) -> list[tuple[int, ...]]:
    """Each generation's symbols: its tokens up to its own limit, then ``END`` when it ended before
    it; a generation with no symbol (limit 0) is left out."""
    paths = []
    for sample, limit in zip(samples, limits):
        tokens = tuple(sample.token_ids[:limit])
        path = tokens + ((END,) if len(tokens) < limit else ())
        if path:
            paths.append(path)
    return paths


@dataclass
class Censoring:
    """What the lines' own limits cut: ``cut`` of the ``held`` tokens within each group's largest
    limit lie past their own line's limit, in ``lines`` generations whose limit is below it."""

    lines: int = 0
    cut: int = 0
    held: int = 0
    smallest: int | None = None
    largest: int | None = None

    def add(self, samples: list[Sample], limits: list[int], widest: int) -> None:
        for sample, limit in zip(samples, limits):
            within = min(len(sample.token_ids), widest)
            self.held += within
            if limit < widest:
                self.lines += 1
                self.cut += max(0, within - limit)
                self.smallest = limit if self.smallest is None else min(self.smallest, limit)
                self.largest = widest if self.largest is None else max(self.largest, widest)

    @property
    def most(self) -> bool:
        """Whether the limits cut away most of this side's evidence (more than half its tokens held):
        a context is compared only where both sides reach it, so that is most of the comparison's."""
        return self.cut * 2 > self.held


def _g_test(depth: int, count_a: Counter, count_b: Counter) -> ContextTest | None:
    """The G test of homogeneity of one context's next symbols, or ``None`` when it has no two cells.

    A cell's expected count on side ``s`` is ``n_s·N_v/N``; a symbol is a cell of its own when that
    is at least ``MIN_EXPECTED`` on the *smaller* side, the others are pooled, and a pooled cell
    below it joins the smallest kept cell. (Pooling by the total count ``N_v`` alone left cells
    expecting 0.3 on the smaller side when the sides were 100 against 1,600 generations, and the χ²
    approximation then rejected a true null at p < 0.05 in 27% of samples.) The cells depend only on
    the pooled counts and the sides' sizes, never on which side saw what."""
    n_a, n_b = sum(count_a.values()), sum(count_b.values())
    total = n_a + n_b
    both = count_a + count_b
    smaller = min(n_a, n_b)
    big = sorted((symbol for symbol, column in both.items() if smaller * column >= MIN_EXPECTED * total),
                 key=lambda symbol: (both[symbol], str(symbol)))
    cells = [[count_a[symbol], count_b[symbol]] for symbol in big]
    rest = [n_a - sum(a for a, _ in cells), n_b - sum(b for _, b in cells)]
    if rest[0] + rest[1] > 0:
        if smaller * (rest[0] + rest[1]) >= MIN_EXPECTED * total or not cells:
            cells.append(rest)
        else:  # too few to stand alone: merged into the smallest kept cell
            cells[0] = [cells[0][0] + rest[0], cells[0][1] + rest[1]]
    if len(cells) < 2:
        return None
    statistic = 0.0
    for a, b in cells:
        column = a + b
        for observed, row in ((a, n_a), (b, n_b)):
            if observed:
                statistic += 2.0 * observed * math.log(observed * total / (row * column))
    # Williams' correction of a 2×K table, q = 1 + (N·Σ 1/n_s − 1)(N·Σ 1/N_v − 1) / (6N(K − 1)): the
    # G statistic's mean exceeds its χ² degrees of freedom by that factor at small counts.
    k = len(cells)
    q = 1.0 + (total * (1 / n_a + 1 / n_b) - 1) * (total * sum(1 / (a + b) for a, b in cells) - 1) / (6 * total * (k - 1))
    return ContextTest(depth, statistic / q, k - 1, n_a * n_b / total, total)


def _context_tests(side_a: list[tuple[int, ...]], side_b: list[tuple[int, ...]]) -> list[ContextTest]:
    """The G test at every context both sides reach ``MIN_CONTEXT`` times together, depth by depth:
    a context's generations go one level deeper only when it is testable (its children are reached
    by no more generations), so memory holds one level's groups, linear in the generations."""
    groups: list[list[tuple[int, tuple[int, ...]]]] = [[(0, path) for path in side_a] + [(1, path) for path in side_b]]
    tests: list[ContextTest] = []
    depth = 0
    while groups:
        following: dict[tuple[int, int], list[tuple[int, tuple[int, ...]]]] = {}
        for index, group in enumerate(groups):
            counts = (Counter(), Counter())
            for side, path in group:
                counts[side][path[depth]] += 1
            if len(group) < MIN_CONTEXT or not counts[0] or not counts[1]:
                continue  # untestable, and so is every context below it
            test = _g_test(depth, *counts)
            if test is not None:
                tests.append(test)
            for side, path in group:
                if depth + 1 < len(path):  # END is a path's last symbol: it has no children
                    following.setdefault((index, path[depth]), []).append((side, path))
        groups = list(following.values())
        depth += 1
    return tests


def _sides(side_a: list[Sample], side_b: list[Sample]) -> tuple[str, str]:
    """How to name the two samples: by their ``speculative`` fields when those say on and off."""
    if {sample.speculative for sample in side_a} == {True} and {sample.speculative for sample in side_b} == {False}:
        return "with speculation", "without"
    return "of sample A", "of sample B"


def two_sample_audit(speculative: list[Sample], baseline: list[Sample], *, level: float = 0.01,
                     detect_tv: float = DEFAULT_DETECT_TV, source: str = "samples") -> ExternalAudit:
    """Do ``speculative``'s generations (sample A) follow the law of ``baseline``'s (sample B: the same
    engine, speculation off)? Prompts are matched by prompt, prompt ids and declared settings; see the
    module docstring."""
    if not 0 < level < 1 or not 0 < detect_tv < 1:
        raise SamplesError(f"the level and the TV to detect must lie in (0, 1), got {level} and {detect_tv}")
    started = time.perf_counter()
    speculative, unknown_a = usable(speculative)
    baseline, unknown_b = usable(baseline)
    speculative, repeats_a = distinct_draws(speculative)
    baseline, repeats_b = distinct_draws(baseline)
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
    over_a = over_b = 0
    censoring = (Censoring(), Censoring())  # sample A's, sample B's
    for key in shared:
        group_a, group_b = groups_a[key], groups_b[key]
        fallback = max(len(sample.token_ids) for sample in group_a + group_b)
        limits_a, limits_b = _limits(group_a, fallback), _limits(group_b, fallback)
        widest = max(limits_a + limits_b)
        censoring[0].add(group_a, limits_a, widest)
        censoring[1].add(group_b, limits_b, widest)
        over_a, over_b = over_a + _over_limit(group_a), over_b + _over_limit(group_b)
        paths_a, paths_b = _paths(group_a, limits_a), _paths(group_b, limits_b)
        if paths_a and paths_b:
            tests.extend(_context_tests(paths_a, paths_b))
    statistic = sum(test.statistic for test in tests)
    dof = sum(test.dof for test in tests)
    p_value = float(stats.chi2.sf(statistic, dof)) if dof else 1.0
    by_depth: dict[int, list[ContextTest]] = defaultdict(list)
    for test in tests:
        by_depth[test.depth].append(test)
    raw = [(depth, sum(t.statistic for t in group), sum(t.dof for t in group), sum(t.symbols for t in group))
           for depth, group in sorted(by_depth.items())]
    raw_p = [float(stats.chi2.sf(g, d)) for _, g, d, _ in raw]
    adjusted = holm(raw_p)
    positions = [PositionTest(position=depth, tokens=count, statistic=g, p_value=p, adjusted_p=adj)
                 for (depth, g, _, count), p, adj in zip(raw, raw_p, adjusted)]
    worst = min(positions, key=lambda item: item.adjusted_p) if positions else None
    weight = sum(test.weight for test in tests)
    detectable = detectable_tv(max(1, int(weight)), max(1, dof), level / 2, DETECTION_POWER) if tests else 1.0
    failed = p_value < level / 2 or (worst is not None and worst.adjusted_p < level / 2)
    verdict = "fail" if failed else ("inconclusive" if detectable > detect_tv or any(side.most for side in censoring) else "pass")
    needed = required_samples(detect_tv, max(1, dof), level / 2, DETECTION_POWER) if verdict == "inconclusive" else 0
    used_a = sum(len(groups_a[key]) for key in shared)
    used_b = sum(len(groups_b[key]) for key in shared)
    name_a, name_b = _sides(speculative, baseline)
    notes = [f"two-sample: {used_a} generations {name_a} against {used_b} {name_b}, {len(shared)} prompts, "
             f"{len(tests)} contexts tested (G = {statistic:.1f}, dof {dof}; a position's tokens are the next "
             "symbols compared there, both samples)"]
    if verdict == "inconclusive":
        notes.append(f"about {needed:,} comparable tokens (n_a·n_b/(n_a+n_b) summed over contexts) would detect TV {detect_tv:g}; "
                     f"this sample has {int(weight):,}")
    for side, name in zip(censoring, (name_a, name_b)):
        if side.lines:
            share = side.cut / side.held if side.held else 0.0
            notes.append(f"{side.lines} generations {name} declare a smaller max_tokens than the largest of their prompt "
                         f"({side.smallest} against up to {side.largest}): each is compared up to its own limit, which "
                         f"leaves out {side.cut:,} of the {side.held:,} tokens they hold ({share:.0%})"
                         + ("; that is most of the evidence, so the comparison cannot pass: collect with one max_tokens"
                            if side.most else ""))
    if over_a or over_b:
        notes.append(f"{over_a + over_b} generations ({over_a} {name_a}, {over_b} {name_b}) are longer than their declared "
                     "max_tokens: compared up to it (an engine that overshoots by whole rounds is not another law)")
    for repeats, name in ((repeats_a, name_a), (repeats_b, name_b)):
        notes.extend(f"{note} ({name})" for note in repeats.notes())
    if unknown_a or unknown_b:
        notes.append(unknown_note(unknown_a + unknown_b) + f" ({unknown_a} {name_a}, {unknown_b} {name_b})")
    engines = sorted({sample.engine for sample in speculative if sample.engine})
    return ExternalAudit(
        source=source, design="two-sample: speculation off" if name_b == "without" else "two-sample: baseline sample",
        verdict=verdict, generations=used_a, tokens=int(weight),
        prompts=len(shared), level=level, detect_tv=detect_tv, detectable_tv=detectable, needed_tokens=needed,
        statistic=statistic, p_value=p_value, positions=positions, worst_position=worst.position if worst else None,
        worst_position_p=worst.adjusted_p if worst else None, engine=", ".join(engines) or None,
        time_s=time.perf_counter() - started, notes=notes,
        settings={"baseline_generations": used_b, "contexts": len(tests), "dof": dof,
                  "longer_than_max_tokens": over_a + over_b, "censored_lines": sum(side.lines for side in censoring),
                  "censored_tokens": sum(side.cut for side in censoring), "tokens_held": sum(side.held for side in censoring),
                  "repeated_lines": repeats_a.seeded + repeats_b.seeded,
                  "repeated_without_seed": repeats_a.unseeded + repeats_b.unseeded},
    )


__all__ = ["MIN_CONTEXT", "two_sample_audit"]
