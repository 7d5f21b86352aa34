"""A warm pool for any runtime: sandboxes started ahead of time, each waiting for its one program.

Each sandbox is still used exactly once and destroyed by the execute pipeline; the pool only moves
start latency off the request path. It keeps at most ``size`` idle sandboxes (the execute semaphore
bounds the ones in use, so live workers never exceed ``max_concurrent_executions + size``), refills
in the background, never hands out a sandbox that died while waiting, and drains on ``aclose()``.

Refill strategy: a runtime whose workers cost this host nothing to start (a remote one such as
Kubernetes) declares ``concurrent_refill = True``; the pool then starts every missing sandbox at
once, as soon as one is handed out. Otherwise (the process runtime forks this host; Docker) it
refills one at a time and only after the used sandbox is destroyed, so starting a worker never
stalls the execution the pooled one is serving.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable

from .base import SPAWNED_WARM, ExitInfo, Runtime, RuntimeUnavailable, Sandbox, SpawnFailed

__all__ = ["WarmPool"]

log = logging.getLogger("codemode.pool")


class _RefillOnDestroy:
    """A pooled sandbox that wakes the refill loop when it is destroyed."""

    def __init__(self, inner: Sandbox, on_destroy: Callable[[], None]) -> None:
        self._inner = inner
        self._on_destroy = on_destroy

    @property
    def worker_id(self) -> str:
        return self._inner.worker_id

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)

    async def read(self, max_bytes: int) -> bytes:
        return await self._inner.read(max_bytes)

    async def close_input(self) -> None:
        await self._inner.close_input()

    def alive(self) -> bool:
        return self._inner.alive()

    async def destroy(self) -> ExitInfo:
        try:
            return await self._inner.destroy()
        finally:
            self._on_destroy()


class WarmPool:
    """Wraps a Runtime and is itself a Runtime: keeps ``size`` started workers ready.

    Args (of the constructor):
        runtime: the runtime that starts the workers.
        size: how many ready workers to keep (0: none, every spawn starts one).
        retry_delay: seconds between refills after a failed spawn.

    Raises (the constructor):
        ValueError: a negative size.
    """

    def __init__(self, runtime: Runtime, size: int, *, retry_delay: float = 0.5) -> None:
        if size < 0:
            raise ValueError("pool size must not be negative")
        self.inner = runtime
        self.size = size
        self.retry_delay = retry_delay
        self._idle: collections.deque[Sandbox] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.refill_seconds: list[float] = []
        self.concurrent = bool(getattr(runtime, "concurrent_refill", False))
        self._starting = 0
        self._spawns: set[asyncio.Task[None]] = set()
        self.last_error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.inner.name}+pool"

    @property
    def idle(self) -> int:
        """Sandboxes ready right now."""
        return len(self._idle)

    async def start(self) -> None:
        await self.inner.start()
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._refill_loop())

    async def check(self) -> None:
        await self.inner.check()

    def warm(self) -> bool:
        """Whether the pool holds its target number of ready sandboxes.

        Returns:
            True at target.
        """
        return len(self._idle) >= self.size

    async def wait_warm(self, timeout: float = 30.0) -> None:
        """Wait until the pool is at target (for tests, benchmarks and readiness).

        Args:
            timeout: seconds to wait at most.

        Raises:
            TimeoutError: not at target in time.
        """
        async with asyncio.timeout(timeout):
            while not self.warm():
                await asyncio.sleep(0.01)

    async def spawn(self) -> Sandbox:
        if self._closed:
            raise RuntimeUnavailable("pool is closed")
        while self._idle:
            sandbox = self._idle.popleft()
            if sandbox.alive():
                SPAWNED_WARM.set(True)
                if self.concurrent:
                    self._kick()
                    return sandbox
                # Refill once this sandbox is destroyed, not now: starting a worker forks the host
                # process, which would stall the very execution this sandbox is about to serve.
                return _RefillOnDestroy(sandbox, self._kick)
            log.warning("pooled worker %s died while waiting; replacing it", sandbox.worker_id)
            await sandbox.destroy()
        self._kick()
        SPAWNED_WARM.set(False)
        return await self.inner.spawn()

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _refill_loop(self) -> None:
        if self.concurrent:
            await self._refill_concurrently()
            return
        assert self._wake is not None
        while not self._closed:
            if len(self._idle) >= self.size:
                self._wake.clear()
                await self._wake.wait()
                continue
            t0 = time.monotonic()
            try:
                sandbox = await self.inner.spawn()
            except (SpawnFailed, RuntimeUnavailable) as exc:
                self.last_error = str(exc)
                log.warning("pool refill failed: %s", exc)
                await asyncio.sleep(self.retry_delay)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("pool refill failed unexpectedly")
                await asyncio.sleep(self.retry_delay)
                continue
            if not await self._keep(sandbox, t0):
                return

    async def _keep(self, sandbox: Sandbox, started: float) -> bool:
        """A refill spawned ``sandbox``: record it, and keep it idle unless the pool has closed
        meanwhile (then destroy it and return False)."""
        self.last_error = None
        self.refill_seconds.append(time.monotonic() - started)
        del self.refill_seconds[:-1000]
        if self._closed:
            await sandbox.destroy()
            return False
        self._idle.append(sandbox)
        return True

    async def _refill_concurrently(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while not self._closed:
            missing = self.size - len(self._idle) - self._starting
            for _ in range(max(missing, 0)):
                self._starting += 1
                task = loop.create_task(self._spawn_one())
                self._spawns.add(task)
                task.add_done_callback(self._spawns.discard)
            self._wake.clear()
            await self._wake.wait()

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
        await self._keep(sandbox, t0)

    async def aclose(self) -> None:
        self._closed = True
        spawns = list(self._spawns)
        for task in spawns:
            task.cancel()
        await asyncio.gather(*spawns, return_exceptions=True)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        idle = list(self._idle)
        self._idle.clear()
        await asyncio.gather(*(s.destroy() for s in idle), return_exceptions=True)
        await self.inner.aclose()
