"""Streamlit entry point: page config, shared sidebar and navigation over ``views/``."""

from __future__ import annotations

import streamlit as st

from diagnostics import __version__
from diagnostics import charts, inspection  # noqa: F401 - imported once per server, not on a page's first visit
from diagnostics.store import default_db_path
from views.common import md

st.set_page_config(page_title="Speculative decoding verification lab", page_icon="🔬", layout="wide")

run_page = st.Page("views/run.py", title="Run", icon="▶️", url_path="run")
inspect_page = st.Page("views/inspect.py", title="Inspect", icon="🔍", url_path="inspect")
compare_page = st.Page("views/compare.py", title="Compare", icon="⚖️", url_path="compare")
playground_page = st.Page("views/playground.py", title="Playground", icon="🧪", url_path="playground")
runs_page = st.Page("views/runs.py", title="Runs", icon="🗂️", url_path="runs")
audit_page = st.Page("views/audit.py", title="Audit", icon="🛡️", url_path="audit")

# Deep links are /?run=ID (the default page ignores its url_path), so the default page is
# Inspect when a run is asked for, Run otherwise.
if "run" in st.query_params:
    inspect_page = st.Page("views/inspect.py", title="Inspect", icon="🔍", url_path="inspect", default=True)
    pages = [inspect_page, run_page, compare_page, playground_page, audit_page, runs_page]
else:
    run_page = st.Page("views/run.py", title="Run", icon="▶️", url_path="run", default=True)
    pages = [run_page, inspect_page, compare_page, playground_page, audit_page, runs_page]

navigation = st.navigation(pages)
st.sidebar.caption(f"spec-verify-lab {__version__} · runs in " + md("{path}", path=st.session_state.get("shared_db") or default_db_path()))
navigation.run()
