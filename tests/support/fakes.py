"""Stand-ins several tests share (no tests here): a clock the test moves by hand, the call
context an authorizer reads, and the lifecycle of a fake runtime."""

from __future__ import annotations

import asyncio
import dataclasses


class Clock:
    """A monotonic clock the test moves: ``clock.now += 5`` (pass ``clock`` where a ``time.monotonic``
    is taken)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Ctx:
    """What an authorizer reads of a native call's context: its deadline (``time.monotonic()``
    seconds) and the event set when the execute is cancelled."""

    deadline: float
    cancelled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class QuietLifecycle:
    """A fake runtime's ``start``, ``check`` and ``aclose``: each does nothing."""

    async def start(self) -> None:
        return None

    async def check(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
