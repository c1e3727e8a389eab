"""Retake the README screenshots from real runs of the embedded model in headless chromium.

Run: ``python docs/take_screenshots.py [--tree | --sweep DB]`` (needs Debian's chromium); ``--tree``
retakes only ``docs/inspect_tree.png`` (Inspect on a tree run); ``--sweep DB`` only
``docs/sweep_pareto.png``, from a copy of a database holding a sweep of the embedded model (the
README's sweep command), then launches, stops and resumes a small sweep on the page. It records, in a temporary
database, a coupled group on the embedded SmolLM2-135M (lossless, lenience:0.5, typical:0.1;
the first seed whose lenience run leaves the lossless one), a recorded-run audit of the lenience
run, then starts the dashboard on that database, drives every page, prints how long each took
and writes ``docs/*.png``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PROMPT = "Write a short poem about the sea at night."


def _record(db: Path) -> dict:
    from diagnostics.audit import audit_recorded_run
    from diagnostics.audit.reporting import summary_line
    from diagnostics.drafts import load_draft
    from diagnostics.models import load_model
    from diagnostics.comparison import compare_rules
    from diagnostics.runner import RunRequest
    from diagnostics.store import Store

    store = Store(db)
    target = load_model("default")
    draft = load_draft("early-exit:26", target)
    for seed in range(8):
        base = {"prompt": PROMPT, "draft": "early-exit:26", "gamma": 4, "max_new_tokens": 64, "seed": seed}
        group, results, divergence = compare_rules(store, target, draft, [RunRequest(rule=rule, **base)
                                                                          for rule in ("lossless", "lenience:0.5", "typical:0.1")])
        lossy = results[1][0]
        if divergence[lossy] is not None and 3 <= divergence[lossy] < 48:
            break
    audit = audit_recorded_run(store, lossy, target=target).as_dict()
    audit_id = store.add_audit(audit, summary_line(audit))
    print(f"group {group}: lenience:0.5 leaves lossless at {divergence[lossy]} (seed {seed}); audit {audit_id}", flush=True)
    return {"group": group, "lossy": lossy, "divergence": divergence[lossy], "audit": audit_id}


def _record_tree(db: Path) -> dict:
    """A lenience:0.5 tree run (3,2,1, top-k children, early-exit:26) on the embedded model, and a
    position where every candidate was refused (else one where a later candidate was kept)."""
    from diagnostics.drafts import load_draft
    from diagnostics.models import load_model
    from diagnostics.runner import RunRequest, record_run
    from diagnostics.store import Store

    store = Store(db)
    target = load_model("default")
    draft = load_draft("early-exit:26", target)
    request = RunRequest(prompt=PROMPT, rule="lenience:0.5", draft="early-exit:26", tree="3,2,1", max_new_tokens=48, seed=1)
    run_id, run = record_run(store, target, draft, request)
    nodes = store.tree_nodes(run_id)
    later_kept = nodes[(nodes["decision"] == "accepted") & (nodes["sibling"] > 0)]
    rejected = [record.position for record in run.records if record.kind == "rejected"]
    if rejected:
        position = rejected[0]
    elif not later_kept.empty:
        block = int(later_kept.iloc[0]["block"])
        position = next(record.position for record in run.records if record.block == block and record.kind == "accepted")
    else:
        position = 0
    print(f"tree run {run_id}: {len(run.tokens)} tokens in {run.blocks} rounds; position {position}", flush=True)
    return {"run": run_id, "position": position}


def tree_screenshot() -> int:
    """``docs/inspect_tree.png``: Inspect on a tree run of the embedded model, at a position whose
    candidates were tried in turn, with the round's tree below."""
    from browser_support import CHROMIUM_ARGS, chromium_path, streamlit_server
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="screens-"))
    db = folder / "runs.duckdb"
    made = _record_tree(db)
    with streamlit_server({"SPECLAB_DB": str(db)}) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1500})
        started = time.monotonic()
        page.goto(f"{url}/inspect?run={made['run']}&pos={made['position']}")
        page.locator("h3", has_text=f"Position {made['position']}:").wait_for(timeout=180_000)
        page.get_by_text("This round's tree").first.wait_for(timeout=60_000)
        print(f"first open of the tree run on Inspect: {time.monotonic() - started:.1f} s", flush=True)
        page.set_viewport_size({"width": 1400, "height": 2900})
        page.wait_for_timeout(2000)
        page.locator("h3", has_text=f"Position {made['position']}:").scroll_into_view_if_needed()
        page.wait_for_timeout(800)
        page.screenshot(path=str(ROOT / "docs" / "inspect_tree.png"))
        other = made["position"] + 1
        started = time.monotonic()
        page.locator(f'.tok[data-position="{other}"]').click()
        page.locator("h3", has_text=f"Position {other}:").wait_for(timeout=30_000)
        print(f"a click on the next token to its charts: {time.monotonic() - started:.1f} s", flush=True)
        browser.close()
    return 0


