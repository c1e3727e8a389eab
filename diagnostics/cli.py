"""Command line: ``python -m diagnostics run | compare | bench``.

Each run prints one JSON object on stdout; progress goes to stderr. Bad input ends with a
one-line ``error: …`` on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Any

DEFAULT_EARLY_EXIT = "early-exit:26"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default, unless there is none to show (``None``, an off
    flag, an empty list) or the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default is argparse.SUPPRESS or default == []
        if nothing or re.search(r"\(default\b|default:|%\(default\)", text):
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error contract: one line ``error: …`` and exit status 2
    (argparse's own prints the whole usage first); every (sub)command's help shows defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        from diagnostics.untrusted import visible

        self.exit(2, f"error: {visible(message)} (see {self.prog} --help)\n")


RULE_LIST_HELP = ("comma-separated rule specs, the first being the reference; a bare number continues the previous spec "
                  "(its own parameters), so 'lossless,medusa:0.09,0.3' is two rules; ';' also separates "
                  "('lossless;medusa:0.09,0.3')")


def _rule_help() -> str:
    from diagnostics.rules import EXAMPLE_SPECS

    return "verification rule spec: " + ", ".join(EXAMPLE_SPECS) + " (the numbers are example parameters)"


def _add_generation_options(parser: argparse.ArgumentParser, replayable: bool = False, with_prompt: bool = True) -> None:
    """The options shared by ``run``, ``compare`` and ``sweep``; ``replayable``: ``--prompt`` may give
    way to ``--replay``; ``with_prompt=False``: no ``--prompt`` (a sweep reads a prompt file)."""
    from diagnostics.runner import RunRequest

    if with_prompt and replayable:
        parser.add_argument("--prompt", default=None, help="the user message (chat template applied unless --raw); required unless --replay")
        parser.add_argument("--replay", default=None, metavar="RUN_ID",
                            help="record a stored run (of --db) again with its own target, draft, rule, gamma, seed, token budget, "
                                 "policies, raw flag and prompt (loading the models it names), and say whether it reproduced its tokens")
    elif with_prompt:
        parser.add_argument("--prompt", required=True, help="the user message (chat template applied unless --raw)")
    parser.add_argument("--target", default="default", help="'default' (embedded SmolLM2-135M-Instruct), a hub id or a local path")
    parser.add_argument("--draft", default=None,
                        help="model:ID_OR_PATH, early-exit:LAYER, ngram:N or none (plain decoding); "
                             f"default {DEFAULT_EARLY_EXIT} for the embedded target")
    parser.add_argument("--gamma", type=int, default=RunRequest.gamma, help="draft tokens per block")
    parser.add_argument("--draft-stop", type=float, default=None, metavar="CONF",
                        help="adaptive drafting: end a block's drafts after a draft x with q(x) < CONF, as transformers' "
                             "assistant_confidence_threshold (gamma stays the most per block; exact: the rule reads the draft "
                             "alone; off when not given)")
    parser.add_argument("--tree", default=None, metavar="K1,K2,…",
                        help="draft a token tree per round instead of a chain: each node at depth i gets Ki children "
                             "(e.g. 3,2,1); one target forward verifies every node (off when not given)")
    parser.add_argument("--tree-budget", type=int, default=None, metavar="N",
                        help="a dynamic tree instead: the N draft nodes of highest path probability (EAGLE-2 style)")
    parser.add_argument("--tree-depth", type=int, default=None, metavar="D",
                        help="depth of a --tree-budget tree (default 5)")
    parser.add_argument("--tree-children", default="top", choices=["top", "sample", "sample-distinct"],
                        help="a node's children: the draft's top tokens (EAGLE), i.i.d. draws from q (SpecInfer), "
                             "or draws without replacement (Sequoia)")
    parser.add_argument("--max-new-tokens", type=int, default=RunRequest.max_new_tokens, help="token budget of the generation")
    parser.add_argument("--temperature", type=float, default=1.0, help="policy temperature; 0 means greedy")
    parser.add_argument("--top-k", type=int, default=None, help="keep the K most likely tokens (off when not given)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus: keep the smallest set of mass >= P (off when not given)")
    parser.add_argument("--min-p", type=float, default=None, help="keep tokens with probability >= MIN_P x the largest (off when not given)")
    parser.add_argument("--eta", type=float, default=None, help="eta sampling cut-off (off when not given)")
    parser.add_argument("--draft-temperature", type=float, default=None, help="draft policy temperature (default: the target's policy)")
    parser.add_argument("--seed", type=int, default=RunRequest.seed, help="seed of every uniform the run draws")
    parser.add_argument("--raw", action="store_true", help="do not apply the chat template")
    parser.add_argument("--top-k-record", type=int, default=20, help="how many of p's and q's top tokens to store per position")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "auto"], help="weights' dtype")
    parser.add_argument("--device", default=None, help="cuda, cpu, … (default: cuda when present)")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow models that ship their own code")
    parser.add_argument("--db", default=None, help="DuckDB file (default $SPECLAB_DB or data/runs.duckdb)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (there are none anyway when stderr is not a terminal)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m diagnostics", description="Speculative-decoding verification lab")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="generate once with a verification rule and record every position")
    _add_generation_options(run, replayable=True)
    run.add_argument("--rule", default="lossless", help=_rule_help())
    compare = commands.add_parser("compare", help="coupled runs (same seed and uniforms), one per rule")
    _add_generation_options(compare)
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
    sweep.add_argument("--cost", type=float, default=None, metavar="C",
                       help="draft/target cost ratio c of one step for the modelled speed-up (default: measured here)")
    sweep.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="run the units on Ray: alone, a local Ray started for the sweep; with ADDRESS (e.g. ray://head:10001 or "
                            "auto), an existing cluster whose nodes have the requirements installed. The driver alone writes --db")
    sweep.add_argument("--workers", type=int, default=None, metavar="N",
                       help="Ray workers, each loading the models once (default: one per GPU, else one per CPU)")
    sweep.add_argument("--threads", type=int, default=None, metavar="N",
                       help="torch CPU threads (in this process, or per Ray worker; default: torch's own, and 1 per CPU "
                            "worker). Floats depend on it, so the same N reproduces a sweep bit for bit")
    _add_generation_options(sweep, with_prompt=False)
    sweep.set_defaults(max_new_tokens=32)
    report = commands.add_parser("report", help="one self-contained HTML file for runs (a run or a compared group) and audits")
    report.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to include (their stored audits come with them)")
    report.add_argument("--audit", action="append", default=[], metavar="AUDIT_ID", help="a stored audit to include (repeatable)")
    report.add_argument("--sweep", action="append", default=[], metavar="SWEEP_ID",
                        help="a stored sweep to include: its Pareto chart, figures with intervals and verdicts (repeatable)")
    report.add_argument("--cost", type=float, default=0.5, metavar="C",
                        help="draft/target cost ratio of one step for the sweeps' modelled speed-up")
    report.add_argument("--db", default=None, help="DuckDB file (default $SPECLAB_DB or data/runs.duckdb)")
    report.add_argument("-o", "--output", required=True, help="the HTML file to write")
    audit = commands.add_parser(
        "audit", help="losslessness audit: a verification rule, a whole generator (--engine), a recorded run (--run), or all (--all)",
        description="Rule level (default): one verification step on a battery of (p, q) pairs. Engine level (--engine NAME): "
                    "seeded generations tested against the target's law by teacher forcing. Recorded (--run ID): replay a stored run. "
                    "--all: every implementation and planted bug at its layer. Prints JSON verdicts with their evidence.")
    audit.add_argument("--implementation", default="ours", metavar="NAME",
                       help="rule level: ours, transformers (its _speculative_sampling) or a planted bug: " + ", ".join(_mutant_names("rule")))
    audit.add_argument("--rule", default=None, help="with --implementation ours: audit our rule SPEC (default lossless)")
    audit.add_argument("--declared", default=None, help="test against this lossy rule's exact law instead of p")
    audit.add_argument("--samples", type=int, default=60_000, help="rule level: verification steps per (p, q) pair")
    audit.add_argument("--real-positions", type=int, default=0, metavar="K",
                       help="rule level: add K real positions of --target (full-vocabulary p and its early-exit q) to the battery")
    audit.add_argument("--engine", default=None, metavar="NAME",
                       help="engine level: ours, transformers (generate with assistant_model, do_sample=True) or a planted bug: "
                            + ", ".join(_mutant_names("engine")))
    audit.add_argument("--target", default="tiny",
                       help="engine level / real positions: 'tiny' (random 12-token Llamas built here, fast), 'default' (embedded model) or a path/hub id")
    audit.add_argument("--early-exit", type=int, default=None, metavar="LAYER",
                       help="draft (and transformers' assistant) for a real target: its first LAYER layers (default 26)")
    audit.add_argument("--prompt", default=None, help="prompt for a real target (chat template applied)")
    audit.add_argument("--generations", type=int, default=None, help="engine level: seeded generations (default 800 tiny, 40 real)")
    audit.add_argument("--max-new-tokens", type=int, default=None, help="engine level: tokens per generation (default 12 tiny, 16 real)")
    audit.add_argument("--gamma", type=int, default=3, help="engine level: draft tokens per block")
    audit.add_argument("--tree", default=None, metavar="K1,K2,…",
                       help="engine level: audit the tree engine with this shape (e.g. 3,2,1); --engine ours or a planted "
                            "tree bug (" + ", ".join(_mutant_names("tree")) + ")")
    audit.add_argument("--tree-children", default="top", choices=["top", "sample", "sample-distinct"],
                       help="engine level with --tree: how each node's children are drafted")
    audit.add_argument("--temperature", type=float, default=None, help="engine level: the policy (default 1)")
    audit.add_argument("--top-k", type=int, default=None, help="engine level: top-k of the policy (off when not given)")
    audit.add_argument("--top-p", type=float, default=None, help="engine level: top-p of the policy (off when not given)")
    audit.add_argument("--level", type=float, default=0.01, help="family-wise false-alarm rate of a correct implementation")
    audit.add_argument("--seed", type=int, default=0, help="first seed of the audit's draws")
    audit.add_argument("--run", default=None, help="audit a recorded run instead: replay every decision (with --db)")
    audit.add_argument("--load-models", action="store_true",
                       help="with --run: load the models the run names (local files only) to recompute p; without it, only "
                            "the embedded default is loaded, since a shared database can name any folder")
    audit.add_argument("--all", action="store_true", help="every implementation and planted bug at its layer; prints a table on stderr")
    audit.add_argument("--save", action="store_true", help="store the audit(s) in the database (shown on the Audit page and in reports)")
    audit.add_argument("--db", default=None, help="DuckDB file (default $SPECLAB_DB or data/runs.duckdb)")
    bench = commands.add_parser("bench", help="speed ratios against plain decoding and transformers generate, in one run",
                                description="Every number is a ratio measured side by side in one run on the embedded model; "
                                            "prints one JSON object.")
    bench.add_argument("--max-new-tokens", type=int, default=48, help="tokens each timed generation makes (EOS ignored on both sides)")
    bench.add_argument("--repeat", type=int, default=3, help="alternating repetitions per comparison; the median is reported")
    bench.add_argument("--json", default=None, metavar="FILE", help="also write the JSON figures to FILE (to compare runs)")
    bench.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                       help="weights' dtype (bfloat16 on a GPU; the laws are still computed in float64)")
    bench.add_argument("--only", default=None, choices=["trees"],
                       help="only one section: trees (chain against trees: tokens per target forward, tokens/s, forward cost)")
    bench.add_argument("--quick", action="store_true",
                       help="fewer settings and a smaller recording-memory probe (200 positions instead of 2000), for a smoke test")
    return parser


def _mutant_names(layer: str) -> list[str]:
    from diagnostics.audit import BATCH_MUTANTS, ENGINE_MUTANTS, RULE_MUTANTS
    from diagnostics.audit.mutants import TREE_MUTANTS

    return list({"rule": RULE_MUTANTS, "tree": TREE_MUTANTS}.get(layer, {**ENGINE_MUTANTS, **BATCH_MUTANTS}))




def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _run_json(run_id: str, run: Any, db: str) -> str:
    summary = run.summary()
    payload = {
        "run_id": run_id,
        "status": run.status,
        "rule": run.rule,
        "draft": run.draft,
        "tree": run.tree.text if run.tree is not None else None,
        "tree_children": run.tree.children if run.tree is not None else None,
        "tokens": len(run.tokens),
        "acceptance_rate": summary["acceptance_rate"],
        "block_efficiency": summary["block_efficiency"],
        "tokens_per_s": summary["tokens_per_s"],
        "mean_tv_target": summary["mean_tv_target"],
        "mean_tv_baseline": summary["mean_tv_baseline"],
        "stop_reason": run.stop_reason,
        "text": run.text,
        "db": db,
    }
    return json.dumps({key: _json_value(value) for key, value in payload.items()}, ensure_ascii=False)


def _progress_wanted(args: argparse.Namespace) -> bool:
    """Progress bars only on a terminal: redirected stderr (a log, a pipe) gets none, so it holds
    no carriage returns or escape codes; ``--no-progress`` turns them off on a terminal too."""
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def _silence_library_progress_bars() -> None:
    """No tqdm bars from Hugging Face (weights loading, GGUF conversion, downloads). Environment
    variables work only before tqdm and huggingface_hub are imported (a fresh process); the
    libraries' own switches cover a process that imported them already."""
    if "tqdm" not in sys.modules and "huggingface_hub" not in sys.modules:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF conversion uses a bare tqdm
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


