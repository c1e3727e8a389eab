"""Draft heads that read the target's hidden states: EAGLE-3 and Medusa, in their published layouts.

``make_head`` writes one with random weights for any target, ``load_head`` reads one (a folder or
hub id) checked against its target, and ``check_run`` compares a run's recorded ``q`` with the
head's law recomputed from scratch. The engine drafts with them through ``--draft eagle3:…`` and
``--draft medusa:…`` (``diagnostics.engine.head_drafting``).
"""

from diagnostics.heads.check import HeadCheck, check_run, reference_q
from diagnostics.heads.layout import KINDS, LoadedHead, load_head, make_head

__all__ = ["HeadCheck", "KINDS", "LoadedHead", "check_run", "load_head", "make_head", "reference_q"]
