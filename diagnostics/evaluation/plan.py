"""What a sweep runs: rule ranges expanded, (prompt, seed) units, and each unit's coupled members.

Every unit runs, on one prompt with one seed (so all its members share every uniform):
the lossless run, each rule, and each rule's matched baseline that is not the lossless run
itself (``cascade:m`` ↔ lossless under min-p ``m``; ``typical:η`` ↔ lossless under eta ``η``;
the same drafts). Differences between members of one unit are therefore paired.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from diagnostics.engine import EngineError
from diagnostics.rules import get_rule
from diagnostics.request import RunRequest, matched_baseline

MAX_RANGE_VALUES = 50
_RANGE = re.compile(r"^\s*([-+0-9.eE]+)\s*\.\.\s*([-+0-9.eE]+)\s*:\s*([0-9]+)\s*$")


def expand_rule(spec: str) -> list[str]:
    """``lenience:0.2..1.0:5`` → ``lenience:0.2, lenience:0.4, …, lenience:1``: one parameter may be a
    range ``LOW..HIGH:COUNT`` (evenly spaced, both ends included); each value must make a valid rule."""
    name, _, params = spec.strip().partition(":")
    pieces = params.split(",") if params else []
    ranged = [index for index, piece in enumerate(pieces) if ".." in piece]
    if not ranged:
        return [get_rule(spec).spec]
    if len(ranged) > 1:
        raise EngineError(f"rule {spec!r}: only one parameter may be a range LOW..HIGH:COUNT")
    match = _RANGE.match(pieces[ranged[0]])
    if match is None:
        raise EngineError(f"rule {spec!r}: write a range as LOW..HIGH:COUNT, e.g. lenience:0.2..1.0:5")
    low, high, count = float(match.group(1)), float(match.group(2)), int(match.group(3))
    if not 1 <= count <= MAX_RANGE_VALUES:
        raise EngineError(f"rule {spec!r}: a range takes 1 to {MAX_RANGE_VALUES} values, got {count}")
    values = [low] if count == 1 else [low + (high - low) * index / (count - 1) for index in range(count)]
    specs = []
    for value in values:
        pieces[ranged[0]] = f"{value:.6g}"
        specs.append(get_rule(f"{name}:{','.join(pieces)}").spec)  # each value checked like a typed rule
    return list(dict.fromkeys(specs))


@dataclass(frozen=True)
class Member:
    """One run of a unit: its role (``lossless``, ``rule``, ``baseline``), its label and request."""

    role: str
    label: str
    rule_for: str | None
    request: RunRequest


def unit_members(request: RunRequest, rules: list[str]) -> list[Member]:
    """The coupled members of one unit: lossless first, then each rule followed by its matched
    baseline (when that is not the lossless run); a baseline shared by two rules runs once."""
    members = [Member("lossless", "lossless", None, replace(request, rule="lossless"))]
    baselines: dict[tuple, Member] = {}
    for spec in rules:
        if get_rule(spec).name == "lossless":
            continue
        rule_request = replace(request, rule=spec)
        members.append(Member("rule", spec, None, rule_request))
        baseline = matched_baseline(rule_request)
        if baseline is None:
            continue
        key = (baseline.policy, baseline.draft_policy)
        if key not in baselines:
            baselines[key] = Member("baseline", f"baseline of {spec}", spec, baseline)
            members.append(baselines[key])
    return members


@dataclass(frozen=True)
class Unit:
    index: int
    prompt_id: str
    prompt: str
    seed: int


def units(prompt_ids: list[str], prompts: list[str], seeds: int) -> list[Unit]:
    """Prompt-major units: every prompt with seeds ``0 … seeds − 1``."""
    if seeds < 1:
        raise EngineError(f"--seeds must be at least 1, got {seeds}")
    return [Unit(index * seeds + seed, prompt_id, prompt, seed)
            for index, (prompt_id, prompt) in enumerate(zip(prompt_ids, prompts)) for seed in range(seeds)]
