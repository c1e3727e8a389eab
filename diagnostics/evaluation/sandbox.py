"""Running untrusted generated code (a HumanEval reply and its tests): only inside bubblewrap.

bubblewrap (``bwrap``, the sandbox Flatpak uses) builds the child an empty world of its own:

* namespaces: a new user namespace (the child is uid/gid 65534 there, with no capability, and
  may not create further user namespaces), PID (only its own processes), network (loopback
  only, so no route anywhere; and it may not make sockets, below), IPC, UTS, cgroup and mount;
* files: bwrap's own root, read-only, holding only ``/dev``, ``/tmp``, ``/sandbox``, ``/usr`` (and
  ``/lib*``); the interpreter's installation bound read-only at ``INTERPRETER_HOME``
  (``/sandbox/python``, whatever its real folder), the C libraries it loads (``/usr/lib``,
  ``/usr/lib64``, ``/lib*``) where they are; the program, a read-only file; a private ``/tmp`` tmpfs of
  ``TMPFS_MB``, the only writable place. No ``/etc``, no home, no project, no database, and no
  ``/proc``: its ``mountinfo`` names each bound folder's real path (the kernel prints a bind
  mount's root as its path within its filesystem, which no binding changes), as do statmount and
  listmount, denied below. So the program's mount points, paths, ``sys.path`` and tracebacks name
  no folder of this machine; what the interpreter's own files hold (pyenv's RUNPATH in the
  executable, the build prefix in ``sysconfig``) they still hold;
* an empty environment (``PATH``, ``HOME``, ``LANG``, and ``LD_LIBRARY_PATH`` where a
  ``libpython`` beside the standard library is linked by its real path) and ``python -I -S``;
* limits set inside, before the program starts (so they count only the sandbox's processes):
  CPU seconds, address space, file size, open files, processes, no core file;
* a seccomp filter (classic BPF built here, handed to bwrap by ``--seccomp``): the calls in
  ``DENIED_SYSCALLS`` fail with EPERM: memfds and SysV shared memory, messages and semaphores
  (memory that is not address space: memfds held 960 MB against the 512 MB limit), sockets
  (socket, socketpair: their buffers are kernel memory too, which loopback TCP pairs sending
  unread took to the host's 2,250 MB TCP limit; so asyncio's event loop, which makes a
  socketpair for itself, does not start), POSIX message queues, io_uring and native AIO
  (io_setup, io_submit: contexts count against the host-wide fs.aio-max-nr), bpf,
  perf_event_open, userfaultfd, ptrace and process_vm_readv/writev, pidfd_getfd,
  process_madvise, the keyring, kernel modules and kexec, mounts and the mount queries
  (statmount, listmount), unshare/setns and open_by_handle_at. A call through another
  architecture's table (``int 0x80``) kills the process; x86_64's x32 numbers fail. Without a
  table for this machine nothing runs. So the sandbox's memory is bounded by address space
  (``MEMORY_LIMIT_MB`` per process, at most ``PROCESS_LIMIT`` processes) plus its ``/tmp``
  (``TMPFS_MB``; ``/dev`` and so ``/dev/shm`` are read-only); the kernel objects left (pipes,
  eventfds, the inodes of many empty files) are bounded only by the open-file limit, the
  kernel's per-user limits (pipe buffers: pipe-user-pages-soft) and the wall clock;
* ``--die-with-parent`` and ``--new-session``; on the wall-clock limit the sandbox's outer process is
  killed, which kills its PID namespace, so nothing the program forked survives the check,
  pass or fail (also when the program exits first: the namespace ends with it).

When this process is root, bwrap itself runs as the unprivileged uid 65534 (``nobody``): a small
helper first binds the interpreter where that uid can reach it (a staging folder under the
temporary folder, which the sandbox never sees), in a private mount namespace, then drops to it
and starts bwrap. The parent reads at most ``OUTPUT_LIMIT`` bytes of the child's
error output (the rest is drained and dropped; standard output is discarded).

Where bubblewrap is missing or cannot create its namespaces, nothing runs: ``SandboxUnavailable``
says, in one line, how to enable it. There is no unisolated fallback.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BWRAP = "bwrap"  # looked up on PATH
SANDBOX_UID = 65534  # nobody
TIME_LIMIT_S = 10.0
MEMORY_LIMIT_MB = 512  # address space per process
PROCESS_LIMIT = 8  # processes (and threads) of the sandbox's uid inside its user namespace
FILE_LIMIT_MB = 16  # largest file the program may write
TMPFS_MB = 64  # the whole writable /tmp
OPEN_FILES = 64
OUTPUT_LIMIT = 8192  # bytes of the child's error output kept (its tail: the last line says why)
PROGRAM = "/sandbox/program.py"
# Where the sandbox sees the interpreter's installation, whatever its real folder: a fixed path, so
# the program's mount table, paths and tracebacks say nothing of this machine's layout.
INTERPRETER_HOME = "/sandbox/python"
HOW_TO_ENABLE = ("install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) and allow "
                 "unprivileged user namespaces (sysctl user.max_user_namespaces > 0; on Debian "
                 "kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 an AppArmor profile that lets bwrap use them)")

# System calls the sandboxed program may not make: each fails with EPERM (a Python ``OSError``), so
# the program sees an ordinary error rather than being killed. Grouped by why.
DENIED_SYSCALLS: tuple[str, ...] = (
    # memory outside the address-space limit (shmem, SysV IPC and kernel objects are not address
    # space: a memfd held 960 MB against a 512 MB RLIMIT_AS)
    "memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semctl", "userfaultfd",
    # sockets: their buffers are kernel memory too (seven processes' loopback TCP pairs, sending
    # unread, held the host's TCP memory at its 2,250 MB hard limit), and a checker needs none. Every
    # socket starts from one of these two (no socketcall on x86_64/aarch64; io_uring is denied too).
    "socket", "socketpair",
    # POSIX message queues (kernel memory, bounded only by RLIMIT_MSGQUEUE; Python never uses them)
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    # kernel engines a checker never needs, and the usual ways into kernel bugs; native AIO contexts
    # also count against the host's system-wide fs.aio-max-nr, which one program could use up
    "io_uring_setup", "io_uring_enter", "io_uring_register", "io_setup", "io_submit", "bpf", "perf_event_open",
    # other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise",
    # the kernel keyring (not namespaced)
    "keyctl", "add_key", "request_key",
    # kernel code
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    # mounts and namespaces (bwrap has built the sandbox's; Python never calls these itself);
    # statmount/listmount (Linux 6.8) would name each bound folder's host path, as mountinfo does
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "unshare", "setns", "statmount", "listmount",
    # files by handle, around the path checks
    "open_by_handle_at",
)

# Their numbers, per architecture: (AUDIT_ARCH_* of <linux/audit.h>, {name: number}). Checked against
# the kernel headers (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h, which it uses), and
# by a test wherever those headers are installed; calls newer than the headers (statmount and
# listmount, 457 and 458 on both since Linux 6.8) against the kernel's syscall tables.
SYSCALL_TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "msgget": 68,
        "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semget": 64, "semop": 65, "semtimedop": 220, "semctl": 66,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
        "perf_event_open": 298, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
        "process_madvise": 440, "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176, "mount": 165,
        "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "unshare": 272, "setns": 308,
        "open_by_handle_at": 304, "socket": 41, "socketpair": 53, "mq_open": 240, "mq_unlink": 241,
        "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245, "io_setup": 206,
        "io_submit": 209, "statmount": 457, "listmount": 458}),
    "aarch64": (0xC00000B7, {
        "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197,
        "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "semget": 190, "semop": 193, "semtimedop": 192,
        "semctl": 191, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "bpf": 280, "perf_event_open": 241, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "pidfd_getfd": 438, "process_madvise": 440, "keyctl": 219, "add_key": 217, "request_key": 218,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "unshare": 97,
        "setns": 268, "open_by_handle_at": 265, "socket": 198, "socketpair": 199, "mq_open": 180, "mq_unlink": 181,
        "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185, "io_setup": 0,
        "io_submit": 2, "statmount": 457, "listmount": 458}),
}

# Classic BPF (<linux/filter.h>, <linux/seccomp.h>): the instructions and return values used.
_BPF_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = seccomp_data[k]
_BPF_JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_JUMP_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_BPF_RETURN = 0x06  # BPF_RET | BPF_K
_SECCOMP_DATA_NR = 0  # offsets in struct seccomp_data
_SECCOMP_DATA_ARCH = 4
_SECCOMP_RET_KILL_PROCESS = 0x80000000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_ALLOW = 0x7FFF0000
_EPERM = 1
_X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers


def _syscall_table() -> tuple[int, dict[str, int]]:
    """This machine's audit architecture and syscall numbers; ``SandboxUnavailable`` where there is
    no table (an unfiltered sandbox would let a memfd past the memory limit)."""
    machine = platform.machine()
    if machine not in SYSCALL_TABLES or struct.calcsize("P") != 8:
        raise SandboxUnavailable(f"generated code runs only inside bubblewrap with a seccomp filter, which has no "
                                 f"system call table for this {machine or 'unknown'} ({struct.calcsize('P') * 8}-bit) "
                                 f"interpreter: run checks on x86_64 or aarch64 with a 64-bit Python")
    return SYSCALL_TABLES[machine]


def _instruction(code: int, jump_true: int = 0, jump_false: int = 0, value: int = 0) -> bytes:
    """One ``struct sock_filter`` {u16 code; u8 jt; u8 jf; u32 k}, in this machine's byte order."""
    return struct.pack("=HBBI", code, jump_true, jump_false, value)


