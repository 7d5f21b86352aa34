"""A compromised process-runtime worker (arbitrary Python through the test-only entry): its own
seccomp filter refuses what the interpreter never needs (a process, a program, a socket ...), and it
sees neither the host's environment nor the host's private files. Needs a host running as root (uid
drop).

The layer under the filter is tested with the filter left out (``unconfined``: the testing entry
without ``confinement``, standing in for a filter that failed open): every descendant still dies with
destroy(), and the System V IPC objects it made are removed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode.runtimes.process import SPAWN_MODES, ProcessOptions, ProcessRuntime, Spawn
from codemode.runtimes.process.ipc_cleanup import ipc_of
from codemode_worker.confinement import OPEN_FILES_HEADROOM
from tests.adversarial import confinement_probes
from tests.support.recorder import ALICE, make_server

from .kernel_probe import PROBE, not_refused

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs a host running as root")

TESTING = {"CODEMODE_WORKER_TESTING": "1"}
#: Every test runs on both ways of making a worker: forked by the template (the default) and started.
BOTH_SPAWNS = pytest.mark.parametrize("spawn", SPAWN_MODES, indirect=True)


@pytest.fixture
def spawn(request: pytest.FixtureRequest) -> Spawn:
    mode: Spawn = getattr(request, "param", "template")
    return mode


@pytest.fixture
async def server(spawn: Spawn) -> AsyncIterator[codemode.Server]:
    runtime = ProcessRuntime(
        ProcessOptions(module="codemode_worker.testing_entry", extra_env=TESTING, spawn=spawn)
    )
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    yield srv
    await srv.aclose()


# The testing entry with its confinement (Landlock and the filter) left out (never possible for a
# real worker: neither entry.serve nor the template has such a switch). Imported modules are
# patched in the worker (or template) process only.
UNCONFINED = (
    "from codemode_worker import testing_entry as t\n"
    "t.restrict_files = lambda: None\n"
    "t.prepare = lambda: None\n"
    "t.confine = lambda _filter: None\n"
    "import os, sys\n"
    "code = t.main()\n"
    "sys.stderr.flush()\n"
    "os._exit(code)\n"
)
UNCONFINED_TEMPLATE = (
    "from codemode_worker import confinement as c\n"
    "c.restrict_files = lambda: None\n"
    "c.prepare = lambda: None\n"
    "c.confine = lambda _filter: None\n"
    "c.compile_filter = lambda: None\n"
    "import os, sys\n"
    "from codemode_worker import template\n"
    "code = template.main(sys.argv[1:])\n"
    "sys.stderr.flush()\n"
    "os._exit(code)\n"
)


def unconfined_runtime(spawn: Spawn, **kwargs: Any) -> ProcessRuntime:
    """A process runtime whose workers run the testing entry without their filter."""
    if spawn == "template":
        command = [sys.executable, "-I", "-c", UNCONFINED_TEMPLATE, "--testing"]
        return ProcessRuntime(ProcessOptions(template_argv=command, extra_env=TESTING, **kwargs))
    return ProcessRuntime(
        ProcessOptions(argv=[sys.executable, "-I", "-c", UNCONFINED], extra_env=TESTING, **kwargs)
    )


@pytest.fixture
async def unconfined(spawn: Spawn) -> AsyncIterator[codemode.Server]:
    srv, _ = make_server(runtime=unconfined_runtime(spawn), max_execution_time=20.0)
    yield srv
    await srv.aclose()


async def run(server: codemode.Server, python: str) -> Any:
    value = await server.execute(python, subject=ALICE)
    await server._executor.drain()  # every background destroy has finished
    return value


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def _dead_soon(pid: int) -> bool:
    for _ in range(50):  # an orphan is reaped by init shortly after the kill
        if not _alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


ESCAPE = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        while True:
            time.sleep(1)
    os._exit(0)
os.close(w)
pid = int(os.read(r, 32))
final({"grandchild": pid, "uid": os.getuid()})
"""


