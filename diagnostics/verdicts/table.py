"""The verdict table: each engine's output, speculation on and off, audited against the target's
law (the external audit, one-sample, teacher forcing under each line's declared settings).

A row is ``(engine, policy)``. Each side's generations go to a samples file (its sha256 is the
evidence) and its audit to the store; the row's verdict is the speculation-on audit's, unless its
control (speculation off, same settings) fails: then the settings did not match and the row says
so instead of blaming speculation. Rows already in the table file with their evidence files
unchanged are kept (``resume``); a samples file cut short is continued from its next seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.audit.samples import Sample, load_samples, write_samples
from diagnostics.policy import Policy

CONTROL_FAILED = "control failed: settings not matched"
ROW_VERDICTS = ("pass", "fail", "inconclusive", CONTROL_FAILED)
SIDE_FIELDS = ("verdict", "p_value", "tokens", "generations", "detectable_tv", "needed_tokens", "distortion", "distortion_low",
               "distortion_high", "worst_position", "worst_position_p", "impossible", "stopped_short", "reasons", "file", "sha256", "audit_id",
               "time_s", "generation_s")
# The seeds of the two sides never overlap (a lossless engine with the same seed could repeat itself).
OFF_SEED = 1_000_000
CHUNK = 16  # generations written per step: a stopped run loses at most this many
BATCH = 64  # seeds per step for a generator that batches them (rows of one batch)
# Set when the command is interrupted: sides filled side by side (threads) end at their next request.
STOP = threading.Event()


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
    step = BATCH if getattr(job.generator, "batch", None) is not None else CHUNK
    while tokens < tokens_wanted and len(samples) < max_generations:
        if STOP.is_set():
            raise KeyboardInterrupt("stopped: what this side generated is kept in its file")
        chunks = []
        for _ in range(job.workers if job.submit is not None else 1):  # with workers: one chunk each, at once
            text, prompt_ids = job.prompts[(next_seed - first_seed) // step % len(job.prompts)]
            chunks.append((text, prompt_ids, list(range(next_seed, next_seed + step))))
            next_seed += step
        if job.submit is not None:
            futures = [job.submit(list(prompt_ids), seeds) for _, prompt_ids, seeds in chunks]
            outputs = [future.result() for future in futures]
        elif job.collect is None:
            batch = getattr(job.generator, "batch", None)
            outputs = [_generate_chunk(job.generator, batch, prompt_ids, seeds) for _, prompt_ids, seeds in chunks]
        fresh = []
        for index, (text, prompt_ids, seeds) in enumerate(chunks):
            if job.collect is not None:
                fresh += job.collect(text, prompt_ids, seeds)
                continue
            for seed, output in zip(seeds, outputs[index]):
                if isinstance(output, Exception):
                    raise RuntimeError(f"{engine_label} crashed at seed {seed}: {output}") from output
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
    kept.update(file=path.name, sha256=sha256(path), audit_id=audit_id, generation_s=round(generation_s, 1))
    kept["time_s"] = round(float(result.get("time_s") or 0.0), 1)
    return kept


def row_verdict(on: dict[str, Any], off: dict[str, Any]) -> str:
    """The row's verdict: speculation on's, unless the control (off, same settings) failed."""
    if off.get("verdict") == "fail":
        return CONTROL_FAILED
    return str(on.get("verdict"))


def row_key(engine: str, policy_name: str) -> str:
    return f"{engine} · {policy_name}"


def policy_settings(policy: Policy) -> dict[str, Any]:
    return {"temperature": policy.temperature, "top_k": policy.top_k, "top_p": policy.top_p, "min_p": policy.min_p}


def load_table(path: Path) -> dict[str, Any]:
    """The table file (``{"rows": [...]}``), empty when it does not exist; refused in one line when
    it is not a table (``check_table``)."""
    from diagnostics.untrusted_json import loads

    if not path.exists():
        return {"rows": []}
    table = loads(path.read_text(encoding="utf-8"), str(path))
    problem = check_table(table)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return table


def save_table(path: Path, table: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(table, indent=1, ensure_ascii=False, default=_json_default) + "\n", encoding="utf-8")
    partial.replace(path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(type(value).__name__)


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def check_table(table: Any) -> str | None:
    """Why ``table`` is not a verdict table (a file from elsewhere is untrusted), or ``None``: every
    row names its engine, policy and verdict (one of ``ROW_VERDICTS``) as short text, both sides'
    figures are finite numbers or empty, and nothing else is needed to show it."""
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
        return 'not a verdict table: expected {"rows": [...]}'
    if len(table["rows"]) > 1000:
        return "more than 1,000 rows"
    for index, row in enumerate(table["rows"]):
        where = f"row {index + 1}"
        if not isinstance(row, dict):
            return f"{where} is not an object"
        for name in ("engine", "label", "version", "policy", "verdict"):
            if not isinstance(row.get(name), str) or not row[name] or len(row[name]) > 200:
                return f"{where}: {name} must be text of 1 to 200 characters"
        if row["verdict"] not in ROW_VERDICTS:
            return f"{where}: verdict {row['verdict'][:40]!r} is not one of {', '.join(ROW_VERDICTS)}"
        if not isinstance(row.get("settings"), dict):
            return f"{where}: settings must be an object"
        for side in ("on", "off"):
            evidence = row.get(side)
            if not isinstance(evidence, dict):
                return f"{where}: {side} (speculation {side}) must be an object with its audit's figures"
            for name in ("p_value", "tokens", "detectable_tv", "distortion", "distortion_low", "distortion_high"):
                if not _number_or_none(evidence.get(name)):
                    return f"{where}: {side}.{name} must be a finite number"
            if evidence.get("verdict") not in ("pass", "fail", "inconclusive"):
                return f"{where}: {side}.verdict must be pass, fail or inconclusive"
            for name in ("file", "sha256", "audit_id"):
                if evidence.get(name) is not None and (not isinstance(evidence[name], str) or len(evidence[name]) > 200):
                    return f"{where}: {side}.{name} must be text of at most 200 characters"
    return None


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

    def generate(job: Job) -> tuple[list[Sample], float]:
        name = "on" if job.speculative else "off"
        began = time.perf_counter()
        report = None if progress is None else (lambda done, total: progress(name, done, total))
        samples = fill(job, wanted, eos, f"{job.row.label} (speculation {name})", report)
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
        known = (audited or {}).get(sha256(job.path))
        if known is not None and known.get("detect_tv") == detect_tv and known.get("level") == level:
            sides[name] = known["evidence"]  # a control shared with an earlier row: the same file, audited once
            continue
        result = auditor(samples, job.path.name)
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
        if audited is not None:
            audited[sides[name]["sha256"]] = {"detect_tv": detect_tv, "level": level, "evidence": sides[name]}
    return {
        "engine": job_on.row.name, "label": job_on.row.label, "version": version, "policy": job_on.policy_name,
        "target": target_name, "verdict": row_verdict(sides["on"], sides["off"]),
        "settings": {**policy_settings(job_on.policy), "max_tokens": job_on.max_tokens, **job_on.row.speculative,
                     "prompts": [text for text, _ in job_on.prompts], "detect_tv": detect_tv, "level": level},
        "note": job_on.row.note, "on": sides["on"], "off": sides["off"], "time_s": round(time.perf_counter() - started, 1),
        "provenance": "run here",
    }


def audited_controls(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The speculation-off audits the table already holds, by their file's sha256 (``run_row``)."""
    return {row["off"]["sha256"]: {"detect_tv": row["settings"].get("detect_tv"), "level": row["settings"].get("level"),
                                   "evidence": row["off"]}
            for row in table["rows"] if row.get("provenance") == "run here" and row["off"].get("sha256")}


