"""Strict-device mode: a test-only guard that catches tensors made without a device.

On a CUDA machine a tensor factory (``torch.tensor``, ``zeros``, ``arange``, ``rand`` …) called
without ``device=`` makes a CPU tensor, and the first op that meets it beside a CUDA tensor stops
the run ("Expected all tensors to be on the same device"). On a CPU-only machine nothing fails,
so the suite could never see it. This mode records every factory called from code under
``diagnostics/`` without an explicit ``device=`` (the caller is the nearest frame outside torch
itself), and the autouse fixture in ``conftest.py`` fails the test that made one. A tensor that
is meant for the host says so with ``device="cpu"``.

It wraps the factories themselves (``torch.zeros`` and the rest of torch's own list of device
constructors) while a mode is active, rather than running as a ``TorchFunctionMode``: a function
mode sees every torch call, which made the engine tests 1.45-1.5x slower (measured on ``test_batch``),
while a factory wrapper costs nothing on the other ops. A factory bound under another name before the
mode starts (``from torch import zeros``) would escape it, so ``test_strict_device`` checks that no
module under ``diagnostics/`` imports one that way.

Only the thread that entered the mode is watched: code a test runs in another thread or process
(an ``AppTest`` script thread, a worker) is not; the engine tests call it in the test's thread.
"""

from __future__ import annotations

import functools
import sys
import threading
from pathlib import Path

import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext, _device_constructors

CONSTRUCTORS = _device_constructors()
PACKAGE = str(Path(__file__).resolve().parents[1] / "diagnostics") + "/"
TORCH = str(Path(torch.__file__).resolve().parent) + "/"
# Where the factories are reached by name: torch itself, and the fft and nested modules.
_NAMESPACES = (torch, torch.fft, torch.nested)


def caller_in_package(depth: int = 2) -> str | None:
    """``file:line`` of the frame that called torch, when that frame is under ``diagnostics/``."""
    frame = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.startswith(TORCH):
        frame = frame.f_back
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    if not filename.startswith(PACKAGE):
        return None
    return f"diagnostics/{filename[len(PACKAGE):]}:{frame.f_lineno}"


def _factories() -> list[tuple[object, str, object]]:
    """``(namespace, attribute, factory)`` for every device constructor reachable by name."""
    found = []
    names = {getattr(factory, "__name__", "") for factory in CONSTRUCTORS}
    names |= {name.removeprefix("fft_") for name in names if name.startswith("fft_")}
    for namespace in _NAMESPACES:
        for name in sorted(names):
            factory = getattr(namespace, name, None)
            if callable(factory) and not isinstance(factory, type):
                found.append((namespace, name, factory))
    return found


_ACTIVE: list[tuple["StrictDevice", int]] = []  # (mode, thread id), innermost last
_LOCK = threading.Lock()
_SAVED: list[tuple[object, str, object]] = []


def _in_device_context() -> bool:
    """Inside ``with torch.device(...)``: the device is explicit there (torch fills it in), as when
    ``nn.Linear`` is built on the meta device."""
    return any(isinstance(mode, DeviceContext) for mode in _get_current_function_mode_stack())


def _watched(factory, name: str):
    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
        if _ACTIVE and kwargs.get("device") is None and not _in_device_context():
            thread = threading.get_ident()
            watchers = [mode for mode, owner in _ACTIVE if owner == thread]
            if watchers:
                place = caller_in_package()
                if place is not None:
                    for mode in watchers:
                        mode.places.setdefault(place, name)
        return factory(*args, **kwargs)

    return wrapper


class StrictDevice:
    """Records ``{place: factory name}`` for factories called from ``diagnostics/`` without ``device=``.

    A context manager; it may be entered again after it exits, and several may be active at once.
    """

    def __init__(self) -> None:
        self.places: dict[str, str] = {}

    def __enter__(self) -> "StrictDevice":
        with _LOCK:
            if not _ACTIVE:
                for namespace, name, factory in _factories():
                    _SAVED.append((namespace, name, factory))
                    setattr(namespace, name, _watched(factory, name))
            _ACTIVE.append((self, threading.get_ident()))
        return self

    def __exit__(self, *exc) -> None:
        with _LOCK:
            for index in range(len(_ACTIVE) - 1, -1, -1):
                if _ACTIVE[index][0] is self:
                    del _ACTIVE[index]
                    break
            if not _ACTIVE:
                while _SAVED:
                    namespace, name, factory = _SAVED.pop()
                    setattr(namespace, name, factory)

    def report(self) -> str:
        return "; ".join(f"{place} {name}" for place, name in sorted(self.places.items()))
