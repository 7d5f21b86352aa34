"""What a process-runtime worker leaves for the next holder of its uid. Needs a host
running as root (the uid drop).

A POSIX message queue and a ``/dev/shm`` file outlive the process that made them, like System V IPC
objects; an empty file (``RLIMIT_FSIZE`` is 0) still carries a 60 KB ``user.`` extended attribute on
tmpfs. A worker whose filter failed open (``unconfined``: the testing entry without its
confinement) left both, and the next worker given the same uid read both. ``destroy()`` removes
them now, and workers start with ``RLIMIT_MSGQUEUE`` 0 (no queue can be made at all).

Each runtime here has a uid range of its own, away from the default one, so that the second execute
gets the first one's uid (the template holds one uid for itself: its ``--killer-uid``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode.runtimes.process import ProcessRuntime, Spawn
from tests.support.recorder import ALICE, make_server

from .test_process_containment import BOTH_SPAWNS, spawn, unconfined_runtime  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs a host running as root")

#: Uids of these tests only (the default range starts at 1,000,000,000).
UID_BASE = 1_000_900_000
QUEUE = b"/codemode-leftover"
SHM = "/dev/shm/codemode-leftover"
ATTRIBUTE = "user.codemode-leftover"

_PRELUDE = f"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
QUEUE, SHM, ATTRIBUTE = {QUEUE!r}, {SHM!r}, {ATTRIBUTE!r}
def error():
    return errno.errorcode.get(ctypes.get_errno(), "?")
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("curmsgs", ctypes.c_long), ("reserved", ctypes.c_long * 4)]
res = {{"uid": os.getuid()}}
"""

LEAVE = (
    _PRELUDE
    + """
q = libc.mq_open(QUEUE, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(Attr(0, 1, 64, 0)))
res["mq"] = error() if q < 0 else ("sent" if libc.mq_send(q, b"left for you", 12, 0) == 0 else error())
try:
    os.close(os.open(SHM, os.O_CREAT | os.O_WRONLY, 0o600))  # empty: RLIMIT_FSIZE is 0
    os.setxattr(SHM, ATTRIBUTE, b"s" * 60000)
    res["shm"] = "set"
except OSError as exc:
    res["shm"] = errno.errorcode.get(exc.errno, "?")
final(res)
"""
)

FIND = (
    _PRELUDE
    + """
q = libc.mq_open(QUEUE, os.O_RDONLY | os.O_NONBLOCK)
if q < 0:
    res["mq"] = error()
else:
    buf = ctypes.create_string_buffer(64)
    n = libc.mq_receive(q, buf, 64, None)
    res["mq"] = buf.raw[:n].decode() if n >= 0 else error()
try:
    res["shm"] = "%d bytes" % len(os.getxattr(SHM, ATTRIBUTE))
except OSError as exc:
    res["shm"] = errno.errorcode.get(exc.errno, "?")
final(res)
"""
)


@pytest.fixture
async def server(spawn: Spawn) -> AsyncIterator[codemode.Server]:  # noqa: F811
    uids = 2 if spawn == "template" else 1
    runtime = unconfined_runtime(spawn, worker_uid_base=UID_BASE, worker_uids=uids)
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    yield srv
    await srv.aclose()


async def _run(server: codemode.Server, python: str) -> Any:
    value = await server.execute(python, subject=ALICE)
    await server._executor.drain()  # every background destroy has finished
    return value


@BOTH_SPAWNS
async def test_the_next_holder_of_the_uid_finds_no_queue_and_no_shm_file(server: codemode.Server) -> None:
    left = await _run(server, LEAVE)
    found = await _run(server, FIND)
    print(f"left {left}; the next holder of uid {found['uid']} read {found}")
    assert found["uid"] == left["uid"] != 0, (left, found)
    assert left["shm"] == "set", left  # a /dev/shm file and its attribute outlive the worker...
    # ...a queue cannot be made at all: RLIMIT_MSGQUEUE 0 (EMFILE), or EACCES first where the
    # machine's mqueue root is not world-writable (seen on a test machine whose root was 0700)
    assert left["mq"] in ("EMFILE", "EACCES"), left
    assert found["mq"] == "ENOENT" and found["shm"] == "ENOENT", found
    assert not os.path.exists(SHM)


#: Made as a worker uid outside any worker (its RLIMIT_MSGQUEUE is the default): what destroy()
#: removes when a queue exists anyway.
MAKE = (
    _PRELUDE
    + """
import sys
q = libc.mq_open(QUEUE + sys.argv[1].encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(Attr(0, 1, 64, 0)))
assert q >= 0, error()
os.close(os.open(SHM + sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o600))
os.setxattr(SHM + sys.argv[1], ATTRIBUTE, b"s" * 60000)
"""
)


def _queue_exists(name: bytes) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    q = libc.mq_open(name, os.O_RDONLY | os.O_NONBLOCK)
    if q >= 0:
        os.close(q)
        return True
    assert ctypes.get_errno() == errno.ENOENT, ctypes.get_errno()
    return False


