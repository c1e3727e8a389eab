"""One prepared GPU check on the embedded model: everything the lab does on CUDA, in float32 and bfloat16.

Run by ``bench/gpu_check.sh`` (which installs nothing beyond the project's requirements). For each
dtype it runs, timing each part, and prints one JSON summary on stdout (progress on stderr):

- ``engine_audit``: the engine-level audit of our engine (early-exit:26 drafts, γ 3) on CUDA,
  with its verdict, p-value and detectable TV;
- ``tree_run``: one generation (``--tokens``, 128) drafted as a 3,2,1 tree, lossless, with its tokens/s;
- ``batched_sweep``: 32 coupled rows of 64 tokens (lossless, lenience:0.5, cascade:0.3 and a
  second lossless row × 8 seeds) as one continuous batch, positions/s, against the same rows one at a time;
- ``inspect_laws``: ``RunLaws`` (Inspect's exact p and q at every position of a 128-token run) on
  CUDA against the same on CPU in float32 (the largest difference of any law entry);
- ``heads``: an EAGLE-3 head and Medusa heads written by ``make_head`` for the target, 16 rows each
  as one batch (EAGLE-3 a chain of γ 3, Medusa a sparse ``medusa_choices`` tree), positions/s, and
  the recorded ``q`` against the head's law recomputed from scratch (``heads.check``; its 1e-4
  tolerance is for float32, so bfloat16 reports the largest difference);
- ``paths``: every path once on the device, 4 rows × 12 tokens under lossless and lenience:0.5 (plain;
  early-exit chains with one and two caches; a model drafter with a draft stop; n-gram chain and tree;
  trees of top, sampled and sampled-without-replacement children; a budget tree; EAGLE-3 and Medusa
  heads as chains and trees): ``ok`` or the error, tokens/s each;
- ``planted_bug``: the engine audit of a planted bug (KV rollback off by one) on the device: must FAIL;
- ``compare_group`` and ``sweep``: ``python -m diagnostics compare`` (lossless vs lenience:0.5, seeds 0-1)
  and a two-prompt ``sweep`` on the device into a scratch database;
- ``bench``: ``python -m diagnostics bench --device cuda --quick`` (ratios against plain decoding
  and Hugging Face ``generate`` measured in the same run).

Each part's figures are written to ``--out`` (default ``$OUT/gpu_check.json`` when ``$OUT`` is set) as
soon as the part ends, so a time limit still leaves what was measured. Budget: under 8 minutes on
one GPU (``--budget-s`` stops starting new parts after that).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = "Explain in a few sentences why the sky is blue."


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _audit_setup(dtype: str):
    """The embedded model and its early-exit:26 draft in ``dtype``, as the engine audit takes them."""
    from diagnostics.audit.suite import model_setup
    from diagnostics.models import early_exit_model, load_model

    setup = model_setup("default")
    if dtype != "float32":
        setup.target = load_model("default", dtype=dtype)
        setup.draft = early_exit_model(setup.target, 26)
    return setup


def engine_audit(dtype: str, generations: int) -> dict:
    from diagnostics.audit.suite import run_engine_audit

    setup = _audit_setup(dtype)
    started = time.perf_counter()
    result = run_engine_audit("ours", setup, generations=generations, max_new_tokens=16, gamma=3)
    return {"verdict": result.verdict, "p_value": result.p_value, "tokens": result.tokens,
            "detectable_tv": result.detectable_tv, "generations": generations, "seconds": time.perf_counter() - started,
            "device": str(setup.target.device)}


def tree_run(target, tokens: int) -> dict:
    from diagnostics.engine import generate
    from diagnostics.runner import encode_prompt

    prompt = encode_prompt(target, PROMPT)
    generate(target, "early-exit:26", prompt, tree="3,2,1", max_new_tokens=8, seed=0, record=False)  # warm-up
    started = time.perf_counter()
    run = generate(target, "early-exit:26", prompt, tree="3,2,1", max_new_tokens=tokens, seed=1, eos_token_id=[])
    seconds = time.perf_counter() - started
    return {"tokens": len(run.tokens), "seconds": seconds, "tokens_per_s": len(run.tokens) / seconds,
            "rounds": run.blocks, "accepted": run.accepted, "mean_tv_target": run.mean("tv_target")}


def batched_sweep(target, tokens: int) -> dict:
    from diagnostics.engine import generate_batch
    from diagnostics.runner import encode_prompt

    prompt = encode_prompt(target, PROMPT)
    rules = ["lossless", "lenience:0.5", "cascade:0.3", "lossless"]
    rows = [(rule, seed) for seed in range(8) for rule in rules]
    figures = {}
    for size in (1, 32):
        started = time.perf_counter()
        runs = generate_batch(target, "early-exit:26", [prompt] * len(rows), [rule for rule, _ in rows],
                              [seed for _, seed in rows], gamma=4, max_new_tokens=tokens, eos_token_id=[], batch_size=size)
        seconds = time.perf_counter() - started
        positions = sum(len(run.tokens) for run in runs)
        figures[f"batch_{size}"] = {"positions": positions, "seconds": seconds, "positions_per_s": positions / seconds}
    figures["speedup_32_vs_1"] = figures["batch_32"]["positions_per_s"] / figures["batch_1"]["positions_per_s"]
    return figures


def inspect_laws(target, tokens: int) -> dict:
    import torch

    from diagnostics.engine import generate
    from diagnostics.inspection import RunLaws
    from diagnostics.models import early_exit_model, load_model
    from diagnostics.runner import encode_prompt

    prompt = encode_prompt(target, PROMPT)
    run = generate(target, "early-exit:26", prompt, max_new_tokens=tokens, seed=2, eos_token_id=[], record=False)
    stored = {"prompt_ids": prompt, "policy": None, "draft_policy": None}
    started = time.perf_counter()
    laws = RunLaws(stored, run.tokens, target, early_exit_model(target, 26))
    rows = [laws.p_at(position) for position in range(len(run.tokens))]
    seconds = time.perf_counter() - started
    cpu = load_model("default", device="cpu")
    reference = RunLaws(stored, run.tokens, cpu, early_exit_model(cpu, 26))
    difference = max(float((row.cpu() - reference.p_at(position)).abs().max()) for position, row in enumerate(rows))
    return {"positions": len(rows), "seconds": seconds, "max_abs_difference_vs_cpu_float32": difference,
            "device": str(rows[0].device) if rows else None, "cuda": torch.cuda.is_available()}


def heads(target, tokens: int) -> dict:
    import tempfile

    from diagnostics.engine import generate_batch
    from diagnostics.heads.check import check_run
    from diagnostics.heads.layout import load_head, make_head
    from diagnostics.runner import encode_prompt

    prompt = encode_prompt(target, PROMPT)
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        for kind, shape in (("eagle3", {"gamma": 3}), ("medusa", {"tree": "[[0],[1],[2],[0,0],[1,0],[0,0,0]]"})):
            head = load_head(kind, str(make_head(kind, target, Path(folder) / kind, init="target" if kind == "medusa" else "random")),
                             target)
            started = time.perf_counter()
            runs = generate_batch(target, head, [prompt] * 16, "lossless", list(range(16)), max_new_tokens=tokens,
                                  eos_token_id=[], **shape)
            seconds = time.perf_counter() - started
            checks = [check_run(run, head, target, limit=16) for run in runs[:2]]
            positions = sum(len(run.tokens) for run in runs)
            figures[kind] = {"shape": shape, "positions": positions, "seconds": seconds, "positions_per_s": positions / seconds,
                             "accepted": sum(run.accepted for run in runs),
                             "q_checked": sum(check.positions for check in checks),
                             "q_max_error": max(check.max_error for check in checks)}
    return figures


def paths(target, tokens: int) -> dict:
    """Every drafter, chain and tree mode, and both heads, as 4 rows of one batch on the target's device."""
    import tempfile

    from diagnostics.engine import generate_batch
    from diagnostics.heads.layout import load_head, make_head
    from diagnostics.models import early_exit_model
    from diagnostics.runner import encode_prompt

    prompt = encode_prompt(target, PROMPT)
    exit_draft = early_exit_model(target, 26)
    other = early_exit_model(target, 20)  # a second model-like drafter with its own cache
    figures: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        heads = {kind: load_head(kind, str(make_head(kind, target, Path(folder) / kind,
                                                     init="target" if kind == "medusa" else "random")), target)
                 for kind in ("eagle3", "medusa")}
        setups = {
            "plain": (None, {}), "chain, one cache": (exit_draft, {}), "chain, two caches": (exit_draft, {"reuse_layers": False}),
            "model drafter, draft stop": (other, {"draft_stop": 0.3, "reuse_layers": False}), "ngram chain": ("ngram:2", {}),
            "ngram tree": ("ngram:2", {"tree": "2,2"}), "tree top 3,2,1": (exit_draft, {"tree": "3,2,1"}),
            "tree sampled": (exit_draft, {"tree": "2,2", "tree_children": "sample"}),
            "tree sampled distinct": (exit_draft, {"tree": "2,2", "tree_children": "sample-distinct"}),
            "budget tree": (exit_draft, {"tree_budget": 8, "tree_depth": 3}),
            "eagle3 chain": (heads["eagle3"], {"gamma": 3}), "eagle3 tree": (heads["eagle3"], {"tree": "2,1"}),
            "medusa chain": (heads["medusa"], {"gamma": 3}), "medusa tree": (heads["medusa"], {"tree": "[[0],[1],[0,0]]"}),
        }
        for name, (draft, settings) in setups.items():
            sampled = settings.get("tree_children", "top") != "top"
            rules = ["lossless"] * 4 if sampled else ["lossless", "lenience:0.5"] * 2
            started = time.perf_counter()
            try:
                runs = generate_batch(target, draft, [prompt] * 4, rules, [0, 0, 1, 1], max_new_tokens=tokens, eos_token_id=[],
                                      **settings)
                seconds = time.perf_counter() - started
                emitted = sum(len(run.tokens) for run in runs)
                figures[name] = {"ok": all(run.status == "complete" for run in runs), "tokens": emitted,
                                 "tokens_per_s": emitted / seconds, "accepted": sum(run.accepted for run in runs)}
            except Exception as error:  # noqa: BLE001 - every path reports, one failure must not hide the rest
                figures[name] = {"ok": False, "error": f"{error.__class__.__name__}: {str(error)[:300]}"}
    figures["all_ok"] = all(part.get("ok") for part in figures.values() if isinstance(part, dict))
    return figures


