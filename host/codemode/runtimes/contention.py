"""Whether other subjects compete for a pool's warm sandboxes: the condition under which the subject
share (``--pool-subject-share``) bites.

A share that always applied kept a lone subject from the idle warm sandbox until the refill had
replaced the one it took (every second execute started cold beside an idle warm sandbox). The
share protects the *other* subjects, so it applies only while there are some: a subject is
**contended** when another subject

* is **waiting** for a sandbox from the same pool right now (its request is being served: a cold
  start under way, a worker being probed), or
* was **served recently**: it asked the pool for a sandbox within the last ``recent`` seconds
  (:data:`RECENT_SECONDS` by default, the time the warm pool's target also remembers a burst).

A subject is never its own contention, and operator tools that ask without a subject count for
nobody. Nothing here sleeps or reads a clock of its own: the clock is injected (tests drive it by
hand).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator

__all__ = ["RECENT_SECONDS", "Contention"]

#: Seconds after its last request during which a subject still counts as served recently.
RECENT_SECONDS = 10.0


class Contention:
    """The subjects that asked a pool for a sandbox lately, and whether a subject has company.

    Args (of the constructor):
        recent: seconds a subject counts as served recently after its last request.
        clock: seconds from a monotonic clock.

    Raises (the constructor):
        ValueError: ``recent`` is negative.
    """

    def __init__(self, recent: float = RECENT_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        if recent < 0:
            raise ValueError("recent must not be negative")
        self.recent = recent
        self._clock = clock
        #: Each subject's last request (start or end), oldest first.
        self._seen: collections.OrderedDict[str, float] = collections.OrderedDict()
        #: Requests in progress per subject.
        self._waiting: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def waiting(self, subject: str) -> Iterator[None]:
        """Count ``subject`` as waiting for a sandbox inside the block, and as served when it ends
        (however it ends).

        Args:
            subject: the subject id.

        Yields:
            Nothing.
        """
        self._touch(subject)
        self._waiting[subject] += 1
        try:
            yield
        finally:
            self._waiting[subject] -= 1
            if not self._waiting[subject]:
                del self._waiting[subject]
            self._touch(subject)

    def others(self, subject: str) -> bool:
        """Whether another subject is waiting for a sandbox or was served recently.

        Args:
            subject: the subject id.

        Returns:
            True when ``subject`` is contended.
        """
        self._forget()
        if len(self._waiting) - (subject in self._waiting) > 0:
            return True
        return len(self._seen) - (subject in self._seen) > 0

    def active(self) -> int:
        """How many subjects are waiting for a sandbox or were served recently.

        Returns:
            The count.
        """
        self._forget()
        return len(self._seen.keys() | self._waiting.keys())

    def _touch(self, subject: str) -> None:
        self._seen[subject] = self._clock()
        self._seen.move_to_end(subject)
        self._forget()

    def _forget(self) -> None:
        """Drop subjects last seen ``recent`` seconds ago or more (the map stays as small as the
        subjects of the last ``recent`` seconds)."""
        horizon = self._clock() - self.recent
        while self._seen:
            subject, seen = next(iter(self._seen.items()))
            if seen > horizon:
                break
            del self._seen[subject]
