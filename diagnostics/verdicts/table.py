"""The verdict table: each engine's output, speculation on and off, audited against the target's
law (the external audit, one-sample, teacher forcing under each line's declared settings).

A row is ``(engine, policy)``. Each side's generations go to a samples file (its sha256 is the
evidence) and its audit to the store; the row's verdict is the speculation-on audit's, unless its
control (speculation off, same settings) fails: then the settings did not match and the row says
so instead of blaming speculation; an engine that raises (or gives ids the target cannot read)
makes the row ``engine error`` with its message, and a speculative side whose engine's own counters
(``generator.counters``) say it drafted or accepted nothing makes it ``speculation inactive``
(``row_verdict``). Rows already in the table file with their evidence files
unchanged are kept (``resume``); a samples file cut short is continued from its next seed.

A verdict is decided by evidence, never by the file being judged: a row imported from a table made
elsewhere never replaces a row run here (``upsert``: both stay, and ``disagreement`` says when their
verdicts differ), and the evidence of a re-audit is a plain file in a plain folder (``evidence_file``
follows no symbolic link). The file itself is read, checked and written by ``table_file``.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.audit.samples import Sample, SamplesError, load_samples, write_samples
from diagnostics.policy import Policy
from diagnostics.verdicts.table_file import (  # noqa: F401  (the table file's names, where callers import them)
    CONTROL_FAILED, ENGINE_ERROR, MAX_REASON, MAX_SETTINGS_BYTES, MAX_TABLE_BYTES, ROW_VERDICTS, RUN_HERE, SIDE_ERROR,
    SPECULATION_INACTIVE, check_table, is_run_here, load_table, save_table,
)
SIDE_FIELDS = ("verdict", "p_value", "tokens", "generations", "detectable_tv", "needed_tokens", "distortion", "distortion_low",
               "distortion_high", "worst_position", "worst_position_p", "impossible", "stopped_short", "reasons", "file", "sha256", "audit_id",
               "time_s", "generation_s")
# The seeds of the two sides never overlap (a lossless engine with the same seed could repeat itself).
OFF_SEED = 1_000_000
CHUNK = 16  # generations written per step: a stopped run loses at most this many
BATCH = 64  # seeds per step for a generator that batches them (rows of one batch)
# Set when the command is interrupted: sides filled side by side (threads) end at their next request.
STOP = threading.Event()


class EngineFailure(RuntimeError):
    """The engine raised while generating (its message kept): the side's outcome, not the command's error."""


@dataclass
class Job:
    """One side of one row to fill: the generator, its prompts, and where its evidence goes."""

    row: Any  # engines.EngineRow
    policy_name: str
    policy: Policy
    speculative: bool
    prompts: list[tuple[str, list[int]]]  # (text, ids)
    max_tokens: int
    path: Path
    control: str = ""  # what runs with speculation off: rows with the same control share its file
    generator: Callable[[list[int], int], list[int]] | None = None  # in-process engines
    collect: Callable[..., list[Sample]] | None = None  # server engines: (prompt, prompt_ids, seeds) -> samples
    submit: Callable[[list[int], list[int]], Any] | None = None  # (prompt_ids, seeds) -> a future of the chunk's outputs
    worker_counters: dict[str, Any] | None = None  # the engine's counts summed over the workers' chunks (``submit``)
    workers: int = 1  # chunks generated at once through ``submit``


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def needed_tokens(detect_tv: float, level: float = 0.01) -> int:
    """Tokens that detect a PIT-law TV of ``detect_tv`` at 90% power (the external audit's figure)."""
    from diagnostics.audit.engine_level import PIT_BINS
    from diagnostics.audit.external import DETECTION_POWER, required_samples

    return int(required_samples(detect_tv, PIT_BINS - 1, level / 2, DETECTION_POWER))


def fill(job: Job, tokens_wanted: int, eos: set[int], engine_label: str,
         progress: Callable[[int, int], None] | None = None, max_generations: int = 100_000) -> list[Sample]:
    """The side's samples file grown until it holds ``tokens_wanted`` tokens: the prompts take turns,
    ``CHUNK`` seeds at a time, each generation cut after its first EOS. What the file already
    holds is kept and continued (seeds go on from its largest)."""
    from diagnostics.audit.engine_level import _generate_chunk

    samples = load_samples(job.path) if job.path.exists() else []
    _check_continuable(job, samples)
    first_seed = OFF_SEED if not job.speculative else 0
    next_seed = max((sample.seed for sample in samples if sample.seed is not None), default=first_seed - 1) + 1
    tokens = sum(len(sample.token_ids) for sample in samples)
    # A generator that batches takes a whole batch of seeds at once; the others a chunk at a time.
    step = getattr(job.generator, "batch_size", BATCH) if getattr(job.generator, "batch", None) is not None else CHUNK
    while tokens < tokens_wanted and len(samples) < max_generations:
        if STOP.is_set():
            raise KeyboardInterrupt("stopped: what this side generated is kept in its file")
        chunks = []
        for _ in range(job.workers if job.submit is not None else 1):  # with workers: one chunk each, at once
            text, prompt_ids = job.prompts[(next_seed - first_seed) // step % len(job.prompts)]
            chunks.append((text, prompt_ids, list(range(next_seed, next_seed + step))))
            next_seed += step
        try:  # an in-process engine's own work: what it raises is its outcome (EngineFailure), not this command's
            if job.submit is not None:
                futures = [job.submit(list(prompt_ids), seeds) for _, prompt_ids, seeds in chunks]
                outputs = [_worker_outputs(job, future.result()) for future in futures]
            elif job.collect is None:
                batch = getattr(job.generator, "batch", None)
                outputs = [_generate_chunk(job.generator, batch, prompt_ids, seeds, first_error_only=True)
                           for _, prompt_ids, seeds in chunks]
        except KeyboardInterrupt:
            raise
        except Exception as error:
            raise EngineFailure(f"{engine_label} raised at seeds {chunks[0][2][0]}…: {type(error).__name__}: {error}") from error
        fresh = []
        for index, (text, prompt_ids, seeds) in enumerate(chunks):
            if job.collect is not None:  # a server's own errors (one it cannot reach among them) stay the command's
                fresh += job.collect(text, prompt_ids, seeds)
                continue
            for seed, output in zip(seeds, outputs[index]):
                if isinstance(output, Exception):
                    raise EngineFailure(f"{engine_label} crashed at seed {seed}: {output}") from output
                ended = next((place for place, token in enumerate(output) if token in eos), None)
                output = output if ended is None else output[: ended + 1]
                fresh.append(Sample(prompt=text, token_ids=[int(token) for token in output], temperature=job.policy.temperature,
                                    top_k=job.policy.top_k, top_p=job.policy.top_p, min_p=job.policy.min_p,
                                    prompt_ids=list(prompt_ids), engine=engine_label, speculative=job.speculative, seed=seed,
                                    max_tokens=job.max_tokens))
        samples += fresh
        tokens += sum(len(sample.token_ids) for sample in fresh)
        write_samples(job.path, samples)  # whole file each time: a stop leaves a valid file
        if progress is not None:
            progress(min(tokens, tokens_wanted), tokens_wanted)
    return samples


def _worker_outputs(job: Job, result: Any) -> list:
    """A worker's chunk (``run.worker_chunk``): its outputs, its engine counters added to the job's."""
    if not isinstance(result, dict):
        return result
    counts = result.get("counters") or {}
    if job.worker_counters is None:
        job.worker_counters = {"drafted": 0, "accepted": 0, "generations": 0, "source": counts.get("source")}
    for name in ("drafted", "accepted", "generations"):
        job.worker_counters[name] += int(counts.get(name) or 0)
    return result["outputs"]


def _check_continuable(job: Job, samples: list[Sample]) -> None:
    """A samples file is continued only when it was made under the job's settings: a changed
    --max-tokens, policy or prompt would otherwise mix two settings in one row's evidence."""
    prompts = {text for text, _ in job.prompts}
    for sample in samples:
        made = (sample.max_tokens, sample.temperature, sample.top_k, sample.top_p, sample.min_p, sample.speculative)
        wanted = (job.max_tokens, job.policy.temperature, job.policy.top_k, job.policy.top_p, job.policy.min_p, job.speculative)
        if made != wanted or sample.prompt not in prompts:
            raise ValueError(f"{job.path} was made with other settings (max_tokens, policy or prompts) than this command's: "
                             "give the same options, --rerun to make it again, or another --evidence folder")


def side_evidence(result: dict[str, Any], path: Path, audit_id: str | None, generation_s: float) -> dict[str, Any]:
    """What the table keeps of one side's audit: the figures, the file and its hash, the audit id."""
    kept = {name: result.get(name) for name in SIDE_FIELDS if name in result}
    for name in ("distortion", "distortion_low", "distortion_high"):
        # A TV lies in [0, 1]: a bootstrap interval's end shifted past 1 by its bias correction is cut
        # there, as its lower end is cut at 0 (the table refuses a TV outside [0, 1]).
        if isinstance(kept.get(name), float) and math.isfinite(kept[name]):
            kept[name] = min(1.0, max(0.0, kept[name]))
    kept.update(file=path.name, sha256=sha256(path), audit_id=audit_id, generation_s=round(generation_s, 1))
    kept["time_s"] = round(float(result.get("time_s") or 0.0), 1)
    return kept


def row_verdict(on: dict[str, Any], off: dict[str, Any]) -> str:
    """The row's verdict: ``ENGINE_ERROR`` when either side's engine raised or gave what cannot be
    audited; ``CONTROL_FAILED`` when the control (off, same settings) failed; ``SPECULATION_INACTIVE``
    when speculation on did not fail but the engine's own counters say it drafted or accepted
    nothing (so speculation was never tested); else speculation on's verdict."""
    if SIDE_ERROR in (on.get("verdict"), off.get("verdict")):
        return ENGINE_ERROR
    if off.get("verdict") == "fail":
        return CONTROL_FAILED
    counters = on.get("speculation") or {}
    if on.get("verdict") != "fail" and (counters.get("drafted") == 0 or counters.get("accepted") == 0):
        return SPECULATION_INACTIVE
    return str(on.get("verdict"))


def error_side(error: BaseException, path: Path, generation_s: float) -> dict[str, Any]:
    """A side whose engine raised (or whose output cannot be audited): verdict ``error``, the message
    on one line, and the file it had written so far (its hash), which is the evidence of where."""
    said = str(error) if isinstance(error, EngineFailure) else f"{type(error).__name__}: {error}"
    message = " ".join(said.split())[:MAX_REASON]
    side: dict[str, Any] = {"verdict": SIDE_ERROR, "error": message, "reasons": [message],
                            "generation_s": round(generation_s, 1)}
    if path.is_file() and not path.is_symlink():
        side.update(file=path.name, sha256=sha256(path))
    return side


def answer_counters(samples: list[Sample]) -> dict[str, Any] | None:
    """The engine's counters as its own answers state them, summed over the side's generations:
    llama.cpp's ``/completion`` reports ``timings.draft_n`` and ``timings.draft_n_accepted`` with
    each answer (kept in the line's ``raw``). ``None`` when no answer states them. Read from the
    evidence file itself, so a committed row's counters can be checked by anyone."""
    drafted = accepted = counted = 0
    for sample in samples:
        timings = sample.raw.get("timings") if isinstance(sample.raw, dict) else None
        if not isinstance(timings, dict):
            continue
        draft_n, kept = timings.get("draft_n"), timings.get("draft_n_accepted")
        if isinstance(draft_n, int) and isinstance(kept, int) and not isinstance(draft_n, bool) and 0 <= kept <= draft_n:
            drafted, accepted, counted = drafted + draft_n, accepted + kept, counted + 1
    if not counted:
        return None
    return {"drafted": drafted, "accepted": accepted, "generations": counted,
            "source": "llama.cpp's timings (draft_n, draft_n_accepted) in each answer"}


def engine_counters(job: "Job") -> dict[str, Any] | None:
    """The engine's own count of drafted and accepted tokens for this side's generations, where its
    generator keeps one (``generator.counters``: a dict it updates), as the table keeps it."""
    # Where worker processes generated (``submit``), their chunks' counts (this process's generator
    # counted nothing); none when this command generated nothing (a resumed side): zero counts there
    # would say "speculation inactive" of an engine that was never watched.
    if job.submit is not None:
        counters = job.worker_counters
    else:
        counters = getattr(job.generator, "counters", None) if job.generator is not None else None
    if not isinstance(counters, dict) or not isinstance(counters.get("generations"), int) or counters["generations"] < 1:
        return None
    kept = {name: int(counters[name]) for name in ("drafted", "accepted", "generations") if isinstance(counters.get(name), int)}
    return {**kept, "source": str(counters.get("source") or "the engine's counters")[:200]}


def row_key(engine: str, policy_name: str) -> str:
    return f"{engine} · {policy_name}"


def policy_settings(policy: Policy) -> dict[str, Any]:
    return {"temperature": policy.temperature, "top_k": policy.top_k, "top_p": policy.top_p, "min_p": policy.min_p}


Auditor = Callable[[list[Sample], str], dict[str, Any]]  # (samples, source name) -> the audit's result as a dict


def target_auditor(target: Any, eos: set[int], detect_tv: float, level: float) -> Auditor:
    """The external audit against a local copy of the target (teacher forcing)."""
    from diagnostics.audit.external import audit_samples

    return lambda samples, source: audit_samples(samples, target, level=level, detect_tv=detect_tv, source=source, eos=eos).as_dict()


def scores_auditor(detect_tv: float, level: float) -> Auditor:
    """The external audit against the server's own teacher-forced scores (``--oracle server``)."""
    from diagnostics.audit.external import audit_scored_samples

    return lambda samples, source: audit_scored_samples(samples, level=level, detect_tv=detect_tv, source=source).as_dict()


def run_row(job_on: Job, job_off: Job, auditor: Auditor, eos: set[int], *, detect_tv: float, level: float, store: Any,
            version: str, target_name: str, progress: Callable[[str, int, int], None] | None = None,
            parallel: bool = False, audited: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Both sides of one row generated (or continued; side by side when ``parallel``: a server
    engine's two servers each take a core), audited by ``auditor``, stored; the row as the table
    keeps it. ``audited`` (file sha256 → its audit) lets rows that share a control file share its audit."""
    from concurrent.futures import ThreadPoolExecutor

    from diagnostics.audit.reporting import summary_line

    started = time.perf_counter()
    wanted = needed_tokens(detect_tv, level)

    def generate(job: Job) -> tuple[list[Sample] | Exception, float]:
        name = "on" if job.speculative else "off"
        began = time.perf_counter()
        report = None if progress is None else (lambda done, total: progress(name, done, total))
        try:
            samples: list[Sample] | Exception = fill(job, wanted, eos, f"{job.row.label} (speculation {name})", report)
        except EngineFailure as error:  # the engine raised: a verdict too (ENGINE_ERROR), with its message
            samples = error
        return samples, time.perf_counter() - began

    jobs = (job_on, job_off)
    if parallel:
        pool = ThreadPoolExecutor(2)
        try:
            generated = list(pool.map(generate, jobs))
        except BaseException:
            STOP.set()  # an interruption: the other side's thread stops at its next request, not at its end
            raise
        finally:
            pool.shutdown(wait=True)
            STOP.clear()
    else:
        generated = [generate(job) for job in jobs]
    sides = {}
    for job, (samples, generation_s) in zip(jobs, generated):
        name = "on" if job.speculative else "off"
        if isinstance(samples, Exception):
            sides[name] = error_side(samples, job.path, generation_s)
            continue
        known = (audited or {}).get(sha256(job.path))
        if known is not None and known.get("detect_tv") == detect_tv and known.get("level") == level:
            sides[name] = known["evidence"]  # a control shared with an earlier row: the same file, audited once
            continue
        try:
            result = auditor(samples, job.path.name)
        except SamplesError as error:  # e.g. ids outside the target's vocabulary: what the engine gave cannot be audited
            sides[name] = error_side(error, job.path, generation_s)
            continue
        for _ in range(3):  # lines the audit left out (a text whose ids are unknown) are made up for, with a margin
            held = sum(len(sample.token_ids) for sample in samples)
            if (result.get("tokens") or 0) >= wanted or held < wanted:
                break
            began = time.perf_counter()
            samples = fill(job, held + math.ceil((wanted - (result.get("tokens") or 0)) * 1.25), eos,
                           f"{job.row.label} (speculation {name})")
            generation_s += time.perf_counter() - began
            result = auditor(samples, job.path.name)
        result["implementation"] = f"{job.row.label} (speculation {name})" if job.speculative else f"{job.control} (speculation off)"
        audit_id = store.add_audit(result, summary_line(result)) if store is not None else None
        sides[name] = side_evidence(result, job.path, audit_id, generation_s)
        counters = engine_counters(job) or (answer_counters(samples) if job.speculative else None)
        if counters is not None:
            sides[name]["speculation"] = counters
        if audited is not None:
            audited[sides[name]["sha256"]] = {"detect_tv": detect_tv, "level": level, "evidence": sides[name]}
    return {
        "engine": job_on.row.name, "label": job_on.row.label, "version": version, "policy": job_on.policy_name,
        "target": target_name, "verdict": row_verdict(sides["on"], sides["off"]),
        "settings": {**policy_settings(job_on.policy), "max_tokens": job_on.max_tokens, **job_on.row.speculative,
                     "prompts": [text for text, _ in job_on.prompts], "detect_tv": detect_tv, "level": level},
        "note": job_on.row.note, "on": sides["on"], "off": sides["off"], "time_s": round(time.perf_counter() - started, 1),
        "provenance": RUN_HERE,
    }


def audited_controls(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The speculation-off audits the table already holds, by their file's sha256 (``run_row``)."""
    return {row["off"]["sha256"]: {"detect_tv": row["settings"].get("detect_tv"), "level": row["settings"].get("level"),
                                   "evidence": row["off"]}
            for row in table["rows"] if is_run_here(row) and row["off"].get("sha256")}


def upsert(table: dict[str, Any], row: dict[str, Any]) -> None:
    """Put ``row`` in the table, replacing the row of the same engine and policy and the same
    provenance kind: a row run here replaces the one run here, an imported row the imported one.
    An imported row never replaces a row run here (nor the reverse): both stay, side by side, and
    ``disagreement`` tells when their verdicts differ."""
    key = (row_key(row["engine"], row["policy"]), is_run_here(row))
    table["rows"] = [other for other in table["rows"] if (row_key(other["engine"], other["policy"]), is_run_here(other)) != key] + [row]


def imported_row(row: dict[str, Any], origin: str) -> dict[str, Any]:
    """A row of a table made elsewhere as this table keeps it: marked with ``origin`` (whatever
    provenance it claims), and each side's audit id kept as ``audit_id_elsewhere``: it names an audit
    in its maker's store, which an id of this store's must never be taken for."""
    marked = {**row, "provenance": origin}
    for side in ("on", "off"):
        evidence = dict(row[side])
        elsewhere = evidence.pop("audit_id", None) or evidence.get("audit_id_elsewhere")
        marked[side] = {**evidence, "audit_id": None, "audit_id_elsewhere": elsewhere}
    return marked


def disagreement(table: dict[str, Any], row: dict[str, Any]) -> str | None:
    """For an imported row, the verdict of the row run here for the same engine and policy when the
    two disagree (its verdict, or its control's), e.g. ``"pass"``; ``None`` when they agree, when
    there is no such row, or for a row run here."""
    if is_run_here(row):
        return None
    for other in table["rows"]:
        if is_run_here(other) and other["engine"] == row["engine"] and other["policy"] == row["policy"]:
            if other["verdict"] != row["verdict"]:
                return other["verdict"]
            if other["off"].get("verdict") != row["off"].get("verdict"):
                return f"{other['verdict']}, control {other['off'].get('verdict')}"
    return None


def stored_row(table: dict[str, Any], engine: str, policy_name: str, folder: Path,
               settings: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The table's row for ``(engine, policy)`` when it was made under ``settings`` (each named one
    equal) and its evidence files are here and unchanged (resume)."""
    for row in table["rows"]:
        if settings is not None and any(row["settings"].get(name) != value for name, value in settings.items()):
            continue
        if row["engine"] == engine and row["policy"] == policy_name and is_run_here(row):
            if evidence_unchanged(row, folder):
                return row
    return None


def evidence_unchanged(row: dict[str, Any], folder: Path) -> bool:
    """Whether both sides' evidence files are in ``folder`` with the sha256 the table states (``evidence_file``)."""
    try:
        for side in ("on", "off"):
            evidence_file(row, side, folder)
    except (OSError, ValueError):
        return False
    return True


def evidence_file(row: dict[str, Any], side: str, folder: Path) -> Path:
    """The generations file of one side (``on`` / ``off``) of a row, in ``folder``, checked to be
    the file the verdict was made from: its sha256 must equal the one the table states. The name
    comes from the table (untrusted): only a plain file name inside ``folder`` is accepted, and
    neither ``folder`` nor the file may be a symbolic link (one-line ``ValueError``)."""
    evidence = row[side]
    name = str(evidence.get("file") or "")
    if not name or Path(name).name != name or name.startswith("."):
        raise ValueError(f"the {side} side names no evidence file in {folder}: rerun the row with python -m diagnostics verdicts")
    path = folder / name
    # No symbolic link, neither the folder nor the file: a link committed or unpacked there could
    # point the hash check (an oracle on any file's content) and the audit's parser at files elsewhere.
    for place in (folder, path):
        if os.path.islink(place):
            raise ValueError(f"{place} is a symbolic link: the evidence must be a plain file in a plain folder; "
                             "replace the link with the file itself")
    try:
        digest = _sha256_no_follow(path)
    except FileNotFoundError:
        raise ValueError(f"{path} is missing: it is the {side} side's evidence; restore it from the repository or rerun the row") from None
    if digest != evidence.get("sha256"):
        raise ValueError(f"{path} changed since the verdict was made (its sha256 differs from the table's): restore it from the "
                         "repository or rerun the row with --rerun")
    return path


def _sha256_no_follow(path: Path) -> str:
    """The sha256 of the regular file at ``path``, opened without following a link (``O_NOFOLLOW``:
    a link put there after the check above fails here) nor blocking (a pipe is refused, not waited on)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(f"{path} cannot be read as evidence ({error.strerror or error}): it must be a plain file, not a link") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ValueError(f"{path} is not a regular file: the evidence must be the generations file itself")
    with os.fdopen(descriptor, "rb") as handle:
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def reaudit_side(row: dict[str, Any], side: str, folder: Path, target: Any, eos: set[int],
                 progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The external audit of one side's committed evidence again, here, against ``target`` at the
    row's own ``detect_tv`` and level: the same file (hash checked), the same test, so the same
    verdict and p-value as the table's when ``target`` is the row's target."""
    from diagnostics.audit.external import DEFAULT_DETECT_TV, audit_samples

    path = evidence_file(row, side, folder)
    settings = row.get("settings") or {}
    result = audit_samples(load_samples(path), target, level=float(settings.get("level") or 0.01),
                           detect_tv=float(settings.get("detect_tv") or DEFAULT_DETECT_TV), source=path.name, eos=eos,
                           progress=progress).as_dict()
    result["implementation"] = f"{row.get('label')} (speculation {side})"
    return result