@BOTH_SPAWNS
async def test_setsid_grandchild_dies_with_destroy(unconfined: codemode.Server) -> None:
    """Under the filter fork is refused (test_the_kernel_surface_is_the_filters); without it, a
    grandchild that left the session still dies with its worker's uid."""
    value = await run(unconfined, ESCAPE)
    pid = value["grandchild"]
    assert value["uid"] != 0
    assert await _dead_soon(pid), f"grandchild {pid} survived destroy()"


IPC_MAKER = shutil.which("ipcmk")  # util-linux
IPC_LEFTOVERS = """
import os
made = []
for args in (["-M", "4096"], ["-S", "1"], ["-Q"]):  # shared memory, semaphores, message queue
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        os.execv(IPCMK, ["ipcmk", *args])
    os.close(w)
    made.append(os.read(r, 200).decode().strip())
    os.waitpid(pid, 0)
final({"made": made, "uid": os.getuid()})
"""


@BOTH_SPAWNS
@pytest.mark.skipif(IPC_MAKER is None, reason="ipcmk (util-linux) not found")
async def test_system_v_ipc_objects_die_with_destroy(unconfined: codemode.Server) -> None:
    """Shared memory, semaphores and message queues outlive processes. Under the filter none can be
    made (shmget, semget, msgget are refused); without it, a worker's are removed with it, before its
    uid can go to the next worker (which could otherwise read them)."""
    value = await run(unconfined, f"IPCMK = {IPC_MAKER!r}\n" + IPC_LEFTOVERS)
    kinds = [line.split(" id: ")[0] for line in value["made"]]
    assert kinds == ["Shared memory", "Semaphore", "Message queue"], value
    assert ipc_of(value["uid"]) == []


FORK_BOMB = """
import os, time
made, refused = 0, 0
for _ in range(200):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
    except OSError:
        refused += 1
final({"made": made, "refused": refused})
"""


@BOTH_SPAWNS
async def test_processes_are_bounded(server: codemode.Server) -> None:
    value = await run(server, FORK_BOMB)
    assert value["refused"] > 0
    assert value["made"] < 16


LOOK = """
import os
out = {"env": dict(os.environ), "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
for name, path in (("host_environ", "/proc/%d/environ" % HOST), ("secret", SECRET), ("root_home", "/root")):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(16)
        out[name] = "readable"
    except OSError as exc:
        out[name] = type(exc).__name__
try:
    os.kill(HOST, 0)
    out["signal_host"] = "allowed"
except OSError as exc:
    out["signal_host"] = type(exc).__name__
final(out)
"""


@BOTH_SPAWNS
async def test_the_kernel_surface_is_the_filters(server: codemode.Server) -> None:
    """The worker's own seccomp filter refuses what the interpreter never needs
    (execve of anything, a memfd's ELF, new sockets, io_uring, ptrace, bpf, keys, namespaces, mounts,
    fork ...): the testing entry runs its Python under the same filter as the real worker."""
    report = await run(server, PROBE)
    assert not_refused(report) == {}, report
    assert report["_seccomp"] == "2" and report["_no_new_privs"] == "1", report


