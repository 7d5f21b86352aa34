"""A compromised worker (arbitrary Python through the test-only entry) attacks the worker template it
was forked from: signals, ptrace, its memory, its descriptors and control channel, leftover
descriptors of the template and of sibling workers. It gains nothing, with its filter (the worker as
shipped) and without it (``unconfined``: the filter left out, standing in for a filter that failed
open: the uid boundary alone must hold). Needs a host running as root (the workers' uids).

Also checked here: what forked workers share (docs/reference/runtimes.md says it), and that a
template that dies is replaced while the workers it had die with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import pytest

import codemode
from codemode.runtimes.process import ProcessOptions, ProcessRuntime
from tests.support.recorder import ALICE, make_server

from .test_process_containment import TESTING, unconfined_runtime

BOB = codemode.Subject("bob")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the workers' uids need a host running as root")


@pytest.fixture(params=["confined", "unconfined"])
async def attacked(request: pytest.FixtureRequest) -> AsyncIterator[tuple[codemode.Server, ProcessRuntime]]:
    if request.param == "confined":
        runtime = ProcessRuntime(ProcessOptions(module="codemode_worker.testing_entry", extra_env=TESTING))
    else:
        runtime = unconfined_runtime("template")
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    yield srv, runtime
    await srv.aclose()


ATTACK = r"""
import ctypes, errno, os, signal, socket

libc = ctypes.CDLL(None, use_errno=True)
template = TARGET  # its template, unless a test names another process
out = {"template": template, "uid": os.getuid()}

def attempt(fn):
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "allowed"

def call(fn, *args):
    ctypes.set_errno(0)
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    if fn(*args) == -1:
        raise OSError(ctypes.get_errno(), "")

fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[name] = os.readlink("/proc/self/fd/" + name)
    except OSError as exc:
        fds[name] = type(exc).__name__
out["fds"] = fds
out["signal"] = attempt(lambda: os.kill(template, signal.SIGKILL))
out["stop"] = attempt(lambda: os.kill(template, signal.SIGSTOP))
out["ptrace"] = attempt(lambda: call(libc.ptrace, 16, template, 0, 0))  # PTRACE_ATTACH
out["mem"] = attempt(lambda: open("/proc/%d/mem" % template, "rb").read(1))
out["environ"] = attempt(lambda: open("/proc/%d/environ" % template, "rb").read(1))
out["its_fds"] = attempt(lambda: os.listdir("/proc/%d/fd" % template))
opened = []
for n in range(64):  # the control socket and the pidfds are the template's fds 3 and up
    try:
        opened.append(os.open("/proc/%d/fd/%d" % (template, n), os.O_RDONLY))
    except OSError:
        pass
