"""DockerRuntime against a real Docker engine: lifecycle, hardening, orphans, exit info, removal.

Skips locally without Docker (visible reason); fails under CI=true. See the ``docker_api`` fixture in
tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import threading
import time
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import ResourceLimit
from codemode.runtimes.base import ExitInfo, Runtime, RuntimeUnavailable, Sandbox, SandboxClosed, SpawnFailed
from codemode.runtimes.docker import (
    DEFAULT_IMAGE,
    WORKER_USER,
    DockerOptions,
    DockerRuntime,
    DockerSandbox,
)
from codemode.runtimes.docker._orphans import OWNER as _OWNER
from codemode.runtimes.seccomp_profile import docker_profile
from tests.support.docker_engine import (
    build_image,
    encode,
    fake_worker,
    read_exact,
    read_frame,
    worker_containers,
)
from tests.support.recorder import value_at_the_limit

pytestmark = pytest.mark.docker


MiB = 1024 * 1024


def _gone(api: Any, cid: str) -> bool:
    import docker.errors

    try:
        api.inspect_container(cid)
    except docker.errors.NotFound:
        return True
    return False


@pytest.fixture
async def runtime(docker_api: Any) -> Any:
    rt = DockerRuntime()
    yield rt
    await rt.aclose()
    assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}")


# ------------------------------------------------------------------------------------------ lifecycle


async def test_runtime_satisfies_the_protocols(runtime: DockerRuntime) -> None:
    assert isinstance(runtime, Runtime)
    assert runtime.name == "docker"
    await runtime.check()
    sandbox = await runtime.spawn()
    try:
        assert isinstance(sandbox, Sandbox)
    finally:
        await sandbox.destroy()


async def test_spawn_probe_close_destroy(runtime: DockerRuntime, docker_api: Any) -> None:
    await runtime.start()
    sandbox = await runtime.spawn()  # spawn includes the probe -> probe_ack handshake
    assert isinstance(sandbox, DockerSandbox)
    assert sandbox.worker_id.startswith("docker-")
    assert sandbox.alive()
    state = docker_api.inspect_container(sandbox.container_id)["State"]
    assert state["Running"]

    await sandbox.close_input()
    await sandbox.close_input()  # idempotent
    with pytest.raises(SandboxClosed):
        await sandbox.write(b"x")
    # The worker sees EOF and ends; its stdout then ends too.
    async with asyncio.timeout(20):
        while await sandbox.read(4096):
            pass
    info = await sandbox.destroy()
    assert isinstance(info, ExitInfo)
    assert info.exit_code is not None
    assert not info.oom_killed
    assert not sandbox.alive()
    assert sandbox.removed
    assert _gone(docker_api, sandbox.container_id)
    assert await sandbox.read(10) == b""
    with pytest.raises(SandboxClosed):
        await sandbox.write(b"x")


async def test_destroy_running_worker_kills_it(runtime: DockerRuntime, docker_api: Any) -> None:
    sandbox = await runtime.spawn()
    t0 = time.monotonic()
    info = await sandbox.destroy()
    assert time.monotonic() - t0 < 10
    assert info.exit_code == 137 and info.signal == signal.SIGKILL
    assert not info.oom_killed
    assert _gone(docker_api, sandbox.container_id)


# ------------------------------------------------------------------------------------------ hardening


async def test_hardening_flags_and_labels_are_applied(docker_api: Any) -> None:
    rt = DockerRuntime(DockerOptions(memory=128 * MiB, cpus=0.5, max_processes=32, open_files=48))
    try:
        sandbox = await rt.spawn()
        try:
            c = docker_api.inspect_container(sandbox.container_id)
        finally:
            await sandbox.destroy()
    finally:
        await rt.aclose()
    hc, cfg = c["HostConfig"], c["Config"]
    assert hc["NetworkMode"] == "none"
    assert cfg.get("NetworkDisabled") is True
    assert c["NetworkSettings"]["Networks"].keys() <= {"none"}
    assert hc["ReadonlyRootfs"] is True
    assert hc["Memory"] == 128 * MiB
    assert hc["MemorySwap"] == 128 * MiB  # memory + swap = memory: no swap
    assert hc["NanoCpus"] == 500_000_000
    assert hc["PidsLimit"] == 32
    assert hc["CapDrop"] == ["ALL"]
    assert not hc.get("CapAdd")
    no_new_privs, seccomp = hc["SecurityOpt"]
    assert no_new_privs == "no-new-privileges"
    # The project's profile (never seccomp=unconfined), derived from the worker's own filter.
    assert seccomp.startswith("seccomp=") and json.loads(seccomp[len("seccomp=") :]) == docker_profile()
    assert hc["Privileged"] is False
    assert hc["IpcMode"] == "none"
    assert not hc.get("Binds") and not c.get("Mounts") and not hc.get("Mounts")
    assert not hc.get("Devices")
    assert hc["Tmpfs"] == {
        "/dev/mqueue": "ro,nosuid,nodev,noexec,size=4k,mode=0555",
        "/tmp": "ro,nosuid,nodev,noexec,size=4k,mode=0555",
    }
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]}
    assert ulimits == {"nofile": (48, 48), "core": (0, 0)}
    # No container log (finding RS-1): the host reads the worker's output on the attach stream.
    assert hc["LogConfig"] == {"Type": "none", "Config": {}}
    assert not c.get("LogPath")
    assert cfg["User"] == WORKER_USER
    assert cfg["OpenStdin"] is True and cfg["StdinOnce"] is True and cfg["Tty"] is False
    image_env = set(docker_api.inspect_image(DEFAULT_IMAGE)["Config"].get("Env") or [])
    assert set(cfg["Env"]) - image_env == {"CODEMODE_WORKER=1"}
    labels = cfg["Labels"]
    assert labels["io.codemode.role"] == "worker"
    assert labels["io.codemode.owner"] == _OWNER.id
    assert labels["io.codemode.owner-pid"] == str(os.getpid())
    assert labels["io.codemode.owner-boot"] == _OWNER.boot
    assert labels["io.codemode.owner-host"] == _OWNER.host
    assert labels["io.codemode.runtime-instance"] == rt.instance_id
    assert labels["io.codemode.protocol-version"] == "1"


async def test_image_is_labelled_and_runs_as_non_root(docker_api: Any) -> None:
    img = docker_api.inspect_image(DEFAULT_IMAGE)["Config"]
    assert img["Labels"]["io.codemode.protocol-version"] == "1"
    assert img["Labels"]["io.codemode.role"] == "worker"
    assert img["User"] == "65532:65532"
    assert img["Entrypoint"] == ["python3", "-I", "-m", "codemode_worker"]


# ------------------------------------------------------------------------------------------ streams


async def test_demultiplexes_interleaved_stdout_and_stderr_exactly(docker_api: Any) -> None:
    # 3 MiB of stdout in odd-sized writes, interleaved with stderr: the host must get stdout
    # byte-exact (the 8-byte Docker headers never respect chunk boundaries) and a stderr tail.
    body = r"""
