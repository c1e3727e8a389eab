"""Running the verdict table: which engines run here, their jobs, and the table file they fill."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from diagnostics.policy import Policy
from diagnostics.verdicts.engines import ASSISTANT, EAGLE3_HEAD, GAMMA, POLICIES, TRANSFORMERS_ROWS, EngineRow, ours_generator, transformers_generator, transformers_version
from diagnostics.verdicts.table import (BATCH, Job, audited_controls, evidence_file, load_table, row_verdict, run_row, save_table,
                                        scores_auditor, stored_row, target_auditor, upsert)

# Raw prompts (no chat template: every engine gets the same text): one a prompt-lookup engine
# can draft from (it repeats itself), one it mostly cannot.
PROMPTS = ("The cat sat on the mat. The cat sat on the mat. The cat sat on the",
           "Once upon a time, in a small village by the sea, there lived")
OURS = EngineRow("ours", "this lab's engine (lossless, γ = 4)", "ours", {"draft": "the assistant/draft model", "gamma": 4})
LLAMA_CPP = EngineRow("llama-cpp-python", "llama-cpp-python server, prompt-lookup decoding", "server",
                      {"draft_model": "prompt-lookup-decoding", "draft_model_num_pred_tokens": 4, "n_threads": 1})
LLAMA_SERVER = EngineRow("llama-server", "llama.cpp llama-server, draft model (-md)", "llama-server",
                         {"draft_model": "the early-exit draft as a GGUF", "draft_max": 4})
VLLM_ROWS = [
    EngineRow("vllm-ngram", "vLLM (CPU build), n-gram speculation", "vllm",
              {"method": "ngram", "num_speculative_tokens": GAMMA, "prompt_lookup_max": 4, "prompt_lookup_min": 1}),
    EngineRow("vllm-draft", "vLLM (CPU build), draft model", "vllm",
              {"method": "draft_model", "model": ASSISTANT, "num_speculative_tokens": GAMMA}),
    EngineRow("vllm-eagle3", "vLLM (CPU build), EAGLE-3 head (untrained)", "vllm",
              {"method": "eagle3", "model": EAGLE3_HEAD, "num_speculative_tokens": GAMMA}),
]
OPENVINO_ROWS = [
    EngineRow("openvino-draft", "OpenVINO GenAI, draft model", "openvino", {"draft_model": ASSISTANT, "num_assistant_tokens": GAMMA}),
    EngineRow("openvino-prompt-lookup", "OpenVINO GenAI, prompt lookup", "openvino",
              {"prompt_lookup": True, "num_assistant_tokens": GAMMA, "max_ngram_size": 3}),
]
ONNXRUNTIME_GENAI_ROWS = [
    EngineRow("onnxruntime-genai-draft", "ONNX Runtime GenAI, draft model", "onnxruntime-genai",
              {"draft_model": ASSISTANT, "max_draft_tokens": GAMMA}),
    EngineRow("onnxruntime-genai-ngram", "ONNX Runtime GenAI, n-gram lookup", "onnxruntime-genai",
              {"ngram_size": 3, "max_draft_tokens": GAMMA}),
]
VENV_KINDS = ("vllm", "openvino", "onnxruntime-genai")  # engines in their own environment, driven through a worker (``venv_engine``)
# In-process engines whose generators count their drafts: a kept row made before the table kept the
# counts gets them by replay (``--count-drafts``). Servers report theirs in each answer, or none.
REPLAYABLE = ("transformers", "universal", "ours", "mutant")
ENDPOINT = "endpoint"
# The control each kind of row shares (speculation off): its file's name.
CONTROLS = {"transformers": "transformers-plain", "universal": "transformers-plain", "ours": "ours-plain", "mutant": "ours-plain", "server": "llama-cpp-python-plain",
            "llama-server": "llama-server-plain", "vllm": "vllm-plain", "openvino": "openvino-plain",
            "onnxruntime-genai": "onnxruntime-genai-plain"}


def mutant_rows() -> list[EngineRow]:
    """Our engine with each planted engine bug (``audit.mutants``): each row must come out ``fail``."""
    from diagnostics.audit import BATCH_MUTANTS, ENGINE_MUTANTS

    return [EngineRow(f"mutant:{name}", f"planted bug: {description}", "mutant", {"gamma": 4})
            for name, (description, _) in {**ENGINE_MUTANTS, **BATCH_MUTANTS}.items()]


def engine_rows() -> dict[str, EngineRow]:
    """Every engine ``--engine`` names, mutants included."""
    return {row.name: row for row in [*TRANSFORMERS_ROWS, OURS, LLAMA_CPP, LLAMA_SERVER, *VLLM_ROWS, *OPENVINO_ROWS,
                                      *ONNXRUNTIME_GENAI_ROWS, *mutant_rows()]}


def chosen_rows(names: list[str]) -> list[EngineRow]:
    """``--engine`` values to rows: ``all`` (every real engine here, those in their own environment
    aside: they are installed on demand), ``transformers``, ``vllm``, ``openvino``, ``mutants``, or
    names; an unknown one is refused naming the choices."""
    rows = engine_rows()
    real = [*TRANSFORMERS_ROWS, OURS, LLAMA_CPP, LLAMA_SERVER]
    out: list[EngineRow] = []
    for name in names:
        if name == "all":
            out += real
        elif name == "transformers":
            out += TRANSFORMERS_ROWS
        elif name == "mutants":
            out += mutant_rows()
        elif name == "vllm":
            out += VLLM_ROWS
        elif name == "openvino":
            out += OPENVINO_ROWS
        elif name == "onnxruntime-genai":
            out += ONNXRUNTIME_GENAI_ROWS
        elif name in rows:
            out.append(rows[name])
        else:
            raise ValueError(f"unknown engine {name[:60]!r}: use all, transformers, vllm, openvino, onnxruntime-genai, mutants or one of "
                             f"{', '.join(rows)}")
    return list({row.name: row for row in out}.values())


@dataclass
class Setup:
    """The target, the early-exit draft (transformers' assistant and our draft), EOS ids, prompts."""

    target: Any  # None with --oracle server: the server's scores are the oracle, its tokenizer makes the ids
    draft: Any
    layer: int
    eos: set[int]
    prompts: list[tuple[str, list[int]]]
    gguf: Path | None  # the embedded GGUF (the llama.cpp servers' model), None for another target
    name: str = ""  # the target as the table names it
    target_source: str = ""  # what --target named (an engine in its own environment loads it itself)
    draft_source: str | None = None  # what --draft named (None: the early exit of the target)


def load_setup(target_spec: str, layer: int | None, prompts: list[str] | None, draft_spec: str | None = None) -> Setup:
    """The target, its draft (``draft_spec``, a model path or hub id, else the target's first
    ``layer`` layers as a model), EOS ids and the prompts' ids (raw: no chat template)."""
    from diagnostics.audit.suite import DEFAULT_EARLY_EXIT_LAYER
    from diagnostics.engine import eos_ids
    from diagnostics.models import DEFAULT_TARGET, check_vocabularies, early_exit_model, embedded_gguf_path, load_model
    from diagnostics.runner import encode_prompt

    target = load_model(target_spec)
    layer = layer if layer is not None else max(1, min(DEFAULT_EARLY_EXIT_LAYER, target.num_layers - 1))
    if not 1 <= layer < target.num_layers:
        raise ValueError(f"--early-exit must lie in [1, {target.num_layers - 1}] for this target, got {layer}")
    if draft_spec is not None:
        draft = load_model(draft_spec)
        check_vocabularies(target, draft)
    else:
        draft = early_exit_model(target, layer)
    texts = list(prompts or PROMPTS)
    return Setup(target, draft, layer, eos_ids(target, None),
                 [(text, encode_prompt(target, text, raw=True)) for text in texts],
                 embedded_gguf_path() if target_spec == DEFAULT_TARGET else None, target.name, target_spec, draft_spec)


@dataclass(frozen=True)
class SetupSpec:
    """What ``load_setup`` loads, as plain values a worker process can load again."""

    target: str
    layer: int | None = None
    prompts: tuple[str, ...] | None = None
    draft: str | None = None


_SETUPS: dict[SetupSpec, Setup] = {}
_GENERATORS: dict[tuple, tuple[Any, Any, str]] = {}


def cached_setup(spec: SetupSpec) -> Setup:
    """``load_setup`` once per process (the command's and each worker's)."""
    if spec not in _SETUPS:
        _SETUPS[spec] = load_setup(spec.target, spec.layer, list(spec.prompts) if spec.prompts else None, spec.draft)
    return _SETUPS[spec]


def worker_chunk(spec: SetupSpec, row_name: str, policy: Policy, max_tokens: int, speculative: bool, prompt_ids: list[int],
                 seeds: list[int]) -> list:
    """One chunk of seeds generated in a worker process (``--workers``): each seed's tokens, or the
    exception it raised; the same tokens the command's own process gives for those seeds. Where the
    engine counts its drafts, ``{"outputs": …, "counters": this chunk's counts}``."""
    from diagnostics.verdicts.replay import counted_chunk

    key = (spec, row_name, policy, max_tokens)
    if key not in _GENERATORS:
        _GENERATORS[key] = _generators(engine_rows()[row_name], cached_setup(spec), policy, max_tokens)
    # The engine's counts for this chunk alone: the verdict table's proof that speculation ran,
    # summed over the workers' chunks (``table.fill``).
    return counted_chunk(_GENERATORS[key][0 if speculative else 1], prompt_ids, seeds)


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)  # one worker per core: two threads each would fight over the cores


