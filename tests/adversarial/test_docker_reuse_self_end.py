"""Review attacks on the reuse mode's self-ended epochs on Docker (the supervisor probes each new
worker itself and ends an epoch when its worker exits unasked; the host then sends no ``K``, or a
late one after ``SELF_END_GRACE``), and on the compiled filter of the supervisor's workers.

A compromised worker (the TEST-ONLY entry: each exec frame's source runs as **Python**, with the
worker's own filter, "confined", and without it, "unconfined") exits at chosen moments, leaves
forged frames in its pipes, leaves a writer on them, or never exits; the next execute of the same
subject must see nothing of it and get its own result, the failed execute must never count as a
clean one, and a late ``K`` must never reach a later epoch.

Image: the test image (``CODEMODE_TEST_TESTING_IMAGE``). Skips locally without Docker; fails under
CI=true.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import Internal
from codemode.runtimes.docker import DockerOptions, DockerRuntime
from codemode.runtimes.reuse import ReusePool, supervised
from codemode_worker import supervisor_channel as channel
from tests.support.docker_engine import worker_containers
from tests.support.recorder import Recorder, make_capabilities
from tests.support.reuse import Sandboxes

from . import reuse_probe as rp
from .test_docker_escape import OCI_RUNTIME, TESTING_IMAGE
from .test_docker_reuse import no_leaked_containers  # noqa: F401  (autouse: applies here too)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ALICE = authz.Subject("alice")

#: What the next execute runs: its own pid, every pid it sees, and a marker value.
WHO = """
import os
final({"me": "next", "pid": os.getpid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())})
"""


class Rig:
    def __init__(self, server: codemode.Server, pool: ReusePool, seen: Sandboxes, rec: Recorder) -> None:
        self.server, self.pool, self.seen, self.rec = server, pool, seen, rec

    async def idle_box(self, subject: str = "alice") -> supervised.Supervised:
        """The subject's sandbox once its lease has ended (in the background)."""
        deadline = time.monotonic() + 20
        while not self.pool._idle.get(subject) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        (box,) = self.pool._idle[subject]
        return box


async def _rig(command: list[str], **pool: Any) -> tuple[Rig, DockerRuntime]:
    rt = DockerRuntime(
        DockerOptions(
            oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE, supervisor_entrypoint=command
        )
    )
    rec = Recorder(deny={"records.lookup"})
    reuse = ReusePool(rt, pool.pop("size", 1), **{"max_executes": 50, **pool})
    seen = Sandboxes()
    builder = codemode.Builder(
        authorizer=rec,
        runtime=reuse,
        observer=seen,
        limits=codemode.Limits(max_execution_time=30.0),
    )
    builder.register(*make_capabilities(rec))
    server = builder.build()
    await server.start()
    return Rig(server, reuse, seen, rec), rt


@contextlib.asynccontextmanager
async def _serving(docker_api: Any, command: list[str]) -> AsyncIterator[Rig]:
    """A rig for the fixtures below; closed after the test, with none of its containers left."""
    made, rt = await _rig(command)
    yield made
    await made.server.aclose()
    assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}")


@pytest.fixture(params=["confined", "unconfined"])
async def rig(request: pytest.FixtureRequest, docker_api: Any) -> AsyncIterator[Rig]:
    command = rp.UNCONFINED if request.param == "unconfined" else rp.SUPERVISOR
    async with _serving(docker_api, command) as made:
        yield made


@pytest.fixture
async def unconfined(docker_api: Any) -> AsyncIterator[Rig]:
    async with _serving(docker_api, rp.UNCONFINED) as made:
        yield made


@pytest.fixture
async def confined(docker_api: Any) -> AsyncIterator[Rig]:
    async with _serving(docker_api, rp.SUPERVISOR) as made:
        yield made


def _clean_next(found: Any) -> None:
    assert isinstance(found, dict) and found.get("me") == "next", found
    assert found["pids"] == [1, found["pid"]], found


# ------------------------------------------------------------------- what it leaves in its pipes


FORGE_AFTER_FINAL = """
import sys
final({"me": "first"})
forged = protocol.encode_frame({"k": "final", "value": {"me": "next", "pid": 0, "pids": [1, 0]}})
for _ in range(300):
    stdout.write(forged)
stdout.write(forged[:7])  # and a frame cut short
stdout.flush()
sys.stderr.write("x" * 200000)
sys.stderr.flush()
"""


async def test_frames_forged_after_the_final_frame_reach_no_later_execute(rig: Rig) -> None:
    assert await rig.server.execute(FORGE_AFTER_FINAL, subject=ALICE) == {"me": "first"}
    found = await rig.server.execute(WHO, subject=ALICE)
    _clean_next(found)
    assert found["pid"] != 0
    assert rig.seen.sandbox(0) == rig.seen.sandbox(1), rig.seen.workers()


EXIT_MID_CALL = """
import os
send({"k": "native_call", "seq": 1, "name": "util.echo", "args": {"value": "x"}})
os._exit(0)  # before the call's result: the supervisor ends the epoch by itself
"""

