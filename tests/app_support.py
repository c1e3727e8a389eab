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
