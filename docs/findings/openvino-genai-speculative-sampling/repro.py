#!/usr/bin/env python3
"""Standalone reproduction: OpenVINO GenAI's draft-model speculative decoding is not lossless when
it samples.

    data/openvino/venv/bin/python repro.py TARGET_IR DRAFT_IR [--requests 4] [--seed 0]
                                          [--max-new-tokens 32] [--threads 2] [--json FILE]

TARGET_IR and DRAFT_IR are folders of OpenVINO IR (openvino_model.xml, plus the tokenizer IR in
the target's folder), as ``optimum-cli export openvino`` writes them. Imports only the standard
library, ``openvino``, ``openvino_genai`` and ``numpy``.

What goes wrong (src/cpp/src/sampling/sampler.cpp, ``validate_candidate`` and the sampling loop
that calls it). To be lossless, a drafted token x must be kept with probability
min(1, p(x) / q(x)), where p is the target's law and q the draft's law at that position; after a
rejection the replacement must be drawn from max(0, p - q), normalised, at the same position.
The engine does neither. It keeps x when a draw from a 101-point grid is at most
q(x) / p(y), where y is a token freshly sampled from the target: the ratio compares two
different tokens and is upside down. After a rejection it moves on and takes its replacement
from the logits of the next position, which were computed with the rejected token in the
context. So drafted tokens that the target would never produce are kept.

How this script shows it. With top-k 20 an exact sampler can only emit a token that lies in the
target's 20 most likely tokens for its own prefix. The script generates, for one fixed prompt
and --requests seeds (one continuous batch, ``rng_seed`` = seed), with do_sample, temperature 1,
top-k 20:

1. control: the target alone;
2. speculation: the same pipeline with the draft model, 4 draft tokens a step.

Both use the same pipeline settings: prefix caching off, every prompt prefilled in one step,
f32 inference and KV cache (the engine's CPU defaults are bf16 arithmetic and a u8 KV cache,
and a split prefill or prefix caching bring their own faults). It then scores every emitted
token with the target IR run on its own through the ``openvino`` runtime (teacher forcing:
prompt plus generated ids in one call) and counts the tokens outside the target's top 20 for
their prefix (by more than 1e-3 in logit, so that float noise at the boundary cannot count).

Verdict: BROKEN (exit 1) when speculation emits such tokens and the control none; OK (exit 0)
when neither does; INCONCLUSIVE (exit 2) when the control emits some (the scoring does not
match the engine) or the draft was never accepted. Bad arguments, or openvino / openvino_genai /
numpy that do not import: one line on stderr, exit 3; an engine that raises (e.g. a release
without an API this script uses): one line, exit 4. It also prints the engine's own draft
counters (``extended_perf_metrics``) and the acceptance rate. With the defaults (4 requests of 32
tokens, EOS ignored so that every request gives 32) it takes 15-25 s on 2 shared cores, most of it
compiling the models.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROMPT = "Once upon a time, in a small village by the sea, there lived"
TOP_K = 20
NUM_ASSISTANT_TOKENS = 4
TOLERANCE = 1e-3  # logits: a token this close to the 20th is not counted as outside
PLUGIN = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def generate(genai, ov, target: Path, draft: Path | None, prompt_ids: list[int], seeds: list[int],
             max_new_tokens: int, threads: int) -> dict:
    """One continuous batch of sampled requests (one per seed); the draft model when given."""
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = 2
    scheduler.max_num_batched_tokens = 16384  # every prompt prefilled in one step
    scheduler.dynamic_split_fuse = True
    scheduler.enable_prefix_caching = False
    properties = {**PLUGIN, "INFERENCE_NUM_THREADS": threads}
    if draft is not None:
        properties["draft_model"] = genai.draft_model(str(draft), "CPU", **PLUGIN, INFERENCE_NUM_THREADS=threads)
    pipeline = genai.ContinuousBatchingPipeline(str(target), scheduler, "CPU", properties)
    configs = []
    for seed in seeds:
        config = genai.GenerationConfig()
        config.max_new_tokens = max_new_tokens
        config.ignore_eos = True  # a fixed number of tokens per request
        config.do_sample = True
        config.temperature = 1.0
        config.top_k = TOP_K
        config.rng_seed = seed
        if draft is not None:
            config.num_assistant_tokens = NUM_ASSISTANT_TOKENS
        configs.append(config)
    start = time.monotonic()
    results = list(pipeline.generate([ov.Tensor([prompt_ids]) for _ in seeds], configs))
    seconds = time.monotonic() - start
    results.sort(key=lambda result: result.m_request_id)
    outputs = [[int(token) for token in result.m_generation_ids[0]] for result in results]
    drafted = accepted = None
    metrics = getattr(results[0], "extended_perf_metrics", None) if draft is not None else None  # summed over the call's requests
    # Releases before 2026.4 lack get_num_draft_tokens, and before 2025.3 extended_perf_metrics:
    # their counters are reported as unknown (None), and the verdict rests on the tokens alone.
    if metrics is not None and hasattr(metrics, "get_num_draft_tokens"):
        drafted = int(metrics.get_num_draft_tokens())
        accepted = int(metrics.get_num_accepted_tokens()) if drafted else 0
    return {"outputs": outputs, "drafted": drafted, "accepted": accepted, "seconds": round(seconds, 1)}


def count_outside_top_k(ov, np, target: Path, prompt_ids: list[int], outputs: list[list[int]], threads: int) -> dict:
    """Teacher forcing with the target IR alone: for every emitted token, is it outside the
    target's top-k for its own prefix?"""
    model = ov.Core().compile_model(str(target / "openvino_model.xml"), "CPU",
                                    {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads})
    request = model.create_infer_request()
    tokens = outside = 0
    examples, per_request = [], []
    for index, generated in enumerate(outputs):
        ids = np.array([prompt_ids + generated], dtype=np.int64)
        request.reset_state()  # the exported model is stateful (its KV cache)
        request.infer({"input_ids": ids, "attention_mask": np.ones_like(ids),
                       "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None, :],
                       "beam_idx": np.zeros(1, dtype=np.int32)})
        logits = request.get_tensor("logits").data[0]
        per_request.append(0)
        for step, token in enumerate(generated):
            row = logits[len(prompt_ids) - 1 + step]
            kth = np.partition(row, -TOP_K)[-TOP_K]
            tokens += 1
            if row[token] < kth - TOLERANCE:
                outside += 1
                per_request[-1] += 1
                if len(examples) < 3:
                    rank = int((row > row[token]).sum()) + 1
                    examples.append({"request": index, "position": step, "token": token, "rank": rank})
    return {"tokens": tokens, "outside_top_k": outside, "outside_per_request": per_request, "examples": examples}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 3, not argparse's usage and exit 2
        print(f"repro.py: {message}", file=sys.stderr)
        sys.exit(3)