class _Progress:
    """A progress bar on stderr, one step per emitted position (only when ``enabled``: see ``_progress_wanted``)."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="tok", file=sys.stderr, leave=False, dynamic_ncols=True)

    def __call__(self, record: Any) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _request(args: argparse.Namespace, rule: str):
    from diagnostics.policy import Policy
    from diagnostics.runner import RunRequest

    policy = Policy(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, eta=args.eta)
    draft_policy = None
    if args.draft_temperature is not None:
        draft_policy = Policy(temperature=args.draft_temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, eta=args.eta)
    return RunRequest(prompt=args.prompt, rule=rule, draft=args.draft, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                      seed=args.seed, policy=policy, draft_policy=draft_policy, raw=args.raw, top_k_record=args.top_k_record,
                      tree=args.tree, tree_children=args.tree_children, tree_budget=args.tree_budget,
                      tree_depth=args.tree_depth, draft_stop=args.draft_stop)


def _prepare(args: argparse.Namespace, rules: list[str]):
    """Validate cheap things first, then load models and open the store."""
    from diagnostics.models import load_draft, load_model
    from diagnostics.store import Store

    requests = [_request(args, rule) for rule in rules]
    if args.draft is None and args.target == "default":
        args.draft = DEFAULT_EARLY_EXIT
        for request in requests:
            request.draft = DEFAULT_EARLY_EXIT
    for request in requests:
        request.validate()
    if args.draft is None:
        raise ValueError("pass --draft (model:ID_OR_PATH, early-exit:LAYER, ngram:N) or --draft none for plain decoding")
    if args.draft.strip().lower() in ("none", "plain"):
        for request in requests:
            request.draft = None
    store = Store(args.db)
    target = load_model(args.target, dtype=args.dtype, device=args.device, trust_remote_code=args.trust_remote_code)
    draft = load_draft(args.draft, target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    return store, target, draft, requests


def _command_run(args: argparse.Namespace) -> int:
    from diagnostics.runner import record_run

    if args.replay is not None:
        return _command_replay(args)
    if args.prompt is None:
        raise ValueError("pass --prompt TEXT, or --replay RUN_ID to record a stored run again")
    store, target, draft, (request,) = _prepare(args, [args.rule])
    progress = _Progress(request.max_new_tokens, request.rule, _progress_wanted(args))
    try:
        run_id, run = record_run(store, target, draft, request, on_record=progress)
    finally:
        progress.close()
    print(_run_json(run_id, run, str(store.path)), flush=True)
    return 0


# Options that say how to generate: a replay takes them from the stored run, so typing one is a mistake.
_REPLAYED_OPTIONS = ("prompt", "rule", "target", "draft", "gamma", "max_new_tokens", "temperature", "top_k", "top_p",
                     "min_p", "eta", "draft_temperature", "seed", "raw", "tree", "tree_budget", "tree_depth", "tree_children")


def _command_replay(args: argparse.Namespace) -> int:
    """``run --replay RUN_ID``: record the stored run again with its own settings; print the usual
    JSON plus ``replay_of`` and ``reproduced`` (the new token ids equal the stored ones)."""
    from pathlib import Path

    from diagnostics.inspection import target_spec
    from diagnostics.models import load_draft, load_model
    from diagnostics.runner import check_replay_prompt, record_run, request_from_run
    from diagnostics.store import Store, default_db_path

    if args.prompt is not None:
        raise ValueError("--prompt and --replay exclude each other: a replay uses the stored run's own prompt")
    defaults = vars(build_parser().parse_args(["run", "--replay", "placeholder"]))
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
    progress = _Progress(request.max_new_tokens, f"replay {request.rule}", _progress_wanted(args))
    try:
        run_id, run = record_run(store, target, draft, request, on_record=progress)
    finally:
        progress.close()
    payload = json.loads(_run_json(run_id, run, str(store.path)))
    stored_tokens = [int(token) for token in stored.get("tokens") or []]
    payload.update(replay_of=args.replay, reproduced=list(run.tokens) == stored_tokens)
    print(json.dumps(payload, ensure_ascii=False), flush=True)
    return 0


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


def _command_compare(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from diagnostics.comparison import matched_baseline, parse_seeds, references, run_group
    from diagnostics.rules import split_specs

    seeds = parse_seeds(args.seeds) if args.seeds is not None else [args.seed]
    shapes = _shapes(args)
    store, target, draft, per_rule = _prepare(args, split_specs(args.rules))
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
    bars: list[_Progress] = []

    def progress_for(index: int, request: Any) -> _Progress:
        label = request.rule if len(seeds) == 1 else f"{request.rule} · seed {request.seed}"
        bars.append(_Progress(request.max_new_tokens, label, _progress_wanted(args)))
        return bars[-1]

    try:
        group_id, results, divergence = run_group(store, target, draft, requests, on_record_for=progress_for)
    finally:
        for bar in bars:
            bar.close()
    refs = references(store.group(group_id))
    for (run_id, run), request in zip(results, requests):
        payload = json.loads(_run_json(run_id, run, str(store.path)))
        payload.update(group_id=group_id, seed=request.seed, divergence_position=divergence[run_id], reference_run=refs[request.seed])
        print(json.dumps(payload, ensure_ascii=False), flush=True)
    return 0


def _command_sweep(args: argparse.Namespace) -> int:
    """``sweep``: run (or resume) a sweep, then print its per-setting figures with intervals as JSON
    and one verdict line per rule on stderr."""
    from diagnostics.cost import draft_cost_ratio
    from diagnostics.evaluation.prompts import load_prompts
    from diagnostics.evaluation.answers import require_sandbox_for
    from diagnostics.evaluation.settings import checkers_of
    from diagnostics.evaluation.sweeper import base_request, expand_rules, plan_units, run_sweep, settings_of
    from diagnostics.models import load_draft, load_model
    from diagnostics.runner import encode_prompt
    from diagnostics.store import Store

    if args.cost is not None and args.cost < 0:
        raise ValueError(f"--cost must be >= 0 (draft step / target step), got {args.cost}")
    if args.check_answers:
        from diagnostics.evaluation.answers import recheck_sweep

        if args.prompts or args.rule or args.limit or args.resume:
            raise ValueError("--check-answers takes a stored sweep; drop --prompts, --limit, --rule and --resume")
        store = Store(args.db)
        scores = recheck_sweep(store, args.check_answers, save=True)
        print(f"sweep {args.check_answers}: {len(scores)} runs checked, {sum(scores.values()):g} passed", file=sys.stderr)
        return _print_sweep(store, args.check_answers, args.cost if args.cost is not None else 0.0)
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
        base = _request(args, "lossless")
        settings = {**settings_of(prompts, rules, args.seeds, base, str(args.prompts)), "target": args.target}
        store, sweep_id = Store(args.db), None
    base = base_request(settings)
    plan_units(settings)  # checks the seeds
    require_sandbox_for(checkers_of(settings))  # before loading any model: HumanEval checks need bubblewrap
    on_terminal, quiet = _progress_wanted(args), getattr(args, "no_progress", False)
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
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.ray:
        from diagnostics.evaluation.distributed import run_sweep_on_ray

        options = {"dtype": args.dtype, "device": args.device, "trust_remote_code": args.trust_remote_code,
                   "threads": args.threads}
        try:
            sweep_id, measured = run_sweep_on_ray(store, settings, options, address=None if args.ray == "local" else args.ray,
                                                  workers=args.workers, sweep_id=sweep_id, on_unit=on_unit, on_open=on_open,
                                                  measure_cost=args.cost is None)
        except KeyboardInterrupt:
            _sweep_interrupted(opened)
            return 130
        return _print_sweep(store, sweep_id, args.cost if args.cost is not None else measured or 0.0)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    target = load_model(settings.get("target", "default"), dtype=args.dtype, device=args.device,
                        trust_remote_code=args.trust_remote_code)
    draft = load_draft(base.draft, target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    try:
        sweep_id = run_sweep(store, target, draft, settings, sweep_id=sweep_id, on_unit=on_unit, on_open=on_open)
    except KeyboardInterrupt:
        _sweep_interrupted(opened)
        return 130
    cost = args.cost
    if cost is None:
        drafter = draft if hasattr(draft, "model") else None
        cost = draft_cost_ratio(target, drafter, encode_prompt(target, settings["prompts"][0]["prompt"], base.raw))
    return _print_sweep(store, sweep_id, cost)


def _sweep_interrupted(opened: list[str]) -> None:
    resume = f"; run the missing units with: sweep --resume {opened[0]} (and the same --db)" if opened else ""
    print(f"\ninterrupted: the finished units are kept and the sweep is marked 'interrupted'{resume}", file=sys.stderr)


def _print_sweep(store, sweep_id: str, cost: float) -> int:
    """The sweep's per-setting figures with intervals as JSON on stdout, one verdict per rule on stderr."""
    from diagnostics.evaluation.stats import as_rows, summarise_sweep, sweep_table

    summaries = summarise_sweep(sweep_table(store, sweep_id, cost))
    sweep = store.get_sweep(sweep_id)
    print(json.dumps({"sweep_id": sweep_id, "status": sweep["status"], "units": sweep["units"], "units_done": sweep["units_done"],
                      "cost_ratio": round(cost, 4), "db": str(store.path), "settings": as_rows(summaries)}, ensure_ascii=False))
    for summary in summaries:
        if summary.role == "rule":
            print(summary.verdict(), file=sys.stderr)
    return 0


