"""A real third-party engine: llama-cpp-python's OpenAI-compatible server on the embedded GGUF file,
with prompt-lookup decoding (speculation on) and without it, audited from its outputs.

It needs ``llama-cpp-python[server]`` (``requirements-test.txt``: built from source, about two
minutes with cmake and a C++ compiler). CI sets ``REQUIRE_LLAMA_SERVER=1``: there a missing
build fails instead of skipping.

Sizes: two prompts × ``PER_PROMPT`` generations of 16 tokens per side (about 1,900 tokens) detect a
PIT-law TV of about 0.08 at 90% power, so the test asks to rule out TV 0.1 (``--detect-tv 0.1``);
the README gives the figures at 0.05 and the closing note the full-size runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack

import pytest

from diagnostics.audit.samples import load_samples, write_samples
from diagnostics.cli import main
from diagnostics.models import embedded_gguf_path
from diagnostics.verdicts.served import free_port
from diagnostics.verdicts.servers import llama_cpp_server

# Slow tier: starts llama-cpp-python's servers on the embedded GGUF
pytestmark = pytest.mark.slow

if os.environ.get("REQUIRE_LLAMA_SERVER") != "1":
    pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed (requirements-test.txt)")

PER_PROMPT = 60
PROMPTS = ['1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,', "The cat sat on the mat. The cat sat on the mat. The cat"]


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Generations of both servers, collected at the same time by two ``audit --endpoint`` processes,
    each auditing its own against the local target. One thread per server: on 2 cores the two
    servers then run side by side (two threads in one server made a request 4× slower here)."""
    folder = tmp_path_factory.mktemp("llama")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in PROMPTS))
    jobs, files = {}, {}
    with ExitStack() as servers:
        for speculative, seed in ((True, 0), (False, 100_000)):
            url = servers.enter_context(llama_cpp_server(embedded_gguf_path(), speculative, folder / f"server-{speculative}.log"))
            out = folder / f"{'on' if speculative else 'off'}.jsonl"
            command = [sys.executable, "-m", "diagnostics", "audit", "--endpoint", url, "--model", "smollm2", "--prompts",
                       str(prompts), "--n", str(PER_PROMPT), "--max-tokens", "16", "--temperature", "0.7", "--target", "default",
                       "--detect-tv", "0.1", "--seed", str(seed), "--out", str(out)]
            jobs[speculative] = (out, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                       text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}))
        for speculative, (out, job) in jobs.items():
            stdout, stderr = job.communicate(timeout=600)
            assert job.returncode == 0, stderr[-2000:]
            files[speculative] = (out, json.loads(stdout.strip().splitlines()[-1]))
    return files


def test_both_servers_pass_against_the_local_target(collected) -> None:
    for speculative, (path, result) in collected.items():
        samples = load_samples(path)
        assert len(samples) == len(PROMPTS) * PER_PROMPT
        assert all(sample.raw and sample.ids_source == "retokenized" for sample in samples)  # raw answers kept
        assert all(sample.top_k is None and sample.temperature == 0.7 for sample in samples)
        assert result["design"].startswith("one-sample") and result["source"] == str(path)
        assert result["verdict"] == "pass", (speculative, result["reasons"])
        assert result["prompt_mismatches"] == 0 and result["impossible"] == 0


def test_two_sample_finds_no_difference_between_speculation_on_and_off(collected, capsys) -> None:
    capsys.readouterr()
    assert main(["audit", "--samples", str(collected[True][0]), "--baseline-samples", str(collected[False][0]), "--detect-tv", "0.1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] != "fail", result["reasons"]
    assert result["settings"]["contexts"] > 0


def test_the_servers_text_alone_gets_the_same_verdict(collected, tmp_path, capsys) -> None:
    """The engine's output as many engines' example programs print it, text only (no ids): the
    audit tokenises the text with --target (as the collector did, checking completion_tokens) and
    reaches the same verdict, p-value and token count as the file with ids."""
    path, with_ids = collected[True]
    samples = load_samples(path)
    for sample in samples:
        sample.token_ids, sample.ids_source = [], None
    text_only = write_samples(tmp_path / "text-only.jsonl", samples)
    assert all(not line["token_ids"] and line["text"] is not None for line in map(json.loads, text_only.read_text().splitlines()))
    capsys.readouterr()
    assert main(["audit", "--samples", str(text_only), "--target", "default", "--detect-tv", "0.1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["verdict"], result["tokens"], result["p_value"]) == (with_ids["verdict"], with_ids["tokens"], with_ids["p_value"])
    assert main(["audit", "--samples", str(text_only), "--detect-tv", "0.1"]) == 2  # without --target: refused, saying why
    assert "give --target" in capsys.readouterr().err


def test_a_misdeclared_temperature_from_the_server_fails(collected, tmp_path, capsys) -> None:
    """Generated at 0.7, declared 1.0."""
    samples = load_samples(collected[True][0])
    for sample in samples:
        sample.temperature = 1.0
    path = write_samples(tmp_path / "declared.jsonl", samples)
    capsys.readouterr()
    assert main(["audit", "--samples", str(path), "--target", "default", "--detect-tv", "0.1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "fail", result["reasons"]


def test_an_unreachable_endpoint_is_a_one_line_error(tmp_path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    port = free_port()
    assert main(["audit", "--endpoint", f"http://127.0.0.1:{port}", "--model", "m", "--prompts", str(prompts),
                 "--baseline-endpoint", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "s.jsonl")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "is the server running?" in error, error
