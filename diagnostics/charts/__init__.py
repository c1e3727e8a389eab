"""Every figure of the project, built with Plotly, shared by the pages and the HTML report.

One module per page its figures serve (``inspect``, ``compare``, ``playground``, ``sweep``,
``audit``, ``tree``, ``strip``, ``runs``), the shared pieces in ``common``; every public name is
re-exported here, so ``from diagnostics.charts import law_figure`` works for pages and report.
"""

from __future__ import annotations

from diagnostics.charts.audit import audit_figure
from diagnostics.charts.common import COLORS, RULE_COLORS, safe_label, shown_tokens
from diagnostics.charts.compare import divergence_figure
from diagnostics.charts.inspect import law_figure, tracks_figure
from diagnostics.charts.playground import draft_path_figure
from diagnostics.charts.strip import KIND_STYLE, token_strip_html
from diagnostics.charts.sweep import pareto_figure
from diagnostics.charts.tree import tree_candidates_figure, tree_round_figure

__all__ = [
    "COLORS", "KIND_STYLE", "RULE_COLORS", "audit_figure", "divergence_figure", "draft_path_figure", "law_figure",
    "pareto_figure", "safe_label", "shown_tokens", "token_strip_html", "tracks_figure", "tree_candidates_figure",
    "tree_round_figure",
]