def _command_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from diagnostics.report import build_report
    from diagnostics.store import Store, complete_groups
    from diagnostics.untrusted import visible

    output = Path(args.output).expanduser()
    if output.is_dir():
        raise ValueError(f"{output} is a folder; give -o a file name, e.g. {output / 'report.html'}")
    if not output.parent.is_dir():
        raise ValueError(f"the folder {output.parent} does not exist; create it, or give -o a path in an existing folder")
    store = Store(args.db, read_only=True)
    completion = complete_groups(store, args.run_ids)  # build_report does the same: a group is reported whole
    if args.cost < 0:
        raise ValueError(f"--cost must be >= 0 (draft step / target step), got {args.cost}")
    # Built before the file is opened: no half-written report.
    text = build_report(store, args.run_ids, args.audit, args.sweep, cost=args.cost)
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot write {output}: {error.strerror or error}") from None
    for note in completion.notes("reported"):
        print(f"note: {visible(note, limit=500)}", file=sys.stderr)
    print(json.dumps({"report": str(output.resolve()), "runs": completion.run_ids, "audits": args.audit,
                      "added_for_groups": completion.added, "bytes": len(text.encode())}, ensure_ascii=False))
    return 0


def _command_audit(args: argparse.Namespace) -> int:
    from diagnostics.audit.reporting import json_safe, summary_line
    from diagnostics.audit.suite import AuditError

    if sum(bool(value) for value in (args.run, args.engine, args.all)) > 1:
        raise AuditError("choose one of --run, --engine and --all")
    if args.real_positions < 0:
        raise AuditError(f"--real-positions must be >= 0 (real positions to add to the battery), got {args.real_positions}")
    if args.early_exit is not None and args.early_exit < 1:
        raise AuditError(f"--early-exit must be >= 1 (the draft's layers), got {args.early_exit}")
    if args.tree and not (args.engine or args.all):
        raise AuditError("--tree audits the tree engine: add --engine ours (or a planted tree bug), or --all")
    if args.run:
        results = [_audit_recorded(args)]
    elif args.engine:
        results = [_audit_engine(args, args.engine)]
    elif args.all:
        results = _audit_all(args)
    else:
        results = [_audit_rule(args, args.implementation)]
    if args.save:
        from diagnostics.store import Store

        store = Store(args.db)
        for result in results:
            result["audit_id"] = store.add_audit(result, summary_line(result))
    for result in results:
        print(json.dumps(json_safe(result), ensure_ascii=False))
    if args.all:
        for result in results:
            print(summary_line(result), file=sys.stderr)
    return 0


