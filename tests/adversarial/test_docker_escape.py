"""Escape suite: a compromised worker inside the Docker runtime's container must stay contained.

Starlark has no I/O, so these tests use the TEST-ONLY worker entry
(``python -m codemode_worker.testing_entry``, enabled by ``DockerOptions(testing_entry=True)``):
it answers the probe like the real worker, then runs the exec frame's ``source`` as arbitrary
**Python**, with the same limits. The production image does not contain that entry: the tests run
the test image (``worker_image/Dockerfile --target testing``, ``codemode-worker-testing:1``; override
with CODEMODE_TEST_TESTING_IMAGE), which is the production image plus that one module. Each test has
one defined outcome.

Runtime-level tests drive the sandbox directly; pipeline-level tests go through
``codemode.Server.execute`` to show what the client sees (``resource limit exceeded`` for the
memory limit and the deadline, ``internal failure`` for protocol abuse).

Skips locally without Docker (visible reason); fails under CI=true (the ``docker_api`` fixture in
tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.ops.image_audit import writable_check
from codemode.runtimes.base import SpawnFailed
from codemode.runtimes.docker import (
    DEFAULT_IMAGE,
    STDERR_TAIL,
    DockerOptions,
    DockerRuntime,
    DockerSandbox,
)
from codemode.runtimes.docker._orphans import OWNER as _OWNER
from codemode_worker import PROTOCOL_VERSION
from codemode_worker.protocol import encode_frame
from tests.adversarial import confinement_probes
from tests.support.docker_engine import read_exact, read_frame, worker_containers

from .kernel_probe import PROBE, not_refused

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# CODEMODE_TEST_OCI_RUNTIME=runsc runs the whole suite under gVisor (default: the daemon's runc).
OCI_RUNTIME = os.environ.get("CODEMODE_TEST_OCI_RUNTIME") or None
GVISOR = OCI_RUNTIME == "runsc"

#: The production image plus codemode_worker.testing_entry (built by scripts/provision-docker.sh).
TESTING_IMAGE = os.environ.get("CODEMODE_TEST_TESTING_IMAGE") or f"codemode-worker-testing:{PROTOCOL_VERSION}"
PRODUCTION_IMAGE = os.environ.get("CODEMODE_TEST_WORKER_IMAGE") or DEFAULT_IMAGE

MiB = 1024 * 1024
SUBJECT = authz.Subject("escape-suite")
LIMITS = {
    "max_steps": 1_000_000,
    "max_value_depth": 32,
    "max_value_bytes": MiB,
    "max_native_calls": 100,
    "max_callstack": 100,
}


@pytest.fixture(scope="module", autouse=True)
def no_leaked_containers(docker_api: Any) -> Iterator[None]:
    """Zero worker containers are left over after the whole suite."""
    yield
    deadline = time.monotonic() + 30
    mine = f"io.codemode.owner={_OWNER.id}"  # this test process (other hosts may share the daemon)
    while (left := worker_containers(docker_api, mine)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"leaked worker containers: {[c['Id'][:12] for c in left]}"


@pytest.fixture
async def testing_runtime(docker_api: Any) -> AsyncIterator[DockerRuntime]:
    rt = DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE))
    yield rt
    await rt.aclose()


def exec_frame(source: str) -> bytes:
    return encode_frame({"k": "exec", "v": 1, "source": source, "manifest": [], "limits": LIMITS})


async def run_python(sandbox: DockerSandbox, source: str, timeout: float = 60) -> Any:
    """Run Python in the worker; return the value it passed to ``final(...)``."""
    await sandbox.write(exec_frame(source))
    async with asyncio.timeout(timeout):
        frame = await read_frame(sandbox)
    assert frame is not None, f"worker ended without a final frame: {sandbox.stderr_tail!r}"
    assert frame["k"] == "final", frame
    return frame["value"]


async def run_fresh(rt: DockerRuntime, source: str) -> Any:
    sandbox = await rt.spawn()
    try:
        return await run_python(sandbox, source)
    finally:
        await sandbox.destroy()


def server(runtime: codemode.Runtime, **limits: Any) -> codemode.Server:
    builder = codemode.Builder(
        authorizer=authz.allow_all(), runtime=runtime, limits=codemode.Limits(**limits)
    )
    return builder.build()


# ------------------------------------------------------------------------------------------ network


async def test_network_egress_and_dns_fail(testing_runtime: DockerRuntime) -> None:
    # A listener on the host's loopback: the worker's 127.0.0.1 is its own namespace's loopback.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    source = f"""
