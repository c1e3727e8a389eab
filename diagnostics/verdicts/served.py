"""Start a local server on a free port, wait until it answers, stop it after: the llama.cpp
servers of the verdict table and the dashboard the browser tests drive. Its output goes to a log
file, never to an unread pipe (a full pipe blocks the server on its next log line)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 120


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def served(command: Callable[[int], list[str]], log: Path, name: str, ready_path: str = "/v1/models",
           timeout_s: float = START_TIMEOUT_S, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> Iterator[str]:
    """Start ``command(port)`` (a server on 127.0.0.1 at a free port, its output to ``log``), wait
    until ``ready_path`` answers 200, yield its URL, and stop it after. A server that exits first, or
    does not answer within ``timeout_s``, is a ``RuntimeError`` naming ``name`` and the log. ``env``:
    variables set for the server on top of this process's; ``cwd``: its working folder."""
    port = free_port()
    with log.open("w") as output:
        process = subprocess.Popen(command(port), stdout=output, stderr=subprocess.STDOUT, cwd=cwd,
                                   env=None if env is None else {**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url + ready_path, timeout=2).read()
                break
            except OSError:  # refused, or an HTTP error such as 503 while the model loads
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited (status {process.returncode}); its log: {log}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not answer in {timeout_s:g} s; its log: {log}") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
