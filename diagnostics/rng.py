"""Counter-based uniforms keyed by ``(seed, position, slot, sibling)`` and inverse-CDF sampling.

Every random draw of the engine comes from here, so that

* a run is reproducible from its seed alone,
* each decision can be replayed from stored uniforms (``accept <=> u_accept < a(x)``),
* runs with the same seed and different rules are *coupled*: position ``t``'s draft, accept and
  fallback uniforms do not depend on what happened before ``t``.

The stream is a keyed hash (SplitMix64 finaliser, applied field by field) rather than a
stateful generator: the uniform for a key is a pure function of the key, which is what makes
replay and coupling trivial.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import torch

# Slots name the role of a draw at one absolute output position. The token emitted from the
# target side at a position (fallback after a rejection, or bonus after a full block) uses the
# ``fallback`` slot: the two can never both happen at one position of one run, and sharing the
# slot keeps coupled runs on the same token as long as their decisions agree.
SLOTS: Final[dict[str, int]] = {"draft": 0, "accept": 1, "fallback": 2}

_MASK64: Final[int] = (1 << 64) - 1
_GOLDEN: Final[np.uint64] = np.uint64(0x9E3779B97F4A7C15)
_M1: Final[np.uint64] = np.uint64(0xBF58476D1CE4E5B9)
_M2: Final[np.uint64] = np.uint64(0x94D049BB133111EB)
_FIELD_KEYS: Final[tuple[np.uint64, ...]] = (
    np.uint64(0x243F6A8885A308D3),  # seed
    np.uint64(0x13198A2E03707344),  # position
    np.uint64(0xA4093822299F31D0),  # slot
    np.uint64(0x082EFA98EC4E6C89),  # sibling
)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijection on 64-bit words with full avalanche."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _as_u64(values: int | np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.dtype.kind not in "iu":
        raise TypeError(f"rng keys must be integers, got dtype {array.dtype}")
    if array.dtype.kind == "i" and (array < 0).any():
        raise ValueError("rng keys (seed, position, sibling) must be non-negative")
    return array.astype(np.uint64)


def slot_id(slot: str | int) -> int:
    """Numeric id of a named slot (``draft``, ``accept``, ``fallback``) or a raw integer slot."""
    if isinstance(slot, str):
        if slot not in SLOTS:
            raise ValueError(f"unknown rng slot {slot!r}; use one of {sorted(SLOTS)}")
        return SLOTS[slot]
    return int(slot)


def uniforms(
    seed: int | np.ndarray | torch.Tensor,
    position: int | np.ndarray | torch.Tensor,
    slot: str | int,
    sibling: int | np.ndarray | torch.Tensor = 0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Uniform(0, 1) draws, one per broadcast key: ``u = (h(seed, position, slot, sibling) >> 11) / 2**53``.

    ``h`` chains the SplitMix64 finaliser over the four fields, each xored with its own key, so
    that neighbouring counters in any field give independent-looking words. The top 53 bits make
    a float64 in ``[0, 1)`` with every value a multiple of ``2**-53``. The counter runs on the host
    (numpy); the draws are returned on ``device``.
    """
    if all(isinstance(value, int) for value in (seed, position, sibling)):
        return torch.tensor(uniform_scalar(seed, position, slot, sibling), dtype=torch.float64, device=device)
    return torch.from_numpy(_uniform_array(seed, position, slot_id(slot), sibling)).to(device)


def _uniform_array(seed, position, slot, sibling) -> np.ndarray:
    """The float64 uniforms of every broadcast key ``(seed, position, slot, sibling)``, on the host."""
    with np.errstate(over="ignore"):
        fields = np.broadcast_arrays(_as_u64(seed), _as_u64(position), _as_u64(slot), _as_u64(sibling))
        state = np.zeros(fields[0].shape, dtype=np.uint64)
        for field, key in zip(fields, _FIELD_KEYS):
            state = _mix64(state ^ field ^ key)
    words = (state >> np.uint64(11)).astype(np.float64)
    return np.asarray(words * (1.0 / 9007199254740992.0), dtype=np.float64)


def round_uniforms(seeds: list[int], positions: list[int], width: int, device: torch.device | str) -> torch.Tensor:
    """``U[b, j, s]`` for a round of many rows in one call: the uniform keyed by ``(seeds[b], positions[b] + j,
    slot s)`` for ``j < width`` and ``s`` = ``draft``, ``accept``, ``fallback`` (``SLOTS`` order).

    Bit for bit ``uniform_scalar(seeds[b], positions[b] + j, s)``: computed on the host in one pass
    and copied to ``device`` once, so a round of any number of rows costs one transfer."""
    return torch.from_numpy(round_uniform_array(seeds, positions, width)).to(device)


