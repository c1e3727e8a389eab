"""A fake ``openvino_genai`` for tests/test_openvino_worker.py: just the API the OpenVINO GenAI worker
uses (SchedulerConfig, GenerationConfig, draft_model, ContinuousBatchingPipeline.generate and the
results' ids and extended metrics), with deterministic outputs (``expected_tokens``).

Environment: ``$FAKE_OV_LOG`` (a file: each pipeline build and generate call is recorded there, one
JSON object a line, with the settings it got), ``$FAKE_OV_PRINT`` (the engine prints on stdout at
import and at every generate, from Python and from the file descriptor, as a C++ core would),
``$FAKE_OV_DEAD`` (speculation reports 0 drafted tokens and the engine's batch-size fallback as
accepted). A prompt holding ``RAISE_ID`` makes ``generate`` raise the engine's assertion text.
"""

import json
import os
import sys

__version__ = "2026.4.1.0-fake"
RAISE_ID = 66
ENGINE_MESSAGE = ("Check 'content_length <= prompt_ids.size() + m_generated_ids.size()' failed at "
                  "/build/openvino.genai/src/cpp/src/sequence_group.cpp:32\n")


def _record(event: dict) -> None:
    path = os.environ.get("FAKE_OV_LOG")
    if path:
        with open(path, "a") as log:
            log.write(json.dumps(event, default=str) + "\n")


def _chatter(text: str) -> None:
    if os.environ.get("FAKE_OV_PRINT"):
        print(f"fake engine (python): {text}")
        sys.stdout.flush()
        os.write(1, f"fake engine (C++ core): {text}\n".encode())


_chatter("imported")


def expected_tokens(prompt: list, seed: int, max_tokens: int, temperature: float, stop_ids: list, ignore_eos: bool) -> list:
    """What the fake generates: ids in [10, 50) from the seed, prompt and position; an odd seed ends
    at its fourth token with the first stop id (the stop id kept, as the engine keeps it)."""
    tokens = []
    for position in range(max_tokens):
        if seed % 2 == 1 and position == 3 and stop_ids and not ignore_eos:
            tokens.append(stop_ids[0])
            break
        tokens.append(10 + (seed * 31 + position * 7 + len(prompt) + (3 if temperature > 0 else 0)) % 40)
    return tokens


class SchedulerConfig:
    def __init__(self) -> None:
        self.cache_size = 0
        self.max_num_batched_tokens = 256
        self.dynamic_split_fuse = True
        self.enable_prefix_caching = False


class GenerationConfig:
    def __init__(self) -> None:
        self.max_new_tokens = 2**64 - 1
        self.min_new_tokens = 0
        self.num_return_sequences = 1
        self.rng_seed = 0
        self.eos_token_id = -1
        self.stop_token_ids = set()
        self.ignore_eos = False
        self.do_sample = False
        self.temperature = 1.0
        self.top_k = 2**64 - 1
        self.top_p = 1.0
        self.min_p = 0.0
        self.num_assistant_tokens = None
        self.assistant_confidence_threshold = 0.0
        self.max_ngram_size = 0


def draft_model(models_path, device: str = "", **properties) -> dict:
    return {"draft_model": str(models_path), "device": device, "properties": properties}


class _Metrics:
    """The extended metrics of a speculative generate call (sums over its sub-requests)."""

    def __init__(self, drafted: int, accepted: int) -> None:
        self._drafted, self._accepted = drafted, accepted

    def get_num_draft_tokens(self) -> int:
        return self._drafted

    def get_num_accepted_tokens(self) -> int:
        return self._accepted


class _Result:
    def __init__(self, request_id: int, ids: list, metrics) -> None:
        self.m_request_id = request_id
        self.m_generation_ids = [ids]
        self.extended_perf_metrics = metrics


class ContinuousBatchingPipeline:
    def __init__(self, models_path, scheduler_config, device, properties=None) -> None:
        properties = dict(properties or {})
        if not os.path.isfile(os.path.join(str(models_path), "openvino_model.xml")):
            raise RuntimeError(f"fake: no openvino_model.xml in {models_path}")
        self.draft = properties.pop("draft_model", None)
        self.lookup = properties.pop("prompt_lookup", False)
        _record({"event": "build", "models_path": str(models_path), "device": device, "draft": self.draft,
                 "prompt_lookup": self.lookup, "properties": properties,
                 "scheduler": dict(vars(scheduler_config))})

    def generate(self, inputs: list, configs: list) -> list:
        _chatter("generate")
        _record({"event": "generate", "configs": [{name: sorted(value) if isinstance(value, set) else value
                                                   for name, value in vars(config).items()} for config in configs]})
        results = []
        for request_id, (tensor, config) in enumerate(zip(inputs, configs)):
            prompt = tensor.data[0]
            if RAISE_ID in prompt:
                raise RuntimeError(ENGINE_MESSAGE)
            ids = expected_tokens(prompt, config.rng_seed, config.max_new_tokens,
                                  config.temperature if config.do_sample else 0.0, sorted(config.stop_token_ids), config.ignore_eos)
            results.append(_Result(request_id, ids, None))
        metrics = None
        if self.draft is not None:
            generated = sum(len(result.m_generation_ids[0]) for result in results)
            # The dead case: nothing drafted, and the engine's fallback estimate as "accepted".
            metrics = _Metrics(0, 7) if os.environ.get("FAKE_OV_DEAD") else _Metrics(2 * generated, generated // 2)
        for result in results:
            result.extended_perf_metrics = metrics
        return list(reversed(results))  # the worker must not rely on the engine's order
