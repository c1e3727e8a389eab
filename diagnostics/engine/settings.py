"""What the engine checks before any model work: ranges, the context, the draft stop, tree settings,
and the EOS ids of a target. Every failure is an ``EngineError`` whose one line says what to change.
"""

from __future__ import annotations

import operator
from typing import Any

from diagnostics.models import LoadedModel, is_draft_head
from diagnostics.rules import Rule
from diagnostics.engine.tree_draft import TreeSpec, parse_tree


class EngineError(ValueError):
    """Bad generation settings; the message says what to change."""


def eos_ids(loaded: LoadedModel, eos_token_id: int | list[int] | None) -> set[int]:
    if eos_token_id is not None:
        return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    found: set[int] = set()
    config = getattr(loaded.model, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), getattr(loaded.model.config, "eos_token_id", None)):
        if isinstance(source, int):
            found.add(source)
        elif isinstance(source, (list, tuple)):
            found.update(int(value) for value in source)
    if loaded.tokenizer is not None and loaded.tokenizer.eos_token_id is not None:
        found.add(int(loaded.tokenizer.eos_token_id))
    return found


def check_draft_stop(draft_stop: float | None, draft: Any) -> None:
    """``--draft-stop`` is a probability in (0, 1], for a drafter with a law (a model or an early exit)."""
    if draft_stop is None:
        return
    if isinstance(draft_stop, bool) or not isinstance(draft_stop, (int, float)) or not 0 < float(draft_stop) <= 1:
        raise EngineError(f"--draft-stop must be a probability in (0, 1] (stop drafting after a draft x with q(x) below it), got {draft_stop!r}")
    if draft is None:
        raise EngineError("--draft-stop needs a drafter (e.g. --draft early-exit:26); plain decoding drafts nothing")
    if isinstance(draft, str) and draft.strip().lower().startswith("ngram"):
        raise EngineError("--draft-stop reads the draft's confidence q(x); an n-gram draft is a point mass (q(x) = 1): "
                          "use a model or early-exit drafter")
    if is_draft_head(draft):
        raise EngineError("--draft-stop is for model and early-exit drafters; drop it with an EAGLE-3 or Medusa head")


def tree_spec_or_error(tree: Any, budget: Any, depth: Any, children: str | None) -> TreeSpec | None:
    """``parse_tree`` with its errors as ``EngineError`` (one line, says what to write)."""
    try:
        return parse_tree(tree, budget, depth, children)
    except ValueError as error:
        raise EngineError(str(error)) from None


def check_tree_settings(spec: TreeSpec, rule: Rule, draft: Any) -> None:
    """A tree needs a drafter that drafts trees, a rule with a tree form, and, for sampled
    children, the lossless rule (the lossy tree rules are defined for ordered deterministic
    candidates, as EAGLE drafts them)."""
    if draft is None:
        raise EngineError("a tree needs a drafter (e.g. --draft early-exit:26); plain decoding has nothing to verify")
    if not rule.tree_capable:
        from diagnostics.rules import TREE_RULES

        raise EngineError(f"rule {rule.spec!r} has no tree form; tree rules: {', '.join(TREE_RULES)}")
    if spec.children != "top" and rule.lossy:
        raise EngineError(f"lossy tree rules try ordered deterministic candidates; {rule.spec} needs --tree-children top "
                          f"(sampled children, {spec.children}, are verified losslessly only)")
    if isinstance(draft, str) and draft.strip().lower().startswith("ngram") and spec.children != "top":
        raise EngineError("n-gram drafts are deterministic; use --tree-children top with an n-gram drafter")


# Hard limits whatever the model: they fit the store's INTEGER and BIGINT columns, and a model
# with no stated context cannot take more anyway.
MAX_GAMMA = 1024
MAX_NEW_TOKENS = 1_000_000
MAX_SEED = 2**63 - 1


def _whole(name: str, value: object, low: int, high: int, hint: str) -> int:
    try:
        value = operator.index(value)  # ints and numpy integers; a float or a string is refused
    except TypeError:
        raise EngineError(f"{name} must be a whole number, got {value!r}") from None
    if not low <= value <= high:
        raise EngineError(f"{name} must lie in [{low}, {high:,}] ({hint}), got {value:,}")
    return value


def check_numbers(gamma: int, max_new_tokens: int, seed: int, top_k_record: int) -> None:
    """γ, the token budget, the seed and the recorded top-k are whole numbers in range."""
    _whole("gamma", gamma, 0, MAX_GAMMA, "draft tokens per block")
    _whole("max-new-tokens", max_new_tokens, 1, MAX_NEW_TOKENS, "the token budget")
    _whole("seed", seed, 0, MAX_SEED, "the run's random stream")
    _whole("the recorded top-k", top_k_record, 1, 100_000, "top tokens of p and q stored per position")


def check_settings(loaded: LoadedModel, prompt: list[int], gamma: int, max_new_tokens: int, seed: int, top_k_record: int) -> None:
    """Everything ``generate`` checks before any model work: ranges of γ, the token budget, the
    seed and the recorded top-k, and that prompt + budget + γ fit the target's context. Callers
    that record a run call it first, so a run that cannot start leaves nothing behind."""
    if not prompt:
        raise EngineError("the prompt is empty; give at least one token")
    check_numbers(gamma, max_new_tokens, seed, top_k_record)
    limit = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    if limit is not None:
        if len(prompt) + gamma + 2 > limit:
            what = "gamma" if gamma >= len(prompt) else "the prompt"
            raise EngineError(
                f"{what} does not fit the target's context of {limit:,} tokens: the prompt has {len(prompt):,} tokens "
                f"and gamma is {gamma:,}; " + ("lower gamma" if what == "gamma" else "shorten the prompt")
            )
        if len(prompt) + max_new_tokens + gamma + 1 > limit:
            room = limit - len(prompt) - gamma - 1
            raise EngineError(
                f"max-new-tokens {max_new_tokens:,} does not fit the target's context of {limit:,} tokens "
                f"(prompt {len(prompt):,} tokens, gamma {gamma:,}): use at most {room:,}, or shorten the prompt"
            )
    vocab = loaded.vocab_size
    if any(token < 0 or token >= vocab for token in prompt):
        raise EngineError(f"prompt token ids must lie in [0, {vocab})")
