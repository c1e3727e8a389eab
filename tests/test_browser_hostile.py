"""A hostile shared file and hostile URLs in a real browser: every page shows the payload as text,
and nothing in the file runs.

The file carries a payload (Markdown link, image and emphasis, a formula, autolinks, a colour
directive, HTML with a script and an image, terminal escapes) in every text column, in token
text and in audit evidence; its ids are payloads too. Each page is opened as the user's own
database (deep links) and through the Runs page's import (read-only), and the URL's own
parameters carry payloads. Asserted on every page: no request leaves the app's origin, no
dialog opens, the scripts never run, and no <a>, <img>, <strong>, KaTeX or coloured element
carries the payload's markers.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from urllib.parse import quote

import duckdb
import pytest
from browser_support import ARTIFACTS, CHROMIUM_ARGS, chromium_path, select_first_row, settled, streamlit_server
from shared_files import HOSTILE_AUDIT_ID, HOSTILE_GROUP_ID, HOSTILE_RUN_ID, HOSTILE_SWEEP_ID, hostile_export, real_export

# Slow tier: browser walks: streamlit run driven in chromium
pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")

# Elements that would mean a payload rendered as markup. The app's own links (href "/inspect?run=…",
# percent-encoded) may carry a payload as their literal label; any other link may not exist.
RENDERED = ("a:not([href^='/']):has-text('PWN'), a[href*='127.0.0.1:9'], a[href*='pwn.example'], a[href^='mailto'], "
            "img[alt*='PWN'], img[src*='127.0.0.1'], "
            "strong:has-text('PWN'), b:has-text('PWN'), .katex, [data-testid='stIconMaterial']:has-text('home'), "
            "span[style*='color']:has-text('PWN'), script:has-text('__pwned')")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_folder: str) -> Iterator[dict]:
    chromium_path()
    folder = tmp_path_factory.mktemp("hostile")
    marker = folder / "payload-ran"  # what the hostile sweep's code would create, run anywhere but the sandbox
    hostile = hostile_export(real_export(folder / "base", tiny_folder), folder / "hostile.duckdb", marker)
    own = folder / "own.duckdb"  # the same file as the user's own database: deep links reach every run
    shutil.copyfile(hostile.path, own)
    refused = folder / "refused.duckdb"  # the same file with one defect: a schema version that is not a number
    shutil.copyfile(hostile.path, refused)
    with duckdb.connect(str(refused)) as con:
        con.execute("UPDATE meta SET value = 'two'")
    spawn_log = folder / "spawned.log"
    spawn_log.touch()
    with streamlit_server({"SPECLAB_DB": str(own), "SPECLAB_TARGET": "default"}, spawn_log=spawn_log) as url:
        yield {"url": url, "file": hostile.path, "refused": refused, "marker": marker, "spawn_log": spawn_log}


@pytest.fixture
def page(setup) -> Iterator[object]:
    """A page whose every request, dialog and console error is recorded."""
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1600}, accept_downloads=True)
        requests: list[str] = []
        dialogs: list[str] = []
        context.on("request", lambda request: requests.append(request.url))
        context.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        tab = context.new_page()
        tab.requests, tab.dialogs = requests, dialogs
        yield tab
        browser.close()


def _inert(page, name: str, origin: str) -> None:
    """The checks every page must pass, after it has settled."""
    page.wait_for_timeout(1500)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"hostile_{name}.png"), full_page=True)
    rendered = page.locator(RENDERED)
    assert rendered.count() == 0, (name, [rendered.nth(index).evaluate("e => e.outerHTML")[:200] for index in range(min(3, rendered.count()))])
    outside = [url for url in page.requests if not url.startswith((origin, "data:", "blob:", "about:"))]
    assert not outside, (name, outside)
    assert not page.dialogs, (name, page.dialogs)
    assert page.evaluate("window.__pwned") is None, name
    shown = page.locator("body").inner_text()
    assert "\u202e" not in shown and "\x1b" not in shown, name  # bidi overrides and escapes are shown, not obeyed


def _open(page, url: str, heading: str) -> None:
    page.goto(url)
    page.get_by_role("heading", name=heading).first.wait_for(timeout=60_000)


def test_every_page_shows_a_hostile_database_as_text(setup, page) -> None:
    url = setup["url"]
    _open(page, url, "Run")
    page.get_by_text("spec-verify-lab").first.wait_for(timeout=30_000)
    _inert(page, "run", url)

    _open(page, f"{url}/inspect?run={quote(HOSTILE_RUN_ID, safe='')}&pos=1", "Inspect a run")
    page.get_by_text("Position 1:").first.wait_for(timeout=60_000)
    page.get_by_text("PWN **PWNBOLD**").first.wait_for(timeout=30_000)  # the caption shows the payload as text
    page.get_by_role("button", name=re.compile(r"^Load PWN")).wait_for(timeout=30_000)  # asks before loading what the file names
    page.get_by_text("Prompt, policy and output").click()
    _inert(page, "inspect", url)

    _open(page, f"{url}/compare?group={quote(HOSTILE_GROUP_ID, safe='')}", "Compare")
    page.locator(".tok").first.wait_for(timeout=60_000)
    _inert(page, "compare", url)

    _open(page, f"{url}/playground", "Playground")
    _inert(page, "playground", url)

    _open(page, f"{url}/audit?audit={quote(HOSTILE_AUDIT_ID, safe='')}", "Audit")
    page.get_by_text("PASS ·").first.wait_for(timeout=60_000)
    page.get_by_text("New audit").click()
    page.get_by_text("Recorded run").first.click()
    page.get_by_role("button", name="Audit this run").wait_for(timeout=30_000)
    _inert(page, "audit", url)

    _open(page, f"{url}/runs", "Runs")
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.wait_for(timeout=30_000)
    select_first_row(page, grid)
    page.get_by_role("button", name="Build report (HTML)").click()
    page.get_by_role("button", name="Download report (HTML)").wait_for(timeout=30_000)
    _inert(page, "runs", url)


def test_hostile_links_and_typed_input_are_shown_literally(setup, page) -> None:
    """The URL's own parameters and typed input reach error boxes: as text, with no link or image."""
    url = setup["url"]
    for name, value in (("image", "![x](http://127.0.0.1:9/q.png)"), ("phishing", "[Session expired – log in](https://127.0.0.1:9/login)")):
        _open(page, f"{url}/?run={quote(value, safe='')}", "Inspect a run")
        page.get_by_text("There is no run").wait_for(timeout=30_000)
        assert page.locator("[data-testid='stAlertContentError'] a, [data-testid='stAlertContentError'] img").count() == 0
        _inert(page, f"url_{name}", url)
    _open(page, f"{url}/?run=1&pos=%C2%B2", "Inspect a run")  # "²".isdigit() is true; int("²") raises
    _inert(page, "url_superscript", url)
    _open(page, url, "Run")
    rule = page.get_by_role("textbox", name="Rule", exact=True)
    rule.fill("![PWNIMG](http://127.0.0.1:9/r.png) **PWNBOLD**")
    rule.press("Enter")
    page.get_by_text("unknown rule").wait_for(timeout=30_000)
    _inert(page, "typed_rule", url)


