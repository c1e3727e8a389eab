"""What defines a run, as the user asked for it: ``RunRequest``, read back from a stored run
(``request_from_run``), checked before any model work (``RunRequest.validate``), and the plans
built from requests alone (``matched_baseline``, ``batch_key``).

Nothing here touches a model's weights or the store, so the store's validation of shared files
and the sweep planner can use it from below the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from diagnostics import untrusted_json
from diagnostics.engine import EngineError, check_draft_stop, check_numbers, check_tree_settings, tree_spec_or_error
from diagnostics.engine.tree_draft import TreeSpec, spec_from_text
from diagnostics.models import is_plain_draft, parse_draft
from diagnostics.policy import Policy
from diagnostics.rules import get_rule


@dataclass
class RunRequest:
    """Everything that defines one run, as the user typed it."""

    prompt: str
    rule: str = "lossless"
    draft: str | None = "early-exit:26"
    gamma: int = 4
    max_new_tokens: int = 64
    seed: int = 0
    policy: Policy = Policy()
    draft_policy: Policy | None = None
    raw: bool = False
    top_k_record: int = 20
    tree: str | None = None  # "3,2,1": a tree per round instead of a chain of gamma
    tree_children: str = "top"
    tree_budget: int | None = None
    tree_depth: int | None = None
    draft_stop: float | None = None  # adaptive drafting: end a block after a draft x with q(x) below this

    @property
    def tree_spec(self) -> TreeSpec | None:
        """The tree shape asked for, or ``None`` for a chain (raises ``EngineError`` when malformed)."""
        return tree_spec_or_error(self.tree, self.tree_budget, self.tree_depth, self.tree_children)

    @property
    def depth(self) -> int:
        """Draft tokens a round can add before its bonus: γ for a chain, the tree's depth for a tree."""
        spec = self.tree_spec
        return spec.max_depth if spec is not None else self.gamma

    def validate(self) -> None:
        """Cheap checks before any model work: a known rule spec and drafter, a non-empty prompt in
        valid UTF-8, γ, the token budget, the seed and the recorded top-k in range, and a tree
        shape the rule and drafter can take."""
        rule = get_rule(self.rule)
        drafted = not is_plain_draft(self.draft)
        if drafted:
            parse_draft(self.draft)
        check_prompt_text(self.prompt)
        check_numbers(self.gamma, self.max_new_tokens, self.seed, self.top_k_record)
        spec = self.tree_spec
        if spec is not None:
            check_tree_settings(spec, rule, self.draft if drafted else None)
        check_draft_stop(self.draft_stop, self.draft if drafted else None)
        if self.draft_stop is not None and spec is not None:
            raise EngineError("--draft-stop ends a chain of drafts early; use it without a tree")


def request_from_run(run: dict[str, Any]) -> RunRequest:
    """The request that recorded ``run`` (a ``Store.get_run`` row): its prompt, raw flag, rule,
    drafter, γ, token budget, seed, policy and draft policy, so that recording it again on the same
    models repeats the run token for token. Raises ``ValueError`` (one line) for a row that does
    not say how it was made."""
    def policy_of(text: Any, column: str) -> Policy:
        try:
            values = untrusted_json.loads(text, f"run {run.get('run_id')!r}'s {column}") if text else {}
            if not isinstance(values, dict):
                raise ValueError("not a JSON object")
            return Policy(**values)
        except (ValueError, TypeError) as error:
            raise ValueError(f"run {run.get('run_id')!r} has an unusable {column} ({error}); it cannot be replayed") from None

    missing = [name for name in ("prompt", "rule", "seed", "max_new_tokens") if run.get(name) is None]
    if missing:
        raise ValueError(f"run {run.get('run_id')!r} has no {missing[0]}; it cannot be replayed")
    draft = str(run.get("draft") or "").strip()
    draft_spec = None if is_plain_draft(draft) else draft
    policy = policy_of(run.get("policy"), "policy")
    draft_policy = policy_of(run.get("draft_policy"), "draft policy") if run.get("draft_policy") else policy
    try:
        spec = spec_from_text(run.get("tree"), run.get("tree_children"))
    except ValueError as error:
        raise ValueError(f"run {run.get('run_id')!r} has an unusable tree ({error}); it cannot be replayed") from None
    tree_fields = {}
    if spec is not None:
        tree_fields = ({"tree": spec.text} if spec.fixed else {"tree_budget": spec.budget, "tree_depth": spec.depth})
        tree_fields["tree_children"] = spec.children
    return RunRequest(
        prompt=run["prompt"], rule=run["rule"], draft=draft_spec, gamma=int(run.get("gamma") or 0),
        max_new_tokens=int(run["max_new_tokens"]), seed=int(run["seed"]), policy=policy,
        draft_policy=None if draft_policy == policy else draft_policy, raw=bool(run.get("raw_prompt")), **tree_fields,
        draft_stop=_stored_float(run.get("draft_stop")),
    )


