"""The steps of the loop a losslessness audit may replace with a planted bug (``EngineSeams``).

The defaults are the correct steps; ``diagnostics.audit.mutants`` builds wrong ones. Seams are
passed explicitly (never patched globally) so a planted engine cannot leak into another run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from diagnostics.engine.drafting import TargetScorer
from diagnostics.engine.forward import Block, BlockOutput, Forward, Output
from diagnostics.engine.tree_verify import steps_rows
from diagnostics.engine.reference.tree_walk import all_node_steps
from diagnostics.engine.chain_verify import at_index
from diagnostics.policy import Policy, probabilities
from diagnostics.rules import Rule


def target_laws(logits: torch.Tensor, policy: Policy, drafted: int) -> torch.Tensor:
    """``p`` for the ``drafted`` verified positions and the bonus position: the policy on every row.

    ``logits`` is ``[drafted + 1, V]`` (one row's block) or ``[G, drafted + 1, V]`` (a group of rows
    in the round program). ``drafted`` is unused here; it is in the signature so an audit's planted
    bug can treat the verified rows differently from the bonus row (see ``EngineSeams``).
    """
    return probabilities(logits, policy)


def fallback_law(rule: Rule, p_laws: torch.Tensor, q_laws: torch.Tensor, index: int | torch.Tensor) -> torch.Tensor:
    """The law the token is drawn from after rejecting the draft at block index ``index``: ``f(p_i, q_i)``.

    One row: ``p_laws`` ``[n + 1, V]``, ``q_laws`` ``[n, V]``, ``index`` an int. A group of rows (the
    round program): ``[G, n + 1, V]``, ``[G, n, V]`` and ``index`` ``[G]``, one law per row ``[G, V]``."""
    return rule.fallback(at_index(p_laws, index), at_index(q_laws, index))


def route(requests: list[Forward] | Block) -> list[Forward] | Block:
    """The requests a stage runs for a batch's rows: each row's own (its slot, its inputs). The per-row
    driver passes a list of ``Forward``; the round program one ``Block`` of every row."""
    return requests


def hand_back(requests: list[Forward] | Block, outputs: list[Output] | BlockOutput) -> list[Output] | BlockOutput:
    """What each row gets back from a batched forward: its own output (a list per row, or a ``BlockOutput``)."""
    return outputs


@dataclass(frozen=True)
class EngineSeams:
    """The steps of the loop a losslessness audit may replace with a planted bug: the target's laws,
    the fallback law, the scorer (cache rollback, tree inputs, path rows), the tree walk's steps,
    and the batch's plumbing (``route``: which slot each row's forward uses; ``hand_back``: which
    output each row receives), where rows of one batch could leak into each other.

    The defaults are the correct steps; ``diagnostics.audit.mutants`` builds wrong ones. Passed
    explicitly (never patched globally) so a planted engine cannot leak into another run.
    """

    target_laws: Callable[[torch.Tensor, Policy, int], torch.Tensor] = target_laws
    fallback_law: Callable[[Rule, torch.Tensor, torch.Tensor, int], torch.Tensor] = fallback_law
    scorer: type = TargetScorer
    tree_steps: Callable[..., dict] = all_node_steps
    tree_steps_rows: Callable[..., Any] = steps_rows  # the round program's batched form of ``tree_steps``
    route: Callable[[list[Forward]], list[Forward]] = route
    hand_back: Callable[[list[Forward], list[Output]], list[Output]] = hand_back


CORRECT = EngineSeams()


