"""Recorded runs: prompt encoding, engine → store wiring, interruption, coupled comparisons.

Shared by the command line and the dashboard, so that both record runs the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diagnostics.engine import (
    CORRECT,
    EngineError,
    EngineSeams,
    PositionRecord,
    Run,
    check_settings,
    generate,
)
from diagnostics.models import PLAIN_DRAFT, LoadedModel, device_label
from diagnostics.rules import get_rule
from diagnostics.request import RunRequest, batch_key, check_prompt_text
from diagnostics.store import RunWriter, Store, StoreError, WriterGroup


def encode_prompt(target: LoadedModel, text: str, raw: bool = False) -> list[int]:
    """Token ids of the prompt: the chat template for instruct models unless ``raw``."""
    check_prompt_text(text)
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise EngineError("this target has no tokenizer; pass token ids to generate() instead")
    if not raw and getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    else:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return [int(token) for token in ids]


def check_replay_prompt(target: LoadedModel, request: RunRequest, stored_ids: list[int] | None, run_id: str) -> None:
    """Refuse a replay whose prompt no longer encodes to the stored ``prompt_ids`` (the tokenizer or
    its chat template changed): the new run would not repeat the old one. A run stored without
    ``prompt_ids`` cannot be checked and passes."""
    if stored_ids is None:
        return
    stored = [int(token) for token in stored_ids]
    ids = encode_prompt(target, request.prompt, request.raw)
    if ids != stored:
        first = next((index for index, (a, b) in enumerate(zip(ids, stored)) if a != b), min(len(ids), len(stored)))
        raise EngineError(
            f"the prompt of run {run_id!r} now encodes to other token ids than were stored ({len(ids)} tokens vs "
            f"{len(stored)}, first difference at token {first}): the tokenizer of {target.name} changed, so the run "
            "cannot be replayed exactly; load the tokenizer it was recorded with"
        )


def run_fields(request: RunRequest, target_name: str, prompt_ids: list[int], group_id: str | None = None,
               device: str | None = None) -> dict[str, Any]:
    """The ``runs`` row a request starts with; ``device``: where it runs (``models.device_label``)."""
    rule = get_rule(request.rule)
    spec = request.tree_spec
    return {
        "target": target_name,
        "draft": request.draft or PLAIN_DRAFT,
        "rule": rule.spec,
        "rule_name": rule.name,
        "rule_params": rule.params,
        "policy": request.policy.as_dict(),
        "draft_policy": (request.draft_policy or request.policy).as_dict(),
        "gamma": request.depth if request.draft else 0,
        "tree": spec.text if spec is not None else None,
        "tree_children": spec.children if spec is not None else None,
        "seed": request.seed,
        "max_new_tokens": request.max_new_tokens,
        "prompt": request.prompt,
        "prompt_ids": prompt_ids,
        "raw_prompt": request.raw,
        "group_id": group_id,
        "draft_stop": request.draft_stop if request.draft else None,
        "device": device,
    }


def run_summary(run: Run) -> dict[str, Any]:
    """Summary columns of a finished (or interrupted) run."""
    summary = run.summary()
    values = [record.tv_target for record in run.records if record.tv_target is not None]
    return {
        "output_text": run.text,
        "tokens": run.tokens,
        "n_tokens": len(run.tokens),
        "drafted": run.drafted,
        "accepted": run.accepted,
        "target_passes": run.blocks,
        "acceptance_rate": summary["acceptance_rate"],
        "block_efficiency": summary["block_efficiency"],
        "tokens_per_s": summary["tokens_per_s"],
        "time_s": run.time_s,
        "mean_tv_target": summary["mean_tv_target"],
        "mean_tv_baseline": summary["mean_tv_baseline"],
        "max_tv_target": max(values) if values else None,
        "stop_reason": run.stop_reason,
    }


def checked_prompt_ids(target: LoadedModel, request: RunRequest) -> list[int]:
    """The request's prompt encoded, after every check ``generate`` would make: a bad setting is
    refused here, before any row is written."""
    request.validate()
    prompt_ids = encode_prompt(target, request.prompt, request.raw)
    check_settings(target, prompt_ids, request.depth, request.max_new_tokens, request.seed, request.top_k_record)
    return prompt_ids


def record_run(
    store: Store,
    target: LoadedModel,
    draft: Any,
    request: RunRequest,
    *,
    group_id: str | None = None,
    on_record: Callable[[PositionRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    seams: EngineSeams = CORRECT,
) -> tuple[str, Run | None]:
    """Generate and store one run. Ctrl-C or ``should_stop`` keeps what was recorded as ``interrupted``;
    an error marks the run ``failed`` with its message and is raised again. ``seams``: audits only."""
    on_record_for = None if on_record is None else (lambda _index, _request: on_record)
    (run_id, run), = record_batch(store, target, draft, [request], group_ids=group_id, on_record_for=on_record_for,
                                  should_stop=should_stop, seams=seams)
    return run_id, run


def record_batch(
    store: Store,
    target: LoadedModel,
    draft: Any,
    requests: list[RunRequest],
    *,
    group_ids: str | list[str | None] | None = None,
    on_record_for: Callable[[int, RunRequest], Callable[[PositionRecord], None] | None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    seams: EngineSeams = CORRECT,
    batch_size: int | None = None,
    on_stored: Callable[[int, str, Run], None] | None = None,
) -> list[tuple[str | None, Run | None]]:
    """Generate requests as rows of one batch (``engine.generate_batch``) and store each as it runs,
    exactly as one run alone would be stored: its row when it starts, its positions and tree rounds
    as they are verified, its summary when it ends (``on_stored(index, run_id, run)`` is then told).

    The requests must share a drafter, γ or tree, draft stop and recorded top-k (``batch_key``);
    rules, seeds, policies and token budgets may differ. Every request is checked before any row is
    written. A stop ends the rows in flight ``interrupted`` and starts no other (their entry is
    ``(None, None)``); an error marks the unfinished rows ``failed`` and is raised again; Ctrl-C
    keeps what each row recorded as ``interrupted``."""

    if not requests:
        raise EngineError("nothing to run: give at least one request")
    prompt_ids = [checked_prompt_ids(target, request) for request in requests]
    where = device_label(target, draft)
    groups = group_ids if isinstance(group_ids, list) else [group_ids] * len(requests)
    writers: dict[int, RunWriter] = {}
    shared = WriterGroup(store)  # the rows' records go to the store together, one connection per flush
    callbacks: dict[int, Callable[[PositionRecord], None] | None] = {}
    done: set[int] = set()
    results: list[tuple[str | None, Run | None]] = [(None, None)] * len(requests)

    def start(index: int) -> None:
        writers[index] = RunWriter(store, run_fields(requests[index], target.name, prompt_ids[index], groups[index], where),
                                   group=shared)
        callbacks[index] = on_record_for(index, requests[index]) if on_record_for is not None else None

    def keep(index: int, record: PositionRecord) -> None:
        writers[index].add(record)
        callback = callbacks[index]
        if callback is not None:
            callback(record)

    def finish(index: int, run: Run) -> None:
        writer = writers[index]
        try:
            writer.finish(run.status, run_summary(run), error="stopped by the user" if run.status == "interrupted" else None)
        except StoreError as error:
            done.add(index)
            writer.close_quietly("failed", error=f"{error.__class__.__name__}: {error}")
            raise
        done.add(index)
        results[index] = (writer.run_id, run)
        if on_stored is not None:
            on_stored(index, writer.run_id, run)

    try:
        generate_requests(target, draft, requests, prompt_ids, batch_size=batch_size, on_record=keep,
                          on_round=lambda index, rnd, nodes: writers[index].add_round(rnd, nodes), should_stop=should_stop,
                          seams=seams, on_start=start, on_finish=finish)
    except Exception as error:
        # Best effort: a full disk may refuse even this; the error itself is raised either way.
        for index, writer in writers.items():
            if index not in done:
                writer.close_quietly("failed", error=f"{error.__class__.__name__}: {error}")
        raise
    except BaseException:
        # Ctrl-C, or a dashboard rerun stopping the script: keep what each row recorded.
        # Its summary is what the stored positions determine (the drafts a round discarded are not
        # among them, so the drafted count stays unknown).
        for index, writer in writers.items():
            if index not in done:
                writer.close_quietly("interrupted", error="interrupted by the user")
        raise
    return results


def generate_request(
    target: LoadedModel,
    draft: Any,
    request: RunRequest,
    prompt_ids: list[int],
    *,
    on_record: Callable[[PositionRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    seams: EngineSeams = CORRECT,
    on_round: Callable[[Any, list[Any]], None] | None = None,
) -> Run:
    """``generate`` with a request's settings, storing nothing: what ``record_run`` records, and what
    a sweep worker on another machine sends back for the driver to store."""
    return generate(
        target, draft if request.draft else None, prompt_ids, rule=request.rule, gamma=request.gamma,
        max_new_tokens=request.max_new_tokens, seed=request.seed, policy=request.policy,
        draft_policy=request.draft_policy, top_k_record=request.top_k_record, on_record=on_record,
        should_stop=should_stop, seams=seams, tree=request.tree_spec, on_round=on_round, draft_stop=request.draft_stop,
    )


def generate_requests(target: LoadedModel, draft: Any, requests: list[RunRequest], prompt_ids: list[list[int]],
                      *, batch_size: int | None = None, **hooks: Any) -> list[Run | None]:
    """The requests (sharing ``batch_key``) as rows of one ``generate_batch``, storing nothing: what a
    sweep worker on another machine sends back for the driver to store, and what ``record_batch``
    stores as it runs. ``hooks``: ``generate_batch``'s callbacks, ``should_stop`` and ``seams``."""
    from diagnostics.engine import generate_batch

    if len({batch_key(request) for request in requests}) > 1:
        raise EngineError("the runs of one batch must share the drafter, gamma or tree, and draft stop; "
                          "only the rule, seed, policy and token budget may differ")
    first = requests[0]
    return generate_batch(
        target, draft if first.draft else None, prompt_ids, [request.rule for request in requests],
        [request.seed for request in requests], gamma=first.gamma, max_new_tokens=[request.max_new_tokens for request in requests],
        policies=[request.policy for request in requests], draft_policies=[request.draft_policy for request in requests],
        top_k_record=first.top_k_record, tree=first.tree_spec, draft_stop=first.draft_stop, batch_size=batch_size, **hooks,
    )


