"""llama.cpp's own ``llama-server`` as a verdict-table engine: draft-model speculative decoding
(``-md``) on the embedded SmolLM2-135M-Instruct GGUF, and the same server without a draft as the
speculation-off control.

* The binary is built from the llama.cpp sources that the llama-cpp-python sdist vendors
  (``tools/build-llama-server.sh`` → ``data/llama.cpp/bin/llama-server``; ``$LLAMA_SERVER`` overrides).
* The draft is the target's early exit (its first ``DEFAULT_EARLY_EXIT_LAYER`` layers, final norm
  and head, as the Run page's default drafter), saved as a Hugging Face folder and converted to a
  q8_0 GGUF by the same sources' ``convert_hf_to_gguf.py`` and ``gguf-py`` (copied next to the
  binary by the build script); cached, so it is made once.
* Generations come through the endpoint collector (``verdicts.servers.endpoint_collector``): the
  server's ``/v1/completions`` answers text, ``usage.completion_tokens`` and ``timings`` (with
  ``draft_n`` and ``draft_n_accepted`` when it speculated), no ids, so the collector retokenises.

How llama.cpp speculates (this sdist's ``common/speculative.cpp``, ``common/sampling.cpp`` and
``tools/server/server.cpp``; see ``llama_server_settings``): the draft proposes its top token at each
step (top-k 10, then the most likely; no randomness), stopping early when that token's probability
within those 10 falls below ``draft_p_min``; the target then samples every drafted position with the
request's own sampler chain and seeded RNG, and keeps tokens while its sample equals the draft's,
appending its own sample at the first mismatch (or after the last draft). Every emitted token is a
target sample and each consumes one RNG draw, as without a draft: lossless by construction, at any
temperature and with top-k/top-p/min-p. Seeds do not pair the two servers' outputs, though: with
the same seeds, 7 of 8 16-token generations left the control's path (after 5 to 12 equal tokens in a run of 4),
at the same token whatever the draft (early exit, the target itself) or ``draft_max`` (1 or 4),
so the target's logits evaluated in a batch differ from those evaluated one token at a time enough
to move a sample. The control against itself was identical. Compare laws (the audit), not seeds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LLAMA_DIR = ROOT / "data" / "llama.cpp"
BUILD_HINT = "run tools/build-llama-server.sh (needs cmake and a C++ compiler; about 10-25 min on 2 cores) or set LLAMA_SERVER"
DRAFT_DIR = LLAMA_DIR / "drafts"
DRAFT_OUTTYPE = "q8_0"

# Settings of every llama-server started here (the flags below), and llama.cpp's defaults relied on.
CONTEXT = 512
THREADS = 1  # two servers (speculation on and off) run side by side on 2 cores
PARALLEL = 1
DRAFT_MIN = 0
DRAFT_P_MIN = 0.0  # llama.cpp's default is 0.75: 0 makes every draft as long as draft_max, so speculation is exercised most
START_TIMEOUT_S = 120


def llama_server_settings(draft_max: int | None = 4) -> dict[str, Any]:
    """Every setting of the server as started by ``llama_server`` (``draft_max`` ``None``: no draft,
    the control), with the llama.cpp defaults it relies on and what fixes them (source file)."""
    settings: dict[str, Any] = {
        "engine": "llama.cpp llama-server",
        "context": CONTEXT, "threads": THREADS, "threads_batch": THREADS, "parallel_slots": PARALLEL,
        "request_sampling": "every request, to its own /completion with return_tokens (the ids it generated), states "
                            "temperature, top_k, top_p, min_p, penalties and seed (audit.collect, api llama.cpp)",
        "samplers_default_order": "penalties, dry, top_n_sigma, top_k, typical_p, top_p, min_p, xtc, temperature, then dist "
                                  "(common.h; dry, xtc, typical_p and top_n_sigma are off by default)",
        "seed": "per request: the slot's sampler chain is rebuilt for each request and its dist RNG (mt19937) seeded with it",
        "seed_pairing": "none: speculation changes the target's batch shapes and so its logits' rounding; a seed "
                        "reproduces a server's own output, not the other server's",
        "cache_prompt": True,  # the server's default; speculation needs it (server.cpp can_speculate)
        "speculative": draft_max is not None,
    }
    if draft_max is not None:
        settings |= {
            "draft": f"early exit of the target at layer {default_layer()} (first layers, final norm and head), {DRAFT_OUTTYPE} GGUF",
            "draft_max": draft_max,
            "draft_min": DRAFT_MIN,
            "draft_p_min": DRAFT_P_MIN,
            "draft_p_min_default": 0.75,
            "draft_sampler": "top_k 10 then the most likely token (greedy, no RNG); stops early when its probability "
                             "renormalised over those 10 is below draft_p_min (common/speculative.cpp)",
            "draft_context": f"{CONTEXT} (context / parallel slots, llama.cpp's default for -cd 0)",
            "draft_threads": THREADS,
            "verification": "the target samples each drafted position with the request's chain and RNG and keeps "
                            "tokens while they equal the draft's; its own sample at the first mismatch, or a bonus "
                            "token after a fully accepted draft (common/sampling.cpp sample_and_accept_n)",
            "draft_limit": "min(draft_max, tokens left - 1, context left - 2) per step (server.cpp)",
        }
    return settings


def default_layer() -> int:
    from diagnostics.audit.suite import DEFAULT_EARLY_EXIT_LAYER

    return DEFAULT_EARLY_EXIT_LAYER


def llama_server_binary() -> Path:
    """``$LLAMA_SERVER`` or ``data/llama.cpp/bin/llama-server``; ``RuntimeError`` when it is missing."""
    configured = os.environ.get("LLAMA_SERVER")
    path = Path(configured).expanduser() if configured else LLAMA_DIR / "bin" / "llama-server"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise RuntimeError(f"llama-server is not built ({path} is missing): {BUILD_HINT}")
    return path


def llama_server_version() -> str:
    """``llama.cpp commit … (llama-server --version: …)``: the commit the build script recorded
    (the sdist has no git history, so the binary's own build number reads 0), and the binary's answer."""
    binary = llama_server_binary()
    try:
        answer = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        reported = " ".join((answer.stdout + answer.stderr).split())
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"{binary} --version failed ({error.__class__.__name__}): {BUILD_HINT}") from None
    found = re.search(r"version: (\d+) \(([0-9a-f]+)\)", reported)
    recorded = binary.parent.parent / "VERSION"
    commit = None
    if recorded.is_file():
        match = re.search(r"llama\.cpp commit ([0-9a-f]+)", recorded.read_text(encoding="utf-8", errors="replace"))
        commit = match.group(1)[:9] if match else None
    if found and found.group(1) != "0":
        return f"llama.cpp b{found.group(1)} (commit {found.group(2)})"
    commit = commit or (found.group(2) if found else "unknown")
    return f"llama.cpp commit {commit} (llama-server --version: {reported[:120] or 'nothing'})"


def converter_dir() -> Path:
    """The llama.cpp sources' converter (``convert_hf_to_gguf.py`` and ``gguf-py``), copied by the build
    script next to the binary (``$LLAMA_CPP_CONVERT`` overrides: a vendor/llama.cpp folder)."""
    configured = os.environ.get("LLAMA_CPP_CONVERT")
    folder = Path(configured).expanduser() if configured else LLAMA_DIR / "convert"
    if not (folder / "convert_hf_to_gguf.py").is_file() or not (folder / "gguf-py" / "gguf").is_dir():
        raise RuntimeError(f"no llama.cpp converter at {folder} (convert_hf_to_gguf.py and gguf-py): {BUILD_HINT}")
    return folder


# The converter imports mistral_common at the top (for Mistral-format models only) and sentencepiece
# before it looks for a tokenizer.model: neither is needed for SmolLM2's BPE tokenizer, so where they
# are not installed they are stubbed (the converter then finds no tokenizer.model and falls back to
# the BPE path). transformers is imported first, so its own availability checks see the truth.
# transformers 5 nests rope_theta in rope_parameters, and the converter (of the transformers 4 era)
# reads hparams["rope_theta"] only: without it the GGUF has no rope base and llama.cpp assumes
# 10000 (SmolLM2's is 100000), so the configs it loads get the flat key back.
_CONVERT_BOOTSTRAP = r"""
import importlib.util, runpy, sys, types
import transformers
from transformers import AutoConfig, AutoTokenizer
missing = {top for top in ("mistral_common", "sentencepiece") if importlib.util.find_spec(top) is None}
load_config = transformers.AutoConfig.from_pretrained
def flat_rope_config(*args, **kwargs):
    config = load_config(*args, **kwargs)
    nested = config.to_dict
    def to_dict():
        values = nested()
        rope = values.get("rope_parameters")
        if "rope_theta" not in values and isinstance(rope, dict) and "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        return values
    config.to_dict = to_dict
    return config
transformers.AutoConfig.from_pretrained = flat_rope_config
def stub(name, **attributes):
    if name.split(".")[0] not in missing:
        return
    for depth in range(1, name.count(".") + 2):
        sys.modules.setdefault(".".join(name.split(".")[:depth]), types.ModuleType(".".join(name.split(".")[:depth])))
    for key, value in attributes.items():
        setattr(sys.modules[name], key, value)
stub("mistral_common.tokens.tokenizers.base", TokenizerVersion=None)
stub("mistral_common.tokens.tokenizers.multimodal", DATASET_MEAN=None, DATASET_STD=None)
stub("mistral_common.tokens.tokenizers.tekken", Tekkenizer=type("Tekkenizer", (), {}))
stub("mistral_common.tokens.tokenizers.sentencepiece", SentencePieceTokenizer=type("SentencePieceTokenizer", (), {}))
stub("sentencepiece", SentencePieceProcessor=type("SentencePieceProcessor", (), {}))
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def _save_early_exit(layer: int, folder: Path) -> None:
    """The embedded target's first ``layer`` layers, final norm and head as a standalone HF folder
    (only those layers' weights: the early-exit shell shares the target's full layer list) with the
    target's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from diagnostics.models import early_exit_model, load_model

    target = load_model("default", device="cpu")
    draft = early_exit_model(target, layer)
    model = AutoModelForCausalLM.from_config(draft.model.config, dtype=torch.float32)
    kept = {name: tensor for name, tensor in target.model.state_dict().items()
            if not (match := re.match(r"model\.layers\.(\d+)\.", name)) or int(match.group(1)) < layer}
    model.load_state_dict(kept, strict=True)
    model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    rope = getattr(draft.model.config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise RuntimeError(f"the target's rope {rope} is not plain: the converter reads only rope_theta")


def draft_gguf(layer: int | None = None, out_dir: Path = DRAFT_DIR) -> Path:
    """The embedded target's early exit at ``layer`` (default ``DEFAULT_EARLY_EXIT_LAYER``) as a
    ``q8_0`` GGUF in ``out_dir``, made once (about a minute) and reused; ``RuntimeError`` naming the
    converter's log when the conversion fails."""
    layer = default_layer() if layer is None else layer
    out_dir = Path(out_dir)
    out = out_dir / f"smollm2-135m-instruct-early-exit-{layer}.{DRAFT_OUTTYPE}.gguf"
    if out.is_file():
        return out
    convert = converter_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".convert.log")
    with tempfile.TemporaryDirectory(dir=out_dir) as scratch:
        folder = Path(scratch) / "hf"
        _save_early_exit(layer, folder)
        partial = Path(scratch) / out.name
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(convert / "gguf-py"), os.environ.get("PYTHONPATH", "")]),
               "NO_LOCAL_GGUF": "1", "TQDM_DISABLE": "1"}
        command = [sys.executable, "-c", _CONVERT_BOOTSTRAP, str(convert / "convert_hf_to_gguf.py"), str(folder),
                   "--outfile", str(partial), "--outtype", DRAFT_OUTTYPE]
        with log.open("w") as output:
            finished = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        if finished.returncode != 0 or not partial.is_file():
            raise RuntimeError(f"converting the early-exit draft to GGUF failed (status {finished.returncode}); its log: {log}")
        shutil.move(partial, out)
    return out


