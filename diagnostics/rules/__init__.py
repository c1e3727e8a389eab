"""Verification rules: the contract and law helpers in ``base``, the single-draft rules in ``single``, their
specs (``get_rule``) in ``specs``, tree and multi-draft forms in ``tree``.

``from diagnostics.rules import get_rule, get_tree_rule`` is the stable entry point.
"""

from diagnostics.rules.base import Rule, RuleError, as_law, as_laws, induced_by_mechanism, normalise_or, safe_ratio
from diagnostics.rules.specs import EXAMPLE_SPECS, RULES, TREE_RULES, get_rule, split_specs
from diagnostics.rules.single import (
    Cascade,
    CoS,
    Greedy,
    Lenience,
    Lossless,
    Medusa,
    Mentored,
    Typical,
    eta_threshold,
)
from diagnostics.rules.tree import SampledMultiDraft, TreeRule, get_tree_rule, top_candidates

__all__ = [
    "EXAMPLE_SPECS", "RULES", "TREE_RULES", "Cascade", "CoS", "Greedy", "Lenience", "Lossless", "Medusa", "Mentored", "Rule",
    "RuleError", "SampledMultiDraft", "TreeRule", "Typical", "as_law", "as_laws", "eta_threshold",
    "get_rule", "get_tree_rule", "induced_by_mechanism", "normalise_or", "safe_ratio", "split_specs", "top_candidates",
]
