"""The host finds the workers' mqueue file system once, not for every worker:
``mqueue_root`` read ``/proc/self/mountinfo`` on every call, twice per execute of the process
runtime (3 ms of the host's CPU per call on the loaded test machine). It now remembers the mount
point with its file system's device number, and reads the mounts again when one ``stat`` shows
another file system there (an unmount or a new mount).

The real mount table and mount point (the host's own, or ``MQUEUE_MOUNT`` mounted as root); the
count of mount-table reads is the observable. Skips where no mqueue file system can be had.
"""

from __future__ import annotations

import os

import pytest

from codemode.runtimes.process import posix_ipc_cleanup


def test_the_mount_point_is_read_once_and_again_when_its_file_system_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []
    real = posix_ipc_cleanup._mounted_mqueues

    def counted() -> list[str]:
        reads.append(1)
        return real()

    monkeypatch.setattr(posix_ipc_cleanup, "_mounted_mqueues", counted)
    monkeypatch.setattr(posix_ipc_cleanup, "_found", [])
    root = posix_ipc_cleanup.mqueue_root()
    if root is None:
        pytest.skip("no mqueue file system here (not root, or the mount is refused)")
    assert [posix_ipc_cleanup.mqueue_root() for _ in range(5)] == [root] * 5
    assert len(reads) == 1  # before: 6, one read of the mount table per call
    # Another file system at the mount point (as after an unmount): the mounts are read again.
    device = os.stat(root).st_dev
    posix_ipc_cleanup._found[:] = [(root, device + 1)]
    assert posix_ipc_cleanup.mqueue_root() == root
    assert len(reads) == 2 and posix_ipc_cleanup._found == [(root, device)]
