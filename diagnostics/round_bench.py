"""The round benchmark (``bench --only round``): the tensor core against the reference core and transformers.

For every setup (plain decoding, chains with each drafter the embedded model has, trees in each children
mode) and every batch size in ``rows``, one batch of ``rows`` coupled generations (one prompt, a seed per
row, every position recorded, EOS ignored) is timed with ``core="tensor"`` and with ``core="reference"``,
alternating, after one warm-up each; plain decoding is also timed against transformers' batched
``generate(do_sample=True)`` of the same rows. A figure is positions per second: every emitted token of
every row over the wall time of the whole batch; the median of ``repeat`` alternations is kept, and each
ratio is taken within this run. The machine's CPU model, core count and cache sizes are printed beside
the table, since a ratio measured on one processor need not hold on another.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Setup:
    """One line of the table: a drafter (``None``: plain decoding), a rule and, for a tree, its shape."""

    label: str
    draft: str | None
    rule: str = "lossless"
    tree: str | None = None
    children: str = "top"


def setups(layer: int) -> list[Setup]:
    """The setups the embedded model can run without a second model: plain, the early exit at ``layer``
    (lossless and lossy chains, trees with top-k and sampled children) and prompt lookup."""
    exit_ = f"early-exit:{layer}"
    return [
        Setup("plain", None),
        Setup(f"{exit_} chain, lossless", exit_),
        Setup(f"{exit_} chain, lenience:0.5", exit_, "lenience:0.5"),
        Setup("ngram:2 chain, lossless", "ngram:2"),
        Setup(f"{exit_} tree 2,1 top, lossless", exit_, tree="2,1"),
        Setup(f"{exit_} tree 2,1 sampled, lossless", exit_, tree="2,1", children="sample"),
    ]


def cpu_model() -> str:
    """The CPU's model name as Linux gives it (``/proc/cpuinfo``), else what ``platform`` knows."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return model


def machine_facts() -> dict[str, Any]:
    """CPU model, logical cores, torch threads and the cache sizes of core 0 (``L1d``, ``L2``, … as Linux
    lists them in ``/sys/devices/system/cpu/cpu0/cache``; empty where it does not)."""
    model = cpu_model()
    caches: dict[str, str] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        caches[f"L{level}{'d' if kind == 'Data' else 'i' if kind == 'Instruction' else ''}"] = size
    return {"cpu": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "caches": caches,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)")}


def _rate(call: Callable[[], int]) -> float:
    start = time.perf_counter()
    positions = call()
    return positions / (time.perf_counter() - start)


def _ours(target: Any, setup: Setup, prompt: list[int], rows: int, tokens: int, core: str, gamma: int) -> Callable[[], int]:
    """A timed call of our engine on ``rows`` rows with ``core``; a new block of seeds per call."""
    from diagnostics.engine import generate_batch

    calls = iter(range(10**6))
    shape = {"tree": setup.tree, "tree_children": setup.children} if setup.tree else {}

    def call() -> int:
        first = next(calls) * rows
        runs = generate_batch(target, setup.draft, [prompt] * rows, setup.rule, list(range(first, first + rows)),
                              gamma=gamma, max_new_tokens=tokens, eos_token_id=[], core=core, **shape)
        if any(len(run.records) != len(run.tokens) for run in runs):
            raise RuntimeError("a row did not record every position")
        return sum(len(run.tokens) for run in runs)

    return call


def _transformers(target: Any, prompt: list[int], rows: int, tokens: int) -> Callable[[], int]:
    """transformers' batched plain sampling of the same rows (``generate(do_sample=True)``, no truncation)."""
    ids = torch.tensor([prompt] * rows, dtype=torch.long, device=target.device)
    settings = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": True, "temperature": 1.0, "top_k": 0,
                "top_p": 1.0, "pad_token_id": target.tokenizer.eos_token_id}

    def call() -> int:
        with torch.inference_mode():
            output = target.model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
        return (output.shape[1] - ids.shape[1]) * rows

    return call


def round_table(target: Any, prompt: list[int], chosen: list[Setup], rows_list: list[int], tokens: int, repeat: int,
                gamma: int = 4, progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One entry per (setup, rows): positions/s of the tensor core, the reference core and (plain decoding)
    transformers, each the median of ``repeat`` alternations after a warm-up, with the ratios
    ``tensor / reference`` and ``tensor / transformers``. ``progress(entry)`` after each entry."""
    if repeat < 1 or tokens < 1 or not rows_list:
        raise ValueError("repeat, tokens and the batch sizes must be at least 1")
    table = []
    for setup in chosen:
        for rows in rows_list:
            sides = {"tensor": _ours(target, setup, prompt, rows, tokens, "tensor", gamma),
                     "reference": _ours(target, setup, prompt, rows, tokens, "reference", gamma)}
            if setup.draft is None:
                sides["transformers"] = _transformers(target, prompt, rows, tokens)
            for call in sides.values():
                call()  # warm-up
            rates: dict[str, list[float]] = {name: [] for name in sides}
            for turn in range(repeat):
                order = list(sides) if turn % 2 == 0 else list(reversed(sides))  # drifts in load hit every side
                for name in order:
                    rates[name].append(_rate(sides[name]))
            entry: dict[str, Any] = {"setup": setup.label, "rows": rows}
            entry.update({f"{name}_positions_per_s": round(statistics.median(values), 2) for name, values in rates.items()})
            entry["tensor_over_reference"] = round(statistics.median(rates["tensor"]) / statistics.median(rates["reference"]), 3)
            if "transformers" in rates:
                entry["tensor_over_transformers"] = round(
                    statistics.median(rates["tensor"]) / statistics.median(rates["transformers"]), 3)
            table.append(entry)
            if progress is not None:
                progress(entry)
    return table


def markdown(table: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    """The table as Markdown for the README, with the machine beneath it."""
    lines = ["| setup | rows | tensor core (positions/s) | reference core | tensor / reference | tensor / transformers |",
             "|---|---|---|---|---|---|"]
    for entry in table:
        against = entry.get("tensor_over_transformers")
        lines.append(f"| {entry['setup']} | {entry['rows']} | {entry['tensor_positions_per_s']:.1f} | "
                     f"{entry['reference_positions_per_s']:.1f} | {entry['tensor_over_reference']:.2f}× | "
                     f"{'' if against is None else f'{against:.2f}×'} |")
    caches = ", ".join(f"{name} {size}" for name, size in machine["caches"].items()) or "caches not listed"
    lines.append("")
    lines.append(f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['torch_threads']} torch threads, {caches}; "
                 f"OMP_WAIT_POLICY {machine['omp_wait_policy']}.")
    return "\n".join(lines)
