"""A file of generations from any engine, as the external audit reads it (JSONL, untrusted).

One JSON object per line::

    {"prompt": str, "token_ids": [int, …], "temperature": float,
     "top_k": int|null, "top_p": float|null, "min_p": float|null,
     "text"?: str, "prompt_ids"?: [int, …], "engine"?: str, "speculative"?: bool,
     "finish_reason"?: str, "seed"?: int, "max_tokens"?: int, "completion_tokens"?: int,
     "ids_source"?: "engine"|"retokenized", "raw"?: any,
     "scores"?: [{"logprob": float, "top": [[id, logprob], …]} | null, …]}

The sampling settings are those the engine was *asked* to use; the audit tests whether the
generations follow the target's law under them. ``top_k`` of 0 or −1, ``top_p`` of 1 and
``min_p`` of 0 mean "off", as in vLLM and llama.cpp. ``prompt_ids`` are the ids the engine
conditioned on (when it returns them); without them the prompt is tokenised here. ``scores`` are
the server's own teacher-forced log-probabilities of each emitted token (``server_scores``). ``max_tokens``
is the token limit the engine was asked for (the two-sample test compares up to it).

A **text-only line** (``token_ids`` missing or empty, ``text`` not empty; what many engines print)
is pending until ``retokenize`` turns its text into ids with the target's tokenizer (the prompt's
ids stripped from the joint split when they agree): ``ids_source`` becomes ``"retokenized"``, and
when ``completion_tokens`` (what the engine said it generated) differs from the count, the text was
a non-canonical split and the line is left out of the audit and counted (``usable``). An audit of
pending lines is refused (``usable``): give the target.

A file is untrusted input: its size, its line count, every field, the JSON's nesting and its
integers are bounded (``diagnostics.untrusted_json``), text must be valid Unicode (no lone
surrogates), a leading UTF-8 byte-order mark is accepted, and a bad line is a one-line error that
names the file and the line.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diagnostics.policy import Policy, PolicyError
from diagnostics.untrusted_json import UntrustedJSONError, loads

MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_SAMPLES = 1_000_000
MAX_TOKENS = 32_768  # per generation, and per prompt's ids
MAX_PROMPT_CHARS = 200_000
MAX_ID = 2**31 - 1
MAX_TOP = 1024  # returned log-probabilities per position that a file may hold
IDS_SOURCES = (None, "engine", "retokenized")
_SURROGATE = re.compile("[\ud800-\udfff]")  # only a lone one survives decoding: a pair is one character


class SamplesError(ValueError):
    """A samples file that cannot be audited; the message says where and what to fix."""


@dataclass
class Sample:
    """One generation: what was asked (prompt, sampling settings) and the ids that came back."""

    prompt: str
    token_ids: list[int]
    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    text: str | None = None
    prompt_ids: list[int] | None = None
    engine: str | None = None
    speculative: bool | None = None
    finish_reason: str | None = None
    seed: int | None = None
    completion_tokens: int | None = None  # what the engine said it generated (``usage.completion_tokens``)
    ids_source: str | None = None  # "engine" (ids it returned) or "retokenized" (its text, tokenised)
    max_tokens: int | None = None  # the token limit the engine was asked for
    scores: list | None = field(default=None, repr=False)  # the server's own scores per token (``server_scores``)
    raw: Any = field(default=None, repr=False)
    where: str = field(default="", repr=False, compare=False)  # "FILE line N": named by later refusals, never written

    @property
    def text_only(self) -> bool:
        """A line with text but no ids yet (``retokenize`` gives them)."""
        return not self.token_ids and bool(self.text)

    @property
    def ids_unknown(self) -> bool:
        """Retokenised text whose ids do not number what the engine generated: a non-canonical
        split was sampled, and which ids it had is unknown."""
        return (self.ids_source == "retokenized" and self.completion_tokens is not None
                and self.completion_tokens != len(self.token_ids))

    @property
    def policy(self) -> Policy:
        """The declared sampling law's settings (temperature, then top-k, top-p, min-p)."""
        return Policy(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    @property
    def settings_key(self) -> tuple:
        return (self.temperature, self.top_k, self.top_p, self.min_p)

    def as_dict(self) -> dict[str, Any]:
        payload = {key: value for key, value in asdict(self).items() if value is not None and key not in ("scores", "where")}
        if self.scores is not None:
            payload["scores"] = [None if entry is None else entry.as_json() for entry in self.scores]
        return payload


@dataclass(frozen=True)
class PositionScores:
    """The server's scores at one output position: ``ℓ(y_t)`` and its top ``k`` ``(id, ℓ)`` by rank."""

    token_logprob: float | None
    top: tuple[tuple[int, float], ...]

    def as_json(self) -> dict[str, Any]:
        return {"logprob": self.token_logprob, "top": [[token, logprob] for token, logprob in self.top]}


def checked_logprob(value: Any, where: str) -> float | None:
    """A log-probability from a file or a server: a number <= 0 (or null); -inf and stand-ins below -1e30 clamp to -1e30."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 1e-6:
        raise SamplesError(f"{where}: a log-probability must be a number <= 0 or null, got {str(value)[:40]}")
    return max(float(value), -1e30)  # a server's "-inf" stand-in (-9999) and -inf itself both mean probability 0


def parse_scores(value: Any, tokens: int, where: str) -> list[PositionScores | None] | None:
    """A line's ``"scores"`` (one entry per emitted token, or null), checked; ``SamplesError`` naming ``where``."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != tokens:
        raise SamplesError(f"{where}: 'scores' must be a list with one entry per token id ({tokens})")
    parsed: list[PositionScores | None] = []
    for position, entry in enumerate(value):
        if entry is None:
            parsed.append(None)
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("top", []), list) or len(entry.get("top", [])) > MAX_TOP:
            raise SamplesError(f"{where}: scores[{position}] must be {{\"logprob\": number, \"top\": [[id, logprob], …]}} "
                               f"with at most {MAX_TOP} entries")
        top = []
        for item in entry.get("top", []):
            if (not isinstance(item, list) or len(item) != 2 or isinstance(item[0], bool) or not isinstance(item[0], int)
                    or not 0 <= item[0] <= MAX_ID):
                raise SamplesError(f"{where}: scores[{position}].top holds [token id, logprob] pairs")
            logprob = checked_logprob(item[1], where)
            if logprob is None:
                raise SamplesError(f"{where}: scores[{position}].top has a null log-probability")
            top.append((item[0], logprob))
        if top and not sum(math.exp(logprob) for _, logprob in top) > 0:  # log of 0 later: "math domain error"
            raise SamplesError(f"{where}: scores[{position}].top gives every listed id log-probability -inf (probability 0), "
                               "so it is no law's top: collect the scores again")
        parsed.append(PositionScores(checked_logprob(entry.get("logprob"), where), tuple(top)))
    return parsed


