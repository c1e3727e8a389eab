"""Server engines of the verdict table: llama-cpp-python's OpenAI-compatible server started here
(prompt-lookup decoding on, and off as the control), or any endpoint a user runs (vLLM, SGLang,
TensorRT-LLM on a GPU: one URL with speculation on, one with it off). Generations come through
the endpoint collector (``audit.collect``), which states every sampling setting."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from diagnostics.audit.samples import Sample, load_samples
from diagnostics.policy import Policy

LLAMA_LOOKUP_TOKENS = 4
START_TIMEOUT_S = 120


def llama_cpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"llama-cpp-python {version('llama_cpp_python')}"
    except PackageNotFoundError:
        raise RuntimeError("llama-cpp-python[server] is not installed: pip install -r requirements-test.txt "
                           "(it builds llama.cpp: cmake and a C++ compiler)") from None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def served(command: Callable[[int], list[str]], log: Path, name: str, ready_path: str = "/v1/models",
           timeout_s: float = START_TIMEOUT_S) -> Iterator[str]:
    """Start ``command(port)`` (a server on 127.0.0.1 at a free port, its output to ``log``), wait
    until ``ready_path`` answers 200, yield its URL, and stop it after. A server that exits first, or
    does not answer within ``timeout_s``, is a ``RuntimeError`` naming ``name`` and the log."""
    port = _free_port()
    with log.open("w") as output:
        process = subprocess.Popen(command(port), stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url + ready_path, timeout=2).read()
                break
            except OSError:  # refused, or an HTTP error such as 503 while the model loads
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited (status {process.returncode}); its log: {log}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not answer in {timeout_s:g} s; its log: {log}") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
    from diagnostics.audit.collect import Sampling, collect

    sampling = Sampling(max_tokens=max_tokens, temperature=policy.temperature, top_k=policy.top_k, top_p=policy.top_p,
                        min_p=policy.min_p)

    def run(prompt: str, _prompt_ids: list[int], seeds: list[int]) -> list[Sample]:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "chunk.jsonl"
            collect(url, model, [prompt], out, n=len(seeds), sampling=sampling, first_seed=seeds[0], speculative=speculative,
                    tokenize=tokenize, eos_id=eos_id, **options)
            samples = load_samples(out)
        for sample in samples:
            sample.engine = engine
        return samples

    return run
