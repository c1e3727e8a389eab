"""A fake ``onnxruntime_genai`` package for tests/test_onnxruntime_genai_worker.py: just the API that
diagnostics/verdicts/workers/onnxruntime_genai_worker.py uses (``Model``, ``GeneratorParams``,
``Generator``, ``__version__``; ``models.builder`` is the fake exporter), put on the worker
subprocess's PYTHONPATH. It is noisy on purpose (prints, and writes to fd 1 from "C"), and strict
as the real one is: unknown search options raise, a configuration path with ``..`` is refused, an
EOS id outside the vocabulary is refused, the draft's vocabulary must be the target's.

Generation is a pure function of the prompt, the seed and the step (``fake_tokens``); the model's
own ``eos_token_id`` (2 in every fake export) ends a generation unless the configuration empties it.
Seed 666 raises midway. With a draft or an n-gram size configured, each generated token adds 3
proposed and 1 accepted draft token to the generator's ``get_speculative_stats()``."""

from __future__ import annotations

import json
import os

__version__ = "0.0.fake"
RAISING_SEED = 666
SEARCH_OPTIONS = {"do_sample", "temperature", "top_k", "top_p", "max_length", "random_seed"}
SPECULATIVE_DEFAULTS = {"max_draft_tokens": 4.0, "ngram_size": 0.0, "ngram_chained_lookup": False,
                        "min_adaptive_k": 0.0, "cooldown": False}

print("fake onnxruntime_genai: imported (a print to stdout)")


def fake_tokens(prompt: list[int], seed: int, count: int, vocab_size: int = 1000) -> list[int]:
    """The fake engine's generation: ``count`` ids, a pure function of the prompt and the seed
    (prompt [996] with seed 0 gives 996, 999, 2, …: the fake exports' EOS at its third step)."""
    return [(seed * 7 + sum(prompt) + 3 * step) % vocab_size for step in range(count)]


class Model:
    """A folder with a genai_config.json, checked as ONNX Runtime GenAI checks it."""

    def __init__(self, path: str) -> None:
        with open(os.path.join(path, "genai_config.json"), encoding="utf-8") as handle:
            self.config = json.load(handle)
        model = self.config["model"]
        self.vocab_size = model["vocab_size"]
        eos = model["eos_token_id"]
        self.eos = set([eos] if isinstance(eos, int) else eos)
        if any(not 0 <= token < self.vocab_size for token in self.eos):
            raise RuntimeError(f"eos_token_id must be in range [0, {self.vocab_size}) (vocab_size)")
        for part in ("decoder", "draft"):
            if part in model:
                filename = model[part]["filename"]
                if ".." in filename.split("/"):
                    raise RuntimeError(f"model.{part}.filename: Config path must not contain path traversal (..): {filename}")
                if not os.path.isfile(os.path.join(path, filename)):
                    raise RuntimeError(f"model.{part}.filename: {filename} not found in {path}")
        speculative = self.config.get("speculative", {})
        unknown = set(speculative) - set(SPECULATIVE_DEFAULTS)
        if unknown:
            raise RuntimeError(f"Unknown speculative option: {sorted(unknown)[0]}")
        self.speculative = "draft" in model or bool(speculative.get("ngram_size"))
        self.path = path
        print("fake onnxruntime_genai: model loaded (a print to stdout)")


class GeneratorParams:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.search: dict = {}
        self.speculative = {**SPECULATIVE_DEFAULTS, **{name: (float(value) if isinstance(value, int) and not isinstance(value, bool) else value)
                                                      for name, value in model.config.get("speculative", {}).items()}}

    def set_search_options(self, **options) -> None:
        unknown = set(options) - SEARCH_OPTIONS
        if unknown:
            raise RuntimeError(f"Unknown search option: {sorted(unknown)[0]}")
        self.search.update(options)

    def get_speculative_options(self) -> dict:
        return dict(self.speculative)


class Generator:
    def __init__(self, model: Model, params: GeneratorParams) -> None:
        self.model, self.params = model, params
        self.sequence: list[int] = []
        self.prompt_length = 0
        self.done = False
        self.stats = {"rounds": 0, "draft_tokens_proposed": 0, "draft_tokens_accepted": 0, "draft_tokens_evaluated": 0}

    def append_tokens(self, tokens) -> None:
        rows = [list(row) for row in tokens]
        if len(rows) != 1:
            raise RuntimeError("batch size 1 expected")
        self.sequence = [int(token) for token in rows[0]]
        self.prompt_length = len(self.sequence)

    def is_done(self) -> bool:
        return self.done or len(self.sequence) >= self.params.search["max_length"]

    def generate_next_token(self) -> None:
        os.write(1, b"fake onnxruntime_genai: a C library writes to fd 1\n")
        seed = self.params.search["random_seed"]
        step = len(self.sequence) - self.prompt_length
        if seed == RAISING_SEED and step == 2:
            raise RuntimeError("Non-zero status code returned while running Gather node.\nsecond line of the message")
        token = fake_tokens(self.sequence[:self.prompt_length], seed, step + 1, self.model.vocab_size)[-1]
        self.sequence.append(token)
        if token in self.model.eos:
            self.done = True
        if self.model.speculative:
            self.stats["draft_tokens_proposed"] += 3
            self.stats["draft_tokens_accepted"] += 1

    def get_next_tokens(self) -> list[int]:
        return [self.sequence[-1]]

    def get_sequence(self, index: int) -> list[int]:
        return list(self.sequence)

    def get_speculative_stats(self) -> dict:
        return dict(self.stats)
