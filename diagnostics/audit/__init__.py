"""Losslessness audit: prove an implementation lossless, or catch it red-handed.

Three layers, each with a verdict and its evidence:

* ``rule_level``: one verification step, run many times on a battery of ``(p, q)`` pairs; the
  output law is tested against ``p`` (or a declared lossy rule's law). Adapter signature::

      verify(p_target: Tensor[V], q_draft: Tensor[V], drafts: LongTensor[n], generator) -> LongTensor[n]

* ``engine_level``: a whole generator ``(prompt_ids, seed) -> tokens`` against the target's
  exact law recomputed by teacher forcing (randomized PIT).
* ``recorded``: a stored run, replayed decision by decision.

``mutants`` holds one planted bug per bug class; ``suite`` names the audits the CLI and the
Audit page run.
"""

from diagnostics.audit.engine_level import (
    EngineAudit,
    PositionTest,
    audit_generator,
    engine_generator,
    randomized_pit,
    transformers_generator,
)
from diagnostics.audit.mutants import BATCH_MUTANTS, ENGINE_MUTANT_POLICY, ENGINE_MUTANTS, RULE_MUTANTS, StaleRollbackScorer
from diagnostics.audit.recorded import RecordedAudit, audit_recorded_run
from diagnostics.audit.rule_level import (
    DETECTION_POWER,
    PairResult,
    RuleAudit,
    Verify,
    audit_rule,
    battery,
    holm,
    model_pairs,
    rule_adapter,
    transformers_adapter,
)
from diagnostics.inspection import teacher_forced_laws

__all__ = [
    "BATCH_MUTANTS", "DETECTION_POWER", "ENGINE_MUTANTS", "ENGINE_MUTANT_POLICY", "RULE_MUTANTS", "EngineAudit", "PairResult",
    "PositionTest", "RecordedAudit", "RuleAudit", "StaleRollbackScorer", "Verify", "audit_generator", "audit_recorded_run",
    "audit_rule", "battery", "engine_generator", "holm", "model_pairs", "randomized_pit", "rule_adapter",
    "teacher_forced_laws", "transformers_adapter", "transformers_generator",
]
