"""What a reusable sandbox's supervisor puts back after each execute, and how it checks.

``take()`` records, once, before any worker has run, everything a worker of the same uid could
change that would outlive it: the files of every writable mount (with their extended attributes:
a worker that may write a file may also hang a ``user.*`` attribute on it, which outlives the
file's contents being emptied), the System V IPC objects of the
IPC namespace, the mount table, the supervisor's own process attributes (limits, priority,
scheduling: policy, priority and the whole ``sched_getattr``, since a custom slice of the fair
class changes none of the others; CPU affinity, I/O priority) and the cgroup's limit files.
``scrub(baseline)`` runs after each execute: it kills every process but the caller
(``kill(-1, SIGKILL)`` from PID 1 reaches every other process of the pid namespace) and reaps
them, removes every file and directory that was not there before (a regular file that was empty and
is writable is emptied again), removes every extended attribute a worker added to a file that was
there, removes every IPC object, and then verifies, from scratch, that everything equals the
baseline. It returns None when the sandbox is as it was, else one line naming the first difference
(an *anomaly*: the supervisor reports it and exits, and the host recycles the sandbox).

What it deliberately does not scrub, and why that holds:

* ``/proc`` and ``/sys`` (not walked): per-process files die with the process; the rest is
  read-only or root-owned, and the supervisor's own files are root-owned once it is not dumpable;
* POSIX message queues where no ``mqueue`` file system is visible (Docker shadows ``/dev/mqueue``):
  the supervisor starts every worker with ``RLIMIT_MSGQUEUE`` 0 (soft and hard), so no queue can be
  created at all; where one is mounted writable (Kubernetes) its entries are files and are walked;
* memory: every worker is a new process, forked from a supervisor that never holds any execute's
  data (it relays with ``splice``, docs/reference/runtimes.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import resource
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "Baseline",
    "kill_others",
    "oom_kills",
    "other_processes",
    "process_attributes",
    "sched_attributes",
    "scrub",
    "sysv_objects",
    "take",
    "writable_roots",
]

#: File systems whose writable mounts are not walked (see the module docstring).
_NOT_WALKED: Final = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "securityfs", "debugfs", "tracefs"})
#: Bounds of one walk: more is an anomaly (a worker piling up files).
MAX_ENTRIES: Final = 20_000
MAX_DEPTH: Final = 64
#: How long ``kill_others`` keeps killing and reaping before it calls what is left an anomaly.
KILL_SECONDS: Final = 5.0
SYSVIPC: Final = Path("/proc/sysvipc")
_ID_COLUMN: Final = {"shm": "shmid", "sem": "semid", "msg": "msqid"}
_IPC_RMID: Final = 0
_RLIMITS: Final = tuple(
    getattr(resource, name)
    for name in (
        "RLIMIT_AS",
        "RLIMIT_CORE",
        "RLIMIT_CPU",
        "RLIMIT_DATA",
        "RLIMIT_FSIZE",
        "RLIMIT_MEMLOCK",
        "RLIMIT_MSGQUEUE",
        "RLIMIT_NICE",
        "RLIMIT_NOFILE",
        "RLIMIT_NPROC",
        "RLIMIT_RSS",
        "RLIMIT_RTPRIO",
        "RLIMIT_RTTIME",
        "RLIMIT_SIGPENDING",
        "RLIMIT_STACK",
    )
    if hasattr(resource, name)
)
#: cgroup v1 and v2 limit files (relative to /sys/fs/cgroup) compared when present.
_CGROUP_FILES: Final = (
    "memory/memory.limit_in_bytes",
    "memory/memory.memsw.limit_in_bytes",
    "memory/memory.soft_limit_in_bytes",
    "pids/pids.max",
    "cpu/cpu.cfs_quota_us",
    "cpu/cpu.cfs_period_us",
    "cpu/cpu.shares",
    "cpuset/cpuset.cpus",
    "cpuset/cpuset.mems",
    "memory.max",
    "memory.high",
    "memory.swap.max",
    "pids.max",
    "cpu.max",
    "cpu.weight",
    "cpuset.cpus",
)
_OOM_FILES: Final = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
#: System call numbers by machine: (ioprio_get, sched_getattr).
_SYSCALLS: Final = {"x86_64": (252, 315), "aarch64": (31, 275)}
_IOPRIO_WHO_PROCESS: Final = 1
#: The buffer handed to ``sched_getattr``: the kernel fills as much of ``struct sched_attr`` as it
#: knows (56 bytes on 6.x: policy, flags, nice, priority, runtime (the fair class's slice too),
#: deadline, period, utilization clamps) and says how much in its first field.
_SCHED_ATTR_BYTES: Final = 4096

Entry = tuple[int, ...]
Attributes = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Baseline:
    """The sandbox as the supervisor found it, before any worker ran."""

    files: dict[bytes, Entry]
    #: The extended attributes (name, value) of every walked file and directory that has any.
    xattrs: dict[bytes, Attributes]
    mounts: tuple[str, ...]
    ipc: frozenset[tuple[str, int]]
    attributes: tuple[object, ...]
    cgroup: tuple[tuple[str, str], ...]


# ----------------------------------------------------------------------------------- processes


def other_processes() -> list[int]:
    """The pids in this pid namespace other than the caller's."""
    me = os.getpid()
    return sorted(int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_others(seconds: float = KILL_SECONDS) -> list[int]:
    """SIGKILL every other process of the pid namespace and reap them (the caller is PID 1, so
    orphans are its children); the pids still there after ``seconds`` (normally none)."""
    if os.getpid() != 1:  # kill(-1) from anything but PID 1 would reach the caller's whole uid
        raise RuntimeError("kill_others runs only as PID 1 of a pid namespace")
    deadline = time.monotonic() + seconds
    delay = 0.001
    while True:
        with contextlib.suppress(ProcessLookupError):  # nobody else: done once reaped
            os.kill(-1, signal.SIGKILL)
        _reap()
        left = other_processes()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


# ----------------------------------------------------------------------------------- files


def _mountinfo() -> list[list[str]]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        return [line.split() for line in fh if line.strip()]


def _unescape(field: str) -> bytes:
    """A mountinfo path field (octal escapes for space, tab, newline, backslash)."""
    raw = os.fsencode(field)
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i : i + 1] == b"\\" and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def writable_roots() -> list[bytes]:
    """Mount points of the writable mounts that are walked (every file system but proc, sysfs,
    cgroup and the kernel's debugging ones)."""
    roots = []
    for fields in _mountinfo():
        try:
            dash = fields.index("-")
        except ValueError:
            continue
        options = fields[5].split(",")
        fstype = fields[dash + 1] if dash + 1 < len(fields) else ""
        if "rw" in options and fstype not in _NOT_WALKED:
            roots.append(_unescape(fields[4]))
    return sorted(set(roots))


