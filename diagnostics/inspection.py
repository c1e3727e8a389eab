"""The laws at one recorded position, for the Inspect page and the report.

Exact when the run's models can be loaded here: ``p`` and ``q`` are recomputed by plain
forward passes on the committed prefix (teacher forcing), with the run's policies. Otherwise
they are rebuilt from the stored top-k of ``p`` and ``q`` with the remaining mass lumped into
one "tail" entry, and the view says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from diagnostics.explain import StepView, explain_step
from diagnostics.models import EMBEDDED_NAME, LoadedModel, ModelError, early_exit_model, load_model, parse_draft
from diagnostics.policy import Policy, probabilities
from diagnostics.rules import get_rule


@dataclass
class PositionView:
    """A position's step view and whether it is exact or rebuilt from the stored top-k."""

    view: StepView
    exact: bool
    note: str


def target_spec(run: dict[str, Any]) -> str:
    """The ``--target`` value that loads a run's target again."""
    return "default" if run["target"] == EMBEDDED_NAME else str(run["target"])


def models_to_load(run: dict[str, Any], trusted: tuple[str, ...] = ("default",)) -> list[str]:
    """The models (paths or hub ids) that recomputing a run's laws would load, except ``trusted``
    ones (the embedded default, the app's configured target). A runs file, maybe a colleague's,
    chooses these names: a caller loads them only after the user says so."""
    named = [target_spec(run)]
    draft = str(run.get("draft") or "")
    try:
        parsed = parse_draft(draft)  # the parse draft_model() loads by: "MODEL: x" is a model too
    except ModelError:
        parsed = None  # plain decoding, or a drafter nothing can load
    if parsed is not None and parsed.kind == "model":
        named.append(parsed.value)
    return [name for name in dict.fromkeys(named) if name not in trusted]


def _policy(text: str | None) -> Policy:
    return Policy(**json.loads(text)) if text else Policy()


@torch.inference_mode()
def teacher_forced_laws(loaded: LoadedModel, prompt_ids: list[int], tokens: list[int], policy: Policy,
                        vocab: int | None = None) -> torch.Tensor:
    """``p_t(· | prompt, y_<t)`` for ``t = 0 … len(tokens)`` (``len(tokens) + 1`` rows, the last one
    after every token), under ``policy`` over ``vocab`` ids (default the model's), from one plain
    cache-free forward: the reference every audit and the Inspect page compare against."""
    from diagnostics.drafters import fit_vocabulary

    ids = torch.tensor([list(prompt_ids) + list(tokens)], device=loaded.device)
    keep = len(tokens) + 1
    logits = loaded.model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits[0, -keep:].float().cpu()
    return probabilities(fit_vocabulary(logits, vocab or loaded.vocab_size), policy)


def draft_model(run: dict[str, Any], target: LoadedModel) -> LoadedModel | None:
    """The run's draft model (``None`` for an n-gram draft); local files only, never the network."""
    draft = parse_draft(run["draft"])
    if draft.kind == "ngram":
        return None
    if draft.kind == "early-exit":
        return early_exit_model(target, int(draft.value))
    return load_model(draft.value, device=target.device, local_only=True)


_LOAD = object()  # exact_laws' default: load the run's draft model itself


def exact_laws(run: dict[str, Any], record: dict[str, Any], target: LoadedModel,
               drafter: Any = _LOAD) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``p`` and ``q`` at a recorded position, recomputed on the committed prefix.

    ``drafter``: the run's ``draft_model`` when the caller already has it (an audit visiting every
    position loads it once); by default it is loaded here.
    """
    if run.get("prompt_ids") is None:
        raise ValueError("the run has no stored prompt ids")
    tokens = list(run["tokens"] or [])
    prefix = list(run["prompt_ids"]) + tokens[: int(record["position"])]
    if max(prefix, default=0) >= target.vocab_size or (record.get("draft_token") or 0) >= target.vocab_size:
        raise ValueError(f"the run has token ids outside this target's vocabulary of {target.vocab_size}")
    vocab = target.vocab_size
    p_target = teacher_forced_laws(target, prefix, [], _policy(run["policy"]), vocab)[0]
    if record["kind"] == "bonus" or record.get("draft_token") is None:
        return p_target, None
    if drafter is _LOAD:
        drafter = draft_model(run, target)
    if drafter is None:  # n-gram: a point mass on the drafted token
        q_draft = torch.zeros(vocab, dtype=torch.float64)
        q_draft[int(record["draft_token"])] = 1.0
        return p_target, q_draft
    return p_target, teacher_forced_laws(drafter, prefix, [], _policy(run["draft_policy"]), vocab)[0]


def _as_list(value: Any) -> list:
    """A stored list column (list, numpy array, or missing) as a plain list."""
    if value is None or isinstance(value, float):
        return []
    return [item.item() if hasattr(item, "item") else item for item in value]


def stored_laws(record: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """``p`` and ``q`` over the union of their stored top-k ids plus one tail entry (last index)."""
    p_ids = _as_list(record.get("p_top_ids"))
    q_ids = _as_list(record.get("q_top_ids"))
    ids = sorted(set(p_ids) | set(q_ids))
    index = {token: position for position, token in enumerate(ids)}

    def rebuild(top_ids: list[int], top_probs: list[float]) -> torch.Tensor:
        law = torch.zeros(len(ids) + 1, dtype=torch.float64)
        for token, probability in zip(top_ids, top_probs):
            law[index[token]] = probability
        law[-1] = max(0.0, 1.0 - float(law.sum()))
        return law

    p_target = rebuild(p_ids, _as_list(record.get("p_top_probs")))
    q_draft = rebuild(q_ids, _as_list(record.get("q_top_probs"))) if q_ids else None
    return p_target, q_draft, ids


def position_view(run: dict[str, Any], record: dict[str, Any], target: LoadedModel | None, decode=None) -> PositionView:
    """The step view at ``record``: exact when ``target`` is given and loads, else from the top-k."""
    rule = get_rule(run["rule"])
    if target is not None:
        try:
            p_target, q_draft = exact_laws(run, record, target)
            if q_draft is None:
                q_draft = p_target  # bonus position: no draft was verified; P is the bonus law
            view = explain_step(rule, p_target, q_draft, _lazy_labels(p_target.numel(), decode))
            return PositionView(view, True, "exact: p and q recomputed by forward passes on the committed prefix")
        except (ModelError, OSError, ValueError) as error:
            note = f"exact laws not available ({str(error).splitlines()[0]}); rebuilt from the stored top-k"
    else:
        note = "rebuilt from the stored top-20 of p and q; the last bar lumps the tail"
    p_target, q_draft, ids = stored_laws(record)
    labels = [decode(token) if decode else str(token) for token in ids] + ["(tail)"]
    view = explain_step(rule, p_target, q_draft if q_draft is not None else p_target, labels)
    return PositionView(view, False, note)


class _lazy_labels(list):
    """Token labels decoded on demand (a 49,152-entry list would cost a decode per token)."""

    def __init__(self, size: int, decode) -> None:
        super().__init__()
        self.size = size
        self.decode = decode

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        return self.decode(index) if self.decode else str(index)

    def __bool__(self) -> bool:
        return self.size > 0
