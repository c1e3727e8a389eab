"""OpenVINO GenAI worker for the verdict table (protocol: ``diagnostics/verdicts/workers/__init__.py``).

Runs under the engine's own environment (``tools/build-openvino.sh``) and imports only the
standard library, ``openvino_genai`` and ``openvino`` (for the input tensor); the export step runs
optimum-intel's exporter in a child process of the same interpreter.

* Models: the set-up's ``model`` (and a ``draft_model``) are Hugging Face folders. Each is exported
  once to OpenVINO IR under ``cache/openvino-ir/<name>-<key>``, where the key hashes every file's
  path, size and mtime, the weight format and the exporter's versions, so a changed model (or a
  changed exporter) is exported again. Weights are exported as fp32 (``--weight-format fp32``):
  no int8/int4 compression, and fp32 holds fp32 and bf16 checkpoints exactly, where fp16 would
  round them. The CPU plugin runs them at f32 (``INFERENCE_PRECISION_HINT``) with an f32 KV cache
  (``KV_CACHE_PRECISION``): its defaults on CPU are bf16 arithmetic where the CPU has it and a u8
  KV cache, which are not the HF model.
* Pipeline: ``ContinuousBatchingPipeline`` on CPU (paged attention; what ``LLMPipeline`` wraps on
  CPU), the same pipeline for the control (``speculative`` null) and for speculation, with the same
  scheduler, plugin properties and sampling, so that speculation is the only difference.
* Scheduler: prefix caching off (``LLMPipeline`` turns it on): with it on, a speculative sampled
  generate can fail inside the engine (``content_length <= prompt_ids.size() +
  m_generated_ids.size()``, sequence_group.cpp:32), and reused KV blocks would make one request
  depend on the ones before it. Every prompt of a request is prefilled in one step
  (``MAX_NUM_BATCHED_TOKENS``): a prefill split across steps let unchecked draft tokens through.
* Requests: one ``generate`` call per request, one sub-request per seed (``rng_seed`` = the seed),
  all in one continuous batch. Counters: the call's ``extended_perf_metrics``
  (``get_num_draft_tokens``, ``get_num_accepted_tokens``), which the engine sums over the call's
  sub-requests; null for the control and for prompt lookup (the engine reports none for it).
* After a failed ``generate`` the pipeline is discarded and built again before the next request:
  a speculative pipeline that raised keeps serving with its speculation silently dead (every
  later call: 0 accepted, outputs equal to the control's).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

# The protocol's plumbing, shared with the other workers, lies beside this script: loaded by its path
# (not through the lab's package, which this interpreter lacks; nor through sys.path, which -P lacks).
_SPEC = importlib.util.spec_from_file_location("engine_worker_protocol", Path(__file__).resolve().with_name("_protocol.py"))
protocol = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(protocol)

DEVICE = "CPU"
WEIGHT_FORMAT = "fp32"  # no compression: the IR holds the checkpoint's values exactly (fp32/bf16)
EXPORT_TASK = "text-generation-with-past"
EXPORT_TIMEOUT_S = 3600  # a 135M model exports in ~1.5 min on 2 busy cores; a few B params in tens of minutes
IR_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml")
DONE = "export.json"  # written last into a finished export: its presence is what "exported" means
KV_CACHE_GB = 2  # the paged KV cache the scheduler may allocate (split between target and draft)
# Every prompt of a request is prefilled in one step: with the engine's default (256 tokens a step,
# prompts split across steps: "dynamic split fuse") a draft-model pipeline emitted the draft's first
# token unchecked for some of a batch's sub-requests (greedy, 64 seeds of a 42-token prompt: 26
# outputs differ from the control; 256 vs 8192 tokens a step, 16 seeds: 1 differs vs none). A
# request whose seeds x prompt ids exceed this is refused rather than split.
MAX_NUM_BATCHED_TOKENS = 16384
PLUGIN_PRECISION = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
MAX_LINE_BYTES = 16 << 20  # a request line: 64 seeds and a prompt are far below this
MAX_MESSAGE_CHARS = 600
SPECULATIVE_KEYS = {"draft_model", "num_assistant_tokens", "assistant_confidence_threshold", "prompt_lookup", "max_ngram_size"}
SEED_LIMIT = 2**64  # rng_seed is a size_t


class WorkerError(Exception):
    """What the worker answers as ``{"error": ...}``: already one line that says what to do."""


def one_line(text: Any) -> str:
    """``text`` as one bounded line (engine messages carry newlines and long paths)."""
    return " ".join(str(text).split())[:MAX_MESSAGE_CHARS] or "no message"


# ---------------------------------------------------------------- set-up


def _int(value: Any, name: str, low: int, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value >= high):
        bound = f">= {low}" if high is None else f"in [{low}, {high})"
        raise WorkerError(f"{name} must be an integer {bound}, got {one_line(repr(value))[:80]}")
    return value


def _number(value: Any, name: str, low: float, high: float, *, low_open: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise WorkerError(f"{name} must be a number, got {one_line(repr(value))[:80]}")
    if value > high or value < low or (low_open and value == low):
        raise WorkerError(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value}")
    return float(value)


def _folder(value: Any, name: str) -> Path:
    if not isinstance(value, str) or not os.path.isabs(value):
        raise WorkerError(f"{name} must be an absolute path to a Hugging Face model folder, got {one_line(repr(value))[:120]}")
    path = Path(value)
    if not (path / "config.json").is_file():
        raise WorkerError(f"{name} {path} is not a Hugging Face model folder (no config.json): point it at one")
    return path


def parse_setup(setup: Any) -> dict[str, Any]:
    """The set-up, checked: ``model``, ``cache``, ``threads`` and the speculative configuration
    (``{"draft_model", "num_assistant_tokens" | "assistant_confidence_threshold"}``, or
    ``{"prompt_lookup": true, "num_assistant_tokens", "max_ngram_size"}``, or null)."""
    if not isinstance(setup, dict):
        raise WorkerError("the set-up must be a JSON object with model, speculative, cache and threads")
    model = _folder(setup.get("model"), "model")
    cache = setup.get("cache")
    if not isinstance(cache, str) or not os.path.isabs(cache):
        raise WorkerError(f"cache must be an absolute folder path, got {one_line(repr(cache))[:120]}")
    threads = _int(setup.get("threads", 1), "threads", 1, 1025)
    spec = setup.get("speculative")
    parsed: dict[str, Any] = {"model": model, "cache": Path(cache), "threads": threads, "mode": "control"}
    if spec is None:
        return parsed
    if not isinstance(spec, dict):
        raise WorkerError("speculative must be null or an object such as {\"draft_model\": \"/abs/folder\", \"num_assistant_tokens\": 4}")
    unknown = sorted(set(spec) - SPECULATIVE_KEYS)
    if unknown:
        # A misspelt key must not turn a speculative row into a silent control.
        raise WorkerError(f"speculative has keys this worker does not know: {unknown}; known: {sorted(SPECULATIVE_KEYS)}")
    lookup = spec.get("prompt_lookup", False)
    if not isinstance(lookup, bool):
        raise WorkerError("speculative.prompt_lookup must be true or false")
    if lookup == ("draft_model" in spec):
        raise WorkerError("speculative needs exactly one of draft_model or prompt_lookup: true")
    if lookup:
        parsed["mode"] = "prompt_lookup"
        if "assistant_confidence_threshold" in spec:
            raise WorkerError("prompt lookup takes num_assistant_tokens and max_ngram_size, not assistant_confidence_threshold")
        parsed["num_assistant_tokens"] = _int(spec.get("num_assistant_tokens"), "speculative.num_assistant_tokens", 1, 1025)
        parsed["max_ngram_size"] = _int(spec.get("max_ngram_size"), "speculative.max_ngram_size", 1, 1025)
        return parsed
    parsed["mode"] = "draft_model"
    parsed["draft_model"] = _folder(spec.get("draft_model"), "speculative.draft_model")
    if "max_ngram_size" in spec:
        raise WorkerError("max_ngram_size is a prompt-lookup setting; a draft model takes num_assistant_tokens or assistant_confidence_threshold")
    # The engine needs exactly one of the two ("should have initialized options
    # assistant_confidence_threshold xor num_assistant_tokens"); without either it would default to 5.
    if ("num_assistant_tokens" in spec) == ("assistant_confidence_threshold" in spec):
        raise WorkerError("a draft model needs exactly one of num_assistant_tokens or assistant_confidence_threshold")
    if "num_assistant_tokens" in spec:
        parsed["num_assistant_tokens"] = _int(spec["num_assistant_tokens"], "speculative.num_assistant_tokens", 1, 1025)
    else:
        parsed["assistant_confidence_threshold"] = _number(spec["assistant_confidence_threshold"],
                                                           "speculative.assistant_confidence_threshold", 0.0, 1.0, low_open=True)
    return parsed


# ---------------------------------------------------------------- export


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def exporter_versions() -> dict[str, str]:
    """The versions that make an export: a new one exports again."""
    return {name: _version(name) for name in ("optimum-intel", "optimum", "transformers", "torch", "openvino", "openvino-tokenizers")}


def fingerprint(folder: Path) -> list[list[Any]]:
    """Every file under ``folder`` (hidden ones aside) as [relative path, size, mtime ns]: a
    changed, added or removed file changes it, without reading gigabytes of weights."""
    entries = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        status = path.stat()
        entries.append([relative.as_posix(), status.st_size, status.st_mtime_ns])
    return entries


def export_key(folder: Path, versions: dict[str, str]) -> str:
    payload = {"files": fingerprint(folder), "weight_format": WEIGHT_FORMAT, "task": EXPORT_TASK, "versions": versions}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def exported_ir(folder: Path, cache: Path) -> tuple[Path, dict[str, Any]]:
    """The OpenVINO IR of the HF ``folder``, exported once under ``cache`` (atomically: a partial
    export is never taken for a finished one) and reused while the folder and exporter are unchanged.
    The export runs optimum-intel in a child process (about 2.5x the weights in memory, at most
    ``EXPORT_TIMEOUT_S``); its log is kept beside the IR."""
    versions = exporter_versions()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", folder.resolve().name)[:80] or "model"
    root = cache / "openvino-ir"
    target = root / f"{name}-{export_key(folder, versions)}"
    if (target / DONE).is_file():
        return target, json.loads((target / DONE).read_text(encoding="utf-8"))
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=root))
    log = root / f"{target.name}.export.log"
    command = [sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(folder),
               "--task", EXPORT_TASK, "--weight-format", WEIGHT_FORMAT, "--library", "transformers", str(partial / "ir")]
    # The model is local: the exporter must never reach a hub (and a telemetry opt-in is not ours to give).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "TQDM_DISABLE": "1"}
    start = time.monotonic()
    try:
        with log.open("w") as output:
            try:
                finished = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                          env=env, timeout=EXPORT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise WorkerError(f"exporting {folder} to OpenVINO IR took over {EXPORT_TIMEOUT_S} s; its log: {log}") from None
        if finished.returncode != 0:
            raise WorkerError(f"exporting {folder} to OpenVINO IR failed (status {finished.returncode}); its log: {log}")
        missing = [file for file in IR_FILES if not (partial / "ir" / file).is_file()]
        if missing:
            raise WorkerError(f"exporting {folder} to OpenVINO IR left no {', '.join(missing)} (is openvino-tokenizers "
                              f"installed? run tools/build-openvino.sh); its log: {log}")
        record = {"source": str(folder), "weight_format": WEIGHT_FORMAT, "task": EXPORT_TASK, "versions": versions,
                  "export_seconds": round(time.monotonic() - start, 1)}
        (partial / "ir" / DONE).write_text(json.dumps(record, indent=1), encoding="utf-8")
        try:
            (partial / "ir").rename(target)
            log.rename(target / "export.log")  # kept with the IR it made; a failed export's stays beside
        except OSError:
            if not (target / DONE).is_file():  # not another worker's finished export: a real failure
                raise
        return target, json.loads((target / DONE).read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(partial, ignore_errors=True)


# ---------------------------------------------------------------- engine


class Engine:
    """One pipeline of the set-up's kind, built from the exported IR; rebuilt after a failure."""

    def __init__(self, genai: Any, openvino: Any, setup: dict[str, Any], target_ir: Path, draft_ir: Path | None) -> None:
        self.genai, self.openvino, self.setup = genai, openvino, setup
        self.target_ir, self.draft_ir = target_ir, draft_ir
        self.pipeline: Any = None
        self.builds = 0

    def plugin_properties(self) -> dict[str, Any]:
        return {**PLUGIN_PRECISION, "INFERENCE_NUM_THREADS": self.setup["threads"]}

    def scheduler(self) -> Any:
        config = self.genai.SchedulerConfig()
        config.cache_size = KV_CACHE_GB
        config.max_num_batched_tokens = MAX_NUM_BATCHED_TOKENS
        config.dynamic_split_fuse = True
        config.enable_prefix_caching = False
        return config

    def build(self) -> None:
        properties = self.plugin_properties()
        if self.setup["mode"] == "draft_model":
            properties["draft_model"] = self.genai.draft_model(str(self.draft_ir), DEVICE, **self.plugin_properties())
        elif self.setup["mode"] == "prompt_lookup":
            properties["prompt_lookup"] = True
        self.pipeline = self.genai.ContinuousBatchingPipeline(str(self.target_ir), self.scheduler(), DEVICE, properties)
        self.builds += 1

    def config(self, request: dict[str, Any], seed: int) -> Any:
        config = self.genai.GenerationConfig()
        config.max_new_tokens = request["max_tokens"]
        config.min_new_tokens = 0
        config.num_return_sequences = 1
        config.rng_seed = seed
        eos = request["eos_ids"]
        if eos:
            config.eos_token_id = eos[0]
            config.stop_token_ids = set(eos)
            config.ignore_eos = False
        else:
            config.ignore_eos = True  # no end-of-sequence id: generate max_tokens
        if request["temperature"] > 0:
            config.do_sample = True
            config.temperature = request["temperature"]
            if request["top_k"] is not None:
                config.top_k = request["top_k"]
            if request["top_p"] is not None:
                config.top_p = request["top_p"]
            if request["min_p"] is not None:
                config.min_p = request["min_p"]
        else:
            config.do_sample = False
        mode = self.setup["mode"]
        if mode in ("draft_model", "prompt_lookup") and "num_assistant_tokens" in self.setup:
            config.num_assistant_tokens = self.setup["num_assistant_tokens"]
        if mode == "draft_model" and "assistant_confidence_threshold" in self.setup:
            config.assistant_confidence_threshold = self.setup["assistant_confidence_threshold"]
        if mode == "prompt_lookup":
            config.max_ngram_size = self.setup["max_ngram_size"]
        return config

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.pipeline is None:
            self.build()
        seeds = request["seeds"]
        inputs = [self.openvino.Tensor([request["prompt_ids"]]) for _ in seeds]
        configs = [self.config(request, seed) for seed in seeds]
        try:
            results = list(self.pipeline.generate(inputs, configs))
        except Exception as error:  # noqa: BLE001 - the engine raises RuntimeError and friends
            # The engine leaves a speculative pipeline that raised with its speculation dead:
            # the next request gets a new one.
            self.pipeline = None
            raise WorkerError(f"openvino_genai generate raised {type(error).__name__}: {one_line(error)}") from None
        if len(results) != len(seeds):
            raise WorkerError(f"openvino_genai returned {len(results)} results for {len(seeds)} seeds")
        results.sort(key=lambda result: result.m_request_id)
        outputs = []
        for seed, result in zip(seeds, results):
            ids = list(result.m_generation_ids)
            if len(ids) != 1:
                raise WorkerError(f"openvino_genai returned {len(ids)} sequences for seed {seed} where 1 was asked")
            outputs.append([int(token) for token in ids[0]])
        drafted = accepted = None
        metrics = results[0].extended_perf_metrics if self.setup["mode"] == "draft_model" else None
        if metrics is not None:
            drafted = int(metrics.get_num_draft_tokens())
            # With no draft token recorded, the engine's accepted count falls back to an estimate
            # from step batch sizes (sum of batch_size - 1), which counts batch width, not
            # acceptance; nothing was drafted, so nothing was accepted.
            accepted = int(metrics.get_num_accepted_tokens()) if drafted > 0 else 0
        return {"outputs": outputs, "drafted": drafted, "accepted": accepted}


