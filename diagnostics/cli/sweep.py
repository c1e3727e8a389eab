"""``sweep``: prompt set × rules × seeds, run (or resumed) as one continuous batch, then its figures."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from diagnostics.cli.common import DEFAULT_EARLY_EXIT, add_generation_options, json_line, progress_wanted, request_of
from diagnostics.evaluation.settings import MAX_STORED_COST, NO_STORED_COST, checked_cost, cost_option, resolve_cost, stored_cost_flag


def command_sweep(args: argparse.Namespace) -> int:
    """``sweep``: run (or resume) a sweep, then print its per-setting figures with intervals as JSON
    and one verdict line per rule on stderr."""
    from diagnostics.evaluation.prompts import load_prompts
    from diagnostics.evaluation.answers import require_sandbox_for
    from diagnostics.evaluation.settings import checkers_of
    from diagnostics.evaluation.sweeper import base_request, expand_rules, plan_units, run_sweep, settings_of
    from diagnostics.drafts import load_draft
    from diagnostics.models import load_model
    from diagnostics.store import Store

    checked_cost(args.cost)  # refused before anything is stored
    if args.check_answers:
        from diagnostics.evaluation.answers import recheck_sweep

        if args.prompts or args.rule or args.limit or args.resume:
            raise ValueError("--check-answers takes a stored sweep; drop --prompts, --limit, --rule and --resume")
        store = Store(args.db)
        scores = recheck_sweep(store, args.check_answers, save=True)
        print(f"sweep {args.check_answers}: {len(scores)} runs checked, {sum(scores.values()):g} passed", file=sys.stderr)
        return _print_sweep(store, args.check_answers, args.cost)
    if args.resume:
        if args.prompts or args.rule or args.limit:
            raise ValueError("--resume takes the sweep's own prompts and rules; drop --prompts, --limit and --rule")
        store = Store(args.db)
        sweep = store.get_sweep(args.resume)
        if sweep is None:
            raise ValueError(f"there is no sweep {args.resume!r} in {store.path}; check the id, or pass --db the file that holds it")
        settings, sweep_id = sweep["settings"], args.resume
    else:
        if not args.prompts:
            raise ValueError("pass --prompts FILE (a JSONL prompt set, or: general), or --resume SWEEP_ID")
        prompts = load_prompts(args.prompts)
        if args.limit is not None:
            if args.limit < 1:
                raise ValueError(f"--limit must be at least 1 (prompts to use), got {args.limit}")
            prompts = prompts[:args.limit]
        rules = expand_rules(args.rule)
        if args.draft is None and args.target == "default":
            args.draft = DEFAULT_EARLY_EXIT
        if args.draft is None:
            raise ValueError("pass --draft (model:ID_OR_PATH, early-exit:LAYER, ngram:N)")
        args.prompt = prompts[0].prompt
        base = request_of(args, "lossless")
        settings = {**settings_of(prompts, rules, args.seeds, base, str(args.prompts)), "target": args.target}
        store, sweep_id = Store(args.db), None
    base = base_request(settings)
    plan_units(settings)  # checks the seeds
    # --cost analytic: the number the pair's shapes imply, stored as a given c by a new sweep.
    given = resolve_cost(settings, args.cost)[0] if args.cost is not None else None
    require_sandbox_for(checkers_of(settings))  # before loading any model: HumanEval checks need bubblewrap
    on_terminal, quiet = progress_wanted(args), getattr(args, "no_progress", False)
    opened: list[str] = []

    def on_open(plan) -> None:
        opened.append(plan.sweep_id)
        if not quiet:
            print(f"sweep {plan.sweep_id}: {len(plan.todo)} of {len(plan.units)} units to run "
                  f"({len(plan.members(plan.units[0]))} coupled runs each)", file=sys.stderr, flush=True)

    def on_unit(done: int, total: int, unit) -> None:
        # A terminal gets one updating line; a log gets one plain line per unit.
        if on_terminal:
            print(f"\rsweep: unit {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)
        elif not quiet:
            print(f"sweep: unit {done}/{total} done", file=sys.stderr, flush=True)

    if args.workers is not None and (args.workers < 1 or not args.ray):
        raise ValueError("--workers N needs --ray and N >= 1")
    if args.batch_size is not None and (args.batch_size < 1 or args.ray):
        raise ValueError("--batch-size N needs N >= 1, without --ray (a Ray worker runs each unit as one batch)")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.ray:
        from diagnostics.evaluation.distributed import run_sweep_on_ray

        options = {"dtype": args.dtype, "device": args.device, "trust_remote_code": args.trust_remote_code,
                   "threads": args.threads}
        try:
            sweep_id, _stored = run_sweep_on_ray(store, settings, options, address=None if args.ray == "local" else args.ray,
                                                 workers=args.workers, sweep_id=sweep_id, on_unit=on_unit, on_open=on_open,
                                                 cost=given)
        except KeyboardInterrupt:
            _sweep_interrupted(opened)
            return 130
        return _print_sweep(store, sweep_id, args.cost)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    target = load_model(settings.get("target", "default"), dtype=args.dtype, device=args.device,
                        trust_remote_code=args.trust_remote_code)
    draft = load_draft(base.draft, target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    try:
        sweep_id = run_sweep(store, target, draft, settings, sweep_id=sweep_id, on_unit=on_unit, on_open=on_open,
                             batch_size=args.batch_size, cost=given)
    except KeyboardInterrupt:
        _sweep_interrupted(opened)
        return 130
    return _print_sweep(store, sweep_id, args.cost)


def _sweep_interrupted(opened: list[str]) -> None:
    resume = f"; run the missing units with: sweep --resume {opened[0]} (and the same --db)" if opened else ""
    print(f"\ninterrupted: the finished units are kept and the sweep is marked 'interrupted'{resume}", file=sys.stderr)


def _print_sweep(store, sweep_id: str, given: float | None) -> int:
    """The sweep's per-setting figures with intervals as JSON on stdout (at ``resolve_cost``'s c), one
    verdict per rule on stderr; a stored c that is implausible (``stored_cost_flag``) is flagged in
    the JSON (``cost_ratio_flag``) and on stderr, unless this command gave its own."""
    from diagnostics.evaluation.stats import as_rows, summarise_sweep, sweep_table

    sweep = store.get_sweep(sweep_id)
    cost, source = resolve_cost(sweep["settings"], given)
    flag = stored_cost_flag(sweep["settings"]) if given is None else None
    summaries = summarise_sweep(sweep_table(store, sweep_id, cost))
    print(json_line({"sweep_id": sweep_id, "status": sweep["status"], "units": sweep["units"], "units_done": sweep["units_done"],
                      "cost_ratio": cost, "cost_ratio_source": source, "cost_ratio_flag": flag, "db": str(store.path),
                      "settings": as_rows(summaries)}))
    if flag:
        print(f"cost ratio: {flag} (--cost analytic takes it; --cost C, your own)", file=sys.stderr)
    for summary in summaries:
        if summary.role == "rule":
            print(summary.verdict(), file=sys.stderr)
    return 0


def add_parser(commands: Any) -> None:
    """The ``sweep`` command's options."""
    sweep = commands.add_parser("sweep", help="prompt set × rules × seeds, each rule beside the lossless run and its matched "
                                               "baseline, with paired bootstrap intervals over prompts")
    sweep.add_argument("--prompts", default=None, metavar="FILE",
                       help="a JSONL prompt set (prompt, optional id and checker) or a shipped set: general")
    sweep.add_argument("--rule", action="append", default=[], metavar="SPEC",
                       help="a rule, or a range of one parameter: lenience:0.2..1.0:5 (repeat --rule for more)")
    sweep.add_argument("--limit", type=int, default=None, metavar="N", help="use only the first N prompts of the set")
    sweep.add_argument("--seeds", type=int, default=2, help="seeds per prompt (0 … N − 1); intervals resample prompts, then seeds")
    sweep.add_argument("--resume", default=None, metavar="SWEEP_ID", help="run the units an interrupted sweep is missing")
    sweep.add_argument("--check-answers", default=None, metavar="SWEEP_ID",
                       help="score a stored sweep's finished runs with their prompts' checkers now and store the scores (a sweep "
                            "scores its units as they finish; this is for sweeps of older versions). A HumanEval checker runs "
                            "each output as code inside the bubblewrap sandbox")
    sweep.add_argument("--cost", type=cost_option, default=None, metavar="C",
                       help="draft/target cost ratio c of one step for the modelled speed-up. Default: the c stored with the "
                            "sweep, measured when it first ran (as the Sweeps page and the report use it; "
                            f"{NO_STORED_COST:g} for an older sweep stored without one); a new sweep stores the C given here "
                            f"(0 to {MAX_STORED_COST:g}), or with 'analytic' the c the drafter's shape implies (early-exit:L: "
                            "L / the target's layers; ngram: 0); a measured c that is implausible is flagged on stderr")
    sweep.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="run the units on Ray: alone, a local Ray started for the sweep; with ADDRESS (e.g. ray://head:10001 or "
                            "auto), an existing cluster whose nodes have the requirements installed. The driver alone writes --db")
    sweep.add_argument("--workers", type=int, default=None, metavar="N",
                       help="Ray workers, each loading the models once (default: one per GPU, else one per CPU)")
    sweep.add_argument("--threads", type=int, default=None, metavar="N",
                       help="torch CPU threads (in this process, or per Ray worker; default: torch's own, and 1 per CPU "
                            "worker). Floats depend on it, so the same N reproduces a sweep bit for bit")
    sweep.add_argument("--batch-size", type=int, default=None, metavar="N",
                       help="rows (coupled runs) per forward in this process: the units' members run as one continuous batch "
                            "(default 32, measured by bench --only batch; the tokens do not depend on it)")
    add_generation_options(sweep, with_prompt=False)
    sweep.set_defaults(max_new_tokens=32)
    sweep.set_defaults(handler=command_sweep)
