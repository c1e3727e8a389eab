"""Draft heads on disk: build one with random weights for any target (``make_head``) and load one
(``load_head``) from the published layout.

* EAGLE-3: ``config.json`` (``architectures: ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``,
  ``target_hidden_size``, ``eagle_config.eagle_aux_hidden_state_layer_ids``) and
  ``model.safetensors`` with ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t`` and ``t2d``.
* Medusa: ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``; ``hidden_size`` and
  ``vocab_size`` when given, which must be the target's) and ``medusa_lm_head.safetensors``; or
  vLLM's layout (``num_heads``, ``num_hidden_layers``; ``blocks.*``, ``lm_heads.*`` in ``model.safetensors``).

A head is untrusted input like any checkpoint: safetensors, or a published pickled ``.pt``/``.bin``
through torch's weights-only unpickler (which runs no code a file names), the config's fields and the file's tensor names, shapes and dtypes
checked against the target before anything is allocated (``diagnostics.heads.bounds``), one-line
errors that say what does not fit.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diagnostics.heads.bounds import (MAX_CONFIG_BYTES, MAX_MEDUSA_HEADS, MAX_MEDUSA_LAYERS, PICKLES, Slot, check_memory,
                                      check_tensors, header, is_pickled, load_pickled, read_config, read_tensors, slots_of,
                                      weights_file)
from diagnostics.heads.eagle3 import Eagle3Config, Eagle3Head, default_taps
from diagnostics.heads.medusa import (MedusaConfig, MedusaHeads, canonical_medusa_key, medusa_config, medusa_ignored,
                                      medusa_slots)
from diagnostics.models import LoadedModel, ModelError

KINDS = ("eagle3", "medusa")
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit seed


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


def check_medusa_shape(heads: int, layers: int) -> None:
    """Medusa's head and block counts within ``MAX_MEDUSA_HEADS`` and ``MAX_MEDUSA_LAYERS`` (checked before anything is built)."""
    for name, value, low, high in (("--heads", heads, 1, MAX_MEDUSA_HEADS), ("--layers", layers, 0, MAX_MEDUSA_LAYERS)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ModelError(f"Medusa {name} must be a whole number from {low} to {high}, got {value!r}")


def check_output(out: Path) -> None:
    """``out`` must be a new folder or an empty existing one, never a link or a file (nothing is written here)."""
    if out.is_symlink():
        raise ModelError(f"{out} is a symbolic link: give a new folder (a head is never written through a link)")
    if out.exists() and not out.is_dir():
        raise ModelError(f"{out} exists and is not a folder: give a new folder for the head")
    if out.is_dir() and any(out.iterdir()):
        raise ModelError(f"{out} exists and is not empty: give a new folder (a head is never written over another)")
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ModelError(f"{parent} is not a folder: give -o a path inside a folder")
            break


def make_head(kind: str, target: LoadedModel, out: str | Path, *, seed: int = 0, medusa_heads: int = 4,
              medusa_layers: int = 1, draft_vocab: int | None = None, scale: float = 0.02, init: str = "random") -> Path:
    """Write a head for ``target`` to ``out`` (a new or empty folder), in the layout ``load_head`` reads.

    ``init="random"``: normal weights of std ``scale`` (norms 1, biases 0). ``init="target"``
    (Medusa only): where Medusa's training starts, every residual block the identity
    (``W = 0, b = 0``: ``x + SiLU(0) = x``) and every head a copy of the target's ``lm_head``, so
    head ``k`` drafts with the target's own next-token law. EAGLE-3's draft vocabulary is the
    target's first ``draft_vocab`` ids (all of them by default); its taps are written explicitly.
    Every argument is checked before anything is built, and the files are written to a hidden
    sibling folder renamed to ``out`` at the end, so a refusal or a failure leaves nothing behind."""
    if kind not in KINDS:
        raise ModelError(f"unknown head kind {kind!r}: use eagle3 or medusa")
    if init not in INITS:
        raise ModelError(f"unknown head init {init!r}: use random or target")
    if init == "target" and kind != "medusa":
        raise ModelError("--init target copies the target's lm_head into Medusa heads; an EAGLE-3 head has no such "
                         "starting point: use --init random")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ModelError(f"the seed must be a whole number from 0 to 2^63 - 1, got {seed!r}")
    out = Path(out)
    check_output(out)
    if kind == "medusa":
        check_medusa_shape(medusa_heads, medusa_layers)
        head_config: Any = MedusaConfig(medusa_heads, medusa_layers, *_sizes(target)[:2])
        state = _medusa_state(head_config, target, seed, scale, init)
        name = "medusa_lm_head.safetensors"
    else:
        head_config = _eagle3_config(target, draft_vocab)
        state, name = _eagle3_state(head_config, seed, scale), "model.safetensors"
    config = {**head_config.to_json(), "made_by": "diagnostics make-head", "target": target.name, "seed": seed, "init": init}
    _write(out, {name: state}, json.dumps(config, indent=2))
    return out


def _sizes(target: LoadedModel) -> tuple[int, int, int]:
    """The target's hidden size, vocabulary size and layer count."""
    config = _text_config(target)
    return int(config.hidden_size), int(target.vocab_size), int(config.num_hidden_layers)


def _medusa_state(config: MedusaConfig, target: LoadedModel, seed: int, scale: float, init: str) -> dict[str, torch.Tensor]:
    """Medusa's weights under their published names, drawn (or copied from the target) on the host."""
    slots = _published_slots("medusa", config)  # shapes only, checked against the memory bound before drawing
    check_memory(slots, "the Medusa heads asked for")
    generator = torch.Generator().manual_seed(seed)
    state = {slot.file_key: _random(slot.shape, slot.file_key, generator, scale) for slot in slots}
    if init == "target":
        state = _medusa_from_target(state, target, config.medusa_num_layers)
    return state


def _eagle3_config(target: LoadedModel, draft_vocab: int | None) -> Eagle3Config:
    """An EAGLE-3 config for ``target``: its sizes, a draft vocabulary of its first ``draft_vocab`` ids."""
    config = _text_config(target)
    hidden, vocab, layers = _sizes(target)
    size = vocab if draft_vocab is None else draft_vocab
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= vocab:
        raise ModelError(f"the draft vocabulary must hold 1 to {vocab} ids, got {size!r}")
    heads = int(config.num_attention_heads)
    return Eagle3Config(
        hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        intermediate_size=int(config.intermediate_size), vocab_size=vocab, draft_vocab_size=size,
        target_hidden_size=hidden, rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        rope_theta=float(getattr(config, "rope_theta", None) or 10000.0),
        head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
        aux_layer_ids=list(default_taps(layers)))


def _eagle3_state(config: Eagle3Config, seed: int, scale: float) -> dict[str, torch.Tensor]:
    """EAGLE-3's weights under their published names, drawn on the host; ``d2t``/``t2d`` map draft id
    ``i`` to ``i``. A head over the target's whole vocabulary has no map in its file (the map is the
    identity), as vLLM reads it: vLLM makes its ``draft_id_to_target_id`` only for a smaller draft
    vocabulary and refuses a file that carries one otherwise."""
    slots = _published_slots("eagle3", config)
    check_memory(slots, "the EAGLE-3 head asked for")
    generator = torch.Generator().manual_seed(seed)
    state = {slot.file_key: _random(slot.shape, slot.file_key, generator, scale) for slot in slots
             if slot.file_key not in VOCAB_MAP_KINDS}
    if config.draft_vocab_size == config.vocab_size:
        return state
    chosen = torch.arange(config.draft_vocab_size, device="cpu")  # a file's tensors: on the host
    state["d2t"] = chosen - torch.arange(config.draft_vocab_size, device="cpu")  # target id = i + d2t[i]
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool, device="cpu")
    t2d[chosen] = True
    state["t2d"] = t2d
    return state