@BOTH_SPAWNS
async def test_no_view_of_the_host(server: codemode.Server, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    secret.chmod(0o600)
    os.environ["CODEMODE_TEST_HOST_SECRET"] = "hunter2"
    try:
        program = f"HOST = {os.getpid()}\nSECRET = {str(secret)!r}\n" + LOOK
        value = await run(server, program)
    finally:
        del os.environ["CODEMODE_TEST_HOST_SECRET"]
    # LC_CTYPE is CPython's own C-locale coercion (PEP 538) in the child, not the host's.
    env = {k: v for k, v in value["env"].items() if k != "LC_CTYPE"}
    assert env == {"CODEMODE_WORKER": "1", **TESTING}
    assert value["uid"] != 0 and value["gid"] != 0 and value["groups"] == []
    assert value["host_environ"] == "PermissionError"
    assert value["secret"] == "PermissionError"
    assert value["signal_host"] == "PermissionError"


READ_FILES = """
out = {}
for path in PATHS:
    try:
        with open(path, "rb") as f:
            out[path] = len(f.read())
    except OSError as exc:
        out[path] = type(exc).__name__
final(out)
"""


@BOTH_SPAWNS
async def test_a_worker_cannot_read_the_records_database(server: codemode.Server) -> None:
    """The records database (and its WAL and SHM) in a directory other users can
    enter, as an operator sets CODEMODE_RECORDS_DB=/var/lib/..., was created 0644: a worker with a
    compromised interpreter read every subject's records from it."""
    from codemode_capabilities.records import RecordStore

    shared = Path(tempfile.mkdtemp(prefix="codemode-records-"))
    try:
        shared.chmod(0o755)
        db = shared / "records.sqlite3"
        store = RecordStore(str(db))
        try:
            store.create("bob", "bob's secret", "s3cret", None)  # the WAL and SHM exist while open
            paths = [str(db), f"{db}-wal", f"{db}-shm"]
            value = await run(server, f"PATHS = {paths!r}\n" + READ_FILES)
        finally:
            store.close()
    finally:
        shutil.rmtree(shared)
    assert value == dict.fromkeys(paths, "PermissionError")


@BOTH_SPAWNS
async def test_each_live_worker_has_its_own_uid(server: codemode.Server) -> None:
    slow = "import os, time\ntime.sleep(0.5)\nfinal(os.getuid())\n"
    t0 = time.monotonic()
    uids = await asyncio.gather(*(server.execute(slow, subject=ALICE) for _ in range(3)))
    assert time.monotonic() - t0 < 10
    assert len(set(uids)) == 3 and 0 not in uids


async def test_a_worker_that_stops_reading_cannot_hold_its_destroy() -> None:
    """Found by review: unread stdin bytes kept close_input() waiting before the kill, so destroy()
    never returned and the slot leaked. The kill now comes first and unread input is dropped."""
    from codemode.runtimes.process import ProcessSandbox

    proc = await asyncio.create_subprocess_exec(
        "sleep",
        "1000",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    sandbox = ProcessSandbox(proc, "stops-reading")
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sandbox.write(b"x" * (1 << 20)), 0.5)  # never read
        t0 = time.monotonic()
        await asyncio.wait_for(asyncio.shield(sandbox.destroy()), 8.0)
        assert time.monotonic() - t0 < 4.0
        assert proc.returncode is not None
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, 9)
            await proc.wait()


async def test_argument_forms_and_other_abis_are_refused(server: codemode.Server) -> None:
    """Found by a security review: the forms an allow-list by name and argument could miss (x32
    numbers, clone flag mixes, posix_spawn, fcntl/ioctl commands, open with a write flag spelled any
    way, limits of others, signals and pidfds, another seccomp filter, priorities, the splice
    family) are each refused by the worker's filter (``confinement_probes.FORMS_PROBE``)."""
    report = await run(server, confinement_probes.FORMS_PROBE)
    assert not_refused(report) == {}, report


#: The host of ``test_a_same_uid_worker_cannot_read_the_hosts_memory``: a process runtime without a
#: uid of its own for workers (a host that is not root), holding another tenant's secret.
SAME_UID_HOST = """
import asyncio, json, sys
from codemode.runtimes.process import ProcessOptions, ProcessRuntime
from tests.support.recorder import ALICE, make_server
from tests.adversarial import confinement_probes

held = [confinement_probes.NEEDLE.encode()]  # another tenant's credential, in the host's memory

async def main():
    runtime = ProcessRuntime(ProcessOptions(
        module="codemode_worker.testing_entry", extra_env={"CODEMODE_WORKER_TESTING": "1"}
    ))
    assert not runtime.drops_privileges
    srv, _ = make_server(runtime=runtime, max_execution_time=30.0)
    try:
        print(json.dumps(await srv.execute(confinement_probes.HOST_MEMORY_PROBE, subject=ALICE)))
    finally:
        await srv.aclose()

asyncio.run(main())
"""


