"""ONNX Runtime GenAI (PyPI ``onnxruntime-genai``, CPU) as a verdict-table engine: the JSON-lines
worker of ``verdicts.workers`` (read its protocol there). Run by that environment's own interpreter
(``tools/build-onnxruntime-genai.sh`` builds ``data/onnxruntime-genai/venv``); imports only the
standard library and onnxruntime_genai (its model builder runs as a child process).

* Models: the target's (and the draft's) Hugging Face folder is exported once to ONNX by
  onnxruntime_genai's own model builder (``python -m onnxruntime_genai.models.builder -i FOLDER -o
  OUT -p fp32 -e cpu``, offline) under ``CACHE/exports/``, keyed by the builder's version, the
  precision, the folder and its files' sizes and times; an export is made in a temporary folder and
  renamed into place, so a killed export leaves nothing that is reused. Bounds: one export holds the
  model in torch (the 135M target, fp32: 1.1 GB peak, ~30 s here) and may take ``EXPORT_TIMEOUT_S``;
  the worker itself peaked at 0.8 GB (target alone) and 1.4 GB (target and its 26-layer draft).
* The set-up's ``speculative`` is ONNX Runtime GenAI's own ``speculative`` section of
  ``genai_config.json`` (``max_draft_tokens``, ``ngram_size``, ``ngram_chained_lookup``,
  ``min_adaptive_k``, ``cooldown``), plus ``draft_model``: the draft's Hugging Face folder, which
  becomes the configuration's ``model.draft`` decoder (base speculative decoding). Null: the
  control, the same exported target without either. Unknown names are a set-up error.
* The worker runs a folder of its own under ``CACHE/runs/`` (hard links to the exports) whose
  configuration sets ``model.eos_token_id`` to ``[]``: the engine never stops by itself and the
  worker stops each generation at the request's ``eos_ids`` (the EOS kept) or ``max_tokens``.
* One request: one ``Generator`` per seed, one after the other (ONNX Runtime GenAI speculates at
  batch size 1 only), seeded with ``random_seed``; temperature 0 is greedy (``do_sample`` off),
  ``top_k`` null is 0 (no top-k), ``top_p`` null is 1.0; ``min_p`` has no equivalent: a request that
  sets it is answered with an error.
* Counters: ``Generator.get_speculative_stats()``'s ``draft_tokens_proposed`` (drafted) and
  ``draft_tokens_accepted``, summed over the request's seeds; null for the control. Proposed counts
  every token of a round's proposal, those after its first rejection too (as vLLM's drafted count
  does); the engine's own ``acceptance_rate`` divides by ``draft_tokens_evaluated`` instead.

Environment that the worker reads (stated in the ready answer's settings):
``ORTGENAI_WORKER_PRECISION`` (the builder's ``-p``, default fp32).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# The protocol's plumbing, shared with the other workers, lies beside this script: loaded by its path
# (not through the lab's package, which this interpreter lacks; nor through sys.path, which -P lacks).
_SPEC = importlib.util.spec_from_file_location("engine_worker_protocol", Path(__file__).resolve().with_name("_protocol.py"))
protocol = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(protocol)

EXPORT_TIMEOUT_S = 1800  # one builder run on 2 shared cores (a 135M model: ~30 s)
SPECULATIVE_OPTIONS = {"max_draft_tokens": int, "ngram_size": int, "ngram_chained_lookup": bool,
                       "min_adaptive_k": int, "cooldown": bool}
DRAFT_KEY = "draft_model"
MODEL_FILES = ("config.json", "generation_config.json")  # with every *.safetensors: what an export depends on


def _int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if (not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        bounds = "" if minimum is None else f" in [{minimum}, {'∞' if maximum is None else maximum}]"
        raise ValueError(f"{name} must be an integer{bounds}, got {value!r}")
    return value


def _ids(value: Any, name: str, *, nonempty: bool, maximum: int = 2**31 - 1) -> list[int]:
    if not isinstance(value, list) or (nonempty and not value):
        raise ValueError(f"{name} must be a {'non-empty ' if nonempty else ''}list of integers")
    return [_int(item, f"each of {name}", 0, maximum) for item in value]


def _hf_folder(value: Any, name: str) -> Path:
    if not isinstance(value, str) or not (Path(value) / "config.json").is_file():
        raise ValueError(f"{name} must be a Hugging Face folder with a config.json, got {value!r}")
    return Path(value).resolve()


def speculative_section(speculative: Any) -> tuple[dict[str, Any], Path | None]:
    """The set-up's ``speculative`` checked: ONNX Runtime GenAI's ``speculative`` section and the
    draft's folder (``None``: n-gram lookup alone). ``ValueError`` for anything else."""
    if not isinstance(speculative, dict):
        raise ValueError(f"the set-up's speculative must be an object or null, got {speculative!r}")
    unknown = sorted(set(speculative) - set(SPECULATIVE_OPTIONS) - {DRAFT_KEY})
    if unknown:
        raise ValueError(f"unknown speculative options {unknown}: this worker knows {DRAFT_KEY}, {', '.join(SPECULATIVE_OPTIONS)}")
    section = {}
    for name, kind in SPECULATIVE_OPTIONS.items():
        if name in speculative:
            value = speculative[name]
            if kind is bool and not isinstance(value, bool):
                raise ValueError(f"speculative {name} must be true or false, got {value!r}")
            section[name] = value if kind is bool else _int(value, f"speculative {name}", 0)
    draft = _hf_folder(speculative[DRAFT_KEY], f"speculative {DRAFT_KEY}") if DRAFT_KEY in speculative else None
    if draft is None and not section.get("ngram_size"):
        # ONNX Runtime GenAI would quietly decode without speculation: a row that says it speculates must.
        raise ValueError(f"the set-up's speculative enables no speculation: give {DRAFT_KEY} or ngram_size")
    return section, draft


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def export_key(folder: Path, builder_version: str, precision: str) -> str:
    """What an export of ``folder`` depends on: the builder, the precision, the folder and its files
    (names, sizes, modification times; the weights are not read)."""
    files = sorted({*(folder / name for name in MODEL_FILES), *folder.glob("*.safetensors")})
    stamps = [(path.name, path.stat().st_size, path.stat().st_mtime_ns) for path in files if path.is_file()]
    return _digest([builder_version, precision, str(folder), stamps])


