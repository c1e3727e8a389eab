"""Rule specs as typed on the CLI and the pages (``lenience:0.5``, ``medusa:0.09,0.3``): the registry of
rules, the examples, and the parser with its one-line errors."""

from __future__ import annotations

from diagnostics.rules.base import Rule, RuleError
from diagnostics.rules.single import CoS, Cascade, Greedy, Lenience, Lossless, Medusa, Mentored, Typical


RULES: dict[str, type[Rule]] = {
    cls.name: cls for cls in (Lossless, Greedy, Cascade, Typical, Medusa, Lenience, CoS, Mentored)
}
TREE_RULES: tuple[str, ...] = tuple(name for name, cls in RULES.items() if cls.tree_capable)
EXAMPLE_SPECS: tuple[str, ...] = (
    "lossless", "greedy", "cascade:0.5", "typical:0.1", "medusa:0.09,0.3",
    "lenience:0.5", "cos:0.4", "mentored:0.5,2",
)


def split_specs(text: str) -> list[str]:
    """A list of rule specs as typed on the CLI and the Compare page: ``lossless,lenience:0.5,medusa:0.09,0.3``.

    Comma-separated; a bare number continues the previous spec (a rule's own parameters), and
    ``;`` also separates (``lossless;medusa:0.09,0.3``).
    """
    if ";" in text:
        return [piece.strip() for piece in text.split(";") if piece.strip()]
    pieces = [piece.strip() for piece in text.split(",") if piece.strip()]
    specs: list[str] = []
    for piece in pieces:
        # A bare number continues the previous spec (medusa:0.09,0.3).
        if specs and _is_number(piece) and ":" in specs[-1]:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _usage(name: str) -> str:
    cls = RULES[name]
    return name + (":" + ",".join(cls.param_names) if cls.param_names else "")


def get_rule(spec: str | Rule, **params: float) -> Rule:
    """Build a rule from a spec (``"lenience:0.5"``, ``"medusa:0.09,0.3"``) or a name plus keywords.

    ``get_rule("lenience", l=0.5) == get_rule("lenience:0.5")``. Raises ``RuleError`` with a
    one-line message for an unknown name, a wrong parameter count or an out-of-range value.
    """
    if isinstance(spec, Rule):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise RuleError(f"empty rule spec; use one of {', '.join(EXAMPLE_SPECS)}")
    name, _, arg_text = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in RULES:
        raise RuleError(f"unknown rule {name!r}; use one of {', '.join(_usage(n) for n in RULES)} (e.g. lenience:0.5)")
    cls = RULES[name]
    values: dict[str, float] = {}
    if arg_text.strip():
        pieces = [piece.strip() for piece in arg_text.split(",")]
        if len(pieces) != len(cls.param_names):
            raise RuleError(f"rule {name} takes {len(cls.param_names)} parameter(s): write {_usage(name)}")
        for key, piece in zip(cls.param_names, pieces):
            try:
                values[key] = float(piece)
            except ValueError:
                raise RuleError(f"rule {name}: {key}={piece!r} is not a number; write {_usage(name)}") from None
    unknown = set(params) - set(cls.param_names)
    if unknown:
        raise RuleError(f"rule {name} has no parameter {sorted(unknown)[0]!r}; write {_usage(name)}")
    values.update({key: float(value) for key, value in params.items()})
    missing = [key for key in cls.param_names if key not in values]
    if missing:
        raise RuleError(f"rule {name} needs {', '.join(missing)}: write {_usage(name)}, e.g. {_example(name)}")
    try:
        return cls(**values)
    except RuleError as error:
        _, separator, why = str(error).partition(" is out of range: ")
        if not (separator and arg_text.strip()):
            raise
        # Echo what was typed, not its float: "lenience:1e-400" rounds to 0.
        typed = ",".join(piece.strip() for piece in arg_text.split(","))
        rounded = [piece for piece in typed.split(",")
                   if float(piece) == 0 and any(digit in piece.lower().split("e")[0] for digit in "123456789")]
        note = f" ({rounded[0]} rounds to 0 in double precision)" if rounded else ""
        raise RuleError(f"{name}:{typed} is out of range: {why}{note}") from None


def _example(name: str) -> str:
    return next(spec for spec in EXAMPLE_SPECS if spec.split(":")[0] == name)