out["reopened"] = len(opened)
buf = ctypes.create_string_buffer(8)
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = IoVec(ctypes.addressof(buf), 8)
remote = IoVec(0x400000, 8)
libc.syscall.restype = ctypes.c_long
vectors = (ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
out["vm_read"] = attempt(lambda: call(libc.syscall, 310, template, *vectors))  # process_vm_readv
def steal_fd():
    pidfd = libc.syscall(ctypes.c_long(434), ctypes.c_long(template), ctypes.c_long(0))  # pidfd_open
    if pidfd < 0:
        raise OSError(ctypes.get_errno(), "")
    call(libc.syscall, 438, pidfd, 3, 0)  # pidfd_getfd: its control socket
out["pidfd_getfd"] = attempt(steal_fd)
final(out)
"""


async def test_a_worker_gains_nothing_over_its_template(
    attacked: tuple[codemode.Server, ProcessRuntime],
) -> None:
    srv, runtime = attacked
    template = (await runtime.template()).pid
    report = await srv.execute(attack(), subject=ALICE)
    assert report["template"] == template and report["uid"] != 0
    # Nothing but its own pipes (the listing's own directory descriptor aside): no control socket,
    # no pidfd of a sibling, nothing the template's imports opened.
    links = [
        link
        for link in report["fds"].values()
        if not link.startswith("/proc/") and link != "FileNotFoundError"
    ]
    assert links and all(link.startswith("pipe:[") for link in links), report["fds"]
    refused(report)
    # The template is the same, unharmed, process, and still forks workers.
    assert (await runtime.template()).pid == template and runtime.templates_started == 1
    os.kill(template, 0)  # raises if the template is gone
    assert (await srv.execute("final(7)\n", subject=ALICE)) == 7


def attack(target: str = "os.getppid()") -> str:
    return ATTACK.replace("TARGET", target)


def refused(report: dict[str, object]) -> None:
    """Every attack of ``ATTACK`` on its target failed."""
    for kind in ("signal", "stop", "ptrace", "vm_read", "pidfd_getfd"):
        assert report[kind] == "EPERM", (kind, report)
    for kind in ("mem", "environ", "its_fds"):
        assert report[kind] == "EACCES", (kind, report)
    assert report["reopened"] == 0, report


async def test_a_worker_gains_nothing_over_a_sibling_worker_or_the_host(
    attacked: tuple[codemode.Server, ProcessRuntime],
) -> None:
    """The same attacks on another tenant's worker, live beside it, and on the host process."""
    srv, runtime = attacked
    template = (await runtime.template()).pid
    running = asyncio.ensure_future(srv.execute(SLEEP, subject=BOB))
    try:
        for _ in range(500):  # until the sibling runs its program
            sibling = [p for p in _children(template) if _alive(p)]
            if sibling:
                break
            await asyncio.sleep(0.01)
        (target,) = sibling
        for pid in (target, os.getpid()):
            report = await srv.execute(attack(str(pid)), subject=ALICE)
            assert report["template"] == pid and report["uid"] != 0
            refused(report)
        assert not running.done() and _alive(target)  # the sibling runs on, unharmed
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


LOOK_AROUND = r"""
import os, sys, ctypes
random = sys.modules["random"]  # loaded by the template (below): a worker cannot import any more
final({
    "random": random.getrandbits(62),
    "hash": hash("codemode"),
    "libc_getpid": ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value,
    "pid": os.getpid(),
})
"""


async def test_forked_workers_share_layout_and_hash_seed_not_random_state() -> None:
    """What docs/reference/runtimes.md says forked workers share (the address-space layout, the
    string hash seed) and what they do not (the ``random`` module's state: the real template never
    loads it, this one does)."""
    command = [sys.executable, "-I", "-c", RANDOM_TEMPLATE, "--testing"]
    runtime = ProcessRuntime(ProcessOptions(template_argv=command, extra_env=TESTING))
    srv, _ = make_server(runtime=runtime)
    try:
        one, two = [await srv.execute(LOOK_AROUND, subject=ALICE) for _ in range(2)]
    finally:
        await srv.aclose()
    assert one["pid"] != two["pid"]
    assert one["random"] != two["random"]
    assert one["hash"] == two["hash"] and one["libc_getpid"] == two["libc_getpid"]


RANDOM_TEMPLATE = (
    "import random, sys, os\n"
    "random.getrandbits(64)\n"
    "from codemode_worker import template\n"
    "os._exit(template.main(sys.argv[1:]))\n"
)

SLEEP = "import time\ntime.sleep(30)\nfinal(0)\n"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_a_dead_template_is_replaced_and_its_workers_die_with_it() -> None:
    runtime = ProcessRuntime(ProcessOptions(module="codemode_worker.testing_entry", extra_env=TESTING))
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    try:
        old = await runtime.template()
        running = asyncio.ensure_future(srv.execute(SLEEP, subject=ALICE))
        for _ in range(500):  # until its worker runs the program
            if any(_alive(p) for p in _children(old.pid)):
                break
            await asyncio.sleep(0.01)
        (worker,) = _children(old.pid)
        t0 = time.monotonic()
        os.kill(old.pid, signal.SIGKILL)
        with pytest.raises(codemode.CodeModeError, match="internal failure"):
            await running
        assert time.monotonic() - t0 < 10  # not the 20 s deadline: the worker died with its template
        for _ in range(200):
            if not _alive(worker):
                break
            await asyncio.sleep(0.01)
        assert not _alive(worker)
        assert (await srv.execute("final(1)\n", subject=ALICE)) == 1
        assert (await runtime.template()).pid != old.pid and runtime.templates_started == 2
    finally:
        await srv.aclose()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(p) for p in children.read().split()]
    except OSError:
        return []


SPINNERS = r"""
import os, signal
template = os.getppid()
r, w = os.pipe()
for _ in range(SPINNERS):
    if os.fork() == 0:
        os.setsid()  # out of the worker's group: only the kill of its uid reaches it
        os.close(r)
        os.write(w, b".")
        while True:  # the instant the template takes this uid to kill it, it can be signalled
            try:
                os.kill(template, signal.SIGKILL)
            except OSError:
                pass
os.close(w)
started = 0
while started < SPINNERS:
    started += len(os.read(r, SPINNERS))
final([template, os.getuid()])
"""


async def test_a_worker_cannot_kill_its_template_while_its_uid_is_killed() -> None:
    """Descendants that left the session (the filter failed open) try, all the time, to SIGKILL the
    template: when it kills every process of their uid, it must not take a uid they can signal."""
    runtime = unconfined_runtime("template")
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    uids: set[int] = set()
    try:
        template = (await runtime.template()).pid
        for _ in range(20):
            parent, uid = await srv.execute(SPINNERS.replace("SPINNERS", "2"), subject=ALICE)
            uids.add(uid)
            await srv._executor.drain()  # its destroy (the template's kill of the uid) is over
            assert parent == template and runtime.templates_started == 1 and _alive(template)
        for _ in range(200):  # and no spinner is left (SIGKILLed ones end soon)
            left = [pid for pid in _all_pids() if _uid_of(pid) in uids]
            if not left:
                break
            await asyncio.sleep(0.01)
        assert not left
    finally:
        await srv.aclose()
        for pid in _all_pids():  # what a failing run left spinning
            if _uid_of(pid) in uids:
                os.kill(pid, signal.SIGKILL)


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and _alive(int(name))]


def _uid_of(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1
