"""A sweep's units on Ray: one actor per worker loads the models once and runs whole units; the
driver alone writes DuckDB.

A worker generates a unit's members as one batch with nothing stored and sends the runs back
(``runner.generate_requests``); the driver stores each exactly as ``record_run`` would have
(``runner.store_finished_run``) and links the unit. Every uniform is keyed by
``(seed, position, slot)``, so a unit's tokens do not depend on the worker that ran it, nor on
whether it ran on Ray at all. A worker that dies loses only its unit: the driver starts a new
worker and runs the unit again (up to ``ATTEMPTS`` times).

Ray is imported only here, and only when a sweep asks for it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diagnostics
from diagnostics.comparison import first_divergence
from diagnostics.engine import EngineError, Run
from diagnostics.evaluation.plan import Unit
from diagnostics.evaluation.sweeper import (
    SweepPlan,
    ensure_cost,
    link_unit,
    open_sweep,
    pair_cost_ratio,
    sweep_status,
    unit_finished,
    unit_group_id,
)
from diagnostics.request import RunRequest
from diagnostics.runner import checked_prompt_ids, generate_requests, store_finished_run
from diagnostics.store import Store

ATTEMPTS = 3  # runs of one unit before a sweep gives up on it (a unit that kills every worker)
# Fault injection for the retry test only: a worker about to run this unit exits at once, the first
# time (the marker file records that it did).
CRASH_ONCE = "DIAGNOSTICS_SWEEP_CRASH_ONCE"


class UnitWorker:
    """What runs inside one Ray actor: the models, loaded once, and whole units run on them."""

    def __init__(self, target: str, draft: str, options: dict[str, Any]) -> None:
        import torch

        from diagnostics.drafts import load_draft
        from diagnostics.models import load_model

        if options.get("threads"):
            torch.set_num_threads(int(options["threads"]))
        dtype, trust = options.get("dtype") or "float32", bool(options.get("trust_remote_code"))
        self.target = load_model(target, dtype=dtype, device=options.get("device"), trust_remote_code=trust)
        self.draft = load_draft(draft, self.target, dtype=dtype, trust_remote_code=trust)

    def ready(self) -> int:
        return os.getpid()

    def cost_ratio(self, request: RunRequest) -> float:
        """The draft/target cost of one step, measured on this worker as an in-process sweep measures
        it (``sweeper.pair_cost_ratio``), at ``request``'s prompt."""
        return pair_cost_ratio(self.target, self.draft, checked_prompt_ids(self.target, request))

    def run_unit(self, unit_index: int, requests: list[RunRequest]) -> tuple[str, list[tuple[list[int], Run]]]:
        """Every member of one unit, in order, with nothing stored: the target's name and, per
        member, the prompt ids and the run."""
        _crash_once(unit_index)
        prompt_ids = [checked_prompt_ids(self.target, request) for request in requests]
        runs = generate_requests(self.target, self.draft, requests, prompt_ids)  # the unit's members as one batch
        return self.target.name, list(zip(prompt_ids, runs))


def _crash_once(unit_index: int) -> None:
    spec = os.environ.get(CRASH_ONCE)
    if not spec:
        return
    marker, _, unit = spec.rpartition(":")
    if int(unit) == unit_index and not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
        os._exit(17)


def store_unit(store: Store, plan: SweepPlan, unit: Unit, target_name: str, results: list[tuple[list[int], Run]]) -> None:
    """Store a unit's runs as one coupled group (divergence from its first, lossless, run) and link
    them to the sweep."""
    members = plan.members(unit)
    group_id = unit_group_id(plan.sweep_id, unit)
    run_ids = [store_finished_run(store, target_name, member.request, prompt_ids, run, group_id)
               for member, (prompt_ids, run) in zip(members, results)]
    reference = results[0][1]
    divergence = {run_id: None if index == 0 else first_divergence(reference, run)
                  for index, (run_id, (_ids, run)) in enumerate(zip(run_ids, results))}
    store.set_group(run_ids, group_id, divergence)
    link_unit(store, plan, unit, members, run_ids)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EngineError("--ray needs Ray: pip install -r requirements.txt (it pins ray)") from None
    return ray


