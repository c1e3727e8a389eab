"""``compare``: coupled runs of several rules (and shapes, baselines, seeds) as one batch."""

from __future__ import annotations

import argparse
import json
from typing import Any

from diagnostics.cli.common import RULE_LIST_HELP, Progress, add_generation_options, json_line, prepare, progress_wanted, run_json


def _shapes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--shapes "chain;3,2,1"`` → the tree fields of each member shape (``{}``: as the other options say)."""
    if not getattr(args, "shapes", None):
        return [{}]
    shapes = []
    for piece in [piece.strip() for piece in args.shapes.split(";") if piece.strip()]:
        if piece.lower() == "chain":
            shapes.append({"tree": None, "tree_budget": None, "tree_depth": None})
        else:
            shapes.append({"tree": piece, "tree_budget": None, "tree_depth": None})
    if not shapes:
        raise ValueError('--shapes: give shapes separated by ";", e.g. "chain;3,2,1"')
    return shapes


def command_compare(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from diagnostics.comparison import parse_seeds, references, run_group
    from diagnostics.request import matched_baseline
    from diagnostics.rules import split_specs

    seeds = parse_seeds(args.seeds) if args.seeds is not None else [args.seed]
    shapes = _shapes(args)
    store, target, draft, per_rule = prepare(args, split_specs(args.rules))
    members = []
    for shape in shapes:
        for request in per_rule:
            shaped = replace(request, **shape)
            members.append(shaped)
            baseline = matched_baseline(shaped) if args.baselines else None
            if baseline is not None:
                members.append(baseline)
    for member in members:
        member.validate()
    requests = [replace(member, seed=seed) for seed in seeds for member in members]
    bars: list[Progress] = []

    def progress_for(index: int, request: Any) -> Progress:
        label = request.rule if len(seeds) == 1 else f"{request.rule} · seed {request.seed}"
        bars.append(Progress(request.max_new_tokens, label, progress_wanted(args)))
        return bars[-1]

    try:
        group_id, results, divergence = run_group(store, target, draft, requests, on_record_for=progress_for)
    finally:
        for bar in bars:
            bar.close()
    refs = references(store.group(group_id))
    for (run_id, run), request in zip(results, requests):
        payload = json.loads(run_json(run_id, run, str(store.path)))
        payload.update(group_id=group_id, seed=request.seed, divergence_position=divergence[run_id], reference_run=refs[request.seed])
        print(json_line(payload), flush=True)
    return 0


def add_parser(commands: Any) -> None:
    """The ``compare`` command's options."""
    compare = commands.add_parser("compare", help="coupled runs (same seed and uniforms), one per rule")
    add_generation_options(compare)
    compare.add_argument("--rules", required=True, help=RULE_LIST_HELP)
    compare.add_argument("--shapes", default=None, metavar="LIST",
                         help='verification shapes to compare, separated by ";": chain (a chain of --gamma) or a tree K1,K2,… '
                              '(e.g. "chain;3,2,1"); every rule runs under each shape (default: the one --tree or --gamma gives)')
    compare.add_argument("--baselines", action="store_true",
                         help="add each truncation rule's matched baseline: lossless under the same truncation as the target's "
                              "policy (cascade:m → min-p m, typical:eta → eta), same drafts")
    compare.add_argument("--seeds", default=None, metavar="LIST",
                         help="run every rule at each of these seeds in one group: 0,1,2 or 0-4 (instead of --seed); "
                              "each seed's first rule is that seed's reference")
    compare.set_defaults(handler=command_compare)
