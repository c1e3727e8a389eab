"""Where the engine, tree, head and audit tests run: one place, CPU by default.

``DIAGNOSTICS_TEST_DEVICE=cuda`` runs the same tests on a GPU unchanged. Helpers pass ``device=``
explicitly: a global default device would hide the very bugs the strict-device mode is there to
find (a factory without ``device=`` would land on the GPU by accident).
"""

from __future__ import annotations

import os

import torch

DEVICE = torch.device(os.environ.get("DIAGNOSTICS_TEST_DEVICE", "cpu"))