def parse_request(message: Any, vocab_size: int | None) -> dict[str, Any]:
    """A request, checked (ids within the vocabulary: an engine reads out of bounds on others)."""
    if not isinstance(message, dict):
        raise WorkerError("a request must be a JSON object with prompt_ids, seeds, max_tokens, temperature, top_k, top_p, min_p, eos_ids")
    prompt = message.get("prompt_ids")
    high = vocab_size if vocab_size else 2**31
    if not isinstance(prompt, list) or not prompt:
        raise WorkerError("prompt_ids must be a non-empty list of token ids")
    for token in prompt:
        _int(token, "each prompt id", 0, high)
    seeds = message.get("seeds")
    if not isinstance(seeds, list) or not seeds:
        raise WorkerError("seeds must be a non-empty list of integers")
    for seed in seeds:
        _int(seed, "each seed", 0, SEED_LIMIT)
    eos = message.get("eos_ids", [])
    if not isinstance(eos, list):
        raise WorkerError("eos_ids must be a list of token ids")
    for token in eos:
        _int(token, "each eos id", 0, high)
    request = {"prompt_ids": prompt, "seeds": seeds, "eos_ids": eos,
               "max_tokens": _int(message.get("max_tokens"), "max_tokens", 1, 1 << 20),
               "temperature": _number(message.get("temperature", 0.0), "temperature", 0.0, 100.0)}
    top_k, top_p, min_p = message.get("top_k"), message.get("top_p"), message.get("min_p")
    request["top_k"] = None if top_k is None else _int(top_k, "top_k", 1, 1 << 31)
    request["top_p"] = None if top_p is None else _number(top_p, "top_p", 0.0, 1.0, low_open=True)
    request["min_p"] = None if min_p is None else _number(min_p, "min_p", 0.0, 1.0)
    if len(prompt) * len(seeds) > MAX_NUM_BATCHED_TOKENS:
        raise WorkerError(f"{len(seeds)} seeds x {len(prompt)} prompt ids exceed the {MAX_NUM_BATCHED_TOKENS} tokens this worker "
                          "prefills in one step (a split prefill breaks draft-model speculation): send fewer seeds a request")
    return request