@contextmanager
def worker_pool(workers: int) -> Iterator[Any]:
    """``workers`` spawned processes of one torch thread each (``None`` for one: generate here)."""
    if workers < 2:
        yield None
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_one_thread)
    try:
        yield pool
    except BaseException:
        # Interrupted: end the workers now (each would finish its chunk first); the files hold what was written.
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def server_setup(model: str, prompts: list[str] | None) -> Setup:
    """No local model (``--oracle server``): the server tokenizes and its scores are the oracle."""
    return Setup(None, None, 0, set(), [(text, []) for text in (prompts or PROMPTS)], None, model)


def policy_name(policy: Policy) -> str:
    """A policy's short name, as ``POLICIES`` names them: ``t1``, ``t1-top-k-20``."""
    name = f"t{policy.temperature:g}"
    for field, value in (("top-k", policy.top_k), ("top-p", policy.top_p), ("min-p", policy.min_p)):
        if value is not None:
            name += f"-{field}-{value:g}"
    return name


def mutant_policy(row: EngineRow) -> Policy:
    """A planted bug shows under the policy it was planted for (truncation bugs need top-k)."""
    from diagnostics.audit import ENGINE_MUTANT_POLICY

    return Policy(**ENGINE_MUTANT_POLICY.get(row.name.split(":", 1)[1], {}))