def export(folder: Path, cache: Path, builder_version: str, precision: str) -> Path:
    """``folder`` exported to ONNX by onnxruntime_genai's model builder, once (reused after)."""
    done = cache / "exports" / f"{folder.name[:40]}-{export_key(folder, builder_version, precision)}"
    if (done / "genai_config.json").is_file():
        return done
    work = done.with_name(f".tmp-{done.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(work / "model"),
               "-p", precision, "-e", "cpu", "-c", str(work / "builder-cache")]
    # The builder prints its progress: to fd 1, which is the log here (main moved it to stderr).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, env=env, timeout=EXPORT_TIMEOUT_S, check=False)
        if result.returncode != 0 or not (work / "model" / "genai_config.json").is_file():
            raise RuntimeError(f"exporting {folder} to ONNX failed (the builder exited {result.returncode}; see the log)")
        try:
            os.rename(work / "model", done)
        except OSError:
            if not (done / "genai_config.json").is_file():  # else another worker made it first: same key, same export
                raise
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"exporting {folder} to ONNX took over {EXPORT_TIMEOUT_S} s") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done


def _link_files(source: Path, destination: Path) -> None:
    """Every file of ``source`` in ``destination``: hard links (an export is hundreds of MB), else copies."""
    destination.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "genai_config.json":
            try:
                os.link(path, destination / path.name)
            except OSError:
                shutil.copy2(path, destination / path.name)