def planted_bug(dtype: str, generations: int) -> dict:
    """The engine audit of a planted bug on the device: it must fail (12 generations fail it on a CPU, p < 1e-6)."""
    from diagnostics.audit.suite import run_engine_audit

    setup = _audit_setup(dtype)
    started = time.perf_counter()
    result = run_engine_audit("rollback_off_by_one", setup, generations=min(generations, 24), max_new_tokens=16, gamma=3)
    return {"implementation": "rollback_off_by_one", "verdict": result.verdict, "caught": result.verdict == "fail",
            "p_value": result.p_value, "tokens": result.tokens, "seconds": time.perf_counter() - started}


def _cli(arguments: list[str], timeout: float) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "diagnostics", *arguments], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    figures: dict = {"returncode": done.returncode, "seconds": time.perf_counter() - started}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if lines:
        figures["last_json"] = json.loads(lines[-1])
    if done.returncode != 0:
        figures["stderr_tail"] = done.stderr[-1500:]
    return figures


def compare_group(dtype: str, device: str, tokens: int) -> dict:
    """``python -m diagnostics compare`` on the device: lossless vs lenience:0.5 over seeds 0-1, stored."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return _cli(["compare", "--prompt", PROMPT, "--rules", "lossless,lenience:0.5", "--seeds", "0-1",
                     "--max-new-tokens", str(tokens), "--device", device, "--dtype", dtype, "--db", f"{folder}/runs.duckdb"], 240)


def sweep(dtype: str, device: str, tokens: int) -> dict:
    """A small ``python -m diagnostics sweep`` on the device (two prompts, two rules, one seed)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return _cli(["sweep", "--prompts", "general", "--limit", "2", "--rule", "lossless", "--rule", "lenience:0.5",
                     "--seeds", "1", "--max-new-tokens", str(tokens), "--cost", "0.9", "--device", device, "--dtype", dtype,
                     "--no-progress", "--db", f"{folder}/runs.duckdb"], 240)


