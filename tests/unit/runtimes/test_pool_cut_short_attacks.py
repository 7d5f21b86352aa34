"""Attacks on the cut-short start (a cold start whose execute's deadline passed joins the pool): can
one subject reach, starve or confuse another through it, or can a worker leak or die twice?

Each test drives the gated fake runtime of ``test_pool_cut_short`` (each start waits for a gate the
test opens; the test cancels the waiting execute as its deadline would). Nothing sleeps or times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from codemode.runtimes.base import ExitInfo, SpawnFailed
from codemode.runtimes.pool import WarmPool
from tests.unit.runtimes.test_pool_cut_short import Box, GatedRuntime, _cut_short, _settle


class SlowBox(Box):
    """A worker whose destroy takes a few turns of the loop (a real one waits for its exit)."""

    async def destroy(self) -> ExitInfo:
        for _ in range(3):
            await asyncio.sleep(0)
        return await super().destroy()


class StubbornRuntime(GatedRuntime):
    """A start that finishes as it is cancelled returns its worker anyway (Python 3.11's
    ``asyncio.wait_for`` does so when the awaited launch lands in the same turn as the cancel)."""

    async def spawn(self) -> Box:
        n = len(self.gates) + 1
        with contextlib.suppress(asyncio.CancelledError):
            await super().spawn()
        return SlowBox(n, self)


class FailingRuntime(GatedRuntime):
    """Each start fails once its gate opens (a runtime that cannot start workers)."""

    async def spawn(self) -> Box:
        await super().spawn()
        raise SpawnFailed(f"start {len(self.gates)} failed")


async def test_a_worker_handed_to_its_execute_never_joins_the_pool_however_late_the_cancel() -> None:
    """The start lands and the execute's deadline passes in the same turn: the worker goes either
    to the execute (which may have sent it a program) or to the pool, never both."""
    runtime = GatedRuntime()
    pool = WarmPool(runtime, 1)  # type: ignore[arg-type]
    try:
        await pool.start()
        assert await _settle(lambda: len(runtime.gates) == 1)  # the refill's start, kept gated
        alice = asyncio.ensure_future(pool.spawn_for("alice"))
        assert await _settle(lambda: len(runtime.gates) == 2)
        runtime.gates[1].set()
        # Let the start finish and hand its result on, then cancel before alice resumes.
        assert await _settle(lambda: alice._fut_waiter is not None and alice._fut_waiter.done())  # type: ignore[attr-defined]
        alice.cancel()
        outcome = (await asyncio.gather(alice, return_exceptions=True))[0]
        assert isinstance(outcome, asyncio.CancelledError)  # she never saw the worker ...
        assert await _settle(lambda: pool.idle == 1)  # ... so it joins the pool, once
        bob = await pool.spawn_for("bob")
        carol = asyncio.ensure_future(pool.spawn_for("carol"))
        assert await _settle(lambda: len(runtime.gates) == 3)  # carol starts cold: w2 is bob's alone
        assert bob.sandbox.worker_id == "w2" and bob.warm
        carol.cancel()
        await asyncio.gather(carol, return_exceptions=True)
        # An execute that got its worker keeps it even when cancelled right after.
        runtime.gates[2].set()
        dave = await pool.spawn_for("dave")  # takes carol's start over
        assert dave.sandbox.worker_id == "w3" and not dave.warm
        task = asyncio.current_task()
        assert task is not None
        assert await _settle(lambda: True, rounds=20)
        assert pool.idle == 0
        await bob.sandbox.destroy()
        await dave.sandbox.destroy()
    finally:
        await pool.aclose()
    assert sorted(runtime.destroyed) == ["w2", "w3"]


async def test_cut_short_starts_never_outnumber_the_executes_that_wait_for_one() -> None:
    """One subject sending execute after execute, each cut short while its worker starts, keeps one
    start under way, not one per execute: it cannot pile up workers the pool must carry."""
    runtime = GatedRuntime()
    pool = WarmPool(runtime, 1)  # type: ignore[arg-type]
    try:
        await _cut_short(pool, runtime)
        for _ in range(5):
            again = asyncio.ensure_future(pool.spawn_for("alice"))
            await _settle(lambda: len(runtime.gates) > 2, rounds=50)
            again.cancel()
            await asyncio.gather(again, return_exceptions=True)
        assert len(runtime.gates) == 2  # the refill's and alice's one start
        assert runtime.cancelled == []
    finally:
        await pool.aclose()
    assert runtime.cancelled == [1, 2]  # both cancelled by the close, nothing left running
    assert runtime.destroyed == []


async def test_a_start_taken_over_counts_for_nobody_s_share() -> None:
    """Bob taking over alice's start gets a cold worker: no warm debt for him, none paid for her."""
    runtime = GatedRuntime()
    pool = WarmPool(runtime, 2, subject_share=0.5)  # type: ignore[arg-type]
    try:
        await pool.start()
        assert await _settle(lambda: len(runtime.gates) == 2)
        for gate in runtime.gates:
            gate.set()
        assert await _settle(lambda: pool.idle == 2)
        held = await pool.spawn_for("alice")  # alice's one warm share (cap 1 of 2)
        assert held.warm and pool.shares.owed("alice") == 1
        assert await _settle(lambda: len(runtime.gates) == 3)  # its refill, kept gated
        with pool.contention.waiting("bob"):  # bob competes: alice is past her share
            alice = asyncio.ensure_future(pool.spawn_for("alice"))
            assert await _settle(lambda: len(runtime.gates) == 4)  # cold, beside bob's warm one
            alice.cancel()
            await asyncio.gather(alice, return_exceptions=True)
            assert pool.idle == 1
            warm = await pool.spawn_for("bob")  # the warm one stayed for bob
            assert warm.warm and pool.shares.owed("bob") == 1
            bob = asyncio.ensure_future(pool.spawn_for("bob"))  # past his share: cold, alice's start
            assert await _settle(lambda: len(runtime.gates) == 5)  # bob's warm one's refill only
            assert await _settle(lambda: len(runtime.gates) == 6, rounds=50) is False
            runtime.gates[3].set()
            taken = await bob
        assert not taken.warm and taken.sandbox.worker_id == "w4"
        assert pool.shares.owed("bob") == 1 and pool.shares.owed("alice") == 1
        for spawned in (held, warm, taken):
            await spawned.sandbox.destroy()
    finally:
        await pool.aclose()


