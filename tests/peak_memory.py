"""Peak resident memory of a probe subprocess, measured so the parent's size cannot leak in.

`getrusage(RUSAGE_SELF).ru_maxrss` is kept across fork and execve on Linux: a child started by a
large pytest process reports the parent's high-water mark (2.3 GB late in the full suite) however
little it used itself, which made a bounded test fail and a growth test blind. The kernel's VmHWM
in /proc/self/status belongs to the address space, which execve makes fresh.
"""

PEAK_RSS_SOURCE = (
    "def peak_rss():\n"
    "    # VmHWM is this process's own address space's high-water mark, in kB\n"
    "    with open('/proc/self/status') as status:\n"
    "        return next(int(line.split()[1]) * 1024 for line in status if line.startswith('VmHWM:'))\n"
)
