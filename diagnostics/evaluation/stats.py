"""A sweep's figures, computed from its stored runs: per run, per rule, paired with intervals.

Per run: acceptance ``α̂`` (accepted / verified), block efficiency, the modelled speed-up (chain:
``(1 − α̂^{γ+1}) / ((1 − α̂)(γc + 1))``; tree: tokens per round / ``(Dc + 1)``), wall time, mean
``TV(P, p)`` and ``TV(P, baseline)`` per token, the path sum ``Σ_t KL(P_t ‖ p_t)`` (by the chain
rule its mean over runs estimates, without bias, the KL of the rule's output law from the
target's sequence law), the target log-likelihood ``Σ_t log p_t(y_t)``, the checker's score, and
the first divergence from the unit's lossless run.

Paired differences: within a unit every member shares the prompt and every uniform, so each
rule is compared with its matched baseline run (and with lossless) unit by unit. Intervals:
95% percentile bootstrap of the mean over units, resampling prompts and, inside each, seeds
(``B`` resamples, fixed generator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from diagnostics.metrics import modelled_speedup, modelled_tree_speedup, verified_acceptance

FIGURES = ("acceptance", "block efficiency", "modelled speed-up", "time s", "TV(P, p)", "TV(P, baseline)", "path KL",
           "log-likelihood", "accuracy", "first divergence")
BOOTSTRAP = 2000


def run_figures(run: Any, reduced: dict[str, Any], checked: float | None, cost: float) -> dict[str, float]:
    """One run's figures (see the module docstring) from its row, its positions reduced by
    ``Store.sweep_position_figures`` and its stored checker score ``checked`` (0 or 1; ``None``
    when its prompt has no checker or the score is missing); ``nan`` where a figure does not apply."""
    alpha = verified_acceptance(int(reduced["accepted"]), int(reduced["rejected"]))
    depth = int(run["gamma"] or 0)
    efficiency = _number(run["block_efficiency"])
    tree = run.get("tree")
    speedup = (modelled_tree_speedup(efficiency, depth, cost) if isinstance(tree, str) and tree
               else modelled_speedup(alpha, depth, cost))
    some = int(reduced["positions"]) > 0
    return {
        "acceptance": alpha,
        "block efficiency": efficiency,
        "modelled speed-up": speedup,
        "time s": _number(run.get("time_s")),
        "TV(P, p)": _number(reduced["tv_target"]) if some else float("nan"),
        "TV(P, baseline)": _number(reduced["tv_baseline"]) if some else float("nan"),
        "path KL": _number(reduced["path_kl"]) if some else float("nan"),
        "log-likelihood": _number(reduced["log_likelihood"]) if some else float("nan"),
        "accuracy": 100.0 * _number(checked),
        "first divergence": _number(run.get("divergence_position")),
    }


def _number(value: Any) -> float:
    return float("nan") if value is None or pd.isna(value) else float(value)


def sweep_table(store: Any, sweep_id: str, cost: float, scores: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per complete run of the sweep: unit, prompt, seed, role, label, the rule a baseline
    is for, and its figures. Accuracy comes from the scores stored with the sweep, or from
    ``scores`` (``run_id → score``, a re-check of this session) where given."""
    if store.get_sweep(sweep_id) is None:
        raise ValueError(f"there is no sweep {sweep_id!r} in {store.path}")
    reduced = {row["run_id"]: row for row in store.sweep_position_figures(sweep_id).to_dict("records")}
    rows = []
    for run in store.sweep_runs(sweep_id).to_dict("records"):
        if run["status"] != "complete":
            continue
        checked = (scores or {}).get(run["run_id"], run.get("score"))
        figures = run_figures(run, reduced[run["run_id"]], checked, cost)
        rows.append({"unit": int(run["unit"]), "prompt_id": run["prompt_id"], "seed": int(run["seed"]), "role": run["role"],
                     "label": run["label"], "rule_for": run["rule_for"], "run_id": run["run_id"], **figures})
    return pd.DataFrame(rows)