import errno, socket
res = {{}}
def attempt(name, fn):
    try:
        fn()
        res[name] = "ok"
    except socket.gaierror as e:
        res[name] = "gaierror"
    except OSError as e:
        res[name] = errno.errorcode.get(e.errno, str(e.errno))
attempt("host_loopback_port", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3))
attempt("ipv4_address", lambda: socket.create_connection(("192.0.2.1", 80), timeout=3))
attempt("ipv6_address", lambda: socket.create_connection(("2001:db8::1", 80), timeout=3))
attempt("udp_send", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("192.0.2.1", 53)))
attempt("dns", lambda: socket.getaddrinfo("example.com", 443))
attempt("raw_socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet_socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("interfaces", socket.if_nameindex)  # a netlink socket
final(res)
"""
    try:
        res = await run_fresh(testing_runtime, source)
    finally:
        stop.set()
        t.join()
        listener.close()
    # The worker's own seccomp filter refuses every new socket (under it: the container's network
    # namespace with only a loopback interface, network_mode none).
    sockets = ("host_loopback_port", "ipv4_address", "ipv6_address", "udp_send", "raw_socket")
    assert {name: res[name] for name in (*sockets, "packet_socket", "interfaces")} == dict.fromkeys(
        (*sockets, "packet_socket", "interfaces"), "EPERM"
    ), res
    assert res["dns"] == "gaierror"
    assert accepted == []


# ------------------------------------------------------------------------------------------ filesystem


async def test_nothing_on_the_filesystem_is_writable(testing_runtime: DockerRuntime) -> None:
    source = r"""
import errno, os
writable, errors, checked = [], set(), 0
for root, dirs, files in os.walk("/"):
    if root in ("/proc", "/sys") or root.startswith(("/proc/", "/sys/")):
        dirs[:] = []
        continue
    checked += 1
    try:
        fd = os.open(os.path.join(root, ".escape-probe"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
        os.close(fd)
        writable.append(root)
    except OSError as e:
        errors.add(errno.errorcode.get(e.errno, str(e.errno)))
existing = []
for path in ("/etc/passwd", "/etc/hosts", "/etc/resolv.conf", "/usr/bin/python3",
             os.path.join(os.path.dirname(protocol.__file__), "protocol.py")):
    try:
        with open(path, "ab"):
            existing.append(path)
    except OSError as e:
        errors.add(errno.errorcode.get(e.errno, str(e.errno)))
for attempt in (lambda: os.mkdir("/escape"), lambda: os.chmod("/etc/passwd", 0o777),
                lambda: os.symlink("/etc/passwd", "/tmp/x")):
    try:
        attempt()
        existing.append("mkdir/chmod/symlink")
    except OSError as e:
        errors.add(errno.errorcode.get(e.errno, str(e.errno)))
final({"writable": writable, "existing": existing, "errors": sorted(errors), "checked": checked,
       "shm": os.path.exists("/dev/shm"), "mqueue": os.listdir("/dev/mqueue")})
"""
    res = await run_fresh(testing_runtime, source)
    assert res["writable"] == []
    assert res["existing"] == []
    assert res["checked"] > 50  # directories walked (the slim image has about 100)
    assert set(res["errors"]) <= {"EROFS", "EACCES", "EPERM", "ENOENT"}  # ENOENT: no /etc/passwd (slim image)
    if not GVISOR:  # gVisor has its own (internal, here not writable) /dev/shm
        assert res["shm"] is False  # IpcMode none: no /dev/shm tmpfs
    assert res["mqueue"] == []


async def test_the_container_alone_leaves_nothing_writable_masked_directories_included(
    docker_api: Any,
) -> None:
    """Found while measuring crun against runc: the worker's own Landlock domain refuses
    every write, so the test above cannot see what the container alone leaves writable. This runs a
    process beside the worker with the container's own confinement only (``docker exec`` as the
    worker's user: its seccomp profile, no capabilities, no new privileges, no Landlock), with the
    image audit's probe (``codemode.ops.image_audit.writable_check``: only EROFS, EACCES and ENOENT
    count as refused, anything else fails). The masked directories (``/proc/sys/fs``,
    ``/proc/sys/kernel/pty``, the ``/sys`` ones) are empty tmpfs
    mounts; runc mounts them read-only. crun 1.8.1 leaves them read-write with mode 1777 and no size
    limit, so any process of the worker's user could store data in them: this fails under
    ``CODEMODE_TEST_OCI_RUNTIME=crun`` (docs/docker.md, "Which OCI runtime")."""
    rt = DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME))
    try:
        sandbox = await rt.spawn()
        try:
            check = await writable_check(docker_api, sandbox.container_id)
        finally:
            await sandbox.destroy()
    finally:
        await rt.aclose()
    assert check.status == "PASS", (check.detail, check.findings)
    assert int(check.detail.split()[2]) > 50  # the image's directories, the mount points, the masked paths


# ------------------------------------------------------------------------------------------ env, creds


async def test_environment_and_credentials_do_not_leak(
    testing_runtime: DockerRuntime, docker_api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "escape-suite-secret-0c6f2b"
    monkeypatch.setenv("CODEMODE_ESCAPE_SECRET", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    source = r"""
import os
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        return "error:%d" % e.errno
status = dict(line.split(":\t", 1) for line in proc_text("/proc/self/status").splitlines() if ":\t" in line)
try:
    os.setuid(0)
    setuid = "ok"
except OSError as e:
    setuid = e.errno
final({
    "environ": dict(os.environ),
    "pid1_environ": read("/proc/1/environ"),
    "uid": [os.getuid(), os.geteuid(), os.getgid(), os.getegid()],
    "groups": os.getgroups(),
    "setuid0": setuid,
    "cap_eff": status["CapEff"].strip(), "cap_prm": status["CapPrm"].strip(),
    "cap_bnd": status["CapBnd"].strip(),
    "no_new_privs": status.get("NoNewPrivs", "?").strip(), "seccomp": status.get("Seccomp", "?").strip(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "docker_sock": [p for p in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd")
                    if os.path.exists(p)],
    "secrets": [p for p in ("/run/secrets", "/var/run/secrets", "/root/.docker", "/.dockerenv")
                if os.path.exists(p) and p != "/.dockerenv"],
    "shadow": read("/etc/shadow")[:6],
    "hostname": read("/etc/hostname").strip(),
})
"""
    res = await run_fresh(testing_runtime, source)
    assert secret not in json.dumps(res)
    image_env = dict(
        e.split("=", 1) for e in docker_api.inspect_image(TESTING_IMAGE)["Config"].get("Env") or []
    )
    env = res["environ"]
    extra = set(env) - set(image_env) - {"HOSTNAME", "HOME"}
    assert extra == {"CODEMODE_WORKER", "CODEMODE_WORKER_TESTING"}  # the marker (+ this test entry)
    assert env["CODEMODE_WORKER"] == "1"
    assert res["uid"] == [65532, 65532, 65532, 65532]
    assert res["setuid0"] == 1  # EPERM
    assert int(res["cap_eff"], 16) == 0 and int(res["cap_prm"], 16) == 0 and int(res["cap_bnd"], 16) == 0
    if not GVISOR:  # gVisor's /proc has neither field; its sentry itself runs under seccomp
        assert res["no_new_privs"] == "1"
        assert res["seccomp"] == "2"  # a seccomp filter is active (Docker's default profile)
    assert res["pids"] == [1]  # its own pid namespace: it sees only itself
    assert res["docker_sock"] == [] and res["secrets"] == []
    assert res["shadow"].startswith("error:")
    assert res["hostname"] == "worker"


async def test_namespace_and_mount_syscalls_are_refused(testing_runtime: DockerRuntime) -> None:
    source = r"""
import ctypes, ctypes.util, os
libc = ctypes.CDLL(None, use_errno=True)
def call(fn, *args):
    r = fn(*args)
    return 0 if r == 0 else ctypes.get_errno()
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
final({
    "unshare_user": call(libc.unshare, CLONE_NEWUSER),
    "unshare_mount": call(libc.unshare, CLONE_NEWNS),
    "unshare_net": call(libc.unshare, CLONE_NEWNET),
    "mount_tmpfs": call(libc.mount, b"none", b"/tmp", b"tmpfs", 0, None),
    "chroot": call(libc.chroot, b"/usr"),
    "ptrace_attach_1": call(libc.ptrace, 16, 1, None, None),
})
"""
    res = await run_fresh(testing_runtime, source)
    # The worker's own filter refuses each (EPERM), under gVisor too, whose user-space kernel would
    # implement namespaces (unshare, then chroot as root of the new user namespace) inside the sandbox.
    assert res == dict.fromkeys(res, 1), res


async def test_the_kernel_surface_is_the_filters(testing_runtime: DockerRuntime) -> None:
    """On any engine (runc with whatever profile, gVisor) the worker's own seccomp filter
    refuses io_uring, AF_VSOCK and every other new socket, ptrace, bpf, keys, namespaces, mounts,
    fork, and execve of anything (a memfd's ELF included)."""
    report = await run_fresh(testing_runtime, PROBE)
    if GVISOR:  # gVisor has no 32-bit ABI at all (EBADF), and its /proc has neither status field
        assert report.pop("int80_getpid") == "EBADF", report
    else:
        assert report["_seccomp"] == "2" and report["_no_new_privs"] == "1", report
    assert not_refused(report) == {}, report


async def test_argument_forms_and_other_abis_are_refused(testing_runtime: DockerRuntime) -> None:
    """Found by a security review: the argument forms and ABIs of ``confinement_probes.FORMS_PROBE``
    (x32 numbers, clone flag mixes, fcntl/ioctl commands, open with a write flag in any spelling,
    signals, pidfds, another seccomp filter, priorities, the splice family) are refused here too."""
    report = await run_fresh(testing_runtime, confinement_probes.FORMS_PROBE)
    assert not_refused(report) == {}, report


async def test_a_worker_takes_no_pseudo_terminal(testing_runtime: DockerRuntime) -> None:
    """The worker never needs a terminal, but opening ``/dev/ptmx`` (a read-only open the filter
    allows) allocates one from a count the whole machine shares (``kernel.pty.max`` - reserve = 3072
    for all containers): 52 Docker workers together, or one Kubernetes worker, leave every other
    container without a pty. (Under gVisor the ptys are the sandbox's own, not the host's.)"""
    found = await run_fresh(testing_runtime, confinement_probes.PTY_PROBE)
    assert found["ptys"] == 0, found


async def test_a_workers_stderr_is_not_stored_on_the_hosts_disk(
    testing_runtime: DockerRuntime, docker_api: Any
) -> None:
    """A worker's stdout/stderr as a disk-filling channel: the host keeps
    an 8 KiB stderr tail, but the engine also writes everything the worker prints to the container's
    log file (``json-file``, no ``max-size``), one JSON object per line: 4 MiB of two-byte lines made
    ~150 MB on the host's disk (32 MiB made 1.2 GB in 16 s), there until the container is removed."""
    sandbox = await testing_runtime.spawn()
    try:
        assert await run_python(sandbox, confinement_probes.STDERR_FLOOD) == {
            "written": confinement_probes.STDERR_FLOOD_BYTES
        }
        path = docker_api.inspect_container(sandbox.container_id).get("LogPath") or ""
        stored = os.path.getsize(path) if path and os.path.exists(path) else 0
        tail = sandbox.stderr_tail
    finally:
        await sandbox.destroy()
    assert stored <= 1024 * 1024, f"{stored} bytes in {path}"
    # The host still gets the worker's stderr on the attach stream, as a bounded tail.
    assert 0 < len(tail) <= STDERR_TAIL and set(tail) == set(b"x\n"), len(tail)


# ------------------------------------------------------------------------------------------ processes


async def test_fork_is_refused_and_a_thread_bomb_is_stopped_by_the_pids_limit(docker_api: Any) -> None:
    """The worker's filter refuses fork (clone without CLONE_THREAD); threads it must allow (the
    interpreter runs on one), and the pids limit bounds them."""
    rt = DockerRuntime(
        DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE, max_processes=32)
    )
    source = r"""
import errno, os, time, threading
try:
    os.fork()
    fork = "allowed"
except OSError as e:
    fork = errno.errorcode.get(e.errno)
threads, refused = 0, False
while threads < 2000:
    try:
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    except RuntimeError:
        refused = True
        break
    threads += 1
final({"fork": fork, "threads": threads, "refused": refused})
time.sleep(600)  # keep the bomb alive until the host destroys the container
"""
    try:
        sandbox = await rt.spawn()
        await sandbox.write(exec_frame(source))
        async with asyncio.timeout(60):
            frame = await read_frame(sandbox)
        # While the bomb's threads are still alive, the host can start other workers.
        other = await rt.spawn()
        await other.destroy()
        t0 = time.monotonic()
        info = await sandbox.destroy()
        assert time.monotonic() - t0 < 15
    finally:
        await rt.aclose()
    if GVISOR:
        # Under gVisor the pids limit counts the sentry's own threads: the bomb may starve the
        # sandbox kernel, which exits (status 2) — the whole sandbox dies, nothing reaches the host.
        assert frame is None or (frame["k"] == "final" and frame["value"]["fork"] == "EPERM")
        assert frame is not None or info.exit_code not in (0, None)
    else:
        assert frame is not None and frame["k"] == "final", sandbox.stderr_tail
        res = frame["value"]
        assert res["fork"] == "EPERM"
        assert res["refused"] and res["threads"] < 32, res
        assert info.exit_code == 137
    assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}")


async def test_memory_bomb_is_oom_killed(docker_api: Any) -> None:
    rt = DockerRuntime(
        DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE, memory=128 * MiB)
    )
    try:
        sandbox = await rt.spawn()
        await sandbox.write(exec_frame("blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))\n"))
        async with asyncio.timeout(60):
            assert await read_exact(sandbox, 1) is None  # killed: stdout ends, no final frame
        info = await sandbox.destroy()
    finally:
        await rt.aclose()
    assert info.oom_killed and info.resource_killed
    assert info.exit_code == 137


async def test_memory_bomb_is_resource_limit_exceeded_for_the_client(docker_api: Any) -> None:
    srv = server(
        DockerRuntime(
            DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE, memory=128 * MiB)
        ),
        max_execution_time=30.0,
    )
    try:
        with pytest.raises(codemode.ResourceLimit) as err:
            await srv.execute("b = []\nwhile True:\n    b.append(bytearray(16 << 20))\n", subject=SUBJECT)
        assert str(err.value) == "resource limit exceeded"
    finally:
        await srv.aclose()


