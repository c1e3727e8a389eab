"""The finding page docs/findings/llama-server-speculative-length-limit: its standalone reproduction
(repro.py) and its fix (fix.patch).

* Everyday tier (each well under a second): repro.py imports the standard library only and refuses
  bad paths in one line (exit 3); fix.patch is a well-formed unified diff of tools/server/server.cpp
  that moves the decoded count into the emission loop (a corrupted copy is refused by the same check);
  and, where the llama.cpp 4227c9be4 sources are at hand ($LLAMA_CPP_SOURCE: a llama.cpp folder, or
  $LLAMA_CPP_PYTHON_SDIST: the llama-cpp-python 0.3.16 sdist), the patch applies to them exactly.
* Slow tier (about 60-90 s on 2 cores): repro.py against the built llama-server
  ($LLAMA_SERVER, else data/llama.cpp/bin/llama-server from tools/build-llama-server.sh); its verdict
  must be the one recorded for that build: BROKEN for llama.cpp 4227c9be4 as the sdist ships it,
  OK for the same sources with fix.patch (the build's VERSION file says "patched with fix.patch").
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from finding_checks import apply_hunks, imported_roots, parse_patch

ROOT = Path(__file__).resolve().parents[1]
FINDING = ROOT / "docs" / "findings" / "llama-server-speculative-length-limit"
REPRO = FINDING / "repro.py"
PATCH = FINDING / "fix.patch"
VERSIONS = FINDING / "versions.json"
SERVER_CPP = "tools/server/server.cpp"
# sha256 of tools/server/server.cpp at llama.cpp 4227c9be4 (llama-cpp-python 0.3.16's vendor/llama.cpp)
SERVER_CPP_SHA256 = "31c754d33e5c82ee1d5c264527496364a329213b851db1ae17abb2adec77eccf"

def speculative_loop(source: str) -> str:
    """The text of server.cpp's speculative step: from the sample-and-accept call to the end of its
    emission loop (the SLT_DBG that follows it)."""
    start = source.index("common_sampler_sample_and_accept_n(slot.smpl, ctx, draft)")
    end = source.index('"accepted %d/%d draft tokens', start)
    return source[start:end]


def sources_server_cpp() -> str | None:
    """tools/server/server.cpp of the 4227c9be4 sources, where they are at hand."""
    folder = os.environ.get("LLAMA_CPP_SOURCE")
    if folder and (Path(folder) / SERVER_CPP).is_file():
        return (Path(folder) / SERVER_CPP).read_text(encoding="utf-8")
    sdist = os.environ.get("LLAMA_CPP_PYTHON_SDIST")
    if sdist and Path(sdist).is_file():
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                if member.isfile() and member.name.endswith("/vendor/llama.cpp/" + SERVER_CPP):
                    return archive.extractfile(member).read().decode("utf-8")
    return None


def test_repro_imports_only_the_standard_library():
    """Everyday (<0.1 s): the reproduction is standalone: every import is a standard-library module."""
    imported = imported_roots(REPRO) - {"__future__"}
    assert imported and imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_repro_refuses_a_missing_server_in_one_line(tmp_path):
    """Everyday (~0.1 s): a path that is not a file is one line on stderr and exit 3, no traceback."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    finished = subprocess.run([sys.executable, str(REPRO), str(tmp_path / "no-such-server"), str(gguf)],
                              capture_output=True, text=True, timeout=30)
    assert finished.returncode == 3
    assert finished.stderr.count("\n") == 1 and "no-such-server" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_fix_patch_is_a_well_formed_diff_of_server_cpp():
    """Everyday (<0.1 s): fix.patch changes tools/server/server.cpp only, its hunk counts add up, and
    it moves ``n_decoded`` from the step (``+= ids.size()``) into the emission loop (``+= 1``)."""
    [(path, hunks)] = parse_patch(PATCH.read_text(encoding="utf-8")).items()
    assert path == SERVER_CPP
    removed = [text.strip() for hunk in hunks for tag, text in hunk["lines"] if tag == "-"]
    added = [text.strip() for hunk in hunks for tag, text in hunk["lines"] if tag == "+" and not text.strip().startswith("//")]
    assert removed == ["slot.n_decoded += ids.size();"]
    assert [line for line in added if line] == ["slot.n_decoded += 1;"]


