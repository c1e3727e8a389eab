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
    from diagnostics.drafts import load_draft
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


_PEER = """
import os, sys, time
sys.path.insert(0, os.environ["PEER_ROOT"])
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(os.path.join(os.environ["PEER_ROOT"], "views", "inspect.py"), default_timeout=1200)
at.query_params["run"] = os.environ["PEER_RUN"]
start = time.perf_counter(); at.run(); print("open", time.perf_counter() - start, flush=True)
assert not at.exception, [e.value for e in at.exception]
for index in range(int(os.environ["PEER_CLICKS"])):
    at.number_input(key="inspect_position").set_value((index * 37 + 5) % int(os.environ["PEER_COUNT"]))
    start = time.perf_counter(); at.run(); print("click", time.perf_counter() - start, flush=True)
    assert not at.exception, [e.value for e in at.exception]
"""


def _peer(revision: str, db: str, run_id: str, count: int, clicks: int) -> tuple[float, list[float]]:
    """The Inspect page of ``revision`` (e.g. the commit before issue 10) on the same run, in a
    fresh process (its own model caches, as a fresh server): first open and ``clicks`` clicks."""
    import os
    import subprocess

    folder = tempfile.mkdtemp(prefix="inspect-peer-")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", folder, revision], check=True, capture_output=True)
    try:
        env = {**os.environ, "PEER_ROOT": folder, "PEER_RUN": run_id, "PEER_COUNT": str(count), "PEER_CLICKS": str(clicks),
               "SPECLAB_DB": db}
        output = subprocess.run([sys.executable, "-c", _PEER], env=env, cwd=folder, capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", folder], capture_output=True)
    times = [line.split() for line in output.splitlines() if line.startswith(("open", "click"))]
    return float(times[0][1]), [float(value) for name, value in times[1:]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="new tokens of the main run")
    parser.add_argument("--long", type=int, default=2000, help="positions of the long run (0: skip it)")
    parser.add_argument("--clicks", type=int, default=8, help="position changes timed per run")
    parser.add_argument("--db", default=None, help="DuckDB file to record into (default: a temporary file)")
    parser.add_argument("--peer", default=None, metavar="REV",
                        help="also time the Inspect page of this git revision on the main run (e.g. 99cbbbf, before issue 10)")
    parser.add_argument("--peer-clicks", type=int, default=2, help="position changes timed on the peer (each can take a minute)")
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
              f"(max {max(times):.3f} s, {len(times)} clicks); the forward passes alone of the previous design's click "
              f"(cache-free forwards on the prefix) {old:.2f} s", flush=True)
        if args.peer and name == "main":
            peer_open, peer_clicks = _peer(args.peer, db, run_id, count, args.peer_clicks)
            peer_click = statistics.median(peer_clicks)
            print(f"peer {args.peer} on the same run: first open {peer_open:.1f} s ({peer_open / first:.0f}× ours); "
                  f"position change median {peer_click:.1f} s over {len(peer_clicks)} clicks ({peer_click / click:.0f}× ours)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
