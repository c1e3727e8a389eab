"""Collect generations from an OpenAI-compatible ``/v1/completions`` endpoint into a samples file.

The traps engines have, and what this does about them:

* **Logprobs change the path.** vLLM ran requests that asked for logprobs without speculation, so
  the generation call never asks for them (scores, when wanted, come from a later call).
* **Defaults are not the law you think.** llama.cpp samples with ``top_k 40``, ``top_p 0.95``,
  ``min_p 0.05`` and ``repeat_penalty 1.1`` unless told otherwise: every request states every
  setting (off as ``top_k 0``, ``top_p 1``, ``min_p 0``, penalties neutral).
* **Ids.** Where the response carries the generated ids (vLLM's ``token_ids``, llama-server's
  ``tokens`` from its own ``/completion`` with ``return_tokens``: ``api="llama.cpp"``) they are used.
  Otherwise the text is tokenised (``tokenize``: the target's tokenizer here, or the server's own
  ``/extras/tokenize`` or ``/tokenize``). A text whose ids do not number what the engine reports
  (``usage.completion_tokens``) was sampled as a non-canonical split: its ids are unknown, and the
  audit leaves it out and says how many. A generation that ended on EOS gets the EOS id back.
* **Scores come after.** With ``scores_api`` (``vllm`` or ``sglang``) each continuation is sent
  back, prompt ids then generated ids, in a separate request that generates nothing, and the
  server's teacher-forced log-probabilities are stored with the sample (``server_scores``).
* **Untrusted answers.** A response is read up to ``MAX_RESPONSE_BYTES``, parsed by
  ``untrusted_json`` (bounded depth, 64-bit integers, finite numbers) and checked field by field;
  malformed HTTP (an endless header line, more than 100 headers, a bad status line or chunk, a
  body cut short) is a one-line ``EndpointError``. A usage count that cannot be true (above
  max_tokens, unlike the ids returned, zero for a text) is named as the server's error. The raw
  answer is kept whole up to ``MAX_RAW_BYTES`` (else its size, head and sha256), and the file
  stops before the loader's ``MAX_FILE_BYTES``: a collected file is always one the audit reads.
* **Deadlines.** Each request ends within ``timeout_s`` (default ``TIMEOUT_S``) from connect to
  last byte: a watchdog shuts the socket at the deadline and the body is read in chunks with the
  socket's timeout set to what is left, so a server dripping a byte at a time cannot hold it (a
  socket timeout alone restarts at each byte). A timeout is not retried; the retries of one
  request (``RETRIES``, exponential back-off on a refused connection, 429 and 5xx) all end within
  ``RETRY_BUDGET`` × ``timeout_s``; a whole collection within ``collect_timeout_s``.
* **Credentials.** ``Authorization: Bearer`` goes to the endpoint's origin (scheme, host, port)
  only: a redirect within it is followed (at most ``MAX_REDIRECTS``), one to any other origin is
  refused with a one-line error, never followed with or without the key.

Requests are spaced to at most ``rate`` per second; ``seed`` is ``first_seed + i`` per generation.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from diagnostics.audit.samples import (MAX_FILE_BYTES, MAX_SAMPLES, MAX_TOKENS, MAX_TOP, Sample, SamplesError, continuation_ids,
                                        parse_sample, with_sampled_eos)
from diagnostics.audit.server_scores import SCORE_APIS, score_request, scores_from_sglang, scores_from_vllm
from diagnostics.untrusted_json import UntrustedJSONError, loads

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
MAX_RAW_BYTES = 64 * 1024  # of each answer kept whole in the file as "raw"; larger ones keep a head and their sha256
RAW_HEAD_CHARS = 4096
RETRIES = 5
TIMEOUT_S = 120.0  # per request: connect, send, status, headers and body together, redirects included
RETRY_BUDGET = 2  # all attempts of one request (and the waits between them) end within this many --timeout
COLLECT_TIMEOUT_S = 6 * 3600.0  # a whole collection (one --out file)
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_REDIRECTS = 5
READ_CHUNK = 64 * 1024
COMPLETION_APIS = ("openai", "llama.cpp")  # /v1/completions, or llama-server's /completion with its ids
DEFAULT_PORTS = {"http": 80, "https": 443}
REDIRECTS = (301, 302, 303, 307, 308)
RETRIED_STATUSES = (429, 500, 502, 503, 504)


class EndpointError(ValueError):
    """The endpoint cannot be used as asked; the message says what to check."""


class _Retry(Exception):
    """An attempt failed in a way a later attempt may not (refused connection, reset, 429, 5xx)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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

    def llama_cpp_fields(self) -> dict[str, Any]:
        """The same settings for llama.cpp's own ``/completion`` (``n_predict`` for max_tokens)."""
        fields = self.request_fields()
        fields["n_predict"] = fields.pop("max_tokens")
        return fields


def origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``url``, the default port filled in: what decides where credentials may go."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        raise EndpointError(f"the URL {url[:200]!r} has a bad port") from None
    return scheme, (parts.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme, 0)


def checked_timeout(value: float, name: str = "--timeout") -> float:
    """A deadline in seconds: finite, > 0 and at most ``MAX_TIMEOUT_S``; ``EndpointError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise EndpointError(f"{name} must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}], got {value}")
    return float(value)


class _Watchdog:
    """Shuts a connection's socket at a deadline, so no read (a status line or header that drips
    one byte at a time included) outlives it: a socket timeout alone restarts at every byte."""

    def __init__(self, connection: http.client.HTTPConnection, deadline: float) -> None:
        self.connection = connection
        self.fired = False
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv in the other thread
            except OSError:
                pass

    def __enter__(self) -> "_Watchdog":
        self.timer.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.timer.cancel()


class Client:
    """A small JSON-over-HTTP client: retries, a bounded request rate, a deadline per request (its
    retries included) and per client, redirects followed only within the endpoint's origin (the
    API key never leaves it), and every malformed answer a one-line ``EndpointError``."""

    def __init__(self, base_url: str, rate: float = 20.0, timeout_s: float = TIMEOUT_S, api_key: str | None = None,
                 total_timeout_s: float | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise EndpointError(f"the endpoint must be an http:// or https:// URL, got {base_url[:200]!r}")
        if not rate > 0:
            raise EndpointError(f"the request rate must be > 0 per second, got {rate}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.origin = origin(self.base_url)
        if not self.origin[1]:
            raise EndpointError(f"the endpoint {base_url[:200]!r} names no host")
        self.interval = 1.0 / rate
        self.timeout_s = checked_timeout(timeout_s)
        self.api_key = api_key
        self.deadline = None if total_timeout_s is None else time.monotonic() + checked_timeout(total_timeout_s, "--collect-timeout")
        self.total_timeout_s = total_timeout_s
        self._last = 0.0
        self.last_raw = b""  # the bytes of the last answer (its sha256 is kept when it is too large to keep)

    def get(self, path: str, retries: int = RETRIES) -> dict[str, Any]:
        """GET ``path`` and return the JSON object answered; ``EndpointError`` after the retries."""
        return self.post(path, None, retries)

    def post(self, path: str, body: dict[str, Any] | None, retries: int = RETRIES, allow_non_finite: bool = False) -> dict[str, Any]:
        """POST ``body`` as JSON (GET when ``None``) and return the JSON object answered; ``EndpointError``
        after the retries, or when the request's deadline (``RETRY_BUDGET`` × the timeout) passes."""
        data = None if body is None else json.dumps(body).encode()
        request_deadline = time.monotonic() + RETRY_BUDGET * self.timeout_s
        where = f"{self.base_url}{path}"
        failure = "no answer"
        for attempt in range(retries + 1):
            wait = self._last + self.interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._last = time.monotonic()
            deadline = self._attempt_deadline(request_deadline)
            try:
                raw = self._exchange(self.base_url + path, data, deadline)
            except _Retry as error:
                failure = error.message
                pause = min(8.0, 0.25 * 2**attempt)
                if attempt == retries or time.monotonic() + pause >= min(request_deadline, self.deadline or math.inf):
                    break
                time.sleep(pause)
                continue
            self.last_raw = raw
            try:
                answer = loads(raw, f"{where} answered", allow_non_finite=allow_non_finite)
            except UntrustedJSONError as error:
                raise EndpointError(f"{error}: is it an OpenAI-compatible server?") from None
            if not isinstance(answer, dict):
                raise EndpointError(f"{where} did not answer a JSON object")
            return answer
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise EndpointError(self._collection_overdue())
        raise EndpointError(f"{failure} (after {attempt + 1} attempts within {RETRY_BUDGET} × --timeout {self.timeout_s:g} s)")

    def _attempt_deadline(self, request_deadline: float) -> float:
        """This attempt's deadline: the timeout, within the request's and the client's deadlines."""
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise EndpointError(self._collection_overdue())
        return min(now + self.timeout_s, request_deadline, self.deadline or math.inf)

    def _collection_overdue(self) -> str:
        return (f"the collection ran past --collect-timeout {self.total_timeout_s:g} s: what was collected is kept; "
                "raise --collect-timeout or collect fewer generations (--n)")

    def _exchange(self, url: str, data: bytes | None, deadline: float) -> bytes:
        """One attempt: the request, same-origin redirects followed (at most ``MAX_REDIRECTS``), the body
        read by ``deadline``; ``_Retry`` for what may pass, ``EndpointError`` for the rest."""
        for _ in range(MAX_REDIRECTS + 1):
            status, location, raw = self._once(url, data, deadline)
            if status in REDIRECTS:
                url = self._redirect_target(url, location)
                continue
            if status in RETRIED_STATUSES:
                raise _Retry(f"{url[:300]} answered HTTP {status}: {_detail(raw)}")
            if not 200 <= status < 300:
                raise EndpointError(f"{url[:300]} answered HTTP {status}: {_detail(raw)}")
            return raw
        raise EndpointError(f"{url[:300]} redirected more than {MAX_REDIRECTS} times: give the final URL as --endpoint")

    def _redirect_target(self, url: str, location: str | None) -> str:
        """Where a redirect leads, when it stays within the endpoint's origin; never another origin,
        since the request carries the API key (``Authorization``)."""
        if not location:
            raise EndpointError(f"{url[:300]} redirected without a Location: give the final URL as --endpoint")
        target = urljoin(url, location.strip())
        if not target.startswith(("http://", "https://")) or origin(target) != self.origin:
            scheme, host, port = origin(target) if target.startswith(("http://", "https://")) else ("?", target[:100], 0)
            raise EndpointError(f"{url[:300]} redirected to another origin ({scheme}://{host}:{port}); it is not followed, "
                                "so the API key stays with the endpoint: give that URL as --endpoint if you trust it")
        return target

    def _once(self, url: str, data: bytes | None, deadline: float) -> tuple[int, str | None, bytes]:
        """One HTTP exchange: ``(status, Location, body)``; every transport or protocol failure mapped."""
        parts = urlsplit(url)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EndpointError(self._overdue(url, deadline))
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=remaining)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"Content-Type": "application/json", "Accept": "application/json", "Connection": "close"}
        if self.api_key:  # only ever sent to self.origin: _redirect_target refuses every other
            headers["Authorization"] = f"Bearer {self.api_key}"
        watchdog = _Watchdog(connection, deadline)
        try:
            with watchdog:
                connection.request("GET" if data is None else "POST", path, body=data, headers=headers)
                response = connection.getresponse()
                raw = _read_body(response, connection, deadline, url)
            if watchdog.fired:  # the socket was shut under a read: what came may be cut short
                raise EndpointError(self._overdue(url, deadline))
            return response.status, response.getheader("Location"), raw
        except EndpointError:
            raise
        except (TimeoutError, socket.timeout):
            raise EndpointError(self._overdue(url, deadline)) from None
        except http.client.RemoteDisconnected:
            if watchdog.fired:
                raise EndpointError(self._overdue(url, deadline)) from None
            raise _Retry(f"{url[:300]} closed the connection without an answer: is the server running?") from None
        except http.client.HTTPException as error:
            if watchdog.fired:
                raise EndpointError(self._overdue(url, deadline)) from None
            raise EndpointError(f"{url[:300]} answered malformed HTTP ({_protocol_problem(error)}): "
                                "is it an HTTP server speaking the OpenAI API?") from None
        except OSError as error:
            if watchdog.fired:
                raise EndpointError(self._overdue(url, deadline)) from None
            reason = getattr(error, "strerror", None) or error.__class__.__name__
            raise _Retry(f"cannot reach {url[:300]} ({reason}): is the server running?") from None
        finally:
            connection.close()

    def _overdue(self, url: str, deadline: float) -> str:
        if self.deadline is not None and deadline >= self.deadline:
            return self._collection_overdue()
        return (f"{url[:300]} did not answer within --timeout {self.timeout_s:g} s (a request's retries share "
                f"{RETRY_BUDGET} × --timeout): is the server overloaded? raise --timeout")