def settings(setup: dict[str, Any], engine: Engine, target: dict[str, Any], draft: dict[str, Any] | None) -> dict[str, Any]:
    """Everything the engine applies that a reader needs, flat."""
    found = {
        "device": DEVICE,
        "pipeline": "ContinuousBatchingPipeline (paged attention), the same for control and speculation",
        "speculation": setup["mode"],
        "target_ir": str(engine.target_ir),
        "weight_format": WEIGHT_FORMAT + " (no compression)",
        "export": f"optimum-cli export openvino --task {EXPORT_TASK} --weight-format {WEIGHT_FORMAT}",
        "exporter_versions": ", ".join(f"{name} {version}" for name, version in target.get("versions", {}).items()),
        "inference_precision_hint": PLUGIN_PRECISION["INFERENCE_PRECISION_HINT"],
        "kv_cache_precision": PLUGIN_PRECISION["KV_CACHE_PRECISION"],
        "inference_num_threads": setup["threads"],
        "scheduler_cache_size_gb": KV_CACHE_GB,
        "scheduler_max_num_batched_tokens": f"{MAX_NUM_BATCHED_TOKENS} (a request's prompts are never split across steps)",
        "scheduler_dynamic_split_fuse": True,
        "scheduler_enable_prefix_caching": False,
        "batching": "one generate call per request, one sub-request per seed (continuous batching)",
        "seeding": "GenerationConfig.rng_seed = seed, a per-sub-request std::mt19937",
        "sampling": "temperature 0: greedy (do_sample false); else do_sample with temperature, top_k, top_p, min_p as asked",
        "eos": "stop_token_ids = eos_ids, eos kept in the output; no eos_ids: ignore_eos",
        "after_error": "the pipeline is rebuilt before the next request",
    }
    if setup["mode"] == "draft_model":
        found["draft_ir"] = str(engine.draft_ir)
        found["draft_source"] = str(setup["draft_model"])
        if "num_assistant_tokens" in setup:
            found["num_assistant_tokens"] = setup["num_assistant_tokens"]
        else:
            found["assistant_confidence_threshold"] = setup["assistant_confidence_threshold"]
        found["draft_plugin"] = "same device and properties as the target"
        found["counters"] = "extended_perf_metrics.get_num_draft_tokens / get_num_accepted_tokens of the request's generate call"
    elif setup["mode"] == "prompt_lookup":
        found["num_assistant_tokens"] = setup["num_assistant_tokens"]
        found["max_ngram_size"] = setup["max_ngram_size"]
        found["counters"] = "none: openvino_genai reports no speculative metrics for prompt lookup"
    else:
        found["counters"] = "none: the control"
    return found


