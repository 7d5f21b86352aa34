"""What a subject's directory holds on disk, and removing a directory a tenant filled.

A tenant's server can make a tree of any shape: one ``create_directory`` call with a 4 KB path
makes about 2,000 nested directories, deeper than Python's recursion limit (``shutil.rmtree`` and
``os.walk`` of Python 3.11 recurse and fail with ``RecursionError``), and a server that changes
its working directory can go past ``PATH_MAX``. Both functions here walk iteratively, with one
directory descriptor open at a time and names relative to it, never following a symbolic link.

* :func:`measure`: entries and allocated bytes under a directory, stopping as soon as either passes
  its bound (so a check costs at most about the bound, whatever the tree holds);
* :func:`remove_tree`: the directory and everything under it, bottom-up; what cannot be removed is
  left in place and counted, never raised.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Usage", "measure", "remove_tree"]

log = logging.getLogger("codemode.capabilities.mcp_upstream")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Usage:
    """What :func:`measure` found.

    Attributes:
        entries: entries seen (at least these many when ``over``).
        bytes: allocated bytes seen (``st_blocks``; at least these many when ``over``).
        over: whether a bound was passed (the walk stopped there).
    """

    entries: int
    bytes: int
    over: bool


def _open_dir(name: str | Path, parent: int | None) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None


def measure(root: Path, max_entries: int = 0, max_bytes: int = 0) -> Usage:
    """Entries and allocated bytes (``st_blocks``) under ``root``; ``over`` as soon as more than
    ``max_entries`` or ``max_bytes`` are seen, and the walk stops there.

    Args:
        root: the directory (a missing or unreadable one holds nothing).
        max_entries: the bound on entries (0: no bound).
        max_bytes: the bound on allocated bytes (0: no bound).

    Returns:
        The usage found.
    """
    fd = _open_dir(root, None)
    if fd is None:
        return Usage(0, 0, False)
    entries = allocated = 0
    pending: list[list[str]] = []  # per level walked so far: the subdirectories still to visit
    try:
        while True:
            subdirs: list[str] = []
            with contextlib.suppress(OSError), os.scandir(fd) as listing:
                for entry in listing:
                    entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    allocated += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        subdirs.append(entry.name)
                    if (max_entries and entries > max_entries) or (max_bytes and allocated > max_bytes):
                        return Usage(entries, allocated, True)
            pending.append(subdirs)
            while True:  # the next directory: deepest first, going back up through ".."
                if pending[-1]:
                    child = _open_dir(pending[-1].pop(), fd)
                    if child is not None:
                        os.close(fd)
                        fd = child
                        break
                    continue
                pending.pop()
                if not pending:
                    return Usage(entries, allocated, False)
                up = _open_dir("..", fd)
                os.close(fd)
                fd = -1
                if up is None:
                    return Usage(entries, allocated, False)
                fd = up
    finally:
        if fd >= 0:
            os.close(fd)


def remove_tree(root: Path) -> int:
    """Remove ``root`` and everything under it (bottom-up, any depth, links never followed);
    never raises for what is inside.

    Args:
        root: the directory (a file is unlinked; a missing one is nothing to do).

    Returns:
        How many entries were left (0: all gone).
    """
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(root)
        return 0
    fd = _open_dir(root, None)
    if fd is None:
        return 1
    names: list[str] = []  # the path from root to where the walk is, one name per level
    stuck: list[set[str]] = [set()]  # per level: entries that could not be removed
    left = 0
    while True:
        descend = None
        try:
            with os.scandir(fd) as listing:
                for entry in listing:
                    if entry.name in stuck[-1]:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        descend = entry.name
                        break
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        stuck[-1].add(entry.name)
                        left += 1
        except OSError:
            pass  # unreadable: it is removed below if empty, else left
        if descend is not None:
            child = _open_dir(descend, fd)
            if child is None:  # e.g. mode 000: make it ours again once, else leave it
                with contextlib.suppress(OSError, NotImplementedError):
                    os.chmod(descend, 0o700, dir_fd=fd, follow_symlinks=False)
                child = _open_dir(descend, fd)
            if child is None:
                stuck[-1].add(descend)
                left += 1
                continue
            os.close(fd)
            fd = child
            names.append(descend)
            stuck.append(set())
            continue
        if not names:  # root itself is empty now (or holds only what is stuck)
            os.close(fd)
            if not stuck[0]:
                try:
                    os.rmdir(root)
                except OSError:
                    left += 1
            if left:
                log.warning("%s: %d entries could not be removed", root, left)
            return left
        up = _open_dir("..", fd)
        os.close(fd)
        if up is None:
            log.warning("%s: lost the way back up while removing it; left in place", root)
            return left + 1
        fd = up
        name = names.pop()
        held = stuck.pop()
        if held:
            stuck[-1].add(name)
            continue
        try:
            os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError:
            stuck[-1].add(name)
            left += 1
