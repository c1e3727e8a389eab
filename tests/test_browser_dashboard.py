"""The dashboard in a real browser: run, inspect, compare, report offline, untrusted text inert."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import ARTIFACTS, chromium, chromium_path, select_first_row, settled, shot, streamlit_server
from tiny_models import save_tiny_model

from diagnostics.engine import PositionRecord
from diagnostics.models import load_model
from diagnostics.comparison import compare_rules
from diagnostics.runner import RunRequest
from diagnostics.store import Store

# Slow tier: browser walks: streamlit run driven in chromium
pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")
SCRIPT_PROMPT = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\"> w1 w2 w3"


def _long_run(store: Store, positions: int = 2000) -> str:
    """A synthetic run of ``positions`` positions (the page's load, not the model, is what is timed)."""
    rng = random.Random(0)
    run_id = store.start_run({"prompt": "long", "rule": "lenience:0.5", "target": "synthetic/model", "draft": "ngram:3",
                              "gamma": 4, "seed": 0, "max_new_tokens": positions, "policy": "{}", "draft_policy": "{}",
                              "prompt_ids": [1], "tokens": [rng.randrange(50) for _ in range(positions)]})
    records = []
    for position in range(positions):
        kind = rng.choice(["accepted", "accepted", "rejected", "bonus"])
        drafted = kind != "bonus"
        records.append(PositionRecord(
            position=position, block=position // 3, index_in_block=position % 3, kind=kind, token=rng.randrange(50),
            draft_token=rng.randrange(50) if drafted else None, p_token=rng.random(), p_draft=rng.random() if drafted else None,
            q_draft=rng.random() if drafted else None, accept_prob=rng.random() if drafted else None,
            u_draft=rng.random() if drafted else None, u_accept=rng.random() if drafted else None, u_fallback=rng.random(),
            alpha=rng.random() if drafted else None, tv_pq=rng.random() if drafted else None, entropy_p=rng.random() * 3,
            tv_target=rng.random() * 0.2, tv_baseline=rng.random() * 0.2, p_top_ids=list(range(20)),
            p_top_probs=[0.04] * 20, p_tail=0.2, q_top_ids=list(range(20)) if drafted else [],
            q_top_probs=[0.04] * 20 if drafted else [], q_tail=0.2 if drafted else None, token_text=f" tok{position}",
        ))
    store.add_positions(run_id, records)
    store.finish_run(run_id, "complete", {"n_tokens": positions, "acceptance_rate": 0.5, "block_efficiency": 2.0})
    return run_id


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[dict]:
    chromium_path()
    folder = tmp_path_factory.mktemp("dash")
    tiny = save_tiny_model(folder / "tiny", seed=0)
    db = folder / "runs.duckdb"
    store = Store(db)
    target = load_model(tiny)
    group_id = divergence = None
    for seed in range(10):
        base = {"prompt": "w1 w2 w3 w1 w2", "draft": "ngram:2", "gamma": 3, "max_new_tokens": 20, "seed": seed, "raw": True}
        group_id, results, divergence = compare_rules(store, target, "ngram:2", [RunRequest(rule=r, **base) for r in ("lossless", "cascade:0.9")])
        if divergence[results[1][0]] is not None:
            break
    short_id = _long_run(store, positions=40)  # before the long run, which stays the newest (the Runs grid's first row)
    long_id = _long_run(store)
    with streamlit_server({"SPECLAB_DB": str(db), "SPECLAB_TARGET": tiny}) as url:
        yield {"url": url, "db": db, "tiny": tiny, "group": group_id, "lossy": results[1][0], "divergence": divergence[results[1][0]], "long": long_id,
               "short": short_id}


@pytest.fixture(scope="module")
def browser(setup) -> Iterator[object]:
    with chromium() as launched:
        yield launched


def _shot(page, name: str) -> None:
    shot(page, name)


def test_a_direct_link_to_a_page_shows_the_app_navigation(setup, browser) -> None:
    """First session on a fresh server, opened on /runs: the app's navigation and sidebar, not a
    raw file list (a folder named ``pages/`` beside app.py would turn on Streamlit's legacy mode)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{setup['url']}/runs")
    page.get_by_role("heading", name="Runs").wait_for(timeout=60_000)
    page.get_by_text("spec-verify-lab").first.wait_for(timeout=30_000)
    navigation = page.locator('[data-testid="stSidebarNav"]').inner_text()
    assert "Audit" in navigation and "Playground" in navigation and "common" not in navigation, navigation
    page.close()


def test_run_page_streams_tokens_and_keeps_script_inert(setup, browser) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(setup["url"])
    page.get_by_role("heading", name="Run").first.wait_for(timeout=30_000)
    page.get_by_role("textbox", name="Prompt", exact=True).fill(SCRIPT_PROMPT)
    page.get_by_text("Raw prompt (no chat template)").click()
    page.get_by_label("Draft", exact=True).click()
    page.get_by_role("option", name="ngram").click()
    page.get_by_role("button", name="Run", exact=True).click()
    page.locator(".tok").first.wait_for(timeout=60_000)
    page.get_by_text("Inspect run").wait_for(timeout=60_000)
    assert page.locator(".tok").count() >= 1
    assert page.evaluate("window.__pwned") is None
    _shot(page, "run")
    link = page.get_by_role("link", name="Inspect run").get_attribute("href")
    assert link.startswith("/inspect?run=")
    page.goto(setup["url"] + link)
    page.get_by_role("heading", name="Inspect a run").wait_for(timeout=30_000)
    page.get_by_text("Prompt, policy and output").click()
    page.get_by_text("<script>window.__pwned = 1</script>", exact=False).first.wait_for(timeout=30_000)
    assert page.evaluate("window.__pwned") is None
    page.close()


def test_inspect_click_a_position(setup, browser) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.goto(f"{setup['url']}/inspect?run={setup['lossy']}")
    page.get_by_role("heading", name="Inspect a run").wait_for(timeout=30_000)
    page.get_by_text("Position 0:").wait_for(timeout=30_000)
    settled(page)  # under load the chart is drawn again after the first paint: a point read before has no box
    points = page.locator(".js-plotly-plot").first.locator(".scatterlayer .trace").first.locator("path.point")
    points.first.wait_for(timeout=30_000)
    point = points.nth(min(5, points.count() - 1))
    point.wait_for(timeout=30_000)
    box = point.bounding_box()
    assert box is not None, "the chart's point has no box: not drawn"
    # Plotly listens on its drag layer, not on the marker: click where the marker is drawn.
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.locator("h3", has_text="Position ").filter(has_not_text="Position 0:").wait_for(timeout=30_000)
    assert page.locator(".js-plotly-plot").count() == 2
    _shot(page, "inspect")
    page.close()


def test_compare_marks_the_divergence(setup, browser) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(f"{setup['url']}/compare?group={setup['group']}")
    page.get_by_role("heading", name="Compare").wait_for(timeout=30_000)
    page.locator(".tok").first.wait_for(timeout=30_000)
    if setup["divergence"] is not None:
        marked = page.locator(f'.tok-diverge[data-position="{setup["divergence"]}"]')
        assert marked.count() >= 1
        page.get_by_text(f"leaves the reference at position {setup['divergence']}").wait_for(timeout=10_000)
    _shot(page, "compare")
    page.close()


def test_download_report_and_open_it_offline(setup, browser, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1200}, accept_downloads=True)
    page.goto(f"{setup['url']}/runs")
    page.get_by_role("heading", name="Runs").wait_for(timeout=30_000)
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.wait_for(timeout=30_000)
    _shot(page, "runs")
    select_first_row(page, grid)
    page.get_by_role("button", name="Build report (HTML)").click()  # built on request, not on selection
    page.get_by_role("button", name="Download report (HTML)").wait_for(timeout=30_000)
    with page.expect_download() as download:
        page.get_by_role("button", name="Download report (HTML)").click()
    report = tmp_path / "report.html"
    download.value.save_as(report)
    offline = browser.new_page()
    requests: list[str] = []
    offline.on("request", lambda request: requests.append(request.url))
    offline.goto(report.as_uri())
    offline.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
    assert all(url.startswith(("file:", "data:", "blob:")) for url in requests), requests
    assert offline.evaluate("window.__pwned") is None
    offline.close()
    page.close()


def _time_inspect(page, url: str) -> float:
    started = time.monotonic()
    page.goto(url)
    page.locator(".js-plotly-plot").nth(1).wait_for(timeout=60_000)
    page.locator('input[aria-label="Position"]').wait_for(timeout=60_000)
    page.locator(".token-strip .tok").first.wait_for(timeout=60_000)  # the clickable strip renders on its own
    return time.monotonic() - started


def test_long_run_inspect_is_interactive_quickly(setup, browser) -> None:
    """Time from navigation to the tracks, the position chart, the position box and the token strip of a 2,000-position run.

    "cold": a fresh tab whose first page is this one (the browser also loads Plotly's bundle);
    "warm": the same tab after another page with a chart. The warm time is compared with a
    40-position run's, timed the same way in the same tab and run: a run 50 times longer may cost
    at most 2.5 times as much (the strip is a window, the tracks one line; measured 1.6 times), on
    any machine. Absolute times depend on the machine (warm 4.1 s against 2.5 s on a 2-core box
    that decodes 2.8 times slower than the one the README's speeds come from) and go to the artifacts.
    """
    url = f"{setup['url']}/inspect?run={setup['long']}"
    cold_page = browser.new_page(viewport={"width": 1400, "height": 1200})
    cold = _time_inspect(cold_page, url)
    cold_page.close()
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    warm_short, warm = [], []
    for _ in range(2):  # alternate, so that a load spike hits both alike; keep the best of each
        page.goto(setup["url"] + "/playground")
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        warm_short.append(_time_inspect(page, f"{setup['url']}/inspect?run={setup['short']}"))
        page.goto(setup["url"] + "/playground")
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        warm.append(_time_inspect(page, url))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "inspect_2000_seconds.txt").write_text(f"cold {cold:.2f}\nwarm {min(warm):.2f}\nwarm, 40 positions {min(warm_short):.2f}\n")
    assert page.locator(".token-strip .tok").count() == 400  # a window around the selected position
    assert min(warm) < 2.5 * min(warm_short), f"2,000 positions: warm {min(warm):.2f} s; 40 positions: {min(warm_short):.2f} s; cold {cold:.2f} s"
    page.close()


def test_audit_page_runs_an_engine_audit_and_shows_stored_evidence(setup, browser) -> None:
    """Audit page: a stored planted-bug audit (with hostile label text) shows its evidence inertly;
    an engine-level audit of our engine run from the page passes and is stored."""
    from diagnostics.audit import audit_rule, battery
    from diagnostics.audit.mutants import RULE_MUTANTS
    from diagnostics.audit.reporting import summary_line

    pairs = battery(seed=1)
    pairs[0] = (SCRIPT_PROMPT, pairs[0][1], pairs[0][2])
    planted = audit_rule(RULE_MUTANTS["residual_softmax"][1], pairs, n=20_000, implementation="planted:residual_softmax").as_dict()
    audit_id = Store(setup["db"]).add_audit(planted, summary_line(planted))
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    page.goto(f"{setup['url']}/audit?audit={audit_id}")
    page.get_by_role("heading", name="Audit").first.wait_for(timeout=30_000)
    page.get_by_text(re.compile(r"FAIL · Rule-level audit of\s*planted:residual_softmax")).first.wait_for(timeout=30_000)
    page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
    assert page.evaluate("window.__pwned") is None
    page.get_by_text("New audit").click()
    page.get_by_text("Engine level").first.click()
    button = page.get_by_role("button", name="Run the engine-level audit")
    button.wait_for(timeout=30_000)
    settled(page)
    button.click()
    verdict = page.get_by_text(re.compile(r"(PASS|FAIL) · Engine-level audit of\s*ours")).first
    try:
        verdict.wait_for(timeout=120_000)
    except Exception:
        _shot(page, "audit_failed")
        raise AssertionError("no engine-audit verdict in 120 s; the page says: " + page.locator("body").inner_text()[-1500:]) from None
    assert re.search(r"PASS · Engine-level audit of\s*ours", verdict.inner_text()), verdict.inner_text()
    page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
    assert page.evaluate("window.__pwned") is None
    _shot(page, "audit")
    page.close()
    assert Store(setup["db"], read_only=True).list_audits()["layer"].tolist()[:2] == ["engine", "rule"]


def test_audit_page_audits_an_uploaded_file_of_generations(setup, browser, tmp_path) -> None:
    """External engine: upload a JSONL of generations (its prompt is hostile text), audit it against
    the target here; the verdict, the PIT chart and the worst-prompts table show, all inert."""
    from diagnostics.audit.samples import Sample, write_samples
    from diagnostics.engine import generate_batch

    target = load_model(setup["tiny"])
    prompt_ids = list(target.tokenizer(SCRIPT_PROMPT)["input_ids"])
    seeds = list(range(400))
    runs = generate_batch(target, "ngram:2", [prompt_ids] * len(seeds), "lossless", seeds, max_new_tokens=10, record=False)
    path = write_samples(tmp_path / "engine.jsonl", [
        Sample(prompt=SCRIPT_PROMPT, prompt_ids=prompt_ids, token_ids=run.tokens, temperature=1.0, engine="<b>an engine</b>")
        for run in runs])
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    page.goto(f"{setup['url']}/audit")
    page.get_by_role("heading", name="Audit").first.wait_for(timeout=30_000)
    page.get_by_text("New audit").wait_for(timeout=30_000)
    settled(page)
    if not page.get_by_text("External engine").first.is_visible():  # the form starts open when there is no audit yet
        page.get_by_text("New audit").click()
    page.get_by_text("External engine").first.click()
    chooser = page.locator('[data-testid="stFileUploader"] input[type="file"]').first
    chooser.wait_for(state="attached", timeout=30_000)
    chooser.set_input_files(str(path))
    page.get_by_text(re.compile(r"400 generations, [\d,]+ tokens")).wait_for(timeout=60_000)
    settled(page)
    started = time.monotonic()
    page.get_by_role("button", name="Audit the generations").click()
    verdict = page.get_by_text(re.compile(r"(PASS|FAIL|INCONCLUSIVE) · External engine")).first
    verdict.wait_for(timeout=120_000)
    seconds = time.monotonic() - started
    assert "FAIL" not in verdict.inner_text(), verdict.inner_text()
    page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
    page.get_by_text("Worst prompts").wait_for(timeout=30_000)
    assert page.evaluate("window.__pwned") is None
    _shot(page, "audit_external")
    (ARTIFACTS / "audit_external_seconds.txt").write_text(f"{seconds:.1f}\n")
    page.close()
    stored = Store(setup["db"], read_only=True).list_audits()
    assert stored["layer"].tolist()[0] == "external"
