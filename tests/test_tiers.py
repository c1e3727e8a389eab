"""The tiers' guard and order (``tests/tiers.py``). Everyday tier, well under a second."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import tiers


@pytest.fixture
def fresh(monkeypatch):
    """A run of the hooks on their own state, with a 10 s budget per everyday file."""
    monkeypatch.setattr(tiers, "_SECONDS", defaultdict(float))
    monkeypatch.setattr(tiers, "_SLOW", set())
    monkeypatch.setattr(tiers, "_OVER", [])
    monkeypatch.setattr(tiers, "EVERYDAY_FILE_BUDGET_S", 10.0)


def _report(nodeid: str, seconds: float, slow: bool = False) -> None:
    for phase_seconds in (seconds / 2, seconds / 2):  # setup and call add up
        tiers.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=phase_seconds, keywords={"slow": 1} if slow else {}))


def test_an_everyday_file_over_its_budget_fails_the_run(fresh) -> None:
    _report("tests/test_a.py::one", 6)
    _report("tests/test_a.py::two", 6)  # 12 s together: over
    _report("tests/test_b.py::one", 9)  # under
    _report("tests/test_c.py::one", 50, slow=True)  # the slow tier has no per-file budget
    session = SimpleNamespace(exitstatus=0)
    tiers.pytest_sessionfinish(session, 0)
    assert session.exitstatus == 1
    assert len(tiers._OVER) == 1 and tiers._OVER[0].startswith("tests/test_a.py: 12 s of everyday-tier tests")


def test_within_budget_the_run_keeps_its_status(fresh) -> None:
    _report("tests/test_a.py::one", 9)
    _report("tests/test_c.py::one", 500, slow=True)
    session = SimpleNamespace(exitstatus=0)
    tiers.pytest_sessionfinish(session, 0)
    assert session.exitstatus == 0 and tiers._OVER == []
    totals = tiers.file_totals()  # (this test's own setup is reported into the same state)
    assert totals[("everyday", "tests/test_a.py")] == 9 and totals[("slow", "tests/test_c.py")] == 500


def test_costliest_files_go_first_then_slow_then_everyday() -> None:
    def item(nodeid: str, slow: bool = False):
        return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: object() if slow and name == "slow" else None)

    items = [item("tests/test_a.py::x"), item("tests/test_b.py::y", slow=True), item("tests/test_engine_lossless.py::z", slow=True),
             item("tests/test_a.py::w"), item("tests/test_tree_lossless.py::v", slow=True)]
    tiers.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["tests/test_tree_lossless.py::v", "tests/test_engine_lossless.py::z", "tests/test_b.py::y",
                                         "tests/test_a.py::x", "tests/test_a.py::w"]