import hashlib
data = bytes((i * 7 + 3) % 251 for i in range(3 * 1024 * 1024))
pos, n = 0, 1
while pos < len(data):
    _o.write(data[pos:pos + n]); _o.flush()
    sys.stderr.write('e%d\n' % pos); sys.stderr.flush()
    pos += n
    n = (n * 3 + 17) % 200003 + 1
_o.close()
sys.stderr.write('DONE\n')
"""
    rt = DockerRuntime(DockerOptions(entrypoint=fake_worker(body), stdout_buffer_bytes=256 * 1024))
    try:
        sandbox = await rt.spawn()
        received = bytearray()
        async with asyncio.timeout(60):
            while chunk := await sandbox.read(7919):
                received += chunk
        info = await sandbox.destroy()
    finally:
        await rt.aclose()
    expected = bytes((i * 7 + 3) % 251 for i in range(3 * MiB))
    assert hashlib.sha256(received).hexdigest() == hashlib.sha256(expected).hexdigest()
    assert info.exit_code == 0
    assert info.stderr_tail.endswith(b"DONE\n")
    assert len(info.stderr_tail) <= 8 * 1024


CONTAINER_PROFILE_PROBE = r"""
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def outcome(fn):
    try:
        fn()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "allowed"
def raw(number, *args):
    def call():
        if libc.syscall(number, *args) < 0:
            raise OSError(ctypes.get_errno(), "syscall")
    return call