@contextmanager
def llama_server(gguf: Path, draft: Path | None, log: Path, draft_max: int = 4) -> Iterator[str]:
    """``llama-server`` on ``gguf`` at 127.0.0.1 (``llama_server_flags``): with ``draft``, draft-model
    speculation of at most ``draft_max`` tokens a step; without, the speculation-off control. Yields
    its URL once ``/health`` answers (the model loaded), stops it after."""
    from diagnostics.verdicts.served import served

    binary = llama_server_binary()
    with served(lambda port: [str(binary), *llama_server_flags(gguf, draft, port, draft_max)], log, "llama-server",
                ready_path="/health", timeout_s=START_TIMEOUT_S) as url:
        yield url


def llama_server_flags(gguf: Path, draft: Path | None, port: int, draft_max: int = 4) -> list[str]:
    """The command-line flags ``llama_server`` starts the binary with."""
    flags = ["-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(CONTEXT), "-np", str(PARALLEL),
             "-t", str(THREADS), "-tb", str(THREADS), "--no-webui"]
    if draft is not None:
        flags += ["-md", str(draft), "--draft-max", str(draft_max), "--draft-min", str(DRAFT_MIN),
                  "--draft-p-min", str(DRAFT_P_MIN), "-td", str(THREADS), "-tbd", str(THREADS)]
    return flags


__all__ = ["draft_gguf", "llama_server", "llama_server_binary", "llama_server_flags", "llama_server_settings",
           "llama_server_version"]