def upsert(table: dict[str, Any], row: dict[str, Any]) -> None:
    """Put ``row`` in the table, replacing the row of the same engine and policy."""
    key = row_key(row["engine"], row["policy"])
    table["rows"] = [other for other in table["rows"] if row_key(other["engine"], other["policy"]) != key] + [row]


def stored_row(table: dict[str, Any], engine: str, policy_name: str, folder: Path,
               settings: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The table's row for ``(engine, policy)`` when it was made under ``settings`` (each named one
    equal) and its evidence files are here and unchanged (resume)."""
    for row in table["rows"]:
        if settings is not None and any(row["settings"].get(name) != value for name, value in settings.items()):
            continue
        if row["engine"] == engine and row["policy"] == policy_name and row.get("provenance") == "run here":
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
    comes from the table (untrusted): only a plain file name inside ``folder`` is accepted."""
    evidence = row[side]
    name = str(evidence.get("file") or "")
    if not name or Path(name).name != name or name.startswith("."):
        raise ValueError(f"the {side} side names no evidence file in {folder}: rerun the row with python -m diagnostics verdicts")
    path = folder / name
    if not path.is_file():
        raise ValueError(f"{path} is missing: it is the {side} side's evidence; restore it from the repository or rerun the row")
    if sha256(path) != evidence.get("sha256"):
        raise ValueError(f"{path} changed since the verdict was made (its sha256 differs from the table's): restore it from the "
                         "repository or rerun the row with --rerun")
    return path


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