def _stored_float(value: Any) -> float | None:
    """A nullable DOUBLE as read back (``None``, NaN from pandas, or a number)."""
    return None if value is None or value != value else float(value)


def check_prompt_text(text: str) -> None:
    """A prompt must be non-empty text that UTF-8 can encode (a terminal in another encoding
    hands Python undecodable bytes as lone surrogates, which no tokenizer takes)."""
    if not isinstance(text, str) or not text.strip():
        raise EngineError("the prompt is empty; type some text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = text[error.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"character U+{ord(bad):04X}"
        raise EngineError(f"the prompt is not valid UTF-8 text ({byte} at character {error.start}); "
                          "pass it in UTF-8 (check your terminal's or file's encoding)") from None


def batch_key(request: RunRequest) -> tuple:
    """What the rows of one batch share: the drafter, γ or the tree, the draft stop, the recorded top-k."""
    spec = request.tree_spec
    return (request.draft or None, request.gamma if spec is None else None, spec, request.draft_stop, request.top_k_record)


def matched_baseline(request: RunRequest) -> RunRequest | None:
    """The matched baseline of a truncation rule's request: lossless under the same truncation as a
    target policy (``cascade:m`` → min-p ``m``, ``typical:η`` → eta ``η``, ``medusa:ε,δ`` → the
    Medusa gate ``ε, δ``) with the draft policy left as it was, so the same drafts (the same
    tree) are verified and only the verification differs. ``None`` for a rule whose baseline is
    the lossless run itself (``p``).

    The rule's gate acts on the target's law after the user's whole policy, so it is folded into the
    policy only where that is exact: min-p ``m`` over a min-p ``m₀`` keeps ``p ≥ max(m, m₀)·max p`` (one
    min-p), and only when no eta stage follows it; eta and the Medusa gate only where the policy has none
    yet (eta of an eta-truncated law is not one eta). Any other mix raises ``EngineError`` rather than
    silently measuring against a looser or stricter baseline than the rule's."""
    rule = get_rule(request.rule)
    policy = request.policy
    if rule.name == "cascade":
        if policy.eta is not None or policy.medusa_eps is not None:
            raise _unfoldable(request.rule, "its gate acts after the policy's eta, which a min-p cannot express")
        folded = {"min_p": max(float(rule.m), float(policy.min_p or 0.0))}
    elif rule.name == "typical":
        if policy.eta is not None or policy.medusa_eps is not None:
            raise _unfoldable(request.rule, f"the policy already sets eta {policy.eta:g}" if policy.eta is not None
                              else "the policy already sets a Medusa gate")
        folded = {"eta": float(rule.eta)}
    elif rule.name == "medusa":
        if policy.medusa_eps is not None:
            raise _unfoldable(request.rule, "the policy already sets a Medusa gate")
        folded = {"medusa_eps": float(rule.eps), "medusa_delta": float(rule.delta)}
    else:
        return None
    return replace(request, rule="lossless", policy=replace(policy, **folded),
                   draft_policy=request.draft_policy or request.policy)


def _unfoldable(rule: str, why: str) -> EngineError:
    return EngineError(f"{rule} has no matched baseline run under this target policy: {why}; drop that "
                       f"truncation from the target policy")


__all__ = ["RunRequest", "batch_key", "check_prompt_text", "matched_baseline", "request_from_run"]
