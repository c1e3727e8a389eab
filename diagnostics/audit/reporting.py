"""Audit results as plain data: a one-line summary, JSON-safe values, and tables for pages and reports."""

from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    """The same structure with infinities and NaN as ``None`` (strict JSON) and tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def number(value: object, spec: str = ".3g") -> str:
    """A stored number for reading ("–" when absent or not a number: evidence may come from a file)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–"
    return format(value, spec)


def readable_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A table's rows for a page: each float as three significant figures (``number``), so a p of
    1e-22 reads "1e-22", not 0.0000000000000000000001; other cells as they are."""
    return [{name: number(value) if isinstance(value, float) else value for name, value in row.items()} for row in rows]


def seconds_text(value: object) -> str:
    """A stored timestamp to the second ("2026-12-07 18:40:12"), or the value as text."""
    try:
        return value.strftime("%Y-%m-%d %H:%M:%S")  # type: ignore[union-attr]
    except AttributeError:
        return str(value)[:19]


def readable(value: object) -> str:
    """A setting's value as text (not a Python repr): lists joined, mappings as ``key value``,
    ``None`` as "–", a flag as "on" or "off"."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(readable(item) for item in value) or "–"
    if isinstance(value, dict):
        return ", ".join(f"{str(key).replace('_', ' ')} {readable(item)}" for key, item in value.items()) or "–"
    return str(value)


def readable_settings(settings: dict[str, Any]) -> str:
    """An audit's settings on one line for a person: ``speculation off · top k 20`` (snake_case
    keys as words; values through ``readable``). Untrusted: show it through ``md``/``literal``."""
    return " · ".join(f"{str(key).replace('_', ' ')} {readable(value)}" for key, value in settings.items())


def summary_line(result: dict[str, Any]) -> str:
    """One line: layer, what was audited, the verdict, and the evidence that decided it."""
    layer, verdict = result.get("layer"), str(result.get("verdict", "?")).upper()
    if layer == "rule":
        worst = min(result["pairs"], key=lambda pair: pair["adjusted_p"] if pair["adjusted_p"] is not None else 0.0)
        return (f"rule · {result['implementation']} vs {result['reference']} · {verdict} · worst pair '{worst['label']}': "
                f"adjusted p = {number(worst['adjusted_p'])}, observed TV = {number(worst['observed_tv'], '.4f')} · "
                f"{result['n_per_pair']:,} steps × {len(result['pairs'])} pairs · detects TV ≥ {number(result['max_detectable_tv'], '.3f')}")
    if layer == "engine":
        reasons = "; ".join(result.get("reasons") or []) or "PIT uniform at every tested position"
        return (f"engine · {result['implementation']} · {verdict} · {result['tokens']:,} tokens from {result['generations']} "
                f"generations · pooled PIT p = {number(result['p_value'])} · detects PIT-law TV ≥ {number(result['detectable_tv'], '.3f')} · {reasons}")
    if layer == "recorded":
        difference = result.get("max_p_difference")
        return (f"recorded · run {result['run_id']} · {verdict} · {result['positions']} positions · {len(result['flags'])} flags · "
                f"acceptance z = {number(result.get('acceptance_z'), '.2f')} · max |p recorded − p recomputed| = "
                f"{number(difference, '.2g') if difference is not None else 'not recomputed (model not available locally)'}")
    if layer == "external":
        reasons = "; ".join(result.get("reasons") or []) or "PIT uniform at every tested position"
        distortion = result.get("distortion")
        estimate = ("" if distortion is None else
                    f" · distortion {distortion:.3f} [{number(result.get('distortion_low'), '.3f')}, {number(result.get('distortion_high'), '.3f')}]")
        if result.get("rests_on"):  # --oracle server: the verdict is only as honest as the server's scores
            checked = result.get("score_check") or {}
            verdict += (f" (rests on the server's scores; cross-checked against --target at {checked['positions']} positions)"
                        if checked.get("positions") else " (rests on the server's scores being true, unchecked)")
        return (f"external · {result['implementation']} · {verdict} · {result['tokens']:,} tokens from {result['generations']} "
                f"generations of {result['prompts']} prompts · p = {number(result['p_value'])} · detects TV ≥ "
                f"{number(result['detectable_tv'], '.3f')}{estimate} · {reasons}")
    return f"{layer} · {verdict}"


