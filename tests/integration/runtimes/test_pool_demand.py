"""The demand-sized warm pool on real worker processes: it grows with measured demand up to its
maximum, refills concurrently but never more than ``refill_concurrency`` at once, and gives back
idle workers when demand falls, destroying each exactly once (docs/reference/runtimes.md, Warm pool).

The demand is driven through the pool's injected clock (arrivals at a frozen instant, then a jump
of many windows), so no assertion depends on how fast this machine is.
"""

from __future__ import annotations

import asyncio
import collections

import codemode
from codemode.runtimes.base import ExitInfo, Sandbox
from codemode.runtimes.process import ProcessOptions
from tests.support.fakes import Clock


class Counted:
    """A real ProcessRuntime whose spawns in flight and destroys per worker are counted."""

    def __init__(self, inner: codemode.ProcessRuntime) -> None:
        self.inner = inner
        self.concurrent_refill = inner.concurrent_refill
        self.in_flight = 0
        self.most_in_flight = 0
        self.destroys: collections.Counter[str] = collections.Counter()
        self.started: list[str] = []

    @property
    def name(self) -> str:
        return self.inner.name

    async def start(self) -> None:
        await self.inner.start()

    async def check(self) -> None:
        await self.inner.check()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def spawn(self) -> Sandbox:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            sandbox = await self.inner.spawn()
        finally:
            self.in_flight -= 1
        self.started.append(sandbox.worker_id)
        counted = self

        class Box:
            worker_id = sandbox.worker_id
            write = sandbox.write
            read = sandbox.read
            close_input = sandbox.close_input
            alive = sandbox.alive

            async def destroy(self) -> ExitInfo:
                counted.destroys[sandbox.worker_id] += 1
                return await sandbox.destroy()

        return Box()


async def test_the_pool_grows_with_demand_within_its_bounds_refilling_at_most_n_at_once() -> None:
    clock = Clock()
    runtime = Counted(codemode.ProcessRuntime(ProcessOptions(spawn="classic")))
    # headroom 1000: one arrival per second (window 1 s) x a classic spawn (tens of milliseconds)
    # asks for far more than the maximum
    pool = codemode.WarmPool(
        runtime,
        1,
        maximum=6,
        refill_concurrency=2,
        window=1.0,
        headroom=1000.0,
        clock=clock,
    )
    await pool.start()
    try:
        await pool.wait_warm(60)
        assert pool.size == 1  # nothing measured yet: the minimum
        taken = [(await pool.spawn_for("alice")).sandbox]  # warm: every spawn from now on is a refill
        assert pool.size == 6  # demand measured: the maximum, not more
        async with asyncio.timeout(120):
            while pool.idle < 6:
                await asyncio.sleep(0.02)
        assert runtime.most_in_flight == 2  # concurrent, and never more than the bound
        assert pool.idle == 6  # at the maximum, and it stays there
        await asyncio.sleep(0.6)  # a refill tick: nothing more is started at the target
        assert pool.idle == 6 and runtime.in_flight == 0
        for sandbox in taken:
            await sandbox.destroy()
    finally:
        await pool.aclose()
    assert all(n == 1 for n in runtime.destroys.values()), runtime.destroys


async def test_idle_workers_are_given_back_when_demand_falls_each_destroyed_once() -> None:
    clock = Clock()
    runtime = Counted(codemode.ProcessRuntime())
    pool = codemode.WarmPool(runtime, 0, maximum=4, window=1.0, headroom=1000.0, clock=clock)
    await pool.start()
    try:
        first = await pool.spawn_for("alice")  # cold: the pool's minimum is 0
        assert not first.warm
        await first.sandbox.destroy()
        assert pool.size == 4
        async with asyncio.timeout(60):
            while pool.idle < 4:
                await asyncio.sleep(0.02)
        clock.now += 100.0  # a hundred windows without an arrival: demand is gone
        assert pool.size == 0
        async with asyncio.timeout(60):
            while pool.idle or len(runtime.destroys) < len(runtime.started):
                await asyncio.sleep(0.02)
        assert pool.shrunk == 4
        assert sorted(runtime.destroys) == sorted(runtime.started)  # every worker destroyed ...
        assert set(runtime.destroys.values()) == {1}  # ... exactly once
    finally:
        await pool.aclose()
    assert set(runtime.destroys.values()) == {1}