EXIT_IN_FINAL = """
import os
frame = protocol.encode_frame({"k": "final", "value": "half"})
stdout.write(frame[: len(frame) // 2])
stdout.flush()
os._exit(0)
"""

EXIT_BEFORE_ANYTHING = """
import os
os._exit(0)
"""


@pytest.mark.parametrize("program", [EXIT_MID_CALL, EXIT_IN_FINAL, EXIT_BEFORE_ANYTHING])
async def test_a_worker_that_ends_itself_early_fails_its_execute_and_loses_its_sandbox(
    rig: Rig, program: str
) -> None:
    with pytest.raises(Internal):
        await rig.server.execute(program, subject=ALICE)
    found = await rig.server.execute(WHO, subject=ALICE)
    _clean_next(found)
    # The failed execute never counts as a clean one: its sandbox is recycled.
    assert rig.seen.sandbox(0) != rig.seen.sandbox(1), rig.seen.workers()


LINGERING_WRITER = """
import os, time
forged = protocol.encode_frame({"k": "final", "value": {"me": "next", "pid": 0, "pids": [1, 0]}})
pid = os.fork()
if pid == 0:
    me = os.getpid()
    while True:
        try:
            os.write(1, forged)  # into this worker's stdout, after the worker is gone
        except OSError:
            pass
        for p in os.listdir("/proc"):  # and into the next worker's pipes, were it to see one
            if p.isdigit() and int(p) not in (1, me):
                for fd in ("0", "1"):
                    try:
                        out = os.open("/proc/%s/fd/%s" % (p, fd), os.O_WRONLY | os.O_NONBLOCK)
                        os.write(out, forged)
                        os.close(out)
                    except OSError:
                        pass
final({"me": "first"})
"""


async def test_a_writer_left_on_the_old_pipes_reaches_no_later_execute(unconfined: Rig) -> None:
    rig = unconfined
    assert await rig.server.execute(LINGERING_WRITER, subject=ALICE) == {"me": "first"}
    for _ in range(2):
        _clean_next(await rig.server.execute(WHO, subject=ALICE))


# ------------------------------------------------------------------- a worker that never ends


NEVER_ENDS = """
import time
final({"me": "first"})
while True:
    time.sleep(1)
"""


async def test_a_worker_that_never_ends_after_its_final_frame_still_ends_its_lease(rig: Rig) -> None:
    assert await rig.server.execute(NEVER_ENDS, subject=ALICE) == {"me": "first"}
    box = await rig.idle_box()  # its lease ended (bounded: the late K), the sandbox scrubbed
    assert box.usable() and box.executes == 1
    _clean_next(await rig.server.execute(WHO, subject=ALICE))
    # It is served again (the late K killed the worker, the scrub verified the sandbox): the policy.
    assert rig.seen.sandbox(0) == rig.seen.sandbox(1)


# ------------------------------------------------------------------- a late K and later epochs


async def test_a_k_for_an_ended_epoch_never_ends_the_next_execute(confined: Rig) -> None:
    rig = confined
    assert await rig.server.execute("final(1)", subject=ALICE) == 1
    box = await rig.idle_box()
    ended = box.epoch - 1
    sleeper = "import time\ntime.sleep(1.5)\nfinal({'me': 'second'})\n"
    task = asyncio.ensure_future(rig.server.execute(sleeper, subject=ALICE))
    await asyncio.sleep(0.5)
    assert box.lease is not None  # the next execute runs in the same sandbox, epoch ended + 1
    await box.raw.write(channel.encode(channel.END, ended))  # a K that comes far too late
    assert await task == {"me": "second"}
    assert rig.seen.sandbox(0) == rig.seen.sandbox(1)


@pytest.mark.parametrize("delay", [0.4, 0.5, 0.55, 0.7])
async def test_a_late_k_racing_a_self_end_never_ends_the_next_execute(confined: Rig, delay: float) -> None:
    rig = confined
    # The worker ends around SELF_END_GRACE after its final frame: the host's late K and the
    # supervisor's own end of the epoch race.
    slow_exit = f"import time\nfinal({{'me': 'first'}})\ntime.sleep({delay})\n"
    nxt = "import time\ntime.sleep(1.0)\nfinal({'me': 'second'})\n"
    for _ in range(3):
        assert await rig.server.execute(slow_exit, subject=ALICE) == {"me": "first"}
        assert await rig.server.execute(nxt, subject=ALICE) == {"me": "second"}


# ------------------------------------------------------------------- host-ended program outcomes


DENIED_CALL = """
send({"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": "a"}})
recv()  # an honest worker waits for the call's result
"""


