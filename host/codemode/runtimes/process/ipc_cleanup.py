"""Remove the System V IPC objects a worker uid left behind (Linux); ``remove_all_ipc_of`` removes
its POSIX queues and ``/dev/shm`` entries too (``posix_ipc_cleanup``).

Shared memory segments, semaphore sets and message queues outlive the processes that made them: a
process worker (which shares the host's IPC namespace) could leave data in one for the next worker
that gets the same uid, or pile them up to the system's limits. ``remove_ipc_of(uid)`` removes every
object whose owner or creator is ``uid``, as read from ``/proc/sysvipc``. It runs (as root, which
may remove any object) after the uid's processes are gone and before the uid is handed out again.
"""

from __future__ import annotations

import ctypes
import errno
import logging
from pathlib import Path

from .posix_ipc_cleanup import remove_posix_ipc_of

__all__ = ["SYSVIPC", "ipc_of", "remove_all_ipc_of", "remove_ipc_of"]

log = logging.getLogger("codemode.runtimes.process")

SYSVIPC = Path("/proc/sysvipc")
_IPC_RMID = 0
#: /proc/sysvipc file -> the column holding the object's id.
_ID_COLUMN = {"shm": "shmid", "sem": "semid", "msg": "msqid"}


def ipc_of(uid: int, root: Path = SYSVIPC) -> list[tuple[str, int]]:
    """Every System V IPC object owned or created by a uid.

    Args:
        uid: the user id.
        root: where the kernel lists them (``/proc/sysvipc``).

    Returns:
        ``(kind, id)`` of each: kind ``shm``, ``sem`` or ``msg``.
    """
    found = []
    for kind, id_column in _ID_COLUMN.items():
        try:
            header, *rows = (root / kind).read_text().splitlines()
        except OSError:  # not Linux, or no System V IPC in this kernel
            continue
        names = header.split()
        at_id, at_uid, at_cuid = names.index(id_column), names.index("uid"), names.index("cuid")
        for row in rows:
            cells = row.split()
            if len(cells) == len(names) and uid in (int(cells[at_uid]), int(cells[at_cuid])):
                found.append((kind, int(cells[at_id])))
    return found


def remove_ipc_of(uid: int) -> int:
    """Remove every System V IPC object owned or created by a uid.

    Args:
        uid: the user id.

    Returns:
        The number removed (an object already gone counts as removed).
    """
    objects = ipc_of(uid)
    if not objects:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    removed = 0
    for kind, ident in objects:
        if kind == "shm":
            status = libc.shmctl(ident, _IPC_RMID, None)
        elif kind == "sem":
            status = libc.semctl(ident, 0, _IPC_RMID)
        else:
            status = libc.msgctl(ident, _IPC_RMID, None)
        if status == 0 or ctypes.get_errno() in (errno.EINVAL, errno.EIDRM):  # already removed
            removed += 1
        else:
            log.error("cannot remove %s %d of worker uid %d: errno %d", kind, ident, uid, ctypes.get_errno())
    return removed


def remove_all_ipc_of(uid: int) -> int:
    """Remove everything of a uid that outlives its processes: its System V IPC objects
    (``remove_ipc_of``), its POSIX message queues and its ``/dev/shm`` entries
    (``posix_ipc_cleanup``). Blocking (walks ``/dev/shm``).

    Args:
        uid: the worker's uid (none of its processes runs any more).

    Returns:
        The number removed.
    """
    return remove_ipc_of(uid) + remove_posix_ipc_of(uid)
