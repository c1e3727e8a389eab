"""``audit``: losslessness at the rule level, the engine level, of a recorded run, or all of them."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

from diagnostics.cli.common import add_oracle_options, json_line


def command_audit(args: argparse.Namespace) -> int:
    from diagnostics.audit.reporting import json_safe, summary_line
    from diagnostics.audit.suite import AuditError

    samples_file = _samples_file(args)
    if sum(bool(value) for value in (args.run, args.engine, args.all, samples_file, args.endpoint)) > 1:
        raise AuditError("choose one of --run, --engine, --all, --samples FILE and --endpoint URL")
    if args.oracle == "server" and (args.baseline_samples or args.baseline_endpoint):
        raise AuditError("--oracle server tests against the server's own scores; a baseline is another oracle: choose one")
    if args.oracle == "server" and not (samples_file or args.endpoint):
        raise AuditError("--oracle server audits generations: add --samples FILE (with scores) or --endpoint URL")
    if args.baseline_endpoint and not args.endpoint:
        raise AuditError("--baseline-endpoint compares with --endpoint URL: give both")
    # --target's model, loaded at most once: the collector takes its tokenizer, the audit its law.
    load_target = functools.cache(lambda: _local_target(args.target))
    if args.endpoint:
        samples_file = _collect(args, load_target)
        if samples_file is None:
            return 0
    if args.baseline_samples and not samples_file:
        raise AuditError("--baseline-samples compares with --samples FILE: give both")
    if args.write_samples and not args.engine:
        raise AuditError("--write-samples writes an engine's generations: add --engine NAME")
    if args.real_positions < 0:
        raise AuditError(f"--real-positions must be >= 0 (real positions to add to the battery), got {args.real_positions}")
    if args.early_exit is not None and args.early_exit < 1:
        raise AuditError(f"--early-exit must be >= 1 (the draft's layers), got {args.early_exit}")
    if args.tree and not (args.engine or args.all):
        raise AuditError("--tree audits the tree engine: add --engine ours (or a planted tree bug), or --all")
    if samples_file:
        results = [_audit_samples(args, samples_file, load_target)]
    elif args.engine and args.write_samples:
        _write_engine_samples(args, args.engine)
        return 0
    elif args.run:
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
        print(json_line(json_safe(result)))
    if args.all:
        for result in results:
            print(summary_line(result), file=sys.stderr)
    return 0


def _samples_file(args: argparse.Namespace) -> str | None:
    """``--samples``: a JSONL file of generations to audit; a whole number is the rule level's draws
    per pair (its meaning before files could be audited, kept)."""
    if args.samples is None or args.samples.strip().lstrip("-").isdigit():
        return None
    return args.samples


def _collect(args: argparse.Namespace, load_target) -> str | None:
    """``--endpoint``: collect ``--n`` generations per prompt into ``--out`` (and the baseline's into
    ``OUT.baseline.jsonl``), then audit them like a file; ``None`` when there is nothing to audit against."""
    import time as clock

    from diagnostics.audit.collect import check_out, collect
    from diagnostics.audit.completions import Sampling
    from diagnostics.audit.endpoint_client import EndpointError
    from diagnostics.evaluation.prompts import load_prompts

    if not args.model or not args.prompts:
        raise EndpointError("--endpoint needs --model NAME (as the server knows it) and --prompts FILE (JSONL with \"prompt\")")
    if args.target is None and not args.baseline_endpoint and args.oracle != "server":
        raise EndpointError("give --target ID (a local copy of the served model), --baseline-endpoint URL (speculation off) "
                            "or --oracle server (the server's own scores) to audit against")
    prompts = [item.prompt for item in load_prompts(args.prompts)]
    sampling = Sampling(max_tokens=args.max_tokens, temperature=1.0 if args.temperature is None else args.temperature,
                        top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    out = Path(args.out or f"data/samples-{clock.strftime('%Y%m%d-%H%M%S')}.jsonl")
    for path in (out, _baseline_path(out)):
        check_out(path, new=True)
    timeouts = {"timeout_s": args.timeout, "collect_timeout_s": args.collect_timeout}
    tokenize, eos_id = _local_tokenizer(args, load_target)
    api_key = os.environ.get("OPENAI_API_KEY")
    collect(args.endpoint, args.model, prompts, out, n=args.n, sampling=sampling, first_seed=args.seed, speculative=True,
            tokenize=tokenize, eos_id=eos_id, rate=args.rate, api_key=api_key, progress=_progress("collecting"),
            scores_api=args.scores_api if args.oracle == "server" else None, score_logprobs=args.score_logprobs,
            api=args.completion_api, **timeouts)
    print(f"collected {len(prompts) * args.n} generations into {out}", file=sys.stderr)
    if args.baseline_endpoint:
        baseline = _baseline_path(out)
        # Seeds after the speculative side's: with the same seeds a lossless engine may return the same
        # texts on both sides (a coupling), and the two-sample test needs two independent samples.
        collect(args.baseline_endpoint, args.model, prompts, baseline, n=args.n, sampling=sampling,
                first_seed=args.seed + len(prompts) * args.n,
                speculative=False, tokenize=tokenize, eos_id=eos_id, rate=args.rate, api_key=api_key,
                progress=_progress("collecting the baseline"), api=args.completion_api, **timeouts)
        args.baseline_samples = str(baseline)
        print(f"collected the baseline into {baseline}", file=sys.stderr)
    return str(out)


def _baseline_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".jsonl") + ".baseline.jsonl")


def _local_tokenizer(args: argparse.Namespace, load_target):
    """With --target: its tokenizer and EOS id here (else the server's tokenizer, and no EOS id);
    ``load_target`` loads the model once for this and the audit after it."""
    from diagnostics.audit.suite import TINY

    if args.target is None or args.target == TINY:  # the tiny target has no tokenizer (and is no hub id to fetch)
        return None, None
    from diagnostics.audit.samples import target_tokenize

    return target_tokenize(load_target()[0])


def _rule_draws(args: argparse.Namespace) -> int:
    return int(args.samples) if args.samples is not None and not _samples_file(args) else args.draws


def _audit_samples(args: argparse.Namespace, path: str, load_target) -> dict:
    """The external audit of a samples file: against --baseline-samples (two-sample), the server's
    scores, or the local copy of --target (teacher forcing under each line's declared settings).
    Text-only lines get their ids from --target's tokenizer first (``samples.retokenize_with_target``)."""
    from diagnostics.audit.external import audit_samples
    from diagnostics.audit.samples import load_samples, retokenize_with_target
    from diagnostics.audit.suite import AuditError
    from diagnostics.audit.two_sample import two_sample_audit

    samples = load_samples(path)
    baseline = load_samples(args.baseline_samples) if args.baseline_samples else None
    needs_target = args.oracle != "server" and baseline is None
    if needs_target and args.target is None:
        raise AuditError("give --target ID (a local copy of the model the engine served) or --baseline-samples FILE "
                         "(the same engine with speculation off)")
    pending = any(sample.text_only for sample in samples + (baseline or []))
    target = eos = None
    if needs_target or (args.target is not None and (pending or args.oracle == "server")):
        target, eos = load_target()
    if pending and target is not None:
        retokenize_with_target(target, [samples, baseline or []], "--target")
    if args.oracle == "server":
        return _audit_scored(args, samples, path, target, eos)
    if baseline is not None:
        return two_sample_audit(samples, baseline, level=args.level, detect_tv=args.detect_tv, source=str(path)).as_dict()
    return audit_samples(samples, target, level=args.level, detect_tv=args.detect_tv, source=str(path), eos=eos,
                         progress=_progress("teacher forcing")).as_dict()


def _audit_scored(args: argparse.Namespace, samples: list, path: str, target, eos) -> dict:
    """``--oracle server``: against the scores in the file; with --target, a sample of them is
    recomputed here first (a disagreement fails the verdict). Either way stderr says what it rests on."""
    from diagnostics.audit.external import audit_scored_samples

    result = audit_scored_samples(samples, level=args.level, detect_tv=args.detect_tv, source=str(path), eos=eos,
                                  target=target, score_tolerance=args.score_tolerance)
    print(f"note: {result.notes[-1]}", file=sys.stderr)  # the caveat, or the cross-check's finding
    return result.as_dict()


def _local_target(spec: str):
    """``--target``'s model and EOS ids ('tiny': the random tiny target built here)."""
    from diagnostics.audit.suite import TINY, tiny_setup
    from diagnostics.engine import eos_ids
    from diagnostics.models import load_model

    if spec == TINY:
        setup = tiny_setup()
        return setup.target, setup.eos
    target = load_model(spec, trust_remote_code=False)
    return target, eos_ids(target, None)


def _write_engine_samples(args: argparse.Namespace, implementation: str) -> None:
    """``--engine NAME --write-samples FILE``: the generations an engine audit would make, as a
    samples file (the format ``--samples`` reads), to audit like any other engine's."""
    from diagnostics.audit.suite import engine_samples

    setup = _setup(args)
    plan = _engine_plan(args, implementation, setup)
    count = engine_samples(plan, setup, args.write_samples, progress=_progress(f"writing the generations of {plan.name}"))
    print(f"wrote {count} generations of {plan.name} to {args.write_samples}", file=sys.stderr)


def _budget(args: argparse.Namespace) -> tuple[int, int]:
    """Generations and tokens per generation of an engine audit: as given, else the target's defaults."""
    from diagnostics.audit.suite import MODEL_BUDGET, TINY, TINY_BUDGET

    default_generations, default_tokens = TINY_BUDGET if _target(args) == TINY else MODEL_BUDGET
    return (default_generations if args.generations is None else args.generations,
            default_tokens if args.max_new_tokens is None else args.max_new_tokens)


def _engine_plan(args: argparse.Namespace, implementation: str, setup):
    """The named generator with the command's budget, policy, seeds and tree (``suite.plan_engine_audit``)."""
    from diagnostics.audit.suite import plan_engine_audit

    generations, max_new_tokens = _budget(args)
    return plan_engine_audit(implementation, setup, generations=generations, max_new_tokens=max_new_tokens, gamma=args.gamma,
                             policy=_policy(args), level=args.level, first_seed=args.seed, tree=_audit_tree(args))


def _target(args: argparse.Namespace) -> str:
    from diagnostics.audit.suite import TINY

    return TINY if args.target is None else args.target


def _policy(args: argparse.Namespace):
    from diagnostics.policy import Policy

    if args.temperature is None and args.top_k is None and args.top_p is None:
        return None  # each implementation's default (the truncation bug needs top-k to show)
    return Policy(temperature=1.0 if args.temperature is None else args.temperature, top_k=args.top_k, top_p=args.top_p)


def _setup(args: argparse.Namespace):
    from diagnostics.audit.suite import DEFAULT_PROMPT, TINY, model_setup, tiny_setup

    if _target(args) == TINY:
        return tiny_setup()
    return model_setup(_target(args), layer=args.early_exit, prompt=args.prompt or DEFAULT_PROMPT)


def _progress(label: str):
    """A long command's progress on stderr: one line rewritten in place on a terminal; elsewhere
    (a log, a pipe, CI) a line at each tenth of the way and at the end, so that a redirected run
    still says it is alive."""
    terminal = sys.stderr.isatty()
    shown = {"done": 0}

    def report(done: int, total: int) -> None:
        if terminal:
            print(f"\r{label}: generation {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)
        elif done >= total or done - shown["done"] >= max(1, total / 10):
            shown["done"] = done
            print(f"{label}: generation {done}/{total}", file=sys.stderr, flush=True)

    return report


def _audit_engine(args: argparse.Namespace, implementation: str, setup=None) -> dict:
    from diagnostics.audit.suite import check_budget, run_engine_audit

    generations, max_new_tokens = _budget(args)
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
    result = run_rule_audit(implementation, rule=args.rule, samples=_rule_draws(args), level=args.level,
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
    from diagnostics.audit.suite import engine_audit_part

    setup = _setup(args)
    plan = _engine_plan(args, name, setup)
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




def mutant_names(layer: str) -> list[str]:
    from diagnostics.audit import BATCH_MUTANTS, ENGINE_MUTANTS, RULE_MUTANTS
    from diagnostics.audit.mutants import TREE_MUTANTS

    return list({"rule": RULE_MUTANTS, "tree": TREE_MUTANTS}.get(layer, {**ENGINE_MUTANTS, **BATCH_MUTANTS}))


def add_parser(commands: Any) -> None:
    """The ``audit`` command's options."""
    from diagnostics.audit.collect import COLLECT_TIMEOUT_S
    from diagnostics.audit.completions import MAX_RAW_BYTES
    from diagnostics.audit.endpoint_client import MAX_REDIRECTS, MAX_RESPONSE_BYTES, RETRIES, RETRY_BUDGET, TIMEOUT_S
    from diagnostics.audit.samples import MAX_FILE_BYTES, MAX_SAMPLES, MAX_TOKENS
    from diagnostics.audit.server_scores import CHECKED_POSITIONS, SCORE_TOLERANCE
    from diagnostics.untrusted_json import MAX_DEPTH

    audit = commands.add_parser(
        "audit", help="losslessness audit: a verification rule, a whole generator (--engine), a recorded run (--run), or all (--all)",
        description="Rule level (default): one verification step on a battery of (p, q) pairs. Engine level (--engine NAME): "
                    "seeded generations tested against the target's law by teacher forcing. Recorded (--run ID): replay a stored run. "
                    "--all: every implementation and planted bug at its layer. Prints JSON verdicts with their evidence.")
    audit.add_argument("--implementation", default="ours", metavar="NAME",
                       help="rule level: ours, transformers (its _speculative_sampling) or a planted bug: " + ", ".join(mutant_names("rule")))
    audit.add_argument("--rule", default=None, help="with --implementation ours: audit our rule SPEC (default lossless)")
    audit.add_argument("--declared", default=None, help="test against this lossy rule's exact law instead of p")
    audit.add_argument("--draws", type=int, default=60_000, help="rule level: verification steps per (p, q) pair")
    audit.add_argument("--samples", default=None, metavar="FILE.jsonl",
                       help="audit any engine from its outputs: one JSON object per line with prompt, token_ids, temperature, "
                            "top_k, top_p, min_p (optional prompt_ids, text, engine, speculative, max_tokens, completion_tokens); "
                            "a line with text and no token_ids is tokenised with --target's tokenizer (lines whose count differs "
                            "from completion_tokens are left out and counted); against --target's law by teacher forcing, or "
                            "against --baseline-samples (a whole number here is --draws, as before). Bounds: "
                            f"{MAX_FILE_BYTES // 2**20} MiB, {MAX_SAMPLES:,} lines, {MAX_TOKENS:,} ids a generation, JSON "
                            f"{MAX_DEPTH} levels deep, integers within 64 bits; ids must lie in the target's vocabulary")
    audit.add_argument("--baseline-samples", default=None, metavar="FILE.jsonl",
                       help="with --samples: the same engine's generations with speculation off (two-sample test; no weights "
                            "needed; compared up to each line's max_tokens when given, else the longest generation; memory "
                            "and time linear in the tokens)")
    audit.add_argument("--endpoint", default=None, metavar="URL",
                       help="collect generations from an OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI) with speculation on, "
                            "then audit them (with --target, or --baseline-endpoint)")
    audit.add_argument("--baseline-endpoint", default=None, metavar="URL",
                       help="with --endpoint: the same model served with speculation off (two-sample test)")
    audit.add_argument("--model", default=None, help="with --endpoint: the model name the server knows")
    audit.add_argument("--prompts", default=None, metavar="FILE",
                       help="with --endpoint: JSONL prompts (\"prompt\" per line), sent as raw completions; or 'general'")
    audit.add_argument("--n", type=int, default=100, help="with --endpoint: generations per prompt")
    audit.add_argument("--max-tokens", type=int, default=32, help="with --endpoint: tokens per generation")
    audit.add_argument("--min-p", type=float, default=None, help="with --endpoint: min-p (off when not given)")
    audit.add_argument("--rate", type=float, default=20.0, help="with --endpoint: at most this many requests per second")
    audit.add_argument("--out", default=None, metavar="FILE.jsonl",
                       help="with --endpoint: a new plain file (never a symlink) where the generations go, each raw answer "
                            f"kept whole up to {MAX_RAW_BYTES // 1024} KiB (larger: its head and sha256); the file stops "
                            f"short of the audit's {MAX_FILE_BYTES // 2**20} MiB limit (default data/samples-TIME.jsonl)")
    audit.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                       help=f"with --endpoint: each request's deadline, connect to last byte, however slowly bytes come "
                            f"(default {TIMEOUT_S:g}); a request's retries (at most {RETRIES}, on 429, 5xx or a refused "
                            f"connection; a timeout is not retried) all end within {RETRY_BUDGET} × this; redirects are "
                            f"followed within the endpoint's origin only (at most {MAX_REDIRECTS}), so the API key "
                            f"($OPENAI_API_KEY) never goes elsewhere; answers are read up to {MAX_RESPONSE_BYTES // 2**20} MiB")
    audit.add_argument("--collect-timeout", type=float, default=COLLECT_TIMEOUT_S, metavar="SECONDS",
                       help=f"with --endpoint: the whole collection's deadline, per file (default {COLLECT_TIMEOUT_S:g} = "
                            f"{COLLECT_TIMEOUT_S / 3600:g} h); what was collected by then is kept")
    audit.add_argument("--completion-api", default="openai", choices=["openai", "llama.cpp"],
                       help="with --endpoint: how generations are asked for: openai (/v1/completions; where the answer has "
                            "no ids, its text is tokenised and a non-canonical split is left out), or llama.cpp "
                            "(llama-server's own /completion with return_tokens: the ids it generated, none left out)")
    add_oracle_options(audit)
    audit.add_argument("--score-tolerance", type=float, default=SCORE_TOLERANCE, metavar="NATS",
                       help=f"with --oracle server and --target: up to {CHECKED_POSITIONS} positions of the server's scores "
                            f"are recomputed from --target's raw log-probabilities; a difference above this (default "
                            f"{SCORE_TOLERANCE:g}: float noise, bfloat16 included) fails the verdict. Without --target the "
                            "verdict says it rests on the server's scores being true")
    audit.add_argument("--detect-tv", type=float, default=0.05,
                       help="with --samples: the distortion (TV) to rule out; a clean sample too small to detect it is "
                            "'inconclusive', not 'pass'")
    audit.add_argument("--write-samples", default=None, metavar="FILE.jsonl",
                       help="with --engine: write its seeded generations as a samples file instead of auditing them")
    audit.add_argument("--real-positions", type=int, default=0, metavar="K",
                       help="rule level: add K real positions of --target (full-vocabulary p and its early-exit q) to the battery")
    audit.add_argument("--engine", default=None, metavar="NAME",
                       help="engine level: ours, transformers (generate with assistant_model, do_sample=True) or a planted bug: "
                            + ", ".join(mutant_names("engine")))
    audit.add_argument("--target", default=None,
                       help="engine level / real positions: 'tiny' (random 12-token Llamas built here, fast; the default), "
                            "'default' (embedded model) or a path/hub id; with --samples: the model the engine served")
    audit.add_argument("--early-exit", type=int, default=None, metavar="LAYER",
                       help="draft (and transformers' assistant) for a real target: its first LAYER layers (default 26)")
    audit.add_argument("--prompt", default=None, help="prompt for a real target (chat template applied)")
    audit.add_argument("--generations", type=int, default=None, help="engine level: seeded generations (default 800 tiny, 40 real)")
    audit.add_argument("--max-new-tokens", type=int, default=None, help="engine level: tokens per generation (default 12 tiny, 16 real)")
    audit.add_argument("--gamma", type=int, default=3, help="engine level: draft tokens per block")
    audit.add_argument("--tree", default=None, metavar="K1,K2,…",
                       help="engine level: audit the tree engine with this shape (e.g. 3,2,1, or sparse paths '[[0],[1],[0,0]]'); --engine ours or a planted "
                            "tree bug (" + ", ".join(mutant_names("tree")) + ")")
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
    audit.set_defaults(handler=command_audit)
