"""The plumbing of the worker protocol (``verdicts.workers``, read the protocol there) that the engine
workers share: request lines read with a size bound, a request's nullable numbers checked, answers
written to a duplicate of the original stdout, and the serving loop (set-up, ready, one answer per
request, exit at the end of stdin).

Standard library only, like the workers: a worker runs under its engine's own interpreter and
loads this file by its path, beside the worker's own (never through the lab's package), so it
is found however the script is started (``python -P`` or ``-I`` leave the script's folder off
``sys.path``).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

MAX_LINE_BYTES = 64 << 20  # a request is a prompt and a few seeds: far below this


def one_line(error: BaseException | str) -> str:
    """An error as one line: its type and message, whitespace folded, cut to 400 characters."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return " ".join(str(text).split())[:400] or "unknown error"


def read_line(stream: Any, max_bytes: int = MAX_LINE_BYTES) -> bytes | None:
    """The next line of the binary ``stream`` (``None`` at its end), at most ``max_bytes`` before its
    newline; a longer one is read to its end and refused with ``ValueError``, so that one error
    answers one line and the next line is read whole."""
    line = stream.readline(max_bytes + 1)
    if not line:
        return None
    if len(line) > max_bytes and not line.endswith(b"\n"):
        while line and not line.endswith(b"\n"):  # skip the rest of it
            line = stream.readline(max_bytes)
        raise ValueError(f"a line longer than {max_bytes >> 20} MiB")
    return line


def read_message(stream: Any, max_bytes: int = MAX_LINE_BYTES) -> dict[str, Any] | None:
    """The next JSON object of ``stream``, blank lines skipped (``None`` at its end); ``ValueError``
    for a line that is too long, not JSON or not an object."""
    while True:
        line = read_line(stream, max_bytes)
        if line is None:
            return None
        if line.strip():
            break
    message = json.loads(line.decode("utf-8"))
    if not isinstance(message, dict):
        raise ValueError("a message that is not a JSON object")
    return message


def number_or_null(value: Any, name: str) -> float | None:
    """A request's number that may be null (``temperature``, ``top_p``, ``min_p``) as a float or
    ``None``; ``ValueError`` for anything else (a boolean included)."""
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number or null, got {value!r}")
    return float(value)


def answer_channel() -> Callable[[dict[str, Any]], None]:
    """Move file descriptor 1 to stderr and return the function that writes one answer line (JSON)
    to a duplicate of the original stdout. Called before the engine is imported: whatever the
    engine, its helpers or a C library print then lands in the log, never in the answers."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)

    def answer(payload: dict[str, Any]) -> None:
        answers.write(json.dumps(payload) + "\n")
        answers.flush()

    return answer


def serve(start: Callable[[dict[str, Any]], Any], *, set_up_failed: str, generate_failed: str,
          tracebacks: bool = False) -> int:
    """Serve the protocol on stdin and stdout; the exit status (0 when stdin closed, 1 for a failed
    set-up). ``start(setup)`` builds the engine: an object with ``settings`` (the ready answer's,
    ``settings["engine"]`` its name and version) and ``generate(request)`` (the answer to one
    request). A failure is answered as one line after ``set_up_failed`` or ``generate_failed``;
    with ``tracebacks`` its whole story goes to the log (stderr) too."""
    answer = answer_channel()
    stdin = sys.stdin.buffer
    try:
        setup = read_message(stdin)
        if setup is None:
            return 0
        engine = start(setup)
    except Exception as error:
        if tracebacks:
            traceback.print_exc()
        answer({"error": f"{set_up_failed}{one_line(error)}"})
        return 1
    answer({"ready": True, "engine": engine.settings["engine"], "settings": engine.settings})
    # A failing batch is retried seed by seed (the lab charges a crash to the seeds that crash), so
    # one fault can fail 65 requests in a row: its traceback is logged once, a repeat as one line.
    told: set[str] = set()
    while True:
        try:
            request = read_message(stdin)
        except Exception as error:
            answer({"error": f"unreadable request: {one_line(error)}"})
            continue
        if request is None:
            return 0
        try:
            answer(engine.generate(request))
        except Exception as error:
            said = one_line(error)
            if tracebacks and said not in told:
                told.add(said)
                traceback.print_exc()
            elif tracebacks:
                print(f"again: {said}", file=sys.stderr, flush=True)
            answer({"error": f"{generate_failed}{said}"})