def test_a_hostile_file_opened_through_the_runs_page(setup, page) -> None:
    """The real sharing flow: upload on the Runs page (opened read-only, checked), then every page."""
    url = setup["url"]
    _open(page, f"{url}/runs", "Runs")
    before = setup["refused"].read_bytes()
    page.locator("input[type=file]").set_input_files(str(setup["refused"]))
    page.get_by_text("not a whole number").first.wait_for(timeout=60_000)  # one line, no traceback
    assert page.locator('[data-testid="stException"]').count() == 0 and setup["refused"].read_bytes() == before
    _inert(page, "import_refused", url)
    page.locator("input[type=file]").set_input_files(str(setup["file"]))
    page.get_by_text("read-only.").first.wait_for(timeout=60_000)
    _inert(page, "import", url)
    for title, heading in (("Inspect", "Inspect a run"), ("Compare", "Compare"), ("Audit", "Audit"), ("Runs", "Runs")):
        page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
        page.get_by_role("heading", name=heading).first.wait_for(timeout=60_000)
        _inert(page, f"import_{title.lower()}", url)


def _sandbox_spawns(setup) -> list[str]:
    """What the server started that runs generated code: bubblewrap, or its helper."""
    lines = setup["spawn_log"].read_text(encoding="utf-8").splitlines()
    return [line for line in lines if "bwrap" in line or "'-I', '-S'" in line]


def test_a_hostile_sweep_runs_nothing(setup, page) -> None:
    """The file's sweep has a HumanEval checker over outputs that hold code which would create a
    marker file, a catastrophic regex, and payloads in its id, prompts, labels and settings. Opened
    as the user's database and through the Runs page's import, the Sweeps page renders it as text,
    with no exception, and starts no process: nothing ran. Only the user's click on "Check the
    answers" runs the code, inside the sandbox (the server's log shows bwrap), and still no marker."""
    from test_sandbox import require_sandbox, sandbox_turn

    url = setup["url"]
    _open(page, f"{url}/sweeps?sweep={quote(HOSTILE_SWEEP_ID, safe='')}", "Sweeps")
    page.get_by_text("Per setting").first.wait_for(timeout=60_000)
    page.get_by_role("button", name="Check the answers").wait_for(timeout=30_000)  # offered, not done
    _inert(page, "sweep", url)
    assert page.locator('[data-testid="stException"]').count() == 0

    _open(page, f"{url}/runs", "Runs")
    page.locator("input[type=file]").set_input_files(str(setup["file"]))
    page.get_by_text("read-only.").first.wait_for(timeout=60_000)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Sweeps", exact=True).click()
    page.get_by_text("Per setting").first.wait_for(timeout=60_000)
    _inert(page, "import_sweep", url)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert not setup["marker"].exists() and _sandbox_spawns(setup) == []

    require_sandbox()
    _open(page, f"{url}/sweeps?sweep={quote(HOSTILE_SWEEP_ID, safe='')}", "Sweeps")
    with sandbox_turn():  # never while test_sandbox counts sandboxed programs in another worker
        page.get_by_role("button", name="Check the answers").click()
        page.get_by_role("button", name="Check the answers").wait_for(state="detached", timeout=60_000)  # checked, then rerun
        settled(page)
    assert _sandbox_spawns(setup), "the click should have run the checker in the sandbox"
    assert not setup["marker"].exists()
    _inert(page, "sweep_checked", url)
