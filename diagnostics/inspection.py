"""The laws at recorded positions, for the Inspect page, the Compare page and the report.

Exact when the run's models can be loaded here: ``RunLaws`` runs one teacher-forced forward of
the target over prompt + output (and one of the draft) and keeps each position's final hidden
state, so ``p`` and ``q`` at any position cost one head projection, not a forward. Otherwise
they are rebuilt from the stored top-k of ``p`` and ``q`` with the remaining mass lumped into
one "tail" entry, and the view says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from diagnostics.explain import StepView, explain_step
from diagnostics.engine.drafting import fit_vocabulary
from diagnostics.models import (
    EMBEDDED_NAME,
    LoadedModel,
    ModelError,
    early_exit_model,
    float_logits,
    is_draft_head,
    load_model,
    parse_draft,
)
from diagnostics.policy import Policy, probabilities
from diagnostics.rules import get_rule
from diagnostics.untrusted_json import loads


@dataclass
class PositionView:
    """A position's step view and whether it is exact or rebuilt from the stored top-k."""

    view: StepView
    exact: bool
    note: str
    ids: list[int] | None = None  # rebuilt views: the token id of each index (the last, the tail, has none)

    def index_of(self, token: Any, missing: int | None = None) -> int | None:
        """Where token id ``token`` sits in ``view``'s laws: the id itself when exact; in a rebuilt
        view its index among the stored top-k ids, else ``missing`` (the tail is index
        ``len(ids)``). ``None`` for no token (``None``, or NaN from a DataFrame row)."""
        if token is None or token != token:
            return None
        if self.ids is None:
            return int(token)
        return {stored: where for where, stored in enumerate(self.ids)}.get(int(token), missing)


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
    if parsed is not None and parsed.kind in ("model", "eagle3", "medusa"):
        named.append(parsed.value)
    return [name for name in dict.fromkeys(named) if name not in trusted]


def _policy(text: str | None) -> Policy:
    return Policy(**loads(text, "the run's policy", allow_non_finite=True)) if text else Policy()  # stored JSON: bounded parse


@torch.inference_mode()
def teacher_forced_laws(loaded: LoadedModel, prompt_ids: list[int], tokens: list[int], policy: Policy,
                        vocab: int | None = None) -> torch.Tensor:
    """``p_t(· | prompt, y_<t)`` for ``t = 0 … len(tokens)`` (``len(tokens) + 1`` rows, the last one
    after every token), under ``policy`` over ``vocab`` ids (default the model's), from one plain
    cache-free forward: the reference every audit and the Inspect page compare against."""

    ids = torch.tensor([list(prompt_ids) + list(tokens)], device=loaded.device)
    keep = len(tokens) + 1
    logits = float_logits(loaded.model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits[0, -keep:]).cpu()
    return probabilities(fit_vocabulary(logits, vocab or loaded.vocab_size), policy)


def draft_model(run: dict[str, Any], target: LoadedModel) -> Any:
    """The run's draft model, or its draft head (``heads.LoadedHead``), or ``None`` for an n-gram
    draft; local files only, never the network."""
    draft = parse_draft(run["draft"])
    if draft.kind == "ngram":
        return None
    if draft.kind == "early-exit":
        return early_exit_model(target, int(draft.value))
    if draft.kind in ("eagle3", "medusa"):
        from diagnostics.heads.layout import load_head

        return load_head(draft.kind, draft.value, target, local_only=True)
    return load_model(draft.value, device=target.device, local_only=True)


def head_q(drafter: Any, target: LoadedModel, prompt: list[int], tokens: list[int], record: dict[str, Any],
           policy: Policy) -> torch.Tensor:
    """A head's ``q`` at a drafted record: the block began ``index_in_block`` tokens before it
    (``heads.check.reference_q``: recomputed from the target's own forward)."""
    from diagnostics.heads.check import reference_q

    position, index = int(record["position"]), int(record.get("index_in_block") or 0)
    begin = max(0, position - index)
    return reference_q(drafter, target, list(prompt) + list(tokens[:begin]), list(tokens[begin:position]), policy)


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
    if drafter is None:  # n-gram: a point mass on the drafted token, on the host as p_target is
        q_draft = torch.zeros(vocab, dtype=torch.float64, device=p_target.device)
        q_draft[int(record["draft_token"])] = 1.0
        return p_target, q_draft
    if is_draft_head(drafter):
        return p_target, head_q(drafter, target, list(run["prompt_ids"]), tokens, record, _policy(run["draft_policy"]))
    return p_target, teacher_forced_laws(drafter, prefix, [], _policy(run["draft_policy"]), vocab)[0]


def as_list(value: Any) -> list:
    """A stored list column (list, numpy array, or missing) as a plain list."""
    if value is None or isinstance(value, float):
        return []
    return [item.item() if hasattr(item, "item") else item for item in value]


