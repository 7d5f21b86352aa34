"""One destroy-once: a sandbox's ``destroy()`` does its work once, whoever calls it and
however often; a concurrent or later caller gets the same ``ExitInfo``, a failing destroy reports an
unknown exit instead of raising, and a cancelled waiter cancels nothing. The process and forked
sandboxes (and the reuse lease, in the background) use ``codemode.runtimes.once.DestroyOnce``."""

from __future__ import annotations

import asyncio

import pytest

from codemode.runtimes.base import ExitInfo


async def test_the_work_runs_once_for_concurrent_and_later_callers() -> None:
    from codemode.runtimes.once import DestroyOnce

    once = DestroyOnce()
    runs: list[int] = []
    release = asyncio.Event()

    async def work() -> ExitInfo:
        runs.append(1)
        await release.wait()
        return ExitInfo(exit_code=0)

    first = asyncio.create_task(once(work))
    await asyncio.sleep(0)  # the first caller is inside the work
    assert once.begun
    second = asyncio.create_task(once(work))
    await asyncio.sleep(0)
    release.set()
    a, b = await asyncio.gather(first, second)
    assert a is b and a.exit_code == 0
    assert await once(work) is a
    assert runs == [1]


async def test_a_failure_is_an_unknown_exit_and_is_reported() -> None:
    from codemode.runtimes.once import DestroyOnce

    once = DestroyOnce()
    failed: list[ExitInfo] = []

    async def work() -> ExitInfo:
        raise OSError("gone")

    info = await once(work, on_failure=failed.append)
    assert info.exit_code is None and failed == [info]
    assert await once(work) is info


async def test_a_cancelled_first_caller_leaves_an_unknown_exit_and_raises() -> None:
    from codemode.runtimes.once import DestroyOnce

    once = DestroyOnce()
    started = asyncio.Event()

    async def work() -> ExitInfo:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("not reached")

    task = asyncio.create_task(once(work))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await once(work)).exit_code is None


async def test_a_cancelled_waiter_cancels_nothing() -> None:
    from codemode.runtimes.once import DestroyOnce

    once = DestroyOnce()
    release = asyncio.Event()

    async def work() -> ExitInfo:
        await release.wait()
        return ExitInfo(exit_code=3)

    first = asyncio.create_task(once(work))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(once(work))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    assert (await first).exit_code == 3


async def test_in_the_background_the_work_outlives_its_caller() -> None:
    from codemode.runtimes.once import DestroyOnce

    once = DestroyOnce()
    release = asyncio.Event()

    async def work() -> ExitInfo:
        await release.wait()
        return ExitInfo(exit_code=0)

    caller = asyncio.create_task(once(work, background=True))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    assert (await once(work)).exit_code == 0


async def test_the_process_sandbox_destroys_once() -> None:
    from codemode.runtimes.process import ProcessRuntime

    runtime = ProcessRuntime()
    await runtime.start()
    try:
        box = await runtime.spawn()
        a, b = await asyncio.gather(box.destroy(), box.destroy())
        assert a is b and await box.destroy() is a
        assert not box.alive()
    finally:
        await runtime.aclose()