def store_finished_run(store: Store, target_name: str, request: RunRequest, prompt_ids: list[int], run: Run,
                       group_id: str | None = None) -> str:
    """Store a run generated elsewhere (a sweep worker) exactly as ``record_run`` would have stored
    it while it ran: the same row, positions, tree rounds and summary. Returns its id."""
    writer = RunWriter(store, run_fields(request, target_name, prompt_ids, group_id, run.device))
    nodes_by_round: dict[int, list[Any]] = {}
    for node in run.nodes:
        nodes_by_round.setdefault(node.block, []).append(node)
    try:
        for record in run.records:
            writer.add(record)
        for round_record in run.rounds:
            writer.add_round(round_record, nodes_by_round.get(round_record.block, []))
        writer.finish(run.status, run_summary(run), error="stopped by the user" if run.status == "interrupted" else None)
    except BaseException as error:
        writer.close_quietly("failed", error=f"{error.__class__.__name__}: {error}")
        raise
    return writer.run_id


def first_divergence(reference: Run, other: Run) -> int | None:
    """First position where two coupled runs decide differently (kind or token); ``None`` if never."""
    for left, right in zip(reference.records, other.records):
        if left.kind != right.kind or left.token != right.token:
            return left.position
    if len(reference.tokens) != len(other.tokens):
        return min(len(reference.tokens), len(other.tokens))
    return None