def _generators(row: EngineRow, setup: Setup, policy: Policy, max_tokens: int) -> tuple[Any, Any, str]:
    """Speculation on and off generators for an in-process row, and its version."""
    if row.kind == "universal":
        from diagnostics.verdicts.universal import universal_assistant, universal_generator

        assistant, assistant_tokenizer = universal_assistant(setup.target, setup.layer)
        make = lambda on: universal_generator(setup.target, assistant, assistant_tokenizer, policy, max_tokens, setup.eos,  # noqa: E731
                                              speculative=on)
        return make(True), make(False), transformers_version()
    if row.kind == "transformers":
        make = lambda on: transformers_generator(row, setup.target, setup.draft, setup.layer, policy, max_tokens, setup.eos, on)  # noqa: E731
        return make(True), make(False), transformers_version()
    from diagnostics import __version__

    seams = None
    if row.kind == "mutant":
        from diagnostics.audit import BATCH_MUTANTS, ENGINE_MUTANTS

        seams = {**ENGINE_MUTANTS, **BATCH_MUTANTS}[row.name.split(":", 1)[1]][1]
    make = lambda on: ours_generator(setup.target, setup.draft, policy, max_tokens, setup.eos, on, seams)  # noqa: E731
    return make(True), make(False), f"spec-verify-lab {__version__}"


