"""The generation core: draft → verify → accept for one sequence or a batch of them.

This package is the engine's one door. ``generate`` runs one sequence; ``generate_batch`` runs
many in lock-step rounds (``batch``), each row a chain (``chain``) or tree (``tree``) round
program that yields the forwards it needs: drafting (``drafting``, ``tree_draft``), the target's
scoring over a slot store of keys and values (``forward``, ``fast_forward``, ``tree_attention``),
the tree walk (``tree_walk``) and early-exit self-speculation (``self_speculation``). Records and
the run live in ``records``, the audit seams in ``seams``, the settings checks in ``settings``.
"""

from diagnostics.engine.batch import RowPlan, generate, generate_batch
from diagnostics.engine.records import NodeRecord, PositionRecord, RoundRecord, Run, decode_one, finish, rounds, top_entries
from diagnostics.engine.seams import CORRECT, EngineSeams, fallback_law, target_laws
from diagnostics.engine.settings import (
    MAX_GAMMA,
    MAX_NEW_TOKENS,
    MAX_SEED,
    EngineError,
    check_draft_stop,
    check_numbers,
    check_settings,
    check_tree_settings,
    eos_ids,
    tree_spec_or_error,
)

__all__ = [
    "CORRECT", "MAX_GAMMA", "MAX_NEW_TOKENS", "MAX_SEED", "EngineError", "EngineSeams", "NodeRecord", "PositionRecord",
    "RoundRecord", "RowPlan", "Run", "check_draft_stop", "check_numbers", "check_settings", "check_tree_settings",
    "decode_one", "eos_ids", "fallback_law", "finish", "generate", "generate_batch", "rounds", "target_laws",
    "top_entries", "tree_spec_or_error",
]