async def test_cpu_is_throttled_to_the_quota(docker_api: Any) -> None:
    if GVISOR:
        pytest.skip("gVisor virtualizes process CPU time; the quota applies to its sentry on the host")
    rt = DockerRuntime(
        DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE, cpus=0.25)
    )
    source = r"""
import time
t0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - t0 < 2.0:
    pass
final({"wall": time.monotonic() - t0, "cpu": time.process_time() - c0})
"""
    try:
        res = await run_fresh(rt, source)
    finally:
        await rt.aclose()
    assert res["cpu"] < 0.5 * res["wall"], res  # a quarter CPU (+ scheduling slack), not a whole one


async def test_cpu_spin_is_killed_at_the_deadline(docker_api: Any) -> None:
    srv = server(
        DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE)),
        max_execution_time=2.0,
    )
    try:
        t0 = time.monotonic()
        with pytest.raises(codemode.ResourceLimit) as err:
            await srv.execute("while True:\n    pass\n", subject=SUBJECT)
        assert isinstance(err.value, TimeoutError)
        assert time.monotonic() - t0 < 6
    finally:
        await srv.aclose()


async def test_cpu_spin_is_killed_by_destroy(testing_runtime: DockerRuntime, docker_api: Any) -> None:
    sandbox = await testing_runtime.spawn()
    await sandbox.write(exec_frame("while True:\n    pass\n"))
    await asyncio.sleep(1.0)
    t0 = time.monotonic()
    info = await sandbox.destroy()
    assert time.monotonic() - t0 < 10
    assert info.exit_code == 137 and info.signal == 9 and not info.oom_killed
    assert sandbox.removed


