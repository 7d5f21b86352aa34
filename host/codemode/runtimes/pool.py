"""A warm pool for any runtime: sandboxes started ahead of time, each waiting for its one program.

Each sandbox is still used exactly once and destroyed by the execute pipeline; the pool only moves
start latency off the request path. It never hands out a sandbox that died while waiting, and drains
on ``aclose()``.

**Size from demand.** The pool keeps ``target`` idle sandboxes, where ``target`` follows the measured
arrival rate and spawn time within the operator's bounds (``codemode.runtimes.demand``):
``clamp(ceil(rate × spawn_time × headroom), size, maximum)``. Without a ``maximum`` (or with one equal
to ``size``) the pool is the fixed pool of ``size`` it always was. When demand falls, idle sandboxes
above the target are destroyed (each exactly once: it leaves the pool before it is destroyed). Live
workers never exceed ``max_concurrent_executions + maximum`` (the execute semaphore bounds the ones in
use).

**Refill, concurrent and bounded, on every runtime.** As soon as a sandbox is handed out (or the
target rises) the pool starts the missing ones, at most ``refill_concurrency`` at a time: by default
the target's worth at once on a runtime whose workers cost this host little to start
(``concurrent_refill``: Kubernetes, the process runtime's template), and one per CPU otherwise (the
classic process spawn forks Python; Docker's daemon runs on this host).

**One subject cannot drain it for the others.** ``spawn_for(subject)`` (the execute pipeline's path)
hands a subject that has company (another subject waiting for a sandbox from this pool, or served by
it within the last ``recent_seconds``: ``codemode.runtimes.contention``) a warm sandbox only while
it has fewer than ``max(1, floor(target × subject_share))`` warm ones taken and not yet replaced by a
refill; past that it gets a cold start, and the warm sandboxes stay for the other subjects. A lone
subject takes any idle warm sandbox: the share protects others, and there are none. ``spawn()`` (no
subject: operator tools) is not capped and counts for nobody.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .base import (
    Runtime,
    RuntimeClosing,
    RuntimeUnavailable,
    Sandbox,
    Spawned,
    SpawnFailed,
    concurrent_refill,
)
from .contention import RECENT_SECONDS, Contention
from .demand import Demand, Shares
from .eager import eager
from .exhaustion import memory_limited

__all__ = ["WarmPool"]

log = logging.getLogger("codemode.pool")

#: Seconds between target checks while the target may still move (it decays with time).
_TICK = 0.5


def _closed() -> RuntimeClosing:
    """A worker asked of a closed pool (an execute that got its slot as the server closed): one
    line, no traceback."""
    log.warning("no worker is handed out: the pool is closing")
    return RuntimeClosing("the pool is closing")


class WarmPool:
    """Wraps a Runtime and is itself a Runtime: keeps ``target`` started workers ready.

    Args (of the constructor):
        runtime: the runtime that starts the workers.
        size: the smallest number of ready workers to keep (0: none when idle); the fixed size when
            ``maximum`` is None.
        maximum: the largest target the measured demand may give (None: ``size``, a fixed pool).
        refill_concurrency: workers the refill starts at once at most (None: the runtime's default,
            see the module docstring).
        subject_share: the fraction of the target one subject may hold taken and not yet replaced
            while another subject competes (1: no cap).
        recent_seconds: how long after its last request a subject still competes for the warm
            sandboxes (``codemode.runtimes.contention``).
        window: seconds over which the arrival rate is measured.
        hold: seconds the target stays at its highest recent value before it shrinks.
        headroom: factor on ``rate × spawn_time``.
        retry_delay: seconds between refills after a failed spawn.
        clock: seconds from a monotonic clock (the demand measurement's).

    Raises (the constructor):
        ValueError: a negative size, a maximum below it, a refill concurrency below 1, or a share
            outside (0, 1].
    """

    def __init__(
        self,
        runtime: Runtime,
        size: int,
        *,
        maximum: int | None = None,
        refill_concurrency: int | None = None,
        subject_share: float = 0.5,
        window: float = 2.0,
        hold: float = 10.0,
        headroom: float = 2.0,
        retry_delay: float = 0.5,
        recent_seconds: float = RECENT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if size < 0:
            raise ValueError("pool size must not be negative")
        maximum = size if maximum is None else maximum
        if maximum < size:
            raise ValueError("pool maximum must not be below the pool size")
        if refill_concurrency is not None and refill_concurrency < 1:
            raise ValueError("pool refill concurrency must be at least 1")
        self.inner = runtime
        self.minimum = size
        self.maximum = maximum
        self.demand = Demand(size, maximum, window=window, hold=hold, headroom=headroom, clock=clock)
        self.shares = Shares(subject_share)
        self.contention = Contention(recent_seconds, clock)
        self.retry_delay = retry_delay
        self.concurrent = concurrent_refill(runtime)
        if refill_concurrency is None:
            refill_concurrency = max(1, maximum if self.concurrent else (os.cpu_count() or 1))
        self.refill_concurrency = refill_concurrency
        self._idle: collections.deque[Sandbox] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.refill_seconds: list[float] = []
        self._starting = 0
        #: Refill starts (cancelled on close) and destroys of idle sandboxes given back (awaited).
        self._spawns: set[asyncio.Task[Any]] = set()
        self._destroys: set[asyncio.Task[Any]] = set()
        #: Cold starts under way whose caller gave up, for the next cold caller (``_cold``).
        self._orphans: collections.deque[asyncio.Task[Sandbox]] = collections.deque()
        self.last_error: str | None = None
        #: Counters for benchmarks and logs: warm and cold hand-outs, idle sandboxes given back.
        self.warm_taken = 0
        self.cold_taken = 0
        self.shrunk = 0

    @property
    def name(self) -> str:
        return f"{self.inner.name}+pool"

    @property
    def memory_limited(self) -> bool:
        """What its runtime says (``codemode.runtimes.exhaustion``)."""
        return memory_limited(self.inner)

    @property
    def idle(self) -> int:
        """Sandboxes ready right now."""
        return len(self._idle)

    @property
    def size(self) -> int:
        """The target number of ready sandboxes now (``size`` ≤ target ≤ ``maximum``)."""
        return self.demand.target()

    async def start(self) -> None:
        await self.inner.start()
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._refill_loop())

    async def check(self) -> None:
        await self.inner.check()

    def warm(self) -> bool:
        """Whether the pool holds at least its minimum (``size``) of ready sandboxes: the readiness
        of a starting service (a fixed pool's minimum is its target).

        Returns:
            True at or above the minimum.
        """
        return len(self._idle) >= self.minimum

    async def wait_warm(self, timeout: float = 30.0) -> None:
        """Wait until the pool holds its minimum (for tests, benchmarks and readiness).

        Args:
            timeout: seconds to wait at most.

        Raises:
            TimeoutError: not warm in time.
        """
        async with asyncio.timeout(timeout):
            while not self.warm():
                await asyncio.sleep(0.01)

    async def spawn(self) -> Sandbox:
        """A warm sandbox if one is ready, else a cold one (no subject: never capped)."""
        return (await self._take(None)).sandbox

    async def spawn_for(self, subject: str) -> Spawned:
        """A warm sandbox unless none is ready, or ``subject`` holds its share while another subject
        competes for them, else a cold one.

        Args:
            subject: the subject id the execute runs for.

        Returns:
            The started sandbox, and whether it waited in the pool (``warm``).

        Raises:
            SpawnFailed: a cold start failed.
            RuntimeUnavailable: the pool is closed or its runtime cannot create workers.
        """
        if self._closed:
            raise _closed()
        with self.contention.waiting(subject):
            return await self._take(subject)

    def _may_take(self, subject: str | None) -> bool:
        """Whether ``subject`` may take a warm sandbox: always without a subject or without
        contention, else within its share."""
        if subject is None or not self.contention.others(subject):
            return True
        return self.shares.may_take(subject, self.demand.target())

    async def _take(self, subject: str | None) -> Spawned:
        if self._closed:
            raise _closed()
        self.demand.arrival()
        if self._may_take(subject):
            while self._idle:
                sandbox = self._idle.popleft()
                if sandbox.alive():
                    if subject is not None:
                        self.shares.took(subject)
                    self.warm_taken += 1
                    self._kick()
                    return Spawned(sandbox, warm=True)
                log.warning("pooled worker %s died while waiting; replacing it", sandbox.worker_id)
                await sandbox.destroy()
        self._kick()
        self.cold_taken += 1
        sandbox = await self._cold()
        return Spawned(sandbox, warm=False)

    async def _cold(self) -> Sandbox:
        """A cold start for a caller: one that an earlier caller gave up on if one is under way
        (claimed: the oldest first), else a new one. It runs eagerly (a start that finishes at
        once costs no turn of the loop) and, once it waits, as a task of its own, so a caller that
        gives up (its deadline) leaves it running for the next caller, or, if none comes, the
        worker, which has seen no program, joins the idle ones (``_orphan_done``) instead of being
        deleted half-started. Starts given up on thus never outnumber the callers that gave up."""
        if self._orphans:
            start = self._orphans.popleft()
            self._starting -= 1
        else:
            began = time.monotonic()
            now = eager(self.inner.spawn())
            if now.task is None:
                assert now.value is not None
                self.demand.spawned(time.monotonic() - began)
                return now.value
            start = now.task
            start.add_done_callback(lambda task: self._orphan_done(task, began))
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            self._orphans.append(start)
            self._starting += 1
            if start.done():  # it ended as its caller gave up: its callback found it claimed
                self._orphan_done(start, None)
            elif self._closed:  # no pool to join: given up like the starts the close cancelled
                start.cancel()
            raise

    def _orphan_done(self, start: asyncio.Task[Sandbox], began: float | None) -> None:
        """A cold start ended: nothing to do if a caller has it; else its worker joins the pool like
        a refill's (destroyed, once, if the pool closed meanwhile) and a failure is one log line."""
        if began is not None and not start.cancelled() and start.exception() is None:
            self.demand.spawned(time.monotonic() - began)
        if start not in self._orphans:
            return
        self._orphans.remove(start)
        self._starting -= 1
        if start.cancelled():  # the pool closed: the runtime gave the start up
            return
        exc = start.exception()
        if exc is not None:
            reason = getattr(exc, "reason", None) or exc
            log.warning("a worker start whose execute gave up failed: %s", reason)
            self._kick()
            return
        sandbox = start.result()
        if self._closed:
            self._background(sandbox.destroy(), self._destroys)
            return
        log.info("worker %s, started for an execute that gave up, joins the pool", sandbox.worker_id)
        self._idle.append(sandbox)
        self.shares.replaced()
        self._kick()

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _background(self, coro: Coroutine[Any, Any, Any], tasks: set[asyncio.Task[Any]]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _refill_loop(self) -> None:
        assert self._wake is not None
        while not self._closed:
            target = self.demand.target()
            if len(self._idle) >= target:
                self.shares.clear()  # full: nothing is owed
            self._shrink(target)
            missing = target - len(self._idle) - self._starting
            room = self.refill_concurrency - self._starting
            for _ in range(max(0, min(missing, room))):
                self._starting += 1
                self._background(self._spawn_one(), self._spawns)
            self._wake.clear()
            if self.demand.fixed:
                await self._wake.wait()
            else:  # the target decays with time: look again now and then
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), _TICK)

    def _shrink(self, target: int) -> None:
        """Demand fell: destroy idle sandboxes above the target, the one idle longest first. Each
        leaves the pool before its destroy starts, so nothing else can hand it out or destroy it."""
        while len(self._idle) > target:
            sandbox = self._idle.popleft()
            self.shrunk += 1
            self._background(sandbox.destroy(), self._destroys)

    async def _spawn_one(self) -> None:
        t0 = time.monotonic()
        try:
            sandbox = await self.inner.spawn()
        except asyncio.CancelledError:
            self._starting -= 1
            raise
        except Exception as exc:
            self.last_error = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
            if isinstance(exc, SpawnFailed | RuntimeUnavailable):
                log.warning("pool refill failed: %s", self.last_error)
            else:
                log.exception("pool refill failed unexpectedly")
            await asyncio.sleep(self.retry_delay)
            self._starting -= 1
            self._kick()
            return
        self._starting -= 1
        seconds = time.monotonic() - t0
        self.last_error = None
        self.refill_seconds.append(seconds)
        del self.refill_seconds[:-1000]
        self.demand.spawned(seconds)
        if self._closed:
            await sandbox.destroy()
            return
        self._idle.append(sandbox)
        self.shares.replaced()
        self._kick()

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        spawns = [*self._spawns, *self._orphans]
        for task in spawns:
            task.cancel()
        await asyncio.gather(*spawns, return_exceptions=True)
        while self._destroys:  # with those of workers that landed as their start was cancelled
            await asyncio.gather(*self._destroys, return_exceptions=True)
        idle = list(self._idle)
        self._idle.clear()
        await asyncio.gather(*(s.destroy() for s in idle), return_exceptions=True)
        await self.inner.aclose()
