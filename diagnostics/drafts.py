"""A ``--draft`` value resolved once into what the engine drafts with: a loaded model, an early
exit of the target, a loaded draft head, or an n-gram spec. Above ``models`` and ``heads`` (a
head is checked against the loaded target), so neither imports the other's caller."""

from __future__ import annotations

from typing import Any

from diagnostics.heads.layout import load_head
from diagnostics.models import LoadedModel, check_vocabularies, early_exit_model, is_plain_draft, load_model, parse_draft


def load_draft(spec: str | None, target: LoadedModel, *, dtype: str = "float32", trust_remote_code: bool = False) -> Any:
    """Resolve a ``--draft`` value once: a loaded model (``model:``, ``early-exit:``), a loaded head
    (``eagle3:``, ``medusa:``), an n-gram spec, or ``None``."""
    if is_plain_draft(spec):
        return None
    parsed = parse_draft(spec)
    if parsed.kind == "ngram":
        return parsed.spec
    if parsed.kind == "early-exit":
        return early_exit_model(target, int(parsed.value))
    if parsed.kind in ("eagle3", "medusa"):
        return load_head(parsed.kind, parsed.value, target)
    loaded = load_model(parsed.value, dtype=dtype, device=target.device, trust_remote_code=trust_remote_code)
    check_vocabularies(target, loaded)
    return loaded


__all__ = ["load_draft"]