def _write(out: Path, weights: dict[str, dict[str, torch.Tensor]], config: str) -> None:
    """Write the files into a hidden sibling folder, then rename it to ``out`` (a new or empty folder);
    on any failure the sibling is removed and ``out`` is as it was."""
    from safetensors.torch import save_file

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:12]}"
        staging.mkdir()
    except OSError as error:
        raise ModelError(f"cannot create a folder next to {out} ({error.strerror or error.__class__.__name__}): "
                         "give -o a path in a writable folder") from None
    try:
        (staging / "config.json").write_text(config)
        # safetensors creates its files 0600; give them the mode any new file gets here (the
        # config's, from the umask), so a head shared on a machine reads like its config.
        mode = (staging / "config.json").stat().st_mode & 0o777
        for name, state in weights.items():
            save_file({key: value.contiguous() for key, value in state.items()}, str(staging / name))
            os.chmod(staging / name, mode)
        os.replace(staging, out)  # atomic; replaces ``out`` only when it is an empty folder
    except OSError as error:
        raise ModelError(f"cannot write the head to {out} ({error.strerror or error.__class__.__name__}): "
                         "give a new folder on a writable disk with room for it") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _medusa_from_target(state: dict[str, torch.Tensor], target: LoadedModel, layers: int) -> dict[str, torch.Tensor]:
    """Medusa's starting point: residual blocks zero (the identity), each head the target's ``lm_head``."""
    head = target.model.get_output_embeddings()
    vocab = int(target.vocab_size)
    if head is None or head.weight.shape[0] < vocab or getattr(head, "bias", None) is not None:
        raise ModelError(f"{target.name} has no plain lm_head over its {vocab} ids to copy: use --init random")
    weight = head.weight.detach()[:vocab].float().cpu()
    return {key: weight.clone() if key.endswith(f".{layers}.weight") else torch.zeros_like(value)
            for key, value in state.items()}


