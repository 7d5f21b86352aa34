"""Large redactions off the serving loop, and one subject's turn at a time (hostile
review; codemode.packs.off_loop).

Ordering is by events, never by time: a job that blocks holds its redaction thread until the test
lets it go, and the test waits on the jobs' own start events.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from codemode.packs import Redactor
from codemode.packs import off_loop as off_loop_module

BIG = off_loop_module.INLINE_BELOW
CREDENTIAL = "Bearer Xy7kQ2mN9pL4vR8sWq"


async def started(event: threading.Event) -> bool:
    """Whether ``event`` (set on a redaction thread) is set within a generous bound."""
    return await asyncio.to_thread(event.wait, 20)


async def test_a_large_redaction_runs_on_a_redaction_thread_with_the_same_result() -> None:
    redactor = Redactor([CREDENTIAL])
    value = {"echo": ("%41&#66; " + CREDENTIAL + " \\u0043 ") * (BIG // 20)}
    threads: list[str] = []

    def job(v: Any) -> tuple[Any, int]:
        threads.append(threading.current_thread().name)
        return redactor.value(v)

    assert await Redactor.off_loop("a", BIG, job, value) == redactor.value(value)
    assert await Redactor.off_loop("a", BIG - 1, job, value) == redactor.value(value)
    assert threads[0].startswith("codemode-redaction")
    assert threads[1] == threading.current_thread().name  # a short one inline, on the loop's thread


async def test_a_job_error_is_raised_to_the_caller() -> None:
    def fails() -> None:
        raise ValueError("bad json")

    for size in (0, BIG):
        try:
            await Redactor.off_loop("a", size, fails)
        except ValueError as exc:
            assert str(exc) == "bad json"
        else:
            raise AssertionError("no error")
    assert not off_loop_module._lanes  # nothing left held


async def test_one_subject_cannot_hold_every_redaction_thread() -> None:
    """Tenant A's first large redaction holds a thread; its second waits its turn, so tenant B's
    runs meanwhile (with A's second on the other thread, B's would have waited for A's)."""
    assert off_loop_module.THREADS >= 2 and off_loop_module.PER_SUBJECT == 1
    go = threading.Event()
    a1, a2, b = threading.Event(), threading.Event(), threading.Event()

    def hold(mark: threading.Event) -> str:
        mark.set()
        go.wait(20)
        return "held"

    def note(mark: threading.Event) -> str:
        mark.set()
        return "done"

    first = asyncio.create_task(Redactor.off_loop("tenant-a", BIG, hold, a1))
    assert await started(a1)
    second = asyncio.create_task(Redactor.off_loop("tenant-a", BIG, note, a2))
    other = asyncio.create_task(Redactor.off_loop("tenant-b", BIG, hold, b))
    try:
        assert await started(b)
        assert not a2.is_set()  # A's second waits for A's first, not B
    finally:
        go.set()
    assert list(await asyncio.gather(first, second, other)) == ["held", "done", "held"]
    assert not off_loop_module._lanes


async def test_a_cancelled_caller_keeps_its_turn_until_its_job_ends() -> None:
    """A program that stops waiting (its execute ended) cannot start more jobs than its turn: the
    slot is given back when the job ends on its thread."""
    go = threading.Event()
    first_started, second_started = threading.Event(), threading.Event()

    def hold() -> None:
        first_started.set()
        go.wait(20)

    first = asyncio.create_task(Redactor.off_loop("tenant-a", BIG, hold))
    assert await started(first_started)
    first.cancel()
    second = asyncio.create_task(Redactor.off_loop("tenant-a", BIG, second_started.set))
    try:
        await asyncio.sleep(0)  # let the second ask for its turn
        assert not await asyncio.to_thread(second_started.wait, 0.2)
    finally:
        go.set()
    await second
    assert second_started.is_set()
    assert not off_loop_module._lanes