def _read_body(response: http.client.HTTPResponse, connection: http.client.HTTPConnection, deadline: float, url: str) -> bytes:
    """The body, read in chunks with the socket's timeout set to what is left of ``deadline`` (the
    watchdog bounds a chunk that trickles in); at most ``MAX_RESPONSE_BYTES``."""
    chunks, size = [], 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if connection.sock is not None:
            connection.sock.settimeout(remaining)
        chunk = response.read1(READ_CHUNK) if not response.isclosed() else b""
        if not chunk:
            if not response.chunked and response.length:  # read1 ends quietly where the peer closed early
                raise http.client.IncompleteRead(b"".join(chunks), response.length)
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise EndpointError(f"{url[:300]} answered more than {MAX_RESPONSE_BYTES // 2**20} MiB")
        chunks.append(chunk)


def _detail(raw: bytes) -> str:
    return raw[:500].decode("utf-8", "replace").replace("\n", " ").replace("\r", " ")[:300]


def _protocol_problem(error: http.client.HTTPException) -> str:
    """What was wrong, in a few words (``http.client``'s messages can quote the whole bad line)."""
    if isinstance(error, http.client.LineTooLong):
        return "a status or header line over 64 KiB"
    if isinstance(error, http.client.IncompleteRead):
        return f"the body ended after {len(error.partial)} bytes, before its announced end"
    if isinstance(error, http.client.BadStatusLine):
        return f"a bad status line {str(error)[:80]!r}"
    text = str(error)
    if "got more than" in text and "headers" in text:
        return "more than 100 headers"
    return f"{error.__class__.__name__}: {text[:120]}"


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


