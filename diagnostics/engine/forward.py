"""Batched forwards over ragged rows: one KV store per model, one slot per sequence, one call per step.

Every model call of the engine is a ``Forward`` request of one row: feed ``n`` inputs (tokens, or
hidden states for the upper half of a split model) whose keys and values go to cache positions
``start … start + n − 1`` of the row's slot, at rotary positions ``positions`` (default: the same
numbers), each input seeing the keys ``visible[i]`` of ``[0, start + n)`` (default: causal). A
``Stage`` runs the requests of many rows in one forward:

* inputs are padded to ``Q = max n``; the padded queries write past their row's data (positions a
  row has not committed, overwritten before it reads them) and their outputs are dropped;
* keys are the store's ``[S, H, capacity, D]`` tensors cut to ``K = max(start) + Q``, a view when
  the rows are the store's slots in order (the lock-step case), a gather otherwise;
* an additive mask ``[B, 1, Q, K]`` (0 visible, the dtype's most negative value hidden) gives each
  row its own length, causality and tree visibility (the mechanism the tree forward uses).

Rolling a row back is free: its owner lowers its ``start``, and the next request overwrites the
refused positions. A tree round keeps the accepted path with ``keep_rows`` on that slot only.

When every request is plainly causal with one common ``start`` and ``n`` (one row, or lock-step
decoding), no mask is built and the forward is exactly the unbatched one. Three stages:

* ``DirectStage``: Llama-family models through ``fast_forward.DecoderParts`` (the model's own
  modules), optionally a slice of the layers (self-speculation);
* ``ModuleStage``: a module that declares ``accepts_slot_cache`` (it reads a 4D additive mask,
  per-row ``position_ids`` and calls ``past_key_values.update``), such as the tests' tiny LM;
* ``RowStage``: any other causal LM, one forward per row with its own ``DynamicCache`` (correct
  everywhere, batched nowhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from diagnostics.engine.caches import new_cache
from diagnostics.models import LoadedModel, float_logits


@dataclass
class Forward:
    """One row's part of a batched forward (see the module docstring)."""

    stage: Any
    slot: int
    start: int
    tokens: list[int] | None = None
    hidden: torch.Tensor | None = None  # [n, H]: inputs of a split model's upper layers
    positions: torch.Tensor | None = None  # [n] long
    visible: torch.Tensor | None = None  # [n, start + n] bool
    keep: int = 1  # outputs of the last ``keep`` inputs (at most all of them)

    def __post_init__(self) -> None:
        self.keep = min(self.keep, self.size)

    @property
    def size(self) -> int:
        return len(self.tokens) if self.tokens is not None else int(self.hidden.shape[0])

    @property
    def plain(self) -> bool:
        return self.positions is None and self.visible is None


@dataclass
class Output:
    """What a row gets back: float32 logits of its last ``keep`` inputs ``[keep, V]`` and, for a stage
    that keeps them, the hidden states of all its inputs ``[n, H]``."""

    logits: torch.Tensor | None
    hidden: torch.Tensor | None = None
    taps: torch.Tensor | None = None  # [n, k·H]: the tapped hidden states of every input (a draft head's features)


