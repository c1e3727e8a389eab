"""Standalone reproduction: vLLM's CPU build breaks sampled speculative decoding.

Without a Triton CPU backend, vLLM's CPU platform replaces the rejection sampler's Triton
kernels by C++ stand-ins (vllm/platforms/cpu.py, register_triton_kernel_overrides). The
stand-in for ``expand_kernel`` (vllm/utils/cpu_triton_utils.py, _expand_kernel_impl) hands
the C++ op an int64 *copy* of a float32/int32 output, so the tensor the rejection sampler
reads back (temperature, top-k, top-p per token) is never written.

This script calls, exactly as the rejection sampler does, and on this machine's CPU:

1. ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` on a float32 temperature
   tensor, an int32 top-k tensor and a float32 top-p tensor (output must equal the per-request
   values repeated over each request's draft tokens);
2. ``vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_only`` on zero rows (a step with no
   draft tokens: every prefill step when speculation is on).

Prints the figures and BROKEN (exit 1) if either is wrong, OK (exit 0) if both are right,
or CANNOT RUN (exit 2) when vLLM's CPU path is not what this script tests.
Imports only the standard library, torch and vllm. Runs in a few seconds.

    python repro.py
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        import torch
        import vllm
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
        from vllm.v1.sample import rejection_sampler
        from vllm.v1.sample.ops import topk_topp_sampler
    except Exception as exc:  # noqa: BLE001 - any import failure means we cannot test
        print(f"CANNOT RUN: vllm/torch import failed: {exc!r}".splitlines()[0])
        return 2
    print(f"vllm {vllm.__version__}, torch {torch.__version__}, platform {type(current_platform).__name__}, "
          f"HAS_TRITON={HAS_TRITON}")
    if not current_platform.is_cpu():
        print("CANNOT RUN: this vLLM is not the CPU build (the stand-ins are registered only on CPU)")
        return 2
    # What vLLM's worker does at start-up (v1/worker/worker_base.py): register the C++ stand-ins
    # for the Triton kernels when Triton has no CPU backend.
    current_platform.register_triton_kernel_overrides()
    if HAS_TRITON:
        print("note: Triton is available here, so vLLM registered no stand-ins; testing the Triton path")

    broken = []
    # Three requests with 3, 1 and 4 draft tokens (+1 bonus each is handled elsewhere):
    # cu_num_draft_tokens as the rejection sampler builds it (int32).
    cu = torch.tensor([3, 4, 8], dtype=torch.int32)
    counts = torch.tensor([3, 1, 4])
    cases = [
        # name, per-request values, replace_from, replace_to (as apply_sampling_constraints calls
        # it: a greedy request, temperature 0, in a sampled batch is expanded as temperature 1)
        ("temperature float32", torch.tensor([0.7, 0.0, 1.3], dtype=torch.float32),
         rejection_sampler.GREEDY_TEMPERATURE, 1),
        ("top_k int32", torch.tensor([20, 5, 50], dtype=torch.int32), 0, 0),
        ("top_p float32", torch.tensor([0.9, 0.5, 0.95], dtype=torch.float32), 0, 0),
    ]
    for name, values, replace_from, replace_to in cases:
        mismatches_total, shown = 0, None
        for trial in range(20):
            # Poison the allocator so that "never written" is visible whatever it held before.
            junk = torch.full((4096,), 123456.0 if values.is_floating_point() else 777777, dtype=values.dtype)
            del junk
            got = rejection_sampler.expand_batch_to_tokens(values, cu, int(cu[-1]), replace_from, replace_to)
            want = torch.repeat_interleave(
                torch.where(values == replace_from, torch.full_like(values, replace_to), values), counts)
            mismatches = int((got != want).sum())
            mismatches_total += mismatches
            if shown is None:
                shown = got.tolist()
        print(f"expand {name}: want {want.tolist()}; got {shown}; "
              f"{mismatches_total} of {20 * want.numel()} elements wrong over 20 calls")
        if mismatches_total:
            broken.append(f"expand {name}")

    # Zero rows: a speculative step with no draft tokens (prefill).
    logits = torch.randn(0, 32)
    k = torch.empty(0, dtype=torch.int32)
    try:
        out = topk_topp_sampler.apply_top_k_only(logits, k)
        print(f"apply_top_k_only on 0 rows: ok, shape {tuple(out.shape)}")
    except Exception as exc:  # noqa: BLE001 - the failure is what we report
        print(f"apply_top_k_only on 0 rows: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        broken.append("apply_top_k_only on 0 rows")

    if broken:
        print("BROKEN: " + "; ".join(broken))
        return 1
    print("OK: expanded temperature/top-k/top-p equal the requests' values; top-k accepts 0 rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
