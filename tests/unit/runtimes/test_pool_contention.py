"""The subject share bites only under contention (``codemode.runtimes.contention``).

A lone subject takes the idle warm sandbox; with another subject waiting, or served within the last
``recent`` seconds, a subject past its share starts cold and the warm ones stay for the others.
Deterministic: the clock is a variable the test moves, and the pool's runtime starts its (fake)
sandboxes without waiting, so nothing sleeps or times anything.
"""

from __future__ import annotations

import asyncio

import pytest

from codemode.runtimes.base import ExitInfo
from codemode.runtimes.contention import RECENT_SECONDS, Contention
from codemode.runtimes.pool import WarmPool
from tests.support.fakes import Clock, QuietLifecycle


class Box:
    def __init__(self, n: int) -> None:
        self.worker_id = f"w{n}"

    def alive(self) -> bool:
        return True

    async def destroy(self) -> ExitInfo:
        return ExitInfo(exit_code=0)


class Runtime(QuietLifecycle):
    """Starts sandboxes at once; counts them."""

    name = "fake"
    concurrent_refill = True

    def __init__(self) -> None:
        self.started = 0

    async def spawn(self) -> Box:
        self.started += 1
        return Box(self.started)


async def _full(pool: WarmPool) -> None:
    """Let the refill run until the pool holds its size (each fake start is immediate)."""
    while pool.idle < pool.size or pool._starting:
        await asyncio.sleep(0)


def test_a_subject_alone_has_no_contention() -> None:
    clock = Clock(1000.0)
    contention = Contention(10.0, clock)
    with contention.waiting("alice"):
        assert not contention.others("alice")
    assert not contention.others("alice")
    assert contention.others("bob")  # alice was served just now


def test_served_recently_means_within_the_window() -> None:
    clock = Clock(1000.0)
    contention = Contention(10.0, clock)
    with contention.waiting("bob"):
        pass
    clock.now += 9.9
    assert contention.others("alice")
    clock.now += 0.1
    assert not contention.others("alice")  # 10 s after bob's last request: no longer recent


def test_a_subject_waiting_counts_however_long_it_waits() -> None:
    clock = Clock(1000.0)
    contention = Contention(10.0, clock)
    with contention.waiting("bob"):
        clock.now += 3600
        assert contention.others("alice")
    assert contention.others("alice")  # its request ended now: served recently
    clock.now += 10
    assert not contention.others("alice")


def test_the_default_window_and_bad_windows() -> None:
    assert Contention().recent == RECENT_SECONDS == 10.0
    with pytest.raises(ValueError):
        Contention(-1)


async def test_a_lone_subject_takes_the_idle_warm_sandbox() -> None:
    # Before: with the share of 0.5 of a pool of 2, the lone subject's second execute started cold
    # beside the idle warm sandbox until the refill had replaced its first one.
    runtime = Runtime()
    pool = WarmPool(runtime, 2, subject_share=0.5, clock=Clock(1000.0))  # type: ignore[arg-type]
    await pool.start()
    try:
        await _full(pool)
        await pool.spawn_for("alice")
        await pool.spawn_for("alice")  # no refill has landed in between: nothing yielded
        assert (pool.warm_taken, pool.cold_taken) == (2, 0)
    finally:
        await pool.aclose()


async def test_with_another_subject_served_recently_the_share_bites() -> None:
    clock = Clock(1000.0)
    pool = WarmPool(Runtime(), 2, subject_share=0.5, clock=clock)  # type: ignore[arg-type]
    await pool.start()
    try:
        await _full(pool)
        await pool.spawn_for("bob")  # bob is served ...
        await _full(pool)  # ... and his worker is replaced
        await pool.spawn_for("alice")
        await pool.spawn_for("alice")  # past alice's share of 1 while bob is recent: cold
        assert (pool.warm_taken, pool.cold_taken) == (2, 1)
        assert pool.idle == 1  # the warm one stays for bob
        await _full(pool)
        clock.now += RECENT_SECONDS  # bob's request is 10 s old: alice is alone again
        await pool.spawn_for("alice")
        await pool.spawn_for("alice")
        assert (pool.warm_taken, pool.cold_taken) == (4, 1)
    finally:
        await pool.aclose()


async def test_a_flood_past_its_share_leaves_the_warm_sandboxes_to_a_recent_subject() -> None:
    clock = Clock(1000.0)
    pool = WarmPool(Runtime(), 4, subject_share=0.5, clock=clock)  # type: ignore[arg-type]
    await pool.start()
    try:
        await _full(pool)
        await pool.spawn_for("victim")
        await _full(pool)
        for _ in range(8):  # one subject's flood, all at once
            await pool.spawn_for("flood")
        assert (pool.warm_taken, pool.cold_taken) == (3, 6)  # the victim's 1, the flood's share of 2
        await pool.spawn_for("victim")
        assert pool.warm_taken == 4  # the victim still finds a warm one
    finally:
        await pool.aclose()