def seccomp_filter() -> bytes:
    """The compiled filter bwrap installs before the program starts: a foreign architecture (e.g.
    32-bit calls by ``int 0x80``) kills the process; x32 numbers and ``DENIED_SYSCALLS`` fail with
    EPERM; everything else is allowed."""
    audit_arch, numbers = _syscall_table()
    denied = [numbers[name] for name in DENIED_SYSCALLS]
    checks = ([(_BPF_JUMP_AT_LEAST, _X32_SYSCALL_BIT)] if audit_arch == SYSCALL_TABLES["x86_64"][0] else [])
    checks += [(_BPF_JUMP_EQUAL, number) for number in denied]
    program = [_instruction(_BPF_LOAD_WORD, value=_SECCOMP_DATA_ARCH),
               _instruction(_BPF_JUMP_EQUAL, 1, 0, audit_arch),
               _instruction(_BPF_RETURN, value=_SECCOMP_RET_KILL_PROCESS),
               _instruction(_BPF_LOAD_WORD, value=_SECCOMP_DATA_NR)]
    for index, (code, value) in enumerate(checks):
        program.append(_instruction(code, len(checks) - index, 0, value))  # true: past the rest and ALLOW, to DENY
    program += [_instruction(_BPF_RETURN, value=_SECCOMP_RET_ALLOW),
                _instruction(_BPF_RETURN, value=_SECCOMP_RET_ERRNO | _EPERM)]
    return b"".join(program)


