"""The HumanEval checker's sandbox: every escape attempt of ``sandbox_attacks`` fails or is
contained, each attack gets out of a plain child process (the negative control), and those only
the seccomp filter stops get out of the sandbox without it (the second control); HumanEval's
canonical solutions and ordinary programs still run, and where bubblewrap is missing or refused,
or there is no system call table for this machine, nothing runs."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sandbox_attacks import ATTACKS, SECRET_VARIABLE, SLOW_ATTACKS, TIME_LIMIT_S, UNFILTERED_CONTROL

import diagnostics.evaluation.sandbox as sandbox
from diagnostics.evaluation.prompts import humaneval_problems, score
from diagnostics.evaluation.sandbox import SandboxUnavailable

ATTACK_SCRIPT = Path(__file__).resolve().parent / "sandbox_attacks.py"


def require_sandbox() -> None:
    """Skip where bubblewrap cannot run (fail under ``REQUIRE_SANDBOX=1``, as CI sets)."""
    problem = sandbox.sandbox_problem()
    if problem is None:
        return
    if os.environ.get("REQUIRE_SANDBOX") == "1":
        pytest.fail(problem)
    pytest.skip(problem)


@contextlib.contextmanager
def sandbox_turn() -> Iterator[None]:
    """Hold this machine's one turn at running sandboxed programs for tests. The attacks count the
    sandboxed programs left on the machine after each check, so a test in another pytest-xdist
    worker that runs one at the same time would be counted as an escape."""
    with open(Path(tempfile.gettempdir()) / "speclab-sandbox-tests.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_attacks(mode: str, folder: Path) -> dict[str, dict]:
    output = folder / f"{mode}.json"
    env = {**os.environ, SECRET_VARIABLE: f"speclab-secret-{os.getpid()}"}
    with sandbox_turn():
        subprocess.run([sys.executable, str(ATTACK_SCRIPT), mode, str(output)], env=env, check=True, timeout=400)
    return json.loads(output.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def attacks(tmp_path_factory) -> dict[str, dict]:
    require_sandbox()
    return _run_attacks("sandbox", tmp_path_factory.mktemp("attacks"))


@pytest.fixture(scope="module")
def control(tmp_path_factory) -> dict[str, dict]:
    return _run_attacks("naive", tmp_path_factory.mktemp("control"))


@pytest.fixture(scope="module")
def unfiltered(tmp_path_factory) -> dict[str, dict]:
    require_sandbox()
    return _run_attacks("unfiltered", tmp_path_factory.mktemp("unfiltered"))


# Attacks whose program passes the check on purpose (what they try is judged from outside).
PASS_ON_PURPOSE = {"double_fork_daemon", "subprocess_and_fork"}


@pytest.mark.slow  # slow tier: the whole escape battery in the sandbox (about 25 s, once per run)
@pytest.mark.parametrize("name", list(ATTACKS))
def test_every_escape_attempt_fails_or_is_contained(name: str, attacks: dict[str, dict]) -> None:
    """Nothing reaches this machine: no marker file outside, no process left when the check returns
    (pass or fail), no connection to its loopback, no signal to the caller, its memory bounded, its
    shared memory no more than the private /tmp and none left behind."""
    result = attacks[name]
    assert not result["marker"] and result["survivors"] == 0, result
    assert result["connections"] == 0 and result["signals"] == 0, result
    assert result["peak_mb"] < 16, result  # 1 GB of error output is drained, not kept
    assert result["shmem_mb"] < sandbox.TMPFS_MB + 16 and result["shmem_left_mb"] < 16, result
    assert result["seconds"] < SLOW_ATTACKS.get(name, TIME_LIMIT_S) + 3, result  # the wall-clock limit holds
    if name == "stderr_1gb":
        assert result["reason"] == "wrote it all", result  # the tail was kept: the last line says why
    elif name in ("memfd_hoard", "sysv_shm_hoard"):  # refused at once: the host's memory never rose
        assert result["reason"] == "contained" and result["shmem_mb"] < 16, result
    elif name == "i386_syscall":  # a foreign system call table: the filter kills the process
        assert result["reason"] == "killed by signal 31 (a system call the sandbox forbids)", result
    elif name.startswith("syscall_"):  # the filter answered EPERM, before the kernel could
        assert result["reason"] == "contained", result
    elif name not in PASS_ON_PURPOSE:
        assert not result["passed"], result


@pytest.mark.slow  # slow tier: the battery's control in plain child processes (about 16 s)
@pytest.mark.parametrize("name", [name for name, (_, in_naive) in ATTACKS.items() if in_naive])
def test_each_attack_gets_out_of_a_plain_child_process(name: str, control: dict[str, dict]) -> None:
    """The negative control: without the sandbox, each attack does what it tries, so its failure
    under the sandbox is the sandbox's doing."""
    result = control[name]
    if name == "read_shadow" and os.geteuid() != 0:
        pytest.skip("only root reads /etc/shadow, even without a sandbox")
    evidence = {"stderr_1gb": result["peak_mb"] > 200, "write_outside": result["marker"],
                "memfd_hoard": result["shmem_mb"] > sandbox.MEMORY_LIMIT_MB,
                "double_fork_daemon": result["survivors"] > 0, "signal_the_parent": result["signals"] > 0,
                "socket_connect": result["connections"] > 0, "_socket_connect": result["connections"] > 0,
                "ctypes_connect": result["connections"] > 0}
    assert evidence.get(name, result["passed"]), result


