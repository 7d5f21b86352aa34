"""Landlock (the kernel's unprivileged file-system sandbox) for the worker, over its three system calls.

``abi()`` asks the kernel which Landlock ABI it has; ``Ruleset`` handles every file-system access
right that ABI knows (so all of them are refused unless a rule grants them), TCP bind/connect from
ABI 4 and the signal and abstract-socket scopes from ABI 6; ``allow(path, access)`` grants an
access beneath one file or directory; ``restrict_self()`` puts the calling process (its threads
included, see below) into a new Landlock domain for good. A process in a domain also cannot
ptrace-access (``/proc/<pid>/mem``, ``environ``, ``ptrace``) or signal any process outside it.

Why not a library: the only Python packages for it are young and thin (PyPI's ``landlock`` is
1.0.0.dev5: it treats a stale ``errno`` as a failure of a call that succeeded, never closes its
ruleset descriptor, gives a rule on a file the directory rights (``EINVAL``), and knows neither the
network rights nor scopes); the kernel's interface, on the other hand, is three calls, fixed
structures and numbers that are the same on every architecture, kept stable by the kernel's
no-regression rule (``Documentation/userspace-api/landlock.rst``). So this module is that interface
and nothing more (ctypes, no policy): ``codemode_worker.readable`` decides what is granted.

Threads: ``landlock_restrict_self`` restricts the calling thread and the threads it starts later,
not the others; ``readable.restrict`` therefore calls it while the worker still has one thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from typing import Final

__all__ = [
    "ACCESS_FS_READ_DIR",
    "ACCESS_FS_READ_FILE",
    "ACCESS_FS_WRITE_FILE",
    "Ruleset",
    "Unavailable",
    "abi",
    "fs_rights",
]

_CREATE_RULESET: Final = 444
_ADD_RULE: Final = 445
_RESTRICT_SELF: Final = 446
_CREATE_RULESET_VERSION: Final = 1 << 0
_RULE_PATH_BENEATH: Final = 1

ACCESS_FS_EXECUTE: Final = 1 << 0
ACCESS_FS_WRITE_FILE: Final = 1 << 1
ACCESS_FS_READ_FILE: Final = 1 << 2
ACCESS_FS_READ_DIR: Final = 1 << 3
_ACCESS_FS_TRUNCATE: Final = 1 << 14
_ACCESS_FS_IOCTL_DEV: Final = 1 << 15
#: Rights a rule on a file (not a directory) may carry.
_FILE_RIGHTS: Final = ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE | _ACCESS_FS_TRUNCATE
_FS_BY_ABI: Final = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_TCP: Final = (1 << 0) | (1 << 1)  # BIND_TCP, CONNECT_TCP (ABI 4)
_SCOPES: Final = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET, SIGNAL (ABI 6)
#: What the version query's errno means when Landlock cannot be used at all.
_UNAVAILABLE: Final = {
    errno.ENOSYS: "the kernel has no Landlock (before 5.13, or a sandbox kernel such as gVisor)",
    errno.EOPNOTSUPP: "Landlock is disabled at boot (not in the kernel's lsm= list)",
    errno.EPERM: "the engine's seccomp profile refuses the Landlock calls",
}


class Unavailable(OSError):
    """This kernel (or the profile the process runs under) offers no Landlock."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _call(number: int, *args: object) -> int:
    ctypes.set_errno(0)
    result = int(_syscall(ctypes.c_long(number), *args))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def abi() -> int:
    """The kernel's Landlock ABI version (1, 2, ...); ``Unavailable`` naming why there is none."""
    try:
        return _call(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError as exc:
        reason = _UNAVAILABLE.get(exc.errno or 0)
        if reason is None:
            raise
        raise Unavailable(exc.errno, reason) from None


def fs_rights(version: int) -> int:
    """Every file-system access right ABI ``version`` knows."""
    return _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= version)]


class Ruleset:
    """A Landlock ruleset being filled; its descriptor is closed by ``restrict_self`` or ``close``."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.handled = fs_rights(version)
        attr = _RulesetAttr(
            handled_access_fs=self.handled,
            handled_access_net=_NET_TCP if version >= 4 else 0,
            scoped=_SCOPES if version >= 6 else 0,
        )
        # The full structure is always passed: a kernel of an older ABI accepts the trailing zeros.
        self.fd: int | None = _call(
            _CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0)
        )

    def allow(self, path: str, access: int) -> None:
        """Grant ``access`` beneath ``path`` (a directory) or on it (a file: only file rights are
        kept). ``OSError`` when it cannot be opened."""
        if self.fd is None:
            raise ValueError("the ruleset is closed")
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            self.allow_fd(target, access)
        finally:
            os.close(target)

    def allow_fd(self, target: int, access: int) -> None:
        """``allow`` for an open descriptor (``O_PATH`` is enough)."""
        if self.fd is None:
            raise ValueError("the ruleset is closed")
        if not stat.S_ISDIR(os.fstat(target).st_mode):
            access &= _FILE_RIGHTS
        attr = _PathBeneathAttr(allowed_access=access & self.handled, parent_fd=target)
        _call(
            _ADD_RULE,
            ctypes.c_int(self.fd),
            ctypes.c_int(_RULE_PATH_BENEATH),
            ctypes.byref(attr),
            ctypes.c_uint32(0),
        )

    def restrict_self(self) -> None:
        """Enforce the ruleset on the calling thread (and what it starts) for good; needs
        ``no_new_privs``. Closes the descriptor whatever happens."""
        if self.fd is None:
            raise ValueError("the ruleset is closed")
        try:
            _call(_RESTRICT_SELF, ctypes.c_int(self.fd), ctypes.c_uint32(0))
        finally:
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