@dataclass
class Endpoints:
    """A user's servers for an ``endpoint`` row: the same model served with speculation on and off."""

    on: str
    off: str
    model: str
    version: str
    api_key: str | None = None
    scores_api: str | None = None  # "vllm" or "sglang": audit against the server's own scores (--oracle server)
    score_logprobs: int = 20


def endpoint_row(label: str, settings: dict[str, Any]) -> EngineRow:
    """The row of a user's engine behind ``--endpoint``: named by ``--label``, its speculative
    settings as the user states them (``--settings``: they are the row's claim, shown as given)."""
    return EngineRow(ENDPOINT, label, ENDPOINT, dict(settings))


@contextmanager
def _sources(row: EngineRow, setup: Setup, policy: Policy, max_tokens: int, stem: Path,
             endpoints: Endpoints | None) -> Iterator[tuple[str, bool, dict[bool, Any], dict[str, Any]]]:
    """What generates each side of ``row`` (speculation on → True): in-process generators, or
    collectors from servers started here for the row's time (logs at ``stem``--on.log / --off.log)
    or the user's endpoints. Yields (version, whether the two sides run side by side, sources, settings
    the engine applies beyond the row's own)."""
    from diagnostics.verdicts.servers import endpoint_collector

    if row.kind in VENV_KINDS:
        with _venv_sources(row, setup, policy, max_tokens, stem) as sources:
            yield sources
        return
    if row.kind not in (ENDPOINT, "server", "llama-server"):
        generator_on, generator_off, version = _generators(row, setup, policy, max_tokens)
        yield version, False, {True: generator_on, False: generator_off}, {}
        return
    tokenize = None if setup.target is None else (
        lambda text: setup.target.tokenizer(text, add_special_tokens=False)["input_ids"])
    eos_id = min(setup.eos) if setup.eos else None
    if row.kind == ENDPOINT:
        if endpoints is None:
            raise ValueError("an endpoint row needs --endpoint URL (speculation on) and --baseline-endpoint URL (off)")
        scores = {"scores_api": endpoints.scores_api, "score_logprobs": endpoints.score_logprobs} if endpoints.scores_api else {}
        yield endpoints.version, True, {
            True: endpoint_collector(endpoints.on, endpoints.model, policy, max_tokens, True, row.label, tokenize, eos_id,
                                     api_key=endpoints.api_key, **scores),
            False: endpoint_collector(endpoints.off, endpoints.model, policy, max_tokens, False, row.label, tokenize, eos_id,
                                      api_key=endpoints.api_key, **scores)}, {}
        return
    if setup.gguf is None:
        raise ValueError(f"the {row.name} row serves the embedded GGUF: run it with --target default")
    if row.kind == "server":
        from diagnostics.verdicts.servers import llama_cpp_server, llama_cpp_version

        version, stated = llama_cpp_version(), {}
        start = lambda on, log: llama_cpp_server(setup.gguf, on, log)  # noqa: E731
    else:
        from diagnostics.verdicts.llama_server import draft_gguf, llama_server, llama_server_settings, llama_server_version

        version, stated = llama_server_version(), llama_server_settings(GAMMA)
        draft = draft_gguf(setup.layer)  # cached under data/llama.cpp/drafts
        start = lambda on, log: llama_server(setup.gguf, draft if on else None, log, draft_max=GAMMA)  # noqa: E731
    with start(True, stem.with_name(stem.name + "--on.log")) as url_on, start(False, stem.with_name(stem.name + "--off.log")) as url_off:
        # llama-server answers its own /completion with the ids it generated: nothing is retokenised or left out.
        options = {"api": "llama.cpp"} if row.kind == "llama-server" else {}
        yield version, True, {on: endpoint_collector(url, "smollm2", policy, max_tokens, on, row.label, tokenize, eos_id, **options)
                              for on, url in ((True, url_on), (False, url_off))}, stated


