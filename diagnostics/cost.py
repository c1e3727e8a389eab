"""The draft/target cost ratio ``c`` of one decoding step, measured on this machine.

``c`` enters the modelled speed-up ``(1 − α^{γ+1}) / ((1 − α)(γ·c + 1))`` (see
``diagnostics.metrics.modelled_speedup``): the one hardware-dependent number, measured here so
the speed-up a page shows is this machine's, and editable because the user's GPU is not.
"""

from __future__ import annotations

import statistics
import time

import torch

from diagnostics.models import LoadedModel, is_draft_head


@torch.inference_mode()
def step_seconds(loaded: LoadedModel, context: list[int], steps: int = 5) -> float:
    """Median wall time of one cached single-token forward after a prefill of ``context``."""
    from transformers import DynamicCache

    model = loaded.model
    cache = DynamicCache()
    ids = torch.tensor([context], device=loaded.device)
    model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    token = ids[:, -1:]
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1)
        if loaded.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def head_step_seconds(head, target: LoadedModel, steps: int = 5) -> float:
    """Median wall time of one draft step of a head (EAGLE-3: its layer on one new pair after 32
    cached; Medusa: every head on one state)."""
    from diagnostics.heads.eagle3 import HeadCache

    module = head.module
    hidden = torch.zeros(1, module.config.hidden_size, dtype=next(module.parameters()).dtype, device=target.device)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        if head.kind == "medusa":
            module.logits(hidden[0], module.config.medusa_num_heads)
        else:
            cache = HeadCache(torch.zeros(module.config.num_key_value_heads, 32, module.config.dim, dtype=hidden.dtype,
                                          device=target.device), None)
            cache.values = cache.keys.clone()
            module.logits(module.step(hidden, hidden, 32, cache)[-1], target.vocab_size)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def draft_cost_ratio(target: LoadedModel, drafter, context: list[int], steps: int = 5) -> float:
    """``c = t_draft / t_target`` for one decoding step at ``context`` (0 for an n-gram drafter,
    whose lookup costs no forward; a head's own step for EAGLE-3 and Medusa)."""
    if drafter is None:
        return 0.0
    context = list(context)[-32:] or [0]
    if is_draft_head(drafter):
        step_seconds(target, context, 1)
        return head_step_seconds(drafter, target, steps) / step_seconds(target, context, steps)
    step_seconds(target, context, 1)  # warm-up: first calls pay for allocation
    step_seconds(drafter, context, 1)
    return step_seconds(drafter, context, steps) / step_seconds(target, context, steps)