# ------------------------------------------------------------------------------------------ output abuse


async def test_giant_final_value_is_refused(docker_api: Any) -> None:
    srv = server(
        DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE))
    )
    try:
        with pytest.raises(codemode.CodeModeError) as err:
            await srv.execute("final('x' * (8 << 20))\n", subject=SUBJECT)
        # 8 MiB frame > max_value_bytes + 64 KiB: refused from its length header.
        assert str(err.value) == "internal failure"
    finally:
        await srv.aclose()


async def test_huge_frame_header_is_refused_without_allocating(docker_api: Any) -> None:
    srv = server(
        DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE)),
        max_execution_time=10.0,
    )
    try:
        t0 = time.monotonic()
        with pytest.raises(codemode.CodeModeError) as err:
            await srv.execute("stdout.write(b'\\xff\\xff\\xff\\xff'); stdout.flush()\n", subject=SUBJECT)
        assert str(err.value) == "internal failure"
        assert time.monotonic() - t0 < 8
    finally:
        await srv.aclose()


async def test_stdout_flood_is_bounded_on_the_host(docker_api: Any) -> None:
    rt = DockerRuntime(
        DockerOptions(
            oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE, stdout_buffer_bytes=256 * 1024
        )
    )
    try:
        sandbox = await rt.spawn()
        await sandbox.write(
            exec_frame("chunk = b'A' * 65536\nwhile True:\n    stdout.write(chunk)\n    stdout.flush()\n")
        )
        await asyncio.sleep(2.0)  # the host reads nothing meanwhile
        assert sandbox.buffered_bytes <= 256 * 1024 + 64 * 1024
        got = await sandbox.read(10 * MiB)
        assert 0 < len(got) <= 320 * 1024 and set(got) == {ord("A")}
        t0 = time.monotonic()
        info = await sandbox.destroy()
        assert time.monotonic() - t0 < 10
        assert info.exit_code == 137
    finally:
        await rt.aclose()


