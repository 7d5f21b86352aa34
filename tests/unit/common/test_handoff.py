"""codemode.common.handoff.HandOff: a short blocking wait on the calling thread, then none while
work is slow."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator

import pytest

from codemode.common.handoff import NOT_YET, HandOff


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(2) as p:
        yield p


def test_a_quick_job_is_returned_by_the_blocking_wait(pool: concurrent.futures.ThreadPoolExecutor) -> None:
    handoff = HandOff(budget=30.0)
    assert handoff.block(pool.submit(lambda: 42)) == 42
    assert handoff.slow == 0


def test_the_jobs_own_exceptions_pass_through_and_do_not_count_as_slow(
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    handoff = HandOff(budget=30.0)

    def fails() -> None:
        raise TimeoutError("the job's own timeout")

    with pytest.raises(TimeoutError, match="the job's own"):
        handoff.block(pool.submit(fails))
    assert handoff.slow == 0


def test_slow_jobs_stop_the_blocking_until_the_window_has_passed(
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    handoff = HandOff(budget=0.05, slow_limit=2, window=0.5)
    release = threading.Event()
    slow = [pool.submit(release.wait, 30) for _ in range(2)]
    for job in slow:
        t0 = time.monotonic()
        assert handoff.block(job) is NOT_YET
        assert time.monotonic() - t0 >= 0.04  # it did wait, for the budget
    assert handoff.slow == 2
    # At the limit it does not block at all, however long the budget.
    handoff.budget = 30.0
    t0 = time.monotonic()
    assert handoff.block(pool.submit(release.wait, 30)) is NOT_YET
    assert time.monotonic() - t0 < 15  # far below the 30 s it would have blocked
    release.set()
    # Quick results do not bring the blocking back early; the window passing does.
    assert handoff.block(pool.submit(lambda: "quick")) is NOT_YET or handoff.slow == 2
    time.sleep(0.6)
    assert handoff.slow == 0
    assert handoff.block(pool.submit(lambda: "back")) == "back"  # blocks up to 30 s: surely done


def test_quick_jobs_between_slow_ones_do_not_keep_the_blocking_on() -> None:
    # The attack on a net count: a quick call after every slow one kept the count at 0 or 1, so
    # every slow call held the calling thread (the event loop) for the whole budget.
    budget, limit = 0.02, 4
    handoff = HandOff(budget=budget, slow_limit=limit, window=60.0)
    release = threading.Event()
    blocked = 0.0
    with concurrent.futures.ThreadPoolExecutor(32) as pool:  # a free thread for every quick job
        for _ in range(20):
            job = pool.submit(release.wait, 30)
            t0 = time.monotonic()
            assert handoff.block(job) is NOT_YET
            blocked += time.monotonic() - t0
            quick = pool.submit(lambda: 1)
            quick.result(5)
            assert handoff.block(quick) == 1
        release.set()
    assert blocked < (limit + 2) * budget  # the limit's worth of budgets, not 20 of them


def test_the_deadline_bounds_the_blocking_wait(pool: concurrent.futures.ThreadPoolExecutor) -> None:
    handoff = HandOff(budget=30.0)
    release = threading.Event()
    job = pool.submit(release.wait, 30)
    t0 = time.monotonic()
    assert handoff.block(job, deadline=time.monotonic() + 0.05) is NOT_YET
    assert time.monotonic() - t0 < 15  # the deadline, not the 30 s budget
    assert handoff.block(job, deadline=time.monotonic() - 1) is NOT_YET  # past: no wait at all
    release.set()