def sweep_screenshot(source: Path) -> int:
    """``docs/sweep_pareto.png``: the Sweeps page on a stored sweep of the embedded model (a copy of
    ``source``), with every click timed; then a small sweep launched from the page, stopped and
    resumed, timed too."""
    import re
    import shutil

    from browser_support import CHROMIUM_ARGS, chromium_path, streamlit_server
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="screens-"))
    db = folder / "sweep.duckdb"
    shutil.copy(source, db)

    def timed(what: str, started: float) -> None:
        print(f"{what}: {time.monotonic() - started:.1f} s", flush=True)

    with streamlit_server({"SPECLAB_DB": str(db)}) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1900})
        started = time.monotonic()
        page.goto(f"{url}/sweeps")
        page.locator(".js-plotly-plot").first.wait_for(timeout=180_000)
        page.get_by_text("Per setting (95% intervals over prompts and seeds)").wait_for(timeout=60_000)
        timed("first open of the Sweeps page (chart and table)", started)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(ROOT / "docs" / "sweep_pareto.png"))
        started = time.monotonic()
        page.get_by_text("path KL", exact=True).first.click()
        page.wait_for_timeout(300)
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        timed("switch the quality axis to path KL", started)
        started = time.monotonic()
        setting = page.get_by_role("combobox", name="Setting")
        setting.click()
        setting.fill("lenience:0.6")
        setting.press("Enter")
        page.get_by_text(re.compile(r"^unit 0 · prompt")).first.wait_for(timeout=60_000)
        timed("pick a setting to list its runs", started)
        started = time.monotonic()
        page.get_by_role("link", name="inspect").first.click()
        page.get_by_text("Position 0:").first.wait_for(timeout=180_000)
        timed("a run's Inspect link to its first position", started)
        # Launch a small sweep on the page (the form's defaults: the embedded model, early-exit:26).
        page.goto(f"{url}/sweeps")
        page.get_by_text("Launch a sweep").click()
        for label, value in (("Prompts (the first N; 0 = all)", "2"), ("Seeds per prompt", "2"), ("max new tokens", "12")):
            box = page.get_by_label(label)
            box.fill(value)
            box.press("Enter")
        rules = page.get_by_role("textbox", name="Rules (ranges LOW..HIGH:COUNT allowed)")
        rules.fill("lenience:0.5, cascade:0.3")
        rules.press("Enter")
        page.get_by_text("4 units (prompt × seed) × 4 coupled runs").wait_for(timeout=60_000)
        started = time.monotonic()
        page.get_by_role("button", name="Run the sweep").click()
        page.locator(".tok").first.wait_for(timeout=180_000)
        timed("Run the sweep to the first token on the page (loads the model)", started)
        page.get_by_text(re.compile(r"^1 / 4 units$")).wait_for(timeout=300_000)
        timed("… to the first unit done", started)
        stop = page.get_by_role("button", name="Stop", exact=True)
        started = time.monotonic()
        stop.click()
        page.get_by_text(re.compile(r"This sweep is interrupted with \d+ of 4 units")).wait_for(timeout=60_000)
        stop.wait_for(state="detached", timeout=60_000)
        timed("Stop to the interrupted sweep shown", started)
        page.wait_for_timeout(1000)
        started = time.monotonic()
        page.get_by_role("button", name="Resume", exact=True).click()
        stop.wait_for(timeout=60_000)
        stop.wait_for(state="detached", timeout=600_000)
        page.get_by_text("This sweep is interrupted").wait_for(state="detached", timeout=60_000)
        timed("Resume to the completed sweep", started)
        page.screenshot(path=str(folder / "sweep_launched.png"), full_page=True)
        print(f"screens in {folder}", flush=True)
        browser.close()
    return 0


def main() -> int:
    from browser_support import CHROMIUM_ARGS, chromium_path, streamlit_server
    from playwright.sync_api import sync_playwright

    if "--tree" in sys.argv[1:]:
        return tree_screenshot()
    if "--sweep" in sys.argv[1:]:
        return sweep_screenshot(Path(sys.argv[sys.argv.index("--sweep") + 1]))
    folder = Path(tempfile.mkdtemp(prefix="screens-"))
    db = folder / "runs.duckdb"
    made = _record(db)
    docs = ROOT / "docs"
    with streamlit_server({"SPECLAB_DB": str(db)}) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1500})

        def timed(what: str, action) -> None:
            started = time.monotonic()
            action()
            print(f"{what}: {time.monotonic() - started:.1f} s", flush=True)

        page.goto(f"{url}/run")
        page.get_by_role("heading", name="Run").first.wait_for(timeout=60_000)
        page.get_by_role("textbox", name="Prompt", exact=True).fill(PROMPT)
        page.get_by_role("button", name="Run", exact=True).click()
        timed("first Run on a fresh server (model load + 64 tokens)",
              lambda: page.get_by_text("Inspect run").wait_for(timeout=300_000))
        page.wait_for_timeout(800)
        page.screenshot(path=str(docs / "run.png"))

        timed("first open of the lenience run on Inspect (exact laws of every position)",
              lambda: (page.goto(f"{url}/inspect?run={made['lossy']}&pos={made['divergence']}"),
                       page.locator("h3", has_text=f"Position {made['divergence']}:").wait_for(timeout=120_000),
                       page.locator(".js-plotly-plot").nth(1).wait_for(timeout=60_000)))
        page.wait_for_timeout(1500)
        # Streamlit scrolls inside its own container: a tall viewport shows the whole page.
        page.set_viewport_size({"width": 1400, "height": 2500})
        page.wait_for_timeout(1500)
        page.screenshot(path=str(docs / "inspect.png"))
        target = made["divergence"] + 1
        page.locator(f'.tok[data-position="{target}"]').click()
        timed("a click on a token to its charts", lambda: page.locator("h3", has_text=f"Position {target}:").wait_for(timeout=30_000))

        timed("Compare with the divergence chart",
              lambda: (page.goto(f"{url}/compare?group={made['group']}"),
                       page.get_by_text("a(x) of the draft vs the coin u").first.wait_for(timeout=120_000)))
        page.wait_for_timeout(1500)
        page.screenshot(path=str(docs / "compare.png"))
        page.set_viewport_size({"width": 1400, "height": 1500})

        page.goto(f"{url}/audit?audit={made['audit']}")
        page.get_by_role("heading", name="Audit").first.wait_for(timeout=60_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=str(docs / "audit.png"))

        page.goto(f"{url}/runs")
        page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(docs / "runs.png"))

        page.goto(f"{url}/playground")
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(docs / "playground.png"))
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
