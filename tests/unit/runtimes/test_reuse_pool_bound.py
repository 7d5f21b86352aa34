"""``ReusePool`` keeps its bound on live sandboxes while demand rises and falls: a recycled sandbox
is live until its removal ends (a container or pod being removed still holds its memory and its
place in a quota), so the refill does not replace it before then; and closing the pool still removes it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from codemode.runtimes.reuse import ReusePool
from codemode.runtimes.reuse import pool as reuse_pool
from tests.support.fake_supervising import FakeSupervising
from tests.support.mcp_client import wait_until


async def lease(pool: ReusePool, subject: str) -> None:
    spawned = await pool.spawn_for(subject)
    sandbox: Any = spawned.sandbox
    await sandbox.end(True)


async def test_bursts_of_new_subjects_keep_live_sandboxes_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each burst of fresh subjects raises the target to the maximum (each is active and each
    # arrival counts); then it falls, idle sandboxes are recycled, and removing one takes longer
    # than the next burst takes to come. Before a recycled sandbox counted until its removal ended,
    # the refill replaced it at once: 22 live against the bound of 21, every run. The pool's times
    # are scaled down ten times (its refill looks again every 50 ms instead of 500).
    monkeypatch.setattr(reuse_pool, "_TICK", 0.05)
    runtime = FakeSupervising(spawn_seconds=0.02, remove_seconds=0.12)
    burst, maximum = 8, 12
    pool = ReusePool(
        runtime,  # type: ignore[arg-type]
        2,
        maximum=maximum,
        per_subject=2,
        max_executes=1000,
        recent_seconds=0.1,
        hold=0.1,
        window=0.05,
    )
    await pool.start()
    try:
        await pool.wait_warm(5)
        for cycle in range(3):
            await asyncio.gather(*(lease(pool, f"sybil-{cycle}-{i}") for i in range(burst)))
            await asyncio.sleep(0.15)  # the target falls, idle sandboxes go, the next burst comes
        bound = burst + maximum + 1  # max_concurrent_executions + maximum + 1
        assert runtime.started >= 3 * burst  # each new subject needed a sandbox of its own
        assert runtime.peak <= bound, (runtime.peak, bound)
    finally:
        await pool.aclose()


async def test_a_sandbox_that_served_its_executes_is_replaced_without_waiting_for_its_removal() -> None:
    # A steady subject: each sandbox serves 10 executes, then its successor takes over. Holding the
    # refill back until each removal ended (as for a falling target) made its executes start cold.
    runtime = FakeSupervising(spawn_seconds=0.02, remove_seconds=0.1)
    pool = ReusePool(runtime, 2, per_subject=2, max_executes=10)  # type: ignore[arg-type]
    await pool.start()
    try:
        await pool.wait_warm(5)
        for _ in range(60):
            await lease(pool, "steady")
            await asyncio.sleep(0.003)
        assert pool.cold == 0 and pool.recycled >= 5
    finally:
        await pool.aclose()


@pytest.mark.parametrize("remove_seconds", [0.0, 0.05])
async def test_closing_right_after_a_recycle_still_removes_the_recycled_sandbox(
    remove_seconds: float,
) -> None:
    # A sandbox that served its executes is recycled: its removal runs in the background. Closing
    # the pool at once used to cancel that removal before it began (or while it ran), so the pool
    # itself never removed the sandbox and only the runtime's own sweep could.
    runtime = FakeSupervising(spawn_seconds=0.01, remove_seconds=remove_seconds)
    pool = ReusePool(runtime, 1, per_subject=1, max_executes=1)  # type: ignore[arg-type]
    await pool.start()
    try:
        await pool.wait_warm(5)
        spawned = await pool.spawn_for("tenant")
        sandbox: Any = spawned.sandbox
        await sandbox.end(True)
        assert pool.recycled == 1
    finally:
        await pool.aclose()
    assert runtime.live == 0, f"{runtime.live} of {runtime.started} sandboxes left unremoved"


async def test_a_close_cancelled_while_a_removal_runs_still_removes_everything() -> None:
    # The close waits for a slow removal and is cancelled meanwhile (a bounded shutdown): the
    # removal goes on, and the idle sandboxes and the runtime's own close are not skipped.
    runtime = FakeSupervising(spawn_seconds=0.01, remove_seconds=0.3)
    pool = ReusePool(runtime, 3, per_subject=1, max_executes=1)  # type: ignore[arg-type]
    await pool.start()
    await pool.wait_warm(5)
    await lease(pool, "tenant")  # served its one execute: recycled, its removal takes 0.3 s
    await wait_until(lambda: pool.idle == 3, 1.0)  # the refill replaces it
    assert pool.idle == 3 and pool.recycled == 1
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.aclose(), 0.05)
    await wait_until(lambda: runtime.live == 0, 1.0)
    assert runtime.live == 0, f"{runtime.live} of {runtime.started} sandboxes left unremoved"
