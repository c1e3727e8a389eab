"""Inspect and Compare in a real browser: a click on a token, the jump buttons, the divergence chart,
and a Compare launch with live progress and Stop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from browser_support import ARTIFACTS, chromium, chromium_path, shot, streamlit_server
from tiny_models import save_tiny_model

from diagnostics.models import load_model
from diagnostics.comparison import compare_rules
from diagnostics.runner import RunRequest
from diagnostics.store import Store

# Slow tier: browser walks: streamlit run driven in chromium
pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[dict]:
    chromium_path()
    folder = tmp_path_factory.mktemp("inspect")
    # A larger vocabulary keeps EOS rare, so runs are long enough to stop half-way.
    tiny = save_tiny_model(folder / "tiny", seed=0, vocab=64)
    db = folder / "runs.duckdb"
    store = Store(db)
    target = load_model(tiny)
    for seed in range(20):
        base = {"prompt": "w1 w2 w3 w1 w2", "draft": "ngram:2", "gamma": 3, "max_new_tokens": 30, "seed": seed, "raw": True}
        group_id, results, divergence = compare_rules(store, target, "ngram:2",
                                                      [RunRequest(rule=rule, **base) for rule in ("lossless", "lenience:0.3")])
        lossy = results[1][0]
        records = store.positions(lossy)
        if divergence[lossy] is not None and divergence[lossy] >= 2 and (records["kind"] == "rejected").sum() >= 2:
            break
    with streamlit_server({"SPECLAB_DB": str(db), "SPECLAB_TARGET": tiny}) as url:
        yield {"url": url, "db": db, "group": group_id, "lossy": lossy, "divergence": divergence[lossy], "records": records}


@pytest.fixture(scope="module")
def browser(setup) -> Iterator[object]:
    with chromium() as launched:
        yield launched


def _shot(page, name: str) -> None:
    shot(page, name, pause_ms=500, full_page=True)


def _position_heading(page, position: int) -> float:
    started = time.monotonic()
    page.locator("h3", has_text=f"Position {position}:").wait_for(timeout=30_000)
    return time.monotonic() - started


def test_a_click_on_a_token_and_the_jump_buttons_select_positions(setup, browser) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.goto(f"{setup['url']}/inspect?run={setup['lossy']}")
    page.get_by_role("heading", name="Inspect a run").wait_for(timeout=60_000)
    _position_heading(page, 0)
    page.locator(".js-plotly-plot").nth(1).wait_for(timeout=30_000)
    # The strip: every token is clickable, and a click selects its position.
    page.locator('.tok[data-position="7"]').click()
    clicked = _position_heading(page, 7)
    assert page.locator('.tok-selected[data-position="7"]').count() == 1
    records = setup["records"]
    rejections = [int(p) for p in records.loc[records["kind"] == "rejected", "position"]]
    after = next((p for p in rejections if p > 7), None)
    if after is not None:
        page.get_by_role("button", name="→ next rejection").click()
        _position_heading(page, after)
        page.locator("h3", has_text=f"Position {after}: rejected").wait_for(timeout=10_000)
        # At a rejection the chart marks the drafted and the emitted token.
        chart = page.locator(".js-plotly-plot").last
        chart.locator("text", has_text="emitted").first.wait_for(state="attached", timeout=10_000)
        _shot(page, "inspect_rejection")
        chart.locator("text", has_text="drafted x").first.wait_for(state="attached", timeout=10_000)
    page.get_by_role("button", name="⇥ first divergence").click()
    _position_heading(page, setup["divergence"])
    before = [p for p in rejections if p < setup["divergence"]]
    if before:
        page.get_by_role("button", name="← previous rejection").click()
        _position_heading(page, before[-1])
    _shot(page, "inspect_jumps")
    (ARTIFACTS / "inspect_click_seconds.txt").write_text(f"strip click to heading {clicked:.2f}\n")
    assert clicked < 10
    page.close()


def test_compare_tells_the_divergence_on_one_chart(setup, browser) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(f"{setup['url']}/compare?group={setup['group']}")
    page.get_by_role("heading", name="Compare").wait_for(timeout=60_000)
    page.get_by_role("heading", name="Where and why each rule leaves the reference").wait_for(timeout=60_000)
    page.get_by_text("a(x) of the draft vs the coin u").wait_for(timeout=30_000)
    reason = page.get_by_text("lossless", exact=False).filter(has_text="lenience:0.3").filter(has_text=" u ")
    assert reason.count() >= 1
    assert "None" not in page.locator('[data-testid="stDataFrame"]').first.inner_text()
    _shot(page, "compare_divergence")
    page.close()


def test_compare_launch_shows_progress_and_stop_keeps_the_finished_members(setup, browser) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(f"{setup['url']}/compare")
    page.get_by_role("heading", name="Compare").wait_for(timeout=60_000)
    page.get_by_text("Launch a comparison").click()
    page.get_by_role("textbox", name="Seeds").fill("0-9")
    page.get_by_role("textbox", name="Prompt", exact=True).fill("w1 w2 w3 w1 w2")
    page.get_by_text("Raw prompt (no chat template)").click()
    page.get_by_label("max new tokens").fill("200")
    page.get_by_label("max new tokens").press("Enter")
    page.wait_for_timeout(500)
    page.get_by_role("button", name="Run the coupled group").click()
    page.get_by_text("Running 30 coupled runs").wait_for(timeout=60_000)
    # Per-member progress: the first member's bar counts tokens, its strip fills.
    page.get_by_text("lossless · seed 0:").filter(has_text="tokens").first.wait_for(timeout=60_000)
    page.get_by_text("lenience:0.5 · seed 0:").filter(has_text="tokens").first.wait_for(timeout=120_000)
    _shot(page, "compare_progress")
    page.get_by_role("button", name="Stop").click()
    try:
        page.get_by_text("The group was stopped").wait_for(timeout=60_000)
    except Exception:
        _shot(page, "compare_stop_failed")
        raise
    _shot(page, "compare_stopped")
    groups = Store(setup["db"], read_only=True).list_runs()
    newest = groups.sort_values("created").iloc[-1]["group_id"]
    members = Store(setup["db"], read_only=True).group(newest)
    # The 30 members run as one batch: the stop ends each after its round, keeping what it recorded.
    assert set(members["status"]) <= {"complete", "interrupted"} and "interrupted" in set(members["status"])
    assert len(members) == 30 and int(members["n_tokens"].sum()) > 0
    page.close()
