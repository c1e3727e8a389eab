"""``run``: generate once and record every position; ``run --replay`` records a stored run again."""

from __future__ import annotations

import argparse
import json
from typing import Any

from diagnostics.cli.common import Parser, Progress, add_generation_options, json_line, prepare, progress_wanted, rule_help, run_json


def command_run(args: argparse.Namespace) -> int:
    from diagnostics.runner import record_run

    if args.replay is not None:
        return command_replay(args)
    if args.prompt is None:
        raise ValueError("pass --prompt TEXT, or --replay RUN_ID to record a stored run again")
    if args.with_lossless:
        check_with_lossless(args.rule)  # before any model or row
    store, target, draft, (request,) = prepare(args, [args.rule])
    progress = Progress(request.max_new_tokens, request.rule, progress_wanted(args))
    try:
        run_id, run = record_run(store, target, draft, request, on_record=progress)
    finally:
        progress.close()
    if not args.with_lossless:
        print(run_json(run_id, run, str(store.path)), flush=True)
        return 0
    payload = json.loads(run_json(run_id, run, str(store.path)))
    payload.update(with_lossless(store, run_id, target, draft, args))
    print(json_line(payload), flush=True)
    return 0


def check_with_lossless(rule: str) -> None:
    """``--with-lossless`` needs a lossy ``--rule`` (one line otherwise, before any work)."""
    from diagnostics.coupling import is_lossless, lossless_equivalent_message
    from diagnostics.rules import get_rule

    if is_lossless(rule):
        raise ValueError("--with-lossless records the lossless run beside a lossy one; pass a lossy --rule, e.g. lenience:0.5")
    if get_rule(rule).lossless_equivalent:
        raise ValueError("--with-lossless: " + lossless_equivalent_message(get_rule(rule).spec))


def with_lossless(store: Any, run_id: str, target: Any, draft: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Find or record ``run_id``'s coupled lossless run (``coupling.couple``), link the two as a
    group, and say where the lossy run first leaves it and why."""
    from diagnostics.coupling import couple

    tokenizer = target.tokenizer
    decode = (lambda token: tokenizer.decode([int(token)])) if tokenizer is not None else None
    progress = Progress(store.get_run(run_id)["max_new_tokens"], "lossless (coupled)", progress_wanted(args))
    try:
        coupling = couple(store, run_id, target, draft, on_record=progress, decode=decode)
    finally:
        progress.close()
    return {"group_id": coupling.group_id, "lossless_run": coupling.lossless_id, "lossless_found": not coupling.recorded,
            "divergence_position": coupling.divergence, "divergence_why": coupling.why}


# Options that say how to generate: a replay takes them from the stored run, so typing one is a mistake.
_REPLAYED_OPTIONS = ("prompt", "rule", "target", "draft", "gamma", "max_new_tokens", "temperature", "top_k", "top_p",
                     "min_p", "eta", "draft_temperature", "seed", "raw", "tree", "tree_budget", "tree_depth", "tree_children")


def _run_parser() -> Parser:
    """A parser of the ``run`` command alone (its defaults tell typed options from untouched ones)."""
    parser = Parser(prog="python -m diagnostics")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def command_replay(args: argparse.Namespace) -> int:
    """``run --replay RUN_ID``: record the stored run again with its own settings; print the usual
    JSON plus ``replay_of`` and ``reproduced`` (the new token ids equal the stored ones)."""
    from pathlib import Path

    from diagnostics.inspection import target_spec
    from diagnostics.drafts import load_draft
    from diagnostics.models import load_model
    from diagnostics.request import request_from_run
    from diagnostics.runner import check_replay_prompt, record_run
    from diagnostics.store import Store, default_db_path

    if args.prompt is not None:
        raise ValueError("--prompt and --replay exclude each other: a replay uses the stored run's own prompt")
    if args.with_lossless:
        raise ValueError("--with-lossless and --replay exclude each other: record the run with --prompt, or open the "
                         "replayed run on Inspect and press '⇥ first divergence'")
    defaults = vars(_run_parser().parse_args(["run", "--replay", "placeholder"]))
    typed = [name for name in _REPLAYED_OPTIONS if getattr(args, name) != defaults[name]]
    if typed:
        raise ValueError(f"--replay takes the stored run's own settings; drop --{typed[0].replace('_', '-')}")
    path = Path(args.db).expanduser() if args.db is not None else default_db_path()
    if not path.is_file():
        raise ValueError(f"there is no database at {path} to replay run {args.replay!r} from; pass --db the file that holds it")
    store = Store(path)
    stored = store.get_run(args.replay)
    if stored is None:
        raise ValueError(f"there is no run {args.replay!r} in {store.path}; check the id, or pass --db the file that holds it")
    request = request_from_run(stored)
    request.top_k_record = args.top_k_record
    request.validate()
    target = load_model(target_spec(stored), dtype=args.dtype, device=args.device, trust_remote_code=args.trust_remote_code)
    check_replay_prompt(target, request, stored.get("prompt_ids"), args.replay)
    draft = load_draft(request.draft, target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    progress = Progress(request.max_new_tokens, f"replay {request.rule}", progress_wanted(args))
    try:
        run_id, run = record_run(store, target, draft, request, on_record=progress)
    finally:
        progress.close()
    payload = json.loads(run_json(run_id, run, str(store.path)))
    stored_tokens = [int(token) for token in stored.get("tokens") or []]
    payload.update(replay_of=args.replay, reproduced=list(run.tokens) == stored_tokens)
    print(json_line(payload), flush=True)
    return 0


def add_parser(commands: Any) -> None:
    """The ``run`` command's options."""
    run = commands.add_parser("run", help="generate once with a verification rule and record every position")
    add_generation_options(run, replayable=True)
    run.add_argument("--rule", default="lossless", help=rule_help())
    run.add_argument("--with-lossless", action="store_true",
                     help="after a lossy --rule, find or record its coupled lossless run (same prompt, seed, target, draft, "
                          "gamma or tree, policy and token budget: the same uniforms), link the two as a group, and add to "
                          "the JSON group_id, lossless_run, lossless_found, divergence_position (first position where the "
                          "lossy run leaves the lossless one; null if never) and divergence_why (the coin u against each "
                          "rule's a(x) there)")
    run.set_defaults(handler=command_run)
