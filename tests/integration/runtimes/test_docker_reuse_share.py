"""The reuse mode's subject share bites only under contention, on a real Docker engine.

A lone subject takes the idle warm sandboxes (before: its second execute started a container beside
an idle warm one). While another subject competes (waiting for a sandbox, or served within the last
``recent_seconds``), a subject past its share starts its own, and the refill keeps making warm
sandboxes for the others although that subject holds sandboxes in use past its share (before: those
filled the pool's count, so nothing was refilled and the others started cold).

Executes hold their sandboxes on ``util.hold`` (a capability that waits for the test), so nothing
depends on how fast a program runs; whether a lease got a warm sandbox is read from the pool's
``cold`` counter (sandboxes started for a lease), never from a timing. Real worker image
(``CODEMODE_TEST_WORKER_IMAGE``). Skips locally without Docker; fails under CI=true.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.runtimes.docker import DockerRuntime
from codemode.runtimes.reuse import ReusePool
from tests.support.docker_engine import worker_containers

pytestmark = pytest.mark.docker

ECHO = "def main():\n    return %r\n"
HOLD = "def main():\n    return util.hold()\n"


@dataclass
class HoldOut:
    value: str


class Rig:
    """A server over ``ReusePool(DockerRuntime(), size, **pool)`` whose ``util.hold`` waits for
    ``gate``."""

    def __init__(self, size: int, **pool: Any) -> None:
        self.runtime = DockerRuntime()
        self.pool = ReusePool(self.runtime, size, max_executes=100, **pool)
        self.gate = asyncio.Event()
        self.holding = 0
        builder = codemode.Builder(
            authorizer=authz.allow_all(),
            limits=codemode.Limits(max_execution_time=120, max_concurrent_executions=16),
            runtime=self.pool,
        )
        hold = codemode.Capability(name="util.hold", summary="Waits for the test.", handler=self.hold)
        builder.register(hold)
        self.server = builder.build()
        self.held: list[asyncio.Task[Any]] = []

    async def hold(self, ctx: codemode.CallContext, subject: authz.Subject) -> HoldOut:
        self.holding += 1
        await self.gate.wait()
        return HoldOut(value="done")

    async def holds(self, subject: str, n: int) -> None:
        """``n`` executes of ``subject`` sent at once, each holding its sandbox until the gate opens."""
        who = authz.Subject(subject)
        self.held += [asyncio.ensure_future(self.server.execute(HOLD, subject=who)) for _ in range(n)]
        await until(lambda: self.holding >= len(self.held), "the executes hold their sandboxes")

    async def echo(self, subject: str) -> Any:
        return await self.server.execute(ECHO % subject, subject=authz.Subject(subject))

    async def release(self) -> None:
        self.gate.set()
        assert await asyncio.gather(*self.held) == [{"value": "done"}] * len(self.held)


async def until(condition: Callable[[], object], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
async def rig(docker_api: Any) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    made: list[Rig] = []

    async def build(size: int, **pool: Any) -> Rig:
        made.append(rig := Rig(size, **pool))
        await rig.server.start()
        await rig.pool.wait_warm(120)
        return rig

    yield build
    for rig in made:
        rig.gate.set()
        await asyncio.gather(*rig.held, return_exceptions=True)
        await rig.server.aclose()
        assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rig.runtime.instance_id}")


def refilled(pool: ReusePool) -> Callable[[], bool]:
    """A warm sandbox is ready and no start is under way."""
    return lambda: bool(pool._warm) and not pool._starting


async def test_a_lone_subject_takes_the_idle_warm_sandboxes(rig: Callable[..., Awaitable[Rig]]) -> None:
    r = await rig(2)
    await r.holds("lone", 2)
    assert r.pool.cold == 0  # before: 1 (a container started beside the idle warm sandbox)
    # The refill replaces the warm sandbox the lone subject took past its share: a newcomer still
    # finds one.
    await until(refilled(r.pool), "a warm sandbox refilled")
    assert await r.echo("bob") == "bob"
    assert r.pool.cold == 0
    await r.release()


async def test_under_contention_the_refill_keeps_warm_sandboxes_for_the_others(
    rig: Callable[..., Awaitable[Rig]],
) -> None:
    # The others' sandboxes are recycled after 1 s idle; carol's request keeps every subject
    # competing for the whole test (recent_seconds), however slowly the engine starts containers.
    r = await rig(4, idle_seconds=1.0, recent_seconds=600.0)
    assert await r.echo("carol") == "carol"
    await r.holds("flood", 4)
    assert r.pool.cold == 2  # the flood took its share of 2 warm sandboxes and started 2
    for name in ("bob", "dave", "eve"):
        # Before: the flood's 4 sandboxes in use filled the pool's count of 4, so once the last warm
        # one was taken nothing was refilled and dave waited for a new container.
        await until(refilled(r.pool), f"a warm sandbox refilled for {name}")
        cold = r.pool.cold
        assert await r.echo(name) == name
        assert r.pool.cold == cold, name
    await r.release()
