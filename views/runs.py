"""Runs: browse, filter, delete, export, import a shared file, download a report."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import streamlit as st

from diagnostics.report import build_report
from diagnostics.store import StoreError, default_db_path, export_runs, import_runs
from views.common import file_name_part, md, open_store, run_link, show_error


st.title("Runs")
shared = st.session_state.get("shared_db")
if shared:
    st.info(md("Browsing the shared file {name} read-only.", name=Path(shared).name))
    if st.button("Back to my runs", key="leave_shared"):
        del st.session_state["shared_db"]
        st.rerun()
store = open_store()
if store is None:
    st.stop()

left, right = st.columns([1, 2])
status = left.selectbox("Status", ["all", "complete", "running", "interrupted", "failed"], key="runs_status")
search = right.text_input("Search prompt, rule or model", key="runs_search")
runs = store.list_runs(status=None if status == "all" else status, search=search or None)
if runs.empty:
    st.info("No runs match. Start one on the Run page, or with `python -m diagnostics run --prompt …`.")
else:
    shown = runs[["run_id", "created", "status", "rule", "draft", "n_tokens", "acceptance_rate", "block_efficiency",
                  "tokens_per_s", "mean_tv_target", "group_id", "prompt"]]
    selection = st.dataframe(shown, hide_index=True, key="runs_table", on_select="rerun", selection_mode="multi-row",
                             column_config={"run_id": st.column_config.TextColumn("run"),
                                            "prompt": st.column_config.TextColumn("prompt", width="large")})
    rows = selection.selection.rows if selection else []
    chosen = [shown.iloc[row]["run_id"] for row in rows]
    st.caption(f"{len(chosen)} selected" + (": " + md("{ids}", ids=", ".join(chosen)) if chosen else " (click rows to select)"))
    if len(chosen) == 1:
        st.markdown(run_link(f"Open {chosen[0]} in Inspect", chosen[0]))
    if chosen:
        report = build_report(store, chosen)
        st.download_button("Download report (HTML)", report, file_name=f"report-{file_name_part(chosen[0])}.html", mime="text/html", key="download_report")
        fmt = st.radio("Export format", ["duckdb", "parquet"], horizontal=True, key="export_format")
        with tempfile.TemporaryDirectory() as folder:
            exported = export_runs(store, chosen, Path(folder) / f"runs.{fmt}", fmt)
            st.download_button(f"Export selected runs ({fmt})",  # literal-ok: fmt is one of two constants
                                exported.read_bytes(), file_name=f"runs-{file_name_part(chosen[0])}.{fmt}", key="download_export")
        if not store.read_only:
            confirm = st.checkbox(f"Yes, delete {len(chosen)} run(s) and their positions", key="confirm_delete")
            if st.button("Delete selected", disabled=not confirm, key="delete_runs"):
                removed = store.delete_runs(chosen)
                st.success(f"Deleted {int(removed)} run(s).")
                st.rerun()

st.subheader("Open a shared file")
upload = st.file_uploader("A .duckdb or .parquet export from a colleague (opened read-only)", type=["duckdb", "parquet"], key="import_file")
if upload is not None:
    data = upload.getvalue()
    folder = default_db_path().parent / "shared"
    # The copy is named by its content (and a tame form of the name): an uploaded name can be
    # "..", a path, or the name of a file already open here.
    suffix = ".parquet" if upload.name.lower().endswith(".parquet") else ".duckdb"
    saved = folder / f"{hashlib.sha256(data).hexdigest()[:16]}-{file_name_part(Path(upload.name).stem)}{suffix}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not saved.exists():
            saved.write_bytes(data)
        opened = import_runs(saved, saved.with_suffix(".imported.duckdb"))
    except (StoreError, OSError) as error:
        saved.unlink(missing_ok=True)  # a refused file is not kept; the colleague's original is untouched
        show_error(error)
    else:
        st.session_state["shared_db"] = str(opened.path)
        st.success(md("Opened {name}: ", name=upload.name) + f"{len(opened.list_runs())} run(s), read-only.")