_send({"k": "report", "value": {
    "vsock": outcome(lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)),
    "unix": outcome(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)),
    "io_uring": outcome(raw(425, 1, ctypes.create_string_buffer(120))),
    "fork": outcome(os.fork),
    "memfd": outcome(lambda: os.memfd_create("x")),
    "clone3": outcome(raw(435, None, 0)),  # EINVAL without a profile
}})
"""


async def test_the_container_profile_refuses_without_the_workers_own_filter(docker_api: Any) -> None:
    """The layer under the worker's filter: a worker that never confines itself (this fake one)
    still cannot make a socket (AF_VSOCK included), io_uring, a process or a memfd under runc: the
    container's profile (runtimes.seccomp_profile) refuses them from the first instruction."""
    rt = DockerRuntime(
        DockerOptions(entrypoint=fake_worker(CONTAINER_PROFILE_PROBE))
    )  # runc: runsc applies no profile
    try:
        sandbox = await rt.spawn()
        async with asyncio.timeout(60):
            frame = await read_frame(sandbox)
        await sandbox.destroy()
    finally:
        await rt.aclose()
    assert frame is not None, "the fake worker ended without a report"
    assert frame["value"] == {
        "vsock": "EPERM",
        "unix": "EPERM",
        "io_uring": "EPERM",
        "fork": "EPERM",
        "memfd": "EPERM",
        "clone3": "ENOSYS",
    }


async def test_frames_round_trip_through_the_attached_stream(docker_api: Any) -> None:
    body = r"""
while True:
    try:
        f = _read_frame()
    except SystemExit:
        break
    _send({'k': 'echo', 'n': f['n'], 'pad': f['pad']})
"""
    rt = DockerRuntime(DockerOptions(entrypoint=fake_worker(body)))
    try:
        sandbox = await rt.spawn()
        for n in range(50):
            await sandbox.write(encode({"n": n, "pad": "x" * (n * 997)}))
            frame = await read_frame(sandbox)
            assert frame == {"k": "echo", "n": n, "pad": "x" * (n * 997)}
        await sandbox.close_input()
        assert await read_exact(sandbox, 1) is None
        info = await sandbox.destroy()
        assert info.exit_code == 0
    finally:
        await rt.aclose()


# ------------------------------------------------------------------------------------------ exit info


async def test_exit_info_when_the_worker_is_killed_by_a_signal(docker_api: Any) -> None:
    # The worker is PID 1 of its pid namespace: it can't SIGKILL itself, so kill it from outside
    # (as the kernel's OOM killer or an operator would) and let it die on its own, then destroy.
    rt = DockerRuntime(DockerOptions(entrypoint=fake_worker("time.sleep(300)\n")))
    try:
        sandbox = await rt.spawn()
        docker_api.kill(sandbox.container_id, signal="SIGKILL")
        async with asyncio.timeout(20):
            assert await read_exact(sandbox, 1) is None  # stdout ends when the worker dies
        info = await sandbox.destroy()
    finally:
        await rt.aclose()
    assert info == ExitInfo(exit_code=137, signal=9, oom_killed=False, stderr_tail=b"")
    assert not info.resource_killed


async def test_exit_info_of_a_worker_exiting_on_its_own(docker_api: Any) -> None:
    rt = DockerRuntime(DockerOptions(entrypoint=fake_worker("sys.stderr.write('bye'); sys.exit(7)\n")))
    try:
        sandbox = await rt.spawn()
        assert await read_exact(sandbox, 1) is None
        await asyncio.sleep(0.2)
        assert not sandbox.alive()
        info = await sandbox.destroy()
    finally:
        await rt.aclose()
    assert info.exit_code == 7 and info.signal is None and not info.oom_killed
    assert info.stderr_tail == b"bye"


