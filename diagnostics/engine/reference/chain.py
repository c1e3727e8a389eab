"""The chain round of one row: draft ``γ`` tokens, verify them with one target forward, keep the prefix.

One block: the drafter proposes ``γ`` tokens ``x_i ~ q_i``; the target scores ``γ + 1``
positions in one forward; position ``i`` is verified with ``p_i``, ``q_i`` of the same position
(accept iff ``u_accept < a(x_i)``); the first rejection emits a fallback draw from
``f(p_i, q_i)``; if all are accepted the bonus is drawn from ``b(p_γ)``. Both caches are then cut
back to the committed prefix.

Every uniform comes from ``diagnostics.rng`` keyed by ``(seed, absolute output position,
slot)``: a run is reproducible, each decision replays from stored uniforms, and runs with the
same seed and different rules stay coupled until they decide differently, whether they ran
alone or as rows of one batch.

Plain decoding (no drafter) uses the same loop with ``γ = 0``: every position is a bonus
position drawn from ``p``. ``chain_row`` is a generator: it yields the forwards it needs and
``diagnostics.engine.batch`` runs them for many rows at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from diagnostics.engine.drafting import fit_vocabulary
from diagnostics.engine.records import PositionRecord, Run, decode_one, finish, position_record, rounds, top_entries
from diagnostics.engine.seams import fallback_law
from diagnostics.metrics import entropy, kl_divergence, overshoot_mass, severe_overshoot_mass, total_variation
from diagnostics.rng import sample_token, uniform_scalar
from diagnostics.rules import Rule


def chain_row(row: Any, drafter: Any, scorer: Any, gamma: int, vocab: int, tokenizer: Any, seams: Any):
    """Generate one row (``batch.RowPlan``) with chains of ``gamma`` drafts; returns its ``Run``."""
    run = Run(tokens=[], records=[], prompt_ids=row.prompt, rule=row.rule.spec,
              draft=getattr(drafter, "name", None), gamma=gamma if drafter else 0, seed=row.seed,
              policy=row.policy, draft_policy=row.draft_policy)
    seed, eos, rule = row.seed, row.eos, row.rule
    committed = list(row.prompt)
    start = time.perf_counter()
    for position, budget in rounds(run, row.max_new_tokens, row.should_stop):
        count = min(gamma, budget) if drafter is not None else 0

        def draw(q_draft: torch.Tensor, index: int, _position: int = position) -> int:
            return sample_token(q_draft, uniform_scalar(seed, _position + index, "draft"))

        drafts, q_laws = (yield from drafter.propose(committed, count, draw, vocab, eos)) if count else ([], None)
        logits = fit_vocabulary((yield from scorer.score(committed, drafts)), vocab)
        p_laws = seams.target_laws(logits, row.policy, len(drafts))
        emitted, accepted, finished = _verify_block(
            run, rule, drafts, p_laws, q_laws, position, seed, eos, budget,
            row.record, row.top_k_record, tokenizer, row.on_record, seams.fallback_law,
        )
        run.blocks += 1
        run.drafted += len(drafts)
        run.accepted += accepted
        # Roll both caches back to the committed prefix: prompt + earlier tokens + accepted drafts.
        scorer.rollback(len(committed) + accepted)
        if drafter is not None:
            drafter.commit(len(committed) + accepted)
        committed.extend(emitted)
        run.tokens.extend(emitted)
        if finished:
            run.stop_reason = "eos"
            break
    return finish(run, start, tokenizer)


def _verify_block(
    run: Run,
    rule: Rule,
    drafts: list[int],
    p_laws: torch.Tensor,
    q_laws: torch.Tensor | None,
    position: int,
    seed: int,
    eos: set[int],
    budget: int,
    record: bool,
    top_k_record: int,
    tokenizer: Any,
    on_record: Callable[[PositionRecord], None] | None,
    fallback_of: Callable[[Rule, torch.Tensor, torch.Tensor, int], torch.Tensor] = fallback_law,
) -> tuple[list[int], int, bool]:
    """Verify one block in order; return the emitted tokens, the accepted count, and whether EOS ended it."""
    count = len(drafts)
    accept_rows = rule.accept_prob(p_laws[:count], q_laws) if count else None
    emitted: list[int] = []
    kinds: list[str] = []
    coins: list[tuple[float | None, float | None]] = []
    finished = False
    for index, draft_token in enumerate(drafts):
        u_accept = uniform_scalar(seed, position + index, "accept")
        if u_accept < float(accept_rows[index, draft_token]):
            emitted.append(draft_token)
            kinds.append("accepted")
            coins.append((u_accept, None))
        else:
            u_fallback = uniform_scalar(seed, position + index, "fallback")
            fallback = fallback_of(rule, p_laws, q_laws, index)
            emitted.append(sample_token(fallback, u_fallback))
            kinds.append("rejected")
            coins.append((u_accept, u_fallback))
        if emitted[-1] in eos:
            finished = True
        if kinds[-1] == "rejected" or finished:
            break
    if not finished and kinds.count("accepted") == count and count < budget:
        u_fallback = uniform_scalar(seed, position + count, "fallback")
        emitted.append(sample_token(rule.bonus(p_laws[count]), u_fallback))
        kinds.append("bonus")
        coins.append((None, u_fallback))
        finished = emitted[-1] in eos
    accepted = kinds.count("accepted")
    if record:
        for record_ in _block_records(run, rule, drafts, emitted, kinds, coins, p_laws, q_laws, accept_rows,
                                      position, seed, top_k_record, tokenizer):
            run.records.append(record_)
            if on_record is not None:
                on_record(record_)
    return emitted, accepted, finished


def _block_records(
    run: Run,
    rule: Rule,
    drafts: list[int],
    emitted: list[int],
    kinds: list[str],
    coins: list[tuple[float | None, float | None]],
    p_laws: torch.Tensor,
    q_laws: torch.Tensor | None,
    accept_rows: torch.Tensor | None,
    position: int,
    seed: int,
    top_k_record: int,
    tokenizer: Any,
) -> list[PositionRecord]:
    """Records of one block, with the exact full-vocabulary scalars computed in one batch."""
    verified = sum(1 for kind in kinds if kind != "bonus")
    records: list[PositionRecord] = []

    def text(token: int) -> str | None:
        return decode_one(tokenizer, token)

    if verified:
        p_rows, q_rows = p_laws[:verified], q_laws[:verified]
        induced = rule.induced(p_rows, q_rows)
        baseline = rule.baseline(p_rows)
        allowed = rule.allowed_set(p_rows)
        lenience = rule.ceiling_factor
        scalars = {
            "alpha": (q_rows * accept_rows[:verified]).sum(-1),
            "tv_pq": total_variation(p_rows, q_rows),
            "entropy_p": entropy(p_rows),
            "entropy_q": entropy(q_rows),
            "overshoot": overshoot_mass(p_rows, q_rows),
            "tv_target": total_variation(induced, p_rows),
            "tv_baseline": total_variation(induced, baseline),
            "kl_target": kl_divergence(induced, p_rows),
        }
        if lenience:
            scalars["severe_overshoot"] = severe_overshoot_mass(p_rows, q_rows, float(lenience))
        if allowed is not None:
            scalars["allowed_size"] = allowed.sum(-1)
            scalars["allowed_mass"] = (p_rows * allowed).sum(-1)
        for index in range(verified):
            draft_token = drafts[index]
            p_ids, p_probs, p_tail = top_entries(p_rows[index], top_k_record)
            q_ids, q_probs, q_tail = top_entries(q_rows[index], top_k_record)
            values = {name: tensor[index] for name, tensor in scalars.items()}
            records.append(position_record(kinds[index], position + index, run.blocks, index, emitted[index], {
                **values, "draft_token": draft_token, "p_token": p_rows[index, emitted[index]],
                "p_draft": p_rows[index, draft_token], "q_draft": q_rows[index, draft_token],
                "accept_prob": accept_rows[index, draft_token], "u_draft": uniform_scalar(seed, position + index, "draft"),
                "u_accept": coins[index][0], "u_fallback": coins[index][1],
                "p_top_ids": p_ids, "p_top_probs": p_probs, "p_tail": p_tail,
                "q_top_ids": q_ids, "q_top_probs": q_probs, "q_tail": q_tail,
            }, text))
    if kinds and kinds[-1] == "bonus":
        index = len(kinds) - 1
        p_row = p_laws[index]
        bonus = rule.bonus(p_row)
        p_ids, p_probs, p_tail = top_entries(p_row, top_k_record)
        records.append(position_record("bonus", position + index, run.blocks, index, emitted[index], {
            "p_token": p_row[emitted[index]], "u_fallback": coins[index][1], "entropy_p": entropy(p_row),
            "tv_target": total_variation(bonus, p_row), "tv_baseline": total_variation(bonus, rule.baseline(p_row)),
            "kl_target": kl_divergence(bonus, p_row), "p_top_ids": p_ids, "p_top_probs": p_probs, "p_tail": p_tail,
        }, text))
    return records