def run_sweep_on_ray(
    store: Store,
    settings: dict[str, Any],
    options: dict[str, Any],
    *,
    address: str | None = None,
    workers: int | None = None,
    sweep_id: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_unit: Callable[[int, int, Unit], None] | None = None,
    cost: float | None = None,
    on_open: Callable[[SweepPlan], None] | None = None,
) -> tuple[str, float]:
    """Run the sweep's missing units on Ray; return its id and its stored draft/target cost ratio: a
    sweep without one gets ``cost``, else the one measured on a worker (the driver may have no
    accelerator, nor room for the models), stored before any unit runs. ``address=None`` starts a local Ray
    (stopped at the end); otherwise the sweep joins that cluster, whose nodes must have this package
    installed. ``workers``: actors to start (default: one per GPU, else one per CPU, one thread
    each). ``options``: ``dtype``, ``device``, ``trust_remote_code`` for loading the models."""
    ray = import_ray()
    plan = open_sweep(store, settings, sweep_id, on_open)
    started_here = not ray.is_initialized()
    if started_here:
        _start_ray(ray, address)
    actors: dict[Any, Any] = {}
    try:
        with sweep_status(store, plan):
            resources = ray.cluster_resources()
            gpus = int(resources.get("GPU", 0))
            count = workers or gpus or max(1, int(resources.get("CPU", 1)))
            if count < 1:
                raise EngineError(f"--workers must be at least 1, got {count}")
            actor_class = ray.remote(num_cpus=1, num_gpus=1 if gpus else 0)(UnitWorker)
            worker_options = {**options, "threads": options.get("threads") or (None if gpus else 1)}
            if gpus and not worker_options.get("device"):
                worker_options["device"] = "cuda"

            def new_actor() -> Any:
                actor = actor_class.remote(settings.get("target", "default"), plan.base.draft, worker_options)
                actors[id(actor)] = actor  # killed when the sweep ends, however it ends
                return actor

            idle = [new_actor() for _ in range(max(1, min(count, len(plan.todo))))]
            for actor in idle:
                _check_loaded(ray, actor)
            first = plan.members(plan.units[0])[0].request
            cost, _source = ensure_cost(store, plan, settings, lambda: ray.get(idle[0].cost_ratio.remote(first)), cost)
            _drive(ray, store, plan, idle, actors, new_actor, should_stop, on_unit)
    finally:
        for actor in [*actors.values()]:
            ray.kill(actor)
        if started_here:
            ray.shutdown()
    return plan.sweep_id, cost


def _start_ray(ray: Any, address: str | None) -> None:
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
    package = Path(diagnostics.__file__).resolve().parent
    try:
        if address is None:
            # Local workers import this checkout (they do not inherit the driver's sys.path).
            paths = [str(package.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
            ray.init(include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}, **quiet)
        else:
            # A cluster's nodes get this package uploaded; they need its requirements installed.
            ray.init(address=address, runtime_env={"py_modules": [str(package)]}, **quiet)
    except Exception as error:  # noqa: BLE001 - Ray raises many kinds; the user needs one line
        where = "a local Ray" if address is None else f"the Ray cluster at {address}"
        raise EngineError(f"could not start {where} ({str(error).splitlines()[0] if str(error) else error.__class__.__name__}); "
                          "check the address (ray status shows it), or run without --ray") from None


def _check_loaded(ray: Any, actor: Any) -> None:
    """Wait for a worker to load the models; a worker that cannot says why, in one line."""
    try:
        ray.get(actor.ready.remote())
    except ray.exceptions.RayActorError as error:
        cause = _cause(error)
        raise EngineError(f"a Ray worker could not load the models: {cause}") from None


def _cause(error: BaseException) -> str:
    """The last line of a Ray error that names the underlying exception."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        if ":" in line and not line.startswith(("File ", "Traceback")):
            return line
    return lines[-1] if lines else error.__class__.__name__


def _drive(ray: Any, store: Store, plan: SweepPlan, idle: list[Any], actors: dict[Any, Any], new_actor: Callable[[], Any],
           should_stop: Callable[[], bool] | None, on_unit: Callable[[int, int, Unit], None] | None) -> None:
    """Hand units to idle workers, store each finished unit as it comes back, retry the unit of a
    worker that died on a new worker, and stop handing out work when ``should_stop`` says so."""
    queue = list(plan.todo)
    attempts: dict[int, int] = {}
    running: dict[Any, tuple[Unit, Any]] = {}  # object ref → (unit, actor)
    while queue or running:
        stopping = should_stop is not None and should_stop()
        while idle and queue and not stopping:
            unit = queue.pop(0)
            actor = idle.pop(0)
            attempts[unit.index] = attempts.get(unit.index, 0) + 1
            running[actor.run_unit.remote(unit.index, [member.request for member in plan.members(unit)])] = (unit, actor)
        if stopping and not running:
            return
        ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
        for ref in ready:
            unit, actor = running.pop(ref)
            try:
                target_name, results = ray.get(ref)
            except ray.exceptions.RayActorError:
                # The worker died (killed, out of memory, a lost node): only this unit is lost.
                ray.kill(actor)
                actors.pop(id(actor), None)
                if attempts[unit.index] >= ATTEMPTS:
                    raise EngineError(f"unit {unit.index} (prompt {unit.prompt_id!r}, seed {unit.seed}) lost its worker "
                                      f"{ATTEMPTS} times; the sweep stops (resume it with --resume {plan.sweep_id})") from None
                idle.append(new_actor())
                queue.insert(0, unit)
                continue
            except ray.exceptions.RayTaskError as error:
                cause = error.cause if isinstance(getattr(error, "cause", None), Exception) else None
                if isinstance(cause, ValueError):
                    raise cause from None  # a setting the engine refused: its own one-line message
                raise EngineError(f"unit {unit.index} failed on its worker: {_cause(error)}") from None
            store_unit(store, plan, unit, target_name, results)
            unit_finished(store, plan, unit, on_unit)
            idle.append(actor)


__all__ = ["ATTEMPTS", "UnitWorker", "import_ray", "run_sweep_on_ray", "store_unit"]
