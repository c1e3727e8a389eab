"""A sweep's stored settings: written with the sweep, read back to run or resume it, and checked
once when a shared file is opened.

``settings`` is a JSON object: ``prompts`` (``[{"id", "prompt", "checker"}]``), ``rules`` (rule
specs, ranges expanded), ``seeds``, ``request`` (the generation settings every run shares:
``SHARED_FIELDS``, ``policy``, ``draft_policy``), ``prompt_file``, ``target`` and, once the models
are loaded, ``cost``: the draft/target cost ratio ``{"ratio": c, "source": …}`` the sweep's
modelled speed-ups use everywhere (CLI, page, report), so they agree. A shared file's
settings are untrusted: ``check_settings`` says in one phrase what a page, a report or a resume
could not use (wrong types, unknown keys, a checker without its fields, a HumanEval task that
does not exist, a regex RE2 refuses, a rule or drafter that does not parse), and nothing else
reads settings that did not pass it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from diagnostics.evaluation.plan import Unit, unit_members, units
from diagnostics.evaluation.prompts import MAX_PROMPTS, PromptItem, PromptSetError, parse_checker
from diagnostics.policy import Policy
from diagnostics.request import RunRequest, check_prompt_text

# RunRequest fields a sweep shares across its runs (prompt, rule and seed vary by member and unit).
SHARED_FIELDS = ("draft", "gamma", "max_new_tokens", "raw", "top_k_record", "tree", "tree_children", "tree_budget", "tree_depth", "draft_stop")
MAX_SEEDS = 100_000
MAX_UNITS = 10_000_000
SETTINGS_KEYS = {"prompt_file", "prompts", "rules", "seeds", "request", "target", "cost"}
MAX_STORED_COST = 1000.0  # a stored c above this is no timing of a draft step but a broken file
COST_DIGITS = 4  # c is stored (and printed, and used) rounded to this many decimals, so every reader gets the same speed-ups
# Where a stored c came from, as the CLI's JSON and the Sweeps page say it.
COST_SOURCES = {"measured": "measured on the machine that ran the sweep", "given": "given with --cost when the sweep ran"}


class SweepSettingsError(ValueError):
    """Settings a page, report or resume cannot use; the message says what is wrong."""


def settings_of(prompts: list[PromptItem], rules: list[str], seeds: int, base: RunRequest, prompt_file: str) -> dict[str, Any]:
    """Everything needed to run (and re-run) the sweep, stored with it as JSON."""
    return {
        "prompt_file": prompt_file,
        "prompts": [{"id": item.id, "prompt": item.prompt, "checker": item.checker} for item in prompts],
        "rules": rules, "seeds": seeds,
        "request": {**{name: getattr(base, name) for name in SHARED_FIELDS}, "policy": base.policy.as_dict(),
                    "draft_policy": base.draft_policy.as_dict() if base.draft_policy is not None else None},
    }


def base_request(settings: dict[str, Any]) -> RunRequest:
    """The shared request stored in ``settings`` (prompt and seed are placeholders)."""
    shared = dict(settings["request"])
    policy = Policy(**shared.pop("policy"))
    draft_policy = shared.pop("draft_policy")
    return RunRequest(prompt="-", policy=policy, draft_policy=Policy(**draft_policy) if draft_policy else None, **shared)


def plan_units(settings: dict[str, Any]) -> list[Unit]:
    """The sweep's (prompt, seed) units, prompt-major."""
    prompts = settings["prompts"]
    return units([item["id"] for item in prompts], [item["prompt"] for item in prompts], int(settings["seeds"]))


