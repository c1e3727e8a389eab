"""The engine's own draft counters for a row made before the table kept them, by replaying part of
its evidence.

A row's speculation-on side is proof that speculation ran only with the engine's counts of drafted
and accepted tokens (``table.row_verdict``). Rows made before those counts were kept hold none, and
making them again costs hours on a CPU. Every generation in a samples file carries its prompt and
seed, so the first ``count`` of them can be generated again, in seed order, by the same engine under
the same settings, counting as it goes. Only when each replayed generation gives exactly the stored
tokens are the counts written to the row: then the process that made the evidence drafted and
accepted as counted on those generations (the engine is a deterministic function of prompt and
seed). The counts name how many generations they cover; the verdict is recomputed (a side that
drafted or accepted nothing becomes ``speculation inactive``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from diagnostics.audit.samples import Sample

@dataclass
class Replay:
    """What a replay found: the counts over the replayed generations, and how many of those gave the
    stored tokens exactly."""

    drafted: int
    accepted: int
    replayed: int
    identical: int
    stored: int
    source: str

    @property
    def counters(self) -> dict[str, Any] | None:
        """The side's ``speculation`` entry, only when every replayed generation was identical."""
        if self.replayed < 1 or self.identical != self.replayed:
            return None
        return {"drafted": self.drafted, "accepted": self.accepted, "generations": self.replayed,
                "source": f"{self.source}; replayed on {self.replayed} of {self.stored} stored generations, "
                          "token for token the stored ones"[:200]}


def replay_chunks(samples: list[Sample], count: int, step: int | None = None) -> list[tuple[list[int], list[Sample]]]:
    """The first ``count`` generations of a side in seed order, grouped into requests as
    ``table.fill`` made them: runs of one prompt within one block of ``step`` seeds (a generator
    that batches was given ``step`` seeds as the rows of one batch, and a row's float sums can
    depend on the batch it sat in). Each request is ``(prompt_ids, its samples)``."""
    chosen = sorted((sample for sample in samples if sample.seed is not None), key=lambda sample: sample.seed)[:count]
    chunks: list[tuple[list[int], list[Sample]]] = []
    for sample in chosen:
        same_block = chunks and (step is None or int(chunks[-1][1][-1].seed) // step == int(sample.seed) // step)
        if same_block and chunks[-1][0] == list(sample.prompt_ids):
            chunks[-1][1].append(sample)
        else:
            chunks.append((list(sample.prompt_ids), [sample]))
    return chunks


Outcome = tuple[list, dict[str, Any]]  # each seed's tokens (or the exception it raised), the engine's counts for the call
Start = Callable[[list[int], list[int]], Callable[[], Outcome]]  # (prompt_ids, seeds) -> a call that waits for the outcome


def replay(samples: list[Sample], count: int, eos: set[int], start: Start, step: int | None = None) -> Replay:
    """Replay the first ``count`` stored generations: ``start(prompt_ids, seeds)`` sets one request
    going and returns a call that waits for its outcome (each seed's tokens, and the engine's counts
    ``drafted``, ``accepted``, ``source`` for that request): all requests are started first, so worker
    processes take them at once. Each output is cut after its first EOS, as ``table.fill`` cuts it,
    and compared with the stored ids. ``step``: the seeds per request the file was made with
    (``replay_chunks``); ``count`` is best a multiple of it, so each batch is replayed whole."""
    drafted = accepted = replayed = identical = 0
    source = "the engine's counters"
    chunks = replay_chunks(samples, count, step)
    pending = [start(prompt_ids, [int(sample.seed) for sample in chunk]) for prompt_ids, chunk in chunks]
    for (_, chunk), wait in zip(chunks, pending):
        outputs, counts = wait()
        drafted += int(counts.get("drafted") or 0)
        accepted += int(counts.get("accepted") or 0)
        source = str(counts.get("source") or source)
        replayed += len(chunk)  # a request that ended at a crash answers fewer seeds: the rest are not identical
        for sample, output in zip(chunk, outputs):
            if isinstance(output, Exception):
                continue
            ended = next((place for place, token in enumerate(output) if token in eos), None)
            tokens = [int(token) for token in (output if ended is None else output[: ended + 1])]
            identical += tokens == list(sample.token_ids)
    return Replay(drafted, accepted, replayed, identical, len(samples), source)


def counted_chunk(generator: Any, prompt_ids: list[int], seeds: list[int]) -> Any:
    """One request to an in-process generator, as the table makes it (``_generate_chunk``, ending at
    the first seed that crashes): each seed's tokens, or, where the engine counts its drafts
    (``generator.counters``), ``{"outputs": …, "counters": this request's counts}``. The one way a
    worker process (``run.worker_chunk``) and a replay here count a request."""
    from diagnostics.audit.engine_level import _generate_chunk

    counters = getattr(generator, "counters", None)
    before = dict(counters) if isinstance(counters, dict) else None
    outputs = _generate_chunk(generator, getattr(generator, "batch", None), prompt_ids, seeds, first_error_only=True)
    if before is None:
        return outputs
    # The generator lives on (in a worker, across requests): this request's counts are the change.
    delta = {name: counters[name] - before[name] for name in ("drafted", "accepted", "generations")}
    return {"outputs": outputs, "counters": {**delta, "source": counters.get("source")}}


def _outcome(result: Any) -> Outcome:
    if not isinstance(result, dict):
        raise ValueError("this engine keeps no draft counters: its rows stay 'drafts not counted'")
    return result["outputs"], result.get("counters") or {}


def counting_call(generator: Any) -> Start:
    """``replay``'s ``start`` for an in-process generator that keeps ``generator.counters``: the
    request runs at once (``counted_chunk``)."""

    def start(prompt_ids: list[int], seeds: list[int]) -> Callable[[], Outcome]:
        outcome = _outcome(counted_chunk(generator, prompt_ids, seeds))
        return lambda: outcome

    return start


def worker_call(submit: Callable[[list[int], list[int]], Any]) -> Start:
    """``replay``'s ``start`` through the row's worker processes (``run.worker_chunk``), the way the
    row's evidence was made with ``--workers``."""

    def start(prompt_ids: list[int], seeds: list[int]) -> Callable[[], Outcome]:
        future = submit(list(prompt_ids), list(seeds))
        return lambda: _outcome(future.result())

    return start
