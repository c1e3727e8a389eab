"""External audit: any engine's generations, from a file, against the target's law or a baseline file.

Sizes: ``recommended_generations`` for a TV of 0.05 on the tiny models (about 10 tokens per
generation) is 363; the files below have 400 generations (a tiny-model generation takes about
3 ms batched, the audit of 400 about 0.3 s)."""

from __future__ import annotations

import json

import pytest
from devices import DEVICE

from diagnostics.audit import BATCH_MUTANTS, ENGINE_MUTANTS
from diagnostics.audit.external import audit_samples, recommended_generations
from diagnostics.audit.reporting import evidence_problem, summary_line
from diagnostics.audit.samples import SamplesError, load_samples, write_samples
from diagnostics.audit.suite import engine_samples, plan_engine_audit, tiny_setup
from diagnostics.audit.two_sample import two_sample_audit
from diagnostics.cli import main

GENERATIONS = 400


@pytest.fixture(scope="module")
def setup():
    return tiny_setup(DEVICE)


def _file(setup, tmp_path_factory, implementation: str, first_seed: int = 0, generations: int = GENERATIONS):
    path = tmp_path_factory.mktemp("samples") / f"{implementation}-{first_seed}.jsonl"
    engine_samples(plan_engine_audit(implementation, setup, generations=generations, max_new_tokens=12, first_seed=first_seed),
                   setup, str(path))
    return path


@pytest.fixture(scope="module")
def ours(setup, tmp_path_factory):
    return _file(setup, tmp_path_factory, "ours")


@pytest.fixture(scope="module")
def baseline(setup, tmp_path_factory):
    """Our engine again on other seeds: the same law, as the engine with speculation off must give."""
    return _file(setup, tmp_path_factory, "ours", first_seed=50_000, generations=1000)


def test_the_sample_size_used_here_is_the_recommended_one(ours) -> None:
    samples = load_samples(ours)
    per_generation = sum(len(sample.token_ids) for sample in samples) / len(samples)
    assert recommended_generations(per_generation) <= GENERATIONS


def test_a_file_of_our_engine_passes(setup, ours) -> None:
    result = audit_samples(load_samples(ours), setup.target, eos=setup.eos)
    assert result.verdict == "pass", result.reasons
    assert result.generations == GENERATIONS and result.tokens > 3600 and result.detectable_tv <= 0.05
    assert result.distortion is not None and result.distortion_low <= 0.02 and result.positions
    assert evidence_problem(result.as_dict()) is None


@pytest.mark.parametrize("name", [*ENGINE_MUTANTS, *BATCH_MUTANTS])
def test_a_file_of_each_planted_engine_bug_fails(setup, tmp_path_factory, name: str) -> None:
    samples = load_samples(_file(setup, tmp_path_factory, name))
    result = audit_samples(samples, setup.target, eos=setup.eos)
    assert result.verdict == "fail", result.reasons
    if name != "truncation_dropped":  # that one emits tokens the declared top-k never does: impossible tokens
        assert result.p_value < 1e-6 and result.distortion_low > 0.02


@pytest.mark.slow  # slow tier: transformers' sampling collected and audited (about 30 s)
def test_a_file_of_transformers_sampling_passes(setup, tmp_path_factory) -> None:
    result = audit_samples(load_samples(_file(setup, tmp_path_factory, "transformers")), setup.target, eos=setup.eos)
    assert result.verdict == "pass", result.reasons


def test_a_declared_temperature_that_was_not_used_fails(setup, ours, tmp_path) -> None:
    """Generated at 1.0, declared 0.9: the generations do not follow the declared law."""
    samples = load_samples(ours)
    for sample in samples:
        sample.temperature = 0.9
    declared = write_samples(tmp_path / "declared.jsonl", samples)
    result = audit_samples(load_samples(declared), setup.target, eos=setup.eos)
    assert result.verdict == "fail" and result.p_value < 1e-3, result.reasons


def test_too_few_samples_is_inconclusive_not_pass(setup, ours) -> None:
    result = audit_samples(load_samples(ours)[:30], setup.target, eos=setup.eos)
    assert result.verdict == "inconclusive"
    assert any(reason.startswith("not enough samples to detect TV 0.05") for reason in result.reasons)
    assert result.detectable_tv > 0.05 and result.needed_tokens > result.tokens
    assert "INCONCLUSIVE" in summary_line(result.as_dict())


