"""A chain round of every row as one tensor program: the batched core's fast path.

``generate_batch`` runs chains (plain decoding, a draft model, the target's early exit, prompt lookup)
through ``RoundProgram`` and trees through ``tree_program.TreeProgram``; draft heads, custom drafters
and models without a batched forward go through the per-row programs (``reference.chain.chain_row``,
``reference.tree.tree_row``), which also stay as both programs' test oracle. A round of the ``B`` active rows:

1. **Uniforms** ``U[B, γ+1, 3]`` keyed by each row's ``(seed, position + j, slot)``, from the host in
   one call (``rng.round_uniform_array``) and copied to the device once.
2. **Drafting**: ``γ`` steps of every row, each one forward (``forward.Block``) and one inverse-CDF
   draw per row. A row whose drafts stop counting (its budget, an EOS draft, ``draft_stop``) keeps
   stepping; ``limit`` masks what it drafted after, so the loop has no data-dependent exit.
3. **Verification**: one target forward over every row's pending token and ``γ`` drafts (for the
   early exit, the upper layers over the hidden states kept while drafting), then one
   ``chain_verify.verify_group`` per group of rows sharing a rule and policies.
4. **One host copy**: every group's packed decisions and record columns in one buffer; the host
   extends each row's tokens, builds its records and rolls its caches back.

A row's uniforms, laws and decisions are its own: rows of any batch give the tokens each would give
alone, up to the float rounding of batched products. The engine's seams apply here as batched hooks
(``route`` and ``hand_back`` on each ``Block``, ``target_laws`` and ``fallback_law`` on ``[G, …]``
tensors, the scorer's ``rollback`` on each row's cache length), so planted bugs plant in this path too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from diagnostics.engine.admission import Admission
from diagnostics.engine.drafting import NgramDrafter, fit_vocabulary
from diagnostics.engine.forward import Block, BlockOutput
from diagnostics.engine.records import PositionRecord, Run, finish, position_record
from diagnostics.engine.chain_verify import (ACCEPT, DRAFT, EVERY_SLOT, FALLBACK, VERIFIED, Columns, draw_rows, row_chunks,
                                             verify_group)
from diagnostics.policy import probabilities
from diagnostics.rng import round_uniform_array
from diagnostics.rules.base import laws_from_engine


def supports_program(pair: Any, tree: bool) -> bool:
    """Whether ``generate_batch`` runs this batch as one tensor program: a chain of plain decoding, a draft
    model or the target's early exit, over stages with a batched forward (``run_block``)."""
    if tree or pair.source.kind not in ("none", "model", "ngram"):
        return False
    if pair.split is not None:
        return True
    stages = [pair.target_stage] + ([pair.draft_stage] if pair.source.kind == "model" else [])
    return all(hasattr(stage, "run_block") for stage in stages)


@dataclass
class _Row:
    """One active row: its plan, its ``Run``, and the host's bookkeeping of its caches."""

    index: int
    plan: Any
    run: Run
    committed: list[int]
    scorer: Any = None  # the target's cache length (``seams.scorer``: its ``rollback`` is a seam)
    target_slot: int = -1
    draft_slot: int = -1
    draft_cached: int = 0
    low_cached: int = 0  # early exit: tokens through layers 1..L and through L+1..N
    high_cached: int = 0
    started: float = 0.0
    key: tuple = field(default_factory=tuple)