def _random(shape: tuple[int, ...], key: str, generator: torch.Generator, scale: float) -> torch.Tensor:
    if key.endswith("norm.weight"):
        return torch.ones(shape, device="cpu")
    if key.endswith("bias"):
        return torch.zeros(shape, device="cpu")
    return torch.randn(shape, generator=generator, device=generator.device) * scale


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

        return Path(snapshot_download(path_or_id, allow_patterns=["*.json", "*.safetensors", *PICKLES]))
    except Exception as error:  # noqa: BLE001 - any hub failure is one line for the user
        raise ModelError(f"cannot fetch the head {path_or_id!r} from the hub ({error.__class__.__name__}): "
                         "check the id and the network, or give a local folder") from None


def load_head(kind: str, path_or_id: str, target: LoadedModel, local_only: bool = False) -> LoadedHead:
    """The head ``kind`` at ``path_or_id`` (a folder or hub id; ``local_only``: a folder only),
    checked against ``target``, on its device and dtype.

    Nothing is allocated before the config's every field and the weights file's every tensor name,
    shape and dtype have been checked against the target (``diagnostics.heads.bounds``); the module
    is built on the meta device and takes the file's tensors as they are read (no second copy)."""
    if kind not in KINDS:
        raise ModelError(f"unknown head kind {kind!r}: use eagle3 or medusa")
    folder = _folder(path_or_id, local_only)
    raw, where = read_config(folder), str(folder / "config.json")
    hidden, vocab, layers = _sizes(target)
    if kind == "medusa":
        head_config: Any
        head_config, shared = medusa_config(raw, where, hidden, vocab)
        taps: tuple[int, ...] = (layers,)
    else:
        head_config = Eagle3Config.from_json(raw, where, hidden, vocab, layers)
        taps = tuple(head_config.aux_layer_ids or default_taps(layers))
    published = _published_slots(kind, head_config)
    check_memory(published, f"the {kind} head at {path_or_id}")  # from the config alone: nothing opened yet
    if kind == "medusa":
        path = weights_file(folder, ["medusa_lm_head.safetensors", "model.safetensors", "medusa_lm_head.pt", "pytorch_model.bin"])
        pickled = load_pickled(path) if is_pickled(path) else None
        tensors = header(path, canonical_medusa_key, pickled)
        slots, ignored = medusa_slots(head_config, set(tensors), shared), medusa_ignored(head_config, shared)
    else:
        path = weights_file(folder, ["model.safetensors", "pytorch_model.bin"])
        pickled = load_pickled(path) if is_pickled(path) else None
        tensors, slots, ignored = header(path, pickled=pickled), published, ("embed_tokens.weight",)  # embeddings come from the target
        slots = _vocab_map_optional(head_config, tensors, slots)
    check_tensors(path, tensors, slots, ignored)
    state = read_tensors(path, tensors, slots, pickled)
    if kind == "eagle3" and "t2d" not in tensors:  # a whole-vocabulary head without its map: the identity
        state["t2d"] = torch.ones(head_config.vocab_size, dtype=torch.bool, device="cpu")
        state["d2t"] = torch.zeros(head_config.draft_vocab_size, dtype=torch.long, device="cpu")
    module = _assembled(kind, head_config, state)
    if kind == "eagle3":
        _check_vocab_map(module, vocab)
    dtype = next(target.model.parameters()).dtype
    module = module.to(device=target.device, dtype=dtype).eval()
    if kind == "eagle3":
        module.d2t = module.d2t.to(torch.long)
    return LoadedHead(kind, module, taps, f"{kind}:{path_or_id}", module_layers=layers)


