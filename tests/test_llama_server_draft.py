"""llama.cpp's own llama-server with a draft model (``-md``), the verdict table's draft-model engine:
started on the embedded GGUF with the early-exit draft, a few seeded generations collected through
the endpoint collector from its own ``/completion`` (the ids it generated), and the server's timings
show it drafted (the control without a draft did not).

It needs the binary (``tools/build-llama-server.sh``, about 11 min on 2 cores): skipped without it,
failed instead where ``REQUIRE_LLAMA_SERVER_DRAFT=1``. The draft GGUF is made once (about a minute,
``draft_gguf``) and cached; until it is, the target GGUF drafts for itself, so the test stays short.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diagnostics.verdicts.llama_server import (DRAFT_DIR, default_layer, llama_server, llama_server_binary, llama_server_flags,
                                               llama_server_settings)

# Slow tier: starts llama.cpp's llama-server (where built) on the embedded GGUF
pytestmark = pytest.mark.slow

N, MAX_TOKENS, DRAFT_MAX = 4, 16, 4


def _binary() -> Path:
    try:
        return llama_server_binary()
    except RuntimeError as error:
        if os.environ.get("REQUIRE_LLAMA_SERVER_DRAFT") == "1":
            pytest.fail(str(error))
        pytest.skip(str(error))


def _collect(url: str, tmp_path: Path, speculative: bool) -> list:
    from diagnostics.audit.collect import collect
    from diagnostics.audit.completions import Sampling
    from diagnostics.audit.samples import load_samples
    from diagnostics.models import embedded_tokenizer

    tokenizer = embedded_tokenizer()
    out = tmp_path / f"{'on' if speculative else 'off'}.jsonl"
    collect(url, "smollm2", ["Once upon a time"], out, n=N, sampling=Sampling(max_tokens=MAX_TOKENS, temperature=1.0),
            first_seed=0, speculative=speculative, tokenize=lambda text: tokenizer(text)["input_ids"],
            eos_id=tokenizer.eos_token_id, api="llama.cpp")
    return load_samples(out)


def test_llama_server_drafts_and_the_control_does_not(tmp_path: Path) -> None:
    from diagnostics.models import embedded_gguf_path

    _binary()
    target = embedded_gguf_path()
    cached = sorted(DRAFT_DIR.glob(f"*early-exit-{default_layer()}.*.gguf"))
    draft = cached[0] if cached else target
    drafted = {}
    for speculative in (True, False):
        with llama_server(target, draft if speculative else None, tmp_path / f"server-{speculative}.log", DRAFT_MAX) as url:
            samples = _collect(url, tmp_path, speculative)
        assert len(samples) == N and [sample.seed for sample in samples] == list(range(N))
        for sample in samples:
            assert sample.token_ids and sample.completion_tokens is not None and 1 <= sample.completion_tokens <= MAX_TOKENS
            assert sample.speculative is speculative and sample.ids_source == "engine"  # the server's own ids
        drafted[speculative] = sum(int(sample.raw.get("timings", {}).get("draft_n", 0)) for sample in samples)
    assert drafted[True] > 0, "llama-server never drafted: is -md loaded? (see server-True.log)"
    assert drafted[False] == 0


def test_flags_state_the_draft_settings() -> None:
    flags = llama_server_flags(Path("t.gguf"), Path("d.gguf"), 8080, draft_max=3)
    assert flags[flags.index("-md") + 1] == "d.gguf" and flags[flags.index("--draft-max") + 1] == "3"
    assert flags[flags.index("--draft-p-min") + 1] == "0.0" and flags[flags.index("-t") + 1] == "1"
    assert "-md" not in llama_server_flags(Path("t.gguf"), None, 8080)
    settings = llama_server_settings(3)
    assert settings["draft_max"] == 3 and settings["draft_p_min"] == 0.0 and not llama_server_settings(None)["speculative"]


def test_a_missing_binary_says_how_to_build_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLAMA_SERVER", str(tmp_path / "nope"))
    with pytest.raises(RuntimeError, match="tools/build-llama-server.sh"):
        llama_server_binary()