def test_two_sample_passes_the_same_law_and_fails_a_planted_bug(setup, ours, baseline, tmp_path_factory) -> None:
    same = two_sample_audit(load_samples(ours), load_samples(baseline))
    assert same.verdict != "fail", same.reasons
    for name in ("residual_wrong_position", "row_gets_neighbours_p"):
        wrong = two_sample_audit(load_samples(_file(setup, tmp_path_factory, name)), load_samples(baseline))
        assert wrong.verdict == "fail" and wrong.p_value < 1e-6, (name, wrong.reasons)


@pytest.mark.slow  # slow tier: repeated two-sample tests for the false-alarm rate (about 19 s)
def test_two_sample_false_alarm_rate_is_at_most_the_level(setup, tmp_path_factory) -> None:
    """Twenty pairs of files of the same law (disjoint seeds): at level 0.01 a false alarm in any
    of them has probability about 0.18; seeing two or more would say the test is anti-conservative."""
    files = [load_samples(_file(setup, tmp_path_factory, "ours", first_seed=100_000 + 500 * index, generations=200))
             for index in range(40)]
    alarms = sum(two_sample_audit(files[2 * index], files[2 * index + 1]).verdict == "fail" for index in range(20))
    assert alarms <= 1


def test_two_sample_needs_matching_prompts_and_settings(ours, tmp_path) -> None:
    samples = load_samples(ours)
    for sample in samples:
        sample.temperature = 0.7
    with pytest.raises(SamplesError, match="same declared settings"):
        two_sample_audit(load_samples(ours), samples)