def _entry(st: os.stat_result) -> Entry:
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        # Devices: their times change when used (a tty); what they are is mode, owner and number.
        return (st.st_mode, st.st_uid, st.st_gid, st.st_rdev)
    return (st.st_mode, st.st_uid, st.st_gid, st.st_ino, st.st_size, st.st_mtime_ns)


class _TooMany(Exception):
    pass


class _Unwalkable(Exception):
    """A directory the supervisor may write into but not list."""


def _walk(roots: list[bytes]) -> dict[bytes, Entry]:
    """Every path under the roots (not crossing into other mounts) with what it is."""
    found: dict[bytes, Entry] = {}

    def visit(path: bytes, dev: int, depth: int) -> None:
        if len(found) > MAX_ENTRIES or depth > MAX_DEPTH:
            raise _TooMany
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if st.st_dev != dev:
            return  # another mount (walked on its own if writable)
        found[path] = _entry(st)
        if not stat.S_ISDIR(st.st_mode):
            return
        try:
            names = os.listdir(path)
        except PermissionError:
            if st.st_uid != os.geteuid():
                if os.access(path, os.W_OK):
                    raise _Unwalkable(path) from None  # a worker could hide files in it
                return  # neither readable nor writable: nothing of a worker's can be in it
            os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)  # a worker's mode-0 directory
            names = os.listdir(path)
        except FileNotFoundError:
            return
        for name in names:
            visit(os.path.join(path, name), dev, depth + 1)

    for root in roots:
        try:
            dev = os.lstat(root).st_dev
        except OSError:
            continue
        visit(root, dev, 0)
    return found


