"""Streamlit entry point: page config, shared sidebar and navigation over ``views/``."""

from __future__ import annotations

import streamlit as st

from diagnostics import __version__
from diagnostics import charts, inspection  # noqa: F401 - imported once per server, not on a page's first visit
from diagnostics.store import default_db_path
from views.common import md

# The favicon stays an emoji: the browser draws it itself, where a Material favicon is fetched from
# fonts.gstatic.com (the app makes no request outside its origin). The pages' icons are Material:
# the bundled font draws them, where emoji need an emoji font (headless chromium has none).
st.set_page_config(page_title="Speculative decoding verification lab", page_icon="🔬", layout="wide")

# Every page is served at its own path (/run, /inspect, …). Streamlit serves the default page at
# "/" only, never at its url_path, so the default is a hidden page that sends "/" on: to Inspect
# for an old deep link (/?run=ID[&pos=N], in reports and files already shared), to Run otherwise.
run_page = st.Page("views/run.py", title="Run", icon=":material/play_arrow:", url_path="run")
inspect_page = st.Page("views/inspect.py", title="Inspect", icon=":material/search:", url_path="inspect")
compare_page = st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare")
playground_page = st.Page("views/playground.py", title="Playground", icon=":material/science:", url_path="playground")
audit_page = st.Page("views/audit.py", title="Audit", icon=":material/verified_user:", url_path="audit")
runs_page = st.Page("views/runs.py", title="Runs", icon=":material/table_rows:", url_path="runs")
sweep_page = st.Page("views/sweep.py", title="Sweeps", icon=":material/scatter_plot:", url_path="sweeps")


def _root() -> None:
    """``/``: the Run page, or Inspect on the run (and position) an old ``/?run=ID`` link names.
    A redirect: the query goes along."""
    st.switch_page(inspect_page if "run" in st.query_params else run_page, query_params=st.query_params.to_dict())


root_page = st.Page(_root, title="Run", icon=":material/play_arrow:", url_path="start", default=True, visibility="hidden")

navigation = st.navigation([root_page, run_page, inspect_page, compare_page, sweep_page, playground_page, audit_page, runs_page])
st.sidebar.caption(f"spec-verify-lab {__version__} · runs in " + md("{path}", path=st.session_state.get("shared_db") or default_db_path()))
navigation.run()