@pytest.mark.parametrize("line, message", [
    ("not json", "line 1 is not a JSON object"),
    ('{"prompt": "a", "token_ids": [1]}', "lacks 'temperature'"),
    ('{"prompt": "a", "token_ids": [1, -2], "temperature": 1}', "token ids"),
    ('{"prompt": "a", "token_ids": [1], "temperature": -1}', "temperature must be >= 0"),
    ('{"prompt": "a", "token_ids": [1], "temperature": 1, "top_p": 2}', "top_p"),
    ('{"prompt": "", "token_ids": [1], "temperature": 1}', "prompt is empty"),
    ('[1, 2]', "expected a JSON object"),
])
def test_bad_samples_files_get_one_line_errors(tmp_path, capsys, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    before = path.read_bytes()
    assert main(["audit", "--samples", str(path), "--target", "tiny"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and message in error, error
    assert path.read_bytes() == before


def test_missing_or_empty_files_and_missing_oracle_are_one_line_errors(ours, tmp_path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    for argv, message in ((["--samples", str(tmp_path / "nope.jsonl"), "--target", "tiny"], "no samples file"),
                          (["--samples", str(empty), "--target", "tiny"], "has no generations"),
                          (["--samples", str(ours)], "give --target"),
                          (["--baseline-samples", str(ours)], "give both"),
                          (["--write-samples", str(tmp_path / "x.jsonl")], "add --engine")):
        assert main(["audit", *argv]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and message in error, error


def test_cli_audits_a_file_saves_it_and_a_report_shows_it(ours, baseline, tmp_path, capsys) -> None:
    from diagnostics.report import build_report
    from diagnostics.store import Store

    db = tmp_path / "runs.duckdb"
    assert main(["audit", "--samples", str(ours), "--target", "tiny", "--save", "--db", str(db)]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["layer"] == "external" and one["verdict"] == "pass" and one["design"].startswith("one-sample")
    assert main(["audit", "--samples", str(ours), "--baseline-samples", str(baseline), "--save", "--db", str(db)]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["design"].startswith("two-sample") and two["verdict"] in ("pass", "inconclusive")
    store = Store(db, read_only=True)
    audits = store.list_audits()
    assert len(audits) == 2 and set(audits["layer"]) == {"external"}
    for audit_id in audits["audit_id"]:
        assert evidence_problem(store.get_audit(audit_id)["evidence"]) is None
    report = build_report(store, [], audits["audit_id"].tolist())
    assert "external audit" in report and "one-sample: local target" in report


def test_rule_level_samples_as_a_number_still_means_draws(capsys) -> None:
    assert main(["audit", "--samples", "5000"]) == 0
    assert json.loads(capsys.readouterr().out)["n_per_pair"] == 5000


def _pit_generations(seed: int, excess: float, generations: int = 100, tokens: int = 40):
    """Simulated PIT values: uniform, except that a share ``excess`` falls in the first of 20 bins;
    the binned law's TV from uniform is ``excess · (1 − 1/20)``."""
    import numpy as np

    generator = np.random.default_rng(seed)
    out = []
    for _ in range(generations):
        values = generator.random(tokens)
        moved = generator.random(tokens) < excess
        values[moved] = generator.random(int(moved.sum())) / 20
        out.append(values)
    return out


@pytest.mark.slow  # slow tier: repeated audits for the estimator's coverage (about 17 s)
def test_the_distortion_estimate_is_unbiased_and_its_interval_covers_the_truth() -> None:
    """The estimate tracks a known distortion from 0 to 0.14 (subtracting uniform noise, the old
    estimator, gave 0.116 for 0.143: the control below), and the interval holds both the estimate
    and, at nominal 95%, the truth: at least 16 of 20 samples (P(fewer) ≈ 0.003 at 95% coverage)."""
    import numpy as np

    from diagnostics.audit.external import PIT_BINS, distortion_estimate

    for excess in (0.0, 0.05, 0.15):
        truth = excess * (1 - 1 / PIT_BINS)
        estimates, covered = [], 0
        for seed in range(20):
            estimate, low, high = distortion_estimate(_pit_generations(100 + seed, excess), resamples=200, seed=seed)
            assert low <= estimate <= high
            estimates.append(estimate)
            covered += low <= truth <= high
        assert abs(np.mean(estimates) - truth) < 0.01, (excess, np.mean(estimates))  # near 0: clipping at 0 (0.008)
        assert covered >= 16, (excess, covered)

    # Negative control: the old estimator (plug-in minus the plug-in of uniform noise at the same n)
    # misses the largest truth by more than the tolerance above (0.027).
    def plug_in(values: np.ndarray) -> float:
        counts = np.histogram(values, bins=PIT_BINS, range=(0.0, 1.0))[0]
        return 0.5 * float(np.abs(counts / counts.sum() - 1 / PIT_BINS).sum())

    generator = np.random.default_rng(0)
    pooled = np.concatenate(_pit_generations(100, 0.15))
    old = plug_in(pooled) - np.mean([plug_in(generator.random(pooled.size)) for _ in range(50)])
    assert 0.15 * (1 - 1 / PIT_BINS) - old > 0.02


def test_generations_without_pit_values_do_not_empty_the_interval() -> None:
    """Generations whose scores were all missing have no PIT values. A bootstrap resample drawn
    only from them had no law (0/0): the interval came out [0, 0] under an estimate of 0.24. They
    carry no information, so the estimate and interval are those of the other generations."""
    import warnings

    import numpy as np

    from diagnostics.audit.external import distortion_estimate

    values = _pit_generations(7, 0.3, generations=4, tokens=30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with_empty = distortion_estimate([*([np.array([])] * 12), *values], resamples=200)
    assert with_empty == distortion_estimate(values, resamples=200)
    estimate, low, high = with_empty
    assert estimate > 0.1 and low <= estimate <= high and high > low


def test_settings_read_as_words_not_python() -> None:
    """The Audit page's settings line: no ``False``, ``None`` or snake_case for a person."""
    from diagnostics.audit.reporting import readable_settings

    line = readable_settings({"declared": [{"temperature": 1.0, "top_k": 20, "top_p": None, "min_p": None}],
                              "speculation": ["off", "on"], "flag": True})
    assert line == "declared temperature 1, top k 20, top p –, min p – · speculation off, on · flag on"
    assert "False" not in readable_settings({"speculative": False}) and "None" not in readable_settings({"x": None})


def test_summary_line_shows_an_absent_number_as_a_dash() -> None:
    """One renderer for numbers (``reporting.number``): an absent p or detectable TV reads "–", as in the tables."""
    engine = {"layer": "engine", "verdict": "inconclusive", "implementation": "ours", "tokens": 0, "generations": 3,
              "p_value": None, "detectable_tv": None, "reasons": []}
    assert "pooled PIT p = – · detects PIT-law TV ≥ – ·" in summary_line(engine)
    external = {"layer": "external", "verdict": "pass", "implementation": "external", "tokens": 1200, "generations": 100,
                "prompts": 2, "p_value": 0.5, "detectable_tv": 0.04, "distortion": 0.01, "distortion_low": None,
                "distortion_high": 0.03, "reasons": []}
    assert "p = 0.5 · detects TV ≥ 0.040 · distortion 0.010 [–, 0.030]" in summary_line(external)