async def test_a_start_that_lands_as_the_pool_closes_is_destroyed_before_the_close_returns() -> None:
    """The close cancels a start nobody waits for; if the worker lands all the same, it is destroyed
    before ``aclose()`` returns (then the runtime closes): never left to a task nobody awaits."""
    runtime = StubbornRuntime()
    pool = WarmPool(runtime, 1)  # type: ignore[arg-type]
    await _cut_short(pool, runtime)
    await pool.aclose()
    assert runtime.cancelled == [1, 2]
    assert sorted(runtime.destroyed) == ["w1", "w2"]  # before: ["w1"], w2's destroy still pending
    assert await _settle(lambda: True, rounds=20)
    assert sorted(runtime.destroyed) == ["w1", "w2"]  # once each


async def test_an_execute_cancelled_after_the_close_does_not_leave_its_start_running() -> None:
    """The pool closed while an execute waited for its cold start, then the execute was cancelled:
    the start is given up like every other start of a closed pool, not left running for nobody."""
    runtime = GatedRuntime()
    pool = WarmPool(runtime, 0)  # type: ignore[arg-type]
    await pool.start()
    alice = asyncio.ensure_future(pool.spawn_for("alice"))
    assert await _settle(lambda: len(runtime.gates) == 1)
    await pool.aclose()
    alice.cancel()
    await asyncio.gather(alice, return_exceptions=True)
    assert await _settle(lambda: runtime.cancelled == [1]), "the start still runs after the close"
    runtime.gates[0].set()
    assert await _settle(lambda: True, rounds=20)
    assert runtime.destroyed == []
    assert pool.idle == 0


async def test_a_start_failing_after_its_execute_gave_up_is_logged_once_and_fails_only_its_taker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure lands on the execute that waits for the start at that moment (bob, who took it
    over), never on alice, who gave up; with no taker it is one log line, and the next execute
    gets a fresh start."""
    runtime = FailingRuntime()
    pool = WarmPool(runtime, 1, retry_delay=3600)  # type: ignore[arg-type]
    try:
        await _cut_short(pool, runtime)
        bob = asyncio.ensure_future(pool.spawn_for("bob"))
        assert await _settle(lambda: len(runtime.gates) == 3, rounds=50) is False  # took alice's over
        runtime.gates[1].set()
        with pytest.raises(SpawnFailed, match="start 2 failed"):
            await bob
        carol = asyncio.ensure_future(pool.spawn_for("carol"))
        assert await _settle(lambda: len(runtime.gates) == 3)  # a fresh start
        carol.cancel()
        await asyncio.gather(carol, return_exceptions=True)
        with caplog.at_level(logging.WARNING, logger="codemode.pool"):
            runtime.gates[2].set()
            assert await _settle(lambda: pool._starting == 1)  # only the gated refill
        lines = [r.getMessage() for r in caplog.records]
        assert lines == ["a worker start whose execute gave up failed: start 3 failed"]
        assert pool.idle == 0
    finally:
        await pool.aclose()


class BoundedRuntime(GatedRuntime):
    """Each start bounds itself before its first wait (``asyncio.timeout``, which binds the task
    running at entry); the bound is spent at once and its gate never opens."""

    async def spawn(self) -> Box:
        try:
            async with asyncio.timeout(0):
                return await super().spawn()
        except TimeoutError:
            raise SpawnFailed("the start ran out of time") from None


async def test_a_start_s_own_bound_ends_the_start_not_the_execute_that_began_it() -> None:
    """The start's first step runs in the caller's step (``eager``): a bound it enters there must
    still cancel the start, not alice's execute (which would see a cancel it never got, leave the
    start running unbounded, and hand it to the next subject)."""
    runtime = BoundedRuntime()
    pool = WarmPool(runtime, 0)  # type: ignore[arg-type]
    await pool.start()
    try:
        with pytest.raises(SpawnFailed, match="ran out of time"):
            await asyncio.wait_for(pool.spawn_for("alice"), 30)
        assert runtime.cancelled == [1]
        assert pool._starting == 0
    finally:
        await pool.aclose()