def test_the_posix_ipc_of_a_uid_is_removed_and_nothing_else() -> None:
    from codemode.runtimes.process.posix_ipc_cleanup import remove_posix_ipc_of

    python = shutil.which("python3", path="/usr/bin:/bin")  # the test venv's lives under /root
    if python is None:
        pytest.skip("needs a python3 in /usr/bin that any uid may run")
    mine, other = UID_BASE + 10, UID_BASE + 11
    for uid, suffix in ((mine, "-mine"), (other, "-other")):
        subprocess.run(
            [python, "-I", "-c", MAKE, suffix],
            user=uid,
            group=uid,
            extra_groups=[],
            check=True,
            cwd="/",
        )
    try:
        assert _queue_exists(QUEUE + b"-mine") and os.path.exists(SHM + "-mine")
        assert remove_posix_ipc_of(mine) == 2
        assert not _queue_exists(QUEUE + b"-mine") and not os.path.exists(SHM + "-mine")
        assert _queue_exists(QUEUE + b"-other") and os.path.exists(SHM + "-other")  # another uid's
    finally:
        remove_posix_ipc_of(other)
    assert not _queue_exists(QUEUE + b"-other") and not os.path.exists(SHM + "-other")


@BOTH_SPAWNS
async def test_a_worker_may_make_no_message_queue(spawn: Spawn) -> None:  # noqa: F811
    """``RLIMIT_MSGQUEUE`` 0 on every worker (soft and hard), whatever its filter does."""
    runtime: ProcessRuntime = unconfined_runtime(spawn, worker_uid_base=UID_BASE + 100, worker_uids=4)
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    try:
        limit = await _run(
            srv, "import resource\nfinal(list(resource.getrlimit(resource.RLIMIT_MSGQUEUE)))\n"
        )
    finally:
        await srv.aclose()
    assert limit == [0, 0]


#: The worker looks for what was left under its own uid before it started.
LOOK = (
    _PRELUDE
    + """
try:
    res["shm"] = "%d bytes" % len(os.getxattr(SHM + str(os.getuid()), ATTRIBUTE))
except OSError as exc:
    res["shm"] = errno.errorcode.get(exc.errno, "?")
final(res)
"""
)


def _plant(uids: range, mark: bytes) -> None:
    """What a holder of each uid left (a queue and a /dev/shm file, made as the uid), and its lock
    file's mark: ``held`` for a holder that died holding it, ``clean`` for one that released it."""
    from codemode.runtimes.process import runtime as process_runtime

    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("needs a python3 in /usr/bin that any uid may run")
    os.makedirs(process_runtime.UID_LOCK_DIR, mode=0o700, exist_ok=True)
    for uid in uids:
        subprocess.run([python, "-I", "-c", MAKE, str(uid)], user=uid, group=uid, extra_groups=[], check=True)
        path = os.path.join(process_runtime.UID_LOCK_DIR, str(uid))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, mark)
        os.close(fd)


@BOTH_SPAWNS
@pytest.mark.parametrize("mark", [b"held\n", b"", b"clean\nheld\n"])
async def test_a_uid_whose_holder_died_is_cleaned_before_the_next_worker(spawn: Spawn, mark: bytes) -> None:  # noqa: F811
    """A host that died holding a uid left its lock file marked held (or never marked: an older
    host), so the next claim removes what the uid left before the worker starts; only an exact
    ``clean`` mark, written by a holder whose worker was contained, skips that."""
    from codemode.runtimes.process.posix_ipc_cleanup import remove_posix_ipc_of

    base = UID_BASE + 300
    uids = range(base, base + 2)
    _plant(uids, mark)
    runtime = unconfined_runtime(spawn, worker_uid_base=base, worker_uids=2)
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    try:
        seen = await _run(srv, LOOK)
    finally:
        await srv.aclose()
        for uid in uids:
            remove_posix_ipc_of(uid)
    assert seen["uid"] in uids and seen["shm"] == "ENOENT", seen


@BOTH_SPAWNS
async def test_a_uid_released_clean_is_given_on_without_a_second_clean_up(spawn: Spawn) -> None:  # noqa: F811
    """The clean-up at spawn is skipped only on the lock file's ``clean`` mark, which the host
    writes after a contained worker's destroy removed everything of the uid; the folder is root's
    alone (0700), so no worker can write the mark. Planted here by hand, the mark is what decides,
    for the template's workers only: the classic spawn mode kills a uid by a ``/proc`` scan, which a
    fork chain can race, so it cleans up at every claim and never marks a uid clean."""
    from codemode.runtimes.process import runtime as process_runtime
    from codemode.runtimes.process.posix_ipc_cleanup import remove_posix_ipc_of

    base = UID_BASE + 310
    uids = range(base, base + 2)
    _plant(uids, b"clean\n")
    runtime = unconfined_runtime(spawn, worker_uid_base=base, worker_uids=2)
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    try:
        seen = await _run(srv, LOOK)
        marks = {uid: Path(process_runtime.UID_LOCK_DIR, str(uid)).read_bytes() for uid in uids}
    finally:
        await srv.aclose()
        for uid in uids:
            remove_posix_ipc_of(uid)
    if spawn == "template":
        assert seen["uid"] in uids and seen["shm"] == "60000 bytes", seen
        assert marks[seen["uid"]] == b"clean\n", marks  # its destroy removed everything and said so
    else:
        assert seen["uid"] in uids and seen["shm"] == "ENOENT", seen
        assert marks[seen["uid"]] == b"held\n", marks
    assert os.stat(process_runtime.UID_LOCK_DIR).st_mode & 0o777 == 0o700