async def test_oom_kill_is_reported(docker_api: Any) -> None:
    body = "blocks = []\nwhile True:\n    blocks.append(bytearray(8 * 1024 * 1024))\n"
    rt = DockerRuntime(DockerOptions(entrypoint=fake_worker(body), memory=64 * MiB))
    try:
        sandbox = await rt.spawn()
        async with asyncio.timeout(30):
            assert await read_exact(sandbox, 1) is None
        info = await sandbox.destroy()
    finally:
        await rt.aclose()
    assert info.oom_killed
    assert info.resource_killed
    assert info.exit_code == 137


# ------------------------------------------------------------------------------------------ removal


async def test_destroy_is_idempotent_and_removes_exactly_once(docker_api: Any) -> None:
    rt = DockerRuntime()
    try:
        sandbox = await rt.spawn()
        cid = sandbox.container_id
        since = int(time.time()) - 1
        infos = await asyncio.gather(*(sandbox.destroy() for _ in range(5)))
        again = await sandbox.destroy()
        until = int(time.time()) + 1
    finally:
        await rt.aclose()
    assert all(i is infos[0] for i in infos) and again is infos[0]
    assert _gone(docker_api, cid)
    events = list(
        docker_api.events(
            since=since, until=until, decode=True, filters={"container": cid, "event": "destroy"}
        )
    )
    assert len(events) == 1, events


async def test_destroy_is_cancellation_safe(docker_api: Any) -> None:
    rt = DockerRuntime()
    try:
        sandbox = await rt.spawn()
        task = asyncio.ensure_future(sandbox.destroy())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        info = await sandbox.destroy()  # still completes, once
        assert info.exit_code == 137
        assert _gone(docker_api, sandbox.container_id)
    finally:
        await rt.aclose()


async def test_removal_races_with_exiting_containers(docker_api: Any) -> None:
    # Workers that exit by themselves the moment their input closes, destroyed at that same moment:
    # kill/remove race the daemon's own exit handling ("is not running", "removal in progress").
    body = "_i.read()\n"
    rt = DockerRuntime(DockerOptions(entrypoint=fake_worker(body)))
    try:
        sandboxes = await asyncio.gather(*(rt.spawn() for _ in range(6)))
        for s in sandboxes:
            await s.close_input()
        infos = await asyncio.gather(*(s.destroy() for s in sandboxes))
        for s, info in zip(sandboxes, infos, strict=True):
            assert s.removed
            assert info.exit_code in (0, 137)
            assert _gone(docker_api, s.container_id)
    finally:
        await rt.aclose()


async def test_removal_when_the_container_was_removed_behind_our_back(docker_api: Any) -> None:
    rt = DockerRuntime()
    try:
        sandbox = await rt.spawn()
        docker_api.remove_container(sandbox.container_id, force=True)
        info = await sandbox.destroy()  # never raises
        assert info.exit_code is None
        assert sandbox.removed
    finally:
        await rt.aclose()


async def test_aclose_destroys_live_sandboxes(docker_api: Any) -> None:
    rt = DockerRuntime()
    sandboxes = [await rt.spawn() for _ in range(2)]
    await rt.aclose()
    for s in sandboxes:
        assert _gone(docker_api, s.container_id)
    with pytest.raises(RuntimeUnavailable):
        await rt.spawn()


async def test_cancelled_spawn_leaks_nothing(docker_api: Any) -> None:
    rt = DockerRuntime()
    try:
        for delay in (0.0, 0.05, 0.15, 0.3, 0.5):
            task = asyncio.ensure_future(rt.spawn())
            await asyncio.sleep(delay)
            task.cancel()
            try:
                sandbox = await task
            except asyncio.CancelledError:
                pass
            else:
                await sandbox.destroy()
        # The launch thread cleans up after a cancelled spawn asynchronously.
        deadline = time.monotonic() + 20
        while worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}"):
            assert time.monotonic() < deadline, "a cancelled spawn leaked a container"
            await asyncio.sleep(0.2)
    finally:
        await rt.aclose()


# ------------------------------------------------------------------------------------------ spawn failures


async def test_worker_that_never_answers_the_probe_fails_the_spawn(docker_api: Any) -> None:
    rt = DockerRuntime(
        DockerOptions(entrypoint=fake_worker("time.sleep(600)\n", answer_probe=False), spawn_timeout=2.0)
    )
    try:
        t0 = time.monotonic()
        with pytest.raises(SpawnFailed, match="did not acknowledge"):
            await rt.spawn()
        assert time.monotonic() - t0 < 10
    finally:
        await rt.aclose()
    assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}")


