"""``bench``: speed ratios against plain decoding and transformers generate, measured in one run."""

from __future__ import annotations

from typing import Any


def command_bench(args: Any) -> int:
    from diagnostics.bench import run_bench

    return run_bench(args)


def add_parser(commands: Any) -> None:
    """The ``bench`` command's options."""
    bench = commands.add_parser("bench", help="speed ratios against plain decoding and transformers generate, in one run",
                                description="Every number is a ratio measured side by side in one run on the embedded model; "
                                            "prints one JSON object.")
    bench.add_argument("--max-new-tokens", type=int, default=48, help="tokens each timed generation makes (EOS ignored on both sides)")
    bench.add_argument("--repeat", type=int, default=3, help="alternating repetitions per comparison; the median is reported")
    bench.add_argument("--json", default=None, metavar="FILE", help="also write the JSON figures to FILE (to compare runs)")
    bench.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                       help="weights' dtype (bfloat16 on a GPU; the laws are still computed in float64)")
    bench.add_argument("--only", default=None, choices=["trees", "batch", "round"],
                       help="only one section: trees (chain against trees: tokens per target forward, tokens/s, forward cost), "
                            "batch (a sweep batched against one run at a time, the batch-size curve, the engine audit's time) "
                            "or round (positions/s of the tensor core against the reference core and transformers, for each "
                            "setup and batch size in --rows, with the machine's CPU, cores and caches)")
    bench.add_argument("--rows", default="1,8,32,64", help="batch sizes of --only round, separated by commas")
    bench.add_argument("--quick", action="store_true",
                       help="fewer settings and a smaller recording-memory probe (200 positions instead of 2000), for a smoke test")
    bench.set_defaults(handler=command_bench)