def _ids(value: Any, name: str, where: str, allow_empty: bool) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_TOKENS:
        raise SamplesError(f"{where}: {name!r} must be a list of at most {MAX_TOKENS} token ids")
    if not value and not allow_empty:
        raise SamplesError(f"{where}: {name!r} is empty")
    if not all(isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= MAX_ID for item in value):
        bad = next(item for item in value if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= MAX_ID)
        raise SamplesError(f"{where}: {name!r} must hold whole numbers >= 0 (token ids); it holds {str(bad)[:40]}")
    return list(value)


def _number(value: Any, name: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SamplesError(f"{where}: {name!r} must be a finite number or null")
    return float(value)


def _text(value: Any, name: str, where: str, limit: int = MAX_PROMPT_CHARS) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise SamplesError(f"{where}: {name!r} must be a string of at most {limit} characters")
    return value


def _count(value: Any, name: str, where: str, low: int = 0, high: int = MAX_ID) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SamplesError(f"{where}: {name!r} must be a whole number in [{low}, {high}] or null")
    return value


def usable(samples: list[Sample]) -> tuple[list[Sample], int]:
    """The samples whose ids are known, and how many were left out (``Sample.ids_unknown``).
    A text-only line not yet retokenised is refused: auditing it as 0 tokens would ignore its text."""
    pending = next((sample for sample in samples if sample.text_only), None)
    if pending is not None:
        raise SamplesError(f"{pending.where or 'a line'} has text but no token_ids: its ids come from the target's "
                           "tokenizer: give --target ID (on the Audit page: test against the target's law)")
    kept = [sample for sample in samples if not sample.ids_unknown]
    return kept, len(samples) - len(kept)


@dataclass
class Repeats:
    """Lines that repeat another generation: ``seeded`` share its prompt, settings, seed and ids (one
    draw written more than once, counted once); ``unseeded`` share its prompt, settings and ids with
    no seed to tell a copy from a second draw that came out the same (kept)."""

    seeded: int = 0
    unseeded: int = 0

    def notes(self) -> list[str]:
        """What the repeats do to the tests' assumption that generations are independent draws."""
        said = []
        if self.seeded:
            said.append(f"{self.seeded} lines repeat another generation exactly (same prompt, settings, seed and ids): one "
                        "draw written several times is not several independent draws, and counting it again would "
                        "inflate the evidence and any deviation alike; each draw is counted once")
        if self.unseeded:
            said.append(f"{self.unseeded} lines without a seed repeat another's prompt, settings and ids: independent "
                        "draws repeat as often as the law makes them, copies do not; with no seed they cannot be told "
                        "apart, so all are kept: give each generation its seed")
        return said


def distinct_draws(samples: list[Sample]) -> tuple[list[Sample], Repeats]:
    """``samples`` with each seeded draw once (``Repeats``): the tests assume independent draws, and
    a line repeated with its seed is the same draw. Unseeded repeats are counted, not removed."""
    seen: set[tuple] = set()
    kept: list[Sample] = []
    repeats = Repeats()
    for sample in samples:
        ids = tuple(sample.prompt_ids) if sample.prompt_ids is not None else None
        key = (sample.prompt, ids, sample.settings_key, sample.seed, tuple(sample.token_ids))
        if key in seen:
            if sample.seed is not None:
                repeats.seeded += 1
                continue
            repeats.unseeded += 1
        seen.add(key)
        kept.append(sample)
    return kept, repeats


def has_lone_surrogate(value: Any) -> bool:
    """Whether any string in ``value`` (keys included) holds a lone UTF-16 surrogate (``"\\ud800"``
    decodes to one): such text cannot be written as UTF-8, so a finished audit could not be printed."""
    stack = [value]
    while stack:  # iterative: the depth is bounded already, but a walk needs no recursion
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def continuation_ids(prompt: str, text: str, tokenize: Callable[[str], list[int]], prompt_ids: list[int]) -> list[int]:
    """The generated text's ids after the prompt's: the joint split's tail when its head is the
    prompt's ids, else the text tokenised alone (without a leading BOS the prompt already has).
    Used by ``retokenize`` and the endpoint collector alike."""
    joint = list(tokenize(prompt + text))
    if joint[: len(prompt_ids)] == list(prompt_ids):
        return joint[len(prompt_ids):]
    alone = list(tokenize(text))
    return alone[1:] if prompt_ids and alone[:1] == list(prompt_ids[:1]) else alone


def stopped_short(sample: Sample, eos: set[int]) -> bool:
    """Whether ``sample`` ended short of its declared ``max_tokens`` with no EOS among its ids: a
    sampler that follows the declared law emits ``max_tokens`` tokens unless it samples EOS, so
    such an output has probability 0 (unless the engine's context ran out), whatever its
    ``finish_reason`` says or lacks. The one exception is what the data cannot show: text
    retokenised here holds no EOS, so a retokenised line the engine says ended by ``"stop"`` ended
    by one (the collector puts it back when the engine counted it: ``with_sampled_eos``)."""
    if sample.max_tokens is None or len(sample.token_ids) >= sample.max_tokens:
        return False
    if any(token in eos for token in sample.token_ids):
        return False
    return not (sample.ids_source == "retokenized" and sample.finish_reason == "stop")


def with_sampled_eos(ids: list[int], finish_reason: Any, completion_tokens: int | None, eos_id: int | None) -> list[int]:
    """``ids`` (a text's, retokenised) with the EOS the engine sampled put back: it stopped (``"stop"``)
    and counted one token more than the text shows (an EOS has no text); unchanged otherwise."""
    if finish_reason == "stop" and eos_id is not None and completion_tokens is not None and completion_tokens == len(ids) + 1:
        return [*ids, eos_id]
    return ids


def _text_ids(sample: Sample, tokenize: Callable[[str], list[int]], eos_id: int | None,
              prompts: dict[str, list[int]]) -> list[int]:
    """The ids of ``sample``'s text after its prompt's (``continuation_ids``), with an EOS the engine
    counted but the text cannot show put back (``with_sampled_eos``); ``prompts`` caches prompts' ids."""
    if sample.prompt_ids is not None:
        prompt_ids = list(sample.prompt_ids)
    else:
        if sample.prompt not in prompts:
            prompts[sample.prompt] = list(tokenize(sample.prompt)) if sample.prompt else []
        prompt_ids = prompts[sample.prompt]
    return with_sampled_eos(continuation_ids(sample.prompt, sample.text or "", tokenize, prompt_ids),
                            sample.finish_reason, sample.completion_tokens, eos_id)


def check_retokenized(samples: list[Sample], tokenize: Callable[[str], list[int]], eos_id: int | None = None) -> int:
    """Check each line that says its ids were ``"retokenized"`` from its text: they must be the ids
    its text gives here (``continuation_ids``, an EOS the engine counted put back), the way the
    collector and ``retokenize`` make them. The claim moves a line out of the length check (a
    ``"stop"``) or out of the audit (a count that disagrees), so a claim the text contradicts is a
    ``SamplesError`` naming the line. Returns how many lines were checked."""
    prompts: dict[str, list[int]] = {}
    checked = 0
    for sample in samples:
        if sample.ids_source != "retokenized" or not sample.token_ids:
            continue
        expected = _text_ids(sample, tokenize, eos_id, prompts)
        if list(sample.token_ids) != expected:
            raise SamplesError(f"{sample.where or 'a line'}: says its token_ids were retokenized from its text, but its text "
                               f"tokenises to other ids with the target's tokenizer ({len(expected)} ids, not "
                               f"{len(sample.token_ids)}): they are not its text's ids; drop ids_source, or the ids")
        checked += 1
    return checked


def retokenize(samples: list[Sample], tokenize: Callable[[str], list[int]], eos_id: int | None = None) -> int:
    """Give each text-only sample the ids of its text (``continuation_ids``; an EOS the engine reported
    but the text cannot show is put back, as the collector does), marked ``"retokenized"``. Returns
    how many were retokenised; a text whose ids are unusable is a ``SamplesError`` naming its line."""
    prompts: dict[str, list[int]] = {}
    done = 0
    for sample in samples:
        if not sample.text_only:
            continue
        where = sample.where or "a line"
        ids = _text_ids(sample, tokenize, eos_id, prompts)
        if not ids:
            raise SamplesError(f"{where}: its text tokenises to no ids with the target's tokenizer: give token_ids")
        sample.token_ids = _ids(ids, "token_ids (from its text)", where, allow_empty=False)
        sample.ids_source = "retokenized"
        done += 1
    return done


def target_tokenize(target: Any) -> tuple[Callable[[str], list[int]] | None, int | None]:
    """``target``'s tokenizer as a text → ids function and its EOS id; ``(None, None)`` without a
    target or a tokenizer (the collector then asks the server's)."""
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None:
        return None, None
    return (lambda text: list(tokenizer(text)["input_ids"])), tokenizer.eos_token_id


def retokenize_with_target(target: Any, groups: list[list[Sample]], named: str = "the target") -> int:
    """Text-only lines of each group get their ids from ``target``'s tokenizer (``retokenize``), as the
    CLI's ``--target`` and the Audit page both need; returns how many. A text-only line and a target
    without a tokenizer is a ``SamplesError`` naming the line and the target (``named``), not a later,
    unrelated refusal."""
    first = next((sample for group in groups for sample in group if sample.text_only), None)
    if first is None:
        return 0
    tokenize, eos_id = target_tokenize(target)
    if tokenize is None:
        raise SamplesError(f"{first.where or 'a line'} has text but no token_ids, and {named} has no tokenizer to make them: "
                           "give token_ids, or a target with its tokenizer")
    return sum(retokenize(group, tokenize, eos_id) for group in groups)


def parse_sample(obj: Any, where: str) -> Sample:
    """One line's object as a ``Sample``; ``SamplesError`` (naming ``where``) when it cannot be."""
    if not isinstance(obj, dict):
        raise SamplesError(f"{where}: expected a JSON object with \"prompt\", \"token_ids\" and \"temperature\"")
    for required in ("prompt", "temperature"):
        if required not in obj:
            raise SamplesError(f"{where}: lacks {required!r} (each line needs prompt, token_ids or text, temperature)")
    if obj.get("token_ids") is None and not obj.get("text"):
        raise SamplesError(f"{where}: lacks 'token_ids' (each line needs prompt, token_ids or text, temperature)")
    if has_lone_surrogate(obj):
        raise SamplesError(f"{where}: holds a lone UTF-16 surrogate (an unpaired \\ud800–\\udfff escape), which is not "
                           "text: fix the line's strings")
    prompt = _text(obj["prompt"], "prompt", where)
    temperature = _number(obj["temperature"], "temperature", where)
    if temperature is None:
        raise SamplesError(f"{where}: 'temperature' must be a number (0 for greedy)")
    top_k = obj.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise SamplesError(f"{where}: 'top_k' must be a whole number or null")
    top_k = None if top_k is None or top_k <= 0 else top_k  # 0 and -1 mean "off" (vLLM, llama.cpp)
    top_p = _number(obj.get("top_p"), "top_p", where)
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise SamplesError(f"{where}: 'top_p' must lie in (0, 1] (1 or null: off), got {top_p}")
    top_p = None if top_p == 1.0 else top_p
    min_p = _number(obj.get("min_p"), "min_p", where)
    if min_p is not None and not 0.0 <= min_p < 1.0:
        raise SamplesError(f"{where}: 'min_p' must lie in [0, 1) (0 or null: off), got {min_p}")
    min_p = None if min_p == 0.0 else min_p
    speculative = obj.get("speculative")
    if speculative is not None and not isinstance(speculative, bool):
        raise SamplesError(f"{where}: 'speculative' must be true, false or null")
    seed = obj.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise SamplesError(f"{where}: 'seed' must be a whole number or null")
    sample = Sample(
        prompt=prompt or "", token_ids=_ids([] if obj.get("token_ids") is None else obj["token_ids"], "token_ids", where, allow_empty=True), temperature=temperature,
        top_k=top_k, top_p=top_p, min_p=min_p, text=_text(obj.get("text"), "text", where),
        prompt_ids=None if obj.get("prompt_ids") is None else _ids(obj["prompt_ids"], "prompt_ids", where, allow_empty=False),
        engine=_text(obj.get("engine"), "engine", where, limit=200), speculative=speculative,
        finish_reason=_text(obj.get("finish_reason"), "finish_reason", where, limit=50), seed=seed, raw=obj.get("raw"),
        completion_tokens=_count(obj.get("completion_tokens"), "completion_tokens", where),
        ids_source=_text(obj.get("ids_source"), "ids_source", where, limit=20),
        max_tokens=_count(obj.get("max_tokens"), "max_tokens", where, low=1, high=MAX_TOKENS), where=where,
    )
    if obj.get("scores") is not None:
        sample.scores = parse_scores(obj["scores"], len(sample.token_ids), where)
    if not sample.prompt and sample.prompt_ids is None:
        raise SamplesError(f"{where}: the prompt is empty and there are no prompt_ids")
    if sample.ids_source not in IDS_SOURCES:
        raise SamplesError(f"{where}: 'ids_source' must be \"engine\", \"retokenized\" or null, got {sample.ids_source!r}")
    if sample.ids_source == "retokenized" and sample.token_ids and not sample.text:
        raise SamplesError(f"{where}: says its token_ids were retokenized from its text, but it has no text: its ids are "
                           "then the engine's; drop ids_source (or give the text they came from)")
    try:
        sample.policy  # noqa: B018 - validates the declared settings
    except PolicyError as error:
        raise SamplesError(f"{where}: {error}") from None
    return sample


def load_samples(path: str | os.PathLike) -> list[Sample]:
    """Every line of a JSONL samples file (blank lines skipped), checked; one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise SamplesError(f"no samples file at {path}: give a JSONL file with one generation per line")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise SamplesError(f"{path} is {size / 2**20:.0f} MiB; the limit is {MAX_FILE_BYTES // 2**20} MiB: split it")
    samples = []
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            where = f"{path.name} line {number}"
            if not line.strip():
                continue
            if len(samples) >= MAX_SAMPLES:
                raise SamplesError(f"{path} has more than {MAX_SAMPLES:,} generations: split it")
            samples.append(parse_sample(_line_object(line, where), where))
    if not samples:
        raise SamplesError(f"{path} has no generations: one JSON object per line")
    return samples


def _line_object(line: bytes, where: str) -> Any:
    """One line's JSON (bounded: ``untrusted_json``); a one-line ``SamplesError`` naming ``where`` otherwise."""
    try:
        return loads(line, where, allow_non_finite=True)  # -Infinity: a log-probability; each field is checked after
    except UntrustedJSONError as error:
        detail = str(error).removeprefix(where).lstrip(": ")
        if detail.startswith(("not valid JSON", "not UTF-8")):
            raise SamplesError(f"{where} is not a JSON object ({detail}): one generation per line") from None
        raise SamplesError(f"{where}: {detail}") from None


def write_samples(path: str | os.PathLike, samples: list[Sample]) -> Path:
    """Write ``samples`` as JSONL (the format ``load_samples`` reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for sample in samples:
            handle.write(json.dumps(sample.as_dict(), ensure_ascii=False) + "\n")
    return path
