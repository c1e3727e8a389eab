"""Escape attempts against the HumanEval checker, run through the path a sweep uses
(``prompts.humaneval_outcome`` → ``humaneval_program`` → ``sandbox.run_program``).

Each attack is a model "reply": a code block with the attack, then HumanEval/0's canonical
solution. The attack returns True when it got out (read a secret, reached the host, ...); a
contained attack raises ``SystemExit`` before the solution, so **the check passes exactly when the
attack escaped**. The canonical solution alone passes, so a failed check is the sandbox holding,
not the sandbox failing to run anything. Some attacks are judged from outside as well: a marker
file, a daemon still alive, a connection or a signal that reached this process, this process's
memory.

Run as a script (``python sandbox_attacks.py sandbox|naive|unfiltered OUT.json``) so that this process's
environment holds a secret from its start (``/proc/PID/environ`` shows only that). ``naive`` replaces the sandbox by a plain child process, as the project had
before (the negative control: each attack it runs must get out there, proving the attack works).
``unfiltered`` is the sandbox without its seccomp filter (the control for the attacks that only
the filter stops: ``UNFILTERED_CONTROL``). The host's shared memory (``Shmem`` of
``/proc/meminfo``: memfds, SysV segments and tmpfs) is sampled during each check.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECRET_VARIABLE = "SPECLAB_ATTACK_SECRET"
TASK = "HumanEval/0"
TIME_LIMIT_S = 3.0
SLOW_ATTACKS = {"sysv_shm_hoard": 10.0}  # its own time limit: first-touch pages are slow on a loaded VM
HOARD_MB = 768  # what the hoarding attacks hold: 1.5 times the sandbox's 512 MB address-space limit

# name → (attack body returning True when it escaped, also run under the naive control).
# {marker}, {database}, {port}, {pid}, {secret}, {token}, {megabytes}, {hoard_mb}, {nr} are filled in.
ATTACKS: dict[str, tuple[str, bool]] = {
    "stderr_1gb": ("""
import sys
block = "x" * (1 << 20)
for _ in range({megabytes}):
    sys.stderr.write(block)
sys.stderr.write("\\n")
raise SystemExit("wrote it all")
""", True),
    "read_shadow": ("""
try:
    return len(open("/etc/shadow").read()) > 0
except OSError:
    return False
""", True),
    "read_database": ("""
try:
    return open({database!r}, "rb").read(4096).find(b"DUCK") >= 0
except OSError:
    return False
""", True),
    "read_parent_environ": ("""
import os
for name in os.listdir("/proc"):
    try:
        if {secret!r}.encode() in open(f"/proc/{{name}}/environ", "rb").read():
            return True
    except OSError:
        pass
return False
""", True),
    "write_outside": ("""
try:
    with open({marker!r}, "w") as handle:
        handle.write("escaped")
    return True
except OSError:
    return False
""", True),
    "fill_the_disk": ("""
import os
written = 0
block = b"x" * (1 << 20)
for folder in (".", "/", "/sandbox", "/usr/lib", "/dev", "/proc"):
    for index in range(200):
        try:
            with open(os.path.join(folder, f"fill{{index}}"), "wb") as handle:
                for _ in range(8):
                    handle.write(block)
                    written += len(block)
        except OSError:
            break
        if written >= 96 << 20:
            return True
return False
""", True),
    "signal_the_parent": ("""
import os, signal
try:
    os.kill({pid}, signal.SIGUSR1)
    return True
except OSError:
    return False
""", True),
    "socket_connect": ("""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    return True
except OSError:
    return False
""", True),
    "_socket_connect": ("""
import _socket
try:
    raw = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    raw.settimeout(2)
    raw.connect(("127.0.0.1", {port}))
    return True
except OSError:
    return False
""", True),
    "ctypes_connect": ("""
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)
if fd < 0:
    return False
address = struct.pack("=H", 2) + struct.pack("!H", {port}) + bytes([127, 0, 0, 1]) + bytes(8)
return libc.connect(fd, address, len(address)) == 0
""", True),
    "double_fork_daemon": ("""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", {token!r}])
    os._exit(0)
os.wait()
return True
""", True),
    "subprocess_and_fork": ("""
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", {token!r}])
pid = os.fork()
if pid == 0:
    import time
    time.sleep(120)
    os._exit(0)
return True
""", False),
    "fork_bomb": ("""
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""", False),
    "many_processes": ("""
import os, time
started = 0
for _ in range(64):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        started += 1
    except OSError:
        break
return started >= 32
""", False),
    "infinite_recursion": ("""
import sys
sys.setrecursionlimit(10 ** 8)
def deeper(depth):
    return deeper(depth + 1) + 1
deeper(0)
return True
""", False),
    "ignore_sigterm": ("""
import os, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    pass
""", False),
    "memory_bomb": ("""
try:
    hoard = bytearray(8 << 30)
    return True
