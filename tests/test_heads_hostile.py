"""Hostile head folders (issue 31): every bad ``config.json`` or weights file is one line naming what
is wrong, through the library (``load_head``) and the CLI (``run --draft KIND:DIR``, exit 2), in
bounded time and memory, with nothing written; ``make-head -o`` refuses files, links and full folders.

Negative control (before the bounds): ``medusa_num_heads: 1000000`` built a million heads before
any check (on this tiny target ~5.8 GB of float32 in minutes; 113 MB a head on the embedded
model), ``Infinity`` raised ``OverflowError``, and a head-count mismatch or an extra tensor a
``load_state_dict`` traceback: the subprocess test below would time out or find a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from diagnostics.cli import main
from diagnostics.heads import bounds
from diagnostics.heads.layout import load_head, make_head
from diagnostics.models import ModelError
from diagnostics.tiny import tiny_llama
from peak_memory import PEAK_RSS_SOURCE
from tiny_models import save_tiny_model

LAYERS = 4  # the saved CLI target's layers; the in-process target has the same sizes
ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = {"medusa": "medusa_lm_head.safetensors", "eagle3": "model.safetensors"}


# ----------------------------------------------------------------------------------------------
# Mutations of a good head folder
# ----------------------------------------------------------------------------------------------


def _config(**changes) -> Callable[[Path], None]:
    """Change (or with ``None``, drop) config.json fields."""
    def mutate(folder: Path) -> None:
        raw = json.loads((folder / "config.json").read_text())
        raw.update(changes)
        (folder / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    return mutate


def _literal(key: str, literal: str) -> Callable[[Path], None]:
    """Set ``key`` to a raw JSON literal (``Infinity``, ``1e999``, a 26-digit integer, deep nesting)."""
    def mutate(folder: Path) -> None:
        raw = json.loads((folder / "config.json").read_text())
        raw[key] = "@@LITERAL@@"
        (folder / "config.json").write_text(json.dumps(raw).replace('"@@LITERAL@@"', literal))
    return mutate


def _text(text: str) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        (folder / "config.json").write_text(text)
    return mutate


def _tensors(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    """Rewrite the weights file after ``change`` edits its tensors in place."""
    def mutate(folder: Path) -> None:
        path = next(folder / name for name in WEIGHTS.values() if (folder / name).is_file())
        state = load_file(str(path))
        change(state)
        save_file({key: value.contiguous() for key, value in state.items()}, str(path))
    return mutate


class _RunsCode:
    """Unpickled by a full unpickler, this would create ``marker``: a weights-only loader must refuse it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _pickled(name: str, payload: Callable[[dict, Path], object]) -> Callable[[Path], None]:
    """A pickled checkpoint (``torch.save``) of ``payload(state, folder)`` where the safetensors file was."""
    def mutate(folder: Path) -> None:
        path = next(folder / weights for weights in WEIGHTS.values() if (folder / weights).is_file())
        torch.save(payload(load_file(str(path)), folder), folder / name)
        path.unlink()
    return mutate


def _code(state: dict, folder: Path) -> dict:
    return {**state, "evil": _RunsCode(folder / "ran-code")}


def _garbage(folder: Path) -> None:
    next(folder / name for name in WEIGHTS.values() if (folder / name).is_file()).write_bytes(b"\xff" * 64 + b"not safetensors")


DEEP = "[" * 100_000 + "]" * 100_000