def _policy(args: argparse.Namespace):
    from diagnostics.policy import Policy

    if args.temperature is None and args.top_k is None and args.top_p is None:
        return None  # each implementation's default (the truncation bug needs top-k to show)
    return Policy(temperature=1.0 if args.temperature is None else args.temperature, top_k=args.top_k, top_p=args.top_p)


def _setup(args: argparse.Namespace):
    from diagnostics.audit.suite import DEFAULT_PROMPT, TINY, model_setup, tiny_setup

    if args.target == TINY:
        return tiny_setup()
    return model_setup(args.target, layer=args.early_exit, prompt=args.prompt or DEFAULT_PROMPT)


def _progress(label: str):
    if not sys.stderr.isatty():
        return None

    def report(done: int, total: int) -> None:
        print(f"\r{label}: generation {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)

    return report


def _audit_engine(args: argparse.Namespace, implementation: str, setup=None) -> dict:
    from diagnostics.audit.suite import MODEL_BUDGET, TINY, TINY_BUDGET, check_budget, run_engine_audit

    default_generations, default_tokens = TINY_BUDGET if args.target == TINY else MODEL_BUDGET
    generations = default_generations if args.generations is None else args.generations
    max_new_tokens = default_tokens if args.max_new_tokens is None else args.max_new_tokens
    check_budget(generations, max_new_tokens, args.gamma)  # before loading any model
    tree = _audit_tree(args)
    result = run_engine_audit(
        implementation, setup or _setup(args), generations=generations, max_new_tokens=max_new_tokens,
        gamma=args.gamma, policy=_policy(args), level=args.level, first_seed=args.seed, progress=_progress(implementation),
        tree=tree,
    )
    return result.as_dict()


def _audit_tree(args: argparse.Namespace):
    """The ``--tree`` shape of an engine audit (``None``: the chain engine), checked before any model loads."""
    from diagnostics.engine.tree_draft import parse_tree

    return parse_tree(args.tree, children=args.tree_children) if args.tree else None


def _audit_rule(args: argparse.Namespace, implementation: str, real_pairs: list | None = None) -> dict:
    from diagnostics.audit.suite import real_positions, run_rule_audit

    if real_pairs is None and args.real_positions:
        real_pairs = real_positions(_setup(args), args.real_positions)
    result = run_rule_audit(implementation, rule=args.rule, samples=args.samples, level=args.level,
                            declared=args.declared, seed=args.seed, real_pairs=real_pairs)
    return result.as_dict()


AUDIT_PARTS = 2  # each engine audit's seeds run in this many slices, so the cores share the slowest audit


def _audit_all(args: argparse.Namespace) -> list[dict]:
    """Our implementation, transformers', and every planted bug, each at its layer.

    The audits are seeded and each engine audit's seeds split into disjoint slices whose PIT
    samples merge into exactly what one pass gives, so the parts run in worker processes (one per
    core, one torch thread each, the slowest first) with the same verdicts and statistics as in
    one process; results come back in the listed order."""
    from diagnostics.audit.engine_level import engine_audit
    from diagnostics.audit.suite import ENGINE_IMPLEMENTATIONS, RULE_IMPLEMENTATIONS, TREE_IMPLEMENTATIONS, real_positions

    real_pairs = real_positions(_setup(args), args.real_positions) if args.real_positions else None
    engines = TREE_IMPLEMENTATIONS if args.tree else ENGINE_IMPLEMENTATIONS  # with --tree: the tree engine and its bugs
    rules = list(RULE_IMPLEMENTATIONS)
    # Longest first: transformers' generate, transformers' rule-level step (one call per few
    # drafts), then our engine and the planted ones, then the vectorised rule-level audits.
    slowest = sorted(engines, key=lambda name: name != "transformers")
    jobs = ([("engine", name, part) for name in slowest[:1] for part in range(AUDIT_PARTS)]
            + [("rule", name, 0) for name in rules if name == "transformers"]
            + [("engine", name, part) for name in slowest[1:] for part in range(AUDIT_PARTS)]
            + [("rule", name, 0) for name in rules if name != "transformers"])
    workers = min(os.cpu_count() or 1, 4)
    if workers < 2:
        done = {job: _audit_job(args, job, real_pairs) for job in jobs}
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_one_thread) as pool:
            futures = {job: pool.submit(_audit_job, args, job, real_pairs) for job in jobs}
            done = {job: future.result() for job, future in futures.items()}
    results = [done[("rule", name, 0)] for name in rules]
    for name in engines:
        parts = [done[("engine", name, part)] for part in range(AUDIT_PARTS)]
        sample = parts[0]["sample"]
        for part in parts[1:]:
            sample = sample.merge(part["sample"])
        first = parts[0]
        results.append(engine_audit(sample, first["prompt_ids"], first["seeds"], level=args.level,
                                    implementation=first["name"], settings=first["settings"]).as_dict())
    return results


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _audit_job(args: argparse.Namespace, job: tuple[str, str, int], real_pairs: list | None) -> dict:
    """One part of ``audit --all``: a rule-level audit, or one slice of an engine audit's seeds."""
    kind, name, part = job
    if kind == "rule":
        return _audit_rule(args, name, real_pairs)
    from diagnostics.audit.suite import MODEL_BUDGET, TINY, TINY_BUDGET, engine_audit_part, plan_engine_audit

    default_generations, default_tokens = TINY_BUDGET if args.target == TINY else MODEL_BUDGET
    setup = _setup(args)
    plan = plan_engine_audit(name, setup, generations=default_generations if args.generations is None else args.generations,
                             max_new_tokens=default_tokens if args.max_new_tokens is None else args.max_new_tokens,
                             gamma=args.gamma, policy=_policy(args), level=args.level, first_seed=args.seed,
                             tree=_audit_tree(args))
    return {"sample": engine_audit_part(plan, setup, part, AUDIT_PARTS), "name": plan.name, "settings": plan.settings,
            "seeds": list(plan.seeds), "prompt_ids": list(setup.prompt_ids)}


