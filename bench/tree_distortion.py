"""Does a tree amplify the distortion of lossy verification? Chain vs tree on the embedded model.

Run: ``python bench/tree_distortion.py [--drafts early-exit:16,early-exit:24,early-exit:28,model:default]
[--rules typical:0.2,cascade:0.3,lenience:0.5] [--tree 3,2,1] [--gamma 4] [--prompts 3] [--seeds 2]
[--max-new-tokens 24] [--json FILE]``.

For every drafter (from weak to the target itself as its own draft), every lossy rule and both
verification shapes (a chain of ``--gamma`` sampled drafts; a ``--tree`` of the draft's top
tokens, EAGLE style), it generates on ``--prompts`` short chat prompts × ``--seeds`` seeds and
records, at every emitted position, the exact ``TV(P, baseline)``: the total variation between
the law the token was drawn from and the rule's matched baseline (the target under the same
truncation; ``p`` itself for lenience). Each run gives its mean over positions; the table shows
the mean over runs with a 95% interval (normal, over runs). Prints a Markdown table (the README
carries one) and, with ``--json``, the raw per-run means.

The paper's claim: under tree verification the truncation rules' distortion stays away from zero
as the draft improves, while single-draft lenience vanishes (with ``q = p`` it accepts every
draft, so ``P = p``). Tree lenience does not: ``a = min(1, p(c)/l)`` depends on ``p`` alone.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "Name three colours and say what each one reminds you of.",
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a cat sleeping in the sun.",
    "Give me a tip for learning a new language.",
    "What is a good breakfast before a long walk?",
]


def _interval(values: list[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return mean, mean - half, mean + half


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafts", default="early-exit:16,early-exit:24,early-exit:28,model:default")
    parser.add_argument("--rules", default="typical:0.2,cascade:0.3,lenience:0.5")
    parser.add_argument("--tree", default="3,2,1")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from diagnostics.engine import generate
    from diagnostics.drafts import load_draft
    from diagnostics.models import load_model
    from diagnostics.rules import split_specs
    from diagnostics.runner import encode_prompt

    torch.manual_seed(0)
    started = time.perf_counter()
    target = load_model("default")
    prompts = [encode_prompt(target, text) for text in PROMPTS[: args.prompts]]
    shapes = {"chain γ=%d" % args.gamma: {"gamma": args.gamma}, f"tree {args.tree}": {"tree": args.tree}}
    drafts = [spec.strip() for spec in args.drafts.split(",") if spec.strip()]
    rules = split_specs(args.rules)
    results: dict[str, dict[str, list[float]]] = {}
    for draft_spec in drafts:
        draft = load_draft(draft_spec, target)
        for rule in rules:
            for shape, kwargs in shapes.items():
                means = []
                for prompt in prompts:
                    for seed in range(args.seeds):
                        run = generate(target, draft, prompt, rule=rule, max_new_tokens=args.max_new_tokens, seed=seed,
                                       top_k_record=1, **kwargs)
                        values = [record.tv_baseline for record in run.records if record.tv_baseline is not None]
                        means.append(statistics.fmean(values))
                results.setdefault(f"{rule} | {shape}", {})[draft_spec] = means
                mean, low, high = _interval(means)
                print(f"{draft_spec:14s} {rule:14s} {shape:12s} {mean:.4f} [{low:.4f}, {high:.4f}]", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    print(f"\nMean TV(P, matched baseline) per position, mean over {args.prompts} prompts × {args.seeds} seeds "
          f"[95% interval over runs], {args.max_new_tokens} tokens each, temperature 1; "
          f"{platform.machine()}, torch {torch.__version__}, {elapsed / 60:.1f} min\n")
    print("| rule | verification | " + " | ".join(drafts) + " |")
    print("|---|---|" + "---|" * len(drafts))
    for key, cells in results.items():
        rule, shape = key.split(" | ")
        row = []
        for draft_spec in drafts:
            mean, low, high = _interval(cells[draft_spec])
            row.append(f"{mean:.3f} [{low:.3f}, {high:.3f}]")
        print(f"| {rule} | {shape} | " + " | ".join(row) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