@pytest.mark.slow  # slow tier: the battery without the system-call filter (about 12 s)
@pytest.mark.parametrize("name", sorted(UNFILTERED_CONTROL))
def test_what_the_filter_stops_gets_out_of_the_sandbox_without_it(name: str, unfiltered: dict[str, dict]) -> None:
    """The second control: the sandbox as it was before its seccomp filter (rlimits, namespaces)
    lets shared memory past the 512 MB address-space limit and these system calls reach the
    kernel; so their failure above is the filter's doing. The private IPC namespace still frees
    the SysV segments when the check ends."""
    result = unfiltered[name]
    if name in ("memfd_hoard", "sysv_shm_hoard"):
        assert result["shmem_mb"] > sandbox.MEMORY_LIMIT_MB, result
        assert result["shmem_left_mb"] < 16, result
    else:
        assert result["passed"], result


def _run_filter(program: bytes, arch: int, number: int) -> int:
    """What a classic-BPF seccomp program returns for one call: a small interpreter of the four
    instructions it may use (any other fails the test)."""
    data = struct.pack("=iIQ6Q", number, arch, 0, *[0] * 6)  # struct seccomp_data
    instructions = [struct.unpack_from("=HBBI", program, offset) for offset in range(0, len(program), 8)]
    accumulator, counter = 0, 0
    while True:
        code, jump_true, jump_false, value = instructions[counter]
        counter += 1
        if code == 0x20:
            accumulator = struct.unpack_from("=I", data, value)[0]
        elif code in (0x15, 0x35):
            taken = accumulator == value if code == 0x15 else accumulator >= value
            counter += jump_true if taken else jump_false
        elif code == 0x06:
            return value
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def test_the_filter_denies_the_listed_calls_and_allows_the_rest(monkeypatch) -> None:
    """For each architecture: every denied call answers EPERM, ordinary calls (read, write, mmap,
    clone, execve, exit_group) are allowed, a foreign architecture is killed, and on x86_64 the
    x32 numbers are denied."""
    ordinary = {"x86_64": [0, 1, 9, 56, 59, 231], "aarch64": [63, 64, 222, 220, 221, 94]}
    for machine, (arch, numbers) in sandbox.SYSCALL_TABLES.items():
        monkeypatch.setattr(sandbox.platform, "machine", lambda machine=machine: machine)
        program = sandbox.seccomp_filter()
        assert len(program) % 8 == 0 and len(program) // 8 < 256
        assert set(numbers) == set(sandbox.DENIED_SYSCALLS)
        for name in sandbox.DENIED_SYSCALLS:
            assert _run_filter(program, arch, numbers[name]) == 0x00050001, (machine, name)
        for number in ordinary[machine]:
            assert _run_filter(program, arch, number) == 0x7FFF0000, (machine, number)
        assert _run_filter(program, 0x40000003, 20) == 0x80000000  # AUDIT_ARCH_I386: killed
        x32_getpid = _run_filter(program, arch, 0x40000000 | 39)
        assert x32_getpid == (0x00050001 if machine == "x86_64" else 0x7FFF0000), machine


