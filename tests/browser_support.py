"""Start ``streamlit run app.py`` on a free port and drive it with Playwright in Debian's chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from diagnostics.verdicts.served import served

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    """Debian's chromium, or skip (fail under ``REQUIRE_BROWSER=1``, as CI sets)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    message = "browser tests need Debian's chromium: apt-get install chromium"
    if os.environ.get("REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)


# Streamlit started under an audit hook that writes every process the server starts (Python's
# audit events for subprocesses, exec, fork and spawn) to a log: what a page ran is visible.
_SPAWN_LOGGER = """\
import sys
log = open(sys.argv[1], "a", buffering=1, encoding="utf-8")
EVENTS = {"subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork", "os.forkpty"}
def hook(event, args):
    if event in EVENTS:
        log.write(event + " " + repr(args)[:400] + "\\n")
sys.addaudithook(hook)
sys.argv = ["streamlit", *sys.argv[2:]]
from streamlit.web.cli import main
main()
"""


@contextmanager
def streamlit_server(env: dict[str, str] | None = None, spawn_log: Path | None = None) -> Iterator[str]:
    """Run the app headless on localhost; yield its URL; stop it afterwards. ``spawn_log``: record
    there every process the server starts. Its log goes to tests/artifacts."""
    launcher = [sys.executable, "-c", _SPAWN_LOGGER, str(spawn_log)] if spawn_log else [sys.executable, "-m", "streamlit"]

    def command(port: int) -> list[str]:
        return [*launcher, "run", str(ROOT / "app.py"), "--server.headless", "true", "--server.port", str(port),
                "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / f"streamlit-{os.getpid()}-{time.monotonic_ns()}.log"
    with served(command, log, "streamlit", ready_path="/_stcore/health", env=env or {}, cwd=ROOT) as url:
        yield url


@contextmanager
def chromium() -> Iterator[object]:
    """Debian's chromium under Playwright, closed afterwards (the browser fixtures of every module)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def shot(page, name: str, pause_ms: int = 800, full_page: bool = False) -> None:
    """A screenshot into tests/artifacts/ (kept by CI for a look after a failure)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if pause_ms:
        page.wait_for_timeout(pause_ms)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full_page)


def wait_or_explain(page, locator, what: str, timeout_ms: int = 60_000, state: str = "visible") -> None:
    """``locator.wait_for``, failing with the page's own text and a screenshot (CI keeps both) rather
    than a bare timeout, so that a failure seen only under CI's load says what the page showed."""
    try:
        locator.wait_for(timeout=timeout_ms, state=state)
    except Exception as error:  # noqa: BLE001 - Playwright's timeout, explained
        name = "failed_" + re.sub(r"[^a-z0-9]+", "_", what.lower())[:60]
        shot(page, name, pause_ms=0, full_page=True)
        text = page.locator("body").inner_text()[-4000:]
        raise AssertionError(f"{what}: not {state} after {timeout_ms / 1000:.0f} s; screenshot {name}.png; the page said:\n{text}") from error


def settled(page, timeout_ms: int = 60_000) -> None:
    """Wait until the app's script run is over: no running indicator and no stale element left
    from the previous run. A click during a rerun can land on a copy that is being replaced and be
    lost (seen under load in CI)."""
    deadline = time.monotonic() + timeout_ms / 1000
    busy = page.locator('[data-testid="stStatusWidget"], [data-stale="true"]')
    while busy.count():
        if time.monotonic() > deadline:
            raise AssertionError(f"the page did not settle in {timeout_ms / 1000:.0f} s")
        page.wait_for_timeout(100)


def select_first_row(page, grid, attempts: int = 3) -> None:
    """Click the first row's marker in a Streamlit data grid until the page says one row is selected
    (a click while the grid is still drawing its rows is lost: seen when a server starts cold)."""
    for _ in range(attempts):
        settled(page)
        box = grid.bounding_box()
        page.mouse.click(box["x"] + 14, box["y"] + 52)
        try:
            page.get_by_text("1 selected").first.wait_for(timeout=10_000)
            return
        except Exception:  # noqa: BLE001 - Playwright's timeout: try the click again
            page.wait_for_timeout(500)
    raise AssertionError("the grid's first row could not be selected")