VOCAB_MAP_KINDS = {"d2t": "int", "t2d": "bool"}  # EAGLE-3's vocabulary map: integer offsets and a mask


def _published_slots(kind: str, config: Any) -> list[Slot]:
    """The tensors of the head ``config`` describes, under their published names (shapes from a meta-device module):
    the one list a made head is drawn from and a loaded head's file is checked against."""
    with torch.device("meta"):  # shapes only: nothing is allocated
        if kind == "medusa":
            return slots_of(MedusaHeads(config), lambda key: key.removeprefix("heads."))
        return [Slot(slot.module_key, slot.file_key, slot.shape, VOCAB_MAP_KINDS.get(slot.module_key, "float"))
                for slot in slots_of(Eagle3Head(config))]


def _assembled(kind: str, config: Any, state: dict[str, torch.Tensor]) -> Any:
    """The module of ``config`` built on the meta device, its tensors the checked ``state``."""
    with torch.device("meta"):
        module = MedusaHeads(config) if kind == "medusa" else Eagle3Head(config)
    module.load_state_dict(state, strict=True, assign=True)
    return module


def _vocab_map_optional(config: Eagle3Config, tensors: dict[str, Any], slots: list[Slot]) -> list[Slot]:
    """``slots`` with ``d2t`` and ``t2d`` optional when the head drafts over the target's whole
    vocabulary and its file carries neither (vLLM's layout for such a head); a file with only one
    of the two is still refused, and a smaller draft vocabulary still needs both."""
    if config.draft_vocab_size != config.vocab_size or any(key in tensors for key in VOCAB_MAP_KINDS):
        return slots
    return [Slot(slot.module_key, slot.file_key, slot.shape, slot.kind, optional=True) if slot.file_key in VOCAB_MAP_KINDS
            else slot for slot in slots]


def _check_vocab_map(module: Eagle3Head, vocab: int) -> None:
    ids = torch.arange(module.config.draft_vocab_size, device=module.d2t.device) + module.d2t.to(torch.long)
    if bool((ids < 0).any()) or bool((ids >= vocab).any()):
        raise ModelError("the head's d2t maps draft ids outside the target's vocabulary")
    if len(set(ids.tolist())) != len(ids) or not bool(module.t2d[ids].all()) or int(module.t2d.sum()) != len(ids):
        raise ModelError("the head's d2t and t2d disagree: t2d must mark exactly the target ids i + d2t[i]")


__all__ = ["KINDS", "LoadedHead", "MAX_CONFIG_BYTES", "check_medusa_shape", "check_output", "load_head", "make_head"]