@pytest.mark.parametrize("machine, header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                             ("x86_64", "/usr/include/asm/unistd_64.h"),
                                             ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_syscall_numbers_match_the_kernel_headers(machine: str, header: str) -> None:
    """The table's numbers are the kernel's (aarch64 uses the generic table), where the headers are
    installed; a call the headers do not know yet (statmount and listmount are Linux 6.8's) must be
    numbered past all they define (a misspelt name with an old number fails)."""
    if not Path(header).exists():
        pytest.skip(f"{header} is not installed")
    defined = {name: int(number) for name, number in
               re.findall(r"#define __NR_(\w+)\s+(\d+)", Path(header).read_text(encoding="utf-8"))}
    table = sandbox.SYSCALL_TABLES[machine][1]
    assert set(table) == set(sandbox.DENIED_SYSCALLS)
    assert {name: number for name, number in table.items() if name in defined} == {
        name: defined[name] for name in sandbox.DENIED_SYSCALLS if name in defined}
    assert all(table[name] > max(defined.values()) for name in set(table) - set(defined)), set(table) - set(defined)


def test_an_unknown_architecture_runs_nothing(fresh_probe, monkeypatch, tmp_path: Path) -> None:
    """No system call table for this machine: one line saying so, and the program never runs
    (rather than running unfiltered)."""
    marker = tmp_path / "ran"
    monkeypatch.setattr(sandbox.platform, "machine", lambda: "riscv64")
    with pytest.raises(SandboxUnavailable) as error:
        sandbox.run_program(f"open({str(marker)!r}, 'w').write('ran')")
    assert "no system call table for this riscv64 (64-bit) interpreter" in str(error.value)
    assert "\n" not in str(error.value) and not marker.exists()


def test_denied_calls_fail_with_eperm_and_ordinary_programs_run_as_before() -> None:
    """A program calling ``os.memfd_create`` fails with the errno (a failed check, not a dead
    sandbox); one that prints, writes and reads /tmp, starts a thread and a child process and
    imports standard modules passes; one that raises fails with its exception's line."""
    require_sandbox()
    memfd = sandbox.run_program("import os\nos.memfd_create('hoard')\n")
    assert memfd == sandbox.Outcome(False, "PermissionError: [Errno 1] Operation not permitted")
    ordinary = """
import collections, hashlib, itertools, json, math, os, re, subprocess, sys, threading
print("hello")
with open("/tmp/scratch.txt", "w") as handle:
    handle.write(json.dumps({"squares": [n * n for n in range(5)]}))
assert json.loads(open("/tmp/scratch.txt").read())["squares"][-1] == 16
worker = threading.Thread(target=lambda: hashlib.sha256(b"x").hexdigest())
worker.start(); worker.join()
child = subprocess.run([sys.executable, "-I", "-S", "-c", "print(6 * 7)"], capture_output=True, text=True)
assert child.stdout.strip() == "42", child
assert math.isclose(math.pi, 3.14159, rel_tol=1e-5) and re.fullmatch(r"a+", "aaa")
"""
    assert sandbox.run_program(ordinary) == sandbox.Outcome(True, "passed")
    assert sandbox.run_program(ordinary + "raise ValueError('wrong answer')\n") == sandbox.Outcome(
        False, "ValueError: wrong answer")


# Calls generated code never needs, made the way a program would, with this architecture's numbers
# written out here (independently of the sandbox's table) where there is no library function. Each
# succeeds or fails with another errno when the kernel itself answers, so EPERM is the filter's.
_UNNEEDED_CALLS = """
import ctypes, errno, os, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
numbers = {"x86_64": {"io_setup": 206, "statmount": 457, "listmount": 458},
           "aarch64": {"io_setup": 0, "statmount": 457, "listmount": 458}}[platform.machine()]

def raw(name, *arguments):
    result = libc.syscall(ctypes.c_long(numbers[name]), *[ctypes.c_long(value) for value in arguments])
    if result < 0:
        raise OSError(ctypes.get_errno(), name)

def mq_open():
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    if libc.mq_open(b"/speclab-queue", os.O_CREAT | os.O_RDWR, 0o600, None) < 0:
        raise OSError(ctypes.get_errno(), "mq_open")

context = ctypes.c_ulong(0)
calls = {"socket": lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
         "socketpair": lambda: socket.socketpair(socket.AF_UNIX),
         "mq_open": mq_open,
         "io_setup": lambda: raw("io_setup", 1, ctypes.addressof(context)),
         "statmount": lambda: raw("statmount", 0, 0, 0, 0),  # NULL request: EFAULT, or ENOSYS before Linux 6.8
         "listmount": lambda: raw("listmount", 0, 0, 0, 0),
         "pipe": os.pipe}  # the control: an ordinary call still works
answers = []
for name, call in calls.items():
    try:
        call()
        answers.append(name + ":ok")
    except OSError as error:
        answers.append(name + ":" + errno.errorcode.get(error.errno, str(error.errno)))
raise SystemExit(" ".join(answers))
"""


def test_sockets_message_queues_aio_and_mount_queries_fail_with_eperm() -> None:
    """Everyday tier (one sandbox run, about 0.1 s): socket(AF_INET) and socketpair(AF_UNIX) (socket
    buffers are kernel memory outside every limit of the sandbox: loopback pairs held the host's
    TCP memory at its hard limit), a POSIX message queue, an AIO context and the mount queries
    (statmount/listmount name the host's folders) all fail with EPERM; a pipe is still made."""
    require_sandbox()
    with sandbox_turn():
        outcome = sandbox.run_program(_UNNEEDED_CALLS)
    assert outcome == sandbox.Outcome(False, "socket:EPERM socketpair:EPERM mq_open:EPERM io_setup:EPERM "
                                             "statmount:EPERM listmount:EPERM pipe:ok"), outcome


# What the sandbox must not show of this machine: given the host's paths, the program reports
# those it finds in its mount table, root folder, interpreter paths and module search path.
_HOST_VIEW = """
import json, os, sys
try:
    with open("/proc/self/mountinfo") as handle:
        mounts = handle.read()
except OSError:  # no /proc: nothing to read
    mounts = ""
top = sorted(os.listdir("/"))
seen = "\\n".join([mounts, *("/" + name for name in top), os.getcwd(), sys.executable, sys.prefix, sys.base_prefix,
                  *sys.path])
raise SystemExit(json.dumps({{"leaked": [path for path in {host_paths!r} if path in seen], "top": top}}))
"""


def _host_paths() -> list[str]:
    """This machine's paths that the sandbox must not show: the project, the virtual environment,
    the interpreter's real installation, the sandbox's staging folders, the home folders."""
    project = Path(__file__).resolve().parents[1]
    executable = Path(os.path.realpath(sys.executable))
    paths = {str(project), sys.prefix, os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
             str(executable.parent), os.path.join(tempfile.gettempdir(), "speclab-sandbox-"), str(Path.home()),
             "/home", "/work", "/root"}
    return sorted(paths - {"/", "/usr"})  # a system interpreter's; the sandbox binds /usr/lib where it is


def test_the_sandbox_shows_no_host_paths() -> None:
    """Everyday tier (one sandbox run and one plain child, about 0.2 s): inside the sandbox, the
    mount table (``/proc/self/mountinfo``, where there is one), the root folder's listing and the
    interpreter's own paths name none of this machine's folders (the project, the virtual
    environment, the interpreter's real installation, the staging folder, /home, /work, /root,
    the home folder). The control: the same program in a plain child process (in the project)
    finds them."""
    require_sandbox()
    program = _HOST_VIEW.format(host_paths=_host_paths())
    with sandbox_turn():
        outcome = sandbox.run_program(program)
    assert not outcome.passed, outcome
    view = json.loads(outcome.reason)
    assert view["leaked"] == [], view
    assert set(view["top"]) <= {"dev", "lib", "lib32", "lib64", "sandbox", "tmp", "usr"}, view
    project = Path(__file__).resolve().parents[1]
    plain = subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True, text=True, timeout=30,
                           cwd=project)
    assert json.loads(plain.stderr.strip().splitlines()[-1])["leaked"], plain.stderr


