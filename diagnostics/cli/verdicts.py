"""``verdicts``: the losslessness verdict table of real engines, each row reproducible by one command."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from diagnostics.cli.common import json_line

DEFAULT_OUT = "docs/verdicts.json"


def command_verdicts(args: argparse.Namespace) -> int:
    from diagnostics.verdicts.render import write_readme_table
    from diagnostics.verdicts.table import save_table

    out = Path(args.out)
    if args.import_file:
        table = _import(Path(args.import_file), out)
        save_table(out, table)
    else:
        table = _run(args, out)
    readme = _readme(args, out)
    if readme is not None:
        write_readme_table(readme, table)
    for row in table["rows"]:
        print(json_line({"engine": row["engine"], "policy": row["policy"], "verdict": row["verdict"], "p_value": row["on"].get("p_value"),
                         "tokens": row["on"].get("tokens"), "control": row["off"].get("verdict"), "provenance": row.get("provenance")}))
    return 0


def _readme(args: argparse.Namespace, out: Path) -> Path | None:
    """The README to rewrite: ``--readme`` when given, README.md beside the default table, else none."""
    if args.readme:
        return None if args.readme == "none" else Path(args.readme)
    return Path("README.md") if out == Path(DEFAULT_OUT) and Path("README.md").is_file() else None


def _run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from diagnostics.store import Store
    from diagnostics.verdicts.engines import POLICIES
    from diagnostics.verdicts.run import Endpoints, SetupSpec, cached_setup, chosen_rows, endpoint_row, run_table, server_setup
    from diagnostics.verdicts.table import load_table

    endpoints = None
    if args.endpoint or args.baseline_endpoint:
        if not (args.endpoint and args.baseline_endpoint and args.model and args.label and args.version):
            raise ValueError("an endpoint row needs --endpoint URL (speculation on), --baseline-endpoint URL (off), --model NAME, "
                             "--label TEXT and --version TEXT (e.g. 'vllm 0.9.1')")
        rows = [endpoint_row(args.label, _settings(args.settings))]
        endpoints = Endpoints(args.endpoint, args.baseline_endpoint, args.model, args.version, os.environ.get("OPENAI_API_KEY"),
                              scores_api=args.scores_api if args.oracle == "server" else None,
                              score_logprobs=args.score_logprobs)
    elif args.oracle == "server":
        raise ValueError("--oracle server audits an endpoint row against the server's own scores: add --endpoint URL and its options")
    else:
        rows = chosen_rows([name.strip() for value in args.engine for name in value.split(",") if name.strip()] or ["all"])
    policies = [name.strip() for name in args.policy.split(",") if name.strip()]
    unknown = [name for name in policies if name not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none)'}: use {', '.join(POLICIES)} (comma-separated)")
    if not 0 < args.detect_tv < 1 or not 0 < args.level < 1:
        raise ValueError("--detect-tv and --level must lie in (0, 1)")
    if not 1 <= args.max_tokens <= 512:
        raise ValueError(f"--max-tokens must lie in [1, 512], got {args.max_tokens}")
    load_table(out)  # a table file that is not one is refused before anything runs
    if not 1 <= args.workers <= 16:
        raise ValueError(f"--workers must lie in [1, 16], got {args.workers}")
    if not 1 <= args.score_logprobs <= 1000:
        raise ValueError(f"--score-logprobs must lie in [1, 1000], got {args.score_logprobs}")
    if endpoints is not None and endpoints.scores_api is not None:
        setup, spec = server_setup(args.model, args.prompt or None), None  # no local copy of the model: the server scores
    else:
        spec = SetupSpec(args.target, args.early_exit, tuple(args.prompt) or None, args.draft)
        setup = cached_setup(spec)
    store = Store(args.db)
    # A kill (SIGTERM) unwinds like Ctrl-C: the servers a row started are stopped by their context
    # managers and the worker pool is shut down, instead of being left running without their parent.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        run_table(rows, policies, setup, out=out, evidence=Path(args.evidence), store=store, detect_tv=args.detect_tv,
                  level=args.level, max_tokens=args.max_tokens, rerun=args.rerun, endpoints=endpoints, spec=spec,
                  workers=args.workers)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return load_table(out)


def _terminated(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def _settings(text: str | None) -> dict[str, Any]:
    """``--settings``: the engine's speculative settings as a JSON object of short values."""
    from diagnostics.untrusted_json import loads

    if not text:
        return {}
    settings = loads(text, "--settings")
    if not isinstance(settings, dict) or len(settings) > 30 or any(
            not isinstance(value, (str, int, float, bool, type(None))) or len(str(value)) > 200 for value in settings.values()):
        raise ValueError('--settings must be a JSON object of up to 30 short values, e.g. \'{"method": "eagle3", "num_speculative_tokens": 3}\'')
    return settings


