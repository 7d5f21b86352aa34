"""Run a coroutine now, in the caller's step, and let it go on as a task only once it waits.

``loop.create_task(coro)`` runs nothing until the caller yields, so a start that would finish at
once (a fake runtime's, a warm path's) still costs a turn of the event loop in which other tasks
(a pool's refill) run first. Python 3.12's eager tasks avoid that turn; this is the same for 3.11:
``eager(coro)`` runs ``coro`` up to its first wait and returns its value if it finished, else a task
that continues it from that wait. The task owns the coroutine from then on, so cancelling the
caller does not cancel it (the warm pool lets a start whose caller gave up join the pool).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

__all__ = ["Started", "eager"]

_T = TypeVar("_T")


class Started(Generic[_T]):
    """What ``eager`` gives: the value of a coroutine that finished at once, or the task that
    continues one that waits (exactly one of them is set)."""

    __slots__ = ("task", "value")

    def __init__(self, value: _T | None, task: asyncio.Task[_T] | None) -> None:
        """Record what ``eager`` found.

        Args:
            value: the value of a coroutine that finished without waiting (else None).
            task: the task that continues a coroutine that waits (else None).
        """
        self.value = value
        self.task = task


class _GoOn(Generic[_T]):
    """Awaitable that continues a coroutine suspended at ``waiting`` (the object its first step
    yielded), passing on what the task sends or throws, as ``yield from`` would have."""

    def __init__(self, coro: Coroutine[Any, Any, _T], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, _T]:
        waiting = self.waiting
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # the task throws in (cancellation)
                try:
                    waiting = self.coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
            else:
                try:
                    waiting = self.coro.send(sent)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]


async def _go_on(coro: Coroutine[Any, Any, _T], first: list[Any]) -> _T:
    return await _GoOn(coro, first[0])


def eager(coro: Coroutine[Any, Any, _T]) -> Started[_T]:
    """Run ``coro`` up to its first wait, as the task that continues it (its first step sees that
    task as the current one, as a 3.12 eager task's does: a bound it enters there, such as
    ``asyncio.timeout``, cancels the start, never the caller).

    Args:
        coro: the coroutine (not started yet).

    Returns:
        Its value if it finished without waiting, else the task that continues it.

    Raises:
        Exception: whatever ``coro`` raised before its first wait.
    """
    loop = asyncio.get_running_loop()
    first: list[Any] = []  # what the first step waits on, for the task's first step (later)
    task = loop.create_task(_go_on(coro, first))
    # A task cancelled before its first step never resumes ``coro``: close it, so its own clean-up
    # runs (no-op once it has finished).
    task.add_done_callback(lambda _: coro.close())
    caller = asyncio.current_task(loop)
    if caller is not None:
        asyncio.tasks._leave_task(loop, caller)
    asyncio.tasks._enter_task(loop, task)
    try:
        first.append(coro.send(None))
    except BaseException as exc:
        task.cancel()  # it has nothing to continue
        if isinstance(exc, StopIteration):
            return Started(exc.value, None)
        raise
    finally:
        asyncio.tasks._leave_task(loop, task)
        if caller is not None:
            asyncio.tasks._enter_task(loop, caller)
    return Started(None, task)
