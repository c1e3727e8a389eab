"""The strict-device mode proves "no CPU tensor on a CUDA path" on a CPU-only machine.

* every engine setup (plain, early-exit chain, model drafter with a draft stop, n-gram, trees of
  top and sampled children, a budget tree, an EAGLE-3 chain and a Medusa tree) under four rules
  makes no tensor without a device from code under ``diagnostics/`` (the issue counted 21 places);
* the negative control: a drafter under ``diagnostics/`` that builds its laws without ``device=``
  is found, with its file and line, and the suite's fixture would fail the test;

Fake CUDA cannot stand in here (tried at torch 2.13.0+cpu): ``FakeTensorMode(allow_non_fake_inputs=True)``
makes fake ``cuda:0`` tensors and raises the device-mismatch error when a CPU tensor meets one, but
``torch.tensor(data, device="cuda")``, ``arange`` on CUDA and even ``x[:, None]`` of a fake CUDA
tensor raise "PyTorch is not linked with support for cuda devices" on a CPU-only build, transformers'
Llama rotary embedding enters ``torch.autocast("cuda")``, and sampling reads values that fake tensors
do not have. The strict-device mode is the proof on this machine; ``bench/gpu_check.py`` on a GPU.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from devices import DEVICE
from strict_device import PACKAGE, StrictDevice

from diagnostics.engine import generate_batch
from diagnostics.engine.drafting import NgramDrafter
from diagnostics.heads.layout import load_head, make_head
from diagnostics.models import early_exit_model
from diagnostics.tiny import tiny_llama

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6], [1, 2, 3], [4, 4, 4]]
CHAIN_RULES = ["lossless", "lenience:0.5", "cascade:0.3", "typical:0.2"]
TREE_RULES = ["lossless", "lenience:0.5", "lossless", "lenience:0.3"]


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(3, vocab=12, layers=4, device=DEVICE)
    other = tiny_llama(4, vocab=12, layers=2, device=DEVICE)
    folder = tempfile.mkdtemp()
    heads = {kind: load_head(kind, str(make_head(kind, target, f"{folder}/{kind}")), target) for kind in ("eagle3", "medusa")}
    return target, other, heads


def _setups(target, other, heads) -> dict[str, tuple[object, dict, list[str]]]:
    exit_draft = early_exit_model(target, 2)
    return {
        "plain": (None, {}, CHAIN_RULES),
        "early-exit chain": (exit_draft, {}, CHAIN_RULES),
        "model drafter, draft stop": (other, {"draft_stop": 0.3}, CHAIN_RULES),
        "n-gram": ("ngram:2", {}, CHAIN_RULES),
        "tree 2,2,1": (exit_draft, {"tree": "2,2,1"}, TREE_RULES),
        "sampled-children tree": (other, {"tree": "2,2", "tree_children": "sample"}, ["lossless"] * 4),
        "budget tree": (exit_draft, {"tree_budget": 4, "tree_depth": 3}, TREE_RULES),
        "EAGLE-3 chain": (heads["eagle3"], {"gamma": 3}, CHAIN_RULES),
        "Medusa tree": (heads["medusa"], {"tree": "2,1"}, TREE_RULES),
    }


@pytest.mark.device_free  # it runs its own mode, to report every place at once
def test_no_setup_makes_a_tensor_without_a_device(models) -> None:
    target, other, heads = models
    mode = StrictDevice()
    for name, (draft, settings, rules) in _setups(target, other, heads).items():
        with mode:
            runs = generate_batch(target, draft, PROMPTS, rules, [0, 1, 2, 3], max_new_tokens=6, eos_token_id=[], **settings)
        assert all(run.status == "complete" and len(run.tokens) == 6 for run in runs), name
    assert mode.places == {}, mode.report()


# The planted bug: the n-gram drafter's laws built on the host (what stopped n-gram drafting on
# the first GPU). Compiled under a file name inside diagnostics/, as the real drafter's code is.
PLANTED_SOURCE = '''
import torch

def propose(self, committed, count, draw, vocab, eos):
    yield from ()
    tokens = self._lookup(committed, count)
    laws = torch.zeros(len(tokens), vocab, dtype=torch.float64)
    for index, token in enumerate(tokens):
        laws[index, token] = 1.0
    return tokens, laws
'''


@pytest.mark.device_free  # the negative control plants exactly what the fixture fails on
def test_a_drafter_that_builds_its_laws_on_the_host_is_caught(models, monkeypatch) -> None:
    target, _, _ = models
    planted_file = PACKAGE + "engine/planted_host_laws.py"
    namespace: dict = {}
    exec(compile(PLANTED_SOURCE, planted_file, "exec"), namespace)
    monkeypatch.setattr(NgramDrafter, "propose", namespace["propose"])
    mode = StrictDevice()
    with mode:
        # The per-row programs call the drafter's ``propose`` (the tensor program looks n-grams up itself),
        # as they do for any drafter object.
        generate_batch(target, "ngram:2", PROMPTS, "lossless", [0, 1, 2, 3], max_new_tokens=6, eos_token_id=[], core="reference")
    assert mode.places == {"diagnostics/engine/planted_host_laws.py:7": "zeros"}, mode.report()
    # Code outside diagnostics/ (a test's own tensors) is not the engine's business.
    with StrictDevice() as outside:
        torch.zeros(3)
    assert outside.places == {}


def test_strict_device_is_on_for_this_test(strict_device) -> None:
    """The autouse fixture is active: a factory without a device called from diagnostics/ is recorded."""
    assert isinstance(strict_device, StrictDevice)
    assert Path(PACKAGE).name == "diagnostics"


def _factories_bound_by_name(source: str) -> list[str]:
    """``line name`` of each torch factory that ``source`` binds itself (``from torch import zeros``,
    ``zeros = torch.zeros``): the strict-device mode wraps factories only where they are looked up."""
    import ast

    from strict_device import CONSTRUCTORS

    names = {getattr(factory, "__name__", "") for factory in CONSTRUCTORS}
    bound = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            bound += [f"{node.lineno} {alias.name}" for alias in node.names if alias.name in names]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr in names \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "torch":
            bound.append(f"{node.lineno} {node.value.attr}")
    return bound


def test_no_module_binds_a_factory_under_another_name() -> None:
    """No module under ``diagnostics/`` binds a factory itself, so none escapes the mode; a planted
    module that does is found (the negative control)."""
    escapes = {path.name: _factories_bound_by_name(path.read_text(encoding="utf-8")) for path in Path(PACKAGE).rglob("*.py")}
    assert {name: lines for name, lines in escapes.items() if lines} == {}
    planted = "import torch\nfrom torch import nn, zeros\nmake = torch.arange\n"
    assert _factories_bound_by_name(planted) == ["2 zeros", "3 arange"]


@pytest.mark.device_free  # it checks that torch's own factories come back when the last mode ends
def test_the_mode_is_undone_and_watches_only_its_thread() -> None:
    """Leaving the last mode restores torch's own factories; another thread's tensors are not recorded."""
    import threading

    original = torch.zeros
    mode = StrictDevice()
    with mode:
        assert torch.zeros is not original
        place = PACKAGE + "engine/planted_thread.py"
        namespace: dict = {}
        exec(compile("import torch\ndef make():\n    return torch.zeros(2)\n", place, "exec"), namespace)
        worker = threading.Thread(target=namespace["make"])
        worker.start(), worker.join()
        assert mode.places == {}
        namespace["make"]()
        assert mode.places == {"diagnostics/engine/planted_thread.py:3": "zeros"}
    assert torch.zeros is original