def bootstrap_mean(values: pd.Series, prompts: pd.Series, resamples: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` (one per unit) and its 95% percentile interval, resampling prompts and,
    inside each resampled prompt, its units (seeds) with replacement."""
    frame = pd.DataFrame({"value": values.to_numpy(dtype=float), "prompt": prompts.to_numpy()}).dropna()
    if frame.empty:
        return float("nan"), float("nan"), float("nan")
    groups = [group["value"].to_numpy() for _, group in frame.groupby("prompt", sort=True)]
    mean = float(frame["value"].mean())
    if len(frame) < 2:
        return mean, float("nan"), float("nan")
    # Vectorised two-stage resample: prompts with replacement, then each chosen prompt's units.
    sizes = np.array([len(group) for group in groups])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat = np.concatenate(groups)
    widest = int(sizes.max())
    generator = np.random.default_rng(seed)
    chosen = generator.integers(0, len(groups), (resamples, len(groups)))
    picks = np.floor(generator.random((resamples, len(groups), widest)) * sizes[chosen][..., None]).astype(int)
    valid = np.arange(widest)[None, None, :] < sizes[chosen][..., None]
    values = np.where(valid, flat[np.minimum(offsets[chosen][..., None] + picks, flat.size - 1)], 0.0)
    estimates = values.sum(axis=(1, 2)) / valid.sum(axis=(1, 2))
    low, high = np.percentile(estimates, [2.5, 97.5])
    return mean, float(low), float(high)


@dataclass
class RuleSummary:
    """A setting's figures with intervals, and its paired differences."""

    label: str
    role: str
    units: int
    figures: dict[str, tuple[float, float, float]]
    against: str | None  # what the paired differences are against: "baseline of …" or "lossless"
    differences: dict[str, tuple[float, float, float]]
    versus_lossless: dict[str, tuple[float, float, float]]

    def verdict(self) -> str:
        """One line: distortion per token against the baseline, then accuracy and speed-up differences.
        A figure without a value reads "–", and one without an interval (a single unit, a sweep still
        running) is shown without brackets, never as ``[nan, nan]``."""
        parts = [f"{self.label}: distortion {with_interval(self.figures['TV(P, baseline)'], '.3f')} per token vs baseline"]
        accuracy = self.differences.get("accuracy")
        if accuracy is not None and accuracy[0] == accuracy[0]:
            parts.append(f"accuracy {with_interval(accuracy, '+.1f')} points vs {self.against}")
        ll = self.differences.get("log-likelihood")
        if ll is not None and ll[0] == ll[0]:
            parts.append(f"log-likelihood {with_interval(ll, '+.2f')} vs {self.against}")
        speed = self.figures["modelled speed-up"]
        parts.append(f"modelled speed-up {with_interval(speed, '.2f')}×" if speed[0] == speed[0] else "modelled speed-up –")
        return "; ".join(parts)


def with_interval(value: tuple[float, float, float], spec: str) -> str:
    """``mean [low, high]`` in ``spec``; the mean alone where the interval is missing (nan), "–" where the mean is."""
    mean, low, high = value
    if mean != mean:
        return "–"
    return format(mean, spec) + (f" [{format(low, spec)}, {format(high, spec)}]" if low == low and high == high else "")


def summarise_sweep(table: pd.DataFrame) -> list[RuleSummary]:
    """Per setting (label): every figure's mean with its interval; for each rule, the paired
    differences against its baseline run (or lossless when its baseline is ``p``) and against lossless."""
    summaries = []
    if table.empty:
        return summaries
    reference = table[table["role"] == "lossless"].set_index("unit")
    for label, part in table.groupby("label", sort=False):
        role = part["role"].iloc[0]
        figures = {name: bootstrap_mean(part[name], part["prompt_id"]) for name in FIGURES}
        against, differences, versus = None, {}, {}
        if role == "rule":
            baseline = table[(table["role"] == "baseline") & (table["rule_for"] == label)]
            against = baseline["label"].iloc[0] if not baseline.empty else "lossless"
            paired = baseline.set_index("unit") if not baseline.empty else reference
            differences = _paired(part, paired)
            versus = _paired(part, reference)
        summaries.append(RuleSummary(str(label), str(role), int(part["unit"].nunique()), figures, against, differences, versus))
    return summaries


def _paired(part: pd.DataFrame, reference: pd.DataFrame) -> dict[str, tuple[float, float, float]]:
    mine = part.set_index("unit")
    units = mine.index.intersection(reference.index)
    result = {}
    for name in ("accuracy", "log-likelihood", "path KL", "TV(P, p)", "modelled speed-up"):
        difference = mine.loc[units, name] - reference.loc[units, name]
        result[name] = bootstrap_mean(difference, mine.loc[units, "prompt_id"])
    return result


def as_rows(summaries: list[RuleSummary]) -> list[dict[str, Any]]:
    """Plain rows (JSON-safe: ``nan`` as ``None``) for printing or a table."""
    def clean(value: float) -> float | None:
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(float(value), 6)

    rows = []
    for summary in summaries:
        row: dict[str, Any] = {"label": summary.label, "role": summary.role, "units": summary.units}
        for name, (mean, low, high) in summary.figures.items():
            row[name] = [clean(mean), clean(low), clean(high)]
        if summary.role == "rule":
            row["against"] = summary.against
            row["difference vs " + (summary.against or "lossless")] = {name: [clean(v) for v in value] for name, value in summary.differences.items()}
            row["difference vs lossless"] = {name: [clean(v) for v in value] for name, value in summary.versus_lossless.items()}
            row["verdict"] = summary.verdict()
        rows.append(row)
    return rows