def _import(source: Path, out: Path) -> dict[str, Any]:
    """Rows of a verdict table made elsewhere (a GPU engine's), validated like any shared file and
    marked with where they came from; nothing in them is run. Refused whole on any bad row."""
    from diagnostics.untrusted import visible
    from diagnostics.verdicts.table import check_table, load_table, sha256, upsert

    try:
        incoming = load_table(source)
    except OSError as error:
        raise ValueError(f"cannot read {source}: {error.strerror or error}") from None
    if not incoming["rows"]:
        raise ValueError(f"{source} holds no rows")
    table = load_table(out)
    origin = f"imported from {visible(source.name, limit=80)} (sha256 {sha256(source)[:12]})"
    for row in incoming["rows"]:
        row = dict(row)
        row["provenance"] = origin
        upsert(table, row)
    problem = check_table(table)
    if problem:
        raise ValueError(f"{source}: {problem}")
    print(f"note: {len(incoming['rows'])} row(s) {origin}", file=sys.stderr)
    return table


def add_parser(commands: Any) -> None:
    """The ``verdicts`` command's options."""
    verdicts = commands.add_parser(
        "verdicts", help="the losslessness verdict table of real engines (speculation on, and off as the control)",
        description="Run each engine on the target with speculation on and, as its control, off, under the same sampling "
                    "settings; audit both sides' generations against the target's law (the external audit); write the table "
                    f"({DEFAULT_OUT}) and its README copy. Rows whose evidence files are unchanged are kept (resume); "
                    "--rerun makes them again. A row whose control fails reads 'control failed: settings not matched'.")
    verdicts.add_argument("--engine", action="append", default=[], metavar="NAME",
                          help="all (default: every engine that runs here), transformers, mutants (our engine with each "
                               "planted bug: each must fail), or an engine name; repeatable or comma-separated")
    verdicts.add_argument("--policy", default="t1,t1-top-k-20", help="policies: t1 (temperature 1), t1-top-k-20 (default both)")
    verdicts.add_argument("--target", default="default", help="the target: 'default' (the embedded model) or a local path")
    verdicts.add_argument("--early-exit", type=int, default=None, metavar="LAYER",
                          help="the layer of the early-exit draft (transformers' assistant, our draft; default 26, or the last but one)")
    verdicts.add_argument("--draft", default=None, metavar="MODEL",
                          help="the assistant/draft model (a path or hub id with the target's vocabulary; default the early-exit draft)")
    verdicts.add_argument("--prompt", action="append", default=[], help="a raw prompt (repeatable; default two built-in prompts)")
    verdicts.add_argument("--detect-tv", type=float, default=0.03,
                          help="each side gets the tokens that detect this TV at 90%% power (default 0.03)")
    verdicts.add_argument("--level", type=float, default=0.01, help="the audit's level (default 0.01)")
    verdicts.add_argument("--max-tokens", type=int, default=32, help="tokens per generation (default 32)")
    verdicts.add_argument("--out", default=DEFAULT_OUT, help=f"the table file (default {DEFAULT_OUT})")
    verdicts.add_argument("--evidence", default="docs/verdicts", help="where the generations files go (default docs/verdicts)")
    verdicts.add_argument("--readme", default=None, metavar="FILE",
                          help="the README whose table to rewrite (default README.md with the default --out; 'none': no README)")
    verdicts.add_argument("--rerun", action="store_true", help="run the chosen rows again even where their evidence is unchanged")
    verdicts.add_argument("--import", dest="import_file", default=None, metavar="TABLE.json",
                          help="add the rows of a table made elsewhere (e.g. a GPU engine's), validated and marked with their origin")
    verdicts.add_argument("--endpoint", default=None, metavar="URL",
                          help="your engine's OpenAI-compatible server with speculation on (a GPU engine: vLLM, SGLang, TensorRT-LLM)")
    verdicts.add_argument("--baseline-endpoint", default=None, metavar="URL", help="the same model served with speculation off")
    verdicts.add_argument("--model", default=None, help="with --endpoint: the model name the servers know")
    verdicts.add_argument("--label", default=None, help="with --endpoint: the row's engine, e.g. 'vLLM, EAGLE-3 draft'")
    verdicts.add_argument("--version", default=None, help="with --endpoint: the engine's version, e.g. 'vllm 0.9.1'")
    verdicts.add_argument("--settings", default=None, metavar="JSON",
                          help='with --endpoint: its speculative settings as stated, e.g. \'{"method": "eagle3", "num_speculative_tokens": 3}\'')
    verdicts.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                          help="worker processes (one torch thread each) that generate an in-process engine's seeds "
                               "side by side (default: 2, or 1 on one core)")
    verdicts.add_argument("--oracle", default=None, choices=["server"],
                          help="with --endpoint: audit against the server's own teacher-forced scores (no local copy of the "
                               "model; the verdict then rests on those scores being the engine's law)")
    verdicts.add_argument("--scores-api", default="vllm", choices=["vllm", "sglang"],
                          help="with --oracle server: ask for scores as vLLM (prompt_logprobs) or SGLang (input_top_logprobs)")
    verdicts.add_argument("--score-logprobs", type=int, default=20,
                          help="with --oracle server: log-probabilities per token to ask for (exact when top-k <= K)")
    verdicts.add_argument("--db", default=None, help="DuckDB file for the audits (default $SPECLAB_DB or data/runs.duckdb)")
    verdicts.set_defaults(handler=command_verdicts, interrupted="interrupted: each side's file keeps the generations "
                          "written so far; the same command continues them")
