"""Real-browser tests: ``streamlit run app.py`` driven by Playwright in Debian's chromium."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser_support import ARTIFACTS, CHROMIUM_ARGS, chromium_path, streamlit_server

# Slow tier: a browser walk: streamlit run driven in chromium
pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = chromium_path()
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def app_url() -> Iterator[str]:
    with streamlit_server() as url:
        yield url


def test_playground_opens_and_draws(browser, app_url: str) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(app_url + "/playground")
    page.get_by_role("heading", name="Playground").wait_for(timeout=30_000)
    page.get_by_text("Distortion as the draft improves").wait_for(timeout=30_000)
    page.locator(".js-plotly-plot").nth(1).wait_for(timeout=30_000)
    assert page.locator(".js-plotly-plot").count() == 2
    page.wait_for_timeout(1000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"))

    # Switching the rule redraws with lenience's ceiling in the legend.
    page.get_by_label("Verification rule", exact=True).click()
    page.get_by_role("option", name="lenience").first.click()
    page.get_by_text("ceiling p/l").first.wait_for(timeout=30_000)

    # A bad typed spec gives the one-line error, not a traceback.
    box = page.get_by_placeholder("e.g. lenience:0.3")
    box.fill("lenience:0")
    box.press("Enter")
    page.get_by_text("lenience:0 is out of range").wait_for(timeout=30_000)
    assert page.get_by_text("Traceback").count() == 0
    page.close()
