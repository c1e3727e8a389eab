"""Strict-device mode: a test-only torch function mode that catches tensors made without a device.

On a CUDA machine a tensor factory (``torch.tensor``, ``zeros``, ``arange``, ``rand`` …) called
without ``device=`` makes a CPU tensor, and the first op that meets it beside a CUDA tensor stops
the run ("Expected all tensors to be on the same device"). On a CPU-only machine nothing fails,
so the suite could never see it. This mode records every factory called from code under
``diagnostics/`` without an explicit ``device=`` (the caller is the nearest frame outside torch
itself), and the autouse fixture in ``conftest.py`` fails the test that made one. A tensor that
is meant for the host says so with ``device="cpu"``.

Thread-local, as torch function modes are: code a test runs in another thread or process (an
``AppTest`` script thread, a worker) is not watched; the engine tests call it in the test's thread.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

CONSTRUCTORS = _device_constructors()
PACKAGE = str(Path(__file__).resolve().parents[1] / "diagnostics") + "/"
TORCH = str(Path(torch.__file__).resolve().parent) + "/"


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


class StrictDevice(TorchFunctionMode):
    """Records ``{place: factory name}`` for factories called from ``diagnostics/`` without ``device=``."""

    def __init__(self) -> None:
        super().__init__()
        self.places: dict[str, str] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in CONSTRUCTORS and kwargs.get("device") is None:
            place = caller_in_package()
            if place is not None:
                self.places.setdefault(place, getattr(func, "__name__", str(func)))
        return func(*args, **kwargs)

    def report(self) -> str:
        return "; ".join(f"{place} {name}" for place, name in sorted(self.places.items()))
