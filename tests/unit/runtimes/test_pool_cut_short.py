"""A cold start cut short by its execute's deadline joins the warm pool.

The execute that waited is gone, but the worker it started has seen no program: deleting it wastes
the start. Under load on Kubernetes (pods taking 2-5 s against a 5 s deadline) every such start was
deleted, the next execute started another, and the sustained series ended 188 of 200 executes in
``concurrency``. Deterministic: the fake runtime's starts wait for a gate the test opens, and the
test cancels the waiting execute as its deadline would; nothing sleeps or times anything.
"""

from __future__ import annotations

import asyncio

from codemode.runtimes.base import ExitInfo
from codemode.runtimes.pool import WarmPool


class Box:
    def __init__(self, n: int, runtime: GatedRuntime) -> None:
        self.worker_id = f"w{n}"
        self.runtime = runtime

    def alive(self) -> bool:
        return True

    async def destroy(self) -> ExitInfo:
        self.runtime.destroyed.append(self.worker_id)
        return ExitInfo(exit_code=0)


class GatedRuntime:
    """Each start waits for its own gate (opened by the test); counts starts cut short."""

    name = "gated"
    concurrent_refill = True

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []
        self.cancelled: list[int] = []
        self.destroyed: list[str] = []

    async def _nothing(self) -> None:
        return None

    start = check = aclose = _nothing

    async def spawn(self) -> Box:
        gate = asyncio.Event()
        self.gates.append(gate)
        n = len(self.gates)
        try:
            await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(n)
            raise
        return Box(n, self)


async def _settle(until: object, rounds: int = 1000) -> bool:
    """Let the loop run until ``until()`` holds (at most ``rounds`` turns)."""
    for _ in range(rounds):
        if until():  # type: ignore[operator]
            return True
        await asyncio.sleep(0)
    return bool(until())  # type: ignore[operator]


async def _cut_short(pool: WarmPool, runtime: GatedRuntime) -> None:
    """Alice's execute starts a cold worker (the pool of 1 has its refill's start gated) and her
    deadline passes while it starts."""
    await pool.start()
    assert await _settle(lambda: len(runtime.gates) == 1)  # the refill's start, kept gated
    waiting = asyncio.ensure_future(pool.spawn_for("alice"))
    assert await _settle(lambda: len(runtime.gates) == 2)  # alice's cold start
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


async def test_a_start_cut_short_joins_the_pool_and_serves_the_next_execute() -> None:
    runtime = GatedRuntime()
    pool = WarmPool(runtime, 1)  # type: ignore[arg-type]
    try:
        await _cut_short(pool, runtime)
        runtime.gates[1].set()  # ... and then the worker is ready
        # Before: the start was cancelled with its execute (cancelled == [2]), nothing joined.
        assert await _settle(lambda: pool.idle == 1), f"cut short: {runtime.cancelled}"
        assert runtime.cancelled == []
        spawned = await pool.spawn_for("bob")
        assert spawned.warm and spawned.sandbox.worker_id == "w2"
        await spawned.sandbox.destroy()
    finally:
        await pool.aclose()
    assert runtime.destroyed == ["w2"]  # once, by its user; the gated refill was cancelled


async def test_a_start_cut_short_is_destroyed_once_when_it_lands_after_the_pool_closed() -> None:
    runtime = GatedRuntime()
    pool = WarmPool(runtime, 0)  # type: ignore[arg-type]
    await pool.start()
    waiting = asyncio.ensure_future(pool.spawn_for("alice"))
    assert await _settle(lambda: len(runtime.gates) == 1)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await pool.aclose()  # the start still in flight is cancelled by the close
    assert runtime.cancelled == [1]
    assert runtime.destroyed == []
    assert pool.idle == 0


async def test_the_next_cold_execute_takes_over_a_start_cut_short_instead_of_starting_another() -> None:
    runtime = GatedRuntime()
    pool = WarmPool(runtime, 1)  # type: ignore[arg-type]
    try:
        await _cut_short(pool, runtime)
        bob = asyncio.ensure_future(pool.spawn_for("bob"))  # no idle worker: a cold start ...
        await _settle(lambda: len(runtime.gates) == 3, rounds=50)
        # ... that waits for alice's (before: a third start, while alice's went on for nobody)
        assert len(runtime.gates) == 2
        runtime.gates[1].set()
        spawned = await bob
        assert not spawned.warm and spawned.sandbox.worker_id == "w2"
        assert pool.idle == 0
        await spawned.sandbox.destroy()
    finally:
        await pool.aclose()
    assert runtime.destroyed == ["w2"]
