"""Waiting for work handed to another thread, cheaply.

Awaiting a ``concurrent.futures.Future`` from the event loop costs two thread wake-ups: the worker
thread's, and the loop's once the result is posted back to it. For work that is usually done within
a millisecond or two (a Rego decision, a short sync handler) the second one is most of the cost. A
:class:`HandOff` first waits for the result on the calling thread, blocking it for at most a small
budget (and never past a given deadline), and only then awaits it asynchronously.

When ``slow_limit`` results have missed the budget within the last ``window`` seconds it stops
blocking until the oldest of them is older than the window. Quick results in between do not count
against late ones: with a net count, a caller alternating quick and slow work (a tenant's program
calling a quick capability after every slow one) kept the count low and held the event loop for
the whole budget on every slow call. So one hand-off holds its caller's thread for at most
``slow_limit × budget`` per ``window`` on late work, whatever the mix.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from typing import Any, Final, TypeVar

__all__ = ["DEFAULT_BUDGET", "NOT_YET", "SLOW_LIMIT", "SLOW_WINDOW", "HandOff"]

T = TypeVar("T")

#: Default seconds a hand-off may block the calling thread.
DEFAULT_BUDGET: Final = 0.002
#: Results past the budget within ``SLOW_WINDOW`` at which a hand-off stops blocking.
SLOW_LIMIT: Final = 4
#: Seconds over which late results are counted.
SLOW_WINDOW: Final = 10.0

#: What :meth:`HandOff.block` returns for a job that is not done yet.
NOT_YET: Final[Any] = object()


class HandOff:
    """The blocking-then-async wait described above. The late results are shared by every caller
    of one instance (racy across threads on purpose: a rough count is all it needs).

    Args:
        budget: seconds one hand-off may block the calling thread.
        slow_limit: late results within ``window`` at which it stops blocking.
        window: seconds over which late results count.
    """

    def __init__(
        self, budget: float = DEFAULT_BUDGET, slow_limit: int = SLOW_LIMIT, window: float = SLOW_WINDOW
    ) -> None:
        self.budget = budget
        self.slow_limit = slow_limit
        self.window = window
        self._late: collections.deque[float] = collections.deque()

    @property
    def slow(self) -> int:
        """Results past the budget within the last ``window`` seconds."""
        horizon = time.monotonic() - self.window
        late = self._late
        while late and late[0] < horizon:
            try:
                late.popleft()
            except IndexError:  # emptied by another thread meanwhile
                break
        return len(late)

    def block(self, job: concurrent.futures.Future[T], deadline: float | None = None) -> T:
        """Wait for ``job`` on the calling thread for at most the budget.

        Args:
            job: the work handed to another thread.
            deadline: monotonic seconds it never blocks past, if any.

        Returns:
            The job's result (or raises the job's exception), or :data:`NOT_YET` when the job is
            not done: then await it.
        """
        if job.done():  # nothing to wait for, blocking or not
            return job.result()
        limit = self.budget if self.slow < self.slow_limit else 0.0
        if deadline is not None:
            limit = min(limit, deadline - time.monotonic())
        if limit <= 0:
            return NOT_YET  # type: ignore[no-any-return]
        try:
            return job.result(limit)
        except concurrent.futures.TimeoutError:
            if job.done():  # the job's own TimeoutError, or it finished just now
                return job.result()
            self._late.append(time.monotonic())
            return NOT_YET  # type: ignore[no-any-return]