# ---------------------------------------------------------------- protocol


def read_line(stream: Any) -> bytes | None:
    """One line of at most ``MAX_LINE_BYTES`` (a longer one is consumed and refused); None at EOF."""
    try:
        return protocol.read_line(stream, MAX_LINE_BYTES)
    except ValueError:  # the over-long line, already read to its end
        raise WorkerError(f"a line over {MAX_LINE_BYTES} bytes was refused") from None


def decode(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise WorkerError(f"a line is not JSON: {one_line(error)}") from None


def start(line: bytes | None) -> tuple[Engine, dict[str, Any]]:
    """The set-up line to a built engine and its ready answer."""
    if line is None:
        raise WorkerError("stdin closed before the set-up")
    setup = parse_setup(decode(line))
    setup["cache"].mkdir(parents=True, exist_ok=True)
    target_ir, target = exported_ir(setup["model"], setup["cache"])
    draft_ir, draft = (exported_ir(setup["draft_model"], setup["cache"]) if setup["mode"] == "draft_model" else (None, None))
    import openvino  # noqa: PLC0415 - imported once fd 1 is moved: the engine prints
    import openvino_genai  # noqa: PLC0415

    engine = Engine(openvino_genai, openvino, setup, target_ir, draft_ir)
    try:
        engine.build()
    except Exception as error:  # noqa: BLE001
        raise WorkerError(f"openvino_genai could not build the pipeline: {type(error).__name__}: {one_line(error)}") from None
    version = getattr(openvino_genai, "__version__", None) or _version("openvino-genai")
    return engine, {"ready": True, "engine": f"openvino-genai {version}", "settings": settings(setup, engine, target, draft)}


def vocabulary(ir: Path) -> int | None:
    try:
        size = json.loads((ir / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return size if isinstance(size, int) and size > 0 else None


def main() -> int:
    # Answers go to a duplicate of the original stdout; fd 1 becomes stderr before the engine is
    # imported, so whatever it (or its C++ core) prints cannot corrupt the protocol.
    answer = protocol.answer_channel()
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    try:
        engine, ready = start(read_line(stdin))
    except WorkerError as error:
        answer({"error": one_line(error)})
        return 1
    except Exception as error:  # noqa: BLE001 - an unforeseen failure is still one line
        answer({"error": f"the OpenVINO worker failed to start: {type(error).__name__}: {one_line(error)}"})
        return 1
    answer(ready)
    vocab_size = vocabulary(engine.target_ir)
    while True:
        try:
            line = read_line(stdin)
            if line is None:
                return 0
            if not line.strip():
                continue
            answer(engine.generate(parse_request(decode(line), vocab_size)))
        except WorkerError as error:
            answer({"error": one_line(error)})
        except Exception as error:  # noqa: BLE001
            answer({"error": f"the OpenVINO worker failed: {type(error).__name__}: {one_line(error)}"})


if __name__ == "__main__":
    sys.exit(main())