# Inside the sandbox: set the limits on itself, then become the program (rlimits survive exec).
_LAUNCHER = """\
import os, resource, sys
limits = [int(value) for value in sys.argv[1:7]]
kinds = (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE,
         resource.RLIMIT_NPROC, resource.RLIMIT_CORE)
for kind, value in zip(kinds, limits):
    resource.setrlimit(kind, (value, value))
os.execv(sys.executable, [sys.executable, "-I", "-S", sys.argv[7]])
"""

# Run as root, before bwrap: bind the interpreter where uid 65534 can reach it (in a mount
# namespace of this helper alone), drop to that uid, and become bwrap.
_DROP_HELPER = """\
import ctypes, json, os, sys
plan = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
def check(result, what):
    if result != 0:
        raise SystemExit("sandbox: " + what + ": " + os.strerror(ctypes.get_errno()))
check(libc.unshare(0x00020000), "a private mount namespace")
check(libc.mount(None, b"/", None, 0x4000 | 0x40000, None), "private mounts")
for source, staging in plan["binds"]:
    check(libc.mount(source.encode(), staging.encode(), None, 0x1000 | 0x4000, None), "binding " + source)
os.setgroups([])
os.setgid(plan["uid"])
os.setuid(plan["uid"])
os.execv(plan["argv"][0], plan["argv"])
"""


class SandboxUnavailable(RuntimeError):
    """Generated code cannot run here: bubblewrap is missing or refused; the message says what to do."""


@dataclass(frozen=True)
class Outcome:
    """``passed``: the program exited 0 within the limits; ``reason``: why not, in a few words."""

    passed: bool
    reason: str