@dataclass
class Block:
    """Every row of one step of the round program (``diagnostics.engine.chain_program``) in one request.

    Row ``b`` feeds ``sizes[b]`` inputs (``tokens[b, :sizes[b]]``, or ``hidden[b, :sizes[b]]`` for a split
    model's upper layers) into slot ``slots[b]`` from cache position ``starts[b]``, causally; the inputs
    after ``sizes[b]`` are padding (written past the row's data, their outputs dropped). The outputs of
    each row's last ``keep`` real inputs come back as one ``[B, keep, V]`` tensor. ``tokens`` and
    ``hidden`` stay on the device; ``slots``, ``starts`` and ``sizes`` are the host's bookkeeping.
    """

    stage: Any
    slots: list[int]
    starts: list[int]
    sizes: list[int]
    keep: int
    tokens: torch.Tensor | None = None  # [B, Q] long
    hidden: torch.Tensor | None = None  # [B, Q, H]
    # A tree step: each input's rotary position [B, Q] and the keys it sees [B, Q, K] (K = max start + Q),
    # instead of the causal defaults.
    positions: torch.Tensor | None = None
    visible: torch.Tensor | None = None

    @property
    def count(self) -> int:
        return int((self.tokens if self.tokens is not None else self.hidden).shape[1])

    @property
    def uniform(self) -> bool:
        """One start, every row full, causal: the unbatched forward's shape (no mask, no gather)."""
        return (self.visible is None and all(start == self.starts[0] for start in self.starts)
                and all(size == self.count for size in self.sizes))

    def inputs(self, width: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The additive mask ``[B, 1, Q, width]`` and positions ``[B, Q]`` of a non-uniform block: causal
        from each row's start, or the tree step's own ``visible`` and ``positions``."""
        starts = torch.tensor(self.starts, dtype=torch.long, device=device)
        if self.visible is None:
            return row_mask(starts, self.count, width, dtype, device), starts[:, None] + torch.arange(self.count, device=device)
        mask = torch.full(self.visible.shape, torch.finfo(dtype).min, dtype=dtype, device=device)
        return mask.masked_fill_(self.visible, 0.0)[:, None], self.positions


@dataclass
class BlockOutput:
    """What a ``Block`` gives back: logits ``[B, keep, V]`` and, for a stage that keeps them, every
    input's hidden state ``[B, Q, H]``."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None


def row_mask(starts: torch.Tensor, count: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[B, 1, Q, K]`` causal additive mask of rows writing ``Q`` inputs from ``starts`` ``[B]``:
    query ``i`` of row ``b`` sees keys ``≤ starts[b] + i`` (0), every other key gets ``finfo(dtype).min``."""
    columns = torch.arange(width, device=device)
    allowed = columns[None, None, :] <= (starts[:, None] + torch.arange(count, device=device))[:, :, None]
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=device).masked_fill_(allowed, 0.0)
    return mask[:, None]


def last_inputs(outputs: torch.Tensor, block: Block) -> torch.Tensor:
    """``[B, keep, …]``: each row's outputs at its last ``keep`` real inputs (one gather when rows differ).

    A row with fewer inputs than ``keep`` (only a planted stale cache makes one) repeats its first output,
    as the per-row driver's clamped ``keep`` leaves its laws shifted."""
    count, keep = block.count, block.keep
    if keep <= count and all(size == count for size in block.sizes):
        return outputs[:, count - keep :]
    columns = torch.tensor([[max(0, size - keep + i) for i in range(keep)] for size in block.sizes], dtype=torch.long,
                           device=outputs.device)
    index = columns.view(*columns.shape, *([1] * (outputs.dim() - 2))).expand(-1, -1, *outputs.shape[2:])
    return outputs.gather(1, index)


def lock_step(requests: list[Forward]) -> bool:
    """Plain causal requests with one ``start`` and one ``n``: the unbatched forward's shape, no mask."""
    first = requests[0]
    return all(r.plain and r.start == first.start and r.size == first.size for r in requests)


class SlotStore:
    """Keys and values of every row, per layer ``[S, H, capacity, D]``, written at per-row positions.

    ``prepare`` names the rows of the next forward, where they write and how many keys it reads;
    ``update`` (called by each attention layer, the ``Cache`` method transformers' layers call)
    writes the new keys and values and returns the keys and values the queries attend over.
    """

    def __init__(self, slots: int = 1, capacity: int = 64) -> None:
        self.slots = max(1, slots)
        self.capacity = max(8, capacity)
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.free = list(range(self.slots))
        self._rows: torch.Tensor | None = None
        self._all = False
        self._columns: torch.Tensor | None = None
        self._width = 0

    @torch.inference_mode()
    def attach(self) -> int:
        """A free slot for a new row (the store grows when every slot is taken)."""
        if not self.free:
            grown = self.slots * 2
            for table in (self.keys, self.values):
                for layer, tensor in table.items():
                    extra = tensor.new_zeros((grown - self.slots, *tensor.shape[1:]))
                    table[layer] = torch.cat([tensor, extra])
            self.free = list(range(self.slots, grown))
            self.slots = grown
        self.free.sort()
        return self.free.pop(0)

    def detach(self, slot: int) -> None:
        """The row in ``slot`` left; a joining row reuses the slot (its stale contents are overwritten)."""
        self.free.append(slot)

    def prepare(self, slots: list[int], starts: list[int], count: int, device: torch.device) -> int:
        """Set up the next forward: rows ``slots`` write ``count`` inputs from ``starts``; returns ``K``."""
        width = max(starts) + count
        self._rows = torch.tensor(slots, dtype=torch.long, device=device)
        self._all = slots == list(range(self.slots))
        self._columns = torch.tensor(starts, dtype=torch.long, device=device)[:, None] + torch.arange(count, device=device)
        self._width = width
        return width

    def _table(self, table: dict[int, torch.Tensor], layer: int, like: torch.Tensor) -> torch.Tensor:
        tensor = table.get(layer)
        if tensor is None or tensor.shape[2] < self._width:
            capacity = max(self.capacity, self._width)
            while capacity < self._width:
                capacity *= 2
            if tensor is not None:
                capacity = max(capacity, tensor.shape[2] * 2)
            grown = like.new_zeros((self.slots, like.shape[1], capacity, like.shape[3]))
            if tensor is not None:
                grown[:, :, : tensor.shape[2]] = tensor
            self.capacity = max(self.capacity, capacity)
            table[layer] = tensor = grown
        return tensor

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, cache_kwargs: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key``/``value`` ``[B, H, Q, D]`` at each row's columns; the keys and values ``[B, H, K, D]`` it reads."""
        out = []
        for table, new in ((self.keys, key), (self.values, value)):
            tensor = self._table(table, layer_idx, new)
            rows = self._rows[:, None].expand_as(self._columns)
            tensor[rows, :, self._columns] = new.transpose(1, 2).to(tensor.dtype)
            out.append(tensor[:, :, : self._width] if self._all else tensor[:, :, : self._width].index_select(0, self._rows))
        return out[0], out[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._width

    @torch.inference_mode()
    def move_rows(self, slots: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """For every row ``b`` at once: the cached token at column ``sources[b, k]`` of slot ``slots[b]`` moves
        to column ``targets[b, k]`` (``[B, P]`` long; all sources are read before any target is written).
        A tree round keeps each row's accepted path after its prefix this way, in one gather per layer."""
        rows = slots[:, None].expand_as(sources)
        for table in (self.keys, self.values):
            for tensor in table.values():
                tensor[rows, :, targets] = tensor[rows, :, sources]

    @torch.inference_mode()
    def keep_rows(self, slot: int, rows: list[int]) -> None:
        """Keep the cached tokens at ``rows`` (in that order) as the first ``len(rows)`` of ``slot``."""
        for table in (self.keys, self.values):
            for tensor in table.values():
                index = torch.tensor(rows, dtype=torch.long, device=tensor.device)
                tensor[slot, :, : len(rows)] = tensor[slot].index_select(1, index)


def additive_mask(requests: list[Forward], count: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[B, 1, Q, K]``: 0 where query ``i`` of row ``b`` sees key ``j``, ``finfo(dtype).min`` elsewhere.

    Plain rows are causal (query ``i`` sees keys ``≤ start + i``); a row's ``visible`` replaces its
    real queries' rows. Padded queries see their own causal prefix (their outputs are dropped).
    Built on ``device``: the causal part from the rows' starts in one comparison."""
    starts = torch.tensor([r.start for r in requests], dtype=torch.long, device=device)
    columns = torch.arange(width, device=device)
    allowed = columns[None, None, :] <= (starts[:, None] + torch.arange(count, device=device))[:, :, None]
    for row, request in enumerate(requests):
        if request.visible is not None:
            size, seen = request.visible.shape
            allowed[row, :size, :seen] = request.visible.to(device=device, dtype=torch.bool)
            allowed[row, :size, seen:] = False
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=device).masked_fill_(allowed, 0.0)
    return mask[:, None]


def positions_of(requests: list[Forward], count: int, device: torch.device) -> torch.Tensor:
    """``[B, Q]`` rotary positions: each row's own, padded queries continuing from ``start + i``."""
    starts = torch.tensor([r.start for r in requests], dtype=torch.long, device=device)
    positions = starts[:, None] + torch.arange(count, device=device)
    for row, request in enumerate(requests):
        if request.positions is not None:
            positions[row, : request.size] = request.positions.reshape(-1).to(device=device, dtype=torch.long)
    return positions


def padded_hidden(requests: list[Forward], count: int) -> torch.Tensor:
    """``[B, count, H]``: each row's ``hidden`` inputs, zeros after them (padded queries' outputs are dropped)."""
    first = requests[0].hidden
    hidden = first.new_zeros((len(requests), count, first.shape[-1]))
    for row, request in enumerate(requests):
        hidden[row, : request.size] = request.hidden
    return hidden


def _kept_rows(requests: list[Forward], count: int, device: torch.device) -> torch.Tensor:
    """Flat indices ``b·Q + i`` of each row's last ``keep`` real inputs, row after row."""
    index = []
    for row, request in enumerate(requests):
        index.extend(range(row * count + request.size - request.keep, row * count + request.size))
    return torch.tensor(index, dtype=torch.long, device=device)


def _split(flat: torch.Tensor, requests: list[Forward]) -> list[torch.Tensor]:
    return list(torch.split(flat, [r.keep for r in requests]))


class DirectStage:
    """Layers ``layers`` of a Llama-family model (``DecoderParts``) over a ``SlotStore``, batched.

    ``takes_hidden``: the inputs are hidden states (a split model's upper layers), else token ids.
    ``keeps_hidden``: return every input's hidden state after the last layer too (the lower half
    of a split model keeps them for the upper half).
    """

    def __init__(self, parts: Any, store: SlotStore, layers: list[Any] | None = None, order: int = 1,
                 takes_hidden: bool = False, keeps_hidden: bool = False, taps: tuple[int, ...] | None = None) -> None:
        self.parts, self.store = parts, store
        self.layers = parts.layers if layers is None else layers
        self.order = order
        self.takes_hidden, self.keeps_hidden = takes_hidden, keeps_hidden
        # Boundary indices (0: the embeddings, i: the input of layer i, L: the last layer's output,
        # before the final norm): every input's states there come back as ``Output.taps``.
        self.taps = taps

    @property
    def device(self) -> torch.device:
        """Where this stage's model lives: masks, positions and indices for it are built there."""
        return self.parts.device

    def keep_rows(self, slot: int, rows: list[int]) -> None:
        self.store.keep_rows(slot, rows)

    @torch.inference_mode()
    def run(self, requests: list[Forward]) -> list[Output]:
        parts = self.parts
        count = max(r.size for r in requests)
        if self.takes_hidden:
            hidden = padded_hidden(requests, count)
        else:
            ids = [list(r.tokens) + [0] * (count - r.size) for r in requests]
            hidden = parts.embed(torch.tensor(ids, dtype=torch.long, device=parts.device))
        self.store.prepare([r.slot for r in requests], [r.start for r in requests], count, hidden.device)
        parts.capture = {} if self.taps else None
        try:
            if lock_step(requests):
                hidden = parts.run(hidden, requests[0].start, self.layers, self.store)
            else:
                width = self.store.get_seq_length()
                mask = additive_mask(requests, count, width, parts.dtype, hidden.device)
                hidden = parts.run_rows(hidden, positions_of(requests, count, hidden.device), mask, self.layers, self.store)
            taps = torch.cat([parts.capture[index] for index in self.taps], dim=-1).float() if self.taps else None
        finally:
            parts.capture = None
        if len(requests) == 1:  # the unbatched slice, so one row's head sees exactly what it did alone
            request = requests[0]
            kept = hidden[0, request.size - request.keep : request.size]
        else:
            kept = hidden.reshape(-1, hidden.shape[-1]).index_select(0, _kept_rows(requests, count, hidden.device))
        logits = _split(parts.logits(kept), requests)
        if taps is not None:
            return [Output(logits=row, taps=taps[index, : r.size]) for index, (row, r) in enumerate(zip(logits, requests))]
        if not self.keeps_hidden:
            return [Output(logits=row) for row in logits]
        return [Output(logits=row, hidden=hidden[index, : r.size]) for index, (row, r) in enumerate(zip(logits, requests))]


    @torch.inference_mode()
    def run_block(self, block: Block) -> BlockOutput:
        """Every row of a round step in one forward (``Block``); no per-row work on the host."""
        parts = self.parts
        count = block.count
        hidden = block.hidden if self.takes_hidden else parts.embed(block.tokens)
        self.store.prepare(block.slots, block.starts, count, hidden.device)
        if block.uniform:
            hidden = parts.run(hidden, block.starts[0], self.layers, self.store)
        else:
            mask, positions = block.inputs(self.store.get_seq_length(), parts.dtype, hidden.device)
            hidden = parts.run_rows(hidden, positions, mask, self.layers, self.store)
        logits = parts.logits(last_inputs(hidden, block))
        return BlockOutput(logits=logits, hidden=hidden if self.keeps_hidden else None)


class ModuleStage:
    """A module that takes the slot store as its cache (``accepts_slot_cache``): one call per step."""

    def __init__(self, loaded: LoadedModel, store: SlotStore, order: int = 1) -> None:
        self.loaded, self.store, self.order = loaded, store, order
        self.takes_hidden = self.keeps_hidden = False
        self.device = loaded.device

    def keep_rows(self, slot: int, rows: list[int]) -> None:
        self.store.keep_rows(slot, rows)

    @torch.inference_mode()
    def run(self, requests: list[Forward]) -> list[Output]:
        device = self.loaded.device
        count = max(r.size for r in requests)
        ids = torch.tensor([list(r.tokens) + [0] * (count - r.size) for r in requests], dtype=torch.long, device=device)
        width = self.store.prepare([r.slot for r in requests], [r.start for r in requests], count, device)
        extra: dict[str, Any] = {"position_ids": positions_of(requests, count, device)}
        if not lock_step(requests):
            extra["attention_mask"] = additive_mask(requests, count, width, torch.float32, device)
        logits = float_logits(self.loaded.model(input_ids=ids, past_key_values=self.store, use_cache=True, **extra).logits)
        if len(requests) == 1:
            request = requests[0]
            return [Output(logits=logits[0, request.size - request.keep : request.size])]
        flat = logits.reshape(-1, logits.shape[-1]).index_select(0, _kept_rows(requests, count, logits.device))
        return [Output(logits=row) for row in _split(flat, requests)]


    @torch.inference_mode()
    def run_block(self, block: Block) -> BlockOutput:
        """Every row of a round step in one call of the module (``Block``)."""
        device = self.loaded.device
        count = block.count
        width = self.store.prepare(block.slots, block.starts, count, device)
        mask, positions = block.inputs(width, torch.float32, device)
        extra: dict[str, Any] = {"position_ids": positions}
        if not block.uniform:
            extra["attention_mask"] = mask
        logits = float_logits(self.loaded.model(input_ids=block.tokens, past_key_values=self.store, use_cache=True,
                                                **extra).logits)
        return BlockOutput(logits=last_inputs(logits, block))


class RowStage:
    """Any causal LM: one forward per row over that row's own ``DynamicCache`` (cut back to ``start``)."""

    def __init__(self, loaded: LoadedModel, order: int = 1) -> None:
        self.loaded, self.order = loaded, order
        self.takes_hidden = self.keeps_hidden = False
        self.device = loaded.device
        self.store = RowStore(loaded)

    def keep_rows(self, slot: int, rows: list[int]) -> None:
        from diagnostics.engine.tree_attention import keep_rows

        keep_rows(self.store.caches[slot], rows)
        self.store.lengths[slot] = len(rows)

    @torch.inference_mode()
    def run(self, requests: list[Forward]) -> list[Output]:
        return [Output(logits=self._one(request)) for request in requests]

    def _one(self, request: Forward) -> torch.Tensor:
        loaded, store = self.loaded, self.store
        cache = store.caches[request.slot]
        surplus = store.lengths[request.slot] - request.start
        if surplus > 0:
            cache.crop(-surplus)  # transformers >= 5: a negative count removes that many trailing tokens
        ids = torch.tensor([list(request.tokens)], dtype=torch.long, device=loaded.device)
        extra: dict[str, Any] = {}
        if not request.plain:
            dtype = next(loaded.model.parameters()).dtype
            extra["attention_mask"] = additive_mask([request], request.size, request.start + request.size, dtype, loaded.device)
            extra["position_ids"] = positions_of([request], request.size, loaded.device)
        output = loaded.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=request.keep, **extra)
        store.lengths[request.slot] = request.start + request.size
        return float_logits(output.logits[0, -request.keep :])


class RowStore:
    """One ``DynamicCache`` per slot and the number of tokens it holds."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.caches: dict[int, Any] = {}
        self.lengths: dict[int, int] = {}
        self.free: list[int] = []
        self.slots = 0

    def attach(self) -> int:
        if self.free:
            self.free.sort()
            slot = self.free.pop(0)
        else:
            slot, self.slots = self.slots, self.slots + 1
        self.caches[slot], self.lengths[slot] = new_cache(self.loaded.model), 0
        return slot

    def detach(self, slot: int) -> None:
        self.caches.pop(slot, None)
        self.lengths.pop(slot, None)
        self.free.append(slot)


def accepts_slot_cache(loaded: LoadedModel) -> bool:
    """A module that reads a 4D additive mask and per-row ``position_ids`` and writes its keys through
    ``past_key_values.update`` (it says so with ``accepts_slot_cache = True``)."""
    return bool(getattr(loaded.model, "accepts_slot_cache", False))


def full_stage(loaded: LoadedModel, rows: int, capacity: int, order: int, taps: tuple[int, ...] | None = None) -> Any:
    """The batched forward of a whole model: direct where the family allows, else the module with the
    slot store, else one forward per row. ``taps``: boundary indices whose hidden states every
    output carries (only the direct forward has them)."""
    from diagnostics.engine.fast_forward import DecoderParts, supports_direct_forward
    from diagnostics.models import ModelError

    if supports_direct_forward(loaded):
        return DirectStage(DecoderParts(loaded), SlotStore(rows, capacity), order=order, taps=taps)
    if taps:
        raise ModelError(f"draft heads read the target's hidden states, which this lab taps for Llama, Mistral and Qwen2 "
                         f"targets only, not {loaded.model.__class__.__name__}: use model:ID, early-exit:L or ngram:N")
    if accepts_slot_cache(loaded):
        return ModuleStage(loaded, SlotStore(rows, capacity), order=order)
    return RowStage(loaded, order=order)


def resolve(asks: Any) -> Any:
    """Run one row's requests alone (each on its stage, as a batch of one) and return its answer."""
    try:
        request = next(asks)
        while True:
            request = asks.send(request.stage.run([request])[0])
    except StopIteration as stop:
        return stop.value