def round_uniform_array(seeds: list[int], positions: list[int], width: int) -> np.ndarray:
    """``round_uniforms`` on the host (``[B, width, 3]`` float64): what the records store as ``u``."""
    seed = np.asarray(seeds, dtype=np.int64)[:, None, None]
    position = np.asarray(positions, dtype=np.int64)[:, None, None] + np.arange(width, dtype=np.int64)[None, :, None]
    slot = np.arange(len(SLOTS), dtype=np.int64)[None, None, :]
    return _uniform_array(seed, position, slot, 0)


def tree_round_uniform_array(seeds: list[int], positions: list[int], depth: int, width: int) -> np.ndarray:
    """``U[b, t, x, s]`` (float64, host) of a tree round of many rows: the uniform keyed by ``(seeds[b],
    positions[b] + t, slot s, sibling x)`` for ``t ≤ depth``, ``x < width`` and every slot. A node at depth
    ``d`` drawn as the ``i``-th of its level uses ``U[b, d − 1, i, draft]``; the ``j``-th child tried at
    depth ``d`` uses ``U[b, d, j, accept]``; the draw that ends the round at depth ``d``, ``U[b, d, 0, fallback]``."""
    seed = np.asarray(seeds, dtype=np.int64)[:, None, None, None]
    position = (np.asarray(positions, dtype=np.int64)[:, None, None, None]
                + np.arange(depth + 1, dtype=np.int64)[None, :, None, None])
    sibling = np.arange(max(1, width), dtype=np.int64)[None, None, :, None]
    slot = np.arange(len(SLOTS), dtype=np.int64)[None, None, None, :]
    return _uniform_array(seed, position, slot, sibling)


def _mix64_int(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


_FIELD_INTS: Final[tuple[int, ...]] = tuple(int(key) for key in _FIELD_KEYS)


def uniform_scalar(seed: int, position: int, slot: str | int, sibling: int = 0) -> float:
    """One uniform, bit-identical to ``uniforms`` for the same key, in plain Python integers (fast path)."""
    state = 0
    for field, key in zip((seed, position, slot_id(slot), sibling), _FIELD_INTS):
        if field < 0:
            raise ValueError("rng keys (seed, position, sibling) must be non-negative")
        state = _mix64_int(state ^ field ^ key)
    return (state >> 11) * (1.0 / 9007199254740992.0)


def sample_token(probs: torch.Tensor, u: float) -> int:
    """One token of a law ``probs[V]`` by inverse CDF: ``v`` with ``F(v-1) <= u·F(V-1) < F(v)``.

    Bit for bit ``int(sample_inverse_cdf(probs, torch.tensor(u)))`` (the same float64 cumulative
    sum, product and search), in fewer tensor operations: a run draws one token per position
    and this is on its hot path.
    """
    if probs.dim() != 1:
        raise ValueError("sample_token draws from one law [V]; use sample_inverse_cdf for rows")
    cdf = probs.to(torch.float64).cumsum(-1)
    total = float(cdf[-1])
    # min >= 0 with a finite total is "every entry finite and non-negative" (nan fails the min).
    if not (float(probs.min()) >= 0.0 and total < math.inf):
        raise ValueError("sample_inverse_cdf needs finite, non-negative probabilities")
    if not total > 0:
        raise ValueError("sample_inverse_cdf needs a positive total mass in every row")
    token = int(torch.searchsorted(cdf, float(u) * total, right=True))
    vocab = probs.shape[-1]
    if token >= vocab:  # u·total rounded onto the total: the last token with positive mass
        token = vocab - 1 - int((probs > 0).flip(-1).to(torch.int64).argmax(-1))
    return token


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ``v`` with ``F(v-1) <= u * F(V-1) < F(v)`` where ``F`` is the cumulative sum of ``probs``.

    ``probs`` has shape ``[..., V]`` (need not be normalised), ``u`` the leading shape ``[...]``
    or ``[..., n]`` for ``n`` draws per row. Works over the vocabulary's token order, in float64,
    and never returns a zero-probability token: a zero entry has an empty CDF interval, and a
    ``u`` rounding onto the total is sent to the last token with positive mass.
    """
    if not ((probs >= 0) & (probs < math.inf)).all():
        raise ValueError("sample_inverse_cdf needs finite, non-negative probabilities")
    cdf = probs.to(torch.float64).cumsum(-1)
    total = cdf[..., -1:]
    if not (total > 0).all():
        raise ValueError("sample_inverse_cdf needs a positive total mass in every row")
    u = u.to(torch.float64)
    squeeze = u.dim() == probs.dim() - 1
    if squeeze:
        u = u.unsqueeze(-1)
    tokens = torch.searchsorted(cdf, (u * total).contiguous(), right=True)
    vocab = probs.shape[-1]
    # right=True lands on a token with cdf[v-1] <= x < cdf[v], so p(v) > 0; only x rounding onto
    # the total runs past the end, and goes to the last token with positive mass.
    if (tokens >= vocab).any():
        last_positive = vocab - 1 - (probs > 0).flip(-1).to(torch.int64).argmax(-1, keepdim=True)
        tokens = torch.minimum(tokens, last_positive.expand_as(tokens))
    return tokens.squeeze(-1) if squeeze else tokens