async def test_stdout_flood_is_internal_failure_for_the_client(docker_api: Any) -> None:
    srv = server(
        DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE)),
        max_execution_time=10.0,
    )
    try:
        t0 = time.monotonic()
        with pytest.raises(codemode.CodeModeError) as err:
            await srv.execute(
                "while True:\n    stdout.write(b'A' * 65536)\n    stdout.flush()\n", subject=SUBJECT
            )
        assert str(err.value) == "internal failure"
        assert time.monotonic() - t0 < 8
    finally:
        await srv.aclose()


async def test_stderr_flood_keeps_only_a_bounded_tail(testing_runtime: DockerRuntime) -> None:
    sandbox = await testing_runtime.spawn()
    source = (
        "import sys\nfor i in range(2000):\n    sys.stderr.write('E' * 16383 + '\\n')\n"
        "sys.stderr.write('END'); sys.stderr.flush()\nfinal(1)\n"
    )
    assert await run_python(sandbox, source) == 1
    await sandbox.close_input()
    info = await sandbox.destroy()
    assert len(info.stderr_tail) <= 8 * 1024
    assert info.stderr_tail.endswith(b"END")


# ------------------------------------------------------------------------------------------ stdin / liveness


async def test_host_closing_stdin_early_ends_the_worker_cleanly(testing_runtime: DockerRuntime) -> None:
    sandbox = await testing_runtime.spawn()
    await sandbox.close_input()
    async with asyncio.timeout(20):
        assert await read_exact(sandbox, 1) is None
    info = await sandbox.destroy()
    assert info.exit_code == 0 and not info.oom_killed