def checkers_of(settings: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Each prompt id's checker (``None`` for a prompt without one)."""
    return {item["id"]: item.get("checker") for item in settings["prompts"]}


def with_cost(settings: dict[str, Any], ratio: float, source: str) -> dict[str, Any]:
    """``settings`` with the sweep's cost ratio ``c`` (rounded to ``COST_DIGITS``) and its source."""
    if source not in COST_SOURCES:
        raise ValueError(f"a cost ratio's source is one of {sorted(COST_SOURCES)}, got {source!r}")
    return {**settings, "cost": {"ratio": round(float(ratio), COST_DIGITS), "source": source}}


def stored_cost(settings: dict[str, Any]) -> tuple[float, str] | None:
    """The sweep's stored ``(c, source)``, or ``None`` for a sweep stored without one (older versions)."""
    cost = settings.get("cost")
    return None if cost is None else (float(cost["ratio"]), str(cost["source"]))


NO_STORED_COST = 0.0  # c for a sweep of an older version stored without one and no c given: a free draft step


def checked_cost(given: float | str | None, flag: str = "--cost") -> float | str | None:
    """A c given by the user (``--cost``): ``None``, ``"analytic"`` (``cost.ANALYTIC``: the c the
    pair's shapes imply, ``resolve_cost``), or a number from 0 to ``MAX_STORED_COST`` (NaN fails
    too); ``ValueError`` naming ``flag`` otherwise."""
    from diagnostics.cost import ANALYTIC

    if given == ANALYTIC:
        return given
    if given is not None and not 0 <= given <= MAX_STORED_COST:
        raise ValueError(f"{flag} must be a number from 0 to {MAX_STORED_COST:g} (draft step / target step), or analytic, got {given}")
    return given


def cost_option(text: str) -> float | str:
    """``--cost``'s argparse type: ``analytic`` (any case), or a number (checked by ``checked_cost``)."""
    from diagnostics.cost import ANALYTIC

    return ANALYTIC if text.strip().lower() == ANALYTIC else float(text)


cost_option.__name__ = "cost"  # argparse names the type in its message: "invalid cost value: 'x'"


def sweep_analytic_cost(settings: dict[str, Any]):
    """``cost.pair_analytic_cost`` for the sweep's drafter and target, read without loading them:
    an early exit (``L/N``, N from the target's config) or an n-gram (0); ``None`` otherwise."""
    from diagnostics.cost import pair_analytic_cost
    from diagnostics.models import layer_count

    draft = (settings.get("request") or {}).get("draft")
    if not isinstance(draft, str):
        return None
    return pair_analytic_cost(draft, target_layers=layer_count(settings.get("target") or "default"))


def stored_cost_flag(settings: dict[str, Any]) -> str | None:
    """``cost.cost_flag`` for the c measured when the sweep ran, against the analytic one where
    known (no spread is stored; a c the user gave with ``--cost`` is theirs and not flagged)."""
    from diagnostics.cost import cost_flag
    from diagnostics.models import ModelError, parse_draft

    stored = stored_cost(settings)
    if stored is None or stored[1] != "measured":
        return None
    try:
        kind = parse_draft(str((settings.get("request") or {}).get("draft"))).kind
    except ModelError:
        return None
    return cost_flag(kind, stored[0], sweep_analytic_cost(settings))


def resolve_cost(settings: dict[str, Any], given: float | str | None) -> tuple[float, str]:
    """The cost ratio ``c`` a sweep's modelled speed-ups use, and where it comes from in words: the
    ``given`` one (``--cost``; ``analytic``: ``sweep_analytic_cost``'s, rounded to ``COST_DIGITS``),
    else the one stored with the sweep, else ``NO_STORED_COST`` for a sweep of an older version
    stored without one. The CLI, the report and the Sweeps page all take c from here, so they
    print the same speed-ups with the same phrase."""
    from diagnostics.cost import ANALYTIC

    if checked_cost(given) == ANALYTIC:
        analytic = sweep_analytic_cost(settings)
        if analytic is None:
            raise ValueError("--cost analytic: this sweep's drafter has no analytic c known without loading its models "
                             "(an early exit of a target with a known layer count, or an n-gram, has one); give a number")
        return round(analytic.ratio, COST_DIGITS), f"analytic (--cost analytic): {analytic.basis}"
    if given is not None:
        return float(given), "--cost of this command"
    stored = stored_cost(settings)
    if stored is None:
        return NO_STORED_COST, (f"none stored with this older sweep: c = {NO_STORED_COST:g} assumed, a free draft step "
                                "(give --cost, or resume the sweep to store one)")
    return stored[0], f"stored with the sweep: {COST_SOURCES[stored[1]]}"


def parse_settings(text: str | None) -> dict[str, Any]:
    """Stored settings (JSON text) parsed within bounds (``untrusted_json``: a shared file's are
    untrusted) and checked (``check_settings``); ``SweepSettingsError`` otherwise, with one phrase
    completing "the settings of sweep S …"."""
    from diagnostics.untrusted_json import loads

    try:
        value = loads(text, "settings") if text is not None else None
    except ValueError as error:
        raise SweepSettingsError(f"are not JSON this tool accepts ({str(error)[:160]})") from None
    return check_settings(value)


def check_settings(value: Any) -> dict[str, Any]:
    """``value`` when it is settings this tool can run, show and resume; else ``SweepSettingsError``
    with one phrase (completing "the settings of sweep S …")."""
    if not isinstance(value, dict):
        raise SweepSettingsError(f"are not a JSON object but {_kind(value)}")
    unknown = sorted(set(value) - SETTINGS_KEYS)
    if unknown:
        raise SweepSettingsError(f"have the unknown key {unknown[0][:40]!r}")
    for key in ("prompt_file", "target"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise SweepSettingsError(f"have a {key} that is {_kind(value[key])}, not text")
    prompts = value.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise SweepSettingsError(f"have no prompts (\"prompts\" is {_kind(prompts)}, not a non-empty list)")
    if len(prompts) > MAX_PROMPTS:
        raise SweepSettingsError(f"have more than {MAX_PROMPTS:,} prompts")
    seen: set[str] = set()
    for number, item in enumerate(prompts, start=1):
        where = f"have prompt {number}"
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not isinstance(item.get("prompt"), str) \
                or not item["prompt"].strip():
            raise SweepSettingsError(f"{where} without a text \"id\" and a non-empty \"prompt\"")
        if set(item) - {"id", "prompt", "checker"}:
            raise SweepSettingsError(f"{where} with the unknown key {sorted(set(item) - {'id', 'prompt', 'checker'})[0][:40]!r}")
        try:
            check_prompt_text(item["prompt"])
        except ValueError as error:
            raise SweepSettingsError(f"{where} that cannot be run: {error}") from None
        if item["id"] in seen:
            raise SweepSettingsError(f"have the prompt id {item['id'][:60]!r} twice")
        seen.add(item["id"])
        try:
            if parse_checker(item.get("checker"), where) != item.get("checker"):
                raise SweepSettingsError(f"{where} whose checker has keys of no checker")
        except PromptSetError as error:
            raise SweepSettingsError(str(error)) from None
    seeds = value.get("seeds")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= MAX_SEEDS:
        raise SweepSettingsError(f"have seeds {_shown(seeds)}, not a whole number from 1 to {MAX_SEEDS:,}")
    if len(prompts) * seeds > MAX_UNITS:
        raise SweepSettingsError(f"plan more than {MAX_UNITS:,} units")
    _check_cost(value.get("cost"))
    rules = value.get("rules")
    if not isinstance(rules, list) or not rules or not all(isinstance(rule, str) for rule in rules):
        raise SweepSettingsError("have no rules (\"rules\" must be a non-empty list of rule specs)")
    request = value.get("request")
    if not isinstance(request, dict) or set(request) != {*SHARED_FIELDS, "policy", "draft_policy"}:
        raise SweepSettingsError("have generation settings (\"request\") without exactly this tool's fields")
    try:
        if not isinstance(request["policy"], dict) or not isinstance(request["draft_policy"], (dict, type(None))):
            raise ValueError("a policy is not a JSON object")
        base = replace(base_request(value), prompt=prompts[0]["prompt"])
        for member in unit_members(base, rules):
            member.request.validate()
    except (ValueError, TypeError, AttributeError) as error:
        raise SweepSettingsError(f"cannot be run: {str(error).splitlines()[0][:120] if str(error) else error.__class__.__name__}") from None
    return value


def _check_cost(cost: Any) -> None:
    """A stored cost ratio: absent, or ``{"ratio": finite number in [0, MAX_STORED_COST], "source": one of COST_SOURCES}``."""
    if cost is None:
        return
    if not isinstance(cost, dict) or set(cost) != {"ratio", "source"} or cost["source"] not in COST_SOURCES:
        raise SweepSettingsError(f"have a cost that is not {{\"ratio\": c, \"source\": {' or '.join(map(repr, COST_SOURCES))}}}")
    ratio = cost["ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= MAX_STORED_COST:
        raise SweepSettingsError(f"have a cost ratio {_shown(ratio)}, not a number from 0 to {MAX_STORED_COST:g}")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", type(None): "null", bool: "true or false"}.get(type(value), "a number")


def _shown(value: Any) -> str:
    return repr(value)[:40]