def _local_or_hub(spec: str) -> str:
    return str(Path(spec).resolve()) if Path(spec).is_dir() else spec


def engine_models(setup: Setup, needs_draft: bool) -> tuple[str, str | None]:
    """The target and draft as an engine in its own environment loads them: Hugging Face folders
    (the embedded target's converted copy and its early exit), or the folders or hub ids that
    --target and --draft named."""
    from diagnostics.models import DEFAULT_TARGET, embedded_hf_folder
    from diagnostics.verdicts.venv_engine import draft_folder

    embedded = setup.target_source == DEFAULT_TARGET
    target = str(embedded_hf_folder()) if embedded else _local_or_hub(setup.target_source)
    if not needs_draft:
        return target, None
    if setup.draft_source is not None:
        return target, _local_or_hub(setup.draft_source)
    if embedded:
        return target, str(draft_folder(setup.layer))
    raise ValueError("this engine loads its draft as a model of its own: give --draft FOLDER or hub id")


def _eagle3_head(setup: Setup) -> str:
    """The folder of the EAGLE-3 head an engine's EAGLE-3 row loads: made for the embedded target."""
    from diagnostics.models import DEFAULT_TARGET
    from diagnostics.verdicts.venv_engine import eagle3_head_folder

    if setup.target_source != DEFAULT_TARGET:
        raise ValueError("an EAGLE-3 row makes its untrained head for the embedded target: run it with --target default")
    return str(eagle3_head_folder(setup.target))


@contextmanager
def _venv_sources(row: EngineRow, setup: Setup, policy: Policy, max_tokens: int,
                  stem: Path) -> Iterator[tuple[str, bool, dict[bool, Any], dict[str, Any]]]:
    """Workers in the engine's own environment (``venv_engine``), speculation on and off, each
    started at its first request (so an engine that cannot start is its side's outcome) and closed
    after the row; the settings the engine states of itself are added to the row's."""
    from diagnostics.verdicts.venv_engine import (ENGINES, WorkerProcess, bounded_settings, engine_cache, installed_version,
                                                   venv_generator)

    engine = ENGINES[row.kind]
    python = engine.python()  # not built: the command's one-line error, with the script to run
    target, draft = engine_models(setup, any(value == ASSISTANT for value in row.speculative.values()))
    head = _eagle3_head(setup) if EAGLE3_HEAD in row.speculative.values() else None
    speculative = {name: (draft if value == ASSISTANT else head if value == EAGLE3_HEAD else value)
                   for name, value in row.speculative.items()}
    stated: dict[str, Any] = {}
    workers, generators = {}, {}
    for on in (True, False):
        workers[on] = WorkerProcess([str(python), str(engine.worker_path())], stem.with_name(f"{stem.name}--{'on' if on else 'off'}.log"))
        setup_line = {"model": target, "speculative": speculative if on else None, "cache": str(engine_cache(engine)),
                      "threads": os.cpu_count() or 1}
        generators[on] = venv_generator(workers[on], setup_line, policy, max_tokens, setup.eos, on,
                                        source=f"{engine.name}'s own metrics, as its worker reports them per request",
                                        batch_size=engine.batch_size)
    try:
        yield installed_version(engine), False, generators, stated
    finally:
        for on, worker in workers.items():
            ready = generators[on].ready.get("ready")  # type: ignore[attr-defined]
            if on and ready:
                stated["engine"] = ready["engine"]
                stated["engine_settings"] = bounded_settings(ready["settings"])
            worker.close()