def _interpreter() -> tuple[Path, Path]:
    """The real interpreter (a virtual environment's ``python`` is a link to it) and the folder
    it is installed in (its standard library lies below)."""
    executable = Path(os.path.realpath(sys.executable))
    prefix = Path(os.path.realpath(sys.base_prefix))
    if prefix not in executable.parents:
        prefix = executable.parent.parent
    return executable, prefix


def _interpreter_in_sandbox(executable: Path, prefix: Path) -> tuple[str, list[str]]:
    """The interpreter's path inside the sandbox (below ``INTERPRETER_HOME``, where its folder is
    bound) and what its environment needs for that: a ``libpython`` beside the standard library is
    found by the absolute path built into the executable (e.g. pyenv's RUNPATH), which the sandbox
    does not have, so ``LD_LIBRARY_PATH`` names the folder where the sandbox has it."""
    inside = f"{INTERPRETER_HOME}/{executable.relative_to(prefix).as_posix()}"
    if any((prefix / "lib").glob("libpython*.so*")):
        return inside, ["--setenv", "LD_LIBRARY_PATH", f"{INTERPRETER_HOME}/lib"]
    return inside, []


def _sandbox_argv(bwrap: str, prefix_source: Path, program_fd: int, filter_fd: int, time_limit_s: float,
                  memory_mb: int) -> list[str]:
    """bwrap's command line: namespaces, identity, environment, the seccomp filter (read from
    ``filter_fd``), mounts, then the launcher that sets the limits and runs the program.
    ``prefix_source``: where bwrap finds the interpreter's folder (the folder itself, or the
    helper's binding of it when bwrap runs as ``nobody``); the sandbox sees it at ``INTERPRETER_HOME``."""
    executable, prefix = _interpreter()
    interpreter, library_path = _interpreter_in_sandbox(executable, prefix)
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--die-with-parent", "--new-session", "--seccomp", str(filter_fd), "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
            *library_path]
    for name in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32"):  # the C libraries it loads
        path = Path(name)
        if path.is_symlink():  # a merged /usr: /lib is a link into /usr/lib
            argv += ["--symlink", os.readlink(name), name]
        elif path.is_dir():
            argv += ["--ro-bind", name, name]
    # No /proc: its mountinfo names each bound folder's path on this machine (the interpreter's real
    # installation), and a checker needs nothing there (its own PID namespace stays: no host process is reachable).
    argv += ["--ro-bind", str(prefix_source), INTERPRETER_HOME,
             "--dev", "/dev", "--remount-ro", "/dev",
             "--size", str(TMPFS_MB * 2**20), "--tmpfs", "/tmp", "--chdir", "/tmp",
             "--ro-bind-data", str(program_fd), PROGRAM,
             "--remount-ro", "/"]
    limits = [int(time_limit_s) + 1, memory_mb * 2**20, FILE_LIMIT_MB * 2**20, OPEN_FILES, PROCESS_LIMIT, 0]
    return argv + [interpreter, "-I", "-S", "-c", _LAUNCHER, *map(str, limits), PROGRAM]


def _command(program_fd: int, filter_fd: int, staging: Path, time_limit_s: float, memory_mb: int) -> list[str]:
    """The command that starts the sandbox: bwrap itself, or (as root) the helper that hands bwrap
    to uid 65534 with the interpreter bound under ``staging``."""
    bwrap = shutil.which(BWRAP)
    if bwrap is None:
        raise SandboxUnavailable(_not_installed())
    executable, prefix = _interpreter()
    if os.geteuid() != 0:
        return _sandbox_argv(bwrap, prefix, program_fd, filter_fd, time_limit_s, memory_mb)
    mirror = staging / "interpreter"
    mirror.mkdir()
    plan = {"binds": [[str(prefix), str(mirror)]], "uid": SANDBOX_UID,
            "argv": _sandbox_argv(bwrap, mirror, program_fd, filter_fd, time_limit_s, memory_mb)}
    return [str(executable), "-I", "-S", "-c", _DROP_HELPER, json.dumps(plan)]


def _drain(stream, keep: int, tail: bytearray) -> None:
    """Read ``stream`` to its end, keeping only its last ``keep`` bytes: the parent's memory stays
    bounded whatever the child writes, and the child never blocks on a full pipe."""
    descriptor = stream.fileno()
    while True:
        chunk = os.read(descriptor, 65536)
        if not chunk:
            return
        tail += chunk
        if len(tail) > keep:
            del tail[: len(tail) - keep]