def test_a_same_uid_worker_cannot_read_the_hosts_memory() -> None:
    """Without root the worker keeps the host's uid (docs/reference/runtimes.md: it 'can read what
    the host user can'). That includes the host's whole address space: every tenant's arguments and
    results in flight, tokens, upstream credentials, through ``/proc/<ppid>/mem`` (the filter cannot
    look at paths; ptrace access of the same uid is allowed). The host runs here as uid 65534 with
    Debian's Python (the test venv's interpreter lives under /root) and this tree on its path."""
    debian = "/usr/bin/python3"
    if not os.access(debian, os.X_OK) or shutil.which("setpriv") is None:
        pytest.skip("needs Debian's python3 and setpriv")
    version = subprocess.run(
        [debian, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"Debian's python3 is {version}, the test venv's {sys.version_info[:2]}")
    work = Path(tempfile.mkdtemp(prefix="codemode-same-uid-"))
    try:
        venv = work / "venv"
        subprocess.run([debian, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
        site = next((venv / "lib").glob("python3*/site-packages"))
        repo = Path(__file__).resolve().parents[2]
        roots = [str(repo / root) for root in ("host", "worker_image", "capabilities")]
        paths = [p for p in sys.path if p.endswith("site-packages")] + [*roots, str(repo)]
        (site / "codemode-tree.pth").write_text("\n".join(paths) + "\n")
        (work / "host.py").write_text(SAME_UID_HOST)
        for path in (work, *work.rglob("*")):
            path.chmod(path.stat().st_mode | 0o755 if path.is_dir() else path.stat().st_mode | 0o644)
        # uid 65534 must reach this tree and its venv: a checkout under a 0700 directory (a CI clone
        # in mkdtemp, /root) gets o+x on those ancestors for the test's run only.
        opened = _traversable([Path(p) for p in paths])
        try:
            out = _run_as_nobody(venv, work)
        finally:
            for directory, mode in opened:
                directory.chmod(mode)
    finally:
        shutil.rmtree(work)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["scanned"] == 0 and found["found"] is None, found


def _traversable(paths: list[Path]) -> list[tuple[Path, int]]:
    """Give others search (x) permission on every ancestor of ``paths`` that lacks it; return the
    directories changed with their modes before."""
    changed: list[tuple[Path, int]] = []
    for path in paths:
        for directory in reversed(path.resolve().parents):
            mode = directory.stat().st_mode & 0o7777
            if not mode & 0o001 and directory not in {d for d, _ in changed}:
                directory.chmod(mode | 0o001)
                changed.append((directory, mode))
    return changed


def _run_as_nobody(venv: Path, work: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            str(venv / "bin" / "python"),
            str(work / "host.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


async def test_a_worker_takes_no_pseudo_terminal(server: codemode.Server) -> None:
    """Finding RS-2 on the process runtime: opening ``/dev/ptmx`` read-only (the filter cannot look
    at paths) took a pseudo-terminal of the machine per descriptor the worker could open (32, its
    ``open_files``). The worker's Landlock domain refuses it (``codemode_worker.readable``)."""
    found = await run(server, confinement_probes.PTY_PROBE)
    assert found == {"ptys": 0, "stopped_by": "EACCES"}, found


#: The testing entry on a kernel without Landlock (the ABI query answers ENOSYS, as before 5.13).
NO_LANDLOCK = (
    "from codemode_worker import landlock\n"
    "def _none():\n"
    "    raise landlock.Unavailable(38, 'no Landlock (test)')\n"
    "landlock.abi = _none\n"
    "from codemode_worker import testing_entry as t\n"
    "import os, sys\n"
    "code = t.main()\n"
    "sys.stderr.flush()\n"
    "os._exit(code)\n"
)


async def test_without_landlock_the_descriptor_limit_bounds_the_ptys() -> None:
    """Where the kernel has no Landlock, the worker goes on (documented) and ``RLIMIT_NOFILE``,
    which ``confine`` sets to ``OPEN_FILES_HEADROOM`` above the descriptors it holds, is what
    bounds the ptys one worker can take (EMFILE; 17 measured: the headroom and a gap below the
    highest descriptor), whatever the runtime allowed (4096 here: 256, the probe's cap, before)."""
    runtime = ProcessRuntime(
        ProcessOptions(argv=[sys.executable, "-I", "-c", NO_LANDLOCK], extra_env=TESTING, open_files=4096)
    )
    srv, _ = make_server(runtime=runtime, max_execution_time=20.0)
    try:
        found = await run(srv, confinement_probes.PTY_PROBE)
    finally:
        await srv.aclose()
    assert found["stopped_by"] == "EMFILE" and 0 < found["ptys"] <= OPEN_FILES_HEADROOM + 4, found
