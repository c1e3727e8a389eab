"""A completion request's settings and its answer read as a ``Sample``, checked like a line of a file.

* **Defaults are not the law you think.** llama.cpp samples with ``top_k 40``, ``top_p 0.95``,
  ``min_p 0.05`` and ``repeat_penalty 1.1`` unless told otherwise: every request states every
  setting (``Sampling``: off as ``top_k 0``, ``top_p 1``, ``min_p 0``, penalties neutral).
* **Ids.** Where the response carries the generated ids (vLLM's ``token_ids``, llama-server's
  ``tokens`` from its own ``/completion`` with ``return_tokens``, put in the OpenAI shape by
  ``openai_shape``) they are used. Otherwise the text is tokenised (``tokenize``: the target's
  tokenizer, or the server's own ``/extras/tokenize`` or ``/tokenize``: ``server_tokenizer``). A
  text whose ids do not number what the engine reports (``usage.completion_tokens``) was sampled as
  a non-canonical split: its ids are unknown, and the audit leaves it out and says how many. A
  generation that ended on EOS gets the EOS id back.
* **Untrusted answers.** Each answer is checked field by field; a usage count that cannot be true
  (above max_tokens, unlike the ids returned, zero for a text) is named as the server's error. The
  raw answer is kept whole up to ``MAX_RAW_BYTES`` (else its size, head and sha256: ``kept_raw``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from diagnostics.audit.endpoint_client import Client, EndpointError
from diagnostics.audit.samples import MAX_TOKENS, Sample, continuation_ids, parse_sample, with_sampled_eos

MAX_RAW_BYTES = 64 * 1024  # of each answer kept whole in the file as "raw"; larger ones keep a head and their sha256
RAW_HEAD_CHARS = 4096


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


__all__ = ["MAX_RAW_BYTES", "Sampling", "kept_raw", "openai_shape", "sample_from_answer", "server_tokenizer"]