CASES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # Medusa (make-head's config: 4 heads of 1 block, hidden 32, vocabulary 12)
    "medusa inf heads": ("medusa", _literal("medusa_num_heads", "Infinity"), "Infinity is not a JSON number"),
    "medusa overflowing float": ("medusa", _literal("medusa_num_layers", "1e999"), "overflows a float"),
    "medusa 26-digit integer": ("medusa", _literal("medusa_num_heads", "1" * 26), "an integer of 26 digits"),
    "medusa million heads": ("medusa", _config(medusa_num_heads=1_000_000), "medusa_num_heads is 1000000; it must be 1 to 64"),
    "medusa huge layers": ("medusa", _config(medusa_num_layers=2**40), "medusa_num_layers is 1099511627776; it must be 0 to 64"),
    "medusa huge hidden size": ("medusa", _config(hidden_size=2**40), "hidden_size is 1099511627776 but the target's is 32"),
    "medusa huge vocabulary": ("medusa", _config(vocab_size=10**12), "vocab_size is 1000000000000 but the target's is 12"),
    "medusa fewer heads than tensors": ("medusa", _config(medusa_num_heads=3),
                                        r"holds a tensor '3\.0\.linear\.bias' that this head's config\.json has no place for"),
    "medusa more heads than tensors": ("medusa", _config(medusa_num_heads=5), r"lacks the tensor '4\.0\.linear\.weight'"),
    "medusa extra key": ("medusa", _tensors(lambda state: state.update(rogue=torch.zeros(2))), "holds a tensor 'rogue'"),
    "medusa wrong shape": ("medusa", _tensors(lambda state: state.update({"0.1.weight": torch.zeros(13, 32)})),
                           r"'0\.1\.weight' has shape \[13, 32\] but this target needs \[12, 32\]"),
    "medusa integer weights": ("medusa", _tensors(lambda state: state.update({"0.0.linear.weight": torch.zeros(32, 32, dtype=torch.int32)})),
                               "'0.0.linear.weight' is I32; it must be one of F16"),
    "medusa deep nesting": ("medusa", _literal("extra", DEEP), "JSON nested 100001 deep; at most 64 levels"),
    "medusa string count": ("medusa", _config(medusa_num_heads="4"), "medusa_num_heads is '4'; it must be a whole number"),
    "medusa fractional count": ("medusa", _config(medusa_num_heads=2.5), "medusa_num_heads is 2.5; it must be a whole number"),
    "medusa boolean count": ("medusa", _config(medusa_num_heads=True), "medusa_num_heads is True; it must be a whole number"),
    "medusa negative layers": ("medusa", _config(medusa_num_layers=-1), "medusa_num_layers is -1; it must be 0 to 64"),
    "medusa negative heads": ("medusa", _config(medusa_num_heads=-4), "medusa_num_heads is -4; it must be 1 to 64"),
    "medusa not an object": ("medusa", _text("[4, 1]"), "is not a JSON object"),
    "medusa config over 1 MiB": ("medusa", _text("{" + " " * (1 << 20) + "}"), "is over 1 MiB"),
    "medusa pickle that runs code": ("medusa", _pickled("medusa_lm_head.pt", _code), "with torch's weights-only loader"),
    "medusa pickled list": ("medusa", _pickled("medusa_lm_head.pt", lambda state, folder: list(state.values())),
                            "not a flat mapping of tensor names to tensors"),
    "medusa pickled None": ("medusa", _pickled("medusa_lm_head.pt", lambda state, folder: None),
                            "not a flat mapping of tensor names to tensors"),
    "medusa not safetensors": ("medusa", _garbage, "not a safetensors file"),
    "medusa 70,000 tensors": ("medusa", _tensors(lambda state: state.update({f"t{i}": torch.zeros(1) for i in range(70_000)})),
                              "holds 70,012 tensors; a head has at most 65,536"),
    "medusa truncated vocabulary": ("medusa", _config(truncated_vocab_size=6), "truncated vocabulary"),
    # EAGLE-3 (make-head's config: hidden 32, 4 heads of 8, 2 kv heads, MLP 64, vocabulary 12)
    "eagle3 inf rope_theta": ("eagle3", _literal("rope_theta", "-Infinity"), "-Infinity is not a JSON number"),
    "eagle3 huge intermediate": ("eagle3", _config(intermediate_size=10**12), "intermediate_size is 1000000000000; it must be 1 to 512"),
    "eagle3 huge draft vocabulary": ("eagle3", _config(draft_vocab_size=10**9), "draft_vocab_size is 1000000000; it must be 1 to 12"),
    "eagle3 huge hidden size": ("eagle3", _config(hidden_size=2**40, target_hidden_size=None),
                                "hidden_size is 1099511627776 but the target's is 32"),
    "eagle3 huge head_dim": ("eagle3", _config(head_dim=4096), "head_dim is 4096; it must be 0 to 32"),
    "eagle3 string heads": ("eagle3", _config(num_attention_heads="4"), "num_attention_heads is '4'; it must be a whole number"),
    "eagle3 negative kv heads": ("eagle3", _config(num_key_value_heads=-2), "num_key_value_heads is -2; it must be 1 to 4"),
    "eagle3 negative eps": ("eagle3", _config(rms_norm_eps=-1.0), "rms_norm_eps is -1.0; it must be above 0"),
    "eagle3 string eps": ("eagle3", _config(rms_norm_eps="1e-6"), "rms_norm_eps is '1e-6'; it must be a number"),
    "eagle3 odd head_dim": ("eagle3", _config(head_dim=7), "head_dim of 7 over 4 heads does not fit: it must be even"),
    "eagle3 taps outside": ("eagle3", _config(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 99, 1]}),
                            r"must be 3 boundaries in \[0, 4\]"),
    "eagle3 taps of strings": ("eagle3", _config(eagle_config={"eagle_aux_hidden_state_layer_ids": ["a", "b", "c"]}),
                               r"must be 3 boundaries in \[0, 4\]"),
    "eagle3 eagle_config a list": ("eagle3", _config(eagle_config=[1]), "eagle_config is list; it must be an object"),
    "eagle3 deep eagle_config": ("eagle3", _literal("eagle_config", "{\"a\":" * 5000 + "1" + "}" * 5000), "JSON nested 5001 deep"),
    "eagle3 two layers": ("eagle3", _config(num_hidden_layers=2), "one decoder layer"),
    "eagle3 no architecture": ("eagle3", _config(architectures="LlamaForCausalLM"), "does not declare LlamaForCausalLMEagle3"),
    "eagle3 draft vocabulary mismatch": ("eagle3", _config(draft_vocab_size=6),
                                         r"has shape \[12(, 32)?\] but this target needs \[6"),
    "eagle3 extra key": ("eagle3", _tensors(lambda state: state.update({"midlayer.extra.weight": torch.zeros(1)})),
                         "holds a tensor 'midlayer.extra.weight'"),
    "eagle3 wrong shape": ("eagle3", _tensors(lambda state: state.update({"fc.weight": torch.zeros(32, 95)})),
                           r"'fc\.weight' has shape \[32, 95\] but this target needs \[32, 96\]"),
    "eagle3 missing tensor": ("eagle3", _tensors(lambda state: state.pop("lm_head.weight")), "lacks the tensor 'lm_head.weight'"),
    "eagle3 float d2t": ("eagle3", _tensors(lambda state: state.update(d2t=torch.zeros(12), t2d=torch.ones(12, dtype=torch.bool))),
                         "'d2t' is F32; it must be one of I8"),
    "eagle3 d2t without t2d": ("eagle3", _tensors(lambda state: state.update(d2t=torch.zeros(12, dtype=torch.long))),
                               "lacks the tensor 't2d'"),
    "eagle3 pickle that runs code": ("eagle3", _pickled("pytorch_model.bin", _code), "with torch's weights-only loader"),
    "eagle3 pickled extra tensor": ("eagle3", _pickled("pytorch_model.bin", lambda state, folder: {**state, "stray": torch.zeros(2)}),
                                    "that this head's config.json has no place for"),
}


