"""A supervising runtime that starts and removes nothing but counts (for ``ReusePool``'s own
accounting; the reuse mode against a real supervisor is tests/integration/runtimes/test_docker_reuse*.py).

Each sandbox takes ``spawn_seconds`` to start and ``remove_seconds`` to remove; ``live`` counts the
sandboxes started and not yet removed (a container or pod being removed is still live), ``peak`` the
most at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from codemode.runtimes.base import ExitInfo
from tests.support.fakes import QuietLifecycle


class FakeLease:
    """One lease of a ``FakeBox``: ready at once (no probe), ended by ``end``."""

    def __init__(self, box: FakeBox, on_end: Callable[[FakeBox], Any] | None) -> None:
        self.box = box
        self.worker_id = f"{box.worker_id}.{box.executes}"
        self.ready = True
        self.ending = False
        self.ended = asyncio.Event()
        self._on_end = on_end

    async def end(self, reusable: bool = True) -> None:
        """The execute is over (``reusable``: it ended cleanly)."""
        self.ending = True
        box = self.box
        if not reusable:
            box.retire("the execute did not end cleanly", anomaly=False)
        box.executes += 1
        box.lease = None
        box.idle_since = time.monotonic()
        if box.broken is not None:
            await box.destroy()
        if self._on_end is not None:
            self._on_end(box)
        self.ended.set()

    async def destroy(self) -> ExitInfo:
        await self.end(False)
        return ExitInfo(exit_code=0)


class FakeBox:
    """What ``ReusePool`` reads of a ``Supervised``."""

    def __init__(self, runtime: FakeSupervising, number: int) -> None:
        self.runtime = runtime
        self.worker_id = f"box{number}"
        self.subject: str | None = None
        self.executes = 0
        self.lease: FakeLease | None = None
        self.created = self.idle_since = time.monotonic()
        self.broken: str | None = None
        self.removed = False

    def usable(self) -> bool:
        return self.broken is None and not self.removed

    def retire(self, reason: str, *, anomaly: bool = True) -> None:
        if self.broken is None:
            self.broken = reason

    def new_lease(self, on_end: Callable[[FakeBox], Any] | None = None) -> FakeLease:
        assert self.usable() and self.lease is None
        self.lease = FakeLease(self, on_end)
        return self.lease

    async def destroy(self) -> ExitInfo:
        self.retire("removed")
        if not self.removed:
            self.removed = True
            await asyncio.sleep(self.runtime.remove_seconds)
            self.runtime.live -= 1
        return ExitInfo(exit_code=0)


class FakeSupervising(QuietLifecycle):
    """``SupervisingRuntime`` enough for ``ReusePool``: see the module docstring."""

    name = "fake-supervising"
    concurrent_refill = True

    def __init__(self, spawn_seconds: float = 0.01, remove_seconds: float = 0.0) -> None:
        self.spawn_seconds = spawn_seconds
        self.remove_seconds = remove_seconds
        self.started = 0
        self.live = 0
        self.peak = 0

    async def spawn(self) -> Any:
        raise AssertionError("the reuse pool's leases only")

    async def spawn_supervised(self) -> FakeBox:
        self.started += 1
        self.live += 1
        self.peak = max(self.peak, self.live)
        await asyncio.sleep(self.spawn_seconds)
        return FakeBox(self, self.started)
