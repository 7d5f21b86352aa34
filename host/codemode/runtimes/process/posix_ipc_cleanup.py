"""Remove the POSIX IPC a worker uid left behind (Linux): message queues and ``/dev/shm`` entries.

A POSIX message queue and a file in ``/dev/shm`` (POSIX shared memory; a tmpfs every uid may write
to) outlive the process that made them, like the System V objects ``ipc_cleanup`` removes. An empty
file carries data too: its name, and its ``user.`` extended attributes (60 KB on tmpfs), which
``RLIMIT_FSIZE`` 0 does not bound. A worker left both, and the next worker given the same uid read
both. ``remove_posix_ipc_of(uid)`` removes every queue and every entry under ``/dev/shm`` (a
directory with all it holds) whose owner is ``uid``. It runs (as root) after the uid's processes are
gone and before the uid is handed out again; workers also start with ``RLIMIT_MSGQUEUE`` 0, so none
can make a queue in the first place: this is the layer under that limit.

Queues are the files of an ``mqueue`` file system, which shows the queues of the IPC namespace that
mounted it: the one mounted in this mount namespace is used (``/dev/mqueue`` first); where none is,
one is mounted once at ``MQUEUE_MOUNT`` (a directory only root may enter) and stays for the next
host. Without it (the mount refused) one warning is logged and queues are left to the limit.

The mount point found is remembered with its file system's device number: a later call checks that
one ``stat`` still shows that file system there (an unmount changes it, and the mounts are read
again) instead of reading ``/proc/self/mountinfo`` for every worker, which cost 3 ms of the host's
CPU per call on the loaded test machine, twice per execute.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import stat

__all__ = ["MQUEUE_MOUNT", "SHM", "mqueue_root", "remove_posix_ipc_of"]

log = logging.getLogger("codemode.runtimes.process")

#: Where the host mounts an ``mqueue`` file system when none is mounted.
MQUEUE_MOUNT = "/run/codemode/mqueue"
#: The tmpfs of POSIX shared memory.
SHM = "/dev/shm"
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_warned: list[str] = []
#: The mqueue mount point found last, and its file system's device number.
_found: list[tuple[str, int]] = []


def _mounted_mqueues() -> list[str]:
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split()
                dash = fields.index("-") if "-" in fields else len(fields)
                if fields[dash + 1 : dash + 2] == ["mqueue"]:
                    found.append(fields[4].replace("\\040", " "))
    except OSError:
        return []
    return found


def _warn_once(text: str) -> None:
    if text not in _warned:
        _warned.append(text)
        log.warning("%s", text)


def mqueue_root() -> str | None:
    """The mount point of an ``mqueue`` file system of the host's IPC namespace (remembered while
    one ``stat`` shows the same file system there; see the module docstring).

    Returns:
        ``/dev/mqueue`` (or another mount point) when one is mounted; else ``MQUEUE_MOUNT`` once the
        host (root) has mounted one there; None when it cannot (one warning names why).
    """
    if _found:
        path, device = _found[0]
        try:
            if os.stat(path).st_dev == device:
                return path
        except OSError:
            pass
        _found.clear()  # unmounted or replaced: read the mounts again
    root = _find_mqueue_root()
    if root is not None:
        with contextlib.suppress(OSError):
            _found.append((root, os.stat(root).st_dev))
    return root


def _find_mqueue_root() -> str | None:
    mounted = _mounted_mqueues()
    if mounted:
        return "/dev/mqueue" if "/dev/mqueue" in mounted else mounted[0]
    if os.geteuid() != 0:
        return None
    try:
        os.makedirs(MQUEUE_MOUNT, mode=0o700, exist_ok=True)
        os.chmod(MQUEUE_MOUNT, 0o700)
    except OSError as exc:
        _warn_once(f"cannot make {MQUEUE_MOUNT} for the workers' message queues: {exc.strerror or exc}")
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if libc.mount(b"mqueue", os.fsencode(MQUEUE_MOUNT), b"mqueue", flags, None) != 0:
        error = os.strerror(ctypes.get_errno())
        _warn_once(
            f"cannot mount an mqueue file system at {MQUEUE_MOUNT}: {error}; workers' queues are not removed"
        )
        return None
    return MQUEUE_MOUNT


def _remove_queues_of(uid: int) -> int:
    root = mqueue_root()
    if root is None:
        return 0
    removed = 0
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(root, name)
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(path).st_uid == uid:
                os.unlink(path)  # mq_unlink
                removed += 1
    return removed


def _remove_entry(name: str, dir_fd: int) -> None:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)  # descriptor-based: follows no symbolic link
    else:
        os.unlink(name, dir_fd=dir_fd)


def _remove_files_of(uid: int, root: str) -> int:
    """Every entry under ``root`` owned by ``uid`` (a directory with all it holds), following no
    symbolic link; entries of other uids stay."""
    if not os.path.isdir(root):
        return 0
    removed = 0
    for _, dirnames, filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        kept = []
        for name in [*filenames, *dirnames]:
            try:
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid == uid:
                    _remove_entry(name, dir_fd)
                    removed += 1
                elif name in dirnames:
                    kept.append(name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.error("cannot remove %s/%s of worker uid %d: %s", root, name, uid, exc.strerror or exc)
        dirnames[:] = kept
    return removed


def remove_posix_ipc_of(uid: int, shm: str = SHM) -> int:
    """Remove every POSIX message queue and every ``/dev/shm`` entry a uid owns (blocking).

    Args:
        uid: the worker's uid (none of its processes runs any more).
        shm: the shared-memory directory (``/dev/shm``).

    Returns:
        The number of queues and entries removed.
    """
    return _remove_queues_of(uid) + _remove_files_of(uid, shm)
