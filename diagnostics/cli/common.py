"""What every command shares: the one-line error contract of the parser, the generation options,
the server-oracle options, a run's JSON line, progress bars on a terminal only, and a request from the options."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import unicodedata
from typing import Any

from diagnostics.untrusted import INVISIBLE_CATEGORIES

DEFAULT_EARLY_EXIT = "early-exit:26"


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default, unless there is none to show (``None``, an off
    flag, an empty list) or the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default is argparse.SUPPRESS or default == []
        if nothing or re.search(r"\(default\b|default:|%\(default\)", text):
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with the project's error contract: one line ``error: …`` and exit status 2
    (argparse's own prints the whole usage first); every (sub)command's help shows defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        from diagnostics.untrusted import visible

        self.exit(2, f"error: {visible(message)} (see {self.prog} --help)\n")


RULE_LIST_HELP = ("comma-separated rule specs, the first being the reference; a bare number continues the previous spec "
                  "(its own parameters), so 'lossless,medusa:0.09,0.3' is two rules; ';' also separates "
                  "('lossless;medusa:0.09,0.3')")


def rule_help() -> str:
    from diagnostics.rules import EXAMPLE_SPECS

    return "verification rule spec: " + ", ".join(EXAMPLE_SPECS) + " (the numbers are example parameters)"


def add_generation_options(parser: argparse.ArgumentParser, replayable: bool = False, with_prompt: bool = True) -> None:
    """The options shared by ``run``, ``compare`` and ``sweep``; ``replayable``: ``--prompt`` may give
    way to ``--replay``; ``with_prompt=False``: no ``--prompt`` (a sweep reads a prompt file)."""
    from diagnostics.request import RunRequest

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
                             "(e.g. 3,2,1), or a sparse tree of child-number paths as Medusa's medusa_choices "
                             "(e.g. '[[0],[1],[0,0]]'); one target forward verifies every node (off when not given)")
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


def add_oracle_options(parser: argparse.ArgumentParser) -> None:
    """The server-oracle options of ``audit`` and ``verdicts``: ``--oracle``, ``--scores-api`` and
    ``--score-logprobs`` (each command checks them against its own other options)."""
    parser.add_argument("--oracle", default=None, choices=["server"],
                        help="test the server's generations against its own teacher-forced scores (collected with "
                             "--scores-api) instead of a local copy of the model or a baseline; where no local copy "
                             "checks them, the verdict rests on those scores being the engine's law")
    parser.add_argument("--scores-api", default="vllm", choices=["vllm", "sglang"],
                        help="with --endpoint --oracle server: ask for scores as vLLM (prompt_logprobs) or SGLang (input_top_logprobs)")
    parser.add_argument("--score-logprobs", type=int, default=20, metavar="K",
                        help="with --endpoint --oracle server: log-probabilities per token to ask for; the law is exact "
                             "when top-k <= K")


def json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run_json(run_id: str, run: Any, db: str) -> str:
    from diagnostics.metrics import noise_as_zero  # torch is loaded by now: this module stays light for --help

    summary = run.summary()
    payload = {
        "run_id": run_id,
        "status": run.status,
        "rule": run.rule,
        "draft": run.draft,
        "device": run.device,
        "tree": run.tree.text if run.tree is not None else None,
        "tree_children": run.tree.children if run.tree is not None else None,
        "tokens": len(run.tokens),
        "acceptance_rate": summary["acceptance_rate"],
        "block_efficiency": summary["block_efficiency"],
        "tokens_per_s": summary["tokens_per_s"],
        # Float rounding (a lossless run's 8e-16) reads as the 0 it is.
        "mean_tv_target": noise_as_zero(summary["mean_tv_target"]),
        "mean_tv_baseline": noise_as_zero(summary["mean_tv_baseline"]),
        "stop_reason": run.stop_reason,
        "text": run.text,
        "db": db,
    }
    return json_line({key: json_value(value) for key, value in payload.items()})


def json_line(payload: object) -> str:
    """``payload`` as one JSON line for a terminal: readable text (``café``) kept, but every
    character that acts instead of showing (bidi overrides such as U+202E, zero-width joiners,
    lone surrogates a terminal cannot encode) written as its ``\\uXXXX`` escape, which parses back
    to the same string. Such characters occur only inside JSON strings, so escaping them anywhere
    in the text keeps it valid JSON."""
    return "".join(_json_escape(char) if char > "\x7f" and unicodedata.category(char) in INVISIBLE_CATEGORIES else char
                   for char in json.dumps(payload, ensure_ascii=False))


def _json_escape(char: str) -> str:
    """``char`` as JSON escapes it: ``\\uXXXX``, or a surrogate pair of them beyond U+FFFF."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def progress_wanted(args: argparse.Namespace) -> bool:
    """Progress bars only on a terminal: redirected stderr (a log, a pipe) gets none, so it holds
    no carriage returns or escape codes; ``--no-progress`` turns them off on a terminal too."""
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def silence_library_progress_bars() -> None:
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


class Progress:
    """A progress bar on stderr, one step per emitted position (only when ``enabled``: see ``progress_wanted``)."""

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


def request_of(args: argparse.Namespace, rule: str):
    from diagnostics.policy import Policy
    from diagnostics.request import RunRequest

    policy = Policy(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, eta=args.eta)
    draft_policy = None
    if args.draft_temperature is not None:
        draft_policy = Policy(temperature=args.draft_temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, eta=args.eta)
    return RunRequest(prompt=args.prompt, rule=rule, draft=args.draft, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                      seed=args.seed, policy=policy, draft_policy=draft_policy, raw=args.raw, top_k_record=args.top_k_record,
                      tree=args.tree, tree_children=args.tree_children, tree_budget=args.tree_budget,
                      tree_depth=args.tree_depth, draft_stop=args.draft_stop)


def prepare(args: argparse.Namespace, rules: list[str]):
    """Validate cheap things first, then load models and open the store."""
    from diagnostics.drafts import load_draft
    from diagnostics.models import is_plain_draft, load_model
    from diagnostics.store import Store

    requests = [request_of(args, rule) for rule in rules]
    if args.draft is None and args.target == "default":
        args.draft = DEFAULT_EARLY_EXIT
        for request in requests:
            request.draft = DEFAULT_EARLY_EXIT
    for request in requests:
        request.validate()
    if args.draft is None:
        raise ValueError("pass --draft (model:ID_OR_PATH, early-exit:LAYER, ngram:N) or --draft none for plain decoding")
    if is_plain_draft(args.draft):
        for request in requests:
            request.draft = None
    store = Store(args.db)
    target = load_model(args.target, dtype=args.dtype, device=args.device, trust_remote_code=args.trust_remote_code)
    draft = load_draft(args.draft, target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    return store, target, draft, requests
