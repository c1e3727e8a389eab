"""Shared fixtures: deterministic random laws with the corner cases the rules must survive."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The tiers' report and the everyday tier's budget guard (tests/tiers.py), as this conftest's hooks.
from tiers import (pytest_collection_modifyitems, pytest_runtest_logreport, pytest_sessionfinish,  # noqa: E402,F401
                   pytest_terminal_summary)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch thread per worker process: two workers on two cores already fill the machine, and a
    # second thread per worker would only contend. Measured on 2 cores while another process ran:
    # a test of tiny-model generations took 11.2 s with two torch threads against 1.7 s with one.
    torch.set_num_threads(1)
    # The same for what the tests start (dashboards, CLI processes, sampling workers), unless asked otherwise.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# Shared with the audit's battery and the Playground presets.
from diagnostics.synthetic import dirichlet, keep_top as truncate_top  # noqa: E402


def corner_pairs(vocab: int, count: int, seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``count`` random ``(label, p, q)`` pairs plus every named corner case at this vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    concentrations = (0.1, 0.5, 1.0, 5.0)
    for index in range(count):
        c_p = concentrations[index % 4]
        c_q = concentrations[(index // 4) % 4]
        p = dirichlet(vocab, c_p, generator)
        q = dirichlet(vocab, c_q, generator)
        kind = index % 5
        if kind == 1:  # truncated target: zeros in p
            p = truncate_top(p, max(1, vocab // 2))
        elif kind == 2:  # truncated draft: zeros in q
            q = truncate_top(q, max(1, vocab // 3))
        elif kind == 3:  # both truncated
            p = truncate_top(p, max(1, vocab // 2))
            q = truncate_top(q, max(1, vocab // 2))
        pairs.append((f"random{index}", p, q))
    uniform = torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)
    p = dirichlet(vocab, 1.0, generator)
    one_hot = torch.zeros(vocab, dtype=torch.float64)
    one_hot[vocab // 2] = 1.0
    ties = torch.tensor([(i % 3) + 1 for i in range(vocab)], dtype=torch.float64)
    ties = ties / ties.sum()
    q_hole = dirichlet(vocab, 1.0, generator)
    q_hole[p.argmax()] = 0.0  # the target's favourite can never be drafted
    q_hole = q_hole / q_hole.sum()
    pairs += [
        ("p_equals_q", p, p.clone()),
        ("one_hot_p", one_hot, dirichlet(vocab, 1.0, generator)),
        ("one_hot_both", one_hot, one_hot.clone()),
        ("point_mass_draft", p, one_hot),
        ("uniform_p", uniform, dirichlet(vocab, 0.5, generator)),
        ("ties", ties, ties.flip(0)),
        ("q_zero_on_argmax", p, q_hole),
    ]
    return pairs


@pytest.fixture
def toy_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's toy pair: q = [.55, .25, .15, .05], p = [.05, .15, .25, .55]."""
    p = torch.tensor([0.05, 0.15, 0.25, 0.55], dtype=torch.float64)
    q = torch.tensor([0.55, 0.25, 0.15, 0.05], dtype=torch.float64)
    return p, q


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> str:
    """A tiny Llama with its tokenizer saved as a local model folder, shared by the page tests."""
    from tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("app") / "tiny", seed=0)


@pytest.fixture(autouse=True)
def strict_device(request):
    """Every test runs under the strict-device mode (``tests/strict_device.py``): a tensor that code
    under ``diagnostics/`` makes without ``device=`` fails the test, with the places it was made.
    ``@pytest.mark.device_free`` opts a test out (the negative control that plants such a tensor)."""
    from strict_device import StrictDevice

    if request.node.get_closest_marker("device_free") is not None:
        yield None
        return
    mode = StrictDevice()
    with mode:
        yield mode
    assert not mode.places, f"tensors made without device= under diagnostics/ (a CPU tensor on a CUDA run): {mode.report()}"