def _digest(folder: Path) -> dict[str, str]:
    """Every file's bytes (hashed) under ``folder``: a refused folder must stay byte-identical."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, vocab=12, layers=LAYERS, sharpness=2.0)


@pytest.fixture(scope="module")
def good(target, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("good")
    return {kind: make_head(kind, target, folder / kind, seed=1) for kind in ("eagle3", "medusa")}


@pytest.fixture(scope="module")
def hostile(good, tmp_path_factory) -> dict[str, tuple[str, Path, str]]:
    """Every case's folder: a copy of a good head with one hostile change."""
    root = tmp_path_factory.mktemp("hostile")
    folders = {}
    for index, (name, (kind, mutate, expected)) in enumerate(CASES.items()):
        folder = root / f"case{index}"
        shutil.copytree(good[kind], folder)
        mutate(folder)
        folders[name] = (kind, folder, expected)
    return folders


# ----------------------------------------------------------------------------------------------
# The library path
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_head_is_one_line_through_the_library(hostile, target, case) -> None:
    kind, folder, expected = hostile[case]
    before = _digest(folder)
    started = time.perf_counter()
    with pytest.raises(ModelError, match=expected) as refused:
        load_head(kind, str(folder), target)
    assert time.perf_counter() - started < 2.0
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 700
    assert _digest(folder) == before


