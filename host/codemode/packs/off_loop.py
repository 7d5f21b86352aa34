"""Large redactions run off the serving event loop (found by a hostile review).

Redacting reads every character of a text, its escapes decoded: a 1 MiB answer takes a second or
more. On the host's serving loop that stalled every tenant's requests for as long, so one tenant
whose upstream answered (or echoed) large texts starved all others. :func:`off_loop` runs a
redaction job of :data:`INLINE_BELOW` characters or more on a small thread pool of its own
(:data:`THREADS`; handlers' threads are not taken) and awaits it; a shorter one runs inline, where
a thread hand-off would cost more than the work. The result is the job's, either way.

One subject runs at most :data:`PER_SUBJECT` large redactions at a time (the others of that subject
wait their turn on the loop), so one tenant cannot hold every redaction thread while others'
answers queue behind. A slot is given back when the job ends on its thread, not when its caller
stops waiting (a cancelled call cannot free a slot its job still uses).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable
from typing import Any, Final, TypeVar

__all__ = ["INLINE_BELOW", "PER_SUBJECT", "THREADS", "off_loop"]

T = TypeVar("T")

#: Characters (or bytes) below which a redaction runs inline on the loop (a few milliseconds).
INLINE_BELOW: Final = 8192
#: Threads that run large redactions (for every subject together).
THREADS: Final = 2
#: Large redactions one subject may run at a time.
PER_SUBJECT: Final = 1

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="codemode-redaction")


class _Lane:
    """One subject's large redactions on one loop: its semaphore and how many use it."""

    def __init__(self) -> None:
        self.semaphore = asyncio.Semaphore(PER_SUBJECT)
        self.users = 0


_lanes: dict[tuple[asyncio.AbstractEventLoop, str], _Lane] = {}


def _leave(key: tuple[asyncio.AbstractEventLoop, str], lane: _Lane) -> None:
    lane.users -= 1
    if lane.users == 0 and _lanes.get(key) is lane:
        del _lanes[key]


async def off_loop(subject: str, size: int, job: Callable[..., T], *args: Any) -> T:
    """``job(*args)``: inline when ``size`` is below :data:`INLINE_BELOW`, else on the redaction
    threads, at most :data:`PER_SUBJECT` at a time for ``subject``.

    Args:
        subject: the subject the call is for (its large redactions take turns).
        size: the size of the text (or JSON body) the job reads.
        job: the redaction (any function of plain values; it must not touch the loop).
        *args: its arguments.

    Returns:
        What ``job`` returned (or raises what it raised).
    """
    if size < INLINE_BELOW:
        return job(*args)
    loop = asyncio.get_running_loop()
    key = (loop, subject)
    lane = _lanes.setdefault(key, _Lane())
    lane.users += 1
    try:
        await lane.semaphore.acquire()
    except BaseException:
        _leave(key, lane)
        raise

    def release() -> None:
        lane.semaphore.release()
        _leave(key, lane)

    def ended(_: concurrent.futures.Future[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits on it any more
            loop.call_soon_threadsafe(release)

    try:
        work = _POOL.submit(job, *args)
    except BaseException:
        release()
        raise
    work.add_done_callback(ended)
    return await asyncio.wrap_future(work)