async def test_worker_that_answers_garbage_fails_the_spawn(docker_api: Any) -> None:
    body = (
        "sys.stdin.buffer.read(4); sys.stdout.buffer.write(b'\\x00\\x00\\x00\\x02{}'); sys.stdout.flush()\n"
    )
    rt = DockerRuntime(DockerOptions(entrypoint=fake_worker(body, answer_probe=False), spawn_timeout=5.0))
    try:
        with pytest.raises(SpawnFailed):
            await rt.spawn()
    finally:
        await rt.aclose()


async def test_worker_that_exits_at_once_fails_the_spawn(docker_api: Any) -> None:
    rt = DockerRuntime(
        DockerOptions(entrypoint=["python3", "-I", "-c", "raise SystemExit(2)"], spawn_timeout=5.0)
    )
    try:
        with pytest.raises(SpawnFailed):
            await rt.spawn()
    finally:
        await rt.aclose()


async def test_missing_image_is_runtime_unavailable(docker_api: Any) -> None:
    rt = DockerRuntime(DockerOptions(image="codemode-worker:does-not-exist"))
    try:
        with pytest.raises(RuntimeUnavailable, match="not found"):
            await rt.check()
        with pytest.raises(RuntimeUnavailable, match="not found"):
            await rt.spawn()
    finally:
        await rt.aclose()


async def test_image_without_the_protocol_label_is_runtime_unavailable(docker_api: Any) -> None:
    try:
        docker_api.inspect_image("codemode-base:bookworm")  # labelled role=base, no protocol label
    except Exception:
        pytest.skip("codemode-base:bookworm not present (made by scripts/provision-docker.sh)")
    rt = DockerRuntime(DockerOptions(image="codemode-base:bookworm"))
    try:
        with pytest.raises(RuntimeUnavailable, match="protocol"):
            await rt.check()
    finally:
        await rt.aclose()


async def test_an_image_with_a_volume_is_refused_and_a_worker_of_it_leaves_no_volume(docker_api: Any) -> None:
    # The worker image plus VOLUME /scratch: labelled right, but the engine would give every worker a
    # writable anonymous volume there (and keep it after the container, one per execute).
    # The second one's name would recolour the operator's terminal and reverse the text after it.
    volume_line = 'VOLUME ["/scratch", "/s\\u001b[31m\\u202ex"]'
    tag = build_image(docker_api, "codemode-test-volume-worker", f"FROM {DEFAULT_IMAGE}\n{volume_line}\n")
    rt = DockerRuntime(DockerOptions(image=tag))
    try:
        with pytest.raises(
            RuntimeUnavailable, match=r"declares VOLUME '/s\\x1b\[31m\\u202ex', '/scratch'"
        ) as refused:
            await rt.check()
        assert "\x1b" not in str(refused.value) and "\u202e" not in str(refused.value)
        volumes = {v["Name"] for v in docker_api.volumes().get("Volumes") or []}
        for kill in (False, True):  # a worker that ends by itself, and one the host kills
            sandbox = await rt.spawn()
            mounts = docker_api.inspect_container(sandbox.container_id)["Mounts"]
            assert sorted(m["Destination"] for m in mounts) == ["/s\x1b[31m\u202ex", "/scratch"]
            if not kill:
                await sandbox.close_input()  # the worker exits 0 at the end of its input
                async with asyncio.timeout(30):
                    while await sandbox.read(4096):
                        pass
            info = await sandbox.destroy()
            assert info.exit_code == (137 if kill else 0)
            assert _gone(docker_api, sandbox.container_id)
        assert {v["Name"] for v in docker_api.volumes().get("Volumes") or []} <= volumes
    finally:
        await rt.aclose()
        docker_api.remove_image(tag, force=True)


async def test_unknown_oci_runtime_is_runtime_unavailable(docker_api: Any) -> None:
    rt = DockerRuntime(DockerOptions(oci_runtime="no-such-oci-runtime"))
    try:
        with pytest.raises(RuntimeUnavailable, match="no-such-oci-runtime"):
            await rt.check()
        with pytest.raises(RuntimeUnavailable):
            await rt.spawn()
    finally:
        await rt.aclose()


