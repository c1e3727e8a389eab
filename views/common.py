"""Helpers shared by the pages: the store, cached models, and clear messages. Thin by design."""

from __future__ import annotations

import os

import streamlit as st

from diagnostics.models import LoadedModel, ModelError, load_model
from diagnostics.store import Store, StoreError, default_db_path


def open_store(read_only: bool = False) -> Store | None:
    """The runs database (a shared file read-only when one is open), or ``None`` after a one-line message."""
    shared = st.session_state.get("shared_db")
    path = shared or default_db_path()
    try:
        return Store(path, read_only=read_only or bool(shared), lock_wait_s=5)
    except StoreError as error:
        st.error(str(error))
        return None


def default_target() -> str:
    """``$SPECLAB_TARGET`` (tests point the app at a tiny model) or the embedded default."""
    return os.environ.get("SPECLAB_TARGET", "default")


@st.cache_resource(show_spinner="Loading the model…")
def cached_model(spec: str) -> LoadedModel:
    return load_model(spec)


@st.cache_resource(show_spinner="Loading the run's model to recompute p and q exactly…")
def try_model(spec: str) -> LoadedModel | None:
    """The model if it is available without the network (embedded, local folder, HF cache), else ``None``."""
    try:
        return load_model(spec, local_only=True)
    except ModelError:
        return None


def decoder(model: LoadedModel | None):
    """Token id → text for labels (``None`` when there is no tokenizer)."""
    if model is None or model.tokenizer is None:
        return None
    tokenizer = model.tokenizer
    return lambda token: tokenizer.decode([int(token)])


_MARKDOWN_SPECIALS = set("\\`*_{}[]()<>#+-.!|~$:")


def literal(text: str) -> str:
    """Untrusted text (token text, audit labels) shown literally inside Markdown: every Markdown
    special character is backslash-escaped, so no link, image or emphasis can be injected."""
    return "".join(f"\\{char}" if char in _MARKDOWN_SPECIALS else char for char in str(text))


METRIC_HELP = {
    "acceptance rate": "Accepted drafts / drafted tokens (every proposed draft, including those discarded after a rejection).",
    "block efficiency": "Emitted tokens per target forward pass, the fallback or bonus token included. Plain decoding = 1.0.",
    "tokens/s": "Emitted tokens per second of wall time for the whole generation (prefill included).",
    "mean TV(P, p)": "Mean over positions of the total variation between the law the token was drawn from and the target p. 0 for lossless.",
    "mean TV(P, baseline)": "The same against the matched baseline: the target sampled losslessly under the rule's truncation.",
}
