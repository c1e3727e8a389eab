"""A head folder is untrusted input: its ``config.json`` and weights are checked here, field by field
and tensor by tensor, against the target, before any module or tensor is allocated.

* ``config.json``: at most ``MAX_CONFIG_BYTES``, parsed by ``untrusted_json.loads`` (bounded depth,
  64-bit integers, finite numbers); every field read has its type and range checked
  (``whole``, ``real``, ``flag``): widths and vocabularies must be the target's, Medusa has at
  most ``MAX_MEDUSA_HEADS`` heads of at most ``MAX_MEDUSA_LAYERS`` blocks, EAGLE-3's
  ``intermediate_size`` is at most ``MAX_INTERMEDIATE_FACTOR`` times the width.
* the parameters the config asks for are estimated (float32, 4 bytes each) and refused above
  ``MAX_HEAD_BYTES`` or the host's available memory, before anything is built;
* the weights: safetensors, whose header is read without loading (``safe_open``); or, for heads
  published only as a pickled ``pytorch_model.bin`` / ``medusa_lm_head.pt``, torch's weights-only
  unpickler (``torch.load(weights_only=True)``: it rebuilds tensors and plain containers and never
  calls what a file names, so a pickle cannot run code through it), memory-mapped, at most
  ``MAX_HEAD_BYTES`` on disk, and refused unless it is a flat mapping of names to tensors. Either
  way every tensor name, shape and dtype is compared with the expected ones before a module takes
  them; a missing, extra or misshapen tensor is one line naming it (at most ``MAX_TENSORS`` names
  are looked at).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from diagnostics.models import ModelError
from diagnostics.untrusted_json import UntrustedJSONError, loads

MAX_CONFIG_BYTES = 1 << 20  # a head's config.json is a few hundred bytes
MAX_MEDUSA_HEADS = 64  # published Medusa heads have 3 to 5; 64 leaves room and bounds the module count
MAX_MEDUSA_LAYERS = 64  # residual blocks per Medusa head (published: 1)
MAX_INTERMEDIATE_FACTOR = 16  # EAGLE-3's MLP width over its hidden width (Llama: 2.7 to 3.5, Gemma: 8)
MAX_ATTENTION_FACTOR = 8  # EAGLE-3's heads × head_dim over its hidden width (Llama: 1)
MAX_ROPE_THETA = 1e12
MAX_HEAD_BYTES = 16 << 30  # float32 parameters: Medusa's 4 heads over Llama 3 8B's 128k vocabulary are ~8.7 GB
MAX_TENSORS = 1 << 16  # tensors in a weights file (the largest Medusa allowed has 64 x 129 = 8,256)
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
INT_DTYPES = ("I8", "I16", "I32", "I64", "U8")
FIX = "fix config.json, or use a head made for this target"
PICKLES = ("medusa_lm_head.pt", "pytorch_model.bin", "model.pt")

_MISSING = object()


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a JSON object, within ``MAX_CONFIG_BYTES`` and the bounds of ``untrusted_json``."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelError(f"{folder} has no config.json: not a head folder (make one with python -m diagnostics make-head)")
    with open(path, "rb") as handle:
        text = handle.read(MAX_CONFIG_BYTES + 1)  # never more than the bound, whatever stat says
    if len(text) > MAX_CONFIG_BYTES:
        raise ModelError(f"{path} is over {MAX_CONFIG_BYTES >> 20} MiB: a head's config.json is a few hundred bytes")
    try:
        raw = loads(text, str(path))
    except UntrustedJSONError as error:
        raise ModelError(str(error)) from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path} is not a JSON object: a head's config.json maps field names to values")
    return raw


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _get(raw: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any]:
    """The first of ``keys`` present (with a value other than null), else the first key and ``_MISSING``."""
    for key in keys:
        if raw.get(key) is not None:
            return key, raw[key]
    return keys[0], _MISSING


def whole(raw: dict[str, Any], keys: str | tuple[str, ...], where: str, low: int, high: int, *,
          default: Any = _MISSING, why: str = "") -> int:
    """An integer field (under the first of ``keys`` present) in ``[low, high]``; ``default`` when absent."""
    key, value = _get(raw, (keys,) if isinstance(keys, str) else keys)
    if value is _MISSING:
        if default is _MISSING:
            raise ModelError(f"{where} has no {key}: a head's config.json must give it ({FIX})")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{where}: {key} is {_shown(value)}; it must be a whole number ({FIX})")
    if not low <= value <= high:
        bound = f"{low}" if low == high else f"{low} to {high}"
        raise ModelError(f"{where}: {key} is {value}; it must be {bound}{' ' + why if why else ''} ({FIX})")
    return value


def real(raw: dict[str, Any], key: str, where: str, above: float, high: float, default: float) -> float:
    """A finite number field in ``(above, high]``; ``default`` when absent or null."""
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ModelError(f"{where}: {key} is {_shown(value)}; it must be a number ({FIX})")
    if not above < value <= high:
        raise ModelError(f"{where}: {key} is {value}; it must be above {above} and at most {high:g} ({FIX})")
    return float(value)


def flag(raw: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    """A ``true``/``false`` field; ``default`` when absent or null."""
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelError(f"{where}: {key} is {_shown(value)}; it must be true or false ({FIX})")
    return value


def same(name: str, head: int, target: int) -> None:
    """A size the head must share with its target."""
    if head != target:
        raise ModelError(f"the head's {name} is {head} but the target's is {target}: this head was made for another target")


@dataclass(frozen=True)
class Slot:
    """One tensor the module needs: its key in the module, its name in the file, shape and kind of dtype."""

    module_key: str
    file_key: str
    shape: tuple[int, ...]
    kind: str = "float"  # "float", "int" or "bool"
    optional: bool = False  # absent: zeros (vLLM's Medusa without block biases)


def slots_of(module: torch.nn.Module, file_key: Callable[[str], str] = lambda key: key) -> list[Slot]:
    """Every tensor of ``module`` (built on the meta device: shapes only) as a float slot."""
    return [Slot(key, file_key(key), tuple(value.shape)) for key, value in module.state_dict().items()]


def available_bytes() -> int | None:
    """``MemAvailable`` of the host (Linux), ``None`` where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(slots: list[Slot], what: str) -> None:
    """Refuse a head whose parameters (float32) exceed ``MAX_HEAD_BYTES`` or the host's available memory."""
    count = sum(math.prod(slot.shape) for slot in slots)
    needed = 4 * count
    free = available_bytes()
    if needed > MAX_HEAD_BYTES:
        raise ModelError(f"{what} would hold {count:,} parameters (~{needed / 1e9:.1f} GB in float32), over the bound of "
                         f"{MAX_HEAD_BYTES / 1e9:.1f} GB: use a head with fewer heads or layers")
    if free is not None and needed > free:
        raise ModelError(f"{what} would hold {count:,} parameters (~{needed / 1e9:.1f} GB in float32) but only "
                         f"{free / 1e9:.1f} GB of memory is available: free memory or use a smaller head")