async def test_worker_closing_its_streams_ends_at_the_deadline(docker_api: Any) -> None:
    # The worker closes stdin, stdout and stderr and hangs. Docker keeps the attach connection open
    # while its stdin copy is pending, so the host sees silence, not EOF: the execution deadline
    # ends it (resource limit exceeded) and the container is killed and removed.
    rt = DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE))
    srv = server(rt, max_execution_time=3.0)
    source = "import os, time\nstdout.close()\nos.close(0)\nos.close(1)\nos.close(2)\ntime.sleep(600)\n"
    try:
        t0 = time.monotonic()
        with pytest.raises(codemode.ResourceLimit):
            await srv.execute(source, subject=SUBJECT)
        assert time.monotonic() - t0 < 8
    finally:
        await srv.aclose()
    assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}")


async def test_worker_that_never_answers_the_probe(docker_api: Any) -> None:
    rt = DockerRuntime(
        DockerOptions(
            oci_runtime=OCI_RUNTIME,
            entrypoint=["python3", "-I", "-c", "import time; time.sleep(600)"],
            spawn_timeout=2.0,
        )
    )
    try:
        t0 = time.monotonic()
        with pytest.raises(SpawnFailed):
            await rt.spawn()
        assert time.monotonic() - t0 < 10
    finally:
        await rt.aclose()


