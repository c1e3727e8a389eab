"""The head's law recomputed from scratch, and the check that a run's recorded ``q`` is that law.

The reference takes nothing from the engine: the target's hidden states come from its own
modules' forward (hooks on the layers, one cache-free forward over the prefix), the boundaries
from the head's config, and the head runs over every pair at once. A drafted position ``t`` of
a block that started after the committed prefix ``c`` (``|c| = n``), with earlier drafts
``d_1 … d_{i}`` of the same block, has

* EAGLE-3: pairs ``(g_s, c_{s+1})`` for ``s ≤ n − 2``, then ``(o, d_1)``, …, ``(o, d_i)``; ``q`` from
  the last output;
* Medusa: head ``i`` at the target's normed last hidden state at ``n − 2``.

An engine that pairs a state with the wrong token, or taps the wrong layer, still verifies
losslessly (``q`` is what it drew from), but its drafts are not the head's: acceptance falls
for no reason the head could fix. ``check_run`` finds that as a recorded ``q`` that differs
from the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from diagnostics.engine.drafting import fit_vocabulary
from diagnostics.heads.eagle3 import HeadCache
from diagnostics.models import float_logits
from diagnostics.policy import Policy, probabilities

TOLERANCE = 1e-4  # float32 forwards batched differently agree to about 1e-6


@torch.inference_mode()
def boundary_states(target: Any, ids: list[int]) -> list[torch.Tensor]:
    """``[L + 1]`` hidden states ``[n, H]`` of one cache-free forward: entry ``i`` enters layer ``i``,
    entry ``L`` leaves the last layer (before the final norm). Read with hooks on the target's own layers."""
    layers = list(target.model.model.layers[: int(target.model.config.num_hidden_layers)])
    states: dict[int, torch.Tensor] = {}
    handles = []
    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(
            lambda module, args, kwargs, _i=index: states.__setitem__(_i, (args[0] if args else kwargs["hidden_states"])[0]),
            with_kwargs=True))
    last = len(layers)
    handles.append(layers[-1].register_forward_hook(
        lambda module, args, output: states.__setitem__(last, (output[0] if isinstance(output, tuple) else output)[0])))
    try:
        target.model(input_ids=torch.tensor([ids], device=target.device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return [states[index].float() for index in range(last + 1)]


@torch.inference_mode()
def reference_q(head: Any, target: Any, committed: list[int], drafts: list[int], policy: Policy) -> torch.Tensor:
    """``q`` of the draft after ``drafts`` in a block that began after ``committed`` (see the module docstring)."""
    vocab, count = target.vocab_size, len(committed)
    if count < 2:
        raise ValueError("a head drafts only after the target has scored a token")
    states = boundary_states(target, committed)
    taps = head.taps  # the head's own, from its config (never the engine's)
    embed = target.model.get_input_embeddings()

    def embedded(tokens: list[int]) -> torch.Tensor:
        return embed(torch.tensor(tokens, dtype=torch.long, device=target.device))

    if head.kind == "medusa":
        norm = target.model.model.norm
        hidden = norm(states[taps[0]][count - 2].to(norm.weight.dtype))
        logits = head.module.logits(hidden, len(drafts) + 1)[len(drafts)]
    else:
        module = head.module
        features = torch.cat([states[tap][: count - 1] for tap in taps], dim=-1)
        cache = HeadCache()
        last = module.step(embedded(committed[1:]), module.fuse(features), 0, cache)[-1]
        for index, token in enumerate(drafts):
            last = module.step(embedded([token]), last[None], count - 1 + index, cache)[-1]
        logits = module.logits(last, vocab)
    return probabilities(fit_vocabulary(float_logits(logits).cpu(), vocab), policy)


@dataclass
class HeadCheck:
    """Recorded ``q`` against the head's law: positions compared, the largest difference, and where."""

    positions: int = 0
    max_error: float = 0.0
    worst_position: int | None = None
    mismatched: int = 0
    examples: list[dict] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "pass" if self.mismatched == 0 else "fail"


def check_run(run: Any, head: Any, target: Any, policy: Policy | None = None, limit: int | None = None) -> HeadCheck:
    """Compare every drafted record of ``run`` (a ``Run`` with records) with ``reference_q``: its
    ``q(draft)`` and its recorded top entries; a difference above ``TOLERANCE`` is a mismatch."""
    policy = policy or run.draft_policy or run.policy
    result = HeadCheck()
    prompt = list(run.prompt_ids)
    for record in run.records:
        if record.draft_token is None:
            continue
        if limit is not None and result.positions >= limit:
            break
        begin = record.position - record.index_in_block
        committed = prompt + list(run.tokens[:begin])
        drafts = list(run.tokens[begin : record.position])
        q_ref = reference_q(head, target, committed, drafts, policy)
        errors = [abs(float(q_ref[record.draft_token]) - record.q_draft)]
        errors += [abs(float(q_ref[token]) - prob) for token, prob in zip(record.q_top_ids or [], record.q_top_probs or [])]
        error = max(errors)
        result.positions += 1
        if error > result.max_error:
            result.max_error, result.worst_position = error, record.position
        if error > TOLERANCE:
            result.mismatched += 1
            if len(result.examples) < 3:
                result.examples.append({"position": record.position, "q_recorded": record.q_draft,
                                        "q_head": float(q_ref[record.draft_token])})
    return result


__all__ = ["HeadCheck", "TOLERANCE", "boundary_states", "check_run", "reference_q"]