def stored_laws(record: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """``p`` and ``q`` over the union of their stored top-k ids plus one tail entry (last index)."""
    p_ids = as_list(record.get("p_top_ids"))
    q_ids = as_list(record.get("q_top_ids"))
    ids = sorted(set(p_ids) | set(q_ids))
    index = {token: position for position, token in enumerate(ids)}

    def rebuild(top_ids: list[int], top_probs: list[float]) -> torch.Tensor:
        law = torch.zeros(len(ids) + 1, dtype=torch.float64, device="cpu")  # rebuilt from stored (host) columns
        for token, probability in zip(top_ids, top_probs):
            law[index[token]] = probability
        law[-1] = max(0.0, 1.0 - float(law.sum()))
        return law

    p_target = rebuild(p_ids, as_list(record.get("p_top_probs")))
    q_draft = rebuild(q_ids, as_list(record.get("q_top_probs"))) if q_ids else None
    return p_target, q_draft, ids


class _Rows:
    """Per-position logits of one model on one sequence, kept small: the final hidden states and the
    head (``logits_t = head(h_t)``, the model's own last step) when that reproduces the model's
    logits, else the logits themselves (models that scale or cap logits after the head).

    One forward: a hook keeps the decoder body's output for every position while the model
    computes logits for the last one only; ``head(h_last)`` against those logits is the check.
    """

    def __init__(self, loaded: LoadedModel, ids: list[int], first: int, count: int) -> None:
        self.head = None
        sequence = torch.tensor([ids], device=loaded.device)
        outer = loaded.model
        body, head = getattr(outer, "model", None), outer.get_output_embeddings()
        kept: list[torch.Tensor] = []
        hook = body.register_forward_hook(lambda _module, _inputs, output: kept.append(_last_hidden(output))) \
            if isinstance(body, torch.nn.Module) and head is not None else None
        try:
            last = outer(input_ids=sequence, use_cache=False, logits_to_keep=1).logits[0, -1]
        finally:
            if hook is not None:
                hook.remove()
        hidden = kept[0][0] if kept and kept[0] is not None and kept[0].shape[1] == len(ids) else None
        if hidden is not None and torch.allclose(head(hidden[-1]).float(), last.float(), rtol=1e-4, atol=1e-4):
            self.rows = hidden[first : first + count].detach()
            self.head = head
        else:
            keep = len(ids) - first
            logits = outer(input_ids=sequence, use_cache=False, logits_to_keep=keep).logits[0]
            self.rows = float_logits(logits[:count].detach())

    @torch.inference_mode()
    def logits(self, index: int) -> torch.Tensor:
        row = self.rows[index]
        return float_logits(self.head(row) if self.head is not None else row).cpu()


def _last_hidden(output: Any) -> torch.Tensor | None:
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None and isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        hidden = output[0]
    return hidden


class RunLaws:
    """``p`` and ``q`` at every emitted position of a run, from one teacher-forced forward each.

    Position ``t``'s laws condition on prompt + ``y_<t``: the rows ``len(prompt) − 1 + t`` of a
    forward over prompt + output. Equal to a cache-free forward on each prefix (causal
    attention), to float tolerance; ``tests/test_inspection.py`` checks it.
    """

    @torch.inference_mode()
    def __init__(self, run: dict[str, Any], tokens: list[int], target: LoadedModel, drafter: LoadedModel | None) -> None:
        prompt = [int(token) for token in as_list(run.get("prompt_ids"))]
        if not prompt:
            raise ValueError("the run has no stored prompt ids")
        self.vocab = target.vocab_size
        tokens = [int(token) for token in tokens]
        if max(prompt + tokens, default=0) >= self.vocab:
            raise ValueError(f"the run has token ids outside this target's vocabulary of {self.vocab}")
        ids = prompt + tokens
        self.count = len(tokens)
        # The law after the last token is not needed: position t uses rows first .. first + count − 1.
        first = len(prompt) - 1
        self.policy = _policy(run["policy"])
        self.draft_policy = _policy(run["draft_policy"])
        self.p_rows = _Rows(target, ids, first, self.count)
        self.head = drafter if is_draft_head(drafter) else None
        self.target, self.prompt, self.tokens = target, prompt, tokens
        self.q_rows = _Rows(drafter, ids, first, self.count) if drafter is not None and self.head is None else None

    def p_at(self, position: int) -> torch.Tensor:
        """``p(· | prompt, y_<t)`` under the run's policy, float64 over the target's vocabulary."""
        return probabilities(fit_vocabulary(self.p_rows.logits(position), self.vocab), self.policy)

    def q_at(self, position: int, record: dict[str, Any]) -> torch.Tensor | None:
        """``q`` at a verified position (a point mass on the drafted token for n-gram drafts);
        ``None`` at a bonus position, where no draft was verified."""
        if record["kind"] == "bonus" or record.get("draft_token") is None:
            return None
        if not 0 <= int(record["draft_token"]) < self.vocab:  # a shared file's ids are untrusted
            raise ValueError(f"the run drafted token id {int(record['draft_token'])}, outside this target's vocabulary of {self.vocab}")
        if self.head is not None:  # its own forward per position: a head's q depends on its block's drafts
            return head_q(self.head, self.target, self.prompt, self.tokens, record, self.draft_policy)
        if self.q_rows is None:  # the laws come back to the host (``_Rows.logits``): the point mass is made there
            q_draft = torch.zeros(self.vocab, dtype=torch.float64, device="cpu")
            q_draft[int(record["draft_token"])] = 1.0
            return q_draft
        return probabilities(fit_vocabulary(self.q_rows.logits(position), self.vocab), self.draft_policy)


def position_view(run: dict[str, Any], record: dict[str, Any], laws: RunLaws | None, decode=None,
                  unavailable: str | None = None) -> PositionView:
    """The step view at ``record``: exact from ``laws`` when given, else from the stored top-k
    (``unavailable`` says why the exact laws are missing)."""
    rule = get_rule(run["rule"])
    position = int(record["position"])
    if laws is not None and position < laws.count:
        try:
            p_target, q_draft = laws.p_at(position), laws.q_at(position, record)
        except ValueError as error:
            unavailable = str(error)
        else:
            if q_draft is None:
                q_draft = p_target  # bonus position: no draft was verified; P is the bonus law
            view = explain_step(rule, p_target, q_draft, _lazy_labels(p_target.numel(), decode))
            return PositionView(view, True, "exact: p and q from teacher-forced forward passes over prompt + output")
    note = (f"exact laws not available ({unavailable}); rebuilt from the stored top-k" if unavailable
            else "rebuilt from the stored top-20 of p and q; the last bar lumps the tail")
    p_target, q_draft, ids = stored_laws(record)
    labels = [decode(token) if decode else str(token) for token in ids] + ["(tail)"]
    view = explain_step(rule, p_target, q_draft if q_draft is not None else p_target, labels)
    return PositionView(view, False, note, ids)


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


@dataclass
class TreeNodeView:
    """The node of a tree run that decided one position: its candidates in order, the law before
    each try (``r_1 = p``, then ``r_j`` after refusing ``c_{j−1}``), the law drawn from if all
    were refused (``laws[-1]``) and the exact emitted law ``P``."""

    p_target: torch.Tensor
    laws: list[torch.Tensor]
    law: torch.Tensor
    candidates: list[dict[str, Any]]  # token index, label, a, coin, decision, in trying order
    labels: Any
    exact: bool
    note: str
    ids: list[int] | None = None

    def index_of(self, token: Any) -> int | None:
        """``PositionView.index_of`` for this view's token space (``None`` when not among the stored ids)."""
        return PositionView(None, self.exact, self.note, self.ids).index_of(token)  # type: ignore[arg-type]


def tree_node_view(run: dict[str, Any], record: dict[str, Any], nodes: Any, laws: RunLaws | None, decode=None,
                   unavailable: str | None = None) -> TreeNodeView | None:
    """The node view at a tree run's ``record`` (``nodes``: the round's ``tree_nodes`` rows), or
    ``None`` when the position had no candidates (a bonus after an accepted leaf)."""
    from diagnostics.engine.reference.tree_walk import node_steps

    node = record.get("tree_node")
    if node is None or node != node or nodes is None or len(nodes) == 0:
        return None
    children = nodes[nodes["parent"] == int(node)].sort_values("sibling")
    if children.empty:
        return None
    rule = get_rule(run["rule"])
    mode = run.get("tree_children") or "top"
    position = int(record["position"])
    exact, ids, note = False, None, ""
    if laws is not None and position < laws.count:
        try:
            p_target, q_draft = laws.p_at(position), laws.q_at(position, record)
            exact, labels = True, _lazy_labels(p_target.numel(), decode)
            note = "exact: p from a teacher-forced forward over prompt + output, candidates from the stored tree"
        except ValueError as error:
            unavailable = str(error)
    if not exact:
        p_target, q_draft, ids = stored_laws(record)
        labels = [decode(token) if decode else str(token) for token in ids] + ["(tail)"]
        note = (f"exact laws not available ({unavailable}); " if unavailable else "") + \
            "rebuilt from the stored top-20 of p; candidates outside it are lumped into the tail"
    lookup = (lambda token: int(token)) if exact else (lambda token: {stored: at for at, stored in enumerate(ids)}.get(int(token), len(ids)))
    tokens = [lookup(token) for token in children["token"]]
    if q_draft is None or mode == "top":
        q_draft = torch.zeros_like(p_target)
    trace: list[torch.Tensor] = []
    _accept, _residual, _rest, law = node_steps(rule, p_target, q_draft, tokens, mode != "top", mode == "sample-distinct", trace)
    candidates = [
        {"index": index, "label": labels[index], "accept_prob": float(row.accept_prob), "u_accept": row.u_accept,
         "decision": row.decision}
        for index, row in zip(tokens, children.itertuples())
    ]
    return TreeNodeView(p_target, trace, law, candidates, labels, exact, note, ids)
