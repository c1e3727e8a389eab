"""Collect generations from an OpenAI-compatible ``/v1/completions`` endpoint into a samples file.

The endpoint is reached through ``endpoint_client.Client`` (deadlines, retries, same-origin
redirects, bounded untrusted answers) and each answer is read as a ``Sample`` by
``completions.sample_from_answer`` (every setting stated, the engine's ids or the text
retokenised, the raw answer kept). The traps left to the collection itself:

* **Logprobs change the path.** vLLM ran requests that asked for logprobs without speculation, so
  the generation call never asks for them (scores, when wanted, come from a later call).
* **Scores come after.** With ``scores_api`` (``vllm`` or ``sglang``) each continuation is sent
  back, prompt ids then generated ids, in a separate request that generates nothing, and the
  server's teacher-forced log-probabilities are stored with the sample (``server_scores``).
* **A file the audit reads.** Generations are appended as they come, and the file stops before
  the loader's ``MAX_FILE_BYTES`` and ``MAX_SAMPLES``; ``--out`` is never a link and never
  overwritten (``check_out``).
* **Deadlines.** A whole collection ends within ``collect_timeout_s`` (``COLLECT_TIMEOUT_S``).

``seed`` is ``first_seed + i`` per generation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diagnostics.audit.completions import Sampling, openai_shape, sample_from_answer, server_tokenizer
from diagnostics.audit.endpoint_client import TIMEOUT_S, Client, EndpointError
from diagnostics.audit.samples import MAX_FILE_BYTES, MAX_SAMPLES, MAX_TOKENS, MAX_TOP, Sample, SamplesError
from diagnostics.audit.server_scores import SCORE_APIS, score_request, scores_from_sglang, scores_from_vllm

COLLECT_TIMEOUT_S = 6 * 3600.0  # a whole collection (one --out file)
COMPLETION_APIS = ("openai", "llama.cpp")  # /v1/completions, or llama-server's /completion with its ids


def check_out(out: Path, *, new: bool = False) -> None:
    """Refuse ``out`` (``--out``) when it is a symlink (dangling or not) or exists and is not a regular
    file, so generations never land where a link points; with ``new``, also when it exists at all
    (collected generations are never overwritten). The one check, for the CLI and the collector."""
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise EndpointError(f"{out} is a symlink or not a regular file: give --out a plain file path")
    if new and out.exists():
        raise EndpointError(f"{out} exists: give another --out (collected generations are never overwritten)")


def _open_out(out: Path):
    """``out`` opened to append, checked again (``check_out``) right before, and opened without
    following a link (``O_NOFOLLOW``)."""
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as error:
        raise EndpointError(f"cannot write {out} ({error.strerror}): give --out a plain file path") from None
    return os.fdopen(descriptor, "ab")


def collect(endpoint: str, model: str, prompts: list[str], out: str | Path, *, n: int = 100, sampling: Sampling = Sampling(),
            first_seed: int = 0, speculative: bool | None = None, tokenize: Callable[[str], list[int]] | None = None,
            eos_id: int | None = None, rate: float = 20.0, api_key: str | None = None,
            progress: Callable[[int, int], None] | None = None,
            should_stop: Callable[[], bool] | None = None, scores_api: str | None = None, score_logprobs: int = 20,
            timeout_s: float = TIMEOUT_S, collect_timeout_s: float = COLLECT_TIMEOUT_S, api: str = "openai") -> Path:
    """``n`` generations of each prompt from ``endpoint``, appended to ``out`` as they come (a
    stop or a crash keeps what was collected); with ``scores_api``, each scored by the server
    afterwards (its top ``score_logprobs``). Each request ends within ``timeout_s`` (its retries
    within ``RETRY_BUDGET`` times that), the whole collection within ``collect_timeout_s``, and the
    file within the audit's limits (``MAX_FILE_BYTES``, ``MAX_SAMPLES``). ``api``: "openai"
    (``/v1/completions``) or "llama.cpp" (llama-server's own ``/completion`` with ``return_tokens``:
    the generated ids exactly, where the OpenAI route gives only text). Returns the file."""
    _check_collection(prompts, n, sampling, scores_api, score_logprobs, api)
    out = Path(out)
    check_out(out)
    client = Client(endpoint, rate=rate, api_key=api_key, timeout_s=timeout_s, total_timeout_s=collect_timeout_s)
    client.get("/v1/models")  # a clear error before anything else when the server is not there
    tokenize = tokenize or server_tokenizer(client)
    total, done = len(prompts) * n, 0
    writer = _LineWriter(out)
    try:
        for prompt in prompts:
            prompt_ids = tokenize(prompt)
            for index in range(n):
                if should_stop is not None and should_stop():
                    return out
                seed = first_seed + done
                answer, native = _generate(client, api, model, prompt, seed, sampling)
                try:
                    sample = sample_from_answer(answer, prompt, sampling, seed, engine=f"{endpoint} · {model}",
                                                speculative=speculative, tokenize=tokenize, prompt_ids=prompt_ids, eos_id=eos_id,
                                                raw_bytes=client.last_raw, native=native)
                except SamplesError as error:
                    raise EndpointError(f"the endpoint's answer cannot be used: {error}") from None
                if scores_api is not None:
                    sample.scores = _server_scores(client, scores_api, model, prompt_ids, sample.token_ids, score_logprobs)
                writer.write(sample, done, seed)
                done += 1
                if progress is not None:
                    progress(done, total)
    finally:
        writer.close()
    return out


def _check_collection(prompts: list[str], n: int, sampling: Sampling, scores_api: str | None, score_logprobs: int,
                      api: str) -> None:
    """Refuse a collection that cannot be made or that the audit could not read, before any request
    (``EndpointError``, one line)."""
    if n < 1 or not 1 <= sampling.max_tokens <= MAX_TOKENS:
        raise EndpointError(f"--n must be at least 1 and --max-tokens in [1, {MAX_TOKENS}]")
    if len(prompts) * n > MAX_SAMPLES:
        raise EndpointError(f"{len(prompts)} prompts × --n {n} is more than the {MAX_SAMPLES:,} generations a samples file "
                            "may hold: lower --n or split the prompts")
    if scores_api is not None and scores_api not in SCORE_APIS:
        raise EndpointError(f"unknown scores API {scores_api!r}: use one of {', '.join(SCORE_APIS)}")
    if not 1 <= score_logprobs <= MAX_TOP:
        raise EndpointError(f"--score-logprobs must lie in [1, {MAX_TOP}], got {score_logprobs}")
    if not prompts:
        raise EndpointError("no prompts to send")
    if api not in COMPLETION_APIS:
        raise EndpointError(f"unknown completion API {api!r}: use one of {', '.join(COMPLETION_APIS)}")


def _generate(client: Client, api: str, model: str, prompt: str, seed: int,
              sampling: Sampling) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One generation request, no logprobs asked: ``(answer, native)``, the answer in the OpenAI
    shape and, with ``api`` "llama.cpp", llama-server's own answer it was made from (else ``None``)."""
    native = None
    if api == "llama.cpp":
        native = client.post("/completion", {"prompt": prompt, "seed": seed, "return_tokens": True,
                                             **sampling.llama_cpp_fields()})
        answer = openai_shape(native)
    else:
        answer = client.post("/v1/completions", {"model": model, "prompt": prompt, "seed": seed,
                                                 **sampling.request_fields()})
    return answer, native