def _usage_count(answer: dict[str, Any]) -> int | None:
    """``usage.completion_tokens`` when it is a whole number >= 0 (else unknown)."""
    usage = answer.get("usage")
    reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return reported if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0 else None


def _usage_problem(reported: int | None, ids: list[int] | None, text: str, max_tokens: int) -> str | None:
    """Why the engine's own token count cannot be true (``None``: it may be). A count that
    disagrees with the request or with the ids the engine returned is the server's error, not a
    non-canonical split of its text (which the audit would otherwise blame)."""
    if reported is None:
        return None
    if reported > max_tokens:
        return f"more than the max_tokens {max_tokens} asked for"
    if reported == 0 and text:
        return "a non-empty text (every character comes from some token)"
    if ids is not None and reported != len(ids):
        return f"the {len(ids)} token_ids it returned"
    return None


def kept_raw(answer: dict[str, Any], raw_bytes: bytes | None = None) -> Any:
    """What the file keeps of an answer: the answer whole up to ``MAX_RAW_BYTES``, else its size,
    its sha256 (of the bytes received) and its first ``RAW_HEAD_CHARS`` characters, so that a
    collected file stays within what the audit reads."""
    encoded = json.dumps(answer, ensure_ascii=False, allow_nan=False)
    if len(encoded.encode()) <= MAX_RAW_BYTES:
        return answer
    received = raw_bytes if raw_bytes else encoded.encode()
    return {"truncated": True, "bytes": len(received), "sha256": hashlib.sha256(received).hexdigest(),
            "head": received[: RAW_HEAD_CHARS * 4].decode("utf-8", "replace")[:RAW_HEAD_CHARS]}