def test_canonical_humaneval_solutions_pass_in_the_sandbox() -> None:
    """All 164 canonical solutions pass as a fenced reply (the sweep's path); a sample also as a
    bare body continuing the prompt; wrong ones fail; the code never runs in this process."""
    require_sandbox()
    problems = humaneval_problems()
    assert len(problems) == 164

    def check(task_id: str) -> tuple[str, float]:
        problem = problems[task_id]
        return task_id, score({"type": "humaneval", "task_id": task_id},
                              "Sure:\n```python\n" + problem["prompt"] + problem["canonical_solution"] + "```\n")

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [task_id for task_id, value in pool.map(check, problems) if value != 1.0]
    assert not failed, failed
    for task_id in list(problems)[::20]:
        problem = problems[task_id]
        checker = {"type": "humaneval", "task_id": task_id}
        assert score(checker, problem["canonical_solution"]) == 1.0, task_id
        wrong = f"```python\ndef {problem['entry_point']}(*args, **kwargs):\n    return None\n```"
        assert score(checker, wrong) == 0.0, task_id
    outcome = sandbox.run_program("import os\nraise SystemExit(f'pid {os.getpid()} uid {os.getuid()}')")
    assert not outcome.passed and outcome.reason.startswith("pid ") and outcome.reason.endswith("uid 65534")
    assert outcome.reason != f"pid {os.getpid()} uid 65534"


