"""Opening the dashboard under AppTest: one helper for every page test."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def open_page(page: str | None = None, query: dict | None = None, timeout: float = 120) -> AppTest:
    """Run app.py (with ``query`` parameters), switch to ``page`` if given, and check nothing raised."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    if page:
        at.switch_page(page)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


PAGES = ["views/run.py", "views/inspect.py", "views/compare.py", "views/sweep.py", "views/playground.py", "views/audit.py", "views/runs.py"]


def visit_every_page(shared: str | None = None, run_id: str | None = None, group: str | None = None,
                     audit_id: str | None = None, timeout: float = 120) -> dict[str, AppTest]:
    """Every page of the app, with a shared file open read-only (as the Runs page's import leaves
    it) and deep links to a run (and position 1), a group and an audit; nothing may raise."""
    visited = {}
    for page in PAGES:
        at = AppTest.from_file(APP, default_timeout=timeout)
        if shared:
            at.session_state["shared_db"] = shared
        query = {"inspect": {"run": run_id, "pos": "1"}, "compare": {"group": group}, "audit": {"audit": audit_id}}
        for key, value in query.get(page.split("/")[-1][:-3], {}).items():
            if value is not None:
                at.query_params[key] = value
        at.run()
        if page != "views/inspect.py" or run_id is None:  # a run link makes Inspect the default page
            at.switch_page(page)
            at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
        visited[page] = at
    return visited
