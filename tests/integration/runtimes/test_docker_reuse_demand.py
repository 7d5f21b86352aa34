"""The reuse pool sized from demand within ``--pool``/``--pool-max``, on a real Docker
engine: it keeps ``clamp(active + ceil(rate × spawn_time × headroom), --pool, --pool-max)``
sandboxes, where ``active`` counts the subjects served recently and ``rate`` the leases that found no
sandbox of their own (docs/reference/runtimes.md, "Reuse mode"). Before, the reuse pool stayed at
``--pool`` (``--pool-max`` was refused in the reuse mode), so a second and third subject each waited
for a new container.

The demand is driven through the pool's injected clock (arrivals at a frozen instant, then a jump of
many windows), so no assertion depends on how fast this machine is; whether a lease got a started
sandbox is read from the pool's ``cold`` counter, never from a timing. Real worker image
(``CODEMODE_TEST_WORKER_IMAGE``). Skips locally without Docker; fails under CI=true.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from codemode import authz
from codemode.runtimes.docker import DockerRuntime
from tests.support.docker_engine import worker_containers
from tests.support.fakes import Clock
from tests.support.reuse import reuse_server

pytestmark = pytest.mark.docker

ECHO = "def main():\n    return %r\n"


async def until(condition: Callable[[], object], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        await asyncio.sleep(0.02)


async def test_the_reuse_pool_grows_with_demand_to_its_maximum_and_gives_back(docker_api: Any) -> None:
    clock = Clock()
    runtime = DockerRuntime()
    # headroom 1000: one lease per second (window 1 s) x a container start asks for far more than
    # the maximum, so the target is the maximum as soon as one start is measured
    server, reuse, seen = await reuse_server(
        runtime, 1, maximum=3, headroom=1000.0, window=1.0, hold=10.0, recent_seconds=10.0, clock=clock
    )
    mine = f"io.codemode.runtime-instance={runtime.instance_id}"
    try:
        await reuse.wait_warm(120)
        assert reuse.size == 1  # no demand measured yet: --pool
        assert await server.execute(ECHO % "a", subject=authz.Subject("a")) == "a"
        # one lease that found no sandbox of its own, one start measured: the target is --pool-max,
        # and the refill starts warm sandboxes beside a's own (before: it stayed at 1)
        assert reuse.size == 3
        await until(lambda: reuse.idle == 3 and not reuse._starting, "the pool refilled to its maximum")
        cold = reuse.cold
        for subject in ("b", "c"):
            assert await server.execute(ECHO % subject, subject=authz.Subject(subject)) == subject
            # its scrub ends before the next lease, so c's sandbox is the one idle shortest (before,
            # b's scrub could end after c's on a busy machine, and c's was given back instead)
            await until(lambda: not reuse._in_use, f"{subject}'s lease scrubbed and back")
        assert reuse.cold == cold  # both found a started sandbox
        assert len(set(seen.sandboxes())) == 3 and all(len(s) == 1 for s in seen.owners().values())
        await until(lambda: reuse.idle == 3 and not reuse._in_use, "the leases scrubbed and back")
        assert len(worker_containers(docker_api, mine)) == 3  # never above --pool-max at rest

        # Demand falls: many windows later, nobody served within recent_seconds, hold passed. The
        # pool gives back idle sandboxes down to --pool, the one idle longest first, each once.
        recycled = reuse.recycled
        clock.now += 100.0
        assert reuse.size == 1
        await until(lambda: reuse.idle == 1, "idle sandboxes above the target recycled")
        assert reuse.recycled - recycled == 2
        await until(lambda: len(worker_containers(docker_api, mine)) == 1, "their containers removed")
        assert await server.execute(ECHO % "c", subject=authz.Subject("c")) == "c"
        # The one kept is the one idle shortest, c's (never a's or b's, idle since before), so c's
        # execute reuses it
        assert reuse.cold == cold
        assert seen.sandbox(-1) == seen.sandbox(2)
        assert seen.sandbox(-1) not in {seen.sandbox(0), seen.sandbox(1)}
    finally:
        await server.aclose()
    assert not worker_containers(docker_api, mine)


async def test_without_a_maximum_the_reuse_pool_stays_at_its_size(docker_api: Any) -> None:
    clock = Clock()
    runtime = DockerRuntime()
    server, reuse, _ = await reuse_server(runtime, 1, headroom=1000.0, window=1.0, clock=clock)
    try:
        await reuse.wait_warm(120)
        for subject in ("a", "b"):
            assert await server.execute(ECHO % subject, subject=authz.Subject(subject)) == subject
        assert reuse.demand.fixed and reuse.size == 1
        await until(lambda: reuse.idle == 1 and not reuse._starting, "the pool back at its size")
    finally:
        await server.aclose()