async def test_unreachable_daemon_is_runtime_unavailable_and_fast() -> None:
    rt = DockerRuntime(DockerOptions(base_url="unix:///nonexistent.sock", api_timeout=2.0))
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeUnavailable, match=r"nonexistent\.sock"):
            await rt.check()
        with pytest.raises(RuntimeUnavailable):
            await rt.spawn()
        with pytest.raises(RuntimeUnavailable):
            await rt.start()
        assert time.monotonic() - t0 < 5
    finally:
        await rt.aclose()


async def test_hung_daemon_check_times_out(tmp_path: Any) -> None:
    # A socket that accepts connections and never answers: check() must not hang.
    import socket

    path = str(tmp_path / "hung.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    rt = DockerRuntime(DockerOptions(base_url=f"unix://{path}", api_timeout=1.0, check_timeout=1.5))
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeUnavailable):
            await rt.check()
        assert time.monotonic() - t0 < 4
    finally:
        stop.set()
        t.join()
        for c in accepted:
            c.close()
        server.close()
        await rt.aclose()


# ------------------------------------------------------------------------------------------ orphans


# The orphan tests use their own label prefix, so that cleanup_orphans="all" can't touch the
# containers of other hosts sharing this daemon.
P = "test.codemode"


def _orphan_labels(**overrides: str) -> dict[str, str]:
    labels = {
        P + ".role": "worker",
        P + ".owner": "crashed-host-instance",
        P + ".owner-pid": "999999999",  # above pid_max: no such process
        P + ".owner-start": "1",
        P + ".owner-host": _OWNER.host,
        P + ".owner-boot": _OWNER.boot,
        P + ".owner-pidns": _OWNER.pidns,
        P + ".runtime-instance": "gone",
        P + ".test": "orphan",
    }
    labels.update(overrides)
    return labels


def test_orphan_rule() -> None:
    rt = DockerRuntime(DockerOptions(label_prefix=P))
    me = str(os.getpid())
    assert rt.is_orphan(_orphan_labels())  # same machine, owner pid not running
    # Same machine, pid running but it is another process (start time differs): pid reuse.
    assert rt.is_orphan(_orphan_labels(**{P + ".owner-pid": me}))
    # Same machine, owner process alive.
    assert not rt.is_orphan(_orphan_labels(**{P + ".owner-pid": me, P + ".owner-start": _OWNER.start}))
    # Same host name, another boot: the machine restarted.
    assert rt.is_orphan(_orphan_labels(**{P + ".owner-boot": "another-boot"}))
    # Another host (a different machine or host container): can't tell -> keep.
    assert not rt.is_orphan(_orphan_labels(**{P + ".owner-host": "elsewhere", P + ".owner-pidns": "pid:[1]"}))
    # Never our own, never non-workers.
    assert not rt.is_orphan(_orphan_labels(**{P + ".owner": rt.owner}))
    assert not rt.is_orphan(_orphan_labels(**{P + ".role": "base"}))
    # "all" removes everything that is not ours; "none" nothing.
    everything = DockerRuntime(DockerOptions(label_prefix=P, cleanup_orphans="all"))
    assert everything.is_orphan(_orphan_labels(**{P + ".owner-host": "elsewhere"}))
    assert not DockerRuntime(DockerOptions(label_prefix=P, cleanup_orphans="none")).is_orphan(
        _orphan_labels()
    )