def _attributes(paths: dict[bytes, Entry]) -> dict[bytes, Attributes]:
    """The extended attributes of every regular file and directory in ``paths`` that has any (the
    only kinds a process without capabilities may give ``user.*`` attributes)."""
    found: dict[bytes, Attributes] = {}
    for path, entry in paths.items():
        if not (stat.S_ISREG(entry[0]) or stat.S_ISDIR(entry[0])):
            continue
        try:
            names = os.listxattr(path, follow_symlinks=False)
            if names:
                found[path] = tuple(sorted((n, os.getxattr(path, n, follow_symlinks=False)) for n in names))
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno in (errno.ENOTSUP, errno.ENODATA):
                continue  # no extended attributes on this file system (or gone meanwhile)
            raise
    return found


def _restore_attributes(baseline: dict[bytes, Attributes], files: dict[bytes, Entry]) -> None:
    """Remove every attribute a worker added to a file that was there before (a changed or removed
    one is left for the check to report)."""
    for path, now in _attributes(files).items():
        before = {name for name, _ in baseline.get(path, ())}
        for name, _ in now:
            if name not in before:
                with contextlib.suppress(FileNotFoundError):
                    os.removexattr(path, name, follow_symlinks=False)


def _remove(path: bytes) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
    for name in os.listdir(path):
        _remove(os.path.join(path, name))
    os.rmdir(path)


def _restore_files(baseline: dict[bytes, Entry], roots: list[bytes]) -> None:
    """Remove what was added; empty again what was an empty, writable regular file."""
    now = _walk(roots)
    for path in sorted(now, key=len, reverse=True):
        if path in baseline:
            continue
        parent = os.path.dirname(path)
        if parent in now and parent not in baseline:
            continue  # removed with its new parent
        with contextlib.suppress(FileNotFoundError):
            _remove(path)
    for path, before in baseline.items():
        after = now.get(path)
        if after is None or after == before or len(before) != 6:
            continue
        mode, _, _, ino, size, _ = before
        if stat.S_ISREG(mode) and size == 0 and after[3] == ino and after[4] != 0:
            os.truncate(path, 0)


def _same_files(baseline: dict[bytes, Entry], now: dict[bytes, Entry]) -> str | None:
    for path in sorted(set(baseline) | set(now)):
        before, after = baseline.get(path), now.get(path)
        if before == after:
            continue
        name = os.fsdecode(path)
        if before is None:
            return f"file {name!r} left behind"
        if after is None:
            return f"file {name!r} removed"
        if len(before) == 6 and stat.S_ISREG(before[0]) and before[4] == 0 and after[:5] == before[:5]:
            continue  # emptied again: only its time differs
        return f"file {name!r} changed"
    return None


# ----------------------------------------------------------------------------------- IPC


def sysv_objects(root: Path = SYSVIPC) -> list[tuple[str, int, int, int]]:
    """(kind, id, owner uid, creator uid) of every System V IPC object of this IPC namespace."""
    found = []
    for kind, id_column in _ID_COLUMN.items():
        try:
            header, *rows = (root / kind).read_text().splitlines()
        except OSError:  # no System V IPC in this kernel
            continue
        names = header.split()
        at_id, at_uid, at_cuid = names.index(id_column), names.index("uid"), names.index("cuid")
        for row in rows:
            cells = row.split()
            if len(cells) == len(names):
                found.append((kind, int(cells[at_id]), int(cells[at_uid]), int(cells[at_cuid])))
    return found


def _remove_ipc(keep: frozenset[tuple[str, int]]) -> None:
    objects = [(kind, ident) for kind, ident, _, _ in sysv_objects() if (kind, ident) not in keep]
    if not objects:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, ident in objects:
        if kind == "shm":
            libc.shmctl(ident, _IPC_RMID, None)
        elif kind == "sem":
            libc.semctl(ident, 0, _IPC_RMID)
        else:
            libc.msgctl(ident, _IPC_RMID, None)


def _ipc() -> frozenset[tuple[str, int]]:
    return frozenset((kind, ident) for kind, ident, _, _ in sysv_objects())


# ----------------------------------------------------------------------------------- attributes


def _syscall(index: int) -> int:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(f"no system call numbers for {platform.machine()}")
    return numbers[index]


def _ioprio() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    value = int(libc.syscall(_syscall(0), _IOPRIO_WHO_PROCESS, 0))
    return value if value >= 0 else -ctypes.get_errno()