async def test_an_execute_the_host_ended_does_not_wait_for_the_self_end_grace(
    confined: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = confined
    # A grace longer than the end timeout shows whether the lease's end depends on it.
    monkeypatch.setattr(supervised, "SELF_END_GRACE", 60.0)
    with pytest.raises(codemode.PermissionDenied):
        await rig.server.execute(DENIED_CALL, subject=ALICE)
    _clean_next(await rig.server.execute(WHO, subject=ALICE))
    # A denied call is a program outcome: the sandbox serves the subject again.
    assert rig.seen.sandbox(0) == rig.seen.sandbox(1), rig.seen.workers()


# ------------------------------------------------------------------- a worker that died idle


async def test_a_worker_that_died_while_idle_costs_no_execute(confined: Rig, docker_api: Any) -> None:
    rig = confined
    assert await rig.server.execute("final(1)", subject=ALICE) == 1
    box = await rig.idle_box()
    container = box.worker_id.removeprefix("docker-")
    # The idle worker dies (the engine's OOM killer, an operator): here a kill from outside.
    kill = (
        "import os\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit() and int(p) not in (1, os.getpid()):\n"
        "        os.kill(int(p), 9)\n"
    )
    run = docker_api.exec_create(container, ["python3", "-I", "-c", kill])
    docker_api.exec_start(run["Id"])
    await asyncio.sleep(1.0)  # the supervisor ends that epoch and reports it (nobody reads yet)
    assert await rig.server.execute("final(2)", subject=ALICE) == 2


# ------------------------------------------------------------------- the compiled filter


OWN_PID_RULES = """
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
me = os.getpid()
tid = libc.syscall(186)  # gettid
def tgkill(pid, tid, sig):
    if libc.syscall(234, pid, tid, sig) == 0:
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), "?")
status = dict(l.split(":", 1) for l in proc_text("/proc/self/status").splitlines() if ":" in l)
res = {
    "pid": me,
    "seccomp": status["Seccomp"].strip(),
    "own": tgkill(me, tid, signal.SIGUSR1),
    "own probe": tgkill(me, tid, 0),
    "supervisor": tgkill(1, 1, 0),
    "pid + 1": tgkill(me + 1, me + 1, 0),
    "pid - 1": tgkill(me - 1, me - 1, 0),
    "sentinel": tgkill(0x7FFFFFF1, 0x7FFFFFF1, 0),
}
for name, fn in (("fork", os.fork), ("memfd", lambda: os.memfd_create("x"))):
    try:
        fn()
        res[name] = "ok"
    except OSError as exc:
        res[name] = errno.errorcode.get(exc.errno, "?")
res["got"] = len(got)
final(res)
"""


async def test_the_compiled_filter_names_each_forked_workers_own_pid(confined: Rig) -> None:
    rig = confined
    pids = []
    for _ in range(3):
        res = await rig.server.execute(OWN_PID_RULES, subject=ALICE)
        pids.append(res["pid"])
        assert res["seccomp"] == "2", res
        assert res["own"] == "ok" and res["own probe"] == "ok" and res["got"] == 1, res
        for name in ("supervisor", "pid + 1", "pid - 1", "sentinel", "fork", "memfd"):
            assert res[name] == "EPERM", (name, res)
    assert len(set(pids)) == 3 and len({rig.seen.sandbox(i) for i in range(3)}) == 1, rig.seen.workers()


# ------------------------------------------------------------------- successors


async def test_successors_serve_one_subject_and_keep_the_pool_bounded(docker_api: Any) -> None:
    # max_executes 3: every sandbox gets a successor after 2 executes. One tenant runs three
    # executes at once, all the time; two others one each. No sandbox (a successor included) may
    # serve two subjects, and the sandboxes the pool keeps (idle, in use, starting) never exceed
    # max_concurrent_executions + size + 1.
    made, rt = await _rig(rp.SUPERVISOR, size=4, max_executes=3, per_subject=2)
    pool = made.pool
    bound = codemode.Limits().max_concurrent_executions + pool.size + 1
    kept: list[int] = []
    engine: list[int] = []
    running = True

    async def sample() -> None:
        n = 0
        while running:
            kept.append(pool.idle + pool._in_use + pool._starting)
            if n % 10 == 0:
                engine.append(
                    len(worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}"))
                )
            n += 1
            await asyncio.sleep(0.02)

    async def stream(subject: str, rounds: int) -> None:
        # At least ``rounds`` executes, and on until a successor has started (whether the pool has
        # room for one at a given moment depends on the machine's timing), 60 at most.
        i = 0
        while i < rounds or (pool.successors < 1 and i < 60):
            assert await made.server.execute(f"final({i})", subject=authz.Subject(subject)) == i
            i += 1

    sampler = asyncio.ensure_future(sample())
    try:
        await asyncio.gather(*(stream("alice", 12) for _ in range(3)), stream("bob", 12), stream("carol", 12))
    finally:
        running = False
        await sampler
        await made.server.aclose()
    owner = made.seen.owners()
    assert all(len(who) == 1 for who in owner.values()), owner
    assert pool.successors >= 1
    print(
        f"successors {pool.successors}, cold {pool.cold}, kept max {max(kept)} (bound {bound}), "
        f"engine max {max(engine)}"
    )
    assert max(kept) <= bound, (max(kept), bound)
