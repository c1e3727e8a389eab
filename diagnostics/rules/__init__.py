"""Verification rules: single-draft rules in ``single``, tree and multi-draft forms in ``tree``.

``from diagnostics.rules import get_rule, get_tree_rule`` is the stable entry point.
"""

from diagnostics.rules.single import (
    EXAMPLE_SPECS,
    RULES,
    TREE_RULES,
    Cascade,
    CoS,
    Greedy,
    Lenience,
    Lossless,
    Medusa,
    Mentored,
    Rule,
    RuleError,
    Typical,
    eta_threshold,
    as_law,
    as_laws,
    get_rule,
    induced_by_mechanism,
    normalise_or,
    safe_ratio,
    split_specs,
)
from diagnostics.rules.tree import SampledMultiDraft, TreeRule, get_tree_rule, top_candidates

__all__ = [
    "EXAMPLE_SPECS", "RULES", "TREE_RULES", "Cascade", "CoS", "Greedy", "Lenience", "Lossless", "Medusa", "Mentored", "Rule",
    "RuleError", "SampledMultiDraft", "TreeRule", "Typical", "as_law", "as_laws", "eta_threshold",
    "get_rule", "get_tree_rule", "induced_by_mechanism", "normalise_or", "safe_ratio", "split_specs", "top_candidates",
]