def weights_file(folder: Path, names: list[str]) -> Path:
    """The first of ``names`` (safetensors first, then the published pickled names) in ``folder``."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ModelError(f"{folder} has none of {', '.join(names)}: not a head folder (or make a head with "
                     "python -m diagnostics make-head)")


def is_pickled(path: Path) -> bool:
    return path.name in PICKLES


_DTYPE_NAMES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64", torch.int8: "I8",
                torch.int16: "I16", torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8", torch.bool: "BOOL"}


def load_pickled(path: Path) -> dict[str, torch.Tensor]:
    """A pickled checkpoint through torch's weights-only unpickler, memory-mapped (tensors are read
    as they are used): at most ``MAX_HEAD_BYTES`` on disk, a flat ``name → tensor`` mapping of at
    most ``MAX_TENSORS`` entries; ``ModelError`` (one line) otherwise."""
    size = path.stat().st_size
    if size > MAX_HEAD_BYTES:
        raise ModelError(f"{path} is {size / 2**30:.1f} GiB; a head's weights are at most {MAX_HEAD_BYTES >> 30} GiB")
    state: Any = None
    reason = ""  # why the last try failed; stays "" once one succeeds (its state may be None: a pickled None)
    for mmap in (True, False):  # files saved before torch 1.6 cannot be memory-mapped
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            reason = ""
            break
        except Exception as error:  # noqa: BLE001 - any refusal of the weights-only unpickler is one line
            reason = str(error).splitlines()[0][:160] if str(error) else error.__class__.__name__
    if reason:
        raise ModelError(f"cannot read {path} with torch's weights-only loader ({reason}): "
                         "not a checkpoint of plain tensors; convert it to safetensors where you trust it")
    if not isinstance(state, dict) or len(state) > MAX_TENSORS \
            or not all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state.items()):
        raise ModelError(f"{path} is not a flat mapping of tensor names to tensors (at most {MAX_TENSORS:,}): not a head's weights")
    return state


def _open(path: Path) -> Any:
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as error:  # noqa: BLE001 - any unreadable header is one line
        raise ModelError(f"cannot read {path} ({error.__class__.__name__}): not a safetensors file") from None


def header(path: Path, canonical: Callable[[str], str] = lambda key: key,
           pickled: dict[str, torch.Tensor] | None = None) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """``canonical name → (name in the file, shape, dtype)``: from a safetensors file's header
    (nothing loaded), or from ``pickled`` (a ``load_pickled`` mapping, memory-mapped)."""
    found: dict[str, tuple[str, tuple[int, ...], str]] = {}

    def add(name: str, shape: tuple[int, ...], dtype: str) -> None:
        key = canonical(name)
        if key in found:
            raise ModelError(f"{path} holds {found[key][0]!r} and {name!r}, the same tensor twice: keep one")
        found[key] = (name, shape, dtype)

    if pickled is not None:
        for name, tensor in pickled.items():
            add(name, tuple(int(size) for size in tensor.shape), _DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype)))
        return found
    with _open(path) as handle:
        names = handle.keys()
        if len(names) > MAX_TENSORS:
            raise ModelError(f"{path} holds {len(names):,} tensors; a head has at most {MAX_TENSORS:,}: not a head's weights")
        for name in names:
            piece = handle.get_slice(name)
            add(name, tuple(int(size) for size in piece.get_shape()), str(piece.get_dtype()))
    return found


def check_tensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], str]], slots: list[Slot],
                  ignored: tuple[str, ...] = ()) -> None:
    """Every slot's tensor present (unless optional) with its shape and kind of dtype; nothing else but ``ignored``."""
    expected = {slot.file_key: slot for slot in slots}
    for key in sorted(tensors):
        if key not in expected and key not in ignored:
            raise ModelError(f"{path} holds a tensor {tensors[key][0]!r} that this head's config.json has no place for: "
                             f"a head of another layout or size (check its heads and layers)")
    # Shapes first: a head made for another target (or another draft vocabulary) is named as such,
    # even when the tensors its config implies are missing too.
    present = [slot for slot in slots if slot.file_key in tensors]
    for slot in present:
        name, shape, dtype = tensors[slot.file_key]
        if shape != slot.shape:
            raise ModelError(f"{path}: the tensor {name!r} has shape {list(shape)} but this target needs {list(slot.shape)}: "
                             "this head was made for another target")
        allowed = {"float": FLOAT_DTYPES, "int": INT_DTYPES, "bool": ("BOOL",)}[slot.kind]
        if dtype not in allowed:
            raise ModelError(f"{path}: the tensor {name!r} is {dtype}; it must be one of {', '.join(allowed)}")
    for slot in slots:
        if slot.file_key not in tensors and not slot.optional:
            raise ModelError(f"{path} lacks the tensor {slot.file_key!r} that its config.json implies: "
                             "an incomplete or mislabelled head")


def read_tensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], str]], slots: list[Slot],
                 pickled: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The checked slots' tensors, read one by one (``module_key → tensor``); absent optional ones are zeros."""
    state: dict[str, torch.Tensor] = {}
    if pickled is not None:
        for slot in slots:
            present = slot.file_key in tensors
            state[slot.module_key] = pickled[tensors[slot.file_key][0]] if present else torch.zeros(slot.shape, device="cpu")
        return state
    with _open(path) as handle:
        for slot in slots:
            if slot.file_key in tensors:
                state[slot.module_key] = handle.get_tensor(tensors[slot.file_key][0])
            else:
                state[slot.module_key] = torch.zeros(slot.shape, device="cpu")
    return state


__all__ = ["MAX_ATTENTION_FACTOR", "MAX_CONFIG_BYTES", "MAX_HEAD_BYTES", "MAX_INTERMEDIATE_FACTOR", "MAX_MEDUSA_HEADS",
           "MAX_MEDUSA_LAYERS", "MAX_ROPE_THETA", "MAX_TENSORS", "Slot", "check_memory", "check_tensors", "flag", "header", "is_pickled", "load_pickled", "read_config",
           "read_tensors", "real", "same", "slots_of", "weights_file", "whole"]