async def test_worker_that_never_answers_the_program(docker_api: Any) -> None:
    srv = server(
        DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE)),
        max_execution_time=2.0,
    )
    try:
        t0 = time.monotonic()
        with pytest.raises(codemode.ResourceLimit):
            await srv.execute("import time\ntime.sleep(600)\n", subject=SUBJECT)
        assert time.monotonic() - t0 < 6
    finally:
        await srv.aclose()


async def test_testing_entry_refuses_to_run_without_its_variable(docker_api: Any) -> None:
    # The test entry is inert in a normal deployment: without CODEMODE_WORKER_TESTING=1 it exits 3.
    rt = DockerRuntime(
        DockerOptions(
            image=TESTING_IMAGE,
            oci_runtime=OCI_RUNTIME,
            entrypoint=["python3", "-I", "-m", "codemode_worker.testing_entry"],
            spawn_timeout=5.0,
        )
    )
    try:
        with pytest.raises(SpawnFailed):
            await rt.spawn()
    finally:
        await rt.aclose()


async def test_production_image_has_no_test_entry(docker_api: Any) -> None:
    # Even with its variable set, the production image cannot run the test entry: it is not there.
    # the test entry's command and its variable (testing_entry); the image is the production one
    rt = DockerRuntime(
        DockerOptions(image=PRODUCTION_IMAGE, oci_runtime=OCI_RUNTIME, testing_entry=True, spawn_timeout=5.0)
    )
    try:
        with pytest.raises(SpawnFailed):
            await rt.spawn()
    finally:
        await rt.aclose()


async def test_image_has_no_shell_or_package_manager(testing_runtime: DockerRuntime) -> None:
    # The test image is the production image plus one module: what is missing here is missing there.
    source = """
import os, glob
names = ["sh", "bash", "dash", "ash", "busybox", "dpkg", "apt", "apt-get", "pip", "pip3", "perl", "env"]
dirs = ["/bin", "/usr/bin", "/sbin", "/usr/sbin", "/usr/local/bin"]
found = [d + "/" + n for d in dirs for n in names if os.path.lexists(d + "/" + n)]
found += glob.glob("/var/lib/dpkg") + glob.glob("/usr/lib/python3*/ensurepip")
found += glob.glob("/usr/**/site-packages/pip", recursive=True)
found += glob.glob("/usr/**/dist-packages/pip", recursive=True) + glob.glob("/opt/**/pip", recursive=True)
final({"found": found, "bin": sorted(os.listdir("/usr/bin"))})
"""
    res = await run_fresh(testing_runtime, source)
    assert res["found"] == [], res
    assert all(name.startswith("python3") for name in res["bin"]), res["bin"]
