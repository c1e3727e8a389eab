"""Untrusted text (prompts, token text, model names, rule specs, file names, audit evidence) made
safe to show: one place that knows how.

* ``visible``: control and format characters (``Cc``, ``Cf``, ``Cs``, ``Co``, ``Cn``, line and
  paragraph separators: ESC, NUL, U+202E …) become visible escapes (``\\x1b``, ``\\u202e``), one
  character at a time, so the rest of the text (``café``) stays as it is. A terminal, a report
  or a page then shows what the text *is*, never what it would *do* (reorder, clear, beep).
* ``markdown_literal``: text placed inside Markdown (Streamlit's ``st.markdown``, ``st.error``,
  widget labels) as an inline code span, the one Markdown construct whose content is never
  interpreted: no link, image, emphasis, formula (``$``), emoji or colour directive, HTML, and
  no autolink (``https://…``, ``www.…``, ``a@b.c``), which Streamlit forms from the *text* of a
  paragraph whatever its backslash escapes say (seen in chromium, Streamlit 1.67). The fence is
  longer than any run of backticks inside; Streamlit's one rewrite of raw source, ``:material/``
  to ``:material_`` (for icons, even inside code), is kept out by splitting the span there.
* ``markdown_cell``: text as one cell of a GitHub-flavoured Markdown table (the README's verdict
  table). Plain text keeps its look, Markdown's punctuation backslash-escaped; text GitHub would
  make more of than its characters, which no backslash escape stops (an autolink ``https://…``,
  ``www.…``, ``a@b.c``; maths ``$…$``; an emoji ``:name:``, replaced after rendering; a character
  reference ``&#x202e;``), is shown in code spans instead, where GitHub does none of these.
* ``html_text``: text for an HTML page (a report), invisible characters shown, then HTML-escaped.
"""

from __future__ import annotations

import html
import re
import unicodedata

# Unicode categories whose characters act instead of showing: controls, formats (bidi overrides,
# zero-width joiners), surrogates, private use, unassigned, line and paragraph separators.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: object, keep: str = "", limit: int | None = None) -> str:
    """``text`` with every control or format character shown as an escape (``\\x1b``, ``\\u202e``);
    characters in ``keep`` (e.g. ``"\\n\\t"`` for a prompt block) stay as they are. ``limit`` cuts
    the result to that many characters, ending with ``…``."""
    shown = "".join(
        char if char in keep or unicodedata.category(char) not in INVISIBLE_CATEGORIES else _escape(char)
        for char in ("" if text is None else str(text))
    )
    if limit is not None and len(shown) > limit:
        shown = shown[: max(0, limit - 1)] + "…"
    return shown


def _code_span(text: str) -> str:
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"  # one space each side is stripped again, whatever the text starts with


def markdown_literal(text: object, limit: int | None = None) -> str:
    """``text`` for a Markdown context, shown literally on one line (invisible characters and
    newlines escaped visibly) as an inline code span."""
    shown = visible(text, limit=limit)
    if not shown:
        return "` `"
    # ":material/x:" would be rewritten by Streamlit's front end even in code: the slash goes
    # between two spans as plain text (adjacent spans would merge their backtick fences).
    return "/".join(_code_span(piece) if piece else "" for piece in re.split(r"(?<=:material)/", shown))


# Markdown's punctuation that a backslash escape makes literal (CommonMark: any ASCII punctuation).
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+!|<>~])")
# What GitHub makes of text beyond Markdown's punctuation: autolinks (cmark-gfm's ``scheme://``,
# ``www.``, e-mail ``a@b.c``, ``mailto:`` / ``xmpp:``), maths (``$``), emoji shortcodes (``:name:``,
# replaced in the HTML after rendering, so an escaped colon is still one) and character references
# (``&#x202e;`` would be decoded into the very character ``visible`` escaped). Broad on purpose: a
# false match only costs a monospace cell.
_GITHUB_ACTIVE = re.compile(r"://|www\.|@|\$|&|:[^\s:]+:|(?:mailto|xmpp):", re.IGNORECASE)


def markdown_cell(text: object, limit: int = 200) -> str:
    """``text`` as one cell of a GitHub-flavoured Markdown table: on one line (runs of whitespace
    become one space), invisible characters shown (``visible``), cut to ``limit`` characters. Text
    GitHub reads as text keeps its look with Markdown's punctuation backslash-escaped; text it would
    turn into a link, formula, emoji or character (``_GITHUB_ACTIVE``) becomes code spans
    (``markdown_literal``) with each ``|`` between them as ``\\|``: GFM splits a row into cells
    before it parses code spans, reading ``\\\\`` as one escaped backslash, so a pipe escaped
    inside a span after a backslash of the text would still end the cell."""
    shown = visible(" ".join(("" if text is None else str(text)).split()), limit=limit)
    if _GITHUB_ACTIVE.search(shown):
        return "\\|".join(markdown_literal(piece) if piece else "" for piece in shown.split("|"))
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", shown)


def html_text(text: object, keep: str = "") -> str:
    """``text`` for HTML: invisible characters shown as escapes (``visible``), then HTML-escaped."""
    return html.escape(visible(text, keep=keep))
