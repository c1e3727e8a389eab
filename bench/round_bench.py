"""The batched core's speed on the embedded model, each figure a ratio against a peer timed in the same run.

1. Plain decoding of ``--rows`` rows (one prompt, a seed per row, every position recorded) against
   transformers' plain batched ``generate(do_sample=True)`` of the same rows, in this process,
   alternating the two (median of ``--repeat``).
Ours is the tensor program (``core="tensor"``).
2. ``early-exit:26`` with ``lenience:0.5`` at γ 4 over ``--rows`` rows: this checkout against the code
   of ``--peer`` (a git revision, checked out into a temporary folder), each side in its own process
   (the model loaded once per process, one warm-up, then the timed calls), alternating processes.

Positions/s count every emitted token of every row over the wall time of the whole batch.

    python bench/round_bench.py --peer 6799bab --json docs/bench_round.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."

# Run by each side's process with its own code first on sys.path: prints one JSON line per timed call.
SIDE = r"""
import json, sys, time
import torch
from diagnostics.engine import generate_batch
from diagnostics.models import load_model
from diagnostics.runner import encode_prompt
rows, tokens, calls, draft, rule, gamma = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
target = load_model("default", dtype="float32", device="cpu")
prompt = encode_prompt(target, sys.argv[7])
draft = None if draft == "none" else draft
for call in range(calls + 1):  # the first call warms up
    seeds = list(range(call * rows, (call + 1) * rows))
    start = time.perf_counter()
    extra = {"core": "tensor"} if "core" in generate_batch.__code__.co_varnames else {}  # the peer may predate it
    runs = generate_batch(target, draft, [prompt] * rows, rule, seeds, gamma=gamma, max_new_tokens=tokens, eos_token_id=[], **extra)
    seconds = time.perf_counter() - start
    if call:
        print(json.dumps({"positions": sum(len(run.tokens) for run in runs), "seconds": seconds,
                          "records": sum(len(run.records) for run in runs)}), flush=True)
"""


def _side(code_root: str, args: argparse.Namespace, calls: int, draft: str, rule: str) -> list[float]:
    """Positions/s of ``calls`` timed batches run by the code under ``code_root`` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=code_root)
    output = subprocess.run([sys.executable, "-c", SIDE, str(args.rows), str(args.tokens), str(calls), draft, rule, "4", PROMPT],
                            cwd=code_root, env=env, capture_output=True, text=True, check=True).stdout
    rates = []
    for line in output.splitlines():
        measured = json.loads(line)
        if measured["records"] != measured["positions"]:
            raise RuntimeError("a side did not record every position")
        rates.append(measured["positions"] / measured["seconds"])
    return rates


def plain_against_transformers(args: argparse.Namespace) -> dict:
    import torch

    from diagnostics.engine import generate_batch
    from diagnostics.models import load_model
    from diagnostics.runner import encode_prompt

    target = load_model("default", dtype="float32", device="cpu")
    prompt = encode_prompt(target, PROMPT)
    ids = torch.tensor([prompt] * args.rows, dtype=torch.long, device=target.device)
    seeds = iter(range(10**6))

    def ours() -> float:
        start = time.perf_counter()
        runs = generate_batch(target, None, [prompt] * args.rows, "lossless", [next(seeds) for _ in range(args.rows)],
                              max_new_tokens=args.tokens, eos_token_id=[], core="tensor")
        assert all(len(run.records) == args.tokens for run in runs)
        return sum(len(run.tokens) for run in runs) / (time.perf_counter() - start)

    def theirs() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            output = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                           top_k=0, top_p=1.0, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                           pad_token_id=target.tokenizer.eos_token_id)
        return (output.shape[1] - ids.shape[1]) * args.rows / (time.perf_counter() - start)

    ours(), theirs()  # warm-up
    mine, peer = [], []
    for _ in range(args.repeat):
        mine.append(ours())
        peer.append(theirs())
    result = {"ours_positions_per_s": round(statistics.median(mine), 1),
              "transformers_positions_per_s": round(statistics.median(peer), 1)}
    result["ratio"] = round(result["ours_positions_per_s"] / result["transformers_positions_per_s"], 3)
    return result


def lossy_against_peer(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(["git", "-C", ROOT, "archive", args.peer], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        mine, peer = [], []
        for _ in range(args.alternations):
            mine += _side(ROOT, args, args.repeat, "early-exit:26", "lenience:0.5")
            peer += _side(folder, args, args.repeat, "early-exit:26", "lenience:0.5")
    result = {"ours_positions_per_s": round(statistics.median(mine), 1),
              f"peer_{args.peer}_positions_per_s": round(statistics.median(peer), 1)}
    result["ratio"] = round(statistics.median(mine) / statistics.median(peer), 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per row")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per side (per process for the peer)")
    parser.add_argument("--alternations", type=int, default=2, help="processes per side in the peer comparison")
    parser.add_argument("--peer", default=None, metavar="REV", help="git revision of the code to compare the lossy batch with")
    parser.add_argument("--only", choices=("plain", "lossy"), default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    results: dict = {"rows": args.rows, "tokens_per_row": args.tokens, "repeat": args.repeat,
                     "torch_threads": torch.get_num_threads(), "cores": os.cpu_count()}
    if args.only in (None, "plain"):
        results["plain_vs_transformers_generate"] = plain_against_transformers(args)
        print("plain, every position recorded, vs transformers generate:", results["plain_vs_transformers_generate"], flush=True)
    if args.only in (None, "lossy") and args.peer:
        results["early_exit_26_lenience_vs_peer"] = lossy_against_peer(args)
        print(f"early-exit:26 lenience:0.5 vs {args.peer}:", results["early_exit_26_lenience_vs_peer"], flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
