"""The generation core: draft → verify → accept for one sequence or a batch of them.

This package is the engine's one door. ``generate`` runs one sequence; ``generate_batch`` runs many in
lock-step rounds (``batch``). A round has two implementations that must agree to the last bit of every
decision and record:

==============================  ==========================================  =================================
what                            tensor core (default, ``core="tensor"``)    reference (``core="reference"``)
==============================  ==========================================  =================================
a chain round of every row      ``chain_program.RoundProgram``              ``reference.chain.chain_row``
verify a chain (accept, fall    ``chain_verify.verify_group``               ``reference.chain._verify_block``
back, bonus, record columns)
a tree round of every row       ``tree_program.TreeProgram``                ``reference.tree.tree_row``
a tree's steps and walk         ``tree_verify.steps_rows``, ``walk_rows``   ``reference.tree_walk``
==============================  ==========================================  =================================

Their tests: ``tests/test_chain_program.py`` and ``tests/test_tree_program.py`` feed both cores the same
laws and compare every token, decision and record; ``tests/test_engine_lossless.py`` and
``tests/test_tree_lossless.py`` test the emitted law of both against the target's exact law;
``tests/test_reference_tree.py`` checks the reference tree against the chain and teacher forcing.
Draft heads and custom drafters run through the reference programs only.

Around them: drafting (``drafting``, ``head_drafting``, ``tree_draft``, every row's tree at once: ``tree_batch_draft``), the target's scoring over a slot
store of keys and values (``forward``, ``fast_forward``, ``tree_attention``, ``caches``), early-exit
self-speculation (``self_speculation``), one position's record (``records.position_record``), the audit's
seams (``seams``) and the settings checks (``settings``).
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