def test_a_corrupted_patch_is_refused():
    """Everyday (<0.1 s), negative control of the check above: a hunk that lost a line, and a patch
    of another file, are refused."""
    text = PATCH.read_text(encoding="utf-8")
    lost_line = "\n".join(line for line in text.splitlines() if "slot.n_draft_accepted" not in line) + "\n"
    with pytest.raises(ValueError, match="no diff tag"):  # the next hunk's header read as its body
        parse_patch(lost_line)
    with pytest.raises(ValueError, match="counts"):  # the last hunk cut short
        parse_patch("\n".join(text.splitlines()[:-1]) + "\n")
    assert SERVER_CPP not in parse_patch(text.replace("tools/server/server.cpp", "tools/server/utils.hpp"))


def test_fix_patch_applies_to_the_4227c9be4_sources():
    """Everyday (~1 s with the sdist, read from its archive): the patch applies exactly to server.cpp
    of llama.cpp 4227c9be4, and afterwards the speculative step counts one token per emitted token,
    before its stop checks. Skipped without the sources ($LLAMA_CPP_SOURCE or $LLAMA_CPP_PYTHON_SDIST)."""
    source = sources_server_cpp()
    if source is None:
        pytest.skip("no llama.cpp 4227c9be4 sources: set LLAMA_CPP_SOURCE=<vendor/llama.cpp folder> or "
                    "LLAMA_CPP_PYTHON_SDIST=<llama_cpp_python-0.3.16.tar.gz> (pip download --no-deps --no-binary :all: "
                    "llama-cpp-python==0.3.16)")
    import hashlib

    assert hashlib.sha256(source.encode()).hexdigest() == SERVER_CPP_SHA256, "these sources are not llama.cpp 4227c9be4"
    before = speculative_loop(source)
    assert "slot.n_decoded += ids.size();" in before  # the bug, as the page describes it
    hunks = parse_patch(PATCH.read_text(encoding="utf-8"))[SERVER_CPP]
    after = speculative_loop(apply_hunks(source, hunks))
    assert "slot.n_decoded += ids.size();" not in after
    loop = after[after.index("for (size_t i = 0; i < ids.size(); ++i)"):]
    assert loop.index("slot.n_decoded += 1;") < loop.index("process_token(result, slot)")


def built_server() -> Path | None:
    """$LLAMA_SERVER, else the build script's data/llama.cpp/bin/llama-server, where it exists."""
    configured = os.environ.get("LLAMA_SERVER")
    path = Path(configured) if configured else ROOT / "data" / "llama.cpp" / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def expected_verdict(server: Path) -> str | None:
    """What repro.py must say of ``server``: from its build's VERSION file (the build script's),
    'OK' for a build patched with fix.patch, else the result versions.json records for its commit."""
    version_file = server.parent.parent / "VERSION"
    if not version_file.is_file():
        return None
    recorded = version_file.read_text(encoding="utf-8", errors="replace")
    if "patched with fix.patch" in recorded:
        return "OK"
    match = re.search(r"llama\.cpp commit ([0-9a-f]{7,40})", recorded)
    if not match:
        return None
    for row in json.loads(VERSIONS.read_text(encoding="utf-8"))["versions"]:
        if row["llama_cpp_commit"][:9] == match.group(1)[:9] and not row.get("patched"):
            return row["result"]
    return None


@pytest.mark.slow
def test_repro_against_the_built_server(tmp_path):
    """Slow (about 60-90 s on 2 cores): repro.py against the built llama-server, the embedded GGUF
    as target and draft; its verdict must be the one recorded for that build (BROKEN for 4227c9be4
    as shipped, OK with fix.patch). Skipped when no llama-server is built."""
    server = built_server()
    if server is None:
        pytest.skip("no llama-server built: run tools/build-llama-server.sh (10-25 min on 2 cores) or set LLAMA_SERVER")
    expected = expected_verdict(server)
    if expected is None:
        pytest.skip(f"{server}: its build's VERSION names no commit recorded in {VERSIONS.name}; run repro.py by hand")
    from diagnostics.models import embedded_gguf_path

    figures = tmp_path / "figures.json"
    finished = subprocess.run([sys.executable, str(REPRO), str(server), str(embedded_gguf_path()), "--json", str(figures)],
                              capture_output=True, text=True, timeout=600)
    verdict = finished.stdout.strip().splitlines()[-1] if finished.stdout.strip() else ""
    assert verdict == expected, finished.stdout[-2000:] + finished.stderr[-2000:]
    assert finished.returncode == {"OK": 0, "BROKEN": 1}[expected]
    result = json.loads(figures.read_text())
    assert result["draft_tokens"]["accepted"] > 0  # speculation ran, so OK means something
    if expected == "BROKEN":
        assert result["sampled"]["short"] + result["greedy"]["short"] > 0
