"""Server engines of the verdict table: llama-cpp-python's OpenAI-compatible server started here
(prompt-lookup decoding on, and off as the control), or any endpoint a user runs (vLLM, SGLang,
TensorRT-LLM on a GPU: one URL with speculation on, one with it off). Generations come through
the endpoint collector (``audit.collect``), which states every sampling setting."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from diagnostics.audit.samples import Sample, load_samples
from diagnostics.policy import Policy
from diagnostics.verdicts.served import served
from diagnostics.verdicts.table import STOP

LLAMA_LOOKUP_TOKENS = 4


def llama_cpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"llama-cpp-python {version('llama_cpp_python')}"
    except PackageNotFoundError:
        raise RuntimeError("llama-cpp-python[server] is not installed: pip install -r requirements-test.txt "
                           "(it builds llama.cpp: cmake and a C++ compiler)") from None


@contextmanager
def llama_cpp_server(gguf: Path, speculative: bool, log: Path) -> Iterator[str]:
    """llama-cpp-python's server on ``gguf`` at 127.0.0.1 (one thread, so two run side by side on
    2 cores), with prompt-lookup decoding when ``speculative``; yields its URL, stops it after."""
    llama_cpp_version()

    def command(port: int) -> list[str]:
        line = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port), "--host", "127.0.0.1",
                "--n_threads", "1", "--n_ctx", "512"]
        if speculative:
            line += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(LLAMA_LOOKUP_TOKENS)]
        return line

    with served(command, log, "the llama.cpp server") as url:
        yield url


def endpoint_collector(url: str, model: str, policy: Policy, max_tokens: int, speculative: bool, engine: str,
                       tokenize: Callable[[str], list[int]], eos_id: int | None, **options: Any) -> Callable[..., list[Sample]]:
    """``collect(prompt, prompt_ids, seeds) -> samples``: one request per seed to ``url`` (the
    collector's; ``options`` such as ``api_key``, ``scores_api``), read back as samples."""
    from diagnostics.audit.collect import collect
    from diagnostics.audit.completions import Sampling

    sampling = Sampling(max_tokens=max_tokens, temperature=policy.temperature, top_k=policy.top_k, top_p=policy.top_p,
                        min_p=policy.min_p)

    def run(prompt: str, _prompt_ids: list[int], seeds: list[int]) -> list[Sample]:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "chunk.jsonl"
            collect(url, model, [prompt], out, n=len(seeds), sampling=sampling, first_seed=seeds[0], speculative=speculative,
                    tokenize=tokenize, eos_id=eos_id, should_stop=STOP.is_set, **options)
            samples = load_samples(out)
        for sample in samples:
            sample.engine = engine
        return samples

    return run
