"""A fake ``vllm`` package for tests/test_vllm_worker.py: just the API that
diagnostics/verdicts/workers/vllm_worker.py uses (``LLM``, ``SamplingParams``, ``__version__``),
put on the worker subprocess's PYTHONPATH. It is noisy on purpose (prints, and writes to fd 1
from "C"), and strict: unknown arguments raise, as vLLM's own classes do.

Generation is a pure function of the prompt and the seed (``fake_tokens``); a request with seed
666 raises midway and leaves its requests unfinished in the engine (as vLLM's offline loop does),
so only a worker that aborts them gets clean results next time. With a speculative_config the
engine's counters grow by 3 drafted and 1 accepted per generated token (cumulative, as vLLM's)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__version__ = "0.0.fake"
RAISING_SEED = 666

print("fake vllm: imported (a print to stdout)")

_SAMPLING_FIELDS = {"seed", "max_tokens", "temperature", "top_k", "top_p", "min_p", "ignore_eos",
                    "stop_token_ids", "detokenize", "n"}
_LLM_FIELDS = {"model", "dtype", "enforce_eager", "max_model_len", "seed", "disable_log_stats", "speculative_config",
               "enable_chunked_prefill"}


def fake_tokens(prompt: list[int], seed: int, count: int) -> list[int]:
    """The fake engine's generation: ``count`` ids, a pure function of the prompt and the seed."""
    return [(seed * 7 + sum(prompt) + 3 * step) % 1000 + 10 for step in range(count)]


class SamplingParams:
    """vLLM's sampling parameters: keyword arguments only, unknown names raise ``TypeError``."""

    def __init__(self, **kwargs) -> None:
        unknown = set(kwargs) - _SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected arguments {sorted(unknown)}")
        self.__dict__.update({"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "ignore_eos": False,
                              "stop_token_ids": [], "seed": None, "max_tokens": 16} | kwargs)


@dataclass
class Counter:
    name: str
    labels: dict = field(default_factory=dict)
    value: int = 0


@dataclass
class Gauge:
    name: str
    labels: dict = field(default_factory=dict)
    value: float = 0.0


@dataclass
class CompletionOutput:
    token_ids: list[int]


@dataclass
class RequestOutput:
    request_id: str
    outputs: list[CompletionOutput]


class OutputProcessor:
    def __init__(self) -> None:
        self.request_states: dict[str, object] = {}


class LLMEngine:
    def __init__(self, model: str, max_model_len: int, chunked_prefill: bool) -> None:
        self.output_processor = OutputProcessor()
        self.vllm_config = type("VllmConfig", (), {
            "model_config": type("ModelConfig", (), {"max_model_len": max_model_len, "model": model})(),
            "cache_config": type("CacheConfig", (), {"enable_prefix_caching": True})(),
            "scheduler_config": type("SchedulerConfig", (), {"enable_chunked_prefill": chunked_prefill,
                                                             "max_num_batched_tokens": 4096, "max_num_seqs": 256})()})()

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        if not internal:  # the ids of request_states are internal ones: external ids abort nothing
            return
        for request_id in request_ids:
            self.output_processor.request_states.pop(request_id, None)


class LLM:
    """vLLM's offline engine, faked: ``generate`` and ``get_metrics``."""

    def __init__(self, **kwargs) -> None:
        unknown = set(kwargs) - _LLM_FIELDS
        if unknown:
            raise TypeError(f"LLM got unexpected arguments {sorted(unknown)}")
        if not os.path.isfile(os.path.join(kwargs["model"], "config.json")):
            raise OSError(f"no config.json in {kwargs['model']}")
        if kwargs.get("speculative_config", {}) and kwargs["speculative_config"].get("method") == "broken":
            raise ValueError("speculative method 'broken' is not supported\nsecond line of the message")
        self.kwargs = kwargs
        self.llm_engine = LLMEngine(kwargs["model"], kwargs.get("max_model_len") or 8192, kwargs.get("enable_chunked_prefill", True))
        self.speculative = kwargs.get("speculative_config") is not None
        self.drafted = Counter("vllm:spec_decode_num_draft_tokens", {"engine": "0"})
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", {"engine": "0"})
        self.next_id = 0
        print("fake vllm: engine ready (a print to stdout)")

    def get_metrics(self) -> list:
        if self.kwargs.get("disable_log_stats", True):
            raise AssertionError("get_metrics needs stats logging on (disable_log_stats=False)")
        metrics = [Counter("vllm:num_preemptions", {"engine": "0"}, 5), Gauge("vllm:num_requests_running", {}, 0.0)]
        return metrics + [self.drafted, self.accepted]  # at 0 without speculation: the control's are null all the same

    def generate(self, prompts: list[dict], sampling_params: list[SamplingParams], use_tqdm: bool = True) -> list[RequestOutput]:
        print("fake vllm: generating (a print to stdout)")
        os.write(1, b"fake vllm: a C library writes to fd 1\n")
        if not isinstance(sampling_params, list) or len(sampling_params) != len(prompts):
            raise ValueError("one SamplingParams per prompt expected")
        states = self.llm_engine.output_processor.request_states
        finished = [(request_id, state) for request_id, state in states.items()]  # left by a failed call
        states.clear()
        for prompt, params in zip(prompts, sampling_params):
            if set(prompt) != {"prompt_token_ids"}:
                raise ValueError(f"a prompt of token ids expected, got {prompt!r}")
            tokens = []
            for token in fake_tokens(prompt["prompt_token_ids"], params.seed, params.max_tokens):
                tokens.append(token)
                if token in params.stop_token_ids or (not params.ignore_eos and token == 2):
                    break
            states[str(self.next_id)] = tokens
            self.next_id += 1
        if self.speculative and any(params.temperature > 0 for params in sampling_params):
            _rejection_sampler_cpu_path(sampling_params)
        if any(params.seed == RAISING_SEED for params in sampling_params):
            raise IndexError("index -188010736 is out of bounds for dimension 1 with size 49152")
        finished += list(states.items())
        states.clear()
        for _, tokens in finished:
            if self.speculative:
                self.drafted.value += 3 * len(tokens)
                self.accepted.value += len(tokens)
        return [RequestOutput(request_id, [CompletionOutput(tokens)]) for request_id, tokens in finished]


def _rejection_sampler_cpu_path(sampling_params: list[SamplingParams]) -> None:
    """What vLLM's rejection sampler does on CPU with sampling: expand the per-request
    temperatures (float32) to per-token ones, through the kernel registry's function, and apply
    top-k to the target rows of a step without drafts (none). Raises where vLLM's CPU path breaks."""
    import torch

    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample.ops import topk_topp_sampler

    temperatures = torch.tensor([params.temperature for params in sampling_params], dtype=torch.float32)
    per_token = torch.full((2 * len(sampling_params),), -7.0)  # "uninitialised"
    cpu_triton_utils._expand_kernel_impl(per_token, temperatures, torch.arange(1, len(sampling_params) + 1) * 2, 0, 1)
    if not torch.equal(per_token, temperatures.repeat_interleave(2)):
        raise RuntimeError(f"the expanded temperatures are garbage: {per_token.tolist()}")
    if any(params.top_k > 0 for params in sampling_params):
        topk_topp_sampler.apply_top_k_only(torch.empty((0, 8)), torch.empty((0,), dtype=torch.int32))
