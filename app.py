"""Streamlit entry point: page config, shared sidebar and navigation over ``pages/``."""

from __future__ import annotations

import streamlit as st

from diagnostics import __version__

st.set_page_config(page_title="Speculative decoding verification lab", page_icon="🔬", layout="wide")

PAGES = [
    st.Page("pages/playground.py", title="Playground", icon="🧪", url_path="playground", default=True),
]

navigation = st.navigation(PAGES)
st.sidebar.caption(f"spec-verify-lab {__version__} · exact laws, no sampling noise")
navigation.run()