def main() -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="target model's OpenVINO IR folder (with its tokenizer IR)")
    parser.add_argument("draft", type=Path, help="draft model's OpenVINO IR folder")
    parser.add_argument("--requests", type=int, default=4, help="seeded requests (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="first seed; the requests use seed, seed+1, ...")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="CPU inference threads")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()
    for folder in (args.target, args.draft):
        if not (folder / "openvino_model.xml").is_file():
            print(f"{folder}: no openvino_model.xml; give an OpenVINO IR folder", file=sys.stderr)
            return 3
    if args.requests < 1 or args.max_new_tokens < 1 or args.threads < 1:
        print("--requests, --max-new-tokens and --threads must be at least 1", file=sys.stderr)
        return 3

    try:
        import numpy as np
        import openvino as ov
        import openvino_genai as genai
    except ImportError as error:
        print(f"cannot import the engine: {error} (run this with the engine's python)", file=sys.stderr)
        return 3

    start = time.monotonic()
    prompt_ids = [int(i) for i in genai.Tokenizer(str(args.target)).encode(PROMPT).input_ids.data[0]]
    seeds = list(range(args.seed, args.seed + args.requests))
    print(f"openvino {ov.__version__}, openvino_genai {genai.__version__}")
    print(f"{args.requests} requests x {args.max_new_tokens} tokens, do_sample, temperature 1, top_k {TOP_K}, "
          f"prompt {len(prompt_ids)} ids")
    figures = {"openvino": ov.__version__, "openvino_genai": genai.__version__, "prompt": PROMPT, "seeds": seeds,
               "max_new_tokens": args.max_new_tokens, "top_k": TOP_K, "num_assistant_tokens": NUM_ASSISTANT_TOKENS}
    for name, draft in (("control", None), ("speculative", args.draft)):
        run = generate(genai, ov, args.target, draft, prompt_ids, seeds, args.max_new_tokens, args.threads)
        run.update(count_outside_top_k(ov, np, args.target, prompt_ids, run["outputs"], args.threads))
        line = f"{name}: {run['outside_top_k']} of {run['tokens']} emitted tokens outside the target's top {TOP_K}"
        if draft is not None and run["drafted"] is None:
            line += "; engine counters: not reported by this version"
        elif draft is not None:
            rate = run["accepted"] / run["drafted"] if run["drafted"] else 0.0
            run["acceptance_rate"] = round(rate, 3)
            line += f"; engine counters: {run['accepted']} of {run['drafted']} drafted tokens accepted ({rate:.0%})"
        print(line + f" [generate {run['seconds']} s]")
        for example in run["examples"]:
            print(f"  e.g. request {example['request']}, token {example['position']}: id {example['token']} "
                  f"is the target's number {example['rank']}")
        figures[name] = run
    control, speculative = figures["control"], figures["speculative"]
    if control["outside_top_k"] > 0:
        verdict, code = "INCONCLUSIVE: the control emits tokens outside the top 20, so the scoring does not match the engine", 2
    elif speculative["outside_top_k"] > 0:
        verdict, code = (f"BROKEN: speculative sampling emitted {speculative['outside_top_k']} tokens an exact top-k "
                         f"{TOP_K} sampler never emits; the control emitted none"), 1
    elif speculative["accepted"] is not None and not speculative["accepted"]:
        verdict, code = "INCONCLUSIVE: no drafted token was accepted, so speculation was not tested", 2
    else:
        verdict, code = f"OK: no token outside the top {TOP_K}, with or without the draft", 0
    figures["verdict"] = verdict.split(":")[0]
    figures["seconds"] = round(time.monotonic() - start, 1)
    print(f"total {figures['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    print(verdict)
    return code


def run() -> int:
    """``main``, with an engine that raises (an API another release lacks, a model it refuses) reported
    in one line and exit 4, never as 1, which means BROKEN."""
    try:
        return main()
    except Exception as error:  # noqa: BLE001 - any failure of the engine under test
        print(f"error: the engine failed: {type(error).__name__}: {' '.join(str(error).split())[:300]}", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(run())