def test_the_good_heads_still_load(good, target) -> None:
    """The control: the unmodified folders load, so each refusal above is the one change's."""
    for kind, folder in good.items():
        assert load_head(kind, str(folder), target).kind == kind


def test_the_memory_estimate_is_checked_before_anything_is_built(good, target, monkeypatch) -> None:
    """A head whose fields all fit the target but whose parameters exceed the bound (or the memory
    available) is refused from its config alone: the weights file is never opened."""
    opened = []
    monkeypatch.setattr(bounds, "_open", lambda path: opened.append(path))
    monkeypatch.setattr(bounds, "MAX_HEAD_BYTES", 1000)
    with pytest.raises(ModelError, match=r"would hold 5,760 parameters .* over the bound of 0\.0 GB"):
        load_head("medusa", str(good["medusa"]), target)
    monkeypatch.setattr(bounds, "MAX_HEAD_BYTES", 16 << 30)
    monkeypatch.setattr(bounds, "available_bytes", lambda: 4096)
    with pytest.raises(ModelError, match="only 0.0 GB of memory is available"):
        load_head("eagle3", str(good["eagle3"]), target)
    assert opened == []


# ----------------------------------------------------------------------------------------------
# The CLI path, in a subprocess: exit 2, one line, bounded peak memory and time, nothing stored
# ----------------------------------------------------------------------------------------------

CLI_SCRIPT = r"""
import contextlib, io, json, resource, sys, time
import torch
from diagnostics.cli import main
from diagnostics.heads.layout import load_head
from diagnostics.models import ModelError, load_model

model, db, good, cases = json.loads(sys.argv[1])
args = lambda spec: ["run", "--target", model, "--draft", spec, "--prompt", "w1 w2 w3", "--raw", "--max-new-tokens", "2",
                     "--db", db, "--no-progress"]
with contextlib.redirect_stdout(io.StringIO()):
    assert main(args("medusa:" + good["medusa"])) == 0 and main(args("eagle3:" + good["eagle3"])) == 0  # warm: every import done
target = load_model(model)
load_head("medusa", good["medusa"], target), load_head("eagle3", good["eagle3"], target)
peak = peak_rss
baseline = peak()
soft, hard = resource.getrlimit(resource.RLIMIT_DATA)  # a regression stops here instead of swapping the machine
limit = baseline + (2 << 30)
resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
results = {}
for name, (kind, folder) in cases.items():
    err = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args(kind + ":" + folder))
    cli_seconds = time.perf_counter() - started
    started = time.perf_counter()
    try:
        load_head(kind, folder, target)
        library = "loaded"
    except ModelError as error:
        library = str(error)
    results[name] = {"code": code, "stderr": err.getvalue(), "cli_seconds": cli_seconds,
                     "library": library, "library_seconds": time.perf_counter() - started}
print(json.dumps({"baseline": baseline, "peak": peak(), "results": results}))
"""


def _stored_runs(db: Path) -> int:
    from diagnostics.store import Store

    return len(Store(db).list_runs())


