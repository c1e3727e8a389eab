"""Collect generations from an OpenAI-compatible ``/v1/completions`` endpoint into a samples file.

The traps engines have, and what this does about them:

* **Logprobs change the path.** vLLM ran requests that asked for logprobs without speculation, so
  the generation call never asks for them (scores, when wanted, come from a later call).
* **Defaults are not the law you think.** llama.cpp samples with ``top_k 40``, ``top_p 0.95``,
  ``min_p 0.05`` and ``repeat_penalty 1.1`` unless told otherwise: every request states every
  setting (off as ``top_k 0``, ``top_p 1``, ``min_p 0``, penalties neutral).
* **Ids.** Where the response carries the generated ids (vLLM's ``token_ids``) they are used.
  Otherwise the text is tokenised (``tokenize``: the target's tokenizer here, or the server's own
  ``/extras/tokenize`` or ``/tokenize``). A text whose ids do not number what the engine reports
  (``usage.completion_tokens``) was sampled as a non-canonical split: its ids are unknown, and the
  audit leaves it out and says how many. A generation that ended on EOS gets the EOS id back.
* **Scores come after.** With ``scores_api`` (``vllm`` or ``sglang``) each continuation is sent
  back, prompt ids then generated ids, in a separate request that generates nothing, and the
  server's teacher-forced log-probabilities are stored with the sample (``server_scores``).
* **Untrusted answers.** A response is read up to ``MAX_RESPONSE_BYTES`` and checked field by
  field; the raw response is kept in the file, so a verdict can be rechecked.

Requests are retried (``RETRIES``, exponential back-off on a refused connection, a timeout, 429 and
5xx) and spaced to at most ``rate`` per second; ``seed`` is ``first_seed + i`` per generation.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.audit.samples import MAX_TOKENS, Sample, SamplesError, parse_sample
from diagnostics.audit.server_scores import MAX_TOP, SCORE_APIS, score_request, scores_from_sglang, scores_from_vllm

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
RETRIES = 5
TIMEOUT_S = 120.0


class EndpointError(ValueError):
    """The endpoint cannot be used as asked; the message says what to check."""


@dataclass(frozen=True)
class Sampling:
    """The settings every request states (``None``: off)."""

    max_tokens: int = 32
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def request_fields(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_k": self.top_k or 0,
                "top_p": 1.0 if self.top_p is None else self.top_p, "min_p": self.min_p or 0.0, "repeat_penalty": 1.0,
                "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "n": 1, "stream": False}


class Client:
    """A small JSON-over-HTTP client with retries and a bounded request rate."""

    def __init__(self, base_url: str, rate: float = 20.0, timeout_s: float = TIMEOUT_S, api_key: str | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise EndpointError(f"the endpoint must be an http:// or https:// URL, got {base_url[:200]!r}")
        if not rate > 0:
            raise EndpointError(f"the request rate must be > 0 per second, got {rate}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.interval = 1.0 / rate
        self.timeout_s = timeout_s
        self.api_key = api_key
        self._last = 0.0

    def get(self, path: str, retries: int = RETRIES) -> dict[str, Any]:
        """GET ``path`` and return the JSON object answered; ``EndpointError`` after the retries."""
        return self.post(path, None, retries)

    def post(self, path: str, body: dict[str, Any] | None, retries: int = RETRIES) -> dict[str, Any]:
        """POST ``body`` as JSON (GET when ``None``) and return the JSON object answered; ``EndpointError`` after the retries."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in range(retries + 1):
            wait = self._last + self.interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._last = time.monotonic()
            try:
                request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method="GET" if data is None else "POST")
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - the user's endpoint
                    raw = response.read(MAX_RESPONSE_BYTES + 1)
                if len(raw) > MAX_RESPONSE_BYTES:
                    raise EndpointError(f"{self.base_url}{path} answered more than {MAX_RESPONSE_BYTES // 2**20} MiB")
                answer = json.loads(raw.decode("utf-8"))
                if not isinstance(answer, dict):
                    raise EndpointError(f"{self.base_url}{path} did not answer a JSON object")
                return answer
            except urllib.error.HTTPError as error:
                if error.code not in (429, 500, 502, 503, 504) or attempt == retries:
                    detail = error.read(500).decode("utf-8", "replace").replace("\n", " ")
                    raise EndpointError(f"{self.base_url}{path} answered HTTP {error.code}: {detail[:300]}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                if attempt == retries:
                    reason = getattr(error, "reason", error)
                    raise EndpointError(f"cannot reach {self.base_url}{path} ({reason}): is the server running?") from None
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise EndpointError(f"{self.base_url}{path} did not answer JSON: is it an OpenAI-compatible server?") from None
            time.sleep(min(8.0, 0.25 * 2**attempt))
        raise EndpointError(f"{self.base_url}{path}: no answer")  # not reached


def server_tokenizer(client: Client) -> Callable[[str], list[int]]:
    """The server's own tokenizer: llama-cpp-python's ``/extras/tokenize`` or llama.cpp's and vLLM's ``/tokenize``."""
    attempts = [("/extras/tokenize", "input"), ("/tokenize", "content"), ("/tokenize", "prompt")]

    def tokenize(text: str) -> list[int]:
        for index, (path, field_name) in enumerate(list(attempts)):
            try:
                answer = client.post(path, {field_name: text, "add_special_tokens": True}, retries=1)
            except EndpointError:
                continue
            ids = answer.get("tokens")
            if isinstance(ids, list) and all(isinstance(item, int) for item in ids):
                if index:
                    attempts.insert(0, attempts.pop(index))  # remember what this server speaks
                return ids
        raise EndpointError("the server tokenises nothing (no /extras/tokenize or /tokenize): give --target to tokenise here")

    return tokenize


def _choice(answer: dict[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EndpointError("the completion has no choices: is it an OpenAI-compatible /v1/completions?")
    return choices[0]


def _continuation_ids(prompt: str, text: str, tokenize: Callable[[str], list[int]], prompt_ids: list[int]) -> list[int]:
    """The generated text's ids after the prompt's (its own ids when the joint split differs at the seam)."""
    joint = tokenize(prompt + text)
    if joint[: len(prompt_ids)] == prompt_ids:
        return joint[len(prompt_ids):]
    alone = tokenize(text)
    # A text tokenised alone may gain a leading BOS the prompt already has.
    return alone[1:] if prompt_ids and alone[:1] == prompt_ids[:1] else alone


def sample_from_answer(answer: dict[str, Any], prompt: str, sampling: Sampling, seed: int, engine: str,
                       speculative: bool | None, tokenize: Callable[[str], list[int]], prompt_ids: list[int],
                       eos_id: int | None) -> Sample:
    """One response as a ``Sample`` (checked like a line of a file), its raw answer kept."""
    choice = _choice(answer)
    text = choice.get("text")
    if not isinstance(text, str):
        raise EndpointError("a completion has no text")
    finish = choice.get("finish_reason")
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    reported = usage.get("completion_tokens")
    ids = choice.get("token_ids")
    source = "engine"
    if not (isinstance(ids, list) and all(isinstance(item, int) for item in ids)):
        ids, source = _continuation_ids(prompt, text, tokenize, prompt_ids), "retokenized"
        if finish == "stop" and eos_id is not None and isinstance(reported, int) and reported == len(ids) + 1:
            ids = ids + [eos_id]  # the EOS the engine sampled (its text is empty)
    line = {"prompt": prompt, "token_ids": ids[:MAX_TOKENS], "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "min_p": sampling.min_p, "text": text[:200_000], "prompt_ids": prompt_ids or None,
            "engine": engine[:200], "speculative": speculative, "finish_reason": str(finish)[:50] if finish else None,
            "seed": seed, "completion_tokens": reported if isinstance(reported, int) else None, "ids_source": source,
            "raw": answer}
    return parse_sample(line, f"the answer to seed {seed}")


def collect(endpoint: str, model: str, prompts: list[str], out: str | Path, *, n: int = 100, sampling: Sampling = Sampling(),
            first_seed: int = 0, speculative: bool | None = None, tokenize: Callable[[str], list[int]] | None = None,
            eos_id: int | None = None, rate: float = 20.0, api_key: str | None = None,
            progress: Callable[[int, int], None] | None = None,
            should_stop: Callable[[], bool] | None = None, scores_api: str | None = None, score_logprobs: int = 20) -> Path:
    """``n`` generations of each prompt from ``endpoint``, appended to ``out`` as they come (a
    stop or a crash keeps what was collected); with ``scores_api``, each scored by the server
    afterwards (its top ``score_logprobs``). Returns the file."""
    if n < 1 or sampling.max_tokens < 1:
        raise EndpointError("--n and --max-tokens must be at least 1")
    if scores_api is not None and scores_api not in SCORE_APIS:
        raise EndpointError(f"unknown scores API {scores_api!r}: use one of {', '.join(SCORE_APIS)}")
    if not 1 <= score_logprobs <= MAX_TOP:
        raise EndpointError(f"--score-logprobs must lie in [1, {MAX_TOP}], got {score_logprobs}")
    if not prompts:
        raise EndpointError("no prompts to send")
    client = Client(endpoint, rate=rate, api_key=api_key)
    client.get("/v1/models")  # a clear error before anything else when the server is not there
    tokenize = tokenize or server_tokenizer(client)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    total, done = len(prompts) * n, 0
    with out.open("a", encoding="utf-8") as handle:
        for prompt in prompts:
            prompt_ids = tokenize(prompt)
            for index in range(n):
                if should_stop is not None and should_stop():
                    return out
                seed = first_seed + done
                answer = client.post("/v1/completions", {"model": model, "prompt": prompt, "seed": seed, **sampling.request_fields()})
                try:
                    sample = sample_from_answer(answer, prompt, sampling, seed, engine=f"{endpoint} · {model}",
                                                speculative=speculative, tokenize=tokenize, prompt_ids=prompt_ids, eos_id=eos_id)
                except SamplesError as error:
                    raise EndpointError(f"the endpoint's answer cannot be used: {error}") from None
                if scores_api is not None:
                    sample.scores = _server_scores(client, scores_api, model, prompt_ids, sample.token_ids, score_logprobs)
                handle.write(json.dumps(sample.as_dict(), ensure_ascii=False) + "\n")
                handle.flush()
                done += 1
                if progress is not None:
                    progress(done, total)
    return out


def _server_scores(client: Client, api: str, model: str, prompt_ids: list[int], tokens: list[int], k: int) -> list:
    """The server's teacher-forced scores of ``tokens`` after ``prompt_ids`` (a request apart from the generation)."""
    if not tokens:
        return []
    if not prompt_ids:
        raise EndpointError("scoring needs the prompt's ids: give --target to tokenise here, or a server with /tokenize")
    path, body = score_request(api, model, list(prompt_ids) + list(tokens), k)
    answer = client.post(path, body)
    try:
        if api == "vllm":
            return scores_from_vllm(answer, len(prompt_ids), tokens, k)
        return scores_from_sglang(answer, tokens)
    except SamplesError as error:
        raise EndpointError(f"the server's scores cannot be used: {error}") from None


__all__ = ["Client", "EndpointError", "Sampling", "collect", "sample_from_answer", "server_tokenizer"]
