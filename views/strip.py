"""The token strip as a clickable component: a click on a token selects its position.

The strip's HTML comes from ``diagnostics.charts.token_strip_html``, which escapes every token
text and tooltip (the same HTML goes into reports); the script below only reads the
``data-position`` attribute of the clicked span and sends it back as a trigger value.
"""

from __future__ import annotations

import streamlit as st

_JS = """
export default function(component) {
  const { data, setTriggerValue, parentElement } = component;
  let holder = parentElement.querySelector('.strip-holder');
  if (!holder) {
    holder = document.createElement('div');
    holder.className = 'strip-holder';
    parentElement.appendChild(holder);
  }
  if (holder.dataset.html !== data.html) {
    holder.innerHTML = data.html;  // escaped by token_strip_html
    holder.dataset.html = data.html;
  }
  holder.querySelectorAll('[data-position]').forEach((span) => {
    span.style.cursor = 'pointer';
    span.onclick = () => setTriggerValue('select', Number(span.getAttribute('data-position')));
  });
}
"""
# No css= argument: Streamlit reads a CSS string with brackets as a file glob.
_strip = st.components.v2.component("speclab_token_strip", js=_JS)


def token_strip(html: str, key: str) -> int | None:
    """Show the strip; the position the user just clicked (``None`` when no click caused this run)."""
    result = _strip(data={"html": html}, key=key, on_select_change=lambda: None)
    value = getattr(result, "select", None)
    return int(value) if isinstance(value, (int, float)) else None
