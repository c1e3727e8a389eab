"""Speed benchmark on the embedded model: every number is a ratio measured side by side in one run.

* plain decoding (our loop, no draft) vs transformers ``generate`` (greedy and sampling);
* lossless speculative decoding vs ``generate`` with the same drafter (``assistant_model``,
  ``assistant_early_exit``, ``prompt_lookup_num_tokens``);
* recording on vs off;
* speculative vs plain decoding with each drafter;
* trees against the chain: tokens per target forward, wall tokens/s, one tree forward against a
  chain forward of as many tokens;
* peak memory of recording 2,000 positions (49,152-token vocabulary).

Every timed call generates exactly ``max_new_tokens`` tokens (EOS ignored on both sides) and
the median of ``repeat`` alternating repetitions is reported.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

import torch

STORY = "Write a short story about a lighthouse keeper who finds a message in a bottle."
REPETITIVE = (
    "Repeat this list exactly five times, one item per line: alpha beta gamma delta epsilon zeta eta theta "
    "iota kappa lambda mu."
)


def _median_rate(function: Callable[[], int], repeat: int) -> float:
    rates = []
    for _ in range(repeat):
        start = time.perf_counter()
        tokens = function()
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def _side_by_side(ours: Callable[[], int], theirs: Callable[[], int], repeat: int) -> tuple[float, float]:
    """Alternate the two so that drifts in machine load hit both alike; return (ours, theirs) tokens/s."""
    ours(), theirs()  # warm-up
    ours_rates, their_rates = [], []
    for _ in range(repeat):
        ours_rates.append(_median_rate(ours, 1))
        their_rates.append(_median_rate(theirs, 1))
    return statistics.median(ours_rates), statistics.median(their_rates)


def run_bench(args: argparse.Namespace) -> int:
    from diagnostics.engine import generate
    from diagnostics.models import early_exit_model, load_model
    from diagnostics.policy import Policy
    from diagnostics.runner import encode_prompt

    target = load_model("default")
    model = target.model
    n = args.max_new_tokens
    repeat = args.repeat
    gamma = 4
    layer = 26
    results: dict[str, object] = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, {platform.processor() or 'cpu'}",
        "torch": torch.__version__, "max_new_tokens": n, "repeat": repeat, "gamma": gamma,
    }

    def report(name: str, ours: float, theirs: float, peer: str) -> None:
        results[name] = {"ours_tok_s": round(ours, 2), f"{peer}_tok_s": round(theirs, 2), "ratio": round(ours / theirs, 3)}
        print(f"{name:58s} ours {ours:7.2f} tok/s  {peer} {theirs:7.2f} tok/s  ratio {ours / theirs:5.2f}x", file=sys.stderr)

    story = encode_prompt(target, STORY)
    repetitive = encode_prompt(target, REPETITIVE)
    story_ids = torch.tensor([story])

    passes: dict[str, list[float]] = {}  # tokens per target forward of each labelled generator

    def ours(prompt: list[int], draft: object, *, temperature: float = 1.0, record: bool = False,
             draft_policy: Policy | None = None, label: str | None = None, **shape: object) -> Callable[[], int]:
        seeds = iter(range(10**6))  # a new seed per call, as transformers draws new randomness per call

        def call() -> int:
            run = generate(target, draft, prompt, gamma=gamma, max_new_tokens=n, seed=next(seeds), temperature=temperature,
                           eos_token_id=[], record=record, draft_policy=draft_policy, **shape)
            if label is not None:
                passes.setdefault(label, []).append(len(run.tokens) / run.blocks)
            return len(run.tokens)

        return call

    def hf(ids: torch.Tensor, **kwargs: object) -> Callable[[], int]:
        settings = {"max_new_tokens": n, "min_new_tokens": n, "pad_token_id": target.tokenizer.eos_token_id}
        settings.update(kwargs)
        if settings.get("do_sample"):
            settings.update(temperature=1.0, top_k=0, top_p=1.0)
        else:
            settings.update(temperature=None, top_k=None, top_p=None)

        def call() -> int:
            with torch.inference_mode():
                output = model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
            return output.shape[1] - ids.shape[1]

        return call

    shell = early_exit_model(target, layer)
    if args.only is None:
        # 1. Plain decoding against transformers generate.
        report("plain greedy vs generate(do_sample=False)", *_side_by_side(ours(story, None, temperature=0), hf(story_ids, do_sample=False), repeat), "hf")
        report("plain sampling vs generate(do_sample=True)", *_side_by_side(ours(story, None), hf(story_ids, do_sample=True), repeat), "hf")

        # 2. Lossless speculative decoding against assisted generation with the same drafter.
        # Greedy (T = 0): both sides do exactly the same work (same drafts, same acceptances), so the
        # ratio is pure implementation overhead. Sampling (T = 1): transformers drafts with the
        # assistant's own generation config (greedy for this model) and verifies against the draft's
        # softmax, which accepts more than a sampled draft does; the ratio then mixes speed and
        # acceptance, and the greedy-draft row of ours is the closer peer.
        repetitive_ids = torch.tensor([repetitive])
        greedy_drafts = Policy(temperature=0)
        for mode, temperature, extra in (("greedy", 0.0, {"do_sample": False}), ("sampling", 1.0, {"do_sample": True})):
            assisted = {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant", **extra}
            report(f"{mode}: lossless early-exit:{layer} vs assistant_early_exit={layer}",
                   *_side_by_side(ours(story, shell, temperature=temperature), hf(story_ids, assistant_early_exit=layer, **assisted), repeat), "hf")
            report(f"{mode}: lossless model drafter vs assistant_model (exit@{layer} as a model)",
                   *_side_by_side(ours(story, shell, temperature=temperature), hf(story_ids, assistant_model=shell.model, **assisted), repeat), "hf")
            if temperature:
                report(f"{mode}: lossless, greedy drafts (q = point mass) vs assistant_model",
                       *_side_by_side(ours(story, shell, temperature=temperature, draft_policy=greedy_drafts),
                                      hf(story_ids, assistant_model=shell.model, **assisted), repeat), "hf")
            report(f"{mode}: lossless ngram:3 vs prompt_lookup_num_tokens={gamma} (repetitive prompt)",
                   *_side_by_side(ours(repetitive, "ngram:3", temperature=temperature),
                                  hf(repetitive_ids, prompt_lookup_num_tokens=gamma, max_matching_ngram_size=3, **extra), repeat), "hf")

        # 3. Recording on vs off (same run otherwise).
        on, off = _side_by_side(ours(story, shell, record=True), ours(story, shell, record=False), repeat)
        results["recording_overhead"] = {"on_tok_s": round(on, 2), "off_tok_s": round(off, 2), "overhead": round(off / on - 1, 3)}
        print(f"{'recording on vs off (early-exit, lossless)':58s} on {on:7.2f} tok/s  off {off:7.2f} tok/s  overhead {100 * (off / on - 1):5.1f}%", file=sys.stderr)

        # 4. Speculative vs plain decoding with each drafter.
        drafters = {f"early-exit:{layer}": shell, "early-exit:28": early_exit_model(target, 28), "ngram:3": "ngram:3"}
        if not args.quick:
            drafters["early-exit:16"] = early_exit_model(target, 16)
        for name, drafter in drafters.items():
            prompt = repetitive if name.startswith("ngram") else story
            label = f"lossless {name} vs plain decoding" + (" (repetitive prompt)" if name.startswith("ngram") else "")
            report(label, *_side_by_side(ours(prompt, drafter), ours(prompt, None), repeat), "plain")
        report("lossless ngram:3 vs plain decoding (story prompt)", *_side_by_side(ours(story, "ngram:3"), ours(story, None), repeat), "plain")
        report("greedy (T=0) ngram:3 vs plain greedy (repetitive prompt)",
               *_side_by_side(ours(repetitive, "ngram:3", temperature=0), ours(repetitive, None, temperature=0), repeat), "plain")

    # 5. Trees against the chain, both lossless with early-exit drafts: tokens per target forward
    # and wall tokens/s, and one tree forward against a chain forward of as many tokens.
    tree_shapes = {"tree budget 4, depth 4 (4 nodes)": {"tree_budget": 4, "tree_depth": 4},
                   "tree 3,2,1 (15 nodes, top-k children)": {"tree": (3, 2, 1)},
                   "tree 2,2,1 sampled (8 nodes)": {"tree": (2, 2, 1), "tree_children": "sample"}}
    if args.quick:
        tree_shapes = dict(list(tree_shapes.items())[:2])
    chain_label = f"chain γ={gamma}"
    results["trees"] = {}
    for name, shape in tree_shapes.items():
        tree_rate, chain_rate = _side_by_side(ours(story, shell, label=name, **shape), ours(story, shell, label=chain_label), repeat)
        report(f"lossless early-exit:{layer} {name} vs chain γ={gamma}", tree_rate, chain_rate, "chain")
        results["trees"][name] = {"tokens_per_target_forward": round(statistics.median(passes[name]), 3),
                                  "chain_tokens_per_target_forward": round(statistics.median(passes[chain_label]), 3)}
        print(f"{'  tokens per target forward':58s} tree {statistics.median(passes[name]):5.2f}  "
              f"chain {statistics.median(passes[chain_label]):5.2f}", file=sys.stderr)
    for nodes in (4, 15):
        tree_s, chain_s = _forward_cost(target, story, nodes, repeat=max(5, 3 * repeat))
        results["trees"][f"forward_{nodes}_tokens"] = {"tree_ms": round(1000 * tree_s, 2), "chain_ms": round(1000 * chain_s, 2),
                                                        "ratio": round(tree_s / chain_s, 3)}
        print(f"{f'one target forward over {nodes} draft tokens: tree vs chain':58s} tree {1000 * tree_s:7.1f} ms  "
              f"chain {1000 * chain_s:7.1f} ms  ratio {tree_s / chain_s:5.2f}x", file=sys.stderr)

    # 6. Peak memory of recording 2,000 positions on a 49,152-token vocabulary.
    if args.only is None:
        results["recording_memory"] = _recording_memory(2000 if not args.quick else 200)
        print(f"{'peak traced memory recording positions':58s} {results['recording_memory']}", file=sys.stderr)
    print(json.dumps(results))
    return 0


def _forward_cost(target: object, prompt: list[int], nodes: int, repeat: int) -> tuple[float, float]:
    """Median seconds of one target forward over ``nodes`` draft tokens after a cached prompt: as a
    tree (a root with ``nodes`` children, under the 4D tree mask, then the path kept) and as a
    chain (``nodes`` drafts in a row, then rolled back); alternated."""
    from diagnostics.drafters import TargetScorer
    from diagnostics.tree_attention import TokenTree

    scorer = TargetScorer(target)
    scorer.score(prompt[:-1], [])  # cache all but the last prompt token, as between rounds
    scorer.rollback(len(prompt) - 1)
    drafts = [int(token) for token in prompt[:nodes]]
    tree = TokenTree(parents=tuple(-1 for _ in drafts), tokens=tuple(drafts))
    tree_times, chain_times = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        scorer.score_tree(prompt, tree)
        scorer.keep_path(len(prompt), tree, [])
        scorer.rollback(len(prompt) - 1)
        tree_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        scorer.score(prompt, drafts)
        scorer.rollback(len(prompt) - 1)
        chain_times.append(time.perf_counter() - start)
    return statistics.median(tree_times), statistics.median(chain_times)


def _recording_memory(positions: int) -> dict[str, float]:
    """Peak Python memory (tracemalloc) of recording ``positions`` positions, model weights excluded.

    Uses a one-layer random model with SmolLM2's 49,152-token vocabulary so that every record
    is computed over the same full vocabulary at a fraction of the time.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from diagnostics.engine import generate
    from diagnostics.models import wrap_model

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions + 64)
    loaded = wrap_model(LlamaForCausalLM(config).eval())
    tracemalloc.start()
    start = time.perf_counter()
    run = generate(loaded, "early-exit:1", [1, 2, 3, 4], gamma=4, max_new_tokens=positions, eos_token_id=[])
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"positions": len(run.records), "peak_mib": round(peak / 2**20, 1),
            "per_position_kib": round(peak / 2**10 / max(1, len(run.records)), 2), "seconds": round(elapsed, 1)}