def bench(dtype: str) -> dict:
    out = Path("/tmp/gpu_check_bench.json")
    started = time.perf_counter()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"  # a CPU smoke run of this script still runs every part
    done = subprocess.run([sys.executable, "-m", "diagnostics", "bench", "--device", device, "--dtype", dtype, "--quick",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    figures = {"returncode": done.returncode, "seconds": time.perf_counter() - started}
    if out.is_file():
        figures["figures"] = json.loads(out.read_text())
    else:
        figures["stderr_tail"] = done.stderr[-2000:]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--generations", type=int, default=120, help="engine audit generations per dtype")
    parser.add_argument("--budget-s", type=float, default=450.0, help="start no new part after this many seconds")
    parser.add_argument("--tokens", type=int, default=128, help="tokens of the tree run and Inspect's run; half in the sweep")
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None,
                        help="write the summary here after every part (default: $OUT/gpu_check.json when $OUT is set)")
    args = parser.parse_args()
    import torch

    from diagnostics.models import load_model

    began = time.perf_counter()
    summary: dict = {"cuda": torch.cuda.is_available(), "torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "results": {}}
    if not torch.cuda.is_available():
        log("no CUDA device: the figures below are from the CPU and say nothing about a GPU")
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def save() -> None:
        summary["seconds"] = time.perf_counter() - began
        if args.out:
            Path(args.out).write_text(json.dumps(summary, indent=2, default=str))

    for dtype in args.dtypes.split(","):
        results = summary["results"].setdefault(dtype, {})
        target = load_model("default", dtype=dtype)
        short = max(1, args.tokens // 8)
        parts = [("paths", lambda: paths(target, short)),
                 ("planted_bug", lambda: planted_bug(dtype, args.generations)),
                 ("tree_run", lambda: tree_run(target, args.tokens)),
                 ("batched_sweep", lambda: batched_sweep(target, max(1, args.tokens // 2))),
                 ("inspect_laws", lambda: inspect_laws(target, args.tokens)),
                 ("heads", lambda: heads(target, max(1, args.tokens // 2))),
                 ("engine_audit", lambda: engine_audit(dtype, args.generations)),
                 ("compare_group", lambda: compare_group(dtype, device, short)),
                 ("sweep", lambda: sweep(dtype, device, short)), ("bench", lambda: bench(dtype))]
        for name, part in parts:
            if time.perf_counter() - began > args.budget_s:
                results[name] = {"skipped": "over the time budget"}
                continue
            log(f"{dtype}: {name}")
            try:
                results[name] = part()
            except Exception as error:  # noqa: BLE001 - one part failing must not lose the others' figures
                results[name] = {"error": f"{error.__class__.__name__}: {str(error)[:500]}"}
            save()  # written as soon as the part ends: a time limit still leaves what was measured
    save()
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
