"""A slot is released exactly once, and only after its worker is reaped — also when the execute is
cancelled while the host is reaping a worker that died (found by review: the slot was released twice,
so another execute's slot was taken from it and more workers than slots could run)."""

from __future__ import annotations

import asyncio
from typing import Any

from codemode.authz import Subject, allow_all
from codemode.execution.admission import Admission
from codemode.execution.executor import Executor
from codemode.execution.limits import Limits
from codemode.execution.plan import Plan
from codemode.runtimes.base import ExitInfo


class DyingSandbox:
    def __init__(self, n: int) -> None:
        self.worker_id = f"w{n}"
        self.destroyed = asyncio.Event()

    async def write(self, data: bytes) -> None:
        return None

    async def read(self, max_bytes: int) -> bytes:
        await asyncio.sleep(0.05 if self.worker_id == "w1" else 30)
        return b""  # w1 dies: WorkerGone

    async def close_input(self) -> None:
        return None

    def alive(self) -> bool:
        return not self.destroyed.is_set()

    async def destroy(self) -> ExitInfo:
        await asyncio.sleep(0.3)
        self.destroyed.set()
        return ExitInfo(exit_code=1)


class Runtime:
    name = "fake"

    def __init__(self) -> None:
        self.n = 0

    async def spawn(self) -> Any:
        self.n += 1
        return DyingSandbox(self.n)


async def test_cancel_during_the_reap_of_a_dead_worker_releases_once() -> None:
    limits = Limits(max_execution_time=10, max_concurrent_executions=2)
    plan = Plan((), allow_all(), limits, Admission(2), Runtime())  # type: ignore[arg-type]
    ex = Executor(plan)
    alice = Subject("alice")
    first = asyncio.create_task(ex.execute("def main():\n    return 1\n", alice))
    second = asyncio.create_task(ex.execute("def main():\n    return 1\n", alice))
    await asyncio.sleep(0.15)  # w1 died; its reap is in progress
    first.cancel()
    await asyncio.sleep(0.01)
    assert ex.slots.held == {"alice": 2}  # not released before the worker is reaped
    await asyncio.sleep(0.5)
    assert ex.slots.free == 1 and ex.slots.held == {"alice": 1}  # second still holds its live worker
    second.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    await ex.drain()
    assert ex.slots.free == 2 and ex.slots.held == {}
