"""Running untrusted generated code: a separate Python process with time, memory, file-size and
process limits, in a fresh temporary folder, with no network.

Never in the dashboard's (or the CLI's) own process. The child gets an empty environment, runs
in isolated mode (``python -I``), and before the program starts it is placed in a new network
namespace when the system allows it (root, or unprivileged user namespaces); otherwise the
socket module is disabled inside the child, which stops the ordinary ways of opening a
connection. The temporary folder is removed afterwards, whatever the program did.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
TIME_LIMIT_S = 10.0
MEMORY_LIMIT_MB = 1024

# Run first inside the child: no sockets, whatever the namespace gave us.
_PRELUDE = '''
import socket as _socket

def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the sandbox")

for _name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
    setattr(_socket, _name, _no_network)
del _socket, _name
'''


@dataclass(frozen=True)
class Outcome:
    """``passed``: the program exited 0 within the limits; ``reason``: why not, in a few words."""

    passed: bool
    reason: str


def _limits(memory_mb: int, seconds: float):
    def apply() -> None:  # runs in the child, before exec
        import resource

        os.setsid()
        memory = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 2**20, 16 * 2**20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.unshare(CLONE_NEWNET)  # no network interfaces at all, when permitted
        except OSError:
            pass

    return apply


def run_program(source: str, time_limit_s: float = TIME_LIMIT_S, memory_mb: int = MEMORY_LIMIT_MB) -> Outcome:
    """Run ``source`` in a sandboxed child process; passed iff it exits 0 within the limits."""
    with tempfile.TemporaryDirectory(prefix="speclab-sandbox-") as folder:
        program = Path(folder) / "program.py"
        program.write_text(_PRELUDE + "\n" + source, encoding="utf-8")
        try:
            result = subprocess.run(
                [sys.executable, "-I", "-S", str(program)], cwd=folder, env={"PATH": "/usr/bin:/bin", "HOME": folder},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=time_limit_s,
                preexec_fn=_limits(memory_mb, time_limit_s), close_fds=True,
            )
        except subprocess.TimeoutExpired as expired:
            _kill_group(expired)
            return Outcome(False, f"timed out after {time_limit_s:g} s")
        if result.returncode == 0:
            return Outcome(True, "passed")
        last = (result.stderr or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
        if result.returncode < 0:
            return Outcome(False, f"killed by signal {-result.returncode} (a limit was hit)")
        return Outcome(False, last[0][:200])


def _kill_group(expired: subprocess.TimeoutExpired) -> None:
    """``subprocess.run`` killed the child; its session (anything it spawned) goes too."""
    import signal

    process = getattr(expired, "process", None)
    if process is not None and process.pid:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
