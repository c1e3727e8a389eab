"""Draft heads on disk: build one with random weights for any target (``make_head``) and load one
(``load_head``) from the published layout.

* EAGLE-3: ``config.json`` (``architectures: ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``,
  ``target_hidden_size``, ``eagle_config.eagle_aux_hidden_state_layer_ids``) and
  ``model.safetensors`` or ``pytorch_model.bin`` with ``fc``, ``midlayer.*``, ``norm``,
  ``lm_head``, ``d2t`` and ``t2d``.
* Medusa: ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``; ``hidden_size`` and
  ``vocab_size`` when given, else read off the weights) and ``medusa_lm_head.safetensors`` or
  ``medusa_lm_head.pt``; or vLLM's layout (``num_heads``, ``num_hidden_layers``; ``blocks.*``,
  ``lm_heads.*`` in ``model.safetensors`` or ``pytorch_model.bin``).

A head is untrusted input like any checkpoint: tensors only (``weights_only``), every shape checked
against the target, one-line errors that say what does not fit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diagnostics.heads.eagle3 import ARCHITECTURE, Eagle3Config, Eagle3Head, default_taps
from diagnostics.heads.medusa import MedusaConfig, MedusaHeads, read_medusa
from diagnostics.models import LoadedModel, ModelError

KINDS = ("eagle3", "medusa")
MAX_CONFIG_BYTES = 1 << 20


@dataclass
class LoadedHead:
    """A head ready to draft for a target: its module, kind, the target boundaries it reads, and a name."""

    kind: str
    module: Any
    taps: tuple[int, ...]  # the boundaries the head was made to read (its config)
    name: str
    planted: str | None = None  # audits only: an integration bug of the engine (``head_drafting.PLANTED``)

    @property
    def engine_taps(self) -> tuple[int, ...]:
        """The boundaries the engine taps: the head's own, or one later for the planted ``wrong_taps``
        (reading a layer's output where its input was meant: the two conventions engines confused)."""
        if self.planted == "wrong_taps":
            return tuple(tap + 1 if tap < self.module_layers else tap - 1 for tap in self.taps)
        return self.taps

    module_layers: int = 0  # the target's layer count (the largest boundary)


def _text_config(target: LoadedModel) -> Any:
    config = target.model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


INITS = ("random", "target")


def make_head(kind: str, target: LoadedModel, out: str | Path, *, seed: int = 0, medusa_heads: int = 4,
              medusa_layers: int = 1, draft_vocab: int | None = None, scale: float = 0.02, init: str = "random") -> Path:
    """Write a head for ``target`` to ``out``, in the layout ``load_head`` reads.

    ``init="random"``: normal weights of std ``scale`` (norms 1, biases 0). ``init="target"``
    (Medusa only): where Medusa's training starts, every residual block the identity
    (``W = 0, b = 0``: ``x + SiLU(0) = x``) and every head a copy of the target's ``lm_head``, so
    head ``k`` drafts with the target's own next-token law. EAGLE-3's draft vocabulary is the
    target's first ``draft_vocab`` ids (all of them by default); its taps are written explicitly."""
    if kind not in KINDS:
        raise ModelError(f"unknown head kind {kind!r}: use eagle3 or medusa")
    if init not in INITS:
        raise ModelError(f"unknown head init {init!r}: use random or target")
    if init == "target" and kind != "medusa":
        raise ModelError("--init target copies the target's lm_head into Medusa heads; an EAGLE-3 head has no such "
                         "starting point: use --init random")
    config = _text_config(target)
    hidden, vocab = int(config.hidden_size), int(target.vocab_size)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out} exists and is not empty: give a new folder (a head is never written over another)")
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    if kind == "medusa":
        head_config = MedusaConfig(medusa_heads, medusa_layers, hidden, vocab)
        with torch.device("cpu"):  # a file's weights: drawn and written on the host
            module = MedusaHeads(head_config)
        state = {key: _random(value, key, generator, scale) for key, value in module.published_state().items()}
        if init == "target":
            state = _medusa_from_target(state, target, medusa_layers)
        _save(state, out / "medusa_lm_head.safetensors")
    else:
        size = vocab if draft_vocab is None else int(draft_vocab)
        if not 1 <= size <= vocab:
            raise ModelError(f"the draft vocabulary must hold 1 to {vocab} ids, got {size}")
        heads = int(config.num_attention_heads)
        head_config = Eagle3Config(
            hidden_size=hidden, num_attention_heads=heads,
            num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            intermediate_size=int(config.intermediate_size), vocab_size=vocab, draft_vocab_size=size,
            target_hidden_size=hidden, rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            rope_theta=float(getattr(config, "rope_theta", None) or 10000.0),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            aux_layer_ids=list(default_taps(int(config.num_hidden_layers))))
        with torch.device("cpu"):
            module = Eagle3Head(head_config)
        state = {key: _random(value, key, generator, scale) for key, value in module.state_dict().items()
                 if key not in ("d2t", "t2d")}
        chosen = torch.arange(size, device="cpu")  # a file's tensors: on the host
        state["d2t"] = chosen - torch.arange(size, device="cpu")  # target id = i + d2t[i]
        t2d = torch.zeros(vocab, dtype=torch.bool, device="cpu")
        t2d[chosen] = True
        state["t2d"] = t2d
        _save(state, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({**head_config.to_json(), "made_by": "diagnostics make-head",
                                                 "target": target.name, "seed": seed, "init": init}, indent=2))
    return out


