"""The Audit page's table of verdicts on real engines (``docs/verdicts.json``, written by
``python -m diagnostics verdicts``), each row linked to its stored audits where this database
holds them. The file may come from elsewhere (``--import``): it is validated, and every cell is
shown as data, never as Markdown."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import streamlit as st

from diagnostics.store import Store
from diagnostics.verdicts.render import display_rows
from diagnostics.verdicts.table import load_table
from views.common import show_error

TABLE = Path(__file__).resolve().parents[1] / "docs" / "verdicts.json"


def verdict_table(store: Store) -> None:
    """The table (``$SPECLAB_VERDICTS``, else the project's ``docs/verdicts.json``) with a link to
    each side's stored audit (``?audit=ID``) when this database has it."""
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
    audits = store.list_audits()
    stored = set(audits["audit_id"]) if not audits.empty else set()
    shown = pd.DataFrame(display_rows(table))
    for side in ("on", "off"):
        shown[f"audit ({side})"] = [f"/audit?audit={quote(str(row[side].get('audit_id')))}" if row[side].get("audit_id") in stored else None
                                    for row in table["rows"]]
    st.dataframe(shown, hide_index=True, key="verdict_table", width="stretch", column_config={
        "audit (on)": st.column_config.LinkColumn("audit (on)", display_text=r"audit=(.*)$"),
        "audit (off)": st.column_config.LinkColumn("audit (off)", display_text=r"audit=(.*)$")})
    st.caption("Each engine generates from the embedded model with speculation on and, as its control, off, under the same "
               "sampling settings; both are audited against the target's law (the external audit). A row whose control fails "
               "reads 'control failed: settings not matched'. 'detects TV ≥': the smallest distortion the sample finds at 90% "
               "power. Evidence: the generations file (in docs/verdicts) and its sha256; the audit links open the stored "
               "audits where this database holds them.")