def pair_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Rule level: one row per pair, worst (smallest adjusted p) first."""
    rows = [{"pair": pair["label"], "χ²": pair["statistic"], "dof": pair["dof"], "p": pair["p_value"],
             "Holm-adjusted p": pair["adjusted_p"], "observed TV": pair["observed_tv"],
             "detectable TV": pair["detectable_tv"], "pooled mass": pair.get("pooled_mass", 0.0),
             "impossible": pair["impossible"]} for pair in result["pairs"]]
    return sorted(rows, key=lambda row: row["Holm-adjusted p"] if row["Holm-adjusted p"] is not None else 0.0)


def worst_position_rows(result: dict[str, Any], limit: int = 10) -> list[dict[str, Any]]:
    """Engine level: output positions by Holm-adjusted p; recorded: flags first, then largest |Δp|."""
    if result.get("layer") in ("engine", "external"):
        rows = [{"output position": item["position"], "tokens": item["tokens"], "χ²": item["statistic"],
                 "p": item["p_value"], "Holm-adjusted p": item["adjusted_p"]} for item in result.get("positions", [])]
        return sorted(rows, key=lambda row: row["Holm-adjusted p"])[:limit]
    if result.get("layer") == "recorded":
        flagged = [{"position": flag["position"], "check": flag["check"], "detail": flag["detail"]} for flag in result.get("flags", [])]
        rest = [{"position": item["position"], "check": "largest |p recorded − p recomputed|",
                 "detail": f"{item['kind']} token {item['token']}: {item['p_difference']:.3g}"} for item in result.get("worst_positions", [])]
        return (flagged + rest)[:limit]
    return []


def worst_prompt_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """External audit: the prompts whose own PIT is least uniform (Holm across prompts), smallest p first."""
    return [{"prompt": item["prompt"][:200], "generations": item["generations"], "tokens": item["tokens"], "p": item["p_value"],
             "Holm-adjusted p": item["adjusted_p"]} for item in result.get("worst_prompts") or []]


# -- the structure a stored audit's evidence must have to be shown ---------------------------

def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional_number(value: Any) -> bool:
    return value is None or _is_number(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _list_of(item: Any) -> Any:
    return lambda value: isinstance(value, list) and all(_matches(element, item) for element in value)


def _matches(value: Any, spec: Any) -> bool:
    if isinstance(spec, dict):
        return isinstance(value, dict) and _fields_problem(value, spec) is None
    return bool(spec(value))


# Keys that must be present (others may be); a key ending in "?" is optional.
_PAIR = {"label": _text, "statistic": _optional_number, "dof": _whole, "p_value": _optional_number,
         "adjusted_p": _optional_number, "observed_tv": _optional_number, "detectable_tv": _optional_number,
         "impossible": _whole, "pooled_mass?": _optional_number}
_POSITION_TEST = {"position": _whole, "tokens": _whole, "statistic": _optional_number, "p_value": _optional_number,
                  "adjusted_p": _is_number}
_FLAG = {"position": _whole, "check": _text, "detail": _text}
_WORST = {"position": _whole, "kind": _text, "token": _whole, "p_difference": _is_number}
_COMMON = {"layer": _text, "verdict": lambda value: value in ("pass", "fail"), "settings?": lambda value: isinstance(value, dict),
           "reasons?": _list_of(_text)}
EVIDENCE_FIELDS: dict[str, dict[str, Any]] = {
    "rule": {**_COMMON, "implementation": _text, "reference": _text, "level": _is_number, "n_per_pair": _whole,
             "max_detectable_tv": _optional_number, "pairs": _list_of(_PAIR)},
    "engine": {**_COMMON, "implementation": _text, "generations": _whole, "tokens": _whole, "p_value": _optional_number,
               "detectable_tv": _optional_number, "level": _is_number, "bin_counts?": _list_of(_whole),
               "positions?": _list_of(_POSITION_TEST)},
    "external": {**_COMMON, "verdict": lambda value: value in ("pass", "fail", "inconclusive"), "implementation": _text,
                 "design": _text, "source": _text, "generations": _whole, "tokens": _whole, "prompts": _whole,
                 "p_value": _optional_number, "detectable_tv": _optional_number, "detect_tv": _is_number, "level": _is_number,
                 "distortion?": _optional_number, "distortion_low?": _optional_number, "distortion_high?": _optional_number,
                 "bin_counts?": _list_of(_whole), "positions?": _list_of(_POSITION_TEST),
                 "worst_prompts?": _list_of({"prompt": _text, "generations": _whole, "tokens": _whole,
                                             "p_value": _optional_number, "adjusted_p": _optional_number}),
                 "rests_on?": lambda value: value is None or _text(value),
                 "score_check?": lambda value: value is None or (isinstance(value, dict) and _whole(value.get("positions")))},
    "recorded": {**_COMMON, "run_id": _text, "positions": _whole, "acceptance_z": _optional_number,
                 "max_p_difference": _optional_number, "flags": _list_of(_FLAG), "worst_positions?": _list_of(_WORST)},
}


def _fields_problem(value: dict, spec: dict[str, Any]) -> str | None:
    for key, check in spec.items():
        name = key.rstrip("?")
        if name not in value:
            if key.endswith("?"):
                continue
            return f"lacks {name!r}"
        if not _matches(value[name], check):
            return f"has an unusable {name!r}"
    return None


def evidence_problem(evidence: Any) -> str | None:
    """Why stored audit evidence cannot be shown (a phrase: "lacks 'pairs'"), or ``None`` when the
    summary line, tables, chart and report can all be built from it."""
    if not isinstance(evidence, dict):
        return "is not a JSON object"
    layer = evidence.get("layer")
    if layer not in EVIDENCE_FIELDS:
        return "has no known layer (rule, engine, external or recorded)"
    problem = _fields_problem(evidence, EVIDENCE_FIELDS[layer])
    if problem is None and layer == "rule" and not evidence["pairs"]:
        problem = "has no pairs"
    return problem
