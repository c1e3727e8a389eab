"""Every figure of the project, built with Plotly, shared by the pages and the HTML report.

One module per page its figures serve (``inspect``, ``compare``, ``playground``, ``sweep``,
``audit``, ``tree``, ``strip``, ``runs``: the Runs table), the shared pieces in ``common``; every public name is
re-exported here, so ``from diagnostics.charts import law_figure`` works for pages and report.
"""

from __future__ import annotations

from diagnostics.charts.audit import audit_figure
from diagnostics.charts.common import CHART_CONFIG, COLORS, FLOAT_NOISE, RULE_COLORS, chart_text, denoise, safe_label, shown_tokens, token_label
from diagnostics.charts.compare import divergence_figure
from diagnostics.charts.inspect import law_figure, tracks_figure
from diagnostics.charts.playground import draft_path_figure
from diagnostics.charts.runs import RUN_HEADERS, format_number, runs_display, runs_table
from diagnostics.charts.strip import KIND_STYLE, token_strip_html
from diagnostics.charts.sweep import pareto_figure
from diagnostics.charts.tree import tree_candidates_figure, tree_round_figure

__all__ = [
    "CHART_CONFIG", "COLORS", "FLOAT_NOISE", "KIND_STYLE", "RULE_COLORS", "RUN_HEADERS", "audit_figure", "chart_text", "denoise",
    "divergence_figure", "draft_path_figure", "format_number", "law_figure", "pareto_figure", "runs_display", "runs_table",
    "safe_label", "shown_tokens", "token_label", "token_strip_html", "tracks_figure", "tree_candidates_figure",
    "tree_round_figure",
]