def _medusa_from_target(state: dict[str, torch.Tensor], target: LoadedModel, layers: int) -> dict[str, torch.Tensor]:
    """Medusa's starting point: residual blocks zero (the identity), each head the target's ``lm_head``."""
    head = target.model.get_output_embeddings()
    vocab = int(target.vocab_size)
    if head is None or head.weight.shape[0] < vocab or getattr(head, "bias", None) is not None:
        raise ModelError(f"{target.name} has no plain lm_head over its {vocab} ids to copy: use --init random")
    weight = head.weight.detach()[:vocab].float().cpu()
    return {key: weight.clone() if key.endswith(f".{layers}.weight") else torch.zeros_like(value)
            for key, value in state.items()}


def _random(value: torch.Tensor, key: str, generator: torch.Generator, scale: float) -> torch.Tensor:
    if key.endswith("norm.weight"):
        return torch.ones_like(value)
    if key.endswith("bias"):
        return torch.zeros_like(value)
    return torch.randn(value.shape, generator=generator, device=generator.device) * scale


def _save(state: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({key: value.contiguous() for key, value in state.items()}, str(path))


def _folder(path_or_id: str, local_only: bool = False) -> Path:
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    if local_only:
        raise ModelError(f"the head {path_or_id!r} is not a folder on this machine (it is never fetched for a stored run)")
    if path.exists() or path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") != 1:
        raise ModelError(f"no head folder at {path_or_id!r}: give a folder with config.json and weights, or a hub id "
                         "(owner/name); make one with python -m diagnostics make-head")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path_or_id, allow_patterns=["*.json", "*.safetensors", "*.bin", "*.pt"]))
    except Exception as error:  # noqa: BLE001 - any hub failure is one line for the user
        raise ModelError(f"cannot fetch the head {path_or_id!r} from the hub ({error.__class__.__name__}): "
                         "check the id and the network, or give a local folder") from None


def _weights(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - a corrupt file is one line
            raise ModelError(f"cannot read {path} ({error.__class__.__name__}): the file is not a checkpoint") from None
        if not isinstance(state, dict):
            raise ModelError(f"{path} holds no state dict")
        return state
    raise ModelError(f"{folder} has none of {', '.join(names)}: not a head folder")


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelError(f"{folder} has no config.json (or one over 1 MiB): not a head folder")
    try:
        raw = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError(f"{path} is not JSON") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path} is not a JSON object")
    return raw


