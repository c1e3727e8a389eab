"""The Audit page's table of verdicts on real engines (``docs/verdicts.json``, written by
``python -m diagnostics verdicts``), each row linked to its stored audits where this database
holds them. The file may come from elsewhere (``--import``): it is validated, and every cell is
shown as data, never as Markdown."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import streamlit as st

from diagnostics.engine import eos_ids
from diagnostics.models import DEFAULT_TARGET, EMBEDDED_NAME, ModelError
from diagnostics.store import Store
from diagnostics.verdicts.render import display_rows, glance_html, glance_rows, policy_text
from diagnostics.verdicts.table import evidence_unchanged, load_table, reaudit_side
from views.common import cached_model, plain, show_error

TABLE = Path(__file__).resolve().parents[1] / "docs" / "verdicts.json"


def verdict_table(store: Store, save: Callable[[dict], None]) -> None:
    """The table (``$SPECLAB_VERDICTS``, else the project's ``docs/verdicts.json``) with a link to
    each side's stored audit (``?audit=ID``) when this database has it, and a form that audits a
    row's committed evidence again here (``save`` stores and selects the result)."""
    path = Path(os.environ.get("SPECLAB_VERDICTS") or TABLE)
    st.subheader("Verdicts on real engines")
    try:
        table = load_table(path)
    except (OSError, ValueError) as error:
        show_error(error)
        return
    if not table["rows"]:
        st.info("No verdicts yet: `python -m diagnostics verdicts` runs the table (each engine with speculation on and off).")
        return
    glance = glance_rows(table)
    st.html(glance_html(table))  # every cell escaped by glance_html: the table file may come from elsewhere
    st.caption("One row per engine mode, its policies side by side, each verdict coloured: green pass, red fail, amber "
               "inconclusive, purple engine error, grey speculation inactive (the engine's own counters say it drafted or kept "
               "nothing), orange control failed (speculation off already failed: the settings did not match). Each engine "
               "generates from the embedded model with speculation on and, as its control, off, under the same sampling "
               "settings; both are audited against the target's law (the external audit).")
    findings = {row.finding.slug: row.finding for row in glance if row.finding is not None}
    for finding in findings.values():
        with st.expander(f"Finding: {finding.title}"):  # literal-ok: our own finding title (findings.FINDINGS)
            st.markdown(finding.page.read_text(encoding="utf-8"))  # literal-ok: our own committed page, not the table's text
    audits = store.list_audits()
    stored = set(audits["audit_id"]) if not audits.empty else set()
    shown = pd.DataFrame(display_rows(table))
    for side in ("on", "off"):
        shown[f"audit ({side})"] = [f"/audit?audit={quote(str(row[side].get('audit_id')))}" if row[side].get("audit_id") in stored else None
                                    for row in table["rows"]]
    with st.expander("Every row in detail: p-values, sample sizes, distortion, controls, evidence, audits"):
        st.dataframe(shown, hide_index=True, key="verdict_table", width="stretch", column_config={
            # wide enough for "fail · disagrees with the row run here (pass)" on an imported row
            "verdict": st.column_config.TextColumn("verdict", width="large"),
            "audit (on)": st.column_config.LinkColumn("audit (on)", display_text=r"audit=(.*)$"),
            "audit (off)": st.column_config.LinkColumn("audit (off)", display_text=r"audit=(.*)$")})
        st.caption("'detects TV ≥': the smallest distortion the sample finds at 90% power. Evidence: the generations file "
                   "(in docs/verdicts) and its sha256; the audit links open the stored audits where this database holds them.")
    reaudit_form(table, path.with_suffix(""), save)


def _checkable(row: dict, folder: Path) -> bool:
    """A row whose evidence is here, unchanged, and was audited against the embedded target."""
    return row.get("provenance") == "run here" and row.get("target") == EMBEDDED_NAME and evidence_unchanged(row, folder)


def reaudit_form(table: dict, folder: Path, save: Callable[[dict], None]) -> None:
    """Audit one side of a row again from its committed generations file (sha256 checked), against
    the embedded target: a fresh clone reproduces a verdict without running the engine."""
    rows = [row for row in table["rows"] if _checkable(row, folder)]
    if not rows:
        st.caption("No row's evidence files are here unchanged (they live beside the table, in "
                   "docs/verdicts/), so none can be audited again on this page.")
        return
    with st.expander("Audit a verdict's evidence again here"):
        st.caption("The same generations file (its sha256 checked against the table), the same test and sample size, "
                   "against the embedded target on this machine: the verdict and p-value come out as the table's. "
                   "One to three minutes for 10,000 tokens on a 2-core CPU.")
        left, right = st.columns([3, 1])
        index = left.selectbox("Row", range(len(rows)), key="verdict_reaudit_row",
                               format_func=lambda i: plain(f"{rows[i]['label']} · {policy_text(rows[i]['settings'])} · "
                                                           f"{rows[i]['verdict']}"))
        side = right.radio("Side", ["on", "off"], horizontal=True, key="verdict_reaudit_side",
                           format_func={"on": "speculation on", "off": "off (control)"}.get)
        if not st.button("Audit this evidence again", key="verdict_reaudit_go"):
            return
        try:
            target = cached_model(DEFAULT_TARGET)
            bar = st.progress(0.0, text="Teacher forcing…")
            result = reaudit_side(rows[index], side, folder, target, eos_ids(target, None),
                                  progress=lambda done, total: bar.progress(done / total, text=f"Teacher forcing {int(done)}/{int(total)}"))  # literal-ok: counts
            bar.empty()
        except (ModelError, OSError, ValueError) as error:
            show_error(error)
            return
        save(result)