def _audit_recorded(args: argparse.Namespace) -> dict:
    from diagnostics.audit import audit_recorded_run
    from diagnostics.inspection import models_to_load, target_spec
    from diagnostics.models import ModelError, load_model
    from diagnostics.store import Store
    from diagnostics.untrusted import visible

    store = Store(args.db, read_only=True)
    run = store.get_run(args.run)
    if run is None:
        raise ValueError(f"there is no run {args.run!r} in {store.path}")
    target = None
    named = models_to_load(run)
    if named and not args.load_models:
        # A database (maybe a colleague's) names these; loading them is the user's call.
        print(f"note: p is not recomputed: the run names {', '.join(visible(name, limit=200) for name in named)}; "
              "pass --load-models to load it from this machine (never from the network)", file=sys.stderr)
    else:
        try:
            target = load_model(target_spec(run), local_only=True)
        except ModelError as error:
            print(f"note: p is not recomputed: {visible(error)}", file=sys.stderr)  # replay and flags only
    payload = audit_recorded_run(store, args.run, target).as_dict()
    payload["p_recomputed"] = target is not None
    return payload


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    words = sys.argv[1:] if argv is None else list(argv)
    if not sys.stderr.isatty() or "--no-progress" in words:
        _silence_library_progress_bars()  # before build_parser imports the libraries that read the environment
    args = build_parser().parse_args(argv)
    if not _progress_wanted(args):
        _silence_library_progress_bars()
    from diagnostics.engine import EngineError
    from diagnostics.models import ModelError
    from diagnostics.policy import PolicyError
    from diagnostics.rules import RuleError
    from diagnostics.evaluation.sandbox import SandboxUnavailable
    from diagnostics.store import StoreError

    try:
        if args.command == "run":
            return _command_run(args)
        if args.command == "compare":
            return _command_compare(args)
        if args.command == "report":
            return _command_report(args)
        if args.command == "audit":
            return _command_audit(args)
        if args.command == "sweep":
            return _command_sweep(args)
        from diagnostics.bench import run_bench

        return run_bench(args)
    except (RuleError, PolicyError, ModelError, EngineError, StoreError, ValueError, SandboxUnavailable) as error:
        from diagnostics.untrusted import visible

        # One line, whatever the message quotes (a file's rule spec, a path): escapes shown, not run.
        print(f"error: {visible(error, limit=2000)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: what was recorded is kept and the run is marked 'interrupted'", file=sys.stderr)
        return 130