def run_program(source: str, time_limit_s: float = TIME_LIMIT_S, memory_mb: int = MEMORY_LIMIT_MB) -> Outcome:
    """Run ``source`` with ``python -I -S`` inside the bubblewrap sandbox (see the module docstring);
    passed iff it exits 0 within ``time_limit_s`` of wall time. Raises ``SandboxUnavailable``
    where bubblewrap is missing or refused (nothing runs)."""
    check_sandbox()
    return _run(source, time_limit_s, memory_mb)


def _memory_file(name: str, data: bytes) -> int:
    """An anonymous file holding ``data``, read from its start: how bwrap is handed the program
    and the filter (it reads each descriptor to its end)."""
    descriptor = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:  # os.write may write less than asked
        view = view[os.write(descriptor, view):]
    os.lseek(descriptor, 0, os.SEEK_SET)
    return descriptor


def _run(source: str, time_limit_s: float, memory_mb: int) -> Outcome:
    compiled_filter = seccomp_filter()  # before anything is made: no table, nothing runs
    descriptors: list[int] = []
    staging = Path(tempfile.mkdtemp(prefix="speclab-sandbox-"))
    try:
        descriptors.append(program := _memory_file("speclab-program", source.encode("utf-8", "surrogatepass")))
        descriptors.append(filter_fd := _memory_file("speclab-seccomp", compiled_filter))
        staging.chmod(0o755)  # uid 65534 reaches the helper's binding of the interpreter through it
        command = _command(program, filter_fd, staging, time_limit_s, memory_mb)
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   pass_fds=(program, filter_fd), close_fds=True, start_new_session=True,
                                   env={"PATH": "/usr/bin:/bin"})
        tail = bytearray()
        reader = threading.Thread(target=_drain, args=(process.stderr, OUTPUT_LIMIT, tail), daemon=True)
        reader.start()
        try:
            status = process.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            _kill(process)  # ends the sandbox's PID namespace: nothing it started outlives the check
            reader.join(timeout=5)
            process.stderr.close()
    finally:
        for descriptor in descriptors:
            os.close(descriptor)
        shutil.rmtree(staging, ignore_errors=True)
    if status is None:
        return Outcome(False, f"timed out after {time_limit_s:g} s")
    if status == 0:
        return Outcome(True, "passed")
    lines = bytes(tail).decode("utf-8", "replace").strip().splitlines()
    if status < 0 or status > 128 and not lines:
        number = abs(status) % 128
        why = "a system call the sandbox forbids" if number == signal.SIGSYS else "a limit was hit"
        return Outcome(False, f"killed by signal {number} ({why})")
    return Outcome(False, (lines[-1] if lines else f"exit status {status}")[:200])


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the sandbox's outer process (bwrap): ``--die-with-parent`` takes its PID namespace
    with it. Then reap it."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
    process.wait()


@lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """Why generated code cannot run here, in one line, or ``None``: bubblewrap must be on PATH and
    able to start a sandbox (tried once per process with a program that checks its own uid)."""
    if shutil.which(BWRAP) is None:
        return _not_installed()
    try:
        seccomp_filter()
    except SandboxUnavailable as error:
        return str(error)
    try:
        outcome = _run(f"import os\nraise SystemExit(0 if os.getuid() == {SANDBOX_UID} else 'uid ' + str(os.getuid()))\n", 30.0,
                       MEMORY_LIMIT_MB)
    except OSError as error:
        return f"generated code runs only inside bubblewrap, which could not start ({error.strerror or error}): {HOW_TO_ENABLE}"
    if outcome.passed:
        return None
    return f"generated code runs only inside bubblewrap, which refused to start a sandbox here ({outcome.reason[:120]}): {HOW_TO_ENABLE}"


def _not_installed() -> str:
    return f"generated code runs only inside bubblewrap, and {BWRAP!r} is not on PATH: {HOW_TO_ENABLE}"


def check_sandbox() -> None:
    """Raise ``SandboxUnavailable`` (one line, how to enable it) unless generated code can run here."""
    problem = sandbox_problem()
    if problem:
        raise SandboxUnavailable(problem)