def run_folder(cache: Path, target: Path, draft: Path | None, config: dict[str, Any]) -> Path:
    """The folder the engine loads: the target export's files, the draft's under ``draft/``, and
    ``config`` as its genai_config.json; made once per configuration, renamed into place."""
    done = cache / "runs" / _digest([str(target), str(draft), config])
    if (done / "genai_config.json").is_file():
        return done
    work = done.with_name(f".tmp-{done.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        _link_files(target, work)
        if draft is not None:
            _link_files(draft, work / "draft")
        (work / "genai_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
        try:
            os.rename(work, done)
        except OSError:
            if not (done / "genai_config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done


def engine_config(target: Path, draft: Path | None, section: dict[str, Any] | None, threads: int | None) -> dict[str, Any]:
    """The run's genai_config.json: the target export's, its EOS list emptied (the worker stops on the
    request's), the threads set, and with speculation its ``speculative`` section and draft decoder."""
    config = json.loads((target / "genai_config.json").read_text(encoding="utf-8"))
    model = config["model"]
    model["eos_token_id"] = []
    decoders = [model["decoder"]]
    if draft is not None:
        draft_model = json.loads((draft / "genai_config.json").read_text(encoding="utf-8"))["model"]
        if draft_model.get("vocab_size") != model.get("vocab_size"):
            raise ValueError(f"the draft's vocabulary ({draft_model.get('vocab_size')}) is not the target's ({model.get('vocab_size')})")
        model["draft"] = dict(draft_model["decoder"], filename=f"draft/{draft_model['decoder']['filename']}")
        decoders.append(model["draft"])
    for decoder in decoders:  # the target's and the draft's execution settings must be identical
        options = decoder.setdefault("session_options", {})
        if threads is not None:
            options["intra_op_num_threads"] = threads
    if section is not None:
        config["speculative"] = section
    return config


class Engine:
    """One ONNX Runtime GenAI model as the set-up asks; ``settings`` is what the ready answer states."""

    def __init__(self, setup: dict[str, Any]) -> None:
        target_folder = _hf_folder(setup.get("model"), "the set-up's model")
        speculative = setup.get("speculative")
        section, draft_folder = (None, None) if speculative is None else speculative_section(speculative)
        threads = setup.get("threads")
        threads = None if threads is None else _int(threads, "threads", 1)
        cache = setup.get("cache")
        if not isinstance(cache, str) or not cache:
            raise ValueError(f"the set-up's cache must be a folder the worker may write, got {cache!r}")
        precision = os.environ.get("ORTGENAI_WORKER_PRECISION", "fp32")

        import onnxruntime_genai as og

        self.og = og
        version = getattr(og, "__version__", "?")
        cache_folder = Path(cache)
        target = export(target_folder, cache_folder, version, precision)
        draft = None if draft_folder is None else export(draft_folder, cache_folder, version, precision)
        config = engine_config(target, draft, section, threads)
        self.model = og.Model(str(run_folder(cache_folder, target, draft, config)))
        self.vocab_size = int(config["model"]["vocab_size"])
        self.context_length = int(config["model"].get("context_length") or config["search"]["max_length"])
        self.speculative = section is not None
        self.settings: dict[str, Any] = {
            "engine": f"onnxruntime-genai {version}",
            "onnxruntime": _installed("onnxruntime"),
            "api": "onnxruntime_genai Model/GeneratorParams/Generator, in-process; one Generator per seed, in turn",
            "model": str(target_folder),
            "draft_model": None if draft_folder is None else str(draft_folder),
            "export": f"python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p {precision} -e cpu",
            "precision": precision,
            "execution_provider": "cpu",
            "speculative": None if section is None else json.dumps(section, sort_keys=True),
            "speculative_effective": None,
            "eos": "genai_config eos_token_id = [] (the engine never stops itself); the worker stops at the request's eos_ids, the EOS kept",
            "top_k_none": 0,
            "top_p_none": 1.0,
            "temperature_0": "greedy (do_sample false)",
            "min_p": "not supported: a request with min_p is an error",
            "seeds": "search option random_seed per Generator",
            "counters": ("get_speculative_stats draft_tokens_proposed (every proposed token), draft_tokens_accepted, "
                         "summed over seeds") if self.speculative else None,
            "threads": threads,
            "ORTGENAI_WORKER_PRECISION": os.environ.get("ORTGENAI_WORKER_PRECISION"),
        }
        if self.speculative:
            # What the engine says it applies (options it defaulted included), read back from it.
            effective = og.GeneratorParams(self.model).get_speculative_options()
            self.settings["speculative_effective"] = json.dumps(effective, sort_keys=True, default=str)

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request: every seed's generated ids (in the seeds' order) and this request's counters."""
        prompt = _ids(request.get("prompt_ids"), "prompt_ids", nonempty=True, maximum=self.vocab_size - 1)
        seeds = _ids(request.get("seeds"), "seeds", nonempty=True)
        max_tokens = _int(request.get("max_tokens"), "max_tokens", 1, self.context_length - len(prompt))
        temperature = protocol.number_or_null(request.get("temperature"), "temperature")
        top_k = request.get("top_k")
        top_k = 0 if top_k is None else _int(top_k, "top_k", 0, self.vocab_size)
        top_p = protocol.number_or_null(request.get("top_p"), "top_p")
        if protocol.number_or_null(request.get("min_p"), "min_p") is not None:
            raise ValueError("onnxruntime-genai has no min_p: this policy cannot run on it")
        eos = set(_ids(request.get("eos_ids", []), "eos_ids", nonempty=False))
        greedy = temperature == 0.0
        search = {"do_sample": not greedy, "temperature": 1.0 if temperature is None or greedy else temperature,
                  "top_k": top_k, "top_p": 1.0 if top_p is None else top_p, "max_length": len(prompt) + max_tokens}
        outputs, drafted, accepted = [], 0, 0
        for seed in seeds:
            params = self.og.GeneratorParams(self.model)
            params.set_search_options(random_seed=seed, **search)
            generator = self.og.Generator(self.model, params)
            generator.append_tokens([prompt])
            tokens: list[int] = []
            while len(tokens) < max_tokens and not generator.is_done():
                generator.generate_next_token()
                tokens.append(int(generator.get_next_tokens()[0]))
                if tokens[-1] in eos:
                    break
            outputs.append(tokens)
            if self.speculative:
                stats = generator.get_speculative_stats()
                drafted += int(stats["draft_tokens_proposed"])
                accepted += int(stats["draft_tokens_accepted"])
        if not self.speculative:
            return {"outputs": outputs, "drafted": None, "accepted": None}
        return {"outputs": outputs, "drafted": drafted, "accepted": accepted}


def _installed(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main() -> int:
    """Serve the protocol on stdin/stdout; the exit status (0 when stdin closed, 1 for a failed set-up)."""
    # Whatever the engine, its builder or a C library prints lands in the log (stderr), never in the answers.
    return protocol.serve(Engine, set_up_failed="onnxruntime-genai worker set-up failed: ",
                          generate_failed="onnxruntime-genai: ")


if __name__ == "__main__":
    sys.exit(main())
