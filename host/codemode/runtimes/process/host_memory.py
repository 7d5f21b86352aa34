"""The host's memory is not readable by its workers: the host process is made non-dumpable.

A process-runtime worker of a host that is not root keeps the host's uid (no uid of its own to drop
to). The kernel lets a process of the same uid open another's ``/proc/<pid>/mem``, ``environ`` or
``maps`` (a ptrace access check, which the seccomp filter cannot see: it is an ``openat`` for
reading and a ``pread64``), so such a worker could read the host's whole address space: other
tenants' arguments and results in flight, tokens, upstream credentials.

``protect()`` sets ``PR_SET_DUMPABLE`` to 0 on the host process (all its threads: the flag is the
process's). The kernel then refuses every ptrace access to it from a process without
``CAP_SYS_PTRACE`` in the host's user namespace, whatever its uid: ``/proc/<host>/mem`` and the
like answer ``EACCES`` and their owner shows as root. ``ProcessRuntime`` calls it when it is created,
before it can start a worker, so every entry (the library's ``Builder``, ``codemode serve``, the
HTTP service) is covered; the flag lasts until the host exits (only an ``execve`` or a change of the
host's own uid would reset it, and the host does neither). Workers are started with ``execve`` and
so are dumpable again; each makes itself non-dumpable too (``codemode_worker.confinement``).

What it costs: no core dump of the host, and tools that attach to it as the same user (``gdb -p``,
``py-spy``, ``strace -p``) need root or ``CAP_SYS_PTRACE``.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Final

__all__ = ["dumpable", "protect"]

_PR_SET_DUMPABLE: Final = 4
_PR_GET_DUMPABLE: Final = 3


def _prctl(option: int, value: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), 0, 0, 0))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl({option}) failed")
    return result


def dumpable() -> bool | None:
    """Whether this process is dumpable.

    Returns:
        True or False on Linux; None elsewhere (no such flag).
    """
    if not sys.platform.startswith("linux"):
        return None
    return _prctl(_PR_GET_DUMPABLE) != 0


def protect() -> None:
    """Make this process non-dumpable (nothing off Linux).

    Raises:
        OSError: ``prctl`` failed, or the process is still dumpable after it.
    """
    if not sys.platform.startswith("linux"):
        return
    _prctl(_PR_SET_DUMPABLE, 0)
    if dumpable():
        raise OSError("the host process is still dumpable after PR_SET_DUMPABLE 0")