class _LineWriter:
    """Appends one generation per line to ``out``, opened at the first line (an error before it
    leaves no file), never past ``MAX_FILE_BYTES`` (a collected file is always one the audit reads)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.handle = None
        self.size = 0

    def write(self, sample: Sample, done: int, seed: int) -> None:
        line = (json.dumps(sample.as_dict(), ensure_ascii=False, allow_nan=False) + "\n").encode()
        if self.handle is None:
            self.handle = _open_out(self.out)
            self.size = os.fstat(self.handle.fileno()).st_size
        if self.size + len(line) > MAX_FILE_BYTES:
            raise EndpointError(f"{self.out} would pass {MAX_FILE_BYTES // 2**20} MiB, the most a samples file may be: "
                                f"{done} generations are kept; collect the rest into another --out (--seed {seed})")
        self.handle.write(line)
        self.handle.flush()
        self.size += len(line)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def _server_scores(client: Client, api: str, model: str, prompt_ids: list[int], tokens: list[int], k: int) -> list:
    """The server's teacher-forced scores of ``tokens`` after ``prompt_ids`` (a request apart from the generation)."""
    if not tokens:
        return []
    if not prompt_ids:
        raise EndpointError("scoring needs the prompt's ids: give --target to tokenise here, or a server with /tokenize")
    path, body = score_request(api, model, list(prompt_ids) + list(tokens), k)
    answer = client.post(path, body, allow_non_finite=True)  # a log-probability may be -Infinity
    try:
        if api == "vllm":
            return scores_from_vllm(answer, len(prompt_ids), tokens, k)
        return scores_from_sglang(answer, tokens)
    except SamplesError as error:
        raise EndpointError(f"the server's scores cannot be used: {error}") from None


__all__ = ["COLLECT_TIMEOUT_S", "COMPLETION_APIS", "check_out", "collect"]
