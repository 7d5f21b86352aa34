"""The reuse mode on a real Docker engine (codemode.runtimes.reuse over DockerRuntime): one subject's
executes share its sandbox, a fresh worker process each; subjects never share one; sandboxes are
recycled after ``max_executes``, after ``idle_seconds``, when an execute hits a limit, and the pool
keeps at most its size idle, evicting the one idle longest whoever it belongs to.

Real worker image (``CODEMODE_TEST_WORKER_IMAGE``). Skips locally without Docker; fails under CI=true.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import ExecutionTimeout, ResourceLimit
from codemode.runtimes.docker import DockerRuntime
from codemode.runtimes.reuse import ReusePool
from tests.support.docker_engine import worker_containers
from tests.support.reuse import Sandboxes, reuse_server

pytestmark = pytest.mark.docker

ECHO = "def main():\n    return %r\n"
SPIN = "def main():\n    x = 0\n    for i in range(2000000000):\n        x = (x + i) % 1000\n    return x\n"
#: Starlark keeps every value of a run: this outgrows the 256 MiB memory limit.
HOG = (
    "def main():\n    n = 0\n    for i in range(100000):\n        n += len(sorted(range(300000)))\n"
    "    return n\n"
)


@pytest.fixture
async def make(docker_api: Any) -> AsyncIterator[Any]:
    made: list[tuple[codemode.Server, DockerRuntime]] = []

    async def build(
        size: int = 2, max_time: float = 10.0, **pool: Any
    ) -> tuple[codemode.Server, ReusePool, Sandboxes]:
        rt = DockerRuntime()
        limits = codemode.Limits(max_execution_time=max_time, max_execution_steps=10**12)
        server, reuse, seen = await reuse_server(rt, size, limits, **{"max_executes": 100, **pool})
        made.append((server, rt))
        return server, reuse, seen

    yield build
    for server, rt in made:
        await server.aclose()
        assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}")


def _exists(api: Any, worker_id: str) -> bool:
    import docker.errors

    name = worker_id.removeprefix("docker-")
    try:
        found = api.containers(all=True, filters={"id": name})
    except docker.errors.NotFound:
        return False
    return bool(found)


async def test_one_subject_reuses_its_sandbox_with_a_fresh_worker_each_time(make: Any) -> None:
    server, pool, seen = await make()
    alice = authz.Subject("alice")
    for i in range(5):
        assert await server.execute(ECHO % i, subject=alice) == i
    boxes = seen.sandboxes()
    assert len(set(boxes)) == 1, boxes  # one sandbox served all five
    epochs = [int(e.worker_id.rpartition(".")[2]) for e in seen.events]
    assert epochs == sorted(epochs) and len(set(epochs)) == 5  # a new worker (epoch) each time
    assert pool.reused == 4


async def test_a_reused_worker_costs_the_host_one_message_per_frame(make: Any) -> None:
    # The supervisor probes each new worker itself and ends an epoch whose worker ended by itself,
    # so the host sends only the execute's own frames: no probe, no K (the engine's attach stream,
    # and on Kubernetes the API server and the kubelet, carry each message).
    from codemode_worker import supervisor_channel as channel

    server, pool, _ = await make(size=1)
    alice = authz.Subject("alice")
    assert await server.execute(ECHO % 0, subject=alice) == 0
    await asyncio.sleep(0.5)  # its lease ends in the background
    (box,) = pool._idle["alice"]
    assert box.self_ends and box.ready_epoch == box.epoch
    sent: list[bytes] = []
    write = box.raw.write

    async def spy(data: bytes) -> None:
        sent.append(data)
        await write(data)

    box.raw.write = spy
    for i in range(1, 4):
        assert await server.execute(ECHO % i, subject=alice) == i
    await asyncio.sleep(1.0)  # past SELF_END_GRACE: a late K would have gone by now
    kinds = [channel.HEADER.unpack_from(data)[0] for data in sent]  # one message per write
    assert kinds == [channel.DATA] * 3, kinds  # one exec frame per execute, nothing else
    assert box.executes == 4 and box.usable()


async def test_large_values_cross_a_reused_sandbox_intact(make: Any) -> None:
    # A result of many relayed messages (each at most the channel's relay size), twice in one sandbox.
    server, pool, _ = await make()
    alice = authz.Subject("alice")
    for n in (700_000, 300_001):
        program = f"def main():\n    return ''.join([chr(97 + i % 26) for i in range({n})])\n"
        value = await server.execute(program, subject=alice)
        assert value == "".join(chr(97 + i % 26) for i in range(n))
    assert pool.reused == 1


async def test_subjects_never_share_a_sandbox(make: Any) -> None:
    server, pool, seen = await make(size=4)
    subjects = [authz.Subject(name) for name in ("alice", "bob", "carol")]

    async def run(subject: authz.Subject, i: int) -> None:
        assert await server.execute(ECHO % f"{subject.id}-{i}", subject=subject) == f"{subject.id}-{i}"

    for i in range(4):
        await asyncio.gather(*(run(s, i) for s in subjects))
    owner = seen.owners()
    assert all(len(who) == 1 for who in owner.values()), owner
    assert pool.reused >= 6  # most executes found their subject's own sandbox


async def test_subjects_never_share_a_sandbox_when_the_pool_is_short(make: Any) -> None:
    # One idle sandbox for four subjects: every execute evicts another subject's sandbox or takes the
    # warm one, and still no container ever serves two subjects.
    server, pool, seen = await make(size=1, per_subject=1)
    subjects = [authz.Subject(name) for name in ("alice", "bob", "carol", "dave")]
    order = [subjects[i % 4] for i in range(6)] + [subjects[0]] * 3 + [subjects[1], subjects[0]]
    for i, subject in enumerate(order):
        assert await server.execute(ECHO % i, subject=subject) == i
    await asyncio.gather(*(server.execute(ECHO % s.id, subject=s) for s in subjects))
    owner = seen.owners()
    assert all(len(who) == 1 for who in owner.values()), owner
    assert pool.reused >= 2  # alice's back-to-back executes reused her sandbox


async def test_recycled_after_max_executes(make: Any, docker_api: Any) -> None:
    server, _, seen = await make(max_executes=3)
    alice = authz.Subject("alice")
    for i in range(4):
        await server.execute(ECHO % i, subject=alice)
    boxes = seen.sandboxes()
    assert boxes[0] == boxes[1] == boxes[2] != boxes[3], boxes
    deadline = time.monotonic() + 20
    while _exists(docker_api, boxes[0]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not _exists(docker_api, boxes[0])  # the container itself is gone


async def test_a_successor_takes_over_before_the_last_execute(make: Any, docker_api: Any) -> None:
    # Every idle sandbox is bound to a subject (no warm one left): without a successor, alice's
    # execute after her sandbox's last one would wait for a new container (a cold start).
    server, pool, seen = await make(size=3, max_executes=10)
    await pool.wait_warm(60)
    subjects = [authz.Subject(name) for name in ("alice", "bob", "carol")]
    for subject in subjects:
        await server.execute(ECHO % subject.id, subject=subject)
    alice = subjects[0]
    for i in range(8):  # 9 in all: the successor is due after 8 or 9 (max_executes - 2 or 1)
        await server.execute(ECHO % i, subject=alice)
    deadline = time.monotonic() + 30
    while pool.successors < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert pool.successors == 1
    for i in range(3):
        await server.execute(ECHO % i, subject=alice)
    assert pool.cold == 0  # no execute waited for a new container
    mine = seen.sandboxes("alice")
    assert mine[0] == mine[8] != mine[9] == mine[11], mine  # the old one served 9 of its 10
    owner = seen.owners()
    assert all(len(who) == 1 for who in owner.values()), owner  # the successor served alice only
    deadline = time.monotonic() + 20
    while _exists(docker_api, mine[0]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not _exists(docker_api, mine[0])  # the old sandbox is removed once its successor is up


#: Busy for several seconds (the flood's executes are still running when bob's comes).
SLEEPY = "def main():\n    x = 0\n    for i in range(40000000):\n        x = (x + i) % 7\n    return x\n"


async def test_one_subject_cannot_take_every_warm_sandbox(make: Any) -> None:
    # A flood of one subject's executes in flight took every warm sandbox, and the pool, counting
    # them in use, refilled none: every other subject's execute waited for a new container.
    server, pool, _ = await make(size=4, max_time=120.0)
    await pool.wait_warm(60)
    # carol was served a moment ago: the flood has company, so its share bites (a lone subject
    # takes every warm sandbox: tests/integration/runtimes/test_docker_reuse_share.py).
    assert await server.execute(ECHO % "carol", subject=authz.Subject("carol")) == "carol"
    flood = authz.Subject("flood")
    running = [asyncio.ensure_future(server.execute(SLEEPY, subject=flood)) for _ in range(4)]
    try:
        deadline = time.monotonic() + 30
        while (pool._in_use < 4 or pool._starting) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert pool._in_use == 4 and not any(t.done() for t in running)
        cold = pool.cold
        assert await server.execute(ECHO % "bob", subject=authz.Subject("bob")) == "bob"
        assert pool.cold == cold  # bob found a warm sandbox: the flood took at most half of them
        assert pool.cold >= 2  # the flood's executes past its share started their own
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def test_recycled_after_a_deadline(make: Any, docker_api: Any) -> None:
    server, _, seen = await make(max_time=1.0)
    alice = authz.Subject("alice")
    await server.execute(ECHO % 1, subject=alice)
    with pytest.raises(ExecutionTimeout):
        await server.execute(SPIN, subject=alice)
    await server.execute(ECHO % 2, subject=alice)
    boxes = seen.sandboxes()
    assert boxes[0] == boxes[1] != boxes[2], boxes  # the timed-out execute's sandbox was not reused
    deadline = time.monotonic() + 20
    while _exists(docker_api, boxes[1]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not _exists(docker_api, boxes[1])


async def test_recycled_after_the_memory_limit(make: Any, docker_api: Any) -> None:
    server, _, seen = await make(max_time=60.0)
    alice = authz.Subject("alice")
    await server.execute(ECHO % 1, subject=alice)
    with pytest.raises(ResourceLimit) as info:
        await server.execute(HOG, subject=alice)
    assert info.value.kind == "memory"  # the supervisor read the cgroup's OOM kill count
    await server.execute(ECHO % 2, subject=alice)
    boxes = seen.sandboxes()
    assert boxes[0] == boxes[1] != boxes[2], boxes
    assert seen.events[1].oom_killed


async def test_recycled_when_idle(make: Any, docker_api: Any) -> None:
    server, _, seen = await make(idle_seconds=1.0)
    await server.execute(ECHO % 1, subject=authz.Subject("alice"))
    box = seen.sandboxes()[0]
    deadline = time.monotonic() + 20
    while _exists(docker_api, box) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not _exists(docker_api, box)


async def test_idle_sandboxes_are_bounded_and_the_longest_idle_goes_first(make: Any, docker_api: Any) -> None:
    server, pool, seen = await make(size=2, per_subject=1)
    for name in ("alice", "bob"):
        await server.execute(ECHO % name, subject=authz.Subject(name))
        # A sandbox is back in the pool (idle for its subject) only after its scrub, in the
        # background: wait for it, so alice's is idle before bob's on a loaded machine too (a fixed
        # sleep was not always enough; pool.idle also counts unleased warm sandboxes).
        deadline = time.monotonic() + 20
        while name not in pool._idle and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert name in pool._idle
    await asyncio.sleep(0.2)
    await server.execute(ECHO % "carol", subject=authz.Subject("carol"))
    await asyncio.sleep(0.2)
    assert pool.idle <= 2
    alice_box, bob_box, carol_box = seen.sandboxes()
    deadline = time.monotonic() + 20
    while _exists(docker_api, alice_box) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    # Alice's sandbox was idle longest: it made room, although alice had done nothing wrong.
    assert not _exists(docker_api, alice_box)
    assert _exists(docker_api, bob_box) and _exists(docker_api, carol_box)
    await server.execute(ECHO % "bob", subject=authz.Subject("bob"))
    assert seen.sandboxes("bob") == [bob_box, bob_box]