class _Texts:
    """Token text from one table: each id decoded once per batch."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.table = tokenizer, {}

    def __call__(self, token: int | None) -> str | None:
        if self.tokenizer is None or token is None:
            return None
        text = self.table.get(token)
        if text is None:
            text = self.table[token] = self.tokenizer.decode([token])
        return text


class RoundProgram:
    """Runs every row of a batch to its end, ``limit`` at a time, one round of all active rows at a time."""

    def __init__(self, pair: Any, plans: list[Any], limit: int, gamma: int, loaded: Any, where: str) -> None:
        self.pair, self.plans, self.limit, self.loaded, self.where = pair, plans, limit, loaded, where
        self.seams = pair.seams
        self.drafting = pair.source.kind in ("model", "ngram")
        self.model_draft = pair.source.kind == "model"
        self.lookup = NgramDrafter(pair.source.ngram, loaded.device) if pair.source.kind == "ngram" else None
        self.gamma = gamma if self.drafting else 0
        self.vocab = loaded.vocab_size
        self.device = loaded.device
        self.texts = _Texts(loaded.tokenizer)
        eos = sorted(set().union(*(plan.eos for plan in plans)))
        self.eos = torch.tensor(eos, dtype=torch.long, device=self.device)
        self.draft_stop = pair.draft_stop
        self.allowed: dict[Any, bool] = {}

    # -- rows joining and leaving -------------------------------------------------------------

    def _join(self, indices: list[int]) -> list[_Row]:
        """Attach each new row's slots; its first round feeds its whole prompt (``run`` runs joining rows'
        first round apart from the others, whose few tokens would otherwise pad to the longest prompt)."""
        pair, rows = self.pair, []
        for index in indices:
            plan = self.plans[index]
            row = _Row(index, plan, self._new_run(plan), list(plan.prompt), started=time.perf_counter(),
                       key=(plan.rule, plan.policy, plan.draft_policy, plan.record, plan.top_k_record))
            if pair.split is not None:
                row.target_slot = pair.split.store.attach()
            else:
                row.target_slot = pair.target_stage.store.attach()
                row.scorer = self.seams.scorer(pair.target_stage, row.target_slot)
                if self.model_draft:
                    row.draft_slot = pair.draft_stage.store.attach()
            rows.append(row)
        return rows

    def _new_run(self, plan: Any) -> Run:
        """The ``Run`` a joining row fills."""
        return Run(tokens=[], records=[], prompt_ids=plan.prompt, rule=plan.rule.spec,
                   draft=self.pair.source.name if self.drafting else None, gamma=self.gamma, seed=plan.seed,
                   policy=plan.policy, draft_policy=plan.draft_policy)

    def _release(self, row: _Row) -> None:
        pair = self.pair
        if pair.split is not None:
            pair.split.store.detach(row.target_slot)
            return
        pair.target_stage.store.detach(row.target_slot)
        if self.model_draft:
            pair.draft_stage.store.detach(row.draft_slot)

    # -- forwards -----------------------------------------------------------------------------

    def _forward(self, stage: Any, slots: list[int], starts: list[int], feeds: list[list[int]] | None, keep: int,
                 tokens: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
                 sizes: list[int] | None = None) -> BlockOutput:
        """One batched forward through the seams: host ``feeds`` (padded), or device ``tokens``/``hidden``."""
        if feeds is not None:
            sizes = [len(feed) for feed in feeds]
            width = max(sizes)
            tokens = torch.tensor([feed + [0] * (width - len(feed)) for feed in feeds], dtype=torch.long, device=self.device)
        if sizes is None:
            sizes = [int((tokens if tokens is not None else hidden).shape[1])] * len(slots)
        block = self.seams.route(Block(stage, slots, starts, sizes, keep, tokens=tokens if hidden is None else None,
                                       hidden=hidden))
        return self.seams.hand_back(block, stage.run_block(block))

    def _groups(self, rows: list[_Row]) -> list[tuple[int, int]]:
        """``[lo, hi)`` of each run of rows sharing a rule and policies (rows are kept sorted by group)."""
        bounds, start = [], 0
        for position in range(1, len(rows) + 1):
            if position == len(rows) or rows[position].key != rows[start].key:
                bounds.append((start, position))
                start = position
        return bounds

    def _draft(self, rows: list[_Row], groups: list[tuple[int, int]], uniforms: torch.Tensor):
        """``γ`` draft steps of every row: drafts ``[B, γ]``, their laws ``[B, γ, V]``, ``q`` of each draft, and
        the hidden states the early exit keeps for the upper layers."""
        pair, gamma = self.pair, self.gamma
        split = pair.split
        stage = split.lower if split is not None else pair.draft_stage
        slots = [row.target_slot if split is not None else row.draft_slot for row in rows]
        drafts, laws, picked, kept = [], [], [], []
        first_sizes: list[int] = []
        for step in range(gamma):
            if split is not None:
                feeds = [row.committed[row.low_cached:] for row in rows] if step == 0 else None
                starts = [row.low_cached for row in rows]
            else:
                feeds = [row.committed[row.draft_cached:] for row in rows] if step == 0 else None
                starts = [row.draft_cached for row in rows]
            output = self._forward(stage, slots, starts, feeds, 1, tokens=None if step == 0 else drafts[-1][:, None])
            sizes = [len(feed) for feed in feeds] if feeds is not None else [1] * len(rows)
            for row, size in zip(rows, sizes):
                if split is not None:
                    row.low_cached += size
                else:
                    row.draft_cached += size
            if split is not None:
                kept.append(output.hidden)
            if step == 0:
                first_sizes = sizes
            logits = fit_vocabulary(output.logits[:, 0], self.vocab)
            step_laws, step_drafts = [], []
            for lo, hi in groups:
                q_draft = probabilities(logits[lo:hi], rows[lo].plan.draft_policy)
                step_laws.append(q_draft)
                step_drafts.append(draw_rows(q_draft, uniforms[lo:hi, step, DRAFT]))
            law = step_laws[0] if len(groups) == 1 else torch.cat(step_laws)
            token = step_drafts[0] if len(groups) == 1 else torch.cat(step_drafts)
            drafts.append(token)
            laws.append(law)
            picked.append(law.gather(-1, token[:, None]).squeeze(-1))
        return torch.stack(drafts, dim=1), torch.stack(laws, dim=1), torch.stack(picked, dim=1), (kept, first_sizes)

    def _lookup_drafts(self, rows: list[_Row], budgets: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Prompt lookup for every row on the host (``drafting.NgramDrafter``): drafts ``[B, w]`` (zeros after
        each row's own; ``w`` the most any row found), their point-mass laws ``[B, w, V]``, and how many each
        row found (cut after EOS)."""
        found = []
        for row, budget in zip(rows, budgets):
            tokens = self.lookup._lookup(row.committed, min(self.gamma, budget))
            ends = [index for index, token in enumerate(tokens) if token in row.plan.eos]
            found.append(tokens[: ends[0] + 1] if ends else tokens)
        width = max(len(tokens) for tokens in found)
        drafts = torch.tensor([tokens + [0] * (width - len(tokens)) for tokens in found], dtype=torch.long,
                              device=self.device)
        laws = torch.zeros((len(rows), width, self.vocab), dtype=torch.float64, device=self.device)
        return drafts, laws.scatter_(-1, drafts[..., None], 1.0), [len(tokens) for tokens in found]

    def _after_pending(self, pending: torch.Tensor, sizes: list[int], items: torch.Tensor) -> torch.Tensor:
        """``[B, m + γ, …]``: each row's ``sizes[b]`` pending inputs, then its ``γ`` items ``[B, γ, …]``
        (one scatter when the pending counts differ, as on a row's first round or under a planted stale cache)."""
        gamma = items.shape[1]
        if all(size == pending.shape[1] for size in sizes):
            return torch.cat([pending, items], dim=1)
        padded = torch.cat([pending, torch.zeros_like(items)], dim=1)
        columns = torch.tensor([[size + j for j in range(gamma)] for size in sizes], dtype=torch.long, device=self.device)
        index = columns.view(*columns.shape, *([1] * (items.dim() - 2))).expand_as(items)
        return padded.scatter(1, index, items)

    def _verify_logits(self, rows: list[_Row], drafts: torch.Tensor | None, kept: Any, gamma: int) -> torch.Tensor:
        """The target's logits ``[B, γ+1, V]`` after each row's committed tokens and each draft (``γ``: this
        round's draft slots)."""
        pair = self.pair
        split = pair.split
        if split is not None:
            hidden, first_sizes = kept
            last = self._forward(split.lower, [row.target_slot for row in rows], [row.low_cached for row in rows], None, 1,
                                 tokens=drafts[:, -1:])
            for row in rows:
                row.low_cached += 1
            # Layers L+1..N see what layers 1..L saw this round: each row's pending tokens, then its drafts.
            upper = self._after_pending(hidden[0], first_sizes, torch.cat(hidden[1:] + [last.hidden], dim=1))
            output = self._forward(split.upper, [row.target_slot for row in rows], [row.high_cached for row in rows],
                                   None, gamma + 1, hidden=upper, sizes=[size + gamma for size in first_sizes])
            for row in rows:
                row.high_cached = row.low_cached
            return fit_vocabulary(output.logits, self.vocab)
        pending = [row.committed[row.scorer.cached:] for row in rows]
        sizes = [len(feed) + gamma for feed in pending]
        longest = max(len(feed) for feed in pending)
        tokens = torch.tensor([feed + [0] * (longest - len(feed)) for feed in pending], dtype=torch.long, device=self.device)
        if gamma:
            tokens = self._after_pending(tokens, [len(feed) for feed in pending], drafts)
        output = self._forward(pair.target_stage, [row.target_slot for row in rows], [row.scorer.cached for row in rows],
                               None, gamma + 1, tokens=tokens, sizes=sizes)
        for row, size in zip(rows, sizes):
            row.scorer.cached += size
        return fit_vocabulary(output.logits, self.vocab)

    # -- one round ----------------------------------------------------------------------------

    def round(self, rows: list[_Row]) -> None:
        """Draft, verify, decide and record one round of ``rows`` (see the module docstring)."""
        gamma, device = self.gamma, self.device
        groups = self._groups(rows)
        positions = [len(row.run.tokens) for row in rows]
        budgets = [row.plan.max_new_tokens - position for row, position in zip(rows, positions)]
        host_u = round_uniform_array([row.plan.seed for row in rows], positions, gamma + 1)
        uniforms = torch.from_numpy(host_u).to(device)
        drafts = q_laws = None
        kept: list[torch.Tensor] = []
        count = torch.tensor([min(gamma, budget) for budget in budgets], dtype=torch.long, device=device)
        budget = torch.tensor(budgets, dtype=torch.long, device=device)
        if gamma and self.lookup is not None:
            drafts, q_laws, found = self._lookup_drafts(rows, budgets)
            # The round is as wide as the most drafts any row found: a lookup that found nothing (often) then
            # verifies one position, not γ + 1 of padding (measured: 0.64× the reference core at 1 row).
            gamma = drafts.shape[1]
            uniforms, host_u = uniforms[:, : gamma + 1], host_u[:, : gamma + 1]
            limit = torch.tensor(found, dtype=torch.long, device=device)
        elif gamma:
            drafts, q_laws, q_picked, kept = self._draft(rows, groups, uniforms)
            # Drafts after an EOS draft (or after one the draft is unsure of) never count.
            stop = torch.isin(drafts, self.eos)
            if self.draft_stop is not None:
                stop = stop | (q_picked < self.draft_stop)
            stop = stop & (torch.arange(gamma, device=device)[None, :] < count[:, None])
            limit = torch.where(stop.any(-1), stop.to(torch.int64).argmax(-1) + 1, count)
        else:
            limit = count
        logits = self._verify_logits(rows, drafts if gamma else None, kept, gamma)
        buffers = []
        with laws_from_engine():  # softmax laws: normalised as in a checked call, without its host reads
            for group_lo, group_hi in groups:
                plan = rows[group_lo].plan
                columns = Columns(gamma, min(plan.top_k_record, self.vocab), plan.record)
                for lo, hi in row_chunks(group_lo, group_hi, (gamma + 1) * logits.shape[-1], device):
                    p_laws = self.seams.target_laws(logits[lo:hi], plan.policy, gamma)
                    group_drafts = drafts[lo:hi] if gamma else torch.zeros((hi - lo, 0), dtype=torch.long, device=device)
                    buffers.append(verify_group(plan.rule, p_laws, q_laws[lo:hi] if gamma else None, group_drafts,
                                                uniforms[lo:hi], limit[lo:hi], budget[lo:hi], self.eos,
                                                self.seams.fallback_law, columns))
        host = self._to_host(buffers)
        for (lo, hi) in groups:
            plan = rows[lo].plan
            columns = Columns(gamma, min(plan.top_k_record, self.vocab), plan.record)
            has_allowed = self._has_allowed(plan.rule)
            for offset in range(lo, hi):
                self._commit(rows[offset], host[offset], host_u[offset], positions[offset], columns, has_allowed)

    @staticmethod
    def _to_host(buffers: list[torch.Tensor]) -> np.ndarray:
        """Every group's packed buffer in one host copy (widths differ only when groups record differently)."""
        width = max(buffer.shape[1] for buffer in buffers)
        if len(buffers) > 1:
            buffers = [torch.nn.functional.pad(buffer, (0, width - buffer.shape[1])) for buffer in buffers]
        return (buffers[0] if len(buffers) == 1 else torch.cat(buffers)).cpu().numpy()

    def _has_allowed(self, rule: Any) -> bool:
        known = self.allowed.get(rule)
        if known is None:
            probe = torch.full((1, 2), 0.5, dtype=torch.float64, device=self.device)
            known = self.allowed[rule] = rule.allowed_set(probe) is not None
        return known

    def _commit(self, row: _Row, values: np.ndarray, host_u: np.ndarray, position: int, columns: Columns,
                has_allowed: bool) -> None:
        """The host's part of a row's round: tokens, counters, records and cache lengths."""
        run, plan = row.run, row.plan
        accepted, limit, emit, token, drafts = columns.header(values)
        emitted = drafts[:accepted] + ([token] if emit else [])
        kinds = ["accepted"] * accepted + ([("rejected" if accepted < limit else "bonus")] if emit else [])
        if plan.record:
            for slot, kind in enumerate(kinds):
                record = self._record(row, values, host_u[slot], position, slot, kind, emitted[slot], drafts, columns,
                                      has_allowed)
                run.records.append(record)
                if plan.on_record is not None:
                    plan.on_record(record)
        run.blocks += 1
        run.drafted += limit
        run.accepted += accepted
        length = len(row.committed) + accepted
        if self.pair.split is not None:
            row.low_cached = row.high_cached = min(row.low_cached, length)
        else:
            row.scorer.rollback(length)
            row.draft_cached = min(row.draft_cached, length)
        row.committed.extend(emitted)
        run.tokens.extend(emitted)
        if any(emitted_token in plan.eos for emitted_token in emitted):
            run.stop_reason = "eos"

    def _record(self, row: _Row, values: np.ndarray, u: np.ndarray, position: int, slot: int, kind: str, token: int,
                drafts: list[int], columns: Columns, has_allowed: bool) -> PositionRecord:
        """The record of ``slot`` read from the row's host buffer (``Columns``)."""
        fields = {name: values[columns.every(name)][slot] for name in EVERY_SLOT}
        fields["p_top_ids"], fields["p_top_probs"] = (values[part] for part in columns.p_top(slot))
        fields["u_fallback"] = u[FALLBACK]
        if kind != "bonus":
            fields.update({name: values[columns.verified(name)][slot] for name in VERIFIED})
            fields["q_top_ids"], fields["q_top_probs"] = (values[part] for part in columns.q_top(slot))
            fields.update(draft_token=drafts[slot], u_draft=u[DRAFT], u_accept=u[ACCEPT])
            if row.plan.rule.ceiling_factor is None:
                fields["severe_overshoot"] = None
            if not has_allowed:
                fields["allowed_size"] = fields["allowed_mass"] = None
        return position_record(kind, position + slot, row.run.blocks, slot, token, fields, self.texts)

    # -- the whole batch ----------------------------------------------------------------------

    def run(self, stop_all: Callable[[], bool] | None = None, on_start: Callable[[int], None] | None = None,
            on_finish: Callable[[int, Run], None] | None = None) -> list[Run | None]:
        results: list[Run | None] = [None] * len(self.plans)
        waiting = Admission(len(self.plans), stop_all, on_start)
        active: list[_Row] = []
        try:
            while waiting or active:
                active = [row for row in active if not self._done(row, results, on_finish)]
                joining = waiting.take(self.limit - len(active))
                joined = self._join(joining) if joining else []
                active.extend(joined)
                # Polled between rounds, as the per-row programs do: a stopped row ends ``interrupted``.
                staying = []
                for row in active:
                    if row.plan.should_stop is not None and row.plan.should_stop():
                        row.run.status, row.run.stop_reason = "interrupted", "stopped"
                        self._end(row, results, on_finish)
                    else:
                        staying.append(row)
                active = sorted(staying, key=lambda row: (self._group_order(row.key), row.index))
                # A joining row's first round (its whole prompt) runs apart from the others' few tokens.
                fresh = [row for row in active if not row.run.blocks]
                going = [row for row in active if row.run.blocks]
                for rows in (fresh, going):
                    if rows:
                        self.round(rows)
        finally:
            for row in active:
                self._release(row)
        return results

    def _done(self, row: _Row, results: list[Run | None], on_finish: Callable[[int, Run], None] | None) -> bool:
        """End a row that emitted EOS or spent its budget; whether it ended."""
        if row.run.stop_reason == "eos" or len(row.run.tokens) >= row.plan.max_new_tokens:
            self._end(row, results, on_finish)
            return True
        return False

    def _group_order(self, key: tuple) -> int:
        order = getattr(self, "_orders", None)
        if order is None:
            order = self._orders = {}
        return order.setdefault(key, len(order))

    def _end(self, row: _Row, results: list[Run | None], on_finish: Callable[[int, Run], None] | None) -> None:
        self._release(row)
        run = finish(row.run, row.started, self.loaded.tokenizer)
        run.device = self.where
        results[row.index] = run
        if on_finish is not None:
            on_finish(row.index, run)
