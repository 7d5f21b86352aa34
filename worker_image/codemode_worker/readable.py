"""What the worker may still open once confined, enforced by Landlock: every file it can read,
except the device nodes under ``/dev`` and the kernel's files under ``/proc`` and ``/sys``.

The seccomp filter (``syscalls``) already refuses opening anything for writing, but it cannot look
at paths, and some read-only opens take a resource of the whole machine: ``open("/dev/ptmx",
O_RDONLY)`` allocates a pseudo-terminal from ``kernel.pty.max`` (4096 - 1024 reserved, shared by
every container of the host), so one worker holding them left every other container without a pty
(finding RS-2). ``restrict()`` puts the worker into a Landlock domain (``landlock``) that handles
every file-system right the kernel knows and grants only:

- listing any directory (``READ_DIR`` beneath ``/``);
- reading files beneath every top-level entry of ``/`` but ``/dev``, ``/proc`` and ``/sys`` (the
  interpreter, its modules, ``/etc``, ``/tmp`` ...: what the worker could read before);
- reading ``/dev/null``, ``/dev/zero``, ``/dev/random``, ``/dev/urandom``, and writing
  ``/dev/null``.

Everything else is refused with ``EACCES``: every other device node (``/dev/ptmx``, ``/dev/pts/*``,
``/dev/mqueue``, ``/dev/shm``, ``/dev/termination-log``), every file of ``/proc`` and ``/sys``
(``SYSTEM_TREES``), any write, truncation, creation, removal,
rename or link, ``ioctl`` on devices, TCP bind/connect (ABI 4) and signals to or abstract sockets of
processes outside the domain (ABI 6). A process in a domain also cannot ptrace-access one outside it:
``/proc/<host>/mem`` and another worker's memory are refused whatever the uids.

Why no file of ``/proc`` and ``/sys``: they show what the node's other tenants do, a channel between
tenants' workers on one node past every namespace. A worker's own ``numa_maps``,
``smaps`` and ``smaps_rollup`` tell how many processes map each page it maps, and a page of an image
file (or a host file, for the process runtime) is one page-cache page for every container of the
node: a worker that maps or unmaps pages of such a file sets bits another tenant's worker reads,
thousands per second (4,600 bits/s measured between two Docker containers with a Python sender,
``tests/benchmarks/bench_shared_state_channels.py``). ``/proc/stat``, ``/proc/loadavg``,
``/proc/meminfo``, ``/sys``'s device and memory counters and the like count the whole machine. The
worker reads none of them: nothing it runs needs them (glibc's and Rust's processor counts fall back
to ``sched_getaffinity``). Listing ``/proc`` (``READ_DIR``: ``/proc/self/fd``) and the descriptors
it holds stay as they were; Docker's masks (``codemode.runtimes.docker.masked_paths``) cover the same
counters where a kernel has no Landlock.

It runs first thing in the worker, while the process has **one thread** (``landlock_restrict_self``
restricts the calling thread and the threads it starts later; ``restrict`` checks the count), before
the warm-up and the uid drop (it sets ``PR_SET_NO_NEW_PRIVS``, which both allow).

Kernels without Landlock (before 5.13, Landlock not in the ``lsm=`` list, gVisor, or an engine's
profile that refuses the calls: ``landlock.Unavailable``): ``restrict`` returns None and the worker
goes on without it; the file-descriptor limit ``confinement`` sets (``OPEN_FILES_HEADROOM`` above
what the worker holds) is then what bounds the ptys a worker can take, and the host's
non-dumpable flag keeps its memory (``codemode.runtimes.process.host_memory``). **Fail closed** otherwise:
Landlock present but a rule, the restriction or the check failing ends the worker with
``confinement.EXIT_CONFINEMENT`` before any frame is read (``Failed``).
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Final

from . import landlock

__all__ = ["DEVICES", "SYSTEM_TREES", "Failed", "prepare", "restrict"]

#: The device nodes a confined worker may read (and /dev/null write).
DEVICES: Final = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
#: The top-level entries of ``/`` beneath which a confined worker reads no file (it may list them).
SYSTEM_TREES: Final = ("dev", "proc", "sys")
_PR_SET_NO_NEW_PRIVS: Final = 38


class Failed(Exception):
    """Landlock is there but the worker could not put itself into its domain."""


_LIBC: Final = ctypes.CDLL(None, use_errno=True)  # once: a template's workers inherit it


def _no_new_privs() -> None:
    if _LIBC.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), 0, 0, 0) != 0:
        raise Failed(f"PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())}")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _check() -> None:
    """The domain holds: ``/dev/ptmx`` cannot be opened (ENOENT: there is none, also fine)."""
    try:
        fd = os.open("/dev/ptmx", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.ENOENT):
            return
        raise Failed(f"opening /dev/ptmx under Landlock: {exc.strerror}") from None
    os.close(fd)
    raise Failed("/dev/ptmx can still be opened under Landlock")


def prepare() -> landlock.Ruleset | None:
    """The worker's ruleset, filled and not enforced: None when the kernel offers no Landlock.
    ``Failed`` when Landlock is there but a rule cannot be added.

    The process runtime's template fills it once and each forked worker enforces it
    (``restrict(prepared)``): the rules (a descriptor of each top-level entry of ``/`` and device)
    cost a worker about a millisecond and a half of CPU to gather and add, enforcing a filled ruleset
    almost nothing. Enforcing takes a snapshot: the domain is the rules the ruleset holds at that
    moment, and the template adds none after this. So a forked worker's domain is the one it would
    have built itself, but for a top-level entry of ``/`` created after the template started (its
    files stay unreadable to the workers until the host restarts the template)."""
    try:
        version = landlock.abi()
    except landlock.Unavailable:
        return None
    except OSError as exc:
        raise Failed(f"Landlock ABI query: {exc.strerror}") from None
    read = landlock.ACCESS_FS_READ_FILE
    try:
        rules = landlock.Ruleset(version)
        try:
            rules.allow("/", landlock.ACCESS_FS_READ_DIR)
            for entry in os.scandir("/"):
                if entry.name not in SYSTEM_TREES:
                    try:
                        rules.allow(entry.path, read | landlock.ACCESS_FS_READ_DIR)
                    except FileNotFoundError:  # a dangling link: nothing to read there
                        continue
            for device in DEVICES:
                write = landlock.ACCESS_FS_WRITE_FILE if device == os.devnull else 0
                try:
                    rules.allow(device, read | write)
                except FileNotFoundError:
                    continue
        except BaseException:
            rules.close()
            raise
    except OSError as exc:
        raise Failed(f"Landlock: {exc.strerror or exc}") from None
    return rules


def restrict(prepared: landlock.Ruleset | None = None) -> int | None:
    """Put this process into the worker's Landlock domain; the ABI version, or None when the
    kernel offers no Landlock. ``Failed`` when Landlock is there but does not hold.

    Args:
        prepared: a ruleset of :func:`prepare` (the template's, inherited across the fork): it is
            enforced and its descriptor closed; None: the ruleset is filled here first.
    """
    rules = prepare() if prepared is None else prepared
    if rules is None:
        return None
    try:
        try:
            if _threads() != 1:
                raise Failed("the process already runs more than one thread")
            _no_new_privs()
            rules.restrict_self()
        finally:
            rules.close()
    except OSError as exc:
        raise Failed(f"Landlock: {exc.strerror or exc}") from None
    _check()
    return rules.version
