"""Runs: browse, filter, delete, export, import a shared file, download a report."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import streamlit as st

from diagnostics.charts import RUN_HEADERS, runs_table
from diagnostics.report import build_report
from diagnostics.store import StoreError, complete_groups, default_db_path, export_runs, import_runs
from views.common import file_name_part, literal, md, open_store, run_link, show_error


def downloads(store, chosen: list[str]) -> None:
    """The report and the export are built only when their button is pressed (the report of a long
    run on the embedded model takes tens of seconds); the built bytes are kept in the session for
    this database and selection, so other controls do not rebuild them."""
    selection = (str(store.path), tuple(chosen))
    built = st.session_state.get("runs_built")
    if built is None or built["selection"] != selection:
        built = st.session_state["runs_built"] = {"selection": selection}
    for note in complete_groups(store, chosen).notes("exported and reported"):
        st.caption(literal(note[0].upper() + note[1:] + "."))  # ids come from the file
    report_column, export_column = st.columns(2)
    with report_column:
        if st.button("Build report (HTML)", key="build_report", help="A self-contained HTML report of the selected runs."):
            with st.spinner("Building the report…"):
                built["report"] = build_report(store, chosen)
        if "report" in built:
            st.download_button("Download report (HTML)", built["report"], file_name=f"report-{file_name_part(chosen[0])}.html",
                               mime="text/html", key="download_report", on_click="ignore")
    with export_column:
        fmt = st.radio("Export format", ["duckdb", "parquet"], horizontal=True, key="export_format")
        if st.button(f"Build export ({fmt})", key="build_export"):  # literal-ok: fmt is one of two constants
            try:
                with st.spinner("Exporting…"), tempfile.TemporaryDirectory() as folder:
                    built[fmt] = export_runs(store, chosen, Path(folder) / f"runs.{fmt}", fmt).read_bytes()
            except (StoreError, OSError) as error:
                show_error(error)
        if fmt in built:
            st.download_button(f"Export selected runs ({fmt})",  # literal-ok: fmt is one of two constants
                               built[fmt], file_name=f"runs-{file_name_part(chosen[0])}.{fmt}", key="download_export", on_click="ignore")


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
    shown = runs[list(RUN_HEADERS)]
    # Human headers, numbers to 3 significant digits, float noise as 0, "–" for an empty cell.
    selection = st.dataframe(runs_table(shown), hide_index=True, key="runs_table", on_select="rerun", selection_mode="multi-row",
                             column_config={"prompt": st.column_config.TextColumn("prompt", width="large")})
    rows = selection.selection.rows if selection else []
    chosen = [shown.iloc[row]["run_id"] for row in rows]
    st.caption(f"{len(chosen)} selected" + (": " + md("{ids}", ids=", ".join(chosen)) if chosen else " (click rows to select)"))
    if len(chosen) == 1:
        st.markdown(run_link(f"Open {chosen[0]} in Inspect", chosen[0]))
    if chosen:
        downloads(store, chosen)
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