def sched_attributes() -> bytes | int:
    """The caller's whole ``struct sched_attr`` as ``sched_getattr`` fills it (every field the
    kernel knows: a custom slice of the fair class shows in ``sched_runtime``, utilization clamps
    in ``sched_util_min``/``max``); the negative errno when the call fails (a sandbox whose seccomp
    profile refuses it refuses ``sched_setattr`` to every process in it as well)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(_SCHED_ATTR_BYTES)
    if libc.syscall(_syscall(1), 0, buffer, _SCHED_ATTR_BYTES, 0) != 0:
        return -ctypes.get_errno()
    size = int.from_bytes(buffer.raw[:4], sys.byteorder)
    return buffer.raw[: max(4, min(size, _SCHED_ATTR_BYTES))]


def process_attributes() -> tuple[object, ...]:
    """What another process of the same uid could change about the caller that its children
    inherit: every resource limit, the nice value, the scheduling policy and priority, every field
    of its scheduling attributes (``sched_getattr``), the CPU affinity and the I/O priority."""
    return (
        tuple(resource.getrlimit(r) for r in _RLIMITS),
        os.getpriority(os.PRIO_PROCESS, 0),
        os.sched_getscheduler(0),
        os.sched_getparam(0).sched_priority,
        sched_attributes(),
        tuple(sorted(os.sched_getaffinity(0))),
        _ioprio(),
    )


def _cgroup() -> tuple[tuple[str, str], ...]:
    values = []
    for rel in _CGROUP_FILES:
        try:
            with open(f"/sys/fs/cgroup/{rel}", encoding="ascii", errors="replace") as fh:
                values.append((rel, fh.read().strip()))
        except OSError:
            continue
    with open("/proc/self/cgroup", encoding="ascii", errors="replace") as fh:
        values.append(("membership", fh.read().strip()))
    return tuple(values)


def oom_kills() -> int:
    """The cgroup's count of OOM kills (v1 ``memory.oom_control``, v2 ``memory.events``); -1 when
    neither can be read."""
    for path in _OOM_FILES:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit():
                        return int(value)
        except OSError:
            continue
    return -1


# ----------------------------------------------------------------------------------- the whole


def take() -> Baseline:
    """The baseline (run once, before the first worker, with no other process in the sandbox)."""
    return Baseline(
        files=(files := _walk(writable_roots())),
        xattrs=_attributes(files),
        mounts=tuple(" ".join(f) for f in _mountinfo()),
        ipc=_ipc(),
        attributes=process_attributes(),
        cgroup=_cgroup(),
    )


def scrub(baseline: Baseline) -> str | None:
    """Kill, remove, verify (see the module docstring): None when the sandbox equals the baseline,
    else the first difference found."""
    left = kill_others()
    if left:
        return f"processes {left[:8]} survive SIGKILL"
    try:
        _remove_ipc(baseline.ipc)
        roots = writable_roots()
        _restore_files(baseline.files, roots)
        now = _walk(roots)
        _restore_attributes(baseline.xattrs, now)
        attributes = _attributes(now)
    except _TooMany:
        return "more files than a scrub walks"
    except _Unwalkable as exc:
        return f"directory {os.fsdecode(exc.args[0])!r} cannot be listed"
    except OSError as exc:
        return f"cannot restore the files: {exc.strerror or exc}"
    if other_processes():
        return "a process appeared during the scrub"
    problem = _same_files(baseline.files, now)
    if problem:
        return problem
    if attributes != baseline.xattrs:
        path = min(
            p for p in set(attributes) | set(baseline.xattrs) if attributes.get(p) != baseline.xattrs.get(p)
        )
        return f"extended attributes of {os.fsdecode(path)!r} changed"
    ipc = _ipc()
    if ipc != baseline.ipc:
        return f"System V IPC objects left behind: {sorted(ipc - baseline.ipc)[:8]}"
    mounts = tuple(" ".join(f) for f in _mountinfo())
    if mounts != baseline.mounts:
        changed = sorted(set(mounts) ^ set(baseline.mounts)) or ["(order)"]
        return f"the mount table changed: {changed[0][:160]}"
    if process_attributes() != baseline.attributes:
        return "the supervisor's limits, priority, scheduling attributes or affinity changed"
    if _cgroup() != baseline.cgroup:
        return "the cgroup's settings changed"
    return None
