"""The token strip (Run, Inspect, Compare, Sweeps and the report): emitted tokens as coloured spans."""

from __future__ import annotations

import html

from diagnostics.charts.common import fmt_value, safe_label, visible_spaces
from diagnostics.untrusted import visible

KIND_STYLE = {
    "accepted": ("#d4f4dd", "#1a7f37", "accepted draft"),
    "rejected": ("#ffe1dc", "#cf222e", "rejected → fallback"),
    "bonus": ("#dbeafe", "#0550ae", "bonus"),
}



def token_strip_html(records: list[dict], selected: int | None = None, divergence: int | None = None) -> str:
    """Emitted tokens as coloured spans (accepted / rejected → fallback / bonus), every text escaped.

    Each span's tooltip gives ``p(x)``, ``q(x)``, ``a(x)``, the coin ``u`` and the decision; the
    selected position is outlined and the first divergence marked with a red bar. Styles are
    classes defined once, so a 2,000-token strip stays small.
    """
    spans = []
    for record in records:
        kind = record["kind"]
        label = KIND_STYLE.get(kind, ("", "", kind))[2]
        position = int(record["position"])
        text = record.get("token_text")
        shown = safe_label(text if text is not None else f"⟨{record['token']}⟩", limit=60).replace("\\n", "↵")
        tip_lines = [f"position {position}, block {record.get('block')}: {label}",
                     f"emitted {record['token']}: p = {fmt_value(record.get('p_token'))}"]
        if record.get("draft_token") is not None and kind != "bonus":
            draft_text = record.get("draft_text")
            tip_lines += [
                f"draft {record['draft_token']} “{visible_spaces(visible(draft_text, limit=40))}”" if draft_text is not None else f"draft {record['draft_token']}",
                f"p(x) = {fmt_value(record.get('p_draft'))}, q(x) = {fmt_value(record.get('q_draft'))}, a(x) = {fmt_value(record.get('accept_prob'))}",
                f"coin u = {fmt_value(record.get('u_accept'))} → {'accept' if kind == 'accepted' else 'reject'}",
            ]
        classes = f"tok tok-{html.escape(kind)}" + (" tok-selected" if selected == position else "") + (" tok-diverge" if divergence == position else "")
        tip = html.escape("\n".join(tip_lines), quote=True)
        spans.append(f'<span class="{classes}" data-position="{position}" title="{tip}">{shown}</span>')
    style = "".join(
        f".tok-{kind}{{background:{background};border-bottom:2px solid {border};}}" for kind, (background, border, _) in KIND_STYLE.items()
    )
    legend = " ".join(f'<span class="tok tok-{kind}">{name}</span>' for kind, (_, _, name) in KIND_STYLE.items())
    return (
        "<style>.tok{display:inline-block;margin:1px;padding:0 2px;border-radius:3px;white-space:pre-wrap;font-family:monospace;}"
        f"{style}.tok-selected{{outline:2px solid #111;}}.tok-diverge{{border-left:3px solid #cf222e;padding-left:2px;}}</style>"
        f'<div class="token-strip" style="line-height:1.9;">{"".join(spans)}</div>'
        f'<div style="font-size:0.8em;margin-top:4px;">{legend}</div>'
    )

