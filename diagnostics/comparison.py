"""Coupled groups over several rules and seeds: plan, run as one batch, summarise across seeds.

A group runs every rule at every seed on one prompt; within a seed the runs share every uniform
(``diagnostics.rng``), so they stay identical until a rule decides differently. The first rule
of each seed is that seed's reference; each member's ``divergence_position`` is its first
divergence from the reference of its own seed. The members are the rows of one batch
(``engine.generate_batch``), each stored as it runs, so a group stopped half-way keeps every
member up to where it was, marked ``interrupted``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pandas as pd

from diagnostics.engine import EngineError, PositionRecord, Run
from diagnostics.metrics import log_likelihood, noise_as_zero, verified_acceptance
from diagnostics.rules import split_specs
from diagnostics.request import RunRequest, batch_key
from diagnostics.runner import first_divergence, record_batch
from diagnostics.models import LoadedModel
from diagnostics.store import Store

MAX_SEEDS = 32


def parse_seeds(text: str) -> list[int]:
    """``"0"``, ``"0,1,2"`` or ``"0-4"`` (mixed freely) → distinct seeds in order, at most ``MAX_SEEDS``."""
    seeds: list[int] = []
    for piece in [piece.strip() for piece in str(text).replace(";", ",").split(",") if piece.strip()]:
        match = re.fullmatch(r"([0-9]{1,12})(?:\s*-\s*([0-9]{1,12}))?", piece)
        if match is None:
            raise EngineError(f"seeds: {piece!r} is not a seed or a range; write e.g. 0, 0,1,2 or 0-4")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise EngineError(f"seeds: the range {piece!r} runs backwards; write {high}-{low}")
        if high - low >= MAX_SEEDS:
            raise EngineError(f"seeds: at most {MAX_SEEDS} seeds per group")
        seeds += [seed for seed in range(low, high + 1) if seed not in seeds]
    if not seeds:
        raise EngineError("seeds: give at least one seed, e.g. 0 or 0-4")
    if len(seeds) > MAX_SEEDS:
        raise EngineError(f"seeds: at most {MAX_SEEDS} seeds per group, got {len(seeds)}")
    return seeds


def plan_group(rules: str | list[str], seeds: list[int], base: RunRequest) -> list[RunRequest]:
    """One request per (seed, rule), seed by seed, the reference rule first within each seed."""
    specs = split_specs(rules) if isinstance(rules, str) else list(rules)
    if not specs:
        raise EngineError("give at least one rule, e.g. lossless, lenience:0.5")
    requests = [replace(base, rule=spec, seed=seed) for seed in seeds for spec in specs]
    for request in requests:
        request.validate()
    return requests


def member_label(row: dict[str, Any], reference: dict[str, Any]) -> str:
    """How a member is named in a group: its rule, its tree shape if it has one, and the policy
    settings where they differ from its seed's reference (a matched baseline's truncation)."""
    from diagnostics.untrusted_json import loads

    label = str(row.get("rule"))
    tree = row.get("tree")
    if isinstance(tree, str) and tree:
        label += f" · tree {tree}" + (f" ({row.get('tree_children')})" if row.get("tree_children") not in (None, "top") else "")
    elif isinstance(reference.get("tree"), str) and reference.get("tree"):
        label += f" · chain γ={row.get('gamma')}"
    try:
        # Stored JSON (maybe a shared file's): bounded parse, like every untrusted document.
        mine, theirs = (loads(row.get("policy") or "{}", "a run's policy", allow_non_finite=True),
                        loads(reference.get("policy") or "{}", "a run's policy", allow_non_finite=True))
    except (TypeError, ValueError):
        return label
    changed = [f"{key.replace('_', '-')} {value:g}" if isinstance(value, float) else f"{key.replace('_', '-')} {value}"
               for key, value in sorted(mine.items()) if theirs.get(key) != value and value is not None]
    return label + (f" · baseline policy {', '.join(changed)}" if changed else "")


def run_group(
    store: Store,
    target: Any,
    draft: Any,
    requests: list[RunRequest],
    *,
    group_id: str | None = None,
    on_record_for: Callable[[int, RunRequest], Callable[[PositionRecord], None] | None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    batch_size: int | None = None,
) -> tuple[str, list[tuple[str, Run]], dict[str, int | None]]:
    """Run the members as rows of one batch (``runner.record_batch``), each stored as it runs, then
    store each one's divergence from its seed's reference; returns the group id, the runs (in
    member order) and each run's divergence (``None``: the reference, or never). ``should_stop``
    (or an interruption) ends every member in flight after its current round, kept
    ``interrupted``; members that had not started (a ``batch_size`` below the group's size) do not."""
    group_id = group_id or uuid.uuid4().hex[:12]
    # Members that share a drafter and shape run as one batch; a group comparing shapes (a chain and
    # a tree) runs one batch per shape, in the order the shapes first appear.
    batches: dict[tuple, list[int]] = {}
    for index, request in enumerate(requests):
        batches.setdefault(batch_key(request), []).append(index)
    stored: list[tuple[str | None, Run | None]] = [(None, None)] * len(requests)
    for indices in batches.values():
        if should_stop is not None and any(run is not None for _, run in stored) and should_stop():
            break
        per_member = None if on_record_for is None else (lambda row, request, _i=indices: on_record_for(_i[row], request))
        for index, result in zip(indices, record_batch(store, target, draft, [requests[i] for i in indices], group_ids=group_id,
                                                       on_record_for=per_member, should_stop=should_stop, batch_size=batch_size)):
            stored[index] = result
    results = [(run_id, run) for run_id, run in stored if run_id is not None]
    divergence = divergences([(request.seed, run_id, run) for request, (run_id, run) in zip(requests, stored)
                              if run_id is not None])
    store.set_group([run_id for run_id, _ in results], group_id, divergence)
    return group_id, results, divergence


def divergences(members: list[tuple[int, str, Run]]) -> dict[str, int | None]:
    """Each member's first divergence from its seed's reference (the seed's first member): ``None`` for
    the reference itself and for a member that never left it."""
    references: dict[int, Run] = {}
    found: dict[str, int | None] = {}
    for seed, run_id, run in members:
        reference = references.setdefault(seed, run)
        found[run_id] = None if reference is run else first_divergence(reference, run)
    return found


def group_status(members: pd.DataFrame) -> str:
    """``interrupted`` when a member was stopped or failed, else ``complete`` (or ``running``)."""
    statuses = set(members["status"].tolist())
    if statuses & {"interrupted", "failed"}:
        return "interrupted"
    return "running" if "running" in statuses else "complete"


def references(members: pd.DataFrame) -> dict[int, str]:
    """Each seed's reference run id (``members`` ordered by creation): its first member with no stored
    divergence, the run the others were measured against; else its first member (a file holding part
    of a group). Creation order alone is not enough: a lossless run recorded beside an earlier lossy
    one (``coupling.couple``) joins the group after it."""
    found: dict[int, str] = {}
    first: dict[int, str] = {}
    for row in members.itertuples():
        first.setdefault(int(row.seed), row.run_id)
        if pd.isna(getattr(row, "divergence_position", None)):
            found.setdefault(int(row.seed), row.run_id)
    return {seed: found.get(seed, run_id) for seed, run_id in first.items()}


def reference_first(members: pd.DataFrame) -> pd.DataFrame:
    """``members`` (creation order) with each seed's reference (``references``) moved to the front
    of its seed's members, seeds in order of first appearance: a lossless run recorded after the
    lossy run it was coupled with (Inspect's "first divergence") is still named first."""
    if members.empty:
        return members
    refs = set(references(members).values())
    seeds = list(dict.fromkeys(int(seed) for seed in members["seed"]))
    key = [(seeds.index(int(row.seed)), row.run_id not in refs, index) for index, row in enumerate(members.itertuples())]
    order = sorted(range(len(members)), key=key.__getitem__)
    return members.iloc[order].reset_index(drop=True)


def seed_references(members: pd.DataFrame) -> dict[int, str | None]:
    """Each seed's reference run id, or ``None`` where the file lacks it: a seed's first member that
    has a divergence of its own was measured against a run not here (one member exported alone).
    ``members`` ordered by creation (``Store.group``)."""
    found: dict[int, str | None] = {}
    for seed, run_id in references(members).items():
        stored = members.loc[members["run_id"] == run_id, "divergence_position"].iloc[0]
        found[seed] = run_id if pd.isna(stored) else None
    return found


def positions_divergence(reference: pd.DataFrame, other: pd.DataFrame) -> int | None:
    """``runner.first_divergence`` over two stored runs' positions (ordered by position): the first
    position where they decide differently (kind or token), else where the shorter one ends,
    else ``None``."""
    for left, right in zip(reference[["position", "kind", "token"]].itertuples(index=False),
                           other[["kind", "token"]].itertuples(index=False)):
        if left.kind != right.kind or _token(left.token) != _token(right.token):
            return int(left.position)
    if len(reference) != len(other):
        return min(len(reference), len(other))
    return None


def _token(value: Any) -> int | None:
    """A stored token id, ``None`` where a file left it empty (NA compares as neither equal nor not)."""
    return None if pd.isna(value) else int(value)


def member_figures(member: Any, positions: pd.DataFrame) -> dict[str, float]:
    """A member's per-run figures: ``α̂`` (accepted / verified), block efficiency, mean ``TV(P, p)``,
    the target log-likelihood of the output."""
    kinds = positions["kind"].value_counts() if len(positions) else {}
    return {
        "acceptance α": verified_acceptance(int(kinds.get("accepted", 0)), int(kinds.get("rejected", 0))),
        "block efficiency": _float(member.block_efficiency),
        "mean TV(P, p)": noise_as_zero(_float(member.mean_tv_target)),  # a lossless run's 8e-16 is 0
        "log-likelihood": log_likelihood(positions["p_token"]) if len(positions) else float("nan"),
    }


def _float(value: Any) -> float:
    return float("nan") if value is None or pd.isna(value) else float(value)


def summarise(members: pd.DataFrame, figures: dict[str, dict[str, float]]) -> pd.DataFrame:
    """One row per rule across seeds: seeds, mean and standard deviation (``NAME sd``) of each figure
    in ``figures[run_id]``, the mean first-divergence position over the seeds that diverged and
    how many never did."""
    rows = []
    refs = set(references(members).values())
    for rule, part in members.groupby("rule", sort=False):
        row: dict[str, Any] = {"rule": rule, "seeds": int(part["seed"].nunique())}
        names = list(dict.fromkeys(name for run_id in part["run_id"] for name in figures[run_id]))
        for name in names:
            values = pd.Series([figures[run_id][name] for run_id in part["run_id"]], dtype="float64").dropna()
            row[name] = values.mean() if len(values) else float("nan")
            row[f"{name} sd"] = values.std(ddof=1) if len(values) > 1 else float("nan")
        if set(part["run_id"]) <= refs:
            row["first divergence"] = "reference"
        else:
            diverged = part["divergence_position"].dropna().astype(float)
            never = int(part["divergence_position"].isna().sum())
            mean = (f"{int(diverged.iloc[0])}" if len(diverged) == 1 else f"{diverged.mean():.1f}") if len(diverged) else "never"
            row["first divergence"] = mean + (f" ({never} of {len(part)} never)" if never and len(diverged) else "")
        rows.append(row)
    return pd.DataFrame(rows)


def compare_rules(
    store: Store,
    target: LoadedModel,
    draft: Any,
    requests: list[RunRequest],
    on_record_for: Callable[[RunRequest], Callable[[PositionRecord], None] | None] | None = None,
) -> tuple[str, list[tuple[str, Run]], dict[str, int | None]]:
    """Coupled runs, one per request (same prompt, seed, drafter and uniforms; only the rule differs).

    The first request of each seed is its reference; returns the group id, the runs, and each
    run's first divergence from its reference. ``draft`` is a loaded model or a drafter spec; each
    run builds its own drafter and KV caches. ``comparison.run_group`` does the running.
    """
    if not requests:
        raise EngineError("compare needs at least one rule, e.g. --rules lossless,lenience:0.5")
    for request in requests:
        request.validate()
    per_member = (lambda _index, request: on_record_for(request)) if on_record_for is not None else None
    return run_group(store, target, draft, requests, on_record_for=per_member)