@pytest.fixture
def fresh_probe():
    sandbox.sandbox_problem.cache_clear()
    yield
    sandbox.sandbox_problem.cache_clear()


def test_without_bubblewrap_nothing_runs(fresh_probe, monkeypatch, tmp_path: Path) -> None:
    """Missing, or refused (no user namespaces): one line saying how to enable it; never an
    unisolated run, and a HumanEval score raises rather than reading as a failed answer."""
    marker = tmp_path / "ran"
    program = f"open({str(marker)!r}, 'w').write('ran')"
    monkeypatch.setattr(sandbox, "BWRAP", "bwrap-not-installed")
    with pytest.raises(SandboxUnavailable) as error:
        sandbox.run_program(program)
    assert "'bwrap-not-installed' is not on PATH" in str(error.value) and "apt-get install bubblewrap" in str(error.value)
    assert "\n" not in str(error.value)
    with pytest.raises(SandboxUnavailable):
        score({"type": "humaneval", "task_id": "HumanEval/0"}, "```python\n" + program + "\n```")

    sandbox.sandbox_problem.cache_clear()
    folder = Path(tempfile.mkdtemp(prefix="speclab-fake-bwrap-"))  # a folder uid 65534 may enter, as bwrap's would be
    folder.chmod(0o755)
    refusing = folder / "bwrap-refusing"
    refusing.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n", encoding="utf-8")
    refusing.chmod(0o755)
    monkeypatch.setenv("PATH", f"{refusing.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(sandbox, "BWRAP", refusing.name)
    with pytest.raises(SandboxUnavailable) as error:
        sandbox.run_program(program)
    assert "refused to start a sandbox here (bwrap: No permissions to creating new namespace)" in str(error.value)
    assert "user namespaces" in str(error.value) and "\n" not in str(error.value)
    assert not marker.exists()
