"""Time ``induced`` (and ``accept_prob``) of every rule on a 64 × 49,152 batch on this machine.

Run: ``python bench/rules_bench.py [--rows 64] [--vocab 49152] [--repeat 5]``. Prints one line
per rule with the median wall time, and the time of a plain ``softmax`` over the same batch as
the peer measured in the same run (the cost of computing ``p`` itself).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diagnostics.rules import EXAMPLE_SPECS, SampledMultiDraft, get_rule, get_tree_rule, top_candidates  # noqa: E402


def _median_ms(function, repeat: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    logits_p = torch.randn(args.rows, args.vocab, generator=generator) * 3
    logits_q = torch.randn(args.rows, args.vocab, generator=generator) * 3
    p, q = torch.softmax(logits_p.double(), -1), torch.softmax(logits_q.double(), -1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.rows} x {args.vocab}, float64")
    peer = _median_ms(lambda: torch.softmax(logits_p.double(), -1), args.repeat)
    print(f"{'peer: softmax(logits) float64':34s} {peer:8.2f} ms")
    for spec in EXAMPLE_SPECS:
        rule = get_rule(spec)
        elapsed = _median_ms(lambda: rule.induced(p, q), args.repeat)
        print(f"{'induced ' + spec:34s} {elapsed:8.2f} ms   {elapsed / peer:5.2f}x softmax")
    candidates = top_candidates(q, 4)
    for spec in ("lossless", "lenience:0.5", "cascade:0.5", "typical:0.1"):
        tree = get_tree_rule(spec)
        elapsed = _median_ms(lambda: tree.induced(p, candidates), args.repeat)
        print(f"{'tree induced k=4 ' + spec:34s} {elapsed:8.2f} ms   {elapsed / peer:5.2f}x softmax")
    multi = SampledMultiDraft(4)
    elapsed = _median_ms(lambda: multi.induced(p, q), args.repeat)
    print(f"{'multidraft induced k=4':34s} {elapsed:8.2f} ms   {elapsed / peer:5.2f}x softmax")


if __name__ == "__main__":
    main()
