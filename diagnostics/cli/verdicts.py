"""``verdicts``: the losslessness verdict table of real engines, each row reproducible by one command."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from diagnostics.cli.common import add_oracle_options, json_line

DEFAULT_OUT = "docs/verdicts.json"
# What a row's settings may take of the table's bound (table_file.MAX_SETTINGS_BYTES, 8 KiB) for
# what a user gives; the rest (the policy, the engine's stated settings: about 2 KB) is the lab's.
MAX_PROMPTS_TEXT = 4096
MAX_SETTINGS_TEXT = 2048


def command_verdicts(args: argparse.Namespace) -> int:
    from diagnostics.verdicts.render import readme_with_table, write_readme_table
    from diagnostics.verdicts.table_file import table_bytes, write_atomically

    out = Path(args.out)
    readme = _readme(args, out)
    if args.import_file:
        table, notes = _import(Path(args.import_file), out)
        # Everything is checked and made in memory first: a refusal leaves the table and README as they were.
        data = table_bytes(table)
        readme_text = readme_with_table(readme, table) if readme is not None else None
        write_atomically(out, data)
        if readme_text is not None:
            write_atomically(readme, readme_text.encode("utf-8"))
        for note in notes:
            print(note, file=sys.stderr)
    else:
        table = _run(args, out)
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
    _check_prompts(list(args.prompt))
    if not 0 <= args.count_drafts <= 10_000:
        raise ValueError(f"--count-drafts must lie in [0, 10000], got {args.count_drafts}")
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
                  workers=args.workers, count_drafts=args.count_drafts)
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
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("--settings must be UTF-8 text (the argument held bytes that are not)") from None
    settings = loads(text, "--settings")
    if not isinstance(settings, dict) or len(settings) > 30 or size > MAX_SETTINGS_TEXT or any(
            not isinstance(value, (str, int, float, bool, type(None))) or len(str(value)) > 200 for value in settings.values()):
        raise ValueError(f"--settings must be a JSON object of up to 30 short values ({MAX_SETTINGS_TEXT:,} bytes in all), "
                         'e.g. \'{"method": "eagle3", "num_speculative_tokens": 3}\'')
    return settings


def _check_prompts(prompts: list[str]) -> None:
    """``--prompt`` texts the table can keep: each row's settings hold its prompts, and a table's
    settings are bounded (``table_file.MAX_SETTINGS_BYTES``); refused before anything runs."""
    import json

    try:
        size = len(json.dumps(prompts, ensure_ascii=False).encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("--prompt must be UTF-8 text (an argument held bytes that are not)") from None
    if size > MAX_PROMPTS_TEXT:
        raise ValueError(f"--prompt texts take {size:,} bytes; the table keeps at most {MAX_PROMPTS_TEXT:,} bytes of prompts a row")


def _import(source: Path, out: Path) -> tuple[dict[str, Any], list[str]]:
    """The table ``out`` with the rows of a table made elsewhere (a GPU engine's) added, and the
    notes to print once it is written. The file is read with bounds and validated like any shared
    file (``table_file``); each row is marked with where it came from and nothing in it is run. An
    imported row replaces an earlier imported row of its engine and policy, never a row run here:
    both are kept, and where their verdicts differ the notes and the table say so. Refused whole,
    in one line, on any bad row; nothing is written here."""
    import hashlib

    from diagnostics.untrusted import visible
    from diagnostics.verdicts.table import check_table, disagreement, imported_row, load_table, upsert
    from diagnostics.verdicts.table_file import parse_table, read_bounded

    data = read_bounded(source)
    incoming = parse_table(data, str(source))
    if not incoming["rows"]:
        raise ValueError(f"{source} holds no rows")
    if out.exists() and os.path.samefile(source, out):
        raise ValueError(f"{source} is the table itself (--out): import a table made elsewhere")
    table = load_table(out)
    origin = f"imported from {visible(source.name, limit=80)} (sha256 {hashlib.sha256(data).hexdigest()[:12]})"
    rows = [imported_row(row, origin) for row in incoming["rows"]]
    seen = set()
    for index, row in enumerate(rows):
        if (row["engine"], row["policy"]) in seen:
            raise ValueError(f"{source}: row {index + 1}: a second row for engine {visible(row['engine'], limit=40)!r}, "
                             f"policy {visible(row['policy'], limit=40)!r} (an import holds one row per engine and policy)")
        seen.add((row["engine"], row["policy"]))
        upsert(table, row)
    problem = check_table(table)
    if problem:
        raise ValueError(f"{source}: {problem}")
    notes = [f"note: {len(rows)} row(s) {origin}"]
    for row in rows:
        other = disagreement(table, row)
        if other is not None:
            notes.append(f"note: {visible(row['engine'], limit=80)} · {visible(row['policy'], limit=80)}: the imported row "
                         f"says {row['verdict']}, the row run here {other}; both are kept and the table shows they disagree")
    return table, notes


def add_parser(commands: Any) -> None:
    """The ``verdicts`` command's options."""
    verdicts = commands.add_parser(
        "verdicts", help="the losslessness verdict table of real engines (speculation on, and off as the control)",
        description="Run each engine on the target with speculation on and, as its control, off, under the same sampling "
                    "settings; audit both sides' generations against the target's law (the external audit); write the table "
                    f"({DEFAULT_OUT}) and its README copy. Rows whose evidence files are unchanged are kept (resume); "
                    "--rerun makes them again. A row whose control fails reads 'control failed: settings not matched'.")
    verdicts.add_argument("--engine", action="append", default=[], metavar="NAME",
                          help="all (default: every engine that runs here), transformers, vllm, openvino or "
                               "onnxruntime-genai (each in its own environment, built by its tools/build-*.sh), mutants (our engine with "
                               "each planted bug: each must fail), or an engine name; repeatable or comma-separated")
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
    verdicts.add_argument("--count-drafts", type=int, default=0, metavar="N",
                          help="for kept rows made before the table kept the engine's draft counters: replay the first N "
                               "generations of speculation on (each must give its stored tokens) and record the counts "
                               "(about a tenth of the row's time at N=32)")
    verdicts.add_argument("--import", dest="import_file", default=None, metavar="TABLE.json",
                          help="add the rows of a table made elsewhere (e.g. a GPU engine's; a regular file of at most 4 MiB), "
                               "validated and marked with their origin; an imported row never replaces a row run here: "
                               "both are kept, and a disagreement is shown")
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
    add_oracle_options(verdicts)
    verdicts.add_argument("--db", default=None, help="DuckDB file for the audits (default $SPECLAB_DB or data/runs.duckdb)")
    verdicts.set_defaults(handler=command_verdicts, interrupted="interrupted: each side's file keeps the generations "
                          "written so far; the same command continues them")