def test_hostile_heads_through_the_cli_are_one_line_in_bounded_memory_and_time(hostile, good, tmp_path) -> None:
    model = save_tiny_model(tmp_path / "tiny", layers=LAYERS)
    db = tmp_path / "runs.duckdb"
    before = {name: _digest(folder) for name, (_, folder, _) in hostile.items()}
    payload = json.dumps([model, str(db), {kind: str(folder) for kind, folder in good.items()},
                          {name: (kind, str(folder)) for name, (kind, folder, _) in hostile.items()}])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", PEAK_RSS_SOURCE + CLI_SCRIPT, payload], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    growth = report["peak"] - report["baseline"]
    assert growth < 64 << 20, f"peak RSS grew by {growth / 2**20:.0f} MiB over {len(CASES)} hostile heads"
    for name, (_, folder, expected) in hostile.items():
        result = report["results"][name]
        lines = result["stderr"].splitlines()
        assert result["code"] == 2 and len(lines) == 1 and lines[0].startswith("error: "), (name, result)
        assert "Traceback" not in result["stderr"] and _matches(expected, lines[0]), (name, lines)
        assert _matches(expected, result["library"]), (name, result["library"])
        assert result["cli_seconds"] < 10 and result["library_seconds"] < 2, (name, result)
        assert _digest(folder) == before[name], name
    assert _stored_runs(db) == 2  # the two warm-up runs; no hostile head stored anything
    slowest = max(report["results"].values(), key=lambda result: result["cli_seconds"])
    print(f"{len(CASES)} hostile heads: peak RSS growth {growth / 2**20:.1f} MiB; slowest CLI refusal "
          f"{slowest['cli_seconds']:.2f} s, slowest library refusal {max(r['library_seconds'] for r in report['results'].values()):.3f} s")


def _matches(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


# ----------------------------------------------------------------------------------------------
# make-head's output folder and bounds
# ----------------------------------------------------------------------------------------------


def _make(tmp_path: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["make-head", "medusa", "--target", str(tmp_path / "no-such-model"), *extra])
    return code, capsys.readouterr().err


def test_make_head_refuses_files_links_and_full_folders_in_one_line(tmp_path, capsys) -> None:
    """Checked before the target is loaded (the target here does not even exist), nothing changed."""
    existing = tmp_path / "existing.txt"
    existing.write_bytes(b"keep me")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    linked = tmp_path / "linked"
    linked.symlink_to(empty)
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("mine")
    cases = [(existing, "exists and is not a folder"), (dangling, "is a symbolic link"), (linked, "is a symbolic link"),
             (full, "exists and is not empty"), (existing / "sub", "is not a folder: give -o a path inside a folder")]
    for out, expected in cases:
        code, err = _make(tmp_path, capsys, "-o", str(out))
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and expected in err, (out, err)
    assert existing.read_bytes() == b"keep me" and os.readlink(dangling) == str(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists() and list(empty.iterdir()) == [] and os.readlink(linked) == str(empty)
    assert [path.name for path in full.iterdir()] == ["mine.txt"]
    for options, expected in ((["--heads", "1000000"], "--heads must be a whole number from 1 to 64, got 1000000"),
                              (["--heads", "0"], "from 1 to 64, got 0"), (["--layers", "-1"], "--layers must be a whole number from 0 to 64")):
        started = time.perf_counter()
        code, err = _make(tmp_path, capsys, "-o", str(tmp_path / "new"), *options)
        assert code == 2 and err.count("\n") == 1 and expected in err and time.perf_counter() - started < 2, err
    assert not (tmp_path / "new").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dangling", "empty", "existing.txt", "full", "linked"]


def test_make_head_writes_whole_or_not_at_all(target, tmp_path, monkeypatch) -> None:
    """An empty existing folder takes the head; a failing write leaves neither the folder nor a partial sibling."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sorted(path.name for path in make_head("medusa", target, empty).iterdir()) == ["config.json", "medusa_lm_head.safetensors"]
    import safetensors.torch

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(ModelError, match=r"cannot write the head to .*new \(No space left on device\)"):
        make_head("eagle3", target, tmp_path / "new")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty"]
    with pytest.raises(ModelError, match="from 1 to 64, got 65"):
        make_head("medusa", target, tmp_path / "new", medusa_heads=65)
    with pytest.raises(ModelError, match="seed must be a whole number"):
        make_head("medusa", target, tmp_path / "new", seed=2**64)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty"]
