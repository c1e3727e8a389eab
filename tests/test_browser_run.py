"""Pages at their own paths, the Run page's Stop, and old run links, in a real browser on the tiny model."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from browser_support import chromium, chromium_path, settled, shot, streamlit_server, wait_or_explain
from tiny_models import save_tiny_model

from diagnostics.heads.layout import make_head
from diagnostics.models import load_model
from diagnostics.runner import RunRequest, record_run
from diagnostics.store import Store

# Slow tier: browser walks: streamlit run driven in chromium
pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")
# On the tiny model (seed 0, n-gram drafts, γ 4, lenience:0.5, as the form defaults) no EOS comes
# within 240 tokens: a run long enough (seconds) to be stopped from the page.
BUDGET = 240
DEVICE_TEXT = re.compile(r"Runs on (cpu|cuda:\d+) float32")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[dict]:
    chromium_path()
    folder = tmp_path_factory.mktemp("runpage")
    tiny = save_tiny_model(folder / "tiny", seed=0)
    db = folder / "runs.duckdb"
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(f'{{"id": "p{index}", "prompt": "w{index} w2 w3 w1"}}\n' for index in range(1, 7)), encoding="utf-8")
    store = Store(db)
    run_id, _ = record_run(store, load_model(tiny), "ngram:2",
                           RunRequest(prompt="w1 w2 w3 w1 w2", draft="ngram:2", gamma=3, max_new_tokens=12, seed=2, raw=True))
    medusa = make_head("medusa", load_model(tiny), folder / "medusa")  # as `make-head medusa` writes it
    with streamlit_server({"SPECLAB_DB": str(db), "SPECLAB_TARGET": tiny}) as url:
        yield {"url": url, "db": db, "run": run_id, "prompts": prompts, "medusa": str(medusa)}


@pytest.fixture
def page(setup) -> Iterator[object]:
    with chromium() as browser:
        yield browser.new_page(viewport={"width": 1400, "height": 1400})


def _path_and_query(page) -> tuple[str, dict]:
    parts = urlsplit(page.url)
    return parts.path, {key: values[-1] for key, values in parse_qs(parts.query).items()}


def _shot(page, name: str) -> None:
    shot(page, name, pause_ms=0, full_page=True)


def test_every_page_opens_at_its_own_path_with_material_icons(setup, page) -> None:
    for path, heading in (("/run", "Run"), ("/inspect", "Inspect a run"), ("/compare", "Compare"), ("/sweeps", "Sweeps"),
                          ("/playground", "Playground"), ("/audit", "Audit"), ("/runs", "Runs")):
        page.goto(setup["url"] + path)
        page.get_by_role("heading", name=heading, exact=True).first.wait_for(timeout=60_000)
        page.get_by_text("spec-verify-lab").first.wait_for(timeout=30_000)
        assert page.get_by_text("Page not found").count() == 0, path
        assert _path_and_query(page)[0] == path
    navigation = page.locator('[data-testid="stSidebarNav"]')
    assert navigation.locator("a").count() == 7, navigation.inner_text()
    # Each entry's icon is a Material symbol (a ligature in the bundled icon font), not an emoji
    # that draws as an empty box without an emoji font.
    icons = navigation.locator('[data-testid="stIconMaterial"]')
    assert icons.count() == 7 and icons.all_inner_texts() == ["play_arrow", "search", "compare_arrows", "scatter_plot", "science",
                                                              "verified_user", "table_rows"]
    page.goto(setup["url"] + "/")
    page.get_by_role("textbox", name="Prompt", exact=True).wait_for(timeout=60_000)
    page.wait_for_url(re.compile(r"/run$"), timeout=30_000)


def test_stop_keeps_the_run_and_shows_its_status(setup, page) -> None:
    """Start a run on the page and press Stop while it runs: the page then shows the stored run as
    interrupted, with its token count and an Inspect link. (If the run ends first, no Stop is left.)"""
    page.goto(setup["url"] + "/run")
    page.get_by_role("textbox", name="Prompt", exact=True).fill("w1 w2 w3 w1 w2")
    page.get_by_text("Raw prompt (no chat template)").click()
    page.get_by_label("Draft", exact=True).click()
    page.get_by_role("option", name="ngram").click()
    budget = page.get_by_label("max new tokens")
    budget.fill(str(BUDGET))
    budget.press("Enter")
    page.wait_for_timeout(500)
    page.get_by_role("button", name="Run", exact=True).click()
    stop = page.get_by_role("button", name="Stop", exact=True)
    stop.wait_for(timeout=60_000)
    # Where the run computes, said as it starts (the tiny model loads on CUDA where there is one).
    page.get_by_text(DEVICE_TEXT).first.wait_for(timeout=30_000)
    page.locator(".tok").first.wait_for(timeout=60_000)
    try:
        stop.click(timeout=5_000)
    except playwright_api.TimeoutError:  # the run ended (and its Stop went) between the two steps,
        pass  # or the click landed late under load: the stored status below says which
    link = page.get_by_role("link", name="Inspect run")
    link.wait_for(timeout=60_000)
    # While a rerun renders, the previous run's elements stay on the page (stale) for a moment.
    stop.wait_for(state="detached", timeout=60_000)  # nothing left to stop
    href = link.get_attribute("href")
    assert href.startswith("/inspect?run="), href
    run_id = parse_qs(urlsplit(href).query)["run"][0]
    stored = Store(setup["db"], read_only=True).get_run(run_id)
    assert DEVICE_TEXT.search(f"Runs on {stored['device']}"), stored["device"]
    stopped = stored["status"] == "interrupted"
    _shot(page, "run_stopped" if stopped else "run_completed")
    if stopped:
        banner = page.get_by_text("Last run").inner_text()
        assert "interrupted" in banner and stored["device"] in banner, banner
        kept = int(re.search(rf"(\d+) / {BUDGET} tokens", banner).group(1))
        assert kept == stored["n_tokens"] < BUDGET
    else:
        assert stored["status"] == "complete", stored["status"]
    page.goto(setup["url"] + href)
    # A failure here was seen once under CI's load (not reproduced since): say what the page showed.
    wait_or_explain(page, page.get_by_role("heading", name="Inspect a run"), "Inspect of the stopped run", timeout_ms=60_000)
    if stored["n_tokens"] == 0:
        # Stop landed before the first round ended (seen under load: the token waited for above can be
        # the previous run's, still on the page): the run is kept, marked, and says it has no positions.
        wait_or_explain(page, page.get_by_text("This run recorded no positions."), "the empty stopped run on Inspect",
                        timeout_ms=90_000)
    else:
        wait_or_explain(page, page.get_by_text("Position 0:").first, "position 0 of the stopped run on Inspect",
                        timeout_ms=90_000)
    assert page.get_by_text(f"ran on {stored['device']}").count() >= 1


def test_a_medusa_head_drafts_a_sparse_tree_from_the_page_and_inspect_recomputes_its_q(setup, page) -> None:
    """Run page: Medusa heads written by make-head, a sparse tree as medusa_choices; the run is
    stored with that shape, and Inspect, once the user agrees to load the head's folder, shows the
    round's tree and the head's q recomputed."""
    page.goto(setup["url"] + "/run")
    page.get_by_role("textbox", name="Prompt", exact=True).fill("w1 w2 w3 w1 w2")
    page.get_by_text("Raw prompt (no chat template)").click()
    page.get_by_label("Draft", exact=True).click()
    page.get_by_role("option", name="medusa").click()
    _enter(page, "textbox", "Medusa head (folder or hub id)", setup["medusa"])
    page.get_by_text("tree", exact=True).click()
    _enter(page, "textbox", "Children per level", "[[0],[1],[0,0],[0,0,0]]")
    budget = page.get_by_label("max new tokens")
    budget.fill("16")
    budget.press("Enter")
    page.wait_for_timeout(500)
    page.get_by_role("button", name="Run", exact=True).click()
    link = page.get_by_role("link", name="Inspect run")
    wait_or_explain(page, link, "the Medusa sparse-tree run's Inspect link", timeout_ms=90_000)
    run_id = parse_qs(urlsplit(link.get_attribute("href")).query)["run"][0]
    stored = Store(setup["db"], read_only=True).get_run(run_id)
    assert (stored["status"], stored["tree"], stored["draft"]) == ("complete", "[[0],[1],[0,0],[0,0,0]]", f"medusa:{setup['medusa']}")
    page.goto(setup["url"] + f"/inspect?run={run_id}&pos=3")
    load = page.get_by_role("button", name=re.compile(r"^Load .*medusa.* \(local files only\)"))
    wait_or_explain(page, load, "the button that loads the head's folder", timeout_ms=60_000)
    load.click()
    wait_or_explain(page, load, "the head loaded (its Load button gone)", timeout_ms=60_000, state="detached")
    wait_or_explain(page, page.get_by_text("Position 3:").first, "Inspect at position 3 after loading the head", timeout_ms=60_000)
    page.wait_for_timeout(500)
    _shot(page, "inspect_medusa_sparse_tree")
    text = page.locator("[data-testid='stMain']").first.inner_text()
    assert "tree [[0],[1],[0,0],[0,0,0]]" in text, text[:800]
    assert "not loaded" not in text and "Traceback" not in text and "unavailable" not in text.lower(), text[:1500]


def test_an_old_run_link_opens_inspect_and_run_drops_the_run(setup, page) -> None:
    """/?run=ID&pos=N (reports and files already shared) opens Inspect on that run and position at
    /inspect?run=ID&pos=N; Run in the sidebar then leaves ?run= behind, so a reload stays on Run."""
    page.goto(f"{setup['url']}/?run={setup['run']}&pos=3")
    page.get_by_role("heading", name="Inspect a run").wait_for(timeout=60_000)
    page.get_by_text("Position 3:").first.wait_for(timeout=60_000)
    assert _path_and_query(page) == ("/inspect", {"run": setup["run"], "pos": "3"})
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Run", exact=True).click()
    page.get_by_role("textbox", name="Prompt", exact=True).wait_for(timeout=60_000)
    assert _path_and_query(page) == ("/run", {})
    page.reload()
    page.get_by_role("textbox", name="Prompt", exact=True).wait_for(timeout=60_000)
    assert page.get_by_role("heading", name="Inspect a run").count() == 0


def _enter(page, role: str, label: str, value: str) -> None:
    """Type into a widget once the page has settled: while a rerun replaces a widget, its old and
    new copies can both be on the page for a moment (seen under load in CI)."""
    box = page.get_by_role(role, name=label, exact=True)
    for _ in range(300):
        if box.count() == 1:
            break
        page.wait_for_timeout(100)
    box.fill(value)
    box.press("Enter")
    page.wait_for_timeout(300)


def test_a_sweep_launched_on_the_page_stops_and_resumes(setup, page) -> None:
    """Launch a sweep from the Sweeps page, watch its progress, Stop it: the sweep is kept
    interrupted with its finished units; Resume runs the rest and the figures appear."""
    page.goto(setup["url"] + "/sweeps")
    page.get_by_role("heading", name="Sweeps", exact=True).wait_for(timeout=60_000)
    page.get_by_role("combobox", name="Prompt set").click()
    page.get_by_role("option", name="a JSONL file").click()
    _enter(page, "textbox", "JSONL file (a path on this machine)", str(setup["prompts"]))
    _enter(page, "textbox", "Rules (ranges LOW..HIGH:COUNT allowed)", "lenience:0.5")
    for label, value in (("Prompts (the first N; 0 = all)", "0"), ("Seeds per prompt", "4"), ("max new tokens", "16")):
        _enter(page, "spinbutton", label, value)
    page.get_by_text("Raw prompt (no chat template)").click()
    page.get_by_text("24 units (prompt × seed) × 2 coupled runs").wait_for(timeout=60_000)
    page.get_by_role("button", name="Run the sweep").click()
    stop = page.get_by_role("button", name="Stop", exact=True)
    stop.wait_for(timeout=60_000)
    page.get_by_text(re.compile(r"^[1-9]\d* / 24 units$")).wait_for(timeout=120_000)
    stop.click()
    warning = page.get_by_text(re.compile(r"This sweep is interrupted with \d+ of 24 units"))
    wait_or_explain(page, warning, "the interrupted sweep's warning")
    wait_or_explain(page, stop, "Stop gone after the stop", state="detached")
    settled(page, 120_000)
    wait_or_explain(page, page.get_by_text("Per setting (95% intervals over prompts and seeds)"), "the figures after the stop")
    page.wait_for_timeout(1000)  # the page's rerun after Stop has finished: a click now starts a new run
    _shot(page, "sweep_stopped")
    store = Store(setup["db"], read_only=True)
    sweep = store.list_sweeps().iloc[0]
    assert sweep["status"] == "interrupted" and 1 <= sweep["units_done"] < 24
    assert set(store.list_runs()["status"]) <= {"complete", "interrupted"}  # nothing left running
    del store
    page.get_by_role("button", name="Resume", exact=True).click()
    stop.wait_for(timeout=60_000)
    wait_or_explain(page, stop, "Stop gone after the resumed sweep", timeout_ms=300_000, state="detached")
    settled(page, 120_000)  # the figures' heading of the run before the resume stays, stale, until this run ends
    wait_or_explain(page, page.get_by_text("Per setting (95% intervals over prompts and seeds)"), "the figures after the resume")
    wait_or_explain(page, page.get_by_text("This sweep is interrupted"), "the warning gone after the resume", state="detached")
    assert page.get_by_role("button", name="Resume", exact=True).count() == 0
    assert Store(setup["db"], read_only=True).get_sweep(sweep["sweep_id"])["status"] == "complete"
    _shot(page, "sweep_resumed")