def openai_shape(answer: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's ``/completion`` answer (``content``, ``tokens`` with ``return_tokens``,
    ``tokens_predicted``, ``stop_type``) in the shape of an OpenAI completion with vLLM's
    ``token_ids``: the engine's own ids, so nothing is retokenised and none is left out.
    ``stop_type`` "limit" (n_predict reached) is finish reason "length"; "eos" and "word" are "stop"."""
    if not isinstance(answer.get("content"), str):
        raise EndpointError("the answer has no content: is it llama.cpp's llama-server /completion?")
    stop_type = answer.get("stop_type")
    finish = "length" if stop_type == "limit" else "stop" if stop_type in ("eos", "word") else None
    return {"choices": [{"text": answer["content"], "token_ids": answer.get("tokens"), "finish_reason": finish}],
            "usage": {"completion_tokens": answer.get("tokens_predicted")}}


def sample_from_answer(answer: dict[str, Any], prompt: str, sampling: Sampling, seed: int, engine: str,
                       speculative: bool | None, tokenize: Callable[[str], list[int]], prompt_ids: list[int],
                       eos_id: int | None, raw_bytes: bytes | None = None, native: dict[str, Any] | None = None) -> Sample:
    """One response as a ``Sample`` (checked like a line of a file), its raw answer kept (``kept_raw``).
    ``native``: llama.cpp's own answer, of which ``answer`` is the OpenAI shape (``openai_shape``); its
    count (``tokens_predicted``) may then disagree with its ids: the ids are the evidence, both are kept."""
    choice = _choice(answer)
    text = choice.get("text")
    if not isinstance(text, str):
        raise EndpointError("a completion has no text")
    finish = choice.get("finish_reason")
    reported = _usage_count(answer)
    ids = choice.get("token_ids")
    engine_ids = isinstance(ids, list) and all(isinstance(item, int) and not isinstance(item, bool) for item in ids)
    if engine_ids and len(ids) > sampling.max_tokens:
        raise EndpointError(f"the server returned {len(ids)} token_ids for max_tokens {sampling.max_tokens}: it did not "
                            "generate as asked")
    problem = _usage_problem(reported, ids if engine_ids and native is None else None, text, sampling.max_tokens)
    if problem:
        raise EndpointError(f"the server's usage.completion_tokens ({reported}) disagrees with {problem}: its token count "
                            f"is wrong (not a tokenisation difference), so its answers cannot be checked (seed {seed})")
    source = "engine"
    if not engine_ids:
        ids, source = with_sampled_eos(continuation_ids(prompt, text, tokenize, prompt_ids), finish, reported, eos_id), "retokenized"
    line = {"prompt": prompt, "token_ids": ids[:MAX_TOKENS], "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "min_p": sampling.min_p, "text": text[:200_000], "prompt_ids": prompt_ids or None,
            "engine": engine[:200], "speculative": speculative, "finish_reason": str(finish)[:50] if finish else None,
            "seed": seed, "completion_tokens": reported, "ids_source": source,
            "raw": kept_raw(answer if native is None else native, raw_bytes)}
    return parse_sample(line, f"the answer to seed {seed}")


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
                native = None
                if api == "llama.cpp":
                    native = client.post("/completion", {"prompt": prompt, "seed": seed, "return_tokens": True,
                                                         **sampling.llama_cpp_fields()})
                    answer = openai_shape(native)
                else:
                    answer = client.post("/v1/completions", {"model": model, "prompt": prompt, "seed": seed,
                                                             **sampling.request_fields()})
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


__all__ = ["COLLECT_TIMEOUT_S", "Client", "EndpointError", "MAX_RAW_BYTES", "RETRY_BUDGET", "Sampling", "TIMEOUT_S", "collect",
           "kept_raw", "origin", "sample_from_answer", "server_tokenizer"]
