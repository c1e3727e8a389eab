"""The suite's two tiers, their cost on every run, and the guard that keeps the everyday tier fast.

* everyday tier: ``python -m pytest -q -m "not slow"`` (maths, contracts, store, CLI, pages, bad
  input, on tiny models; under 5 minutes on 2 cores);
* ``slow``: end-to-end losslessness and planted-bug statistics, the embedded model, servers,
  browser walks (``pytestmark = pytest.mark.slow`` in the module, or on the test).

Every run prints, after the tests, each tier's total, the ten slowest tests and the costliest
files, so that a new capability shows its cost in CI's log. An everyday-tier file whose tests take
more than ``EVERYDAY_FILE_BUDGET_S`` seconds together fails the run: it belongs in ``slow``, or
should be made cheaper. The budget is a generous bound (the costliest everyday file took about half of
it on a 2-core machine), not a figure from one machine; ``EVERYDAY_FILE_BUDGET_S=0`` turns the
guard off (for a run on a machine known to be much slower).

The hooks are imported into ``conftest.py``; under ``pytest-xdist`` they run in the controller,
which receives every worker's reports.
"""

from __future__ import annotations

import os
from collections import defaultdict

EVERYDAY_FILE_BUDGET_S = float(os.environ.get("EVERYDAY_FILE_BUDGET_S", "120"))

# Scheduled first: the costliest files (longest first, so that the two workers end together rather
# than one finishing an end-to-end statistics file alone), then the rest of the slow tier, then the
# everyday tier, each in collection order. Measured in one full run on 2 cores.
COSTLIEST_FIRST = ("tests/test_tree_lossless.py", "tests/test_engine_lossless.py", "tests/test_audit_embedded.py",
                   "tests/test_llama_server.py")


def pytest_collection_modifyitems(config, items) -> None:
    """Order the files: ``COSTLIEST_FIRST``, other files with slow tests, then the rest (stable).
    With ``--dist loadfile`` the workers take whole files in this order."""
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        if path in COSTLIEST_FIRST:
            return COSTLIEST_FIRST.index(path)
        return len(COSTLIEST_FIRST) + (0 if path in slow_files else 1)

    items.sort(key=rank)


_SECONDS: dict[str, float] = defaultdict(float)  # test id → setup + call + teardown seconds
_SLOW: set[str] = set()
_OVER: list[str] = []


def tier_of(nodeid: str) -> str:
    return "slow" if nodeid in _SLOW else "everyday"


def pytest_runtest_logreport(report) -> None:
    _SECONDS[report.nodeid] += getattr(report, "duration", 0.0) or 0.0
    if "slow" in getattr(report, "keywords", {}):
        _SLOW.add(report.nodeid)


def file_totals() -> dict[tuple[str, str], float]:
    """``{(tier, file): seconds}`` over the tests this run reported."""
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for nodeid, seconds in _SECONDS.items():
        totals[(tier_of(nodeid), nodeid.split("::")[0])] += seconds
    return totals


def pytest_sessionfinish(session, exitstatus) -> None:
    if EVERYDAY_FILE_BUDGET_S <= 0:
        return
    for (tier, path), seconds in sorted(file_totals().items()):
        if tier == "everyday" and seconds > EVERYDAY_FILE_BUDGET_S:
            _OVER.append(f"{path}: {seconds:.0f} s of everyday-tier tests (budget {EVERYDAY_FILE_BUDGET_S:.0f} s): "
                         "mark its costly tests slow or make them cheaper")
    if _OVER and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _SECONDS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("test tiers")
    tiers: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds in _SECONDS.items():
        tiers[tier_of(nodeid)].append(seconds)
    for tier in ("everyday", "slow"):
        if tier in tiers:
            write(f"{tier:>8}: {len(tiers[tier]):5d} tests, {sum(tiers[tier]):8.1f} s (summed over workers)")
    write("ten slowest tests:")
    for nodeid, seconds in sorted(_SECONDS.items(), key=lambda item: -item[1])[:10]:
        write(f"  {seconds:7.1f} s  {tier_of(nodeid):>8}  {nodeid}")
    write("costliest files:")
    for (tier, path), seconds in sorted(file_totals().items(), key=lambda item: -item[1])[:10]:
        write(f"  {seconds:7.1f} s  {tier:>8}  {path}")
    for line in _OVER:
        terminalreporter.write_line("OVER BUDGET " + line, red=True)