async def test_start_removes_orphans_of_a_dead_owner_only(docker_api: Any) -> None:
    def make(labels: dict[str, str], start: bool) -> str:
        cid: str = docker_api.create_container(
            DEFAULT_IMAGE,
            entrypoint=["python3", "-I", "-c", "import time; time.sleep(300)"],
            labels=labels,
            host_config=docker_api.create_host_config(network_mode="none", read_only=True),
        )["Id"]
        if start:
            docker_api.start(cid)
        return cid

    me = str(os.getpid())
    dead_running = make(_orphan_labels(), start=True)
    dead_created = make(_orphan_labels(), start=False)
    rebooted = make(_orphan_labels(**{P + ".owner-boot": "old-boot"}), start=False)
    alive_owner = make(
        _orphan_labels(
            **{
                P + ".owner": "live-other-instance",
                P + ".owner-pid": me,
                P + ".owner-start": _OWNER.start,
            }
        ),
        start=False,
    )
    elsewhere = make(
        _orphan_labels(**{P + ".owner-host": "other-machine", P + ".owner-boot": "b"}),
        start=False,
    )
    try:
        rt = DockerRuntime(DockerOptions(label_prefix=P))
        await rt.start()
        await rt.aclose()
        assert rt.orphans_removed >= 3
        for cid in (dead_running, dead_created, rebooted):
            assert _gone(docker_api, cid)
        for cid in (alive_owner, elsewhere):
            assert not _gone(docker_api, cid)

        everything = DockerRuntime(DockerOptions(label_prefix=P, cleanup_orphans="all"))
        await everything.start()
        await everything.aclose()
        for cid in (alive_owner, elsewhere):
            assert _gone(docker_api, cid)
    finally:
        for cid in (dead_running, dead_created, rebooted, alive_owner, elsewhere):
            if not _gone(docker_api, cid):
                docker_api.remove_container(cid, force=True)
    assert not docker_api.containers(all=True, filters={"label": [P + ".test=orphan"]})


# ------------------------------------------------------------------------------------------ gVisor


async def test_gvisor_runtime_when_registered(docker_api: Any) -> None:
    if "runsc" not in (docker_api.info().get("Runtimes") or {}):
        pytest.skip("gVisor (runsc) is not registered with dockerd (optional; see docs/docker.md)")
    rt = DockerRuntime(DockerOptions(oci_runtime="runsc"))
    try:
        assert rt.name == "docker:runsc"
        await rt.check()
        sandbox = await rt.spawn()
        c = docker_api.inspect_container(sandbox.container_id)
        assert c["HostConfig"]["Runtime"] == "runsc"
        info = await sandbox.destroy()
        assert info.exit_code == 137
    finally:
        await rt.aclose()


_CRASHING_HOST = r"""
import asyncio, sys
from codemode.runtimes.docker import DockerOptions, DockerRuntime

async def main():
    rt = DockerRuntime(DockerOptions(entrypoint=sys.argv[1:]))
    sandboxes = [await rt.spawn() for _ in range(2)]
    print(" ".join(s.container_id for s in sandboxes), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_containers_of_a_sigkilled_host_are_removed_at_restart(docker_api: Any) -> None:
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_HOST, *fake_worker("time.sleep(600)\n")],
        stdout=subprocess.PIPE,
        cwd=os.getcwd(),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        cids = line.decode().split()
        assert len(cids) == 2
    finally:
        proc.kill()  # SIGKILL: no clean-up runs in the host
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    for cid in cids:
        assert docker_api.inspect_container(cid)["State"]["Running"]
    restarted = DockerRuntime()
    try:
        await restarted.start()
        assert restarted.orphans_removed >= 2
    finally:
        await restarted.aclose()
    for cid in cids:
        assert _gone(docker_api, cid)


# ------------------------------------------------------------------------------------------ big values


async def test_a_final_value_at_the_size_limit_crosses_intact_as_the_worker_exits(docker_api: Any) -> None:
    """The last frame a worker writes before it exits may be as large as a value can be: the
    host's attach reader must get every byte (the engine drops what it still holds for a stream once
    the container is gone, so nothing may be left unread because the host paused). A 64 KiB stdout
    buffer makes the reader pause and resume many times within that one frame."""
    b = codemode.Builder(
        authorizer=authz.allow_all(), runtime=DockerRuntime(DockerOptions(stdout_buffer_bytes=64 * 1024))
    )
    srv = b.build()
    at_limit, over, expected = value_at_the_limit(srv.limits.max_value_bytes)
    try:
        for _ in range(3):
            value = await srv.execute(at_limit, subject=authz.Subject("a"))
            assert len(value) == srv.limits.max_value_bytes - 2 and value == expected
        with pytest.raises(ResourceLimit):
            await srv.execute(over, subject=authz.Subject("a"))
    finally:
        await srv.aclose()
