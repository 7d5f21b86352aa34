"""Waiting for work handed to another thread, cheaply.

Awaiting a ``concurrent.futures.Future`` from the event loop costs two thread wake-ups: the worker
thread's, and the loop's once the result is posted back to it. For work that is usually done within
a millisecond or two (a Rego decision, a short sync handler) the second one is most of the cost. A
:class:`HandOff` first waits for the result on the calling thread, blocking it for at most a small
budget (and never past a given deadline), and only then awaits it asynchronously. When results keep
missing the budget it stops blocking, and starts again once they are quick: the event loop is held
for at most the budget per hand-off, and not at all while the work is slow.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Final, TypeVar

__all__ = ["DEFAULT_BUDGET", "NOT_YET", "SLOW_LIMIT", "HandOff"]

T = TypeVar("T")

#: Default seconds a hand-off may block the calling thread.
DEFAULT_BUDGET: Final = 0.002
#: Net results past the budget (late ones minus quick ones) at which a hand-off stops blocking.
SLOW_LIMIT: Final = 4

#: What :meth:`HandOff.block` returns for a job that is not done yet.
NOT_YET: Final[Any] = object()


class HandOff:
    """The blocking-then-async wait described above. The slow count is shared by every caller of
    one instance (racy across threads on purpose: a rough count is all it needs).

    Args:
        budget: seconds one hand-off may block the calling thread.
        slow_limit: net late results at which it stops blocking.
    """

    def __init__(self, budget: float = DEFAULT_BUDGET, slow_limit: int = SLOW_LIMIT) -> None:
        self.budget = budget
        self.slow_limit = slow_limit
        self.slow = 0

    def block(self, job: concurrent.futures.Future[T], deadline: float | None = None) -> T:
        """Wait for ``job`` on the calling thread for at most the budget.

        Args:
            job: the work handed to another thread.
            deadline: monotonic seconds it never blocks past, if any.

        Returns:
            The job's result (or raises the job's exception), or :data:`NOT_YET` when the job is
            not done: then await it, and call :meth:`waited`.
        """
        limit = self.budget if self.slow < self.slow_limit else 0.0
        if deadline is not None:
            limit = min(limit, deadline - time.monotonic())
        if limit <= 0:
            return NOT_YET  # type: ignore[no-any-return]
        try:
            result = job.result(limit)
        except concurrent.futures.TimeoutError:
            if job.done():  # the job's own TimeoutError, or it finished just now
                return job.result()
            self.slow += 1
            return NOT_YET  # type: ignore[no-any-return]
        if self.slow > 0:
            self.slow -= 1
        return result

    def waited(self, started: float) -> None:
        """An asynchronous wait ended: a quick one counts as a result back in time, so blocking
        resumes once work is quick again.

        Args:
            started: the monotonic time the wait began.
        """
        if self.slow > 0 and time.monotonic() - started <= self.budget:
            self.slow -= 1
