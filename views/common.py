"""Helpers shared by the pages: the store, cached models, and clear messages. Thin by design."""

from __future__ import annotations

import os
import re
from urllib.parse import quote, urlencode

import streamlit as st

from diagnostics.inspection import models_to_load
from diagnostics.models import LoadedModel, ModelError, load_model
from diagnostics.store import Store, StoreError, default_db_path
from diagnostics.untrusted import markdown_literal, visible


def open_store(read_only: bool = False) -> Store | None:
    """The runs database (a shared file read-only when one is open), or ``None`` after a one-line message."""
    shared = st.session_state.get("shared_db")
    path = shared or default_db_path()
    try:
        return Store(path, read_only=read_only or bool(shared), lock_wait_s=5)
    except StoreError as error:
        show_error(error)
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

    def decode(token: int) -> str:
        try:
            return tokenizer.decode([int(token)])
        except (OverflowError, IndexError, TypeError, ValueError):  # an id from a file, outside the vocabulary
            return f"⟨{int(token)}⟩"

    return decode


def literal(text: object, limit: int | None = None) -> str:
    """Untrusted text (anything from a file, the URL, a model or a user) for a Markdown context:
    shown literally, on one line. The one way such text reaches ``st.markdown``, ``st.caption``,
    ``st.error``, widget labels and the like (``tests/test_views_literal.py`` checks the pages)."""
    return markdown_literal(text, limit=limit)


def plain(text: object, limit: int | None = None, keep: str = "") -> str:
    """Untrusted text for a plain-text context (``st.text``, select box options): control and
    format characters (but those in ``keep``) shown as escapes; nothing else is interpreted there."""
    return visible(text, keep=keep, limit=limit)


def md(template: str, /, **untrusted: object) -> str:
    """Trusted Markdown ``template`` with each ``{name}`` filled by ``untrusted[name]`` shown literally:
    ``st.error(md("There is no run {run}.", run=requested))``."""
    return template.format(**{name: literal(value, limit=300) for name, value in untrusted.items()})


def run_link(label: str, run_id: object, position: int | None = None) -> str:
    """A Markdown link to Inspect a run (``/?run=ID&pos=N``): the label shown literally, the id
    percent-encoded, so a hostile id can neither leave the app nor break out of the link."""
    query = {"run": str(run_id)} | ({"pos": str(int(position))} if position is not None else {})
    return f"[{literal(label)}](/?{urlencode(query, quote_via=quote)})"


def file_name_part(text: object) -> str:
    """A download-name-safe form of untrusted text (letters, digits, '-', '_', '.'; at most 40)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._")[:40] or "file"


def run_label(row) -> str:
    """A run in a select box: id, rule, status and the start of its prompt, as plain text."""
    return plain(f"{row.run_id} · {row.rule} · {row.status} · {str(row.prompt)[:40]}")


def show_error(error: object) -> None:
    """An exception's one-line message in an error box, literally (messages quote typed input and file contents)."""
    st.error(literal(error))


def model_consent(run: dict, key: str) -> bool:
    """Whether the models ``run`` names may be loaded. The embedded default and the app's configured
    target may; any other path or hub id (a shared file can name any folder) only after the user
    presses a button that names it, once per session. Never loads anything itself."""
    allowed = st.session_state.setdefault("allowed_models", set())
    pending = [name for name in models_to_load(run, trusted=("default", default_target())) if name not in allowed]
    if not pending:
        return True
    st.caption("This run names models that are not loaded: until you load them, p is not recomputed "
               "and p and q are rebuilt from the stored top-20.")
    if st.button(md("Load {names} (local files only) to recompute p and q exactly", names=", ".join(pending)), key=key):
        allowed.update(pending)
        return True
    return False


METRIC_HELP = {
    "acceptance rate": "Accepted drafts / drafted tokens (every proposed draft, including those discarded after a rejection).",
    "block efficiency": "Emitted tokens per target forward pass, the fallback or bonus token included. Plain decoding = 1.0.",
    "tokens/s": "Emitted tokens per second of wall time for the whole generation (prefill included).",
    "mean TV(P, p)": "Mean over positions of the total variation between the law the token was drawn from and the target p. 0 for lossless.",
    "mean TV(P, baseline)": "The same against the matched baseline: the target sampled losslessly under the rule's truncation.",
}