except MemoryError:
    return False
""", False),
    # Shared memory is not address space: without the seccomp filter memfds held 960 MB against a
    # 512 MB RLIMIT_AS (16 MB each, the file-size limit, under the open-file limit). Held a moment,
    # so the host's Shmem is sampled while it lasts.
    "memfd_hoard": ("""
import os, time
hoard = []
try:
    for _ in range({hoard_mb} // 16):
        hoard.append(os.memfd_create("hoard"))
        os.posix_fallocate(hoard[-1], 0, 16 << 20)
except OSError:
    return False
time.sleep(0.5)
return True
""", True),
    # The same through SysV shared memory: each segment attached (within the limit), filled and
    # detached; detached segments keep their pages. Not under the naive control: there they would
    # outlive the process in the host's IPC namespace.
    "sysv_shm_hoard": ("""
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
libc.shmdt.argtypes = [ctypes.c_void_p]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
segment = 256 << 20
for _ in range({hoard_mb} // 256):
    identifier = libc.shmget(0, segment, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if identifier < 0:
        return False
    address = libc.shmat(identifier, None, 0)
    if address is None or address == ctypes.c_void_p(-1).value:
        return False
    if libc.madvise(address, segment, 23) != 0:  # MADV_POPULATE_WRITE: the pages, without a Python loop
        ctypes.memset(address, 1, segment)
    libc.shmdt(address)
time.sleep(0.5)
return True
""", False),
    # A 32-bit system call by int 0x80 (another syscall table, unseen by a 64-bit filter): the
    # filter kills the process.
    "i386_syscall": ("""
import ctypes, mmap, platform
if platform.machine() != "x86_64":
    return False
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20 (i386 getpid); int 0x80; ret
getpid = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
return getpid() > 0
""", True),
}

# Denied system calls, each with arguments that make the kernel itself answer without EPERM (EFAULT,
# EINVAL, EBADF, ENOSYS or success): EPERM means the filter answered. {nr[name]}: this machine's number.
SYSCALL_PROBES = {
    "io_uring_setup": "{nr[io_uring_setup]}, 0, None",  # NULL params: EFAULT
    "io_uring_enter": "{nr[io_uring_enter]}, -1, 0, 0, 0, None, 0",  # EBADF
    "bpf": "{nr[bpf]}, 9999, None, 0",  # no such command: EINVAL
    "ptrace": "{nr[ptrace]}, 0, 0, 0, 0",  # PTRACE_TRACEME: succeeds
    "process_vm_readv": "{nr[process_vm_readv]}, os.getpid(), None, 0, None, 0, 0",  # nothing to read: 0
    "userfaultfd": "{nr[userfaultfd]}, 1",  # UFFD_USER_MODE_ONLY: a descriptor
    "perf_event_open": "{nr[perf_event_open]}, None, 0, -1, -1, 0",  # NULL attributes: EFAULT
    "keyctl": "{nr[keyctl]}, 9999, 0, 0, 0, 0",  # no such operation: EOPNOTSUPP
    "unshare": "{nr[unshare]}, 0",  # nothing to unshare: succeeds
    "setns": "{nr[setns]}, -1, 0",  # EBADF
    "memfd_secret": "{nr[memfd_secret]}, 0",  # a descriptor, or ENOSYS where secret memory is off
    "socket": "{nr[socket]}, 2, 1, 0",  # AF_INET, SOCK_STREAM: a socket (the sandbox's own network namespace)
    "socketpair": "{nr[socketpair]}, 1, 1, 0, None",  # AF_UNIX, NULL result: EFAULT
    "mq_open": "{nr[mq_open]}, None, 0, 0, None",  # NULL name: EFAULT
    "io_setup": "{nr[io_setup]}, 1, None",  # NULL context: EFAULT
    "statmount": "{nr[statmount]}, None, None, 0, 0",  # NULL request: EFAULT, or ENOSYS before Linux 6.8
    "listmount": "{nr[listmount]}, None, None, 0, 0",  # the same
}
if platform.machine() == "x86_64":
    SYSCALL_PROBES["x32_getpid"] = "0x40000000 | 39"  # getpid by the x32 ABI: ENOSYS, or a pid where x32 is on
for _name, _arguments in SYSCALL_PROBES.items():
    ATTACKS[f"syscall_{_name}"] = ("""
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
result = libc.syscall(*[ctypes.c_long(value or 0) for value in (""" + _arguments + """,)])
return result >= 0 or ctypes.get_errno() != 1
""", True)

# The second control: the sandbox as it was before its seccomp filter (a filter that allows all),
# for the attacks on what only the filter stops.
UNFILTERED_CONTROL = {"memfd_hoard", "sysv_shm_hoard", "i386_syscall", *(f"syscall_{name}" for name in SYSCALL_PROBES)}


def reply(body: str, values: dict[str, object]) -> str:
    """A fenced reply: the attack in a function, its verdict, then the canonical solution."""
    from diagnostics.evaluation.prompts import humaneval_problems

    problem = humaneval_problems()[TASK]
    attack = "\n".join("    " + line for line in body.format(**values).strip().splitlines())
    return (f"```python\ndef _attack():\n{attack}\n\nif not _attack():\n    raise SystemExit('contained')\n\n"
            f"{problem['prompt']}{problem['canonical_solution']}```\n")


def naive_run_program(source: str, time_limit_s: float = 10.0, memory_mb: int = 0):
    """The control: a plain child process in a temporary folder (what the project had before,
    without even its limits)."""
    from diagnostics.evaluation.sandbox import Outcome

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "program.py"
        path.write_text(source, encoding="utf-8")
        try:
            result = subprocess.run([sys.executable, "-I", "-S", str(path)], cwd=folder, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            return Outcome(False, "timed out")
    return Outcome(result.returncode == 0, (result.stderr or b"").decode(errors="replace")[-200:])


def survivors(token: str) -> list[int]:
    """Processes of this machine whose command line holds ``token`` or runs a sandboxed program."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            command = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in command or b"/sandbox/program.py" in command:
            found.append(int(name))
    return found


def shmem_mb() -> float:
    """This machine's shared memory now (memfds, SysV segments, tmpfs pages), in MB."""
    for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no Shmem line in /proc/meminfo")


def shmem_left_behind(baseline: float, wait_s: float = 5.0) -> float:
    """Shared memory over ``baseline`` that a finished check leaves on this machine, waiting up to
    ``wait_s`` for it to go (a dead IPC namespace frees its segments from a kernel work queue)."""
    deadline = time.monotonic() + wait_s
    while (left := shmem_mb() - baseline) >= 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


class ShmemPeak:
    """Samples ``shmem_mb`` every 10 ms from ``start`` to ``stop``; ``rise`` is its peak over the start."""

    def __init__(self) -> None:
        self.baseline = self.peak = shmem_mb()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, shmem_mb())
            time.sleep(0.01)

    def stop(self) -> float:
        self.running = False
        self.thread.join()
        return self.peak - self.baseline


class Listener:
    """A TCP server on this machine's loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            connection.close()


def main(mode: str, output: str, names: list[str]) -> None:
    import diagnostics.evaluation.sandbox as sandbox
    from diagnostics.evaluation.prompts import humaneval_outcome
    from diagnostics.store import Store

    if mode == "naive":
        sandbox.run_program = naive_run_program
    elif mode == "unfiltered":  # the sandbox before its filter: one that allows every call
        sandbox.seccomp_filter = lambda: sandbox._instruction(sandbox._BPF_RETURN, value=sandbox._SECCOMP_RET_ALLOW)
    signals = []
    signal.signal(signal.SIGUSR1, lambda *_: signals.append(1))
    listener = Listener()
    folder = Path(tempfile.mkdtemp(prefix="speclab-attacks-"))
    database = Store(folder / "secret.duckdb").path
    results = {}
    for name in names:
        body, in_naive = ATTACKS[name]
        if mode == "naive" and not in_naive or mode == "unfiltered" and name not in UNFILTERED_CONTROL:
            continue
        token = f"speclab-attack-{name}-{os.getpid()}"
        marker = folder / f"marker-{name}"
        values = {"marker": str(marker), "database": str(database), "port": listener.port, "pid": os.getpid(),
                  "secret": os.environ[SECRET_VARIABLE], "token": token,
                  "megabytes": 1024 if mode == "sandbox" else 256, "hoard_mb": HOARD_MB,
                  "nr": sandbox.SYSCALL_TABLES.get(platform.machine(), (0, {}))[1]}
        accepted, received = listener.accepted, len(signals)
        tracemalloc.start()  # this process's allocations during the check: what it keeps of the output
        shmem = ShmemPeak()
        started = time.monotonic()
        outcome = humaneval_outcome(TASK, reply(body, values), time_limit_s=SLOW_ATTACKS.get(name, TIME_LIMIT_S))
        elapsed = time.monotonic() - started
        shmem_rise = shmem.stop()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        time.sleep(0.2)  # a signal or connection in flight arrives
        alive = survivors(token)
        shmem_left = shmem_left_behind(shmem.baseline)
        for pid in alive:  # the control leaves them: clean up
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        results[name] = {"passed": outcome.passed, "reason": outcome.reason, "seconds": round(elapsed, 2),
                         "marker": marker.exists(), "survivors": len(alive), "connections": listener.accepted - accepted,
                         "signals": len(signals) - received, "peak_mb": peak / 2**20,
                         "shmem_mb": round(shmem_rise, 1), "shmem_left_mb": round(shmem_left, 1)}
    Path(output).write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1], sys.argv[2], sys.argv[3:] or list(ATTACKS))
