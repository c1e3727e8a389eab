"""Speed benchmark on the embedded model: every number is a ratio measured side by side in one run.

* plain decoding (our loop, no draft) vs transformers ``generate`` (greedy and sampling);
* lossless speculative decoding vs ``generate`` with the same drafter (``assistant_model``,
  ``assistant_early_exit``, ``prompt_lookup_num_tokens``) at the same γ: transformers reads γ
  and its confidence stop from the *assistant's* ``generation_config`` (``generate`` keyword
  arguments do not reach it), so the bench sets them there;
* adaptive drafting (``draft_stop``) vs ``assistant_confidence_threshold``, and each side at its
  own defaults; self-speculation with and without reusing the draft's layers;
* recording on vs off (the median of paired, back-to-back ratios);
* speculative vs plain decoding with each drafter;
* trees against the chain: tokens per target forward, wall tokens/s, one tree forward against a
  chain forward of as many tokens;
* peak memory of recording 2,000 positions (49,152-token vocabulary);
* batching: the same sweep of the embedded model (its units' coupled runs, recorded in a
  database) one run at a time against one continuous batch, the batch-size curve, and the
  engine-level audit (``audit --engine ours``) with its seeds batched against one at a time.

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
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from diagnostics.policy import Policy

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


def _paired_overhead(on: Callable[[], int], off: Callable[[], int], repeat: int) -> tuple[float, float, float]:
    """Recording on against off, robust to machine load: each repetition times the two back to back
    (in alternating order), and the overhead is the median of the per-pair ratios ``t_on / t_off − 1``;
    a load spike hits one pair, not the estimate. Returns (on tok/s, off tok/s, overhead)."""
    on(), off()  # warm-up
    ratios, on_rates, off_rates = [], [], []
    for index in range(repeat):
        first, second = (on, off) if index % 2 == 0 else (off, on)
        rates = {}
        for function in (first, second):
            start = time.perf_counter()
            tokens = function()
            rates[function] = tokens / (time.perf_counter() - start)
        on_rates.append(rates[on])
        off_rates.append(rates[off])
        ratios.append(rates[off] / rates[on] - 1)
    return statistics.median(on_rates), statistics.median(off_rates), statistics.median(ratios)


def _machine() -> str:
    import os

    from diagnostics.round_bench import cpu_model

    return f"{platform.machine()}, {os.cpu_count()} cores ({cpu_model()}), {torch.get_num_threads()} torch threads"


def run_bench(args: argparse.Namespace) -> int:
    """Every comparison of the module docstring (``--only``: the trees, the batching or the round table
    alone), printed as it is measured and emitted as one JSON object (``_emit``)."""
    if args.only == "round":
        return _emit(_round(args), args.json)
    bench = _Bench(args)
    if args.only is None:
        _against_transformers(bench)
        _ours_against_ours(bench, args.quick)
    if args.only == "batch":
        bench.results["batching"] = _batching(bench.n, args.quick)
        return _emit(bench.results, args.json)
    _trees(bench, args.quick)
    # 8. Peak memory of recording 2,000 positions on a 49,152-token vocabulary.
    if args.only is None:
        bench.results["batching"] = _batching(bench.n, args.quick)
        bench.results["recording_memory"] = _recording_memory(2000 if not args.quick else 200)
        print(f"{'peak traced memory recording positions':58s} {bench.results['recording_memory']}", file=sys.stderr)
    return _emit(bench.results, args.json)


def _round(args: argparse.Namespace) -> dict[str, object]:
    """``bench --only round`` (``diagnostics.round_bench``): the table printed as Markdown on stderr as it
    is measured, and returned with the machine's facts."""
    from diagnostics.models import load_model
    from diagnostics.round_bench import machine_facts, markdown, round_table, setups
    from diagnostics.runner import encode_prompt

    try:
        rows = [int(part) for part in str(args.rows).split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--rows takes batch sizes separated by commas, e.g. 1,8,32,64, not {args.rows!r}") from None
    if not rows or min(rows) < 1:
        raise ValueError(f"--rows takes batch sizes of at least 1, e.g. 1,8,32,64, not {args.rows!r}")
    target = load_model("default", dtype=args.dtype, device=args.device)
    chosen = setups(_Bench.layer)
    if args.quick:
        chosen = [chosen[0], chosen[2], chosen[4]]  # plain, a lossy chain, a tree
    machine = machine_facts()
    table = round_table(target, encode_prompt(target, STORY), chosen, rows, args.max_new_tokens, args.repeat,
                        progress=lambda entry: print(entry, file=sys.stderr, flush=True))
    print(markdown(table, machine), file=sys.stderr)
    return {"machine": machine, "device": str(target.device), "max_new_tokens": args.max_new_tokens, "repeat": args.repeat,
            "torch": torch.__version__, "round": table}


class _Bench:
    """What every comparison shares: the embedded target, the two prompts, the early-exit drafter,
    the figures so far (``results``) and each labelled generator's tokens per target forward
    (``passes``); ``ours`` and ``hf`` make the timed calls, ``report`` records a ratio."""

    gamma = 4
    layer = 26

    def __init__(self, args: argparse.Namespace) -> None:
        import transformers

        from diagnostics.hf_assisted import fixed_gamma
        from diagnostics.models import early_exit_model, load_model
        from diagnostics.runner import encode_prompt

        self.target = target = load_model("default", dtype=args.dtype, device=args.device)
        self.model = model = target.model
        self.device = device = target.device
        self.n = n = args.max_new_tokens
        self.repeat = repeat = args.repeat
        if repeat < 1 or n < 1:
            raise ValueError("--repeat and --max-new-tokens must be at least 1")
        self.results: dict[str, object] = {
            "machine": _machine(), "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "max_new_tokens": n, "repeat": repeat, "gamma": self.gamma, "early_exit_layer": self.layer,
        }
        self.story = encode_prompt(target, STORY)
        self.repetitive = encode_prompt(target, REPETITIVE)
        self.story_ids = torch.tensor([self.story], device=device)
        self.passes: dict[str, list[float]] = {}  # tokens per target forward of each labelled generator
        self.fixed = fixed_gamma(self.gamma)  # transformers at our γ, without its confidence stop
        self.shell = early_exit_model(target, self.layer)

    def report(self, name: str, ours: float, theirs: float, peer: str) -> None:
        """One ratio, ours against ``peer``'s tokens/s: kept in ``results`` and printed."""
        self.results[name] = {"ours_tok_s": round(ours, 2), f"{peer}_tok_s": round(theirs, 2), "ratio": round(ours / theirs, 3)}
        print(f"{name:58s} ours {ours:7.2f} tok/s  {peer} {theirs:7.2f} tok/s  ratio {ours / theirs:5.2f}x", file=sys.stderr)

    def ours(self, prompt: list[int], draft: object, *, temperature: float = 1.0, record: bool = True,
             draft_policy: Policy | None = None, label: str | None = None, block: int = gamma,
             **shape: object) -> Callable[[], int]:
        """Our generator, recording every position unless ``record=False`` (the peer comparisons are
        with recording on: that is the product)."""
        from diagnostics.engine import generate

        seeds = iter(range(10**6))  # a new seed per call, as transformers draws new randomness per call

        def call() -> int:
            run = generate(self.target, draft, prompt, gamma=block, max_new_tokens=self.n, seed=next(seeds),
                           temperature=temperature, eos_token_id=[], record=record, draft_policy=draft_policy, **shape)
            if label is not None:
                self.passes.setdefault(label, []).append(len(run.tokens) / run.blocks)
            return len(run.tokens)

        return call

    def hf(self, ids: torch.Tensor, assistant: dict | None = None, **kwargs: object) -> Callable[[], int]:
        """transformers ``generate``; ``assistant`` sets the assistant's ``generation_config`` fields
        (``num_assistant_tokens``, its schedule, ``assistant_confidence_threshold``) for the call, the
        only place transformers reads them (the early-exit assistant and the shell share the target's)."""
        from diagnostics.hf_assisted import assistant_settings

        settings = {"max_new_tokens": self.n, "min_new_tokens": self.n, "pad_token_id": self.target.tokenizer.eos_token_id}
        settings.update(kwargs)
        if settings.get("do_sample"):
            settings.update(temperature=1.0, top_k=0, top_p=1.0)
        else:
            settings.update(temperature=None, top_k=None, top_p=None)

        def call() -> int:
            with assistant_settings(self.model, assistant), torch.inference_mode():
                output = self.model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
            return output.shape[1] - ids.shape[1]

        return call


def _against_transformers(bench: _Bench) -> None:
    """Sections 1 to 3: plain, lossless speculative and adaptive decoding against transformers
    ``generate`` with the same drafter."""
    from diagnostics.policy import Policy

    ours, hf, report, repeat = bench.ours, bench.hf, bench.report, bench.repeat
    story, story_ids, repetitive, shell, fixed = bench.story, bench.story_ids, bench.repetitive, bench.shell, bench.fixed
    gamma, layer = bench.gamma, bench.layer
    # 1. Plain decoding against transformers generate.
    report("plain greedy vs generate(do_sample=False)", *_side_by_side(ours(story, None, temperature=0), hf(story_ids, do_sample=False), repeat), "hf")
    report("plain sampling vs generate(do_sample=True)", *_side_by_side(ours(story, None), hf(story_ids, do_sample=True), repeat), "hf")

    # 2. Lossless speculative decoding against assisted generation with the same drafter.
    # Greedy (T = 0): both sides do exactly the same work (same drafts, same acceptances), so the
    # ratio is pure implementation overhead. Sampling (T = 1): transformers drafts with the
    # assistant's own generation config (greedy for this model) and verifies against the draft's
    # softmax, which accepts more than a sampled draft does; the ratio then mixes speed and
    # acceptance, and the greedy-draft row of ours is the closer peer.
    repetitive_ids = torch.tensor([repetitive], device=bench.device)
    greedy_drafts = Policy(temperature=0)
    for mode, temperature, extra in (("greedy", 0.0, {"do_sample": False}), ("sampling", 1.0, {"do_sample": True})):
        report(f"{mode}: lossless early-exit:{layer} (layers reused) vs assistant_early_exit={layer}",
               *_side_by_side(ours(story, shell, temperature=temperature),
                              hf(story_ids, fixed, assistant_early_exit=layer, **extra), repeat), "hf")
        # A separate draft model cannot share the target's cache: our two-forward path, like theirs.
        report(f"{mode}: lossless model drafter vs assistant_model (exit@{layer} as a model)",
               *_side_by_side(ours(story, shell, temperature=temperature, reuse_layers=False),
                              hf(story_ids, fixed, assistant_model=shell.model, **extra), repeat), "hf")
        if temperature:
            report(f"{mode}: lossless, greedy drafts (q = point mass) vs assistant_model",
                   *_side_by_side(ours(story, shell, temperature=temperature, draft_policy=greedy_drafts, reuse_layers=False),
                                  hf(story_ids, fixed, assistant_model=shell.model, **extra), repeat), "hf")
        report(f"{mode}: lossless ngram:3 vs prompt_lookup_num_tokens={gamma} (repetitive prompt)",
               *_side_by_side(ours(repetitive, "ngram:3", temperature=temperature),
                              hf(repetitive_ids, prompt_lookup_num_tokens=gamma, max_matching_ngram_size=3, **extra), repeat), "hf")

    # 3. Adaptive drafting. Same rule on both sides: up to 20 drafts, stop after a draft x with
    # q(x) < 0.4. Then each side at its own defaults: ours γ = 4 without a stop; theirs 20
    # drafts with its 0.4 confidence stop.
    adaptive = {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4}
    report(f"sampling: early-exit:{layer} γ≤20, draft-stop 0.4 vs assistant_confidence_threshold=0.4",
           *_side_by_side(ours(story, shell, block=20, draft_stop=0.4),
                          hf(story_ids, adaptive, assistant_early_exit=layer, do_sample=True), repeat), "hf")
    report(f"sampling: early-exit:{layer} at our defaults vs assistant_early_exit={layer} at theirs",
           *_side_by_side(ours(story, shell), hf(story_ids, assistant_early_exit=layer, do_sample=True), repeat), "hf")


def _ours_against_ours(bench: _Bench, quick: bool) -> None:
    """Sections 4 to 6: what reusing the draft's layers buys, what recording costs, and speculative
    against plain decoding with each drafter."""
    from diagnostics.models import early_exit_model

    ours, report, repeat, story, repetitive, shell = bench.ours, bench.report, bench.repeat, bench.story, bench.repetitive, bench.shell
    layer = bench.layer
    # 4. What reusing the draft's layers buys (ours against ours).
    report(f"sampling: early-exit:{layer} layers reused vs two forwards",
           *_side_by_side(ours(story, shell), ours(story, shell, reuse_layers=False), repeat), "two_forwards")

    # 5. Recording on vs off (same run otherwise): median of paired ratios, more repetitions.
    on, off, overhead = _paired_overhead(ours(story, shell, record=True), ours(story, shell, record=False), max(6, 2 * repeat))
    bench.results["recording_overhead"] = {"on_tok_s": round(on, 2), "off_tok_s": round(off, 2), "overhead": round(overhead, 3)}
    print(f"{'recording on vs off (early-exit, lossless)':58s} on {on:7.2f} tok/s  off {off:7.2f} tok/s  overhead {100 * overhead:5.1f}%", file=sys.stderr)

    # 6. Speculative vs plain decoding with each drafter.
    drafters = {f"early-exit:{layer}": shell, "early-exit:28": early_exit_model(bench.target, 28), "ngram:3": "ngram:3"}
    if not quick:
        drafters["early-exit:16"] = early_exit_model(bench.target, 16)
    for name, drafter in drafters.items():
        prompt = repetitive if name.startswith("ngram") else story
        label = f"lossless {name} vs plain decoding" + (" (repetitive prompt)" if name.startswith("ngram") else "")
        report(label, *_side_by_side(ours(prompt, drafter), ours(prompt, None), repeat), "plain")
    report("lossless ngram:3 vs plain decoding (story prompt)", *_side_by_side(ours(story, "ngram:3"), ours(story, None), repeat), "plain")
    report("greedy (T=0) ngram:3 vs plain greedy (repetitive prompt)",
           *_side_by_side(ours(repetitive, "ngram:3", temperature=0), ours(repetitive, None, temperature=0), repeat), "plain")


def _trees(bench: _Bench, quick: bool) -> None:
    """Section 7: trees against the chain, both lossless with early-exit drafts: tokens per target
    forward and wall tokens/s, and one tree forward against a chain forward of as many tokens."""
    gamma, layer, repeat, story, shell, passes = bench.gamma, bench.layer, bench.repeat, bench.story, bench.shell, bench.passes
    tree_shapes = {"tree budget 4, depth 4 (4 nodes)": {"tree_budget": 4, "tree_depth": 4},
                   "tree 3,2,1 (15 nodes, top-k children)": {"tree": (3, 2, 1)},
                   "tree 2,2,1 sampled (8 nodes)": {"tree": (2, 2, 1), "tree_children": "sample"}}
    if quick:
        tree_shapes = dict(list(tree_shapes.items())[:2])
    chain_label = f"chain γ={gamma}"
    trees: dict[str, object] = {}
    bench.results["trees"] = trees
    for name, shape in tree_shapes.items():
        tree_rate, chain_rate = _side_by_side(bench.ours(story, shell, label=name, **shape), bench.ours(story, shell, label=chain_label), repeat)
        bench.report(f"lossless early-exit:{layer} {name} vs chain γ={gamma}", tree_rate, chain_rate, "chain")
        trees[name] = {"tokens_per_target_forward": round(statistics.median(passes[name]), 3),
                       "chain_tokens_per_target_forward": round(statistics.median(passes[chain_label]), 3)}
        print(f"{'  tokens per target forward':58s} tree {statistics.median(passes[name]):5.2f}  "
              f"chain {statistics.median(passes[chain_label]):5.2f}", file=sys.stderr)
    for nodes in (4, 15):
        tree_s, chain_s = _forward_cost(bench.target, story, nodes, repeat=max(5, 3 * repeat))
        trees[f"forward_{nodes}_tokens"] = {"tree_ms": round(1000 * tree_s, 2), "chain_ms": round(1000 * chain_s, 2),
                                            "ratio": round(tree_s / chain_s, 3)}
        print(f"{f'one target forward over {nodes} draft tokens: tree vs chain':58s} tree {1000 * tree_s:7.1f} ms  "
              f"chain {1000 * chain_s:7.1f} ms  ratio {tree_s / chain_s:5.2f}x", file=sys.stderr)


def _emit(results: dict[str, object], path: str | None) -> int:
    """The figures as one JSON object on stdout, and in ``path`` when given (``--json``)."""
    text = json.dumps(results)
    if path:
        from pathlib import Path

        try:
            Path(path).write_text(text + "\n", encoding="utf-8")
        except OSError as error:
            raise ValueError(f"cannot write {path}: {error.strerror or error}") from None
    print(text)
    return 0


def _forward_cost(target: object, prompt: list[int], nodes: int, repeat: int) -> tuple[float, float]:
    """Median seconds of one target forward over ``nodes`` draft tokens after a cached prompt: as a
    tree (a root with ``nodes`` children, under the 4D tree mask, then the path kept) and as a
    chain (``nodes`` drafts in a row, then rolled back); alternated."""
    from diagnostics.engine.drafting import TargetScorer
    from diagnostics.engine.forward import full_stage, resolve
    from diagnostics.engine.tree_attention import TokenTree

    stage = full_stage(target, 1, len(prompt) + nodes + 2, order=1)
    scorer = TargetScorer(stage, stage.store.attach())
    resolve(scorer.score(prompt[:-1], []))  # cache all but the last prompt token, as between rounds
    scorer.rollback(len(prompt) - 1)
    drafts = [int(token) for token in prompt[:nodes]]
    tree = TokenTree(parents=tuple(-1 for _ in drafts), tokens=tuple(drafts))
    tree_times, chain_times = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        resolve(scorer.score_tree(prompt, tree))
        scorer.keep_path(len(prompt), tree, [])
        scorer.rollback(len(prompt) - 1)
        tree_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        resolve(scorer.score(prompt, drafts))
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


BATCH_SIZES = (1, 8, 16, 32, 64)


def _batching(max_new_tokens: int, quick: bool) -> dict[str, object]:
    """Positions recorded per second by one in-process sweep of the embedded model (8 shipped general
    prompts × 2 seeds × lenience and cascade with its baseline: 64 runs, early-exit:26 drafts), at each batch
    size, the first being one run at a time; the same units every time, each into a fresh database.
    Then the tiny engine audit's wall time, batched against one seed at a time."""
    import tempfile
    from pathlib import Path

    from diagnostics.audit.engine_level import audit_generator
    from diagnostics.audit.suite import plan_engine_audit, tiny_setup
    from diagnostics.evaluation.prompts import load_prompts
    from diagnostics.evaluation.sweeper import run_sweep, settings_of
    from diagnostics.models import early_exit_model, load_model
    from diagnostics.request import RunRequest
    from diagnostics.store import Store

    target = load_model("default")
    draft = early_exit_model(target, 26)
    prompts = load_prompts("general")[: 2 if quick else 8]
    tokens = min(max_new_tokens, 16 if quick else 32)
    base = RunRequest(prompt=prompts[0].prompt, draft="early-exit:26", max_new_tokens=tokens)
    settings = {**settings_of(prompts, ["lenience:0.5", "cascade:0.3"], 1 if quick else 2, base, "general"), "target": "default"}
    sizes = (1, 4, 16) if quick else BATCH_SIZES
    curve: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for size in sizes:
            store = Store(Path(folder) / f"batch{size}.duckdb")
            start = time.perf_counter()
            sweep_id = run_sweep(store, target, draft, settings, batch_size=size)
            seconds = time.perf_counter() - start
            positions = int(sum(len(store.positions(run_id)) for run_id in store.sweep_runs(sweep_id)["run_id"]))
            curve[str(size)] = {"seconds": round(seconds, 2), "positions": positions, "positions_per_s": round(positions / seconds, 2)}
            print(f"{f'sweep ({positions} positions), batch size {size}':58s} {seconds:7.1f} s  "
                  f"{positions / seconds:7.2f} positions/s", file=sys.stderr)
    one = curve["1"]["positions_per_s"]
    best = max(curve, key=lambda size: curve[size]["positions_per_s"])
    ratio = curve[best]["positions_per_s"] / one
    print(f"{'sweep: best batch size vs one run at a time':58s} batch {best}: {ratio:5.2f}x", file=sys.stderr)
    setup = tiny_setup()
    plan = plan_engine_audit("ours", setup, generations=200 if quick else 800)
    generators = {"batched": plan.generator,  # has .batch: seeds generated 64 at a time
                  "one_at_a_time": lambda prompt_ids, seed: plan.generator(prompt_ids, seed)}  # one generate() per seed
    audits = {}
    for label, generator in generators.items():
        start = time.perf_counter()
        audit = audit_generator(generator, setup.target, setup.prompt_ids, plan.seeds, policy=plan.policy, eos=setup.eos)
        audits[label] = {"seconds": round(time.perf_counter() - start, 2), "verdict": audit.verdict}
    print(f"{'audit --engine ours (tiny): batched vs one seed at a time':58s} {audits['batched']['seconds']:7.1f} s  "
          f"{audits['one_at_a_time']['seconds']:7.1f} s", file=sys.stderr)
    return {"sweep_batch_curve": curve, "sweep_best_batch_size": int(best), "sweep_speedup_vs_one_at_a_time": round(ratio, 2),
            "engine_audit": audits}

