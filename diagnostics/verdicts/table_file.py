"""The verdict table's file: read with bounds, checked field by field, written atomically.

A table file may come from elsewhere (``verdicts --import``, a shared clone), so it is untrusted:

* read: a regular file only (opened without blocking, so a pipe, a device or a folder is refused at
  once), at most ``MAX_TABLE_BYTES`` (4 MiB; the committed table of 18 rows is 44 KB, and
  ``MAX_ROWS`` rows of its kind about 2.5 MB), UTF-8 (an error names the line), no lone surrogate
  escape (``\\ud800`` is no character: it names the line), JSON within ``untrusted_json``'s bounds;
* checked (``check_table``): only the fields a row and a side have, each in its meaning's range
  (a p-value or a TV in [0, 1], counts whole and at most ``MAX_COUNT``, seconds at most
  ``MAX_SECONDS``, a sha256 64 hexadecimal digits), text of bounded length, a row's settings at
  most ``MAX_SETTINGS_BYTES`` serialised; one row per (engine, policy) run here and one imported;
* written (``save_table``): checked and serialised in memory first, then a ``.partial`` file beside
  the table replaces it; on any error the partial file is removed and the table keeps its bytes.

Memory: the file's bytes, its text and the parsed table, each at most a few times 4 MiB.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

CONTROL_FAILED = "control failed: settings not matched"
# A side whose engine raised, or gave what cannot be audited (ids outside the vocabulary): its
# verdict is "error" with the message, and the row's is ENGINE_ERROR, distinct from pass and fail.
SIDE_ERROR = "error"
ENGINE_ERROR = "engine error"
# A speculative side whose engine's own counters say it drafted or accepted nothing: whatever the
# audit says, speculation was not tested (a pass would only mean plain sampling is right).
SPECULATION_INACTIVE = "speculation inactive"
ROW_VERDICTS = ("pass", "fail", "inconclusive", CONTROL_FAILED, ENGINE_ERROR, SPECULATION_INACTIVE)
SIDE_VERDICTS = ("pass", "fail", "inconclusive", SIDE_ERROR)
RUN_HERE = "run here"  # the provenance of a row this lab made; any other is an import's
MAX_TABLE_BYTES = 4 * 2**20
MAX_ROWS = 1000
MAX_SETTINGS_BYTES = 8192  # the committed settings take at most 1.9 KB (llama-server's, with its prompts)
MAX_TEXT = 200  # a label, version, file name, audit id …
MAX_NOTE = 1000  # a row's note, a provenance line
MAX_REASONS, MAX_REASON = 20, 500  # an audit's reasons: sentences
MAX_COUNT = 10**9  # tokens, generations: the committed rows hold about 11,000 tokens a side
MAX_SECONDS = 1e7  # about 116 days: the longest committed row took 2,559 s

_UNIT, _COUNT, _SECONDS = "unit", "count", "seconds"
SIDE_RANGES = {
    "p_value": _UNIT, "detectable_tv": _UNIT, "distortion": _UNIT, "distortion_low": _UNIT, "distortion_high": _UNIT,
    "worst_position_p": _UNIT, "tokens": _COUNT, "generations": _COUNT, "needed_tokens": _COUNT, "impossible": _COUNT,
    "stopped_short": _COUNT, "worst_position": _COUNT, "time_s": _SECONDS, "generation_s": _SECONDS,
}
SIDE_TEXT = ("file", "audit_id", "audit_id_elsewhere")  # audit_id_elsewhere: an imported side's audit, in its maker's store
# The engine's own counters of one side's run (``speculation``): drafted and accepted tokens over
# the generations it counted, and where the figures come from (its metrics, its timings …).
COUNTER_FIELDS = ("drafted", "accepted", "generations")
SIDE_KEYS = frozenset({"verdict", "sha256", "reasons", "error", "speculation", *SIDE_RANGES, *SIDE_TEXT})
ROW_TEXT = {"engine": MAX_TEXT, "label": MAX_TEXT, "version": MAX_TEXT, "policy": MAX_TEXT, "verdict": MAX_TEXT}
ROW_OPTIONAL_TEXT = {"target": MAX_TEXT, "oracle": MAX_TEXT, "note": MAX_NOTE, "provenance": MAX_NOTE}
ROW_KEYS = frozenset({*ROW_TEXT, *ROW_OPTIONAL_TEXT, "settings", "on", "off", "time_s"})
# The settings a row's cells show or its audit used, each in its range (the Policy's own bounds).
SETTING_RANGES = {"temperature": (0.0, 1000.0, "[0, 1000]"), "top_p": (0.0, 1.0, "[0, 1]"), "min_p": (0.0, 1.0, "[0, 1]"),
                  "detect_tv": (0.0, 1.0, "(0, 1)"), "level": (0.0, 1.0, "(0, 1)")}
SETTING_COUNTS = {"top_k": 10**7, "max_tokens": 10**6}  # a vocabulary; tokens per generation
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A JSON string's escapes, left to right: an escaped backslash (skipped, so "\\ud800" is text), a
# surrogate pair (one character), or a lone surrogate (no character at all).
_SURROGATE_ESCAPES = re.compile(r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def read_bounded(path: Path, limit: int = MAX_TABLE_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit``; a one-line ``ValueError``
    otherwise. Opened with ``O_NONBLOCK`` so that a pipe without a writer never blocks, then checked
    with ``fstat`` on the open file (no gap between the check and the read)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise ValueError(f"{path} is not a regular file (a folder, device or pipe): give a verdict table's JSON file")
        if status.st_size > limit:
            raise ValueError(f"{path} is {status.st_size / 2**20:.1f} MiB; the limit is {limit // 2**20} MiB for a verdict table")
        chunks, size = [], 0
        while size <= limit:  # a file that grows while read is cut at the limit and refused
            chunk = os.read(descriptor, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    finally:
        os.close(descriptor)
    if size > limit:
        raise ValueError(f"{path} grew past the limit of {limit // 2**20} MiB while it was read")
    return b"".join(chunks)


def parse_table(data: bytes, where: str) -> dict[str, Any]:
    """The table in ``data`` (a file's bytes), checked (``check_table``); a one-line ``ValueError``
    beginning with ``where`` and, for text that is not text, the line."""
    from diagnostics.untrusted_json import loads

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{where}: line {line}: not UTF-8 text (byte {error.start}): save the file as UTF-8") from None
    for match in _SURROGATE_ESCAPES.finditer(text):
        if len(match.group()) == 6:
            line = text.count("\n", 0, match.start()) + 1
            raise ValueError(f"{where}: line {line}: {match.group()} is a lone surrogate, not a character: write the character "
                             "itself, or both halves of its pair")
    table = loads(text, where)
    problem = check_table(table)
    if problem:
        raise ValueError(f"{where}: {problem}")
    return table


def load_table(path: Path) -> dict[str, Any]:
    """The table file (``{"rows": [...]}``), empty when it does not exist; refused in one line when
    it is not a table within the bounds above."""
    if not os.path.lexists(path):
        return {"rows": []}
    return parse_table(read_bounded(path), str(path))


def table_bytes(table: dict[str, Any]) -> bytes:
    """The table as the file holds it (UTF-8 JSON), checked first; a one-line ``ValueError`` when it
    is not a table within the bounds or holds text that is not UTF-8 (a lone surrogate)."""
    text = json.dumps(table, indent=1, ensure_ascii=False, default=_json_default) + "\n"
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"not written: the table holds text that is not UTF-8 ({text[error.start]!r} is a lone surrogate)") from None
    # What is checked is what the file will hold (numpy figures as numbers, NaN as NaN, refused).
    problem = check_table(json.loads(text))
    if problem:
        raise ValueError(f"not written: {problem}")
    return data


def save_table(path: Path, table: dict[str, Any]) -> None:
    """Write ``table`` to ``path`` atomically: serialised and checked in memory, written to a
    ``.partial`` file beside it, flushed, then renamed over it. On any error the partial file is
    removed and ``path`` keeps its bytes."""
    data = table_bytes(table)
    write_atomically(path, data)


def write_atomically(path: Path, data: bytes) -> None:
    """``path`` replaced by ``data`` in one rename (a ``.partial`` file beside it, removed on any error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # a numpy scalar from an audit's figures
        return value.item()
    raise TypeError(type(value).__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _range_problem(name: str, value: Any, kind: str) -> str | None:
    """Why ``value`` is not a ``kind`` (``SIDE_RANGES``), or ``None`` (empty is allowed: not measured)."""
    if value is None:
        return None
    if kind == _COUNT and not _is_count(value):
        return f"{name} must be a whole number in [0, {MAX_COUNT:,}], got {_short(value)}"
    if kind == _UNIT and not (_is_number(value) and 0.0 <= value <= 1.0):
        return f"{name} must be a number in [0, 1], got {_short(value)}"
    if kind == _SECONDS and not (_is_number(value) and 0.0 <= value <= MAX_SECONDS):
        return f"{name} must be a number of seconds in [0, {MAX_SECONDS:.0e}], got {_short(value)}"
    return None


def _short(value: Any) -> str:
    return repr(value)[:40]


def _text_problem(name: str, value: Any, limit: int, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value) or len(value) > limit:
        return f"{name} must be text of {'1 to' if required else 'at most'} {limit} characters"
    return None


def _settings_problem(settings: Any) -> str | None:
    """Why a row's settings are not a small object of its sampling and audit settings, or ``None``."""
    if not isinstance(settings, dict):
        return "settings must be an object"
    try:
        size = len(json.dumps(settings, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError):  # a lone surrogate (UnicodeEncodeError is a ValueError), an object JSON cannot write
        return "settings must be JSON text (UTF-8, no lone surrogate)"
    if size > MAX_SETTINGS_BYTES:
        return f"settings must serialise to at most {MAX_SETTINGS_BYTES:,} bytes, got {size:,}"
    for name, (low, high, shown) in SETTING_RANGES.items():
        value = settings.get(name)
        if value is None:
            continue
        open_interval = shown.startswith("(")
        inside = _is_number(value) and (low < value < high if open_interval else low <= value <= high)
        if not inside:
            return f"settings.{name} must be a number in {shown}, got {_short(value)}"
    for name, limit in SETTING_COUNTS.items():
        value = settings.get(name)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit):
            return f"settings.{name} must be a whole number in [0, {limit:,}], got {_short(value)}"
    prompts = settings.get("prompts")
    if prompts is not None and not (isinstance(prompts, list) and all(isinstance(prompt, str) for prompt in prompts)):
        return "settings.prompts must be a list of texts"
    return None


def _side_problem(side: str, evidence: Any) -> str | None:
    """Why one side of a row is not an audit's figures within their ranges, or ``None``."""
    if not isinstance(evidence, dict):
        return f"{side} (speculation {side}) must be an object with its audit's figures"
    unknown = sorted(str(key) for key in evidence if key not in SIDE_KEYS)
    if unknown:
        return f"{side}.{unknown[0][:40]} is not a field of a side (known: {', '.join(sorted(SIDE_KEYS))})"
    if evidence.get("verdict") not in SIDE_VERDICTS:
        return f"{side}.verdict must be pass, fail, inconclusive or error"
    if evidence["verdict"] == SIDE_ERROR and not (isinstance(evidence.get("error"), str) and evidence["error"]):
        return f"{side}.error must say what the engine did (a side whose verdict is error)"
    problem = _text_problem(f"{side}.error", evidence.get("error"), MAX_REASON) or _counters_problem(side, evidence.get("speculation"))
    if problem:
        return problem
    for name, kind in SIDE_RANGES.items():
        problem = _range_problem(f"{side}.{name}", evidence.get(name), kind)
        if problem:
            return problem
    for name in SIDE_TEXT:
        problem = _text_problem(f"{side}.{name}", evidence.get(name), MAX_TEXT)
        if problem:
            return problem
    digest = evidence.get("sha256")
    if digest is not None and not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
        return f"{side}.sha256 must be 64 hexadecimal digits (lower case)"
    reasons = evidence.get("reasons")
    if reasons is not None and not (isinstance(reasons, list) and len(reasons) <= MAX_REASONS
                                    and all(isinstance(reason, str) and len(reason) <= MAX_REASON for reason in reasons)):
        return f"{side}.reasons must be a list of at most {MAX_REASONS} texts of at most {MAX_REASON} characters"
    return None


def _counters_problem(side: str, counters: Any) -> str | None:
    """Why ``counters`` (a side's ``speculation``) are not the engine's counters, or ``None``."""
    if counters is None:
        return None
    if not isinstance(counters, dict) or set(counters) - {*COUNTER_FIELDS, "source"}:
        return f"{side}.speculation must be {{\"drafted\", \"accepted\", \"generations\", \"source\"}}"
    for name in COUNTER_FIELDS:
        problem = _range_problem(f"{side}.speculation.{name}", counters.get(name), _COUNT)
        if problem:
            return problem
    if isinstance(counters.get("drafted"), int) and isinstance(counters.get("accepted"), int) and counters["accepted"] > counters["drafted"]:
        return f"{side}.speculation accepts more tokens than it drafted"
    return _text_problem(f"{side}.speculation.source", counters.get("source"), MAX_TEXT)


def _row_problem(row: Any) -> str | None:
    """Why ``row`` is not a row of a verdict table, or ``None``."""
    if not isinstance(row, dict):
        return "is not an object"
    unknown = sorted(str(key) for key in row if key not in ROW_KEYS)
    if unknown:
        return f"{unknown[0][:40]} is not a field of a verdict table's row (known: {', '.join(sorted(ROW_KEYS))})"
    for name, limit in ROW_TEXT.items():
        problem = _text_problem(name, row.get(name), limit, required=True)
        if problem:
            return problem
    if row["verdict"] not in ROW_VERDICTS:
        return f"verdict {row['verdict'][:40]!r} is not one of {', '.join(ROW_VERDICTS)}"
    for name, limit in ROW_OPTIONAL_TEXT.items():
        problem = _text_problem(name, row.get(name), limit)
        if problem:
            return problem
    problem = (_range_problem("time_s", row.get("time_s"), _SECONDS) or _settings_problem(row.get("settings"))
               or _side_problem("on", row.get("on")) or _side_problem("off", row.get("off")))
    if problem:
        return problem
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError):
        return "holds text that is not UTF-8 (a lone surrogate such as \\ud800)"
    return None


def is_run_here(row: dict[str, Any]) -> bool:
    """Whether the row was made by this lab (its evidence files, its audits); else it was imported."""
    return row.get("provenance") == RUN_HERE


def check_table(table: Any) -> str | None:
    """Why ``table`` is not a verdict table within the bounds (module docstring), or ``None``."""
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list) or set(table) != {"rows"}:
        return 'not a verdict table: expected {"rows": [...]} and nothing else'
    if len(table["rows"]) > MAX_ROWS:
        return f"more than {MAX_ROWS:,} rows"
    seen = set()
    for index, row in enumerate(table["rows"]):
        problem = _row_problem(row)
        if problem:
            return f"row {index + 1}: {problem}"
        key = (row["engine"], row["policy"], is_run_here(row))
        if key in seen:
            return (f"row {index + 1}: a second {'row run here' if key[2] else 'imported row'} for engine {row['engine'][:40]!r}, "
                    f"policy {row['policy'][:40]!r}")
        seen.add(key)
    return None
