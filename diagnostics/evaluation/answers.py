"""Checker scores of a sweep's outputs: computed when a unit finishes (the user launched the sweep)
and stored in ``sweep_runs.score``, or on an explicit re-check the user asks for. Opening a sweep,
a page or a report only reads the stored scores: nothing in a file ever makes this run code.

A HumanEval checker runs the output as code, inside the bubblewrap sandbox only
(``sandbox.run_program``); identical outputs of a unit's coupled runs are checked once.
"""

from __future__ import annotations

from typing import Any

from diagnostics.evaluation.prompts import score
from diagnostics.evaluation.sandbox import check_sandbox
from diagnostics.evaluation.settings import checkers_of


def needs_sandbox(checkers: dict[str, dict[str, Any] | None]) -> bool:
    """Whether any checker runs generated code (HumanEval)."""
    return any(checker is not None and checker.get("type") == "humaneval" for checker in checkers.values())


def require_sandbox_for(checkers: dict[str, dict[str, Any] | None]) -> None:
    """Before a sweep or re-check starts: ``SandboxUnavailable`` (one line, how to enable it) when a
    checker runs generated code and bubblewrap cannot run here. Nothing has run yet."""
    if needs_sandbox(checkers):
        check_sandbox()


def scores_of(checker: dict[str, Any] | None, outputs: dict[str, str | None]) -> dict[str, float | None]:
    """``run_id → score`` of each output by ``checker`` (``None`` for every run without one); each
    distinct output is checked once."""
    if checker is None:
        return {run_id: None for run_id in outputs}
    texts = {run_id: output if isinstance(output, str) else "" for run_id, output in outputs.items()}
    by_output: dict[str, float] = {}
    for output in texts.values():
        if output not in by_output:
            by_output[output] = score(checker, output)
    return {run_id: by_output[output] for run_id, output in texts.items()}


def recheck_sweep(store: Any, sweep_id: str, save: bool) -> dict[str, float]:
    """Score every complete run of the sweep with its prompt's checker, now (the explicit re-check).
    ``save``: store the scores in the sweep (a writable database). Returns ``run_id → score``."""
    sweep = store.get_sweep(sweep_id)
    if sweep is None:
        raise ValueError(f"there is no sweep {sweep_id!r} in {store.path}")
    checkers = checkers_of(sweep["settings"])
    require_sandbox_for(checkers)
    runs = store.sweep_runs(sweep_id)
    scores: dict[str, float] = {}
    for prompt_id, part in runs[runs["status"] == "complete"].groupby("prompt_id", sort=False):
        checked = scores_of(checkers.get(prompt_id), dict(zip(part["run_id"], part["output_text"])))
        scores.update({run_id: value for run_id, value in checked.items() if value is not None})
    if save and scores:
        store.set_sweep_scores(sweep_id, scores)
    return scores