def load_head(kind: str, path_or_id: str, target: LoadedModel, local_only: bool = False) -> LoadedHead:
    """The head ``kind`` at ``path_or_id`` (a folder or hub id; ``local_only``: a folder only),
    checked against ``target``, on its device and dtype."""
    if kind not in KINDS:
        raise ModelError(f"unknown head kind {kind!r}: use eagle3 or medusa")
    folder = _folder(path_or_id, local_only)
    raw = _config(folder)
    config = _text_config(target)
    layers, hidden, vocab = int(config.num_hidden_layers), int(config.hidden_size), int(target.vocab_size)
    try:
        if kind == "medusa":
            state = _weights(folder, ["medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors", "pytorch_model.bin"])
            head_config, state = read_medusa(raw, state)
            with torch.device("cpu"):  # built where the file's weights are read, then moved to the target's device
                module: Any = MedusaHeads(head_config)
            _fits("hidden_size", head_config.hidden_size, hidden)
            _fits("vocab_size", head_config.vocab_size, vocab)
            module.load_published(state)
            taps: tuple[int, ...] = (layers,)
        else:
            if ARCHITECTURE not in (raw.get("architectures") or []):
                raise ModelError(f"{folder}/config.json does not declare {ARCHITECTURE}: not an EAGLE-3 head")
            if int(raw.get("num_hidden_layers", 1) or 1) != 1:
                raise ModelError(f"{folder}/config.json has num_hidden_layers {raw.get('num_hidden_layers')}: this lab reads "
                                 "EAGLE-3 heads of one decoder layer (midlayer), as the EAGLE authors publish them")
            head_config = Eagle3Config.from_json(raw)
            _fits("target_hidden_size", head_config.target_hidden_size, hidden)
            _fits("vocab_size", head_config.vocab_size, vocab)
            with torch.device("cpu"):  # built where the file's weights are read, then moved to the target's device
                module = Eagle3Head(head_config)
            state = _weights(folder, ["model.safetensors", "pytorch_model.bin"])
            state = {key: value for key, value in state.items() if not key.startswith("embed_tokens")}
            module.load_state_dict(state, strict=True)
            _check_vocab_map(module, vocab)
            taps = tuple(head_config.aux_layer_ids or default_taps(layers))
            if len(taps) != 3 or not all(0 <= tap <= layers for tap in taps):
                raise ModelError(f"eagle_aux_hidden_state_layer_ids {list(taps)} must be 3 boundaries in [0, {layers}] "
                                 f"for this {layers}-layer target")
    except (KeyError, ValueError, TypeError) as error:
        if isinstance(error, ModelError):
            raise
        message = str(error).splitlines()[0][:300] if str(error) else error.__class__.__name__
        raise ModelError(f"the {kind} head at {path_or_id} does not fit this target: {message}") from None
    dtype = next(target.model.parameters()).dtype
    module = module.to(device=target.device, dtype=dtype).eval()
    if kind == "eagle3":
        module.d2t = module.d2t.to(torch.long)
    return LoadedHead(kind, module, taps, f"{kind}:{path_or_id}", module_layers=layers)


def _fits(name: str, head: int, target: int) -> None:
    if head != target:
        raise ModelError(f"the head's {name} is {head} but the target's is {target}: this head was made for another target")


def _check_vocab_map(module: Eagle3Head, vocab: int) -> None:
    ids = torch.arange(module.config.draft_vocab_size, device=module.d2t.device) + module.d2t.to(torch.long)
    if bool((ids < 0).any()) or bool((ids >= vocab).any()):
        raise ModelError("the head's d2t maps draft ids outside the target's vocabulary")
    if len(set(ids.tolist())) != len(ids) or not bool(module.t2d[ids].all()) or int(module.t2d.sum()) != len(ids):
        raise ModelError("the head's d2t and t2d disagree: t2d must mark exactly the target ids i + d2t[i]")


__all__ = ["KINDS", "LoadedHead", "load_head", "make_head"]