def run_table(rows: list[EngineRow], policy_names: list[str], setup: Setup, *, out: Path, evidence: Path, store: Any,
              detect_tv: float, level: float, max_tokens: int, rerun: bool = False, endpoints: Endpoints | None = None,
              spec: SetupSpec | None = None, workers: int = 1, count_drafts: int = 0,
              say: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> list[dict[str, Any]]:
    """Fill each ``(row, policy)`` of the table at ``out`` (kept rows whose evidence is unchanged are
    skipped unless ``rerun``), writing the table after every row; returns the rows run or kept.
    With ``spec`` and ``workers`` > 1, in-process engines generate their chunks of seeds in that
    many worker processes (one torch thread each), the files written here in seed order. With
    ``count_drafts``, a kept row of an in-process engine whose speculation-on side has no draft
    counters gets them by replaying that many of its stored generations (``replay``)."""
    in_process = spec is not None and any(row.kind not in (ENDPOINT, "server", "llama-server", *VENV_KINDS) for row in rows)
    with worker_pool(workers if in_process else 1) as pool:
        return _run_table(rows, policy_names, setup, out=out, evidence=evidence, store=store, detect_tv=detect_tv, level=level,
                          max_tokens=max_tokens, rerun=rerun, endpoints=endpoints, spec=spec, workers=workers, pool=pool,
                          count_drafts=count_drafts, say=say)


def _run_table(rows: list[EngineRow], policy_names: list[str], setup: Setup, *, out: Path, evidence: Path, store: Any,
               detect_tv: float, level: float, max_tokens: int, rerun: bool, endpoints: Endpoints | None,
               spec: SetupSpec | None, workers: int, pool: Any, say: Callable[[str], None],
               count_drafts: int = 0) -> list[dict[str, Any]]:
    table = load_table(out)
    auditor_is_scores = endpoints is not None and endpoints.scores_api is not None
    if auditor_is_scores:
        auditor = scores_auditor(detect_tv, level)
    else:
        auditor = target_auditor(setup.target, setup.eos, detect_tv, level)
    evidence.mkdir(parents=True, exist_ok=True)
    audited = audited_controls(table)
    rerun_controls: set[Path] = set()
    done = []
    for row in rows:
        policies = {policy_name(mutant_policy(row)): mutant_policy(row)} if row.kind == "mutant" else {
            name: POLICIES[name] for name in policy_names}
        for name, policy in policies.items():
            made_under = {"max_tokens": max_tokens, "prompts": [text for text, _ in setup.prompts], "detect_tv": detect_tv,
                          "level": level}
            kept = None if rerun else stored_row(table, row.name, name, evidence, made_under)
            if kept is not None:
                say(f"{row.name} · {name}: kept ({kept['verdict']}), its evidence unchanged")
                if count_drafts and "speculation" not in kept["on"] and row.kind in REPLAYABLE:
                    kept = _count_drafts(kept, row, name, policy, setup, evidence, max_tokens, spec, workers, pool, count_drafts, say)
                    upsert(table, kept)
                    save_table(out, table)
                done.append(kept)
                continue
            stem = f"{row.name.replace(':', '-')}--{name}"
            # Speculation off is the same program for every row of a kind (plain sampling in
            # transformers, in our engine, the server without a draft): one file per policy.
            control = CONTROLS.get(row.kind, row.name)
            paths = {True: evidence / f"{stem}--on.jsonl", False: evidence / f"{control}--{name}--off.jsonl"}
            if rerun:
                paths[True].unlink(missing_ok=True)
                for side in ("on", "off"):  # an engine's log is appended to while a row continues; a new row starts it anew
                    (evidence / f"{stem}--{side}.log").unlink(missing_ok=True)
                if paths[False] not in rerun_controls:  # a control shared by several rerun rows is made once
                    paths[False].unlink(missing_ok=True)
                    rerun_controls.add(paths[False])

            shown: dict[str, int] = {}

            def progress(side: str, count: int, total: int, label: str = f"{row.name} · {name}") -> None:
                if count >= total or count - shown.get(side, 0) >= total / 10:  # about every tenth
                    shown[side] = count
                    say(f"{label} · speculation {side}: {count:,} / {total:,} tokens")

            jobs = {on: Job(row, name, policy, on, setup.prompts, max_tokens, paths[on], control) for on in (True, False)}
            with _sources(row, setup, policy, max_tokens, evidence / stem, endpoints) as (version, parallel, sources, stated):
                for on in (True, False):
                    if row.kind in (ENDPOINT, "server", "llama-server"):
                        jobs[on].collect = sources[on]
                    else:
                        jobs[on].generator = sources[on]
                        if pool is not None and spec is not None and row.kind not in VENV_KINDS:
                            jobs[on].submit = partial(pool.submit, worker_chunk, spec, row.name, policy, max_tokens, on)
                            jobs[on].workers = workers
                result = run_row(jobs[True], jobs[False], auditor, setup.eos, detect_tv=detect_tv, level=level, store=store,
                                 version=version, target_name=setup.name, progress=progress, parallel=parallel,
                                 audited=audited)
            result["settings"].update(stated)  # settings the engine applies that the row's name does not say
            result["oracle"] = (f"the server's own scores ({endpoints.scores_api})" if auditor_is_scores
                                else "teacher forcing on a local copy of the target")
            upsert(table, result)
            save_table(out, table)
            p_value, tokens = result["on"].get("p_value"), result["on"].get("tokens")
            figures = (f"p = {p_value:.3g}, {tokens:,} tokens, " if isinstance(p_value, float) and isinstance(tokens, int)
                       else f"{' '.join(str(result['on'].get('error') or '').split())[:200]}; " if result["on"].get("error") else "")
            say(f"{row.name} · {name}: {result['verdict']} ({figures}{result['time_s']:.0f} s)")
            done.append(result)
    return done


def _count_drafts(kept: dict[str, Any], row: EngineRow, name: str, policy: Policy, setup: Setup, evidence: Path, max_tokens: int,
                  spec: SetupSpec | None, workers: int, pool: Any, count: int, say: Callable[[str], None]) -> dict[str, Any]:
    """``kept`` with the engine's draft counters on its speculation-on side, found by replaying the
    first ``count`` stored generations (``replay``); unchanged, with a line saying why, when a
    replayed generation does not give its stored tokens."""
    from diagnostics.audit.samples import load_samples
    from diagnostics.verdicts.replay import counting_call, replay, worker_call

    samples = load_samples(evidence_file(kept, "on", evidence))
    generator = _generators(row, setup, policy, max_tokens)[0]
    # The seeds per request ``table.fill`` gave this engine: a batch is replayed whole (its rows' sums
    # can depend on the batch), so the count is rounded up to whole batches.
    step = getattr(generator, "batch_size", BATCH) if getattr(generator, "batch", None) is not None else None
    count = count if step is None else -(-count // step) * step
    if pool is not None and spec is not None:
        start = worker_call(partial(pool.submit, worker_chunk, spec, row.name, policy, max_tokens, True))
    else:
        start = counting_call(generator)
    began = time.perf_counter()
    found = replay(samples, count, setup.eos, start, step)
    seconds = time.perf_counter() - began
    counters = found.counters
    if counters is None:
        say(f"{row.name} · {name}: drafts not counted: {found.replayed - found.identical} of {found.replayed} replayed "
            f"generations differ from the stored ones ({seconds:.0f} s); rerun the row (--rerun) to count them")
        return kept
    counted = {**kept, "on": {**kept["on"], "speculation": counters}}
    counted["verdict"] = row_verdict(counted["on"], counted["off"])
    say(f"{row.name} · {name}: {counters['accepted']:,} of {counters['drafted']:,} drafts kept over {found.replayed} replayed "
        f"generations, each the stored tokens ({seconds:.0f} s) → {counted['verdict']}")
    return counted
