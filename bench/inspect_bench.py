"""Time the Inspect page on the embedded model, server side: first open of a run and a position change.

Run: ``python bench/inspect_bench.py [--tokens 256] [--long 2000] [--clicks 8] [--db FILE]``.

It records a ``--tokens`` run (lenience:0.5, early-exit:26, γ = 4) and, unless ``--long 0``, a
``--long``-position run on the embedded SmolLM2-135M, then drives ``views/inspect.py`` with
Streamlit's AppTest (no browser, like a server answering a click) and prints:

- the model load (once per server), the first open of each run (the exact laws of every
  position from one teacher-forced forward per model, plus the page), and the median of
  ``--clicks`` position changes;
- the peer measured in the same run: the previous design's cost of one click, a cache-free
  forward of target and draft on the committed prefix (``inspection.exact_laws``), and the ratio.

Goals (issue 10): a position change ≤ 1 s, the first open of a 256-token run ≤ 10 s.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = ("Write a long, detailed essay about the history of sailing ships, from the earliest rafts to the clipper "
          "ships of the nineteenth century, with many examples.")


def _record(store, target, tokens: int, seed: int, raw: bool = False) -> str:
    from diagnostics.models import load_draft
    from diagnostics.runner import RunRequest, record_run

    request = RunRequest(prompt=PROMPT, rule="lenience:0.5", draft="early-exit:26", gamma=4, max_new_tokens=tokens, seed=seed,
                         raw=raw)
    start = time.perf_counter()
    run_id, run = record_run(store, target, load_draft(request.draft, target), request)
    print(f"recorded {run_id}: {len(run.tokens)} tokens in {time.perf_counter() - start:.1f} s ({run.stop_reason})", flush=True)
    return run_id


def _long_run(store, target, tokens: int) -> str:
    """A run of about ``tokens`` positions: a raw prompt (no chat template, so the instruct model
    rarely closes its turn), seeds until one does not stop at EOS early."""
    best = None
    for seed in range(4):
        run_id = _record(store, target, tokens, seed, raw=True)
        count = int(store.get_run(run_id)["n_tokens"])
        if best is None or count > best[1]:
            best = (run_id, count)
        if count >= 0.9 * tokens:
            break
    return best[0]


def _page(db: str, run_id: str):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "views" / "inspect.py"), default_timeout=600)
    at.query_params["run"] = run_id
    return at


def _timed_open(db: str, run_id: str) -> tuple[float, object]:
    at = _page(db, run_id)
    start = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - start
    if at.exception:
        raise SystemExit(f"the page raised: {[e.value for e in at.exception]}")
    return elapsed, at


def _clicks(at, count: int, clicks: int) -> list[float]:
    times = []
    for index in range(clicks):
        position = (index * 37 + 5) % count
        at.number_input(key="inspect_position").set_value(position)
        start = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - start)
        if at.exception:
            raise SystemExit(f"the page raised at position {position}: {[e.value for e in at.exception]}")
        subheaders = [element.value for element in at.subheader]
        if not any(f"Position {position}:" in text for text in subheaders):
            raise SystemExit(f"position {position} was not shown: {subheaders}")
    return times


def _old_click(store, run_id: str, target, clicks: int) -> float:
    """The previous design: per click, cache-free forwards of target and draft on the committed prefix."""
    from diagnostics.inspection import draft_model, exact_laws

    run = store.get_run(run_id)
    records = store.positions(run_id).to_dict("records")
    drafter = draft_model(run, target)
    times = []
    for index in range(clicks):
        record = records[(index * 37 + 5) % len(records)]
        start = time.perf_counter()
        exact_laws(run, record, target, drafter)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="new tokens of the main run")
    parser.add_argument("--long", type=int, default=2000, help="positions of the long run (0: skip it)")
    parser.add_argument("--clicks", type=int, default=8, help="position changes timed per run")
    parser.add_argument("--db", default=None, help="DuckDB file to record into (default: a temporary file)")
    args = parser.parse_args()

    import os

    import torch

    folder = tempfile.mkdtemp(prefix="inspect-bench-")
    db = args.db or str(Path(folder) / "runs.duckdb")
    os.environ["SPECLAB_DB"] = db
    from diagnostics.models import load_model
    from diagnostics.store import Store
    from views.common import cached_model

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, threads {torch.get_num_threads()}")
    start = time.perf_counter()
    cached_model("default", _local_only=True)  # the server's one copy, as the page will find it
    print(f"model load (once per server): {time.perf_counter() - start:.1f} s")
    target = load_model("default")
    store = Store(db)
    runs = {"main": _record(store, target, args.tokens, 0)}
    if args.long:
        runs["long"] = _long_run(store, target, args.long)
    del store  # the page opens the file itself

    for name, run_id in runs.items():
        count = int(Store(db, read_only=True).get_run(run_id)["n_tokens"])
        first, at = _timed_open(db, run_id)
        times = _clicks(at, count, args.clicks)
        old = _old_click(Store(db, read_only=True), run_id, target, min(args.clicks, 4))
        click = statistics.median(times)
        print(f"{name} run ({count} positions): first open {first:.2f} s; position change median {click:.3f} s "
              f"(max {max(times):.3f} s, {len(times)} clicks); previous design's click {old:.2f} s "
              f"({old / click:.0f}× slower)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
